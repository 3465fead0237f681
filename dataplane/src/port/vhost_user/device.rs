//! The virtio-net device behind one vhost-user connection.
//!
//! [`NetDevice`] answers the frontend's vhost-user requests (the `vhost`
//! crate parses them and calls [`VhostUserBackendReqHandlerMut`]) and keeps
//! each virtqueue's configuration in a `vhost-user-backend`
//! [`VringRwLock`]. It does not run the queues itself: when a queue pair is
//! complete it builds worker-owned [`VirtioRx`] / [`VirtioTx`] queues from
//! that configuration and hands them to the data plane.
//!
//! Any request that changes a ring or the memory table first *parks* the
//! device: the queues are taken back from the workers, the call waits until
//! no worker is inside a burst on them, and their ring positions are copied
//! back into the vrings. The request is then applied to a quiet device, and
//! [`NetDevice::activate`] hands fresh queues out again once it is complete.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use tracing::{debug, info, warn};
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserInflight, VhostUserLog, VhostUserMemoryRegion,
    VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVirtioFeatures, VhostUserVringAddrFlags,
    VhostUserVringState,
};
use vhost::vhost_user::VhostUserBackendReqHandlerMut;
use vhost::vhost_user::{Error as VuError, GpuBackend, Result as VuResult};
use vhost::VhostUserMemoryRegionBase;
use vhost_user_backend::{VringRwLock, VringT};
use virtio_bindings::virtio_config::{VIRTIO_F_IN_ORDER, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestRegionMmap,
};

use super::queue::{RingProgress, VirtioRx, VirtioTx, Vq};
use crate::port::sigbus::Tripwire;
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::port::QueueLink;
use crate::queue::{OffloadCaps, PortQueues, RxQueue, TxQueue};

/// Largest virtqueue the device accepts (the virtio maximum for split rings).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Memory regions a frontend may announce (QEMU and DPDK send at most 8).
const MAX_REGIONS: usize = 8;

/// Virtio features the device offers.
///
/// `VIRTIO_F_IN_ORDER`: the device uses every queue's chains in the order
/// they were made available (receive chains are returned in burst order,
/// transmit chains are taken and used one frame after the other), which
/// lets a driver free and refill its buffers without reading used ids, as
/// with DPDK's vhost library.
///
/// Checksum and TCP segmentation offloads both ways, as DPDK's vhost
/// library and QEMU's vhost-net offer them: the driver may send frames with
/// their checksum left to do (`CSUM`) and 64 KB TCP super-frames
/// (`HOST_TSO4/6`), and takes such frames (`GUEST_CSUM`, `GUEST_TSO4/6`);
/// what it does not take, the switch finishes in software.
pub fn device_features(max_pairs: u16) -> u64 {
    let mut f = 1u64 << VIRTIO_F_VERSION_1
        | 1 << VIRTIO_F_IN_ORDER
        | 1 << VIRTIO_NET_F_CSUM
        | 1 << VIRTIO_NET_F_GUEST_CSUM
        | 1 << VIRTIO_NET_F_HOST_TSO4
        | 1 << VIRTIO_NET_F_HOST_TSO6
        | 1 << VIRTIO_NET_F_HOST_ECN
        | 1 << VIRTIO_NET_F_GUEST_TSO4
        | 1 << VIRTIO_NET_F_GUEST_TSO6
        | 1 << VIRTIO_NET_F_GUEST_ECN
        | 1 << VIRTIO_NET_F_MRG_RXBUF
        | 1 << VIRTIO_RING_F_EVENT_IDX
        | 1 << VIRTIO_RING_F_INDIRECT_DESC
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if max_pairs > 1 {
        f |= 1 << VIRTIO_NET_F_MQ;
    }
    f
}

