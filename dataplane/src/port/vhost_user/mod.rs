//! vhost-user ports: the switch is the virtio-net device (backend), the pod's
//! application (DPDK `virtio_user`, QEMU) the driver (frontend).
//!
//! As socket *server* the switch listens and the frontend connects (OVS
//! `dpdkvhostuser`); as *client* the frontend listens and the switch
//! connects, retrying until the socket appears and again after the frontend
//! restarts (OVS `dpdkvhostuserclient`).
//!
//! The `vhost` crate's [`BackendReqHandler`] answers the protocol messages,
//! driven by the control thread's reactor: a port costs no thread. It reads
//! them from a [`relay::Relay`], which takes the frontend's bytes without
//! blocking and hands on whole messages only, so no frontend can hold the
//! control thread (and the API it serves).
//! (`vhost-user-backend`'s daemon would spend a thread per connection and an
//! epoll thread per queue set; we use its vring state type instead and let
//! the poll-mode workers run the queues.)

pub mod device;
mod persist;
pub mod queue;
pub mod relay;
pub mod split;

use std::io::ErrorKind;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use nix::sys::socket::SockType;
use tracing::{debug, info};
use vhost::vhost_user::{BackendReqHandler, Error as VuError};

use switchyard_api::{PortStatus, Side, VhostUserSpec};

use crate::port::registry::Build;
use crate::port::socket::{Closed, Greeting, Protocol, SocketPort};
use crate::port::takeover::{FdIn, FdOut, TakeoverError};
use crate::port::{Port, PortCtx};
use device::{Activation, NetDevice};
use relay::{Message, Relay, RelayError};

/// A vhost-user port: the vhost-user protocol on a socket port, offering
/// the spec's queue pairs, else `queues` (one per worker, as OVS-DPDK);
/// the switch's listening sockets are `listeners`.
pub fn port(spec: &VhostUserSpec, b: &Build<'_>) -> Box<dyn Port> {
    let name = b.name();
    let vu = VhostUser {
        name: name.to_string(),
        queues: spec.queues.unwrap_or(b.workers),
    };
    Box::new(SocketPort::new(name, spec.socket_spec(), vu, b.listeners))
}

/// The vhost-user protocol of one port.
struct VhostUser {
    name: String,
    /// Queue pairs offered to the frontend.
    queues: u16,
}

/// One frontend's connection.
pub struct Conn {
    handler: BackendReqHandler<Mutex<NetDevice>>,
    device: Arc<Mutex<NetDevice>>,
    relay: Relay,
    /// Queue pairs with the workers, as last logged.
    pairs_up: Vec<usize>,
}

fn lock(d: &Mutex<NetDevice>) -> MutexGuard<'_, NetDevice> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

impl Greeting for VhostUser {
    type Intro = ();
    type Offer = ();
    const KIND: &'static str = "vhost-user";
    const SOCK_TYPE: SockType = SockType::Stream;

    /// A frontend names no interface: the socket is its port's alone.
    fn introduce(_fd: BorrowedFd<'_>) -> Result<Option<(u32, ())>, Closed> {
        Ok(Some((0, ())))
    }
}

impl Protocol for VhostUser {
    type Conn = Conn;
    type Saved = persist::SavedConn;

    fn offer(&self) {}

    fn on_intro(
        &mut self,
        _cx: &PortCtx<'_>,
        _conn: &mut Conn,
        _intro: (),
        _status: &mut PortStatus,
    ) -> Result<(), Closed> {
        Ok(())
    }

    fn open(&mut self, cx: &PortCtx<'_>, fd: OwnedFd, _side: Side) -> Result<Conn, String> {
        let (relay, handler_side) =
            Relay::new(UnixStream::from(fd)).map_err(|e| format!("socket: {e}"))?;
        let device = NetDevice::new(&self.name, cx.link(), self.queues)
            .map_err(|e| format!("device: {e}"))?;
        let device = Arc::new(Mutex::new(device));
        let handler = BackendReqHandler::from_stream(handler_side, device.clone());
        info!(port = %self.name, "frontend connected");
        Ok(Conn {
            handler,
            device,
            relay,
            pairs_up: Vec::new(),
        })
    }

