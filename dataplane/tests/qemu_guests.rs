//! End-to-end: real QEMU guests (Linux `virtio_net` drivers) on vhost-user
//! ports, one with the switch as socket server and one as client: ping both
//! ways, a TCP transfer with checksum offload and TSO negotiated, two
//! queue pairs, a guest's QEMU killed and started
//! again, the switch replaced by takeover 20 times under a 10 ms ping (not
//! a reply lost), and the switch restarted (SIGTERM and kill -9) under a
//! running ping, after which the guests go on where they were.
//!
//! The guests are built at test time from Debian packages
//! (`common/qemu.rs`); they boot in seconds under TCG.

mod common;
#[path = "common/qemu.rs"]
mod qemu;

use std::time::Duration;

use common::{ping_summary, serial, super_frames, wait_for, Switch};
use qemu::{Guest, GuestSpec, SwitchRole};
use switchyard_api::Request;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";
const IP_A: &str = "10.213.0.1";
const IP_B: &str = "10.213.0.2";
/// Guest B's queue pairs (and vCPUs).
const PAIRS_B: u16 = 2;
const CMD: Duration = Duration::from_secs(60);

/// Adds a vhost-user port for a guest and returns the guest's settings.
fn port(sw: &Switch, name: &str, role: SwitchRole, ip: &str, mac: &str, queues: u16) -> GuestSpec {
    let socket = sw.path(&format!("{name}.sock"));
    let role_arg = match role {
        SwitchRole::Server => "server",
        SwitchRole::Client => "client",
    };
    let queues_arg = queues.to_string();
    sw.cli_ok(&[
        "port",
        "add",
        name,
        "--kind",
        "vhost-user",
        "--role",
        role_arg,
        "--socket",
        &socket,
        "--queues",
        &queues_arg,
        "--bridge",
        "default",
    ]);
    GuestSpec {
        name: name.to_string(),
        socket: socket.into(),
        role,
        ip: format!("{ip}/24"),
        mac: mac.to_string(),
        queues,
    }
}

/// A switch with guest A behind a server-role port (`pairs_a` queue
/// pairs) and guest B behind a client-role port (two), both booted and
/// linked.
fn two_guests(pairs_a: u16) -> (Switch, Guest, Guest) {
    let sw = Switch::start(BRIDGE);
    let a = port(
        &sw,
        "vm-a",
        SwitchRole::Server,
        IP_A,
        "52:54:00:53:00:0a",
        pairs_a,
    );
    let b = port(
        &sw,
        "vm-b",
        SwitchRole::Client,
        IP_B,
        "52:54:00:53:00:0b",
        PAIRS_B,
    );
    let mut a = Guest::start(a);
    let mut b = Guest::start(b);
    a.wait_ready();
    b.wait_ready();
    links_up(&sw, &a, &b);
    (sw, a, b)
}

/// Both ports up, with every queue pair of each guest's driver.
fn links_up(sw: &Switch, a: &Guest, b: &Guest) {
    for g in [a, b] {
        let name = &g.spec.name;
        sw.wait_link(name, true);
        wait_for(
            Duration::from_secs(30),
            &format!("{name}'s queue pairs with the workers"),
            || (sw.port(name).status.rx_queues == usize::from(g.spec.queues)).then_some(()),
        );
    }
}

/// Frames the switch received on each receive queue of `port` (queue `n`
/// is the guest's transmit queue of pair `n`), summed over the workers
/// that polled it.
fn received_by_queue(sw: &Switch, port: &str) -> Vec<u64> {
    let workers = sw.client().ask(&Request::worker_list()).unwrap();
    let mut by_queue = Vec::new();
    for q in workers.iter().flat_map(|w| &w.queues) {
        if q.port == port {
            if by_queue.len() <= q.queue {
                by_queue.resize(q.queue + 1, 0);
            }
            by_queue[q.queue] += q.frames;
        }
    }
    by_queue
}

/// What crossed each queue pair of guest `g`'s port so far, by pair:
/// (frames the switch received on the pair's queue, from the guest;
/// packets the guest's driver received on it, `ethtool -S`, from the
/// switch). Every pair is in use.
fn pair_counts(sw: &Switch, g: &mut Guest) -> Vec<(u64, u64)> {
    let name = g.spec.name.clone();
    let switch_rx = received_by_queue(sw, &name);
    let guest = g.queue_packets();
    assert_eq!(
        guest.len(),
        usize::from(g.spec.queues),
        "{name}'s driver's queue pairs: {guest:?}"
    );
    guest
        .iter()
        .enumerate()
        .map(|(q, &(guest_rx, _))| (switch_rx.get(q).copied().unwrap_or(0), guest_rx))
        .collect()
}

