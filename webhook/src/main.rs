//! `switchyard-webhook`: the NetworkResource mutating admission webhook.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use switchyard_webhook::review::{FailurePolicy, Nads, Policy};
use switchyard_webhook::serve::{serve, Settings};

/// Adds the device resources of a pod's Switchyard networks to the pod.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address and port to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// PEM certificate chain.
    #[arg(long, default_value = "/etc/switchyard-webhook/tls/tls.crt")]
    tls_cert: PathBuf,
    /// PEM private key.
    #[arg(long, default_value = "/etc/switchyard-webhook/tls/tls.key")]
    tls_key: PathBuf,
    /// When a NetworkAttachmentDefinition cannot be read: refuse the pod
    /// (fail) or admit it unchanged (ignore); match the
    /// MutatingWebhookConfiguration's failurePolicy.
    #[arg(long, value_enum, default_value = "fail")]
    failure_policy: FailurePolicy,
    /// On SIGTERM, seconds to go on answering reviews, not ready, before
    /// stopping: the Service takes the pod out of its endpoints meanwhile,
    /// so a rollout refuses no admission. Keep it, plus 5 s, within the
    /// pod's terminationGracePeriodSeconds.
    #[arg(long, default_value_t = 5)]
    shutdown_delay_secs: u64,
    /// Multus's namespace (its `multusNamespace`): where a pod's
    /// `v1.multus-cni.io/default-network` is read when it names no
    /// namespace.
    #[arg(long, default_value = "kube-system")]
    multus_namespace: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // In a pod: the service account; elsewhere: $KUBECONFIG.
        let client = kube::Client::try_default()
            .await
            .context("Kubernetes API client")?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        serve(
            Settings {
                listen: args.listen,
                cert: args.tls_cert,
                key: args.tls_key,
                policy: Policy {
                    failure: args.failure_policy,
                    multus_namespace: args.multus_namespace,
                },
                shutdown_delay: std::time::Duration::from_secs(args.shutdown_delay_secs),
            },
            Nads::new(client),
            stop,
        )
        .await
    })
}
