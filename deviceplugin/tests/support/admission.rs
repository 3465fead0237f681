//! What the API server's admission does to a pod that a real cluster
//! creates, for the two plugins that refuse what we ship on clusters as
//! operators run them. (Included with `#[path]` by the device plugin tests.)
//!
//! - **Pod Security** (`staging/src/k8s.io/pod-security-admission`): the
//!   level is the namespace's `pod-security.kubernetes.io/enforce` label,
//!   else the cluster's default (`AdmissionConfiguration`
//!   `defaults.enforce`); a label that does not parse is `restricted`
//!   (`api/helpers.go` `PolicyToEvaluate`). At `baseline` the checks of
//!   `policy/check_*.go` whose level is baseline run, each giving a reason
//!   and a detail; a pod failing any is refused with `pods "NAME" is
//!   forbidden: violates PodSecurity "baseline:latest": REASON (DETAIL),
//!   ...` (`admission/admission.go`, the checks in ID order). At
//!   `restricted`, the baseline checks and then the restricted ones
//!   (`allowPrivilegeEscalation`, `capabilities_restricted`,
//!   `restrictedVolumes`, `runAsNonRoot`, `runAsUser`,
//!   `seccompProfile_restricted`, each replacing the baseline check its
//!   `OverrideCheckIDs` names), refused as `"restricted:latest"`. (The
//!   exemptions for pods in user namespaces, `hostUsers: false`, and for
//!   Windows pods are not modelled: ours are neither.)
//! - **ResourceQuota with limited scopes**
//!   (`plugin/pkg/admission/resourcequota/controller.go` `checkRequest`,
//!   `pkg/quota/v1/evaluator/core/pods.go`): a cluster whose
//!   `LimitedResources` limit pods of the critical priority classes (GKE's
//!   `PriorityClass In [system-node-critical system-cluster-critical]`)
//!   admits such a pod only where a ResourceQuota matching it has a scope
//!   of the same name (`UncoveredQuotaScopes`), else `insufficient quota to
//!   match these scopes: [{PriorityClass In [...]}]`; and within that
//!   quota's `hard` pod count (`exceeded quota`).
#![allow(dead_code)]

use serde_yaml::Value;

/// A Pod Security level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// No checks.
    Privileged,
    /// The baseline checks.
    Baseline,
    /// The baseline checks and the restricted ones.
    Restricted,
}

impl Level {
    fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }
}

/// How the cluster's API server admits pods.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Pod Security's `defaults.enforce`.
    pub default_enforce: Level,
    /// ResourceQuota's `LimitedResources` for pods: priority classes a
    /// pod may have only where a quota covers them (`PriorityClass In`).
    pub limited_priority_classes: Vec<String>,
}

impl Cluster {
    /// A cluster as many operators run one: Pod Security `baseline` by
    /// default, and the critical priority classes limited as GKE limits
    /// them.
    pub fn as_operators_run_it() -> Cluster {
        Cluster {
            default_enforce: Level::Baseline,
            limited_priority_classes: vec![
                "system-node-critical".into(),
                "system-cluster-critical".into(),
            ],
        }
    }

