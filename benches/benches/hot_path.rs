//! The hot path, per packet, with the real queue types over real shared
//! memory and a simulated peer:
//!
//! - `memif_copy`: a burst received on a memif ring (switch as master) and
//!   copied into another memif ring's peer buffers, at 64 and 1518 bytes,
//!   against a plain `memcpy` of the same bytes;
//! - `virtqueue`: a burst popped from a virtio transmit queue and returned
//!   (used), and a burst filled into a virtio receive queue;
//! - `forward`: one worker iteration (rx burst, L2 lookup, copy, tx, used
//!   and ring updates) from one memif port to another, and the same with
//!   the idle capture and trace hooks compiled out (their cost), and with
//!   1024 hosts behind each port (every frame learned and looked up apart
//!   from its neighbours); the same from one vhost-user driver's transmit
//!   queue to another's receive queue; flooding to N ports; VLAN push
//!   (access -> trunk) and pop (trunk -> access) against untagged.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use switchyard::dataplane::{Dataplane, RxClaim, WorkerView};
use switchyard::eventfd::new_eventfd;
use switchyard::forward::{police_rx, Forwarder};
use switchyard::port::memif::queue::{MemifRx, MemifTx, Role};
use switchyard::port::memif::region::{Region, Regions};
use switchyard::port::memif::ring::{Desc, Ring};
use switchyard::port::vhost_user::queue::{VirtioRx, VirtioTx, Vq};
use switchyard::queue::{
    OffloadCaps, PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue, BURST_SIZE,
};
use switchyard::switch::mac_table::MacEntry;
use switchyard::switch::policy::PortRules;
use switchyard::switch::security::PortSecurity;
use switchyard::vlan::{VlanMode, VlanSet};
use switchyard::wire::memif::{ring_bytes, COOKIE};
use switchyard::wire::MacAddr;
use switchyard_api::policy::{IpBlock, L4Protocol, PolicyPort, PolicyRule, PortPolicy};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const BURST: usize = BURST_SIZE;
const LOG2: u8 = 10;
const BUF: u32 = 2048;
pub(crate) const MAC_A: u64 = 0x02_00_00_00_00_0a;
pub(crate) const MAC_B: u64 = 0x02_00_00_00_00_0b;

/// An Ethernet frame of `size` bytes (without CRC) from `src` to `dst`.
pub(crate) fn frame(size: usize, dst: u64, src: u64, vlan: Option<u16>) -> Vec<u8> {
    let mut f = vec![0u8; size];
    f[0..6].copy_from_slice(&MacAddr::from_u64(dst).0);
    f[6..12].copy_from_slice(&MacAddr::from_u64(src).0);
    match vlan {
        Some(v) => {
            f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
            f[14..16].copy_from_slice(&v.to_be_bytes());
            f[16..18].copy_from_slice(&0x0800u16.to_be_bytes());
        }
        None => f[12..14].copy_from_slice(&0x0800u16.to_be_bytes()),
    }
    f
}

