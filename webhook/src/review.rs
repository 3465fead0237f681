//! One admission review: a Pod CREATE whose networks name device-plugin
//! resources gets them added; anything else passes unchanged.

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};

use crate::mutate::{self, Needs, NODE_SELECTOR_ANNOTATION, RESOURCE_ANNOTATION};
use crate::selection::{self, Selection, DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION};

/// What to do when the API server cannot be asked about a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Refuse the pod, saying why (as `failurePolicy: Fail`).
    Fail,
    /// Admit the pod unchanged, with a warning (as `failurePolicy: Ignore`).
    Ignore,
}

/// Where NetworkAttachmentDefinitions are read: a cache the API server's
/// watch keeps (as network-resources-injector keeps an informer's), and the
/// API server itself for one the cache does not hold (not listed yet, just
/// created, or gone), with the webhook's service account (`get`, `list`,
/// `watch`).
#[derive(Clone)]
pub struct Nads {
    client: kube::Client,
    cache: reflector::Store<DynamicObject>,
}

/// What a NAD lookup found.
pub enum Lookup {
    /// No such NAD.
    Missing,
    /// The NAD.
    Found(NadInfo),
}

/// What the webhook reads of a NAD: two of its annotations, and its
/// config's plugin chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NadInfo {
    /// `k8s.v1.cni.cncf.io/resourceName`: the device-plugin resource the
    /// network needs.
    pub resource: Option<String>,
    /// `k8s.v1.cni.cncf.io/nodeSelector`: `key=value` (or `key`) the pod's
    /// node must have, e.g. the nodes that have the network's physnet.
    pub node_selector: Option<String>,
    /// A plugin chained after `switchyard` in the config that works on the
    /// pod's kernel interface, which a socket attachment does not have.
    pub needs_interface: Option<String>,
}

/// Plugins that act on the attachment's kernel interface in the pod
/// (sysctls, MAC and MTU; traffic shaping; routes per interface; a VRF):
/// chained after `switchyard`, whose attachment is a socket, they fail every
/// ADD.
pub const KERNEL_INTERFACE_PLUGINS: [&str; 4] = ["tuning", "bandwidth", "sbr", "vrf"];

/// The first plugin of `config` (a NAD's `spec.config`) that comes after
/// `switchyard` in its chain and needs a kernel interface.
pub fn kernel_plugin_after_switchyard(config: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(config).ok()?;
    let types: Vec<&str> = v["plugins"]
        .as_array()?
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    let at = types.iter().position(|t| *t == "switchyard")?;
    types[at + 1..]
        .iter()
        .find(|t| KERNEL_INTERFACE_PLUGINS.contains(t))
        .map(|t| t.to_string())
}

fn nad_resource() -> ApiResource {
    ApiResource {
        group: "k8s.cni.cncf.io".into(),
        version: "v1".into(),
        api_version: "k8s.cni.cncf.io/v1".into(),
        kind: "NetworkAttachmentDefinition".into(),
        plural: "network-attachment-definitions".into(),
    }
}

impl Nads {
    /// NADs through `client`, their cache filled by a watch of every
    /// namespace's from now on (a task of the current runtime, which
    /// lists and watches again after an error).
    pub fn new(client: kube::Client) -> Nads {
        let writer = reflector::store::Writer::new(nad_resource());
        let cache = writer.as_reader();
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &nad_resource());
        let events = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        tokio::spawn(async move {
            futures::pin_mut!(events);
            while let Some(e) = events.next().await {
                if let Err(e) = e {
                    tracing::warn!(
                        "NetworkAttachmentDefinition watch: {e}; the API server is asked"
                    );
                }
            }
        });
        Nads { client, cache }
    }

    /// The NAD `namespace/name`.
    pub async fn lookup(&self, namespace: &str, name: &str) -> Result<Lookup, kube::Error> {
        let key = ObjectRef::new_with(name, nad_resource()).within(namespace);
        let nad = match self.cache.get(&key) {
            Some(nad) => Some((*nad).clone()),
            None => {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), namespace, &nad_resource());
                api.get_opt(name).await?
            }
        };
        Ok(match nad {
            None => Lookup::Missing,
            Some(nad) => {
                let get = |k: &str| {
                    nad.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(k))
                        .filter(|r| !r.is_empty())
                        .cloned()
                };
                let config = nad.data["spec"]["config"].as_str().unwrap_or_default();
                Lookup::Found(NadInfo {
                    resource: get(RESOURCE_ANNOTATION),
                    node_selector: get(NODE_SELECTOR_ANNOTATION),
                    needs_interface: kernel_plugin_after_switchyard(config),
                })
            }
        })
    }
}

