//! A stand-in for a cluster's API server, as far as `kubectl apply`,
//! `kubectl rollout status`, the webhook's NAD watch and pod admission go,
//! over HTTPS with bearer tokens. It answers as upstream does
//! (kubernetes/kubernetes, `staging/src/k8s.io/apiserver`):
//!
//! - **discovery** (`endpoints/discovery`): the legacy documents, `/api`,
//!   `/apis` and an `APIResourceList` per group version, for the kinds our
//!   manifests use and the NAD CRD Multus installs; no aggregated
//!   discovery (kubectl falls back, as it does with an API server before
//!   1.26);
//! - **OpenAPI**: `/openapi/v2` is an empty document (protobuf, which
//!   kubectl asks for) and `/openapi/v3` is not served, as an API server
//!   that publishes no schemas: kubectl's client-side validation then
//!   finds no type to check, and the stand-in does no field validation;
//! - **objects** (`endpoints/handlers/{get,create,patch}.go`): get, list
//!   (label selector `k=v`, field selector `metadata.name=`,
//!   `metadata.namespace=`), watch (as the vtep-sync tests' stand-in:
//!   events after `resourceVersion`, `"0"` the current objects first),
//!   create (`metadata.uid`, `resourceVersion`, `creationTimestamp`,
//!   `generation` 1; 409 `AlreadyExists`; a namespaced object in a
//!   namespace that does not exist is refused as the NamespaceLifecycle
//!   admission plugin refuses it, 404 `namespaces "x" not found`) and patch
//!   (JSON Patch, JSON merge patch, and the strategic merge patch `kubectl
//!   apply` sends for an object that exists, as far as
//!   `apimachinery/pkg/util/strategicpatch/patch.go` goes for our kinds:
//!   maps merged, `null` deleting, lists replaced except those with a merge
//!   key (a webhook configuration's `webhooks` and `matchConditions`, by
//!   `name`), merged item by
//!   item; `$setElementOrder` directives ignored, any other directive
//!   recorded as unsupported) and delete (at once; a Namespace goes
//!   Terminating and, a second later, the namespace controller deletes
//!   what is in it and then it);
//! - **authorization**: the admin's token (group `system:masters`) may do
//!   anything; a service account's token is authorized by the ClusterRoles
//!   and ClusterRoleBindings stored (`plugin/pkg/auth/authorizer/rbac`
//!   `RuleAllows`), as the webhook's NAD watch must be;
//! - **mutating admission of pods** (`admission/plugin/webhook/mutating`,
//!   `generic/webhook.go` `ShouldCallHook`, `matchconditions`): each
//!   stored MutatingWebhookConfiguration's webhooks whose rules, namespace
//!   selector, object selector and match conditions (CEL, with
//!   `cel-interpreter`) select the pod are called at their Service's
//!   endpoints (`<service>.<namespace>.svc`, its `caBundle` as the only
//!   trust; curl is the client) with an AdmissionReview v1; their JSON
//!   Patch is applied. A call that fails (no endpoints, TLS, timeout) is
//!   answered by the webhook's `failurePolicy`: `Fail` refuses the pod
//!   with upstream's wording, `Ignore` admits it unchanged. The endpoints
//!   are what the test's kubelet stand-in says is Ready
//!   ([`ClusterApi::set_endpoints`]), dialled directly as an API server
//!   with `--enable-aggregator-routing` does (by default it dials the
//!   Service's ClusterIP, which kube-proxy routes to the same endpoints
//!   once it has programmed them, usually within a second: that lag is not
//!   modelled).
//!
//! What it cannot answer as upstream would is answered 500 and recorded;
//! [`ClusterApi::assert_answered_as_upstream`], and dropping it, fail the
//! test.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};

/// A resource the stand-in serves.
#[derive(Debug, Clone, Copy)]
struct Res {
    group: &'static str,
    version: &'static str,
    /// Plural name, as in the URL.
    name: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
}

const fn res(
    group: &'static str,
    version: &'static str,
    name: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Res {
    Res {
        group,
        version,
        name,
        singular,
        kind,
        namespaced,
    }
}

/// The kinds of our manifests, the pods', the NAD CRD's (Multus installs
/// it) and cert-manager's.
const RESOURCES: &[Res] = &[
    res("", "v1", "namespaces", "namespace", "Namespace", false),
    res("", "v1", "nodes", "node", "Node", false),
    res("", "v1", "pods", "pod", "Pod", true),
    res("", "v1", "services", "service", "Service", true),
    res("", "v1", "secrets", "secret", "Secret", true),
    res("", "v1", "configmaps", "configmap", "ConfigMap", true),
    res(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
    ),
    res(
        "",
        "v1",
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
    ),
    res(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
    ),
    res("apps", "v1", "daemonsets", "daemonset", "DaemonSet", true),
    res(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        true,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
    ),
    res(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
        false,
    ),
    res("cert-manager.io", "v1", "issuers", "issuer", "Issuer", true),
    res(
        "cert-manager.io",
        "v1",
        "certificates",
        "certificate",
        "Certificate",
        true,
    ),
    res(
        "k8s.cni.cncf.io",
        "v1",
        "network-attachment-definitions",
        "network-attachment-definition",
        "NetworkAttachmentDefinition",
        true,
    ),
];

fn find_res(group: &str, version: &str, name: &str) -> Option<Res> {
    RESOURCES
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.name == name)
}

