//! First frame after idle: how long a frame takes through an adaptive-mode
//! switch whose worker has gone to sleep on its eventfds.
//!
//! Runs the real daemon (`target/release/switchyard`, or `SWITCHYARD_BIN`)
//! with one worker in `adaptive` mode, two memif master ports on a bridge and
//! 100 more idle ports. Two memif slaves written for the tests (the peer of
//! `dataplane/tests/common/memif_peer.rs`) attach: peer A sends one 64-byte
//! frame and kicks the ring's eventfd as an interrupt-mode peer does, peer B
//! busy-polls its receive ring. The worker runs on CPU 0, the peers on CPU 1
//! (the machine needs two CPUs). Before each frame the switch is left idle
//! for 20 ms (its worker sleeps after 1 ms) and the worker thread's state is
//! sampled from /proc to count how often it really was asleep.
//!
//! `cargo build --release -p switchyard && cargo bench -p switchyard-benches --bench idle_latency`

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard::port::memif::ring::Desc;
use switchyard_api::{Client, Request};

#[path = "../../dataplane/tests/common/memif_peer.rs"]
mod memif_peer;

use memif_peer::{Conn, SlaveMem, BUF, SLOTS};

/// Polls `f` every 10 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const FRAMES: usize = 300;
const IDLE: Duration = Duration::from_millis(20);
const IDLE_PORTS: usize = 100;

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn switchyard_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_BIN") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/switchyard");
    assert!(
        p.exists(),
        "{} is missing: cargo build --release -p switchyard",
        p.display()
    );
    p
}

/// The worker thread's scheduler state letter (`R` running, `S` sleeping).
fn worker_state(pid: u32) -> Option<char> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "sy-worker-0" {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // "pid (comm) S ...": the state follows the closing parenthesis.
            return stat.rsplit(')').next()?.trim().chars().next();
        }
    }
    None
}

