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
pub mod queue;
pub mod relay;
pub mod split;

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tracing::{debug, info, warn};
use vhost::vhost_user::{BackendReqHandler, Error as VuError};

use switchyard_api::{PortStatus, SocketAddr, VhostUserRole, VhostUserSpec};

use crate::port::endpoint::{Endpoint, SUB_CONN, SUB_LISTENER};
use crate::port::{Port, PortCtx, PortError};
use device::{Activation, NetDevice};
use relay::{Message, Relay, RelayError};

/// A vhost-user port's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostUserConfig {
    /// The switch's socket role.
    pub role: VhostUserRole,
    /// Socket path.
    pub socket: SocketAddr,
    /// Queue pairs offered to the frontend.
    pub queues: u16,
    /// Group given access to the socket when the switch is the server.
    pub socket_group: Option<u32>,
}

impl VhostUserConfig {
    /// The settings of a (validated) spec; `queues` when it names none.
    pub fn from_spec(spec: &VhostUserSpec, queues: u16) -> VhostUserConfig {
        VhostUserConfig {
            role: spec.role,
            socket: spec.socket.clone(),
            queues: spec.queues.unwrap_or(queues),
            socket_group: spec.socket_group,
        }
    }
}

struct Conn {
    handler: BackendReqHandler<Mutex<NetDevice>>,
    device: Arc<Mutex<NetDevice>>,
    relay: Relay,
}

/// A vhost-user port.
pub struct VhostUserPort {
    cfg: VhostUserConfig,
    name: String,
    endpoint: Endpoint,
    conn: Option<Conn>,
    status: PortStatus,
    /// Queue pairs with the workers, as last logged.
    pairs_up: Vec<usize>,
}

fn lock(d: &Mutex<NetDevice>) -> MutexGuard<'_, NetDevice> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

impl VhostUserPort {
    /// A port that is not started yet.
    pub fn new(name: &str, cfg: VhostUserConfig) -> VhostUserPort {
        VhostUserPort {
            endpoint: Endpoint::new(
                nix::sys::socket::SockType::Stream,
                cfg.socket.clone(),
                cfg.role == VhostUserRole::Server,
                cfg.socket_group,
            ),
            cfg,
            name: name.to_string(),
            conn: None,
            status: PortStatus::default(),
            pairs_up: Vec::new(),
        }
    }

    fn open(&mut self, cx: &PortCtx<'_>, stream: UnixStream) -> Result<(), String> {
        let (relay, handler_side) = Relay::new(stream).map_err(|e| format!("socket: {e}"))?;
        let device = NetDevice::new(&self.name, cx.link(), self.cfg.queues)
            .map_err(|e| format!("device: {e}"))?;
        let device = Arc::new(Mutex::new(device));
        let handler = BackendReqHandler::from_stream(handler_side, device.clone());
        cx.watch(relay.fd(), SUB_CONN)
            .map_err(|e| format!("cannot watch socket: {e}"))?;
        self.conn = Some(Conn {
            handler,
            device,
            relay,
        });
        info!(port = %self.name, "frontend connected");
        Ok(())
    }

    fn try_connect(&mut self, cx: &PortCtx<'_>) {
        let res = match self.endpoint.connect() {
            Ok(fd) => self
                .open(cx, UnixStream::from(fd))
                .inspect_err(|_| self.endpoint.lost()),
            Err(e) => Err(format!("connect: {e}")),
        };
        if let Err(e) = res {
            debug!(port = %self.name, socket = %self.cfg.socket, "{e}; retrying");
            self.status.last_error = Some(e);
        }
    }

    fn accept_all(&mut self, cx: &PortCtx<'_>) {
        loop {
            let stream = match self.endpoint.accept() {
                Ok(Some(fd)) => UnixStream::from(fd),
                Ok(None) => return,
                Err(e) => {
                    warn!(port = %self.name, "accept failed: {e}");
                    return;
                }
            };
            if self.conn.is_some() {
                // One frontend per socket, as DPDK's vhost library does:
                // every other connection is closed at once, so a flood
                // holds nothing.
                debug!(port = %self.name, "refusing a second frontend connection");
                continue;
            }
            if let Err(e) = self.open(cx, stream) {
                warn!(port = %self.name, "{e}");
            }
        }
    }

    /// Drops the connection. `fault`: the frontend broke the protocol.
    fn disconnect(&mut self, cx: &PortCtx<'_>, reason: &str, fault: bool) {
        let Some(conn) = self.conn.take() else { return };
        cx.unwatch(conn.relay.fd());
        let was_up = lock(&conn.device).park();
        drop(conn);
        if fault {
            self.status.faults += 1;
            warn!(port = %self.name, "frontend broke the vhost-user protocol, disconnecting: {reason}");
        } else if was_up {
            info!(port = %self.name, "link down: {reason}");
        } else {
            info!(port = %self.name, "frontend disconnected: {reason}");
        }
        self.pairs_up.clear();
        self.status.link_up = false;
        self.status.rx_queues = 0;
        self.status.tx_queues = 0;
        self.status.peer = None;
        self.status.last_error = Some(reason.to_string());
        self.endpoint.lost();
    }

