//! Device-info files (written by device plugins, read by the CNI).
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_cni::devinfo::DeviceInfo;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = DeviceInfo::parse(data) {
        let _ = d.socket_path();
    }
});
