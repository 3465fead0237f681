//! The data-plane seam between port kinds and the switch: a port kind's
//! [`RxQueue`] / [`TxQueue`] are polled by workers in bursts. A received
//! frame is a list of [`Segment`]s that point into the peer's shared
//! memory; transmit copies straight from them into the destination's
//! buffers, so a frame is copied exactly once.

pub mod frame;
pub mod offload;
pub mod prefetch;

use std::os::fd::BorrowedFd;

pub use frame::{
    copy_frame, FrameReader, RxBurst, RxFrame, Segment, TxFrame, BURST_SIZE, MAX_SEGS,
};
pub use offload::{Offload, OffloadCaps};

/// A peer broke the shared-memory protocol; its port must be reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFault {
    /// A descriptor points outside the peer's regions.
    #[error("descriptor {slot}: region {region} offset {offset} length {length} outside the shared memory")]
    BadDescriptor {
        /// Ring slot.
        slot: u16,
        /// Region index.
        region: u16,
        /// Offset.
        offset: u32,
        /// Length.
        length: u32,
    },
    /// A ring counter moved outside what the protocol allows.
    #[error("ring counter out of range: {what} (cursor {cursor}, peer {peer}, size {size})")]
    BadRingIndex {
        /// Which counter.
        what: &'static str,
        /// Our position.
        cursor: u16,
        /// The peer's value.
        peer: u16,
        /// Ring size.
        size: u32,
    },
    /// A descriptor chain never ends inside the published part of the ring.
    #[error("descriptor chain at slot {slot} runs past the published descriptors")]
    UnterminatedChain {
        /// First slot of the chain.
        slot: u16,
    },
    /// The peer shrank the file behind memory it shares: an access raised
    /// `SIGBUS`, which [`crate::port::sigbus`] caught.
    #[error(
        "the peer truncated the memory it shares (SIGBUS caught; its pages now read as zeros)"
    )]
    PeerMemoryTruncated,
    /// Descriptor chain or guest-memory fault described by text (other port kinds).
    #[error("{0}")]
    Other(String),
}

/// Why a transmit did not take a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxError {
    /// No free descriptor or buffer: the peer is not draining.
    Full,
    /// The frame does not fit what the peer offered.
    TooLong,
    /// The peer broke the ring. Boxed: a fault is rare, and a small
    /// error keeps the per-frame `Result` in registers.
    Fault(Box<QueueFault>),
    /// The frame's offload metadata does not match its headers, so its
    /// checksum or segmentation cannot be done for a peer that does not
    /// take it over.
    Unfinished,
}

impl TxError {
    /// The peer broke the ring: `fault`.
    #[cold]
    pub fn fault(fault: QueueFault) -> TxError {
        TxError::Fault(Box::new(fault))
    }
}

/// For queues over memory a peer may shrink (watched by a
/// [`crate::port::sigbus::Tripwire`]): what the queue found, unless the
/// peer truncated that memory meanwhile (`truncated`), which is then the
/// fault. Receive checks after its reads, so that what zero pages made of
/// the rings is not reported as a broken ring.
#[inline]
pub fn rx_unless_truncated(
    got: Result<usize, QueueFault>,
    truncated: bool,
) -> Result<usize, QueueFault> {
    if truncated {
        return Err(QueueFault::PeerMemoryTruncated);
    }
    got
}

/// The transmit side of [`rx_unless_truncated`]: a fault is reported as
/// truncation when the peer truncated its memory (`truncated`, asked only
/// on a fault).
#[inline]
pub fn tx_unless_truncated<T>(
    got: Result<T, TxError>,
    truncated: impl FnOnce() -> bool,
) -> Result<T, TxError> {
    match got {
        Err(TxError::Fault(_)) if truncated() => {
            Err(TxError::fault(QueueFault::PeerMemoryTruncated))
        }
        r => r,
    }
}

