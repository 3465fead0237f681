//! The `DevicePlugin` gRPC service of one pool.

use std::os::unix::fs::PermissionsExt;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device as ApiDevice, DevicePluginOptions, Empty,
    ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::cdi;
use crate::config::{device_env, Config, Device, Pool};

/// Health strings of the API.
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// The service of one pool. Cheap to clone: each (re)registration serves
/// a clone.
#[derive(Clone)]
pub struct PoolPlugin {
    cfg: Arc<Config>,
    pool: usize,
    health: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
    streams: Arc<watch::Sender<usize>>,
}

impl PoolPlugin {
    /// The service for `cfg.pools[pool]`; `health` is whether the switch
    /// daemon answers; `stop` turning true ends the ListAndWatch streams
    /// (so that the server can shut down); `streams` counts the
    /// ListAndWatch streams open (the kubelet holds one per registration it
    /// keeps: none means it dropped the registration).
    pub fn new(
        cfg: Arc<Config>,
        pool: usize,
        health: watch::Receiver<bool>,
        stop: watch::Receiver<bool>,
        streams: Arc<watch::Sender<usize>>,
    ) -> PoolPlugin {
        PoolPlugin {
            cfg,
            pool,
            health,
            stop,
            streams,
        }
    }

    fn pool(&self) -> &Pool {
        &self.cfg.pools[self.pool]
    }

    fn device(&self, id: &str) -> Option<Device> {
        let n: u32 = id
            .strip_prefix(self.pool().class.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()?;
        // `memif-01` is not `memif-1`.
        self.cfg
            .devices(self.pool())
            .nth(n as usize)
            .filter(|d| d.id == id)
    }

    fn list(&self, healthy: bool) -> ListAndWatchResponse {
        let health = if healthy { HEALTHY } else { UNHEALTHY };
        ListAndWatchResponse {
            devices: self
                .cfg
                .devices(self.pool())
                .map(|d| ApiDevice {
                    id: d.id,
                    health: health.into(),
                    topology: None,
                })
                .collect(),
        }
    }

    /// Prepares one device for a container (again: the files are there
    /// since the plugin started, unless someone removed them).
    fn prepare(&self, d: &Device) -> Result<(), Status> {
        prepare_device(&self.cfg, self.pool(), d)
            .map_err(|e| Status::internal(format!("device {}: {e}", d.id)))
    }

    fn allocate_container(&self, ids: &[String]) -> Result<ContainerAllocateResponse, Status> {
        let mut resp = ContainerAllocateResponse::default();
        let mut sockets = Vec::new();
        for id in &multus_order(ids) {
            let d = self.device(id).ok_or_else(|| {
                Status::invalid_argument(format!("{}: no device {id:?}", self.pool().resource))
            })?;
            self.prepare(&d)?;
            let dir = d.dir.display().to_string();
            resp.mounts.push(Mount {
                container_path: dir.clone(),
                host_path: dir,
                read_only: false,
            });
            let socket = d.socket.display().to_string();
            resp.envs.insert(device_env(&d.id), socket.clone());
            sockets.push(socket);
            if self.cfg.cdi {
                resp.cdi_devices.push(CdiDevice {
                    name: cdi::qualified_name(&d.id),
                });
            }
        }
        resp.envs.insert(self.pool().list_env(), sockets.join(","));
        Ok(resp)
    }
}

/// The device IDs in the order Multus hands them to a pod's networks of
/// one resource, in the networks annotation's order: sorted as strings
/// (multus-cni `pkg/types` `SortDeviceIDs`, v4.3.0 on: `memif-10` before
/// `memif-2`). The `SWITCHYARD_<POOL>_SOCKETS` list follows it, so its n-th
/// socket is the n-th such network's.
pub fn multus_order(ids: &[String]) -> Vec<String> {
    let mut v = ids.to_vec();
    v.sort();
    v
}

/// One ListAndWatch stream open, counted while it lives.
struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    fn new(count: Arc<watch::Sender<usize>>) -> OpenStream {
        count.send_modify(|n| *n += 1);
        OpenStream(count)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PoolPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let me = self.clone();
        let mut health = self.health.clone();
        let mut stop = self.stop.clone();
        let open = OpenStream::new(self.streams.clone());
        tokio::spawn(async move {
            let _open = open;
            loop {
                let healthy = *health.borrow_and_update();
                if tx.send(Ok(me.list(healthy))).await.is_err() {
                    return; // the kubelet hung up
                }
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { return },
                    _ = tx.closed() => return,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        // Every socket is alike: the required ones, then the first others.
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let size = usize::try_from(r.allocation_size).unwrap_or(0);
                let mut ids = r.must_include_device_i_ds;
                for id in r.available_device_i_ds {
                    if ids.len() >= size {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let me = self.clone();
        let reqs = req.into_inner().container_requests;
        // File system work off the async threads.
        let out = tokio::task::spawn_blocking(move || {
            reqs.iter()
                .map(|r| me.allocate_container(&r.devices_ids))
                .collect::<Result<Vec<_>, Status>>()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        tracing::info!(
            resource = %self.pool().resource,
            sockets = ?out.iter().map(|c| &c.envs[&self.pool().list_env()]).collect::<Vec<_>>(),
            "allocated"
        );
        Ok(Response::new(AllocateResponse {
            container_responses: out,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Makes one device ready to be allocated: its socket directory (0700, or
/// 0770 for `socket_group`) and the device-info file Multus copies for the
/// CNI (NPWG Device Information spec 1.1.0, section 4.1.1: written for every
/// device the plugin advertises, kept while it runs).
pub fn prepare_device(cfg: &Config, pool: &Pool, d: &Device) -> Result<(), String> {
    let dir_err = |e: std::io::Error| format!("socket directory {}: {e}", d.dir.display());
    std::fs::create_dir_all(&d.dir).map_err(dir_err)?;
    match cfg.socket_group {
        Some(gid) => switchyard_api::fs::share_with_group(&d.dir, gid, 0o770),
        None => std::fs::set_permissions(&d.dir, std::fs::Permissions::from_mode(0o700)),
    }
    .map_err(dir_err)?;
    let file = cfg.devinfo_file(pool, &d.id);
    pool.device_info(d)
        .write(&file)
        .map_err(|e| format!("device-info: {e}"))
}

/// Prepares every device of every pool (at start).
pub fn prepare_all(cfg: &Config) -> Result<(), String> {
    for pool in &cfg.pools {
        for d in cfg.devices(pool) {
            prepare_device(cfg, pool, &d).map_err(|e| format!("device {}: {e}", d.id))?;
        }
    }
    Ok(())
}

/// Every device-info file the plugin may have written (for cleanup).
pub fn devinfo_files(cfg: &Config) -> Vec<std::path::PathBuf> {
    cfg.pools
        .iter()
        .flat_map(|p| cfg.devices(p).map(move |d| cfg.devinfo_file(p, &d.id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_go_in_multus_order() {
        let ids: Vec<String> = ["memif-2", "memif-10", "memif-1"]
            .map(String::from)
            .to_vec();
        assert_eq!(multus_order(&ids), ["memif-1", "memif-10", "memif-2"]);
    }
}
