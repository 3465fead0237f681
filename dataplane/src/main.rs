//! The `switchyard` command: the daemon and its CLI client.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use switchyard::config::Config;
use switchyard::control::Daemon;
use switchyard_api::{
    Call, CaptureDirection, CaptureFormat, Client, LearnOutcome, LookupOutcome, MacAddr, PortSpec,
    Request, TraceEntry, VlanSet, WorkerInfo, DEFAULT_CONTROL_SOCKET,
};

/// Switchyard: a userspace L2 switch for pods and VMs (memif, vhost-user, tap,
/// af-packet and af-xdp ports).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Control socket (also SWITCHYARD_CONTROL).
    #[arg(long, global = true, env = "SWITCHYARD_CONTROL")]
    control: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs the switch in the foreground.
    Run {
        /// Configuration file (default: the embedded configuration).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Directory for persisted state (overrides the config).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
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
enum DirectionArg {
    Rx,
    Tx,
    Both,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    Pcapng,
    Pcap,
}

#[derive(Subcommand)]
enum WorkerCmd {
    /// Lists workers: CPU, mode, busy share, and each receive queue with
    /// its share of the worker's busy time (as OVS's pmd-rxq-show).
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PortCmd {
    /// Adds a port (roles are the switch's own).
    Add(Box<PortAdd>),
    /// Deletes a port.
    Del {
        /// Port name.
        name: String,
    },
    /// Lists ports.
    List {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct PortAdd {
    /// Port name.
    name: String,
    /// memif, vhost-user, tap, af-packet or af-xdp.
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
}

#[derive(Subcommand)]
enum BridgeCmd {
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
enum MacCmd {
    /// Lists a bridge's MAC table.
    List {
        /// Bridge.
        bridge: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

impl PortAdd {
    /// The spec the flags describe, typed by the same parser as the config
    /// file and the API: a flag the kind does not have is refused by name.
    fn spec(self) -> anyhow::Result<PortSpec> {
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
        put("macs", json!((!self.macs.is_empty()).then_some(self.macs)));
        put("pin_first", json!(self.pin_first.then_some(true)));
        put("interface_mac", json!(self.interface_mac));
        serde_json::from_value(Value::Object(m)).map_err(|e| {
            // The flags are not JSON to the user: no line and column.
            let text = e.to_string();
            let text = text.split(" at line ").next().unwrap_or_default();
            anyhow::anyhow!("{text}")
        })
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = real_main(cli) {
        eprintln!("switchyard: {e:#}");
        std::process::exit(1);
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let control = cli.control.clone();
    let client = || -> anyhow::Result<Client> {
        let path = control
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONTROL_SOCKET));
        Ok(Client::connect(&path)?)
    };
    match cli.cmd {
        Cmd::Run { config, state_dir } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            let mut cfg = match &config {
                Some(p) => Config::load(p)?,
                None => Config::embedded(),
            };
            if let Some(c) = control {
                cfg.control_socket = c;
            }
            if let Some(s) = state_dir {
                cfg.state_dir = s;
            }
            // Again with the paths the flags gave: a port of the config on
            // the control socket they name is refused too.
            cfg.validate()?;
            Daemon::start(cfg).context("cannot start")?.run()
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
        Cmd::Port(PortCmd::List { json }) => {
            let Some(ports) = json_or(&mut client()?, &Request::port_list(), json)? else {
                return Ok(());
            };
            println!(
                "{:<20} {:<10} {:<7} {:<5} {:<12} {:<9} {:<40} PEER",
                "NAME", "KIND", "ROLE", "LINK", "BRIDGE", "VLAN", "SOCKET/IF"
            );
            for p in ports {
                let s = p.spec;
                println!(
                    "{:<20} {:<10} {:<7} {:<5} {:<12} {:<9} {:<40} {}",
                    s.name,
                    s.kind.name(),
                    s.kind.role().map_or("-", |r| r.as_str()),
                    match (&p.status.failed, p.status.link_up) {
                        (Some(_), _) => "FAIL",
                        (None, true) => "up",
                        (None, false) => "down",
                    },
                    s.bridge.as_deref().unwrap_or("-"),
                    match (s.vlan, &s.trunk) {
                        (Some(v), _) => v.to_string(),
                        (None, Some(t)) => format!("trunk:{t}"),
                        (None, None) => "untagged".into(),
                    },
                    s.kind
                        .socket()
                        .map(|s| s.addr.to_string())
                        .or(s.kind.interface().map(str::to_string))
                        .unwrap_or_else(|| "-".into()),
                    if p.status.link_up {
                        p.status.peer
                    } else {
                        p.status.last_error
                    }
                    .unwrap_or_default()
                );
            }
            Ok(())
        }
        Cmd::Stats { name, json } => {
            let Some(stats) = json_or(&mut client()?, &Request::stats(name), json)? else {
                return Ok(());
            };
            println!(
                "{:<20} {:<5} {:>12} {:>14} {:>12} {:>14} {:>9}  DROPS",
                "NAME", "LINK", "RX_PACKETS", "RX_BYTES", "TX_PACKETS", "TX_BYTES", "MACS"
            );
            for s in stats {
                let drops: Vec<String> = s
                    .totals
                    .drops
                    .iter()
                    .filter(|(_, &n)| n > 0)
                    .map(|(k, n)| format!("{k}={n}"))
                    .collect();
                let macs = match s.mac_limit {
                    0 => s.mac_entries.to_string(),
                    l => format!("{}/{l}", s.mac_entries),
                };
                println!(
                    "{:<20} {:<5} {:>12} {:>14} {:>12} {:>14} {:>9}  {}",
                    s.name,
                    if s.link_up { "up" } else { "down" },
                    s.totals.rx_packets,
                    s.totals.rx_bytes,
                    s.totals.tx_packets,
                    s.totals.tx_bytes,
                    macs,
                    if drops.is_empty() {
                        "-".into()
                    } else {
                        drops.join(" ")
                    }
                );
            }
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
            println!(
                "{:<20} {:>6} {:>10} {:>8} {:>8} {:>10} {:>12}  PORTS",
                "NAME", "MACS", "LEARNED", "MOVED", "EVICTED", "AGED", "FLOODED"
            );
            for b in bridges {
                let c = b.counters;
                println!(
                    "{:<20} {:>6} {:>10} {:>8} {:>8} {:>10} {:>12}  {}",
                    b.name,
                    b.macs,
                    c.learned,
                    c.moved,
                    c.evicted,
                    c.aged,
                    c.flooded,
                    b.ports.join(",")
                );
            }
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
        } => capture(
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
            print!("{}", trace_text(&entries));
            if (entries.len() as u32) < count {
                eprintln!("{} of {count} frames traced in {timeout} s", entries.len());
            }
            Ok(())
        }
        Cmd::Worker(WorkerCmd::List { json }) => {
            let Some(workers) = json_or(&mut client()?, &Request::worker_list(), json)? else {
                return Ok(());
            };
            print!("{}", worker_table(&workers));
            Ok(())
        }
        Cmd::Mac(MacCmd::List { bridge, json }) => {
            let Some(macs) = json_or(&mut client()?, &Request::mac_list(&bridge), json)? else {
                return Ok(());
            };
            println!("{:<18} {:>5} {:<20} {:>6}", "MAC", "VLAN", "PORT", "AGE");
            for m in macs {
                println!(
                    "{:<18} {:>5} {:<20} {:>6}",
                    m.mac, m.vlan, m.port, m.age_secs
                );
            }
            Ok(())
        }
    }
}

/// Streams a capture to `out` (`-`: standard output) until the daemon
/// ends it.
fn capture(mut client: Client, req: Request, out: &std::path::Path) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    // A capture may stay quiet for as long as the port does.
    client.set_timeout(std::time::Duration::from_secs(365 * 24 * 3600))?;
    let mut sink: Box<dyn Write> = if out.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(out)
                .with_context(|| format!("-w: cannot create {}", out.display()))?,
        )
    };
    let (armed, conn) = client.call_stream(&req)?;
    // Armed: said on stderr as tcpdump says "listening on", so a reader (or
    // a script) knows no frame from now on is missed.
    if let Ok(info) = serde_json::from_value::<switchyard_api::CaptureInfo>(armed) {
        let format = match info.format {
            switchyard_api::CaptureFormat::Pcapng => "pcapng",
            switchyard_api::CaptureFormat::Pcap => "pcap",
        };
        eprintln!(
            "capturing on {}, {format}, snapshot length {} bytes",
            info.port, info.snaplen
        );
    }
    // Written as it comes, unbuffered: Ctrl-C loses nothing already read.
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("capture stream"),
        };
        sink.write_all(&buf[..n])?;
        sink.flush()?;
    }
    Ok(())
}

/// `trace`'s text: a few lines per frame, as VPP's `show trace`.
fn trace_text(entries: &[TraceEntry]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for (i, e) in entries.iter().enumerate() {
        let _ = writeln!(
            o,
            "frame {}: in {} (worker {}), {} bytes, {} -> {}{}",
            i + 1,
            e.in_port,
            e.worker,
            e.len,
            e.src,
            e.dst,
            e.tag.map(|t| format!(", tagged {t}")).unwrap_or_default()
        );
        if let Some(v) = e.vlan {
            let _ = writeln!(o, "  vlan {v}");
        }
        let learn = match e.learn {
            LearnOutcome::Skipped => None,
            LearnOutcome::Multicast => Some("multicast"),
            LearnOutcome::Known => Some("known"),
            LearnOutcome::Refreshed => Some("refreshed"),
            LearnOutcome::New => Some("new"),
            LearnOutcome::Moved => Some("moved"),
            LearnOutcome::Evicted => Some("evicted"),
            LearnOutcome::TableFull => Some("table_full"),
        };
        if let Some(learn) = learn {
            let _ = writeln!(
                o,
                "  source {}{}",
                learn,
                e.learn_port
                    .as_ref()
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default()
            );
        }
        let lookup = match e.lookup {
            LookupOutcome::Skipped => None,
            LookupOutcome::Unicast => Some("unicast"),
            LookupOutcome::Unknown => Some("unknown: flooded"),
            LookupOutcome::Multicast => Some("multicast: flooded"),
        };
        if let Some(lookup) = lookup {
            let _ = writeln!(
                o,
                "  destination {}{}",
                lookup,
                e.lookup_port
                    .as_ref()
                    .map(|p| format!(" on {p}"))
                    .unwrap_or_default()
            );
        }
        for out in &e.out {
            let _ = writeln!(o, "  out {}: {}", out.port, out.result);
        }
        if let Some(d) = &e.drop {
            let _ = writeln!(o, "  dropped: {d}");
        } else if e.out.is_empty() {
            let _ = writeln!(o, "  no port to send to");
        }
    }
    o
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

/// `worker list`'s table: a line per worker, then one per queue it polls.
fn worker_table(workers: &[WorkerInfo]) -> String {
    use std::fmt::Write;
    let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
    let mut o = format!(
        "{:<6} {:>4} {:<9} {:>6} {:>14} {:>14} {:>9} {:>10}\n",
        "WORKER", "CPU", "MODE", "BUSY%", "POLLS", "FRAMES", "FRAMES/B", "SLEEPS"
    );
    for w in workers {
        let bursts: u64 = w.bursts.iter().map(|b| b.1).sum();
        let _ = writeln!(
            o,
            "{:<6} {:>4} {:<9} {:>5.1}% {:>14} {:>14} {:>9.1} {:>10}",
            w.id,
            w.cpu.map_or("-".to_string(), |c| c.to_string()),
            w.mode,
            pct(w.busy_seconds, w.busy_seconds + w.idle_seconds),
            w.polls,
            w.frames,
            if bursts > 0 {
                w.frames as f64 / bursts as f64
            } else {
                0.0
            },
            w.sleeps
        );
        for q in &w.queues {
            let _ = writeln!(
                o,
                "  port {:<20} queue {:<3} frames {:>14}  busy share {:>5.1}%",
                q.port,
                q.queue,
                q.frames,
                pct(q.busy_seconds, w.busy_seconds)
            );
        }
    }
    o
}
