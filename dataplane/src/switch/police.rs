//! Policers: a port's rate limits ([`switchyard_api::spec::RateLimits`]),
//! one [`Policer`] per limited direction, as VPP's policers and OVS's
//! ingress policing are. A frame that finds a bucket short is dropped
//! (`policed_rx`, `policed_tx`), never queued: the switch holds no frame.
//!
//! A policer is a token bucket of bits, one of frames, or both, refilled
//! at its rate up to its burst. A frame passes while every bucket holds
//! one unit (a bit, a frame) or more, and takes its cost from each: a bucket may go below zero by
//! up to one frame, and the frames after wait until it has refilled, so
//! the rate over time holds, a burst after a quiet spell is the bucket and
//! at most one frame, and a frame larger than the bucket (a 64 KB
//! super-frame through a small burst) still passes. (Passing only frames
//! that fit what is left would favour small frames over a TCP sender's
//! super-frames: measured here, one TCP stream then reached 92 to 96% of
//! the rate, against 97.5 to 97.8% this way.) A frame costs its length in bits and one
//! frame; a super-frame the port's peer left to segment costs the
//! segments it becomes, headers and all, as the kernel's `qdisc_pkt_len`
//! charges it.
//!
//! A burst is metered at once, at one instant, each frame in order: one
//! that finds a bucket short is dropped and charges nothing, and a smaller
//! one after it may pass (as VPP's and DPDK's policers judge each packet:
//! a TCP sender's acknowledgements get through beside its full frames).
//! The buckets are shared by the workers that receive from or send to the
//! port, under a lock taken once per burst; a port without a limit has no
//! policer, and its frames pay one test per burst.

use std::sync::{Mutex, PoisonError};

use switchyard_api::spec::Meter;

/// Nanoseconds in a second: a refill of `elapsed` nanoseconds at `rate` a
/// second is `elapsed * rate` billionths, of which the whole units go
/// into the bucket and the rest is kept for the next, so that refills of
/// a few nanoseconds lose nothing.
const NANO: u128 = 1_000_000_000;

/// What a frame costs a policer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Bits on the wire (whole Ethernet frames, no preamble or FCS).
    pub bits: u64,
    /// Frames on the wire.
    pub frames: u64,
}

/// One bucket: its rate a second and its size, in units (bits, frames).
/// A policer without one has a bucket that never empties: rate 0, and its
/// frames cost nothing (`mask` 0).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    rate: u64,
    size: i64,
    /// All ones where the bucket counts, 0 where there is none: what a
    /// frame's cost is masked with.
    mask: u64,
}

impl Bucket {
    fn new(bucket: Option<(u64, u64)>) -> Bucket {
        match bucket {
            Some((rate, burst)) => Bucket {
                rate,
                size: i64::try_from(burst).unwrap_or(i64::MAX),
                mask: u64::MAX,
            },
            None => Bucket {
                rate: 0,
                size: 1,
                mask: 0,
            },
        }
    }

    /// `level` after `elapsed` nanoseconds.
    #[inline]
    fn refill(&self, level: &mut Level, elapsed: u64) {
        let add = u128::from(elapsed) * u128::from(self.rate) + u128::from(level.frac);
        let whole = i64::try_from(add / NANO).unwrap_or(i64::MAX);
        match level.units.checked_add(whole) {
            Some(u) if u < self.size => {
                level.units = u;
                level.frac = (add % NANO) as u64;
            }
            _ => *level = Level::full(self),
        }
    }
}

/// A bucket's level: whole units (below zero after a frame larger than
/// what was left), and billionths of one.
#[derive(Debug, Clone, Copy)]
struct Level {
    units: i64,
    frac: u64,
}

impl Level {
    fn full(b: &Bucket) -> Level {
        Level {
            units: b.size,
            frac: 0,
        }
    }
}

/// The buckets' levels and when they were last filled.
#[derive(Debug)]
struct Levels {
    at: u64,
    bits: Level,
    frames: Level,
}

/// One direction's policer of one port.
#[derive(Debug)]
pub struct Policer {
    meter: Meter,
    bits: Bucket,
    frames: Bucket,
    levels: Mutex<Levels>,
}

impl Policer {
    /// A policer for `meter` (validated), its buckets full at `now_ns`.
    pub fn new(meter: &Meter, now_ns: u64) -> Policer {
        let bits = Bucket::new(meter.bits_bucket());
        let frames = Bucket::new(meter.packets_bucket());
        Policer {
            meter: *meter,
            levels: Mutex::new(Levels {
                at: now_ns,
                bits: Level::full(&bits),
                frames: Level::full(&frames),
            }),
            bits,
            frames,
        }
    }

