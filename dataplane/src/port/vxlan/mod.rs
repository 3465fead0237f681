//! vxlan ports: a VXLAN tunnel (RFC 7348) to one remote VTEP, through the
//! host's IP stack.
//!
//! A tunnel is a port of its bridge, as VPP's `vxlan_tunnel` and an Open
//! vSwitch `vxlan` port are: MACs behind the remote VTEP are learned on it,
//! flooded frames reach every tunnel (head-end replication), its counters,
//! captures and traces are the tunnel's. The tunnels of a bridge form a
//! full mesh, so a frame from one is never sent to another (split horizon,
//! [`PortCtx::set_split_horizon`]).
//!
//! Underlay: a kernel UDP socket per local address and port, which every
//! tunnel from that address shares ([`underlay`]); the kernel routes the
//! packets and resolves their next hop, over whatever the host's network
//! is (a routed fabric, another tunnel, IPsec). Packets never fragment: a
//! frame longer than the path's MTU allows (less 50 bytes of headers over
//! IPv4, 70 over IPv6) is dropped and counted as `too_long`; the port's
//! status shows the MTU to give the pods behind it.
//!
//! Files: `underlay.rs` the shared socket, its tunnels and which of them
//! reads it; `queues.rs` the receive queue (for every tunnel of a socket)
//! and the transmit queues (a tunnel's).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use switchyard_api::{PortStatus, VxlanSpec};
use tracing::{info, warn};

use crate::port::kernel::netdev::{readable, status_with_mtu};
use crate::port::takeover::{FdIn, FdOut, Saved};
use crate::port::registry::Build;
use crate::port::{Port, PortCtx, PortError, QueueLink, Start};
use crate::queue::offload::MAX_HDR;
use crate::queue::{
    Offload, PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue, BURST_SIZE,
};
use crate::types::PortId;
use crate::wire::ethernet::HEADER_LEN as ETH_HEADER_LEN;
use crate::wire::vxlan;

mod persist;
mod queues;
mod underlay;

use queues::{TunnelEnd, VxlanRx, VxlanTx, MAX_FRAME};
use underlay::{Member, Tunnels, Underlay, UnderlayError};

/// How often the path to the remote VTEP is looked at (its MTU, a route).
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Bytes asked for each direction of a shared socket's buffers.
const SOCKET_BUFFER: libc::c_int = 4 << 20;
/// The path MTU taken until the kernel says (an Ethernet underlay's).
const DEFAULT_PATH_MTU: u32 = 1500;

/// A vxlan port, not started yet.
pub fn port(spec: &VxlanSpec, b: &Build<'_>) -> Box<dyn Port> {
    let name = b.name();
    Box::new(VxlanPort {
        name: name.to_string(),
        spec: spec.clone(),
        id: None,
        underlay: None,
        max_frame: Arc::new(AtomicU32::new(0)),
        mtu: Arc::new(AtomicU32::new(0)),
        check_at: None,
        status: PortStatus::default(),
    })
}

/// A tunnel to one remote VTEP.
struct VxlanPort {
    name: String,
    spec: VxlanSpec,
    /// Its slot, once started.
    id: Option<PortId>,
    /// The socket it sends and receives on, while started.
    underlay: Option<Arc<Underlay>>,
    /// The longest frame a packet may carry on the path (see
    /// [`TunnelEnd::max_frame`]).
    max_frame: Arc<AtomicU32>,
    /// The MTU for the pods behind the tunnel: the path's less the
    /// headers (`max_frame` less an Ethernet header).
    mtu: Arc<AtomicU32>,
    check_at: Option<Instant>,
    status: PortStatus,
}

impl VxlanPort {
    fn local(&self) -> SocketAddr {
        SocketAddr::new(self.spec.local, self.spec.port())
    }

    fn remote(&self) -> SocketAddr {
        SocketAddr::new(self.spec.remote, self.spec.port())
    }

