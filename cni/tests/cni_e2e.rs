//! End-to-end: the real `switchyard-cni` binary, with CNI environment and
//! stdin as a runtime passes them, against a real `switchyard` daemon, with
//! IPAM delegated to the real `host-local` plugin and real DPDK testpmd
//! "pods" on the sockets named by the device-info files.

#[path = "support/exec.rs"]
mod exec;
#[path = "support/node.rs"]
mod node;
#[path = "../../dataplane/tests/common/testpmd.rs"]
mod testpmd;

use std::path::Path;
use std::time::Duration;

use node::*;
use serde_json::{json, Value};
use switchyard_api::PortStats;
use switchyard_api::{Client, Request};
use testpmd::{serial, wait_for, Testpmd};

#[test]
fn two_pods_on_two_networks_pass_traffic_and_leave_nothing_behind() {
    let _g = serial();
    let mut node = Node::start();
    let memif_net = node.netconf(
        "memif-net",
        json!({"bridge": "br-memif", "interfaceType": "memif", "memif": {"role": "slave"},
               "ipam": node.ipam("10.77.0.0/24")}),
    );
    let vhost_net = node.netconf(
        "vhost-net",
        json!({"bridge": "br-vhost", "vlan": 100, "interfaceType": "vhost-user",
               "vhostUser": {"mode": "client"}}),
    );
    let (ca, cb) = ("a".repeat(64), "b".repeat(64));
    let (ua, ub) = (pod_args("uid-a"), pod_args("uid-b"));

    // Pod A and B, one memif and one vhost-user interface each.
    let mut results = Vec::new();
    for (c, u, pod) in [(&ca, &ua, "a"), (&cb, &ub, "b")] {
        let r1 = ok(
            "ADD",
            c,
            "net1",
            u,
            &with_devinfo(&memif_net, &node.devinfo(&format!("{pod}-net1.json"))),
        );
        let r2 = ok(
            "ADD",
            c,
            "net2",
            u,
            &with_devinfo(&vhost_net, &node.devinfo(&format!("{pod}-net2.json"))),
        );
        results.push((r1, r2));
    }
    let (ra1, _) = &results[0];
    assert_eq!(ra1["cniVersion"], "1.1.0");
    let iface = &ra1["interfaces"][0];
    assert_eq!(iface["name"], "net1");
    assert!(iface["mac"].as_str().unwrap().starts_with("02:"));
    let sock_a1 = iface["socketPath"].as_str().unwrap().to_string();
    assert_eq!(
        sock_a1,
        node.socket_dir()
            .join("uid-a")
            .join("net1.sock")
            .display()
            .to_string()
    );
    assert!(
        ra1["ips"][0]["address"]
            .as_str()
            .unwrap()
            .starts_with("10.77.0."),
        "{ra1}"
    );
    assert_eq!(ra1["ips"][0]["interface"], 0);
    let mode = std::fs::metadata(node.socket_dir().join("uid-a")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700
    );

    // Device-info files speak of the pod's role.
    let d: Value =
        serde_json::from_slice(&std::fs::read(node.devinfo("a-net1.json")).unwrap()).unwrap();
    assert_eq!(d["type"], "memif");
    assert_eq!(d["version"], "1.1.0");
    assert_eq!(d["memif"]["role"], "slave");
    assert_eq!(d["memif"]["mode"], "ethernet");
    assert_eq!(d["memif"]["path"], sock_a1.as_str());
    let dv: Value =
        serde_json::from_slice(&std::fs::read(node.devinfo("b-net2.json")).unwrap()).unwrap();
    assert_eq!(dv["type"], "vhost-user");
    assert_eq!(dv["vhost-user"]["mode"], "client");

    // The switch ports: opposite roles, right bridges and VLAN.
    let ports = node.ports();
    assert_eq!(ports.len(), 4);
    let p = ports.iter().find(|p| p.socket() == sock_a1).unwrap();
    assert_eq!(
        (p.role(), p.spec.bridge.as_deref()),
        ("master", Some("br-memif"))
    );
    let pv = ports
        .iter()
        .find(|p| p.socket().ends_with("uid-b/net2.sock"))
        .unwrap();
    assert_eq!((pv.role(), pv.spec.vlan), ("server", Some(100)));

    // The pods' applications use the sockets named in their device-info.
    let path_of = |f: &str, sect: &str| -> String {
        let d: Value = serde_json::from_slice(&std::fs::read(node.devinfo(f)).unwrap()).unwrap();
        d[sect]["path"].as_str().unwrap().to_string()
    };
    // ... with the MAC and the address their results report, which the
    // switch pins to their ports (netconf `pin` and `pinIps` default to
    // `result`): the memif network has IPAM, its frames go from the pod's
    // own address.
    let mac_of = |r: &Value| r["interfaces"][0]["mac"].as_str().unwrap().to_string();
    let ip_of = |r: &Value| {
        let a = r["ips"][0]["address"].as_str().unwrap();
        a.split('/').next().unwrap().to_string()
    };
    let memif = |f: &str, r: &Value, to: &Value| {
        Testpmd::start(
            &[format!(
                "net_memif0,role=client,socket={},socket-abstract=no,mac={}",
                path_of(f, "memif"),
                mac_of(r)
            )],
            &[
                "--forward-mode=rxonly",
                &format!("--tx-ip={},{}", ip_of(r), ip_of(to)),
            ],
        )
    };
    let rxonly = ["--forward-mode=rxonly"];
    let mut a1 = memif("a-net1.json", &results[0].0, &results[1].0);
    let mut b1 = memif("b-net1.json", &results[1].0, &results[0].0);
    let virtio = |f: &str, r: &Value| {
        Testpmd::start(
            &[format!(
                "net_virtio_user0,path={},mac={}",
                path_of(f, "vhost-user"),
                mac_of(r)
            )],
            &rxonly,
        )
    };
    let mut a2 = virtio("a-net2.json", &results[0].1);
    let mut b2 = virtio("b-net2.json", &results[1].1);
    wait_for(Duration::from_secs(20), "all links up", || {
        node.ports().iter().all(|p| p.status.link_up).then_some(())
    });
    a1.send_bursts(1);
    wait_for(Duration::from_secs(15), "memif frames at B", || {
        (b1.port_stats(0).0 >= 32).then_some(())
    });
    b2.send_bursts(1);
    wait_for(Duration::from_secs(15), "vhost-user frames at A", || {
        (a2.port_stats(0).0 >= 32).then_some(())
    });
    assert_eq!(b1.port_stats(0).0, 32);
    assert_eq!(a2.port_stats(0).0, 32);
    assert_eq!(a1.port_stats(0).0, 0, "networks are separate bridges");

    // CHECK and STATUS.
    let mut prev = with_devinfo(&memif_net, &node.devinfo("a-net1.json"));
    prev["prevResult"] = ra1.clone();
    ok("CHECK", &ca, "net1", &ua, &prev);
    ok("STATUS", "", "", "", &memif_net);

    // GC of the memif network keeping only B: A's memif attachment goes,
    // with its address; A's vhost-user one (another network) stays.
    drop((a1, a2, b1, b2));
    let mut gc = memif_net.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": cb, "ifname": "net1"}]);
    ok("GC", "", "", "", &gc);
    assert_eq!(node.ports().len(), 3);
    assert!(!Path::new(&sock_a1).exists());
    assert!(!node.devinfo("a-net1.json").exists());
    assert_eq!(reserved_ips(&node, "memif-net").len(), 1);

    // DEL everything, twice: the second time finds nothing and succeeds.
    for _ in 0..2 {
        for (c, u, pod) in [(&ca, &ua, "a"), (&cb, &ub, "b")] {
            ok(
                "DEL",
                c,
                "net1",
                u,
                &with_devinfo(&memif_net, &node.devinfo(&format!("{pod}-net1.json"))),
            );
            ok(
                "DEL",
                c,
                "net2",
                u,
                &with_devinfo(&vhost_net, &node.devinfo(&format!("{pod}-net2.json"))),
            );
        }
    }
    assert!(node.ports().is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());
    assert!(reserved_ips(&node, "memif-net").is_empty());
    assert!(walk(&node.dir.path().join("devinfo")).is_empty());

    // The daemon gone: STATUS says so; DEL still succeeds once its socket is gone.
    node.stop();
    let (good, v) = cni("STATUS", "", "", "", &memif_net);
    assert!(!good);
    assert_eq!(v["code"], 50);
    ok("DEL", &ca, "net1", &ua, &memif_net);
}

