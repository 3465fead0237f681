//! Switchyard: a userspace L2 switch for Kubernetes pods.
//!
//! Layers, from the wire up:
//! - [`wire`]: byte-level views of Ethernet headers and memif messages;
//! - [`vlan`]: a port's VLAN membership (access, untagged-only, trunk);
//! - [`port`]: the [`port::Port`] and queue traits, and the memif port kind;
//! - [`switch`]: bridge domains, MAC learning, flooding and VLANs;
//! - [`dataplane`] and [`worker`]: state shared with, and the loop of, the
//!   poll-mode workers;
//! - [`control`]: the daemon, its JSON control API and persisted state;
//! - [`config`]: the TOML configuration.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod config;
pub mod control;
pub mod dataplane;
pub mod eventfd;
pub mod port;
pub mod reactor;
pub mod switch;
pub mod vlan;
pub mod wire;
pub mod worker;
