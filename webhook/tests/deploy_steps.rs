//! The README's deployment, step by step, as an operator runs it: each
//! line of its "Deploy on a cluster" block is run as written (the image
//! build aside: there is no registry here), with kubectl, against an API
//! server stand-in (`support/cluster_api.rs`) that calls the admission
//! webhook as the API server does. Beside it:
//!
//! - a kubelet stand-in runs the webhook Deployment's replicas, the
//!   `switchyard-webhook` binary with the Deployment's command, once the
//!   Secret its volume names exists (before, the kubelet cannot mount it
//!   and the pods wait in ContainerCreating); a replica is Ready when its
//!   readiness probe (`GET /healthz`, HTTPS, no verification, as the
//!   kubelet probes) answers, and then the Service's endpoints and the
//!   Deployment's status say so, as the EndpointSlice and Deployment
//!   controllers would;
//! - a prober creates pods in other namespaces all the while, during each
//!   step and between them: pods without networks, and pods that ask for
//!   another plugin's network (the pods a webhook that cannot answer would
//!   refuse). None may be refused at any step.
//!
//! At the end the example pod is created, and the webhook has added the
//! device resource its network needs. Then the certificate is renewed as
//! the docs say (the script run again) while pods are created, until both
//! replicas have reloaded it from their Secret volume, which the kubelet
//! stand-in updates a little after the Secret changes, as the kubelet
//! does: none is refused either.

