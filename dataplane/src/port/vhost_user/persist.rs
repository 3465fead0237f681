//! A vhost-user connection's takeover: the socket, what the frontend's
//! messages set in the device (features, protocol features, the memory
//! table with its fds, every vring's size, addresses, positions, enable
//! state, kick and call fds), and what the relay holds (a message begun,
//! replies not yet read). The frontend keeps its connection and sees no
//! message. See [`crate::port::takeover`] for the steps; the device parks
//! its queues when the port pauses. The device's and the relay's saved
//! types are theirs (`device.rs`, `relay.rs`: they save and restore what
//! only they hold); the golden file holds them all.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use tracing::info;
use vhost::vhost_user::message::FrontendReq;
use vhost::vhost_user::BackendReqHandler;

use super::device::{Activation, NetDevice, SavedDevice};
use super::relay::{Relay, SavedRelay};
use super::{lock, message, Conn, VhostUser, FLAG_VERSION_1};
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::port::PortCtx;

/// A connection as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedConn {
    socket: FdRef,
    device: SavedDevice,
    relay: SavedRelay,
}

impl VhostUser {
    /// Writes a paused connection down: between two messages the device
    /// holds the whole negotiation.
    pub(super) fn save_conn(&self, conn: &Conn, fds: &mut FdOut) -> Result<SavedConn, String> {
        let device = lock(&conn.device).save(fds)?;
        Ok(SavedConn {
            socket: fds.add(conn.relay.fd().as_fd()),
            device,
            relay: conn.relay.save(fds),
        })
    }

    /// The frontend keeps its connection and sees no message: the `vhost`
    /// crate's handler gets its own state (features, protocol features,
    /// REPLY_ACK) from the messages that set it, replayed on the relay's
    /// inner side with their replies dropped; the device gets its memory
    /// table and rings as saved; the queues start where the rings are.
    pub(super) fn restore_conn(
        &mut self,
        cx: &PortCtx<'_>,
        saved: SavedConn,
        fds: &mut FdIn,
    ) -> Result<Conn, TakeoverError> {
        let fd = fds.take(saved.socket)?;
        let (mut relay, handler_side) = Relay::new(UnixStream::from(fd))?;
        let device = NetDevice::new(&self.name, cx.link(), saved.device.max_pairs)
            .map_err(|e| TakeoverError::Invalid(format!("device: {e}")))?;
        let device = Arc::new(Mutex::new(device));
        let mut handler = BackendReqHandler::from_stream(handler_side, device.clone());
        let d = &saved.device;
        let mut replay = vec![(FrontendReq::GET_FEATURES, None)];
        if d.acked_protocol != 0 {
            replay.push((FrontendReq::GET_PROTOCOL_FEATURES, None));
            replay.push((FrontendReq::SET_PROTOCOL_FEATURES, Some(d.acked_protocol)));
        }
        if let Some(f) = d.acked_features {
            replay.push((FrontendReq::SET_FEATURES, Some(f)));
        }
        for (req, value) in replay {
            relay.replay(message(req as u32, FLAG_VERSION_1, value))?;
            handler
                .handle_request()
                .map_err(|e| TakeoverError::Invalid(format!("replaying {req:?}: {e}")))?;
            relay.drop_replies()?;
        }
        lock(&device).restore(d, fds)?;
        relay.restore(saved.relay, fds)?;
        let pairs_up = match lock(&device).activate().map_err(TakeoverError::Invalid)? {
            Activation::Up { pairs } => pairs,
            Activation::Unchanged => Vec::new(),
        };
        info!(port = %self.name, queue_pairs = pairs_up.len(), "frontend taken over");
        Ok(Conn {
            handler,
            device,
            relay,
            pairs_up,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::socket::SavedSocketPort;
    use crate::port::vhost_user::device::{SavedRegion, SavedVring};

    /// A vhost-user port as saved: the switch the socket server, a device
    /// of one queue pair with its memory table, a message begun.
    #[test]
    fn the_saved_format_is_the_golden_files() {
        let vring = |kick| SavedVring {
            size: 256,
            ready: true,
            enabled: true,
            event_idx: true,
            desc_table: 0x1000,
            avail_ring: 0x2000,
            used_ring: 0x3000,
            next_avail: 17,
            next_used: 16,
            kick,
            call: Some(FdRef(5)),
        };
        let conn = SavedConn {
            socket: FdRef(1),
            device: SavedDevice {
                max_pairs: 1,
                acked_features: Some(0x1_3000_8000),
                acked_protocol: 0x8003,
                memory: Some(vec![SavedRegion {
                    fd: FdRef(2),
                    guest_phys_addr: 0,
                    memory_size: 1 << 30,
                    user_addr: 0x7f00_0000_0000,
                    mmap_offset: 0,
                }]),
                vrings: vec![vring(Some(FdRef(3))), vring(None)],
            },
            relay: SavedRelay {
                pending: vec![1, 0, 0, 0],
                fds: vec![FdRef(4)],
                unread: vec![],
            },
        };
        let port = SavedSocketPort::sample(Some(FdRef(0)), Some(conn));
        crate::port::takeover::check_golden(
            "vhost_user",
            &crate::port::takeover::write(&port),
            "takeover.v1.json",
            include_str!("takeover.v1.json"),
        );
    }
}