/// An Ethernet frame of `size` bytes from A to B carrying IPv4/UDP from
/// 10.0.0.1:1000 to 10.0.0.2:2000.
fn udp_frame(size: usize) -> Vec<u8> {
    let mut f = frame(size, MAC_B, MAC_A, None);
    let ip = &mut f[14..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((size - 14) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let udp = &mut ip[20..];
    udp[0..2].copy_from_slice(&1000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&2000u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((size - 34) as u16).to_be_bytes());
    f
}

/// One memif ring of 1024 slots with `bufs` buffers (at least 1024) in one
/// region, as a slave lays it out; the bench plays the slave.
struct MemifRing {
    regions: Arc<Regions>,
    ring: Ring,
    first: u32,
    bufs: u32,
}

impl MemifRing {
    fn new(name: &str, bufs: u32) -> MemifRing {
        let first = ring_bytes(LOG2) as u32;
        let size = u64::from(first) + u64::from(bufs) * u64::from(BUF);
        let r = Region::create(name, size).unwrap();
        // SAFETY: the ring fits at offset 0 of the fresh, page-aligned
        // mapping, which `regions` keeps alive as long as the ring is used.
        let ring = unsafe { Ring::new(r.base(), LOG2) };
        ring.set_cookie(COOKIE);
        MemifRing {
            regions: Arc::new(Regions::new(vec![r])),
            ring,
            first,
            bufs,
        }
    }

    /// Another view of the same ring (the queue owns one, the peer the other).
    fn ring(&self) -> Ring {
        // SAFETY: same mapping and layout as `self.ring`, kept alive by
        // `self.regions` (held by the bench and the queue).
        unsafe { Ring::new(self.regions.get(0).unwrap().base(), LOG2) }
    }

    fn desc(&self, buf: u32, len: u32) -> Desc {
        Desc {
            flags: 0,
            region: 0,
            length: len,
            offset: self.first + buf * BUF,
        }
    }

    /// The peer's transmit side: buffer `i` holds `frame(i)`, and slot `i`
    /// buffer `i`. Returns every buffer's descriptor.
    fn fill_with(&self, frame: impl Fn(u32) -> Vec<u8>) -> Vec<Desc> {
        (0..self.bufs)
            .map(|buf| {
                let data = frame(buf);
                let d = self.desc(buf, data.len() as u32);
                let p = self.regions.resolve(0, d.offset, d.length).unwrap();
                // SAFETY: the range was just resolved inside the mapping.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
                if buf < 1 << LOG2 {
                    self.ring.set_desc(buf as u16, d);
                }
                d
            })
            .collect()
    }

    /// The peer's receive side: every slot is an empty buffer.
    fn post_all(&self) {
        for slot in 0..(1u16 << LOG2) {
            self.ring.set_desc(slot, self.desc(u32::from(slot), BUF));
        }
    }
}

/// The two peers of a switch-side memif pair: A sends into the switch's
/// receive ring, B posts buffers on the switch's transmit ring.
pub(crate) struct Peers {
    a: MemifRing,
    b: MemifRing,
    /// A's frames, sent in turn.
    frames: Vec<Desc>,
    /// How many A has sent.
    sent: std::cell::Cell<usize>,
}

impl Peers {
    /// The peers and the switch's queues (master side) on their rings.
    pub(crate) fn new(data: &[u8]) -> (Peers, MemifRx, MemifTx) {
        Peers::with_frames(1 << LOG2, |_| data.to_vec())
    }

    /// The same, with A sending the frames `frame(i)` of `bufs` buffers
    /// in turn (`bufs` a multiple of the ring's size).
    fn with_frames(bufs: u32, frame: impl Fn(u32) -> Vec<u8>) -> (Peers, MemifRx, MemifTx) {
        let a = MemifRing::new("bench-a", bufs);
        let b = MemifRing::new("bench-b", 1 << LOG2);
        let frames = a.fill_with(frame);
        b.post_all();
        b.ring.set_head(1 << LOG2);
        let rx = MemifRx::new(
            Role::Master,
            a.ring(),
            a.regions.clone(),
            new_eventfd().unwrap(),
            None,
        );
        let tx = MemifTx::new(
            Role::Master,
            b.ring(),
            b.regions.clone(),
            new_eventfd().unwrap(),
            None,
        );
        let sent = std::cell::Cell::new(0);
        (Peers { a, b, frames, sent }, rx, tx)
    }

    /// A sends a burst (the next buffers, when it has more than its ring
    /// holds); B takes what it received and posts the buffers again.
    pub(crate) fn step(&self) {
        let head = self.a.ring.head();
        if self.frames.len() > 1 << LOG2 {
            let sent = self.sent.get();
            for k in 0..BURST {
                let d = self.frames[(sent + k) % self.frames.len()];
                self.a.ring.set_desc(head.wrapping_add(k as u16), d);
            }
            self.sent.set(sent + BURST);
        }
        let h = head.wrapping_add(BURST as u16);
        self.a.ring.set_head(h);
        let t = self.b.ring.tail();
        for s in t.wrapping_sub(BURST as u16)..t {
            self.b.ring.set_len_flags(s, BUF, 0);
        }
        self.b.ring.set_head(t.wrapping_add(1 << LOG2));
    }
}

fn memif_copy(c: &mut Criterion) {
    let mut g = c.benchmark_group("memif_copy");
    for size in [60usize, 1514] {
        let data = frame(size, MAC_B, MAC_A, None);
        g.throughput(Throughput::Elements(BURST as u64));
        let (peers, mut rx, mut tx) = Peers::new(&data);
        let mut burst = RxBurst::default();
        g.bench_function(BenchmarkId::new("rx_tx_burst", size + 4), |bench| {
            bench.iter(|| {
                peers.step();
                burst.clear();
                let n = rx.rx_burst(&mut burst).unwrap();
                for f in burst.frames() {
                    let _ = tx.tx(&TxFrame::plain(f));
                }
                tx.flush();
                rx.release();
                black_box(n)
            })
        });
        // Baseline: the same bytes copied between two buffer pools.
        let src = vec![data.clone(); BURST];
        let mut dst = vec![vec![0u8; BUF as usize]; BURST];
        g.bench_function(BenchmarkId::new("memcpy_baseline", size + 4), |bench| {
            bench.iter(|| {
                for (s, d) in src.iter().zip(dst.iter_mut()) {
                    d[..s.len()].copy_from_slice(black_box(s));
                }
                black_box(&dst);
            })
        });
    }
    g.finish();
}

/// A virtio driver's split ring in guest memory: descriptor `i` always
/// points at buffer `i`.
struct Driver {
    mem: Arc<GuestMemoryMmap>,
    avail: u16,
    used_seen: u16,
}

const QSIZE: u16 = 256;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const BUFS: u64 = 0x10000;
const VBUF: u64 = 2048;

impl Driver {
    /// `write`: buffers the device writes (the driver's receive queue).
    fn new(write: bool, data: &[u8]) -> Driver {
        let size = BUFS as usize + QSIZE as usize * VBUF as usize;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size)]).unwrap();
        for i in 0..QSIZE {
            let addr = BUFS + u64::from(i) * VBUF;
            let (len, flags) = if write {
                (VBUF as u32, 2u16)
            } else {
                // 12-byte virtio-net header, then the frame.
                mem.write_slice(data, GuestAddress(addr + 12)).unwrap();
                (12 + data.len() as u32, 0)
            };
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            mem.write_slice(&d, GuestAddress(DESC + 16 * u64::from(i)))
                .unwrap();
        }
        Driver {
            mem: Arc::new(mem),
            avail: 0,
            used_seen: 0,
        }
    }

    fn vq(&self) -> Vq {
        Vq::with_rings(self.mem.clone(), QSIZE, DESC, AVAIL, USED).unwrap()
    }

    /// Publishes `n` chains and takes back what the device used.
    fn step(&mut self, n: u16) {
        let used: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        self.used_seen = used;
        for _ in 0..n {
            let slot = u64::from(self.avail % QSIZE);
            self.mem
                .write_obj(self.avail % QSIZE, GuestAddress(AVAIL + 4 + 2 * slot))
                .unwrap();
            self.avail = self.avail.wrapping_add(1);
        }
        self.mem
            .write_obj(self.avail, GuestAddress(AVAIL + 2))
            .unwrap();
    }
}

