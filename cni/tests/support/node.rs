//! A node for the CNI end-to-end tests: a real `switchyard` daemon with
//! its own directories, and the real `switchyard-cni` binary run as a
//! runtime runs it. (Included with `#[path]` by the CNI test files.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{json, Value};
use switchyard_api::PortInfo;
use switchyard_api::{Client, Request};

use super::exec;
use super::testpmd::{self, terminate, wait_for};

pub const HOST_LOCAL_DIR: &str = "/usr/lib/cni";

pub fn cni_bin() -> &'static str {
    env!("CARGO_BIN_EXE_switchyard-cni")
}

/// The daemon binary, built next to the plugin.
pub fn switchyard_bin() -> PathBuf {
    testpmd::workspace_bin("switchyard", "switchyard")
}

/// A node: a switch daemon plus the directories a runtime would use.
pub struct Node {
    pub dir: tempfile::TempDir,
    daemon: Option<Child>,
}

impl Node {
    pub fn start() -> Node {
        Node::start_with("")
    }

    /// A node whose daemon config has `extra` TOML appended.
    pub fn start_with(extra: &str) -> Node {
        let dir = tempfile::Builder::new().prefix("sy-cni").tempdir().unwrap();
        let cfg = dir.path().join("switchyard.toml");
        std::fs::write(
            &cfg,
            format!(
                "control_socket = \"{}\"\nstate_dir = \"{}\"\nsocket_dir = \"{}\"\n{extra}\n",
                dir.path().join("control.sock").display(),
                dir.path().join("state").display(),
                dir.path().display()
            ),
        )
        .unwrap();
        let mut n = Node { dir, daemon: None };
        n.spawn();
        n
    }

    /// (Re)starts the daemon on the node's config and state.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("switchyard.log"))
            .unwrap();
        let daemon = Command::new(switchyard_bin())
            .args(["run", "--config"])
            .arg(self.dir.path().join("switchyard.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(daemon);
        wait_for(Duration::from_secs(10), "the daemon", || {
            Client::connect(&self.control())
                .ok()
                .and_then(|mut c| c.call(&Request::Ping).ok())
        });
    }

    /// Takes the daemon over with a new one (`run --takeover`, as the
    /// DaemonSet's rollout starts it) and checks that the old one exited
    /// cleanly.
    pub fn takeover(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("switchyard.log"))
            .unwrap();
        let new = Command::new(switchyard_bin())
            .args(["run", "--takeover", "--config"])
            .arg(self.dir.path().join("switchyard.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut old = self.daemon.replace(new).expect("a running daemon");
        let status = wait_for(Duration::from_secs(30), "the old switch to exit", || {
            old.try_wait().unwrap()
        });
        assert!(status.success(), "the old switch: {status}\n{}", self.log());
    }

    /// Kills the daemon with SIGKILL (a crash).
    pub fn kill9(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    pub fn control(&self) -> PathBuf {
        self.dir.path().join("control.sock")
    }
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("pods")
    }
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam")
    }
    pub fn devinfo(&self, name: &str) -> PathBuf {
        self.dir.path().join("devinfo").join(name)
    }

    pub fn ports(&self) -> Vec<PortInfo> {
        let mut c = Client::connect(&self.control()).unwrap();
        serde_json::from_value(c.call(&Request::PortList).unwrap()).unwrap()
    }

    /// A netconf for network `name`.
    pub fn netconf(&self, name: &str, extra: Value) -> Value {
        let mut v = json!({
            "cniVersion": "1.1.0",
            "name": name,
            "type": "switchyard",
            "socketDir": self.socket_dir(),
            "controlSocket": self.control(),
            "capabilities": {"CNIDeviceInfoFile": true, "mac": true},
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    pub fn ipam(&self, subnet: &str) -> Value {
        json!({"type": "host-local", "subnet": subnet, "dataDir": self.ipam_dir()})
    }

    /// Stops the daemon; one that ended badly (see
    /// [`testpmd::check_ending`]) fails the test.
    pub fn stop(&mut self) {
        let ending = self
            .daemon
            .take()
            .map(|mut d| terminate(&mut d, Duration::from_secs(10)));
        let log = self.log();
        // Killed on purpose (kill9): what its log says still counts.
        let ending = ending.unwrap_or(testpmd::Ending::Stopped(Default::default()));
        testpmd::check_ending("the switch", ending, &log, &[]);
    }

    /// The daemon's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("switchyard.log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the plugin: (exit success, stdout JSON).
pub fn cni(
    command: &str,
    container: &str,
    ifname: &str,
    args: &str,
    conf: &Value,
) -> (bool, Value) {
    exec::exec_cni(
        Path::new(cni_bin()),
        command,
        container,
        ifname,
        args,
        &format!("/nonexistent:{HOST_LOCAL_DIR}"),
        conf,
    )
}

pub fn ok(command: &str, container: &str, ifname: &str, args: &str, conf: &Value) -> Value {
    let (good, v) = cni(command, container, ifname, args, conf);
    assert!(good, "{command} {container} {ifname} failed: {v}");
    v
}

pub fn with_devinfo(conf: &Value, file: &Path) -> Value {
    let mut c = conf.clone();
    c["runtimeConfig"] = json!({"CNIDeviceInfoFile": file});
    c
}

pub fn pod_args(uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={uid};K8S_POD_UID={uid}")
}

/// Files left under the socket dir, ignoring the plugin's own bookkeeping
/// directory (which must be empty of records).
pub fn leftovers(node: &Node) -> Vec<String> {
    let mut out = Vec::new();
    for e in walk(&node.socket_dir()) {
        let s = e.display().to_string();
        if s.ends_with(".switchyard-cni/lock")
            || s.ends_with(".switchyard-cni")
            || s.ends_with(".switchyard-cni/owed")
        {
            continue;
        }
        out.push(s);
    }
    out
}

pub fn walk(p: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            v.push(e.path());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                v.extend(walk(&e.path()));
            }
        }
    }
    v
}

/// Addresses host-local still holds for `network`.
pub fn reserved_ips(node: &Node, network: &str) -> Vec<String> {
    std::fs::read_dir(node.ipam_dir().join(network))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains('.') || n.contains(':'))
                .filter(|n| !n.starts_with("last_reserved_ip"))
                .collect()
        })
        .unwrap_or_default()
}
