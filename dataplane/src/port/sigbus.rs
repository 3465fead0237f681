//! Surviving a peer that shrinks the file behind memory the switch mapped.
//!
//! A vhost-user frontend shares its memory as file descriptors (memfds,
//! hugetlbfs files) that cannot be required to be sealed, unlike memif
//! regions. If the frontend truncates such a file after the switch mapped
//! it, the next access to a page past the new end raises `SIGBUS` in
//! whichever switch thread made it, and the default action would kill the
//! switch with every port.
//!
//! As Wayland compositors do for their clients' shared-memory pools, ranges
//! of peer memory are registered here with a [`Tripwire`]. A `SIGBUS` for an
//! address inside a registered range replaces the whole range with private
//! zero pages, so the faulting access completes (reads see zeros, writes go
//! nowhere the peer can see), and trips the range's wire; the port's queues
//! check their wire and reset the port, counted and logged. A `SIGBUS`
//! anywhere else goes to the handler that was installed before (Rust's own,
//! or the default action), as if this module did not exist.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::Once;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// Ranges that may be registered at once (8 regions for each of 2048
/// vhost-user ports).
pub const CAPACITY: usize = 16384;

const FREE: u8 = 0;
const BUSY: u8 = 1;
const LIVE: u8 = 2;

/// One registered range. The handler reads it without locks: `state` is
/// `LIVE` only while `start`, `len` and `wire` are consistent, and `gen`
/// changes whenever a slot is reused, so a handler that raced with a
/// reuse notices.
struct Slot {
    state: AtomicU8,
    gen: AtomicUsize,
    start: AtomicUsize,
    len: AtomicUsize,
    wire: AtomicPtr<AtomicBool>,
}

static SLOTS: [Slot; CAPACITY] = [const {
    Slot {
        state: AtomicU8::new(FREE),
        gen: AtomicUsize::new(0),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        wire: AtomicPtr::new(ptr::null_mut()),
    }
}; CAPACITY];

/// The handler that was installed before ours, to pass other faults to:
/// its address (0 and 1 are `SIG_DFL` and `SIG_IGN`) and whether it takes
/// `siginfo`.
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_SIGINFO: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();
/// How many times a registered range was replaced (for tests and logs).
static TRIPS: AtomicUsize = AtomicUsize::new(0);

/// Every registered range failed to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("more than {CAPACITY} peer memory ranges are mapped")]
pub struct Full;

/// Registered ranges of one peer's memory, and whether a `SIGBUS` hit one.
///
/// Dropping it unregisters the ranges. **The rule:** drop it after the last
/// access to its ranges and before they are unmapped. Dropped later, a
/// range the kernel has meanwhile given to another mapping (another port's
/// memory, a heap arena) would still be registered, and a `SIGBUS` there
/// would have the handler put zero pages over it. Owners follow the rule by
/// declaring the wire before the mapping it watches (fields drop in
/// declaration order) and by dropping an old wire before they replace its
/// mappings; debug builds check it (every watched range must still be
/// mapped when the wire is dropped).
#[derive(Debug)]
pub struct Tripwire {
    /// Boxed so the handler's pointer to it stays valid when this moves.
    tripped: Box<AtomicBool>,
    slots: Vec<usize>,
}

impl Default for Tripwire {
    fn default() -> Self {
        Tripwire {
            tripped: Box::new(AtomicBool::new(false)),
            slots: Vec::new(),
        }
    }
}

impl Tripwire {
    /// A wire watching nothing yet.
    pub fn new() -> Tripwire {
        Tripwire::default()
    }

    /// Watches `len` bytes at `start`.
    ///
    /// # Safety
    ///
    /// `start..start + len` must be a mapping of a peer's file that the
    /// caller made with `mmap` (so whole pages, and a range the kernel may
    /// replace with `MAP_FIXED`), that the process only ever accesses as
    /// untrusted bytes through raw pointers (a peer may change them at any
    /// time; after a trip they read as zeros), and that stays mapped until
    /// this wire is dropped (see [`Tripwire`]).
    pub unsafe fn watch(&mut self, start: *mut u8, len: usize) -> Result<(), Full> {
        install();
        for (i, s) in SLOTS.iter().enumerate() {
            if s.state
                .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            s.gen.fetch_add(1, Ordering::Relaxed);
            s.start.store(start as usize, Ordering::Relaxed);
            s.len.store(len, Ordering::Relaxed);
            s.wire.store(
                ptr::from_ref::<AtomicBool>(&self.tripped).cast_mut(),
                Ordering::Relaxed,
            );
            s.state.store(LIVE, Ordering::Release);
            self.slots.push(i);
            return Ok(());
        }
        Err(Full)
    }

