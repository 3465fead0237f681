//! The CNI verbs: ADD, DEL, CHECK, STATUS, GC and VERSION.

mod attachment;
mod switch;

pub use attachment::{port_name, Added, Record};

use std::fs;
use std::path::PathBuf;

use switchyard_api::fs::share_with_group;
use switchyard_api::{Client, ClientError, ErrorCode, PortInfo, PortSpec, Request};

use crate::args::CniArgs;
use crate::devinfo;
use crate::error::*;
use crate::ipam;
use crate::netconf::{NetConf, SUPPORTED_VERSIONS};
use crate::result::{add_result, Interface, ResultView};
use attachment::{
    derived_mac, lock, mkdir, owe, owed, pod_key, read_record, record_path, records,
    safe_component, state_dir, write_record,
};
use switch::{
    call, choose_socket, client, device_info, device_plugin_info, pod_role_with_devinfo, port_spec,
    remove_port, switch_err, TEARDOWN_WAIT,
};

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
    if let Some(id) = &nc.device_id {
        check_device_owner(nc, &args, id)?;
    }
    let pod_role = pod_role_with_devinfo(nc, dp.as_ref())?;
    // A socket the pod's networks share is where its first network has it
    // (with a device plugin, in that network's device): each network is
    // one interface of it.
    let socket = match shared_socket_of(nc, &key, container_id, ifname) {
        Some(s) => s,
        None => choose_socket(nc, &pod_dir, ifname, dp.as_ref())?,
    };
    let name = port_name(container_id, ifname);

    let mut c = client(nc, switchyard_api::RETRY_FOR)?;
    collect_garbage(nc, &mut c);
    let mut spec = port_spec(nc, pod_role, &name, &socket, &mac);
    // What the node agent finds the port's pod and network by.
    if let (Some(namespace), Some(pod)) = (&args.pod_namespace, &args.pod_name) {
        spec.pod = Some(switchyard_api::spec::PodAttachment {
            namespace: namespace.clone(),
            name: pod.clone(),
            uid: args.pod_uid.clone(),
            interface: ifname.to_string(),
            network: nc.raw.name.clone(),
        });
    }
    let rec_path = record_path(nc, container_id, ifname);
    let asked = Added {
        stdin: stdin.clone(),
        args: env.args.clone(),
        netns: netns.to_string(),
        result: serde_json::Value::Null,
    };
    if let Some(rec) = read_record(&rec_path) {
        match rec.added {
            // The same ADD again (a runtime that asks again after a timeout
            // or a lost answer): the same answer, with the port as that
            // ADD made it; nothing allocated twice.
            Some(a)
                if rec.network == nc.raw.name
                    && Added {
                        result: serde_json::Value::Null,
                        ..a.clone()
                    } == asked =>
            {
                spec.ips = pinned_ips(nc, &a.result, ifname);
                keep_port(&mut c, &spec).map_err(|e| switch_err("port", e))?;
                if let Some(f) = &nc.device_info_file {
                    devinfo::write(&device_info(pod_role, &socket), f)?;
                }
                return Ok(a.result);
            }
            // Another ADD under the same container and interface: the first
            // is taken down as DEL would (its lease released with its own
            // netconf, which may name another network or IPAM), then this
            // one is made.
            added => {
                // The first ADD's netconf, CNI_ARGS and CNI_NETNS, as its
                // IPAM saw them.
                let (first, first_env) = match added {
                    Some(a) => (a.stdin, vec![("CNI_ARGS", a.args), ("CNI_NETNS", a.netns)]),
                    // A record from before `added`: this ADD's netconf under
                    // the first one's network and IPAM.
                    None => {
                        let mut v = stdin.clone();
                        v["name"] = serde_json::Value::String(rec.network.clone());
                        match &rec.ipam {
                            Some(i) => v["ipam"] = i.clone(),
                            None => {
                                if let Some(o) = v.as_object_mut() {
                                    o.remove("ipam");
                                }
                            }
                        }
                        (v, Vec::new())
                    }
                };
                let mut switch = Ok(c);
                teardown(
                    nc,
                    &first,
                    env,
                    &mut switch,
                    container_id,
                    ifname,
                    None,
                    &first_env,
                )?;
                c = switch?;
                mkdir(&pod_dir, mode)?;
                if let Some(gid) = nc.raw.socket_group {
                    share_with_group(&pod_dir, gid, 0o770).map_err(|e| io(pod_dir.display(), e))?;
                }
            }
        }
    }
    // The overlay's node slice, for a network that names no IPAM.
    let mut node_ipam = None;
    if let Some(physnet) = &nc.raw.physnet {
        let b = check_physnet(&mut c, physnet)?;
        if nc.raw.ipam.is_none() {
            node_ipam = b.ipam.map(|i| overlay_ipam(physnet, &i)).transpose()?;
        }
    }
    // The netconf the IPAM plugin is run with: the NAD's, or host-local
    // with the node's slice of the overlay.
    let ipam_conf = nc.raw.ipam.clone().or(node_ipam);
    // Addresses asked for (the `ips` capability) come from the IPAM plugin,
    // which reads them from the same netconf: without one, none would.
    if ipam_conf.is_none()
        && nc
            .raw
            .runtime_config
            .as_ref()
            .and_then(|r| r.ips.as_ref())
            .is_some_and(|a| !a.is_empty())
    {
        return Err(CniError::new(
            INVALID_CONFIG,
            "runtimeConfig.ips: addresses were asked for, but this network has no IPAM to give them",
        ));
    }
    let ipam_netconf = with_ipam(stdin, ipam_conf.as_ref());
    let stdin = ipam_netconf.as_ref().unwrap_or(stdin);
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
    let ipam_res = match &ipam_conf {
        Some(_) => ipam::exec("ADD", stdin, &[], &env.path)?,
        None => None,
    };
    let undo_ipam = || {
        if ipam_conf.is_some() {
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
    spec.ips = pinned_ips(nc, &result, ifname);
    // A port with this name can only be a leftover of this attachment.
    if let Err(e) = remove_port(&mut c, &name) {
        undo_ipam();
        return Err(switch_err("port", e));
    }
    if let Err(e) = call(
        &mut c,
        &Request::PortAdd {
            port: Box::new(spec),
        },
    ) {
        undo_ipam();
        return Err(switch_err("port", e));
    }
    // Owed by an earlier DEL of this attachment and not yet removed: the
    // port is this attachment's now, never to be removed for that DEL.
    attachment::forgive(nc, &name);
    let finish = || -> Result<(), CniError> {
        if let Some(f) = &nc.device_info_file {
            devinfo::write(&device_info(pod_role, &socket), f)?;
        }
        write_record(
            &rec_path,
            &Record {
                network: nc.raw.name.clone(),
                container_id: container_id.to_string(),
                ifname: ifname.to_string(),
                pod_key: key.clone(),
                port: name.clone(),
                socket: socket.display().to_string(),
                memif_socket: nc.shared_socket().map(str::to_string),
                device_info_file: nc
                    .device_info_file
                    .as_ref()
                    .map(|p| p.display().to_string()),
                ipam: ipam_conf.clone(),
                cni_version: nc.cni_version.clone(),
                added: Some(Added {
                    result: result.clone(),
                    ..asked.clone()
                }),
            },
        )
    };
    if let Err(e) = finish() {
        let _ = remove_port(&mut c, &name);
        undo_ipam();
        return Err(e);
    }

    Ok(result)
}

/// The addresses the pod's port may send from (netconf `pinIps`): those
/// of interface `ifname` in `result` (a CNI result of any version, whose
/// `ips` name their interface by index, or name none), none if it has
/// none.
fn pinned_ips(
    nc: &NetConf,
    result: &serde_json::Value,
    ifname: &str,
) -> Option<Vec<std::net::IpAddr>> {
    if !nc.pin_ips {
        return None;
    }
    let ours = result["interfaces"]
        .as_array()
        .and_then(|i| i.iter().position(|x| x["name"] == ifname));
    let ips: Vec<std::net::IpAddr> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|ip| match ip["interface"].as_u64() {
            Some(i) => Some(i as usize) == ours,
            None => true,
        })
        .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
        .collect();
    (!ips.is_empty()).then_some(ips)
}