/// Receive side of one queue, owned by one worker at a time.
pub trait RxQueue: Send {
    /// Fills `burst` with up to its capacity of frames. The frames' memory
    /// stays valid until [`RxQueue::release`].
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault>;
    /// Returns the buffers of the last burst to the peer. The worker calls
    /// it as soon as the burst's frames are copied out, which may be before
    /// the queues they were copied to are flushed.
    fn release(&mut self);
    /// The eventfd the peer signals when it enqueues while we sleep.
    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Whether [`RxQueue::interrupt_fd`] is an eventfd the worker drains
    /// when it wakes (`false`: an fd that is readable while frames wait,
    /// such as a tap's, which only the queue itself reads).
    fn interrupt_is_eventfd(&self) -> bool {
        true
    }
    /// Asks the peer to signal (`true`) or not (`false`) on enqueue.
    fn set_interrupt(&mut self, enabled: bool);
    /// True when frames are waiting (checked after enabling interrupts).
    fn has_pending(&self) -> bool;
    /// Where the queue stands, for a process taking it over, when that is
    /// not in memory the queue shares with its peer (a cursor of its own,
    /// buffers it holds). Asked only while the workers are paused, after a
    /// release.
    fn position(&self) -> Option<QueuePosition> {
        None
    }
}

/// What [`TxQueue::tx_burst`] did with a burst of frames.
#[derive(Debug)]
pub struct TxOutcome {
    /// Bit `i` is set when `frames[i]` was taken.
    pub sent: u32,
    /// How many frames were tried, from the first: those of them not sent
    /// were too long for the peer's buffers ([`TxError::TooLong`]); the
    /// ones after were not tried, for [`TxOutcome::stop`].
    pub tried: usize,
    /// Why the queue stopped before the end of the burst: it was full
    /// ([`TxError::Full`]) or the peer broke it ([`TxError::Fault`]).
    pub stop: Option<TxError>,
    /// Bit `i` is set when `frames[i]` was not sent for
    /// [`TxError::Unfinished`] (rather than [`TxError::TooLong`]).
    pub unfinished: u32,
}

impl TxOutcome {
    /// What became of `frames[i]`: sent, too long, or not tried for
    /// [`TxOutcome::stop`] (`None` when it was not tried for a fault:
    /// the port is being reset).
    pub fn of(&self, i: usize) -> Option<Result<(), TxError>> {
        if i < self.tried {
            Some(if self.sent & (1 << i) != 0 {
                Ok(())
            } else if self.unfinished & (1 << i) != 0 {
                Err(TxError::Unfinished)
            } else {
                Err(TxError::TooLong)
            })
        } else {
            match &self.stop {
                Some(TxError::Full) => Some(Err(TxError::Full)),
                _ => None,
            }
        }
    }
}

