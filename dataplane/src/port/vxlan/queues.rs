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
/// Bytes of one message sent with `UDP_SEGMENT`: the largest UDP payload
/// over IPv4 (65535 less the IP and UDP headers), rounded down.
const GSO_BYTES: usize = 65_000;
/// Room for one control message of an `int` (`CMSG_SPACE(4)`), in words
/// so that it is aligned as a `cmsghdr`.
const CTRL_WORDS: usize = 4;

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
    /// Each message's source, as `recvmmsg` writes it.
    from: Box<[libc::sockaddr_storage; BURST_SIZE]>,
    /// Each message's control data (its `UDP_GRO` segment size).
    ctrl: Box<[[u64; CTRL_WORDS]; BURST_SIZE]>,
    /// The messages of the last `recvmmsg`: length, whether truncated, and
    /// the size of the datagrams coalesced in it (0: one datagram).
    msgs: [Message; BURST_SIZE],
    /// How many `msgs` holds.
    got: usize,
    /// The next datagram to give out: its message, and where in it it
    /// starts. A burst takes at most `BURST_SIZE` datagrams; the rest of a
    /// coalesced message waits for the next.
    next: (usize, usize),
}

/// A message `recvmmsg` returned.
#[derive(Clone, Copy, Default)]
struct Message {
    len: usize,
    truncated: bool,
    segment: usize,
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
            ctrl: Box::new([[0; CTRL_WORDS]; BURST_SIZE]),
            msgs: [Message::default(); BURST_SIZE],
            got: 0,
            next: (0, 0),
        }
    }

    /// Reads up to a burst of messages into the buffers (`msgs`).
    fn receive(&mut self) -> usize {
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
            msgs[i].msg_hdr.msg_control = self.ctrl[i].as_mut_ptr().cast();
            msgs[i].msg_hdr.msg_controllen = std::mem::size_of::<[u64; CTRL_WORDS]>();
        }
        // SAFETY: `n` headers, each naming one buffer of this queue, one
        // address slot and one control buffer, all alive and unaliased for
        // the call.
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
        for (out, m) in self.msgs.iter_mut().zip(&msgs[..got]) {
            *out = Message {
                len: (m.msg_len as usize).min(RX_BUF),
                truncated: m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                segment: gro_segment(&m.msg_hdr),
            };
        }
        self.got = got;
        self.next = (0, 0);
        got
    }

    /// The next datagram of the messages received: where it lies in
    /// `bufs`, its length, and its message's index. A truncated message is
    /// counted in `bad` and passed over.
    fn next_datagram(&mut self, bad: &mut u32) -> Option<(usize, usize, usize)> {
        while self.next.0 < self.got {
            let (i, at) = self.next;
            let m = self.msgs[i];
            if m.truncated {
                *bad += 1;
                self.next = (i + 1, 0);
                continue;
            }
            let len = if m.segment == 0 {
                m.len - at
            } else {
                m.segment.min(m.len - at)
            };
            self.next = if at + len >= m.len {
                (i + 1, 0)
            } else {
                (i, at + len)
            };
            return Some((i * RX_BUF + at, len, i));
        }
        None
    }
}

/// Has `h` cut into datagrams of `size` bytes after the stack
/// (`UDP_SEGMENT`), its control message written in `ctrl`, which must
/// outlive the send.
fn segmented(h: &mut libc::msghdr, ctrl: &mut [u64; CTRL_WORDS], size: u16) {
    h.msg_control = ctrl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE of a u16 is within the control buffer's words,
    // which the header now names; the first header is written inside it.
    unsafe {
        h.msg_controllen = libc::CMSG_SPACE(2) as usize;
        let c = libc::CMSG_FIRSTHDR(h);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = super::underlay::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
        libc::CMSG_DATA(c).cast::<u16>().write_unaligned(size);
    }
}

