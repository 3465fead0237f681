//! The plugin's life: serve each pool on its endpoint socket, register it
//! with the kubelet, follow the switch daemon's health, serve and register
//! again when the kubelet restarts, and clean up on the way out.

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};

use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::api::{DevicePluginOptions, RegisterRequest};
use crate::config::Config;
use crate::plugin::{devinfo_files, PoolPlugin};
use crate::{cdi, API_VERSION};

/// A failure that stops the plugin.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A file or socket could not be made.
    #[error("{what}: {cause}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause (in the message, not repeated as a `source()`).
        cause: std::io::Error,
    },
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.to_string();
    move |cause| RunError::Io { what, cause }
}

/// A gRPC channel over a Unix socket (the kubelet's or a plugin's).
pub async fn uds_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API but unused: the connector dials `path`.
    Endpoint::from_static("http://[::1]:0")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Whether the switch daemon answers a ping within `limit` (blocking):
/// a switch restarting or taken over meanwhile (its socket missing or
/// refused for a moment) is asked again within it, so that a restart does
/// not make every device unhealthy (the kubelet would refuse pods it
/// admits meanwhile).
fn daemon_healthy(control: &Path, limit: Duration) -> bool {
    use switchyard_api::{Client, Request};
    let mut c = Client::lazy(control);
    c.set_timeout(limit).is_ok() && c.ask(&Request::ping()).is_ok()
}

/// Follows the daemon's health into a watch channel.
fn spawn_health(cfg: &Config) -> (watch::Receiver<bool>, JoinHandle<()>) {
    let control = cfg.control_socket.clone();
    let every = Duration::from_millis(cfg.health_interval_ms);
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            let c = control.clone();
            let up = tokio::task::spawn_blocking(move || daemon_healthy(&c, every))
                .await
                .unwrap_or(false);
            tx.send_if_modified(|h| {
                if *h != up {
                    tracing::info!(healthy = up, "switch daemon health changed");
                    *h = up;
                    true
                } else {
                    false
                }
            });
            tokio::time::sleep(every).await;
        }
    });
    (rx, task)
}

/// The identity of a socket file, to notice it being replaced: device,
/// inode and change time. The inode alone is not enough: ext4 gives a
/// socket bound right after an unlink the same inode number (every time, in
/// a check on the development VM), so a restarted kubelet's new
/// `kubelet.sock` looked like the old one and the plugin never registered
/// again.
type FileId = (u64, u64, i64, i64);

fn file_id(p: &Path) -> Option<FileId> {
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// This process, as its endpoints name it (`switchyard-<class>-<instance>.sock`):
/// the two plugins of a rollout (`maxSurge`) never share a socket path,
/// and the newer is known by its name. Instances order by start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instance {
    /// When the process started (nanoseconds since the epoch).
    started: u128,
    /// Its pid (in its PID namespace).
    pid: u32,
}

impl Instance {
    /// This process.
    pub fn this() -> Instance {
        Instance {
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            pid: std::process::id(),
        }
    }

    /// Its endpoint for a pool of class `class`.
    pub fn endpoint(&self, class: &str) -> String {
        format!("switchyard-{class}-{:x}-{}.sock", self.started, self.pid)
    }

    /// The instance whose endpoint for `class` `file` is, if it is one.
    fn of(class: &str, file: &str) -> Option<Instance> {
        let rest = file
            .strip_prefix("switchyard-")?
            .strip_prefix(class)?
            .strip_prefix('-')?
            .strip_suffix(".sock")?;
        let (started, pid) = rest.split_once('-')?;
        Some(Instance {
            started: u128::from_str_radix(started, 16).ok()?,
            pid: pid.parse().ok()?,
        })
    }
}

/// The endpoints of `class`'s pool in the plugin dir other than `me`'s:
/// each instance with its socket, and whether a server answers there (a
/// connection the kernel completes, within a second).
async fn other_endpoints(
    cfg: &Config,
    class: &str,
    me: Instance,
) -> Vec<(Instance, PathBuf, bool)> {
    let Ok(entries) = std::fs::read_dir(&cfg.plugin_dir) else {
        return Vec::new();
    };
    let found: Vec<(Instance, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let inst = Instance::of(class, &e.file_name().to_string_lossy())?;
            (inst != me).then(|| (inst, e.path()))
        })
        .collect();
    let mut out = Vec::with_capacity(found.len());
    for (inst, path) in found {
        let live = matches!(
            tokio::time::timeout(Duration::from_secs(1), UnixStream::connect(&path)).await,
            Ok(Ok(_))
        );
        out.push((inst, path, live));
    }
    out
}

