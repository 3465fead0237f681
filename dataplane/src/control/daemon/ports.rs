//! Creating, deleting and persisting ports and bridges, and watching port
//! security.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use switchyard_api::policy::PortPolicy;
use switchyard_api::spec::{RateLimits, ShareRefused};
use switchyard_api::{ApiError, ErrorCode, KindSpec, MacAddr};

use super::{BridgeEntry, Daemon, PortEntry};
use crate::config::{confine_socket, BridgeSpec, PortSpec};
use crate::control::state::{State, STATE_VERSION};
use crate::port::takeover::{FdIn, Saved};
use crate::port::Start;
use crate::switch::policy::PortRules;
use crate::switch::security::PortSecurity;
use crate::types::DropReason;
use crate::vlan::VlanMode;

/// How a new port begins.
pub(crate) enum Begin<'a> {
    /// Started: over the API ([`Start::Now`]: a missing interface is an
    /// error), or as the daemon starts ([`Start::Waiting`]: config, state
    /// file; an uplink may wait for its interface).
    Start(Start),
    /// Taken over from another process: its saved state and the fds that
    /// came with it.
    Restore(Saved, &'a mut FdIn),
}

/// The drop reasons of port security, logged when they grow.
pub(super) const SECURITY_DROPS: [DropReason; 3] = [
    DropReason::MacLimit,
    DropReason::SpoofedSource,
    DropReason::MacMove,
];
/// At most one port-security log line per port in this time.
const SECURITY_LOG_EVERY: Duration = Duration::from_secs(10);

impl Daemon {
    pub(super) fn create_bridge(&mut self, name: &str, from_config: bool) {
        let id = self.dp.add_bridge(self.cfg.mac_table_size);
        self.bridges
            .insert(name.to_string(), BridgeEntry { id, from_config });
    }

