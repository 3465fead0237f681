//! The control protocol: requests, answers and what they carry.
//!
//! A client connects to the control socket (`SOCK_STREAM`) and sends one JSON
//! object per line; the daemon answers each with one JSON line, in order.
//!
//! Requests carry an `op`:
//!
//! | op | fields | result |
//! |---|---|---|
//! | `ping` | – | `{"version": ...}` |
//! | `port_add` | `port`: a [`PortSpec`] | [`PortInfo`] |
//! | `port_del` | `name` | `null` |
//! | `port_set` | `name`, `ips`, `policy`, `rate_limit` (each optional but `name`) | `null` |
//! | `port_list` | – | `[PortInfo]` |
//! | `stats` | `name` (optional) | `[PortStats]` |
//! | `bridge_add` | `name` | `null` |
//! | `bridge_del` | `name` | `null` |
//! | `bridge_list` | – | `[BridgeInfo]` |
//! | `mac_list` | `bridge` | `[MacInfo]` |
//! | `worker_list` | – | `[WorkerInfo]` |
//! | `capture` | `port`, `direction`, `count`, `snaplen`, `format`, `duration_ms` (all but `port` optional) | [`CaptureInfo`], then the capture's bytes |
//! | `trace` | `count`, `port`, `timeout_ms` (optional) | `[TraceEntry]` |
//!
//! Answers: `{"ok": true, "result": ...}` or
//! `{"ok": false, "error": {"code": "not_found", "message": "..."}}`.
//!
//! `capture` and `trace` end their connection. A capture's answer line is
//! followed by a pcapng (or pcap) stream of the port's frames until `count`
//! frames, `duration_ms` or the client closing the connection; a pcapng
//! stream ends with an interface statistics block counting the frames the
//! capture lost because its reader fell behind (`isb_ifdrop`). A trace
//! answers once `count` frames were traced or `timeout_ms` (10 s by
//! default) passed, with what it has.

use serde::{Deserialize, Serialize};

