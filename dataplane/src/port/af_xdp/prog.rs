//! The XDP program of an af-xdp port: ours, not libxdp's, because a VLAN tag
//! the kernel holds outside the frame's data must be put back into it.
//!
//! A NIC that strips receive VLAN tags (ixgbe, i40e, ice, mlx5 by default)
//! or a kernel path that moved the tag into the skb (a veth fed by a Linux
//! bridge) gives an XDP program only the untagged data, and libxdp's
//! default program redirects it as it is: the tag is lost. This program
//! asks the driver for the tag (`bpf_xdp_metadata_rx_vlan_tag`, Linux 6.8,
//! implemented by veth, mlx5 and ice), and where there is one, grows the
//! frame by 4 bytes at its head and writes the tag back between the MAC
//! addresses and the ethertype. Then it redirects the frame to the socket of
//! its receive queue, as libxdp's does; a queue without a socket passes its
//! frames to the kernel.
//!
//! The metadata kfunc needs a device-bound program (loaded for one
//! interface, `BPF_F_XDP_DEV_BOUND_ONLY`), which only native XDP can run.
//! In generic XDP, or where the kernel has no such kfunc, the program is the
//! redirect alone: tags then reach the switch only if they are in the data
//! (receive VLAN offload off, which the port sees to).
//!
//! The program is 7 or 35 instructions, assembled here (no
//! compiler, no ELF object, no libbpf); the verifier checks it at load. It
//! is attached through a BPF link, so it goes with the port's file
//! descriptors: at `port del`, at stop and when the process dies.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

// <linux/bpf.h>
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_LINK_TYPE_XDP: u32 = 6;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const XDP_PASS: i32 = 2;
const FN_XDP_ADJUST_HEAD: i32 = 44;
const FN_REDIRECT_MAP: i32 = 51;
/// `struct xdp_md` offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;
/// The kfunc that reads a received frame's outermost VLAN tag from the
/// driver: `int (const struct xdp_md *, __be16 *proto, u16 *tci)`.
const RX_VLAN_TAG_KFUNC: &str = "bpf_xdp_metadata_rx_vlan_tag";

/// One BPF instruction, `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes: class | op/mode | source/size, as <linux/bpf.h> composes them.
const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const STX_W: u8 = 0x63;
const STX_H: u8 = 0x6b;
const ST_W: u8 = 0x62;
const TO_BE: u8 = 0xdc;
const JNE_IMM: u8 = 0x55;
const JGT_REG: u8 = 0x2d;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const FP: u8 = 10;

