//! The overlay at cluster scale: one real switch and its node agent
//! (`switchyard-vtep-sync`) in a cluster of N nodes of 10 pods each on
//! the shipped overlay NAD, served by the API server stand-in
//! (`vtepsync/tests/support/api_server.rs`, with the shipped RBAC). The
//! other nodes are Node objects whose VTEP addresses lie behind a gateway
//! of the switch's network namespace (what is sent to them is counted on
//! its interface and goes nowhere); their pods are Pod objects with the
//! network-status Multus writes.
//!
//! Measured, per cluster size:
//! - **first sync**: from the agent's start to every other node joined and
//!   its pods installed as stations;
//! - **join**: from a new Node and its pods written to the API to its
//!   tunnel made and its stations installed in the switch (median of 5);
//! - **memory**: the agent's and the switch's resident set (and peak);
//! - **API load in steady state**: requests a minute (watches, the claim's
//!   check);
//! - **one broadcast**: datagrams on the underlay and the switch's CPU time
//!   (above its idle) for a flooded ARP request from a local pod, and the
//!   same for an ARP request for a known pod (answered by the switch).
//!
//! Run as root (network namespaces): `cargo bench -p switchyard-benches
//! --bench overlay_scale [-- 100 1000]`; it builds the release binaries
//! first. Not a test: a timing is a benchmark's (docs/kubernetes.md has the
//! figures).

#[path = "../../vtepsync/tests/support/api_server.rs"]
mod api_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api_server::{ApiServer, NETWORK_ATTACHMENT_DEFINITIONS, PODS};
use serde::Deserialize;
use serde_json::{json, Value};
use switchyard_api::{Client, Request, VtepInfo};

/// Pods a node.
const PODS_PER_NODE: usize = 10;
/// The NAD's namespace and name, as network-status names it.
const NETWORK: &str = "default/switchyard-overlay";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    // `REMOTESxSTATIONS[:TABLE]`: the switch alone, given that many
    // stations behind that many VTEPs (MAC table of TABLE entries).
    let tables: Vec<(usize, usize, Option<usize>)> = args
        .iter()
        .filter_map(|a| {
            let (rs, table) = a
                .split_once(':')
                .map_or((a.as_str(), None), |(x, t)| (x, t.parse().ok()));
            let (r, s) = rs.split_once('x')?;
            Some((r.parse().ok()?, s.parse().ok()?, table))
        })
        .collect();
    let sizes = if sizes.is_empty() && tables.is_empty() {
        vec![100, 1000]
    } else {
        sizes
    };
    let root = workspace();
    let built = Command::new("cargo")
        .args(["build", "--release", "--locked", "--quiet"])
        .args(["-p", "switchyard", "-p", "switchyard-vtep-sync"])
        .current_dir(&root)
        .status()
        .expect("cargo");
    assert!(built.success(), "building the switch and the agent");
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>11} {:>9} {:>10} {:>9}",
        "nodes",
        "stations",
        "first_sync",
        "join_p50",
        "agent_rss",
        "switch_rss",
        "api_req/m",
        "bcast_dgrams",
        "bcast_us",
        "known_dgrams",
        "known_us"
    );
    for &(remotes, per, table) in &tables {
        tables_at(&root, remotes, per, table);
    }
    for n in sizes {
        let f = run(&root, n);
        println!(
            "{:>6} {:>10} {:>9.2}s {:>8.0}ms {:>9.1}MiB {:>9.1}MiB {:>10.1} {:>11.1} {:>9.0} {:>10.2} {:>9.0}",
            n,
            f.stations,
            f.first_sync.as_secs_f64(),
            f.join.as_secs_f64() * 1e3,
            f.agent_rss_kib as f64 / 1024.0,
            f.switch_rss_kib as f64 / 1024.0,
            f.api_per_minute,
            f.broadcast_datagrams,
            f.broadcast_us,
            f.known_datagrams,
            f.known_us
        );
        println!(
            "       ({} stations pinned; peaks: agent {:.1} MiB, switch {:.1} MiB; joins {:?}; tunnel drops during the broadcasts {})",
            f.pinned,
            f.agent_hwm_kib as f64 / 1024.0,
            f.switch_hwm_kib as f64 / 1024.0,
            f.joins,
            f.broadcast_drops
        );
    }
}

