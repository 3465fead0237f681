#!/usr/bin/env python3
"""End-to-end loop benchmark: one DPDK testpmd (io forwarding, `tx_first`)
with two ports, and a device under test (DUT) between them that carries
every frame from one port to the other and back:

  testpmd port 0 -> DUT -> testpmd port 1 -> (io fwd) -> DUT -> port 0 ...

DUTs, each on CPU 0 (testpmd's forwarding lcore is on CPU 1):
  switchyard   the switch, one poll-mode worker, both ports in one bridge
  testpmd-io   a second testpmd in io mode: forwarding without switching,
               the cost floor
  ovs-dpdk     Open vSwitch with DPDK (netdev bridge, NORMAL action, one PMD)

Port kinds: memif (DUT is memif server/master), vhost-server (DUT is the
vhost-user socket server), vhost-client (DUT connects to testpmd's
virtio_user in server mode), af-packet (an uplink cell: the generator's
port 0 is DPDK's net_af_packet on one end of a veth pair, the DUT's port a
is its AF_PACKET uplink on the other end - Switchyard's af-packet kind,
DPDK's net_af_packet for testpmd-io and OVS-DPDK - and port 1 / b is
memif as in the memif cell), af-xdp (the same uplink cell with the DUT's
port a on AF_XDP: Switchyard's af-xdp kind, DPDK's net_af_xdp for
testpmd-io and OVS-DPDK; the generator stays on net_af_packet unless
--uplink-generator af-xdp puts it on net_af_xdp). With net_af_xdp the
generator is hostgen (below, one host per side: learned unicast as
testpmd's mac forwarding sends), which can give its two ports different
queues: net_af_xdp on a veth of one queue has one, and OVS-DPDK's memif
port needs two (its PMD sends on queue 1); testpmd gives every port the
same. vxlan (the overlay cell): two DUT instances, one per node, each in
a network namespace of its own with a veth between them (the underlay,
MTU 1600 so that 1518-byte frames fit encapsulated): the generator's port
0 is a memif of node A's instance, port 1 a memif of node B's, and each
instance carries its frames to the other in VXLAN (VNI 42) - Switchyard's
vxlan port (a kernel UDP socket, the kernel routing it over the veth) and
OVS-DPDK's userspace tunnel (a vxlan port on br-int, br-phy with the
VTEP's address on DPDK's net_af_xdp on the veth, OVS's own ARP entry). Both instances' workers share the DUT's CPU. Frame sizes 64
and 1518 bytes.

Traffic (--traffic): `learned` (default) - the generator's ports have their
own MACs and address each other (testpmd mac forwarding, --eth-peer), so a
switching DUT learns both and looks up every frame; `flood` - io forwarding
of tx_first's frames to an address nobody has (unknown unicast, flooded).

Memory (--memory): `hugepages` - the generator and the DPDK DUTs (testpmd-io,
OVS-DPDK) run on 2 MiB hugepages the benchmark reserves (and gives back);
`no-huge` - all of them on ordinary pages (--no-huge). Switchyard has no
packet buffers of its own: it copies each frame from one peer's memory into
the other's, so its memory is the generator's. Give both to compare.

Generator memif (--memif-generator): `zero-copy` (default) - the
generator's memif ports are DPDK zero-copy clients, whose mbufs are the
memif buffers (it copies nothing; every DUT reads and writes the
generator's mbufs); `copy` - copy mode, where the generator copies every
frame twice (into its mbuf on receive, out of it on send) and was what
limited the memif loop (the DUT waiting, Switchyard 9-36 Mpps from run to
run at 64 B).

Queues: the memif cell gives every DUT two queue pairs (and the generator
two per port), so every DUT has the same frames in flight (OVS's PMD sends
on queue 1, so it needs two); the other cells one.

--rtt adds a short-loop cell per kind: one frame in flight per port and
queue (`set burst 1`, `tx_first 1`), so the loop's rate is (frames in
flight)/RTT; it reports the median round trip (generator port -> DUT ->
generator port, the generator's turnaround included) per DUT.

Frame sizes count the CRC, as RFC 2544 does: a "64-byte" frame carries 60
bytes in the buffer. `--sizes imix` adds the standard IMIX cell: 64, 576
and 1518-byte frames put in flight 7:4:1 (12 bursts per port and queue
instead of --bursts), whose Gbit/s use the mix's mean size. Throughput is the sum of both testpmd ports' Rx-pps over
a measuring window after a warm-up: the frames the DUT delivered, both
directions together. Gbit/s is pps * size * 8 (no preamble or gap). Each cell is the
median of --repeat runs.

Ratios (sy/DUT columns) pair the runs of a round: each round's ratio of
Switchyard's run over the other DUT's, which ran just before or after it,
and the median of those, with each round's shown. This VM changes speed
by up to 3x from minute to minute; the two DUTs' medians may come from
rounds in different states, a round's two runs mostly share one. Each
round starts with the next DUT, so every DUT runs in every place of the
sequence equally often.

--build LABEL=PATH adds another Switchyard binary as DUT LABEL (name it in
--dut): builds compared taking turns in one run, e.g.
  --dut switchyard,base,testpmd-io --build base=/tmp/switchyard-main

The machine's state: before each round the script samples for 1 s how long
a cache line takes from the DUT's CPU to the generator's and back
(`cacheline_rtt`, benches/src/bin/cacheline_rtt.rs) and prints it; on a VM
it jumps with where the host runs the vCPUs, and every shared-memory loop
with it. The measuring window is read in 0.5 s slices (testpmd-generated
cells): a second table gives each cell's median slice, the rate in the
machine's most frequent state. LOOP_BENCH_PERF=DIR records the DUT's CPU
and the generator's with perf for 2 s after each measuring window;
LOOP_BENCH_COUNTERS=1 prints the DUT's own counters after every run (where
frames were dropped), not only after a run that carried nothing.

Run as root on an otherwise idle machine (see docs/benchmarks.md):
  cargo build --release -p switchyard
  benches/loop/loop_bench.py [--dut switchyard,testpmd-io,ovs-dpdk]
                             [--kinds memif,vhost-server,vhost-client,af-packet,af-xdp,vxlan]
                             [--sizes 64,1518,imix] [--repeat 3] [--seconds 5]
                             [--memory hugepages,no-huge] [--traffic learned]
                             [--rtt]
"""

import argparse
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTPMD = "/usr/bin/dpdk-testpmd"
OVS_VSWITCHD = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk"
DUT_CPU = 0
GEN_CPU = 1
GEN_LCORES = f"0@{DUT_CPU},1@{GEN_CPU}"  # main lcore (idle) on the DUT's CPU, forwarding on its own
QUEUE = 1024
# The veth pair of the uplink cells: the DUT's end and the generator's.
DUT_IF = f"sylbd{os.getpid() % 100000}"
GEN_IF = f"sylbg{os.getpid() % 100000}"


UPLINKS = ("af-packet", "af-xdp")
# The overlay cell: two instances in two namespaces, VXLAN over a veth.
VXLAN = "vxlan"
VX_NS = (f"sylbva{os.getpid() % 100000}", f"sylbvb{os.getpid() % 100000}")
VX_IF = ("vxa", "vxb")
VX_IP = ("10.99.0.1", "10.99.0.2")
VX_MTU = 1600
VX_VNI = 42
# The two instances share the DUT's CPU: each sleeps when it finds nothing
# to do, so that the other runs (Switchyard's adaptive mode wakes on its
# ports' events; OVS 3.1's PMD sleeps up to pmd-maxsleep microseconds).
# Busy-polling both, the scheduler's time slices set the rate.
VX_POLL_MODE = os.environ.get("LOOP_BENCH_VX_POLL", "adaptive")
VX_OVS_MAXSLEEP = int(os.environ.get("LOOP_BENCH_VX_MAXSLEEP", "50"))
# The generator's ports' MACs (learned traffic addresses each to the other).
GEN_MACS = ("02:00:00:00:00:0a", "02:00:00:00:00:0b")
# The IMIX cell: frame sizes (CRC counted) and how many bursts of each are
# put in flight, the standard 7:4:1 (`--sizes imix`; 0 stands for it).
IMIX = 0
IMIX_MIX = ((64, 7), (576, 4), (1518, 1))
IMIX_MEAN = sum(s * n for s, n in IMIX_MIX) / sum(n for _, n in IMIX_MIX)
# Hugepages reserved for one run: the generator (512 MiB), a testpmd-io DUT
# (512 MiB) or OVS-DPDK (1024 MiB), with room to spare.
HUGEPAGES = 1024


class Settings:
    """What the current configuration runs with (set by main)."""

    memory = "no-huge"
    traffic = "learned"
    huge_dir = None
    # The many-hosts cell's hosts per side (None: the generator is testpmd).
    hosts = None
    # The generator's memif ports are zero-copy clients.
    memif_zero_copy = False
    # The generator's port on the veth in the uplink cells.
    uplink_generator = "af-packet"
    # The policy cell's rules on port b's ingress (None: no policy).
    policy = None


def variant():
    """What a cell's runs are keyed by besides DUT, kind and size: its
    hosts per side, or its policy's rules."""
    return SET.hosts if SET.policy is None else f"policy {SET.policy}"


# The policy cell: the generator's frames (testpmd's template, IPv4/UDP
# from 198.18.0.1:9 to 198.18.0.2:9 both ways) and the rules in front of
# port b: `n` - 1 that do not match them (a /24 and a UDP port each, as
# many NetworkPolicy peers with ports), then the one that allows them.
def policy_rules(n):
    """The cell's rules as (CIDR, UDP port), the allowing one last."""
    return ([(f"10.{1 + i // 256}.{i % 256}.0/24", 3000 + i) for i in range(1, n)]
            + [("198.18.0.0/24", 9)])


