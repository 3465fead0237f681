//! The README's quick start, as a reader runs it: `switchyard run` with no
//! flags (the embedded default config and the default control socket,
//! `/run/switchyard/control.sock`), then the quick start's own command
//! lines, read from README.md: its `port add` lines, its two testpmd pods,
//! and the commands that show what happened.
//!
//! It runs in a mount namespace of its own whose `/run` and `/var/lib` are
//! empty, so the default paths are its own and cannot meet a switch that
//! runs on this machine.

mod common;

use std::io::BufRead;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// The shell lines of the quick start's code block, `\`-continued lines
/// joined, comments and blank lines left out.
fn quick_start() -> Vec<String> {
    shell_lines("Quick start: two testpmd pods through the switch")
}

/// The shell lines of the first code block of the README's section
/// `heading`, as [`quick_start`] reads them.
fn shell_lines(heading: &str) -> Vec<String> {
    block_lines(heading)
        .into_iter()
        .filter(|l| !l.starts_with('#'))
        .collect()
}

/// The lines of the first code block of the README's section `heading`:
/// `\`-continued lines joined, a comment after a command dropped, blank
/// lines left out; comment lines kept (they say where the commands below
/// them run).
fn block_lines(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split(&format!("\n## {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("the section {heading:?}"));
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("its code block");
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

    // "Upgrading": a new switch takes the running one's ports over, as the
    // README has it; the pods (DPDK memif clients, which never dial a
    // restarted switch again) go on as if nothing happened.
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
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(text.contains("switchyard took over"), "{text}");
    a.send_bursts(4);
    assert_eq!(
        b.wait_rx(0, 256),
        256,
        "pod B's frames through the new switch"
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
    drop((a, b));
    terminate(&mut switch, Duration::from_secs(10));
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
    terminate(&mut switch, Duration::from_secs(10));
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
    pods[0].sh_ok("busybox ping -c 3 -W 2 10.77.0.2");
    // A full-size frame crosses: 1450 bytes of IP, unfragmented.
    pods[1].sh_ok("busybox ping -c 2 -W 2 -s 1422 10.77.0.1");
}