/// What one cluster size measured.
struct Figures {
    stations: usize,
    pinned: usize,
    first_sync: Duration,
    join: Duration,
    joins: Vec<Duration>,
    agent_rss_kib: u64,
    agent_hwm_kib: u64,
    switch_rss_kib: u64,
    switch_hwm_kib: u64,
    api_per_minute: f64,
    broadcast_datagrams: f64,
    broadcast_us: f64,
    broadcast_drops: u64,
    known_datagrams: f64,
    known_us: f64,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        sh_ok(&format!("ip netns add {name}"));
        Netns(name.to_string())
    }

    fn sh(&self, cmd: &str) -> String {
        sh_ok(&format!("ip netns exec {} sh -c '{cmd}'", self.0))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sh_ok(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A process started here: killed and reaped on drop, its exit and log
/// checked by [`Proc::stop`].
struct Proc {
    child: Child,
    log: PathBuf,
    name: &'static str,
}

impl Proc {
    /// `cmd` run in network namespace `ns`, its output to `log`.
    fn spawn(name: &'static str, ns: &Netns, cmd: &mut Command, log: PathBuf) -> Proc {
        let argv: Vec<_> = std::iter::once(cmd.get_program().to_owned())
            .chain(cmd.get_args().map(|a| a.to_owned()))
            .collect();
        let envs: Vec<_> = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
            .collect();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.0])
            .args(argv)
            .envs(envs)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc { child, log, name }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then its exit must be clean and its log free of panics.
    fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "{} did not stop", self.name);
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            status.success() && !log.contains("panicked at") && !log.contains(" ERROR "),
            "{} ended {status}:\n{log}",
            self.name
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set and its peak of process `pid`, in KiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user and system) process `pid` has used.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime: fields 14 and 15 of the whole line.
    let ticks = f[11] + f[12];
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

/// The shipped files: switchyard.yaml's documents (RBAC, the ConfigMap's
/// overlays), the overlay NAD.
fn shipped(root: &Path) -> (Vec<Value>, String, Value) {
    let docs = |f: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(root.join(f)).unwrap();
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
            .filter(|v: &Value| !v.is_null())
            .collect()
    };
    let sw = docs("config/kubernetes/switchyard.yaml");
    let cm = sw
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "switchyard-config")
        .expect("the ConfigMap");
    let toml_text = cm["data"]["switchyard.toml"].as_str().unwrap();
    let cfg: toml::Table = toml_text.parse().unwrap();
    // Its overlays and MAC table size (the rest names paths of a node).
    let kept = ["overlays", "mac_table_size"]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), cfg.get(k)?.clone())));
    let overlays = toml::to_string(&toml::Table::from_iter(kept)).unwrap();
    let nad = docs("config/kubernetes/network-attachments.yaml")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "switchyard-overlay")
        .expect("the overlay NAD");
    (sw, overlays, nad)
}

/// Remote node `i`'s name and VTEP address.
fn remote(i: usize) -> (String, String) {
    (
        format!("node-{i}"),
        format!("10.91.{}.{}", i / 250, 1 + i % 250),
    )
}

/// Writes remote node `i` and its pods, as the kubelet and Multus leave
/// them.
fn put_node_and_pods(api: &ApiServer, i: usize) {
    let (name, addr) = remote(i);
    api.put_node(
        &name,
        &[("kubernetes.io/os", "linux")],
        &[("InternalIP", &addr)],
    );
    for p in 0..PODS_PER_NODE {
        let status = json!([
            {"name": "k8s-pod-network", "interface": "eth0", "ips": [format!("10.244.{}.{}", i % 250, p + 2)],
             "mac": format!("0a:58:00:{:02x}:{:02x}:{:02x}", i >> 8, i & 0xff, p), "default": true, "dns": {}},
            {"name": NETWORK, "interface": "net1",
             "ips": [format!("10.{}.{}.{}", 64 + i / 250, i % 250, p + 2), format!("fd66:0:{i:x}::{:x}", p + 2)],
             "mac": format!("02:66:00:{:02x}:{:02x}:{:02x}", i >> 8, i & 0xff, p), "dns": {}}
        ]);
        api.put(
            PODS,
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "namespace": "default",
                    "name": format!("pod-{i}-{p}"),
                    "annotations": {
                        "k8s.v1.cni.cncf.io/networks": "switchyard-overlay",
                        "k8s.v1.cni.cncf.io/network-status": status.to_string(),
                    },
                },
                "spec": {"nodeName": name, "containers": [{"name": "app", "image": "app"}]},
                "status": {"phase": "Running"},
            }),
        );
    }
}

/// The switch's VTEPs of the overlay.
fn vteps(c: &mut Client) -> Vec<VtepInfo> {
    c.ask(&Request::vtep_list())
        .unwrap()
        .into_iter()
        .filter(|v| v.overlay == "overlay")
        .collect()
}