def mac_table_size(hosts):
    """The MAC table the switching DUTs get: room for both sides' `hosts`
    (None: the generator's two)."""
    return max(16384, 4 * (hosts or 0))


SET = Settings()


LOCK = os.path.join(tempfile.gettempdir(), "switchyard-loop-bench.lock")
# The hugetlbfs mounts Hugepages makes are temporary directories named so.
HUGE_MOUNT_PREFIX = "sy-huge-"
# The open lock file: held (flock) until the process exits.
LOCK_FILE = None


def one_at_a_time():
    """Takes the benchmark's lock, or exits: two runs at once would share
    the CPUs (every figure of both would be wrong) and the hugepage mount
    (the first to finish could not unmount it). Also unmounts the
    hugetlbfs mounts an earlier run killed before its cleanup left."""
    global LOCK_FILE
    f = open(LOCK, "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(f"another loop_bench.py is running (lock {LOCK}): one at a time, or "
                 "both measure each other")
    f.write(f"{os.getpid()}\n")
    f.flush()
    stale = os.path.join(tempfile.gettempdir(), HUGE_MOUNT_PREFIX)
    for where, _ in hugetlbfs_mounts():
        if where.startswith(stale):
            if subprocess.run(["umount", where], capture_output=True).returncode == 0:
                os.rmdir(where)
                print(f"# unmounted {where}, left by a run that did not finish",
                      file=sys.stderr)
    LOCK_FILE = f


def hugetlbfs_mounts():
    """The hugetlbfs mounts in /proc/mounts: (directory, mount options)."""
    with open("/proc/mounts") as f:
        return [(m[1], m[3]) for m in (line.split() for line in f) if m[2] == "hugetlbfs"]


class Hugepages:
    """Reserves 2 MiB hugepages (and a hugetlbfs mount if there is none) and
    gives them back when closed."""

    NR = "/proc/sys/vm/nr_hugepages"

    def __init__(self, pages):
        self.prev = int(open(self.NR).read())
        self.mounted = None
        self.dir = None
        self.ok = False
        try:
            with open(self.NR, "w") as f:
                f.write(str(max(self.prev, pages)))
            total = int(open(self.NR).read())
            if total < pages:
                print(f"# only {total} of {pages} hugepages could be reserved",
                      file=sys.stderr)
                return
            for where, options in hugetlbfs_mounts():
                if "pagesize=1G" not in options:
                    self.dir = where
                    break
            if self.dir is None:
                self.dir = tempfile.mkdtemp(prefix=HUGE_MOUNT_PREFIX)
                subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "nodev",
                                self.dir], check=True)
                self.mounted = self.dir
            self.ok = True
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"# no hugepages: {e}", file=sys.stderr)

    def close(self):
        if self.mounted:
            subprocess.run(["umount", self.mounted], capture_output=True)
            os.rmdir(self.mounted)
        try:
            with open(self.NR, "w") as f:
                f.write(str(self.prev))
        except OSError:
            pass


def eal_memory(mb):
    """EAL memory options for the current configuration."""
    if SET.memory == "hugepages":
        # One file per memseg list: virtio_user shares its memory with the
        # vhost-user backend as a handful of fds (vhost-user allows 8
        # regions), not one per 2 MiB page. The files stay while the
        # process runs (the backend maps them); clean_hugepages removes
        # them after each run.
        return ["-m", str(mb), "--huge-dir", SET.huge_dir, "--single-file-segments"]
    # One file per memseg list here too: memif zero-copy clients share it.
    return ["--no-huge", "-m", str(mb), "--single-file-segments"]


def clean_hugepages():
    """Removes the hugepage files this benchmark's DPDK processes left."""
    if SET.memory != "hugepages" or not SET.huge_dir:
        return
    tag = str(os.getpid())
    for f in os.listdir(SET.huge_dir):
        if tag in f:
            try:
                os.unlink(os.path.join(SET.huge_dir, f))
            except OSError:
                pass


def make_veth():
    subprocess.run(["ip", "link", "del", DUT_IF], capture_output=True)
    subprocess.run(["ip", "link", "add", DUT_IF, "type", "veth", "peer", "name", GEN_IF],
                   check=True)
    for i in (DUT_IF, GEN_IF):
        # No IPv6 chatter of the host's own in the measured loop.
        subprocess.run(["sysctl", "-q", "-w", f"net.ipv6.conf.{i}.disable_ipv6=1"],
                       capture_output=True)
        subprocess.run(["ip", "link", "set", i, "up"], check=True)
    # The generator's end has the generator's port-0 MAC (learned traffic).
    subprocess.run(["ip", "link", "set", GEN_IF, "address", GEN_MACS[0]], check=True)


def del_veth():
    subprocess.run(["ip", "link", "del", DUT_IF], capture_output=True)


def make_underlay(addresses):
    """The vxlan cell's two namespaces and the veth between them (MTU
    VX_MTU); with `addresses`, the VTEPs' addresses on the veth ends (the
    kernel's UDP carries Switchyard's tunnels; OVS keeps its own)."""
    del_underlay()
    for ns in VX_NS:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "link", "add", VX_IF[0], "netns", VX_NS[0], "mtu", str(VX_MTU),
                    "type", "veth", "peer", "name", VX_IF[1], "netns", VX_NS[1],
                    "mtu", str(VX_MTU)], check=True)
    for ns, dev, ip in zip(VX_NS, VX_IF, VX_IP):
        if addresses:
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)


