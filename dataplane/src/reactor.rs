//! A small epoll reactor for the control thread: every socket of every port,
//! the control API's wakeup, signals and worker fault notices.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::dataplane::PortId;

/// What an epoll event refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// An fd of a port: slot and the port's own sub-token.
    Port(PortId, u32),
    /// A control-plane source (API wakeup, signals, faults).
    Control(u32),
}

const CONTROL_BIT: u64 = 1 << 63;

impl Token {
    /// A port token.
    pub fn port(id: PortId, sub: u32) -> Token {
        Token::Port(id, sub)
    }
    fn to_u64(self) -> u64 {
        match self {
            Token::Port(id, sub) => (u64::from(id) << 32) | u64::from(sub),
            Token::Control(c) => CONTROL_BIT | u64::from(c),
        }
    }
    fn from_u64(v: u64) -> Token {
        if v & CONTROL_BIT != 0 {
            Token::Control(v as u32)
        } else {
            Token::Port((v >> 32) as PortId, v as u32)
        }
    }
}

/// Level-triggered epoll over raw fds.
pub struct Reactor {
    epoll: Epoll,
}

impl Reactor {
    /// A new, empty reactor.
    pub fn new() -> std::io::Result<Reactor> {
        Ok(Reactor {
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
        })
    }

    /// Watches `fd` for input (and hang-up, which is always reported).
    pub fn add(&self, fd: RawFd, token: Token) -> std::io::Result<()> {
        let ev = EpollEvent::new(EpollFlags::EPOLLIN, token.to_u64());
        // SAFETY: the fd is open for the duration of the call; epoll only
        // records the number, and callers remove it before closing it.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        self.epoll.add(bfd, ev)?;
        Ok(())
    }

    /// Stops watching `fd` (ignored if it was not watched).
    pub fn remove(&self, fd: RawFd) {
        // SAFETY: as in `add`; a stale or unknown fd only yields an error.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = self.epoll.delete(bfd);
    }

    /// Waits up to `timeout` and returns the tokens that became ready.
    pub fn wait(&self, timeout: Option<Duration>, out: &mut Vec<Token>) -> std::io::Result<()> {
        out.clear();
        let mut events = [EpollEvent::empty(); 64];
        let t = match timeout {
            None => EpollTimeout::NONE,
            Some(d) => {
                let ms = d.as_millis().min(60_000) as u16;
                // Round up so a deadline 0.4 ms away does not spin.
                let ms = if d > Duration::from_millis(u64::from(ms)) {
                    ms + 1
                } else {
                    ms
                };
                EpollTimeout::from(ms)
            }
        };
        let n = match self.epoll.wait(&mut events, t) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(e.into()),
        };
        out.extend(events[..n].iter().map(|e| Token::from_u64(e.data())));
        Ok(())
    }
}

/// A non-blocking eventfd used to wake a thread.
pub struct Waker {
    fd: EventFd,
}

impl Waker {
    /// A new waker.
    pub fn new() -> std::io::Result<Waker> {
        Ok(Waker {
            fd: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
        })
    }
    /// Wakes the thread waiting on [`Waker::fd`].
    pub fn wake(&self) {
        let _ = self.fd.write(1);
    }
    /// Clears pending wakeups.
    pub fn drain(&self) {
        let _ = self.fd.read();
    }
    /// The fd to poll.
    pub fn fd(&self) -> RawFd {
        self.fd.as_fd_raw()
    }
}

trait AsFdRaw {
    fn as_fd_raw(&self) -> RawFd;
}
impl AsFdRaw for EventFd {
    fn as_fd_raw(&self) -> RawFd {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}

/// Reads the 8-byte counter of an eventfd, ignoring errors (used to drain).
pub fn drain_eventfd(fd: RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: reading into a local 8-byte buffer from an fd we own.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// Writes 1 to an eventfd (a memif or vhost-user kick), ignoring errors: a
/// full counter or a closed peer must not stop the data path.
pub fn kick_eventfd(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a local buffer to an fd held open by the
    // queue that calls this.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

/// Creates a non-blocking, close-on-exec eventfd.
pub fn new_eventfd() -> std::io::Result<OwnedFd> {
    let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    Ok(OwnedFd::from(efd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        for t in [Token::Port(0, 0), Token::Port(65535, 7), Token::Control(3)] {
            assert_eq!(Token::from_u64(t.to_u64()), t);
        }
    }

    #[test]
    fn waker_wakes_reactor() {
        let r = Reactor::new().unwrap();
        let w = Waker::new().unwrap();
        r.add(w.fd(), Token::Control(1)).unwrap();
        let mut out = Vec::new();
        r.wait(Some(Duration::from_millis(0)), &mut out).unwrap();
        assert!(out.is_empty());
        w.wake();
        r.wait(Some(Duration::from_millis(100)), &mut out).unwrap();
        assert_eq!(out, vec![Token::Control(1)]);
        w.drain();
        r.wait(Some(Duration::from_millis(0)), &mut out).unwrap();
        assert!(out.is_empty());
    }
}
