//! Kernel network interfaces as the uplink port kinds see them: the
//! `struct ifreq` ioctls for an interface's MTU and flags, and its index.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use switchyard_api::PortStatus;

use crate::queue::offload::MAX_HDR;
use crate::queue::{TxFrame, MAX_SEGS};
use crate::wire::ethernet::{EthernetFrame, HEADER_LEN as ETH_HEADER_LEN};

/// `struct ifreq` with the fields we use (name, then a short or an int).
#[repr(C)]
pub struct IfReq {
    /// `ifr_name`.
    pub name: [libc::c_char; libc::IFNAMSIZ],
    /// `ifr_flags` or `ifr_mtu` (the union's first bytes).
    pub data: [u8; 24],
}

impl IfReq {
    /// A request about `ifname`.
    pub fn new(ifname: &str) -> io::Result<IfReq> {
        let c = CString::new(ifname).map_err(|_| io::Error::other("NUL in interface name"))?;
        let b = c.as_bytes_with_nul();
        if b.len() > libc::IFNAMSIZ {
            return Err(io::Error::other("interface name too long"));
        }
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        for (d, s) in r.name.iter_mut().zip(b) {
            *d = *s as libc::c_char;
        }
        Ok(r)
    }
}

fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain arguments; the result is checked.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `socket` returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(s) })
}

/// A kernel-interface port's status, with the MTU it holds frames to (as it
/// last read it from the interface).
pub fn status_with_mtu(status: &PortStatus, mtu: &AtomicU32) -> PortStatus {
    PortStatus {
        mtu: Some(mtu.load(Ordering::Relaxed)),
        ..status.clone()
    }
}

/// Whether `fd` is readable now (no wait): a kernel queue (a tap's, a
/// socket's) with something to read.
pub fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that lives past the call, no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
}

/// The address of this host that packets to `remote` leave from, as its
/// routing picks it (the source of a UDP socket connected there); an
/// error: no route.
pub fn route_source(remote: std::net::IpAddr) -> io::Result<std::net::IpAddr> {
    let any: std::net::IpAddr = if remote.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let s = std::net::UdpSocket::bind((any, 0))?;
    // Any port: connecting a UDP socket sends nothing.
    s.connect((remote, 9))?;
    Ok(s.local_addr()?.ip())
}

/// The interface's MTU (`SIOCGIFMTU`, in the switch's network namespace).
pub fn read_mtu(ifname: &str) -> io::Result<u32> {
    let s = inet_socket()?;
    let mut req = IfReq::new(ifname)?;
    // SAFETY: SIOCGIFMTU fills `ifr_mtu` (an int at the union's start) of
    // the `struct ifreq` that `req` lays out and that outlives the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut m = [0u8; 4];
    m.copy_from_slice(&req.data[..4]);
    Ok(u32::try_from(i32::from_ne_bytes(m)).unwrap_or(0))
}

/// The shortest Ethernet frame on a wire, without its FCS (`ETH_ZLEN`).
pub const ETH_MIN_FRAME: usize = 60;

/// Pads a frame of `len` bytes at `dst` to [`ETH_MIN_FRAME`] with zeros, as
/// a NIC driver pads a short skb (`eth_skb_pad`): a 42-byte ARP from a tap
/// or a pod leaves an uplink as a valid Ethernet frame, whatever the driver
/// or the far end does with runts. Returns the length to send.
///
/// # Safety
/// `dst` must be valid for writes of `max(len, ETH_MIN_FRAME)` bytes.
pub unsafe fn pad_short(dst: *mut u8, len: usize) -> usize {
    if len >= ETH_MIN_FRAME {
        return len;
    }
    // SAFETY: the caller's buffer holds ETH_MIN_FRAME bytes.
    unsafe { std::ptr::write_bytes(dst.add(len), 0, ETH_MIN_FRAME - len) };
    ETH_MIN_FRAME
}

