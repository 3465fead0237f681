//! What Multus does around a delegate plugin, step by step as its source
//! does it (multus-cni `pkg/types/conf.go`, `pkg/multus/multus.go`,
//! `pkg/k8sclient/k8sclient.go`, `pkg/kubeletclient/kubeletclient.go`, the
//! network-attachment-definition-client's `pkg/utils` and
//! `pkg/apis/k8s.cni.cncf.io/v1/types.go`, and containernetworking/cni's
//! libcni), so that the plugin is driven with exactly the bytes and files
//! Multus produces:
//!
//! - the NAD's config, with `name` injected when missing
//!   (`GetCNIConfigFromSpec`);
//! - for a network whose NAD has the `k8s.v1.cni.cncf.io/resourceName`
//!   annotation, the next device of that resource in the pod's resource map
//!   (asked once per ADD, at the first such network, of the kubelet's Pod
//!   Resources API `List`, or of its device-plugin checkpoint when the
//!   socket is missing: `getKubernetesDelegate`, `GetResourceClient`,
//!   `GetPodResourceMap`) injected as top-level `deviceID` and `pciBusID`
//!   (`delegateAddDeviceID`), the network selection's `cni-args` as
//!   `args.cni`;
//! - the runtime conf: `CNI_ARGS` `IgnoreUnknown=true;K8S_POD_NAMESPACE=..;
//!   K8S_POD_NAME=..;K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..`, and the
//!   capability args `mac`, `ips`, `bandwidth`, `deviceID` and, when there is a device,
//!   `CNIDeviceInfoFile` = `<devinfo>/cni/<ns>-<net>-<container>_<ifname>`
//!   (`delegateRuntimeConfig`, `GetCNIDeviceInfoPath`), of which libcni
//!   passes in `runtimeConfig` only those the netconf's `capabilities`
//!   declares (`injectRuntimeConfig`);
//! - before ADD, the device plugin's file copied there through the typed
//!   `DeviceInfo` (`CopyDeviceInfoForCNIFromDP`: only the fields the type
//!   has; refused when the file exists; mode 0444);
//! - the delegates cached per container, and DEL replayed from that cache
//!   with libcni's cached result as `prevResult`, then the CNI device-info
//!   file removed;
//! - the plugin found by the netconf's `type` in Multus's `binDir` and then
//!   its own `CNI_PATH` (`confAdd`: `binDirs = append([]string{BinDir},
//!   CNI_PATH...)`; libcni `pkg/invoke/find.go` `FindInPath`: the first
//!   regular file `<dir>/<type>`, else "failed to find plugin"), and run
//!   with `CNI_PATH` = those directories joined (libcni `CNIConfig.args`);
//! - the plugin's stdout parsed as a Result the way the libcni this Multus
//!   links does ([`MultusVersion`]): a result version that libcni cannot
//!   create fails the ADD;
//! - after ADD, the network-status entry built from the result and the
//!   CNIDeviceInfoFile read into the typed `DeviceInfo`
//!   (`getDelegateDeviceInfo`, `LoadDeviceInfoFromCNI`,
//!   `CreateNetworkStatus`);
//! - a failure reported as the thin `multus` binary prints it to the runtime
//!   ([`Failed`]): Multus's own error, never the delegate's. libcni turns a
//!   failed plugin run into a `*types.Error` whose `Error()` is its `msg`
//!   (`; details` appended when it has details: `pkg/invoke/raw_exec.go`
//!   `pluginErr`, `pkg/types/types.go`); multus.go wraps that text with `%v`
//!   (`CmdAdd`: `cmdPluginErr(k8sArgs, netName, "error adding container to
//!   network %q: %v", netName, err)`; `CmdDel`: `delPlugins` joins the
//!   `DelegateDel` errors with " / "), and skel (`pkg/skel/skel.go`
//!   `checkVersionAndCall`) prints any error that is not a `*types.Error`
//!   as code 999 (`ErrInternal`) with the text as `msg` and no `details`.
//!   The delegate's code is lost; its message and details survive in `msg`.
//!
//! Multus sends STATUS and GC only to the cluster network's delegate, never
//! to these (`pkg/server/api` and `multus.go` `CmdStatus`/`CmdGC`), so the
//! stand-in has neither.
//!
//! Not reproduced (yet): the thick plugin of v4 (`multus-shim` and the
//! daemon) reports failures otherwise than the thin binary modelled here
//! (the daemon wraps CmdAdd's error once more, "error configuring pod
//! [ns/name] networking: ...", in `pkg/server/server.go` `cmdAdd`, and the
//! shim again, "CmdAdd (shim): ...", through `pkg/server/api/api.go` `DoCNI`
//! and `pkg/server/api/shim.go`, worded differently from one v4 release to
//! the next; the shim's `CmdDel` never fails); from v4.1.0 Multus builds
//! network-status with `CreateNetworkStatuses` (one entry per sandbox
//! interface), and it fills `gateway` (from v4.0.0, nad-client v1.4.0) and
//! `mtu` (from v4.1.0, nad-client v1.7.0), which this stand-in leaves out.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
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
    /// `bandwidth`.
    pub bandwidth: Option<Bandwidth>,
}

/// A selection's `bandwidth`, as Multus types it (`pkg/types/types.go`
/// `BandwidthEntry`: four `int`s without `omitempty`, so the capability
/// arg carries all four, 0 where the annotation left one out).
#[derive(Clone, Copy, Debug, Default)]
pub struct Bandwidth {
    /// `ingressRate`.
    pub ingress_rate: i64,
    /// `ingressBurst`.
    pub ingress_burst: i64,
    /// `egressRate`.
    pub egress_rate: i64,
    /// `egressBurst`.
    pub egress_burst: i64,
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
    /// v4.1.x and v4.2.x (libcni v1.2.x; v1.3.0 from v4.2.1).
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
    /// (`kubeletclient.GetPodResourceMap` and `checkpoint.GetPodResourceMap`
    /// call `types.SortDeviceIDs` from v4.3.0 on); before, they go in the
    /// order the kubelet's `List` gives.
    fn sorts_device_ids(self) -> bool {
        self == MultusVersion::V4_3
    }

