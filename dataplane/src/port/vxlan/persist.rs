//! A vxlan tunnel's takeover: the UDP socket its local address's tunnels
//! share (each tunnel hands it over; the first restored takes it up, the
//! others join it), and its status. Its packets wait in the kernel
//! meanwhile. See [`crate::port::takeover`] for the steps.

use std::os::fd::AsFd;

use switchyard_api::PortStatus;

use super::VxlanPort;
use crate::port::takeover::{FdIn, FdOut, FdRef};
use crate::port::{Persist, PortCtx, PortError};

/// A tunnel as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedVxlan {
    socket: FdRef,
    status: PortStatus,
}

impl Persist for VxlanPort {
    type Saved = SavedVxlan;

    fn save_state(&self, _cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<SavedVxlan, PortError> {
        let u = self
            .underlay
            .as_ref()
            .ok_or_else(|| PortError::Other("a vxlan port that is not started".into()))?;
        Ok(SavedVxlan {
            socket: fds.add(u.socket.as_fd()),
            status: self.status.clone(),
        })
    }

    /// The shared socket as the other switch had it.
    fn restore_state(
        &mut self,
        cx: &PortCtx<'_>,
        saved: SavedVxlan,
        fds: &mut FdIn,
    ) -> Result<(), PortError> {
        let fd = fds.take(saved.socket)?;
        self.status = saved.status;
        self.join(cx, Some(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_format_is_the_golden_files() {
        let saved = SavedVxlan {
            socket: FdRef(0),
            status: PortStatus::default(),
        };
        crate::port::takeover::check_golden(
            "vxlan",
            &crate::port::takeover::write(&saved),
            "takeover.v1.json",
            include_str!("takeover.v1.json"),
        );
    }
}
