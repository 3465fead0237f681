//! Ethernet / 802.1Q header parsing of received frames: `L2Head`, the
//! parser the forwarding path reads every frame through, agrees with the
//! slice view `EthernetFrame` on every input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::wire::ethernet::{EthernetFrame, L2Head, ETHERTYPE_VLAN};

fuzz_target!(|data: &[u8]| {
    let head = L2Head::from_prefix(data);
    let frame = EthernetFrame::new_checked(data);
    assert_eq!(head.is_some(), frame.is_ok(), "{data:02x?}");
    let (Some(h), Ok(f)) = (head, frame) else {
        return;
    };
    assert_eq!((h.dst_mac(), h.src_mac()), (f.dst(), f.src()));
    assert_eq!(h.tagged, f.ethertype() == ETHERTYPE_VLAN);
    assert_eq!(h.vid, f.vlan().map_or(0, |t| t.vid));
    assert_eq!(h.dst_multicast(), f.dst().is_multicast());
    let _ = f.inner_ethertype();
    assert!(f.header_len() <= data.len());
});
