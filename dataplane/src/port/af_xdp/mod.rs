//! af-xdp ports: an existing kernel interface as an uplink through AF_XDP
//! sockets, one per queue, each with its own UMEM.
//!
//! The XDP program that redirects the interface's frames to the sockets is
//! ours ([`prog`]: it puts back VLAN tags the driver holds outside the
//! data); the sockets and UMEMs are libxdp's, opened at run time
//! (`libxdp.so.1`, Debian's `libxdp1`), so a machine without it gets a clear
//! error on this kind and nothing else changes.
//!
//! Mode: native XDP with zero-copy where the driver has it, native with
//! copy next, generic (skb) XDP otherwise; the port logs and shows which.
//!
//! UMEM: the first half of each UMEM's frames feeds the fill ring
//! (receive), the second half is the transmit pool. Receive reads frames in
//! place and gives their buffers back to the fill ring at release; transmit
//! copies once into a pool frame and kicks the kernel once per burst.

use std::ffi::CString;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use switchyard_api::{AfXdpSpec, XdpMode};
use tracing::{info, warn};

use crate::port::kernel_if::{KernelIf, Uplink};
use crate::port::netdev::{self, exceeds_mtu, pad_short, rx_vlan_offload, set_rx_vlan_offload};
use crate::port::Port;
use crate::queue::offload::MAX_HDR;
use crate::queue::{
    Offload, PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue, BURST_SIZE,
};
use crate::wire::ethernet::HEADER_LEN as ETH_HEADER_LEN;

mod prog;
use prog::XdpProgram;

/// Bytes of a UMEM frame.
const FRAME: u64 = 4096;
/// Frames per UMEM (half receive, half transmit).
const FRAMES: u64 = 4096;
/// Descriptors per ring.
const RING: u32 = 2048;
/// How long a busy queue is waited for, in 10 ms tries (see `open_queue`).
const BUSY_TRIES: u32 = 20;

// <linux/if_xdp.h>, <linux/if_link.h>
const XDP_COPY: u16 = 1 << 1;
const XDP_ZEROCOPY: u16 = 1 << 2;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_RING_NEED_WAKEUP: u32 = 1;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
// <xdp/xsk.h>
const XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD: u32 = 1;

/// `struct xsk_ring_prod` / `struct xsk_ring_cons` of `<xdp/xsk.h>`.
///
/// libxdp keeps a pointer to the rings it filled in (to unmap them at
/// delete), so those stay where they were made, in [`Xsk`]; the queues
/// work on copies (the pointers never change, only the cached indices,
/// which are the queue's own).
#[repr(C)]
#[derive(Clone, Copy)]
struct XskRing {
    cached_prod: u32,
    cached_cons: u32,
    mask: u32,
    size: u32,
    producer: *mut u32,
    consumer: *mut u32,
    ring: *mut libc::c_void,
    flags: *mut u32,
}

// SAFETY: the pointers lead into the socket's ring mappings, which the
// queue holding the copy keeps alive (through its `Arc<Xsk>`); each ring is
// used by one queue, on one thread at a time.
unsafe impl Send for XskRing {}

impl XskRing {
    fn empty() -> XskRing {
        XskRing {
            cached_prod: 0,
            cached_cons: 0,
            mask: 0,
            size: 0,
            producer: std::ptr::null_mut(),
            consumer: std::ptr::null_mut(),
            ring: std::ptr::null_mut(),
            flags: std::ptr::null_mut(),
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: libxdp set `producer` to the ring's producer index in the
        // socket's ring mapping, which lives as long as the socket; the
        // kernel and we only access it atomically.
        unsafe { &*(self.producer as *const AtomicU32) }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*(self.consumer as *const AtomicU32) }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: `flags` points at the ring's flags word (as `producer`).
        let flags = unsafe { (*(self.flags as *const AtomicU32)).load(Ordering::Relaxed) };
        flags & XDP_RING_NEED_WAKEUP != 0
    }

    /// Slot `i` (masked) of a ring of `T`.
    fn at<T>(&self, i: u32) -> *mut T {
        // SAFETY: `i & mask < size` entries of `T` lie at `ring`.
        unsafe { (self.ring as *mut T).add((i & self.mask) as usize) }
    }
}

