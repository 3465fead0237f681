//! Upgrades without an outage: a new switch process takes over the running
//! one's ports (`switchyard run --takeover`) while DPDK testpmd loops
//! frames through them, and nothing is lost, re-sent or reconnected; a new
//! process that dies at any step of the handover leaves the old one running.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    memif_vdev, ping_summary, serial, settled, veth, virtio_vdev, wait_for, Netns, Reap, Switch,
    Testpmd,
};

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";
/// The variable that stops a new switch at a step of the handover
/// (`control::daemon::takeover::STOP_AT_ENV`).
const STOP_AT: &str = "SWITCHYARD_TAKEOVER_STOP_AT";

fn mac(last: u8) -> String {
    format!("02:00:00:00:00:{last:02x}")
}

/// A switch with ports of one kind in both roles, `m` (the switch listens:
/// memif master, vhost-user server) and `s` (it connects: memif slave,
/// vhost-user client), and one testpmd on both (port 0 on `m`, port 1 on
/// `s`) forwarding in mac mode: each port's frames go to the other's MAC,
/// through the switch, and back. `start tx_first` puts 32 frames on each
/// port: 64 frames circulate from then on, and any lost, duplicated or
/// re-read frame changes that number.
struct Loop {
    sw: Switch,
    pmd: Testpmd,
}

#[derive(Clone, Copy)]
enum Kind {
    Memif,
    VhostUser,
    /// Both memif masters, interfaces 0 (`m`) and 1 (`s`) of one socket.
    SharedMemif,
}

/// Frames `start tx_first` puts in circulation: one burst on each port.
const CIRCULATING: u64 = 64;

impl Loop {
    fn start(kind: Kind) -> Loop {
        let sw = Switch::start(BRIDGE);
        let (m, s) = (sw.path("m.sock"), sw.path("s.sock"));
        let (mac0, mac1) = (format!("mac={}", mac(0x0a)), format!("mac={}", mac(0x0b)));
        let vdevs = match kind {
            Kind::Memif | Kind::VhostUser => {
                let (name, roles) = match kind {
                    Kind::VhostUser => ("vhost-user", ["server", "client"]),
                    _ => ("memif", ["master", "slave"]),
                };
                for (port, role, sock) in [("m", roles[0], &m), ("s", roles[1], &s)] {
                    sw.add_port(&[port, "--kind", name, "--role", role, "--socket", sock]);
                }
                match kind {
                    Kind::VhostUser => [
                        virtio_vdev(0, &m, false, &mac0),
                        virtio_vdev(1, &s, true, &mac1),
                    ],
                    _ => [
                        memif_vdev(0, "client", &m, &mac0),
                        memif_vdev(1, "server", &s, &mac1),
                    ],
                }
            }
            Kind::SharedMemif => {
                for (port, id) in [("m", "0"), ("s", "1")] {
                    let sock = ["--socket", &m, "--id", id];
                    sw.add_port(
                        &[&[port, "--kind", "memif", "--role", "master"][..], &sock].concat(),
                    );
                }
                [
                    memif_vdev(0, "client", &m, &format!("id=0,{mac0}")),
                    memif_vdev(1, "client", &m, &format!("id=1,{mac1}")),
                ]
            }
        };
        let peer0 = format!("--eth-peer=0,{}", mac(0x0b));
        let peer1 = format!("--eth-peer=1,{}", mac(0x0a));
        let mut pmd = Testpmd::start(&vdevs, &["--forward-mode=mac", &peer0, &peer1]);
        sw.wait_link("m", true);
        sw.wait_link("s", true);
        pmd.send_bursts(1);
        let l = Loop { sw, pmd };
        l.wait_flowing();
        l
    }

    /// Frames the switch has received from both ports.
    fn switched(&self) -> u64 {
        self.sw.stats("m").totals.rx_packets + self.sw.stats("s").totals.rx_packets
    }

    /// Waits until frames pass the switch (a few thousand more).
    fn wait_flowing(&self) {
        let from = self.switched();
        wait_for(
            Duration::from_secs(10),
            "frames looping through the switch",
            || (self.switched() > from + 5000).then_some(()),
        );
    }

