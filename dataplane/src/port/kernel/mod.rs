//! The one uplink port: what af-packet and af-xdp share, written once.
//! A [`KernelIf`] follows an existing kernel interface (it may be missing
//! at start, go away, come back as a new interface, change its MTU) and
//! keeps the port's [`PortStatus`]; an uplink kind adds only how it opens
//! queues on the interface, its [`Uplink`]. Its takeover is `persist.rs`;
//! [`netdev`] holds what every port on a kernel interface uses (its index,
//! MTU, offload ioctls, frame I/O).

pub mod netdev;
mod persist;

pub use persist::{queue_position, SavedKernelIf};

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use switchyard_api::PortStatus;

use crate::dataplane::QueuePositions;
use crate::port::takeover::{FdIn, FdOut, Saved, TakeoverError};
use crate::port::{Port, PortCtx, PortError, Start};
use crate::queue::PortQueues;
use netdev::{ifindex, read_mtu, status_with_mtu};

/// How often the interface is looked at: there, the same one, its MTU.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// An uplink kind's way onto its kernel interface: all that a kind adds to
/// [`KernelIf`].
pub trait Uplink: Send {
    /// The kind's name, for logs.
    const KIND: &'static str;
    /// Whether a new MTU needs the queues opened again (af-packet sizes its
    /// ring slots by it).
    const REOPEN_ON_MTU: bool;

    /// Opens the queues on the interface, returning them and how the port
    /// list names the peer.
    fn open(&mut self, at: &Interface<'_>) -> io::Result<(PortQueues, String)>;
    /// The queues were taken back: drop what `open` kept beside them.
    fn closed(&mut self) {}
    /// Leaves the interface as the kind found it (the port stops, or its
    /// start failed).
    fn release(&mut self) {}
    /// What to add to an error of `open` at start (a capability it needs).
    fn hint(_e: &io::Error) -> &'static str {
        ""
    }
    /// The open queues as saved for a takeover (the kind's `persist.rs`).
    type Saved: serde::Serialize + serde::de::DeserializeOwned;
    /// Writes the open queues down for a takeover (see [`Port::save`]):
    /// their fds into `fds`; where each queue stands is in `positions`
    /// ([`queue_position`]). `Err` refuses the takeover, saying why.
    fn save(&self, positions: QueuePositions, fds: &mut FdOut) -> Result<Self::Saved, String>;
    /// Takes up the queues another process saved with [`Uplink::save`] on
    /// the interface, where they stood; returns them as `open` does.
    fn restore(
        &mut self,
        at: &Interface<'_>,
        saved: Self::Saved,
        fds: &mut FdIn,
    ) -> Result<(PortQueues, String), TakeoverError>;
}

/// The interface an [`Uplink`] opens its queues on.
pub struct Interface<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its index, as the port found it.
    pub index: u32,
    /// Its MTU, kept current for the queues (the port reads it again every
    /// [`CHECK_EVERY`]).
    pub mtu: &'a Arc<AtomicU32>,
}

/// A port on a kernel interface, through uplink kind `U`.
pub struct KernelIf<U: Uplink> {
    pub(super) name: String,
    pub(super) interface: String,
    pub(super) uplink: U,
    pub(super) mtu: Arc<AtomicU32>,
    /// The interface index the queues are open on.
    pub(super) open: Option<u32>,
    pub(super) check_at: Option<Instant>,
    pub(super) status: PortStatus,
}

impl<U: Uplink> KernelIf<U> {
    /// Port `name` on interface `interface`, not started yet.
    pub fn new(name: &str, interface: &str, uplink: U) -> KernelIf<U> {
        KernelIf {
            name: name.to_string(),
            interface: interface.to_string(),
            uplink,
            mtu: Arc::new(AtomicU32::new(1500)),
            open: None,
            check_at: None,
            status: PortStatus::default(),
        }
    }

    /// Opens the queues and hands them to the workers.
    fn open(&mut self, cx: &PortCtx<'_>) -> io::Result<()> {
        let ifname = &self.interface;
        let index = ifindex(ifname)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such interface"))?;
        self.mtu.store(read_mtu(ifname)?, Ordering::Relaxed);
        let at = Interface {
            name: ifname,
            index,
            mtu: &self.mtu,
        };
        let (q, peer) = self.uplink.open(&at)?;
        let queues = q.rx.len();
        cx.attach(q);
        self.open = Some(index);
        self.status.link_up = true;
        self.status.connects += 1;
        self.status.rx_queues = queues;
        self.status.tx_queues = queues;
        self.status.last_error = None;
        info!(port = %self.name, interface = %ifname, queues, %peer, "{} link up", U::KIND);
        self.status.peer = Some(peer);
        Ok(())
    }

    fn close(&mut self, cx: &PortCtx<'_>, why: &str) {
        if self.open.take().is_some() {
            cx.detach();
            self.uplink.closed();
            info!(port = %self.name, interface = %self.interface, "link down: {why}");
        }
        self.status.link_up = false;
        self.status.rx_queues = 0;
        self.status.tx_queues = 0;
        self.status.peer = None;
        self.status.last_error = Some(why.to_string());
    }

    /// Opens again, keeping why it failed.
    fn reopen(&mut self, cx: &PortCtx<'_>) {
        if let Err(e) = self.open(cx) {
            warn!(port = %self.name, "cannot open {}: {e}", self.interface);
            self.status.last_error = Some(e.to_string());
        }
    }
}

impl<U: Uplink> Port for KernelIf<U> {
    fn start(&mut self, cx: &PortCtx<'_>, start: Start) -> Result<(), PortError> {
        self.check_at = Some(Instant::now() + CHECK_EVERY);
        if start == Start::Waiting && ifindex(&self.interface).is_none() {
            let why = format!("waiting for interface {}", self.interface);
            warn!(port = %self.name, "{why}");
            self.status.last_error = Some(why);
            return Ok(());
        }
        self.open(cx).map_err(|e| {
            // No port is made: the interface is left as it was.
            self.uplink.release();
            PortError::Other(format!("{}: {e}{}", self.interface, U::hint(&e)))
        })
    }

    fn on_ready(&mut self, _: &PortCtx<'_>, _: u32) {}

    fn deadline(&self) -> Option<Instant> {
        self.check_at
    }

    fn on_timer(&mut self, cx: &PortCtx<'_>, now: Instant) {
        if self.check_at.is_none_or(|t| now < t) {
            return;
        }
        self.check_at = Some(now + CHECK_EVERY);
        match (self.open, ifindex(&self.interface)) {
            (Some(open), Some(i)) if open == i => {
                if let Ok(m) = read_mtu(&self.interface) {
                    if self.mtu.swap(m, Ordering::Relaxed) != m && U::REOPEN_ON_MTU {
                        self.close(cx, "MTU changed");
                        self.reopen(cx);
                    }
                }
            }
            (Some(_), Some(_)) => {
                self.close(cx, "the interface was made again");
                self.reopen(cx);
            }
            (Some(_), None) => self.close(cx, "the interface went away"),
            (None, Some(_)) => self.reopen(cx),
            (None, None) => {}
        }
    }

    fn on_fault(&mut self, _: &PortCtx<'_>, reason: &str) {
        warn!(port = %self.name, "{} queue fault: {reason}", U::KIND);
    }

    fn status(&self) -> PortStatus {
        status_with_mtu(&self.status, &self.mtu)
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        self.close(cx, "port deleted");
        self.uplink.release();
        self.check_at = None;
    }

    fn save(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Saved, PortError> {
        crate::port::save_as(self, cx, fds)
    }

    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError> {
        crate::port::restore_as(self, cx, saved, fds)
    }
}
