//! Each node's slice of an overlay's addresses, claimed in the cluster as
//! a `coordination.k8s.io/v1` Lease per slice: creating an object is the
//! API server's one atomic step (a second create of a name is refused,
//! 409), so two nodes that claim the same slice at once cannot both have
//! it, which annotations on each node's own object could not promise. A
//! Lease names its holder (`spec.holderIdentity`, the node) and is owned
//! by the node's object (`metadata.ownerReferences`), so the garbage
//! collector deletes it with the node; the agents also free the slices of
//! nodes that are gone. The switch keeps the node's slice across restarts
//! and the Lease across the agent's.

use std::collections::BTreeSet;

use serde_json::{json, Value};

/// The label a slice's Lease carries: the overlay's name.
pub const OVERLAY_LABEL: &str = "switchyard.io/overlay";

/// The name of overlay `overlay`'s slice `slice`'s Lease.
pub fn lease_name(overlay: &str, slice: u32) -> String {
    format!("switchyard-{overlay}-slice-{slice}")
}

/// A slice's Lease as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The Lease's name.
    pub name: String,
    /// The slice.
    pub slice: u32,
    /// The node holding it.
    pub holder: String,
    /// The UID of the node object that owns it, if any.
    pub owner_uid: Option<String>,
}

impl Claim {
    /// Reads a listed Lease of overlay `overlay` (`None`: not one of its
    /// slices').
    pub fn from_lease(overlay: &str, lease: &Value) -> Option<Claim> {
        let name = lease["metadata"]["name"].as_str()?;
        let slice = name
            .strip_prefix(&format!("switchyard-{overlay}-slice-"))?
            .parse()
            .ok()?;
        let owner_uid = lease["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["kind"] == "Node")
            .and_then(|o| o["uid"].as_str())
            .map(str::to_string);
        Some(Claim {
            name: name.to_string(),
            slice,
            holder: lease["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            owner_uid,
        })
    }
}

/// What a node does about its slice of an overlay, given the claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It holds this slice: the switch hands it out.
    Hold(u32),
    /// It holds none: claim this one (the lowest free).
    Claim(u32),
    /// Every slice is held.
    Exhausted,
}

/// What node `node` (UID `uid`) does, with `claims` listed and `slices`
/// in all. A claim of the node's name owned by another node object (one
/// deleted and made again, whose claim the garbage collector has yet to
/// delete) is not its own.
pub fn step(node: &str, uid: &str, claims: &[Claim], slices: u32) -> Step {
    let own = claims
        .iter()
        .filter(|c| c.holder == node && c.owner_uid.as_deref().is_none_or(|u| u == uid))
        .map(|c| c.slice)
        .min();
    if let Some(s) = own.filter(|s| *s < slices) {
        return Step::Hold(s);
    }
    let taken: BTreeSet<u32> = claims.iter().map(|c| c.slice).collect();
    match (0..slices).find(|s| !taken.contains(s)) {
        Some(s) => Step::Claim(s),
        None => Step::Exhausted,
    }
}

/// The claims to delete: those of nodes that are not among `nodes` (a
/// node deleted), and those of node `node` other than `kept` (its own
/// claimed twice, or by its previous object).
pub fn stale<'a>(
    node: &str,
    kept: Option<u32>,
    claims: &'a [Claim],
    nodes: &BTreeSet<String>,
) -> Vec<&'a Claim> {
    claims
        .iter()
        .filter(|c| {
            if c.holder == node {
                Some(c.slice) != kept
            } else {
                !nodes.contains(&c.holder)
            }
        })
        .collect()
}

/// The Lease that claims `slice` of `overlay` for node `node` (UID `uid`),
/// owned by the node's object.
pub fn lease(namespace: &str, overlay: &str, slice: u32, node: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(overlay, slice),
            "namespace": namespace,
            "labels": { OVERLAY_LABEL: overlay },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": uid,
            }],
        },
        "spec": { "holderIdentity": node },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(slice: u32, holder: &str, uid: &str) -> Claim {
        Claim::from_lease("ov", &lease("ns", "ov", slice, holder, uid)).unwrap()
    }

    #[test]
    fn a_node_keeps_its_slice_or_claims_the_lowest_free() {
        let claims = [
            claim(0, "a", "ua"),
            claim(1, "b", "ub"),
            claim(3, "c", "uc"),
        ];
        assert_eq!(step("b", "ub", &claims, 4), Step::Hold(1));
        assert_eq!(step("d", "ud", &claims, 4), Step::Claim(2));
        assert_eq!(step("d", "ud", &claims[..2], 2), Step::Exhausted);
        // The node made again: its old object's claim is not its own.
        assert_eq!(step("b", "ub2", &claims, 4), Step::Claim(2));
        // A slice beyond a smaller split: claimed anew.
        assert_eq!(step("c", "uc", &claims, 3), Step::Claim(2));
        // Another overlay's, or not a slice: not read.
        assert_eq!(
            Claim::from_lease("other", &lease("ns", "ov", 1, "a", "ua")),
            None
        );
    }

    #[test]
    fn the_claims_of_nodes_gone_and_a_nodes_extra_ones_are_stale() {
        let claims = [
            claim(0, "a", "ua"),
            claim(1, "gone", "ug"),
            claim(2, "a", "ua"),
        ];
        let nodes: BTreeSet<String> = ["a".to_string()].into();
        let names: Vec<&str> = stale("a", Some(0), &claims, &nodes)
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["switchyard-ov-slice-1", "switchyard-ov-slice-2"]);
    }
}
