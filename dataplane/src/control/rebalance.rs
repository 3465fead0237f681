//! Receive queues follow the load, as OVS's PMD auto load balance: once a
//! second the control thread measures each worker's busy share and each
//! queue's share of a CPU; when the busiest worker has stayed at the load
//! threshold for the interval, it plans a new assignment (queues by load,
//! heaviest first, each to the worker with the least load so far) and
//! applies it if it lowers the spread of the workers' loads enough.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::info;

use crate::config::DataplaneConfig;
use crate::dataplane::{Dataplane, RxSlot};
use crate::types::{ticks_per_second, PortId};

/// One queue as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueShare {
    /// Its port.
    pub port: PortId,
    /// Its number in the port.
    pub queue: usize,
    /// The worker polling it now.
    pub worker: usize,
    /// Its share of a CPU over the window.
    pub load: f64,
}

/// Where each queue should go: queues by load, heaviest first, each to
/// the worker with the least load so far (its current one on a tie).
/// Returns the workers' planned loads and each queue's worker, in the
/// order of `queues`.
pub fn plan(queues: &[QueueShare], workers: usize) -> (Vec<f64>, Vec<usize>) {
    let mut order: Vec<usize> = (0..queues.len()).collect();
    order.sort_by(|&a, &b| {
        queues[b]
            .load
            .total_cmp(&queues[a].load)
            .then((queues[a].port, queues[a].queue).cmp(&(queues[b].port, queues[b].queue)))
    });
    let mut load = vec![0.0f64; workers];
    let mut to = vec![0; queues.len()];
    for i in order {
        let q = &queues[i];
        let least = (0..workers)
            .min_by(|&a, &b| {
                load[a]
                    .total_cmp(&load[b])
                    .then((a != q.worker).cmp(&(b != q.worker)))
            })
            .unwrap_or(0);
        load[least] += q.load;
        to[i] = least;
    }
    (load, to)
}

/// The variance of the workers' loads.
pub fn variance(loads: &[f64]) -> f64 {
    if loads.is_empty() {
        return 0.0;
    }
    let n = loads.len() as f64;
    let mean = loads.iter().sum::<f64>() / n;
    loads.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / n
}

/// The control thread's balancer.
pub struct Rebalancer {
    interval: Duration,
    load_threshold: f64,
    improvement: f64,
    last: Option<Instant>,
    last_busy: Vec<u64>,
    /// Queue tick counts at the last sample, by slot.
    last_queue: HashMap<usize, u64>,
    /// Ticks each queue spent over the window, by slot.
    window: HashMap<usize, u64>,
    window_secs: f64,
    /// How long the busiest worker has been over the threshold.
    overloaded: Duration,
    last_rebalance: Option<Instant>,
}

fn key(slot: &Arc<RxSlot>) -> usize {
    Arc::as_ptr(slot) as usize
}

impl Rebalancer {
    /// A balancer with the settings of `cfg`.
    pub fn new(cfg: &DataplaneConfig) -> Rebalancer {
        Rebalancer {
            interval: Duration::from_secs(cfg.rebalance_interval_secs),
            load_threshold: f64::from(cfg.rebalance_load_percent) / 100.0,
            improvement: f64::from(cfg.rebalance_improvement_percent) / 100.0,
            last: None,
            last_busy: Vec::new(),
            last_queue: HashMap::new(),
            window: HashMap::new(),
            window_secs: 0.0,
            overloaded: Duration::ZERO,
            last_rebalance: None,
        }
    }

