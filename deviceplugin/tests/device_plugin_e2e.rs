//! End-to-end: the real `switchyard-device-plugin` binary driven over its
//! real gRPC sockets by a test playing the kubelet (registration server
//! from the same .proto), then the whole device plugin → device-info →
//! `switchyard-cni` → switch → DPDK testpmd path on this machine.

#[path = "../../dataplane/tests/common/mod.rs"]
mod common;
#[path = "../../cni/tests/support/exec.rs"]
mod exec;
#[path = "../../cni/tests/support/grpc_unix.rs"]
mod grpc_unix;
#[path = "support/kubelet.rs"]
mod kubelet;
#[path = "../../cni/tests/support/multus.rs"]
mod multus;
#[path = "../../cni/tests/support/pod_resources.rs"]
mod pod_resources;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::{serial, terminate, wait_for, workspace_bin, Switch, Testpmd};
use kubelet::{Behaviour, Kubelet};
use multus::{Multus, MultusVersion, Nad, Pod as MultusPod, Selection};
use pod_resources::PodResourcesApi;
use serde_json::{json, Value};
use switchyard_api::PortInfo;
use switchyard_api::Request as CtlRequest;
use switchyard_device_plugin::api::device_plugin_client::DevicePluginClient;
use switchyard_device_plugin::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, Empty, ListAndWatchResponse,
};
use switchyard_device_plugin::run::uds_channel;
use tokio::runtime::Runtime;
use tonic::transport::Channel;
use tonic::{Response, Status, Streaming};

const LIMIT: Duration = Duration::from_secs(15);

/// A node's directories and the running plugin.
struct Node {
    dir: tempfile::TempDir,
    rt: Runtime,
    plugin: Option<Child>,
}