#[path = "../../vtepsync/tests/support/api_common.rs"]
mod api_common;
#[path = "support/cluster_api.rs"]
mod cluster_api;
#[path = "../../vtepsync/tests/support/tls.rs"]
mod tls;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use cluster_api::{ClusterApi, ADMIN_TOKEN};
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The command lines of the first shell block of the README's deployment
/// section that has a line starting with `first` (comments and
/// comment-only lines left out).
fn readme_block(first: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = readme
        .find("## Deploy on a cluster")
        .expect("the README's deployment section");
    let section = &readme[at..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    section
        .split("```sh\n")
        .skip(1)
        .map(|b| {
            b[..b.find("```").unwrap()]
                .lines()
                .map(|l| l.split(" #").next().unwrap().trim().to_string())
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .collect::<Vec<String>>()
        })
        .find(|lines| lines.iter().any(|l| l.starts_with(first)))
        .unwrap_or_else(|| panic!("a block of the README's deployment section with {first:?}"))
}

/// A kubectl for the cluster as its admin.
struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(api: &ClusterApi) -> Kubectl {
        let dir = tempfile::tempdir().unwrap();
        api.kubeconfig(ADMIN_TOKEN, &dir.path().join("kubeconfig"));
        Kubectl { dir }
    }

    /// `sh -c line` in the repository, with this kubeconfig (and a home
    /// of its own for kubectl's discovery cache).
    fn sh(&self, line: &str) -> std::process::Output {
        Command::new("bash")
            .args(["-c", line])
            .current_dir(repo())
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .env("HOME", self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `kubectl create -f -` of `obj`: Ok, or kubectl's error.
    fn create(&self, obj: &Value) -> Result<(), String> {
        let mut child = Command::new("kubectl")
            .args(["create", "-f", "-"])
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .env("HOME", self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl (./scripts/test.sh installs it)");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(obj.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

fn probe_pod(ns: &str, name: &str, networks: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    if let Some(n) = networks {
        p["metadata"]["annotations"] = json!({"k8s.v1.cni.cncf.io/networks": n});
    }
    p
}

/// Creates the probe pods of one round (`tag` in their names): every
/// refusal, with kubectl's message.
fn probe_round(k: &Kubectl, tag: &str) -> Vec<String> {
    let mut refused = Vec::new();
    for (ns, networks) in [
        ("default", None),
        ("default", Some("macvlan-conf")),
        ("team-a", None),
        ("team-a", Some("default/macvlan-conf")),
        ("kube-system", None),
    ] {
        let name = format!(
            "probe-{tag}-{}",
            if networks.is_some() { "net" } else { "plain" }
        );
        if let Err(e) = k.create(&probe_pod(ns, &name, networks)) {
            refused.push(format!("{ns}/{name}: {e}"));
        }
    }
    refused
}

/// Runs `line` (what: how the log names it): its output, or why it failed.
fn run_step(k: &Kubectl, what: &str, line: &str) -> Result<(), String> {
    let out = k.sh(line);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{what}: {line}\n{text}");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{what} `{line}` failed ({}):\n{text}", out.status))
    }
}

/// A webhook replica the kubelet stand-in started.
struct Replica {
    child: Child,
    port: u16,
    log: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The kubelet (and the Deployment and EndpointSlice controllers) for the
/// webhook's Deployment: see the module's documentation.
struct Kubelet {
    dir: tempfile::TempDir,
    replicas: Vec<Replica>,
    ready: bool,
    /// The Secret's resource version in the volume, and one seen since
    /// with when it was first seen.
    volume_rv: String,
    seen_rv: Option<(String, Instant)>,
    /// Volume updates so far.
    updates: usize,
    /// The replicas were stopped because their Deployment went.
    stopped: bool,
}

/// How long the kubelet takes to bring a changed Secret into a volume (its
/// sync period and cache TTL make it up to a minute or two; shortened).
const VOLUME_DELAY: Duration = Duration::from_secs(2);

/// Writes `secret`'s keys into the volume at `mount` as the kubelet's
/// `AtomicWriter` (`pkg/volume/util/atomic_writer.go`) does: into a new
/// directory, made visible by swapping the `..data` symlink the files'
/// symlinks go through, so a reader never sees half of an update.
fn write_secret_volume(mount: &Path, secret: &Value, version: &str) {
    let dir = mount.join(format!("..{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (k, v) in secret["data"].as_object().unwrap() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        std::fs::write(dir.join(k), bytes).unwrap();
        let link = mount.join(k);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(k), &link).unwrap();
        }
    }
    let tmp = mount.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, mount.join("..data")).unwrap();
}

impl Kubelet {
    fn new() -> Kubelet {
        Kubelet {
            dir: tempfile::tempdir().unwrap(),
            replicas: Vec::new(),
            ready: false,
            volume_rv: String::new(),
            seen_rv: None,
            updates: 0,
            stopped: false,
        }
    }

    /// Brings a changed Secret into the running replicas' volume, after
    /// [`VOLUME_DELAY`].
    fn sync_volume(&mut self, api: &ClusterApi, secret_name: &str) {
        let Some(secret) = api.get("secrets", "switchyard-system", secret_name) else {
            return;
        };
        let rv = secret["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        if rv == self.volume_rv {
            return;
        }
        match &self.seen_rv {
            Some((seen, at)) if *seen == rv && at.elapsed() >= VOLUME_DELAY => {
                write_secret_volume(&self.dir.path().join("tls"), &secret, &rv);
                self.volume_rv = rv;
                self.updates += 1;
            }
            Some((seen, _)) if *seen == rv => {}
            _ => self.seen_rv = Some((rv, Instant::now())),
        }
    }

    /// One look at the cluster: starts the replicas once they can start,
    /// publishes them once Ready.
    fn sync(&mut self, api: &ClusterApi) {
        let Some(deploy) = api.get("deployments", "switchyard-system", "switchyard-webhook") else {
            // Deleted (or its namespace): the kubelet stops its pods.
            if !self.replicas.is_empty() {
                self.stop();
                self.stopped = true;
            }
            return;
        };
        let spec = &deploy["spec"]["template"]["spec"];
        if self.replicas.is_empty() {
            let volume = &spec["volumes"][0];
            let secret_name = volume["secret"]["secretName"].as_str().unwrap();
            let Some(secret) = api.get("secrets", "switchyard-system", secret_name) else {
                return;
            };
            // The Secret volume: each key a file.
            let mount = self.dir.path().join("tls");
            std::fs::create_dir_all(&mount).unwrap();
            let rv = secret["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string();
            write_secret_volume(&mount, &secret, &rv);
            self.volume_rv = rv;
            let container = &spec["containers"][0];
            let mount_path = container["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == volume["name"])
                .unwrap()["mountPath"]
                .as_str()
                .unwrap()
                .to_string();
            // Its service account's token, as the projected volume gives it.
            let sa = spec["serviceAccountName"].as_str().unwrap();
            let kubeconfig = self.dir.path().join("kubeconfig");
            api.kubeconfig(&api.token_for("switchyard-system", sa), &kubeconfig);
            let replicas = deploy["spec"]["replicas"].as_u64().unwrap_or(1);
            for i in 0..replicas {
                let port = free_port();
                let argv: Vec<String> = container["command"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| {
                        a.as_str()
                            .unwrap()
                            .replace(&mount_path, mount.to_str().unwrap())
                    })
                    .map(|a| {
                        // Each replica has a pod IP of its own; here they
                        // share the host, each on a port.
                        if a.starts_with("--listen=") {
                            format!("--listen=127.0.0.1:{port}")
                        } else {
                            a
                        }
                    })
                    .collect();
                assert_eq!(argv[0], "switchyard-webhook");
                let log = self.dir.path().join(format!("replica-{i}.log"));
                let out = std::fs::File::create(&log).unwrap();
                let child = Command::new(env!("CARGO_BIN_EXE_switchyard-webhook"))
                    .args(&argv[1..])
                    .env("KUBECONFIG", &kubeconfig)
                    .env_remove("KUBERNETES_SERVICE_HOST")
                    .stdout(out.try_clone().unwrap())
                    .stderr(out)
                    .spawn()
                    .unwrap();
                self.replicas.push(Replica { child, port, log });
            }
            return;
        }
        if self.ready {
            let secret_name = spec["volumes"][0]["secret"]["secretName"].as_str().unwrap();
            self.sync_volume(api, secret_name);
            return;
        }
        // The readiness probe: HTTPS, the certificate not verified.
        let ready: Vec<SocketAddr> = self
            .replicas
            .iter()
            .filter(|r| {
                Command::new("curl")
                    .args(["-skf", "--max-time", "1"])
                    .arg(format!("https://127.0.0.1:{}/healthz", r.port))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .map(|r| SocketAddr::from(([127, 0, 0, 1], r.port)))
            .collect();
        if ready.len() < self.replicas.len() {
            return;
        }
        self.ready = true;
        api.set_endpoints("switchyard-system", "switchyard-webhook", ready);
        let n = self.replicas.len();
        api.set_status(
            "deployments",
            "switchyard-system",
            "switchyard-webhook",
            json!({
                "observedGeneration": deploy["metadata"]["generation"],
                "replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                ],
            }),
        );
    }

    /// Whether every replica has logged a reload of its certificate (after
    /// an update of its volume).
    fn reloaded_by_all(&self) -> bool {
        self.updates > 0
            && self.replicas.iter().all(|r| {
                std::fs::read_to_string(&r.log)
                    .unwrap_or_default()
                    .contains("TLS certificate reloaded")
            })
    }

    /// Stops the replicas as the kubelet does (SIGTERM, all at once); one
    /// that had ended by itself, ends badly or logged a panic or an error
    /// fails the test.
    fn stop(&mut self) {
        for r in &self.replicas {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(r.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let end = Instant::now() + Duration::from_secs(15);
        let mut faults = Vec::new();
        for r in &mut self.replicas {
            let status = loop {
                if let Ok(Some(s)) = r.child.try_wait() {
                    break Some(s);
                }
                if Instant::now() > end {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            let log = std::fs::read_to_string(&r.log).unwrap_or_default();
            let bad = match status {
                None => Some("did not stop on SIGTERM".to_string()),
                Some(s) if !s.success() => Some(format!("ended with {s}")),
                _ if log.contains("panicked at") || log.contains(" ERROR ") => {
                    Some("logged a panic or an error".into())
                }
                _ => None,
            };
            if let Some(b) = bad {
                faults.push(format!("webhook replica on {}: {b}\n{log}", r.port));
            }
        }
        self.replicas.clear();
        if !faults.is_empty() && !std::thread::panicking() {
            panic!("{}", faults.join("\n"));
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if !self.replicas.is_empty() {
            self.stop();
        }
    }
}

/// cert-manager's controller for what `webhook-cert-manager.yaml` asks
/// (cert-manager `pkg/issuer/selfsigned`, `pkg/issuer/ca`): a Certificate
/// whose Issuer is ready gets its Secret (`tls.crt`, `tls.key`, and
/// `ca.crt`: the certificate itself from a self-signed issuer, the CA's
/// from a CA issuer) and the condition `Ready`; an Issuer is ready when it
/// is self-signed or its CA Secret exists.
struct CertManager {
    /// Keys and certificates issued, by (namespace, Secret): what a CA
    /// issuer signs with (cert-manager reads them back from the Secret).
    issued: BTreeMap<(String, String), (rcgen::Certificate, rcgen::KeyPair)>,
}

impl CertManager {
    fn sync(&mut self, api: &ClusterApi) {
        for cert in api.all("certificates") {
            let ready = cert["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                continue;
            }
            let ns = cert["metadata"]["namespace"].as_str().unwrap().to_string();
            let spec = &cert["spec"];
            let issuer_name = spec["issuerRef"]["name"].as_str().unwrap();
            assert_eq!(
                spec["issuerRef"]["kind"], "Issuer",
                "the stand-in issues from Issuers"
            );
            let Some(issuer) = api.get("issuers", &ns, issuer_name) else {
                continue;
            };
            let mut params = rcgen::CertificateParams::new(
                spec["dnsNames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| d.as_str().unwrap().to_string())
                    .collect::<Vec<_>>(),
            )
            .unwrap();
            if let Some(cn) = spec["commonName"].as_str() {
                params
                    .distinguished_name
                    .push(rcgen::DnType::CommonName, cn);
            }
            if spec["isCA"] == true {
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            }
            let key = rcgen::KeyPair::generate().unwrap();
            let (issued, ca_pem) = if issuer["spec"]["selfSigned"].is_object() {
                let c = params.self_signed(&key).unwrap();
                let pem = c.pem();
                (c, pem)
            } else if let Some(ca_secret) = issuer["spec"]["ca"]["secretName"].as_str() {
                let Some((ca, ca_key)) = self.issued.get(&(ns.clone(), ca_secret.to_string()))
                else {
                    continue;
                };
                (params.signed_by(&key, ca, ca_key).unwrap(), ca.pem())
            } else {
                panic!("the stand-in issues from selfSigned and ca Issuers: {issuer}");
            };
            let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
            let secret_name = spec["secretName"].as_str().unwrap().to_string();
            api.put_object(
                "secrets",
                json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": secret_name, "namespace": ns,
                        "annotations": {"cert-manager.io/certificate-name": cert["metadata"]["name"]}},
                    "data": {"tls.crt": b64(&issued.pem()), "tls.key": b64(&key.serialize_pem()),
                        "ca.crt": b64(&ca_pem)}}),
            );
            api.set_status(
                "certificates",
                &ns,
                cert["metadata"]["name"].as_str().unwrap(),
                json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                    "message": "Certificate is up to date and has not expired"}]}),
            );
            self.issued.insert((ns, secret_name), (issued, key));
        }
    }
}

/// The README's deployment, its certificate made by the script as the
/// block says.
#[test]
fn the_readme_deployment_refuses_no_pod_at_any_step() {
    deploy(false);
}

/// The same, the certificate from cert-manager as the README's comment
/// says (`--cert-manager`); no renewal (cert-manager's).
#[test]
fn the_readme_deployment_with_cert_manager_refuses_no_pod_at_any_step() {
    deploy(true);
}

fn deploy(cert_manager: bool) {
    let mut steps = readme_block("kubectl apply -k");
    let removal = readme_block("kubectl delete -k");
    if cert_manager {
        let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
        let at = readme
            .find("(with cert-manager: ")
            .expect("the README's cert-manager way")
            + "(with cert-manager: ".len();
        let alternative = readme[at..at + readme[at..].find(')').unwrap()].to_string();
        let script = steps
            .iter_mut()
            .find(|s| s.starts_with("scripts/webhook-certs.sh"))
            .unwrap();
        *script = alternative;
    }
    assert!(
        steps.iter().any(|s| s.starts_with("kubectl apply -k"))
            && steps
                .iter()
                .any(|s| s.starts_with("scripts/webhook-certs.sh")),
        "{steps:?}"
    );
    let api = ClusterApi::start();
    let k = Kubectl::new(&api);
    // The cluster as it is before: a team's namespace, and another
    // plugin's network that pods already use.
    k.create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .unwrap();
    for ns in ["default", "team-a"] {
        k.create(&json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "macvlan-conf", "namespace": ns},
            "spec": {"config": r#"{"cniVersion":"0.4.0","type":"macvlan","master":"eth1","ipam":{"type":"host-local","subnet":"192.168.9.0/24"}}"#}}))
            .unwrap();
    }

    let refused = Mutex::new(Vec::<String>::new());
    let kubelet = Mutex::new(Kubelet::new());
    let cert_manager_controller = Mutex::new(CertManager {
        issued: BTreeMap::new(),
    });
    let rounds = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                kubelet.lock().unwrap().sync(&api);
                if cert_manager {
                    cert_manager_controller.lock().unwrap().sync(&api);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let n = rounds.fetch_add(1, Ordering::Relaxed);
                let r = probe_round(&k, &format!("bg{n}"));
                refused.lock().unwrap().extend(r);
            }
        });
        // The removal, as the README has it, pods created all the while.
        let remove = |removal: &[String]| -> Result<(), String> {
            for (i, step) in removal.iter().enumerate() {
                run_step(&k, "removal", step)?;
                refused
                    .lock()
                    .unwrap()
                    .extend(probe_round(&k, &format!("removed{i}")));
            }
            let end = Instant::now() + Duration::from_secs(60);
            while !kubelet.lock().unwrap().stopped {
                if Instant::now() > end {
                    return Err("the webhook's pods were not stopped".into());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            refused.lock().unwrap().extend(probe_round(&k, "gone"));
            Ok(())
        };
        let run = || -> Result<(), String> {
            for (i, step) in steps.iter().enumerate() {
                if step.starts_with("docker build") {
                    eprintln!("step {i}: {step}: skipped (the image)");
                    continue;
                }
                let before = rounds.load(Ordering::Relaxed);
                run_step(&k, &format!("step {i}"), step)?;
                // At least one round of probes ran during the step, and
                // one runs after it.
                let end = Instant::now() + Duration::from_secs(60);
                while rounds.load(Ordering::Relaxed) <= before {
                    if Instant::now() > end {
                        return Err("the prober made no round in 60 s".into());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                refused
                    .lock()
                    .unwrap()
                    .extend(probe_round(&k, &format!("after{i}")));
            }
            if cert_manager {
                refused.lock().unwrap().extend(probe_round(&k, "issued"));
                webhook_works(&api, &k, 1);
                return remove(&removal);
            }
            // A renewal, as the docs say: the script run again. The
            // replicas serve the old certificate until the kubelet has
            // brought the new Secret into their volume and they have
            // reloaded it; pods are created all the while.
            let renew = steps
                .iter()
                .find(|s| s.starts_with("scripts/webhook-certs.sh"))
                .unwrap();
            run_step(&k, "renewal", renew)?;
            let end = Instant::now() + Duration::from_secs(90);
            while !kubelet.lock().unwrap().reloaded_by_all() {
                if Instant::now() > end {
                    return Err("the replicas did not reload the renewed certificate".into());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            refused.lock().unwrap().extend(probe_round(&k, "renewed"));
            webhook_works(&api, &k, 2);

            remove(&removal)
        };
        // The prober and the kubelet stop however the steps end (the
        // scope waits for them before a panic goes on).
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
        done.store(true, Ordering::Relaxed);
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{e}"),
            Err(p) => std::panic::resume_unwind(p),
        }
    });
    let refused = refused.into_inner().unwrap();
    assert!(
        refused.is_empty(),
        "pods refused during the deployment:\n{}",
        refused.join("\n")
    );
    assert!(rounds.load(Ordering::Relaxed) > 0);

    assert!(api.get("namespaces", "", "switchyard-system").is_none());
    assert!(api
        .get(
            "mutatingwebhookconfigurations",
            "",
            "switchyard-network-resources"
        )
        .is_none());
    drop(kubelet);
    api.assert_answered_as_upstream();
}

/// The webhook is configured and called: the README's example pod got the
/// device resource of its network, and so does a pod asking for the
/// network in another namespace's form; the configuration trusts `cas`
/// CAs (after a renewal, the new one and the one before).
fn webhook_works(api: &ClusterApi, k: &Kubectl, cas: usize) {
    let shipped: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("config/kubernetes/testpmd-pod.yaml")).unwrap(),
    )
    .unwrap();
    let name = shipped["metadata"]["name"].as_str().unwrap();
    let ns = shipped["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let example = api
        .get("pods", ns, name)
        .expect("the example pod was created");
    let limits = &example["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["switchyard.io/memif"], json!("1"), "{example:#}");
    let mwc = api
        .get(
            "mutatingwebhookconfigurations",
            "",
            "switchyard-network-resources",
        )
        .expect("the script applied the configuration");
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(
            mwc["webhooks"][0]["clientConfig"]["caBundle"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    let in_bundle = String::from_utf8(bundle)
        .unwrap()
        .matches("BEGIN CERTIFICATE")
        .count();
    assert_eq!(in_bundle, cas, "{mwc:#}");
    k.create(&probe_pod(
        "team-a",
        "asks-for-memif",
        Some("default/switchyard-memif"),
    ))
    .unwrap();
    let p = api.get("pods", "team-a", "asks-for-memif").unwrap();
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["limits"]["switchyard.io/memif"],
        json!("1"),
        "{p:#}"
    );
}