// <linux/ethtool.h>: the legacy flags commands, which map `ETH_FLAG_RXVLAN`
// to the `rx-vlan-offload` feature (NETIF_F_HW_VLAN_CTAG_RX).
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_SFLAGS: u32 = 0x26;
const ETH_FLAG_RXVLAN: u32 = 1 << 8;

/// One `SIOCETHTOOL` call with a `struct ethtool_value`.
fn ethtool_value(ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let s = inet_socket()?;
    let mut req = IfReq::new(ifname)?;
    let mut value: [u32; 2] = [cmd, data];
    let ptr = value.as_mut_ptr() as usize;
    req.data[..std::mem::size_of::<usize>()].copy_from_slice(&ptr.to_ne_bytes());
    // SAFETY: SIOCETHTOOL reads `ifr_data` (a pointer at the union's start,
    // set above) and reads and writes the `struct ethtool_value` it points
    // at (`value`, two u32s), which outlives the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCETHTOOL, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value[1])
}

/// Whether the running kernel is `major.minor` or later (`uname`), for
/// features a socket option cannot be asked about.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: all-zero is a valid `utsname`; `uname` fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a writable `utsname` that outlives the call.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    let release: String = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// `ETHTOOL_GDRVINFO`.
const ETHTOOL_GDRVINFO: u32 = 0x03;

/// The interface's driver name (`ethtool -i`): `veth`, `ixgbe`, ...
pub fn driver(ifname: &str) -> io::Result<String> {
    let s = inet_socket()?;
    let mut req = IfReq::new(ifname)?;
    // `struct ethtool_drvinfo`: the command, then `driver[32]` and more
    // (196 bytes in all; room for more is harmless).
    let mut info = [0u32; 64];
    info[0] = ETHTOOL_GDRVINFO;
    let ptr = info.as_mut_ptr() as usize;
    req.data[..std::mem::size_of::<usize>()].copy_from_slice(&ptr.to_ne_bytes());
    // SAFETY: SIOCETHTOOL reads `ifr_data` (a pointer at the union's start,
    // set above) and fills the `struct ethtool_drvinfo` it points at
    // (`info`, 256 bytes, more than the struct's 196), which outlives the
    // call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCETHTOOL, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let bytes: Vec<u8> = info[1..9].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Whether the interface strips VLAN tags on receive (`rx-vlan-offload`,
/// `ethtool -k`).
pub fn rx_vlan_offload(ifname: &str) -> io::Result<bool> {
    Ok(ethtool_value(ifname, ETHTOOL_GFLAGS, 0)? & ETH_FLAG_RXVLAN != 0)
}

/// Turns receive VLAN stripping on or off (`ethtool -K IF rxvlan on|off`).
pub fn set_rx_vlan_offload(ifname: &str, on: bool) -> io::Result<()> {
    let flags = ethtool_value(ifname, ETHTOOL_GFLAGS, 0)?;
    let want = if on {
        flags | ETH_FLAG_RXVLAN
    } else {
        flags & !ETH_FLAG_RXVLAN
    };
    ethtool_value(ifname, ETHTOOL_SFLAGS, want)?;
    // A driver may take the call and keep the feature (it is fixed).
    if rx_vlan_offload(ifname)? != on {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the driver keeps rx-vlan-offload as it is",
        ));
    }
    Ok(())
}

/// The interface's MAC (`SIOCGIFHWADDR`).
pub fn read_mac(ifname: &str) -> io::Result<switchyard_api::MacAddr> {
    let s = inet_socket()?;
    let mut req = IfReq::new(ifname)?;
    // SAFETY: SIOCGIFHWADDR fills `ifr_hwaddr` (a `struct sockaddr`: a
    // family, then the address bytes) of the `struct ifreq` that `req`
    // lays out and that outlives the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(switchyard_api::MacAddr::from_bytes(&req.data[2..8]))
}

