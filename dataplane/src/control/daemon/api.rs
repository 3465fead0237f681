//! Answers to the control API's requests.

use switchyard_api::{
    ApiError, BridgeInfo, ErrorCode, MacInfo, PortInfo, PortStats, QueueLoad, Request, Response,
    WorkerInfo,
};

use std::sync::atomic::Ordering;

use super::{Daemon, PortEntry};
use crate::config::validate_name;
use crate::types::BURST_BUCKETS;

impl Daemon {
    /// The workers' load, and the receive queues each polls.
    pub(super) fn worker_list(&self) -> Vec<WorkerInfo> {
        let rate = crate::types::ticks_per_second();
        let secs = |t: u64| t as f64 / rate;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let queues = self.dp.rx_queues();
        let mode = serde_json::to_value(self.cfg.dataplane.poll_mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        (0..self.dp.workers())
            .map(|w| {
                let l = self.dp.worker_load(w);
                WorkerInfo {
                    id: w,
                    cpu: self.worker_cpus.get(w).copied().flatten(),
                    mode: mode.clone(),
                    polls: get(&l.polls),
                    busy_polls: get(&l.busy_polls),
                    busy_seconds: secs(get(&l.busy_ticks)),
                    idle_seconds: secs(get(&l.idle_ticks)),
                    frames: get(&l.frames),
                    bursts: BURST_BUCKETS
                        .iter()
                        .zip(&l.bursts)
                        .map(|(&le, c)| (le, get(c)))
                        .collect(),
                    sleeps: get(&l.sleeps),
                    wakeups: get(&l.wakeups),
                    queues: queues
                        .iter()
                        .filter(|(qw, ..)| *qw == w)
                        .filter_map(|(_, port, q, slot)| {
                            let e = self.ports.get(*port as usize)?.as_ref()?;
                            Some(QueueLoad {
                                port: e.spec.name.clone(),
                                queue: *q,
                                frames: get(&slot.load.frames),
                                busy_seconds: secs(get(&slot.load.ticks)),
                            })
                        })
                        .collect(),
                }
            })
            .collect()
    }

    pub(super) fn port_info(&self, e: &PortEntry) -> PortInfo {
        PortInfo {
            spec: e.spec.clone(),
            from_config: e.from_config,
            status: e.port.status(),
        }
    }

    pub(super) fn handle(&mut self, req: Request) -> Response {
        match self.handle_inner(req) {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(e),
        }
    }

    pub(super) fn handle_inner(&mut self, req: Request) -> Result<serde_json::Value, ApiError> {
        match req {
            Request::Ping => Ok(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") })),
            Request::PortAdd { port } => {
                let name = port.name.clone();
                self.create_port(*port, false, false)?;
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
            Request::WorkerList => Ok(to_json(&self.worker_list())),
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

    pub(super) fn sorted_ports(&self) -> impl Iterator<Item = &PortEntry> {
        let mut v: Vec<&PortEntry> = self.ports.iter().flatten().collect();
        v.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        v.into_iter()
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
