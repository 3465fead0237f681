//! The Kubernetes manifests in `config/kubernetes/` (and the CNI-only
//! NetworkAttachmentDefinitions in `config/cni/`): every built-in kind
//! validated strictly against the Kubernetes schemas (the `kubernetes-validate`
//! package, which `scripts/test.sh` installs), and the parts Kubernetes
//! does not check (NetworkAttachmentDefinitions, the embedded configs)
//! parsed by our own parsers and checked against each other.

use std::path::{Path, PathBuf};

#[path = "support/admission.rs"]
mod admission;
#[path = "support/kubernetes_validate.rs"]
mod kubernetes_validate;
#[path = "support/scheduler.rs"]
mod scheduler;

use serde::Deserialize;
use serde_json::json;
use serde_yaml::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn manifests() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for dir in ["config/kubernetes", "config/cni"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap().flatten() {
            let p = e.path();
            // kustomization.yaml is kustomize's, not an object to apply.
            if p.extension().is_some_and(|x| x == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                v.push(p);
            }
        }
    }
    v.sort();
    assert!(v.len() >= 4, "{v:?}");
    v
}

fn documents(p: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(p).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn all_documents() -> Vec<Value> {
    manifests().iter().flat_map(|p| documents(p)).collect()
}

#[test]
fn builtin_kinds_pass_the_kubernetes_schemas_strictly() {
    kubernetes_validate::validate_strictly(&manifests());
}

/// The NetworkAttachmentDefinition CRD (k8s.cni.cncf.io/v1), which the
/// Kubernetes schemas do not know: the fields of its published schema only.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Nad {
    api_version: String,
    kind: String,
    metadata: Meta,
    spec: NadSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NadSpec {
    config: String,
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn device_plugin_config(docs: &[Value]) -> switchyard_device_plugin::config::Config {
    let cm = of_kind(docs, "ConfigMap")[0];
    switchyard_device_plugin::config::Config::parse(
        cm["data"]["device-plugin.toml"].as_str().unwrap(),
    )
    .unwrap()
}

#[test]
fn network_attachments_are_valid_netconfs_naming_real_resources() {
    let docs = all_documents();
    let dp = device_plugin_config(&docs);
    let nads = of_kind(&docs, "NetworkAttachmentDefinition");
    assert!(nads.len() >= 4);
    let mut with_resource = 0;
    for v in nads {
        let nad: Nad = serde_yaml::from_value(v.clone()).unwrap();
        assert_eq!(nad.api_version, "k8s.cni.cncf.io/v1");
        assert_eq!(nad.kind, "NetworkAttachmentDefinition");
        let nc = switchyard_cni::netconf::NetConf::parse(nad.spec.config.as_bytes())
            .unwrap_or_else(|e| panic!("{}: {}", nad.metadata.name, e.msg));
        let raw: serde_json::Value = serde_json::from_str(&nad.spec.config).unwrap();
        // Multus takes the network name from the NAD.
        assert_eq!(raw["name"], nad.metadata.name.as_str());
        assert_eq!(raw["capabilities"]["CNIDeviceInfoFile"], true);
        assert!(
            nc.ignored.is_empty(),
            "{}: unknown keys {:?}",
            nad.metadata.name,
            nc.ignored
        );
        if let Some(res) = nad
            .metadata
            .annotations
            .get("k8s.v1.cni.cncf.io/resourceName")
        {
            with_resource += 1;
            let pool = dp
                .pools
                .iter()
                .find(|p| &p.resource == res)
                .unwrap_or_else(|| panic!("{res} is not a device plugin pool"));
            assert_eq!(nc.pod_role.kind(), pool.pod_role.kind(), "{res}");
            // The CNI accepts the plugin's sockets only inside its socketDir,
            // and finds the device's file where the plugin writes them.
            assert!(dp.socket_dir.starts_with(&nc.socket_dir), "{res}");
            assert_eq!(dp.devinfo_dir, nc.device_info_dir, "{res}");
            // Multus passes deviceID in runtimeConfig only when declared.
            assert_eq!(raw["capabilities"]["deviceID"], true, "{res}");
            assert!(nad.metadata.namespace.is_some());
        }
    }
    assert_eq!(with_resource, 3);
}

#[test]
fn a_network_on_a_physnet_or_overlay_names_one_of_the_switchs() {
    let docs = all_documents();
    let cm = of_kind(&docs, "ConfigMap")[0];
    let sw =
        switchyard::config::Config::parse(cm["data"]["switchyard.toml"].as_str().unwrap()).unwrap();
    let mut on_overlay = 0;
    for v in of_kind(&docs, "NetworkAttachmentDefinition") {
        let raw: serde_json::Value =
            serde_json::from_str(v["spec"]["config"].as_str().unwrap()).unwrap();
        let Some(p) = raw["physnet"].as_str() else {
            continue;
        };
        if sw.overlays.contains_key(p) {
            on_overlay += 1;
        } else {
            assert!(
                sw.physnets.contains_key(p),
                "{}: no physnet or overlay {p}",
                raw["name"]
            );
        }
    }
    assert_eq!(on_overlay, 1, "the shipped overlay has a network");
}

#[test]
fn daemonset_configs_parse_and_its_mounts_cover_their_paths() {
    let docs = all_documents();
    let dp = device_plugin_config(&docs);
    let cm = of_kind(&docs, "ConfigMap")[0];
    let sw =
        switchyard::config::Config::parse(cm["data"]["switchyard.toml"].as_str().unwrap()).unwrap();
    assert!(sw.dataplane.auto_pin);
    assert_eq!(dp.control_socket, sw.control_socket);

    let ds = of_kind(&docs, "DaemonSet")[0];
    let spec = &ds["spec"]["template"]["spec"];
    let volumes = spec["volumes"].as_sequence().unwrap();
    let host_path = |name: &str| -> PathBuf {
        let v = volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap();
        PathBuf::from(v["hostPath"]["path"].as_str().unwrap())
    };
    // Every path a container uses lies under one of its mounts, and the
    // mount's host path is the same path (so socket paths mean the same on
    // the host, for the CNI, and in the containers).
    let covered = |container: &str, path: &Path| {
        let c = spec["containers"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"].as_str() == Some(container))
            .unwrap();
        let path = Path::new("/run").join(path.strip_prefix("/var/run").unwrap_or(path));
        let ok = c["volumeMounts"].as_sequence().unwrap().iter().any(|m| {
            let at = PathBuf::from(m["mountPath"].as_str().unwrap());
            let at = Path::new("/run").join(at.strip_prefix("/var/run").unwrap_or(&at));
            let name = m["name"].as_str().unwrap();
            name != "config" && path.starts_with(&at) && {
                let hp = host_path(name);
                Path::new("/run").join(hp.strip_prefix("/var/run").unwrap_or(&hp)) == at
            }
        });
        assert!(ok, "{container}: {} is not mounted", path.display());
    };
    covered("switch", &sw.control_socket);
    covered("switch", &sw.state_dir);
    for p in [
        &dp.plugin_dir,
        &dp.devinfo_dir,
        &dp.cdi_dir,
        &dp.socket_dir,
        &dp.control_socket,
    ] {
        covered("device-plugin", p);
    }
    // The overlays' node watcher talks to the same switch.
    let sync = spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some("vtep-sync"))
        .unwrap();
    let argv: Vec<&str> = sync["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = argv.iter().position(|a| *a == "--control-socket").unwrap();
    assert_eq!(Path::new(argv[at + 1]), sw.control_socket);
    covered("vtep-sync", &sw.control_socket);
    // The CNI binary lands in /opt/cni/bin.
    assert_eq!(host_path("cni-bin"), PathBuf::from("/opt/cni/bin"));
}

#[test]
fn example_pod_asks_for_a_network_whose_nad_names_a_pool() {
    let docs = all_documents();
    let dp = device_plugin_config(&docs);
    let pod = of_kind(&docs, "Pod")[0];
    // The pod asks only for the network (the admission webhook adds the
    // resource: webhook/tests); the network's NAD names the pool.
    let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
    let res = &dp.pools[0].resource;
    assert!(limits.get(res.as_str()).is_none());
    let nad = of_kind(&docs, "NetworkAttachmentDefinition")
        .into_iter()
        .find(|n| n["metadata"]["name"].as_str() == Some("switchyard-memif"))
        .unwrap();
    assert_eq!(
        nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"].as_str(),
        Some(res.as_str())
    );
    assert_eq!(
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"].as_str(),
        Some("switchyard-memif")
    );
    let cmd = pod["spec"]["containers"][0]["command"][2].as_str().unwrap();
    assert!(cmd.contains(&dp.pools[0].list_env()), "{cmd}");
}

#[test]
fn webhook_manifests_fit_together() {
    let docs = all_documents();
    let one = |kind: &str, name: &str| {
        of_kind(&docs, kind)
            .into_iter()
            .find(|d| d["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("{kind} {name}"))
            .clone()
    };
    let deploy = one("Deployment", "switchyard-webhook");
    let ns = deploy["metadata"]["namespace"]
        .as_str()
        .unwrap()
        .to_string();
    let svc = one("Service", "switchyard-webhook");
    assert_eq!(svc["metadata"]["namespace"].as_str(), Some(ns.as_str()));
    let mwc = one(
        "MutatingWebhookConfiguration",
        "switchyard-network-resources",
    );
    let hook = &mwc["webhooks"][0];
    let client = &hook["clientConfig"]["service"];
    assert_eq!(client["name"], svc["metadata"]["name"]);
    assert_eq!(client["namespace"].as_str(), Some(ns.as_str()));
    assert_eq!(client["path"].as_str(), Some("/mutate"));
    // Pods of the system and of the webhook itself are never sent to it.
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(excluded["operator"].as_str(), Some("NotIn"));
    let values: Vec<&str> = excluded["values"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        values.contains(&"kube-system") && values.contains(&ns.as_str()),
        "{values:?}"
    );
    // Only pods that ask for networks are sent to it (the API server's
    // CEL, `object` the pod): a pod without, or with other annotations,
    // never waits on the webhook.
    let conditions = hook["matchConditions"].as_sequence().unwrap();
    assert_eq!(conditions.len(), 1);
    let program =
        cel_interpreter::Program::compile(conditions[0]["expression"].as_str().unwrap()).unwrap();
    for (annotations, sent) in [
        (
            Some(json!({"k8s.v1.cni.cncf.io/networks": "switchyard-memif"})),
            true,
        ),
        (
            Some(json!({"v1.multus-cni.io/default-network": "kube-system/x"})),
            true,
        ),
        (Some(json!({"prometheus.io/scrape": "true"})), false),
        (Some(json!({})), false),
        (None, false),
    ] {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a"}, "spec": {"containers": []}});
        if let Some(a) = &annotations {
            pod["metadata"]["annotations"] = a.clone();
        }
        let mut ctx = cel_interpreter::Context::default();
        ctx.add_variable("object", pod).unwrap();
        assert_eq!(
            program.execute(&ctx).unwrap(),
            cel_interpreter::Value::Bool(sent),
            "annotations {annotations:?}"
        );
    }
    // The deployment's failure policy flag matches the configuration's.
    let args: Vec<&str> = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let policy = hook["failurePolicy"].as_str().unwrap().to_lowercase();
    assert!(
        args.contains(&format!("--failure-policy={policy}").as_str()),
        "{args:?}"
    );
    // The TLS Secret mounted is the one cert-manager and the script write.
    let secret = deploy["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
        .as_str()
        .unwrap();
    let cert = one("Certificate", "switchyard-webhook");
    assert_eq!(cert["spec"]["secretName"].as_str(), Some(secret));
    let script = std::fs::read_to_string(repo().join("scripts/webhook-certs.sh")).unwrap();
    assert!(script.contains("svc=switchyard-webhook") && script.contains("\"$svc-tls\""));
    assert_eq!(secret, "switchyard-webhook-tls");
    // Only reading NADs: get, list and watch.
    let role = one("ClusterRole", "switchyard-webhook");
    let rules = role["rules"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["resources"][0].as_str(),
        Some("network-attachment-definitions")
    );
    let verbs: Vec<&str> = rules[0]["verbs"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(verbs, ["get", "list", "watch"]);
}

/// The Pod Security level each pod we ship meets, by the admission
/// stand-in (`support/admission.rs`): the webhook's pods `restricted` (so
/// its namespace could be), the example pod `baseline` (it runs as root to
/// install DPDK), the DaemonSet's only `privileged` (whole_node checks
/// that its namespace says so).
#[test]
fn pods_we_ship_meet_their_pod_security_levels() {
    let docs = all_documents();
    let level = |l: &str| -> Value {
        serde_yaml::from_str(&format!(
            "metadata: {{name: ns, labels: {{pod-security.kubernetes.io/enforce: {l}}}}}"
        ))
        .unwrap()
    };
    // Pod Security alone (whole_node checks the quotas).
    let cluster = admission::Cluster {
        limited_priority_classes: Vec::new(),
        ..admission::Cluster::as_operators_run_it()
    };
    let admit = |l: &str, spec: &Value| cluster.admit_pod(Some(&level(l)), &[], 0, "p", spec);
    let template = |kind: &str, name: &str| -> Value {
        of_kind(&docs, kind)
            .into_iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))["spec"]["template"]["spec"]
            .clone()
    };
    admit("restricted", &template("Deployment", "switchyard-webhook")).unwrap();
    let example = of_kind(&docs, "Pod")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "testpmd-memif")
        .unwrap()["spec"]
        .clone();
    admit("baseline", &example).unwrap();
    let e = admit("restricted", &example).unwrap_err();
    assert!(e.contains("runAsNonRoot != true"), "{e}");
    let ds = template("DaemonSet", "switchyard");
    assert!(admit("baseline", &ds).is_err());
    admit("privileged", &ds).unwrap();
}

/// A drain takes the webhook's replicas one at a time: the budget lets the
/// first be evicted and refuses the second until the first one's
/// replacement is Ready; the replicas prefer different nodes.
#[test]
fn a_drain_evicts_one_webhook_replica_at_a_time() {
    let docs = all_documents();
    let deploy = of_kind(&docs, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "switchyard-webhook")
        .unwrap()
        .clone();
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    let pdb = of_kind(&docs, "PodDisruptionBudget")
        .into_iter()
        .find(|p| {
            p["metadata"]["namespace"] == deploy["metadata"]["namespace"]
                && p["spec"]["selector"]["matchLabels"]
                    .as_mapping()
                    .unwrap()
                    .iter()
                    .all(|(k, v)| labels[k] == *v)
        })
        .expect("a PodDisruptionBudget selecting the webhook's pods")
        .clone();
    let replicas = deploy["spec"]["replicas"].as_i64().unwrap();
    assert_eq!(replicas, 2);
    let mut budget = admission::Disruptions::new(&pdb, replicas);
    budget.evict(&["hook-a", "hook-b"], "hook-a").unwrap();
    let refused = budget.evict(&["hook-a", "hook-b"], "hook-b").unwrap_err();
    assert!(refused.contains("disruption budget"), "{refused}");
    // hook-a is gone and its replacement is Ready: the next one may go.
    budget.gone("hook-a");
    budget.evict(&["hook-b", "hook-c"], "hook-b").unwrap();
    // Spread: the replicas prefer different nodes.
    let term = &deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(&term["labelSelector"]["matchLabels"], labels);
}

/// The cert-manager variant signs the serving certificate with a CA of its
/// own (a self-signed issuer makes it, a CA issuer uses it), so a renewal
/// keeps the CA the webhook configuration trusts.
#[test]
fn cert_manager_signs_the_webhook_with_a_ca_of_its_own() {
    let text = std::fs::read_to_string(repo().join("config/kubernetes/webhook-cert-manager.yaml"))
        .unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))
    };
    let serving = find("Certificate", "switchyard-webhook");
    assert_eq!(serving["spec"]["secretName"], "switchyard-webhook-tls");
    assert_ne!(serving["spec"]["isCA"].as_bool(), Some(true));
    let issuer = find(
        "Issuer",
        serving["spec"]["issuerRef"]["name"].as_str().unwrap(),
    );
    let ca_secret = issuer["spec"]["ca"]["secretName"]
        .as_str()
        .expect("the serving certificate's issuer is a CA issuer");
    let ca = docs
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == ca_secret)
        .expect("a Certificate makes the CA issuer's secret");
    assert_eq!(ca["spec"]["isCA"].as_bool(), Some(true));
    let root = find("Issuer", ca["spec"]["issuerRef"]["name"].as_str().unwrap());
    assert!(root["spec"]["selfSigned"].is_mapping(), "{root:?}");
    // The CA outlives many renewals of the serving certificate (90 days
    // by default).
    let hours: u64 = ca["spec"]["duration"]
        .as_str()
        .unwrap()
        .trim_end_matches('h')
        .parse()
        .unwrap();
    assert!(hours >= 5 * 365 * 24, "{hours} h");
}

