//! End-to-end: peers and the daemon die under traffic (kill -9, SIGTERM)
//! and come back. Ports are restored from the state dir, peers reconnect
//! and traffic resumes. A crash in the middle of a state write, or a
//! damaged state file, never loses an acknowledged port.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use common::{memif_vdev, serial, virtio_vdev, wait_for, Netns, Switch, Testpmd};
use switchyard_api::{Client, Request};
use switchyard_api::{KindSpec, MemifRole, MemifSpec, PortInfo, PortSpec, SocketAddr};

const BRIDGES: &str = "[[bridge]]\nname = \"a\"\n[[bridge]]\nname = \"b\"\n";
/// Pod A owns its sockets (memif server, virtio_user server=1): the switch
/// is memif slave and vhost-user client on bridge `a`, and redials.
const POD_A: [&str; 2] = ["ms", "vc"];
/// Pod B connects with two memif clients: the switch is master on bridge `b`.
const POD_B: [&str; 2] = ["mm", "mm2"];
/// Pod C connects with a client-mode virtio_user: the switch is vhost-user
/// server on bridge `a`, and pod C receives the flood of pod A's loop.
const POD_C: &str = "vs";
/// Pod C's MAC.
const POD_C_MAC: &str = "02:00:00:00:0c:01";

struct Sockets {
    ms: String,
    vc: String,
    mm: String,
    mm2: String,
    vs: String,
}

fn add_ports(sw: &Switch) -> Sockets {
    let add = |name: &str, kind: &str, role: &str, bridge: &str| {
        let sock = sw.path(&format!("{name}.sock"));
        sw.cli_ok(&[
            "port", "add", name, "--kind", kind, "--role", role, "--socket", &sock, "--bridge",
            bridge,
        ]);
        sock
    };
    let s = Sockets {
        ms: add("ms", "memif", "slave", "a"),
        vc: add("vc", "vhost-user", "client", "a"),
        mm: add("mm", "memif", "master", "b"),
        mm2: add("mm2", "memif", "master", "b"),
        vs: add("vs", "vhost-user", "server", "a"),
    };
    // Pod C's MAC, pinned: the kernel's frames to it (KernelFlood) go to
    // pod C alone, never around pod A's loop.
    sw.cli_ok(&["port", "del", "vs"]);
    sw.cli_ok(&[
        "port",
        "add",
        "vs",
        "--kind",
        "vhost-user",
        "--role",
        "server",
        "--socket",
        &s.vs,
        "--bridge",
        "a",
        "--mac",
        POD_C_MAC,
    ]);
    s
}

/// Pod A: one testpmd forwarding its memif port into its virtio port and
/// back (io mode), so frames loop through bridge `a`. A server that was
/// killed leaves its socket files behind, which DPDK cannot bind over:
/// they are cleared first, as a restarted pod gets a fresh directory.
fn pod_a(s: &Sockets) -> Testpmd {
    let _ = std::fs::remove_file(&s.ms);
    let _ = std::fs::remove_file(&s.vc);
    Testpmd::start(
        &[
            memif_vdev(0, "server", &s.ms, "mac=02:00:00:00:0a:01"),
            virtio_vdev(1, &s.vc, true, "mac=02:00:00:00:0a:02"),
        ],
        &["--forward-mode=io"],
    )
}

/// Pod B: the same loop through bridge `b`, over two memif clients.
fn pod_b(s: &Sockets) -> Testpmd {
    Testpmd::start(
        &[
            memif_vdev(0, "client", &s.mm, "mac=02:00:00:00:0b:01"),
            memif_vdev(1, "client", &s.mm2, "mac=02:00:00:00:0b:02"),
        ],
        &["--forward-mode=io"],
    )
}

/// Pod C: receives what bridge `a` floods to it.
fn pod_c(s: &Sockets) -> Testpmd {
    Testpmd::start(
        &[virtio_vdev(0, &s.vs, false, &format!("mac={POD_C_MAC}"))],
        &["--forward-mode=rxonly"],
    )
}

