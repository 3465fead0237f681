//! Packet capture: copies of a port's frames, taken by the workers that
//! move them, for a writer on another thread (the control API streams them
//! as pcapng).
//!
//! Memory is bounded when the session starts: a pool of buffers of
//! `snaplen` bytes each moves between a free queue and a full queue; a
//! worker finding no free buffer counts the frame in
//! [`Capture::dropped`] and goes on. The data frame itself is never held
//! back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crossbeam::queue::ArrayQueue;

use crate::queue::{RxFrame, TxFrame};
use crate::types::PortId;

/// Which way a frame crossed the port, seen from the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received from the port's peer.
    Rx,
    /// Sent to the port's peer.
    Tx,
}

/// One captured frame.
#[derive(Debug)]
pub struct CaptureFrame {
    /// Wall-clock time of the burst it came in (since the Unix epoch).
    pub timestamp: Duration,
    /// Which way it went.
    pub direction: Direction,
    /// Its length on the wire (`data` holds at most `snaplen` of it).
    pub orig_len: u32,
    /// Its first bytes.
    pub data: Vec<u8>,
}

/// Memory a capture's buffers may take, at most.
pub const CAPTURE_MEMORY: usize = 16 << 20;
/// Buffers a capture has, at least (a large snaplen takes more memory).
pub const MIN_BUFFERS: usize = 64;
/// Buffers a capture has, at most.
pub const MAX_BUFFERS: usize = 8192;
/// Largest snaplen (as tcpdump's default).
pub const MAX_SNAPLEN: u32 = 262_144;

/// A capture running on one port.
pub struct Capture {
    /// The port's slot.
    pub port: PortId,
    rx: bool,
    tx: bool,
    snaplen: u32,
    /// Frames still to take (`u64::MAX`: no limit).
    remaining: AtomicU64,
    free: ArrayQueue<Box<CaptureFrame>>,
    full: ArrayQueue<Box<CaptureFrame>>,
    dropped: AtomicU64,
    taken: AtomicU64,
}

impl Capture {
    /// A capture of port `port`'s frames in the directions asked, of at
    /// most `snaplen` bytes each (clamped to 1..=[`MAX_SNAPLEN`]), ending
    /// after `count` frames if given.
    pub fn new(port: PortId, rx: bool, tx: bool, snaplen: u32, count: Option<u64>) -> Capture {
        let snaplen = snaplen.clamp(1, MAX_SNAPLEN);
        let buffers = (CAPTURE_MEMORY / snaplen as usize).clamp(MIN_BUFFERS, MAX_BUFFERS);
        let free = ArrayQueue::new(buffers);
        for _ in 0..buffers {
            let _ = free.push(Box::new(CaptureFrame {
                timestamp: Duration::ZERO,
                direction: Direction::Rx,
                orig_len: 0,
                data: Vec::with_capacity(snaplen as usize),
            }));
        }
        Capture {
            port,
            rx,
            tx,
            snaplen,
            remaining: AtomicU64::new(count.unwrap_or(u64::MAX)),
            free,
            full: ArrayQueue::new(buffers),
            dropped: AtomicU64::new(0),
            taken: AtomicU64::new(0),
        }
    }

    /// Whether received frames are captured.
    #[inline]
    pub fn wants_rx(&self) -> bool {
        self.rx
    }

    /// Whether sent frames are captured.
    #[inline]
    pub fn wants_tx(&self) -> bool {
        self.tx
    }

    /// The longest copy kept of a frame.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Frames not captured because the reader fell behind (no free buffer).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Frames captured so far.
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// True once `count` frames were taken.
    pub fn done(&self) -> bool {
        self.remaining.load(Ordering::Relaxed) == 0
    }

