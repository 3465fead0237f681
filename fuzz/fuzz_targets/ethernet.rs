//! Ethernet / 802.1Q header parsing of received frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::wire::ethernet::EthernetFrame;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = EthernetFrame::new_checked(data) {
        let _ = (
            f.dst(),
            f.src(),
            f.ethertype(),
            f.vlan(),
            f.inner_ethertype(),
        );
        assert!(f.header_len() <= data.len());
    }
});