    /// Samples the load (about once a second) and rebalances when due.
    /// Returns the number of queues moved.
    pub fn tick(&mut self, dp: &Dataplane, now: Instant) -> usize {
        let workers = dp.workers();
        let tps = ticks_per_second();
        let busy: Vec<u64> = (0..workers)
            .map(|w| dp.worker_load(w).busy_ticks.load(Ordering::Relaxed))
            .collect();
        let queues = dp.rx_queues();
        let Some(last) = self.last.replace(now) else {
            self.last_busy = busy;
            self.last_queue = queues
                .iter()
                .map(|(.., s)| (key(s), s.load.ticks.load(Ordering::Relaxed)))
                .collect();
            return 0;
        };
        let dt = now.duration_since(last);
        let secs = dt.as_secs_f64().max(1e-3);
        let mut busiest = 0.0f64;
        for (w, b) in busy.iter().enumerate() {
            let prev = self.last_busy.get(w).copied().unwrap_or(*b);
            let share = (b.wrapping_sub(prev) as f64 / tps / secs).clamp(0.0, 1.0);
            dp.set_recent_load(w, share);
            busiest = busiest.max(share);
        }
        self.last_busy = busy;
        let mut seen = HashMap::with_capacity(queues.len());
        for (.., slot) in &queues {
            let k = key(slot);
            let t = slot.load.ticks.load(Ordering::Relaxed);
            let prev = self.last_queue.get(&k).copied().unwrap_or(t);
            *self.window.entry(k).or_default() += t.wrapping_sub(prev);
            seen.insert(k, t);
        }
        self.last_queue = seen;
        self.window.retain(|k, _| self.last_queue.contains_key(k));
        self.window_secs += secs;

        if workers < 2 || self.interval.is_zero() {
            self.reset_window();
            return 0;
        }
        if busiest < self.load_threshold {
            self.overloaded = Duration::ZERO;
            self.reset_window();
            return 0;
        }
        self.overloaded += dt;
        let rested = self
            .last_rebalance
            .is_none_or(|t| now.duration_since(t) >= self.interval);
        if self.overloaded < self.interval || !rested {
            return 0;
        }
        let shares: Vec<QueueShare> = queues
            .iter()
            .map(|(w, port, q, slot)| QueueShare {
                port: *port,
                queue: *q,
                worker: *w,
                load: self.window.get(&key(slot)).copied().unwrap_or(0) as f64
                    / tps
                    / self.window_secs,
            })
            .collect();
        let mut current = vec![0.0; workers];
        for s in &shares {
            current[s.worker.min(workers - 1)] += s.load;
        }
        let (planned, to) = plan(&shares, workers);
        let (before, after) = (variance(&current), variance(&planned));
        self.reset_window();
        self.overloaded = Duration::ZERO;
        self.last_rebalance = Some(now);
        if before <= 0.0 || (before - after) / before < self.improvement {
            return 0;
        }
        let moves: Vec<_> = queues
            .iter()
            .zip(&to)
            .filter(|((w, ..), to)| w != *to)
            .map(|((_, port, q, slot), to)| (*port, *q, slot.clone(), *to))
            .collect();
        let moved = dp.move_queues(&moves);
        if moved > 0 {
            let fmt = |l: &[f64]| {
                l.iter()
                    .map(|x| format!("{:.0}%", x * 100.0))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            info!(
                moved,
                "rebalanced receive queues: worker loads {} -> {} (planned)",
                fmt(&current),
                fmt(&planned)
            );
        }
        moved
    }

    fn reset_window(&mut self) {
        self.window.clear();
        self.window_secs = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(port: PortId, worker: usize, load: f64) -> QueueShare {
        QueueShare {
            port,
            queue: 0,
            worker,
            load,
        }
    }

    #[test]
    fn heavy_queues_on_one_worker_are_spread() {
        // Round robin put both busy queues on worker 0.
        let qs = [q(0, 0, 0.45), q(1, 1, 0.0), q(2, 0, 0.40), q(3, 1, 0.01)];
        let (load, to) = plan(&qs, 2);
        assert_ne!(to[0], to[2], "{to:?}");
        assert!((load[0] - load[1]).abs() < 0.1, "{load:?}");
        assert!(variance(&load) < variance(&[0.85, 0.01]) * 0.25);
    }

    #[test]
    fn a_balanced_assignment_stays_as_it_is() {
        let qs = [q(0, 0, 0.4), q(1, 1, 0.4), q(2, 0, 0.0), q(3, 1, 0.0)];
        let (_, to) = plan(&qs, 2);
        assert_eq!(to, [0, 1, 0, 1]);
    }
}
