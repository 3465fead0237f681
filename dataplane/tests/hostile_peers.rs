//! End-to-end: misbehaving peers written for the test attack one port of the
//! real switch while a DPDK testpmd loops real frames through two other
//! ports of the same bridge. After every attack only the attacked port has
//! gone down, with a logged reason and a counted fault; the switch keeps
//! running and the loop keeps forwarding. At the end the loop is checked
//! frame by frame: nothing was lost.

mod common;
#[path = "common/vhost_peer.rs"]
mod vhost_peer;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::memif_peer::{self as peer, Conn, Listener, SlaveMem, SLOTS};
use common::{memif_vdev, serial, settled, wait_for, Switch, Testpmd};
use switchyard::port::memif::ring::Desc;
use switchyard::wire::memif::{Message, DESC_FLAG_NEXT, VERSION};
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vhost_peer::{Guest, VhostFrontend, F_NEXT, F_WRITE, MEM, QSIZE};

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";
/// Frames `start tx_first` puts into the loop: one burst of 32 per port.
const LOOP_FRAMES: u64 = 64;

fn add_port(sw: &Switch, name: &str, args: &[&str]) -> String {
    let sock = sw.path(&format!("{name}.sock"));
    let mut all = vec![
        "port", "add", name, "--socket", &sock, "--bridge", "default",
    ];
    all.extend_from_slice(args);
    sw.cli_ok(&all);
    sock
}

/// Two memif ports, `a` and `b`, with one testpmd forwarding each one's
/// frames into the other (io mode): traffic that must survive every attack.
struct GoodLoop {
    t: Testpmd,
}

impl GoodLoop {
    fn start(sw: &Switch) -> GoodLoop {
        let memif = ["--kind", "memif", "--role", "master"];
        let sa = add_port(sw, "a", &memif);
        let sb = add_port(sw, "b", &memif);
        let mut t = Testpmd::start(
            &[
                memif_vdev(0, "client", &sa, "mac=02:00:00:00:00:a0"),
                memif_vdev(1, "client", &sb, "mac=02:00:00:00:00:b0"),
            ],
            &["--forward-mode=io"],
        );
        sw.wait_link("a", true);
        sw.wait_link("b", true);
        t.send_bursts(1);
        let g = GoodLoop { t };
        g.assert_flowing(sw);
        g
    }

    /// Both good ports keep receiving.
    fn assert_flowing(&self, sw: &Switch) {
        let (a, b) = (
            sw.stats("a").totals.rx_packets,
            sw.stats("b").totals.rx_packets,
        );
        wait_for(
            Duration::from_secs(10),
            "the good loop to keep forwarding",
            || {
                (sw.stats("a").totals.rx_packets > a + 1000
                    && sw.stats("b").totals.rx_packets > b + 1000)
                    .then_some(())
            },
        );
    }

    /// Stops the loop and accounts for every frame: each one testpmd sent
    /// reached the switch, each one the switch took from `a` went to `b` and
    /// back, no drop anywhere, and all `LOOP_FRAMES` frames are still in
    /// flight (sent by the switch, not yet taken by the stopped testpmd).
    /// Returns the frames looped.
    fn assert_nothing_lost(mut self, sw: &Switch) -> u64 {
        self.t.pause();
        // The switch's counters once the frames in flight have landed.
        let (sa, sb) = settled("the loop's counters", || {
            (sw.stats("a").totals, sw.stats("b").totals)
        });
        for (name, st) in [("a", &sa), ("b", &sb)] {
            assert!(st.drops.values().all(|&d| d == 0), "{name}: {:?}", st.drops);
        }
        assert_eq!(sa.rx_packets, sb.tx_packets, "a -> b");
        assert_eq!(sb.rx_packets, sa.tx_packets, "b -> a");
        let (rx0, tx0) = self.t.port_stats(0);
        let (rx1, tx1) = self.t.port_stats(1);
        assert_eq!(tx0, sa.rx_packets, "testpmd port 0 -> switch");
        assert_eq!(tx1, sb.rx_packets, "testpmd port 1 -> switch");
        let in_flight = (sa.tx_packets - rx0) + (sb.tx_packets - rx1);
        assert_eq!(in_flight, LOOP_FRAMES, "frames lost in the loop");
        sa.rx_packets + sb.rx_packets
    }
}

/// The attacks made on one port, and the faults the switch counted for it.
struct Tally<'a> {
    port: &'a str,
    faults: u64,
    attacks: usize,
    good: &'a GoodLoop,
    /// How long the switch's log was when the current attack began: its
    /// reason is looked for only in what the switch wrote since, so an
    /// attack whose reason an earlier attack also gave must log its own
    /// line. Attacks run one after another, each beginning where the last
    /// one's check ended.
    since: usize,
}

impl<'a> Tally<'a> {
    fn new(sw: &Switch, port: &'a str, good: &'a GoodLoop) -> Self {
        Tally {
            port,
            faults: 0,
            attacks: 0,
            good,
            since: sw.log().len(),
        }
    }

    /// Waits for the port's fault counter to move and for `reason` in the
    /// log this attack wrote; checks the switch still runs and the good loop
    /// still forwards.
    fn check(&mut self, sw: &mut Switch, reason: &str) {
        let before = self.faults;
        self.faults = wait_for(
            Duration::from_secs(15),
            &format!("{} to be disconnected for {reason:?}", self.port),
            || Some(sw.port(self.port).status.faults).filter(|&f| f > before),
        );
        self.wait_logged(sw, reason);
        sw.assert_alive();
        self.survived(sw);
    }

