//! End-to-end: the real `switchyard-webhook` binary over real HTTPS.
//!
//! - AdmissionReview v1 requests are shaped as the API server sends them
//!   (the field names of k8s.io/api `admission/v1.AdmissionRequest`; the
//!   pods are k8s-openapi `Pod`s) and posted by curl, a TLS client we did
//!   not write, trusting the webhook's CA as a MutatingWebhookConfiguration's
//!   `caBundle` does.
//! - The NADs come from an HTTPS server answering the API server's paths
//!   for them (`/apis/k8s.cni.cncf.io/v1/namespaces/NS/network-attachment-
//!   definitions/NAME`) with the NAD objects of `config/` and a few more,
//!   a `Status` 404 for missing ones, and only to the service account's
//!   bearer token; the webhook finds it through a kubeconfig, as kube's
//!   client does in and out of a cluster.
//! - The JSON Patches are applied with the `json-patch` library and the
//!   patched pods validated with `kubernetes-validate`.

#[path = "../../vtepsync/tests/support/api_common.rs"]
mod api_common;
#[path = "../../deviceplugin/tests/support/kubernetes_validate.rs"]
mod kubernetes_validate;
#[path = "../../vtepsync/tests/support/tls.rs"]
mod tls;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

const TOKEN: &str = "sa-token-for-tests";

struct Tls {
    dir: tempfile::TempDir,
}

impl Tls {
    /// A CA and a server certificate for localhost / 127.0.0.1.
    fn new() -> Tls {
        let dir = tempfile::tempdir().unwrap();
        tls::write_ca_and_cert(
            dir.path(),
            "switchyard test CA",
            &["localhost", "127.0.0.1"],
        );
        Tls { dir }
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// NADs by (namespace, name): the ones in config/ and the tests' own.
fn nad_store() -> BTreeMap<(String, String), Value> {
    let mut store = BTreeMap::new();
    for f in [
        "config/kubernetes/network-attachments.yaml",
        "config/cni/network-attachments.yaml",
    ] {
        let text = std::fs::read_to_string(repo().join(f)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"] != "NetworkAttachmentDefinition" {
                continue;
            }
            let ns = v["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            let name = v["metadata"]["name"].as_str().unwrap().to_string();
            store.insert((ns, name), v);
        }
    }
    let nad = |ns: &str, name: &str, resource: Option<&str>| {
        let mut v = json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": ns, "uid": "00000000-0000-0000-0000-000000000001",
                         "resourceVersion": "1"},
            "spec": {"config": "{\"cniVersion\":\"1.1.0\",\"type\":\"switchyard\"}"}});
        if let Some(r) = resource {
            v["metadata"]["annotations"] = json!({"k8s.v1.cni.cncf.io/resourceName": r});
        }
        ((ns.to_string(), name.to_string()), v)
    };
    let mut physnet = nad("team-a", "physnet-net", Some("switchyard.io/memif"));
    physnet.1["metadata"]["annotations"]["k8s.v1.cni.cncf.io/nodeSelector"] =
        json!("switchyard.io/physnet-physnet1=true");
    let mut bad_sel = nad("team-a", "bad-selector", None);
    bad_sel.1["metadata"]["annotations"] = json!({"k8s.v1.cni.cncf.io/nodeSelector": "a=b=c"});
    let mut tuned = nad("team-a", "tuned", None);
    tuned.1["spec"]["config"] = json!(json!({"cniVersion": "0.4.0", "name": "tuned",
        "plugins": [{"type": "switchyard"}, {"type": "tuning", "mtu": 9000}]})
    .to_string());
    store.extend([
        tuned,
        nad("team-b", "blue", Some("switchyard.io/memif")),
        // A cluster network replacement, where Multus reads one.
        nad(
            "kube-system",
            "userspace-default",
            Some("switchyard.io/vhost-user"),
        ),
        nad("team-b", "plain", None),
        physnet,
        bad_sel,
    ]);
    store
}

