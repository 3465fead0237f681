//! A gRPC server on a Unix socket, as the kubelet serves its APIs (tonic,
//! from the same .proto as the client). (Included with `#[path]` by the
//! stand-ins of the kubelet's APIs.)
#![allow(dead_code)]

use std::path::Path;

use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// Serves `routes` on `socket` (replacing a stale file) from `rt` until the
/// returned sender is used or dropped.
pub fn serve_unix(
    rt: &Runtime,
    socket: &Path,
    routes: tonic::service::Routes,
) -> oneshot::Sender<()> {
    let _ = std::fs::remove_file(socket);
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(socket).unwrap()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    rt.spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
    });
    stop
}
