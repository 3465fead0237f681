//! Policers: a port's rate limits ([`switchyard_api::spec::RateLimits`]),
//! one [`Policer`] per limited direction, as VPP's policers and OVS's
//! ingress policing are. A frame that finds a bucket short is dropped
//! (`policed_rx`, `policed_tx`), never queued: the switch holds no frame.
//!
//! A policer is a token bucket of bits, one of frames, or both, refilled
//! at its rate up to its burst. A frame passes while every bucket holds
//! something, and takes its cost from each: a bucket may go below zero by
//! up to one frame, and the frames after wait until it has refilled, so
//! the rate over time holds, a burst after a quiet spell is the bucket and
//! at most one frame, and a frame larger than the bucket (a 64 KB
//! super-frame through a small burst) still passes. (Passing only frames
//! that fit what is left would favour small frames over a TCP sender's
//! super-frames: measured here, TCP then reached 92 to 96% of the rate,
//! against 97.5% this way.) A frame costs its length in bits and one
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

/// Nanoseconds in a second: bucket levels are kept in units of a
/// billionth (of a bit, of a frame), so that a refill of a few
/// nanoseconds loses nothing.
const NANO: i128 = 1_000_000_000;

/// What a frame costs a policer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Bits on the wire (whole Ethernet frames, no preamble or FCS).
    pub bits: u64,
    /// Frames on the wire.
    pub frames: u64,
}

/// One bucket: its rate a second and its size, in billionths.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    rate: i128,
    size: i128,
}

impl Bucket {
    fn new((rate, burst): (u64, u64)) -> Bucket {
        Bucket {
            rate: i128::from(rate),
            size: i128::from(burst) * NANO,
        }
    }

    /// `level` after `elapsed` nanoseconds.
    #[inline]
    fn refill(&self, level: i128, elapsed: u64) -> i128 {
        level
            .saturating_add(i128::from(elapsed).saturating_mul(self.rate))
            .min(self.size)
    }

    /// Whether a frame may pass at `level`: while the bucket holds
    /// anything.
    #[inline]
    fn passes(level: i128) -> bool {
        level > 0
    }
}

/// The buckets' levels and when they were last filled.
#[derive(Debug)]
struct Levels {
    at: u64,
    bits: i128,
    frames: i128,
}

/// One direction's policer of one port.
#[derive(Debug)]
pub struct Policer {
    meter: Meter,
    bits: Option<Bucket>,
    frames: Option<Bucket>,
    levels: Mutex<Levels>,
}

impl Policer {
    /// A policer for `meter` (validated), its buckets full at `now_ns`.
    pub fn new(meter: &Meter, now_ns: u64) -> Policer {
        let bits = meter.bits_bucket().map(Bucket::new);
        let frames = meter.packets_bucket().map(Bucket::new);
        Policer {
            meter: *meter,
            levels: Mutex::new(Levels {
                at: now_ns,
                bits: bits.map_or(0, |b| b.size),
                frames: frames.map_or(0, |b| b.size),
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
    /// returns how many did.
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
        if let Some(b) = &self.bits {
            bits = b.refill(bits, elapsed);
        }
        if let Some(b) = &self.frames {
            frames = b.refill(frames, elapsed);
        }
        let mut passed = 0;
        for c in costs {
            let pass = (self.bits.is_none() || Bucket::passes(bits))
                && (self.frames.is_none() || Bucket::passes(frames));
            if pass {
                bits -= i128::from(c.bits) * NANO;
                frames -= i128::from(c.frames) * NANO;
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
        // Anything in the bucket lets a frame through, which leaves it
        // below zero until the frame is paid for.
        assert_eq!(admit(&p, 1_200_001, frames(32, 150)), 1);
        assert_eq!(admit(&p, 2_400_000, frames(32, 150)), 0);
        assert_eq!(admit(&p, 2_400_001, frames(32, 150)), 1);
        // Over a second of 1 ms bursts, the rate to within one frame.
        let mut passed = 0;
        for t in 1..=1000 {
            passed += admit(&p, 2_400_001 + t * MS, frames(32, 150));
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
        // 4000 bits below zero: half a second at 8 kbit/s.
        assert_eq!(admit(&p, 500 * MS, frames(1, 10)), 0);
        assert_eq!(admit(&p, 500 * MS + 1, frames(1, 10)), 1);
        // A clock read a little behind another worker's fills nothing.
        let q = Policer::new(&"pps=10,pps-burst=1".parse().unwrap(), 10 * MS);
        assert_eq!(admit(&q, 5 * MS, frames(3, 64)), 1);
        assert_eq!(admit(&q, 5 * MS, frames(3, 64)), 0);
        assert_eq!(admit(&q, 10 * MS, frames(3, 64)), 0);
        assert_eq!(admit(&q, 10 * MS + 1, frames(3, 64)), 1);
    }
}
