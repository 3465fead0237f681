//! The kubelet's side of the Device Plugin API, as the kubelet's device
//! manager runs it (`pkg/kubelet/cm/devicemanager`): a registration server
//! on `kubelet.sock`, and per registration a client of the plugin's
//! endpoint that reads its ListAndWatch stream into the resource's healthy
//! and unhealthy devices, from which allocatable is counted. (Included with
//! `#[path]` by the device plugin tests, beside
//! `cni/tests/support/grpc_unix.rs`.)
//!
//! Step by step as upstream, 1.25 through the 1.37 line
//! (`pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go` `Register`,
//! `handler.go` `connectClient`, `registerClient`, `runClient`,
//! `disconnectClient`, `client.go` `Connect`, `Run`, `Disconnect`, and
//! `manager.go` `PluginConnected`, `PluginDisconnected`,
//! `PluginListAndWatchReceiver`, `genericDeviceUpdateCallback`,
//! `markResourceUnhealthy`):
//!
//! - Register checks the version (`v1beta1`) and that the resource is an
//!   extended resource name, then connects a client to
//!   `<plugin dir>/<endpoint>`: the client is registered under the
//!   resource name first (a client already there is replaced, not
//!   disconnected), dials, and asks GetDevicePluginOptions
//!   (`PluginConnected`: a new endpoint; the devices stay as they were
//!   until the stream says otherwise); a failure deregisters it and fails
//!   the Register.
//! - The client then reads ListAndWatch: each message replaces the
//!   resource's healthy and unhealthy devices.
//! - When a client's stream ends, `runClient` looks up the client
//!   registered under the resource name and disconnects it: its connection
//!   closed, then `PluginDisconnected`, which marks every device of the
//!   resource unhealthy (allocatable 0) and stops the endpoint. Which
//!   client it disconnects is the [`Behaviour`].
//! - A restart removes the plugin dir's sockets (`CleanupPluginDirectory`)
//!   and starts with nothing registered; a plugin must notice the new
//!   `kubelet.sock` and register again (the reference `stub.go` watches the
//!   directory for it).
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard_device_plugin::api::device_plugin_client::DevicePluginClient;
use switchyard_device_plugin::api::registration_server::{Registration, RegistrationServer};
use switchyard_device_plugin::api::{Empty, RegisterRequest};
use switchyard_device_plugin::run::uds_channel;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use super::common::wait_for;

const LIMIT: Duration = Duration::from_secs(15);

/// How the kubelet treats a client whose ListAndWatch stream ended, when
/// another client has registered the same resource since (a DaemonSet's
/// new pod beside the old one: `maxSurge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Kubelets 1.25 (PR #109016 moved registration into
    /// `plugin/v1beta1`) through 1.36: `registerClient` overwrites
    /// `clients[name]` (the old client is not disconnected and streams on),
    /// and `runClient` disconnects whatever client `getClient(name)`
    /// returns when any client's stream ends, so the old plugin's stream
    /// ending drops the new plugin's client (kubernetes/kubernetes#121994),
    /// and the resource's allocatable is 0 until a plugin registers again:
    /// the kubelet never dials a plugin again by itself.
    DropsTheNewClient,
    /// With PR #135437 (the 1.37 line): clients are kept per socket path
    /// and `runClient` disconnects only its own; the old client is still
    /// not disconnected when the new one registers.
    DropsOnlyItsOwn,
}

/// One resource as the device manager keeps it.
#[derive(Default)]
struct Resource {
    healthy: BTreeSet<String>,
    unhealthy: BTreeSet<String>,
    /// Set by `PluginDisconnected` (`setStopTime`), cleared by a new
    /// endpoint.
    stopped: bool,
}

/// The clients and resources.
#[derive(Default)]
struct Manager {
    /// `server.clients`: the client registered under each resource name.
    clients: HashMap<String, u64>,
    /// How to close each running client's connection (a client replaced
    /// under its name still runs: upstream does not disconnect it).
    conns: HashMap<u64, oneshot::Sender<()>>,
    resources: HashMap<String, Resource>,
}

