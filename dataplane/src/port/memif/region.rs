//! Shared memory regions: mapped from a slave's fd (master role) or
//! created and sealed by us (slave role).
//!
//! A slave's region that is sealed against shrinking (`F_SEAL_SHRINK`, as
//! VPP, libmemif and DPDK's copy mode create them) can never fault. One that
//! is not (DPDK's zero-copy mode passes its hugetlbfs memory, which cannot
//! be sealed) is watched by the connection's [`Tripwire`]: if the slave
//! truncates it, the switch's next access reads zeros instead of faulting,
//! and the port is reset.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

use crate::port::sigbus::{self, Tripwire};

/// Largest region we map (the peer chooses the size).
pub const MAX_REGION_SIZE: u64 = 1 << 40;
/// Most regions per connection.
pub const MAX_REGIONS: usize = 256;

/// Why a region was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Size zero or beyond [`MAX_REGION_SIZE`].
    #[error("region size {0} out of range")]
    BadSize(u64),
    /// The fd is smaller than the size announced.
    #[error("region fd holds {actual} bytes, {announced} announced")]
    TooSmall {
        /// Announced size.
        announced: u64,
        /// Real size.
        actual: u64,
    },
    /// The fd is not a file whose pages can be shared (a memfd, a tmpfs or
    /// hugetlbfs file) but, say, an eventfd or a socket.
    #[error("region fd is not a file of memory (memfd, tmpfs or hugetlbfs)")]
    NotAFile,
    /// Every range the fault handler can watch is taken.
    #[error(transparent)]
    Watch(#[from] sigbus::Full),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One mapped region.
pub struct Region {
    map: MmapRaw,
    size: u64,
    fd: OwnedFd,
}

impl Region {
    /// Maps a region received from a peer. If the fd is sealed against
    /// shrinking, it must hold `size` bytes; otherwise the mapping is watched
    /// by `wire`: an access past the file's end (the peer truncated it, or
    /// never backed that part) trips the wire instead of making a worker
    /// fault (SIGBUS). `wire` must be dropped before the region is (it must
    /// not outlive the mapping).
    pub fn from_peer(fd: OwnedFd, size: u64, wire: &mut Tripwire) -> Result<Region, RegionError> {
        if size == 0 || size > MAX_REGION_SIZE {
            return Err(RegionError::BadSize(size));
        }
        let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(std::io::Error::from)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(RegionError::NotAFile);
        }
        // Not a memfd (hugetlbfs, tmpfs files): no seals, like an unsealed one.
        let sealed = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).is_ok_and(|seals| {
            SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK)
        });
        // A sealed file must hold the whole region: nothing watches it. A
        // watched one need not (DPDK's zero-copy regions are whole memseg
        // lists, of which only the pages in use are backed): a buffer past
        // the file's end trips the wire like a truncation.
        if sealed {
            let actual = st.st_size as u64;
            if actual < size {
                return Err(RegionError::TooSmall {
                    announced: size,
                    actual,
                });
            }
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(fd.as_raw_fd())?;
        if !sealed {
            // SAFETY: `map` is a fresh mapping of the peer's file, made with
            // mmap; the switch reads and writes region memory only through
            // raw pointers, as untrusted bytes; the caller drops `wire`
            // before the region, so the range stays mapped while watched.
            unsafe { wire.watch(map.as_mut_ptr(), size as usize) }?;
        }
        Ok(Region { map, size, fd })
    }

    /// Maps again a region a switch created with [`Region::create`], handed
    /// over by the process that made it (a takeover): sealed, and holding
    /// `size` bytes.
    pub fn adopt(fd: OwnedFd, size: u64) -> Result<Region, RegionError> {
        if size == 0 || size > MAX_REGION_SIZE {
            return Err(RegionError::BadSize(size));
        }
        let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(std::io::Error::from)?;
        let sealed = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).is_ok_and(|seals| {
            SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK)
        });
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || !sealed {
            return Err(RegionError::NotAFile);
        }
        if (st.st_size as u64) < size {
            return Err(RegionError::TooSmall {
                announced: size,
                actual: st.st_size as u64,
            });
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(fd.as_raw_fd())?;
        Ok(Region { map, size, fd })
    }

    /// Creates a zeroed, sealed region of `size` bytes.
    pub fn create(name: &str, size: u64) -> Result<Region, RegionError> {
        Region::create_sealed(name, size, true)
    }

    /// Creates a zeroed region of `size` bytes whose file can shrink, as a
    /// slave whose memory cannot be sealed passes it (DPDK's zero-copy
    /// hugetlbfs memory): for tests and fuzzing of the master's side.
    pub fn create_unsealed(name: &str, size: u64) -> Result<Region, RegionError> {
        Region::create_sealed(name, size, false)
    }

    fn create_sealed(name: &str, size: u64, sealed: bool) -> Result<Region, RegionError> {
        if size == 0 || size > MAX_REGION_SIZE {
            return Err(RegionError::BadSize(size));
        }
        let cname = std::ffi::CString::new(name.replace('\0', "")).unwrap_or_default();
        let fd = memfd_create(
            &cname,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(std::io::Error::from)?;
        nix::unistd::ftruncate(&fd, size as i64).map_err(std::io::Error::from)?;
        if sealed {
            fcntl(
                fd.as_raw_fd(),
                FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL),
            )
            .map_err(std::io::Error::from)?;
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(fd.as_raw_fd())?;
        Ok(Region { map, size, fd })
    }

    /// First byte.
    #[inline]
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Size in bytes.
    #[inline]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The backing fd (to pass to a peer).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The regions of one connection, indexed by region number, and the wire
/// that watches those of them that could shrink.
#[derive(Default)]
pub struct Regions {
    /// Declared first: dropped (unwatched) before the regions are unmapped.
    wire: Tripwire,
    list: Vec<Region>,
}

impl Regions {
    /// From a list of regions nobody watches (sealed, or our own).
    pub fn new(list: Vec<Region>) -> Regions {
        Regions::watched(list, Tripwire::new())
    }

    /// From a list of regions mapped by [`Region::from_peer`] with `wire`.
    pub fn watched(list: Vec<Region>, wire: Tripwire) -> Regions {
        Regions { wire, list }
    }

    /// How many of the regions could shrink (not sealed), and are watched.
    pub fn watched_count(&self) -> usize {
        self.wire.watching()
    }

    /// True once the peer truncated a watched region (which now reads as
    /// zeros): the connection must be dropped.
    #[inline]
    pub fn truncated(&self) -> bool {
        self.wire.tripped()
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Region `i`.
    pub fn get(&self, i: usize) -> Option<&Region> {
        self.list.get(i)
    }

    /// Resolves `(region, offset, len)` read from a descriptor to a pointer,
    /// checking the range lies wholly inside the region (in u64, so the sum
    /// cannot wrap).
    #[inline]
    pub fn resolve(&self, region: u16, offset: u32, len: u32) -> Option<*mut u8> {
        let r = self.list.get(region as usize)?;
        if u64::from(offset) + u64::from(len) > r.size {
            return None;
        }
        // SAFETY: offset + len <= size, so the pointer stays inside the mapping.
        Some(unsafe { r.base().add(offset as usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_regions_are_sealed_and_mappable_by_a_peer() {
        let r = Region::create("t", 8192).unwrap();
        // SAFETY: writing inside an 8192-byte mapping we own.
        unsafe { *r.base().add(100) = 42 };
        let dup = r.fd().try_clone_to_owned().unwrap();
        let mut wire = Tripwire::new();
        let peer = Region::from_peer(dup, 8192, &mut wire).unwrap();
        // SAFETY: reading inside the peer's 8192-byte mapping of the same memfd.
        assert_eq!(unsafe { *peer.base().add(100) }, 42);
        let dup = r.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Region::from_peer(dup, 8193, &mut wire),
            Err(RegionError::TooSmall { .. })
        ));
        let dup = r.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Region::from_peer(dup, 0, &mut wire),
            Err(RegionError::BadSize(0))
        ));
    }

    #[test]
    fn unsealed_fds_are_watched_and_a_truncation_trips_the_wire() {
        let fd = memfd_create(c"x", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, 8192).unwrap();
        let file = fd.try_clone().unwrap();
        let mut wire = Tripwire::new();
        let r = Region::from_peer(fd, 8192, &mut wire).unwrap();
        let regs = Regions::watched(vec![r], wire);
        let p = regs.resolve(0, 4096, 1).unwrap();
        // SAFETY: inside the 8192-byte mapping `regs` holds.
        unsafe { std::ptr::write_volatile(p, 7) };
        assert!(!regs.truncated());
        nix::unistd::ftruncate(&file, 0).unwrap();
        // SAFETY: inside the mapping; the file behind it is gone, so this
        // faults and the handler puts zero pages there.
        assert_eq!(unsafe { std::ptr::read_volatile(p) }, 0);
        assert!(regs.truncated());
    }

    #[test]
    fn resolve_checks_bounds_without_overflow() {
        let r = Region::create("t", 4096).unwrap();
        let regs = Regions::new(vec![r]);
        assert!(regs.resolve(0, 0, 4096).is_some());
        assert!(regs.resolve(0, 4095, 1).is_some());
        assert!(regs.resolve(0, 4095, 2).is_none());
        assert!(regs.resolve(0, u32::MAX, u32::MAX).is_none());
        assert!(regs.resolve(0, 1, u32::MAX).is_none());
        assert!(regs.resolve(1, 0, 1).is_none());
    }
}
