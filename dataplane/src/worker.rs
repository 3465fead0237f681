//! Poll-mode workers.
//!
//! Each worker owns a private [`WorkerView`] and polls its receive queues in
//! bursts. In adaptive mode a worker that has found nothing to do for
//! `idle_threshold` unmasks its queues' interrupts, checks once more for
//! frames that raced in, and sleeps in `epoll_wait` on the queues' eventfds
//! and its own wakeup fd. An idle switch thus costs no CPU.
//!
//! The queues' fds are in the worker's epoll set only while it may sleep:
//! a socket in an epoll set has the kernel call epoll's wake-up callback
//! for every frame it receives and every sent frame it frees (AF_PACKET,
//! AF_XDP), a cost a busy worker does not pay. A poll-mode worker never
//! registers them, an adaptive one from its first sleep until traffic has
//! kept it busy for a few milliseconds, an interrupt-mode one (which
//! sleeps at every quiet pass) always.

use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tracing::{info, warn};

use crate::dataplane::{Dataplane, Ingress, RxClaim, ViewRx, WorkerView};
use crate::eventfd::drain_eventfd;
use crate::forward::{police_rx, Forwarder};
use crate::queue::{RxBurst, RxQueue};
use crate::types::{bump, ticks, DropReason};

/// How workers wait for frames (defined with the API, which reports it).
pub use switchyard_api::PollMode;

/// One worker's settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Worker index (0-based).
    pub index: usize,
    /// CPU to pin to.
    pub cpu: Option<usize>,
    /// Waiting strategy.
    pub mode: PollMode,
    /// Quiet time before an adaptive worker sleeps.
    pub idle_threshold: Duration,
}

const WAKER_TOKEN: u64 = u64::MAX;

/// How long a worker that unmasked its queues' interrupts keeps looking
/// for frames before it sleeps (see `sleep_until_kicked`): longer than a
/// store takes to leave a CPU's store buffer.
const UNMASK_GRACE: Duration = Duration::from_micros(2);

/// Passes that found frames after which an adaptive worker, awake again,
/// takes its queues' fds out of its epoll set (a few milliseconds of
/// steady traffic).
const DISARM_AFTER: u32 = 1024;

/// The CPU of each of `workers` workers: `explicit` entries first; with
/// `auto`, the last CPUs of `allowed` (the process's affinity), so that the
/// first allowed CPU stays with the control thread when there are more
/// CPUs than workers.
pub fn worker_cpus(
    workers: usize,
    explicit: &[usize],
    auto: bool,
    allowed: &[usize],
) -> Vec<Option<usize>> {
    (0..workers)
        .map(|i| match explicit.get(i) {
            Some(c) => Some(*c),
            None if auto && !allowed.is_empty() => {
                let skip = allowed.len().saturating_sub(workers);
                Some(allowed[(skip + i) % allowed.len()])
            }
            None => None,
        })
        .collect()
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect()
        })
        .unwrap_or_default()
}

fn pin(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// A worker's epoll set: its waker always, its queues' fds while armed.
struct Interrupts {
    ep: Epoll,
    armed: bool,
    /// Passes that found frames since the set was last armed.
    busy_passes: u32,
}

impl Interrupts {
    /// The set with the worker's waker only.
    fn new(dp: &Dataplane, w: usize) -> std::io::Result<Interrupts> {
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        // The waker lives in the data plane, open while the worker runs.
        ep.add(
            dp.worker_waker(w).fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, WAKER_TOKEN),
        )?;
        Ok(Interrupts {
            ep,
            armed: false,
            busy_passes: 0,
        })
    }

    /// Adds the queues' fds (level-triggered: one already readable wakes
    /// the next wait at once). They stay open while registered: the queues
    /// live in `view` until the set is disarmed or dropped with it.
    fn arm(&mut self, view: &WorkerView) -> std::io::Result<()> {
        self.busy_passes = 0;
        if self.armed {
            return Ok(());
        }
        for (i, rx) in view.rx.iter().enumerate() {
            if let Some(fd) = rx.slot.irq_fd() {
                let ev = EpollEvent::new(EpollFlags::EPOLLIN, i as u64);
                if let Err(e) = self.ep.add(fd, ev) {
                    self.remove(&view.rx[..i]);
                    return Err(e.into());
                }
            }
        }
        self.armed = true;
        Ok(())
    }

    /// Takes the queues' fds out again.
    fn disarm(&mut self, view: &WorkerView) {
        if std::mem::take(&mut self.armed) {
            self.remove(&view.rx);
        }
    }

    /// Counts a pass that found frames; after [`DISARM_AFTER`] of them since
    /// the last arming, disarms. Not at the first frames after a sleep:
    /// sparse traffic would pay a registration per queue and wake-up.
    fn busy(&mut self, view: &WorkerView) {
        if self.armed {
            self.busy_passes += 1;
            if self.busy_passes >= DISARM_AFTER {
                self.disarm(view);
            }
        }
    }

    fn remove(&self, rx: &[ViewRx]) {
        for rx in rx {
            if let Some(fd) = rx.slot.irq_fd() {
                let _ = self.ep.delete(fd);
            }
        }
    }
}