use crate::spec::PortSpec;

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Liveness check.
    Ping,
    /// Creates a port (persisted).
    PortAdd {
        /// The port (boxed: the other requests are small).
        port: Box<PortSpec>,
    },
    /// Deletes a port.
    PortDel {
        /// Port name.
        name: String,
    },
    /// Replaces a port's station addresses and L3/L4 policy, each that is
    /// given (persisted; an empty list or policy takes it away): every
    /// frame after is judged by the new rules, none by a mix.
    PortSet {
        /// Port name.
        name: String,
        /// The station's IP addresses ([`PortSpec::ips`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ips: Option<Vec<std::net::IpAddr>>,
        /// Its policy ([`PortSpec::policy`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<crate::policy::PortPolicy>,
        /// Its policers ([`PortSpec::rate_limit`]; both directions are
        /// replaced: one absent is not limited).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate_limit: Option<crate::spec::RateLimits>,
    },
    /// Lists ports.
    PortList,
    /// Counters of one port or all.
    Stats {
        /// Port name.
        #[serde(default)]
        name: Option<String>,
    },
    /// Creates a bridge (persisted).
    BridgeAdd {
        /// Bridge name.
        name: String,
    },
    /// Deletes an empty bridge.
    BridgeDel {
        /// Bridge name.
        name: String,
    },
    /// Lists bridges.
    BridgeList,
    /// Learned MACs of a bridge.
    MacList {
        /// Bridge name.
        bridge: String,
    },
    /// Workers and their load.
    WorkerList,
    /// Captures a port's frames (the connection then carries the capture).
    Capture {
        /// Port name.
        port: String,
        /// Frames received from the peer, sent to it, or both (default).
        #[serde(default)]
        direction: CaptureDirection,
        /// Stop after this many frames.
        #[serde(default)]
        count: Option<u64>,
        /// Bytes kept of each frame (default 262144, tcpdump's).
        #[serde(default)]
        snaplen: Option<u32>,
        /// File format (default pcapng).
        #[serde(default)]
        format: CaptureFormat,
        /// Stop after this long.
        #[serde(default)]
        duration_ms: Option<u64>,
    },
    /// Traces the forwarding decisions for the next frames.
    Trace {
        /// Frames to trace (default 10, at most 10000).
        #[serde(default)]
        count: Option<u32>,
        /// Only frames coming in on this port.
        #[serde(default)]
        port: Option<String>,
        /// Answer with what was traced after this long (default 10 s).
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// A new switch process asks to take over this one's ports, with their
    /// connections (`switchyard run --takeover`). The connection then
    /// carries the handover (state and file descriptors), not JSON answers.
    Takeover {
        /// The version of the handover state the new process reads.
        version: u32,
        /// The new process takes the ports that cannot change meanwhile
        /// (no connection) before the old one pauses (a `prepare` step),
        /// so that the pause covers only the others. Switches before it
        /// neither send nor know the field: a new switch that finds the
        /// running one refuses it asks again without.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        prepare: bool,
    },
    /// Stops the switch (its ports, then the process) so that another can
    /// start in its place: what a new switch whose takeover was refused
    /// falls back to, a restart.
    StandDown,
    /// Joins an overlay of the config to a remote VTEP (another node): its
    /// tunnels, one per VNI, persisted. Adding a VTEP the overlay has is no
    /// error: its tunnels stay as they are, or are made again from `local`
    /// when they leave from another address.
    VtepAdd {
        /// The overlay's name.
        overlay: String,
        /// The remote VTEP's address.
        remote: std::net::IpAddr,
        /// The address the tunnels leave from: this node's VTEP as the
        /// other nodes know it (on a node with several addresses, the one
        /// the route to `remote` leaves from may be another, and the remote
        /// end drops what it does not expect). Unset: the overlay's
        /// `local`, else the route's source address. Switches before it
        /// refuse the field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        local: Option<std::net::IpAddr>,
    },
    /// Takes a remote VTEP out of an overlay: its tunnels go, and the MACs
    /// learned on them.
    VtepDel {
        /// The overlay's name.
        overlay: String,
        /// The remote VTEP's address.
        remote: std::net::IpAddr,
    },
    /// The remote VTEPs of every overlay.
    VtepList,
    /// Gives this node slice `slice` of an overlay's addresses (daemon
    /// config `ipam`), or none: what the node agent claimed for it in the
    /// cluster. Persisted; the CNI plugin hands out its addresses to the
    /// networks on the overlay that name no IPAM of their own.
    OverlaySlice {
        /// The overlay's name.
        overlay: String,
        /// The slice; unset: none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slice: Option<u32>,
    },
    /// The stations behind remote VTEP `remote` of an overlay (the remote
    /// node's pods on it, as the node agent knows them from the cluster),
    /// replacing those it had: their MACs are pinned to the VTEP's tunnel
    /// (of their VLAN), and the overlay's bridge answers ARP requests and
    /// neighbour solicitations for their addresses itself. Handed over at
    /// a takeover, not persisted: given again after a restart (a VTEP's
    /// `stations` says how many the switch has).
    VtepStations {
        /// The overlay's name.
        overlay: String,
        /// The remote VTEP's address (its tunnels need not exist yet).
        remote: std::net::IpAddr,
        /// Every station behind it.
        stations: Vec<RemoteStation>,
    },
    /// [`Request::VtepStations`] for several remote VTEPs of an overlay at
    /// once (each replacing what it had; the others keep theirs): the
    /// bridge's neighbours are made again once, not once a VTEP, as a node
    /// agent joining a cluster of a thousand nodes needs. Every set is
    /// checked before any is taken (an error names `sets[i]`).
    VtepStationSets {
        /// The overlay's name.
        overlay: String,
        /// Each VTEP's stations.
        sets: Vec<StationSet>,
    },
}

/// The stations behind one remote VTEP ([`Request::VtepStationSets`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StationSet {
    /// The remote VTEP's address.
    pub remote: std::net::IpAddr,
    /// Every station behind it.
    #[serde(default)]
    pub stations: Vec<RemoteStation>,
}

/// A station behind a remote VTEP: a remote pod's interface on an overlay
/// network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStation {
    /// Its MAC.
    pub mac: crate::MacAddr,
    /// The overlay's VLAN it is in (an overlay of VLANs: one of theirs;
    /// unset: the untagged one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Its addresses.
    #[serde(default)]
    pub ips: Vec<std::net::IpAddr>,
}

impl RemoteStation {
    /// Whether `m` can be a station's MAC: a unicast one, not all zeros.
    pub fn is_station_mac(m: &crate::MacAddr) -> bool {
        !m.is_multicast() && m.0 != [0; 6]
    }

