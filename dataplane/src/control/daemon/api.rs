//! Answers to the control API's requests.

use switchyard_api::{
    ApiError, BridgeInfo, CaptureDirection, CaptureInfo, ErrorCode, MacInfo, PortInfo, PortStats,
    PortStatus, QueueLoad, Request, Response, WorkerInfo,
};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Daemon, PortEntry};
use crate::config::validate_name;
use crate::control::observe::{CaptureJob, TraceJob};
use crate::control::server::Answer;
use crate::observe::{capture::MAX_SNAPLEN, trace::MAX_TRACE, Capture, Trace};
use crate::types::{PortId, BURST_BUCKETS};

/// A trace's default wait.
const TRACE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait a trace or a capture's duration may ask for.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

impl Daemon {
    /// The workers' load, and the receive queues each polls.
    pub(super) fn worker_list(&self) -> Vec<WorkerInfo> {
        let rate = crate::types::ticks_per_second();
        let secs = |t: u64| t as f64 / rate;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let queues = self.dp.rx_queues();
        let mode = self.cfg.dataplane.poll_mode;
        (0..self.dp.workers())
            .map(|w| {
                let l = self.dp.worker_load(w);
                WorkerInfo {
                    id: w,
                    cpu: self.worker_cpus.get(w).copied().flatten(),
                    mode,
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
                    stalled_seconds: self.liveness.stalled_seconds(w),
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

    pub(super) fn handle(&mut self, req: Request) -> Answer {
        let r = match req {
            Request::Capture {
                port,
                direction,
                count,
                snaplen,
                format,
                duration_ms,
            } => self.start_capture(port, direction, count, snaplen, format, duration_ms),
            Request::Trace {
                count,
                port,
                timeout_ms,
            } => self.start_trace(count, port, timeout_ms),
            req => {
                return Answer::Now(
                    self.handle_inner(req)
                        .map_or_else(Response::err, Response::ok),
                )
            }
        };
        r.unwrap_or_else(|e| Answer::Now(Response::err(e)))
    }

    fn port_id(&self, field: &str, name: &str) -> Result<PortId, ApiError> {
        self.port_names.get(name).copied().ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("{field}: no port named {name:?}"),
            )
        })
    }

    fn start_capture(
        &mut self,
        port: String,
        direction: CaptureDirection,
        count: Option<u64>,
        snaplen: Option<u32>,
        format: switchyard_api::CaptureFormat,
        duration_ms: Option<u64>,
    ) -> Result<Answer, ApiError> {
        let invalid = |m: String| ApiError::new(ErrorCode::InvalidArgument, m);
        let id = self.port_id("port", &port)?;
        let snaplen = snaplen.unwrap_or(MAX_SNAPLEN);
        if !(14..=MAX_SNAPLEN).contains(&snaplen) {
            return Err(invalid(format!(
                "snaplen: {snaplen} is not in 14..={MAX_SNAPLEN}"
            )));
        }
        if count == Some(0) {
            return Err(invalid("count: must be at least 1".into()));
        }
        let duration = duration_ms.map(Duration::from_millis);
        if duration.is_some_and(|d| d.is_zero() || d > MAX_WAIT) {
            return Err(invalid(format!(
                "duration_ms: must be in 1..={}",
                MAX_WAIT.as_millis()
            )));
        }
        let (rx, tx) = match direction {
            CaptureDirection::Rx => (true, false),
            CaptureDirection::Tx => (false, true),
            CaptureDirection::Both => (true, true),
        };
        let cap = Arc::new(Capture::new(id, rx, tx, snaplen, count));
        match self.dp.start_capture(cap.clone()) {
            Ok(()) => {}
            Err(true) => {
                return Err(ApiError::new(
                    ErrorCode::Busy,
                    format!("port: a capture of {port:?} is running"),
                ))
            }
            Err(false) => {
                return Err(ApiError::new(
                    ErrorCode::NotFound,
                    format!("port: no port named {port:?}"),
                ))
            }
        }
        Ok(Answer::Stream(Box::new(CaptureJob {
            dp: self.dp.clone(),
            cap,
            info: CaptureInfo {
                port,
                format,
                snaplen,
            },
            deadline: duration.map(|d| Instant::now() + d),
            count,
        })))
    }

    fn start_trace(
        &mut self,
        count: Option<u32>,
        port: Option<String>,
        timeout_ms: Option<u64>,
    ) -> Result<Answer, ApiError> {
        let invalid = |m: String| ApiError::new(ErrorCode::InvalidArgument, m);
        let count = count.unwrap_or(10);
        if !(1..=MAX_TRACE).contains(&count) {
            return Err(invalid(format!("count: {count} is not in 1..={MAX_TRACE}")));
        }
        let timeout = timeout_ms.map_or(TRACE_TIMEOUT, Duration::from_millis);
        if timeout > MAX_WAIT {
            return Err(invalid(format!(
                "timeout_ms: at most {}",
                MAX_WAIT.as_millis()
            )));
        }
        let port = port.map(|p| self.port_id("port", &p)).transpose()?;
        let trace = Arc::new(Trace::new(count, port));
        if !self.dp.start_trace(trace.clone()) {
            return Err(ApiError::new(ErrorCode::Busy, "a trace is running"));
        }
        let vteps = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(id, e)| Some((id as PortId, e.as_ref()?.spec.kind.options().remote()?)))
            .collect();
        Ok(Answer::Stream(Box::new(TraceJob {
            dp: self.dp.clone(),
            trace,
            deadline: Instant::now() + timeout,
            vteps,
        })))
    }

