//! The kubelet's Pod Resources API (v1, `List`): which devices a pod
//! holds. A `deviceID` is only trusted when the kubelet says the pod being
//! attached holds that device, the way Multus itself learns a pod's devices
//! (multus-cni `pkg/kubeletclient`): anyone who may write a
//! NetworkAttachmentDefinition can put a `deviceID` in its config.

use std::path::Path;

use crate::error::{CniError, TRY_AGAIN_LATER};

/// The generated types and client (from `proto/podresources_v1.proto`).
#[cfg(feature = "kubelet")]
#[allow(missing_docs, clippy::all)]
pub mod api {
    tonic::include_proto!("v1");
}

/// The kubelet's socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// How long the kubelet has to answer (Multus allows 10 s).
#[cfg(feature = "kubelet")]
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The devices pod `namespace/name` holds, as (resource, device id), in the
/// order `List` gives them.
#[cfg(feature = "kubelet")]
pub fn pod_devices(
    socket: &Path,
    namespace: &str,
    name: &str,
) -> Result<Vec<(String, String)>, CniError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        CniError::new(
            TRY_AGAIN_LATER,
            format!(
                "kubelet pod resources API at {}: {e} (needed to check the pod's deviceID)",
                socket.display()
            ),
        )
    };
    use hyper_util::rt::TokioIo;
    use tokio::net::UnixStream;
    use tonic::transport::{Endpoint, Uri};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| unreachable(&e))?;
    let path = socket.to_path_buf();
    let list = rt.block_on(async move {
        let channel = Endpoint::from_static("http://[::1]:0")
            .connect_timeout(TIMEOUT)
            .timeout(TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }))
            .await
            .map_err(|e| e.to_string())?;
        api::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(api::ListPodResourcesRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| e.message().to_string())
    });
    let list = list.map_err(|e| unreachable(&e))?;
    Ok(list
        .pod_resources
        .into_iter()
        .filter(|p| p.namespace == namespace && p.name == name)
        .flat_map(|p| p.containers)
        .flat_map(|c| c.devices)
        .flat_map(|d| {
            let r = d.resource_name;
            d.device_ids.into_iter().map(move |id| (r.clone(), id))
        })
        .collect())
}

/// Built without the `kubelet` feature: no client, so no device is known to
/// be the pod's, and the check that asks fails.
#[cfg(not(feature = "kubelet"))]
pub fn pod_devices(
    socket: &Path,
    _namespace: &str,
    _name: &str,
) -> Result<Vec<(String, String)>, CniError> {
    Err(CniError::new(
        TRY_AGAIN_LATER,
        format!(
            "kubelet pod resources API at {}: this plugin was built without its client \
             (feature `kubelet`), so the pod's deviceID cannot be checked",
            socket.display()
        ),
    ))
}
