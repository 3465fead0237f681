//! The mutation, as network-resources-injector makes it
//! (`pkg/webhook/webhook.go`): a pod's networks → the device resources
//! their NetworkAttachmentDefinitions name → a JSON Patch giving the pod's
//! first container at least that many in its requests and limits (unless
//! another container already asks for the resource), the `podnetinfo`
//! downward-API volume (the pod's labels and annotations, so network-status
//! with each network's device-info can be read at `/etc/podnetinfo`) in
//! every container, and the NADs' node selectors in the pod's.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde_json::{json, Value};

/// The NAD annotation naming the device-plugin resource a network needs.
pub const RESOURCE_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// The NAD annotation naming the node label a network's pods need (e.g.
/// the nodes that have its physnet).
pub const NODE_SELECTOR_ANNOTATION: &str = "k8s.v1.cni.cncf.io/nodeSelector";

/// The downward-API volume (and its mount) through which a pod reads its
/// own annotations: network-status, with each network's device-info.
pub const PODNETINFO_VOLUME: &str = "podnetinfo";
/// Where containers mount it (network-resources-injector's
/// `DownwardAPIMountPath`).
pub const PODNETINFO_PATH: &str = "/etc/podnetinfo";

/// Devices needed, by resource name.
pub type Needs = BTreeMap<String, u64>;

/// Node labels a pod needs, by key.
pub type NodeSelector = BTreeMap<String, String>;

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// A quantity as a whole count (`"2"`), the only form extended resources
/// take.
fn count(q: &Value) -> Option<u64> {
    q.as_str()?.trim().parse().ok()
}

/// The patch for `pod` (its JSON) to ask for `needs` and schedule on nodes
/// with the labels of `node_selector`, and warnings for the response.
pub fn patch(pod: &Value, needs: &Needs, node_selector: &NodeSelector) -> (Patch, Vec<String>) {
    let (mut ops, warnings) = resources(pod, needs);
    if !needs.is_empty() {
        ops.extend(podnetinfo(pod));
    }
    ops.extend(node_selector_patch(pod, node_selector));
    (Patch(ops), warnings)
}

