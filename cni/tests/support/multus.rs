//! What Multus does around a delegate plugin, step by step as its source
//! does it (multus-cni `pkg/types/conf.go`, `pkg/multus/multus.go`, the
//! network-attachment-definition-client's `pkg/utils`, and libcni), so that
//! the plugin is driven with exactly the bytes and files Multus produces:
//!
//! - the NAD's config, with `name` injected when missing
//!   (`GetCNIConfigFromSpec`);
//! - for a network whose NAD names a device-plugin resource, the device the
//!   kubelet allocated injected as top-level `deviceID` and `pciBusID`
//!   (`delegateAddDeviceID`), the network selection's `cni-args` as
//!   `args.cni`;
//! - the runtime conf: `CNI_ARGS` `IgnoreUnknown=true;K8S_POD_NAMESPACE=..;
//!   K8S_POD_NAME=..;K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..`, and the
//!   capability args `mac`, `ips`, `deviceID` and, when there is a device,
//!   `CNIDeviceInfoFile` = `<devinfo>/cni/<ns>-<net>-<container>_<ifname>`
//!   (`delegateRuntimeConfig`, `GetCNIDeviceInfoPath`), of which libcni
//!   passes in `runtimeConfig` only those the netconf's `capabilities`
//!   declares (`injectRuntimeConfig`);
//! - before ADD, the device plugin's file copied there
//!   (`CopyDeviceInfoForCNIFromDP`: refused when the file exists, mode 0444);
//! - the delegates cached per container, and DEL replayed from that cache
//!   with libcni's cached result as `prevResult`, then the CNI device-info
//!   file removed;
//! - the plugin found by the netconf's `type` in Multus's `binDir` and then
//!   `CNI_PATH` (`confAdd`: `binDirs = append([]string{BinDir}, CNI_PATH...)`;
//!   libcni `pkg/invoke/find.go` `FindInPath`: the first regular file
//!   `<dir>/<type>`, else "failed to find plugin");
//! - the plugin's stdout parsed as a Result the way the libcni this Multus
//!   links does ([`MultusVersion`]): a result version that libcni cannot
//!   create fails the ADD;
//! - after ADD, the network-status entry built from the result and the
//!   CNIDeviceInfoFile's content (`getDelegateDeviceInfo`,
//!   `CreateNetworkStatus`).
//!
//! Multus sends STATUS and GC only to the cluster network's delegate, never
//! to these (`pkg/server/api` and `multus.go` `CmdStatus`/`CmdGC`), so the
//! stand-in has neither.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// A NetworkAttachmentDefinition as the API server holds it.
#[derive(Clone, Debug)]
pub struct Nad {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.config`, parsed.
    pub config: Value,
    /// The `k8s.v1.cni.cncf.io/resourceName` annotation.
    pub resource_name: Option<String>,
}

/// The pod being attached.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Sandbox (infra) container id: `CNI_CONTAINERID`.
    pub sandbox: String,
    /// Network namespace path.
    pub netns: String,
}

/// One element of the pod's `k8s.v1.cni.cncf.io/networks` annotation.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// `interface`.
    pub interface: Option<String>,
    /// `mac`.
    pub mac: Option<String>,
    /// `ips`.
    pub ips: Option<Vec<String>>,
    /// `deviceID`.
    pub device_id: Option<String>,
    /// `cni-args`.
    pub cni_args: Option<Value>,
}

/// Which Multus: what it can parse is fixed by the containernetworking/cni
/// library its `go.mod` links (v3.9.x: v0.8.1; v4.0.x: v1.1.2; v4.1.x and
/// v4.2.x: v1.2.x; v4.3.0 on: v1.3.0), and from v4.3.0 on it sorts a pod's
/// device IDs before handing them to networks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultusVersion {
    /// v3.9.x (libcni v0.8.1).
    V3_9,
    /// v4.0.x (libcni v1.1.2).
    V4_0,
    /// v4.1.x and v4.2.x (libcni v1.2.x).
    V4_1,
    /// v4.3.0 and later (libcni v1.3.0; `SortDeviceIDs`).
    V4_3,
}

impl MultusVersion {
    /// Every one, oldest first.
    pub const ALL: [MultusVersion; 4] = [
        MultusVersion::V3_9,
        MultusVersion::V4_0,
        MultusVersion::V4_1,
        MultusVersion::V4_3,
    ];

    /// Whether it sorts each resource's device IDs as strings
    /// (`kubeletclient.GetPodResourceMap` calls `types.SortDeviceIDs` from
    /// v4.3.0 on); before, they go in the order the kubelet's `List` gives.
    fn sorts_device_ids(self) -> bool {
        self == MultusVersion::V4_3
    }

    /// The version libcni parses a plugin's stdout as.
    fn result_version(self, conf: &Value, stdout: &Value) -> String {
        let of = |v: &Value| {
            v["cniVersion"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        match self {
            // v0.8.1 pkg/invoke/exec.go ExecPluginWithResult: "Plugin must
            // return result in same version as specified in netconf"
            // (ConfigDecoder: an empty version is 0.1.0).
            MultusVersion::V3_9 => of(conf).unwrap_or_else(|| "0.1.0".into()),
            // v1.1.2 and later, fixupResultVersion: the result's own
            // cniVersion, else the netconf's.
            _ => of(stdout)
                .or_else(|| of(conf))
                .unwrap_or_else(|| "0.1.0".into()),
        }
    }

    /// The result versions its libcni can create.
    fn result_versions(self) -> &'static [&'static str] {
        match self {
            // v0.8.1 pkg/version/version.go resultFactories: types/current
            // (0.3.0, 0.3.1, 0.4.0) and types/020 (0.1.0, 0.2.0).
            MultusVersion::V3_9 => &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0"],
            // v1.1.2 pkg/types/create: 020, 040 and types/100, whose
            // ImplementedSpecVersion is 1.0.0 only.
            MultusVersion::V4_0 => &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"],
            // v1.2.0-rc1 on: types/100 also creates 1.1.0.
            MultusVersion::V4_1 | MultusVersion::V4_3 => &[
                "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
            ],
        }
    }

    /// libcni's `create.Create` (or v0.8.1's `version.NewResult`) on the
    /// plugin's stdout.
    fn parse_result(self, conf: &Value, stdout: Value) -> Result<Value, Failed> {
        let v = self.result_version(conf, &stdout);
        if self.result_versions().contains(&v.as_str()) {
            Ok(stdout)
        } else {
            Err(Failed(json!({
                "code": 999,
                "msg": format!("unsupported CNI result version {v:?}"),
                "multus": format!("{self:?}"),
            })))
        }
    }
}

/// A node's Multus: where it keeps its cache and device-info files, and
/// where the plugins are.
pub struct Multus {
    /// Which Multus (what result versions it parses).
    pub version: MultusVersion,
    /// Multus's `binDir` (`/opt/cni/bin`), searched first for the plugin
    /// named by `type`.
    pub bin_dir: PathBuf,
    /// The node's root as this process reaches it (`/`, or
    /// `/proc/<pid>/root` of a process in the node's mount namespace): every
    /// path above is the node's and is read and written under it.
    pub host_root: PathBuf,
    /// A command prefix that runs the plugin in the node's root (Multus
    /// thick chroots to the host; empty when the node is this host).
    pub enter: Vec<String>,
    /// The kubelet's Pod Resources API socket (a node path). With it, the
    /// devices of networks whose NAD names a resource come from the
    /// kubelet, as Multus takes them (`k8sclient.getKubernetesDelegate`,
    /// `kubeletclient.GetPodResourceMap`: `List`, the pod's containers'
    /// devices by resource, sorted as strings from v4.3.0 on
    /// (`SortDeviceIDs`), handed out in the networks' order); without, from
    /// the caller.
    pub pod_resources: Option<PathBuf>,
    /// Multus's `cniDir` (`/var/lib/cni/multus`): delegate cache, and
    /// libcni's result cache.
    pub cni_dir: PathBuf,
    /// The device-info base (`/var/run/k8s.cni.cncf.io/devinfo`): `dp/` is
    /// the device plugins', `cni/` Multus's.
    pub devinfo_base: PathBuf,
    /// `CNI_PATH` (Multus puts its `binDir` first).
    pub cni_path: String,
}

/// What ADD of one network gave.
#[derive(Debug)]
pub struct Added {
    /// The plugin's result.
    pub result: Value,
    /// The network-status annotation entry Multus writes for it.
    pub network_status: Value,
    /// The netconf the plugin got on stdin.
    pub netconf: Value,
    /// `CNI_ARGS`.
    pub cni_args: String,
    /// The CNIDeviceInfoFile path, when Multus generated one.
    pub device_info_file: Option<PathBuf>,
}

/// A failed plugin call: its CNI error JSON.
#[derive(Debug)]
pub struct Failed(pub Value);

struct Delegate {
    name: String,
    ifname: String,
    bytes: Value,
    device_id: Option<String>,
    resource_name: Option<String>,
    selection: Selection,
}

impl Multus {
    fn cni_device_info_path(&self, d: &Delegate, container: &str) -> Option<PathBuf> {
        // delegateRuntimeConfig: only when the delegate has a device ID.
        d.device_id.as_ref()?;
        let file = format!("{}-{}_{}", d.name, container, d.ifname).replace('/', "-");
        Some(self.devinfo_base.join("cni").join(file))
    }

    fn dp_device_info_path(&self, resource: &str, device_id: &str) -> PathBuf {
        self.devinfo_base.join("dp").join(format!(
            "{}-{}-device.json",
            resource.replace('/', "-"),
            device_id.replace('/', "-")
        ))
    }

    fn delegate(
        &self,
        nad: &Nad,
        sel: &Selection,
        device_id: Option<&str>,
        idx: usize,
    ) -> Delegate {
        let mut bytes = nad.config.clone();
        if bytes.get("name").is_none_or(|n| n == "") {
            bytes["name"] = nad.name.clone().into();
        }
        // The kubelet's device for the NAD's resource wins over the
        // selection's deviceID.
        let dp_device = device_id.filter(|_| nad.resource_name.is_some());
        if let Some(id) = dp_device {
            bytes["deviceID"] = id.into();
            bytes["pciBusID"] = id.into();
        }
        if let Some(args) = &sel.cni_args {
            let cni = &mut bytes["args"]["cni"];
            if cni.is_null() {
                *cni = json!({});
            }
            for (k, v) in args.as_object().into_iter().flatten() {
                cni[k] = v.clone();
            }
        }
        Delegate {
            name: format!("{}/{}", nad.namespace, nad.name),
            ifname: sel.interface.clone().unwrap_or(format!("net{}", idx + 1)),
            bytes,
            device_id: dp_device.map(str::to_string).or(sel.device_id.clone()),
            resource_name: dp_device.and(nad.resource_name.clone()),
            selection: sel.clone(),
        }
    }

    /// The capability args of the runtime conf, and the CNIDeviceInfoFile.
    fn capability_args(&self, d: &Delegate, container: &str) -> (Value, Option<PathBuf>) {
        let mut caps = json!({});
        if let Some(ips) = &d.selection.ips {
            caps["ips"] = json!(ips);
        }
        if let Some(mac) = &d.selection.mac {
            caps["mac"] = mac.clone().into();
        }
        if let Some(id) = &d.device_id {
            caps["deviceID"] = id.clone().into();
        }
        let file = self.cni_device_info_path(d, container);
        if let Some(f) = &file {
            caps["CNIDeviceInfoFile"] = f.display().to_string().into();
        }
        (caps, file)
    }

    fn cni_args(pod: &Pod) -> String {
        format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            pod.namespace, pod.name, pod.sandbox, pod.uid
        )
    }

    /// libcni's `buildOneConfig`: name, cniVersion, prevResult and the
    /// declared capabilities' runtime config.
    fn netconf(d: &Delegate, caps: &Value, prev: Option<&Value>) -> Value {
        let mut conf = d.bytes.clone();
        let mut rc = json!({});
        for (cap, on) in conf["capabilities"].as_object().into_iter().flatten() {
            if on == &json!(true) {
                if let Some(v) = caps.get(cap) {
                    rc[cap] = v.clone();
                }
            }
        }
        if !rc.as_object().unwrap().is_empty() {
            conf["runtimeConfig"] = rc;
        }
        if let Some(p) = prev {
            conf["prevResult"] = p.clone();
        }
        conf
    }

    /// A path of the node, as this process reaches it.
    pub fn on_host(&self, p: &Path) -> PathBuf {
        in_root(&self.host_root, p)
    }

    /// libcni `FindInPath(type, [binDir] + CNI_PATH)`.
    fn find_in_path(&self, plugin: &str) -> Result<PathBuf, Failed> {
        let dirs: Vec<PathBuf> = std::iter::once(self.bin_dir.clone())
            .chain(std::env::split_paths(&self.cni_path))
            .collect();
        if plugin.is_empty() || plugin.contains('/') {
            return Err(Failed(
                json!({"msg": format!("invalid plugin name: {plugin}")}),
            ));
        }
        dirs.iter()
            .map(|d| d.join(plugin))
            .find(|p| std::fs::metadata(self.on_host(p)).is_ok_and(|m| m.file_type().is_file()))
            .ok_or_else(|| {
                Failed(json!({"msg": format!("failed to find plugin {plugin:?} in path {dirs:?}")}))
            })
    }

    fn exec(&self, command: &str, pod: &Pod, d: &Delegate, conf: &Value) -> Result<Value, Failed> {
        let bin = self.find_in_path(d.bytes["type"].as_str().unwrap_or_default())?;
        let args = Self::cni_args(pod);
        let (ok, v) = super::exec::run_plugin_in(
            &self.enter,
            &bin,
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", &pod.sandbox),
                ("CNI_NETNS", &pod.netns),
                ("CNI_IFNAME", &d.ifname),
                ("CNI_ARGS", &args),
                ("CNI_PATH", &self.cni_path),
            ],
            conf,
        );
        match (ok, command) {
            (true, "ADD") => self.version.parse_result(conf, v),
            (true, _) => Ok(v),
            (false, _) => Err(Failed(v)),
        }
    }

    fn result_cache(&self, d: &Delegate, pod: &Pod) -> PathBuf {
        let net = d.bytes["name"].as_str().unwrap_or_default();
        self.cni_dir
            .join("results")
            .join(format!("{net}-{}-{}", pod.sandbox, d.ifname))
    }

    fn delegate_cache(&self, pod: &Pod) -> PathBuf {
        self.cni_dir.join(&pod.sandbox)
    }

    /// CmdAdd for the pod's networks: `nets` are (NAD, selection element,
    /// the device the kubelet allocated for the NAD's resource). On a
    /// failure, the networks added before are deleted, as Multus does.
    pub fn add(
        &self,
        pod: &Pod,
        nets: &[(Nad, Selection, Option<String>)],
    ) -> Result<Vec<Added>, Failed> {
        let mut resource_map: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        if let Some(sock) = &self.pod_resources {
            let held = switchyard_cni::podresources::pod_devices(
                &self.on_host(sock),
                &pod.namespace,
                &pod.name,
            )
            .map_err(|e| Failed(json!({"msg": e.msg})))?;
            for (res, id) in held {
                resource_map.entry(res).or_default().push(id);
            }
            if self.version.sorts_device_ids() {
                for ids in resource_map.values_mut() {
                    ids.sort();
                }
            }
        }
        let mut next: std::collections::BTreeMap<String, usize> = Default::default();
        let delegates: Vec<Delegate> = nets
            .iter()
            .enumerate()
            .map(|(i, (nad, sel, dev))| {
                let dev = match &self.pod_resources {
                    None => dev.clone(),
                    Some(_) => {
                        assert!(dev.is_none(), "the kubelet's devices come from its API");
                        nad.resource_name.as_ref().and_then(|r| {
                            let at = next.entry(r.clone()).or_default();
                            let d = resource_map.get(r)?.get(*at).cloned();
                            *at += 1;
                            d
                        })
                    }
                };
                self.delegate(nad, sel, dev.as_deref(), i)
            })
            .collect();
        // saveDelegates: the cache DEL replays.
        std::fs::create_dir_all(self.on_host(&self.cni_dir)).unwrap();
        let cache: Vec<Value> = delegates
            .iter()
            .map(|d| {
                json!({"name": d.name, "ifnameRequest": d.ifname, "bytes": d.bytes,
                       "deviceID": d.device_id, "resourceName": d.resource_name,
                       "macRequest": d.selection.mac, "ipRequest": d.selection.ips})
            })
            .collect();
        std::fs::write(
            self.on_host(&self.delegate_cache(pod)),
            serde_json::to_vec(&cache).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        for (i, d) in delegates.iter().enumerate() {
            let (caps, file) = self.capability_args(d, &pod.sandbox);
            if let (Some(f), Some(res), Some(id)) = (&file, &d.resource_name, &d.device_id) {
                copy_device_info(
                    &self.on_host(&self.dp_device_info_path(res, id)),
                    &self.on_host(f),
                );
            }
            let conf = Self::netconf(d, &caps, None);
            match self.exec("ADD", pod, d, &conf) {
                Ok(result) => {
                    let cache = self.on_host(&self.result_cache(d, pod));
                    std::fs::create_dir_all(cache.parent().unwrap()).unwrap();
                    std::fs::write(
                        &cache,
                        serde_json::to_vec(&json!({"kind": "cniCacheV1", "result": result}))
                            .unwrap(),
                    )
                    .unwrap();
                    // getDelegateDeviceInfo: whatever CNIDeviceInfoFile holds now.
                    let devinfo = file
                        .as_ref()
                        .and_then(|f| std::fs::read(self.on_host(f)).ok())
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
                    out.push(Added {
                        network_status: network_status(&result, &d.name, devinfo),
                        result,
                        netconf: conf,
                        cni_args: Self::cni_args(pod),
                        device_info_file: file,
                    });
                }
                Err(e) => {
                    self.del_delegates(pod, &delegates[..=i]);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// CmdDel: replays the cached delegates in reverse order, each with its
    /// cached result as `prevResult`, then removes the CNI device-info file
    /// and the cache. Errors are collected, not fatal, as in Multus; they
    /// are returned.
    pub fn del(&self, pod: &Pod) -> Vec<Failed> {
        let Ok(bytes) = std::fs::read(self.on_host(&self.delegate_cache(pod))) else {
            return Vec::new(); // Multus logs and succeeds
        };
        let cached: Vec<Value> = serde_json::from_slice(&bytes).unwrap();
        let delegates: Vec<Delegate> = cached
            .iter()
            .map(|c| Delegate {
                name: c["name"].as_str().unwrap().into(),
                ifname: c["ifnameRequest"].as_str().unwrap().into(),
                bytes: c["bytes"].clone(),
                device_id: c["deviceID"].as_str().map(str::to_string),
                resource_name: c["resourceName"].as_str().map(str::to_string),
                selection: Selection {
                    mac: c["macRequest"].as_str().map(str::to_string),
                    ips: serde_json::from_value(c["ipRequest"].clone()).ok(),
                    ..Default::default()
                },
            })
            .collect();
        let errs = self.del_delegates(pod, &delegates);
        let _ = std::fs::remove_file(self.on_host(&self.delegate_cache(pod)));
        errs
    }

    fn del_delegates(&self, pod: &Pod, delegates: &[Delegate]) -> Vec<Failed> {
        let mut errs = Vec::new();
        for d in delegates.iter().rev() {
            let (caps, file) = self.capability_args(d, &pod.sandbox);
            let cache = self.on_host(&self.result_cache(d, pod));
            let prev = std::fs::read(&cache)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .map(|c| c["result"].clone());
            let conf = Self::netconf(d, &caps, prev.as_ref());
            if let Err(e) = self.exec("DEL", pod, d, &conf) {
                errs.push(e);
            } else {
                let _ = std::fs::remove_file(&cache);
            }
            if let Some(f) = file {
                let _ = std::fs::remove_file(self.on_host(&f));
            }
        }
        errs
    }
}

/// `CopyDeviceInfoForCNIFromDP` → `saveDeviceInfo`: the directory made if
/// missing, an existing file is an error, the copy is written 0444. Multus
/// ignores the errors.
fn copy_device_info(dp: &Path, cni: &Path) {
    let Ok(bytes) = std::fs::read(dp) else { return };
    let Ok(info) = serde_json::from_slice::<Value>(&bytes) else {
        return;
    };
    let dir = cni.parent().unwrap();
    if !dir.exists() {
        std::fs::create_dir_all(dir).unwrap();
    }
    if cni.exists() {
        return;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(cni)
        .unwrap();
    f.write_all(&serde_json::to_vec(&info).unwrap()).unwrap();
    std::fs::set_permissions(cni, std::fs::Permissions::from_mode(0o444)).unwrap();
}

/// `CreateNetworkStatus`: the pod's interface (the one with a sandbox), its
/// addresses, DNS and device info.
pub fn network_status(result: &Value, name: &str, devinfo: Option<Value>) -> Value {
    let mut st = json!({"name": name, "dns": {}});
    for i in result["interfaces"].as_array().into_iter().flatten() {
        if i["sandbox"].as_str().is_some_and(|s| !s.is_empty()) {
            st["interface"] = i["name"].clone();
            st["mac"] = i["mac"].clone();
        }
    }
    let ips: Vec<Value> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .map(|a| a.split('/').next().unwrap().into())
        .collect();
    if !ips.is_empty() {
        st["ips"] = ips.into();
    }
    if let Some(d) = result.get("dns").filter(|d| d.is_object()) {
        st["dns"] = d.clone();
    }
    if let Some(d) = devinfo {
        st["device-info"] = d;
    }
    st
}

/// `p` (absolute) resolved inside `root` as a process whose root it is
/// would resolve it: a symlink on the way with an absolute target (Debian's
/// `/var/run -> /run`) starts again from `root`, not from this process's
/// root. The last component is not followed.
pub fn in_root(root: &Path, p: &Path) -> PathBuf {
    use std::path::Component;
    let mut todo: Vec<std::ffi::OsString> = p
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .collect();
    let mut done = PathBuf::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        let at = root.join(&done).join(&c);
        let link = if todo.is_empty() {
            None
        } else {
            std::fs::read_link(&at).ok()
        };
        match link {
            Some(target) => {
                hops += 1;
                assert!(hops < 40, "{}: too many links", p.display());
                if target.is_absolute() {
                    done = PathBuf::new();
                }
                for t in target.components().rev() {
                    match t {
                        Component::Normal(n) => todo.push(n.to_os_string()),
                        Component::ParentDir => todo.push("..".into()),
                        _ => {}
                    }
                }
            }
            None if c == ".." => {
                done.pop();
            }
            None => done.push(c),
        }
    }
    root.join(done)
}
