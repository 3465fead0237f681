//! A virtio transmit queue (descriptor table, avail ring, buffers) written
//! by a hostile vhost-user frontend, polled by the switch.
//!
//! Input: 64 KiB of guest memory (descriptors at 0, avail ring at 0x1000,
//! used ring at 0x2000); the queue size is 16.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use switchyard::port::vhost_user::queue::{VirtioRx, VirtioTx, Vq};
use switchyard::queue::{OffloadCaps, RxBurst, RxQueue, TxFrame, TxQueue};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 0x10000;

fn vq(mem: &Arc<GuestMemoryMmap>) -> Vq {
    Vq::with_rings(mem.clone(), 16, 0, 0x1000, 0x2000).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap());
    let n = data.len().min(MEM);
    mem.write_slice(&data[..n], GuestAddress(0)).unwrap();
    let mut rx = VirtioRx::new(vq(&mem), true);
    let mut burst = RxBurst::default();
    for _ in 0..2 {
        burst.clear();
        if rx.rx_burst(&mut burst).is_err() {
            break;
        }
        let mut sink = [0u8; 2048];
        for f in burst.frames() {
            let _ = f.read_prefix(&mut sink);
        }
        rx.release();
    }
    // The same memory as the driver's receive queue: the switch writes.
    let bytes = [0x11u8; 300];
    let mut one = RxBurst::default();
    let slot = one.next_slot();
    // SAFETY: `bytes` outlives the burst.
    unsafe { slot.push(bytes.as_ptr(), bytes.len() as u32) };
    one.commit();
    let mut tx = VirtioTx::new(vq(&mem), true, OffloadCaps::NONE);
    for _ in 0..3 {
        let _ = tx.tx(&TxFrame::plain(&one.frames()[0]));
    }
    tx.flush();
});