/// The pod's node selector with `want` added (what it had kept unless
/// `want` names the same key), when that changes it.
fn node_selector_patch(pod: &Value, want: &NodeSelector) -> Option<PatchOperation> {
    if !pod["spec"].is_object() {
        return None;
    }
    let mut map = pod["spec"]["nodeSelector"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let before = map.clone();
    for (k, v) in want {
        map.insert(k.clone(), json!(v));
    }
    (map != before).then(|| {
        PatchOperation::Add(AddOperation {
            path: pointer(&["spec", "nodeSelector"]),
            value: Value::Object(map),
        })
    })
}

/// The `podnetinfo` volume (labels and annotations, by the downward API)
/// unless the pod has a volume of that name, and its read-only mount at
/// [`PODNETINFO_PATH`] in every container that mounts nothing there (init
/// containers run before Multus's network-status exists, and are left).
fn podnetinfo(pod: &Value) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let spec = &pod["spec"];
    let Some(containers) = spec["containers"].as_array() else {
        return ops;
    };
    for (i, c) in containers.iter().enumerate() {
        if !c.is_object() {
            continue;
        }
        let mounts = c["volumeMounts"].as_array();
        if mounts
            .into_iter()
            .flatten()
            .any(|m| m["name"] == PODNETINFO_VOLUME || m["mountPath"] == PODNETINFO_PATH)
        {
            continue;
        }
        let mount =
            json!({"name": PODNETINFO_VOLUME, "mountPath": PODNETINFO_PATH, "readOnly": true});
        let idx = i.to_string();
        ops.push(append(
            &["spec", "containers", &idx, "volumeMounts"],
            mounts.is_some(),
            mount,
        ));
    }
    let volumes = spec["volumes"].as_array();
    if !volumes
        .into_iter()
        .flatten()
        .any(|v| v["name"] == PODNETINFO_VOLUME)
    {
        let mut items = Vec::new();
        if pod["metadata"]["labels"]
            .as_object()
            .is_some_and(|l| !l.is_empty())
        {
            items.push(json!({"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}));
        }
        items.push(
            json!({"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}),
        );
        let volume = json!({"name": PODNETINFO_VOLUME, "downwardAPI": {"items": items}});
        ops.push(append(&["spec", "volumes"], volumes.is_some(), volume));
    }
    ops
}

/// Adds `item` to the list at `list`: appended when the list is there,
/// else the list made with it (what is at `list` then is replaced).
fn append(list: &[&str], exists: bool, item: Value) -> PatchOperation {
    let mut tokens = list.to_vec();
    let value = if exists {
        tokens.push("-");
        item
    } else {
        json!([item])
    };
    PatchOperation::Add(AddOperation {
        path: pointer(&tokens),
        value,
    })
}

/// The resource part of the patch. A count the user set in the first
/// container is never lowered; a resource another container asks for is
/// the user's and left alone (as network-resources-injector does); requests
/// and limits of a resource end up equal (as the API server requires of
/// extended resources); maps that are absent are created.
fn resources(pod: &Value, needs: &Needs) -> (Vec<PatchOperation>, Vec<String>) {
    let mut ops = Vec::new();
    let mut warnings = Vec::new();
    let Some(container) = pod.pointer("/spec/containers/0") else {
        return (ops, warnings);
    };
    let others: Vec<&Value> = pod["spec"]["containers"]
        .as_array()
        .map(|c| c.iter().skip(1).collect())
        .unwrap_or_default();
    let elsewhere = |res: &str| {
        others.iter().any(|c| {
            ["requests", "limits"]
                .iter()
                .any(|w| c["resources"][w].get(res).is_some())
        })
    };
    let needs: Needs = needs
        .iter()
        .filter(|(r, _)| !elsewhere(r))
        .map(|(r, n)| (r.clone(), *n))
        .collect();
    let needs = &needs;
    if !container.is_object() {
        // Not a container the API server would accept: nothing to patch
        // into (a patch into it would not apply).
        warnings.push(format!(
            "the pod's first container is {container}, not an object; its resources were left as they are"
        ));
        return (ops, warnings);
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
        return (ops, warnings);
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
        return (ops, warnings);
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
    (ops, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(v: &[(&str, u64)]) -> Needs {
        v.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    fn apply(pod: &Value, n: &Needs) -> Value {
        apply_with(pod, n, &NodeSelector::new())
    }

    fn apply_with(pod: &Value, n: &Needs, sel: &NodeSelector) -> Value {
        let (p, _) = patch(pod, n, sel);
        let mut out = pod.clone();
        json_patch::patch(&mut out, &p).unwrap();
        out
    }

    #[test]
    fn a_container_that_is_not_an_object_is_left_alone_with_a_warning() {
        // Found by the webhook_networks fuzz target: a patch into a string
        // would not apply.
        let pod = json!({"spec": {"containers": ["u"]}});
        let (p, warnings) = resources(&pod, &needs(&[("switchyard.io/memif", 2)]));
        assert!(p.is_empty());
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
        let (p, w) = patch(&out, &n, &NodeSelector::new());
        assert!(p.0.is_empty() && w.is_empty());
        // A quantity that is not a count is left, with a warning.
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {
            "limits": {"switchyard.io/memif": "1500m"}}}]}});
        let (p, w) = resources(&pod, &needs(&[("switchyard.io/memif", 1)]));
        assert!(p.is_empty());
        assert!(w[0].contains("1500m"), "{w:?}");
        // Only limits set: requests are created beside them.
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {
            "limits": {"memory": "1Gi"}}}]}});
        let out = apply(&pod, &needs(&[("switchyard.io/memif", 1)]));
        let r = &out["spec"]["containers"][0]["resources"];
        assert_eq!(r["requests"]["switchyard.io/memif"], "1");
        assert_eq!(r["limits"]["memory"], "1Gi");
    }

    #[test]
    fn a_resource_another_container_asks_for_is_left_to_it() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "resources": {
            "limits": {"switchyard.io/memif": "1"}, "requests": {"switchyard.io/memif": "1"}}}]}});
        let n = needs(&[("switchyard.io/memif", 1), ("switchyard.io/vhost-user", 1)]);
        let out = apply(&pod, &n);
        let r = &out["spec"]["containers"][0]["resources"];
        assert!(r["requests"].get("switchyard.io/memif").is_none(), "{r}");
        assert_eq!(r["requests"]["switchyard.io/vhost-user"], "1");
        assert_eq!(
            out["spec"]["containers"][1]["resources"]["limits"]["switchyard.io/memif"],
            "1"
        );
    }

    #[test]
    fn every_container_mounts_podnetinfo_once() {
        let pod = json!({"metadata": {"labels": {"app": "x"}, "annotations": {"k": "v"}},
            "spec": {"initContainers": [{"name": "i"}],
                     "containers": [{"name": "a"},
                                    {"name": "b", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                     "volumes": [{"name": "data", "emptyDir": {}}]}});
        let n = needs(&[("switchyard.io/memif", 1)]);
        let out = apply(&pod, &n);
        let mount = json!({"name": "podnetinfo", "mountPath": "/etc/podnetinfo", "readOnly": true});
        assert_eq!(out["spec"]["containers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(out["spec"]["containers"][1]["volumeMounts"][1], mount);
        assert!(out["spec"]["initContainers"][0]
            .get("volumeMounts")
            .is_none());
        assert_eq!(
            out["spec"]["volumes"][1],
            json!({"name": "podnetinfo", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
        );
        // Applied again: nothing more.
        let (p, _) = patch(&out, &n, &NodeSelector::new());
        assert!(p.0.is_empty(), "{p:?}");
        // No devices needed: no volume either.
        let (p, _) = patch(&pod, &Needs::new(), &NodeSelector::new());
        assert!(p.0.is_empty());
    }

    #[test]
    fn node_selectors_of_the_networks_join_the_pods() {
        let pod = json!({"spec": {"containers": [{"name": "a"}],
                                  "nodeSelector": {"kubernetes.io/os": "linux"}}});
        let sel: NodeSelector = [(
            "switchyard.io/physnet-physnet1".to_string(),
            "true".to_string(),
        )]
        .into_iter()
        .collect();
        let out = apply_with(&pod, &Needs::new(), &sel);
        assert_eq!(
            out["spec"]["nodeSelector"],
            json!({"kubernetes.io/os": "linux", "switchyard.io/physnet-physnet1": "true"})
        );
        let (p, _) = patch(&out, &Needs::new(), &sel);
        assert!(p.0.is_empty());
    }
}