#[test]
fn device_plugin_socket_and_role_are_used() {
    let _g = serial();
    let node = Node::start();
    let dp_dir = node.socket_dir().join("dp").join("dev0");
    std::fs::create_dir_all(&dp_dir).unwrap();
    let sock = dp_dir.join("socket");
    let info = node.devinfo("dp.json");
    std::fs::create_dir_all(info.parent().unwrap()).unwrap();
    std::fs::write(
        &info,
        json!({"type": "vhost-user", "version": "1.1.0",
               "vhost-user": {"mode": "server", "path": sock}})
        .to_string(),
    )
    .unwrap();
    let conf = with_devinfo(
        &node.netconf("dp-net", json!({"interfaceType": "vhost-user"})),
        &info,
    );
    let c = "d".repeat(64);
    let r = ok("ADD", &c, "net1", "", &conf);
    assert_eq!(
        r["interfaces"][0]["socketPath"],
        sock.display().to_string().as_str()
    );
    let p = &node.ports()[0];
    assert_eq!(
        p.role(),
        "client",
        "the pod serves the socket: the switch connects"
    );
    ok("DEL", &c, "net1", "", &conf);
    assert!(node.ports().is_empty());

    // A device-info path outside socketDir is refused.
    std::fs::write(
        &info,
        json!({"type": "vhost-user", "version": "1.1.0",
               "vhost-user": {"mode": "server", "path": "/tmp/elsewhere.sock"}})
        .to_string(),
    )
    .unwrap();
    let (good, v) = cni("ADD", &c, "net1", "", &conf);
    assert!(!good);
    assert_eq!(v["code"], 7, "{v}");
    assert!(node.ports().is_empty());
}