/// Protocol features the device offers (the `vhost` crate adds REPLY_ACK).
///
/// Not `CONFIG`: a virtio-net frontend keeps the config space itself (QEMU
/// takes the MAC from its `-device` line, DPDK's `virtio_user` from its
/// `mac=` argument), and QEMU's vhost-user-net refuses the feature with an
/// error line at every connection. The device offers no config-space
/// feature (`VIRTIO_NET_F_MAC`, `_STATUS`, `_MTU`) a driver would read.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
}

/// A frontend virtual address range and where it lies in guest memory.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    user_addr: u64,
    size: u64,
    gpa: u64,
}

/// A ring handed to the workers, and where its final position will appear.
struct LiveRing {
    index: usize,
    progress: Arc<RingProgress>,
}

/// What [`NetDevice::activate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activation {
    /// Queues were already with the workers, or the device is not ready.
    Unchanged,
    /// Queue pairs handed to the workers.
    Up {
        /// The indexes of the queue pairs (pair `p` is vrings `2p`, `2p+1`).
        pairs: Vec<usize>,
    },
}

/// One vhost-user virtio-net device (one frontend connection).
pub struct NetDevice {
    name: String,
    link: QueueLink,
    max_pairs: u16,
    acked_features: Option<u64>,
    acked_protocol: u64,
    /// Watches the mappings in `mem` for truncation. Declared before `mem`
    /// and `vrings`, so it is dropped before the mappings may be unmapped
    /// (the rule of [`Tripwire`]).
    wire: Arc<Tripwire>,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    mem_set: bool,
    mappings: Vec<Mapping>,
    vrings: Vec<VringRwLock>,
    live: Vec<LiveRing>,
    /// Set when the queues were taken back from the workers.
    parked_since_activate: bool,
}

fn invalid(why: &'static str) -> VuError {
    VuError::InvalidOperation(why)
}

fn new_vrings(
    mem: &GuestMemoryAtomic<GuestMemoryMmap>,
    n: usize,
) -> Result<Vec<VringRwLock>, VuError> {
    (0..n)
        .map(|_| VringRwLock::new(mem.clone(), MAX_QUEUE_SIZE).map_err(|_| VuError::InvalidParam))
        .collect()
}

impl NetDevice {
    /// A device offering up to `max_pairs` queue pairs, whose queues reach
    /// the workers through `link`.
    pub fn new(name: &str, link: QueueLink, max_pairs: u16) -> Result<Self, VuError> {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let vrings = new_vrings(&mem, 2 * usize::from(max_pairs))?;
        Ok(NetDevice {
            name: name.to_string(),
            link,
            max_pairs,
            acked_features: None,
            acked_protocol: 0,
            mem,
            mem_set: false,
            mappings: Vec::new(),
            vrings,
            wire: Arc::new(Tripwire::new()),
            live: Vec::new(),
            parked_since_activate: false,
        })
    }

