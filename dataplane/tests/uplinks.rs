//! Ports to the kernel, with real kernel peers in network namespaces the
//! tests make: a tap port the switch creates, which the host's own stack
//! uses to reach a DPDK testpmd pod (icmpecho: it answers ARP and ping) on
//! memif; af-packet uplinks on veth pairs, between a namespace's stack and a
//! pod, and between two switches ("nodes") that form one network per VLAN.

mod common;

use std::time::Duration;

use common::memif_peer::{self as peer, Conn, SlaveMem};
use common::*;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

/// The kernel's ping (busybox's, which the test command installs) from the
/// namespace; true if any reply came.
fn ping(ns: &Netns, args: &str) -> bool {
    ping_to(ns, args, "10.77.0.2")
}

fn ping_to(ns: &Netns, args: &str, to: &str) -> bool {
    ns.sh(&format!("busybox ping -c 3 -i 0.2 -W 2 {args} {to}"))
        .status
        .success()
}

/// Waits until port `port` holds frames to `mtu` (it reads its interface's
/// MTU every 2 s and reports it).
fn wait_mtu(sw: &Switch, port: &str, mtu: u32) {
    wait_for(
        Duration::from_secs(10),
        &format!("port {port} to report MTU {mtu}"),
        || (sw.port(port).status.mtu == Some(mtu)).then_some(()),
    );
}

/// A raw memif peer of ours, slave of a new master port "raw" of the
/// bridge, linked: it sends the test's own bytes.
fn raw_peer(sw: &Switch) -> (Conn, SlaveMem) {
    let raw = sw.path("raw.sock");
    sw.add_port(&[
        "raw", "--kind", "memif", "--role", "master", "--socket", &raw,
    ]);
    let mem = SlaveMem::new();
    let conn = Conn::connect(&raw);
    peer::run_slave(&conn, &mem.script()).expect("handshake");
    mem.post_m2s_buffers();
    sw.wait_link("raw", true);
    (conn, mem)
}

