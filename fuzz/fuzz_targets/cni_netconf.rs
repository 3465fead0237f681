//! CNI network configurations (stdin of the plugin).
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_cni::netconf::NetConf;

fuzz_target!(|data: &[u8]| {
    if let Ok(nc) = NetConf::parse(data) {
        // Every accepted path is absolute and has no '..'.
        assert!(nc.socket_dir.is_absolute());
        assert!(!nc
            .socket_dir
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir)));
    }
});
