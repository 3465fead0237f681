//! A master socket fed a hostile slave's messages: the socket's dispatch
//! (the first message must name one of its interfaces, 0 with two queue
//! pairs or 1 with one, as `SocketPort`'s listener hands it over), that
//! interface's handshake state machine, then the slave's rings (in a
//! region whose bytes are fuzzed) polled by the switch's queues.
//!
//! Input: byte 0 picks the region size (x 64 bytes), the next bytes fill
//! it, the rest is a sequence of 128-byte messages. ADD_REGION messages
//! come with the region's (sealed memfd) descriptor, ADD_RING with an
//! eventfd.
#![no_main]
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use nix::sys::socket::{send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use switchyard::eventfd::new_eventfd;
use switchyard::port::memif;
use switchyard::port::memif::handshake::{hello, MasterHandshake, MasterStep, Params};
use switchyard::port::memif::queue::{MemifRx, MemifTx, Role};
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
    // The socket's interfaces, and the HELLO every slave gets first.
    let interfaces = [(0u32, 2u16), (1, 1)];
    let _ = hello(interfaces.iter().map(|i| i.1).max().unwrap_or(1));
    let msgs = data.get(1 + size..).unwrap_or_default();
    let mut chunks = msgs.chunks(MSG_SIZE);
    // The first message crosses a real socket to the switch's reader.
    let (slave, master) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    if let Some(first) = chunks.next() {
        send(slave.as_raw_fd(), first, MsgFlags::empty()).unwrap();
    }
    let Ok(Some((id, init))) = memif::introduce(master.as_fd()) else {
        return; // nothing named: the connection would be dropped
    };
    let Some(&(id, queues)) = interfaces.iter().find(|i| i.0 == id) else {
        return; // "ID mismatch"
    };
    let mut hs = MasterHandshake::new(Params {
        if_name: "fuzz".into(),
        id,
        secret: None,
        mode: Mode::Ethernet,
        queues,
        log2_ring_size: 4,
        buffer_size: 256,
    });
    if hs.on_message(init, None).is_err() {
        return;
    }
    for chunk in chunks {
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
                        MemifRx::new(Role::Master, r.ring, est.regions.clone(), r.irq, None);
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
                        MemifTx::new(Role::Master, r.ring, est.regions.clone(), r.irq, None);
                    let _ = q.tx(&TxFrame::plain(&one.frames()[0]));
                    q.flush();
                }
                let _ = Arc::strong_count(&est.regions);
                return;
            }
        }
    }
});
