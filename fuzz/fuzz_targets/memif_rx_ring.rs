//! A memif ring and its descriptors written by a hostile peer, polled by
//! the switch as master (receive) and as slave (receive, with its own
//! buffers): every descriptor must be checked before use.
//!
//! Input: the whole region (ring header, descriptors, buffers).
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use switchyard::eventfd::new_eventfd;
use switchyard::port::memif::queue::{MemifRx, OwnBuffers, Role};
use switchyard::port::memif::region::{Region, Regions};
use switchyard::port::memif::ring::Ring;
use switchyard::queue::{RxBurst, RxQueue};
use switchyard::wire::memif::ring_bytes;

const LOG2: u8 = 3;

fuzz_target!(|data: &[u8]| {
    let ring_len = ring_bytes(LOG2);
    let size = (ring_len + 8 * 128) as u64;
    for side in [Role::Master, Role::Slave] {
        let region = Region::create("fuzz", size).unwrap();
        let base = region.base();
        let regions = Arc::new(Regions::new(vec![region]));
        // SAFETY: ring_len bytes of ring at offset 0 of a `size`-byte mapping
        // kept alive by `regions`.
        let ring = unsafe { Ring::new(base, LOG2) };
        let own = (side == Role::Slave).then_some(OwnBuffers {
            first: ring_len as u32,
            size: 128,
        });
        let mut q = MemifRx::new(side, ring, regions.clone(), new_eventfd().unwrap(), own);
        // The peer now scribbles over everything, ring header included.
        let n = data.len().min(size as usize);
        // SAFETY: at most `size` bytes into the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base, n) };
        let mut burst = RxBurst::default();
        for _ in 0..3 {
            burst.clear();
            if q.rx_burst(&mut burst).is_err() {
                break;
            }
            for f in burst.frames() {
                for s in f.segments() {
                    // SAFETY: what the queue hands out must lie in the
                    // mapping (ASan and the region bounds check this).
                    let b = unsafe { std::slice::from_raw_parts(s.ptr(), s.len() as usize) };
                    let start = base as usize;
                    assert!(s.ptr() as usize >= start);
                    assert!(s.ptr() as usize + s.len() as usize <= start + size as usize);
                    std::hint::black_box(b.iter().fold(0u8, |a, x| a ^ x));
                }
            }
            q.release();
        }
    }
});