fn virtqueue(c: &mut Criterion) {
    let mut g = c.benchmark_group("virtqueue");
    g.throughput(Throughput::Elements(BURST as u64));
    for size in [60usize, 1514] {
        let data = frame(size, MAC_B, MAC_A, None);
        // Pop a burst from the driver's transmit queue and return it.
        let mut d = Driver::new(false, &data);
        let mut rx = VirtioRx::new(d.vq(), false);
        let mut burst = RxBurst::default();
        g.bench_function(BenchmarkId::new("pop_used", size + 4), |b| {
            b.iter(|| {
                d.step(BURST as u16);
                burst.clear();
                let n = rx.rx_burst(&mut burst).unwrap();
                rx.release();
                black_box(n)
            })
        });
        // Fill a burst into the driver's receive queue.
        let (src, mut src_rx, _) = Peers::new(&data);
        let mut frames = RxBurst::default();
        src.step();
        src_rx.rx_burst(&mut frames).unwrap();
        let mut drv = Driver::new(true, &data);
        let mut tx = VirtioTx::new(drv.vq(), true, OffloadCaps::NONE);
        g.bench_function(BenchmarkId::new("fill_used", size + 4), |b| {
            b.iter(|| {
                drv.step(BURST as u16);
                for f in frames.frames() {
                    let _ = tx.tx(&TxFrame::plain(f));
                }
                tx.flush();
            })
        });
        src_rx.release();
    }
    g.finish();
}

/// A transmit queue that copies each frame into a private buffer: the
/// switching cost without a peer ring.
struct SinkTx {
    buf: Vec<u8>,
}

