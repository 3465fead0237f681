//! The `switchyard` command: the daemon's launcher, and its CLI client
//! ([`cli`]).

mod cli;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use switchyard::config::Config;
use switchyard::control::Daemon;

use cli::{Cli, Cmd};

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run {
            config,
            state_dir,
            takeover,
            linger,
        } => run(config, state_dir, cli.control, takeover, linger),
        Cmd::Linger => {
            logging();
            switchyard::control::daemon::wait_to_be_stopped()
        }
        cmd => cli::run(cmd, cli.control),
    };
    if let Err(e) = res {
        eprintln!("switchyard: {e:#}");
        std::process::exit(1);
    }
}

/// Runs the switch in the foreground: the configuration file (else the
/// embedded one), with the paths the flags give; with `takeover`, taking
/// over the ports of the switch running on the control socket, if one does.
fn run(
    config: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    control: Option<PathBuf>,
    takeover: bool,
    linger: bool,
) -> anyhow::Result<()> {
    logging();
    let mut cfg = match &config {
        Some(p) => Config::load(p)?,
        None => Config::embedded(),
    };
    if let Some(c) = control {
        cfg.control_socket = c;
    }
    if let Some(s) = state_dir {
        cfg.state_dir = s;
    }
    // Again with the paths the flags gave: a port of the config on
    // the control socket they name is refused too.
    cfg.validate()?;
    let mut d = if takeover && std::os::unix::net::UnixStream::connect(&cfg.control_socket).is_ok()
    {
        Daemon::take_over(cfg).context("cannot take over")?
    } else {
        if takeover {
            tracing::info!(
                control = %cfg.control_socket.display(),
                "no switch runs on the control socket: starting afresh"
            );
        }
        Daemon::start(cfg).context("cannot start")?
    };
    if linger {
        d.linger_when_replaced();
    }
    d.run()
}

/// Logs to standard error, at the level `RUST_LOG` gives (info).
fn logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
