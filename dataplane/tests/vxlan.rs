//! VXLAN tunnels over a routed underlay, against the Linux kernel's own
//! VXLAN and between two switches. The VTEPs sit in different subnets
//! with a router namespace between them (`ip_forward`), so the underlay is
//! routed, not one segment.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::tcp::*;
use common::*;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

/// A kernel `vxlan` device in `ns` for VNI `vni` from `local` to `remote`,
/// with `addr` on it.
fn kernel_vtep(ns: &Netns, vni: u32, local: &str, remote: &str, addr: &str) {
    ns.sh_ok(&format!(
        "ip link add vx0 type vxlan id {vni} dstport 4789 local {local} remote {remote} dev ul && \
         ip addr add {addr}/24 dev vx0 && ip link set vx0 up"
    ));
}

/// The kernel device's error and drop counters, from `ip -s -s link`.
fn kernel_errors(ns: &Netns) -> String {
    let out = ns.sh_ok("ip -s -s -j link show vx0");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v[0]["stats64"];
    let mut bad = Vec::new();
    for dir in ["rx", "tx"] {
        for k in [
            "errors",
            "dropped",
            "over_errors",
            "crc_errors",
            "frame_errors",
        ] {
            let n = s[dir][k].as_u64().unwrap_or(0);
            if n > 0 {
                bad.push(format!("{dir} {k} {n}"));
            }
        }
    }
    bad.join(", ")
}

/// Starts `switchyard capture PORT --direction rx --duration 3 -w FILE`
/// on `sw` and waits until it says it is armed ("capturing on PORT", as
/// tcpdump says "listening on"): no frame from then on is missed.
fn capture_armed(sw: &Switch, port: &str, file: &str) -> Reap {
    let mut c = Reap(
        Command::new(switchyard_bin())
            .args(["capture", port, "--direction", "rx", "--duration", "3"])
            .args(["-w", file])
            .env("SWITCHYARD_CONTROL", sw.control())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Read on a thread: a capture that never arms fails the test in time
    // rather than hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = c.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stderr).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("capture on {port}: not armed after 10 s"));
    assert!(
        line.starts_with(&format!("capturing on {port},")),
        "capture on {port}: {line}"
    );
    c
}

/// A pod (station 1: a namespace on a veth whose other end is an
/// af-packet port of the switch in VTEP 1) and the kernel's VXLAN in VTEP
/// 2, on VNI 42 across the routed underlay: ping, a file and `iperf3`
/// both ways, the kernel counting no error, the pod's MTU as the port
/// says.
#[test]
fn a_pod_and_the_kernels_vxlan_exchange_tcp_over_a_routed_underlay() {
    let _g = serial();
    let mut u = Underlay::new(2);
    let kernel = Station::at(u.vteps.pop().unwrap(), "10.66.0.2");
    let node = &u.vteps[0];
    let pod = Station::attached(1, Some(node), "p1");
    let sw = Switch::start_in(Some(&node.name), BRIDGE);
    sw.add_port(&["pod", "--kind", "af-packet", "--interface", "p1"]);
    sw.add_port(&[
        "node2",
        "--kind",
        "vxlan",
        "--remote",
        &Underlay::ip(2),
        "--local",
        &Underlay::ip(1),
        "--vni",
        "42",
    ]);
    kernel_vtep(
        &kernel.ns,
        42,
        &Underlay::ip(2),
        &Underlay::ip(1),
        &kernel.ip,
    );

    // The MTU a pod behind the tunnel takes: the underlay's 1500 less 50.
    let st = sw.port("node2").status;
    assert_eq!(st.mtu, Some(1450), "{st:?}");
    assert!(st.link_up, "{st:?}");
    pod.ns.sh_ok("ip link set eth0 mtu 1450");
    pod.ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.2");
    // Learned on the tunnel: the kernel device's MAC.
    let kmac = kernel
        .ns
        .sh_ok("cat /sys/class/net/vx0/address")
        .trim()
        .to_string();
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|m| m.mac == kmac && m.port == "node2"),
        "{macs:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    transfer_file(&pod, &kernel, dir.path());
    transfer_file(&kernel, &pod, dir.path());
    iperf(&pod, &kernel, false);
    iperf(&pod, &kernel, true);
    assert_eq!(kernel_errors(&kernel.ns), "");
    // 64 MB each way and more (the kernel's super-frames count one each).
    let t = sw.stats("node2").totals;
    assert!(t.tx_bytes > 64 << 20 && t.rx_bytes > 64 << 20, "{t:?}");

    // A frame longer than the path carries (a pod left at MTU 1500) is
    // dropped and counted, never fragmented.
    pod.ns.sh_ok("ip link set eth0 mtu 1500");
    let too_long = || {
        sw.stats("node2")
            .totals
            .drops
            .get(&switchyard_api::DropReason::TooLong)
            .copied()
            .unwrap_or(0)
    };
    wait_for(Duration::from_secs(10), "a frame too long counted", || {
        let out = pod.ns.sh("busybox ping -c 1 -i 0.2 -W 1 -s 1472 10.66.0.2");
        assert!(
            !out.status.success(),
            "a 1500-byte packet crossed a 1450 tunnel"
        );
        (too_long() > 0).then_some(())
    });
    pod.ns
        .sh_ok("busybox ping -c 2 -i 0.2 -W 2 -s 1422 10.66.0.2");
}

