//! The `switchyard` command: the daemon's launcher, and its CLI client
//! ([`cli`]).

mod cli;

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

use switchyard::config::Config;
use switchyard::control::daemon::Refused;
use switchyard::control::Daemon;

use cli::{Cli, Cmd};

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run {
            config,
            state_dir,
            takeover,
            no_restart,
            linger,
        } => run(
            config,
            state_dir,
            cli.control,
            Launch {
                takeover,
                restart: !no_restart,
                linger,
            },
        ),
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

/// How `run` starts and ends.
struct Launch {
    /// Take over the switch running on the control socket, if one does.
    takeover: bool,
    /// If that is refused, restart it instead.
    restart: bool,
    /// Once replaced, linger instead of exiting.
    linger: bool,
}

/// Runs the switch in the foreground: the configuration file (else the
/// embedded one), with the paths the flags give, as `how` says.
fn run(
    config: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    control: Option<PathBuf>,
    how: Launch,
) -> anyhow::Result<()> {
    logging();
    // A dead thread is a dead switch: exit for the supervisor to restart
    // it, rather than run on with ports nobody polls.
    switchyard::control::daemon::panics_are_fatal();
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
    let running = std::os::unix::net::UnixStream::connect(&cfg.control_socket).is_ok();
    let mut d = match (how.takeover, running) {
        (true, true) => match Daemon::take_over(cfg.clone()) {
            Ok(d) => d,
            Err(e) if how.restart && e.downcast_ref::<Refused>().is_some() => {
                tracing::warn!(
                    "{e:#}: falling back to a restart (the running switch stops its ports, this one starts afresh)"
                );
                Daemon::stand_down(&cfg.control_socket)?;
                Daemon::start(cfg).context("cannot start")?
            }
            Err(e) => return Err(e.context("cannot take over")),
        },
        (takeover, _) => {
            if takeover {
                tracing::info!(
                    control = %cfg.control_socket.display(),
                    "no switch runs on the control socket: starting afresh"
                );
            }
            Daemon::start(cfg).context("cannot start")?
        }
    };
    if how.linger {
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
