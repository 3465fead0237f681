//! What the plugin asks of the switch: the control-socket client, the
//! socket and role of a port (from the netconf, or from a device plugin's
//! device-info file), the port spec, and the device info the pod gets.

use std::fs;
use std::path::{Path, PathBuf};

use switchyard_api::{
    Client, ClientError, ErrorCode, KindSpec, MemifMode, MemifSpec, PortSpec, Request,
    VhostUserSpec,
};

use crate::devinfo::{DeviceInfo, MemifInfo, VhostUserInfo};
use crate::error::*;
use crate::netconf::{InterfaceKind, NetConf, Pin};

pub(crate) fn client(nc: &NetConf) -> Result<Client, CniError> {
    Client::connect(&nc.control_socket)
        .map_err(|e| CniError::new(TRY_AGAIN_LATER, format!("switchyard daemon: {e}")))
}

pub(crate) fn call(c: &mut Client, req: &Request) -> Result<serde_json::Value, ClientError> {
    c.call(req)
}

pub(crate) fn switch_err(what: &str, e: ClientError) -> CniError {
    match e {
        ClientError::Api(a) => CniError::new(SWITCH_ERROR, format!("{what}: {}", a.message)),
        e => CniError::new(TRY_AGAIN_LATER, format!("{what}: {e}")),
    }
}

fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::Api(a) if a.code == ErrorCode::NotFound)
}

/// Deletes port `name`; a port that is not there is not an error.
pub(crate) fn remove_port(c: &mut Client, name: &str) -> Result<(), ClientError> {
    match call(
        c,
        &Request::PortDel {
            name: name.to_string(),
        },
    ) {
        Err(e) if !is_not_found(&e) => Err(e),
        _ => Ok(()),
    }
}

/// The socket to use: the one a device plugin named in the device-info
/// file, else `<pod dir>/<ifname>.sock`. Either way it must lie inside the
/// socket dir (checked with symlinks resolved). The path is kept as the
/// device plugin wrote it: that is where the pod has it mounted (the pod's
/// image need not have the host's `/var/run -> /run`), and device-info and
/// the result must name the same path.
pub(crate) fn choose_socket(
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
    Ok(p)
}

/// The device plugin's device info for this attachment, if it has one.
///
/// With a `deviceID` (Multus adds it when the network names a device-plugin
/// resource: the kubelet allocated that device to the pod), the device
/// plugin's file for it must exist, in `deviceInfoDir` or as the copy Multus
/// made at `CNIDeviceInfoFile`, and the two must agree. Without one, a
/// `CNIDeviceInfoFile` that already holds device info is used as it is.
pub(crate) fn device_plugin_info(nc: &NetConf) -> Result<Option<DeviceInfo>, CniError> {
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
pub(crate) fn kind_with_devinfo(
    nc: &NetConf,
    dp: Option<&DeviceInfo>,
) -> Result<InterfaceKind, CniError> {
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

pub(crate) fn device_info(kind: &InterfaceKind, socket: &Path) -> DeviceInfo {
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

pub(crate) fn port_spec(
    nc: &NetConf,
    kind: &InterfaceKind,
    name: &str,
    socket: &Path,
    mac: &str,
) -> PortSpec {
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

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::{MemifRole, VhostUserRole};

    fn netconf(extra: &str) -> NetConf {
        NetConf::parse(
            format!(
                r#"{{"cniVersion":"1.1.0","name":"n","type":"switchyard","bridge":"br0","socketGroup":1000{extra}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn spec(nc: &NetConf) -> PortSpec {
        let s = port_spec(
            nc,
            &nc.kind,
            "p",
            Path::new("/s/p.sock"),
            "02:00:00:00:00:01",
        );
        s.validate("port.").unwrap();
        s
    }

    #[test]
    fn the_switch_takes_the_other_end_of_the_pods_role() {
        // A memif slave pod: the switch is master, creates the socket and
        // gives it the group.
        let s = spec(&netconf(""));
        let KindSpec::Memif(m) = &s.kind else {
            panic!("{s:?}")
        };
        assert_eq!((m.role, m.socket_group), (MemifRole::Master, Some(1000)));
        assert_eq!(s.bridge.as_deref(), Some("br0"));
        // A memif master pod: the switch connects; no group to give.
        let s = spec(&netconf(r#","memif":{"role":"master"}"#));
        let KindSpec::Memif(m) = &s.kind else {
            panic!("{s:?}")
        };
        assert_eq!((m.role, m.socket_group), (MemifRole::Slave, None));
        // vhost-user: a client pod means the switch serves the socket.
        let s = spec(&netconf(
            r#","interfaceType":"vhost-user","vhostUser":{"mode":"client"}"#,
        ));
        let KindSpec::VhostUser(v) = &s.kind else {
            panic!("{s:?}")
        };
        assert_eq!(
            (v.role, v.socket_group),
            (VhostUserRole::Server, Some(1000))
        );
        let s = spec(&netconf(
            r#","interfaceType":"vhost-user","vhostUser":{"mode":"server"}"#,
        ));
        assert_eq!(s.kind.role(), "client");
    }

    #[test]
    fn the_result_mac_is_pinned_unless_told_otherwise() {
        let s = spec(&netconf(""));
        assert_eq!(s.macs, Some(vec!["02:00:00:00:00:01".parse().unwrap()]));
        assert_eq!(s.pin_first, None);
        let s = spec(&netconf(r#","pin":"first""#));
        assert_eq!((s.macs, s.pin_first), (None, Some(true)));
        let s = spec(&netconf(r#","pin":"none""#));
        assert_eq!((s.macs, s.pin_first), (None, None));
    }

    #[test]
    fn device_info_names_the_pods_role_and_a_device_plugins_role_wins() {
        let nc = netconf("");
        let d = device_info(&nc.kind, Path::new("/s/p.sock"));
        assert_eq!(d.memif.as_ref().unwrap().role, MemifRole::Slave);
        assert_eq!(d.memif.as_ref().unwrap().path, "/s/p.sock");
        let dp = DeviceInfo {
            memif: Some(MemifInfo {
                role: MemifRole::Master,
                ..d.memif.clone().unwrap()
            }),
            ..d.clone()
        };
        let k = kind_with_devinfo(&nc, Some(&dp)).unwrap();
        assert_eq!(k.switch_role(), "slave");
        let vu = DeviceInfo {
            kind: "vhost-user".into(),
            memif: None,
            vhost_user: Some(VhostUserInfo {
                mode: VhostUserRole::Client,
                path: "/s/v.sock".into(),
            }),
            ..d
        };
        let e = kind_with_devinfo(&nc, Some(&vu)).unwrap_err();
        assert_eq!(e.code, INVALID_CONFIG);
    }
}
