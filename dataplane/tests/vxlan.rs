//! VXLAN tunnels over a routed underlay, against the Linux kernel's own
//! VXLAN and between two switches. The VTEPs sit in different subnets
//! with a router namespace between them (`ip_forward`), so the underlay is
//! routed, not one segment.

mod common;

use common::tcp::*;
use common::*;

const BRIDGE: &str = "[[bridge]]\nname = \"default\"\n";

/// A router namespace and `n` VTEP namespaces behind it, VTEP `i` at
/// 10.81.`i`.2 on a subnet of its own (the router is .1 on each).
struct Underlay {
    _router: Netns,
    vteps: Vec<Netns>,
}

impl Underlay {
    fn new(n: usize) -> Underlay {
        let router = Netns::new("vxr");
        router.sh_ok("sysctl -q -w net.ipv4.ip_forward=1 && ip link set lo up");
        let vteps = (1..=n)
            .map(|i| {
                let ns = Netns::new(&format!("vx{i}"));
                veth(&router, &format!("r{i}"), &ns, "ul");
                router.sh_ok(&format!("ip addr add 10.81.{i}.1/24 dev r{i}"));
                ns.sh_ok(&format!(
                    "ip link set lo up && ip addr add 10.81.{i}.2/24 dev ul && ip route add default via 10.81.{i}.1"
                ));
                ns
            })
            .collect();
        Underlay {
            _router: router,
            vteps,
        }
    }

    /// VTEP `i`'s address (from 1).
    fn ip(i: usize) -> String {
        format!("10.81.{i}.2")
    }
}

/// A kernel `vxlan` device in `ns` for VNI `vni` from `local` to `remote`,
/// with `addr` on it.
fn kernel_vtep(ns: &Netns, vni: u32, local: &str, remote: &str, addr: &str) {
    ns.sh_ok(&format!(
        "ip link add vx0 type vxlan id {vni} dstport 4789 local {local} remote {remote} dev ul && \
         ip addr add {addr}/24 dev vx0 && ip link set vx0 up"
    ));
}

/// The kernel device's error and drop counters, from `ip -s -s link`.
fn kernel_errors(ns: &Netns) -> String {
    let out = ns.sh_ok("ip -s -s -j link show vx0");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v[0]["stats64"];
    let mut bad = Vec::new();
    for dir in ["rx", "tx"] {
        for k in [
            "errors",
            "dropped",
            "over_errors",
            "crc_errors",
            "frame_errors",
        ] {
            let n = s[dir][k].as_u64().unwrap_or(0);
            if n > 0 {
                bad.push(format!("{dir} {k} {n}"));
            }
        }
    }
    bad.join(", ")
}

/// A pod (station 1: a namespace on a veth whose other end is an
/// af-packet port of the switch in VTEP 1) and the kernel's VXLAN in VTEP
/// 2, on VNI 42 across the routed underlay: ping, a file and `iperf3`
/// both ways, the kernel counting no error, the pod's MTU as the port
/// says.
#[test]
fn a_pod_and_the_kernels_vxlan_exchange_tcp_over_a_routed_underlay() {
    let _g = serial();
    let mut u = Underlay::new(2);
    let kernel = Station::at(u.vteps.pop().unwrap(), "10.66.0.2");
    let node = &u.vteps[0];
    let pod = Station::attached(1, Some(node), "p1");
    let sw = Switch::start_in(Some(&node.name), BRIDGE);
    sw.add_port(&["pod", "--kind", "af-packet", "--interface", "p1"]);
    sw.add_port(&[
        "node2",
        "--kind",
        "vxlan",
        "--remote",
        &Underlay::ip(2),
        "--local",
        &Underlay::ip(1),
        "--vni",
        "42",
    ]);
    kernel_vtep(
        &kernel.ns,
        42,
        &Underlay::ip(2),
        &Underlay::ip(1),
        &kernel.ip,
    );

    // The MTU a pod behind the tunnel takes: the underlay's 1500 less 50.
    let st = sw.port("node2").status;
    assert_eq!(st.mtu, Some(1450), "{st:?}");
    assert!(st.link_up, "{st:?}");
    pod.ns.sh_ok("ip link set eth0 mtu 1450");
    pod.ns.sh_ok("busybox ping -c 3 -W 2 10.66.0.2");
    // Learned on the tunnel: the kernel device's MAC.
    let kmac = kernel
        .ns
        .sh_ok("cat /sys/class/net/vx0/address")
        .trim()
        .to_string();
    let macs = sw.macs("default");
    assert!(
        macs.iter().any(|m| m.mac == kmac && m.port == "node2"),
        "{macs:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    transfer_file(&pod, &kernel, dir.path());
    transfer_file(&kernel, &pod, dir.path());
    iperf(&pod, &kernel, false);
    iperf(&pod, &kernel, true);
    assert_eq!(kernel_errors(&kernel.ns), "");
    let t = sw.stats("node2").totals;
    assert!(t.tx_packets > 10_000 && t.rx_packets > 10_000, "{t:?}");
}
