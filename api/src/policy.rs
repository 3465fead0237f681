//! A port's L3/L4 policy: what a pod behind the port may send and
//! receive, as Kubernetes NetworkPolicy (and MultiNetworkPolicy, its
//! schema for secondary networks) defines it, with every selector already
//! resolved to addresses.
//!
//! The node agent computes a [`PortPolicy`] for each port from the
//! policies that select its pod (pod and namespace selectors resolved to
//! the peers' addresses on the port's network, named ports to numbers) and
//! replaces it in one request: the switch never judges a frame against
//! half a rule set. In JSON:
//!
//! ```json
//! {"ingress": [{"name": "ns1/allow-web[0]",
//!               "peers": [{"cidr": "10.1.0.0/16", "except": ["10.1.2.0/24"]}],
//!               "ports": [{"protocol": "tcp", "port": 80, "end_port": 90}]}],
//!  "egress": []}
//! ```
//!
//! A direction that is absent is not isolated (everything passes); one
//! that is present allows only what one of its rules allows (an empty list:
//! nothing). Replies to an allowed connection pass both ways (the switch
//! tracks connections); ARP and IPv6 neighbour discovery always pass.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::spec::SpecError;

/// Most rules a direction may hold.
pub const MAX_RULES: usize = 10_000;
/// Most peers (address blocks) and most ports a rule may hold.
pub const MAX_RULE_ITEMS: usize = 10_000;
/// Most addresses a port may be given.
pub const MAX_PORT_IPS: usize = 64;
/// Longest rule name.
pub const MAX_RULE_NAME: usize = 253;

/// A port's policy: the rules of each isolated direction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortPolicy {
    /// What the pod may receive (NetworkPolicy's `ingress`); absent: not
    /// isolated for ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<PolicyRule>>,
    /// What the pod may send (`egress`); absent: not isolated for egress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<PolicyRule>>,
}

/// One rule: traffic with any of its peers on any of its ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Where it comes from (a trace and the agent's logs name it by this),
    /// e.g. `namespace/policy[index]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The peers, as address blocks (empty: every peer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<IpBlock>,
    /// The ports (empty: every port of every protocol, ICMP too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PolicyPort>,
}

/// An address block with holes (NetworkPolicy's `ipBlock`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpBlock {
    /// The block (`10.1.0.0/16`, `fd00::/64`; a single address is `/32`
    /// or `/128`).
    pub cidr: IpNet,
    /// Blocks inside it that it does not cover.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<IpNet>,
}

/// A protocol a rule's port names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L4Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl L4Protocol {
    /// Its IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Protocol::Tcp => 6,
            L4Protocol::Udp => 17,
            L4Protocol::Sctp => 132,
        }
    }
}

/// A port or range of ports of one protocol (NetworkPolicy's
/// `NetworkPolicyPort`, a named port already resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPort {
    /// The protocol (NetworkPolicy's default is TCP).
    #[serde(default = "tcp")]
    pub protocol: L4Protocol,
    /// The port, or the first of the range (absent: every port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The last port of the range (`endPort`; needs `port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<u16>,
}

fn tcp() -> L4Protocol {
    L4Protocol::Tcp
}

impl PolicyPort {
    /// The ports it covers, first and last.
    pub fn range(&self) -> (u16, u16) {
        match (self.port, self.end_port) {
            (Some(p), Some(e)) => (p, e),
            (Some(p), None) => (p, p),
            _ => (0, u16::MAX),
        }
    }
}

impl PortPolicy {
    /// Checks the rules (`at` names the policy's field, e.g.
    /// `port[pod1].policy`): names, blocks and their holes, port ranges,
    /// sizes.
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        for (dir, rules) in [("ingress", &self.ingress), ("egress", &self.egress)] {
            let Some(rules) = rules else { continue };
            if rules.len() > MAX_RULES {
                return Err(SpecError::new(
                    format!("{at}.{dir}"),
                    format!("{} rules, at most {MAX_RULES}", rules.len()),
                ));
            }
            for (i, r) in rules.iter().enumerate() {
                r.validate(&format!("{at}.{dir}[{i}]"))?;
            }
        }
        Ok(())
    }

    /// Whether it isolates the port in either direction.
    pub fn isolates(&self) -> bool {
        self.ingress.is_some() || self.egress.is_some()
    }
}

