//! L3/L4 policy on a port: its station's addresses (no frame from another
//! source address leaves it) and the NetworkPolicy rules of each isolated
//! direction, with connection tracking so that replies pass.
//!
//! A frame between two ports is judged only where one of them has rules
//! ([`PortRules`]); the forwarder runs these checks only for a bridge with
//! such a port, so a bridge without them pays nothing per frame. A frame is
//! judged at most once per step: at the port it came in on (its station's
//! address, that port's egress rules), then at each port it goes to (that
//! port's ingress rules); a packet of a tracked connection passes both
//! ([`conntrack`]). ARP and IPv6 neighbour discovery pass (their sender's
//! address checked); frames that are not IP pass, as the kernel's
//! iptables never sees them.

pub mod conntrack;
pub mod rules;

use std::sync::Arc;

use conntrack::{Conntrack, CtQuota, Full, Tracked, Zone};
pub use rules::{CompileError, PortRules, RuleSet};

use crate::types::{DropReason, PortId};
use crate::wire::flow::{Packet, Tuple, PREFIX_LEN, PROTO_SCTP};
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};

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
    /// Denied: no rule of `port`'s rules in `direction` allows it.
    Denied {
        /// The port whose rules refused it.
        port: PortId,
        /// Which of its directions.
        direction: Direction,
    },
    /// Not subject to policy (not IP, ARP, neighbour discovery).
    Exempt,
}

/// One frame's policy state while it is switched: what was read of it and
/// found in the connection table, each once.
#[derive(Debug, Default)]
pub struct FrameCheck {
    packet: Option<Packet>,
    tracked: Option<Tracked>,
    /// Its connection was recorded (by this frame).
    opened: bool,
}

/// The packet's tuple, TCP flags and the port its rules match (none for a
/// later fragment or a protocol without ports).
fn flow_facts(p: &Packet) -> Option<(Tuple, u8, Option<u16>)> {
    match *p {
        Packet::Flow {
            tuple,
            flags,
            fragment,
            ..
        } => {
            let port = (!fragment && matches!(tuple.proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP))
                .then_some(tuple.dport);
            Some((tuple, flags, port))
        }
        Packet::IcmpError { tuple, .. } => Some((tuple, 0, None)),
        _ => None,
    }
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

impl Judge<'_> {
    fn packet(f: &mut FrameCheck, read: impl FnOnce(&mut [u8]) -> usize) -> Packet {
        *f.packet.get_or_insert_with(|| {
            let mut prefix = [0u8; PREFIX_LEN];
            let n = read(&mut prefix);
            Packet::parse(&prefix[..n])
        })
    }

    fn tracked(&self, f: &mut FrameCheck, t: &Tuple, flags: u8, in_port: PortId) -> Tracked {
        *f.tracked
            .get_or_insert_with(|| self.conntrack.track(self.zone, t, flags, in_port, self.now))
    }

    /// The checks at the port the frame came in on (`in_port`, with rules
    /// `r`): its source address, then its egress rules. `read` copies the
    /// frame's first bytes into the buffer given and returns how many.
    pub fn from_port(
        &self,
        f: &mut FrameCheck,
        read: impl FnOnce(&mut [u8]) -> usize,
        in_port: PortId,
        r: &PortRules,
    ) -> Result<Decision, DropReason> {
        let p = Self::packet(f, read);
        let src_ok = match p {
            Packet::NotIp => return Ok(Decision::Exempt),
            Packet::Malformed => return Err(DropReason::BadHeader),
            Packet::Arp { sender } => {
                return r
                    .owns_v4(sender)
                    .then_some(Decision::Exempt)
                    .ok_or(DropReason::SpoofedIp)
            }
            Packet::Neighbour { src } => {
                return r
                    .owns_v6(src)
                    .then_some(Decision::Exempt)
                    .ok_or(DropReason::SpoofedIp)
            }
            Packet::Flow { tuple, .. } | Packet::IcmpError { tuple, .. } => {
                if tuple.v6 {
                    r.owns_v6(tuple.src)
                } else {
                    r.owns_v4(tuple.src as u32)
                }
            }
        };
        if !src_ok {
            return Err(DropReason::SpoofedIp);
        }
        let Some(rules) = &r.egress else {
            return Ok(Decision::Exempt);
        };
        self.judge(f, &p, in_port, in_port, rules, Direction::Egress)
    }

    /// The checks at a port the frame goes to (`to`, with rules `r`, if
    /// any), once it passed those where it came in (`in_port`, with rules
    /// or not): that port's ingress rules; then the connection is recorded,
    /// charged to `owner` (the quota of the port it came in on), if no
    /// earlier step of this frame did. Called only where one of the two
    /// ports has rules.
    #[allow(clippy::too_many_arguments)]
    pub fn to_port(
        &self,
        f: &mut FrameCheck,
        read: impl FnOnce(&mut [u8]) -> usize,
        in_port: PortId,
        to: PortId,
        r: Option<&PortRules>,
        owner: &Arc<CtQuota>,
    ) -> Result<Decision, DropReason> {
        let p = Self::packet(f, read);
        let decision = match (r.and_then(|r| r.ingress.as_ref()), p) {
            (_, Packet::NotIp | Packet::Arp { .. } | Packet::Neighbour { .. }) => {
                return Ok(Decision::Exempt)
            }
            (Some(_), Packet::Malformed) => return Err(DropReason::BadHeader),
            (None, Packet::Malformed) => return Ok(Decision::Exempt),
            (Some(rules), _) => self.judge(f, &p, in_port, to, rules, Direction::Ingress)?,
            (None, _) => Decision::Exempt,
        };
        // A new connection both ends allowed: recorded once, so that its
        // further packets and its replies pass.
        if let (Some((t, flags, _)), false) = (flow_facts(&p), f.opened) {
            if matches!(p, Packet::Flow { .. })
                && self.tracked(f, &t, flags, in_port) == Tracked::New
            {
                f.opened = true;
                self.conntrack
                    .open(self.zone, &t, flags, in_port, owner, self.now)
                    .map_err(|e| match e {
                        Full::Port | Full::Table => DropReason::ConntrackFull,
                    })?;
            }
        }
        Ok(decision)
    }

    /// Judges `p` against `rules` (`port`'s, in `direction`): a packet of a
    /// tracked connection or an ICMP error about one passes, another
    /// passes by the first rule that allows it.
    fn judge(
        &self,
        f: &mut FrameCheck,
        p: &Packet,
        in_port: PortId,
        port: PortId,
        rules: &RuleSet,
        direction: Direction,
    ) -> Result<Decision, DropReason> {
        let Some((t, flags, dport)) = flow_facts(p) else {
            return Ok(Decision::Exempt);
        };
        let known = match p {
            Packet::IcmpError { about, .. } => self.conntrack.related(self.zone, about, self.now),
            _ => self.tracked(f, &t, flags, in_port) == Tracked::Established,
        };
        if known {
            return Ok(Decision::Established);
        }
        let peer = match direction {
            Direction::Ingress => t.src,
            Direction::Egress => t.dst,
        };
        match rules.allows(t.v6, peer, t.proto, dport) {
            Some(rule) => Ok(Decision::Rule {
                port,
                direction,
                rule,
            }),
            None => Err(match direction {
                Direction::Ingress => DropReason::PolicyIngress,
                Direction::Egress => DropReason::PolicyEgress,
            }),
        }
    }
}
