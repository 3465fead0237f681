//! Packet capture and forwarding traces end to end: testpmd pods send
//! through the switch, `switchyard capture` writes what `tcpdump -r` reads,
//! and `switchyard trace` explains a learned unicast and a dropped frame.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{memif_vdev, rxonly_pod, serial, wait_for, Switch, Testpmd};
use pcap_file::pcapng::blocks::interface_statistics::InterfaceStatisticsOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use switchyard_api::{
    CaptureDirection, CaptureFormat, Delivery, DropReason, LearnOutcome, LookupOutcome, Request,
    TraceEntry,
};

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";
const MAC_A: &str = "02:00:00:00:7a:0a";
const MAC_B: &str = "02:00:00:00:7a:0b";
const MAC_C: &str = "02:00:00:00:7a:0c";
const MAC_D: &str = "02:00:00:00:7a:0d";

/// `tcpdump -r FILE -nn -e`: its lines (one per frame).
fn tcpdump(file: &str) -> Vec<String> {
    let out = Command::new("tcpdump")
        .args(["-r", file, "-nn", "-e"])
        .output()
        .expect("tcpdump (Debian: tcpdump)");
    assert!(
        out.status.success(),
        "tcpdump -r {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The frames of a pcapng file (epb_flags direction bits, length) and the
/// `isb_ifdrop` of its statistics block.
fn pcapng(bytes: &[u8]) -> (Vec<(u32, usize)>, Option<u64>) {
    let mut r = PcapNgReader::new(bytes).expect("a pcapng section header");
    let mut frames = Vec::new();
    let mut lost = None;
    while let Some(b) = r.next_block() {
        match b.expect("a well-formed block") {
            Block::EnhancedPacket(p) => {
                let flags = p
                    .options
                    .iter()
                    .find_map(|o| match o {
                        pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Flags(
                            f,
                        ) => Some(*f),
                        _ => None,
                    })
                    .unwrap_or(0);
                frames.push((flags & 3, p.data.len()));
            }
            Block::InterfaceStatistics(s) => {
                lost = s.options.iter().find_map(|o| match o {
                    InterfaceStatisticsOption::IsbIfDrop(n) => Some(*n),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    (frames, lost)
}

#[test]
fn captures_are_read_by_tcpdump_and_a_slow_reader_loses_only_capture_frames() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = sw.add_memif("a", &[]);
    let sb = sw.add_memif("b", &[]);
    // One pod whose two ports loop frames through the bridge.
    let mut pod = Testpmd::start(
        &[
            memif_vdev(0, "client", &sa, &format!("mac={MAC_A}")),
            memif_vdev(1, "client", &sb, &format!("mac={MAC_B}")),
        ],
        &["--forward-mode=io"],
    );
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    pod.send_bursts(1);
    wait_for(Duration::from_secs(10), "traffic", || {
        (sw.stats("b").totals.rx_packets > 10_000).then_some(())
    });

    // A file, both directions, 1000 frames cut at 100 bytes: tcpdump
    // reads them all, and pcapng marks each direction.
    let file = sw.path("both.pcapng");
    sw.cli_ok(&["capture", "a", "-c", "1000", "-s", "100", "-w", &file]);
    let lines = tcpdump(&file);
    assert_eq!(lines.len(), 1000, "{:?}", &lines[..lines.len().min(5)]);
    assert!(lines.iter().any(|l| l.contains(MAC_A)), "{}", lines[0]);
    let (frames, lost) = pcapng(&std::fs::read(&file).unwrap());
    assert_eq!(frames.len(), 1000);
    assert!(frames.iter().any(|f| f.0 == 1) && frames.iter().any(|f| f.0 == 2));
    assert!(frames.iter().all(|f| f.1 <= 100));
    assert!(lost.is_some(), "the statistics block ends the file");

    // Standard output into tcpdump, received frames only, classic pcap.
    let sh = format!(
        "{} --control {} capture b --direction rx --count 200 --format pcap -w - | tcpdump -r - -nn",
        common::switchyard_bin().display(),
        sw.control().display()
    );
    let out = Command::new("sh").args(["-c", &sh]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().count(),
        200,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A reader that does not read for two seconds: the capture loses
    // frames (counted at its end), the data frames flow on.
    let mut c = sw.client();
    let before = sw.stats("a").totals.rx_packets;
    let started = Instant::now();
    let (_, conn) = c
        .call_stream(&Request::Capture {
            port: "a".into(),
            direction: CaptureDirection::Both,
            count: None,
            snaplen: None,
            format: CaptureFormat::Pcapng,
            duration_ms: Some(3000),
        })
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let during = sw.stats("a").totals.rx_packets;
    let mut bytes = Vec::new();
    conn.read_to_end(&mut bytes).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let (frames, lost) = pcapng(&bytes);
    let lost = lost.expect("statistics block");
    assert!(lost > 0, "{} frames written, none lost", frames.len());
    // A worker held up by the capture would pass no more than its rings
    // hold (two ports, 1024 slots each way, 4,096 frames); the loop moves
    // far more in two seconds even in a debug build on a loaded machine.
    assert!(
        during > before + 10_000,
        "traffic stalled behind the capture: {before} -> {during}"
    );
    // The port's own drop counters do not hold the capture's losses.
    let a = sw.stats("a");
    assert_eq!(
        a.totals.drops.values().sum::<u64>(),
        0,
        "{:?}",
        a.totals.drops
    );

    // One capture per port at a time; bad arguments name their field.
    let err = sw.cli(&["capture", "nosuch", "-w", "/dev/null"]);
    assert!(String::from_utf8_lossy(&err.stderr).contains("port: no port named"));
    let err = sw.cli(&["capture", "a", "-s", "5", "-w", "/dev/null"]);
    assert!(String::from_utf8_lossy(&err.stderr).contains("snaplen"));
    let mut first = Command::new(common::switchyard_bin())
        .args(["--control", &sw.control().display().to_string()])
        .args(["capture", "a", "--duration", "5", "-w", "/dev/null"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It says when it is armed, as tcpdump says "listening on".
    let mut armed = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(first.stderr.as_mut().unwrap()),
        &mut armed,
    )
    .unwrap();
    assert_eq!(
        armed.trim(),
        "capturing on a, pcapng, snapshot length 262144 bytes"
    );
    let o = sw.cli(&["capture", "a", "-c", "1", "-w", "/dev/null"]);
    let busy = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        busy.contains("port: a capture of \"a\" is running"),
        "{busy}"
    );
    // Killing the client ends its capture: the port is free again.
    let _ = first.kill();
    let _ = first.wait();
    wait_for(Duration::from_secs(5), "the capture to end", || {
        sw.cli(&["capture", "a", "-c", "1", "-w", "/dev/null"])
            .status
            .success()
            .then_some(())
    });
    // The API answered throughout (the capture runs on its own thread).
    sw.cli_ok(&["port", "list"]);
}

#[test]
fn a_trace_shows_a_learned_unicast_and_a_dropped_frame_with_its_reason() {
    let _g = serial();
    let sw = Switch::start(BRIDGE);
    let sa = sw.add_memif("a", &[]);
    let sb = sw.add_memif("b", &[]);
    // Port c may only send from MAC_D: its pod, sending from MAC_C, is
    // spoofing.
    let sc = sw.add_memif("c", &["--mac", MAC_D]);
    let mut pa = rxonly_pod(&sa, MAC_A, MAC_B);
    let mut pb = rxonly_pod(&sb, MAC_B, MAC_A);
    let mut pc = rxonly_pod(&sc, MAC_C, MAC_B);
    for p in ["a", "b", "c"] {
        sw.wait_link(p, true);
    }
    // B learns A's address (flooded), then A's frames go to B only.
    pa.send_bursts(1);
    pb.send_bursts(1);
    pb.wait_rx(0, 32);

    let sw_ref = &sw;
    let tracer = std::thread::scope(|s| {
        let t = s.spawn(move || {
            let mut c = sw_ref.client();
            c.call_as::<Vec<TraceEntry>>(&Request::Trace {
                count: Some(64),
                port: None,
                timeout_ms: Some(15_000),
            })
            .unwrap()
        });
        // Frames for the trace, A to B then C's spoofed ones, until it has
        // its 64 (it may be armed after the first bursts: no frame is
        // waited for by time).
        while !t.is_finished() {
            pa.send_bursts(1);
            pc.send_bursts(1);
        }
        t.join().unwrap()
    });
    assert_eq!(tracer.len(), 64, "{tracer:#?}");
    let unicast = tracer
        .iter()
        .find(|e| e.in_port == "a")
        .expect("a frame from a");
    assert_eq!(unicast.src, MAC_A);
    assert_eq!(unicast.dst, MAC_B);
    assert_eq!(unicast.vlan, Some(0));
    assert!(
        matches!(unicast.learn, LearnOutcome::Known | LearnOutcome::Refreshed),
        "{unicast:#?}"
    );
    assert_eq!(unicast.lookup, LookupOutcome::Unicast);
    assert_eq!(unicast.lookup_port.as_deref(), Some("b"));
    assert_eq!(unicast.out.len(), 1);
    assert_eq!(
        (unicast.out[0].port.as_str(), unicast.out[0].result),
        ("b", Delivery::Sent)
    );
    assert_eq!(unicast.drop, None);
    let spoofed = tracer
        .iter()
        .find(|e| e.in_port == "c")
        .expect("a frame from c");
    assert_eq!(spoofed.src, MAC_C);
    assert_eq!(
        spoofed.drop,
        Some(DropReason::SpoofedSource),
        "{spoofed:#?}"
    );
    assert!(spoofed.out.is_empty());

    // The CLI's text, for one port's frames only.
    let sw_ref = &sw;
    let text = std::thread::scope(|s| {
        let t = s.spawn(move || {
            sw_ref.cli_ok(&["trace", "--count", "2", "--port", "c", "--timeout", "15"])
        });
        while !t.is_finished() {
            pa.send_bursts(1);
            pc.send_bursts(1);
        }
        t.join().unwrap()
    });
    assert_eq!(text.matches("frame ").count(), 2, "{text}");
    assert!(text.contains("in c (worker 0)"), "{text}");
    assert!(text.contains("dropped: spoofed_source"), "{text}");
    assert!(!text.contains("in a "), "{text}");

    // A trace with nothing to see answers at its timeout with nothing;
    // learning shows in the bridge's counters.
    let v: Vec<TraceEntry> = sw
        .client()
        .call_as(&Request::Trace {
            count: Some(5),
            port: Some("b".into()),
            timeout_ms: Some(300),
        })
        .unwrap();
    assert!(v.is_empty(), "{v:?}");
    let bridges: Vec<switchyard_api::BridgeInfo> =
        sw.client().call_as(&Request::BridgeList).unwrap();
    let c = bridges[0].counters;
    assert!(c.learned >= 2 && c.flooded >= 32, "{c:?}");
}