/// `struct xsk_umem_config`.
#[repr(C)]
struct UmemConfig {
    fill_size: u32,
    comp_size: u32,
    frame_size: u32,
    frame_headroom: u32,
    flags: u32,
}

/// `struct xsk_socket_config`.
#[repr(C)]
struct SocketConfig {
    rx_size: u32,
    tx_size: u32,
    libxdp_flags: u32,
    xdp_flags: u32,
    bind_flags: u16,
}

/// `struct xdp_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
struct XdpDesc {
    addr: u64,
    len: u32,
    options: u32,
}

type UmemCreate = unsafe extern "C" fn(
    *mut *mut libc::c_void,
    *mut libc::c_void,
    u64,
    *mut XskRing,
    *mut XskRing,
    *const UmemConfig,
) -> libc::c_int;
type SocketCreate = unsafe extern "C" fn(
    *mut *mut libc::c_void,
    *const libc::c_char,
    u32,
    *mut libc::c_void,
    *mut XskRing,
    *mut XskRing,
    *const SocketConfig,
) -> libc::c_int;
type SocketFd = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
type Delete = unsafe extern "C" fn(*mut libc::c_void);
type UmemDelete = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
/// `libxdp_print_fn_t` / `libbpf_print_fn_t`: level, format, `va_list`.
type PrintFn =
    unsafe extern "C" fn(libc::c_int, *const libc::c_char, *mut libc::c_void) -> libc::c_int;
type SetPrint = unsafe extern "C" fn(Option<PrintFn>) -> Option<PrintFn>;

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// On x86-64 a `va_list` argument is a pointer to its state.
    fn vsnprintf(
        s: *mut libc::c_char,
        n: usize,
        format: *const libc::c_char,
        ap: *mut libc::c_void,
    ) -> libc::c_int;
}