def del_underlay():
    for ns in VX_NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Proc:
    """A child process with its output collected; killed by PID."""

    def __init__(self, argv, stdin=False, env=None, cwd=None):
        self.argv = argv
        self.out = []
        self.err = []
        self.lock = threading.Lock()
        # stdout and stderr apart: a log line on stderr may otherwise land in
        # the middle of testpmd's prompt.
        self.p = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        for stream, sink in [(self.p.stdout, self.out), (self.p.stderr, self.err)]:
            threading.Thread(target=self._read, args=(stream, sink), daemon=True).start()

    def _read(self, stream, sink):
        # Raw chunks, not lines: testpmd's prompt has no newline.
        fd = stream.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            with self.lock:
                sink.append(chunk.decode(errors="replace"))

    def text(self, start=0):
        with self.lock:
            return "".join(self.out[start:])

    def mark(self):
        with self.lock:
            return len(self.out)

    def wait_for(self, needle, timeout, start=0):
        end = time.time() + timeout
        while time.time() < end:
            if needle in self.text(start):
                return True
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        with self.lock:
            err = "".join(self.err)
        raise RuntimeError(f"{self.argv[0]}: no {needle!r} within {timeout}s:\n"
                           f"{self.text()[-3000:]}\n{err[-2000:]}")

    def send(self, line):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def stop(self, grace=5):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGTERM)
                self.p.wait(grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.kill(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait()


def testpmd(prefix, lcores, vdevs, extra, mbufs=16384, fwd="io"):
    # Unbuffered: testpmd's stdout is not a terminal here.
    argv = ["stdbuf", "-o0", TESTPMD] + eal_memory(512) + ["--no-pci", "--file-prefix", prefix,
                                                           "--lcores", lcores]
    argv += [f"--vdev={v}" for v in vdevs]
    argv += ["--", "-i", f"--total-num-mbufs={mbufs}", f"--forward-mode={fwd}",
             f"--rxd={QUEUE}", f"--txd={QUEUE}"] + extra
    p = Proc(argv, stdin=True)
    try:
        p.wait_for("testpmd> ", 60)
    except BaseException:
        # Not returned, so no caller's cleanup would stop it (a start that
        # failed, or Ctrl-C while it starts).
        p.stop()
        raise
    return p


def stop_testpmd(p):
    if p.p.poll() is None:
        try:
            p.send("quit")
            p.p.wait(10)
        except Exception:
            pass
    p.stop()


class Dut:
    """Base: sockets in a temp dir; start() before the generator, ready()
    after it (links up)."""

    name = "?"

    def __init__(self, kind, tmp):
        self.kind = kind
        self.tmp = tmp
        self.procs = []
        # Queue pairs per port, the same for every DUT of a cell (and the
        # generator): two for memif, where OVS needs two (its PMD sends on
        # queue 1), one elsewhere.
        self.queues = 2 if kind in ("memif", VXLAN) else 1
        # The generator's queue pairs on its ports.
        self.gen_queues = self.queues

    def settings(self):
        """What this DUT runs with, for the table's notes."""
        return ""

    def sockets(self):
        return [os.path.join(self.tmp, "a.sock"), os.path.join(self.tmp, "b.sock")]

    def start(self):
        pass

    def ready(self, gen):
        pass

    def load_mark(self):
        """Starts the measuring window of load()."""

    def load(self):
        """The DUT's busy share over the window since load_mark() (0..1),
        and its mean receive burst (frames, or None): a DUT that is not busy
        all the time waits for the generator, and the cell measures that."""
        return None, None

    def counters(self):
        """The DUT's own per-port counters as text, shown when a run
        carried nothing (where the frames went)."""
        return ""

    def stop(self):
        for p in reversed(self.procs):
            if TESTPMD in p.argv:
                stop_testpmd(p)
            else:
                p.stop()


def switchyard_bin():
    """The release build, or $SWITCHYARD_BIN."""
    return os.environ.get("SWITCHYARD_BIN") or os.path.join(REPO, "target", "release", "switchyard")


# Other Switchyard builds taking turns with the DUTs (--build LABEL=PATH):
# LABEL -> binary.
BUILDS = {}


class Switchyard(Dut):
    name = "switchyard"

    def __init__(self, kind, tmp, binary=None):
        super().__init__(kind, tmp)
        self.binary = binary or switchyard_bin()

    def settings(self):
        return ("one worker pinned to CPU 0, poll mode; copies each frame from one peer's "
                "memory into the other's (no buffers of its own)")

    def start(self):
        binary = self.binary
        if not os.path.exists(binary):
            sys.exit(f"{binary} is missing: cargo build --release -p switchyard")
        if self.kind == VXLAN:
            self.start_vxlan()
            return
        ports = []
        role = {"memif": "master", "vhost-server": "server", "vhost-client": "client",
                "af-packet": "master", "af-xdp": "master"}[self.kind]
        kind = "vhost-user" if self.kind.startswith("vhost") else "memif"
        for name, sock in zip(["a", "b"], self.sockets()):
            if name == "a" and self.kind in UPLINKS:
                ports.append(f'[[port]]\nname = "a"\nkind = "{self.kind}"\n'
                             f'interface = "{DUT_IF}"\nbridge = "default"\n')
                continue
            extra = (f'ring_size = 1024\nbuffer_size = 2048\nqueues = {self.queues}\n'
                     if kind == "memif" else "queues = 1\n")
            if SET.hosts is not None:
                # A port to a pod learns 64 MACs at most unless told
                # otherwise; these have a network of hosts behind them.
                extra += "mac_limit = 0\n"
            ports.append(f'[[port]]\nname = "{name}"\nkind = "{kind}"\nrole = "{role}"\n'
                         f'socket = "{sock}"\nbridge = "default"\n{extra}')
        cfg = os.path.join(self.tmp, "switchyard.toml")
        with open(cfg, "w") as f:
            f.write(f'control_socket = "{self.tmp}/control.sock"\n'
                    f'state_dir = "{self.tmp}/state"\n'
                    f'socket_dir = "{self.tmp}"\n'
                    f'mac_table_size = {mac_table_size(SET.hosts)}\n'
                    f'[dataplane]\nworkers = 1\ncpus = [{DUT_CPU}]\npoll_mode = "poll"\n'
                    '[[bridge]]\nname = "default"\n' + "\n".join(ports))
        self.ctls = [os.path.join(self.tmp, "control.sock")]
        self.launch([binary, "run", "--config", cfg], self.ctls[0])

    def launch(self, argv, ctl):
        env = dict(os.environ, RUST_LOG="warn")
        self.procs.append(Proc(argv, env=env))
        end = time.time() + 10
        while not os.path.exists(ctl) and time.time() < end:
            time.sleep(0.05)

    def start_vxlan(self):
        """Node A's switch and node B's, each in its namespace: its memif
        port to the generator and a vxlan port to the other, one bridge."""
        make_underlay(addresses=True)
        self.ctls = []
        for i, (name, sock) in enumerate(zip(["a", "b"], self.sockets())):
            d = os.path.join(self.tmp, name)
            os.makedirs(d)
            cfg = os.path.join(d, "switchyard.toml")
            with open(cfg, "w") as f:
                f.write(f'control_socket = "{d}/control.sock"\nstate_dir = "{d}/state"\n'
                        f'socket_dir = "{self.tmp}"\n'
                        f'[dataplane]\nworkers = 1\ncpus = [{DUT_CPU}]\n'
                        f'poll_mode = "{VX_POLL_MODE}"\n'
                        '[[bridge]]\nname = "default"\n'
                        f'[[port]]\nname = "{name}"\nkind = "memif"\nrole = "master"\n'
                        f'socket = "{sock}"\nbridge = "default"\nring_size = 1024\n'
                        f'buffer_size = 2048\nqueues = {self.queues}\n'
                        f'[[port]]\nname = "vx"\nkind = "vxlan"\nremote = "{VX_IP[1 - i]}"\n'
                        f'local = "{VX_IP[i]}"\nvni = {VX_VNI}\nbridge = "default"\n')
            ctl = os.path.join(d, "control.sock")
            self.ctls.append(ctl)
            self.launch(["ip", "netns", "exec", VX_NS[i], self.binary, "run", "--config", cfg],
                        ctl)

    def cli(self, *args, ctl=None):
        """`switchyard ARGS` against this DUT's (first) control socket: its
        output."""
        return subprocess.run([self.binary, *args],
                              env=dict(os.environ, SWITCHYARD_CONTROL=ctl or self.ctls[0]),
                              capture_output=True, text=True).stdout

    def ready(self, gen):
        end = time.time() + 20
        for ctl in self.ctls:
            while time.time() < end:
                out = self.cli("port", "list", "--json", ctl=ctl)
                try:
                    ports = json.loads(out)
                except ValueError:
                    ports = []
                if len(ports) == 2 and all(p["status"]["link_up"] for p in ports):
                    break
                time.sleep(0.2)
            else:
                log = "".join(self.procs[0].err)[-1500:] if self.procs else ""
                raise RuntimeError(f"switchyard links not up: {out} {log}".replace("\n", " | "))
        if SET.policy is not None:
            # Port b isolated for ingress: its connections tracked.
            rules = [{"peers": [{"cidr": c}], "ports": [{"protocol": "udp", "port": p}]}
                     for c, p in policy_rules(SET.policy)]
            path = os.path.join(self.tmp, "policy.json")
            with open(path, "w") as f:
                json.dump({"ingress": rules}, f)
            r = subprocess.run([self.binary, "port", "set", "b", "--policy", path],
                               env=dict(os.environ, SWITCHYARD_CONTROL=self.ctls[0]),
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"switchyard port set b --policy: {r.stderr}")

    def workers(self):
        """Busy and idle seconds, frames and bursts of the workers (both
        instances' in the vxlan cell)."""
        total = [0, 0, 0, 0]
        for ctl in self.ctls:
            w = json.loads(self.cli("worker", "list", "--json", ctl=ctl))[0]
            for k, v in enumerate((w["busy_seconds"], w["idle_seconds"], w["frames"],
                                   sum(b[1] for b in w["bursts"]))):
                total[k] += v
        return tuple(total)

    def load_mark(self):
        self.mark = self.workers()

    def counters(self):
        return "".join(self.cli("stats", ctl=c) for c in self.ctls)

    def stop(self):
        super().stop()
        if self.kind == VXLAN:
            del_underlay()

    def load(self):
        b0, i0, f0, n0 = self.mark
        b1, i1, f1, n1 = self.workers()
        total = (b1 - b0) + (i1 - i0)
        return ((b1 - b0) / total if total else None,
                (f1 - f0) / (n1 - n0) if n1 > n0 else None)


class TestpmdIo(Dut):
    name = "testpmd-io"

    def start(self):
        if self.kind == VXLAN:
            raise RuntimeError("testpmd io has no VXLAN: the vxlan cell is for switches")
        a, b = self.sockets()
        if self.kind == "memif":
            vdevs = [f"net_memif0,role=server,id=0,socket={a},socket-abstract=no",
                     f"net_memif1,role=server,id=0,socket={b},socket-abstract=no"]
        elif self.kind in UPLINKS:
            vdevs = [uplink_vdev(self.kind),
                     f"net_memif1,role=server,id=0,socket={b},socket-abstract=no"]
        else:
            client = 1 if self.kind == "vhost-client" else 0
            vdevs = [f"net_vhost0,iface={a},client={client},queues=1",
                     f"net_vhost1,iface={b},client={client},queues=1"]
        prefix = f"lb-dut-{os.getpid()}"
        # Main lcore and forwarding lcore both on the DUT's CPU (main idles).
        q = self.queues
        self.procs.append(testpmd(prefix, f"0@{DUT_CPU},1@{DUT_CPU}", vdevs,
                                  [f"--rxq={q}", f"--txq={q}"]))
        self.procs[-1].send("start")

    def settings(self):
        return (f"io forwarding, one lcore on CPU {DUT_CPU}, 16384 mbufs ({SET.memory}), "
                f"{QUEUE} descriptors")

    def ready(self, gen):
        time.sleep(1.0)

    def counters(self):
        return port_stats(self.procs[-1])


class OvsDpdk(Dut):
    name = "ovs-dpdk"

    def __init__(self, kind, tmp):
        super().__init__(kind, tmp)
        # OVS transmits on the PMD's own tx queue (queue 1 with one PMD), and
        # a DPDK memif server only has the queues its client connected.
        if kind in UPLINKS:
            self.gen_queues = 2

    def settings(self):
        caches = ("EMC inserts off (emc-insert-inv-prob 0) and SMC on, as OVS's guide has "
                  "it for flows beyond the EMC's 8192" if many_flows() else
                  "EMC on (the default, emc-insert-inv-prob 100; SMC off: few flows)")
        return ("one PMD pinned to CPU 0 (pmd-cpu-mask, dpdk-lcore-mask), every rxq pinned "
                "to it (pmd-rxq-affinity), n_rxq = the cell's queue pairs, "
                f"n_rxq_desc = n_txq_desc = {QUEUE} on DPDK ports, {caches}, "
                f"mac-table-size {mac_table_size(SET.hosts)}, NORMAL action; "
                + ("dpdk-socket-mem 1024 on hugepages" if SET.memory == "hugepages"
                   else "--no-huge --legacy-mem -m 3072"))

    def start(self):
        if self.kind == VXLAN:
            self.start_vxlan()
            return
        self.boot()
        self.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
        a, b = self.sockets()
        for i, (name, sock) in enumerate(zip(["pa", "pb"], [a, b])):
            n = self.gen_queues
            # Every rxq on the one PMD's core.
            affinity = ",".join(f"{q}:{DUT_CPU}" for q in range(n))
            desc = [f"options:n_rxq_desc={QUEUE}", f"options:n_txq_desc={QUEUE}"]
            if self.kind in UPLINKS and name == "pa":
                opts = ["type=dpdk", f"options:dpdk-devargs={uplink_vdev(self.kind)}"] + desc
            elif self.kind in ("memif",) + UPLINKS:
                dev = f"net_memif{i},role=server,id=0,socket={sock},socket-abstract=no"
                # As many queue pairs as the generator (see gen_queues).
                opts = ["type=dpdk", f"options:dpdk-devargs={dev}", f"options:n_rxq={n}"] + desc
            elif self.kind == "vhost-server":
                # dpdkvhostuser sockets live in vhost-sock-dir, named after the port.
                opts = ["type=dpdkvhostuser"]
            else:
                opts = ["type=dpdkvhostuserclient", f"options:vhost-server-path={sock}"]
            opts.append(f"other_config:pmd-rxq-affinity={affinity}")
            self.vsctl("add-port", "br0", name, "--", "set", "Interface", name, *opts)
        # A new bridge's only flow is the NORMAL action (MAC learning switch).
        self.vsctl("set", "bridge", "br0", f"other_config:mac-table-size={mac_table_size(SET.hosts)}")
        if SET.policy is not None:
            self.policy_flows()
        if many_flows():
            # OVS's guide for many parallel flows: no EMC inserts, SMC on.
            self.vsctl("set", "Open_vSwitch", ".", "other_config:emc-insert-inv-prob=0",
                       "other_config:smc-enable=true")

    def policy_flows(self):
        """The policy cell's rules as OpenFlow with conntrack, as OVN and
        the OVS conntrack tutorial write a stateful ACL: IP goes through
        ct() (zone 1) and comes back in table 1; established and related
        pass (NORMAL); a new connection towards pb (from pa) is committed
        and passes where a rule allows it, else is dropped; one from pb (not
        isolated for egress) is committed and passes."""
        flows = ["table=0,priority=100,ip,actions=ct(table=1,zone=1)",
                 "table=0,priority=0,actions=NORMAL",
                 "table=1,priority=200,ct_state=+trk+est,ip,actions=NORMAL",
                 "table=1,priority=200,ct_state=+trk+rel,ip,actions=NORMAL",
                 "table=1,priority=100,ct_state=+trk+new,ip,in_port=pb,"
                 "actions=ct(commit,zone=1),NORMAL",
                 "table=1,priority=0,actions=drop"]
        flows += [f"table=1,priority=150,ct_state=+trk+new,udp,in_port=pa,nw_src={c},"
                  f"tp_dst={p},actions=ct(commit,zone=1),NORMAL"
                  for c, p in policy_rules(SET.policy)]
        path = os.path.join(self.tmp, "flows.txt")
        with open(path, "w") as f:
            f.write("\n".join(flows) + "\n")
        self.vsctl("wait-until", "Interface", "pa", "ofport>0")
        r = subprocess.run(["ovs-ofctl", "del-flows", "br0"], env=self.env,
                           capture_output=True, text=True)
        r = r.returncode == 0 and subprocess.run(["ovs-ofctl", "add-flows", "br0", path],
                                                 env=self.env, capture_output=True, text=True)
        if not r or r.returncode != 0:
            raise RuntimeError(f"ovs-ofctl add-flows: {r.stderr if r else 'del-flows failed'}")

    def boot(self, netns=None, instance=""):
        """ovsdb-server and ovs-vswitchd (in `netns`, if given), DPDK
        initialised with the PMD on the DUT's CPU."""
        for tool in ["ovsdb-tool", "ovsdb-server", "ovs-vsctl"]:
            if not shutil.which(tool):
                raise RuntimeError("openvswitch-switch-dpdk is not installed")
        vswitchd = OVS_VSWITCHD
        if not os.path.exists(vswitchd):
            raise RuntimeError(f"{vswitchd} is missing (openvswitch-switch-dpdk)")
        t = self.tmp
        self.env = dict(os.environ, OVS_RUNDIR=t, OVS_DBDIR=t, OVS_LOGDIR=t, OVS_SYSCONFDIR=t)
        db = os.path.join(t, "conf.db")
        subprocess.run(["ovsdb-tool", "create", db,
                        "/usr/share/openvswitch/vswitch.ovsschema"], check=True, env=self.env)
        self.sock = os.path.join(t, "db.sock")
        self.procs.append(Proc(["ovsdb-server", db, f"--remote=punix:{self.sock}",
                                "--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
                                f"--pidfile={t}/ovsdb-server.pid", "--unixctl",
                                f"{t}/ovsdb-server.ctl"], env=self.env))
        end = time.time() + 10
        while not os.path.exists(self.sock) and time.time() < end:
            time.sleep(0.05)
        self.vsctl("--no-wait", "init")
        if SET.memory == "hugepages":
            mem = ["other_config:dpdk-socket-mem=1024",
                   f'other_config:dpdk-extra="--huge-dir {SET.huge_dir} --single-file-segments '
                   f'--no-pci --file-prefix lb-ovs{instance}-{os.getpid()}"']
        else:
            mem = [f'other_config:dpdk-extra="--no-huge --legacy-mem -m 3072 --no-pci '
                   f'--file-prefix lb-ovs{instance}-{os.getpid()}"']
        self.vsctl("--no-wait", "set", "Open_vSwitch", ".",
                   "other_config:dpdk-init=true",
                   f"other_config:dpdk-lcore-mask={1 << DUT_CPU:#x}",
                   f"other_config:pmd-cpu-mask={1 << DUT_CPU:#x}", *mem)
        # dpdkvhostuser sockets go to vhost-sock-dir, by default OVS_RUNDIR.
        ns = ["ip", "netns", "exec", netns] if netns else []
        self.procs.append(Proc(ns + [vswitchd, f"unix:{self.sock}",
                                f"--pidfile={t}/ovs-vswitchd.pid", "--unixctl",
                                f"{t}/ovs-vswitchd.ctl", f"--log-file={t}/ovs-vswitchd.log"],
                               env=self.env))

    def start_vxlan(self):
        """Node A's OVS and node B's, each in its namespace, with OVS's
        userspace tunnelling as its guide sets it up: br-int with the
        generator's memif port and a vxlan port to the other node, br-phy
        with the VTEP's address (on its internal port, whose route OVS
        takes from the kernel) and DPDK's net_af_xdp on the veth
        (net_af_packet's frames stop at 1518 bytes, short of a 1518-byte
        frame encapsulated); the other VTEP's MAC is OVS's own entry."""
        make_underlay(addresses=False)
        self.nodes = []
        macs = ("02:00:00:00:99:01", "02:00:00:00:99:02")
        q = self.gen_queues
        affinity = ",".join(f"{k}:{DUT_CPU}" for k in range(q))
        desc = [f"options:n_rxq_desc={QUEUE}", f"options:n_txq_desc={QUEUE}"]
        for i, (name, sock) in enumerate(zip(["pa", "pb"], self.sockets())):
            d = os.path.join(self.tmp, name)
            os.makedirs(d)
            n = OvsDpdk(VXLAN, d)
            self.nodes.append(n)
            n.boot(VX_NS[i], str(i))
            if VX_OVS_MAXSLEEP:
                n.vsctl("set", "Open_vSwitch", ".", f"other_config:pmd-maxsleep={VX_OVS_MAXSLEEP}")
            n.vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev")
            n.vsctl("add-port", "br-int", name, "--", "set", "Interface", name, "type=dpdk",
                    f"options:dpdk-devargs=net_memif0,role=server,id=0,socket={sock},"
                    "socket-abstract=no", f"options:n_rxq={q}", *desc,
                    f"other_config:pmd-rxq-affinity={affinity}")
            n.vsctl("add-port", "br-int", "vx", "--", "set", "Interface", "vx", "type=vxlan",
                    f"options:remote_ip={VX_IP[1 - i]}", f"options:local_ip={VX_IP[i]}",
                    f"options:key={VX_VNI}")
            n.vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
                    f"other_config:hwaddr={macs[i]}")
            n.vsctl("add-port", "br-phy", "up", "--", "set", "Interface", "up", "type=dpdk",
                    f"options:dpdk-devargs=net_af_xdp0,iface={VX_IF[i]},start_queue=0,"
                    "queue_count=1",
                    *desc, f"mtu_request={VX_MTU}", f"other_config:pmd-rxq-affinity=0:{DUT_CPU}")
            n.vsctl("set", "Interface", "br-phy", f"mtu_request={VX_MTU}")
            subprocess.run(["ip", "-n", VX_NS[i], "addr", "add", f"{VX_IP[i]}/24", "dev",
                            "br-phy"], check=True)
            subprocess.run(["ip", "-n", VX_NS[i], "link", "set", "br-phy", "up"], check=True)
            n.appctl("tnl/arp/set", "br-phy", VX_IP[1 - i], macs[1 - i])
            n.vsctl("set", "bridge", "br-int",
                    f"other_config:mac-table-size={mac_table_size(SET.hosts)}")

    def sockets(self):
        if self.kind == "vhost-server":
            return [os.path.join(self.tmp, "pa"), os.path.join(self.tmp, "pb")]
        return super().sockets()

    def vsctl(self, *args):
        r = subprocess.run(["ovs-vsctl", f"--db=unix:{self.sock}", "--timeout=30", *args],
                           env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            log = ""
            try:
                log = open(os.path.join(self.tmp, "ovs-vswitchd.log")).read()[-3000:]
            except OSError:
                pass
            raise RuntimeError(f"ovs-vsctl {' '.join(args)}: {r.stderr}\n{log}")
        return r.stdout

    def ready(self, gen):
        time.sleep(2.0)

    def appctl(self, *args):
        r = subprocess.run(["ovs-appctl", "-t", f"{self.tmp}/ovs-vswitchd.ctl", *args],
                           env=self.env, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            print(f"# ovs-appctl {' '.join(args)}: {r.stderr.strip()}", file=sys.stderr)
        return r.stdout

    def instances(self):
        """The OVS instances of the DUT (two in the vxlan cell)."""
        return getattr(self, "nodes", None) or [self]

    def counters(self):
        return "".join(n.appctl("dpctl/show", "-s") for n in self.instances())

    def load_mark(self):
        for n in self.instances():
            n.appctl("dpif-netdev/pmd-stats-clear")

    def load(self):
        loads = [n.load_one() for n in self.instances()]
        busy = [b for b, _ in loads if b is not None]
        bursts = [n for _, n in loads if n is not None]
        return (sum(busy) / len(busy) if busy else None,
                sum(bursts) / len(bursts) if bursts else None)

    def load_one(self):
        out = self.appctl("dpif-netdev/pmd-stats-show")
        if os.environ.get("LOOP_BENCH_DEBUG"):
            print(out, file=sys.stderr)
        busy = re.search(r"processing cycles:\s+\d+\s+\(([\d.]+)%\)", out)
        burst = re.search(r"avg\. packets per output batch:\s+([\d.]+)", out)
        return (float(busy.group(1)) / 100 if busy else None,
                float(burst.group(1)) if burst else None)

    def stop(self):
        for n in getattr(self, "nodes", []):
            n.stop()
        if self.procs:
            subprocess.run(["ovs-appctl", "-t", f"{self.tmp}/ovs-vswitchd.ctl", "exit"],
                           capture_output=True, timeout=20)
        super().stop()
        if self.kind == VXLAN:
            del_underlay()


DUTS = {"switchyard": Switchyard, "testpmd-io": TestpmdIo, "ovs-dpdk": OvsDpdk}


def make_dut(name, kind, tmp):
    """DUT `name` for a cell of `kind`: one of DUTS or a --build label."""
    if name in BUILDS:
        d = Switchyard(kind, tmp, BUILDS[name])
        d.name = name
        return d
    return DUTS[name](kind, tmp)

# OVS's exact match cache holds 8192 flows.
EMC_ENTRIES = 8192


def many_flows():
    """Whether the cell's flows (a NORMAL megaflow per host pair and
    direction) are beyond what OVS's exact match cache holds."""
    return SET.hosts is not None and 2 * SET.hosts > EMC_ENTRIES


HOSTGEN_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostgen.c")


def missing_packages(args):
    """The Debian packages this run needs and the machine lacks: testpmd
    and DPDK's memif driver always; a C compiler, pkg-config and DPDK's
    headers when hostgen is built; OVS-DPDK for its column; perf for
    $LOOP_BENCH_PERF."""
    need = []
    if not os.path.exists(TESTPMD):
        # Debian 12's dpdk 22.11.11 ships testpmd in dpdk-dev.
        need += ["dpdk", "dpdk-dev"]
    if not any(glob.glob(p) for p in ("/usr/lib/*/dpdk/pmds-*/librte_net_memif.so*",
                                      "/usr/lib/*/librte_net_memif.so*")):
        need.append("librte-net-memif23")
    if (args.hosts or args.uplink_generator == "af-xdp") and hostgen_to_build():
        pkg_config = shutil.which("pkg-config")
        if not pkg_config:
            need.append("pkg-config")
        if not pkg_config or subprocess.run(
                [pkg_config, "--exists", "libdpdk"], capture_output=True).returncode:
            need.append("dpdk-dev")
        if not shutil.which("cc"):
            need.append("gcc")
    if "ovs-dpdk" in args.dut.split(",") and not os.path.exists(OVS_VSWITCHD):
        need.append("openvswitch-switch-dpdk")
    if os.environ.get("LOOP_BENCH_PERF") and not shutil.which("perf"):
        need.append("linux-perf")
    return need


def ensure_packages(args):
    """Installs what missing_packages() names (apt-get, as root; the test
    command does the same for its peers), or says what to install."""
    need = missing_packages(args)
    if not need:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(f"missing: apt-get install {' '.join(need)}")
    print(f"# installing {' '.join(need)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *need]):
        if subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed")
    still = missing_packages(args)
    if still:
        sys.exit(f"still missing after apt-get: {' '.join(still)}")


def hostgen_out():
    """Where the script builds hostgen."""
    return os.path.join(REPO, "target", "loop-bench", "hostgen")


def hostgen_to_build():
    """Whether hostgen_bin() will (re)build hostgen: no $HOSTGEN_BIN, and no
    build as new as its source."""
    out = hostgen_out()
    return not os.environ.get("HOSTGEN_BIN") and not (
        os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(HOSTGEN_SRC))


def hostgen_bin():
    """Builds the many-hosts generator (hostgen.c) against the system's DPDK;
    $HOSTGEN_BIN instead runs another build of it (to compare two)."""
    if os.environ.get("HOSTGEN_BIN"):
        return os.environ["HOSTGEN_BIN"]
    out = hostgen_out()
    if not hostgen_to_build():
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libdpdk"], check=True,
                           capture_output=True, text=True).stdout.split()
    subprocess.run(["cc", "-O3", "-march=native", "-o", out, HOSTGEN_SRC] + flags, check=True)
    return out


def hostgen(vdevs, queues, size, bursts, warmup, seconds, hosts):
    """The many-hosts generator, started; its output ends in "rx_pps N".
    `queues`: "N0,N1", the queue pairs of its two ports."""
    argv = ["stdbuf", "-o0", hostgen_bin()] + eal_memory(512) + [
        "--no-pci", "--file-prefix", f"lb-gen-{os.getpid()}", "--lcores", GEN_LCORES]
    argv += [f"--vdev={v}" for v in vdevs]
    argv += ["--", str(hosts), str(size), str(bursts), queues, str(QUEUE),
             str(warmup), str(seconds)]
    return Proc(argv)


def uplink_vdev(kind):
    """DPDK's port on the DUT's end of the veth (testpmd-io, OVS-DPDK)."""
    if kind == "af-xdp":
        return f"net_af_xdp0,iface={DUT_IF},start_queue=0,queue_count=1"
    return f"net_af_packet0,iface={DUT_IF},qdisc_bypass=1"


def gen_vdevs(kind, sockets, queues=1):
    a, b = sockets
    if kind in UPLINKS:
        gen0 = (f"net_af_xdp0,iface={GEN_IF},start_queue=0,queue_count={queues}"
                if SET.uplink_generator == "af-xdp" else
                f"net_af_packet0,iface={GEN_IF},qdisc_bypass=1,qpairs={queues}")
        return [gen0,
                f"net_memif1,role=client,id=0,socket={b},socket-abstract=no,mac={GEN_MACS[1]}"]
    if kind in ("memif", VXLAN):
        zc = ",zero-copy=yes" if SET.memif_zero_copy else ""
        return [f"net_memif0,role=client,id=0,socket={a},socket-abstract=no,mac={GEN_MACS[0]}{zc}",
                f"net_memif1,role=client,id=0,socket={b},socket-abstract=no,mac={GEN_MACS[1]}{zc}"]
    server = ",server=1" if kind == "vhost-client" else ""
    return [f"net_virtio_user0,path={a},queue_size={QUEUE},mac={GEN_MACS[0]}{server}",
            f"net_virtio_user1,path={b},queue_size={QUEUE},mac={GEN_MACS[1]}{server}"]


RX_PPS = re.compile(r"Rx-pps:\s+(\d+)")
# (dut, kind, size, hosts or None) -> [(busy share, mean burst)] of each run
# that carried frames (the RTT cells' are not taken: one frame in flight
# leaves any DUT idle).
LOADS = {}
# (dut, kind, size, hosts) -> [share of the generator's time in passes over
# its receive queues that found nothing] of each hostgen run: near 0, the
# generator never waited for the DUT and may be the loop's limit (testpmd
# io reports no load of its own; this is the check for it).
GEN_IDLE = {}


def port_stats(p):
    """A testpmd's `show port stats all`, as it printed it."""
    m = p.mark()
    p.send("show port stats all")
    p.wait_for("Tx-bps", 10, m)
    time.sleep(0.1)
    return p.text(m)


def port_pps(gen):
    text = port_stats(gen)
    if os.environ.get("LOOP_BENCH_DEBUG"):
        print(text, file=sys.stderr)
    return sum(int(x) for x in RX_PPS.findall(text))


def wait_gen_links(gen, timeout=30):
    """Waits until both of the generator's ports report their link up: a
    frame sent before the DUT has connected is lost, and the loop with it."""
    end = time.time() + timeout
    while time.time() < end:
        m = gen.mark()
        gen.send("show port info all")
        gen.wait_for("testpmd> ", 10, m)
        time.sleep(0.1)
        if gen.text(m).count("Link status: up") >= 2:
            return
        time.sleep(0.4)
    raise RuntimeError("the generator's links are not up")


def gen_traffic():
    """The generator's forwarding mode and options for the traffic asked."""
    if SET.traffic == "learned":
        return "mac", [f"--eth-peer=0,{GEN_MACS[1]}", f"--eth-peer=1,{GEN_MACS[0]}"]
    return "io", []


def af_xdp_generator(kind):
    """Whether the generator's veth port is net_af_xdp in this cell: then it
    has one queue there (a veth of one queue), whatever its memif port has."""
    return kind in UPLINKS and SET.uplink_generator == "af-xdp"


def hostgen_cell(kind):
    """Whether hostgen generates this cell: the many-hosts cells, and the
    uplink cells with the generator on net_af_xdp (one queue on the veth,
    and as many as the DUT needs on its memif port)."""
    return SET.hosts is not None or af_xdp_generator(kind)


def carried_nothing(dut):
    """Says where the frames of a run that measured nothing went, by the
    DUT's own counters (Switchyard's `stats`, testpmd's port stats,
    OVS-DPDK's datapath ports)."""
    print(f"# the loop carried nothing; {dut.name}'s counters:\n{dut.counters()}",
          file=sys.stderr, flush=True)


def dut_ready(dut, gen):
    """Waits until the DUT's links to the generator are up; if they never
    come, says why the generator's side gave up too, if it said, and the
    run is tried again. (DPDK's zero-copy memif client closes the EAL's
    memseg descriptor when its port connects, so a second port's handshake
    could fail with "sendmsg fail: Bad file descriptor"; hostgen now starts
    its ports one after the other and puts the descriptor back between.)"""
    try:
        dut.ready(gen)
    except RuntimeError as e:
        why = [l for l in "".join(gen.err).splitlines() if "fail" in l.lower()]
        raise RuntimeError(f"{e} | generator: {' | '.join(why[-3:]) or '-'}") from None


def run_hosts(dut, size, seconds, bursts):
    """One hostgen run (hostgen_cell): hostgen puts the frames in flight and
    measures."""
    q = dut.gen_queues
    q0 = 1 if af_xdp_generator(dut.kind) else q
    # Longer warm-up: OVS sets up a megaflow per host pair and direction.
    warmup = 5.0
    gen = hostgen(gen_vdevs(dut.kind, dut.sockets(), q0), f"{q0},{q}", size, bursts, warmup,
                  seconds, SET.hosts or 1)
    try:
        dut_ready(dut, gen)
        gen.wait_for("links up", 90)
        time.sleep(warmup + 0.5)
        dut.load_mark()
        gen.wait_for("rx_pps", 30 + seconds)
        text = gen.text()
        pps = int(re.search(r"rx_pps (\d+)", text).group(1))
        if pps:
            key = (dut.name, dut.kind, size, SET.hosts)
            LOADS.setdefault(key, []).append(dut.load())
            cycles = re.search(r"cycles (\d+) idle (\d+)", text)
            if cycles and int(cycles.group(1)):
                GEN_IDLE.setdefault(key, []).append(
                    int(cycles.group(2)) / int(cycles.group(1)))
        else:
            carried_nothing(dut)
        return pps
    finally:
        gen.stop()


def profile_dut(what, pps):
    """With $LOOP_BENCH_PERF=DIR, records the DUT's CPU and the generator's
    for 2 s after the measuring window (the loop still running), as
    DIR/<dut>-<kind>-<size>-<Mpps>.data (`perf report -C N` splits them):
    where a run's cycles went, on both sides of the loop, to tell a slow
    run from a fast one. Off by default."""
    out = os.environ.get("LOOP_BENCH_PERF")
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, f"{what}-{pps / 1e6:.2f}.data")
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-C", f"{DUT_CPU},{GEN_CPU}", "-g",
                    "-o", data, "--", "sleep", "2"], capture_output=True)


