//! Takeover, both sides: the running daemon gives its ports to the process
//! that asks ([`Daemon::serve_takeover`]), a new one takes them over
//! ([`Daemon::take_over`]). The conversation and its framing are
//! [`crate::control::takeover`]'s; a port's part is [`crate::port::takeover`]
//! and its kind's `persist.rs`.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tracing::{info, warn};

use super::{Begin, Daemon};
use crate::config::Config;
use crate::control::metrics::MetricsServer;
use crate::control::takeover::{
    self as wire, SavedBridge, SavedMac, SavedPort, Step, TakeoverState, WireError,
};
use crate::dataplane::MacSeen;
use crate::port::takeover::{FdIn, FdOut, VERSION};
use crate::switch::policy::conntrack::PortRef;
use crate::types::PortId;
use switchyard_api::{PortTotals, Request};

/// How long the old switch waits for the new one to take everything up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the new switch waits for the go, and the old one for the
/// confirmation that the new one runs.
pub const GO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the new switch waits for the old one's state.
pub const STATE_TIMEOUT: Duration = Duration::from_secs(30);

/// An environment variable for tests of failed takeovers: the new process
/// stops itself (`SIGSTOP`) at the named step, `state` (asked, nothing
/// received yet), `prepare` (the quiet ports received, not yet taken up),
/// `fds` (state and fds received, nothing taken up) or `confirm`
/// (everything taken up, the go received, not yet confirmed), so a test
/// can kill it there, or change something and let it go on (`SIGCONT`).
pub const STOP_AT_ENV: &str = "SWITCHYARD_TAKEOVER_STOP_AT";

fn stop_at(step: &str) {
    if std::env::var(STOP_AT_ENV).is_ok_and(|s| s == step) {
        warn!("{STOP_AT_ENV}={step}: stopping here");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

/// Becomes `switchyard linger`: the same process (a container's PID 1
/// stays), with none of this one's threads, fds or mappings. Returns only
/// if the exec failed, with why.
pub(super) fn linger() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    info!("handed over: lingering until stopped");
    // Blocked before the exec (the mask and a pending signal carry over):
    // a SIGTERM sent to this thread between here and the wait of
    // `switchyard linger` is taken by that wait, not by the default
    // action. (One the daemon's handler took before, in another thread, is
    // lost with the exec: a window of microseconds.)
    let _ = stop_signals().thread_block();
    let e = std::process::Command::new("/proc/self/exe")
        .arg0("switchyard")
        .arg("linger")
        .exec();
    anyhow::anyhow!("handed over, but cannot linger: {e}")
}

/// Waits for SIGTERM or SIGINT (`switchyard linger`), holding nothing.
pub fn wait_to_be_stopped() -> anyhow::Result<()> {
    // Back from the idle priority the handover left it at: its exit, when
    // told, is not put off by busy CPUs.
    set_policy(libc::SCHED_OTHER);
    let set = stop_signals();
    set.thread_block()?;
    let s = set.wait()?;
    info!("{s:?}: the switch that took over runs the ports; exiting");
    Ok(())
}

/// The signals that stop a lingering switch.
fn stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
}

/// A takeover that one of the two switches refused: the running one
/// carries on as it was, healthy, and a restart can replace it (see
/// [`Daemon::stand_down`]).
#[derive(Debug, thiserror::Error)]
#[error("takeover refused: {0}")]
pub struct Refused(pub String);

/// How a takeover ended, for the old switch.
pub(super) enum Served {
    /// The new switch runs the ports: this process exits, leaving them.
    Replaced,
    /// No takeover: this process carries on.
    Kept,
}

