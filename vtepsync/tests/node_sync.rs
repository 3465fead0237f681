//! Two nodes joined by the Nodes of the cluster: two switches (the
//! overlays of the shipped ConfigMap) in two network namespaces with a
//! router between, each with `switchyard-vtep-sync` beside it run as the
//! shipped DaemonSet runs it (in its node's namespace), watching the API
//! server stand-in on the router (`support/api_server.rs`: upstream's list,
//! watch and status patch, the shipped RBAC). Pods on the overlay reach
//! each other once the nodes are in the API; a node that comes, changes its
//! address, stops matching the selector or goes is followed; a watch too
//! old to resume (410) is relisted; a switch that was down is filled when
//! it is back. Nodes with several addresses, and a dual-stack one, publish
//! their VTEP addresses and tunnel from them.

#[path = "support/api_server.rs"]
mod api_server;
#[path = "../../dataplane/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use api_server::ApiServer;
use common::tcp::Station;
use common::*;
use serde::Deserialize;

const LIMIT: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn documents(rel: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo().join(rel)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .map(|v| serde_json::to_value(v).unwrap())
        .collect()
}

fn find<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name}"))
}

/// The running `switchyard-vtep-sync` of a node, killed on drop (`ip
/// netns exec` execs it: the child is the program).
struct Sync(Child, PathBuf);

impl Sync {
    /// The shipped container's command for `node`, on `switch`'s control
    /// socket, with the API server's kubeconfig (in a pod: its
    /// kube-api-access volume; the whole_node test runs it so).
    fn start(
        shipped: &Shipped,
        node: &str,
        netns: &Netns,
        switch: &Switch,
        api: &ApiServer,
        token: &str,
    ) -> Sync {
        let container = &shipped.container;
        let mut argv: Vec<String> = container["command"]
            .as_array()
            .unwrap()
            .iter()
            .chain(container["args"].as_array().into_iter().flatten())
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let at = argv
            .iter()
            .position(|a| a == "--control-socket")
            .expect("the container names the control socket");
        argv[at + 1] = switch.control().display().to_string();
        let kubeconfig = switch.dir.path().join("kubeconfig");
        api.kubeconfig(token, &kubeconfig);
        let log = switch.dir.path().join("vtep-sync.log");
        let bin = workspace_bin("switchyard-vtep-sync", &argv[0]);
        // In the node's network namespace, as the DaemonSet's pod
        // (hostNetwork) runs it.
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &netns.name])
            .arg(bin)
            .args(&argv[1..])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for e in container["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap();
            let field = &e["valueFrom"]["fieldRef"]["fieldPath"];
            if field == "spec.nodeName" {
                cmd.env(name, node);
            } else if field == "metadata.namespace" {
                cmd.env(name, &shipped.namespace);
            } else if let Some(v) = e["value"].as_str() {
                cmd.env(name, v);
            }
        }
        Sync(cmd.spawn().unwrap(), log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

impl Drop for Sync {
    /// Stops it as the kubelet does (SIGTERM); one that ended badly, or
    /// logged a panic or an error, fails the test.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- vtep-sync ----\n{}", self.log());
        }
        let ending = terminate(&mut self.0, Duration::from_secs(10));
        // The tests take the API server down on purpose (503 to every
        // request): the client library logs each refused request.
        let expected = ["failed with status 503 Service Unavailable".to_string()];
        check_ending("vtep-sync", ending, &self.log(), &expected);
    }
}

fn wait_vteps(sw: &Switch, overlay: &str, want: &[&str], what: &str) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|r| (overlay.to_string(), r.to_string()))
        .collect();
    wait_for(LIMIT, what, || (vteps(&sw.control()) == want).then_some(()));
}

/// What the shipped manifests say: the DaemonSet's vtep-sync container,
/// the labels of the nodes it runs on and the ConfigMap's overlay.
struct Shipped {
    docs: Vec<serde_json::Value>,
    /// The vtep-sync container.
    container: serde_json::Value,
    /// The DaemonSet's nodeSelector.
    selected: Vec<(String, String)>,
    /// The overlay's name.
    overlay: String,
    /// A switch config with the ConfigMap's overlays alone.
    overlay_cfg: String,
    /// The DaemonSet's namespace and service account.
    namespace: String,
    account: String,
}