fn ping(g: &mut Guest, to: &str, extra: &str) {
    g.sh_ok(&format!("ping -c 3 -W 10 {extra} {to}"), CMD);
}

/// An 8 MiB file of random bytes served by guest A's `httpd`, fetched by
/// guest B over TCP, and compared by MD5. (Making the file is the emulated
/// guest's CPU alone: it gets the fetch's bound. A CI run on a slow VM
/// saw the guest's `dd` starved past the 60 s of other commands, the
/// guest kernel reporting a soft lockup of 52 s.)
fn tcp_transfer(a: &mut Guest, b: &mut Guest) {
    let out = a.sh_ok(
        "mkdir -p /www && dd if=/dev/urandom of=/www/blob bs=1024 count=8192 2>/dev/null \
         && md5sum /www/blob && (pidof httpd || httpd -p 8080 -h /www)",
        Duration::from_secs(120),
    );
    let sum = md5_in(&out).expect("md5sum printed");
    let got = b.sh_ok(
        &format!("wget -q -O - http://{IP_A}:8080/blob | md5sum"),
        Duration::from_secs(120),
    );
    assert_eq!(
        md5_in(&got),
        Some(sum.clone()),
        "the file arrived whole: {got}"
    );
}

/// The first 32-hex-digit word of `out` that is not part of the command.
fn md5_in(out: &str) -> Option<String> {
    out.split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 32)
        .map(str::to_string)
}

/// Fails if a guest's kernel complained about its virtio rings (a queue it
/// found broken, a used id that is not a head, a transmit timeout).
fn assert_rings_sound(g: &Guest) {
    let console = g.console();
    for bad in [
        "is not a head",
        "virtio_net virtio",
        "Broken",
        "NETDEV WATCHDOG",
        "BUG",
    ] {
        assert!(
            !console.contains(bad),
            "{}: the guest kernel printed `{bad}`:\n{console}",
            g.spec.name
        );
    }
    let log = g.qemu_log();
    assert!(
        !log.contains("VHOST_USER_PROTOCOL_F_CONFIG"),
        "{}: QEMU refused a protocol feature we offered:\n{log}",
        g.spec.name
    );
}

#[test]
fn guests_ping_both_ways_carry_tcp_and_use_both_queue_pairs() {
    let _g = serial();
    // Both guests with two queue pairs: the switch sends what it took on
    // queue n of one port out on queue n of the other
    // (`ViewPort::tx_for`), so a guest receives on its second pair only
    // what the other sent on its own.
    let (sw, mut a, mut b) = two_guests(PAIRS_B);
    ping(&mut a, IP_B, "");
    ping(&mut b, IP_A, "");
    // A full-size frame each way (1472 + 8 + 20 = 1500 bytes of IP).
    ping(&mut b, IP_A, "-s 1472");
    // Each guest pings the other from each vCPU in turn: its driver maps
    // CPU n to transmit queue n, so the requests cross pair n of both
    // ports, one guest's on the way in, the other's on the way out. Each
    // pair carries frames both ways, counted on both sides.
    for cpu in 0..PAIRS_B {
        let q = usize::from(cpu);
        let before = [pair_counts(&sw, &mut a), pair_counts(&sw, &mut b)];
        for (g, to) in [(&mut a, IP_B), (&mut b, IP_A)] {
            g.sh_ok(&format!("taskset {} ping -c 2 -W 10 {to}", 1 << cpu), CMD);
        }
        for (g, before) in [&mut a, &mut b].into_iter().zip(before) {
            let after = pair_counts(&sw, g);
            let name = &g.spec.name;
            let counts = format!("{before:?} -> {after:?} (switch received, guest received)");
            assert!(
                after[q].0 > before[q].0,
                "{name}: nothing from the guest on pair {q}: {counts}"
            );
            assert!(
                after[q].1 > before[q].1,
                "{name}: nothing to the guest on pair {q}: {counts}"
            );
        }
    }
    // The drivers took checksum offload and TSO from the switch.
    for g in [&mut a, &mut b] {
        let k = g.sh_ok("ethtool -k eth0", CMD);
        for on in [
            "tx-checksumming: on",
            "tcp-segmentation-offload: on",
            "rx-checksumming: on",
        ] {
            assert!(k.contains(on), "{}: {on}:\n{k}", g.spec.name);
        }
    }
    tcp_transfer(&mut a, &mut b);
    // Guest A's TSO super-frames crossed the switch whole, both ports
    // handing them on with their virtio-net headers.
    let from_a = sw.stats("vm-a").totals;
    let to_b = sw.stats("vm-b").totals;
    assert!(
        super_frames(from_a.rx_bytes, from_a.rx_packets),
        "vm-a received {from_a:?}"
    );
    assert!(
        super_frames(to_b.tx_bytes, to_b.tx_packets),
        "vm-b sent {to_b:?}"
    );

    let log = sw.log();
    for pair in 0..PAIRS_B {
        assert!(
            log.lines().any(|l| l.contains("queue pair up")
                && l.contains("vm-b")
                && l.contains(&format!("pair={pair}"))),
            "the switch logs guest B's queue pair {pair}:\n{log}"
        );
    }
    let stats = sw.stats("vm-b");
    assert!(
        stats.totals.rx_packets > 0 && stats.totals.tx_packets > 0,
        "{stats:?}"
    );
    assert_rings_sound(&a);
    assert_rings_sound(&b);
}