impl Daemon {
    /// The old side: gives every port on `conn` to the process that asked
    /// (`version` is the state version it reads). Returns
    /// [`Served::Replaced`] once the new process has confirmed (it runs them
    /// from then on); else the ports stay here, their queues going on where
    /// the rings are ([`Port::resume`](crate::port::Port::resume)).
    pub(super) fn serve_takeover(
        &mut self,
        conn: UnixStream,
        version: u32,
        prepare: bool,
    ) -> Served {
        let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
            .map(|c| c.pid())
            .unwrap_or(0);
        info!(pid = peer, "a new switch asks to take over");
        let served = self.give_ports(&conn, version, prepare, peer);
        if matches!(served, Served::Kept) {
            self.taking_over.store(false, Ordering::Release);
        }
        served
    }

    fn give_ports(&mut self, conn: &UnixStream, version: u32, prepare: bool, peer: i32) -> Served {
        let refuse = |reason: String| {
            warn!(pid = peer, "takeover refused: {reason}");
            let _ = wire::send(conn, &Step::Refused { reason }, &[]);
            Served::Kept
        };
        if version != VERSION {
            return refuse(format!(
                "the new switch reads state version {version}, this one writes {}",
                VERSION
            ));
        }
        let _ = conn.set_write_timeout(Some(GO_TIMEOUT));
        let _ = conn.set_read_timeout(Some(READY_TIMEOUT));
        // Before the pause: the quiet ports, which the new switch takes up
        // while the workers here forward.
        // What the prepare step sent stays allocated until the takeover
        // ends: freed before the pause, its many small allocations leave
        // the allocator's bins to be sorted and merged by the next
        // allocations, in the pause (1 ms with 1000 ports, perf).
        let (prepared, sent) = match prepare {
            true => match self.prepare_ports(conn, peer) {
                Some((p, sent)) => (p, Some(sent)),
                None => return Served::Kept,
            },
            false => (Vec::new(), None),
        };
        let mut taken = vec![false; self.ports.len()];
        for p in &prepared {
            taken[p.id as usize] = true;
        }
        let rest = |id: PortId| !taken[id as usize];
        let paused_at = Instant::now();
        if !self.dp.pause() {
            self.dp.resume();
            return refuse("a worker did not stop at a burst boundary".into());
        }
        // From here on, a failure resumes every port (`resume_ports`):
        // a port may have stopped its queues to save them.
        let mut fds = FdOut::default();
        let bridges = self.saved_bridges(true);
        // The prepared ports are quiet, as `counted_since` checks: nothing
        // of theirs to pause.
        if let Err(reason) = self.pause_ports(rest) {
            self.resume_ports();
            return refuse(reason);
        }
        // A prepared port that is no longer quiet cannot be (only this
        // thread, busy with the handover, changes a connection): checked
        // all the same.
        let counted = match self.counted_since(&prepared) {
            Ok(c) => c,
            Err(reason) => {
                self.resume_ports();
                return refuse(reason);
            }
        };
        let state = match self.save_state(bridges, rest, counted, &mut fds) {
            Ok(s) => s,
            Err(reason) => {
                self.resume_ports();
                return refuse(reason);
            }
        };
        let saved_ports = state.ports.len();
        let state = serde_json::to_value(&state).expect("plain data");
        let saved_at = paused_at.elapsed();
        if let Err(e) = wire::send(conn, &Step::State(state), fds.fds()) {
            self.resume_ports();
            warn!(pid = peer, "takeover failed: cannot send the state: {e}");
            return Served::Kept;
        }
        let sent_at = paused_at.elapsed();
        match wire::recv(conn) {
            Ok((Step::Ready, _)) => {}
            Ok((Step::Refused { reason }, _)) => {
                self.resume_ports();
                warn!(pid = peer, "the new switch refused the takeover: {reason}");
                return Served::Kept;
            }
            other => {
                self.resume_ports();
                warn!(
                    pid = peer,
                    "takeover failed, carrying on: {}",
                    failure(other)
                );
                return Served::Kept;
            }
        }
        let ready_at = paused_at.elapsed();
        if let Err(e) = wire::send(conn, &Step::Go, &[]) {
            // It is gone before the go: it ran nothing.
            self.resume_ports();
            warn!(
                pid = peer,
                "takeover failed, carrying on: cannot send the go: {e}"
            );
            return Served::Kept;
        }
        // The new switch confirms, then runs: the ports are its once its
        // confirmation is here, and never before.
        let _ = conn.set_read_timeout(Some(GO_TIMEOUT));
        let confirmed = match wire::recv(conn) {
            Err(WireError::Io(e)) if timed_out(&e) => {
                // Closing our receiving side makes a confirmation it has
                // not yet written fail (it then exits without running); one
                // written before is still read here. So the two switches
                // agree on who runs the ports.
                let _ = conn.shutdown(std::net::Shutdown::Read);
                let _ = conn.set_nonblocking(true);
                wire::recv(conn)
            }
            other => other,
        };
        match confirmed {
            Ok((Step::Running, _)) => {
                // This process exits now (see `step_aside`): nothing of
                // it is worth the freeing.
                std::mem::forget(sent);
                info!(
                    pid = peer,
                    ports = self.port_names.len(),
                    prepared = prepared.len(),
                    in_pause = saved_ports,
                    paused_ms = paused_at.elapsed().as_secs_f64() * 1e3,
                    saved_ms = ms(saved_at),
                    sent_ms = ms(sent_at),
                    ready_ms = ms(ready_at),
                    "handed over: exiting"
                );
                Served::Replaced
            }
            other => {
                self.resume_ports();
                warn!(
                    pid = peer,
                    "the new switch did not confirm after the go ({}): carrying on",
                    failure(other)
                );
                Served::Kept
            }
        }
    }

