//! A stand-in for the Kubernetes API server, as far as Nodes, Namespaces,
//! Pods, MultiNetworkPolicies and NetworkAttachmentDefinitions: list and
//! watch `/api/v1/nodes`, `/api/v1/namespaces`, `/api/v1/pods` (every
//! namespace's), `/apis/k8s.cni.cncf.io/v1beta1/multi-networkpolicies`
//! and `/apis/k8s.cni.cncf.io/v1/network-attachment-definitions` over HTTPS (each
//! [`Res`]; the requests log names the resource but for nodes), to bearer
//! tokens of service accounts,
//! authorized by the RBAC objects of our manifests. It answers as upstream
//! does (kubernetes/kubernetes, `staging/src/k8s.io/apiserver`):
//!
//! - **list** (`endpoints/handlers/get.go`): a `NodeList` whose
//!   `metadata.resourceVersion` is the version listed at; items without
//!   `kind` and `apiVersion`, in key (name) order; the label selector
//!   applied (`apimachinery/pkg/labels/selector.go`: `k=v`, `k==v`, `k!=v`,
//!   `k`, `!k`). Paged as the watch cache pages (`pkg/storage/cacher`):
//!   see [`list`].
//! - **watch** (`endpoints/handlers/watch.go`, `storage/cacher/cacher.go`,
//!   `cache_watcher.go`, `watch_cache.go`): a stream of
//!   `{"type":…,"object":…}` JSON documents, one per line, of the changes
//!   after `resourceVersion` (`"0"` or none: the current nodes as `ADDED`
//!   first). An object that starts matching the selector comes as
//!   `ADDED`, one that stops matching as `DELETED` with its previous
//!   content (`convertToWatchEvent`). A `resourceVersion` older than the
//!   history kept (`compact`) is answered, as the watch cache's
//!   `getAllEventsSinceLocked` error is by `newErrWatcher`, with a 200 and
//!   one `ERROR` event: a `Status` of code 410, reason `Expired`, "too old
//!   resource version". The stream ends after `timeoutSeconds`, or when
//!   the test takes the server down. Bookmarks, which are a hint, are not
//!   sent.
//! - **down** (restarting): open watches end, and every request is
//!   answered 503 `ServiceUnavailable`, as an API server that is not ready
//!   answers, until it is up again.
//! - **what it cannot answer as upstream would** (a set-based selector, a
//!   field selector, a list or watch it would have to wait for, ...) is
//!   answered 500 and recorded:
//!   [`ApiServer::assert_only_lists_watches_status_patches_and_leases`],
//!   and dropping the server, fail the test with it (a panic in a handler
//!   would only end that connection's task, and the test would go on).
//! - **authentication and authorization**: a token names a service
//!   account (`system:serviceaccount:NS:NAME`, in group
//!   `system:serviceaccounts`); a request is allowed when a
//!   ClusterRoleBinding to it (or its groups) refers to a ClusterRole (or,
//!   in a namespace, a RoleBinding there to a Role or ClusterRole) with
//!   a rule for the verb (`list`, `watch`), the resource's API group and
//!   resource (`plugin/pkg/auth/authorizer/rbac/rbac.go` `RuleAllows`: `*`
//!   matches any; a rule with `resourceNames` allows no list or watch).
//!   Otherwise a 401 or a 403 `Status`, as upstream words them.
//! - **leases** (`coordination.k8s.io/v1`, namespaced): list (and watch)
//!   in a namespace, create, get and delete (see [`create`],
//!   [`delete_one`]), authorized by the Roles and RoleBindings of the
//!   namespace too.
//! - **the garbage collector**: an object whose owners are all gone is
//!   deleted ([`Inner::collect_garbage`]).
//! - **patch of a node's status** (`PATCH /api/v1/nodes/NAME/status`, a
//!   JSON merge patch: what a node agent such as flannel or vtep-sync
//!   sends to set its node's annotations): authorized for `patch` on
//!   `nodes/status`; applied as the status subresource's strategy applies
//!   it (`pkg/registry/core/node/strategy.go` `nodeStatusStrategy`: the
//!   spec stays as it was, the metadata and status change), a new
//!   resource version and a `MODIFIED` event; a missing node is a 404.

#![allow(dead_code)]

#[path = "api_common.rs"]
mod api_common;
#[path = "tls.rs"]
mod tls;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch};
use axum::Router;
use serde_json::{json, Value};

/// A resource the stand-in serves, list and watch (the collection of
/// every namespace for a namespaced one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Res {
    /// API group (`""`: core).
    pub group: &'static str,
    /// Its objects' `apiVersion`.
    pub api_version: &'static str,
    /// Its objects' `kind`.
    pub kind: &'static str,
    /// The resource (plural) as RBAC and the URL name it.
    pub resource: &'static str,
    /// Namespaced (objects keyed `namespace/name`, as etcd's keys sort).
    pub namespaced: bool,
}

/// Nodes.
pub const NODES: Res = Res {
    group: "",
    api_version: "v1",
    kind: "Node",
    resource: "nodes",
    namespaced: false,
};
/// Namespaces.
pub const NAMESPACES: Res = Res {
    group: "",
    api_version: "v1",
    kind: "Namespace",
    resource: "namespaces",
    namespaced: false,
};
/// Pods.
pub const PODS: Res = Res {
    group: "",
    api_version: "v1",
    kind: "Pod",
    resource: "pods",
    namespaced: true,
};
/// MultiNetworkPolicies (the CRD of `config/kubernetes/multi-networkpolicy-crd.yaml`).
pub const MULTI_NETWORK_POLICIES: Res = Res {
    group: "k8s.cni.cncf.io",
    api_version: "k8s.cni.cncf.io/v1beta1",
    kind: "MultiNetworkPolicy",
    resource: "multi-networkpolicies",
    namespaced: true,
};

/// NetworkAttachmentDefinitions (Multus's CRD, `k8s.cni.cncf.io/v1`): the
/// overlay networks' NADs.
pub const NETWORK_ATTACHMENT_DEFINITIONS: Res = Res {
    group: "k8s.cni.cncf.io",
    api_version: "k8s.cni.cncf.io/v1",
    kind: "NetworkAttachmentDefinition",
    resource: "network-attachment-definitions",
    namespaced: true,
};

