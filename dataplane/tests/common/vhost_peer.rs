//! A vhost-user frontend for the tests, on the `vhost` crate's `Frontend`
//! (the protocol side, written by rust-vmm, not by us). It owns the guest
//! memory, a memfd, lays out one virtio-net queue pair in it, and can write
//! anything into the rings: a driver that misbehaves on purpose.
#![allow(dead_code)]

use std::fs::File;
use std::sync::atomic::{fence, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

/// Entries per virtqueue.
pub const QSIZE: u16 = 256;
/// Guest memory size.
pub const MEM: u64 = 4 << 20;
/// Guest address of the first packet buffer.
pub const BUFS: u64 = 0x10000;
/// Bytes per packet buffer.
pub const BUF: u64 = 2048;
/// virtio-net header length (VERSION_1).
pub const HDR: u32 = 12;
/// Descriptor flags.
pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const PROTOCOL_FEATURES: u64 = 1 << 30;

/// Where queue `q`'s rings lie in guest memory.
pub fn desc_table(q: u16) -> u64 {
    u64::from(q) * 0x4000
}
pub fn avail_ring(q: u16) -> u64 {
    desc_table(q) + 0x1000
}
pub fn used_ring(q: u16) -> u64 {
    desc_table(q) + 0x2000
}

/// The guest memory: a memfd mapped here; guest address 0 is its first byte.
pub struct Guest {
    pub file: File,
    map: MmapRaw,
}

// SAFETY: the mapping is plain shared bytes written and read through raw
// volatile accesses; nothing in it is a Rust object.
unsafe impl Sync for Guest {}
// SAFETY: as above.
unsafe impl Send for Guest {}

impl Guest {
    pub fn new() -> Guest {
        let fd = nix::sys::memfd::memfd_create(
            c"vhost-guest",
            nix::sys::memfd::MemFdCreateFlag::empty(),
        )
        .expect("memfd");
        let file = File::from(fd);
        file.set_len(MEM).unwrap();
        let map = MmapOptions::new().len(MEM as usize).map_raw(&file).unwrap();
        Guest { file, map }
    }

    /// Our address of guest address 0 (the frontend's "user address").
    pub fn base(&self) -> u64 {
        self.map.as_mut_ptr() as u64
    }

    fn ptr(&self, gpa: u64, len: u64) -> *mut u8 {
        assert!(gpa + len <= MEM);
        // SAFETY: checked to lie inside the MEM-byte mapping.
        unsafe { self.map.as_mut_ptr().add(gpa as usize) }
    }

    pub fn w16(&self, gpa: u64, v: u16) {
        // SAFETY: an in-bounds (checked), 2-aligned shared location.
        unsafe { std::ptr::write_volatile(self.ptr(gpa, 2) as *mut u16, v.to_le()) }
    }
    pub fn w32(&self, gpa: u64, v: u32) {
        // SAFETY: as in `w16`.
        unsafe { std::ptr::write_volatile(self.ptr(gpa, 4) as *mut u32, v.to_le()) }
    }
    pub fn w64(&self, gpa: u64, v: u64) {
        // SAFETY: as in `w16`.
        unsafe { std::ptr::write_volatile(self.ptr(gpa, 8) as *mut u64, v.to_le()) }
    }
    pub fn r16(&self, gpa: u64) -> u16 {
        // SAFETY: as in `w16`.
        u16::from_le(unsafe { std::ptr::read_volatile(self.ptr(gpa, 2) as *const u16) })
    }
    pub fn write(&self, gpa: u64, bytes: &[u8]) {
        let p = self.ptr(gpa, bytes.len() as u64);
        // SAFETY: checked in bounds; the memory is ours and shared.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) }
    }

    /// Writes descriptor `i` of queue `q`.
    pub fn desc(&self, q: u16, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = desc_table(q) + 16 * u64::from(i);
        self.w64(d, addr);
        self.w32(d + 8, len);
        self.w16(d + 12, flags);
        self.w16(d + 14, next);
    }

    /// The driver's avail index of queue `q`.
    pub fn avail_idx(&self, q: u16) -> u16 {
        self.r16(avail_ring(q) + 2)
    }

    /// Sets queue `q`'s avail index (published with release order).
    pub fn set_avail_idx(&self, q: u16, idx: u16) {
        fence(Ordering::Release);
        self.w16(avail_ring(q) + 2, idx);
    }

    /// Offers chain `head` on queue `q`.
    pub fn publish(&self, q: u16, head: u16) {
        let idx = self.avail_idx(q);
        self.w16(avail_ring(q) + 4 + 2 * u64::from(idx % QSIZE), head);
        self.set_avail_idx(q, idx.wrapping_add(1));
    }

    /// The device's used index of queue `q`.
    pub fn used_idx(&self, q: u16) -> u16 {
        let v = self.r16(used_ring(q) + 2);
        fence(Ordering::Acquire);
        v
    }

    /// Guest address of packet buffer `i`.
    pub fn buffer(i: u16) -> u64 {
        BUFS + u64::from(i) * BUF
    }
}

/// One connected frontend with one queue pair: queue 0 is the driver's
/// receive queue (the switch writes), queue 1 its transmit queue.
pub struct VhostFrontend {
    pub fe: Frontend,
    pub guest: std::sync::Arc<Guest>,
    pub kicks: [EventFd; 2],
    pub calls: [EventFd; 2],
}

impl VhostFrontend {
    /// Connects and sets the device up as QEMU or DPDK would: features,
    /// memory table, both rings, enabled. `Err`: the switch refused a step.
    pub fn connect(sock: &str) -> Result<VhostFrontend, String> {
        let fe = Frontend::connect(sock, 2).map_err(|e| format!("connect: {e}"))?;
        let mut f = VhostFrontend {
            fe,
            guest: std::sync::Arc::new(Guest::new()),
            kicks: [EventFd::new(0).unwrap(), EventFd::new(0).unwrap()],
            calls: [EventFd::new(0).unwrap(), EventFd::new(0).unwrap()],
        };
        f.setup().map_err(|e| format!("setup: {e}"))?;
        Ok(f)
    }

    fn setup(&mut self) -> vhost::Result<()> {
        self.fe.set_owner()?;
        let offered = self.fe.get_features()?;
        self.fe
            .set_features(offered & (VIRTIO_F_VERSION_1 | PROTOCOL_FEATURES))?;
        self.fe.get_protocol_features()?;
        self.fe
            .set_protocol_features(VhostUserProtocolFeatures::empty())?;
        self.set_mem_table(&[(0, MEM, 0)])?;
        for q in 0..2u16 {
            self.fe.set_vring_num(q.into(), QSIZE)?;
            self.set_vring_addr(q, self.guest.base())?;
            self.fe.set_vring_base(q.into(), 0)?;
            self.fe.set_vring_call(q.into(), &self.calls[q as usize])?;
            self.fe.set_vring_kick(q.into(), &self.kicks[q as usize])?;
            self.fe.set_vring_enable(q.into(), true)?;
        }
        Ok(())
    }

    /// Sends SET_VRING_ADDR for queue `q` with the rings at `user_base`
    /// plus their guest addresses.
    pub fn set_vring_addr(&self, q: u16, user_base: u64) -> vhost::Result<()> {
        self.fe.set_vring_addr(
            q.into(),
            &VringConfigData {
                queue_max_size: QSIZE,
                queue_size: QSIZE,
                flags: 0,
                desc_table_addr: user_base + desc_table(q),
                used_ring_addr: user_base + used_ring(q),
                avail_ring_addr: user_base + avail_ring(q),
                log_addr: None,
            },
        )
    }

    /// Sends SET_MEM_TABLE with regions `(guest address, size, file offset)`
    /// of the guest memfd, each at user address `base + file offset`.
    pub fn set_mem_table(&self, regions: &[(u64, u64, u64)]) -> vhost::Result<()> {
        use std::os::fd::AsRawFd;
        let list: Vec<VhostUserMemoryRegionInfo> = regions
            .iter()
            .map(|&(gpa, size, offset)| VhostUserMemoryRegionInfo {
                guest_phys_addr: gpa,
                memory_size: size,
                userspace_addr: self.guest.base() + offset,
                mmap_offset: offset,
                mmap_handle: self.guest.file.as_raw_fd(),
            })
            .collect();
        self.fe.set_mem_table(&list).map(|_| ())
    }

    /// Kicks queue `q`.
    pub fn kick(&self, q: u16) {
        self.kicks[q as usize].write(1).unwrap();
    }

    /// Puts a frame (virtio-net header + `frame`) in buffer `slot` and
    /// offers it on the transmit queue as descriptor `slot`.
    pub fn send(&self, slot: u16, frame: &[u8]) {
        send_frame(&self.guest, slot, frame);
        self.kick(1);
    }
}

/// [`VhostFrontend::send`] without the kick, for a sender thread.
pub fn send_frame(g: &Guest, slot: u16, frame: &[u8]) {
    let at = Guest::buffer(slot);
    g.write(at, &[0u8; HDR as usize]);
    g.write(at + u64::from(HDR), frame);
    g.desc(1, slot, at, HDR + frame.len() as u32, 0, 0);
    g.publish(1, slot);
}
