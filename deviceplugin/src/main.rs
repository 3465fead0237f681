//! `switchyard-device-plugin`: the kubelet device plugin for Switchyard
//! sockets.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use switchyard_device_plugin::config::{Config, DEFAULT_CONFIG};

/// Advertises Switchyard memif / vhost-user sockets to the kubelet.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Configuration file (TOML). Without it the built-in one is used.
    #[arg(long, short, env = "SWITCHYARD_DP_CONFIG")]
    config: Option<PathBuf>,
    /// Print the built-in configuration and exit.
    #[arg(long)]
    print_default_config: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_default_config {
        print!("{DEFAULT_CONFIG}");
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cfg = match &args.config {
        Some(p) => Config::load(p),
        None => Config::parse(DEFAULT_CONFIG),
    }?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        switchyard_device_plugin::run::run(cfg, stop)
            .await
            .context("device plugin")
    })
}
