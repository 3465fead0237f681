//! The daemon: one control thread owning every port and bridge, driven by a
//! reactor; worker threads run the data plane. This file starts it and runs
//! its event loop; [`ports`] creates, deletes and persists ports and
//! bridges; [`api`] answers the control API.

mod api;
mod health;
mod ports;
mod takeover;
mod vtep;

pub use health::{panics_are_fatal, PANIC_EXIT_STATUS};
pub use takeover::{wait_to_be_stopped, Refused};

pub(crate) use ports::Begin;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Receiver, Sender};
use tracing::{error, info, warn};

use super::server::{self, Call};
use super::state::{State, StateError, StateStore};
use crate::config::{Config, PortSpec};
use crate::dataplane::{Dataplane, PortShared};
use crate::port::socket::Listeners;
use crate::port::{Port, PortCtx, Start};
use crate::reactor::{Reactor, Token, Waker};
use crate::types::{BridgeId, PortId};
use crate::worker::{self, WorkerConfig};
use switchyard_api::Request;

const TOKEN_API: u32 = 1;
const TOKEN_SIGNAL: u32 = 2;
const TOKEN_FAULT: u32 = 3;

struct PortEntry {
    spec: PortSpec,
    port: Box<dyn Port>,
    shared: Arc<PortShared>,
    from_config: bool,
    /// Port-security drop counts as last logged, and when.
    security_logged: ([u64; ports::SECURITY_DROPS.len()], Option<Instant>),
}

/// A remote station as its pin knows it: its MAC and VLAN.
type StationKey = (switchyard_api::MacAddr, Option<u16>);

struct BridgeEntry {
    id: BridgeId,
    from_config: bool,
}

/// The running switch.
pub struct Daemon {
    cfg: Config,
    reactor: Reactor,
    dp: Dataplane,
    ports: Vec<Option<PortEntry>>,
    port_names: HashMap<String, PortId>,
    /// The sockets the switch listens on, each serving its member ports.
    listeners: Arc<Listeners>,
    bridges: BTreeMap<String, BridgeEntry>,
    store: StateStore,
    calls: Receiver<Call>,
    /// The API's way in, until [`Daemon::serve`] hands it to the server.
    calls_tx: Option<Sender<Call>>,
    api_waker: Arc<Waker>,
    signals: UnixStream,
    workers: Vec<JoinHandle<()>>,
    /// Each worker's CPU.
    worker_cpus: Vec<Option<usize>>,
    /// The Prometheus endpoint, if configured.
    metrics: Option<super::metrics::MetricsServer>,
    /// Moves receive queues between workers by load.
    rebalancer: super::rebalance::Rebalancer,
    /// Whether each worker completes its passes.
    liveness: health::Liveness,
    control_socket: PathBuf,
    /// The control socket's listener (the API server has its own copy),
    /// kept to hand over.
    control_listener: Option<OwnedFd>,
    /// A takeover is being handed over (the API server refuses a second).
    taking_over: Arc<AtomicBool>,
    /// Once handed over, wait to be stopped instead of exiting
    /// ([`Daemon::linger_when_replaced`]).
    linger: bool,
    /// Persisted ports that could not be created at start (e.g. their
    /// socket is outside a changed `socket_dir`), with why: kept in the
    /// state, so a fixable cause loses nothing, and listed as failed, until
    /// deleted or added again.
    unrestored: Vec<(PortSpec, String)>,
    /// The slice of each overlay's addresses this node hands out
    /// (`overlay_slice`, persisted).
    overlay_slices: BTreeMap<String, u32>,
    /// The stations behind each overlay's remote VTEPs, as the node agent
    /// gave them (`vtep_stations`), by overlay and remote.
    stations: BTreeMap<(String, std::net::IpAddr), Vec<switchyard_api::RemoteStation>>,
    /// Of those, the (MAC, VLAN)s pinned to their VTEP's tunnel: the ones
    /// answered for.
    pinned: BTreeMap<(String, std::net::IpAddr), std::collections::BTreeSet<StationKey>>,
}

