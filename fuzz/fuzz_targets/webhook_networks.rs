//! The admission webhook's input from pods: the networks annotation, and
//! the pod's containers that the resource patch is computed from.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_webhook::mutate::{patch, Needs, NodeSelector};
use switchyard_webhook::selection::parse;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Annotation text: parsed or refused, every selection named and placed.
    let (annotation, pod) = text.split_once('\n').unwrap_or((&text, "{}"));
    if let Ok(nets) = parse(annotation, "default") {
        for n in &nets {
            assert!(!n.name.is_empty());
            assert!(n.namespace.as_deref().is_some_and(|ns| !ns.is_empty()));
        }
    }
    // Any pod JSON: the patch applies, and afterwards the first container
    // has at least what the networks need (unless the user's value is not a
    // count, or another container asks for the resource: both are left
    // alone), and the pod has the node selector.
    if let Ok(pod) = serde_json::from_str::<serde_json::Value>(pod) {
        let needs: Needs = [("switchyard.io/memif".to_string(), 2u64)].into();
        let sel: NodeSelector =
            [("switchyard.io/physnet-a".to_string(), "true".to_string())].into();
        let (p, warnings) = patch(&pod, &needs, &sel);
        let mut out = pod.clone();
        json_patch::patch(&mut out, &p).expect("the patch applies to the pod it was made for");
        if pod["spec"].is_object() {
            assert_eq!(
                out["spec"]["nodeSelector"]["switchyard.io/physnet-a"],
                "true"
            );
        }
        let elsewhere = pod["spec"]["containers"].as_array().is_some_and(|c| {
            c.iter().skip(1).any(|c| {
                ["requests", "limits"]
                    .iter()
                    .any(|w| c["resources"][w].get("switchyard.io/memif").is_some())
            })
        });
        if pod.pointer("/spec/containers/0").is_some() && warnings.is_empty() && !elsewhere {
            for which in ["requests", "limits"] {
                let v = out
                    .pointer(&format!(
                        "/spec/containers/0/resources/{which}/switchyard.io~1memif"
                    ))
                    .and_then(|v| v.as_str())
                    .and_then(|v| v.parse::<u64>().ok());
                assert!(v.is_some_and(|v| v >= 2), "{which}: {out}");
            }
        }
    }
});
