//! Runs `switchyard-cni` as a container runtime does: CNI_* environment
//! (and nothing else), the netconf on stdin, the result on stdout.
//! (The device plugin tests include this file with `#[path]`.)

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs one CNI command: (exit success, stdout JSON or null).
pub fn exec_cni(
    bin: &Path,
    command: &str,
    container: &str,
    ifname: &str,
    args: &str,
    cni_path: &str,
    conf: &Value,
) -> (bool, Value) {
    let mut child = Command::new(bin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", format!("/var/run/netns/{container}"))
        .env("CNI_IFNAME", ifname)
        .env("CNI_ARGS", args)
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(conf).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    (out.status.success(), v)
}
