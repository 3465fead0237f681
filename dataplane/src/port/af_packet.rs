//! af-packet ports: an existing kernel interface (a NIC, a bond, a veth)
//! as an uplink, through `AF_PACKET` sockets with `PACKET_MMAP` rings. It
//! works on every kernel and interface; it is what to fall back to where
//! AF_XDP is not possible.
//!
//! Each queue pair is one socket bound to the interface, in promiscuous
//! mode, with a `TPACKET_V2` receive ring and transmit ring in one mapping
//! shared with the kernel. Several queues form a `PACKET_FANOUT_HASH` group,
//! so the kernel spreads flows over them. Transmit bypasses the qdisc layer
//! (`PACKET_QDISC_BYPASS`), as DPDK's `net_af_packet` does.
//!
//! Receive: the kernel writes each frame into a ring slot and hands the
//! slot over (`TP_STATUS_USER`); the switch reads the frame in place and
//! hands the slot back when the burst is released. A VLAN tag the kernel
//! took off (`TP_STATUS_VLAN_VALID`: veth and most NICs strip tags) is put
//! back as a 4-byte piece in front of the payload, so a trunk sees the frame
//! as it was on the wire. Frames the host itself sends out of the interface
//! (`PACKET_OUTGOING`) are not the wire's and are skipped.
//!
//! Transmit: one copy into a free slot, `TP_STATUS_SEND_REQUEST`, and one
//! `sendto` per burst. A frame longer than the interface's MTU allows is
//! dropped and counted as `too_long`.
//!
//! The port follows the interface: every 2 s it looks at it again; when it
//! went away (or was made again with a new index) the port goes down and
//! its sockets close; when it is back the port opens them and comes up.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_api::{AfPacketSpec, PortStatus};
use tracing::{info, warn};

use crate::port::netdev::{ifindex, read_mtu};
use crate::port::{Port, PortCtx, PortError};
use crate::queue::{
    PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue, BURST_SIZE,
};
use crate::wire::ethernet::{ETHERTYPE_VLAN, HEADER_LEN as ETH_HEADER_LEN, VLAN_TAG_LEN};

/// How often the interface is looked at again.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Bytes of each ring (receive and transmit alike).
const RING_BYTES: usize = 4 << 20;
/// Ring block size (a multiple of every frame size used).
const BLOCK: usize = 1 << 16;
/// Where a frame's data starts in a transmit slot: after the header,
/// aligned (`TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`).
const TX_DATA: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();
/// Where the `struct sockaddr_ll` of a received frame is.
const RX_SLL: usize = TX_DATA;

// `struct tpacket2_hdr` field offsets.
const H_STATUS: usize = 0;
const H_LEN: usize = 4;
const H_SNAPLEN: usize = 8;
const H_MAC: usize = 12;
const H_VLAN_TCI: usize = 24;
const H_VLAN_TPID: usize = 26;
/// Destination and source MACs, then the tag the kernel took off.
const TAGGED_HEAD: usize = 12 + VLAN_TAG_LEN;
/// `sll_pkttype` in `struct sockaddr_ll`.
const SLL_PKTTYPE: usize = 10;

/// A ring mapping shared with the kernel; unmapped when the last queue
/// holding it is dropped (after the socket is, so no frame is in flight).
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; each ring's slots are used by one
// queue at a time (its owner holds it by `&mut`), and slot handover with
// the kernel goes through atomic status words.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared references only reach `base` and `len`.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is the mapping `mmap` returned, unmapped
        // once, here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// One ring of one socket.
struct Ring {
    map: Arc<Mapping>,
    /// Offset of the ring in the mapping.
    start: usize,
    frame_size: usize,
    frames: usize,
}

impl Ring {
    /// The header of slot `i` (`i < frames`).
    fn slot(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.frames);
        // SAFETY: `start + i * frame_size` lies inside the mapping: the ring
        // holds `frames` slots of `frame_size` bytes from `start`.
        unsafe { self.map.base.add(self.start + i * self.frame_size) }
    }

    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the status word is the slot's first 4 bytes, 4-aligned
        // (slots are 16-aligned in a page-aligned mapping), and the kernel
        // and this queue only ever access it atomically.
        unsafe { &*(self.slot(i).add(H_STATUS) as *const AtomicU32) }
    }

    fn read<const N: usize>(&self, i: usize, at: usize) -> [u8; N] {
        let mut b = [0u8; N];
        // SAFETY: `at + N` is within the slot's header (callers pass fixed
        // header offsets); the slot is ours (status USER) while we read.
        unsafe { std::ptr::copy_nonoverlapping(self.slot(i).add(at), b.as_mut_ptr(), N) };
        b
    }
}