/// [`TxQueue::tx_burst`] as a loop of `one` over the frames (the default
/// `tx_burst`). Takes at most [`BURST_SIZE`] frames.
#[inline(always)]
pub fn tx_each(
    frames: &[TxFrame<'_>],
    mut one: impl FnMut(&TxFrame<'_>) -> Result<(), TxError>,
) -> TxOutcome {
    const _: () = assert!(BURST_SIZE <= 32, "TxOutcome::sent has a bit per frame");
    let frames = &frames[..frames.len().min(BURST_SIZE)];
    let mut sent = 0u32;
    for (i, f) in frames.iter().enumerate() {
        match one(f) {
            Ok(()) => sent |= 1 << i,
            Err(TxError::TooLong) => {}
            Err(e) => {
                return TxOutcome {
                    sent,
                    tried: i,
                    stop: Some(e),
                    unfinished: 0,
                }
            }
        }
    }
    TxOutcome {
        sent,
        tried: frames.len(),
        stop: None,
        unfinished: 0,
    }
}

/// Transmit side of one queue. May be shared by workers (see `TxSlot`).
pub trait TxQueue: Send {
    /// Copies one frame into the peer's buffers (published at [`TxQueue::flush`]).
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError>;
    /// Copies up to [`BURST_SIZE`] frames in order, as [`TxQueue::tx`] each,
    /// stopping at the first that finds the queue full or broken. One call
    /// a burst; the default is compiled for each queue type, so a queue
    /// whose `tx` is `#[inline(always)]` has its per-frame copy inlined in
    /// this loop. memif and vhost-user write their usual frame (one
    /// buffer, unchanged) in a loop of their own, through [`tx_each`].
    fn tx_burst(&mut self, frames: &[TxFrame<'_>]) -> TxOutcome {
        tx_each(frames, |f| self.tx(f))
    }
    /// The offloads the peer takes over: a frame with other work left is
    /// finished in software before it reaches this queue.
    fn offloads(&self) -> OffloadCaps {
        OffloadCaps::NONE
    }
    /// Publishes what was queued since the last flush and signals the peer if
    /// it asked for interrupts.
    fn flush(&mut self);
    /// As [`RxQueue::position`], after a flush.
    fn position(&self) -> Option<QueuePosition> {
        None
    }
}

/// Where a queue stands ([`RxQueue::position`], [`TxQueue::position`]): a
/// value of the kind's own type, which only the kind that made the queue
/// reads back ([`QueuePosition::get`]), for its takeover.
pub struct QueuePosition(Box<dyn std::any::Any + Send>);

impl QueuePosition {
    /// A queue's position, of its kind's type `T`.
    pub fn new<T: std::any::Any + Send>(at: T) -> QueuePosition {
        QueuePosition(Box::new(at))
    }

    /// The position as the kind's type `T`; `None` if it is another type
    /// (another kind's queue).
    pub fn get<T: std::any::Any>(self) -> Option<T> {
        self.0.downcast().ok().map(|b| *b)
    }
}

impl std::fmt::Debug for QueuePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueuePosition")
    }
}

/// Queues a connected port hands to the data plane.
#[derive(Default)]
pub struct PortQueues {
    /// Receive queues.
    pub rx: Vec<Box<dyn RxQueue>>,
    /// Transmit queues.
    pub tx: Vec<Box<dyn TxQueue>>,
}

/// What the queues' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::{RxFrame, TxFrame};

    /// A transmit burst that takes every way through a queue: `short`
    /// as it is (one buffer), `long` (more than one buffer), `short`
    /// with `tag` in place of its addresses (rewritten), then `short`
    /// and `long` again.
    pub(crate) fn mixed_burst<'a>(
        short: &'a RxFrame,
        long: &'a RxFrame,
        tag: &'a [u8; 16],
    ) -> [TxFrame<'a>; 5] {
        let tagged = TxFrame::rewritten(short, tag, 12);
        [
            TxFrame::plain(short),
            TxFrame::plain(long),
            tagged,
            TxFrame::plain(short),
            TxFrame::plain(long),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_skips_too_long_frames_and_stops_when_full() {
        let frames = [TxFrame::EMPTY; 6];
        // Frame 1 is too long, the queue fills at frame 4.
        let mut n = 0;
        let out = tx_each(&frames, |_| {
            n += 1;
            match n {
                2 => Err(TxError::TooLong),
                5 => Err(TxError::Full),
                _ => Ok(()),
            }
        });
        assert_eq!((out.sent, out.tried), (0b1101, 4));
        assert!(matches!(out.stop, Some(TxError::Full)));
        assert!(matches!(out.of(0), Some(Ok(()))));
        assert!(matches!(out.of(1), Some(Err(TxError::TooLong))));
        assert!(matches!(out.of(4), Some(Err(TxError::Full))));
        assert!(matches!(out.of(5), Some(Err(TxError::Full))));
        // A fault: the frames after it were not tried, nor are they
        // reported as refused.
        let out = tx_each(&frames, |_| {
            Err(TxError::fault(QueueFault::PeerMemoryTruncated))
        });
        assert_eq!((out.sent, out.tried), (0, 0));
        assert!(out.of(0).is_none());
        // All sent.
        let out = tx_each(&frames, |_| Ok(()));
        assert_eq!((out.sent, out.tried), (0b11_1111, 6));
        assert!(out.stop.is_none());
    }
}
