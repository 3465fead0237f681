//! L3/L4 policy on a port: its station's addresses (no frame from another
//! source address leaves it) and the NetworkPolicy rules of each isolated
//! direction, with connection tracking so that replies pass.
//!
//! A frame between two ports is judged only where one of them has rules
//! ([`PortRules`]); the forwarder runs these checks only for a bridge with
//! such a port, so a bridge without them pays nothing per frame. At the
//! port a frame came in on its station's address is checked
//! ([`Judge::from_port`]); then for each port it goes to (a member of its
//! VLAN, up), the egress rules of the first port and the ingress rules of
//! the second ([`Judge::to_port`]). A packet of a connection tracked
//! between those two ports passes both ([`conntrack`]); a new one allowed
//! is recorded there. ARP and IPv6 neighbour discovery pass (their
//! sender's address checked); frames that are not IP pass, as the
//! kernel's iptables never sees them.

pub mod conntrack;
pub mod rules;

use std::sync::Arc;

use conntrack::{Conntrack, CtQuota, Full, PortRef, Zone};
pub use rules::{CompileError, PortRules, RuleSet};

use crate::types::{DropReason, PortId};
use crate::wire::flow::{Packet, PREFIX_LEN, PROTO_SCTP};
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};
use crate::wire::MacAddr;

/// Which of a port's directions a decision was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Frames to the port's station.
    Ingress,
    /// Frames from it.
    Egress,
}

impl Direction {
    /// `ingress` or `egress`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// What decided a frame, for a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A packet of a tracked connection, or an ICMP error about one.
    Established,
    /// Allowed by rule `rule` (its index) of `port`'s rules in
    /// `direction` ([`RuleSet::name`] names it).
    Rule {
        /// The port whose rules allowed it.
        port: PortId,
        /// Which of its directions.
        direction: Direction,
        /// The rule's index.
        rule: usize,
    },
    /// Not subject to policy (not IP, ARP, neighbour discovery).
    Exempt,
}

/// One frame's policy state while it is switched: what was read of it,
/// found in the connection table and decided by its first port's egress
/// rules, each once for all the ports it goes to.
#[derive(Debug, Default)]
pub struct FrameCheck {
    packet: Option<Packet>,
    /// Where the frame's connection goes, if it is a packet of one.
    tracked: Option<Option<PortRef>>,
    /// The egress rule that allows it, if any.
    egress: Option<Option<usize>>,
    /// Its connection was recorded (by this frame).
    opened: bool,
    /// Its egress denial was counted.
    egress_counted: bool,
}

impl FrameCheck {
    /// Whether an egress denial of this frame is yet to be counted (true
    /// once: a flood is one frame refused, whatever the ports).
    pub fn count_egress_drop(&mut self) -> bool {
        !std::mem::replace(&mut self.egress_counted, true)
    }
}

/// What allowed a frame from one port to another: the first port's egress
/// and the second's ingress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// At the port it came in on.
    pub egress: Decision,
    /// At the port it goes to.
    pub ingress: Decision,
}

impl Verdict {
    const EXEMPT: Verdict = Verdict {
        egress: Decision::Exempt,
        ingress: Decision::Exempt,
    };
    const ESTABLISHED: Verdict = Verdict {
        egress: Decision::Established,
        ingress: Decision::Established,
    };
}

/// What a burst's frames are judged with: the connection table, the zone
/// (bridge and VLAN) and the clock.
pub struct Judge<'a> {
    /// The switch's connection table.
    pub conntrack: &'a Conntrack,
    /// The frames' zone.
    pub zone: Zone,
    /// The clock, in seconds.
    pub now: u32,
}

/// A port a frame goes between: its slot (with the slot's generation)
/// and its rules, if any.
pub type End<'r> = (PortRef, Option<&'r PortRules>);

