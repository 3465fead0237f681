//! A frontend's protocol messages, read without ever blocking the control
//! thread.
//!
//! The `vhost` crate's [`vhost::vhost_user::BackendReqHandler`] reads each
//! message with blocking calls: given the frontend's socket, a frontend that
//! sends half a header would hold the thread that also serves the control
//! API. So the handler gets one end of a private socket pair instead, and
//! this relay stands between it and the frontend:
//!
//! - the frontend's bytes and file descriptors (`SCM_RIGHTS`) are read when
//!   they are there and buffered until a message (12-byte header, body of
//!   the size it names) is whole: bounded by the protocol's largest message
//!   and fd count;
//! - a whole message goes to the handler in one `sendmsg`, as a frontend
//!   would send it, so the handler's blocking reads find it complete;
//! - the handler's replies come back through the pair and are written to
//!   the frontend without blocking; a frontend that does not read them loses
//!   its connection once a bound is reached;
//! - a message that is not whole [`MESSAGE_DEADLINE`] after its first byte
//!   costs the connection (see [`Relay::deadline`]).

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};

use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};

/// vhost-user message header: `u32` request, `u32` flags, `u32` body size.
pub const HEADER_LEN: usize = 12;
/// The largest body the protocol has (the `vhost` crate's `MAX_MSG_SIZE`).
pub const MAX_BODY: usize = 0x1000;
/// The most file descriptors one message carries (`MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_FDS: usize = 32;
/// How long a message may take to arrive in full once its first byte has.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(2);
/// Replies the frontend has not read yet, at most.
pub const MAX_UNREAD_REPLIES: usize = 64 * 1024;
/// Messages taken per wake-up: a frontend that floods requests gets this
/// many handled, then the control thread serves everything else (the
/// reactor is level-triggered, so the rest is read on the next turn).
pub const MESSAGES_PER_WAKE: usize = 16;

/// Why the connection must go.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The frontend closed its end.
    #[error("frontend closed the connection")]
    Closed,
    /// The frontend broke the framing or the bounds.
    #[error("{0}")]
    Protocol(String),
    /// A socket call failed.
    #[error("socket: {0}")]
    Io(io::Error),
}

// The cause is in the message; it is not also a `source()`, so a printed
// chain does not say it twice.
impl From<io::Error> for RelayError {
    fn from(e: io::Error) -> RelayError {
        RelayError::Io(e)
    }
}

/// What a relay held: a message begun and its fds, replies not yet read.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedRelay {
    pub(super) pending: Vec<u8>,
    pub(super) fds: Vec<FdRef>,
    pub(super) unread: Vec<u8>,
}

/// One whole message from the frontend.
pub struct Message {
    /// Header and body.
    pub bytes: Vec<u8>,
    /// File descriptors that came with it.
    pub fds: Vec<OwnedFd>,
}

impl Message {
    /// The request code.
    pub fn request(&self) -> u32 {
        word(&self.bytes, 0)
    }
}

/// A little-endian `u32` at `i` (the caller checked the length).
pub fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The relay of one connection.
pub struct Relay {
    frontend: UnixStream,
    /// Our end of the pair; the handler has the other.
    inner: UnixStream,
    pending: Vec<u8>,
    fds: Vec<OwnedFd>,
    started: Option<Instant>,
    unread: Vec<u8>,
    unread_since: Option<Instant>,
}

impl Relay {
    /// A relay for `frontend`; returns it and the stream to give the handler.
    pub fn new(frontend: UnixStream) -> io::Result<(Relay, UnixStream)> {
        frontend.set_nonblocking(true)?;
        let (inner, handler_side) = UnixStream::pair()?;
        inner.set_nonblocking(true)?;
        // The handler only ever reads messages that are already whole; the
        // timeouts are a second line, never expected to fire.
        handler_side.set_read_timeout(Some(Duration::from_secs(1)))?;
        handler_side.set_write_timeout(Some(Duration::from_secs(1)))?;
        Ok((
            Relay {
                frontend,
                inner,
                pending: Vec::with_capacity(HEADER_LEN),
                fds: Vec::new(),
                started: None,
                unread: Vec::new(),
                unread_since: None,
            },
            handler_side,
        ))
    }

