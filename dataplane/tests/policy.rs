//! End-to-end: L3/L4 policy and station addresses on ports, with kernel
//! stations (network namespaces on veths, af-packet ports) probing each
//! other over TCP and UDP through the switch. Probes are made from
//! threads that enter a station's namespace (`setns`), so each is one
//! real socket of the station's kernel.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{serial, veth, wait_for, Netns, Switch};
use switchyard_api::DropReason;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

/// Runs `f` on a thread inside namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("the namespace");
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

/// A station: its namespace, its address, and its switch port's name.
struct Station {
    ns: Netns,
    ip: Ipv4Addr,
    port: String,
}

/// Servers a station runs until dropped: TCP and UDP echo on some ports.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A TCP echo server bound to `at` in `st`'s namespace (its first 64
/// bytes back), until `stop`.
fn echo_tcp(st: &Station, at: SocketAddr, stop: &Arc<AtomicBool>) -> JoinHandle<()> {
    let stop = stop.clone();
    in_ns(&st.ns.name, move || {
        let l = TcpListener::bind(at).expect("tcp bind");
        l.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut c, _)) => {
                    c.set_nonblocking(false).unwrap();
                    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let mut b = [0u8; 64];
                    if let Ok(n) = c.read(&mut b) {
                        let _ = c.write_all(&b[..n]);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    })
}

fn serve(st: &Station, tcp: &[u16], udp: &[u16]) -> Servers {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for &port in tcp {
        let at = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        threads.push(echo_tcp(st, at, &stop));
    }
    for &port in udp {
        let stop = stop.clone();
        threads.push(in_ns(&st.ns.name, move || {
            let s = UdpSocket::bind(("0.0.0.0", port)).expect("udp bind");
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut b = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = s.recv_from(&mut b) {
                    let _ = s.send_to(&b[..n], from);
                }
            }
        }));
    }
    // The sockets are bound before a probe comes.
    std::thread::sleep(Duration::from_millis(100));
    Servers { stop, threads }
}

/// Whether `from` gets an answer over TCP from `to`'s `port` (connect,
/// send, read the echo).
fn tcp(from: &Station, to: &Station, port: u16) -> bool {
    tcp_to(from, SocketAddr::V4(SocketAddrV4::new(to.ip, port)))
}

/// Whether `from` gets an answer over TCP from `dst` (any family).
fn tcp_to(from: &Station, dst: SocketAddr) -> bool {
    in_ns(&from.ns.name, move || {
        let Ok(mut c) = TcpStream::connect_timeout(&dst, Duration::from_secs(1)) else {
            return false;
        };
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut b = [0u8; 5];
        c.write_all(b"probe").is_ok() && c.read_exact(&mut b).is_ok() && &b == b"probe"
    })
    .join()
    .unwrap()
}

/// Whether `from` gets its datagram echoed by `to`'s UDP `port`.
fn udp(from: &Station, to: &Station, port: u16) -> bool {
    let dst = SocketAddrV4::new(to.ip, port);
    in_ns(&from.ns.name, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 16];
        // A few tries: the first may wait for ARP.
        (0..3)
            .any(|_| s.send_to(b"probe", dst).is_ok() && matches!(s.recv_from(&mut b), Ok((5, _))))
    })
    .join()
    .unwrap()
}

