//! The pod annotation `k8s.v1.cni.cncf.io/networks`, parsed as Multus and
//! the network-attachment-definition client parse it: a JSON list of
//! network selection elements when the text holds any of `[`, `{` or `"`,
//! else a comma-separated list of `[namespace/]name[@interface]`.

use serde::Deserialize;

/// The annotation naming a pod's networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

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

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
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
    for part in [ns, Some(name), ifname].into_iter().flatten() {
        if !dns_label(part) {
            return Err(SelectionError(format!(
                "{item:?}: {part:?} is not a DNS-1123 label (lower-case letters, digits, '-')"
            )));
        }
    }
    Ok(Selection {
        name: name.to_string(),
        namespace: ns.map(str::to_string),
        interface: ifname.map(str::to_string),
    })
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
}
