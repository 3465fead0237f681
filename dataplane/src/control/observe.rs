//! Captures and traces as the API serves them: each runs on its client's
//! connection thread (a [`StreamJob`]), never on the daemon loop.
//!
//! - A capture writes pcapng (or pcap) with `pcap-file` as the workers
//!   hand frames in, until its count, its duration, the client hanging up
//!   or the port going away; then it takes the hook out and, in pcapng,
//!   ends with an interface statistics block whose `isb_ifdrop` counts the
//!   frames it lost because the reader fell behind.
//! - A trace waits for its frames (or its timeout), takes the hook out and
//!   answers with one record per frame, port slots turned into names.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::interface_statistics::{
    InterfaceStatisticsBlock, InterfaceStatisticsOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::{DataLink, Endianness, TsResolution};
use switchyard_api::{
    CaptureFormat, CaptureInfo, Delivery, LearnOutcome, LookupOutcome, Response, TraceEntry,
    TraceOut,
};
use tracing::{info, warn};

use super::server::{send, StreamJob};
use crate::dataplane::Dataplane;
use crate::observe::{capture, Capture, CaptureFrame, Direction, Trace, TraceLearn, TraceLookup};
use crate::types::PortId;

/// How often a capture with nothing to write checks that its client is
/// still there.
const HANGUP_CHECK: Duration = Duration::from_millis(100);
/// How long a capture with nothing to write sleeps.
const IDLE_SLEEP: Duration = Duration::from_millis(1);

/// A running capture, streamed to its client.
pub struct CaptureJob {
    /// The data plane, to take the hook out at the end.
    pub dp: Dataplane,
    /// The capture, already started.
    pub cap: Arc<Capture>,
    /// What the answer line says.
    pub info: CaptureInfo,
    /// When to stop, if limited.
    pub deadline: Option<Instant>,
    /// Frames to write before stopping, if limited.
    pub count: Option<u64>,
}

/// Bytes written by a format writer, until [`Sink::flush`] sends them.
#[derive(Clone, Default)]
struct Pending(Rc<RefCell<Vec<u8>>>);

impl Write for Pending {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Format {
    Ng(PcapNgWriter<Pending>),
    Pcap(PcapWriter<Pending>),
}

/// A format writer and the connection its bytes go to.
struct Sink<'a> {
    format: Format,
    pending: Pending,
    conn: &'a UnixStream,
}

impl Sink<'_> {
    fn write(&mut self, f: &CaptureFrame) -> std::io::Result<()> {
        let r = match &mut self.format {
            Format::Ng(w) => w
                .write_pcapng_block(EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: f.timestamp,
                    original_len: f.orig_len,
                    data: Cow::Borrowed(&f.data),
                    // epb_flags bits 0-1: 01 inbound, 10 outbound (seen
                    // from the switch's port).
                    options: vec![EnhancedPacketOption::Flags(match f.direction {
                        Direction::Rx => 1,
                        Direction::Tx => 2,
                    })],
                })
                .map(drop),
            Format::Pcap(w) => w
                .write_packet(&PcapPacket::new(f.timestamp, f.orig_len, &f.data))
                .map(drop),
        };
        r.map_err(std::io::Error::other)
    }

    /// Sends what was written (blocking, within the connection's write
    /// timeout).
    fn flush(&mut self) -> std::io::Result<()> {
        let mut b = self.pending.0.borrow_mut();
        let r = self.conn.write_all(&b);
        b.clear();
        r
    }
}

/// True when the client closed its end (or the socket failed).
fn hung_up(conn: &UnixStream) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut b = [0u8; 1];
    match recv(
        conn.as_raw_fd(),
        &mut b,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => true,
        Ok(_) => false,
        Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => false,
        Err(_) => true,
    }
}

impl CaptureJob {
    fn stream(&self, conn: &UnixStream) -> std::io::Result<(u64, &'static str)> {
        let out = Pending::default();
        let snaplen = self.cap.snaplen();
        let format = match self.info.format {
            CaptureFormat::Pcapng => {
                // Big-endian: pcap-file 2.0 writes a little-endian
                // statistics block's timestamp with its halves swapped.
                let mut w = PcapNgWriter::with_endianness(out.clone(), Endianness::Big)
                    .map_err(std::io::Error::other)?;
                w.write_pcapng_block(InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen,
                    options: vec![
                        InterfaceDescriptionOption::IfName(Cow::Borrowed(&self.info.port)),
                        // Nanoseconds, as the frames' timestamps are written.
                        InterfaceDescriptionOption::IfTsResol(9),
                    ],
                })
                .map_err(std::io::Error::other)?;
                Format::Ng(w)
            }
            CaptureFormat::Pcap => Format::Pcap(
                PcapWriter::with_header(
                    out.clone(),
                    PcapHeader {
                        snaplen,
                        datalink: DataLink::ETHERNET,
                        ts_resolution: TsResolution::NanoSecond,
                        ..PcapHeader::default()
                    },
                )
                .map_err(std::io::Error::other)?,
            ),
        };
        let mut sink = Sink {
            format,
            pending: out.clone(),
            conn,
        };
        sink.flush()?;
        let mut written = 0u64;
        let mut last_check = Instant::now();
        let why = loop {
            let mut wrote = false;
            while let Some(f) = self.cap.pop() {
                let r = sink.write(&f);
                self.cap.recycle(f);
                r?;
                written += 1;
                wrote = true;
            }
            if wrote {
                sink.flush()?;
            }
            // The capture's claims stop it at `count` frames.
            if self.count.is_some_and(|c| written >= c) {
                break "count reached";
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                break "duration over";
            }
            // Only this job holds it: the port (and its hook) is gone.
            if Arc::strong_count(&self.cap) == 1 {
                break "port removed";
            }
            if self.dp.stopping() {
                break "the switch stopped or was taken over";
            }
            if last_check.elapsed() >= HANGUP_CHECK {
                if hung_up(conn) {
                    break "client closed";
                }
                last_check = Instant::now();
            }
            if !wrote {
                std::thread::sleep(IDLE_SLEEP);
            }
        };
        self.dp.stop_capture(&self.cap);
        // Frames handed in before the hook went out.
        while let Some(f) = self.cap.pop() {
            let r = sink.write(&f);
            self.cap.recycle(f);
            r?;
            written += 1;
        }
        if let Format::Ng(w) = &mut sink.format {
            let now = capture::now().as_nanos() as u64;
            w.write_pcapng_block(InterfaceStatisticsBlock {
                interface_id: 0,
                timestamp: now,
                options: vec![
                    InterfaceStatisticsOption::IsbIfDrop(self.cap.dropped()),
                    InterfaceStatisticsOption::IsbUsrDeliv(written),
                ],
            })
            .map_err(std::io::Error::other)?;
        }
        sink.flush()?;
        Ok((written, why))
    }
}

