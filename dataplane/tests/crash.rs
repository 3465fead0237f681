//! End-to-end: a dead or stuck worker is never silent. A worker that
//! panics ends the switch at once, with the panic and its ports in the
//! log and exit status 101, and the state file brings the ports back on
//! the restart; a worker that stops completing its passes fails
//! `switchyard live` (the DaemonSet's liveness probe); and the test
//! harness fails a test whose switch panics after its last assertion.
//! The faults are injected through the debug builds' hook
//! (`SWITCHYARD_DEBUG_WORKER_FAULT`).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{serial, wait_for, Netns, Switch};

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n\n[dataplane]\nworkers = 1\n";
const FAULT_ENV: &str = "SWITCHYARD_DEBUG_WORKER_FAULT";

/// A switch in namespace `ns` whose worker meets `fault` (`panic` or
/// `stall`) as soon as it polls a queue: the file the hook reads is
/// written first.
fn faulty_switch(ns: &Netns, fault: &str) -> (Switch, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("sy-fault")
        .tempdir()
        .unwrap();
    let file = dir.path().join("fault");
    std::fs::write(&file, fault).unwrap();
    let file = file.display().to_string();
    let sw = Switch::start_with(Some(&ns.name), &[], &[(FAULT_ENV, &file)], BRIDGE);
    (sw, dir)
}

/// A tap port: its queue reaches the worker at once, with no peer.
fn add_tap(sw: &Switch, name: &str) -> String {
    let tap = format!("syc{}{name}", std::process::id() % 10_000);
    sw.add_port(&[name, "--kind", "tap", "--interface", &tap]);
    tap
}

/// Waits for the switch process to end by itself; its exit status.
fn wait_for_exit(sw: &mut Switch) -> std::process::ExitStatus {
    let child = sw.child.as_mut().expect("a running switch");
    wait_for(Duration::from_secs(10), "the switch to exit", || {
        child.try_wait().unwrap()
    })
}

#[test]
fn a_worker_panic_ends_the_switch_and_the_restart_restores_its_ports() {
    let _g = serial();
    let ns = Netns::new("crash");
    let (mut sw, _fault) = faulty_switch(&ns, "panic");
    // The panic is the test's: its report does not fail it.
    sw.expect_error("thread 'sy-worker-0'");
    sw.expect_error("the worker panicked");
    sw.cli_ok(&["live"]);
    let t = Instant::now();
    add_tap(&sw, "t0");
    let status = wait_for_exit(&mut sw);
    eprintln!(
        "the switch exited {:?} after the port was added",
        t.elapsed()
    );
    assert_eq!(status.code(), Some(101), "{status}:\n{}", sw.log());
    assert_eq!(status.signal(), None);
    let log = sw.log();
    assert!(
        log.lines()
            .any(|l| l.starts_with("thread 'sy-worker-0'") && l.contains("panicked at"))
            && log.contains("injected by"),
        "{log}"
    );
    // The error names the worker and what it polled.
    let report = log
        .lines()
        .find(|l| l.contains(" ERROR ") && l.contains("the worker panicked"))
        .unwrap_or_else(|| panic!("no report of the panic:\n{log}"));
    assert!(report.contains("worker 0"), "{report}");
    assert!(report.contains("t0 queue 0"), "{report}");
    assert!(report.contains("thread=\"sy-worker-0\""), "{report}");
    // As the DaemonSet's restart policy would: the same switch again, on
    // its state, serves the port (the hook's file went with the panic).
    sw.child = None;
    sw.spawn();
    let p = sw.port("t0");
    assert!(p.status.link_up, "{p:?}");
    assert!(sw.cli(&["live"]).status.success());
}

#[test]
fn a_stalled_worker_fails_liveness_until_the_switch_is_restarted() {
    let _g = serial();
    let ns = Netns::new("stall");
    let (mut sw, _fault) = faulty_switch(&ns, "stall");
    sw.expect_error("stalled, `switchyard live` fails");
    sw.add_port(&[
        "idle",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("idle.sock"),
    ]);
    assert!(sw.cli(&["live"]).status.success(), "live before any queue");
    add_tap(&sw, "t0");
    let out = wait_for(Duration::from_secs(20), "`switchyard live` to fail", || {
        let o = sw.cli(&["live"]);
        (!o.status.success()).then_some(o)
    });
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("worker 0 has completed no pass over t0 queue 0"),
        "{said}"
    );
    let workers: Vec<switchyard_api::WorkerInfo> = sw
        .client()
        .call_as(&switchyard_api::Request::WorkerList)
        .unwrap();
    assert!(
        workers[0].stalled_seconds >= switchyard_api::WORKER_STALL_LIMIT.as_secs_f64(),
        "{workers:?}"
    );
    assert!(sw.log().contains("stalled"), "{}", sw.log());
    // The process is alive and answers: only the probe notices. A restart
    // (the kubelet's, after the probe's failures) polls again.
    sw.assert_alive();
    sw.stop();
    sw.spawn();
    wait_for(Duration::from_secs(10), "`switchyard live` again", || {
        sw.cli(&["live"]).status.success().then_some(())
    });
}

/// The harness's own check: a switch that panics after the test's last
/// assertion fails the test (here, as expected).
#[test]
#[should_panic(expected = "the switch exited by itself (exit status: 101)")]
fn the_harness_fails_a_test_whose_switch_panics_after_its_last_assertion() {
    let _g = serial();
    let ns = Netns::new("late");
    let (mut sw, _fault) = faulty_switch(&ns, "panic");
    add_tap(&sw, "t0");
    assert_eq!(sw.port("t0").spec.name, "t0");
    // The last assertion passed; the worker panics after it. Waiting for
    // the end here only makes the order certain: the harness's drop finds
    // the exit.
    wait_for_exit(&mut sw);
    // try_wait reaped it: the harness must still know how it ended.
}