/// Whether an SCTP packet from `from` to `to`'s `port` arrives. This
/// kernel has no SCTP, so the probe is a raw IP socket of protocol 132 at
/// each end: the sender's carries an SCTP common header (source port 5000,
/// `port`), the receiver's sees every protocol-132 packet that comes in.
fn sctp(from: &Station, to: &Station, port: u16) -> bool {
    use std::os::fd::FromRawFd;
    let raw = || {
        // SAFETY: socket(2) with constant arguments; its result is checked
        // before it is taken as an owned descriptor.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_SCTP) };
        assert!(
            fd >= 0,
            "a raw SCTP socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is a new descriptor nothing else owns.
        std::net::UdpSocket::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    };
    let src = from.ip;
    let recv = in_ns(&to.ns.name, move || {
        let r = raw();
        r.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 128];
        let end = std::time::Instant::now() + Duration::from_secs(1);
        while std::time::Instant::now() < end {
            let Ok(n) = r.recv(&mut b) else { continue };
            let ihl = usize::from(b[0] & 0x0f) * 4;
            let from_ip = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
            if n >= ihl + 4 && from_ip == src && b[ihl + 2..ihl + 4] == port.to_be_bytes() {
                return true;
            }
        }
        false
    });
    std::thread::sleep(Duration::from_millis(100));
    let dst = to.ip;
    in_ns(&from.ns.name, move || {
        let s = raw();
        let mut hdr = [0u8; 12];
        hdr[..2].copy_from_slice(&5000u16.to_be_bytes());
        hdr[2..4].copy_from_slice(&port.to_be_bytes());
        for _ in 0..3 {
            let _ = s.send_to(&hdr, (dst, 0));
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .join()
    .unwrap();
    recv.join().unwrap()
}

/// Sets port `port`'s policy (JSON) through the CLI, as a user would.
fn set_policy(sw: &Switch, port: &str, json: &str) {
    let path = sw.path(&format!("{port}-policy.json"));
    std::fs::write(&path, json).unwrap();
    sw.cli_ok(&["port", "set", port, "--policy", &path]);
}

/// Three stations behind af-packet ports of one bridge.
fn three_stations(node: &Netns, sw: &Switch) -> Vec<Station> {
    let mut out = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let ns = Netns::new(&format!("pol{name}"));
        let port = format!("p{name}");
        veth(node, &port, &ns, "eth0");
        let ip = Ipv4Addr::new(10, 78, 0, i as u8 + 1);
        ns.sh_ok(&format!(
            "ip addr add {ip}/24 dev eth0 && ip link set lo up"
        ));
        sw.add_af_packet(&port, "default", &[]);
        out.push(Station { ns, ip, port });
    }
    for s in &out {
        sw.wait_link(&s.port, true);
    }
    out
}

#[test]
fn policy_allows_what_its_rules_say_and_replies_pass() {
    let _g = serial();
    let node = Netns::new("poln");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b, c) = (&st[0], &st[1], &st[2]);
    let _servers: Vec<Servers> = st.iter().map(|s| serve(s, &[80, 81], &[53])).collect();
    // No policy: everyone reaches everyone.
    wait_for(Duration::from_secs(10), "a reaching b", || {
        tcp(a, b, 80).then_some(())
    });
    assert!(tcp(c, b, 81) && udp(c, b, 53) && tcp(b, a, 80));

    // b isolated for ingress: TCP 80 from a alone.
    set_policy(
        &sw,
        "pb",
        r#"{"ingress": [{"name": "test/web-from-a[0]", "peers": [{"cidr": "10.78.0.1/32"}],
                         "ports": [{"protocol": "tcp", "port": 80}]}]}"#,
    );
    assert!(tcp(a, b, 80), "a to b:80, which the rule allows");
    assert!(!tcp(a, b, 81), "a to b:81, no rule");
    assert!(!tcp(c, b, 80), "c to b:80, not a peer");
    assert!(!udp(a, b, 53), "UDP to b, no rule");
    // b's own connections out: their replies pass its ingress.
    assert!(tcp(b, a, 81) && tcp(b, c, 80) && udp(b, c, 53));
    // Others are not isolated.
    assert!(tcp(c, a, 81) && udp(a, c, 53));
    let denied = sw.drops("pb", DropReason::PolicyIngress);
    assert!(denied >= 3, "b's ingress drops counted on b: {denied}");

    // Replaced: DNS from anyone too; a's web still allowed, c's not.
    set_policy(
        &sw,
        "pb",
        r#"{"ingress": [{"peers": [{"cidr": "10.78.0.1/32"}], "ports": [{"port": 80}]},
                        {"ports": [{"protocol": "udp", "port": 53}]}]}"#,
    );
    assert!(udp(a, b, 53) && udp(c, b, 53));
    assert!(tcp(a, b, 80) && !tcp(c, b, 80));

    // a isolated for egress: to b alone (10.78.0.0/24 less c).
    set_policy(
        &sw,
        "pa",
        r#"{"egress": [{"peers": [{"cidr": "10.78.0.0/24", "except": ["10.78.0.3/32"]}]}]}"#,
    );
    assert!(tcp(a, b, 80));
    assert!(!tcp(a, c, 80) && !udp(a, c, 53));
    assert!(sw.drops("pa", DropReason::PolicyEgress) >= 2);
    // c's connections to a: a's replies are of connections c opened.
    assert!(tcp(c, a, 80));

    // SCTP by port: 9000 from a alone.
    set_policy(
        &sw,
        "pb",
        r#"{"ingress": [{"peers": [{"cidr": "10.78.0.1/32"}],
                         "ports": [{"protocol": "sctp", "port": 9000}]}]}"#,
    );
    assert!(
        sctp(a, b, 9000),
        "SCTP from a to b:9000, as the rule allows"
    );
    assert!(!sctp(a, b, 9001), "SCTP to b:9001, no rule");
    assert!(!sctp(c, b, 9000), "SCTP from c, not a peer");
    assert!(!tcp(a, b, 9000), "TCP to b:9000, the rule is SCTP's");

    // A policy as big as a thousand peer pods make (their addresses one
    // by one, each rule with its ports: some 170 KiB of request): taken,
    // and a's web among them.
    let peers: Vec<String> = (0..6000)
        .map(|i| {
            format!(
                r#"{{"cidr": "10.{}.{}.{}/32"}}"#,
                100 + i / 65536,
                i / 256 % 256,
                i % 256
            )
        })
        .chain([r#"{"cidr": "10.78.0.1/32"}"#.to_string()])
        .collect();
    let big = format!(
        r#"{{"ingress": [{{"peers": [{}], "ports": [{{"port": 80}}]}}]}}"#,
        peers.join(", ")
    );
    assert!(big.len() > 128 * 1024, "{}", big.len());
    set_policy(&sw, "pb", &big);
    assert!(tcp(a, b, 80) && !tcp(c, b, 80));

    // Policies taken away: everyone again.
    set_policy(&sw, "pa", "{}");
    set_policy(&sw, "pb", "{}");
    assert!(tcp(c, b, 81) && tcp(a, c, 80));
    sw.stop();
}

#[test]
fn a_station_sending_from_another_stations_address_is_dropped() {
    let _g = serial();
    let node = Netns::new("spn");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b, c) = (&st[0], &st[1], &st[2]);
    let _servers: Vec<Servers> = st.iter().map(|s| serve(s, &[80], &[])).collect();
    for s in &st {
        sw.cli_ok(&["port", "set", &s.port, "--ips", &s.ip.to_string()]);
    }
    wait_for(Duration::from_secs(10), "a reaching b", || {
        tcp(a, b, 80).then_some(())
    });
    // a takes c's address as a second one and sends to b from it.
    a.ns.sh_ok(&format!(
        "ip addr add {}/32 dev eth0 && ip route add {}/32 dev eth0 src {}",
        c.ip, b.ip, c.ip
    ));
    assert!(!tcp(a, b, 80), "a connected to b from c's address");
    let spoofed = sw.drops("pa", DropReason::SpoofedIp);
    assert!(spoofed >= 1, "{spoofed}");
    // A forged ARP reply (a claiming c's address to b): dropped.
    let before = sw.drops("pa", DropReason::SpoofedIp);
    // (Its exit status says whether a reply came: none should. That it
    // ran at all is checked first.)
    a.ns.sh_ok("command -v busybox");
    a.ns.sh(&format!(
        "busybox arping -c 2 -U -s {} -I eth0 {}",
        c.ip, b.ip
    ));
    assert!(
        sw.drops("pa", DropReason::SpoofedIp) > before,
        "the forged ARP"
    );
    // b still knows c where c is, and c's traffic is untouched.
    a.ns.sh_ok(&format!(
        "ip route del {}/32 && ip addr del {}/32 dev eth0",
        b.ip, c.ip
    ));
    assert!(tcp(c, b, 80) && tcp(b, c, 80) && tcp(a, b, 80));
    // Taken away: any source again.
    sw.cli_ok(&["port", "set", "pa", "--ips", "none"]);
    let port = sw.port("pa");
    assert_eq!(port.spec.ips, None);
    sw.stop();
}

