//! The CLI's tables and texts, drawn from the daemon's typed answers.

use switchyard_api::{
    BridgeInfo, LearnOutcome, LookupOutcome, MacInfo, PortInfo, PortStats, TraceEntry, WorkerInfo,
};

/// `trace`'s text: a few lines per frame, as VPP's `show trace`.
pub(crate) fn trace_text(entries: &[TraceEntry]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for (i, e) in entries.iter().enumerate() {
        let _ = writeln!(
            o,
            "frame {}: in {}{} (worker {}), {} bytes, {} -> {}{}",
            i + 1,
            e.in_port,
            e.in_vtep
                .map(|v| format!(" (decapsulated from {v})"))
                .unwrap_or_default(),
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
            LookupOutcome::Answered => Some("a known neighbour's: answered by the bridge"),
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
            let vtep = out
                .vtep
                .map(|v| format!(" (encapsulated to {v})"))
                .unwrap_or_default();
            let _ = writeln!(o, "  out {}{vtep}: {}", out.port, out.result);
        }
        if let Some(d) = &e.drop {
            let _ = writeln!(o, "  dropped: {d}");
        } else if e.out.is_empty() && e.lookup != LookupOutcome::Answered {
            let _ = writeln!(o, "  no port to send to");
        }
    }
    o
}

/// `worker list`'s table: a line per worker, then one per queue it polls.
pub(crate) fn worker_table(workers: &[WorkerInfo]) -> String {
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

/// `port list`'s table: a line per port, its link and where it is. A
/// socket that several ports share (memif interfaces, told apart by id) is
/// shown with each port's interface: `PATH id=N`.
pub(crate) fn port_table(ports: &[PortInfo]) -> String {
    use std::fmt::Write;
    let mut users = std::collections::HashMap::new();
    for p in ports {
        if let Some(s) = p.spec.kind.socket() {
            *users.entry(s.addr.clone()).or_insert(0) += 1;
        }
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<20} {:<10} {:<7} {:<5} {:<12} {:<9} {:<40} PEER",
        "NAME", "KIND", "ROLE", "LINK", "BRIDGE", "VLAN", "SOCKET/IF"
    );
    for p in ports {
        let s = &p.spec;
        let _ = writeln!(
            o,
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
            match s.kind.socket() {
                Some(sock) if users.get(sock.addr) > Some(&1) =>
                    format!("{} id={}", sock.addr, sock.interface.unwrap_or(0)),
                Some(sock) => sock.addr.to_string(),
                None => s.kind.interface().unwrap_or("-").to_string(),
            },
            if p.status.link_up {
                &p.status.peer
            } else {
                &p.status.last_error
            }
            .as_deref()
            .unwrap_or_default()
        );
    }
    o
}

/// `stats`'s table: a line per port, its totals and drops by reason.
pub(crate) fn stats_table(stats: &[PortStats]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
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
        // Its policers, after the drops they cause.
        let mut drops = drops;
        if let Some(l) = &s.rate_limit {
            for (dir, m) in [("rx", &l.rx), ("tx", &l.tx)] {
                if let Some(m) = m {
                    drops.push(format!("({dir}-limit {m})"));
                }
            }
        }
        let _ = writeln!(
            o,
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
    o
}

/// `bridge list`'s table: a line per bridge, its MAC table counters.
pub(crate) fn bridge_table(bridges: &[BridgeInfo]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<20} {:>6} {:>10} {:>8} {:>8} {:>10} {:>12} {:>10}  PORTS",
        "NAME", "MACS", "LEARNED", "MOVED", "EVICTED", "AGED", "FLOODED", "ANSWERED"
    );
    for b in bridges {
        let c = b.counters;
        let _ = writeln!(
            o,
            "{:<20} {:>6} {:>10} {:>8} {:>8} {:>10} {:>12} {:>10}  {}",
            b.name,
            b.macs,
            c.learned,
            c.moved,
            c.evicted,
            c.aged,
            c.flooded,
            c.answered,
            b.ports.join(",")
        );
    }
    o
}

/// `mac list`'s table: a line per learned address.
pub(crate) fn mac_table(macs: &[MacInfo]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<18} {:>5} {:<20} {:>6}  VTEP",
        "MAC", "VLAN", "PORT", "AGE"
    );
    for m in macs {
        let vtep = m.vtep.map(|v| v.to_string()).unwrap_or_default();
        let _ = writeln!(
            o,
            "{:<18} {:>5} {:<20} {:>6}  {vtep}",
            m.mac, m.vlan, m.port, m.age_secs
        );
    }
    o
}

/// The remote VTEPs of the overlays, one line each.
pub(crate) fn vtep_table(vteps: &[switchyard_api::VtepInfo]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<16} {:<39} {:<39} {:<5} {:>8} TUNNELS",
        "OVERLAY", "REMOTE", "LOCAL", "LINK", "STATIONS"
    );
    for v in vteps {
        let _ = writeln!(
            o,
            "{:<16} {:<39} {:<39} {:<5} {:>8} {}{}",
            v.overlay,
            v.remote,
            v.local,
            if v.link_up { "up" } else { "down" },
            v.stations,
            v.tunnels.join(","),
            if v.from_config { " (config)" } else { "" }
        );
    }
    o
}
