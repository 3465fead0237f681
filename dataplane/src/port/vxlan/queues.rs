//! A socket's receive queue, which reads for every tunnel on it, and a
//! tunnel's transmit queues.

use super::*;

/// Bytes of a receive buffer: the largest UDP datagram. A frame longer
/// than its path carries can arrive whole from a sender's segmentation
/// offload (see `Offload::super_frame_in`), 64 KB with its headers.
const RX_BUF: usize = 64 * 1024 + 64;
/// The longest frame a tunnel sends, whatever its path allows: a jumbo
/// frame (9216 bytes, a VLAN tag included).
pub(super) const MAX_FRAME: usize = 9216 + 4;
/// Bytes of a transmit queue's batch: frames wait there, each behind its
/// header, until the flush sends them all in one call.
const TX_BATCH_BYTES: usize = 64 * 1024;

/// Where a tunnel goes, as its queues need it.
#[derive(Clone)]
pub(super) struct TunnelEnd {
    /// The remote VTEP's address and UDP port.
    pub(super) remote: SocketAddr,
    pub(super) vni: u32,
    /// The longest frame (Ethernet header included) a packet to `remote`
    /// may carry: the path's MTU less the IP, UDP and VXLAN headers.
    pub(super) max_frame: Arc<AtomicU32>,
    /// Transmit queues to make (one per worker).
    pub(super) workers: usize,
}

/// The receive side of a socket: reads every tunnel's packets and gives
/// each frame to its tunnel's port ([`RxBurst::commit_from`]), grouped by
/// port; frames from no tunnel's remote end and VNI, and datagrams that are
/// no VXLAN packet, are counted and dropped.
pub(super) struct VxlanRx {
    socket: Arc<OwnedFd>,
    tunnels: Arc<RwLock<Tunnels>>,
    bufs: Box<[u8]>,
    /// Each datagram's source, as `recvmmsg` writes it.
    from: Box<[libc::sockaddr_storage; BURST_SIZE]>,
}

// SAFETY: `sockaddr_storage` is plain data; the queue is used by one
// worker at a time.
unsafe impl Send for VxlanRx {}

impl VxlanRx {
    pub(super) fn new(socket: Arc<OwnedFd>, tunnels: Arc<RwLock<Tunnels>>) -> VxlanRx {
        VxlanRx {
            socket,
            tunnels,
            bufs: vec![0u8; RX_BUF * BURST_SIZE].into_boxed_slice(),
            // SAFETY: all zeros is a valid (empty) `sockaddr_storage`.
            from: Box::new(unsafe { std::mem::zeroed() }),
        }
    }

