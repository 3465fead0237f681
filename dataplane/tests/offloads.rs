//! TCP through the switch with the kernel's default offloads on: two
//! stations (network namespaces with their own stacks) on veth pairs
//! whose other ends are af-packet or af-xdp ports of one bridge. The
//! stations' veths keep transmit checksum offload and TSO on, as every
//! Linux host has them, so the switch receives segments whose checksums
//! are left to finish and (through af-packet) 64 KB super-frames; it must
//! deliver them finished, segmented or with the kernel's metadata, to
//! whichever port they leave through. `iperf3` and a file transfer whose
//! MD5 is compared run both ways over each pairing of port kinds, and
//! between the host, on a tap port with its offloads on, and a station.

mod common;

use std::time::Duration;

use common::tcp::*;
use common::*;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

/// A port's drops for `reason` (0 when it has none).
fn dropped(t: &switchyard_api::PortTotals, reason: switchyard_api::DropReason) -> u64 {
    t.drops.get(&reason).copied().unwrap_or(0)
}

/// Two stations through ports of kinds `a` and `b`: TCP both ways.
fn tcp_through(a: &str, b: &str) {
    let _g = serial();
    let sw_ns = Netns::new("tcpsw");
    let s1 = Station::attached(1, Some(&sw_ns), "up1");
    let s2 = Station::attached(2, Some(&sw_ns), "up2");
    // The kernel's defaults, as the test means to run with them.
    for s in [&s1, &s2] {
        let k = s.offloads();
        assert!(k.contains("tx-checksumming: on"), "{k}");
        assert!(k.contains("tcp-segmentation-offload: on"), "{k}");
    }
    let sw = Switch::start_in(Some(&sw_ns.name), BRIDGE);
    for (name, kind, ifname) in [("p1", a, "up1"), ("p2", b, "up2")] {
        // `af-xdp:native`: the kind with its --mode.
        let (kind, mode) = kind.split_once(':').unwrap_or((kind, ""));
        let mut args = vec!["port", "add", name, "--kind", kind];
        if !mode.is_empty() {
            args.extend(["--mode", mode]);
        }
        args.extend(["--interface", ifname, "--bridge", "default"]);
        sw.cli_ok(&args);
        sw.wait_link(name, true);
    }
    // An af-xdp port on a veth takes generic XDP unless told otherwise: the
    // station keeps its TSO (native XDP on a veth turns it off).
    for (s, kind) in [(&s1, a), (&s2, b)] {
        let tso = s.offloads().contains("tcp-segmentation-offload: on");
        assert_eq!(tso, kind != "af-xdp:native", "{kind}: {}", s.offloads());
    }
    iperf(&s1, &s2, false);
    iperf(&s1, &s2, true);
    transfer_file(&s1, &s2, sw.dir.path());
    transfer_file(&s2, &s1, sw.dir.path());
    // Nothing was dropped for offload metadata that did not fit.
    for p in ["p1", "p2"] {
        let st = sw.stats(p).totals;
        assert_eq!(
            dropped(&st, switchyard_api::DropReason::BadOffload),
            0,
            "{p}: {st:?}"
        );
    }
    if a != "af-xdp:native" {
        // The station's TSO super-frames reached the switch whole: far
        // more bytes per frame than an MTU holds (through af-xdp, in
        // several buffers each).
        let st = sw.stats("p1").totals;
        assert!(
            super_frames(st.rx_bytes, st.rx_packets),
            "p1 received {} bytes in {} frames",
            st.rx_bytes,
            st.rx_packets
        );
        let out = sw.stats("p2").totals;
        if b == "af-packet" {
            // ... and left whole, the kernel told to segment them.
            assert!(
                super_frames(out.tx_bytes, out.tx_packets),
                "p2 sent {} bytes in {} frames",
                out.tx_bytes,
                out.tx_packets
            );
        } else {
            // ... and left cut to the MTU by the switch (an AF_XDP socket
            // takes no metadata): none was too long.
            assert!(out.tx_packets > st.rx_packets, "{st:?} {out:?}");
            assert_eq!(dropped(&out, switchyard_api::DropReason::TooLong), 0);
        }
    }
}

