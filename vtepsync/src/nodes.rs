//! The cluster's nodes as remote VTEPs. A node's VTEP address is, in
//! order (as flannel's kube subnet manager, `pkg/subnet/kube/kube.go`,
//! publishes `flannel.alpha.coreos.com/public-ip` and takes
//! `public-ip-overwrite` from the operator):
//!
//! - the address its own vtep-sync published in [`VTEP_ANNOTATION`]: the
//!   one its tunnels leave from, so the one its peers must expect;
//! - else the operator's [`VTEP_OVERWRITE_ANNOTATION`] (a node with several
//!   addresses whose tunnels must use another than the one its status
//!   lists first);
//! - else its address of a type (`status.addresses`), in one address
//!   family for the whole cluster (as flannel fixes it cluster-wide):
//!   every node must pick its peers' addresses in the family its peers
//!   pick its own in, or tunnels go one way (a receiver keys them by
//!   source address and VNI).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

/// Which of a node's `status.addresses` is its VTEP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressType {
    /// `InternalIP`: the address nodes reach each other on (the kubelet's
    /// `--node-ip`, or the cloud's private address).
    InternalIp,
    /// `ExternalIP`: for nodes that reach each other only by their public
    /// addresses.
    ExternalIp,
}

impl AddressType {
    /// The address type's name in `status.addresses[].type`.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressType::InternalIp => "InternalIP",
            AddressType::ExternalIp => "ExternalIP",
        }
    }
}

impl std::str::FromStr for AddressType {
    type Err = String;
    fn from_str(s: &str) -> Result<AddressType, String> {
        match s {
            "InternalIP" => Ok(AddressType::InternalIp),
            "ExternalIP" => Ok(AddressType::ExternalIp),
            _ => Err(format!("{s:?}: not InternalIP or ExternalIP")),
        }
    }
}

/// Which family of a node's addresses is its VTEP, the same on every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddressFamily {
    /// IPv4 where a node has an IPv4 address, else IPv6: on a dual-stack
    /// cluster every node's IPv4 address, whatever order its status lists
    /// them in; on an IPv6-only one, IPv6.
    #[default]
    PreferIpv4,
    /// IPv4 only.
    Ipv4,
    /// IPv6 only.
    Ipv6,
}

impl AddressFamily {
    /// The VTEP among a node's addresses (in the order its status lists
    /// them).
    pub fn pick(self, addrs: &[IpAddr]) -> Option<IpAddr> {
        let first = |v4: bool| addrs.iter().copied().find(|a| a.is_ipv4() == v4);
        match self {
            AddressFamily::PreferIpv4 => first(true).or_else(|| first(false)),
            AddressFamily::Ipv4 => first(true),
            AddressFamily::Ipv6 => first(false),
        }
    }
}

impl std::str::FromStr for AddressFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<AddressFamily, String> {
        match s {
            "prefer-ipv4" => Ok(AddressFamily::PreferIpv4),
            "ipv4" => Ok(AddressFamily::Ipv4),
            "ipv6" => Ok(AddressFamily::Ipv6),
            _ => Err(format!("{s:?}: not prefer-ipv4, ipv4 or ipv6")),
        }
    }
}

/// A node's addresses of type `kind`, in the order its status lists them
/// (a dual-stack node has one of each family). Entries that are not IP
/// addresses are passed over.
pub fn addresses(node: &Node, kind: AddressType) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == kind.as_str())
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// The annotation in which a node's vtep-sync publishes the node's VTEP
/// address: the address its tunnels leave from.
pub const VTEP_ANNOTATION: &str = "switchyard.io/vtep-address";

/// The annotation an operator sets on a node whose VTEP is not its
/// address of the cluster's type and family (a node with several
/// networks): its vtep-sync uses and publishes it instead.
pub const VTEP_OVERWRITE_ANNOTATION: &str = "switchyard.io/vtep-address-overwrite";

/// What a node says about its VTEP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Seen {
    /// Its addresses of the type, in its status's order.
    addrs: Vec<IpAddr>,
    /// [`VTEP_ANNOTATION`], if it holds an address.
    published: Option<IpAddr>,
    /// [`VTEP_OVERWRITE_ANNOTATION`], if it holds an address.
    overwrite: Option<IpAddr>,
    /// The node object's UID.
    uid: Option<String>,
}

/// An annotation of `node` that holds an IP address.
fn annotation(node: &Node, key: &str) -> Option<IpAddr> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.trim().parse().ok())
}

