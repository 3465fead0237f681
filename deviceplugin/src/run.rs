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

/// Whether the switch daemon answers a ping (blocking, bounded).
fn daemon_healthy(control: &Path, limit: Duration) -> bool {
    use switchyard_api::{Client, Request};
    Client::connect(control)
        .and_then(|mut c| {
            c.set_timeout(limit)?;
            c.ask(&Request::ping())
        })
        .is_ok()
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

/// One pool's endpoint: a gRPC server on its socket.
struct Serving {
    socket: PathBuf,
    id: Option<FileId>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
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
        let service = PoolPlugin::new(cfg, pool, health, stopped.clone());
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
        })
    }

    /// Still ours: the file the kubelet dials is the one we bound.
    fn intact(&self) -> bool {
        self.id.is_some() && file_id(&self.socket) == self.id
    }

    /// Another plugin bound the endpoint in our place (a DaemonSet's new
    /// pod beside the old one in a rollout): the socket is there and not
    /// ours. A kubelet restart removes it instead.
    fn replaced(&self) -> bool {
        file_id(&self.socket).is_some_and(|id| Some(id) != self.id)
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

async fn register(cfg: &Config, pool: usize) -> Result<(), String> {
    let p = &cfg.pools[pool];
    let channel = uds_channel(&cfg.kubelet_socket())
        .await
        .map_err(|e| format!("{}: {e}", cfg.kubelet_socket().display()))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: p.endpoint(),
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
    /// Another plugin serves the pool's endpoint now: it is the kubelet's,
    /// and so are the device-info files.
    Replaced,
}

/// One pool: serve, register, and start over whenever the kubelet restarts
/// (it wipes the plugin dir, so our socket disappears, and it makes a new
/// `kubelet.sock`). When another plugin binds the endpoint in our place (a
/// rollout's new pod, which registers itself), this one stands down.
async fn pool_loop(
    cfg: Arc<Config>,
    pool: usize,
    health: watch::Receiver<bool>,
    mut quit: watch::Receiver<bool>,
) -> Result<Ended, RunError> {
    let every = Duration::from_millis(cfg.health_interval_ms);
    let socket = cfg.plugin_dir.join(cfg.pools[pool].endpoint());
    let resource = cfg.pools[pool].resource.clone();
    loop {
        let serving = Serving::start(socket.clone(), cfg.clone(), pool, health.clone())?;
        // Register (the kubelet may not be up yet).
        let mut kubelet = None;
        while kubelet.is_none() && serving.intact() && !*quit.borrow() {
            let seen = file_id(&cfg.kubelet_socket());
            match register(&cfg, pool).await {
                Ok(()) => {
                    tracing::info!(%resource, endpoint = %socket.display(), "registered with the kubelet");
                    kubelet = seen;
                }
                Err(e) => {
                    tracing::warn!(%resource, "registration: {e}; retrying");
                    let _ = tokio::time::timeout(every, quit.changed()).await;
                }
            }
        }
        // Registered: watch for a kubelet restart.
        while serving.intact() && file_id(&cfg.kubelet_socket()) == kubelet && !*quit.borrow() {
            let _ = tokio::time::timeout(every, quit.changed()).await;
        }
        let replaced = serving.replaced();
        serving.shutdown().await;
        if replaced {
            tracing::info!(%resource, endpoint = %socket.display(), "another device plugin serves the endpoint now (a rollout): standing down");
            let _ = quit.wait_for(|q| *q).await;
            return Ok(Ended::Replaced);
        }
        if *quit.borrow() {
            return Ok(Ended::Stopped);
        }
        tracing::info!(%resource, "kubelet restarted; serving and registering again");
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
    for i in 0..cfg.pools.len() {
        pools.spawn(pool_loop(cfg.clone(), i, health.clone(), quit.clone()));
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