#[derive(Clone)]
struct KubeletState {
    plugin_dir: PathBuf,
    behaviour: Behaviour,
    seen: Arc<Mutex<Vec<RegisterRequest>>>,
    manager: Arc<Mutex<Manager>>,
    next_id: Arc<AtomicU64>,
}

impl KubeletState {
    /// `PluginDisconnected`: every device unhealthy, the endpoint stopped.
    fn plugin_disconnected(&self, resource: &str) {
        let mut m = self.manager.lock().unwrap();
        if let Some(r) = m.resources.get_mut(resource) {
            let healthy = std::mem::take(&mut r.healthy);
            r.unhealthy.extend(healthy);
            r.stopped = true;
        }
    }

    /// `runClient`, after the client's `Run` returned: disconnects the
    /// client registered under `resource` (which one: the behaviour).
    fn client_ended(&self, resource: &str, id: u64) {
        {
            let mut m = self.manager.lock().unwrap();
            m.conns.remove(&id);
            let Some(&registered) = m.clients.get(resource) else {
                return;
            };
            if self.behaviour == Behaviour::DropsOnlyItsOwn && registered != id {
                return;
            }
            // `disconnectClient`: deregister, then `Disconnect` (the
            // connection closed, then `PluginDisconnected`).
            m.clients.remove(resource);
            if let Some(close) = m.conns.remove(&registered) {
                let _ = close.send(());
            }
        }
        self.plugin_disconnected(resource);
    }
}

#[tonic::async_trait]
impl Registration for KubeletState {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = req.into_inner();
        // server.go `Register`: the version (`SupportedVersions`: v1beta1),
        // then the resource name, then connectClient; the endpoint name is
        // joined to the plugin dir unchecked.
        if req.version != "v1beta1" {
            return Err(Status::unknown(format!(
                "requested API version {:?} is not supported by kubelet. Supported versions are [\"v1beta1\"]",
                req.version
            )));
        }
        // v1helper.IsExtendedResourceName: a "/" in the name, not in the
        // kubernetes.io domain, not requests.-prefixed.
        let extended = req.resource_name.split_once('/').is_some_and(|(d, n)| {
            !d.is_empty()
                && !n.is_empty()
                && !d.ends_with("kubernetes.io")
                && !req.resource_name.starts_with("requests.")
        });
        if !extended {
            return Err(Status::unknown(format!(
                "invalid extended resource name: {}",
                req.resource_name
            )));
        }
        // connectClient: registered first (replacing any), then dialed.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (close_tx, close_rx) = oneshot::channel();
        let resource = req.resource_name.clone();
        {
            let mut m = self.manager.lock().unwrap();
            m.clients.insert(resource.clone(), id);
            m.conns.insert(id, close_tx);
        }
        let connected = async {
            let ch = uds_channel(&self.plugin_dir.join(&req.endpoint))
                .await
                .map_err(|e| format!("dial plugin: {e}"))?;
            let mut client = DevicePluginClient::new(ch);
            client
                .get_device_plugin_options(Empty {})
                .await
                .map_err(|e| e.message().to_string())?;
            Ok::<_, String>(client)
        }
        .await;
        let mut client = match connected {
            Ok(c) => c,
            Err(e) => {
                let mut m = self.manager.lock().unwrap();
                if m.clients.get(&resource) == Some(&id) {
                    m.clients.remove(&resource);
                }
                m.conns.remove(&id);
                return Err(Status::unknown(e));
            }
        };
        // PluginConnected: a new endpoint, the devices as they were.
        self.manager
            .lock()
            .unwrap()
            .resources
            .entry(resource.clone())
            .or_default()
            .stopped = false;
        self.seen.lock().unwrap().push(req);
        let me = self.clone();
        tokio::spawn(async move {
            // client.Run: ListAndWatch until it ends or the connection is
            // closed (Disconnect).
            let run = async {
                let Ok(stream) = client.list_and_watch(Empty {}).await else {
                    return;
                };
                let mut stream = stream.into_inner();
                while let Ok(Some(msg)) = stream.message().await {
                    let mut m = me.manager.lock().unwrap();
                    let r = m.resources.entry(resource.clone()).or_default();
                    r.healthy.clear();
                    r.unhealthy.clear();
                    for d in msg.devices {
                        if d.health == "Healthy" {
                            r.healthy.insert(d.id);
                        } else {
                            r.unhealthy.insert(d.id);
                        }
                    }
                }
            };
            tokio::select! {
                () = run => {}
                // Closed by `Disconnect` (a sender dropped with the
                // kubelet is a close too).
                _ = close_rx => {}
            }
            drop(client);
            me.client_ended(&resource, id);
        });
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet serving `kubelet.sock`.
pub struct Kubelet {
    state: KubeletState,
    stop: Option<oneshot::Sender<()>>,
}

impl Kubelet {
    /// A kubelet of the versions most clusters run (1.25 until the fix of
    /// kubernetes#121994).
    pub fn start(rt: &Runtime, plugin_dir: &Path) -> Kubelet {
        Kubelet::start_as(rt, plugin_dir, Behaviour::DropsTheNewClient)
    }

