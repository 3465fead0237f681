//! Real QEMU guests as vhost-user frontends: a Linux guest built at test
//! time from Debian packages (the cloud kernel's `virtio_net` and a static
//! busybox in an initramfs this file makes; no image is downloaded), booted
//! with `-netdev vhost-user`, and driven through its serial console.
//!
//! Under KVM where it works, else under QEMU's TCG (this project's machines
//! have a paravirtual KVM on which Debian kernels hang at boot).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::run_ok;

/// The meta-package whose dependency is the guest kernel.
const KERNEL_META: &str = "linux-image-cloud-amd64";
/// `virtio_net` and what it needs, in load order, for a kernel that builds
/// them as modules (Debian's cloud kernel); the init script skips the ones
/// a kernel has built in.
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "failover",
    "net_failover",
    "virtio_net",
];
/// What the init script prints once the guest's interface is configured.
const READY: &str = "SWITCHYARD-GUEST-READY";
/// Guest memory (MiB), shared with the switch.
const GUEST_MEM_MB: u32 = 256;

/// The guest's kernel and initramfs.
#[derive(Debug)]
pub struct GuestImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// The guest image, built once per test binary into the target directory
/// (and kept there: a second run reuses the kernel package it fetched).
pub fn image() -> &'static GuestImage {
    static IMAGE: OnceLock<GuestImage> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("qemu-guest")))
}

fn build_image(cache: &Path) -> GuestImage {
    std::fs::create_dir_all(cache).unwrap();
    // The kernel package the meta-package names today.
    let deps = run_ok(Command::new("apt-cache").args(["depends", KERNEL_META]));
    let package = deps
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .unwrap_or_else(|| panic!("apt-cache depends {KERNEL_META}: no kernel package in {deps}"))
        .to_string();
    let deb = find_deb(cache, &package).unwrap_or_else(|| {
        run_ok(
            Command::new("apt-get")
                .args(["download", &package])
                .current_dir(cache),
        );
        find_deb(cache, &package).expect("apt-get download left no .deb")
    });
    let tree = cache.join(&package);
    if !tree.join("boot").exists() {
        let tmp = cache.join(format!("{package}.partial"));
        let _ = std::fs::remove_dir_all(&tmp);
        run_ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp));
        std::fs::rename(&tmp, &tree).unwrap();
    }
    let kernel = std::fs::read_dir(tree.join("boot"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .expect("the kernel package holds boot/vmlinuz-*");

    // The initramfs: static busybox, the modules, an init script.
    let root = tempfile::Builder::new()
        .prefix("sy-initrd")
        .tempdir()
        .unwrap();
    for d in ["bin", "lib/modules", "proc", "sys", "dev", "tmp"] {
        std::fs::create_dir_all(root.path().join(d)).unwrap();
    }
    let busybox = static_busybox();
    std::fs::copy(&busybox, root.path().join("bin/busybox")).unwrap();
    // ethtool (the host's, with the libraries it links): what the guest's
    // driver negotiated, as `ethtool -k` shows it.
    copy_with_libraries(Path::new("/usr/sbin/ethtool"), root.path(), "bin/ethtool");
    let modules = find_files(&tree.join("lib/modules"), ".ko");
    for m in MODULES {
        if let Some(p) = modules
            .iter()
            .find(|p| p.file_name().unwrap().to_string_lossy() == format!("{m}.ko"))
        {
            std::fs::copy(p, root.path().join(format!("lib/modules/{m}.ko"))).unwrap();
        }
    }
    let init = root.path().join("init");
    std::fs::write(&init, init_script()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let initrd = cache.join("initrd.cpio");
    let files: String = find_files(root.path(), "")
        .iter()
        .map(|p| format!("{}\n", p.strip_prefix(root.path()).unwrap().display()))
        .collect();
    let mut cpio = Command::new(&busybox)
        .args(["cpio", "-o", "-H", "newc"])
        .current_dir(root.path())
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&initrd).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    cpio.stdin
        .take()
        .unwrap()
        .write_all(files.as_bytes())
        .unwrap();
    assert!(cpio.wait().unwrap().success(), "busybox cpio");
    GuestImage { kernel, initrd }
}

/// Copies the dynamically linked binary `bin` to `to` under `root`, and
/// each library `ldd` says it loads (the loader included) to its own path
/// under `root`.
fn copy_with_libraries(bin: &Path, root: &Path, to: &str) {
    std::fs::copy(bin, root.join(to)).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let ldd = run_ok(Command::new("ldd").arg(bin));
    for line in ldd.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        let path = line
            .split("=>")
            .last()
            .and_then(|r| r.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(p) = path {
            let dst = root.join(p.trim_start_matches('/'));
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            std::fs::copy(p, &dst).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    }
}

fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
        })
}

