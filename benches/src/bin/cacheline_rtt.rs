//! Cross-CPU cache-line round trip: how long one 64-byte line takes to go
//! from one CPU to another and back.
//!
//! Every shared-memory port (memif, vhost-user) moves ring indices,
//! descriptors and frames between the peer's CPU and the switch's, so this
//! latency bounds what any DUT of the loop benchmark can do. On a VM it
//! depends on where the host runs the two vCPUs, and that changes while
//! the VM runs: on the development VM it jumps between about 30 ns (SMT
//! siblings of one core), 75-95 ns (two cores of one socket) and 470 ns
//! (two sockets) every 0.1 s to a few seconds. `benches/loop/loop_bench.py`
//! samples it before each round so that a table says which states the
//! machine was in.
//!
//! `cacheline_rtt [CPU_A CPU_B [SECONDS]]` (default `0 1 1`): bounces a
//! line in windows of 2000 round trips for SECONDS and prints
//! `cacheline_rtt_ns p10 A p50 B p90 C far D`: percentiles of the windows'
//! mean round trip, and D the share of windows over 200 ns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Round trips per window.
const WINDOW: u64 = 2000;
/// A window slower than this had the two CPUs far apart.
const FAR_NS: f64 = 200.0;

/// The bounced value, alone on its cache line.
#[repr(align(64))]
struct Line(AtomicU64);

fn pin(cpu: usize) -> Result<(), String> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| format!("cpu {cpu}: {e}"))?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| format!("pinning to cpu {cpu}: {e}"))
}

/// Nanoseconds per round trip over one window starting at value `start`:
/// CPU A writes odd values and waits for B's even answer.
fn window(line: &Line, start: u64) -> f64 {
    let t = Instant::now();
    for i in 0..WINDOW {
        let v = start + 2 * i;
        line.0.store(v + 1, Ordering::Release);
        while line.0.load(Ordering::Acquire) != v + 2 {
            std::hint::spin_loop();
        }
    }
    t.elapsed().as_nanos() as f64 / WINDOW as f64
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        let s = args.get(i).map_or(default, String::as_str);
        s.parse().map_err(|e| format!("argument {s:?}: {e}"))
    }
    let (a, b): (usize, usize) = (arg(&args, 0, "0")?, arg(&args, 1, "1")?);
    let seconds: f64 = arg(&args, 2, "1")?;
    if !(seconds > 0.0 && seconds <= 600.0) {
        return Err(format!("SECONDS {seconds}: from 0 to 600"));
    }
    let line = Arc::new(Line(AtomicU64::new(0)));
    let done = Arc::new(AtomicBool::new(false));
    let (peer, stop) = (line.clone(), done.clone());
    let (pinned, on_cpu) = std::sync::mpsc::channel();
    let answerer = std::thread::spawn(move || {
        let r = pin(b);
        let ok = r.is_ok();
        let _ = pinned.send(r);
        if !ok {
            return;
        }
        // Answers each odd value with the next even one, until told to stop
        // (checked only while waiting, so it costs the round trip nothing).
        let mut last = 0;
        loop {
            let v = peer.0.load(Ordering::Acquire);
            if v % 2 == 1 && v != last {
                last = v;
                peer.0.store(v + 1, Ordering::Release);
            } else if stop.load(Ordering::Relaxed) {
                return;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    // Both threads on their CPUs before the first round trip.
    on_cpu.recv().map_err(|_| "answering thread ended")??;
    pin(a)?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut ns = Vec::new();
    let mut start = 0;
    while Instant::now() < end {
        ns.push(window(&line, start));
        start += 2 * WINDOW;
    }
    done.store(true, Ordering::Relaxed);
    answerer.join().map_err(|_| "answering thread panicked")?;
    let far = ns.iter().filter(|&&n| n > FAR_NS).count() as f64 / ns.len() as f64;
    ns.sort_by(f64::total_cmp);
    let pct = |p: usize| ns[(ns.len() - 1) * p / 100];
    println!(
        "cacheline_rtt_ns p10 {:.0} p50 {:.0} p90 {:.0} far {:.2}",
        pct(10),
        pct(50),
        pct(90),
        far
    );
    Ok(())
}
