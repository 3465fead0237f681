//! The socket end of every socket port kind: the switch either listens (it
//! creates the socket: memif master, vhost-user server; see
//! [`super::listener`], which listens through [`listen`]) or connects with
//! a [`Connector`] and retries every [`RETRY_INTERVAL`] until a peer is
//! there, and again after it goes away (memif slave, vhost-user client).
//! The control socket binds through the same [`listen`].
//!
//! Nothing here blocks the control thread: sockets are non-blocking, and a
//! connect to a listener whose backlog is full fails with `EAGAIN` and is
//! retried instead of waiting for room.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, connect as nix_connect, listen as nix_listen, socket, AddressFamily, Backlog,
    SockFlag, SockType, UnixAddr,
};

use switchyard_api::SocketAddr;

/// How long a connecting endpoint waits between attempts.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// The kernel's form of `addr`. An abstract name's length is sun_family +
/// NUL + name, as VPP, libmemif and DPDK use.
pub(super) fn unix_addr(addr: &SocketAddr) -> io::Result<UnixAddr> {
    Ok(match addr {
        SocketAddr::Path(p) => UnixAddr::new(p.as_path())?,
        SocketAddr::Abstract(n) => UnixAddr::new_abstract(n.as_bytes())?,
    })
}

/// Refuses a socket path that is a symbolic link: a pod may write in its
/// own socket directory, and a link there could send the switch to any
/// socket on the host. `config::confine_socket` calls it where a socket is
/// named, and [`connect`] again before each attempt (a peer could have
/// swapped the socket since).
pub fn refuse_symlink(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the socket is a symbolic link",
        )),
        _ => Ok(()),
    }
}

fn new_socket(ty: SockType) -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        ty,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?)
}

/// Connects a socket of type `ty` to `addr` without blocking (a link at a
/// path is refused). The socket is left non-blocking.
pub fn connect(ty: SockType, addr: &SocketAddr) -> io::Result<OwnedFd> {
    if let Some(p) = addr.path() {
        refuse_symlink(p)?;
    }
    let fd = new_socket(ty)?;
    nix_connect(fd.as_raw_fd(), &unix_addr(addr)?)?;
    Ok(fd)
}

/// Binds and listens (non-blocking). A stale socket file (a connect is
/// refused: nobody listens) is replaced; any other socket is `AddrInUse`,
/// never unlinked (a listener of another socket type answers a connect
/// with `EPROTOTYPE`, one we may not reach with `EACCES`); a path that is
/// not a socket (a link included) is `AlreadyExists`. The file gets
/// `mode`, then group `group` with mode 0660 if given.
pub fn listen(
    ty: SockType,
    addr: &SocketAddr,
    mode: Option<u32>,
    group: Option<u32>,
) -> io::Result<OwnedFd> {
    if let Some(path) = addr.path() {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "path exists and is not a socket",
                ));
            }
            // Only a refused connect proves nobody listens: a listener with
            // a full backlog answers `EAGAIN`, one of another socket type
            // (a stream socket, such as the control socket, to a seqpacket
            // connect) `EPROTOTYPE`.
            match connect(ty, addr) {
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    std::fs::remove_file(path)?
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                _ => return Err(in_use()),
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
    }
    let fd = new_socket(ty)?;
    bind(fd.as_raw_fd(), &unix_addr(addr)?)?;
    if let Some(path) = addr.path() {
        use std::os::unix::fs::PermissionsExt;
        if let Some(m) = mode {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(m))?;
        }
        if let Some(gid) = group {
            switchyard_api::fs::share_with_group(path, gid, 0o660)?;
        }
    }
    nix_listen(&fd, Backlog::new(16).map_err(io::Error::from)?)?;
    Ok(fd)
}

fn in_use() -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        "in use by another process: something listens on this socket",
    )
}

