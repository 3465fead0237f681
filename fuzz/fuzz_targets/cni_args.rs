//! CNI_ARGS as set by the runtime.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_cni::args::CniArgs;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = CniArgs::parse(s);
    }
});
