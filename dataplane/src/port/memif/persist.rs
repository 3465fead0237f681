//! A memif connection's takeover: the socket, the regions (their fds and
//! sizes), every ring (where it is, its interrupt eventfd, the slave's
//! buffers). The peer sees nothing: the new switch maps the same memory
//! and its queues resume where the rings are. See [`crate::port::takeover`]
//! for the steps.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use tracing::info;

use switchyard_api::PortStatus;

use super::region::{self, Region, Regions};
use super::ring::Ring;
use super::{Conn, Handshake, Linked, LinkedRing, Memif, QueuesFrom, Role};
use crate::port::sigbus::Tripwire;
use crate::port::socket::Closed;
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::port::PortCtx;
use crate::wire::memif::{ring_bytes, COOKIE, MAX_LOG2_RING_SIZE};

/// A link as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedLink {
    socket: FdRef,
    regions: Vec<SavedRegion>,
    s2m: Vec<SavedRing>,
    m2s: Vec<SavedRing>,
    buffer_size: u32,
}

/// A region: its memfd and size.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRegion {
    fd: FdRef,
    size: u64,
}

/// A ring: where it is, its interrupt eventfd, and (the slave's rings)
/// the first of its buffers.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRing {
    region: u16,
    offset: u32,
    log2: u8,
    irq: FdRef,
    buffers: Option<u32>,
}

impl Memif {
    /// Writes an established link down (a half-done handshake is not
    /// saved: the socket port drops it when it pauses).
    pub(super) fn save_link(&self, conn: &Conn, fds: &mut FdOut) -> Result<SavedLink, String> {
        let Handshake::Up(l) = &conn.hs else {
            return Err("a handshake under way".into());
        };
        let mut ring = |r: &LinkedRing| SavedRing {
            region: r.region,
            offset: r.offset,
            log2: r.ring.size().trailing_zeros() as u8,
            irq: fds.add(r.irq.as_fd()),
            buffers: r.buffers,
        };
        let s2m = l.s2m.iter().map(&mut ring).collect();
        let m2s = l.m2s.iter().map(&mut ring).collect();
        Ok(SavedLink {
            socket: fds.add(conn.fd.as_fd()),
            regions: (0..l.regions.len())
                .filter_map(|i| l.regions.get(i))
                .map(|r| SavedRegion {
                    fd: fds.add(r.fd()),
                    size: r.size(),
                })
                .collect(),
            s2m,
            m2s,
            buffer_size: l.buffer_size,
        })
    }

    /// Takes up a link another process saved: its memory mapped again, its
    /// queues where the rings are.
    pub(super) fn restore_link(
        &mut self,
        cx: &PortCtx<'_>,
        saved: SavedLink,
        fds: &mut FdIn,
        status: &mut PortStatus,
    ) -> Result<Conn, TakeoverError> {
        let linked = self.relink(&saved, fds)?;
        let fd = fds.take(saved.socket)?;
        let q = self
            .queues(&linked, QueuesFrom::Rings)
            .map_err(|c| TakeoverError::Invalid(c.reason))?;
        status.rx_queues = q.rx.len();
        status.tx_queues = q.tx.len();
        status.link_up = true;
        info!(port = %self.name, rx_queues = q.rx.len(), tx_queues = q.tx.len(), "link taken over");
        cx.attach(q);
        Ok(Conn {
            fd,
            hs: Handshake::Up(linked),
            started: Instant::now(),
        })
    }

    /// A failed takeover: the queues are made again where the rings are,
    /// replacing those the workers had (paused, they hold none).
    pub(super) fn resume_link(&mut self, cx: &PortCtx<'_>, conn: &mut Conn) -> Result<(), Closed> {
        let Handshake::Up(linked) = &conn.hs else {
            return Ok(());
        };
        cx.attach(self.queues(linked, QueuesFrom::Rings)?);
        Ok(())
    }

    /// Maps the memory and finds the rings of a link another process saved.
    fn relink(&self, saved: &SavedLink, fds: &mut FdIn) -> Result<Linked, TakeoverError> {
        let invalid = |why: String| TakeoverError::Invalid(why);
        let mut wire = Tripwire::new();
        let mut list = Vec::with_capacity(saved.regions.len());
        for (i, r) in saved.regions.iter().enumerate() {
            let fd = fds.take(r.fd)?;
            let region = match self.role {
                Role::Master => Region::from_peer(fd, r.size, &mut wire),
                Role::Slave => Region::adopt(fd, r.size),
            };
            list.push(region.map_err(|e| invalid(format!("region {i}: {e}")))?);
        }
        if list.is_empty() || list.len() > region::MAX_REGIONS {
            return Err(invalid(format!("{} regions", list.len())));
        }
        let regions = Arc::new(Regions::watched(list, wire));
        let mut ring = |r: &SavedRing| -> Result<LinkedRing, TakeoverError> {
            let region = regions.get(r.region as usize).ok_or_else(|| {
                invalid(format!("a ring in region {}, which is not there", r.region))
            })?;
            if r.log2 == 0
                || r.log2 > MAX_LOG2_RING_SIZE
                || r.offset % 8 != 0
                || u64::from(r.offset) + ring_bytes(r.log2) > region.size()
            {
                return Err(invalid(format!(
                    "a ring of 2^{} slots at {} is outside region {}",
                    r.log2, r.offset, r.region
                )));
            }
            if r.buffers.is_some() != (self.role == Role::Slave) {
                return Err(invalid("buffers saved for the wrong side".into()));
            }
            // SAFETY: the offset is 8-aligned and the ring lies inside the
            // region (checked above), which `regions` keeps mapped for as
            // long as any queue built from this ring.
            let ring = unsafe { Ring::new(region.base().add(r.offset as usize), r.log2) };
            if ring.cookie() != COOKIE {
                return Err(invalid(format!(
                    "no memif cookie at ring offset {}",
                    r.offset
                )));
            }
            Ok(LinkedRing {
                ring,
                irq: fds.take(r.irq)?,
                buffers: r.buffers,
                region: r.region,
                offset: r.offset,
            })
        };
        let s2m = saved
            .s2m
            .iter()
            .map(&mut ring)
            .collect::<Result<Vec<_>, _>>()?;
        let m2s = saved
            .m2s
            .iter()
            .map(&mut ring)
            .collect::<Result<Vec<_>, _>>()?;
        if s2m.is_empty() || m2s.is_empty() {
            return Err(invalid("a link without rings".into()));
        }
        Ok(Linked {
            regions,
            s2m,
            m2s,
            buffer_size: saved.buffer_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::socket::SavedSocketPort;

    /// A memif port as saved: listening, a link of one region and a ring
    /// each way, a master's (no buffers) and a slave's.
    #[test]
    fn the_saved_format_is_the_golden_files() {
        let ring = |buffers| SavedRing {
            region: 0,
            offset: 128,
            log2: 10,
            irq: FdRef(3),
            buffers,
        };
        let link = SavedLink {
            socket: FdRef(1),
            regions: vec![SavedRegion {
                fd: FdRef(2),
                size: 1 << 20,
            }],
            s2m: vec![ring(None)],
            m2s: vec![ring(Some(1024))],
            buffer_size: 2048,
        };
        let port = SavedSocketPort::sample(Some(FdRef(0)), Some(link));
        crate::port::takeover::check_golden(
            "memif",
            &crate::port::takeover::write(&port),
            "takeover.v1.json",
            include_str!("takeover.v1.json"),
        );
    }
}