impl Shipped {
    fn read() -> Shipped {
        let docs = documents("config/kubernetes/switchyard.yaml");
        let ds = find(&docs, "DaemonSet", "switchyard");
        let spec = &ds["spec"]["template"]["spec"];
        let container = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "vtep-sync")
            .expect("the DaemonSet's vtep-sync container")
            .clone();
        // The nodes the DaemonSet runs on are the nodes the container selects.
        let cmd: Vec<&str> = container["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let selector = cmd[cmd.iter().position(|a| *a == "--selector").unwrap() + 1];
        let selected: Vec<(String, String)> = spec["nodeSelector"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let node_selector: Vec<String> = selected.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(selector, node_selector.join(","));

        // The overlays of the shipped ConfigMap.
        let cfg: toml::Value = toml::from_str(
            find(&docs, "ConfigMap", "switchyard-config")["data"]["switchyard.toml"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let overlays = cfg["overlays"].as_table().unwrap();
        assert_eq!(overlays.len(), 1, "{overlays:?}");
        let overlay = overlays.keys().next().unwrap().clone();
        let mut only = toml::Table::new();
        only.insert("overlays".into(), cfg["overlays"].clone());
        let overlay_cfg = toml::to_string(&only).unwrap();
        let namespace = ds["metadata"]["namespace"].as_str().unwrap().to_string();
        let account = spec["serviceAccountName"].as_str().unwrap().to_string();
        Shipped {
            container,
            selected,
            overlay,
            overlay_cfg,
            namespace,
            account,
            docs,
        }
    }

    fn selected(&self) -> Vec<(&str, &str)> {
        self.selected
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

#[test]
fn nodes_of_the_cluster_join_the_overlays() {
    let _g = serial();
    let shipped = Shipped::read();
    let selected = shipped.selected();
    let overlay = shipped.overlay.clone();
    let overlay_cfg = shipped.overlay_cfg.clone();
    let docs = &shipped.docs;

    // The underlay: node i at 10.81.i.2, a router between.
    let u = Underlay::new(2);
    let nodes = &u.vteps;
    let mut sws: Vec<Switch> = nodes
        .iter()
        .map(|ns| Switch::start_in(Some(&ns.name), &overlay_cfg))
        .collect();
    // A pod on the overlay on each node.
    let pods: Vec<Station> = sws
        .iter()
        .zip(nodes)
        .enumerate()
        .map(|(i, (sw, ns))| {
            let pod = Station::on_overlay(i as u8 + 1, Some(ns), "pod");
            sw.add_af_packet("pod", &overlay, &[]);
            pod
        })
        .collect();

    // The API server where the nodes reach it: on the router.
    let api = ApiServer::start_in(docs, &u.router.name, "10.81.1.1".parse().unwrap());
    let token = |node: &str| api.token_for_node(&shipped.namespace, &shipped.account, node);
    api.put_node("node-1", &selected, &[("InternalIP", "10.81.1.2")]);
    api.put_node(
        "windows-1",
        &[("kubernetes.io/os", "windows")],
        &[("InternalIP", "10.81.9.1")],
    );
    let syncs: Vec<Sync> = sws
        .iter()
        .enumerate()
        .map(|(i, sw)| {
            Sync::start(
                &shipped,
                &format!("node-{}", i + 1),
                &nodes[i],
                sw,
                &api,
                &token(&format!("node-{}", i + 1)),
            )
        })
        .collect();
    // Node 1 alone: nothing to join; node 2 is not in the cluster yet.
    wait_for(LIMIT, "both syncs listed", || {
        syncs
            .iter()
            .all(|s| s.log().contains("listed the nodes"))
            .then_some(())
    });
    assert!(vteps(&sws[0].control()).is_empty());
    assert!(!pods[0]
        .ns
        .sh("busybox ping -c 1 -i 0.2 -W 1 10.66.0.2")
        .status
        .success());

    // Node 2 joins the cluster: each switch joins the other.
    api.put_node(
        "node-2",
        &selected,
        &[("Hostname", "node-2"), ("InternalIP", "10.81.2.2")],
    );
    wait_vteps(&sws[0], &overlay, &["10.81.2.2"], "node 1 joined to node 2");
    wait_vteps(&sws[1], &overlay, &["10.81.1.2"], "node 2 joined to node 1");
    pods[0].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.2");

    // A third node comes, moves to another address, stops matching the
    // selector, matches again.
    api.put_node("node-3", &selected, &[("InternalIP", "10.81.3.2")]);
    wait_vteps(
        &sws[0],
        &overlay,
        &["10.81.2.2", "10.81.3.2"],
        "node 3 joined",
    );
    api.put_node("node-3", &selected, &[("InternalIP", "10.81.3.3")]);
    wait_vteps(
        &sws[0],
        &overlay,
        &["10.81.2.2", "10.81.3.3"],
        "node 3's new address",
    );
    api.put_node(
        "node-3",
        &[("kubernetes.io/os", "windows")],
        &[("InternalIP", "10.81.3.3")],
    );
    wait_vteps(
        &sws[0],
        &overlay,
        &["10.81.2.2"],
        "node 3 no longer selected",
    );
    api.put_node("node-3", &selected, &[("InternalIP", "10.81.3.3")]);
    wait_vteps(
        &sws[1],
        &overlay,
        &["10.81.1.2", "10.81.3.3"],
        "node 3 selected again",
    );

    // The API server restarts, and node 3 goes while it is down; the
    // history is compacted past the syncs' resume point: the watch answers
    // 410 Expired and they list again.
    let lists = |r: &[String]| r.iter().filter(|r| *r == "list").count();
    let before = lists(&api.requests());
    api.set_down(true);
    api.delete_node("node-3");
    api.compact();
    std::thread::sleep(Duration::from_secs(1));
    api.set_down(false);
    wait_vteps(
        &sws[0],
        &overlay,
        &["10.81.2.2"],
        "node 3 gone, seen by a relist",
    );
    wait_vteps(
        &sws[1],
        &overlay,
        &["10.81.1.2"],
        "node 3 gone, seen by a relist",
    );
    assert!(lists(&api.requests()) >= before + 2, "{:?}", api.requests());

    // A switch that is down when a node comes is joined once it is back.
    let retries = |log: String| log.matches("will retry").count();
    let retried = retries(syncs[1].log());
    sws[1].stop();
    api.put_node("node-4", &selected, &[("InternalIP", "10.81.4.2")]);
    wait_vteps(
        &sws[0],
        &overlay,
        &["10.81.2.2", "10.81.4.2"],
        "node 4 joined",
    );
    // Down longer than a restart (a sync asks again for 3 s): the sync
    // fails and is tried again later.
    wait_for(LIMIT, "node 2's sync to fail and wait to retry", || {
        (retries(syncs[1].log()) > retried).then_some(())
    });
    sws[1].spawn();
    wait_vteps(
        &sws[1],
        &overlay,
        &["10.81.1.2", "10.81.4.2"],
        "node 4 joined after the restart",
    );

    // Node 2 leaves the cluster: node 1's switch leaves it, and the pods
    // no longer reach each other.
    api.delete_node("node-2");
    wait_vteps(&sws[0], &overlay, &["10.81.4.2"], "node 2 left");
    assert!(!pods[0]
        .ns
        .sh("busybox ping -c 2 -i 0.2 -W 1 10.66.0.2")
        .status
        .success());
    api.assert_only_lists_watches_status_patches_and_leases();
    drop(syncs);
    for sw in &mut sws {
        sw.assert_alive();
    }
}

/// The switch's VTEPs as (remote, local) addresses.
fn vteps_from(sw: &Switch) -> Vec<(String, String)> {
    switchyard_api::Client::connect(&sw.control())
        .unwrap()
        .ask(&switchyard_api::Request::vtep_list())
        .unwrap()
        .into_iter()
        .map(|v| (v.remote.to_string(), v.local.to_string()))
        .collect()
}

/// Node `name`'s annotation `key`.
fn annotation(api: &ApiServer, name: &str, key: &str) -> Option<String> {
    api.node(name)?["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

/// Nodes with several addresses, and a dual-stack one, as clusters have
/// them:
///
/// - node 1 is dual-stack and lists its IPv6 address first; its node
///   addresses are on its loopback interface (as on nodes whose address
///   is routed to them), so its route to node 2 leaves from another address
///   (its link's, 10.81.1.2), which node 2 would not expect;
/// - node 2 has two links to the router; the operator moves its VTEP to
///   the second one (`switchyard.io/vtep-address-overwrite`) while the
///   pods talk, though its default route leaves by the first.
///
/// Each vtep-sync publishes its node's VTEP address
/// (`switchyard.io/vtep-address`), its tunnels leave from that address,
/// the other node joins it there, and the pods on the overlay reach each
/// other both ways at each step. Before, node 1's tunnel left from the
/// route's address and node 2 dropped what it sent.
#[test]
fn nodes_with_several_addresses_and_a_dual_stack_node_tunnel_both_ways() {
    let _g = serial();
    let shipped = Shipped::read();
    let selected = shipped.selected();
    let overlay = &shipped.overlay;
    let u = Underlay::new(2);
    u.router
        .sh_ok("sysctl -q -w net.ipv4.conf.all.rp_filter=0 net.ipv6.conf.all.forwarding=1");
    // Node 1: its addresses on its loopback interface, routed to it.
    u.vteps[0].sh_ok("ip addr add 10.81.101.1/32 dev lo && ip addr add fd81::101:1/128 dev lo");
    u.router.sh_ok("ip route add 10.81.101.1/32 via 10.81.1.2");
    // Node 2: a second link to the router, 10.82.2.2.
    veth(&u.router, "s2", &u.vteps[1], "ul2");
    u.router.sh_ok("ip addr add 10.82.2.1/24 dev s2");
    u.vteps[1].sh_ok("ip addr add 10.82.2.2/24 dev ul2");

    let mut sws: Vec<Switch> = u
        .vteps
        .iter()
        .map(|ns| Switch::start_in(Some(&ns.name), &shipped.overlay_cfg))
        .collect();
    let pods: Vec<Station> = sws
        .iter()
        .zip(&u.vteps)
        .enumerate()
        .map(|(i, (sw, ns))| {
            let pod = Station::on_overlay(i as u8 + 1, Some(ns), "pod");
            sw.add_af_packet("pod", overlay, &[]);
            pod
        })
        .collect();
    let ping_both_ways = || {
        pods[0].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.2");
        pods[1].ns.sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.66.0.1");
    };

    let api = ApiServer::start_in(&shipped.docs, &u.router.name, "10.81.1.1".parse().unwrap());
    let token = |node: &str| api.token_for_node(&shipped.namespace, &shipped.account, node);
    api.put_node(
        "node-1",
        &selected,
        &[
            ("InternalIP", "fd81::101:1"),
            ("InternalIP", "10.81.101.1"),
            ("Hostname", "node-1"),
        ],
    );
    api.put_node("node-2", &selected, &[("InternalIP", "10.81.2.2")]);
    let syncs: Vec<Sync> = sws
        .iter()
        .enumerate()
        .map(|(i, sw)| {
            Sync::start(
                &shipped,
                &format!("node-{}", i + 1),
                &u.vteps[i],
                sw,
                &api,
                &token(&format!("node-{}", i + 1)),
            )
        })
        .collect();
    let vtep = "switchyard.io/vtep-address";
    wait_for(LIMIT, "both nodes published their VTEP", || {
        (annotation(&api, "node-1", vtep).as_deref() == Some("10.81.101.1")
            && annotation(&api, "node-2", vtep).as_deref() == Some("10.81.2.2"))
        .then_some(())
    });
    fn joined<'a>(sw: &'a Switch, want: (&str, &str)) -> impl FnMut() -> Option<()> + 'a {
        let want = vec![(want.0.to_string(), want.1.to_string())];
        move || (vteps_from(sw) == want).then_some(())
    }
    wait_for(
        LIMIT,
        "node 1 joined to node 2 from its node address",
        joined(&sws[0], ("10.81.2.2", "10.81.101.1")),
    );
    wait_for(
        LIMIT,
        "node 2 joined to node 1's IPv4 address",
        joined(&sws[1], ("10.81.101.1", "10.81.2.2")),
    );
    ping_both_ways();

    // The operator moves node 2's VTEP to its second link.
    api.annotate_node(
        "node-2",
        "switchyard.io/vtep-address-overwrite",
        "10.82.2.2",
    );
    wait_for(LIMIT, "node 2 published its new VTEP", || {
        (annotation(&api, "node-2", vtep).as_deref() == Some("10.82.2.2")).then_some(())
    });
    wait_for(
        LIMIT,
        "node 2's tunnel leaves from its second link",
        joined(&sws[1], ("10.81.101.1", "10.82.2.2")),
    );
    wait_for(
        LIMIT,
        "node 1 joined to node 2's new VTEP",
        joined(&sws[0], ("10.82.2.2", "10.81.101.1")),
    );
    ping_both_ways();

    // Each node's vtep-sync patched its own node only (the stand-in knows
    // a token's node, as a bound token says it), once per address, and
    // made no other request.
    let mut patches: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("patch"))
        .collect();
    patches.sort();
    assert_eq!(
        patches,
        [
            "patch status node-1 from node-1",
            "patch status node-2 from node-2",
            "patch status node-2 from node-2",
        ],
    );
    api.assert_only_lists_watches_status_patches_and_leases();
    drop(syncs);
    for sw in &mut sws {
        sw.assert_alive();
    }
}

/// Runs `f` on a thread inside namespace `ns`.
fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
}

/// Whether `from` connects to `to`:`port` over TCP within a second (a
/// listener that accepts is enough).
fn connects(from: &Netns, to: &str, port: u16) -> bool {
    let to: std::net::SocketAddr = format!("{to}:{port}").parse().unwrap();
    in_ns(&from.name, move || {
        std::net::TcpStream::connect_timeout(&to, Duration::from_secs(1)).is_ok()
    })
    .join()
    .unwrap()
}

/// Listeners on `ports` in namespace `ns` that accept (and close) until
/// `stop` is set.
fn listen(
    ns: &Netns,
    ports: &[u16],
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let tcp = ports.iter().map(|&p| {
        let stop = stop.clone();
        in_ns(&ns.name, move || {
            let l = std::net::TcpListener::bind(("0.0.0.0", p)).unwrap();
            l.set_nonblocking(true).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if l.accept().is_err() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        })
    });
    // And UDP echo on the same ports (multi-networkpolicy-iptables' pods
    // serve both).
    let udp = ports.iter().map(|&p| {
        let stop = stop.clone();
        in_ns(&ns.name, move || {
            let s = std::net::UdpSocket::bind(("0.0.0.0", p)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut b = [0u8; 16];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = s.recv_from(&mut b) {
                    let _ = s.send_to(&b[..n], from);
                }
            }
        })
    });
    tcp.chain(udp).collect()
}

/// Pod `pod` (namespace, name) of the e2e suite's model, labelled `pod:
/// NAME` and serving `serve-80-tcp` and `serve-81-tcp`, in the API server
/// with its network-status (`x/net` on net1 at `ip`, after `other` if
/// given), and as a kernel station: a namespace on a veth from `node`
/// whose switch port `port` is made as the CNI makes it (its addresses,
/// its pod attachment). Returns the station's namespace.
fn model_pod(
    node: &Netns,
    sw: &Switch,
    api: &ApiServer,
    (ns, name): (&str, &str),
    port: &str,
    (ip, len): (&str, u8),
    other: Option<serde_json::Value>,
) -> Netns {
    use serde_json::json;
    let netns = Netns::new(&format!("st{ns}{name}"));
    veth(node, port, &netns, "net1");
    netns.sh_ok(&format!(
        "ip addr add {ip}/{len} dev net1 && ip link set lo up"
    ));
    let status: Vec<serde_json::Value> = other
        .into_iter()
        .chain([json!({"name": "x/net", "interface": "net1", "ips": [ip]})])
        .collect();
    // The pod, then its port as the CNI makes it (with the pod's UID, as
    // the runtime passes it), then its network-status as Multus writes it.
    let pod = json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"pod": name}},
        "spec": {"containers": [{"name": "c", "image": "agnhost", "ports": [
            {"name": "serve-80-tcp", "containerPort": 80, "protocol": "TCP"},
            {"name": "serve-81-tcp", "containerPort": 81, "protocol": "TCP"}]}]},
        "status": {"phase": "Running"},
    });
    let mut pod = api.put(api_server::PODS, pod);
    add_pod_port(sw, port, ip, &pod);
    pod["metadata"]["annotations"] =
        json!({"k8s.v1.cni.cncf.io/network-status": json!(status).to_string()});
    api.put(api_server::PODS, pod);
    netns
}