    /// Stops the loop and checks every frame: the switch took each frame
    /// testpmd sent exactly once and sent it on, testpmd received each
    /// frame the switch sent, and the 64 frames put in circulation are all
    /// still there.
    fn reconcile(&mut self) {
        let from = self.pmd.output().len();
        self.pmd.pause();
        let stopped = self.pmd.output()[from..].to_string();
        for d in numbers_after(&stopped, "TX-dropped:") {
            assert_eq!(d, 0, "testpmd could not send a frame:\n{stopped}");
        }
        // The switch sends on what it still holds; testpmd's rings keep
        // what it has not read.
        let sw_counts = settled("the switch's counters", || {
            let (m, s) = (self.sw.stats("m"), self.sw.stats("s"));
            (m.totals, s.totals)
        });
        let (m, s) = sw_counts;
        for t in [&m, &s] {
            assert!(
                t.drops.values().all(|&d| d == 0),
                "switch drops: {:?}",
                t.drops
            );
        }
        let ((rx0, tx0), _) = self.pmd.counters(0);
        let ((rx1, tx1), _) = self.pmd.counters(1);
        assert_eq!(
            m.rx_packets, tx0,
            "the switch took each frame of port 0 once"
        );
        assert_eq!(
            s.rx_packets, tx1,
            "the switch took each frame of port 1 once"
        );
        // Read what waits in testpmd's rings, sending nothing more.
        self.pmd.cmd("set fwd rxonly");
        self.pmd.resume();
        let ((rx0_all, _), _) = settled("testpmd's counters", || self.pmd.counters(0));
        let ((rx1_all, _), _) = self.pmd.counters(1);
        self.pmd.pause();
        assert_eq!(
            rx0_all, m.tx_packets,
            "port 0 received each frame the switch sent it"
        );
        assert_eq!(
            rx1_all, s.tx_packets,
            "port 1 received each frame the switch sent it"
        );
        assert_eq!(
            (rx0_all - rx0) + (rx1_all - rx1),
            CIRCULATING,
            "frames still in circulation"
        );
    }
}

/// Every number that follows `key` in `text`.
fn numbers_after(text: &str, key: &str) -> Vec<u64> {
    text.match_indices(key)
        .filter_map(|(i, _)| {
            text[i + key.len()..]
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
        })
        .collect()
}

/// The connections switch `pid` has accepted on its control socket
/// `control` and still holds: a unix socket accepted on a listener bears
/// the listener's path in `/proc/net/unix`; the listener itself is the one
/// flagged as accepting (`__SO_ACCEPTCON`, 00010000).
fn api_connections(pid: u32, control: &Path) -> usize {
    let held: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let unix = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap();
    let control = control.to_string_lossy();
    unix.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 8 && f[7] == control && f[3] != "00010000" && held.contains(f[6]))
        .count()
}

