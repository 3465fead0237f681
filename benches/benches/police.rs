//! What a policer costs a frame that passes it: the hot path's memif to
//! memif bench (`hot_path.rs`, whose harness this binary includes), through
//! the sending port's policer (`rx`) or the receiving port's (`tx`), whose
//! buckets never run dry. Apart from `hot_path`: benches added to that
//! binary move the compiler's inlining of the forwarding loop there, and
//! so its instruction counts, which CI keeps to a budget.
//!
//! Run with callgrind as the budget's benches are:
//! `benches/callgrind_budget.py --bin <this binary> --budget FILE` with
//! these names in FILE.

#[allow(dead_code)]
#[path = "hot_path.rs"]
mod hot_path;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hot_path::{frame, plane_with, Peers, Worker, MAC_A, MAC_B};
use switchyard::dataplane::WorkerView;
use switchyard::queue::{RxBurst, BURST_SIZE};
use switchyard_api::spec::{Meter, RateLimits};

/// A policer no bench's traffic empties: 1 Tbit/s, a bucket of as much.
const WIDE_METER: Meter = Meter {
    bits_per_sec: Some(1_000_000_000_000),
    burst_bits: Some(1_000_000_000_000),
    packets_per_sec: None,
    burst_packets: None,
};

fn police(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward");
    g.throughput(Throughput::Elements(BURST_SIZE as u64));
    let mut burst = RxBurst::default();
    for (name, limits) in [
        (
            "worker_memif_to_memif_rx_limited",
            RateLimits {
                rx: Some(WIDE_METER),
                tx: None,
            },
        ),
        (
            "worker_memif_to_memif_tx_limited",
            RateLimits {
                rx: None,
                tx: Some(WIDE_METER),
            },
        ),
    ] {
        let data = frame(60, MAC_B, MAC_A, None);
        let (peers, rx, tx) = Peers::new(&data);
        let (dp, _) = plane_with(Box::new(rx), Box::new(tx), &[MAC_B]);
        // Port 0 sends, port 1 receives.
        dp.set_port_rate_limits(if limits.rx.is_some() { 0 } else { 1 }, &limits);
        let mut view = WorkerView::default();
        dp.build_view(0, &mut view);
        let mut wk = Worker::new((dp, view));
        g.bench_function(BenchmarkId::new(name, 64), |bench| {
            bench.iter(|| {
                peers.step();
                black_box(wk.iterate(&mut burst))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, police);
criterion_main!(benches);
