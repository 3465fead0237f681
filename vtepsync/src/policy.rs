//! MultiNetworkPolicy, resolved for one port: which policies select the
//! port's pod on the port's network, and their rules with every selector
//! turned into the addresses of the pods it selects on the policy's
//! networks and every named port into numbers ([`port_policy`]).
//!
//! The semantics are Kubernetes NetworkPolicy's (`k8s.io/api/networking/v1`
//! and its e2e suite, `test/e2e/network/netpol`), on the networks a
//! policy's `k8s.v1.cni.cncf.io/policy-for` annotation names, as
//! multi-networkpolicy defines them:
//! - a policy selects pods of its own namespace (`podSelector`) on each
//!   network of its `policy-for` (comma-separated NAD names, `name` meaning
//!   `<the policy's namespace>/name`; `multi-networkpolicy-iptables`,
//!   `pkg/server/server.go`);
//! - `policyTypes` defaults as the API server defaults it: `Ingress`, and
//!   `Egress` where the policy has egress rules;
//! - a peer's `podSelector` alone selects pods of the policy's namespace, a
//!   `namespaceSelector` alone every pod of the namespaces it selects, both
//!   together the pods they both select (where `multi-networkpolicy-iptables`
//!   takes a lone `podSelector` across every namespace, this follows
//!   NetworkPolicy); the peers' addresses are their addresses on the
//!   policy's networks (their network-status);
//! - a named port resolves against the pod the traffic goes to: the
//!   selected pod's container ports for ingress, each peer pod's for egress.
//!
//! Pure: the node agent builds the inputs from its watches.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use switchyard_api::policy::{IpBlock, L4Protocol, PolicyPort, PolicyRule, PortPolicy};

/// The annotation naming the networks a MultiNetworkPolicy is for.
pub const POLICY_FOR: &str = "k8s.v1.cni.cncf.io/policy-for";

/// A pod as policy and the overlays' stations need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The node it is scheduled on (`spec.nodeName`), once it is.
    pub node: Option<String>,
    /// Its UID, where known.
    pub uid: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Its attachments: network (`namespace/name`), interface, addresses
    /// (from its network-status annotation).
    pub networks: Vec<Attachment>,
    /// Its containers' named ports: (name, protocol, number).
    pub named_ports: Vec<(String, L4Protocol, u16)>,
}

/// One network-status entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attachment {
    /// The network, `namespace/name`.
    pub network: String,
    /// The interface in the pod.
    pub interface: String,
    /// Its MAC, where the entry has a readable one.
    pub mac: Option<switchyard_api::MacAddr>,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
}

/// A MultiNetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The networks it is for, `namespace/name` each.
    pub networks: Vec<String>,
    /// Its spec.
    pub spec: NetworkPolicySpec,
}

/// The networks of a `policy-for` annotation's value, each as
/// `namespace/name` (a bare name in `namespace`).
pub fn policy_for(value: &str, namespace: &str) -> Vec<String> {
    value
        .split(',')
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| {
            if n.contains('/') {
                n.to_string()
            } else {
                format!("{namespace}/{n}")
            }
        })
        .collect()
}

