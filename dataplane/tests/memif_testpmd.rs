//! End-to-end: the real switch binary with real DPDK testpmd memif peers.

mod common;

use std::time::Duration;

use common::{memif_vdev, serial, settled, wait_for, Switch, Testpmd};

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

fn mac(last: u8) -> String {
    format!("02:00:00:00:00:{last:02x}")
}

fn add_port(sw: &Switch, name: &str, role: &str, extra: &[&str]) -> String {
    let sock = sw.path(&format!("{name}.sock"));
    let mut args = vec![
        "port", "add", name, "--kind", "memif", "--role", role, "--socket", &sock,
    ];
    args.extend_from_slice(extra);
    sw.cli_ok(&args);
    sock
}

/// A testpmd memif client (the switch is master) in rxonly mode.
fn client(sock: &str, m: u8, opts: &[&str]) -> Testpmd {
    Testpmd::start(
        &[memif_vdev(0, "client", sock, &format!("mac={}", mac(m)))],
        &[&["--forward-mode=rxonly"], opts].concat(),
    )
}

#[test]
fn master_role_switches_counted_frames_both_ways_and_learns() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let (sa, sb, sc) = (
        add_port(&sw, "a", "master", &["--bridge", "default"]),
        add_port(&sw, "b", "master", &["--bridge", "default"]),
        add_port(&sw, "c", "master", &["--bridge", "default"]),
    );
    let mut a = client(&sa, 0x0a, &[]);
    let peer_a = format!("--eth-peer=0,{}", mac(0x0a));
    let mut b = client(&sb, 0x0b, &[&peer_a]);
    let mut c = client(&sc, 0x0c, &[]);
    for p in ["a", "b", "c"] {
        sw.wait_link(p, true);
    }

    // Unknown destination: flooded to every other port, exactly once each.
    a.send_bursts(2);
    assert_eq!(b.wait_rx(0, 64), 64);
    assert_eq!(c.wait_rx(0, 64), 64);
    assert_eq!(a.port_stats(0).0, 0, "no hairpin back to the sender");

    // a's MAC was learned on port a.
    let macs = sw.macs("default");
    assert!(
        macs.iter()
            .any(|m| m.mac == mac(0x0a) && m.port == "a" && m.vlan == 0),
        "{macs:?}"
    );
    let text = sw.cli_ok(&["mac", "list", "default"]);
    assert!(text.contains(&mac(0x0a)), "{text}");

    // b sends to a's MAC: unicast to a only, c sees nothing new.
    b.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
    assert_eq!(c.port_stats(0).0, 64, "learned unicast must not flood");

    let st = sw.stats("a");
    assert_eq!((st.totals.rx_packets, st.totals.tx_packets), (64, 32));
    assert!(
        st.totals.drops.values().all(|&d| d == 0),
        "{:?}",
        st.totals.drops
    );
    let st = sw.stats("c");
    assert_eq!(st.totals.tx_packets, 64);
    let text = sw.cli_ok(&["stats"]);
    assert!(text.contains("a ") && text.contains("up"), "{text}");
}

#[test]
fn slave_role_reconnects_to_testpmd_servers_and_passes_jumbo_chains() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    // The switch is slave: it retries until the servers exist.
    let sa = add_port(&sw, "sa", "slave", &["--bridge", "default"]);
    let sb = add_port(
        &sw,
        "sb",
        "slave",
        &["--bridge", "default", "--ring-size", "512"],
    );
    assert!(!sw.stats("sa").link_up);
    let server = |sock: &str, m: u8| {
        Testpmd::start(
            &[memif_vdev(0, "server", sock, &format!("mac={}", mac(m)))],
            &["--forward-mode=rxonly"],
        )
    };
    let mut a = server(&sa, 0x1a);
    let mut b = server(&sb, 0x1b);
    sw.wait_link("sa", true);
    sw.wait_link("sb", true);

    // 9000-byte frames in 2048-byte buffers: 5-descriptor chains each way.
    a.cmd("set txpkts 2000,2000,2000,2000,1000");
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32);
    assert_eq!(b.port_bytes(0).0, 32 * 9000);
    b.send_bursts(2);
    assert_eq!(a.wait_rx(0, 64), 64);
    assert_eq!(sw.stats("sb").totals.tx_bytes, 32 * 9000);

    // The server goes away (kill -9) and comes back: the slave reconnects.
    a.kill9();
    sw.wait_link("sa", false);
    // DPDK does not replace a stale socket file when it binds: clear it as a
    // restarted pod would have a fresh directory.
    std::fs::remove_file(&sa).unwrap();
    let mut a = server(&sa, 0x1a);
    sw.wait_link("sa", true);
    b.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
    let info = sw.port("sa");
    assert!(info.status.connects >= 2, "{:?}", info.status);
}

