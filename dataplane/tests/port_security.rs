//! End-to-end: port security with real DPDK testpmd pods. A hostile memif
//! peer sprays source MACs while two pods talk; a pod sends with its
//! neighbour's MAC; a pinned port refuses any other source.

mod common;

use std::time::{Duration, Instant};

use common::memif_peer::{self as peer, Conn, SlaveMem};
use common::{rxonly_pod, serial, wait_for, Switch, Testpmd};
use switchyard_api::DropReason;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";
const MAC_A: &str = "02:00:00:00:5e:0a";
const MAC_B: &str = "02:00:00:00:5e:0b";
/// The hostile peer sprays this many distinct source MACs.
const SPRAY: u64 = 100_000;

/// A frame from `src` to `dst` (an IPv4 ethertype and zero payload).
fn frame(dst: u64, src: u64) -> [u8; 64] {
    let mut f = [0u8; 64];
    f[0..6].copy_from_slice(&dst.to_be_bytes()[2..]);
    f[6..12].copy_from_slice(&src.to_be_bytes()[2..]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f
}

/// `n` distinct, scattered, locally administered unicast MACs.
fn random_macs(n: u64) -> impl Iterator<Item = u64> {
    // A multiplicative permutation of 0..2^40 (odd multiplier): distinct.
    (1..=n).map(|i| 0x0200_0000_0000 | (i.wrapping_mul(0x009E_3779_B97F) & 0x00ff_ffff_ffff))
}

/// Pods A and B exchange unicast; returns what B received of A's bursts
/// and A of B's.
fn exchange(a: &mut Testpmd, b: &mut Testpmd, bursts: u32) -> (u64, u64) {
    let (b0, a0) = (b.port_stats(0).0, a.port_stats(0).0);
    a.send_bursts(bursts);
    let got_b = b.wait_rx(0, b0 + u64::from(bursts) * 32) - b0;
    b.send_bursts(bursts);
    let got_a = a.wait_rx(0, a0 + u64::from(bursts) * 32) - a0;
    (got_b, got_a)
}

#[test]
fn a_port_spraying_source_macs_pushes_out_no_neighbour() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let (sa, sb) = (sw.add_memif("a", &[]), sw.add_memif("b", &[]));
    let sh = sw.add_memif("h", &[]);
    let mut a = rxonly_pod(&sa, MAC_A, MAC_B);
    let mut b = rxonly_pod(&sb, MAC_B, MAC_A);
    let mem = SlaveMem::new();
    let conn = Conn::connect(&sh);
    peer::run_slave(&conn, &mem.script()).expect("handshake");
    // The hostile peer takes whatever the switch floods to it.
    mem.post_m2s_buffers();
    for p in ["a", "b", "h"] {
        sw.wait_link(p, true);
    }
    // Both pods known to the bridge.
    assert_eq!(exchange(&mut a, &mut b, 1), (32, 32));
    let h_tx = sw.stats("h").totals.tx_packets;

    // 100,000 frames from as many source MACs, each to the first of them
    // (learned on the hostile port itself: dropped there as hairpins).
    let first = random_macs(1).next().unwrap();
    let end = Instant::now() + Duration::from_secs(120);
    for src in random_macs(SPRAY) {
        let f = frame(first, src);
        while !mem.send(&f) {
            assert!(Instant::now() < end, "the switch stopped taking frames");
            std::thread::yield_now();
        }
    }
    wait_for(Duration::from_secs(30), "the spray taken", || {
        (mem.s2m.tail() == mem.s2m.head()).then_some(())
    });
    // The pods talk on; nothing of theirs is flooded to the hostile port.
    assert_eq!(exchange(&mut a, &mut b, 4), (128, 128));
    let st = sw.stats("h");
    assert_eq!(
        st.totals.tx_packets, h_tx,
        "unicast between the pods reached the hostile port"
    );
    assert_eq!(st.mac_entries, 64, "{st:?}");
    assert_eq!(st.mac_limit, 64);
    assert_eq!(sw.drops("h", DropReason::MacLimit), SPRAY - 64, "{st:?}");
    let macs = sw.macs("default");
    for (mac, port) in [(MAC_A, "a"), (MAC_B, "b")] {
        assert!(
            macs.iter().any(|e| e.mac == mac && e.port == port),
            "{mac} on {port}"
        );
    }
    assert_eq!(macs.iter().filter(|e| e.port == "h").count(), 64);
    wait_for(Duration::from_secs(10), "the limit logged", || {
        sw.log()
            .contains("the port holds as many MAC entries as its limit allows")
            .then_some(())
    });
}

