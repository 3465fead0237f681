//! The MAC learning table of one bridge domain.
//!
//! A fixed-size table of buckets shared by every worker. Readers never take a
//! lock: each bucket carries a sequence counter (a seqlock), and a reader
//! retries when a writer was active. Writers (learning workers and the aging
//! sweep) take the bucket by making the counter odd. A full bucket evicts its
//! oldest entry, so the table never grows and never allocates after creation.
//!
//! An entry maps (MAC, VLAN) to a port slot plus that slot's generation, so an
//! entry that outlives its port (slot reused) is recognised as stale.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::wire::MacAddr;

/// Entries per bucket: seven 16-byte entries plus the counter fit two cache lines.
pub const BUCKET_ENTRIES: usize = 7;

const KEY_VALID: u64 = 1 << 63;

#[repr(align(64))]
struct Bucket {
    seq: AtomicU32,
    keys: [AtomicU64; BUCKET_ENTRIES],
    vals: [AtomicU64; BUCKET_ENTRIES],
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            seq: AtomicU32::new(0),
            keys: Default::default(),
            vals: Default::default(),
        }
    }

    fn lock(&self) -> u32 {
        loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(
                        s,
                        s.wrapping_add(1),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                fence(Ordering::Release);
                return s;
            }
            std::hint::spin_loop();
        }
    }

    fn unlock(&self, s: u32) {
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }
}

/// Where a MAC was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacEntry {
    /// Port slot.
    pub port: u16,
    /// Generation of the port slot when learned.
    pub port_gen: u16,
    /// Time of the last frame seen from this MAC (seconds, switch clock).
    pub last_seen: u32,
}

impl MacEntry {
    fn pack(&self) -> u64 {
        (u64::from(self.port) << 48) | (u64::from(self.port_gen) << 32) | u64::from(self.last_seen)
    }
    fn unpack(v: u64) -> MacEntry {
        MacEntry {
            port: (v >> 48) as u16,
            port_gen: (v >> 32) as u16,
            last_seen: v as u32,
        }
    }
}

/// One (MAC, VLAN) → port mapping, as listed by [`MacTable::entries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacRecord {
    /// Address.
    pub mac: MacAddr,
    /// VLAN (0 = untagged).
    pub vlan: u16,
    /// Where it was learned.
    pub entry: MacEntry,
}

/// Outcome of [`MacTable::learn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// Known already, same port, timestamp fresh: nothing written.
    Unchanged,
    /// A new entry.
    New,
    /// The MAC moved from another port.
    Moved,
    /// Refreshed the timestamp.
    Refreshed,
    /// Inserted by evicting the oldest entry of a full bucket.
    Evicted,
}

/// A concurrent (MAC, VLAN) → port table with a fixed number of buckets.
pub struct MacTable {
    buckets: Box<[Bucket]>,
    mask: usize,
}

fn key_of(mac: MacAddr, vlan: u16) -> u64 {
    KEY_VALID | (u64::from(vlan & 0x0fff) << 48) | mac.to_u64()
}

impl MacTable {
    /// A table with room for at least `capacity` entries.
    pub fn new(capacity: usize) -> MacTable {
        let nb = capacity.div_ceil(BUCKET_ENTRIES).max(1).next_power_of_two();
        MacTable {
            buckets: (0..nb).map(|_| Bucket::new()).collect(),
            mask: nb - 1,
        }
    }

    /// Number of entry slots.
    pub fn capacity(&self) -> usize {
        self.buckets.len() * BUCKET_ENTRIES
    }

    #[inline]
    fn bucket(&self, key: u64) -> &Bucket {
        // Fibonacci hashing: the high bits of the product mix every key bit.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.buckets[(h >> 32) as usize & self.mask]
    }