/// The other instances serving `class`'s pool (a live endpoint), as seen
/// from `me`.
struct Others {
    /// A newer one serves.
    newer: bool,
    /// The older ones serving.
    older: Vec<Instance>,
}

impl Others {
    async fn look(cfg: &Config, class: &str, me: Instance) -> Others {
        let live: Vec<Instance> = other_endpoints(cfg, class, me)
            .await
            .into_iter()
            .filter(|(_, _, live)| *live)
            .map(|(inst, _, _)| inst)
            .collect();
        Others {
            newer: live.iter().any(|i| *i > me),
            older: live.into_iter().filter(|i| *i < me).collect(),
        }
    }
}

/// One pool's endpoint: a gRPC server on its socket.
struct Serving {
    socket: PathBuf,
    id: Option<FileId>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// The ListAndWatch streams open.
    streams: watch::Receiver<usize>,
}

impl Serving {
    fn start(
        socket: PathBuf,
        cfg: Arc<Config>,
        pool: usize,
        health: watch::Receiver<bool>,
    ) -> Result<Serving, RunError> {
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(socket.display())(e)),
        }
        let listener = UnixListener::bind(&socket).map_err(io(socket.display()))?;
        let (stop, mut stopped) = watch::channel(false);
        let (count, streams) = watch::channel(0);
        let service = PoolPlugin::new(cfg, pool, health, stopped.clone(), Arc::new(count));
        let task = tokio::spawn(async move {
            let r = Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!("device plugin server: {e}");
            }
        });
        Ok(Serving {
            id: file_id(&socket),
            socket,
            stop,
            task,
            streams,
        })
    }

    /// Still ours: the file the kubelet dials is the one we bound.
    fn intact(&self) -> bool {
        self.id.is_some() && file_id(&self.socket) == self.id
    }

    async fn shutdown(self) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        // Streams end at once; a stuck connection is not waited for long.
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        if file_id(&self.socket) == self.id {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

async fn register(cfg: &Config, pool: usize, endpoint: &str) -> Result<(), String> {
    let p = &cfg.pools[pool];
    let channel = uds_channel(&cfg.kubelet_socket())
        .await
        .map_err(|e| format!("{}: {e}", cfg.kubelet_socket().display()))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: endpoint.to_string(),
            resource_name: p.resource.clone(),
            options: Some(DevicePluginOptions::default()),
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("kubelet refused the registration: {}", s.message()))
}

/// How a pool's service ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Told to stop.
    Stopped,
    /// A newer plugin serves the pool (a rollout's new pod, which
    /// registered itself): the resource is the kubelet's with it, and so
    /// are the device-info files.
    Replaced,
}

/// How long a registered pool may have no ListAndWatch stream open before
/// it registers again: the kubelet opens one right after a registration,
/// and holds it while it keeps the registration. The wait lets a kubelet
/// that dropped the client finish (`disconnectClient`: its
/// `PluginDisconnected` marks the resource unhealthy), so the new
/// registration is not dropped with it.
const REREGISTER_AFTER: Duration = Duration::from_millis(500);

/// After a registration, how much longer than [`REREGISTER_AFTER`] the
/// kubelet may take to open its first stream.
const FIRST_STREAM_GRACE: Duration = Duration::from_millis(1500);

/// Why a registered pool stopped waiting.
enum Woke {
    Quit,
    /// The kubelet restarted (a new `kubelet.sock`) or wiped our socket.
    Kubelet,
    /// No ListAndWatch stream is open: the kubelet dropped the client
    /// (kubernetes#121994: a kubelet from 1.25 drops the *new* plugin's
    /// client when the old plugin's stream ends in a rollout), or never
    /// opened one.
    HungUp,
    /// A newer instance of this plugin serves the pool.
    Newer,
    /// An older instance served the pool after this one registered, and
    /// stopped: it may have registered after this one (the kubelet then
    /// holds its client, not ours, and drops it as its stream ends, while
    /// our stream, replaced but not disconnected, stays open).
    OlderCameAndWent,
}