    /// The frontend's socket (to watch).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.frontend.as_fd()
    }

    /// Bytes still missing from the message being received.
    fn missing(&self) -> usize {
        if self.pending.len() < HEADER_LEN {
            return HEADER_LEN - self.pending.len();
        }
        HEADER_LEN + word(&self.pending, 8) as usize - self.pending.len()
    }

    /// Reads what the frontend has sent (never blocking) and returns the
    /// messages it completed, in order: at most [`MESSAGES_PER_WAKE`].
    pub fn receive(&mut self) -> Result<Vec<Message>, RelayError> {
        let mut out = Vec::new();
        while out.len() < MESSAGES_PER_WAKE {
            let want = self.missing();
            let start = self.pending.len();
            self.pending.resize(start + want, 0);
            // Exactly the rest of this message: the next one's bytes (and
            // its descriptors) stay in the socket.
            let got = {
                let mut iov = [IoSliceMut::new(&mut self.pending[start..])];
                let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
                match recvmsg::<UnixAddr>(
                    self.frontend.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
                ) {
                    Ok(m) => {
                        if m.flags.contains(MsgFlags::MSG_CTRUNC) {
                            return Err(RelayError::Protocol(format!(
                                "more than {MAX_FDS} file descriptors with one message"
                            )));
                        }
                        for c in m.cmsgs().map_err(io::Error::from)? {
                            if let ControlMessageOwned::ScmRights(fds) = c {
                                for fd in fds {
                                    // SAFETY: the kernel just installed this
                                    // descriptor in our table for us.
                                    self.fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                                }
                            }
                        }
                        m.bytes
                    }
                    Err(nix::errno::Errno::EAGAIN) => {
                        self.pending.truncate(start);
                        return Ok(out);
                    }
                    Err(nix::errno::Errno::EINTR) => {
                        self.pending.truncate(start);
                        continue;
                    }
                    Err(e) => return Err(RelayError::Io(e.into())),
                }
            };
            self.pending.truncate(start + got);
            if got == 0 {
                return Err(RelayError::Closed);
            }
            self.started.get_or_insert_with(Instant::now);
            if self.fds.len() > MAX_FDS {
                return Err(RelayError::Protocol(format!(
                    "more than {MAX_FDS} file descriptors with one message"
                )));
            }
            if self.pending.len() == HEADER_LEN {
                let size = word(&self.pending, 8) as usize;
                if size > MAX_BODY {
                    return Err(RelayError::Protocol(format!(
                        "message body of {size} bytes (at most {MAX_BODY})"
                    )));
                }
            }
            if self.pending.len() >= HEADER_LEN && self.missing() == 0 {
                out.push(Message {
                    bytes: std::mem::replace(&mut self.pending, Vec::with_capacity(HEADER_LEN)),
                    fds: std::mem::take(&mut self.fds),
                });
                self.started = None;
            }
        }
        Ok(out)
    }

    /// Hands a whole message to the handler, with its descriptors.
    pub fn forward(&mut self, msg: &Message) -> io::Result<()> {
        let raw: Vec<RawFd> = msg.fds.iter().map(AsRawFd::as_raw_fd).collect();
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
        let iov = [IoSlice::new(&msg.bytes)];
        // At most 4 KiB into an empty pair (replies are drained after every
        // message): it fits at once.
        let n = sendmsg::<UnixAddr>(
            self.inner.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        if n != msg.bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the handler's socket took part of a message",
            ));
        }
        Ok(())
    }

    /// Sends `bytes` (a reply this side made) to the frontend, after what
    /// is still unread.
    pub fn reply(&mut self, bytes: &[u8]) -> Result<(), RelayError> {
        self.unread.extend_from_slice(bytes);
        self.flush()
    }

    /// Moves the handler's replies to the frontend, as far as it reads them.
    pub fn flush(&mut self) -> Result<(), RelayError> {
        let mut buf = [0u8; 4096];
        loop {
            match (&self.inner).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.unread.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        while !self.unread.is_empty() {
            match nix::sys::socket::send(
                self.frontend.as_raw_fd(),
                &self.unread,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(n) => {
                    self.unread.drain(..n);
                }
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                    return Err(RelayError::Closed)
                }
                Err(e) => return Err(RelayError::Io(e.into())),
            }
        }
        if self.unread.is_empty() {
            self.unread_since = None;
        } else {
            self.unread_since.get_or_insert_with(Instant::now);
            if self.unread.len() > MAX_UNREAD_REPLIES {
                return Err(RelayError::Protocol(format!(
                    "the frontend left {} bytes of replies unread",
                    self.unread.len()
                )));
            }
        }
        Ok(())
    }

    /// Hands the handler a message this side made (a takeover replays the
    /// messages that set the handler's own state), and drops its reply:
    /// the frontend never sees either.
    pub fn replay(&mut self, bytes: Vec<u8>) -> io::Result<()> {
        self.forward(&Message {
            bytes,
            fds: Vec::new(),
        })
    }

    /// Drops what the handler wrote back (the replies to [`Relay::replay`]).
    pub fn drop_replies(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 4096];
        loop {
            match (&self.inner).read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// What the relay holds between the frontend and the handler, for a
    /// takeover: a message begun and its fds, replies not yet read.
    pub fn save(&self, fds: &mut FdOut) -> SavedRelay {
        SavedRelay {
            pending: self.pending.clone(),
            fds: self.fds.iter().map(|f| fds.add(f.as_fd())).collect(),
            unread: self.unread.clone(),
        }
    }

    /// Takes up what another process's relay held ([`Relay::save`]): the
    /// rest of the message follows in the socket, the replies go out next.
    pub fn restore(&mut self, saved: SavedRelay, fds: &mut FdIn) -> Result<(), TakeoverError> {
        if saved.pending.len() > HEADER_LEN + MAX_BODY || saved.fds.len() > MAX_FDS {
            return Err(TakeoverError::Invalid(format!(
                "a relay holding {} bytes and {} fds",
                saved.pending.len(),
                saved.fds.len()
            )));
        }
        self.fds = saved
            .fds
            .into_iter()
            .map(|i| fds.take(i))
            .collect::<Result<_, _>>()?;
        if !saved.pending.is_empty() {
            self.started = Some(Instant::now());
        }
        self.pending = saved.pending;
        if !saved.unread.is_empty() {
            self.unread_since = Some(Instant::now());
        }
        self.unread = saved.unread;
        Ok(())
    }

    /// When the relay needs the control thread again: the deadline of a
    /// message being received, or a soon retry of replies the frontend has
    /// not taken yet.
    pub fn deadline(&self) -> Option<Instant> {
        let msg = self.started.map(|t| t + MESSAGE_DEADLINE);
        let replies = self
            .unread_since
            .map(|_| Instant::now() + Duration::from_millis(50));
        match (msg, replies) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Checks the deadlines at `now`: an error when a message or the
    /// frontend's reading of replies is overdue.
    pub fn check(&mut self, now: Instant) -> Result<(), RelayError> {
        if let Some(t) = self.started {
            if now >= t + MESSAGE_DEADLINE {
                return Err(RelayError::Protocol(format!(
                    "a message still missing {} bytes {MESSAGE_DEADLINE:?} after it began",
                    self.missing()
                )));
            }
        }
        if let Some(t) = self.unread_since {
            self.flush()?;
            if !self.unread.is_empty() && now >= t + MESSAGE_DEADLINE {
                return Err(RelayError::Protocol(format!(
                    "the frontend did not read {} bytes of replies in {MESSAGE_DEADLINE:?}",
                    self.unread.len()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn header(req: u32, size: u32) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&req.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        h
    }

    #[test]
    fn messages_are_whole_before_they_go_on_and_fds_follow_them() {
        let (mut peer, ours) = UnixStream::pair().unwrap();
        let (mut relay, mut handler) = Relay::new(ours).unwrap();
        // A header dribbled in pieces, then its body: nothing until whole.
        let mut msg = header(1, 8);
        msg.extend_from_slice(&7u64.to_le_bytes());
        peer.write_all(&msg[..3]).unwrap();
        assert!(relay.receive().unwrap().is_empty());
        assert!(relay.deadline().is_some(), "a message has begun");
        peer.write_all(&msg[3..14]).unwrap();
        assert!(relay.receive().unwrap().is_empty());
        // The rest, and a second message with a descriptor in the same read.
        peer.write_all(&msg[14..]).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let second = header(2, 0);
        let raw = [file.as_raw_fd()];
        sendmsg::<UnixAddr>(
            peer.as_raw_fd(),
            &[IoSlice::new(&second)],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let got = relay.receive().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].bytes, msg);
        assert!(
            got[0].fds.is_empty(),
            "the second message's fd stays with it"
        );
        assert_eq!((got[1].request(), got[1].fds.len()), (2, 1));
        assert!(relay.deadline().is_none());
        // Forwarded whole, as a frontend sends it.
        relay.forward(&got[0]).unwrap();
        let mut buf = vec![0u8; msg.len()];
        handler.read_exact(&mut buf).unwrap();
        assert_eq!(buf, msg);
        // Replies reach the frontend.
        handler.write_all(b"reply").unwrap();
        relay.flush().unwrap();
        let mut r = [0u8; 5];
        peer.read_exact(&mut r).unwrap();
        assert_eq!(&r, b"reply");
    }

    #[test]
    fn a_flood_is_taken_a_few_messages_per_wake() {
        let (mut peer, ours) = UnixStream::pair().unwrap();
        let (mut relay, _handler) = Relay::new(ours).unwrap();
        for _ in 0..(MESSAGES_PER_WAKE * 2 + 1) {
            peer.write_all(&header(1, 0)).unwrap();
        }
        assert_eq!(relay.receive().unwrap().len(), MESSAGES_PER_WAKE);
        assert_eq!(relay.receive().unwrap().len(), MESSAGES_PER_WAKE);
        assert_eq!(relay.receive().unwrap().len(), 1);
    }

    #[test]
    fn bounds_and_deadlines_cost_the_connection() {
        let (mut peer, ours) = UnixStream::pair().unwrap();
        let (mut relay, _handler) = Relay::new(ours).unwrap();
        peer.write_all(&header(1, (MAX_BODY + 1) as u32)).unwrap();
        assert!(matches!(relay.receive(), Err(RelayError::Protocol(_))));

        let (mut peer, ours) = UnixStream::pair().unwrap();
        let (mut relay, _handler) = Relay::new(ours).unwrap();
        peer.write_all(&header(1, 8)[..4]).unwrap();
        relay.receive().unwrap();
        let t = relay.deadline().unwrap();
        assert!(relay.check(t - Duration::from_millis(1)).is_ok());
        assert!(matches!(relay.check(t), Err(RelayError::Protocol(_))));

        let (peer, ours) = UnixStream::pair().unwrap();
        let (mut relay, _handler) = Relay::new(ours).unwrap();
        drop(peer);
        assert!(matches!(relay.receive(), Err(RelayError::Closed)));

        // A frontend that never reads its replies.
        let (_peer, ours) = UnixStream::pair().unwrap();
        let (mut relay, _handler) = Relay::new(ours).unwrap();
        let chunk = vec![0u8; 16 * 1024];
        let mut res = Ok(());
        for _ in 0..256 {
            res = relay.reply(&chunk);
            if res.is_err() {
                break;
            }
        }
        assert!(matches!(res, Err(RelayError::Protocol(_))), "{res:?}");
    }
}
