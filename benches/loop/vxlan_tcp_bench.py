#!/usr/bin/env python3
"""TCP over the overlay, as a user's pod sees it: a pod on node 1 and a
host behind the Linux kernel's own VXLAN on node 2, one iperf3 stream each
way, the kernel's default offloads on everywhere (checksum offload, TSO;
the kernel's vxlan device segments and checksums in software where its
underlay cannot).

  pod (netns, veth eth0, MTU 1450) -- node 1 (DUT) --veth underlay-- node 2
                                                     (kernel vxlan vx0, VNI
                                                     42, the host's address)

DUTs on node 1, taking turns on the same veths within one run:
  kernel      a Linux bridge joining the pod's veth and a kernel vxlan
              device: what a user has without a switch (the reference)
  switchyard  the switch, one worker: the pod's veth an af-packet port, a
              vxlan port to node 2 (--kinds tap: the pod on a tap port)

Each cell is the median of --repeat runs of --seconds each (iperf3's
receiver rate, Gbit/s); the DUTs' order rotates each round, and the
sy/kernel column is the median of each round's ratio.

Run as root on an otherwise idle machine:
  cargo build --release -p switchyard
  benches/loop/vxlan_tcp_bench.py [--repeat 5] [--seconds 5]
"""

import argparse
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tcp_bench import (  # noqa: E402
    SwitchProcess, in_ns, need_root_and_tools, sh, take_turns, tcp_gbps, wait_reachable)

N1, N2, POD = "vb-n1", "vb-n2", "vb-pod"
UL = ("192.168.77.1", "192.168.77.2")
POD_IP, HOST_IP = "10.66.0.1", "10.66.0.2"
VNI = 42


def make_nodes():
    del_nodes()
    for ns in (N1, N2, POD):
        sh("ip", "netns", "add", ns)
        in_ns(ns, "ip", "link", "set", "lo", "up")
    # The underlay: one veth between the nodes.
    sh("ip", "link", "add", "ul", "netns", N1, "type", "veth", "peer", "name", "ul",
       "netns", N2)
    for ns, ip in zip((N1, N2), UL):
        in_ns(ns, "ip", "addr", "add", f"{ip}/24", "dev", "ul")
        in_ns(ns, "ip", "link", "set", "ul", "up")
    # The pod: its eth0, the other end (vbp) in node 1.
    sh("ip", "link", "add", "eth0", "netns", POD, "type", "veth", "peer", "name", "vbp",
       "netns", N1)
    in_ns(POD, "ip", "link", "set", "eth0", "mtu", "1450")
    in_ns(POD, "ip", "addr", "add", f"{POD_IP}/24", "dev", "eth0")
    in_ns(POD, "ip", "link", "set", "eth0", "up")
    in_ns(N1, "ip", "link", "set", "vbp", "up")
    # Node 2: the host behind the kernel's vxlan.
    in_ns(N2, "ip", "link", "add", "vx0", "type", "vxlan", "id", str(VNI), "dstport", "4789",
          "local", UL[1], "remote", UL[0], "dev", "ul")
    in_ns(N2, "ip", "addr", "add", f"{HOST_IP}/24", "dev", "vx0")
    in_ns(N2, "ip", "link", "set", "vx0", "up")


def del_nodes():
    for ns in (N1, N2, POD):
        sh("ip", "netns", "del", ns, check=False)


class Kernel:
    name = "kernel"

    def start(self):
        in_ns(N1, "ip", "link", "add", "vx0", "type", "vxlan", "id", str(VNI), "dstport",
              "4789", "local", UL[0], "remote", UL[1], "dev", "ul")
        in_ns(N1, "ip", "link", "add", "br0", "type", "bridge")
        for d in ("vx0", "vbp"):
            in_ns(N1, "ip", "link", "set", d, "master", "br0")
            in_ns(N1, "ip", "link", "set", d, "up")
        in_ns(N1, "ip", "link", "set", "br0", "up")

    def stop(self):
        in_ns(N1, "ip", "link", "del", "br0", check=False)
        in_ns(N1, "ip", "link", "del", "vx0", check=False)


class Switchyard:
    def __init__(self, binary):
        self.name = "switchyard"
        self.binary = binary
        self.switch = None

    def start(self):
        self.switch = SwitchProcess(self.binary, netns=N1)
        sh(*self.switch.cli, "port", "add", "pod", "--kind", "af-packet", "--interface", "vbp",
           "--bridge", "default")
        sh(*self.switch.cli, "port", "add", "node2", "--kind", "vxlan", "--remote", UL[1],
           "--local", UL[0], "--vni", str(VNI), "--bridge", "default")

    def stop(self):
        if self.switch:
            self.switch.stop()
            self.switch = None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "switchyard"))
    args = ap.parse_args()
    need_root_and_tools()
    duts = [Kernel(), Switchyard(args.binary)]
    ways = {"pod->host": (POD, N2, HOST_IP), "host->pod": (N2, POD, POD_IP)}
    make_nodes()
    try:
        def run(d):
            wait_reachable(ns=POD, ip=HOST_IP)
            return {w: tcp_gbps(args.seconds, c, s, ip) for w, (c, s, ip) in ways.items()}

        rounds = take_turns(duts, args.repeat, run)
    finally:
        del_nodes()
    print(f"\n{'DUT':12} {'way':10} {'Gbit/s':>8} {'sy/kernel':>10}")
    for d in duts:
        for w in ways:
            got = [g[(d.name, w)] for g in rounds]
            line = f"{d.name:12} {w:10} {statistics.median(got):8.2f}"
            if d.name == "switchyard":
                ratios = [g[("switchyard", w)] / g[("kernel", w)] for g in rounds]
                line += f" {statistics.median(ratios):10.2f}"
            print(line)


if __name__ == "__main__":
    main()