/// Several slave ports on one master socket, each an interface of its own
/// (its `id`), as DPDK and VPP serve them: one testpmd with two `net_memif`
/// servers on one socket; an id it does not have is refused while the
/// others forward; a port deleted leaves the others connected.
#[test]
fn slave_ports_share_a_testpmd_server_socket_by_id() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sock = sw.path("shared.sock");
    let slave = |name: &str, id: &str| {
        sw.cli(&[
            "port", "add", name, "--kind", "memif", "--role", "slave", "--socket", &sock, "--id",
            id, "--bridge", "default",
        ])
    };
    for (name, id) in [("s0", "0"), ("s1", "1")] {
        let o = slave(name, id);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // The same interface twice, a master there, a vhost-user port there:
    // refused, naming the field.
    let refused = |args: &[&str], field: &str| {
        let o = sw.cli(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(field), "{err}");
    };
    refused(
        &[
            "port", "add", "again", "--kind", "memif", "--role", "slave", "--socket", &sock,
            "--id", "1",
        ],
        "port.id: port \"s1\" is interface 1",
    );
    refused(
        &[
            "port", "add", "m", "--kind", "memif", "--role", "master", "--socket", &sock, "--id",
            "5",
        ],
        "port.socket",
    );
    refused(
        &[
            "port",
            "add",
            "v",
            "--kind",
            "vhost-user",
            "--role",
            "client",
            "--socket",
            &sock,
        ],
        "port.socket",
    );

    let mut t = Testpmd::start(
        &[
            memif_vdev(0, "server", &sock, &format!("id=0,mac={}", mac(0x30))),
            memif_vdev(1, "server", &sock, &format!("id=1,mac={}", mac(0x31))),
        ],
        &["--forward-mode=rxonly"],
    );
    sw.wait_link("s0", true);
    sw.wait_link("s1", true);
    // Each interface's bursts reach the other through the switch.
    t.send_bursts(1);
    assert_eq!(t.wait_rx(0, 32), 32);
    assert_eq!(t.wait_rx(1, 32), 32);

    // An id the server does not have: testpmd refuses it (DISCONNECT "ID
    // not found", DPDK's `memif_msg_receive_init`), the switch records
    // the refusal as the port's last error and keeps the link down (a
    // refusal by the peer is no fault of the peer's), and the others
    // forward on.
    let o = slave("s2", "2");
    assert!(o.status.success());
    let s2 = wait_for(Duration::from_secs(10), "testpmd to refuse id 2", || {
        let p = sw.port("s2");
        let refused = p.status.last_error.as_deref() == Some("peer disconnected: ID not found");
        refused.then_some(p)
    });
    assert!(
        !s2.status.link_up && s2.status.connects == 0 && s2.status.faults == 0,
        "{:?}",
        s2.status
    );
    t.send_bursts(1);
    assert_eq!(t.wait_rx(0, 64), 64);
    assert_eq!(t.wait_rx(1, 64), 64);

    // A port deleted: the other stays connected. (testpmd stops polling
    // first: DPDK's memif driver may crash a polling lcore when a peer
    // goes, see `Testpmd::pause`.)
    t.pause();
    let connects = sw.port("s0").status.connects;
    sw.cli_ok(&["port", "del", "s1"]);
    sw.cli_ok(&["port", "del", "s2"]);
    std::thread::sleep(Duration::from_secs(1));
    let s0 = sw.port("s0");
    assert!(
        s0.status.link_up && s0.status.connects == connects,
        "{s0:?}"
    );
    t.assert_alive();
}