/// How reviews are answered.
#[derive(Debug, Clone)]
pub struct Policy {
    /// When a NAD cannot be read.
    pub failure: FailurePolicy,
    /// Multus's namespace (its `multusNamespace`): where the default-network
    /// annotation's network is when it names no namespace.
    pub multus_namespace: String,
}

/// Answers one review.
pub async fn review(
    nads: &Nads,
    policy: &Policy,
    review: AdmissionReview<DynamicObject>,
) -> AdmissionReview<DynamicObject> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            return AdmissionResponse::invalid(format!("not an admission request: {e}"))
                .into_review()
        }
    };
    let resp = AdmissionResponse::from(&req);
    let pod = match (&req.operation, &req.object) {
        (Operation::Create, Some(o)) if req.kind.kind == "Pod" && req.kind.group.is_empty() => o,
        _ => return resp.into_review(),
    };
    let annotation = |k: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(k));
    let (text, default_net) = (
        annotation(NETWORKS_ANNOTATION),
        annotation(DEFAULT_NETWORK_ANNOTATION),
    );
    if text.is_none() && default_net.is_none() {
        return resp.into_review();
    }
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .or(req.namespace.clone())
        .unwrap_or_else(|| "default".into());
    let who = pod
        .metadata
        .name
        .clone()
        .or(pod.metadata.generate_name.clone())
        .unwrap_or_default();
    // The network replacing the cluster network first, as Multus attaches
    // it first (its device the first of its resource's).
    let parsed = default_net
        .map(|d| selection::parse_default(d, &policy.multus_namespace).map(|s| vec![s]))
        .unwrap_or_else(|| Ok(Vec::new()))
        .and_then(|mut nets| {
            if let Some(t) = text {
                nets.extend(selection::parse(t, &namespace)?);
            }
            Ok(nets)
        });
    let nets = match parsed {
        Ok(n) => n,
        Err(e) => return resp.deny(e).into_review(),
    };
    let (needs, node_selector) = match needs(nads, &nets).await {
        Ok(n) => n,
        Err(Refusal::NeedsInterface(net, plugin)) => {
            // The switch limits bandwidth itself.
            let instead = if plugin == "bandwidth" {
                " and declare \"capabilities\": {\"bandwidth\": true} on switchyard's, whose switch enforces it"
            } else {
                ""
            };
            return resp
                .deny(format!(
                    "network {net}: plugin {plugin:?} is chained after switchyard, but a switchyard attachment is a socket, not a kernel interface for {plugin} to work on; remove it from the NAD's plugins{instead}"
                ))
                .into_review()
        }
        Err(Refusal::NodeSelector(net, v)) => {
            return resp
                .deny(format!(
                    "network {net}: annotation {NODE_SELECTOR_ANNOTATION} {v:?} is not one label (key=value or key)"
                ))
                .into_review()
        }
        Err(Refusal::Missing(net)) => {
            return resp
                .deny(format!(
                    "network {net} (annotation {NETWORKS_ANNOTATION}) does not exist: no NetworkAttachmentDefinition {net}"
                ))
                .into_review()
        }
        Err(Refusal::Api(net, e)) => {
            let why = format!("cannot read NetworkAttachmentDefinition {net}: {e}");
            tracing::warn!(pod = %format!("{namespace}/{who}"), "{why}");
            return match policy.failure {
                FailurePolicy::Fail => resp.deny(why).into_review(),
                FailurePolicy::Ignore => {
                    let mut r = resp;
                    r.warnings = Some(vec![format!("{why}; pod admitted unchanged (failure policy Ignore)")]);
                    r.into_review()
                }
            };
        }
    };
    if needs.is_empty() && node_selector.is_empty() {
        return resp.into_review();
    }
    // The whole object: metadata (labels) and the rest (spec).
    let whole = serde_json::to_value(pod).unwrap_or_else(|_| pod.data.clone());
    let (patch, warnings) = mutate::patch(&whole, &needs, &node_selector);
    tracing::info!(pod = %format!("{namespace}/{who}"), ?needs, operations = patch.0.len(), "network resources");
    let mut resp = if patch.0.is_empty() {
        resp
    } else {
        match resp.clone().with_patch(patch) {
            Ok(r) => r,
            Err(e) => return resp.deny(format!("patch: {e}")).into_review(),
        }
    };
    if !warnings.is_empty() {
        resp.warnings = Some(warnings);
    }
    resp.into_review()
}