/// Waits (polling every 2 ms) until `done`; panics after `limit`.
fn wait(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The stations whose MACs the switch pinned to their tunnels (the ones
/// it answers for).
fn pinned_stations(c: &mut Client) -> usize {
    c.ask(&Request::mac_list("overlay"))
        .unwrap()
        .iter()
        .filter(|e| e.pinned && e.port.starts_with("overlay-"))
        .count()
}

/// The datagrams the underlay interface sent.
fn underlay_sent(ns: &Netns) -> u64 {
    ns.sh("cat /sys/class/net/ul/statistics/tx_packets")
        .trim()
        .parse()
        .unwrap()
}

/// ARP requests a local pod sends, `count` of them 10 ms apart, for
/// `target` (an address of 10.64.0.0/10).
const ARP_REQUESTS: &str = r#"
import socket, struct, sys, time
count, target = int(sys.argv[1]), sys.argv[2]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # sends only: receives nothing
s.bind(("eth0", 0))
mac = bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":", ""))
arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, socket.inet_aton("10.63.0.1"),
                  b"\0" * 6, socket.inet_aton(target))
for _ in range(count):
    s.send(b"\xff" * 6 + mac + b"\x08\x06" + arp + b"\0" * 18)
    time.sleep(0.01)
"#;

/// `count` ARP requests for `target` from the local pod, 10 ms apart: per
/// request the switch received, the underlay's datagrams and the switch's
/// CPU time above its idle (which includes a woken worker's polling before
/// it sleeps again: compare two such figures); and the frames the tunnels
/// dropped meanwhile.
fn requests_cost(
    ns: &Netns,
    pod: &Netns,
    c: &mut Client,
    switch: u32,
    count: u64,
    target: &str,
) -> (f64, f64, u64) {
    let received = |c: &mut Client| {
        c.ask(&Request::stats(Some("pod0".into())))
            .unwrap()
            .first()
            .map_or(0, |s| s.totals.rx_packets)
    };
    let dropped = |c: &mut Client| -> u64 {
        c.ask(&Request::stats(None))
            .unwrap()
            .iter()
            .filter(|s| s.name.starts_with("overlay-"))
            .map(|s| s.totals.drops.values().sum::<u64>())
            .sum()
    };
    let span = Duration::from_millis(10 * count + 1000);
    // The switch's idle CPU over as long.
    let c0 = cpu(switch);
    std::thread::sleep(span);
    let idle = cpu(switch) - c0;
    let (d0, r0, c0, x0) = (underlay_sent(ns), received(c), cpu(switch), dropped(c));
    let t0 = Instant::now();
    pod.sh(&format!(
        "python3 - {count} {target} <<EOF\n{ARP_REQUESTS}\nEOF"
    ));
    std::thread::sleep(span.saturating_sub(t0.elapsed()));
    let (d1, r1, c1, x1) = (underlay_sent(ns), received(c), cpu(switch), dropped(c));
    let n = (r1 - r0).max(1);
    let busy = (c1 - c0).as_secs_f64() - idle.as_secs_f64();
    (
        (d1 - d0) as f64 / n as f64,
        (busy.max(0.0) * 1e6) / n as f64,
        x1 - x0,
    )
}

/// A node: its network namespace and the underlay's sink, its switch on
/// `config` (the ConfigMap's overlays and MAC table size, and `extra`)
/// with its control socket, in `dir`.
struct Node {
    ns: Netns,
    _sink: Netns,
    switch: Proc,
    control: PathBuf,
}

fn node(root: &Path, dir: &Path, overlays: &str, extra: &str) -> Node {
    let ns = Netns::new(&format!("sy-scale-{}", std::process::id()));
    // The underlay: this node's address; the others' behind a gateway
    // whose MAC is set, on a veth whose other end, in a namespace of its
    // own, takes what is sent to it and answers nothing.
    let sink = Netns::new(&format!("sy-scale-sink-{}", std::process::id()));
    sh_ok(&format!(
        "ip link add ul netns {} type veth peer name sink netns {}",
        ns.0, sink.0
    ));
    sink.sh("ip link set sink up");
    ns.sh(
        "ip link set lo up && ip link set ul up && ip addr add 10.90.0.1/16 dev ul && \
         ip neigh add 10.90.255.254 lladdr 02:00:00:00:00:fe dev ul nud permanent && \
         ip route add 10.91.0.0/16 via 10.90.255.254 dev ul",
    );
    let control = dir.join("control.sock");
    let config = dir.join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\nstate_dir = \"{}\"\nsocket_dir = \"{}\"\n{extra}\n{overlays}",
            control.display(),
            dir.join("state").display(),
            dir.display(),
        ),
    )
    .unwrap();
    let bin = |b: &str| root.join("target/release").join(b);
    let switch = Proc::spawn(
        "switchyard",
        &ns,
        Command::new(bin("switchyard"))
            .args(["run", "--config"])
            .arg(&config),
        dir.join("switch.log"),
    );
    wait(Duration::from_secs(20), "the switch", || {
        let log = std::fs::read_to_string(&switch.log).unwrap_or_default();
        assert!(!log.contains("rror"), "the switch: {log}");
        control.exists()
    });
    Node {
        ns,
        _sink: sink,
        switch,
        control,
    }
}