/// The API server stand-in: NADs by namespace and name, as GET, LIST and
/// WATCH (`pkg/apiserver`'s list, and a watch as a stream of
/// `{"type", "object"}` lines) serve them, each change with a resource
/// version of its own.
#[derive(Clone)]
struct ApiServer {
    nads: Arc<Mutex<BTreeMap<(String, String), Value>>>,
    version: Arc<Mutex<u64>>,
    events: tokio::sync::broadcast::Sender<Value>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl ApiServer {
    /// Creates or replaces a NAD, and tells the watches.
    fn put(&self, mut nad: Value) {
        let mut v = self.version.lock().unwrap();
        *v += 1;
        nad["metadata"]["resourceVersion"] = json!(v.to_string());
        let key = (
            nad["metadata"]["namespace"].as_str().unwrap().to_string(),
            nad["metadata"]["name"].as_str().unwrap().to_string(),
        );
        let kind = match self.nads.lock().unwrap().insert(key, nad.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        let _ = self.events.send(json!({"type": kind, "object": nad}));
    }

    /// Deletes a NAD, and tells the watches.
    fn delete(&self, ns: &str, name: &str) {
        let mut v = self.version.lock().unwrap();
        *v += 1;
        if let Some(mut nad) = self.nads.lock().unwrap().remove(&(ns.into(), name.into())) {
            nad["metadata"]["resourceVersion"] = json!(v.to_string());
            let _ = self.events.send(json!({"type": "DELETED", "object": nad}));
        }
    }

    /// Whether a watch of the NADs has been asked for.
    fn watched(&self) -> bool {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.contains("watch=true"))
    }
}

/// LIST and WATCH of every namespace's NADs.
async fn list_nads(
    State(api): State<ApiServer>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> axum::response::Response {
    api.seen.lock().unwrap().push(format!("{method} {uri}"));
    if headers.get("authorization").and_then(|h| h.to_str().ok())
        != Some(&format!("Bearer {TOKEN}"))
    {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    }
    if uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true"))
    {
        let rx = api.events.subscribe();
        let lines = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => return Some((Ok::<_, std::io::Error>(format!("{ev}\n")), rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        return axum::response::Response::builder()
            .header("content-type", "application/json")
            .body(axum::body::Body::from_stream(lines))
            .unwrap();
    }
    let version = *api.version.lock().unwrap();
    let items: Vec<Value> = api.nads.lock().unwrap().values().cloned().collect();
    Json(
        json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinitionList",
                "metadata": {"resourceVersion": version.to_string()}, "items": items}),
    )
    .into_response()
}

async fn get_nad(
    State(api): State<ApiServer>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> impl IntoResponse {
    api.seen.lock().unwrap().push(format!("{method} {uri}"));
    let status = |code: u16, reason: &str, message: String| {
        (
            StatusCode::from_u16(code).unwrap(),
            Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": message, "reason": reason,
                        "details": {"name": name, "group": "k8s.cni.cncf.io",
                                    "kind": "network-attachment-definitions"},
                        "code": code})),
        )
    };
    if headers.get("authorization").and_then(|h| h.to_str().ok())
        != Some(&format!("Bearer {TOKEN}"))
    {
        return status(401, "Unauthorized", "Unauthorized".into());
    }
    if name == "broken" {
        return status(500, "InternalError", "etcd is having a bad day".into());
    }
    let found = api.nads.lock().unwrap().get(&(ns, name.clone())).cloned();
    match found {
        Some(v) => (StatusCode::OK, Json(v)),
        None => status(
            404,
            "NotFound",
            format!("network-attachment-definitions.k8s.cni.cncf.io \"{name}\" not found"),
        ),
    }
}

/// Starts the API server stand-in on a thread of its own; returns its
/// address and the requests it saw.
fn start_api(rt: &tokio::runtime::Runtime, tls: &Tls) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let (addr, api) = start_api_server(rt, tls);
    (addr, api.seen)
}