/// Accepts one pending connection (non-blocking), if any.
pub fn accept(listener: impl AsFd) -> io::Result<Option<OwnedFd>> {
    match accept4(
        listener.as_fd().as_raw_fd(),
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    ) {
        // SAFETY: accept4 returned a new fd that nothing else owns.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The connecting end of a port's socket: one attempt at a time, the next
/// [`RETRY_INTERVAL`] after a failure or after the peer went away.
pub struct Connector {
    ty: SockType,
    addr: SocketAddr,
    retry_at: Option<Instant>,
}

impl Connector {
    /// A connector of socket type `ty` to `addr`.
    pub fn new(ty: SockType, addr: SocketAddr) -> Connector {
        Connector {
            ty,
            addr,
            retry_at: None,
        }
    }

    /// Where the socket is.
    pub fn address(&self) -> &SocketAddr {
        &self.addr
    }

    /// One connection attempt; a failure schedules the next one.
    pub fn connect(&mut self) -> io::Result<OwnedFd> {
        self.retry_at = None;
        connect(self.ty, &self.addr).inspect_err(|_| self.lost())
    }

    /// The peer went away (or could not be used): try again after
    /// [`RETRY_INTERVAL`].
    pub fn lost(&mut self) {
        self.retry_at = Some(Instant::now() + RETRY_INTERVAL);
    }

    /// Whether a connection attempt is due.
    pub fn retry_due(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|t| now >= t)
    }

    /// When the next connection attempt is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Stops retrying.
    pub fn stop(&mut self) {
        self.retry_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `listen` at `addr` once the listener just dropped there is closed
    /// everywhere. Other tests in this process spawn commands, and a child
    /// holds a copy of every fd (this listener too) from its fork to its
    /// exec: in that window the socket still answers, and is rightly in use.
    fn listen_once_closed(ty: SockType, addr: &SocketAddr) -> OwnedFd {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match listen(ty, addr, None, None) {
                Ok(l) => return l,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("a stale socket was not replaced: {e}"),
            }
        }
    }

    #[test]
    fn stale_sockets_are_replaced_and_live_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::Path(dir.path().join("s.sock"));
        for ty in [SockType::SeqPacket, SockType::Stream] {
            let l = listen(ty, &addr, Some(0o600), None).unwrap();
            let _c = connect(ty, &addr).unwrap();
            assert!(accept(&l).unwrap().is_some());
            let e = listen(ty, &addr, None, None).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
            drop(l);
            let l = listen_once_closed(ty, &addr);
            drop(l);
        }
        // A link is neither followed by a connect nor replaced by a listen.
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(dir.path().join("s.sock"), &link).unwrap();
        let link = SocketAddr::Path(link);
        let e = connect(SockType::Stream, &link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let e = listen(SockType::Stream, &link, None, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        // So is a file that is not a socket.
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let e = listen(
            SockType::Stream,
            &SocketAddr::Path(dir.path().join("f")),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn a_listener_with_a_full_backlog_is_alive_and_connects_never_wait() {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::Path(dir.path().join("full.sock"));
        let l = listen(SockType::SeqPacket, &addr, None, None).unwrap();
        // Nobody accepts: fill the backlog until a connect would wait.
        let mut held = Vec::new();
        let full = loop {
            match connect(SockType::SeqPacket, &addr) {
                Ok(c) => held.push(c),
                Err(e) => break e,
            }
            assert!(held.len() < 1000, "the backlog never filled");
        };
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
        // Alive, so not replaced as stale.
        let e = listen(SockType::SeqPacket, &addr, None, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(l);
    }

    #[test]
    fn abstract_sockets_work() {
        let addr = SocketAddr::parse(&format!("@switchyard-test-{}", std::process::id()));
        let l = listen(SockType::SeqPacket, &addr, None, None).unwrap();
        let _c = connect(SockType::SeqPacket, &addr).unwrap();
        assert!(accept(&l).unwrap().is_some());
    }
}
