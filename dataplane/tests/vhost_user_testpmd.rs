//! End-to-end: the real switch binary with real DPDK testpmd `virtio_user`
//! frontends (and memif peers for cross-kind switching).

mod common;

use std::time::Duration;

use common::{memif_vdev, serial, wait_for, Switch, Testpmd};

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

fn mac(last: u8) -> String {
    format!("02:00:00:00:01:{last:02x}")
}

fn add_vhost(sw: &Switch, name: &str, role: &str, extra: &[&str]) -> String {
    let sock = sw.path(&format!("{name}.sock"));
    let mut args = vec![
        "port",
        "add",
        name,
        "--kind",
        "vhost-user",
        "--role",
        role,
        "--socket",
        &sock,
        "--bridge",
        "default",
    ];
    args.extend_from_slice(extra);
    sw.cli_ok(&args);
    sock
}

/// A `virtio_user` vdev with MAC `mac(m)`; `server`: testpmd owns the socket.
fn virtio_vdev(index: u32, sock: &str, m: u8, server: bool, extra: &str) -> String {
    let opts = [format!("mac={}", mac(m)), extra.to_string()];
    common::virtio_vdev(index, sock, server, opts.join(",").trim_end_matches(','))
}

fn frontend(sock: &str, m: u8, server: bool, opts: &[&str]) -> Testpmd {
    Testpmd::start(
        &[virtio_vdev(0, sock, m, server, "")],
        &[&["--forward-mode=rxonly"], opts].concat(),
    )
}

#[test]
fn server_role_switches_between_virtio_and_memif_and_learns() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = add_vhost(&sw, "va", "server", &[]);
    let sb = add_vhost(&sw, "vb", "server", &[]);
    let sm = sw.path("m.sock");
    sw.cli_ok(&[
        "port", "add", "m", "--kind", "memif", "--role", "master", "--socket", &sm, "--bridge",
        "default",
    ]);
    let mut a = frontend(&sa, 0x0a, false, &[]);
    let peer_a = format!("--eth-peer=0,{}", mac(0x0a));
    let mut b = frontend(&sb, 0x0b, false, &[&peer_a]);
    let mut m = Testpmd::start(
        &[memif_vdev(0, "client", &sm, &format!("mac={}", mac(0x0c)))],
        &["--forward-mode=rxonly", &peer_a],
    );
    for p in ["va", "vb", "m"] {
        sw.wait_link(p, true);
    }
    let info = sw.port("va");
    assert_eq!(info.status.rx_queues, 1, "{:?}", info.status);

    // Unknown destination: flooded to the other virtio port and to memif.
    a.send_bursts(2);
    assert_eq!(b.wait_rx(0, 64), 64);
    assert_eq!(m.wait_rx(0, 64), 64);
    assert_eq!(a.port_stats(0).0, 0, "no hairpin back to the sender");
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|e| e.mac == mac(0x0a) && e.port == "va"),
        "{macs:?}"
    );

    // virtio -> virtio unicast to the learned MAC; memif sees nothing new.
    b.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
    assert_eq!(m.port_stats(0).0, 64, "learned unicast must not flood");

    // memif -> virtio unicast.
    m.send_bursts(1);
    assert_eq!(a.wait_rx(0, 64), 64);
    assert_eq!(
        a.port_bytes(0).0,
        64 * 64,
        "64-byte frames, header stripped"
    );

    let st = sw.stats("va");
    assert_eq!((st.totals.rx_packets, st.totals.tx_packets), (64, 64));
    assert!(
        st.totals.drops.values().all(|&d| d == 0),
        "{:?}",
        st.totals.drops
    );
}

#[test]
fn jumbo_frames_cross_merged_buffers_both_ways() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = add_vhost(&sw, "va", "server", &[]);
    let sm = sw.path("m.sock");
    sw.cli_ok(&[
        "port", "add", "m", "--kind", "memif", "--role", "master", "--socket", &sm, "--bridge",
        "default",
    ]);
    let jumbo = ["--max-pkt-len=9600", "--mbuf-size=2048"];
    let mut a = frontend(
        &sa,
        0x1a,
        false,
        &[&jumbo[..], &["--enable-scatter"]].concat(),
    );
    let mut m = Testpmd::start(
        &[memif_vdev(0, "client", &sm, &format!("mac={}", mac(0x1c)))],
        &["--forward-mode=rxonly"],
    );
    sw.wait_link("va", true);
    sw.wait_link("m", true);

    // memif -> virtio: each 9000-byte frame spreads over five 2 KB guest
    // buffers (mergeable receive buffers).
    m.cmd("set txpkts 2000,2000,2000,2000,1000");
    m.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
    assert_eq!(a.port_bytes(0).0, 32 * 9000);

    // virtio -> memif: the driver sends each frame as a descriptor chain.
    a.cmd("set txpkts 2000,2000,2000,2000,1000");
    a.send_bursts(1);
    assert_eq!(m.wait_rx(0, 32), 32);
    assert_eq!(m.port_bytes(0).0, 32 * 9000);
    assert_eq!(sw.stats("va").totals.rx_bytes, 32 * 9000);
}

