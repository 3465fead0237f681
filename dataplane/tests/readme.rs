//! The README's quick starts, as a reader runs them: `switchyard run` with
//! no flags (the embedded default config and the default control socket,
//! `/run/switchyard/control.sock`), then the sections' own command lines,
//! read from README.md: the `port add` lines, the testpmd pods (memif and
//! vhost-user), the QEMU guests, and the commands that show what happened.
//!
//! Each runs in a mount namespace of its own whose `/run` and `/var/lib` are
//! empty, so the default paths are its own and cannot meet a switch that
//! runs on this machine.

mod common;
#[path = "common/qemu.rs"]
mod qemu;

use std::io::{BufRead, Write};
use std::net::Ipv4Addr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// The shell lines of the quick start's first code block, `\`-continued
/// lines joined, comments and blank lines left out.
fn quick_start() -> Vec<String> {
    shell_lines("Quick start: two testpmd pods through the switch")
}

/// The shell lines of the first code block of the README's section
/// `heading`, as [`quick_start`] reads them.
fn shell_lines(heading: &str) -> Vec<String> {
    commands(&block_lines(heading))
}

/// `lines` without their comment lines.
fn commands(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| !l.starts_with('#'))
        .cloned()
        .collect()
}

/// The text of the README's section `heading`, up to the next section.
fn section(heading: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let rest = readme
        .split(&format!("\n## {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("the section {heading:?}"))
        .to_string();
    match rest.find("\n## ") {
        Some(end) => rest[..end].to_string(),
        None => rest,
    }
}

/// The lines of the first code block of the README's section `heading`,
/// as [`blocks`] reads them.
fn block_lines(heading: &str) -> Vec<String> {
    blocks(heading).swap_remove(0)
}

/// The lines of each `sh` code block of the README's section `heading`,
/// in order: `\`-continued lines joined, a comment after a command
/// dropped, blank lines left out; comment lines kept (they say where the
/// commands below them run).
fn blocks(heading: &str) -> Vec<Vec<String>> {
    let section = section(heading);
    let blocks: Vec<Vec<String>> = section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("\n```").next().unwrap_or_default())
        .map(block_text_lines)
        .collect();
    assert!(
        !blocks.is_empty(),
        "no code block in the section {heading:?}"
    );
    blocks
}

fn block_text_lines(block: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cont = String::new();
    for l in block.lines() {
        let l = l.trim_end();
        if let Some(part) = l.strip_suffix('\\') {
            cont.push_str(part);
            continue;
        }
        let whole = std::mem::take(&mut cont) + l;
        let whole = if whole.trim_start().starts_with('#') {
            whole.trim().to_string()
        } else {
            // A comment after the command (the quick start's have no `#`
            // of their own).
            whole
                .split(" #")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        if !whole.is_empty() {
            lines.push(whole);
        }
    }
    lines
}

/// A mount namespace with empty `/run` and `/var/lib`, held by a process
/// that ends when dropped.
struct PrivateRun {
    holder: Child,
}

impl PrivateRun {
    fn new() -> PrivateRun {
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(
                "for d in /run /var/lib; do mount -t tmpfs -o mode=755 tmpfs $d || exit 1; done; \
                 echo ready; exec cat",
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the private mount namespace");
        PrivateRun { holder }
    }

    /// `sh -c LINE` in the namespace, with our binaries first on PATH (as
    /// the quick start's `export PATH=...` has them).
    fn sh(&self, line: &str) -> Command {
        let bin = switchyard_bin();
        let dir = bin.parent().unwrap();
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.holder.id().to_string())
            .args(["-m", "--", "sh", "-c", line])
            .env(
                "PATH",
                format!("{}:{}", dir.display(), std::env::var("PATH").unwrap()),
            )
            .env_remove("SWITCHYARD_CONTROL");
        c
    }

    fn sh_ok(&self, line: &str) -> String {
        run_ok(&mut self.sh(line))
    }

    /// `switchyard run` as the README has it (no flags, no config), its
    /// output in `log`; returns once it answers on the default socket.
    fn run_switch(&self, log: &tempfile::NamedTempFile) -> Child {
        let switch = self
            .sh("exec switchyard run")
            .env("RUST_LOG", "info")
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        wait_for(
            Duration::from_secs(10),
            "the default control socket",
            || {
                self.sh("switchyard bridge list")
                    .output()
                    .unwrap()
                    .status
                    .success()
                    .then_some(())
            },
        );
        switch
    }
}

/// Stops a switch [`PrivateRun::run_switch`] started; one that ended
/// badly, or logged a panic or an error, fails the test.
fn stop_switch(switch: &mut Child, log: &tempfile::NamedTempFile) {
    let ending = terminate(switch, Duration::from_secs(10));
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    check_ending("the switch", ending, &text, &[]);
}

impl Drop for PrivateRun {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

#[test]
fn the_quick_start_runs_as_the_readme_has_it() {
    let _g = serial();
    let lines = quick_start();
    let find =
        |start: &str| -> Vec<&String> { lines.iter().filter(|l| l.starts_with(start)).collect() };
    // Its first lines build and put the binaries on PATH; the test has
    // built them (workspace_bin) and puts them there itself.
    assert_eq!(lines[0], "cargo build --release");
    assert!(lines[1].starts_with("export PATH=$PWD/target/release"));
    assert_eq!(lines[2], "switchyard run &", "{lines:#?}");
    let node = PrivateRun::new();
    // `switchyard run`: no flags, no config; answers on the default socket.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut switch = node.run_switch(&log);
    node.sh_ok("test -S /run/switchyard/control.sock");
    assert!(node.sh_ok("switchyard bridge list").contains("default"));

    for add in find("switchyard port add") {
        node.sh_ok(add);
    }
    // The pods: the quick start's command lines, typed into as it says
    // (each starts forwarding; pod A then sends 4 bursts of 32 frames).
    let pods = find("dpdk-testpmd");
    assert_eq!(pods.len(), 2, "{lines:#?}");
    assert!(pods[0].contains("--file-prefix pod-b") && pods[1].contains("--file-prefix pod-a"));
    let mut b = Testpmd::from_command(node.sh(&format!("exec stdbuf -oL -eL {}", pods[0])));
    let mut a = Testpmd::from_command(node.sh(&format!("exec stdbuf -oL -eL {}", pods[1])));
    let sw_cli = |args: &str| node.sh_ok(&format!("switchyard {args}"));
    wait_for(Duration::from_secs(15), "both pods linked", || {
        let list = sw_cli("port list");
        (list.lines().filter(|l| l.contains(" up ")).count() == 2).then_some(())
    });
    a.send_bursts(4);
    assert_eq!(b.wait_rx(0, 128), 128, "pod B's frames");

    // "A vhost-user pod joins the same bridge the same way": the quick
    // start's second block, a DPDK virtio_user pod; pod A's next bursts
    // reach it as well as pod B.
    let vhost = commands(&blocks("Quick start: two testpmd pods through the switch")[1]);
    assert_eq!(vhost.len(), 2, "{vhost:#?}");
    assert!(
        vhost[0].starts_with("switchyard port add pod-c --kind vhost-user"),
        "{vhost:#?}"
    );
    assert!(
        vhost[1].starts_with("dpdk-testpmd") && vhost[1].contains("net_virtio_user0"),
        "{vhost:#?}"
    );
    node.sh_ok(&vhost[0]);
    let mut c = Testpmd::from_command(node.sh(&format!("exec stdbuf -oL -eL {}", vhost[1])));
    wait_for(Duration::from_secs(15), "pod C linked", || {
        let list = sw_cli("port list");
        (list.lines().filter(|l| l.contains(" up ")).count() == 3).then_some(())
    });
    a.send_bursts(4);
    assert_eq!(b.wait_rx(0, 256), 256, "pod B's frames");
    assert_eq!(c.wait_rx(0, 128), 128, "pod C's frames");

    // "Upgrading": a new switch takes the running one's ports over, as the
    // README has it; the pods (DPDK memif and virtio_user clients, which
    // never dial a restarted switch again) go on as if nothing happened.
    let upgrade = shell_lines("Upgrading");
    assert_eq!(upgrade, ["switchyard run --takeover &"], "{upgrade:?}");
    let mut new = node
        .sh(&format!("exec {}", upgrade[0].trim_end_matches('&').trim()))
        .env("RUST_LOG", "info")
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let old = wait_for(
        Duration::from_secs(30),
        "the old switch to hand over",
        || switch.try_wait().unwrap(),
    );
    assert!(old.success(), "{old}");
    std::mem::swap(&mut switch, &mut new);
    // The old switch exits once it has handed over; the new one says so
    // a moment later, once it runs the ports.
    wait_for(
        Duration::from_secs(10),
        "the new switch to say it took over",
        || {
            let text = std::fs::read_to_string(log.path()).unwrap();
            text.contains("switchyard took over").then_some(())
        },
    );
    a.send_bursts(4);
    assert_eq!(
        b.wait_rx(0, 384),
        384,
        "pod B's frames through the new switch"
    );
    assert_eq!(
        c.wait_rx(0, 256),
        256,
        "pod C's frames through the new switch"
    );
    let ports: Vec<switchyard_api::PortInfo> =
        serde_json::from_str(&sw_cli("port list --json")).unwrap();
    assert!(
        ports
            .iter()
            .all(|p| p.status.link_up && p.status.connects == 1),
        "{ports:?}"
    );
    // The commands that show it: every one the quick start lists runs.
    for show in [
        "switchyard port list",
        "switchyard stats",
        "switchyard mac list default",
    ] {
        assert!(
            lines.iter().any(|l| l == show),
            "{show} not in the quick start"
        );
    }
    assert!(sw_cli("stats").contains("pod-b"));
    let macs = sw_cli("mac list default");
    assert!(macs.contains("pod-a"), "pod A's MAC learned: {macs}");
    drop((a, b, c));
    stop_switch(&mut switch, &log);
    // The ports were persisted in the default state directory.
    node.sh_ok("test -s /var/lib/switchyard/state.json");
}

/// "Several interfaces on one socket": the section's two `port add` lines
/// and its testpmd network function with a vdev per interface, typed into
/// as it says; each interface's frames reach the other.
#[test]
fn the_shared_socket_quick_start_runs_as_the_readme_has_it() {
    let _g = serial();
    let lines = block_lines("Several interfaces on one socket");
    let node = PrivateRun::new();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut switch = node.run_switch(&log);
    let sw_cli = |args: &str| node.sh_ok(&format!("switchyard {args}"));
    let adds: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("switchyard port add"))
        .collect();
    assert_eq!(adds.len(), 2, "{lines:#?}");
    for add in adds {
        node.sh_ok(add);
    }
    let nf: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("dpdk-testpmd"))
        .collect();
    assert_eq!(nf.len(), 1, "{lines:#?}");
    assert!(
        lines.iter().any(|l| l == "#   testpmd> start tx_first 4"),
        "{lines:#?}"
    );
    let mut t = Testpmd::from_command(node.sh(&format!("exec stdbuf -oL -eL {}", nf[0])));
    wait_for(Duration::from_secs(15), "both interfaces linked", || {
        let list = sw_cli("port list");
        (list.lines().filter(|l| l.contains(" up ")).count() == 2).then_some(())
    });
    t.send_bursts(4);
    assert_eq!(t.wait_rx(0, 128), 128, "south's frames at north");
    assert_eq!(t.wait_rx(1, 128), 128, "north's frames at south");
    let list = lines
        .iter()
        .find(|l| l.starts_with("switchyard port list"))
        .expect("the port list line");
    let shown = node.sh_ok(list);
    for id in ["id=0", "id=1"] {
        assert!(
            shown.contains(&format!("/run/switchyard/nf.sock {id}")),
            "{shown}"
        );
    }
    t.pause();
    drop(t);
    stop_switch(&mut switch, &log);
}

/// "Overlay: pods on two nodes": two nodes whose VTEPs are the README's
/// addresses, in different subnets with a router between, each running a
/// switch; the section's commands run on the node their comment names
/// (`# node N`). A pod on each node's `default` bridge (a namespace on a
/// veth, an af-packet port) then reaches the other at the MTU the section
/// gives.
#[test]
fn the_overlay_quick_start_joins_two_nodes_as_the_readme_has_it() {
    let _g = serial();
    let lines = block_lines("Overlay: pods on two nodes");
    // Each node's commands, and its VTEP address from its comment.
    let mut nodes: Vec<(Ipv4Addr, Vec<String>)> = Vec::new();
    for l in &lines {
        if let Some(c) = l.strip_prefix("# node ") {
            let vtep = c
                .split_whitespace()
                .find_map(|w| w.trim_end_matches(':').parse::<Ipv4Addr>().ok())
                .unwrap_or_else(|| panic!("no VTEP address in {l:?}"));
            nodes.push((vtep, Vec::new()));
        } else if !l.starts_with('#') {
            nodes
                .last_mut()
                .expect("a command before any node")
                .1
                .push(l.clone());
        }
    }
    assert_eq!(nodes.len(), 2, "{lines:?}");
    let router = Netns::new("ovr");
    router.sh_ok("sysctl -q -w net.ipv4.ip_forward=1");
    let mut switches = Vec::new();
    let mut pods = Vec::new();
    for (i, (vtep, _)) in nodes.iter().enumerate() {
        let ns = Netns::new(&format!("ov{i}"));
        veth(&router, &format!("r{i}"), &ns, "eth0");
        // The VTEP's subnet: its /24, the router at .1.
        let gw = Ipv4Addr::from(u32::from(*vtep) & 0xffff_ff00 | 1);
        router.sh_ok(&format!("ip addr add {gw}/24 dev r{i}"));
        ns.sh_ok(&format!(
            "ip addr add {vtep}/24 dev eth0 && ip route add default via {gw}"
        ));
        let sw = Switch::start_in(Some(&ns.name), "[[bridge]]\nname = \"default\"\n");
        let pod = Netns::new(&format!("ovp{i}"));
        veth(&ns, "pod0", &pod, "eth0");
        pod.sh_ok(&format!(
            "ip addr add 10.77.0.{}/24 dev eth0 && ip link set eth0 mtu 1450",
            i + 1
        ));
        sw.add_port(&["pod", "--kind", "af-packet", "--interface", "pod0"]);
        switches.push((ns, sw));
        pods.push(pod);
    }
    let bin = switchyard_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap()
    );
    for ((_, cmds), (_, sw)) in nodes.iter().zip(&switches) {
        for c in cmds {
            run_ok(
                Command::new("sh")
                    .args(["-c", c])
                    .env("PATH", &path)
                    .env("SWITCHYARD_CONTROL", sw.control()),
            );
        }
    }
    for (_, sw) in &switches {
        let ports: Vec<switchyard_api::PortInfo> =
            serde_json::from_str(&sw.cli_ok(&["port", "list", "--json"])).unwrap();
        let tunnel = ports
            .into_iter()
            .find(|p| matches!(p.spec.kind, switchyard_api::KindSpec::Vxlan(_)))
            .expect("a tunnel");
        assert!(tunnel.status.link_up, "{tunnel:?}");
        assert_eq!(tunnel.status.mtu, Some(1450), "{tunnel:?}");
    }
    pods[0].sh_ok("busybox ping -c 3 -i 0.2 -W 2 10.77.0.2");
    // A full-size frame crosses: 1450 bytes of IP, unfragmented.
    pods[1].sh_ok("busybox ping -c 2 -i 0.2 -W 2 -s 1422 10.77.0.1");
}