    /// Takeover's prepare step, the workers forwarding: sends the quiet
    /// ports ([`Port::quiet`](crate::port::Port::quiet)) and the bridges
    /// (without their MAC tables), and waits until the new switch has taken
    /// them up. Returns those ports with the totals sent, and what was
    /// sent (for the caller to free after the pause), or None (said why)
    /// if the takeover ends here.
    fn prepare_ports(&self, conn: &UnixStream, peer: i32) -> Option<(Vec<Prepared>, Step)> {
        let started = Instant::now();
        let quiet: Vec<PortId> = (self.ports.iter().enumerate())
            .filter(|(_, e)| e.as_ref().is_some_and(|e| e.port.quiet()))
            .map(|(id, _)| id as PortId)
            .collect();
        let bridges = self.saved_bridges(false);
        let mut fds = FdOut::default();
        // Counted first: a frame counted between this and the totals the
        // state takes makes the pause's check differ, and the pause carries
        // what came after those totals: nothing is lost or counted twice.
        let counted: Vec<u64> = (quiet.iter())
            .map(|&id| (self.ports[id as usize].as_ref()).map_or(0, |e| e.shared.counted()))
            .collect();
        let mut which = vec![false; self.ports.len()];
        for &id in &quiet {
            which[id as usize] = true;
        }
        let state = match self.save_state(bridges, |id| which[id as usize], Vec::new(), &mut fds) {
            Ok(s) => s,
            Err(reason) => {
                warn!(pid = peer, "takeover refused: {reason}");
                let _ = wire::send(conn, &Step::Refused { reason }, &[]);
                return None;
            }
        };
        let sent: Vec<Prepared> = (quiet.iter().copied())
            .zip(counted)
            .zip(&state.ports)
            .map(|((id, counted), p)| Prepared {
                id,
                counted,
                totals: p.totals.clone(),
            })
            .collect();
        let step = Step::Prepare(serde_json::to_value(&state).expect("plain data"));
        drop(state);
        if let Err(e) = wire::send(conn, &step, fds.fds()) {
            warn!(
                pid = peer,
                "takeover failed: cannot send the quiet ports: {e}"
            );
            return None;
        }
        match wire::recv(conn) {
            Ok((Step::Prepared, _)) => {}
            Ok((Step::Refused { reason }, _)) => {
                warn!(pid = peer, "the new switch refused the takeover: {reason}");
                return None;
            }
            other => {
                warn!(
                    pid = peer,
                    "takeover failed, carrying on: {}",
                    failure(other)
                );
                return None;
            }
        }
        info!(
            pid = peer,
            ports = sent.len(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "the new switch took up the quiet ports, forwarding on"
        );
        Some((sent, step))
    }

    /// In the pause: what each prepared port counted since its totals were
    /// sent; or why not, if one is no longer quiet.
    fn counted_since(&self, prepared: &[Prepared]) -> Result<Vec<(String, PortTotals)>, String> {
        let mut counted = Vec::new();
        for p in prepared {
            let e = self.ports[p.id as usize]
                .as_ref()
                .filter(|e| e.port.quiet())
                .ok_or_else(|| {
                    format!(
                        "port {:?} changed while the new switch took it up",
                        self.ports[p.id as usize]
                            .as_ref()
                            .map_or("", |e| e.spec.name.as_str())
                    )
                })?;
            if e.shared.counted() != p.counted {
                counted.push((e.spec.name.clone(), e.shared.totals().since(&p.totals)));
            }
        }
        Ok(counted)
    }

    /// Takeover's first step on the ports `which` takes ([`Port::pause`](crate::port::Port::pause)),
    /// the workers paused.
    fn pause_ports(&mut self, which: impl Fn(PortId) -> bool) -> Result<(), String> {
        for id in 0..self.ports.len() {
            if !which(id as PortId) {
                continue;
            }
            if let Some(mut e) = self.ports[id].take() {
                let paused = e.port.pause(&self.ctx(id as PortId));
                let failed = paused.map_err(|err| format!("port {:?}: {err}", e.spec.name));
                self.ports[id] = Some(e);
                failed?;
            }
        }
        Ok(())
    }

    /// After a failed takeover: every port undoes its pause, its queues
    /// going on where the rings are, and the workers resume.
    fn resume_ports(&mut self) {
        for id in 0..self.ports.len() {
            if let Some(mut e) = self.ports[id].take() {
                e.port.resume(&self.ctx(id as PortId));
                self.ports[id] = Some(e);
            }
        }
        self.dp.resume();
    }

    /// The bridges in the order they were made, with their counters and
    /// MAC tables, or (`full` false: the prepare step) as made, empty. In
    /// the pause they are saved before the ports pause (a vhost-user device
    /// that takes its queues back takes its link down, and its MACs out of
    /// the table).
    fn saved_bridges(&self, full: bool) -> Vec<SavedBridge> {
        // Every slot as connections name it, once for all bridges.
        let refs = self.dp.port_refs();
        let mut bridges: Vec<(&String, &super::BridgeEntry)> = self.bridges.iter().collect();
        bridges.sort_by_key(|(_, b)| b.id);
        bridges
            .into_iter()
            .map(|(name, b)| SavedBridge {
                name: name.clone(),
                from_config: b.from_config,
                totals: (self.dp.bridge_stats(b.id))
                    .filter(|_| full)
                    .map(|s| s.totals())
                    .unwrap_or_default(),
                macs: (if full {
                    self.dp.macs_seen(b.id)
                } else {
                    Vec::new()
                })
                .into_iter()
                .filter_map(|m| {
                    let e = self.ports.get(m.port as usize)?.as_ref()?;
                    Some(SavedMac {
                        mac: m.mac,
                        vlan: m.vlan,
                        port: e.spec.name.clone(),
                        age: m.age,
                        pinned: m.pinned,
                    })
                })
                .collect(),
                // The connections policy allowed: their packets go on
                // passing in the new switch as they did.
                connections: if full {
                    // (A connection through a port removed since, whose
                    // slot another took, is left out.)
                    let name = |r: PortRef| {
                        (refs.get(r.id as usize).copied().flatten() == Some(r)).then_some(())?;
                        let e = self.ports.get(r.id as usize)?.as_ref()?;
                        Some(e.spec.name.clone())
                    };
                    // Each port's quota, by its address (a thousand
                    // ports, once, not once a connection).
                    // (Either share: the new switch tells them apart by
                    // whether the owner is the port the connection came
                    // in on.)
                    let quotas: std::collections::HashMap<*const _, &String> =
                        (self.ports.iter().flatten())
                            .flat_map(|e| {
                                [&e.shared.conntrack, &e.shared.conntrack_in]
                                    .map(|q| (std::sync::Arc::as_ptr(q), &e.spec.name))
                            })
                            .collect();
                    let owner = |q: &std::sync::Arc<crate::switch::policy::conntrack::CtQuota>| {
                        quotas
                            .get(&std::sync::Arc::as_ptr(q))
                            .map(|n| n.to_string())
                    };
                    self.dp
                        .conntrack()
                        .export(b.id, self.dp.now_secs(), name, owner)
                } else {
                    Vec::new()
                },
            })
            .collect()
    }

    /// Saves the ports `which` takes (paused, or quiet) with `bridges` and
    /// `counted`, their fds into `fds`.
    fn save_state(
        &self,
        bridges: Vec<SavedBridge>,
        which: impl Fn(PortId) -> bool,
        counted: Vec<(String, PortTotals)>,
        fds: &mut FdOut,
    ) -> Result<TakeoverState, String> {
        let control_listener = fds.add(
            self.control_listener
                .as_ref()
                .ok_or("the control socket is not served yet")?
                .as_fd(),
        );
        let metrics_listener = self.metrics.as_ref().map(|m| fds.add(m.listener()));
        let mut ports = Vec::new();
        for (id, e) in self.ports.iter().enumerate() {
            let Some(e) = e.as_ref().filter(|_| which(id as PortId)) else {
                continue;
            };
            let saved = e.port.save(&self.ctx(id as PortId), fds);
            ports.push(SavedPort {
                spec: e.spec.clone(),
                from_config: e.from_config,
                totals: e.shared.totals(),
                state: saved.map_err(|err| format!("port {:?}: {err}", e.spec.name))?,
            });
        }
        Ok(TakeoverState {
            version: VERSION,
            pid: std::process::id(),
            config: serde_json::to_value(&self.cfg).expect("plain data"),
            control_listener,
            metrics_listener,
            bridges,
            ports,
            unrestored: self.unrestored.clone(),
            counted,
            // Left out when none, as the other optional fields: a takeover
            // back to a build before them still reads the state.
            overlay_slices: Some(self.saved_slices()).filter(|s| !s.is_empty()),
            stations: self.saved_stations(),
        })
    }

    /// The new side: asks the switch running on `cfg`'s control socket for
    /// its ports and takes them up; on success the daemon runs them, its
    /// API served on the same socket. Any failure before the go leaves the
    /// old switch running them, as it was.
    pub fn take_over(cfg: Config) -> anyhow::Result<Daemon> {
        // Everything that needs no state is made before the old switch
        // pauses: threads, the reactor, the clock's calibration.
        let ours = serde_json::to_value(&cfg)?;
        let mut d = Daemon::assemble(cfg, true)?;
        // What the state file keeps beside the ports (the old switch saved
        // it there): the slices, unless the old switch hands them over
        // when it pauses (one set meanwhile is there, not in the file read
        // now).
        if let Ok(saved) = d.store.load() {
            d.restore_slices(saved.overlay_slices);
        }
        let path = d.cfg.control_socket.clone();
        let (mut conn, mut first) = ask_takeover(&path, true)?;
        // A switch before the prepare step refuses the field (its API
        // error line): asked again without, it sends everything in its
        // pause.
        if matches!(&first, Err(WireError::NotAFrame(line)) if line.contains("prepare")) {
            (conn, first) = ask_takeover(&path, false)?;
        }
        let (mut step, mut fds) = first.context("waiting for the running switch's state")?;
        let refuse = |conn: &UnixStream, reason: String| {
            let _ = wire::send(
                conn,
                &Step::Refused {
                    reason: reason.clone(),
                },
                &[],
            );
            anyhow::Error::new(Refused(reason))
        };
        // The quiet ports first, the old switch forwarding meanwhile. What
        // the old switch sent stays allocated until this one runs: freed
        // now, the allocator would sort and merge its bins in the pause.
        let mut prepare_sent = None;
        if let Step::Prepare(state) = step {
            stop_at("prepare");
            let state = prepare_sent.insert(state);
            let state = read_state(state, &ours).map_err(|r| refuse(&conn, r))?;
            d.restore_state(state, &mut FdIn::new(fds), true)
                .map_err(|e| refuse(&conn, format!("{e:#}")))?;
            reserve_fds();
            wire::send(&conn, &Step::Prepared, &[])?;
            (step, fds) = wire::recv(&conn).context("waiting for the running switch's state")?;
        }
        let state = match step {
            Step::State(v) => v,
            Step::Refused { reason } => {
                anyhow::bail!("the running switch refused the takeover: {reason}")
            }
            s => anyhow::bail!("the running switch sent {s:?} instead of its state"),
        };
        stop_at("fds");
        let state = read_state(&state, &ours).map_err(|r| refuse(&conn, r))?;
        let mut fds = FdIn::new(fds);
        let (listener, metrics) = d
            .restore_state(state, &mut fds, false)
            .map_err(|e| refuse(&conn, format!("{e:#}")))?;
        let _ = conn.set_read_timeout(Some(GO_TIMEOUT));
        wire::send(&conn, &Step::Ready, &[])?;
        match wire::recv(&conn) {
            Ok((Step::Go, _)) => {}
            other => anyhow::bail!(
                "the running switch did not give the go (it carries on): {}",
                failure(other)
            ),
        }
        stop_at("confirm");
        // Confirmed, then run: a confirmation the old switch no longer
        // takes (it gave up waiting) fails here, and this one exits
        // without having touched a queue.
        wire::send(&conn, &Step::Running, &[])
            .context("the running switch did not take the confirmation (it carries on)")?;
        d.dp.resume();
        let metrics = match (metrics, d.cfg.metrics_listen) {
            (Some(l), _) => Some(MetricsServer::serve_on(l, d.control_socket.clone())?),
            (None, Some(addr)) => Some(MetricsServer::start(addr, d.control_socket.clone())?),
            (None, None) => None,
        };
        d.serve(listener, metrics)?;
        info!(
            control = %d.control_socket.display(),
            ports = d.port_names.len(),
            bridges = d.bridges.len(),
            "switchyard took over"
        );
        // The prepare step's state (1 to 2 ms of freeing with 1000 ports)
        // is freed a second after the workers resumed, never before them:
        // at the normal priority (an idle one could be preempted holding
        // the allocator's lock the daemon thread needs).
        if let Some(v) = prepare_sent.take() {
            let _ = std::thread::Builder::new()
                .name("sy-free".into())
                .spawn(move || {
                    std::thread::sleep(Duration::from_secs(1));
                    drop(v);
                });
        }
        Ok(d)
    }

    /// Asks the switch running on `control` to stop so that this one can
    /// start in its place (a refused takeover falls back to a restart), and
    /// waits until the control socket is free.
    pub fn stand_down(control: &std::path::Path) -> anyhow::Result<()> {
        let mut c = switchyard_api::Client::connect(control)
            .with_context(|| format!("{}", control.display()))?;
        // It answers, then stops; the answer may be cut short by its exit.
        if let Err(switchyard_api::ClientError::Api(e)) = c.call(&Request::StandDown) {
            anyhow::bail!("the running switch will not stand down: {e}");
        }
        let end = Instant::now() + STATE_TIMEOUT;
        while UnixStream::connect(control).is_ok() {
            if Instant::now() > end {
                anyhow::bail!("the running switch did not stop in {STATE_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Makes the bridges and ports taken over (the workers paused), and
    /// returns the listeners to serve on after the go; `prepare`: the
    /// prepare step's (the quiet ports, the old switch forwarding).
    fn restore_state(
        &mut self,
        state: TakeoverState,
        fds: &mut FdIn,
        prepare: bool,
    ) -> anyhow::Result<(UnixListener, Option<std::net::TcpListener>)> {
        let started = Instant::now();
        let n_ports = state.ports.len();
        let d = self;
        let control: OwnedFd = fds.take(state.control_listener)?;
        let listener = UnixListener::from(control.try_clone()?);
        listener.set_nonblocking(false)?;
        let metrics = state
            .metrics_listener
            .map(|i| fds.take(i))
            .transpose()?
            .map(std::net::TcpListener::from);
        d.control_listener = Some(control);
        for b in &state.bridges {
            // Made already by the prepare step, if there was one.
            if !d.bridges.contains_key(&b.name) {
                d.create_bridge(&b.name, b.from_config);
            }
            if let Some(s) = d.bridges.get(&b.name).and_then(|e| d.dp.bridge_stats(e.id)) {
                s.carry(&b.totals);
            }
        }
        for p in state.ports {
            let name = p.spec.name.clone();
            d.create_port(p.spec, p.from_config, Begin::Restore(p.state, fds))
                .map_err(|e| anyhow::anyhow!("port {name:?}: {}", e.message))?;
            if let Some(e) = d
                .port_names
                .get(&name)
                .and_then(|&id| d.ports[id as usize].as_ref())
            {
                e.shared.carry(&p.totals);
            }
        }
        for (name, totals) in &state.counted {
            let port = d
                .port_names
                .get(name)
                .and_then(|&id| d.ports[id as usize].as_ref());
            match port {
                Some(e) => e.shared.carry(totals),
                None => anyhow::bail!("counters of port {name:?}, which was not taken up"),
            }
        }
        // The MAC tables once their ports are there: no frame is flooded
        // that the old switch would have sent to one port.
        for b in &state.bridges {
            let Some(id) = d.bridges.get(&b.name).map(|e| e.id) else {
                continue;
            };
            let seen: Vec<MacSeen> = b
                .macs
                .iter()
                .filter_map(|m| {
                    Some(MacSeen {
                        mac: m.mac,
                        vlan: m.vlan,
                        port: *d.port_names.get(&m.port)?,
                        age: m.age,
                        pinned: m.pinned,
                    })
                })
                .collect();
            d.dp.learn_seen(id, &seen);
            let refs = d.dp.port_refs();
            let port = |name: &str| {
                let id = *d.port_names.get(name)?;
                let e = d.ports.get(id as usize)?.as_ref()?;
                Some((
                    refs.get(id as usize).copied().flatten()?,
                    e.shared.conntrack.clone(),
                    e.shared.conntrack_in.clone(),
                ))
            };
            let taken =
                d.dp.conntrack()
                    .import(id, d.dp.now_secs(), &b.connections, port);
            if taken < b.connections.len() {
                warn!(bridge = %b.name, taken, handed = b.connections.len(), "connections handed over whose ports are not here, or that do not fit: left out");
            }
        }
        d.unrestored = state.unrestored;
        if let Some(slices) = state.overlay_slices {
            d.overlay_slices.clear();
            d.restore_slices(slices);
        }
        d.restore_stations(state.stations);
        if fds.left() > 0 {
            warn!(fds = fds.left(), "fds handed over that no port took");
        }
        info!(
            pid = state.pid,
            ports = n_ports,
            ms = ms(started.elapsed()),
            "took up {}",
            if prepare {
                "the running switch's quiet ports"
            } else {
                "the running switch's ports and bridges"
            }
        );
        Ok((listener, metrics))
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// What went wrong with an expected reply.
fn failure(got: Result<(Step, Vec<OwnedFd>), WireError>) -> String {
    match got {
        Ok((Step::Refused { reason }, _)) => format!("refused: {reason}"),
        Ok((s, _)) => format!("unexpected {s:?}"),
        Err(WireError::Io(e)) if timed_out(&e) => "no answer in time".into(),
        Err(e) => e.to_string(),
    }
}

/// Asks the switch at `path` to be taken over (with the prepare step if
/// `prepare`): the connection and its first answer.
fn ask_takeover(
    path: &std::path::Path,
    prepare: bool,
) -> anyhow::Result<(UnixStream, Result<wire::Received, WireError>)> {
    let conn = UnixStream::connect(path)
        .with_context(|| format!("no switch to take over at {}", path.display()))?;
    conn.set_read_timeout(Some(STATE_TIMEOUT))?;
    conn.set_write_timeout(Some(GO_TIMEOUT))?;
    let mut line = serde_json::to_vec(&Request::Takeover {
        version: VERSION,
        prepare,
    })?;
    line.push(b'\n');
    std::io::Write::write_all(&mut &conn, &line)?;
    stop_at("state");
    let first = wire::recv(&conn);
    Ok((conn, first))
}

/// The running switch's state, if this switch reads its version and runs
/// its configuration (`ours`); else why not.
fn read_state(
    state: &serde_json::Value,
    ours: &serde_json::Value,
) -> Result<TakeoverState, String> {
    let version = state.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(VERSION)) {
        return Err(format!(
            "the running switch wrote state version {}, this one reads {}",
            version.map_or("(none)".to_string(), |v| v.to_string()),
            VERSION
        ));
    }
    let state = <TakeoverState as serde::Deserialize>::deserialize(state)
        .map_err(|e| format!("cannot read the running switch's state: {e}"))?;
    let differ = wire::config_differences(ours, &state.config);
    if !differ.is_empty() {
        return Err(format!(
            "the configuration differs from the running switch's in {}: start the new switch with the same configuration (and change it through the API afterwards), or restart instead",
            differ.join(", ")
        ));
    }
    Ok(state)
}

/// Grows this process's fd table, before the pause, to twice the fds open
/// and 1024 more (within `RLIMIT_NOFILE`): the kernel grows a table that
/// is full by waiting for an RCU grace period when the process has
/// threads, and 6.6 ms of a 1000-port takeover's pause were that wait,
/// at its first fd past 1024 (strace: the dup of the control socket).
fn reserve_fds() {
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let target = (2 * open + 1024)
        .min(usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX))
        .saturating_sub(1);
    let Ok(target) = i32::try_from(target) else {
        return;
    };
    // A duplicate of stdin at or above `target` grows the table to hold
    // it; the table stays that large once the duplicate is closed.
    if let Ok(fd) = nix::fcntl::fcntl(0, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(target)) {
        let _ = nix::unistd::close(fd);
    }
}

/// A port the new switch took up before the pause, and what it had
/// counted then.
struct Prepared {
    id: PortId,
    /// [`PortShared::counted`](crate::dataplane::PortShared::counted).
    counted: u64,
    totals: PortTotals,
}

/// The calling thread runs only when nothing else wants its CPU
/// (`SCHED_IDLE`): after a handover, once it takes no more API calls, the
/// old switch's exit must not delay the new switch's workers (on a node
/// whose control threads share the workers' CPUs). Best effort: a policy
/// the kernel refuses leaves the thread as it is. `switchyard linger`
/// goes back to the normal policy once it runs.
pub(super) fn step_aside() {
    set_policy(libc::SCHED_IDLE);
}

/// Sets the calling thread's scheduling policy (one without a priority:
/// `SCHED_OTHER`, `SCHED_IDLE`), best effort.
fn set_policy(policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` (a valid, initialised
    // struct) and changes only the calling thread's policy (pid 0).
    let _ = unsafe { libc::sched_setscheduler(0, policy, &param) };
}

/// Milliseconds, for the log.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