/// Leases (`coordination.k8s.io/v1`), namespaced: served in their
/// namespace (`/apis/coordination.k8s.io/v1/namespaces/NS/leases`): list,
/// create, get and delete.
pub const LEASES: Res = Res {
    group: "coordination.k8s.io",
    api_version: "coordination.k8s.io/v1",
    kind: "Lease",
    resource: "leases",
    namespaced: true,
};

/// Every resource the stand-in stores (the garbage collector looks owners
/// up among them).
const ALL: [Res; 6] = [
    NODES,
    NAMESPACES,
    PODS,
    MULTI_NETWORK_POLICIES,
    NETWORK_ATTACHMENT_DEFINITIONS,
    LEASES,
];

impl Res {
    /// The resource as errors name it: `leases.coordination.k8s.io`
    /// (`schema.GroupResource.String`).
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// The store's key of `obj`.
    fn key(&self, obj: &Value) -> String {
        let name = obj["metadata"]["name"].as_str().unwrap();
        if self.namespaced {
            format!("{}/{name}", obj["metadata"]["namespace"].as_str().unwrap())
        } else {
            name.to_string()
        }
    }

    /// What the requests log says for a request: nodes' as they always
    /// were, others' with the resource.
    fn log(&self, what: &str) -> String {
        if *self == NODES {
            what.to_string()
        } else {
            match what.split_once(' ') {
                Some((verb, rest)) => format!("{verb} {} {rest}", self.resource),
                None => format!("{what} {}", self.resource),
            }
        }
    }
}

/// A change of the store, at a resource version.
#[derive(Clone)]
struct Change {
    rv: u64,
    /// Of which resource.
    res: Res,
    /// The object after the change (`None`: deleted).
    now: Option<Value>,
    /// The object before (`None`: created).
    before: Option<Value>,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    /// Each resource's objects, by key.
    objects: BTreeMap<&'static str, BTreeMap<String, Value>>,
    /// Changes after `oldest`.
    history: Vec<Change>,
    /// A watch resumes from any version at or after this one.
    oldest: u64,
    /// Bumped to end every open watch.
    epoch: u64,
    /// Answering 503 to everything.
    down: bool,
    /// The garbage collector lags (upstream's runs apart, within
    /// moments): it deletes nothing until it catches up.
    gc_lagging: bool,
    /// Token to service account (`namespace`, `name`).
    tokens: BTreeMap<String, (String, String)>,
    /// The node a token's pod runs on (a bound token's
    /// `authentication.kubernetes.io/node-name`).
    token_nodes: BTreeMap<String, String>,
    /// Every request: its method, verb and query.
    requests: Vec<String>,
    /// Requests the stand-in cannot answer as the API server would.
    unsupported: Vec<String>,
}

impl Inner {
    /// Records a request the stand-in cannot answer as upstream, and
    /// answers it 500 (the test fails from its own thread: see
    /// [`ApiServer::assert_only_lists_watches_status_patches_and_leases`] and
    /// `Drop`).
    fn unsupported(&mut self, what: String) -> Response {
        let msg = format!("the API server stand-in cannot answer this as upstream would: {what}");
        self.unsupported.push(what);
        status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", &msg)
    }

    /// `res`'s objects now.
    fn objs(&self, res: Res) -> BTreeMap<String, Value> {
        self.objects.get(res.resource).cloned().unwrap_or_default()
    }

    /// `res`'s object `key`, as stored (no copy of the others: the scale
    /// benchmark writes thousands).
    fn obj(&self, res: Res, key: &str) -> Option<&Value> {
        self.objects.get(res.resource)?.get(key)
    }

    /// `res`'s objects, to change them.
    fn objs_mut(&mut self, res: Res) -> &mut BTreeMap<String, Value> {
        self.objects.entry(res.resource).or_default()
    }

    /// `res`'s objects at resource version `rv` (at least `oldest`): the
    /// current ones with the changes after `rv` undone, as the watch
    /// cache's snapshots (`pkg/storage/cacher/store_btree.go`) or etcd at
    /// a revision hold them.
    fn objects_at(&self, res: Res, rv: u64) -> BTreeMap<String, Value> {
        let mut objs = self.objs(res);
        for c in self
            .history
            .iter()
            .rev()
            .filter(|c| c.rv > rv && c.res == res)
        {
            let obj = c.now.as_ref().or(c.before.as_ref()).unwrap();
            let key = res.key(obj);
            match &c.before {
                Some(b) => objs.insert(key, b.clone()),
                None => objs.remove(&key),
            };
        }
        objs
    }

    /// Stores `obj` (created or replaced) as the API server would: a new
    /// resource version, its uid kept or made; returns it.
    fn put(&mut self, res: Res, mut obj: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        let key = res.key(&obj);
        let before = self.obj(res, &key).cloned();
        let uid = before
            .as_ref()
            .map(|b| b["metadata"]["uid"].clone())
            .unwrap_or_else(|| json!(format!("00000000-0000-4000-8000-{rv:012}")));
        obj["metadata"]["uid"] = uid;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] = json!("2026-11-27T00:00:00Z");
        }
        self.objs_mut(res).insert(key, obj.clone());
        self.history.push(Change {
            rv,
            res,
            now: Some(obj.clone()),
            before,
        });
        obj
    }

    /// Deletes `res`'s object `key`, if there, and what the garbage
    /// collector deletes with it.
    fn remove(&mut self, res: Res, key: &str) {
        self.remove_one(res, key);
        self.collect_garbage();
    }

    fn remove_one(&mut self, res: Res, key: &str) {
        let Some(before) = self.objs_mut(res).remove(key) else {
            return;
        };
        self.rv += 1;
        let rv = self.rv;
        self.history.push(Change {
            rv,
            res,
            now: None,
            before: Some(before),
        });
    }

    /// The garbage collector (kube-controller-manager,
    /// `pkg/controller/garbagecollector/garbagecollector.go`
    /// `attemptToDeleteItem`, `classifyReferences`): an object whose
    /// `ownerReferences` all name owners that are gone is deleted (in the
    /// background: as `propagationPolicy: Background`, the default). An
    /// owner is gone when no object of its kind has its name (in the
    /// dependent's namespace, for a namespaced kind), or the one that has
    /// it has another UID (`isDangling`: the owner was deleted and made
    /// again). This includes an object created naming an owner that never
    /// was. Owners of a kind the stand-in does not store are left as
    /// they are (the collector would ask the API server). Upstream runs
    /// within moments; this, at once.
    fn collect_garbage(&mut self) {
        if self.gc_lagging {
            return;
        }
        loop {
            let mut doomed = Vec::new();
            for res in ALL {
                for (key, obj) in self.objs(res) {
                    let refs = obj["metadata"]["ownerReferences"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if refs.is_empty() {
                        continue;
                    }
                    let dangling = |r: &Value| {
                        let Some(owner) = ALL
                            .iter()
                            .find(|o| o.kind == r["kind"] && o.api_version == r["apiVersion"])
                        else {
                            return false;
                        };
                        let name = r["name"].as_str().unwrap_or_default();
                        let okey = if owner.namespaced {
                            let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
                            format!("{ns}/{name}")
                        } else {
                            name.to_string()
                        };
                        self.obj(*owner, &okey)
                            .is_none_or(|o| o["metadata"]["uid"] != r["uid"])
                    };
                    if refs.iter().all(dangling) {
                        doomed.push((res, key));
                    }
                }
            }
            if doomed.is_empty() {
                return;
            }
            for (res, key) in doomed {
                self.remove_one(res, &key);
            }
        }
    }
}