# The measuring window is read in slices of this many seconds (plus the
# read's own ~0.1 s): the machine's state changes within a window, and the
# slices show how much (testpmd-generated cells).
SLICE = 0.4
# (dut, kind, size, hosts, what) -> {round: value}: each run by its round
# (`what`: "rate", "slice" for its median slice, "rtt", "rtt-fast" for its
# fastest slice), for the ratios of DUTs measured one after the other
# (print_grid).
ROUNDS = {}

# The cross-CPU cache-line round trip sampled before each round (see
# machine_state): (p50 ns, share of windows far apart) per sample.
STATES = []


def probe(seconds):
    """Samples for `seconds` how long a cache line takes from the DUT's CPU
    to the generator's and back (benches/src/bin/cacheline_rtt.rs): on a VM
    it jumps with where the host runs the vCPUs (here about 30, 85 or 470
    ns), and every shared-memory loop slows with it. Returns the line the
    probe printed (or why it failed), its p50 in ns and its far share (None,
    None on failure)."""
    binary = os.path.join(REPO, "target", "release", "cacheline_rtt")
    if not os.path.exists(binary):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "switchyard-benches",
                        "--bin", "cacheline_rtt"], cwd=REPO, check=True)
    r = subprocess.run([binary, str(DUT_CPU), str(GEN_CPU), str(seconds)], capture_output=True,
                       text=True)
    m = re.search(r"p50 (\d+) p90 \d+ far ([\d.]+)", r.stdout)
    if not m:
        return f"cacheline_rtt failed: {r.stderr.strip()}", None, None
    return r.stdout.strip(), int(m.group(1)), float(m.group(2))