/// The nodes seen so far, by name, with their addresses.
#[derive(Debug, Clone)]
pub struct Nodes {
    own: String,
    kind: AddressType,
    family: AddressFamily,
    seen: BTreeMap<String, Seen>,
}

impl Nodes {
    /// None seen yet; `own` is this node's name (never a remote of its
    /// own switch).
    pub fn new(own: &str, kind: AddressType, family: AddressFamily) -> Nodes {
        Nodes {
            own: own.to_string(),
            kind,
            family,
            seen: BTreeMap::new(),
        }
    }

    /// A node added or changed.
    pub fn apply(&mut self, node: &Node) {
        if let Some(name) = node.metadata.name.as_ref() {
            let seen = Seen {
                addrs: addresses(node, self.kind),
                published: annotation(node, VTEP_ANNOTATION),
                overwrite: annotation(node, VTEP_OVERWRITE_ANNOTATION),
                uid: node.metadata.uid.clone(),
            };
            self.seen.insert(name.clone(), seen);
        }
    }

    /// A node deleted (or no longer selected).
    pub fn delete(&mut self, node: &Node) {
        if let Some(name) = node.metadata.name.as_ref() {
            self.seen.remove(name);
        }
    }

    /// Forgets every node (a new list is coming).
    pub fn clear(&mut self) {
        self.seen.clear();
    }

    /// How many nodes are known (this one included, if selected).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no node is known.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// This node's VTEP address: the operator's overwrite, else its
    /// address of the cluster's type and family. `None` while this node
    /// is not seen (or has no such address).
    pub fn own_vtep(&self) -> Option<IpAddr> {
        let s = self.seen.get(&self.own)?;
        s.overwrite.or_else(|| self.family.pick(&s.addrs))
    }

    /// This node's object's UID (what its claims are owned by), once it
    /// is seen.
    pub fn own_uid(&self) -> Option<&str> {
        self.seen.get(&self.own)?.uid.as_deref()
    }

    /// What this node has published as its VTEP address.
    pub fn own_published(&self) -> Option<IpAddr> {
        self.seen.get(&self.own)?.published
    }

