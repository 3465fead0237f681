//! Test harness shared by the dataplane and CNI end-to-end tests: real
//! `dpdk-testpmd` processes driven through stdin, killed by PID and cleaned
//! up on drop. (The CNI and device plugin tests include this file with
//! `#[path]`.)
#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Tests that start testpmd run one at a time: the machine has two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `read` gives once it stops changing (two reads 100 ms apart
/// agree): counters after the frames in flight have landed. Bounded.
pub fn settled<T: PartialEq>(what: &str, mut read: impl FnMut() -> T) -> T {
    let end = Instant::now() + Duration::from_secs(10);
    let mut last = read();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = read();
        if now == last {
            return now;
        }
        if Instant::now() > end {
            panic!("{what} still changing after 10 s");
        }
        last = now;
    }
}

/// How a process a test stopped ended.
#[derive(Debug, Clone, Copy)]
pub enum Ending {
    /// It had exited by itself before it was told to stop.
    Early(std::process::ExitStatus),
    /// It exited once told to (SIGTERM).
    Stopped(std::process::ExitStatus),
    /// It did not exit within the grace time and was SIGKILLed.
    Killed,
}

/// Stops `child` with SIGTERM, and SIGKILL if it has not exited after
/// `grace`; says how it ended (see [`check_ending`]).
pub fn terminate(child: &mut Child, grace: Duration) -> Ending {
    if let Ok(Some(status)) = child.try_wait() {
        return Ending::Early(status);
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let end = Instant::now() + grace;
    while Instant::now() < end {
        if let Ok(Some(status)) = child.try_wait() {
            return Ending::Stopped(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ending::Killed
}

/// What is wrong with how a process a test started ended, if anything: a
/// non-zero exit (or a signal), not stopping within its grace time, or, in
/// its log, a panic (`panicked at`) or an `ERROR` line none of `expected`
/// is part of (a test that causes one on purpose says so). An early exit
/// with status 0 is not wrong (a switch stands down when asked). The log's
/// last lines come with the reason.
pub fn ending_fault(what: &str, ending: Ending, log: &str, expected: &[String]) -> Option<String> {
    let unexpected: Vec<&str> = log
        .lines()
        .filter(|l| {
            (l.contains("panicked at") || l.contains(" ERROR "))
                && !expected.iter().any(|e| l.contains(e.as_str()))
        })
        .collect();
    let why = match ending {
        Ending::Early(s) if !s.success() => format!("{what} exited by itself ({s})"),
        Ending::Stopped(s) if !s.success() => format!("{what} ended with {s} when stopped"),
        Ending::Killed => format!("{what} did not stop on SIGTERM in time and was killed"),
        _ if !unexpected.is_empty() => format!(
            "{what} logged what the test did not expect:\n{}",
            unexpected.join("\n")
        ),
        _ => return None,
    };
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(40)..].join("\n");
    Some(format!(
        "{why}\n---- the last lines of its log ----\n{tail}"
    ))
}

/// Fails the test with [`ending_fault`]'s reason, unless the test is
/// failing already (then the reason is printed).
pub fn check_ending(what: &str, ending: Ending, log: &str, expected: &[String]) {
    if let Some(fault) = ending_fault(what, ending, log, expected) {
        if std::thread::panicking() {
            eprintln!("{fault}");
        } else {
            panic!("{fault}");
        }
    }
}

/// A binary of this workspace, from the target directory this test runs
/// from, built from the current sources first (once per test process).
pub fn workspace_bin(package: &str, name: &str) -> std::path::PathBuf {
    // What was built: binary names, or `*` for all.
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let p = exe.parent().unwrap().parent().unwrap().join(name);
    // Built by this process already: the sources have not changed since.
    // (The lock is held through the build: two tests asking at once build
    // once.)
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == name || b == "*") {
        return p;
    }
    // Once per process: a binary left by an earlier build of other sources
    // would be tested in place of this one (cargo does nothing when it is
    // current). In the debug profile (`cargo test --workspace`, as the
    // test script runs), every binary at once with the workspace's tests:
    // the features that run unified, so that the binaries it built are
    // current (`cargo build -p PACKAGE` resolves the package's features
    // alone and builds its dependencies again, 30 s a package). In the
    // release profile (a test run by hand), the one package's.
    let mut build = Command::new(env!("CARGO"));
    let what = if p.parent().and_then(|d| d.file_name()) == Some("release".as_ref()) {
        build.args(["build", "--release", "-p", package, "--bin", name]);
        name
    } else {
        build.args(["build", "--workspace", "--bins", "--tests", "--locked"]);
        "*"
    };
    // Without what cargo sets for this test's package (`CARGO_PKG_NAME`
    // and the rest): build scripts that read them (cc's, ring's) would
    // run again, and their crates be built again, for each package's
    // tests in turn (90 s each).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&k.as_ref())
        {
            build.env_remove(k.as_ref());
        }
    }
    let st = build.status().unwrap();
    assert!(st.success(), "cargo build, for {package}'s {name}");
    assert!(p.exists(), "{package} has no binary {name}");
    built.push(what.to_string());
    p
}

/// The largest `RX-packets` a testpmd printed in its output (its
/// `--stats-period` reports, or `show port stats`).
pub fn rx_packets(log: &str) -> u64 {
    log.split("RX-packets:")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

static PREFIX: AtomicUsize = AtomicUsize::new(0);

/// The testpmd binary; tests fail loudly without it (the test script installs it).
pub fn testpmd_bin() -> &'static str {
    let p = "/usr/bin/dpdk-testpmd";
    assert!(
        Path::new(p).exists(),
        "dpdk-testpmd is missing: install dpdk, dpdk-dev and librte-net-memif23 (./scripts/test.sh does)"
    );
    p
}

/// A running `dpdk-testpmd -i`, driven through its stdin.
pub struct Testpmd {
    child: Child,
    stdin: ChildStdin,
    out: Arc<Mutex<String>>,
    prefix: String,
    /// Whether `/var/run/dpdk/<prefix>` and `/tmp/<prefix>` are its own.
    own_files: bool,
    /// Killed by the test ([`Testpmd::kill9`]): its exit is no crash.
    killed: bool,
}

impl Testpmd {
    /// Starts testpmd with the given `--vdev` arguments and testpmd options.
    pub fn start(vdevs: &[String], opts: &[&str]) -> Testpmd {
        Testpmd::start_as(None, vdevs, opts)
    }

    /// As [`Testpmd::start`], as user and group `ids` (a non-root pod)
    /// when given: its runtime directory is then a temporary one it owns.
    pub fn start_as(ids: Option<(u32, u32)>, vdevs: &[String], opts: &[&str]) -> Testpmd {
        Testpmd::spawn(ids, &[], vdevs, opts)
    }

    /// As [`Testpmd::start`], with more EAL options.
    pub fn start_with_eal(eal: &[&str], vdevs: &[String], opts: &[&str]) -> Testpmd {
        Testpmd::spawn(None, eal, vdevs, opts)
    }

    fn spawn(ids: Option<(u32, u32)>, eal: &[&str], vdevs: &[String], opts: &[&str]) -> Testpmd {
        let prefix = format!(
            "sytest-{}-{}",
            std::process::id(),
            PREFIX.fetch_add(1, Ordering::Relaxed)
        );
        let mut cmd = match ids {
            None => Command::new("stdbuf"),
            Some((uid, gid)) => {
                let run = std::path::PathBuf::from(format!("/tmp/{prefix}"));
                std::fs::create_dir_all(&run).unwrap();
                nix::unistd::chown(
                    &run,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
                .unwrap();
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--clear-groups", "stdbuf"])
                    .env("XDG_RUNTIME_DIR", &run);
                c
            }
        };
        cmd.args(["-oL", "-eL", testpmd_bin()]).args([
            "--no-huge",
            "-m",
            "256",
            "--no-pci",
            "--file-prefix",
            &prefix,
            "--lcores",
            "0@0,1@1",
            "--log-level",
            "pmd.net.memif:info",
        ]);
        cmd.args(eal);
        for v in vdevs {
            cmd.arg(format!("--vdev={v}"));
        }
        cmd.args(["--", "-i", "--total-num-mbufs=8192"]).args(opts);
        Testpmd::run(cmd, prefix, true)
    }

    /// Runs testpmd as `cmd` gives it (a command line of the README's, in
    /// a namespace of the test's): it must be interactive (`-i`). Its
    /// runtime files are wherever `cmd` puts them, left alone.
    pub fn from_command(cmd: Command) -> Testpmd {
        let what = format!("{:?}", cmd.get_args().last().unwrap_or_default());
        Testpmd::run(cmd, what, false)
    }

    /// Starts `cmd` (testpmd, interactive), waits for its prompt and has
    /// it start forwarding; `prefix` names it (and, if `own_files`, its
    /// runtime directories, removed when it is dropped).
    fn run(mut cmd: Command, prefix: String, own_files: bool) -> Testpmd {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start testpmd");
        let out = Arc::new(Mutex::new(String::new()));
        // stdout alone too: stderr chunks (EAL and PMD logs) can land in the
        // middle of the prompt in the merged text.
        let stdout_only = Arc::new(Mutex::new(String::new()));
        for (stream, own) in [
            (
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                Some(stdout_only.clone()),
            ),
            (Box::new(child.stderr.take().unwrap()), None),
        ] {
            let out = out.clone();
            std::thread::spawn(move || {
                // Raw chunks, not lines: the "testpmd> " prompt has no newline.
                let mut stream = stream;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]);
                    out.lock().unwrap().push_str(&text);
                    if let Some(o) = &own {
                        o.lock().unwrap().push_str(&text);
                    }
                }
            });
        }
        let stdin = child.stdin.take().unwrap();
        let t = Testpmd {
            child,
            stdin,
            out,
            prefix,
            own_files,
            killed: false,
        };
        let mut t = t;
        let end = Instant::now() + Duration::from_secs(30);
        while !stdout_only.lock().unwrap().contains("testpmd> ") {
            if Instant::now() > end {
                panic!("testpmd printed no prompt in 30 s:\n{}", t.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Forward from the start: testpmd only polls its rx queues while started.
        t.cmd("start");
        t.wait_output(Duration::from_secs(10), "forwarding packets");
        t
    }

    pub fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until the output contains `needle` (after byte `from`).
    pub fn wait_output_from(&self, from: usize, limit: Duration, needle: &str) -> String {
        let end = Instant::now() + limit;
        loop {
            let o = self.output();
            if let Some(s) = o.get(from..).filter(|s| s.contains(needle)) {
                return s.to_string();
            }
            if Instant::now() > end {
                panic!("timed out after {limit:?} waiting for testpmd to print {needle:?}; it printed:\n{o}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn wait_output(&self, limit: Duration, needle: &str) -> String {
        self.wait_output_from(0, limit, needle)
    }

    /// Sends one command line.
    pub fn cmd(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a command line; false if testpmd is gone.
    pub fn try_cmd(&mut self, line: &str) -> bool {
        writeln!(self.stdin, "{line}").is_ok() && self.stdin.flush().is_ok()
    }

    /// Counters of `port` from "show port stats": (RX, TX) packets and bytes.
    pub fn counters(&mut self, port: u16) -> ((u64, u64), (u64, u64)) {
        let from = self.output().len();
        self.cmd(&format!("show port stats {port}"));
        let o = self.wait_output_from(from, Duration::from_secs(10), "Tx-pps");
        let num = |key: &str| number_after(&o, key);
        (
            (num("RX-packets:"), num("TX-packets:")),
            (num("RX-bytes:"), num("TX-bytes:")),
        )
    }

    /// One of `port`'s extended statistics ("show port xstats"), such as
    /// `rx_q1_packets`.
    pub fn xstat(&mut self, port: u16, name: &str) -> u64 {
        let from = self.output().len();
        self.cmd(&format!("show port xstats {port}"));
        let key = format!("{name}:");
        let o = self.wait_output_from(from, Duration::from_secs(10), &key);
        number_after(&o, &key)
    }

    /// RX and TX packet counters of `port`.
    pub fn port_stats(&mut self, port: u16) -> (u64, u64) {
        self.counters(port).0
    }

    /// RX and TX bytes of `port`.
    pub fn port_bytes(&mut self, port: u16) -> (u64, u64) {
        self.counters(port).1
    }

    /// Waits until `port`'s RX counter reaches `n`; returns its value once
    /// it stops moving (so extra frames would be seen too).
    pub fn wait_rx(&mut self, port: u16, n: u64) -> u64 {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            let (rx, _) = self.port_stats(port);
            if rx >= n {
                // Then until it stops: a frame too many would show.
                return settled("testpmd's receive counter", || self.port_stats(port).0);
            }
            if Instant::now() > end {
                panic!("port {port} received {rx} of {n} frames\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `bursts` bursts of 32 frames from every port ("start tx_first"),
    /// then keeps forwarding in the configured mode.
    pub fn send_bursts(&mut self, bursts: u32) {
        self.pause();
        let from = self.output().len();
        self.cmd(&format!("start tx_first {bursts}"));
        self.wait_output_from(from, Duration::from_secs(10), "forwarding packets");
    }

    /// Stops forwarding ("stop") and waits until the forwarding lcores have
    /// left their loop: no lcore polls the ports until [`Testpmd::resume`].
    ///
    /// DPDK's memif driver (22.11 and main alike) unmaps a connection's
    /// regions in its interrupt thread when the peer goes away, while a
    /// forwarding lcore may be between its `ETH_MEMIF_FLAG_CONNECTED` test
    /// and its reads of those regions (`memif_disconnect` in
    /// `drivers/net/memif/memif_socket.c`, `eth_memif_rx` and `eth_memif_tx`
    /// in `rte_eth_memif.c`): testpmd then dies with SIGSEGV.
    /// `scripts/dpdk-memif-unmap-race.sh` reproduces it with two testpmds and
    /// no switch. A test that takes the switch away from a DPDK pod pauses
    /// the pod first, as that race needs a polling lcore.
    pub fn pause(&mut self) {
        let from = self.output().len();
        self.cmd("stop");
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let o = self.output();
            let said = o.get(from..).unwrap_or_default();
            if said.contains("Done.") || said.contains("Packet forwarding not started") {
                return;
            }
            if Instant::now() > end {
                panic!("testpmd did not stop forwarding in 10 s:\n{o}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Forwards again after [`Testpmd::pause`].
    pub fn resume(&mut self) {
        let from = self.output().len();
        self.cmd("start");
        self.wait_output_from(from, Duration::from_secs(10), "forwarding packets");
    }

    /// SIGKILLs testpmd (a crashing peer).
    pub fn kill9(mut self) {
        self.killed = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Panics, with testpmd's output, if it has exited (a crashed peer).
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().ok().flatten() {
            panic!(
                "testpmd {} died during the test: {status}\n{}",
                self.prefix,
                self.output()
            );
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Testpmd {
    /// Quits testpmd. A testpmd that exited before it was told to (a
    /// crashed peer) fails the test, with its output.
    fn drop(&mut self) {
        let status = self.child.try_wait().ok().flatten();
        let crashed = status.is_some() && !self.killed;
        if std::thread::panicking() || crashed {
            eprintln!(
                "---- testpmd {} (exit: {status:?}) ----\n{}",
                self.prefix,
                self.output()
            );
        }
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        terminate(&mut self.child, Duration::from_secs(5));
        if self.own_files {
            let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.prefix));
            let _ = std::fs::remove_dir_all(format!("/tmp/{}", self.prefix));
        }
        if crashed && !std::thread::panicking() {
            panic!("testpmd {} died during the test: {status:?}", self.prefix);
        }
    }
}

/// The number printed right after the first `key` in testpmd's output `o`.
fn number_after(o: &str, key: &str) -> u64 {
    let at = o.find(key).unwrap_or_else(|| panic!("{key} in {o}")) + key.len();
    o[at..].split_whitespace().next().unwrap().parse().unwrap()
}

/// A testpmd pod with MAC `mac` on the memif socket `sock` (testpmd the
/// slave), counting what it receives and sending to `peer` when told to
/// (`send_bursts`).
pub fn rxonly_pod(sock: &str, mac: &str, peer: &str) -> Testpmd {
    Testpmd::start(
        &[memif_vdev(0, "client", sock, &format!("mac={mac}"))],
        &["--forward-mode=rxonly", &format!("--eth-peer=0,{peer}")],
    )
}

/// A memif vdev argument string.
pub fn memif_vdev(index: u32, role: &str, socket: &str, extra: &str) -> String {
    let mut s = format!("net_memif{index},role={role},socket={socket},socket-abstract=no");
    if !extra.is_empty() {
        s.push(',');
        s.push_str(extra);
    }
    s
}

/// A `virtio_user` vdev argument string; `server`: testpmd owns the socket
/// (`server=1`, the switch connects as vhost-user client).
pub fn virtio_vdev(index: u32, socket: &str, server: bool, extra: &str) -> String {
    let mut s = format!("net_virtio_user{index},path={socket}");
    if server {
        s.push_str(",server=1");
    }
    if !extra.is_empty() {
        s.push(',');
        s.push_str(extra);
    }
    s
}