fn run(root: &Path, nodes: usize) -> Figures {
    let (docs, overlays, nad) = shipped(root);
    let dir = tempfile::tempdir().unwrap();
    let Node {
        ns,
        _sink,
        switch,
        control,
    } = node(root, dir.path(), &overlays, "");
    let mut c = Client::lazy(&control);
    c.set_retry(Duration::from_secs(5));
    let _ = vteps(&mut c);

    let api = ApiServer::start_in(&docs, &ns.0, "10.90.0.1".parse().unwrap());
    api.put(NETWORK_ATTACHMENT_DEFINITIONS, nad);
    api.put_node(
        "node-0",
        &[("kubernetes.io/os", "linux")],
        &[("InternalIP", "10.90.0.1")],
    );
    for i in 1..nodes {
        put_node_and_pods(&api, i);
    }
    let token = api.token_for_node("switchyard-system", "switchyard", "node-0");
    let kubeconfig = dir.path().join("kubeconfig");
    api.kubeconfig(&token, &kubeconfig);
    let bin = |b: &str| root.join("target/release").join(b);
    let log = dir.path().join("agent.log");
    let started = Instant::now();
    let agent = Proc::spawn(
        "switchyard-vtep-sync",
        &ns,
        Command::new(bin("switchyard-vtep-sync"))
            .arg("--control-socket")
            .arg(&control)
            .args(["--selector", "kubernetes.io/os=linux", "--policy"])
            .env("KUBECONFIG", &kubeconfig)
            .env("NODE_NAME", "node-0")
            .env("POD_NAMESPACE", "switchyard-system")
            .env("RUST_LOG", "info"),
        log,
    );
    let want = (nodes - 1) * PODS_PER_NODE;
    wait(Duration::from_secs(600), "the first sync", || {
        let v = vteps(&mut c);
        v.len() == nodes - 1 && v.iter().map(|v| v.stations).sum::<usize>() == want
    });
    let first_sync = started.elapsed();
    let pinned = pinned_stations(&mut c);

    // Joins: a node and its pods written at once.
    let mut joins = Vec::new();
    for k in 0..5 {
        let i = nodes + k;
        let addr: std::net::IpAddr = remote(i).1.parse().unwrap();
        let t0 = Instant::now();
        put_node_and_pods(&api, i);
        wait(Duration::from_secs(60), "a join", || {
            vteps(&mut c)
                .iter()
                .any(|v| v.remote == addr && v.stations == PODS_PER_NODE)
        });
        joins.push(t0.elapsed());
    }
    let mut sorted = joins.clone();
    sorted.sort();
    let join = sorted[sorted.len() / 2];

    // Steady state: a minute of the API's requests.
    let before = api.requests().len();
    std::thread::sleep(Duration::from_secs(60));
    let api_per_minute = (api.requests().len() - before) as f64;
    let (agent_rss_kib, agent_hwm_kib) = memory(agent.pid());

    // A local pod on the overlay (an af-packet port on a veth).
    let pod = Netns::new(&format!("sy-scale-pod-{}", std::process::id()));
    sh_ok(&format!(
        "ip link add eth0 netns {} type veth peer name pod0 netns {}",
        pod.0, ns.0
    ));
    // No IPv6 on it: its router solicitations and reports would flood to
    // every node in the middle of the figures.
    pod.sh("sysctl -q -w net.ipv6.conf.eth0.disable_ipv6=1 && ip link set eth0 up && ip link set lo up");
    ns.sh("ip link set pod0 up");
    c.ask(&Request::port_add(switchyard_api::PortSpec {
        bridge: Some("overlay".into()),
        ..switchyard_api::PortSpec::new(
            "pod0",
            switchyard_api::KindSpec::AfPacket(switchyard_api::spec::AfPacketSpec::new("pod0")),
        )
    }))
    .unwrap();
    wait(Duration::from_secs(10), "the pod's port", || {
        c.ask(&Request::port_list())
            .unwrap()
            .iter()
            .any(|p| p.spec.name == "pod0" && p.status.link_up)
    });
    let (broadcast_datagrams, broadcast_us, broadcast_drops) =
        requests_cost(&ns, &pod, &mut c, switch.pid(), 100, "10.63.255.254");
    let (known_datagrams, known_us, _) =
        requests_cost(&ns, &pod, &mut c, switch.pid(), 100, "10.64.1.2");
    let (switch_rss_kib, switch_hwm_kib) = memory(switch.pid());
    api.assert_answered_as_upstream();
    agent.stop();
    switch.stop();
    Figures {
        stations: want,
        pinned,
        first_sync,
        join,
        joins,
        agent_rss_kib,
        agent_hwm_kib,
        switch_rss_kib,
        switch_hwm_kib,
        api_per_minute,
        broadcast_datagrams,
        broadcast_us,
        broadcast_drops,
        known_datagrams,
        known_us,
    }
}