    /// Whether `kubeletclient.GetPodResourceMap` also reads the containers'
    /// `dynamic_resources` (`getDRAResources`, v4.1.0 on).
    fn reads_dra_resources(self) -> bool {
        matches!(self, MultusVersion::V4_1 | MultusVersion::V4_3)
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
    /// plugin's stdout: `fmt.Errorf("unsupported CNI result version %q",
    /// version)` (v0.8.1 `pkg/version/version.go`, v1.x
    /// `pkg/types/internal/create.go`).
    fn parse_result(self, conf: &Value, stdout: Value) -> Result<Value, GoError> {
        let v = self.result_version(conf, &stdout);
        if self.result_versions().contains(&v.as_str()) {
            Ok(stdout)
        } else {
            Err(GoError::plain(format!(
                "unsupported CNI result version {}",
                go_quote(v.as_bytes())
            )))
        }
    }

    /// The prefix `DelegateDel` puts on a delegate's DEL error: v3.9.x
    /// `pkg/multus/multus.go` `delegateDel` ("delegateDel: error invoking
    /// DelegateDel - %q: %v"), v4.x `DelegateDel` ("DelegateDel: ...").
    fn delegate_del_name(self) -> &'static str {
        match self {
            MultusVersion::V3_9 => "delegateDel",
            _ => "DelegateDel",
        }
    }

