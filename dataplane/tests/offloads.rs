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

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

/// A port's drops for `reason` (0 when it has none).
fn dropped(t: &switchyard_api::PortTotals, reason: switchyard_api::DropReason) -> u64 {
    t.drops.get(&reason).copied().unwrap_or(0)
}

/// A process run in a namespace, killed by PID when dropped.
struct Bg(Child);

impl Bg {
    fn start(ns: &Netns, args: &[&str]) -> Bg {
        Bg(Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{args:?}: {e}")))
    }

    /// Waits for the process to end (bounded) and returns its stdout; it
    /// must succeed.
    fn finish(mut self, what: &str) -> String {
        let status = wait_for(Duration::from_secs(120), what, || {
            self.0.try_wait().unwrap()
        });
        let mut out = String::new();
        let mut err = String::new();
        use std::io::Read;
        self.0
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{what} failed: {out}{err}");
        out
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One station: a namespace whose `eth0` is a veth to the switch's
/// namespace, at 10.66.0.`n`/24.
struct Station {
    ns: Netns,
    ip: String,
}

impl Station {
    /// Station `n`, whose veth's other end is `host_end` in `sw_ns` (the
    /// root namespace if `None`).
    fn attached(n: u8, sw_ns: Option<&Netns>, host_end: &str) -> Station {
        let ns = Netns::new(&format!("st{n}"));
        let mut add = Command::new("ip");
        add.args(["link", "add", "eth0", "netns", &ns.name, "type", "veth"])
            .args(["peer", "name", host_end]);
        if let Some(sw) = sw_ns {
            add.args(["netns", &sw.name]);
        }
        assert!(
            add.status().unwrap().success(),
            "ip link add eth0 type veth"
        );
        let ip = format!("10.66.0.{n}");
        ns.sh_ok(&format!(
            "ip addr add {ip}/24 dev eth0 && ip link set eth0 up && ip link set lo up"
        ));
        let up = format!("ip link set {host_end} up");
        match sw_ns {
            Some(sw) => {
                sw.sh_ok(&up);
            }
            None => {
                run_ok(Command::new("sh").args(["-c", &up]));
            }
        }
        Station { ns, ip }
    }

    /// The MAC of its `eth0`.
    fn mac(&self) -> String {
        let out = self.ns.sh_ok("cat /sys/class/net/eth0/address");
        out.trim().to_string()
    }

    /// The offloads of its `eth0` as `ethtool -k` shows them.
    fn offloads(&self) -> String {
        self.ns.sh_ok("ethtool -k eth0")
    }

    /// Waits until something listens on TCP `port` in the namespace.
    fn wait_listening(&self, port: u16) {
        wait_for(
            Duration::from_secs(10),
            &format!("a listener on port {port} in {}", self.ns.name),
            || {
                let out = self.ns.sh_ok("ss -Hltn");
                out.contains(&format!(":{port} ")).then_some(())
            },
        );
    }
}

/// Receives one TCP connection on `port` and prints the byte count and MD5
/// of what it carried (`listening` first, once it listens).
const SINK: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
c, _ = s.accept()
h = hashlib.md5()
n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    h.update(b)
    n += len(b)
print(n, h.hexdigest())
"#;

/// Sends the file `argv[3]` to `argv[1]:argv[2]` over TCP.
const SOURCE: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
with open(sys.argv[3], "rb") as f:
    s.sendall(f.read())
s.shutdown(socket.SHUT_WR)
s.recv(1)
"#;

/// `from` sends a file of random bytes to `to` over TCP; `to` must get
/// exactly its bytes.
fn transfer_file(from: &Station, to: &Station, dir: &std::path::Path) {
    let file = dir.join(format!("blob-{}", from.ip));
    let data: Vec<u8> = {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(from.ip.len() as u32);
        (0..8 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    std::fs::write(&file, &data).unwrap();
    let want = run_ok(Command::new("md5sum").arg(&file));
    let want = want.split_whitespace().next().unwrap().to_string();
    let sink = Bg::start(&to.ns, &["python3", "-c", SINK, &to.ip, "7001"]);
    to.wait_listening(7001);
    Bg::start(
        &from.ns,
        &[
            "python3",
            "-c",
            SOURCE,
            &to.ip,
            "7001",
            file.to_str().unwrap(),
        ],
    )
    .finish(&format!("sending a file from {} to {}", from.ip, to.ip));
    let got = sink.finish(&format!("receiving the file at {}", to.ip));
    assert_eq!(
        got.trim(),
        format!("{} {want}", data.len()),
        "the file from {} to {} arrived changed",
        from.ip,
        to.ip
    );
}

/// `iperf3` from `client` to `server` (and, `reverse`, the other way on
/// the same connection): 64 MB must arrive, whatever the time it takes.
fn iperf(client: &Station, server: &Station, reverse: bool) -> serde_json::Value {
    let srv = Bg::start(
        &server.ns,
        &["iperf3", "-s", "-1", "-B", &server.ip, "-p", "5301"],
    );
    server.wait_listening(5301);
    let mut args = vec!["iperf3", "-c", &server.ip, "-p", "5301", "-n", "64M", "-J"];
    if reverse {
        args.push("-R");
    }
    let out = Bg::start(&client.ns, &args).finish("iperf3 client");
    drop(srv);
    let v: serde_json::Value = serde_json::from_str(&out).expect("iperf3 -J output");
    // The sender's count is exact; the receiver's ends with its last
    // report interval, so it may miss the tail (the file transfers check
    // every byte).
    let sent = v["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
    let got = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(
        sent >= 64 << 20 && got >= 60 << 20,
        "iperf3 {} -> {}: {sent} bytes sent, {got} received: {out}",
        client.ip,
        server.ip
    );
    v
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
        sw.cli_ok(&[
            "port",
            "add",
            name,
            "--kind",
            kind,
            "--interface",
            ifname,
            "--bridge",
            "default",
        ]);
        sw.wait_link(name, true);
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
    if a == "af-packet" {
        // The station's TSO super-frames reached the switch whole: far
        // more bytes per frame than an MTU holds.
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
        "host",
        "--kind",
        "tap",
        "--interface",
        "sy-host",
        "--bridge",
        "default",
    ]);
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
    host_ns.sh_ok("ip addr add 10.66.0.1/24 dev sy-host && ip link set sy-host up");
    let host = Station {
        ns: host_ns,
        ip: "10.66.0.1".into(),
    };
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