struct Shared {
    inner: Mutex<Inner>,
    changed: tokio::sync::Notify,
    /// ClusterRoles, ClusterRoleBindings, Roles and RoleBindings.
    rbac: Vec<Value>,
}

/// The running stand-in.
pub struct ApiServer {
    rt: tokio::runtime::Runtime,
    handle: axum_server::Handle<SocketAddr>,
    shared: Arc<Shared>,
    /// Where it listens.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl ApiServer {
    /// Starts it, authorizing by the RBAC objects among `docs` (the
    /// manifests' documents).
    pub fn start(docs: &[Value]) -> ApiServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Self::serve(docs, listener)
    }

    /// Starts it in network namespace `netns` (a name of `ip netns`),
    /// listening on `ip` there: where the nodes of a test's underlay reach
    /// it, as a cluster's nodes reach their API server.
    pub fn start_in(docs: &[Value], netns: &str, ip: std::net::IpAddr) -> ApiServer {
        let path = format!("/run/netns/{netns}");
        // A thread of its own enters the namespace to make the socket (the
        // socket stays in it), and ends.
        let listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            std::net::TcpListener::bind((ip, 0)).unwrap()
        })
        .join()
        .unwrap();
        Self::serve(docs, listener)
    }

    fn serve(docs: &[Value], listener: std::net::TcpListener) -> ApiServer {
        let addr = listener.local_addr().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ip = addr.ip().to_string();
        tls::write_ca_and_cert(
            dir.path(),
            "kubernetes stand-in CA",
            &["localhost", &ip, "kubernetes.default.svc"],
        );

        let rbac = docs
            .iter()
            .filter(|d| {
                matches!(
                    d["kind"].as_str(),
                    Some("ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding")
                )
            })
            .cloned()
            .collect();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                rv: 100,
                oldest: 100,
                ..Default::default()
            }),
            changed: tokio::sync::Notify::new(),
            rbac,
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let router = Router::new()
            .route("/api/v1/nodes", get(|s, h, q| collection(s, h, q, NODES)))
            .route(
                "/api/v1/namespaces",
                get(|s, h, q| collection(s, h, q, NAMESPACES)),
            )
            .route("/api/v1/pods", get(|s, h, q| collection(s, h, q, PODS)))
            .route(
                "/apis/k8s.cni.cncf.io/v1beta1/multi-networkpolicies",
                get(|s, h, q| collection(s, h, q, MULTI_NETWORK_POLICIES)),
            )
            .route(
                "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
                get(|s, h, q| collection(s, h, q, NETWORK_ATTACHMENT_DEFINITIONS)),
            )
            .route("/api/v1/nodes/{name}/status", patch(patch_status))
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                get(|s, UrlPath(ns): UrlPath<String>, h, q| {
                    collection_in(s, h, q, LEASES, Some(ns))
                })
                .post(|s, UrlPath(ns): UrlPath<String>, h, q, b| create(s, h, q, b, LEASES, ns)),
            )
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                get(|s, UrlPath((ns, name)): UrlPath<(String, String)>, h| {
                    get_one(s, h, LEASES, ns, name)
                })
                .delete(
                    |s, UrlPath((ns, name)): UrlPath<(String, String)>, h, b| {
                        delete_one(s, h, b, LEASES, ns, name)
                    },
                ),
            )
            .with_state(shared.clone());
        let handle = api_common::serve_https(&rt, listener, dir.path(), router);
        ApiServer {
            rt,
            handle,
            shared,
            addr,
            dir,
        }
    }

    /// The CA that signed its certificate (PEM file).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A bearer token for service account `name` of `namespace`.
    pub fn token_for(&self, namespace: &str, name: &str) -> String {
        let mut i = self.shared.inner.lock().unwrap();
        let token = format!("token-{}-{namespace}-{name}", i.tokens.len());
        i.tokens
            .insert(token.clone(), (namespace.into(), name.into()));
        token
    }

    /// A bearer token for service account `name` of `namespace` in a pod
    /// on `node` (as the kubelet's projected token is bound to its pod and
    /// node): the requests log says which node a patch came from.
    pub fn token_for_node(&self, namespace: &str, name: &str, node: &str) -> String {
        let token = self.token_for(namespace, name);
        self.shared
            .inner
            .lock()
            .unwrap()
            .token_nodes
            .insert(token.clone(), node.into());
        token
    }

    /// A kubeconfig for `token` (what a client outside the cluster uses).
    pub fn kubeconfig(&self, token: &str, at: &Path) {
        let ca = std::fs::read_to_string(self.ca_file()).unwrap();
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        std::fs::write(
            at,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters:\n- name: k\n  cluster:\n    server: https://{}\n    certificate-authority-data: {ca}\n\
                 users:\n- name: u\n  user:\n    token: {token}\n\
                 contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n",
                self.addr
            ),
        )
        .unwrap();
    }

    /// Creates or replaces node `name` with `labels` and its
    /// `status.addresses` (`(type, address)`).
    pub fn put_node(&self, name: &str, labels: &[(&str, &str)], addresses: &[(&str, &str)]) {
        let mut i = self.shared.inner.lock().unwrap();
        let before = i.obj(NODES, name).cloned();
        // The kubelet's updates leave the annotations others set.
        let annotations = before
            .as_ref()
            .map(|b| b["metadata"]["annotations"].clone())
            .filter(|a| a.is_object())
            .unwrap_or_else(|| json!({}));
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let addresses: Vec<Value> = addresses
            .iter()
            .map(|(t, a)| json!({"type": t, "address": a}))
            .collect();
        let node = json!({
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": {},
            "status": {"addresses": addresses},
        });
        i.put(NODES, node);
        drop(i);
        self.shared.changed.notify_waiters();
    }

    /// Node `name` as stored.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.inner.lock().unwrap().obj(NODES, name).cloned()
    }

    /// Creates or replaces `obj` (its `metadata.name`, and `namespace` for
    /// a namespaced resource), as `kubectl apply` would; returns it as
    /// stored.
    pub fn put(&self, res: Res, obj: Value) -> Value {
        let stored = self.shared.inner.lock().unwrap().put(res, obj);
        self.shared.changed.notify_waiters();
        stored
    }

    /// `res`'s object `key` (`namespace/name` for a namespaced resource),
    /// as stored.
    pub fn objects(&self, res: Res, key: &str) -> Option<Value> {
        self.shared.inner.lock().unwrap().obj(res, key).cloned()
    }

    /// Deletes `res`'s object `name` (`namespace/name` for a namespaced
    /// resource).
    pub fn delete(&self, res: Res, name: &str) {
        self.shared.inner.lock().unwrap().remove(res, name);
        self.shared.changed.notify_waiters();
    }

    /// Sets annotation `key` of node `name` to `value` (as `kubectl
    /// annotate --overwrite` does).
    pub fn annotate_node(&self, name: &str, key: &str, value: &str) {
        let mut i = self.shared.inner.lock().unwrap();
        let mut node = i.obj(NODES, name).cloned().expect("the node exists");
        node["metadata"]["annotations"][key] = json!(value);
        i.put(NODES, node);
        drop(i);
        self.shared.changed.notify_waiters();
    }

    /// Deletes node `name`.
    pub fn delete_node(&self, name: &str) {
        let mut i = self.shared.inner.lock().unwrap();
        i.remove(NODES, name);
        drop(i);
        self.shared.changed.notify_waiters();
    }

    /// Forgets the history: a watch from an earlier version is now too old
    /// (etcd compacted, or the watch cache's window moved on).
    pub fn compact(&self) {
        let mut i = self.shared.inner.lock().unwrap();
        i.oldest = i.rv;
        i.history.clear();
    }

    /// Holds the garbage collector back (`true`: what it would delete
    /// stays, as while upstream's has yet to get to it), or lets it catch
    /// up.
    pub fn set_gc_lagging(&self, lagging: bool) {
        let mut i = self.shared.inner.lock().unwrap();
        i.gc_lagging = lagging;
        i.collect_garbage();
        drop(i);
        self.shared.changed.notify_waiters();
    }

    /// Takes the server down (its watches end, requests get 503) or up.
    pub fn set_down(&self, down: bool) {
        let mut i = self.shared.inner.lock().unwrap();
        i.down = down;
        i.epoch += 1;
        drop(i);
        self.shared.changed.notify_waiters();
    }

    /// The requests so far: "list" (a list from the start), "list
    /// continue" (a further page), "watch rv=N", or "denied …".
    pub fn requests(&self) -> Vec<String> {
        self.shared.inner.lock().unwrap().requests.clone()
    }

    /// Panics if a request was one the stand-in cannot answer as the API
    /// server would.
    pub fn assert_answered_as_upstream(&self) {
        let u = self.shared.inner.lock().unwrap().unsupported.clone();
        assert!(
            u.is_empty(),
            "requests the API server stand-in cannot answer as upstream would: {u:?}"
        );
    }

    /// Panics unless every request so far was a list, a watch, a patch
    /// of a node's status or a request on a lease (a node's claim of a
    /// slice), and each was allowed (the shipped RBAC granted what was
    /// asked) and answered as upstream would.
    pub fn assert_only_lists_watches_status_patches_and_leases(&self) {
        self.assert_answered_as_upstream();
        let r = self.requests();
        assert!(
            r.iter().all(|r| r.starts_with("list")
                || r.starts_with("watch")
                || r.starts_with("patch status ")
                || ["create", "get", "delete"]
                    .iter()
                    .any(|v| r.starts_with(&format!("{v} leases ")))),
            "{r:?}"
        );
    }

    /// `res`'s objects (of every namespace) as stored, by key.
    pub fn all(&self, res: Res) -> BTreeMap<String, Value> {
        self.shared.inner.lock().unwrap().objs(res)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        self.set_down(true);
        if !std::thread::panicking() {
            self.assert_answered_as_upstream();
        }
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    status_with(code, reason, message, json!({}))
}