/// The process's open fds, once it holds no API connection of the test's
/// any more, and its resident memory (kB).
fn footprint(pid: u32, control: &Path) -> (usize, u64) {
    wait_for(
        Duration::from_secs(10),
        "the switch to close the test's API connections",
        || (api_connections(pid, control) == 0).then_some(()),
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = numbers_after(&status, "VmRSS:")[0];
    (fds, rss)
}

/// The default bridge's (learned, flooded) counters.
fn learned_flooded(sw: &Switch) -> (u64, u64) {
    let v: Vec<switchyard_api::BridgeInfo> = sw
        .client()
        .call_as(&switchyard_api::Request::BridgeList)
        .unwrap();
    let b = v.into_iter().find(|b| b.name == "default").unwrap();
    (b.counters.learned, b.counters.flooded)
}

fn connects(sw: &Switch) -> (u64, u64) {
    (sw.port("m").status.connects, sw.port("s").status.connects)
}

#[test]
fn twenty_takeovers_of_memif_ports_lose_no_frame_and_reconnect_no_peer() {
    twenty_takeovers(Kind::Memif);
}

#[test]
fn twenty_takeovers_of_memif_interfaces_on_one_socket_lose_no_frame_and_reconnect_no_peer() {
    twenty_takeovers(Kind::SharedMemif);
}

#[test]
fn twenty_takeovers_of_vhost_user_ports_lose_no_frame_and_reconnect_no_peer() {
    twenty_takeovers(Kind::VhostUser);
}

/// 20 takeovers in a row while testpmd loops frames through ports of
/// `kind`: no frame lost, duplicated or re-read, no peer reconnects, the
/// new switch holds no more fds or memory than the first did.
fn twenty_takeovers(kind: Kind) {
    let _g = serial();
    let mut l = Loop::start(kind);
    assert_eq!(connects(&l.sw), (1, 1));
    // Both MACs are learned: from here on nothing is learned or flooded
    // again, across every takeover (the MAC table and the bridge's
    // counters go over with the ports).
    let counts = learned_flooded(&l.sw);
    assert_eq!(counts.0, 2, "{counts:?}");
    // A capture running at the first takeover ends with it, whole.
    let pcap = l.sw.path("m.pcapng");
    let mut capture = Some(
        Command::new(common::switchyard_bin())
            .args(["capture", "m", "-s", "64", "-w", &pcap])
            .env("SWITCHYARD_CONTROL", l.sw.control())
            .spawn()
            .unwrap(),
    );
    wait_for(Duration::from_secs(10), "the capture file", || {
        std::fs::metadata(&pcap).ok().filter(|m| m.len() > 1000)
    });
    let mut first = None;
    let mut took = Vec::new();
    for i in 0..20 {
        took.push(l.sw.takeover());
        if let Some(mut capture) = capture.take() {
            let status = wait_for(Duration::from_secs(10), "the capture to end", || {
                capture.try_wait().unwrap()
            });
            assert!(status.success(), "capture: {status}");
            // Read to its end: a file cut short says "truncated".
            let read = Command::new("tcpdump")
                .args(["-r", &pcap, "-nn", "-q"])
                .stdout(std::process::Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&read.stderr);
            assert!(read.status.success() && !err.contains("truncated"), "{err}");
            assert!(l
                .sw
                .log()
                .contains("capture ended: the switch stopped or was taken over"));
        }
        let pid = l.sw.child.as_ref().unwrap().id();
        // The new switch forwards: frames keep looping.
        l.wait_flowing();
        assert_eq!(connects(&l.sw), (1, 1), "takeover {i}: a peer reconnected");
        assert_eq!(
            learned_flooded(&l.sw),
            counts,
            "takeover {i}: learned or flooded again"
        );
        // The first new switch's footprint against the last's.
        if i != 0 && i != 19 {
            continue;
        }
        let fp = footprint(pid, &l.sw.control());
        match first {
            None => first = Some(fp),
            Some((fds, rss)) => {
                assert_eq!(fp.0, fds, "takeover {i}: the new switch holds other fds");
                assert!(
                    fp.1 < rss * 3 / 2 + 4096,
                    "takeover {i}: {} kB resident, {rss} kB after the first",
                    fp.1
                );
            }
        }
    }
    let log = l.sw.log();
    assert_eq!(log.matches("handed over: exiting").count(), 20, "{log}");
    assert!(!log.contains("link down"), "{log}");
    let out = l.pmd.output();
    assert!(
        !out.to_lowercase().contains("disconnect"),
        "testpmd saw a disconnect:\n{out}"
    );
    l.reconcile();
    let paused: Vec<f64> = log
        .match_indices("paused_ms=")
        .filter_map(|(i, _)| log[i + 10..].split_whitespace().next()?.parse().ok())
        .collect();
    eprintln!("takeovers took {took:?}; the old switch paused its workers for (ms) {paused:?}");
}

/// Whether process `pid` is stopped (SIGSTOP).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

#[test]
fn a_new_switch_killed_at_any_step_leaves_the_old_one_forwarding_memif() {
    killed_at_each_step(Kind::Memif);
}

#[test]
fn a_new_switch_killed_at_any_step_leaves_the_old_one_forwarding_vhost_user() {
    killed_at_each_step(Kind::VhostUser);
}

/// Starts a new switch taking `sw` over, and kills it once it stops at
/// `step` of the handover (`SWITCHYARD_TAKEOVER_STOP_AT`).
fn kill_a_new_switch_at(sw: &Switch, step: &str) {
    let mut new = Reap(
        sw.command(&["--takeover"], &[(STOP_AT, step)])
            .spawn()
            .unwrap(),
    );
    let pid = new.id();
    wait_for(
        Duration::from_secs(20),
        &format!("the new switch to stop at {step}"),
        || stopped(pid).then_some(()),
    );
    new.kill();
}

/// A new switch stopped and killed at each step of the handover, the last
/// after the go: the old one carries on with every frame and connection,
/// and a takeover afterwards works.
fn killed_at_each_step(kind: Kind) {
    let _g = serial();
    let mut l = Loop::start(kind);
    let old = l.sw.child.as_ref().unwrap().id();
    for step in ["state", "fds", "confirm"] {
        kill_a_new_switch_at(&l.sw, step);
        // The old one carries on, with the same connections.
        l.wait_flowing();
        l.sw.assert_alive();
        assert_eq!(l.sw.child.as_ref().unwrap().id(), old);
        assert_eq!(
            connects(&l.sw),
            (1, 1),
            "killed at {step}: a peer reconnected"
        );
    }
    let log = l.sw.log();
    assert!(
        log.contains("did not confirm after the go"),
        "killed after the go: {log}"
    );
    // And a takeover after all that works.
    l.sw.takeover();
    l.wait_flowing();
    l.reconcile();
}

#[test]
fn refused_takeovers_say_why_and_change_nothing() {
    let _g = serial();
    let mut l = Loop::start(Kind::Memif);

    // A second takeover while one is under way.
    let mut first = Reap(
        l.sw.command(&["--takeover"], &[(STOP_AT, "fds")])
            .spawn()
            .unwrap(),
    );
    let pid = first.id();
    wait_for(
        Duration::from_secs(20),
        "the first new switch to stop",
        || stopped(pid).then_some(()),
    );
    let second = l.sw.command(&["--takeover"], &[]).output().unwrap();
    assert!(
        !second.status.success(),
        "a second takeover at once went ahead"
    );
    first.kill();
    // The control thread runs the handover: once it answers a ping, it has
    // given the killed switch up and takes the next request.
    l.sw.client()
        .call(&switchyard_api::Request::Ping)
        .expect("ping");
    assert!(
        l.sw.log().contains("while another is in progress"),
        "{}",
        l.sw.log()
    );

    // A state version this switch does not write.
    let mut c = UnixStream::connect(l.sw.control()).unwrap();
    c.write_all(b"{\"op\":\"takeover\",\"version\":999}\n")
        .unwrap();
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("SYHO") && answer.contains("version 999"),
        "{answer}"
    );

    // Another configuration.
    let other = l.sw.dir.path().join("other.toml");
    let text =
        "mac_aging_secs = 77\n".to_string() + &std::fs::read_to_string(&l.sw.config).unwrap();
    std::fs::write(&other, text).unwrap();
    let o = Command::new(common::switchyard_bin())
        .args(["run", "--takeover", "--no-restart", "--config"])
        .arg(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("mac_aging_secs"),
        "{err}"
    );

    l.sw.assert_alive();
    l.wait_flowing();
    assert_eq!(connects(&l.sw), (1, 1));
    l.reconcile();
}