#[test]
fn a_guest_whose_qemu_is_killed_boots_again_and_reconnects() {
    let _g = serial();
    let (sw, mut a, mut b) = two_guests(1);
    ping(&mut a, IP_B, "");
    // Each role: the switch waits for QEMU to reconnect (server) or
    // reconnects to QEMU's new socket (client).
    for victim in ["vm-a", "vm-b"] {
        let g = if victim == "vm-a" { &mut a } else { &mut b };
        g.kill9();
        sw.wait_link(victim, false);
        g.restart();
        g.wait_ready();
        links_up(&sw, &a, &b);
        ping(&mut a, IP_B, "");
        ping(&mut b, IP_A, "");
    }
    tcp_transfer(&mut a, &mut b);
    assert_rings_sound(&a);
    assert_rings_sound(&b);
}

/// What a guest's `ping -i INTERVAL` saw while the switch restarted.
#[derive(Debug)]
struct Outage {
    /// Requests sent and replies received, as the ping's summary says.
    sent: u32,
    received: u32,
    /// The longest time without a reply arriving, in seconds.
    silence: f64,
    /// Replies that came twice (a request the switch sent again).
    duplicates: u32,
}

/// Reads busybox ping's output: `seq=N ... time=T ms` per reply (replies
/// arrive at `N * interval + T`), and its summary.
fn outage(log: &str, interval: f64) -> Outage {
    let (sent, received) =
        ping_summary(log).unwrap_or_else(|| panic!("no summary: the ping did not end:\n{log}"));
    let mut arrivals: Vec<f64> = log
        .lines()
        .filter_map(|l| {
            let seq: u32 = l
                .split("seq=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let ms: f64 = l
                .split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some(f64::from(seq) * interval + ms / 1000.0)
        })
        .collect();
    arrivals.sort_by(f64::total_cmp);
    arrivals.dedup();
    let silence = arrivals.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    Outage {
        sent,
        received,
        silence,
        duplicates: log.matches("DUP!").count() as u32,
    }
}

/// The longest a guest may go without a reply: the switch's stop and start
/// on a loaded two-core machine, plus QEMU's one-second reconnect timer.
const MAX_SILENCE_SECS: f64 = 10.0;

/// Replies that may go missing: the pings sent while the switch was away
/// (a guest queues them in its ring, but the switch may take them before
/// the other guest's port is back up, and a port that is down drops what
/// is sent to it), plus one each way the switch may have written into a
/// guest's buffers and not yet handed over when it was killed.
fn max_lost(o: &Outage, interval: f64) -> u32 {
    (o.silence / interval).ceil() as u32 + 2
}

/// The kernel's lines in `dmesg` output (`[  12.345678] ...`), without
/// the console's echo and prompts around them.
fn kernel_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.find('[').map(|i| &l[i..]))
        .filter(|l| {
            l.split_once(']')
                .is_some_and(|(t, _)| t.trim_start_matches('[').trim().parse::<f64>().is_ok())
        })
        .collect()
}

/// Waits until guest `g`'s ping, writing to `/tmp/ping.log`, has a reply.
fn wait_replying(g: &mut Guest) {
    g.wait_sh(
        "grep -q seq= /tmp/ping.log",
        Duration::from_secs(60),
        "the ping's first reply",
    );
}

/// Fails if guest `g`'s ping has ended (its summary is out) by `when`:
/// it did not run through what the test did meanwhile.
fn assert_still_pinging(g: &mut Guest, when: &str) {
    let (code, out) = g.sh("grep 'packets transmitted' /tmp/ping.log", CMD);
    assert_ne!(
        code, 0,
        "{}: the ping had ended by {when}:\n{out}",
        g.spec.name
    );
}

/// Frames the switch received from each guest.
fn received(sw: &Switch) -> [u64; 2] {
    ["vm-a", "vm-b"].map(|p| sw.stats(p).totals.rx_packets)
}