/// Whether `sel` selects `labels` (an empty selector selects everything).
pub fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if let Some(m) = &sel.match_labels {
        if m.iter().any(|(k, v)| labels.get(k) != Some(v)) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let have = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            // An operator the API server would have refused: selects nothing.
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

fn protocol(p: &NetworkPolicyPort) -> Option<L4Protocol> {
    match p.protocol.as_deref().unwrap_or("TCP") {
        "TCP" => Some(L4Protocol::Tcp),
        "UDP" => Some(L4Protocol::Udp),
        "SCTP" => Some(L4Protocol::Sctp),
        _ => None,
    }
}

/// The numeric ports of `ports` as they apply to traffic to `to` (whose
/// named ports resolve the named ones): `None` where `ports` is empty
/// (every port), else the list (empty: nothing matches).
fn resolve_ports(ports: &[NetworkPolicyPort], to: Option<&PodView>) -> Option<Vec<PolicyPort>> {
    if ports.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for p in ports {
        let Some(proto) = protocol(p) else { continue };
        match &p.port {
            None => out.push(PolicyPort {
                protocol: proto,
                port: None,
                end_port: None,
            }),
            Some(IntOrString::Int(n)) => {
                let Ok(n) = u16::try_from(*n) else { continue };
                let end = p
                    .end_port
                    .and_then(|e| u16::try_from(e).ok())
                    .filter(|&e| e >= n);
                out.push(PolicyPort {
                    protocol: proto,
                    port: Some(n),
                    end_port: end,
                });
            }
            Some(IntOrString::String(name)) => {
                for (_, _, n) in to
                    .into_iter()
                    .flat_map(|pod| pod.named_ports.iter())
                    .filter(|(pn, pp, _)| pn == name && *pp == proto)
                {
                    out.push(PolicyPort {
                        protocol: proto,
                        port: Some(*n),
                        end_port: None,
                    });
                }
            }
        }
    }
    Some(out)
}

fn has_named(ports: &[NetworkPolicyPort]) -> bool {
    ports
        .iter()
        .any(|p| matches!(p.port, Some(IntOrString::String(_))))
}

fn host_block(ip: IpAddr) -> IpBlock {
    IpBlock {
        cidr: IpNet::from(ip),
        except: Vec::new(),
    }
}

/// What a rule's peers are: every peer, or address blocks and pods.
enum Peers<'a> {
    Any,
    Some {
        blocks: Vec<IpBlock>,
        pods: Vec<&'a PodView>,
    },
}

/// The peers `peers` select for policy `pol` (pods by their addresses on
/// its networks).
fn peers<'a>(
    peers: Option<&[NetworkPolicyPeer]>,
    pol: &PolicyView,
    pods: &'a [PodView],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Peers<'a> {
    let Some(peers) = peers.filter(|p| !p.is_empty()) else {
        return Peers::Any;
    };
    let mut blocks = Vec::new();
    let mut selected: Vec<&PodView> = Vec::new();
    for peer in peers {
        if let Some(b) = &peer.ip_block {
            let Ok(cidr) = b.cidr.parse::<IpNet>() else {
                continue;
            };
            let except = b
                .except
                .iter()
                .flatten()
                .filter_map(|e| e.parse::<IpNet>().ok())
                .filter(|e| e.prefix_len() > cidr.prefix_len() && cidr.contains(&e.network()))
                .collect();
            blocks.push(IpBlock {
                cidr: cidr.trunc(),
                except,
            });
            continue;
        }
        let empty = BTreeMap::new();
        for pod in pods {
            let ns_ok = match &peer.namespace_selector {
                None => pod.namespace == pol.namespace,
                Some(sel) => selects(sel, namespaces.get(&pod.namespace).unwrap_or(&empty)),
            };
            let pod_ok = peer
                .pod_selector
                .as_ref()
                .is_none_or(|sel| selects(sel, &pod.labels));
            if ns_ok && pod_ok && !selected.iter().any(|p| std::ptr::eq(*p, pod)) {
                selected.push(pod);
            }
        }
    }
    Peers::Some {
        blocks,
        pods: selected,
    }
}

/// A pod's addresses on `pol`'s networks.
fn addresses_on<'a>(pod: &'a PodView, pol: &'a PolicyView) -> impl Iterator<Item = IpAddr> + 'a {
    pod.networks
        .iter()
        .filter(|a| pol.networks.contains(&a.network))
        .flat_map(|a| a.ips.iter().copied())
}

/// Adds the rule of `peers` (pods by their addresses on `pol`'s
/// networks) on `ports` to `rules`; a rule whose peers select nothing
/// allows nothing and is left out.
fn push_rule(
    rules: &mut Vec<PolicyRule>,
    name: Option<String>,
    peers: Peers<'_>,
    pol: &PolicyView,
    ports: Vec<PolicyPort>,
) {
    let peers = match peers {
        Peers::Any => vec![],
        Peers::Some { mut blocks, pods } => {
            blocks.extend(
                pods.iter()
                    .flat_map(|p| addresses_on(p, pol))
                    .map(host_block),
            );
            if blocks.is_empty() {
                return;
            }
            blocks
        }
    };
    rules.push(PolicyRule { name, peers, ports });
}

