//! af-xdp ports: an existing kernel interface as an uplink through AF_XDP
//! sockets, one per queue, each with its own UMEM.
//!
//! The XDP program that redirects the interface's frames to the sockets is
//! ours ([`prog`]: it puts back VLAN tags the driver holds outside the
//! data); the sockets and UMEMs are libxdp's, opened at run time
//! (`libxdp.so.1`, Debian's `libxdp1`), so a machine without it gets a clear
//! error on this kind and nothing else changes.
//!
//! Mode: native XDP with zero-copy where the driver has it, native with
//! copy next, generic (skb) XDP otherwise; the port logs and shows which.
//!
//! UMEM: the first half of each UMEM's frames feeds the fill ring
//! (receive), the second half is the transmit pool. Receive reads frames in
//! place and gives their buffers back to the fill ring at release; transmit
//! copies once into a pool frame and kicks the kernel once per burst. Its
//! memory is a sealed memfd mapped shared, so that a takeover can hand it
//! over with the socket, the program and where each ring stands; the next
//! switch maps the same pages and the rings again (`xsk::adopt`).
//!
//! Files: `xsk.rs` loads libxdp and opens the sockets and UMEMs;
//! `rings.rs` holds the queues over their rings; `prog.rs` the XDP program;
//! this file the [`Uplink`] that opens them on the interface.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};
use switchyard_api::{AfXdpSpec, XdpMode};
use tracing::{info, warn};

use crate::dataplane::QueuePositions;
use crate::port::kernel::netdev::{
    self, exceeds_mtu, pad_short, rx_vlan_offload, set_rx_vlan_offload,
};
use crate::port::kernel::{Interface, KernelIf, Uplink};
use crate::port::takeover::{FdIn, FdOut, TakeoverError};
use crate::port::registry::Build;
use crate::port::Port;
use crate::queue::offload::MAX_HDR;
use crate::queue::{
    Offload, PortQueues, QueueFault, RxBurst, RxQueue, TxError, TxFrame, TxQueue, BURST_SIZE,
    MAX_SEGS,
};
use crate::wire::ethernet::HEADER_LEN as ETH_HEADER_LEN;

mod persist;
mod prog;
mod rings;
mod xsk;

use prog::XdpProgram;
use rings::{XdpDesc, XdpRx, XdpTx, XskRing};
use xsk::*;

/// Bytes of a UMEM frame.
const FRAME: u64 = 4096;
/// Frames per UMEM (half receive, half transmit).
const FRAMES: u64 = 4096;
/// Descriptors per ring.
const RING: u32 = 2048;
/// How long a busy queue is waited for, in 10 ms tries (see `open_queue`).
const BUSY_TRIES: u32 = 20;

/// An af-xdp port: its sockets on a followed kernel interface.
/// `carries_tags`: whether its frames carry VLAN tags (it is a trunk of
/// some VLAN), which it then refuses to lose.
pub fn port(spec: &AfXdpSpec, b: &Build<'_>) -> Box<dyn Port> {
    let (name, carries_tags) = (b.name(), b.carries_tags());
    let uplink = AfXdp {
        name: name.to_string(),
        spec: spec.clone(),
        rx_vlan_restore: false,
        prog: None,
        open: Vec::new(),
        mode: None,
        partial_checksums: false,
        carries_tags,
    };
    Box::new(KernelIf::new(name, &spec.interface, uplink))
}

/// How an af-xdp port opens its queues, and what it changes on the
/// interface meanwhile.
struct AfXdp {
    name: String,
    spec: AfXdpSpec,
    /// Whether this port turned the interface's receive VLAN offload off
    /// (and puts it back when it lets the interface go).
    rx_vlan_restore: bool,
    /// The XDP program that sends the interface's frames to the sockets.
    prog: Option<XdpProgram>,
    /// The sockets open, in queue order: kept to hand over.
    open: Vec<Arc<Xsk>>,
    /// Their mode.
    mode: Option<Mode>,
    /// Whether their receive queues look for checksums left to finish.
    partial_checksums: bool,
    /// Whether the port carries VLAN tags (a trunk of some VLAN).
    carries_tags: bool,
}