    /// Whether `a` can be a station's address: a unicast one (not
    /// multicast, unspecified, loopback or IPv4 broadcast).
    pub fn is_station_address(a: &std::net::IpAddr) -> bool {
        !(a.is_multicast()
            || a.is_unspecified()
            || a.is_loopback()
            || matches!(a, std::net::IpAddr::V4(v) if v.is_broadcast()))
    }
}

/// A remote VTEP of an overlay, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VtepInfo {
    /// The overlay.
    pub overlay: String,
    /// The remote VTEP's address.
    pub remote: std::net::IpAddr,
    /// This node's address its tunnels leave from.
    pub local: std::net::IpAddr,
    /// Its tunnel ports (one per VNI).
    pub tunnels: Vec<String>,
    /// Whether every tunnel is up.
    pub link_up: bool,
    /// Whether the config names it (it then cannot be deleted through the
    /// API).
    pub from_config: bool,
    /// How many stations the node agent gave it ([`Request::VtepStations`]).
    #[serde(default)]
    pub stations: usize,
}

/// Which of a port's frames a capture takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureDirection {
    /// Received from the port's peer.
    Rx,
    /// Sent to the port's peer.
    Tx,
    /// Both.
    #[default]
    Both,
}

/// A capture's file format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureFormat {
    /// pcapng, with each frame's direction (`epb_flags`) and the frames
    /// lost at the end.
    #[default]
    Pcapng,
    /// Classic pcap (nanosecond timestamps), for older tools.
    Pcap,
}

/// The answer to `capture`, before its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureInfo {
    /// Port name.
    pub port: String,
    /// Format of the bytes that follow.
    pub format: CaptureFormat,
    /// Bytes kept of each frame.
    pub snaplen: u32,
}

/// One traced frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// The worker that switched it.
    pub worker: usize,
    /// The port it came in on.
    pub in_port: String,
    /// The remote VTEP it was decapsulated from, where that port is a
    /// tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_vtep: Option<std::net::IpAddr>,
    /// Its length in bytes.
    pub len: u32,
    /// Source MAC.
    pub src: String,
    /// Destination MAC.
    pub dst: String,
    /// Its 802.1Q VLAN id on arrival, if tagged.
    pub tag: Option<u16>,
    /// The VLAN it belongs to in the bridge (0: untagged), once known.
    pub vlan: Option<u16>,
    /// What learning did with its source.
    pub learn: LearnOutcome,
    /// The other port in a `moved` or `evicted` learn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learn_port: Option<String>,
    /// How its destination was found.
    pub lookup: LookupOutcome,
    /// The port a `unicast` lookup found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup_port: Option<String>,
    /// Each port it was handed to, and what became of it there.
    pub out: Vec<TraceOut>,
    /// Why it went nowhere, if dropped on the way in.
    pub drop: Option<DropReason>,
    /// What L3/L4 policy decided, step by step (`egress of pod1: rule 0
    /// (ns1/allow-dns[0])`, `established`, `ingress of pod2: denied`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy: Vec<String>,
}

/// A traced frame at one of its destinations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceOut {
    /// Port.
    pub port: String,
    /// The remote VTEP it was encapsulated to, where that port is a
    /// tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep: Option<std::net::IpAddr>,
    /// `sent`, or the drop reason (`no_buffer`, `too_long`, `link_down`).
    pub result: Delivery,
}