    /// How many ranges it watches.
    pub fn watching(&self) -> usize {
        self.slots.len()
    }

    /// True once a `SIGBUS` hit one of the watched ranges (which now hold
    /// zero pages).
    #[inline]
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Relaxed)
    }
}

impl Drop for Tripwire {
    fn drop(&mut self) {
        for &i in &self.slots {
            let s = &SLOTS[i];
            // The rule (see the type): a range unmapped before its wire is
            // dropped makes `madvise` fail with `ENOMEM`.
            debug_assert!(
                {
                    let (start, len) = (
                        s.start.load(Ordering::Relaxed),
                        s.len.load(Ordering::Relaxed),
                    );
                    // SAFETY: MADV_NORMAL changes nothing; it only fails
                    // if part of the range is not mapped.
                    unsafe { libc::madvise(start as *mut c_void, len, libc::MADV_NORMAL) == 0 }
                },
                "a peer memory range was unmapped before its tripwire was dropped"
            );
            s.state.store(BUSY, Ordering::Release);
            s.wire.store(ptr::null_mut(), Ordering::Relaxed);
            s.state.store(FREE, Ordering::Release);
        }
    }
}

/// How many `SIGBUS`es on watched ranges the process survived.
pub fn trips() -> usize {
    TRIPS.load(Ordering::Relaxed)
}

fn install() {
    INSTALL.call_once(|| {
        let ours = SigAction::new(
            SigHandler::SigAction(on_sigbus),
            SaFlags::SA_SIGINFO | SaFlags::SA_ONSTACK,
            SigSet::empty(),
        );
        // SAFETY: `on_sigbus` only does what a signal handler may: atomic
        // loads and stores on statics, `mmap`, `signal`, and a call to the
        // handler it replaced.
        match unsafe { sigaction(Signal::SIGBUS, &ours) } {
            Ok(old) => {
                let (addr, info) = match old.handler() {
                    SigHandler::SigDfl => (libc::SIG_DFL, false),
                    SigHandler::SigIgn => (libc::SIG_IGN, false),
                    SigHandler::Handler(f) => (f as usize, false),
                    SigHandler::SigAction(f) => (f as usize, true),
                };
                PREVIOUS_SIGINFO.store(info, Ordering::Relaxed);
                PREVIOUS.store(addr, Ordering::Release);
            }
            Err(e) => tracing::warn!("cannot install the SIGBUS handler: {e}"),
        }
    });
}

