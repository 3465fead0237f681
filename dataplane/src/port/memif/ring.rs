//! A view of one memif ring inside a mapped region.

use std::sync::atomic::{AtomicU16, Ordering};

use crate::wire::memif::{desc_field, ring_field, DESC_SIZE, RING_HEADER_SIZE};

/// One descriptor's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Desc {
    /// Flags (`DESC_FLAG_NEXT`).
    pub flags: u16,
    /// Region index.
    pub region: u16,
    /// Length (or capacity, for posted empty buffers).
    pub length: u32,
    /// Offset in the region.
    pub offset: u32,
}

/// A ring header plus `2^log2` descriptors at a checked place in a region.
///
/// Holds a raw pointer: the owner keeps the region mapped (an `Arc<Regions>`
/// beside the ring) for as long as the ring is used.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    base: *mut u8,
    size: u32,
    mask: u16,
}

// SAFETY: the pointer targets shared memory that is only accessed through
// atomics (header counters) or volatile reads/writes (descriptors); the owner
// guarantees the mapping outlives the ring.
unsafe impl Send for Ring {}

impl Ring {
    /// Wraps the ring at `base`.
    ///
    /// # Safety
    /// `base` must be 8-byte aligned and point to at least
    /// `RING_HEADER_SIZE + DESC_SIZE << log2` bytes that stay mapped while
    /// this ring (or a copy) is used; `log2` must be at most 15.
    pub unsafe fn new(base: *mut u8, log2: u8) -> Ring {
        debug_assert!(base as usize % 8 == 0 && log2 <= 15);
        Ring {
            base,
            size: 1 << log2,
            mask: ((1u32 << log2) - 1) as u16,
        }
    }

    /// Number of descriptors.
    #[inline]
    pub fn size(&self) -> u32 {
        self.size
    }

    #[inline]
    fn atomic16(&self, at: usize) -> &AtomicU16 {
        // SAFETY: `at` is 4, 6 or 64, inside the header; the base is 8-aligned
        // so the u16 is aligned; the mapping outlives `self` (see `new`).
        unsafe { &*(self.base.add(at) as *const AtomicU16) }
    }

    /// The slave's producer/poster counter.
    #[inline]
    pub fn head(&self) -> u16 {
        self.atomic16(ring_field::HEAD).load(Ordering::Acquire)
    }
    /// Publishes the head.
    #[inline]
    pub fn set_head(&self, v: u16) {
        self.atomic16(ring_field::HEAD).store(v, Ordering::Release)
    }
    /// The master's counter.
    #[inline]
    pub fn tail(&self) -> u16 {
        self.atomic16(ring_field::TAIL).load(Ordering::Acquire)
    }
    /// Publishes the tail.
    #[inline]
    pub fn set_tail(&self, v: u16) {
        self.atomic16(ring_field::TAIL).store(v, Ordering::Release)
    }
    /// Ring flags.
    #[inline]
    pub fn flags(&self) -> u16 {
        self.atomic16(ring_field::FLAGS).load(Ordering::Relaxed)
    }
    /// Sets ring flags (written by the ring's receiver).
    #[inline]
    pub fn set_flags(&self, v: u16) {
        self.atomic16(ring_field::FLAGS).store(v, Ordering::SeqCst)
    }
    /// The cookie.
    pub fn cookie(&self) -> u32 {
        // SAFETY: offset 0 of an 8-aligned, mapped header.
        unsafe { std::ptr::read_volatile(self.base.add(ring_field::COOKIE) as *const u32) }
    }
    /// Writes the cookie.
    pub fn set_cookie(&self, v: u32) {
        // SAFETY: offset 0 of an 8-aligned, mapped header.
        unsafe { std::ptr::write_volatile(self.base.add(ring_field::COOKIE) as *mut u32, v) }
    }

    #[inline]
    fn desc_ptr(&self, slot: u16) -> *mut u8 {
        let i = (slot & self.mask) as usize;
        // SAFETY: i < size, so the descriptor lies within the ring's extent.
        unsafe { self.base.add(RING_HEADER_SIZE + i * DESC_SIZE) }
    }

    /// Reads the descriptor at `slot` (masked).
    #[inline]
    pub fn desc(&self, slot: u16) -> Desc {
        let p = self.desc_ptr(slot);
        // SAFETY: `p` is a 16-byte descriptor inside the mapping, 8-aligned;
        // volatile because the peer may write it concurrently.
        unsafe {
            Desc {
                flags: std::ptr::read_volatile(p.add(desc_field::FLAGS) as *const u16),
                region: std::ptr::read_volatile(p.add(desc_field::REGION) as *const u16),
                length: std::ptr::read_volatile(p.add(desc_field::LENGTH) as *const u32),
                offset: std::ptr::read_volatile(p.add(desc_field::OFFSET) as *const u32),
            }
        }
    }

    /// Writes a whole descriptor.
    #[inline]
    pub fn set_desc(&self, slot: u16, d: Desc) {
        let p = self.desc_ptr(slot);
        // SAFETY: as in `desc`.
        unsafe {
            std::ptr::write_volatile(p.add(desc_field::FLAGS) as *mut u16, d.flags);
            std::ptr::write_volatile(p.add(desc_field::REGION) as *mut u16, d.region);
            std::ptr::write_volatile(p.add(desc_field::LENGTH) as *mut u32, d.length);
            std::ptr::write_volatile(p.add(desc_field::OFFSET) as *mut u32, d.offset);
        }
    }

    /// Writes only a descriptor's length and flags (master filling a posted buffer).
    #[inline]
    pub fn set_len_flags(&self, slot: u16, length: u32, flags: u16) {
        let p = self.desc_ptr(slot);
        // SAFETY: as in `desc`.
        unsafe {
            std::ptr::write_volatile(p.add(desc_field::LENGTH) as *mut u32, length);
            std::ptr::write_volatile(p.add(desc_field::FLAGS) as *mut u16, flags);
        }
    }
}