#[test]
fn a_new_switch_refuses_state_of_another_version() {
    let _g = serial();
    // The old switch is played here: it answers the takeover request with
    // state of version 999, framed as a switch frames it (`SYHO`, body
    // length, fd count, body).
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.sock");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "control_socket = \"{}\"\nstate_dir = \"{}\"\nsocket_dir = \"{}\"\n",
            control.display(),
            dir.path().join("state").display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let l = UnixListener::bind(&control).unwrap();
    let new = Command::new(common::switchyard_bin())
        .args(["run", "--takeover", "--no-restart", "--config"])
        .arg(&cfg)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first connection is the new switch's probe; the second asks.
    let (_probe, _) = l.accept().unwrap();
    let (mut c, _) = l.accept().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\n") {
        c.read_exact(&mut b).unwrap();
        line.push(b[0]);
    }
    assert!(String::from_utf8_lossy(&line).contains("\"op\":\"takeover\""));
    let body = br#"{"state":{"version":999,"pid":1}}"#;
    let mut frame = b"SYHO".to_vec();
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(body);
    c.write_all(&frame).unwrap();
    let t = Instant::now();
    let out = new.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("version 999"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    // It told the old switch why.
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).unwrap();
    assert!(
        String::from_utf8_lossy(&answer).contains("refused"),
        "{answer:?}"
    );
}