/// A `Status` with its `metadata` (a `ListMeta`).
fn status_with(code: StatusCode, reason: &str, message: &str, metadata: Value) -> Response {
    let mut body = api_common::failure(code.as_u16(), reason, message);
    body["metadata"] = metadata;
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A label selector's requirements (equality-based and existence).
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    /// Not a label's: the object is of this namespace (a watch in a
    /// namespace).
    Namespace(String),
}

/// The requirements of `s`; `Err` for a set-based one (`in`, `notin`,
/// `gt`, `lt`), which the API server would answer and this stand-in does
/// not.
fn parse_selector(s: &str) -> Result<Vec<Req>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let r = if let Some((k, v)) = part.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if part.contains(' ') || part.contains('(') || part.contains(['<', '>']) {
            return Err(format!(
                "label selector {s:?}: set-based requirement {part:?}"
            ));
        } else if let Some(k) = part.strip_prefix('!') {
            Req::Absent(k.trim().into())
        } else {
            Req::Exists(part.into())
        };
        out.push(r);
    }
    Ok(out)
}

fn matches(sel: &[Req], obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    sel.iter().all(|r| match r {
        Req::Eq(k, v) => label(k) == Some(v.as_str()),
        Req::Ne(k, v) => label(k) != Some(v.as_str()),
        Req::Exists(k) => label(k).is_some(),
        Req::Absent(k) => label(k).is_none(),
        Req::Namespace(ns) => obj["metadata"]["namespace"].as_str() == Some(ns.as_str()),
    })
}