/// Why a frame was dropped. Each has a counter per port (`stats`), and a
/// trace names the one that stopped a frame. Its JSON form is its
/// [`DropReason::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(usize)]
pub enum DropReason {
    /// Shorter than an Ethernet header.
    Runt = 0,
    /// A frame of a VLAN its ingress port does not carry (a tagged frame on
    /// an access or untagged-only port, or outside a trunk's list).
    VlanFiltered = 1,
    /// The destination MAC was learned on the ingress port (no hairpin),
    /// or on another tunnel of the bridge where the frame came from a
    /// tunnel (split horizon).
    Hairpin = 2,
    /// The destination ring had no free buffer.
    NoBuffer = 3,
    /// The destination is not connected.
    LinkDown = 4,
    /// The frame does not fit the destination's buffers.
    TooLong = 5,
    /// The ingress port is in no bridge.
    NoBridge = 6,
    /// More buffers in one frame than the switch follows.
    TooManySegments = 7,
    /// From a new source address while the ingress port holds as many MAC
    /// entries as its limit allows.
    MacLimit = 8,
    /// From a source address the ingress port may not use (not one of its
    /// pinned MACs, or pinned to another port).
    SpoofedSource = 9,
    /// From a source address in use on another port within the move hold
    /// time.
    MacMove = 10,
    /// Checksum or segmentation work left on the frame whose metadata does
    /// not match its headers, for a destination that cannot take it over.
    BadOffload = 11,
    /// A tunnel packet from no configured remote VTEP, or of no tunnel's
    /// VNI (counted on the tunnel port that reads the socket its local
    /// address shares).
    UnknownTunnel = 12,
    /// A datagram on a tunnel socket that is no tunnel packet: a bad or
    /// truncated VXLAN header, no whole frame inside (counted as
    /// `unknown_tunnel` is).
    BadTunnel = 13,
    /// To a station whose port's policy isolates it for ingress, allowed by
    /// none of its rules and of no connection it allowed.
    PolicyIngress = 14,
    /// From a station whose port's policy isolates it for egress, allowed
    /// by none of its rules and of no connection it allowed.
    PolicyEgress = 15,
    /// From a station given its IP addresses, with another source address
    /// (IPv4, IPv6, or an ARP sender's).
    SpoofedIp = 16,
    /// A new connection policy allowed, while the connection table holds
    /// its limit or the port it came in on holds its share.
    ConntrackFull = 17,
    /// An IP packet whose headers policy cannot read (cut short, a bad
    /// version or header length), to or from a port with policy.
    BadHeader = 18,
    /// A frame its bridge would flood (broadcast, multicast, unknown
    /// unicast) beyond the ingress port's flood limit for the second.
    FloodLimit = 19,
    /// Received from a port beyond its `rx` rate limit (a pod's egress).
    PolicedRx = 20,
    /// To a port beyond its `tx` rate limit (a pod's ingress).
    PolicedTx = 21,
}

impl DropReason {
    /// Number of reasons.
    pub const COUNT: usize = 22;
    /// Every reason, in counter order.
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::Runt,
        DropReason::VlanFiltered,
        DropReason::Hairpin,
        DropReason::NoBuffer,
        DropReason::LinkDown,
        DropReason::TooLong,
        DropReason::NoBridge,
        DropReason::TooManySegments,
        DropReason::MacLimit,
        DropReason::SpoofedSource,
        DropReason::MacMove,
        DropReason::BadOffload,
        DropReason::UnknownTunnel,
        DropReason::BadTunnel,
        DropReason::PolicyIngress,
        DropReason::PolicyEgress,
        DropReason::SpoofedIp,
        DropReason::ConntrackFull,
        DropReason::BadHeader,
        DropReason::FloodLimit,
        DropReason::PolicedRx,
        DropReason::PolicedTx,
    ];

    /// Its stable name, as in JSON, metrics labels and the CLI's output.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Runt => "runt",
            DropReason::VlanFiltered => "vlan_filtered",
            DropReason::Hairpin => "hairpin",
            DropReason::NoBuffer => "no_buffer",
            DropReason::LinkDown => "link_down",
            DropReason::TooLong => "too_long",
            DropReason::NoBridge => "no_bridge",
            DropReason::TooManySegments => "too_many_segments",
            DropReason::MacLimit => "mac_limit",
            DropReason::SpoofedSource => "spoofed_source",
            DropReason::MacMove => "mac_move",
            DropReason::BadOffload => "bad_offload",
            DropReason::UnknownTunnel => "unknown_tunnel",
            DropReason::BadTunnel => "bad_tunnel",
            DropReason::PolicyIngress => "policy_ingress",
            DropReason::PolicyEgress => "policy_egress",
            DropReason::SpoofedIp => "spoofed_ip",
            DropReason::ConntrackFull => "conntrack_full",
            DropReason::BadHeader => "bad_header",
            DropReason::FloodLimit => "flood_limit",
            DropReason::PolicedRx => "policed_rx",
            DropReason::PolicedTx => "policed_tx",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What became of a traced frame at one destination: sent, or dropped for
/// a reason. Its JSON form is `"sent"` or the reason's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Delivery {
    /// Handed to the port's peer.
    Sent,
    /// Not sent.
    Dropped(DropReason),
}