    /// Whether `delPlugins` hands the joined DEL errors to `fmt.Errorf` as
    /// its format (`fmt.Errorf(strings.Join(errorstrings, " / "))`, up to
    /// v4.2.2), a `%` in them then read as a verb, or as an argument
    /// (`fmt.Errorf("%s", ...)`, v4.2.3 on). [`MultusVersion::V4_1`] stands
    /// for v4.1.x, whose Multus still does the former.
    fn del_errors_as_format(self) -> bool {
        self != MultusVersion::V4_3
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
    /// The kubelet's Pod Resources API socket (a node path; Multus's is
    /// `/var/lib/kubelet/pod-resources/kubelet.sock`). With it, the devices
    /// of networks whose NAD names a resource come from the kubelet, as
    /// Multus takes them ([`Multus::resource_map`]); without, from the
    /// caller.
    pub pod_resources: Option<PathBuf>,
    /// Multus's `cniDir` (`/var/lib/cni/multus`): delegate cache, and
    /// libcni's result cache.
    pub cni_dir: PathBuf,
    /// The device-info base (`/var/run/k8s.cni.cncf.io/devinfo`): `dp/` is
    /// the device plugins', `cni/` Multus's.
    pub devinfo_base: PathBuf,
    /// The `CNI_PATH` Multus itself runs with (the runtime's, or the thick
    /// daemon's environment). The plugin is looked for in `binDir` and then
    /// these, and gets them all, `binDir` first, as its `CNI_PATH`
    /// ([`Multus::bin_dirs`]).
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

/// A failed Multus call, as the thin `multus` binary prints it to the
/// runtime: skel's `*types.Error` JSON (`{"code": 999, "msg": ...}`; see
/// [`skel_error`]). The delegate's own error is inside `msg`, not here.
#[derive(Debug)]
pub struct Failed(pub Value);

/// A Go `error` as it travels up libcni and Multus: its Go type (named in
/// `fmt`'s complaints, see [`go_sprintf`]) and its `Error()` text.
#[derive(Debug, Clone)]
struct GoError {
    ty: &'static str,
    text: String,
}

impl GoError {
    /// A `fmt.Errorf` without `%w`.
    fn plain(text: String) -> GoError {
        GoError {
            ty: "*errors.errorString",
            text,
        }
    }

    /// Not an error: a Go `string` argument of a format.
    fn string(text: &str) -> GoError {
        GoError {
            ty: "string",
            text: text.into(),
        }
    }
}

/// containernetworking/cni `pkg/skel/skel.go` `checkVersionAndCall` (v0.8.1
/// and v1.1.2: `err.(*types.Error)`; v1.2.0-rc1 and v1.3.0: `errors.As`):
/// an error that is not a `*types.Error` becomes `types.NewError(
/// types.ErrInternal, err.Error(), "")`, printed by `PluginMain` /
/// `PluginMainFuncs` as `{"code": 999, "msg": ...}` (`details` is
/// `omitempty`). The errors of `CmdAdd` and `CmdDel` reproduced here are
/// all `fmt.Errorf` with `%v` (`cmdErr`, `cmdPluginErr`, `delPlugins`), so
/// never a `*types.Error`, whatever error they wrap.
fn skel_error(err: String) -> Failed {
    Failed(json!({"code": 999, "msg": err}))
}

/// multus-cni `pkg/multus/multus.go` `cmdErr` (the same from v3.9 to v4.3):
/// `logging.Errorf("Multus: [ns/name/uid]: " + format, args...)` (the pod's
/// part is in the format string).
fn cmd_err(pod: &Pod, format: &str, args: &[&GoError]) -> Failed {
    let format = format!(
        "Multus: [{}/{}/{}]: {format}",
        pod.namespace, pod.name, pod.uid
    );
    skel_error(go_sprintf(&format, args))
}

/// multus-cni `pkg/multus/multus.go` `CmdAdd` on a delegate's failure (the
/// same from v3.9 to v4.3): `cmdPluginErr(k8sArgs, netName, "error adding
/// container to network %q: %v", netName, err)`, i.e.
/// `logging.Errorf("[ns/name/uid:netName]: " + format, args...)` (the
/// prefix, network name included, is in the format string); `netName` is
/// the delegate's netconf `name`.
fn cmd_plugin_err(pod: &Pod, net: &str, err: &GoError) -> Failed {
    let format = format!(
        "[{}/{}/{}:{net}]: error adding container to network %q: %v",
        pod.namespace, pod.name, pod.uid
    );
    skel_error(go_sprintf(&format, &[&GoError::string(net), err]))
}

/// multus-cni `pkg/types/types.go` `ResourceInfo`: a resource's device IDs
/// and the next one to hand out.
#[derive(Debug, Default)]
struct ResourceInfo {
    index: usize,
    device_ids: Vec<String>,
}

/// The pod's resource map, by resource name.
type ResourceMap = std::collections::BTreeMap<String, ResourceInfo>;

/// The messages of the kubelet's Pod Resources API v1 that Multus reads,
/// written from kubernetes/kubelet `pkg/apis/podresources/v1/api.proto`
/// (package `v1`; protobuf skips the fields left out), independently of
/// the .proto the code under test is built from.
mod podresources_v1 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
        #[prost(message, repeated, tag = "5")]
        pub dynamic_resources: Vec<DynamicResource>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DynamicResource {
        #[prost(string, tag = "2")]
        pub claim_name: String,
        #[prost(string, tag = "3")]
        pub claim_namespace: String,
        #[prost(message, repeated, tag = "4")]
        pub claim_resources: Vec<ClaimResource>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ClaimResource {
        #[prost(message, repeated, tag = "1")]
        pub cdi_devices: Vec<CdiDevice>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CdiDevice {
        #[prost(string, tag = "1")]
        pub name: String,
    }
}

/// multus-cni `pkg/kubeletclient/kubeletclient.go`
/// `getKubeletResourceClient` and `getPodResources`: a gRPC connection to
/// the Unix socket (10 s), `/v1.PodResourcesLister/List` (10 s), answers up
/// to `defaultPodResourcesMaxSize` (16 MiB).
fn list_pod_resources(socket: &Path) -> Result<podresources_v1::ListPodResourcesResponse, String> {
    use hyper_util::rt::TokioIo;
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic::transport::{Endpoint, Uri};

    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let path = socket.to_path_buf();
    rt.block_on(async move {
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(TIMEOUT)
            .timeout(TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .map_err(|e| format!("error dialing socket: {e}"))?;
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(16 << 20);
        grpc.ready().await.map_err(|e| e.to_string())?;
        grpc.unary(
            tonic::Request::new(podresources_v1::ListPodResourcesRequest {}),
            PathAndQuery::from_static("/v1.PodResourcesLister/List"),
            tonic_prost::ProstCodec::<
                podresources_v1::ListPodResourcesRequest,
                podresources_v1::ListPodResourcesResponse,
            >::default(),
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(|e| format!("rpc error: code = {:?} desc = {}", e.code(), e.message()))
    })
}

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

    /// The capability args of the runtime conf (`pkg/types/conf.go`
    /// `newCNIRuntimeConf`), and the CNIDeviceInfoFile.
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
        // `newCNIRuntimeConf`: `capabilityArgs["bandwidth"]` from the
        // delegate's `BandwidthRequest`, which the delegate cache does not
        // keep (`json:"-"`): a DEL from the cache has none.
        if let Some(b) = &d.selection.bandwidth {
            caps["bandwidth"] = json!({"ingressRate": b.ingress_rate, "ingressBurst": b.ingress_burst,
                                       "egressRate": b.egress_rate, "egressBurst": b.egress_burst});
        }
        let file = self.cni_device_info_path(d, container);
        if let Some(f) = &file {
            caps["CNIDeviceInfoFile"] = f.display().to_string().into();
        }
        (caps, file)
    }

    /// The `CNI_ARGS` of an ADD: [`Multus::cni_args`], and (multus-cni
    /// `pkg/multus/multus.go` `DelegateAdd`, "Deprecated in ver 3.5" yet
    /// still there) `MAC=<mac>` when the selection asks for one and
    /// `IP=<ips joined by ",">` when it asks for addresses, whatever the
    /// NAD's capabilities say (host-local and static read `IP`); a MAC or
    /// address that does not parse fails the ADD as `DelegateAdd` words it.
    fn add_args(pod: &Pod, sel: &Selection) -> Result<String, GoError> {
        let mut args = Self::cni_args(pod);
        if let Some(mac) = &sel.mac {
            if mac.parse::<switchyard_api::MacAddr>().is_err() {
                return Err(GoError::plain(format!(
                    "DelegateAdd: failed to parse mac address {mac:?}"
                )));
            }
            args.push_str(&format!(";MAC={mac}"));
        }
        if let Some(ips) = &sel.ips {
            for ip in ips {
                let ok = match ip.split_once('/') {
                    Some((a, len)) => a.parse::<std::net::IpAddr>().is_ok_and(|a| {
                        len.parse::<u8>()
                            .is_ok_and(|l| l <= if a.is_ipv4() { 32 } else { 128 })
                    }),
                    None => ip.parse::<std::net::IpAddr>().is_ok(),
                };
                if !ok {
                    return Err(GoError::plain(format!(
                        "DelegateAdd: failed to parse IP address {ip:?}"
                    )));
                }
            }
            args.push_str(&format!(";IP={}", ips.join(",")));
        }
        Ok(args)
    }

    /// The `CNI_ARGS` Multus runs every delegate with (`types.CreateCNIRuntimeConf`).
    pub fn cni_args(pod: &Pod) -> String {
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

    /// The netconf and `CNI_IFNAME` Multus runs the plugin with on ADD of
    /// network `nad` (selection `sel`, the kubelet's device `device` for
    /// the NAD's resource), the `idx`th of the pod's networks: what
    /// [`Multus::add`] passes, for a test to run the plugin itself with
    /// the same input (with [`Multus::cni_args`]).
    pub fn add_input(
        &self,
        pod: &Pod,
        nad: &Nad,
        sel: &Selection,
        device: Option<&str>,
        idx: usize,
    ) -> (Value, String) {
        let d = self.delegate(nad, sel, device, idx);
        let (caps, _) = self.capability_args(&d, &pod.sandbox);
        (Self::netconf(&d, &caps, None), d.ifname)
    }

    /// A path of the node, as this process reaches it.
    pub fn on_host(&self, p: &Path) -> PathBuf {
        in_root(&self.host_root, p)
    }

    /// The directories of the `CNIConfig` Multus makes for every delegate
    /// call: multus-cni `pkg/multus/multus.go` `confAdd` (and `confDel`,
    /// `conflistAdd`, ...): `binDirs := filepath.SplitList(os.Getenv("CNI_PATH"));
    /// binDirs = append([]string{multusNetconf.BinDir}, binDirs...);
    /// libcni.NewCNIConfigWithCacheDir(binDirs, ...)`. Go's `SplitList`
    /// gives nothing for an empty string and keeps empty elements
    /// otherwise.
    fn bin_dirs(&self) -> Vec<String> {
        let mut dirs = vec![self.bin_dir.display().to_string()];
        if !self.cni_path.is_empty() {
            dirs.extend(self.cni_path.split(':').map(str::to_string));
        }
        dirs
    }

    /// containernetworking/cni `pkg/invoke/find.go` `FindInPath(type,
    /// binDirs)` (the same in v0.8.1 and v1.x): the first `<dir>/<type>`
    /// that `os.Stat` finds a regular file (`filepath.Join("", t)` is `t`,
    /// relative to the working directory, taken here as the node's `/`).
    fn find_in_path(&self, plugin: &str) -> Result<PathBuf, GoError> {
        let dirs = self.bin_dirs();
        if plugin.is_empty() {
            return Err(GoError::plain("no plugin name provided".into()));
        }
        if plugin.contains('/') {
            return Err(GoError::plain(format!("invalid plugin name: {plugin}")));
        }
        dirs.iter()
            .map(|d| Path::new("/").join(d).join(plugin))
            .find(|p| std::fs::metadata(self.on_host(p)).is_ok_and(|m| m.file_type().is_file()))
            .ok_or_else(|| {
                // Go's %s of a []string: "[a b]".
                GoError::plain(format!(
                    "failed to find plugin {} in path [{}]",
                    go_quote(plugin.as_bytes()),
                    dirs.join(" ")
                ))
            })
    }

    /// libcni's `AddNetwork` / `DelNetwork` for one delegate: the plugin
    /// found, then run as `pkg/invoke/raw_exec.go` `RawExec.ExecPlugin`
    /// runs it (exactly this environment, the netconf on stdin, stdout and
    /// stderr kept apart; a non-zero exit is [`plugin_err`]), and on ADD
    /// its stdout parsed as a Result. The error is libcni's, as Multus
    /// receives it.
    fn exec(&self, command: &str, pod: &Pod, d: &Delegate, conf: &Value) -> Result<Value, GoError> {
        let bin = self.find_in_path(d.bytes["type"].as_str().unwrap_or_default())?;
        let args = if command == "ADD" {
            Self::add_args(pod, &d.selection)?
        } else {
            Self::cni_args(pod)
        };
        // containernetworking/cni `libcni/api.go` `CNIConfig.args`: `Path:
        // strings.Join(c.Path, string(os.PathListSeparator))`, which
        // `pkg/invoke/args.go` `AsEnv` passes as `CNI_PATH`: binDir first.
        let cni_path = self.bin_dirs().join(":");
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", pod.sandbox.as_str()),
            ("CNI_NETNS", pod.netns.as_str()),
            ("CNI_IFNAME", d.ifname.as_str()),
            ("CNI_ARGS", args.as_str()),
            ("CNI_PATH", cni_path.as_str()),
        ];
        let out = super::exec::plugin_output(&self.enter, &bin, &env, conf);
        if !out.status.success() {
            return Err(plugin_err(&out.status, &out.stdout, &out.stderr));
        }
        let v = if out.stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
        };
        match command {
            "ADD" => self.version.parse_result(conf, v),
            _ => Ok(v),
        }
    }

    /// multus-cni `pkg/k8sclient/k8sclient.go` `getKubernetesDelegate`
    /// (the same from v3.9 to v4.3): for a NAD with the
    /// `k8s.v1.cni.cncf.io/resourceName` annotation (and a pod with a name
    /// and namespace), the resource map is fetched if this ADD has none yet
    /// (`kubeletclient.GetResourceClient("")` then `GetPodResourceMap`), and
    /// the network takes `DeviceIDs[Index]` of its resource, `Index` then
    /// moving on; a resource missing from the map, or with no device left,
    /// gives no device ID.
    fn kubernetes_delegate_device(
        &self,
        socket: &Path,
        pod: &Pod,
        nad: &Nad,
        resource_map: &mut Option<ResourceMap>,
    ) -> Result<Option<String>, String> {
        let Some(resource) = &nad.resource_name else {
            return Ok(None);
        };
        if pod.name.is_empty() || pod.namespace.is_empty() {
            return Ok(None);
        }
        if resource_map.is_none() {
            let map = self
                .resource_map(socket, pod)
                .map_err(|e| format!("failed to get a ResourceClient instance: {e}"))?;
            *resource_map = Some(map);
        }
        let Some(entry) = resource_map.as_mut().unwrap().get_mut(resource) else {
            return Ok(None);
        };
        if entry.device_ids.len() > entry.index {
            let id = entry.device_ids[entry.index].clone();
            entry.index += 1;
            return Ok(Some(id));
        }
        Ok(None)
    }

    /// multus-cni `pkg/kubeletclient/kubeletclient.go` `GetResourceClient`
    /// and `GetPodResourceMap`: when the kubelet's socket is there
    /// (`hasKubeletAPIEndpoint`: `os.Stat`), one `List` of the Pod Resources
    /// API (`getPodResources`; 10 s to dial and to answer, up to 16 MiB
    /// received: `defaultPodResourcesMaxSize`), and of the pods with the
    /// pod's name and namespace, every container's devices by resource name
    /// in the order `List` gives them (`getDevicePluginResources`), then,
    /// from v4.1.0, its DRA claims by claim name (`getDRAResources`: the
    /// part after `=` of each CDI device name); from v4.3.0 each resource's
    /// IDs sorted as strings (`types.SortDeviceIDs`). Without the socket, the
    /// kubelet's device-plugin checkpoint (`pkg/checkpoint/checkpoint.go`).
    fn resource_map(&self, socket: &Path, pod: &Pod) -> Result<ResourceMap, String> {
        let socket = self.on_host(socket);
        if std::fs::metadata(&socket).is_err() {
            return self.checkpoint_resource_map(&socket, pod);
        }
        let list = list_pod_resources(&socket).map_err(|e| {
            format!(
                "getKubeletClient: error getting pod resources from client: \
                 getPodResources: failed to list pod resources, {}.Get(_) = _, {e}",
                socket.display()
            )
        })?;
        let mut map = ResourceMap::new();
        let mut add = |name: &str, ids: Vec<String>| {
            map.entry(name.to_string())
                .or_default()
                .device_ids
                .extend(ids)
        };
        for pr in list
            .pod_resources
            .iter()
            .filter(|p| p.name == pod.name && p.namespace == pod.namespace)
        {
            for cnt in &pr.containers {
                for dev in &cnt.devices {
                    add(&dev.resource_name, dev.device_ids.clone());
                }
                if self.version.reads_dra_resources() {
                    for dr in &cnt.dynamic_resources {
                        // Names without exactly one '=' are logged
                        // ("Invalid CDI format") and skipped.
                        let ids = dr
                            .claim_resources
                            .iter()
                            .flat_map(|c| &c.cdi_devices)
                            .filter_map(|d| match d.name.split('=').collect::<Vec<_>>()[..] {
                                [_, id] => Some(id.to_string()),
                                _ => None,
                            })
                            .collect();
                        add(&dr.claim_name, ids);
                    }
                }
            }
        }
        if self.version.sorts_device_ids() {
            for r in map.values_mut() {
                r.device_ids.sort();
            }
        }
        Ok(map)
    }

    /// multus-cni `pkg/checkpoint/checkpoint.go`: the kubelet's device
    /// manager checkpoint (`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`;
    /// here beside the kubelet's `pod-resources` directory, which is that
    /// path for the default socket), its `Data.PodDeviceEntries` of the
    /// pod's UID, each entry's `DeviceIDs` (by NUMA node) appended to its
    /// `ResourceName`. Go visits that map in no fixed order; here, the
    /// NUMA nodes in their order as strings.
    fn checkpoint_resource_map(&self, socket: &Path, pod: &Pod) -> Result<ResourceMap, String> {
        let file = socket
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"))
            .join("device-plugins/kubelet_internal_checkpoint");
        let bytes = std::fs::read(&file).map_err(|e| {
            format!(
                "getPodEntries: error reading file {}\n{e}\n",
                "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
            )
        })?;
        let cp: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("getPodEntries: error unmarshalling raw bytes {e}"))?;
        if pod.uid.is_empty() {
            return Err("GetPodResourceMap: invalid Pod cannot be empty".into());
        }
        let mut map = ResourceMap::new();
        for e in cp["Data"]["PodDeviceEntries"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if e["PodUID"].as_str() != Some(pod.uid.as_str()) {
                continue;
            }
            let entry = map
                .entry(e["ResourceName"].as_str().unwrap_or_default().to_string())
                .or_default();
            let by_numa = e["DeviceIDs"].as_object().ok_or_else(|| {
                "getPodEntries: error unmarshalling raw bytes: DeviceIDs is not a map".to_string()
            })?;
            for ids in by_numa.values() {
                entry.device_ids.extend(
                    ids.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|i| i.as_str().map(str::to_string)),
                );
            }
        }
        if self.version.sorts_device_ids() {
            for r in map.values_mut() {
                r.device_ids.sort();
            }
        }
        Ok(map)
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
        // multus-cni `pkg/multus/multus.go` `CmdAdd`: "resourceMap holds Pod
        // device allocation information; only initizized if CRD contains
        // 'resourceName' annotation. This will only be initialized once and
        // all delegate objects can reference this to look up device info."
        let mut resource_map: Option<ResourceMap> = None;
        let mut delegates = Vec::new();
        // `pkg/k8sclient/k8sclient.go` `GetNetworkDelegates`: the networks
        // in the annotation's order, each through `getKubernetesDelegate`.
        for (i, (nad, sel, dev)) in nets.iter().enumerate() {
            let dev = match &self.pod_resources {
                None => dev.clone(),
                Some(sock) => {
                    assert!(dev.is_none(), "the kubelet's devices come from its API");
                    self.kubernetes_delegate_device(sock, pod, nad, &mut resource_map)
                        .map_err(|e| {
                            // `cmdErr(k8sArgs, "error loading k8s delegates
                            // k8s args: %v", err)` of the errors
                            // `TryLoadPodDelegates` wraps.
                            let e = GoError::plain(format!(
                                "TryLoadPodDelegates: error in getting k8s network for pod: \
                                 GetNetworkDelegates: failed getting the delegate: \
                                 getKubernetesDelegate: {e}"
                            ));
                            cmd_err(pod, "error loading k8s delegates k8s args: %v", &[&e])
                        })?
                }
            };
            delegates.push(self.delegate(nad, sel, dev.as_deref(), i));
        }
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
                    // multus.go `getDelegateDeviceInfo` →
                    // `nadutils.LoadDeviceInfoFromCNI`: whatever
                    // CNIDeviceInfoFile holds now, read into the typed
                    // `DeviceInfo`; an error is logged and leaves none.
                    let devinfo = file
                        .as_ref()
                        .and_then(|f| load_device_info(&self.on_host(f)).ok());
                    out.push(Added {
                        network_status: network_status(&result, &d.name, devinfo),
                        result,
                        netconf: conf,
                        cni_args: Self::add_args(pod, &d.selection)
                            .expect("the arguments the ADD ran with"),
                        device_info_file: file,
                    });
                }
                Err(e) => {
                    // "If the add failed, tear down all networks we already
                    // added. Ignore errors; DEL must be idempotent anyway"
                    self.del_delegates(pod, &delegates[..=i]);
                    let net = d.bytes["name"].as_str().unwrap_or_default();
                    return Err(cmd_plugin_err(pod, net, &e));
                }
            }
        }
        Ok(out)
    }

    /// CmdDel: replays the cached delegates in reverse order, each with its
    /// cached result as `prevResult`, then removes the CNI device-info file
    /// and the cache. A delegate's failure does not stop the others, as in
    /// Multus (`delPlugins`); what Multus then returns is one error, all of
    /// theirs joined (see [`Multus::del_delegates`]): empty on success, else
    /// that error as the runtime gets it.
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
        let err = self.del_delegates(pod, &delegates);
        let _ = std::fs::remove_file(self.on_host(&self.delegate_cache(pod)));
        err.into_iter().collect()
    }

    /// multus-cni `pkg/multus/multus.go` `delPlugins`: DEL of each delegate,
    /// last first, each failure kept as `DelegateDel` words it (`confDel`:
    /// "error in getting result from DelNetwork: %v"; then "DelegateDel:
    /// error invoking DelegateDel - %q: %v" of the netconf's `type`, v3.9.x
    /// "delegateDel: ...": [`MultusVersion::delegate_del_name`]), and the
    /// CNI device-info file removed; the failures joined with " / " into
    /// one `fmt.Errorf` ([`MultusVersion::del_errors_as_format`]), which
    /// `CmdDel` returns as it is, and skel prints as code 999.
    fn del_delegates(&self, pod: &Pod, delegates: &[Delegate]) -> Option<Failed> {
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
                let e = GoError::plain(go_sprintf(
                    "error in getting result from DelNetwork: %v",
                    &[&e],
                ));
                let format = format!(
                    "{}: error invoking DelegateDel - %q: %v",
                    self.version.delegate_del_name()
                );
                let ty = GoError::string(d.bytes["type"].as_str().unwrap_or_default());
                errs.push(go_sprintf(&format, &[&ty, &e]));
            } else {
                let _ = std::fs::remove_file(&cache);
            }
            if let Some(f) = file {
                let _ = std::fs::remove_file(self.on_host(&f));
            }
        }
        if errs.is_empty() {
            return None;
        }
        let joined = errs.join(" / ");
        Some(skel_error(if self.version.del_errors_as_format() {
            go_sprintf(&joined, &[])
        } else {
            joined
        }))
    }
}

