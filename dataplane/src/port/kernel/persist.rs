//! A kernel interface port's takeover: the interface index its queues are
//! open on, the uplink's queues as the kind saves them, its status. See
//! [`crate::port::takeover`] for the steps.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::info;

use switchyard_api::PortStatus;

use super::netdev::read_mtu;
use super::{Interface, KernelIf, Uplink, CHECK_EVERY};
use crate::dataplane::QueuePositions;
use crate::port::takeover::{FdIn, FdOut};
use crate::port::{Persist, PortCtx, PortError};

/// A kernel interface port as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedKernelIf<Q> {
    /// The interface index the queues are open on, if they are.
    index: Option<u32>,
    /// The uplink's queues, if open.
    queues: Option<Q>,
    status: PortStatus,
}

#[cfg(test)]
impl<Q> SavedKernelIf<Q> {
    /// A saved port, its status the default: for the kinds' golden files.
    pub(crate) fn sample(index: Option<u32>, queues: Option<Q>) -> SavedKernelIf<Q> {
        SavedKernelIf {
            index,
            queues,
            status: PortStatus::default(),
        }
    }
}

/// Where queue pair `i` stood when the workers paused, as its receive and
/// transmit queues said (`RxQueue/TxQueue::position`), in the kind's own
/// types: for [`Uplink::save`].
pub fn queue_position<R: 'static, T: 'static>(
    positions: &mut QueuePositions,
    i: usize,
) -> Result<(R, T), String> {
    fn one<P: 'static>(
        p: Option<&mut Option<crate::queue::QueuePosition>>,
        i: usize,
    ) -> Result<P, String> {
        p.and_then(Option::take)
            .ok_or_else(|| format!("queue {i} says nothing of where it stands"))?
            .get()
            .ok_or_else(|| format!("queue {i} is not this kind's"))
    }
    Ok((
        one(positions.rx.get_mut(i), i)?,
        one(positions.tx.get_mut(i), i)?,
    ))
}

impl<U: Uplink> Persist for KernelIf<U> {
    type Saved = SavedKernelIf<U::Saved>;

    fn save_state(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Self::Saved, PortError> {
        let queues = match self.open {
            Some(_) => Some(
                self.uplink
                    .save(cx.queue_positions(), fds)
                    .map_err(PortError::Other)?,
            ),
            None => None,
        };
        Ok(SavedKernelIf {
            index: self.open,
            queues,
            status: self.status.clone(),
        })
    }

    /// The queues as they were; the interface is looked at again on the
    /// next check, as after any start (gone, made again, a new MTU).
    fn restore_state(
        &mut self,
        cx: &PortCtx<'_>,
        saved: Self::Saved,
        fds: &mut FdIn,
    ) -> Result<(), PortError> {
        self.status = saved.status;
        self.check_at = Some(Instant::now() + CHECK_EVERY);
        let (Some(index), Some(queues)) = (saved.index, saved.queues) else {
            return Ok(());
        };
        if let Ok(m) = read_mtu(&self.interface) {
            self.mtu.store(m, Ordering::Relaxed);
        }
        let at = Interface {
            name: &self.interface,
            index,
            mtu: &self.mtu,
        };
        let (q, _) = self.uplink.restore(&at, queues, fds)?;
        info!(port = %self.name, interface = %self.interface, queues = q.rx.len(), "{} queues taken over", U::KIND);
        cx.attach(q);
        self.open = Some(index);
        Ok(())
    }
}