/// [`start_api`], with the server's store to change.
fn start_api_server(rt: &tokio::runtime::Runtime, tls: &Tls) -> (SocketAddr, ApiServer) {
    let api = ApiServer {
        nads: Arc::new(Mutex::new(
            nad_store()
                .into_iter()
                .map(|(k, mut v)| {
                    v["metadata"]["resourceVersion"] = json!("1");
                    (k, v)
                })
                .collect(),
        )),
        version: Arc::new(Mutex::new(1)),
        events: tokio::sync::broadcast::channel(64).0,
        seen: Arc::new(Mutex::new(Vec::new())),
    };
    let server = api.clone();
    let router = Router::new()
        .route(
            "/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions/{name}",
            get(get_nad),
        )
        .route(
            "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
            get(list_nads),
        )
        .with_state(api);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Served until the runtime is dropped: the handle is not kept.
    api_common::serve_https(rt, listener, tls.dir.path(), router);
    (addr, server)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Webhook {
    child: Child,
    /// SIGTERM was sent (its exit is then expected).
    stopping: bool,
    port: u16,
    log: PathBuf,
    /// The name its certificate is for (reached at 127.0.0.1).
    host: String,
}

impl Webhook {
    /// The webhook serving with `tls`'s certificate, its API server at
    /// `api` (whose CA `api_tls` holds).
    fn start(tls: &Tls, api: SocketAddr, api_tls: &Tls, policy: &str) -> Webhook {
        Webhook::start_for(tls, "127.0.0.1", api, api_tls, policy)
    }

    fn start_for(tls: &Tls, host: &str, api: SocketAddr, api_tls: &Tls, policy: &str) -> Webhook {
        let kubeconfig = tls.path(&format!("kubeconfig-{policy}"));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://{api}\n    certificate-authority: {ca}\n\
                 users:\n- name: webhook\n  user:\n    token: {TOKEN}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: webhook\n\
                 current-context: test\n",
                ca = api_tls.path("ca.crt").display()
            ),
        )
        .unwrap();
        let port = free_port();
        let log = tls.path(&format!("webhook-{policy}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_switchyard-webhook"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(tls.path("tls.crt"))
            .arg("--tls-key")
            .arg(tls.path("tls.key"))
            .args(["--failure-policy", policy])
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let w = Webhook {
            child,
            stopping: false,
            port,
            log,
            host: host.to_string(),
        };
        let end = Instant::now() + Duration::from_secs(20);
        while w.curl(tls, "/healthz", None).0 != "ok" {
            assert!(Instant::now() < end, "webhook not up:\n{}", w.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        w
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// curl over HTTPS, trusting only the test CA: (body, HTTP status).
    fn curl(&self, tls: &Tls, path: &str, body: Option<&Value>) -> (String, String) {
        let mut c = Command::new("curl");
        c.args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "--cacert",
        ])
        .arg(tls.path("ca.crt"));
        if let Some(b) = body {
            let f = tls.path("review.json");
            std::fs::write(&f, serde_json::to_vec(b).unwrap()).unwrap();
            c.args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", f.display()));
        }
        let out = c
            .arg("--resolve")
            .arg(format!("{}:{}:127.0.0.1", self.host, self.port))
            .arg(format!("https://{}:{}{path}", self.host, self.port))
            .output()
            .expect("curl (./scripts/test.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (body.to_string(), code.to_string())
    }

    /// Posts a review; returns its response.
    fn admit(&self, tls: &Tls, review: &Value) -> Value {
        let (body, code) = self.curl(tls, "/mutate", Some(review));
        assert_eq!(code, "200", "{body}\n{}", self.log());
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["response"]["uid"], review["request"]["uid"]);
        v["response"].clone()
    }
}

impl Webhook {
    /// SIGTERM, as the kubelet stops a container.
    fn sigterm(&mut self) {
        self.stopping = true;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// How long a webhook may take to stop: its shutdown delay (5 s, the
/// default the manifest keeps) and its drain (5 s).
const STOP_LIMIT: Duration = Duration::from_secs(12);

impl Drop for Webhook {
    /// Stops it with SIGTERM, as the kubelet does. One that had exited by
    /// itself, exits non-zero, does not stop in time, or logged a panic
    /// fails the test, with its log.
    fn drop(&mut self) {
        let early = if self.stopping {
            None
        } else {
            self.child.try_wait().ok().flatten()
        };
        self.sigterm();
        let end = Instant::now() + STOP_LIMIT;
        let mut status = None;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let fault = match (early, status) {
            (Some(s), _) => Some(format!("the webhook exited by itself ({s})")),
            (None, None) => Some(format!(
                "the webhook did not stop on SIGTERM in {STOP_LIMIT:?}"
            )),
            (None, Some(s)) if !s.success() => Some(format!("the webhook ended with {s}")),
            _ if log.contains("panicked at") => Some("the webhook panicked".to_string()),
            _ => None,
        };
        if let Some(f) = fault {
            if std::thread::panicking() {
                eprintln!("{f}\n{log}");
            } else {
                panic!("{f}\n{log}");
            }
        }
    }
}

/// A pod (typed, from the Kubernetes API types) with the networks
/// annotation and the first container's resources.
fn pod(name: &str, networks: Option<&str>, resources: Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "labels": {"app": "dpdk"}},
        "spec": {"containers": [
            {"name": "app", "image": "registry.example/dpdk:1", "resources": resources},
            {"name": "sidecar", "image": "registry.example/sidecar:1"}]}});
    if resources.is_null() {
        v["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("resources");
    }
    if let Some(n) = networks {
        v["metadata"]["annotations"] = json!({"k8s.v1.cni.cncf.io/networks": n});
    }
    serde_json::from_value(v).unwrap()
}

/// The AdmissionReview the API server sends for a pod CREATE in `ns`.
fn review(pod: &Pod, ns: &str, operation: &str) -> Value {
    let uid = format!(
        "{:032x}",
        rand_u128(pod.metadata.name.as_deref().unwrap_or(""))
    );
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("{}-{}-{}-{}-{}", &uid[0..8], &uid[8..12], &uid[12..16], &uid[16..20], &uid[20..32]),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod.metadata.name,
            "namespace": ns,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "uid": "3f5b1b62-1a39-4b38-8ad8-0b5f8b4e6f1d",
                         "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                                    "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                        "fieldManager": "kube-controller-manager"}
        }
    })
}