#[test]
fn bad_input_gets_cni_errors() {
    let _g = serial();
    let node = Node::start();
    let c = "e".repeat(64);
    let base = node.netconf("n", json!({}));
    let err = |conf: &Value, ifname: &str| {
        let (good, v) = cni("ADD", &c, ifname, "", conf);
        assert!(!good, "{v}");
        assert_eq!(v["cniVersion"], "1.1.0");
        (
            v["code"].as_u64().unwrap(),
            v["msg"].as_str().unwrap().to_string(),
        )
    };
    let (code, msg) = err(&node.netconf("n", json!({"interfaceType": "tap"})), "net1");
    assert_eq!(code, 7);
    assert!(msg.starts_with("interfaceType:"), "{msg}");
    // A key the plugin does not know is a warning, not a failure (runtimes
    // and meta-plugins add their own).
    let colour = node.netconf("n", json!({"colour": "red"}));
    ok("ADD", &c, "net1", "", &colour);
    ok("DEL", &c, "net1", "", &colour);
    let (code, msg) = err(&node.netconf("n", json!({"memif": {"mode": "ip"}})), "net1");
    assert_eq!(code, 7);
    assert!(msg.starts_with("memif.mode:"), "{msg}");
    assert_eq!(err(&base, "../etc").0, 4);
    assert_eq!(err(&base, "/abs").0, 4);
    assert_eq!(
        err(
            &node.netconf("n", json!({"socketDir": "/tmp/../etc"})),
            "net1"
        )
        .0,
        7
    );
    let (code, _) = err(&node.netconf("n", json!({"cniVersion": "2.0.0"})), "net1");
    assert_eq!(code, 1);
    // A symlink planted as a pod directory is not followed.
    std::fs::create_dir_all(node.socket_dir()).unwrap();
    std::os::unix::fs::symlink("/tmp", node.socket_dir().join(&c)).unwrap();
    assert_eq!(err(&base, "net1").0, 5);
    assert!(node.ports().is_empty());
    let (good, v) = cni("VERSION", "", "", "", &json!({"cniVersion": "1.1.0"}));
    assert!(good);
    assert!(v["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("0.4.0")));
    // Older result versions.
    let conf = node.netconf(
        "old",
        json!({"cniVersion": "0.4.0", "ipam": node.ipam("10.78.0.0/24")}),
    );
    let r = ok("ADD", &"f".repeat(64), "net1", &pod_args("old-pod"), &conf);
    assert_eq!(r["cniVersion"], "0.4.0");
    assert_eq!(r["ips"][0]["version"], "4");
    assert!(r["interfaces"][0].get("socketPath").is_none());
    assert!(node.socket_dir().join("old-pod").is_dir());
    // DEL without the pod UID in CNI_ARGS still finds the pod directory.
    ok("DEL", &"f".repeat(64), "net1", "", &conf);
    assert!(!node.socket_dir().join("old-pod").exists());
    // A configured group gets access to the pod directory.
    let conf = node.netconf("grp", json!({"socketGroup": 0}));
    let g = "9".repeat(64);
    ok("ADD", &g, "net1", "", &conf);
    let m = std::fs::metadata(node.socket_dir().join(&g)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
        0o770
    );
    ok("DEL", &g, "net1", "", &conf);
}

#[test]
fn concurrent_adds_and_dels_leave_nothing_behind() {
    let _g = serial();
    let node = Node::start();
    let conf = node.netconf("load", json!({"ipam": node.ipam("10.79.0.0/16")}));
    // As many pods as a busy node starts at once (issue 6: 200).
    let n = 200;
    let node_ref = &node;
    let run = |cmd: &'static str| {
        std::thread::scope(|s| {
            for i in 0..n {
                let conf = conf.clone();
                s.spawn(move || {
                    let file = node_ref.devinfo(&format!("load-{i}.json"));
                    ok(
                        cmd,
                        &format!("{i:064x}"),
                        "net1",
                        &pod_args(&format!("pod-{i}")),
                        &with_devinfo(&conf, &file),
                    );
                });
            }
        });
    };
    run("ADD");
    let ports = node.ports();
    assert_eq!(ports.len(), n);
    assert!(ports.iter().all(|p| Path::new(&p.socket()).exists()));
    assert_eq!(reserved_ips(&node, "load").len(), n);
    assert_eq!(walk(&node.dir.path().join("devinfo")).len(), n);
    run("DEL");
    assert!(node.ports().is_empty());
    assert!(reserved_ips(&node, "load").is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());
    assert!(walk(&node.dir.path().join("devinfo")).is_empty());
}

#[test]
fn del_after_a_daemon_restart_still_cleans_up() {
    let _g = serial();
    let mut node = Node::start();
    let conf = node.netconf(
        "restart-net",
        json!({"interfaceType": "memif", "ipam": node.ipam("10.80.0.0/24")}),
    );
    let (ca, cb) = ("e".repeat(64), "f".repeat(64));
    let ra = ok("ADD", &ca, "net1", &pod_args("uid-e"), &conf);
    ok("ADD", &cb, "net1", &pod_args("uid-f"), &conf);
    let sock_a = ra["interfaces"][0]["socketPath"]
        .as_str()
        .unwrap()
        .to_string();
    let before: Vec<String> = node.ports().iter().map(|p| p.spec.name.clone()).collect();
    assert_eq!(before.len(), 2);

    // A crash, then a clean stop: each time the ports come back from the
    // state dir with their sockets, and the CNI's view still holds.
    for crash in [true, false] {
        if crash {
            node.kill9();
        } else {
            node.stop();
        }
        node.spawn();
        let mut after: Vec<String> = node.ports().iter().map(|p| p.spec.name.clone()).collect();
        after.sort();
        let mut want = before.clone();
        want.sort();
        assert_eq!(after, want, "crash={crash}");
        wait_for(Duration::from_secs(10), "the socket again", || {
            Path::new(&sock_a).exists().then_some(())
        });
        let mut check = conf.clone();
        check["prevResult"] = ra.clone();
        ok("CHECK", &ca, "net1", &pod_args("uid-e"), &check);
    }

    // DEL after the restarts removes everything.
    ok("DEL", &ca, "net1", &pod_args("uid-e"), &conf);
    ok("DEL", &cb, "net1", &pod_args("uid-f"), &conf);
    assert!(node.ports().is_empty());
    assert!(reserved_ips(&node, "restart-net").is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());
    // And a restart now brings nothing back.
    node.stop();
    node.spawn();
    assert!(node.ports().is_empty());
}

/// A pod attached by the CNI is pinned to the MAC of its result: what it
/// sends from that MAC passes, and a frame it sends from any other source
/// is dropped. Pod A's testpmd swaps the addresses of what it receives and
/// sends it back: B's frames to A's MAC come back from A's MAC and pass;
/// B's frames to an unknown MAC (flooded to A) come back from that MAC and
/// are dropped as spoofed.
#[test]
fn a_pinned_pod_passes_its_own_frames_and_no_spoofed_one() {
    let _g = serial();
    let node = Node::start();
    let net = node.netconf("pinned", json!({"bridge": "br-pin"}));
    let add = |c: &str, uid: &str| ok("ADD", &c.repeat(64), "net1", &pod_args(uid), &net);
    let (ra, rb) = (add("c", "uid-pa"), add("d", "uid-pb"));
    let iface = |r: &Value| {
        (
            r["interfaces"][0]["socketPath"]
                .as_str()
                .unwrap()
                .to_string(),
            r["interfaces"][0]["mac"].as_str().unwrap().to_string(),
        )
    };
    let ((sa, mac_a), (sb, mac_b)) = (iface(&ra), iface(&rb));
    let ports = node.ports();
    let pa = ports.iter().find(|p| p.socket() == sa).unwrap();
    assert_eq!(
        pa.spec.macs.as_ref().map(|m| m[0].to_string()),
        Some(mac_a.clone()),
        "the switch pins the result's MAC"
    );
    let vdev =
        |s: &str, m: &str| format!("net_memif0,role=client,socket={s},socket-abstract=no,mac={m}");
    let a = Testpmd::start(&[vdev(&sa, &mac_a)], &["--forward-mode=macswap"]);
    let mut b = Testpmd::start(
        &[vdev(&sb, &mac_b)],
        &["--forward-mode=rxonly", &format!("--eth-peer=0,{mac_a}")],
    );
    wait_for(Duration::from_secs(20), "links up", || {
        node.ports().iter().all(|p| p.status.link_up).then_some(())
    });
    let stats = |port: &str| -> PortStats {
        let v: Vec<PortStats> = Client::connect(&node.control())
            .unwrap()
            .call_as(&Request::Stats {
                name: Some(port.to_string()),
            })
            .unwrap();
        v.into_iter().next().unwrap()
    };
    let spoofed = || {
        stats(&pa.spec.name)
            .totals
            .drops
            .get(&switchyard_api::DropReason::SpoofedSource)
            .copied()
            .unwrap_or(0)
    };
    b.send_bursts(1);
    assert_eq!(b.wait_rx(0, 32), 32, "A's own frames pass");
    assert_eq!(spoofed(), 0);
    // testpmd changes its peer only while it is not forwarding.
    b.pause();
    b.cmd("set eth-peer 0 02:00:00:00:77:77");
    b.resume();
    b.send_bursts(1);
    wait_for(
        Duration::from_secs(10),
        "A's spoofed frames dropped",
        || (spoofed() >= 32).then_some(()),
    );
    assert_eq!(b.port_stats(0).0, 32, "no spoofed frame reached B");
    drop((a, b));
    ok("DEL", &"c".repeat(64), "net1", &pod_args("uid-pa"), &net);
    ok("DEL", &"d".repeat(64), "net1", &pod_args("uid-pb"), &net);
}

/// A veth pair in the test's namespace, deleted when dropped.
struct Veth(String);

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.0])
            .status();
    }
}