/// Opens one socket on interface `index` with rings of `frame_size`-byte
/// slots; `fanout`: the group to join when the port has several queues.
fn open_socket(
    index: u32,
    frame_size: usize,
    fanout: Option<u16>,
) -> io::Result<(OwnedFd, Ring, Ring)> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::c_int::from(proto),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `socket` returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let set = |opt: libc::c_int, val: *const libc::c_void, len: usize| -> io::Result<()> {
        // SAFETY: `val` points at `len` readable bytes of the option's type,
        // which live past the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                opt,
                val,
                len as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    let version: libc::c_int = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
    set(
        libc::PACKET_VERSION,
        (&version as *const libc::c_int).cast(),
        std::mem::size_of::<libc::c_int>(),
    )?;
    let block = BLOCK.max(frame_size);
    let req = libc::tpacket_req {
        tp_block_size: block as u32,
        tp_block_nr: (RING_BYTES / block) as u32,
        tp_frame_size: frame_size as u32,
        tp_frame_nr: (RING_BYTES / frame_size) as u32,
    };
    for opt in [libc::PACKET_RX_RING, libc::PACKET_TX_RING] {
        set(
            opt,
            (&req as *const libc::tpacket_req).cast(),
            std::mem::size_of::<libc::tpacket_req>(),
        )?;
    }
    let one: libc::c_int = 1;
    // Best effort: kernels before 3.14 go through the qdisc.
    let _ = set(
        libc::PACKET_QDISC_BYPASS,
        (&one as *const libc::c_int).cast(),
        std::mem::size_of::<libc::c_int>(),
    );
    let ring = (req.tp_block_size as usize) * (req.tp_block_nr as usize);
    let len = 2 * ring;
    // SAFETY: a fresh shared mapping of the socket's two rings, as the
    // kernel sized them; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let map = Arc::new(Mapping {
        base: base.cast(),
        len,
    });
    // SAFETY: all-zero is a valid `sockaddr_ll`; the fields that matter are
    // set below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as libc::c_int;
    // SAFETY: `sll` is a `sockaddr_ll` of the length given, alive for the call.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero is a valid `packet_mreq`.
    let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
    mr.mr_ifindex = index as libc::c_int;
    mr.mr_type = libc::PACKET_MR_PROMISC as u16;
    set(
        libc::PACKET_ADD_MEMBERSHIP,
        (&mr as *const libc::packet_mreq).cast(),
        std::mem::size_of::<libc::packet_mreq>(),
    )?;
    if let Some(id) = fanout {
        let arg: libc::c_int =
            (libc::PACKET_FANOUT_HASH << 16) as libc::c_int | libc::c_int::from(id);
        set(
            libc::PACKET_FANOUT,
            (&arg as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>(),
        )?;
    }
    let frames = RING_BYTES / frame_size;
    let rx = Ring {
        map: map.clone(),
        start: 0,
        frame_size,
        frames,
    };
    let tx = Ring {
        map,
        start: ring,
        frame_size,
        frames,
    };
    Ok((fd, rx, tx))
}

/// The receive side of one socket.
struct AfpRx {
    fd: Arc<OwnedFd>,
    ring: Ring,
    cursor: usize,
    /// Slots of the burst being read, handed back at release.
    taken: Vec<usize>,
    /// Per slot: the addresses and the VLAN tag put back (16 bytes).
    tagged: Box<[[u8; TAGGED_HEAD]]>,
}