    pub(super) fn handle_inner(&mut self, req: Request) -> Result<serde_json::Value, ApiError> {
        match req {
            Request::Ping => Ok(serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "pid_ns": crate::control::pid_namespace(),
            })),
            Request::PortAdd { port } => {
                let name = port.name.clone();
                self.create_port(*port, false, super::Begin::Start(crate::port::Start::Now))?;
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
            Request::PortSet {
                name,
                ips,
                policy,
                rate_limit,
            } => {
                self.set_port(&name, ips, policy, rate_limit)?;
                self.persist()?;
                Ok(serde_json::Value::Null)
            }
            Request::PortList => {
                // The ports a restart could not make are listed too, failed.
                let mut v: Vec<PortInfo> = self
                    .ports
                    .iter()
                    .flatten()
                    .map(|e| self.port_info(e))
                    .chain(self.unrestored.iter().map(|(spec, why)| PortInfo {
                        spec: spec.clone(),
                        from_config: false,
                        status: PortStatus {
                            last_error: Some(why.clone()),
                            failed: Some(why.clone()),
                            ..PortStatus::default()
                        },
                    }))
                    .collect();
                v.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
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
                        flood_limit: e.shared.security.flood_limit(),
                        rate_limit: e.spec.rate_limit.map(|l| l.applied()),
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
                    .keys()
                    .filter_map(|n| self.bridge_info(n))
                    .collect();
                Ok(to_json(&v))
            }
            Request::WorkerList => Ok(to_json(&self.worker_list())),
            Request::Capture { .. } | Request::Trace { .. } => Err(ApiError::new(
                ErrorCode::Internal,
                "streamed requests are answered by handle",
            )),
            Request::VtepAdd {
                overlay,
                remote,
                local,
            } => {
                // Persisted whatever the outcome: a move that failed may
                // have left the VTEP otherwise than it was.
                let v = self.vtep_add(&overlay, remote, local, false);
                self.persist()?;
                Ok(to_json(&v?))
            }
            Request::VtepDel { overlay, remote } => {
                self.vtep_del(&overlay, remote)?;
                self.persist()?;
                Ok(serde_json::Value::Null)
            }
            Request::VtepList => Ok(to_json(&self.vtep_list())),
            Request::VtepStations {
                overlay,
                remote,
                stations,
            } => {
                self.set_stations(&overlay, vec![(remote, stations)], |_| String::new())?;
                Ok(serde_json::Value::Null)
            }
            Request::VtepStationSets { overlay, sets } => {
                let sets = sets.into_iter().map(|s| (s.remote, s.stations)).collect();
                self.set_stations(&overlay, sets, |k| format!("sets[{k}]."))?;
                Ok(serde_json::Value::Null)
            }
            Request::OverlaySlice { overlay, slice } => {
                self.set_overlay_slice(&overlay, slice)?;
                self.persist()?;
                let b = self.bridge_info(&overlay).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!("overlay: {overlay:?} has no bridge"),
                    )
                })?;
                Ok(to_json(&b))
            }
            Request::Takeover { .. } | Request::StandDown => Err(ApiError::new(
                ErrorCode::Internal,
                "answered by the daemon loop",
            )),
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
                            vtep: e.spec.kind.options().remote(),
                            age_secs: now.saturating_sub(r.entry.last_seen),
                            pinned: r.entry.pinned,
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
