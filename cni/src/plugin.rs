//! The CNI verbs.

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use switchyard_api::fs::{share_with_group, write_atomic};
use switchyard_api::{
    stable_hash, Client, ClientError, ErrorCode, KindSpec, MemifMode, MemifSpec, PortInfo,
    PortSpec, Request, VhostUserSpec,
};

use crate::args::CniArgs;
use crate::devinfo::{DeviceInfo, MemifInfo, VhostUserInfo};
use crate::error::*;
use crate::ipam;
use crate::netconf::{InterfaceKind, NetConf, Pin, SUPPORTED_VERSIONS};
use crate::result::{add_result, Interface, ResultView};

/// The `CNI_*` environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: String,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS`.
    pub args: String,
    /// `CNI_PATH`.
    pub path: String,
}

impl Env {
    /// Reads the process environment.
    pub fn from_process() -> Env {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Env {
            command: get("CNI_COMMAND").unwrap_or_default(),
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS").unwrap_or_default(),
            path: get("CNI_PATH").unwrap_or_default(),
        }
    }

    fn need<'a>(&self, v: &'a Option<String>, name: &str) -> Result<&'a str, CniError> {
        v.as_deref().ok_or_else(|| {
            CniError::new(
                INVALID_ENV,
                format!("{name} is required for {}", self.command),
            )
        })
    }
}

/// A name safe as one path component: letters, digits, `-`, `_`, `.`,
/// not starting with `.`.
fn safe_component(what: &str, s: &str, max: usize) -> Result<(), CniError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            INVALID_ENV,
            format!("{what}: {s:?} must be 1 to {max} of letters, digits, '-', '_', '.' and not start with '.'"),
        ))
    }
}

/// The switch port name of an attachment.
pub fn port_name(container_id: &str, ifname: &str) -> String {
    format!("cni-{:016x}-{ifname}", stable_hash(container_id))
}

/// A locally administered MAC derived from the attachment.
fn derived_mac(container_id: &str, ifname: &str) -> String {
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
    /// Device-info file written.
    pub device_info_file: Option<String>,
    /// Whether IPAM was used (its config is in the netconf).
    pub ipam: Option<serde_json::Value>,
    /// Netconf CNI version.
    pub cni_version: String,
}

/// The node-wide bookkeeping directory (not visible to pods: only pod
/// subdirectories of the socket dir are mounted into pods).
fn state_dir(nc: &NetConf) -> PathBuf {
    nc.socket_dir.join(".switchyard-cni")
}

fn record_path(nc: &NetConf, container_id: &str, ifname: &str) -> PathBuf {
    state_dir(nc).join(format!("{:016x}-{ifname}.json", stable_hash(container_id)))
}

fn mkdir(p: &Path, mode: u32) -> Result<(), CniError> {
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
struct NodeLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

fn lock(nc: &NetConf) -> Result<NodeLock, CniError> {
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

fn client(nc: &NetConf) -> Result<Client, CniError> {
    Client::connect(&nc.control_socket)
        .map_err(|e| CniError::new(TRY_AGAIN_LATER, format!("switchyard daemon: {e}")))
}

fn call(c: &mut Client, req: &Request) -> Result<serde_json::Value, ClientError> {
    c.call(req)
}

fn switch_err(what: &str, e: ClientError) -> CniError {
    match e {
        ClientError::Api(a) => CniError::new(SWITCH_ERROR, format!("{what}: {}", a.message)),
        e => CniError::new(TRY_AGAIN_LATER, format!("{what}: {e}")),
    }
}

fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Api(a) if a.code == ErrorCode::NotFound)
}