/// Whether the ClusterRoleBindings give `user` (in `groups`) `verb` on
/// `resource` (`nodes`, or a subresource: `nodes/status`) of object `name`
/// (`None` for a list or a watch).
fn allowed(
    rbac: &[Value],
    user: &str,
    groups: &[&str],
    verb: &str,
    (group, resource): (&str, &str),
    name: Option<&str>,
    namespace: Option<&str>,
) -> bool {
    api_common::allows(
        rbac,
        &api_common::Ask {
            user,
            groups,
            verb,
            group,
            resource,
            name,
            namespace,
        },
    )
}

/// Authenticates the bearer token of `headers` and authorizes `verb` on
/// `resource` (`nodes`, `nodes/status`) of object `name`, in `namespace`
/// for a namespaced request: the refusal upstream answers with (503 while
/// down, 401, 403), if it refuses.
fn authorize(
    shared: &Shared,
    headers: &HeaderMap,
    verb: &str,
    (group, resource): (&str, &str),
    name: Option<&str>,
    namespace: Option<&str>,
) -> Option<Response> {
    let token = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("");
    if shared.inner.lock().unwrap().down {
        return Some(status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ));
    }
    let sa = shared.inner.lock().unwrap().tokens.get(token).cloned();
    let Some((ns, account)) = sa else {
        shared
            .inner
            .lock()
            .unwrap()
            .requests
            .push(format!("unauthorized {verb}"));
        return Some(status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
        ));
    };
    let user = format!("system:serviceaccount:{ns}:{account}");
    let sa_group = format!("system:serviceaccounts:{ns}");
    let groups = [
        "system:serviceaccounts",
        sa_group.as_str(),
        "system:authenticated",
    ];
    if !allowed(
        &shared.rbac,
        &user,
        &groups,
        verb,
        (group, resource),
        name,
        namespace,
    ) {
        shared
            .inner
            .lock()
            .unwrap()
            .requests
            .push(format!("denied {verb} {resource}"));
        // `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`
        // `forbiddenMessage` (the resource with its subresource) inside
        // `NewForbidden`'s (the resource and the object's name).
        let plural = resource.split('/').next().unwrap_or(resource);
        let object = match (name, group) {
            (Some(n), "") => format!("{plural} \"{n}\""),
            (Some(n), g) => format!("{plural}.{g} \"{n}\""),
            (None, "") => plural.to_string(),
            (None, g) => format!("{plural}.{g}"),
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        return Some(status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!(
                "{object} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
            ),
        ));
    }
    None
}

/// `PATCH /api/v1/nodes/NAME/status` with a JSON merge patch.
async fn patch_status(
    State(shared): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = authorize(
        &shared,
        &headers,
        "patch",
        ("", "nodes/status"),
        Some(&name),
        None,
    ) {
        return r;
    }
    let kind = headers
        .get("content-type")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let mut i = shared.inner.lock().unwrap();
    if kind != "application/merge-patch+json" {
        return i.unsupported(format!("a node status patch of type {kind:?}"));
    }
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the patch is no JSON",
        );
    };
    let token = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("");
    let from = i.token_nodes.get(token).cloned().unwrap_or_default();
    i.requests.push(format!("patch status {name} from {from}"));
    let Some(before) = i.obj(NODES, &name).cloned() else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("nodes \"{name}\" not found"),
        );
    };
    let mut node = before.clone();
    json_patch::merge(&mut node, &patch);
    // The status strategy keeps the spec (and the object's identity).
    node["spec"] = before["spec"].clone();
    node["metadata"]["name"] = before["metadata"]["name"].clone();
    node["metadata"]["uid"] = before["metadata"]["uid"].clone();
    let mut node = i.put(NODES, node);
    drop(i);
    shared.changed.notify_waiters();
    node["kind"] = json!("Node");
    node["apiVersion"] = json!("v1");
    (StatusCode::OK, axum::Json(node)).into_response()
}

/// A list or a watch of `res` (every namespace's, for a namespaced one).
async fn collection(
    shared: State<Arc<Shared>>,
    headers: HeaderMap,
    q: Query<BTreeMap<String, String>>,
    res: Res,
) -> Response {
    collection_in(shared, headers, q, res, None).await
}