/// The policy of the port serving `pod`'s interface `interface`: `None`
/// when no policy selects it there.
pub fn port_policy(
    pod: &PodView,
    interface: &str,
    pods: &[PodView],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    policies: &[PolicyView],
) -> Option<PortPolicy> {
    let network = &pod
        .networks
        .iter()
        .find(|a| a.interface == interface)?
        .network;
    let mut ingress: Option<Vec<PolicyRule>> = None;
    let mut egress: Option<Vec<PolicyRule>> = None;
    let mut sorted: Vec<&PolicyView> = policies.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for pol in sorted {
        if pol.namespace != pod.namespace
            || !pol.networks.contains(network)
            || !pol
                .spec
                .pod_selector
                .as_ref()
                .is_none_or(|s| selects(s, &pod.labels))
        {
            continue;
        }
        let spec = &pol.spec;
        let types: Vec<&str> = match &spec.policy_types {
            Some(t) if !t.is_empty() => t.iter().map(String::as_str).collect(),
            _ if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) => vec!["Ingress", "Egress"],
            _ => vec!["Ingress"],
        };
        let id = format!("{}/{}", pol.namespace, pol.name);
        if types.contains(&"Ingress") {
            let rules = ingress.get_or_insert_with(Vec::new);
            for (i, r) in spec.ingress.iter().flatten().enumerate() {
                let name = Some(format!("{id} ingress[{i}]"));
                // Named ports resolve against this pod, where the traffic
                // goes.
                let ports = resolve_ports(r.ports.as_deref().unwrap_or_default(), Some(pod));
                if ports.as_ref().is_some_and(Vec::is_empty) {
                    continue;
                }
                let ports = ports.unwrap_or_default();
                push_rule(
                    rules,
                    name,
                    peers(r.from.as_deref(), pol, pods, namespaces),
                    pol,
                    ports,
                );
            }
        }
        if types.contains(&"Egress") {
            let rules = egress.get_or_insert_with(Vec::new);
            for (i, r) in spec.egress.iter().flatten().enumerate() {
                let name = Some(format!("{id} egress[{i}]"));
                let raw = r.ports.as_deref().unwrap_or_default();
                let peers = peers(r.to.as_deref(), pol, pods, namespaces);
                if !has_named(raw) {
                    // Ports listed, none of them one the switch knows: the
                    // rule allows nothing (as on ingress), not every port.
                    let ports = resolve_ports(raw, None);
                    if ports.as_ref().is_some_and(Vec::is_empty) {
                        continue;
                    }
                    push_rule(rules, name, peers, pol, ports.unwrap_or_default());
                    continue;
                }
                // Named ports resolve against each peer pod: a rule per
                // pod. Blocks and "every peer" have no pod to name them,
                // so only their numbered ports apply.
                let numbered: Vec<NetworkPolicyPort> = raw
                    .iter()
                    .filter(|p| !matches!(p.port, Some(IntOrString::String(_))))
                    .cloned()
                    .collect();
                let (blocks, sel, any) = match peers {
                    Peers::Any => (Vec::new(), pods.iter().collect::<Vec<_>>(), true),
                    Peers::Some { blocks, pods } => (blocks, pods, false),
                };
                let numbered_ports = resolve_ports(&numbered, None).unwrap_or_default();
                if !numbered_ports.is_empty() && (any || !blocks.is_empty()) {
                    rules.push(PolicyRule {
                        name: name.clone(),
                        peers: blocks,
                        ports: numbered_ports,
                    });
                }
                for p in sel {
                    let ports = resolve_ports(raw, Some(p)).unwrap_or_default();
                    let blocks: Vec<IpBlock> = addresses_on(p, pol).map(host_block).collect();
                    if !ports.is_empty() && !blocks.is_empty() {
                        rules.push(PolicyRule {
                            name: name.clone(),
                            peers: blocks,
                            ports,
                        });
                    }
                }
            }
        }
    }
    (ingress.is_some() || egress.is_some()).then_some(PortPolicy { ingress, egress })
}