    /// A peer refused before it named one of the socket's interfaces: in
    /// the log this attack wrote as `said`, and no port's fault.
    fn unowned(&mut self, sw: &mut Switch, said: &str) {
        self.wait_logged(sw, said);
        assert_eq!(sw.port(self.port).status.faults, self.faults);
        self.survived(sw);
    }

    /// An attack that is no fault of protocol (e.g. a connection flood):
    /// the switch runs and the loop forwards. The next attack begins here.
    fn survived(&mut self, sw: &mut Switch) {
        sw.assert_alive();
        self.good.assert_flowing(sw);
        self.attacks += 1;
        // `max`: a log read that failed (empty) must not reopen what
        // earlier attacks wrote.
        self.since = self.since.max(sw.log().len());
    }

    /// Waits for `line` in what the switch logged since the current attack
    /// began.
    fn wait_logged(&self, sw: &Switch, line: &str) {
        wait_for(
            Duration::from_secs(5),
            &format!("{line:?} in the log since attack {}", self.attacks + 1),
            || {
                sw.log()
                    .get(self.since..)
                    .is_some_and(|new| new.contains(line))
                    .then_some(())
            },
        );
    }
}

/// A slave handshake with one step bent by `bend`; the switch must refuse
/// it with `reason`.
fn bent_slave(
    sock: &str,
    reason: &str,
    bend: impl FnOnce(&SlaveMem, &mut Vec<(Message, Option<i32>)>),
) {
    let mem = SlaveMem::new();
    let mut steps = mem.script();
    bend(&mem, &mut steps);
    let conn = Conn::connect(sock);
    let got = peer::run_slave(&conn, &steps).expect_err("the switch accepted a bent handshake");
    assert!(
        got.contains(reason),
        "refused with {got:?}, expected {reason:?}"
    );
}

/// A slave that completes the handshake (and posts no buffer yet).
fn good_slave(sw: &Switch, sock: &str, port: &str) -> (Conn, SlaveMem) {
    let mem = SlaveMem::new();
    let conn = Conn::connect(sock);
    peer::run_slave(&conn, &mem.script()).expect("handshake");
    sw.wait_link(port, true);
    (conn, mem)
}

fn set_init(steps: &mut [(Message, Option<i32>)], f: impl FnOnce(&mut u16, &mut u32)) {
    if let Message::Init { version, id, .. } = &mut steps[0].0 {
        f(version, id)
    }
}

fn set_ring(
    steps: &mut [(Message, Option<i32>)],
    at: usize,
    f: impl FnOnce(&mut u16, &mut u32, &mut u8),
) {
    if let Message::AddRing {
        index,
        offset,
        log2_ring_size,
        ..
    } = &mut steps[at].0
    {
        f(index, offset, log2_ring_size)
    }
}