/// The switch serves one socket with three interfaces (ids 0 and 1 on
/// VLAN 10, id 9 on VLAN 20), as VPP's `create memif socket` and DPDK's
/// `net_memif` with one `socket=` do; one testpmd attaches three vdevs to
/// it by id.
#[test]
fn master_ports_serve_one_socket_to_testpmd_by_id() {
    let _g = serial();
    let mut sw = Switch::start(BRIDGE);
    let sock = sw.path("served.sock");
    let master = |name: &str, id: &str, vlan: &str| {
        sw.cli(&[
            "port", "add", name, "--kind", "memif", "--role", "master", "--socket", &sock, "--id",
            id, "--bridge", "default", "--vlan", vlan,
        ])
    };
    for (name, id, vlan) in [("m0", "0", "10"), ("m1", "1", "10"), ("m9", "9", "20")] {
        let o = master(name, id, vlan);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // The same interface twice, a slave or a vhost-user server there, or
    // another group for the socket file: refused, naming the field.
    let refused = |args: &[&str], field: &str| {
        let o = sw.cli(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(field), "{err}");
    };
    let add = ["port", "add", "x", "--socket", &sock];
    let memif = |role: &'static str, id: &'static str| {
        [&add[..], &["--kind", "memif", "--role", role, "--id", id]].concat()
    };
    refused(&memif("master", "1"), "port.id: port \"m1\" is interface 1");
    refused(&memif("slave", "5"), "port.socket");
    refused(
        &[&add[..], &["--kind", "vhost-user", "--role", "server"]].concat(),
        "port.socket",
    );
    refused(
        &[&memif("master", "5")[..], &["--socket-group", "4242"]].concat(),
        "port.socket_group",
    );
    let list = sw.cli_ok(&["port", "list"]);
    assert!(list.contains(&format!("{sock} id=9")), "{list}");

    let mut t = Testpmd::start(
        &[
            memif_vdev(0, "client", &sock, &format!("id=0,mac={}", mac(0x40))),
            memif_vdev(1, "client", &sock, &format!("id=1,mac={}", mac(0x41))),
            memif_vdev(2, "client", &sock, &format!("id=9,mac={}", mac(0x49))),
        ],
        &["--forward-mode=rxonly"],
    );
    for port in ["m0", "m1", "m9"] {
        sw.wait_link(port, true);
    }
    // Each interface's bursts reach the other of its VLAN through the
    // switch, and nothing crosses to VLAN 20.
    t.send_bursts(1);
    assert_eq!(t.wait_rx(0, 32), 32);
    assert_eq!(t.wait_rx(1, 32), 32);
    assert_eq!(t.wait_rx(2, 0), 0);

    // A slave asking for an id the socket does not serve is refused (as
    // DPDK refuses it), and the others forward on.
    let mut stranger = Testpmd::start(
        &[memif_vdev(
            0,
            "client",
            &sock,
            &format!("id=5,mac={}", mac(0x45)),
        )],
        &["--forward-mode=rxonly"],
    );
    wait_for(
        Duration::from_secs(10),
        "the stranger to be refused",
        || {
            sw.log()
                .contains("a peer asked for an interface the socket does not serve")
                .then_some(())
        },
    );
    t.send_bursts(1);
    assert_eq!(t.wait_rx(0, 64), 64);
    assert_eq!(t.wait_rx(1, 64), 64);
    for port in ["m0", "m1", "m9"] {
        assert_eq!(sw.port(port).status.faults, 0, "{port}");
    }
    stranger.assert_alive();

    // Ports come and go on the socket; the others stay connected. (testpmd
    // stops polling first: DPDK's memif driver may crash a polling lcore
    // when a peer goes, see `Testpmd::pause`.)
    t.pause();
    let connects = sw.port("m0").status.connects;
    let o = master("m5", "5", "10");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    sw.cli_ok(&["port", "del", "m1"]);
    std::thread::sleep(Duration::from_secs(1));
    let m0 = sw.port("m0");
    assert!(
        m0.status.link_up && m0.status.connects == connects,
        "{m0:?}"
    );
    assert!(std::path::Path::new(&sock).exists());
    t.assert_alive();
    // The first port, which accepted for the socket, goes: the next one
    // serves it, and the stranger, started again, finds its interface
    // (added since).
    sw.cli_ok(&["port", "del", "m0"]);
    stranger.pause();
    stranger.cmd("port stop 0");
    stranger.cmd("port start 0");
    sw.wait_link("m5", true);
    assert!(sw.port("m9").status.link_up);
    // A restarted switch serves the socket again from its state, to both
    // interfaces (DPDK's clients attach again when their ports restart).
    stranger.pause();
    sw.stop();
    sw.spawn();
    for (pmd, port) in [(&mut stranger, 0), (&mut t, 2)] {
        pmd.cmd(&format!("port stop {port}"));
        pmd.cmd(&format!("port start {port}"));
    }
    sw.wait_link("m5", true);
    sw.wait_link("m9", true);
    for port in ["m9", "m5"] {
        sw.cli_ok(&["port", "del", port]);
    }
    // The socket file goes with the last port.
    assert!(!std::path::Path::new(&sock).exists());
    t.assert_alive();
    stranger.assert_alive();
}

#[test]
fn vlan_access_ports_are_isolated_and_trunks_carry_tags() {
    let _g = serial();
    // The trunk peer reflects frames, so every source address appears on
    // the trunk right after its own port: with move protection on, those
    // reflections would be refused as MAC moves.
    let sw = Switch::start(&format!("mac_move_hold_secs = 0\n{BRIDGE}"));
    let sa = add_port(&sw, "a", "master", &["--bridge", "default", "--vlan", "10"]);
    let sb = add_port(&sw, "b", "master", &["--bridge", "default", "--vlan", "10"]);
    let sc = add_port(&sw, "c", "master", &["--bridge", "default", "--vlan", "20"]);
    let st = add_port(
        &sw,
        "t",
        "master",
        &["--bridge", "default", "--trunk", "all"],
    );
    let mut a = client(&sa, 0x2a, &[]);
    let mut b = client(&sb, 0x2b, &[]);
    let mut c = client(&sc, 0x2c, &[]);
    // A port with neither --vlan nor --trunk carries untagged frames only.
    let su = add_port(&sw, "u", "master", &["--bridge", "default"]);
    let mut u = client(&su, 0x2e, &[]);
    // The trunk peer reflects every frame (io forwarding), so tagged frames
    // come back into the switch through the trunk.
    let mut t = Testpmd::start(
        &[memif_vdev(0, "client", &st, &format!("mac={}", mac(0x2d)))],
        &["--forward-mode=io"],
    );
    for p in ["a", "b", "c", "t", "u"] {
        sw.wait_link(p, true);
    }
    for p in [&mut a, &mut b, &mut c, &mut t] {
        p.cmd("set verbose 1");
    }

    // a (VLAN 10) floods: b gets it directly, t gets it tagged and reflects
    // it, the switch pops the tag and floods it to a and b. c never sees it.
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 64), 64);
    assert_eq!(a.wait_rx(0, 32), 32);
    assert_eq!(c.port_stats(0).0, 0, "VLAN 20 must not see VLAN 10");
    assert!(
        t.output().contains("type=0x8100"),
        "trunk frames are tagged"
    );
    assert!(
        !a.output().contains("type=0x8100"),
        "access frames are untagged"
    );
    assert!(
        !b.output().contains("type=0x8100"),
        "access frames are untagged"
    );

    // c (VLAN 20): only the trunk and, reflected, c itself.
    c.send_bursts(1);
    assert_eq!(c.wait_rx(0, 32), 32);
    assert_eq!(a.port_stats(0).0, 32);
    assert_eq!(b.port_stats(0).0, 64);
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|m| m.mac == mac(0x2c) && m.vlan == 20),
        "{macs:?}"
    );
    // The untagged-only port saw none of it, and its own untagged frames
    // reach only the trunk (which reflects them back to it).
    assert_eq!(u.port_stats(0).0, 0, "an untagged port must not see VLANs");
    u.send_bursts(1);
    assert_eq!(u.wait_rx(0, 32), 32);
    assert_eq!((a.port_stats(0).0, b.port_stats(0).0), (32, 64));
    assert_eq!(c.port_stats(0).0, 32);
}