/// The annotation Multus writes each attachment's addresses in.
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// A pod as policy needs it: `None` for a pod that is done (its addresses
/// may be someone else's by now, as NetworkPolicy implementations take
/// them).
pub fn pod_view(pod: &k8s_openapi::api::core::v1::Pod) -> Option<PodView> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let meta = &pod.metadata;
    let status = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(NETWORK_STATUS));
    let networks = status
        .and_then(|s| serde_json::from_str::<Vec<serde_json::Value>>(s).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            Some(Attachment {
                network: e["name"].as_str()?.to_string(),
                interface: e["interface"].as_str().unwrap_or_default().to_string(),
                mac: e["mac"].as_str().and_then(|m| m.parse().ok()),
                ips: e["ips"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|ip| ip.as_str()?.parse().ok())
                    .collect(),
            })
        })
        .collect();
    let named_ports = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let proto = match p.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => L4Protocol::Tcp,
                "UDP" => L4Protocol::Udp,
                "SCTP" => L4Protocol::Sctp,
                _ => return None,
            };
            Some((
                p.name.clone()?,
                proto,
                u16::try_from(p.container_port).ok()?,
            ))
        })
        .collect();
    Some(PodView {
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        uid: meta.uid.clone(),
        labels: meta.labels.clone().unwrap_or_default(),
        networks,
        named_ports,
    })
}