/// A list or a watch of `res`: of namespace `ns` where given (a namespaced
/// resource's URL in a namespace), else of all.
async fn collection_in(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
    res: Res,
    ns: Option<String>,
) -> Response {
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = if watch { "watch" } else { "list" };
    if let Some(r) = authorize(
        &shared,
        &headers,
        verb,
        (res.group, res.resource),
        None,
        ns.as_deref(),
    ) {
        return r;
    }
    let label_selector = q.get("labelSelector").map_or("", String::as_str);
    let sel = match parse_selector(label_selector) {
        Ok(s) => s,
        Err(e) => return shared.inner.lock().unwrap().unsupported(e),
    };
    if let Some(f) = q.get("fieldSelector").filter(|f| !f.is_empty()) {
        return shared
            .inner
            .lock()
            .unwrap()
            .unsupported(format!("field selector {f:?}"));
    }
    if !watch {
        return list(
            &mut shared.inner.lock().unwrap(),
            (res, ns.as_deref()),
            &q,
            &sel,
            label_selector.is_empty(),
        );
    }
    if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
        return shared
            .inner
            .lock()
            .unwrap()
            .unsupported("a watch with sendInitialEvents (streaming list)".into());
    }

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
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    // A watch in a namespace sees that namespace's objects alone.
    let sel = match ns {
        Some(ns) => {
            let mut sel = sel;
            sel.push(Req::Namespace(ns));
            sel
        }
        None => sel,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    let line = move |kind: &str, obj: &Value| {
        let mut obj = obj.clone();
        if kind != "ERROR" {
            obj["kind"] = json!(res.kind);
            obj["apiVersion"] = json!(res.api_version);
        }
        let mut l = json!({"type": kind, "object": obj}).to_string();
        l.push('\n');
        Ok(Bytes::from(l))
    };
    {
        let mut i = shared.inner.lock().unwrap();
        i.requests.push(res.log(&format!("watch rv={from}")));
        if from != 0 && from < i.oldest {
            let e = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure",
                "message": format!("too old resource version: {from} ({})", i.oldest),
                "reason": "Expired", "code": 410,
            });
            let _ = tx.try_send(line("ERROR", &e));
            drop(tx);
            return stream_response(rx);
        }
    }
    let shared2 = shared.clone();
    tokio::spawn(async move {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let (mut seen, epoch) = {
            let i = shared2.inner.lock().unwrap();
            if from == 0 {
                for n in i.objs(res).values().filter(|n| matches(&sel, n)) {
                    if tx.try_send(line("ADDED", n)).is_err() {
                        return;
                    }
                }
                (i.rv, i.epoch)
            } else {
                (from, i.epoch)
            }
        };
        loop {
            let notified = shared2.changed.notified();
            let events: Vec<Result<Bytes, Infallible>> = {
                let i = shared2.inner.lock().unwrap();
                if i.epoch != epoch {
                    return;
                }
                let mut out = Vec::new();
                let after = seen;
                for c in i.history.iter().filter(|c| c.rv > after) {
                    if c.res != res {
                        seen = c.rv;
                        continue;
                    }
                    let now = c.now.as_ref().filter(|n| matches(&sel, n));
                    let before = c.before.as_ref().filter(|n| matches(&sel, n));
                    match (now, before) {
                        (Some(n), None) => out.push(line("ADDED", n)),
                        (Some(n), Some(_)) => out.push(line("MODIFIED", n)),
                        (None, Some(b)) => {
                            // The previous content, at the change's version.
                            let mut b = b.clone();
                            b["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                            out.push(line("DELETED", &b));
                        }
                        (None, None) => {}
                    }
                    seen = c.rv;
                }
                out
            };
            for e in events {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            match deadline {
                Some(d) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(d) => return,
                        _ = tx.closed() => return,
                    }
                }
                None => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tx.closed() => return,
                    }
                }
            }
        }
    });
    stream_response(rx)
}

/// `pkg/storage/continue.go` `EncodeContinue`: base64url (no padding) of
/// `{"v":"meta.k8s.io/v1","rv":…,"start":…}`, the start key without the
/// resource's prefix (`/registry/minions/`).
fn encode_continue(start: &str, rv: i64) -> String {
    use base64::Engine;
    // Go's json.Marshal of `continueToken`: its fields in order.
    let token = format!(
        r#"{{"v":"meta.k8s.io/v1","rv":{rv},"start":{}}}"#,
        Value::from(start)
    );
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
}