/// How the port list names the peer of a port with sockets in `mode` on
/// `ifname`; `restored`: the program puts back tags the driver holds.
fn describe(ifname: &str, mode: Mode, restored: bool) -> String {
    let tags = if restored {
        "VLAN tags the driver holds put back"
    } else {
        "VLAN tags as in the data"
    };
    format!(
        "kernel interface {ifname} (af-xdp, {}, {tags})",
        mode.name()
    )
}

impl AfXdp {
    /// Receive VLAN stripping off while the port owns the interface: an
    /// XDP program sees only the frame's data, so a tag the NIC strips into
    /// its descriptor never reaches the switch (ixgbe, i40e, ice, mlx5 strip
    /// by default). With stripping off the tag stays in the data; the
    /// host's own VLAN interfaces untag in software. Put back when the port
    /// lets the interface go.
    fn own_rx_vlan(&mut self) {
        let ifname = &self.spec.interface;
        // Off already, or no such feature: tags stay in the data.
        if !rx_vlan_offload(ifname).unwrap_or(false) {
            return;
        }
        match set_rx_vlan_offload(ifname, false) {
            Ok(()) => {
                self.rx_vlan_restore = true;
                info!(port = %self.name, interface = %ifname, "receive VLAN offload off while the port owns the interface");
            }
            Err(e) => warn!(
                port = %self.name, interface = %ifname,
                "cannot turn receive VLAN offload off ({e}): VLAN tags the interface strips do not reach the switch; run `ethtool -K {ifname} rxvlan off` or use kind af-packet"
            ),
        }
    }

    fn release_rx_vlan(&mut self) {
        if std::mem::take(&mut self.rx_vlan_restore) {
            // The interface may be gone; nothing to put back then.
            let _ = set_rx_vlan_offload(&self.spec.interface, true);
        }
    }
}

impl Uplink for AfXdp {
    const KIND: &'static str = "af-xdp";
    const REOPEN_ON_MTU: bool = false;

