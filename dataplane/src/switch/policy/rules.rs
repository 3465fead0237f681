//! A direction's rules, compiled for lookup: which rules cover a peer
//! address, which cover a protocol and port, each answered by one binary
//! search over disjoint intervals that carry the set of rules covering
//! them (a bit per rule); a packet is allowed by the first rule in both
//! sets. Built once per policy change, off the data path.

use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::policy::{PolicyRule, PortPolicy};

use crate::wire::flow::PROTO_SCTP;
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};

/// The most memory a direction's compiled rules may take.
pub const MAX_COMPILED_BYTES: usize = 16 << 20;

/// Why rules could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The interval tables would take more than [`MAX_COMPILED_BYTES`].
    #[error("{direction}: {rules} rules over {intervals} address and port intervals take {bytes} bytes compiled, more than {MAX_COMPILED_BYTES}")]
    TooLarge {
        /// `ingress` or `egress`.
        direction: &'static str,
        /// Rules.
        rules: usize,
        /// Intervals.
        intervals: usize,
        /// Bytes they would take.
        bytes: usize,
    },
}

/// Disjoint intervals covering a key space from 0, each with the rules
/// covering it.
#[derive(Debug)]
struct Intervals {
    starts: Box<[u128]>,
    /// `starts.len() * words` words: interval `i`'s rules.
    masks: Box<[u64]>,
}

impl Intervals {
    /// From `ranges` (first, last, rule), inclusive.
    fn build(ranges: &mut [(u128, u128, usize)], words: usize) -> Intervals {
        // A sweep over the ranges' ends: each rule's count of open ranges,
        // and the set of rules with one open, written at every boundary.
        let mut events: Vec<(u128, bool, usize)> = Vec::with_capacity(ranges.len() * 2);
        for &mut (lo, hi, r) in ranges.iter_mut() {
            events.push((lo, true, r));
            if let Some(end) = hi.checked_add(1) {
                events.push((end, false, r));
            }
        }
        events.sort_unstable();
        let mut open = vec![0u32; words * 64];
        let mut cur = vec![0u64; words];
        let mut starts = vec![0u128];
        let mut masks = vec![0u64; words];
        let mut i = 0;
        while i < events.len() {
            let at = events[i].0;
            while i < events.len() && events[i].0 == at {
                let (_, opens, r) = events[i];
                if opens {
                    open[r] += 1;
                } else {
                    open[r] -= 1;
                }
                if open[r] == 0 {
                    cur[r / 64] &= !(1 << (r % 64));
                } else {
                    cur[r / 64] |= 1 << (r % 64);
                }
                i += 1;
            }
            if at == 0 {
                masks[..words].copy_from_slice(&cur);
            } else {
                starts.push(at);
                masks.extend_from_slice(&cur);
            }
        }
        Intervals {
            starts: starts.into(),
            masks: masks.into(),
        }
    }

    /// The rules covering `key`.
    #[inline]
    fn mask(&self, key: u128, words: usize) -> &[u64] {
        // `starts[0]` is 0: the interval is found for every key.
        let i = self.starts.partition_point(|&s| s <= key) - 1;
        &self.masks[i * words..(i + 1) * words]
    }
}

/// One direction's rules, compiled.
#[derive(Debug)]
pub struct RuleSet {
    names: Box<[Option<Box<str>>]>,
    words: usize,
    v4: Intervals,
    v6: Intervals,
    /// TCP, UDP, SCTP.
    ports: [Intervals; 3],
    /// The rules without ports: every protocol and port.
    portless: Box<[u64]>,
}