#[test]
fn io_forwarding_loop_and_master_peer_killed_mid_traffic() {
    let _g = serial();
    let mut sw = Switch::start(&format!("{BRIDGE}[[bridge]]\nname = \"other\"\n"));
    let sa = add_port(&sw, "a", "master", &["--bridge", "default"]);
    let sb = add_port(&sw, "b", "master", &["--bridge", "default"]);
    // A bystander pod on bridge `other`: two memif clients the kill must
    // not disturb.
    let sc = add_port(&sw, "c", "master", &["--bridge", "other"]);
    let sd = add_port(&sw, "d", "master", &["--bridge", "other"]);
    let mut by = Testpmd::start(
        &[
            memif_vdev(0, "client", &sc, &format!("mac={}", mac(0x3c))),
            memif_vdev(1, "client", &sd, &format!("mac={}", mac(0x3d))),
        ],
        &["--forward-mode=rxonly"],
    );
    // One testpmd with two memif ports forwarding into each other through the switch.
    let mut t = Testpmd::start(
        &[
            memif_vdev(0, "client", &sa, &format!("mac={}", mac(0x3a))),
            memif_vdev(1, "client", &sb, &format!("mac={}", mac(0x3b))),
        ],
        &["--forward-mode=io"],
    );
    for p in ["a", "b", "c", "d"] {
        sw.wait_link(p, true);
    }
    t.send_bursts(1);
    let rx = |p: &str| sw.stats(p).totals.rx_packets;
    wait_for(Duration::from_secs(15), "frames to loop", || {
        (rx("a") > 10_000 && rx("b") > 10_000).then_some(())
    });

    // kill -9 the peer while the frames loop (both ports received more
    // just before it); the ports go down, their counters stay.
    let (a0, b0) = (rx("a"), rx("b"));
    wait_for(Duration::from_secs(5), "frames looping at the kill", || {
        (rx("a") > a0 && rx("b") > b0).then_some(())
    });
    let at_kill = (sw.stats("a").totals, sw.stats("b").totals);
    t.kill9();
    sw.wait_link("a", false);
    sw.wait_link("b", false);
    assert!(sw.log().contains("link down"), "{}", sw.log());
    let down = settled("the counters of a and b", || {
        (sw.stats("a").totals, sw.stats("b").totals)
    });
    for (port, (kill, down)) in [("a", (&at_kill.0, &down.0)), ("b", (&at_kill.1, &down.1))] {
        assert!(
            down.rx_packets >= kill.rx_packets && down.tx_packets >= kill.tx_packets,
            "{port}: counters at the kill {kill:?}, after {down:?}"
        );
    }
    // The switch runs on and serves the other ports: the bystander's
    // bursts cross bridge `other`, which saw none of the loop.
    sw.assert_alive();
    by.send_bursts(1);
    assert_eq!(by.wait_rx(0, 32), 32);
    assert_eq!(by.wait_rx(1, 32), 32);

    // The peer returns: links come back, frames pass, and the counters go
    // on from where the kill left them.
    let mut a = client(&sa, 0x3a, &[]);
    let mut b = client(&sb, 0x3b, &[]);
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32);
    assert_eq!(sw.stats("a").totals.rx_packets, down.0.rx_packets + 32);
    assert_eq!(sw.stats("b").totals.tx_packets, down.1.tx_packets + 32);
    assert_eq!(sw.port("a").status.connects, 2);
    by.assert_alive();
}

