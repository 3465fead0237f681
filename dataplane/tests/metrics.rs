//! Operability end to end: a real Prometheus server scrapes the switch's
//! metrics endpoint while testpmd traffic loops through it, and
//! `switchyard worker list` shows where the work goes.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{memif_vdev, serial, settled, wait_for, Switch, Testpmd};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` from 127.0.0.1:`port` over HTTP/1.0: the status line and
/// the body.
fn get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The value of sample `name{...}` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Percent-encodes a query string value.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server (Debian's `prometheus`) scraping one target every
/// second; killed by PID when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: u16) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: switchyard\n    static_configs:\n\
                 \x20     - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian: prometheus)");
        let p = Prometheus { child, port, dir };
        wait_for(Duration::from_secs(30), "prometheus ready", || {
            TcpStream::connect(("127.0.0.1", p.port))
                .ok()
                .map(|_| get(p.port, "/-/ready"))
                .filter(|(status, _)| status.contains("200"))
        });
        p
    }

    /// The JSON answer of an instant query.
    fn query(&self, q: &str) -> serde_json::Value {
        let (status, body) = get(self.port, &format!("/api/v1/query?query={}", encode(q)));
        assert!(status.contains("200"), "{status}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The value of a query that yields one sample.
    fn value(&self, q: &str) -> Option<f64> {
        let v = self.query(q);
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    /// Kills it; a Prometheus that had exited by itself (a crashed peer)
    /// fails the test.
    fn drop(&mut self) {
        let early = self.child.try_wait().ok().flatten();
        if std::thread::panicking() || early.is_some() {
            eprintln!("---- prometheus log ----\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let (Some(s), false) = (early, std::thread::panicking()) {
            panic!("prometheus exited during the test ({s})");
        }
    }
}

#[test]
fn prometheus_scrapes_the_switch_and_its_counters_move_under_traffic() {
    let _g = serial();
    let mport = free_port();
    let sw = Switch::start(&format!(
        "metrics_listen = \"127.0.0.1:{mport}\"\n[[bridge]]\nname = \"default\"\n"
    ));
    let mut socks = Vec::new();
    for p in ["a", "b"] {
        let sock = sw.path(&format!("{p}.sock"));
        sw.cli_ok(&[
            "port", "add", p, "--kind", "memif", "--role", "master", "--socket", &sock, "--bridge",
            "default",
        ]);
        socks.push(sock);
    }
    // A tunnel's series name the VTEP it goes to.
    sw.cli_ok(&[
        "port",
        "add",
        "vx",
        "--kind",
        "vxlan",
        "--remote",
        "127.0.0.2",
        "--local",
        "127.0.0.1",
        "--vni",
        "5",
        "--bridge",
        "default",
    ]);
    // A policer's series (one no traffic here reaches).
    sw.cli_ok(&[
        "port",
        "set",
        "b",
        "--tx-limit",
        "rate=10G,pps=100M,pps-burst=1M",
    ]);
    // Anything but /metrics is not found; /metrics parses before traffic.
    assert!(get(mport, "/").0.contains("404"));
    let (status, before) = get(mport, "/metrics");
    assert!(status.contains("200"), "{status}");
    for (name, want) in [
        ("switchyard_port_rate_limit_bits_per_second", 1e10),
        ("switchyard_port_rate_limit_burst_bits", 8e9),
        ("switchyard_port_rate_limit_packets_per_second", 1e8),
        ("switchyard_port_rate_limit_burst_packets", 1e6),
    ] {
        assert_eq!(
            sample(&before, name, &["port=\"b\"", "direction=\"tx\""]),
            Some(want),
            "{before}"
        );
        assert_eq!(sample(&before, name, &["port=\"a\""]), None, "{before}");
    }
    assert_eq!(
        sample(
            &before,
            "switchyard_port_link_up",
            &["port=\"vx\"", "kind=\"vxlan\"", "vtep=\"127.0.0.2\""]
        ),
        Some(1.0),
        "{before}"
    );
    sw.cli_ok(&["port", "del", "vx"]);
    assert_eq!(
        sample(&before, "switchyard_port_link_up", &["port=\"a\""]),
        Some(0.0)
    );

    let prom = Prometheus::start(mport);
    // A pod whose two ports loop frames through the bridge (io forwarding).
    let mut pod = Testpmd::start(
        &[
            memif_vdev(0, "client", &socks[0], "mac=02:00:00:00:0d:01"),
            memif_vdev(1, "client", &socks[1], "mac=02:00:00:00:0d:02"),
        ],
        &["--forward-mode=io"],
    );
    sw.wait_link("a", true);
    sw.wait_link("b", true);
    pod.send_bursts(1);

    // Prometheus scraped the target without error, and sees the frames
    // and the worker's time move between scrapes.
    wait_for(Duration::from_secs(30), "prometheus to see traffic", || {
        prom.value("rate(switchyard_port_rx_packets_total{port=\"a\"}[3s])")
            .filter(|&r| r > 0.0)
    });
    let targets = prom.query("up{job=\"switchyard\"}");
    assert_eq!(
        targets["data"]["result"][0]["value"][1].as_str(),
        Some("1"),
        "{targets}"
    );
    for q in [
        "switchyard_port_link_up{port=\"b\"}",
        "rate(switchyard_worker_busy_seconds_total[3s])",
        "rate(switchyard_queue_rx_packets_total{port=\"b\",queue=\"0\"}[3s])",
        "sum(rate(switchyard_worker_burst_frames_count[3s]))",
        // The loop's frames go to an unknown address: flooded, and both
        // sources learned.
        "rate(switchyard_bridge_flooded_packets_total{bridge=\"default\"}[3s])",
        "switchyard_bridge_mac_learned_total{bridge=\"default\"}",
    ] {
        let v = wait_for(Duration::from_secs(15), q, || {
            prom.value(q).filter(|&v| v > 0.0)
        });
        assert!(v > 0.0, "{q}");
    }
    assert_eq!(
        prom.value("switchyard_port_connects_total{port=\"a\"}"),
        Some(1.0)
    );
    // The exposition itself: counters grew, every family is typed.
    let (_, after) = get(mport, "/metrics");
    let rx = |t: &str| sample(t, "switchyard_port_rx_packets_total", &["port=\"a\""]).unwrap();
    assert!(rx(&after) > rx(&before) + 1000.0, "{after}");
    assert!(after.contains("# TYPE switchyard_worker_burst_frames histogram"));
    assert!(after.trim_end().ends_with("# EOF"));

    // The Grafana dashboard's queries: valid PromQL, naming only metrics
    // the switch exports.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../config/grafana/switchyard-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let v = prom.query(expr);
            assert_eq!(v["status"], "success", "{expr}: {v}");
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("switchyard_"))
            {
                let family = name
                    .trim_end_matches("_total")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count");
                assert!(
                    after.contains(&format!("# TYPE {family} ")),
                    "{expr}: {name} is not exported"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 10);

    // `worker list`: the one worker polls both queues, and they share its
    // busy time.
    let text = sw.cli_ok(&["worker", "list"]);
    assert!(text.contains("port a") && text.contains("port b"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&sw.cli_ok(&["worker", "list", "--json"])).unwrap();
    let w = &json[0];
    assert!(w["frames"].as_u64().unwrap() > 1000, "{w}");
    assert!(w["busy_seconds"].as_f64().unwrap() > 0.0, "{w}");
    let queues = w["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 2, "{w}");
    let share: f64 = queues
        .iter()
        .map(|q| q["busy_seconds"].as_f64().unwrap())
        .sum::<f64>()
        / w["busy_seconds"].as_f64().unwrap();
    assert!((0.5..=1.01).contains(&share), "queues' share {share}: {w}");
    drop(pod);
}

/// The worker polling each of the ports' receive queues, from `worker
/// list`.
fn queue_workers(sw: &Switch) -> std::collections::BTreeMap<String, u64> {
    let json: serde_json::Value =
        serde_json::from_str(&sw.cli_ok(&["worker", "list", "--json"])).unwrap();
    let mut m = std::collections::BTreeMap::new();
    for w in json.as_array().unwrap() {
        for q in w["queues"].as_array().unwrap() {
            m.insert(
                q["port"].as_str().unwrap().to_string(),
                w["id"].as_u64().unwrap(),
            );
        }
    }
    m
}

#[test]
fn two_workers_rebalance_unequal_queues_without_losing_frames() {
    let _g = serial();
    let sw = Switch::start(
        "[dataplane]\nworkers = 2\nrebalance_interval_secs = 2\nrebalance_load_percent = 50\n\
         [[bridge]]\nname = \"busy\"\n",
    );
    // testpmd owns four memif sockets and sends every frame back out of
    // the port it came in on (loop topology), to an unknown address.
    let socks: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|p| sw.path(&format!("{p}.sock")))
        .collect();
    let mut pod = Testpmd::start(
        &socks
            .iter()
            .enumerate()
            .map(|(i, s)| memif_vdev(i as u32, "server", s, &format!("mac=02:00:00:00:0e:0{i}")))
            .collect::<Vec<_>>(),
        // mac forwarding: each frame leaves with its port's own source
        // MAC (io would send a's frames back from c with a's address).
        &["--forward-mode=mac", "--port-topology=loop"],
    );
    // The switch connects one port at a time, so the queues are placed in
    // this order, each on the worker with the fewest: a and c on one, b
    // and d on the other. a and c loop frames through bridge `busy`; b
    // and d are in no bridge (quiet after testpmd's first burst).
    for (p, s) in ["a", "b", "c", "d"].iter().zip(&socks) {
        let mut args = vec![
            "port", "add", p, "--kind", "memif", "--role", "slave", "--socket", s,
        ];
        if *p == "a" || *p == "c" {
            args.extend(["--bridge", "busy"]);
        }
        sw.cli_ok(&args);
        sw.wait_link(p, true);
    }
    let before = queue_workers(&sw);
    assert_eq!(before["a"], before["c"], "{before:?}");
    assert_ne!(before["a"], before["b"], "{before:?}");

    // One worker carries all the traffic: after two seconds at over 50%
    // busy, the balancer gives one of its queues to the other.
    pod.send_bursts(1);
    let after = wait_for(Duration::from_secs(30), "a rebalance", || {
        Some(queue_workers(&sw)).filter(|m| m["a"] != m["c"])
    });
    wait_for(Duration::from_secs(5), "the rebalance logged", || {
        sw.log().contains("rebalanced receive queues").then_some(())
    });
    // Both workers now carry frames.
    let frames = |sw: &Switch| -> Vec<u64> {
        let json: serde_json::Value =
            serde_json::from_str(&sw.cli_ok(&["worker", "list", "--json"])).unwrap();
        json.as_array()
            .unwrap()
            .iter()
            .map(|w| w["frames"].as_u64().unwrap())
            .collect()
    };
    let f0 = frames(&sw);
    wait_for(Duration::from_secs(10), "both workers to forward", || {
        let f1 = frames(&sw);
        (f1[0] > f0[0] + 1000 && f1[1] > f0[1] + 1000).then_some(())
    });

    // No frame was lost in the move: stopped, every frame a received went
    // out of c and the other way round, and nothing was dropped.
    pod.pause();
    let (a, c) = settled("the counters of a and c", || {
        (sw.stats("a").totals, sw.stats("c").totals)
    });
    assert_eq!(a.drops.values().sum::<u64>(), 0, "{a:?}");
    assert_eq!(c.drops.values().sum::<u64>(), 0, "{c:?}");
    assert_eq!(a.rx_packets, c.tx_packets, "a {a:?} c {c:?}");
    assert_eq!(c.rx_packets, a.tx_packets, "a {a:?} c {c:?}");
    assert!(a.rx_packets > 100_000, "{a:?}");
    eprintln!("queues before {before:?}, after {after:?}");
    drop(pod);
}