impl From<Delivery> for String {
    fn from(d: Delivery) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for Delivery {
    type Error = String;
    fn try_from(s: String) -> Result<Delivery, String> {
        if s == "sent" {
            return Ok(Delivery::Sent);
        }
        DropReason::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .map(Delivery::Dropped)
            .ok_or_else(|| format!("{s:?} is neither \"sent\" nor a drop reason"))
    }
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delivery::Sent => f.write_str("sent"),
            Delivery::Dropped(r) => f.write_str(r.name()),
        }
    }
}

/// What learning did with a traced frame's source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LearnOutcome {
    /// Not learned: the frame was dropped before.
    Skipped,
    /// A multicast source, never learned.
    Multicast,
    /// Known on this port, and fresh.
    Known,
    /// Known on this port; its age reset.
    Refreshed,
    /// Learned now.
    New,
    /// Moved here from the trace's `learn_port`.
    Moved,
    /// Learned by evicting `learn_port`'s entry from a full bucket.
    Evicted,
    /// Not learned: the table is full.
    TableFull,
}

/// How a traced frame's destination was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupOutcome {
    /// Not looked up: the frame was dropped before.
    Skipped,
    /// Learned on the trace's `lookup_port`.
    Unicast,
    /// Not learned: flooded.
    Unknown,
    /// A multicast or broadcast destination: flooded.
    Multicast,
    /// An ARP request or neighbour solicitation for a neighbour the
    /// bridge knows: answered by the bridge on the port it came in on.
    Answered,
}

/// How workers wait for frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Busy-poll always (lowest latency, one full CPU per worker); a worker
    /// with no queue to poll (or paused for a takeover) sleeps all the same.
    Poll,
    /// Sleep whenever a poll finds nothing.
    Interrupt,
    /// Busy-poll while traffic flows, sleep after a quiet spell.
    #[default]
    Adaptive,
}

impl std::fmt::Display for PollMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PollMode::Poll => "poll",
            PollMode::Interrupt => "interrupt",
            PollMode::Adaptive => "adaptive",
        })
    }
}

/// Error classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed request.
    BadRequest,
    /// A field has a bad value.
    InvalidArgument,
    /// No such port or bridge.
    NotFound,
    /// The name is taken.
    AlreadyExists,
    /// The object is in use (e.g. a bridge with ports, a socket in use).
    Busy,
    /// The daemon failed.
    Internal,
    /// The caller may not ask this (a takeover or stand-down from another
    /// user than the switch's).
    PermissionDenied,
    /// The switch did not take the request: it was taken over or is
    /// stopping. Nothing was done; ask again ([`crate::Client`] does, on a
    /// new connection, where the switch that took over or restarted
    /// answers).
    Unavailable,
}

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Class.
    pub code: ErrorCode,
    /// Explanation, naming the field or object.
    pub message: String,
}

impl ApiError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }
}

/// An answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// Success.
    pub ok: bool,
    /// The result when `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The error when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

impl Response {
    /// A success.
    pub fn ok<T: Serialize>(v: T) -> Response {
        Response {
            ok: true,
            result: Some(serde_json::to_value(v).unwrap_or(serde_json::Value::Null)),
            error: None,
        }
    }
    /// A failure.
    pub fn err(e: ApiError) -> Response {
        Response {
            ok: false,
            result: None,
            error: Some(e),
        }
    }
}

/// A port as listed: its spec (flattened: `name`, `kind`, `role`,
/// `socket`, ...) and its state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortInfo {
    /// The spec it was created from.
    #[serde(flatten)]
    pub spec: PortSpec,
    /// True if it came from the config file (recreated at every start).
    pub from_config: bool,
    /// Connection state.
    pub status: PortStatus,
}

impl PortInfo {
    /// The port's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }
    /// The switch's role's name ("" for a kind without one).
    pub fn role(&self) -> &'static str {
        self.spec.kind.role_name()
    }
    /// The port's socket as specs write it ("" for a kind without one).
    pub fn socket(&self) -> String {
        self.spec
            .kind
            .socket()
            .map(|s| s.addr.to_string())
            .unwrap_or_default()
    }
}

