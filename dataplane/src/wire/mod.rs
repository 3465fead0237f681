//! Wire formats as thin views over byte buffers.
//!
//! Every type here borrows a `&[u8]` (or `&mut [u8]`) and reads fields at
//! named offsets, in the style of smoltcp's `wire` module: no packed structs,
//! no transmutes, and no allocation. Parsing untrusted bytes goes through a
//! `new_checked` constructor that validates the length once.

pub mod checksum;
pub mod ethernet;
pub mod flow;
pub mod ip;
pub mod memif;
pub mod virtio_net;
pub mod vxlan;

pub use ethernet::{EthernetFrame, MacAddr, VlanTag};
