#!/usr/bin/env python3
"""TCP through a switch, as a user's pods see it: two network namespaces,
each on a veth pair whose other end the device under test (DUT) switches,
and one iperf3 TCP stream between them with the kernel's default offloads
on (checksum offload, TSO, GRO).

DUTs, taking turns on the same veths within one run:
  linux-bridge  the kernel's own bridge: the reference for this machine
  switchyard    the switch, one worker, an uplink port on each veth
                (--kinds af-packet,af-xdp: one cell per kind; af-xdp:MODE
                names the port's --mode, e.g. af-xdp:native)
  linux-bridge-cut  the Linux bridge cutting super-frames to the MTU where
                they leave it (its ports' TSO and GSO off): what a receiver
                behind a switch that transmits no segmentation metadata
                (AF_XDP) takes, with no copy; a bound for af-xdp
  testpmd-af-xdp  DPDK testpmd io forwarding between two net_af_xdp ports:
                a minimal AF_XDP forwarder (native XDP: the stations' TSO
                off; their checksum offload off, testpmd finishes none)
  ovs-dpdk      Open vSwitch's userspace datapath (ovs-vswitchd-dpdk,
                datapath_type=netdev, NORMAL action, one PMD) with
                other_config:userspace-tso-enable=true, each veth a system
                port (netdev-linux)

Each cell is the median of --repeat runs of --seconds each (iperf3's
receiver rate, Gbit/s); every round starts with the next DUT, so every DUT
runs in every place of the sequence equally often, and the sy/DUT column
is the median of each round's ratio (runs next to each other share the
VM's state, which drifts up to 3x from minute to minute).

--build LABEL=PATH adds another Switchyard binary as DUT LABEL.

Run as root on an otherwise idle machine:
  cargo build --release -p switchyard
  benches/loop/tcp_bench.py [--dut linux-bridge,switchyard,ovs-dpdk]
                            [--kinds af-packet,af-xdp] [--repeat 5] [--seconds 5]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVS_VSWITCHD = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk"
NS = ("tb-a", "tb-b")
HOST = ("tbha", "tbhb")
IP = ("10.88.0.1", "10.88.0.2")


def sh(*args, check=True, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def in_ns(ns, *args, **kw):
    return sh("ip", "netns", "exec", ns, *args, **kw)


def make_stations():
    for ns, host, ip in zip(NS, HOST, IP):
        sh("ip", "netns", "del", ns, check=False)
        # A namespace's veth goes a moment after the namespace: at once.
        sh("ip", "link", "del", host, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", host)
        in_ns(ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        in_ns(ns, "ip", "link", "set", "eth0", "up")
        in_ns(ns, "ip", "link", "set", "lo", "up")
        sh("ip", "link", "set", host, "up")


def del_stations():
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


class LinuxBridge:
    name = "linux-bridge"

    def start(self):
        sh("ip", "link", "add", "tbbr", "type", "bridge")
        for h in HOST:
            sh("ip", "link", "set", h, "master", "tbbr")
        sh("ip", "link", "set", "tbbr", "up")

    def stop(self):
        sh("ip", "link", "del", "tbbr", check=False)


class LinuxBridgeCut(LinuxBridge):
    """The Linux bridge with segmentation offloads off on its two ports: the
    kernel cuts each super-frame to the MTU where it leaves the bridge, and
    the receiving station's stack takes 1448-byte segments, as it does
    behind any switch whose transmit path takes no segmentation metadata
    (an AF_XDP socket). A bound with no copy and no userspace."""

    name = "linux-bridge-cut"

    def start(self):
        super().start()
        for h in HOST:
            sh("ethtool", "-K", h, "tso", "off", "gso", "off")

    def stop(self):
        for h in HOST:
            sh("ethtool", "-K", h, "tso", "on", "gso", "on", check=False)
        super().stop()


class TestpmdAfXdp:
    """DPDK testpmd forwarding (io) between two net_af_xdp ports on the two
    veths: a minimal AF_XDP forwarder, no switching. Its XDP program is
    libxdp's, attached in native mode, which turns the stations' TSO off
    (a veth's peer loses it); testpmd finishes no checksum, so the
    stations' transmit checksum offload is off while it runs."""

    name = "testpmd-af-xdp"

    def start(self):
        for ns in NS:
            in_ns(ns, "ethtool", "-K", "eth0", "tx", "off")
        vdevs = []
        for i, h in enumerate(HOST):
            vdevs += ["--vdev", f"net_af_xdp{i},iface={h},start_queue=0,queue_count=1"]
        self.tmp = tempfile.mkdtemp(prefix="tb-tpx")
        self.log = open(os.path.join(self.tmp, "log"), "w")
        self.proc = subprocess.Popen(
            ["dpdk-testpmd", "-l", "0-1", "--no-pci", "--no-huge", "-m", "1024",
             "--file-prefix", "tb-tpx", *vdevs, "--", "--forward-mode=io",
             "--nb-cores=1", "--stats-period", "5"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        end = time.time() + 20
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"testpmd exited {self.proc.returncode}: "
                                   + open(os.path.join(self.tmp, "log")).read()[-2000:])
            if "packet forwarding - ports=" in open(os.path.join(self.tmp, "log")).read():
                break
            time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for ns in NS:
            in_ns(ns, "ethtool", "-K", "eth0", "tx", "on", check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


class SwitchProcess:
    """A switch with one worker and one bridge, "default", run from
    `binary` (in namespace `netns`, if given); `cli` is its command line.
    Checked when it stops: a non-zero exit or a panic in its log fails the
    run."""

    def __init__(self, binary, netns=None, poll_mode="adaptive"):
        self.tmp = tempfile.mkdtemp(prefix="sy-bench")
        cfg = os.path.join(self.tmp, "c.toml")
        with open(cfg, "w") as f:
            f.write(f'control_socket = "{self.tmp}/control.sock"\n'
                    f'state_dir = "{self.tmp}/state"\nsocket_dir = "{self.tmp}"\n'
                    f'[dataplane]\nworkers = 1\npoll_mode = "{poll_mode}"\n'
                    '[[bridge]]\nname = "default"\n')
        in_netns = ["ip", "netns", "exec", netns] if netns else []
        self.log_path = os.path.join(self.tmp, "log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([*in_netns, binary, "run", "--config", cfg],
                                         stdout=log, stderr=log)
        ctl = os.path.join(self.tmp, "control.sock")
        end = time.time() + 10
        while not os.path.exists(ctl) and time.time() < end:
            time.sleep(0.05)
        self.cli = [*in_netns, binary, "--control", ctl]

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=20)
        log = open(self.log_path).read()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if rc != 0 or "panicked at" in log:
            raise RuntimeError(f"switchyard exited {rc}:\n{log[-2000:]}")


class Switchyard:
    def __init__(self, name, binary, kind, poll_mode):
        self.name, self.binary, self.kind = name, binary, kind
        self.poll_mode = poll_mode
        self.switch = None

    def start(self):
        self.switch = SwitchProcess(self.binary, poll_mode=self.poll_mode)
        # A kind may name its af-xdp mode: af-xdp:native, af-xdp:generic.
        kind, _, mode = self.kind.partition(":")
        for i, h in enumerate(HOST):
            sh(*self.switch.cli, "port", "add", f"p{i}", "--kind", kind,
               *(["--mode", mode] if mode else []), "--interface", h, "--bridge", "default")

    def stop(self):
        if self.switch:
            self.switch.stop()
            self.switch = None


class OvsDpdk:
    name = "ovs-dpdk"

    def start(self):
        t = self.tmp = tempfile.mkdtemp(prefix="tb-ovs")
        self.env = dict(os.environ, OVS_RUNDIR=t, OVS_DBDIR=t, OVS_LOGDIR=t, OVS_SYSCONFDIR=t)
        db = os.path.join(t, "conf.db")
        sh("ovsdb-tool", "create", db, "/usr/share/openvswitch/vswitch.ovsschema", env=self.env)
        self.sock = os.path.join(t, "db.sock")
        self.procs = [subprocess.Popen(
            ["ovsdb-server", db, f"--remote=punix:{self.sock}", f"--pidfile={t}/ovsdb.pid",
             "--unixctl", f"{t}/ovsdb.ctl"], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        end = time.time() + 10
        while not os.path.exists(self.sock) and time.time() < end:
            time.sleep(0.05)
        self.vsctl("--no-wait", "init")
        self.vsctl("--no-wait", "set", "Open_vSwitch", ".", "other_config:dpdk-init=true",
                   "other_config:dpdk-lcore-mask=0x1", "other_config:pmd-cpu-mask=0x1",
                   "other_config:userspace-tso-enable=true",
                   f'other_config:dpdk-extra="--no-huge --legacy-mem -m 1024 --no-pci '
                   f'--file-prefix tb-ovs-{os.getpid()}"')
        self.procs.append(subprocess.Popen(
            [OVS_VSWITCHD, f"unix:{self.sock}", f"--pidfile={t}/vswitchd.pid", "--unixctl",
             f"{t}/vswitchd.ctl", f"--log-file={t}/vswitchd.log"], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
        for h in HOST:
            self.vsctl("add-port", "br0", h)
        self.vsctl("set", "interface", "br0", "admin_state=up")

    def vsctl(self, *args):
        return sh("ovs-vsctl", f"--db=unix:{self.sock}", "--timeout=30", *args, env=self.env)

    def stop(self):
        sh("ovs-appctl", "-t", f"{self.tmp}/vswitchd.ctl", "exit", check=False, timeout=20)
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def wait_reachable(limit=30, ns=NS[0], ip=IP[1]):
    end = time.time() + limit
    while time.time() < end:
        r = subprocess.run(["ip", "netns", "exec", ns, "busybox", "ping", "-c", "1", "-W", "1",
                            ip], capture_output=True)
        if r.returncode == 0:
            return
    raise RuntimeError(f"{ns} does not reach {ip}")


def tcp_gbps(seconds, client=NS[0], server=NS[1], server_ip=IP[1]):
    """One iperf3 stream from namespace `client` to `server_ip` in namespace
    `server`: the receiver's rate, Gbit/s."""
    srv = subprocess.Popen(["ip", "netns", "exec", server, "iperf3", "-s", "-1", "-B",
                            server_ip], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.time() + 10
        while ":5201 " not in in_ns(server, "ss", "-Hltn") and time.time() < end:
            time.sleep(0.05)
        out = in_ns(client, "iperf3", "-c", server_ip, "-t", str(seconds), "-J",
                    timeout=seconds + 30)
        v = json.loads(out)
        return v["end"]["sum_received"]["bits_per_second"] / 1e9
    finally:
        srv.kill()
        srv.wait()


def take_turns(duts, repeat, run):
    """`repeat` rounds of every DUT in turn, the order rotating each round
    (every DUT runs in every place of the sequence equally often): each is
    started, measured by `run(dut)` (its cells, {name: Gbit/s}) and
    stopped. Returns the rounds, each {(DUT name, cell): Gbit/s}."""
    rounds = []
    for r in range(repeat):
        got = {}
        for d in duts[r % len(duts):] + duts[:r % len(duts)]:
            try:
                d.start()
                cells = run(d)
            finally:
                d.stop()
            for c, v in cells.items():
                got[(d.name, c)] = v
                print(f"# round {r + 1}: {d.name}{' ' + c if c else ''} {v:.2f} Gbit/s",
                      flush=True)
        rounds.append(got)
    return rounds


def need_root_and_tools():
    """Exits unless run as root with iperf3 and busybox at hand."""
    if os.geteuid() != 0:
        sys.exit("run as root")
    for tool in ["iperf3", "busybox"]:
        if not shutil.which(tool):
            sys.exit(f"missing: {tool}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dut", default="linux-bridge,switchyard,ovs-dpdk")
    ap.add_argument("--kinds", default="af-packet,af-xdp")
    ap.add_argument("--poll-modes", default="adaptive",
                    help="Switchyard's poll_mode, one cell each: adaptive, interrupt, poll")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--build", action="append", default=[], help="LABEL=PATH")
    args = ap.parse_args()
    need_root_and_tools()
    builds = dict(b.split("=", 1) for b in args.build)
    release = os.path.join(REPO, "target", "release", "switchyard")
    duts = []
    for d in args.dut.split(","):
        if d == "linux-bridge":
            duts.append(LinuxBridge())
        elif d == "linux-bridge-cut":
            duts.append(LinuxBridgeCut())
        elif d == "testpmd-af-xdp":
            duts.append(TestpmdAfXdp())
        elif d == "ovs-dpdk":
            if not os.path.exists(OVS_VSWITCHD):
                sys.exit("missing: apt-get install openvswitch-switch-dpdk")
            duts.append(OvsDpdk())
        else:
            binary = builds.get(d, release)
            for k in args.kinds.split(","):
                for m in args.poll_modes.split(","):
                    name = f"{d}/{k}" + ("" if m == "adaptive" else f"/{m}")
                    duts.append(Switchyard(name, binary, k, m))
    results = {d.name: [] for d in duts}
    make_stations()
    try:
        offloads = in_ns(NS[0], "ethtool", "-k", "eth0")
        print("# station eth0: " + ", ".join(
            l.strip() for l in offloads.splitlines()
            if l.startswith(("tx-checksumming", "tcp-segmentation-offload",
                             "generic-receive-offload"))), flush=True)
        def run(d):
            wait_reachable()
            return {"": tcp_gbps(args.seconds)}

        rounds = [{n: v for (n, _), v in g.items()} for g in take_turns(duts, args.repeat, run)]
        for g in rounds:
            for n, v in g.items():
                results[n].append(v)
    finally:
        del_stations()
    others = [d.name for d in duts if not d.name.startswith("switchyard")]
    print(f"\n{'DUT':24} {'Gbit/s':>8}  " + "  ".join(f"{'sy/' + o:>18}" for o in others))
    for d in duts:
        line = f"{d.name:24} {statistics.median(results[d.name]):8.2f}  "
        if d.name.startswith("switchyard"):
            cells = []
            for o in others:
                ratios = [g[d.name] / g[o] for g in rounds if g.get(o)]
                cells.append(f"{statistics.median(ratios):18.2f}" if ratios else f"{'-':>18}")
            line += "  ".join(cells)
        print(line)


if __name__ == "__main__":
    main()