    /// The program, then a socket per queue in the first mode that works.
    fn open(&mut self, at: &Interface<'_>) -> io::Result<(PortQueues, String)> {
        let (ifname, index, mtu) = (at.name, at.index, at.mtu);
        // Each time: an interface made again strips by default.
        self.own_rx_vlan();
        let n = u32::from(self.spec.queues.unwrap_or(1));
        let c = CString::new(ifname).map_err(io::Error::other)?;
        let mut errors = Vec::new();
        // The program stays attached from one mode to the next while the
        // XDP mode (native or generic) is the same: only the sockets differ.
        let mut prog: Option<(bool, XdpProgram)> = None;
        let mut opened = None;
        // Native XDP on a veth takes its peer's segmentation offloads away
        // while a program is attached (the kernel's `veth_xdp_set` clears
        // the peer's `NETIF_F_GSO_SOFTWARE`): the pod or host behind it
        // then cuts every TCP packet itself, and the switch forwards
        // 1500-byte frames. Generic XDP leaves the peer as it is, and the
        // multi-buffer sockets take its 64 KB super-frames whole (TCP in
        // benches/loop/tcp_bench.py: 6.3 Gbit/s against 3.9, for the same
        // small-frame rate). A trunk keeps native XDP first: only there
        // does the program get back VLAN tags the veth holds beside the
        // data.
        let driver = netdev::driver(ifname);
        let generic_first = !self.carries_tags && matches!(driver.as_deref(), Ok("veth"));
        for &mode in modes(self.spec.mode.unwrap_or_default(), generic_first) {
            let native = mode != Mode::Generic;
            if prog
                .as_ref()
                .is_none_or(|(was_native, _)| *was_native != native)
            {
                // One program on the interface at a time: the old one goes
                // before the new one is attached.
                prog = None;
                match attach_program(&c, index, n, native) {
                    Ok(p) => prog = Some((native, p)),
                    Err(e) => {
                        tracing::debug!(interface = %ifname, mode = mode.name(), "no XDP program: {e}");
                        errors.push(e);
                        continue;
                    }
                }
            }
            let (_, p) = prog.as_ref().expect("attached above");
            match open_sockets(&c, n, mode, p) {
                Ok(s) => {
                    opened = Some((s, mode));
                    break;
                }
                Err(e) => {
                    tracing::debug!(interface = %ifname, mode = mode.name(), "no AF_XDP sockets: {e}");
                    errors.push(e);
                }
            }
        }
        let (Some((sockets, mode)), Some((_, prog))) = (opened, prog) else {
            return Err(most_telling(errors));
        };
        // Tags reach the switch if they stay in the data (no receive
        // stripping) or the program puts back what the driver holds.
        let restored = prog.restores_vlan_tags && prog::driver_gives_vlan_tags(index);
        if self.carries_tags && !restored && rx_vlan_offload(ifname).unwrap_or(false) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the interface strips received VLAN tags (rx-vlan-offload stays on) and gives XDP no tag in {}: this trunk's VLANs would arrive untagged; run `ethtool -K {ifname} rxvlan off` or use kind af-packet",
                    mode.name()
                ),
            ));
        }
        // Interfaces that carry the host's own frames can hand them over
        // with the checksum left to the device (`CHECKSUM_PARTIAL`), which
        // XDP does not say: a veth (its peer's transmit checksum offload),
        // a tun/tap, a netkit. A NIC's received frames are complete.
        let partial_checksums = matches!(
            driver.as_deref(),
            Ok("veth" | "tun" | "netkit") | Err(_)
        );
        let mut q = PortQueues::default();
        self.open.clear();
        for (xsk, [fill, comp, rx, tx]) in sockets {
            self.open.push(xsk.clone());
            let mut r = XdpRx {
                xsk: xsk.clone(),
                fill,
                rx,
                taken: Vec::with_capacity(BURST_SIZE * MAX_SEGS),
                released: rx.cached_cons,
                partial_checksums,
                mtu: mtu.clone(),
            };
            r.refill((0..FRAMES / 2).map(|i| i * FRAME));
            q.rx.push(Box::new(r));
            q.tx.push(Box::new(XdpTx {
                xsk,
                tx,
                comp,
                pool: (FRAMES / 2..FRAMES).map(|i| i * FRAME).collect(),
                queued: false,
                mtu: mtu.clone(),
            }));
        }
        self.prog = Some(prog);
        self.mode = Some(mode);
        self.partial_checksums = partial_checksums;
        Ok((q, describe(ifname, mode, restored)))
    }

    fn closed(&mut self) {
        self.prog = None;
        self.open.clear();
    }

    type Saved = persist::SavedQueues;

    fn save(
        &self,
        positions: QueuePositions,
        fds: &mut FdOut,
    ) -> Result<persist::SavedQueues, String> {
        self.save_queues(positions, fds)
    }

    /// The program, the sockets and their UMEMs, each ring where it stood;
    /// the UMEMs and rings are mapped again.
    fn restore(
        &mut self,
        at: &Interface<'_>,
        saved: persist::SavedQueues,
        fds: &mut FdIn,
    ) -> Result<(PortQueues, String), TakeoverError> {
        self.restore_queues(at, saved, fds)
    }

    fn release(&mut self) {
        self.release_rx_vlan();
    }

    fn hint(e: &io::Error) -> &'static str {
        match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => {
                " (AF_XDP needs CAP_NET_RAW, CAP_NET_ADMIN and CAP_BPF)"
            }
            Some(libc::EAFNOSUPPORT) => {
                " (the kernel has no AF_XDP: CONFIG_XDP_SOCKETS; use kind af-packet)"
            }
            _ => "",
        }
    }
}