/// The switch is master; a slave written for the test breaks the handshake
/// and then the rings in every way the protocol forbids.
fn attack_as_slave(sw: &mut Switch, good: &GoodLoop) -> usize {
    let sock = add_port(sw, "hm", &["--kind", "memif", "--role", "master"]);
    let mut t = Tally::new(sw, "hm", good);
    // A second interface on the socket, connected throughout: the attacks
    // on interface 0 are that port's alone.
    sw.cli_ok(&[
        "port", "add", "hm1", "--kind", "memif", "--role", "master", "--socket", &sock, "--id",
        "1", "--bridge", "default",
    ]);
    let mem1 = SlaveMem::new();
    let mut steps1 = mem1.script();
    set_init(&mut steps1, |_, id| *id = 1);
    let conn1 = Conn::connect(&sock);
    peer::run_slave(&conn1, &steps1).expect("the handshake of interface 1");
    sw.wait_link("hm1", true);

    // --- The handshake.
    let version = |_: &SlaveMem, s: &mut Vec<_>| set_init(s, |v, _| *v = 0x0100);
    bent_slave(&sock, "incompatible memif version", version);
    t.check(sw, "incompatible memif version");

    // An interface the socket does not serve is refused as DPDK says it,
    // and is no port's fault.
    bent_slave(&sock, "ID mismatch", |_, s| set_init(s, |_, id| *id = 9));
    t.unowned(
        sw,
        "a peer asked for an interface the socket does not serve",
    );

    bent_slave(&sock, "region 0: region fd holds", |m, s| {
        s[1].0 = Message::AddRegion {
            index: 0,
            size: m.size() * 4,
        }
    });
    t.check(sw, "region 0: region fd holds");

    // A descriptor that is not memory at all as the region (what DPDK's
    // zero-copy memif client sends when the memseg descriptor it closed on
    // another port's connect was reused by an eventfd): refused, not mapped.
    let not_memory = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    bent_slave(
        &sock,
        "region 0: region fd is not a file of memory",
        |_, s| s[1].1 = Some(not_memory.as_raw_fd()),
    );
    t.check(sw, "region 0: region fd is not a file of memory");

    // A region that is not sealed against shrinking (DPDK's zero-copy
    // slaves pass hugetlbfs memory, which cannot be sealed) is accepted and
    // watched: the slave truncating it under the switch costs the slave its
    // port, not the switch its life. The test touches the memory no more.
    let mem = SlaveMem::unsealed();
    let conn = Conn::connect(&sock);
    peer::run_slave(&conn, &mem.script()).expect("an unsealed region is accepted");
    sw.wait_link("hm", true);
    nix::unistd::ftruncate(mem.region.fd(), 0).expect("truncate the region");
    peer::kick(&mem.s2m_irq);
    t.check(sw, "truncated the memory it shares");
    drop(conn);
    drop(mem);

    bent_slave(&sock, "invalid region index", |m, s| {
        s[1].0 = Message::AddRegion {
            index: 3,
            size: m.size(),
        }
    });
    t.check(sw, "invalid region index");

    bent_slave(&sock, "missing region fd", |_, s| s[1].1 = None);
    t.check(sw, "missing region fd");

    bent_slave(&sock, "ring outside its region", |m, s| {
        let end = m.size() as u32;
        set_ring(s, 2, |_, off, _| *off = end - 64)
    });
    t.check(sw, "ring outside its region");

    // offset + ring size overflows u32: must be summed in u64.
    bent_slave(&sock, "ring outside its region", |_, s| {
        set_ring(s, 3, |_, off, _| *off = u32::MAX - 7)
    });
    t.check(sw, "ring outside its region");

    bent_slave(&sock, "invalid ring size", |_, s| {
        set_ring(s, 2, |_, _, l| *l = 20)
    });
    t.check(sw, "invalid ring size");

    bent_slave(&sock, "invalid ring index", |_, s| {
        set_ring(s, 2, |i, _, _| *i = 7)
    });
    t.check(sw, "invalid ring index");

    bent_slave(&sock, "missing interrupt fd", |_, s| s[3].1 = None);
    t.check(sw, "missing interrupt fd");

    bent_slave(&sock, "wrong ring cookie", |m, _| m.s2m.set_cookie(0xdead));
    t.check(sw, "wrong ring cookie");

    // Out of order: a ring before any region; CONNECT before any ring; INIT twice.
    bent_slave(&sock, "invalid ring region", |_, s| {
        s.remove(1);
    });
    t.check(sw, "invalid ring region");
    bent_slave(&sock, "rings missing", |_, s| {
        s.drain(2..4);
    });
    t.check(sw, "rings missing");
    bent_slave(&sock, "unexpected Init message", |_, s| {
        let init = s[0].clone();
        s.insert(1, init);
    });
    t.check(sw, "unexpected Init message");
    // ... naming the socket's other interface.
    bent_slave(&sock, "unexpected Init message", |_, s| {
        let mut init = s[0].clone();
        set_init(std::slice::from_mut(&mut init), |_, id| *id = 1);
        s.insert(1, init);
    });
    t.check(sw, "unexpected Init message");

    // Truncated, oversized and made-up messages: before INIT they are no
    // port's (the socket refuses them), after it the port's fault.
    let claim = |sock: &str| {
        let c = Conn::connect(sock);
        assert!(matches!(c.recv(), Ok((Message::Hello { .. }, _))));
        assert!(c.send(&SlaveMem::new().script()[0].0, None));
        c
    };
    let named = |sock: &str| {
        let c = claim(sock);
        assert!(matches!(c.recv(), Ok((Message::Ack, _))));
        c
    };
    for (bytes, reason) in [
        (vec![3u8; 40], "control message is 40 bytes"),
        (
            [vec![1u8, 0], vec![0u8; 198]].concat(),
            "invalid message size",
        ),
        (vec![77u8; 128], "unknown control message type"),
    ] {
        let c = Conn::connect(&sock);
        assert!(matches!(c.recv(), Ok((Message::Hello { .. }, _))));
        assert!(c.send_raw(&bytes));
        assert!(c.refusal().contains(reason));
        t.unowned(sw, reason);
        let c = named(&sock);
        assert!(c.send_raw(&bytes));
        assert!(c.refusal().contains(reason));
        t.check(sw, reason);
    }

    // A peer that connects and says nothing is dropped after the timeout
    // (no port's fault); one that stops after INIT, as its port's fault.
    let silent = Conn::connect(&sock);
    assert!(silent.refusal().contains("handshake timed out"));
    t.unowned(sw, "a peer named no interface in time");
    let silent = named(&sock);
    assert!(silent.refusal().contains("handshake timed out"));
    t.check(sw, "handshake timed out");

    // A flood of connections that name no interface: 16 wait at most, a
    // newer one closes the oldest, and the last are dropped after the
    // timeout; afterwards a well-behaved slave gets in.
    let flood: Vec<Conn> = (0..200).map(|_| Conn::connect(&sock)).collect();
    for c in &flood[..200 - 16] {
        assert_eq!(c.refusal(), "too many connections waiting");
    }
    for c in &flood[200 - 16..] {
        assert_eq!(c.refusal(), "handshake timed out");
    }
    drop(flood);
    t.survived(sw);

    // An interface claimed again while its handshake runs: the first is
    // the port's, every later claim is refused as DPDK and VPP refuse it.
    let first = named(&sock);
    let claims: Vec<Conn> = (0..50).map(|_| claim(&sock)).collect();
    for c in &claims {
        assert_eq!(c.refusal(), "Already connected");
    }
    drop(claims);
    assert!(first.refusal().contains("handshake timed out"));
    t.check(sw, "handshake timed out");

    // --- The rings, after a complete handshake. Each frame the slave
    // "sends" is a runt, so nothing it injects reaches the good loop.
    let ring_attack = |sw: &mut Switch, t: &mut Tally, reason: &str, bend: &dyn Fn(&SlaveMem)| {
        let (conn, mem) = good_slave(sw, &sock, "hm");
        bend(&mem);
        peer::kick(&mem.s2m_irq);
        assert!(conn.refusal().contains(reason));
        t.check(sw, reason);
    };
    let put = |m: &SlaveMem, slot: u16, d: Desc| m.s2m.set_desc(slot, d);
    let runt = |m: &SlaveMem, i: u32| Desc {
        flags: 0,
        region: 0,
        length: 10,
        offset: m.buffer(i),
    };
    // One frame of one bad descriptor.
    let post = |m: &SlaveMem, d: Desc| {
        put(m, 0, d);
        m.s2m.set_head(1);
    };
    ring_attack(sw, &mut t, "outside the shared memory", &|m| {
        post(
            m,
            Desc {
                region: 5,
                ..runt(m, 0)
            },
        )
    });
    // offset + length overflows u32.
    ring_attack(sw, &mut t, "outside the shared memory", &|m| {
        let (offset, length) = (u32::MAX - 0xff, 0x200);
        post(
            m,
            Desc {
                offset,
                length,
                ..runt(m, 0)
            },
        )
    });
    ring_attack(sw, &mut t, "outside the shared memory", &|m| {
        let length = m.size() as u32 + 1;
        post(
            m,
            Desc {
                offset: 0,
                length,
                ..runt(m, 0)
            },
        )
    });
    ring_attack(sw, &mut t, "s2m head", &|m| m.s2m.set_head(SLOTS + 1));
    ring_attack(sw, &mut t, "s2m head", &|m| {
        // One good (runt) frame, consumed; then the head moves back.
        put(m, 0, runt(m, 0));
        m.s2m.set_head(1);
        peer::kick(&m.s2m_irq);
        wait_for(Duration::from_secs(5), "the runt to be consumed", || {
            (m.s2m.tail() == 1).then_some(())
        });
        m.s2m.set_head(0);
    });
    ring_attack(sw, &mut t, "runs past the published descriptors", &|m| {
        for i in 0..SLOTS {
            put(
                m,
                i,
                Desc {
                    flags: DESC_FLAG_NEXT,
                    ..runt(m, u32::from(i))
                },
            );
        }
        m.s2m.set_head(SLOTS);
    });
    // A posted M2S buffer outside the region: found when the switch floods
    // the loop's frames to this port.
    ring_attack(sw, &mut t, "outside the shared memory", &|m| {
        m.post_m2s_buffers();
        for i in 0..SLOTS {
            m.m2s.set_desc(
                i,
                Desc {
                    offset: m.size() as u32 - 16,
                    ..m.m2s.desc(i)
                },
            );
        }
    });
    assert!(
        sw.stats("hm").totals.drops[&switchyard_api::DropReason::Runt] >= 1,
        "{:?}",
        sw.stats("hm").totals.drops
    );
    // Interface 1 was never touched, and is still taken.
    let hm1 = sw.port("hm1").status;
    assert!(
        hm1.link_up && hm1.connects == 1 && hm1.faults == 0,
        "{hm1:?}"
    );
    let c = Conn::connect(&sock);
    assert!(matches!(c.recv(), Ok((Message::Hello { .. }, _))));
    assert!(c.send(&steps1[0].0, None));
    assert_eq!(c.refusal(), "Already connected");
    sw.cli_ok(&["port", "del", "hm"]);
    assert!(sw.port("hm1").status.link_up);
    sw.cli_ok(&["port", "del", "hm1"]);
    assert!(conn1.refusal().contains("interface deleted"));
    t.attacks
}

