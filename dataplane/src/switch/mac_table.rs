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
//!
//! Port security lives in the writers' rules: a *pinned* entry (a port's
//! configured MAC) never ages, is never evicted and never moves to another
//! port; an entry seen within the last `hold` seconds does not move either
//! (move protection), so a port cannot take a MAC that is in use elsewhere
//! by sending once with it. Every outcome names the entry it displaced or
//! that refused it, so callers can keep per-port entry counts exact.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::wire::MacAddr;

/// Entries per bucket: seven 16-byte entries plus the counter fit two cache lines.
pub const BUCKET_ENTRIES: usize = 7;

const KEY_VALID: u64 = 1 << 63;

/// One entry: its key (0 when free) beside its value, so that a hit reads
/// one cache line.
#[derive(Default)]
struct Slot {
    key: AtomicU64,
    val: AtomicU64,
}

/// The counter and the first three slots share the first cache line, where
/// a lookup in a lightly loaded table finds its entry; the other four fill
/// the second.
#[repr(C, align(64))]
struct Bucket {
    seq: AtomicU32,
    slots: [Slot; BUCKET_ENTRIES],
}

// Two cache lines, the first holding the counter and three whole slots.
const _: () = assert!(std::mem::size_of::<Bucket>() == 128);
const _: () = assert!(std::mem::offset_of!(Bucket, slots) + 3 * 16 <= 64);

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            seq: AtomicU32::new(0),
            slots: Default::default(),
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

    /// Runs `f` over the slots under the seqlock: its result if no writer
    /// held the bucket or wrote it meanwhile, else `None` (the caller
    /// retries or gives up).
    #[inline(always)]
    fn read_consistent<T>(&self, f: impl FnOnce(&[Slot; BUCKET_ENTRIES]) -> T) -> Option<T> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 != 0 {
            return None;
        }
        let r = f(&self.slots);
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(r)
    }

    /// One consistent read of `key`'s value (`Some(None)`: absent), or
    /// `None` when a writer held the bucket or wrote it meanwhile. It
    /// returns from the slot that holds the key (a found flag carried to
    /// the end of the read cost four instructions a lookup).
    #[inline(always)]
    fn read(&self, key: u64) -> Option<Option<u64>> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 != 0 {
            return None;
        }
        for slot in &self.slots {
            if slot.key.load(Ordering::Relaxed) == key {
                let v = slot.val.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                return (self.seq.load(Ordering::Relaxed) == s1).then_some(Some(v));
            }
        }
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(None)
    }

    fn unlock(&self, s: u32) {
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }
}

/// Port slot generations are this many bits wide (the top bit of the
/// packed generation field marks a pinned entry).
pub const GENERATION_MASK: u16 = 0x7fff;
const PINNED: u64 = 1 << 47;

/// Where a MAC was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacEntry {
    /// Port slot.
    pub port: u16,
    /// Generation of the port slot when learned (15 bits,
    /// [`GENERATION_MASK`]).
    pub port_gen: u16,
    /// Time of the last frame seen from this MAC (seconds, switch clock).
    pub last_seen: u32,
    /// A port's own configured or pinned address: never ages, is never
    /// evicted and never moves to another port.
    pub pinned: bool,
}

impl MacEntry {
    fn pack(&self) -> u64 {
        (u64::from(self.port) << 48)
            | (u64::from(self.port_gen & GENERATION_MASK) << 32)
            | if self.pinned { PINNED } else { 0 }
            | u64::from(self.last_seen)
    }
    fn unpack(v: u64) -> MacEntry {
        MacEntry {
            port: (v >> 48) as u16,
            port_gen: (v >> 32) as u16 & GENERATION_MASK,
            last_seen: v as u32,
            pinned: v & PINNED != 0,
        }
    }

    /// Same port slot and generation.
    #[inline]
    pub fn same_port(&self, other: &MacEntry) -> bool {
        self.port == other.port && self.port_gen == other.port_gen
    }

    /// The entry as the table stores it.
    #[inline]
    pub fn packed(&self) -> PackedEntry {
        PackedEntry(self.pack())
    }
}

/// An entry as the table stores it, for the forwarding path: compared and
/// read without unpacking it into a [`MacEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedEntry(u64);

impl PackedEntry {
    /// Port slot.
    #[inline]
    pub fn port(self) -> u16 {
        (self.0 >> 48) as u16
    }

    /// Generation of the port slot when learned.
    #[inline]
    pub fn port_gen(self) -> u16 {
        (self.0 >> 32) as u16 & GENERATION_MASK
    }