/// The size of the datagrams the kernel coalesced into a message
/// (`UDP_GRO`'s control message), or 0 for one datagram.
fn gro_segment(h: &libc::msghdr) -> usize {
    // SAFETY: `h` is a header `recvmmsg` filled in, its control buffer
    // alive and `msg_controllen` the bytes the kernel wrote there; the
    // CMSG_* functions stay inside it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP
                && (*c).cmsg_type == super::underlay::UDP_GRO
                && (*c).cmsg_len as usize >= libc::CMSG_LEN(4) as usize
            {
                let size = libc::CMSG_DATA(c).cast::<libc::c_int>().read_unaligned();
                return usize::try_from(size).unwrap_or(0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
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
        if self.next.0 >= self.got && self.receive() == 0 {
            return Ok(0);
        }
        // Up to a burst of datagrams: where each lies, its length and its
        // message (whose source it has).
        let mut dgrams = [(0usize, 0usize, 0usize); BURST_SIZE];
        let mut got = 0;
        while got < BURST_SIZE {
            let Some(d) = self.next_datagram(&mut burst.bad_tunnel) else {
                break;
            };
            dgrams[got] = d;
            got += 1;
        }
        // Each datagram's port, if it is a frame of a tunnel, and the
        // longest frame the tunnel's path carries.
        let mut port: [Option<PortId>; BURST_SIZE] = [None; BURST_SIZE];
        let mut max_frame = [0usize; BURST_SIZE];
        {
            let tunnels = self.tunnels.read().unwrap_or_else(|e| e.into_inner());
            for (i, &(at, len, msg)) in dgrams[..got].iter().enumerate() {
                let Ok(vni) = vxlan::parse(&self.bufs[at..at + len]) else {
                    burst.bad_tunnel += 1;
                    continue;
                };
                match source(&self.from[msg]).and_then(|ip| tunnels.get(&(ip, vni))) {
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
                let (at, len, _) = dgrams[j];
                let slot = burst.next_slot();
                // SAFETY: the frame lies inside `bufs` (datagram `j`, `len`
                // bytes the kernel wrote at `at`, `len >= HEADER_LEN`),
                // which is not written again before the next `recvmmsg`:
                // after this burst's release, and after every datagram of
                // these messages was given out.
                unsafe {
                    slot.push(
                        self.bufs.as_ptr().add(at + vxlan::HEADER_LEN),
                        (len - vxlan::HEADER_LEN) as u32,
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
                let len = len - vxlan::HEADER_LEN;
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
        self.next.0 < self.got || readable(self.socket.as_fd())
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
    /// Whether runs of packets go as one message (`UDP_SEGMENT`).
    segment: bool,
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
            segment: true,
        }
    }

    /// Sends the waiting packets; those the kernel refuses are dropped (a
    /// full socket buffer, a path whose MTU shrank, no route). A run of
    /// packets of one size (and a shorter one that ends it) goes as one
    /// message cut up after the stack (`UDP_SEGMENT`): one pass through
    /// the kernel's UDP and IP for the run, not one for each.
    fn send(&mut self) {
        let n = self.ends.len();
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BURST_SIZE];
        // SAFETY: all zeros is a valid `mmsghdr`, filled in below.
        let mut msgs: [libc::mmsghdr; BURST_SIZE] = unsafe { std::mem::zeroed() };
        let mut ctrl = [[0u64; CTRL_WORDS]; BURST_SIZE];
        let (mut m, mut i, mut start) = (0, 0, 0);
        while i < n {
            let size = self.ends[i] - start;
            let mut end = self.ends[i];
            let mut j = i + 1;
            while self.segment && j < n {
                let len = self.ends[j] - self.ends[j - 1];
                if len > size || end + len - start > GSO_BYTES {
                    break;
                }
                end = self.ends[j];
                j += 1;
                if len < size {
                    break;
                }
            }
            // SAFETY: `start..end` lies inside `batch`.
            iov[m].iov_base = unsafe { self.batch.as_mut_ptr().add(start) }.cast();
            iov[m].iov_len = end - start;
            let h = &mut msgs[m].msg_hdr;
            h.msg_iov = &mut iov[m];
            h.msg_iovlen = 1;
            h.msg_name = (&mut self.to as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = self.to_len;
            if j - i > 1 {
                segmented(h, &mut ctrl[m], size as u16);
            }
            m += 1;
            start = end;
            i = j;
        }
        let mut sent = 0;
        while sent < m {
            // SAFETY: headers `sent..m`, each naming packets in `batch`,
            // the destination and its control data, alive and unaliased
            // for the call; the kernel only reads them.
            let r = unsafe {
                libc::sendmmsg(
                    self.socket.as_raw_fd(),
                    msgs[sent..].as_mut_ptr(),
                    (m - sent) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            match usize::try_from(r) {
                Ok(k) if k > 0 => sent += k,
                _ => match io::Error::last_os_error().raw_os_error() {
                    // The socket's buffer is full: the rest wait no more.
                    Some(libc::EAGAIN | libc::ENOBUFS) => break,
                    // A path the kernel cannot segment for (IPsec): runs
                    // go packet by packet from now on.
                    Some(libc::EIO) if msgs[sent].msg_hdr.msg_controllen > 0 => {
                        self.segment = false;
                        sent += 1;
                    }
                    // The message at `sent` is refused (a path whose MTU
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::RxFrame;

    #[test]
    fn runs_go_as_one_message_and_come_out_frame_by_frame() {
        let local = |fd: &OwnedFd| {
            std::net::UdpSocket::from(fd.try_clone().unwrap())
                .local_addr()
                .unwrap()
        };
        let a = super::super::underlay::open("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = super::super::underlay::open("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = local(&b);
        let end = TunnelEnd {
            remote: to,
            vni: 42,
            max_frame: Arc::new(AtomicU32::new(1500)),
            workers: 1,
        };
        let mut tunnels = Tunnels::new();
        tunnels.insert((to.ip(), 42), (7 as PortId, Arc::new(AtomicU32::new(1500))));
        let mut tx = VxlanTx::new(Arc::new(a), &end);
        let mut rx = VxlanRx::new(Arc::new(b), Arc::new(RwLock::new(tunnels)));
        // A run of ten, a shorter frame that ends it, a run of three, and
        // one frame alone: three messages.
        let sizes = [[100; 10].as_slice(), &[60], &[200; 3], &[80]].concat();
        let frames: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|k| (i * 7 + k) as u8).collect())
            .collect();
        for f in &frames {
            tx.tx(&TxFrame::plain(&RxFrame::of(&[f]))).unwrap();
        }
        tx.flush();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut segments = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < frames.len() && Instant::now() < deadline {
            let mut burst = RxBurst::default();
            rx.rx_burst(&mut burst).unwrap();
            segments.extend(rx.msgs[..rx.got].iter().map(|m| m.segment));
            for f in burst.frames() {
                let s = f.single_segment().unwrap();
                // SAFETY: the burst is held.
                got.push(unsafe { std::slice::from_raw_parts(s.ptr(), s.len() as usize) }.to_vec());
            }
        }
        assert_eq!(got, frames);
        // The kernel handed the runs over coalesced: the first as it was
        // sent (ten of 100 bytes and their headers, and the shorter one),
        // in fewer messages than frames.
        assert_eq!(segments[0], 108, "{segments:?}");
        assert!(segments.len() <= 3, "{segments:?}");
    }

    #[test]
    fn a_message_of_more_datagrams_than_a_burst_is_given_out_over_bursts() {
        let a = super::super::underlay::open("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = super::super::underlay::open("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = std::net::UdpSocket::from(b.try_clone().unwrap())
            .local_addr()
            .unwrap();
        let mut tunnels = Tunnels::new();
        tunnels.insert((to.ip(), 5), (3, Arc::new(AtomicU32::new(1500))));
        let mut rx = VxlanRx::new(Arc::new(b), Arc::new(RwLock::new(tunnels)));
        // Forty datagrams in one message (a sender's UDP_SEGMENT, which
        // the kernel hands a UDP_GRO socket whole).
        let n = 40;
        let frames: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 60]).collect();
        let mut packets = Vec::new();
        for f in &frames {
            packets.extend_from_slice(&vxlan::header(5));
            packets.extend_from_slice(f);
        }
        let (addr, addr_len) = sockaddr(to);
        let mut iov = libc::iovec {
            iov_base: packets.as_mut_ptr().cast(),
            iov_len: packets.len(),
        };
        let mut ctrl = [0u64; CTRL_WORDS];
        // SAFETY: all zeros is a valid `msghdr`.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_name = (&addr as *const libc::sockaddr_storage).cast_mut().cast();
        h.msg_namelen = addr_len;
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        segmented(&mut h, &mut ctrl, (packets.len() / n) as u16);
        // SAFETY: every pointer in `h` names a live local.
        let sent = unsafe { libc::sendmsg(a.as_raw_fd(), &h, 0) };
        assert_eq!(sent, packets.len() as isize);
        let (mut got, mut bursts) = (Vec::new(), 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < frames.len() && Instant::now() < deadline {
            let mut burst = RxBurst::default();
            let k = rx.rx_burst(&mut burst).unwrap();
            bursts += usize::from(k > 0);
            if k > 0 {
                assert_eq!(rx.got, 1, "one message");
                assert!(rx.has_pending() == (got.len() + k < n));
            }
            for f in burst.frames() {
                let s = f.single_segment().unwrap();
                // SAFETY: the burst is held.
                got.push(unsafe { std::slice::from_raw_parts(s.ptr(), s.len() as usize) }.to_vec());
            }
        }
        assert_eq!(got, frames);
        assert_eq!(bursts, 2, "a burst, and the rest of the message");
    }
}