/// The switch is slave; a master written for the test breaks the handshake
/// and the rings.
fn attack_as_master(sw: &mut Switch, good: &GoodLoop) -> usize {
    let sock = sw.path("hs.sock");
    let l = Listener::bind(&sock);
    sw.cli_ok(&[
        "port", "add", "hs", "--kind", "memif", "--role", "slave", "--socket", &sock, "--bridge",
        "default",
    ]);
    let mut t = Tally::new(sw, "hs", good);
    let hello_with = |f: &dyn Fn(&mut u16, &mut u16, &mut u8)| {
        let mut h = peer::hello();
        if let Message::Hello {
            min_version,
            max_version,
            max_log2_ring_size,
            ..
        } = &mut h
        {
            f(min_version, max_version, max_log2_ring_size);
        }
        h
    };

    for (hello, reason) in [
        (
            hello_with(&|min, max, _| (*min, *max) = (VERSION + 1, VERSION + 1)),
            "incompatible memif version",
        ),
        (
            hello_with(&|_, _, log2| *log2 = 0),
            "master limits leave no usable ring",
        ),
        (
            Message::Connected {
                if_name: switchyard::wire::memif::FixedStr::new("early"),
            },
            "unexpected Connected message",
        ),
        (Message::Ack, "unexpected Ack message"),
    ] {
        let c = l.accept();
        assert!(peer::run_master(&c, &hello).is_err());
        t.check(sw, reason);
    }
    let c = l.accept();
    assert!(c.send_raw(&[2u8; 64]));
    assert!(c.refusal().contains("control message is 64 bytes"));
    t.check(sw, "control message is 64 bytes");

    // The rings: the master writes only tails (and lengths/flags of the
    // buffers the slave posted); here it writes what it must not.
    let ring_attack =
        |sw: &mut Switch, t: &mut Tally, reason: &str, bend: &dyn Fn(&peer::MasterMem)| {
            let c = l.accept();
            let mem = peer::run_master(&c, &peer::hello()).expect("handshake");
            sw.wait_link("hs", true);
            wait_for(Duration::from_secs(5), "the switch to post buffers", || {
                (mem.m2s.head() != 0).then_some(())
            });
            bend(&mem);
            for irq in &mem.irqs {
                peer::kick(irq);
            }
            assert!(c.refusal().contains(reason));
            t.check(sw, reason);
        };
    ring_attack(sw, &mut t, "m2s tail", &|m| {
        m.m2s.set_tail(m.m2s.head().wrapping_add(1))
    });
    ring_attack(sw, &mut t, "outside the shared memory", &|m| {
        m.m2s.set_desc(
            0,
            Desc {
                flags: 0,
                region: 0,
                length: 64,
                offset: u32::MAX - 0x3f,
            },
        );
        m.m2s.set_tail(1);
    });
    ring_attack(sw, &mut t, "outside the shared memory", &|m| {
        m.m2s.set_desc(
            0,
            Desc {
                region: 9,
                length: 64,
                ..m.m2s.desc(0)
            },
        );
        m.m2s.set_tail(1);
    });
    // The S2M tail runs past what the switch published: found on its next
    // transmit (the loop's flooded frames). Half the counter space ahead, so
    // no head the switch may publish meanwhile makes it valid.
    ring_attack(sw, &mut t, "s2m tail", &|m| {
        m.s2m.set_tail(m.s2m.head().wrapping_add(0x8000))
    });
    sw.cli_ok(&["port", "del", "hs"]);
    t.attacks
}

