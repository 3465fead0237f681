//! A memif peer written for the tests, in either role. It speaks the
//! protocol step by step (messages, sealed memfd regions, rings,
//! descriptors) so that a test can bend any step to attack the switch.
#![allow(dead_code)]

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use switchyard::port::memif::region::Region;
use switchyard::port::memif::ring::{Desc, Ring};
use switchyard::port::memif::socket;
use switchyard::port::socket::endpoint;
use switchyard_api::SocketAddr;

const SEQPACKET: nix::sys::socket::SockType = nix::sys::socket::SockType::SeqPacket;
use switchyard::wire::memif::{
    ring_bytes, FixedStr, Message, ADD_RING_FLAG_S2M, COOKIE, MAX_LOG2_RING_SIZE, MSG_SIZE, VERSION,
};

/// Ring size exponent of the test peer's rings (256 slots).
pub const LOG2: u8 = 8;
/// Slots per ring.
pub const SLOTS: u16 = 1 << LOG2;
/// Buffer size of the test peer (slave role).
pub const BUF: u32 = 2048;

const WAIT: Duration = Duration::from_secs(10);

/// One control connection (`SOCK_SEQPACKET`, non-blocking).
pub struct Conn {
    pub fd: OwnedFd,
}

impl Conn {
    /// Connects to a switch listening as master (retries for 10 s).
    pub fn connect(path: &str) -> Conn {
        let addr = SocketAddr::parse(path);
        let fd = super::wait_for(WAIT, "the switch's memif socket", || {
            endpoint::connect(SEQPACKET, &addr).ok()
        });
        Conn { fd }
    }

    /// Sends one message with an optional fd; false if the switch is gone.
    pub fn send(&self, m: &Message, fd: Option<RawFd>) -> bool {
        socket::send(self.fd.as_raw_fd(), &m.to_bytes(), fd).is_ok()
    }

    /// Sends raw bytes as one datagram (a truncated or made-up message).
    pub fn send_raw(&self, bytes: &[u8]) -> bool {
        use nix::sys::socket::{send, MsgFlags};
        send(self.fd.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL).is_ok()
    }