#[test]
fn client_role_reconnects_after_the_frontend_restarts() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    // The switch connects; testpmd owns the sockets (server=1). The switch
    // retries until they exist.
    let sa = add_vhost(&sw, "ca", "client", &[]);
    let sb = add_vhost(&sw, "cb", "client", &[]);
    assert!(!sw.stats("ca").link_up);
    let mut a = frontend(&sa, 0x2a, true, &[]);
    let mut b = frontend(&sb, 0x2b, true, &[]);
    sw.wait_link("ca", true);
    sw.wait_link("cb", true);
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32);

    // The frontend dies and comes back: the switch reconnects by itself.
    a.kill9();
    sw.wait_link("ca", false);
    let _ = std::fs::remove_file(&sa);
    let mut a = frontend(&sa, 0x2a, true, &[]);
    sw.wait_link("ca", true);
    b.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
    assert!(sw.port("ca").status.connects >= 2);
}

#[test]
fn server_role_frontend_restart_and_daemon_restart() {
    let _g = serial();
    let mut sw = Switch::start(BRIDGE);
    let sa = add_vhost(&sw, "va", "server", &[]);
    let sb = add_vhost(&sw, "cb", "client", &[]);
    let a = frontend(&sa, 0x3a, false, &[]);
    let mut b = frontend(&sb, 0x3b, true, &[]);
    sw.wait_link("va", true);
    sw.wait_link("cb", true);

    // A client frontend restarts on the switch's socket.
    a.kill9();
    sw.wait_link("va", false);
    let mut a = frontend(&sa, 0x3a, false, &[]);
    sw.wait_link("va", true);
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32);

    // The daemon dies: both ports come back from the state dir; the
    // testpmd that owns its socket takes the switch back, the other one
    // reattaches by restarting (DPDK client-mode frontends do not redial).
    // Both stop polling while the switch is away (see Testpmd::pause).
    a.pause();
    b.pause();
    sw.kill9();
    sw.spawn();
    sw.wait_link("cb", true);
    drop(a);
    let mut a = frontend(&sa, 0x3a, false, &[]);
    sw.wait_link("va", true);
    b.assert_alive();
    b.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
}

#[test]
fn multiqueue_uses_every_queue_pair() {
    let _g = serial();
    let sw = Switch::start(&format!("{BRIDGE}[dataplane]\nworkers = 2\n"));
    let sa = add_vhost(&sw, "va", "server", &["--queues", "2"]);
    let sb = add_vhost(&sw, "vb", "server", &["--queues", "2"]);
    let mq = |sock: &str, m: u8| {
        Testpmd::start(
            &[virtio_vdev(0, sock, m, false, "queues=2")],
            &["--forward-mode=rxonly", "--rxq=2", "--txq=2"],
        )
    };
    let mut a = mq(&sa, 0x4a);
    let mut b = mq(&sb, 0x4b);
    sw.wait_link("va", true);
    sw.wait_link("vb", true);
    wait_for(Duration::from_secs(10), "both queue pairs enabled", || {
        let (va, vb) = (sw.port("va").status, sw.port("vb").status);
        ((va.rx_queues, va.tx_queues, vb.rx_queues, vb.tx_queues) == (2, 2, 2, 2)).then_some(())
    });

    // tx_first sends a burst of 32 on each of a's transmit queues: the
    // switch receives 32 on each of va's queues, and sends each queue's
    // frames out of vb on the same queue number, 32 to each of b's
    // receive queues.
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 64), 64);
    let q = sw.queue_load();
    let frames = |port: &str, n: usize| q.get(&(port.to_string(), n)).map(|l| l.1);
    assert_eq!(
        (frames("va", 0), frames("va", 1)),
        (Some(32), Some(32)),
        "{q:?}"
    );
    assert_eq!(
        (
            b.xstat(0, "rx_q0_good_packets"),
            b.xstat(0, "rx_q1_good_packets")
        ),
        (32, 32)
    );
    // And the other way: 64 on each of b's queues, to each of a's.
    b.send_bursts(2);
    assert_eq!(a.wait_rx(0, 128), 128);
    let q = sw.queue_load();
    let frames = |port: &str, n: usize| q.get(&(port.to_string(), n)).map(|l| l.1);
    assert_eq!(
        (frames("vb", 0), frames("vb", 1)),
        (Some(64), Some(64)),
        "{q:?}"
    );
    assert_eq!(
        (
            a.xstat(0, "rx_q0_good_packets"),
            a.xstat(0, "rx_q1_good_packets")
        ),
        (64, 64)
    );
}
