//! The CLI and control API against a running daemon (no DPDK needed).

mod common;

use common::Switch;

use std::os::unix::fs::{FileTypeExt, MetadataExt};

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
    // The socket's interface 0 is p's; the socket is memif's.
    let o = sw.cli(&[
        "port", "add", "q", "--kind", "memif", "--role", "master", "--socket", &sock,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("port.id: port \"p\" is interface 0"), "{err}");
    let o = sw.cli(&[
        "port",
        "add",
        "q",
        "--kind",
        "vhost-user",
        "--role",
        "server",
        "--socket",
        &sock,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("port.socket") && err.contains("used by port"),
        "{err}"
    );

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
    sw.expect_error("cannot restore port");
    sw.stop();
    sw.spawn();
    // Listed as failed, with why.
    assert_eq!(names(&sw), ["p", "q"]);
    let v: serde_json::Value =
        serde_json::from_str(&sw.cli_ok(&["port", "list", "--json"])).unwrap();
    for p in v.as_array().unwrap() {
        let why = p["status"]["failed"].as_str().unwrap_or_default();
        assert!(why.contains("outside the socket directory"), "{p}");
    }
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
    let err = refused_start(&sw.config);
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

/// Runs `switchyard run --config CONFIG` expecting it to refuse to start;
/// returns what it printed on stderr.
fn refused_start(config: &std::path::Path) -> String {
    let mut run = std::process::Command::new(common::switchyard_bin())
        .args(["run", "--config"])
        .arg(config)
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
    assert!(!status.success(), "{err}");
    err
}

#[test]
fn no_port_can_take_the_switchs_own_paths() {
    use switchyard_api::{ClientError, ErrorCode, KindSpec, MemifRole, MemifSpec, PortSpec};
    let sw = Switch::start("");
    let control = sw.control().display().to_string();
    let in_state = sw.dir.path().join("state/p.sock").display().to_string();
    let records = std::env::temp_dir()
        .join(switchyard_api::CNI_RECORDS_DIR)
        .join("p.sock")
        .display()
        .to_string();
    // From the CLI: every kind and role, on the control socket, in the
    // state directory and in the CNI plugin's records (the harness's
    // socket_dir is the temp root).
    for (socket, owner) in [
        (&control, "the switch's control socket (control_socket"),
        (&in_state, "in the switch's state directory (state_dir"),
        (&records, "in the CNI plugin's records"),
    ] {
        for (kind, role) in [
            ("memif", "master"),
            ("memif", "slave"),
            ("vhost-user", "server"),
            ("vhost-user", "client"),
        ] {
            let o = sw.cli(&[
                "port", "add", "p", "--kind", kind, "--role", role, "--socket", socket,
            ]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{kind} {role} on {socket} accepted");
            assert!(
                err.contains(&format!("port.socket: {socket} is {owner}")),
                "{kind} {role} on {socket}: {err}"
            );
        }
    }
    // From the API, spelled another way (a relative path from socket_dir).
    let relative = sw
        .control()
        .strip_prefix(std::env::temp_dir())
        .unwrap()
        .display()
        .to_string();
    let spec = PortSpec::new(
        "p",
        KindSpec::Memif(MemifSpec::new(
            MemifRole::Master,
            switchyard_api::SocketAddr::parse(&relative),
        )),
    );
    match sw.client().call(&switchyard_api::Request::PortAdd {
        port: Box::new(spec),
    }) {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
            assert!(e.message.contains("control socket"), "{e}");
        }
        other => panic!("accepted: {other:?}"),
    }
    // The control socket is still the switch's: the CLI reaches it, and
    // nothing was made.
    assert!(std::fs::metadata(sw.control())
        .unwrap()
        .file_type()
        .is_socket());
    assert_eq!(sw.cli_ok(&["port", "list"]).lines().count(), 1);

    // From the config file: the daemon does not start, and says why.
    let config = sw.dir.path().join("bad.toml");
    std::fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\nsocket_dir = \"{}\"\n[[port]]\nname = \"p\"\nkind = \"vhost-user\"\nrole = \"server\"\nsocket = \"{}\"\n",
            sw.dir.path().join("c2.sock").display(),
            std::env::temp_dir().display(),
            sw.dir.path().join("c2.sock").display(),
        ),
    )
    .unwrap();
    let err = refused_start(&config);
    assert!(
        err.contains("port[0].socket:") && err.contains("the switch's control socket"),
        "{err}"
    );
    assert!(!sw.dir.path().join("c2.sock").exists());
}