enum Refusal {
    Missing(String),
    Api(String, kube::Error),
    NodeSelector(String, String),
    NeedsInterface(String, String),
}

/// The devices the networks need, and the node labels their NADs ask for
/// (network-resources-injector `parseNetworkAttachDefinition`: one
/// `key=value` or `key` per NAD, more than one `=` refused).
async fn needs(nads: &Nads, nets: &[Selection]) -> Result<(Needs, mutate::NodeSelector), Refusal> {
    let mut needs = Needs::new();
    let mut selector = mutate::NodeSelector::new();
    for s in nets {
        let ns = s.namespace.as_deref().unwrap_or("default");
        let full = format!("{ns}/{}", s.name);
        match nads.lookup(ns, &s.name).await {
            Ok(Lookup::Missing) => return Err(Refusal::Missing(full)),
            Ok(Lookup::Found(a)) => {
                if let Some(p) = a.needs_interface {
                    return Err(Refusal::NeedsInterface(full, p));
                }
                if let Some(res) = a.resource {
                    *needs.entry(res).or_default() += 1;
                }
                if let Some(sel) = a.node_selector {
                    let parts: Vec<&str> = sel.split('=').collect();
                    match parts[..] {
                        [k] => selector.insert(k.trim().to_string(), String::new()),
                        [k, v] => selector.insert(k.trim().to_string(), v.trim().to_string()),
                        _ => return Err(Refusal::NodeSelector(full, sel)),
                    };
                }
            }
            Err(e) => return Err(Refusal::Api(full, e)),
        }
    }
    Ok((needs, selector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_plugins_after_switchyard_are_found() {
        let chain = |types: &[&str]| {
            let plugins: Vec<serde_json::Value> = types
                .iter()
                .map(|t| serde_json::json!({"type": t}))
                .collect();
            serde_json::json!({"cniVersion": "0.4.0", "name": "n", "plugins": plugins}).to_string()
        };
        assert_eq!(
            kernel_plugin_after_switchyard(&chain(&["switchyard", "portmap", "tuning"])),
            Some("tuning".into())
        );
        assert_eq!(
            kernel_plugin_after_switchyard(&chain(&["tuning", "switchyard"])),
            None
        );
        assert_eq!(
            kernel_plugin_after_switchyard(&chain(&["macvlan", "tuning"])),
            None
        );
        assert_eq!(
            kernel_plugin_after_switchyard(r#"{"cniVersion":"0.4.0","type":"switchyard"}"#),
            None
        );
        assert_eq!(kernel_plugin_after_switchyard("not json"), None);
    }
}