#[test]
fn zero_copy_clients_loop_through_the_switch() {
    // DPDK's zero-copy memif clients pass their mbuf memory as regions
    // (one per memseg list, not sealed, larger than what is backed); the
    // switch maps them, watched, and frames loop as with copy mode.
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = add_port(&sw, "a", "master", &["--bridge", "default"]);
    let sb = add_port(&sw, "b", "master", &["--bridge", "default"]);
    let zc = |m: u8| format!("mac={},zero-copy=yes", mac(m));
    let mut t = Testpmd::start_with_eal(
        &["--single-file-segments"],
        &[
            memif_vdev(0, "client", &sa, &zc(0x5a)),
            memif_vdev(1, "client", &sb, &zc(0x5b)),
        ],
        &["--forward-mode=io"],
    );
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    // A zero-copy client posts its receive buffers when it first receives.
    t.cmd("start");
    t.cmd("stop");
    t.send_bursts(1);
    wait_for(Duration::from_secs(15), "frames to loop", || {
        (sw.stats("a").totals.rx_packets > 10_000 && sw.stats("b").totals.rx_packets > 10_000)
            .then_some(())
    });
    t.pause();
    // Region 0 (rings) is a sealed memfd; the mbuf memory is not.
    let log = sw.log();
    let up = log
        .lines()
        .find(|l| l.contains("link up") && l.contains("port=a"));
    assert!(
        up.is_some_and(|l| !l.contains("unsealed=0")),
        "the mbuf regions were not watched: {log}"
    );
    assert_eq!(sw.port("a").status.faults, 0);
}

