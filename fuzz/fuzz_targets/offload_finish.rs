//! Offload metadata from a peer (a virtio-net header: a guest's, or the
//! kernel's) on arbitrary frame bytes, finished in software: the header is
//! checked against the frame, then the checksum and segmentation read only
//! the frame's bytes, whatever the metadata and the headers say, and every
//! segment they make stays within the frame (a segment's payload is a
//! window of the frame's, its headers at most `MAX_HDR` bytes).
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::queue::offload::{self, Offload, Scratch, MAX_HDR};
use switchyard::queue::{tx_each, RxFrame, TxFrame};
use switchyard::wire::virtio_net::VNET_HDR_LEN;

fuzz_target!(|data: &[u8]| {
    if data.len() < VNET_HDR_LEN + 1 {
        return;
    }
    let (hdr, rest) = data.split_at(VNET_HDR_LEN);
    // The first byte of the rest says where the frame is split in two
    // segments (as a chain of buffers would).
    let (cut, bytes) = (usize::from(rest[0]), &rest[1..]);
    let cut = cut.min(bytes.len());
    let mut frame = RxFrame::default();
    // SAFETY: `bytes` outlives the frame and every read of it below.
    unsafe {
        frame.push(bytes.as_ptr(), cut as u32);
        frame.push(bytes.as_ptr().add(cut), (bytes.len() - cut) as u32);
    }
    let Ok(o) = Offload::from_vnet(hdr.try_into().unwrap(), bytes.len()) else {
        return;
    };
    let tx = TxFrame::plain(&frame).with_offload(o);
    let mut scratch = Scratch::default();
    let _ = offload::finish(&tx, &mut scratch, |segs| {
        tx_each(segs, |s| {
            assert!(s.len() <= bytes.len() + MAX_HDR);
            let mut out = vec![0u8; s.len()];
            let mut r = s.reader();
            // SAFETY: `out` holds `s.len()` bytes.
            let n = unsafe { r.copy_to(out.as_mut_ptr(), out.len()) };
            assert_eq!(n, s.len());
            Ok(())
        })
    });
});
