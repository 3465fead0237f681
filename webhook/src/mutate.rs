//! The mutation: a pod's networks → the device resources their
//! NetworkAttachmentDefinitions name → a JSON Patch giving the pod's first
//! container at least that many in its requests and limits.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde_json::{json, Value};

/// The NAD annotation naming the device-plugin resource a network needs.
pub const RESOURCE_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// Devices needed, by resource name.
pub type Needs = BTreeMap<String, u64>;

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// A quantity as a whole count (`"2"`), the only form extended resources
/// take.
fn count(q: &Value) -> Option<u64> {
    q.as_str()?.trim().parse().ok()
}

/// The patch for `pod` (its JSON) to ask for `needs`, and warnings for the
/// response. A count the user set is never lowered; requests and limits of
/// a resource end up equal (as the API server requires of extended
/// resources); maps that are absent are created.
pub fn patch(pod: &Value, needs: &Needs) -> (Patch, Vec<String>) {
    let mut ops = Vec::new();
    let mut warnings = Vec::new();
    let Some(container) = pod.pointer("/spec/containers/0") else {
        return (Patch(ops), warnings);
    };
    if !container.is_object() {
        // Not a container the API server would accept: nothing to patch
        // into (a patch into it would not apply).
        warnings.push(format!(
            "the pod's first container is {container}, not an object; its resources were left as they are"
        ));
        return (Patch(ops), warnings);
    }
    let name = container["name"].as_str().unwrap_or("0");
    let resources = &container["resources"];
    // Per resource: the count to set, and whether requests / limits have it.
    let mut targets: BTreeMap<&str, (String, [bool; 2])> = BTreeMap::new();
    for (res, want) in needs {
        let set = |which: &str| resources[which].get(res.as_str());
        let user: Vec<&Value> = [set("requests"), set("limits")]
            .into_iter()
            .flatten()
            .collect();
        if user.iter().any(|q| count(q).is_none()) {
            warnings.push(format!(
                "container {name}: {res} is set to {} and was left as it is; the networks need {want}",
                user.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(" and ")
            ));
            continue;
        }
        let target = user
            .iter()
            .filter_map(|q| count(q))
            .chain([*want])
            .max()
            .unwrap_or(*want);
        let req_ok = set("requests").and_then(count) == Some(target);
        let lim_ok = set("limits").and_then(count) == Some(target);
        if !(req_ok && lim_ok) {
            targets.insert(res, (target.to_string(), [req_ok, lim_ok]));
        }
    }
    if targets.is_empty() {
        return (Patch(ops), warnings);
    }
    if !resources.is_object() {
        let map: serde_json::Map<String, Value> = targets
            .iter()
            .map(|(r, (v, _))| (r.to_string(), json!(v)))
            .collect();
        ops.push(PatchOperation::Add(AddOperation {
            path: pointer(&["spec", "containers", "0", "resources"]),
            value: json!({"requests": map, "limits": map}),
        }));
        return (Patch(ops), warnings);
    }
    for (i, which) in ["requests", "limits"].into_iter().enumerate() {
        let pending: Vec<(&str, &String)> = targets
            .iter()
            .filter(|(_, (_, ok))| !ok[i])
            .map(|(r, (v, _))| (*r, v))
            .collect();
        if pending.is_empty() {
            continue;
        }
        if !resources[which].is_object() {
            let map: serde_json::Map<String, Value> = pending
                .iter()
                .map(|(r, v)| (r.to_string(), json!(v)))
                .collect();
            ops.push(PatchOperation::Add(AddOperation {
                path: pointer(&["spec", "containers", "0", "resources", which]),
                value: Value::Object(map),
            }));
            continue;
        }
        for (res, v) in pending {
            let path = pointer(&["spec", "containers", "0", "resources", which, res]);
            ops.push(if resources[which].get(res).is_some() {
                PatchOperation::Replace(ReplaceOperation {
                    path,
                    value: json!(v),
                })
            } else {
                PatchOperation::Add(AddOperation {
                    path,
                    value: json!(v),
                })
            });
        }
    }
    (Patch(ops), warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(v: &[(&str, u64)]) -> Needs {
        v.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    fn apply(pod: &Value, n: &Needs) -> Value {
        let (p, _) = patch(pod, n);
        let mut out = pod.clone();
        json_patch::patch(&mut out, &p).unwrap();
        out
    }

    #[test]
    fn a_container_that_is_not_an_object_is_left_alone_with_a_warning() {
        // Found by the webhook_networks fuzz target: a patch into a string
        // would not apply.
        let pod = json!({"spec": {"containers": ["u"]}});
        let (p, warnings) = patch(&pod, &needs(&[("switchyard.io/memif", 2)]));
        assert!(p.0.is_empty());
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("not an object"), "{warnings:?}");
    }

    #[test]
    fn maps_are_created_and_counts_never_lowered() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let n = needs(&[("switchyard.io/memif", 2), ("switchyard.io/vhost-user", 1)]);
        let out = apply(&pod, &n);
        let r = &out["spec"]["containers"][0]["resources"];
        assert_eq!(r["requests"]["switchyard.io/memif"], "2");
        assert_eq!(r["limits"]["switchyard.io/vhost-user"], "1");
        assert!(out["spec"]["containers"][1].get("resources").is_none());

        // The user asked for more: kept. Fewer: raised, in both maps.
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {
            "requests": {"cpu": "1", "switchyard.io/memif": "3"},
            "limits": {"switchyard.io/memif": "3", "switchyard.io/vhost-user": "0"}}}]}});
        let out = apply(&pod, &n);
        let r = &out["spec"]["containers"][0]["resources"];
        assert_eq!(r["requests"]["switchyard.io/memif"], "3");
        assert_eq!(r["requests"]["cpu"], "1");
        assert_eq!(r["requests"]["switchyard.io/vhost-user"], "1");
        assert_eq!(r["limits"]["switchyard.io/vhost-user"], "1");
        // Already right: no operation at all.
        let (p, w) = patch(&out, &n);
        assert!(p.0.is_empty() && w.is_empty());
        // A quantity that is not a count is left, with a warning.
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {
            "limits": {"switchyard.io/memif": "1500m"}}}]}});
        let (p, w) = patch(&pod, &needs(&[("switchyard.io/memif", 1)]));
        assert!(p.0.is_empty());
        assert!(w[0].contains("1500m"), "{w:?}");
        // Only limits set: requests are created beside them.
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {
            "limits": {"memory": "1Gi"}}}]}});
        let out = apply(&pod, &needs(&[("switchyard.io/memif", 1)]));
        let r = &out["spec"]["containers"][0]["resources"];
        assert_eq!(r["requests"]["switchyard.io/memif"], "1");
        assert_eq!(r["limits"]["memory"], "1Gi");
    }
}