/// The switch alone with `remotes` VTEPs of `per` stations each (two
/// addresses a station), given as the agent gives them (`VtepStationSets`
/// of up to 256 VTEPs), its MAC table of `table` entries (else the
/// ConfigMap's): how long the VTEPs and the stations take, the memory
/// they take, how many stations it could pin.
fn tables_at(root: &Path, remotes: usize, per: usize, table: Option<usize>) {
    let (_, overlays, _) = shipped(root);
    let dir = tempfile::tempdir().unwrap();
    let extra = table.map_or(String::new(), |t| format!("mac_table_size = {t}"));
    let n = node(root, dir.path(), &overlays, &extra);
    let mut c = Client::lazy(&n.control);
    c.set_retry(Duration::from_secs(5));
    let (base, _) = memory(n.switch.pid());
    let addrs: Vec<std::net::IpAddr> = (1..=remotes)
        .map(|i| remote(i).1.parse().unwrap())
        .collect();
    let t0 = Instant::now();
    for a in &addrs {
        c.ask(&Request::vtep_add("overlay", *a, None)).unwrap();
    }
    let joined = t0.elapsed();
    let (with_vteps, _) = memory(n.switch.pid());
    let station = |i: usize, p: usize| switchyard_api::RemoteStation {
        mac: format!(
            "02:66:{:02x}:{:02x}:{:02x}:{:02x}",
            i >> 8,
            i & 0xff,
            p >> 8,
            p & 0xff
        )
        .parse()
        .unwrap(),
        vlan: None,
        ips: vec![
            format!("10.{}.{}.{}", 64 + i / 250, i % 250, p % 250 + 2)
                .parse()
                .unwrap(),
            format!("fd66:0:{i:x}::{:x}", p + 2).parse().unwrap(),
        ],
    };
    let t0 = Instant::now();
    for (c_i, chunk) in addrs.chunks(256).enumerate() {
        let sets = chunk
            .iter()
            .enumerate()
            .map(|(k, a)| {
                // Remote i's address (from 1).
                let i = c_i * 256 + k + 1;
                switchyard_api::StationSet {
                    remote: *a,
                    stations: (0..per).map(|p| station(i, p)).collect(),
                }
            })
            .collect();
        c.ask(&Request::vtep_station_sets("overlay", sets)).unwrap();
    }
    let installed = t0.elapsed();
    // One more VTEP's stations changed, the others' as they are.
    let t0 = Instant::now();
    c.ask(&Request::vtep_stations(
        "overlay",
        addrs[0],
        (0..per).map(|p| station(1, p + 1)).collect(),
    ))
    .unwrap();
    let one = t0.elapsed();
    let (with_stations, _) = memory(n.switch.pid());
    let pinned = pinned_stations(&mut c);
    let stations = remotes * per;
    println!(
        "switch alone: {remotes} VTEPs in {:.2}s ({:.1} KiB each), {stations} stations in {:.2}s ({:.0} bytes each, {pinned} pinned), one VTEP's {per} changed in {:.1}ms; table {}",
        joined.as_secs_f64(),
        (with_vteps.saturating_sub(base)) as f64 / remotes as f64,
        installed.as_secs_f64(),
        (with_stations.saturating_sub(with_vteps)) as f64 * 1024.0 / stations as f64,
        one.as_secs_f64() * 1e3,
        table.map_or("the ConfigMap's".to_string(), |t| t.to_string()),
    );
    n.switch.stop();
}
