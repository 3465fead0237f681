//! Test harness: the real `switchyard` binary and real `dpdk-testpmd`
//! processes, each killed by PID and cleaned up on drop.
#![allow(dead_code)]

pub mod churn;
pub mod memif_peer;
pub mod tcp;
mod testpmd;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use switchyard_api::{Client, Request};
use switchyard_api::{MacInfo, PortInfo, PortStats};

pub use testpmd::*;

/// The daemon binary (this file is also included by other crates' tests).
pub fn switchyard_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_switchyard") {
        Some(p) => PathBuf::from(p),
        None => workspace_bin("switchyard", "switchyard"),
    }
}

/// Runs `cmd` (stdin empty), panicking with its output unless it succeeds;
/// returns its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `frames` frames of `bytes` bytes in all are on average larger
/// than a 1500-byte MTU's frame (1514 bytes with its Ethernet header): TCP
/// super-frames crossed whole.
pub fn super_frames(bytes: u64, frames: u64) -> bool {
    bytes / frames.max(1) > 1514
}

/// A network namespace made for one test, deleted (with every interface in
/// it) when dropped.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A new namespace named after `what` and this process.
    pub fn new(what: &str) -> Netns {
        let name = format!("sy-{what}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip netns add");
        assert!(ok.success(), "ip netns add {name}");
        Netns { name }
    }

    /// Runs `cmd` (a shell command line) in the namespace.
    pub fn sh(&self, cmd: &str) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, "sh", "-c", cmd])
            .output()
            .expect("ip netns exec")
    }

    /// As [`Netns::sh`], panicking unless it succeeds; returns stdout.
    pub fn sh_ok(&self, cmd: &str) -> String {
        run_ok(Command::new("ip").args(["netns", "exec", &self.name, "sh", "-c", cmd]))
    }

    /// A counter of interface `ifname` in the namespace
    /// (`/sys/class/net/<ifname>/statistics/<name>`).
    pub fn if_counter(&self, ifname: &str, name: &str) -> u64 {
        let out = self.sh_ok(&format!("cat /sys/class/net/{ifname}/statistics/{name}"));
        out.trim().parse().expect("a counter")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A process a test started, killed when dropped: a failed test leaves
/// no stopped or lingering switch behind.
pub struct Reap(pub Child);

impl Reap {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Reap {
    /// Kills it. One that had exited by itself with an error (rather than
    /// been killed by the test) fails the test.
    fn drop(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let early = self.0.try_wait().ok().flatten();
        let pid = self.0.id();
        self.kill();
        if let Some(status) = early.filter(|s| s.signal() != Some(9)) {
            let what = format!("process {pid}, started by the test,");
            check_ending(&what, Ending::Early(status), "", &[]);
        }
    }
}

/// `busybox ping`'s summary, "N packets transmitted, M packets received":
/// (N, M).
pub fn ping_summary(out: &str) -> Option<(u32, u32)> {
    let line = out.lines().find(|l| l.contains("packets transmitted"))?;
    let mut n = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().ok());
    Some((n.next()??, n.next()??))
}

/// A veth pair, `a` in namespace `na` and `b` in `nb`, both up.
pub fn veth(na: &Netns, a: &str, nb: &Netns, b: &str) {
    let ok = Command::new("ip")
        .args([
            "link", "add", a, "netns", &na.name, "type", "veth", "peer", "name", b,
        ])
        .args(["netns", &nb.name])
        .status()
        .unwrap();
    assert!(ok.success(), "ip link add {a} type veth");
    na.sh_ok(&format!("ip link set {a} up"));
    nb.sh_ok(&format!("ip link set {b} up"));
}

/// A routed underlay (the VXLAN tests): a router namespace and `n` VTEP
/// namespaces behind it, VTEP `i` at 10.81.`i`.2 on a subnet of its own
/// (the router is .1 on each).
pub struct Underlay {
    /// The router's namespace.
    pub router: Netns,
    /// The VTEPs' namespaces, VTEP 1 first.
    pub vteps: Vec<Netns>,
}

impl Underlay {
    /// The router and `n` VTEPs.
    pub fn new(n: usize) -> Underlay {
        let router = Netns::new("vxr");
        router.sh_ok("sysctl -q -w net.ipv4.ip_forward=1 && ip link set lo up");
        let vteps = (1..=n)
            .map(|i| {
                let ns = Netns::new(&format!("vx{i}"));
                veth(&router, &format!("r{i}"), &ns, "ul");
                router.sh_ok(&format!("ip addr add 10.81.{i}.1/24 dev r{i}"));
                ns.sh_ok(&format!(
                    "ip link set lo up && ip addr add 10.81.{i}.2/24 dev ul && ip route add default via 10.81.{i}.1"
                ));
                ns
            })
            .collect();
        Underlay { router, vteps }
    }

    /// VTEP `i`'s address (from 1).
    pub fn ip(i: usize) -> String {
        format!("10.81.{i}.2")
    }
}

/// The VTEPs of the switch on `control`, as (overlay, remote address).
pub fn vteps(control: &std::path::Path) -> Vec<(String, String)> {
    Client::connect(control)
        .unwrap()
        .ask(&Request::vtep_list())
        .unwrap()
        .into_iter()
        .map(|v| (v.overlay, v.remote.to_string()))
        .collect()
}

/// A running switch daemon with its own temp dir, control socket and state.
pub struct Switch {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub config: PathBuf,
    log: PathBuf,
    /// The network namespace the daemon runs in (`ip netns exec`).
    netns: Option<String>,
    /// A command the daemon runs under (e.g. `setpriv` dropping a
    /// capability).
    wrapper: Vec<String>,
    /// Environment variables the daemon runs with.
    env: Vec<(String, String)>,
    /// Parts of the `ERROR` lines the test causes on purpose: any other
    /// `ERROR` line, or a panic, in the log fails the test when the switch
    /// is dropped (see [`Switch::expect_error`]).
    expected_errors: Vec<String>,
    /// The control socket as this process reaches it, when the config is
    /// not the test's own ([`Switch::start_configured`]).
    control_at: Option<PathBuf>,
}

impl Switch {
    /// Starts the daemon with `extra` TOML appended to a base config.
    pub fn start(extra: &str) -> Switch {
        Switch::start_in(None, extra)
    }

    /// Starts the daemon in network namespace `netns` (made with
    /// [`Netns`]), so the interfaces it makes or uses are that namespace's.
    pub fn start_in(netns: Option<&str>, extra: &str) -> Switch {
        Switch::start_wrapped(netns, &[], extra)
    }

    /// As [`Switch::start_in`], with the daemon run under `wrapper`.
    pub fn start_wrapped(netns: Option<&str>, wrapper: &[&str], extra: &str) -> Switch {
        Switch::start_with(netns, wrapper, &[], extra)
    }

    /// As [`Switch::start_wrapped`], with `env` in the daemon's
    /// environment.
    pub fn start_with(
        netns: Option<&str>,
        wrapper: &[&str],
        env: &[(&str, &str)],
        extra: &str,
    ) -> Switch {
        let dir = tempfile::Builder::new()
            .prefix("sy-test")
            .tempdir()
            .unwrap();
        let config = dir.path().join("switchyard.toml");
        let text = format!(
            "control_socket = \"{}\"\nstate_dir = \"{}\"\nsocket_dir = \"{}\"\n{}\n",
            dir.path().join("control.sock").display(),
            dir.path().join("state").display(),
            // Tests keep sockets in their own temp dirs (the device plugin
            // and CNI tests' too): all of them lie in the temp root.
            std::env::temp_dir().display(),
            extra
        );
        std::fs::write(&config, text).unwrap();
        let mut s = Switch {
            log: dir.path().join("switchyard.log"),
            dir,
            child: None,
            config,
            netns: netns.map(str::to_string),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            expected_errors: Vec::new(),
            control_at: None,
        };
        s.spawn();
        s
    }

    /// Starts the daemon on `config` as it is (a shipped file's: its own
    /// control socket, state and socket directories), in `netns`, under
    /// `wrapper` (a command that enters the root those paths are of);
    /// `control` is its control socket as this process reaches it.
    pub fn start_configured(
        netns: Option<&str>,
        wrapper: &[String],
        config: &str,
        control: PathBuf,
    ) -> Switch {
        let dir = tempfile::Builder::new()
            .prefix("sy-test")
            .tempdir()
            .unwrap();
        let path = dir.path().join("switchyard.toml");
        std::fs::write(&path, config).unwrap();
        let mut s = Switch {
            log: dir.path().join("switchyard.log"),
            dir,
            child: None,
            config: path,
            netns: netns.map(str::to_string),
            wrapper: wrapper.to_vec(),
            env: Vec::new(),
            expected_errors: Vec::new(),
            control_at: Some(control),
        };
        s.spawn();
        s
    }

    /// (Re)starts the daemon process on the same config and state.
    pub fn spawn(&mut self) {
        let child = self.command(&[], &[]).spawn().expect("start switchyard");
        self.child = Some(child);
        self.wait_answering();
    }

    /// Waits until a switch answers on the control socket.
    pub fn wait_answering(&self) {
        wait_for(Duration::from_secs(10), "the control socket", || {
            self.client_opt()
                .and_then(|mut c| c.call(&Request::Ping).ok())
        });
    }

    /// The daemon's command line (`run --config` and `args`), logging to
    /// the test's log, with `env` set.
    pub fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // `ip netns exec` and the wrapper exec the daemon: the child's PID
        // is its own.
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip", "netns", "exec", ns].map(Into::into));
        }
        argv.extend(self.wrapper.iter().map(Into::into));
        argv.push(switchyard_bin().into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .args(["run", "--config"])
            .arg(&self.config)
            .args(args)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        cmd
    }

    /// Replaces the daemon with a new process that takes over its ports
    /// (`run --takeover`): waits until the old one has exited, with status
    /// 0, and the new one answers. Returns how long the old one took to
    /// hand over and exit.
    pub fn takeover(&mut self) -> Duration {
        let t = std::time::Instant::now();
        let mut old = Reap(self.replace(&[]));
        let status = wait_for(Duration::from_secs(30), "the old switch to exit", || {
            old.0.try_wait().unwrap()
        });
        let took = t.elapsed();
        assert!(
            status.success(),
            "the old switch exited with {status}:\n{}",
            self.log()
        );
        self.assert_alive();
        took
    }

    /// Starts a new process taking over (`run --takeover` and `args`) in
    /// the running one's place; returns the old process.
    pub fn replace(&mut self, args: &[&str]) -> Child {
        self.replace_with(args, &[])
    }

    /// [`Switch::replace`], with `envs` set for the new process.
    pub fn replace_with(&mut self, args: &[&str], envs: &[(&str, &str)]) -> Child {
        let new = self
            .command(&[&["--takeover"], args].concat(), envs)
            .spawn()
            .expect("start switchyard --takeover");
        self.child.replace(new).expect("a running switch")
    }

    /// Says that the test makes the switch log an `ERROR` line (or a
    /// panic) containing `part`: such lines do not fail it.
    pub fn expect_error(&mut self, part: &str) {
        self.expected_errors.push(part.to_string());
    }

    /// Stops the daemon with SIGTERM and checks how it ended (see
    /// [`check_ending`]): a switch that exited by itself with an error,
    /// did not stop in time, exited non-zero, or logged a panic or an
    /// unexpected `ERROR` line fails the test, with its log's last lines.
    pub fn stop(&mut self) {
        let ending = self
            .child
            .take()
            .map(|mut c| terminate(&mut c, Duration::from_secs(10)))
            // Killed on purpose (kill9), or ended as the test checked:
            // what its log says still counts.
            .unwrap_or(Ending::Stopped(std::process::ExitStatus::default()));
        check_ending("the switch", ending, &self.log(), &self.expected_errors);
    }

    /// Kills the daemon with SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn control(&self) -> PathBuf {
        self.control_at
            .clone()
            .unwrap_or_else(|| self.dir.path().join("control.sock"))
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    fn client_opt(&self) -> Option<Client> {
        Client::connect(&self.control()).ok()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.control()).expect("connect to control socket")
    }

    /// Runs the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(switchyard_bin())
            .args(args)
            .env("SWITCHYARD_CONTROL", self.control())
            .output()
            .unwrap()
    }

    /// `switchyard port add ARGS --bridge default`, which must succeed.
    pub fn add_port(&self, args: &[&str]) {
        let mut all = vec!["port", "add"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--bridge", "default"]);
        self.cli_ok(&all);
    }

    /// Adds af-packet port `iface` on the interface of that name, in
    /// `bridge`, with `extra` arguments.
    pub fn add_af_packet(&self, iface: &str, bridge: &str, extra: &[&str]) {
        let mut args = vec![
            "port",
            "add",
            iface,
            "--kind",
            "af-packet",
            "--interface",
            iface,
            "--bridge",
            bridge,
        ];
        args.extend_from_slice(extra);
        self.cli_ok(&args);
    }

    /// Adds memif port `name` in bridge `default`, the switch as master on
    /// socket `name.sock` in the test's directory, with `extra` arguments;
    /// returns the socket's path.
    pub fn add_memif(&self, name: &str, extra: &[&str]) -> String {
        let sock = self.path(&format!("{name}.sock"));
        let mut args = vec![
            "port", "add", name, "--kind", "memif", "--role", "master", "--socket", &sock,
            "--bridge", "default",
        ];
        args.extend_from_slice(extra);
        self.cli_ok(&args);
        sock
    }

    /// Runs the CLI and asserts success; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            o.status.success(),
            "switchyard {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn stats(&self, port: &str) -> PortStats {
        let v: Vec<PortStats> = self
            .client()
            .call_as(&Request::Stats {
                name: Some(port.to_string()),
            })
            .unwrap();
        v.into_iter().next().unwrap()
    }

    /// The frames port `port` dropped for `reason`, every worker's.
    pub fn drops(&self, port: &str, reason: switchyard_api::DropReason) -> u64 {
        self.stats(port)
            .totals
            .drops
            .get(&reason)
            .copied()
            .unwrap_or(0)
    }

    pub fn macs(&self, bridge: &str) -> Vec<MacInfo> {
        self.client()
            .call_as(&Request::MacList {
                bridge: bridge.into(),
            })
            .unwrap()
    }

    pub fn port(&self, name: &str) -> PortInfo {
        let v: Vec<PortInfo> = self.client().call_as(&Request::PortList).unwrap();
        v.into_iter()
            .find(|p| p.spec.name == name)
            .expect("port listed")
    }

    pub fn wait_link(&self, port: &str, up: bool) {
        wait_for(
            Duration::from_secs(15),
            &format!("link of {port} {}", if up { "up" } else { "down" }),
            || (self.stats(port).link_up == up).then_some(()),
        );
    }

    /// What `switchyard worker list --json` says of each receive queue:
    /// (port, queue) -> (the worker polling it, the frames it received).
    /// A queue polled by two workers fails the test.
    pub fn queue_load(&self) -> std::collections::BTreeMap<(String, usize), (usize, u64)> {
        let workers: Vec<switchyard_api::WorkerInfo> =
            serde_json::from_str(&self.cli_ok(&["worker", "list", "--json"])).unwrap();
        let mut m = std::collections::BTreeMap::new();
        for w in &workers {
            for q in &w.queues {
                let was = m.insert((q.port.clone(), q.queue), (w.id, q.frames));
                assert!(
                    was.is_none(),
                    "{}/{} polled twice: {workers:?}",
                    q.port,
                    q.queue
                );
            }
        }
        m
    }

    /// Asserts the daemon process is still running and answers its API.
    pub fn assert_alive(&mut self) {
        let child = self.child.as_mut().expect("daemon started");
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "the switch exited:\n{}",
            self.log()
        );
        self.client().call(&Request::Ping).expect("ping");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("---- switchyard log ----\n{}", self.log());
        }
    }
}

