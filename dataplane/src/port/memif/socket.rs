//! The memif control channel: a `SOCK_SEQPACKET` Unix socket carrying
//! 128-byte messages, each with at most one file descriptor attached.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, listen, recvmsg, sendmsg, socket, AddressFamily, Backlog, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};

use crate::wire::memif::MSG_SIZE;

/// Where a memif socket lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketAddr {
    /// A filesystem path.
    Path(String),
    /// A name in the abstract namespace (`@name` as libmemif writes it,
    /// `abstract:name` as VPP does).
    Abstract(String),
}

impl SocketAddr {
    /// Parses the user's socket string.
    pub fn parse(s: &str) -> SocketAddr {
        if let Some(n) = s.strip_prefix('@') {
            SocketAddr::Abstract(n.to_string())
        } else if let Some(n) = s.strip_prefix("abstract:") {
            SocketAddr::Abstract(n.to_string())
        } else {
            SocketAddr::Path(s.to_string())
        }
    }

    fn unix_addr(&self) -> io::Result<UnixAddr> {
        Ok(match self {
            SocketAddr::Path(p) => UnixAddr::new(Path::new(p))?,
            // Length is sun_family + NUL + name, as VPP, libmemif and DPDK use.
            SocketAddr::Abstract(n) => UnixAddr::new_abstract(n.as_bytes())?,
        })
    }
}

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?)
}

/// Binds and listens. A stale socket file (nobody listening) is replaced; a
/// live one is an error. With `group`, a path socket is opened to it
/// ([`crate::port::share_socket`]).
pub fn listen_at(addr: &SocketAddr, group: Option<u32>) -> io::Result<OwnedFd> {
    if let SocketAddr::Path(p) = addr {
        let path = Path::new(p);
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "path exists and is not a socket",
                ));
            }
            if crate::port::listener_alive(connect_to(addr)) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "a process is already listening on this socket",
                ));
            }
            std::fs::remove_file(path)?;
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
    }
    let fd = seqpacket()?;
    bind(fd.as_raw_fd(), &addr.unix_addr()?)?;
    if let SocketAddr::Path(p) = addr {
        crate::port::share_socket(Path::new(p), group)?;
    }
    listen(&fd, Backlog::new(16).map_err(io::Error::from)?)?;
    Ok(fd)
}

/// Connects without blocking ([`crate::port::connect_unix`]).
pub fn connect_to(addr: &SocketAddr) -> io::Result<OwnedFd> {
    if let SocketAddr::Path(p) = addr {
        crate::port::refuse_symlink(Path::new(p))?;
    }
    crate::port::connect_unix(SockType::SeqPacket, &addr.unix_addr()?)
}

/// Accepts one pending connection, if any.
pub fn accept(listener: RawFd) -> io::Result<Option<OwnedFd>> {
    match accept4(listener, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK) {
        // SAFETY: accept4 returned a new fd that nothing else owns.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Sends one message with an optional fd.
pub fn send(fd: RawFd, msg: &[u8; MSG_SIZE], attach: Option<RawFd>) -> io::Result<()> {
    let iov = [IoSlice::new(msg)];
    let fds;
    let cmsgs: &[ControlMessage<'_>] = match attach {
        Some(a) => {
            fds = [a];
            &[ControlMessage::ScmRights(&fds)]
        }
        None => &[],
    };
    let n = sendmsg::<()>(fd, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if n != MSG_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short control message send",
        ));
    }
    Ok(())
}

/// One received datagram.
pub struct Received {
    /// The bytes (only the first `len` are meaningful).
    pub buf: [u8; MSG_SIZE],
    /// Datagram length (a datagram longer than 128 bytes reports 129).
    pub len: usize,
    /// The attached fd, if any (extra fds are closed).
    pub fd: Option<OwnedFd>,
}

