//! What the tests' API server stand-ins share (`api_server.rs` here,
//! `webhook/tests/support/cluster_api.rs`; the webhook's NAD server in
//! `webhook/tests/webhook_e2e.rs` takes the serving only): HTTPS serving, RBAC's
//! authorization over ClusterRoles and ClusterRoleBindings, and the
//! `Status` object errors are answered with.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::Path;

use serde_json::{json, Value};

/// Serves `router` over HTTPS on `listener`, with the certificate and key
/// in `dir` (`tls.crt`, `tls.key`), on `rt`: the handle that shuts it
/// down.
pub fn serve_https(
    rt: &tokio::runtime::Runtime,
    listener: TcpListener,
    dir: &Path,
    router: axum::Router,
) -> axum_server::Handle<SocketAddr> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = rt
        .block_on(axum_server::tls_rustls::RustlsConfig::from_pem_file(
            dir.join("tls.crt"),
            dir.join("tls.key"),
        ))
        .unwrap();
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    rt.spawn(async move {
        axum_server::from_tcp_rustls(listener, config)
            .unwrap()
            .handle(h)
            .serve(router.into_make_service())
            .await
            .unwrap();
    });
    handle
}

/// A request to authorize.
pub struct Ask<'a> {
    /// The user (`system:serviceaccount:NS:NAME` for a service account).
    pub user: &'a str,
    /// The user's groups.
    pub groups: &'a [&'a str],
    /// `get`, `list`, `watch`, `create`, `patch`, `delete`, ...
    pub verb: &'a str,
    /// The API group (`""` for the core group).
    pub group: &'a str,
    /// The resource, with its subresource (`nodes/status`).
    pub resource: &'a str,
    /// The object's name (`None` for a list or a watch).
    pub name: Option<&'a str>,
    /// The namespace of a namespaced request (`None`: at the cluster
    /// scope).
    pub namespace: Option<&'a str>,
}

/// Whether the RBAC objects among `objects` give the request a rule, as
/// `pkg/registry/rbac/validation/rule.go` `VisitRulesFor` gathers them:
/// the ClusterRoles bound to the user (or one of its groups) by
/// ClusterRoleBindings, and, for a request in a namespace, the Roles of
/// that namespace and the ClusterRoles bound by its RoleBindings (a
/// ServiceAccount subject without a namespace is the binding's:
/// `appliesToUser`). A rule allows as `plugin/pkg/auth/authorizer/rbac/rbac.go`
/// `RuleAllows` says: `*` matches any verb, group or resource; a rule with
/// `resourceNames` allows only requests on those objects, never a list or
/// a watch (`ResourceNameMatches`).
pub fn allows(objects: &[Value], ask: &Ask) -> bool {
    let items = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let has = |v: &Value, want: &str| {
        items(v)
            .iter()
            .any(|x| x.as_str() == Some(want) || x.as_str() == Some("*"))
    };
    let subject = |s: &Value, binding_ns: &str| match s["kind"].as_str() {
        Some("ServiceAccount") => {
            let ns = s["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            format!(
                "system:serviceaccount:{ns}:{}",
                s["name"].as_str().unwrap_or("")
            ) == ask.user
        }
        Some("User") => s["name"].as_str() == Some(ask.user),
        Some("Group") => ask.groups.iter().any(|g| Some(*g) == s["name"].as_str()),
        _ => false,
    };
    let named = |kind: &str, name: &Value, ns: Option<&str>| {
        objects.iter().find(move |r| {
            r["kind"] == kind
                && r["metadata"]["name"] == *name
                && ns.is_none_or(|ns| r["metadata"]["namespace"] == ns)
        })
    };
    let cluster = objects
        .iter()
        .filter(|b| b["kind"] == "ClusterRoleBinding")
        .filter(|b| items(&b["subjects"]).iter().any(|s| subject(s, "")))
        .filter(|b| b["roleRef"]["kind"] == "ClusterRole")
        .filter_map(|b| named("ClusterRole", &b["roleRef"]["name"], None));
    let namespaced = objects
        .iter()
        .filter(|b| b["kind"] == "RoleBinding")
        .filter(|b| ask.namespace.is_some() && b["metadata"]["namespace"].as_str() == ask.namespace)
        .filter(|b| {
            items(&b["subjects"])
                .iter()
                .any(|s| subject(s, ask.namespace.unwrap_or("")))
        })
        .filter_map(|b| match b["roleRef"]["kind"].as_str() {
            Some("ClusterRole") => named("ClusterRole", &b["roleRef"]["name"], None),
            Some("Role") => named("Role", &b["roleRef"]["name"], ask.namespace),
            _ => None,
        });
    cluster
        .chain(namespaced)
        .flat_map(|r| items(&r["rules"]))
        .any(|rule| {
            has(&rule["verbs"], ask.verb)
                && has(&rule["apiGroups"], ask.group)
                && has(&rule["resources"], ask.resource)
                && (items(&rule["resourceNames"]).is_empty()
                    || ask.name.is_some_and(|n| has(&rule["resourceNames"], n)))
        })
}

/// A `Status` of failure (`apimachinery/pkg/apis/meta/v1` `Status`), as
/// the API server answers errors: add `details` or `metadata` as the error
/// has them.
pub fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason,
        "code": code,
    })
}
