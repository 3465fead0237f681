//! Three nodes of a cluster on the shipped overlay, from the files we ship
//! as they are: each node a scratch root (`support/node_root.rs`: its own
//! `/run`, `/var/lib` and `/opt`) and a network namespace behind a router
//! (the underlay), running the switch on the ConfigMap's
//! `switchyard.toml` and the DaemonSet's vtep-sync container's command
//! (its environment from the downward API) against the API server
//! stand-in (`vtepsync/tests/support/api_server.rs`: the shipped RBAC,
//! Leases, the garbage collector); pods attached to the NAD
//! `switchyard-overlay` of `network-attachments.yaml` by the Multus
//! stand-in, which finds the plugin by `type` in the node's `/opt/cni/bin`.
//!
//! The nodes claim disjoint slices of the overlay's subnets (Leases, each
//! owned by its node), their pods get addresses from them through
//! host-local, and reach each other across the nodes. A restarted agent
//! or an upgraded switch keeps the node's slice; a node deleted frees its slice (the
//! garbage collector deletes its Lease).
//!
//! Departures from a cluster: the pods' devices do not come from the
//! device plugin (the kubelet is not asked: Multus passes no `deviceID`,
//! so the plugin makes each pod's socket in its own directory; the device
//! plugin's path is `whole_node`'s), and a pod is DPDK testpmd forwarding
//! between its memif interface and a kernel tap (`net_tap`) in the pod's
//! network namespace, where the kernel has the addresses the CNI result
//! gave.

#[path = "../../vtepsync/tests/support/api_server.rs"]
mod api_server;
#[path = "../../dataplane/tests/common/mod.rs"]
mod common;
#[path = "../../cni/tests/support/exec.rs"]
mod exec;
#[path = "../../cni/tests/support/multus.rs"]
mod multus;
#[path = "support/node_root.rs"]
mod node_root;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use api_server::{ApiServer, LEASES, NETWORK_ATTACHMENT_DEFINITIONS, PODS};
use common::{
    check_ending, neighbour_requests, serial, terminate, testpmd_bin, underlay_capture,
    underlay_frames, wait_for, workspace_bin, Netns, Switch, Testpmd, Underlay,
};
use multus::{Bandwidth, Multus, MultusVersion, Nad, Pod, Selection};
use node_root::{documents, find, NodeRoot};
use serde_json::{json, Value};
use switchyard_api::{BridgeInfo, PortInfo, Request};

const LIMIT: Duration = Duration::from_secs(30);

/// What the shipped files say.
struct Shipped {
    /// `switchyard.yaml`'s documents (the RBAC the API server authorizes by).
    docs: Vec<Value>,
    /// The ConfigMap's `switchyard.toml`.
    switch_cfg: String,
    /// The DaemonSet's vtep-sync container.
    container: Value,
    /// The DaemonSet's namespace, service account and nodeSelector.
    namespace: String,
    account: String,
    selected: Vec<(String, String)>,
    /// The overlay's NAD, and as the API server stores it.
    nad: Nad,
    nad_object: Value,
}

impl Shipped {
    fn read() -> Shipped {
        let docs: Vec<Value> = documents("config/kubernetes/switchyard.yaml")
            .iter()
            .map(|d| serde_json::to_value(d).unwrap())
            .collect();
        let json = |v: &serde_yaml::Value| serde_json::to_value(v).unwrap();
        let yaml = documents("config/kubernetes/switchyard.yaml");
        let ds = json(find(&yaml, "DaemonSet", "switchyard"));
        let spec = &ds["spec"]["template"]["spec"];
        let container = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "vtep-sync")
            .expect("the DaemonSet's vtep-sync container")
            .clone();
        let switch_cfg = json(find(&yaml, "ConfigMap", "switchyard-config"))["data"]
            ["switchyard.toml"]
            .as_str()
            .unwrap()
            .to_string();
        let nads = documents("config/kubernetes/network-attachments.yaml");
        let nad = json(find(
            &nads,
            "NetworkAttachmentDefinition",
            "switchyard-overlay",
        ));
        let nad_object = nad.clone();
        let nad = Nad {
            namespace: nad["metadata"]["namespace"].as_str().unwrap().into(),
            name: nad["metadata"]["name"].as_str().unwrap().into(),
            config: serde_json::from_str(nad["spec"]["config"].as_str().unwrap()).unwrap(),
            resource_name: nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
                .as_str()
                .map(str::to_string),
        };
        Shipped {
            namespace: ds["metadata"]["namespace"].as_str().unwrap().into(),
            account: spec["serviceAccountName"].as_str().unwrap().into(),
            selected: spec["nodeSelector"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().into()))
                .collect(),
            docs,
            switch_cfg,
            container,
            nad,
            nad_object,
        }
    }

    fn selected(&self) -> Vec<(&str, &str)> {
        self.selected
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// The overlay the NAD names (its `physnet`).
    fn overlay(&self) -> String {
        self.nad.config["physnet"].as_str().unwrap().to_string()
    }
}