/// What the policy tests run on: the shipped files, a node's namespace,
/// the API server stand-in (serving the shipped RBAC) in it, the token of
/// the DaemonSet's service account, and a switch with one bridge.
struct PolicyNode {
    shipped: Shipped,
    node: Netns,
    api: ApiServer,
    token: String,
    sw: Switch,
}

impl PolicyNode {
    fn new(name: &str) -> PolicyNode {
        let shipped = Shipped::read();
        let node = Netns::new(name);
        node.sh_ok("ip link set lo up");
        let api = ApiServer::start_in(&shipped.docs, &node.name, "127.0.0.1".parse().unwrap());
        let token = api.token_for(&shipped.namespace, &shipped.account);
        let sw = Switch::start_in(Some(&node.name), "[[bridge]]\nname = \"default\"\n");
        PolicyNode {
            shipped,
            node,
            api,
            token,
            sw,
        }
    }
}

/// Adds port `port` (af-packet on the interface of its name, address
/// `ip`) for stored pod `pod`'s `net1` on network `net`, as the CNI does.
fn add_pod_port(sw: &Switch, port: &str, ip: &str, pod: &serde_json::Value) {
    let m = &pod["metadata"];
    let spec: switchyard_api::PortSpec = serde_json::from_value(serde_json::json!({
        "name": port, "kind": "af-packet", "interface": port, "bridge": "default",
        "ips": [ip],
        "pod": {"namespace": m["namespace"], "name": m["name"], "uid": m["uid"],
                "interface": "net1", "network": "net"},
    }))
    .unwrap();
    sw.client()
        .ask(&switchyard_api::Request::port_add(spec))
        .unwrap();
}