fn rand_u128(seed: &str) -> u128 {
    seed.bytes().fold(0x9e37_79b9_7f4a_7c15_u128, |h, b| {
        h.wrapping_mul(0x100_0000_01b3).wrapping_add(u128::from(b))
    })
}

/// The pod after the response's patch, applied with the json-patch library.
fn patched(pod: &Pod, resp: &Value) -> Value {
    let mut v = serde_json::to_value(pod).unwrap();
    if let Some(p) = resp["patch"].as_str() {
        assert_eq!(resp["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut v, &patch).unwrap();
    }
    v
}

/// Validates pods strictly against the Kubernetes schemas.
fn validate(dir: &Path, pods: &[Value]) {
    let mut files = Vec::new();
    for (i, p) in pods.iter().enumerate() {
        let f = dir.join(format!("pod-{i}.yaml"));
        std::fs::write(&f, serde_json::to_string_pretty(p).unwrap()).unwrap();
        files.push(f);
    }
    kubernetes_validate::validate_strictly(&files);
}

fn resources_of(pod: &Value) -> (Value, Value) {
    let r = &pod["spec"]["containers"][0]["resources"];
    (r["requests"].clone(), r["limits"].clone())
}

#[test]
fn pods_get_the_resources_of_their_networks() {
    let tls = Tls::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (api, seen) = start_api(&rt, &tls);
    let hook = Webhook::start(&tls, api, &tls, "fail");
    let mut valid = Vec::new();

    // One network from config/kubernetes (namespace default, named
    // explicitly from the pod's namespace team-a).
    let p = pod("one", Some("default/switchyard-memif"), Value::Null);
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&p, &r);
    let memif = json!({"switchyard.io/memif": "1"});
    assert_eq!(resources_of(&out), (memif.clone(), memif));
    assert!(out["spec"]["containers"][1].get("resources").is_none());
    // Every container reads the pod's network-status (each network's
    // device-info) at /etc/podnetinfo, as network-resources-injector
    // arranges it.
    for c in 0..2 {
        assert_eq!(
            out["spec"]["containers"][c]["volumeMounts"],
            json!([{"name": "podnetinfo", "mountPath": "/etc/podnetinfo", "readOnly": true}])
        );
    }
    assert_eq!(
        out["spec"]["volumes"],
        json!([{"name": "podnetinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}])
    );
    valid.push(out);

    // Interface names Multus takes (at most 15 bytes, no '/' or
    // whitespace): not only DNS labels.
    for ifname in ["net_1", "eth1.100"] {
        let p = pod(
            "ifname",
            Some(&format!("default/switchyard-memif@{ifname}")),
            Value::Null,
        );
        let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
        assert_eq!(r["allowed"], true, "{ifname}: {r}");
    }
    let p = pod(
        "ifname",
        Some("default/switchyard-memif@sixteen-chars-16"),
        Value::Null,
    );
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], false, "{r}");

    // The network that replaces the cluster network (Multus's namespace
    // when it names none) needs its device too, beside the others.
    let mut p = pod("default-net", Some("default/switchyard-memif"), Value::Null);
    let mut v = serde_json::to_value(&p).unwrap();
    v["metadata"]["annotations"]["v1.multus-cni.io/default-network"] = json!("userspace-default");
    p = serde_json::from_value(v).unwrap();
    let out = patched(&p, &hook.admit(&tls, &review(&p, "team-a", "CREATE")));
    let both = json!({"switchyard.io/memif": "1", "switchyard.io/vhost-user": "1"});
    assert_eq!(resources_of(&out), (both.clone(), both));
    valid.push(out);

    // A resource the user gave another container is left to it; init
    // containers get no mount (they run before the networks are there).
    let mut p = pod("sidecar-set", Some("default/switchyard-memif"), Value::Null);
    let mut v = serde_json::to_value(&p).unwrap();
    v["spec"]["containers"][1]["resources"] =
        json!({"limits": {"switchyard.io/memif": "1"}, "requests": {"switchyard.io/memif": "1"}});
    v["spec"]["initContainers"] = json!([{"name": "init", "image": "registry.example/init:1"}]);
    p = serde_json::from_value(v).unwrap();
    let out = patched(&p, &hook.admit(&tls, &review(&p, "team-a", "CREATE")));
    assert!(
        out["spec"]["containers"][0].get("resources").is_none(),
        "{out}"
    );
    assert!(out["spec"]["initContainers"][0]
        .get("volumeMounts")
        .is_none());
    assert_eq!(
        out["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/etc/podnetinfo"
    );
    valid.push(out);

    // A NAD's node selector (the nodes that have its physnet) joins the
    // pod's.
    let mut p = pod("physnet", Some("physnet-net"), Value::Null);
    let mut v = serde_json::to_value(&p).unwrap();
    v["spec"]["nodeSelector"] = json!({"kubernetes.io/os": "linux"});
    p = serde_json::from_value(v).unwrap();
    let out = patched(&p, &hook.admit(&tls, &review(&p, "team-a", "CREATE")));
    assert_eq!(
        out["spec"]["nodeSelector"],
        json!({"kubernetes.io/os": "linux", "switchyard.io/physnet-physnet1": "true"})
    );
    valid.push(out);
    // A chain that puts a kernel-interface plugin after switchyard would
    // fail every ADD: refused at admission, naming the plugin.
    let p = pod("tuned", Some("tuned"), Value::Null);
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("team-a/tuned") && msg.contains("\"tuning\""),
        "{msg}"
    );
    let p = pod("bad-selector", Some("bad-selector"), Value::Null);
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"].as_str().unwrap().contains("a=b=c"),
        "{r}"
    );

    // Several, in both forms, across namespaces; the pod's own namespace by
    // default; a network without a resource adds nothing.
    for (name, ann) in [
        (
            "comma",
            "default/switchyard-memif, default/switchyard-vhost-user@vhu0,blue, plain, default/switchyard-memif@net9",
        ),
        (
            "json",
            r#"[{"name":"switchyard-memif","namespace":"default"},
                {"name":"switchyard-vhost-user","namespace":"default","interface":"vhu0"},
                {"name":"blue"},{"name":"plain","mac":"02:00:00:00:00:01"},
                {"name":"switchyard-memif","namespace":"default"}]"#,
        ),
    ] {
        let mut p = pod(name, Some(ann), Value::Null);
        p.metadata.namespace = Some("team-b".into());
        let r = hook.admit(&tls, &review(&p, "team-b", "CREATE"));
        assert_eq!(r["allowed"], true, "{name}: {r}");
        let out = patched(&p, &r);
        let want = json!({"switchyard.io/memif": "3", "switchyard.io/vhost-user": "1"});
        assert_eq!(resources_of(&out), (want.clone(), want), "{name}");
        valid.push(out);
    }

    // A limit the user set is never lowered; requests follow it; other
    // resources stay.
    let p = pod(
        "user-set",
        Some("default/switchyard-memif"),
        json!({"limits": {"switchyard.io/memif": "4", "memory": "1Gi"},
               "requests": {"cpu": "1"}}),
    );
    let out = patched(&p, &hook.admit(&tls, &review(&p, "team-a", "CREATE")));
    let (req, lim) = resources_of(&out);
    assert_eq!(req, json!({"cpu": "1", "switchyard.io/memif": "4"}));
    assert_eq!(lim, json!({"memory": "1Gi", "switchyard.io/memif": "4"}));
    valid.push(out);

    // No annotation, networks without resources, and updates pass as they
    // are.
    for (p, op) in [
        (pod("none", None, Value::Null), "CREATE"),
        (
            pod(
                "cni-only",
                Some("default/memif-net,default/vhost-trunk"),
                Value::Null,
            ),
            "CREATE",
        ),
        (
            pod("update", Some("default/switchyard-memif"), Value::Null),
            "UPDATE",
        ),
    ] {
        let r = hook.admit(&tls, &review(&p, "team-a", op));
        assert_eq!(r["allowed"], true, "{r}");
        assert!(r.get("patch").is_none(), "{r}");
        valid.push(serde_json::to_value(&p).unwrap());
    }
    validate(tls.dir.path(), &valid);

    // A network that does not exist: refused, naming it.
    let p = pod(
        "missing",
        Some("default/switchyard-memif,nope"),
        Value::Null,
    );
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(msg.contains("team-a/nope"), "{msg}");
    // A malformed annotation: refused, naming it.
    let p = pod("bad", Some("a/b/c"), Value::Null);
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], false);
    assert!(r["status"]["message"]
        .as_str()
        .unwrap()
        .contains("k8s.v1.cni.cncf.io/networks"));

    // The API server failing: refused under --failure-policy fail, admitted
    // unchanged with a warning under ignore.
    let p = pod("api-down", Some("default/broken"), Value::Null);
    let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("default/broken"),
        "{r}"
    );
    let lenient = Webhook::start(&tls, api, &tls, "ignore");
    let r = lenient.admit(&tls, &review(&p, "team-a", "CREATE"));
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none());
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("default/broken"),
        "{r}"
    );

    // The webhook only ever read NADs (its cache's list and watch, a GET
    // for one the cache did not hold), as its role allows.
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(
            |s| s.starts_with("GET /apis/k8s.cni.cncf.io/v1/namespaces/")
                || s.starts_with("GET /apis/k8s.cni.cncf.io/v1/network-attachment-definitions?")
        ),
        "{seen:?}"
    );
}

