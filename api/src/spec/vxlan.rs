//! The vxlan part of a port spec: a VXLAN tunnel (RFC 7348) to one remote
//! VTEP, as VPP's `vxlan_tunnel` and an Open vSwitch `vxlan` port are. The
//! tunnels of a bridge join it to other nodes over any IP network: frames
//! for a MAC learned on a tunnel go to its VTEP; flooded frames go to every
//! tunnel of the bridge (head-end replication); a frame from one tunnel is
//! never sent on to another (split horizon: the VTEPs form a full mesh).
//!
//! The encapsulated frames go through the host's IP stack, from a UDP
//! socket bound to `local`:`dstport` that every tunnel of that address
//! shares.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{KindOptions, SocketAddr, SpecError};

/// The IANA port for VXLAN.
pub const VXLAN_PORT: u16 = 4789;
/// The largest VNI (24 bits).
pub const VNI_MAX: u32 = 0x00ff_ffff;

/// A vxlan port: the tunnel to `remote` for VNI `vni`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VxlanSpec {
    /// The remote VTEP's address (a node's).
    pub remote: IpAddr,
    /// The VXLAN network identifier, 0 to 16777215.
    pub vni: u32,
    /// This node's VTEP address: an address of the host the encapsulated
    /// frames leave from and arrive at.
    pub local: IpAddr,
    /// The UDP port, on both ends (default 4789).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dstport: Option<u16>,
}

impl VxlanSpec {
    /// The UDP port, on both ends.
    pub fn port(&self) -> u16 {
        self.dstport.unwrap_or(VXLAN_PORT)
    }
}

/// Checks that `ip` (field `field`) can be a VTEP's address: a unicast
/// address, not unspecified.
fn validate_vtep(field: String, ip: IpAddr) -> Result<(), SpecError> {
    let bad = match ip {
        IpAddr::V4(a) => a.is_unspecified() || a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
    };
    if bad {
        return Err(SpecError::new(
            field,
            format!("{ip}: a VTEP's address is a unicast address"),
        ));
    }
    Ok(())
}

impl KindOptions for VxlanSpec {
    fn kind_name(&self) -> &'static str {
        "vxlan"
    }
    fn socket_addr_mut(&mut self) -> Option<&mut SocketAddr> {
        None
    }
    fn queues(&self) -> Option<u16> {
        None
    }
    fn remote(&self) -> Option<IpAddr> {
        Some(self.remote)
    }
    fn local(&self) -> Option<IpAddr> {
        Some(self.local)
    }
    /// A whole node's stations lie behind a tunnel: no limit.
    fn default_mac_limit(&self) -> u32 {
        0
    }

    fn validate(&self, at: &str) -> Result<(), SpecError> {
        validate_vtep(format!("{at}remote"), self.remote)?;
        validate_vtep(format!("{at}local"), self.local)?;
        if self.remote.is_ipv4() != self.local.is_ipv4() {
            return Err(SpecError::new(
                format!("{at}remote"),
                format!(
                    "{} and the local address {} are of different IP versions",
                    self.remote, self.local
                ),
            ));
        }
        if self.remote == self.local {
            return Err(SpecError::new(
                format!("{at}remote"),
                format!("{}: the local address itself", self.remote),
            ));
        }
        if self.vni > VNI_MAX {
            return Err(SpecError::new(
                format!("{at}vni"),
                format!("{} is out of range 0..={VNI_MAX}", self.vni),
            ));
        }
        if self.dstport == Some(0) {
            return Err(SpecError::new(format!("{at}dstport"), "0 is no UDP port"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(remote: &str, local: &str, vni: u32) -> VxlanSpec {
        VxlanSpec {
            remote: remote.parse().unwrap(),
            vni,
            local: local.parse().unwrap(),
            dstport: None,
        }
    }

    #[test]
    fn bad_tunnels_name_their_field() {
        let field = |s: VxlanSpec| s.validate("port.").unwrap_err().field;
        assert!(spec("10.0.0.2", "10.0.0.1", 42).validate("").is_ok());
        assert!(spec("fd00::2", "fd00::1", VNI_MAX).validate("").is_ok());
        assert_eq!(field(spec("10.0.0.2", "10.0.0.1", VNI_MAX + 1)), "port.vni");
        assert_eq!(field(spec("239.1.1.1", "10.0.0.1", 1)), "port.remote");
        assert_eq!(field(spec("10.0.0.2", "0.0.0.0", 1)), "port.local");
        assert_eq!(field(spec("fd00::2", "10.0.0.1", 1)), "port.remote");
        assert_eq!(field(spec("10.0.0.1", "10.0.0.1", 1)), "port.remote");
        let mut s = spec("10.0.0.2", "10.0.0.1", 1);
        s.dstport = Some(0);
        assert_eq!(field(s), "port.dstport");
    }
}