/// What `port list` shows about a port's connection.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PortStatus {
    /// True while a peer is connected and frames can pass.
    pub link_up: bool,
    /// The peer's self-reported name, if any.
    pub peer: Option<String>,
    /// Receive queues in use.
    pub rx_queues: usize,
    /// Transmit queues in use.
    pub tx_queues: usize,
    /// Why the link last went down.
    pub last_error: Option<String>,
    /// Times the link came up.
    pub connects: u64,
    /// Times a peer was disconnected for breaking the protocol: a malformed
    /// or out-of-order message, a refused handshake (wrong version, secret,
    /// memory or rings), a handshake timeout, or a bad ring or descriptor.
    pub faults: u64,
    /// The MTU the port holds frames to, for ports on a kernel interface
    /// (as last read from it: every 2 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Why the port does not exist, if the switch could not make it from
    /// its persisted spec at start (a socket path now reserved or taken, an
    /// interface gone, a spec this version refuses). The spec stays in the
    /// state until the port is deleted or added again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// Totals of a port's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortTotals {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Drops by reason name.
    pub drops: std::collections::BTreeMap<DropReason, u64>,
}

impl PortTotals {
    /// What was counted since `earlier` (counters only grow).
    pub fn since(&self, earlier: &PortTotals) -> PortTotals {
        PortTotals {
            rx_packets: self.rx_packets.saturating_sub(earlier.rx_packets),
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            tx_packets: self.tx_packets.saturating_sub(earlier.tx_packets),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            drops: self
                .drops
                .iter()
                .map(|(r, n)| {
                    (
                        *r,
                        n.saturating_sub(earlier.drops.get(r).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        }
    }
}

/// Counters of a port.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortStats {
    /// Name.
    pub name: String,
    /// Link state.
    pub link_up: bool,
    /// MAC table entries the port holds (pinned ones included).
    #[serde(default)]
    pub mac_entries: u32,
    /// Most entries it may hold (0: no limit).
    #[serde(default)]
    pub mac_limit: u32,
    /// Most frames a second it may have flooded (0: no limit).
    #[serde(default)]
    pub flood_limit: u32,
    /// Its policers, buckets as they apply ([`PortSpec::rate_limit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<crate::spec::RateLimits>,
    /// Counters.
    #[serde(flatten)]
    pub totals: PortTotals,
}

/// A bridge as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BridgeInfo {
    /// Name.
    pub name: String,
    /// Member ports.
    pub ports: Vec<String>,
    /// Learned MACs.
    pub macs: usize,
    /// True if it came from the config file.
    pub from_config: bool,
    /// The interface of the physical network this bridge is (daemon config
    /// `[physnets]`: the bridge has its name), when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physnet: Option<String>,
    /// The VNIs of the overlay network this bridge is (daemon config
    /// `[overlays]`: the bridge has its name), when it is one: `vni 42`,
    /// `vlan 100 vni 5100, vlan 200 vni 5200`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<String>,
    /// The VLANs of the overlay this bridge is when it is a trunked one
    /// (each crosses in its own VNI); empty for an untagged overlay (its
    /// untagged frames cross) and for a bridge that is no overlay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlay_vlans: Vec<u16>,
    /// The node-local addresses of the overlay this bridge is, when its
    /// config splits some ([`crate::overlay`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<crate::overlay::NodeIpam>,
    /// Counters since the bridge was made.
    #[serde(default)]
    pub counters: BridgeCounts,
}

/// A bridge's learning and flooding counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeCounts {
    /// MAC entries learned.
    pub learned: u64,
    /// MAC entries moved from one port to another.
    pub moved: u64,
    /// Entries evicted from a full bucket to make room.
    pub evicted: u64,
    /// Entries removed by aging.
    pub aged: u64,
    /// Frames flooded (unknown unicast, broadcast, multicast).
    pub flooded: u64,
    /// ARP requests and neighbour solicitations answered from the
    /// bridge's known neighbours instead of flooded.
    #[serde(default)]
    pub answered: u64,
}

/// A worker and its load since the daemon started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Worker index.
    pub id: usize,
    /// The CPU it is pinned to.
    pub cpu: Option<usize>,
    /// How it waits for frames.
    pub mode: PollMode,
    /// Passes over its receive queues.
    pub polls: u64,
    /// Passes that found frames.
    pub busy_polls: u64,
    /// Seconds spent in passes that found frames.
    pub busy_seconds: f64,
    /// Seconds spent in passes that found nothing.
    pub idle_seconds: f64,
    /// Frames received.
    pub frames: u64,
    /// Non-empty receive bursts by size: `(at most this many frames,
    /// bursts)`; the last bucket takes every larger burst.
    pub bursts: Vec<(u32, u64)>,
    /// Times it went to sleep on its interrupts.
    pub sleeps: u64,
    /// Sleeps an interrupt or a kick ended (the rest timed out).
    pub wakeups: u64,
    /// The receive queues it polls.
    pub queues: Vec<QueueLoad>,
    /// Seconds, as of the control thread's last look (once a second),
    /// since it was last seen to complete a pass over its receive queues or
    /// to have none: under a second while it runs. At
    /// [`WORKER_STALL_LIMIT`] it is stalled (and logged so), and
    /// `switchyard live` fails.
    #[serde(default)]
    pub stalled_seconds: f64,
}

