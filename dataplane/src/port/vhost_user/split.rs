//! A split virtqueue read and written straight through host pointers.
//!
//! `virtio-queue`'s generic accessors translate every guest address through
//! the memory table, a region search per ring field and per descriptor:
//! after the copy itself, the largest cost on the vhost-user hot path. Here
//! the three rings are translated once, when a worker takes the queue, and
//! buffer addresses go through [`MemTable`], the frontend's few regions with
//! the last hit tried first.
//!
//! Speed is why this is our own code rather than `virtio-queue`'s
//! iterators: `benches/loop/RESULTS.md`, "2026-11-23, b4f5f11: direct split-ring path
//! for vhost-user" (loop benchmark, 64 B: 3.95-4.23 -> 6.35-6.80 Mpps) and
//! the criterion bench `cargo bench -p switchyard-benches --bench hot_path
//! -- virtqueue` (`virtqueue/pop_used` 99 -> 55 ns, `virtqueue/fill_used`
//! 125 -> 78 ns per packet).
//!
//! Nothing read from guest memory is trusted: avail entries and next
//! indices are checked against the ring size, a chain may not be longer
//! than its table (a loop), indirect tables must lie inside guest memory and
//! may not nest, and every buffer is resolved against the memory table in
//! u64 before use.

use std::sync::atomic::{AtomicU16, Ordering};

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Descriptor flags (virtio 1.2, 2.7.5), as `virtio-bindings` has them.
const F_NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
const F_WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
const F_INDIRECT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT as u16;

/// The frontend's memory regions as host ranges: `(guest start, length,
/// host start)`. Valid while the `GuestMemoryMmap` it was built from lives.
pub struct MemTable {
    regions: Vec<(u64, u64, *mut u8)>,
    last: std::cell::Cell<usize>,
}

// SAFETY: the pointers are into mappings owned by the `GuestMemoryMmap` the
// queue holds beside this table (see `Vq`); the table is only used by the
// worker that owns the queue.
unsafe impl Send for MemTable {}

