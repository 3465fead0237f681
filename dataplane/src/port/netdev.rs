//! Kernel network interfaces as the uplink port kinds see them: the
//! `struct ifreq` ioctls for an interface's MTU and flags, and its index.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