/// "VMs with QEMU": the section's two `port add` lines and its two QEMU
/// command lines, run as they stand with `$KERNEL` and `$INITRD` the guest
/// `common/qemu.rs` builds (Debian's cloud kernel, busybox-static) and
/// `$ACCEL` the value the section gives for this machine's accelerator.
/// QEMU takes the ports' two queue pairs, the driver brings both up, the
/// switch logs them, and the guests ping each other.
#[test]
fn the_qemu_guests_run_as_the_readme_has_them() {
    let _g = serial();
    let lines = shell_lines("VMs with QEMU");
    let adds: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("switchyard port add"))
        .collect();
    let vms: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("qemu-system-x86_64"))
        .collect();
    assert_eq!((adds.len(), vms.len()), (2, 2), "{lines:#?}");
    let accel = readme_accel(qemu::accel());
    let image = qemu::image();
    let node = PrivateRun::new();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut switch = node.run_switch(&log);
    let mut guests = Vec::new();
    for (add, vm) in adds.iter().zip(&vms) {
        node.sh_ok(add);
        let mut qemu = node.sh(&format!("exec {vm}"));
        qemu.env("KERNEL", &image.kernel)
            .env("INITRD", &image.initrd)
            .env("ACCEL", &accel);
        guests.push(ConsoleGuest::start(qemu));
    }
    let names: Vec<&str> = adds
        .iter()
        .map(|a| a.split_whitespace().nth(3).expect("a port name"))
        .collect();
    let ips = ["10.214.0.1", "10.214.0.2"];
    for (g, ip) in guests.iter_mut().zip(ips) {
        g.wait_shell(qemu::boot_limit());
        g.sh_ok(&format!("ip addr add {ip}/24 dev eth0"));
    }
    // Both ports up, each with the two pairs of its `--queues 2` and of
    // QEMU's `queues=2`: the guests' drivers enable one per vCPU.
    let sw_cli = |args: &str| node.sh_ok(&format!("switchyard {args}"));
    wait_for(Duration::from_secs(60), "both guests' queue pairs", || {
        let ports: Vec<switchyard_api::PortInfo> =
            serde_json::from_str(&sw_cli("port list --json")).unwrap();
        names
            .iter()
            .all(|n| {
                ports
                    .iter()
                    .any(|p| p.spec.name == *n && p.status.link_up && p.status.rx_queues == 2)
            })
            .then_some(())
    });
    let text = std::fs::read_to_string(log.path()).unwrap();
    for n in &names {
        for pair in 0..2 {
            assert!(
                text.lines().any(|l| l.contains("queue pair up")
                    && l.contains(&format!("port={n}"))
                    && l.contains(&format!("pair={pair}"))),
                "the switch logs {n}'s queue pair {pair}:\n{text}"
            );
        }
    }
    let (one, two) = guests.split_at_mut(1);
    one[0].sh_ok(&format!("ping -c 3 -W 10 {}", ips[1]));
    two[0].sh_ok(&format!("ping -c 3 -W 10 {}", ips[0]));
    for g in &guests {
        let qemu_log = g.stderr();
        for refused in ["more queues than supported", "PROTOCOL_F_CONFIG"] {
            assert!(
                !qemu_log.contains(refused),
                "QEMU refused what the switch offered:\n{qemu_log}"
            );
        }
    }
    drop(guests);
    stop_switch(&mut switch, &log);
}