/// Port `spec` on the switch as it is: left alone when the switch has it
/// so (its peer stays connected), else made so.
fn keep_port(c: &mut Client, spec: &PortSpec) -> Result<(), ClientError> {
    let ports: Vec<PortInfo> = serde_json::from_value(call(c, &Request::PortList)?)
        .map_err(|e| ClientError::BadAnswer(e.to_string()))?;
    // A `pin_first` port records the MAC it pinned in its spec: that is
    // still the port this spec made. A port the switch could not make
    // (`failed`) is made again.
    let same = |have: &PortSpec| {
        let mut have = have.clone();
        // Its policy is the node agent's, set after the port was made.
        have.policy = None;
        if spec.pin_first == Some(true) && spec.macs.is_none() {
            have.macs = None;
        }
        have == *spec
    };
    match ports.iter().find(|p| p.spec.name == spec.name) {
        Some(p) if p.status.failed.is_none() && same(&p.spec) => return Ok(()),
        Some(_) => remove_port(c, &spec.name)?,
        None => {}
    }
    call(
        c,
        &Request::PortAdd {
            port: Box::new(spec.clone()),
        },
    )
    .map(drop)
}

/// The switch for DEL and GC, with the plugin's own garbage collected
/// first, or why it cannot be reached (which does not stop a teardown).
fn switch_for_teardown(nc: &NetConf) -> Result<Client, CniError> {
    let mut c = client(nc, TEARDOWN_WAIT)?;
    collect_garbage(nc, &mut c);
    Ok(c)
}

