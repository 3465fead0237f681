//! libxdp, loaded at run time: its types and calls, and the XSK sockets
//! and UMEMs made through it, in the first mode the interface takes.

use super::*;

// <linux/if_xdp.h>, <linux/if_link.h>
pub(super) const XDP_COPY: u16 = 1 << 1;
pub(super) const XDP_ZEROCOPY: u16 = 1 << 2;
pub(super) const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
pub(super) const XDP_USE_SG: u16 = 1 << 4;
/// `xdp_desc.options`: more descriptors of the frame follow.
pub(super) const XDP_PKT_CONTD: u32 = 1;
pub(super) const XDP_RING_NEED_WAKEUP: u32 = 1;
pub(super) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(super) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
// <xdp/xsk.h>
pub(super) const XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD: u32 = 1;

/// `struct xsk_umem_config`.
#[repr(C)]
pub(super) struct UmemConfig {
    pub(super) fill_size: u32,
    pub(super) comp_size: u32,
    pub(super) frame_size: u32,
    pub(super) frame_headroom: u32,
    pub(super) flags: u32,
}

/// `struct xsk_socket_config`.
#[repr(C)]
pub(super) struct SocketConfig {
    pub(super) rx_size: u32,
    pub(super) tx_size: u32,
    pub(super) libxdp_flags: u32,
    pub(super) xdp_flags: u32,
    pub(super) bind_flags: u16,
}

pub(super) type UmemCreate = unsafe extern "C" fn(
    *mut *mut libc::c_void,
    *mut libc::c_void,
    u64,
    *mut XskRing,
    *mut XskRing,
    *const UmemConfig,
) -> libc::c_int;
pub(super) type SocketCreate = unsafe extern "C" fn(
    *mut *mut libc::c_void,
    *const libc::c_char,
    u32,
    *mut libc::c_void,
    *mut XskRing,
    *mut XskRing,
    *const SocketConfig,
) -> libc::c_int;
pub(super) type SocketFd = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
pub(super) type Delete = unsafe extern "C" fn(*mut libc::c_void);
pub(super) type UmemDelete = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
/// `libxdp_print_fn_t` / `libbpf_print_fn_t`: level, format, `va_list`.
pub(super) type PrintFn =
    unsafe extern "C" fn(libc::c_int, *const libc::c_char, *mut libc::c_void) -> libc::c_int;
pub(super) type SetPrint = unsafe extern "C" fn(Option<PrintFn>) -> Option<PrintFn>;

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// On x86-64 a `va_list` argument is a pointer to its state.
    pub(super) fn vsnprintf(
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
pub(super) fn log_message(
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

pub(super) unsafe extern "C" fn xdp_print(
    level: libc::c_int,
    format: *const libc::c_char,
    args: *mut libc::c_void,
) -> libc::c_int {
    log_message("libxdp", level, format, args);
    0
}

pub(super) unsafe extern "C" fn bpf_print(
    level: libc::c_int,
    format: *const libc::c_char,
    args: *mut libc::c_void,
) -> libc::c_int {
    log_message("libbpf", level, format, args);
    0
}

/// The libxdp functions used, from the library opened at run time.
pub(super) struct Lib {
    pub(super) umem_create: UmemCreate,
    pub(super) socket_create: SocketCreate,
    pub(super) socket_fd: SocketFd,
    pub(super) socket_delete: Delete,
    pub(super) umem_delete: UmemDelete,
    pub(super) _lib: libloading::Library,
    pub(super) _bpf: Option<libloading::Library>,
}

pub(super) fn lib() -> Result<&'static Lib, String> {
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
pub(super) struct Xsk {
    /// Who made the socket, and so how it is freed.
    owner: Owner,
    /// The UMEM's memory, `FRAME * FRAMES` bytes of a memfd mapped shared:
    /// a takeover hands the file over and the next switch maps the same
    /// pages, which the kernel keeps pinned for the socket.
    umem_map: MmapRaw,
    memfd: OwnedFd,
    pub(super) fd: RawFd,
}

/// Who made an [`Xsk`].
enum Owner {
    /// libxdp, which frees the socket and UMEM (and unmaps their rings).
    Libxdp {
        lib: &'static Lib,
        /// Fill, completion, rx and tx rings as libxdp made them (it keeps
        /// pointers to them).
        _rings: Box<[XskRing; 4]>,
        umem: *mut libc::c_void,
        sock: *mut libc::c_void,
    },
    /// Another process, which handed the socket over ([`adopt`]): its fd
    /// and our mappings of its rings, closed and unmapped when dropped.
    Adopted { _fd: OwnedFd, _rings: [MmapRaw; 4] },
}

// SAFETY: the handles are only used to free the socket and UMEM, once, in
// `drop`; the rings are split between one receive and one transmit queue.
unsafe impl Send for Xsk {}
// SAFETY: as above; shared references read the UMEM's address and the fds
// only.
unsafe impl Sync for Xsk {}

impl Drop for Xsk {
    fn drop(&mut self) {
        if let Owner::Libxdp {
            lib, umem, sock, ..
        } = &self.owner
        {
            // SAFETY: the handles came from libxdp's create calls and are
            // freed once, socket before UMEM as libxdp requires; the UMEM's
            // memory is unmapped after them (a field, dropped after this).
            unsafe {
                (lib.socket_delete)(*sock);
                (lib.umem_delete)(*umem);
            }
        }
    }
}

impl Xsk {
    /// First byte of the UMEM.
    #[inline]
    pub(super) fn area(&self) -> *mut u8 {
        self.umem_map.as_mut_ptr()
    }

    /// The socket's fd, to hand over.
    pub(super) fn socket(&self) -> BorrowedFd<'_> {
        // SAFETY: the socket is open while `self` is alive.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }

    /// The UMEM's memory file, to hand over.
    pub(super) fn umem_file(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }
}

/// Makes the memory of a UMEM: a sealed memfd of `FRAME * FRAMES` bytes,
/// mapped shared.
fn umem_memory() -> io::Result<(OwnedFd, MmapRaw)> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    let fd = memfd_create(
        c"switchyard-umem",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )?;
    nix::unistd::ftruncate(&fd, (FRAME * FRAMES) as i64)?;
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL),
    )?;
    let map = MmapOptions::new()
        .len((FRAME * FRAMES) as usize)
        .map_raw(fd.as_raw_fd())?;
    Ok((fd, map))
}

