//! Each node's slice of an overlay's addresses, claimed in the cluster as
//! a `coordination.k8s.io/v1` Lease per slice: creating an object is the
//! API server's one atomic step (a second create of a name is refused,
//! 409), so two nodes that claim the same slice at once cannot both have
//! it, which annotations on each node's own object could not promise. A
//! Lease names its holder (`spec.holderIdentity`, the node) and is owned
//! by the node's object (`metadata.ownerReferences`), so the garbage
//! collector deletes it with the node (and when the node is made again
//! under its name: the owner's UID is gone). The switch keeps the node's
//! slice across restarts and the Lease across the agent's.

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
    /// The Lease's own UID (a delete's precondition).
    pub uid: Option<String>,
}

impl Claim {
    /// Whether it is node `node`'s (UID `uid`) own claim. A claim of the
    /// node's name owned by another node object (one deleted and made
    /// again, whose claim the garbage collector has yet to delete) is not.
    pub fn is_own(&self, node: &str, uid: &str) -> bool {
        self.holder == node && self.owner_uid.as_deref().is_none_or(|u| u == uid)
    }

    /// Reads a listed Lease of overlay `overlay` (`None`: not one of its
    /// slices').
    pub fn from_lease(overlay: &str, lease: &Value) -> Option<Claim> {
        let name = lease["metadata"]["name"].as_str()?;
        let slice = name
            .strip_prefix(&format!("switchyard-{overlay}-slice-"))?
            .parse()
            .ok()?;
        // Its own spelling only (not `-007` beside `-7`).
        if lease_name(overlay, slice) != name {
            return None;
        }
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
            uid: lease["metadata"]["uid"].as_str().map(str::to_string),
        })
    }
}

/// What a node does about its slice of an overlay, given the claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It holds this slice: the switch hands it out.
    Hold(u32),
    /// It holds none it can keep: claim this one.
    Claim(u32),
    /// The slice the switch hands out is held under the node's name by
    /// the node's previous object (deleted and made again; the garbage
    /// collector has yet to delete its Lease): delete that Lease and claim
    /// the slice again, so that the node's pods keep their addresses.
    Reclaim(u32),
    /// Every slice is held.
    Exhausted,
}

/// What node `node` (UID `uid`) does, with `claims` listed, `slices` in
/// all and `current` the slice its switch hands out now, if any. The
/// slice the switch hands out is kept where it can be (its pods have
/// addresses from it): held if the node's claim is still there, claimed
/// again if no one claims it (a claim deleted by hand) or only the node's
/// previous object does. Else the node's lowest claim, else a free slice,
/// looked for from a point the node's name picks ([`first_try`]), so that
/// nodes that start at once mostly try different slices.
pub fn step(node: &str, uid: &str, claims: &[Claim], slices: u32, current: Option<u32>) -> Step {
    let holder = |s: u32| claims.iter().find(|c| c.slice == s);
    if let Some(s) = current.filter(|s| *s < slices) {
        match holder(s) {
            Some(c) if c.is_own(node, uid) => return Step::Hold(s),
            Some(c) if c.holder == node => return Step::Reclaim(s),
            None => return Step::Claim(s),
            Some(_) => {}
        }
    }
    let mine = claims
        .iter()
        .filter(|c| c.is_own(node, uid) && c.slice < slices)
        .map(|c| c.slice)
        .min();
    if let Some(s) = mine {
        return Step::Hold(s);
    }
    let taken: BTreeSet<u32> = claims.iter().map(|c| c.slice).collect();
    let from = first_try(node, slices);
    match (0..slices)
        .map(|k| (from + k) % slices)
        .find(|s| !taken.contains(s))
    {
        Some(s) => Step::Claim(s),
        None => Step::Exhausted,
    }
}

/// The slice node `node` tries first when it claims one (of `slices`): a
/// hash of its name (FNV-1a), so that nodes that claim at once mostly try
/// different slices, rather than each round's losers all trying the next.
pub fn first_try(node: &str, slices: u32) -> u32 {
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (h % u64::from(slices.max(1))) as u32
}

