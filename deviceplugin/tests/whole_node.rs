//! The whole node, from the files we ship as they are: on a scratch node
//! (`support/node_root.rs`: a mount namespace where `/run`, `/var/lib` and
//! `/opt` are empty), the DaemonSet of `config/kubernetes/switchyard.yaml`
//! runs under podman exactly as its pod spec says (the image the Dockerfile
//! describes, the init container's script, the ConfigMap's configurations,
//! the security contexts, the volumes); the example pod of
//! `testpmd-pod.yaml` is admitted with the webhook's patch; the kubelet
//! stand-in registers the device plugin, allocates what the admitted pod
//! asks for and answers the Pod Resources API; the Multus stand-in (of each
//! version users run) attaches the pod to its NAD from
//! `network-attachments.yaml`, finding the plugin by `type` in
//! `/opt/cni/bin` and running it in the node's root; and containers started
//! as the kubelet starts them (the Allocate response's environment and
//! mounts, its CDI devices, the podnetinfo volume) exchange frames through
//! the switch, one on the socket the shipped pod's `--vdev` finds, the
//! other on the one the README's example finds by the network's name. Then
//! the same with non-root pods, and the switch container serving every
//! other port kind.

#[path = "support/admission.rs"]
mod admission;
#[path = "../../vtepsync/tests/support/api_server.rs"]
mod api_server;
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
#[path = "support/node_root.rs"]
mod node_root;
#[path = "../../cni/tests/support/pod_resources.rs"]
mod pod_resources;
#[path = "support/scheduler.rs"]
mod scheduler;

use std::time::Duration;

use api_server::ApiServer;
use common::{rx_packets, serial, wait_for, workspace_bin};
use kubelet::Kubelet;
use multus::{Multus, MultusVersion, Nad, Pod};
use node_root::{documents, find, Cluster, Image, NodeRoot};
use pod_resources::PodResourcesApi;
use serde_json::json;
use switchyard_api::{Client, PortInfo, Request};
use switchyard_device_plugin::api::device_plugin_client::DevicePluginClient;
use switchyard_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, RegisterRequest,
};
use switchyard_device_plugin::run::uds_channel;
use tokio::runtime::Runtime;

const LIMIT: Duration = Duration::from_secs(30);

fn toml_value(cfg: &str, key: &str) -> String {
    let v: toml::Value = toml::from_str(cfg).unwrap();
    v[key].as_str().unwrap().to_string()
}

/// How a run departs from the shipped files.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pods {
    /// Not at all: pods run as root.
    AsShipped,
    /// Pods run as this uid and gid, with the edits the shipped files'
    /// comments give for that: `socketGroup` in the NAD, `socket_group` in
    /// the device plugin's config.
    NonRoot(u32),
}

#[test]
fn whole_node() {
    run(Pods::AsShipped, &MultusVersion::ALL);
}

#[test]
fn whole_node_with_non_root_pods() {
    run(Pods::NonRoot(65534), &[MultusVersion::V4_1]);
}

