//! A UDP datagram on a VXLAN socket, decapsulated as the tunnels' receive
//! queue does it: the header read as the kernel reads it (a VNI of 24
//! bits, or an error), then the work the inner frame was sent with
//! inferred from its bytes alone (a checksum to finish, a super-frame to
//! cut for a path of some MTU), then finished in software for a
//! destination that takes no offload: the metadata always matches the
//! frame, and every segment stays within it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::queue::offload::{self, Offload, Scratch, MAX_HDR};
use switchyard::queue::{tx_each, RxFrame, TxFrame};
use switchyard::wire::vxlan;

fuzz_target!(|data: &[u8]| {
    // The first two bytes: the path's longest frame, and where the frame
    // is split in two segments.
    let [m0, m1, cut, datagram @ ..] = data else {
        return;
    };
    let max_frame = usize::from(u16::from_le_bytes([*m0, *m1]));
    let Ok(vni) = vxlan::parse(datagram) else {
        return;
    };
    assert!(vni <= 0x00ff_ffff);
    assert_eq!(datagram[..vxlan::HEADER_LEN], vxlan::header(vni));
    let inner = &datagram[vxlan::HEADER_LEN..];
    let cut = usize::from(*cut).min(inner.len());
    let mut frame = RxFrame::default();
    // SAFETY: `inner` outlives the frame and every read of it below.
    unsafe {
        frame.push(inner.as_ptr(), cut as u32);
        frame.push(inner.as_ptr().add(cut), (inner.len() - cut) as u32);
    }
    let mut head = [0u8; MAX_HDR];
    let n = frame.read_prefix(&mut head);
    let Some(o) = Offload::inferred(&head[..n], inner.len(), max_frame) else {
        return;
    };
    // What the receive queue found is what a peer's metadata would have
    // said, and holds up to the same check.
    assert!(
        Offload::from_vnet(&o.to_vnet(), inner.len()).is_ok(),
        "{o:?} on {} bytes",
        inner.len()
    );
    let tx = TxFrame::plain(&frame).with_offload(o);
    let mut scratch = Scratch::default();
    let _ = offload::finish(&tx, &mut scratch, |segs| {
        tx_each(segs, |s| {
            assert!(s.len() <= inner.len() + MAX_HDR);
            if o.gso().is_some() {
                assert!(
                    s.len() <= max_frame.max(MAX_HDR),
                    "{} > {max_frame}",
                    s.len()
                );
            }
            let mut out = vec![0u8; s.len()];
            let mut r = s.reader();
            // SAFETY: `out` holds `s.len()` bytes.
            let got = unsafe { r.copy_to(out.as_mut_ptr(), out.len()) };
            assert_eq!(got, s.len());
            Ok(())
        })
    });
});