def machine_state():
    """The state before a round (1 s of the probe): the line printed; its
    (p50, far share) kept in STATES."""
    line, p50, far = probe(1.0)
    if p50 is not None:
        STATES.append((p50, far))
    return line


def state_after_run():
    """The state right after a run (0.5 s of the probe): with the probe
    before the round, it brackets the run; a run whose two probes differ
    may have had either state, or both."""
    line, p50, far = probe(0.5)
    return f"probe after: p50 {p50} ns, far {far * 100:.0f}%" if p50 is not None else line


def print_states():
    """The machine's state over the run, from the samples before each round."""
    if not STATES:
        return
    p50 = sorted(p for p, _ in STATES)
    far = statistics.mean(f for _, f in STATES)
    print(f"\nmachine: cross-CPU cache-line round trip (CPU {DUT_CPU} <-> {GEN_CPU}) sampled for "
          f"1 s before each of {len(STATES)} rounds: p50 {p50[0]}-{p50[-1]} ns over the rounds, "
          f"{far * 100:.0f}% of the time over 200 ns (vCPUs far apart, every DUT slower)")


def rtt_of(pps, queues):
    """The round trip of a short loop carrying `pps`: one frame per port and
    queue circulates, each received once per trip through the DUT and
    back."""
    return 2 * queues / pps


