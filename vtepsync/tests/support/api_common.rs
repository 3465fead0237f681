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
}

/// Whether the ClusterRoleBindings among `objects` bind the user (or one
/// of its groups) to a ClusterRole among them with a rule for the request
/// (`plugin/pkg/auth/authorizer/rbac/rbac.go` `RuleAllows`: `*` matches
/// any verb, group or resource; a rule with `resourceNames` allows only
/// requests on those objects, never a list or a watch:
/// `ResourceNameMatches`).
pub fn allows(objects: &[Value], ask: &Ask) -> bool {
    let items = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let has = |v: &Value, want: &str| {
        items(v)
            .iter()
            .any(|x| x.as_str() == Some(want) || x.as_str() == Some("*"))
    };
    let subject = |s: &Value| match s["kind"].as_str() {
        Some("ServiceAccount") => {
            format!(
                "system:serviceaccount:{}:{}",
                s["namespace"].as_str().unwrap_or(""),
                s["name"].as_str().unwrap_or("")
            ) == ask.user
        }
        Some("User") => s["name"].as_str() == Some(ask.user),
        Some("Group") => ask.groups.iter().any(|g| Some(*g) == s["name"].as_str()),
        _ => false,
    };
    objects
        .iter()
        .filter(|b| b["kind"] == "ClusterRoleBinding")
        .filter(|b| items(&b["subjects"]).iter().any(subject))
        .filter(|b| b["roleRef"]["kind"] == "ClusterRole")
        .filter_map(|b| {
            objects.iter().find(|r| {
                r["kind"] == "ClusterRole" && r["metadata"]["name"] == b["roleRef"]["name"]
            })
        })
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
