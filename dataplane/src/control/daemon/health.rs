//! What the daemon does about a dead or stuck worker.
//!
//! **Dead** (a panic in any of the switch's threads): fatal. The panic is
//! logged with the thread and, for a worker, the queues it polled, and the
//! process exits with status 101 at once, before any unwinding: a worker
//! that unwound would leave its ports unpolled behind an API, a readiness
//! probe and metrics that go on answering. VPP and OVS abort on such a
//! fault for their supervisor to restart them; here the supervisor is the
//! DaemonSet (or systemd), and the state file, or a takeover by the next
//! switch, brings every port back. `exit`, not `abort`: the same restart,
//! without a core file in the container's working directory.
//!
//! **Stuck** (alive, but not completing passes over its queues): not
//! fatal from inside, since a worker held up by a paused VM or a debugger
//! comes back by itself. The control thread notes, once a second, whether
//! each worker's pass count moved; a worker with queues whose count has
//! not moved for [`WORKER_STALL_LIMIT`] is logged once as stalled and
//! reported in `worker list`, and `switchyard live` (the DaemonSet's
//! liveness probe) fails while it lasts, so the kubelet restarts the
//! container after the probe's failure threshold.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::{error, info};

use crate::dataplane::Dataplane;
use crate::types::PortId;
use switchyard_api::WORKER_STALL_LIMIT;

/// The exit status of a switch one of whose threads panicked (Rust's own
/// for a panicking `main`).
pub const PANIC_EXIT_STATUS: i32 = 101;

/// Makes a panic in any thread of this process fatal: the default report
/// (thread, location, message), then an error naming what the thread
/// polled, then `exit(101)`. Call once, before the workers start.
pub fn panics_are_fatal() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        match crate::worker::polling() {
            Some(what) => error!(
                thread,
                "{what}: the worker panicked; the switch exits for its supervisor to restart it"
            ),
            None => error!(
                thread,
                "a thread of the switch panicked; the switch exits for its supervisor to restart it"
            ),
        }
        std::process::exit(PANIC_EXIT_STATUS);
    }));
}

/// Per worker, its pass count as last seen and when it last moved, as of
/// the last look.
#[derive(Default)]
pub(super) struct Liveness {
    seen: Vec<Seen>,
    /// When the control thread last looked.
    looked: Option<Instant>,
}

#[derive(Clone, Copy)]
struct Seen {
    polls: u64,
    moved: Instant,
    /// Logged as stalled since it last moved.
    logged: bool,
}

impl Liveness {
    /// Notes each worker's pass count (once a second, from the control
    /// thread); logs a worker with queues that has stalled.
    /// `name` names a port by its id.
    pub(super) fn tick(&mut self, dp: &Dataplane, now: Instant, name: impl Fn(PortId) -> String) {
        let queues = dp.rx_queues();
        self.looked = Some(now);
        self.seen.resize(
            dp.workers(),
            Seen {
                polls: u64::MAX,
                moved: now,
                logged: false,
            },
        );
        for (w, s) in self.seen.iter_mut().enumerate() {
            let polls = dp.worker_load(w).polls.load(Ordering::Relaxed);
            let has_queues = queues.iter().any(|(qw, ..)| *qw == w);
            if polls != s.polls || !has_queues {
                if s.logged {
                    info!(worker = w, "the worker completes its passes again");
                }
                *s = Seen {
                    polls,
                    moved: now,
                    logged: false,
                };
            } else if !s.logged && now.duration_since(s.moved) >= WORKER_STALL_LIMIT {
                s.logged = true;
                let ports: Vec<String> = queues
                    .iter()
                    .filter(|(qw, ..)| *qw == w)
                    .map(|(_, p, q, _)| format!("{} queue {q}", name(*p)))
                    .collect();
                error!(
                    worker = w,
                    "the worker has completed no pass over its queues ({}) in {:?}: stalled, `switchyard live` fails",
                    ports.join(", "),
                    WORKER_STALL_LIMIT
                );
            }
        }
    }

    /// Seconds, as of the last look, since worker `w` was last seen to
    /// complete a pass or to have no queue (under a second while it runs).
    /// As of the look, not of now: a stall is reported once that look has
    /// logged it.
    pub(super) fn stalled_seconds(&self, w: usize) -> f64 {
        match (self.seen.get(w), self.looked) {
            (Some(s), Some(at)) => at.duration_since(s.moved).as_secs_f64(),
            _ => 0.0,
        }
    }
}