impl StreamJob for CaptureJob {
    fn run(self: Box<Self>, conn: &mut UnixStream) {
        info!(
            port = %self.info.port,
            snaplen = self.info.snaplen,
            "capture started"
        );
        if send(conn, &Response::ok(&self.info)).is_err() {
            self.dp.stop_capture(&self.cap);
            return;
        }
        match self.stream(conn) {
            Ok((written, why)) => info!(
                port = %self.info.port,
                written,
                lost = self.cap.dropped(),
                "capture ended: {why}"
            ),
            Err(e) => {
                self.dp.stop_capture(&self.cap);
                info!(
                    port = %self.info.port,
                    lost = self.cap.dropped(),
                    "capture ended: {e}"
                );
            }
        }
    }
}

/// A running trace, answered when done.
pub struct TraceJob {
    /// The data plane, to take the hook out and name ports.
    pub dp: Dataplane,
    /// The trace, already started.
    pub trace: Arc<Trace>,
    /// When to answer with what there is.
    pub deadline: Instant,
    /// The remote VTEP of each tunnel port, as the trace began.
    pub vteps: std::collections::HashMap<PortId, std::net::IpAddr>,
}

impl StreamJob for TraceJob {
    fn run(self: Box<Self>, conn: &mut UnixStream) {
        while !self.trace.claimed_all() && Instant::now() < self.deadline && !self.dp.stopping() {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Once out, no worker is inside a traced burst: every claimed
        // frame's record is in.
        self.dp.stop_trace(&self.trace);
        let name = |id: PortId| {
            self.dp
                .port_name(id)
                .unwrap_or_else(|| format!("#{id} (removed)"))
        };
        let entries: Vec<TraceEntry> = self
            .trace
            .drain()
            .into_iter()
            .map(|r| {
                let (learn, learn_port) = match r.learn {
                    TraceLearn::Skipped => (LearnOutcome::Skipped, None),
                    TraceLearn::Multicast => (LearnOutcome::Multicast, None),
                    TraceLearn::Known => (LearnOutcome::Known, None),
                    TraceLearn::Refreshed => (LearnOutcome::Refreshed, None),
                    TraceLearn::New => (LearnOutcome::New, None),
                    TraceLearn::Moved(p) => (LearnOutcome::Moved, Some(name(p))),
                    TraceLearn::Evicted(p) => (LearnOutcome::Evicted, Some(name(p))),
                    TraceLearn::TableFull => (LearnOutcome::TableFull, None),
                };
                let (lookup, lookup_port) = match r.lookup {
                    TraceLookup::Skipped => (LookupOutcome::Skipped, None),
                    TraceLookup::Unicast(p) => (LookupOutcome::Unicast, Some(name(p))),
                    TraceLookup::Unknown => (LookupOutcome::Unknown, None),
                    TraceLookup::Multicast => (LookupOutcome::Multicast, None),
                    TraceLookup::Answered => (LookupOutcome::Answered, None),
                };
                TraceEntry {
                    worker: usize::from(r.worker),
                    in_port: name(r.in_port),
                    in_vtep: self.vteps.get(&r.in_port).copied(),
                    len: r.len,
                    src: r.src.to_string(),
                    dst: r.dst.to_string(),
                    tag: r.tag,
                    vlan: r.vlan,
                    learn,
                    learn_port,
                    lookup,
                    lookup_port,
                    out: r
                        .out
                        .iter()
                        .map(|(p, res)| TraceOut {
                            port: name(*p),
                            vtep: self.vteps.get(p).copied(),
                            result: match res {
                                Ok(()) => Delivery::Sent,
                                Err(d) => Delivery::Dropped(*d),
                            },
                        })
                        .collect(),
                    drop: r.drop,
                    policy: r.policy,
                }
            })
            .collect();
        if send(conn, &Response::ok(&entries)).is_err() {
            warn!("trace: the client left before the answer");
        }
    }
}