    /// Same port slot, generation and time of last sight as `fresh` (an
    /// unpinned entry), pinned or not: what learning `fresh` for a port
    /// that pins nothing leaves as it is.
    #[inline]
    pub fn is_fresh(self, fresh: PackedEntry) -> bool {
        self.0 & !PINNED == fresh.0
    }

    /// The entry's fields.
    #[inline]
    pub fn unpack(self) -> MacEntry {
        MacEntry::unpack(self.0)
    }
}

/// A (MAC, VLAN) pair as one number: made once per frame, for its
/// lookups and the forwarder's per-burst caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacKey(u64);

impl MacKey {
    /// A key no address has (an empty cache): the VLAN bits of a real key
    /// are at most 4095.
    pub const NONE: MacKey = MacKey(u64::MAX);

    /// The key of `mac` on `vlan` (a VLAN ID, at most 4095).
    #[inline]
    pub fn new(mac: MacAddr, vlan: u16) -> MacKey {
        debug_assert!(vlan <= 0x0fff);
        MacKey(mac.to_u64() | u64::from(vlan) << 48)
    }

    /// The key of the address whose six bytes, in wire order, are the low
    /// 48 bits of the little-endian word `wire` (a load of them; the top
    /// 16 bits are ignored), on `vlan` (at most 4095): [`MacKey::new`]
    /// without building the address.
    #[inline]
    pub fn from_wire(wire: u64, vlan: u16) -> MacKey {
        debug_assert!(vlan <= 0x0fff);
        MacKey((wire << 16).swap_bytes() | u64::from(vlan) << 48)
    }

    /// The key as the table's slots hold it (never 0, a free slot).
    #[inline]
    fn slot_key(self) -> u64 {
        KEY_VALID | self.0
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

/// Outcome of [`MacTable::learn`] and [`MacTable::pin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// Known already, same port, timestamp fresh: nothing written.
    Unchanged,
    /// A new entry.
    New,
    /// Refreshed the timestamp (same port).
    Refreshed,
    /// The MAC moved from another port (its entry, as it was).
    Moved(MacEntry),
    /// Inserted by evicting the oldest unpinned entry of a full bucket
    /// (the evicted entry).
    Evicted(MacEntry),
    /// Refused: the MAC is pinned to another port (its entry).
    Pinned(MacEntry),
    /// Refused: the MAC was seen on another port within the hold time
    /// (that port's entry).
    Held(MacEntry),
    /// Refused: every entry of the bucket is pinned.
    Full,
}

/// A concurrent (MAC, VLAN) → port table with a fixed number of buckets.
pub struct MacTable {
    buckets: Box<[Bucket]>,
    mask: usize,
}

fn key_of(mac: MacAddr, vlan: u16) -> u64 {
    MacKey::new(mac, vlan & 0x0fff).slot_key()
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
        let i = (h >> 32) as usize & self.mask;
        debug_assert!(i < self.buckets.len());
        // SAFETY: `mask` is the number of buckets (a power of two) minus
        // one, and `buckets` never changes length, so `i` is in bounds.
        unsafe { self.buckets.get_unchecked(i) }
    }

    /// Looks up where `mac` on `vlan` was learned. Never blocks: if writers keep
    /// the bucket busy the lookup reports a miss (the frame is then flooded).
    #[inline]
    pub fn lookup(&self, mac: MacAddr, vlan: u16) -> Option<MacEntry> {
        self.get(MacKey::new(mac, vlan & 0x0fff))
            .map(PackedEntry::unpack)
    }

    /// [`MacTable::lookup`] by key, the entry as stored.
    #[inline]
    pub fn get(&self, key: MacKey) -> Option<PackedEntry> {
        let key = key.slot_key();
        let b = self.bucket(key);
        // One read inline; the retries, when a writer holds the bucket, out
        // of line (a retry loop here makes the compiler keep all seven slot
        // addresses in registers and on the stack).
        match b.read(key) {
            Some(found) => found.map(PackedEntry),
            None => Self::lookup_contended(b, key),
        }
    }

    #[cold]
    #[inline(never)]
    fn lookup_contended(b: &Bucket, key: u64) -> Option<PackedEntry> {
        for _ in 0..7 {
            std::hint::spin_loop();
            if let Some(found) = b.read(key) {
                return found.map(PackedEntry);
            }
        }
        None
    }

