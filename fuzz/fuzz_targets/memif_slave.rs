//! The slave's handshake state machine fed a hostile master's messages.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::port::memif::handshake::{Params, SlaveHandshake, SlaveStep};
use switchyard::wire::memif::{Message, Mode, MSG_SIZE};

fuzz_target!(|data: &[u8]| {
    let mut hs = SlaveHandshake::new(Params {
        if_name: "fuzz".into(),
        id: 0,
        secret: Some("s".into()),
        mode: Mode::Ethernet,
        queues: 1,
        log2_ring_size: 4,
        buffer_size: 256,
    });
    for chunk in data.chunks(MSG_SIZE) {
        let Ok(msg) = Message::parse(chunk) else {
            return;
        };
        match hs.on_message(msg) {
            Err(_) | Ok(SlaveStep::Connected(_)) => return,
            Ok(_) => {}
        }
    }
});
