//! Device-info files (written by device plugins, read by the CNI): what
//! our parser accepts, serde_json's own view of the document agrees with
//! (type, version, the socket path of the type's section), and it writes
//! out to a document that parses the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_api::devinfo::DeviceInfo;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = DeviceInfo::parse(data) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_slice(data).expect("parsed, so JSON");
    assert_eq!(v["type"].as_str(), Some(d.kind.as_str()));
    assert_eq!(v["version"].as_str(), Some(d.version.as_str()));
    let section = match d.kind.as_str() {
        "memif" => Some(&v["memif"]),
        "vhost-user" => Some(&v["vhost-user"]),
        _ => None,
    };
    if let Some(section) = section {
        assert_eq!(section["path"].as_str(), d.socket_path());
    }
    let again = serde_json::to_vec(&d).unwrap();
    assert_eq!(DeviceInfo::parse(&again).as_ref().ok(), Some(&d));
});
