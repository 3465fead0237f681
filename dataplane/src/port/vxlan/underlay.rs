//! The underlay: one UDP socket per local VTEP address and port, which
//! every tunnel from that address shares, as the kernel's own VXLAN does
//! (one socket per port) and as VPP's `vxlan4-input` does (one node reads
//! the underlay and finds the tunnel by source and VNI).
//!
//! The tunnels using a socket are its members, in the order they joined.
//! The first holds the socket's one receive queue, which reads for every
//! member ([`super::queues::VxlanRx`]: each frame is given to its tunnel's
//! port by source address and VNI); when it leaves, the next member takes
//! the queue up. Every member has transmit queues of its own on the socket.

use super::*;

/// The tunnels of a socket by (remote address, VNI): what its receive
/// queue reads to find a frame's port, and the longest frame the tunnel's
/// path carries ([`TunnelEnd::max_frame`]).
pub(super) type Tunnels = HashMap<(IpAddr, u32), (PortId, Arc<AtomicU32>)>;

/// A socket and the tunnels that use it.
pub(super) struct Underlay {
    pub(super) socket: Arc<OwnedFd>,
    pub(super) tunnels: Arc<RwLock<Tunnels>>,
    /// In joining order; the first holds the receive queue.
    members: Mutex<Vec<Member>>,
}

/// A tunnel using the socket, as the socket needs it to hand its queues
/// over: its port's link to the workers and its remote end.
pub(super) struct Member {
    pub(super) id: PortId,
    pub(super) name: String,
    pub(super) link: QueueLink,
    pub(super) end: TunnelEnd,
}

/// The sockets open, by local address and port: tunnels of the same
/// address share one.
fn open_sockets() -> &'static Mutex<HashMap<SocketAddr, Weak<Underlay>>> {
    static R: OnceLock<Mutex<HashMap<SocketAddr, Weak<Underlay>>>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a tunnel cannot use the socket.
#[derive(Debug, thiserror::Error)]
pub(super) enum UnderlayError {
    #[error("{0} is no address of this host (the local VTEP address must be one)")]
    NotLocal(IpAddr),
    #[error(
        "UDP port {1} on {0} is taken by another socket (a kernel vxlan device on the same port?)"
    )]
    InUse(IpAddr, u16),
    #[error("another tunnel, {0}, goes to {1} with VNI {2}")]
    Duplicate(String, IpAddr, u32),
    #[error("the socket handed over is not a UDP socket bound to {0}")]
    NotOurs(SocketAddr),
    #[error("UDP socket on {0}: {1}")]
    Io(SocketAddr, io::Error),
}

/// The socket for `local`, shared with the tunnels already on it; else a
/// new one, bound there (or `handed`, a socket another switch bound there
/// and handed over in a takeover).
pub(super) fn join(
    local: SocketAddr,
    handed: Option<OwnedFd>,
) -> Result<Arc<Underlay>, UnderlayError> {
    let mut r = lock(open_sockets());
    r.retain(|_, u| u.strong_count() > 0);
    if let Some(u) = r.get(&local).and_then(Weak::upgrade) {
        return Ok(u);
    }
    let socket = match handed {
        Some(fd) => adopt(local, fd)?,
        None => open(local)?,
    };
    let u = Arc::new(Underlay {
        socket: Arc::new(socket),
        tunnels: Arc::default(),
        members: Mutex::default(),
    });
    r.insert(local, Arc::downgrade(&u));
    Ok(u)
}

/// A UDP socket bound to `local`, set up for tunnels: non-blocking, never
/// fragmenting what it sends (`IP_PMTUDISC_DO`: a packet over the path's
/// MTU fails rather than goes out in pieces), with large buffers.
pub(super) fn open(local: SocketAddr) -> Result<OwnedFd, UnderlayError> {
    let s = std::net::UdpSocket::bind(local).map_err(|e| match e.raw_os_error() {
        Some(libc::EADDRNOTAVAIL) => UnderlayError::NotLocal(local.ip()),
        Some(libc::EADDRINUSE) => UnderlayError::InUse(local.ip(), local.port()),
        _ => UnderlayError::Io(local, e),
    })?;
    let io = |e: io::Error| UnderlayError::Io(local, e);
    s.set_nonblocking(true).map_err(io)?;
    let fd = OwnedFd::from(s);
    let (level, opt, val) = if local.is_ipv4() {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    };
    setsockopt_int(&fd, level, opt, val).map_err(io)?;
    receive_coalesced(&fd);
    // Room for bursts: forced past the system's limits where the switch
    // may (CAP_NET_ADMIN), else as large as they allow.
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt_int(&fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
            let _ = setsockopt_int(&fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
        }
    }
    Ok(fd)
}

