//! MAC table lookup and learn against `std::collections::HashMap`.

use std::collections::HashMap;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use switchyard::switch::mac_table::{MacEntry, MacTable};
use switchyard::wire::MacAddr;

fn macs(n: u64) -> Vec<MacAddr> {
    (0..n)
        .map(|i| MacAddr::from_u64(0x0200_0000_0000 | (i * 7919)))
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("mac_table");
    for n in [1_000u64, 100_000] {
        let keys = macs(n);
        let t = MacTable::new((n as usize) * 2);
        for (i, m) in keys.iter().enumerate() {
            t.learn(
                *m,
                0,
                MacEntry {
                    port: (i % 64) as u16,
                    port_gen: 1,
                    last_seen: 1,
                    pinned: false,
                },
                0,
            );
        }
        let mut h = HashMap::new();
        for (i, m) in keys.iter().enumerate() {
            h.insert((*m, 0u16), (i % 64) as u16);
        }
        g.throughput(Throughput::Elements(keys.len() as u64));
        g.bench_with_input(BenchmarkId::new("lookup", n), &keys, |b, keys| {
            b.iter(|| keys.iter().filter_map(|m| t.lookup(*m, 0)).count())
        });
        g.bench_with_input(BenchmarkId::new("learn_unchanged", n), &keys, |b, keys| {
            b.iter(|| {
                for (i, m) in keys.iter().enumerate() {
                    t.learn(
                        *m,
                        0,
                        MacEntry {
                            port: (i % 64) as u16,
                            port_gen: 1,
                            last_seen: 1,
                            pinned: false,
                        },
                        0,
                    );
                }
            })
        });
        g.bench_with_input(
            BenchmarkId::new("std_hashmap_lookup", n),
            &keys,
            |b, keys| b.iter(|| keys.iter().filter_map(|m| h.get(&(*m, 0))).count()),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
