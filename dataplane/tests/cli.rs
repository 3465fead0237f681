//! The CLI and control API against a running daemon (no DPDK needed).

mod common;

use common::Switch;

use std::os::unix::fs::MetadataExt;

#[test]
fn bad_requests_get_errors_naming_the_field() {
    let sw = Switch::start("[[bridge]]\nname = \"default\"\n");
    let sock = sw.path("x.sock");
    let o = sw.cli(&[
        "port",
        "add",
        "p",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sock,
        "--ring-size",
        "1000",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ring_size"), "{err}");

    let o = sw.cli(&[
        "port", "add", "p", "--kind", "memif", "--role", "boss", "--socket", &sock,
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("role"));

    let o = sw.cli(&[
        "port", "add", "p", "--kind", "memif", "--role", "master", "--socket", &sock, "--bridge",
        "nope",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no bridge named"));

    sw.cli_ok(&[
        "port", "add", "p", "--kind", "memif", "--role", "master", "--socket", &sock, "--bridge",
        "default",
    ]);
    let o = sw.cli(&[
        "port",
        "add",
        "p",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("y.sock"),
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("exists"));
    let o = sw.cli(&[
        "port", "add", "q", "--kind", "memif", "--role", "master", "--socket", &sock,
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("used by port"));

    let o = sw.cli(&["bridge", "del", "default"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("still has ports"));
    let o = sw.cli(&["port", "del", "nope"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no port named"));

    let json = sw.cli_ok(&["port", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["name"], "p");
    assert_eq!(v[0]["status"]["link_up"], false);

    // VLAN membership: access, trunk list, or untagged-only (the default),
    // shown as such; a socket group opens the socket to that group.
    let o = sw.cli(&[
        "port",
        "add",
        "t",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("t.sock"),
        "--vlan",
        "5",
        "--trunk",
        "6",
    ]);
    assert!(!o.status.success());
    let o = sw.cli(&[
        "port",
        "add",
        "t",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("t.sock"),
        "--trunk",
        "7-4095",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("4095 is not a VLAN id"));
    sw.cli_ok(&[
        "port",
        "add",
        "t",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("t.sock"),
        "--trunk",
        "200,100-102,0",
        "--socket-group",
        "4242",
    ]);
    let meta = std::fs::metadata(sw.path("t.sock")).unwrap();
    assert_eq!(
        (meta.mode() & 0o777, meta.gid()),
        (0o660, 4242),
        "the socket is the group's"
    );
    let list = sw.cli_ok(&["port", "list"]);
    let row = |name: &str| {
        list.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{list}"))
            .to_string()
    };
    assert!(row("t ").contains("trunk:0,100-102,200"), "{list}");
    assert!(row("p ").contains("untagged"), "{list}");
    let v: serde_json::Value =
        serde_json::from_str(&sw.cli_ok(&["port", "list", "--json"])).unwrap();
    let t = v
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "t")
        .unwrap();
    assert_eq!(t["trunk"], "0,100-102,200");
    assert_eq!(t["socket_group"], 4242);
    sw.cli_ok(&["port", "del", "t"]);
    sw.cli_ok(&["port", "del", "p"]);
    assert!(
        !std::path::Path::new(&sock).exists(),
        "socket removed with the port"
    );
    sw.cli_ok(&["bridge", "del", "default"]);
    assert!(sw.cli_ok(&["bridge", "list"]).lines().count() == 1);
}

#[test]
fn a_second_daemon_on_the_same_control_socket_is_refused() {
    let sw = Switch::start("");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["run", "--config"])
        .arg(&sw.config)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use"));
}

#[test]
fn sockets_outside_the_socket_dir_are_refused() {
    // The harness's socket_dir is the temp root, which holds `sw.dir`.
    let sw = Switch::start("");
    let refused = |socket: &str, why: &str| {
        let o = sw.cli(&[
            "port",
            "add",
            "p",
            "--kind",
            "vhost-user",
            "--role",
            "server",
            "--socket",
            socket,
        ]);
        assert!(!o.status.success(), "{socket} accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("port.socket") && err.contains(why),
            "{socket}: {err}"
        );
    };
    refused("/etc/switchyard-evil.sock", "outside the socket directory");
    refused(
        &format!("{}/../../etc/switchyard-evil.sock", sw.dir.path().display()),
        "'..' is not allowed",
    );
    std::os::unix::fs::symlink("/etc", sw.dir.path().join("etc")).unwrap();
    refused(
        &sw.path("etc/switchyard-evil.sock"),
        "outside the socket directory",
    );
    assert!(!std::path::Path::new("/etc/switchyard-evil.sock").exists());
    assert!(sw.cli_ok(&["port", "list"]).lines().count() <= 1);

    // A relative socket is taken from socket_dir, and listed resolved.
    let rel = format!(
        "{}/r.sock",
        sw.dir.path().file_name().unwrap().to_str().unwrap()
    );
    sw.cli_ok(&[
        "port", "add", "r", "--kind", "memif", "--role", "master", "--socket", &rel,
    ]);
    assert!(std::path::Path::new(&sw.path("r.sock")).exists());
    let json = sw.cli_ok(&["port", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["socket"], sw.path("r.sock"));
}

#[test]
fn a_port_that_cannot_be_restored_stays_in_the_state() {
    let mut sw = Switch::start("");
    sw.cli_ok(&[
        "port",
        "add",
        "p",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("p.sock"),
    ]);
    sw.cli_ok(&[
        "port",
        "add",
        "q",
        "--kind",
        "memif",
        "--role",
        "master",
        "--socket",
        &sw.path("q.sock"),
    ]);
    let names = |sw: &Switch| -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&sw.cli_ok(&["port", "list", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    // The socket directory moves: the ports are outside it now.
    let original = std::fs::read_to_string(&sw.config).unwrap();
    let elsewhere = sw.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let moved: String = original
        .lines()
        .map(|l| {
            if l.starts_with("socket_dir") {
                format!("socket_dir = \"{}\"\n", elsewhere.display())
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&sw.config, moved).unwrap();
    sw.stop();
    sw.spawn();
    assert!(names(&sw).is_empty());
    assert!(sw.log().contains("cannot restore port"));
    // Another change to the state keeps them; deleting one drops it.
    sw.cli_ok(&["port", "del", "q"]);
    // Put back, they return, except the deleted one.
    std::fs::write(&sw.config, original).unwrap();
    sw.stop();
    sw.spawn();
    assert_eq!(names(&sw), ["p"]);
}

/// The state files in `tests/fixtures/state/`, one of each released format.
fn state_fixtures() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state");
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    all.sort();
    assert!(!all.is_empty());
    all
}

#[test]
fn a_state_file_of_every_released_format_restores() {
    let _g = common::serial();
    for fixture in state_fixtures() {
        let ns = common::Netns::new("state");
        let mut sw = Switch::start_in(Some(&ns.name), "[[bridge]]\nname = \"default\"\n");
        sw.stop();
        let tap = format!("syst{}", std::process::id() % 100_000);
        let text = std::fs::read_to_string(&fixture)
            .unwrap()
            .replace("@DIR@", sw.dir.path().to_str().unwrap())
            .replace("@TAP@", &tap);
        let want: serde_json::Value = serde_json::from_str(&text).unwrap();
        let state_dir = sw.dir.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        std::fs::write(state_dir.join("state.json"), &text).unwrap();
        sw.spawn();
        let what = fixture.display();
        // Every bridge and port, with the spec the file gave it.
        let bridges = sw.cli_ok(&["bridge", "list"]);
        for b in want["bridges"].as_array().unwrap() {
            assert!(
                bridges.contains(b["name"].as_str().unwrap()),
                "{what}: {bridges}"
            );
        }
        let ports = want["ports"].as_array().unwrap();
        for p in ports {
            let info = sw.port(p["name"].as_str().unwrap());
            assert_eq!(serde_json::to_value(&info.spec).unwrap(), *p, "{what}");
        }
        // Pinned MACs are pinned again: another port cannot take them.
        let (owner, mac) = ports
            .iter()
            .find_map(|p| p["macs"].as_array().map(|m| (p, m[0].as_str().unwrap())))
            .unwrap_or_else(|| panic!("{what}: every fixture pins a MAC"));
        let sock = sw.path("thief.sock");
        let o = sw.cli(&[
            "port",
            "add",
            "thief",
            "--kind",
            "memif",
            "--role",
            "master",
            "--socket",
            &sock,
            "--bridge",
            owner["bridge"].as_str().unwrap(),
            "--vlan",
            &owner["vlan"].to_string(),
            "--mac",
            mac,
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("is pinned to port"),
            "{what}: {err}"
        );
        // The next save writes this build's format, every port kept.
        sw.cli_ok(&["bridge", "add", "green"]);
        let saved: serde_json::Value =
            serde_json::from_slice(&std::fs::read(state_dir.join("state.json")).unwrap()).unwrap();
        assert_eq!(saved["version"], 1, "{what}");
        assert_eq!(
            saved["ports"].as_array().unwrap().len(),
            ports.len(),
            "{what}"
        );
        // Taps outlive the switch: deleted here, not left in the namespace.
        for p in ports.iter().filter(|p| p["kind"] == "tap") {
            sw.cli_ok(&["port", "del", p["name"].as_str().unwrap()]);
        }
    }
}

#[test]
fn a_newer_state_format_is_refused_not_dropped() {
    let mut sw = Switch::start("");
    sw.stop();
    let state = sw.dir.path().join("state").join("state.json");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    let newer = br#"{"version": 2, "bridges": [{"name": "b"}], "ports": []}"#;
    std::fs::write(&state, newer).unwrap();
    let mut run = std::process::Command::new(common::switchyard_bin())
        .args(["run", "--config"])
        .arg(&sw.config)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = common::wait_for(
        std::time::Duration::from_secs(10),
        "the daemon to refuse",
        || run.try_wait().unwrap(),
    );
    let mut err = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("state format 2, newer than this build's 1"),
        "{err}"
    );
    // The file is as it was: nothing set aside, nothing overwritten.
    assert_eq!(std::fs::read(&state).unwrap(), newer);
    assert_eq!(
        std::fs::read_dir(state.parent().unwrap()).unwrap().count(),
        1
    );
}