    /// The next message (and its fd) within 10 s; `Err` on EOF or timeout.
    pub fn recv(&self) -> Result<(Message, Option<OwnedFd>), String> {
        let end = Instant::now() + WAIT;
        loop {
            match socket::recv(self.fd.as_raw_fd()) {
                Ok(Some(r)) => {
                    return Message::parse(&r.buf[..r.len.min(MSG_SIZE)])
                        .map(|m| (m, r.fd))
                        .map_err(|e| e.to_string())
                }
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
            if Instant::now() > end {
                return Err("no message in 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits for the switch's DISCONNECT and returns its reason.
    pub fn refusal(&self) -> String {
        loop {
            match self.recv() {
                Ok((Message::Disconnect { reason, .. }, _)) => return reason.to_string_lossy(),
                Ok(_) => continue,
                Err(e) => panic!("expected a DISCONNECT from the switch: {e}"),
            }
        }
    }

    /// True once the switch closed the connection (EOF within 10 s).
    pub fn closed(&self) -> bool {
        loop {
            match self.recv() {
                Ok(_) => continue,
                Err(e) => return !e.starts_with("no message"),
            }
        }
    }
}

/// Writes `1` to an eventfd (a memif interrupt).
pub fn kick(fd: &OwnedFd) {
    let _ = nix::unistd::write(fd.as_fd(), &1u64.to_ne_bytes());
}

fn eventfd() -> OwnedFd {
    switchyard::eventfd::new_eventfd().expect("eventfd")
}

/// The memory a slave creates: region 0 holds the S2M ring, the M2S ring,
/// then `SLOTS` S2M buffers and `SLOTS` M2S buffers.
pub struct SlaveMem {
    pub region: Region,
    pub s2m: Ring,
    pub m2s: Ring,
    pub s2m_irq: OwnedFd,
    pub m2s_irq: OwnedFd,
}

impl SlaveMem {
    pub fn new() -> SlaveMem {
        SlaveMem::with(true)
    }

    /// The same in a region the slave can still shrink (not sealed).
    pub fn unsealed() -> SlaveMem {
        SlaveMem::with(false)
    }

    fn with(sealed: bool) -> SlaveMem {
        let ring = ring_bytes(LOG2);
        let size = 2 * ring + 2 * u64::from(SLOTS) * u64::from(BUF);
        let region = if sealed {
            Region::create("hostile-slave", size)
        } else {
            Region::create_unsealed("hostile-slave", size)
        }
        .expect("memfd region");
        // SAFETY: both rings lie inside the `size`-byte mapping at 8-aligned
        // offsets (0 and ring_bytes(8) = 4224); `region` outlives them as the
        // field next to them.
        let (s2m, m2s) = unsafe {
            (
                Ring::new(region.base(), LOG2),
                Ring::new(region.base().add(ring as usize), LOG2),
            )
        };
        s2m.set_cookie(COOKIE);
        m2s.set_cookie(COOKIE);
        SlaveMem {
            region,
            s2m,
            m2s,
            s2m_irq: eventfd(),
            m2s_irq: eventfd(),
        }
    }

    /// Offset of buffer `i` (S2M buffers are 0..SLOTS, M2S ones SLOTS..).
    pub fn buffer(&self, i: u32) -> u32 {
        (2 * ring_bytes(LOG2)) as u32 + i * BUF
    }

    pub fn size(&self) -> u64 {
        self.region.size()
    }

    /// The messages a well-behaved slave sends after HELLO, in order.
    pub fn script(&self) -> Vec<(Message, Option<RawFd>)> {
        let ring = |flags, offset, fd: &OwnedFd| {
            (
                Message::AddRing {
                    flags,
                    index: 0,
                    region: 0,
                    offset,
                    log2_ring_size: LOG2,
                    private_hdr_size: 0,
                },
                Some(fd.as_raw_fd()),
            )
        };
        vec![
            (
                Message::Init {
                    version: VERSION,
                    id: 0,
                    mode: 0,
                    secret: FixedStr::new(""),
                    name: FixedStr::new("hostile-slave"),
                },
                None,
            ),
            (
                Message::AddRegion {
                    index: 0,
                    size: self.size(),
                },
                Some(self.region.fd().as_raw_fd()),
            ),
            ring(ADD_RING_FLAG_S2M, 0, &self.s2m_irq),
            ring(0, ring_bytes(LOG2) as u32, &self.m2s_irq),
            (
                Message::Connect {
                    if_name: FixedStr::new("hostile0"),
                },
                None,
            ),
        ]
    }

    /// Puts `frame` on the S2M ring (a slave transmitting) and kicks the
    /// master. False when the ring is full: the master has not taken the
    /// frames before.
    pub fn send(&self, frame: &[u8]) -> bool {
        let head = self.s2m.head();
        if head.wrapping_sub(self.s2m.tail()) >= SLOTS {
            return false;
        }
        let slot = head % SLOTS;
        let offset = self.buffer(u32::from(slot));
        let len = frame.len().min(BUF as usize);
        // SAFETY: S2M buffer `slot` lies inside the region (`buffer` stays
        // below `size()` for slot < SLOTS) and holds BUF >= len bytes; the
        // master only reads it after the head store below.
        unsafe {
            std::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                self.region.base().add(offset as usize),
                len,
            );
        }
        self.s2m.set_desc(
            slot,
            Desc {
                flags: 0,
                region: 0,
                length: len as u32,
                offset,
            },
        );
        self.s2m.set_head(head.wrapping_add(1));
        kick(&self.s2m_irq);
        true
    }

    /// Posts every M2S buffer to the master, as a slave does once connected.
    pub fn post_m2s_buffers(&self) {
        for i in 0..SLOTS {
            self.m2s.set_desc(
                i,
                Desc {
                    flags: 0,
                    region: 0,
                    length: BUF,
                    offset: self.buffer(u32::from(SLOTS + i)),
                },
            );
        }
        self.m2s.set_head(SLOTS);
    }
}

/// Plays the slave side of the handshake: waits for HELLO, then sends each
/// step and waits for its answer. `Err` holds the switch's DISCONNECT reason
/// (or what went wrong instead).
pub fn run_slave(conn: &Conn, steps: &[(Message, Option<RawFd>)]) -> Result<(), String> {
    match conn.recv()? {
        (Message::Hello { .. }, _) => {}
        (m, _) => return Err(format!("expected HELLO, got {m:?}")),
    }
    for (m, fd) in steps {
        if !conn.send(m, *fd) {
            return Err("send failed".into());
        }
        match conn.recv()? {
            (Message::Ack, _) | (Message::Connected { .. }, _) => {}
            (Message::Disconnect { reason, .. }, _) => return Err(reason.to_string_lossy()),
            (m, _) => return Err(format!("unexpected {m:?}")),
        }
    }
    Ok(())
}

/// A listening socket for the switch (as slave) to connect to.
pub struct Listener {
    pub fd: OwnedFd,
    addr: SocketAddr,
}

impl Listener {
    pub fn bind(path: &str) -> Listener {
        let addr = SocketAddr::parse(path);
        Listener {
            fd: endpoint::listen(SEQPACKET, &addr, None, None).expect("listen"),
            addr,
        }
    }

    /// Waits up to 10 s for the switch to connect.
    pub fn accept(&self) -> Conn {
        let fd = super::wait_for(WAIT, "the switch to connect", || {
            endpoint::accept(&self.fd).ok().flatten()
        });
        Conn { fd }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(p) = self.addr.path() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The HELLO a well-behaved master sends (one queue pair).
pub fn hello() -> Message {
    Message::Hello {
        name: FixedStr::new("hostile-master"),
        min_version: VERSION,
        max_version: VERSION,
        max_region: 255,
        max_m2s_ring: 0,
        max_s2m_ring: 0,
        max_log2_ring_size: MAX_LOG2_RING_SIZE,
    }
}

/// The slave's memory as a master maps it.
pub struct MasterMem {
    pub region: Region,
    pub s2m: Ring,
    pub m2s: Ring,
    pub irqs: Vec<OwnedFd>,
}

/// Plays the master side of the handshake after sending `hello`: ACKs INIT,
/// the region and the rings, answers CONNECT with CONNECTED. Returns the
/// slave's memory, or the switch's DISCONNECT reason.
pub fn run_master(conn: &Conn, hello: &Message) -> Result<MasterMem, String> {
    if !conn.send(hello, None) {
        return Err("send failed".into());
    }
    let mut region = None;
    let mut rings: [Option<(u32, u8)>; 2] = [None, None];
    let mut irqs = Vec::new();
    loop {
        let (m, fd) = conn.recv()?;
        let reply = match m {
            Message::Init { .. } => Message::Ack,
            Message::AddRegion { size, .. } => {
                let fd = fd.ok_or("ADD_REGION without fd")?;
                // The switch seals the regions it creates: nothing to
                // watch, so the wire may go at once.
                let mut wire = switchyard::port::sigbus::Tripwire::new();
                let r = Region::from_peer(fd, size, &mut wire).map_err(|e| e.to_string())?;
                drop(wire);
                region = Some(r);
                Message::Ack
            }
            Message::AddRing {
                flags,
                offset,
                log2_ring_size,
                ..
            } => {
                irqs.push(fd.ok_or("ADD_RING without fd")?);
                rings[usize::from(flags & ADD_RING_FLAG_S2M == 0)] = Some((offset, log2_ring_size));
                Message::Ack
            }
            Message::Connect { .. } => break,
            Message::Disconnect { reason, .. } => return Err(reason.to_string_lossy()),
            m => return Err(format!("unexpected {m:?}")),
        };
        if !conn.send(&reply, None) {
            return Err("send failed".into());
        }
    }
    let region = region.ok_or("no region")?;
    let ring = |r: Option<(u32, u8)>| -> Result<Ring, String> {
        let (offset, log2) = r.ok_or("ring missing")?;
        if u64::from(offset) + ring_bytes(log2) > region.size() || offset % 8 != 0 {
            return Err("ring outside the region".into());
        }
        // SAFETY: checked just above to lie inside the mapping, 8-aligned;
        // the region is kept beside the ring in `MasterMem`.
        Ok(unsafe { Ring::new(region.base().add(offset as usize), log2) })
    };
    let (s2m, m2s) = (ring(rings[0])?, ring(rings[1])?);
    if !conn.send(
        &Message::Connected {
            if_name: FixedStr::new("hostile-master0"),
        },
        None,
    ) {
        return Err("send failed".into());
    }
    Ok(MasterMem {
        region,
        s2m,
        m2s,
        irqs,
    })
}