/// `kubectl apply -k config/kubernetes` names the image once: with the
/// kustomization's `images` set to another registry and tag, `kubectl
/// kustomize` (the build `apply -k` applies) gives every container and init
/// container of the DaemonSet and the webhook that image, leaves the
/// objects as the files have them otherwise, and its output passes the
/// Kubernetes schemas strictly.
#[test]
fn the_kustomization_names_the_image_once() {
    let dir = tempfile::tempdir().unwrap();
    let src = repo().join("config/kubernetes");
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let k_path = dir.path().join("kustomization.yaml");
    let mut k: Value = serde_yaml::from_str(&std::fs::read_to_string(&k_path).unwrap()).unwrap();
    let shipped = k["images"][0].clone();
    assert_eq!(shipped["name"], "switchyard");
    k["images"][0]["newName"] = "registry.example/team/switchyard".into();
    k["images"][0]["newTag"] = "9.9.9".into();
    std::fs::write(&k_path, serde_yaml::to_string(&k).unwrap()).unwrap();
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir.path())
        .output()
        .expect("kubectl (./scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built: Vec<Value> = serde_yaml::Deserializer::from_slice(&out.stdout)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    // The same objects as the files listed.
    let listed: Vec<Value> = k["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| documents(&src.join(r.as_str().unwrap())))
        .collect();
    let ids = |docs: &[Value]| {
        let mut v: Vec<String> = docs
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&built), ids(&listed));
    // Every image, and only through the kustomization.
    let mut images = Vec::new();
    for d in &built {
        let spec = &d["spec"]["template"]["spec"];
        for c in ["initContainers", "containers"]
            .iter()
            .filter_map(|k| spec[*k].as_sequence())
            .flatten()
        {
            images.push(c["image"].as_str().unwrap().to_string());
        }
    }
    assert!(images.len() >= 5, "{images:?}");
    assert!(
        images
            .iter()
            .all(|i| i == "registry.example/team/switchyard:9.9.9"),
        "{images:?}"
    );
    // The shipped one names the image the README builds.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let tag = format!(
        "{}:{}",
        shipped["newName"].as_str().unwrap(),
        shipped["newTag"].as_str().unwrap()
    );
    assert!(
        readme.contains(&format!("docker build -t {tag} .")),
        "{tag}"
    );
    let file = dir.path().join("built.yaml");
    std::fs::write(&file, &out.stdout).unwrap();
    kubernetes_validate::validate_strictly(&[file]);
}
