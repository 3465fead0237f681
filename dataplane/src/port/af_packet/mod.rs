//! af-packet ports: an existing kernel interface (a NIC, a bond, a veth)
//! as an uplink, through `AF_PACKET` sockets with `PACKET_MMAP` rings. It
//! works on every kernel and interface; it is what to fall back to where
//! AF_XDP is not possible.
//!
//! Each queue pair is one socket bound to the interface, in promiscuous
//! mode, with `TPACKET_V3` receive and transmit rings in one mapping shared
//! with the kernel. Several queues form a `PACKET_FANOUT_HASH` group,
//! so the kernel spreads flows over them. Transmit bypasses the qdisc layer
//! (`PACKET_QDISC_BYPASS`), as DPDK's `net_af_packet` does.
//!
//! Receive (`TPACKET_V3`): the kernel packs frames one after another into a
//! ring block and hands the block over (`TP_STATUS_USER`) when it is full or
//! [`RETIRE_MS`] after its first frame; the switch reads the frames in place
//! and hands each block back once it has read all of it and released the
//! burst. A block holds hundreds of small frames, so the kernel and the
//! switch exchange one status word per block, not per frame. Frames leaving
//! through the interface are not copied in (`PACKET_IGNORE_OUTGOING`). A VLAN
//! tag the kernel took off (`TP_STATUS_VLAN_VALID`: veth and most NICs strip tags) is put
//! back as a 4-byte piece in front of the payload, so a trunk sees the frame
//! as it was on the wire. Frames the host itself sends out of the interface
//! (`PACKET_OUTGOING`) are not the wire's and are skipped.
//!
//! Transmit (`TPACKET_V3` frames, one per slot, as V2 has them): one copy
//! into a free slot, `TP_STATUS_SEND_REQUEST`, and one `sendto` per burst.
//! A frame longer than the interface's MTU allows is dropped and counted as
//! `too_long`.
//!
//! Offloads (`PACKET_VNET_HDR`): every frame, both ways, has a virtio-net
//! header in front of it. Received, it says what the sender left undone: a
//! checksum (a veth's transmit checksum offload leaves only the
//! pseudo-header's sum), or a TCP or UDP super-frame of up to 64 KB (a
//! veth peer's TSO, a NIC's GRO), which the frame carries through the
//! switch ([`crate::queue::Offload`]). Sent, it hands the same work to the
//! kernel, which does it or passes it on (a veth peer's stack takes a
//! super-frame whole). A frame larger than a ring slot (a super-frame)
//! goes out through `sendmsg` from where it lies, after the ring is
//! flushed, so the order holds.
//!
//! The port follows the interface ([`KernelIf`]): every 2 s it looks at it
//! again; when it went away (or was made again with a new index) the port
//! goes down and its sockets close; when it is back the port opens them and
//! comes up.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use switchyard_api::AfPacketSpec;

use crate::dataplane::QueuePositions;
use crate::port::kernel::netdev::{exceeds_mtu, kernel_at_least, pad_short, FrameIovecs};
use crate::port::kernel::{Interface, KernelIf, Uplink};
use crate::port::takeover::{FdIn, FdOut, TakeoverError};
use crate::port::registry::Build;
use crate::port::Port;
use crate::queue::QueuePosition;

mod persist;

use crate::wire::virtio_net::VNET_HDR_LEN;
use crate::queue::{
    Offload, OffloadCaps, PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue,
    BURST_SIZE,
};
use crate::wire::ethernet::{ETHERTYPE_VLAN, HEADER_LEN as ETH_HEADER_LEN, VLAN_TAG_LEN};
use persist::{RxPosition, TxPosition};

/// Bytes of each ring (receive and transmit alike).
const RING_BYTES: usize = 4 << 20;
/// Ring block size (a multiple of every frame size used): a receive block
/// holds a 64 KB super-frame with its headers.
const BLOCK: usize = 1 << 17;
/// A receive block not yet full is handed over this long after its first
/// frame (milliseconds): the most a frame waits at low rates.
const RETIRE_MS: u32 = 1;
/// Where a frame's data starts in a transmit slot: after the header,
/// aligned (`TPACKET3_HDRLEN - sizeof(struct sockaddr_ll)`).
const TX_DATA: usize = libc::TPACKET3_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();
/// Where the `struct sockaddr_ll` of a received frame is, from its header.
const RX_SLL: usize = TX_DATA;