#[test]
fn a_physnet_network_leaves_the_node_tagged_with_its_vlan() {
    let _g = serial();
    let id = std::process::id() % 100_000;
    let (up, wire) = (format!("syp{id}u"), format!("syp{id}w"));
    let ok_ip = |args: &[&str]| {
        let s = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap();
        assert!(s.success(), "ip {args:?}");
    };
    ok_ip(&["link", "add", &up, "type", "veth", "peer", "name", &wire]);
    let _veth = Veth(up.clone());
    for i in [&up, &wire] {
        ok_ip(&["link", "set", i, "up"]);
    }
    let node = Node::start_with(&format!(
        "[physnets]\nphysnet1 = \"{up}\"\n[overlays]\nov1 = {{ vni = 42 }}\n"
    ));
    let net = node.netconf("tenant-100", json!({"physnet": "physnet1", "vlan": 100}));
    let r = ok("ADD", &"e".repeat(64), "net1", &pod_args("uid-phys"), &net);
    let sock = r["interfaces"][0]["socketPath"]
        .as_str()
        .unwrap()
        .to_string();
    let mac = r["interfaces"][0]["mac"].as_str().unwrap().to_string();
    let ports = node.ports();
    let pod = ports.iter().find(|p| p.socket() == sock).unwrap();
    assert_eq!(
        (pod.spec.bridge.as_deref(), pod.spec.vlan),
        (Some("physnet1"), Some(100))
    );
    let uplink = ports
        .iter()
        .find(|p| p.name() == "uplink-physnet1")
        .expect("the physnet's uplink");
    assert!(uplink.status.link_up, "{uplink:?}");

    // What leaves on the wire, seen from its other end (the kernel strips
    // the tag there and reports it beside the frame: PACKET_AUXDATA).
    let mut capture = std::process::Command::new("python3")
        .args(["-c", CAPTURE, &wire, &mac, "32"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its socket is bound once it says so.
    let mut stdout = std::io::BufReader::new(capture.stdout.take().unwrap());
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
    let vdev = format!("net_memif0,role=client,socket={sock},socket-abstract=no,mac={mac}");
    let mut pod = Testpmd::start(&[vdev], &[]);
    wait_for(Duration::from_secs(20), "the pod's link up", || {
        node.ports()
            .iter()
            .any(|p| p.socket() == sock && p.status.link_up)
            .then_some(())
    });
    pod.send_bursts(1);
    // It ends once it has seen the burst's 32 frames from the pod (or
    // after 20 s).
    let mut seen = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut seen).unwrap();
    capture.wait().unwrap();
    let from_pod: Vec<&str> = seen.lines().filter(|l| l.contains(&mac)).collect();
    assert!(
        from_pod.len() >= 32,
        "not the pod's burst on the wire: {seen}"
    );
    assert!(
        from_pod.iter().all(|l| l.starts_with("vlan=100 ")),
        "the pod's frames left untagged or on another VLAN: {seen}"
    );
    drop(pod);
    ok("DEL", &"e".repeat(64), "net1", &pod_args("uid-phys"), &net);

    // A physnet this node has no uplink for: refused, naming the node's,
    // instead of a bridge that reaches no other node.
    let other = node.netconf("tenant-2", json!({"physnet": "physnet2", "vlan": 100}));
    let (good, e) = cni("ADD", &"f".repeat(64), "net1", &pod_args("uid-p2"), &other);
    assert!(!good);
    assert_eq!(e["code"], 7, "{e}");
    assert_eq!(
        e["msg"],
        format!(
            "physnet: \"physnet2\" is not a physical network of this node's switch (its [physnets]: physnet1 ({up}); its [overlays]: ov1 (vni 42))"
        )
    );
    let names: Vec<String> = node.ports().iter().map(|p| p.spec.name.clone()).collect();
    assert_eq!(names, ["uplink-physnet1"]);
    ok("DEL", &"f".repeat(64), "net1", &pod_args("uid-p2"), &other);

    // An overlay is named as a physnet is: its pods join its bridge.
    let ov = node.netconf("tenant-ov", json!({"physnet": "ov1"}));
    let r = ok("ADD", &"a".repeat(64), "net1", &pod_args("uid-ov"), &ov);
    let sock = r["interfaces"][0]["socketPath"]
        .as_str()
        .unwrap()
        .to_string();
    let ports = node.ports();
    let pod = ports.iter().find(|p| p.socket() == sock).unwrap();
    assert_eq!(pod.spec.bridge.as_deref(), Some("ov1"));
    ok("DEL", &"a".repeat(64), "net1", &pod_args("uid-ov"), &ov);
}

/// Captures frames on interface argv[1] (`vlan=<id> src=<mac>` each, after
/// a first line `ready` once bound) until argv[3] frames from MAC argv[2]
/// have passed, or 20 s.
const CAPTURE: &str = r#"
import socket, sys, time
# Protocol 0, then ETH_P_ALL at bind: a socket made for ETH_P_ALL takes
# every interface's frames until bound.
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
s.bind((sys.argv[1], 3))
s.setsockopt(263, 8, 1)  # SOL_PACKET, PACKET_AUXDATA
s.settimeout(0.5)
print("ready", flush=True)
want, seen = int(sys.argv[3]), 0
end = time.time() + 20
while time.time() < end and seen < want:
    try:
        d, anc, _, _ = s.recvmsg(65536, 256)
    except socket.timeout:
        continue
    vid = 0
    for lvl, typ, data in anc:
        if lvl == 263 and typ == 8 and len(data) >= 20:
            status = int.from_bytes(data[0:4], "little")
            if status & 16:  # TP_STATUS_VLAN_VALID
                vid = int.from_bytes(data[16:18], "little") & 0xfff
    src = ":".join(f"{b:02x}" for b in d[6:12])
    seen += src == sys.argv[2]
    print(f"vlan={vid} src={src}", flush=True)
"#;

/// The ports of `node`'s switch, by name, sorted.
fn port_names(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = node.ports().iter().map(|p| p.spec.name.clone()).collect();
    v.sort();
    v
}

/// The ports DELs left for the switch to remove.
fn owed_ports(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(node.socket_dir().join(".switchyard-cni/owed"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// DEL succeeds and releases what it can whatever state the switch is in:
/// killed (its control socket left behind, refusing connections, as while
/// it crash-loops), stopped (no socket), and after a node reboot (no switch
/// state and no CNI records at all). A port the switch still has is removed
/// by the next call that reaches the switch.
#[test]
fn del_cleans_up_whatever_state_the_switch_is_in() {
    let _g = serial();
    let mut node = Node::start();
    let conf = node.netconf(
        "away-net",
        json!({"interfaceType": "memif", "ipam": node.ipam("10.81.0.0/24")}),
    );
    let pod = |c: &str| (c.repeat(64), pod_args(&format!("uid-{c}")));
    let add = |c: &str| {
        let (id, args) = pod(c);
        ok("ADD", &id, "net1", &args, &conf)
    };
    let del = |c: &str, conf: &Value| {
        let (id, args) = pod(c);
        let (good, v) = cni("DEL", &id, "net1", &args, conf);
        assert!(good, "DEL {c} with the switch away: {v}");
    };
    let name = |c: &str| switchyard_cni::plugin::port_name(&c.repeat(64), "net1");

    // Killed: the control socket is left and refuses connections.
    add("a");
    add("b");
    node.kill9();
    assert!(node.control().exists());
    del("a", &conf);
    assert_eq!(
        reserved_ips(&node, "away-net").len(),
        1,
        "a's lease released"
    );
    assert!(!node.socket_dir().join("uid-a").exists());
    assert_eq!(owed_ports(&node), [name("a")]);
    // Back, the switch restores both ports; the next call that reaches it
    // removes the one it owes.
    node.spawn();
    assert_eq!(port_names(&node), {
        let mut v = vec![name("a"), name("b")];
        v.sort();
        v
    });
    del("b", &conf);
    assert!(node.ports().is_empty());
    assert!(owed_ports(&node).is_empty());

    // Stopped: no control socket at all.
    add("c");
    node.stop();
    assert!(!node.control().exists());
    del("c", &conf);
    assert!(reserved_ips(&node, "away-net").is_empty());
    assert_eq!(owed_ports(&node), [name("c")]);
    node.spawn();
    add("d"); // ADD settles what is owed first
    assert_eq!(port_names(&node), [name("d")]);
    assert!(owed_ports(&node).is_empty());
    del("d", &conf);
    assert!(node.ports().is_empty());

    // A node reboot: /run is empty (no control socket, no pod directories,
    // no records of the plugin's) and the switch has no state; the lease
    // (host-local keeps it on disk) is still released.
    add("e");
    node.kill9();
    std::fs::remove_dir_all(node.socket_dir()).unwrap();
    std::fs::remove_dir_all(node.dir.path().join("state")).unwrap();
    std::fs::remove_file(node.control()).unwrap();
    del("e", &conf);
    assert!(reserved_ips(&node, "away-net").is_empty());
    node.spawn();
    assert!(node.ports().is_empty());
    // What was owed and is already gone is forgotten by the next call.
    assert_eq!(owed_ports(&node), [name("e")]);
    add("f");
    del("f", &conf);
    assert!(owed_ports(&node).is_empty());
    assert!(node.ports().is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());

    // A reboot that keeps the switch's state (/var/lib) but not /run: the
    // switch restores the port of a pod whose records are gone and for
    // which no DEL may ever come; the next call that reaches the switch
    // removes it.
    add("g");
    node.kill9();
    std::fs::remove_dir_all(node.socket_dir()).unwrap();
    std::fs::remove_file(node.control()).unwrap();
    node.spawn();
    assert_eq!(port_names(&node), [name("g")]);
    add("h");
    assert_eq!(port_names(&node), [name("h")]);
    del("h", &conf);
    del("g", &conf); // the runtime's, if it comes: the lease
    assert!(node.ports().is_empty());
    assert!(reserved_ips(&node, "away-net").is_empty());
}

#[test]
fn version_answers_in_the_version_asked() {
    for (asked, answer) in [
        (json!({"cniVersion": "0.4.0"}), "0.4.0"),
        (json!({"cniVersion": "1.0.0"}), "1.0.0"),
        (json!({"cniVersion": "9.9.9"}), "1.1.0"),
        (json!({}), "1.1.0"),
    ] {
        let (good, v) = cni("VERSION", "", "", "", &asked);
        assert!(good, "{v}");
        assert_eq!(v["cniVersion"], answer, "asked {asked}");
        assert_eq!(
            v["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
    }
}

#[test]
fn a_socket_dir_in_the_switchs_own_directory_is_refused() {
    let _g = serial();
    let node = Node::start();
    // The switch's state directory lies in its socket_dir here: a netconf
    // whose socketDir points into it would put pod sockets among the
    // switch's own files.
    let state = node.dir.path().join("state");
    let conf = node.netconf("own", json!({"socketDir": state}));
    let (c, args) = ("a".repeat(64), pod_args("uid-own"));
    for (kind, role) in [("memif", "slave"), ("vhost-user", "client")] {
        let mut conf = conf.clone();
        conf["interfaceType"] = json!(kind);
        if kind == "memif" {
            conf["memif"] = json!({"role": role});
        } else {
            conf["vhostUser"] = json!({"mode": role});
        }
        let (good, e) = cni("ADD", &c, "net1", &args, &conf);
        assert!(!good, "{kind}: {e}");
        let msg = e["msg"].as_str().unwrap_or_default();
        assert!(
            msg.contains("in the switch's state directory"),
            "{kind}: {e}"
        );
        assert!(node.ports().is_empty());
        ok("DEL", &c, "net1", &args, &conf);
    }
    // No pod directory was left among the switch's files, and the switch
    // still answers and restores nothing it should not.
    assert!(!state.join("uid-own").exists());
    assert!(node.ports().is_empty());
}

/// A runtime that asks ADD again (after a timeout, or an answer it lost)
/// gets the first ADD's answer: the same address (host-local, which refuses
/// a second allocation for one container, is not asked again) and the same
/// port, whose pod stays connected. An ADD under the same container and
/// interface that asks something else (another MAC) replaces the first, as
/// DEL and ADD would.
#[test]
fn add_asked_again_gets_the_same_answer() {
    let _g = serial();
    let node = Node::start();
    let conf = node.netconf("again", json!({"ipam": node.ipam("10.78.0.0/24")}));
    let file = node.devinfo("again.json");
    let conf = with_devinfo(&conf, &file);
    let (id, args) = (format!("{:064x}", 7), pod_args("again"));
    let first = ok("ADD", &id, "net1", &args, &conf);
    let socket = first["interfaces"][0]["socketPath"]
        .as_str()
        .unwrap()
        .to_string();
    let mac = first["interfaces"][0]["mac"].as_str().unwrap().to_string();
    let pod = Testpmd::start(
        &[format!(
            "net_memif0,role=client,socket={socket},socket-abstract=no,mac={mac}"
        )],
        &["--forward-mode=rxonly"],
    );
    let up = |n: &Node| {
        let p = n.ports();
        assert_eq!(p.len(), 1, "{p:?}");
        (p[0].status.link_up, p[0].status.connects)
    };
    wait_for(Duration::from_secs(20), "the pod connected", || {
        (up(&node) == (true, 1)).then_some(())
    });
    for _ in 0..3 {
        assert_eq!(ok("ADD", &id, "net1", &args, &conf), first);
        assert_eq!(up(&node), (true, 1), "the pod stays connected");
        assert_eq!(reserved_ips(&node, "again").len(), 1);
    }
    drop(pod);
    let mut other = conf.clone();
    other["runtimeConfig"]["mac"] = json!("02:00:00:00:0a:0b");
    let second = ok("ADD", &id, "net1", &args, &other);
    assert_eq!(second["interfaces"][0]["mac"], "02:00:00:00:0a:0b");
    assert_eq!(
        node.ports()[0].spec.macs.as_deref(),
        Some(&["02:00:00:00:0a:0b".parse().unwrap()][..])
    );
    assert_eq!(reserved_ips(&node, "again").len(), 1);
    // One under another network and range: the first lease is released
    // with the first ADD's netconf (the new one names another store).
    let moved = with_devinfo(
        &node.netconf("moved", json!({"ipam": node.ipam("10.79.0.0/24")})),
        &file,
    );
    let third = ok("ADD", &id, "net1", &args, &moved);
    assert!(third["ips"][0]["address"]
        .as_str()
        .unwrap()
        .starts_with("10.79.0."));
    assert!(
        reserved_ips(&node, "again").is_empty(),
        "first lease released"
    );
    assert_eq!(reserved_ips(&node, "moved").len(), 1);
    ok("DEL", &id, "net1", &args, &moved);
    assert!(node.ports().is_empty());
    assert!(reserved_ips(&node, "moved").is_empty());
    assert_eq!(leftovers(&node), Vec::<String>::new());
}

/// A network on an overlay that names no IPAM gets addresses from the
/// node's slice of the overlay's subnets (`host-local` with the slice's
/// ranges, the subnet's prefix); before the node has a slice, ADD is to
/// be tried again later; the slice outlives a restart and a takeover;
/// DEL releases what ADD took; a network with its own IPAM keeps it.
#[test]
fn an_overlay_network_without_ipam_hands_out_the_nodes_slice() {
    let _g = serial();
    let mut node = Node::start_with(
        "[overlays]\nov1 = { vni = 42, ipam = { subnet = \"10.67.0.0/16\", subnet6 = \"fd67::/48\" } }\n",
    );
    // host-local keeps its leases in its default directory, by network.
    let name = format!("ov-slice-{}", std::process::id());
    let leases = Path::new("/var/lib/cni/networks").join(&name);
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(leases.clone());
    let net = node.netconf(&name, json!({"physnet": "ov1"}));
    let (c1, c2) = ("1".repeat(64), "2".repeat(64));
    let (good, e) = cni("ADD", &c1, "net1", &pod_args("uid-s1"), &net);
    assert!(!good);
    assert_eq!(e["code"], 11, "{e}");
    assert_eq!(
        e["msg"],
        "ipam: this node has no slice of overlay \"ov1\"'s addresses yet (switchyard-vtep-sync claims it)"
    );
    assert!(node.ports().is_empty(), "{:?}", node.ports());
    // Given one, as the node agent gives it.
    let control = node.control();
    let slice = |args: &[&str]| {
        let out = std::process::Command::new(switchyard_bin())
            .arg("--control")
            .arg(&control)
            .args(["vtep", "slice", "ov1"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        slice(&["5"]).trim(),
        "overlay ov1: slice 5 (10.67.5.1-10.67.5.255 of 10.67.0.0/16, fd67:0:0:5::1-fd67::5:ffff:ffff:ffff:ffff of fd67::/48)"
    );
    let ips = |r: &Value| -> Vec<String> {
        r["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["address"].as_str().unwrap().to_string())
            .collect()
    };
    let r1 = ok("ADD", &c1, "net1", &pod_args("uid-s1"), &net);
    assert_eq!(ips(&r1), ["10.67.5.1/16", "fd67:0:0:5::1/48"]);
    let mut check = net.clone();
    check["prevResult"] = r1.clone();
    ok("CHECK", &c1, "net1", &pod_args("uid-s1"), &check);
    // Kept across a restart and a takeover.
    node.stop();
    node.spawn();
    node.takeover();
    let r2 = ok("ADD", &c2, "net1", &pod_args("uid-s2"), &net);
    assert_eq!(ips(&r2), ["10.67.5.2/16", "fd67:0:0:5::2/48"]);
    assert!(leases.join("10.67.5.1").exists());
    ok("DEL", &c1, "net1", &pod_args("uid-s1"), &net);
    assert!(!leases.join("10.67.5.1").exists());
    assert!(leases.join("10.67.5.2").exists());
    ok("DEL", &c2, "net1", &pod_args("uid-s2"), &net);
    assert!(!leases.join("fd67:0:0:5::2").exists());
    // A slice the overlay does not have is refused, naming it.
    let out = std::process::Command::new(switchyard_bin())
        .arg("--control")
        .arg(node.control())
        .args(["vtep", "slice", "ov1", "256"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("slice: slice 256: the overlay's subnets have 256 slices"),
        "{out:?}"
    );
    // A network with an IPAM of its own keeps it.
    let own = node.netconf(
        &format!("{name}-own"),
        json!({"physnet": "ov1", "ipam": node.ipam("10.68.0.0/24")}),
    );
    let r = ok("ADD", &c1, "net2", &pod_args("uid-s1"), &own);
    assert_eq!(ips(&r), ["10.68.0.2/24"]);
    ok("DEL", &c1, "net2", &pod_args("uid-s1"), &own);
    // Without a slice again: try again later.
    assert_eq!(slice(&[]).trim(), "overlay ov1: no slice");
    let (good, e) = cni("ADD", &c1, "net1", &pod_args("uid-s1"), &net);
    assert!(!good && e["code"] == 11, "{e}");
    node.stop();
}
