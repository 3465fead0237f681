//! The pod annotations `k8s.v1.cni.cncf.io/networks` and
//! `v1.multus-cni.io/default-network`, parsed as Multus parses them
//! (`pkg/k8sclient/k8sclient.go` `parsePodNetworkAnnotation`,
//! `parsePodNetworkObjectName`): a JSON list of network selection elements
//! when the text holds any of `[`, `{` or `"`, else a comma-separated list
//! of `[namespace/]name[@interface]`, whose namespace and name must be
//! DNS-1123 labels in form (`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, no length
//! limit) and whose interface name at most 15 bytes without whitespace or
//! `/` (the JSON form's interface is not checked).

use serde::Deserialize;

/// The annotation naming a pod's networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

/// The annotation naming the network that replaces the pod's cluster
/// network (Multus `tryLoadK8sPodDefaultNetwork`: one network, its
/// namespace Multus's own when it names none).
pub const DEFAULT_NETWORK_ANNOTATION: &str = "v1.multus-cni.io/default-network";

/// One network the pod asks for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Selection {
    /// NetworkAttachmentDefinition name.
    pub name: String,
    /// Its namespace (the pod's when absent).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Requested interface name.
    #[serde(default)]
    pub interface: Option<String>,
}

/// A malformed annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {NETWORKS_ANNOTATION}: {0}")]
pub struct SelectionError(String);

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, as Multus matches a namespace and a
/// name (no length limit: the API server's own limits apply elsewhere).
fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// An interface name Multus takes: at most `IFNAMSIZ - 1` (15) bytes, and
/// none of `" \t\n\v\f\r/"`.
fn interface_name(s: &str) -> bool {
    s.len() <= 15 && !s.contains([' ', '\t', '\n', '\x0b', '\x0c', '\r', '/'])
}

/// The networks of `text`, each with its namespace filled in
/// (`default_ns` when the selection names none).
pub fn parse(text: &str, default_ns: &str) -> Result<Vec<Selection>, SelectionError> {
    let mut out: Vec<Selection> = if text.contains(['[', '{', '"']) {
        serde_json::from_str(text)
            .map_err(|e| SelectionError(format!("not a JSON list of networks: {e}")))?
    } else {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(parse_item)
            .collect::<Result<_, _>>()?
    };
    for s in &mut out {
        if s.name.is_empty() {
            return Err(SelectionError("a network without a name".into()));
        }
        if s.namespace.as_deref().is_none_or(str::is_empty) {
            s.namespace = Some(default_ns.to_string());
        }
    }
    Ok(out)
}

fn parse_item(item: &str) -> Result<Selection, SelectionError> {
    let (ns, rest) = match item.split('/').collect::<Vec<_>>()[..] {
        [name] => (None, name),
        [ns, name] => (Some(ns.trim()), name),
        _ => return Err(SelectionError(format!("{item:?}: more than one '/'"))),
    };
    let (name, ifname) = match rest.split('@').collect::<Vec<_>>()[..] {
        [name] => (name.trim(), None),
        [name, ifname] => (name.trim(), Some(ifname.trim())),
        _ => return Err(SelectionError(format!("{item:?}: more than one '@'"))),
    };
    for part in [ns, Some(name)].into_iter().flatten() {
        if !part.is_empty() && !dns_label(part) {
            return Err(SelectionError(format!(
                "{item:?}: {part:?} is not a DNS-1123 label (lower-case letters, digits, '-')"
            )));
        }
    }
    let ifname = ifname.filter(|i| !i.is_empty());
    if let Some(i) = ifname {
        if !interface_name(i) {
            return Err(SelectionError(format!(
                "{item:?}: interface name {i:?} must be at most 15 bytes, without '/' or whitespace"
            )));
        }
    }
    Ok(Selection {
        name: name.to_string(),
        namespace: ns.filter(|n| !n.is_empty()).map(str::to_string),
        interface: ifname.map(str::to_string),
    })
}

/// The network of the default-network annotation `text`, its namespace
/// `multus_ns` when it names none; one only.
pub fn parse_default(text: &str, multus_ns: &str) -> Result<Selection, SelectionError> {
    let mut nets = parse(text, multus_ns).map_err(|SelectionError(e)| {
        SelectionError(format!("{DEFAULT_NETWORK_ANNOTATION}: {e}"))
    })?;
    match nets.len() {
        1 => Ok(nets.remove(0)),
        0 => Err(SelectionError(format!(
            "{DEFAULT_NETWORK_ANNOTATION}: no network"
        ))),
        _ => Err(SelectionError(format!(
            "{DEFAULT_NETWORK_ANNOTATION}: more than one default network is specified: {text}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(ns: &str, name: &str, ifname: Option<&str>) -> Selection {
        Selection {
            name: name.into(),
            namespace: Some(ns.into()),
            interface: ifname.map(str::to_string),
        }
    }

    #[test]
    fn both_forms_as_multus_reads_them() {
        assert_eq!(
            parse("net1, ns2/net2@eth3 ,net1", "pods").unwrap(),
            [
                sel("pods", "net1", None),
                sel("ns2", "net2", Some("eth3")),
                sel("pods", "net1", None)
            ]
        );
        assert_eq!(
            parse(
                r#"[{"name":"net1"},{"name":"net2","namespace":"ns2","interface":"eth3","mac":"02:00:00:00:00:01"}]"#,
                "pods"
            )
            .unwrap(),
            [sel("pods", "net1", None), sel("ns2", "net2", Some("eth3"))]
        );
        assert!(parse("a/b/c", "p").is_err());
        assert!(parse("Net1", "p").is_err());
        assert!(parse("n@a@b", "p").is_err());
        assert!(parse(r#"[{"namespace":"x"}]"#, "p").is_err());
        assert!(parse("[", "p").is_err());
        assert_eq!(parse(" ", "p").unwrap(), []);
    }

    /// The interface names of the comma form, as Multus's
    /// `parsePodNetworkObjectName` takes and refuses them.
    #[test]
    fn interface_names_as_multus_takes_them() {
        for ok in ["eth1", "net_1", "eth1.100", "Net1", "a", "fifteen-chars15"].iter() {
            let got = parse(&format!("net@{ok}"), "p").unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(got[0].interface.as_deref(), Some(*ok));
        }
        for bad in ["sixteen-chars-16", "a/b", "a\tb", "a\x0bb"] {
            assert!(parse(&format!("net@{bad}"), "p").is_err(), "{bad:?}");
        }
        // Whitespace around it is trimmed, and nothing after '@' is none.
        assert_eq!(
            parse("net@ eth1 ", "p").unwrap()[0].interface.as_deref(),
            Some("eth1")
        );
        assert_eq!(parse("net@", "p").unwrap()[0].interface, None);
        // Long names and namespaces pass (no DNS label length here).
        let long = "n".repeat(80);
        assert!(parse(&format!("{long}/{long}"), "p").is_ok());
        assert!(parse("net.v2", "p").is_err());
        assert!(parse("-net", "p").is_err());
        // The JSON form's interface is not checked (Multus does not).
        assert!(parse(r#"[{"name":"n","interface":"a very long name"}]"#, "p").is_ok());
    }

    #[test]
    fn the_default_network_is_one_in_multus_namespace() {
        assert_eq!(
            parse_default("sriov-net", "kube-system").unwrap(),
            sel("kube-system", "sriov-net", None)
        );
        assert_eq!(
            parse_default("ns1/net", "kube-system").unwrap(),
            sel("ns1", "net", None)
        );
        assert!(parse_default("a,b", "kube-system")
            .unwrap_err()
            .to_string()
            .contains("more than one"));
    }
}
