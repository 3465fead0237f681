//! A small epoll reactor for the control thread: every socket of every port,
//! the control API's wakeup, signals and worker fault notices.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::types::PortId;

/// What an epoll event refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// An fd of a port: slot and the port's own sub-token.
    Port(PortId, u32),
    /// An fd of a listening socket (the ports it serves are its members):
    /// the socket's number and its sub-token.
    Socket(u32, u32),
    /// A control-plane source (API wakeup, signals, faults).
    Control(u32),
}

const CONTROL_BIT: u64 = 1 << 63;
const SOCKET_BIT: u64 = 1 << 62;

impl Token {
    /// A port token.
    pub fn port(id: PortId, sub: u32) -> Token {
        Token::Port(id, sub)
    }
    fn to_u64(self) -> u64 {
        match self {
            Token::Port(id, sub) => (u64::from(id) << 32) | u64::from(sub),
            Token::Socket(id, sub) => SOCKET_BIT | (u64::from(id) << 32) | u64::from(sub),
            Token::Control(c) => CONTROL_BIT | u64::from(c),
        }
    }
    fn from_u64(v: u64) -> Token {
        if v & CONTROL_BIT != 0 {
            Token::Control(v as u32)
        } else if v & SOCKET_BIT != 0 {
            Token::Socket(((v & !SOCKET_BIT) >> 32) as u32, v as u32)
        } else {
            Token::Port((v >> 32) as PortId, v as u32)
        }
    }
}

/// Level-triggered epoll over raw fds, and events posted by the control
/// thread itself ([`Reactor::post`]).
pub struct Reactor {
    epoll: Epoll,
    posted: Mutex<Vec<Token>>,
}

impl Reactor {
    /// A new, empty reactor.
    pub fn new() -> std::io::Result<Reactor> {
        Ok(Reactor {
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
            posted: Mutex::default(),
        })
    }

    /// Makes the next [`Reactor::wait`] return `token` at once, as if an
    /// fd watched with it were ready: how one port hands another a
    /// connection on the socket they share.
    pub fn post(&self, token: Token) {
        self.posted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(token);
    }

    /// Watches `fd` for input (and hang-up, which is always reported).
    /// Callers [`Reactor::remove`] it before they close it.
    pub fn add(&self, fd: impl AsFd, token: Token) -> std::io::Result<()> {
        let ev = EpollEvent::new(EpollFlags::EPOLLIN, token.to_u64());
        self.epoll.add(fd, ev)?;
        Ok(())
    }

    /// Stops watching `fd` (ignored if it was not watched).
    pub fn remove(&self, fd: impl AsFd) {
        let _ = self.epoll.delete(fd);
    }

    /// Waits up to `timeout` and returns the tokens that became ready, and
    /// those posted (without waiting, if there are any).
    pub fn wait(&self, timeout: Option<Duration>, out: &mut Vec<Token>) -> std::io::Result<()> {
        out.clear();
        out.append(&mut self.posted.lock().unwrap_or_else(|e| e.into_inner()));
        let timeout = if out.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
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
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token::Port(0, 0),
            Token::Port(65535, 7),
            Token::Socket(0, 0),
            Token::Socket((1 << 30) - 1, 2),
            Token::Control(3),
        ] {
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

    #[test]
    fn posted_tokens_come_once_without_waiting() {
        let r = Reactor::new().unwrap();
        r.post(Token::Port(3, 2));
        let mut out = Vec::new();
        let t = std::time::Instant::now();
        r.wait(Some(Duration::from_secs(10)), &mut out).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(out, vec![Token::Port(3, 2)]);
        r.wait(Some(Duration::from_millis(0)), &mut out).unwrap();
        assert!(out.is_empty());
    }
}