impl Node {
    fn new(control: &Path, memif: u32, vhost: u32) -> Node {
        let dir = tempfile::Builder::new().prefix("sy-dp").tempdir().unwrap();
        let d = dir.path();
        let cfg = format!(
            r#"plugin_dir = "{p}/plugins"
devinfo_dir = "{p}/devinfo/dp"
cdi_dir = "{p}/cdi"
socket_dir = "{p}/pods/devices"
control_socket = "{c}"
health_interval_ms = 200

[[pool]]
resource = "switchyard.io/memif"
interface_type = "memif"
count = {memif}
pod_role = "slave"

[[pool]]
resource = "switchyard.io/vhost-user"
interface_type = "vhost-user"
count = {vhost}
pod_role = "client"
"#,
            p = d.display(),
            c = control.display()
        );
        std::fs::write(d.join("dp.toml"), cfg).unwrap();
        Node {
            dir,
            rt: Runtime::new().unwrap(),
            plugin: None,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn start_plugin(&mut self) {
        self.plugin = Some(self.spawn_plugin("dp.log"));
    }

    /// A plugin process on the node's config, logging to `log`.
    fn spawn_plugin(&self, log: &str) -> Child {
        let log = std::fs::File::create(self.path(log)).unwrap();
        Command::new(env!("CARGO_BIN_EXE_switchyard-device-plugin"))
            .arg("--config")
            .arg(self.path("dp.toml"))
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// The endpoint of the newest plugin serving pool `class`.
    fn endpoint(&self, class: &str) -> String {
        let prefix = format!("switchyard-{class}-");
        let dir = self.path("plugins");
        let mut found: Vec<(std::time::SystemTime, String)> =
            wait_for(LIMIT, "an endpoint", || {
                let v: Vec<_> = std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let rest = name.strip_prefix(&prefix)?.strip_suffix(".sock")?;
                        // Not another class's with this one as its prefix.
                        rest.split_once('-').filter(|(t, p)| {
                            u128::from_str_radix(t, 16).is_ok() && p.parse::<u32>().is_ok()
                        })?;
                        Some((e.metadata().ok()?.modified().ok()?, name))
                    })
                    .collect();
                (!v.is_empty()).then_some(v)
            });
        found.sort();
        found.pop().unwrap().1
    }

    fn plugin_client(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        let path = self.path("plugins").join(endpoint);
        let ch = self.rt.block_on(uds_channel(&path)).unwrap();
        DevicePluginClient::new(ch)
    }

    /// Allocate, as the kubelet calls it; one not answered within `LIMIT`
    /// fails as `DeadlineExceeded`.
    fn allocate(&self, endpoint: &str, ids: &[&str]) -> Result<AllocateResponse, Status> {
        let mut c = self.plugin_client(endpoint);
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        self.rt
            .block_on(async { tokio::time::timeout(LIMIT, c.allocate(req)).await })
            .map_err(|_| Status::deadline_exceeded(format!("no answer in {LIMIT:?}")))?
            .map(Response::into_inner)
    }

    fn watch(&self, endpoint: &str) -> Streaming<ListAndWatchResponse> {
        let mut c = self.plugin_client(endpoint);
        self.rt
            .block_on(c.list_and_watch(Empty {}))
            .unwrap()
            .into_inner()
    }

    /// The next ListAndWatch message, as (id, health) pairs.
    fn next_list(&self, s: &mut Streaming<ListAndWatchResponse>) -> Vec<(String, String)> {
        let m = self
            .rt
            .block_on(async { tokio::time::timeout(LIMIT, s.message()).await })
            .expect("a ListAndWatch update in time")
            .unwrap()
            .expect("stream open");
        m.devices.into_iter().map(|d| (d.id, d.health)).collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("dp.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let ending = self
            .plugin
            .take()
            .map(|mut c| terminate(&mut c, Duration::from_secs(5)));
        if std::thread::panicking() {
            eprintln!("---- device plugin log ----\n{}", self.log());
        }
        if let Some(e) = ending {
            common::check_ending("the device plugin", e, &self.log(), &[]);
        }
    }
}

fn files_under(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn json_file(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn registers_lists_allocates_follows_health_and_kubelet_restarts_then_cleans_up() {
    let mut switch = Switch::start("");
    let mut node = Node::new(&switch.control(), 3, 2);
    let kubelet = Kubelet::start(&node.rt, &node.path("plugins"));
    node.start_plugin();

    // Registration: one per pool, v1beta1, endpoint relative to the dir.
    let regs = kubelet.registrations(2);
    assert_eq!(regs.len(), 2);
    assert_eq!(regs[0].version, "v1beta1");
    assert_eq!(regs[0].resource_name, "switchyard.io/memif");
    // An endpoint of this instance's own (`switchyard-<class>-<start>-<pid>`):
    // the plugins of a rollout never share one.
    assert!(
        regs[0].endpoint.starts_with("switchyard-memif-"),
        "{regs:?}"
    );
    assert_eq!(regs[0].endpoint, node.endpoint("memif"));
    assert_eq!(regs[1].resource_name, "switchyard.io/vhost-user");
    assert_eq!(regs[1].endpoint, node.endpoint("vhost-user"));

    // Before any allocation, every advertised device has its device-info
    // file (NPWG Device Information spec 1.1.0, 4.1.1) and its directory.
    let all_files = [
        "switchyard.io-memif-memif-0-device.json",
        "switchyard.io-memif-memif-1-device.json",
        "switchyard.io-memif-memif-2-device.json",
        "switchyard.io-vhost-user-vhost-user-0-device.json",
        "switchyard.io-vhost-user-vhost-user-1-device.json",
    ];
    assert_eq!(files_under(&node.path("devinfo/dp")), all_files);
    assert!(node.path("pods/devices/vhost-user-1").is_dir());

    // Options and the device list, healthy while the switch answers.
    let mut c = node.plugin_client(&node.endpoint("memif"));
    let opts = node
        .rt
        .block_on(c.get_device_plugin_options(Empty {}))
        .unwrap()
        .into_inner();
    assert!(!opts.pre_start_required && !opts.get_preferred_allocation_available);
    let mut watch = node.watch(&node.endpoint("memif"));
    let healthy = |n: &str| (n.to_string(), "Healthy".to_string());
    let mut list = node.next_list(&mut watch);
    if list.iter().any(|(_, h)| h != "Healthy") {
        // The first health probe may not have answered yet.
        list = node.next_list(&mut watch);
    }
    assert_eq!(
        list,
        vec![healthy("memif-0"), healthy("memif-1"), healthy("memif-2")]
    );

    // Allocate two memif devices to one container.
    let r = node
        .allocate(&node.endpoint("memif"), &["memif-2", "memif-0"])
        .unwrap();
    let c0 = &r.container_responses[0];
    let dev = |id: &str| node.path("pods/devices").join(id);
    let sock = |id: &str| dev(id).join("memif.sock").display().to_string();
    // In Multus's order (sorted as strings), whatever the kubelet's.
    assert_eq!(c0.mounts.len(), 2);
    assert_eq!(c0.mounts[0].host_path, dev("memif-0").display().to_string());
    assert_eq!(c0.mounts[0].container_path, c0.mounts[0].host_path);
    assert!(!c0.mounts[0].read_only);
    assert_eq!(c0.envs["SWITCHYARD_SOCKET_MEMIF_2"], sock("memif-2"));
    assert_eq!(
        c0.envs["SWITCHYARD_MEMIF_SOCKETS"],
        format!("{},{}", sock("memif-0"), sock("memif-2"))
    );
    let cdi_names: Vec<&str> = c0.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        cdi_names,
        [
            "switchyard.io/socket=memif-0",
            "switchyard.io/socket=memif-2"
        ]
    );
    assert!(dev("memif-2").is_dir());
    let mode = std::fs::metadata(dev("memif-2")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700
    );
    // The device-info file Multus reads, named as the spec says.
    let info = json_file(&node.path("devinfo/dp/switchyard.io-memif-memif-2-device.json"));
    assert_eq!(
        info,
        json!({"type": "memif", "version": "1.1.0",
               "memif": {"role": "slave", "mode": "ethernet", "path": sock("memif-2")}})
    );
    let vinfo = {
        node.allocate(&node.endpoint("vhost-user"), &["vhost-user-1"])
            .unwrap();
        json_file(&node.path("devinfo/dp/switchyard.io-vhost-user-vhost-user-1-device.json"))
    };
    assert_eq!(vinfo["vhost-user"]["mode"], "client");

    // Unknown devices are refused.
    for bad in ["memif-3", "memif-01", "vhost-user-0", "../x"] {
        let e = node.allocate(&node.endpoint("memif"), &[bad]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
    }

    // The CDI spec: one device per socket directory, valid by the spec's
    // own rules, at the lowest version its fields need.
    let spec_path = node.path("cdi/switchyard.io-socket.json");
    let spec = container_device_interface::spec::read_spec(&spec_path, 0)
        .unwrap_or_else(|e| panic!("CDI spec invalid: {e:#}"));
    let raw = json_file(&spec_path);
    assert_eq!(raw["kind"], "switchyard.io/socket");
    assert_eq!(raw["devices"].as_array().unwrap().len(), 5);
    let min = container_device_interface::version::minimum_required_version(
        &container_device_interface::spec::parse_spec(&spec_path).unwrap(),
    )
    .unwrap();
    assert_eq!(
        min.to_string().trim_start_matches('v'),
        raw["cdiVersion"].as_str().unwrap()
    );
    assert!(spec.get_device("vhost-user-1").is_some());
    assert_eq!(
        raw["devices"][2]["containerEdits"],
        json!({"env": [format!("SWITCHYARD_SOCKET_MEMIF_2={}", sock("memif-2"))],
               "mounts": [{"hostPath": dev("memif-2"), "containerPath": dev("memif-2"),
                           "options": ["rbind", "rw"]}]})
    );

    // Health follows the switch daemon.
    switch.stop();
    let down = node.next_list(&mut watch);
    assert!(down.iter().all(|(_, h)| h == "Unhealthy"), "{down:?}");
    switch.spawn();
    let up = node.next_list(&mut watch);
    assert!(up.iter().all(|(_, h)| h == "Healthy"), "{up:?}");

    // A kubelet restart wipes the plugin dir and makes a new kubelet.sock:
    // the plugin serves and registers again.
    drop(kubelet);
    for f in files_under(&node.path("plugins")) {
        std::fs::remove_file(node.path("plugins").join(f)).unwrap();
    }
    let kubelet = Kubelet::start(&node.rt, &node.path("plugins"));
    let regs = kubelet.registrations(2);
    assert_eq!(regs[0].endpoint, node.endpoint("memif"));
    let mut watch = node.watch(&node.endpoint("vhost-user"));
    assert_eq!(node.next_list(&mut watch).len(), 2);
    // A kubelet restart that keeps the plugin dir: only kubelet.sock is new.
    drop(kubelet);
    let kubelet = Kubelet::start(&node.rt, &node.path("plugins"));
    assert_eq!(kubelet.registrations(2).len(), 2);

    // SIGTERM: sockets and device-info files are removed; the CDI spec
    // stays, since the kubelet restarts containers with the same CDI names
    // while the plugin is replaced (a rollout).
    let spec_before = std::fs::read(node.path("cdi/switchyard.io-socket.json")).unwrap();
    let mut p = node.plugin.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for(LIMIT, "the plugin to exit", || p.try_wait().unwrap());
    assert!(status.success(), "{}", node.log());
    assert_eq!(files_under(&node.path("plugins")), ["kubelet.sock"]);
    assert!(files_under(&node.path("devinfo/dp")).is_empty());
    assert_eq!(
        std::fs::read(node.path("cdi/switchyard.io-socket.json")).unwrap(),
        spec_before
    );

    // Started again, the plugin writes every file again before the kubelet
    // allocates anything: a pod re-created now finds its device's file.
    node.start_plugin();
    kubelet.registrations(4);
    assert_eq!(files_under(&node.path("devinfo/dp")), all_files);
}

#[test]
fn hostile_clients_on_the_plugin_socket_do_not_stall_the_kubelet() {
    let _g = serial();
    let switch = Switch::start("");
    let mut node = Node::new(&switch.control(), 2, 1);
    let kubelet = Kubelet::start(&node.rt, &node.path("plugins"));
    node.start_plugin();
    kubelet.registrations(2);
    // Connections that stay silent, stop in the HTTP/2 preface, send
    // garbage, or drip the preface a byte at a time, all at once.
    // They hold on until the kubelet's calls below are done, so a call
    // they stalled would not be answered in time.
    let sock = node.path("plugins").join(node.endpoint("memif"));
    let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let shapes: Vec<&[u8]> = vec![b"", &preface[..10], b"\x00garbage\xff\xff", preface];
    let (ready, connected) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..40)
        .map(|i| {
            let sock = sock.clone();
            let bytes = shapes[i % shapes.len()].to_vec();
            let drip = i % shapes.len() == 3;
            let ready = ready.clone();
            let released = released.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                use std::sync::atomic::Ordering::Relaxed;
                let Ok(mut c) = std::os::unix::net::UnixStream::connect(&sock) else {
                    let _ = ready.send(false);
                    return;
                };
                let _ = ready.send(true);
                if drip {
                    for b in bytes {
                        if released.load(Relaxed) || c.write_all(&[b]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(300));
                    }
                } else {
                    let _ = c.write_all(&bytes);
                }
                while !released.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    // Lets the attackers go however the test ends.
    struct Release(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let release = Release(released);
    for _ in &threads {
        let ok = connected.recv_timeout(Duration::from_secs(10));
        assert_eq!(ok, Ok(true), "an attacker could not connect");
    }
    // Meanwhile the kubelet's calls are answered: not starved. Each must
    // come back within `LIMIT` (which `allocate` applies), a liveness
    // bound, not a latency figure: this VM's speed drifts up to 3x and
    // tokio, tonic and hyper are debug builds here, so how fast the plugin
    // answers is no test's to say. At least 3 calls, for at least 3 s
    // (while the drip goes on).
    let start = std::time::Instant::now();
    let mut calls = 0;
    while calls < 3 || start.elapsed() < Duration::from_secs(3) {
        if let Err(e) = node.allocate(&node.endpoint("memif"), &["memif-1"]) {
            panic!("Allocate under attack, call {calls}: {e}");
        }
        calls += 1;
    }
    drop(release);
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn bad_config_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "[[pool]]\nresource = \"switchyard.io/memif\"\ninterface_type = \"memif\"\ncount = 4\npod_role = \"boss\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard-device-plugin"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pool[0].pod_role"), "{err}");
}

#[test]
fn device_plugin_to_cni_to_switch_to_testpmd() {
    let _g = serial();
    let switch = Switch::start("");
    let mut node = Node::new(&switch.control(), 2, 2);
    let kubelet = Kubelet::start(&node.rt, &node.path("plugins"));
    node.start_plugin();
    kubelet.registrations(2);

    // The kubelet allocates one device per pod: pod A gets a memif socket,
    // pod B a vhost-user one.
    let a = node
        .allocate(&node.endpoint("memif"), &["memif-1"])
        .unwrap();
    let b = node
        .allocate(&node.endpoint("vhost-user"), &["vhost-user-0"])
        .unwrap();
    let a_sock = a.container_responses[0].envs["SWITCHYARD_SOCKET_MEMIF_1"].clone();
    let b_sock = b.container_responses[0].envs["SWITCHYARD_SOCKET_VHOST_USER_0"].clone();
    // ... and its Pod Resources API says so.
    let pod_resources = PodResourcesApi::start(&node.path("pod-resources/kubelet.sock"));
    pod_resources.allocate("default", "a", "app", "switchyard.io/memif", &["memif-1"]);
    pod_resources.allocate(
        "default",
        "b",
        "app",
        "switchyard.io/vhost-user",
        &["vhost-user-0"],
    );

    // Multus, for networks whose NADs name the pools' resources: it injects
    // the allocated device as deviceID/pciBusID, copies the plugin's
    // device-info file to the CNIDeviceInfoFile it generates, and calls the
    // CNI (support/multus.rs follows its source).
    let cni_bin = workspace_bin("switchyard-cni", "switchyard-cni");
    std::fs::create_dir_all(node.path("opt-cni-bin")).unwrap();
    std::fs::copy(&cni_bin, node.path("opt-cni-bin/switchyard")).unwrap();
    let multus = Multus {
        version: MultusVersion::V4_1,
        bin_dir: node.path("opt-cni-bin"),
        host_root: "/".into(),
        enter: Vec::new(),
        pod_resources: Some(pod_resources.socket.clone()),
        cni_dir: node.path("multus"),
        devinfo_base: node.path("devinfo"),
        cni_path: "/usr/lib/cni".into(),
    };
    let nad = |name: &str, kind: &str, resource: &str| Nad {
        namespace: "default".into(),
        name: name.into(),
        config: json!({
            "cniVersion": "1.1.0", "type": "switchyard",
            "bridge": "br-dp", "interfaceType": kind,
            "socketDir": node.path("pods"), "controlSocket": switch.control(),
            "deviceInfoDir": node.path("devinfo/dp"),
            "podResourcesSocket": node.path("pod-resources/kubelet.sock"),
            "capabilities": {"CNIDeviceInfoFile": true, "deviceID": true},
        }),
        resource_name: Some(resource.into()),
    };
    let pod = |name: &str| MultusPod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        sandbox: name.repeat(64),
        netns: format!("/var/run/netns/{name}"),
    };
    // The device comes from the kubelet's Pod Resources API, as Multus
    // takes it.
    let attach = |p: &MultusPod, net: Nad| {
        multus
            .add(p, &[(net, Selection::default(), None)])
            .unwrap_or_else(|e| panic!("ADD {}: {:?}", p.name, e.0))
            .remove(0)
    };
    let (pod_a, pod_b) = (pod("a"), pod("b"));
    let a_added = attach(&pod_a, nad("memif-net", "memif", "switchyard.io/memif"));
    let b_added = attach(
        &pod_b,
        nad("vhost-net", "vhost-user", "switchyard.io/vhost-user"),
    );
    // The plugin attached each pod on the socket of the device the kubelet
    // allocated it (the one its environment names).
    let (ra, rb) = (&a_added.result, &b_added.result);
    assert_eq!(ra["interfaces"][0]["socketPath"], a_sock.as_str());
    assert_eq!(rb["interfaces"][0]["socketPath"], b_sock.as_str());
    // The pod's network-status carries the device info, as Multus fills it
    // from the CNIDeviceInfoFile.
    assert_eq!(
        a_added.network_status["device-info"],
        json!({"type": "memif", "version": "1.1.0",
               "memif": {"role": "slave", "mode": "ethernet", "path": a_sock}})
    );
    assert_eq!(
        b_added.network_status["device-info"]["vhost-user"]["mode"],
        "client"
    );

    // The switch made the ports on the plugin's sockets, in the roles the
    // device-info files imply.
    let ports: Vec<PortInfo> = switch.client().call_as(&CtlRequest::PortList).unwrap();
    let by_sock = |s: &str| ports.iter().find(|p| p.socket() == s).unwrap();
    assert_eq!(by_sock(&a_sock).role(), "master");
    assert_eq!(by_sock(&b_sock).role(), "server");
    assert!(Path::new(&a_sock).exists() && Path::new(&b_sock).exists());

    // The pods' applications open the sockets their environment names,
    // with the MACs their network-status reports (pinned by the switch).
    let (mac_a, mac_b) = (
        a_added.network_status["mac"].as_str().unwrap(),
        b_added.network_status["mac"].as_str().unwrap(),
    );
    let mut pa = Testpmd::start(
        &[format!(
            "net_memif0,role=client,socket={a_sock},socket-abstract=no,mac={mac_a}"
        )],
        &["--forward-mode=rxonly"],
    );
    let mut pb = Testpmd::start(
        &[format!("net_virtio_user0,path={b_sock},mac={mac_b}")],
        &["--forward-mode=rxonly"],
    );
    wait_for(LIMIT, "both links up", || {
        let p: Vec<PortInfo> = switch.client().call_as(&CtlRequest::PortList).ok()?;
        (p.len() == 2 && p.iter().all(|p| p.status.link_up)).then_some(())
    });
    pa.send_bursts(2);
    assert_eq!(pb.wait_rx(0, 64), 64);
    pb.send_bursts(1);
    assert_eq!(pa.wait_rx(0, 32), 32);
    drop((pa, pb));

    // Pods deleted: Multus replays its cache; the CNI's DEL removes ports
    // and sockets, Multus the CNI device-info files; the plugin's device
    // directories and files stay for the next allocation.
    assert!(multus.del(&pod_a).is_empty());
    assert!(multus.del(&pod_b).is_empty());
    let ports: Vec<PortInfo> = switch.client().call_as(&CtlRequest::PortList).unwrap();
    assert!(ports.is_empty());
    assert!(!Path::new(&a_sock).exists() && !Path::new(&b_sock).exists());
    assert!(files_under(&node.path("devinfo/cni")).is_empty());
    assert!(Path::new(&a_sock).parent().unwrap().is_dir());
    assert_eq!(files_under(&node.path("devinfo/dp")).len(), 4);
}

/// A DaemonSet rollout with `maxSurge: 1`, as the kubelet sees its device
/// plugins: the new pod's plugin starts beside the old one and registers
/// both pools on endpoints of its own, the old one stands down, and the
/// old pod is deleted. Against a kubelet of each upstream behaviour (one
/// that drops the new plugin's client when the old one's stream ends, as
/// from 1.25 until the fix of kubernetes#121994, and one that does not),
/// with and without a kubelet restart in the middle: at the end every
/// device of both pools is allocatable, and stays so.
#[test]
fn a_rollout_leaves_the_resources_allocatable_whatever_the_kubelet() {
    for behaviour in [Behaviour::DropsTheNewClient, Behaviour::DropsOnlyItsOwn] {
        for restart in [false, true] {
            rollout(behaviour, restart);
        }
    }
}

fn rollout(behaviour: Behaviour, restart_kubelet: bool) {
    let what = format!("{behaviour:?}, kubelet restarted: {restart_kubelet}");
    let switch = Switch::start("");
    let mut node = Node::new(&switch.control(), 3, 2);
    let mut kubelet = Kubelet::start_as(&node.rt, &node.path("plugins"), behaviour);
    node.start_plugin();
    kubelet.registrations(2);
    let full = |k: &Kubelet| {
        (
            k.allocatable("switchyard.io/memif"),
            k.allocatable("switchyard.io/vhost-user"),
        ) == (3, 2)
    };
    wait_for(LIMIT, "every device allocatable", || {
        full(&kubelet).then_some(())
    });

    // The new pod's plugin: its own endpoints, registered; the old one
    // stands down.
    let mut new = Reap(Some(node.spawn_plugin("dp2.log")));
    let regs = kubelet.registrations(4);
    let endpoints: BTreeSet<&str> = regs.iter().map(|r| r.endpoint.as_str()).collect();
    assert_eq!(endpoints.len(), 4, "{what}: shared endpoints {regs:?}");
    wait_for(LIMIT, "the old plugin to stand down", || {
        (node.log().matches("standing down").count() == 2).then_some(())
    });
    if restart_kubelet {
        kubelet.restart(&node.rt);
        // Only the new plugin serves: it alone registers again.
        kubelet.registrations(2);
    }
    // The old pod is deleted: its plugin stops.
    let mut old = node.plugin.take().unwrap();
    terminate_and_check(&mut old, &node.log(), &what);
    let end = std::time::Instant::now() + LIMIT;
    while !full(&kubelet) {
        assert!(
            std::time::Instant::now() < end,
            "{what}: allocatable memif {}, vhost-user {} after the rollout\nold plugin:\n{}\nnew plugin:\n{}",
            kubelet.allocatable("switchyard.io/memif"),
            kubelet.allocatable("switchyard.io/vhost-user"),
            node.log(),
            std::fs::read_to_string(node.path("dp2.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // ... and it stays so (the old streams' ends are behind).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        full(&kubelet),
        "{what}: allocatable memif {}, vhost-user {}\nnew plugin:\n{}",
        kubelet.allocatable("switchyard.io/memif"),
        kubelet.allocatable("switchyard.io/vhost-user"),
        std::fs::read_to_string(node.path("dp2.log")).unwrap_or_default()
    );
    let new_log = std::fs::read_to_string(node.path("dp2.log")).unwrap_or_default();
    if behaviour == Behaviour::DropsTheNewClient && !restart_kubelet {
        // The kubelet dropped the new plugin's clients when the old
        // plugin's streams ended: it registered again.
        assert!(new_log.contains("registering again"), "{what}:\n{new_log}");
    }
    // Left in the plugin dir: the kubelet's socket and the new plugin's
    // two endpoints.
    let files = files_under(&node.path("plugins"));
    assert_eq!(files.len(), 3, "{what}: {files:?}");
    let mut new = new.0.take().unwrap();
    terminate_and_check(&mut new, &new_log, &what);
}

/// A process killed if the test ends before it is stopped and checked.
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Stops a plugin with SIGTERM and checks its exit and its log.
fn terminate_and_check(p: &mut Child, log: &str, what: &str) {
    let ending = terminate(p, Duration::from_secs(5));
    common::check_ending(&format!("the device plugin ({what})"), ending, log, &[]);
}

/// A plugin that stood down for a newer one serves again when that one is
/// gone (it crashed, or its pod went first): the newest live plugin
/// serves, and every device is allocatable again.
#[test]
fn a_plugin_that_stood_down_serves_again_when_the_newer_one_dies() {
    let switch = Switch::start("");
    let mut node = Node::new(&switch.control(), 3, 2);
    let kubelet = Kubelet::start_as(
        &node.rt,
        &node.path("plugins"),
        Behaviour::DropsTheNewClient,
    );
    node.start_plugin();
    kubelet.registrations(2);
    let mut new = Reap(Some(node.spawn_plugin("dp2.log")));
    kubelet.registrations(4);
    wait_for(LIMIT, "the old plugin to stand down", || {
        (node.log().matches("standing down").count() == 2).then_some(())
    });
    // The newer one crashes.
    new.0.as_mut().unwrap().kill().unwrap();
    new.0.as_mut().unwrap().wait().unwrap();
    wait_for(LIMIT, "the old plugin to serve again", || {
        (node.log().matches("serving again").count() == 2).then_some(())
    });
    kubelet.registrations(6);
    wait_for(LIMIT, "every device allocatable", || {
        (kubelet.allocatable("switchyard.io/memif") == 3
            && kubelet.allocatable("switchyard.io/vhost-user") == 2)
            .then_some(())
    });
}

/// The kubelet restarts (wiping every endpoint) while a rollout's two
/// plugins run, the old one stood down: the newer one serves and registers
/// again, the old one stays down (one empty look is a restart, not the
/// newer one gone), and every device stays allocatable, restart after
/// restart.
#[test]
fn kubelet_restarts_during_a_rollout_leave_the_newer_plugin_serving() {
    let switch = Switch::start("");
    let mut node = Node::new(&switch.control(), 3, 2);
    let mut kubelet = Kubelet::start_as(
        &node.rt,
        &node.path("plugins"),
        Behaviour::DropsTheNewClient,
    );
    node.start_plugin();
    kubelet.registrations(2);
    let new = Reap(Some(node.spawn_plugin("dp2.log")));
    kubelet.registrations(4);
    wait_for(LIMIT, "the old plugin to stand down", || {
        (node.log().matches("standing down").count() == 2).then_some(())
    });
    let full = |k: &Kubelet| {
        k.allocatable("switchyard.io/memif") == 3 && k.allocatable("switchyard.io/vhost-user") == 2
    };
    for round in 0..5 {
        kubelet.restart(&node.rt);
        kubelet.registrations(2);
        wait_for(LIMIT, "every device allocatable", || {
            full(&kubelet).then_some(())
        });
        // Past the old plugin's empty checks and any stream's end.
        std::thread::sleep(Duration::from_millis(1500));
        let logs = format!(
            "old plugin:\n{}\nnew plugin:\n{}",
            node.log(),
            std::fs::read_to_string(node.path("dp2.log")).unwrap_or_default()
        );
        assert!(full(&kubelet), "round {round}: allocatable fell\n{logs}");
        assert!(
            !node.log().contains("serving again"),
            "round {round}: the old plugin served again\n{logs}"
        );
        let current = kubelet.current("switchyard.io/memif").endpoint;
        assert!(
            std::fs::read_to_string(node.path("dp2.log"))
                .unwrap_or_default()
                .contains(&current),
            "round {round}: registered endpoint {current} is not the new plugin's\n{logs}"
        );
    }
    let mut old = node.plugin.take().unwrap();
    terminate_and_check(&mut old, &node.log(), "old plugin");
    let mut new = new;
    let mut p = new.0.take().unwrap();
    terminate_and_check(
        &mut p,
        &std::fs::read_to_string(node.path("dp2.log")).unwrap_or_default(),
        "new plugin",
    );
}