/// Takes up the socket another switch opened with [`open`].
fn adopt(local: SocketAddr, fd: OwnedFd) -> Result<OwnedFd, UnderlayError> {
    use nix::sys::socket::{getsockopt, sockopt, SockType};
    let datagram = getsockopt(&fd, sockopt::SockType).ok() == Some(SockType::Datagram);
    let s = std::net::UdpSocket::from(fd);
    if !datagram || s.local_addr().ok() != Some(local) {
        return Err(UnderlayError::NotOurs(local));
    }
    let fd = OwnedFd::from(s);
    // A switch before this option handed it over without.
    receive_coalesced(&fd);
    Ok(fd)
}

/// `UDP_GRO` (linux/udp.h): the kernel may give a socket a run of
/// datagrams of one size from one source as one message, with the size in
/// a control message. `UDP_SEGMENT`: a message sent is cut into datagrams
/// of the size it gives, after the stack.
pub(super) const UDP_GRO: libc::c_int = 104;
pub(super) const UDP_SEGMENT: libc::c_int = 103;

/// Asks the kernel to hand the socket coalesced runs of datagrams
/// (`UDP_GRO`, Linux 5.0): one message through the stack for a run, which
/// the receive queue cuts up ([`super::queues`]). Without it (an older
/// kernel), datagrams come one by one, as the queue also reads them.
fn receive_coalesced(fd: &OwnedFd) {
    let _ = setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1);
}

fn setsockopt_int(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: an int option, passed by pointer with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Underlay {
    /// Adds tunnel `m` and hands its queues to the workers: transmit
    /// queues, and the socket's receive queue if no other tunnel holds it.
    pub(super) fn add(&self, m: Member) -> Result<(), UnderlayError> {
        let key = (m.end.remote.ip(), m.end.vni);
        let mut members = lock(&self.members);
        if let Some(other) = members
            .iter()
            .find(|o| (o.end.remote.ip(), o.end.vni) == key)
        {
            return Err(UnderlayError::Duplicate(other.name.clone(), key.0, key.1));
        }
        self.tunnels
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (m.id, m.end.max_frame.clone()));
        m.link.attach(self.queues(&m.end, members.is_empty()));
        members.push(m);
        Ok(())
    }

    /// Takes tunnel `id` out: frames from its remote end go nowhere from
    /// now on, its queues are taken back (`detach`, which waits for the
    /// workers), and if it held the receive queue the next tunnel takes it
    /// up.
    pub(super) fn remove(&self, id: PortId, detach: impl FnOnce()) {
        let mut members = lock(&self.members);
        let Some(i) = members.iter().position(|m| m.id == id) else {
            detach();
            return;
        };
        let m = members.remove(i);
        self.tunnels
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(m.end.remote.ip(), m.end.vni));
        detach();
        if i == 0 {
            if let Some(next) = members.first() {
                next.link.attach(self.queues(&next.end, true));
            }
        }
    }

    /// Whether tunnel `id` holds the receive queue.
    pub(super) fn reads_for(&self, id: PortId) -> bool {
        lock(&self.members).first().is_some_and(|m| m.id == id)
    }

    /// A tunnel's queues: a transmit queue per worker, and the receive
    /// queue if `reader`.
    fn queues(&self, end: &TunnelEnd, reader: bool) -> PortQueues {
        let mut q = PortQueues::default();
        if reader {
            q.rx.push(Box::new(VxlanRx::new(
                self.socket.clone(),
                self.tunnels.clone(),
            )));
        }
        for _ in 0..end.workers.max(1) {
            q.tx.push(Box::new(VxlanTx::new(self.socket.clone(), end)));
        }
        q
    }
}

/// The largest packet a tunnel from `local` to `remote` may send: the
/// path's MTU as the kernel's routing says (`IP_MTU` of a UDP socket
/// connected there). An error: no route.
pub(super) fn path_mtu(local: SocketAddr, remote: SocketAddr) -> io::Result<u32> {
    let s = std::net::UdpSocket::bind(SocketAddr::new(local.ip(), 0))?;
    s.connect(remote)?;
    let (level, opt) = if remote.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int option read into `mtu`, of the size given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(mtu).unwrap_or(0))
}