/// Both ports of a pod keep receiving.
fn flowing(sw: &Switch, pod: [&str; 2]) {
    let rx = |p: &str| sw.stats(p).totals.rx_packets;
    let (a, b) = (rx(pod[0]), rx(pod[1]));
    wait_for(
        Duration::from_secs(15),
        &format!("frames to loop through {pod:?}"),
        || (rx(pod[0]) > a + 1000 && rx(pod[1]) > b + 1000).then_some(()),
    );
}

/// Pod C keeps receiving the flood of pod A's loop.
fn flooded(sw: &Switch) {
    let tx = || sw.stats(POD_C).totals.tx_packets;
    let before = tx();
    wait_for(Duration::from_secs(15), "frames flooded to pod C", || {
        (tx() > before + 1000).then_some(())
    });
}

/// Waits for a pod's links, puts frames into its loop and sees them loop.
fn start_loop(sw: &Switch, t: &mut Testpmd, pod: [&str; 2]) {
    for p in pod {
        sw.wait_link(p, true);
    }
    t.send_bursts(1);
    flowing(sw, pod);
}

/// Kills `victim` (the peer of ports `dead`) with SIGKILL while frames
/// flow through each of those ports, checks that only those ports went
/// down, with their counters kept, and that `still` (the rest of the
/// traffic) keeps flowing, then starts the pod again.
fn kill_and_return(
    sw: &mut Switch,
    victim: Testpmd,
    dead: &[&str],
    still: &dyn Fn(&Switch),
    restart: impl Fn() -> Testpmd,
) -> Testpmd {
    // Frames in either direction, each port.
    let moved = |sw: &Switch| -> Vec<u64> {
        dead.iter()
            .map(|p| {
                let t = sw.stats(p).totals;
                t.rx_packets + t.tx_packets
            })
            .collect()
    };
    let before = moved(sw);
    let at_kill = wait_for(
        Duration::from_secs(5),
        &format!("frames through {dead:?} at the kill"),
        || Some(moved(sw)).filter(|now| now.iter().zip(&before).all(|(n, b)| n > b)),
    );
    victim.kill9();
    for p in dead {
        sw.wait_link(p, false);
    }
    let after = moved(sw);
    assert!(
        after.iter().zip(&at_kill).all(|(a, k)| a >= k),
        "{dead:?}: counters {at_kill:?} at the kill, {after:?} after"
    );
    still(sw);
    sw.assert_alive();
    let t = restart();
    for p in dead {
        sw.wait_link(p, true);
    }
    t
}

fn start_all(sw: &Switch, s: &Sockets) -> (Testpmd, Testpmd, Testpmd) {
    let mut a = pod_a(s);
    let mut b = pod_b(s);
    let c = pod_c(s);
    start_loop(sw, &mut a, POD_A);
    start_loop(sw, &mut b, POD_B);
    sw.wait_link(POD_C, true);
    flooded(sw);
    (a, b, c)
}

#[test]
fn testpmd_killed_mid_traffic_in_every_role_comes_back() {
    let _g = serial();
    let mut sw = Switch::start(BRIDGES);
    let s = add_ports(&sw);
    let (a, b, c) = start_all(&sw, &s);

    // Each pod in turn dies mid-traffic: its ports go down, the others'
    // traffic never stops, the switch runs on; the pod returns and its
    // traffic runs again.
    let mut a = kill_and_return(&mut sw, a, &POD_A, &|sw| flowing(sw, POD_B), || pod_a(&s));
    a.send_bursts(1);
    flowing(&sw, POD_A);
    let mut b = kill_and_return(&mut sw, b, &POD_B, &|sw| flowing(sw, POD_A), || pod_b(&s));
    b.send_bursts(1);
    flowing(&sw, POD_B);
    let still = |sw: &Switch| {
        flowing(sw, POD_A);
        flowing(sw, POD_B);
    };
    let c = kill_and_return(&mut sw, c, &[POD_C], &still, || pod_c(&s));
    flooded(&sw);
    for p in POD_A.iter().chain(&POD_B).chain(&[POD_C]) {
        let st = sw.port(p).status;
        assert!(st.connects >= 2, "{p}: {st:?}");
        assert_eq!(st.faults, 0, "{p}: a dead peer is no protocol fault");
    }
    drop((a, b, c));
}