/// MultiNetworkPolicy end to end: three pods of namespace x (kernel
/// stations on af-packet ports that name their pod attachments, as the
/// CNI makes them), vtep-sync run as the shipped DaemonSet runs it
/// (`--policy`) with the shipped RBAC, the policy, pods and namespaces in
/// the API server stand-in. A policy selecting b lets a reach b's named
/// port alone; a pod relabelled into the peers, a policy changed, a
/// policy deleted are followed; the node itself, on a tap port, is let in
/// by an ipBlock.
#[test]
fn multi_network_policy_reaches_the_ports_through_the_agent() {
    use api_server::{MULTI_NETWORK_POLICIES, NAMESPACES, PODS};
    use serde_json::json;
    let _g = serial();
    let PolicyNode {
        shipped,
        node,
        api,
        token,
        sw,
    } = PolicyNode::new("mnp");
    assert!(
        shipped.container["command"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--policy"),
        "the DaemonSet's vtep-sync enforces policy"
    );
    let mut stations = Vec::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut listeners = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let ip = format!("10.79.0.{}", i + 1);
        let cluster = json!({"name": "cluster", "interface": "eth0",
            "ips": [format!("10.244.0.{}", i + 1)], "default": true});
        let ns = model_pod(
            &node,
            &sw,
            &api,
            ("x", name),
            &format!("p{name}"),
            (&ip, 24),
            Some(cluster),
        );
        // Listeners on 80 and 81, as the e2e suite's agnhost serves.
        listeners.extend(listen(&ns, &[80, 81], &stop));
        stations.push((ns, ip));
    }
    api.put(
        NAMESPACES,
        json!({"metadata": {"name": "x", "labels": {"kubernetes.io/metadata.name": "x"}}}),
    );
    for s in ["pa", "pb", "pc"] {
        sw.wait_link(s, true);
    }
    let (a, b, c) = (&stations[0], &stations[1], &stations[2]);
    let sync = Sync::start(&shipped, "node-1", &node, &sw, &api, &token);
    wait_for(LIMIT, "a reaching b", || {
        connects(&a.0, &b.1, 80).then_some(())
    });

    // b's ingress from pods labelled pod=a, on its named port serve-80-tcp.
    let policy = |from: &str| {
        json!({
            "metadata": {"namespace": "x", "name": "web",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": "net"}},
            "spec": {"podSelector": {"matchLabels": {"pod": "b"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": from}}}],
                             "ports": [{"port": "serve-80-tcp"}]}]},
        })
    };
    api.put(MULTI_NETWORK_POLICIES, policy("a"));
    let isolated = || sw.port("pb").spec.policy.is_some().then_some(());
    wait_for(LIMIT, "b's policy from the agent", isolated);
    assert!(connects(&a.0, &b.1, 80), "a to b's serve-80-tcp");
    assert!(!connects(&a.0, &b.1, 81), "a to b:81, no rule");
    assert!(!connects(&c.0, &b.1, 80), "c, not a peer");
    assert!(connects(&c.0, &a.1, 81), "a is not isolated");

    // c relabelled pod=a: a peer now, from the watch of pods.
    let mut pod_c = api.objects(PODS, "x/c").unwrap();
    pod_c["metadata"]["labels"]["pod"] = json!("a");
    api.put(PODS, pod_c);
    wait_for(LIMIT, "c let in after its relabelling", || {
        connects(&c.0, &b.1, 80).then_some(())
    });
    // b's network-status gone from its pod (rewritten, say): its port
    // keeps the policy it was given, the last thing known. (A pass
    // follows a change within SETTLE, 100 ms.)
    let pod_b = api.objects(PODS, "x/b").unwrap();
    let mut bare = pod_b.clone();
    bare["metadata"]["annotations"] = json!({});
    api.put(PODS, bare);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        isolated().is_some(),
        "b's policy dropped with its network-status"
    );
    // Another pod named b (another UID) that no policy selects: pb is the
    // first one's port, and keeps its policy.
    api.delete(PODS, "x/b");
    let mut other = pod_b.clone();
    other["metadata"]["uid"] = json!(null);
    other["metadata"]["labels"]["pod"] = json!("other");
    let other = api.put(PODS, other);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        isolated().is_some(),
        "the new b's policy given to the old b's port"
    );
    // The new b labelled pod=b, then its port made (the old one's taken
    // away first, as a CNI DEL would): with no event after it, the port
    // gets the policy from the agent's look at the ports.
    let mut new_b = other.clone();
    new_b["metadata"]["labels"]["pod"] = json!("b");
    api.put(PODS, new_b.clone());
    sw.cli_ok(&["port", "del", "pb"]);
    add_pod_port(&sw, "pb", &b.1, &new_b);
    sw.wait_link("pb", true);
    wait_for(LIMIT, "the re-made pb's policy", isolated);
    assert!(connects(&a.0, &b.1, 80) && !connects(&c.0, &b.1, 81));

    // The policy changed to peers labelled pod=nobody: a's new
    // connections are refused.
    api.put(MULTI_NETWORK_POLICIES, policy("nobody"));
    wait_for(LIMIT, "a refused after the change", || {
        (!connects(&a.0, &b.1, 80)).then_some(())
    });
    // Deleted: b is open again.
    api.delete(MULTI_NETWORK_POLICIES, "x/web");
    wait_for(LIMIT, "b open again", || {
        sw.port("pb").spec.policy.is_none().then_some(())
    });
    assert!(connects(&a.0, &b.1, 81) && connects(&c.0, &b.1, 80));

    // The node itself as a station, on a tap port (its own stack, in the
    // switch's namespace): b takes port 80 from the node's address alone,
    // an ipBlock, and no longer from a.
    let tap = format!("syt{}", std::process::id() % 100_000);
    sw.add_port(&["host", "--kind", "tap", "--interface", &tap]);
    node.sh_ok(&format!(
        "ip link set {tap} up && ip addr add 10.79.0.9/24 dev {tap}"
    ));
    sw.wait_link("host", true);
    api.put(
        MULTI_NETWORK_POLICIES,
        json!({
            "metadata": {"namespace": "x", "name": "from-node",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": "net"}},
            "spec": {"podSelector": {"matchLabels": {"pod": "b"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.79.0.9/32"}}],
                             "ports": [{"port": 80}]}]},
        }),
    );
    wait_for(LIMIT, "b's policy from the node's address", isolated);
    wait_for(LIMIT, "the node reaching b over its tap port", || {
        connects(&node, &b.1, 80).then_some(())
    });
    assert!(!connects(&a.0, &b.1, 80), "a, not the node's address");
    assert!(!connects(&node, &b.1, 81), "the node to b:81, no rule");
    api.delete(MULTI_NETWORK_POLICIES, "x/from-node");
    // (The port's deletion deletes its persistent tap.)
    sw.cli_ok(&["port", "del", "host"]);
    api.assert_only_lists_watches_status_patches_and_leases();
    let log = sync.log();
    assert!(log.contains("watching MultiNetworkPolicies"), "{log}");
    drop(sync);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in listeners {
        l.join().unwrap();
    }
}