/// The floor: a bare thread on CPU 0 blocked in epoll on an eventfd, as the
/// worker sleeps,
/// woken from CPU 1 after the same idle time. No switch involved: what the
/// kernel (and, in a VM, the hypervisor) takes to wake an idle CPU.
fn wake_floor() -> Vec<Duration> {
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let efd = Arc::new(switchyard::eventfd::new_eventfd().expect("eventfd"));
    let woken = Arc::new(AtomicUsize::new(0));
    let sleeper = {
        let (efd, woken) = (efd.clone(), woken.clone());
        std::thread::spawn(move || {
            let mut cpu0 = nix::sched::CpuSet::new();
            cpu0.set(0).unwrap();
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu0);
            use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
            let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
            ep.add(efd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))
                .expect("epoll add");
            let mut events = [EpollEvent::empty(); 1];
            while woken.load(Ordering::Acquire) < FRAMES {
                let _ = ep.wait(&mut events, EpollTimeout::NONE);
                switchyard::eventfd::drain_eventfd(efd.as_fd());
                woken.fetch_add(1, Ordering::Release);
            }
        })
    };
    let mut out = Vec::new();
    for i in 0..FRAMES {
        std::thread::sleep(IDLE);
        let t0 = Instant::now();
        memif_peer::kick(&efd);
        while woken.load(Ordering::Acquire) == i {
            std::hint::spin_loop();
        }
        out.push(t0.elapsed());
    }
    sleeper.join().unwrap();
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours skips the run.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"idle_latency".contains(a.as_str()))
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sy-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let control = dir.join("control.sock");
    let config = dir.join("switchyard.toml");
    let mode = std::env::var("SY_POLL_MODE").unwrap_or_else(|_| "adaptive".into());
    std::fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\nstate_dir = \"{}\"\nsocket_dir = \"{}\"\n[dataplane]\nworkers = 1\ncpus = [0]\npoll_mode = \"{mode}\"\n[[bridge]]\nname = \"b\"\n",
            control.display(),
            dir.join("state").display(),
            dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(switchyard_bin())
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start switchyard");
    let daemon = Daemon {
        child,
        dir: dir.clone(),
    };
    let client = || Client::connect(&control).ok();
    wait_for(Duration::from_secs(10), "the control socket", || {
        client().and_then(|mut c| c.call(&Request::Ping).ok())
    });
    let add = |name: &str, bridge: bool| -> String {
        let sock = dir.join(format!("{name}.sock")).display().to_string();
        let mut port = serde_json::json!({
            "name": name, "kind": "memif", "role": "master", "socket": sock,
        });
        if bridge {
            port["bridge"] = "b".into();
        }
        let port = serde_json::from_value(port).unwrap();
        client()
            .unwrap()
            .call(&Request::PortAdd {
                port: Box::new(port),
            })
            .expect("port add");
        sock
    };
    let (sa, sb) = (add("a", true), add("b", true));
    for i in 0..IDLE_PORTS {
        add(&format!("idle{i}"), false);
    }

    // As in the loop benchmark: the switch's worker on CPU 0, the peers on
    // CPU 1 (a busy-polling peer sharing the worker's CPU would measure the
    // scheduler's time slice, not the switch).
    let mut cpu1 = nix::sched::CpuSet::new();
    cpu1.set(1).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu1).expect("pin to CPU 1");
    // Peer A sends, peer B receives; both are slaves (the switch is master).
    let (ca, ma) = (Conn::connect(&sa), SlaveMem::new());
    memif_peer::run_slave(&ca, &ma.script()).expect("peer a handshake");
    let (cb, mb) = (Conn::connect(&sb), SlaveMem::new());
    memif_peer::run_slave(&cb, &mb.script()).expect("peer b handshake");
    mb.post_m2s_buffers();
    // B polls: it asks the switch not to signal its receive ring.
    mb.m2s.set_flags(1);
    let frame: Vec<u8> = [
        &[0xff; 6][..],
        &[0x02, 0, 0, 0, 0, 0xaa],
        &[0x08, 0x00],
        &[0u8; 46],
    ]
    .concat();
    let mut busy = Vec::new();
    let mut idle = Vec::new();
    let mut asleep = 0usize;
    let mut kicks = 0usize;
    let pid = daemon.child.id();
    for i in 0..2 * FRAMES {
        let after_idle = i >= FRAMES;
        if after_idle {
            std::thread::sleep(IDLE);
            asleep += usize::from(worker_state(pid) == Some('S'));
        }
        let n = i as u16;
        let slot = n % SLOTS;
        let offset = ma.buffer(u32::from(slot));
        // SAFETY: the buffer lies inside peer A's region (buffer() is in range).
        unsafe {
            std::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                ma.region.base().add(offset as usize),
                frame.len(),
            )
        };
        let before = mb.m2s.tail();
        let t0 = Instant::now();
        ma.s2m.set_desc(
            slot,
            Desc {
                flags: 0,
                region: 0,
                length: frame.len() as u32,
                offset,
            },
        );
        ma.s2m.set_head(n.wrapping_add(1));
        // An interrupt-mode peer signals unless the switch is polling.
        if ma.s2m.flags() & 1 == 0 {
            memif_peer::kick(&ma.s2m_irq);
            kicks += usize::from(after_idle);
        }
        let spin_end = t0 + Duration::from_secs(1);
        while mb.m2s.tail() == before {
            std::hint::spin_loop();
            assert!(Instant::now() < spin_end, "frame {i} never arrived");
        }
        let dt = t0.elapsed();
        // Give B's buffer back, at its full size.
        let rslot = before;
        mb.m2s.set_desc(
            rslot,
            Desc {
                flags: 0,
                region: 0,
                length: BUF,
                offset: mb.buffer(u32::from(SLOTS + rslot % SLOTS)),
            },
        );
        mb.m2s.set_head(mb.m2s.head().wrapping_add(1));
        if after_idle {
            idle.push(dt);
        } else {
            busy.push(dt);
        }
        if !after_idle {
            // Back to back, but let the previous frame's burst finish.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let mut floor = wake_floor();
    for (what, v) in [
        ("back to back (50 us apart)", &mut busy),
        ("first frame after 20 ms idle", &mut idle),
        ("floor: waking a bare thread after 20 ms idle", &mut floor),
    ] {
        v.sort();
        println!(
            "idle_latency: {what}: median {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us ({} frames)",
            percentile(v, 0.5).as_secs_f64() * 1e6,
            percentile(v, 0.9).as_secs_f64() * 1e6,
            percentile(v, 0.99).as_secs_f64() * 1e6,
            v.last().unwrap().as_secs_f64() * 1e6,
            v.len()
        );
    }
    println!(
        "idle_latency: worker asleep before {asleep} of {FRAMES} idle frames, kicked for {kicks}; {IDLE_PORTS} idle ports besides"
    );
    drop((ca, cb));
}