/// Frames shorter than an Ethernet header: the switch reads them from the
/// hostile ports' rings and drops them (`runt`), so nothing a hostile peer
/// sends joins the good loop.
const RUNT: [u8; 10] = [0xff; 10];

/// The switch is the vhost-user backend; a frontend written for the test
/// (rust-vmm's protocol side, our rings) breaks requests, memory and rings.
fn attack_vhost_frontend(sw: &mut Switch, good: &GoodLoop) -> usize {
    let sock = add_port(sw, "hv", &["--kind", "vhost-user", "--role", "server"]);
    let mut t = Tally::new(sw, "hv", good);

    // A well-behaved frontend first: its frames are read and returned.
    let f = VhostFrontend::connect(&sock).expect("setup");
    sw.wait_link("hv", true);
    for slot in 0..8 {
        vhost_peer::send_frame(&f.guest, slot, &RUNT);
    }
    f.kick(1);
    wait_for(Duration::from_secs(5), "the frames to be used", || {
        (f.guest.used_idx(1) == 8).then_some(())
    });
    drop(f);
    sw.wait_link("hv", false);

    // Requests the switch must refuse.
    let raw = |bytes: &[u8]| {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.write_all(bytes).unwrap();
        s
    };
    // An unknown request code.
    let mut msg = [0u8; 12];
    msg[..4].copy_from_slice(&0xffffu32.to_le_bytes());
    msg[4..8].copy_from_slice(&1u32.to_le_bytes());
    let _s = raw(&msg);
    t.check(sw, "vhost-user request failed");
    // A header announcing more payload than any request has.
    msg[..4].copy_from_slice(&1u32.to_le_bytes());
    msg[8..12].copy_from_slice(&0x10_0000u32.to_le_bytes());
    let _s = raw(&msg);
    t.check(sw, "vhost-user request failed");

    let setup = |f: &VhostFrontend| -> vhost::Result<()> {
        let mut fe = f.fe.clone();
        fe.set_owner()?;
        let feat = fe.get_features()?;
        fe.set_features(feat & (1 << 32 | 1 << 30))?;
        fe.set_protocol_features(vhost::vhost_user::message::VhostUserProtocolFeatures::empty())
    };
    let bare = || VhostFrontend {
        fe: vhost::vhost_user::Frontend::connect(&sock, 2).unwrap(),
        guest: std::sync::Arc::new(Guest::new()),
        kicks: [
            vmm_sys_util::eventfd::EventFd::new(0).unwrap(),
            vmm_sys_util::eventfd::EventFd::new(0).unwrap(),
        ],
        calls: [
            vmm_sys_util::eventfd::EventFd::new(0).unwrap(),
            vmm_sys_util::eventfd::EventFd::new(0).unwrap(),
        ],
    };
    // A memory region larger than its file.
    let f = bare();
    let _ = setup(&f).and_then(|_| f.set_mem_table(&[(0, 2 * MEM, 0)]));
    t.check(sw, "memory region does not fit its file");
    drop(f);
    // Rings outside the memory table.
    let f = bare();
    let _ = setup(&f)
        .and_then(|_| f.set_mem_table(&[(0, 0x4000, 0)]))
        .and_then(|_| f.fe.set_vring_num(1, QSIZE))
        .and_then(|_| f.set_vring_addr(1, f.guest.base()));
    t.check(sw, "vhost-user request failed");
    drop(f);

    // The rings, after a complete set-up.
    let ring_attack = |sw: &mut Switch, t: &mut Tally, reason: &str, bend: &dyn Fn(&Guest)| {
        let f = VhostFrontend::connect(&sock).expect("setup");
        sw.wait_link("hv", true);
        bend(&f.guest);
        f.kick(0);
        f.kick(1);
        t.check(sw, reason);
        drop(f);
        sw.wait_link("hv", false);
    };
    let buf = Guest::buffer(0);
    let tx = |g: &Guest, addr: u64, len: u32, flags: u16, next: u16| {
        g.desc(1, 0, addr, len, flags, next);
        g.publish(1, 0);
    };
    ring_attack(sw, &mut t, "a loop", &|g| {
        g.desc(1, 1, buf, 64, F_NEXT, 0);
        tx(g, buf, 12, F_NEXT, 1); // 0 -> 1 -> 0
    });
    ring_attack(sw, &mut t, "a next index past the table", &|g| {
        tx(g, buf, 12, F_NEXT, 999)
    });
    ring_attack(sw, &mut t, "outside guest memory", &|g| {
        tx(g, MEM + 0x1000, 100, 0, 0)
    });
    ring_attack(sw, &mut t, "outside guest memory", &|g| {
        tx(g, buf, u32::MAX - 8, 0, 0)
    });
    ring_attack(sw, &mut t, "device-writable", &|g| {
        tx(g, buf, 76, F_WRITE, 0)
    });
    ring_attack(sw, &mut t, "shorter than the virtio-net header", &|g| {
        tx(g, buf, 8, 0, 0)
    });
    ring_attack(
        sw,
        &mut t,
        "more descriptors to process than queue size",
        &|g| g.set_avail_idx(1, QSIZE + 1),
    );
    ring_attack(sw, &mut t, "avail ring names descriptor 999", &|g| {
        g.publish(1, 999)
    });
    // The driver's receive queue, found when the switch floods the loop's
    // frames to this port: buffers the device may not write, and buffers
    // outside memory.
    let rx = |g: &Guest, addr: &dyn Fn(u16) -> u64, flags: u16| {
        for i in 0..QSIZE {
            g.desc(0, i, addr(i), 2048, flags, 0);
            g.publish(0, i);
        }
    };
    ring_attack(
        sw,
        &mut t,
        "driver-readable buffer on a receive queue",
        &|g| rx(g, &|i| Guest::buffer(QSIZE + i), 0),
    );
    ring_attack(sw, &mut t, "outside guest memory", &|g| {
        rx(g, &|i| MEM + u64::from(i) * 2048, F_WRITE)
    });

    // The frontend shrinks the file behind its memory under traffic (a
    // vhost-user frontend's fds cannot be required to be sealed): the
    // switch's next access to it faults (SIGBUS), which costs the frontend
    // its port, not the switch its life. The test touches the truncated
    // memory no more.
    let f = VhostFrontend::connect(&sock).expect("setup");
    sw.wait_link("hv", true);
    for slot in 0..8 {
        vhost_peer::send_frame(&f.guest, slot, &RUNT);
    }
    f.guest.file.set_len(0).expect("truncate the guest memory");
    f.kick(1);
    t.check(sw, "truncated the memory it shares");
    drop(f);
    sw.wait_link("hv", false);

    // The memory table changes while frames flow: the frontend keeps
    // sending, the switch parks and remaps, no frame is lost; then a table
    // that no longer holds the rings costs the frontend its port.
    let f = VhostFrontend::connect(&sock).expect("setup");
    sw.wait_link("hv", true);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (g, stop) = (f.guest.clone(), stop.clone());
        let kick = f.kicks[1].try_clone().unwrap();
        std::thread::spawn(move || {
            let mut sent = 0u16;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if sent.wrapping_sub(g.used_idx(1)) < QSIZE {
                    vhost_peer::send_frame(&g, sent % QSIZE, &RUNT);
                    sent = sent.wrapping_add(1);
                    let _ = kick.write(1);
                } else {
                    std::thread::yield_now();
                }
            }
            sent
        })
    };
    let half = MEM / 2;
    for i in 0..20 {
        let table: &[(u64, u64, u64)] = if i % 2 == 0 {
            &[(0, half, 0), (half, half, half)]
        } else {
            &[(0, MEM, 0)]
        };
        f.set_mem_table(table).expect("SET_MEM_TABLE");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.join().unwrap();
    wait_for(
        Duration::from_secs(5),
        "every frame sent to be used",
        || (f.guest.used_idx(1) == sent).then_some(()),
    );
    assert!(sw.stats("hv").link_up);
    assert_eq!(
        sw.port("hv").status.faults,
        t.faults,
        "no fault for a valid table"
    );
    eprintln!("vhost-user: {sent} frames sent and all used across 20 memory table changes");
    t.survived(sw);
    // virtio-queue logs the rings it can no longer reach as an ERROR.
    sw.expect_error("virtio queue descriptor table is not accessible");
    f.set_mem_table(&[(0x10_0000, 0x10_0000, 0x10_0000)])
        .expect("SET_MEM_TABLE");
    t.check(sw, "lie outside guest memory");
    drop(f);
    assert!(sw.stats("hv").totals.drops[&switchyard_api::DropReason::Runt] >= 8);
    sw.cli_ok(&["port", "del", "hv"]);
    t.attacks
}