/// An address block as an inclusive range in its family's key space.
fn block_range(n: &IpNet) -> (bool, u128, u128) {
    match n {
        IpNet::V4(n) => (
            false,
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNet::V6(n) => (true, u128::from(n.network()), u128::from(n.broadcast())),
    }
}

/// `[lo, hi]` less the ranges `holes` (sorted by start).
fn subtract(lo: u128, hi: u128, holes: &[(u128, u128)], out: &mut Vec<(u128, u128)>) {
    let mut from = lo;
    for &(hlo, hhi) in holes {
        if hhi < from || hlo > hi {
            continue;
        }
        if hlo > from {
            out.push((from, hlo - 1));
        }
        match hhi.checked_add(1) {
            Some(n) => from = from.max(n),
            None => return,
        }
        if from > hi {
            return;
        }
    }
    out.push((from, hi));
}

fn proto_index(proto: u8) -> Option<usize> {
    match proto {
        PROTO_TCP => Some(0),
        PROTO_UDP => Some(1),
        PROTO_SCTP => Some(2),
        _ => None,
    }
}

impl RuleSet {
    /// Compiles `rules` (validated: [`PortPolicy::validate`]).
    pub fn compile(direction: &'static str, rules: &[PolicyRule]) -> Result<RuleSet, CompileError> {
        let words = rules.len().div_ceil(64).max(1);
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        let mut ports: [Vec<(u128, u128, usize)>; 3] = Default::default();
        let mut portless = vec![0u64; words];
        let mut pieces = Vec::new();
        for (r, rule) in rules.iter().enumerate() {
            if rule.peers.is_empty() {
                v4.push((0, u128::from(u32::MAX), r));
                v6.push((0, u128::MAX, r));
            }
            for b in &rule.peers {
                let (is6, lo, hi) = block_range(&b.cidr);
                let mut holes: Vec<(u128, u128)> = b
                    .except
                    .iter()
                    .map(block_range)
                    .filter(|h| h.0 == is6)
                    .map(|h| (h.1, h.2))
                    .collect();
                holes.sort_unstable();
                pieces.clear();
                subtract(lo, hi, &holes, &mut pieces);
                let to = if is6 { &mut v6 } else { &mut v4 };
                to.extend(pieces.iter().map(|&(lo, hi)| (lo, hi, r)));
            }
            if rule.ports.is_empty() {
                portless[r / 64] |= 1 << (r % 64);
            }
            for p in &rule.ports {
                let (lo, hi) = p.range();
                if let Some(i) = proto_index(p.protocol.number()) {
                    ports[i].push((u128::from(lo), u128::from(hi), r));
                }
            }
        }
        let intervals = v4.len() + v6.len() + ports.iter().map(Vec::len).sum::<usize>();
        // Each range makes two intervals at most.
        let bytes = (2 * intervals + 5) * (words * 8 + 16);
        if bytes > MAX_COMPILED_BYTES {
            return Err(CompileError::TooLarge {
                direction,
                rules: rules.len(),
                intervals: 2 * intervals,
                bytes,
            });
        }
        let [mut tcp, mut udp, mut sctp] = ports;
        Ok(RuleSet {
            names: rules
                .iter()
                .map(|r| r.name.as_deref().map(Box::from))
                .collect(),
            words,
            v4: Intervals::build(&mut v4, words),
            v6: Intervals::build(&mut v6, words),
            ports: [
                Intervals::build(&mut tcp, words),
                Intervals::build(&mut udp, words),
                Intervals::build(&mut sctp, words),
            ],
            portless: portless.into(),
        })
    }

    /// Rules.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether it has none (allows nothing).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of rule `i`, if it has one.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.names.get(i).and_then(|n| n.as_deref())
    }

    /// The first rule allowing traffic with peer `peer` (IPv6 if `v6`) of
    /// protocol `proto` to port `port` (`None`: a later fragment, whose
    /// port is not known; or a protocol without ports).
    pub fn allows(&self, v6: bool, peer: u128, proto: u8, port: Option<u16>) -> Option<usize> {
        let w = self.words;
        let peers = if v6 {
            self.v6.mask(peer, w)
        } else {
            self.v4.mask(peer, w)
        };
        let ports = match (proto_index(proto), port) {
            (Some(i), Some(p)) => Some(self.ports[i].mask(u128::from(p), w)),
            _ => None,
        };
        for i in 0..w {
            let by_port = self.portless[i] | ports.map_or(0, |m| m[i]);
            let both = peers[i] & by_port;
            if both != 0 {
                return Some(i * 64 + both.trailing_zeros() as usize);
            }
        }
        None
    }
}

/// A port's policy and addresses, compiled: what the data path consults
/// for each frame of the port.
#[derive(Debug)]
pub struct PortRules {
    /// Ingress rules, if isolated for ingress.
    pub ingress: Option<RuleSet>,
    /// Egress rules, if isolated for egress.
    pub egress: Option<RuleSet>,
    /// The station's IPv4 addresses (empty with `filter_v4` false: any).
    v4: Box<[u32]>,
    v6: Box<[u128]>,
    filters: bool,
}

impl PortRules {
    /// Whether it is isolated in either direction: its connections are
    /// tracked, so that their packets the other way pass.
    pub fn policed(&self) -> bool {
        self.ingress.is_some() || self.egress.is_some()
    }

    /// Compiles a port's `policy` and `ips`; `None` when neither asks
    /// anything of its frames.
    pub fn compile(
        policy: Option<&PortPolicy>,
        ips: Option<&[IpAddr]>,
    ) -> Result<Option<PortRules>, CompileError> {
        let policy = policy.filter(|p| p.isolates());
        if policy.is_none() && ips.is_none() {
            return Ok(None);
        }
        let ingress = policy
            .and_then(|p| p.ingress.as_deref())
            .map(|r| RuleSet::compile("ingress", r))
            .transpose()?;
        let egress = policy
            .and_then(|p| p.egress.as_deref())
            .map(|r| RuleSet::compile("egress", r))
            .transpose()?;
        let ips = ips.unwrap_or_default();
        Ok(Some(PortRules {
            ingress,
            egress,
            v4: ips
                .iter()
                .filter_map(|ip| match ip {
                    IpAddr::V4(a) => Some(u32::from(*a)),
                    _ => None,
                })
                .collect(),
            v6: ips
                .iter()
                .filter_map(|ip| match ip {
                    IpAddr::V6(a) => Some(u128::from(*a)),
                    _ => None,
                })
                .collect(),
            filters: !ips.is_empty(),
        }))
    }

