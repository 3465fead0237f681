//! A tap's takeover: its queue fds (the interface and its frames stay in
//! the kernel meanwhile) and its status. See [`crate::port::takeover`] for
//! the steps.

use std::os::fd::AsFd;
use std::sync::Arc;

use switchyard_api::PortStatus;

use super::{set_offloads, TapPort};
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::port::{Persist, PortCtx, PortError};

/// A tap as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedTap {
    queues: Vec<FdRef>,
    status: PortStatus,
}

impl Persist for TapPort {
    type Saved = SavedTap;

    fn save_state(&self, _cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<SavedTap, PortError> {
        Ok(SavedTap {
            queues: self.queues.iter().map(|q| fds.add(q.as_fd())).collect(),
            status: self.status.clone(),
        })
    }

    /// The tap's queue fds, as another process saved them.
    fn restore_state(
        &mut self,
        cx: &PortCtx<'_>,
        saved: SavedTap,
        fds: &mut FdIn,
    ) -> Result<(), PortError> {
        if saved.queues.is_empty() {
            return Err(TakeoverError::Invalid("a tap without queues".into()).into());
        }
        self.queues = saved
            .queues
            .iter()
            .map(|&i| fds.take(i).map(Arc::new))
            .collect::<Result<_, _>>()?;
        let err = |e: std::io::Error| PortError::Other(format!("tap {}: {e}", self.spec.interface));
        let caps = set_offloads(self.queues[0].as_fd()).map_err(err)?;
        self.status = saved.status;
        self.attach(cx, caps);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_format_is_the_golden_files() {
        let saved = SavedTap {
            queues: vec![FdRef(0), FdRef(1)],
            status: PortStatus::default(),
        };
        crate::port::takeover::check_golden(
            "tap",
            &crate::port::takeover::write(&saved),
            "takeover.v1.json",
            include_str!("takeover.v1.json"),
        );
    }
}