/// Node `node`'s (UID `uid`) own claims other than slice `kept`: one it
/// holds twice, or a slice beyond a smaller split. The claims of nodes
/// that are gone, and of a node's previous object, are the garbage
/// collector's: they are owned by those node objects.
pub fn extra<'a>(node: &str, uid: &str, kept: u32, claims: &'a [Claim]) -> Vec<&'a Claim> {
    claims
        .iter()
        .filter(|c| c.is_own(node, uid) && c.slice != kept)
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
    fn a_node_keeps_its_slice_or_claims_a_free_one() {
        let claims = [
            claim(0, "a", "ua"),
            claim(1, "b", "ub"),
            claim(3, "c", "uc"),
        ];
        assert_eq!(step("b", "ub", &claims, 4, None), Step::Hold(1));
        assert_eq!(step("d", "ud", &claims, 4, None), Step::Claim(2));
        assert_eq!(step("d", "ud", &claims[..2], 2, None), Step::Exhausted);
        // The node made again: its old object's claim is not its own.
        assert_eq!(step("b", "ub2", &claims, 4, None), Step::Claim(2));
        // A slice beyond a smaller split: claimed anew.
        assert_eq!(step("c", "uc", &claims, 3, None), Step::Claim(2));
        // Another overlay's, or not a slice: not read.
        assert_eq!(
            Claim::from_lease("other", &lease("ns", "ov", 1, "a", "ua")),
            None
        );
    }

    #[test]
    fn the_slice_the_switch_hands_out_is_kept_where_it_can_be() {
        let claims = [
            claim(0, "a", "ua"),
            claim(2, "b", "ub"),
            claim(5, "b", "ub"),
        ];
        // Its own claim of the switch's slice, though it has a lower one.
        assert_eq!(step("b", "ub", &claims, 8, Some(5)), Step::Hold(5));
        // Its claim deleted by hand: claimed again, not the lowest free.
        assert_eq!(step("c", "uc", &claims, 8, Some(6)), Step::Claim(6));
        // Held by another node: the node's own claim, else a free one.
        assert_eq!(step("b", "ub", &claims, 8, Some(0)), Step::Hold(2));
        let free = |slices: u32| {
            let from = first_try("c", slices);
            (0..slices)
                .map(|k| (from + k) % slices)
                .find(|s| ![0, 2, 5].contains(s))
                .unwrap()
        };
        assert_eq!(step("c", "uc", &claims, 8, Some(0)), Step::Claim(free(8)));
        // Beyond the split: as if it had none.
        assert_eq!(step("c", "uc", &claims, 4, Some(6)), Step::Claim(free(4)));
        // Held under the node's name by its previous object: claimed again.
        assert_eq!(step("b", "ub2", &claims, 8, Some(5)), Step::Reclaim(5));
    }

    #[test]
    fn nodes_that_claim_at_once_mostly_try_different_slices() {
        let tries: BTreeSet<u32> = (0..100)
            .map(|i| first_try(&format!("node-{i}"), 256))
            .collect();
        assert!(tries.len() > 70, "{}", tries.len());
        assert_eq!(first_try("node-1", 1), 0);
        // A name of another spelling is not a slice's.
        let mut l = lease("ns", "ov", 7, "a", "ua");
        l["metadata"]["name"] = "switchyard-ov-slice-007".into();
        assert_eq!(Claim::from_lease("ov", &l), None);
    }

    #[test]
    fn a_nodes_other_claims_are_extra_and_others_are_left_to_the_collector() {
        let claims = [
            claim(0, "a", "ua"),
            claim(1, "gone", "ug"),
            claim(2, "a", "ua"),
            claim(3, "a", "old-ua"),
        ];
        let names: Vec<&str> = extra("a", "ua", 0, &claims)
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["switchyard-ov-slice-2"]);
    }
}