    /// True if the frontend asked for REPLY_ACK.
    pub fn reply_ack(&self) -> bool {
        self.acked_protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    /// Negotiated virtio features, once the frontend set them.
    pub fn acked_features(&self) -> Option<u64> {
        self.acked_features
    }

    /// Takes the queues back from the workers and records where each ring
    /// stopped. Returns true if queues were live.
    pub fn park(&mut self) -> bool {
        if self.live.is_empty() {
            return false;
        }
        self.link.detach();
        for r in self.live.drain(..) {
            let (avail, used) = r.progress.load();
            let v = &self.vrings[r.index];
            v.set_queue_next_avail(avail);
            v.set_queue_next_used(used);
        }
        self.parked_since_activate = true;
        true
    }

    /// True if a ring stopped since the last [`NetDevice::activate`].
    pub fn take_parked(&mut self) -> bool {
        std::mem::take(&mut self.parked_since_activate)
    }

    fn vring(&self, index: u32) -> VuResult<&VringRwLock> {
        self.vrings.get(index as usize).ok_or(VuError::InvalidParam)
    }

    fn pair_ready(&self, pair: usize) -> bool {
        (2 * pair..2 * pair + 2).all(|i| {
            let v = self.vrings[i].get_ref();
            v.get_queue().ready() && v.is_enabled()
        })
    }

    /// Hands every complete queue pair to the workers if none are live.
    /// An error names a ring the frontend placed outside its memory.
    pub fn activate(&mut self) -> Result<Activation, String> {
        if !self.live.is_empty() || !self.mem_set || self.acked_features.is_none() {
            return Ok(Activation::Unchanged);
        }
        let pairs: Vec<usize> = (0..usize::from(self.max_pairs))
            .filter(|&p| self.pair_ready(p))
            .collect();
        if pairs.is_empty() {
            return Ok(Activation::Unchanged);
        }
        let mem = self.mem.memory().into_inner();
        let acked = self.acked_features.unwrap_or(0);
        let has = |bit: u32| acked & (1 << bit) != 0;
        let mrg = has(VIRTIO_NET_F_MRG_RXBUF);
        // What the driver takes from the switch, and whether it may leave
        // work in what it sends.
        let mut caps = OffloadCaps::NONE;
        if has(VIRTIO_NET_F_GUEST_CSUM) {
            caps = caps.with(OffloadCaps::CSUM);
            if has(VIRTIO_NET_F_GUEST_TSO4) {
                caps = caps.with(OffloadCaps::TSO4);
            }
            if has(VIRTIO_NET_F_GUEST_TSO6) {
                caps = caps.with(OffloadCaps::TSO6);
            }
        }
        let sends_work = has(VIRTIO_NET_F_CSUM);
        let mut q = PortQueues::default();
        let mut live = Vec::new();
        for &p in &pairs {
            self.resync(2 * p);
            self.resync(2 * p + 1);
            // virtio-net: queue 2p is the driver's receive queue (we write),
            // queue 2p+1 its transmit queue (we read).
            let tx = self.build_vq(2 * p, &mem)?;
            let rx = self.build_vq(2 * p + 1, &mem)?;
            live.push(LiveRing {
                index: 2 * p,
                progress: tx.progress(),
            });
            live.push(LiveRing {
                index: 2 * p + 1,
                progress: rx.progress(),
            });
            q.tx.push(Box::new(VirtioTx::new(tx, mrg, caps)) as Box<dyn TxQueue>);
            q.rx.push(Box::new(VirtioRx::new(rx, sends_work)) as Box<dyn RxQueue>);
        }
        self.live = live;
        self.link.attach(q);
        Ok(Activation::Up { pairs })
    }

    /// Aligns a ring's position with the used index in guest memory, as
    /// DPDK's vhost library does when it maps a ring: if the position the
    /// frontend gave (`SET_VRING_BASE`) is not where the used ring stands,
    /// both the avail and the used position restart from the used index.
    ///
    /// Two frontends need it. QEMU keeps a running guest's rings when the
    /// switch restarts and, having no `GET_VRING_BASE` answer from the dead
    /// switch, sends the guest's used index as the base: the used position
    /// must start there too, or the first used element lands on a slot the
    /// guest already consumed and its driver declares the queue broken.
    /// DPDK's `virtio_user` sends `SET_VRING_BASE 0` after a reconnect on
    /// rings that may already have carried traffic. Chains made available
    /// but not yet used are taken again: a transmitted frame may be sent
    /// twice, a receive buffer is refilled (as with DPDK).
    fn resync(&self, index: usize) {
        let v = &self.vrings[index];
        let next = v.get_ref().get_queue().next_used();
        if let Ok(used) = v.queue_used_idx() {
            if used != next {
                info!(
                    port = %self.name,
                    vring = index,
                    base = next,
                    used,
                    "ring continues from the used index in guest memory"
                );
                v.set_queue_next_avail(used);
                v.set_queue_next_used(used);
            }
        }
    }

    fn build_vq(&self, index: usize, mem: &Arc<GuestMemoryMmap>) -> Result<Vq, String> {
        let v = self.vrings[index].get_ref();
        let queue =
            Queue::try_from(v.get_queue().state()).map_err(|e| format!("vring {index}: {e}"))?;
        if !queue.is_valid(&**mem) {
            return Err(format!(
                "vring {index}: rings (desc {:#x}, avail {:#x}, used {:#x}, size {}) lie outside guest memory",
                queue.desc_table(),
                queue.avail_ring(),
                queue.used_ring(),
                queue.size()
            ));
        }
        let dup = |fd: Option<std::os::fd::RawFd>| -> Result<Option<OwnedFd>, String> {
            fd.map(|fd| {
                // SAFETY: `fd` belongs to the vring's event object, which
                // `v` keeps alive for the duration of this call.
                unsafe { BorrowedFd::borrow_raw(fd) }
                    .try_clone_to_owned()
                    .map_err(|e| format!("vring {index}: cannot duplicate eventfd: {e}"))
            })
            .transpose()
        };
        let kick = dup(v.get_kick().as_ref().map(|k| k.as_raw_fd()))?;
        let call = dup(v.get_call().as_ref().map(|c| c.as_raw_fd()))?;
        Vq::new(queue, mem.clone(), kick, call)
            .map(|vq| vq.watched_by(self.wire.clone()))
            .map_err(|e| format!("vring {index}: {e}"))
    }

    /// Forgets all ring and feature state (frontend reset or restart).
    fn reset(&mut self) -> VuResult<()> {
        self.park();
        self.acked_features = None;
        self.vrings = new_vrings(&self.mem, self.vrings.len())?;
        Ok(())
    }

    fn vmm_to_gpa(&self, va: u64, len: u64) -> VuResult<u64> {
        self.mappings
            .iter()
            .find(|m| va >= m.user_addr && va - m.user_addr < m.size)
            .filter(|m| len <= m.size - (va - m.user_addr))
            .map(|m| va - m.user_addr + m.gpa)
            .ok_or(VuError::InvalidParam)
    }
}

/// A device as saved for a takeover: what the frontend's messages set,
/// and where each ring stands.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedDevice {
    /// Queue pairs offered.
    pub(super) max_pairs: u16,
    /// `SET_FEATURES`, if it came.
    pub(super) acked_features: Option<u64>,
    /// `SET_PROTOCOL_FEATURES`.
    pub(super) acked_protocol: u64,
    /// `SET_MEM_TABLE`, if it came.
    pub(super) memory: Option<Vec<SavedRegion>>,
    /// Every vring, in order.
    pub(super) vrings: Vec<SavedVring>,
}

