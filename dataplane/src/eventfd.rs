//! eventfd helpers for the hot path: the kicks and interrupts of memif and
//! vhost-user queues, and the wake-ups of sleeping workers.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::eventfd::{EfdFlags, EventFd};

/// Reads the 8-byte counter of an eventfd, ignoring errors (used to drain).
#[inline]
pub fn drain_eventfd(fd: BorrowedFd<'_>) {
    let mut b = [0u8; 8];
    // SAFETY: `fd` is open for the borrow's lifetime; the read goes into a
    // local 8-byte buffer.
    unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
}

/// Writes 1 to an eventfd (a memif or vhost-user kick), ignoring errors: a
/// full counter or a closed peer must not stop the data path.
#[inline]
pub fn kick_eventfd(fd: BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: `fd` is open for the borrow's lifetime; the write comes from a
    // local 8-byte buffer.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// Creates a non-blocking, close-on-exec eventfd.
pub fn new_eventfd() -> std::io::Result<OwnedFd> {
    let efd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    Ok(OwnedFd::from(efd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn read(fd: &OwnedFd) -> Option<u64> {
        let mut b = [0u8; 8];
        // SAFETY: reading 8 bytes into a local buffer from an fd we own.
        let n = unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        (n == 8).then(|| u64::from_ne_bytes(b))
    }

    #[test]
    fn kicks_are_counted_and_drained() {
        let fd = new_eventfd().unwrap();
        kick_eventfd(fd.as_fd());
        kick_eventfd(fd.as_fd());
        assert_eq!(read(&fd), Some(2));
        kick_eventfd(fd.as_fd());
        drain_eventfd(fd.as_fd());
        assert_eq!(read(&fd), None);
    }
}