#[test]
fn twenty_takeovers_of_a_tap_uplinks_and_a_vxlan_tunnel_lose_no_ping() {
    let _g = serial();
    // The switch in a node namespace; two hosts behind a veth each, and a
    // third behind the kernel's VXLAN on an underlay veth.
    let (node, host, xhost) = (Netns::new("tkn"), Netns::new("tkh"), Netns::new("tkx"));
    let vhost = Netns::new("tkv");
    veth(&node, "up0", &host, "h0");
    veth(&node, "xu0", &xhost, "x0");
    veth(&node, "ul0", &vhost, "ul1");
    host.sh_ok("ip addr add 10.78.0.2/24 dev h0");
    xhost.sh_ok("ip addr add 10.78.0.3/24 dev x0");
    node.sh_ok("ip addr add 10.79.0.1/24 dev ul0");
    vhost.sh_ok(
        "ip addr add 10.79.0.2/24 dev ul1 && \
         ip link add vx0 type vxlan id 7 dstport 4789 local 10.79.0.2 remote 10.79.0.1 dev ul1 && \
         ip addr add 10.78.0.4/24 dev vx0 && ip link set vx0 up",
    );
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let tap = format!("syt{}", std::process::id() % 100_000);
    sw.add_port(&["t0", "--kind", "tap", "--interface", &tap]);
    sw.add_port(&["up", "--kind", "af-packet", "--interface", "up0"]);
    sw.add_port(&["ux", "--kind", "af-xdp", "--interface", "xu0"]);
    sw.add_port(&[
        "vx",
        "--kind",
        "vxlan",
        "--remote",
        "10.79.0.2",
        "--local",
        "10.79.0.1",
        "--vni",
        "7",
    ]);
    node.sh_ok(&format!(
        "ip link set {tap} up mtu 1450 && ip addr add 10.78.0.1/24 dev {tap}"
    ));
    for ip in ["10.78.0.2", "10.78.0.3", "10.78.0.4"] {
        node.sh_ok(&format!("busybox ping -c 3 -i 0.2 -W 2 {ip}"));
    }
    let before = sw.port("ux").status.peer;
    // A ping every 10 ms to each host (busybox's: the test command
    // installs it), from the node's stack through the tap port and an
    // uplink, while the switch is replaced. Enough of them to outlast the
    // takeovers (checked below).
    const PINGS: u32 = 800;
    let mut pings: Vec<(Reap, String)> = ["10.78.0.2", "10.78.0.3", "10.78.0.4"]
        .into_iter()
        .map(|to| {
            let log = sw.path(&format!("ping-{to}.log"));
            let child = Command::new("ip")
                .args(["netns", "exec", &node.name, "busybox", "ping", "-i", "0.01"])
                .args(["-c", &PINGS.to_string(), to])
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            (Reap(child), log)
        })
        .collect();
    // Each ping under way (a reply in), before the first takeover.
    for (_, log) in &pings {
        wait_for(
            Duration::from_secs(10),
            &format!("a reply in {log}"),
            || {
                std::fs::read_to_string(log)
                    .ok()
                    .filter(|o| o.contains("seq="))
            },
        );
    }
    // Frames the switch received on each port: the node's requests (on
    // the tap port), each host's replies (on an uplink).
    let received = |sw: &Switch| -> Vec<u64> {
        ["t0", "up", "ux", "vx"]
            .map(|p| sw.stats(p).totals.rx_packets)
            .to_vec()
    };
    // One that took every port up, killed after the go: the old switch
    // takes its queues back.
    kill_a_new_switch_at(&sw, "confirm");
    for i in 0..20 {
        sw.takeover();
        // The new switch forwards the pings on every port before it is
        // replaced in turn.
        let from = received(&sw);
        wait_for(
            Duration::from_secs(10),
            &format!("takeover {i}: pings through the new switch on every port"),
            || {
                let now = received(&sw);
                now.iter().zip(&from).all(|(n, f)| n > f).then_some(())
            },
        );
    }
    // The pings outlasted the takeovers: "none lost" speaks for all of
    // them.
    for (ping, log) in &mut pings {
        assert!(
            ping.0.try_wait().unwrap().is_none(),
            "{log}: the ping ended before the last takeover (raise PINGS)"
        );
    }
    for (mut ping, log) in pings {
        let status = wait_for(Duration::from_secs(60), "the pings to end", || {
            ping.0.try_wait().unwrap()
        });
        let out = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            ping_summary(&out),
            Some((PINGS, PINGS)),
            "pings sent and answered (transmitted, received):\n{out}"
        );
        assert!(!out.contains("DUP!"), "{out}");
        assert!(status.success(), "ping: {status}\n{out}");
    }
    for p in ["t0", "up", "ux", "vx"] {
        let st = sw.port(p).status;
        assert!(st.link_up && st.connects == 1, "{p}: {st:?}");
    }
    // The same sockets, in the same mode.
    assert_eq!(sw.port("ux").status.peer, before);
    let log = sw.log();
    assert!(!log.contains("link down"), "{log}");
    assert!(log.contains("af-xdp queues taken over"), "{log}");
    assert!(!log.contains("falling back"), "{log}");
    assert!(log.contains("did not confirm after the go"), "{log}");
    // The last switch holds the program as the first did: deleting the
    // port takes it off the interface.
    assert!(node.sh_ok("ip link show xu0").contains("xdp"));
    sw.cli_ok(&["port", "del", "ux"]);
    let shown = node.sh_ok("ip link show xu0");
    assert!(!shown.contains("xdp"), "{shown}");
}