// `struct tpacket3_hdr` field offsets.
const H_NEXT: usize = std::mem::offset_of!(libc::tpacket3_hdr, tp_next_offset);
const H_SNAPLEN: usize = std::mem::offset_of!(libc::tpacket3_hdr, tp_snaplen);
const H_LEN: usize = std::mem::offset_of!(libc::tpacket3_hdr, tp_len);
const H_STATUS: usize = std::mem::offset_of!(libc::tpacket3_hdr, tp_status);
const H_MAC: usize = std::mem::offset_of!(libc::tpacket3_hdr, tp_mac);
const H_VLAN_TCI: usize = std::mem::offset_of!(libc::tpacket3_hdr, hv1)
    + std::mem::offset_of!(libc::tpacket_hdr_variant1, tp_vlan_tci);
const H_VLAN_TPID: usize = std::mem::offset_of!(libc::tpacket3_hdr, hv1)
    + std::mem::offset_of!(libc::tpacket_hdr_variant1, tp_vlan_tpid);
/// A received frame's header and address, before its data may start.
const RX_HEAD: usize = RX_SLL + std::mem::size_of::<libc::sockaddr_ll>();
// `struct tpacket_block_desc` field offsets.
const B_STATUS: usize = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
    + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status);
const B_NUM_PKTS: usize = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
    + std::mem::offset_of!(libc::tpacket_hdr_v1, num_pkts);
const B_FIRST: usize = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
    + std::mem::offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt);
/// The block descriptor, before the first frame may start.
const B_HEAD: usize = std::mem::size_of::<libc::tpacket_block_desc>();
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
        // SAFETY: the status word lies in the slot's header, 4-aligned
        // (slots are 16-aligned in a page-aligned mapping, `tp_status` is at
        // offset 20), and the kernel and this queue only ever access it
        // atomically.
        unsafe { &*(self.slot(i).add(H_STATUS) as *const AtomicU32) }
    }
}

/// The receive ring: `blocks` blocks of `block_size` bytes, each filled by
/// the kernel with frames one after another and handed over whole.
struct BlockRing {
    map: Arc<Mapping>,
    /// Offset of the ring in the mapping.
    start: usize,
    block_size: usize,
    blocks: usize,
}

impl BlockRing {
    /// The start of block `b` (`b < blocks`).
    fn block(&self, b: usize) -> *mut u8 {
        debug_assert!(b < self.blocks);
        // SAFETY: `start + b * block_size` lies inside the mapping: the
        // ring holds `blocks` blocks of `block_size` bytes from `start`.
        unsafe { self.map.base.add(self.start + b * self.block_size) }
    }

    fn status(&self, b: usize) -> &AtomicU32 {
        // SAFETY: the block status word lies in the block's descriptor,
        // 4-aligned (blocks are page-aligned); the kernel and this queue
        // only ever access it atomically.
        unsafe { &*(self.block(b).add(B_STATUS) as *const AtomicU32) }
    }

    /// `N` bytes at `at` in block `b`; `at + N <= block_size` (callers
    /// check offsets read from the ring against it).
    fn read<const N: usize>(&self, b: usize, at: usize) -> [u8; N] {
        assert!(at + N <= self.block_size);
        let mut v = [0u8; N];
        // SAFETY: `at + N` is within the block (asserted); the block is ours
        // (status USER) while we read.
        unsafe { std::ptr::copy_nonoverlapping(self.block(b).add(at), v.as_mut_ptr(), N) };
        v
    }

    fn read_u32(&self, b: usize, at: usize) -> u32 {
        u32::from_ne_bytes(self.read(b, at))
    }

    fn read_u16(&self, b: usize, at: usize) -> u16 {
        u16::from_ne_bytes(self.read(b, at))
    }
}