#[test]
fn hostile_peers_lose_only_their_own_port() {
    let _g = serial();
    let mut sw = Switch::start(BRIDGE);
    let good = GoodLoop::start(&sw);
    let as_slave = attack_as_slave(&mut sw, &good);
    let as_master = attack_as_master(&mut sw, &good);
    let as_frontend = attack_vhost_frontend(&mut sw, &good);
    good.assert_flowing(&sw);
    let looped = good.assert_nothing_lost(&sw);
    sw.assert_alive();
    eprintln!(
        "attacks survived: {as_slave} by a memif slave, {as_master} by a memif master, \
         {as_frontend} by a vhost-user frontend; {looped} frames looped meanwhile, 0 lost"
    );
}

/// The ways a hostile peer or local client holds a connection. One line
/// each in [`SHAPES`].
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Connects and says nothing.
    Silent,
    /// Sends the start of a message and nothing more.
    PartialHeader,
    /// Sends a whole header whose body never comes.
    HeaderWithoutBody,
    /// Sends a message one byte every half second.
    Drip,
    /// Opens this many connections and holds them.
    Many(usize),
    /// Sends requests that are answered, and never reads the answers.
    NeverReads,
}

impl Shape {
    /// Whether a vhost-user frontend holding its connection this way
    /// breaks the protocol (a message left unfinished, replies unread),
    /// which costs it the connection, counted as a fault.
    fn breaks_vhost_user(self) -> bool {
        match self {
            Shape::PartialHeader | Shape::HeaderWithoutBody | Shape::Drip | Shape::NeverReads => {
                true
            }
            Shape::Silent | Shape::Many(_) => false,
        }
    }
}