/// A socket, and copies of its fill, completion, rx and tx rings for the
/// queues.
pub(super) type Socket = (Arc<Xsk>, [XskRing; 4]);

/// What mode a socket ended up in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Mode {
    NativeZeroCopy,
    NativeCopy,
    Generic,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::NativeZeroCopy => "native XDP, zero-copy",
            Mode::NativeCopy => "native XDP, copy",
            Mode::Generic => "generic (skb) XDP, copy",
        }
    }
}

/// The modes to try, in order, for what the spec asks; `generic_first`:
/// best effort starts with generic XDP (see `AfXdp::open`).
pub(super) fn modes(asked: XdpMode, generic_first: bool) -> &'static [Mode] {
    match asked {
        XdpMode::BestEffort if generic_first => {
            &[Mode::Generic, Mode::NativeZeroCopy, Mode::NativeCopy]
        }
        XdpMode::BestEffort => &[Mode::NativeZeroCopy, Mode::NativeCopy, Mode::Generic],
        XdpMode::NativeWithZerocopy => &[Mode::NativeZeroCopy],
        XdpMode::Native => &[Mode::NativeCopy],
        XdpMode::Generic => &[Mode::Generic],
    }
}

/// Opens queue `queue` of `ifname` in `mode`.
pub(super) fn open_queue(ifname: &CString, queue: u32, mode: Mode) -> io::Result<Socket> {
    let lib = lib().map_err(io::Error::other)?;
    let mut tries = 0;
    loop {
        // A closed socket (a failed attempt's, or a deleted port's just
        // before) gives its queue back a moment later: the kernel releases
        // its buffer pool in a work item, and the queue is busy until
        // then. Wait for it, a little (on the control thread: at most
        // BUSY_TRIES times 10 ms, and only when the queue is busy).
        // Frames of several buffers where the kernel and the driver take
        // them (6.6; in zero-copy, drivers that say so), else one buffer.
        let opened = match open_in(lib, ifname, queue, mode, true) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                open_in(lib, ifname, queue, mode, false)
            }
            r => r,
        };
        match opened {
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
pub(super) fn most_telling(mut errors: Vec<io::Error>) -> io::Error {
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
/// was bound cannot be unbound: a failed attempt's UMEM is not reused);
/// `sg`: frames may come in several descriptors (`XDP_USE_SG`).
pub(super) fn open_in(
    lib: &'static Lib,
    ifname: &CString,
    queue: u32,
    mode: Mode,
    sg: bool,
) -> io::Result<Socket> {
    let len = (FRAME * FRAMES) as usize;
    let (memfd, umem_map) = umem_memory()?;
    let area = umem_map.as_mut_ptr().cast::<libc::c_void>();
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
    // SAFETY: the area is `len` bytes, page-aligned, mapped until the
    // UMEM is deleted (`Xsk` unmaps it after); the config outlives the call
    // and the rings (boxed) outlive the UMEM, which keeps pointers to them.
    let r = unsafe { (lib.umem_create)(&mut umem, area, len as u64, fill, comp, &ucfg) };
    if r != 0 {
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
        bind_flags: bind | XDP_USE_NEED_WAKEUP | if sg { XDP_USE_SG } else { 0 },
    };
    let mut sock = std::ptr::null_mut();
    // SAFETY: a NUL-terminated name, the UMEM made above, a config that
    // outlives the call and boxed rings that outlive the socket.
    let r = unsafe { (lib.socket_create)(&mut sock, ifname.as_ptr(), queue, umem, rx, tx, &scfg) };
    if r != 0 {
        // SAFETY: the UMEM made above (no socket uses it); its memory is
        // unmapped after it, when `umem_map` is dropped.
        unsafe { (lib.umem_delete)(umem) };
        return Err(io::Error::from_raw_os_error(-r));
    }
    // SAFETY: a socket libxdp just made.
    let fd = unsafe { (lib.socket_fd)(sock) };
    let copies = *rings;
    let x = Arc::new(Xsk {
        owner: Owner::Libxdp {
            lib,
            _rings: rings,
            umem,
            sock,
        },
        umem_map,
        memfd,
        fd,
    });
    Ok((x, copies))
}

/// Takes up a socket another switch opened with [`open_in`] and handed
/// over: its fd `fd` and its UMEM's memory `memfd`. Maps the UMEM and the
/// four rings (`RING` entries each, as [`open_in`] makes them) and returns
/// copies of the rings with their cached indices at zero: the caller sets
/// them where the other switch left them.
pub(super) fn adopt(fd: OwnedFd, memfd: OwnedFd) -> io::Result<Socket> {
    let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_string());
    let len = FRAME * FRAMES;
    // A file that cannot shrink under the mapping (no SIGBUS), of the size.
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    let st = nix::sys::stat::fstat(memfd.as_raw_fd())?;
    let sealed = fcntl(memfd.as_raw_fd(), FcntlArg::F_GET_SEALS)
        .is_ok_and(|s| SealFlag::from_bits_truncate(s).contains(SealFlag::F_SEAL_SHRINK));
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < len || !sealed {
        return Err(invalid(
            "the UMEM handed over is not a sealed file of its size",
        ));
    }
    let umem_map = MmapOptions::new()
        .len(len as usize)
        .map_raw(memfd.as_raw_fd())?;
    let mut off: libc::xdp_mmap_offsets = zeroed_offsets();
    let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: `off` is a buffer of `optlen` bytes the kernel fills in.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut optlen,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if optlen as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
        return Err(invalid("the kernel's XDP ring offsets have no flags"));
    }
    // Each ring: its page offset, its layout, the size of an entry.
    let desc = std::mem::size_of::<XdpDesc>() as u64;
    let layout = [
        (libc::XDP_UMEM_PGOFF_FILL_RING, off.fr, 8),
        (libc::XDP_UMEM_PGOFF_COMPLETION_RING, off.cr, 8),
        (libc::XDP_PGOFF_RX_RING as u64, off.rx, desc),
        (libc::XDP_PGOFF_TX_RING as u64, off.tx, desc),
    ];
    let mut maps = Vec::with_capacity(4);
    let mut copies = [XskRing::empty(); 4];
    for ((pgoff, o, entry), ring) in layout.into_iter().zip(&mut copies) {
        let size = o.desc + u64::from(RING) * entry;
        if [o.producer, o.consumer, o.flags]
            .iter()
            .any(|&at| at.saturating_add(4) > o.desc)
        {
            return Err(invalid("the kernel's XDP ring offsets overlap"));
        }
        // The kernel refuses a mapping larger than the ring it made.
        let map = MmapOptions::new()
            .offset(pgoff)
            .len(size as usize)
            .populate()
            .map_raw(fd.as_raw_fd())?;
        let base = map.as_mut_ptr();
        // SAFETY: the offsets lie inside the mapping (checked above:
        // `desc` is below `size`, the others 4 bytes below `desc`).
        *ring = unsafe {
            XskRing {
                cached_prod: 0,
                cached_cons: 0,
                mask: RING - 1,
                size: RING,
                producer: base.add(o.producer as usize).cast(),
                consumer: base.add(o.consumer as usize).cast(),
                ring: base.add(o.desc as usize).cast(),
                flags: base.add(o.flags as usize).cast(),
            }
        };
        maps.push(map);
    }
    let Ok(rings) = <[MmapRaw; 4]>::try_from(maps) else {
        unreachable!("four rings mapped")
    };
    let x = Arc::new(Xsk {
        fd: fd.as_raw_fd(),
        owner: Owner::Adopted {
            _fd: fd,
            _rings: rings,
        },
        umem_map,
        memfd,
    });
    Ok((x, copies))
}

/// `struct xdp_mmap_offsets`, all zero.
fn zeroed_offsets() -> libc::xdp_mmap_offsets {
    // SAFETY: a struct of integers, for which zero is a value.
    unsafe { std::mem::zeroed() }
}

/// Attaches our program to interface `ifname` (index `index`) with room
/// for `n` sockets, in native XDP or generic.
pub(super) fn attach_program(
    ifname: &CString,
    index: u32,
    n: u32,
    native: bool,
) -> io::Result<XdpProgram> {
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
pub(super) fn open_sockets(
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