impl RxQueue for AfpRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        while !burst.is_full() && self.taken.len() < self.ring.frames {
            let i = self.cursor;
            let status = self.ring.status(i).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            self.cursor = (i + 1) % self.ring.frames;
            self.taken.push(i);
            let len = u32::from_ne_bytes(self.ring.read(i, H_LEN)) as usize;
            let snap = u32::from_ne_bytes(self.ring.read(i, H_SNAPLEN)) as usize;
            let mac = u16::from_ne_bytes(self.ring.read(i, H_MAC)) as usize;
            let [pkttype] = self.ring.read(i, RX_SLL + SLL_PKTTYPE);
            // The kernel wrote these; check them all the same, in u64.
            if pkttype == libc::PACKET_OUTGOING
                || snap < ETH_HEADER_LEN
                || (mac as u64) + (snap as u64) > self.ring.frame_size as u64
            {
                continue;
            }
            if snap < len {
                // Longer than a ring slot (an MTU raised after the port
                // opened): never passed on cut.
                burst.dropped += 1;
                continue;
            }
            let data = self.ring.slot(i).wrapping_add(mac);
            let slot = burst.next_slot();
            if status & libc::TP_STATUS_VLAN_VALID != 0 {
                let tci = u16::from_ne_bytes(self.ring.read(i, H_VLAN_TCI));
                let tpid = match status & libc::TP_STATUS_VLAN_TPID_VALID {
                    0 => ETHERTYPE_VLAN,
                    _ => u16::from_ne_bytes(self.ring.read(i, H_VLAN_TPID)),
                };
                let h = &mut self.tagged[i];
                // SAFETY: the first 12 bytes of the frame lie in the slot
                // (`snap >= 14` was checked against the slot's size).
                unsafe { std::ptr::copy_nonoverlapping(data, h.as_mut_ptr(), 12) };
                h[12..14].copy_from_slice(&tpid.to_be_bytes());
                h[14..16].copy_from_slice(&tci.to_be_bytes());
                // SAFETY: `h` lives in this queue and is not written again
                // before the slot is handed back at release; the rest of
                // the frame lies in the slot, which the kernel leaves alone
                // until then (status USER).
                unsafe {
                    slot.push(h.as_ptr(), h.len() as u32);
                    slot.push(data.add(12), (snap - 12) as u32);
                }
            } else {
                // SAFETY: as above: `mac + snap` is inside the slot, ours
                // until release.
                unsafe { slot.push(data, snap as u32) };
            }
            burst.commit();
        }
        Ok(burst.len())
    }

    fn release(&mut self) {
        for &i in &self.taken {
            self.ring
                .status(i)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        }
        self.taken.clear();
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn interrupt_is_eventfd(&self) -> bool {
        false
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        self.ring.status(self.cursor).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }
}

/// The transmit side of one socket.
struct AfpTx {
    fd: Arc<OwnedFd>,
    ring: Ring,
    cursor: usize,
    queued: bool,
    mtu: Arc<AtomicU32>,
}

impl TxQueue for AfpTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let mut head = [0u8; ETH_HEADER_LEN];
        let got = {
            let mut r = frame.reader();
            // SAFETY: `head` is a local buffer of the length given.
            unsafe { r.copy_to(head.as_mut_ptr(), head.len()) }
        };
        let tagged =
            got == ETH_HEADER_LEN && u16::from_be_bytes([head[12], head[13]]) == ETHERTYPE_VLAN;
        let overhead = ETH_HEADER_LEN + if tagged { VLAN_TAG_LEN } else { 0 };
        let len = frame.len();
        if len > self.mtu.load(Ordering::Relaxed) as usize + overhead
            || TX_DATA + len > self.ring.frame_size
        {
            return Err(TxError::TooLong);
        }
        let i = self.cursor;
        let st = self.ring.status(i).load(Ordering::Acquire);
        if st != libc::TP_STATUS_AVAILABLE && st != libc::TP_STATUS_WRONG_FORMAT {
            return Err(TxError::Full);
        }
        let slot = self.ring.slot(i);
        // SAFETY: `TX_DATA + len <= frame_size` (checked), so the copy stays
        // in this slot, which is ours (status AVAILABLE) until we hand it
        // over below; the source is the frame's (live) pieces.
        let n = unsafe { frame.reader().copy_to(slot.add(TX_DATA), len) };
        let l = (n as u32).to_ne_bytes();
        // SAFETY: `tp_len` and `tp_snaplen` lie in the slot's header.
        unsafe {
            std::ptr::copy_nonoverlapping(l.as_ptr(), slot.add(H_LEN), 4);
            std::ptr::copy_nonoverlapping(l.as_ptr(), slot.add(H_SNAPLEN), 4);
        }
        self.ring
            .status(i)
            .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.cursor = (i + 1) % self.ring.frames;
        self.queued = true;
        Ok(())
    }

    fn flush(&mut self) {
        if !std::mem::take(&mut self.queued) {
            return;
        }
        // SAFETY: no buffer: the kernel sends the slots marked SEND_REQUEST.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
    }
}

/// An af-packet port.
pub struct AfPacketPort {
    name: String,
    spec: AfPacketSpec,
    fanout: u16,
    mtu: Arc<AtomicU32>,
    /// The interface index the sockets are bound to, while open.
    open: Option<u32>,
    check_at: Option<Instant>,
    status: PortStatus,
}