/// The host (the switch's namespace) on a tap port, and a station behind
/// an uplink of kind `uplink`: TCP both ways.
fn tcp_from_the_host_through(uplink: &str) {
    let _g = serial();
    let host_ns = Netns::new("tcphost");
    let station = Station::attached(2, Some(&host_ns), "up2");
    let sw = Switch::start_in(Some(&host_ns.name), BRIDGE);
    sw.cli_ok(&[
        "port",
        "add",
        "up",
        "--kind",
        uplink,
        "--interface",
        "up2",
        "--bridge",
        "default",
    ]);
    sw.wait_link("up", true);
    let host = host_on_tap(&sw, host_ns);
    // The tap offers the host's stack checksum offload and TSO.
    let k = host.ns.sh_ok("ethtool -k sy-host");
    assert!(k.contains("tx-checksumming: on"), "{k}");
    assert!(k.contains("tcp-segmentation-offload: on"), "{k}");
    iperf(&host, &station, false);
    iperf(&host, &station, true);
    transfer_file(&host, &station, sw.dir.path());
    transfer_file(&station, &host, sw.dir.path());
    let tap = sw.stats("host").totals;
    assert_eq!(
        dropped(&tap, switchyard_api::DropReason::BadOffload),
        0,
        "{tap:?}"
    );
    // The host's super-frames reached the switch whole.
    assert!(
        super_frames(tap.rx_bytes, tap.rx_packets),
        "the tap port received {} bytes in {} frames",
        tap.rx_bytes,
        tap.rx_packets
    );
    drop(sw);
}

#[test]
fn tcp_from_the_host_through_a_tap_port_to_a_namespace_behind_af_packet() {
    tcp_from_the_host_through("af-packet");
}

#[test]
fn tcp_from_the_host_through_a_tap_port_to_a_namespace_behind_af_xdp() {
    tcp_from_the_host_through("af-xdp");
}

#[test]
fn tcp_between_namespaces_through_af_packet_ports() {
    tcp_through("af-packet", "af-packet");
}

#[test]
fn tcp_between_namespaces_through_af_xdp_ports() {
    tcp_through("af-xdp", "af-xdp");
}

#[test]
fn tcp_from_an_af_packet_port_to_an_af_xdp_port_is_segmented_by_the_switch() {
    tcp_through("af-packet", "af-xdp");
}

#[test]
fn tcp_from_an_af_xdp_port_in_native_mode_to_an_af_packet_port() {
    tcp_through("af-xdp:native", "af-packet");
}

