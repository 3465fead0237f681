//! A scratch Kubernetes node on this machine, for tests of what we ship as
//! we ship it: a mount namespace whose `/run`, `/var/lib` and `/opt` are
//! empty tmpfs (so every absolute path in `config/kubernetes/` means there
//! what it means on a node, and nothing of this machine's is touched), the
//! image the Dockerfile describes, and the DaemonSet's containers run by a
//! real container runtime (podman with runc) exactly as their specs say.
//! (Included with `#[path]` by the device plugin tests.)
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use serde_yaml::Value;

/// The repository.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The YAML documents of a shipped file (relative to the repository).
pub fn documents(rel: &str) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(repo().join(rel)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The one document of `kind` named `name` among `docs`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The static CNI plugin, built by the script the Dockerfile runs.
pub fn static_cni() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/deps/<test> -> target
        let exe = std::env::current_exe().unwrap();
        let target = exe.ancestors().nth(3).unwrap().to_path_buf();
        let out = target.join("static-cni/switchyard-cni");
        let st = Command::new(repo().join("scripts/build-cni.sh"))
            .arg(&out)
            .arg(target.join("static-cni"))
            .status()
            .unwrap();
        assert!(st.success(), "scripts/build-cni.sh");
        out
    })
    .clone()
}

/// The image the Dockerfile builds: its final stage is Debian 12 (this
/// machine's `/usr`, mounted read-only, stands for `debian:bookworm-slim`
/// with `libxdp1`) plus our binaries where its `COPY --from=build` lines put
/// them, each built as the Dockerfile builds it (the CNI plugin by
/// `scripts/build-cni.sh`, static).
pub struct Image {
    /// The root file system.
    pub rootfs: PathBuf,
    /// Read-only mounts that complete it (`-v` arguments).
    pub layers: Vec<String>,
}