/// Formats a message of libxdp or libbpf (which print to stderr unless
/// told otherwise) and logs it: their warnings at `warn` (libxdp) or
/// `debug` (libbpf, whose warnings about BTF sections of libxdp's own
/// objects are noise), the rest at `debug`.
fn log_message(
    from: &str,
    level: libc::c_int,
    format: *const libc::c_char,
    args: *mut libc::c_void,
) {
    let mut buf = [0u8; 512];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the library passes a NUL-terminated format and the matching
    // `va_list`, used once; `vsnprintf` writes at most `buf.len()` bytes,
    // NUL included.
    let text = unsafe {
        vsnprintf(buf.as_mut_ptr().cast(), buf.len(), format, args);
        std::ffi::CStr::from_ptr(buf.as_ptr().cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the library passes a NUL-terminated format string.
    let text = {
        let _ = (&mut buf, args);
        unsafe { std::ffi::CStr::from_ptr(format) }
    };
    let text = text.to_string_lossy();
    let text = text.trim_end();
    // Their messages start with the library's name.
    match (from, level) {
        ("libxdp", 0) => warn!("{text}"),
        _ => tracing::debug!("{text}"),
    }
}

unsafe extern "C" fn xdp_print(
    level: libc::c_int,
    format: *const libc::c_char,
    args: *mut libc::c_void,
) -> libc::c_int {
    log_message("libxdp", level, format, args);
    0
}

unsafe extern "C" fn bpf_print(
    level: libc::c_int,
    format: *const libc::c_char,
    args: *mut libc::c_void,
) -> libc::c_int {
    log_message("libbpf", level, format, args);
    0
}

/// The libxdp functions used, from the library opened at run time.
struct Lib {
    umem_create: UmemCreate,
    socket_create: SocketCreate,
    socket_fd: SocketFd,
    socket_delete: Delete,
    umem_delete: UmemDelete,
    _lib: libloading::Library,
    _bpf: Option<libloading::Library>,
}

fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let err = |e: libloading::Error| format!("af-xdp needs libxdp (Debian: libxdp1): {e}");
        // SAFETY: libxdp's initialisers have no preconditions; the symbols
        // are looked up with the C signatures of <xdp/xsk.h> and
        // <xdp/libxdp.h> (libxdp 1.x); the print callbacks are functions
        // that live as long as the program.
        unsafe {
            let l = libloading::Library::new("libxdp.so.1").map_err(err)?;
            // Their messages go to our log, not to stderr.
            let set = l.get::<SetPrint>(b"libxdp_set_print\0").map_err(err)?;
            set(Some(xdp_print));
            let bpf = libloading::Library::new("libbpf.so.1").ok();
            if let Some(set) = bpf
                .as_ref()
                .and_then(|b| b.get::<SetPrint>(b"libbpf_set_print\0").ok())
            {
                set(Some(bpf_print));
            }
            Ok(Lib {
                umem_create: *l.get::<UmemCreate>(b"xsk_umem__create\0").map_err(err)?,
                socket_create: *l
                    .get::<SocketCreate>(b"xsk_socket__create\0")
                    .map_err(err)?,
                socket_fd: *l.get::<SocketFd>(b"xsk_socket__fd\0").map_err(err)?,
                socket_delete: *l.get::<Delete>(b"xsk_socket__delete\0").map_err(err)?,
                umem_delete: *l.get::<UmemDelete>(b"xsk_umem__delete\0").map_err(err)?,
                _lib: l,
                _bpf: bpf,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// One AF_XDP socket with its UMEM and rings; freed when the last queue
/// holding it is dropped.
struct Xsk {
    lib: &'static Lib,
    /// Fill, completion, rx and tx rings as libxdp made them (it keeps
    /// pointers to them).
    _rings: Box<[XskRing; 4]>,
    umem: *mut libc::c_void,
    sock: *mut libc::c_void,
    area: *mut u8,
    fd: RawFd,
}

// SAFETY: the handles are only used to free the socket and UMEM, once, in
// `drop`; the rings are split between one receive and one transmit queue.
unsafe impl Send for Xsk {}
// SAFETY: as above; shared references read `area` and `fd` only.
unsafe impl Sync for Xsk {}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: the handles came from libxdp's create calls and are freed
        // once, socket before UMEM as libxdp requires; the area is the
        // mapping made for the UMEM, unmapped after it.
        unsafe {
            (self.lib.socket_delete)(self.sock);
            (self.lib.umem_delete)(self.umem);
            libc::munmap(self.area.cast(), (FRAME * FRAMES) as usize);
        }
    }
}

/// A socket, and copies of its fill, completion, rx and tx rings for the
/// queues.
type Socket = (Arc<Xsk>, [XskRing; 4]);

/// What mode a socket ended up in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    NativeZeroCopy,
    NativeCopy,
    Generic,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NativeZeroCopy => "native XDP, zero-copy",
            Mode::NativeCopy => "native XDP, copy",
            Mode::Generic => "generic (skb) XDP, copy",
        }
    }
}

/// The modes to try, in order, for what the spec asks.
fn modes(asked: XdpMode) -> &'static [Mode] {
    match asked {
        XdpMode::BestEffort => &[Mode::NativeZeroCopy, Mode::NativeCopy, Mode::Generic],
        XdpMode::NativeWithZerocopy => &[Mode::NativeZeroCopy],
        XdpMode::Native => &[Mode::NativeCopy],
        XdpMode::Generic => &[Mode::Generic],
    }
}

/// Opens queue `queue` of `ifname` in `mode`.
fn open_queue(ifname: &CString, queue: u32, mode: Mode) -> io::Result<Socket> {
    let lib = lib().map_err(io::Error::other)?;
    let mut tries = 0;
    loop {
        // A closed socket (a failed attempt's, or a deleted port's just
        // before) gives its queue back a moment later: the kernel releases
        // its buffer pool in a work item, and the queue is busy until
        // then. Wait for it, a little (on the control thread: at most
        // BUSY_TRIES times 10 ms, and only when the queue is busy).
        match open_in(lib, ifname, queue, mode) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < BUSY_TRIES => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// The error that says most of those met: a missing permission, else the
/// last mode's (the most widely supported one).
fn most_telling(mut errors: Vec<io::Error>) -> io::Error {
    let denied = errors
        .iter()
        .position(|e| matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)));
    match denied {
        Some(i) => errors.swap_remove(i),
        None => errors
            .pop()
            .unwrap_or_else(|| io::Error::other("no XDP mode to try")),
    }
}