    /// Admits a pod named `name` with `spec` into `namespace` (its
    /// Namespace object; `None` for one without labels, such as
    /// `default`), whose ResourceQuotas are `quotas` and where `existing`
    /// pods already count against them; else the API server's refusal.
    pub fn admit_pod(
        &self,
        namespace: Option<&Value>,
        quotas: &[&Value],
        existing: u64,
        name: &str,
        spec: &Value,
    ) -> Result<(), String> {
        let forbidden = |why: String| format!("pods {name:?} is forbidden: {why}");
        // Pod Security runs before ResourceQuota (the plugins' order).
        let label = namespace
            .map(|n| &n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"])
            .and_then(Value::as_str);
        let level = match label {
            Some(l) => Level::parse(l).unwrap_or(Level::Restricted),
            None => self.default_enforce,
        };
        // `policy/registry.go` `populate`: the baseline checks in ID order,
        // then the restricted ones in ID order (Go's string order: bytes,
        // upper case before lower); a restricted check's
        // `OverrideCheckIDs` take out the baseline checks it replaces.
        let by_id = |mut v: Vec<(&'static str, String)>| {
            v.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            v
        };
        let failed = match level {
            Level::Privileged => Vec::new(),
            Level::Baseline => by_id(baseline(spec)),
            Level::Restricted => {
                let mut all: Vec<_> = by_id(baseline(spec))
                    .into_iter()
                    .filter(|(id, _)| {
                        ![
                            "capabilities_baseline",
                            "hostPathVolumes",
                            "seccompProfile_baseline",
                        ]
                        .contains(id)
                    })
                    .collect();
                all.extend(by_id(restricted(spec)));
                all
            }
        };
        if !failed.is_empty() {
            let level = match level {
                Level::Restricted => "restricted",
                _ => "baseline",
            };
            let reasons: Vec<String> = failed.into_iter().map(|(_, r)| r).collect();
            return Err(forbidden(format!(
                "violates PodSecurity \"{level}:latest\": {}",
                reasons.join(", ")
            )));
        }
        let class = spec["priorityClassName"].as_str().unwrap_or("");
        if self.limited_priority_classes.iter().any(|c| c == class) {
            let limited = format!(
                "{{PriorityClass In [{}]}}",
                self.limited_priority_classes.join(" ")
            );
            // The quotas that match the pod (every scope of theirs does),
            // and whether one has a PriorityClass scope.
            let matching: Vec<&&Value> = quotas
                .iter()
                .filter(|q| scopes(q).iter().all(|s| scope_matches(s, class)))
                .collect();
            let covered = matching
                .iter()
                .any(|q| scopes(q).iter().any(|s| s["scopeName"] == "PriorityClass"));
            if !covered {
                return Err(forbidden(format!(
                    "insufficient quota to match these scopes: [{limited}]"
                )));
            }
            for q in matching {
                if let Some(hard) = q["spec"]["hard"]["pods"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| q["spec"]["hard"]["pods"].as_u64().map(|n| n.to_string()))
                {
                    let hard: u64 = hard.parse().expect("a pod count");
                    if existing + 1 > hard {
                        return Err(forbidden(format!(
                            "exceeded quota: {}, requested: pods=1, used: pods={existing}, limited: pods={hard}",
                            q["metadata"]["name"].as_str().unwrap_or("")
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A ResourceQuota's scope selectors (`scopeSelector.matchExpressions`).
fn scopes(q: &Value) -> Vec<Value> {
    q["spec"]["scopeSelector"]["matchExpressions"]
        .as_sequence()
        .cloned()
        .unwrap_or_default()
}

/// `podMatchesScopeFunc` for a PriorityClass scope (other scopes are not
/// modelled: they never match here).
fn scope_matches(s: &Value, class: &str) -> bool {
    if s["scopeName"] != "PriorityClass" {
        return false;
    }
    let values: Vec<&str> = s["values"]
        .as_sequence()
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match s["operator"].as_str() {
        Some("In") => values.contains(&class),
        Some("NotIn") => !values.contains(&class),
        Some("Exists") => !class.is_empty(),
        Some("DoesNotExist") => class.is_empty(),
        o => panic!("scope operator {o:?}"),
    }
}

/// Every container of the pod, init containers first (`visitContainers`).
fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|k| spec[*k].as_sequence())
        .flatten()
        .collect()
}

fn name(c: &Value) -> String {
    c["name"].as_str().unwrap_or("").to_string()
}

/// `"a", "b"` (`joinQuote`).
fn join_quote(v: &[String]) -> String {
    v.iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn plural<'a>(one: &'a str, many: &'a str, n: usize) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// Where `bad` holds of a security context: `pod` (the pod's), then
/// `container "NAME"` for each container's.
fn setting(spec: &Value, bad: impl Fn(&Value) -> bool) -> Vec<String> {
    let mut at = Vec::new();
    if bad(&spec["securityContext"]) {
        at.push("pod".to_string());
    }
    for c in containers(spec) {
        if bad(&c["securityContext"]) {
            at.push(format!("container {:?}", name(c)));
        }
    }
    at
}

/// The baseline checks: each failure as its check's ID and `reason
/// (detail)`.
fn baseline(spec: &Value) -> Vec<(&'static str, String)> {
    let mut failed = Vec::new();
    let mut fail = |id: &'static str, reason: &str, detail: String| {
        failed.push((id, format!("{reason} ({detail})")))
    };
    let sc = |c: &Value| c["securityContext"].clone();

    // appArmorProfile: no Unconfined profile, pod or container.
    let apparmor = setting(spec, |sc| sc["appArmorProfile"]["type"] == "Unconfined");
    if !apparmor.is_empty() {
        fail(
            "appArmorProfile",
            "forbidden AppArmor profile",
            format!(
                "{} must not set appArmorProfile.type to \"Unconfined\"",
                apparmor.join(", ")
            ),
        );
    }

    // capabilities_baseline: only the default set may be added.
    const DEFAULT: [&str; 13] = [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ];
    let mut bad = Vec::new();
    let mut caps = std::collections::BTreeSet::new();
    for c in containers(spec) {
        let added = sc(c)["capabilities"]["add"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        let extra: Vec<String> = added
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| !DEFAULT.contains(a))
            .map(str::to_string)
            .collect();
        if !extra.is_empty() {
            bad.push(name(c));
            caps.extend(extra);
        }
    }
    if !bad.is_empty() {
        let caps: Vec<String> = caps.into_iter().collect();
        fail(
            "capabilities_baseline",
            "non-default capabilities",
            format!(
                "{} {} must not include {} in securityContext.capabilities.add",
                plural("container", "containers", bad.len()),
                join_quote(&bad),
                join_quote(&caps)
            ),
        );
    }

    // hostNamespaces.
    let host: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|k| spec[**k].as_bool() == Some(true))
        .map(|k| format!("{k}=true"))
        .collect();
    if !host.is_empty() {
        fail("hostNamespaces", "host namespaces", host.join(", "));
    }

    // hostPathVolumes.
    let host_paths: Vec<String> = spec["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|v| !v["hostPath"].is_null())
        .map(name)
        .collect();
    if !host_paths.is_empty() {
        fail(
            "hostPathVolumes",
            "hostPath volumes",
            format!(
                "{} {}",
                plural("volume", "volumes", host_paths.len()),
                join_quote(&host_paths)
            ),
        );
    }

    // hostPorts.
    let mut bad = Vec::new();
    let mut ports = Vec::new();
    for c in containers(spec) {
        let used: Vec<String> = c["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|p| p["hostPort"].as_u64())
            .filter(|&p| p != 0)
            .map(|p| p.to_string())
            .collect();
        if !used.is_empty() {
            bad.push(name(c));
            ports.extend(used);
        }
    }
    if !bad.is_empty() {
        fail(
            "hostPorts",
            "hostPort",
            format!(
                "{} {} {} {} {}",
                plural("container", "containers", bad.len()),
                join_quote(&bad),
                plural("uses", "use", bad.len()),
                plural("hostPort", "hostPorts", ports.len()),
                ports.join(", ")
            ),
        );
    }

    // privileged.
    let bad: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| sc(c)["privileged"].as_bool() == Some(true))
        .map(name)
        .collect();
    if !bad.is_empty() {
        fail(
            "privileged",
            "privileged",
            format!(
                "{} {} must not set securityContext.privileged=true",
                plural("container", "containers", bad.len()),
                join_quote(&bad)
            ),
        );
    }

    // procMount: Default only.
    let bad: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| sc(c)["procMount"].as_str().is_some_and(|p| p != "Default"))
        .map(name)
        .collect();
    if !bad.is_empty() {
        fail(
            "procMount",
            "procMount",
            format!(
                "{} {} must not set securityContext.procMount to \"Unmasked\"",
                plural("container", "containers", bad.len()),
                join_quote(&bad)
            ),
        );
    }

    // seLinuxOptions: the container types only, no user or role.
    const TYPES: [&str; 4] = [
        "container_t",
        "container_init_t",
        "container_kvm_t",
        "container_engine_t",
    ];
    let selinux_bad = |o: &Value| {
        o["type"]
            .as_str()
            .is_some_and(|t| !t.is_empty() && !TYPES.contains(&t))
            || o["user"].as_str().is_some_and(|u| !u.is_empty())
            || o["role"].as_str().is_some_and(|r| !r.is_empty())
    };
    let where_ = setting(spec, |sc| selinux_bad(&sc["seLinuxOptions"]));
    if !where_.is_empty() {
        fail(
            "seLinuxOptions",
            "seLinuxOptions",
            format!(
                "{} set forbidden securityContext.seLinuxOptions",
                where_.join(", ")
            ),
        );
    }

    // seccompProfile_baseline: no Unconfined profile.
    let where_ = setting(spec, |sc| sc["seccompProfile"]["type"] == "Unconfined");
    if !where_.is_empty() {
        fail(
            "seccompProfile_baseline",
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
                where_.join(", ")
            ),
        );
    }

    // sysctls: the safe set only.
    const SAFE: [&str; 9] = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
    ];
    let bad: Vec<String> = spec["securityContext"]["sysctls"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| !SAFE.contains(n) && *n != "net.ipv4.tcp_keepalive_probes")
        .map(str::to_string)
        .collect();
    if !bad.is_empty() {
        fail("sysctls", "forbidden sysctls", bad.join(", "));
    }
    failed
}

/// The restricted level's own checks (`policy/check_*.go` of level
/// restricted): each failure as its check's ID and `reason (detail)`.
fn restricted(spec: &Value) -> Vec<(&'static str, String)> {
    let mut failed = Vec::new();
    let mut fail = |id: &'static str, reason: &str, detail: String| {
        failed.push((id, format!("{reason} ({detail})")))
    };
    let sc = |c: &Value| c["securityContext"].clone();
    let containers_detail = |bad: &[String]| {
        format!(
            "{} {}",
            plural("container", "containers", bad.len()),
            join_quote(bad)
        )
    };

    // allowPrivilegeEscalation: false, set on every container.
    let bad: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| sc(c)["allowPrivilegeEscalation"].as_bool() != Some(false))
        .map(name)
        .collect();
    if !bad.is_empty() {
        fail(
            "allowPrivilegeEscalation",
            "allowPrivilegeEscalation != false",
            format!(
                "{} must set securityContext.allowPrivilegeEscalation=false",
                containers_detail(&bad)
            ),
        );
    }

    // capabilities_restricted: drop ALL, add NET_BIND_SERVICE at most.
    let mut no_drop = Vec::new();
    let mut adding = Vec::new();
    let mut caps = std::collections::BTreeSet::new();
    for c in containers(spec) {
        let capabilities = &sc(c)["capabilities"];
        if capabilities.is_null() {
            no_drop.push(name(c));
            continue;
        }
        let dropped_all = capabilities["drop"]
            .as_sequence()
            .into_iter()
            .flatten()
            .any(|d| d.as_str() == Some("ALL"));
        if !dropped_all {
            no_drop.push(name(c));
        }
        let extra: Vec<String> = capabilities["add"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|a| *a != "NET_BIND_SERVICE")
            .map(str::to_string)
            .collect();
        if !extra.is_empty() {
            adding.push(name(c));
            caps.extend(extra);
        }
    }
    let mut details = Vec::new();
    if !no_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_detail(&no_drop)
        ));
    }
    if !adding.is_empty() {
        let caps: Vec<String> = caps.into_iter().collect();
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_detail(&adding),
            join_quote(&caps)
        ));
    }
    if !details.is_empty() {
        fail(
            "capabilities_restricted",
            "unrestricted capabilities",
            details.join("; "),
        );
    }

    // restrictedVolumes: inline volumes of the allowed types only.
    const ALLOWED: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    let mut bad = Vec::new();
    let mut types = std::collections::BTreeSet::new();
    for v in spec["volumes"].as_sequence().into_iter().flatten() {
        let kinds: Vec<String> = v
            .as_mapping()
            .into_iter()
            .flatten()
            .filter_map(|(k, _)| k.as_str())
            .filter(|k| *k != "name")
            .map(str::to_string)
            .collect();
        if kinds.iter().any(|k| ALLOWED.contains(&k.as_str())) {
            continue;
        }
        bad.push(name(v));
        types.insert(kinds.into_iter().next().unwrap_or_else(|| "unknown".into()));
    }
    if !bad.is_empty() {
        let types: Vec<String> = types.into_iter().collect();
        fail(
            "restrictedVolumes",
            "restricted volume types",
            format!(
                "{} {} {} {} {}",
                plural("volume", "volumes", bad.len()),
                join_quote(&bad),
                plural("uses", "use", bad.len()),
                plural(
                    "restricted volume type",
                    "restricted volume types",
                    types.len()
                ),
                join_quote(&types)
            ),
        );
    }

    // runAsNonRoot: true on the pod, or on every container; never false.
    let pod_sc = &spec["securityContext"];
    let pod_non_root = pod_sc["runAsNonRoot"].as_bool();
    let mut setters = Vec::new();
    if pod_non_root == Some(false) {
        setters.push("pod".to_string());
    }
    let explicit: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| sc(c)["runAsNonRoot"].as_bool() == Some(false))
        .map(name)
        .collect();
    let implicit: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| sc(c)["runAsNonRoot"].as_bool().is_none() && pod_non_root != Some(true))
        .map(name)
        .collect();
    if !explicit.is_empty() {
        setters.push(containers_detail(&explicit));
    }
    if !setters.is_empty() {
        fail(
            "runAsNonRoot",
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        );
    } else if !implicit.is_empty() {
        fail(
            "runAsNonRoot",
            "runAsNonRoot != true",
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                containers_detail(&implicit)
            ),
        );
    }

    // runAsUser: never 0.
    let mut setters = Vec::new();
    if pod_sc["runAsUser"].as_u64() == Some(0) {
        setters.push("pod".to_string());
    }
    let root: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| sc(c)["runAsUser"].as_u64() == Some(0))
        .map(name)
        .collect();
    if !root.is_empty() {
        setters.push(containers_detail(&root));
    }
    if !setters.is_empty() {
        fail(
            "runAsUser",
            "runAsUser=0",
            format!("{} must not set runAsUser=0", setters.join(" and ")),
        );
    }

    // seccompProfile_restricted: RuntimeDefault or Localhost, on the pod
    // or on every container.
    let valid = |t: &Value| matches!(t.as_str(), Some("RuntimeDefault" | "Localhost"));
    let mut setters = Vec::new();
    let mut values = std::collections::BTreeSet::new();
    let pod_type = &pod_sc["seccompProfile"]["type"];
    let pod_set = !pod_sc["seccompProfile"].is_null() && valid(pod_type);
    if !pod_sc["seccompProfile"].is_null() && !valid(pod_type) {
        setters.push("pod".to_string());
        values.insert(pod_type.as_str().unwrap_or("").to_string());
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in containers(spec) {
        let profile = &sc(c)["seccompProfile"];
        if !profile.is_null() {
            if !valid(&profile["type"]) {
                explicit.push(name(c));
                values.insert(profile["type"].as_str().unwrap_or("").to_string());
            }
        } else if !pod_set {
            implicit.push(name(c));
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_detail(&explicit));
    }
    if !setters.is_empty() {
        let values: Vec<String> = values.into_iter().collect();
        fail(
            "seccompProfile_restricted",
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters.join(" and "),
                join_quote(&values)
            ),
        );
    } else if !implicit.is_empty() {
        fail(
            "seccompProfile_restricted",
            "seccompProfile",
            format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                containers_detail(&implicit)
            ),
        );
    }
    failed
}