/// Sets the `SOL_PACKET` option `opt` of `fd` to `val`.
fn set_opt<T>(fd: &OwnedFd, opt: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` points at `size_of::<T>()` readable bytes of the
    // option's type, which live past the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            opt,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A new packet socket, receiving nothing until it is bound with a
/// protocol ([`bind_to`]): one made for a protocol receives it from every
/// interface of the namespace until then.
fn packet_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `socket` returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds `fd` to interface `index` for protocol `proto` (network order).
fn bind_to(fd: &OwnedFd, index: u32, proto: u16) -> io::Result<()> {
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
    Ok(())
}

/// A socket that only sends, on interface `index`, with a virtio-net
/// header in front of each frame: for frames larger than a ring slot
/// (`sendmsg` on a socket with a transmit ring sends the ring, not the
/// message). It receives nothing (protocol 0).
fn direct_socket(index: u32) -> io::Result<OwnedFd> {
    let fd = packet_socket()?;
    set_opt(&fd, libc::PACKET_VNET_HDR, &1 as &libc::c_int)?;
    // Best effort: kernels before 3.14 go through the qdisc.
    let _ = set_opt(&fd, libc::PACKET_QDISC_BYPASS, &1 as &libc::c_int);
    bind_to(&fd, index, 0)?;
    Ok(fd)
}

/// The sizes of a socket's two rings, as the kernel made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Geometry {
    /// Bytes of a receive block.
    block_size: usize,
    /// Receive blocks.
    blocks: usize,
    /// Bytes of a transmit slot.
    frame_size: usize,
}

impl Geometry {
    /// Maps the socket's receive and transmit rings (a takeover maps a
    /// socket's rings again in the process taking it over).
    fn map(&self, fd: &OwnedFd) -> io::Result<(BlockRing, Ring)> {
        let ring = self.block_size * self.blocks;
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
        let rx = BlockRing {
            map: map.clone(),
            start: 0,
            block_size: self.block_size,
            blocks: self.blocks,
        };
        let tx = Ring {
            map,
            start: ring,
            frame_size: self.frame_size,
            frames: ring / self.frame_size,
        };
        Ok((rx, tx))
    }
}

/// Opens one socket on interface `index` with rings of `frame_size`-byte
/// slots; `fanout`: the group to join when the port has several queues.
fn open_socket(
    index: u32,
    frame_size: usize,
    fanout: Option<u16>,
) -> io::Result<(OwnedFd, Geometry, BlockRing, Ring)> {
    // Made receiving nothing, and given its protocol only as it is bound
    // (below): a port would otherwise take (and learn) another interface's
    // frames as its own.
    let fd = packet_socket()?;
    set_opt(
        &fd,
        libc::PACKET_VERSION,
        &(libc::tpacket_versions::TPACKET_V3 as libc::c_int),
    )?;
    let one: libc::c_int = 1;
    // A virtio-net header in front of every frame, both ways (before the
    // rings are made: the kernel refuses it after).
    set_opt(&fd, libc::PACKET_VNET_HDR, &one)?;
    // A transmit slot the kernel refuses (a bad header) is skipped and
    // handed back, rather than stopping the ring at it for good.
    set_opt(&fd, libc::PACKET_LOSS, &one)?;
    let block = BLOCK.max(frame_size);
    let mut req = libc::tpacket_req3 {
        tp_block_size: block as u32,
        tp_block_nr: (RING_BYTES / block) as u32,
        tp_frame_size: frame_size as u32,
        tp_frame_nr: (RING_BYTES / frame_size) as u32,
        tp_retire_blk_tov: RETIRE_MS,
        tp_sizeof_priv: 0,
        tp_feature_req_word: 0,
    };
    for opt in [libc::PACKET_RX_RING, libc::PACKET_TX_RING] {
        set_opt(&fd, opt, &req)?;
        // The transmit ring is one frame per slot: no block timer.
        req.tp_retire_blk_tov = 0;
    }
    // Best effort: kernels before 3.14 go through the qdisc.
    let _ = set_opt(&fd, libc::PACKET_QDISC_BYPASS, &one);
    // Frames leaving through the interface (the switch's own, the host's)
    // are not received: without this the kernel copies each into the
    // receive ring only for the switch to skip it, a 64 KB copy for every
    // super-frame sent. Best effort: kernels before 4.20 still copy them
    // (and they are skipped as `PACKET_OUTGOING`).
    let _ = set_opt(&fd, libc::PACKET_IGNORE_OUTGOING, &one);
    let geometry = Geometry {
        block_size: block,
        blocks: req.tp_block_nr as usize,
        frame_size,
    };
    let (rx, tx) = geometry.map(&fd)?;
    bind_to(&fd, index, (libc::ETH_P_ALL as u16).to_be())?;
    // SAFETY: all-zero is a valid `packet_mreq`.
    let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
    mr.mr_ifindex = index as libc::c_int;
    mr.mr_type = libc::PACKET_MR_PROMISC as u16;
    set_opt(&fd, libc::PACKET_ADD_MEMBERSHIP, &mr)?;
    if let Some(id) = fanout {
        let arg: libc::c_int =
            (libc::PACKET_FANOUT_HASH << 16) as libc::c_int | libc::c_int::from(id);
        set_opt(&fd, libc::PACKET_FANOUT, &arg)?;
    }
    Ok((fd, geometry, rx, tx))
}

/// The receive side of one socket.
struct AfpRx {
    fd: Arc<OwnedFd>,
    ring: BlockRing,
    /// The block being read.
    block: usize,
    /// Frames of it not read yet, and where the next one is.
    left: u32,
    next: usize,
    /// Blocks read to their end, handed back at release.
    done: Vec<usize>,
    /// Per frame of the burst: the addresses and the VLAN tag put back.
    tagged: Box<[[u8; TAGGED_HEAD]; BURST_SIZE]>,
    in_burst: usize,
}

impl AfpRx {
    fn new(fd: Arc<OwnedFd>, ring: BlockRing) -> AfpRx {
        AfpRx {
            fd,
            done: Vec::with_capacity(ring.blocks),
            ring,
            block: 0,
            left: 0,
            next: 0,
            tagged: Box::new([[0; TAGGED_HEAD]; BURST_SIZE]),
            in_burst: 0,
        }
    }

    /// The current block is read: it goes back at release.
    fn finish_block(&mut self) {
        self.left = 0;
        self.done.push(self.block);
        self.block = (self.block + 1) % self.ring.blocks;
    }
}

impl RxQueue for AfpRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let size = self.ring.block_size as u64;
        while !burst.is_full() {
            if self.left == 0 {
                // Every block is read and not yet given back: wait for
                // release.
                if self.done.len() == self.ring.blocks {
                    break;
                }
                let b = self.block;
                if self.ring.status(b).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                    break;
                }
                self.left = self.ring.read_u32(b, B_NUM_PKTS);
                self.next = self.ring.read_u32(b, B_FIRST) as usize;
                if self.left == 0 || (self.next as u64) < B_HEAD as u64 {
                    self.finish_block();
                }
                continue;
            }
            let (b, at) = (self.block, self.next);
            // The kernel wrote every offset and length; check them all the
            // same, in u64, against the block.
            if at as u64 + RX_HEAD as u64 > size {
                self.finish_block();
                continue;
            }
            let next = self.ring.read_u32(b, at + H_NEXT) as u64;
            let snap = self.ring.read_u32(b, at + H_SNAPLEN) as usize;
            let len = self.ring.read_u32(b, at + H_LEN) as usize;
            let status = self.ring.read_u32(b, at + H_STATUS);
            let mac = self.ring.read_u16(b, at + H_MAC) as usize;
            let [pkttype] = self.ring.read(b, at + RX_SLL + SLL_PKTTYPE);
            let tci = self.ring.read_u16(b, at + H_VLAN_TCI);
            let tpid = self.ring.read_u16(b, at + H_VLAN_TPID);
            self.left -= 1;
            if self.left == 0 || next == 0 || at as u64 + next + RX_HEAD as u64 > size {
                self.finish_block();
            } else {
                self.next = at + next as usize;
            }
            if pkttype == libc::PACKET_OUTGOING
                || snap < ETH_HEADER_LEN
                || (mac as u64) < (RX_HEAD + VNET_HDR_LEN) as u64
                || at as u64 + mac as u64 + snap as u64 > size
            {
                continue;
            }
            if snap < len {
                // Longer than a ring slot (an MTU raised after the port
                // opened): never passed on cut.
                burst.dropped += 1;
                continue;
            }
            // The header lies right before the frame, after the frame's
            // `tpacket3_hdr` and address (`mac >= RX_HEAD + VNET_HDR_LEN`).
            let vnet = self.ring.read::<VNET_HDR_LEN>(b, at + mac - VNET_HDR_LEN);
            let tag_back = status & libc::TP_STATUS_VLAN_VALID != 0;
            let offload = match Offload::from_vnet(&vnet, snap) {
                // A tag put back moves what follows the addresses.
                Ok(o) if tag_back => o.shifted(VLAN_TAG_LEN as i32),
                Ok(o) => o,
                Err(_) => {
                    burst.bad_offload += 1;
                    continue;
                }
            };
            // SAFETY: `at + mac + snap <= block_size` (checked above).
            let data = unsafe { self.ring.block(b).add(at + mac) };
            let slot = burst.next_slot();
            slot.offload = offload;
            if tag_back {
                let tpid = match status & libc::TP_STATUS_VLAN_TPID_VALID {
                    0 => ETHERTYPE_VLAN,
                    _ => tpid,
                };
                let h = &mut self.tagged[self.in_burst];
                self.in_burst += 1;
                // SAFETY: the first 12 bytes of the frame lie in the block
                // (`snap >= 14` was checked against the block's size).
                unsafe { std::ptr::copy_nonoverlapping(data, h.as_mut_ptr(), 12) };
                h[12..14].copy_from_slice(&tpid.to_be_bytes());
                h[14..16].copy_from_slice(&tci.to_be_bytes());
                // SAFETY: `h` lives in this queue and is not written again
                // before release (one per frame of the burst, which holds
                // at most BURST_SIZE); the rest of the frame lies in the
                // block, which the kernel leaves alone until it is handed
                // back at release (status USER).
                unsafe {
                    slot.push(h.as_ptr(), h.len() as u32);
                    slot.push(data.add(12), (snap - 12) as u32);
                }
            } else {
                // SAFETY: as above: `at + mac + snap` is inside the block,
                // ours until release.
                unsafe { slot.push(data, snap as u32) };
            }
            burst.commit();
        }
        Ok(burst.len())
    }

    fn release(&mut self) {
        for &b in &self.done {
            self.ring
                .status(b)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        }
        self.done.clear();
        self.in_burst = 0;
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn interrupt_is_eventfd(&self) -> bool {
        false
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        self.left > 0
            || self.ring.status(self.block).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    /// The block being read and where in it: the kernel's ring does not
    /// say which block the reader is at.
    fn position(&self) -> Option<QueuePosition> {
        Some(QueuePosition::new(RxPosition {
            block: self.block,
            left: self.left,
            next: self.next,
        }))
    }
}

/// The transmit side of one socket.
struct AfpTx {
    fd: Arc<OwnedFd>,
    /// The socket frames larger than a slot leave through.
    direct: Arc<OwnedFd>,
    /// What the kernel takes in a virtio-net header.
    caps: OffloadCaps,
    ring: Ring,
    cursor: usize,
    queued: bool,
    mtu: Arc<AtomicU32>,
}

impl AfpTx {
    /// Sends a frame too large for a ring slot (a super-frame) with
    /// `sendmsg`, straight from where it lies, after what the ring holds.
    #[cold]
    fn send_direct(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        self.flush();
        let vnet = frame.offload.to_vnet();
        let mut iov = FrameIovecs::new(&vnet, frame);
        // SAFETY: all-zero is a valid `msghdr`; it names no address (the
        // socket is bound to the interface) and the frame's iovecs.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        (msg.msg_iov, msg.msg_iovlen) = iov.raw();
        // SAFETY: every iovec points at readable bytes alive for the call:
        // `vnet`, the prefix, and the frame's segments (checked against
        // their mapping when received). The kernel only reads them.
        let r = unsafe { libc::sendmsg(self.direct.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(());
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN | libc::ENOBUFS) => Err(TxError::Full),
            _ => Err(TxError::TooLong),
        }
    }
}

impl TxQueue for AfpTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let len = frame.len();
        // A super-frame's segments, the kernel's to cut, must fit the MTU.
        if exceeds_mtu(frame, self.mtu.load(Ordering::Relaxed)) {
            return Err(TxError::TooLong);
        }
        if TX_DATA + VNET_HDR_LEN + len > self.ring.frame_size {
            return self.send_direct(frame);
        }
        let i = self.cursor;
        let st = self.ring.status(i).load(Ordering::Acquire);
        if st != libc::TP_STATUS_AVAILABLE && st != libc::TP_STATUS_WRONG_FORMAT {
            return Err(TxError::Full);
        }
        let slot = self.ring.slot(i);
        let vnet = frame.offload.to_vnet();
        // SAFETY: `TX_DATA + VNET_HDR_LEN + len <= frame_size` (checked),
        // so the header and the copy stay in this slot, which is ours
        // (status AVAILABLE) until we hand it over below; the source is the
        // frame's (live) pieces. The padding stays in it too: a slot holds
        // far more than TX_DATA + VNET_HDR_LEN + 60 bytes.
        let n = unsafe {
            let data = slot.add(TX_DATA);
            std::ptr::copy_nonoverlapping(vnet.as_ptr(), data, VNET_HDR_LEN);
            let data = data.add(VNET_HDR_LEN);
            pad_short(data, frame.reader().copy_to(data, len))
        };
        let l = ((VNET_HDR_LEN + n) as u32).to_ne_bytes();
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

    fn offloads(&self) -> OffloadCaps {
        self.caps
    }

    fn position(&self) -> Option<QueuePosition> {
        Some(QueuePosition::new(TxPosition {
            cursor: self.cursor,
        }))
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

/// An af-packet port: its sockets on a followed kernel interface.
pub fn port(spec: &AfPacketSpec, b: &Build<'_>) -> Box<dyn Port> {
    let (name, fanout) = (b.name(), switchyard_api::stable_hash(b.name()) as u16);
    let uplink = AfPacket {
        queues: spec.queues.unwrap_or(1),
        fanout,
        open: Vec::new(),
        geometry: None,
    };
    Box::new(KernelIf::new(name, &spec.interface, uplink))
}

/// How an af-packet port opens its queues.
struct AfPacket {
    queues: u16,
    /// Its fanout group (several queues share the interface's frames).
    fanout: u16,
    /// The sockets open (ring and direct, per queue), kept to hand over.
    open: Vec<(Arc<OwnedFd>, Arc<OwnedFd>)>,
    /// Their rings' sizes.
    geometry: Option<Geometry>,
}

impl AfPacket {
    /// What the kernel takes in a virtio-net header: checksum and TCP
    /// segmentation work; UDP segmentation (`GSO_UDP_L4`) from 6.2.
    fn caps() -> OffloadCaps {
        let tcp = OffloadCaps::CSUM
            .with(OffloadCaps::TSO4)
            .with(OffloadCaps::TSO6);
        if kernel_at_least(6, 2) {
            tcp.with(OffloadCaps::USO)
        } else {
            tcp
        }
    }
}

impl Uplink for AfPacket {
    const KIND: &'static str = "af-packet";
    const REOPEN_ON_MTU: bool = true;

    /// A socket per queue, with ring slots sized for the MTU.
    fn open(&mut self, at: &Interface<'_>) -> io::Result<(PortQueues, String)> {
        let (ifname, index, mtu) = (at.name, at.index, at.mtu);
        let m = mtu.load(Ordering::Relaxed);
        // A slot holds the header and the largest frame the MTU allows
        // (a VLAN tag included), in a power of two.
        let frame_size = (TX_DATA + VNET_HDR_LEN + m as usize + ETH_HEADER_LEN + VLAN_TAG_LEN)
            .next_power_of_two()
            .max(2048);
        let n = self.queues;
        let fanout = (n > 1).then_some(self.fanout);
        let caps = AfPacket::caps();
        let mut q = PortQueues::default();
        self.open.clear();
        for _ in 0..n {
            let (fd, geometry, rx, tx) = open_socket(index, frame_size, fanout)?;
            let (fd, direct) = (Arc::new(fd), Arc::new(direct_socket(index)?));
            self.open.push((fd.clone(), direct.clone()));
            self.geometry = Some(geometry);
            q.rx.push(Box::new(AfpRx::new(fd.clone(), rx)));
            q.tx.push(Box::new(AfpTx {
                fd,
                direct,
                caps,
                ring: tx,
                cursor: 0,
                queued: false,
                mtu: mtu.clone(),
            }));
        }
        Ok((q, format!("kernel interface {ifname} (af-packet, mtu {m})")))
    }

    fn closed(&mut self) {
        self.open.clear();
    }

    type Saved = persist::SavedQueues;

    fn save(
        &self,
        positions: QueuePositions,
        fds: &mut FdOut,
    ) -> Result<persist::SavedQueues, String> {
        self.save_queues(positions, fds)
    }

    /// The sockets and where each ring stood; the rings are mapped again.
    fn restore(
        &mut self,
        at: &Interface<'_>,
        saved: persist::SavedQueues,
        fds: &mut FdIn,
    ) -> Result<(PortQueues, String), TakeoverError> {
        self.restore_queues(at, saved, fds)
    }

    fn hint(e: &io::Error) -> &'static str {
        if e.kind() == io::ErrorKind::PermissionDenied {
            " (AF_PACKET needs CAP_NET_RAW)"
        } else {
            ""
        }
    }
}