    /// The frontend sent bytes: every message they complete is handled,
    /// in order, and the replies go back.
    fn on_message(&mut self, cx: &PortCtx<'_>) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let res = conn.relay.receive().and_then(|msgs| {
            for m in msgs {
                handle(conn, &m)?;
            }
            conn.relay.flush()
        });
        if let Err(e) = res {
            let (reason, fault) = match e {
                RelayError::Closed => ("frontend closed the connection".to_string(), false),
                RelayError::Io(ref io)
                    if matches!(
                        io.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
                    ) =>
                {
                    ("frontend closed the connection".to_string(), false)
                }
                e => (format!("vhost-user request failed: {e}"), true),
            };
            return self.disconnect(cx, &reason, fault);
        }
        self.after_messages(cx);
    }

    /// Link state after the frontend's messages.
    fn after_messages(&mut self, cx: &PortCtx<'_>) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut dev = lock(&conn.device);
        let parked = dev.take_parked();
        let res = dev.activate();
        let features = dev.acked_features();
        drop(dev);
        match res {
            Ok(Activation::Up { pairs }) => {
                if !self.status.link_up {
                    self.status.connects += 1;
                    info!(port = %self.name, queue_pairs = pairs.len(), "link up");
                }
                self.log_pairs(pairs.clone());
                self.status.link_up = true;
                self.status.rx_queues = pairs.len();
                self.status.tx_queues = pairs.len();
                self.status.last_error = None;
                self.status.peer = Some(format!(
                    "virtio-net driver, features {:#x}",
                    features.unwrap_or(0)
                ));
            }
            Ok(Activation::Unchanged) => {
                if parked {
                    // Rings stopped and not (yet) restarted.
                    if self.status.link_up {
                        info!(port = %self.name, "link down: frontend stopped its queues");
                    }
                    self.log_pairs(Vec::new());
                    self.status.link_up = false;
                    self.status.rx_queues = 0;
                    self.status.tx_queues = 0;
                }
            }
            Err(reason) => self.disconnect(cx, &reason, true),
        }
    }
}

impl VhostUserPort {
    /// Logs each queue pair that came up or went down since the last call
    /// (a guest enables its pairs one by one, as its driver brings up
    /// queues on more CPUs).
    fn log_pairs(&mut self, now: Vec<usize>) {
        for p in now.iter().filter(|p| !self.pairs_up.contains(p)) {
            info!(port = %self.name, pair = p, rx_vring = 2 * p + 1, tx_vring = 2 * p, "queue pair up");
        }
        for p in self.pairs_up.iter().filter(|p| !now.contains(p)) {
            info!(port = %self.name, pair = p, "queue pair down");
        }
        self.pairs_up = now;
    }
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
        let mut reply = vec![0u8; HEADER_LEN + 8];
        reply[0..4].copy_from_slice(&REQ_SET_VRING_ENABLE.to_le_bytes());
        reply[4..8].copy_from_slice(&(FLAG_VERSION_1 | FLAG_REPLY).to_le_bytes());
        reply[8..12].copy_from_slice(&8u32.to_le_bytes());
        reply[12..20].copy_from_slice(&u64::from(res.is_err()).to_le_bytes());
        return Some(Ok(Some(reply)));
    }
    Some(res.map(|()| None))
}

impl Port for VhostUserPort {
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        self.endpoint.start(cx)?;
        if !self.endpoint.listens() {
            self.try_connect(cx);
        }
        Ok(())
    }

    fn on_ready(&mut self, cx: &PortCtx<'_>, sub: u32) {
        match sub {
            SUB_LISTENER => self.accept_all(cx),
            _ => self.on_message(cx),
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match &self.conn {
            Some(c) => c.relay.deadline(),
            None => self.endpoint.deadline(),
        }
    }

    fn on_timer(&mut self, cx: &PortCtx<'_>, now: Instant) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(e) = conn.relay.check(now) {
                self.disconnect(cx, &e.to_string(), true);
            }
            return;
        }
        if self.endpoint.retry_due(now) {
            self.try_connect(cx);
        }
    }

    fn on_fault(&mut self, cx: &PortCtx<'_>, reason: &str) {
        self.disconnect(cx, reason, true);
    }

    fn status(&self) -> PortStatus {
        self.status.clone()
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        self.disconnect(cx, "interface deleted", false);
        self.endpoint.stop(cx);
    }
}