fn api_version(r: &Res) -> String {
    if r.group.is_empty() {
        r.version.to_string()
    } else {
        format!("{}/{}", r.group, r.version)
    }
}

/// An object's key: resource, namespace ("" for cluster-scoped), name.
type Key = (&'static str, String, String);

#[derive(Clone)]
struct Change {
    rv: u64,
    resource: &'static str,
    now: Option<Value>,
    before: Option<Value>,
}

#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// Token to (user, groups).
    tokens: BTreeMap<String, (String, Vec<String>)>,
    /// Ready endpoints of a Service, by (namespace, name).
    endpoints: BTreeMap<(String, String), Vec<SocketAddr>>,
    /// Every request: "VERB resource[/name]" and its answer's code.
    requests: Vec<String>,
    unsupported: Vec<String>,
    uids: u64,
    /// Namespaces deleted, since when.
    terminating: BTreeMap<String, std::time::Instant>,
}

impl Store {
    fn unsupported(&mut self, what: String) -> Response {
        let msg = format!("the API server stand-in cannot answer this as upstream would: {what}");
        self.unsupported.push(what);
        status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", &msg)
    }

    /// Removes the object at `key`, at a new resource version.
    fn remove(&mut self, key: Key) {
        if let Some(before) = self.objects.remove(&key) {
            self.rv += 1;
            self.history.push(Change {
                rv: self.rv,
                resource: key.0,
                now: None,
                before: Some(before),
            });
        }
    }

    /// Stores `obj` (created or changed) at a new resource version.
    fn put(&mut self, r: &Res, mut obj: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        obj["apiVersion"] = json!(api_version(r));
        obj["kind"] = json!(r.kind);
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let before = self.objects.insert((r.name, ns, name), obj.clone());
        self.history.push(Change {
            rv,
            resource: r.name,
            now: Some(obj.clone()),
            before,
        });
        obj
    }
}

struct Shared {
    store: Mutex<Store>,
    changed: tokio::sync::Notify,
    addr: SocketAddr,
}