/// Two switches over an IPv6 underlay (one link): the tunnels' MTU is the
/// path's less 70, and pods reach each other.
#[test]
fn switches_join_pods_over_an_ipv6_underlay() {
    let _g = serial();
    let (n1, n2) = (Netns::new("v6a"), Netns::new("v6b"));
    veth(&n1, "ul", &n2, "ul");
    for (ns, ip) in [(&n1, "fd00:81::1"), (&n2, "fd00:81::2")] {
        ns.sh_ok(&format!("ip addr add {ip}/64 dev ul nodad"));
    }
    let mut pods = Vec::new();
    let mut sws = Vec::new();
    for (i, (ns, local, remote)) in [
        (&n1, "fd00:81::1", "fd00:81::2"),
        (&n2, "fd00:81::2", "fd00:81::1"),
    ]
    .into_iter()
    .enumerate()
    {
        let sw = Switch::start_in(Some(&ns.name), BRIDGE);
        let pod = Station::attached(i as u8 + 1, Some(ns), "p0");
        pod.ns.sh_ok("ip link set eth0 mtu 1430");
        sw.add_port(&["pod", "--kind", "af-packet", "--interface", "p0"]);
        sw.add_port(&[
            "peer", "--kind", "vxlan", "--remote", remote, "--local", local, "--vni", "9",
        ]);
        assert_eq!(sw.port("peer").status.mtu, Some(1430));
        pods.push(pod);
        sws.push(sw);
    }
    pods[0].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.2");
    pods[1]
        .ns
        .sh_ok("busybox ping -c 2 -i 0.2 -W 2 -s 1402 10.66.0.1");
}