    /// The remote VTEPs: each other node's VTEP address (see the module's
    /// documentation), with the node it is. A node with none, or one of
    /// this node's own addresses, is left out.
    pub fn remotes(&self) -> BTreeMap<IpAddr, String> {
        let mut own: BTreeSet<IpAddr> = self
            .seen
            .get(&self.own)
            .into_iter()
            .flat_map(|s| s.addrs.iter().copied())
            .collect();
        own.extend(self.own_vtep());
        let mut out = BTreeMap::new();
        for (name, s) in &self.seen {
            if *name == self.own {
                continue;
            }
            let vtep = s
                .published
                .or(s.overwrite)
                .or_else(|| self.family.pick(&s.addrs));
            if let Some(a) = vtep.filter(|a| !own.contains(a)) {
                out.entry(a).or_insert_with(|| name.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    fn node(name: &str, addrs: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.status = Some(NodeStatus {
            addresses: Some(
                addrs
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    /// Dual-stack nodes that list their families in different orders pick
    /// each other's addresses in one family: the tunnels go both ways.
    #[test]
    fn dual_stack_nodes_agree_on_the_family_whatever_their_order() {
        let a = node(
            "a",
            &[("InternalIP", "fd00::1"), ("InternalIP", "10.0.0.1")],
        );
        let b = node(
            "b",
            &[("InternalIP", "10.0.0.2"), ("InternalIP", "fd00::2")],
        );
        let view = |own: &str, family| {
            let mut ns = Nodes::new(own, AddressType::InternalIp, family);
            ns.apply(&a);
            ns.apply(&b);
            ns.remotes()
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(view("a", AddressFamily::PreferIpv4), ["10.0.0.2"]);
        assert_eq!(view("b", AddressFamily::PreferIpv4), ["10.0.0.1"]);
        assert_eq!(view("a", AddressFamily::Ipv6), ["fd00::2"]);
        assert_eq!(view("b", AddressFamily::Ipv6), ["fd00::1"]);
        // An IPv6-only cluster with the default: IPv6.
        let mut ns = Nodes::new("x", AddressType::InternalIp, AddressFamily::default());
        ns.apply(&node("y", &[("InternalIP", "fd00::9")]));
        assert_eq!(ns.remotes().keys().next().unwrap().to_string(), "fd00::9");
        assert_eq!("ipv6".parse(), Ok(AddressFamily::Ipv6));
        assert!("v6".parse::<AddressFamily>().is_err());
    }

    #[test]
    fn remotes_are_the_other_nodes_in_the_clusters_family() {
        let mut ns = Nodes::new("a", AddressType::InternalIp, AddressFamily::Ipv6);
        ns.apply(&node(
            "a",
            &[
                ("Hostname", "a"),
                ("InternalIP", "fd00::1"),
                ("InternalIP", "10.0.0.1"),
            ],
        ));
        ns.apply(&node(
            "b",
            &[("InternalIP", "10.0.0.2"), ("InternalIP", "fd00::2")],
        ));
        ns.apply(&node("c", &[("ExternalIP", "fd00::3")]));
        ns.apply(&node(
            "d",
            &[("InternalIP", "not-an-ip"), ("InternalIP", "fd00::4")],
        ));
        let r = ns.remotes();
        let got: Vec<String> = r.iter().map(|(a, n)| format!("{n}={a}")).collect();
        assert_eq!(got, ["b=fd00::2", "d=fd00::4"]);
        ns.delete(&node("d", &[]));
        assert_eq!(ns.remotes().len(), 1);
        // Without this node among them: the same family.
        ns.delete(&node("a", &[]));
        let got: Vec<String> = ns.remotes().values().cloned().collect();
        assert_eq!(got, ["b"]);
        assert_eq!(ns.remotes().keys().next().unwrap().to_string(), "fd00::2");
    }

    #[test]
    fn an_address_of_this_node_is_never_a_remote() {
        let mut ns = Nodes::new("a", AddressType::InternalIp, AddressFamily::default());
        ns.apply(&node("a", &[("InternalIP", "10.0.0.1")]));
        ns.apply(&node("stale", &[("InternalIP", "10.0.0.1")]));
        assert!(ns.remotes().is_empty());
    }

    fn annotated(mut n: Node, key: &str, value: &str) -> Node {
        n.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        n
    }

    /// A node's published VTEP address before the operator's overwrite,
    /// before its status's address; this node's own VTEP is the overwrite
    /// (what it will publish), else its address.
    #[test]
    fn published_and_overwritten_vtep_addresses() {
        let a = node("a", &[("InternalIP", "10.0.0.1")]);
        let b = node("b", &[("InternalIP", "10.0.0.2")]);
        let mut ns = Nodes::new("a", AddressType::InternalIp, AddressFamily::default());
        ns.apply(&a);
        ns.apply(&b);
        assert_eq!(ns.own_vtep(), "10.0.0.1".parse().ok());
        assert_eq!(ns.own_published(), None);
        let b = annotated(b, VTEP_OVERWRITE_ANNOTATION, "192.168.0.2");
        ns.apply(&b);
        let remote = |ns: &Nodes| ns.remotes().keys().next().map(ToString::to_string);
        assert_eq!(remote(&ns).as_deref(), Some("192.168.0.2"));
        // What b published wins: the address its tunnels leave from.
        let b = annotated(b, VTEP_ANNOTATION, "192.168.9.2");
        ns.apply(&b);
        assert_eq!(remote(&ns).as_deref(), Some("192.168.9.2"));
        // Not an address: passed over.
        ns.apply(&annotated(
            node("b", &[("InternalIP", "10.0.0.2")]),
            VTEP_ANNOTATION,
            "eth1",
        ));
        assert_eq!(remote(&ns).as_deref(), Some("10.0.0.2"));
        // This node's own overwrite, published or not yet.
        let a = annotated(a, VTEP_OVERWRITE_ANNOTATION, "192.168.0.1");
        ns.apply(&a);
        assert_eq!(ns.own_vtep(), "192.168.0.1".parse().ok());
        ns.apply(&annotated(a, VTEP_ANNOTATION, "192.168.0.1"));
        assert_eq!(ns.own_published(), "192.168.0.1".parse().ok());
        // A node claiming this node's VTEP is no remote.
        ns.apply(&annotated(
            node("stale", &[("InternalIP", "10.0.0.7")]),
            VTEP_ANNOTATION,
            "192.168.0.1",
        ));
        assert_eq!(ns.remotes().len(), 1);
    }

    #[test]
    fn address_types_by_their_api_names() {
        assert_eq!("ExternalIP".parse(), Ok(AddressType::ExternalIp));
        assert!("internalip".parse::<AddressType>().is_err());
    }
}
