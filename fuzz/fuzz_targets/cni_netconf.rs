//! CNI network configurations (stdin of the plugin).
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_cni::netconf::NetConf;

fuzz_target!(|data: &[u8]| {
    if let Ok(nc) = NetConf::parse(data) {
        // Every accepted path is absolute and has no '..'.
        for p in [&nc.socket_dir, &nc.device_info_dir, &nc.control_socket] {
            assert!(p.is_absolute());
            assert!(!p
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir)));
        }
        // A device ID only ever ends a file name: no way out of its dir.
        if let Some(id) = &nc.device_id {
            assert!(!id.contains(".."));
        }
        assert!(nc.vlan.is_none() || nc.trunk.is_none());
    }
});
