//! Cache prefetch hints for memory shared with peers.

/// Hints that the line at `p` will be read soon. A hint never faults and
/// changes no memory; on other architectures it does nothing.
#[inline(always)]
pub fn read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, whatever the address,
    // and writes no memory or register (SSE is baseline on x86_64).
    unsafe {
        std::arch::asm!("prefetcht0 [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