/// The running stand-in.
pub struct ClusterApi {
    rt: tokio::runtime::Runtime,
    handle: axum_server::Handle<SocketAddr>,
    shared: Arc<Shared>,
    /// Where it listens.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

/// The admin's token.
pub const ADMIN_TOKEN: &str = "admin-token";

impl ClusterApi {
    /// Starts it with the namespaces every cluster has (`default`,
    /// `kube-system`, `kube-public`, `kube-node-lease`), labelled with
    /// their names as the API server labels them.
    pub fn start() -> ClusterApi {
        let dir = tempfile::tempdir().unwrap();
        super::tls::write_ca_and_cert(
            dir.path(),
            "kubernetes stand-in CA",
            &["localhost", "127.0.0.1", "kubernetes.default.svc"],
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                rv: 1000,
                ..Default::default()
            }),
            changed: tokio::sync::Notify::new(),
            addr,
        });
        {
            let mut s = shared.store.lock().unwrap();
            s.tokens.insert(
                ADMIN_TOKEN.into(),
                (
                    "kubernetes-admin".into(),
                    vec!["system:masters".into(), "system:authenticated".into()],
                ),
            );
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let obj = json!({"metadata": {"name": ns, "uid": format!("ns-{ns}"),
                    "creationTimestamp": "2026-11-28T00:00:00Z",
                    "labels": {"kubernetes.io/metadata.name": ns}},
                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
                s.put(&RESOURCES[0], obj);
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let router = Router::new().fallback(handle).with_state(shared.clone());
        rt.spawn(namespace_controller(shared.clone()));
        let handle = super::api_common::serve_https(&rt, listener, dir.path(), router);
        ClusterApi {
            rt,
            handle,
            shared,
            addr,
            dir,
        }
    }

    /// A bearer token for service account `name` of `namespace`.
    pub fn token_for(&self, namespace: &str, name: &str) -> String {
        let mut s = self.shared.store.lock().unwrap();
        let token = format!("token-{}-{namespace}-{name}", s.tokens.len());
        s.tokens.insert(
            token.clone(),
            (
                format!("system:serviceaccount:{namespace}:{name}"),
                vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ],
            ),
        );
        token
    }

    /// A kubeconfig for `token`, written at `at`.
    pub fn kubeconfig(&self, token: &str, at: &Path) {
        let ca = std::fs::read(self.dir.path().join("ca.crt")).unwrap();
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        std::fs::write(
            at,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters:\n- name: k\n  cluster:\n    server: https://{}\n    certificate-authority-data: {ca}\n\
                 users:\n- name: u\n  user:\n    token: {token}\n\
                 contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n    namespace: default\n",
                self.addr
            ),
        )
        .unwrap();
    }

    /// Object `name` of `resource` (plural) in `namespace` ("" for
    /// cluster-scoped ones).
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let s = self.shared.store.lock().unwrap();
        s.objects
            .iter()
            .find(|((r, ns, n), _)| *r == resource && ns == namespace && n == name)
            .map(|(_, v)| v.clone())
    }

    /// Every object of `resource`.
    pub fn all(&self, resource: &str) -> Vec<Value> {
        let s = self.shared.store.lock().unwrap();
        s.objects
            .iter()
            .filter(|((r, _, _), _)| *r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Creates or replaces an object of `resource` (what a controller
    /// writes), at a new resource version.
    pub fn put_object(&self, resource: &str, mut obj: Value) {
        let r = *RESOURCES.iter().find(|r| r.name == resource).unwrap();
        let mut s = self.shared.store.lock().unwrap();
        s.uids += 1;
        let uid = format!("00000000-0000-4000-8000-{:012}", s.uids);
        let meta = &mut obj["metadata"];
        if meta["uid"].is_null() {
            meta["uid"] = json!(uid);
            meta["creationTimestamp"] = json!("2026-11-28T12:00:00Z");
        }
        s.put(&r, obj);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// Sets the `status` of an object (what a controller's status update
    /// does): a new resource version and a `MODIFIED` event.
    pub fn set_status(&self, resource: &str, namespace: &str, name: &str, status: Value) {
        let r = *RESOURCES.iter().find(|r| r.name == resource).unwrap();
        let mut s = self.shared.store.lock().unwrap();
        let key = (r.name, namespace.to_string(), name.to_string());
        let mut obj = s.objects.get(&key).cloned().expect("the object exists");
        obj["status"] = status;
        s.put(&r, obj);
        drop(s);
        self.shared.changed.notify_waiters();
    }

    /// The Ready endpoints of Service `namespace/name` (what the
    /// EndpointSlice controller publishes for its Ready pods).
    pub fn set_endpoints(&self, namespace: &str, name: &str, addrs: Vec<SocketAddr>) {
        self.shared
            .store
            .lock()
            .unwrap()
            .endpoints
            .insert((namespace.into(), name.into()), addrs);
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<String> {
        self.shared.store.lock().unwrap().requests.clone()
    }

    /// Panics if a request was one the stand-in cannot answer as the API
    /// server would.
    pub fn assert_answered_as_upstream(&self) {
        let u = self.shared.store.lock().unwrap().unsupported.clone();
        assert!(
            u.is_empty(),
            "requests the API server stand-in cannot answer as upstream would: {u:?}"
        );
    }
}

impl Drop for ClusterApi {
    fn drop(&mut self) {
        self.handle.shutdown();
        if !std::thread::panicking() {
            self.assert_answered_as_upstream();
        }
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    status_with(code, reason, message, json!({}))
}

/// A `Status` object as the API server answers errors with.
fn status_with(code: StatusCode, reason: &str, message: &str, details: Value) -> Response {
    let mut body = super::api_common::failure(code.as_u16(), reason, message);
    body["details"] = details;
    ok_json(code, &body)
}

fn ok_json(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

/// `apimachinery` `NewNotFound`: `deployments.apps "x" not found`.
fn not_found(r: &Res, name: &str) -> Response {
    let qualified = if r.group.is_empty() {
        r.name.to_string()
    } else {
        format!("{}.{}", r.name, r.group)
    };
    status_with(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{qualified} \"{name}\" not found"),
        json!({"name": name, "group": r.group, "kind": r.name}),
    )
}

/// A request's path, parsed.
struct Target {
    res: Res,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    /// The object's key and name (a request on one object).
    fn key(&self) -> (Key, String) {
        let name = self.name.clone().expect("a request on one object");
        let ns = self.namespace.clone().unwrap_or_default();
        ((self.res.name, ns, name.clone()), name)
    }
}

/// `/api/v1/...` or `/apis/G/V/...` into a resource request.
fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, r, more @ ..] => (Some(ns.to_string()), {
            let mut v = vec![*r];
            v.extend_from_slice(more);
            v
        }),
        _ => (None, rest.to_vec()),
    };
    let res = find_res(group, version, rest.first()?)?;
    Some(Target {
        res,
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

/// Whether the admin (`system:masters`) asks, or the RBAC objects stored
/// (ClusterRoleBindings, and in `namespace` its RoleBindings) give `user`
/// (in `groups`) `verb` on `resource` of `group` (named `name`, for a
/// request on one object).
#[allow(clippy::too_many_arguments)]
fn rbac_allows(
    store: &Store,
    user: &str,
    groups: &[String],
    verb: &str,
    group: &str,
    resource: &str,
    name: Option<&str>,
    namespace: Option<&str>,
) -> bool {
    if groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let objects: Vec<Value> = store
        .objects
        .iter()
        .filter(|((r, _, _), _)| {
            matches!(
                *r,
                "clusterroles" | "clusterrolebindings" | "roles" | "rolebindings"
            )
        })
        .map(|(_, v)| v.clone())
        .collect();
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    super::api_common::allows(
        &objects,
        &super::api_common::Ask {
            user,
            groups: &groups,
            verb,
            group,
            resource,
            name,
            namespace,
        },
    )
}

/// Label selector `k=v,k2=v2` (equality only; anything else recorded as
/// unsupported by the caller).
fn selector_matches(sel: &str, labels: &Value) -> Option<bool> {
    let mut all = true;
    for part in sel.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=')?;
        let v = v.strip_prefix('=').unwrap_or(v);
        if k.ends_with('!') {
            return None;
        }
        all &= labels[k].as_str() == Some(v);
    }
    Some(all)
}

/// Field selector `metadata.name=x,metadata.namespace=y`.
fn fields_match(sel: &str, obj: &Value) -> Option<bool> {
    let mut all = true;
    for part in sel.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=')?;
        let v = v.strip_prefix('=').unwrap_or(v);
        let got = match k {
            "metadata.name" => obj["metadata"]["name"].as_str(),
            "metadata.namespace" => obj["metadata"]["namespace"].as_str(),
            _ => return None,
        };
        all &= got == Some(v);
    }
    Some(all)
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            url_decode_pairs(q)
                .into_iter()
                .collect::<BTreeMap<String, String>>()
        })
        .unwrap_or_default()
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(h, 16) {
                    Ok(c) => out.push(c),
                    Err(_) => out.extend_from_slice(&b[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    // Discovery and OpenAPI: any authenticated user.
    match (method.as_str(), path.as_str()) {
        ("GET", "/api") => {
            return ok_json(
                StatusCode::OK,
                &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}]}),
            )
        }
        ("GET", "/apis") => {
            let mut groups: Vec<(&str, &str)> = RESOURCES
                .iter()
                .filter(|r| !r.group.is_empty())
                .map(|r| (r.group, r.version))
                .collect();
            groups.dedup();
            let groups: Vec<Value> = groups
                .iter()
                .map(|(g, v)| {
                    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
                    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
                })
                .collect();
            return ok_json(
                StatusCode::OK,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            );
        }
        ("GET", "/version") => {
            return ok_json(
                StatusCode::OK,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0",
                    "platform": "linux/amd64", "goVersion": "go1.24.0", "compiler": "gc"}),
            )
        }
        // No schemas published: an empty protobuf document.
        ("GET", "/openapi/v2") => {
            return (
                StatusCode::OK,
                [(
                    "content-type",
                    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                )],
                Vec::<u8>::new(),
            )
                .into_response()
        }
        _ => {}
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let discovery = match segs.as_slice() {
        ["api", v] => Some(("", *v)),
        ["apis", g, v] => Some((*g, *v)),
        _ => None,
    };
    if let (Some((g, v)), &Method::GET) = (discovery, &method) {
        let resources: Vec<Value> = RESOURCES
            .iter()
            .filter(|r| r.group == g && r.version == v)
            .map(|r| {
                json!({"name": r.name, "singularName": r.singular, "namespaced": r.namespaced,
                    "kind": r.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
            })
            .collect();
        if resources.is_empty() {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        let gv = if g.is_empty() {
            v.to_string()
        } else {
            format!("{g}/{v}")
        };
        return ok_json(
            StatusCode::OK,
            &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
        );
    }
    if path.starts_with("/openapi/") {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    }

    // Authentication.
    let token = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    let Some((user, groups)) = shared.store.lock().unwrap().tokens.get(&token).cloned() else {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    };
    let Some(t) = parse_path(&path) else {
        let mut s = shared.store.lock().unwrap();
        return s.unsupported(format!("{method} {path}"));
    };
    let q = query(&uri);
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (&method, t.name.is_some(), watch) {
        (&Method::GET, true, _) => "get",
        (&Method::GET, false, true) => "watch",
        (&Method::GET, false, false) => "list",
        (&Method::POST, false, _) => "create",
        (&Method::PATCH, true, _) => "patch",
        (&Method::DELETE, true, _) => "delete",
        _ => {
            let mut s = shared.store.lock().unwrap();
            return s.unsupported(format!("{method} {path}"));
        }
    };
    let resource_name = match &t.sub {
        Some(sub) => format!("{}/{sub}", t.res.name),
        None => t.res.name.to_string(),
    };
    {
        let mut s = shared.store.lock().unwrap();
        s.requests.push(format!(
            "{user} {verb} {resource_name} {}",
            t.name.as_deref().unwrap_or("")
        ));
        if !rbac_allows(
            &s,
            &user,
            &groups,
            verb,
            t.res.group,
            &resource_name,
            t.name.as_deref(),
            t.namespace.as_deref(),
        ) {
            let scope = match &t.namespace {
                Some(ns) => format!("in the namespace \"{ns}\""),
                None => "at the cluster scope".into(),
            };
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{} is forbidden: User \"{user}\" cannot {verb} resource \"{resource_name}\" in API group \"{}\" {scope}",
                    t.res.name, t.res.group
                ),
            );
        }
        if t.sub.is_some() {
            return s.unsupported(format!("{method} {path}: a subresource"));
        }
    }
    match verb {
        "get" => {
            let s = shared.store.lock().unwrap();
            let (key, name) = t.key();
            match s.objects.get(&key) {
                Some(o) => ok_json(StatusCode::OK, o),
                None => not_found(&t.res, &name),
            }
        }
        "list" => list(&shared, &t, &q),
        "watch" => watch_objects(shared.clone(), t, q),
        "create" => create(&shared, &t, &user, &groups, &body).await,
        "patch" => patch(&shared, &t, &headers, &body),
        "delete" => delete(&shared, &t),
        _ => unreachable!(),
    }
}