/// A region of the memory table: its file and where it is.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedRegion {
    pub(super) fd: FdRef,
    pub(super) guest_phys_addr: u64,
    pub(super) memory_size: u64,
    pub(super) user_addr: u64,
    pub(super) mmap_offset: u64,
}

/// A vring: as `SET_VRING_*` set it, where its queue stands, its eventfds.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedVring {
    pub(super) size: u16,
    pub(super) ready: bool,
    pub(super) enabled: bool,
    pub(super) event_idx: bool,
    pub(super) desc_table: u64,
    pub(super) avail_ring: u64,
    pub(super) used_ring: u64,
    pub(super) next_avail: u16,
    pub(super) next_used: u16,
    pub(super) kick: Option<FdRef>,
    pub(super) call: Option<FdRef>,
}

impl NetDevice {
    /// Writes the device down for a takeover, its memory and eventfds into
    /// `fds`. The queues are parked first ([`NetDevice::park`]: their last
    /// positions into the vrings); [`NetDevice::activate`] hands them out
    /// again if the takeover fails.
    pub fn save(&self, fds: &mut FdOut) -> Result<SavedDevice, String> {
        if !self.live.is_empty() {
            return Err("queues with the workers (the device was not parked)".into());
        }
        let memory = if self.mem_set {
            let mem = self.mem.memory();
            let mut regions = Vec::with_capacity(self.mappings.len());
            for m in &self.mappings {
                let file = mem
                    .find_region(GuestAddress(m.gpa))
                    .and_then(|r| r.file_offset())
                    .ok_or_else(|| format!("guest memory at {:#x} has no file", m.gpa))?;
                regions.push(SavedRegion {
                    fd: fds.add(file.file().as_fd()),
                    guest_phys_addr: m.gpa,
                    memory_size: m.size,
                    user_addr: m.user_addr,
                    mmap_offset: file.start(),
                });
            }
            Some(regions)
        } else {
            None
        };
        let vrings = self
            .vrings
            .iter()
            .map(|v| {
                let v = v.get_ref();
                let q = v.get_queue().state();
                // The raw fds belong to the vring's event objects, which
                // `v` keeps alive while they are added (the handover sends
                // them before anything can replace them).
                let mut add = |fd: std::os::fd::RawFd| {
                    // SAFETY: as said above, `fd` is open for this call.
                    fds.add(unsafe { BorrowedFd::borrow_raw(fd) })
                };
                let kick = v.get_kick().as_ref().map(|k| add(k.as_raw_fd()));
                let call = v.get_call().as_ref().map(|c| add(c.as_raw_fd()));
                SavedVring {
                    size: q.size,
                    ready: q.ready,
                    enabled: v.is_enabled(),
                    event_idx: q.event_idx_enabled,
                    desc_table: q.desc_table,
                    avail_ring: q.avail_ring,
                    used_ring: q.used_ring,
                    next_avail: q.next_avail,
                    next_used: q.next_used,
                    kick,
                    call,
                }
            })
            .collect();
        Ok(SavedDevice {
            max_pairs: self.max_pairs,
            acked_features: self.acked_features,
            acked_protocol: self.acked_protocol,
            memory,
            vrings,
        })
    }

