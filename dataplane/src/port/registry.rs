//! The one list of the port kinds: `port_kinds!`, invoked once in
//! `port/mod.rs`, declares each kind's module and makes [`build`](super::build),
//! which turns a spec's kind into its port. Adding a kind is its module and
//! one line there.

use std::sync::Arc;

use switchyard_api::PortSpec;

use super::socket::Listeners;

/// What every kind's `port` constructor gets besides its own spec: the
/// port's whole spec, the daemon's workers and its table of listening
/// sockets.
pub struct Build<'a> {
    /// The port's spec (its name, VLANs: a trunk's uplink keeps tags).
    pub spec: &'a PortSpec,
    /// Workers (a vhost-user port that names no queue count offers one
    /// queue pair per worker, as OVS-DPDK).
    pub workers: u16,
    /// The sockets the switch listens on, which a listening port joins.
    pub listeners: &'a Arc<Listeners>,
}

impl Build<'_> {
    /// The port's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Whether the port sends and receives tagged frames (a trunk of some
    /// VLAN).
    pub fn carries_tags(&self) -> bool {
        self.spec
            .trunk
            .as_ref()
            .is_some_and(|t| t.ranges().iter().any(|&(_, hi)| hi > 0))
    }
}

/// Declares the port kinds, one line each: `Variant => module`, the
/// variant the API's `KindSpec`'s, the module `port/<module>/` with its
/// `pub fn port(spec, &Build) -> Box<dyn Port>`. Makes each kind's module
/// and `build`.
macro_rules! port_kinds {
    ($($variant:ident => $module:ident,)*) => {
        $(pub mod $module;)*

        /// Builds the port a validated spec describes (not started yet).
        pub fn build(b: &registry::Build<'_>) -> Box<dyn Port> {
            match &b.spec.kind {
                $(switchyard_api::KindSpec::$variant(s) => $module::port(s, b),)*
            }
        }
    };
}

pub(crate) use port_kinds;
