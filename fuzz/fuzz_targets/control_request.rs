//! Control API requests as read from the control socket.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_api::Request;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<Request>(data) {
        if let Request::PortAdd { port } = &r {
            let _ = port.validate("port");
        }
        let _ = serde_json::to_vec(&r).unwrap();
    }
});