/// `tcpdump` on the underlay interface of namespace `ns`, writing the
/// VXLAN datagrams to `file` once it says it listens; stopped (and
/// checked) by [`underlay_frames`].
pub fn underlay_capture(ns: &Netns, file: &str) -> Reap {
    let mut c = Reap(
        std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, "tcpdump", "-i", "ul", "-nn"])
            // Each datagram written as it comes: none is left in the
            // kernel's ring (a block waits up to a second) when it stops.
            .args(["--immediate-mode", "-U"])
            .args(["-w", file, "udp port 4789"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tcpdump (Debian: tcpdump)"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = c.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(line.contains("listening on ul"), "tcpdump: {line}");
    c
}

/// What capture `c` caught, decoded (`tcpdump -r`: VXLAN and the frame
/// inside), one line per datagram.
pub fn underlay_frames(mut c: Reap, file: &str) -> Vec<String> {
    let ending = terminate(&mut c.0, Duration::from_secs(5));
    assert!(
        matches!(ending, Ending::Stopped(_)),
        "tcpdump ended as {ending:?}"
    );
    let out = Command::new("tcpdump")
        .args(["-r", file, "-nn"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The ARP requests and neighbour solicitations among decoded underlay
/// datagrams ([`underlay_frames`]).
pub fn neighbour_requests(frames: &[String]) -> Vec<&String> {
    frames
        .iter()
        .filter(|l| l.contains("ARP, Request") || l.contains("neighbor solicitation"))
        .collect()
}