impl TxQueue for SinkTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let mut r = frame.reader();
        // SAFETY: `buf` has room for `buf.len()` bytes; the reader writes at
        // most that many.
        unsafe { r.copy_to(self.buf.as_mut_ptr(), self.buf.len()) };
        black_box(&self.buf);
        Ok(())
    }

    fn flush(&mut self) {}
}

/// A receive queue that hands out the same burst of frames every time.
struct ReplayRx {
    frames: Vec<Vec<u8>>,
}

impl RxQueue for ReplayRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        for f in &self.frames {
            let slot = burst.next_slot();
            // SAFETY: the recorded frames live as long as the queue.
            unsafe { slot.push(f.as_ptr(), f.len() as u32) };
            burst.commit();
        }
        Ok(burst.len())
    }

    fn release(&mut self) {}

    fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        true
    }
}

/// An access port of `v`, or a trunk of every VLAN.
fn mode(v: Option<u16>) -> VlanMode {
    match v {
        Some(v) => VlanMode::Access(v),
        None => VlanMode::from_spec(None, Some(&VlanSet::all())),
    }
}

/// A data plane with one bridge: port 0 receives `rx`, ports 1.. get
/// `others` (access VLAN, or none for a trunk of every VLAN) and sink
/// queues. MAC B is learned on port 1.
fn plane(
    rx: Box<dyn RxQueue>,
    in_vlan: Option<u16>,
    others: &[Option<u16>],
) -> (Dataplane, WorkerView) {
    let dp = Dataplane::new(1).unwrap();
    let br = dp.add_bridge(4096);
    let (a, _) = dp.add_port("in", Some(br), mode(in_vlan), &PortSecurity::default());
    dp.attach_queues(
        a,
        PortQueues {
            rx: vec![rx],
            tx: vec![Box::new(SinkTx { buf: vec![0; 2048] })],
        },
    );
    for (i, v) in others.iter().enumerate() {
        let (p, _) = dp.add_port(
            &format!("out{i}"),
            Some(br),
            mode(*v),
            &PortSecurity::default(),
        );
        dp.attach_queues(
            p,
            PortQueues {
                rx: vec![],
                tx: vec![Box::new(SinkTx { buf: vec![0; 2048] })],
            },
        );
    }
    let vid = others.first().copied().flatten().or(in_vlan).unwrap_or(0);
    learned(dp, br, 1, vid, &[MAC_B])
}

/// `dp` with `macs` learned on `port` in `vid` of bridge `br`, and worker
/// 0's view of it.
fn learned(dp: Dataplane, br: u16, port: u16, vid: u16, macs: &[u64]) -> (Dataplane, WorkerView) {
    let table = dp.mac_table(br).unwrap();
    let entry = MacEntry {
        port,
        port_gen: 1,
        last_seen: dp.now_secs(),
        pinned: false,
    };
    for &mac in macs {
        table.learn(MacAddr::from_u64(mac), vid, entry, 0);
    }
    let mut view = WorkerView::default();
    dp.build_view(0, &mut view);
    (dp, view)
}

/// A data plane with one bridge of two ports: `a` receives on `rx`, `b`
/// sends on `tx`, and `macs_b` are learned on `b`.
pub(crate) fn plane_with(
    rx: Box<dyn RxQueue>,
    tx: Box<dyn TxQueue>,
    macs_b: &[u64],
) -> (Dataplane, WorkerView) {
    let dp = Dataplane::new(1).unwrap();
    // Room for the hosts of both sides twice over, as the loop benchmark
    // gives its DUTs.
    let br = dp.add_bridge(4 * macs_b.len().max(1024));
    // No MAC limit: the many-hosts benches have thousands of hosts behind
    // each port.
    let open = PortSecurity {
        mac_limit: 0,
        ..PortSecurity::default()
    };
    let (pa, _) = dp.add_port("a", Some(br), VlanMode::default(), &open);
    let (pb, _) = dp.add_port("b", Some(br), VlanMode::default(), &open);
    dp.attach_queues(
        pa,
        PortQueues {
            rx: vec![rx],
            tx: vec![],
        },
    );
    dp.attach_queues(
        pb,
        PortQueues {
            rx: vec![],
            tx: vec![tx],
        },
    );
    learned(dp, br, pb, 0, macs_b)
}

/// A worker's state: its view, its claims on the view's receive queues
/// (held from one view to the next, as the worker holds them) and its
/// forwarder.
pub(crate) struct Worker {
    dp: Dataplane,
    view: WorkerView,
    claims: Vec<Option<RxClaim>>,
    fwd: Forwarder,
}