/// network-attachment-definition-client `pkg/apis/k8s.cni.cncf.io/v1/types.go`
/// `DeviceInfo` (the same in every release the modelled Multus versions
/// link: ad3f3381681f for v3.9.3, v1.4.0, v1.7.1, v1.7.6): what Multus keeps
/// of a device-info file. Every field is `omitempty`; a field the types do
/// not have (a memif `id`, a `socketGroup`, ...) is dropped on the way.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct DeviceInfo {
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pci: Option<PciDevice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vdpa: Option<VdpaDevice>,
    #[serde(rename = "vhost-user", skip_serializing_if = "Option::is_none")]
    vhost_user: Option<VhostDevice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memif: Option<MemifDevice>,
}

/// `PciDevice`.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct PciDevice {
    #[serde(rename = "pci-address", skip_serializing_if = "String::is_empty")]
    pci_address: String,
    #[serde(rename = "vhost-net", skip_serializing_if = "String::is_empty")]
    vhostnet: String,
    #[serde(rename = "rdma-device", skip_serializing_if = "String::is_empty")]
    rdma_device: String,
    #[serde(rename = "pf-pci-address", skip_serializing_if = "String::is_empty")]
    pf_pci_address: String,
    #[serde(
        rename = "representor-device",
        skip_serializing_if = "String::is_empty"
    )]
    representor_device: String,
}

