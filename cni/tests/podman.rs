//! End-to-end with a real container runtime: Debian's podman (CNI network
//! backend, runc) runs two containers on `switchyard` networks from
//! conflists in its CNI config directory. Each container's DPDK testpmd
//! finds its memif socket as a pod would: one through the per-pod directory
//! the CNI made (bind-mounted, named by the `K8S_POD_UID` podman passes on
//! from `CNI_ARGS`), the other through the device plugin's CDI spec
//! (`--device switchyard.io/socket=memif-0`, read by podman's own CDI
//! library) on a network whose netconf names that device. Both run as
//! nobody:nogroup. Frames pass from one to the other through the switch;
//! `podman rm` runs DEL and nothing is left.

#[path = "support/exec.rs"]
mod exec;
#[path = "support/node.rs"]
mod node;
#[path = "../../dataplane/tests/common/testpmd.rs"]
mod testpmd;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

use node::*;
use serde_json::json;
use testpmd::{check_ending, rx_packets, serial, terminate, wait_for, workspace_bin};

const NOBODY: u32 = 65534;
/// Where podman 4.3 reads CDI specs (it has no setting for another).
const CDI_DIR: &str = "/var/run/cdi";

/// podman with this test's own containers.conf, storage and CNI dirs.
struct Podman {
    dir: PathBuf,
    names: Vec<String>,
    device_plugin: Option<Child>,
}

impl Podman {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = self
            .cmd(args)
            .output()
            .expect("podman (./scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Stops the device plugin (SIGTERM, as the kubelet stops it); one
    /// that ended badly, or logged a panic or an error, fails the test.
    fn stop_device_plugin(&mut self) {
        if let Some(mut dp) = self.device_plugin.take() {
            let ending = terminate(&mut dp, Duration::from_secs(5));
            let log = std::fs::read_to_string(self.dir.join("dp.log")).unwrap_or_default();
            check_ending("the device plugin", ending, &log, &[]);
        }
    }

    fn logs(&self, name: &str) -> String {
        let o = self.cmd(&["logs", name]).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for n in &self.names {
                eprintln!("---- podman logs {n} ----\n{}", self.logs(n));
            }
        }
        for n in &self.names {
            let _ = self.cmd(&["rm", "-f", "-t", "2", n]).output();
        }
        self.stop_device_plugin();
        // The device plugin keeps its CDI spec when it stops; this test's
        // is removed with the test.
        let _ = std::fs::remove_file(Path::new(CDI_DIR).join("switchyard.io-socket.json"));
    }
}

