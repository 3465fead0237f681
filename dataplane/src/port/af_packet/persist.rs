//! An af-packet port's takeover: each queue's socket (its ring) and its
//! direct socket, and where each ring stands. The new switch maps the
//! rings again; frames wait in the kernel meanwhile. See
//! [`crate::port::takeover`] for the steps.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{AfPacket, AfpRx, AfpTx, Geometry};
use crate::dataplane::QueuePositions;
use crate::port::kernel::{queue_position, Interface};
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::queue::PortQueues;

/// An af-packet port's queues as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedQueues {
    geometry: Geometry,
    queues: Vec<SavedQueue>,
}

/// One queue: its ring's socket, its direct socket, where it stands.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedQueue {
    socket: FdRef,
    direct: FdRef,
    rx: RxPosition,
    tx: TxPosition,
}

/// Where a receive queue stands between bursts: the kernel's ring does
/// not say which block the reader is at.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RxPosition {
    pub(super) block: usize,
    pub(super) left: u32,
    pub(super) next: usize,
}

/// Where a transmit queue stands between bursts: the slot it fills next,
/// the one the kernel sends from next.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TxPosition {
    pub(super) cursor: usize,
}

impl AfPacket {
    /// Writes the open sockets down, each where its queues stood.
    pub(super) fn save_queues(
        &self,
        mut positions: QueuePositions,
        fds: &mut FdOut,
    ) -> Result<SavedQueues, String> {
        let geometry = self.geometry.ok_or("no rings open")?;
        let mut queues = Vec::with_capacity(self.open.len());
        for (i, (socket, direct)) in self.open.iter().enumerate() {
            let (rx, tx) = queue_position(&mut positions, i)?;
            queues.push(SavedQueue {
                socket: fds.add(socket.as_fd()),
                direct: fds.add(direct.as_fd()),
                rx,
                tx,
            });
        }
        Ok(SavedQueues { geometry, queues })
    }

    /// Takes up the sockets another switch saved: each ring mapped again,
    /// where it stood.
    pub(super) fn restore_queues(
        &mut self,
        at: &Interface<'_>,
        saved: SavedQueues,
        fds: &mut FdIn,
    ) -> Result<(PortQueues, String), TakeoverError> {
        let g = saved.geometry;
        let invalid = |why: String| TakeoverError::Invalid(why);
        if g.block_size == 0
            || g.frame_size == 0
            || g.blocks == 0
            || g.block_size % g.frame_size != 0
        {
            return Err(invalid(format!("rings of {g:?}")));
        }
        let caps = AfPacket::caps();
        let mut q = PortQueues::default();
        self.open.clear();
        for (i, s) in saved.queues.into_iter().enumerate() {
            let fd = Arc::new(fds.take(s.socket)?);
            let direct = Arc::new(fds.take(s.direct)?);
            let (rx, tx) = g.map(&fd)?;
            if s.rx.block >= rx.blocks || s.rx.next >= rx.block_size || s.tx.cursor >= tx.frames {
                return Err(invalid(format!("queue {i} stands outside its rings")));
            }
            self.open.push((fd.clone(), direct.clone()));
            let mut r = AfpRx::new(fd.clone(), rx);
            (r.block, r.left, r.next) = (s.rx.block, s.rx.left, s.rx.next);
            q.rx.push(Box::new(r));
            q.tx.push(Box::new(AfpTx {
                fd,
                direct,
                caps,
                ring: tx,
                cursor: s.tx.cursor,
                queued: false,
                mtu: at.mtu.clone(),
            }));
        }
        self.geometry = Some(g);
        let m = at.mtu.load(Ordering::Relaxed);
        Ok((
            q,
            format!("kernel interface {} (af-packet, mtu {m})", at.name),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::kernel::SavedKernelIf;

    /// An af-packet port as saved: one queue.
    #[test]
    fn the_saved_format_is_the_golden_files() {
        let queues = SavedQueues {
            geometry: Geometry {
                block_size: 1 << 20,
                blocks: 4,
                frame_size: 4096,
            },
            queues: vec![SavedQueue {
                socket: FdRef(0),
                direct: FdRef(1),
                rx: RxPosition {
                    block: 2,
                    left: 3,
                    next: 4096,
                },
                tx: TxPosition { cursor: 9 },
            }],
        };
        let port = SavedKernelIf::sample(Some(7), Some(queues));
        crate::port::takeover::check_golden(
            "af_packet",
            &crate::port::takeover::write(&port),
            "takeover.v1.json",
            include_str!("takeover.v1.json"),
        );
    }
}
