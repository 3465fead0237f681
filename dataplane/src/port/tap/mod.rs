//! tap ports: a kernel tap interface the switch creates, so the host's own
//! network stack (kubelet probes, host services, routing to other nodes)
//! is a station on the bridge, as an Open vSwitch internal port is.
//!
//! The interface is multi-queue (`IFF_MULTI_QUEUE`, one fd per queue pair)
//! and carries a virtio-net header (`IFF_VNET_HDR`, 12 bytes, as
//! [`crate::wire::virtio_net`]) with checksum and segmentation offloads on
//! (`TUNSETOFFLOAD`: checksum, TSO for IPv4 and IPv6, and UDP segmentation
//! where the kernel has it), as QEMU's tap backend and VPP's tap v2 set
//! them: the host's stack sends the switch 64 KB super-frames with their
//! checksums left to finish, and takes such frames from it, the header
//! saying what is left to do ([`crate::queue::Offload`]).
//!
//! Received frames are read into the queue's own buffers (the kernel's copy;
//! the switch then copies once into the destination). Transmit hands the
//! frame's pieces to the kernel in one `writev`, header first: the kernel's
//! copy is the only one. A frame longer than the interface's MTU allows
//! (and not a super-frame, which the kernel segments) is dropped and
//! counted as `too_long`, never truncated.
//!
//! The interface exists while the port does, as an Open vSwitch internal
//! port's does: it is persistent (`TUNSETPERSIST`), so it outlives the
//! switch's stop, restart or crash with its MAC, addresses, routes and link
//! state (the carrier is off while no switch holds it), and the restarted
//! switch attaches to it again; `port del` deletes it. Its MAC is the
//! spec's `interface_mac` when given (set when it differs); its address and
//! link state are the host's to set (`ip addr add`, `ip link set up`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_api::{PortStatus, TapSpec};
use tracing::{info, warn};

use crate::port::kernel::netdev::{
    exceeds_mtu, read_mtu, readable, status_with_mtu, FrameIovecs, IfReq,
};
use crate::port::takeover::{FdIn, FdOut, Saved};
use crate::port::registry::Build;
use crate::port::{Port, PortCtx, PortError, Start};

mod persist;
use crate::wire::virtio_net::VNET_HDR_LEN;
use crate::queue::{
    Offload, OffloadCaps, PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue,
    BURST_SIZE,
};
use crate::wire::virtio_net::HEADER_LEN as VNET_LEN;

/// Bytes of one receive buffer: the header and the largest frame a tap
/// passes without segmentation offloads (an MTU of up to 65535).
const RX_BUF: usize = VNET_LEN + 65536;
/// How often the MTU is read again (an operator may change it).
const MTU_REFRESH: Duration = Duration::from_secs(2);

// From <linux/if_tun.h>.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
const TUN_F_TSO_ECN: libc::c_ulong = 0x08;
const TUN_F_USO4: libc::c_ulong = 0x20;
const TUN_F_USO6: libc::c_ulong = 0x40;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;