#[test]
fn ports_persist_across_daemon_restarts() {
    let _g = serial();
    let mut sw = Switch::start(BRIDGE);
    sw.cli_ok(&["bridge", "add", "blue"]);
    let sa = add_port(
        &sw,
        "a",
        "master",
        &["--bridge", "blue", "--secret", "s3cret", "--id", "7"],
    );
    let sb = add_port(&sw, "b", "master", &["--bridge", "blue", "--id", "7"]);

    // Clean stop removes the sockets; restart recreates them from state.
    sw.stop();
    assert!(
        !std::path::Path::new(&sa).exists(),
        "socket removed on SIGTERM"
    );
    sw.spawn();
    assert!(std::path::Path::new(&sa).exists());
    let switchyard_api::KindSpec::Memif(m) = sw.port("a").spec.kind else {
        panic!("a memif port")
    };
    assert_eq!(m.secret.as_deref(), Some("s3cret"));

    // kill -9: the stale sockets are replaced on restart.
    sw.kill9();
    sw.spawn();
    let text = sw.cli_ok(&["port", "list"]);
    assert!(text.contains("blue"), "{text}");

    let mut a = Testpmd::start(
        &[memif_vdev(
            0,
            "client",
            &sa,
            "id=7,secret=s3cret,mac=02:00:00:00:00:4a",
        )],
        &["--forward-mode=rxonly"],
    );
    let mut b = Testpmd::start(
        &[memif_vdev(0, "client", &sb, "id=7,mac=02:00:00:00:00:4b")],
        &["--forward-mode=rxonly"],
    );
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32);

    // Deleting a port is persisted too. The pods go first: the switch
    // would otherwise end their connections while they poll (see
    // Testpmd::pause).
    drop((a, b));
    sw.cli_ok(&["port", "del", "b"]);
    sw.stop();
    sw.spawn();
    let text = sw.cli_ok(&["port", "list"]);
    assert!(!text.contains("\nb "), "{text}");
}

#[test]
fn wrong_secret_keeps_the_link_down() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = add_port(
        &sw,
        "a",
        "master",
        &["--bridge", "default", "--secret", "right"],
    );
    let _a = Testpmd::start(
        &[memif_vdev(0, "client", &sa, "secret=wrong")],
        &["--forward-mode=rxonly"],
    );
    wait_for(Duration::from_secs(10), "the refusal to be logged", || {
        sw.log().contains("incorrect secret").then_some(())
    });
    assert!(!sw.stats("a").link_up);
}