/// A DPDK testpmd pod answering ARP and ping (`icmpecho`), as a pod of
/// namespace x named `name` with address `ip` on network x/net: the pod
/// in the API, its port as the CNI makes it (memif, the switch master;
/// or vhost-user, the switch the socket server), testpmd attached, then
/// its network-status.
fn testpmd_pod(sw: &Switch, api: &ApiServer, name: &str, vhost: bool, ip: &str) -> Testpmd {
    use serde_json::json;
    let pod = api.put(
        api_server::PODS,
        json!({"metadata": {"namespace": "x", "name": name, "labels": {"pod": name}},
               "spec": {"containers": [{"name": "c", "image": "dpdk"}]},
               "status": {"phase": "Running"}}),
    );
    let sock = sw.path(&format!("{name}.sock"));
    let (kind, role) = if vhost {
        ("vhost-user", "server")
    } else {
        ("memif", "master")
    };
    let m = &pod["metadata"];
    let spec: switchyard_api::PortSpec = serde_json::from_value(json!({
        "name": format!("p{name}"), "kind": kind, "role": role, "socket": sock,
        "bridge": "default", "ips": [ip],
        "pod": {"namespace": "x", "name": name, "uid": m["uid"], "interface": "net1",
                "network": "net"},
    }))
    .unwrap();
    sw.client()
        .ask(&switchyard_api::Request::port_add(spec))
        .unwrap();
    let vdev = if vhost {
        virtio_vdev(0, &sock, false, "")
    } else {
        memif_vdev(0, "client", &sock, "")
    };
    let mut p = Testpmd::start(&[vdev], &["--forward-mode=icmpecho"]);
    p.cmd("start");
    sw.wait_link(&format!("p{name}"), true);
    let mut pod = pod;
    let status = json!([{"name": "x/net", "interface": "net1", "ips": [ip]}]);
    pod["metadata"]["annotations"] =
        json!({"k8s.v1.cni.cncf.io/network-status": status.to_string()});
    api.put(api_server::PODS, pod);
    p
}