/// The program's instructions: with the tag put back (`vlan_kfunc`: the
/// kfunc's BTF id in vmlinux) or the redirect alone; `map_fd` is the socket
/// map's.
fn program(vlan_kfunc: Option<u32>, map_fd: i32) -> Vec<Insn> {
    let mut p = vec![insn(MOV64_REG, 6, 1, 0, 0)]; // r6 = ctx
    if let Some(id) = vlan_kfunc {
        // The 4 bytes at fp-8: the TPID (big-endian) at -8, the TCI (host
        // order) at -6, zeroed for the verifier.
        let tag = [
            insn(ST_W, FP, 0, -8, 0),
            insn(MOV64_REG, 2, FP, 0, 0),
            insn(ADD64_IMM, 2, 0, 0, -8),
            insn(MOV64_REG, 3, FP, 0, 0),
            insn(ADD64_IMM, 3, 0, 0, -6),
            insn(MOV64_REG, 1, 6, 0, 0),
            // r0 = bpf_xdp_metadata_rx_vlan_tag(ctx, fp-8, fp-6)
            insn(CALL, 0, BPF_PSEUDO_KFUNC_CALL, 0, id as i32),
            // No tag outside the data (or no such metadata): as it is.
            insn(JNE_IMM, 0, 0, 20, 0),
            // Four bytes more at the head.
            insn(MOV64_REG, 1, 6, 0, 0),
            insn(MOV64_IMM, 2, 0, 0, -4),
            insn(CALL, 0, 0, 0, FN_XDP_ADJUST_HEAD),
            insn(JNE_IMM, 0, 0, 16, 0),
            insn(LDX_W, 2, 6, MD_DATA, 0),
            insn(LDX_W, 3, 6, MD_DATA_END, 0),
            insn(MOV64_REG, 4, 2, 0, 0),
            insn(ADD64_IMM, 4, 0, 0, 18),
            insn(JGT_REG, 4, 3, 11, 0),
            // The MAC addresses move 4 bytes down (ascending, so the
            // overlapping copy reads each word before it is written)...
            insn(LDX_W, 5, 2, 4, 0),
            insn(STX_W, 2, 5, 0, 0),
            insn(LDX_W, 5, 2, 8, 0),
            insn(STX_W, 2, 5, 4, 0),
            insn(LDX_W, 5, 2, 12, 0),
            insn(STX_W, 2, 5, 8, 0),
            // ... and the tag goes where they were; the ethertype stays.
            insn(LDX_H, 5, FP, -8, 0),
            insn(STX_H, 2, 5, 12, 0),
            insn(LDX_H, 5, FP, -6, 0),
            insn(TO_BE, 5, 0, 0, 16),
            insn(STX_H, 2, 5, 14, 0),
        ];
        p.extend_from_slice(&tag);
    }
    // return bpf_redirect_map(&sockets, ctx->rx_queue_index, XDP_PASS)
    p.extend_from_slice(&[
        insn(LDX_W, 2, 6, MD_RX_QUEUE_INDEX, 0),
        insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_IMM, 3, 0, 0, XDP_PASS),
        insn(CALL, 0, 0, 0, FN_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    p
}

/// The `bpf()` system call with `attr`, the `union bpf_attr` member for
/// `cmd`; its non-negative result.
fn sys_bpf<A>(cmd: libc::c_int, attr: &mut A) -> io::Result<i64> {
    // SAFETY: `attr` is the `union bpf_attr` member for `cmd`, of its size,
    // padding zeroed by its maker; the kernel reads no further, and any
    // pointers in it lead to memory alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A as *mut libc::c_void,
            std::mem::size_of::<A>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// A `bpf()` command that makes an object: its new file descriptor.
fn bpf_fd<A>(cmd: libc::c_int, attr: &mut A) -> io::Result<OwnedFd> {
    let fd = sys_bpf(cmd, attr)?;
    // SAFETY: BPF_MAP_CREATE, BPF_PROG_LOAD and BPF_LINK_CREATE return a
    // new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
struct GetInfo {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_link_info`, as far as an XDP link's interface.
#[repr(C)]
#[derive(Default)]
struct LinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    xdp_ifindex: u32,
    _pad2: u32,
}

#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// An interface's XDP program, its socket map and the link that attaches
/// them; detached when dropped.
pub struct XdpProgram {
    map: OwnedFd,
    prog: OwnedFd,
    link: OwnedFd,
    /// Whether the program puts tags the driver holds back into frames.
    pub restores_vlan_tags: bool,
}

impl XdpProgram {
    /// Loads the program for interface `ifindex` with room for `queues`
    /// sockets and attaches it, in native (driver) XDP or generic.
    pub fn attach(ifindex: u32, queues: u32, native: bool) -> io::Result<XdpProgram> {
        let map = bpf_fd(
            BPF_MAP_CREATE,
            &mut MapCreate {
                map_type: BPF_MAP_TYPE_XSKMAP,
                key_size: 4,
                value_size: 4,
                max_entries: queues.max(1),
                ..MapCreate::default()
            },
        )?;
        let flags = if native {
            super::XDP_FLAGS_DRV_MODE
        } else {
            super::XDP_FLAGS_SKB_MODE
        };
        // The program (with the tag kfunc, or the redirect alone) and the
        // link that attaches it.
        let attach = |kfunc: Option<u32>| -> io::Result<(OwnedFd, OwnedFd)> {
            let insns = program(kfunc, map.as_raw_fd());
            let bound = kfunc.is_some();
            // Frames of several buffers where the kernel has them (5.18),
            // else one buffer each.
            let prog = load(&insns, ifindex, bound, true)
                .or_else(|_| load(&insns, ifindex, bound, false))?;
            let link = bpf_fd(
                BPF_LINK_CREATE,
                &mut LinkCreate {
                    prog_fd: prog.as_raw_fd() as u32,
                    target_ifindex: ifindex,
                    attach_type: BPF_XDP,
                    flags,
                },
            )?;
            Ok((prog, link))
        };
        // Device-bound with the tag kfunc where it can be (generic XDP
        // cannot run device-bound programs); else the redirect alone.
        let bound = match vlan_kfunc_id().filter(|_| native) {
            None => None,
            Some(id) => match attach(Some(id)) {
                Ok(attached) => Some(attached),
                // Another program holds the interface: so it would for the
                // plain one.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(e),
                Err(e) => {
                    tracing::debug!(ifindex, "no device-bound XDP program: {e}");
                    None
                }
            },
        };
        let restores_vlan_tags = bound.is_some();
        let (prog, link) = match bound {
            Some(attached) => attached,
            None => attach(None)?,
        };
        Ok(XdpProgram {
            map,
            prog,
            link,
            restores_vlan_tags,
        })
    }

    /// The socket map, the program and the link, to hand over: the link
    /// keeps the program attached while any process holds it.
    pub fn fds(&self) -> [BorrowedFd<'_>; 3] {
        [self.map.as_fd(), self.prog.as_fd(), self.link.as_fd()]
    }

    /// Takes up the program another switch attached to interface `ifindex`
    /// and handed over ([`XdpProgram::fds`]). The link must be an XDP link
    /// on that interface.
    pub fn adopt(
        [map, prog, link]: [OwnedFd; 3],
        ifindex: u32,
        restores_vlan_tags: bool,
    ) -> io::Result<XdpProgram> {
        let mut info = LinkInfo::default();
        let mut attr = GetInfo {
            bpf_fd: link.as_raw_fd() as u32,
            info_len: std::mem::size_of::<LinkInfo>() as u32,
            info: &mut info as *mut LinkInfo as u64,
        };
        // The info buffer: a `LinkInfo` alive for the call, of the size said.
        sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        if info.link_type != BPF_LINK_TYPE_XDP || info.xdp_ifindex != ifindex {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the BPF link handed over is of type {} on interface {}, not XDP on {ifindex}",
                    info.link_type, info.xdp_ifindex
                ),
            ));
        }
        Ok(XdpProgram {
            map,
            prog,
            link,
            restores_vlan_tags,
        })
    }

    /// Puts the socket `fd` in the map at receive queue `queue`.
    pub fn set_socket(&self, queue: u32, fd: i32) -> io::Result<()> {
        let mut attr = MapUpdate {
            map_fd: self.map.as_raw_fd() as u32,
            _pad: 0,
            key: &queue as *const u32 as u64,
            value: &fd as *const i32 as u64,
            flags: 0,
        };
        // Key and value: 4-byte values (the map's sizes) alive for the call.
        sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
    }
}

/// Loads `insns` as an XDP program (bound to `ifindex` if `bound`; taking
/// frames of several buffers, `BPF_F_XDP_HAS_FRAGS`, if `frags`); the
/// verifier's log is in the error.
///
/// A program that takes such frames gets a TCP super-frame of 64 KB whole
/// where the kernel has one (generic XDP on a veth whose peer segments
/// nothing); the socket receives it in several descriptors
/// (`XDP_USE_SG`). The program reads only the first buffer's headers,
/// which is all the kernel lets it read directly.
fn load(insns: &[Insn], ifindex: u32, bound: bool, frags: bool) -> io::Result<OwnedFd> {
    let mut log = vec![0u8; 64 * 1024];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"switchyard\0");
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: c"GPL".as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: if bound { BPF_F_XDP_DEV_BOUND_ONLY } else { 0 }
            | if frags { BPF_F_XDP_HAS_FRAGS } else { 0 },
        prog_name: name,
        prog_ifindex: if bound { ifindex } else { 0 },
        expected_attach_type: BPF_XDP,
    };
    bpf_fd(BPF_PROG_LOAD, &mut attr).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        let last = text.lines().rev().find(|l| !l.trim().is_empty());
        match last {
            Some(l) => io::Error::new(e.kind(), format!("XDP program refused: {e}: {l}")),
            None => e,
        }
    })
}

/// Whether the driver of interface `ifindex` hands XDP the VLAN tags it
/// holds outside the data (the `netdev` generic-netlink family's
/// `xdp-rx-metadata-features` has `vlan-tag`; Linux 6.8+). False when the
/// kernel cannot say.
pub fn driver_gives_vlan_tags(ifindex: u32) -> bool {
    match xdp_rx_metadata_features(ifindex) {
        Ok(f) => f & NETDEV_XDP_RX_METADATA_VLAN_TAG != 0,
        Err(e) => {
            tracing::debug!(ifindex, "no XDP receive metadata features: {e}");
            false
        }
    }
}

// <linux/netlink.h>, <linux/genetlink.h>, <linux/netdev.h>
const NETLINK_GENERIC: libc::c_int = 16;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const GENL_ID_CTRL: u16 = 16;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_RX_METADATA_FEATURES: u16 = 5;
const NETDEV_XDP_RX_METADATA_VLAN_TAG: u64 = 4;

fn xdp_rx_metadata_features(ifindex: u32) -> io::Result<u64> {
    // SAFETY: plain arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_GENERIC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let family = genl_call(
        &sock,
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        &[(CTRL_ATTR_FAMILY_NAME, b"netdev\0")],
    )?;
    let id = nl_attrs(&family)
        .find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, v)| Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?)))
        .ok_or_else(|| io::Error::other("no netdev netlink family"))?;
    let dev = genl_call(
        &sock,
        id,
        NETDEV_CMD_DEV_GET,
        &[(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes())],
    )?;
    let features = nl_attrs(&dev)
        .find(|(t, _)| *t == NETDEV_A_DEV_XDP_RX_METADATA_FEATURES)
        .and_then(|(_, v)| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)));
    features.ok_or_else(|| io::Error::other("the kernel reports no XDP receive metadata features"))
}

/// Sends one generic-netlink request and returns its reply's attributes.
fn genl_call(sock: &OwnedFd, family: u16, cmd: u8, attrs: &[(u16, &[u8])]) -> io::Result<Vec<u8>> {
    let mut m = vec![0u8; 20];
    m[4..6].copy_from_slice(&family.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes());
    m[16] = cmd;
    m[17] = 1;
    for (t, v) in attrs {
        m.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(v);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: `m` is a whole message, alive for the call; the socket
    // sends to the kernel (port 0) unless connected elsewhere.
    if unsafe { libc::send(sock.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: at most `buf.len()` bytes are written into `buf`.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    let ty = buf.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    if ty == Some(NLMSG_ERROR) {
        let code = buf
            .get(16..20)
            .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        return Err(io::Error::from_raw_os_error(-code));
    }
    let len = buf
        .get(..4)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize);
    Ok(buf.get(20..len.min(buf.len())).unwrap_or_default().to_vec())
}

/// The attributes (type, payload) in `b`, as far as they are whole.
fn nl_attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let h = b.get(at..at + 4)?;
        let len = usize::from(u16::from_ne_bytes([h[0], h[1]]));
        let ty = u16::from_ne_bytes([h[2], h[3]]) & 0x3fff;
        let v = b.get(at + 4..at.checked_add(len)?)?;
        at = at.checked_add(len.max(4).next_multiple_of(4))?;
        Some((ty, v))
    })
}

/// The BTF id of the VLAN-tag kfunc in the running kernel, if it has one.
fn vlan_kfunc_id() -> Option<u32> {
    static ID: OnceLock<Option<u32>> = OnceLock::new();
    *ID.get_or_init(|| {
        let btf = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
        let id = btf_func_id(&btf, RX_VLAN_TAG_KFUNC);
        if id.is_none() {
            tracing::info!(
                "the kernel has no {RX_VLAN_TAG_KFUNC} (Linux 6.8+): af-xdp ports keep only the VLAN tags that are in the frame's data"
            );
        }
        id
    })
}

/// The type id of the function `name` in the BTF blob `btf`
/// (`Documentation/bpf/btf.rst`), or None if it has none or is malformed.
fn btf_func_id(btf: &[u8], name: &str) -> Option<u32> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(btf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(btf.get(o..o + 4)?.try_into().ok()?));
    if u16_at(0)? != 0xeb9f {
        return None;
    }
    let hdr = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let types = hdr.checked_add(type_off)?;
    let types_end = types.checked_add(type_len)?.min(btf.len());
    let strs = btf.get(hdr.checked_add(str_off)?..)?;
    let strs = strs.get(..str_len.min(strs.len()))?;
    let name_at = |off: usize| {
        let s = strs.get(off..)?;
        let end = s.iter().position(|&b| b == 0)?;
        Some(&s[..end])
    };
    let (mut at, mut id) = (types, 1u32);
    while at.checked_add(12)? <= types_end {
        let (name_off, info) = (u32_at(at)? as usize, u32_at(at + 4)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        const FUNC: u32 = 12;
        if kind == FUNC && name_at(name_off) == Some(name.as_bytes()) {
            return Some(id);
        }
        // What follows each kind's 12-byte common part.
        let extra = match kind {
            1 | 14 | 17 => 4,        // int, var, decl tag
            3 => 12,                 // array
            4 | 5 | 15 => 12 * vlen, // struct, union, datasec
            6 | 13 => 8 * vlen,      // enum, function prototype
            19 => 12 * vlen,         // enum64
            2 | 7..=12 | 16 | 18 => 0,
            _ => return None,
        };
        at = at.checked_add(12 + extra)?;
        id += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (kind, name, extra bytes) and their names.
    fn blob(types: &[(u32, &str, usize)]) -> Vec<u8> {
        let mut strs = vec![0u8];
        let mut ty = Vec::new();
        for &(kind, name, extra) in types {
            let off = strs.len() as u32;
            strs.extend_from_slice(name.as_bytes());
            strs.push(0);
            let vlen = if matches!(kind, 4 | 13) {
                extra as u32
            } else {
                0
            };
            ty.extend_from_slice(&off.to_le_bytes());
            ty.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            ty.extend_from_slice(&0u32.to_le_bytes());
            let bytes = match kind {
                4 => 12 * extra,
                13 => 8 * extra,
                1 => 4,
                _ => 0,
            };
            ty.extend(std::iter::repeat_n(0u8, bytes));
        }
        let mut b = Vec::new();
        b.extend_from_slice(&0xeb9fu16.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            ty.len() as u32,
            ty.len() as u32,
            strs.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend(ty);
        b.extend(strs);
        b
    }

    #[test]
    fn a_function_is_found_past_types_of_every_size() {
        let b = blob(&[
            (1, "int", 0),
            (4, "xdp_md", 6),
            (13, "", 3),
            (12, "other", 0),
            (12, RX_VLAN_TAG_KFUNC, 0),
        ]);
        assert_eq!(btf_func_id(&b, RX_VLAN_TAG_KFUNC), Some(5));
        assert_eq!(btf_func_id(&b, "missing"), None);
        // A struct's members are not functions.
        assert_eq!(btf_func_id(&b, "xdp_md"), None);
    }

    #[test]
    fn a_truncated_or_foreign_blob_finds_nothing() {
        let b = blob(&[(4, "s", 3), (12, RX_VLAN_TAG_KFUNC, 0)]);
        for n in 0..b.len() {
            // Never a panic; a cut through the function's record finds none.
            let _ = btf_func_id(&b[..n], RX_VLAN_TAG_KFUNC);
        }
        let mut other = b.clone();
        other[0] = 0;
        assert_eq!(btf_func_id(&other, RX_VLAN_TAG_KFUNC), None);
    }

    /// The running kernel's release (`uname -r`).
    fn kernel_release() -> String {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap()
            .trim()
            .to_string()
    }

    /// Fails, saying why, when the kernel lacks what the af-xdp port reads
    /// VLAN tags with. Rust has no skipped test, and one that returns early
    /// passes without a word: the project's machines run Linux 6.18, where
    /// it is present, so its absence is a failure to look at.
    fn require(present: bool, what: &str) {
        assert!(
            present,
            "NOT SKIPPED, FAILED: kernel {} lacks {what}: af-xdp ports would keep only \
             the VLAN tags left in the frame's data (Linux 6.8+ has it; the project's \
             machines run 6.18)",
            kernel_release()
        );
    }

    #[test]
    fn the_running_kernel_has_the_vlan_kfunc() {
        // Found as the program loader finds it (its BTF id in vmlinux);
        // the kernel's symbol table says so on its own.
        let in_symbols = std::fs::read_to_string("/proc/kallsyms")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(RX_VLAN_TAG_KFUNC));
        require(
            in_symbols,
            &format!("{RX_VLAN_TAG_KFUNC} in /proc/kallsyms"),
        );
        require(
            vlan_kfunc_id().is_some(),
            &format!("{RX_VLAN_TAG_KFUNC} in /sys/kernel/btf/vmlinux, where the loader looks"),
        );
        let (maj, min) = kernel_version();
        assert!((maj, min) >= (6, 8), "the kfunc on {maj}.{min}");
    }

    fn kernel_version() -> (u32, u32) {
        let r = kernel_release();
        let mut it = r.split(|c: char| !c.is_ascii_digit());
        let maj = it.next().unwrap().parse().unwrap();
        let min = it.next().unwrap().parse().unwrap();
        (maj, min)
    }

    /// A network namespace of the test's own, deleted when dropped.
    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }

    #[test]
    fn veth_says_it_gives_vlan_tags_and_loopback_does_not() {
        // veth implements every XDP receive metadata kfunc (Linux 6.8+);
        // loopback none. A pair made in a namespace of the test's own,
        // asked as a port asks (`driver_gives_vlan_tags`).
        let ns = Netns(format!("sy-meta-{}", std::process::id()));
        let sh = |c: &str| {
            std::process::Command::new("sh")
                .args(["-c", c])
                .status()
                .unwrap()
                .success()
        };
        assert!(
            sh(&format!("ip netns add {}", ns.0)),
            "the tests run as root"
        );
        assert!(sh(&format!(
            "ip -n {} link add m0 type veth peer name m1",
            ns.0
        )));
        let ifindex = |name: &str| -> u32 {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns.0, "cat"])
                .arg(format!("/sys/class/net/{name}/ifindex"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        let (veth, lo) = (ifindex("m0"), ifindex("lo"));
        let (features, veth_gives, lo_gives) = std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap();
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                (
                    xdp_rx_metadata_features(veth),
                    driver_gives_vlan_tags(veth),
                    driver_gives_vlan_tags(lo),
                )
            })
            .join()
            .unwrap()
        });
        require(
            features.is_ok(),
            &format!("the netdev family's xdp-rx-metadata-features ({features:?})"),
        );
        require(veth_gives, "veth's vlan-tag XDP receive metadata");
        assert!(!lo_gives, "loopback has no XDP receive metadata");
    }

    #[test]
    fn jumps_land_on_the_redirect() {
        // Every forward jump of the tag part lands on the first instruction
        // of the redirect (the load of rx_queue_index).
        let p = program(Some(7), 3);
        let redirect = p
            .iter()
            .position(|i| *i == insn(LDX_W, 2, 6, MD_RX_QUEUE_INDEX, 0))
            .unwrap();
        for (at, i) in p.iter().enumerate() {
            if matches!(i.code, JNE_IMM | JGT_REG) {
                assert_eq!(at + 1 + i.off as usize, redirect, "jump at {at}");
            }
        }
        assert_eq!(program(None, 3).len(), 7);
    }
}
