//! VLAN membership of a port, as the switching core applies it (the
//! [`VlanSet`] of a spec comes from `switchyard_api`).
//!
//! Inside a bridge every frame belongs to one VLAN; VLAN 0 stands for
//! untagged frames. A port is either
//! - an **access** port of one VLAN: it carries that VLAN's frames untagged
//!   (access VLAN 0 is an *untagged-only* port, the default: it carries the
//!   untagged frames of its bridge and nothing else); or
//! - a **trunk** carrying the VLANs of a [`VlanSet`]: tagged frames keep
//!   their tag, and untagged frames (VLAN 0) pass only when the set holds 0,
//!   as with Open vSwitch's `trunks` column.

use std::sync::Arc;

pub use switchyard_api::vlan::{VlanSet, VlanSetError};

/// How a port takes part in its bridge's VLANs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VlanMode {
    /// Untagged frames of this VLAN (0: untagged-only, the default);
    /// tagged frames arriving are dropped, priority tags are stripped.
    Access(u16),
    /// Tagged frames of these VLANs, untagged ones when the set holds 0.
    Trunk(Arc<VlanSet>),
}

impl Default for VlanMode {
    fn default() -> VlanMode {
        VlanMode::Access(0)
    }
}

impl VlanMode {
    /// From a port's `vlan` (access) and `trunk` settings; neither is an
    /// untagged-only port. Callers have refused both at once.
    pub fn from_spec(vlan: Option<u16>, trunk: Option<&VlanSet>) -> VlanMode {
        match (vlan, trunk) {
            (Some(v), _) => VlanMode::Access(v),
            (None, Some(t)) => VlanMode::Trunk(Arc::new(t.clone())),
            (None, None) => VlanMode::Access(0),
        }
    }

    /// The bridge VLAN of a frame arriving with VLAN `vid` (0 when untagged
    /// or priority-tagged), or `None` when the port does not carry it.
    #[inline]
    pub fn ingress(&self, vid: u16) -> Option<u16> {
        match self {
            VlanMode::Access(v) => (vid == 0).then_some(*v),
            VlanMode::Trunk(set) => set.contains(vid).then_some(vid),
        }
    }

    /// Whether a frame of bridge VLAN `domain` leaves through this port,
    /// and if so whether it leaves tagged.
    #[inline]
    pub fn egress(&self, domain: u16) -> Option<bool> {
        match self {
            VlanMode::Access(v) => (*v == domain).then_some(false),
            VlanMode::Trunk(set) => set.contains(domain).then_some(domain != 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_admit_and_tag_as_ovs_does() {
        let untagged = VlanMode::default();
        assert_eq!(untagged.ingress(0), Some(0));
        assert_eq!(
            untagged.ingress(100),
            None,
            "no tagged frames on a pod port"
        );
        assert_eq!(untagged.egress(0), Some(false));
        assert_eq!(untagged.egress(100), None);
        let access = VlanMode::Access(100);
        assert_eq!(access.ingress(0), Some(100));
        assert_eq!(access.ingress(200), None);
        assert_eq!(access.egress(100), Some(false));
        assert_eq!(access.egress(0), None);
        let trunk = VlanMode::from_spec(None, Some(&"100,200".parse().unwrap()));
        assert_eq!(trunk.ingress(100), Some(100));
        assert_eq!(trunk.ingress(0), None, "untagged only when 0 is listed");
        assert_eq!(trunk.ingress(300), None);
        assert_eq!(trunk.egress(200), Some(true));
        assert_eq!(trunk.egress(0), None);
        let all = VlanMode::from_spec(None, Some(&VlanSet::all()));
        assert_eq!(all.ingress(0), Some(0));
        assert_eq!(all.egress(0), Some(false));
        assert_eq!(all.egress(7), Some(true));
    }
}
