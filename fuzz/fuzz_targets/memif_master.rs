//! The master's handshake state machine fed a hostile slave's messages,
//! then the slave's rings (in a region whose bytes are fuzzed) polled by
//! the switch's queues.
//!
//! Input: byte 0 picks the region size (x 64 bytes), the next bytes fill
//! it, the rest is a sequence of 128-byte messages. ADD_REGION messages
//! come with the region's (sealed memfd) descriptor, ADD_RING with an
//! eventfd.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use switchyard::eventfd::new_eventfd;
use switchyard::port::memif::handshake::{MasterHandshake, MasterStep, Params};
use switchyard::port::memif::queue::{MemifRx, MemifTx, Side};
use switchyard::port::memif::region::Region;
use switchyard::queue::{RxBurst, RxQueue, TxFrame, TxQueue};
use switchyard::wire::memif::{Message, Mode, MSG_SIZE};

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let size = usize::from(data[0]).max(1) * 64;
    let fill = &data[1..data.len().min(1 + size)];
    let region = Region::create("fuzz", size as u64).unwrap();
    // SAFETY: the region is `size` bytes, `fill` at most that many.
    unsafe { std::ptr::copy_nonoverlapping(fill.as_ptr(), region.base(), fill.len()) };
    let mut hs = MasterHandshake::new(Params {
        if_name: "fuzz".into(),
        id: 0,
        secret: None,
        mode: Mode::Ethernet,
        queues: 2,
        log2_ring_size: 4,
        buffer_size: 256,
    });
    let _ = hs.hello();
    let msgs = data.get(1 + size..).unwrap_or_default();
    for chunk in msgs.chunks(MSG_SIZE) {
        let Ok(msg) = Message::parse(chunk) else {
            return; // the connection would be dropped
        };
        let fd = match msg {
            Message::AddRegion { .. } => Some(region.fd().try_clone_to_owned().unwrap()),
            Message::AddRing { .. } => Some(new_eventfd().unwrap()),
            _ => None,
        };
        match hs.on_message(msg, fd) {
            Err(_) => return,
            Ok(MasterStep::Reply(_)) => {}
            Ok(MasterStep::Connected(_, est)) => {
                let mut burst = RxBurst::default();
                for r in est.s2m {
                    let mut q =
                        MemifRx::new(Side::Master, r.ring, est.regions.clone(), r.irq, None);
                    for _ in 0..2 {
                        burst.clear();
                        if q.rx_burst(&mut burst).is_err() {
                            break;
                        }
                        let mut sink = [0u8; 64];
                        for f in burst.frames() {
                            let _ = f.read_prefix(&mut sink);
                            for s in f.segments() {
                                // Touch every byte the queue handed out.
                                // SAFETY: segments lie in the mapped regions
                                // (what this target checks, under ASan).
                                let b = unsafe {
                                    std::slice::from_raw_parts(s.ptr(), s.len() as usize)
                                };
                                std::hint::black_box(b.iter().fold(0u8, |a, x| a ^ x));
                            }
                        }
                        q.release();
                    }
                }
                let frame_bytes = [0x5au8; 100];
                let mut one = RxBurst::default();
                let slot = one.next_slot();
                // SAFETY: `frame_bytes` outlives the burst.
                unsafe { slot.push(frame_bytes.as_ptr(), frame_bytes.len() as u32) };
                one.commit();
                for r in est.m2s {
                    let mut q =
                        MemifTx::new(Side::Master, r.ring, est.regions.clone(), r.irq, None);
                    let _ = q.tx(&TxFrame::plain(&one.frames()[0]));
                    q.flush();
                }
                let _ = Arc::strong_count(&est.regions);
                return;
            }
        }
    }
});
