//! End-to-end: the cluster path. `switchyard-cni` driven exactly as Multus
//! drives a delegate (see `support/multus.rs`: the keys it adds, its
//! device-info files, its cache replayed on DEL), VLAN isolation between
//! networks on one bridge, non-root pods, and the CNI version rules; real
//! daemon, real `host-local`, real DPDK testpmd pods.

#[path = "../../dataplane/tests/common/churn.rs"]
mod churn;
#[path = "support/exec.rs"]
mod exec;
#[path = "support/grpc_unix.rs"]
mod grpc_unix;
#[path = "support/multus.rs"]
mod multus;
#[path = "support/node.rs"]
mod node;
#[path = "support/pod_resources.rs"]
mod pod_resources;
#[path = "../../dataplane/tests/common/testpmd.rs"]
mod testpmd;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use multus::{Multus, MultusVersion, Nad, Pod, Selection};
use node::*;
use pod_resources::PodResourcesApi;
use serde_json::{json, Value};
use testpmd::{memif_vdev, serial, virtio_vdev, wait_for, Testpmd};

const LIMIT: Duration = Duration::from_secs(20);

/// A Multus v4.1 on `node`, its binDir holding the plugin under the name
/// the README gives (`/opt/cni/bin/switchyard`; the shipped DaemonSet's
/// install is tested in the device plugin's `whole_node`).
fn multus(node: &Node) -> Multus {
    multus_version(node, MultusVersion::V4_1)
}

fn multus_version(node: &Node, version: MultusVersion) -> Multus {
    let bin_dir = node.dir.path().join("opt-cni-bin");
    if !bin_dir.join("switchyard").exists() {
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::copy(cni_bin(), bin_dir.join("switchyard")).unwrap();
    }
    Multus {
        version,
        bin_dir,
        host_root: "/".into(),
        enter: Vec::new(),
        pod_resources: None,
        cni_dir: node.dir.path().join("multus"),
        devinfo_base: node.dir.path().join("devinfo"),
        cni_path: format!("/nonexistent:{HOST_LOCAL_DIR}"),
    }
}

fn pod(name: &str) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        sandbox: format!("{name:0>64}"),
        netns: format!("/var/run/netns/{name}"),
    }
}

fn nad(name: &str, config: Value, resource: Option<&str>) -> Nad {
    Nad {
        namespace: "default".into(),
        name: name.into(),
        config,
        resource_name: resource.map(str::to_string),
    }
}

/// A network's config as a NAD carries it: no `name` (Multus adds it), the
/// capabilities Multus's runtime config needs.
fn nad_config(node: &Node, extra: Value) -> Value {
    let mut c = node.netconf("unused", extra);
    c.as_object_mut().unwrap().remove("name");
    c["capabilities"] =
        json!({"CNIDeviceInfoFile": true, "deviceID": true, "mac": true, "ips": true});
    c["deviceInfoDir"] = node
        .dir
        .path()
        .join("devinfo/dp")
        .display()
        .to_string()
        .into();
    c["podResourcesSocket"] = pod_resources_socket(node).display().to_string().into();
    c
}

fn pod_resources_socket(node: &Node) -> PathBuf {
    node.dir.path().join("pod-resources/kubelet.sock")
}

fn leftovers(node: &Node) -> Vec<String> {
    let mut out = Vec::new();
    for d in ["pods", "devinfo/cni"] {
        out.extend(
            walk(&node.dir.path().join(d))
                .into_iter()
                .map(|p| p.display().to_string())
                .filter(|s| !s.contains(".switchyard-cni")),
        );
    }
    out
}

fn walk(p: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        v.push(e.path());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            v.extend(walk(&e.path()));
        }
    }
    v
}

/// What a runtime gets from Multus when a delegate's ADD fails (multus-cni
/// `pkg/multus/multus.go` `cmdPluginErr`, printed by containernetworking/cni
/// `pkg/skel/skel.go`; see `support/multus.rs`): code 999, and in `msg`
/// Multus's words for the pod and network around the delegate's error text
/// `err`.
fn multus_add_error(p: &Pod, net: &str, err: &str) -> Value {
    json!({"code": 999, "msg": format!(
        "[{}/{}/{}:{net}]: error adding container to network \"{net}\": {err}",
        p.namespace, p.name, p.uid
    )})
}

/// The text libcni makes of a plugin's error JSON (containernetworking/cni
/// `pkg/types/types.go` `Error.Error`): `msg`, then `; details` when there
/// are details.
fn error_text(e: &Value) -> String {
    let msg = e["msg"].as_str().unwrap_or_else(|| panic!("{e}"));
    match e["details"].as_str().filter(|d| !d.is_empty()) {
        Some(d) => format!("{msg}; {d}"),
        None => msg.to_string(),
    }
}

/// Runs the plugin directly with the input `m` gives it for `net` as pod
/// `p`'s first network (with the kubelet's `device` for the NAD's
/// resource), and returns its error JSON: the plugin's own code and
/// message, which Multus's error carries only as text. Then DEL with the
/// same input, its outcome ignored, as Multus follows a failed ADD.
fn plugin_add_error(m: &Multus, p: &Pod, net: &Nad, device: Option<&str>) -> Value {
    let (conf, ifname) = m.add_input(p, net, &Selection::default(), device, 0);
    let args = Multus::cni_args(p);
    let (good, e) = cni("ADD", &p.sandbox, &ifname, &args, &conf);
    assert!(!good, "{e}");
    let _ = cni("DEL", &p.sandbox, &ifname, &args, &conf);
    e
}