impl Worker {
    pub(crate) fn new((dp, view): (Dataplane, WorkerView)) -> Worker {
        let claims = view.rx.iter().map(|rx| rx.slot.claim()).collect();
        let mut fwd = Forwarder::default();
        fwd.resize(&view);
        Worker {
            dp,
            view,
            claims,
            fwd,
        }
    }

    pub(crate) fn iterate(&mut self, burst: &mut RxBurst) -> usize {
        iterate_with::<true>(self, burst)
    }
}

/// One pass of the worker over its queues ([`Worker::iterate`]), with the
/// capture and trace hooks compiled in (`HOOKS`, as the worker runs) or
/// out.
#[inline(never)]
fn iterate_with<const HOOKS: bool>(wk: &mut Worker, burst: &mut RxBurst) -> usize {
    pass::<HOOKS>(&wk.dp, &wk.view, &mut wk.claims, &mut wk.fwd, burst)
}

/// The pass itself, over the worker's parts borrowed apart, as the
/// worker's loop has them.
#[inline(always)]
fn pass<const HOOKS: bool>(
    dp: &Dataplane,
    view: &WorkerView,
    claims: &mut [Option<RxClaim>],
    fwd: &mut Forwarder,
    burst: &mut RxBurst,
) -> usize {
    let mut n = 0;
    for (rx, claim) in view.rx.iter().zip(claims.iter_mut()) {
        let q = claim.as_mut().expect("claimed").queue();
        burst.clear();
        n += q.rx_burst(burst).unwrap();
        // As the worker: its port's policer first.
        let (_, frames) = burst.runs_and_frames();
        let frames = police_rx(dp, view, 0, rx.port, rx.policer.as_deref(), frames);
        fwd.forward_burst_with::<HOOKS>(dp, view, 0, rx.ingress(), frames, || q.release());
    }
    n
}