/// `pkg/storage/continue.go` `DecodeContinue`: the start key and the
/// resource version, or the error's text.
fn decode_continue(token: &str) -> Result<(String, i64), String> {
    use base64::Engine;
    const INVALID: &str = "continue key is not valid";
    let data = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| format!("{INVALID}: {e}"))?;
    let c: Value = serde_json::from_slice(&data).map_err(|e| format!("{INVALID}: {e}"))?;
    let field = |k: &str| c.get(k).filter(|v| !v.is_null());
    let v = field("v").map_or(Some(""), Value::as_str);
    let rv = field("rv").map_or(Some(0), Value::as_i64);
    let start = field("start").map_or(Some(""), Value::as_str);
    let (Some(v), Some(rv), Some(start)) = (v, rv, start) else {
        return Err(format!("{INVALID}: json: cannot unmarshal"));
    };
    if v != "meta.k8s.io/v1" {
        return Err(format!(
            "{INVALID}: server does not recognize this encoded version {v}"
        ));
    }
    if rv == 0 {
        return Err(format!(
            "{INVALID}: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        ));
    }
    if start.is_empty() {
        return Err(format!(
            "{INVALID}: encoded start key empty (version meta.k8s.io/v1)"
        ));
    }
    // path.Clean must leave "/" + start as it is: no climbing out of the
    // resource's prefix.
    let key = if start.starts_with('/') {
        start.to_string()
    } else {
        format!("/{start}")
    };
    let clean = !key.contains("//")
        && !key.split('/').skip(1).any(|c| c == "." || c == "..")
        && (key == "/" || !key.ends_with('/'));
    if !clean {
        return Err(format!("{INVALID}: {start}"));
    }
    Ok((key[1..].to_string(), rv))
}

/// A list, as the API server answers one for a resource in its watch cache
/// (kubernetes/kubernetes `staging/src/k8s.io/apiserver`, v1.35):
///
/// - validation (`pkg/storage/interfaces.go` `ValidateListOptions`): a
///   `continue` token that does not decode is a 400 "invalid continue
///   token: …", and one with a `resourceVersion` other than `"0"` a 400
///   "specifying resource version is not allowed when using continue";
/// - which version (`pkg/storage/cacher/delegator/interface.go`
///   `ShouldDelegateList`, `cacher.go`): no `resourceVersion` is a
///   consistent read, at the newest version; `"0"`, or `N` with
///   `resourceVersionMatch=NotOlderThan` (or without a `limit`), the cache
///   as it is (at least `N`); `N` with a `limit` (or
///   `resourceVersionMatch=Exact`) exactly `N`; a continue token its own
///   version (`-1`: the newest). A version no longer kept is etcd's
///   compaction error (`pkg/storage/etcd3/errors.go` `interpretListError`):
///   410 `Expired` "The resourceVersion for the provided list is too old.",
///   or, for a continue token, the `inconsistentContinue` message with a
///   token to go on at the newest version in the Status's
///   `metadata.continue`;
/// - paging (`cacher.go` `GetList`, `computeListLimit`,
///   `pkg/storage/continue.go` `PrepareContinueToken`): a `limit` above 0
///   (ignored with `resourceVersion=0`) ends the page at that many matching
///   items; when any item, matching or not, follows, `metadata.continue`
///   names the last one's key + "\0" at the list's version, and, without a
///   selector, `remainingItemCount` is the items from the page's start
///   less the limit.
fn list(
    i: &mut Inner,
    (res, ns): (Res, Option<&str>),
    q: &BTreeMap<String, String>,
    sel: &[Req],
    no_selector: bool,
) -> Response {
    let get = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    let (rv, rv_match, cont) = (
        get("resourceVersion"),
        get("resourceVersionMatch"),
        get("continue"),
    );
    let what = res.log(if cont.is_empty() {
        "list"
    } else {
        "list continue"
    });
    i.requests.push(what);
    let limit: i64 = match get("limit") {
        "" => 0,
        l => match l.parse() {
            Ok(n) => n,
            Err(_) => return i.unsupported(format!("limit={l:?}")),
        },
    };
    let bad = |m: String| status(StatusCode::BAD_REQUEST, "BadRequest", &m);
    let gone = |m: &str, meta: Value| status_with(StatusCode::GONE, "Expired", m, meta);
    // (the version listed at, the first key, the limit in force)
    let (at, from, limit) = if !cont.is_empty() {
        let (start, crv) = match decode_continue(cont) {
            Ok(c) => c,
            Err(e) => return bad(format!("invalid continue token: {e}")),
        };
        if !rv.is_empty() && rv != "0" {
            return bad("specifying resource version is not allowed when using continue".into());
        }
        if !rv_match.is_empty() {
            return i.unsupported(format!("continue with resourceVersionMatch={rv_match}"));
        }
        if crv > 0 && (crv as u64) < i.oldest {
            return gone(
                "The provided continue parameter is too old to display a consistent list \
                 result. You can start a new list without the continue parameter, or use the \
                 continue token in this response to retrieve the remainder of the results. \
                 Continuing with the provided token results in an inconsistent list - objects \
                 that were created, modified, or deleted between the time the first chunk was \
                 returned and now may show up in the list.",
                json!({"continue": encode_continue(&start, -1)}),
            );
        }
        if crv > 0 && crv as u64 > i.rv {
            return i.unsupported(format!(
                "continue at {crv}, newer than the store's {}",
                i.rv
            ));
        }
        let at = if crv > 0 { crv as u64 } else { i.rv };
        (at, start, limit)
    } else {
        match (rv, rv_match) {
            ("", "") => (i.rv, String::new(), limit),
            ("0", "" | "NotOlderThan") => (i.rv, String::new(), 0),
            (n, m) => {
                let Ok(n) = n.parse::<u64>() else {
                    return i
                        .unsupported(format!("resourceVersion={n:?} resourceVersionMatch={m:?}"));
                };
                let exact = match m {
                    "" => limit > 0,
                    "Exact" => true,
                    "NotOlderThan" => false,
                    _ => return i.unsupported(format!("resourceVersionMatch={m:?}")),
                };
                if n > i.rv || n == 0 {
                    // The cache waits to catch up, then "Too large
                    // resource version"; or a validation error.
                    return i.unsupported(format!(
                        "resourceVersion={n} resourceVersionMatch={m:?} (the store is at {})",
                        i.rv
                    ));
                }
                if exact && n < i.oldest {
                    return gone(
                        "The resourceVersion for the provided list is too old.",
                        json!({}),
                    );
                }
                (if exact { n } else { i.rv }, String::new(), limit)
            }
        }
    };
    let mut nodes = if at == i.rv {
        i.objs(res)
    } else {
        i.objects_at(res, at)
    };
    // In a namespace: its objects, keyed (as the continue token's start)
    // below the namespace's prefix (`/registry/leases/NS/`).
    if let Some(ns) = ns {
        let prefix = format!("{ns}/");
        nodes = nodes
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v)))
            .collect();
    }
    let range: Vec<(&String, &Value)> = nodes.range(from..).collect();
    let mut items = Vec::new();
    let mut last = None;
    let mut more = false;
    for (k, (name, n)) in range.iter().enumerate() {
        if matches(sel, n) {
            items.push((*n).clone());
            last = Some(name.as_str());
        }
        if limit > 0 && items.len() as i64 >= limit {
            more = k < range.len() - 1;
            break;
        }
    }
    let mut metadata = json!({"resourceVersion": at.to_string()});
    if more {
        metadata["continue"] = encode_continue(&format!("{}\0", last.unwrap()), at as i64).into();
        if no_selector {
            metadata["remainingItemCount"] = json!(range.len() as i64 - limit);
        }
    }
    let body = json!({
        "kind": format!("{}List", res.kind),
        "apiVersion": res.api_version,
        "metadata": metadata,
        "items": items,
    });
    ([("content-type", "application/json")], body.to_string()).into_response()
}

fn stream_response(rx: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([("content-type", "application/json")], body).into_response()
}

/// The `Status` of a request on one object that failed (`apimachinery/pkg/api/errors`
/// `NewNotFound`, `NewAlreadyExists`, `NewConflict`): with `details`
/// naming the object.
fn object_status(code: StatusCode, reason: &str, message: &str, res: Res, name: &str) -> Response {
    let details = json!({"name": name, "group": res.group, "kind": res.resource});
    status_details(code, reason, message, details)
}

/// A `Status` of failure with its `details`.
fn status_details(code: StatusCode, reason: &str, message: &str, details: Value) -> Response {
    let mut body = api_common::failure(code.as_u16(), reason, message);
    body["details"] = details;
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `NewNotFound` of `res`'s object `name`.
fn not_found(res: Res, name: &str) -> Response {
    object_status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{} \"{name}\" not found", res.qualified()),
        res,
        name,
    )
}

/// `obj` as the API server answers it: with its `kind` and `apiVersion`.
fn typed(res: Res, mut obj: Value) -> Value {
    obj["kind"] = json!(res.kind);
    obj["apiVersion"] = json!(res.api_version);
    obj
}

