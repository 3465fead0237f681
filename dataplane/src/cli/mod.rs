//! The CLI's client commands: the command line (clap), each command's
//! request to the daemon, and its output ([`render`] draws the tables,
//! [`capture`] streams a capture). `main.rs` keeps the launcher.

mod capture;
mod render;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use switchyard_api::spec::{Meter, RateLimits};
use switchyard_api::{
    Call, CaptureDirection, CaptureFormat, Client, MacAddr, PortSpec, Request, VlanSet,
    DEFAULT_CONTROL_SOCKET,
};

/// Switchyard: a userspace L2 switch for pods and VMs (memif, vhost-user, tap,
/// af-packet and af-xdp ports).
#[derive(Parser)]
#[command(version, about)]
pub(crate) struct Cli {
    /// Control socket (also SWITCHYARD_CONTROL).
    #[arg(long, global = true, env = "SWITCHYARD_CONTROL")]
    pub(crate) control: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Runs the switch in the foreground.
    Run {
        /// Configuration file (default: the embedded configuration).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Directory for persisted state (overrides the config).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Take over the ports of the switch running on the control
        /// socket, with their connections, instead of starting afresh
        /// (an upgrade without an outage); starts afresh if none runs. If
        /// either switch refuses (another state version, another
        /// configuration), falls back to a restart: the running switch
        /// stops, this one starts.
        #[arg(long)]
        takeover: bool,
        /// With --takeover: if the takeover is refused, exit (with why)
        /// and leave the running switch as it is, instead of restarting.
        #[arg(long, requires = "takeover")]
        no_restart: bool,
        /// Once another switch has taken the ports over, wait until
        /// stopped (SIGTERM) instead of exiting, holding nothing: a
        /// DaemonSet's container that exits is started again.
        #[arg(long)]
        linger: bool,
    },
    /// Exits 0 if the switch serving the control socket runs in this
    /// container (this process's PID namespace): the readiness of a
    /// DaemonSet pod whose switch takes over from the one before it.
    Ready,
    /// Exits 0 if the switch serving the control socket answers and each
    /// of its workers with queues completes its passes over them (none has
    /// stalled for 5 s): the liveness of the DaemonSet's switch.
    Live,
    /// What `run --linger` becomes once its ports are taken over.
    #[command(hide = true)]
    Linger,
    /// Manages ports.
    #[command(subcommand)]
    Port(PortCmd),
    /// Shows port counters.
    Stats {
        /// Only this port.
        name: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Manages bridges.
    #[command(subcommand)]
    Bridge(BridgeCmd),
    /// Shows learned MAC addresses.
    #[command(subcommand)]
    Mac(MacCmd),
    /// Shows the workers' load.
    #[command(subcommand)]
    Worker(WorkerCmd),
    /// Manages the remote VTEPs of the config's overlays.
    #[command(subcommand)]
    Vtep(VtepCmd),
    /// Captures a port's frames to a pcapng (or pcap) file, as tcpdump
    /// would on a kernel interface; Ctrl-C ends it.
    Capture {
        /// Port.
        port: String,
        /// Frames received from the peer (rx), sent to it (tx), or both.
        #[arg(long, value_enum, default_value = "both")]
        direction: DirectionArg,
        /// Stop after this many frames.
        #[arg(long, short = 'c')]
        count: Option<u64>,
        /// Bytes kept of each frame.
        #[arg(long, short = 's', default_value_t = 262144)]
        snaplen: u32,
        /// Stop after this many seconds.
        #[arg(long)]
        duration: Option<f64>,
        /// File format.
        #[arg(long, value_enum, default_value = "pcapng")]
        format: FormatArg,
        /// Output file, `-` for standard output (e.g. `| tcpdump -r -`).
        #[arg(short = 'w')]
        write: PathBuf,
    },
    /// Shows what the switch decided for the next frames: in-port, VLAN,
    /// source learned or moved, destination found or flooded, out-ports,
    /// or the drop reason.
    Trace {
        /// Frames to trace.
        #[arg(long, short = 'c', default_value_t = 10)]
        count: u32,
        /// Only frames coming in on this port.
        #[arg(long)]
        port: Option<String>,
        /// Seconds to wait for them.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum DirectionArg {
    Rx,
    Tx,
    Both,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum FormatArg {
    Pcapng,
    Pcap,
}

#[derive(Subcommand)]
pub(crate) enum WorkerCmd {
    /// Lists workers: CPU, mode, busy share, and each receive queue with
    /// its share of the worker's busy time (as OVS's pmd-rxq-show).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum PortCmd {
    /// Adds a port (roles are the switch's own).
    Add(Box<PortAdd>),
    /// Deletes a port.
    Del {
        /// Port name.
        name: String,
    },
    /// Sets a port's station addresses and L3/L4 policy (those given).
    Set {
        /// Port name.
        name: String,
        /// The station's IP addresses, comma-separated (frames from any
        /// other source address are dropped); `none` takes them away.
        #[arg(long)]
        ips: Option<String>,
        /// A JSON file with the port's policy (`{"ingress": [...],
        /// "egress": [...]}`, docs/security.md); `-` reads standard input;
        /// `{}` takes it away.
        #[arg(long)]
        policy: Option<std::path::PathBuf>,
        /// The policer of what the port sends into the switch (a pod's
        /// egress), e.g. `rate=100M,burst=10M,pps=50k,pps-burst=64`
        /// (bits a second and bits, frames a second and frames);
        /// `none` takes it away. The other direction is kept.
        #[arg(long)]
        rx_limit: Option<MeterArg>,
        /// The policer of what the switch sends to the port (a pod's
        /// ingress), as `--rx-limit`.
        #[arg(long)]
        tx_limit: Option<MeterArg>,
    },
    /// Lists ports.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub(crate) struct PortAdd {
    /// Port name.
    name: String,
    /// memif, vhost-user, tap, af-packet, af-xdp or vxlan.
    #[arg(long)]
    kind: String,
    /// memif: master|slave; vhost-user: server|client (the switch's role).
    #[arg(long)]
    role: Option<String>,
    /// Socket path (`@name` or `abstract:name` for abstract memif sockets).
    #[arg(long)]
    socket: Option<String>,
    /// tap: the kernel interface the switch creates; af-packet, af-xdp:
    /// the existing interface the uplink attaches to.
    #[arg(long)]
    interface: Option<String>,
    /// memif interface id.
    #[arg(long)]
    id: Option<u32>,
    /// memif secret.
    #[arg(long)]
    secret: Option<String>,
    /// memif mode: ethernet or ip; af-xdp mode: best-effort (default),
    /// native-with-zerocopy, native or generic.
    #[arg(long)]
    mode: Option<String>,
    /// Queue pairs.
    #[arg(long)]
    queues: Option<u16>,
    /// Descriptors per ring (power of two).
    #[arg(long)]
    ring_size: Option<u32>,
    /// Buffer size in bytes.
    #[arg(long)]
    buffer_size: Option<u32>,
    /// Bridge to join.
    #[arg(long)]
    bridge: Option<String>,
    /// Access VLAN (1..4094). Without --vlan and --trunk the port carries
    /// untagged frames only.
    #[arg(long, conflicts_with = "trunk")]
    vlan: Option<u16>,
    /// Trunk: the VLANs carried tagged, e.g. `100,200-210`; `0` adds
    /// untagged frames; `all` carries everything.
    #[arg(long)]
    trunk: Option<VlanSet>,
    /// Numeric group given access to the socket the switch creates (socket
    /// mode 0660), for non-root peers.
    #[arg(long)]
    socket_group: Option<u32>,
    /// Most MAC table entries the port may hold (default 64; 0: no limit).
    #[arg(long)]
    mac_limit: Option<u32>,
    /// Most frames a second the port may have flooded: broadcast,
    /// multicast, unknown unicast (default and 0: no limit).
    #[arg(long)]
    flood_limit: Option<u32>,
    /// The policer of what the port sends into the switch (a pod's
    /// egress): `rate=100M,burst=10M,pps=50k,pps-burst=64` (bits a second
    /// and bits, frames a second and frames; default burst 80% of a
    /// second at the rate).
    #[arg(long)]
    rx_limit: Option<Meter>,
    /// The policer of what the switch sends to the port (a pod's
    /// ingress), as `--rx-limit`.
    #[arg(long)]
    tx_limit: Option<Meter>,
    /// The port's own MAC, pinned to it (repeat or comma-separate for
    /// several): frames from any other source are dropped.
    #[arg(long = "mac", value_delimiter = ',')]
    macs: Vec<MacAddr>,
    /// Pin the first source MAC the port sends from.
    #[arg(long, conflicts_with = "macs")]
    pin_first: bool,
    /// tap: the interface's MAC (default: one chosen once, kept for good).
    #[arg(long)]
    interface_mac: Option<MacAddr>,
    /// vxlan: the remote VTEP's address.
    #[arg(long)]
    remote: Option<std::net::IpAddr>,
    /// vxlan: this node's VTEP address (an address of the host).
    #[arg(long)]
    local: Option<std::net::IpAddr>,
    /// vxlan: the VXLAN network identifier (0..16777215).
    #[arg(long)]
    vni: Option<u32>,
    /// vxlan: the UDP port on both ends (default 4789).
    #[arg(long)]
    dstport: Option<u16>,
}

#[derive(Subcommand)]
pub(crate) enum BridgeCmd {
    /// Adds a bridge.
    Add {
        /// Name.
        name: String,
    },
    /// Deletes an empty bridge.
    Del {
        /// Name.
        name: String,
    },
    /// Lists bridges.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum VtepCmd {
    /// Joins an overlay to a remote VTEP (another node): its tunnels, one
    /// per VNI (persisted; adding one it has changes nothing).
    Add {
        /// Overlay (a name under `[overlays]` in the config).
        overlay: String,
        /// The remote VTEP's address.
        remote: std::net::IpAddr,
        /// The address the tunnels leave from (default: the overlay's
        /// `local`, else the source address of the route to the remote).
        #[arg(long)]
        local: Option<std::net::IpAddr>,
    },
    /// Takes a remote VTEP out of an overlay, with its tunnels.
    Del {
        /// Overlay.
        overlay: String,
        /// The remote VTEP's address.
        remote: std::net::IpAddr,
    },
    /// Lists every overlay's remote VTEPs.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Gives this node a slice of an overlay's addresses (its config's
    /// `ipam`), as the node agent does for it in a cluster: the networks
    /// on the overlay that name no IPAM of their own hand out its
    /// addresses (persisted). Without a slice: none.
    Slice {
        /// Overlay.
        overlay: String,
        /// The slice's index.
        slice: Option<u32>,
    },
    /// Sets the stations behind a remote VTEP of an overlay, as the node
    /// agent does for the remote node's pods (not persisted): their MACs
    /// are pinned to its tunnels, and the bridge answers ARP and neighbour
    /// solicitations for their addresses itself. None given: none.
    Stations {
        /// Overlay.
        overlay: String,
        /// The remote VTEP's address.
        remote: std::net::IpAddr,
        /// Each station as MAC[@VLAN]=IP[,IP...] (`02:00:00:00:00:05=10.66.2.5,fd66:0:0:2::5`).
        stations: Vec<String>,
    },
}

#[derive(Subcommand)]
pub(crate) enum MacCmd {
    /// Lists a bridge's MAC table.
    List {
        /// Bridge.
        bridge: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// A policer on the command line, or `none`.
#[derive(Clone, Copy)]
pub(crate) struct MeterArg(Option<Meter>);

impl std::str::FromStr for MeterArg {
    type Err = String;
    fn from_str(s: &str) -> Result<MeterArg, String> {
        match s.trim() {
            "none" => Ok(MeterArg(None)),
            m => m.parse().map(|m| MeterArg(Some(m))),
        }
    }
}

impl PortAdd {
    /// The spec the flags describe, typed by the same parser as the config
    /// file and the API: a flag the kind does not have is refused by name.
    pub(crate) fn spec(self) -> anyhow::Result<PortSpec> {
        use serde_json::{json, Map, Value};
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                m.insert(k.to_string(), v);
            }
        };
        put("name", json!(self.name));
        put("kind", json!(self.kind));
        put("role", json!(self.role));
        put("socket", json!(self.socket));
        put("interface", json!(self.interface));
        put("id", json!(self.id));
        put("secret", json!(self.secret));
        put("mode", json!(self.mode));
        put("queues", json!(self.queues));
        put("ring_size", json!(self.ring_size));
        put("buffer_size", json!(self.buffer_size));
        put("bridge", json!(self.bridge));
        put("vlan", json!(self.vlan));
        put("trunk", json!(self.trunk));
        put("socket_group", json!(self.socket_group));
        put("mac_limit", json!(self.mac_limit));
        put("flood_limit", json!(self.flood_limit));
        if self.rx_limit.is_some() || self.tx_limit.is_some() {
            let limits = RateLimits {
                rx: self.rx_limit,
                tx: self.tx_limit,
            };
            put("rate_limit", json!(limits));
        }
        put("macs", json!((!self.macs.is_empty()).then_some(self.macs)));
        put("pin_first", json!(self.pin_first.then_some(true)));
        put("interface_mac", json!(self.interface_mac));
        put("remote", json!(self.remote));
        put("local", json!(self.local));
        put("vni", json!(self.vni));
        put("dstport", json!(self.dstport));
        serde_json::from_value(Value::Object(m)).map_err(|e| {
            // The flags are not JSON to the user: no line and column.
            let text = e.to_string();
            let text = text.split(" at line ").next().unwrap_or_default();
            anyhow::anyhow!("{text}")
        })
    }
}

/// How long a probe (`ready`, `live`) asks again a call the switch did not
/// take (a takeover under way): within the kubelet's default probe
/// timeout (1 s).
const PROBE_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs a client command (every command but `run`) against the daemon at
/// `control` (default [`DEFAULT_CONTROL_SOCKET`]).
pub(crate) fn run(cmd: Cmd, control: Option<PathBuf>) -> anyhow::Result<()> {
    let client = || -> anyhow::Result<Client> {
        let path = control
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONTROL_SOCKET));
        Ok(Client::connect(&path)?)
    };
    match cmd {
        Cmd::Run { .. } | Cmd::Linger => unreachable!("main runs the daemon"),
        Cmd::Ready => {
            let mut c = client()?;
            c.set_retry(PROBE_RETRY);
            let answer = c.call(&Request::Ping)?;
            let theirs = answer.get("pid_ns").and_then(serde_json::Value::as_u64);
            let ours = switchyard::control::pid_namespace();
            if theirs.is_some() && theirs == ours {
                println!("ready: this container's switch serves the control socket");
                Ok(())
            } else {
                anyhow::bail!(
                    "not ready: the switch serving the control socket runs in another container"
                )
            }
        }
        Cmd::Live => {
            let mut c = client()?;
            c.set_retry(PROBE_RETRY);
            let workers = c.ask(&Request::worker_list())?;
            let limit = switchyard_api::WORKER_STALL_LIMIT.as_secs_f64();
            let stalled: Vec<String> = workers
                .iter()
                .filter(|w| w.stalled_seconds >= limit)
                .map(|w| {
                    let queues: Vec<String> = w
                        .queues
                        .iter()
                        .map(|q| format!("{} queue {}", q.port, q.queue))
                        .collect();
                    format!(
                        "worker {} has completed no pass over {} for {:.0} s",
                        w.id,
                        queues.join(", "),
                        w.stalled_seconds
                    )
                })
                .collect();
            if !stalled.is_empty() {
                anyhow::bail!("not live: {}", stalled.join("; "));
            }
            println!("live: {} worker(s) polling", workers.len());
            Ok(())
        }
        Cmd::Port(PortCmd::Add(a)) => {
            let spec = a.spec()?;
            let info = client()?.ask(&Request::port_add(spec))?;
            println!("port {} added", info.spec.name);
            Ok(())
        }
        Cmd::Port(PortCmd::Del { name }) => {
            client()?.ask(&Request::port_del(&name))?;
            println!("port {name} deleted");
            Ok(())
        }
        Cmd::Port(PortCmd::Set {
            name,
            ips,
            policy,
            rx_limit,
            tx_limit,
        }) => {
            let ips = ips
                .map(|v| match v.as_str() {
                    "none" | "" => Ok(Vec::new()),
                    v => v
                        .split(',')
                        .map(|a| {
                            a.trim()
                                .parse()
                                .with_context(|| format!("--ips: {a:?} is no IP address"))
                        })
                        .collect(),
                })
                .transpose()?;
            let policy = policy
                .map(|path| -> anyhow::Result<_> {
                    let text = if path.as_os_str() == "-" {
                        std::io::read_to_string(std::io::stdin())?
                    } else {
                        std::fs::read_to_string(&path)
                            .with_context(|| format!("--policy: {}", path.display()))?
                    };
                    serde_json::from_str(&text)
                        .with_context(|| format!("--policy: {}", path.display()))
                })
                .transpose()?;
            // A direction not given keeps its policer: the port's as the
            // switch has it.
            let rate_limit = if rx_limit.is_some() || tx_limit.is_some() {
                let ports = client()?.ask(&Request::port_list())?;
                let now = ports
                    .iter()
                    .find(|p| p.spec.name == name)
                    .and_then(|p| p.spec.rate_limit)
                    .unwrap_or_default();
                Some(RateLimits {
                    rx: rx_limit.map_or(now.rx, |m| m.0),
                    tx: tx_limit.map_or(now.tx, |m| m.0),
                })
            } else {
                None
            };
            client()?.ask(&Request::port_set(&name, ips, policy, rate_limit))?;
            println!("port {name} set");
            Ok(())
        }
        Cmd::Port(PortCmd::List { json }) => {
            let Some(ports) = json_or(&mut client()?, &Request::port_list(), json)? else {
                return Ok(());
            };
            print!("{}", render::port_table(&ports));
            Ok(())
        }
        Cmd::Stats { name, json } => {
            let Some(stats) = json_or(&mut client()?, &Request::stats(name), json)? else {
                return Ok(());
            };
            print!("{}", render::stats_table(&stats));
            Ok(())
        }
        Cmd::Bridge(BridgeCmd::Add { name }) => {
            client()?.ask(&Request::bridge_add(&name))?;
            println!("bridge {name} added");
            Ok(())
        }
        Cmd::Bridge(BridgeCmd::Del { name }) => {
            client()?.ask(&Request::bridge_del(&name))?;
            println!("bridge {name} deleted");
            Ok(())
        }
        Cmd::Bridge(BridgeCmd::List { json }) => {
            let Some(bridges) = json_or(&mut client()?, &Request::bridge_list(), json)? else {
                return Ok(());
            };
            print!("{}", render::bridge_table(&bridges));
            Ok(())
        }
        Cmd::Capture {
            port,
            direction,
            count,
            snaplen,
            duration,
            format,
            write,
        } => capture::capture(
            client()?,
            Request::Capture {
                port,
                direction: match direction {
                    DirectionArg::Rx => CaptureDirection::Rx,
                    DirectionArg::Tx => CaptureDirection::Tx,
                    DirectionArg::Both => CaptureDirection::Both,
                },
                count,
                snaplen: Some(snaplen),
                format: match format {
                    FormatArg::Pcapng => CaptureFormat::Pcapng,
                    FormatArg::Pcap => CaptureFormat::Pcap,
                },
                duration_ms: duration.map(|d| (d * 1000.0).ceil() as u64),
            },
            &write,
        ),
        Cmd::Trace {
            count,
            port,
            timeout,
            json,
        } => {
            let wait = std::time::Duration::from_secs_f64(timeout.max(0.0));
            let mut c = client()?;
            c.set_timeout(wait + std::time::Duration::from_secs(30))?;
            let call = Request::trace(Some(count), port, Some(wait.as_millis() as u64));
            let Some(entries) = json_or(&mut c, &call, json)? else {
                return Ok(());
            };
            print!("{}", render::trace_text(&entries));
            if (entries.len() as u32) < count {
                eprintln!("{} of {count} frames traced in {timeout} s", entries.len());
            }
            Ok(())
        }
        Cmd::Worker(WorkerCmd::List { json }) => {
            let Some(workers) = json_or(&mut client()?, &Request::worker_list(), json)? else {
                return Ok(());
            };
            print!("{}", render::worker_table(&workers));
            Ok(())
        }
        Cmd::Vtep(VtepCmd::Add {
            overlay,
            remote,
            local,
        }) => {
            let v = client()?.ask(&Request::vtep_add(&overlay, remote, local))?;
            println!(
                "overlay {overlay}: VTEP {remote} joined from {} ({})",
                v.local,
                v.tunnels.join(", ")
            );
            Ok(())
        }
        Cmd::Vtep(VtepCmd::Del { overlay, remote }) => {
            client()?.ask(&Request::vtep_del(&overlay, remote))?;
            println!("overlay {overlay}: VTEP {remote} deleted");
            Ok(())
        }
        Cmd::Vtep(VtepCmd::List { json }) => {
            let Some(vteps) = json_or(&mut client()?, &Request::vtep_list(), json)? else {
                return Ok(());
            };
            print!("{}", render::vtep_table(&vteps));
            Ok(())
        }
        Cmd::Vtep(VtepCmd::Slice { overlay, slice }) => {
            let b = client()?.ask(&Request::overlay_slice(&overlay, slice))?;
            let ranges: Vec<String> = (b.ipam.iter().flat_map(|i| &i.ranges))
                .map(|r| format!("{}-{} of {}", r.range_start, r.range_end, r.subnet))
                .collect();
            match slice {
                Some(s) => println!("overlay {overlay}: slice {s} ({})", ranges.join(", ")),
                None => println!("overlay {overlay}: no slice"),
            }
            Ok(())
        }
        Cmd::Vtep(VtepCmd::Stations {
            overlay,
            remote,
            stations,
        }) => {
            let list = stations
                .iter()
                .map(|s| parse_station(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let n = list.len();
            client()?.ask(&Request::vtep_stations(&overlay, remote, list))?;
            println!("overlay {overlay}: {n} stations behind {remote}");
            Ok(())
        }
        Cmd::Mac(MacCmd::List { bridge, json }) => {
            let Some(macs) = json_or(&mut client()?, &Request::mac_list(&bridge), json)? else {
                return Ok(());
            };
            print!("{}", render::mac_table(&macs));
            Ok(())
        }
    }
}

/// A station as `vtep stations` takes it: `MAC[@VLAN]=IP[,IP...]`.
fn parse_station(s: &str) -> anyhow::Result<switchyard_api::RemoteStation> {
    let (who, ips) = s
        .split_once('=')
        .ok_or_else(|| anyhow::anyhow!("station {s:?}: not MAC[@VLAN]=IP[,IP...]"))?;
    let (mac, vlan) = match who.split_once('@') {
        Some((m, v)) => (
            m,
            Some(
                v.parse()
                    .map_err(|e| anyhow::anyhow!("station {s:?}: VLAN {v:?}: {e}"))?,
            ),
        ),
        None => (who, None),
    };
    Ok(switchyard_api::RemoteStation {
        mac: mac
            .parse()
            .map_err(|e| anyhow::anyhow!("station {s:?}: MAC {mac:?}: {e}"))?,
        vlan,
        ips: ips
            .split(',')
            .filter(|a| !a.is_empty())
            .map(|a| {
                a.parse()
                    .map_err(|e| anyhow::anyhow!("station {s:?}: address {a:?}: {e}"))
            })
            .collect::<anyhow::Result<_>>()?,
    })
}

/// Asks `call`. With `--json` (`json`), prints the answer as pretty JSON and
/// returns `None`; otherwise returns it decoded, for the caller's table.
fn json_or<A: serde::de::DeserializeOwned>(
    client: &mut Client,
    call: &Call<A>,
    json: bool,
) -> anyhow::Result<Option<A>> {
    let answer = client.call(call.request())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(None);
    }
    Ok(Some(serde_json::from_value(answer)?))
}