#[test]
fn a_takeover_carries_the_connections_policy_allowed() {
    let _g = serial();
    let node = Netns::new("tkn");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b) = (&st[0], &st[1]);
    // b takes nothing in: only replies to what it opened reach it.
    set_policy(&sw, "pb", r#"{"ingress": []}"#);
    // a's server: answers b's hello at once, then says more when told.
    let (more_tx, more_rx) = std::sync::mpsc::channel::<()>();
    let server = in_ns(&a.ns.name, move || {
        let l = TcpListener::bind(("0.0.0.0", 90)).unwrap();
        let (mut c, _) = l.accept().unwrap();
        let mut hello = [0u8; 5];
        c.read_exact(&mut hello).unwrap();
        c.write_all(b"hello").unwrap();
        more_rx.recv().unwrap();
        c.write_all(b"later").unwrap();
        // Held until b has read it.
        let _ = c.read(&mut hello);
    });
    std::thread::sleep(Duration::from_millis(100));
    let to = SocketAddr::V4(SocketAddrV4::new(a.ip, 90));
    let client = in_ns(&b.ns.name, move || {
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        c.read_exact(&mut got).unwrap();
        c
    });
    let mut c = client.join().expect("b's connection to a, and a's answer");
    // The switch is replaced while the connection is open; then a speaks
    // first: its packet comes to b's ingress, which only the connection
    // handed over lets through.
    sw.takeover();
    more_tx.send(()).unwrap();
    let mut got = [0u8; 5];
    c.read_exact(&mut got)
        .expect("a's later words through the new switch");
    assert_eq!(&got, b"later");
    drop(c);
    server.join().unwrap();
    assert_eq!(sw.drops("pb", DropReason::PolicyIngress), 0);
    // And the policy itself came across: a new connection from a to b is
    // refused.
    let _servers = serve(b, &[80], &[]);
    assert!(!tcp(a, b, 80));
    assert!(sw.drops("pb", DropReason::PolicyIngress) > 0);
    sw.stop();
}

