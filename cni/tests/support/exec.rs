//! Runs `switchyard-cni` as a container runtime does: CNI_* environment
//! (and nothing else), the netconf on stdin, the result on stdout.
//! (The device plugin tests include this file with `#[path]`.)
#![allow(dead_code)]

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
    let netns = format!("/var/run/netns/{container}");
    run_plugin(
        bin,
        &[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", ifname),
            ("CNI_ARGS", args),
            ("CNI_PATH", cni_path),
        ],
        conf,
    )
}

/// Runs a plugin with exactly the environment `env` and `conf` on stdin:
/// (exit success, stdout JSON or null).
pub fn run_plugin(bin: &Path, env: &[(&str, &str)], conf: &Value) -> (bool, Value) {
    run_plugin_in(&[], bin, env, conf)
}

/// [`run_plugin`] with the command prefix `enter` (e.g. `nsenter -t PID -m
/// --`, to run it in a node's root).
pub fn run_plugin_in(
    enter: &[String],
    bin: &Path,
    env: &[(&str, &str)],
    conf: &Value,
) -> (bool, Value) {
    let out = plugin_output(enter, bin, env, conf);
    let v = if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    (out.status.success(), v)
}

/// Runs a plugin under `enter` with exactly the environment `env` and
/// `conf` on stdin, as libcni's `RawExec` does: its exit status, stdout and
/// stderr, kept apart.
pub fn plugin_output(
    enter: &[String],
    bin: &Path,
    env: &[(&str, &str)],
    conf: &Value,
) -> std::process::Output {
    let mut cmd = match enter.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = cmd
        .env_clear()
        .envs(env.iter().copied())
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
    child.wait_with_output().unwrap()
}