/// Evictions under a PodDisruptionBudget, as the API server's eviction
/// subresource decides them (`pkg/registry/core/pod/storage/eviction.go`)
/// on the status the disruption controller keeps
/// (`pkg/controller/disruption/disruption.go`): `currentHealthy` is the
/// Ready pods the budget selects that no eviction has claimed
/// (`disruptedPods`), `desiredHealthy` the controller's replicas less
/// `maxUnavailable` (or `minAvailable`), and an eviction is allowed while
/// `currentHealthy - desiredHealthy` is above 0; it is then recorded, and
/// the pod stops counting.
pub struct Disruptions {
    desired_healthy: i64,
    disrupted: Vec<String>,
}

impl Disruptions {
    /// The budget `pdb` over a controller of `replicas` pods.
    pub fn new(pdb: &Value, replicas: i64) -> Disruptions {
        let spec = &pdb["spec"];
        let desired_healthy = match (
            spec["maxUnavailable"].as_i64(),
            spec["minAvailable"].as_i64(),
        ) {
            (Some(m), None) => replicas - m,
            (None, Some(m)) => m,
            other => {
                panic!("the stand-in takes one integer maxUnavailable or minAvailable: {other:?}")
            }
        };
        Disruptions {
            desired_healthy,
            disrupted: Vec::new(),
        }
    }