/// Removes everything of one attachment. `stdin` is the netconf its lease
/// is released with (IPAM DEL); `ipam_env` overrides the environment for
/// the IPAM plugin (GC of other containers); `switch` is
/// [`switch_for_teardown`]'s answer.
#[allow(clippy::too_many_arguments)]
fn teardown(
    nc: &NetConf,
    stdin: &serde_json::Value,
    env: &Env,
    switch: &mut Result<Client, CniError>,
    container_id: &str,
    ifname: &str,
    pod_key: Option<String>,
    ipam_env: &[(&str, String)],
) -> Result<(), CniError> {
    let rec_path = record_path(nc, container_id, ifname);
    let rec = read_record(&rec_path);
    let name = port_name(container_id, ifname);
    // A switch that is away (stopped, crash-looping, a node rebooted) must
    // not keep the pod from terminating (CNI spec: DEL cleans up as far as
    // it can): the lease and the files go now, and the port is remembered
    // for the next call that reaches this switch.
    let removed = match switch {
        Ok(c) => remove_port(c, &name).map_err(|e| switch_err("port", e)),
        Err(e) => Err(e.clone()),
    };
    if let Err(e) = removed {
        owe(nc, &name)?;
        eprintln!(
            "switchyard-cni: warning: port {name} not removed from the switch now ({}); the next CNI call that reaches it removes it",
            e.msg
        );
    }
    if let Some(conf) = with_ipam(stdin, rec.as_ref().and_then(|r| r.ipam.as_ref())) {
        ipam::exec("DEL", &conf, ipam_env, &env.path)?;
    }
    // ADD's record knows the directory even if DEL's CNI_ARGS lack the pod UID.
    let key = rec.as_ref().map(|r| r.pod_key.clone()).or(pod_key);
    // A socket other attachments still use (a shared memif socket) stays.
    let others = records(nc)
        .into_iter()
        .filter(|(p, _)| *p != rec_path)
        .map(|(_, r)| PathBuf::from(r.socket))
        .collect::<Vec<_>>();
    let remove_socket = |p: PathBuf| {
        if !others.contains(&p) {
            let _ = fs::remove_file(p);
        }
    };
    if let Some(r) = &rec {
        remove_socket(PathBuf::from(&r.socket));
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
            remove_socket(dir.join(format!("{ifname}.sock")));
            // Only when empty: other interfaces of the pod may remain.
            let _ = fs::remove_dir(&dir);
        }
    }
    let _ = fs::remove_file(&rec_path);
    Ok(())
}

/// The socket of the pod's attachment that names the same shared memif
/// socket (`memif.socket`) as this one, if another has been added.
fn shared_socket_of(nc: &NetConf, key: &str, container_id: &str, ifname: &str) -> Option<PathBuf> {
    let name = nc.shared_socket()?;
    records(nc)
        .into_iter()
        .map(|(_, r)| r)
        .find(|r| {
            r.pod_key == key
                && r.memif_socket.as_deref() == Some(name)
                && !(r.container_id == container_id && r.ifname == ifname)
        })
        .map(|r| PathBuf::from(r.socket))
}