fn forward(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward");
    g.throughput(Throughput::Elements(BURST as u64));
    let mut burst = RxBurst::default();

    // Whole worker iteration, memif to memif, learned unicast.
    for size in [60usize, 1514] {
        let data = frame(size, MAC_B, MAC_A, None);
        let (peers, rx, tx) = Peers::new(&data);
        let mut wk = Worker::new(plane_with(Box::new(rx), Box::new(tx), &[MAC_B]));
        g.bench_function(
            BenchmarkId::new("worker_memif_to_memif", size + 4),
            |bench| {
                bench.iter(|| {
                    peers.step();
                    black_box(wk.iterate(&mut burst))
                })
            },
        );
        // The same, with the idle capture and trace hooks compiled out:
        // what they cost when no capture or trace runs.
        g.bench_function(
            BenchmarkId::new("worker_memif_to_memif_without_hooks", size + 4),
            |bench| {
                bench.iter(|| {
                    peers.step();
                    black_box(iterate_with::<false>(&mut wk, &mut burst))
                })
            },
        );
    }

    // Many hosts, memif to memif: A's i-th frame goes from host A_i to
    // host B_i (every B_i learned on b), so each frame of a burst is
    // learned and looked up apart from its neighbours, as in the loop
    // benchmark's many-hosts cells: 1024 hosts a side, whose table fits
    // the caches nearest the core, and 16384, whose table outgrows them.
    for hosts in [1u32 << LOG2, 16384] {
        let host_a = |i: u32| 0x02_50_00_00_00_00 | u64::from(i);
        let host_b = |i: u32| 0x02_51_00_00_00_00 | u64::from(i);
        let (peers, rx, tx) = Peers::with_frames(hosts, |i| frame(60, host_b(i), host_a(i), None));
        let macs_b: Vec<u64> = (0..hosts).map(host_b).collect();
        let mut wk = Worker::new(plane_with(Box::new(rx), Box::new(tx), &macs_b));
        g.bench_function(
            BenchmarkId::new(format!("worker_memif_to_memif_{hosts}_hosts"), 64),
            |bench| {
                bench.iter(|| {
                    peers.step();
                    black_box(wk.iterate(&mut burst))
                })
            },
        );
    }

    // L3/L4 policy: memif to memif, IPv4/UDP frames of one flow from a
    // port given its address to a port isolated for ingress by `rules`
    // rules, the last of which allows the flow (the others address blocks
    // and ports that do not match): a new connection the first frame, then
    // tracked. 0: the sender's address alone (a policed bridge, no rules).
    for rules in [0usize, 10, 1000] {
        let data = udp_frame(60);
        let (peers, rx, tx) = Peers::new(&data);
        let (dp, _) = plane_with(Box::new(rx), Box::new(tx), &[MAC_B]);
        let ips = ["10.0.0.1".parse().unwrap()];
        dp.set_port_rules(
            0,
            PortRules::compile(None, Some(&ips)).unwrap().map(Arc::new),
        );
        if rules > 0 {
            let mut list: Vec<PolicyRule> = (1..rules)
                .map(|i| PolicyRule {
                    name: None,
                    peers: vec![IpBlock {
                        cidr: format!("10.{}.{}.0/24", 1 + i / 256, i % 256)
                            .parse()
                            .unwrap(),
                        except: vec![],
                    }],
                    ports: vec![PolicyPort {
                        protocol: L4Protocol::Udp,
                        port: Some(3000 + i as u16),
                        end_port: None,
                    }],
                })
                .collect();
            list.push(PolicyRule {
                name: None,
                peers: vec![IpBlock {
                    cidr: "10.0.0.0/24".parse().unwrap(),
                    except: vec![],
                }],
                ports: vec![PolicyPort {
                    protocol: L4Protocol::Udp,
                    port: Some(2000),
                    end_port: None,
                }],
            });
            let policy = PortPolicy {
                ingress: Some(list),
                egress: None,
            };
            dp.set_port_rules(
                1,
                PortRules::compile(Some(&policy), None)
                    .unwrap()
                    .map(Arc::new),
            );
        }
        let mut view = WorkerView::default();
        dp.build_view(0, &mut view);
        let mut wk = Worker::new((dp, view));
        g.bench_function(
            BenchmarkId::new(format!("worker_memif_to_memif_policy_{rules}_rules"), 64),
            |bench| {
                bench.iter(|| {
                    peers.step();
                    black_box(wk.iterate(&mut burst))
                })
            },
        );
    }

    // Whole worker iteration, vhost-user to vhost-user (a driver's
    // transmit queue to another driver's receive queue), learned unicast.
    for size in [60usize, 1514] {
        let data = frame(size, MAC_B, MAC_A, None);
        let mut da = Driver::new(false, &data);
        let mut db = Driver::new(true, &data);
        let rx = VirtioRx::new(da.vq(), false);
        let tx = VirtioTx::new(db.vq(), true, OffloadCaps::NONE);
        let mut wk = Worker::new(plane_with(Box::new(rx), Box::new(tx), &[MAC_B]));
        g.bench_function(
            BenchmarkId::new("worker_vhost_to_vhost", size + 4),
            |bench| {
                bench.iter(|| {
                    da.step(BURST as u16);
                    db.step(BURST as u16);
                    black_box(wk.iterate(&mut burst))
                })
            },
        );
    }

    // Flooding (broadcast) to N ports.
    let bcast = frame(60, 0xffff_ffff_ffff, MAC_A, None);
    for n in [1usize, 4, 16] {
        let rx = ReplayRx {
            frames: vec![bcast.clone(); BURST],
        };
        let mut wk = Worker::new(plane(Box::new(rx), None, &vec![None; n]));
        g.bench_function(BenchmarkId::new("flood_to_ports", n), |bench| {
            bench.iter(|| black_box(wk.iterate(&mut burst)))
        });
    }

    // VLAN: untagged baseline, push (access 100 -> trunk), pop (trunk ->
    // access 100). (frame tag, ingress port VLAN, egress port VLAN)
    type Case = (&'static str, Option<u16>, Option<u16>, Option<u16>);
    let cases: [Case; 3] = [
        ("untagged", None, None, None),
        ("vlan_push", None, Some(100), None),
        ("vlan_pop", Some(100), None, Some(100)),
    ];
    for (name, tag, in_vlan, out_vlan) in cases {
        let rx = ReplayRx {
            frames: vec![frame(60, MAC_B, MAC_A, tag); BURST],
        };
        let mut wk = Worker::new(plane(Box::new(rx), in_vlan, &[out_vlan]));
        g.bench_function(BenchmarkId::new(name, 64), |bench| {
            bench.iter(|| black_box(wk.iterate(&mut burst)))
        });
    }
    g.finish();
}

criterion_group!(benches, memif_copy, virtqueue, forward);
criterion_main!(benches);