/// Opens one queue of tap `ifname` (creating the interface with the first).
fn open_queue(ifname: &str) -> io::Result<OwnedFd> {
    let path = c"/dev/net/tun";
    // SAFETY: a NUL-terminated path and plain flags; the result is checked.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `open` returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq::new(ifname)?;
    let flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req`
    // lays out (name, then the flags in the union), and outlives the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let size: libc::c_int = VNET_LEN as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int, which lives past the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETVNETHDRSZ, &size as *const libc::c_int) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Turns the tap's offloads on: the kernel may then hand the switch
/// frames with their checksum or segmentation left to do. UDP
/// segmentation is asked for too and dropped where the kernel does not
/// know it (before 6.2). Returns what the kernel takes from the switch:
/// whatever it would hand over.
fn set_offloads(fd: BorrowedFd<'_>) -> io::Result<OffloadCaps> {
    let tcp = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    for (flags, caps) in [
        (tcp | TUN_F_USO4 | TUN_F_USO6, OffloadCaps::ALL),
        (
            tcp,
            OffloadCaps::CSUM
                .with(OffloadCaps::TSO4)
                .with(OffloadCaps::TSO6),
        ),
    ] {
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, flags) } == 0 {
            return Ok(caps);
        }
    }
    Err(io::Error::last_os_error())
}

/// Makes the tap behind `fd` persistent (it outlives its last fd) or not
/// (it goes with its last fd).
fn set_persist(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its argument by value.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETPERSIST, libc::c_ulong::from(on)) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the interface's MAC unless it has it already (a change would make
/// every neighbour re-resolve the host).
fn set_mac(ifname: &str, mac: switchyard_api::MacAddr) -> io::Result<()> {
    if crate::port::kernel::netdev::read_mac(ifname)? == mac {
        return Ok(());
    }
    crate::port::kernel::netdev::write_mac(ifname, mac)
}

/// The receive side of one tap queue.
struct TapRx {
    fd: Arc<OwnedFd>,
    bufs: Box<[u8]>,
}

impl RxQueue for TapRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        for i in 0..BURST_SIZE {
            if burst.is_full() {
                break;
            }
            let buf = &mut self.bufs[i * RX_BUF..(i + 1) * RX_BUF];
            // SAFETY: reading at most `buf.len()` bytes into `buf`, from an
            // fd this queue holds open.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                // EAGAIN: nothing more. Other errors (the interface going
                // away) are the port's to notice, not a peer's fault.
                break;
            }
            let n = n as usize;
            if n <= VNET_LEN {
                continue;
            }
            let mut vnet = [0u8; VNET_HDR_LEN];
            vnet.copy_from_slice(&buf[..VNET_HDR_LEN]);
            let Ok(offload) = Offload::from_vnet(&vnet, n - VNET_LEN) else {
                burst.bad_offload += 1;
                continue;
            };
            let slot = burst.next_slot();
            // SAFETY: `VNET_LEN..n` lies inside this queue's own buffer,
            // which is neither freed nor written again before the next
            // `rx_burst` (the burst is released first).
            unsafe { slot.push(buf.as_ptr().add(VNET_LEN), (n - VNET_LEN) as u32) };
            slot.offload = offload;
            burst.commit();
        }
        Ok(burst.len())
    }

    fn release(&mut self) {}

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn interrupt_is_eventfd(&self) -> bool {
        false
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        readable(self.fd.as_fd())
    }
}

/// The transmit side of one tap queue.
struct TapTx {
    fd: Arc<OwnedFd>,
    mtu: Arc<AtomicU32>,
    caps: OffloadCaps,
}

impl TxQueue for TapTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        // A super-frame's segments, the kernel's to cut, must fit the MTU.
        if exceeds_mtu(frame, self.mtu.load(Ordering::Relaxed)) {
            return Err(TxError::TooLong);
        }
        let mut vnet = [0u8; VNET_LEN];
        vnet[..VNET_HDR_LEN].copy_from_slice(&frame.offload.to_vnet());
        let mut iov = FrameIovecs::new(&vnet, frame);
        let (iov, n) = iov.raw();
        // SAFETY: every iovec points at memory valid for reads for the
        // call: the local header, the frame's prefix, and segments that
        // stay mapped until the burst is released (`RxFrame::push`). The
        // kernel only reads them.
        let w = unsafe { libc::writev(self.fd.as_raw_fd(), iov, n as libc::c_int) };
        if w < 0 {
            return match io::Error::last_os_error().raw_os_error() {
                // The kernel's queue is full, or the interface is down:
                // the frame is not taken.
                Some(libc::EAGAIN | libc::EIO) => Err(TxError::Full),
                // A header the kernel refuses.
                _ => Err(TxError::TooLong),
            };
        }
        Ok(())
    }

    fn offloads(&self) -> OffloadCaps {
        self.caps
    }

    fn flush(&mut self) {}
}

/// A tap port: the kernel interface it makes, not started yet.
pub fn port(spec: &TapSpec, b: &Build<'_>) -> Box<dyn Port> {
    Box::new(TapPort::new(b.name(), spec))
}

/// A tap port.
pub struct TapPort {
    name: String,
    spec: TapSpec,
    mtu: Arc<AtomicU32>,
    queues: Vec<Arc<OwnedFd>>,
    mtu_at: Option<Instant>,
    status: PortStatus,
}

impl TapPort {
    /// A port that is not started yet.
    pub fn new(name: &str, spec: &TapSpec) -> TapPort {
        TapPort {
            name: name.to_string(),
            spec: spec.clone(),
            mtu: Arc::new(AtomicU32::new(1500)),
            queues: Vec::new(),
            mtu_at: None,
            status: PortStatus::default(),
        }
    }

    /// Hands the queues on `self.queues` to the workers.
    fn attach(&mut self, cx: &PortCtx<'_>, caps: OffloadCaps) {
        self.refresh_mtu();
        let mut q = PortQueues::default();
        for fd in &self.queues {
            q.rx.push(Box::new(TapRx {
                fd: fd.clone(),
                bufs: vec![0u8; RX_BUF * BURST_SIZE].into_boxed_slice(),
            }));
            q.tx.push(Box::new(TapTx {
                fd: fd.clone(),
                mtu: self.mtu.clone(),
                caps,
            }));
        }
        cx.attach(q);
        self.status.link_up = true;
        self.status.rx_queues = self.queues.len();
        self.status.tx_queues = self.queues.len();
    }

    fn refresh_mtu(&mut self) {
        match read_mtu(&self.spec.interface) {
            Ok(m) => {
                if self.mtu.swap(m, Ordering::Relaxed) != m {
                    info!(port = %self.name, interface = %self.spec.interface, mtu = m, "MTU");
                }
            }
            Err(e) => {
                warn!(port = %self.name, interface = %self.spec.interface, "cannot read the MTU: {e}")
            }
        }
        self.mtu_at = Some(Instant::now() + MTU_REFRESH);
    }
}

impl Port for TapPort {
    fn start(&mut self, cx: &PortCtx<'_>, _: Start) -> Result<(), PortError> {
        let ifname = self.spec.interface.clone();
        let err = |e: io::Error| PortError::Other(format!("tap {}: {e}", self.spec.interface));
        let n = self.spec.queues.unwrap_or(1);
        let mut fds = Vec::new();
        for _ in 0..n {
            fds.push(Arc::new(open_queue(&ifname).map_err(err)?));
        }
        set_persist(fds[0].as_fd(), true).map_err(err)?;
        // Per interface: any queue's fd sets them.
        let caps = set_offloads(fds[0].as_fd()).map_err(err)?;
        if let Some(mac) = self.spec.interface_mac {
            set_mac(&ifname, mac).map_err(err)?;
        }
        self.queues = fds;
        self.attach(cx, caps);
        self.status.connects += 1;
        self.status.peer = Some(format!("kernel tap {ifname}"));
        info!(port = %self.name, interface = %ifname, queues = n, "tap created");
        Ok(())
    }

    fn save(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Saved, PortError> {
        crate::port::save_as(self, cx, fds)
    }

    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError> {
        crate::port::restore_as(self, cx, saved, fds)
    }

    fn on_ready(&mut self, _: &PortCtx<'_>, _: u32) {}

    fn deadline(&self) -> Option<Instant> {
        self.mtu_at
    }

    fn on_timer(&mut self, _: &PortCtx<'_>, now: Instant) {
        if self.mtu_at.is_some_and(|t| now >= t) {
            self.refresh_mtu();
        }
    }

    fn on_fault(&mut self, _: &PortCtx<'_>, reason: &str) {
        // The kernel is no hostile peer; a fault here is a bug to see.
        warn!(port = %self.name, "tap queue fault: {reason}");
    }

    fn status(&self) -> PortStatus {
        status_with_mtu(&self.status, &self.mtu)
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        if self.status.link_up {
            cx.detach();
        }
        self.status.link_up = false;
        // The interface stays (persistent), with the host's configuration.
        self.queues.clear();
        self.mtu_at = None;
    }

    fn remove(&mut self, cx: &PortCtx<'_>) {
        // Not persistent any more: the last fd closing deletes it. A port
        // that holds no fd (it failed to start) opens one to say so.
        let held = self.queues.first().cloned();
        let fd = held.or_else(|| open_queue(&self.spec.interface).ok().map(Arc::new));
        if let Some(fd) = fd {
            if let Err(e) = set_persist(fd.as_fd(), false) {
                warn!(port = %self.name, interface = %self.spec.interface, "cannot delete the tap: {e}");
            }
        }
        self.stop(cx);
    }
}