#[test]
fn a_socket_someone_listens_on_is_never_taken_a_stale_one_is() {
    use std::os::unix::net::{UnixDatagram, UnixListener};
    let sw = Switch::start("");
    let add = |name: &str, kind: &str, role: &str, socket: &str| {
        sw.cli(&[
            "port", "add", name, "--kind", kind, "--role", role, "--socket", socket,
        ])
    };
    // A live listener of another process, of the port's socket type or not
    // (a stream listener answers a memif seqpacket connect with
    // EPROTOTYPE): refused, and its socket is left where it is.
    let stream = sw.path("stream.sock");
    let _listener = UnixListener::bind(&stream).unwrap();
    let ino = std::fs::metadata(&stream).unwrap().ino();
    for (kind, role) in [("memif", "master"), ("vhost-user", "server")] {
        let o = add("p", kind, role, &stream);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{kind} took a live socket");
        assert!(err.contains("in use by another process"), "{kind}: {err}");
        assert_eq!(std::fs::metadata(&stream).unwrap().ino(), ino);
    }
    // A datagram socket bound there: also someone's.
    let dgram = sw.path("dgram.sock");
    let _d = UnixDatagram::bind(&dgram).unwrap();
    let o = add("p", "memif", "master", &dgram);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use by another process"));
    // A stale socket (its listener closed) is replaced.
    for (name, kind, role) in [("m", "memif", "master"), ("v", "vhost-user", "server")] {
        let stale = sw.path(&format!("stale-{name}.sock"));
        drop(UnixListener::bind(&stale).unwrap());
        let o = add(name, kind, role, &stale);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn a_persisted_port_on_the_control_socket_is_set_aside_shown_failed() {
    let mut sw = Switch::start("");
    sw.stop();
    // A state file as an older build could write it: a port on the control
    // socket, and a sound one.
    let state = sw.dir.path().join("state").join("state.json");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    let good = sw.path("good.sock");
    std::fs::write(
        &state,
        serde_json::json!({"version": 1, "bridges": [], "ports": [
            {"name": "k", "kind": "memif", "role": "master", "socket": sw.control()},
            {"name": "ok", "kind": "memif", "role": "master", "socket": good},
        ]})
        .to_string(),
    )
    .unwrap();
    sw.expect_error("cannot restore port");
    sw.spawn();
    // The API answers on its socket; the sound port is made; the other is
    // listed as failed, with why, and kept in the state.
    let list: Vec<switchyard_api::PortInfo> = sw
        .client()
        .call_as(&switchyard_api::Request::PortList)
        .unwrap();
    let by = |n: &str| list.iter().find(|p| p.spec.name == n).unwrap().clone();
    assert!(by("ok").status.failed.is_none());
    assert!(std::path::Path::new(&good).exists());
    let why = by("k").status.failed.expect("k failed");
    assert!(why.contains("the switch's control socket"), "{why}");
    let text = sw.cli_ok(&["port", "list"]);
    let line = text.lines().find(|l| l.starts_with("k ")).unwrap();
    assert!(
        line.contains("FAIL") && line.contains("control socket"),
        "{text}"
    );
    let saved = std::fs::read_to_string(&state).unwrap();
    assert!(saved.contains("\"k\""), "{saved}");
    // Restarted again: the same, the control socket still the switch's.
    sw.stop();
    sw.spawn();
    assert!(sw.cli_ok(&["port", "list"]).contains("FAIL"));
    // Deleting it drops it from the state.
    sw.cli_ok(&["port", "del", "k"]);
    let saved = std::fs::read_to_string(&state).unwrap();
    assert!(!saved.contains("\"k\""), "{saved}");
}