/// `POST` of a namespaced `res` in namespace `ns` (`endpoints/handlers/create.go`,
/// `registry/generic/registry/store.go` `Create`, `registry/rest/create.go`
/// `BeforeCreate`): the object's namespace is the URL's (another is a 400);
/// a name that is taken is a 409 `AlreadyExists`; else it is stored with
/// a UID and a resource version of its own and answered 201. What the
/// stand-in does not model (a dry run, `generateName`, a resource version
/// or an incomplete owner reference in the body) is unsupported.
async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
    body: Bytes,
    res: Res,
    ns: String,
) -> Response {
    if let Some(r) = authorize(
        &shared,
        &headers,
        "create",
        (res.group, res.resource),
        None,
        Some(&ns),
    ) {
        return r;
    }
    let mut i = shared.inner.lock().unwrap();
    if q.contains_key("dryRun") {
        return i.unsupported(format!("a create of {} with dryRun", res.resource));
    }
    let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is no JSON object",
        );
    };
    if obj["kind"] != res.kind || obj["apiVersion"] != res.api_version {
        return i.unsupported(format!(
            "a create of {} with kind {} and apiVersion {}",
            res.resource, obj["kind"], obj["apiVersion"]
        ));
    }
    match obj["metadata"]["namespace"].as_str() {
        None | Some("") => obj["metadata"]["namespace"] = json!(ns),
        Some(n) if n == ns => {}
        Some(_) => return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        ),
    }
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        return i.unsupported(format!("a create of {} without a name", res.resource));
    }
    if obj["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|v| !v.is_empty())
    {
        return i.unsupported(format!(
            "a create of {} with a resourceVersion",
            res.resource
        ));
    }
    let refs = obj["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if refs.iter().any(|r| {
        ["apiVersion", "kind", "name", "uid"]
            .iter()
            .any(|k| r[*k].as_str().is_none_or(str::is_empty))
    }) {
        return i.unsupported(format!("an incomplete owner reference: {refs:?}"));
    }
    i.requests.push(format!("create {} {name}", res.resource));
    // `apimachinery/pkg/api/validation/objectmeta.go` `ValidateObjectMeta`:
    // the name a DNS-1123 subdomain, label values valid
    // (`util/validation/validation.go`); refused 422 `Invalid`
    // (`NewInvalid` on the kind).
    let subdomain = name.len() <= 253
        && name.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        });
    let mut causes = Vec::new();
    if !subdomain {
        causes.push((
            "metadata.name".to_string(),
            format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ),
        ));
    }
    for v in obj["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, v)| v)
    {
        let v = v.as_str().unwrap_or_default();
        let ok = v.is_empty()
            || (v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && v.as_bytes()[0].is_ascii_alphanumeric()
                && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric());
        if !ok {
            causes.push((
                "metadata.labels".to_string(),
                format!(
                    "Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
                ),
            ));
        }
    }
    if !causes.is_empty() {
        let list: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let text = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        return status_details(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            &format!("{}.{} \"{name}\" is invalid: {text}", res.kind, res.group),
            json!({
                "name": name, "group": res.group, "kind": res.kind,
                "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
            }),
        );
    }
    let key = format!("{ns}/{name}");
    if i.obj(res, &key).is_some() {
        return object_status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", res.qualified()),
            res,
            &name,
        );
    }
    obj["metadata"].as_object_mut().map(|m| m.remove("uid"));
    let stored = i.put(res, obj);
    // The garbage collector sees it (an owner that is gone: deleted).
    i.collect_garbage();
    drop(i);
    shared.changed.notify_waiters();
    (StatusCode::CREATED, axum::Json(typed(res, stored))).into_response()
}

/// `GET` of one object of a namespaced `res`: 200 with it, or 404.
async fn get_one(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    res: Res,
    ns: String,
    name: String,
) -> Response {
    if let Some(r) = authorize(
        &shared,
        &headers,
        "get",
        (res.group, res.resource),
        Some(&name),
        Some(&ns),
    ) {
        return r;
    }
    let mut i = shared.inner.lock().unwrap();
    i.requests.push(format!("get {} {name}", res.resource));
    match i.obj(res, &format!("{ns}/{name}")) {
        Some(o) => (StatusCode::OK, axum::Json(typed(res, o.clone()))).into_response(),
        None => not_found(res, &name),
    }
}

/// `DELETE` of one object of a namespaced `res` (`endpoints/handlers/delete.go`,
/// `registry/generic/registry/store.go` `Delete`): a missing object is a
/// 404; the `DeleteOptions` body's `preconditions` (UID, resource
/// version) that do not hold are a 409 `Conflict` (`registry/rest/delete.go`
/// `BeforeDelete`); else it is
/// deleted at once (no finalizers: a lease has none), its dependents in
/// the background, and answered 200 with a `Status` of success, as the
/// store answers for a resource that does not return the deleted object.
async fn delete_one(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
    res: Res,
    ns: String,
    name: String,
) -> Response {
    if let Some(r) = authorize(
        &shared,
        &headers,
        "delete",
        (res.group, res.resource),
        Some(&name),
        Some(&ns),
    ) {
        return r;
    }
    let mut i = shared.inner.lock().unwrap();
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the body is no JSON object",
                )
            }
        }
    };
    if !opts["dryRun"].is_null()
        || opts["propagationPolicy"]
            .as_str()
            .is_some_and(|p| p != "Background")
        || opts["orphanDependents"].as_bool() == Some(true)
    {
        return i.unsupported(format!("a delete of {} with {opts}", res.resource));
    }
    i.requests.push(format!("delete {} {name}", res.resource));
    let key = format!("{ns}/{name}");
    let Some(obj) = i.obj(res, &key).cloned() else {
        return not_found(res, &name);
    };
    // `registry/rest/delete.go` `BeforeDelete` checks the preconditions
    // first: a `Conflict` on the kind (`schema.GroupResource{Group:
    // gvk.Group, Resource: gvk.Kind}`), worded per field.
    let pre = &opts["preconditions"];
    let conflict = |field: &str, want: &str, has: &str| {
        let why = match field {
            "uid" => format!(
                "the UID in the precondition ({want}) does not match the UID in record ({has}). The object might have been deleted and then recreated"
            ),
            _ => format!(
                "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({has}). The object might have been modified"
            ),
        };
        status_details(
            StatusCode::CONFLICT,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {}.{} \"{name}\": {why}",
                res.kind, res.group
            ),
            json!({"name": name, "group": res.group, "kind": res.kind}),
        )
    };
    for field in ["uid", "resourceVersion"] {
        if let Some(want) = pre[field].as_str() {
            let has = obj["metadata"][field].as_str().unwrap_or_default();
            if want != has {
                return conflict(field, want, has);
            }
        }
    }
    i.remove(res, &key);
    drop(i);
    shared.changed.notify_waiters();
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": name, "group": res.group, "kind": res.resource, "uid": obj["metadata"]["uid"]},
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}
