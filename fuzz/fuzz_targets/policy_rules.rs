//! The policy rule compiler and its lookup: rules made from the input
//! (IPv4 blocks with holes, protocols and port ranges) are compiled, and
//! the compiled set answers every probe made from the rest of the input as
//! a plain reading of the rules does (the first rule whose peers hold the
//! address, less its holes, and whose ports hold the protocol and port).
#![no_main]
use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use libfuzzer_sys::fuzz_target;
use switchyard::switch::policy::RuleSet;
use switchyard_api::policy::{IpBlock, L4Protocol, PolicyPort, PolicyRule};

fn net(b: &[u8]) -> Ipv4Net {
    let addr = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    Ipv4Net::new(addr, b[4] % 33).unwrap().trunc()
}

fn proto(b: u8) -> L4Protocol {
    [L4Protocol::Tcp, L4Protocol::Udp, L4Protocol::Sctp][usize::from(b % 3)]
}

fn holds(rule: &PolicyRule, ip: Ipv4Addr, p: u8, port: Option<u16>) -> bool {
    let peer = rule.peers.is_empty()
        || rule.peers.iter().any(|b| {
            b.cidr.contains(&std::net::IpAddr::V4(ip))
                && !b
                    .except
                    .iter()
                    .any(|e| e.contains(&std::net::IpAddr::V4(ip)))
        });
    let ports = rule.ports.is_empty()
        || rule.ports.iter().any(|x| {
            let (lo, hi) = x.range();
            x.protocol.number() == p && port.is_some_and(|q| (lo..=hi).contains(&q))
        });
    peer && ports
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    // Up to 80 rules of 17 bytes: a block, a hole, a port range, flags.
    let n = usize::from(n % 80);
    if rest.len() < n * 17 {
        return;
    }
    let (spec, probes) = rest.split_at(n * 17);
    let rules: Vec<PolicyRule> = spec
        .chunks(17)
        .map(|c| {
            let block = net(&c[0..5]);
            let hole = net(&c[5..10]);
            let except = if c[16] & 1 != 0
                && hole.prefix_len() > block.prefix_len()
                && block.contains(&hole.network())
            {
                vec![IpNet::V4(hole)]
            } else {
                vec![]
            };
            let (a, b) = (
                u16::from_be_bytes([c[10], c[11]]).max(1),
                u16::from_be_bytes([c[12], c[13]]),
            );
            let port = PolicyPort {
                protocol: proto(c[14]),
                port: (c[16] & 4 != 0).then_some(a),
                end_port: (c[16] & 12 == 12 && b >= a).then_some(b),
            };
            PolicyRule {
                name: None,
                peers: if c[16] & 2 != 0 {
                    vec![]
                } else {
                    vec![IpBlock {
                        cidr: IpNet::V4(block),
                        except,
                    }]
                },
                ports: if c[16] & 16 != 0 { vec![] } else { vec![port] },
            }
        })
        .collect();
    let set = RuleSet::compile("ingress", &rules).expect("small rule sets compile");
    for c in probes.chunks_exact(8) {
        let ip = Ipv4Addr::new(c[0], c[1], c[2], c[3]);
        let p = [6u8, 17, 132, 1][usize::from(c[4] % 4)];
        let port = (c[7] & 1 == 0 && p != 1).then_some(u16::from_be_bytes([c[5], c[6]]));
        let want = rules.iter().position(|r| holds(r, ip, p, port));
        assert_eq!(
            set.allows(false, u128::from(u32::from(ip)), p, port),
            want,
            "{ip} {p} {port:?}"
        );
    }
});