    fn fd(conn: &Conn) -> BorrowedFd<'_> {
        conn.relay.fd()
    }

    /// The frontend sent bytes: every message they complete is handled,
    /// in order, and the replies go back.
    fn on_ready(
        &mut self,
        _cx: &PortCtx<'_>,
        conn: &mut Conn,
        status: &mut PortStatus,
    ) -> Result<(), Closed> {
        let res = conn.relay.receive().and_then(|msgs| {
            for m in msgs {
                handle(conn, &m)?;
            }
            conn.relay.flush()
        });
        match res {
            Ok(()) => self.after_messages(conn, status),
            Err(RelayError::Closed) => Err(Closed::gone("frontend closed the connection")),
            Err(RelayError::Io(io))
                if matches!(
                    io.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
                ) =>
            {
                Err(Closed::gone("frontend closed the connection"))
            }
            Err(e) => Err(Closed::fault(format!("vhost-user request failed: {e}"))),
        }
    }

    fn deadline(&self, conn: &Conn) -> Option<Instant> {
        conn.relay.deadline()
    }

    fn on_timer(&mut self, conn: &mut Conn, now: Instant) -> Result<(), Closed> {
        conn.relay
            .check(now)
            .map_err(|e| Closed::fault(e.to_string()))
    }

    fn close(&mut self, _cx: &PortCtx<'_>, conn: Conn, _reason: &str, _say: bool) -> bool {
        lock(&conn.device).park()
    }

    /// The device takes its queues back from the workers, their positions
    /// into the vrings: between two messages it then holds the whole
    /// negotiation.
    fn pause(&mut self, _cx: &PortCtx<'_>, conn: &mut Conn) {
        lock(&conn.device).park();
    }

    fn save(&self, conn: &Conn, fds: &mut FdOut) -> Result<persist::SavedConn, String> {
        self.save_conn(conn, fds)
    }

    fn restore(
        &mut self,
        cx: &PortCtx<'_>,
        saved: persist::SavedConn,
        fds: &mut FdIn,
        _status: &mut PortStatus,
    ) -> Result<Conn, TakeoverError> {
        self.restore_conn(cx, saved, fds)
    }

    /// The queues start again from the vrings, each where its used index
    /// in guest memory stands (`NetDevice::activate`).
    fn resume(&mut self, _cx: &PortCtx<'_>, conn: &mut Conn) -> Result<(), Closed> {
        let mut dev = lock(&conn.device);
        dev.take_parked();
        dev.activate().map(|_| ()).map_err(Closed::fault)
    }
}

impl VhostUser {
    /// Link state after the frontend's messages.
    fn after_messages(&self, conn: &mut Conn, status: &mut PortStatus) -> Result<(), Closed> {
        let mut dev = lock(&conn.device);
        let parked = dev.take_parked();
        let res = dev.activate();
        let features = dev.acked_features();
        drop(dev);
        match res {
            Ok(Activation::Up { pairs }) => {
                if !status.link_up {
                    status.connects += 1;
                    info!(port = %self.name, queue_pairs = pairs.len(), "link up");
                }
                self.log_pairs(conn, pairs.clone());
                status.link_up = true;
                status.rx_queues = pairs.len();
                status.tx_queues = pairs.len();
                status.last_error = None;
                status.peer = Some(format!(
                    "virtio-net driver, features {:#x}",
                    features.unwrap_or(0)
                ));
            }
            Ok(Activation::Unchanged) => {
                if parked {
                    // Rings stopped and not (yet) restarted.
                    if status.link_up {
                        info!(port = %self.name, "link down: frontend stopped its queues");
                    }
                    self.log_pairs(conn, Vec::new());
                    status.link_up = false;
                    status.rx_queues = 0;
                    status.tx_queues = 0;
                }
            }
            Err(reason) => return Err(Closed::fault(reason)),
        }
        Ok(())
    }