    /// Creates a port: `from_config` ports are not persisted; `begin` says
    /// how it starts.
    pub(super) fn create_port(
        &mut self,
        mut spec: PortSpec,
        from_config: bool,
        begin: Begin<'_>,
    ) -> Result<(), ApiError> {
        spec.validate("port.")
            .map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        if let Some(addr) = spec.kind.socket_mut() {
            let invalid = |e: crate::config::ConfigError| {
                ApiError::new(ErrorCode::InvalidArgument, e.to_string())
            };
            *addr = confine_socket("port.socket", &self.cfg.socket_dir, addr).map_err(invalid)?;
            if let Some(path) = addr.path() {
                self.cfg
                    .refuse_reserved("port.socket", path)
                    .map_err(invalid)?;
            }
        }
        if self.port_names.contains_key(&spec.name) {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!("port.name: a port named {:?} exists", spec.name),
            ));
        }
        // A port taken over shares as it did in the switch that checked it
        // (the listener still refuses an interface taken twice): a
        // takeover's thousand ports are not a million comparisons.
        let checked = matches!(begin, Begin::Restore(..));
        if let Some(mine) = spec.kind.socket().filter(|_| !checked) {
            // Ports that serve or connect to one socket as interfaces of
            // their own share it (memif's ids).
            for other in self.ports.iter().flatten() {
                let Some(theirs) = other.spec.kind.socket().filter(|s| s.addr == mine.addr) else {
                    continue;
                };
                let msg = match mine.shares_with(&theirs) {
                    Ok(()) => continue,
                    Err(ShareRefused::Taken) => format!(
                        "port.socket: {} is used by port {:?}",
                        mine.addr, other.spec.name
                    ),
                    Err(ShareRefused::SameInterface) => format!(
                        "port.id: port {:?} is interface {} of {}",
                        other.spec.name,
                        theirs.interface.unwrap_or(0),
                        mine.addr
                    ),
                    Err(ShareRefused::OtherGroup) => format!(
                        "port.socket_group: port {:?} made {} with group {}",
                        other.spec.name,
                        mine.addr,
                        theirs
                            .group
                            .map_or_else(|| "none".to_string(), |g| g.to_string())
                    ),
                };
                return Err(ApiError::new(ErrorCode::Busy, msg));
            }
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
        // A tap added through the API keeps one MAC for good (in its
        // persisted spec): the host's neighbours never see it change.
        if let (false, KindSpec::Tap(t)) = (from_config, &mut spec.kind) {
            if t.interface_mac.is_none() {
                t.interface_mac = Some(random_local_mac());
            }
        }
        let workers = u16::try_from(self.dp.workers().max(1)).unwrap_or(1);
        let mut port = crate::port::build(&crate::port::registry::Build {
            spec: &spec,
            workers,
            listeners: &self.listeners,
        });
        let rules = compile_rules(spec.policy.as_ref(), spec.ips.as_deref())?;
        let vlan = VlanMode::from_spec(spec.vlan, spec.trunk.as_ref());
        let security = PortSecurity::from_spec(&spec);
        let (id, shared) = self.dp.add_port(&spec.name, bridge, vlan, &security);
        if rules.is_some() {
            self.dp.set_port_rules(id, rules);
        }
        if let Some(limits) = &spec.rate_limit {
            self.dp.set_port_rate_limits(id, limits);
        }
        if let Some(b) = &spec.bridge {
            self.yield_station_macs(b, spec.vlan, spec.trunk.as_ref(), &security.macs);
        }
        if let Err((mac, owner)) = self.dp.pin_macs(id, &security.macs) {
            self.dp.remove_port(id);
            if let Some(b) = &spec.bridge {
                self.repin_stations(b);
            }
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
        // At the daemon's start (config, state file) an uplink may wait
        // for its interface; over the API a missing one is an error.
        let started = match begin {
            Begin::Start(start) => port.start(&self.ctx(id), start),
            Begin::Restore(saved, fds) => port.restore(&self.ctx(id), saved, fds),
        };
        if let Err(e) = started {
            self.dp.remove_port(id);
            if let Some(b) = &spec.bridge {
                self.repin_stations(b);
            }
            let code = match e {
                crate::port::PortError::SocketInUse(_) => ErrorCode::Busy,
                _ => ErrorCode::InvalidArgument,
            };
            let field = if spec.kind.socket().is_some() {
                "socket"
            } else {
                "interface"
            };
            return Err(ApiError::new(code, format!("port.{field}: {e}")));
        }
        let at = spec.kind.socket().map(|s| s.addr.to_string());
        info!(port = %spec.name, kind = spec.kind.name(), role = spec.kind.role_name(), at = at.as_deref().or(spec.kind.interface()).unwrap_or("-"), "port created");
        if self.ports.len() <= id as usize {
            self.ports.resize_with(id as usize + 1, || None);
        }
        self.port_names.insert(spec.name.clone(), id);
        self.unrestored.retain(|(s, _)| s.name != spec.name);
        self.ports[id as usize] = Some(PortEntry {
            spec,
            port,
            shared,
            from_config,
            security_logged: Default::default(),
        });
        Ok(())
    }

    /// Replaces port `name`'s station addresses, L3/L4 policy and
    /// policers (those given; an empty policy, address list or set of
    /// limits takes them away), at once for every frame, persisted.
    pub(super) fn set_port(
        &mut self,
        name: &str,
        ips: Option<Vec<std::net::IpAddr>>,
        policy: Option<PortPolicy>,
        rate_limit: Option<RateLimits>,
    ) -> Result<(), ApiError> {
        let invalid = |e: switchyard_api::spec::SpecError| {
            ApiError::new(ErrorCode::InvalidArgument, e.to_string())
        };
        if let Some(ips) = &ips {
            switchyard_api::policy::validate_ips(ips, "ips").map_err(invalid)?;
        }
        if let Some(p) = &policy {
            p.validate("policy").map_err(invalid)?;
        }
        if let Some(r) = &rate_limit {
            r.validate("rate_limit.").map_err(invalid)?;
        }
        let id = *self.port_names.get(name).ok_or_else(|| {
            ApiError::new(ErrorCode::NotFound, format!("name: no port named {name:?}"))
        })?;
        let Some(e) = self.ports.get_mut(id as usize).and_then(Option::as_mut) else {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("name: no port named {name:?}"),
            ));
        };
        // Everything is checked and compiled before anything changes: a
        // refused call leaves the port as it was.
        let rules = if ips.is_some() || policy.is_some() {
            let ips = match ips {
                Some(v) if v.is_empty() => None,
                Some(v) => Some(v),
                None => e.spec.ips.clone(),
            };
            let policy = match policy {
                Some(p) if !p.isolates() => None,
                Some(p) => Some(p),
                None => e.spec.policy.clone(),
            };
            let rules = compile_rules(policy.as_ref(), ips.as_deref())?;
            Some((ips, policy, rules))
        } else {
            None
        };
        if let Some((ips, policy, rules)) = rules {
            self.dp.set_port_rules(id, rules);
            info!(port = %name, ips = ?ips, ingress_rules = policy.as_ref().and_then(|p| p.ingress.as_ref()).map(Vec::len), egress_rules = policy.as_ref().and_then(|p| p.egress.as_ref()).map(Vec::len), "port policy set");
            e.spec.ips = ips;
            e.spec.policy = policy;
        }
        if let Some(limits) = rate_limit {
            self.dp.set_port_rate_limits(id, &limits);
            info!(port = %name, rx = ?limits.rx.map(|m| m.to_string()), tx = ?limits.tx.map(|m| m.to_string()), "port rate limits set");
            e.spec.rate_limit = (!limits.is_empty()).then_some(limits);
        }
        Ok(())
    }

    /// Once a second: records the MAC a `pin_first` port pinned (persisted,
    /// so a restarted switch pins the same one), and logs port-security
    /// drops, at most once per port every [`SECURITY_LOG_EVERY`].
    pub(super) fn watch_security(&mut self, now: Instant) {
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
            let counts = SECURITY_DROPS.map(|r| totals.drops.get(&r).copied().unwrap_or(0));
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

    pub(super) fn persist(&self) -> Result<(), ApiError> {
        let state = State {
            version: STATE_VERSION,
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
                .chain(self.unrestored.iter().map(|(s, _)| s.clone()))
                .collect(),
            overlay_slices: self.saved_slices(),
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

    pub(super) fn delete_port(&mut self, name: &str) -> Result<(), ApiError> {
        if let Some(i) = self.unrestored.iter().position(|(s, _)| s.name == name) {
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
        // The bridge of a port that held MACs of its own (pinned: a pod's),
        // which a remote station may have wanted.
        let bridge = match self.ports[id as usize].take() {
            Some(mut e) => {
                e.port.remove(&self.ctx(id));
                let held = e.spec.macs.as_ref().is_some_and(|m| !m.is_empty())
                    || e.shared.security.first_pinned().is_some();
                e.spec.bridge.filter(|_| held)
            }
            None => None,
        };
        self.dp.remove_port(id);
        info!(port = %name, "port deleted");
        // A station whose MAC the port had is pinned now.
        if let Some(b) = bridge {
            self.repin_stations(&b);
        }
        Ok(())
    }
}

/// A random locally administered unicast MAC (`x2:..`, as the kernel picks
/// for a new tap).
fn random_local_mac() -> MacAddr {
    let mut b = [0u8; 6];
    // SAFETY: `getrandom` writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // No entropy to be had: the clock's nanoseconds still differ
        // between switches.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    b[0] = (b[0] & 0xfe) | 0x02;
    MacAddr(b)
}

/// A port's policy and addresses compiled for the data path (`None`:
/// neither asks anything of its frames).
fn compile_rules(
    policy: Option<&PortPolicy>,
    ips: Option<&[std::net::IpAddr]>,
) -> Result<Option<std::sync::Arc<PortRules>>, ApiError> {
    PortRules::compile(policy, ips)
        .map(|r| r.map(std::sync::Arc::new))
        .map_err(|e| ApiError::new(ErrorCode::InvalidArgument, format!("port.policy.{e}")))
}