/// The webhook's cache of NADs follows the API server: once its watch is
/// up, a pod's networks are read from it (no GET), a NAD changed after
/// that is read as it is now, one deleted is missing, and one just created
/// is found (the API server is asked for what the cache does not hold).
#[test]
fn a_nad_changed_after_the_cache_warmed_is_read_as_it_is_now() {
    let tls = Tls::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (addr, api) = start_api_server(&rt, &tls);
    let hook = Webhook::start(&tls, addr, &tls, "fail");
    wait_until(
        Duration::from_secs(20),
        "the webhook's watch of NADs",
        || api.watched(),
    );
    let gets = |api: &ApiServer| {
        api.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.contains("/namespaces/team-b/network-attachment-definitions/blue"))
            .count()
    };
    let resources = |hook: &Webhook| {
        let p = pod("cached", Some("team-b/blue"), Value::Null);
        let r = hook.admit(&tls, &review(&p, "team-a", "CREATE"));
        if r["allowed"] != true {
            return Err(r["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string());
        }
        Ok(resources_of(&patched(&p, &r)).0)
    };
    let before = gets(&api);
    assert_eq!(
        resources(&hook).unwrap(),
        json!({"switchyard.io/memif": "1"})
    );
    assert_eq!(
        gets(&api),
        before,
        "read from the cache, not the API server"
    );
    // Changed: another pool.
    let mut blue = api.nads.lock().unwrap()[&("team-b".to_string(), "blue".to_string())].clone();
    blue["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] =
        json!("switchyard.io/vhost-user");
    api.put(blue.clone());
    wait_until(Duration::from_secs(5), "the changed NAD", || {
        resources(&hook).ok() == Some(json!({"switchyard.io/vhost-user": "1"}))
    });
    // Deleted: refused as missing.
    api.delete("team-b", "blue");
    wait_until(Duration::from_secs(5), "the deleted NAD", || {
        resources(&hook).is_err_and(|e| e.contains("does not exist"))
    });
    // Created again: found at once.
    api.put(blue);
    assert_eq!(
        resources(&hook).unwrap(),
        json!({"switchyard.io/vhost-user": "1"})
    );
    drop(hook);
}

fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_certificate_script_and_the_example_pod() {
    // The self-signed set-up a user without cert-manager follows: its
    // certificate is for the Service's name, and the API server (curl here)
    // trusts it through the CA the script puts in the caBundle.
    let api_tls = Tls::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (api, _) = start_api(&rt, &api_tls);
    let script = Tls {
        dir: tempfile::tempdir().unwrap(),
    };
    let st = Command::new(repo().join("scripts/webhook-certs.sh"))
        .arg("--out")
        .arg(script.dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let hook = Webhook::start_for(
        &script,
        "switchyard-webhook.switchyard-system.svc",
        api,
        &api_tls,
        "fail",
    );

    // The example pod asks only for its network; the webhook adds the
    // device resource the network's NAD names.
    let text = std::fs::read_to_string(repo().join("config/kubernetes/testpmd-pod.yaml")).unwrap();
    let p: Pod = serde_yaml::from_str(&text).unwrap();
    let ns = p.metadata.namespace.clone().unwrap();
    assert!(
        serde_json::to_value(&p).unwrap()["spec"]["containers"][0]["resources"]["limits"]
            .get("switchyard.io/memif")
            .is_none()
    );
    let r = hook.admit(&script, &review(&p, &ns, "CREATE"));
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&p, &r);
    let (req, lim) = resources_of(&out);
    assert_eq!(req["switchyard.io/memif"], "1");
    assert_eq!(lim["switchyard.io/memif"], "1");
    assert_eq!(lim["cpu"], "2", "the pod's own limits stay");
    validate(script.dir.path(), &[out]);
}

/// A replica stopped as a rollout stops it (SIGTERM): at once it says it is
/// not ready (the Service takes it out of its endpoints), it answers every
/// review that still reaches it meanwhile, and it exits cleanly after its
/// delay (the shipped default) and drain, within the pod's default grace
/// period (30 s). With the shipped two replicas, the other one answers all
/// along: a rollout of the Deployment refuses no admission.
#[test]
fn a_stopping_webhook_answers_until_the_service_lets_it_go() {
    let (tls, api_tls) = (Tls::new(), Tls::new());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (api, _) = start_api(&rt, &api_tls);
    let mut old = Webhook::start(&tls, api, &api_tls, "fail");
    let new = Webhook::start_for(&tls, "localhost", api, &api_tls, "ignore");
    let r = review(&pod("rolling", None, json!({})), "team-a", "CREATE");
    old.admit(&tls, &r);
    let stopped_at = Instant::now();
    old.sigterm();
    let end = Instant::now() + Duration::from_secs(2);
    while old.curl(&tls, "/healthz", None).1 != "503" {
        assert!(
            Instant::now() < end,
            "still ready after SIGTERM:\n{}",
            old.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reviews still reach it until the endpoints change: all answered.
    let mut answered = 0;
    while stopped_at.elapsed() < Duration::from_secs(3) {
        old.admit(&tls, &r);
        new.admit(&tls, &r);
        answered += 1;
    }
    assert!(answered > 3, "{answered}");
    let status = loop {
        if let Some(s) = old.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            stopped_at.elapsed() < STOP_LIMIT,
            "did not stop:\n{}",
            old.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}\n{}", old.log());
    assert!(
        stopped_at.elapsed() >= Duration::from_secs(4),
        "stopped before its delay"
    );
    // The shipped Deployment leaves the time for it.
    let text = std::fs::read_to_string(repo().join("config/kubernetes/webhook.yaml")).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"] == "Deployment" {
            let grace = v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30);
            assert!(grace >= 5 + 5, "terminationGracePeriodSeconds {grace}");
            let args = v["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
            assert!(
                !args.contains("shutdown-delay"),
                "the default delay is the tested one"
            );
        }
    }
}