/// What a registered instance saw of older instances serving the same
/// pool since it registered: one that came (it was not serving then) and
/// went may have registered after this one.
struct OlderSince {
    /// Serving when this instance registered (it stands down for us).
    at_registration: Vec<Instance>,
    /// Serving since.
    came: Vec<Instance>,
    /// When one of `came` stopped serving.
    went_at: Option<tokio::time::Instant>,
}

impl OlderSince {
    fn new(at_registration: Vec<Instance>) -> OlderSince {
        OlderSince {
            at_registration,
            came: Vec::new(),
            went_at: None,
        }
    }

    /// Notes the older instances serving `now`; whether to register again:
    /// one that came has gone, [`REREGISTER_AFTER`] ago (the kubelet's
    /// moment to finish dropping its client).
    fn see(&mut self, serving: &[Instance], now: tokio::time::Instant) -> bool {
        // One that stops and serves again later may register again.
        self.at_registration.retain(|i| serving.contains(i));
        for inst in serving {
            if !self.at_registration.contains(inst) && !self.came.contains(inst) {
                self.came.push(*inst);
            }
        }
        match self.went_at {
            None => {
                if self.came.iter().any(|i| !serving.contains(i)) {
                    self.went_at = Some(now);
                }
                false
            }
            Some(t) => now >= t + REREGISTER_AFTER,
        }
    }
}

/// How long, and in at least how many health checks in a row, a plugin
/// that stood down must find no newer instance serving before it serves
/// again. A kubelet restart wipes every endpoint, and the newer instance
/// binds its own again at its next check, after closing its old server
/// (up to 2 s): a short empty spell is a restart, not a newer instance
/// gone.
const EMPTY_CHECKS_TO_SERVE_AGAIN: u32 = 3;
const EMPTY_FOR_TO_SERVE_AGAIN: Duration = Duration::from_secs(3);