    /// Evicts `pod` of the pods `ready` (the Ready ones the budget
    /// selects), or the API server's refusal (429).
    pub fn evict(&mut self, ready: &[&str], pod: &str) -> Result<(), String> {
        let healthy = ready
            .iter()
            .filter(|p| !self.disrupted.iter().any(|d| d == *p))
            .count() as i64;
        if healthy - self.desired_healthy <= 0 {
            return Err(
                "Cannot evict pod as it would violate the pod's disruption budget.".to_string(),
            );
        }
        self.disrupted.push(pod.to_string());
        Ok(())
    }

    /// The pod is gone (deleted after its eviction): the controller stops
    /// tracking it.
    pub fn gone(&mut self, pod: &str) {
        self.disrupted.retain(|d| d != pod);
    }
}

/// A pod's QoS class (`pkg/apis/core/helper/qos/qos.go` `GetPodQOS`):
/// `Guaranteed` when every container (init containers too) has CPU and
/// memory limits and requests equal to them (a request left out is its
/// limit), `BestEffort` when none asks for anything, else `Burstable`.
pub fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in containers(spec) {
        let r = &c["resources"];
        for res in ["cpu", "memory"] {
            let limit = r["limits"][res]
                .as_str()
                .map(str::to_string)
                .or(r["limits"][res].as_u64().map(|n| n.to_string()));
            let request = r["requests"][res]
                .as_str()
                .map(str::to_string)
                .or(r["requests"][res].as_u64().map(|n| n.to_string()));
            any |= limit.is_some() || request.is_some();
            match (&request, &limit) {
                (_, None) => guaranteed = false,
                (Some(q), Some(l)) if quantity_ne(res, q, l) => guaranteed = false,
                _ => {}
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn quantity_ne(res: &str, a: &str, b: &str) -> bool {
    let v = |q: &str| {
        let q = Value::String(q.to_string());
        if res == "cpu" {
            super::scheduler::cpu(&q)
        } else {
            super::scheduler::memory(&q)
        }
    };
    v(a) != v(b)
}

#[test]
fn the_admission_stand_in_refuses_as_upstream() {
    let spec: Value = serde_yaml::from_str(
        r#"
priorityClassName: system-node-critical
hostNetwork: true
containers:
  - name: a
    securityContext: {capabilities: {add: [NET_ADMIN, CHOWN, IPC_LOCK]}}
    resources: {requests: {cpu: "1", memory: 1Gi}, limits: {cpu: 1000m, memory: 1Gi}}
  - name: b
    ports: [{containerPort: 80, hostPort: 80}]
    resources: {limits: {cpu: 100m, memory: 64Mi}}
volumes:
  - {name: run, hostPath: {path: /run}}
"#,
    )
    .unwrap();
    let c = Cluster::as_operators_run_it();
    let ns = |label: Option<&str>| -> Value {
        let mut n: Value = serde_yaml::from_str("metadata: {name: ns, labels: {}}").unwrap();
        if let Some(l) = label {
            n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = l.into();
        }
        n
    };
    assert_eq!(
        c.admit_pod(Some(&ns(None)), &[], 0, "p", &spec).unwrap_err(),
        "pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": non-default capabilities (container \"a\" must not include \"IPC_LOCK\", \"NET_ADMIN\" in securityContext.capabilities.add), host namespaces (hostNetwork=true), hostPath volumes (volume \"run\"), hostPort (container \"b\" uses hostPort 80)"
    );
    let privileged = ns(Some("privileged"));
    assert_eq!(
        c.admit_pod(Some(&privileged), &[], 0, "p", &spec).unwrap_err(),
        "pods \"p\" is forbidden: insufficient quota to match these scopes: [{PriorityClass In [system-node-critical system-cluster-critical]}]"
    );
    let quota: Value = serde_yaml::from_str(
        "metadata: {name: q}\nspec: {hard: {pods: \"2\"}, scopeSelector: {matchExpressions: [{scopeName: PriorityClass, operator: In, values: [system-node-critical]}]}}",
    )
    .unwrap();
    c.admit_pod(Some(&privileged), &[&quota], 1, "p", &spec)
        .unwrap();
    assert!(c
        .admit_pod(Some(&privileged), &[&quota], 2, "p", &spec)
        .unwrap_err()
        .contains("exceeded quota: q"));
    // Restricted: the baseline checks (those the restricted ones replace
    // aside), then the restricted ones, each group in ID order.
    let restricted = ns(Some("restricted"));
    assert_eq!(
        c.admit_pod(Some(&restricted), &[], 0, "p", &spec).unwrap_err(),
        "pods \"p\" is forbidden: violates PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true), hostPort (container \"b\" uses hostPort 80), allowPrivilegeEscalation != false (containers \"a\", \"b\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (containers \"a\", \"b\" must set securityContext.capabilities.drop=[\"ALL\"]; container \"a\" must not include \"CHOWN\", \"IPC_LOCK\", \"NET_ADMIN\" in securityContext.capabilities.add), restricted volume types (volume \"run\" uses restricted volume type \"hostPath\"), runAsNonRoot != true (pod or containers \"a\", \"b\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or containers \"a\", \"b\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
    );
    let fine: Value = serde_yaml::from_str(
        r#"
securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
containers:
  - name: a
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}
volumes:
  - {name: tls, secret: {secretName: s}}
"#,
    )
    .unwrap();
    c.admit_pod(Some(&restricted), &[], 0, "p", &fine).unwrap();
    let mut root = fine.clone();
    root["containers"][0]["securityContext"]["runAsUser"] = 0.into();
    root["containers"][0]["securityContext"]["seccompProfile"] =
        serde_yaml::from_str("{type: Unconfined}").unwrap();
    assert_eq!(
        c.admit_pod(Some(&restricted), &[], 0, "p", &root).unwrap_err(),
        "pods \"p\" is forbidden: violates PodSecurity \"restricted:latest\": runAsUser=0 (container \"a\" must not set runAsUser=0), seccompProfile (container \"a\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
    );
    assert_eq!(qos_class(&spec), "Guaranteed");
    let mut burstable = spec.clone();
    burstable["containers"][1]["resources"]["requests"] =
        serde_yaml::from_str("{cpu: 10m}").unwrap();
    assert_eq!(qos_class(&burstable), "Burstable");
}