/// Three switches, one per VTEP namespace, each with tunnels to the other
/// two on VNI 42 (bridge `default`) and a pod on it; node 2 has another
/// pod on VNI 43 (bridge `blue`), tunnelled to node 1 too. Pods of one VNI
/// reach each other, not the other VNI's; MACs are learned on the tunnel
/// of the VTEP they are behind; a broadcast from node 1 reaches node 3
/// once, straight, never again through node 2 (split horizon); a tunnel
/// deleted takes its MACs with it.
#[test]
fn switches_join_pods_over_a_routed_underlay_one_network_per_vni() {
    let _g = serial();
    let u = Underlay::new(3);
    let config = "[[bridge]]\nname = \"default\"\n[[bridge]]\nname = \"blue\"\n";
    let sws: Vec<Switch> = u
        .vteps
        .iter()
        .map(|ns| Switch::start_in(Some(&ns.name), config))
        .collect();
    let pods: Vec<Station> = (1..=3)
        .map(|i| Station::on_overlay(i as u8, Some(&u.vteps[i - 1]), "p0"))
        .collect();
    for (i, sw) in sws.iter().enumerate() {
        let i = i + 1;
        sw.add_port(&["pod", "--kind", "af-packet", "--interface", "p0"]);
        for j in (1..=3).filter(|&j| j != i) {
            sw.add_port(&[
                &format!("node{j}"),
                "--kind",
                "vxlan",
                "--remote",
                &Underlay::ip(j),
                "--local",
                &Underlay::ip(i),
                "--vni",
                "42",
            ]);
        }
    }
    // VNI 43: a blue pod on nodes 1 and 2 (10.66.0.5 and .4), the two
    // blue bridges tunnelled.
    let blue: Vec<Station> = [(0, 5), (1, 4)]
        .into_iter()
        .map(|(i, n)| {
            let pod = Station::on_overlay(n, Some(&u.vteps[i]), "p1");
            sws[i].cli_ok(&[
                "port",
                "add",
                "bluepod",
                "--kind",
                "af-packet",
                "--interface",
                "p1",
                "--bridge",
                "blue",
            ]);
            sws[i].cli_ok(&[
                "port",
                "add",
                "blue",
                "--kind",
                "vxlan",
                "--remote",
                &Underlay::ip(2 - i),
                "--local",
                &Underlay::ip(i + 1),
                "--vni",
                "43",
                "--bridge",
                "blue",
            ]);
            pod
        })
        .collect();

    // Node 1's pod pings node 2's (its ARP broadcast goes to both tunnels).
    pods[0].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.2");
    let out = pods[0].ns.sh("busybox ping -c 2 -i 0.2 -W 1 10.66.0.4");
    assert!(
        !out.status.success(),
        "a pod of VNI 42 reached one of VNI 43"
    );
    let m1 = pods[0].mac();
    let m2 = pods[1].mac();
    // Learned on the tunnel of the VTEP they are behind.
    let on = |sw: &Switch, mac: &str| {
        sw.macs("default")
            .into_iter()
            .find(|m| m.mac == mac)
            .map(|m| m.port)
    };
    assert_eq!(on(&sws[0], &m2).as_deref(), Some("node2"));
    assert_eq!(on(&sws[1], &m1).as_deref(), Some("node1"));
    assert_eq!(on(&sws[2], &m1).as_deref(), Some("node1"));
    // A broadcast from node 1 (its pod's ARP request, the cache flushed)
    // reaches node 3 once, through node 1's tunnel; node 2 sends it no
    // further (split horizon). Captures on node 3's tunnels show the inner
    // frames.
    let dir = tempfile::tempdir().unwrap();
    let file = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    let captures: Vec<Reap> = ["node1", "node2"]
        .into_iter()
        .map(|p| capture_armed(&sws[2], p, &file(p)))
        .collect();
    pods[0]
        .ns
        .sh_ok("ip neigh flush dev eth0 && busybox ping -c 2 -i 0.2 -W 2 10.66.0.2");
    for mut c in captures {
        let st = wait_for(Duration::from_secs(10), "the capture to end", || {
            c.0.try_wait().unwrap()
        });
        assert!(st.success(), "capture: {st}");
    }
    let arp_from_1 = |p: &str| {
        let out = run_ok(Command::new("tcpdump").args(["-nn", "-e", "-r", &file(p), "arp"]));
        out.lines().filter(|l| l.contains(&m1)).count()
    };
    assert!(
        arp_from_1("node1") > 0,
        "no ARP from node 1's pod on node 1's tunnel"
    );
    assert_eq!(arp_from_1("node2"), 0, "node 2 sent node 1's broadcast on");
    // A trace on node 2 names the VTEP a frame came from (node 1's pod's
    // requests) and went to (its pod's replies): the pings' frames, not
    // the pods' own multicast, which crosses the tunnels too.
    std::thread::scope(|s| {
        let t = s.spawn(|| sws[1].cli_ok(&["trace", "-c", "6", "--timeout", "10", "--json"]));
        // Pings until the trace has its frames: it says nothing when it is
        // armed, so none is waited for by time.
        while !t.is_finished() {
            pods[0].ns.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.66.0.2");
        }
        let traced: Vec<switchyard_api::TraceEntry> =
            serde_json::from_str(&t.join().unwrap()).unwrap();
        let node1 = Some(Underlay::ip(1));
        let request = traced.iter().find(|e| e.src == m1 && e.dst == m2);
        assert_eq!(
            request.and_then(|e| e.in_vtep).map(|v| v.to_string()),
            node1,
            "{traced:?}"
        );
        let reply = traced.iter().find(|e| e.src == m2 && e.dst == m1);
        assert!(
            reply.is_some_and(|e| e.out.iter().any(|o| o.vtep.map(|v| v.to_string()) == node1)),
            "{traced:?}"
        );
    });
    // And all three reach each other.
    pods[2].ns.sh_ok(
        "busybox ping -c 2 -i 0.2 -W 2 10.66.0.1 && busybox ping -c 2 -i 0.2 -W 2 10.66.0.2",
    );
    transfer_file(&pods[2], &pods[1], dir.path());
    // VNI 43 on its own.
    blue[0].ns.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.66.0.4");
    assert_eq!(
        sws[1].port("blue").status.mtu,
        Some(1450),
        "the MTU for the pods behind it"
    );

    // A tunnel deleted: what was learned on it goes.
    sws[0].cli_ok(&["port", "del", "node2"]);
    assert_eq!(on(&sws[0], &m2), None);
    let out = pods[0].ns.sh("busybox ping -c 2 -i 0.2 -W 1 10.66.0.2");
    assert!(!out.status.success(), "reached node 2 without a tunnel");
    pods[0].ns.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.66.0.3");
}