/// The socket to use: the one a device plugin named in the device-info
/// file, else `<pod dir>/<ifname>.sock`. Either way it must lie inside the
/// socket dir.
fn choose_socket(
    nc: &NetConf,
    pod_dir: &Path,
    ifname: &str,
    dp: Option<&DeviceInfo>,
) -> Result<PathBuf, CniError> {
    let Some(path) = dp.and_then(|d| d.socket_path()) else {
        return Ok(pod_dir.join(format!("{ifname}.sock")));
    };
    let p = crate::netconf::clean_absolute("device-info path", path)?;
    let base = fs::canonicalize(&nc.socket_dir).map_err(|e| io(nc.socket_dir.display(), e))?;
    let parent = p
        .parent()
        .map(fs::canonicalize)
        .transpose()
        .map_err(|e| io(path, e))?
        .unwrap_or_default();
    if !parent.starts_with(&base) || p.file_name().is_none() {
        return Err(CniError::new(
            INVALID_CONFIG,
            format!(
                "device-info path {path:?} is outside socketDir {}",
                nc.socket_dir.display()
            ),
        ));
    }
    Ok(parent.join(p.file_name().unwrap_or_default()))
}

/// The device plugin's device info for this attachment, if it has one.
///
/// With a `deviceID` (Multus adds it when the network names a device-plugin
/// resource: the kubelet allocated that device to the pod), the device
/// plugin's file for it must exist, in `deviceInfoDir` or as the copy Multus
/// made at `CNIDeviceInfoFile`, and the two must agree. Without one, a
/// `CNIDeviceInfoFile` that already holds device info is used as it is.
fn device_plugin_info(nc: &NetConf) -> Result<Option<DeviceInfo>, CniError> {
    let copy = match &nc.device_info_file {
        Some(f) => DeviceInfo::read(f)?,
        None => None,
    };
    let Some(id) = &nc.device_id else {
        return Ok(copy);
    };
    let own = crate::devinfo::find_device_plugin_file(&nc.device_info_dir, id)?
        .map(|f| DeviceInfo::read(&f))
        .transpose()?
        .flatten();
    match (own, copy) {
        (Some(d), Some(c)) if d.socket_path() != c.socket_path() => Err(CniError::new(
            INVALID_CONFIG,
            format!(
                "deviceID {id:?}: the device plugin's device-info names socket {:?}, but runtimeConfig.CNIDeviceInfoFile names {:?}",
                d.socket_path().unwrap_or_default(),
                c.socket_path().unwrap_or_default()
            ),
        )),
        (Some(d), _) => Ok(Some(d)),
        (None, Some(c)) => Ok(Some(c)),
        (None, None) => Err(CniError::new(
            TRY_AGAIN_LATER,
            format!(
                "deviceID {id:?}: no device-info file for it in {} (deviceInfoDir) nor at CNIDeviceInfoFile; is switchyard-device-plugin running? Without it the pod's socket would be one nothing mounts into the pod",
                nc.device_info_dir.display()
            ),
        )),
    }
}

/// The interface kind after a device plugin's device info: its role/mode
/// wins (it decided who creates the socket).
fn kind_with_devinfo(nc: &NetConf, dp: Option<&DeviceInfo>) -> Result<InterfaceKind, CniError> {
    let Some(d) = dp else {
        return Ok(nc.kind.clone());
    };
    let mismatch = || {
        CniError::new(
            INVALID_CONFIG,
            format!(
                "interfaceType: {} but the device-info file describes {:?}",
                nc.kind.type_name(),
                d.kind
            ),
        )
    };
    Ok(match (&nc.kind, d) {
        (InterfaceKind::Memif { opts, .. }, DeviceInfo { memif: Some(m), .. }) => {
            InterfaceKind::Memif {
                pod_role: m.role,
                opts: opts.clone(),
            }
        }
        (
            InterfaceKind::VhostUser { queues, .. },
            DeviceInfo {
                vhost_user: Some(v),
                ..
            },
        ) => InterfaceKind::VhostUser {
            pod_mode: v.mode,
            queues: *queues,
        },
        _ => return Err(mismatch()),
    })
}