    /// Logs each queue pair that came up or went down since the last call
    /// (a guest enables its pairs one by one, as its driver brings up
    /// queues on more CPUs).
    fn log_pairs(&self, conn: &mut Conn, now: Vec<usize>) {
        for p in now.iter().filter(|p| !conn.pairs_up.contains(p)) {
            info!(port = %self.name, pair = p, rx_vring = 2 * p + 1, tx_vring = 2 * p, "queue pair up");
        }
        for p in conn.pairs_up.iter().filter(|p| !now.contains(p)) {
            info!(port = %self.name, pair = p, "queue pair down");
        }
        conn.pairs_up = now;
    }
}

/// A vhost-user message: header (`code`, `flags`, body size) and an
/// optional `u64` body. A replayed request, or a reply made here.
fn message(code: u32, flags: u32, value: Option<u64>) -> Vec<u8> {
    let body = value.map(u64::to_le_bytes);
    let size = body.map_or(0, |b| b.len()) as u32;
    let mut b = Vec::with_capacity(relay::HEADER_LEN + size as usize);
    b.extend_from_slice(&code.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    if let Some(body) = body {
        b.extend_from_slice(&body);
    }
    b
}

const REQ_SET_VRING_ENABLE: u32 = vhost::vhost_user::message::FrontendReq::SET_VRING_ENABLE as u32;
const FLAG_VERSION_1: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

/// Handles one whole message from the frontend.
fn handle(conn: &mut Conn, msg: &Message) -> Result<(), RelayError> {
    if let Some(reply) = early_vring_enable(conn, msg) {
        let reply = reply.map_err(|e| RelayError::Protocol(e.to_string()))?;
        return match reply {
            Some(r) => conn.relay.reply(&r),
            None => Ok(()),
        };
    }
    conn.relay.forward(msg)?;
    conn.handler.handle_request().map_err(|e| match e {
        VuError::Disconnected | VuError::PartialMessage => RelayError::Closed,
        e => RelayError::Protocol(e.to_string()),
    })?;
    // Its reply, if any, goes out before the next message is handled.
    conn.relay.flush()
}

/// DPDK's `virtio_user` in server mode re-enables its rings on a new
/// connection before it sends `SET_FEATURES`. The `vhost` crate rejects
/// `SET_VRING_ENABLE` until `VHOST_USER_F_PROTOCOL_FEATURES` is acked on the
/// connection (as the spec says); DPDK's own vhost library accepts it. So
/// that a restarted switch can reattach to such a frontend, this one message
/// is applied here when it arrives that early. Returns `None` when `msg` is
/// anything else, else the reply to send, if one is asked for.
fn early_vring_enable(conn: &mut Conn, msg: &Message) -> Option<Result<Option<Vec<u8>>, VuError>> {
    use relay::{word, HEADER_LEN};
    let b = &msg.bytes;
    if b.len() != HEADER_LEN + 8 || msg.request() != REQ_SET_VRING_ENABLE || word(b, 8) != 8 {
        return None;
    }
    let mut dev = lock(&conn.device);
    if dev.acked_features().is_some() {
        return None;
    }
    let (flags, index, num) = (word(b, 4), word(b, 12), word(b, 16));
    debug!(index, num, "SET_VRING_ENABLE before SET_FEATURES");
    let res = match num {
        0 | 1 => {
            use vhost::vhost_user::VhostUserBackendReqHandlerMut;
            dev.set_vring_enable(index, num == 1)
        }
        _ => Err(VuError::InvalidParam),
    };
    if flags & FLAG_NEED_REPLY != 0 && dev.reply_ack() {
        let reply = message(
            REQ_SET_VRING_ENABLE,
            FLAG_VERSION_1 | FLAG_REPLY,
            Some(u64::from(res.is_err())),
        );
        return Some(Ok(Some(reply)));
    }
    Some(res.map(|()| None))
}