/// Overlays of the config: a bridge of the overlay's name on each node,
/// tunnels to the remote VTEPs the config names (node 1's, its local
/// address the one its route leaves from) and to those `vtep add` joins at
/// run time (node 2's, persisted across a restart). An untagged overlay
/// (one VNI) and a trunked one (a VNI per VLAN, a tunnel per VLAN): pods
/// reach each other on each, as access ports of the VLAN on the trunked
/// one. `mac list` names the VTEP a MAC is behind; `vtep del` takes the
/// tunnels and what was learned on them; a VTEP of the config cannot be
/// deleted through the API.
#[test]
fn overlays_of_the_config_join_the_nodes_their_vteps_name() {
    let _g = serial();
    let u = Underlay::new(2);
    let overlays = |remotes: &str| {
        format!(
            "[overlays]\nflat = {{ vni = 42{remotes} }}\n\
             trunk = {{ vlans = [{{ vlan = 100, vni = 5100 }}, {{ vlan = 200, vni = 5200 }}]{remotes} }}\n"
        )
    };
    let mut sws = [
        Switch::start_in(
            Some(&u.vteps[0].name),
            &overlays(&format!(", remotes = [\"{}\"]", Underlay::ip(2))),
        ),
        Switch::start_in(Some(&u.vteps[1].name), &overlays("")),
    ];
    for overlay in ["flat", "trunk"] {
        sws[1].cli_ok(&["vtep", "add", overlay, &Underlay::ip(1)]);
        // Again: nothing changes.
        sws[1].cli_ok(&["vtep", "add", overlay, &Underlay::ip(1)]);
    }
    let vteps = |sw: &Switch| -> Vec<switchyard_api::VtepInfo> {
        serde_json::from_str(&sw.cli_ok(&["vtep", "list", "--json"])).unwrap()
    };
    let v1 = vteps(&sws[0]);
    assert_eq!(v1.len(), 2, "{v1:?}");
    for v in &v1 {
        assert_eq!(v.remote.to_string(), Underlay::ip(2));
        assert_eq!(v.local.to_string(), Underlay::ip(1), "the route's source");
        assert!(v.from_config && v.link_up, "{v:?}");
    }
    let trunk = v1.iter().find(|v| v.overlay == "trunk").unwrap();
    assert_eq!(
        trunk.tunnels,
        ["trunk-10.81.2.2-v100", "trunk-10.81.2.2-v200"]
    );
    // Node 2's tunnels to node 1 from another of its addresses (`vtep add
    // --local`): made again from it, and back; an address the host does
    // not have, or of the other IP version, is refused before anything
    // changes; a remote of the config is the config's (node 1's).
    u.vteps[1].sh_ok("ip addr add 10.81.2.3/24 dev ul");
    let local_of = |sw: &Switch, overlay: &str| {
        vteps(sw)
            .into_iter()
            .find(|v| v.overlay == overlay)
            .map(|v| v.local.to_string())
    };
    let one = Underlay::ip(1);
    sws[1].cli_ok(&["vtep", "add", "flat", &one, "--local", "10.81.2.3"]);
    assert_eq!(local_of(&sws[1], "flat").as_deref(), Some("10.81.2.3"));
    for (bad, why) in [
        ("10.99.0.1", "no address of this host"),
        ("fd00::1", "IP versions"),
    ] {
        let o = sws[1].cli(&["vtep", "add", "flat", &one, "--local", bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{err}");
        assert_eq!(local_of(&sws[1], "flat").as_deref(), Some("10.81.2.3"));
    }
    sws[1].cli_ok(&["vtep", "add", "flat", &one, "--local", &Underlay::ip(2)]);
    assert_eq!(local_of(&sws[1], "flat"), Some(Underlay::ip(2)));
    sws[0].cli_ok(&["vtep", "add", "flat", &Underlay::ip(2), "--local", &one]);
    let o = sws[0].cli(&[
        "vtep",
        "add",
        "flat",
        &Underlay::ip(2),
        "--local",
        "10.81.1.9",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("in the config"),
        "{err}"
    );

    // Node 2's, added at run time, come back with a restart.
    sws[1].stop();
    sws[1].spawn();
    let v2 = vteps(&sws[1]);
    assert_eq!(v2.len(), 2, "{v2:?}");
    assert!(v2.iter().all(|v| !v.from_config && v.link_up), "{v2:?}");

    // A pod per node on each overlay: flat untagged, trunk on VLAN 200.
    let mut pods = Vec::new();
    for (i, sw) in sws.iter().enumerate() {
        for (n, overlay, vlan) in [(1, "flat", None), (3, "trunk", Some("200"))] {
            let host_end = format!("p{n}");
            let pod = Station::on_overlay(n + i as u8, Some(&u.vteps[i]), &host_end);
            let vlan = vlan.map(|v| ["--vlan", v]);
            sw.add_af_packet(&host_end, overlay, vlan.as_ref().map_or(&[], |v| &v[..]));
            pods.push(pod);
        }
    }
    // pods: node 1 flat .1, trunk .3; node 2 flat .2, trunk .4.
    pods[0].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.2");
    pods[1].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.4");
    let out = pods[0].ns.sh("busybox ping -c 2 -i 0.2 -W 1 10.66.0.4");
    assert!(
        !out.status.success(),
        "the flat overlay reached the trunk's"
    );
    // VLAN 200 crossed in its own VNI: its tunnel counted it, VLAN 100's
    // nothing.
    assert!(sws[0].stats("trunk-10.81.2.2-v200").totals.tx_packets > 0);
    assert_eq!(sws[0].stats("trunk-10.81.2.2-v100").totals.tx_packets, 0);
    // The MAC table names the VTEP.
    let m2 = pods[2].mac();
    let macs = sws[0].macs("flat");
    let e = macs
        .iter()
        .find(|m| m.mac == m2)
        .expect("node 2's pod learned");
    assert_eq!(
        (e.port.as_str(), e.vtep.map(|v| v.to_string())),
        ("flat-10.81.2.2", Some(Underlay::ip(2)))
    );
    let table = sws[0].cli_ok(&["mac", "list", "flat"]);
    assert!(table.contains(&Underlay::ip(2)), "{table}");

    // Node 2 lets node 1 go from the flat overlay: its tunnel goes, and
    // what was learned on it.
    let m1 = pods[0].mac();
    assert!(sws[1].macs("flat").iter().any(|m| m.mac == m1));
    sws[1].cli_ok(&["vtep", "del", "flat", &Underlay::ip(1)]);
    assert!(!sws[1].macs("flat").iter().any(|m| m.mac == m1));
    assert_eq!(vteps(&sws[1]).len(), 1);
    assert!(!pods[0]
        .ns
        .sh("busybox ping -c 2 -i 0.2 -W 1 10.66.0.2")
        .status
        .success());
    // A VTEP of the config stays until the config says otherwise.
    let o = sws[0].cli(&["vtep", "del", "flat", &Underlay::ip(2)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("remote:"), "{err}");
    let o = sws[0].cli(&["vtep", "add", "nosuch", &Underlay::ip(2)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("overlay:"), "{err}");
}

/// Port security holds across the overlay: a pod on another node that
/// sends from the MAC a local pod's port has pinned is dropped on the
/// tunnel (`spoofed_source`), and the local pod keeps its MAC.
#[test]
fn a_pod_on_another_node_cannot_take_a_pinned_mac() {
    let _g = serial();
    let (u, sws) = two_nodes_on_flat();
    let pods: Vec<Station> = sws
        .iter()
        .enumerate()
        .map(|(i, sw)| {
            let pod = Station::on_overlay(i as u8 + 1, Some(&u.vteps[i]), "pod");
            // Node 1's pod pins its MAC, as the CNI does.
            let mac = pod.mac();
            let pin = ["--mac", mac.as_str()];
            sw.add_af_packet("pod", "flat", if i == 0 { &pin } else { &[] });
            pod
        })
        .collect();
    pods[0].ns.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.66.0.2");
    let pinned = pods[0].mac();
    let spoofed = || {
        sws[0]
            .stats("flat-10.81.2.2")
            .totals
            .drops
            .get(&switchyard_api::DropReason::SpoofedSource)
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(spoofed(), 0);
    // Node 2's pod takes node 1's pod's MAC and sends.
    pods[1]
        .ns
        .sh_ok(&format!("ip link set eth0 address {pinned}"));
    // Node 2's switch learned that MAC on its tunnel: it holds the move
    // to its pod's port for `mac_move_hold_secs` after the last frame
    // from node 1 (`mac_move`); then the frames cross, and node 1 drops
    // them.
    wait_for(
        Duration::from_secs(30),
        "spoofed frames dropped on the tunnel",
        || {
            let _ = pods[1].ns.sh("busybox ping -c 1 -i 0.2 -W 1 10.66.0.1");
            (spoofed() > 0).then_some(())
        },
    );
    let e = sws[0]
        .macs("flat")
        .into_iter()
        .find(|m| m.mac == pinned)
        .unwrap();
    assert_eq!(e.port, "pod", "{e:?}");
}

/// Two nodes of a routed underlay, each a switch with overlay `flat`
/// (VNI 42) joined to the other.
fn two_nodes_on_flat() -> (Underlay, [Switch; 2]) {
    let u = Underlay::new(2);
    let overlay = "[overlays]\nflat = { vni = 42 }\n";
    let sws = [
        Switch::start_in(Some(&u.vteps[0].name), overlay),
        Switch::start_in(Some(&u.vteps[1].name), overlay),
    ];
    sws[0].cli_ok(&["vtep", "add", "flat", &Underlay::ip(2)]);
    sws[1].cli_ok(&["vtep", "add", "flat", &Underlay::ip(1)]);
    (u, sws)
}

/// The overlay's ARP/ND responder: each switch is given the stations
/// behind the other's VTEP (as vtep-sync gives a remote node's pods, with
/// their MACs and addresses). A pod's ARP requests and neighbour
/// solicitations for the other node's pod are answered by its own switch:
/// the pods reach each other in both families with no ARP request and no
/// solicitation on the underlay (captured), the remote MACs are pinned to
/// the tunnel, and each bridge counts its answers. An address nobody
/// knows is still flooded (and unanswered); one a pod ARPs for that is
/// not there gets no answer; stations taken out are flooded for again.
#[test]
fn a_bridge_answers_for_its_vteps_stations_and_no_request_crosses() {
    let _g = serial();
    let (u, mut sws) = two_nodes_on_flat();
    let pods: Vec<Station> = sws
        .iter()
        .enumerate()
        .map(|(i, sw)| {
            let pod = Station::on_overlay(i as u8 + 1, Some(&u.vteps[i]), "pod");
            pod.ns
                .sh_ok(&format!("ip -6 addr add fd66::{}/64 dev eth0 nodad", i + 1));
            sw.add_af_packet("pod", "flat", &[]);
            pod
        })
        .collect();
    // Each switch knows the other node's pod.
    for (i, sw) in sws.iter().enumerate() {
        let other = 1 - i;
        let station = format!(
            "{}=10.66.0.{},fd66::{}",
            pods[other].mac(),
            other + 1,
            other + 1
        );
        sw.cli_ok(&[
            "vtep",
            "stations",
            "flat",
            &Underlay::ip(other + 1),
            &station,
        ]);
        let v: Vec<switchyard_api::VtepInfo> =
            serde_json::from_str(&sw.cli_ok(&["vtep", "list", "--json"])).unwrap();
        assert_eq!(v[0].stations, 1, "{v:?}");
        let tunnel = format!("flat-{}", Underlay::ip(other + 1));
        let m = sw.macs("flat");
        assert!(
            m.iter()
                .any(|e| e.mac == pods[other].mac() && e.port == tunnel && e.pinned),
            "the remote pod's MAC pinned to the tunnel: {m:?}"
        );
    }
    // A takeover hands the stations over with their pins.
    sws[0].takeover();
    let v: Vec<switchyard_api::VtepInfo> =
        serde_json::from_str(&sws[0].cli_ok(&["vtep", "list", "--json"])).unwrap();
    assert_eq!(v[0].stations, 1, "{v:?}");
    let answered = |sw: &Switch| {
        let b: Vec<switchyard_api::BridgeInfo> =
            serde_json::from_str(&sw.cli_ok(&["bridge", "list", "--json"])).unwrap();
        b.iter()
            .find(|b| b.name == "flat")
            .unwrap()
            .counters
            .answered
    };

    // In steady state: the pods' own link-local addresses have been
    // probed for (duplicate address detection, from `::`, which is
    // flooded: its answer would say the address is taken).
    for p in &pods {
        wait_for(Duration::from_secs(10), "link-local DAD done", || {
            p.ns.sh_ok("ip -6 addr show dev eth0 tentative")
                .trim()
                .is_empty()
                .then_some(())
        });
    }
    let file = format!("{}/underlay.pcap", sws[0].dir.path().display());
    let cap = underlay_capture(&u.vteps[0], &file);
    pods[0].ns.sh_ok("busybox ping -c 2 -i 0.2 -W 2 10.66.0.2");
    pods[0].ns.sh_ok("busybox ping -c 2 -i 0.2 -W 2 fd66::2");
    // The pods' neighbours are the MACs the switches answered with.
    let neigh = pods[0].ns.sh_ok("ip neigh show dev eth0");
    assert!(neigh.contains(&pods[1].mac()), "{neigh}");
    // An address nobody has: flooded, unanswered.
    assert!(!pods[0]
        .ns
        .sh("busybox arping -c 1 -w 1 -I eth0 10.66.0.9")
        .status
        .success());
    let frames = underlay_frames(cap, &file);
    let requests = neighbour_requests(&frames);
    assert!(
        requests.len() == 1 && requests[0].contains("who-has 10.66.0.9"),
        "only the unknown address's request crosses: {requests:?}\n{frames:#?}"
    );
    assert!(
        frames.iter().any(|l| l.contains("ICMP echo request")),
        "{frames:#?}"
    );
    assert!(answered(&sws[0]) >= 2, "{}", answered(&sws[0]));
    assert!(answered(&sws[1]) >= 1, "{}", answered(&sws[1]));

    // A request that comes from a tunnel is not answered (its remote end
    // asks its own switch): node 2's switch knows nothing now, node 1's
    // has a station behind node 2 that node 2's pod asks for.
    sws[1].cli_ok(&["vtep", "stations", "flat", &Underlay::ip(1)]);
    sws[0].cli_ok(&[
        "vtep",
        "stations",
        "flat",
        &Underlay::ip(2),
        &format!("{}=10.66.0.2", pods[1].mac()),
        "02:00:00:00:00:77=10.66.0.7",
    ]);
    // `pod`'s request for `ip` goes unanswered, and switch 1 answers none.
    let unanswered = |pod: &Station, ip: &str| {
        let before = answered(&sws[0]);
        let arping = format!("busybox arping -c 1 -w 1 -I eth0 {ip}");
        assert!(!pod.ns.sh(&arping).status.success(), "{ip} answered");
        assert_eq!(answered(&sws[0]), before);
    };
    unanswered(&pods[1], "10.66.0.7");
    // A station that names a local pod's MAC takes nothing: the pod's MAC
    // stays on its port and works, and the station is not answered for.
    let own = pods[0].mac();
    sws[0].cli_ok(&[
        "vtep",
        "stations",
        "flat",
        &Underlay::ip(2),
        &format!("{}=10.66.0.2", pods[1].mac()),
        &format!("{own}=10.66.0.8"),
    ]);
    let m = sws[0].macs("flat");
    assert!(m.iter().any(|e| e.mac == own && e.port == "pod"), "{m:?}");
    pods[0].ns.sh_ok("busybox ping -c 1 -W 2 10.66.0.2");
    assert!(!pods[0]
        .ns
        .sh("busybox arping -c 1 -w 1 -I eth0 10.66.0.8")
        .status
        .success());

    // A local port made with a station's MAC (a pod that moved to this
    // node before the cluster said so) takes it: the station is no longer
    // pinned nor answered for. When the port goes, the station is pinned
    // again.
    let tunnel = format!("flat-{}", Underlay::ip(2));
    let holder = |sw: &Switch, mac: &str| {
        sw.macs("flat")
            .into_iter()
            .find(|e| e.mac == mac && e.pinned)
            .map(|e| e.port)
    };
    let moved = "02:00:00:00:00:77";
    sws[0].cli_ok(&[
        "vtep",
        "stations",
        "flat",
        &Underlay::ip(2),
        &format!("{moved}=10.66.0.7"),
    ]);
    assert_eq!(holder(&sws[0], moved).as_deref(), Some(tunnel.as_str()));
    let sock = sws[0].path("moved.sock");
    sws[0].cli_ok(&[
        "port", "add", "moved", "--kind", "memif", "--role", "master", "--socket", &sock,
        "--bridge", "flat", "--mac", moved,
    ]);
    assert_eq!(holder(&sws[0], moved).as_deref(), Some("moved"));
    unanswered(&pods[0], "10.66.0.7");
    sws[0].cli_ok(&["port", "del", "moved"]);
    assert_eq!(holder(&sws[0], moved).as_deref(), Some(tunnel.as_str()));

    // Several VTEPs' stations in one request (as the agent sends them): a
    // bad one is named and none is taken.
    let set = |remote: &str, mac: &str| switchyard_api::StationSet {
        remote: remote.parse().unwrap(),
        stations: vec![switchyard_api::RemoteStation {
            mac: mac.parse().unwrap(),
            vlan: None,
            ips: vec!["10.66.0.9".parse().unwrap()],
        }],
    };
    let e = sws[0]
        .client()
        .ask(&switchyard_api::Request::vtep_station_sets(
            "flat",
            vec![
                set(&Underlay::ip(2), "02:00:00:00:00:78"),
                set("10.81.9.9", "01:00:5e:00:00:01"),
            ],
        ))
        .unwrap_err();
    assert!(e.to_string().contains("sets[1].stations[0].mac"), "{e}");
    let e = sws[0]
        .client()
        .ask(&switchyard_api::Request::vtep_station_sets(
            "flat",
            vec![
                set(&Underlay::ip(2), "02:00:00:00:00:78"),
                set(&Underlay::ip(2), "02:00:00:00:00:79"),
            ],
        ))
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "sets[1].remote: {} is also sets[0]",
            Underlay::ip(2)
        )),
        "{e}"
    );
    assert_eq!(holder(&sws[0], "02:00:00:00:00:78"), None);
    assert_eq!(holder(&sws[0], moved).as_deref(), Some(tunnel.as_str()));

    // Node 2's pod is gone from switch 1's stations: its MAC is no longer
    // pinned, and a request for it is flooded again (and answered by the
    // pod).
    sws[0].cli_ok(&["vtep", "stations", "flat", &Underlay::ip(2)]);
    let m = sws[0].macs("flat");
    assert!(!m.iter().any(|e| e.pinned && e.port != "pod"), "{m:?}");
    let before = answered(&sws[0]);
    pods[0].ns.sh_ok("ip neigh flush dev eth0");
    let cap = underlay_capture(&u.vteps[0], &file);
    pods[0].ns.sh_ok("busybox ping -c 1 -W 2 10.66.0.2");
    let frames = underlay_frames(cap, &file);
    assert!(
        frames
            .iter()
            .any(|l| l.contains("ARP, Request who-has 10.66.0.2")),
        "{frames:#?}"
    );
    assert_eq!(answered(&sws[0]), before);
}

/// What a pod sends when it sweeps its /24 with ARP requests: `rounds`
/// requests for each of 10.66.0.1 to .254 from its own MAC and address,
/// on a raw socket as fast as it can, then the addresses that answered
/// (ARP replies to it within a second of the last), one per line.
const ARP_SWEEP: &str = r#"
import socket, struct, sys, time
rounds = int(sys.argv[1])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("eth0", 0))
mac = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
me = socket.inet_aton("10.66.0.1")
for _ in range(rounds):
    for host in range(1, 255):
        arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, me, b"\0" * 6,
                          socket.inet_aton("10.66.0.%d" % host))
        s.send(b"\xff" * 6 + mac + b"\x08\x06" + arp + b"\0" * 18)
s.settimeout(0.2)
seen, end = set(), time.time() + 1
while time.time() < end:
    try:
        f = s.recv(2048)
    except socket.timeout:
        continue
    if len(f) >= 42 and f[20:22] == b"\x00\x02" and f[32:38] == mac:
        seen.add(socket.inet_ntoa(f[28:32]))
print("\n".join(sorted(seen)))
"#;

/// Hostile input on an overlay: a pod sweeps its range with ARP requests.
/// Its switch answers for the one station it knows, and only for it; the
/// other requests, flooded, are held to the port's flood limit a second,
/// the rest dropped and counted (`flood_limit`); the other pod is still
/// reached.
#[test]
fn a_pod_sweeping_its_range_is_answered_for_stations_alone_and_its_floods_are_limited() {
    let _g = serial();
    let (u, sws) = two_nodes_on_flat();
    let pods: Vec<Station> = (0..2)
        .map(|i| Station::on_overlay(i as u8 + 1, Some(&u.vteps[i]), "pod"))
        .collect();
    sws[0].add_af_packet("pod", "flat", &["--flood-limit", "100"]);
    sws[1].add_af_packet("pod", "flat", &[]);
    sws[0].cli_ok(&[
        "vtep",
        "stations",
        "flat",
        &Underlay::ip(2),
        &format!("{}=10.66.0.2", pods[1].mac()),
    ]);
    let counters = |sw: &Switch| {
        let b: Vec<switchyard_api::BridgeInfo> =
            serde_json::from_str(&sw.cli_ok(&["bridge", "list", "--json"])).unwrap();
        b.into_iter().find(|b| b.name == "flat").unwrap().counters
    };
    let before = counters(&sws[0]);
    let dropped_before = sws[0].drops("pod", switchyard_api::DropReason::FloodLimit);
    let rounds = 8u64;
    let started = std::time::Instant::now();
    let answered = pods[0]
        .ns
        .sh_ok(&format!("python3 - {rounds} <<'EOF'\n{ARP_SWEEP}\nEOF"));
    // The windows the sweep (and the kernel's own few floods) spanned.
    let windows = started.elapsed().as_secs() + 2;
    assert_eq!(answered.trim(), "10.66.0.2", "the addresses that answered");
    let after = counters(&sws[0]);
    let dropped = sws[0].drops("pod", switchyard_api::DropReason::FloodLimit) - dropped_before;
    let flooded = after.flooded - before.flooded;
    let answers = after.answered - before.answered;
    eprintln!(
        "sweep: {answers} answered, {flooded} flooded, {dropped} dropped in {windows} windows"
    );
    assert_eq!(answers, rounds, "one answer a round");
    assert!(
        flooded <= 100 * windows,
        "{flooded} flooded in at most {windows} seconds"
    );
    assert!(
        dropped + flooded + answers >= rounds * 254,
        "every request answered, flooded or dropped: {answers} + {flooded} + {dropped}"
    );
    let st = sws[0].stats("pod");
    assert_eq!(st.flood_limit, 100, "{st:?}");
    // The pod's other traffic flows.
    pods[0].ns.sh_ok("busybox ping -c 1 -W 2 10.66.0.2");
}