/// A DPDK pod between two bridges, as a router or firewall CNF sits: two
/// `virtio_user` ports on vhost-user ports of the switch, forwarding with
/// testpmd's `csum` engine, which asks its ports for checksum offload and
/// TSO (`csum set tcp hw`, `tso set 1448`) and takes super-frames in
/// (`TCP_LRO`: `GUEST_TSO4/6` negotiated). Station 1 (kernel TCP, default
/// offloads) is on an af-packet port of bridge `b1`; station 2 is behind
/// a DPDK memif pod on bridge `b2` (testpmd `io` between its memif port
/// and an af_packet port on the station's veth). The station's
/// super-frames cross the first bridge whole, leave the DPDK pod as TSO
/// super-frames with their checksum left to do, and the switch cuts them
/// into segments for the memif pod, which takes no metadata.
#[test]
fn a_dpdk_pod_with_tso_sends_super_frames_that_the_switch_segments_for_a_memif_pod() {
    let _g = serial();
    let tag = std::process::id() % 100_000;
    let (v1, v2) = (format!("sy{tag}s1"), format!("sy{tag}s2"));
    let s1 = Station::attached(1, None, &v1);
    let s2 = Station::attached(2, None, &v2);
    // Station 2 sits behind DPDK's af_packet PMD, which takes frames of at
    // most 2 KB with their checksums done: its offloads are off (the
    // memif pod's side, not the switch's, is what this sets up).
    s2.ns.sh_ok("ethtool -K eth0 tso off gso off tx off");
    let sw = Switch::start("[[bridge]]\nname = \"b1\"\n[[bridge]]\nname = \"b2\"\n");
    let (vu1, vu2, mp) = (
        sw.path("dpdk-vu1.sock"),
        sw.path("dpdk-vu2.sock"),
        sw.path("dpdk-mp.sock"),
    );
    for args in [
        vec![
            "up",
            "--kind",
            "af-packet",
            "--interface",
            v1.as_str(),
            "--bridge",
            "b1",
        ],
        vec![
            "vu1",
            "--kind",
            "vhost-user",
            "--role",
            "server",
            "--socket",
            &vu1,
            "--bridge",
            "b1",
        ],
        vec![
            "vu2",
            "--kind",
            "vhost-user",
            "--role",
            "server",
            "--socket",
            &vu2,
            "--bridge",
            "b2",
        ],
        vec![
            "mp", "--kind", "memif", "--role", "master", "--socket", &mp, "--bridge", "b2",
        ],
    ] {
        let mut all = vec!["port", "add"];
        all.extend(args);
        sw.cli_ok(&all);
    }
    // The router pod: port 0 faces station 1, port 1 station 2; each
    // frame leaves addressed to the station on that side.
    let mut router = Testpmd::start(
        &[
            virtio_vdev(0, &vu1, false, ""),
            virtio_vdev(1, &vu2, false, ""),
        ],
        &[
            "--forward-mode=csum",
            "--mbuf-size=9216",
            // TCP and UDP checksum, LRO (GUEST_TSO), scatter.
            "--rx-offloads=0x201c",
            "--max-pkt-len=9000",
            &format!("--eth-peer=0,{}", s1.mac()),
            &format!("--eth-peer=1,{}", s2.mac()),
        ],
    );
    let from = router.output().len();
    for line in [
        "stop",
        "port stop all",
        "csum set ip hw 0",
        "csum set tcp hw 0",
        "csum set ip hw 1",
        "csum set tcp hw 1",
        "tso set 1448 0",
        "tso set 1448 1",
        "port start all",
        "start",
    ] {
        router.cmd(line);
    }
    let out = router.wait_output_from(from, Duration::from_secs(20), "forwarding packets");
    assert!(
        !out.contains("Fail"),
        "testpmd took the offload settings:\n{out}"
    );
    let _memif_pod = Testpmd::start(
        &[
            memif_vdev(0, "client", &mp, ""),
            format!("net_af_packet1,iface={v2}"),
        ],
        &["--forward-mode=io"],
    );
    for p in ["up", "vu1", "vu2", "mp"] {
        sw.wait_link(p, true);
    }
    // The DPDK driver negotiated the offloads both ways.
    let peer = sw.port("vu2").status.peer.unwrap_or_default();
    let features = peer
        .rsplit("0x")
        .next()
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or(0);
    for (bit, name) in [
        (0, "CSUM"),
        (1, "GUEST_CSUM"),
        (7, "GUEST_TSO4"),
        (11, "HOST_TSO4"),
    ] {
        assert!(features & (1 << bit) != 0, "{name} not negotiated: {peer}");
    }
    iperf(&s1, &s2, false);
    transfer_file(&s1, &s2, sw.dir.path());
    transfer_file(&s2, &s1, sw.dir.path());
    let from_dpdk = sw.stats("vu2").totals;
    let to_memif = sw.stats("mp").totals;
    assert!(
        super_frames(from_dpdk.rx_bytes, from_dpdk.rx_packets),
        "the DPDK pod sent TSO super-frames: {from_dpdk:?}"
    );
    assert!(
        to_memif.tx_packets > from_dpdk.rx_packets,
        "the switch cut them into segments for the memif pod: {from_dpdk:?} {to_memif:?}"
    );
    for p in ["up", "vu1", "vu2", "mp"] {
        let st = sw.stats(p).totals;
        assert_eq!(
            dropped(&st, switchyard_api::DropReason::BadOffload),
            0,
            "{p}: {st:?}"
        );
        assert_eq!(
            dropped(&st, switchyard_api::DropReason::TooLong),
            0,
            "{p}: {st:?}"
        );
    }
    drop(router);
}
