//! What to change on the switch: the overlays' VTEPs the nodes call for
//! against the ones it has.

use std::collections::BTreeSet;
use std::net::IpAddr;

use switchyard_api::{BridgeInfo, VtepInfo};

/// A remote VTEP of an overlay.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Vtep {
    /// The overlay (its bridge's name).
    pub overlay: String,
    /// The remote node's address.
    pub remote: IpAddr,
    /// The address its tunnels leave from: this node's VTEP where it is
    /// of the remote's IP version; else the switch picks (the overlay's
    /// `local`, or the route's).
    pub local: Option<IpAddr>,
}

/// The VTEPs to add and to take out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes an overlay lacks.
    pub add: Vec<Vtep>,
    /// VTEPs of no node (any more).
    pub del: Vec<Vtep>,
}

impl Plan {
    /// Whether the switch is as the nodes call for.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.del.is_empty()
    }
}

/// The switch's overlays (the bridges `[overlays]` made).
pub fn overlays(bridges: &[BridgeInfo]) -> Vec<String> {
    bridges
        .iter()
        .filter(|b| b.overlay.is_some())
        .map(|b| b.name.clone())
        .collect()
}

/// Every overlay of `overlays` joined to every address of `remotes`, from
/// `local` where it is given (to the remotes of its IP version), and
/// nothing else: a VTEP of `current` no node has any more goes, unless the
/// config names it (the config's remotes are the operator's, and the
/// switch refuses to delete them); one that leaves from another address
/// than `local` is added again (the switch makes its tunnels again from
/// `local`). VTEPs of other overlays stay as they are.
pub fn plan(
    overlays: &[String],
    remotes: &BTreeSet<IpAddr>,
    local: Option<IpAddr>,
    current: &[VtepInfo],
) -> Plan {
    let local_for = |remote: &IpAddr| local.filter(|l| l.is_ipv4() == remote.is_ipv4());
    let have: BTreeSet<(&str, IpAddr)> = current
        .iter()
        .filter(|v| v.from_config || local_for(&v.remote).is_none_or(|l| l == v.local))
        .map(|v| (v.overlay.as_str(), v.remote))
        .collect();
    let mut p = Plan::default();
    for o in overlays {
        for r in remotes {
            if !have.contains(&(o.as_str(), *r)) {
                p.add.push(Vtep {
                    overlay: o.clone(),
                    remote: *r,
                    local: local_for(r),
                });
            }
        }
    }
    for v in current {
        if overlays.contains(&v.overlay) && !v.from_config && !remotes.contains(&v.remote) {
            p.del.push(Vtep {
                overlay: v.overlay.clone(),
                remote: v.remote,
                local: None,
            });
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vtep(overlay: &str, remote: &str, from_config: bool) -> VtepInfo {
        VtepInfo {
            overlay: overlay.into(),
            remote: remote.parse().unwrap(),
            local: "10.0.0.1".parse().unwrap(),
            tunnels: vec![],
            link_up: true,
            from_config,
            stations: 0,
        }
    }

    fn ips(a: &[&str]) -> BTreeSet<IpAddr> {
        a.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn names(v: &[Vtep]) -> Vec<String> {
        v.iter()
            .map(|v| format!("{} {}", v.overlay, v.remote))
            .collect()
    }

    #[test]
    fn joins_the_nodes_and_leaves_the_config_and_other_overlays_alone() {
        let current = [
            vtep("a", "10.0.0.2", false),
            vtep("a", "10.0.0.9", false),
            vtep("a", "10.0.0.8", true),
            vtep("other", "10.0.0.7", false),
        ];
        let p = plan(
            &["a".into(), "b".into()],
            &ips(&["10.0.0.2", "10.0.0.3"]),
            None,
            &current,
        );
        assert_eq!(names(&p.add), ["a 10.0.0.3", "b 10.0.0.2", "b 10.0.0.3"]);
        assert_eq!(names(&p.del), ["a 10.0.0.9"]);
        // A node the config already joins is not added again.
        let p = plan(&["a".into()], &ips(&["10.0.0.8"]), None, &current);
        assert!(p.add.is_empty());
        assert_eq!(names(&p.del), ["a 10.0.0.2", "a 10.0.0.9"]);
        assert!(plan(&[], &ips(&["10.0.0.2"]), None, &current).is_empty());
    }

    /// This node's VTEP address changed (its annotation, its address):
    /// the VTEPs leaving from another address are added again, those of
    /// the config stay as the config makes them.
    #[test]
    fn vteps_leaving_from_another_address_are_added_again() {
        let current = [vtep("a", "10.0.0.2", false), vtep("a", "10.0.0.8", true)];
        let remotes = ips(&["10.0.0.2", "10.0.0.8"]);
        let p = plan(&["a".into()], &remotes, "10.0.0.1".parse().ok(), &current);
        assert!(p.is_empty(), "{p:?}");
        let p = plan(&["a".into()], &remotes, "10.1.0.1".parse().ok(), &current);
        assert_eq!(names(&p.add), ["a 10.0.0.2"]);
        assert_eq!(p.add[0].local, "10.1.0.1".parse().ok());
        assert!(p.del.is_empty());
        // A local address of the other IP version is none for it.
        let p = plan(&["a".into()], &remotes, "fd00::1".parse().ok(), &current);
        assert!(p.is_empty(), "{p:?}");
    }
}