/// Whether `from` gets answers to pings of `to`.
fn pings(from: &Netns, to: &str) -> bool {
    from.sh(&format!("busybox ping -c 2 -i 0.2 -W 1 {to}"))
        .status
        .success()
}

/// MultiNetworkPolicy on DPDK pods: testpmd pods on a memif and a
/// vhost-user port, selected by a policy that lets pods labelled pod=a
/// in (every protocol: its rule has no ports), probed with ping from
/// kernel stations (a allowed, c not), the policy delivered by the agent
/// as shipped.
#[test]
fn testpmd_pods_on_memif_and_vhost_user_ports_follow_multi_network_policy() {
    use api_server::{MULTI_NETWORK_POLICIES, NAMESPACES};
    use serde_json::json;
    let _g = serial();
    let PolicyNode {
        shipped,
        node,
        api,
        token,
        sw,
    } = PolicyNode::new("dpp");
    api.put(
        NAMESPACES,
        json!({"metadata": {"name": "x", "labels": {"kubernetes.io/metadata.name": "x"}}}),
    );
    let a = model_pod(&node, &sw, &api, ("x", "a"), "pa", ("10.81.0.1", 24), None);
    let c = model_pod(&node, &sw, &api, ("x", "c"), "pc", ("10.81.0.3", 24), None);
    let mut d = testpmd_pod(&sw, &api, "d", false, "10.81.0.4");
    let mut e = testpmd_pod(&sw, &api, "e", true, "10.81.0.5");
    let sync = Sync::start(&shipped, "node-1", &node, &sw, &api, &token);
    for to in ["10.81.0.4", "10.81.0.5"] {
        wait_for(LIMIT, "c pinging a testpmd pod", || {
            pings(&c, to).then_some(())
        });
    }
    api.put(
        MULTI_NETWORK_POLICIES,
        json!({
            "metadata": {"namespace": "x", "name": "dpdk",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": "net"}},
            "spec": {"podSelector": {"matchExpressions": [
                        {"key": "pod", "operator": "In", "values": ["d", "e"]}]},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}]}]},
        }),
    );
    for port in ["pd", "pe"] {
        wait_for(LIMIT, "the testpmd pods' policy", || {
            sw.port(port).spec.policy.is_some().then_some(())
        });
    }
    for to in ["10.81.0.4", "10.81.0.5"] {
        assert!(pings(&a, to), "a, a peer, to {to}");
        assert!(!pings(&c, to), "c, not a peer, to {to}");
    }
    for port in ["pd", "pe"] {
        assert!(sw.drops(port, switchyard_api::DropReason::PolicyIngress) >= 1);
    }
    d.cmd("stop");
    e.cmd("stop");
    drop(sync);
    drop((d, e));
}

/// A probe of the conformance matrix: a TCP connection or a UDP datagram
/// echoed, to a port.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Probe {
    Tcp(u16),
    Udp(u16),
}

/// A pod of the conformance model: namespace, name, address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct ModelPod {
    ns: &'static str,
    pod: &'static str,
}

