//! The daemon: one control thread owning every port and bridge, driven by a
//! reactor; worker threads run the data plane.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Receiver};
use tracing::{error, info, warn};

use switchyard_api::{
    ApiError, BridgeInfo, ErrorCode, MacInfo, PortInfo, PortStats, Request, Response,
};

use super::server::{self, Call};
use super::state::{State, StateStore};
use crate::config::{confine_socket, validate_name, BridgeSpec, Config, PortSpec};
use crate::dataplane::{Dataplane, PortShared};
use crate::port::{Port, PortCtx};
use crate::reactor::{Reactor, Token, Waker};
use crate::switch::security::PortSecurity;
use crate::types::{BridgeId, DropReason, PortId};
use crate::vlan::VlanMode;
use crate::worker::{self, WorkerConfig};

const TOKEN_API: u32 = 1;
const TOKEN_SIGNAL: u32 = 2;
const TOKEN_FAULT: u32 = 3;

struct PortEntry {
    spec: PortSpec,
    port: Box<dyn Port>,
    shared: Arc<PortShared>,
    from_config: bool,
    /// Port-security drop counts as last logged, and when.
    security_logged: ([u64; SECURITY_DROPS.len()], Option<Instant>),
}

/// The drop reasons of port security, logged when they grow.
const SECURITY_DROPS: [DropReason; 3] = [
    DropReason::MacLimit,
    DropReason::SpoofedSource,
    DropReason::MacMove,
];
/// At most one port-security log line per port in this time.
const SECURITY_LOG_EVERY: Duration = Duration::from_secs(10);

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
    bridges: BTreeMap<String, BridgeEntry>,
    store: StateStore,
    calls: Receiver<Call>,
    api_waker: Arc<Waker>,
    signals: UnixStream,
    workers: Vec<JoinHandle<()>>,
    control_socket: PathBuf,
    /// Persisted ports that could not be created at start (e.g. their
    /// socket is outside a changed `socket_dir`): kept in the state, so a
    /// fixable cause loses nothing, until deleted or added again.
    unrestored: Vec<PortSpec>,
}