    /// The meter it enforces.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Meters the frames `costs` describes, in order, at `now_ns`: tells
    /// `verdict` whether each passes (and charges those that do), and
    /// returns how many did. A frame passes while both buckets hold
    /// something.
    pub fn admit(
        &self,
        now_ns: u64,
        costs: impl Iterator<Item = Cost>,
        mut verdict: impl FnMut(bool),
    ) -> usize {
        let mut l = self.levels.lock().unwrap_or_else(PoisonError::into_inner);
        // Workers read the clock apart: one a little behind fills nothing.
        let elapsed = now_ns.saturating_sub(l.at);
        l.at = l.at.max(now_ns);
        let (mut bits, mut frames) = (l.bits, l.frames);
        self.bits.refill(&mut bits, elapsed);
        self.frames.refill(&mut frames, elapsed);
        let mut passed = 0;
        for c in costs {
            let pass = bits.units > 0 && frames.units > 0;
            if pass {
                // A level is positive before and a frame's cost far below
                // 2^62 (its bytes are a u32's, times 8 bits): no overflow.
                bits.units -= (c.bits & self.bits.mask) as i64;
                frames.units -= (c.frames & self.frames.mask) as i64;
                passed += 1;
            }
            verdict(pass);
        }
        l.bits = bits;
        l.frames = frames;
        passed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn frames(n: usize, bytes: u64) -> impl Iterator<Item = Cost> {
        std::iter::repeat_n(
            Cost {
                bits: bytes * 8,
                frames: 1,
            },
            n,
        )
    }

    /// How many of `costs` `p` passes at `now`.
    fn admit(p: &Policer, now: u64, costs: impl Iterator<Item = Cost>) -> usize {
        p.admit(now, costs, |_| {})
    }

    #[test]
    fn a_full_bucket_passes_its_burst_then_the_rate() {
        // 1 Mbit/s, a bucket of 12,000 bits: ten 150-byte frames.
        let m: Meter = "rate=1M,burst=12k".parse().unwrap();
        let p = Policer::new(&m, 0);
        assert_eq!(admit(&p, 0, frames(32, 150)), 10);
        assert_eq!(admit(&p, 0, frames(32, 150)), 0);
        // 1.2 ms refills one frame's 1200 bits.
        assert_eq!(admit(&p, 1_200_000, frames(32, 150)), 1);
        assert_eq!(admit(&p, 1_200_000, frames(32, 150)), 0);
        // One bit in the bucket (a microsecond) lets a frame through,
        // which leaves it below zero until the frame is paid for.
        assert_eq!(admit(&p, 1_200_999, frames(32, 150)), 0);
        assert_eq!(admit(&p, 1_201_000, frames(32, 150)), 1);
        assert_eq!(admit(&p, 2_400_000, frames(32, 150)), 0);
        assert_eq!(admit(&p, 2_401_000, frames(32, 150)), 1);
        // Over a second of 1 ms bursts, the rate to within one frame.
        let mut passed = 0;
        for t in 1..=1000 {
            passed += admit(&p, 2_401_000 + t * MS, frames(32, 150));
        }
        assert!((833..=834).contains(&passed), "{passed}");
        // A long quiet spell fills the bucket, no more.
        assert_eq!(admit(&p, 3600 * 1000 * MS, frames(32, 150)), 10);
    }

    #[test]
    fn frames_larger_than_the_bucket_pass_and_are_paid_for() {
        // A 64 KiB super-frame through a bucket of 10,000 bits.
        let m: Meter = "rate=1M,burst=10k".parse().unwrap();
        let p = Policer::new(&m, 0);
        let big = || frames(1, 65536);
        assert_eq!(admit(&p, 0, big()), 1);
        // It is paid for: the bucket holds something again after 514 ms.
        assert_eq!(admit(&p, 500 * MS, big()), 0);
        assert_eq!(admit(&p, 514 * MS, big()), 0, "still below zero");
        assert_eq!(admit(&p, 515 * MS, big()), 1);
    }

    #[test]
    fn packets_and_bits_both_hold_and_each_frame_is_judged_alone() {
        let m: Meter = "rate=1G,pps=1k,pps-burst=4".parse().unwrap();
        let p = Policer::new(&m, 0);
        assert_eq!(admit(&p, 0, frames(32, 64)), 4);
        assert_eq!(admit(&p, MS, frames(32, 64)), 1, "one frame refilled");
        assert_eq!(admit(&p, MS, frames(32, 64)), 0);
        // Bits run out with the first frame, not the second.
        let m: Meter = "rate=8k,burst=16k".parse().unwrap();
        let p = Policer::new(&m, 0);
        let burst = [1500, 1000, 10].map(|b| Cost {
            bits: b * 8,
            frames: 1,
        });
        let mut verdicts = Vec::new();
        assert_eq!(p.admit(0, burst.into_iter(), |v| verdicts.push(v)), 2);
        assert_eq!(verdicts, [true, true, false]);
        // 4000 bits below zero: half a second at 8 kbit/s, and one bit.
        assert_eq!(admit(&p, 500 * MS, frames(1, 10)), 0);
        assert_eq!(admit(&p, 500 * MS + 125_000, frames(1, 10)), 1);
        // A clock read a little behind another worker's fills nothing.
        let q = Policer::new(&"pps=10,pps-burst=1".parse().unwrap(), 10 * MS);
        assert_eq!(admit(&q, 5 * MS, frames(3, 64)), 1);
        assert_eq!(admit(&q, 5 * MS, frames(3, 64)), 0);
        assert_eq!(admit(&q, 10 * MS, frames(3, 64)), 0);
        assert_eq!(admit(&q, 109 * MS, frames(3, 64)), 0);
        assert_eq!(admit(&q, 110 * MS, frames(3, 64)), 1);
    }
}
