//! memif control messages as read from a peer's socket.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::wire::memif::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::parse(data) {
        // What parses must encode back to a message that parses the same.
        let again = Message::parse(&m.to_bytes()).expect("re-parse");
        assert_eq!(m, again);
    }
});