#[test]
fn a_lingering_switch_holds_nothing_and_exits_when_stopped() {
    let _g = serial();
    let mut l = Loop::start(Kind::Memif);
    // A switch that lingers once replaced, as the DaemonSet runs it.
    let mut first = l.sw.replace(&["--linger"]);
    let st = wait_for(Duration::from_secs(30), "the first switch to exit", || {
        first.try_wait().unwrap()
    });
    assert!(st.success());
    wait_for(
        Duration::from_secs(10),
        "the lingering switch's API",
        || l.sw.client().call(&switchyard_api::Request::Ping).ok(),
    );
    l.wait_flowing();
    let mut lingering = Reap(l.sw.replace(&[]));
    let pid = lingering.id();
    wait_for(Duration::from_secs(30), "the switch to linger", || {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (cmd == b"switchyard\0linger\0").then_some(())
    });
    l.wait_flowing();
    // The same process, holding nothing of the switch's (only what it
    // inherited, such as its standard streams), on one thread.
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| l.display().to_string())
        .collect();
    assert!(
        !fds.iter()
            .any(|l| ["socket:", "memfd:", "anon_inode:", "/dev/net/tun"]
                .iter()
                .any(|k| l.contains(k))),
        "the lingering switch holds {fds:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_eq!(numbers_after(&status, "Threads:"), [1], "{status}");
    // Its readiness: another container's switch serves... here, the same
    // PID namespace: `ready` says yes for the new one.
    assert!(l.sw.cli(&["ready"]).status.success());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = wait_for(
        Duration::from_secs(10),
        "the lingering switch to exit",
        || lingering.0.try_wait().unwrap(),
    );
    assert!(st.success(), "{st}");
    l.wait_flowing();
    assert_eq!(connects(&l.sw), (1, 1));
    l.reconcile();
}

#[test]
fn a_refused_takeover_falls_back_to_a_restart() {
    let _g = serial();
    // Two hosts behind af-packet ports: the kernel is a peer that is there
    // again when the ports are made again after the restart.
    let (node, h1, h2) = (Netns::new("rsn"), Netns::new("rs1"), Netns::new("rs2"));
    veth(&node, "a0", &h1, "e1");
    veth(&node, "b0", &h2, "e2");
    h1.sh_ok("ip addr add 10.77.9.1/24 dev e1");
    h2.sh_ok("ip addr add 10.77.9.2/24 dev e2");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    sw.add_port(&["a", "--kind", "af-packet", "--interface", "a0"]);
    sw.add_port(&["b", "--kind", "af-packet", "--interface", "b0"]);
    h1.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.77.9.2");
    // The new switch's configuration differs: the takeover is refused,
    // naming the difference, and the new switch restarts the old one.
    let text = "mac_aging_secs = 77\n".to_string() + &std::fs::read_to_string(&sw.config).unwrap();
    std::fs::write(&sw.config, text).unwrap();
    let mut old = sw.replace(&[]);
    let st = wait_for(Duration::from_secs(30), "the old switch to stop", || {
        old.try_wait().unwrap()
    });
    assert!(st.success(), "{st}");
    // The new switch binds the control socket once the old one has
    // removed it: a moment after the old one exits.
    sw.wait_answering();
    sw.assert_alive();
    // The persisted ports are made again: frames pass.
    h1.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.77.9.2");
    let log = sw.log();
    assert!(log.contains("mac_aging_secs"), "{log}");
    assert!(log.contains("falling back to a restart"), "{log}");
    assert!(log.contains("asked to stand down"), "{log}");
}