    /// Looks up where `mac` on `vlan` was learned. Never blocks: if writers keep
    /// the bucket busy the lookup reports a miss (the frame is then flooded).
    #[inline]
    pub fn lookup(&self, mac: MacAddr, vlan: u16) -> Option<MacEntry> {
        let key = key_of(mac, vlan);
        let b = self.bucket(key);
        for _ in 0..8 {
            let s1 = b.seq.load(Ordering::Acquire);
            if s1 & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let mut found = None;
            for i in 0..BUCKET_ENTRIES {
                if b.keys[i].load(Ordering::Relaxed) == key {
                    found = Some(b.vals[i].load(Ordering::Relaxed));
                    break;
                }
            }
            fence(Ordering::Acquire);
            if b.seq.load(Ordering::Relaxed) == s1 {
                return found.map(MacEntry::unpack);
            }
        }
        None
    }

    /// Records that `mac` on `vlan` was seen on `entry.port` at `entry.last_seen`.
    /// Cheap when nothing changed: only a lookup, no write.
    #[inline]
    pub fn learn(&self, mac: MacAddr, vlan: u16, entry: MacEntry) -> Learned {
        if let Some(e) = self.lookup(mac, vlan) {
            if e.port == entry.port
                && e.port_gen == entry.port_gen
                && e.last_seen == entry.last_seen
            {
                return Learned::Unchanged;
            }
        }
        self.insert(key_of(mac, vlan), entry)
    }

    fn insert(&self, key: u64, entry: MacEntry) -> Learned {
        let b = self.bucket(key);
        let s = b.lock();
        let mut empty = None;
        let mut oldest = (u32::MAX, 0usize);
        let mut outcome = None;
        for i in 0..BUCKET_ENTRIES {
            let k = b.keys[i].load(Ordering::Relaxed);
            if k == key {
                let old = MacEntry::unpack(b.vals[i].load(Ordering::Relaxed));
                b.vals[i].store(entry.pack(), Ordering::Relaxed);
                outcome = Some(
                    if old.port == entry.port && old.port_gen == entry.port_gen {
                        Learned::Refreshed
                    } else {
                        Learned::Moved
                    },
                );
                break;
            }
            if k == 0 {
                empty.get_or_insert(i);
            } else {
                let seen = MacEntry::unpack(b.vals[i].load(Ordering::Relaxed)).last_seen;
                if seen < oldest.0 {
                    oldest = (seen, i);
                }
            }
        }
        let outcome = outcome.unwrap_or_else(|| {
            let (slot, what) = match empty {
                Some(i) => (i, Learned::New),
                None => (oldest.1, Learned::Evicted),
            };
            b.vals[slot].store(entry.pack(), Ordering::Relaxed);
            b.keys[slot].store(key, Ordering::Relaxed);
            what
        });
        b.unlock(s);
        outcome
    }

    /// Keeps only the entries for which `keep` returns true. Returns how many were removed.
    pub fn retain(&self, mut keep: impl FnMut(&MacRecord) -> bool) -> usize {
        let mut removed = 0;
        for b in self.buckets.iter() {
            // Skip empty buckets without taking the lock.
            if b.keys.iter().all(|k| k.load(Ordering::Relaxed) == 0) {
                continue;
            }
            let s = b.lock();
            for i in 0..BUCKET_ENTRIES {
                let k = b.keys[i].load(Ordering::Relaxed);
                if k == 0 {
                    continue;
                }
                let rec = record(k, b.vals[i].load(Ordering::Relaxed));
                if !keep(&rec) {
                    b.keys[i].store(0, Ordering::Relaxed);
                    b.vals[i].store(0, Ordering::Relaxed);
                    removed += 1;
                }
            }
            b.unlock(s);
        }
        removed
    }

    /// Removes entries older than `max_age` seconds at time `now`.
    pub fn age(&self, now: u32, max_age: u32) -> usize {
        self.retain(|r| now.wrapping_sub(r.entry.last_seen) <= max_age)
    }

