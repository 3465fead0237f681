//! IPAM delegation: run the plugin named by `ipam.type` from `CNI_PATH`
//! with the same environment and the network configuration on stdin.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{io, CniError, IPAM_FAILURE};

/// The CNI version to speak to the IPAM plugin: ours, capped at 1.0.0
/// (common IPAM plugins, e.g. Debian 12's host-local, stop there; the IPAM
/// part of a result is the same in 1.0.0 and 1.1.0).
fn delegate_version(v: &str) -> &str {
    if v == "1.1.0" {
        "1.0.0"
    } else {
        v
    }
}

/// Finds `plugin` in the `:`-separated `cni_path`.
pub fn find(plugin: &str, cni_path: &str) -> Result<PathBuf, CniError> {
    cni_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                IPAM_FAILURE,
                format!("ipam.type: plugin {plugin:?} not found in CNI_PATH {cni_path:?}"),
            )
        })
}

/// Runs plugin `bin` for `command` with `stdin`, the environment `env` and
/// `CNI_PATH`; returns its output, whatever its exit status.
fn run(
    bin: &Path,
    command: &str,
    env: &[(&str, String)],
    cni_path: &str,
    stdin: &[u8],
) -> Result<std::process::Output, CniError> {
    let mut child = Command::new(bin)
        .env("CNI_COMMAND", command)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io(bin.display(), e))?;
    if let Some(mut i) = child.stdin.take() {
        // A plugin may exit without reading stdin (every Go plugin does for
        // VERSION, and for errors found in the environment): its output
        // still counts, as with libcni (Go's os/exec ignores EPIPE there).
        match i.write_all(stdin) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(io(bin.display(), e));
            }
            _ => {}
        }
    }
    child.wait_with_output().map_err(|e| io(bin.display(), e))
}

/// Whether the IPAM plugin of `netconf` speaks CNI 1.1.0 (and so has
/// STATUS and GC), by its answer to VERSION.
pub fn speaks_1_1(netconf: &serde_json::Value, cni_path: &str) -> Result<bool, CniError> {
    let plugin = netconf["ipam"]["type"].as_str().unwrap_or_default();
    let bin = find(plugin, cni_path)?;
    let out = run(&bin, "VERSION", &[], cni_path, br#"{"cniVersion":"1.1.0"}"#)?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    Ok(v["supportedVersions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == "1.1.0")))
}

/// Runs the IPAM plugin for `command` (ADD, DEL, CHECK, STATUS, GC).
/// Returns the result for ADD, as the plugin printed it.
pub fn exec(
    command: &str,
    netconf: &serde_json::Value,
    env: &[(&str, String)],
    cni_path: &str,
) -> Result<Option<serde_json::Value>, CniError> {
    let plugin = netconf["ipam"]["type"].as_str().unwrap_or_default();
    let bin = find(plugin, cni_path)?;
    let mut conf = netconf.clone();
    // STATUS and GC exist from 1.1.0 on: only sent to plugins that speak it.
    if !matches!(command, "STATUS" | "GC") {
        let version = delegate_version(conf["cniVersion"].as_str().unwrap_or("1.0.0")).to_string();
        conf["cniVersion"] = version.into();
    }
    // Our own fields mean nothing to the IPAM plugin; `prevResult` is kept
    // for CHECK as the spec asks.
    let out = run(
        &bin,
        command,
        env,
        cni_path,
        &serde_json::to_vec(&conf).unwrap_or_default(),
    )?;
    if !out.status.success() {
        // Pass the delegate's CNI error through when it printed one.
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let code = v["code"].as_u64().map(|c| c as u32).unwrap_or(IPAM_FAILURE);
        let msg = v["msg"].as_str().map(str::to_string).unwrap_or_else(|| {
            format!(
                "{plugin} {command} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        });
        return Err(CniError::new(code, format!("ipam: {msg}"))
            .details(v["details"].as_str().unwrap_or_default()));
    }
    if command != "ADD" {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        CniError::new(
            IPAM_FAILURE,
            format!("ipam: {plugin} printed no result: {e}"),
        )
    })?;
    if !v.is_object() || !(v["ips"].is_null() || v["ips"].is_array()) {
        return Err(CniError::new(
            IPAM_FAILURE,
            format!("ipam: {plugin} printed {v} as its result"),
        ));
    }
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A plugin that answers without reading stdin (as Go plugins do for
    /// VERSION) is heard, not reported as a broken pipe: the stdin here is
    /// larger than a pipe holds, so the write always outlives the plugin.
    #[test]
    fn a_plugin_that_ignores_stdin_is_still_heard() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("quiet");
        fs_write_exec(
            &bin,
            "#!/bin/sh\necho '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.1.0\"]}'\n",
        );
        let big = vec![b' '; 1 << 20];
        let out = run(&bin, "VERSION", &[], "", &big).unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["supportedVersions"][0], "1.1.0");
        let path = dir.path().display().to_string();
        let conf = serde_json::json!({"ipam": {"type": "quiet"}});
        assert!(speaks_1_1(&conf, &path).unwrap());
    }

    fn fs_write_exec(p: &Path, body: &str) {
        std::fs::write(p, body).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
