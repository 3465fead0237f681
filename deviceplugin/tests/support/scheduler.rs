//! Whether a pod fits on a node, as the kube-scheduler decides it for CPU
//! and memory, and what a DaemonSet rollout with `maxSurge` does on a node
//! where the new pod does not fit. (Included with `#[path]` by the device
//! plugin tests.)
//!
//! - A pod's requests (`pkg/api/v1/resource/helpers.go` `PodRequests`):
//!   the sum over its containers, and at least the largest init
//!   container's (init containers run one at a time, before them), plus
//!   `overhead`.
//! - Fit (`pkg/scheduler/framework/plugins/noderesources/fit.go`
//!   `fitsRequest`): for each resource, the pod's request must be at most
//!   the node's allocatable less what the pods on it request; otherwise
//!   "Insufficient cpu" and the pod stays Pending.
//! - The rollout (`pkg/controller/daemon/update.go` `rollingUpdate`, the
//!   surge branch): with `maxSurge` the controller creates the new pod
//!   beside the old one and deletes the old one only once the new one is
//!   available; with `maxUnavailable: 0` it never deletes first. A new pod
//!   that stays Pending leaves the old one running: the rollout waits on
//!   that node.
#![allow(dead_code)]

use serde_yaml::Value;

/// CPU in millicores and memory in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Resources {
    /// Millicores.
    pub cpu: u64,
    /// Bytes.
    pub memory: u64,
}

impl std::ops::Add for Resources {
    type Output = Resources;
    fn add(self, o: Resources) -> Resources {
        Resources {
            cpu: self.cpu + o.cpu,
            memory: self.memory + o.memory,
        }
    }
}

/// A CPU quantity in millicores (`2`, `100m`, `0.5`).
pub fn cpu(q: &Value) -> u64 {
    let s = quantity(q);
    match s.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or_else(|_| panic!("cpu {s}")),
        None => (s.parse::<f64>().unwrap_or_else(|_| panic!("cpu {s}")) * 1000.0).round() as u64,
    }
}

/// A memory quantity in bytes (`64Mi`, `1Gi`, `128M`, `1000`).
pub fn memory(q: &Value) -> u64 {
    let s = quantity(q);
    for (suffix, unit) in [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ] {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap_or_else(|_| panic!("memory {s}")) * unit;
        }
    }
    s.parse().unwrap_or_else(|_| panic!("memory {s}"))
}

fn quantity(q: &Value) -> String {
    match q {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        v => panic!("a quantity: {v:?}"),
    }
}

/// One container's requests (a limit without a request is its request).
fn container(c: &Value) -> Resources {
    let r = &c["resources"];
    let get = |k: &str| {
        let v = &r["requests"][k];
        if v.is_null() {
            &r["limits"][k]
        } else {
            v
        }
    };
    Resources {
        cpu: Some(get("cpu")).filter(|v| !v.is_null()).map_or(0, cpu),
        memory: Some(get("memory"))
            .filter(|v| !v.is_null())
            .map_or(0, memory),
    }
}

/// The requests of a pod with `spec` (`PodRequests`).
pub fn pod_requests(spec: &Value) -> Resources {
    let seq = |k: &str| spec[k].as_sequence().cloned().unwrap_or_default();
    let sum = seq("containers")
        .iter()
        .map(container)
        .fold(Resources::default(), |a, b| a + b);
    let init = seq("initContainers")
        .iter()
        .map(container)
        .fold(Resources::default(), |a, b| Resources {
            cpu: a.cpu.max(b.cpu),
            memory: a.memory.max(b.memory),
        });
    let overhead = Resources {
        cpu: Some(&spec["overhead"]["cpu"])
            .filter(|v| !v.is_null())
            .map_or(0, cpu),
        memory: Some(&spec["overhead"]["memory"])
            .filter(|v| !v.is_null())
            .map_or(0, memory),
    };
    Resources {
        cpu: sum.cpu.max(init.cpu),
        memory: sum.memory.max(init.memory),
    } + overhead
}

/// `fitsRequest`: whether a pod requesting `pod` fits on a node with
/// `allocatable` whose pods request `requested`; else the reason.
pub fn fits(allocatable: Resources, requested: Resources, pod: Resources) -> Result<(), String> {
    let mut why = Vec::new();
    if pod.cpu > allocatable.cpu.saturating_sub(requested.cpu) {
        why.push("Insufficient cpu");
    }
    if pod.memory > allocatable.memory.saturating_sub(requested.memory) {
        why.push("Insufficient memory");
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("0/1 nodes are available: {}.", why.join(", ")))
    }
}