/// A MultiNetworkPolicy object (`k8s.cni.cncf.io/v1beta1`, read as a
/// dynamic object: its spec is NetworkPolicy's) as policy needs it; `None`
/// for one whose spec does not read.
pub fn policy_view(obj: &kube::core::DynamicObject) -> Option<PolicyView> {
    let namespace = obj.metadata.namespace.clone()?;
    let spec = serde_json::from_value(obj.data.get("spec")?.clone()).ok()?;
    let networks = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POLICY_FOR))
        .map(|v| policy_for(v, &namespace))
        .unwrap_or_default();
    Some(PolicyView {
        name: obj.metadata.name.clone()?,
        namespace,
        networks,
        spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The e2e suite's model (`test/e2e/network/netpol/model.go`):
    /// namespaces x, y, z labelled `kubernetes.io/metadata.name`, pods a, b,
    /// c in each labelled `pod: <name>`, serving 80 and 81 over TCP, UDP
    /// and SCTP as `serve-<port>-<proto>`; here each on network `x/net`
    /// at 10.0.<ns>.<pod>.
    fn model() -> (Vec<PodView>, BTreeMap<String, BTreeMap<String, String>>) {
        let mut pods = Vec::new();
        let mut namespaces = BTreeMap::new();
        for (ni, ns) in ["x", "y", "z"].iter().enumerate() {
            namespaces.insert(
                ns.to_string(),
                BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())]),
            );
            for (pi, pod) in ["a", "b", "c"].iter().enumerate() {
                let mut named_ports = Vec::new();
                for port in [80u16, 81] {
                    for (proto, name) in [
                        (L4Protocol::Tcp, "tcp"),
                        (L4Protocol::Udp, "udp"),
                        (L4Protocol::Sctp, "sctp"),
                    ] {
                        named_ports.push((format!("serve-{port}-{name}"), proto, port));
                    }
                }
                pods.push(PodView {
                    namespace: ns.to_string(),
                    name: pod.to_string(),
                    node: None,
                    uid: None,
                    labels: BTreeMap::from([("pod".to_string(), pod.to_string())]),
                    networks: vec![Attachment {
                        network: "x/net".into(),
                        interface: "net1".into(),
                        mac: None,
                        ips: vec![format!("10.0.{}.{}", ni + 1, pi + 1).parse().unwrap()],
                    }],
                    named_ports,
                });
            }
        }
        (pods, namespaces)
    }

    fn policy(ns: &str, spec: serde_json::Value) -> PolicyView {
        PolicyView {
            namespace: ns.into(),
            name: "p".into(),
            networks: vec!["x/net".into()],
            spec: serde_json::from_value(spec).unwrap(),
        }
    }

    fn pod<'a>(pods: &'a [PodView], ns: &str, name: &str) -> &'a PodView {
        pods.iter()
            .find(|p| p.namespace == ns && p.name == name)
            .unwrap()
    }

    fn cidrs(r: &PolicyRule) -> Vec<String> {
        r.peers.iter().map(|b| b.cidr.to_string()).collect()
    }

    #[test]
    fn policy_for_names_networks_in_the_policys_namespace_by_default() {
        assert_eq!(
            policy_for("net-a, other/net-b,,", "x"),
            ["x/net-a", "other/net-b"]
        );
    }

    #[test]
    fn deny_all_ingress_and_what_it_selects() {
        let (pods, ns) = model();
        // "should support a 'default-deny-ingress' policy".
        let pols = [policy(
            "x",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        )];
        let p = port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!((p.ingress, p.egress), (Some(vec![]), None));
        // Not selected: another namespace, or another network.
        assert_eq!(
            port_policy(pod(&pods, "y", "a"), "net1", &pods, &ns, &pols),
            None
        );
        let mut other = pols[0].clone();
        other.networks = vec!["x/other".into()];
        assert_eq!(
            port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &[other]),
            None
        );
        // An interface the pod does not have.
        assert_eq!(
            port_policy(pod(&pods, "x", "a"), "net9", &pods, &ns, &pols),
            None
        );
    }

    #[test]
    fn peers_by_pod_and_namespace_selectors() {
        let (pods, ns) = model();
        // "should enforce policy to allow traffic from pods within server
        // namespace based on PodSelector": x/a from x/b only.
        let pols = [policy(
            "x",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(cidrs(&p.ingress.unwrap()[0]), ["10.0.1.2/32"]);
        // "... based on NamespaceSelector": from every pod of y.
        let pols = [policy(
            "x",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(
            cidrs(&p.ingress.unwrap()[0]),
            ["10.0.2.1/32", "10.0.2.2/32", "10.0.2.3/32"]
        );
        // Both in one peer: their intersection; NotIn.
        let pols = [policy(
            "x",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["x"]}]},
                                           "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(
            cidrs(&p.ingress.unwrap()[0]),
            ["10.0.2.2/32", "10.0.3.2/32"]
        );
    }

    #[test]
    fn ports_named_numbered_ranged_and_egress() {
        let (pods, ns) = model();
        // Named port on ingress: resolved against the selected pod.
        let pols = [policy(
            "x",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &pols).unwrap();
        let r = &p.ingress.unwrap()[0];
        assert!(r.peers.is_empty());
        assert_eq!(
            r.ports,
            [PolicyPort {
                protocol: L4Protocol::Udp,
                port: Some(81),
                end_port: None
            }]
        );
        // A named port no container has: the rule allows nothing.
        let pols = [policy(
            "x",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": "nope"}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "a"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(p.ingress, Some(vec![]));
        // Egress with endPort, and the defaulted policy types.
        let pols = [policy(
            "x",
            json!({"podSelector": {},
                   "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.3.0/24"]}}],
                               "ports": [{"port": 80, "endPort": 81}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "b"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(p.ingress, Some(vec![]));
        let e = &p.egress.unwrap()[0];
        assert_eq!(e.peers[0].except[0].to_string(), "10.0.3.0/24");
        assert_eq!(e.ports[0].range(), (80, 81));
        // Named port on egress: a rule per peer pod.
        let pols = [policy(
            "x",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "serve-80-tcp"}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "c"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(p.ingress, None);
        let e = p.egress.unwrap();
        assert_eq!(e.len(), 3);
        assert!(e
            .iter()
            .all(|r| r.ports[0].port == Some(80) && r.peers.len() == 1));
        // Egress ports of which the switch knows none (a protocol it does
        // not filter, a number out of range): the rule allows nothing, as
        // on ingress, rather than every port.
        let pols = [policy(
            "x",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
                   "egress": [{"ports": [{"protocol": "ICMP"}, {"port": 70000}]}]}),
        )];
        let p = port_policy(pod(&pods, "x", "c"), "net1", &pods, &ns, &pols).unwrap();
        assert_eq!(p.egress, Some(vec![]));
    }
}