    /// Whether the station may send from IPv4 address `src` (0, an ARP
    /// probe's, always).
    pub fn owns_v4(&self, src: u32) -> bool {
        !self.filters || src == 0 || self.v4.contains(&src)
    }

    /// Whether the station may send from IPv6 address `src`: its own, and
    /// link-local and unspecified addresses (neighbour discovery, duplicate
    /// address detection).
    pub fn owns_v6(&self, src: u128) -> bool {
        !self.filters || src == 0 || src >> 118 == 0xfe80 >> 6 || self.v6.contains(&src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(json: &str) -> Vec<PolicyRule> {
        serde_json::from_str(json).unwrap()
    }

    fn v4(s: &str) -> u128 {
        u128::from(u32::from(s.parse::<std::net::Ipv4Addr>().unwrap()))
    }

    #[test]
    fn blocks_with_holes_ports_and_ranges() {
        let set = RuleSet::compile(
            "ingress",
            &rules(
                r#"[{"name": "web", "peers": [{"cidr": "10.1.0.0/16", "except": ["10.1.2.0/24", "10.1.2.128/25"]}],
                     "ports": [{"protocol": "tcp", "port": 80, "end_port": 90}]},
                    {"name": "dns", "ports": [{"protocol": "udp", "port": 53}]},
                    {"name": "admin", "peers": [{"cidr": "192.168.0.7/32"}]}]"#,
            ),
        )
        .unwrap();
        let tcp = |ip: &str, port| set.allows(false, v4(ip), PROTO_TCP, Some(port));
        assert_eq!(tcp("10.1.0.5", 80), Some(0));
        assert_eq!(tcp("10.1.255.255", 90), Some(0));
        assert_eq!(tcp("10.1.0.5", 91), None);
        assert_eq!(tcp("10.1.2.9", 80), None);
        assert_eq!(tcp("10.1.3.0", 80), Some(0));
        assert_eq!(tcp("10.2.0.1", 80), None);
        // Any peer's DNS, UDP only.
        assert_eq!(
            set.allows(false, v4("8.8.8.8"), PROTO_UDP, Some(53)),
            Some(1)
        );
        assert_eq!(tcp("8.8.8.8", 53), None);
        assert_eq!(set.allows(true, 1, PROTO_UDP, Some(53)), Some(1));
        // Every protocol from the admin host, ICMP and fragments too.
        assert_eq!(tcp("192.168.0.7", 22), Some(2));
        assert_eq!(set.allows(false, v4("192.168.0.7"), 1, None), Some(2));
        assert_eq!(set.allows(false, v4("10.1.0.5"), PROTO_TCP, None), None);
        assert_eq!(set.name(1), Some("dns"));
        // No rules: nothing.
        let none = RuleSet::compile("egress", &[]).unwrap();
        assert_eq!(none.allows(false, 0, PROTO_TCP, Some(80)), None);
        // The whole space, ends included.
        let all = RuleSet::compile(
            "egress",
            &rules(r#"[{"peers": [{"cidr": "0.0.0.0/0"}, {"cidr": "::/0"}]}]"#),
        )
        .unwrap();
        for (v6, ip) in [
            (false, 0),
            (false, u128::from(u32::MAX)),
            (true, 0),
            (true, u128::MAX),
        ] {
            assert_eq!(all.allows(v6, ip, PROTO_UDP, Some(1)), Some(0));
        }
    }

    #[test]
    fn many_rules_find_the_first_that_allows() {
        let json: Vec<String> = (0..200)
            .map(|i| {
                format!(
                    r#"{{"peers": [{{"cidr": "10.0.{}.0/24"}}], "ports": [{{"port": {}}}]}}"#,
                    i,
                    1000 + i
                )
            })
            .collect();
        let set = RuleSet::compile("ingress", &rules(&format!("[{}]", json.join(",")))).unwrap();
        for i in [0u32, 63, 64, 199] {
            let ip = v4(&format!("10.0.{i}.1"));
            assert_eq!(
                set.allows(false, ip, PROTO_TCP, Some(1000 + i as u16)),
                Some(i as usize)
            );
            assert_eq!(set.allows(false, ip, PROTO_TCP, Some(999 + i as u16)), None);
        }
    }

    #[test]
    fn a_port_given_addresses_sends_from_them_alone() {
        let ips: Vec<IpAddr> = vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let r = PortRules::compile(None, Some(&ips)).unwrap().unwrap();
        assert!(
            r.owns_v4(v4("10.1.0.2") as u32) && r.owns_v4(0) && !r.owns_v4(v4("10.1.0.3") as u32)
        );
        let fe80 = u128::from("fe80::1".parse::<std::net::Ipv6Addr>().unwrap());
        assert!(r.owns_v6(u128::from("fd00::2".parse::<std::net::Ipv6Addr>().unwrap())));
        assert!(
            r.owns_v6(fe80)
                && r.owns_v6(0)
                && !r.owns_v6(u128::from("fd00::3".parse::<std::net::Ipv6Addr>().unwrap()))
        );
        assert!(PortRules::compile(Some(&PortPolicy::default()), None)
            .unwrap()
            .is_none());
    }
}