/// One pool: serve on this instance's endpoint, register, and register
/// again whenever the kubelet drops the registration (it ended our
/// ListAndWatch stream) or restarts (a new `kubelet.sock`; a restart also
/// wipes the plugin dir, and so our socket: then serve again). A newer
/// instance of the plugin serving the pool (a rollout's new pod) makes
/// this one stand down, until it is stopped or no newer one serves.
async fn pool_loop(
    cfg: Arc<Config>,
    pool: usize,
    me: Instance,
    health: watch::Receiver<bool>,
    mut quit: watch::Receiver<bool>,
) -> Result<Ended, RunError> {
    let every = Duration::from_millis(cfg.health_interval_ms);
    let class = cfg.pools[pool].class.clone();
    let endpoint = me.endpoint(&class);
    let socket = cfg.plugin_dir.join(&endpoint);
    let resource = cfg.pools[pool].resource.clone();
    // Endpoints of instances that are gone (a crash; the kubelet wipes
    // them only when it restarts).
    for (inst, path, live) in other_endpoints(&cfg, &class, me).await {
        if !live {
            tracing::info!(endpoint = %path.display(), ?inst, "removing the endpoint of a device plugin that is gone");
            let _ = std::fs::remove_file(path);
        }
    }
    // A plugin from before per-instance endpoints serves `switchyard-<class>.sock`
    // and stands down (keeping the device-info files) only when that file
    // is replaced: replace it, so an upgrade from it loses no file.
    let legacy = cfg.plugin_dir.join(format!("switchyard-{class}.sock"));
    if std::os::unix::net::UnixStream::connect(&legacy).is_ok() {
        let _ = std::fs::remove_file(&legacy);
        match std::os::unix::net::UnixListener::bind(&legacy) {
            Ok(_) => {
                tracing::info!(endpoint = %legacy.display(), "replaced the endpoint of a device plugin from before per-instance endpoints: it stands down")
            }
            Err(e) => {
                tracing::warn!(endpoint = %legacy.display(), "cannot replace an older plugin's endpoint: {e}")
            }
        }
    }
    loop {
        let serving = Serving::start(socket.clone(), cfg.clone(), pool, health.clone())?;
        let mut why = Woke::Kubelet;
        'registered: while serving.intact() && !*quit.borrow() {
            // Older instances serving before this registration: one that
            // registers after it is one that came back (see OlderSince).
            let others = Others::look(&cfg, &class, me).await;
            if others.newer {
                why = Woke::Newer;
                break;
            }
            let seen = file_id(&cfg.kubelet_socket());
            if let Err(e) = register(&cfg, pool, &endpoint).await {
                // The kubelet may not be up yet.
                tracing::warn!(%resource, "registration: {e}; retrying");
                let _ = tokio::time::timeout(every, quit.changed()).await;
                continue;
            }
            tracing::info!(%resource, endpoint = %socket.display(), "registered with the kubelet");
            // Registered: watch for the kubelet dropping us or restarting,
            // a newer instance, an older one coming and going, and the end.
            let mut streams = serving.streams.clone();
            let mut older = OlderSince::new(others.older);
            // The first stream may take the kubelet a moment longer.
            let mut streamless_since = Some(tokio::time::Instant::now() + FIRST_STREAM_GRACE);
            why = loop {
                let tick = [streamless_since, older.went_at]
                    .into_iter()
                    .flatten()
                    .map(|t| t + REREGISTER_AFTER)
                    .fold(tokio::time::Instant::now() + every, |a, b| a.min(b));
                tokio::select! {
                    _ = streams.changed() => {}
                    _ = quit.changed() => {}
                    _ = tokio::time::sleep_until(tick) => {}
                }
                if *quit.borrow() {
                    break Woke::Quit;
                }
                match (*streams.borrow_and_update(), streamless_since) {
                    (0, None) => streamless_since = Some(tokio::time::Instant::now()),
                    (0, Some(t)) if tokio::time::Instant::now() >= t + REREGISTER_AFTER => {
                        break Woke::HungUp
                    }
                    (0, Some(_)) => {}
                    (_, _) => streamless_since = None,
                }
                if !serving.intact() || file_id(&cfg.kubelet_socket()) != seen {
                    break Woke::Kubelet;
                }
                let others = Others::look(&cfg, &class, me).await;
                if others.newer {
                    break Woke::Newer;
                }
                if older.see(&others.older, tokio::time::Instant::now()) {
                    break Woke::OlderCameAndWent;
                }
            };
            match why {
                Woke::HungUp => {
                    tracing::warn!(%resource, "the kubelet holds no device list stream of ours (it dropped the registration): registering again");
                }
                Woke::OlderCameAndWent => {
                    tracing::warn!(%resource, "an older device plugin served the pool after we registered and stopped (the kubelet may hold its client, not ours): registering again");
                }
                Woke::Kubelet if serving.intact() => {
                    tracing::info!(%resource, "kubelet restarted; registering again");
                }
                _ => break 'registered,
            }
        }
        serving.shutdown().await;
        if matches!(why, Woke::Newer) {
            tracing::info!(%resource, endpoint = %socket.display(), "a newer device plugin serves the pool (a rollout): standing down");
            // Until stopped, or until no newer one serves any more (it
            // died, or its pod went first: the newest live plugin serves),
            // seen in enough checks in a row that it is not a kubelet
            // restart the newer one has yet to notice.
            let (mut empty, mut since) = (0, tokio::time::Instant::now());
            while empty < EMPTY_CHECKS_TO_SERVE_AGAIN || since.elapsed() < EMPTY_FOR_TO_SERVE_AGAIN
            {
                let _ = tokio::time::timeout(every, quit.changed()).await;
                if *quit.borrow() {
                    return Ok(Ended::Replaced);
                }
                if Others::look(&cfg, &class, me).await.newer {
                    (empty, since) = (0, tokio::time::Instant::now());
                } else {
                    empty += 1;
                }
            }
            tracing::warn!(%resource, "no newer device plugin serves the pool any more: serving again");
            // The newer one may have removed the device-info files as it
            // stopped: they are written again before the kubelet allocates.
            let all = cfg.clone();
            if let Ok(Err(e)) =
                tokio::task::spawn_blocking(move || crate::plugin::prepare_all(&all)).await
            {
                tracing::warn!(%resource, "preparing devices again: {e}");
            }
            continue;
        }
        if *quit.borrow() {
            return Ok(Ended::Stopped);
        }
        tracing::info!(%resource, "kubelet restarted and removed our socket; serving and registering again");
    }
}