/// One attempt at a socket in `mode`, on a UMEM of its own (a socket that
/// was bound cannot be unbound: a failed attempt's UMEM is not reused).
fn open_in(lib: &'static Lib, ifname: &CString, queue: u32, mode: Mode) -> io::Result<Socket> {
    let len = (FRAME * FRAMES) as usize;
    // SAFETY: a fresh private anonymous mapping; the result is checked.
    let area = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if area == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut rings = Box::new([XskRing::empty(); 4]);
    let [fill, comp, rx, tx] = &mut *rings;
    let ucfg = UmemConfig {
        fill_size: RING,
        comp_size: RING,
        frame_size: FRAME as u32,
        frame_headroom: 0,
        flags: 0,
    };
    let mut umem = std::ptr::null_mut();
    // SAFETY: the area is `len` bytes, page-aligned, ours until the UMEM is
    // deleted; the config outlives the call and the rings (boxed) outlive
    // the UMEM, which keeps pointers to them.
    let r = unsafe { (lib.umem_create)(&mut umem, area, len as u64, fill, comp, &ucfg) };
    if r != 0 {
        // SAFETY: the mapping made above, not handed to anyone.
        unsafe { libc::munmap(area, len) };
        return Err(io::Error::from_raw_os_error(-r));
    }
    let (xdp_flags, bind) = match mode {
        Mode::NativeZeroCopy => (XDP_FLAGS_DRV_MODE, XDP_ZEROCOPY),
        Mode::NativeCopy => (XDP_FLAGS_DRV_MODE, XDP_COPY),
        Mode::Generic => (XDP_FLAGS_SKB_MODE, XDP_COPY),
    };
    let scfg = SocketConfig {
        rx_size: RING,
        tx_size: RING,
        // Our program, not libxdp's: it restores VLAN tags (prog.rs).
        libxdp_flags: XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD,
        xdp_flags,
        bind_flags: bind | XDP_USE_NEED_WAKEUP,
    };
    let mut sock = std::ptr::null_mut();
    // SAFETY: a NUL-terminated name, the UMEM made above, a config that
    // outlives the call and boxed rings that outlive the socket.
    let r = unsafe { (lib.socket_create)(&mut sock, ifname.as_ptr(), queue, umem, rx, tx, &scfg) };
    if r != 0 {
        // SAFETY: the UMEM made above (no socket uses it) and its area.
        unsafe {
            (lib.umem_delete)(umem);
            libc::munmap(area, len);
        }
        return Err(io::Error::from_raw_os_error(-r));
    }
    // SAFETY: a socket libxdp just made.
    let fd = unsafe { (lib.socket_fd)(sock) };
    let copies = *rings;
    let x = Arc::new(Xsk {
        lib,
        _rings: rings,
        umem,
        sock,
        area: area.cast(),
        fd,
    });
    Ok((x, copies))
}

/// Attaches our program to interface `ifname` (index `index`) with room
/// for `n` sockets, in native XDP or generic.
fn attach_program(ifname: &CString, index: u32, n: u32, native: bool) -> io::Result<XdpProgram> {
    XdpProgram::attach(index, n, native).map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            io::Error::new(
                e.kind(),
                format!(
                    "{e}: another XDP program is attached to the interface (`ip link show {0}`; `ip link set dev {0} xdp off` takes it away)",
                    ifname.to_string_lossy()
                ),
            )
        } else {
            e
        }
    })
}

/// Opens a socket in `mode` for each of the `n` queues of `ifname` and puts
/// it in `prog`'s map.
fn open_sockets(
    ifname: &CString,
    n: u32,
    mode: Mode,
    prog: &XdpProgram,
) -> io::Result<Vec<Socket>> {
    (0..n)
        .map(|queue| {
            let (xsk, rings) = open_queue(ifname, queue, mode)?;
            prog.set_socket(queue, xsk.fd)?;
            Ok((xsk, rings))
        })
        .collect()
}

/// The receive side of one socket: its fill and rx rings.
struct XdpRx {
    xsk: Arc<Xsk>,
    fill: XskRing,
    rx: XskRing,
    /// Frames of the burst being read, given back to the fill ring at
    /// release.
    taken: Vec<u64>,
    /// The rx ring's consumer index as last given to the kernel.
    released: u32,
    /// The interface may hand over frames with their checksum left to
    /// finish (a veth whose peer offloads it): each TCP or UDP frame is
    /// looked at ([`Offload::partial_in`]).
    partial_checksums: bool,
}