#[test]
fn multiqueue_ports_are_spread_over_two_workers() {
    let _g = serial();
    let sw = Switch::start(&format!("[dataplane]\nworkers = 2\n{BRIDGE}"));
    let sa = add_port(
        &sw,
        "a",
        "master",
        &["--bridge", "default", "--queues", "2"],
    );
    let sb = add_port(
        &sw,
        "b",
        "master",
        &["--bridge", "default", "--queues", "2"],
    );
    let mut a = client(&sa, 0x5a, &["--rxq=2", "--txq=2"]);
    let mut b = client(&sb, 0x5b, &["--rxq=2", "--txq=2"]);
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    let st = sw.port("a").status;
    assert_eq!((st.rx_queues, st.tx_queues), (2, 2));
    // Each queue goes to the least busy worker as it comes up: the two
    // queues of each port are polled by different workers.
    let placed = sw.queue_load();
    let worker = |port: &str, q: usize| placed[&(port.to_string(), q)].0;
    for port in ["a", "b"] {
        let mut ws = [worker(port, 0), worker(port, 1)];
        ws.sort();
        assert_eq!(ws, [0, 1], "{port}'s queues on workers {ws:?}: {placed:?}");
    }
    assert_eq!(placed.len(), 4, "{placed:?}");

    // tx_first sends one burst per queue: 32 frames on each of a's queues,
    // so each worker receives 32 of them and sends them out of its own
    // transmit queue of b: 32 on each of b's receive queues.
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 64), 64);
    let load = sw.queue_load();
    let frames = |port: &str, q: usize| load[&(port.to_string(), q)].1;
    assert_eq!((frames("a", 0), frames("a", 1)), (32, 32), "{load:?}");
    assert_eq!(
        (b.xstat(0, "rx_q0_packets"), b.xstat(0, "rx_q1_packets")),
        (32, 32)
    );
    // And back: 64 frames on each of b's queues, to each of a's.
    b.send_bursts(2);
    assert_eq!(a.wait_rx(0, 128), 128);
    let load = sw.queue_load();
    let frames = |port: &str, q: usize| load[&(port.to_string(), q)].1;
    assert_eq!((frames("b", 0), frames("b", 1)), (64, 64), "{load:?}");
    assert_eq!(
        (a.xstat(0, "rx_q0_packets"), a.xstat(0, "rx_q1_packets")),
        (64, 64)
    );
    // The workers kept their queues while they forwarded.
    let kept: Vec<_> = load.iter().map(|(k, v)| (k, v.0)).collect();
    let before: Vec<_> = placed.iter().map(|(k, v)| (k, v.0)).collect();
    assert_eq!(kept, before);
}

#[test]
fn one_worker_sends_each_receive_queue_s_frames_on_the_same_queue_number() {
    let _g = serial();
    // One worker: it owns both transmit queues of each port.
    let sw = Switch::start(BRIDGE);
    let queues = ["--bridge", "default", "--queues", "2"];
    let sa = add_port(&sw, "a", "master", &queues);
    let sb = add_port(&sw, "b", "master", &queues);
    let mut a = client(&sa, 0x5a, &["--rxq=2", "--txq=2"]);
    let mut b = client(&sb, 0x5b, &["--rxq=2", "--txq=2"]);
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    // tx_first: a burst of 32 on each of a's queues, 2 bursts on b's.
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 64), 64);
    assert_eq!(
        (b.xstat(0, "rx_q0_packets"), b.xstat(0, "rx_q1_packets")),
        (32, 32)
    );
    b.send_bursts(2);
    assert_eq!(a.wait_rx(0, 128), 128);
    assert_eq!(
        (a.xstat(0, "rx_q0_packets"), a.xstat(0, "rx_q1_packets")),
        (64, 64)
    );
}