    /// Reads up to a burst of datagrams into the buffers; their lengths
    /// and whether each was truncated.
    fn receive(&mut self, lens: &mut [(usize, bool); BURST_SIZE]) -> usize {
        let n = BURST_SIZE;
        // SAFETY: all zeros is a valid `iovec`/`mmsghdr`, filled in below.
        let mut iov: [libc::iovec; BURST_SIZE] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BURST_SIZE] = unsafe { std::mem::zeroed() };
        let base = self.bufs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: slot `i` of `RX_BUF` bytes lies inside `bufs`.
            iov[i].iov_base = unsafe { base.add(i * RX_BUF) }.cast();
            iov[i].iov_len = RX_BUF;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = (&mut self.from[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
        // SAFETY: `n` headers, each naming one buffer of this queue and one
        // address slot, all alive and unaliased for the call.
        let got = unsafe {
            libc::recvmmsg(
                self.socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let got = usize::try_from(got).unwrap_or(0);
        for (l, m) in lens.iter_mut().zip(&msgs[..got]) {
            *l = (
                m.msg_len as usize,
                m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            );
        }
        got
    }
}

/// The IP address of a datagram's source.
fn source(a: &libc::sockaddr_storage) -> Option<IpAddr> {
    match libc::c_int::from(a.ss_family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a `sockaddr_in`, which
            // `sockaddr_storage` is large and aligned enough to hold.
            let v4 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(IpAddr::from(v4.sin_addr.s_addr.to_ne_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for `sockaddr_in6`.
            let v6 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(IpAddr::from(v6.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

impl RxQueue for VxlanRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let mut lens = [(0usize, false); BURST_SIZE];
        let got = self.receive(&mut lens);
        if got == 0 {
            return Ok(0);
        }
        // Each datagram's port, if it is a frame of a tunnel, and the
        // longest frame the tunnel's path carries.
        let mut port: [Option<PortId>; BURST_SIZE] = [None; BURST_SIZE];
        let mut max_frame = [0usize; BURST_SIZE];
        {
            let tunnels = self.tunnels.read().unwrap_or_else(|e| e.into_inner());
            for (i, &(len, truncated)) in lens[..got].iter().enumerate() {
                let data = &self.bufs[i * RX_BUF..i * RX_BUF + len.min(RX_BUF)];
                let vni = match vxlan::parse(data) {
                    Ok(vni) if !truncated => vni,
                    _ => {
                        burst.bad_tunnel += 1;
                        continue;
                    }
                };
                match source(&self.from[i]).and_then(|ip| tunnels.get(&(ip, vni))) {
                    Some((p, max)) => {
                        port[i] = Some(*p);
                        max_frame[i] = max.load(Ordering::Relaxed) as usize;
                    }
                    None => burst.unknown_tunnel += 1,
                }
            }
        }
        // Grouped by port, in the order each first appears; a port's
        // frames keep their order.
        for i in 0..got {
            let Some(p) = port[i] else { continue };
            for j in i..got {
                if port[j] != Some(p) {
                    continue;
                }
                port[j] = None;
                let slot = burst.next_slot();
                // SAFETY: the frame lies inside buffer `j` of this queue
                // (`len` bytes were written there, `len >= HEADER_LEN`),
                // which is not written again before the next `rx_burst`,
                // after the burst's release.
                unsafe {
                    slot.push(
                        self.bufs.as_ptr().add(j * RX_BUF + vxlan::HEADER_LEN),
                        (lens[j].0 - vxlan::HEADER_LEN) as u32,
                    )
                };
                // A sender's stack may have left the inner checksum to a
                // device that never came: over veths and the kernel's
                // forwarding the frame arrives as the sender's VXLAN
                // device wrote it (`CHECKSUM_PARTIAL`), with nothing to
                // say so. A checksum field holding the pseudo-header's sum
                // is finished where the frame goes.
                // A frame longer than the path carries came whole from a
                // sender's segmentation offload (see
                // `Offload::super_frame_in`): cut where it goes.
                let mut head = [0u8; MAX_HDR];
                let n = slot.read_prefix(&mut head);
                let len = lens[j].0 - vxlan::HEADER_LEN;
                if let Some(o) = Offload::inferred(&head[..n], len, max_frame[j]) {
                    slot.offload = o;
                }
                burst.commit_from(p);
            }
        }
        Ok(burst.len())
    }

    fn release(&mut self) {}

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }

    fn interrupt_is_eventfd(&self) -> bool {
        false
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        readable(self.socket.as_fd())
    }
}

/// A tunnel's transmit side: frames copied behind their VXLAN header into
/// a batch, sent with one `sendmmsg` at the flush (or when the batch is
/// full).
pub(super) struct VxlanTx {
    socket: Arc<OwnedFd>,
    /// The remote end's address, as `sendmmsg` takes it.
    to: libc::sockaddr_storage,
    to_len: libc::socklen_t,
    header: [u8; vxlan::HEADER_LEN],
    max_frame: Arc<AtomicU32>,
    /// Packets waiting, back to back; allocated at the first frame.
    batch: Vec<u8>,
    /// Where each waiting packet ends in `batch`.
    ends: Vec<usize>,
}

// SAFETY: `sockaddr_storage` is plain data.
unsafe impl Send for VxlanTx {}

/// `a` as the kernel takes a socket address.
fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all zeros is a valid `sockaddr_storage`.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            // SAFETY: a `sockaddr_in` fits in, and is aligned as, a
            // `sockaddr_storage`.
            let v4 = unsafe {
                &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            v4.sin_family = libc::AF_INET as libc::sa_family_t;
            v4.sin_port = a.port().to_be();
            v4.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for `sockaddr_in6`.
            let v6 = unsafe {
                &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            v6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            v6.sin6_port = a.port().to_be();
            v6.sin6_addr.s6_addr = a.ip().octets();
            v6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

impl VxlanTx {
    pub(super) fn new(socket: Arc<OwnedFd>, end: &TunnelEnd) -> VxlanTx {
        let (to, to_len) = sockaddr(end.remote);
        VxlanTx {
            socket,
            to,
            to_len,
            header: vxlan::header(end.vni),
            max_frame: end.max_frame.clone(),
            batch: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// Sends the waiting packets; those the kernel refuses are dropped (a
    /// full socket buffer, a path whose MTU shrank, no route).
    fn send(&mut self) {
        let mut start = 0;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BURST_SIZE];
        // SAFETY: all zeros is a valid `mmsghdr`, filled in below.
        let mut msgs: [libc::mmsghdr; BURST_SIZE] = unsafe { std::mem::zeroed() };
        let n = self.ends.len();
        for i in 0..n {
            let end = self.ends[i];
            // SAFETY: `start..end` lies inside `batch`.
            iov[i].iov_base = unsafe { self.batch.as_mut_ptr().add(start) }.cast();
            iov[i].iov_len = end - start;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = (&mut self.to as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen = self.to_len;
            start = end;
        }
        let mut sent = 0;
        while sent < n {
            // SAFETY: headers `sent..n`, each naming a packet in `batch`
            // and the destination, alive and unaliased for the call; the
            // kernel only reads them.
            let r = unsafe {
                libc::sendmmsg(
                    self.socket.as_raw_fd(),
                    msgs[sent..].as_mut_ptr(),
                    (n - sent) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            match usize::try_from(r) {
                Ok(k) if k > 0 => sent += k,
                _ => match io::Error::last_os_error().raw_os_error() {
                    // The socket's buffer is full: the rest wait no more.
                    Some(libc::EAGAIN | libc::ENOBUFS) => break,
                    // The packet at `sent` is refused (a path whose MTU
                    // shrank, no route): the rest are tried.
                    _ => sent += 1,
                },
            }
        }
        self.ends.clear();
        self.batch.clear();
    }
}

impl TxQueue for VxlanTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let len = frame.len();
        if len > (self.max_frame.load(Ordering::Relaxed) as usize).min(MAX_FRAME) {
            return Err(TxError::TooLong);
        }
        let need = vxlan::HEADER_LEN + len;
        if self.ends.len() == BURST_SIZE || self.batch.len() + need > TX_BATCH_BYTES {
            self.send();
        }
        if self.batch.capacity() == 0 {
            self.batch.reserve_exact(TX_BATCH_BYTES);
        }
        let at = self.batch.len();
        self.batch.extend_from_slice(&self.header);
        let spare = self.batch.spare_capacity_mut();
        debug_assert!(spare.len() >= len);
        // SAFETY: the batch has room for `len` more bytes (it holds
        // TX_BATCH_BYTES and was sent above unless `need` more fit; a frame
        // is at most `MAX_FRAME`, less than that), which the copy writes
        // before they are counted in.
        let copied = unsafe {
            let n = frame.reader().copy_to(spare.as_mut_ptr().cast(), len);
            self.batch.set_len(at + vxlan::HEADER_LEN + n);
            n
        };
        self.ends.push(at + vxlan::HEADER_LEN + copied);
        Ok(())
    }

    fn flush(&mut self) {
        if !self.ends.is_empty() {
            self.send();
        }
    }
}