#[test]
fn guests_carry_on_through_takeovers_and_restarts() {
    let _g = serial();
    let (mut sw, mut a, mut b) = two_guests(1);
    ping(&mut a, IP_B, "");

    // Takeovers: the switch is replaced 20 times while the guests ping
    // each other every 10 ms. Nothing is lost, nothing comes twice, the
    // ports never go down and the guests' kernels say nothing.
    const PINGS: u32 = 600;
    let dmesg: Vec<String> = [&mut a, &mut b]
        .into_iter()
        .map(|g| g.sh_ok("dmesg", CMD))
        .collect();
    a.sh_ok(
        &format!("ping -i 0.01 -c {PINGS} {IP_B} > /tmp/ping.log 2>&1 &"),
        CMD,
    );
    b.sh_ok(
        &format!("taskset 2 ping -i 0.01 -c {PINGS} {IP_A} > /tmp/ping.log 2>&1 &"),
        CMD,
    );
    wait_replying(&mut a);
    wait_replying(&mut b);
    for i in 0..20 {
        sw.takeover();
        // The new switch forwards both guests' pings before it is
        // replaced in turn.
        let from = received(&sw);
        wait_for(
            Duration::from_secs(10),
            &format!("takeover {i}: pings through the new switch"),
            || {
                let now = received(&sw);
                (now[0] > from[0] && now[1] > from[1]).then_some(())
            },
        );
    }
    for g in [&mut a, &mut b] {
        assert_still_pinging(g, "the last takeover");
    }
    for (g, before) in [&mut a, &mut b].into_iter().zip(dmesg) {
        let log = g.sh_ok("wait; cat /tmp/ping.log", Duration::from_secs(120));
        assert_eq!(
            ping_summary(&log),
            Some((PINGS, PINGS)),
            "{}: pings sent and answered (transmitted, received):\n{log}",
            g.spec.name
        );
        assert!(!log.contains("DUP!"), "{}: {log}", g.spec.name);
        assert!(!kernel_lines(&before).is_empty(), "no dmesg: {before}");
        let after = g.sh_ok("dmesg", CMD);
        let new: Vec<&str> = kernel_lines(&after)
            .into_iter()
            .filter(|l| !kernel_lines(&before).contains(l))
            .collect();
        assert!(
            new.is_empty(),
            "{}'s kernel spoke during the takeovers: {new:?}",
            g.spec.name
        );
    }
    for p in ["vm-a", "vm-b"] {
        let st = sw.port(p).status;
        assert!(st.link_up && st.connects == 1, "{p}: {st:?}");
    }

    // Restarts: SIGTERM, then kill -9.
    const INTERVAL: f64 = 0.1;
    const COUNT: u32 = 100;
    for kill in [false, true] {
        let how = if kill { "kill -9" } else { "SIGTERM" };
        // Guest A pings B all along; B pings A from its second vCPU, over
        // its second queue pair.
        a.sh_ok(
            &format!("ping -i {INTERVAL} -c {COUNT} -W 1 {IP_B} > /tmp/ping.log 2>&1 &"),
            CMD,
        );
        b.sh_ok(
            &format!("taskset 2 ping -i {INTERVAL} -c {COUNT} -W 1 {IP_A} > /tmp/ping.log 2>&1 &"),
            CMD,
        );
        wait_replying(&mut a);
        wait_replying(&mut b);
        let t = std::time::Instant::now();
        if kill {
            sw.kill9();
        } else {
            sw.stop();
        }
        sw.spawn();
        links_up(&sw, &a, &b);
        let back = t.elapsed();
        for g in [&mut a, &mut b] {
            assert_still_pinging(g, &format!("the switch's return after {how}"));
        }
        let mut seen = Vec::new();
        for g in [&mut a, &mut b] {
            let log = g.sh_ok("wait; cat /tmp/ping.log", Duration::from_secs(120));
            let o = outage(&log, INTERVAL);
            eprintln!(
                "{how}: {} saw {} of {} replies ({} duplicates), longest silence {:.2} s \
                 (switch back with all queues in {:.2} s)",
                g.spec.name,
                o.received,
                o.sent,
                o.duplicates,
                o.silence,
                back.as_secs_f64()
            );
            seen.push((g.spec.name.clone(), o, log));
        }
        for (name, o, log) in &seen {
            // Every request went out, most were answered (the switch is
            // away for a second or two of the ten), and no more went
            // missing than the outage explains.
            assert!(
                o.sent == COUNT
                    && o.received >= COUNT / 2
                    && o.sent - o.received <= max_lost(o, INTERVAL)
                    && o.silence < MAX_SILENCE_SECS,
                "{how}: {name}: {o:?}\n{log}"
            );
        }
        // The rings go on: both ways, full-size frames, TCP.
        ping(&mut a, IP_B, "-s 1472");
        ping(&mut b, IP_A, "");
        tcp_transfer(&mut a, &mut b);
        assert_rings_sound(&a);
        assert_rings_sound(&b);
    }
}