#[test]
fn podman_containers_on_switchyard_networks_through_cni_and_cdi() {
    let _g = serial();
    let node = Node::start();
    let t = node.dir.path();
    std::fs::set_permissions(t, std::fs::Permissions::from_mode(0o755)).unwrap();
    let spec = Path::new(CDI_DIR).join("switchyard.io-socket.json");
    assert!(
        !spec.exists(),
        "{} exists: another switchyard-device-plugin runs on this machine",
        spec.display()
    );

    // A root file system of the host's /usr (bind-mounted read-only).
    let rootfs = t.join("rootfs");
    for d in ["etc", "tmp", "proc", "dev", "sys", "run", "usr", "var"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    for l in ["bin", "lib", "lib64", "sbin"] {
        std::os::unix::fs::symlink(format!("usr/{l}"), rootfs.join(l)).unwrap();
    }
    // The plugin, named after the netconf type, and the conflists.
    let bin_dir = t.join("cni-bin");
    let net_dir = t.join("net.d");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&net_dir).unwrap();
    std::fs::copy(cni_bin(), bin_dir.join("switchyard")).unwrap();
    std::fs::write(
        t.join("containers.conf"),
        format!(
            "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{}\"]\nnetwork_config_dir = \"{}\"\n\
             [engine]\nruntime = \"runc\"\n\
             [containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=4096:4096\"]\n",
            bin_dir.display(),
            net_dir.display()
        ),
    )
    .unwrap();
    let plugin = |extra: serde_json::Value| {
        let mut p = json!({"type": "switchyard", "bridge": "podman",
                           "socketDir": node.socket_dir(), "controlSocket": node.control(),
                           "socketGroup": NOBODY});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    let net_a = format!("sy-plain-{}", std::process::id());
    let net_b = format!("sy-dev-{}", std::process::id());
    for (name, p) in [
        // Container A's testpmd picks its own MAC: the network pins the
        // first one it sends from.
        (&net_a, plugin(json!({"pin": "first"}))),
        (
            &net_b,
            plugin(json!({"deviceID": "memif-0", "deviceInfoDir": t.join("devinfo/dp")})),
        ),
    ] {
        std::fs::write(
            net_dir.join(format!("{name}.conflist")),
            json!({"cniVersion": "1.0.0", "name": name, "plugins": [p]}).to_string(),
        )
        .unwrap();
    }

    // The device plugin: device-info files, socket directories of group
    // nobody, and the CDI spec podman reads.
    std::fs::write(
        t.join("dp.toml"),
        format!(
            "plugin_dir = \"{t}/plugins\"\ndevinfo_dir = \"{t}/devinfo/dp\"\ncdi_dir = \"{CDI_DIR}\"\n\
             socket_dir = \"{t}/pods/devices\"\ncontrol_socket = \"{c}\"\nsocket_group = {NOBODY}\n\
             [[pool]]\nresource = \"switchyard.io/memif\"\ninterface_type = \"memif\"\ncount = 2\npod_role = \"slave\"\n",
            t = t.display(),
            c = node.control().display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(t.join("dp.log")).unwrap();
    let mut pm = Podman {
        dir: t.to_path_buf(),
        names: Vec::new(),
        device_plugin: Some(
            Command::new(workspace_bin(
                "switchyard-device-plugin",
                "switchyard-device-plugin",
            ))
            .arg("--config")
            .arg(t.join("dp.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
        ),
    };
    wait_for(Duration::from_secs(15), "the CDI spec", || {
        spec.exists().then_some(())
    });

    let id = std::process::id();
    let (a, b) = (format!("sy-a-{id}"), format!("sy-b-{id}"));
    pm.names = vec![a.clone(), b.clone()];
    // A container as nobody:nogroup on `network`, running testpmd on the
    // memif `socket` in `mode`; `extra` are more `podman run` options and
    // `cni_args` what podman passes on to the CNI.
    let run =
        |name: &str, network: &str, extra: &[&str], cni_args: &str, socket: &str, mode: &str| {
            let user = format!("{NOBODY}:{NOBODY}");
            let script = format!(
            "exec dpdk-testpmd --no-huge -m 256 --no-pci --file-prefix {name} --lcores 0@0,1@1 \
             --vdev=net_memif0,role=client,socket={socket},socket-abstract=no \
             -- --total-num-mbufs=8192 --forward-mode={mode} --stats-period 1"
        );
            let mut args = vec![
                "run",
                "-d",
                "--name",
                name,
                "--network",
                network,
                "--user",
                &user,
            ];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["-v", "/usr:/usr:ro", "-e", "XDG_RUNTIME_DIR=/tmp"]);
            args.extend_from_slice(&[
                "--rootfs",
                rootfs.to_str().unwrap(),
                "/bin/sh",
                "-c",
                &script,
            ]);
            let out = pm.cmd(&args).env("CNI_ARGS", cni_args).output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };

    // Container B: its socket from the CDI device (mount and environment),
    // on the network whose netconf names that device.
    run(
        &b,
        &net_b,
        &["--device", "switchyard.io/socket=memif-0"],
        "",
        "$SWITCHYARD_SOCKET_MEMIF_0",
        "rxonly",
    );
    // Container A: its pod directory, named after the pod UID that podman
    // passes to the CNI from CNI_ARGS, bind-mounted.
    let pod_dir = node.socket_dir().join(format!("pod-a-{id}"));
    std::fs::create_dir_all(&pod_dir).unwrap();
    let mount = format!("{0}:{0}", pod_dir.display());
    let sock_a = pod_dir.join("eth0.sock");
    run(
        &a,
        &net_a,
        &["-v", &mount],
        &format!("K8S_POD_UID=pod-a-{id}"),
        sock_a.to_str().unwrap(),
        "txonly",
    );

    // The CNI made one port per container, each on the socket its
    // container uses, open to the containers' group.
    let ports = node.ports();
    assert_eq!(ports.len(), 2, "{ports:?}");
    let dev_sock = node.socket_dir().join("devices/memif-0/memif.sock");
    for s in [&sock_a, &dev_sock] {
        assert!(
            ports.iter().any(|p| Path::new(&p.socket()) == s.as_path()),
            "{s:?}"
        );
        let m = std::fs::metadata(s).unwrap();
        assert_eq!((m.mode() & 0o777, m.gid()), (0o660, NOBODY), "{s:?}");
    }
    wait_for(Duration::from_secs(30), "frames from A at B", || {
        (rx_packets(&pm.logs(&b)) > 1000).then_some(())
    });
    let ports = node.ports();
    assert!(ports.iter().all(|p| p.status.link_up), "{ports:?}");
    // A's port pinned the MAC its frames came from (and keeps it).
    wait_for(Duration::from_secs(10), "A's first MAC pinned", || {
        node.ports()
            .into_iter()
            .find(|p| Path::new(&p.socket()) == sock_a.as_path())
            .and_then(|p| p.spec.macs)
            .filter(|m| m.len() == 1)
    });

    // podman rm: DEL for both; the ports, sockets and pod directory go, the
    // device plugin's directories stay.
    pm.run(&["rm", "-f", "-t", "2", &a, &b]);
    pm.names.clear();
    assert!(node.ports().is_empty());
    assert!(!pod_dir.exists());
    assert!(!dev_sock.exists());
    assert!(dev_sock.parent().unwrap().is_dir());
    let records: Vec<_> = std::fs::read_dir(node.socket_dir().join(".switchyard-cni"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != "lock")
        .collect();
    assert!(records.is_empty(), "{records:?}");

    // The device plugin stopped (a rollout replaces it): its CDI spec stays,
    // so a container the kubelet (re)creates meanwhile with the same CDI
    // name still starts, with the device's mount and environment.
    pm.stop_device_plugin();
    assert!(spec.exists());
    let c = format!("sy-c-{id}");
    pm.names = vec![c.clone()];
    let out = pm.run(&[
        "run",
        "--name",
        &c,
        "--network",
        "none",
        "--device",
        "switchyard.io/socket=memif-0",
        "-v",
        "/usr:/usr:ro",
        "--rootfs",
        rootfs.to_str().unwrap(),
        "/bin/sh",
        "-c",
        "test -d \"${SWITCHYARD_SOCKET_MEMIF_0%/*}\" && echo \"$SWITCHYARD_SOCKET_MEMIF_0\"",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        dev_sock.display().to_string()
    );
}