impl Daemon {
    /// Binds the control socket, starts workers, creates configured and
    /// persisted bridges and ports.
    pub fn start(cfg: Config) -> anyhow::Result<Daemon> {
        let listener = server::bind(&cfg.control_socket, cfg.control_group)?;
        // The state before anything is made: a newer release's state stops
        // the start before a port or an interface is touched.
        let store = StateStore::new(&cfg.state_dir);
        let saved = match store.load() {
            Ok(s) => s,
            // A newer release's state: starting without it would lose it
            // at the first save. Refuse, and say what to do.
            Err(e @ StateError::Newer { .. }) => return Err(anyhow::anyhow!("{e}")),
            Err(e) => {
                // Keep the damaged file: the next save must not overwrite it.
                match store.set_aside() {
                    Ok(to) => error!(
                        "cannot read persisted state, starting without it (kept as {}): {e}",
                        to.display()
                    ),
                    Err(e2) => {
                        error!("cannot read persisted state, starting without it: {e} ({e2})")
                    }
                }
                State::default()
            }
        };
        let mut d = Daemon::assemble(cfg, false)?;
        d.control_listener = Some(listener.try_clone()?.into());
        d.populate(saved);
        let metrics = match d.cfg.metrics_listen {
            Some(addr) => Some(super::metrics::MetricsServer::start(
                addr,
                d.control_socket.clone(),
            )?),
            None => None,
        };
        d.serve(listener, metrics)?;
        info!(
            control = %d.control_socket.display(),
            workers = d.cfg.dataplane.workers,
            ports = d.port_names.len(),
            bridges = d.bridges.len(),
            "switchyard ready"
        );
        Ok(d)
    }

    /// The daemon without ports or bridges: reactor, data plane and
    /// workers (`paused`: polling nothing until [`Dataplane::resume`]).
    /// The API is served from [`Daemon::serve`] on.
    fn assemble(cfg: Config, paused: bool) -> anyhow::Result<Daemon> {
        let reactor = Reactor::new()?;
        let dp = Dataplane::new(cfg.dataplane.workers)?;
        dp.set_mac_move_hold(cfg.mac_move_hold_secs);
        if paused {
            dp.pause();
        }
        let store = StateStore::new(&cfg.state_dir);
        let (tx, calls) = unbounded();
        let api_waker = Arc::new(Waker::new()?);
        reactor.add(api_waker.fd(), Token::Control(TOKEN_API))?;
        reactor.add(dp.fault_waker().fd(), Token::Control(TOKEN_FAULT))?;

        let (sig_rx, sig_tx) = UnixStream::pair()?;
        sig_rx.set_nonblocking(true)?;
        for s in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::low_level::pipe::register(s, sig_tx.try_clone()?)?;
        }
        reactor.add(&sig_rx, Token::Control(TOKEN_SIGNAL))?;

