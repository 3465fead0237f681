//! `switchyard-cni`: the CNI plugin that attaches pods to the Switchyard
//! switch.
//!
//! - [`netconf`]: the network configuration and its validation;
//! - [`args`]: the `CNI_ARGS` keys;
//! - [`devinfo`]: Device Information Specification 1.1.0 files;
//! - [`ipam`]: delegation to an IPAM plugin;
//! - [`result`]: results in the requested CNI version;
//! - [`podresources`]: the kubelet's word on which devices a pod holds;
//! - [`plugin`]: the verbs (ADD, DEL, CHECK, STATUS, GC, VERSION).

#![warn(missing_docs)]

pub mod args;
pub mod devinfo;
pub mod error;
pub mod ipam;
pub mod netconf;
pub mod plugin;
pub mod podresources;
pub mod result;

use std::io::Read;

use error::{CniError, DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_ENV};

/// Runs one invocation: returns what to print on stdout and whether it
/// succeeded.
pub fn run(env: &plugin::Env, stdin: &[u8]) -> (Option<serde_json::Value>, bool) {
    let version_hint = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
        .filter(|v| netconf::SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| "1.1.0".into());
    match dispatch(env, stdin) {
        Ok(out) => (out, true),
        Err(e) => (Some(e.to_json(&version_hint)), false),
    }
}

fn dispatch(env: &plugin::Env, stdin: &[u8]) -> Result<Option<serde_json::Value>, CniError> {
    if env.command == "VERSION" {
        return Ok(Some(plugin::version(stdin)));
    }
    let raw: serde_json::Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::new(DECODE_FAILURE, format!("netconf: {e}")))?;
    let nc = netconf::NetConf::parse(stdin)?;
    for key in &nc.ignored {
        // The runtime logs a plugin's stderr: a typo in a key of ours shows.
        eprintln!(
            "switchyard-cni: warning: netconf key {key:?} is not one of this plugin's; ignored"
        );
    }
    let since = |first: &str| {
        if netconf::version_at_least(&nc.cni_version, first) {
            Ok(())
        } else {
            Err(CniError::new(
                INCOMPATIBLE_VERSION,
                format!(
                    "{} is defined from CNI {first} on, and the netconf's cniVersion is {}",
                    env.command, nc.cni_version
                ),
            ))
        }
    };
    match env.command.as_str() {
        "ADD" => plugin::add(env, &nc, &raw).map(Some),
        "DEL" => plugin::del(env, &nc, &raw).map(|_| None),
        "CHECK" => since("0.4.0").and_then(|_| plugin::check(env, &nc, &raw).map(|_| None)),
        "STATUS" => since("1.1.0").and_then(|_| plugin::status(env, &nc, &raw).map(|_| None)),
        "GC" => since("1.1.0").and_then(|_| plugin::gc(env, &nc, &raw).map(|_| None)),
        "" => Err(CniError::new(INVALID_ENV, "CNI_COMMAND is not set")),
        c => Err(CniError::new(
            INVALID_ENV,
            format!("CNI_COMMAND: {c:?} is not a CNI command"),
        )),
    }
}

/// Reads all of stdin (bounded: a netconf is small).
pub fn read_stdin() -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut buf)?;
    Ok(buf)
}