/// A kernel flood through bridge `k`: broadcast frames written by a raw
/// socket onto tap `k1` (a port of the switch) as fast as Python can, which
/// the switch floods to its tap port `k2`; and frames to pod C's pinned MAC
/// onto tap `ka` of bridge `a`, which reach pod C alone (so pod C receives
/// while pods A and B are paused). Killed when dropped.
struct KernelFlood(std::process::Child);

impl KernelFlood {
    const SCRIPT: &'static str = "import socket\n\
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
        s.bind(('k1', 0))\n\
        a = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
        a.bind(('ka', 0))\n\
        f = bytes.fromhex('ffffffffffff02000000f00188b5') + bytes(46)\n\
        c = bytes.fromhex('020000000c0102000000f00288b5') + bytes(46)\n\
        while True:\n\
        \x20   for sock, frame in ((s, f), (a, c)):\n\
        \x20       try:\n\
        \x20           sock.send(frame)\n\
        \x20       except OSError:\n\
        \x20           pass\n";

    fn start(sw: &Switch, ns: &Netns) -> KernelFlood {
        for (p, bridge) in [("k1", "k"), ("k2", "k"), ("ka", "a")] {
            sw.cli_ok(&[
                "port",
                "add",
                p,
                "--kind",
                "tap",
                "--interface",
                p,
                "--bridge",
                bridge,
            ]);
            ns.sh_ok(&format!("ip link set {p} up"));
        }
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-c", Self::SCRIPT])
            .spawn()
            .expect("python3");
        KernelFlood(child)
    }

    /// The switch keeps carrying the flood.
    fn flowing(sw: &Switch) {
        let tx = || sw.stats("k2").totals.tx_packets;
        let before = tx();
        wait_for(
            Duration::from_secs(15),
            "the kernel's flood through k",
            || (tx() > before + 1000).then_some(()),
        );
    }
}

impl Drop for KernelFlood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn daemon_stopped_or_killed_under_traffic_restores_ports_and_traffic_resumes() {
    let _g = serial();
    let ns = Netns::new("restart");
    let mut sw = Switch::start_in(
        Some(&ns.name),
        &format!("{BRIDGES}[[bridge]]\nname = \"k\"\n"),
    );
    let s = add_ports(&sw);
    let specs = |sw: &Switch| -> Vec<(String, String, String)> {
        let mut v: Vec<_> = sw
            .client()
            .call_as::<Vec<PortInfo>>(&Request::PortList)
            .unwrap()
            .into_iter()
            .filter(|p| p.spec.kind.interface().is_none())
            .map(|p| (p.name().into(), p.role().into(), p.socket()))
            .collect();
        v.sort();
        v
    };
    let before = specs(&sw);
    assert_eq!(before.len(), 5);
    let (mut a, mut b, mut c) = start_all(&sw, &s);
    let _flood = KernelFlood::start(&sw, &ns);

    for kill in [false, true] {
        // Traffic is flowing through every bridge.
        flowing(&sw, POD_A);
        flowing(&sw, POD_B);
        KernelFlood::flowing(&sw);
        // The memif pods stop polling while the switch is away: DPDK's memif
        // driver may crash otherwise (see Testpmd::pause). Pod C, a
        // client-mode virtio_user receiving the flood, polls on: it must
        // survive the switch going under traffic (docs/interop.md). The
        // kernel's flood keeps the switch under traffic when it goes.
        for t in [&mut a, &mut b] {
            t.pause();
        }
        flooded(&sw);
        KernelFlood::flowing(&sw);
        if kill {
            sw.kill9();
        } else {
            sw.stop();
        }
        sw.spawn();
        assert_eq!(specs(&sw), before, "every port restored from the state dir");
        for sock in [&s.mm, &s.mm2, &s.vs] {
            assert!(Path::new(sock).exists(), "{sock} listens again");
        }
        for t in [&mut a, &mut b, &mut c] {
            t.assert_alive();
        }
        KernelFlood::flowing(&sw);
        // Pod A owns its sockets: the switch redials, and pod A's loop
        // resumes once it sends again (frames in flight died with the
        // switch).
        start_loop(&sw, &mut a, POD_A);
        // Pod B's memif clients reattach when the application restarts its
        // ports, as it does on link down.
        b.cmd("port stop all");
        b.cmd("port start all");
        start_loop(&sw, &mut b, POD_B);
        // DPDK's client-mode virtio_user cannot redial (see docs/interop.md):
        // pod C restarts, as Kubernetes would restart it.
        drop(c);
        c = pod_c(&s);
        sw.wait_link(POD_C, true);
        flooded(&sw);
    }
}

