//! An af-xdp port's takeover: the XDP program (its socket map, program
//! and link), every socket with its UMEM's memory file, and where each
//! ring stands. The new switch maps the UMEMs and rings again; the
//! interface never sees the program go. See [`crate::port::takeover`] for
//! the steps.

use super::prog::{self, XdpProgram};
use super::rings::{RxPosition, TxPosition, XdpRx, XdpTx};
use super::xsk::{self, Mode};
use super::{describe, AfXdp, FRAME, FRAMES, RING};
use crate::dataplane::QueuePositions;
use crate::port::kernel::{queue_position, Interface};
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::queue::PortQueues;

/// An af-xdp port's program and queues as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedQueues {
    /// The UMEM and ring sizes, which the next switch must make too.
    frame: u64,
    frames: u64,
    ring: u32,
    /// The socket map, program and link ([`XdpProgram::fds`]).
    program: [FdRef; 3],
    restores_vlan_tags: bool,
    mode: Mode,
    /// Whether the port turned receive VLAN offload off (and so puts it
    /// back when it lets the interface go).
    rx_vlan_restore: bool,
    partial_checksums: bool,
    queues: Vec<SavedQueue>,
}

/// One socket: its fd, its UMEM's memory file, where its rings stand.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedQueue {
    socket: FdRef,
    umem: FdRef,
    rx: RxPosition,
    tx: TxPosition,
}

impl AfXdp {
    /// Writes the open sockets down, each where its queues stood.
    pub(super) fn save_queues(
        &self,
        mut positions: QueuePositions,
        fds: &mut FdOut,
    ) -> Result<SavedQueues, String> {
        let (Some(prog), Some(mode)) = (&self.prog, self.mode) else {
            return Err("no sockets open".into());
        };
        let program = prog.fds().map(|fd| fds.add(fd));
        let mut queues = Vec::with_capacity(self.open.len());
        for (i, xsk) in self.open.iter().enumerate() {
            let (rx, tx) = queue_position(&mut positions, i)?;
            queues.push(SavedQueue {
                socket: fds.add(xsk.socket()),
                umem: fds.add(xsk.umem_file()),
                rx,
                tx,
            });
        }
        Ok(SavedQueues {
            frame: FRAME,
            frames: FRAMES,
            ring: RING,
            program,
            restores_vlan_tags: prog.restores_vlan_tags,
            mode,
            rx_vlan_restore: self.rx_vlan_restore,
            partial_checksums: self.partial_checksums,
            queues,
        })
    }

    /// Takes up the program and the sockets another switch saved.
    pub(super) fn restore_queues(
        &mut self,
        at: &Interface<'_>,
        s: SavedQueues,
        fds: &mut FdIn,
    ) -> Result<(PortQueues, String), TakeoverError> {
        if (s.frame, s.frames, s.ring) != (FRAME, FRAMES, RING) {
            return Err(TakeoverError::Invalid(format!(
                "UMEMs of {} frames of {} bytes with rings of {}, where this switch makes {FRAMES} of {FRAME} with {RING}",
                s.frames, s.frame, s.ring
            )));
        }
        let program = [
            fds.take(s.program[0])?,
            fds.take(s.program[1])?,
            fds.take(s.program[2])?,
        ];
        let prog = XdpProgram::adopt(program, at.index, s.restores_vlan_tags)?;
        let mut q = PortQueues::default();
        let mut open = Vec::with_capacity(s.queues.len());
        for (i, saved) in s.queues.into_iter().enumerate() {
            let (xsk, [fill, comp, rx, tx]) =
                xsk::adopt(fds.take(saved.socket)?, fds.take(saved.umem)?)?;
            let r = XdpRx::resume(
                xsk.clone(),
                fill,
                rx,
                &saved.rx,
                s.partial_checksums,
                at.mtu.clone(),
            );
            let t = XdpTx::resume(xsk.clone(), tx, comp, saved.tx, at.mtu.clone())
                .map_err(|e| TakeoverError::Invalid(format!("queue {i}: {e}")))?;
            q.rx.push(Box::new(r));
            q.tx.push(Box::new(t));
            open.push(xsk);
        }
        // The interface is as the other switch left it, and this port puts
        // it back as that one would have.
        self.rx_vlan_restore = s.rx_vlan_restore;
        self.prog = Some(prog);
        self.open = open;
        self.mode = Some(s.mode);
        self.partial_checksums = s.partial_checksums;
        let restored = s.restores_vlan_tags && prog::driver_gives_vlan_tags(at.index);
        Ok((q, describe(at.name, s.mode, restored)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::kernel::SavedKernelIf;

    /// An af-xdp port as saved: its program, one socket.
    #[test]
    fn the_saved_format_is_the_golden_files() {
        let queues = SavedQueues {
            frame: FRAME,
            frames: FRAMES,
            ring: RING,
            program: [FdRef(0), FdRef(1), FdRef(2)],
            restores_vlan_tags: true,
            mode: Mode::NativeCopy,
            rx_vlan_restore: false,
            partial_checksums: true,
            queues: vec![SavedQueue {
                socket: FdRef(3),
                umem: FdRef(4),
                rx: RxPosition {
                    fill_prod: 2048,
                    rx_cons: 17,
                },
                tx: TxPosition {
                    tx_prod: 5,
                    comp_cons: 3,
                    pool: vec![8_388_608, 8_392_704],
                },
            }],
        };
        let port = SavedKernelIf::sample(Some(7), Some(queues));
        crate::port::takeover::check_golden(
            "af_xdp",
            &crate::port::takeover::write(&port),
            "takeover.v1.json",
            include_str!("takeover.v1.json"),
        );
    }
}