/// Runs the plugin until `shutdown` completes, then removes its sockets and
/// its device-info files (the CDI spec stays for container restarts).
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let cfg = Arc::new(cfg);
    std::fs::create_dir_all(&cfg.plugin_dir).map_err(io(cfg.plugin_dir.display()))?;
    std::fs::create_dir_all(&cfg.socket_dir).map_err(io(cfg.socket_dir.display()))?;
    // Device-info files for every advertised device before the kubelet can
    // allocate one: a pod whose sandbox is (re)created after a plugin
    // restart finds its file without a new Allocate.
    let all = cfg.clone();
    tokio::task::spawn_blocking(move || crate::plugin::prepare_all(&all))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|e| RunError::Io {
            what: "preparing devices".into(),
            cause: std::io::Error::other(e),
        })?;
    tracing::info!(dir = %cfg.devinfo_dir.display(), "wrote a device-info file for every device");
    if cfg.cdi {
        let path = cdi::write(&cfg).map_err(io(cdi::spec_path(&cfg).display()))?;
        tracing::info!(spec = %path.display(), "wrote the CDI spec");
    } else if std::fs::remove_file(cdi::spec_path(&cfg)).is_ok() {
        // An earlier run's, from when CDI was on.
        tracing::info!(spec = %cdi::spec_path(&cfg).display(), "removed the CDI spec (cdi = false)");
    }
    let (health, health_task) = spawn_health(&cfg);
    let (quit_tx, quit) = watch::channel(false);
    let mut pools = JoinSet::new();
    let me = Instance::this();
    for i in 0..cfg.pools.len() {
        pools.spawn(pool_loop(cfg.clone(), i, me, health.clone(), quit.clone()));
    }
    let mut result = Ok(());
    let mut replaced = false;
    let mut keep = |r: Option<Result<Result<Ended, RunError>, tokio::task::JoinError>>| match r {
        Some(Ok(Err(e))) if result.is_ok() => result = Err(e),
        Some(Ok(Ok(Ended::Replaced))) => replaced = true,
        _ => {}
    };
    tokio::select! {
        _ = shutdown => tracing::info!("stopping"),
        r = pools.join_next() => keep(r),
    }
    let _ = quit_tx.send(true);
    while let Some(r) = pools.join_next().await {
        keep(Some(r));
    }
    health_task.abort();
    // The device-info files are the new plugin's once it has replaced this
    // one (the same files, which its pods read).
    if !replaced {
        for f in devinfo_files(&cfg) {
            let _ = std::fs::remove_file(f);
        }
    }
    // The CDI spec stays: the kubelet passes the same CDI device names on
    // every container restart, including while this plugin is being
    // replaced (a rollout), and a runtime that finds no spec for a name
    // fails the container. The next start rewrites it atomically.
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_instance_that_came_and_went_asks_for_a_registration() {
        let i = |n| Instance { started: n, pid: 1 };
        let t0 = tokio::time::Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        // Serving at our registration (a rollout's old plugin): it stands
        // down; its going asks nothing.
        let mut o = OlderSince::new(vec![i(1)]);
        assert!(!o.see(&[i(1)], t0));
        assert!(!o.see(&[], later(100)));
        assert!(!o.see(&[], later(5000)));
        // ... unless it serves again later, and goes again.
        assert!(!o.see(&[i(1)], later(6000)));
        assert!(!o.see(&[], later(6100)));
        assert!(o.see(&[], later(6100) + REREGISTER_AFTER));
        // Not serving then, serving since (it resumed after a kubelet
        // restart, and may have registered after us), then gone: register
        // again, once the kubelet had its moment.
        let mut o = OlderSince::new(vec![]);
        assert!(!o.see(&[], t0));
        assert!(!o.see(&[i(1)], later(100)));
        assert!(!o.see(&[i(1)], later(200)));
        assert!(!o.see(&[], later(300)));
        assert!(!o.see(&[], later(300) + REREGISTER_AFTER / 2));
        assert!(o.see(&[], later(300) + REREGISTER_AFTER));
    }

    #[test]
    fn endpoints_name_their_instance_and_class() {
        let a = Instance {
            started: 0x18ec22a84211de3e,
            pid: 7,
        };
        let b = Instance {
            started: 0x18ec22a84211de3f,
            pid: 3,
        };
        assert!(a < b, "instances order by start");
        let e = a.endpoint("vhost-user");
        assert_eq!(e, "switchyard-vhost-user-18ec22a84211de3e-7.sock");
        assert_eq!(Instance::of("vhost-user", &e), Some(a));
        // Not another class's, nor the endpoint of a build before instances.
        assert_eq!(Instance::of("memif", &e), None);
        assert_eq!(Instance::of("vhost", &e), None);
        assert_eq!(Instance::of("memif", "switchyard-memif.sock"), None);
    }
}