/// The range registered for `addr`, if any: its start and length and its
/// wire, read consistently.
fn lookup(addr: usize) -> Option<(usize, usize, *mut AtomicBool)> {
    for s in &SLOTS {
        if s.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let gen = s.gen.load(Ordering::Relaxed);
        let (start, len) = (
            s.start.load(Ordering::Relaxed),
            s.len.load(Ordering::Relaxed),
        );
        let wire = s.wire.load(Ordering::Relaxed);
        if s.state.load(Ordering::Acquire) != LIVE || s.gen.load(Ordering::Relaxed) != gen {
            continue;
        }
        if addr.wrapping_sub(start) < len {
            return Some((start, len, wire));
        }
    }
    None
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // BUS_ADRERR: the page is past the end of its file. Hardware memory
    // errors (BUS_MCEERR_*) and the rest are not ours to hide.
    if code == libc::BUS_ADRERR {
        if let Some((start, len, wire)) = lookup(addr) {
            // SAFETY: `start..start+len` is a whole mapping of peer memory
            // (`Tripwire::watch`'s contract); replacing it with private
            // zero pages changes nothing the process relies on.
            let p = unsafe {
                libc::mmap(
                    start as *mut c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                if !wire.is_null() {
                    // SAFETY: a wire stays allocated while its slot is live
                    // (its `Drop` clears the slot first), and the range it
                    // watches is being accessed, so its owner still holds it.
                    unsafe { (*wire).store(true, Ordering::Release) };
                }
                TRIPS.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let prev = PREVIOUS.load(Ordering::Acquire);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // Return into the fault with the default action: the process dies
        // of SIGBUS as it would have without us.
        // SAFETY: `signal` is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
    } else if PREVIOUS_SIGINFO.load(Ordering::Relaxed) {
        // SAFETY: `prev` is the SA_SIGINFO handler `sigaction` returned.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: `prev` is the plain handler `sigaction` returned.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsRawFd;

    const PAGE: usize = 4096;

    fn shared_file_mapping(pages: usize) -> (File, *mut u8) {
        let fd = nix::sys::memfd::memfd_create(
            c"sigbus-test",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .unwrap();
        let f = File::from(fd);
        f.set_len((pages * PAGE) as u64).unwrap();
        // SAFETY: a fresh shared mapping of a file we own.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                pages * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (f, p.cast())
    }

    #[test]
    fn a_truncated_watched_mapping_reads_zeros_and_trips_its_wire() {
        let (f, p) = shared_file_mapping(4);
        let mut wire = Tripwire::new();
        // SAFETY: `p` is our mapping of the file, accessed by raw pointer.
        unsafe { wire.watch(p, 4 * PAGE) }.unwrap();
        // SAFETY: in the mapping, inside the file.
        unsafe { p.add(3 * PAGE).write_volatile(7) };
        assert!(!wire.tripped());
        // The "peer" shrinks the file: page 3 is now past its end.
        f.set_len(PAGE as u64).unwrap();
        let before = trips();
        // SAFETY: in the mapping; the access faults and is recovered.
        let v = unsafe { p.add(3 * PAGE).read_volatile() };
        assert_eq!(v, 0);
        assert!(wire.tripped());
        assert!(trips() > before);
        // Writes land in the private pages, not in the file.
        // SAFETY: as above; the range is now private anonymous memory.
        unsafe { p.write_volatile(9) };
        drop(wire);
        // SAFETY: the range is ours and no longer used.
        unsafe { libc::munmap(p.cast(), 4 * PAGE) };
        let mut b = [0u8; 1];
        nix::sys::uio::pread(&f, &mut b, 0).unwrap();
        assert_eq!(b[0], 0, "a write after the trip reached the peer's file");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "unmapped before its tripwire was dropped")]
    fn a_wire_dropped_after_its_mapping_is_caught() {
        let (_f, p) = shared_file_mapping(1);
        let mut wire = Tripwire::new();
        // SAFETY: as above.
        unsafe { wire.watch(p, PAGE) }.unwrap();
        // SAFETY: our mapping, not used again; the wire breaks the rule.
        unsafe { libc::munmap(p.cast(), PAGE) };
        drop(wire);
    }

    #[test]
    fn a_sigbus_outside_watched_ranges_still_kills() {
        use nix::sys::wait::{waitpid, WaitStatus};
        use nix::unistd::{fork, ForkResult};
        // Our handler is installed (a range is watched), but this mapping
        // is not watched: its SIGBUS must end the process as before.
        let (_wf, wp) = shared_file_mapping(1);
        let mut wire = Tripwire::new();
        // SAFETY: as above.
        unsafe { wire.watch(wp, PAGE) }.unwrap();
        let (f, p) = shared_file_mapping(2);
        f.set_len(0).unwrap();
        // SAFETY: the child only touches memory mapped before the fork and
        // leaves with `_exit`: nothing that other threads may hold locked.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                // SAFETY: in the mapping; past the end of the file.
                let v = unsafe { p.add(PAGE).read_volatile() };
                // SAFETY: `_exit` is safe to call after fork.
                unsafe { libc::_exit(i32::from(v) + 1) }
            }
            ForkResult::Parent { child } => {
                let st = waitpid(child, None).unwrap();
                assert!(
                    matches!(st, WaitStatus::Signaled(_, Signal::SIGBUS, _)),
                    "{st:?}"
                );
            }
        }
        assert!(!wire.tripped());
        drop(wire);
        // SAFETY: both ranges are ours and no longer used.
        unsafe {
            libc::munmap(p.cast(), 2 * PAGE);
            libc::munmap(wp.cast(), PAGE);
        }
    }

    #[test]
    fn a_dropped_wire_frees_its_slots() {
        let (_f, p) = shared_file_mapping(1);
        let mut wire = Tripwire::new();
        // SAFETY: as above.
        unsafe { wire.watch(p, PAGE) }.unwrap();
        assert!(lookup(p as usize).is_some());
        drop(wire);
        assert!(lookup(p as usize).is_none());
        // SAFETY: the range is ours and no longer used.
        unsafe { libc::munmap(p.cast(), PAGE) };
    }
}
