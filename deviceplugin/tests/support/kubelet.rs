//! The kubelet's side of the Device Plugin API, as the kubelet behaves
//! (`pkg/kubelet/cm/devicemanager`): a registration server on
//! `kubelet.sock` that dials the plugin's endpoint inside Register and asks
//! for its options. (Included with `#[path]` by the device plugin tests,
//! beside `cni/tests/support/grpc_unix.rs`.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
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

/// The kubelet's registration service, as the kubelet behaves: it dials the
/// plugin's endpoint inside Register and asks for its options.
#[derive(Clone)]
pub struct Recorder {
    plugin_dir: PathBuf,
    seen: Arc<Mutex<Vec<RegisterRequest>>>,
}

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = req.into_inner();
        let ch = uds_channel(&self.plugin_dir.join(&req.endpoint))
            .await
            .map_err(|e| Status::failed_precondition(format!("dial plugin: {e}")))?;
        DevicePluginClient::new(ch)
            .get_device_plugin_options(Empty {})
            .await?;
        self.seen.lock().unwrap().push(req);
        Ok(Response::new(Empty {}))
    }
}

/// A fake kubelet serving `kubelet.sock`.
pub struct Kubelet {
    seen: Arc<Mutex<Vec<RegisterRequest>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl Kubelet {
    pub fn start(rt: &Runtime, plugin_dir: &Path) -> Kubelet {
        std::fs::create_dir_all(plugin_dir).unwrap();
        let sock = plugin_dir.join("kubelet.sock");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let svc = Recorder {
            plugin_dir: plugin_dir.to_path_buf(),
            seen: seen.clone(),
        };
        let stop = super::grpc_unix::serve_unix(
            rt,
            &sock,
            tonic::service::Routes::new(RegistrationServer::new(svc)),
        );
        Kubelet {
            seen,
            stop: Some(stop),
        }
    }

    /// Waits for `n` registrations in all; returns them sorted by resource.
    pub fn registrations(&self, n: usize) -> Vec<RegisterRequest> {
        let mut v = wait_for(LIMIT, "registrations", || {
            let s = self.seen.lock().unwrap();
            (s.len() >= n).then(|| s.clone())
        });
        v.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        v
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