    /// Sets the memory table and the rings as another process saved them
    /// (a takeover): the features come first, through the protocol handler
    /// (see `vhost_user::restore`). The device is then as the frontend
    /// left the old one; [`NetDevice::activate`] starts its queues.
    pub fn restore(&mut self, saved: &SavedDevice, fds: &mut FdIn) -> Result<(), TakeoverError> {
        let invalid = |what: String| TakeoverError::Invalid(what);
        if saved.vrings.len() != self.vrings.len() {
            return Err(invalid(format!(
                "{} vrings saved for a device of {}",
                saved.vrings.len(),
                self.vrings.len()
            )));
        }
        if let Some(regions) = &saved.memory {
            let mut ctx = Vec::with_capacity(regions.len());
            let mut files = Vec::with_capacity(regions.len());
            for r in regions {
                ctx.push(VhostUserMemoryRegion::new(
                    r.guest_phys_addr,
                    r.memory_size,
                    r.user_addr,
                    r.mmap_offset,
                ));
                files.push(File::from(fds.take(r.fd)?));
            }
            self.set_mem_table(&ctx, files, None)
                .map_err(|e| invalid(format!("memory table: {e}")))?;
        }
        for (i, (v, s)) in self.vrings.iter().zip(&saved.vrings).enumerate() {
            if !s.size.is_power_of_two() || s.size > MAX_QUEUE_SIZE {
                return Err(invalid(format!("vring {i} of {} entries", s.size)));
            }
            v.set_queue_size(s.size);
            v.set_queue_info(s.desc_table, s.avail_ring, s.used_ring)
                .map_err(|e| invalid(format!("vring {i}: {e}")))?;
            v.set_queue_next_avail(s.next_avail);
            v.set_queue_next_used(s.next_used);
            v.set_queue_event_idx(s.event_idx);
            v.set_kick(s.kick.map(|k| fds.take(k)).transpose()?.map(File::from));
            v.set_call(s.call.map(|c| fds.take(c)).transpose()?.map(File::from));
            v.set_queue_ready(s.ready);
            v.set_enabled(s.enabled);
        }
        Ok(())
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        self.park();
    }
}

