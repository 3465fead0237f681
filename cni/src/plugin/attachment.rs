//! An attachment's names and bookkeeping: the switch port and MAC an
//! attachment gets, the pod directory it lives in, the record ADD leaves
//! for DEL, CHECK and GC, and the node-wide lock.

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use switchyard_api::fs::write_atomic;
use switchyard_api::stable_hash;

use crate::args::CniArgs;
use crate::error::*;
use crate::netconf::NetConf;

/// A name safe as one path component (an environment value:
/// [`crate::netconf::path_component`] with `INVALID_ENV`).
pub(crate) fn safe_component(what: &str, s: &str, max: usize) -> Result<(), CniError> {
    crate::netconf::path_component(what, s, max, INVALID_ENV)
}

/// The prefix of the names of the ports this plugin makes.
pub(crate) const PORT_PREFIX: &str = "cni-";

/// The switch port name of an attachment.
pub fn port_name(container_id: &str, ifname: &str) -> String {
    format!("{PORT_PREFIX}{:016x}-{ifname}", stable_hash(container_id))
}

/// A locally administered MAC derived from the attachment.
pub(crate) fn derived_mac(container_id: &str, ifname: &str) -> String {
    let h = stable_hash(&format!("{container_id}/{ifname}")).to_be_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        h[0], h[1], h[2], h[3], h[4]
    )
}

/// What ADD remembers for DEL, CHECK and GC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Network name.
    pub network: String,
    /// Container id.
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
    /// Pod directory name.
    pub pod_key: String,
    /// Switch port.
    pub port: String,
    /// Socket path.
    pub socket: String,
    /// The name of the memif socket the attachment shares with the pod's
    /// other networks that name it (`memif.socket`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memif_socket: Option<String>,
    /// Device-info file written.
    pub device_info_file: Option<String>,
    /// Whether IPAM was used (its config is in the netconf).
    pub ipam: Option<serde_json::Value>,
    /// Netconf CNI version.
    pub cni_version: String,
    /// The ADD this attachment answered and its answer: the same ADD asked
    /// again gets the same answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<Added>,
}

/// An ADD and its answer, as a record keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Added {
    /// The ADD's stdin (netconf, runtime config, prevResult).
    pub stdin: serde_json::Value,
    /// Its `CNI_ARGS`.
    pub args: String,
    /// Its `CNI_NETNS`.
    pub netns: String,
    /// The result printed.
    pub result: serde_json::Value,
}

/// The node-wide bookkeeping directory (not visible to pods: only pod
/// subdirectories of the socket dir are mounted into pods).
pub(crate) fn state_dir(nc: &NetConf) -> PathBuf {
    nc.socket_dir.join(switchyard_api::CNI_RECORDS_DIR)
}

pub(crate) fn record_path(nc: &NetConf, container_id: &str, ifname: &str) -> PathBuf {
    state_dir(nc).join(format!("{:016x}-{ifname}.json", stable_hash(container_id)))
}

/// Ports a DEL could not remove because the switch was not there (stopped,
/// crash-looping, or gone with a node reboot): one file per port, named
/// after it, holding the control socket of the switch that owes it. The
/// next call that reaches that switch removes them (the plugin's
/// `collect_garbage`).
fn owed_dir(nc: &NetConf) -> PathBuf {
    state_dir(nc).join("owed")
}

/// Remembers that the switch at `nc.control_socket` still has `port`.
pub(crate) fn owe(nc: &NetConf, port: &str) -> Result<(), CniError> {
    let dir = owed_dir(nc);
    mkdir(&dir, 0o700)?;
    let path = dir.join(port);
    let body = nc.control_socket.as_os_str().as_encoded_bytes();
    write_atomic(&path, body, 0o600).map_err(|e| io(path.display(), e))
}

/// Forgets that `port` is owed: an attachment made it again.
pub(crate) fn forgive(nc: &NetConf, port: &str) {
    let _ = fs::remove_file(owed_dir(nc).join(port));
}

/// The ports owed by the switch at `nc.control_socket`.
pub(crate) fn owed(nc: &NetConf) -> Vec<(String, PathBuf)> {
    let want = nc.control_socket.as_os_str().as_encoded_bytes();
    fs::read_dir(owed_dir(nc))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| fs::read(e.path()).is_ok_and(|b| b == want))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect()
}

