//! The memif control channel: a `SOCK_SEQPACKET` Unix socket carrying
//! 128-byte messages, each with at most one file descriptor attached.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::wire::memif::MSG_SIZE;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::socket::endpoint::{accept, connect, listen};
    use crate::wire::memif::Message;
    use nix::sys::socket::SockType;
    use std::os::fd::AsRawFd;

    #[test]
    fn passes_messages_and_fds() {
        let dir = tempfile::tempdir().unwrap();
        let addr = switchyard_api::SocketAddr::Path(dir.path().join("s.sock"));
        let l = listen(SockType::SeqPacket, &addr, None, None).unwrap();
        let c = connect(SockType::SeqPacket, &addr).unwrap();
        let s = accept(&l).unwrap().expect("pending connection");
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
        // The peer's end closes once no process holds it: a test of this
        // process that forks meanwhile (to run `ip`, say) holds a copy
        // until its child execs (the fd is CLOEXEC), so the end may read
        // as empty a moment before it reads as closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let e = loop {
            match recv(s.as_raw_fd()) {
                Err(e) => break e,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Ok(r) => panic!("not EOF: a message ({})", r.is_some()),
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