fn run(pods_as: Pods, versions: &[MultusVersion]) {
    let _g = serial();
    let ds_docs = documents("config/kubernetes/switchyard.yaml");
    let nad_docs = documents("config/kubernetes/network-attachments.yaml");
    let pod_docs = documents("config/kubernetes/testpmd-pod.yaml");
    let ds = find(&ds_docs, "DaemonSet", "switchyard");
    let mut switchyard_config = find(&ds_docs, "ConfigMap", "switchyard-config")["data"].clone();
    if let Pods::NonRoot(gid) = pods_as {
        // Top-level keys go before the first table.
        let dp = switchyard_config["device-plugin.toml"].as_str().unwrap();
        assert!(!dp.contains("socket_group"));
        let dp = dp.replacen("[[pool]]", &format!("socket_group = {gid}\n\n[[pool]]"), 1);
        switchyard_config["device-plugin.toml"] = dp.into();
    }
    let config_maps = |name: &str| {
        assert_eq!(name, "switchyard-config");
        switchyard_config.clone()
    };
    let spec = &ds["spec"]["template"]["spec"];
    let switch_cfg = config_maps("switchyard-config")["switchyard.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let dp_cfg = config_maps("switchyard-config")["device-plugin.toml"]
        .as_str()
        .unwrap()
        .to_string();

    let mut node = NodeRoot::new();
    let image = Image::build(node.dir.path(), |name| workspace_bin(name, name));

    // The API server, authorizing by the shipped RBAC objects, with this
    // node, another the DaemonSet runs on (its nodeSelector's labels) and
    // one it does not; the pod's service account token, as its
    // kube-api-access volume gives it.
    let api = ApiServer::start(
        &ds_docs
            .iter()
            .map(|d| serde_json::to_value(d).unwrap())
            .collect::<Vec<_>>(),
    );
    let namespace = ds["metadata"]["namespace"].as_str().unwrap();
    node.cluster = Some(Cluster {
        node_name: "node-1".into(),
        host: "127.0.0.1".into(),
        port: api.addr.port(),
        namespace: namespace.into(),
        token: api.token_for(namespace, spec["serviceAccountName"].as_str().unwrap()),
        ca_file: api.ca_file(),
    });
    let selected: Vec<(&str, &str)> = spec["nodeSelector"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap(), v.as_str().unwrap()))
        .collect();
    api.put_node(
        "node-1",
        &selected,
        &[("Hostname", "node-1"), ("InternalIP", "127.0.0.1")],
    );
    api.put_node("node-2", &selected, &[("InternalIP", "127.0.0.2")]);
    api.put_node(
        "windows-1",
        &[("kubernetes.io/os", "windows")],
        &[("InternalIP", "127.0.0.3")],
    );

    // The kubelet: its device plugin directory and registration server.
    let rt = Runtime::new().unwrap();
    let plugin_dir = node.path(&toml_value(&dp_cfg, "plugin_dir"));
    std::fs::create_dir_all(&plugin_dir).unwrap();
    // Of the versions most clusters run: 1.25 until the fix of
    // kubernetes#121994, which drop a rollout's new plugin when the old
    // one's streams end (see support/kubelet.rs).
    let mut kubelet = Kubelet::start(&rt, &plugin_dir);
    // ... and its Pod Resources API, where Multus and the plugin ask it.
    let pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
    let pod_resources = PodResourcesApi::start(&node.path(pod_resources_socket));

    // The DaemonSet controller creates the node's pod, and the API server
    // admits it as clusters operators run do (support/admission.rs: Pod
    // Security `baseline` by default, critical priorities limited to
    // namespaces whose quota covers them, as GKE limits them).
    let cluster_admission = admission::Cluster::as_operators_run_it();
    let ns_object = find(&ds_docs, "Namespace", namespace);
    let quotas: Vec<&serde_yaml::Value> = ds_docs
        .iter()
        .filter(|d| d["kind"] == "ResourceQuota" && d["metadata"]["namespace"] == namespace)
        .collect();
    let admit_daemon_pod = |existing: u64| {
        cluster_admission
            .admit_pod(Some(ns_object), &quotas, existing, "switchyard-x7k2p", spec)
            .unwrap_or_else(|e| panic!("the DaemonSet's pod is refused: {e}"))
    };
    admit_daemon_pod(0);
    // Exclusive CPUs for the switch's worker under the static CPU manager
    // need a Guaranteed pod (pkg/kubelet/cm/cpumanager/policy_static.go
    // `guaranteedCPUs`: 0 for any other QoS class).
    assert_eq!(
        admission::qos_class(spec),
        "Guaranteed",
        "the DaemonSet's pod: the static CPU manager pins only a Guaranteed pod's containers"
    );

    // The init containers, in order, each to completion.
    for c in spec["initContainers"].as_sequence().unwrap() {
        let args = node.container_args(spec, c, &image, &config_maps, false);
        node.run(&format!("init-{}", c["name"].as_str().unwrap()), &args);
    }
    // Every NAD's type names a plugin the init container installed where
    // Multus looks first (its binDir, /opt/cni/bin).
    let nads: Vec<Nad> = nad_docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some("NetworkAttachmentDefinition"))
        .map(|d| {
            let mut config: serde_json::Value =
                serde_json::from_str(d["spec"]["config"].as_str().unwrap()).unwrap();
            if let Pods::NonRoot(gid) = pods_as {
                assert!(config.get("socketGroup").is_none());
                config["socketGroup"] = gid.into();
            }
            Nad {
                namespace: d["metadata"]["namespace"].as_str().unwrap().into(),
                name: d["metadata"]["name"].as_str().unwrap().into(),
                config,
                resource_name: d["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
                    .as_str()
                    .map(str::to_string),
            }
        })
        .collect();
    assert!(!nads.is_empty());
    for n in &nads {
        let ty = n.config["type"].as_str().unwrap();
        let bin = node.path("/opt/cni/bin").join(ty);
        assert!(
            bin.is_file(),
            "NAD {}: type {ty:?}, but the init container installed {:?}",
            n.name,
            std::fs::read_dir(node.path("/opt/cni/bin"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
    }
    // The reference plugins a cluster has there (IPAM).
    std::fs::copy(
        "/usr/lib/cni/host-local",
        node.path("/opt/cni/bin/host-local"),
    )
    .expect("host-local (./scripts/test.sh installs containernetworking-plugins)");

    // The DaemonSet's containers.
    let mut names = Vec::new();
    for c in spec["containers"].as_sequence().unwrap() {
        let args = with_fault_hook(c, node.container_args(spec, c, &image, &config_maps, true));
        let name = format!("ds-{}", c["name"].as_str().unwrap());
        node.run(&name, &args);
        names.push(name);
    }
    let control = node.path(&toml_value(&switch_cfg, "control_socket"));
    // The pods' ports (the overlay's tunnels are vtep-sync's, checked by
    // themselves).
    let ports = || -> Vec<PortInfo> {
        Client::connect(&control)
            .unwrap()
            .call_as::<Vec<PortInfo>>(&Request::PortList)
            .unwrap()
            .into_iter()
            .filter(|p| !matches!(p.spec.kind, switchyard_api::KindSpec::Vxlan(_)))
            .collect()
    };
    wait_for(LIMIT, "the switch", || {
        Client::connect(&control)
            .ok()
            .and_then(|mut c| c.call(&Request::Ping).ok())
    });
    // The overlays of the config joined to the other node of the
    // DaemonSet (not to this one, nor to the node it does not run on), and
    // left when that node goes.
    let overlays: Vec<String> = toml::from_str::<toml::Value>(&switch_cfg).unwrap()["overlays"]
        .as_table()
        .expect("the shipped config has overlays")
        .keys()
        .cloned()
        .collect();
    let vteps = || common::vteps(&control);
    let joined: Vec<(String, String)> = overlays
        .iter()
        .map(|o| (o.clone(), "127.0.0.2".to_string()))
        .collect();
    wait_for(LIMIT, "the overlays joined to node-2", || {
        (vteps() == joined).then_some(())
    });
    api.delete_node("node-2");
    wait_for(LIMIT, "node-2 left", || vteps().is_empty().then_some(()));
    api.assert_only_lists_watches_status_patches_and_leases();
    // A node that stays through the rollout below: the two vtep-syncs of
    // the rollout must neither take its tunnels out nor add them again.
    api.put_node("node-4", &selected, &[("InternalIP", "127.0.0.4")]);
    let joined4: Vec<(String, String)> = overlays
        .iter()
        .map(|o| (o.clone(), "127.0.0.4".to_string()))
        .collect();
    wait_for(LIMIT, "the overlays joined to node-4", || {
        (vteps() == joined4).then_some(())
    });
    let changes = |log: &str| (log.matches(" joined").count(), log.matches(" left").count());

    let regs = kubelet.registrations(2);
    assert!(
        regs.iter()
            .any(|r| r.resource_name == "switchyard.io/memif"),
        "the memif pool registered: {regs:?}"
    );

    // The example pod, admitted as the webhook admits it: the NADs its
    // annotation names (as the API server holds them: the shipped ones)
    // give the resources, and the webhook's own patch is applied
    // (webhook_e2e sends the same pod through the webhook binary).
    let example: serde_json::Value =
        serde_json::to_value(find(&pod_docs, "Pod", "testpmd-memif")).unwrap();
    let pod_ns = example["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let selections = switchyard_webhook::selection::parse(
        example["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
            .as_str()
            .unwrap(),
        pod_ns,
    )
    .unwrap();
    let mut needs = switchyard_webhook::mutate::Needs::new();
    let pod_nets: Vec<Nad> = selections
        .iter()
        .map(|s| {
            let nad = nads
                .iter()
                .find(|n| Some(&n.namespace) == s.namespace.as_ref() && n.name == s.name)
                .unwrap_or_else(|| panic!("the example pod's network {s:?} is not shipped"))
                .clone();
            if let Some(r) = &nad.resource_name {
                *needs.entry(r.clone()).or_default() += 1;
            }
            nad
        })
        .collect();
    let (patch, warnings) =
        switchyard_webhook::mutate::patch(&example, &needs, &Default::default());
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut admitted = example.clone();
    json_patch::patch(&mut admitted, &patch).unwrap();
    // ... and Pod Security admits it where it is created (a namespace the
    // shipped files do not label: the cluster's default level).
    let admitted_spec: serde_yaml::Value =
        serde_json::from_value(admitted["spec"].clone()).unwrap();
    cluster_admission
        .admit_pod(
            None,
            &[],
            0,
            admitted["metadata"]["name"].as_str().unwrap(),
            &admitted_spec,
        )
        .unwrap_or_else(|e| panic!("the example pod is refused: {e}"));
    let container = &admitted["spec"]["containers"][0];
    let podnetinfo_at = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "podnetinfo"))
        .expect("the webhook mounts podnetinfo")["mountPath"]
        .as_str()
        .unwrap()
        .to_string();
    // The one network, and how many of its devices the pod asks for.
    let [net] = &pod_nets[..] else {
        panic!("the example pod has one network")
    };
    let resource = net.resource_name.clone().expect("a device-plugin network");
    assert_eq!(
        container["resources"]["limits"][resource.as_str()],
        "1",
        "{admitted}"
    );
    assert_eq!(container["resources"]["requests"][resource.as_str()], "1");
    // How the shipped pod finds its socket: its testpmd --vdev, which reads
    // the device plugin's environment.
    let pod_script = container["command"][2].as_str().unwrap().to_string();
    let vdev = pod_script
        .split_whitespace()
        .find(|w| w.starts_with("--vdev="))
        .expect("the pod's --vdev")
        .to_string();

    // The README's way to find a network's socket by name.
    let readme = std::fs::read_to_string(node_root::repo().join("README.md")).unwrap();
    let podnetinfo_example = readme
        .split_once("<!-- podnetinfo-example -->\n```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .expect("the README's podnetinfo example")
        .0
        .to_string();

    // Multus on this node, with its default directories.
    let (node_root, enter) = (node.path("/"), node.enter());
    let multus = |version| Multus {
        version,
        bin_dir: "/opt/cni/bin".into(),
        host_root: node_root.clone(),
        enter: enter.clone(),
        pod_resources: Some(pod_resources_socket.into()),
        cni_dir: "/var/lib/cni/multus".into(),
        devinfo_base: "/var/run/k8s.cni.cncf.io/devinfo".into(),
        cni_path: "/opt/cni/bin".into(),
    };
    let allocate = |endpoint: &str, id: &str| -> ContainerAllocateResponse {
        let ep = plugin_dir.join(endpoint);
        rt.block_on(async {
            let mut c = DevicePluginClient::new(uds_channel(&ep).await.unwrap());
            c.allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![id.to_string()],
                }],
            })
            .await
            .unwrap()
            .into_inner()
            .container_responses
            .remove(0)
        })
    };

    // An address of the shipped memif network's range (.77 of it).
    let subnet = net.config["ipam"]["subnet"].as_str().unwrap();
    let (network, prefix) = subnet.split_once('/').unwrap();
    let first_ip = format!("{}.77/{prefix}", network.rsplit_once('.').unwrap().0);
    for (round, &version) in versions.iter().enumerate() {
        let m = multus(version);
        let mut pods = Vec::new();
        for (i, role) in ["txonly", "rxonly"].into_iter().enumerate() {
            let device = format!("memif-{}", 2 * round + i);
            // The pool's endpoint now (a rollout's new plugin's after it).
            let alloc = allocate(&kubelet.current("switchyard.io/memif").endpoint, &device);
            let pod = scratch_pod(&format!("testpmd-{round}-{i}"));
            pod_resources.allocate(
                &pod.namespace,
                &pod.name,
                container["name"].as_str().unwrap(),
                &resource,
                &[&device],
            );
            // The first pod's selection asks for an address and limits,
            // which the shipped NAD's capabilities let through (limits far
            // above what testpmd sends here).
            let selection = if round == 0 && i == 0 {
                multus::Selection {
                    ips: Some(vec![first_ip.clone()]),
                    bandwidth: Some(FIRST_POD_BANDWIDTH),
                    ..Default::default()
                }
            } else {
                Default::default()
            };
            let added = m
                .add(&pod, &[(net.clone(), selection.clone(), None)])
                .unwrap_or_else(|e| panic!("{version:?}: ADD {device}: {:?}", e.0))
                .remove(0);
            if selection.ips.is_some() {
                // Through the capability (host-local would also read the
                // `IP` Multus puts in CNI_ARGS).
                assert_eq!(added.netconf["runtimeConfig"]["ips"], json!([first_ip]));
                let (ip, _) = first_ip.split_once('/').unwrap();
                assert_eq!(added.network_status["ips"], json!([ip]));
            }
            // network-status names the socket the device plugin gave the
            // pod for the allocated device (its environment) and the pod's
            // role.
            let socket = &alloc.envs[&format!("SWITCHYARD_SOCKET_MEMIF_{}", 2 * round + i)];
            assert_eq!(
                added.network_status["device-info"]["memif"]["path"],
                socket.as_str(),
                "{version:?}"
            );
            assert_eq!(
                added.network_status["device-info"]["memif"]["role"],
                "slave"
            );
            let mut args = kubelet_container_args(&alloc);
            if let Pods::NonRoot(id) = pods_as {
                args.extend(["--user".into(), format!("{id}:{id}")]);
            }
            // The webhook's podnetinfo volume, as the kubelet fills it:
            // written when the volume is mounted, before the sandbox and
            // its networks exist (the pod's annotations then: no
            // network-status); rewritten, atomically, at a later sync once
            // Multus has set network-status (the cluster network's entry
            // first), below, after the container started.
            let podnetinfo = node.dir.path().join(format!("podnetinfo-{}", pod.name));
            std::fs::create_dir_all(&podnetinfo).unwrap();
            let networks = (
                "k8s.v1.cni.cncf.io/networks",
                admitted["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
            std::fs::write(
                podnetinfo.join("annotations"),
                downward_api_annotations(std::slice::from_ref(&networks)),
            )
            .unwrap();
            let status = json!([
                {"name": "cbr0", "interface": "eth0", "ips": ["10.244.1.7"],
                 "mac": "0a:58:0a:f4:01:07", "default": true, "dns": {}},
                added.network_status,
            ]);
            let synced = downward_api_annotations(&[
                networks,
                ("k8s.v1.cni.cncf.io/network-status", multus_indent(&status)),
            ]);
            args.extend([
                "-v".into(),
                format!("{}:{podnetinfo_at}:ro", podnetinfo.display()),
            ]);
            for l in &image.layers {
                args.extend(["-v".into(), l.clone()]);
            }
            // One pod finds its socket as the shipped pod does (its
            // --vdev, from the environment), the other by the network's
            // name, with the README's example.
            let find_socket = if i == 0 {
                vdev.clone()
            } else {
                assert!(podnetinfo_example.contains(&format!("{}/{}", net.namespace, net.name)));
                "--vdev=net_memif0,role=client,socket=$sock,socket-abstract=no".to_string()
            };
            args.extend([
                "--rootfs".into(),
                image.rootfs.display().to_string(),
                "/bin/sh".into(),
                "-c".into(),
                format!(
                    "sock=$({podnetinfo_example}) && test -S \"$sock\" && {}",
                    testpmd(&pod.name, &find_socket, role)
                ),
            ]);
            node.run(&pod.name, &args);
            // The kubelet's next sync of the pod rewrites the file (a new
            // file swapped in, as its atomic writer does): a second after
            // the container started, time for the example's first look
            // (python's start), so its loop mostly finds the rewrite at a
            // later look. (Found at the first, the test still passes.)
            std::thread::sleep(Duration::from_secs(1));
            let fresh = podnetinfo.join(".annotations.new");
            std::fs::write(&fresh, synced).unwrap();
            std::fs::rename(&fresh, podnetinfo.join("annotations")).unwrap();
            pods.push(pod);
        }
        wait_for(LIMIT, "frames from one pod at the other", || {
            (rx_packets(&node.logs(&pods[1].name)) > 1000).then_some(())
        });
        let p = ports();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().all(|p| p.status.link_up && p.role() == "master"));
        assert_eq!(limited(&p), usize::from(round == 0), "{p:?}");

        if round == 0 {
            // A rollout of the DaemonSet under these pods' traffic, as its
            // update strategy runs it: the new pod beside the old one, the
            // old one deleted once the new one is ready.
            // The DaemonSet controller drives it (support/scheduler.rs,
            // `update.go`'s surge branch), the scheduler places its pod, and
            // the containers run (the kubelet's part) only once it is bound.
            // The node: room for one more switchyard pod only when a
            // workload pod beside it ends.
            let rollout = scheduler::Rollout::of(ds);
            let per_pod = scheduler::pod_requests(spec);
            let node_allocatable = scheduler::Resources {
                cpu: 2 * per_pod.cpu + 1000,
                memory: 2 * per_pod.memory + (1 << 30),
            };
            let mut workloads = vec![
                scheduler::Resources {
                    cpu: 800,
                    memory: 256 << 20,
                },
                scheduler::Resources {
                    cpu: 700,
                    memory: 256 << 20,
                },
            ];
            let requested = |w: &[scheduler::Resources]| {
                w.iter().fold(per_pod, |a, b| a + *b) // the old pod and the workloads
            };
            let mut ds_pods = vec![scheduler::DsPod {
                name: "ds".into(),
                updated: false,
                ready_since: Some(std::time::Instant::now()),
            }];
            let sync = rollout.sync(&ds_pods, std::time::Instant::now());
            assert_eq!(
                sync,
                scheduler::Sync {
                    create: true,
                    delete: vec![]
                },
                "the controller surges"
            );
            ds_pods.push(scheduler::DsPod {
                name: "ds2".into(),
                updated: true,
                ready_since: None,
            });
            // The new pod asks for the switch's CPUs again while the old one
            // holds its own: Pending. The controller keeps the old pod and
            // the old switch forwards.
            let pending =
                scheduler::fits(node_allocatable, requested(&workloads), per_pod).unwrap_err();
            assert!(pending.contains("Insufficient cpu"), "{pending}");
            let waiting = rx_packets(&node.logs(&pods[1].name));
            std::thread::sleep(Duration::from_secs(2));
            assert_eq!(
                rollout.sync(&ds_pods, std::time::Instant::now()),
                scheduler::Sync::default(),
                "the controller deleted or created while the new pod was Pending"
            );
            assert!(
                rx_packets(&node.logs(&pods[1].name)) > waiting + 1000,
                "the old switch stopped forwarding while the rollout waited"
            );
            assert!(switch_probe(&node, spec, "ds-switch", "readinessProbe"));
            // The headroom docs/kubernetes.md names (one more pod's
            // requests) is what the new pod needs.
            let docs =
                std::fs::read_to_string(node_root::repo().join("docs/kubernetes.md")).unwrap();
            for headroom in [
                format!("{}m CPU", per_pod.cpu),
                format!("{}Mi memory", per_pod.memory >> 20),
            ] {
                assert!(
                    docs.contains(&headroom),
                    "docs/kubernetes.md names no headroom of {headroom}"
                );
            }
            // The API server admitted the new pod (the old one counts
            // against the quota).
            admit_daemon_pod(1);
            // A workload pod ends: the scheduler tries again and binds it.
            workloads.pop();
            scheduler::fits(node_allocatable, requested(&workloads), per_pod)
                .expect("the new pod fits once the workload pod ended");
            let sent = rx_packets(&node.logs(&pods[1].name));
            let vtep_changes = changes(&node.logs("ds-vtep-sync"));
            let mut new_names = Vec::new();
            for c in spec["containers"].as_sequence().unwrap() {
                let args =
                    with_fault_hook(c, node.container_args(spec, c, &image, &config_maps, true));
                let name = format!("ds2-{}", c["name"].as_str().unwrap());
                node.run(&name, &args);
                new_names.push(name);
            }
            let probe = |container: &str, kind: &str| switch_probe(&node, spec, container, kind);
            wait_for(LIMIT, "the new pod's switch ready", || {
                probe("ds2-switch", "readinessProbe").then_some(())
            });
            ds_pods[1].ready_since = Some(std::time::Instant::now());
            assert!(
                !probe("ds-switch", "readinessProbe"),
                "the old switch still serves"
            );
            // The old pod is no longer Ready (its switch serves nothing):
            // the controller deletes it at once (and would once the new one
            // is available, in any case).
            ds_pods[0].ready_since = None;
            let sync = rollout.sync(&ds_pods, std::time::Instant::now());
            assert_eq!(
                sync,
                scheduler::Sync {
                    create: false,
                    delete: vec!["ds".into()]
                }
            );
            assert!(
                probe("ds-switch", "livenessProbe"),
                "the kubelet would restart the old switch"
            );
            // The new device plugin registered both pools in its turn, on
            // endpoints of its own; the old one saw it and stood down. When
            // the old streams end after the new plugin registered, this
            // kubelet drops the new plugin's clients, which register again:
            // two or four new registrations, by that order. Either way the
            // kubelet ends up with the new endpoints and every device stays
            // allocatable.
            kubelet.registrations(4);
            wait_for(LIMIT, "the old device plugin to stand down", || {
                (node
                    .logs("ds-device-plugin")
                    .matches("standing down")
                    .count()
                    == 2)
                    .then_some(())
            });
            let allocatable = |k: &Kubelet| {
                ["switchyard.io/memif", "switchyard.io/vhost-user"]
                    .iter()
                    .all(|r| k.allocatable(r) > 0 && k.allocatable(r) == k.capacity(r))
            };
            let old_endpoint = |r: &RegisterRequest| regs.iter().any(|o| o.endpoint == r.endpoint);
            wait_for(LIMIT, "every device allocatable beside the old pod", || {
                (allocatable(&kubelet)
                    && ["switchyard.io/memif", "switchyard.io/vhost-user"]
                        .iter()
                        .all(|r| !old_endpoint(&kubelet.current(r))))
                .then_some(())
            });
            let again = kubelet.registrations(4);
            let new = again.iter().filter(|r| !old_endpoint(r)).count();
            assert!(new == 2 || new == 4, "{again:?}");
            assert_eq!(
                again.len() - new,
                regs.len(),
                "the old plugin registered again: {again:?}"
            );
            // The kubelet restarts mid-rollout (the old pod terminating):
            // only the new plugin registers again.
            kubelet.restart(&rt);
            kubelet.registrations(2);
            wait_for(
                LIMIT,
                "every device allocatable after a kubelet restart",
                || allocatable(&kubelet).then_some(()),
            );
            // The old pod, deleted above, terminates (the kubelet restart
            // came within its grace period). The ports, their connections
            // and the device-info files stay.
            let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30) as u32;
            // (The old vtep-sync's log, before its container goes.)
            let old_sync_changes = changes(&node.logs("ds-vtep-sync"));
            for n in std::mem::replace(&mut names, new_names) {
                node.remove(&n, grace);
            }
            assert_eq!(
                old_sync_changes, vtep_changes,
                "the old vtep-sync changed tunnels"
            );
            wait_for(LIMIT, "every device allocatable after the rollout", || {
                allocatable(&kubelet).then_some(())
            });
            std::thread::sleep(Duration::from_secs(1));
            assert!(allocatable(&kubelet), "allocatable lost after the rollout");
            let after = ports();
            assert_eq!(after.len(), 2, "{after:?}");
            assert_eq!(
                limited(&after),
                1,
                "the limits lost in the rollout: {after:?}"
            );
            for (a, b) in after.iter().zip(&p) {
                assert!(a.status.link_up, "{a:?}");
                assert_eq!(a.status.connects, b.status.connects, "{a:?}");
            }
            wait_for(LIMIT, "frames through the new pod's switch", || {
                (rx_packets(&node.logs(&pods[1].name)) > sent + 1000).then_some(())
            });
            let devinfo = node.path(&toml_value(&dp_cfg, "devinfo_dir"));
            assert!(
                std::fs::read_dir(&devinfo).unwrap().count() > 0,
                "the old device plugin took the device-info files with it"
            );
            let log = node.logs("ds2-switch");
            assert!(log.contains("switchyard took over"), "{log}");
            // vtep-sync: the tunnels stayed, neither process changed any.
            assert_eq!(vteps(), joined4);
            let new_sync = node.logs("ds2-vtep-sync");
            assert!(new_sync.contains("listed the nodes"), "{new_sync}");
            assert_eq!(changes(&new_sync), (0, 0), "{new_sync}");
            api.delete_node("node-4");
            wait_for(LIMIT, "node-4 left", || vteps().is_empty().then_some(()));
            let dp_log = node.logs("ds2-device-plugin");
            eprintln!(
                "rollout: the new pod's switch took over {} ports under traffic",
                after.len()
            );
            assert!(dp_log.contains("registered with the kubelet"), "{dp_log}");
        }

        delete_pods(&mut node, &m, &pod_resources, &pods);
        assert!(ports().is_empty(), "{version:?}");
    }

    // A pod on the network that spans the nodes: its port joins the
    // overlay's bridge (the tunnels to the other nodes are there).
    let overlay_net = nads
        .iter()
        .find(|n| {
            n.config["physnet"]
                .as_str()
                .is_some_and(|p| overlays.iter().any(|o| o == p))
        })
        .expect("a shipped network on the overlay");
    let overlay_resource = overlay_net.resource_name.clone().unwrap();
    let m = multus(*versions.last().unwrap());
    let device = "memif-15";
    // The pool's endpoint now: the rollout's new plugin's.
    let endpoint = kubelet.current(&overlay_resource).endpoint;
    allocate(&endpoint, device);
    let pod = scratch_pod("overlay-pod");
    pod_resources.allocate(
        &pod.namespace,
        &pod.name,
        "app",
        &overlay_resource,
        &[device],
    );
    m.add(&pod, &[(overlay_net.clone(), Default::default(), None)])
        .unwrap_or_else(|e| panic!("ADD on {}: {:?}", overlay_net.name, e.0));
    let p = ports();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        p[0].spec.bridge.as_deref(),
        overlay_net.config["physnet"].as_str(),
        "{p:?}"
    );
    let errs = m.del(&pod);
    assert!(errs.is_empty(), "DEL: {errs:?}");
    assert!(ports().is_empty());

    if pods_as != Pods::AsShipped {
        return;
    }
    // The other shipped network, vhost-user (VLAN 200): two pods whose DPDK
    // virtio-user connects to the socket their environment names, with the
    // MAC their network-status reports (the network pins it).
    let vnet = nads
        .iter()
        .find(|n| n.resource_name.as_deref() == Some("switchyard.io/vhost-user"))
        .expect("a NAD of the vhost-user pool")
        .clone();
    let vreg = kubelet.current("switchyard.io/vhost-user");
    let m = multus(MultusVersion::V3_9);
    let mut vpods = Vec::new();
    for (i, role) in ["txonly", "rxonly"].into_iter().enumerate() {
        let device = format!("vhost-user-{i}");
        let alloc = allocate(&vreg.endpoint, &device);
        let pod = scratch_pod(&format!("vhost-{i}"));
        pod_resources.allocate(
            &pod.namespace,
            &pod.name,
            "app",
            &vreg.resource_name,
            &[&device],
        );
        let added = m
            .add(&pod, &[(vnet.clone(), Default::default(), None)])
            .unwrap_or_else(|e| panic!("ADD {device}: {:?}", e.0))
            .remove(0);
        assert_eq!(
            added.network_status["device-info"]["vhost-user"]["mode"],
            "client"
        );
        let mac = added.network_status["mac"].as_str().unwrap().to_string();
        let mut args = kubelet_container_args(&alloc);
        for l in &image.layers {
            args.extend(["-v".into(), l.clone()]);
        }
        args.extend([
            "--rootfs".into(),
            image.rootfs.display().to_string(),
            "/bin/sh".into(),
            "-c".into(),
            testpmd(
                &pod.name,
                &format!("--vdev=net_virtio_user0,path=$SWITCHYARD_VHOST_USER_SOCKETS,mac={mac}"),
                role,
            ),
        ]);
        node.run(&pod.name, &args);
        vpods.push(pod);
    }
    wait_for(LIMIT, "frames from one vhost-user pod at the other", || {
        (rx_packets(&node.logs(&vpods[1].name)) > 1000).then_some(())
    });
    let p = ports();
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p
        .iter()
        .all(|p| p.status.link_up && p.role() == "server" && p.spec.vlan == Some(200)));
    delete_pods(&mut node, &m, &pod_resources, &vpods);
    assert!(ports().is_empty());

    // Every other port kind the README offers works in the switch container
    // as the DaemonSet defines it (its capabilities, seccomp profile and
    // devices): a tap port (the host on the bridge), af-xdp and af-packet
    // uplinks on the node's interfaces, a vhost-user port.
    let veth = Veth::new();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(workspace_bin("switchyard", "switchyard"))
            .arg("--control")
            .arg(&control)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "switchyard {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cli(&[
        "port",
        "add",
        "k-tap",
        "--kind",
        "tap",
        "--interface",
        &veth.tap,
    ]);
    cli(&[
        "port",
        "add",
        "k-xdp",
        "--kind",
        "af-xdp",
        "--interface",
        &veth.a,
    ]);
    cli(&[
        "port",
        "add",
        "k-pkt",
        "--kind",
        "af-packet",
        "--interface",
        &veth.b,
    ]);
    cli(&[
        "port",
        "add",
        "k-vhost",
        "--kind",
        "vhost-user",
        "--role",
        "server",
        "--socket",
        "/run/switchyard/k-vhost.sock",
    ]);
    wait_for(LIMIT, "the kernel ports up", || {
        let p = ports();
        (p.len() == 4
            && p.iter()
                .filter(|p| p.spec.name != "k-vhost")
                .all(|p| p.status.link_up))
        .then_some(())
    });
    assert!(node.path("/run/switchyard/k-vhost.sock").exists());

    // A worker of the switch container panics (the debug builds' hook):
    // the container exits with 101, the panic and the queues the worker
    // polled in its log; the kubelet starts it again (a DaemonSet's pods
    // restart always: pkg/kubelet/kuberuntime/kuberuntime_manager.go,
    // computePodActions, restarts an exited container whose pod's policy
    // is Always, in the same pod, with the same volumes), and the state
    // file on the state volume brings every port back.
    let switch_container = names
        .iter()
        .find(|n| n.ends_with("-switch"))
        .unwrap()
        .clone();
    let before: Vec<String> = ports().into_iter().map(|p| p.spec.name).collect();
    node.expect_panic(&switch_container);
    std::fs::write(node.path(FAULT_FILE), "panic").unwrap();
    // A trace makes every worker take a new view of the table, where the
    // hook acts; its own answer does not matter (the switch may be gone),
    // and it is not asked again (the CLI would, for 15 s, of a switch that
    // comes back only when the test starts it).
    {
        let mut trace = Client::lazy(&control);
        trace.set_retry(Duration::ZERO);
        trace.set_timeout(Duration::from_secs(5)).unwrap();
        let _ = trace.call(&Request::Trace {
            count: Some(1),
            port: None,
            timeout_ms: Some(2000),
        });
    }
    let state = || {
        let o = node
            .podman(&[
                "inspect",
                "-f",
                "{{.State.Status}} {{.State.ExitCode}}",
                &switch_container,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let ended = wait_for(LIMIT, "the switch container to exit", || {
        let s = state();
        (!s.starts_with("running")).then_some(s)
    });
    // podman says `stopped` until its clean-up has run, then `exited`.
    assert!(
        ["exited 101", "stopped 101"].contains(&ended.as_str()),
        "{ended}"
    );
    let log = node.logs(&switch_container);
    let report = log
        .lines()
        .find(|l| l.contains(" ERROR ") && l.contains("the worker panicked"))
        .unwrap_or_else(|| panic!("no report of the panic:\n{log}"));
    assert!(report.contains("k-tap queue 0"), "{report}");
    assert!(log.contains("panicked at"), "{log}");
    node.podman_ok(&["start", &switch_container]);
    wait_for(LIMIT, "every port back after the restart", || {
        // Refused until the restarted switch serves its socket.
        let p: Vec<PortInfo> = Client::connect(&control)
            .ok()?
            .call_as(&Request::PortList)
            .ok()?;
        let names: Vec<&str> = p.iter().map(|p| p.spec.name.as_str()).collect();
        (names == before
            && p.iter()
                .filter(|p| p.spec.name != "k-vhost")
                .all(|p| p.status.link_up))
        .then_some(())
    });
    assert!(node.logs(&switch_container).contains("restored port"));
    assert!(
        switch_probe(&node, spec, &switch_container, "livenessProbe"),
        "the restarted switch is not live"
    );

    for n in ["k-tap", "k-xdp", "k-pkt", "k-vhost"] {
        cli(&["port", "del", n]);
    }
    drop(veth);

    // The DaemonSet's containers stop as in a rollout; the CDI spec stays
    // for containers the kubelet restarts meanwhile.
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30) as u32;
    for n in names {
        node.remove(&n, grace);
    }
    let cdi_dir = toml_value(&dp_cfg, "cdi_dir");
    assert!(node
        .path(&cdi_dir)
        .join("switchyard.io-socket.json")
        .is_file());
}

/// The first pod's limits: far above what its testpmd sends here, and
/// each figure its own, so that a direction or a burst mapped wrong shows.
const FIRST_POD_BANDWIDTH: multus::Bandwidth = multus::Bandwidth {
    ingress_rate: 10_000_000_000,
    ingress_burst: 1_000_000_000,
    egress_rate: 9_000_000_000,
    egress_burst: 900_000_000,
};

/// How many of `ports` have any limit; each must be the first pod's, its
/// ingress the port's `tx` and its egress the port's `rx`.
fn limited(ports: &[PortInfo]) -> usize {
    let b = FIRST_POD_BANDWIDTH;
    let meter = |bits: i64, burst: i64| switchyard_api::spec::Meter {
        bits_per_sec: Some(bits as u64),
        burst_bits: Some(burst as u64),
        ..Default::default()
    };
    let want = switchyard_api::spec::RateLimits {
        rx: Some(meter(b.egress_rate, b.egress_burst)),
        tx: Some(meter(b.ingress_rate, b.ingress_burst)),
    };
    let limited: Vec<_> = ports
        .iter()
        .filter_map(|p| p.spec.rate_limit.as_ref())
        .collect();
    for l in &limited {
        assert_eq!(**l, want, "{ports:?}");
    }
    limited.len()
}

/// Whether the switch container's probe `kind` (`livenessProbe`,
/// `readinessProbe`) of the pod template `spec` passes in `container`, run
/// in it as the kubelet runs an exec probe.
fn switch_probe(node: &NodeRoot, spec: &serde_yaml::Value, container: &str, kind: &str) -> bool {
    let c = spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "switch")
        .unwrap();
    let mut args = vec!["exec".to_string(), container.to_string()];
    args.extend(
        c[kind]["exec"]["command"]
            .as_sequence()
            .expect("an exec probe")
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.podman(&args).output().unwrap().status.success()
}

/// Where the debug builds' worker-fault hook looks, on the switch's
/// hostPath volume (`/run/switchyard`).
const FAULT_FILE: &str = "/run/switchyard/debug-worker-fault";

/// `args` with the debug builds' worker-fault hook
/// (`SWITCHYARD_DEBUG_WORKER_FAULT`, see dataplane/src/worker.rs) set for
/// the switch container: a test's addition to what the DaemonSet gives it,
/// which does nothing until the test writes [`FAULT_FILE`].
fn with_fault_hook(container: &serde_yaml::Value, mut args: Vec<String>) -> Vec<String> {
    if container["name"].as_str() == Some("switch") {
        args.splice(
            0..0,
            [
                "-e".to_string(),
                format!("SWITCHYARD_DEBUG_WORKER_FAULT={FAULT_FILE}"),
            ],
        );
    }
    args
}

/// A veth pair on this machine (the node's network namespace: the switch
/// runs on the host network) and a tap name, removed on drop.
struct Veth {
    a: String,
    b: String,
    tap: String,
}

impl Veth {
    fn new() -> Veth {
        let id = std::process::id() % 100_000;
        let v = Veth {
            a: format!("sywa{id}"),
            b: format!("sywb{id}"),
            tap: format!("sywt{id}"),
        };
        let ip = |args: &[&str]| {
            let st = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        ip(&["link", "add", &v.a, "type", "veth", "peer", "name", &v.b]);
        ip(&["link", "set", &v.a, "up"]);
        ip(&["link", "set", &v.b, "up"]);
        v
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        for i in [&self.a, &self.tap] {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", i])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The CNI plugin as the image ships it (`scripts/build-cni.sh`, static)
/// runs in a root that holds nothing but itself and `/proc` (Multus thick
/// runs it chrooted into the host, whose libraries are not the build
/// machine's): VERSION, and a whole ADD and DEL against a running switch
/// whose directory is bind-mounted at the same path.
#[test]
fn the_cni_plugin_runs_in_an_empty_root() {
    let _g = serial();
    let switch = common::Switch::start("");
    let root = tempfile::Builder::new()
        .prefix("sy-chroot")
        .tempdir()
        .unwrap();
    let r = root.path();
    std::fs::copy(node_root::static_cni(), r.join("switchyard")).unwrap();
    let dir = switch.dir.path().display().to_string();
    // A private mount namespace: /proc and the switch's directory appear in
    // the root only for the plugin.
    let script = format!(
        "/bin/mkdir -p {r}/proc {r}{dir} && /bin/mount -t proc proc {r}/proc && \
         /bin/mount --bind {dir} {r}{dir} && exec /usr/sbin/chroot {r} \"$1\"",
        r = r.display()
    );
    let enter: Vec<String> = [
        "/usr/bin/unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        &script,
        "sh",
    ]
    .map(String::from)
    .to_vec();
    let run = |command: &str, conf: &serde_json::Value| {
        exec::run_plugin_in(
            &enter,
            std::path::Path::new("/switchyard"),
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", &"c".repeat(64)),
                ("CNI_NETNS", "/var/run/netns/chrooted"),
                ("CNI_IFNAME", "net1"),
                (
                    "CNI_ARGS",
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=chrooted;K8S_POD_UID=uid-chrooted",
                ),
                ("CNI_PATH", "/opt/cni/bin"),
            ],
            conf,
        )
    };
    let (ok, v) = run("VERSION", &serde_json::json!({"cniVersion": "0.4.0"}));
    assert!(ok, "{v}");
    assert_eq!(v["cniVersion"], "0.4.0");
    let conf = serde_json::json!({
        "cniVersion": "0.4.0", "name": "chrooted", "type": "switchyard",
        "socketDir": switch.dir.path().join("pods"), "controlSocket": switch.control(),
    });
    let (ok, v) = run("ADD", &conf);
    assert!(ok, "ADD: {v}");
    let sock = switch.dir.path().join("pods/uid-chrooted/net1.sock");
    let ports: Vec<PortInfo> = switch.client().call_as(&Request::PortList).unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].socket(), sock.display().to_string());
    assert!(sock.exists());
    let (ok, v) = run("DEL", &conf);
    assert!(ok, "DEL: {v}");
    let ports: Vec<PortInfo> = switch.client().call_as(&Request::PortList).unwrap();
    assert!(ports.is_empty());
    assert!(!sock.exists());
}

/// What the kubelet writes for a downward-API `metadata.annotations` file
/// (`pkg/fieldpath` `FormatMap`: keys sorted, each `key=%q` and a newline).
fn downward_api_annotations(entries: &[(&str, String)]) -> String {
    let mut e = entries.to_vec();
    e.sort();
    e.iter()
        .map(|(k, v)| format!("{k}={}\n", go_quote(v)))
        .collect()
}

/// Go's `%q` of a string: a double-quoted literal, `"` and `\` escaped,
/// control characters as `\n`, `\t`, `\r` or `\xNN`.
fn go_quote(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            '\r' => o.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\x7f' => o.push_str(&format!("\\x{:02x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// network-status as the NAD client's `SetNetworkStatus` writes it:
/// `json.MarshalIndent(statuses, "", "    ")`.
fn multus_indent(v: &serde_json::Value) -> String {
    use serde::Serialize;
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    v.serialize(&mut ser).unwrap();
    String::from_utf8(out).unwrap()
}

/// The `podman run` arguments a container gets from the device plugin's
/// Allocate response, as the kubelet passes them to the runtime:
/// environment, mounts and CDI devices (detached, no network of its own).
fn kubelet_container_args(alloc: &ContainerAllocateResponse) -> Vec<String> {
    // Each container writes in a filesystem of its own (a layer of its
    // image): the rootfs these share gets none of DPDK's runtime files, which
    // a container started later would otherwise copy up into its /run.
    let mut args: Vec<String> = vec!["-d".into(), "--network".into(), "none".into()];
    args.extend(["--tmpfs", "/run/dpdk:mode=1777", "--tmpfs", "/tmp"].map(String::from));
    for (k, v) in &alloc.envs {
        args.extend(["-e".into(), format!("{k}={v}")]);
    }
    for mnt in &alloc.mounts {
        let ro = if mnt.read_only { ":ro" } else { "" };
        args.extend([
            "-v".into(),
            format!("{}:{}{ro}", mnt.host_path, mnt.container_path),
        ]);
    }
    for d in &alloc.cdi_devices {
        args.extend(["--device".into(), d.name.clone()]);
    }
    args
}

/// A pod `name` in namespace default, with a UID and sandbox id of its own.
fn scratch_pod(name: &str) -> Pod {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            h >> 32,
            (h >> 16) & 0xffff,
            h & 0xffff,
            (h >> 48) & 0xffff,
            h & 0xffff_ffff_ffff
        ),
        sandbox: format!("{h:016x}").repeat(4),
        netns: format!("/var/run/netns/{name}"),
    }
}

/// The pods go as the kubelet deletes them: their containers stop, Multus
/// runs DEL, the kubelet forgets their devices.
fn delete_pods(node: &mut NodeRoot, m: &Multus, kubelet: &PodResourcesApi, pods: &[Pod]) {
    for pod in pods {
        node.remove(&pod.name, 2);
        let errs = m.del(pod);
        assert!(
            errs.is_empty(),
            "{:?}: DEL {}: {:?}",
            m.version,
            pod.name,
            errs[0].0
        );
        kubelet.remove(&pod.namespace, &pod.name);
    }
}

/// The shell command of a pod's DPDK testpmd on `vdev`, forwarding in
/// `mode` and printing its counters every second.
fn testpmd(pod: &str, vdev: &str, mode: &str) -> String {
    format!(
        "exec dpdk-testpmd --no-huge -m 256 --no-pci --file-prefix {pod} --lcores 0@0,1@1 \
         {vdev} -- --total-num-mbufs=8192 --forward-mode={mode} --stats-period 1"
    )
}
