//! What policy reads of a frame a pod sent (`Packet::parse`, on a copy of
//! its first bytes) and the connection table it consults: any bytes read
//! without a panic, every read within the bytes given, and a connection a
//! packet opens is found again by its packets both ways, between its two
//! ports alone.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use switchyard::switch::policy::conntrack::{Conntrack, CtQuota, PortRef};
use switchyard::wire::flow::{Packet, PREFIX_LEN};

fuzz_target!(|data: &[u8]| {
    let p = Packet::parse(&data[..data.len().min(PREFIX_LEN)]);
    let Packet::Flow { tuple, flags, .. } = p else {
        return;
    };
    // A packet to itself (the same address and port both ends, the
    // "land" attack) has no other direction.
    if tuple == tuple.reversed() {
        return;
    }
    let ct = Conntrack::new(16, 16);
    let q = Arc::new(CtQuota::default());
    let p = |id| PortRef { id, generation: 1 };
    assert_eq!(ct.track(7, &tuple, flags, p(1), 0), None);
    ct.open(7, &tuple, flags, (p(1), p(2)), None, &q, 0)
        .unwrap();
    assert_eq!(q.held(), 1);
    // A reply from the port it went to belongs to it (a reset closes it,
    // but for a while it is still known), and goes back to the first; from
    // a third port it does not.
    assert_eq!(ct.track(7, &tuple.reversed(), 0, p(3), 1), None);
    assert_eq!(ct.track(7, &tuple.reversed(), 0, p(2), 1), Some(p(1)));
    assert_eq!(ct.sweep(u32::MAX), 1);
    assert_eq!(q.held(), 0);
});