/// A Kubernetes pod (the runtime's `CNI_ARGS` name it) may use only a
/// device the kubelet allocated to it: the netconf's `deviceID` is anyone's
/// who may write a NetworkAttachmentDefinition, so the kubelet's Pod
/// Resources API is asked, as Multus asks it. Where the device plugin's
/// device-info file names the resource (`<resource>-<id>-device.json`), the
/// pod must hold the device under that resource. Outside Kubernetes (no pod
/// name: podman, a runtime of the node's admin) the netconf is the admin's.
fn check_device_owner(nc: &NetConf, args: &CniArgs, id: &str) -> Result<(), CniError> {
    let (Some(ns), Some(pod)) = (&args.pod_namespace, &args.pod_name) else {
        return Ok(());
    };
    let file_resource = crate::devinfo::find_device_plugin_file(&nc.device_info_dir, id)?
        .and_then(|f| crate::devinfo::device_plugin_file_resource(&f, id));
    let held = crate::podresources::pod_devices(&nc.pod_resources_socket, ns, pod)?;
    let owns = held.iter().any(|(res, dev)| {
        dev == id
            && file_resource
                .as_ref()
                .is_none_or(|f| *f == crate::devinfo::file_name_part(res))
    });
    if owns {
        return Ok(());
    }
    Err(CniError::new(
        INVALID_CONFIG,
        format!(
            "deviceID: pod {ns}/{pod} holds no device {id:?}{} (kubelet pod resources: {}); a deviceID comes from the kubelet's allocation, not from a netconf",
            file_resource
                .map(|r| format!(" of {r}"))
                .unwrap_or_default(),
            listed(held.iter().map(|(r, d)| format!("{r}={d}")))
        ),
    ))
}

/// A network on a physnet this node has no uplink for would be a bridge
/// of its own, reaching no other node: refused, naming the node's physnets
/// and overlays (a NAD's `k8s.v1.cni.cncf.io/nodeSelector` keeps such pods
/// off nodes without it). An overlay (the daemon's `[overlays]`) is named
/// as a physnet is: its bridge reaches the other nodes through tunnels.
fn check_physnet(c: &mut Client, physnet: &str) -> Result<switchyard_api::BridgeInfo, CniError> {
    let bridges: Vec<switchyard_api::BridgeInfo> = serde_json::from_value(
        call(c, &Request::BridgeList).map_err(|e| switch_err("bridge list", e))?,
    )
    .map_err(|e| CniError::new(DECODE_FAILURE, format!("bridge list: {e}")))?;
    if let Some(b) = bridges
        .iter()
        .find(|b| b.name == physnet && (b.physnet.is_some() || b.overlay.is_some()))
    {
        return Ok(b.clone());
    }
    let have = |f: fn(&switchyard_api::BridgeInfo) -> Option<&String>| {
        listed(
            bridges
                .iter()
                .filter_map(|b| Some(format!("{} ({})", b.name, f(b)?))),
        )
    };
    Err(CniError::new(
        INVALID_CONFIG,
        format!(
            "physnet: {physnet:?} is not a physical network of this node's switch (its [physnets]: {}; its [overlays]: {})",
            have(|b| b.physnet.as_ref()),
            have(|b| b.overlay.as_ref()),
        ),
    ))
}

/// The `host-local` IPAM of a network on overlay `overlay` whose node
/// hands out slice `ipam.slice` of the overlay's subnets (one range set
/// per family, each with the subnet's prefix): its addresses are this
/// node's alone. Before the node agent claimed the node's slice, try
/// again later.
fn overlay_ipam(
    overlay: &str,
    ipam: &switchyard_api::overlay::NodeIpam,
) -> Result<serde_json::Value, CniError> {
    if ipam.slice.is_none() || ipam.ranges.is_empty() {
        return Err(CniError::new(
            TRY_AGAIN_LATER,
            format!("ipam: this node has no slice of overlay {overlay:?}'s addresses yet (switchyard-vtep-sync claims it)"),
        ));
    }
    let ranges: Vec<serde_json::Value> = ipam
        .ranges
        .iter()
        .map(|r| {
            serde_json::json!([{
                "subnet": r.subnet.to_string(),
                "rangeStart": r.range_start.to_string(),
                "rangeEnd": r.range_end.to_string(),
            }])
        })
        .collect();
    Ok(serde_json::json!({ "type": "host-local", "ranges": ranges }))
}

/// The netconf an IPAM plugin is run with: `stdin` as it is if it names
/// an `ipam`, else with `fallback` (what ADD recorded, or the node's slice
/// of an overlay); `None` if neither names one.
fn with_ipam(
    stdin: &serde_json::Value,
    fallback: Option<&serde_json::Value>,
) -> Option<serde_json::Value> {
    if stdin.get("ipam").is_some_and(|v| !v.is_null()) {
        return Some(stdin.clone());
    }
    let mut conf = stdin.clone();
    conf["ipam"] = fallback?.clone();
    Some(conf)
}