/// The objects of `t`'s resource (and namespace) the selectors pick.
fn selected(s: &Store, t: &Target, q: &BTreeMap<String, String>) -> Result<Vec<Value>, String> {
    let labels = q.get("labelSelector").map_or("", String::as_str);
    let fields = q.get("fieldSelector").map_or("", String::as_str);
    let mut out = Vec::new();
    for ((r, ns, _), o) in &s.objects {
        if *r != t.res.name || t.namespace.as_ref().is_some_and(|want| want != ns) {
            continue;
        }
        let l = selector_matches(labels, &o["metadata"]["labels"])
            .ok_or_else(|| format!("label selector {labels:?}"))?;
        let f = fields_match(fields, o).ok_or_else(|| format!("field selector {fields:?}"))?;
        if l && f {
            out.push(o.clone());
        }
    }
    Ok(out)
}

fn list(shared: &Shared, t: &Target, q: &BTreeMap<String, String>) -> Response {
    let mut s = shared.store.lock().unwrap();
    if q.get("continue").is_some_and(|c| !c.is_empty()) {
        return s.unsupported("a list continued".into());
    }
    // A limit is honoured by returning everything in one page with no
    // continue token, as a list served from the watch cache does.
    match selected(&s, t, q) {
        Ok(items) => ok_json(
            StatusCode::OK,
            &json!({"kind": format!("{}List", t.res.kind), "apiVersion": api_version(&t.res),
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        ),
        Err(e) => s.unsupported(e),
    }
}

fn watch_objects(shared: Arc<Shared>, t: Target, q: BTreeMap<String, String>) -> Response {
    let from: u64 = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => 0,
        Some(v) => match v.parse() {
            Ok(n) => n,
            Err(_) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("invalid resource version {v:?}"),
                )
            }
        },
    };
    if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
        let mut s = shared.store.lock().unwrap();
        return s.unsupported("a watch with sendInitialEvents (streaming list)".into());
    }
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    let line = |kind: &str, obj: &Value| {
        let mut l = json!({"type": kind, "object": obj}).to_string();
        l.push('\n');
        Ok(Bytes::from(l))
    };
    let matches = {
        let labels = q.get("labelSelector").cloned().unwrap_or_default();
        let fields = q.get("fieldSelector").cloned().unwrap_or_default();
        let namespace = t.namespace.clone();
        move |o: &Value| {
            namespace
                .as_ref()
                .is_none_or(|ns| o["metadata"]["namespace"].as_str() == Some(ns))
                && selector_matches(&labels, &o["metadata"]["labels"]).unwrap_or(false)
                && fields_match(&fields, o).unwrap_or(false)
        }
    };
    {
        let mut s = shared.store.lock().unwrap();
        let labels = q.get("labelSelector").map_or("", String::as_str);
        let fields = q.get("fieldSelector").map_or("", String::as_str);
        if selector_matches(labels, &json!({})).is_none()
            || fields_match(fields, &json!({})).is_none()
        {
            return s.unsupported(format!("watch selectors {labels:?} {fields:?}"));
        }
    }
    let resource = t.res.name;
    tokio::spawn(async move {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut seen = {
            let s = shared.store.lock().unwrap();
            if from == 0 {
                for ((r, _, _), o) in &s.objects {
                    if *r == resource && matches(o) && tx.try_send(line("ADDED", o)).is_err() {
                        return;
                    }
                }
                s.rv
            } else {
                from
            }
        };
        loop {
            let notified = shared.changed.notified();
            let events: Vec<Result<Bytes, Infallible>> = {
                let s = shared.store.lock().unwrap();
                let mut out = Vec::new();
                let after = seen;
                for c in s.history.iter().filter(|c| c.rv > after) {
                    seen = c.rv;
                    if c.resource != resource {
                        continue;
                    }
                    let now = c.now.as_ref().filter(|o| matches(o));
                    let before = c.before.as_ref().filter(|o| matches(o));
                    match (now, before) {
                        (Some(n), None) => out.push(line("ADDED", n)),
                        (Some(n), Some(_)) => out.push(line("MODIFIED", n)),
                        (None, Some(b)) => out.push(line("DELETED", b)),
                        (None, None) => {}
                    }
                }
                out
            };
            for e in events {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = sleep => return,
                _ = tx.closed() => return,
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap()
}

async fn create(
    shared: &Arc<Shared>,
    t: &Target,
    user: &str,
    groups: &[String],
    body: &Bytes,
) -> Response {
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is no JSON object",
        );
    };
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
        let mut s = shared.store.lock().unwrap();
        return s.unsupported("a create without metadata.name (generateName)".into());
    };
    let ns = if t.res.namespaced {
        let ns = t.namespace.clone().unwrap_or_default();
        obj["metadata"]["namespace"] = json!(ns);
        ns
    } else {
        String::new()
    };
    {
        let s = shared.store.lock().unwrap();
        // NamespaceLifecycle: no object in a namespace that does not exist
        // or is being terminated.
        if t.res.namespaced && s.terminating.contains_key(&ns) {
            return status_with(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    t.res.name
                ),
                json!({"name": name, "kind": t.res.name}),
            );
        }
        if t.res.namespaced
            && !s
                .objects
                .contains_key(&("namespaces", String::new(), ns.clone()))
        {
            return status_with(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("namespaces \"{ns}\" not found"),
                json!({"name": ns, "kind": "namespaces"}),
            );
        }
        if s.objects
            .contains_key(&(t.res.name, ns.clone(), name.clone()))
        {
            let qualified = if t.res.group.is_empty() {
                t.res.name.to_string()
            } else {
                format!("{}.{}", t.res.name, t.res.group)
            };
            return status_with(
                StatusCode::CONFLICT,
                "AlreadyExists",
                &format!("{qualified} \"{name}\" already exists"),
                json!({"name": name, "group": t.res.group, "kind": t.res.name}),
            );
        }
    }
    if t.res.name == "pods" {
        match admit(shared, &ns, user, groups, obj.clone()).await {
            Ok(p) => obj = p,
            Err(r) => return r,
        }
    }
    let mut s = shared.store.lock().unwrap();
    s.uids += 1;
    obj["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012}", s.uids));
    obj["metadata"]["creationTimestamp"] = json!("2026-11-28T12:00:00Z");
    obj["metadata"]["generation"] = json!(1);
    if t.res.name == "namespaces" {
        obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
    }
    let stored = s.put(&t.res, obj);
    drop(s);
    shared.changed.notify_waiters();
    ok_json(StatusCode::CREATED, &stored)
}

