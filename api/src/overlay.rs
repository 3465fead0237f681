//! Node-local addresses of an overlay's networks: the overlay's subnets
//! (one per family) split in slices, one per node, so that the networks
//! that name no IPAM of their own get addresses no other node hands out
//! (as flannel gives each node a subnet of the network's). The node agent
//! claims a slice for its node ([`Request::OverlaySlice`]); the CNI
//! plugin delegates to `host-local` with its ranges
//! ([`OverlayIpam::ranges`]).
//!
//! [`Request::OverlaySlice`]: crate::Request::OverlaySlice

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// The default prefix of a node's IPv4 slice: 254 pods.
pub const NODE_PREFIX_V4: u8 = 24;
/// The default prefix of a node's IPv6 slice.
pub const NODE_PREFIX_V6: u8 = 64;
/// Most slices a subnet is split in (the node agent's search is linear).
pub const MAX_SLICES: u32 = 1 << 16;

/// An overlay's addresses for networks without IPAM of their own (daemon
/// config `[overlays] NAME = { ..., ipam = { subnet = "10.66.0.0/16" } }`,
/// which refuses keys it does not know; as the API reports it, a field a
/// newer switch adds is left unread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlayIpam {
    /// The IPv4 subnet: every pod's address has its prefix (the overlay is
    /// one link), from its node's slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ipv4Net>,
    /// The prefix length of a node's IPv4 slice (default 24).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_prefix: Option<u8>,
    /// The IPv6 subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet6: Option<Ipv6Net>,
    /// The prefix length of a node's IPv6 slice (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_prefix6: Option<u8>,
}

/// A node's slice as the switch persists it: with the split it is a
/// slice of (a slice of another split is other addresses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedSlice {
    /// The slice.
    pub slice: u32,
    /// The overlay's split then.
    pub split: OverlayIpam,
}

/// One range a node hands out, as `host-local` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamRange {
    /// The overlay's subnet (the pod's prefix).
    pub subnet: IpNet,
    /// The node's first address.
    pub range_start: IpAddr,
    /// Its last.
    pub range_end: IpAddr,
}

/// An overlay's node-local addresses as the switch reports them
/// ([`crate::BridgeInfo::ipam`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIpam {
    /// The overlay's split.
    pub config: OverlayIpam,
    /// This node's slice, once the node agent claimed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<u32>,
    /// Its ranges (one per family; empty without a slice).
    #[serde(default)]
    pub ranges: Vec<IpamRange>,
}

/// Why an overlay's `ipam` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// Neither subnet is given.
    #[error("ipam: names no subnet (subnet, subnet6)")]
    NoSubnet,
    /// A subnet written with host bits (`10.66.1.0/16`).
    #[error("ipam.{field}: {subnet} has host bits set (the subnet is {network})")]
    HostBits {
        /// `subnet` or `subnet6`.
        field: &'static str,
        /// As written.
        subnet: IpNet,
        /// Its network.
        network: IpNet,
    },
    /// A slice prefix not longer than its subnet's, or too long.
    #[error("ipam.{field}: /{prefix} is not a slice of /{subnet} of at least {min} addresses")]
    Prefix {
        /// `node_prefix` or `node_prefix6`.
        field: &'static str,
        /// The slices' prefix.
        prefix: u8,
        /// The subnet's.
        subnet: u8,
        /// The fewest addresses a slice holds.
        min: u32,
    },
    /// More slices than [`MAX_SLICES`].
    #[error("ipam.{field}: /{prefix} splits the subnet in more than {MAX_SLICES} slices")]
    TooMany {
        /// `node_prefix` or `node_prefix6`.
        field: &'static str,
        /// The slices' prefix.
        prefix: u8,
    },
    /// A slice beyond the last.
    #[error("slice {slice}: the overlay's subnets have {slices} slices")]
    NoSuchSlice {
        /// The slice asked.
        slice: u32,
        /// How many there are.
        slices: u32,
    },
}

impl OverlayIpam {
    fn v4_prefix(&self) -> u8 {
        self.node_prefix.unwrap_or(NODE_PREFIX_V4)
    }

    fn v6_prefix(&self) -> u8 {
        self.node_prefix6.unwrap_or(NODE_PREFIX_V6)
    }

    /// Checks the split: a subnet, slices of at least 4 addresses, at most
    /// [`MAX_SLICES`] of them.
    pub fn validate(&self) -> Result<(), IpamError> {
        if self.subnet.is_none() && self.subnet6.is_none() {
            return Err(IpamError::NoSubnet);
        }
        let check = |field, subnet: u8, prefix: u8, max: u8| {
            if prefix <= subnet || prefix > max {
                return Err(IpamError::Prefix {
                    field,
                    prefix,
                    subnet,
                    min: 4,
                });
            }
            if u32::from(prefix - subnet) > MAX_SLICES.trailing_zeros() {
                return Err(IpamError::TooMany { field, prefix });
            }
            Ok(())
        };
        let whole = |field, subnet: IpNet| {
            if subnet != subnet.trunc() {
                return Err(IpamError::HostBits {
                    field,
                    subnet,
                    network: subnet.trunc(),
                });
            }
            Ok(())
        };
        if let Some(s) = self.subnet {
            whole("subnet", IpNet::V4(s))?;
            check("node_prefix", s.prefix_len(), self.v4_prefix(), 30)?;
        }
        if let Some(s) = self.subnet6 {
            whole("subnet6", IpNet::V6(s))?;
            check("node_prefix6", s.prefix_len(), self.v6_prefix(), 126)?;
        }
        Ok(())
    }