impl MemTable {
    /// The host view of `mem`; `None` if a region has no host mapping.
    pub fn new(mem: &GuestMemoryMmap) -> Option<MemTable> {
        let regions = mem
            .iter()
            .map(|r| {
                let host = r.get_host_address(vm_memory::MemoryRegionAddress(0)).ok()?;
                Some((r.start_addr().0, r.len(), host))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(MemTable {
            regions,
            last: std::cell::Cell::new(0),
        })
    }

    #[inline]
    fn hit(&self, i: usize, gpa: u64, len: u64) -> Option<*mut u8> {
        let &(start, size, host) = self.regions.get(i)?;
        let off = gpa.checked_sub(start)?;
        if off >= size || len > size - off {
            return None;
        }
        // SAFETY: off + len <= size: the range lies inside this mapping.
        Some(unsafe { host.add(off as usize) })
    }

    /// The host address of guest range `gpa..gpa+len`, if it lies wholly
    /// inside one region.
    #[inline]
    pub fn translate(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let last = self.last.get();
        if let Some(p) = self.hit(last, gpa, len) {
            return Some(p);
        }
        (0..self.regions.len()).find_map(|i| {
            let p = self.hit(i, gpa, len)?;
            self.last.set(i);
            Some(p)
        })
    }

    /// Calls `f(host, n)` for each piece of guest range `gpa..gpa+len`
    /// (more than one only where the range crosses adjacent regions).
    /// `Err(())` if some byte of it is outside guest memory.
    #[inline]
    pub fn for_each_piece<E>(
        &self,
        gpa: u64,
        len: u32,
        mut f: impl FnMut(*mut u8, usize) -> Result<(), E>,
        outside: E,
    ) -> Result<(), E> {
        if len == 0 {
            return Ok(());
        }
        if let Some(p) = self.translate(gpa, u64::from(len)) {
            return f(p, len as usize);
        }
        let (mut at, mut left) = (gpa, u64::from(len));
        while left > 0 {
            let Some(&(start, size, host)) = self
                .regions
                .iter()
                .find(|&&(s, l, _)| at >= s && at - s < l)
            else {
                return Err(outside);
            };
            let off = at - start;
            let n = left.min(size - off);
            // SAFETY: off + n <= size: inside this region's mapping.
            f(unsafe { host.add(off as usize) }, n as usize)?;
            at += n;
            left -= n;
        }
        Ok(())
    }
}

/// One descriptor as read from guest memory.
#[derive(Debug, Clone, Copy)]
pub struct Desc {
    /// Guest address of the buffer.
    pub addr: u64,
    /// Its length.
    pub len: u32,
    /// `F_*` flags.
    pub flags: u16,
    /// Next descriptor when `F_NEXT` is set.
    pub next: u16,
}

impl Desc {
    /// True for a lone buffer the driver wrote, the common transmit chain:
    /// no next, not indirect, not device-writable.
    #[inline]
    pub fn lone_readable(&self) -> bool {
        self.flags & (F_NEXT | F_INDIRECT | F_WRITE) == 0
    }

    /// True for a lone buffer the device writes, the common receive chain.
    #[inline]
    pub fn lone_writable(&self) -> bool {
        self.flags & (F_NEXT | F_INDIRECT | F_WRITE) == F_WRITE
    }

    /// True for a buffer the device writes.
    #[inline]
    pub fn write(&self) -> bool {
        self.flags & F_WRITE != 0
    }
}

#[inline]
fn read_desc(p: *const u8) -> Desc {
    if p as usize % 8 == 0 {
        // SAFETY: callers pass a pointer to 16 bytes inside a checked
        // mapping, here 8-aligned: two volatile (the driver may write
        // concurrently) aligned loads, not sixteen byte loads.
        let (a, b) = unsafe {
            (
                std::ptr::read_volatile(p as *const u64),
                std::ptr::read_volatile(p.add(8) as *const u64),
            )
        };
        let b = u64::from_le(b);
        return Desc {
            addr: u64::from_le(a),
            len: b as u32,
            flags: (b >> 32) as u16,
            next: (b >> 48) as u16,
        };
    }
    // SAFETY: as above, byte-aligned (an indirect table may lie anywhere).
    let b = unsafe { std::ptr::read_volatile(p as *const [u8; 16]) };
    Desc {
        addr: u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        flags: u16::from_le_bytes([b[12], b[13]]),
        next: u16::from_le_bytes([b[14], b[15]]),
    }
}

/// Why a chain cannot be used: the driver broke the ring.
pub type Broken = &'static str;

/// A split ring's descriptor table, avail ring and used ring in host memory.
pub struct SplitRing {
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    size: u16,
}

// SAFETY: as for `MemTable`: the pointers target mappings kept alive by the
// owning `Vq`, which one worker uses at a time.
unsafe impl Send for SplitRing {}

impl SplitRing {
    /// Resolves the rings of a `size`-entry queue at the given guest
    /// addresses; `None` unless each lies inside one region, aligned as the
    /// atomic accesses need.
    pub fn new(mem: &MemTable, desc: u64, avail: u64, used: u64, size: u16) -> Option<SplitRing> {
        let n = u64::from(size);
        let desc = mem.translate(desc, 16 * n)?;
        // avail: flags, idx, ring[size], used_event. used: flags, idx,
        // ring[size] of 8 bytes, avail_event.
        let avail = mem.translate(avail, 6 + 2 * n)?;
        let used = mem.translate(used, 6 + 8 * n)?;
        // Split rings have a power-of-two size (virtio 1.2, 2.7), so a
        // slot is a mask away from its counter.
        if !size.is_power_of_two() || avail as usize % 2 != 0 || used as usize % 4 != 0 {
            return None;
        }
        Some(SplitRing {
            desc,
            avail,
            used,
            size,
        })
    }

    /// Entries.
    #[inline]
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The little-endian `u16` at byte `off` of ring part `base`.
    #[inline]
    fn field(&self, base: *mut u8, off: usize) -> &AtomicU16 {
        // SAFETY: callers pass an even `off` inside the part's extent checked
        // in `new`; the part is 2-aligned (checked in `new`) and mapped for
        // as long as `self` lives (the owning `Vq` holds the memory).
        unsafe { &*(base.add(off) as *const AtomicU16) }
    }

    /// The driver's avail index (acquire: the entries and descriptors it
    /// published are visible after this load).
    #[inline]
    pub fn avail_idx(&self) -> u16 {
        u16::from_le(self.field(self.avail, 2).load(Ordering::Acquire))
    }

    /// The driver's avail flags.
    #[inline]
    pub fn avail_flags(&self) -> u16 {
        u16::from_le(self.field(self.avail, 0).load(Ordering::Relaxed))
    }

    /// The driver's `used_event` (EVENT_IDX), after the avail entries.
    #[inline]
    pub fn used_event(&self) -> u16 {
        let at = 4 + 2 * usize::from(self.size);
        u16::from_le(self.field(self.avail, at).load(Ordering::Relaxed))
    }

    /// The head index in avail slot `counter % size` (not yet checked).
    #[inline]
    pub fn avail_entry(&self, counter: u16) -> u16 {
        let slot = usize::from(counter & (self.size - 1));
        u16::from_le(self.field(self.avail, 4 + 2 * slot).load(Ordering::Relaxed))
    }

    /// Writes used element `counter % size` (published later).
    #[inline]
    pub fn write_used(&self, counter: u16, id: u16, len: u32) {
        let slot = usize::from(counter & (self.size - 1));
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&u32::from(id).to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        // SAFETY: slot < size, so 4 + 8 * slot + 8 <= 6 + 8 * size: inside
        // the used ring checked in `new`.
        unsafe { std::ptr::write_volatile(self.used.add(4 + 8 * slot) as *mut [u8; 8], e) }
    }

    /// Publishes the used index (release: elements and buffer contents
    /// written before are visible to the driver first).
    #[inline]
    pub fn publish_used(&self, idx: u16) {
        self.field(self.used, 2)
            .store(idx.to_le(), Ordering::Release);
    }

    /// Descriptor `idx` of the table, if `idx` is inside it.
    #[inline]
    pub fn desc(&self, idx: u16) -> Option<Desc> {
        // SAFETY: idx < size: the descriptor lies inside the table.
        (idx < self.size).then(|| read_desc(unsafe { self.desc.add(16 * usize::from(idx)) }))
    }

    /// Walks the chain that starts at `head`, calling `f` for each buffer.
    /// An indirect descriptor ends the chain with its table.
    #[inline]
    pub fn walk<E: From<Broken>>(
        &self,
        mem: &MemTable,
        head: u16,
        mut f: impl FnMut(Desc) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut idx = head;
        for _ in 0..self.size {
            if idx >= self.size {
                return Err(E::from("a next index past the table"));
            }
            // SAFETY: idx < size: the descriptor lies inside the table.
            let d = read_desc(unsafe { self.desc.add(16 * usize::from(idx)) });
            if d.flags & F_INDIRECT != 0 {
                return Self::walk_indirect(mem, d, f);
            }
            f(d)?;
            if d.flags & F_NEXT == 0 {
                return Ok(());
            }
            idx = d.next;
        }
        Err(E::from("a chain longer than its table (a loop)"))
    }

    fn walk_indirect<E: From<Broken>>(
        mem: &MemTable,
        d: Desc,
        mut f: impl FnMut(Desc) -> Result<(), E>,
    ) -> Result<(), E> {
        if d.flags & F_NEXT != 0 || d.len == 0 || d.len % 16 != 0 {
            return Err(E::from("a malformed indirect descriptor"));
        }
        let n = d.len / 16;
        let table = mem
            .translate(d.addr, u64::from(d.len))
            .ok_or(E::from("an indirect table outside guest memory"))?;
        let mut j = 0u32;
        for _ in 0..n {
            if j >= n {
                return Err(E::from("a next index past the indirect table"));
            }
            // SAFETY: j < n: the entry lies inside the translated table.
            let e = read_desc(unsafe { table.add(16 * j as usize) });
            if e.flags & F_INDIRECT != 0 {
                return Err(E::from("a nested indirect table"));
            }
            f(e)?;
            if e.flags & F_NEXT == 0 {
                return Ok(());
            }
            j = u32::from(e.next);
        }
        Err(E::from("an indirect chain longer than its table (a loop)"))
    }
}