/// Deletes an object: gone at once (no finalizers), except a Namespace,
/// which is marked Terminating (`deletionTimestamp`, `status.phase`) for
/// the namespace controller (see [`namespace_controller`]).
fn delete(shared: &Shared, t: &Target) -> Response {
    let mut s = shared.store.lock().unwrap();
    let (key, name) = t.key();
    let Some(obj) = s.objects.get(&key).cloned() else {
        return not_found(&t.res, &name);
    };
    if t.res.name == "namespaces" {
        let mut ns = obj;
        if ns["metadata"]["deletionTimestamp"].is_null() {
            ns["metadata"]["deletionTimestamp"] = json!("2026-11-28T12:30:00Z");
            ns["status"]["phase"] = json!("Terminating");
            ns = s.put(&t.res, ns);
            s.terminating.insert(name, std::time::Instant::now());
        }
        drop(s);
        shared.changed.notify_waiters();
        return ok_json(StatusCode::OK, &ns);
    }
    s.remove(key);
    drop(s);
    shared.changed.notify_waiters();
    ok_json(StatusCode::OK, &obj)
}

/// How long a Terminating namespace keeps its objects before the namespace
/// controller deletes them and it (upstream: as long as discovering and
/// deleting every kind takes, seconds).
const NAMESPACE_TEARDOWN: Duration = Duration::from_secs(1);