        let mut workers = Vec::new();
        let cpus = worker::worker_cpus(
            cfg.dataplane.workers,
            &cfg.dataplane.cpus,
            cfg.dataplane.auto_pin,
            &worker::allowed_cpus(),
        );
        // Measured once, off the API's path (20 ms).
        crate::types::ticks_per_second();
        for (i, &cpu) in cpus.iter().enumerate() {
            let wc = WorkerConfig {
                index: i,
                cpu,
                mode: cfg.dataplane.poll_mode,
                idle_threshold: Duration::from_micros(cfg.dataplane.adaptive_idle_us),
            };
            let d = dp.clone();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("sy-worker-{i}"))
                    .spawn(move || worker::run(d, wc))?,
            );
        }

        std::fs::create_dir_all(&cfg.socket_dir)
            .map_err(|e| anyhow::anyhow!("socket_dir {}: {e}", cfg.socket_dir.display()))?;
        let control_socket = cfg.control_socket.clone();
        Ok(Daemon {
            reactor,
            dp,
            ports: Vec::new(),
            port_names: HashMap::new(),
            listeners: Arc::default(),
            bridges: BTreeMap::new(),
            store,
            calls,
            calls_tx: Some(tx),
            api_waker,
            signals: sig_rx,
            workers,
            worker_cpus: cpus,
            metrics: None,
            rebalancer: super::rebalance::Rebalancer::new(&cfg.dataplane),
            liveness: health::Liveness::default(),
            control_socket,
            control_listener: None,
            taking_over: Arc::default(),
            cfg,
            linger: false,
            unrestored: Vec::new(),
            overlay_slices: BTreeMap::new(),
            stations: BTreeMap::new(),
            pinned: BTreeMap::new(),
        })
    }

    /// Makes the configured bridges, physnets and ports, then the persisted
    /// ones of `saved`.
    fn populate(&mut self, mut saved: State) {
        self.restore_slices(std::mem::take(&mut saved.overlay_slices));
        let d = self;
        for b in d.cfg.bridges.clone() {
            d.create_bridge(&b.name, true);
        }
        // Each physnet: a bridge of its name (unless declared) and its uplink.
        for (name, p) in d.cfg.physnets.clone() {
            if !d.bridges.contains_key(&name) {
                d.create_bridge(&name, true);
            }
            let mut result = d.create_port(p.uplink(&name), true, Begin::Start(Start::Waiting));
            if let (Err(e), Some(fallback)) = (&result, p.fallback(&name)) {
                warn!(physnet = %name, "no af-xdp uplink ({}): using af-packet", e.message);
                result = d.create_port(fallback, true, Begin::Start(Start::Waiting));
            }
            if let Err(e) = result {
                error!(physnet = %name, "cannot create the physnet's uplink: {}", e.message);
            }
        }
        // Each overlay: a bridge of its name (unless declared) and its
        // tunnels to the remote VTEPs the config names.
        for (name, o) in d.cfg.overlays.clone() {
            if !d.bridges.contains_key(&name) {
                d.create_bridge(&name, true);
            }
            for r in o.remotes {
                if let Err(e) = d.vtep_add(&name, r, None, true) {
                    error!(overlay = %name, remote = %r, "cannot join the remote VTEP: {}", e.message);
                }
            }
        }
        for p in d.cfg.ports.clone() {
            if let Err(e) = d.create_port(p.clone(), true, Begin::Start(Start::Waiting)) {
                error!(port = %p.name, "cannot create configured port: {}", e.message);
            }
        }
        for b in saved.bridges {
            if d.bridges.contains_key(&b.name) {
                warn!(bridge = %b.name, "persisted bridge also in config; using config");
            } else {
                d.create_bridge(&b.name, false);
            }
        }
        for p in saved.ports {
            if d.port_names.contains_key(&p.name) {
                warn!(port = %p.name, "persisted port also in config; using config");
                continue;
            }
            match d.create_port(p.clone(), false, Begin::Start(Start::Waiting)) {
                Ok(()) => info!(port = %p.name, "restored port"),
                Err(e) => {
                    error!(port = %p.name, "cannot restore port (kept in the state until deleted or added again): {}", e.message);
                    d.unrestored.push((p, e.message));
                }
            }
        }
    }

    /// Serves the control API on `listener`, and the metrics endpoint.
    fn serve(
        &mut self,
        listener: UnixListener,
        metrics: Option<super::metrics::MetricsServer>,
    ) -> anyhow::Result<()> {
        let tx = self
            .calls_tx
            .take()
            .ok_or_else(|| anyhow::anyhow!("the API is served already"))?;
        let (waker, taking_over) = (self.api_waker.clone(), self.taking_over.clone());
        std::thread::Builder::new()
            .name("sy-api".into())
            .spawn(move || server::serve(listener, tx, waker, taking_over))?;
        self.metrics = metrics;
        Ok(())
    }

    /// Once another switch has taken the ports over, [`Daemon::run`]
    /// becomes `switchyard linger` (the same process, holding nothing,
    /// until it is stopped) instead of exiting: a DaemonSet's container
    /// that exits is started again, and would take the ports back.
    pub fn linger_when_replaced(&mut self) {
        self.linger = true;
    }

    fn ctx(&self, id: PortId) -> PortCtx<'_> {
        PortCtx {
            id,
            reactor: &self.reactor,
            dp: &self.dp,
        }
    }

    /// Runs until SIGTERM or SIGINT, then stops every port cleanly.
    pub fn run(mut self) -> anyhow::Result<()> {
        let mut ready = Vec::new();
        let mut next_tick = Instant::now();
        loop {
            let now = Instant::now();
            if now >= next_tick {
                let t = self.dp.tick();
                self.dp.age_macs(t, self.cfg.mac_aging_secs);
                // An eighth of the connection table a second: each
                // expired connection is forgotten within 8 s.
                self.dp
                    .conntrack()
                    .sweep_part(t, crate::switch::policy::conntrack::SHARDS / 8);
                self.watch_security(now);
                self.rebalancer.tick(&self.dp, now);
                let ports = &self.ports;
                self.liveness.tick(&self.dp, now, |id| {
                    ports
                        .get(id as usize)
                        .and_then(Option::as_ref)
                        .map_or_else(|| format!("port {id}"), |e| e.spec.name.clone())
                });
                next_tick = now + Duration::from_secs(1);
            }
            for id in 0..self.ports.len() {
                let due = self.ports[id]
                    .as_ref()
                    .and_then(|e| e.port.deadline())
                    .is_some_and(|d| d <= now);
                if due {
                    let mut e = self.ports[id].take().expect("checked above");
                    e.port.on_timer(&self.ctx(id as PortId), now);
                    self.ports[id] = Some(e);
                }
            }
            let mut sockets_due = self.listeners.deadline();
            if sockets_due.is_some_and(|d| d <= now) {
                self.listeners.expire(&self.reactor, now);
                sockets_due = self.listeners.deadline();
            }
            let deadline = self
                .ports
                .iter()
                .flatten()
                .filter_map(|e| e.port.deadline())
                .chain(sockets_due)
                .fold(next_tick, Instant::min);
            self.reactor.wait(
                Some(deadline.saturating_duration_since(Instant::now())),
                &mut ready,
            )?;
            for t in ready.clone() {
                match t {
                    Token::Port(id, sub) => {
                        if let Some(mut e) = self.ports.get_mut(id as usize).and_then(Option::take)
                        {
                            e.port.on_ready(&self.ctx(id), sub);
                            self.ports[id as usize] = Some(e);
                        }
                    }
                    Token::Socket(id, sub) => self.listeners.on_ready(&self.reactor, id, sub),
                    Token::Control(TOKEN_API) => {
                        self.api_waker.drain();
                        while let Ok(call) = self.calls.try_recv() {
                            if let (Request::Takeover { version, prepare }, Some(conn)) =
                                (&call.request, call.conn)
                            {
                                match self.serve_takeover(conn, *version, *prepare) {
                                    // Every socket, connection, file and
                                    // mapping is the new switch's now: the
                                    // process ends without a destructor
                                    // (a queue's would still write to its
                                    // ring, an XSK's leave its map).
                                    takeover::Served::Replaced => {
                                        self.end_streams();
                                        self.let_go_of_api();
                                        takeover::step_aside();
                                        if self.linger {
                                            return Err(takeover::linger());
                                        }
                                        std::process::exit(0)
                                    }
                                    takeover::Served::Kept => continue,
                                }
                            }
                            if let Request::StandDown = call.request {
                                warn!("asked to stand down for another switch: stopping");
                                let ok = server::Answer::Now(switchyard_api::Response::ok(
                                    serde_json::Value::Null,
                                ));
                                let _ = call.reply.send(ok);
                                self.let_go_of_api();
                                self.shutdown();
                                if self.linger {
                                    return Err(takeover::linger());
                                }
                                return Ok(());
                            }
                            let r = self.handle(call.request);
                            let _ = call.reply.send(r);
                        }
                    }
                    Token::Control(TOKEN_FAULT) => {
                        for (id, reason) in self.dp.take_faults() {
                            if let Some(mut e) =
                                self.ports.get_mut(id as usize).and_then(Option::take)
                            {
                                e.port.on_fault(&self.ctx(id), &reason);
                                self.ports[id as usize] = Some(e);
                            }
                        }
                    }
                    Token::Control(TOKEN_SIGNAL) => {
                        let mut b = [0u8; 16];
                        let _ = std::io::Read::read(&mut self.signals, &mut b);
                        info!("signal received, stopping");
                        self.let_go_of_api();
                        self.shutdown();
                        return Ok(());
                    }
                    Token::Control(_) => {}
                }
            }
        }
    }

    /// The API's last act before the process goes (taken over, stopped):
    /// the switch takes no more requests (one read from now on is answered
    /// `Unavailable`), answers those queued so, and waits (a second at
    /// most) until every answer in flight is written. So a client never
    /// loses the answer to a request the switch took, and asks every other
    /// again, of the switch that took over or restarted.
    fn let_go_of_api(&mut self) {
        server::stop_taking();
        let end = Instant::now() + Duration::from_secs(1);
        loop {
            while let Ok(call) = self.calls.try_recv() {
                if let Some(conn) = &call.conn {
                    // A second takeover asked meanwhile.
                    let _ = super::takeover::send(conn, &super::takeover::Step::Busy, &[]);
                }
                let _ = call.reply.send(server::Answer::Now(server::unavailable()));
            }
            if server::in_flight() == 0 || Instant::now() > end {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops the workers and lets running captures and traces end with
    /// what they hold (a capture's statistics block), for at most a second.
    fn end_streams(&self) {
        self.dp.request_stop();
        let end = Instant::now() + Duration::from_secs(1);
        while server::streaming() > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn shutdown(&mut self) {
        self.metrics = None;
        for id in 0..self.ports.len() {
            if let Some(mut e) = self.ports[id].take() {
                e.port.stop(&self.ctx(id as PortId));
            }
        }
        self.end_streams();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        let _ = std::fs::remove_file(&self.control_socket);
        info!("switchyard stopped");
    }
}