impl VhostUserBackendReqHandlerMut for NetDevice {
    fn set_owner(&mut self) -> VuResult<()> {
        // DPDK's virtio_user sends SET_OWNER again on every start; accept it.
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        debug!(port = %self.name, "RESET_OWNER");
        self.reset()
    }

    fn reset_device(&mut self) -> VuResult<()> {
        debug!(port = %self.name, "RESET_DEVICE");
        self.reset()
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(device_features(self.max_pairs))
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        let offered = device_features(self.max_pairs);
        if features & !offered != 0 {
            warn!(port = %self.name, features = format!("{:#x}", features & !offered), "frontend acked features we did not offer");
            return Err(VuError::InvalidParam);
        }
        self.park();
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let protocol = features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        for v in &self.vrings {
            v.set_queue_event_idx(event_idx);
            if !protocol {
                // Without protocol features every ring is enabled at once.
                v.set_enabled(true);
            }
        }
        debug!(port = %self.name, features = format!("{features:#x}"), "features acked");
        self.acked_features = Some(features);
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        postcopy_listening: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if postcopy_listening.is_some() {
            return Err(invalid("postcopy is not supported"));
        }
        if ctx.len() > MAX_REGIONS || ctx.len() != files.len() {
            return Err(VuError::InvalidParam);
        }
        self.park();
        // The workers have let go of the old mappings: their wire goes
        // before `mem.replace` below may unmap them.
        self.wire = Arc::new(Tripwire::new());
        let mut regions = Vec::with_capacity(ctx.len());
        let mut mappings = Vec::with_capacity(ctx.len());
        for (r, file) in ctx.iter().zip(files) {
            // Copies: the message struct is packed.
            let (offset, size, user_addr, gpa) =
                (r.mmap_offset, r.memory_size, r.user_addr, r.guest_phys_addr);
            // A mapping past the end of the file would fault on access
            // (SIGBUS): check the file really holds the announced range.
            let end = offset.checked_add(size).ok_or(VuError::InvalidParam)?;
            let len = file.metadata().map_err(VuError::ReqHandlerError)?.len();
            if size == 0 || end > len || user_addr.checked_add(size).is_none() {
                warn!(port = %self.name, offset, size, file_len = len, "memory region does not fit its file");
                return Err(VuError::InvalidParam);
            }
            let map = r.mmap_region::<()>(file)?;
            let region =
                GuestRegionMmap::new(map, GuestAddress(gpa)).ok_or(VuError::InvalidParam)?;
            regions.push(Arc::new(region));
            mappings.push(Mapping {
                user_addr,
                size,
                gpa,
            });
        }
        let mem = GuestMemoryMmap::from_arc_regions(regions)
            .map_err(|e| VuError::ReqHandlerError(std::io::Error::other(e)))?;
        // The frontend may still shrink the files (its fds cannot be
        // required to be sealed): a SIGBUS there costs it its port, not the
        // switch its life. Watched before any thread touches them; declared
        // after `mem`, so an error below drops the wire before the mappings.
        let mut wire = Tripwire::new();
        for region in mem.iter() {
            // SAFETY: the region is a mapping of the frontend's file that
            // the switch only reads and writes through raw pointers as
            // untrusted bytes; the wire is dropped before it is unmapped
            // (here, by declaration order; once installed, `self.wire` is
            // declared before `self.mem` and replaced before it).
            unsafe { wire.watch(region.as_ptr(), region.size()) }
                .map_err(|e| VuError::ReqHandlerError(std::io::Error::other(e)))?;
        }
        self.mem
            .lock()
            .map_err(|_| VuError::BackendInternalError)?
            .replace(mem);
        self.wire = Arc::new(wire);
        debug!(port = %self.name, regions = mappings.len(), "memory table set");
        self.mappings = mappings;
        self.mem_set = true;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        debug!(port = %self.name, index, num, "SET_VRING_NUM");
        let ok = num.is_power_of_two() && num <= u32::from(MAX_QUEUE_SIZE);
        self.vring(index)?;
        if !ok {
            return Err(VuError::InvalidParam);
        }
        self.park();
        self.vring(index)?.set_queue_size(num as u16);
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        self.vring(index)?;
        self.park();
        let size = u64::from(self.vring(index)?.get_ref().get_queue().size());
        // Split ring sizes (virtio 1.2, 2.7): 16 bytes per descriptor,
        // avail 6 + 2n, used 6 + 8n.
        let desc = self.vmm_to_gpa(descriptor, 16 * size)?;
        let avail = self.vmm_to_gpa(available, 6 + 2 * size)?;
        let used_gpa = self.vmm_to_gpa(used, 6 + 8 * size)?;
        let v = self.vring(index)?;
        v.set_queue_info(desc, avail, used_gpa)
            .map_err(|_| VuError::InvalidParam)
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        debug!(port = %self.name, index, base, "SET_VRING_BASE");
        self.vring(index)?;
        self.park();
        // The spec: "the next index of the ring the back-end should read
        // from"; for a split ring DPDK's vhost library starts the used
        // position there as well, and so do we (see `resync`).
        let v = self.vring(index)?;
        v.set_queue_next_avail(base as u16);
        v.set_queue_next_used(base as u16);
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        debug!(port = %self.name, index, "GET_VRING_BASE");
        self.vring(index)?;
        // The ring stops here: no worker may touch it after we answer.
        self.park();
        let v = self.vring(index)?;
        v.set_queue_ready(false);
        let next = v.queue_next_avail();
        v.set_kick(None);
        v.set_call(None);
        Ok(VhostUserVringState::new(index, u32::from(next)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        debug!(port = %self.name, index, fd = fd.is_some(), "SET_VRING_KICK");
        self.vring(u32::from(index))?;
        self.park();
        let v = self.vring(u32::from(index))?;
        v.set_kick(fd);
        // The ring starts when its kick fd arrives (vhost-user spec, "Starting
        // and stopping rings"); without one the frontend wants us to poll.
        v.set_queue_ready(true);
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        debug!(port = %self.name, index, fd = fd.is_some(), "SET_VRING_CALL");
        self.vring(u32::from(index))?;
        self.park();
        self.vring(u32::from(index))?.set_call(fd);
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        self.vring(u32::from(index))?.set_err(fd);
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(protocol_features())
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        debug!(port = %self.name, features = format!("{features:#x}"), "SET_PROTOCOL_FEATURES");
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        // For virtio-net, QEMU and DPDK read this as queue pairs.
        Ok(u64::from(self.max_pairs))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        debug!(port = %self.name, index, enable, "SET_VRING_ENABLE");
        let v = self.vring(index)?;
        if v.get_ref().is_enabled() == enable {
            return Ok(());
        }
        self.park();
        self.vring(index)?.set_enabled(enable);
        Ok(())
    }

    fn get_config(
        &mut self,
        _offset: u32,
        _size: u32,
        _flags: VhostUserConfigFlags,
    ) -> VuResult<Vec<u8>> {
        Err(invalid(
            "no config space: VHOST_USER_PROTOCOL_F_CONFIG is not offered",
        ))
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> VuResult<()> {
        Err(invalid(
            "no config space: VHOST_USER_PROTOCOL_F_CONFIG is not offered",
        ))
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> VuResult<()> {
        Err(invalid("not a GPU device"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        Err(invalid("shared objects are not supported"))
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> VuResult<(VhostUserInflight, File)> {
        Err(invalid("inflight tracking is not supported"))
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> VuResult<()> {
        Err(invalid("inflight tracking is not supported"))
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(MAX_REGIONS as u64)
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        Err(invalid("memory slots are not supported"))
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        Err(invalid("memory slots are not supported"))
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VuResult<Option<File>> {
        Err(invalid("device state transfer is not supported"))
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        Err(invalid("device state transfer is not supported"))
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        Err(invalid("shared memory regions are not supported"))
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> VuResult<()> {
        Err(invalid("dirty logging is not supported"))
    }
}