/// Items for an error message: comma-separated, or `none`.
fn listed(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The plugin's own garbage collection (Multus sends GC only to the
/// cluster network, so no runtime asks this plugin for it), run by every
/// call that reaches the switch, under the node lock:
/// - the ports earlier DELs left owed by this switch (see
///   [`attachment::owe`]); one it still cannot remove stays owed;
/// - ports this plugin made in this socket directory that no record claims
///   any more: after a node reboot the records (in `/run`) are gone while
///   the switch's state (in `/var/lib`) brings the ports back.
fn collect_garbage(nc: &NetConf, c: &mut Client) {
    for (port, file) in owed(nc) {
        if remove_port(c, &port).is_ok() {
            let _ = fs::remove_file(file);
        }
    }
    // Records unreadable (not just absent): no port is judged unclaimed.
    let Ok(entries) = fs::read_dir(state_dir(nc)) else {
        return;
    };
    let claimed: std::collections::HashSet<String> = entries
        .flatten()
        .filter_map(|e| read_record(&e.path()))
        .map(|r| r.port)
        .collect();
    let Ok(ports) = call(c, &Request::PortList)
        .map_err(|_| ())
        .and_then(|v| serde_json::from_value::<Vec<PortInfo>>(v).map_err(|_| ()))
    else {
        return;
    };
    for p in ports {
        let ours = p.spec.name.starts_with(attachment::PORT_PREFIX)
            && std::path::Path::new(&p.socket()).starts_with(&nc.socket_dir);
        if ours && !claimed.contains(&p.spec.name) {
            eprintln!(
                "switchyard-cni: removing port {} (socket {}): no attachment of this node claims it",
                p.spec.name,
                p.socket()
            );
            let _ = remove_port(c, &p.spec.name);
        }
    }
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
    let mut switch = switch_for_teardown(nc);
    teardown(nc, stdin, env, &mut switch, container_id, ifname, key, &[])
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
    let mut c = client(nc, switchyard_api::RETRY_FOR)?;
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
    // Its bandwidth, as the reference plugin checks its qdiscs'.
    if p.rate_limit != nc.rate_limit {
        let show = |l: &Option<switchyard_api::spec::RateLimits>| {
            l.map_or("none".to_string(), |l| {
                format!(
                    "ingress {}, egress {}",
                    l.tx.map_or("none".into(), |m| m.to_string()),
                    l.rx.map_or("none".into(), |m| m.to_string())
                )
            })
        };
        return Err(fail(format!(
            "port {} is limited to {}, not {}",
            p.name,
            show(&p.rate_limit),
            show(&nc.rate_limit)
        )));
    }
    let socket = p.kind.socket().map(|s| s.addr.to_string());
    if socket.as_deref() != Some(rec.socket.as_str()) {
        return Err(fail(format!(
            "port {} uses socket {}, not {}",
            p.name,
            socket.as_deref().unwrap_or("none"),
            rec.socket
        )));
    }
    if let Some(f) = &nc.device_info_file {
        if devinfo::read(f)?.is_none() {
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
    // The NAD's IPAM, or the node's slice of an overlay ADD used.
    if let Some(conf) = with_ipam(stdin, rec.ipam.as_ref()) {
        ipam::exec("CHECK", &conf, &[], &env.path)?;
    }
    Ok(())
}

/// STATUS: is the switch answering, and, when the IPAM plugin speaks CNI
/// 1.1, is it ready too?
pub fn status(env: &Env, nc: &NetConf, stdin: &serde_json::Value) -> Result<(), CniError> {
    let mut c = Client::connect(&nc.control_socket)
        .map_err(|e| CniError::new(PLUGIN_NOT_AVAILABLE, format!("switchyard daemon: {e}")))?;
    c.ask(&Request::ping())
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
    let mut switch = switch_for_teardown(nc);
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
            &mut switch,
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

/// VERSION: the answer's `cniVersion` is the request's (libcni sends
/// `{"cniVersion": <its own>}`), when it is one this plugin speaks;
/// otherwise, and with no request at all, the newest it speaks.
pub fn version(stdin: &[u8]) -> serde_json::Value {
    let asked = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()));
    serde_json::json!({
        "cniVersion": asked.as_deref().unwrap_or(SUPPORTED_VERSIONS[SUPPORTED_VERSIONS.len() - 1]),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}