/// `VdpaDevice`.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct VdpaDevice {
    #[serde(rename = "parent-device", skip_serializing_if = "String::is_empty")]
    parent_device: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    driver: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    path: String,
    #[serde(rename = "pci-address", skip_serializing_if = "String::is_empty")]
    pci_address: String,
    #[serde(rename = "pf-pci-address", skip_serializing_if = "String::is_empty")]
    pf_pci_address: String,
    #[serde(
        rename = "representor-device",
        skip_serializing_if = "String::is_empty"
    )]
    representor_device: String,
}

/// `VhostDevice`.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct VhostDevice {
    #[serde(skip_serializing_if = "String::is_empty")]
    mode: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    path: String,
}

/// `MemifDevice`.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct MemifDevice {
    #[serde(skip_serializing_if = "String::is_empty")]
    role: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    path: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    mode: String,
}

/// JSON as Go's `encoding/json` walks it into a struct: objects keep their
/// keys in order, repeats included (each is assigned in turn, the last
/// winning); arrays, numbers and booleans only need to be told apart.
enum GoJson {
    Null,
    Str(String),
    Obj(Vec<(String, GoJson)>),
    Other(&'static str),
}

impl<'de> serde::Deserialize<'de> for GoJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = GoJson;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<GoJson, E> {
                Ok(GoJson::Null)
            }
            fn visit_none<E>(self) -> Result<GoJson, E> {
                Ok(GoJson::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<GoJson, E> {
                Ok(GoJson::Other("bool"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<GoJson, E> {
                Ok(GoJson::Other("number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<GoJson, E> {
                Ok(GoJson::Other("number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<GoJson, E> {
                Ok(GoJson::Other("number"))
            }
            fn visit_str<E>(self, v: &str) -> Result<GoJson, E> {
                Ok(GoJson::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<GoJson, E> {
                Ok(GoJson::Str(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<GoJson, A::Error> {
                while a.next_element::<GoJson>()?.is_some() {}
                Ok(GoJson::Other("array"))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<GoJson, A::Error> {
                let mut out = Vec::new();
                while let Some(kv) = a.next_entry::<String, GoJson>()? {
                    out.push(kv);
                }
                Ok(GoJson::Obj(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A Go struct's fields as `encoding/json` decodes into them.
trait GoStruct: Default {
    /// The fields' JSON names, in declaration order.
    const FIELDS: &'static [&'static str];
    /// Decodes `v` into field `i`.
    fn set(&mut self, i: usize, v: &GoJson) -> Result<(), String>;
}

/// A `string` field: a JSON string sets it, `null` leaves it, anything
/// else is an `UnmarshalTypeError`.
fn go_string(dst: &mut String, v: &GoJson) -> Result<(), String> {
    match v {
        GoJson::Str(s) => *dst = s.clone(),
        GoJson::Null => {}
        GoJson::Obj(_) => return Err("cannot unmarshal object into Go value of type string".into()),
        GoJson::Other(k) => {
            return Err(format!("cannot unmarshal {k} into Go value of type string"))
        }
    }
    Ok(())
}

/// A `*T` field: `null` makes it nil, an object is decoded into the value
/// it points to (allocated when nil), anything else is an error.
fn go_ptr<T: GoStruct>(dst: &mut Option<T>, v: &GoJson) -> Result<(), String> {
    match v {
        GoJson::Null => *dst = None,
        GoJson::Obj(o) => go_struct(dst.get_or_insert_with(T::default), o)?,
        GoJson::Str(_) => return Err("cannot unmarshal string into Go struct".into()),
        GoJson::Other(k) => return Err(format!("cannot unmarshal {k} into Go struct")),
    }
    Ok(())
}

/// `encoding/json` `(*decodeState).object` into a struct: each key, in
/// order, to the field of that name (the exact name preferred, else one
/// equal under case folding), unknown keys skipped. Go keeps decoding past
/// a type error but `Unmarshal` still returns it, and
/// `loadDeviceInfo` then returns no `DeviceInfo`: the first error is the
/// result either way.
fn go_struct<T: GoStruct>(dst: &mut T, obj: &[(String, GoJson)]) -> Result<(), String> {
    for (k, v) in obj {
        let i = T::FIELDS.iter().position(|f| f == k).or_else(|| {
            T::FIELDS
                .iter()
                .position(|f| f.to_lowercase() == k.to_lowercase())
        });
        if let Some(i) = i {
            dst.set(i, v)?;
        }
    }
    Ok(())
}

impl GoStruct for DeviceInfo {
    const FIELDS: &'static [&'static str] =
        &["type", "version", "pci", "vdpa", "vhost-user", "memif"];
    fn set(&mut self, i: usize, v: &GoJson) -> Result<(), String> {
        match i {
            0 => go_string(&mut self.kind, v),
            1 => go_string(&mut self.version, v),
            2 => go_ptr(&mut self.pci, v),
            3 => go_ptr(&mut self.vdpa, v),
            4 => go_ptr(&mut self.vhost_user, v),
            _ => go_ptr(&mut self.memif, v),
        }
    }
}

impl GoStruct for PciDevice {
    const FIELDS: &'static [&'static str] = &[
        "pci-address",
        "vhost-net",
        "rdma-device",
        "pf-pci-address",
        "representor-device",
    ];
    fn set(&mut self, i: usize, v: &GoJson) -> Result<(), String> {
        let f = [
            &mut self.pci_address,
            &mut self.vhostnet,
            &mut self.rdma_device,
            &mut self.pf_pci_address,
            &mut self.representor_device,
        ];
        go_string(f.into_iter().nth(i).unwrap(), v)
    }
}

impl GoStruct for VdpaDevice {
    const FIELDS: &'static [&'static str] = &[
        "parent-device",
        "driver",
        "path",
        "pci-address",
        "pf-pci-address",
        "representor-device",
    ];
    fn set(&mut self, i: usize, v: &GoJson) -> Result<(), String> {
        let f = [
            &mut self.parent_device,
            &mut self.driver,
            &mut self.path,
            &mut self.pci_address,
            &mut self.pf_pci_address,
            &mut self.representor_device,
        ];
        go_string(f.into_iter().nth(i).unwrap(), v)
    }
}

impl GoStruct for VhostDevice {
    const FIELDS: &'static [&'static str] = &["mode", "path"];
    fn set(&mut self, i: usize, v: &GoJson) -> Result<(), String> {
        go_string(
            [&mut self.mode, &mut self.path].into_iter().nth(i).unwrap(),
            v,
        )
    }
}

impl GoStruct for MemifDevice {
    const FIELDS: &'static [&'static str] = &["role", "path", "mode"];
    fn set(&mut self, i: usize, v: &GoJson) -> Result<(), String> {
        let f = [&mut self.role, &mut self.path, &mut self.mode];
        go_string(f.into_iter().nth(i).unwrap(), v)
    }
}

/// network-attachment-definition-client `pkg/utils/cniconfig.go`
/// `loadDeviceInfo`: `json.Unmarshal` of the file into a `DeviceInfo`. The
/// whole text must be valid JSON (Go reads invalid UTF-8 inside strings as
/// U+FFFD); a top-level `null` is an empty `DeviceInfo`, anything but an
/// object an error.
fn load_device_info(path: &Path) -> Result<DeviceInfo, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&bytes);
    let v: GoJson = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let mut info = DeviceInfo::default();
    match &v {
        GoJson::Null => {}
        GoJson::Obj(o) => go_struct(&mut info, o)?,
        _ => return Err("json: cannot unmarshal into Go value of type v1.DeviceInfo".into()),
    }
    Ok(info)
}

/// Go's `json.Marshal`: serde_json's compact form, and `<`, `>`, `&`,
/// U+2028 and U+2029 escaped (`encodeState.string` with `escapeHTML`);
/// they can only occur inside strings.
fn go_marshal<T: serde::Serialize>(v: &T) -> Vec<u8> {
    let mut out = String::new();
    for c in serde_json::to_string(v).unwrap().chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// Go's `strconv.Quote` (what `%q` prints for a string or `[]byte`):
/// double quotes; `"` and `\` escaped; `\a \b \f \n \r \t \v`; other
/// control bytes and each byte of invalid UTF-8 as `\xhh`; printable
/// characters as they are, other characters as `\uhhhh` or `\Uhhhhhhhh`
/// (Go's `unicode.IsPrint`, taken here as: not a control character and no
/// space but U+0020).
fn go_quote(b: &[u8]) -> String {
    let mut out = String::from("\"");
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{b}' => out.push_str("\\v"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    out.push_str(&format!("\\x{:02x}", c as u32))
                }
                c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                    if (c as u32) < 0x10000 {
                        out.push_str(&format!("\\u{:04x}", c as u32))
                    } else {
                        out.push_str(&format!("\\U{:08x}", c as u32))
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// Go's `fmt.Sprintf(format, args...)` (and so `fmt.Errorf` and multus-cni
/// `pkg/logging` `Errorf`) for the formats and arguments Multus's errors
/// have: strings and errors under `%v`, `%s` and `%q` (width and `-` pad,
/// a precision cuts the text; other flags are read and ignored), `%%`, and
/// `fmt`'s complaints: `%!v(MISSING)` for a verb without an argument,
/// `%!(NOVERB)` for a `%` at the end, `%!(EXTRA type=value, ...)` for
/// arguments left over, `%!d(type=value)` for another verb (where Go would
/// print some of those, `%x` for one, in its own way).
fn go_sprintf(format: &str, args: &[&GoError]) -> String {
    let mut out = String::new();
    let mut next = 0;
    let mut it = format.chars().peekable();
    fn digits(it: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<usize> {
        let mut n: Option<usize> = None;
        while let Some(d) = it.peek().and_then(|c| c.to_digit(10)) {
            n = Some(n.unwrap_or(0) * 10 + d as usize);
            it.next();
        }
        n
    }
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut left = false;
        while let Some(&f) = it.peek() {
            match f {
                '-' => left = true,
                '+' | '#' | ' ' | '0' => {}
                _ => break,
            }
            it.next();
        }
        let width = digits(&mut it);
        let prec = if it.peek() == Some(&'.') {
            it.next();
            Some(digits(&mut it).unwrap_or(0))
        } else {
            None
        };
        let Some(verb) = it.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(next) else {
            out.push_str(&format!("%!{verb}(MISSING)"));
            continue;
        };
        next += 1;
        let text: String = match prec {
            Some(p) => arg.text.chars().take(p).collect(),
            None => arg.text.clone(),
        };
        let text = match verb {
            'v' | 's' => text,
            'q' => go_quote(text.as_bytes()),
            _ => {
                out.push_str(&format!("%!{verb}({}={})", arg.ty, arg.text));
                continue;
            }
        };
        let pad = " ".repeat(width.unwrap_or(0).saturating_sub(text.chars().count()));
        if left {
            out.push_str(&text);
            out.push_str(&pad);
        } else {
            out.push_str(&pad);
            out.push_str(&text);
        }
    }
    if next < args.len() {
        let extra: Vec<String> = args[next..]
            .iter()
            .map(|a| format!("{}={}", a.ty, a.text))
            .collect();
        out.push_str(&format!("%!(EXTRA {})", extra.join(", ")));
    }
    out
}

/// What Go's `exec.ExitError` says of a plugin that failed
/// (`os.ProcessState.String`): "exit status N", or "signal: NAME" (Go's
/// names for the usual signals, "signal N" for others) with " (core
/// dumped)".
fn go_exit_error(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    let sig = status.signal().unwrap_or(0);
    let name = match sig {
        1 => "hangup".to_string(),
        2 => "interrupt".to_string(),
        3 => "quit".to_string(),
        4 => "illegal instruction".to_string(),
        6 => "aborted".to_string(),
        7 => "bus error".to_string(),
        8 => "floating point exception".to_string(),
        9 => "killed".to_string(),
        11 => "segmentation fault".to_string(),
        13 => "broken pipe".to_string(),
        15 => "terminated".to_string(),
        n => format!("signal {n}"),
    };
    let core = if status.core_dumped() {
        " (core dumped)"
    } else {
        ""
    };
    format!("signal: {name}{core}")
}

/// containernetworking/cni `pkg/types/types.go` `Error` (`Code uint`, `Msg
/// string`, `Details string`), as `json.Unmarshal` fills it from a failed
/// plugin's stdout: each key in order to the field of that name (exactly,
/// else under case folding), the others skipped; a value of the wrong type
/// leaves its field and is the first error `Unmarshal` returns, the other
/// fields being filled all the same. The error texts are Go's for a type
/// mismatch; for stdout that is not JSON at all they are serde's, not Go's
/// (`invalid character ...`).
fn unmarshal_types_error(stdout: &[u8]) -> (String, String, Option<String>) {
    let (mut msg, mut details, mut first) = (String::new(), String::new(), None);
    let text = String::from_utf8_lossy(stdout);
    let (tree, values) = match (
        serde_json::from_str::<GoJson>(&text),
        serde_json::from_str::<Value>(&text),
    ) {
        (Ok(t), Ok(v)) => (t, v),
        (Err(e), _) | (_, Err(e)) => return (msg, details, Some(e.to_string())),
    };
    let kind = |v: &GoJson| match v {
        GoJson::Null => "null",
        GoJson::Str(_) => "string",
        GoJson::Obj(_) => "object",
        GoJson::Other(k) => *k,
    };
    let obj = match &tree {
        GoJson::Null => return (msg, details, None),
        GoJson::Obj(o) => o,
        other => {
            let e = format!(
                "json: cannot unmarshal {} into Go value of type types.Error",
                kind(other)
            );
            return (msg, details, Some(e));
        }
    };
    const FIELDS: [&str; 3] = ["code", "msg", "details"];
    for (k, v) in obj {
        let Some(field) = FIELDS
            .iter()
            .find(|f| **f == k.as_str())
            .or_else(|| FIELDS.iter().find(|f| f.eq_ignore_ascii_case(k)))
        else {
            continue;
        };
        let mismatch = |what: String| {
            format!(
                "json: cannot unmarshal {what} into Go struct field Error.{field} of type {}",
                if *field == "code" { "uint" } else { "string" }
            )
        };
        let err = match (*field, v) {
            (_, GoJson::Null) => None,
            ("code", GoJson::Other("number")) => {
                // The value as serde read it (the last of repeated keys).
                let n = &values[k.as_str()];
                (!n.is_u64()).then(|| mismatch(format!("number {n}")))
            }
            ("msg", GoJson::Str(s)) => {
                msg = s.clone();
                None
            }
            ("details", GoJson::Str(s)) => {
                details = s.clone();
                None
            }
            (_, v) => Some(mismatch(kind(v).to_string())),
        };
        if first.is_none() {
            first = err;
        }
    }
    (msg, details, first)
}

/// containernetworking/cni `pkg/invoke/raw_exec.go` `RawExec.pluginErr` (the
/// same in v0.8.1, v1.1.2, v1.2.0-rc1 and v1.3.0): the `*types.Error` libcni
/// makes of a plugin that exited non-zero, as its `Error()` text
/// (`pkg/types/types.go`: `Msg`, then `"; " + Details` when there are
/// details). Empty stdout: "netplugin failed with no error message: <exit>"
/// or, with stderr, "netplugin failed: <stderr quoted>"; stdout that does
/// not unmarshal: "netplugin failed but error parsing its diagnostic message
/// <stdout quoted>: <error>".
fn plugin_err(status: &std::process::ExitStatus, stdout: &[u8], stderr: &[u8]) -> GoError {
    let (msg, details) = if stdout.is_empty() {
        let msg = if stderr.is_empty() {
            format!(
                "netplugin failed with no error message: {}",
                go_exit_error(status)
            )
        } else {
            format!("netplugin failed: {}", go_quote(stderr))
        };
        (msg, String::new())
    } else {
        match unmarshal_types_error(stdout) {
            (msg, details, None) => (msg, details),
            (_, details, Some(perr)) => (
                format!(
                    "netplugin failed but error parsing its diagnostic message {}: {perr}",
                    go_quote(stdout)
                ),
                details,
            ),
        }
    };
    GoError {
        ty: "*types.Error",
        text: if details.is_empty() {
            msg
        } else {
            format!("{msg}; {details}")
        },
    }
}

/// network-attachment-definition-client `pkg/utils/cniconfig.go`
/// `CopyDeviceInfoForCNIFromDP`: `loadDeviceInfo` of the device plugin's
/// file, then `saveDeviceInfo`: the directory made when missing
/// (`os.MkdirAll(dir, os.ModeDir)`, i.e. permission bits 0), an existing
/// file is an error, the typed `DeviceInfo` marshalled and written with
/// `ioutil.WriteFile(path, bytes, 0444)` (the umask applies). Multus logs
/// the errors and goes on (multus.go `CmdAdd`).
fn copy_device_info(dp: &Path, cni: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    let Ok(info) = load_device_info(dp) else {
        return;
    };
    let dir = cni.parent().unwrap();
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o000)
            .create(dir)
            .unwrap();
    }
    if cni.exists() {
        return;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o444)
        .open(cni)
        .unwrap();
    f.write_all(&go_marshal(&info)).unwrap();
}

/// network-attachment-definition-client `pkg/utils/net-attach-def.go`
/// `CreateNetworkStatus`: the pod's interface (the one with a sandbox), its
/// addresses, DNS and the typed device info.
pub fn network_status(result: &Value, name: &str, devinfo: Option<DeviceInfo>) -> Value {
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
        st["device-info"] = serde_json::to_value(d).unwrap();
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