/// The upstream NetworkPolicy e2e suite's cases (kubernetes
/// `test/e2e/network/netpol/network_policy.go`, its model in `model.go`:
/// namespaces x, y, z labelled `kubernetes.io/metadata.name`, pods a, b, c
/// in each labelled `pod`, serving TCP 80 and 81 as `serve-80-tcp` and
/// `serve-81-tcp`), as MultiNetworkPolicies for the one network every pod
/// is on, delivered by the agent, each checked as the full matrix of TCP
/// probes from every pod to every other, retried until it matches (as the
/// suite's probes are); then multi-networkpolicy-iptables' own e2e cases
/// of ports and protocols, with UDP probes beside the TCP ones. Each case:
/// its name, its policies, and per probe whether `from` reaches `to`.
#[test]
fn netpol_conformance_cases_through_the_agent() {
    use api_server::{MULTI_NETWORK_POLICIES, NAMESPACES};
    use serde_json::{json, Value};
    let _g = serial();
    let PolicyNode {
        shipped,
        node,
        api,
        token,
        sw,
    } = PolicyNode::new("npc");
    let nss = ["x", "y", "z"];
    let names = ["a", "b", "c"];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut listeners = Vec::new();
    let mut pods: Vec<(ModelPod, Netns, String)> = Vec::new();
    for (ni, ns) in nss.iter().enumerate() {
        api.put(
            NAMESPACES,
            json!({"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}),
        );
        for (pi, name) in names.iter().enumerate() {
            let ip = format!("10.80.{}.{}", ni + 1, pi + 1);
            let netns = model_pod(
                &node,
                &sw,
                &api,
                (ns, name),
                &format!("p{ns}{name}"),
                (&ip, 16),
                None,
            );
            listeners.extend(listen(&netns, &[80, 81], &stop));
            pods.push((ModelPod { ns, pod: name }, netns, ip));
        }
    }
    for (m, _, _) in &pods {
        sw.wait_link(&format!("p{}{}", m.ns, m.pod), true);
    }
    let sync = Sync::start(&shipped, "node-1", &node, &sw, &api, &token);

    // Every ordered pair's probe, at once: (from, to) -> reached.
    let matrix = |probe: Probe| -> Vec<(ModelPod, ModelPod, bool)> {
        let mut probes = Vec::new();
        for (f, fns, _) in &pods {
            for (t, _, tip) in &pods {
                if f == t {
                    continue;
                }
                let port = match probe {
                    Probe::Tcp(p) | Probe::Udp(p) => p,
                };
                let to: std::net::SocketAddr = format!("{tip}:{port}").parse().unwrap();
                // A quarter of a second: an answer on these veths takes
                // microseconds, and a refused SYN or datagram gets none. A
                // late answer where one is due is asked again; one where
                // none is due reads as refused, as with any such wait.
                let wait = Duration::from_millis(250);
                let h = in_ns(&fns.name, move || match probe {
                    Probe::Tcp(_) => std::net::TcpStream::connect_timeout(&to, wait).is_ok(),
                    Probe::Udp(_) => {
                        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                        s.set_read_timeout(Some(wait)).unwrap();
                        let mut b = [0u8; 16];
                        s.send_to(b"probe", to).is_ok() && matches!(s.recv_from(&mut b), Ok((5, _)))
                    }
                });
                probes.push((*f, *t, h));
            }
        }
        probes
            .into_iter()
            .map(|(f, t, h)| (f, t, h.join().unwrap()))
            .collect()
    };
    let policy = |name: &str, spec: Value| {
        json!({"metadata": {"namespace": "x", "name": name,
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": "net"}},
               "spec": spec})
    };
    // Waits until every probe gives what `want` says.
    let expect = |case: &str, probe: Probe, want: &dyn Fn(ModelPod, ModelPod) -> bool| {
        let deadline = std::time::Instant::now() + LIMIT;
        loop {
            let got = matrix(probe);
            let wrong: Vec<String> = got
                .iter()
                .filter(|(f, t, r)| *r != want(*f, *t))
                .map(|(f, t, r)| {
                    format!(
                        "{}/{}->{}/{} {}",
                        f.ns,
                        f.pod,
                        t.ns,
                        t.pod,
                        if *r { "reached" } else { "refused" }
                    )
                })
                .collect();
            if wrong.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{case}, {probe:?}: {wrong:?}\n{}",
                sync.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let xa = ModelPod { ns: "x", pod: "a" };
    let xb = ModelPod { ns: "x", pod: "b" };
    let all = |_: ModelPod, _: ModelPod| true;
    expect("no policy", Tcp(80), &all);
    expect("no policy", Udp(81), &all);

    type Want = Box<dyn Fn(ModelPod, ModelPod) -> bool>;
    /// A case: its name, its policies, and per probe who reaches whom.
    type Case = (&'static str, Vec<Value>, Vec<(Probe, Want)>);
    use Probe::{Tcp, Udp};
    // multi-networkpolicy-iptables' port cases: x/a takes the `allowed`
    // probes (from x/b alone, or from any pod) and no other; every other
    // pod takes everything. Each of TCP and UDP on 80 and 81 probed.
    let only = |allowed: &[Probe], from_b: bool| -> Vec<(Probe, Want)> {
        [Tcp(80), Tcp(81), Udp(80), Udp(81)]
            .into_iter()
            .map(|probe| {
                let want: Want = if !allowed.contains(&probe) {
                    Box::new(move |_, t| t != xa)
                } else if from_b {
                    Box::new(move |f, t| t != xa || f == xb)
                } else {
                    Box::new(all)
                };
                (probe, want)
            })
            .collect()
    };
    let cases: Vec<Case> = vec![
        (
            "should support a 'default-deny-ingress' policy",
            vec![policy("deny-ingress", json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []}))],
            vec![(Tcp(80), Box::new(|_, t| t.ns != "x"))],
        ),
        (
            "should support a 'default-deny-all' policy",
            vec![policy("deny-all", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}))],
            vec![(Tcp(80), Box::new(|f, t| t.ns != "x" && f.ns != "x"))],
        ),
        (
            "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
            vec![policy("x-a-allows-x-b", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            vec![(Tcp(80), Box::new(move |f, t| t != xa || f == ModelPod { ns: "x", pod: "b" }))],
        ),
        (
            "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
            vec![policy("allow-client-a-via-ns-selector", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}]}))],
            vec![(Tcp(80), Box::new(move |f, t| t != xa || f.ns == "y"))],
        ),
        (
            "should enforce policy based on PodSelector or NamespaceSelector",
            vec![policy("allow-ns-y-match-selector", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [
                    {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["x"]}]}},
                    {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            vec![(Tcp(80), Box::new(move |f, t| t != xa || f != ModelPod { ns: "x", pod: "c" }))],
        ),
        (
            "should enforce policy based on PodSelector and NamespaceSelector",
            vec![policy("allow-ns-y-podselector-and-nsselector", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{
                    "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["x"]}]},
                    "podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            vec![(Tcp(80), Box::new(move |f, t| t != xa || (f.ns != "x" && f.pod == "b")))],
        ),
        (
            "should enforce policy based on any PodSelectors",
            vec![policy("allow-ns-x-pod-b-c", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}, {"podSelector": {"matchLabels": {"pod": "c"}}}]}]}))],
            vec![(Tcp(80), Box::new(move |f, t| t != xa || (f.ns == "x" && f.pod != "a")))],
        ),
        (
            "should enforce policy based on Ports",
            vec![policy("allow-client-a-via-ns-selector", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}],
                             "ports": [{"port": 81, "protocol": "TCP"}]}]}))],
            vec![
                (Tcp(81), Box::new(move |f, t| t != xa || f.ns == "y")),
                (Tcp(80), Box::new(move |_, t| t != xa)),
            ],
        ),
        (
            "should support allow-all policy",
            vec![policy("allow-all", json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}))],
            vec![(Tcp(80), Box::new(all)), (Tcp(81), Box::new(all))],
        ),
        (
            "should allow ingress access on one named port",
            vec![policy("allow-all", json!({"podSelector": {}, "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}))],
            vec![(Tcp(81), Box::new(all)), (Tcp(80), Box::new(|_, t| t.ns != "x"))],
        ),
        (
            "should allow egress access on one named port",
            vec![policy("allow-egress", json!({"podSelector": {}, "policyTypes": ["Egress"],
                "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}))],
            vec![(Tcp(80), Box::new(all)), (Tcp(81), Box::new(|f, _| f.ns != "x"))],
        ),
        (
            "should allow ingress access from pods outside an ipBlock's except (own row: the e2e suite's CIDR cases with a pod's address)",
            vec![policy("allow-cidr-except", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.80.0.0/16", "except": ["10.80.2.2/32"]}}]}]}))],
            vec![(Tcp(80), Box::new(move |f, t| t != xa || f != ModelPod { ns: "y", pod: "b" }))],
        ),
        (
            "should allow a port range (own row: endPort, which no e2e case probes)",
            vec![policy("allow-range", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": 81, "endPort": 90}]}]}))],
            vec![(Tcp(81), Box::new(all)), (Tcp(80), Box::new(move |_, t| t != xa))],
        ),
        // multi-networkpolicy-iptables' e2e cases of ports and protocols
        // (e2e/test/multinetworkpolicy_test.go, "Ports/Protocol"; its
        // ports 5555 and 6666 are 80 and 81 here), each probed both ways
        // on both ports.
        (
            "Allow access only to a specific port/protocol TCP",
            vec![policy("tcp-80-from-b", json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"port": 80, "protocol": "TCP"}],
                             "from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            only(&[Tcp(80)], true),
        ),
        (
            "Allow access only to a specific port/protocol UDP",
            vec![policy("udp-81-from-b", json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}],
                             "from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            only(&[Udp(81)], true),
        ),
        (
            "Allow access only to a specific port/protocol TCP+UDP",
            vec![policy("tcp-80-udp-81-from-b", json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "UDP"}],
                             "from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            only(&[Tcp(80), Udp(81)], true),
        ),
        (
            "Allow access only to a specific UDP port from any pod",
            vec![policy("udp-81-from-any", json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}]}]}))],
            only(&[Udp(81)], false),
        ),
    ];
    for (case, policies, wants) in &cases {
        for p in policies {
            api.put(MULTI_NETWORK_POLICIES, p.clone());
        }
        for (probe, want) in wants {
            expect(case, *probe, want.as_ref());
        }
        for p in policies {
            let key = format!("x/{}", p["metadata"]["name"].as_str().unwrap());
            api.delete(MULTI_NETWORK_POLICIES, &key);
        }
        expect(&format!("{case}, deleted"), Tcp(80), &all);
    }

    // "should enforce updated policy": allow-all, then the same policy
    // with no ingress rule.
    let mut p = policy(
        "allow-all-mutate-to-deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}),
    );
    api.put(MULTI_NETWORK_POLICIES, p.clone());
    expect("should enforce updated policy, before", Tcp(81), &all);
    p["spec"]["ingress"] = json!([]);
    api.put(MULTI_NETWORK_POLICIES, p);
    expect("should enforce updated policy, after", Tcp(81), &|_, t| {
        t.ns != "x"
    });
    api.delete(MULTI_NETWORK_POLICIES, "x/allow-all-mutate-to-deny-all");
    expect("should enforce updated policy, deleted", Tcp(81), &all);

    api.assert_only_lists_watches_status_patches_and_leases();
    drop(sync);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in listeners {
        l.join().unwrap();
    }
}
