//! The Prometheus endpoint (`metrics_listen`): `GET /metrics` answers in
//! the OpenMetrics text format, written by `prometheus-client`.
//!
//! The endpoint is a client of the control API like any other, on a thread
//! of its own: each scrape asks the daemon for its ports, counters,
//! bridges and workers over the control socket (a few milliseconds), then
//! encodes them. A slow or hostile scraper holds only this thread; the
//! control thread answers it as it answers everyone.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use switchyard_api::{BridgeInfo, Client, PortInfo, PortStats, Request, WorkerInfo};
use tracing::{info, warn};

/// How long a scrape waits for the control API.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// The running endpoint; stopped when dropped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    /// The listening socket, kept to hand to a process taking over.
    listener: OwnedFd,
    /// The address it listens on (the port chosen when 0 was asked).
    pub addr: SocketAddr,
}

impl MetricsServer {
    /// Listens on `listen` and serves scrapes from the daemon whose control
    /// socket is `control`.
    pub fn start(listen: SocketAddr, control: PathBuf) -> std::io::Result<MetricsServer> {
        let l = TcpListener::bind(listen)
            .map_err(|e| std::io::Error::new(e.kind(), format!("metrics_listen {listen}: {e}")))?;
        MetricsServer::serve_on(l, control)
    }

    /// Serves scrapes on `listener`: bound by [`MetricsServer::start`], or
    /// handed over by the process this one took over from.
    pub fn serve_on(listener: TcpListener, control: PathBuf) -> std::io::Result<MetricsServer> {
        let addr = listener.local_addr()?;
        let kept = OwnedFd::from(listener.try_clone()?);
        let server = tiny_http::Server::from_listener(listener, None)
            .map_err(|e| std::io::Error::other(format!("metrics_listen {addr}: {e}")))?;
        let server = Arc::new(server);
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("sy-metrics".into())
            .spawn(move || serve(&s, &control))?;
        info!(%addr, "metrics endpoint listening");
        Ok(MetricsServer {
            server,
            thread: Some(thread),
            listener: kept,
            addr,
        })
    }