def run_once(dut_name, kind, size, seconds, bursts, rtt=False):
    """One run of a cell: its rate (pps) or round trip (s), None if it carried
    nothing, and its window's slices (rates, or round trips for a short
    loop; None for a hostgen run, which is not read in slices)."""
    tmp = tempfile.mkdtemp(prefix="sy-loop-")
    dut = make_dut(dut_name, kind, tmp)
    gen = None
    if kind in UPLINKS:
        make_veth()
    try:
        dut.start()
        if hostgen_cell(kind) and not rtt and size != IMIX:
            return run_hosts(dut, size, seconds, bursts), None
        q = dut.gen_queues
        fwd, extra = gen_traffic()
        # --no-flush-rx: `start` keeps frames waiting in the rx rings (the
        # IMIX cell stops and starts forwarding between its sizes).
        gen = testpmd(f"lb-gen-{os.getpid()}", GEN_LCORES, gen_vdevs(kind, dut.sockets(), q),
                      [f"--rxq={q}", f"--txq={q}", "--no-flush-rx"] + extra, fwd=fwd)
        dut_ready(dut, gen)
        wait_gen_links(gen)
        if SET.memif_zero_copy and kind in ("memif", VXLAN):
            # A zero-copy client posts its receive buffers when it first
            # receives: forward once, so that the DUT finds buffers for
            # the first frames instead of dropping them.
            m = gen.mark()
            gen.send("start")
            gen.wait_for("forwarding packets", 10, m)
            time.sleep(0.5)
            m = gen.mark()
            gen.send("stop")
            gen.wait_for("Done.", 10, m)
        if size == IMIX:
            # Each size's bursts in turn: forwarding stops between them,
            # frames in flight wait in the rings, and the loop carries the
            # mix from then on.
            for i, (sz, n) in enumerate(IMIX_MIX):
                gen.send(f"set txpkts {sz - 4}")
                m = gen.mark()
                gen.send(f"start tx_first {n}")
                gen.wait_for("forwarding packets", 10, m)
                if i + 1 < len(IMIX_MIX):
                    m = gen.mark()
                    gen.send("stop")
                    gen.wait_for("Done.", 10, m)
        else:
            gen.send(f"set txpkts {size - 4}")  # sizes count the 4-byte CRC
            if rtt:
                # One frame in flight per direction.
                gen.send("set burst 1")
                bursts = 1
            gen.send(f"start tx_first {bursts}")
        time.sleep(2.0)  # warm-up
        port_pps(gen)  # testpmd's pps is over the time between two calls
        dut.load_mark()
        # The window in slices: the machine's state changes within it.
        slices = []
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(min(SLICE, max(0.0, end - time.time())))
            slices.append(port_pps(gen))
        pps = statistics.mean(slices)
        if not pps:
            carried_nothing(dut)
        elif os.environ.get("LOOP_BENCH_COUNTERS", "0") not in ("", "0"):
            print(f"# {dut.name}'s counters:\n{dut.counters()}", file=sys.stderr, flush=True)
        if pps and not rtt:
            LOADS.setdefault((dut_name, kind, size, variant()), []).append(dut.load())
            profile_dut(f"{dut_name}-{kind}-{size}", pps)
        if rtt:
            return (rtt_of(pps, q) if pps else None), [rtt_of(p, q) for p in slices if p]
        return pps, slices
    finally:
        if gen:
            stop_testpmd(gen)
        dut.stop()
        if kind in UPLINKS:
            del_veth()
        shutil.rmtree(tmp, ignore_errors=True)
        clean_hugepages()
        for d in os.listdir("/var/run/dpdk") if os.path.isdir("/var/run/dpdk") else []:
            if d.endswith(str(os.getpid())):
                shutil.rmtree(os.path.join("/var/run/dpdk", d), ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dut", default="switchyard,testpmd-io,ovs-dpdk")
    ap.add_argument("--build", action="append", default=[], metavar="LABEL=PATH",
                    help="another Switchyard binary as DUT LABEL (name it in --dut): "
                         "builds compared taking turns in one run")
    ap.add_argument("--kinds", default="memif,vhost-server,vhost-client")
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--bursts", type=int, default=32, help="tx_first bursts in the loop")
    ap.add_argument("--memory", default=None,
                    help="hugepages,no-huge (default: hugepages if they can be reserved)")
    ap.add_argument("--traffic", default="learned", choices=["learned", "flood"])
    ap.add_argument("--rtt", action="store_true", help="add the one-frame-in-flight cells")
    ap.add_argument("--memif-generator", choices=["zero-copy", "copy"], default="zero-copy",
                    help="the generator's memif ports: DPDK zero-copy clients or copy mode")
    ap.add_argument("--uplink-generator", choices=["af-packet", "af-xdp"], default="af-packet",
                    help="the generator's port on the veth in the uplink cells "
                         "(af-xdp: hostgen generates them, one host per side)")
    ap.add_argument("--policy", default="",
                    help="policy cells (memif, 64 B): rules in front of port b with connection "
                         "tracking, e.g. 1,10,1000 (Switchyard: port set --policy; OVS-DPDK: "
                         "the same as OpenFlow ct() flows)")
    ap.add_argument("--hosts", default="",
                    help="many-hosts cells (64 B, hostgen generator): hosts per side, "
                         "e.g. 1000,10000")
    args = ap.parse_args()
    # SIGTERM runs the cleanup too (hugepages given back, mount removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    one_at_a_time()
    ensure_packages(args)
    for b in args.build:
        label, sep, path = b.partition("=")
        if not sep or not label or label in DUTS or not os.path.exists(path):
            sys.exit(f"--build {b}: want LABEL=PATH, a new label and an existing binary")
        BUILDS[label] = os.path.abspath(path)
    duts = args.dut.split(",")
    unknown = [d for d in duts if d not in DUTS and d not in BUILDS]
    if unknown:
        sys.exit(f"--dut: unknown {', '.join(unknown)} (known: "
                 f"{', '.join(list(DUTS) + list(BUILDS))})")
    SET.traffic = args.traffic
    SET.uplink_generator = args.uplink_generator
    huge = None
    memories = args.memory.split(",") if args.memory else None
    if memories is None or "hugepages" in memories:
        huge = Hugepages(HUGEPAGES)
        if huge.ok:
            SET.huge_dir = huge.dir
        elif memories is None:
            huge.close()
            huge = None
        else:
            huge.close()
            sys.exit("hugepages asked for, but they cannot be reserved")
        if memories is None:
            memories = ["hugepages" if huge else "no-huge"]
    try:
        for memory in memories:
            SET.memory = memory
            SET.memif_zero_copy = args.memif_generator == "zero-copy"
            results = {}
            rtts = {}
            many = {}
            kinds = args.kinds.split(",")
            sizes = [IMIX if s == "imix" else int(s) for s in args.sizes.split(",") if s]
            if sizes:
                results.update(measure(duts, [(k, s) for k in kinds for s in sizes], args,
                                       rtt=False))
            if args.rtt:
                rtts.update(measure(duts, [(k, 64) for k in kinds], args, rtt=True))
            policed = {}
            for n in [int(h) for h in args.policy.split(",") if h]:
                SET.policy = n
                try:
                    for (d, k, s), v in measure(duts, [("memif", 64)], args,
                                                rtt=False).items():
                        policed[(d, n)] = v
                finally:
                    SET.policy = None
            for n in [int(h) for h in args.hosts.split(",") if h]:
                SET.hosts = n
                try:
                    for (d, k, s), v in measure(duts, [(k, 64) for k in kinds], args,
                                                rtt=False).items():
                        many[(d, k, n)] = v
                finally:
                    SET.hosts = None
            if results:
                print_table(results, duts, args)
                print_slices(duts)
                print_loads(duts, sorted({(k, s, None) for (_, k, s) in results}))
            if rtts:
                print_rtt(rtts, duts)
            if policed:
                print_policy(policed, duts, args)
            if many:
                print_hosts(many, duts, args)
                print_loads(duts, sorted({(k, 64, n) for (_, k, n) in many}))
            LOADS.clear()
            GEN_IDLE.clear()
            ROUNDS.clear()
            print_states()
            STATES.clear()
            print_settings(duts, args)
    finally:
        if huge:
            huge.close()


def measure(duts, cells, args, rtt):
    """Median per DUT of each (kind, size) cell; round after round, every
    cell once per round and the DUTs taking turns in each (each round
    starting with the next DUT): this VM's speed
    drifts over minutes, and a DUT (or a cell) measured in one slow stretch
    would otherwise be compared with others measured in a fast one."""
    runs = {(dut, kind, size): [] for dut in duts for kind, size in cells}
    failed = set()
    for r in range(args.repeat):
        print(f"# round {r + 1}: {machine_state()}", file=sys.stderr, flush=True)
        # Each round starts with the next DUT: a DUT always run in the same
        # place in the sequence (after the same other DUT, on the memory it
        # gave back) would carry whatever that place does to its rate.
        order = duts[r % len(duts):] + duts[:r % len(duts)]
        for kind, size, dut in [(k, s, d) for k, s in cells for d in order]:
            if (dut, kind, size) in failed:
                continue
            what = "rtt" if rtt else ("imix" if size == IMIX else f"{size:5}")
            if SET.hosts is not None:
                what += f" {SET.hosts} hosts"
            if SET.policy is not None:
                what += f" {SET.policy} rules"
            # A run whose loop carried nothing (a peer that never came up)
            # is a failure, not a measurement: tried once more, then the
            # DUT is out of the cell.
            v, slices = None, None
            for attempt in range(2):
                try:
                    v, slices = run_once(dut, kind, size, args.seconds, args.bursts, rtt)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"# {dut} {kind} {what}: {str(e).splitlines()[0]}",
                          file=sys.stderr, flush=True)
                    v, slices = None, None
                if v:
                    break
                print(f"# {dut} {kind} {what} run {r + 1}: nothing measured"
                      + (", again" if attempt == 0 else ", giving up"),
                      file=sys.stderr, flush=True)
            if not v:
                failed.add((dut, kind, size))
                continue
            runs[(dut, kind, size)].append(v)
            ROUNDS.setdefault((dut, kind, size, variant(), "rtt" if rtt else "rate"), {})[r] = v
            shown = f"{v * 1e6:.2f} us RTT" if rtt else f"{v / 1e6:.3f} Mpps"
            if slices:
                q = sorted(slices)
                # A throughput run's median slice, a round trip's fastest.
                ROUNDS.setdefault((dut, kind, size, None, "rtt-fast" if rtt else "slice"),
                                  {})[r] = q[0] if rtt else statistics.median(q)
                # Round trips in us, rates in Mpps.
                scale, unit = (1e6, " us") if rtt else (1e-6, "")
                shown += (f" [slices {q[0] * scale:.2f}-{q[-1] * scale:.2f}{unit}, median "
                          f"{statistics.median(q) * scale:.2f}]")
            load = LOADS.get((dut, kind, size, variant()), [])
            if not rtt and load and load[-1][0] is not None:
                busy, burst = load[-1]
                shown += f" (busy {busy * 100:.1f}%" + (f", burst {burst:.1f})" if burst else ")")
            # Only hostgen runs record it (no round trips: testpmd's).
            idle = GEN_IDLE.get((dut, kind, size, variant()), [])
            if not rtt and idle:
                shown += f" (generator idle {idle[-1] * 100:.1f}%)"
            shown += f" [{state_after_run()}]"
            print(f"# {SET.memory:9} {dut:10} {kind:12} {what} run {r + 1}: {shown}",
                  file=sys.stderr, flush=True)
    return {key: (statistics.median(v) if v else None) for key, v in runs.items()}


