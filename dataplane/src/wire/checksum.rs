//! The Internet checksum (RFC 1071): a ones' complement sum of 16-bit words,
//! kept over a byte stream that arrives in pieces of any length.
//!
//! The sum is taken in the machine's byte order (RFC 1071, section 2(B):
//! the result is the byte-swapped sum, and written back in the same order it
//! is right on the wire), eight bytes a step. A piece that starts at an odd
//! position in the stream has its sum byte-swapped before it is added.

use std::ptr;

/// A running checksum over a byte stream.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checksum {
    sum: u64,
    /// The bytes added so far are odd in number: the next piece starts in
    /// the middle of a 16-bit word.
    odd: bool,
}

/// Folds a wide ones' complement sum into 16 bits.
#[inline]
fn fold(mut s: u64) -> u16 {
    s = (s & 0xffff_ffff) + (s >> 32);
    s = (s & 0xffff_ffff) + (s >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// The ones' complement sum of `len` bytes at `p`, as 32-bit halves of
/// native 64-bit loads added into 64 bits (a trailing odd byte is the first
/// byte of a word). Up to 2^31 loads cannot overflow it.
///
/// # Safety
///
/// `p..p+len` must be readable. It may be memory a peer writes meanwhile:
/// it is only loaded by value, never referenced.
#[inline]
unsafe fn sum_raw(p: *const u8, len: usize) -> u64 {
    let mut acc = [0u64; 4];
    let mut i = 0;
    // Four independent sums, so the loads and adds overlap.
    while i + 32 <= len {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `i + 8k + 8 <= i + 32 <= len`.
            let w = unsafe { ptr::read_unaligned(p.add(i + 8 * k).cast::<u64>()) };
            *a += (w & 0xffff_ffff) + (w >> 32);
        }
        i += 32;
    }
    let mut s = acc[0] + acc[1] + acc[2] + acc[3];
    while i + 8 <= len {
        // SAFETY: `i + 8 <= len`.
        let w = unsafe { ptr::read_unaligned(p.add(i).cast::<u64>()) };
        s += (w & 0xffff_ffff) + (w >> 32);
        i += 8;
    }
    let mut tail = [0u8; 8];
    // SAFETY: `len - i < 8` bytes from `p + i`, inside the range; `tail` is
    // ours.
    unsafe { ptr::copy_nonoverlapping(p.add(i), tail.as_mut_ptr(), len - i) };
    let w = u64::from_ne_bytes(tail);
    s + (w & 0xffff_ffff) + (w >> 32)
}

impl Checksum {
    /// An empty sum.
    pub const fn new() -> Checksum {
        Checksum { sum: 0, odd: false }
    }

    /// Adds `bytes`, next in the stream.
    #[inline]
    pub fn add(&mut self, bytes: &[u8]) {
        // SAFETY: a slice is readable for its length.
        unsafe { self.add_raw(bytes.as_ptr(), bytes.len()) }
    }

    /// Adds `len` bytes at `p`, next in the stream.
    ///
    /// # Safety
    ///
    /// `p..p+len` must be readable. It may be memory a peer writes
    /// meanwhile: it is only loaded by value, never referenced.
    #[inline]
    pub unsafe fn add_raw(&mut self, p: *const u8, len: usize) {
        // SAFETY: the caller's promise.
        let mut s = fold(unsafe { sum_raw(p, len) });
        if self.odd {
            s = s.swap_bytes();
        }
        self.sum += u64::from(s);
        self.odd ^= len % 2 == 1;
    }

    /// Adds a 16-bit big-endian (wire order) value at an even position.
    #[inline]
    pub fn add_be16(&mut self, v: u16) {
        self.add(&v.to_be_bytes());
    }

    /// The sum, folded to 16 bits, in the byte order of the stream (what a
    /// partial checksum field holds: `to_ne_bytes` writes it).
    #[inline]
    pub fn folded(&self) -> u16 {
        fold(self.sum)
    }

    /// The checksum field's value: the complement of the sum, to be
    /// written with `to_ne_bytes`.
    #[inline]
    pub fn finish(&self) -> u16 {
        !self.folded()
    }
}

/// Whether two checksum values are the same ones' complement number
/// (`0x0000` and `0xffff` are both zero).
#[inline]
pub fn same(a: u16, b: u16) -> bool {
    a == b || (a | b == 0xffff && (a == 0 || b == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook sum: big-endian words, a trailing byte padded with zero.
    fn reference(bytes: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in bytes.chunks(2) {
            let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
            s += u32::from(w);
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn rfc_1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let mut c = Checksum::new();
        c.add(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]);
        assert_eq!(u16::from_be_bytes(c.folded().to_ne_bytes()), 0xddf2);
    }

    #[test]
    fn any_split_of_the_stream_gives_the_textbook_sum() {
        for n in [0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 1500, 9001] {
            let b = bytes(n, n as u32);
            let want = reference(&b);
            let mut whole = Checksum::new();
            whole.add(&b);
            assert_eq!(
                u16::from_be_bytes(whole.finish().to_ne_bytes()),
                want,
                "n {n}"
            );
            for cut in [1, 2, 3, 5, 17, 40] {
                let mut c = Checksum::new();
                let mut at = 0;
                let mut k = 0;
                while at < n {
                    // Pieces of varying length, odd and even.
                    let step = (cut + k) % 41 + 1;
                    let end = (at + step).min(n);
                    c.add(&b[at..end]);
                    at = end;
                    k += 1;
                }
                assert_eq!(
                    u16::from_be_bytes(c.finish().to_ne_bytes()),
                    want,
                    "n {n} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn a_stream_with_its_checksum_sums_to_zero() {
        let mut b = bytes(101, 7);
        b[10] = 0;
        b[11] = 0;
        let mut c = Checksum::new();
        c.add(&b);
        b[10..12].copy_from_slice(&c.finish().to_ne_bytes());
        let mut v = Checksum::new();
        v.add(&b);
        assert!(same(v.finish(), 0));
    }

    #[test]
    fn zero_has_two_forms() {
        assert!(same(0, 0xffff) && same(0xffff, 0) && same(5, 5));
        assert!(!same(0, 5) && !same(0xfffe, 0xffff));
    }
}