    /// The listening socket (to hand over).
    pub fn listener(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, control: &std::path::Path) {
    for req in server.incoming_requests() {
        let path = req.url().split('?').next().unwrap_or("");
        let resp = match (req.method(), path) {
            (tiny_http::Method::Get, "/metrics") => match scrape(control) {
                Ok(body) => tiny_http::Response::from_string(body).with_header(
                    tiny_http::Header::from_bytes(
                        "Content-Type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                    .expect("a valid header"),
                ),
                Err(e) => {
                    warn!("metrics scrape failed: {e}");
                    tiny_http::Response::from_string(format!("{e}\n")).with_status_code(503)
                }
            },
            _ => tiny_http::Response::from_string("see /metrics\n").with_status_code(404),
        };
        let _ = req.respond(resp);
    }
}

/// What one scrape asked the daemon.
#[derive(Debug)]
struct Snapshot {
    ports: Vec<PortInfo>,
    stats: Vec<PortStats>,
    bridges: Vec<BridgeInfo>,
    workers: Vec<WorkerInfo>,
}

/// Asks the daemon and encodes the answer.
fn scrape(control: &std::path::Path) -> anyhow::Result<String> {
    let mut c = Client::connect(control)?;
    c.set_timeout(API_TIMEOUT)?;
    let snapshot = Snapshot {
        ports: c.ask(&Request::port_list())?,
        stats: c.ask(&Request::stats(None))?,
        bridges: c.ask(&Request::bridge_list())?,
        workers: c.ask(&Request::worker_list())?,
    };
    encode(snapshot)
}

fn encode(snapshot: Snapshot) -> anyhow::Result<String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

type Labels = Vec<(&'static str, String)>;

/// One metric family: its name, help, unit, type and samples.
struct Family<'a, V> {
    name: &'a str,
    help: &'a str,
    unit: Option<Unit>,
    samples: Vec<(Labels, V)>,
}

impl<V> Family<'_, V> {
    fn new<'a>(name: &'a str, help: &'a str) -> Family<'a, V> {
        Family {
            name,
            help,
            unit: None,
            samples: Vec::new(),
        }
    }

    fn seconds(mut self) -> Self {
        self.unit = Some(Unit::Seconds);
        self
    }
}

fn counters(enc: &mut DescriptorEncoder, f: Family<'_, Counter>) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(f.name, f.help, f.unit.as_ref(), MetricType::Counter)?;
    for (labels, v) in &f.samples {
        let mut e = m.encode_family(labels)?;
        match *v {
            Counter::Int(n) => e.encode_counter::<NoLabelSet, _, u64>(&n, None)?,
            Counter::Float(x) => e.encode_counter::<NoLabelSet, _, f64>(&x, None)?,
        }
    }
    Ok(())
}

fn gauges(enc: &mut DescriptorEncoder, f: Family<'_, i64>) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(f.name, f.help, f.unit.as_ref(), MetricType::Gauge)?;
    for (labels, v) in &f.samples {
        m.encode_family(labels)?.encode_gauge(v)?;
    }
    Ok(())
}

/// A counter's value: a count or seconds.
#[derive(Clone, Copy)]
enum Counter {
    Int(u64),
    Float(f64),
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        // Ports: labelled with name, kind and bridge, and a tunnel with
        // the remote VTEP it goes to.
        let port_labels = |name: &str| -> Labels {
            let info = self.ports.iter().find(|p| p.spec.name == name);
            let mut l = vec![
                ("port", name.to_string()),
                (
                    "kind",
                    info.map(|p| p.spec.kind.name().to_string())
                        .unwrap_or_default(),
                ),
                (
                    "bridge",
                    info.and_then(|p| p.spec.bridge.clone()).unwrap_or_default(),
                ),
            ];
            if let Some(vtep) = info.and_then(|p| p.spec.kind.options().remote()) {
                l.push(("vtep", vtep.to_string()));
            }
            l
        };
        let per_port = |name, help, get: &dyn Fn(&PortStats) -> u64| {
            let mut f = Family::new(name, help);
            for s in &self.stats {
                f.samples.push((port_labels(&s.name), Counter::Int(get(s))));
            }
            f
        };
        counters(
            &mut enc,
            per_port(
                "switchyard_port_rx_packets",
                "Frames received from the port's peer.",
                &|s| s.totals.rx_packets,
            ),
        )?;
        counters(
            &mut enc,
            per_port(
                "switchyard_port_rx_bytes",
                "Bytes received from the port's peer.",
                &|s| s.totals.rx_bytes,
            ),
        )?;
        counters(
            &mut enc,
            per_port(
                "switchyard_port_tx_packets",
                "Frames delivered to the port's peer.",
                &|s| s.totals.tx_packets,
            ),
        )?;
        counters(
            &mut enc,
            per_port(
                "switchyard_port_tx_bytes",
                "Bytes delivered to the port's peer.",
                &|s| s.totals.tx_bytes,
            ),
        )?;
        let mut drops = Family::new(
            "switchyard_port_drops",
            "Frames dropped, by port (where they came in or were bound) and reason.",
        );
        for s in &self.stats {
            for (reason, n) in &s.totals.drops {
                let mut l = port_labels(&s.name);
                l.push(("reason", reason.to_string()));
                drops.samples.push((l, Counter::Int(*n)));
            }
        }
        counters(&mut enc, drops)?;
        let mut link = Family::new("switchyard_port_link_up", "1 while the port's link is up.");
        let mut connects = Family::new(
            "switchyard_port_connects",
            "Times a peer connected (a count above 1: the peer restarted or reconnected).",
        );
        let mut faults = Family::new(
            "switchyard_port_faults",
            "Peers disconnected for breaking the protocol.",
        );
        for p in &self.ports {
            let l = port_labels(&p.spec.name);
            link.samples.push((l.clone(), i64::from(p.status.link_up)));
            connects
                .samples
                .push((l.clone(), Counter::Int(p.status.connects)));
            faults.samples.push((l, Counter::Int(p.status.faults)));
        }
        gauges(&mut enc, link)?;
        counters(&mut enc, connects)?;
        counters(&mut enc, faults)?;
        let mut macs = Family::new(
            "switchyard_port_mac_entries",
            "MAC table entries learned on or pinned to the port.",
        );
        let mut limit = Family::new(
            "switchyard_port_mac_limit",
            "Most MAC table entries the port may hold (0: no limit).",
        );
        let mut floods = Family::new(
            "switchyard_port_flood_limit",
            "Most frames a second the port may have flooded (0: no limit); beyond it they are dropped (reason flood_limit).",
        );
        for s in &self.stats {
            let l = port_labels(&s.name);
            macs.samples.push((l.clone(), i64::from(s.mac_entries)));
            limit.samples.push((l.clone(), i64::from(s.mac_limit)));
            floods.samples.push((l, i64::from(s.flood_limit)));
        }
        gauges(&mut enc, macs)?;
        gauges(&mut enc, limit)?;
        gauges(&mut enc, floods)?;
        // Policers, of the directions limited.
        let mut rates = Family::new(
            "switchyard_port_rate_limit_bits_per_second",
            "A port's policer rate (direction rx: what it sends into the switch; tx: what the switch sends it); frames beyond it are dropped (reason policed_rx or policed_tx).",
        );
        let mut bursts = Family::new(
            "switchyard_port_rate_limit_burst_bits",
            "The size of a port's policer's bucket of bits.",
        );
        let mut prates = Family::new(
            "switchyard_port_rate_limit_packets_per_second",
            "A port's policer rate in frames a second.",
        );
        let mut pbursts = Family::new(
            "switchyard_port_rate_limit_burst_packets",
            "The size of a port's policer's bucket of frames.",
        );
        for s in &self.stats {
            let Some(limits) = &s.rate_limit else {
                continue;
            };
            for (dir, m) in [("rx", &limits.rx), ("tx", &limits.tx)] {
                let Some(m) = m else { continue };
                let mut l = port_labels(&s.name);
                l.push(("direction", dir.to_string()));
                let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                if let Some((rate, burst)) = m.bits_bucket() {
                    rates.samples.push((l.clone(), gauge(rate)));
                    bursts.samples.push((l.clone(), gauge(burst)));
                }
                if let Some((rate, burst)) = m.packets_bucket() {
                    prates.samples.push((l.clone(), gauge(rate)));
                    pbursts.samples.push((l, gauge(burst)));
                }
            }
        }
        for f in [rates, bursts, prates, pbursts] {
            gauges(&mut enc, f)?;
        }

