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

fn serve(st: &Station, tcp: &[u16], udp: &[u16]) -> Servers {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for &port in tcp {
        let stop = stop.clone();
        threads.push(in_ns(&st.ns.name, move || {
            let l = TcpListener::bind(("0.0.0.0", port)).expect("tcp bind");
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
        }));
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
    let dst = SocketAddr::V4(SocketAddrV4::new(to.ip, port));
    in_ns(&from.ns.name, move || {
        let Ok(mut c) = TcpStream::connect_timeout(&dst, Duration::from_secs(1)) else {
            return false;
        };
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        if c.write_all(b"probe").is_err() {
            return false;
        }
        let mut b = [0u8; 5];
        c.read_exact(&mut b).is_ok() && &b == b"probe"
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