fn device_info(kind: &InterfaceKind, socket: &Path) -> DeviceInfo {
    let path = socket.display().to_string();
    match kind {
        InterfaceKind::Memif { pod_role, .. } => DeviceInfo {
            kind: "memif".into(),
            version: crate::devinfo::VERSION.into(),
            memif: Some(MemifInfo {
                role: *pod_role,
                mode: MemifMode::Ethernet.as_str().into(),
                path,
            }),
            vhost_user: None,
        },
        InterfaceKind::VhostUser { pod_mode, .. } => DeviceInfo {
            kind: "vhost-user".into(),
            version: crate::devinfo::VERSION.into(),
            memif: None,
            vhost_user: Some(VhostUserInfo {
                mode: *pod_mode,
                path,
            }),
        },
    }
}

fn port_spec(nc: &NetConf, kind: &InterfaceKind, name: &str, socket: &Path, mac: &str) -> PortSpec {
    let socket = socket.display().to_string();
    // The group reaches the socket only where the switch creates it.
    let group = nc.raw.socket_group.filter(|_| kind.switch_creates_socket());
    let kind = match kind {
        InterfaceKind::Memif { pod_role, opts } => KindSpec::Memif(MemifSpec {
            mode: Some(MemifMode::Ethernet),
            queues: opts.queues,
            ring_size: opts.ring_size,
            buffer_size: opts.buffer_size,
            secret: opts.secret.clone(),
            socket_group: group,
            ..MemifSpec::new(pod_role.peer(), socket)
        }),
        InterfaceKind::VhostUser { pod_mode, queues } => KindSpec::VhostUser(VhostUserSpec {
            queues: *queues,
            socket_group: group,
            ..VhostUserSpec::new(pod_mode.peer(), socket)
        }),
    };
    PortSpec {
        bridge: Some(nc.bridge.clone()),
        vlan: nc.vlan,
        trunk: nc.trunk.clone(),
        mac_limit: nc.raw.mac_limit,
        // The MAC was checked when the netconf and CNI_ARGS were read.
        macs: (nc.pin == Pin::Result)
            .then(|| mac.parse().ok().map(|m| vec![m]))
            .flatten(),
        pin_first: (nc.pin == Pin::First).then_some(true),
        ..PortSpec::new(name, kind)
    }
}

fn pod_key(args: &CniArgs, container_id: &str) -> Result<String, CniError> {
    let key = args
        .pod_uid
        .clone()
        .unwrap_or_else(|| container_id.to_string());
    safe_component("K8S_POD_UID or CNI_CONTAINERID", &key, 128)?;
    Ok(key)
}