impl Daemon {
    /// Binds the control socket, starts workers, creates configured and
    /// persisted bridges and ports.
    pub fn start(cfg: Config) -> anyhow::Result<Daemon> {
        let reactor = Reactor::new()?;
        let dp = Dataplane::new(cfg.dataplane.workers)?;
        dp.set_mac_move_hold(cfg.mac_move_hold_secs);

        let listener = server::bind(&cfg.control_socket, cfg.control_group)?;
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
        for (i, cpu) in cpus.into_iter().enumerate() {
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
        let store = StateStore::new(&cfg.state_dir);
        let control_socket = cfg.control_socket.clone();
        let mut d = Daemon {
            reactor,
            dp,
            ports: Vec::new(),
            port_names: HashMap::new(),
            bridges: BTreeMap::new(),
            store,
            calls,
            api_waker: api_waker.clone(),
            signals: sig_rx,
            workers,
            control_socket,
            cfg,
            unrestored: Vec::new(),
        };

        for b in d.cfg.bridges.clone() {
            d.create_bridge(&b.name, true);
        }
        for p in d.cfg.ports.clone() {
            if let Err(e) = d.create_port(p.clone(), true) {
                error!(port = %p.name, "cannot create configured port: {}", e.message);
            }
        }
        let saved = d.store.load().unwrap_or_else(|e| {
            // Keep the damaged file: the next save must not overwrite it.
            match d.store.set_aside() {
                Ok(to) => error!(
                    "cannot read persisted state, starting without it (kept as {}): {e}",
                    to.display()
                ),
                Err(e2) => error!("cannot read persisted state, starting without it: {e} ({e2})"),
            }
            State::default()
        });
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
            match d.create_port(p.clone(), false) {
                Ok(()) => info!(port = %p.name, "restored port"),
                Err(e) => {
                    error!(port = %p.name, "cannot restore port (kept in the state until deleted or added again): {}", e.message);
                    d.unrestored.push(p);
                }
            }
        }

        std::thread::Builder::new()
            .name("sy-api".into())
            .spawn(move || server::serve(listener, tx, api_waker))?;
        info!(
            control = %d.control_socket.display(),
            workers = d.cfg.dataplane.workers,
            ports = d.port_names.len(),
            bridges = d.bridges.len(),
            "switchyard ready"
        );
        Ok(d)
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
                self.watch_security(now);
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
            let deadline = self
                .ports
                .iter()
                .flatten()
                .filter_map(|e| e.port.deadline())
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
                    Token::Control(TOKEN_API) => {
                        self.api_waker.drain();
                        while let Ok(call) = self.calls.try_recv() {
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
                        self.shutdown();
                        return Ok(());
                    }
                    Token::Control(_) => {}
                }
            }
        }
    }

    fn shutdown(&mut self) {
        for id in 0..self.ports.len() {
            if let Some(mut e) = self.ports[id].take() {
                e.port.stop(&self.ctx(id as PortId));
            }
        }
        self.dp.request_stop();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        let _ = std::fs::remove_file(&self.control_socket);
        info!("switchyard stopped");
    }

    fn create_bridge(&mut self, name: &str, from_config: bool) {
        let id = self.dp.add_bridge(self.cfg.mac_table_size);
        self.bridges
            .insert(name.to_string(), BridgeEntry { id, from_config });
    }

    fn create_port(&mut self, mut spec: PortSpec, from_config: bool) -> Result<(), ApiError> {
        spec.validate("port.")
            .map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        let socket = confine_socket("port.socket", &self.cfg.socket_dir, &spec.kind)
            .map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        spec.kind.set_socket(socket);
        if self.port_names.contains_key(&spec.name) {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!("port.name: a port named {:?} exists", spec.name),
            ));
        }
        if let Some(other) = self
            .ports
            .iter()
            .flatten()
            .find(|e| e.spec.kind.socket() == spec.kind.socket())
        {
            return Err(ApiError::new(
                ErrorCode::Busy,
                format!(
                    "port.socket: {} is used by port {:?}",
                    spec.kind.socket(),
                    other.spec.name
                ),
            ));
        }
        let bridge = match &spec.bridge {
            None => None,
            Some(b) => Some(
                self.bridges
                    .get(b)
                    .ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::NotFound,
                            format!("port.bridge: no bridge named {b:?}"),
                        )
                    })?
                    .id,
            ),
        };
        let workers = u16::try_from(self.dp.workers().max(1)).unwrap_or(1);
        let mut port = crate::port::build(&spec.name, &spec.kind, workers);
        let vlan = VlanMode::from_spec(spec.vlan, spec.trunk.as_ref());
        let security = PortSecurity::from_spec(&spec);
        let (id, shared) = self.dp.add_port(&spec.name, bridge, vlan, &security);
        if let Err((mac, owner)) = self.dp.pin_macs(id, &security.macs) {
            self.dp.remove_port(id);
            let why = match owner
                .and_then(|o| self.ports.get(o as usize))
                .and_then(Option::as_ref)
            {
                Some(o) => format!("is pinned to port {:?}", o.spec.name),
                None => "cannot be pinned: its MAC table bucket holds only pinned entries".into(),
            };
            return Err(ApiError::new(
                ErrorCode::Busy,
                format!("port.macs: {mac} {why}"),
            ));
        }
        if let Err(e) = port.start(&self.ctx(id)) {
            self.dp.remove_port(id);
            let code = match e {
                crate::port::PortError::SocketInUse(_) => ErrorCode::Busy,
                _ => ErrorCode::InvalidArgument,
            };
            return Err(ApiError::new(code, format!("port.socket: {e}")));
        }
        info!(port = %spec.name, kind = port.kind(), role = spec.kind.role(), socket = spec.kind.socket(), "port created");
        if self.ports.len() <= id as usize {
            self.ports.resize_with(id as usize + 1, || None);
        }
        self.port_names.insert(spec.name.clone(), id);
        self.unrestored.retain(|s| s.name != spec.name);
        self.ports[id as usize] = Some(PortEntry {
            spec,
            port,
            shared,
            from_config,
            security_logged: Default::default(),
        });
        Ok(())
    }

    /// Once a second: records the MAC a `pin_first` port pinned (persisted,
    /// so a restarted switch pins the same one), and logs port-security
    /// drops, at most once per port every [`SECURITY_LOG_EVERY`].
    fn watch_security(&mut self, now: Instant) {
        let mut pinned_any = false;
        for e in self.ports.iter_mut().flatten() {
            if e.spec.pin_first == Some(true) && e.spec.macs.is_none() {
                if let Some(mac) = e.shared.security.first_pinned() {
                    info!(port = %e.spec.name, %mac, "pinned the first source MAC");
                    e.spec.macs = Some(vec![mac]);
                    pinned_any |= !e.from_config;
                }
            }
            if e.security_logged
                .1
                .is_some_and(|t| now < t + SECURITY_LOG_EVERY)
            {
                continue;
            }
            let totals = e.shared.totals();
            let counts = SECURITY_DROPS.map(|r| totals.drops.get(r.name()).copied().unwrap_or(0));
            let (last, _) = e.security_logged;
            if counts == last {
                continue;
            }
            for (i, r) in SECURITY_DROPS.iter().enumerate() {
                let n = counts[i] - last[i];
                if n == 0 {
                    continue;
                }
                let sec = &e.shared.security;
                match r {
                    DropReason::MacLimit => warn!(
                        port = %e.spec.name, dropped = n, limit = sec.limit(),
                        "frames from new source MACs dropped: the port holds as many MAC entries as its limit allows"
                    ),
                    DropReason::SpoofedSource => warn!(
                        port = %e.spec.name, dropped = n,
                        pinned = ?e.spec.macs,
                        "frames dropped: source MAC not the port's own or pinned to another port"
                    ),
                    _ => warn!(
                        port = %e.spec.name, dropped = n,
                        "frames dropped: source MAC in use on another port (MAC move refused)"
                    ),
                }
            }
            e.security_logged = (counts, Some(now));
        }
        if pinned_any {
            if let Err(e) = self.persist() {
                warn!("{}", e.message);
            }
        }
    }

    fn persist(&self) -> Result<(), ApiError> {
        let state = State {
            version: 1,
            bridges: self
                .bridges
                .iter()
                .filter(|(_, b)| !b.from_config)
                .map(|(n, _)| BridgeSpec { name: n.clone() })
                .collect(),
            ports: self
                .ports
                .iter()
                .flatten()
                .filter(|e| !e.from_config)
                .map(|e| e.spec.clone())
                .chain(self.unrestored.iter().cloned())
                .collect(),
        };
        self.store.save(&state).map_err(|e| {
            ApiError::new(
                ErrorCode::Internal,
                format!(
                    "cannot persist state to {}: {e}",
                    self.store.path().display()
                ),
            )
        })
    }

    fn port_info(&self, e: &PortEntry) -> PortInfo {
        PortInfo {
            spec: e.spec.clone(),
            from_config: e.from_config,
            status: e.port.status(),
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        match self.handle_inner(req) {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(e),
        }
    }

    fn handle_inner(&mut self, req: Request) -> Result<serde_json::Value, ApiError> {
        match req {
            Request::Ping => Ok(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") })),
            Request::PortAdd { port } => {
                let name = port.name.clone();
                self.create_port(*port, false)?;
                if let Err(e) = self.persist() {
                    self.delete_port(&name)?;
                    return Err(e);
                }
                let id = self.port_names[&name];
                let e = self.ports[id as usize].as_ref().expect("just created");
                Ok(to_json(&self.port_info(e)))
            }
            Request::PortDel { name } => {
                self.delete_port(&name)?;
                self.persist()?;
                Ok(serde_json::Value::Null)
            }
            Request::PortList => {
                let v: Vec<PortInfo> = self.sorted_ports().map(|e| self.port_info(e)).collect();
                Ok(to_json(&v))
            }
            Request::Stats { name } => {
                if let Some(n) = &name {
                    if !self.port_names.contains_key(n) {
                        return Err(ApiError::new(
                            ErrorCode::NotFound,
                            format!("name: no port named {n:?}"),
                        ));
                    }
                }
                let v: Vec<PortStats> = self
                    .sorted_ports()
                    .filter(|e| name.as_ref().is_none_or(|n| *n == e.spec.name))
                    .map(|e| PortStats {
                        name: e.spec.name.clone(),
                        link_up: e.shared.link_up(),
                        mac_entries: e.shared.security.learned(),
                        mac_limit: e.shared.security.limit(),
                        totals: e.shared.totals(),
                    })
                    .collect();
                Ok(to_json(&v))
            }
            Request::BridgeAdd { name } => {
                validate_name("name", &name)
                    .map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.to_string()))?;
                if self.bridges.contains_key(&name) {
                    return Err(ApiError::new(
                        ErrorCode::AlreadyExists,
                        format!("name: a bridge named {name:?} exists"),
                    ));
                }
                self.create_bridge(&name, false);
                if let Err(e) = self.persist() {
                    if let Some(b) = self.bridges.remove(&name) {
                        self.dp.remove_bridge(b.id);
                    }
                    return Err(e);
                }
                Ok(serde_json::Value::Null)
            }
            Request::BridgeDel { name } => {
                let Some(b) = self.bridges.get(&name) else {
                    return Err(ApiError::new(
                        ErrorCode::NotFound,
                        format!("name: no bridge named {name:?}"),
                    ));
                };
                let members: Vec<&str> = self
                    .ports
                    .iter()
                    .flatten()
                    .filter(|e| e.spec.bridge.as_deref() == Some(name.as_str()))
                    .map(|e| e.spec.name.as_str())
                    .collect();
                if !members.is_empty() {
                    return Err(ApiError::new(
                        ErrorCode::Busy,
                        format!("bridge {name:?} still has ports: {}", members.join(", ")),
                    ));
                }
                let id = b.id;
                self.bridges.remove(&name);
                self.dp.remove_bridge(id);
                self.persist()?;
                Ok(serde_json::Value::Null)
            }
            Request::BridgeList => {
                let v: Vec<BridgeInfo> = self
                    .bridges
                    .iter()
                    .map(|(n, b)| BridgeInfo {
                        name: n.clone(),
                        ports: self
                            .sorted_ports()
                            .filter(|e| e.spec.bridge.as_deref() == Some(n.as_str()))
                            .map(|e| e.spec.name.clone())
                            .collect(),
                        macs: self.dp.mac_table(b.id).map(|m| m.len()).unwrap_or(0),
                        from_config: b.from_config,
                    })
                    .collect();
                Ok(to_json(&v))
            }
            Request::MacList { bridge } => {
                let Some(b) = self.bridges.get(&bridge) else {
                    return Err(ApiError::new(
                        ErrorCode::NotFound,
                        format!("bridge: no bridge named {bridge:?}"),
                    ));
                };
                let now = self.dp.now_secs();
                let mut v: Vec<MacInfo> = self
                    .dp
                    .mac_table(b.id)
                    .map(|m| m.entries())
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|r| {
                        let e = self.ports.get(r.entry.port as usize)?.as_ref()?;
                        Some(MacInfo {
                            mac: r.mac.to_string(),
                            vlan: r.vlan,
                            port: e.spec.name.clone(),
                            age_secs: now.saturating_sub(r.entry.last_seen),
                        })
                    })
                    .collect();
                v.sort_by(|a, b| (a.vlan, &a.mac).cmp(&(b.vlan, &b.mac)));
                Ok(to_json(&v))
            }
        }
    }

    fn sorted_ports(&self) -> impl Iterator<Item = &PortEntry> {
        let mut v: Vec<&PortEntry> = self.ports.iter().flatten().collect();
        v.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        v.into_iter()
    }

    fn delete_port(&mut self, name: &str) -> Result<(), ApiError> {
        if let Some(i) = self.unrestored.iter().position(|s| s.name == name) {
            self.unrestored.remove(i);
            info!(port = %name, "unrestored port deleted");
            return Ok(());
        }
        let Some(id) = self.port_names.remove(name) else {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("name: no port named {name:?}"),
            ));
        };
        if let Some(mut e) = self.ports[id as usize].take() {
            e.port.stop(&self.ctx(id));
        }
        self.dp.remove_port(id);
        info!(port = %name, "port deleted");
        Ok(())
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