    /// Removes every entry pointing at `port`.
    pub fn flush_port(&self, port: u16) -> usize {
        self.retain(|r| r.entry.port != port)
    }

    /// A snapshot of every entry (control plane; allocates).
    pub fn entries(&self) -> Vec<MacRecord> {
        let mut out = Vec::new();
        for b in self.buckets.iter() {
            loop {
                let s1 = b.seq.load(Ordering::Acquire);
                if s1 & 1 != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let start = out.len();
                for i in 0..BUCKET_ENTRIES {
                    let k = b.keys[i].load(Ordering::Relaxed);
                    if k != 0 {
                        out.push(record(k, b.vals[i].load(Ordering::Relaxed)));
                    }
                }
                fence(Ordering::Acquire);
                if b.seq.load(Ordering::Relaxed) == s1 {
                    break;
                }
                out.truncate(start);
            }
        }
        out
    }

    /// Number of live entries (control plane).
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn record(key: u64, val: u64) -> MacRecord {
    MacRecord {
        mac: MacAddr::from_u64(key),
        vlan: ((key >> 48) & 0x0fff) as u16,
        entry: MacEntry::unpack(val),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn mac(i: u64) -> MacAddr {
        MacAddr::from_u64(0x0200_0000_0000 | i)
    }
    fn at(port: u16, t: u32) -> MacEntry {
        MacEntry {
            port,
            port_gen: 1,
            last_seen: t,
        }
    }

    #[test]
    fn learns_looks_up_and_moves() {
        let t = MacTable::new(1024);
        assert_eq!(t.lookup(mac(1), 0), None);
        assert_eq!(t.learn(mac(1), 0, at(3, 10)), Learned::New);
        assert_eq!(t.lookup(mac(1), 0), Some(at(3, 10)));
        assert_eq!(t.lookup(mac(1), 5), None, "VLANs are separate");
        assert_eq!(t.learn(mac(1), 0, at(3, 10)), Learned::Unchanged);
        assert_eq!(t.learn(mac(1), 0, at(3, 11)), Learned::Refreshed);
        assert_eq!(t.learn(mac(1), 0, at(4, 11)), Learned::Moved);
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 4);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn ages_and_flushes() {
        let t = MacTable::new(1024);
        t.learn(mac(1), 0, at(1, 100));
        t.learn(mac(2), 0, at(2, 200));
        t.learn(mac(3), 7, at(2, 290));
        assert_eq!(t.age(300, 150), 1);
        assert_eq!(t.lookup(mac(1), 0), None);
        assert_eq!(t.flush_port(2), 2);
        assert!(t.is_empty());
    }

    #[test]
    fn full_bucket_evicts_oldest_and_never_grows() {
        let t = MacTable::new(BUCKET_ENTRIES); // one bucket
        for i in 0..BUCKET_ENTRIES as u64 {
            assert_eq!(t.learn(mac(i), 0, at(1, 100 + i as u32)), Learned::New);
        }
        assert_eq!(t.learn(mac(99), 0, at(1, 500)), Learned::Evicted);
        assert_eq!(t.lookup(mac(0), 0), None, "oldest evicted");
        assert!(t.lookup(mac(99), 0).is_some());
        assert_eq!(t.len(), BUCKET_ENTRIES);
    }

    #[test]
    fn concurrent_learners_and_readers_agree() {
        let t = Arc::new(MacTable::new(4096));
        let threads: Vec<_> = (0..4u16)
            .map(|w| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..200u32 {
                        for i in 0..256u64 {
                            let m = mac(u64::from(w) * 1000 + i);
                            t.learn(m, 0, at(w, round));
                            // A lookup may miss while another thread holds the
                            // bucket (the switch then floods); retry until seen.
                            let e = loop {
                                if let Some(e) = t.lookup(m, 0) {
                                    break e;
                                }
                                std::thread::yield_now();
                            };
                            assert_eq!(e.port, w);
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.len(), 1024);
    }
}