impl XdpRx {
    /// Gives frames to the kernel's fill ring.
    fn refill(&mut self, frames: impl Iterator<Item = u64>) {
        let mut prod = self.fill.cached_prod;
        for addr in frames {
            // SAFETY: the fill ring has room (it holds RING entries and at
            // most FRAMES / 2 <= RING frames are ever ours to give).
            unsafe { *self.fill.at::<u64>(prod) = addr };
            prod = prod.wrapping_add(1);
        }
        self.fill.cached_prod = prod;
        self.fill.producer().store(prod, Ordering::Release);
        if self.fill.needs_wakeup() {
            // SAFETY: no buffer: a wake-up of the kernel's receive side.
            unsafe {
                libc::recvfrom(
                    self.xsk.fd,
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }
}

impl RxQueue for XdpRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let cons = self.rx.cached_cons;
        let avail = self
            .rx
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(cons);
        let n = avail.min(BURST_SIZE as u32);
        for k in 0..n {
            // SAFETY: entries `cons..cons+avail` are the kernel's, published.
            let d: XdpDesc = unsafe { *self.rx.at::<XdpDesc>(cons.wrapping_add(k)) };
            // Only frames of the receive half go back to the fill ring.
            let base = d.addr & !(FRAME - 1);
            if base < FRAME * FRAMES / 2 {
                self.taken.push(base);
            }
            // The kernel wrote these; check them all the same, in u64.
            if d.addr
                .checked_add(u64::from(d.len))
                .is_none_or(|e| e > FRAME * FRAMES)
                || (d.addr % FRAME) + u64::from(d.len) > FRAME
                || (d.len as usize) < ETH_HEADER_LEN
            {
                continue;
            }
            let slot = burst.next_slot();
            // SAFETY: `addr + len` lies in one frame of the UMEM area, ours
            // until the frame goes back to the fill ring at release.
            unsafe { slot.push(self.xsk.area.add(d.addr as usize), d.len) };
            if self.partial_checksums {
                let mut head = [0u8; MAX_HDR];
                let n = slot.read_prefix(&mut head);
                if let Some(o) = Offload::partial_in(&head[..n]) {
                    slot.offload = o;
                }
            }
            burst.commit();
        }
        self.rx.cached_cons = cons.wrapping_add(n);
        Ok(burst.len())
    }

    fn release(&mut self) {
        if self.rx.cached_cons != self.released {
            self.released = self.rx.cached_cons;
            self.rx.consumer().store(self.released, Ordering::Release);
        }
        if self.taken.is_empty() {
            return;
        }
        let frames = std::mem::take(&mut self.taken);
        self.refill(frames.iter().copied());
        self.taken = frames;
        self.taken.clear();
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the socket's fd is open while `xsk` (held by this queue)
        // is alive.
        Some(unsafe { BorrowedFd::borrow_raw(self.xsk.fd) })
    }

    fn interrupt_is_eventfd(&self) -> bool {
        false
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        self.rx.producer().load(Ordering::Acquire) != self.rx.cached_cons
    }
}

/// The transmit side of one socket: its tx and completion rings, and the
/// pool of frames not in flight.
struct XdpTx {
    xsk: Arc<Xsk>,
    tx: XskRing,
    comp: XskRing,
    pool: Vec<u64>,
    queued: bool,
    mtu: Arc<AtomicU32>,
}

impl XdpTx {
    /// Takes back the frames the kernel has sent.
    fn reclaim(&mut self) {
        let cons = self.comp.cached_cons;
        let done = self
            .comp
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(cons);
        for k in 0..done {
            // SAFETY: published completion entries.
            let addr = unsafe { *self.comp.at::<u64>(cons.wrapping_add(k)) };
            // Only frames of our half go back (a bad address is dropped).
            if addr % FRAME == 0 && (FRAME * FRAMES / 2..FRAME * FRAMES).contains(&addr) {
                self.pool.push(addr);
            }
        }
        self.comp.cached_cons = cons.wrapping_add(done);
        self.comp
            .consumer()
            .store(self.comp.cached_cons, Ordering::Release);
    }
}

impl TxQueue for XdpTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let len = frame.len();
        if exceeds_mtu(frame, self.mtu.load(Ordering::Relaxed)) || len as u64 > FRAME {
            return Err(TxError::TooLong);
        }
        if self.pool.is_empty() {
            self.reclaim();
        }
        let free = RING
            - self
                .tx
                .cached_prod
                .wrapping_sub(self.tx.consumer().load(Ordering::Acquire));
        let Some(addr) = self.pool.pop().filter(|_| free > 0) else {
            return Err(TxError::Full);
        };
        // SAFETY: `addr` is a pool frame of the UMEM area (ours until the
        // kernel completes it) and `len <= FRAME`; the padding stays in it
        // (FRAME holds far more than 60 bytes).
        let n = unsafe {
            let at = self.xsk.area.add(addr as usize);
            pad_short(at, frame.reader().copy_to(at, len))
        };
        // SAFETY: there is room in the tx ring (checked above).
        unsafe {
            *self.tx.at::<XdpDesc>(self.tx.cached_prod) = XdpDesc {
                addr,
                len: n as u32,
                options: 0,
            }
        };
        self.tx.cached_prod = self.tx.cached_prod.wrapping_add(1);
        self.queued = true;
        Ok(())
    }

    fn flush(&mut self) {
        if !std::mem::take(&mut self.queued) {
            return;
        }
        self.tx
            .producer()
            .store(self.tx.cached_prod, Ordering::Release);
        // Copy mode needs a kick for every batch; zero-copy only when the
        // driver asks.
        // SAFETY: no buffer: the kernel sends what the tx ring holds.
        unsafe {
            libc::sendto(
                self.xsk.fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        self.reclaim();
    }
}

/// An af-xdp port: its sockets on a followed kernel interface.
/// `carries_tags`: whether its frames carry VLAN tags (it is a trunk of
/// some VLAN), which it then refuses to lose.
pub fn port(name: &str, spec: &AfXdpSpec, carries_tags: bool) -> Box<dyn Port> {
    let uplink = AfXdp {
        name: name.to_string(),
        spec: spec.clone(),
        rx_vlan_restore: false,
        prog: None,
        carries_tags,
    };
    Box::new(KernelIf::new(name, &spec.interface, uplink))
}

/// How an af-xdp port opens its queues, and what it changes on the
/// interface meanwhile.
struct AfXdp {
    name: String,
    spec: AfXdpSpec,
    /// Whether this port turned the interface's receive VLAN offload off
    /// (and puts it back when it lets the interface go).
    rx_vlan_restore: bool,
    /// The XDP program that sends the interface's frames to the sockets.
    prog: Option<XdpProgram>,
    /// Whether the port carries VLAN tags (a trunk of some VLAN).
    carries_tags: bool,
}

impl AfXdp {
    /// Receive VLAN stripping off while the port owns the interface: an
    /// XDP program sees only the frame's data, so a tag the NIC strips into
    /// its descriptor never reaches the switch (ixgbe, i40e, ice, mlx5 strip
    /// by default). With stripping off the tag stays in the data; the
    /// host's own VLAN interfaces untag in software. Put back when the port
    /// lets the interface go.
    fn own_rx_vlan(&mut self) {
        let ifname = &self.spec.interface;
        // Off already, or no such feature: tags stay in the data.
        if !rx_vlan_offload(ifname).unwrap_or(false) {
            return;
        }
        match set_rx_vlan_offload(ifname, false) {
            Ok(()) => {
                self.rx_vlan_restore = true;
                info!(port = %self.name, interface = %ifname, "receive VLAN offload off while the port owns the interface");
            }
            Err(e) => warn!(
                port = %self.name, interface = %ifname,
                "cannot turn receive VLAN offload off ({e}): VLAN tags the interface strips do not reach the switch; run `ethtool -K {ifname} rxvlan off` or use kind af-packet"
            ),
        }
    }

    fn release_rx_vlan(&mut self) {
        if std::mem::take(&mut self.rx_vlan_restore) {
            // The interface may be gone; nothing to put back then.
            let _ = set_rx_vlan_offload(&self.spec.interface, true);
        }
    }
}

impl Uplink for AfXdp {
    const KIND: &'static str = "af-xdp";
    const REOPEN_ON_MTU: bool = false;

    /// The program, then a socket per queue in the first mode that works.
    fn open(
        &mut self,
        ifname: &str,
        index: u32,
        mtu: &Arc<AtomicU32>,
    ) -> io::Result<(PortQueues, String)> {
        // Each time: an interface made again strips by default.
        self.own_rx_vlan();
        let n = u32::from(self.spec.queues.unwrap_or(1));
        let c = CString::new(ifname).map_err(io::Error::other)?;
        let mut errors = Vec::new();
        // The program stays attached from one mode to the next while the
        // XDP mode (native or generic) is the same: only the sockets differ.
        let mut prog: Option<(bool, XdpProgram)> = None;
        let mut opened = None;
        for &mode in modes(self.spec.mode.unwrap_or_default()) {
            let native = mode != Mode::Generic;
            if prog
                .as_ref()
                .is_none_or(|(was_native, _)| *was_native != native)
            {
                // One program on the interface at a time: the old one goes
                // before the new one is attached.
                prog = None;
                match attach_program(&c, index, n, native) {
                    Ok(p) => prog = Some((native, p)),
                    Err(e) => {
                        tracing::debug!(interface = %ifname, mode = mode.name(), "no XDP program: {e}");
                        errors.push(e);
                        continue;
                    }
                }
            }
            let (_, p) = prog.as_ref().expect("attached above");
            match open_sockets(&c, n, mode, p) {
                Ok(s) => {
                    opened = Some((s, mode));
                    break;
                }
                Err(e) => {
                    tracing::debug!(interface = %ifname, mode = mode.name(), "no AF_XDP sockets: {e}");
                    errors.push(e);
                }
            }
        }
        let (Some((sockets, mode)), Some((_, prog))) = (opened, prog) else {
            return Err(most_telling(errors));
        };
        // Tags reach the switch if they stay in the data (no receive
        // stripping) or the program puts back what the driver holds.
        let restored = prog.restores_vlan_tags && prog::driver_gives_vlan_tags(index);
        if self.carries_tags && !restored && rx_vlan_offload(ifname).unwrap_or(false) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the interface strips received VLAN tags (rx-vlan-offload stays on) and gives XDP no tag in {}: this trunk's VLANs would arrive untagged; run `ethtool -K {ifname} rxvlan off` or use kind af-packet",
                    mode.name()
                ),
            ));
        }
        // Interfaces that carry the host's own frames can hand them over
        // with the checksum left to the device (`CHECKSUM_PARTIAL`), which
        // XDP does not say: a veth (its peer's transmit checksum offload),
        // a tun/tap, a netkit. A NIC's received frames are complete.
        let partial_checksums = matches!(
            netdev::driver(ifname).as_deref(),
            Ok("veth" | "tun" | "netkit") | Err(_)
        );
        let mut q = PortQueues::default();
        for (xsk, [fill, comp, rx, tx]) in sockets {
            let mut r = XdpRx {
                xsk: xsk.clone(),
                fill,
                rx,
                taken: Vec::with_capacity(BURST_SIZE),
                released: rx.cached_cons,
                partial_checksums,
            };
            r.refill((0..FRAMES / 2).map(|i| i * FRAME));
            q.rx.push(Box::new(r));
            q.tx.push(Box::new(XdpTx {
                xsk,
                tx,
                comp,
                pool: (FRAMES / 2..FRAMES).map(|i| i * FRAME).collect(),
                queued: false,
                mtu: mtu.clone(),
            }));
        }
        let tags = if restored {
            "VLAN tags the driver holds put back"
        } else {
            "VLAN tags as in the data"
        };
        self.prog = Some(prog);
        Ok((
            q,
            format!(
                "kernel interface {ifname} (af-xdp, {}, {tags})",
                mode.name()
            ),
        ))
    }

    fn closed(&mut self) {
        self.prog = None;
    }

    fn release(&mut self) {
        self.release_rx_vlan();
    }

    fn hint(e: &io::Error) -> &'static str {
        match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => {
                " (AF_XDP needs CAP_NET_RAW, CAP_NET_ADMIN and CAP_BPF)"
            }
            Some(libc::EAFNOSUPPORT) => {
                " (the kernel has no AF_XDP: CONFIG_XDP_SOCKETS; use kind af-packet)"
            }
            _ => "",
        }
    }
}