impl Image {
    /// Builds the image in `dir`; `binary(name)` gives the workspace binary
    /// `name` (the daemon, the device plugin, the webhook).
    pub fn build(dir: &Path, binary: impl Fn(&str) -> PathBuf) -> Image {
        let rootfs = dir.join("rootfs");
        for d in ["etc", "tmp", "proc", "dev", "sys", "run", "var", "usr"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        // Debian's /tmp, merged /usr, and /var/run.
        std::fs::set_permissions(
            rootfs.join("tmp"),
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        for l in ["bin", "lib", "lib64", "sbin"] {
            std::os::unix::fs::symlink(format!("usr/{l}"), rootfs.join(l)).unwrap();
        }
        std::os::unix::fs::symlink("/run", rootfs.join("var/run")).unwrap();
        let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
        // The final stage's COPY --from=build instructions (with their
        // continuation lines): sources, then the destination.
        let joined = dockerfile.replace("\\\n", " ");
        let mut copied = Vec::new();
        for line in joined.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("COPY --from=build ") else {
                continue;
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            let (dest, sources) = words.split_last().unwrap();
            for src in sources {
                let name = Path::new(src).file_name().unwrap().to_str().unwrap();
                let to = if dest.ends_with('/') {
                    Path::new(dest).join(name)
                } else {
                    PathBuf::from(dest)
                };
                let from = if name == "switchyard-cni" {
                    static_cni()
                } else {
                    binary(name)
                };
                let at = rootfs.join(to.strip_prefix("/").unwrap());
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                std::fs::copy(&from, &at).unwrap();
                copied.push(to.display().to_string());
            }
        }
        assert!(
            copied.iter().any(|c| c.ends_with("/switchyard-cni")),
            "the Dockerfile copies no switchyard-cni: {copied:?}"
        );
        let layers = ["bin", "sbin", "lib", "lib64", "share"]
            .iter()
            .map(|d| format!("/usr/{d}:/usr/{d}:ro"))
            .collect();
        Image { rootfs, layers }
    }
}

/// The cluster as the kubelet gives it to a pod's containers: the API
/// server's address (the `KUBERNETES_SERVICE_*` variables of every
/// container), this node's name (the downward API's `spec.nodeName`), and
/// what a `kube-api-access` projected volume holds.
pub struct Cluster {
    /// The node's name.
    pub node_name: String,
    /// The API server's host and port.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The pod's namespace (its DaemonSet's).
    pub namespace: String,
    /// A token of the pod's service account (`serviceAccountToken`).
    pub token: String,
    /// The cluster's CA certificate (ConfigMap `kube-root-ca.crt`, key
    /// `ca.crt`).
    pub ca_file: PathBuf,
}

/// The scratch node: a process holding a mount namespace.
pub struct NodeRoot {
    /// The cluster its pods see, if the test runs an API server.
    pub cluster: Option<Cluster>,
    holder: Child,
    /// The holder's PID: its `/proc/<pid>/root` is the node's root.
    pub pid: u32,
    /// Temporary files of the test (on this machine's `/tmp`, which the
    /// node shares).
    pub dir: tempfile::TempDir,
    containers: Vec<String>,
    /// Containers whose log may show a panic: the test causes it.
    expected_panics: Vec<String>,
}

impl NodeRoot {
    /// A new node: `/run`, `/var/lib` and `/opt` empty.
    pub fn new() -> NodeRoot {
        let dir = tempfile::Builder::new()
            .prefix("sy-node")
            .tempdir()
            .unwrap();
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(
                "for d in /run /var/lib /opt; do mount -t tmpfs -o mode=755 tmpfs $d || exit 1; done; \
                 echo ready; exec sleep infinity",
            )
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the node's mount namespace");
        let pid = holder.id();
        let node = NodeRoot {
            cluster: None,
            holder,
            pid,
            dir,
            containers: Vec::new(),
            expected_panics: Vec::new(),
        };
        std::fs::write(
            node.dir.path().join("containers.conf"),
            // crun fails on this machine's hybrid cgroups; the default
            // ulimits are above its hard limit; no journald here.
            "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
             [containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=4096:4096\"]\n\
             [network]\nnetwork_backend = \"cni\"\n",
        )
        .unwrap();
        node
    }

    /// The node's `p`, as this process reaches it (symlinks resolved in
    /// the node: `/var/run` is `/run` there too).
    pub fn path(&self, p: &str) -> PathBuf {
        super::multus::in_root(Path::new(&format!("/proc/{}/root", self.pid)), Path::new(p))
    }

    /// The command prefix that runs a program in the node.
    pub fn enter(&self) -> Vec<String> {
        ["/usr/bin/nsenter", "-t", &self.pid.to_string(), "-m", "--"]
            .map(String::from)
            .to_vec()
    }

    /// `program` in the node.
    pub fn command(&self, program: &str) -> Command {
        let e = self.enter();
        let mut c = Command::new(&e[0]);
        c.args(&e[1..]).arg(program);
        c
    }

    /// podman in the node, with the node's storage.
    pub fn podman(&self, args: &[&str]) -> Command {
        let mut c = self.command("podman");
        c.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        c
    }

    /// podman in the node, which must succeed.
    pub fn podman_ok(&self, args: &[&str]) -> Output {
        let out = self
            .podman(args)
            .output()
            .expect("podman (./scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "podman {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// A container's output so far.
    pub fn logs(&self, name: &str) -> String {
        let o = self.podman(&["logs", name]).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    /// Runs `podman run` with `args`; the container is removed with the
    /// node.
    pub fn run(&mut self, name: &str, args: &[String]) -> Output {
        self.containers.push(name.to_string());
        let mut all = vec!["run".to_string(), "--name".into(), name.into()];
        all.extend_from_slice(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        self.podman_ok(&all)
    }

    /// Says that the test makes container `name` panic: its log's panic
    /// does not fail the test.
    pub fn expect_panic(&mut self, name: &str) {
        self.expected_panics.push(name.to_string());
    }

    /// What is wrong with container `name`, if anything: it has exited by
    /// itself with an error, or its log shows a panic the test did not
    /// expect.
    fn container_fault(&self, name: &str) -> Option<String> {
        let o = self
            .podman(&[
                "inspect",
                "-f",
                "{{.State.Status}} {{.State.ExitCode}}",
                name,
            ])
            .output()
            .unwrap();
        let state = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let log = self.logs(name);
        let ended =
            (state.starts_with("exited") || state.starts_with("stopped")) && !state.ends_with(" 0");
        let panicked =
            log.contains("panicked at") && !self.expected_panics.iter().any(|c| c == name);
        (ended || panicked)
            .then(|| format!("container {name} ({state}) ended badly or panicked:\n{log}"))
    }

    /// Fails the test with `fault`, unless it is failing already (then
    /// says it).
    fn fail(fault: Option<String>) {
        match fault {
            Some(f) if std::thread::panicking() => eprintln!("{f}"),
            Some(f) => panic!("{f}"),
            None => {}
        }
    }

    /// Stops a container as the kubelet does (SIGTERM, then SIGKILL after
    /// `grace` seconds) and removes it; one that had ended badly fails the
    /// test (see [`NodeRoot::container_fault`]).
    pub fn remove(&mut self, name: &str, grace: u32) {
        Self::fail(self.container_fault(name));
        let g = grace.to_string();
        let _ = self.podman(&["stop", "-t", &g, name]).output();
        let _ = self.podman(&["rm", "-f", name]).output();
        self.containers.retain(|c| c != name);
    }

    /// `podman run` arguments for `container` of the pod template `spec`
    /// (a DaemonSet's `.spec.template.spec`), as the kubelet would create it
    /// on this node: its image, command, environment, volumes, security
    /// context and network. `config_maps` gives a ConfigMap's data by name.
    /// A field this does not translate fails the test, so the manifest
    /// cannot say more than the test runs.
    pub fn container_args(
        &self,
        spec: &Value,
        container: &Value,
        image: &Image,
        config_maps: &dyn Fn(&str) -> Value,
        detach: bool,
    ) -> Vec<String> {
        for (k, _) in container.as_mapping().unwrap() {
            let k = k.as_str().unwrap();
            assert!(
                [
                    "name",
                    "image",
                    "imagePullPolicy",
                    "command",
                    "args",
                    "env",
                    "resources",
                    "securityContext",
                    "volumeMounts",
                    "ports",
                    "livenessProbe",
                    "readinessProbe",
                ]
                .contains(&k),
                "container field {k}: not translated to the runtime"
            );
        }
        let mut a: Vec<String> = Vec::new();
        if detach {
            a.push("-d".into());
        }
        let host_network = spec["hostNetwork"].as_bool().unwrap_or(false);
        a.extend([
            "--network".into(),
            if host_network { "host" } else { "none" }.into(),
        ]);
        // seccomp: the pod's profile, unless the container names its own.
        let seccomp = |v: &Value| match v["type"].as_str() {
            // The runtime's default profile: podman's, as it applies it
            // to every container it is not told otherwise about.
            Some("RuntimeDefault") => None,
            Some("Unconfined") => Some("seccomp=unconfined".to_string()),
            other => panic!("seccompProfile.type {other:?}: not translated to the runtime"),
        };
        let mut seccomp_opt = None;
        for (k, v) in spec["securityContext"].as_mapping().into_iter().flatten() {
            match k.as_str().unwrap() {
                "seccompProfile" => seccomp_opt = seccomp(v),
                other => panic!("pod securityContext.{other}: not translated to the runtime"),
            }
        }
        if let Some(p) = container["securityContext"]
            .get("seccompProfile")
            .map(seccomp)
        {
            seccomp_opt = p;
        }
        if let Some(o) = seccomp_opt {
            a.extend(["--security-opt".into(), o]);
        }
        let sc = &container["securityContext"];
        for (k, v) in sc.as_mapping().into_iter().flatten() {
            match k.as_str().unwrap() {
                "runAsUser" => a.extend(["--user".into(), v.as_u64().unwrap().to_string()]),
                "allowPrivilegeEscalation" => {
                    if v.as_bool() == Some(false) {
                        a.extend(["--security-opt".into(), "no-new-privileges".into()]);
                    }
                }
                "readOnlyRootFilesystem" => {
                    if v.as_bool() == Some(true) {
                        a.push("--read-only".into());
                    }
                }
                "capabilities" => {
                    for d in v["drop"].as_sequence().into_iter().flatten() {
                        a.extend(["--cap-drop".into(), d.as_str().unwrap().to_lowercase()]);
                    }
                    for c in v["add"].as_sequence().into_iter().flatten() {
                        a.extend(["--cap-add".into(), c.as_str().unwrap().to_string()]);
                    }
                }
                "seccompProfile" => {}
                other => panic!("securityContext.{other}: not translated to the runtime"),
            }
        }
        // The kubelet gives every container the API server's address
        // (pkg/kubelet/kubelet_pods.go, the master service's variables).
        if let Some(c) = &self.cluster {
            a.extend([
                "-e".into(),
                format!("KUBERNETES_SERVICE_HOST={}", c.host),
                "-e".into(),
                format!("KUBERNETES_SERVICE_PORT={}", c.port),
            ]);
        }
        for e in container["env"].as_sequence().into_iter().flatten() {
            let value = if let Some(v) = e.get("valueFrom") {
                self.field_ref(&v["fieldRef"]).to_string()
            } else {
                e["value"].as_str().expect("env value").to_string()
            };
            a.extend([
                "-e".into(),
                format!("{}={value}", e["name"].as_str().unwrap()),
            ]);
        }
        for m in container["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            let name = m["name"].as_str().unwrap();
            let at = m["mountPath"].as_str().unwrap();
            let ro = if m["readOnly"].as_bool() == Some(true) {
                ":ro"
            } else {
                ""
            };
            let vol = spec["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|v| v["name"].as_str() == Some(name))
                .unwrap_or_else(|| panic!("volume {name}"));
            let source = if let Some(hp) = vol.get("hostPath") {
                self.host_path(hp)
            } else if let Some(cm) = vol.get("configMap") {
                let cm_name = cm["name"].as_str().unwrap();
                let dir = self.dir.path().join(format!("configmap-{cm_name}"));
                std::fs::create_dir_all(&dir).unwrap();
                // As the kubelet's AtomicWriter (pkg/volume/util/
                // atomic_writer.go) updates a ConfigMap volume: a reader
                // never sees a file half written. Every pod of the
                // DaemonSet mounts this directory, and a container starting
                // reads its files while the next one's are put in place.
                for (k, v) in config_maps(cm_name).as_mapping().unwrap() {
                    let (file, text) = (dir.join(k.as_str().unwrap()), v.as_str().unwrap());
                    if std::fs::read_to_string(&file).ok().as_deref() != Some(text) {
                        let tmp = dir.join(format!("..{}.tmp", k.as_str().unwrap()));
                        std::fs::write(&tmp, text).unwrap();
                        std::fs::rename(&tmp, &file).unwrap();
                    }
                }
                dir.display().to_string()
            } else if let Some(p) = vol.get("projected") {
                self.projected(name, p)
            } else {
                panic!("volume {name}: only hostPath, configMap and projected are translated")
            };
            a.extend(["-v".into(), format!("{source}:{at}{ro}")]);
        }
        for l in &image.layers {
            a.extend(["-v".into(), l.clone()]);
        }
        a.extend(["--rootfs".into(), image.rootfs.display().to_string()]);
        let cmd = container["command"].as_sequence().expect("command");
        a.extend(cmd.iter().map(|c| c.as_str().unwrap().to_string()));
        a.extend(
            container["args"]
                .as_sequence()
                .into_iter()
                .flatten()
                .map(|c| c.as_str().unwrap().to_string()),
        );
        a
    }

    /// A downward API `fieldRef`'s value.
    fn field_ref(&self, r: &Value) -> &str {
        let c = self
            .cluster
            .as_ref()
            .expect("a fieldRef: the test gives the node a Cluster");
        match r["fieldPath"].as_str().unwrap() {
            "spec.nodeName" => &c.node_name,
            "metadata.namespace" => &c.namespace,
            f => panic!("fieldRef {f}: not translated"),
        }
    }

    /// A projected volume's directory, its sources written as the kubelet
    /// writes them (pkg/volume/projected): a service account token, a
    /// ConfigMap's keys, downward API fields.
    fn projected(&self, name: &str, p: &Value) -> String {
        let c = self
            .cluster
            .as_ref()
            .expect("a projected volume: the test gives the node a Cluster");
        let dir = self.dir.path().join(format!("projected-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        for src in p["sources"].as_sequence().unwrap() {
            if let Some(t) = src.get("serviceAccountToken") {
                std::fs::write(dir.join(t["path"].as_str().unwrap()), &c.token).unwrap();
            } else if let Some(cm) = src.get("configMap") {
                assert_eq!(
                    cm["name"].as_str(),
                    Some("kube-root-ca.crt"),
                    "projected ConfigMap: only the cluster's CA is translated"
                );
                for item in cm["items"].as_sequence().unwrap() {
                    assert_eq!(item["key"].as_str(), Some("ca.crt"));
                    std::fs::copy(&c.ca_file, dir.join(item["path"].as_str().unwrap())).unwrap();
                }
            } else if let Some(d) = src.get("downwardAPI") {
                for item in d["items"].as_sequence().unwrap() {
                    std::fs::write(
                        dir.join(item["path"].as_str().unwrap()),
                        self.field_ref(&item["fieldRef"]),
                    )
                    .unwrap();
                }
            } else {
                panic!("volume {name}: projected source {src:?} not translated");
            }
        }
        dir.display().to_string()
    }

    /// A hostPath volume's path on the node, checked or made as its `type`
    /// says (as the kubelet does).
    fn host_path(&self, hp: &Value) -> String {
        let path = hp["path"].as_str().unwrap();
        let on_node = self.path(path);
        match hp["type"].as_str().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(&on_node).unwrap(),
            "Directory" => assert!(on_node.is_dir(), "hostPath {path}: not a directory"),
            "CharDevice" => {
                use std::os::unix::fs::FileTypeExt;
                let m = std::fs::metadata(&on_node).unwrap_or_else(|e| panic!("{path}: {e}"));
                assert!(m.file_type().is_char_device(), "hostPath {path}");
            }
            "" => {}
            t => panic!("hostPath type {t}: not translated"),
        }
        path.to_string()
    }
}

impl Drop for NodeRoot {
    fn drop(&mut self) {
        let mut faults = Vec::new();
        for c in std::mem::take(&mut self.containers) {
            if std::thread::panicking() {
                eprintln!("---- {c} ----\n{}", self.logs(&c));
            }
            faults.extend(self.container_fault(&c));
            let _ = self.podman(&["rm", "-f", "-t", "2", &c]).output();
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        // After the clean-up: a failing check leaves nothing behind.
        Self::fail((!faults.is_empty()).then(|| faults.join("\n")));
    }
}