fn read_record(path: &Path) -> Option<Record> {
    fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

fn write_record(path: &Path, r: &Record) -> Result<(), CniError> {
    let body = serde_json::to_vec(r).unwrap_or_default();
    write_atomic(path, &body, 0o600).map_err(|e| io(path.display(), e))
}

/// ADD.
pub fn add(
    env: &Env,
    nc: &NetConf,
    stdin: &serde_json::Value,
) -> Result<serde_json::Value, CniError> {
    let container_id = env.need(&env.container_id, "CNI_CONTAINERID")?;
    let netns = env.need(&env.netns, "CNI_NETNS")?;
    let ifname = env.need(&env.ifname, "CNI_IFNAME")?;
    safe_component("CNI_IFNAME", ifname, 15)?;
    let args = CniArgs::parse(&env.args)?;
    let key = pod_key(&args, container_id)?;
    let mac = match nc.mac.clone().or(args.mac.clone()) {
        Some(m) => {
            crate::netconf::parse_mac(&m).ok_or_else(|| {
                CniError::new(INVALID_ENV, format!("MAC: {m:?} is not a MAC address"))
            })?;
            m
        }
        None => derived_mac(container_id, ifname),
    };
    let prev = stdin.get("prevResult").filter(|v| !v.is_null());

    let _lock = lock(nc)?;
    let pod_dir = nc.socket_dir.join(&key);
    let mode = if nc.raw.socket_group.is_some() {
        0o770
    } else {
        0o700
    };
    mkdir(&pod_dir, mode)?;
    if let Some(gid) = nc.raw.socket_group {
        share_with_group(&pod_dir, gid, 0o770).map_err(|e| io(pod_dir.display(), e))?;
    }
    let dp = device_plugin_info(nc)?;
    let kind = kind_with_devinfo(nc, dp.as_ref())?;
    let socket = choose_socket(nc, &pod_dir, ifname, dp.as_ref())?;
    let name = port_name(container_id, ifname);

    let mut c = client(nc)?;
    match call(
        &mut c,
        &Request::BridgeAdd {
            name: nc.bridge.clone(),
        },
    ) {
        Ok(_) => {}
        Err(ClientError::Api(a)) if a.code == ErrorCode::AlreadyExists => {}
        Err(e) => return Err(switch_err("bridge", e)),
    }
    let ipam_res = match &nc.raw.ipam {
        Some(_) => ipam::exec("ADD", stdin, &[], &env.path)?,
        None => None,
    };
    let undo_ipam = || {
        if nc.raw.ipam.is_some() {
            let _ = ipam::exec("DEL", stdin, &[], &env.path);
        }
    };
    // The result, before anything else is made: a prevResult it cannot
    // extend fails the call with nothing to undo but the lease.
    let iface = Interface {
        name: ifname.to_string(),
        mac: Some(mac.clone()),
        sandbox: Some(netns.to_string()),
        socket_path: Some(socket.display().to_string()),
    };
    let result = match add_result(
        &nc.cni_version,
        prev,
        &iface,
        ipam_res.as_ref(),
        nc.raw.dns.as_ref(),
    ) {
        Ok(r) => r,
        Err(e) => {
            undo_ipam();
            return Err(e);
        }
    };
    // A port with this name can only be a leftover of this attachment.
    match call(&mut c, &Request::PortDel { name: name.clone() }) {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {}
        Err(e) => {
            undo_ipam();
            return Err(switch_err("port", e));
        }
    }
    let spec = port_spec(nc, &kind, &name, &socket, &mac);
    if let Err(e) = call(
        &mut c,
        &Request::PortAdd {
            port: Box::new(spec),
        },
    ) {
        undo_ipam();
        return Err(switch_err("port", e));
    }
    let finish = || -> Result<(), CniError> {
        if let Some(f) = &nc.device_info_file {
            device_info(&kind, &socket).write(f)?;
        }
        write_record(
            &record_path(nc, container_id, ifname),
            &Record {
                network: nc.raw.name.clone(),
                container_id: container_id.to_string(),
                ifname: ifname.to_string(),
                pod_key: key.clone(),
                port: name.clone(),
                socket: socket.display().to_string(),
                device_info_file: nc
                    .device_info_file
                    .as_ref()
                    .map(|p| p.display().to_string()),
                ipam: nc.raw.ipam.clone(),
                cni_version: nc.cni_version.clone(),
            },
        )
    };
    if let Err(e) = finish() {
        let _ = call(&mut c, &Request::PortDel { name: name.clone() });
        undo_ipam();
        return Err(e);
    }

    Ok(result)
}

/// Removes everything of one attachment. `ipam_env` overrides the
/// environment for the IPAM plugin (GC of other containers).
fn teardown(
    nc: &NetConf,
    stdin: &serde_json::Value,
    env: &Env,
    container_id: &str,
    ifname: &str,
    pod_key: Option<String>,
    ipam_env: &[(&str, String)],
) -> Result<(), CniError> {
    let rec_path = record_path(nc, container_id, ifname);
    let rec = read_record(&rec_path);
    let name = port_name(container_id, ifname);
    // The daemon being absent (no socket at all) is not a reason to keep a
    // pod from terminating; a daemon that exists but fails is retried.
    if nc.control_socket.exists() {
        let mut c = client(nc)?;
        match call(&mut c, &Request::PortDel { name }) {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(switch_err("port", e)),
        }
    }
    let ipam_conf = nc
        .raw
        .ipam
        .clone()
        .or(rec.as_ref().and_then(|r| r.ipam.clone()));
    if let Some(ipam) = ipam_conf {
        let mut conf = stdin.clone();
        conf["ipam"] = ipam;
        ipam::exec("DEL", &conf, ipam_env, &env.path)?;
    }
    // ADD's record knows the directory even if DEL's CNI_ARGS lack the pod UID.
    let key = rec.as_ref().map(|r| r.pod_key.clone()).or(pod_key);
    if let Some(r) = &rec {
        let _ = fs::remove_file(&r.socket);
    }
    let devinfo = nc.device_info_file.clone().or(rec
        .as_ref()
        .and_then(|r| r.device_info_file.as_ref().map(PathBuf::from)));
    if let Some(f) = devinfo {
        let _ = fs::remove_file(f);
    }
    if let Some(k) = key {
        if safe_component("pod", &k, 128).is_ok() {
            let dir = nc.socket_dir.join(&k);
            let _ = fs::remove_file(dir.join(format!("{ifname}.sock")));
            // Only when empty: other interfaces of the pod may remain.
            let _ = fs::remove_dir(&dir);
        }
    }
    let _ = fs::remove_file(&rec_path);
    Ok(())
}

/// DEL (idempotent).
pub fn del(env: &Env, nc: &NetConf, stdin: &serde_json::Value) -> Result<(), CniError> {
    let container_id = env.need(&env.container_id, "CNI_CONTAINERID")?;
    let ifname = env.need(&env.ifname, "CNI_IFNAME")?;
    safe_component("CNI_IFNAME", ifname, 15)?;
    let args = CniArgs::parse(&env.args)?;
    let key = match args.pod_uid {
        Some(_) => Some(pod_key(&args, container_id)?),
        None => safe_component("CNI_CONTAINERID", container_id, 128)
            .ok()
            .map(|_| container_id.to_string()),
    };
    let _lock = lock(nc)?;
    teardown(nc, stdin, env, container_id, ifname, key, &[])
}

/// CHECK.
pub fn check(env: &Env, nc: &NetConf, stdin: &serde_json::Value) -> Result<(), CniError> {
    let container_id = env.need(&env.container_id, "CNI_CONTAINERID")?;
    env.need(&env.netns, "CNI_NETNS")?;
    let ifname = env.need(&env.ifname, "CNI_IFNAME")?;
    safe_component("CNI_IFNAME", ifname, 15)?;
    let fail = |m: String| CniError::new(CHECK_FAILED, m);
    let rec = read_record(&record_path(nc, container_id, ifname)).ok_or_else(|| {
        CniError::new(
            UNKNOWN_CONTAINER,
            format!("no attachment {ifname} for this container"),
        )
    })?;
    let mut c = client(nc)?;
    let ports: Vec<PortInfo> = serde_json::from_value(
        call(&mut c, &Request::PortList).map_err(|e| switch_err("port list", e))?,
    )
    .map_err(|e| CniError::new(DECODE_FAILURE, e.to_string()))?;
    let p = ports
        .iter()
        .find(|p| p.spec.name == rec.port)
        .map(|p| &p.spec)
        .ok_or_else(|| fail(format!("port {} is missing from the switch", rec.port)))?;
    if p.bridge.as_deref() != Some(nc.bridge.as_str()) {
        return Err(fail(format!(
            "port {} is in bridge {:?}, not {:?}",
            p.name, p.bridge, nc.bridge
        )));
    }
    if p.vlan != nc.vlan {
        return Err(fail(format!(
            "port {} has VLAN {:?}, not {:?}",
            p.name, p.vlan, nc.vlan
        )));
    }
    if p.kind.socket() != rec.socket {
        return Err(fail(format!(
            "port {} uses socket {}, not {}",
            p.name,
            p.kind.socket(),
            rec.socket
        )));
    }
    if let Some(f) = &nc.device_info_file {
        if DeviceInfo::read(f)?.is_none() {
            return Err(fail(format!("device-info file {} is missing", f.display())));
        }
    }
    if let Some(prev) = stdin.get("prevResult").filter(|v| !v.is_null()) {
        let prev = ResultView::from_value(prev)
            .map_err(|e| CniError::new(DECODE_FAILURE, format!("prevResult: {e}")))?;
        if !prev.interfaces.iter().any(|i| i.name == ifname) {
            return Err(fail(format!("prevResult has no interface {ifname}")));
        }
    }
    if nc.raw.ipam.is_some() {
        ipam::exec("CHECK", stdin, &[], &env.path)?;
    }
    Ok(())
}

/// STATUS: is the switch answering, and, when the IPAM plugin speaks CNI
/// 1.1, is it ready too?
pub fn status(env: &Env, nc: &NetConf, stdin: &serde_json::Value) -> Result<(), CniError> {
    let mut c = Client::connect(&nc.control_socket)
        .map_err(|e| CniError::new(PLUGIN_NOT_AVAILABLE, format!("switchyard daemon: {e}")))?;
    c.call(&Request::Ping)
        .map_err(|e| CniError::new(PLUGIN_NOT_AVAILABLE, format!("switchyard daemon: {e}")))?;
    if nc.raw.ipam.is_some() && ipam::speaks_1_1(stdin, &env.path)? {
        ipam::exec("STATUS", stdin, &[], &env.path)?;
    }
    Ok(())
}

/// GC: removes this network's attachments not listed as valid.
pub fn gc(env: &Env, nc: &NetConf, stdin: &serde_json::Value) -> Result<(), CniError> {
    let valid: Vec<(String, String)> = nc
        .raw
        .valid_attachments
        .iter()
        .chain(nc.raw.attachments.iter())
        .flatten()
        .map(|a| (a.container_id.clone(), a.ifname.clone()))
        .collect();
    let _lock = lock(nc)?;
    let dir = state_dir(nc);
    let entries = fs::read_dir(&dir).map_err(|e| io(dir.display(), e))?;
    let mut first_err = None;
    for e in entries.flatten() {
        let Some(rec) = read_record(&e.path()) else {
            continue;
        };
        if rec.network != nc.raw.name
            || valid
                .iter()
                .any(|(c, i)| *c == rec.container_id && *i == rec.ifname)
        {
            continue;
        }
        let ipam_env = [
            ("CNI_CONTAINERID", rec.container_id.clone()),
            ("CNI_IFNAME", rec.ifname.clone()),
            ("CNI_NETNS", String::new()),
            ("CNI_ARGS", String::new()),
        ];
        let mut conf = stdin.clone();
        if let Some(o) = conf.as_object_mut() {
            o.remove("cni.dev/valid-attachments");
            o.remove("cni.dev/attachments");
        }
        if let Err(err) = teardown(
            nc,
            &conf,
            env,
            &rec.container_id,
            &rec.ifname,
            Some(rec.pod_key.clone()),
            &ipam_env,
        ) {
            first_err.get_or_insert(err);
        }
    }
    // An IPAM plugin that speaks 1.1 frees the leases of every attachment
    // not listed, including ones this plugin holds no record of.
    if nc.raw.ipam.is_some() && first_err.is_none() && ipam::speaks_1_1(stdin, &env.path)? {
        ipam::exec("GC", stdin, &[], &env.path)?;
    }
    first_err.map_or(Ok(()), Err)
}

/// VERSION.
pub fn version() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.1.0",
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}