#[test]
fn a_pod_sending_with_its_neighbours_mac_does_not_get_its_traffic() {
    let _g = serial();
    // A move hold no test run outlasts: A's address is always fresh on A
    // when C claims it, however slowly the machine runs.
    let sw = Switch::start(&format!("mac_move_hold_secs = 3600\n{BRIDGE}"));
    let (sa, sb, sc) = (
        sw.add_memif("a", &[]),
        sw.add_memif("b", &[]),
        sw.add_memif("c", &[]),
    );
    let mut a = rxonly_pod(&sa, MAC_A, MAC_B);
    let mut b = rxonly_pod(&sb, MAC_B, MAC_A);
    // Pod C claims A's MAC.
    let mut c = rxonly_pod(&sc, MAC_A, MAC_B);
    for p in ["a", "b", "c"] {
        sw.wait_link(p, true);
    }
    assert_eq!(exchange(&mut a, &mut b, 1), (32, 32));
    let c_rx = c.port_stats(0).0;
    // C sends as A (A spoke within the move hold).
    c.send_bursts(2);
    wait_for(Duration::from_secs(10), "C's frames refused", || {
        (sw.drops("c", DropReason::MacMove) >= 64).then_some(())
    });
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|e| e.mac == MAC_A && e.port == "a"),
        "{macs:?}"
    );
    // B's traffic for A still goes to A, and none to C.
    assert_eq!(exchange(&mut a, &mut b, 2), (64, 64));
    assert_eq!(c.port_stats(0).0, c_rx, "C received A's traffic");
    // The control thread logs security drops on its next round.
    wait_for(Duration::from_secs(10), "the refused move logged", || {
        sw.log().contains("MAC move refused").then_some(())
    });
}

#[test]
fn a_pinned_port_sends_only_from_its_mac_and_keeps_it_while_down() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = sw.add_memif("a", &["--mac", MAC_A]);
    let sb = sw.add_memif("b", &[]);
    // Pinned before pod A ever spoke: B's frames to A are unicast at once.
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|e| e.mac == MAC_A && e.port == "a"),
        "{macs:?}"
    );
    let mut a = rxonly_pod(&sa, MAC_A, MAC_B);
    let mut b = rxonly_pod(&sb, MAC_B, MAC_A);
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    assert_eq!(exchange(&mut a, &mut b, 1), (32, 32));
    drop(a);
    drop(b);
    sw.wait_link("a", false);
    sw.wait_link("b", false);
    // A's address stays A's while its pod is away: a pod on B's port
    // sending as A is refused.
    let mut thief = rxonly_pod(&sb, MAC_A, MAC_B);
    sw.wait_link("b", true);
    thief.send_bursts(1);
    wait_for(
        Duration::from_secs(10),
        "the thief's frames dropped",
        || (sw.drops("b", DropReason::SpoofedSource) >= 32).then_some(()),
    );
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|e| e.mac == MAC_A && e.port == "a"),
        "{macs:?}"
    );
    drop(thief);
    // A pod on A's port with another MAC: every frame dropped.
    let mut spoofer = rxonly_pod(&sa, "02:00:00:00:5e:99", MAC_B);
    sw.wait_link("a", true);
    spoofer.send_bursts(1);
    wait_for(Duration::from_secs(10), "spoofed frames dropped", || {
        (sw.drops("a", DropReason::SpoofedSource) >= 32).then_some(())
    });
}