    /// Claims one frame of the count; false when the count is reached.
    fn claim(&self) -> bool {
        self.remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| match r {
                0 => None,
                u64::MAX => Some(u64::MAX),
                r => Some(r - 1),
            })
            .is_ok()
    }

    /// A free buffer for one more frame, or `None` (counted) when none is
    /// free or the count is reached.
    fn buffer(&self) -> Option<Box<CaptureFrame>> {
        let Some(b) = self.free.pop() else {
            if !self.done() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        };
        if !self.claim() {
            let _ = self.free.push(b);
            return None;
        }
        Some(b)
    }

    fn submit(&self, b: Box<CaptureFrame>) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        // Never full: it has room for every buffer of the pool.
        let _ = self.full.push(b);
    }

    /// Copies received frames (a worker, for a burst from the port).
    #[cold]
    pub fn take_rx(&self, frames: &[RxFrame]) {
        let now = now();
        for f in frames {
            let Some(mut b) = self.buffer() else { return };
            let n = (f.len).min(self.snaplen) as usize;
            b.data.clear();
            b.data.resize(n, 0);
            let got = f.read_prefix(&mut b.data);
            b.data.truncate(got);
            b.orig_len = f.len;
            b.timestamp = now;
            b.direction = Direction::Rx;
            self.submit(b);
        }
    }

    /// Copies one frame sent to the port (a worker, after the send).
    #[cold]
    pub fn take_tx(&self, f: &TxFrame<'_>, now: Duration) {
        let Some(mut b) = self.buffer() else { return };
        let len = f.len();
        let n = len.min(self.snaplen as usize);
        b.data.clear();
        b.data.resize(n, 0);
        let mut r = f.reader();
        // SAFETY: `b.data` is an owned, writable buffer of `n` bytes, not
        // shared with the frame's source segments.
        let got = unsafe { r.copy_to(b.data.as_mut_ptr(), n) };
        b.data.truncate(got);
        b.orig_len = len as u32;
        b.timestamp = now;
        b.direction = Direction::Tx;
        self.submit(b);
    }

    /// The next captured frame, if any (the reader).
    pub fn pop(&self) -> Option<Box<CaptureFrame>> {
        self.full.pop()
    }

    /// Gives a frame's buffer back to the pool once written.
    pub fn recycle(&self, b: Box<CaptureFrame>) {
        let _ = self.free.push(b);
    }
}

/// The wall clock, as a capture timestamp.
#[inline]
pub fn now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_at_snaplen_and_counted_to_the_limit() {
        let data: Vec<u8> = (0..100).collect();
        let f = RxFrame::of(&[&data]);
        let c = Capture::new(0, true, true, 60, Some(3));
        c.take_rx(&[RxFrame::of(&[&data]), RxFrame::of(&[&data])]);
        c.take_tx(&TxFrame::plain(&f), now());
        c.take_rx(std::slice::from_ref(&f));
        assert!(c.done());
        let a = c.pop().unwrap();
        assert_eq!(
            (a.orig_len, a.data.len(), a.direction),
            (100, 60, Direction::Rx)
        );
        assert_eq!(a.data[..], data[..60]);
        c.recycle(a);
        c.pop().unwrap();
        assert_eq!(c.pop().unwrap().direction, Direction::Tx);
        assert!(c.pop().is_none());
        // The count reached is not a loss.
        assert_eq!((c.taken(), c.dropped()), (3, 0));
    }

    #[test]
    fn a_reader_that_falls_behind_loses_capture_frames_only() {
        let data = [7u8; 64];
        let f = RxFrame::of(&[&data]);
        let c = Capture::new(0, true, false, MAX_SNAPLEN, None);
        let pool = MIN_BUFFERS;
        for _ in 0..pool + 10 {
            c.take_rx(std::slice::from_ref(&f));
        }
        assert_eq!((c.taken(), c.dropped()), (pool as u64, 10));
        // A buffer given back is used again.
        let b = c.pop().unwrap();
        c.recycle(b);
        c.take_rx(std::slice::from_ref(&f));
        assert_eq!(c.taken(), pool as u64 + 1);
    }
}
