//! Ports to the kernel, with real kernel peers: a tap port the switch
//! creates in its network namespace, which the host's own stack uses to
//! reach a DPDK testpmd pod (icmpecho: it answers ARP and ping) on memif.

mod common;

use std::time::Duration;

use common::memif_peer::{self as peer, Conn, SlaveMem};
use common::*;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

fn add(sw: &Switch, args: &[&str]) {
    let mut all = vec!["port", "add"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--bridge", "default"]);
    sw.cli_ok(&all);
}

/// The kernel's ping (busybox's, which the test command installs) from the
/// namespace; true if any reply came.
fn ping(ns: &Netns, args: &str) -> bool {
    ns.sh(&format!("busybox ping -c 3 -W 2 {args} 10.77.0.2"))
        .status
        .success()
}

#[test]
fn the_host_reaches_a_pod_through_a_tap_port() {
    let _g = serial();
    let ns = Netns::new("tap");
    let tap = format!("sy{}", std::process::id() % 100_000);
    let mut sw = Switch::start_in(Some(&ns.name), BRIDGE);
    let pod_sock = sw.path("pod.sock");
    // The switch is the memif slave: it redials the pod after a restart.
    add(
        &sw,
        &[
            "pod", "--kind", "memif", "--role", "slave", "--socket", &pod_sock,
        ],
    );
    add(&sw, &["tap0", "--kind", "tap", "--interface", &tap]);
    // The interface exists in the switch's namespace, as a tap.
    let link = ns.sh_ok(&format!("ip -d link show {tap}"));
    assert!(link.contains("tun type tap"), "{link}");
    let info = sw.port("tap0");
    assert_eq!(info.spec.kind.interface(), Some(tap.as_str()));
    assert!(info.status.link_up);

    let mut pod = Testpmd::start(
        &[memif_vdev(0, "server", &pod_sock, "")],
        &["--forward-mode=icmpecho"],
    );
    pod.cmd("start");
    sw.wait_link("pod", true);
    ns.sh_ok(&format!(
        "ip link set {tap} up && ip addr add 10.77.0.1/24 dev {tap}"
    ));
    assert!(ping(&ns, ""), "no reply through the tap port");
    assert!(ping(&ns, "-s 1400"), "no reply to 1400-byte pings");
    let t = sw.stats("tap0").totals;
    assert!(t.rx_packets >= 6 && t.tx_packets >= 6, "{t:?}");

    // A frame longer than the tap's MTU allows is dropped and counted,
    // never truncated: a raw memif peer floods a 1200-byte broadcast while
    // the MTU is 1000.
    ns.sh_ok(&format!("ip link set {tap} mtu 1000"));
    let raw = sw.path("raw.sock");
    add(
        &sw,
        &[
            "raw", "--kind", "memif", "--role", "master", "--socket", &raw,
        ],
    );
    let mem = SlaveMem::new();
    let conn = Conn::connect(&raw);
    peer::run_slave(&conn, &mem.script()).expect("handshake");
    mem.post_m2s_buffers();
    sw.wait_link("raw", true);
    // The port reads the MTU again within 2 s.
    std::thread::sleep(Duration::from_millis(2500));
    let before = sw.stats("tap0").totals;
    let mut f = vec![0u8; 1200];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0x77, 1]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    assert!(mem.send(&f));
    wait_for(Duration::from_secs(10), "the long frame dropped", || {
        (sw.stats("tap0").totals.drops["too_long"] > before.drops["too_long"]).then_some(())
    });
    assert_eq!(sw.stats("tap0").totals.tx_packets, before.tx_packets);
    // A frame that fits still passes.
    ns.sh_ok(&format!("ip link set {tap} mtu 1500"));
    assert!(ping(&ns, "-s 1400"));
    drop((conn, mem));

    // A restarted switch makes the interface again (its address is the
    // host's to set again, as with any interface that was deleted).
    sw.stop();
    let o = ns.sh(&format!("ip link show {tap}"));
    assert!(!o.status.success(), "the tap outlived the switch");
    sw.spawn();
    sw.wait_link("tap0", true);
    ns.sh_ok(&format!(
        "ip link set {tap} up && ip addr add 10.77.0.1/24 dev {tap}"
    ));
    sw.wait_link("pod", true);
    assert!(ping(&ns, ""), "no reply after a restart");

    // Deleting the port deletes the interface.
    sw.cli_ok(&["port", "del", "tap0"]);
    let o = ns.sh(&format!("ip link show {tap}"));
    assert!(!o.status.success(), "the tap outlived its port");
    drop(pod);
}

#[test]
fn bad_tap_specs_name_their_field() {
    let _g = serial();
    let ns = Netns::new("tapbad");
    let sw = Switch::start_in(Some(&ns.name), BRIDGE);
    for (args, want) in [
        (vec!["--interface", "this-name-is-too-long"], "interface"),
        (vec!["--interface", "a/b"], "interface"),
        (vec![], "interface"),
        (vec!["--interface", "t0", "--socket", "/x"], "socket"),
        (vec!["--interface", "t0", "--queues", "0"], "queues"),
    ] {
        let mut all = vec!["port", "add", "t", "--kind", "tap"];
        all.extend_from_slice(&args);
        let o = sw.cli(&all);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // An interface name a non-tap device already has is an error naming
    // the field and the device, and disturbs nothing.
    ns.sh_ok("ip link add sybusy type veth peer name sybusy-p");
    let o = sw.cli(&["port", "add", "t", "--kind", "tap", "--interface", "sybusy"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("port.interface: tap sybusy"), "{err}");
    sw.cli_ok(&["port", "add", "t", "--kind", "tap", "--interface", "syok"]);
    assert!(sw.port("t").status.link_up);
}