/// `$ACCEL` as the README's QEMU section gives it for `accel` (`kvm` or
/// `tcg`): its `ACCEL='...'` that names that accelerator.
fn readme_accel(accel: &str) -> String {
    let text = section("VMs with QEMU");
    let want = format!("-accel {accel}");
    text.split("ACCEL='")
        .skip(1)
        .filter_map(|s| s.split('\'').next())
        .find(|v| v.starts_with(&want))
        .unwrap_or_else(|| panic!("the QEMU section gives no ACCEL='{want} ...'"))
        .to_string()
}

/// A QEMU started from a README command line (`-nographic`: the guest's
/// serial console is QEMU's stdin and stdout), driven through its shell,
/// killed by PID on drop.
struct ConsoleGuest {
    child: Child,
    stdin: ChildStdin,
    console: Arc<Mutex<Vec<u8>>>,
    stderr: tempfile::NamedTempFile,
    commands: usize,
}

impl ConsoleGuest {
    fn start(mut cmd: Command) -> ConsoleGuest {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .expect("start qemu-system-x86_64");
        let console = qemu::collected(child.stdout.take().unwrap());
        let stdin = child.stdin.take().unwrap();
        ConsoleGuest {
            child,
            stdin,
            console,
            stderr,
            commands: 0,
        }
    }