/// Every file and directory below `dir` whose name ends in `suffix`
/// (directories too when `suffix` is empty), depth first.
fn find_files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                if suffix.is_empty() {
                    out.push(p.clone());
                }
                stack.push(p);
            } else if p.to_string_lossy().ends_with(suffix) {
                out.push(p);
            }
        }
    }
    out
}

/// Debian's `busybox-static` (`busybox` is dynamically linked, and the
/// initramfs has no libc).
fn static_busybox() -> PathBuf {
    let listed = run_ok(Command::new("dpkg-query").args(["-L", "busybox-static"]));
    listed
        .lines()
        .map(PathBuf::from)
        .find(|p| p.file_name().is_some_and(|n| n == "busybox") && p.is_file())
        .expect("busybox-static installs a busybox binary")
}

/// The guest's init: mounts, loads `virtio_net`, gives `eth0` the address
/// from the kernel command line (`sy.ip=`), then serves a shell on the
/// serial console.
fn init_script() -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in {modules}; do
  [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko
done
ip link set lo up
ip=$(sed -n 's/.*sy\.ip=\([^ ]*\).*/\1/p' /proc/cmdline)
ip addr add $ip dev eth0
ip link set eth0 up
echo {READY}
exec setsid cttyhack sh
"#,
        modules = MODULES.join(" ")
    )
}

/// How QEMU accelerates the guest: KVM where it works, else TCG.
///
/// A working KVM needs the host CPU's virtualization extensions; the
/// paravirtual KVM of this project's machines (`kvm_pvm`) has none, and a
/// Debian kernel hangs at boot under it. `SWITCHYARD_QEMU_ACCEL=kvm|tcg`
/// overrides the choice.
pub fn accel() -> &'static str {
    static ACCEL: OnceLock<&'static str> = OnceLock::new();
    ACCEL.get_or_init(|| match std::env::var("SWITCHYARD_QEMU_ACCEL").as_deref() {
        Ok("kvm") => "kvm",
        Ok("tcg") => "tcg",
        _ => {
            let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let extensions = cpu
                .lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
            let kvm = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .is_ok();
            if kvm && extensions {
                "kvm"
            } else {
                "tcg"
            }
        }
    })
}

/// Which end of the vhost-user socket the switch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchRole {
    /// The switch listens; QEMU connects and reconnects (`reconnect=1`).
    Server,
    /// QEMU listens (`server=on,wait=off`); the switch connects.
    Client,
}

/// One guest's settings.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    pub name: String,
    pub socket: PathBuf,
    pub role: SwitchRole,
    /// `eth0`'s address with its prefix length.
    pub ip: String,
    pub mac: String,
    /// Queue pairs; the guest gets as many vCPUs, so that its driver
    /// enables every pair.
    pub queues: u16,
}