#[test]
fn a_connection_opened_towards_one_port_is_not_established_towards_another() {
    let _g = serial();
    let node = Netns::new("bypn");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b) = (&st[0], &st[1]);
    let _servers: Vec<Servers> = st.iter().map(|s| serve(s, &[80], &[])).collect();
    wait_for(Duration::from_secs(10), "a reaching b", || {
        tcp(a, b, 80).then_some(())
    });
    // a may send anywhere on the network (its connections are tracked);
    // b takes nothing from a.
    set_policy(
        &sw,
        "pa",
        r#"{"egress": [{"peers": [{"cidr": "10.78.0.0/24"}]}]}"#,
    );
    set_policy(
        &sw,
        "pb",
        r#"{"ingress": [{"peers": [{"cidr": "10.78.0.3/32"}]}]}"#,
    );
    assert!(!tcp(a, b, 80));
    // a's SYN to b sent to the broadcast address: b refuses it, c (not
    // isolated) is allowed it. Then the same connection's retransmitted
    // SYN goes to b's own MAC: it is not of a connection towards b.
    let b_mac = b.ns.sh_ok("cat /sys/class/net/eth0/address");
    a.ns.sh_ok(&format!(
        "ip neigh replace {} lladdr ff:ff:ff:ff:ff:ff nud permanent dev eth0",
        b.ip
    ));
    let denied = sw.drops("pb", DropReason::PolicyIngress);
    let dst = SocketAddr::V4(SocketAddrV4::new(b.ip, 80));
    let attempt = in_ns(&a.ns.name, move || {
        TcpStream::connect_timeout(&dst, Duration::from_secs(4)).is_ok()
    });
    wait_for(
        Duration::from_secs(2),
        "the flooded SYN refused at b",
        || (sw.drops("pb", DropReason::PolicyIngress) > denied).then_some(()),
    );
    a.ns.sh_ok(&format!(
        "ip neigh replace {} lladdr {} nud permanent dev eth0",
        b.ip,
        b_mac.trim()
    ));
    assert!(
        !attempt.join().unwrap(),
        "a reached b through the connection its flood opened towards c"
    );
    assert!(sw.drops("pb", DropReason::PolicyIngress) >= denied + 2);
    sw.stop();
}

