//! The one place that lists the port kinds: a spec's kind to its port.
//! Adding a kind is its module and one line here.

use std::sync::Arc;

use switchyard_api::{KindSpec, PortSpec};

use super::socket::Listeners;
use super::{af_packet, af_xdp, memif, tap, vhost_user, vxlan, Port};

/// Builds the port a validated spec describes (not started yet); a
/// vhost-user port that names no queue count offers `queues` (one per
/// worker, as OVS-DPDK); a port on a socket the switch listens on joins
/// it in `listeners`. The one place that lists every port kind.
pub fn build(spec: &PortSpec, queues: u16, listeners: &Arc<Listeners>) -> Box<dyn Port> {
    let name = spec.name.as_str();
    // A trunk of some VLAN sends and receives tagged frames.
    let carries_tags = spec
        .trunk
        .as_ref()
        .is_some_and(|t| t.ranges().iter().any(|&(_, hi)| hi > 0));
    match &spec.kind {
        KindSpec::Memif(m) => memif::port(name, m, listeners),
        KindSpec::VhostUser(v) => vhost_user::port(name, v, queues, listeners),
        KindSpec::Tap(t) => tap::port(name, t),
        KindSpec::AfPacket(a) => af_packet::port(name, a, switchyard_api::stable_hash(name) as u16),
        KindSpec::AfXdp(x) => af_xdp::port(name, x, carries_tags),
        KindSpec::Vxlan(v) => vxlan::port(name, v),
    }
}