/// A node's vtep-sync, run as the DaemonSet runs it: the container's
/// command, in the node's root and network namespace, its environment
/// from the downward API, the API server's kubeconfig (in a pod: its
/// kube-api-access volume). Stopped on drop (SIGTERM); an exit that is
/// not clean, or a panic or an ERROR in its log, fails the test.
struct Agent {
    child: Option<Child>,
    log: PathBuf,
}

impl Agent {
    fn start(shipped: &Shipped, node: &ClusterNode, api: &ApiServer, token: &str) -> Agent {
        let c = &shipped.container;
        let argv: Vec<String> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .chain(c["args"].as_array().into_iter().flatten())
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let kubeconfig = node.root.dir.path().join("kubeconfig");
        api.kubeconfig(token, &kubeconfig);
        let log = node.root.dir.path().join(format!(
            "vtep-sync-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &node.netns])
            .args(node.root.enter())
            .arg(workspace_bin("switchyard-vtep-sync", &argv[0]))
            .args(&argv[1..])
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap();
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("spec.nodeName") => cmd.env(name, &node.name),
                Some("metadata.namespace") => cmd.env(name, &shipped.namespace),
                Some(f) => panic!("fieldRef {f}: not translated"),
                None => cmd.env(name, e["value"].as_str().unwrap()),
            };
        }
        Agent {
            child: Some(cmd.spawn().unwrap()),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if std::thread::panicking() {
            eprintln!("---- vtep-sync ----\n{}", self.log());
        }
        let ending = terminate(&mut child, Duration::from_secs(10));
        check_ending("vtep-sync", ending, &self.log(), &[]);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A node: its root, its network namespace on the underlay, its switch.
struct ClusterNode {
    name: String,
    netns: String,
    root: NodeRoot,
    switch: Switch,
}

impl ClusterNode {
    /// Node `name` in namespace `netns`: the switch on the shipped config,
    /// the CNI plugin and host-local where the DaemonSet's install puts
    /// them.
    fn start(name: &str, netns: &Netns, shipped: &Shipped) -> ClusterNode {
        let root = NodeRoot::new();
        let control = root.path(&toml_string(&shipped.switch_cfg, "control_socket"));
        let switch = Switch::start_configured(
            Some(&netns.name),
            &root.enter(),
            &shipped.switch_cfg,
            control,
        );
        let bin = root.path("/opt/cni/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy(
            workspace_bin("switchyard-cni", "switchyard-cni"),
            bin.join(shipped.nad.config["type"].as_str().unwrap()),
        )
        .unwrap();
        std::fs::copy("/usr/lib/cni/host-local", bin.join("host-local"))
            .expect("host-local (./scripts/test.sh installs containernetworking-plugins)");
        ClusterNode {
            name: name.into(),
            netns: netns.name.clone(),
            root,
            switch,
        }
    }

    /// The node's Multus (v4.3), its plugins in `/opt/cni/bin`.
    fn multus(&self) -> Multus {
        Multus {
            version: MultusVersion::V4_3,
            bin_dir: "/opt/cni/bin".into(),
            host_root: format!("/proc/{}/root", self.root.pid).into(),
            enter: self.root.enter(),
            pod_resources: None,
            cni_dir: "/var/lib/cni/multus".into(),
            devinfo_base: "/var/run/k8s.cni.cncf.io/devinfo".into(),
            cni_path: "/opt/cni/bin".into(),
        }
    }

    /// The overlay's bridge as the switch reports it.
    fn overlay(&self, overlay: &str) -> BridgeInfo {
        self.switch
            .client()
            .ask(&Request::bridge_list())
            .unwrap()
            .into_iter()
            .find(|b| b.name == overlay)
            .expect("the overlay's bridge")
    }

    /// The slice the switch hands out.
    fn slice(&self, overlay: &str) -> Option<u32> {
        self.overlay(overlay).ipam.and_then(|i| i.slice)
    }
}

/// A top-level string of a TOML file.
fn toml_string(cfg: &str, key: &str) -> String {
    toml::from_str::<toml::Value>(cfg).unwrap()[key]
        .as_str()
        .unwrap()
        .to_string()
}

/// A pod on the overlay: its network namespace, its addresses and MAC, and
/// the testpmd that forwards between its memif interface and a kernel tap
/// (`net1`, which has the addresses and the MAC).
struct OverlayPod {
    pod: Pod,
    ns: Netns,
    ips: Vec<String>,
    mac: String,
    testpmd: Option<Testpmd>,
}

/// The cluster's default network's entry of a pod's network-status, first
/// as Multus writes it (`pkg/multus/multus.go` `CmdAdd`: the default
/// network's status, then each delegate's); not an overlay network.
fn default_network_status(i: usize) -> Value {
    json!({
        "name": "k8s-pod-network",
        "interface": "eth0",
        "ips": [format!("10.244.{i}.9")],
        "mac": format!("0a:58:0a:f4:{i:02x}:09"),
        "default": true,
        "dns": {}
    })
}

/// Attaches pod `name` on `node` to the overlay's NAD through the node's
/// Multus (with the network selection's `mac` where given); starts its
/// testpmd, gives the tap the result's MAC and addresses, and stores the
/// pod in the API server as Multus leaves it: scheduled on the node, its
/// network-status annotation written
/// (network-attachment-definition-client `pkg/utils/net-attach-def.go`
/// `SetNetworkStatus`).
fn attach(
    node: &ClusterNode,
    shipped: &Shipped,
    api: &ApiServer,
    name: &str,
    mac: Option<&str>,
) -> OverlayPod {
    let ns = Netns::new(name);
    let pod = Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        sandbox: format!("{name:0>64}"),
        netns: format!("/var/run/netns/{}", ns.name),
    };
    // A bandwidth the pod's traffic here never reaches: the shipped NAD
    // declares the capability, and the port gets it.
    let selection = Selection {
        mac: mac.map(str::to_string),
        bandwidth: Some(Bandwidth {
            ingress_rate: 1_000_000_000,
            ingress_burst: 100_000_000,
            egress_rate: 500_000_000,
            egress_burst: 50_000_000,
        }),
        ..Selection::default()
    };
    let added = node
        .multus()
        .add(&pod, &[(shipped.nad.clone(), selection, None)])
        .unwrap_or_else(|e| panic!("ADD of {name} on {}: {e:?}", node.name));
    let result = &added[0].result;
    let ips: Vec<String> = result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap().to_string())
        .collect();
    let status = &added[0].network_status;
    let pod_mac = status["mac"]
        .as_str()
        .expect("the result's MAC")
        .to_string();
    if let Some(m) = mac {
        assert_eq!(pod_mac, m, "the selection's MAC");
    }
    // The pod's socket: the port the plugin made for it.
    let ports: Vec<PortInfo> = node.switch.client().ask(&Request::port_list()).unwrap();
    let port = ports
        .iter()
        .find(|p| p.spec.pod.as_ref().is_some_and(|a| a.name == name))
        .expect("the pod's port");
    // Storm control, as the switch holds every pod's port.
    let stats = node
        .switch
        .client()
        .ask(&Request::stats(Some(port.spec.name.clone())))
        .unwrap();
    assert_eq!(stats[0].flood_limit, 1000, "{stats:?}");
    let limits = stats[0].rate_limit.expect("the selection's bandwidth");
    assert_eq!(
        limits.tx.and_then(|m| m.bits_bucket()),
        Some((1_000_000_000, 100_000_000))
    );
    assert_eq!(
        limits.rx.and_then(|m| m.bits_bucket()),
        Some((500_000_000, 50_000_000))
    );
    let socket = port.socket();
    let mut cmd = Command::new("nsenter");
    cmd.args(["-t", &node.root.pid.to_string(), "-m"])
        .arg(format!("--net=/run/netns/{}", ns.name))
        .args(["--", "stdbuf", "-oL", "-eL", testpmd_bin()])
        .args(["--no-huge", "-m", "256", "--no-pci", "--lcores", "0@0,1@1"])
        .args(["--file-prefix", name])
        .arg("--vdev=net_tap0,iface=net1")
        .arg(format!(
            "--vdev=net_memif0,role=client,id=0,socket={socket},socket-abstract=no"
        ))
        .args(["--", "-i", "--total-num-mbufs=8192", "--forward-mode=io"]);
    let testpmd = Testpmd::from_command(cmd);
    // The port passes frames from the result's MAC alone (the NAD pins
    // it): the pod's interface has it.
    let mut sh = format!(
        "ip link set lo up && ip link set net1 address {pod_mac} && ip link set net1 mtu 1450 up"
    );
    for ip in &ips {
        if ip.contains(':') {
            sh.push_str(&format!(" && ip -6 addr add {ip} dev net1 nodad"));
        } else {
            sh.push_str(&format!(" && ip addr add {ip} dev net1"));
        }
    }
    ns.sh_ok(&sh);
    let n: usize = node.name.trim_start_matches("node-").parse().unwrap();
    let statuses = json!([default_network_status(n), status]);
    api.put(
        PODS,
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": pod.namespace,
                "name": name,
                "annotations": {
                    "k8s.v1.cni.cncf.io/networks": shipped.nad.name,
                    "k8s.v1.cni.cncf.io/network-status": statuses.to_string(),
                },
            },
            "spec": {
                "nodeName": node.name,
                "containers": [{"name": "pod", "image": "testpmd"}],
            },
            "status": {"phase": "Running"},
        }),
    );
    OverlayPod {
        pod,
        ns,
        ips,
        mac: pod_mac,
        testpmd: Some(testpmd),
    }
}