def paired_ratio(sy, other):
    """Switchyard over another DUT from the runs of each round ({round:
    value}): the median of the rounds' ratios, and those ratios in round
    order. The DUTs of a round ran one after the other, within a minute,
    mostly in the same machine state; the medians of each DUT's runs may
    come from different rounds, and on this VM different states. None if
    no round has both."""
    both = sorted(set(sy) & set(other))
    if not both:
        return None
    each = [sy[r] / other[r] for r in both]
    return statistics.median(each), each


def print_grid(first, rows, duts, width, value, fmt, rounds=None):
    """Prints a markdown table: leading columns `first` ((name, format)
    pairs; each row of `rows` is (key, its values for them)), a column per
    DUT showing `fmt(value(dut, key), key)` in `width`, and, given
    `rounds(dut, key)` (each run's value by round), Switchyard's over each
    other DUT's: the median of the rounds' ratios, then each round's."""
    others = [d for d in duts if d != "switchyard"] if rounds else []
    shown = {}
    for key, _ in rows:
        for d in others:
            pr = paired_ratio(rounds("switchyard", key), rounds(d, key))
            shown[(key, d)] = (f"{pr[0]:.2f}x (" + " ".join(f"{x:.2f}" for x in pr[1]) + ")"
                               if pr else "-")
    rw = max([len(v) for v in shown.values()] + [13])
    head = ("| " + " | ".join(f"{n:{f}}" for n, f in first) + " | "
            + " | ".join(f"{d:^{width}}" for d in duts))
    head += "".join(f" | {'sy/' + d:<{rw}}" for d in others) + " |"
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for key, cols in rows:
        row = ("| " + " | ".join(f"{c:{f}}" for c, (_, f) in zip(cols, first)) + " | "
               + " | ".join(f"{fmt(value(d, key), key):>{width}}" for d in duts))
        row += "".join(f" | {shown[(key, d)]:<{rw}}" for d in others)
        print(row + " |")