impl Judge<'_> {
    fn packet(f: &mut FrameCheck, read: impl FnOnce(&mut [u8]) -> usize) -> Packet {
        *f.packet.get_or_insert_with(|| {
            let mut prefix = [0u8; PREFIX_LEN];
            let n = read(&mut prefix);
            Packet::parse(&prefix[..n])
        })
    }

    /// The checks at the port the frame came in on (with rules `r`): its
    /// source address. `read` copies the frame's first bytes into the
    /// buffer given and returns how many.
    pub fn from_port(
        &self,
        f: &mut FrameCheck,
        read: impl FnOnce(&mut [u8]) -> usize,
        r: &PortRules,
    ) -> Result<(), DropReason> {
        let ok = match Self::packet(f, read) {
            Packet::NotIp => true,
            Packet::Malformed => return Err(DropReason::BadHeader),
            Packet::Arp { sender } => r.owns_v4(sender),
            Packet::Neighbour { src } => r.owns_v6(src),
            Packet::Flow { tuple, .. } | Packet::IcmpError { tuple, .. } => {
                if tuple.v6 {
                    r.owns_v6(tuple.src)
                } else {
                    r.owns_v4(tuple.src as u32)
                }
            }
        };
        ok.then_some(()).ok_or(DropReason::SpoofedIp)
    }

    /// The checks for a frame going from port `from` to port `to`, once
    /// it passed those where it came in: a packet of a connection tracked
    /// between the two, or an ICMP error about one coming back, passes;
    /// another is judged by `from`'s egress rules and `to`'s ingress rules
    /// and, if allowed, recorded as a new connection (once per frame, the
    /// first way it is allowed), charged to `quota`; a frame without one
    /// (flooded: it may reach a port that is not its destination) opens
    /// nothing, its sender's next packet, sent where the answer came from,
    /// does. A frame between two ports neither of which is isolated passes
    /// and opens nothing. `src` gives the frame's source MAC if the bridge
    /// has it on `from` (a connection's opener that moved takes its
    /// connection along, [`Conntrack::open`]); asked only when a
    /// connection is opened.
    pub fn to_port(
        &self,
        f: &mut FrameCheck,
        read: impl FnOnce(&mut [u8]) -> usize,
        (from, from_rules): End<'_>,
        (to, to_rules): End<'_>,
        quota: Option<&Arc<CtQuota>>,
        src: impl FnOnce() -> Option<MacAddr>,
    ) -> Result<Verdict, DropReason> {
        let egress = from_rules.and_then(|r| r.egress.as_ref());
        let ingress = to_rules.and_then(|r| r.ingress.as_ref());
        // Its connection is tracked where either port is isolated in
        // either direction: a connection one opened, the other's replies.
        if !from_rules.is_some_and(PortRules::policed) && !to_rules.is_some_and(PortRules::policed)
        {
            return Ok(Verdict::EXEMPT);
        }
        let (t, flags, dport, opens) = match Self::packet(f, read) {
            Packet::NotIp | Packet::Arp { .. } | Packet::Neighbour { .. } => {
                return Ok(Verdict::EXEMPT)
            }
            Packet::Malformed => return Err(DropReason::BadHeader),
            Packet::IcmpError { tuple, about } => {
                // Sent to the quoted packet's sender, from where that
                // packet went.
                if tuple.dst == about.src
                    && self.conntrack.related(self.zone, &about, from, self.now) == Some(to)
                {
                    return Ok(Verdict::ESTABLISHED);
                }
                (tuple, 0, None, false)
            }
            Packet::Flow {
                tuple,
                flags,
                fragment,
                ..
            } => {
                let conntrack = self.conntrack;
                let (zone, now) = (self.zone, self.now);
                let goes = *f
                    .tracked
                    .get_or_insert_with(|| conntrack.track(zone, &tuple, flags, from, now));
                if goes == Some(to) {
                    return Ok(Verdict::ESTABLISHED);
                }
                // A later fragment has no ports: port rules do not match
                // it, and it opens nothing.
                let ported = matches!(tuple.proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP);
                let dport = (!fragment && ported).then_some(tuple.dport);
                (tuple, flags, dport, !fragment)
            }
        };
        let mut v = Verdict::EXEMPT;
        if let Some(rules) = egress {
            let rule = *f
                .egress
                .get_or_insert_with(|| rules.allows(t.v6, t.dst, t.proto, dport));
            let rule = rule.ok_or(DropReason::PolicyEgress)?;
            v.egress = Decision::Rule {
                port: from.id,
                direction: Direction::Egress,
                rule,
            };
        }
        if let Some(rules) = ingress {
            let rule = rules
                .allows(t.v6, t.src, t.proto, dport)
                .ok_or(DropReason::PolicyIngress)?;
            v.ingress = Decision::Rule {
                port: to.id,
                direction: Direction::Ingress,
                rule,
            };
        }
        if let (true, false, Some(quota)) = (opens, f.opened, quota) {
            f.opened = true;
            self.conntrack
                .open(self.zone, &t, flags, (from, to), src(), quota, self.now)
                .map_err(|e| match e {
                    Full::Port | Full::Table => DropReason::ConntrackFull,
                })?;
        }
        Ok(v)
    }
}