#[test]
fn only_the_switchs_own_user_may_take_it_over_or_stop_it() {
    let _g = serial();
    // The control socket is open to a group; a member of it, not root,
    // may use the API but not take the switch over (every pod's memory
    // would be its) nor stop it.
    let mut sw = Switch::start(&format!("control_group = 4242\n{BRIDGE}"));
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=4242", "--clear-groups"])
        .arg(common::switchyard_bin())
        .args(["run", "--takeover", "--config"])
        .arg(&sw.config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("only the switch's own user"), "{err}");
    sw.assert_alive();
    assert!(sw.log().contains("asked by another user: refused"));
}

/// API clients across takeovers and restarts, as the CNI plugin and the
/// CLI make their calls: one client keeps its connection across calls,
/// another connects for each, both adding, listing and deleting ports
/// while the switch is taken over 10 times and restarted twice. Every call
/// succeeds (a call the old switch did not take is asked again of the new
/// one), and at the end the switch holds exactly the ports the clients
/// think it holds.
#[test]
fn api_calls_across_takeovers_and_restarts_all_succeed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use switchyard_api::{Client, Request};

    let _serial = serial();
    let mut sw = Switch::start(BRIDGE);
    let control = sw.control();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = |label: &'static str, keep: bool| {
        let (control, stop) = (control.clone(), stop.clone());
        let mut churn =
            common::churn::PortChurn::new(label, sw.dir.path().to_path_buf(), "default");
        std::thread::spawn(move || {
            let mut kept = Client::connect(&control).unwrap();
            let (mut calls, mut errors) = (0u32, Vec::new());
            while !stop.load(Ordering::Acquire) {
                let (name, req) = churn.next();
                // A connection kept across calls, or one per call (made at
                // the call, as the CNI plugin's: a restart between stop and
                // start costs it a latency too).
                let mut fresh;
                let c = if keep {
                    &mut kept
                } else {
                    fresh = Client::lazy(&control);
                    &mut fresh
                };
                calls += 1;
                match c.call(&req).and_then(|_| c.call(&Request::PortList)) {
                    Ok(_) => churn.done(name),
                    Err(e) => errors.push(format!("{req:?}: {e}")),
                }
            }
            (calls, errors, churn.held())
        })
    };
    let kept = worker("k", true);
    let fresh = worker("f", false);
    for round in 0..12 {
        std::thread::sleep(Duration::from_millis(150));
        if round % 6 == 5 {
            sw.stop();
            sw.spawn();
        } else {
            sw.takeover();
        }
    }
    std::thread::sleep(Duration::from_millis(150));
    stop.store(true, Ordering::Release);
    let mut expected = HashSet::new();
    for (label, t) in [("kept", kept), ("fresh", fresh)] {
        let (calls, errors, held) = t.join().unwrap();
        assert!(calls > 20, "{label}: only {calls} calls");
        assert!(
            errors.is_empty(),
            "{label}: {} of {calls} calls failed:\n{}",
            errors.len(),
            errors.join("\n")
        );
        expected.extend(held);
    }
    let ports: HashSet<String> = sw
        .client()
        .call_as::<Vec<switchyard_api::PortInfo>>(&Request::PortList)
        .unwrap()
        .into_iter()
        .map(|p| p.spec.name)
        .collect();
    assert_eq!(ports, expected, "the switch's ports and the clients' view");
    sw.stop();
}

