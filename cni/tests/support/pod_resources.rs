//! The kubelet's Pod Resources API v1 (`PodResourcesLister` on
//! `pod-resources/kubelet.sock`), served from the same .proto the plugin
//! is built with, as the kubelet answers it (`pkg/kubelet/apis/podresources`
//! `v1PodResourcesServer.List`): every pod on the node with its containers
//! and, per container, the devices the device manager allocated, by
//! resource. The tests record allocations as the kubelet's device manager
//! makes them. (Included with `#[path]` by the CNI and device plugin tests,
//! beside `grpc_unix.rs`.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use switchyard_cni::podresources::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use switchyard_cni::podresources::api::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Lister {
    pods: Arc<Mutex<Vec<PodResources>>>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.pods.lock().unwrap().clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        req: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let r = req.into_inner();
        let pod = self
            .pods
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
            .cloned()
            .ok_or_else(|| Status::not_found("pod not found"))?;
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// The served API; stops when dropped.
pub struct PodResourcesApi {
    /// Its socket.
    pub socket: PathBuf,
    lister: Lister,
    stop: Option<oneshot::Sender<()>>,
    rt: tokio::runtime::Runtime,
}

impl PodResourcesApi {
    /// Serves on `socket` (its directory is made).
    pub fn start(socket: &Path) -> PodResourcesApi {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let lister = Lister::default();
        let stop = super::grpc_unix::serve_unix(
            &rt,
            socket,
            tonic::service::Routes::new(PodResourcesListerServer::new(lister.clone())),
        );
        PodResourcesApi {
            socket: socket.to_path_buf(),
            lister,
            stop: Some(stop),
            rt,
        }
    }

    /// Records that container `container` of pod `namespace/name` was
    /// allocated `ids` of `resource`.
    pub fn allocate(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        resource: &str,
        ids: &[&str],
    ) {
        let mut pods = self.lister.pods.lock().unwrap();
        let i = match pods
            .iter()
            .position(|p| p.namespace == namespace && p.name == name)
        {
            Some(i) => i,
            None => {
                pods.push(PodResources {
                    name: name.into(),
                    namespace: namespace.into(),
                    containers: Vec::new(),
                });
                pods.len() - 1
            }
        };
        let pod = &mut pods[i];
        let c = match pod.containers.iter().position(|c| c.name == container) {
            Some(c) => c,
            None => {
                pod.containers.push(ContainerResources {
                    name: container.into(),
                    ..Default::default()
                });
                pod.containers.len() - 1
            }
        };
        pod.containers[c].devices.push(ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            topology: None,
        });
    }

    /// The pod is gone.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.lister
            .pods
            .lock()
            .unwrap()
            .retain(|p| !(p.namespace == namespace && p.name == name));
    }
}

impl Drop for PodResourcesApi {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