/// Receives one datagram. `Ok(None)`: nothing pending. An orderly shutdown by
/// the peer is reported as `UnexpectedEof`.
pub fn recv(fd: RawFd) -> io::Result<Option<Received>> {
    // One extra byte detects oversize datagrams (MSG_TRUNC would lose them).
    let mut buf = [0u8; MSG_SIZE + 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let (len, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let r = match recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(r) => r,
            Err(Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        if let Ok(cmsgs) = r.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(v) = c {
                    // SAFETY: the kernel installed these fds for us; we take
                    // ownership so every one of them gets closed.
                    fds.extend(v.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
                }
            }
        }
        (r.bytes, fds, r.flags.contains(MsgFlags::MSG_CTRUNC))
    };
    if len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the control socket",
        ));
    }
    if truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message carried too many fds",
        ));
    }
    let mut out = [0u8; MSG_SIZE];
    let n = len.min(MSG_SIZE);
    out[..n].copy_from_slice(&buf[..n]);
    let mut fds = fds.into_iter();
    Ok(Some(Received {
        buf: out,
        len,
        fd: fds.next(),
    }))
}

/// Removes a socket file we created (abstract names need nothing).
pub fn unlink(addr: &SocketAddr) {
    if let SocketAddr::Path(p) = addr {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::memif::Message;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            SocketAddr::parse("/run/a.sock"),
            SocketAddr::Path("/run/a.sock".into())
        );
        assert_eq!(
            SocketAddr::parse("@memif"),
            SocketAddr::Abstract("memif".into())
        );
        assert_eq!(
            SocketAddr::parse("abstract:vpp"),
            SocketAddr::Abstract("vpp".into())
        );
    }

    #[test]
    fn passes_messages_and_fds() {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::Path(dir.path().join("s.sock").to_string_lossy().into_owned());
        let l = listen_at(&addr, None).unwrap();
        let c = connect_to(&addr).unwrap();
        let s = accept(l.as_raw_fd()).unwrap().expect("pending connection");
        let efd = crate::eventfd::new_eventfd().unwrap();
        send(
            c.as_raw_fd(),
            &Message::Ack.to_bytes(),
            Some(efd.as_raw_fd()),
        )
        .unwrap();
        let r = recv(s.as_raw_fd()).unwrap().unwrap();
        assert_eq!(r.len, MSG_SIZE);
        assert_eq!(Message::parse(&r.buf).unwrap(), Message::Ack);
        assert!(r.fd.is_some());
        assert!(recv(s.as_raw_fd()).unwrap().is_none());
        drop(c);
        let e = recv(s.as_raw_fd()).err().expect("EOF");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // A second listener on a live socket is refused; a stale one replaced.
        assert!(listen_at(&addr, None).is_err());
        drop(l);
        drop(s);
        let _l2 = listen_at(&addr, None).unwrap();
        // A link to a live socket is not followed.
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(dir.path().join("s.sock"), &link).unwrap();
        let e = connect_to(&SocketAddr::Path(link.to_string_lossy().into_owned())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn a_listener_with_a_full_backlog_is_alive_and_connects_never_wait() {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::Path(dir.path().join("full.sock").to_string_lossy().into_owned());
        let l = listen_at(&addr, None).unwrap();
        // Nobody accepts: fill the backlog until a connect would wait.
        let mut held = Vec::new();
        let full = loop {
            match connect_to(&addr) {
                Ok(c) => held.push(c),
                Err(e) => break e,
            }
            assert!(held.len() < 1000, "the backlog never filled");
        };
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
        // Alive, so not replaced as stale.
        let e = listen_at(&addr, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(l);
    }

    #[test]
    fn abstract_sockets_work() {
        let name = format!("@switchyard-test-{}", std::process::id());
        let addr = SocketAddr::parse(&name);
        let l = listen_at(&addr, None).unwrap();
        let _c = connect_to(&addr).unwrap();
        assert!(accept(l.as_raw_fd()).unwrap().is_some());
    }
}