/// The namespace controller (`pkg/controller/namespace`): a namespace
/// Terminating for [`NAMESPACE_TEARDOWN`] loses every object in it, then
/// goes.
async fn namespace_controller(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut s = shared.store.lock().unwrap();
        let due: Vec<String> = s
            .terminating
            .iter()
            .filter(|(_, at)| at.elapsed() >= NAMESPACE_TEARDOWN)
            .map(|(n, _)| n.clone())
            .collect();
        if due.is_empty() {
            continue;
        }
        for ns in due {
            s.terminating.remove(&ns);
            let inside: Vec<Key> = s
                .objects
                .keys()
                .filter(|(_, n, _)| *n == ns)
                .cloned()
                .collect();
            for k in inside {
                s.remove(k);
            }
            s.remove(("namespaces", String::new(), ns));
        }
        drop(s);
        shared.changed.notify_waiters();
    }
}

fn patch(shared: &Shared, t: &Target, headers: &HeaderMap, body: &Bytes) -> Response {
    let kind = headers
        .get("content-type")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut s = shared.store.lock().unwrap();
    let (key, name) = t.key();
    let Some(before) = s.objects.get(&key).cloned() else {
        return not_found(&t.res, &name);
    };
    let Ok(p) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the patch is no JSON",
        );
    };
    let mut obj = before.clone();
    match kind.as_str() {
        "application/json-patch+json" => {
            let Ok(ops) = serde_json::from_value::<json_patch::Patch>(p) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "no JSON Patch");
            };
            if let Err(e) = json_patch::patch(&mut obj, &ops) {
                // `endpoints/handlers/patch.go`: a patch that does not
                // apply is a 422.
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    &format!("the server rejected our request due to an error in our request: {e}"),
                );
            }
        }
        "application/merge-patch+json" => json_patch::merge(&mut obj, &p),
        "application/strategic-merge-patch+json" => {
            if let Err(e) = strategic_merge(&mut obj, &p) {
                return s.unsupported(format!("a strategic merge patch: {e}"));
            }
        }
        other => return s.unsupported(format!("a patch of type {other:?}")),
    }
    obj["metadata"]["uid"] = before["metadata"]["uid"].clone();
    obj["metadata"]["name"] = before["metadata"]["name"].clone();
    if obj["spec"] != before["spec"] || obj.get("webhooks") != before.get("webhooks") {
        let g = before["metadata"]["generation"].as_i64().unwrap_or(1);
        obj["metadata"]["generation"] = json!(g + 1);
    }
    let stored = s.put(&t.res, obj);
    drop(s);
    shared.changed.notify_waiters();
    ok_json(StatusCode::OK, &stored)
}