#[test]
fn multus_delegate_calls_cache_and_network_status() {
    let _g = serial();
    let node = Node::start();
    let m = multus(&node);
    // A typo'd key of ours and a key of another plugin's: warned, not fatal.
    let memif = nad(
        "memif-net",
        nad_config(
            &node,
            json!({"bridge": "br-m", "ipam": node.ipam("10.90.0.0/24"),
                   "memif": {"role": "slave", "ringsize": 512}, "ovs-bridge": "x"}),
        ),
        None,
    );
    let vhost = nad(
        "vhost-net",
        nad_config(
            &node,
            json!({"bridge": "br-m", "interfaceType": "vhost-user"}),
        ),
        None,
    );
    let p = pod("a");
    // The first selection names a deviceID of its own (the JSON form of the
    // annotation allows it): Multus then generates a CNIDeviceInfoFile.
    let sel1 = Selection {
        interface: Some("net1".into()),
        mac: Some("02:00:00:00:aa:01".into()),
        device_id: Some("attachment-1".into()),
        cni_args: Some(json!({"foo": "bar"})),
        ..Default::default()
    };
    let added = m
        .add(
            &p,
            &[
                (memif.clone(), sel1, None),
                (vhost.clone(), Selection::default(), None),
            ],
        )
        .unwrap_or_else(|e| panic!("ADD: {:?}", e.0));
    let (a1, a2) = (&added[0], &added[1]);
    // What the plugin made of the calls: a port on bridge br-m (the typo'd
    // "ringsize" ignored: the default ring size), its socket in the pod's directory (named by the
    // K8S_POD_UID of CNI_ARGS), the MAC of the selection (runtimeConfig)
    // pinned to it; and the device-info file at the path Multus passed.
    let sock1 = node.socket_dir().join("uid-a/net1.sock");
    let ports = node.ports();
    let port1 = ports
        .iter()
        .find(|p| p.socket() == sock1.to_str().unwrap())
        .unwrap_or_else(|| panic!("no port on {sock1:?}: {ports:?}"));
    assert_eq!(port1.spec.bridge.as_deref(), Some("br-m"));
    let switchyard_api::KindSpec::Memif(m1) = &port1.spec.kind else {
        panic!("{port1:?}")
    };
    assert_eq!(m1.ring_size, None);
    assert_eq!(
        port1.spec.macs.as_deref(),
        Some(&["02:00:00:00:aa:01".parse().unwrap()][..])
    );
    assert!(sock1.exists());
    let written: Value = serde_json::from_slice(
        &std::fs::read(a1.device_info_file.as_ref().expect("a CNIDeviceInfoFile")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        written,
        json!({"type": "memif", "version": "1.1.0",
               "memif": {"role": "slave", "mode": "ethernet", "path": sock1}})
    );

    // The network-status entries, as Multus builds them.
    let st = &a1.network_status;
    assert_eq!(st["name"], "default/memif-net");
    assert_eq!(st["interface"], "net1");
    assert_eq!(st["mac"], "02:00:00:00:aa:01");
    assert!(
        st["ips"][0].as_str().unwrap().starts_with("10.90.0."),
        "{st}"
    );
    assert_eq!(st["device-info"], written);
    // Without a deviceID Multus passes no CNIDeviceInfoFile, and its
    // network-status has no device-info (its source reads only that file).
    assert_eq!(a2.network_status["interface"], "net2");
    assert!(a2.network_status.get("device-info").is_none());
    assert_eq!(
        a2.result["interfaces"][0]["socketPath"],
        node.socket_dir()
            .join("uid-a/net2.sock")
            .display()
            .to_string()
    );

    // The two interfaces pass frames (one bridge), each application using
    // the MAC and the address its network-status reports (the switch pins
    // both: netconf `pin` and `pinIps`).
    let mac = |st: &Value| format!("mac={}", st["mac"].as_str().unwrap());
    let ip = |st: &Value| st["ips"][0].as_str().unwrap().to_string();
    // The port of net1 may send from its result's address alone; net2,
    // without IPAM, from any.
    let pinned: Vec<Option<Vec<std::net::IpAddr>>> =
        node.ports().iter().map(|p| p.spec.ips.clone()).collect();
    let own: std::net::IpAddr = ip(st).split('/').next().unwrap().parse().unwrap();
    assert!(
        pinned.contains(&Some(vec![own])) && pinned.contains(&None),
        "{pinned:?}"
    );
    // Each port names its pod attachment, for the node agent.
    let mut attached: Vec<String> = node
        .ports()
        .iter()
        .filter_map(|p| p.spec.pod.as_ref())
        .map(|a| {
            format!(
                "{}/{} {} {} {:?}",
                a.namespace, a.name, a.interface, a.network, a.uid
            )
        })
        .collect();
    attached.sort();
    assert_eq!(
        attached,
        [
            "default/a net1 memif-net Some(\"uid-a\")",
            "default/a net2 vhost-net Some(\"uid-a\")"
        ]
    );
    // (net2 has no IPAM, so no address to send to: any of the subnet.)
    let tx_ip = format!("--tx-ip={},10.90.0.254", own);
    let mut t1 = Testpmd::start(
        &[memif_vdev(0, "client", sock1.to_str().unwrap(), &mac(st))],
        &["--forward-mode=rxonly", &tx_ip],
    );
    let mut t2 = Testpmd::start(
        &[virtio_vdev(
            0,
            node.socket_dir().join("uid-a/net2.sock").to_str().unwrap(),
            false,
            &mac(&a2.network_status),
        )],
        &["--forward-mode=rxonly"],
    );
    wait_for(LIMIT, "links up", || {
        node.ports().iter().all(|p| p.status.link_up).then_some(())
    });
    t1.send_bursts(1);
    assert_eq!(t2.wait_rx(0, 32), 32);
    drop((t1, t2));

    // DEL from Multus's cache (with the cached results as prevResult)
    // removes everything, the device-info file included.
    assert!(m.del(&p).is_empty());
    assert!(node.ports().is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());
    assert!(std::fs::read_dir(node.ipam_dir().join("memif-net"))
        .unwrap()
        .flatten()
        .all(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with("last_reserved_ip")
            || e.file_name() == "lock"));
}

/// What a network selection's `bandwidth` and `ips` become: the pod's
/// port limited as asked (ingress is what the switch sends it), the
/// requested addresses from the delegated IPAM plugin (`host-local`, as
/// the shipped NADs have, and `static`, which takes its addresses from
/// `runtimeConfig.ips` alone), each through the capability its NAD
/// declares; a bad entry refused by name; a NAD that declares neither
/// gets neither.
#[test]
fn a_selections_bandwidth_and_ips_reach_the_port_and_the_ipam_plugin() {
    let _g = serial();
    let node = Node::start();
    let m = multus(&node);
    let caps = |c: &mut Value| {
        c["capabilities"]["bandwidth"] = true.into();
        c["capabilities"]["ips"] = true.into();
    };
    let mut local = nad_config(
        &node,
        json!({"bridge": "br-b", "ipam": node.ipam("10.93.0.0/24")}),
    );
    caps(&mut local);
    let mut fixed = nad_config(&node, json!({"bridge": "br-b", "ipam": {"type": "static"}}));
    caps(&mut fixed);
    let mut plain = nad_config(
        &node,
        json!({"bridge": "br-b", "ipam": node.ipam("10.94.0.0/24")}),
    );
    plain["capabilities"] = json!({"mac": true});
    let (local, fixed, plain) = (
        nad("bw-local", local, None),
        nad("bw-static", fixed, None),
        nad("bw-plain", plain, None),
    );
    let limited = Selection {
        ips: Some(vec!["10.93.0.77/24".into()]),
        bandwidth: Some(multus::Bandwidth {
            ingress_rate: 50_000_000,
            ingress_burst: 5_000_000,
            egress_rate: 20_000_000,
            egress_burst: 2_000_000,
        }),
        ..Default::default()
    };
    let only_ips = Selection {
        ips: Some(vec!["10.95.0.5/24".into()]),
        bandwidth: Some(multus::Bandwidth {
            egress_rate: 1_000_000,
            egress_burst: 100_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    // (Multus puts a selection's `ips` in CNI_ARGS too, capability or
    // not, which host-local reads: a NAD without the capability would
    // still be asked for them.)
    let bandwidth_only = Selection {
        bandwidth: limited.bandwidth,
        ..Default::default()
    };
    let p = pod("bw");
    let added = m
        .add(
            &p,
            &[
                (local.clone(), limited.clone(), None),
                (fixed.clone(), only_ips, None),
                (plain.clone(), bandwidth_only, None),
            ],
        )
        .unwrap_or_else(|e| panic!("ADD: {:?}", e.0));
    // The runtime config as libcni passed it: Multus's four fields.
    assert_eq!(
        added[0].netconf["runtimeConfig"]["bandwidth"],
        json!({"ingressRate": 50_000_000, "ingressBurst": 5_000_000, "egressRate": 20_000_000, "egressBurst": 2_000_000})
    );
    assert!(added[2]
        .netconf
        .get("runtimeConfig")
        .is_none_or(|r| r.get("bandwidth").is_none()));
    let ips: Vec<&str> = added
        .iter()
        .map(|a| a.network_status["ips"][0].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(
        ips[0], "10.93.0.77",
        "host-local gave the requested address"
    );
    assert_eq!(ips[1], "10.95.0.5", "static gave the requested address");
    assert!(ips[2].starts_with("10.94.0."), "{ips:?}");
    // The ports, as the switch has them.
    let ports = node.ports();
    let port = |ifname: &str| {
        let sock = node.socket_dir().join(format!("uid-bw/{ifname}.sock"));
        ports
            .iter()
            .find(|p| p.socket() == sock.to_str().unwrap())
            .unwrap_or_else(|| panic!("no port on {sock:?}: {ports:?}"))
            .spec
            .clone()
    };
    let l = port("net1").rate_limit.expect("net1's limits");
    assert_eq!(
        l.tx.and_then(|m| m.bits_bucket()),
        Some((50_000_000, 5_000_000))
    );
    assert_eq!(
        l.rx.and_then(|m| m.bits_bucket()),
        Some((20_000_000, 2_000_000))
    );
    let l = port("net2").rate_limit.expect("net2's limits");
    assert!(l.tx.is_none());
    assert_eq!(
        l.rx.and_then(|m| m.bits_bucket()),
        Some((1_000_000, 100_000))
    );
    assert!(
        port("net3").rate_limit.is_none(),
        "its NAD declares no bandwidth"
    );
    // The port's address is the one asked for, pinned.
    assert_eq!(port("net2").ips, Some(vec!["10.95.0.5".parse().unwrap()]));
    // CHECK with the ADD's netconf and its result passes; with another
    // bandwidth it fails, naming both.
    let mut check = added[0].netconf.clone();
    check["prevResult"] = added[0].result.clone();
    ok("CHECK", &p.sandbox, "net1", &added[0].cni_args, &check);
    check["runtimeConfig"]["bandwidth"]["egressRate"] = 30_000_000.into();
    let (good, e) = cni("CHECK", &p.sandbox, "net1", &added[0].cni_args, &check);
    assert!(!good, "{e}");
    assert!(
        e["msg"]
            .as_str()
            .is_some_and(|m| m.contains("egress rate=20M")
                && m.contains("not ingress rate=50M,burst=5M, egress rate=30M")),
        "{e}"
    );
    assert!(m.del(&p).is_empty());
    assert!(node.ports().is_empty());

    // A rate without its burst: refused, named, as the reference plugin
    // refuses it, and nothing left behind.
    let bad = Selection {
        bandwidth: Some(multus::Bandwidth {
            ingress_rate: 1_000_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    let q = pod("bad-bw");
    let e = m
        .add(&q, &[(local, bad, None)])
        .expect_err("a rate without a burst");
    let text = error_text(&e.0);
    assert!(
        text.contains(
            "runtimeConfig.bandwidth.ingressBurst: if rate is set, burst must also be set"
        ),
        "{text}"
    );
    assert!(node.ports().is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());
}

#[test]
fn a_device_plugin_network_without_its_device_info_fails_add() {
    let _g = serial();
    let node = Node::start();
    let m = multus(&node);
    let net = nad(
        "dp-net",
        nad_config(&node, json!({"ipam": node.ipam("10.91.0.0/24")})),
        Some("switchyard.io/memif"),
    );
    let p = pod("b");
    // The kubelet allocated memif-9, but no device plugin wrote its file.
    let kubelet = PodResourcesApi::start(&pod_resources_socket(&node));
    kubelet.allocate("default", "b", "app", "switchyard.io/memif", &["memif-9"]);
    let mut m = m;
    m.pod_resources = Some(kubelet.socket.clone());
    let e = m
        .add(&p, &[(net.clone(), Selection::default(), None)])
        .unwrap_err()
        .0;
    // The plugin's own answer (run as Multus ran it): try again later, for
    // want of the device plugin's file for memif-9 in deviceInfoDir.
    let own = plugin_add_error(&m, &p, &net, Some("memif-9"));
    assert_eq!(own["code"], 11, "{own}");
    let msg = own["msg"].as_str().unwrap();
    assert!(
        msg.contains("memif-9") && msg.contains("deviceInfoDir"),
        "{msg}"
    );
    // What the runtime gets from Multus: its code 999, the plugin's error
    // whole inside its message.
    assert_eq!(e, multus_add_error(&p, "dp-net", &error_text(&own)));
    assert!(node.ports().is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());

    // Once the device plugin's file is there, the same ADD takes its socket
    // and role.
    let dev_dir = node.socket_dir().join("devices/memif-9");
    std::fs::create_dir_all(&dev_dir).unwrap();
    let sock = dev_dir.join("memif.sock");
    let dp = node
        .dir
        .path()
        .join("devinfo/dp/switchyard.io-memif-memif-9-device.json");
    std::fs::create_dir_all(dp.parent().unwrap()).unwrap();
    std::fs::write(
        &dp,
        json!({"type": "memif", "version": "1.1.0",
               "memif": {"role": "master", "mode": "ethernet", "path": sock}})
        .to_string(),
    )
    .unwrap();
    let added = m
        .add(&p, &[(net, Selection::default(), None)])
        .unwrap_or_else(|e| panic!("ADD: {:?}", e.0));
    // The plugin used the allocated device's socket, in its role.
    assert_eq!(
        added[0].result["interfaces"][0]["socketPath"],
        sock.display().to_string()
    );
    let port = &node.ports()[0];
    assert_eq!(
        port.role(),
        "slave",
        "the pod is master: the switch connects"
    );
    assert_eq!(
        added[0].network_status["device-info"]["memif"]["path"],
        sock.display().to_string()
    );
    assert!(m.del(&p).is_empty());
    assert!(node.ports().is_empty());
    assert!(
        dp.exists(),
        "the device plugin's file is the device plugin's"
    );
}

/// Which of `pods` received how many frames.
fn received(pods: &mut [&mut Testpmd]) -> Vec<u64> {
    pods.iter_mut().map(|p| p.port_stats(0).0).collect()
}

#[test]
fn networks_on_one_bridge_are_isolated_unless_a_trunk_asks() {
    let _g = serial();
    let node = Node::start();
    let untagged = node.netconf("plain", json!({"bridge": "shared"}));
    let vlan = node.netconf("v200", json!({"bridge": "shared", "vlan": 200}));
    let trunk = node.netconf("t200", json!({"bridge": "shared", "trunk": [200]}));
    let mut pods = Vec::new();
    for (name, conf) in [
        ("a1", &untagged),
        ("a2", &untagged),
        ("b", &vlan),
        ("t", &trunk),
    ] {
        let r = ok(
            "ADD",
            &format!("{name:0>64}"),
            "net1",
            &pod_args(name),
            conf,
        );
        let sock = r["interfaces"][0]["socketPath"]
            .as_str()
            .unwrap()
            .to_string();
        let mac = format!("mac={}", r["interfaces"][0]["mac"].as_str().unwrap());
        let mut t = Testpmd::start(
            &[memif_vdev(0, "client", &sock, &mac)],
            &["--forward-mode=rxonly"],
        );
        t.cmd("set verbose 1");
        pods.push(t);
    }
    wait_for(LIMIT, "links up", || {
        let p = node.ports();
        (p.len() == 4 && p.iter().all(|p| p.status.link_up)).then_some(())
    });
    let [a1, a2, b, t] = &mut pods[..] else {
        unreachable!()
    };
    // An untagged pod floods: only its own network hears it.
    a1.send_bursts(1);
    assert_eq!(a2.wait_rx(0, 32), 32);
    assert_eq!(
        testpmd::settled("the other pods' counters", || received(&mut [b, t])),
        [0, 0]
    );
    // The VLAN pod: the trunk that lists 200 gets it tagged; the untagged
    // network does not.
    b.send_bursts(1);
    assert_eq!(t.wait_rx(0, 32), 32);
    assert!(t.output().contains("type=0x8100"), "tagged on the trunk");
    assert_eq!(
        testpmd::settled("the untagged pods' counters", || received(&mut [a1, a2])),
        [0, 32]
    );
    // The switch dropped what the pods' networks do not carry.
    let ports = node.ports();
    let port = |pod: &str| {
        ports
            .iter()
            .find(|p| p.socket().contains(&format!("/{pod}/")))
            .unwrap()
            .clone()
    };
    assert_eq!(
        (port("b").spec.vlan, port("b").spec.trunk.clone()),
        (Some(200), None)
    );
    assert_eq!(port("a1").spec.vlan, None);
    assert_eq!(port("a1").spec.trunk, None);
    assert_eq!(port("t").spec.trunk.as_ref().unwrap().to_string(), "200");
    drop(pods);
    for (name, conf) in [
        ("a1", &untagged),
        ("a2", &untagged),
        ("b", &vlan),
        ("t", &trunk),
    ] {
        ok(
            "DEL",
            &format!("{name:0>64}"),
            "net1",
            &pod_args(name),
            conf,
        );
    }
    assert!(node.ports().is_empty());
}

#[test]
fn non_root_pods_use_sockets_of_their_group() {
    let _g = serial();
    let node = Node::start();
    // The node's directories are traversable, as /var/run is.
    std::fs::set_permissions(node.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = 65534;
    let memif = node.netconf("nr-memif", json!({"bridge": "nr", "socketGroup": nobody}));
    let vhost = node.netconf(
        "nr-vhost",
        json!({"bridge": "nr", "socketGroup": nobody, "interfaceType": "vhost-user"}),
    );
    let rm = ok("ADD", &"7".repeat(64), "net1", &pod_args("nr-a"), &memif);
    let rv = ok("ADD", &"8".repeat(64), "net1", &pod_args("nr-b"), &vhost);
    let sm = rm["interfaces"][0]["socketPath"]
        .as_str()
        .unwrap()
        .to_string();
    let sv = rv["interfaces"][0]["socketPath"]
        .as_str()
        .unwrap()
        .to_string();
    for s in [&sm, &sv] {
        let meta = std::fs::metadata(s).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, nobody), "{s}");
        let dir = std::fs::metadata(Path::new(s).parent().unwrap()).unwrap();
        assert_eq!((dir.mode() & 0o777, dir.gid()), (0o770, nobody), "{s}");
    }
    // Both pods run as nobody:nogroup.
    let ids = Some((nobody, nobody));
    let mac = |r: &Value| format!("mac={}", r["interfaces"][0]["mac"].as_str().unwrap());
    let mut a = Testpmd::start_as(
        ids,
        &[memif_vdev(0, "client", &sm, &mac(&rm))],
        &["--forward-mode=rxonly"],
    );
    let mut b = Testpmd::start_as(
        ids,
        &[virtio_vdev(0, &sv, false, &mac(&rv))],
        &["--forward-mode=rxonly"],
    );
    wait_for(LIMIT, "links up", || {
        node.ports().iter().all(|p| p.status.link_up).then_some(())
    });
    a.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32);
    b.send_bursts(1);
    assert_eq!(a.wait_rx(0, 32), 32);
    drop((a, b));
    ok("DEL", &"7".repeat(64), "net1", &pod_args("nr-a"), &memif);
    ok("DEL", &"8".repeat(64), "net1", &pod_args("nr-b"), &vhost);
    assert!(node.ports().is_empty());
}

/// A recording IPAM plugin that speaks CNI 1.1 (Debian 12's host-local
/// stops at 1.0.0): it logs each command and its stdin.
fn recording_ipam(dir: &Path) -> PathBuf {
    let bin = dir.join("rec-ipam");
    let log = dir.join("rec-ipam.log");
    std::fs::write(
        &bin,
        format!(
            r#"#!/bin/sh
in=$(cat)
echo "$CNI_COMMAND $in" >> {log}
case "$CNI_COMMAND" in
  VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}' ;;
  ADD) echo '{{"cniVersion":"1.1.0","ips":[{{"address":"10.92.0.5/24"}}]}}' ;;
esac
"#,
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn verbs_follow_the_netconf_version_and_reach_ipam() {
    let _g = serial();
    let node = Node::start();
    let c = "c".repeat(64);
    // CHECK is 0.4.0 on; STATUS and GC 1.1.0 on.
    for (verb, version) in [("CHECK", "0.3.1"), ("STATUS", "1.0.0"), ("GC", "1.0.0")] {
        let conf = node.netconf("v", json!({"cniVersion": version}));
        let (good, v) = cni(verb, &c, "net1", "", &conf);
        assert!(!good);
        assert_eq!(v["code"], 1, "{verb} {version}: {v}");
        assert!(v["msg"].as_str().unwrap().contains(verb), "{v}");
    }

    // An IPAM plugin that speaks 1.1 gets STATUS and GC (with the valid
    // attachments, so it frees leases this plugin has no record of);
    // host-local (1.0.0) does not, and STATUS still succeeds.
    let dir = node.dir.path().join("ipam-bin");
    std::fs::create_dir_all(&dir).unwrap();
    recording_ipam(&dir);
    let conf = node.netconf("rec", json!({"ipam": {"type": "rec-ipam"}}));
    let run = |verb: &str, conf: &Value| {
        exec::exec_cni(
            Path::new(cni_bin()),
            verb,
            &c,
            "net1",
            "",
            &dir.display().to_string(),
            conf,
        )
    };
    let (good, r) = run("ADD", &conf);
    assert!(good, "{r}");
    assert_eq!(r["ips"][0]["address"], "10.92.0.5/24");
    assert!(run("STATUS", &conf).0);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": c, "ifname": "net1"}]);
    assert!(run("GC", &gc).0);
    let log = std::fs::read_to_string(dir.join("rec-ipam.log")).unwrap();
    let verbs: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        verbs,
        ["ADD", "VERSION", "STATUS", "VERSION", "GC"],
        "{log}"
    );
    let gc_in: Value =
        serde_json::from_str(log.lines().last().unwrap().split_once(' ').unwrap().1).unwrap();
    assert_eq!(
        gc_in["cni.dev/valid-attachments"][0]["containerID"],
        c.as_str()
    );
    assert_eq!(gc_in["cniVersion"], "1.1.0");
    let hl = node.netconf("hl", json!({"ipam": node.ipam("10.93.0.0/24")}));
    assert!(cni("STATUS", "", "", "", &hl).0);
    assert!(run("DEL", &conf).0);

    // A previous plugin's result passes through whole.
    let mut chained = node.netconf("chain", json!({}));
    chained["prevResult"] = json!({
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mac": "02:11:22:33:44:55", "mtu": 9000,
                        "sandbox": "/var/run/netns/x", "pciID": "0000:01:00.1"}],
        "ips": [{"address": "10.0.0.2/24", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "mtu": 1400}],
    });
    let r = ok("ADD", &c, "net2", "", &chained);
    assert_eq!(r["interfaces"][0], chained["prevResult"]["interfaces"][0]);
    assert_eq!(r["routes"][0]["mtu"], 1400);
    assert_eq!(r["interfaces"][1]["name"], "net2");
    ok("DEL", &c, "net2", "", &chained);
}

/// Which netconf `cniVersion` each Multus can take: the result is parsed by
/// the libcni it links (see `MultusVersion`), so a version its libcni
/// cannot create fails the attachment, and the networks added before it
/// are deleted. The shipped NADs say 0.4.0, which every one parses.
#[test]
fn each_multus_parses_the_result_versions_its_libcni_knows() {
    let _g = serial();
    let node = Node::start();
    for (version, works) in [
        (MultusVersion::V3_9, ["0.3.1", "0.4.0"].as_slice()),
        (MultusVersion::V4_0, ["0.3.1", "0.4.0", "1.0.0"].as_slice()),
        (
            MultusVersion::V4_1,
            ["0.3.1", "0.4.0", "1.0.0", "1.1.0"].as_slice(),
        ),
        (
            MultusVersion::V4_3,
            ["0.3.1", "0.4.0", "1.0.0", "1.1.0"].as_slice(),
        ),
    ] {
        let m = multus_version(&node, version);
        for cni_version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            let conf = nad_config(&node, json!({"cniVersion": cni_version}));
            let p = pod(&format!("v{}", cni_version.replace('.', "")));
            let first = nad(
                "first",
                nad_config(&node, json!({"cniVersion": "0.4.0"})),
                None,
            );
            let got = m.add(
                &p,
                &[
                    (first, Selection::default(), None),
                    (nad("versioned", conf, None), Selection::default(), None),
                ],
            );
            if works.contains(&cni_version) {
                let added = got.unwrap_or_else(|e| panic!("{version:?} {cni_version}: {:?}", e.0));
                assert_eq!(added[1].result["cniVersion"], cni_version);
                assert_eq!(added[1].network_status["interface"], "net2");
                assert_eq!(node.ports().len(), 2);
                assert!(m.del(&p).is_empty());
            } else {
                let e = got.unwrap_err().0;
                assert_eq!(
                    e,
                    multus_add_error(
                        &p,
                        "versioned",
                        &format!("unsupported CNI result version {cni_version:?}")
                    ),
                    "{version:?}"
                );
            }
            assert!(node.ports().is_empty(), "{version:?} {cni_version}");
        }
    }
}

/// Multus runs the binary named by the netconf's `type` from its binDir
/// (libcni `FindInPath`): a plugin installed under another name is not
/// found, and the ADD fails before anything is made.
#[test]
fn multus_finds_the_plugin_by_type_only() {
    let _g = serial();
    let node = Node::start();
    let mut m = multus(&node);
    let elsewhere = node.dir.path().join("other-bin");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(cni_bin(), elsewhere.join("switchyard-cni")).unwrap();
    m.bin_dir = elsewhere.clone();
    let e = m
        .add(
            &pod("t"),
            &[(
                nad("t-net", nad_config(&node, json!({})), None),
                Selection::default(),
                None,
            )],
        )
        .unwrap_err()
        .0;
    // libcni's `FindInPath` error, in Multus's.
    assert_eq!(
        e,
        multus_add_error(
            &pod("t"),
            "t-net",
            &format!(
                "failed to find plugin \"switchyard\" in path [{} /nonexistent {HOST_LOCAL_DIR}]",
                elsewhere.display()
            )
        )
    );
    assert!(node.ports().is_empty());

    // DEL looks it up the same way: the plugin gone after ADD, Multus's DEL
    // fails with one error of its own around libcni's (`DelegateDel`'s
    // words, "delegateDel" before v4). The plugin itself then deletes.
    let found = multus(&node).bin_dir;
    let p = pod("t");
    let net = nad(
        "t-net",
        nad_config(&node, json!({"cniVersion": "0.4.0"})),
        None,
    );
    for (version, del) in [
        (MultusVersion::V3_9, "delegateDel"),
        (MultusVersion::V4_1, "DelegateDel"),
    ] {
        m.version = version;
        m.bin_dir = found.clone();
        m.add(&p, &[(net.clone(), Selection::default(), None)])
            .unwrap_or_else(|e| panic!("{version:?}: ADD: {:?}", e.0));
        assert_eq!(node.ports().len(), 1);
        m.bin_dir = elsewhere.clone();
        let errs: Vec<Value> = m.del(&p).into_iter().map(|e| e.0).collect();
        assert_eq!(
            errs,
            [json!({"code": 999, "msg": format!(
                "{del}: error invoking DelegateDel - \"switchyard\": error in getting result \
                 from DelNetwork: failed to find plugin \"switchyard\" in path [{} /nonexistent \
                 {HOST_LOCAL_DIR}]",
                elsewhere.display()
            )})],
            "{version:?}"
        );
        let (conf, ifname) = m.add_input(&p, &net, &Selection::default(), None, 0);
        ok("DEL", &p.sandbox, &ifname, &Multus::cni_args(&p), &conf);
        assert!(node.ports().is_empty(), "{version:?}");
    }
}

/// A `deviceID` written into a NAD's config (by whoever may create NADs)
/// names a device only the pod the kubelet allocated it to may use: the
/// plugin asks the kubelet's Pod Resources API, and refuses another pod.
#[test]
fn a_netconf_device_id_of_another_pods_device_is_refused() {
    let _g = serial();
    let node = Node::start();
    let mut m = multus(&node);
    let kubelet = PodResourcesApi::start(&pod_resources_socket(&node));
    m.pod_resources = Some(kubelet.socket.clone());
    // The device plugin's file for memif-3, which the kubelet allocated to
    // pod "victim".
    let dev_dir = node.socket_dir().join("devices/memif-3");
    std::fs::create_dir_all(&dev_dir).unwrap();
    let dp = node
        .dir
        .path()
        .join("devinfo/dp/switchyard.io-memif-memif-3-device.json");
    std::fs::create_dir_all(dp.parent().unwrap()).unwrap();
    std::fs::write(
        &dp,
        json!({"type": "memif", "version": "1.1.0",
               "memif": {"role": "slave", "mode": "ethernet", "path": dev_dir.join("memif.sock")}})
        .to_string(),
    )
    .unwrap();
    kubelet.allocate(
        "default",
        "victim",
        "app",
        "switchyard.io/memif",
        &["memif-3"],
    );
    kubelet.allocate(
        "default",
        "tenant",
        "app",
        "switchyard.io/memif",
        &["memif-4"],
    );
    // A NAD without a resource whose config names the victim's device.
    let stolen = nad(
        "stolen",
        nad_config(&node, json!({"deviceID": "memif-3"})),
        None,
    );
    let e = m
        .add(
            &pod("tenant"),
            &[(stolen.clone(), Selection::default(), None)],
        )
        .unwrap_err()
        .0;
    // The plugin's own answer (run as Multus ran it): invalid config.
    let own = plugin_add_error(&m, &pod("tenant"), &stolen, None);
    assert_eq!(own["code"], 7, "{own}");
    assert_eq!(
        own["msg"],
        "deviceID: pod default/tenant holds no device \"memif-3\" of switchyard.io-memif (kubelet pod resources: switchyard.io/memif=memif-4); a deviceID comes from the kubelet's allocation, not from a netconf"
    );
    // Through Multus: its code 999, the plugin's error whole in its message.
    assert_eq!(
        e,
        multus_add_error(&pod("tenant"), "stolen", &error_text(&own))
    );
    assert!(node.ports().is_empty());
    // The pod that holds it may.
    let added = m
        .add(&pod("victim"), &[(stolen, Selection::default(), None)])
        .unwrap_or_else(|e| panic!("{:?}", e.0));
    assert_eq!(
        added[0].result["interfaces"][0]["socketPath"],
        dev_dir.join("memif.sock").display().to_string()
    );
    assert!(m.del(&pod("victim")).is_empty());
    // The kubelet away: the device cannot be vouched for; retry later.
    drop(kubelet);
    m.pod_resources = None;
    let again = nad(
        "again",
        nad_config(&node, json!({"deviceID": "memif-3"})),
        None,
    );
    let e = m
        .add(
            &pod("victim"),
            &[(again.clone(), Selection::default(), None)],
        )
        .unwrap_err()
        .0;
    let own = plugin_add_error(&m, &pod("victim"), &again, None);
    assert_eq!(own["code"], 11, "{own}");
    assert_eq!(
        e,
        multus_add_error(&pod("victim"), "again", &error_text(&own))
    );
    assert!(node.ports().is_empty());
}

/// A network function's two memif networks on one socket (`memif.socket`),
/// as VPP and DPDK attach several interfaces over one: through Multus with
/// the device plugin's devices (the socket is the first network's device's),
/// then without devices (`<pod dir>/<name>.sock`), where DEL takes the
/// socket with the last network that uses it.
#[test]
fn a_pods_memif_networks_share_one_socket_by_id() {
    let _g = serial();
    let node = Node::start();
    let mut m = multus(&node);
    let kubelet = PodResourcesApi::start(&pod_resources_socket(&node));
    m.pod_resources = Some(kubelet.socket.clone());
    let (north, south) = ["north", "south"]
        .map(|n| {
            let id = if n == "north" { 0 } else { 1 };
            nad(
                &format!("nf-{n}"),
                nad_config(&node, json!({"memif": {"socket": "nf", "id": id}})),
                Some("switchyard.io/memif"),
            )
        })
        .into();
    // The device plugin's devices, as it writes them: one socket each.
    kubelet.allocate(
        "default",
        "nf",
        "app",
        "switchyard.io/memif",
        &["memif-1", "memif-2"],
    );
    let dev_sock = |id: &str| node.socket_dir().join(format!("devices/{id}/memif.sock"));
    for id in ["memif-1", "memif-2"] {
        std::fs::create_dir_all(dev_sock(id).parent().unwrap()).unwrap();
        let dp = node
            .dir
            .path()
            .join(format!("devinfo/dp/switchyard.io-memif-{id}-device.json"));
        std::fs::create_dir_all(dp.parent().unwrap()).unwrap();
        std::fs::write(
            &dp,
            json!({"type": "memif", "version": "1.1.0",
                   "memif": {"role": "slave", "mode": "ethernet", "path": dev_sock(id)}})
            .to_string(),
        )
        .unwrap();
    }
    let p = pod("nf");
    let added = m
        .add(
            &p,
            &[
                (north, Selection::default(), None),
                (south, Selection::default(), None),
            ],
        )
        .unwrap_or_else(|e| panic!("ADD: {:?}", e.0));
    // Both networks name the first device's socket, in the result and in
    // network-status; the switch serves interfaces 0 and 1 there.
    let shared = dev_sock("memif-1").display().to_string();
    for a in &added {
        assert_eq!(a.result["interfaces"][0]["socketPath"], shared);
        assert_eq!(a.network_status["device-info"]["memif"]["path"], shared);
    }
    let ids = |node: &Node| -> Vec<(String, Option<u32>)> {
        node.ports()
            .iter()
            .map(|p| match &p.spec.kind {
                switchyard_api::KindSpec::Memif(m) => (p.socket(), m.id),
                k => panic!("{k:?}"),
            })
            .collect()
    };
    let mut got = ids(&node);
    got.sort();
    assert_eq!(got, [(shared.clone(), Some(0)), (shared.clone(), Some(1))]);
    // The application attaches both interfaces by id; each one's frames
    // reach the other.
    let mac = |a: &multus::Added, id: u32| {
        format!("id={id},mac={}", a.network_status["mac"].as_str().unwrap())
    };
    let mut t = Testpmd::start(
        &[
            memif_vdev(0, "client", &shared, &mac(&added[0], 0)),
            memif_vdev(1, "client", &shared, &mac(&added[1], 1)),
        ],
        &["--forward-mode=rxonly"],
    );
    wait_for(LIMIT, "both interfaces up", || {
        let p = node.ports();
        (p.len() == 2 && p.iter().all(|p| p.status.link_up)).then_some(())
    });
    t.send_bursts(1);
    assert_eq!(t.wait_rx(0, 32), 32);
    assert_eq!(t.wait_rx(1, 32), 32);
    t.pause();
    assert!(m.del(&p).is_empty());
    assert!(node.ports().is_empty());
    assert!(!dev_sock("memif-1").exists());
    drop(t);

    // Without devices: `<pod dir>/nf.sock`. The same id twice is the
    // switch's refusal; DEL leaves the socket to the network still on it.
    let conf = |ifname: &str, id: u32| {
        node.netconf(
            &format!("nf-{ifname}"),
            json!({"memif": {"socket": "nf", "id": id}}),
        )
    };
    let (c, args) = (&format!("{:0>64}", "nf2"), &pod_args("uid-nf2"));
    let sock = node.socket_dir().join("uid-nf2/nf.sock");
    for (ifname, id) in [("net1", 0), ("net2", 1)] {
        let r = ok("ADD", c, ifname, args, &conf(ifname, id));
        assert_eq!(r["interfaces"][0]["socketPath"], sock.display().to_string());
    }
    let (good, e) = cni("ADD", c, "net3", args, &conf("net3", 1));
    assert!(!good, "{e}");
    assert_eq!(e["code"], 100, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("port.id"), "{e}");
    assert_eq!(node.ports().len(), 2);
    ok("DEL", c, "net1", args, &conf("net1", 0));
    assert!(sock.exists(), "net2 still uses the socket");
    assert_eq!(ids(&node), [(sock.display().to_string(), Some(1))]);
    ok("DEL", c, "net2", args, &conf("net2", 1));
    assert!(node.ports().is_empty());
    assert!(!sock.exists());
    assert!(!node.socket_dir().join("uid-nf2").exists());
}

/// Day two: pods come and go through Multus (ADD and DEL as the kubelet
/// asks them, with host-local IPAM) and an operator's client adds and
/// deletes ports, while the switch is taken over 20 times and restarted 5
/// times. No call fails (a call the switch did not take is asked again of
/// the next one; a restart costs a latency), and at the end the switch's
/// ports are exactly the CNI's records and the operator's ports.
#[test]
fn cni_and_api_calls_across_takeovers_and_restarts_all_succeed() {
    use churn::PortChurn;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    use switchyard_api::{Client, Request};

    let _g = serial();
    let mut node = Node::start();
    let m = multus(&node);
    let net = nad(
        "day-two",
        nad_config(
            &node,
            json!({"bridge": "br-d", "ipam": node.ipam("10.91.0.0/24"),
                   "memif": {"role": "slave"}}),
        ),
        None,
    );
    let control = node.control();
    let op_dir = node.dir.path().join("operator");
    std::fs::create_dir_all(&op_dir).unwrap();
    Client::connect(&control)
        .unwrap()
        .call(&Request::BridgeAdd {
            name: "br-d".into(),
        })
        .unwrap();
    let stop = AtomicBool::new(false);
    let (pods_left, (pod_calls, pod_errors), (op_calls, op_errors, op_ports)) =
        std::thread::scope(|s| {
            let pods = s.spawn(|| {
                let (mut calls, mut errors, mut up) = (0u32, Vec::new(), HashSet::new());
                let mut i = 0u32;
                while !stop.load(Ordering::Acquire) {
                    let p = pod(&format!("d{}", i % 4));
                    i += 1;
                    calls += 1;
                    if up.remove(&p.name) {
                        let failed = m.del(&p);
                        if !failed.is_empty() {
                            errors.push(format!("DEL {}: {failed:?}", p.name));
                        }
                    } else {
                        match m.add(&p, &[(net.clone(), Selection::default(), None)]) {
                            Ok(_) => {
                                up.insert(p.name.clone());
                            }
                            Err(e) => errors.push(format!("ADD {}: {:?}", p.name, e.0)),
                        }
                    }
                }
                (up, (calls, errors))
            });
            let ops = s.spawn(|| {
                let mut c = Client::lazy(&control);
                let mut churn = PortChurn::new("op", op_dir.clone(), "br-d");
                let (mut calls, mut errors) = (0u32, Vec::new());
                while !stop.load(Ordering::Acquire) {
                    let (name, req) = churn.next();
                    calls += 1;
                    match c.call(&req) {
                        Ok(_) => churn.done(name),
                        Err(e) => errors.push(format!("{req:?}: {e}")),
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                (calls, errors, churn.held())
            });
            for round in 0..25 {
                std::thread::sleep(Duration::from_millis(200));
                if round % 5 == 4 {
                    node.stop();
                    node.spawn();
                } else {
                    node.takeover();
                }
            }
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Release);
            let (up, pod) = pods.join().unwrap();
            (up, pod, ops.join().unwrap())
        });
    for (who, calls, errors) in [
        ("pods (Multus ADD/DEL)", pod_calls, &pod_errors),
        ("operator (port add/del)", op_calls, &op_errors),
    ] {
        assert!(calls >= 25, "{who}: only {calls} calls");
        assert!(
            errors.is_empty(),
            "{who}: {} of {calls} calls failed:\n{}",
            errors.len(),
            errors.join("\n")
        );
    }
    eprintln!(
        "{pod_calls} Multus calls and {op_calls} port calls across 20 takeovers and 5 restarts"
    );
    // The switch's ports: the CNI's records (one per pod still up) and the
    // operator's.
    let records: HashSet<String> = walk(&node.socket_dir().join(switchyard_api::CNI_RECORDS_DIR))
        .iter()
        .filter_map(|f| {
            serde_json::from_slice::<switchyard_cni::plugin::Record>(&std::fs::read(f).ok()?).ok()
        })
        .map(|r| r.port)
        .collect();
    assert_eq!(records.len(), pods_left.len(), "{records:?} {pods_left:?}");
    let ports: HashSet<String> = node.ports().into_iter().map(|p| p.spec.name).collect();
    let expected: HashSet<String> = records.iter().cloned().chain(op_ports).collect();
    assert_eq!(
        ports, expected,
        "the switch's ports, the CNI's records and the operator's"
    );
    for name in pods_left {
        assert!(m.del(&pod(&name)).is_empty());
    }
    assert!(node.ports().iter().all(|p| p.spec.name.starts_with("op")));
    assert_eq!(leftovers(&node), Vec::<String>::new());
}