thread_local! {
    /// What this thread polls, if it is a worker: see [`polling`].
    static POLLING: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// What the calling thread polls, if it is a worker ("worker 0 on CPU 1,
/// polling p0 queue 0, p1 queue 0"): the daemon's panic report names the
/// ports a dead worker leaves unpolled. None on other threads.
pub fn polling() -> Option<String> {
    POLLING
        .try_with(|p| p.borrow().clone())
        .ok()
        .filter(|p| !p.is_empty())
}

/// Records what worker `cfg.index` polls from now on (its view's receive
/// queues), for [`polling`].
fn note_polling(cfg: &WorkerConfig, view: &WorkerView) {
    use std::fmt::Write;
    let mut s = format!("worker {}", cfg.index);
    if let Some(cpu) = cfg.cpu {
        let _ = write!(s, " on CPU {cpu}");
    }
    s.push_str(", polling ");
    if view.rx.is_empty() {
        s.push_str("no queue");
    }
    for (i, rx) in view.rx.iter().enumerate() {
        let name = view
            .ports
            .get(rx.port as usize)
            .and_then(Option::as_ref)
            .map_or("?", |p| p.shared.name.as_str());
        let sep = if i > 0 { ", " } else { "" };
        let _ = write!(s, "{sep}{name} queue {}", rx.queue);
    }
    let _ = POLLING.try_with(|p| *p.borrow_mut() = s);
}

/// Debug builds only: an environment variable naming a file that makes a
/// worker misbehave once, for the tests of how the daemon meets a dead or
/// stuck worker. A worker that builds a view with at least one receive
/// queue while the file exists removes it, then panics (the file says
/// `panic`) or stops completing passes until the switch stops (`stall`).
#[cfg(debug_assertions)]
pub const FAULT_FILE_ENV: &str = "SWITCHYARD_DEBUG_WORKER_FAULT";

/// The fault [`FAULT_FILE_ENV`] asks of a worker whose view has queues.
#[cfg(debug_assertions)]
fn injected_fault(dp: &Dataplane, view: &WorkerView) {
    let Some(path) = std::env::var_os(FAULT_FILE_ENV) else {
        return;
    };
    if view.rx.is_empty() {
        return;
    }
    let Ok(what) = std::fs::read_to_string(&path) else {
        return;
    };
    if std::fs::remove_file(&path).is_err() {
        return; // another worker took it
    }
    match what.trim() {
        "panic" => panic!("injected by {FAULT_FILE_ENV}"),
        "stall" => {
            warn!("{FAULT_FILE_ENV}: this worker stops polling");
            while !dp.stopping() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        other => warn!("{FAULT_FILE_ENV}: unknown fault {other:?}"),
    }
}

/// Runs worker `cfg.index` until the data plane stops.
pub fn run(dp: Dataplane, cfg: WorkerConfig) {
    let w = cfg.index;
    if let Some(cpu) = cfg.cpu {
        match pin(cpu) {
            Ok(()) => info!(worker = w, cpu, "pinned"),
            Err(e) => warn!(worker = w, cpu, "cannot pin worker: {e}"),
        }
    }
    let mut view = WorkerView::default();
    // This worker's hold on each of `view.rx`, None until it gets it.
    let mut claims: Vec<Option<RxClaim>> = Vec::new();
    let mut generation = 0u64;
    let mut fwd = Forwarder::default();
    let mut burst = RxBurst::default();
    let mut epoll: Option<Interrupts> = None;
    let mut idle_since: Option<Instant> = None;
    dp.ack_generation(w, 0);

    loop {
        if dp.stopping() {
            break;
        }
        if dp.generation() != generation {
            // The old view's queues go first: one that moved to another
            // worker is polled there once this one lets go.
            claims.clear();
            generation = dp.build_view(w, &mut view);
            claims.extend(view.rx.iter().map(|rx| rx.slot.claim()));
            dp.ack_generation(w, generation);
            note_polling(&cfg, &view);
            #[cfg(debug_assertions)]
            injected_fault(&dp, &view);
            fwd.resize(&view);
            // The old set goes first: its queue fds are those of the
            // previous view.
            drop(epoll.take());
            epoll = Interrupts::new(&dp, w)
                .and_then(|mut e| {
                    if cfg.mode == PollMode::Interrupt {
                        e.arm(&view)?;
                    }
                    Ok(e)
                })
                .map_err(|e| warn!(worker = w, "cannot build interrupt set, polling only: {e}"))
                .ok();
        }

        let load = dp.worker_load(w);
        let start = ticks();
        let mut t = start;
        let mut work = 0usize;
        // A queue another worker still holds (it moved here a moment ago).
        let mut unclaimed = false;
        for (rx, claim) in view.rx.iter().zip(claims.iter_mut()) {
            let Some(port) = view.ports.get(rx.port as usize).and_then(Option::as_ref) else {
                continue;
            };
            if Dataplane::faulted(&port.shared) {
                continue;
            }
            let Some(q) = claimed(rx, claim) else {
                unclaimed = true;
                continue;
            };
            burst.clear();
            match q.rx_burst(&mut burst) {
                Ok(n) => {
                    if n > 0 {
                        // The burst goes back to its port from inside, once
                        // copied out (before the destinations' last flush).
                        match burst.runs_and_frames() {
                            (None, frames) => fwd.forward_burst(
                                &dp,
                                &view,
                                w,
                                rx.ingress(),
                                police_rx(&dp, &view, w, rx.port, rx.policer.as_deref(), frames),
                                || q.release(),
                            ),
                            // Frames received for other ports (tunnels on a
                            // shared socket): each port's run from it, the
                            // burst released after the last.
                            (Some(runs), all) => {
                                let mut runs = runs.peekable();
                                while let Some((port, frames)) = runs.next() {
                                    let from = Ingress {
                                        port,
                                        queue: rx.queue,
                                    };
                                    // A tunnel's own policer.
                                    let pol = view
                                        .ports
                                        .get(port as usize)
                                        .and_then(Option::as_ref)
                                        .and_then(|p| p.policers.rx.as_deref());
                                    let frames =
                                        police_rx(&dp, &view, w, port, pol, &mut all[frames]);
                                    if runs.peek().is_some() {
                                        fwd.forward_burst(&dp, &view, w, from, frames, || {});
                                    } else {
                                        fwd.forward_burst(&dp, &view, w, from, frames, || {
                                            q.release()
                                        });
                                    }
                                }
                            }
                        }
                        work += n;
                        // The queue's share: from the end of the last
                        // queue's burst (empty polls between included).
                        let now = ticks();
                        bump(&rx.slot.load.ticks, now.wrapping_sub(t));
                        bump(&rx.slot.load.frames, n as u64);
                        load.burst(n);
                        t = now;
                    } else {
                        // Nothing to forward; what the queue dropped goes back.
                        q.release();
                    }
                    if burst.has_drops() {
                        let c = port.shared.counters(w);
                        for (reason, n) in [
                            (DropReason::TooManySegments, burst.dropped),
                            (DropReason::BadOffload, burst.bad_offload),
                            (DropReason::UnknownTunnel, burst.unknown_tunnel),
                            (DropReason::BadTunnel, burst.bad_tunnel),
                        ] {
                            bump(&c.drops[reason as usize], u64::from(n));
                        }
                        work += 1;
                    }
                }
                Err(fault) => dp.report_fault(&port.shared, fault.to_string()),
            }
        }

        let end = ticks();
        bump(&load.polls, 1);
        if work > 0 {
            bump(&load.busy_polls, 1);
            bump(&load.busy_ticks, end.wrapping_sub(start));
            idle_since = None;
            if cfg.mode == PollMode::Adaptive {
                if let Some(e) = epoll.as_mut() {
                    e.busy(&view);
                }
            }
            continue;
        }
        bump(&load.idle_ticks, end.wrapping_sub(start));
        // A view without queues (no port, or the workers paused for a
        // takeover) has nothing to wait for but a new view, which wakes
        // the worker: it sleeps at once, leaving the core to the threads
        // that have work (in a takeover, both switches' control threads).
        let sleep = view.rx.is_empty()
            || !unclaimed
                && match cfg.mode {
                    PollMode::Poll => false,
                    PollMode::Interrupt => true,
                    PollMode::Adaptive => {
                        let now = Instant::now();
                        let since = *idle_since.get_or_insert(now);
                        now.duration_since(since) >= cfg.idle_threshold
                    }
                };
        if !sleep {
            std::hint::spin_loop();
            continue;
        }
        bump(&load.sleeps, 1);
        if let Some(Err(e)) = epoll.as_mut().map(|e| e.arm(&view)) {
            warn!(worker = w, "cannot arm interrupts, polling only: {e}");
            epoll = None;
        }
        match &epoll {
            Some(e) => {
                if sleep_until_kicked(&dp, w, &view, &mut claims, &e.ep, generation) {
                    bump(&load.wakeups, 1);
                }
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
        idle_since = None;
    }
    dp.ack_generation(w, u64::MAX);
}

/// The queue of `rx` if this worker holds it, claiming it first if it did
/// not yet.
#[inline]
fn claimed<'a>(rx: &ViewRx, claim: &'a mut Option<RxClaim>) -> Option<&'a mut dyn RxQueue> {
    if claim.is_none() {
        *claim = rx.slot.claim();
    }
    claim.as_mut().map(RxClaim::queue)
}

/// Sleeps until a queue's interrupt or a kick; true if one came (not the
/// timeout, nor frames already pending). Every queue of `view` is claimed.
fn sleep_until_kicked(
    dp: &Dataplane,
    w: usize,
    view: &WorkerView,
    claims: &mut [Option<RxClaim>],
    ep: &Epoll,
    generation: u64,
) -> bool {
    let mut woken = false;
    let mut pending = false;
    for q in claims.iter_mut().flatten().map(RxClaim::queue) {
        q.set_interrupt(true);
        pending |= q.has_pending();
    }
    // memif senders (DPDK, VPP, libmemif, this switch) read whether we
    // sleep without a fence after publishing, so a frame published just as
    // we unmasked may come without a kick. Its counter store still lands
    // within the sender's store-buffer drain: a second look a moment later
    // sees it, where otherwise the frame would wait out the sleep.
    let grace = Instant::now() + UNMASK_GRACE;
    while !pending && Instant::now() < grace {
        std::hint::spin_loop();
        pending = claims.iter_mut().flatten().any(|c| c.queue().has_pending());
    }
    if !pending && dp.generation() == generation && !dp.stopping() {
        let mut events = [EpollEvent::empty(); 32];
        // A bounded sleep keeps the worker robust against a lost kick.
        if let Ok(n) = ep.wait(&mut events, EpollTimeout::from(1000u16)) {
            woken = n > 0;
            for e in &events[..n] {
                let fd = if e.data() == WAKER_TOKEN {
                    Some(dp.worker_waker(w).fd())
                } else {
                    view.rx
                        .get(e.data() as usize)
                        .filter(|r| r.slot.irq_drain)
                        .and_then(|r| r.slot.irq_fd())
                };
                if let Some(fd) = fd {
                    drain_eventfd(fd);
                }
            }
        }
    }
    for q in claims.iter_mut().flatten().map(RxClaim::queue) {
        q.set_interrupt(false);
    }
    woken
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

    use super::{worker_cpus, Interrupts, DISARM_AFTER};
    use crate::dataplane::{Dataplane, WorkerView};
    use crate::eventfd::{drain_eventfd, new_eventfd};
    use crate::queue::{PortQueues, QueueFault, RxBurst, RxQueue};
    use crate::switch::security::PortSecurity;
    use crate::vlan::VlanMode;
    use nix::sys::epoll::{EpollEvent, EpollTimeout};
    use std::sync::Arc;

    /// A queue with nothing to receive but an interrupt eventfd.
    struct Quiet(OwnedFd);

    impl RxQueue for Quiet {
        fn rx_burst(&mut self, _: &mut RxBurst) -> Result<usize, QueueFault> {
            Ok(0)
        }
        fn release(&mut self) {}
        fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
            Some(self.0.as_fd())
        }
        fn set_interrupt(&mut self, _: bool) {}
        fn has_pending(&self) -> bool {
            false
        }
    }

    #[test]
    fn queue_fds_are_in_the_set_only_while_armed() {
        let dp = Dataplane::new(1).unwrap();
        let br = dp.add_bridge(64);
        let (p, _) = dp.add_port("p", Some(br), VlanMode::default(), &PortSecurity::default());
        let irq = new_eventfd().unwrap();
        let signal = irq.try_clone().unwrap();
        dp.attach_queues(
            p,
            PortQueues {
                rx: vec![Box::new(Quiet(irq))],
                tx: vec![],
            },
        );
        let mut view = WorkerView::default();
        dp.build_view(0, &mut view);
        assert_eq!(view.rx.len(), 1);
        // The queue's interrupt fires while the worker busy-polls.
        nix::unistd::write(&signal, &1u64.to_ne_bytes()).unwrap();
        let mut ints = Interrupts::new(&dp, 0).unwrap();
        // Kicks of the port's set-up are not what is tested.
        drain_eventfd(dp.worker_waker(0).fd());
        let ready = |ints: &Interrupts| {
            let mut ev = [EpollEvent::empty(); 4];
            ints.ep.wait(&mut ev, EpollTimeout::ZERO).unwrap()
        };
        assert_eq!(ready(&ints), 0, "a disarmed set holds no queue fd");
        // Armed before sleeping: the pending interrupt is seen at once
        // (level-triggered), none is lost to the late registration.
        ints.arm(&view).unwrap();
        ints.arm(&view).unwrap(); // twice is once
        assert_eq!(ready(&ints), 1);
        ints.disarm(&view);
        assert_eq!(ready(&ints), 0);
        ints.disarm(&view);
        ints.arm(&view).unwrap();
        assert_eq!(ready(&ints), 1);
        // Busy again: still armed for the first passes that find frames,
        // disarmed after DISARM_AFTER of them.
        for _ in 1..DISARM_AFTER {
            ints.busy(&view);
        }
        assert_eq!(ready(&ints), 1);
        ints.busy(&view);
        assert_eq!(ready(&ints), 0);
    }

    #[test]
    fn a_receive_queue_has_one_claim_at_a_time_and_follows_its_move() {
        let dp = Dataplane::new(2).unwrap();
        let br = dp.add_bridge(64);
        let (p, _) = dp.add_port("p", Some(br), VlanMode::default(), &PortSecurity::default());
        dp.attach_queues(
            p,
            PortQueues {
                rx: vec![Box::new(Quiet(new_eventfd().unwrap()))],
                tx: vec![],
            },
        );
        let owner = dp.rx_queues()[0].0;
        let other = 1 - owner;
        let mut view = WorkerView::default();
        dp.build_view(owner, &mut view);
        let slot = view.rx[0].slot.clone();
        let mut held = slot.claim().expect("a free queue is claimed");
        assert!(slot.claim().is_none(), "a second claim while one is held");
        assert!(held.queue().rx_burst(&mut RxBurst::default()).is_ok());

        // The queue moves: the new worker cannot poll it while the old one
        // still holds it, and can once the old one lets go (its next view).
        let (_, port, q, s) = dp.rx_queues().remove(0);
        assert_eq!(dp.move_queues(&[(port, q, s, other)]), 1);
        let mut next = WorkerView::default();
        dp.build_view(other, &mut next);
        assert!(Arc::ptr_eq(&next.rx[0].slot, &slot));
        let mut claim = None;
        assert!(super::claimed(&next.rx[0], &mut claim).is_none());
        drop(held);
        assert!(super::claimed(&next.rx[0], &mut claim).is_some());
        assert!(claim.is_some(), "the claim is kept for the next passes");
        assert!(slot.claim().is_none());
    }

    #[test]
    fn explicit_cpus_win_and_auto_takes_the_last_allowed() {
        assert_eq!(worker_cpus(2, &[5], false, &[0, 1]), [Some(5), None]);
        // A Guaranteed pod with cpuset {2,3,4}: two workers on 3 and 4,
        // the control thread keeps 2.
        assert_eq!(worker_cpus(2, &[], true, &[2, 3, 4]), [Some(3), Some(4)]);
        // Fewer CPUs than workers: they share.
        assert_eq!(
            worker_cpus(3, &[], true, &[6, 7]),
            [Some(6), Some(7), Some(6)]
        );
        assert_eq!(worker_cpus(1, &[], true, &[]), [None]);
        assert_eq!(worker_cpus(1, &[], false, &[1]), [None]);
    }
}