impl PolicyRule {
    fn validate(&self, at: &str) -> Result<(), SpecError> {
        if let Some(n) = &self.name {
            if n.len() > MAX_RULE_NAME || n.chars().any(char::is_control) {
                return Err(SpecError::new(
                    format!("{at}.name"),
                    format!("at most {MAX_RULE_NAME} bytes, no control characters"),
                ));
            }
        }
        for (field, n) in [("peers", self.peers.len()), ("ports", self.ports.len())] {
            if n > MAX_RULE_ITEMS {
                return Err(SpecError::new(
                    format!("{at}.{field}"),
                    format!("{n} items, at most {MAX_RULE_ITEMS}"),
                ));
            }
        }
        for (i, b) in self.peers.iter().enumerate() {
            let at = format!("{at}.peers[{i}]");
            if b.except.len() > MAX_RULE_ITEMS {
                return Err(SpecError::new(
                    format!("{at}.except"),
                    format!("{} blocks, at most {MAX_RULE_ITEMS}", b.except.len()),
                ));
            }
            for (j, e) in b.except.iter().enumerate() {
                // As the API server validates an ipBlock: each hole a
                // strict part of the block, of its family.
                if e.prefix_len() <= b.cidr.prefix_len() || !b.cidr.contains(&e.network()) {
                    return Err(SpecError::new(
                        format!("{at}.except[{j}]"),
                        format!("{e} is not a strict part of {}", b.cidr),
                    ));
                }
            }
        }
        for (i, p) in self.ports.iter().enumerate() {
            let at = format!("{at}.ports[{i}]");
            match (p.port, p.end_port) {
                (Some(0), _) => {
                    return Err(SpecError::new(format!("{at}.port"), "must be 1..65535"));
                }
                (None, Some(_)) => {
                    return Err(SpecError::new(format!("{at}.end_port"), "needs port"));
                }
                (Some(s), Some(e)) if e < s => {
                    return Err(SpecError::new(
                        format!("{at}.end_port"),
                        format!("{e} is below port {s}"),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Checks a port's addresses (`at` names the field).
pub fn validate_ips(ips: &[IpAddr], at: &str) -> Result<(), SpecError> {
    if ips.len() > MAX_PORT_IPS {
        return Err(SpecError::new(
            at,
            format!("{} addresses, at most {MAX_PORT_IPS}", ips.len()),
        ));
    }
    for (i, ip) in ips.iter().enumerate() {
        let bad = match ip {
            IpAddr::V4(a) => a.is_unspecified() || a.is_multicast() || a.is_broadcast(),
            IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
        };
        if bad {
            return Err(SpecError::new(
                format!("{at}[{i}]"),
                format!("{ip} is no station's address"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_form_and_refuses_bad_rules() {
        let p: PortPolicy = serde_json::from_str(
            r#"{"ingress": [{"name": "ns1/allow-web[0]",
                "peers": [{"cidr": "10.1.0.0/16", "except": ["10.1.2.0/24"]}],
                "ports": [{"protocol": "tcp", "port": 80, "end_port": 90}]}],
                "egress": []}"#,
        )
        .unwrap();
        p.validate("policy").unwrap();
        assert!(p.isolates());
        let rule = &p.ingress.as_ref().unwrap()[0];
        assert_eq!(rule.ports[0].range(), (80, 90));
        assert_eq!(p.egress, Some(vec![]));
        // The protocol defaults to TCP, as NetworkPolicy's does.
        let port: PolicyPort = serde_json::from_str(r#"{"port": 53}"#).unwrap();
        assert_eq!((port.protocol, port.range()), (L4Protocol::Tcp, (53, 53)));

        let bad = |json: &str| {
            let p: PortPolicy = serde_json::from_str(json).unwrap();
            p.validate("policy").unwrap_err().field
        };
        assert_eq!(
            bad(
                r#"{"ingress": [{"peers": [{"cidr": "10.1.0.0/16", "except": ["10.2.0.0/24"]}]}]}"#
            ),
            "policy.ingress[0].peers[0].except[0]"
        );
        assert_eq!(
            bad(
                r#"{"egress": [{}, {"peers": [{"cidr": "10.1.0.0/16", "except": ["10.1.0.0/16"]}]}]}"#
            ),
            "policy.egress[1].peers[0].except[0]"
        );
        assert_eq!(
            bad(r#"{"egress": [{"ports": [{"port": 90, "end_port": 80}]}]}"#),
            "policy.egress[0].ports[0].end_port"
        );
        assert_eq!(
            bad(r#"{"egress": [{"ports": [{"end_port": 80}]}]}"#),
            "policy.egress[0].ports[0].end_port"
        );
        assert_eq!(
            bad(r#"{"ingress": [{"ports": [{"protocol": "udp", "port": 0}]}]}"#),
            "policy.ingress[0].ports[0].port"
        );
        assert!(serde_json::from_str::<PortPolicy>(r#"{"ingres": []}"#).is_err());
        assert!(serde_json::from_str::<PortPolicy>(
            r#"{"ingress": [{"ports": [{"protocol": "icmp"}]}]}"#
        )
        .is_err());
    }

    #[test]
    fn a_port_is_given_station_addresses_only() {
        let ok: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        validate_ips(&ok, "ips").unwrap();
        for bad in ["0.0.0.0", "255.255.255.255", "224.0.0.1", "::", "ff02::1"] {
            let e = validate_ips(&[bad.parse().unwrap()], "ips").unwrap_err();
            assert_eq!(e.field, "ips[0]", "{bad}");
        }
    }
}
