//! Fills a node's Switchyard overlays with the other nodes of the cluster.
//!
//! Each node's switch has the overlays of the DaemonSet's config
//! (`[overlays]`); a remote VTEP of an overlay is another node's address.
//! `switchyard-vtep-sync` runs beside the switch, watches the cluster's
//! Nodes (those a label selector picks: the nodes that run Switchyard) and
//! keeps every overlay joined to each of them, by their VTEP address
//! (published in an annotation, else their InternalIP), through the
//! switch's `vtep add` and `vtep del`, as flannel and Calico-VPP fill their
//! VXLAN peers from the Nodes. It publishes its own node's VTEP address,
//! and the tunnels leave from it.
//!
//! [`nodes`] turns Nodes into the addresses to join; [`plan`] compares them
//! with the switch's VTEPs and says what to add and take out.
//!
//! The same agent enforces MultiNetworkPolicy on the node's ports:
//! [`policy`] resolves the policies that select a port's pod into the
//! address-and-port rules the switch judges frames by.
//!
//! [`slices`] claims the node's slice of each overlay's addresses (the
//! overlay's `ipam`) as a Lease, which the switch then hands out.
//!
//! [`stations`] tells the switch which pods are behind each remote VTEP
//! (their MACs and addresses, from the API), so that it answers ARP and
//! neighbour solicitations for them instead of flooding.

pub mod nodes;
pub mod plan;
pub mod policy;
pub mod slices;
pub mod stations;