fn memif_spec(sw: &Switch, name: &str) -> PortSpec {
    let socket = sw.path(&format!("{name}.sock"));
    PortSpec::new(
        name,
        KindSpec::Memif(MemifSpec::new(
            MemifRole::Master,
            SocketAddr::parse(&socket),
        )),
    )
}

fn port_names(sw: &Switch) -> HashSet<String> {
    sw.client()
        .call_as::<Vec<PortInfo>>(&Request::PortList)
        .unwrap()
        .into_iter()
        .map(|p| p.spec.name)
        .collect()
}

#[test]
fn crashes_mid_write_and_damaged_state_never_lose_acknowledged_ports() {
    let _g = serial();
    let mut sw = Switch::start("");
    let state_dir = sw.dir.path().join("state");
    let state = state_dir.join("state.json");

    // A client adds ports as fast as the daemon answers; the daemon is
    // killed at a different moment each round, in the middle of whatever
    // it is doing (often the state write). Every port it acknowledged must
    // come back; at most the one in flight may come back unacknowledged.
    let mut acked: HashSet<String> = HashSet::new();
    for round in 0..8u64 {
        let control = sw.control();
        let specs: Vec<PortSpec> = (0..1000)
            .map(|i| memif_spec(&sw, &format!("r{round}p{i}")))
            .collect();
        let (first, first_rx) = std::sync::mpsc::channel();
        let adder = std::thread::spawn(move || {
            let mut done = Vec::new();
            let Ok(mut c) = Client::connect(&control) else {
                return done;
            };
            // What a crash leaves acknowledged: the client gives up at the
            // kill instead of asking the restarted switch again.
            c.set_retry(Duration::ZERO);
            for port in specs {
                let name = port.name.clone();
                match c.call(&Request::PortAdd {
                    port: Box::new(port),
                }) {
                    Ok(_) => done.push(name),
                    Err(_) => break,
                }
                if done.len() == 1 {
                    let _ = first.send(());
                }
            }
            done
        });
        // The kill comes a different time after the first acknowledged
        // add each round (counting from then, not from the start, keeps a
        // slow machine from killing the daemon before it added anything).
        first_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the daemon added a port");
        std::thread::sleep(Duration::from_millis(15 + 11 * round));
        sw.kill9();
        let done = adder.join().unwrap();
        assert!(!done.is_empty(), "round {round}: no port was added");
        acked.extend(done);
        sw.spawn();
        let listed = port_names(&sw);
        let lost: Vec<_> = acked.difference(&listed).collect();
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged ports lost: {lost:?}"
        );
        assert!(listed.len() <= acked.len() + 1, "round {round}");
        acked = listed;
    }

    // A crash in the middle of a write leaves a half-written temp file:
    // it is never read as the state.
    let body = std::fs::read(&state).unwrap();
    sw.kill9();
    std::fs::write(state_dir.join(".state.json.tmp"), &body[..body.len() / 2]).unwrap();
    sw.spawn();
    assert_eq!(port_names(&sw), acked);

    // A state file damaged outside the daemon's control is kept aside,
    // never overwritten, and named in the log.
    sw.kill9();
    std::fs::write(&state, &body[..body.len() / 2]).unwrap();
    sw.expect_error("cannot read persisted state");
    sw.spawn();
    assert!(
        sw.log().contains("cannot read persisted state"),
        "{}",
        sw.log()
    );
    let aside: Vec<_> = std::fs::read_dir(&state_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.json.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1);
    sw.cli_ok(&[
        "port",
        "add",
        "after",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("after.sock"),
    ]);
    assert_eq!(
        std::fs::read(aside[0].path()).unwrap(),
        &body[..body.len() / 2]
    );
    assert!(port_names(&sw).contains("after"));
    eprintln!(
        "{} acknowledged ports survived 8 kills mid-write, a torn temp file and a damaged state file",
        acked.len()
    );
}