/// Sets the interface's MAC (`SIOCSIFHWADDR`, an Ethernet address).
pub fn write_mac(ifname: &str, mac: switchyard_api::MacAddr) -> io::Result<()> {
    let s = inet_socket()?;
    let mut req = IfReq::new(ifname)?;
    req.data[..2].copy_from_slice(&libc::ARPHRD_ETHER.to_ne_bytes());
    req.data[2..8].copy_from_slice(&mac.0);
    // SAFETY: SIOCSIFHWADDR reads `ifr_hwaddr` (family, then the address)
    // of the `struct ifreq` that `req` lays out and that outlives the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFHWADDR, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The interface's index, if it exists (in the switch's namespace).
pub fn ifindex(ifname: &str) -> Option<u32> {
    let c = CString::new(ifname).ok()?;
    // SAFETY: a NUL-terminated name; 0 means no such interface.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Whether the interface is administratively up with carrier
/// (`IFF_UP | IFF_RUNNING`).
pub fn is_running(ifname: &str) -> io::Result<bool> {
    let s = inet_socket()?;
    let mut req = IfReq::new(ifname)?;
    // SAFETY: SIOCGIFFLAGS fills `ifr_flags` (a short at the union's
    // start) of the `struct ifreq` that `req` lays out and that outlives
    // the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let f = i16::from_ne_bytes([req.data[0], req.data[1]]) as libc::c_int;
    Ok(f & libc::IFF_UP != 0 && f & libc::IFF_RUNNING != 0)
}

/// A header and a frame's pieces as the iovecs of one `writev` or
/// `sendmsg`, so that the kernel's copy is the only one. The iovecs point
/// into `header` and the frame, which the lifetime keeps alive.
pub struct FrameIovecs<'a> {
    iov: [libc::iovec; MAX_SEGS + 2],
    n: usize,
    _borrow: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> FrameIovecs<'a> {
    /// `header`, then the frame's prefix and segments.
    pub fn new(header: &'a [u8], frame: &'a TxFrame<'a>) -> FrameIovecs<'a> {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_SEGS + 2];
        iov[0] = libc::iovec {
            iov_base: header.as_ptr() as *mut libc::c_void,
            iov_len: header.len(),
        };
        let mut n = 1;
        frame.for_each_piece(|p, len| {
            // The pieces are a prefix and at most MAX_SEGS segments.
            if n < iov.len() {
                iov[n] = libc::iovec {
                    iov_base: p as *mut libc::c_void,
                    iov_len: len,
                };
                n += 1;
            }
        });
        FrameIovecs {
            iov,
            n,
            _borrow: std::marker::PhantomData,
        }
    }

    /// The iovecs (for `msghdr.msg_iov`, which the kernel only reads on
    /// send) and their count.
    pub fn raw(&mut self) -> (*mut libc::iovec, usize) {
        (self.iov.as_mut_ptr(), self.n)
    }
}

/// Whether `frame` is longer than an interface of MTU `mtu` carries: the
/// MTU bounds what follows the Ethernet header and, in a tagged frame, its
/// VLAN tag (the uplinks' transmit check, frame by frame). For a TCP or
/// UDP super-frame it bounds each segment the kernel will cut it into (its
/// headers and one segment's payload), as the kernel's own bridge checks a
/// GSO frame it forwards (`skb_gso_validate_network_len`): a super-frame
/// of larger segments than the MTU allows is too long, never cut smaller.
#[inline]
pub fn exceeds_mtu(frame: &TxFrame<'_>, mtu: u32) -> bool {
    let mut head = [0u8; ETH_HEADER_LEN];
    let got = {
        let mut r = frame.reader();
        // SAFETY: `head` is a local buffer of the length given.
        unsafe { r.copy_to(head.as_mut_ptr(), head.len()) }
    };
    // The header, with the tag if the frame has one (a frame shorter than
    // a header has none).
    let overhead = if got == ETH_HEADER_LEN {
        EthernetFrame::new_unchecked(&head).header_len()
    } else {
        ETH_HEADER_LEN
    };
    let len = match frame.offload.gso() {
        None => frame.len(),
        Some((_, size)) => segment_len(frame, usize::from(size)),
    };
    len > mtu as usize + overhead
}

/// The length of the largest segment of super-frame `frame` cut into
/// segments of `size` payload bytes: its headers (as far as the TCP or
/// UDP header's end) and `size`. A frame whose headers cannot be found is
/// taken as it is.
#[cold]
fn segment_len(frame: &TxFrame<'_>, size: usize) -> usize {
    let mut head = [0u8; MAX_HDR];
    let got = {
        let mut r = frame.reader();
        // SAFETY: `head` is a local buffer of the length given.
        unsafe { r.copy_to(head.as_mut_ptr(), head.len()) }
    };
    match crate::wire::ip::locate(&head[..got]) {
        Some(h) => (h.end + size).min(frame.len()),
        None => frame.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::RxFrame;
    use crate::wire::ethernet::ETHERTYPE_VLAN;

    /// Whether a frame of `len` bytes, tagged or not, exceeds MTU `mtu`.
    fn exceeds(len: usize, tagged: bool, mtu: u32) -> bool {
        let mut bytes = vec![0u8; len];
        if tagged && len >= 14 {
            bytes[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        }
        let mut f = RxFrame::default();
        // SAFETY: `bytes` outlives the frame and every read of it.
        assert!(unsafe { f.push(bytes.as_ptr(), len as u32) });
        exceeds_mtu(&TxFrame::plain(&f), mtu)
    }

    #[test]
    fn the_kernel_version_is_read() {
        assert!(kernel_at_least(3, 0));
        assert!(!kernel_at_least(999, 0));
    }

    #[test]
    fn a_super_frame_is_held_to_the_mtu_segment_by_segment() {
        use crate::queue::offload::Offload;
        use crate::wire::virtio_net::GSO_TCPV4;
        // 20000 bytes of TCP payload behind Ethernet, IPv4 and TCP headers.
        let mut b = vec![0u8; 54 + 20000];
        b[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        b[14] = 0x45;
        b[16..18].copy_from_slice(&20040u16.to_be_bytes());
        b[23] = 6;
        b[46] = 5 << 4;
        let f = RxFrame::of(&[&b]);
        let tso = |size: u16| {
            let mut v = Offload::checksum(34, 16).to_vnet();
            v[1] = GSO_TCPV4;
            v[4..6].copy_from_slice(&size.to_le_bytes());
            TxFrame::plain(&f).with_offload(Offload::from_vnet(&v, b.len()).unwrap())
        };
        // 1460-byte segments: 1500 bytes of IP each.
        assert!(!exceeds_mtu(&tso(1460), 1500));
        assert!(exceeds_mtu(&tso(1461), 1500));
        // A guest's 9000-MTU segments do not fit a 1500 wire.
        assert!(exceeds_mtu(&tso(8960), 1500));
        assert!(!exceeds_mtu(&tso(8960), 9000));
        // Without the segmentation the frame itself is held to it.
        assert!(exceeds_mtu(&TxFrame::plain(&f), 9000));
    }

    #[test]
    fn the_mtu_bounds_what_follows_the_ethernet_header_and_its_tag() {
        assert!(!exceeds(1514, false, 1500));
        assert!(exceeds(1515, false, 1500));
        // A tagged frame carries 4 bytes more for the same payload.
        assert!(!exceeds(1518, true, 1500));
        assert!(exceeds(1519, true, 1500));
        assert!(!exceeds(9018, true, 9000));
        // Shorter than a header: never over.
        assert!(!exceeds(10, false, 0));
        assert!(!exceeds(14, false, 0));
        assert!(exceeds(15, false, 0));
    }
}