/// Ports nobody is connected to are taken up by the new switch before the
/// old one pauses (the prepare step, while it forwards): the pause holds
/// only the connected port. Afterwards each serves its peer as any port
/// does: another interface of the memif socket a connected interface
/// shares, a memif socket of its own, a vhost-user socket, and a memif
/// slave that connects once its peer is there.
#[test]
fn quiet_ports_are_taken_up_before_the_pause_and_serve_their_peers_after() {
    let _serial = serial();
    let mut sw = Switch::start(BRIDGE);
    let (shared, own, vhost, slave) = (
        sw.path("m.sock"),
        sw.path("q.sock"),
        sw.path("v.sock"),
        sw.path("s.sock"),
    );
    for (port, id) in [("a", "0"), ("b", "1")] {
        sw.add_port(&[
            port, "--kind", "memif", "--role", "master", "--socket", &shared, "--id", id,
        ]);
    }
    sw.add_port(&["c", "--kind", "memif", "--role", "master", "--socket", &own]);
    sw.add_port(&[
        "d",
        "--kind",
        "vhost-user",
        "--role",
        "server",
        "--socket",
        &vhost,
    ]);
    sw.add_port(&[
        "e", "--kind", "memif", "--role", "slave", "--socket", &slave,
    ]);
    let mut first = Testpmd::start(
        &[memif_vdev(
            0,
            "client",
            &shared,
            &format!("id=0,mac={}", mac(1)),
        )],
        &["--forward-mode=rxonly"],
    );
    sw.wait_link("a", true);
    for _ in 0..3 {
        sw.takeover();
    }
    let log = sw.log();
    assert_eq!(
        log.matches("prepared=4 in_pause=1").count(),
        3,
        "4 quiet ports taken up before each pause, 1 in it:\n{log}"
    );
    let mut second = Testpmd::start(
        &[
            memif_vdev(0, "client", &shared, &format!("id=1,mac={}", mac(2))),
            memif_vdev(1, "client", &own, &format!("mac={}", mac(3))),
            virtio_vdev(2, &vhost, false, &format!("mac={}", mac(4))),
            memif_vdev(3, "server", &slave, &format!("mac={}", mac(5))),
        ],
        &["--forward-mode=rxonly"],
    );
    for p in ["b", "c", "d", "e"] {
        sw.wait_link(p, true);
    }
    // The connected pod's frames (to a MAC nobody has: flooded) reach each.
    first.send_bursts(1);
    for port in 0..4 {
        assert_eq!(
            second.wait_rx(port, 32),
            32,
            "port {port} of the second pod"
        );
    }
    assert_eq!(sw.stats("a").totals.rx_packets, 32);
    drop((first, second));
    sw.stop();
}

/// A peer connects to a quiet port while the new switch takes the quiet
/// ports up (stopped there): the old switch, busy with the handover, leaves
/// the connection in the socket's backlog, the port stays quiet, and the
/// new switch accepts it once it runs. The pod connects once, the socket
/// file stays, and the ports forward.
#[test]
fn a_peer_connecting_during_the_prepare_step_is_served_by_the_new_switch() {
    let _serial = serial();
    let mut sw = Switch::start(BRIDGE);
    let (a_sock, c_sock) = (sw.path("a.sock"), sw.path("c.sock"));
    sw.add_port(&[
        "a", "--kind", "memif", "--role", "master", "--socket", &a_sock,
    ]);
    sw.add_port(&[
        "c", "--kind", "memif", "--role", "master", "--socket", &c_sock,
    ]);
    let mut sender = Testpmd::start(
        &[memif_vdev(0, "client", &a_sock, &format!("mac={}", mac(1)))],
        &["--forward-mode=rxonly"],
    );
    sw.wait_link("a", true);
    let mut old = Reap(sw.replace_with(&[], &[(STOP_AT, "prepare")]));
    let new = sw.child.as_ref().unwrap().id();
    wait_for(
        Duration::from_secs(20),
        "the new switch to stop with the quiet ports",
        || stopped(new).then_some(()),
    );
    // c was quiet when it was sent; its pod connects now.
    let mut pod = Testpmd::start(
        &[memif_vdev(0, "client", &c_sock, &format!("mac={}", mac(2)))],
        &["--forward-mode=rxonly"],
    );
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new as i32),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    let status = wait_for(Duration::from_secs(30), "the old switch to exit", || {
        old.0.try_wait().unwrap()
    });
    assert!(status.success(), "{}", sw.log());
    sw.assert_alive();
    let log = sw.log();
    assert!(log.contains("prepared=1 in_pause=1"), "{log}");
    sw.wait_link("c", true);
    assert!(
        std::path::Path::new(&c_sock).exists(),
        "the socket file went"
    );
    assert_eq!(sw.port("c").status.connects, 1, "the pod reconnected");
    sender.send_bursts(1);
    assert_eq!(pod.wait_rx(0, 32), 32);
    drop((sender, pod));
    sw.stop();
}