pub(crate) fn mkdir(p: &Path, mode: u32) -> Result<(), CniError> {
    match fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Never follow a symlink planted where a directory should be.
            let m = fs::symlink_metadata(p).map_err(|e| io(p.display(), e))?;
            if m.file_type().is_symlink() || !m.is_dir() {
                return Err(CniError::new(
                    IO_FAILURE,
                    format!("{} exists and is not a directory", p.display()),
                ));
            }
            Ok(())
        }
        Err(e) => Err(io(p.display(), e)),
    }
}

/// Holds the node-wide CNI lock (flock) while alive.
pub(crate) struct NodeLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

pub(crate) fn lock(nc: &NetConf) -> Result<NodeLock, CniError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&nc.socket_dir)
        .map_err(|e| io(nc.socket_dir.display(), e))?;
    mkdir(&nc.socket_dir, 0o755)?;
    let dir = state_dir(nc);
    mkdir(&dir, 0o700)?;
    let path = dir.join("lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io(path.display(), e))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map(NodeLock)
        .map_err(|(_, e)| io(path.display(), e.into()))
}

pub(crate) fn pod_key(args: &CniArgs, container_id: &str) -> Result<String, CniError> {
    let key = args
        .pod_uid
        .clone()
        .unwrap_or_else(|| container_id.to_string());
    safe_component("K8S_POD_UID or CNI_CONTAINERID", &key, 128)?;
    Ok(key)
}

/// Every attachment record of this socket dir, with its file.
pub(crate) fn records(nc: &NetConf) -> Vec<(PathBuf, Record)> {
    fs::read_dir(state_dir(nc))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.path(), read_record(&e.path())?)))
        .collect()
}

pub(crate) fn read_record(path: &Path) -> Option<Record> {
    fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

pub(crate) fn write_record(path: &Path, r: &Record) -> Result<(), CniError> {
    let body = serde_json::to_vec(r).unwrap_or_default();
    write_atomic(path, &body, 0o600).map_err(|e| io(path.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_bounded_and_distinct() {
        let a = port_name("c0ffee", "net1");
        assert_eq!(a, port_name("c0ffee", "net1"));
        assert!(a.starts_with("cni-") && a.ends_with("-net1"), "{a}");
        assert_ne!(a, port_name("c0ffef", "net1"));
        // The longest interface name still makes a valid port name.
        let long = port_name(&"f".repeat(64), &"i".repeat(15));
        switchyard_api::spec::validate_name("name", &long).unwrap();
        let m: switchyard_api::MacAddr = derived_mac("c0ffee", "net1").parse().unwrap();
        assert!(!m.is_multicast() && m.0[0] & 2 != 0, "local unicast: {m}");
        assert_ne!(derived_mac("c0ffee", "net1"), derived_mac("c0ffee", "net2"));
    }

    #[test]
    fn path_components_cannot_escape() {
        for bad in ["", "..", "../x", ".hidden", "a/b", "a b", &"x".repeat(129)] {
            let e = safe_component("K8S_POD_UID", bad, 128).unwrap_err();
            assert_eq!(e.code, INVALID_ENV, "{bad:?}");
            assert!(e.msg.starts_with("K8S_POD_UID:"), "{e:?}");
        }
        safe_component("K8S_POD_UID", "0f1e-2d3c_4b.5a", 128).unwrap();
    }

    #[test]
    fn directories_are_never_links_and_records_round_trip() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("link")).unwrap();
        let e = mkdir(&d.path().join("link"), 0o700).unwrap_err();
        assert!(e.msg.contains("is not a directory"), "{e:?}");
        mkdir(&d.path().join("dir"), 0o700).unwrap();
        mkdir(&d.path().join("dir"), 0o700).unwrap();
        let r = Record {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "net1".into(),
            pod_key: "uid".into(),
            port: port_name("c", "net1"),
            socket: "/run/switchyard/uid/net1.sock".into(),
            memif_socket: None,
            device_info_file: None,
            ipam: Some(serde_json::json!({"type": "host-local"})),
            cni_version: "1.1.0".into(),
            added: Some(Added {
                stdin: serde_json::json!({"name": "n"}),
                args: "IgnoreUnknown=1".into(),
                netns: "/var/run/netns/x".into(),
                result: serde_json::json!({"cniVersion": "1.1.0"}),
            }),
        };
        let p = d.path().join("dir/r.json");
        write_record(&p, &r).unwrap();
        assert_eq!(read_record(&p), Some(r));
        assert_eq!(read_record(&d.path().join("none.json")), None);
    }
}
