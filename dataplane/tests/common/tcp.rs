//! TCP between stations (network namespaces with their own stacks, the
//! kernel's default offloads on): a file whose MD5 is compared, `iperf3`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{run_ok, wait_for, Netns};

/// A process run in a namespace, killed by PID when dropped.
pub struct Bg(pub Child);

impl Bg {
    pub fn start(ns: &Netns, args: &[&str]) -> Bg {
        Bg(Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{args:?}: {e}")))
    }

    /// Waits for the process to end (bounded) and returns its stdout; it
    /// must succeed.
    pub fn finish(mut self, what: &str) -> String {
        let status = wait_for(Duration::from_secs(120), what, || {
            self.0.try_wait().unwrap()
        });
        let mut out = String::new();
        let mut err = String::new();
        use std::io::Read;
        self.0
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{what} failed: {out}{err}");
        out
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One station: a namespace whose `eth0` is a veth to the switch's
/// namespace, at 10.66.0.`n`/24.
pub struct Station {
    pub ns: Netns,
    pub ip: String,
}

impl Station {
    /// Station `n`, whose veth's other end is `host_end` in `sw_ns` (the
    /// root namespace if `None`).
    pub fn attached(n: u8, sw_ns: Option<&Netns>, host_end: &str) -> Station {
        let ns = Netns::new(&format!("st{n}"));
        let mut add = Command::new("ip");
        add.args(["link", "add", "eth0", "netns", &ns.name, "type", "veth"])
            .args(["peer", "name", host_end]);
        if let Some(sw) = sw_ns {
            add.args(["netns", &sw.name]);
        }
        assert!(
            add.status().unwrap().success(),
            "ip link add eth0 type veth"
        );
        let ip = format!("10.66.0.{n}");
        ns.sh_ok(&format!(
            "ip addr add {ip}/24 dev eth0 && ip link set eth0 up && ip link set lo up"
        ));
        let up = format!("ip link set {host_end} up");
        match sw_ns {
            Some(sw) => {
                sw.sh_ok(&up);
            }
            None => {
                run_ok(Command::new("sh").args(["-c", &up]));
            }
        }
        Station { ns, ip }
    }

    /// [`Station::attached`], with an MTU of 1450 on its interface: a pod
    /// on an overlay, whose frames leave the node with VXLAN's 50 bytes
    /// more on a 1500-byte underlay.
    pub fn on_overlay(n: u8, sw_ns: Option<&Netns>, host_end: &str) -> Station {
        let st = Station::attached(n, sw_ns, host_end);
        st.ns.sh_ok("ip link set eth0 mtu 1450");
        st
    }

    /// Namespace `ns` as a station at `ip` (an address the caller gave
    /// one of its interfaces).
    pub fn at(ns: Netns, ip: &str) -> Station {
        Station {
            ns,
            ip: ip.to_string(),
        }
    }

    /// The MAC of its `eth0`.
    pub fn mac(&self) -> String {
        let out = self.ns.sh_ok("cat /sys/class/net/eth0/address");
        out.trim().to_string()
    }

    /// The offloads of its `eth0` as `ethtool -k` shows them.
    pub fn offloads(&self) -> String {
        self.ns.sh_ok("ethtool -k eth0")
    }

    /// Waits until something listens on TCP `port` in the namespace.
    pub fn wait_listening(&self, port: u16) {
        wait_listening(&self.ns, port);
    }
}

/// The host on the switch's bridge `default`: tap port `host` (interface
/// `sy-host`, 10.66.0.1/24) of switch `sw`, which runs in namespace `ns`.
pub fn host_on_tap(sw: &super::Switch, ns: Netns) -> Station {
    sw.cli_ok(&[
        "port",
        "add",
        "host",
        "--kind",
        "tap",
        "--interface",
        "sy-host",
        "--bridge",
        "default",
    ]);
    ns.sh_ok("ip addr add 10.66.0.1/24 dev sy-host && ip link set sy-host up");
    Station::at(ns, "10.66.0.1")
}

/// Waits until something listens on TCP `port` in namespace `ns`.
pub fn wait_listening(ns: &Netns, port: u16) {
    wait_for(
        Duration::from_secs(10),
        &format!("a listener on port {port} in {}", ns.name),
        || {
            let out = ns.sh_ok("ss -Hltn");
            out.contains(&format!(":{port} ")).then_some(())
        },
    );
}

/// Receives one TCP connection on `port` and prints the byte count and MD5
/// of what it carried (`listening` first, once it listens).
const SINK: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
c, _ = s.accept()
h = hashlib.md5()
n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    h.update(b)
    n += len(b)
print(n, h.hexdigest())
"#;

/// Sends the file `argv[3]` to `argv[1]:argv[2]` over TCP.
const SOURCE: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
with open(sys.argv[3], "rb") as f:
    s.sendall(f.read())
s.shutdown(socket.SHUT_WR)
s.recv(1)
"#;

/// `from` sends a file of random bytes to `to` over TCP; `to` must get
/// exactly its bytes.
pub fn transfer_file(from: &Station, to: &Station, dir: &std::path::Path) {
    let file = dir.join(format!("blob-{}", from.ip));
    let data: Vec<u8> = {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(from.ip.len() as u32);
        (0..8 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    std::fs::write(&file, &data).unwrap();
    let want = run_ok(Command::new("md5sum").arg(&file));
    let want = want.split_whitespace().next().unwrap().to_string();
    let sink = Bg::start(&to.ns, &["python3", "-c", SINK, &to.ip, "7001"]);
    to.wait_listening(7001);
    Bg::start(
        &from.ns,
        &[
            "python3",
            "-c",
            SOURCE,
            &to.ip,
            "7001",
            file.to_str().unwrap(),
        ],
    )
    .finish(&format!("sending a file from {} to {}", from.ip, to.ip));
    let got = sink.finish(&format!("receiving the file at {}", to.ip));
    assert_eq!(
        got.trim(),
        format!("{} {want}", data.len()),
        "the file from {} to {} arrived changed",
        from.ip,
        to.ip
    );
}

/// `iperf3` from `client` to `server` (and, `reverse`, the other way on
/// the same connection): 64 MB must arrive, whatever the time it takes.
pub fn iperf(client: &Station, server: &Station, reverse: bool) -> serde_json::Value {
    let srv = Bg::start(
        &server.ns,
        &["iperf3", "-s", "-1", "-B", &server.ip, "-p", "5301"],
    );
    server.wait_listening(5301);
    let mut args = vec!["iperf3", "-c", &server.ip, "-p", "5301", "-n", "64M", "-J"];
    if reverse {
        args.push("-R");
    }
    let out = Bg::start(&client.ns, &args).finish("iperf3 client");
    drop(srv);
    let v: serde_json::Value = serde_json::from_str(&out).expect("iperf3 -J output");
    // The sender's count is exact; the receiver's ends with its last
    // report interval, so it may miss the tail (the file transfers check
    // every byte).
    let sent = v["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
    let got = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(
        sent >= 64 << 20 && got >= 60 << 20,
        "iperf3 {} -> {}: {sent} bytes sent, {got} received: {out}",
        client.ip,
        server.ip
    );
    v
}
