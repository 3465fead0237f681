//! Shared memory regions: mapped from a slave's memfd (master role) or
//! created and sealed by us (slave role).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

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
    /// The fd can shrink under us (a later access would fault).
    #[error("region fd is not sealed against shrinking (F_SEAL_SHRINK)")]
    NotSealed,
    /// A system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One mapped region.
pub struct Region {
    map: MmapRaw,
    size: u64,
    fd: OwnedFd,
}

impl Region {
    /// Maps a region received from a peer, after checking that the fd really
    /// holds `size` bytes and cannot shrink: otherwise the peer could make our
    /// workers fault (SIGBUS) by truncating the file.
    pub fn from_peer(fd: OwnedFd, size: u64) -> Result<Region, RegionError> {
        if size == 0 || size > MAX_REGION_SIZE {
            return Err(RegionError::BadSize(size));
        }
        let seals =
            fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).map_err(|_| RegionError::NotSealed)?;
        if SealFlag::from_bits_truncate(seals) & SealFlag::F_SEAL_SHRINK != SealFlag::F_SEAL_SHRINK
        {
            return Err(RegionError::NotSealed);
        }
        let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(std::io::Error::from)?;
        let actual = st.st_size as u64;
        if actual < size {
            return Err(RegionError::TooSmall {
                announced: size,
                actual,
            });
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(fd.as_raw_fd())?;
        Ok(Region { map, size, fd })
    }

    /// Creates a zeroed, sealed region of `size` bytes.
    pub fn create(name: &str, size: u64) -> Result<Region, RegionError> {
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
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL),
        )
        .map_err(std::io::Error::from)?;
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

/// The regions of one connection, indexed by region number.
#[derive(Default)]
pub struct Regions {
    list: Vec<Region>,
}

impl Regions {
    /// From a list.
    pub fn new(list: Vec<Region>) -> Regions {
        Regions { list }
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
        let peer = Region::from_peer(dup, 8192).unwrap();
        // SAFETY: reading inside the peer's 8192-byte mapping of the same memfd.
        assert_eq!(unsafe { *peer.base().add(100) }, 42);
        let dup = r.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Region::from_peer(dup, 8193),
            Err(RegionError::TooSmall { .. })
        ));
        let dup = r.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            Region::from_peer(dup, 0),
            Err(RegionError::BadSize(0))
        ));
    }

    #[test]
    fn unsealed_fds_are_refused() {
        let fd = memfd_create(c"x", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, 4096).unwrap();
        assert!(matches!(
            Region::from_peer(fd, 4096),
            Err(RegionError::NotSealed)
        ));
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
