//! What finishing offloads in software costs: the Internet checksum over
//! a frame's bytes, and cutting a 64 KB TCP super-frame into MTU-sized
//! segments with their headers and checksums (what the switch does for a
//! memif or af-xdp port, or a virtio driver without TSO). Bytes per second
//! are of the frame's payload.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use switchyard::queue::offload::{self, Offload, Scratch};
use switchyard::queue::{tx_each, RxFrame, TxFrame};
use switchyard::wire::checksum::Checksum;
use switchyard::wire::virtio_net::VNET_HDR_LEN;

/// An IPv4 TCP frame of `payload` bytes whose checksum is left to finish.
fn tcp4(payload: usize) -> Vec<u8> {
    let mut f = vec![0u8; 54 + payload];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((40 + payload).min(0xffff) as u16).to_be_bytes());
    f[23] = 6;
    f[46] = 5 << 4;
    for (i, b) in f[54..].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    f
}

fn checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    for len in [64usize, 1500, 65536] {
        let b: Vec<u8> = (0..len).map(|i| i as u8).collect();
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &b, |bench, b| {
            bench.iter(|| {
                let mut c = Checksum::new();
                c.add(black_box(b));
                black_box(c.finish())
            })
        });
    }
    g.finish();
}

fn finish(c: &mut Criterion) {
    let mut g = c.benchmark_group("finish");
    let mut scratch = Scratch::default();
    for (name, payload, gso) in [("csum-1448", 1448usize, false), ("tso-64k", 65000, true)] {
        let bytes = tcp4(payload);
        let mut frame = RxFrame::default();
        // SAFETY: `bytes` outlives every use of the frame below.
        assert!(unsafe { frame.push(bytes.as_ptr(), bytes.len() as u32) });
        let mut vnet = Offload::checksum(34, 16).to_vnet();
        if gso {
            vnet[1] = switchyard::wire::virtio_net::GSO_TCPV4;
            vnet[4..6].copy_from_slice(&1448u16.to_le_bytes());
        }
        let vnet: [u8; VNET_HDR_LEN] = vnet;
        let o = Offload::from_vnet(&vnet, bytes.len()).unwrap();
        let tx = TxFrame::plain(&frame).with_offload(o);
        g.throughput(Throughput::Bytes(payload as u64));
        g.bench_function(name, |bench| {
            bench.iter(|| {
                let done = offload::finish(black_box(&tx), &mut scratch, |segs| {
                    tx_each(segs, |s| {
                        black_box(s.len());
                        Ok(())
                    })
                })
                .unwrap();
                black_box(done.frames)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, checksum, finish);
criterion_main!(benches);
