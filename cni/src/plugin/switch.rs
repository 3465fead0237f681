//! What the plugin asks of the switch: the control-socket client, the
//! socket and role of a port (from the netconf, or from a device plugin's
//! device-info file), the port spec, and the device info the pod gets.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_api::{Client, ClientError, ErrorCode, PortSpec, Request, SocketAddr, SocketRole};

use crate::devinfo::{self, DeviceInfo};
use crate::error::*;
use crate::netconf::{NetConf, Pin};

/// How long DEL and GC wait for a switch that does not answer before they
/// tear down without it (its ports then owed): a plain restart answers
/// again well within it, and a switch away longer must not hold up every
/// pod's teardown.
pub(crate) const TEARDOWN_WAIT: Duration = Duration::from_secs(3);

/// The switch, once it answers: asked for up to `wait` while it is
/// restarting or being taken over (its socket missing, refused, or
/// answering `unavailable`), so that a restart costs the call a latency.
/// Later calls on the client ask again for [`switchyard_api::RETRY_FOR`].
pub(crate) fn client(nc: &NetConf, wait: Duration) -> Result<Client, CniError> {
    let mut c = Client::lazy(&nc.control_socket);
    c.set_retry(wait);
    c.call(&Request::Ping)
        .map_err(|e| CniError::new(TRY_AGAIN_LATER, format!("switchyard daemon: {e}")))?;
    c.set_retry(switchyard_api::RETRY_FOR);
    Ok(c)
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
/// file, else `<pod dir>/<ifname>.sock` (`<pod dir>/<name>.sock` for a
/// memif socket the pod's networks share, `memif.socket`). Either way it must lie inside the
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
        let file = nc.shared_socket().unwrap_or(ifname);
        return Ok(pod_dir.join(format!("{file}.sock")));
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
        Some(f) => devinfo::read(f)?,
        None => None,
    };
    let Some(id) = &nc.device_id else {
        return Ok(copy);
    };
    let own = devinfo::find_device_plugin_file(&nc.device_info_dir, id)?
        .map(|f| devinfo::read(&f))
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

/// The pod's role after a device plugin's device info: its role wins (it
/// decided who creates the socket), and its kind must be the netconf's.
pub(crate) fn pod_role_with_devinfo(
    nc: &NetConf,
    dp: Option<&DeviceInfo>,
) -> Result<SocketRole, CniError> {
    let Some(d) = dp else {
        return Ok(nc.pod_role);
    };
    match d.pod_role() {
        Some(r) if r.kind() == nc.pod_role.kind() => Ok(r),
        _ => Err(CniError::new(
            INVALID_CONFIG,
            format!(
                "interfaceType: {} but the device-info file describes {:?}",
                nc.pod_role.kind().name(),
                d.kind
            ),
        )),
    }
}

/// The device info the pod gets: its role and its socket.
pub(crate) fn device_info(pod_role: SocketRole, socket: &Path) -> DeviceInfo {
    DeviceInfo::for_pod(pod_role, &socket.display().to_string())
}

/// The switch's port for a pod whose role is `pod_role`: the switch takes
/// the other end, with the netconf's options for the kind.
pub(crate) fn port_spec(
    nc: &NetConf,
    pod_role: SocketRole,
    name: &str,
    socket: &Path,
    mac: &str,
) -> PortSpec {
    let mut kind = pod_role.peer().spec(SocketAddr::Path(socket.to_path_buf()));
    // The group reaches the socket only where the switch creates it.
    let group = nc
        .raw
        .socket_group
        .filter(|_| kind.socket().is_some_and(|s| s.switch_creates()));
    // The options of the kind's netconf section, as its spec module
    // reads them.
    pod_role
        .kind()
        .take_pod_section(&mut kind, &nc.pod_options, group);
    PortSpec {
        bridge: Some(nc.bridge.clone()),
        vlan: nc.vlan,
        trunk: nc.trunk.clone(),
        mac_limit: nc.raw.mac_limit,
        // Sent only when the netconf sets it (a switch of before storm
        // control refuses the field); the switch holds a pod's port to its
        // default otherwise.
        flood_limit: nc.raw.flood_limit,
        // Sent only when limited, as the flood limit.
        rate_limit: nc.rate_limit,
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
    use switchyard_api::spec::memif::MemifInfo;
    use switchyard_api::{KindSpec, MemifRole, VhostUserRole};

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
            nc.pod_role,
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
        assert_eq!(s.kind.role_name(), "client");
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
        let d = device_info(nc.pod_role, Path::new("/s/p.sock"));
        let m: MemifInfo = d.section().unwrap();
        assert_eq!((m.role, m.path.as_str()), (MemifRole::Slave, "/s/p.sock"));
        let dp = device_info(MemifRole::Master.into(), Path::new("/s/p.sock"));
        let r = pod_role_with_devinfo(&nc, Some(&dp)).unwrap();
        assert_eq!(r.peer().as_str(), "slave");
        let vu = device_info(VhostUserRole::Client.into(), Path::new("/s/v.sock"));
        let e = pod_role_with_devinfo(&nc, Some(&vu)).unwrap_err();
        assert_eq!(e.code, INVALID_CONFIG);
    }
}