const SHAPES: &[Shape] = &[
    Shape::Silent,
    Shape::PartialHeader,
    Shape::HeaderWithoutBody,
    Shape::Drip,
    Shape::Many(40),
    Shape::NeverReads,
];

/// The sockets a pod or a local user can reach.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    /// A vhost-user port's socket (the switch is server).
    VhostUser,
    /// A memif port's socket (the switch is master).
    Memif,
    /// The control socket.
    Control,
}

impl Target {
    /// A request that is answered, in this socket's protocol.
    fn request(self) -> Vec<u8> {
        match self {
            // GET_FEATURES, version 1, no body.
            Target::VhostUser => [1u32, 1, 0].iter().flat_map(|w| w.to_le_bytes()).collect(),
            // A memif message is 128 bytes (HELLO is what the master sends).
            Target::Memif => vec![0u8; 128],
            Target::Control => b"{\"op\":\"port_list\"}\n".to_vec(),
        }
    }

    /// A header announcing a body that never comes.
    fn header_only(self) -> Vec<u8> {
        match self {
            // SET_OWNER-sized header claiming an 8-byte body.
            Target::VhostUser => [3u32, 1, 8].iter().flat_map(|w| w.to_le_bytes()).collect(),
            // Seqpacket messages come whole: a short one instead.
            Target::Memif => vec![1u8; 16],
            Target::Control => b"{\"op\":\"port_add\",\"port\":{\"name\":".to_vec(),
        }
    }

    fn connect(self, path: &str) -> Option<std::os::fd::OwnedFd> {
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        let ty = match self {
            Target::Memif => SockType::SeqPacket,
            _ => SockType::Stream,
        };
        let fd = socket(AddressFamily::Unix, ty, SockFlag::SOCK_CLOEXEC, None).ok()?;
        connect(fd.as_raw_fd(), &UnixAddr::new(path).ok()?).ok()?;
        Some(fd)
    }
}

