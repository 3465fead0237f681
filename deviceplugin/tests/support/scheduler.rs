//! Whether a pod fits on a node, as the kube-scheduler decides it for CPU
//! and memory, and what the DaemonSet controller does in a rollout with
//! `maxSurge`. (Included with `#[path]` by the device plugin tests.)
//!
//! - A pod's requests (`pkg/api/v1/resource/helpers.go` `PodRequests`):
//!   the sum over its containers, and at least the largest init
//!   container's (init containers run one at a time, before them), plus
//!   `overhead`.
//! - Fit (`pkg/scheduler/framework/plugins/noderesources/fit.go`
//!   `fitsRequest`): for each resource, the pod's request must be at most
//!   the node's allocatable less what the pods on it request; otherwise
//!   "Insufficient cpu" and the pod stays Pending, tried again when
//!   something on the node changes (a pod deleted).
//! - The rollout ([`Rollout`], `pkg/controller/daemon/update.go`
//!   `rollingUpdate`, the surge branch, for one node).
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

/// A DaemonSet's pod on the node, as the controller sees it.
#[derive(Debug, Clone)]
pub struct DsPod {
    /// Its name.
    pub name: String,
    /// Of the DaemonSet's current template (`IsPodUpdated`).
    pub updated: bool,
    /// Since when it is Ready (every container ready: the switch's
    /// readinessProbe passes, the others have none), if it is.
    pub ready_since: Option<std::time::Instant>,
}

/// What one sync of the controller does on the node (`syncNodes`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sync {
    /// Creates a pod of the current template.
    pub create: bool,
    /// Deletes these pods.
    pub delete: Vec<String>,
}

/// A DaemonSet's rolling update with `maxSurge`, on one node
/// (`pkg/controller/daemon/update.go` `rollingUpdate`, the branch after
/// `if maxSurge == 0`):
/// - an old pod that is not available is replaced at once (a new pod is
///   created beside it);
/// - beside an available old pod a new one is created while fewer than
///   `maxSurge` new pods are not yet available (`numSurge`);
/// - a new pod not yet available counts as a surge and nothing is deleted
///   (a Pending one too: the rollout waits on the node);
/// - once the new pod is available (`IsPodAvailable`: Ready for
///   `minReadySeconds`), the old one is deleted; and, from the manage loop
///   (`daemon_controller.go` `podsShouldBeOnNode`, surge allowed), so is an
///   old one that is no longer Ready while a new one exists, available or
///   not.
pub struct Rollout {
    max_surge: u32,
    min_ready: std::time::Duration,
}

impl Rollout {
    /// The rollout `ds` (a DaemonSet) asks for. The stand-in has the surge
    /// branch only: `maxSurge` must be set and `maxUnavailable` 0, as the
    /// API server requires of a surge (`ValidateRollingUpdateDaemonSet`).
    pub fn of(ds: &Value) -> Rollout {
        let strategy = &ds["spec"]["updateStrategy"];
        assert_eq!(
            strategy["type"].as_str(),
            Some("RollingUpdate"),
            "{strategy:?}"
        );
        let ru = &strategy["rollingUpdate"];
        // `GetValueFromIntOrPercent(maxSurge, desiredNumberScheduled, true)`:
        // a percentage of one node rounds up.
        let max_surge = match &ru["maxSurge"] {
            Value::Number(n) => n.as_u64().unwrap() as u32,
            Value::String(p) if p.ends_with('%') => {
                u32::from(p.trim_end_matches('%').parse::<u32>().unwrap() > 0)
            }
            v => panic!("maxSurge: {v:?}"),
        };
        assert!(max_surge > 0, "the stand-in models the surge branch only");
        assert!(
            matches!(&ru["maxUnavailable"], Value::Number(n) if n.as_u64() == Some(0))
                || ru["maxUnavailable"] == Value::String("0%".into()),
            "a surge needs maxUnavailable 0: {ru:?}"
        );
        Rollout {
            max_surge,
            min_ready: std::time::Duration::from_secs(
                ds["spec"]["minReadySeconds"].as_u64().unwrap_or(0),
            ),
        }
    }

    /// `IsPodAvailable`.
    pub fn available(&self, pod: &DsPod, now: std::time::Instant) -> bool {
        pod.ready_since.is_some_and(|t| t + self.min_ready <= now)
    }

    /// One sync of the node's pods at `now`.
    pub fn sync(&self, pods: &[DsPod], now: std::time::Instant) -> Sync {
        let new: Vec<&DsPod> = pods.iter().filter(|p| p.updated).collect();
        let old: Vec<&DsPod> = pods.iter().filter(|p| !p.updated).collect();
        // `findUpdatedPodsOnNode`: more than one of either is the manage
        // loop's to prune, and counts as a surge.
        if new.len() > 1 || old.len() > 1 {
            return Sync::default();
        }
        match (old.first(), new.first()) {
            // Nothing to update here: the manage loop's.
            (None, _) => Sync::default(),
            (Some(o), None) if !self.available(o, now) => Sync {
                create: true,
                delete: vec![],
            },
            // A candidate; `numSurge` is 0 on this one node.
            (Some(_), None) => Sync {
                create: self.max_surge > 0,
                delete: vec![],
            },
            (Some(o), Some(n)) if o.ready_since.is_none() || self.available(n, now) => Sync {
                create: false,
                delete: vec![o.name.clone()],
            },
            // Waiting for the new one to be available.
            (Some(_), Some(_)) => Sync::default(),
        }
    }
}

#[test]
fn the_rollout_stand_in_follows_the_surge_branch() {
    let ds: Value = serde_yaml::from_str(
        "spec: {minReadySeconds: 5, updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}}",
    )
    .unwrap();
    let r = Rollout::of(&ds);
    let t = std::time::Instant::now();
    let pod = |name: &str, updated, ready: Option<u64>| DsPod {
        name: name.into(),
        updated,
        ready_since: ready.map(|s| t - std::time::Duration::from_secs(s)),
    };
    let create = Sync {
        create: true,
        delete: vec![],
    };
    // An available old pod: surge; an unavailable one: replaced at once.
    assert_eq!(r.sync(&[pod("a", false, Some(60))], t), create);
    assert_eq!(r.sync(&[pod("a", false, None)], t), create);
    // The new one Pending, or Ready for less than minReadySeconds: wait.
    for new in [None, Some(2)] {
        let pods = [pod("a", false, Some(60)), pod("b", true, new)];
        assert_eq!(r.sync(&pods, t), Sync::default());
    }
    // An old one no longer Ready goes while the new one is not yet
    // available (the manage loop's rule).
    let pods = [pod("a", false, None), pod("b", true, Some(2))];
    assert_eq!(
        r.sync(&pods, t),
        Sync {
            create: false,
            delete: vec!["a".into()]
        }
    );
    // Available: the old one goes; then nothing is left to do.
    let pods = [pod("a", false, Some(60)), pod("b", true, Some(5))];
    assert_eq!(
        r.sync(&pods, t),
        Sync {
            create: false,
            delete: vec!["a".into()]
        }
    );
    assert_eq!(r.sync(&[pod("b", true, Some(5))], t), Sync::default());
}