    /// Joins the socket of the local address (`handed`: the one a
    /// takeover brought) and hands the queues to the workers.
    fn join(&mut self, cx: &PortCtx<'_>, handed: Option<OwnedFd>) -> Result<(), PortError> {
        let err = |e: UnderlayError| PortError::Other(format!("vxlan: {e}"));
        self.refresh_path();
        let u = underlay::join(self.local(), handed).map_err(err)?;
        u.add(Member {
            id: cx.id,
            name: self.name.clone(),
            link: cx.link(),
            end: TunnelEnd {
                remote: self.remote(),
                vni: self.spec.vni,
                max_frame: self.max_frame.clone(),
                workers: cx.dp.workers(),
            },
        })
        .map_err(err)?;
        cx.set_split_horizon();
        self.status.link_up = true;
        self.status.peer = Some(format!(
            "vxlan to {} vni {} from {}",
            self.remote(),
            self.spec.vni,
            self.local()
        ));
        self.status.tx_queues = cx.dp.workers().max(1);
        self.underlay = Some(u);
        self.id = Some(cx.id);
        Ok(())
    }

    /// Reads the path's MTU again (a route may have come or gone).
    fn refresh_path(&mut self) {
        self.check_at = Some(Instant::now() + CHECK_EVERY);
        let headers = if self.spec.remote.is_ipv4() {
            vxlan::UDP_IPV4_LEN
        } else {
            vxlan::UDP_IPV6_LEN
        } + vxlan::HEADER_LEN;
        let path = match underlay::path_mtu(self.local(), self.remote()) {
            Ok(m) => {
                if self.status.last_error.take().is_some() {
                    info!(port = %self.name, remote = %self.spec.remote, "route to the remote VTEP");
                }
                m
            }
            Err(e) => {
                let why = format!("no route to {}: {e}", self.spec.remote);
                if self.status.last_error.as_deref() != Some(why.as_str()) {
                    warn!(port = %self.name, "{why}");
                    self.status.last_error = Some(why);
                }
                match self.max_frame.load(Ordering::Relaxed) {
                    0 => DEFAULT_PATH_MTU,
                    _ => return,
                }
            }
        };
        let frame = (path as usize).saturating_sub(headers).min(MAX_FRAME);
        let before = self.max_frame.swap(frame as u32, Ordering::Relaxed);
        let mtu = frame.saturating_sub(ETH_HEADER_LEN) as u32;
        self.mtu.store(mtu, Ordering::Relaxed);
        if before as usize != frame {
            info!(port = %self.name, remote = %self.spec.remote, path_mtu = path, mtu, "MTU for the pods behind the tunnel");
        }
    }
}

impl Port for VxlanPort {
    fn start(&mut self, cx: &PortCtx<'_>, _: Start) -> Result<(), PortError> {
        self.join(cx, None)?;
        self.status.connects += 1;
        info!(port = %self.name, remote = %self.spec.remote, vni = self.spec.vni, local = %self.local(), "vxlan tunnel up");
        Ok(())
    }

    fn on_ready(&mut self, _: &PortCtx<'_>, _: u32) {}

    fn deadline(&self) -> Option<Instant> {
        self.check_at
    }

    fn on_timer(&mut self, _: &PortCtx<'_>, now: Instant) {
        if self.check_at.is_some_and(|t| now >= t) {
            self.refresh_path();
        }
    }

    fn on_fault(&mut self, _: &PortCtx<'_>, reason: &str) {
        // The queues read the kernel's socket, no peer's memory.
        warn!(port = %self.name, "vxlan queue fault: {reason}");
    }

    fn status(&self) -> PortStatus {
        let mut s = status_with_mtu(&self.status, &self.mtu);
        s.rx_queues = usize::from(
            self.underlay
                .as_ref()
                .zip(self.id)
                .is_some_and(|(u, id)| u.reads_for(id)),
        );
        s
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        match self.underlay.take() {
            Some(u) => u.remove(cx.id, || cx.detach()),
            None => cx.detach(),
        }
        self.status.link_up = false;
        self.check_at = None;
    }

    fn save(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Saved, PortError> {
        crate::port::save_as(self, cx, fds)
    }

    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError> {
        crate::port::restore_as(self, cx, saved, fds)
    }
}