        // Bridges.
        let mut bmacs = Family::new(
            "switchyard_bridge_mac_entries",
            "The bridge's MAC table entries.",
        );
        let mut bports = Family::new("switchyard_bridge_ports", "Ports in the bridge.");
        for b in &self.bridges {
            let l: Labels = vec![("bridge", b.name.clone())];
            bmacs.samples.push((l.clone(), b.macs as i64));
            bports.samples.push((l, b.ports.len() as i64));
        }
        gauges(&mut enc, bmacs)?;
        gauges(&mut enc, bports)?;
        type BridgeCount = fn(&switchyard_api::BridgeCounts) -> u64;
        let bridge_counters: [(&str, &str, BridgeCount); 6] = [
            (
                "switchyard_bridge_mac_learned",
                "MAC entries learned (new stations, evictions included).",
                |c| c.learned,
            ),
            (
                "switchyard_bridge_mac_moved",
                "MAC entries moved from one port to another.",
                |c| c.moved,
            ),
            (
                "switchyard_bridge_mac_evicted",
                "MAC entries evicted from a full bucket to make room.",
                |c| c.evicted,
            ),
            (
                "switchyard_bridge_mac_aged",
                "MAC entries removed by aging.",
                |c| c.aged,
            ),
            (
                "switchyard_bridge_flooded_packets",
                "Frames flooded to every port (unknown unicast, broadcast, multicast).",
                |c| c.flooded,
            ),
            (
                "switchyard_bridge_neighbour_answers",
                "ARP requests and IPv6 neighbour solicitations the bridge answered from its known neighbours instead of flooding them.",
                |c| c.answered,
            ),
        ];
        for (name, help, get) in bridge_counters {
            let mut f = Family::new(name, help);
            for b in &self.bridges {
                let l: Labels = vec![("bridge", b.name.clone())];
                f.samples.push((l, Counter::Int(get(&b.counters))));
            }
            counters(&mut enc, f)?;
        }