impl OverlayPod {
    /// Its address of a family, without the prefix.
    fn ip(&self, v6: bool) -> String {
        let a = self.ips.iter().find(|a| a.contains(':') == v6).unwrap();
        a.split('/').next().unwrap().to_string()
    }

    /// Whether it gets answers to pings of `to`.
    fn pings(&self, to: &str) -> bool {
        self.ns
            .sh(&format!("busybox ping -c 2 -i 0.2 -W 2 {to}"))
            .status
            .success()
    }

    /// Detaches it: its testpmd stops (checked), Multus runs DEL, and the
    /// pod goes from the API server.
    fn detach(mut self, node: &ClusterNode, api: &ApiServer) {
        if let Some(mut t) = self.testpmd.take() {
            t.assert_alive();
        }
        let failed = node.multus().del(&self.pod);
        assert!(failed.is_empty(), "DEL of {}: {failed:?}", self.pod.name);
        api.delete(PODS, &format!("{}/{}", self.pod.namespace, self.pod.name));
    }
}

/// The overlay's claims: slice by holder.
fn claims(api: &ApiServer, namespace: &str) -> Vec<(String, u32, String)> {
    api.all(LEASES)
        .values()
        .filter(|l| l["metadata"]["namespace"] == namespace)
        .map(|l| {
            let name = l["metadata"]["name"].as_str().unwrap().to_string();
            let slice = name.rsplit('-').next().unwrap().parse().unwrap();
            (
                l["spec"]["holderIdentity"].as_str().unwrap().to_string(),
                slice,
                l["metadata"]["ownerReferences"][0]["uid"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

/// Three nodes on the underlay, each with its switch and agent (started at
/// once: they race for the lowest slices), in a cluster of the shipped
/// RBAC and the overlay's NAD.
fn cluster(shipped: &Shipped) -> (Underlay, ApiServer, Vec<ClusterNode>, Vec<Agent>) {
    let u = Underlay::new(3);
    let api = ApiServer::start_in(&shipped.docs, &u.router.name, "10.81.1.1".parse().unwrap());
    api.put(NETWORK_ATTACHMENT_DEFINITIONS, shipped.nad_object.clone());
    let names = ["node-1", "node-2", "node-3"];
    for (i, n) in names.iter().enumerate() {
        api.put_node(
            n,
            &shipped.selected(),
            &[("InternalIP", &Underlay::ip(i + 1))],
        );
    }
    let nodes: Vec<ClusterNode> = names
        .iter()
        .zip(&u.vteps)
        .map(|(n, netns)| ClusterNode::start(n, netns, shipped))
        .collect();
    let agents: Vec<Agent> = nodes
        .iter()
        .map(|n| {
            let token = api.token_for_node(&shipped.namespace, &shipped.account, &n.name);
            Agent::start(shipped, n, &api, &token)
        })
        .collect();
    (u, api, nodes, agents)
}

#[test]
fn nodes_hand_out_disjoint_slices_of_the_overlay_and_their_pods_reach_each_other() {
    let _g = serial();
    let shipped = Shipped::read();
    let overlay = shipped.overlay();
    let ns = shipped.namespace.clone();

    let (_underlay, api, mut nodes, mut agents) = cluster(&shipped);
    let token = |node: &str| api.token_for_node(&ns, &shipped.account, node);

    // Each switch hands out the slice its node holds, and no two hold one.
    let slices: Vec<u32> = wait_for(LIMIT, "every node's slice", || {
        nodes.iter().map(|n| n.slice(&overlay)).collect()
    });
    let held = claims(&api, &ns);
    assert_eq!(held.len(), 3, "{held:?}");
    for (n, s) in nodes.iter().zip(&slices) {
        let uid = api.node(&n.name).unwrap()["metadata"]["uid"].clone();
        assert!(
            held.iter()
                .any(|(h, hs, owner)| h == &n.name && hs == s && uid == *owner),
            "{} hands out slice {s}, and holds {held:?}",
            n.name
        );
    }
    assert_eq!(
        slices.iter().collect::<BTreeSet<_>>().len(),
        3,
        "{slices:?}"
    );

    // A pod on each node: addresses from its node's slice, in the
    // overlay's subnets.
    let pods: Vec<OverlayPod> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| attach(n, &shipped, &api, &format!("ovpod{}", i + 1), None))
        .collect();
    for (p, s) in pods.iter().zip(&slices) {
        let v4: std::net::Ipv4Addr = p.ip(false).parse().unwrap();
        let v6: std::net::Ipv6Addr = p.ip(true).parse().unwrap();
        assert!(p.ips.iter().any(|a| a.ends_with("/16")), "{:?}", p.ips);
        assert!(p.ips.iter().any(|a| a.ends_with("/48")), "{:?}", p.ips);
        assert_eq!(
            (v4.octets()[..3].to_vec(), v6.segments()[..4].to_vec()),
            (vec![10, 66, *s as u8], vec![0xfd66, 0, 0, *s as u16]),
            "{:?} from slice {s}",
            p.ips
        );
    }
    // They reach each other across the nodes, both families.
    for (from, to) in [(0, 1), (0, 2), (1, 2)] {
        for v6 in [false, true] {
            let dst = pods[to].ip(v6);
            wait_for(LIMIT, &format!("pod {from} pinging {dst}"), || {
                pods[from].pings(&dst).then_some(())
            });
        }
    }

    // Node 1's agent restarts and its switch is upgraded (a takeover, as
    // the DaemonSet's rollout does): the node keeps its slice, claims
    // nothing new, and its pods keep their connections.
    let before = claims(&api, &ns);
    agents[0].stop();
    nodes[0].switch.takeover();
    assert_eq!(nodes[0].slice(&overlay), Some(slices[0]));
    agents[0] = Agent::start(&shipped, &nodes[0], &api, &token("node-1"));
    wait_for(LIMIT, "node 1's agent synced", || {
        agents[0]
            .log()
            .contains("filling the overlays")
            .then_some(())
    });
    assert_eq!(claims(&api, &ns), before);
    assert!(!agents[0].log().contains("claimed"), "{}", agents[0].log());
    let mut pods = pods;
    pods.push(attach(&nodes[0], &shipped, &api, "ovpod4", None));
    assert!(
        pods[3]
            .ip(false)
            .starts_with(&format!("10.66.{}.", slices[0])),
        "{:?}",
        pods[3].ips
    );
    wait_for(LIMIT, "the new pod on node 1 pinging node 3's", || {
        pods[3].pings(&pods[2].ip(false)).then_some(())
    });
    wait_for(LIMIT, "node 1's first pod pinging node 3's", || {
        pods[0].pings(&pods[2].ip(false)).then_some(())
    });

    // Node 2 is deleted and made again under its name while the garbage
    // collector has yet to delete its claim: its agent releases the claim
    // of the node's previous object and claims the same slice for the new
    // one (its pods keep their addresses).
    api.set_gc_lagging(true);
    let old_uid = api.node("node-2").unwrap()["metadata"]["uid"].clone();
    api.delete_node("node-2");
    api.put_node(
        "node-2",
        &shipped.selected(),
        &[("InternalIP", &Underlay::ip(2))],
    );
    let new_uid = api.node("node-2").unwrap()["metadata"]["uid"].clone();
    assert_ne!(old_uid, new_uid);
    wait_for(LIMIT, "node 2's claim for its new object", || {
        claims(&api, &ns)
            .iter()
            .any(|(h, s, owner)| h == "node-2" && *s == slices[1] && new_uid == *owner)
            .then_some(())
    });
    api.set_gc_lagging(false);
    assert!(
        claims(&api, &ns)
            .iter()
            .any(|(h, s, _)| h == "node-2" && *s == slices[1]),
        "{:?}",
        claims(&api, &ns)
    );
    assert_eq!(nodes[1].slice(&overlay), Some(slices[1]));

    // Node 3 leaves the cluster: its claim goes with it (the garbage
    // collector deletes what the node owned).
    agents[2].stop();
    api.delete_node("node-3");
    let left = claims(&api, &ns);
    assert!(!left.iter().any(|(h, _, _)| h == "node-3"), "{left:?}");
    assert_eq!(left.len(), 2, "{left:?}");
    // The machine joins again as node-4: its switch still hands out the
    // slice it had, which is free, so it claims that one (its pods keep
    // valid addresses).
    api.put_node(
        "node-4",
        &shipped.selected(),
        &[("InternalIP", &Underlay::ip(3))],
    );
    nodes[2].name = "node-4".into();
    agents[2] = Agent::start(&shipped, &nodes[2], &api, &token("node-4"));
    wait_for(LIMIT, "node 4's claim", || {
        claims(&api, &ns)
            .iter()
            .any(|(h, s, _)| h == "node-4" && *s == slices[2])
            .then_some(())
    });
    assert_eq!(nodes[2].slice(&overlay), Some(slices[2]));
    wait_for(LIMIT, "node 4's pod reached again", || {
        pods[1].pings(&pods[2].ip(false)).then_some(())
    });

    // The pods go: DEL releases their addresses.
    for (i, p) in pods.into_iter().enumerate() {
        let node = &nodes[if i == 3 { 0 } else { i }];
        p.detach(node, &api);
    }
    for n in &nodes {
        let dir = n
            .root
            .path(&format!("/var/lib/cni/networks/{}", shipped.nad.name));
        let leased: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|f| f.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default();
        assert!(leased.is_empty(), "{}: {leased:?}", n.name);
    }
    api.assert_only_lists_watches_status_patches_and_leases();
    drop(agents);
    for n in &mut nodes {
        n.switch.assert_alive();
    }
}

/// The switch's VTEPs of `overlay`: remote address to how many stations
/// it has.
fn stations_by_vtep(node: &ClusterNode, overlay: &str) -> BTreeMap<String, usize> {
    node.switch
        .client()
        .ask(&Request::vtep_list())
        .unwrap()
        .into_iter()
        .filter(|v| v.overlay == overlay)
        .map(|v| (v.remote.to_string(), v.stations))
        .collect()
}

/// Each node's agent gives its switch the other nodes' pods on the overlay
/// (from their network-status, behind their node's VTEP). A pod that looks
/// for a pod on another node is answered by its own switch: in steady
/// state no ARP request and no neighbour solicitation crosses the underlay
/// (captured on every node's link). A pod deleted and made again on
/// another node with the same MAC (the network selection's `mac`) is
/// reachable from the others soon after its new network-status: each
/// switch moves the MAC to the new node's tunnel.
#[test]
fn switches_answer_for_the_other_nodes_pods_and_follow_a_pod_to_another_node() {
    let _g = serial();
    let shipped = Shipped::read();
    let overlay = shipped.overlay();
    let (u, api, mut nodes, agents) = cluster(&shipped);
    wait_for(LIMIT, "every node's slice", || {
        nodes
            .iter()
            .map(|n| n.slice(&overlay))
            .collect::<Option<Vec<_>>>()
    });
    let moving = "02:5a:00:00:00:02";
    let mut pods: Vec<OverlayPod> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mac = (i == 1).then_some(moving);
            attach(n, &shipped, &api, &format!("ovpod{}", i + 1), mac)
        })
        .collect();
    // Each switch has one station behind each other node's VTEP.
    wait_for(LIMIT, "every VTEP's station", || {
        nodes
            .iter()
            .all(|n| {
                let s = stations_by_vtep(n, &overlay);
                s.len() == 2 && s.values().all(|c| *c == 1)
            })
            .then_some(())
    });

    // Steady state (the pods' link-local addresses are theirs: DAD's
    // solicitations are flooded, as they must be): the pods know no
    // neighbour, and look for each other in both families; nothing they
    // ask crosses the underlay.
    for p in &pods {
        wait_for(LIMIT, "DAD done", || {
            p.ns.sh_ok("ip -6 addr show dev net1 tentative")
                .trim()
                .is_empty()
                .then_some(())
        });
    }
    let dir = tempfile::tempdir().unwrap();
    for p in &pods {
        p.ns.sh_ok("ip neigh flush all && ip -6 neigh flush all");
    }
    let caps: Vec<_> = u
        .vteps
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let file = dir.path().join(format!("ul{i}.pcap")).display().to_string();
            (underlay_capture(ns, &file), file)
        })
        .collect();
    for (from, to) in [(0, 1), (0, 2), (1, 2), (2, 0)] {
        for v6 in [false, true] {
            let dst = pods[to].ip(v6);
            assert!(pods[from].pings(&dst), "pod {from} pinging {dst}");
        }
    }
    for (i, (cap, file)) in caps.into_iter().enumerate() {
        let frames = underlay_frames(cap, &file);
        let requests = neighbour_requests(&frames);
        assert!(
            requests.is_empty(),
            "node {}'s link: requests crossed: {requests:?}",
            i + 1
        );
        assert!(
            frames.iter().any(|l| l.contains("ICMP echo request")),
            "node {}'s link: {frames:#?}",
            i + 1
        );
    }
    // The neighbours are the pods' own MACs (the switch answered with
    // them).
    let neigh = pods[0].ns.sh_ok("ip neigh show dev net1");
    for p in &pods[1..] {
        assert!(neigh.contains(&p.mac), "{neigh}");
    }
    for n in &nodes {
        assert!(n.overlay(&overlay).counters.answered >= 2, "{}", n.name);
    }

    // Node 2's pod is deleted and made again on node 3 with its MAC: node
    // 1's switch moves the MAC to node 3's tunnel (it was pinned to node
    // 2's), and the pod is reached at its new address.
    let old = pods.remove(1);
    old.detach(&nodes[1], &api);
    let moved = attach(&nodes[2], &shipped, &api, "ovpod2", Some(moving));
    let written = std::time::Instant::now();
    let dst = moved.ip(false);
    wait_for(LIMIT, "the moved pod reached from node 1", || {
        pods[0]
            .ns
            .sh(&format!("busybox ping -c 1 -W 1 {dst}"))
            .status
            .success()
            .then_some(())
    });
    let reached = written.elapsed();
    // Node 1's switch has it behind node 3's VTEP now.
    wait_for(LIMIT, "node 1's stations moved", || {
        let s = stations_by_vtep(&nodes[0], &overlay);
        (s[&Underlay::ip(2)] == 0 && s[&Underlay::ip(3)] == 2).then_some(())
    });
    let moved_in = written.elapsed();
    eprintln!(
        "the moved pod reached {reached:?}, and its station moved {moved_in:?}, after its new network-status"
    );
    assert!(
        moved_in < Duration::from_secs(5),
        "the switch did not follow the pod when its network-status changed, only later ({moved_in:?})"
    );
    // It is answered for from there.
    pods[0].ns.sh_ok("ip neigh flush all");
    assert!(pods[0].pings(&dst), "pinging {dst}");
    let neigh = pods[0].ns.sh_ok("ip neigh show dev net1");
    assert!(
        neigh
            .lines()
            .any(|l| l.starts_with(&format!("{dst} ")) && l.contains(moving)),
        "{neigh}"
    );
    pods.push(moved);
    let owners = [0, 2, 2];
    for (p, n) in pods.into_iter().zip(owners) {
        p.detach(&nodes[n], &api);
    }
    wait_for(LIMIT, "no station left", || {
        nodes
            .iter()
            .all(|n| stations_by_vtep(n, &overlay).values().all(|c| *c == 0))
            .then_some(())
    });
    api.assert_only_lists_watches_status_patches_and_leases();
    drop(agents);
    for n in &mut nodes {
        n.switch.assert_alive();
    }
}