/// Lets attackers go when dropped (also when a check fails, so none is
/// left holding a connection); until then they keep at it.
struct Release(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Release {
    fn new() -> Release {
        Release(Default::default())
    }

    /// Whether the attack is still on, for an attacker's thread.
    fn held(&self) -> impl Fn() -> bool + Send + 'static {
        let released = self.0.clone();
        move || !released.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs `shape` against `path` until `release` is dropped, on threads of
/// its own; each thread says on `ready` when it has connected (false: it
/// could not).
fn attack(
    target: Target,
    path: &str,
    shape: Shape,
    release: &Release,
    ready: &std::sync::mpsc::Sender<bool>,
) -> Vec<std::thread::JoinHandle<()>> {
    use nix::sys::socket::{send, MsgFlags};
    let count = match shape {
        Shape::Many(n) => n,
        _ => 1,
    };
    (0..count)
        .map(|_| {
            let path = path.to_string();
            let ready = ready.clone();
            let held = release.held();
            std::thread::spawn(move || {
                let Some(fd) = target.connect(&path) else {
                    let _ = ready.send(false);
                    return;
                };
                let _ = ready.send(true);
                let put = |b: &[u8]| {
                    send(
                        fd.as_raw_fd(),
                        b,
                        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                    )
                    .is_ok()
                };
                match shape {
                    Shape::Silent | Shape::Many(_) => {}
                    Shape::PartialHeader => {
                        let r = target.request();
                        put(&r[..r.len().min(4)]);
                    }
                    Shape::HeaderWithoutBody => {
                        put(&target.header_only());
                    }
                    Shape::Drip => {
                        let r = target.request();
                        for b in r.chunks(1) {
                            if !held() || !put(b) {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                    Shape::NeverReads => {
                        // As fast as the switch takes them.
                        let r = target.request();
                        while held() {
                            match send(
                                fd.as_raw_fd(),
                                &r,
                                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                            ) {
                                Ok(_) => {}
                                Err(nix::errno::Errno::EAGAIN) => {
                                    std::thread::sleep(Duration::from_millis(1))
                                }
                                Err(_) => break,
                            }
                        }
                    }
                }
                while held() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                drop(fd);
            })
        })
        .collect()
}

/// How long an API call may take while peers attack before the API counts
/// as starved. A liveness bound, not a latency figure: how fast the API
/// answers under attack is `benches/loop/api_bench.py`'s to measure (see
/// docs/benchmarks.md); this VM's speed drifts up to 3x and the tests'
/// dependencies are debug builds, so a test asserts only that the API
/// still answers. The attackers hold on until the calls are done, so a
/// call a peer stalls is not answered in time, rather than answered once
/// the attack ends.
const NOT_STARVED: Duration = Duration::from_secs(15);

/// Runs `cmd` with `input` on its stdin, which must succeed within
/// [`NOT_STARVED`]; returns how long it took. One still running then is
/// killed, and fails the test: `what` was starved.
fn answered(what: &str, mut cmd: std::process::Command, input: &[u8]) -> Duration {
    use std::io::Write;
    use std::process::Stdio;
    let t = std::time::Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // Waited for on a thread of its own, reading its output meanwhile (a
    // full pipe would hold it up).
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    let Ok(out) = ended.recv_timeout(NOT_STARVED) else {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        panic!("{what}: no answer in {NOT_STARVED:?}, the API is starved");
    };
    let took = t.elapsed();
    let out = out.unwrap();
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// Rounds of `port list`, `port add`, `port del` (from the CLI) and a CNI
/// ADD + DEL, at least 3 and for at least 4 s (so calls fall before and
/// after the switch's 2 s message timeout drops the peers that stall):
/// each operation's round trips in order. Each must be answered within
/// [`NOT_STARVED`].
fn api_round_trips(sw: &Switch, target: Target) -> Vec<(String, Vec<Duration>)> {
    let cni = common::workspace_bin("switchyard-cni", "switchyard-cni");
    let pods = sw.path("pods");
    let netconf = serde_json::json!({
        "cniVersion": "1.1.0", "name": "live", "type": "switchyard",
        "socketDir": pods, "controlSocket": sw.control(),
    })
    .to_string();
    let cli = |args: &[&str]| {
        let mut c = std::process::Command::new(common::switchyard_bin());
        c.args(args).env("SWITCHYARD_CONTROL", sw.control());
        answered(&format!("{target:?} under attack: {args:?}"), c, b"")
    };
    let run_cni = |cmd: &str| {
        let mut c = std::process::Command::new(&cni);
        c.env_clear().envs([
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "livecontainer"),
            ("CNI_NETNS", "/var/run/netns/live"),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/nonexistent"),
        ]);
        answered(
            &format!("{target:?} under attack: CNI {cmd}"),
            c,
            netconf.as_bytes(),
        )
    };
    let sock = sw.path("live.sock");
    let mut times: Vec<(String, Vec<Duration>)> = Vec::new();
    let mut note = |what: &str, d: Duration| match times.iter_mut().find(|(w, _)| w == what) {
        Some((_, v)) => v.push(d),
        None => times.push((what.to_string(), vec![d])),
    };
    let start = std::time::Instant::now();
    let mut rounds = 0;
    while rounds < 3 || start.elapsed() < Duration::from_secs(4) {
        rounds += 1;
        note("port list", cli(&["port", "list"]));
        note(
            "port add",
            cli(&[
                "port", "add", "live", "--kind", "memif", "--role", "master", "--socket", &sock,
            ]),
        );
        note("port del", cli(&["port", "del", "live"]));
        note("CNI ADD", run_cni("ADD"));
        note("CNI DEL", run_cni("DEL"));
    }
    times
}

#[test]
fn no_peer_or_client_stalls_the_api() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let good = GoodLoop::start(&sw);
    // A port of each kind per shape: one connection is served per port, so
    // every shape gets its own, all attacked at once.
    let ports = |prefix: &str, args: &[&str]| -> Vec<String> {
        (0..SHAPES.len())
            .map(|i| add_port(&sw, &format!("{prefix}{i}"), args))
            .collect()
    };
    let hv = ports("hv", &["--kind", "vhost-user", "--role", "server"]);
    let hm = ports("hm", &["--kind", "memif", "--role", "master"]);
    // Client roles: the pod made a socket it listens on and never accepts,
    // with a backlog of one (the switch's connects must not wait for room).
    let silent_listener = |name: &str, ty: nix::sys::socket::SockType| {
        use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, UnixAddr};
        let p = sw.path(name);
        let fd = socket(AddressFamily::Unix, ty, SockFlag::SOCK_CLOEXEC, None).unwrap();
        bind(fd.as_raw_fd(), &UnixAddr::new(p.as_str()).unwrap()).unwrap();
        listen(&fd, Backlog::new(1).unwrap()).unwrap();
        (p, fd)
    };
    let (vc, _vc_fd) = silent_listener("vc.sock", nix::sys::socket::SockType::Stream);
    let (ms, _ms_fd) = silent_listener("ms.sock", nix::sys::socket::SockType::SeqPacket);
    sw.cli_ok(&[
        "port",
        "add",
        "vc",
        "--kind",
        "vhost-user",
        "--role",
        "client",
        "--socket",
        &vc,
    ]);
    sw.cli_ok(&[
        "port", "add", "ms", "--kind", "memif", "--role", "slave", "--socket", &ms,
    ]);

    let control = sw.control().display().to_string();
    let on_control = vec![control; SHAPES.len()];
    for (target, paths) in [
        (Target::VhostUser, &hv),
        (Target::Memif, &hm),
        (Target::Control, &on_control),
    ] {
        let release = Release::new();
        let (ready, connected) = std::sync::mpsc::channel();
        let threads: Vec<_> = SHAPES
            .iter()
            .zip(paths)
            .flat_map(|(s, path)| attack(target, path, *s, &release, &ready))
            .collect();
        // The API is called once every attacker is in place.
        for _ in &threads {
            let ok = connected.recv_timeout(Duration::from_secs(10));
            assert_eq!(ok, Ok(true), "{target:?}: an attacker could not connect");
        }
        let times = api_round_trips(&sw, target);
        eprintln!("{target:?} under attack, round trips: {times:?}");
        if target == Target::VhostUser {
            // Still attacking: the frontends that stall or never read are
            // dropped by the switch, not by leaving (checked below).
            wait_for(NOT_STARVED, "the stalling frontends dropped", || {
                SHAPES
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.breaks_vhost_user())
                    .all(|(i, _)| sw.port(&format!("hv{i}")).status.faults > 0)
                    .then_some(())
            });
        }
        drop(release);
        for t in threads {
            t.join().unwrap();
        }
        good.assert_flowing(&sw);
    }
    // The client-role ports stayed down, retrying; the API never waited.
    assert!(!sw.port("vc").status.link_up && !sw.port("ms").status.link_up);
    // The vhost-user ports whose frontends left a message unfinished or
    // their replies unread lost those connections, counted as faults.
    for (i, shape) in SHAPES.iter().enumerate() {
        let st = sw.port(&format!("hv{i}")).status;
        assert_eq!(
            st.faults > 0,
            shape.breaks_vhost_user(),
            "{shape:?}: {st:?}"
        );
    }
    good.assert_nothing_lost(&sw);
}