        // Workers.
        let wl = |w: &WorkerInfo| -> Labels {
            vec![
                ("worker", w.id.to_string()),
                ("cpu", w.cpu.map(|c| c.to_string()).unwrap_or_default()),
                ("mode", w.mode.to_string()),
            ]
        };
        let per_worker = |name, help, get: &dyn Fn(&WorkerInfo) -> Counter| {
            let mut f = Family::new(name, help);
            for w in &self.workers {
                f.samples.push((wl(w), get(w)));
            }
            f
        };
        counters(
            &mut enc,
            per_worker(
                "switchyard_worker_busy",
                "Time in passes over the worker's queues that found frames.",
                &|w| Counter::Float(w.busy_seconds),
            )
            .seconds(),
        )?;
        counters(
            &mut enc,
            per_worker(
                "switchyard_worker_idle",
                "Time in passes that found nothing (not asleep).",
                &|w| Counter::Float(w.idle_seconds),
            )
            .seconds(),
        )?;
        counters(
            &mut enc,
            per_worker(
                "switchyard_worker_polls",
                "Passes over the worker's queues.",
                &|w| Counter::Int(w.polls),
            ),
        )?;
        counters(
            &mut enc,
            per_worker(
                "switchyard_worker_busy_polls",
                "Passes that found frames.",
                &|w| Counter::Int(w.busy_polls),
            ),
        )?;
        counters(
            &mut enc,
            per_worker(
                "switchyard_worker_sleeps",
                "Times the worker slept on its queues' interrupts.",
                &|w| Counter::Int(w.sleeps),
            ),
        )?;
        counters(
            &mut enc,
            per_worker(
                "switchyard_worker_wakeups",
                "Sleeps ended by an interrupt or a kick (the rest timed out).",
                &|w| Counter::Int(w.wakeups),
            ),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "switchyard_worker_burst_frames",
                "Frames per non-empty receive burst.",
                None,
                MetricType::Histogram,
            )?;
            for w in &self.workers {
                let mut cumulative = 0;
                let mut buckets: Vec<(f64, u64)> = w
                    .bursts
                    .iter()
                    .map(|&(le, n)| {
                        cumulative += n;
                        (f64::from(le), cumulative)
                    })
                    .collect();
                // The last bucket takes every larger burst: it is +Inf.
                if let Some(last) = buckets.last_mut() {
                    last.0 = f64::INFINITY;
                }
                let labels = wl(w);
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    w.frames as f64,
                    cumulative,
                    &buckets,
                    None,
                )?;
            }
        }

        // Receive queues.
        let mut qframes = Family::new(
            "switchyard_queue_rx_packets",
            "Frames received on a receive queue.",
        );
        let mut qbusy = Family::new(
            "switchyard_queue_busy",
            "Worker time spent receiving and forwarding a queue's frames.",
        )
        .seconds();
        for w in &self.workers {
            for q in &w.queues {
                let l: Labels = vec![
                    ("worker", w.id.to_string()),
                    ("port", q.port.clone()),
                    ("queue", q.queue.to_string()),
                ];
                qframes.samples.push((l.clone(), Counter::Int(q.frames)));
                qbusy.samples.push((l, Counter::Float(q.busy_seconds)));
            }
        }
        counters(&mut enc, qframes)?;
        counters(&mut enc, qbusy)?;
        Ok(())
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Counter::Int(n) => write!(f, "{n}"),
            Counter::Float(x) => write!(f, "{x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_switch_encodes_every_family() {
        let text = encode(Snapshot {
            ports: vec![],
            stats: vec![],
            bridges: vec![],
            workers: vec![],
        })
        .unwrap();
        for family in [
            "switchyard_port_rx_packets counter",
            "switchyard_port_drops counter",
            "switchyard_worker_busy_seconds counter",
            "switchyard_worker_burst_frames histogram",
        ] {
            assert!(text.contains(&format!("# TYPE {family}")), "{text}");
        }
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}