    /// Records that `mac` on `vlan` was seen on `entry.port` at
    /// `entry.last_seen`. An entry of another port moves only if it is not
    /// pinned and was last seen `hold` seconds or more before (0: moves at
    /// once). Cheap when nothing changed: only a lookup, no write.
    #[inline]
    pub fn learn(&self, mac: MacAddr, vlan: u16, entry: MacEntry, hold: u32) -> Learned {
        if let Some(e) = self.lookup(mac, vlan) {
            if e.same_port(&entry) && e.last_seen == entry.last_seen && e.pinned == entry.pinned {
                return Learned::Unchanged;
            }
        }
        self.insert(key_of(mac, vlan), entry, hold)
    }

    /// Installs `mac` on `vlan` as pinned to `entry.port` (control plane):
    /// it replaces an unpinned entry of any port, and is refused when the
    /// MAC is pinned to another port.
    pub fn pin(&self, mac: MacAddr, vlan: u16, entry: MacEntry) -> Learned {
        self.insert(
            key_of(mac, vlan),
            MacEntry {
                pinned: true,
                ..entry
            },
            0,
        )
    }

    /// Removes the entry of `mac` on `vlan` if `doomed` says so of it
    /// (control plane): the entry removed.
    pub fn remove_if(
        &self,
        mac: MacAddr,
        vlan: u16,
        doomed: impl FnOnce(&MacEntry) -> bool,
    ) -> Option<MacEntry> {
        let key = key_of(mac, vlan);
        let b = self.bucket(key);
        let s = b.lock();
        let mut gone = None;
        for i in 0..BUCKET_ENTRIES {
            if b.slots[i].key.load(Ordering::Relaxed) != key {
                continue;
            }
            let e = MacEntry::unpack(b.slots[i].val.load(Ordering::Relaxed));
            if doomed(&e) {
                b.slots[i].key.store(0, Ordering::Relaxed);
                b.slots[i].val.store(0, Ordering::Relaxed);
                gone = Some(e);
            }
            break;
        }
        b.unlock(s);
        gone
    }