    /// How many slices there are: as many as each family has (the fewer
    /// of the two).
    pub fn slices(&self) -> u32 {
        let v4 = self
            .subnet
            .map(|s| 1u32 << (self.v4_prefix() - s.prefix_len()).min(31));
        let v6 = self
            .subnet6
            .map(|s| 1u32 << (self.v6_prefix() - s.prefix_len()).min(31));
        match (v4, v6) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(0),
        }
    }

    /// The ranges of slice `slice`, one per family: the slice's
    /// addresses but its first (an IPv6 subnet's router anycast address,
    /// the IPv4 slice's `.0`) and the IPv4 subnet's broadcast, each with
    /// the subnet's prefix.
    pub fn ranges(&self, slice: u32) -> Result<Vec<IpamRange>, IpamError> {
        let slices = self.slices();
        if slice >= slices {
            return Err(IpamError::NoSuchSlice { slice, slices });
        }
        let last = slice + 1 == slices;
        let mut out = Vec::new();
        if let Some(s) = self.subnet {
            let size = 1u64 << (32 - self.v4_prefix());
            let base = u64::from(u32::from(s.network())) + u64::from(slice) * size;
            let start = base + 1;
            let end = base + size - 1 - u64::from(last);
            let v4 = |a: u64| IpAddr::V4(Ipv4Addr::from(a as u32));
            out.push(IpamRange {
                subnet: IpNet::V4(s),
                range_start: v4(start),
                range_end: v4(end),
            });
        }
        if let Some(s) = self.subnet6 {
            let size = 1u128 << (128 - self.v6_prefix());
            let base = u128::from(s.network()) + u128::from(slice) * size;
            let start = base + 1;
            let end = base + (size - 1);
            let v6 = |a: u128| IpAddr::V6(Ipv6Addr::from(a));
            out.push(IpamRange {
                subnet: IpNet::V6(s),
                range_start: v6(start),
                range_end: v6(end),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(v4: Option<&str>, v6: Option<&str>) -> OverlayIpam {
        OverlayIpam {
            subnet: v4.map(|s| s.parse().unwrap()),
            node_prefix: None,
            subnet6: v6.map(|s| s.parse().unwrap()),
            node_prefix6: None,
        }
    }

    #[test]
    fn slices_are_disjoint_and_keep_the_subnets_prefix() {
        let i = ipam(Some("10.66.0.0/16"), Some("fd66::/48"));
        i.validate().unwrap();
        assert_eq!(i.slices(), 256);
        let r = i.ranges(0).unwrap();
        assert_eq!(r[0].subnet.to_string(), "10.66.0.0/16");
        assert_eq!(
            (r[0].range_start.to_string(), r[0].range_end.to_string()),
            ("10.66.0.1".into(), "10.66.0.255".into())
        );
        assert_eq!(
            (r[1].range_start.to_string(), r[1].range_end.to_string()),
            ("fd66::1".into(), "fd66::ffff:ffff:ffff:ffff".into())
        );
        let r = i.ranges(5).unwrap();
        assert_eq!(
            (r[0].range_start.to_string(), r[0].range_end.to_string()),
            ("10.66.5.1".into(), "10.66.5.255".into())
        );
        assert_eq!(r[1].range_start.to_string(), "fd66:0:0:5::1");
        // The last IPv4 slice leaves the broadcast out.
        let r = i.ranges(255).unwrap();
        assert_eq!(r[0].range_end.to_string(), "10.66.255.254");
        assert_eq!(
            i.ranges(256),
            Err(IpamError::NoSuchSlice {
                slice: 256,
                slices: 256
            })
        );
    }

    #[test]
    fn bad_splits_name_their_field() {
        assert_eq!(ipam(None, None).validate(), Err(IpamError::NoSubnet));
        let mut i = ipam(Some("10.66.0.0/24"), None);
        assert!(matches!(
            i.validate(),
            Err(IpamError::Prefix {
                field: "node_prefix",
                ..
            })
        ));
        i.node_prefix = Some(31);
        assert!(i.validate().is_err());
        i.node_prefix = Some(26);
        i.validate().unwrap();
        assert_eq!(i.slices(), 4);
        assert!(matches!(
            ipam(Some("10.66.1.0/16"), None).validate(),
            Err(IpamError::HostBits {
                field: "subnet",
                ..
            })
        ));
        let i = ipam(None, Some("fd66::/24"));
        assert!(matches!(
            i.validate(),
            Err(IpamError::TooMany {
                field: "node_prefix6",
                ..
            })
        ));
    }
}