/// A `len`-byte broadcast from 02:00:00:00:77:01 with a local ethertype
/// (0x88b5) and a payload of `fill` bytes.
fn raw_broadcast(len: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![fill; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0x77, 1]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

/// A DPDK testpmd pod answering ARP and ping, as memif server at `sock`
/// (the switch, memif slave, connects and redials).
fn echo_pod(sock: &str) -> Testpmd {
    let mut p = Testpmd::start(
        &[memif_vdev(0, "server", sock, "")],
        &["--forward-mode=icmpecho"],
    );
    p.cmd("start");
    p
}

#[test]
fn the_host_reaches_a_pod_through_a_tap_port() {
    let _g = serial();
    let ns = Netns::new("tap");
    let tap = format!("sy{}", std::process::id() % 100_000);
    let mut sw = Switch::start_in(Some(&ns.name), BRIDGE);
    let pod_sock = sw.path("pod.sock");
    // The switch is the memif slave: it redials the pod after a restart.
    sw.add_port(&[
        "pod", "--kind", "memif", "--role", "slave", "--socket", &pod_sock,
    ]);
    sw.add_port(&["tap0", "--kind", "tap", "--interface", &tap]);
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
    let (conn, mem) = raw_peer(&sw);
    wait_mtu(&sw, "tap0", 1000);
    let before = sw.stats("tap0").totals;
    assert!(mem.send(&raw_broadcast(1200, 0)));
    wait_for(Duration::from_secs(10), "the long frame dropped", || {
        (sw.stats("tap0").totals.drops[&switchyard_api::DropReason::TooLong]
            > before.drops[&switchyard_api::DropReason::TooLong])
            .then_some(())
    });
    assert_eq!(sw.stats("tap0").totals.tx_packets, before.tx_packets);
    // A frame that fits still passes.
    ns.sh_ok(&format!("ip link set {tap} mtu 1500"));
    wait_mtu(&sw, "tap0", 1500);
    assert!(ping(&ns, "-s 1400"));
    drop((conn, mem));

    // The interface outlives the switch, stopped or killed, with its MAC
    // (the one the port chose when it was added, kept in its spec) and
    // the host's address; the restarted switch attaches to it again and
    // the host's pings go on without anyone re-resolving it.
    let mac = |o: &str| {
        o.split("link/ether ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_string)
            .unwrap()
    };
    let before = mac(&ns.sh_ok(&format!("ip link show {tap}")));
    assert_eq!(
        sw.port("tap0").spec.kind,
        switchyard_api::KindSpec::Tap(switchyard_api::TapSpec {
            interface_mac: Some(before.parse().unwrap()),
            ..switchyard_api::TapSpec::new(&tap)
        })
    );
    for crash in [false, true] {
        // The pod stops polling while the switch is away: DPDK's memif
        // driver may crash otherwise (see Testpmd::pause).
        pod.pause();
        if crash {
            sw.kill9();
        } else {
            sw.stop();
        }
        let o = ns.sh_ok(&format!("ip addr show {tap}"));
        assert!(o.contains("inet 10.77.0.1/24"), "crash={crash}: {o}");
        assert_eq!(mac(&o), before, "crash={crash}");
        sw.spawn();
        sw.wait_link("tap0", true);
        sw.wait_link("pod", true);
        pod.assert_alive();
        pod.resume();
        assert!(ping(&ns, ""), "no reply after a restart (crash={crash})");
        assert_eq!(mac(&ns.sh_ok(&format!("ip link show {tap}"))), before);
    }

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

#[test]
fn a_namespace_reaches_a_pod_through_an_af_packet_uplink() {
    let _g = serial();
    let t = a_namespace_reaches_a_pod_through("af-packet");
    assert!(t.sw.port("up").status.peer.unwrap().contains("af-packet"));
}

#[test]
fn a_namespace_reaches_a_pod_through_an_af_xdp_uplink() {
    let _g = serial();
    let t = a_namespace_reaches_a_pod_through("af-xdp");
    // The mode chosen is shown: on a veth that is no trunk, generic XDP
    // (native XDP would take the peer's TSO away).
    let peer = t.sw.port("up").status.peer.unwrap();
    assert!(peer.contains("af-xdp, generic (skb) XDP, copy"), "{peer}");
    // While the port owns the interface (made again once by the helper)
    // receive VLAN stripping is off, so tags stay in the data XDP sees;
    // deleting the port puts it back and takes the XDP program off.
    let rxvlan = || {
        t.node
            .sh_ok("ethtool -k up0")
            .lines()
            .find(|l| l.starts_with("rx-vlan-offload:"))
            .map(str::to_string)
            .unwrap()
    };
    assert_eq!(rxvlan(), "rx-vlan-offload: off");
    let link = t.node.sh_ok("ip link show up0");
    assert!(
        link.contains("xdpgeneric"),
        "an XDP program is attached: {link}"
    );
    t.sw.cli_ok(&["port", "del", "up"]);
    let link = t.node.sh_ok("ip link show up0");
    assert!(!link.contains("xdp"), "{link}");
    assert_eq!(rxvlan(), "rx-vlan-offload: on");

    // A mode asked for: zero-copy, which veth has not, is refused by name;
    // native XDP in copy mode, which veth has, is taken.
    let o = t.sw.cli(&[
        "port",
        "add",
        "up",
        "--kind",
        "af-xdp",
        "--interface",
        "up0",
        "--mode",
        "native-with-zerocopy",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("port.interface: up0: Operation not supported"),
        "{err}"
    );
    t.sw.add_port(&[
        "up",
        "--kind",
        "af-xdp",
        "--interface",
        "up0",
        "--mode",
        "native",
    ]);
    let peer = t.sw.port("up").status.peer.unwrap();
    assert!(peer.contains("native XDP, copy"), "{peer}");
    let link = t.node.sh_ok("ip link show up0");
    assert!(
        link.contains("xdp") && !link.contains("xdpgeneric"),
        "{link}"
    );
    assert!(ping(&t.host, ""), "no reply through a native-mode uplink");
}

/// A switch in namespace `node` with a pod and an uplink "up" on a veth
/// to namespace `host`.
struct UplinkSetup {
    _pod: Testpmd,
    sw: Switch,
    node: Netns,
    host: Netns,
}

/// The kernel's ping from a namespace reaches an echoing pod through an
/// uplink of `kind` on a veth; the interface goes away and comes back; a
/// missing interface is refused. Returns the switch, its uplink "up" up.
fn a_namespace_reaches_a_pod_through(kind: &str) -> UplinkSetup {
    let (node, host) = (Netns::new("afn"), Netns::new("afh"));
    veth(&node, "up0", &host, "h0");
    host.sh_ok("ip addr add 10.77.0.1/24 dev h0");
    let sw = Switch::start_in(Some(&node.name), BRIDGE);
    let pod_sock = sw.path("pod.sock");
    sw.add_port(&[
        "pod", "--kind", "memif", "--role", "slave", "--socket", &pod_sock,
    ]);
    sw.add_port(&["up", "--kind", kind, "--interface", "up0"]);
    let info = sw.port("up");
    assert!(info.status.link_up, "{info:?}");
    let pod = echo_pod(&pod_sock);
    sw.wait_link("pod", true);
    assert!(ping(&host, ""), "no reply through the {kind} uplink");
    assert!(ping(&host, "-s 1400"), "no reply to 1400-byte pings");
    let st = sw.stats("up");
    assert!(
        st.totals.rx_packets >= 6 && st.totals.tx_packets >= 6,
        "{st:?}"
    );
    assert_eq!(st.mac_limit, 0, "an uplink has no MAC limit by default");

    // The interface goes away: the port goes down; it comes back (a new
    // veth, a new index): the port comes up again by itself.
    node.sh_ok("ip link del up0");
    wait_for(Duration::from_secs(10), "the uplink down", || {
        (!sw.port("up").status.link_up).then_some(())
    });
    assert!(sw
        .port("up")
        .status
        .last_error
        .unwrap()
        .contains("went away"));
    veth(&node, "up0", &host, "h0");
    host.sh_ok("ip addr add 10.77.0.1/24 dev h0");
    sw.wait_link("up", true);
    assert!(ping(&host, ""), "no reply after the interface came back");

    // A missing interface is an error naming the field; nothing else moves.
    let o = sw.cli(&["port", "add", "x", "--kind", kind, "--interface", "nope0"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("port.interface: nope0: no such interface"),
        "{err}"
    );
    assert!(sw.port("up").status.link_up && sw.port("pod").status.link_up);
    UplinkSetup {
        _pod: pod,
        sw,
        node,
        host,
    }
}

/// `tcpdump` on interface `ifname` of `ns`, from the moment it says it
/// listens until [`Tcpdump::lines`].
struct Tcpdump {
    child: std::process::Child,
    file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Tcpdump {
    fn start(ns: &Netns, ifname: &str, filter: &str) -> Tcpdump {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("wire.pcap");
        let mut child = std::process::Command::new("ip")
            .args([
                "netns", "exec", &ns.name, "tcpdump", "-i", ifname, "-nn", "-U",
            ])
            .arg("-w")
            .arg(&file)
            .arg(filter)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tcpdump (Debian: tcpdump)");
        // It says so once its socket is bound and filtering.
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("listening on") {
            line.clear();
            assert!(
                err.read_line(&mut line).unwrap() > 0,
                "tcpdump -i {ifname} ended"
            );
        }
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        Tcpdump {
            child,
            file,
            _dir: dir,
        }
    }

    /// `tcpdump -r -nn -e` of what it saw so far, a line a frame (`-U`
    /// writes each frame as it comes).
    fn read(&self) -> Vec<String> {
        let out = std::process::Command::new("tcpdump")
            .args(["-nn", "-e", "-r"])
            .arg(&self.file)
            .stderr(std::process::Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// What it saw once `enough` says so (the capture reads frames a
    /// moment after they pass), then stops.
    fn lines_once(mut self, what: &str, enough: impl Fn(&[String]) -> bool) -> Vec<String> {
        let lines = wait_for(Duration::from_secs(10), what, || {
            let l = self.read();
            enough(&l).then_some(l)
        });
        terminate(&mut self.child, Duration::from_secs(10));
        lines
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        // A test that failed before reading it: the capture goes too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The MAC address in `ip link show` output.
fn link_mac(o: &str) -> String {
    o.split("link/ether ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_string()
}

/// The switch between the nodes' uplinks, in its own namespace.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tor {
    /// A Linux bridge (no VLAN filtering: this kernel has no
    /// CONFIG_BRIDGE_VLAN_FILTERING, nor 802.1Q sub-interfaces).
    LinuxBridge,
    /// Open vSwitch (userspace datapath), VLAN-aware as a real top-of-rack
    /// switch is: the nodes' ports are trunks of VLANs 100 and 200 only,
    /// and a station of each VLAN sits on an access port (an internal
    /// interface with `tag`), checking the tags the nodes send.
    OpenVswitch,
}

#[test]
fn two_nodes_meet_on_a_linux_bridge_one_network_per_vlan() {
    for kind in ["af-xdp", "af-packet"] {
        two_nodes_meet_on(Tor::LinuxBridge, kind);
    }
}

#[test]
fn two_nodes_meet_on_open_vswitch_trunks_one_network_per_vlan() {
    for kind in ["af-xdp", "af-packet"] {
        two_nodes_meet_on(Tor::OpenVswitch, kind);
    }
}

/// An Open vSwitch of its own (ovsdb-server and ovs-vswitchd, userspace
/// datapath) in namespace `ns`; stopped by PID when dropped.
struct Ovs {
    dir: tempfile::TempDir,
    procs: Vec<std::process::Child>,
}

impl Ovs {
    fn start(ns: &Netns) -> Ovs {
        let dir = tempfile::Builder::new().prefix("sy-ovs").tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let mut ovs = Ovs {
            dir,
            procs: Vec::new(),
        };
        let db = d.join("conf.db");
        let ok = ovs
            .tool("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg("/usr/share/openvswitch/vswitch.ovsschema")
            .status()
            .expect("ovsdb-tool (Debian: openvswitch-switch)");
        assert!(ok.success());
        let sock = d.join("db.sock");
        let log = |n: &str| std::fs::File::create(d.join(n)).unwrap();
        let server = ovs
            .in_ns(ns, "ovsdb-server")
            .arg(&db)
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!("--unixctl={}", d.join("ovsdb.ctl").display()))
            .stderr(log("ovsdb-server.log"))
            .spawn()
            .unwrap();
        ovs.procs.push(server);
        wait_for(Duration::from_secs(10), "ovsdb-server's socket", || {
            sock.exists().then_some(())
        });
        ovs.vsctl(&["--no-wait", "init"]);
        let vswitchd = ovs
            .in_ns(ns, "ovs-vswitchd")
            .arg(format!("unix:{}", sock.display()))
            .arg(format!("--unixctl={}", d.join("vswitchd.ctl").display()))
            .stderr(log("ovs-vswitchd.log"))
            .spawn()
            .unwrap();
        ovs.procs.push(vswitchd);
        ovs
    }

    fn env(&self, c: &mut std::process::Command) {
        for v in ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR", "OVS_SYSCONFDIR"] {
            c.env(v, self.dir.path());
        }
    }

    fn tool(&self, name: &str) -> std::process::Command {
        let mut c = std::process::Command::new(name);
        self.env(&mut c);
        c
    }

    fn in_ns(&self, ns: &Netns, name: &str) -> std::process::Command {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &ns.name, name]);
        self.env(&mut c);
        c
    }

    /// `ovs-vsctl ARGS` (which waits for ovs-vswitchd to apply a change).
    fn vsctl(&self, args: &[&str]) {
        let o = self
            .tool("ovs-vsctl")
            .arg(format!(
                "--db=unix:{}",
                self.dir.path().join("db.sock").display()
            ))
            .arg("--timeout=20")
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "ovs-vsctl {args:?}: {}{}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(self.dir.path().join("ovs-vswitchd.log")).unwrap_or_default()
        );
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            terminate(p, Duration::from_secs(10));
        }
    }
}

/// Two switches, each in its own namespace ("node"), whose physnet uplinks
/// of `kind` meet on `tor` in a third (the top-of-rack switch). The Linux
/// bridge's receive path moves every VLAN tag out of the frame's data into
/// the skb, so the veth to the far node hands it over beside the data: an
/// XDP program sees untagged frames unless the tag is put back (af-xdp
/// without its tag program fails here). Open vSwitch writes the tags back
/// into the data it sends, and checks the ones it receives.
fn two_nodes_meet_on(tor: Tor, kind: &str) {
    let _g = serial();
    let (na, nb, wire) = (Netns::new("na"), Netns::new("nb"), Netns::new("tor"));
    // Only the test's own frames on the wire: no IPv6 chatter from the
    // stations or the bridge's ports.
    for ns in [&na, &nb, &wire] {
        ns.sh_ok("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 net.ipv4.conf.all.arp_ignore=1");
    }
    veth(&na, "up0", &wire, "pa");
    veth(&nb, "up0", &wire, "pb");
    let _ovs = match tor {
        Tor::LinuxBridge => {
            wire.sh_ok("ip link add br0 type bridge && ip link set br0 up");
            wire.sh_ok("ip link set pa master br0 && ip link set pb master br0");
            None
        }
        Tor::OpenVswitch => {
            let ovs = Ovs::start(&wire);
            ovs.vsctl(&[
                "add-br",
                "br0",
                "--",
                "set",
                "bridge",
                "br0",
                "datapath_type=netdev",
            ]);
            for p in ["pa", "pb"] {
                ovs.vsctl(&["add-port", "br0", p, "trunks=100,200"]);
            }
            // The far stations: VLAN 100's at .3 of its subnet, VLAN
            // 200's at .3 of its.
            for (vlan, net) in [("100", 79), ("200", 80)] {
                let st = format!("s{vlan}");
                ovs.vsctl(&[
                    "add-port",
                    "br0",
                    &st,
                    &format!("tag={vlan}"),
                    "--",
                    "set",
                    "interface",
                    &st,
                    "type=internal",
                ]);
                wire.sh_ok(&format!(
                    "ip link set {st} up && ip addr add 10.{net}.0.3/24 dev {st}"
                ));
            }
            wire.sh_ok("ip link set br0 up");
            Some(ovs)
        }
    };
    let what = format!("{kind} via {tor:?}");
    let physnet = format!("[physnets]\nphysnet1 = {{ interface = \"up0\", kind = \"{kind}\" }}\n");
    let (mut swa, swb) = (
        Switch::start_in(Some(&na.name), &physnet),
        Switch::start_in(Some(&nb.name), &physnet),
    );
    for sw in [&swa, &swb] {
        let up = sw.port("uplink-physnet1");
        assert!(up.status.link_up, "{what}: {up:?}");
        assert_eq!(up.spec.kind.options().kind_name(), kind);

        assert_eq!(up.spec.trunk.unwrap().to_string(), "all");
    }
    // On each node, the host's stack on VLAN 100 and on VLAN 200 (taps):
    // 10.79.0.0/24 is VLAN 100's subnet, 10.80.0.0/24 VLAN 200's; node A
    // is .1, node B .2.
    let id = std::process::id() % 10_000;
    let mut taps = Vec::new();
    for (sw, ns, node, host) in [(&swa, &na, "a", 1), (&swb, &nb, "b", 2)] {
        for (vlan, net) in [("100", 79), ("200", 80)] {
            let tap = format!("{node}{vlan}x{id}");
            let port = format!("{node}{vlan}");
            sw.cli_ok(&[
                "port",
                "add",
                &port,
                "--kind",
                "tap",
                "--interface",
                &tap,
                "--vlan",
                vlan,
                "--bridge",
                "physnet1",
            ]);
            ns.sh_ok(&format!(
                "ip link set {tap} up && ip addr add 10.{net}.0.{host}/24 dev {tap}"
            ));
            taps.push((node, vlan, port, tap));
        }
    }
    let tap_of = |node: &str, vlan: &str| {
        taps.iter()
            .find(|t| t.0 == node && t.1 == vlan)
            .map(|t| (t.2.clone(), t.3.clone()))
            .unwrap()
    };
    let mac_of = |node: &str, vlan: &str| {
        let ns = if node == "a" { &na } else { &nb };
        link_mac(&ns.sh_ok(&format!("ip link show {}", tap_of(node, vlan).1)))
    };
    // Node B's stations, watched for the whole exchange: each hears node
    // A's station of its own VLAN and no other (every frame the switch
    // sends them).
    let heard = |vlan: &str| {
        let own = mac_of("b", vlan);
        Tcpdump::start(&nb, &tap_of("b", vlan).1, &format!("not ether src {own}"))
    };
    let (heard100, heard200) = (heard("100"), heard("200"));
    // VLAN 100, watched on the wire at node A's bridge port: node A's
    // station reaches node B's.
    // (Frames from and to node A's VLAN 100 station: the top-of-rack
    // switch's own, an IGMP report now and then, are not the nodes'.)
    let cap = Tcpdump::start(&wire, "pa", &format!("ether host {}", mac_of("a", "100")));
    assert!(
        ping_to(&na, "", "10.79.0.2"),
        "{what}: node A's VLAN 100 does not reach node B's: {}",
        swb.log()
    );
    let lines = cap.lines_once("three echo replies on the wire", |l| {
        l.iter().filter(|l| l.contains("ICMP echo reply")).count() >= 3
    });
    // Every frame on the wire carries tag 100 (tcpdump reads the tag the
    // kernel moved out of the data from its packet socket).
    assert!(lines.len() >= 8, "{what}: {lines:#?}");
    for l in &lines {
        assert!(
            l.contains("ethertype 802.1Q (0x8100), length") && l.contains("vlan 100,"),
            "{what}: not tagged 100 on the wire: {l}"
        );
    }
    for want in [
        "Request who-has 10.79.0.2",
        "Reply 10.79.0.2 is-at",
        "ICMP echo request",
        "ICMP echo reply",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(want)),
            "{what}: no {want} on the wire: {lines:#?}"
        );
    }
    // Frames from the wire keep their VLAN: each node learned the other's
    // station on its uplink in VLAN 100.
    for (sw, far, far_node) in [(&swb, &na, "a"), (&swa, &nb, "b")] {
        let mac = link_mac(&far.sh_ok(&format!("ip link show {}", tap_of(far_node, "100").1)));
        let learned = sw.macs("physnet1");
        assert!(
            learned
                .iter()
                .any(|m| m.mac == mac && m.vlan == 100 && m.port == "uplink-physnet1"),
            "{what}: {mac} not learned on the uplink in VLAN 100: {learned:?}"
        );
    }
    // VLAN 200 likewise.
    assert!(
        ping_to(&na, "", "10.80.0.2"),
        "{what}: node A's VLAN 200 does not reach node B's"
    );
    // A station cannot cross VLANs: node A asks for node B's VLAN 200
    // address on VLAN 100 (a host route through its VLAN 100 tap). Node B
    // answers ARP only on the interface that has the address (arp_ignore),
    // so only a frame that leaked into VLAN 200 could be answered.
    let (_, a100) = tap_of("a", "100");
    na.sh_ok(&format!("ip route add 10.80.0.2/32 dev {a100}"));
    assert!(
        !ping_to(&na, "", "10.80.0.2"),
        "{what}: VLAN 100 reached VLAN 200's station"
    );
    na.sh_ok(&format!(
        "ip route del 10.80.0.2/32 && ip neigh flush dev {a100}"
    ));
    // Open vSwitch's access-port stations answer each node on their own
    // VLAN only: OVS took the nodes' tags as 802.1Q and delivered the
    // frames untagged, as a VLAN sub-interface would.
    if tor == Tor::OpenVswitch {
        for (ns, net) in [(&na, 79), (&na, 80), (&nb, 79), (&nb, 80)] {
            assert!(
                ping_to(ns, "", &format!("10.{net}.0.3")),
                "{what}: no reply from the top-of-rack station at 10.{net}.0.3"
            );
        }
    }

    for (cap, vlan, net) in [(heard100, "100", "79"), (heard200, "200", "80")] {
        // Node A's station of the VLAN, and the top-of-rack one.
        let mut same_vlan = vec![mac_of("a", vlan)];
        if tor == Tor::OpenVswitch {
            same_vlan.push(link_mac(&wire.sh_ok(&format!("ip link show s{vlan}"))));
        }
        let lines = cap.lines_once(
            &format!("node B's VLAN {vlan} station heard 3 pings"),
            |l| {
                l.iter()
                    .filter(|l| {
                        l.contains(&format!("10.{net}.0.1 > 10.{net}.0.2: ICMP echo request"))
                    })
                    .count()
                    >= 3
            },
        );
        for l in &lines {
            let src = l.split_whitespace().nth(1).unwrap_or_default();
            assert!(
                same_vlan.iter().any(|m| m == src),
                "{what}: node B's VLAN {vlan} station heard another VLAN's ({same_vlan:?} are its peers): {l}"
            );
        }
    }

    // Node A's switch dies (kill -9) and comes back: its taps keep their
    // MACs and addresses, and the pings go on with every neighbour entry
    // as it was (node B's for node A's stations is not flushed).
    let (p100, t100) = tap_of("a", "100");
    let mac_before = link_mac(&na.sh_ok(&format!("ip link show {t100}")));
    let neigh = nb.sh_ok("ip neigh show 10.79.0.1");
    assert!(neigh.contains(&mac_before), "{what}: {neigh}");
    swa.kill9();
    let o = na.sh_ok(&format!("ip addr show {t100}"));
    assert!(o.contains("inet 10.79.0.1/24"), "{what}: {o}");
    swa.spawn();
    swa.wait_link(&p100, true);
    swa.wait_link("uplink-physnet1", true);
    assert_eq!(
        link_mac(&na.sh_ok(&format!("ip link show {t100}"))),
        mac_before,
        "{what}"
    );
    for net in [79, 80] {
        assert!(
            ping_to(&na, "", &format!("10.{net}.0.2")),
            "{what}: no reply on 10.{net}.0.0/24 after node A's switch was killed: {}",
            swa.log()
        );
    }
    assert!(
        nb.sh_ok("ip neigh show 10.79.0.1").contains(&mac_before),
        "{what}"
    );
}

#[test]
fn without_cap_net_raw_an_uplink_is_refused_naming_the_field() {
    let _g = serial();
    let ns = Netns::new("nocap");
    ns.sh_ok("ip link add up0 type veth peer name up1 && ip link set up0 up");
    // The daemon without CAP_NET_RAW (root's capabilities are its bounding
    // set after exec).
    let sw = Switch::start_wrapped(
        Some(&ns.name),
        &["setpriv", "--bounding-set", "-net_raw"],
        BRIDGE,
    );
    let sock = sw.path("p.sock");
    sw.add_port(&[
        "p", "--kind", "memif", "--role", "master", "--socket", &sock,
    ]);
    for kind in ["af-packet", "af-xdp"] {
        let err = refused(&sw, kind);
        assert!(
            err.contains("port.interface: up0:") && err.contains("CAP_NET_RAW"),
            "{err}"
        );
    }
    // Nothing else disturbed: the API answers and the other port stays.
    assert_eq!(sw.port("p").spec.name, "p");
    assert!(sw.cli(&["port", "list"]).status.success());
    drop(sw);

    // With CAP_NET_RAW but neither CAP_BPF nor CAP_SYS_ADMIN, no XDP
    // program can be loaded: af-xdp is refused, af-packet works.
    let sw = Switch::start_wrapped(
        Some(&ns.name),
        &["setpriv", "--bounding-set", "-bpf,-sys_admin"],
        BRIDGE,
    );
    let err = refused(&sw, "af-xdp");
    assert!(
        err.contains("port.interface: up0:") && err.contains("CAP_BPF"),
        "{err}"
    );
    sw.add_port(&["up", "--kind", "af-packet", "--interface", "up0"]);
    assert!(sw.port("up").status.link_up);
    drop(sw);

    // CAP_SYS_ADMIN is not needed: the switch loads its own XDP program
    // (CAP_BPF and CAP_NET_ADMIN), as a trunk that keeps VLAN tags.
    let sw = Switch::start_wrapped(
        Some(&ns.name),
        &["setpriv", "--bounding-set", "-sys_admin"],
        BRIDGE,
    );
    sw.add_port(&[
        "up",
        "--kind",
        "af-xdp",
        "--interface",
        "up0",
        "--trunk",
        "all",
    ]);
    let up = sw.port("up");
    assert!(up.status.link_up, "{up:?}");
    let peer = up.status.peer.unwrap_or_default();
    assert!(
        peer.contains("VLAN tags the driver holds put back"),
        "{peer}"
    );
}

/// Adds uplink "up" of `kind` on up0, which must fail: its error.
fn refused(sw: &Switch, kind: &str) -> String {
    let o = sw.cli(&["port", "add", "up", "--kind", kind, "--interface", "up0"]);
    assert!(!o.status.success(), "{kind} refused");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn jumbo_frames_pass_where_the_mtu_allows_and_are_counted_where_not() {
    let _g = serial();
    let (node, host) = (Netns::new("jn"), Netns::new("jh"));
    veth(&node, "up0", &host, "h0");
    node.sh_ok("ip link set up0 mtu 9000");
    host.sh_ok("ip link set h0 mtu 9000 && ip addr add 10.77.0.1/24 dev h0");
    let sw = Switch::start_in(Some(&node.name), BRIDGE);
    sw.add_port(&["up", "--kind", "af-packet", "--interface", "up0"]);
    let tap = format!("sj{}", std::process::id() % 100_000);
    sw.add_port(&["t", "--kind", "tap", "--interface", &tap]);
    node.sh_ok(&format!(
        "ip link set {tap} mtu 9000 up && ip addr add 10.77.0.2/24 dev {tap}"
    ));
    wait_mtu(&sw, "up", 9000);
    wait_mtu(&sw, "t", 9000);
    // Two kernel stacks, an af-packet uplink and a tap between them, all at
    // MTU 9000: 8000-byte pings pass whole.
    assert!(ping(&host, "-s 8000"), "no reply to 8000-byte pings");
    // The tap back at 1500: the 8028-byte frames from the wire are dropped
    // and counted there, never cut.
    node.sh_ok(&format!("ip link set {tap} mtu 1500"));
    wait_mtu(&sw, "t", 1500);
    let before = sw.stats("t").totals.drops[&switchyard_api::DropReason::TooLong];
    assert!(
        !ping(&host, "-s 8000"),
        "8000-byte frames passed a 1500 MTU"
    );
    assert!(sw.stats("t").totals.drops[&switchyard_api::DropReason::TooLong] > before);
    assert!(ping(&host, "-s 1400"), "frames that fit still pass");
}

/// An af-packet port takes its own interface's frames only, from the
/// moment it is made: a packet socket opened for every protocol receives
/// from every interface of the namespace until it is bound, and once took
/// a neighbour interface's frames (learning its MACs on the wrong port).
/// A quiet interface (IPv6 off, no address: its peer sends nothing) is
/// made a port again and again while the namespace's other interface
/// receives UDP at 25,000 frames a second: the port receives nothing and
/// learns nothing. (Before the fix: 25 frames on the first try.)
#[test]
fn an_af_packet_port_never_takes_another_interfaces_frames() {
    let _g = serial();
    let (node, quiet, busy) = (Netns::new("an"), Netns::new("aq"), Netns::new("ab"));
    quiet.sh_ok("sysctl -qw net.ipv6.conf.default.disable_ipv6=1 net.ipv6.conf.all.disable_ipv6=1");
    veth(&node, "q0", &quiet, "e1");
    veth(&node, "f0", &busy, "e2");
    node.sh_ok("ip addr add 10.77.8.1/24 dev f0");
    busy.sh_ok("ip addr add 10.77.8.2/24 dev e2");
    let sw = Switch::start_in(Some(&node.name), BRIDGE);
    let mut server = tcp::Bg::start(
        &node,
        &["iperf3", "-s", "-1", "-B", "10.77.8.1", "-p", "5231"],
    );
    tcp::wait_listening(&node, 5231);
    // Longer than the tries take; killed when they are done (every try
    // checks that the traffic went on through it, and both must still run
    // then).
    let mut client = tcp::Bg::start(
        &busy,
        &[
            "iperf3",
            "-c",
            "10.77.8.1",
            "-p",
            "5231",
            "-u",
            "-b",
            "13M",
            "-l",
            "64",
            "-t",
            "60",
        ],
    );
    let busy_rx = || node.if_counter("f0", "rx_packets");
    let first = busy_rx();
    wait_for(
        Duration::from_secs(10),
        "the other interface's traffic",
        || (busy_rx() > first + 1000).then_some(()),
    );
    let quiet_tx = quiet.if_counter("e1", "tx_packets");
    for i in 0..12 {
        let before = busy_rx();
        sw.add_port(&["q", "--kind", "af-packet", "--interface", "q0"]);
        // Frames the socket took are read within a block's timeout (1 ms).
        std::thread::sleep(Duration::from_millis(50));
        let rx = sw.stats("q").totals.rx_packets;
        assert_eq!(
            rx, 0,
            "port q received {rx} frames of another interface (try {i})"
        );
        // (Deleting the port forgets what it learned: looked at before.)
        let macs = sw.macs("default");
        assert!(macs.is_empty(), "try {i}: {macs:?}");
        sw.cli_ok(&["port", "del", "q"]);
        assert!(busy_rx() > before + 100, "try {i} without the traffic");
    }
    assert_eq!(
        quiet.if_counter("e1", "tx_packets"),
        quiet_tx,
        "the quiet interface's peer sent"
    );
    for (what, p) in [("server", &mut server), ("client", &mut client)] {
        let ended = p.0.try_wait().unwrap();
        assert!(ended.is_none(), "the iperf3 {what} ended early: {ended:?}");
    }
}

#[test]
fn an_uplink_made_at_start_waits_for_its_interface() {
    let _g = serial();
    let (node, peer) = (Netns::new("wn"), Netns::new("wp"));
    // physnet1's interface does not exist yet when the switch starts: its
    // uplink is made anyway, down, and comes up when the interface does.
    let mut sw = Switch::start_in(
        Some(&node.name),
        &format!("{BRIDGE}[physnets]\nphysnet1 = \"up0\"\n"),
    );
    let up = sw.port("uplink-physnet1");
    assert!(!up.status.link_up, "{up:?}");
    let why = up.status.last_error.unwrap_or_default();
    assert!(why.contains("waiting for interface up0"), "{why}");
    veth(&node, "up0", &peer, "p0");
    sw.wait_link("uplink-physnet1", true);

    // A persisted uplink whose interface is gone when the switch restarts
    // is restored the same way (not refused and set aside).
    node.sh_ok(
        "ip link add up1 type veth peer name up2 && ip link set up1 up && ip link set up2 up",
    );
    sw.add_port(&["u1", "--kind", "af-packet", "--interface", "up1"]);
    sw.stop();
    node.sh_ok("ip link del up1");
    sw.spawn();
    let u1 = sw.port("u1");
    assert!(!u1.status.link_up, "{u1:?}");
    node.sh_ok(
        "ip link add up1 type veth peer name up2 && ip link set up1 up && ip link set up2 up",
    );
    sw.wait_link("u1", true);
    sw.assert_alive();
}

/// Prints the length and bytes of the first frame from `argv[2]` (a source
/// MAC) that interface `argv[1]` receives, within 10 s; "ready" once
/// listening.
const FIRST_FRAME_FROM: &str = r#"
import socket, sys, time
# Protocol 0, then ETH_P_ALL at bind: a socket made for ETH_P_ALL takes
# every interface's frames until bound.
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
s.bind((sys.argv[1], 3))
s.settimeout(0.5)
print("ready", flush=True)
src = bytes.fromhex(sys.argv[2].replace(":", ""))
end = time.time() + 10
while time.time() < end:
    try:
        d = s.recv(65536)
    except socket.timeout:
        continue
    if d[6:12] == src:
        print(len(d), d.hex(), flush=True)
        break
"#;

/// A frame shorter than the Ethernet minimum (a 42-byte ARP from a tap or
/// a pod) leaves an uplink padded with zeros to 60 bytes, as a NIC driver
/// pads a short skb, for both uplink kinds.
#[test]
fn short_frames_leave_uplinks_padded() {
    use std::io::BufRead;
    let _g = serial();
    for kind in ["af-packet", "af-xdp"] {
        let (node, host) = (Netns::new("padn"), Netns::new("padh"));
        veth(&node, "up0", &host, "h0");
        let sw = Switch::start_in(Some(&node.name), BRIDGE);
        sw.add_port(&["up", "--kind", kind, "--interface", "up0"]);
        let (conn, mem) = raw_peer(&sw);
        sw.wait_link("up", true);
        let mut cap = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &host.name,
                "python3",
                "-c",
                FIRST_FRAME_FROM,
            ])
            .args(["h0", "02:00:00:00:77:01"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(cap.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        // 42 bytes, the payload 28 bytes of 0xab.
        let f = raw_broadcast(42, 0xab);
        assert!(mem.send(&f));
        line.clear();
        out.read_line(&mut line).unwrap();
        let _ = cap.wait();
        let (len, hex) = line
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("{kind}: nothing from the uplink"));
        assert_eq!(len, "60", "{kind}: {hex}");
        let mut want: String = f.iter().map(|b| format!("{b:02x}")).collect();
        want.push_str(&"00".repeat(18));
        assert_eq!(hex, want, "{kind}");
        drop((conn, mem, sw));
    }
}