# The leading columns of the tables by kind and frame size.
SIZE_COLUMNS = [("kind", "12"), ("size", ">5")]


def size_rows(cells):
    """Rows for SIZE_COLUMNS: one per (kind, size) among the keys of `cells`
    ((dut, kind, size) -> value)."""
    return [((k, sz), [k, "imix" if sz == IMIX else sz])
            for (k, sz) in sorted({(k, sz) for (_, k, sz) in cells})]


def print_slices(duts):
    """The table again from the windows' slices: per run the median slice
    (the rate in the state the machine was in most of that window), then
    the median over the runs. Where the plain table and this one differ,
    a cell's runs were a mix of the machine's states."""
    med = {key[:3]: statistics.median(by_round.values())
           for key, by_round in ROUNDS.items() if key[4] == "slice" and by_round}
    if not med:
        return
    print(f"\nthe same cells, median {SLICE + 0.1:.1f} s slice of each window, median over "
          "the runs (the rate in the machine's most frequent state)\n")
    print_grid(SIZE_COLUMNS, size_rows(med), duts, 12, lambda d, key: med.get((d,) + key),
               lambda v, _: f"{v / 1e6:.2f} Mpps" if v else "-",
               rounds=lambda d, key: ROUNDS.get((d,) + key + (None, "slice"), {}))


def print_rtt(rtts, duts):
    print("\nshort loop (one frame in flight per port and queue, 64 B): median round trip "
          "generator -> DUT -> generator = frames in flight / (frames per second); "
          "a ratio under 1.0x is a shorter round trip through Switchyard\n")
    def grid(kinds, value, what):
        print_grid([("kind", "12")], [(k, [k]) for k in sorted(kinds)], duts, 12, value,
                   lambda v, _: f"{v * 1e6:.2f} us" if v else "-",
                   rounds=lambda d, kind: ROUNDS.get((d, kind, 64, None, what), {}))

    grid({k for (_, k, _) in rtts}, lambda d, kind: rtts.get((d, kind, 64)), "rtt")
    fast = {key[:2]: statistics.median(by_round.values())
            for key, by_round in ROUNDS.items() if key[4] == "rtt-fast" and by_round}
    if not fast:
        return
    print(f"\nthe same, fastest {SLICE + 0.1:.1f} s slice of each window, median over the "
          "runs (the round trip with the vCPUs near each other, where a slice had them so)\n")
    grid({k for (_, k) in fast}, lambda d, kind: fast.get((d, kind)), "rtt-fast")


def print_loads(duts, cells):
    """The DUTs' load in the measuring windows of `cells` (the keys of
    LOADS), median over the runs, and for hostgen's cells the generator's idle
    share (GEN_IDLE)."""
    rows = []
    for key in cells:
        for d in duts:
            runs = LOADS.get((d,) + key, [])
            busy = [b for b, _ in runs if b is not None]
            burst = [n for _, n in runs if n is not None]
            idle = GEN_IDLE.get((d,) + key, [])
            if not busy and not burst and not idle:
                continue  # a DUT that reports no load (testpmd io), one-host cells
            rows.append((key, d, statistics.median(busy) if busy else None,
                         statistics.median(burst) if burst else None,
                         statistics.median(idle) if idle else None))
    if not rows:
        return
    print("\nDUT load over the measuring window (median): busy share of its CPU "
          "(Switchyard: passes that found frames; OVS-DPDK: processing cycles) and mean "
          "burst (Switchyard: frames per non-empty receive burst; OVS-DPDK: packets per "
          "output batch). A DUT under 100% busy waits for the generator."
          + (" For hostgen's cells, the generator's idle share: its time in passes over "
             "its receive queues that found no frame. Near 0%, it did not wait for the DUT "
             "and may be what limits the loop." if any(r[4] is not None for r in rows) else "")
          + "\n")
    for (kind, size, extra), d, busy, burst, idle in rows:
        shown = "imix" if size == IMIX else size
        what = f" {extra} hosts" if extra is not None else ""
        b = f"{busy * 100:5.1f}%" if busy is not None else "    -"
        n = f"{burst:5.1f}" if burst is not None else "    -"
        g = f", generator idle {idle * 100:5.1f}%" if idle is not None else ""
        print(f"- {kind:12} {shown:>5}{what}: {d:10} busy {b}, burst {n}{g}")


def print_hosts(many, duts, args):
    print(f"\nmany hosts ({SET.memory}, 64 B): hostgen generator, the k-th frame out of "
          "a port from its side's host k mod N to the other side's host k mod N; median "
          f"of {args.repeat} runs of {args.seconds}s after 5 s of warm-up\n")
    print_grid([("kind", "12"), ("hosts", ">6")],
               [((k, n), [k, n]) for (k, n) in sorted({(k, n) for (_, k, n) in many})], duts,
               12, lambda d, key: many.get((d,) + key),
               lambda v, _: f"{v / 1e6:.2f} Mpps" if v else "-",
               rounds=lambda d, key: ROUNDS.get((d, key[0], 64, key[1], "rate"), {}))
    print(f"OVS-DPDK: mac-table-size {mac_table_size(max(n for (_, _, n) in many))} at most; "
          f"beyond {EMC_ENTRIES // 2} hosts per side, EMC inserts off and SMC on; "
          "Switchyard: mac_table_size alike")


def print_policy(policed, duts, args):
    print(f"\npolicy ({SET.memory}, memif, 64 B): port b isolated for ingress by N rules "
          "(N - 1 address blocks with a UDP port that do not match, then the one that "
          "allows the loop's frames), connections tracked; median of "
          f"{args.repeat} runs of {args.seconds}s\n")
    print_grid([("rules", ">6")], [((n,), [n]) for n in sorted({n for (_, n) in policed})],
               duts, 12, lambda d, key: policed.get((d,) + key),
               lambda v, _: f"{v / 1e6:.2f} Mpps" if v else "-",
               rounds=lambda d, key: ROUNDS.get((d, "memif", 64, f"policy {key[0]}", "rate"), {}))
    print("Switchyard: `port set b --policy` (ingress rules, conntrack); OVS-DPDK: table 0 "
          "sends IP through ct(zone=1) to table 1, where +est and +rel pass, +new from pa "
          "passes and is committed where a rule's nw_src and tp_dst match, +new from pb is "
          "committed; the rules at one priority (OVS's classifier, then its megaflow)")


def print_settings(duts, args):
    fwd, extra = gen_traffic()
    print(f"\nmemory: {SET.memory}; traffic: {SET.traffic} "
          f"(generator: testpmd {fwd} forwarding {' '.join(extra)}, "
          f"{GEN_LCORES}, {args.bursts} bursts of 32 in flight per port and queue)")
    print("generator memif ports: " + ("zero-copy clients (DPDK zero-copy=yes: the DUTs "
                                       "read and write the generator's mbufs)"
                                       if SET.memif_zero_copy else "copy mode"))
    if any(k in UPLINKS for k in args.kinds.split(",")):
        gen = SET.uplink_generator.replace('-', '_')
        print(f"uplink cells: the generator's port on the veth is net_{gen}"
              + (" (one queue), the generator hostgen (one host per side, learned unicast; "
                 "RTT and IMIX cells: testpmd)" if gen == "af_xdp" else ""))
    print("queue pairs per port: 2 in the memif and vxlan cells, 1 elsewhere, every DUT alike")
    if VXLAN in args.kinds.split(","):
        print(f"vxlan cell: two instances of each DUT (nodes A and B, a namespace each, a veth "
              f"of MTU {VX_MTU} between them), sharing CPU {DUT_CPU} and sleeping when idle: "
              f"Switchyard poll_mode {VX_POLL_MODE}, its tunnels on kernel UDP sockets; "
              f"OVS-DPDK pmd-maxsleep {VX_OVS_MAXSLEEP}, its tunnels on br-phy over net_af_xdp")
    for d in duts:
        dut = make_dut(d, "memif", "/nonexistent")
        print(f"- {d}: {dut.settings()}" + (f" (build {BUILDS[d]})" if d in BUILDS else ""))


def print_table(results, duts, args):
    def cell(v, size):
        mean = IMIX_MEAN if size == IMIX else size
        return "-" if v is None else f"{v / 1e6:6.2f} Mpps {v * mean * 8 / 1e9:6.2f} Gb/s"

    print(f"\nloop benchmark ({SET.memory}, {SET.traffic} traffic): median of {args.repeat} "
          f"runs of {args.seconds}s, both directions summed, DUT on CPU {DUT_CPU}, "
          f"testpmd forwarding on CPU {GEN_CPU}\n")
    print_grid(SIZE_COLUMNS, size_rows(results), duts, 22,
               lambda d, key: results.get((d,) + key),
               lambda v, key: cell(v, key[1]),
               rounds=lambda d, key: ROUNDS.get((d,) + key + (None, "rate"), {}))


if __name__ == "__main__":
    main()
