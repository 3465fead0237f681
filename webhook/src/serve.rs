//! The HTTPS endpoint: `POST /mutate` takes an `AdmissionReview` v1 as the
//! API server sends it; `GET /healthz` answers while the server runs (503
//! once it is stopping, while it still answers reviews). The
//! certificate and key are PEM files (a Secret mounted from cert-manager or
//! the set-up script), read again when they change.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use kube::api::DynamicObject;
use kube::core::admission::AdmissionReview;

use crate::review::{review, Nads, Policy};

/// How the webhook runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// What to do when a NAD cannot be read, and where Multus is.
    pub policy: Policy,
    /// After `shutdown`, how long the webhook still answers reviews while
    /// `/healthz` says it is stopping: until the Service has taken it out
    /// of its endpoints (the API server still sends reviews to a pod for a
    /// moment after it is told to stop). Then it takes no new connection
    /// and finishes those it has (5 s at most).
    pub shutdown_delay: Duration,
}

struct App {
    nads: Nads,
    policy: Policy,
}

async fn mutate(
    State(app): State<Arc<App>>,
    Json(req): Json<AdmissionReview<DynamicObject>>,
) -> Json<serde_json::Value> {
    Json(wire_form(review(&app.nads, &app.policy, req).await))
}

/// The review as the API server's Go types encode it: `patch` is a `[]byte`,
/// which Go writes as a base64 string (kube's type holds the bytes).
fn wire_form(review: AdmissionReview<DynamicObject>) -> serde_json::Value {
    use base64::Engine;
    let mut v = serde_json::to_value(review).unwrap_or_default();
    if let Some(p) = v.pointer_mut("/response/patch") {
        let bytes: Vec<u8> = serde_json::from_value(p.take()).unwrap_or_default();
        *p = base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .into();
    }
    v
}

/// How often the certificate files are looked at for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(5);

fn modified(s: &Settings) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&s.cert)?, m(&s.key)?))
}

/// Serves until `shutdown` completes.
pub async fn serve(
    settings: Settings,
    nads: Nads,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = RustlsConfig::from_pem_file(&settings.cert, &settings.key)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "TLS certificate {} / key {}: {e}",
                settings.cert.display(),
                settings.key.display()
            )
        })?;
    // Certificates are rotated by replacing the files: load them again
    // once their times change (a look every few seconds: two `stat`s).
    let reload = {
        let (tls, s) = (tls.clone(), settings.clone());
        tokio::spawn(async move {
            let mut seen = modified(&s);
            loop {
                tokio::time::sleep(RELOAD_CHECK).await;
                let now = modified(&s);
                if now.is_some() && now != seen {
                    match tls.reload_from_pem_file(&s.cert, &s.key).await {
                        Ok(()) => tracing::info!("TLS certificate reloaded"),
                        Err(e) => tracing::warn!("TLS certificate reload: {e}"),
                    }
                    seen = now;
                }
            }
        })
    };
    let app = Arc::new(App {
        nads,
        policy: settings.policy.clone(),
    });
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let health = {
        let stopping = stopping.clone();
        move || async move {
            if stopping.load(std::sync::atomic::Ordering::Relaxed) {
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stopping")
            } else {
                (axum::http::StatusCode::OK, "ok")
            }
        }
    };
    let router = Router::new()
        .route("/mutate", post(mutate))
        .route("/healthz", get(health))
        .with_state(app);
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    let delay = settings.shutdown_delay;
    tokio::spawn(async move {
        shutdown.await;
        // Out of the Service first (not ready), reviews still answered.
        stopping.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            delay_secs = delay.as_secs_f64(),
            "stopping: not ready, still answering until the Service lets go"
        );
        tokio::time::sleep(delay).await;
        stopper.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    tracing::info!(listen = %settings.listen, "serving admission reviews");
    let r = axum_server::bind_rustls(settings.listen, tls)
        .handle(handle)
        .serve(router.into_make_service())
        .await;
    reload.abort();
    r.map_err(Into::into)
}