/// How long a worker with receive queues may go without completing a pass
/// before it counts as stalled (an idle worker sleeps at most a second
/// between passes).
pub const WORKER_STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A receive queue's load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueLoad {
    /// Port.
    pub port: String,
    /// Queue number in the port.
    pub queue: usize,
    /// Frames received.
    pub frames: u64,
    /// Seconds its worker spent receiving and forwarding them.
    pub busy_seconds: f64,
}

/// A learned MAC.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MacInfo {
    /// Address.
    pub mac: String,
    /// VLAN (0: untagged).
    pub vlan: u16,
    /// Port it was learned on.
    pub port: String,
    /// The remote VTEP it is behind, where that port is a tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep: Option<std::net::IpAddr>,
    /// Seconds since last seen.
    pub age_secs: u32,
    /// Pinned to its port (a port's own MAC, or a remote VTEP's station):
    /// never aged, never moved by a frame.
    #[serde(default)]
    pub pinned: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_answers_keep_their_json_names() {
        for r in DropReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
            assert_eq!(
                r as usize,
                DropReason::ALL.iter().position(|&x| x == r).unwrap()
            );
            let d = Delivery::Dropped(r);
            let v = serde_json::to_value(d).unwrap();
            assert_eq!(v, r.name());
            assert_eq!(serde_json::from_value::<Delivery>(v).unwrap(), d);
        }
        assert_eq!(serde_json::to_value(Delivery::Sent).unwrap(), "sent");
        assert!(serde_json::from_value::<Delivery>("lost".into()).is_err());
        assert_eq!(
            serde_json::to_value(LearnOutcome::TableFull).unwrap(),
            "table_full"
        );
        assert_eq!(
            serde_json::to_value(LookupOutcome::Unicast).unwrap(),
            "unicast"
        );
        assert_eq!(
            serde_json::to_value(PollMode::Adaptive).unwrap(),
            "adaptive"
        );
        let mut totals = PortTotals::default();
        totals.drops.insert(DropReason::TooLong, 3);
        let v = serde_json::to_value(&totals).unwrap();
        assert_eq!(v["drops"]["too_long"], 3);
        assert_eq!(serde_json::from_value::<PortTotals>(v).unwrap(), totals);
    }

    #[test]
    fn requests_have_a_stable_json_form() {
        let r: Request = serde_json::from_str(r#"{"op":"port_del","name":"p1"}"#).unwrap();
        assert_eq!(r, Request::PortDel { name: "p1".into() });
        let r: Request = serde_json::from_str(r#"{"op":"stats"}"#).unwrap();
        assert_eq!(r, Request::Stats { name: None });
        let r: Request = serde_json::from_str(
            r#"{"op":"port_add","port":{"name":"a","kind":"memif","role":"master","socket":"/s"}}"#,
        )
        .unwrap();
        assert!(matches!(r, Request::PortAdd { .. }));
        let r: Result<Request, _> = serde_json::from_str(
            r#"{"op":"port_add","port":{"name":"a","kind":"memif","role":"boss","socket":"/s"}}"#,
        );
        assert!(r.unwrap_err().to_string().starts_with("role: \"boss\""));
        assert!(serde_json::from_str::<Request>(r#"{"op":"explode"}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Request::Ping).unwrap(),
            r#"{"op":"ping"}"#
        );
        let r: Request =
            serde_json::from_str(r#"{"op":"capture","port":"p1","direction":"rx"}"#).unwrap();
        assert_eq!(
            r,
            Request::Capture {
                port: "p1".into(),
                direction: CaptureDirection::Rx,
                count: None,
                snaplen: None,
                format: CaptureFormat::Pcapng,
                duration_ms: None,
            }
        );
        let r: Request = serde_json::from_str(r#"{"op":"trace","count":5}"#).unwrap();
        assert!(matches!(r, Request::Trace { count: Some(5), .. }));
    }
}