#[test]
fn a_long_stream_survives_updates_that_allow_it_and_its_reverse_is_refused() {
    use common::tcp::Bg;
    let _g = serial();
    let node = Netns::new("strn");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b) = (&st[0], &st[1]);
    let _servers: Vec<Servers> = st.iter().map(|s| serve(s, &[80], &[])).collect();
    for s in &st {
        sw.cli_ok(&["port", "set", &s.port, "--ips", &s.ip.to_string()]);
    }
    wait_for(Duration::from_secs(10), "a reaching b", || {
        tcp(a, b, 80).then_some(())
    });
    // b takes TCP 5201 and 80 from a; a is isolated for ingress and
    // takes nothing: its connections' replies alone come in.
    let web = r#"{"peers": [{"cidr": "10.78.0.1/32"}], "ports": [{"port": 80}]}"#;
    let stream = r#"{"peers": [{"cidr": "10.78.0.1/32"}], "ports": [{"port": 5201}]}"#;
    let dns =
        r#"{"peers": [{"cidr": "10.78.0.3/32"}], "ports": [{"protocol": "udp", "port": 53}]}"#;
    set_policy(&sw, "pb", &format!(r#"{{"ingress": [{stream}, {web}]}}"#));
    set_policy(&sw, "pa", r#"{"ingress": []}"#);
    let server = Bg::start(
        &b.ns,
        &["iperf3", "-s", "-1", "-B", &b.ip.to_string(), "-p", "5201"],
    );
    common::tcp::wait_listening(&b.ns, 5201);
    let ip = b.ip.to_string();
    let client = Bg::start(
        &a.ns,
        &[
            "iperf3", "-c", &ip, "-p", "5201", "-t", "6", "-i", "0.5", "-J",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    // Replaced by one that still allows the stream (and more).
    set_policy(
        &sw,
        "pb",
        &format!(r#"{{"ingress": [{dns}, {stream}, {web}]}}"#),
    );
    // The reverse: b's new connection to a is refused.
    assert!(!tcp(b, a, 80), "b reached a, which takes nothing in");
    // The web rule taken away: a's new connections to b:80 are refused,
    // the stream goes on.
    set_policy(&sw, "pb", &format!(r#"{{"ingress": [{stream}]}}"#));
    assert!(!tcp(a, b, 80), "a reached b:80 after its rule went");
    let out = client.finish("iperf3 client");
    server.finish("iperf3 server");
    let v: serde_json::Value = serde_json::from_str(&out).expect("iperf3 -J");
    let intervals = v["intervals"].as_array().expect("intervals");
    assert!(intervals.len() >= 11, "{out}");
    let stalled: Vec<f64> = intervals
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0))
        .filter(|&bps| bps < 1e6)
        .collect();
    assert!(
        stalled.is_empty(),
        "the stream stalled through the updates: {stalled:?}"
    );
    // A policy that denies it: a new stream is refused.
    set_policy(&sw, "pb", &format!(r#"{{"ingress": [{dns}]}}"#));
    let server = Bg::start(&b.ns, &["iperf3", "-s", "-1", "-B", &ip, "-p", "5201"]);
    common::tcp::wait_listening(&b.ns, 5201);
    let refused = a.ns.sh(&format!(
        "iperf3 -c {ip} -p 5201 -t 1 --connect-timeout 1500 >/dev/null 2>&1 && echo connected || echo refused"
    ));
    assert_eq!(String::from_utf8_lossy(&refused.stdout).trim(), "refused");
    // (The server, never reached, is stopped: it had nothing to do.)
    drop(server);
    assert!(sw.drops("pb", DropReason::PolicyIngress) >= 2);
    assert!(sw.drops("pa", DropReason::PolicyIngress) >= 1);
    sw.stop();
}

#[test]
fn a_flood_of_new_connections_fills_its_own_share_alone() {
    let _g = serial();
    let node = Netns::new("flon");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b, c) = (&st[0], &st[1], &st[2]);
    let _servers: Vec<Servers> = st.iter().map(|s| serve(s, &[80], &[53])).collect();
    // Addresses on every port, as the CNI gives them: each station's
    // connections are charged to its own port.
    for s in &st {
        sw.cli_ok(&["port", "set", &s.port, "--ips", &s.ip.to_string()]);
    }
    // b takes UDP on any port and TCP 80 from anyone on the network.
    set_policy(
        &sw,
        "pb",
        r#"{"ingress": [{"peers": [{"cidr": "10.78.0.0/24"}],
                         "ports": [{"protocol": "udp"}, {"port": 80}]}]}"#,
    );
    wait_for(Duration::from_secs(10), "c reaching b", || {
        tcp(c, b, 80).then_some(())
    });
    // a sends a datagram to each of b's ports in turn: a new connection
    // each, until its share (16,384) is full.
    let dst = b.ip;
    let flood = in_ns(&a.ns.name, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for round in 0..3u16 {
            for port in 1..=20_000u16 {
                let _ = s.send_to(b"x", (dst, port + round * 20_000));
                if port % 500 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    });
    wait_for(Duration::from_secs(30), "a's share full", || {
        (sw.drops("pa", DropReason::ConntrackFull) > 0).then_some(())
    });
    flood.join().unwrap();
    // Counted on a alone; c's and b's own connections still open.
    assert_eq!(sw.drops("pb", DropReason::ConntrackFull), 0);
    assert_eq!(sw.drops("pc", DropReason::ConntrackFull), 0);
    assert!(tcp(c, b, 80) && udp(c, b, 53), "c's new connections to b");
    assert!(tcp(b, c, 80), "b's own");
    // a's new ones are refused until some of its own expire.
    assert!(!udp(a, b, 53), "a opened another connection past its share");
    sw.stop();
}

#[test]
fn ipv6_stations_are_held_to_their_addresses_and_rules() {
    let _g = serial();
    let node = Netns::new("v6n");
    let mut sw = Switch::start_in(Some(&node.name), BRIDGE);
    let st = three_stations(&node, &sw);
    let (a, b, c) = (&st[0], &st[1], &st[2]);
    let v6 = |i: usize| format!("fd78::{}", i + 1);
    for (i, s) in st.iter().enumerate() {
        s.ns.sh_ok(&format!("ip -6 addr add {}/64 dev eth0 nodad", v6(i)));
        // Both families pinned, as a dual-stack IPAM result gives them.
        sw.cli_ok(&[
            "port",
            "set",
            &s.port,
            "--ips",
            &format!("{},{}", s.ip, v6(i)),
        ]);
    }
    // An echo server on [::]:8080 in b and c (dual-stack sockets).
    let _servers: Vec<Servers> = [b, c]
        .iter()
        .map(|s| {
            let stop = Arc::new(AtomicBool::new(false));
            let t = echo_tcp(s, "[::]:8080".parse().unwrap(), &stop);
            std::thread::sleep(Duration::from_millis(100));
            Servers {
                stop,
                threads: vec![t],
            }
        })
        .collect();
    let at = |i: usize| SocketAddr::new(v6(i).parse().unwrap(), 8080);
    // Neighbour discovery passes; the stations reach each other over v6.
    wait_for(Duration::from_secs(10), "a reaching b over IPv6", || {
        tcp_to(a, at(1)).then_some(())
    });
    // b takes 8080 from a's IPv6 address alone (and nothing over IPv4).
    set_policy(
        &sw,
        "pb",
        r#"{"ingress": [{"peers": [{"cidr": "fd78::1/128"}], "ports": [{"port": 8080}]}]}"#,
    );
    assert!(tcp_to(a, at(1)), "a to b over IPv6, as the rule allows");
    assert!(!tcp_to(c, at(1)), "c to b over IPv6, not a peer");
    let b4 = SocketAddr::new(b.ip.into(), 8080);
    assert!(!tcp_to(a, b4), "a to b over IPv4, no rule");
    // b's own connection out over IPv6: its replies come back in.
    assert!(tcp_to(b, at(2)));
    // a sending from c's IPv6 address: dropped as a spoof.
    let before = sw.drops("pa", DropReason::SpoofedIp);
    a.ns.sh_ok(&format!(
        "ip -6 addr add {}/128 dev eth0 nodad && ip -6 route add {}/128 dev eth0 src {}",
        v6(2),
        v6(1),
        v6(2)
    ));
    assert!(!tcp_to(a, at(1)), "a reached b from c's address");
    assert!(sw.drops("pa", DropReason::SpoofedIp) > before);
    sw.stop();
}

/// A client that moves from one port to another (its MAC moved by the
/// bridge, as when a VM migrates behind another tunnel) keeps its
/// connection into an isolated pod: the connection follows it, so the
/// pod's replies are not judged by its own egress rules (which allow
/// nothing) where the client now is.
#[test]
fn a_connection_follows_its_remote_end_to_another_port() {
    let _g = serial();
    let node = Netns::new("mign");
    let mut sw = Switch::start_in(
        Some(&node.name),
        &format!("mac_move_hold_secs = 0\n{BRIDGE}"),
    );
    // The client: its address and MAC on a Linux bridge whose one member
    // is the veth to port `mga` and then the one to port `mgm` (a VM's
    // live migration, as the switch sees it).
    let na = Netns::new("migra");
    let nb = Netns::new("migrb");
    veth(&node, "mga", &na, "eth0");
    veth(&node, "mgm", &na, "eth1");
    veth(&node, "mgb", &nb, "eth0");
    na.sh_ok(
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 && ip link set lo up && \
         ip link add br0 type bridge stp_state 0 && ip link set br0 address 02:00:00:78:00:01 && \
         ip link set eth0 master br0 && ip addr add 10.78.0.1/24 dev br0 && ip link set br0 up",
    );
    nb.sh_ok("ip addr add 10.78.0.2/24 dev eth0 && ip link set lo up");
    for p in ["mga", "mgm", "mgb"] {
        sw.add_af_packet(p, "default", &[]);
    }
    for p in ["mga", "mgm", "mgb"] {
        sw.wait_link(p, true);
    }
    // b takes connections from the client and opens none.
    set_policy(
        &sw,
        "mgb",
        r#"{"ingress": [{"peers": [{"cidr": "10.78.0.1/32"}]}], "egress": []}"#,
    );
    // b echoes what the one connection sends, until it ends.
    let server = in_ns(&nb.name, || {
        let l = TcpListener::bind("10.78.0.2:80").expect("bind");
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = [0u8; 64];
        while let Ok(n @ 1..) = s.read(&mut buf) {
            s.write_all(&buf[..n]).unwrap();
        }
    });
    let dst = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 2), 80));
    let mut c = wait_for(Duration::from_secs(10), "the client connected", || {
        in_ns(&na.name, move || {
            TcpStream::connect_timeout(&dst, Duration::from_secs(1)).ok()
        })
        .join()
        .unwrap()
    });
    let echo = |c: &mut TcpStream, wait: u64| {
        c.set_read_timeout(Some(Duration::from_secs(wait))).unwrap();
        let mut b = [0u8; 1];
        c.write_all(b"x").is_ok() && c.read_exact(&mut b).is_ok()
    };
    assert!(echo(&mut c, 2), "an echo before the move");
    // The move: the client is now behind `mgm`.
    na.sh_ok("ip link set eth0 nomaster && ip link set eth1 master br0");
    let refused = sw.drops("mgb", DropReason::PolicyEgress);
    assert!(
        echo(&mut c, 8),
        "the connection did not follow its client to its new port"
    );
    assert!(echo(&mut c, 2), "a second echo after the move");
    assert_eq!(sw.drops("mgb", DropReason::PolicyEgress), refused);
    drop(c);
    server.join().unwrap();
    sw.stop();
}