    /// A kubelet with `behaviour`.
    pub fn start_as(rt: &Runtime, plugin_dir: &Path, behaviour: Behaviour) -> Kubelet {
        std::fs::create_dir_all(plugin_dir).unwrap();
        let sock = plugin_dir.join("kubelet.sock");
        let state = KubeletState {
            plugin_dir: plugin_dir.to_path_buf(),
            behaviour,
            seen: Arc::new(Mutex::new(Vec::new())),
            manager: Arc::new(Mutex::new(Manager::default())),
            next_id: Arc::new(AtomicU64::new(1)),
        };
        let stop = super::grpc_unix::serve_unix(
            rt,
            &sock,
            tonic::service::Routes::new(RegistrationServer::new(state.clone())),
        );
        Kubelet {
            state,
            stop: Some(stop),
        }
    }

    /// Restarts the kubelet: it stops (its server, every client's
    /// connection), then starts with the same behaviour and nothing
    /// registered, having wiped the plugin dir as the device manager does
    /// at its start (`manager.go` `Start`: `removeContents(socketdir)`).
    pub fn restart(&mut self, rt: &Runtime) {
        let dir = self.state.plugin_dir.clone();
        let behaviour = self.state.behaviour;
        self.shut();
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        *self = Kubelet::start_as(rt, &dir, behaviour);
    }

    /// The last registration of `resource`.
    pub fn current(&self, resource: &str) -> RegisterRequest {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r.resource_name == resource)
            .cloned()
            .unwrap_or_else(|| panic!("no registration of {resource}"))
    }

    /// Waits for `n` registrations in all; returns them sorted by resource.
    pub fn registrations(&self, n: usize) -> Vec<RegisterRequest> {
        let mut v = wait_for(LIMIT, "registrations", || {
            let s = self.state.seen.lock().unwrap();
            (s.len() >= n).then(|| s.clone())
        });
        v.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        v
    }

    /// The resource's allocatable count, as the node status reports it
    /// (`GetCapacity`: its healthy devices).
    pub fn allocatable(&self, resource: &str) -> usize {
        let m = self.state.manager.lock().unwrap();
        m.resources.get(resource).map_or(0, |r| r.healthy.len())
    }

    /// The resource's capacity: its devices, healthy or not.
    pub fn capacity(&self, resource: &str) -> usize {
        let m = self.state.manager.lock().unwrap();
        m.resources
            .get(resource)
            .map_or(0, |r| r.healthy.len() + r.unhealthy.len())
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shut();
    }
}

impl Kubelet {
    /// The kubelet stops: its server, and every client's connection.
    fn shut(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let mut m = self.state.manager.lock().unwrap();
        m.clients.clear();
        for (_, close) in m.conns.drain() {
            let _ = close.send(());
        }
    }
}