impl AfPacketPort {
    /// A port that is not started yet; `fanout` names its fanout group.
    pub fn new(name: &str, spec: &AfPacketSpec, fanout: u16) -> AfPacketPort {
        AfPacketPort {
            name: name.to_string(),
            spec: spec.clone(),
            fanout,
            mtu: Arc::new(AtomicU32::new(1500)),
            open: None,
            check_at: None,
            status: PortStatus::default(),
        }
    }

    /// Opens a socket per queue and hands the rings to the workers.
    fn open(&mut self, cx: &PortCtx<'_>) -> io::Result<()> {
        let ifname = &self.spec.interface;
        let index = ifindex(ifname)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such interface"))?;
        let mtu = read_mtu(ifname)?;
        self.mtu.store(mtu, Ordering::Relaxed);
        // A slot holds the header and the largest frame the MTU allows
        // (a VLAN tag included), in a power of two.
        let frame_size = (TX_DATA + mtu as usize + ETH_HEADER_LEN + VLAN_TAG_LEN)
            .next_power_of_two()
            .max(2048);
        let n = self.spec.queues.unwrap_or(1);
        let fanout = (n > 1).then_some(self.fanout);
        let mut q = PortQueues::default();
        for _ in 0..n {
            let (fd, rx, tx) = open_socket(index, frame_size, fanout)?;
            let fd = Arc::new(fd);
            let frames = rx.frames;
            q.rx.push(Box::new(AfpRx {
                fd: fd.clone(),
                ring: rx,
                cursor: 0,
                taken: Vec::with_capacity(BURST_SIZE),
                tagged: vec![[0u8; TAGGED_HEAD]; frames].into_boxed_slice(),
            }));
            q.tx.push(Box::new(AfpTx {
                fd,
                ring: tx,
                cursor: 0,
                queued: false,
                mtu: self.mtu.clone(),
            }));
        }
        cx.attach(q);
        self.open = Some(index);
        self.status.link_up = true;
        self.status.connects += 1;
        self.status.rx_queues = n.into();
        self.status.tx_queues = n.into();
        self.status.last_error = None;
        self.status.peer = Some(format!("kernel interface {ifname} (af-packet, mtu {mtu})"));
        info!(port = %self.name, interface = %ifname, queues = n, mtu, "af-packet link up");
        Ok(())
    }

    fn close(&mut self, cx: &PortCtx<'_>, why: &str) {
        if self.open.take().is_some() {
            cx.detach();
            info!(port = %self.name, interface = %self.spec.interface, "link down: {why}");
        }
        self.status.link_up = false;
        self.status.rx_queues = 0;
        self.status.tx_queues = 0;
        self.status.peer = None;
        self.status.last_error = Some(why.to_string());
    }
}

impl Port for AfPacketPort {
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        self.check_at = Some(Instant::now() + CHECK_EVERY);
        self.open(cx).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::PermissionDenied {
                " (AF_PACKET needs CAP_NET_RAW)"
            } else {
                ""
            };
            PortError::Other(format!("{}: {e}{hint}", self.spec.interface))
        })
    }

    fn on_ready(&mut self, _: &PortCtx<'_>, _: u32) {}

    fn deadline(&self) -> Option<Instant> {
        self.check_at
    }

    fn on_timer(&mut self, cx: &PortCtx<'_>, now: Instant) {
        if self.check_at.is_none_or(|t| now < t) {
            return;
        }
        self.check_at = Some(now + CHECK_EVERY);
        let index = ifindex(&self.spec.interface);
        match (self.open, index) {
            (Some(open), Some(i)) if open == i => {
                if let Ok(m) = read_mtu(&self.spec.interface) {
                    if self.mtu.swap(m, Ordering::Relaxed) != m {
                        // Ring slots are sized for the MTU: open again.
                        self.close(cx, "MTU changed");
                        let _ = self.open(cx);
                    }
                }
            }
            (Some(_), Some(_)) => {
                self.close(cx, "the interface was made again");
                if let Err(e) = self.open(cx) {
                    self.status.last_error = Some(e.to_string());
                }
            }
            (Some(_), None) => self.close(cx, "the interface went away"),
            (None, Some(_)) => {
                if let Err(e) = self.open(cx) {
                    warn!(port = %self.name, "cannot open {}: {e}", self.spec.interface);
                    self.status.last_error = Some(e.to_string());
                }
            }
            (None, None) => {}
        }
    }

    fn on_fault(&mut self, _: &PortCtx<'_>, reason: &str) {
        warn!(port = %self.name, "af-packet queue fault: {reason}");
    }

    fn status(&self) -> PortStatus {
        self.status.clone()
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        self.close(cx, "port deleted");
        self.check_at = None;
    }
}