/// The lists our kinds merge by a key in a strategic merge patch (their
/// `patchMergeKey`), by field name.
const MERGE_KEYS: &[(&str, &str)] = &[("webhooks", "name"), ("matchConditions", "name")];

/// A strategic merge patch (see the module's documentation): what it
/// cannot apply as upstream would is an error.
fn strategic_merge(obj: &mut Value, patch: &Value) -> Result<(), String> {
    let (Some(o), Some(p)) = (obj.as_object_mut(), patch.as_object()) else {
        *obj = patch.clone();
        return Ok(());
    };
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") {
            continue;
        }
        if k.starts_with('$') {
            return Err(format!("directive {k}"));
        }
        if v.is_null() {
            o.remove(k);
            continue;
        }
        let key = MERGE_KEYS.iter().find(|(f, _)| f == k).map(|(_, key)| *key);
        match (o.get_mut(k), v, key) {
            (Some(cur @ Value::Object(_)), Value::Object(_), _) => strategic_merge(cur, v)?,
            (Some(Value::Array(cur)), Value::Array(items), Some(key)) => {
                for item in items {
                    if item.get("$patch").is_some() {
                        return Err(format!("a $patch directive in {k}"));
                    }
                    match cur.iter_mut().find(|c| c[key] == item[key]) {
                        Some(c) => strategic_merge(c, item)?,
                        None => cur.push(item.clone()),
                    }
                }
            }
            (_, Value::Array(items), None) if items.iter().any(Value::is_object) => {
                // A list of objects with no merge key we know: whether
                // upstream replaces or merges it depends on its schema;
                // the webhook configuration's atomic lists are replaced.
                if !matches!(k.as_str(), "rules" | "matchExpressions") {
                    return Err(format!("list {k}: its merge strategy is not modelled"));
                }
                o.insert(k.clone(), v.clone());
            }
            _ => {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

/// `metav1.LabelSelector` (`matchLabels`, `matchExpressions` with In,
/// NotIn, Exists, DoesNotExist) against `labels`; an absent selector
/// matches everything.
fn label_selector_matches(sel: &Value, labels: &Value) -> bool {
    if sel.is_null() {
        return true;
    }
    let ok_labels = sel["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels[k] == *v);
    let ok_exprs = sel["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or("");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let got = labels[key].as_str();
            match e["operator"].as_str() {
                Some("In") => got.is_some_and(|g| values.contains(&g)),
                Some("NotIn") => got.is_none_or(|g| !values.contains(&g)),
                Some("Exists") => got.is_some(),
                Some("DoesNotExist") => got.is_none(),
                _ => false,
            }
        });
    ok_labels && ok_exprs
}

/// Whether a webhook's `rules` select a pod CREATE.
fn rules_select_pod_create(hook: &Value) -> bool {
    let has = |v: &Value, want: &str| {
        v.as_array()
            .into_iter()
            .flatten()
            .any(|x| x.as_str() == Some(want) || x.as_str() == Some("*"))
    };
    hook["rules"].as_array().into_iter().flatten().any(|r| {
        has(&r["operations"], "CREATE")
            && has(&r["apiGroups"], "")
            && has(&r["apiVersions"], "v1")
            && has(&r["resources"], "pods")
            && r["scope"]
                .as_str()
                .is_none_or(|s| s == "*" || s == "Namespaced")
    })
}

/// Runs the mutating webhooks on pod `pod` being created in `ns`: the pod
/// as they leave it, or the refusal.
async fn admit(
    shared: &Arc<Shared>,
    ns: &str,
    user: &str,
    groups: &[String],
    mut pod: Value,
) -> Result<Value, Response> {
    let (configs, ns_labels) = {
        let s = shared.store.lock().unwrap();
        let configs: Vec<Value> = s
            .objects
            .iter()
            .filter(|((r, _, _), _)| *r == "mutatingwebhookconfigurations")
            .map(|(_, v)| v.clone())
            .collect();
        let labels = s
            .objects
            .get(&("namespaces", String::new(), ns.to_string()))
            .map(|n| n["metadata"]["labels"].clone())
            .unwrap_or(Value::Null);
        (configs, labels)
    };
    for config in configs {
        for hook in config["webhooks"].as_array().cloned().unwrap_or_default() {
            let hook_name = hook["name"].as_str().unwrap_or("").to_string();
            if !rules_select_pod_create(&hook)
                || !label_selector_matches(&hook["namespaceSelector"], &ns_labels)
                || !label_selector_matches(&hook["objectSelector"], &pod["metadata"]["labels"])
            {
                continue;
            }
            let fail = hook["failurePolicy"].as_str().unwrap_or("Fail") == "Fail";
            let refuse = |msg: String| {
                status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    &format!("Internal error occurred: {msg}"),
                )
            };
            // matchConditions: all true to call; an error is the failure
            // policy's (`matchconditions/matcher.go`).
            let mut called = true;
            for c in hook["matchConditions"].as_array().into_iter().flatten() {
                let expr = c["expression"].as_str().unwrap_or("");
                let result = cel_interpreter::Program::compile(expr)
                    .map_err(|e| e.to_string())
                    .and_then(|p| {
                        let mut ctx = cel_interpreter::Context::default();
                        ctx.add_variable("object", pod.clone())
                            .map_err(|e| e.to_string())?;
                        p.execute(&ctx).map_err(|e| e.to_string())
                    });
                match result {
                    Ok(cel_interpreter::Value::Bool(true)) => {}
                    Ok(cel_interpreter::Value::Bool(false)) => called = false,
                    other => {
                        if fail {
                            return Err(refuse(format!(
                                "failed calling webhook \"{hook_name}\": match condition {:?}: {other:?}",
                                c["name"]
                            )));
                        }
                        called = false;
                    }
                }
            }
            if !called {
                continue;
            }
            match call(shared, &hook, ns, user, groups, &pod).await {
                Ok(resp) => {
                    if resp["allowed"] != json!(true) {
                        let msg = resp["status"]["message"].as_str().unwrap_or("");
                        let code = resp["status"]["code"].as_u64().unwrap_or(400) as u16;
                        return Err(status(
                            StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
                            "BadRequest",
                            &format!("admission webhook \"{hook_name}\" denied the request: {msg}"),
                        ));
                    }
                    if let Some(p) = resp["patch"].as_str() {
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(p)
                            .map_err(|e| refuse(format!("webhook patch: {e}")))?;
                        let ops: json_patch::Patch = serde_json::from_slice(&bytes)
                            .map_err(|e| refuse(format!("webhook patch: {e}")))?;
                        json_patch::patch(&mut pod, &ops)
                            .map_err(|e| refuse(format!("webhook patch: {e}")))?;
                    }
                }
                Err(e) => {
                    if fail {
                        return Err(refuse(format!(
                            "failed calling webhook \"{hook_name}\": failed to call webhook: {e}"
                        )));
                    }
                }
            }
        }
    }
    Ok(pod)
}

/// Calls `hook` for `pod` at its Service's endpoints: its
/// AdmissionResponse, or why the call failed (worded as upstream's).
async fn call(
    shared: &Arc<Shared>,
    hook: &Value,
    ns: &str,
    user: &str,
    groups: &[String],
    pod: &Value,
) -> Result<Value, String> {
    let svc = &hook["clientConfig"]["service"];
    let (svc_ns, svc_name) = (
        svc["namespace"].as_str().unwrap_or("").to_string(),
        svc["name"].as_str().unwrap_or("").to_string(),
    );
    let port = svc["port"].as_u64().unwrap_or(443);
    let path = svc["path"].as_str().unwrap_or("/");
    let timeout = hook["timeoutSeconds"].as_u64().unwrap_or(10);
    let host = format!("{svc_name}.{svc_ns}.svc");
    let url = format!("https://{host}:{port}{path}?timeout={timeout}s");
    let endpoint = {
        let s = shared.store.lock().unwrap();
        if !s
            .objects
            .contains_key(&("services", svc_ns.clone(), svc_name.clone()))
        {
            return Err(format!("Post \"{url}\": service \"{svc_name}\" not found"));
        }
        s.endpoints
            .get(&(svc_ns.clone(), svc_name.clone()))
            .and_then(|e| e.first().copied())
    };
    let Some(endpoint) = endpoint else {
        return Err(format!(
            "Post \"{url}\": no endpoints available for service \"{svc_name}\""
        ));
    };
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("{:032x}", shared.store.lock().unwrap().rv),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"], "namespace": ns, "operation": "CREATE",
            "userInfo": {"username": user, "groups": groups},
            "object": pod, "oldObject": null, "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    });
    let ca = hook["clientConfig"]["caBundle"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "--max-time", &timeout.to_string()])
            .args([
                "--connect-to",
                &format!("{host}:{port}:{}:{}", endpoint.ip(), endpoint.port()),
            ])
            .args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
            ]);
        // The caBundle is the only trust; without one, the system's roots
        // (which never signed a webhook's certificate).
        if let Some(ca) = &ca {
            let f = dir.path().join("ca.crt");
            std::fs::write(&f, ca).map_err(|e| e.to_string())?;
            cmd.arg("--cacert").arg(&f);
        }
        cmd.arg(&url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin
                .write_all(review.to_string().as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "Post \"{url}\": {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let v: Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("Post \"{url}\": the response is no AdmissionReview: {e}"))?;
        Ok(v["response"].clone())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Where the stand-in's CA is (for clients that take a file).
pub fn ca_path(api: &ClusterApi) -> PathBuf {
    api.dir.path().join("ca.crt")
}