    fn console(&self) -> String {
        String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    /// The status `cmd` exited with, once the console shows it, typing it
    /// into the shell again every `every` until then (a shell not yet
    /// started loses what is typed); and what the console printed.
    fn run(&mut self, cmd: &str, limit: Duration, every: Duration) -> (i32, String) {
        self.commands += 1;
        let marker = format!("@@done{}@@", self.commands);
        let start = self.console.lock().unwrap().len();
        let end = Instant::now() + limit;
        let mut typed: Option<Instant> = None;
        loop {
            if typed.is_none_or(|t| t.elapsed() >= every) {
                // The terminal echoes the line with `$?` unexpanded: only
                // the shell's own echo prints the marker and a number.
                let _ = write!(self.stdin, "{cmd}\necho {marker}$?@@\n");
                let _ = self.stdin.flush();
                typed = Some(Instant::now());
            }
            let out = String::from_utf8_lossy(&self.console.lock().unwrap()[start..]).into_owned();
            let code = out.split(&marker).skip(1).find_map(|rest| {
                let (n, _) = rest.split_once("@@")?;
                n.parse::<i32>().ok()
            });
            if let Some(code) = code {
                return (code, out);
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "QEMU exited ({st}) during `{cmd}`: {}\nconsole:\n{}",
                    self.stderr(),
                    self.console()
                );
            }
            if Instant::now() > end {
                panic!(
                    "timed out after {limit:?} on `{cmd}`; console:\n{}",
                    self.console()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the guest has booted and its shell answers.
    fn wait_shell(&mut self, limit: Duration) {
        self.run("true", limit, Duration::from_secs(5));
    }

    /// Runs `cmd` in the guest's shell; panics unless it exits 0.
    fn sh_ok(&mut self, cmd: &str) -> String {
        let (code, out) = self.run(cmd, Duration::from_secs(60), Duration::MAX);
        assert_eq!(code, 0, "`{cmd}` exited {code}:\n{out}");
        out
    }
}

impl Drop for ConsoleGuest {
    /// Kills QEMU; one that had exited by itself fails the test.
    fn drop(&mut self) {
        let early = self.child.try_wait().ok().flatten();
        if std::thread::panicking() || early.is_some() {
            eprintln!(
                "---- QEMU stderr ----\n{}\n---- console ----\n{}",
                self.stderr(),
                self.console()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let (Some(st), false) = (early, std::thread::panicking()) {
            panic!("QEMU exited during the test ({st})");
        }
    }
}

/// `fuzz/README.md` lists every fuzz target: each file of
/// `fuzz/fuzz_targets/`, each a `[[bin]]` of `fuzz/Cargo.toml`.
#[test]
fn the_fuzz_readme_lists_every_target() {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files: Vec<String> = std::fs::read_dir(fuzz.join("fuzz_targets"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    files.sort();
    let cargo = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    let mut bins: Vec<String> = cargo
        .split("[[bin]]")
        .skip(1)
        .filter_map(|b| {
            let line = b.lines().find(|l| l.trim_start().starts_with("name"))?;
            Some(line.split('"').nth(1)?.to_string())
        })
        .collect();
    bins.sort();
    assert_eq!(files, bins, "fuzz_targets/ and Cargo.toml's [[bin]]s");
    let readme = std::fs::read_to_string(fuzz.join("README.md")).unwrap();
    let mut listed: Vec<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(str::to_string))
        .collect();
    listed.sort();
    assert_eq!(listed, files, "the targets fuzz/README.md lists");
}