    fn insert(&self, key: u64, entry: MacEntry, hold: u32) -> Learned {
        let b = self.bucket(key);
        let s = b.lock();
        let mut empty = None;
        let mut oldest: Option<(u32, usize)> = None;
        let mut outcome = None;
        for i in 0..BUCKET_ENTRIES {
            let k = b.slots[i].key.load(Ordering::Relaxed);
            if k == key {
                let old = MacEntry::unpack(b.slots[i].val.load(Ordering::Relaxed));
                let (write, what) = if old.same_port(&entry) {
                    // A pinned entry stays pinned when its port refreshes it.
                    let e = MacEntry {
                        pinned: old.pinned || entry.pinned,
                        ..entry
                    };
                    (Some(e), Learned::Refreshed)
                } else if old.pinned {
                    (None, Learned::Pinned(old))
                } else if !entry.pinned && entry.last_seen.wrapping_sub(old.last_seen) < hold {
                    (None, Learned::Held(old))
                } else {
                    (Some(entry), Learned::Moved(old))
                };
                if let Some(e) = write {
                    b.slots[i].val.store(e.pack(), Ordering::Relaxed);
                }
                outcome = Some(what);
                break;
            }
            if k == 0 {
                empty.get_or_insert(i);
            } else {
                let e = MacEntry::unpack(b.slots[i].val.load(Ordering::Relaxed));
                if !e.pinned && oldest.is_none_or(|(seen, _)| e.last_seen < seen) {
                    oldest = Some((e.last_seen, i));
                }
            }
        }
        let outcome = outcome.unwrap_or_else(|| {
            let (slot, what) = match (empty, oldest) {
                (Some(i), _) => (i, Learned::New),
                (None, Some((_, i))) => (
                    i,
                    Learned::Evicted(MacEntry::unpack(b.slots[i].val.load(Ordering::Relaxed))),
                ),
                (None, None) => return Learned::Full,
            };
            b.slots[slot].val.store(entry.pack(), Ordering::Relaxed);
            b.slots[slot].key.store(key, Ordering::Relaxed);
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
            if b.slots.iter().all(|e| e.key.load(Ordering::Relaxed) == 0) {
                continue;
            }
            let s = b.lock();
            for i in 0..BUCKET_ENTRIES {
                let k = b.slots[i].key.load(Ordering::Relaxed);
                if k == 0 {
                    continue;
                }
                let rec = record(k, b.slots[i].val.load(Ordering::Relaxed));
                if !keep(&rec) {
                    b.slots[i].key.store(0, Ordering::Relaxed);
                    b.slots[i].val.store(0, Ordering::Relaxed);
                    removed += 1;
                }
            }
            b.unlock(s);
        }
        removed
    }

    /// Removes unpinned entries older than `max_age` seconds at time `now`;
    /// `removed` sees each.
    pub fn age(&self, now: u32, max_age: u32, mut removed: impl FnMut(&MacRecord)) -> usize {
        self.retain(|r| {
            let keep = r.entry.pinned || now.wrapping_sub(r.entry.last_seen) <= max_age;
            if !keep {
                removed(r);
            }
            keep
        })
    }

    /// Removes every entry pointing at `port`, pinned ones too unless
    /// `keep_pinned`.
    pub fn flush_port(&self, port: u16, keep_pinned: bool) -> usize {
        self.retain(|r| r.entry.port != port || (keep_pinned && r.entry.pinned))
    }

    /// A snapshot of every entry (control plane; allocates).
    pub fn entries(&self) -> Vec<MacRecord> {
        let mut out = Vec::new();
        for b in self.buckets.iter() {
            loop {
                let start = out.len();
                let read = b.read_consistent(|slots| {
                    for slot in slots {
                        let k = slot.key.load(Ordering::Relaxed);
                        if k != 0 {
                            out.push(record(k, slot.val.load(Ordering::Relaxed)));
                        }
                    }
                });
                if read.is_some() {
                    break;
                }
                out.truncate(start);
                std::hint::spin_loop();
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
    use crate::switch::test_util::{entry as at, mac};
    use std::sync::Arc;

    #[test]
    fn a_key_finds_the_entry_as_stored() {
        let t = MacTable::new(64);
        t.learn(mac(1), 7, at(3, 10), 0);
        let e = t.get(MacKey::new(mac(1), 7)).unwrap();
        assert_eq!(e.unpack(), at(3, 10));
        assert_eq!((e.port(), e.port_gen()), (3, 1));
        assert_eq!(t.get(MacKey::new(mac(1), 0)), None, "VLANs are separate");
        assert_ne!(MacKey::new(mac(1), 0), MacKey::NONE);
        // A key made from the wire's bytes is the address's key, whatever
        // the two bytes after the address.
        for (m, vlan) in [(mac(1), 0), (MacAddr([0xff; 6]), 4095), (mac(0xabcd), 7)] {
            let mut b = [0xa5u8; 8];
            b[..6].copy_from_slice(&m.0);
            assert_eq!(
                MacKey::from_wire(u64::from_le_bytes(b), vlan),
                MacKey::new(m, vlan)
            );
        }
        // Fresh: same port, generation and time, pinned or not.
        assert!(e.is_fresh(at(3, 10).packed()));
        assert!(!e.is_fresh(at(3, 11).packed()));
        assert!(!e.is_fresh(at(4, 10).packed()));
        let other_gen = MacEntry {
            port_gen: 2,
            ..at(3, 10)
        };
        assert!(!e.is_fresh(other_gen.packed()));
        let pinned = MacEntry {
            pinned: true,
            ..at(3, 10)
        };
        assert!(pinned.packed().is_fresh(at(3, 10).packed()));
    }

    #[test]
    fn learns_looks_up_and_moves() {
        let t = MacTable::new(1024);
        assert_eq!(t.lookup(mac(1), 0), None);
        assert_eq!(t.learn(mac(1), 0, at(3, 10), 0), Learned::New);
        assert_eq!(t.lookup(mac(1), 0), Some(at(3, 10)));
        assert_eq!(t.lookup(mac(1), 5), None, "VLANs are separate");
        assert_eq!(t.learn(mac(1), 0, at(3, 10), 0), Learned::Unchanged);
        assert_eq!(t.learn(mac(1), 0, at(3, 11), 0), Learned::Refreshed);
        assert_eq!(t.learn(mac(1), 0, at(4, 11), 0), Learned::Moved(at(3, 11)));
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 4);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn ages_and_flushes() {
        let t = MacTable::new(1024);
        t.learn(mac(1), 0, at(1, 100), 0);
        t.learn(mac(2), 0, at(2, 200), 0);
        t.learn(mac(3), 7, at(2, 290), 0);
        let mut aged = Vec::new();
        assert_eq!(t.age(300, 150, |r| aged.push(r.mac)), 1);
        assert_eq!(aged, vec![mac(1)]);
        assert_eq!(t.lookup(mac(1), 0), None);
        assert_eq!(t.flush_port(2, false), 2);
        assert!(t.is_empty());
    }

    #[test]
    fn full_bucket_evicts_oldest_and_never_grows() {
        let t = MacTable::new(BUCKET_ENTRIES); // one bucket
        for i in 0..BUCKET_ENTRIES as u64 {
            assert_eq!(t.learn(mac(i), 0, at(1, 100 + i as u32), 0), Learned::New);
        }
        assert_eq!(
            t.learn(mac(99), 0, at(1, 500), 0),
            Learned::Evicted(at(1, 100))
        );
        assert_eq!(t.lookup(mac(0), 0), None, "oldest evicted");
        assert!(t.lookup(mac(99), 0).is_some());
        assert_eq!(t.len(), BUCKET_ENTRIES);
    }

    #[test]
    fn pinned_entries_never_age_move_or_get_evicted() {
        let t = MacTable::new(BUCKET_ENTRIES); // one bucket
        assert_eq!(t.learn(mac(1), 0, at(2, 5), 0), Learned::New);
        // Pinning takes the MAC from the port that learned it.
        assert_eq!(t.pin(mac(1), 0, at(1, 10)), Learned::Moved(at(2, 5)));
        let pinned = MacEntry {
            pinned: true,
            ..at(1, 10)
        };
        assert_eq!(t.lookup(mac(1), 0), Some(pinned));
        // Another port cannot take it, however long it was quiet.
        assert_eq!(t.learn(mac(1), 0, at(2, 1000), 0), Learned::Pinned(pinned));
        assert_eq!(t.pin(mac(1), 0, at(2, 1000)), Learned::Pinned(pinned));
        // Its own port refreshes it; it stays pinned.
        assert_eq!(t.learn(mac(1), 0, at(1, 20), 0), Learned::Refreshed);
        assert!(t.lookup(mac(1), 0).unwrap().pinned);
        assert_eq!(t.age(10_000, 300, |_| ()), 0, "pinned entries do not age");
        // A full bucket evicts unpinned entries only, and refuses when
        // only pinned ones are left.
        for i in 2..=BUCKET_ENTRIES as u64 {
            assert_eq!(t.learn(mac(i), 0, at(3, 30), 0), Learned::New);
        }
        assert!(matches!(t.learn(mac(50), 0, at(3, 40), 0), Learned::Evicted(e) if !e.pinned));
        assert!(t.lookup(mac(1), 0).is_some());
        // Six pins of port 4 evict the six unpinned entries; a seventh
        // finds only pinned ones.
        for i in 60..66 {
            assert!(matches!(t.pin(mac(i), 0, at(4, 50)), Learned::Evicted(_)));
        }
        assert_eq!(t.pin(mac(66), 0, at(4, 50)), Learned::Full);
        assert_eq!(t.learn(mac(99), 0, at(3, 60), 0), Learned::Full);
        // Link down keeps pinned entries; removing the port does not.
        assert_eq!(t.flush_port(1, true), 0);
        assert_eq!(t.flush_port(1, false), 1);
        assert_eq!(t.flush_port(4, true), 0);
        assert_eq!(t.flush_port(4, false), 6);
    }

    #[test]
    fn a_fresh_entry_does_not_move_within_the_hold_time() {
        let t = MacTable::new(1024);
        assert_eq!(t.learn(mac(1), 0, at(1, 100), 5), Learned::New);
        assert_eq!(t.learn(mac(1), 0, at(2, 104), 5), Learned::Held(at(1, 100)));
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 1);
        assert_eq!(
            t.learn(mac(1), 0, at(2, 105), 5),
            Learned::Moved(at(1, 100))
        );
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 2);
    }

    #[test]
    fn a_lookup_in_a_held_bucket_misses_without_blocking() {
        let t = MacTable::new(64);
        t.learn(mac(1), 0, at(1, 0), 0);
        let b = t.bucket(key_of(mac(1), 0));
        let s = b.lock();
        assert_eq!(t.lookup(mac(1), 0), None);
        b.unlock(s);
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 1);
    }

    #[test]
    fn entries_fill_every_slot_of_a_bucket() {
        // One bucket: every key lands in it, so all seven slots are used,
        // the ones on the second cache line too.
        let t = MacTable::new(BUCKET_ENTRIES);
        for i in 0..BUCKET_ENTRIES as u64 {
            assert_eq!(t.learn(mac(i), 0, at(1, 0), 0), Learned::New);
        }
        for i in 0..BUCKET_ENTRIES as u64 {
            assert_eq!(t.lookup(mac(i), 0).unwrap().port, 1);
        }
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
                            t.learn(m, 0, at(w, round), 0);
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