/// The QEMU command line for `spec` (the README's quick start shows the
/// same lines).
pub fn qemu_args(spec: &GuestSpec, serial: &Path) -> Vec<String> {
    let img = image();
    let chardev = match spec.role {
        SwitchRole::Server => format!("socket,id=vu0,path={},reconnect=1", spec.socket.display()),
        SwitchRole::Client => format!(
            "socket,id=vu0,path={},server=on,wait=off",
            spec.socket.display()
        ),
    };
    let mut device = format!("virtio-net-pci,netdev=net0,mac={}", spec.mac);
    if spec.queues > 1 {
        device.push_str(",mq=on");
    }
    if accel() == "tcg" {
        // QEMU 7.2 under TCG segfaults in msix_set_vector_notifiers when a
        // vhost-user device starts with MSI-X vectors (with DPDK's vhost
        // library as the backend too): the device uses INTx instead.
        device.push_str(",vectors=0");
    }
    let mut a: Vec<String> = [
        "-name",
        &spec.name,
        "-accel",
        accel(),
        "-m",
        &format!("{GUEST_MEM_MB}M"),
        "-smp",
        &spec.queues.to_string(),
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        // vhost-user needs the guest memory in a file it can share.
        "-object",
        &format!("memory-backend-memfd,id=mem0,size={GUEST_MEM_MB}M,share=on"),
        "-numa",
        "node,memdev=mem0",
        "-chardev",
        &chardev,
        "-netdev",
        &format!("vhost-user,id=net0,chardev=vu0,queues={}", spec.queues),
        "-device",
        &device,
        "-chardev",
        &format!("socket,id=ser0,path={},server=on,wait=on", serial.display()),
        "-serial",
        "chardev:ser0",
        "-kernel",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(img.kernel.display().to_string());
    a.push("-initrd".into());
    a.push(img.initrd.display().to_string());
    a.push("-append".into());
    a.push(format!(
        "console=ttyS0 loglevel=4 panic=-1 sy.ip={}",
        spec.ip
    ));
    if accel() == "kvm" {
        a.push("-cpu".into());
        a.push("host".into());
    }
    a
}

/// A running QEMU guest, killed by PID on drop.
pub struct Guest {
    pub spec: GuestSpec,
    child: Option<Child>,
    dir: tempfile::TempDir,
    serial: Option<UnixStream>,
    /// Everything the console printed.
    console: Arc<Mutex<Vec<u8>>>,
    /// Where the next command's output starts in `console`.
    read_at: usize,
    commands: usize,
}

impl Guest {
    /// Starts QEMU (the guest boots in the background; see
    /// [`Guest::wait_ready`]).
    pub fn start(spec: GuestSpec) -> Guest {
        let dir = tempfile::Builder::new()
            .prefix("sy-guest")
            .tempdir()
            .unwrap();
        let mut g = Guest {
            spec,
            child: None,
            dir,
            serial: None,
            console: Arc::default(),
            read_at: 0,
            commands: 0,
        };
        g.spawn();
        g
    }

    fn spawn(&mut self) {
        let serial = self.dir.path().join("serial.sock");
        let _ = std::fs::remove_file(&serial);
        let log = std::fs::File::create(self.dir.path().join("qemu.log")).unwrap();
        let child = Command::new("qemu-system-x86_64")
            .args(qemu_args(&self.spec, &serial))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start qemu-system-x86_64");
        self.child = Some(child);
        // QEMU waits for the console's reader before it runs the guest
        // (`wait=on`): no line is lost.
        let stream =
            super::common::wait_for(Duration::from_secs(30), "QEMU's serial socket", || {
                if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                    panic!(
                        "{}: QEMU exited ({st}): {}",
                        self.spec.name,
                        self.qemu_log()
                    );
                }
                UnixStream::connect(&serial).ok()
            });
        let console = collected(stream.try_clone().unwrap());
        self.serial = Some(stream);
        self.console = console;
        self.read_at = 0;
    }

    /// Waits until the guest booted and configured its interface.
    pub fn wait_ready(&mut self) {
        let limit = boot_limit();
        self.wait_console(READY, limit, "the guest to boot");
    }

    /// Waits until the console prints `text` after the last command's
    /// output; returns what it printed up to and including it.
    fn wait_console(&mut self, text: &str, limit: Duration, what: &str) -> String {
        let end = Instant::now() + limit;
        loop {
            {
                let c = self.console.lock().unwrap();
                let tail = String::from_utf8_lossy(&c[self.read_at..]).into_owned();
                if let Some(i) = tail.find(text) {
                    self.read_at += tail[..i + text.len()].len();
                    return tail[..i + text.len()].to_string();
                }
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "{}: QEMU exited ({st}) waiting for {what}: {}\nconsole:\n{}",
                    self.spec.name,
                    self.qemu_log(),
                    self.console()
                );
            }
            if Instant::now() > end {
                panic!(
                    "{}: timed out after {limit:?} waiting for {what}; console:\n{}",
                    self.spec.name,
                    self.console()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `cmd` in the guest's shell; returns its exit status and output.
    pub fn sh(&mut self, cmd: &str, limit: Duration) -> (i32, String) {
        self.commands += 1;
        let marker = format!("@@done{}@@", self.commands);
        // The shell echoes the typed line, `$?` unexpanded: only the
        // command's own echo prints the marker followed by a number.
        let line = format!("{cmd}\necho {marker}$?@@\n");
        self.serial
            .as_mut()
            .expect("guest running")
            .write_all(line.as_bytes())
            .unwrap();
        let end = Instant::now() + limit;
        let mut all = String::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            all += &self.wait_console(&marker, left, cmd);
            let rest = self.wait_console("@@", Duration::from_secs(5), cmd);
            all += &rest;
            if let Ok(code) = rest.trim_end_matches("@@").parse::<i32>() {
                // Everything the console printed since the command was sent
                // (its echo included).
                return (code, all);
            }
        }
    }

    /// Runs `cmd` and asserts it exits 0; returns its output.
    pub fn sh_ok(&mut self, cmd: &str, limit: Duration) -> String {
        let (code, out) = self.sh(cmd, limit);
        assert_eq!(code, 0, "{}: `{cmd}` exited {code}:\n{out}", self.spec.name);
        out
    }

    /// Runs `cmd` again until it exits 0 (what it tests for happened), for
    /// at most `limit`.
    pub fn wait_sh(&mut self, cmd: &str, limit: Duration, what: &str) {
        let end = Instant::now() + limit;
        loop {
            let (code, out) = self.sh(cmd, limit);
            if code == 0 {
                return;
            }
            if Instant::now() > end {
                panic!(
                    "{}: timed out after {limit:?} waiting for {what}: `{cmd}` exited {code}:\n{out}",
                    self.spec.name
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Packets each queue pair of `eth0` carried, as the guest's driver
    /// counts them (`ethtool -S`: `rx_queue_N_packets`,
    /// `tx_queue_N_packets`, for the pairs in use): (received, sent) by
    /// pair.
    pub fn queue_packets(&mut self) -> Vec<(u64, u64)> {
        let out = self.sh_ok("ethtool -S eth0", Duration::from_secs(60));
        let stat = |name: &str| -> Option<u64> {
            out.lines().find_map(|l| {
                l.trim()
                    .strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse()
                    .ok()
            })
        };
        (0..)
            .map_while(|q| {
                Some((
                    stat(&format!("rx_queue_{q}_packets"))?,
                    stat(&format!("tx_queue_{q}_packets"))?,
                ))
            })
            .collect()
    }

    /// Everything the console printed so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned()
    }

    /// What QEMU printed on stdout and stderr.
    pub fn qemu_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("qemu.log")).unwrap_or_default()
    }

    /// Kills QEMU with SIGKILL (the guest dies with it).
    pub fn kill9(&mut self) {
        self.serial = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts QEMU again on the same settings (a fresh boot).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.commands = 0;
    }
}

impl Drop for Guest {
    /// Kills QEMU. One that had exited by itself (a crashed or refusing
    /// frontend: QEMU 7.2 under TCG has segfaulted here) fails the test.
    fn drop(&mut self) {
        let early = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        if std::thread::panicking() || early.is_some() {
            eprintln!(
                "---- {} QEMU log ----\n{}\n---- {} console ----\n{}",
                self.spec.name,
                self.qemu_log(),
                self.spec.name,
                self.console()
            );
        }
        self.kill9();
        if let (Some(st), false) = (early, std::thread::panicking()) {
            panic!("{}: QEMU exited during the test ({st})", self.spec.name);
        }
    }
}

/// What `reader` gives, gathered by a thread of its own until its end: a
/// guest's console as it prints.
pub fn collected(mut reader: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let console = Arc::new(Mutex::new(Vec::new()));
    let sink = console.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    console
}

/// How long a boot may take: a few seconds under KVM, some more under TCG
/// on a loaded two-core machine.
pub fn boot_limit() -> Duration {
    if accel() == "kvm" {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(120)
    }
}
