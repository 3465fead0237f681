//! The queue slots: a receive queue one worker claims at a time, a
//! transmit queue any worker takes for a burst.

use super::*;

/// A receive queue and its interrupt fd. The queue is reached only through
/// an [`RxClaim`], which one worker at a time holds.
pub struct RxSlot {
    pub(super) queue: UnsafeCell<Box<dyn RxQueue>>,
    /// Whether an [`RxClaim`] on this slot exists.
    pub(super) claimed: AtomicBool,
    /// The queue's interrupt eventfd, cached so sleeping needs no claim
    /// (read through [`RxSlot::irq_fd`]).
    pub(super) irq_fd: Option<RawFd>,
    /// Whether the worker drains `irq_fd` when it wakes (an eventfd).
    pub irq_drain: bool,
    /// The queue's load, counted by the worker polling it.
    pub load: QueueCounters,
}

// SAFETY: the queue inside is only reached through an `RxClaim`, and at most
// one claim per slot exists at a time (`claimed`, set by a compare-exchange
// and cleared when the claim drops), so one thread at a time touches it;
// `RxQueue: Send`.
unsafe impl Sync for RxSlot {}

impl RxSlot {
    pub(super) fn new(queue: Box<dyn RxQueue>) -> RxSlot {
        let irq_fd = queue.interrupt_fd().map(|fd| fd.as_raw_fd());
        let irq_drain = queue.interrupt_is_eventfd();
        RxSlot {
            queue: UnsafeCell::new(queue),
            claimed: AtomicBool::new(false),
            irq_fd,
            irq_drain,
            load: QueueCounters::default(),
        }
    }

    /// Takes the queue for the caller until the returned claim drops: None
    /// while another worker still holds it, which happens only in the
    /// instant a queue moves between workers (the old one lets go when it
    /// next rebuilds its view).
    pub fn claim(self: &Arc<Self>) -> Option<RxClaim> {
        self.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| RxClaim(self.clone()))
    }

    /// The queue's interrupt eventfd, without a claim.
    #[inline]
    pub fn irq_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the number was the queue's own fd when the slot was made;
        // the queue owns it (it closes it when dropped) and the slot owns
        // the queue, so it stays open for as long as `self` is borrowed.
        self.irq_fd.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
    }
}

/// A worker's hold on a receive queue, the one way to reach it. A worker
/// claims its queues when it builds its view and keeps them until the
/// next, so that a poll takes no lock: a locked instruction per poll would
/// also wait for every store of the last burst (into the peers' rings) to
/// reach their caches, and a one-frame round trip would pay it each time.
pub struct RxClaim(Arc<RxSlot>);

impl RxClaim {
    /// The claimed queue.
    #[inline]
    pub fn queue(&mut self) -> &mut dyn RxQueue {
        // SAFETY: this claim set `claimed` and clears it only when dropped,
        // so no other claim, and no other reference to the queue, exists
        // meanwhile; `&mut self` makes this borrow the only one through
        // this claim.
        unsafe { &mut **self.0.queue.get() }
    }
}

impl Drop for RxClaim {
    fn drop(&mut self) {
        // Release: the next claimant sees the queue as this one left it.
        self.0.claimed.store(false, Ordering::Release);
    }
}

/// A transmit queue that several workers may feed.
pub struct TxSlot {
    pub(super) busy: AtomicBool,
    pub(super) queue: UnsafeCell<Box<dyn TxQueue>>,
}

// SAFETY: the queue inside is only reached through `with`, which holds the
// `busy` flag, so at most one thread touches it at a time; `TxQueue: Send`.
unsafe impl Sync for TxSlot {}

impl TxSlot {
    pub(super) fn new(q: Box<dyn TxQueue>) -> TxSlot {
        TxSlot {
            busy: AtomicBool::new(false),
            queue: UnsafeCell::new(q),
        }
    }

    /// Runs `f` with exclusive access to the queue. Uncontended when every
    /// worker has a queue of its own (the usual case).
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut dyn TxQueue) -> R) -> R {
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // Unlocks when dropped, a panic in `f` included: a worker that
        // panicked must not leave the queue locked for every other one.
        let _unlock = SlotGuard(&self.busy);
        // SAFETY: `busy` was false and we set it, so no other thread is inside
        // this block for this slot until the guard stores false.
        f(unsafe { &mut **self.queue.get() })
    }
}

/// Clears a [`TxSlot`]'s `busy` flag when dropped.
struct SlotGuard<'a>(&'a AtomicBool);

impl Drop for SlotGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_panic_inside_a_transmit_slot_leaves_it_unlocked() {
        struct Nothing;
        impl TxQueue for Nothing {
            fn tx(&mut self, _: &crate::queue::TxFrame<'_>) -> Result<(), crate::queue::TxError> {
                Ok(())
            }
            fn flush(&mut self) {}
        }
        let slot = TxSlot::new(Box::new(Nothing));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            slot.with(|_| panic!("inside"));
        }));
        assert!(r.is_err());
        // Taken again at once (it would spin for ever if still locked).
        assert_eq!(slot.with(|_| 7), 7);
    }
}
