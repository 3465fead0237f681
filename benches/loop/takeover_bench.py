#!/usr/bin/env python3
"""The takeover benchmark: how long forwarding stops, and what is lost, when
the switch is replaced by takeover (`switchyard run --takeover`), against a
restart (SIGTERM, then start again) and a crash (kill -9, then start again).

For each port kind (memif, vhost-user), a switch with two ports of the kind,
and gapgen (gapgen.c, built here against the system's DPDK) on both: port 0
sends a numbered frame every INTERVAL_US to port 1, through the switch, and
records every gap in arrivals longer than GAP_US. The switch connects to
both of gapgen's sockets (memif slave, vhost-user client), so that a
restarted switch reaches them again by itself; DPDK's memif client and
virtio_user client do not redial a restarted switch at all (the takeover
tests cover those roles: nothing to reconnect). Each cell starts afresh:

  takeover  TAKEOVERS takeovers, 0.3 s apart: the pause of each is its gap
  sigterm   one SIGTERM restart: the gap until frames arrive again
  kill-9    one kill -9 and start again

It prints a table: per kind and cell, the pause (p50 and max over the
events), frames lost (sent and never received), duplicated, and refused
(port 0's ring full while the switch was away: never sent).

With --idle N1,N2,.. each takeover cell is run again beside N idle ports
(half memif, half vhost-user, the switch listening on each, nobody
connected), as a node's pods that are not sending: the pause must not grow
with them. The table adds the switch's own account of each takeover (its
log): the longest pause of its workers, and how many ports the new switch
took up before it (quiet: no connection) and in it.

  ./benches/loop/takeover_bench.py [--kinds memif,vhost-user] [--takeovers 20]
                                   [--idle 0,100,1000]

TAKEOVER_BENCH_LOGS=DIR keeps each cell's switch log there.

Needs root, the release build (`cargo build --release -p switchyard`, or
$SWITCHYARD_BIN), dpdk, dpdk-dev, librte-net-memif23, pkg-config and cc.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loop_bench import REPO, Proc, switchyard_bin  # noqa: E402

GAPGEN_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gapgen.c")
INTERVAL_US = 20
GAP_US = 200


def gapgen_bin():
    """Builds gapgen.c (again if its source is newer)."""
    out = os.path.join(REPO, "target", "loop-bench", "gapgen")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(GAPGEN_SRC):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libdpdk"], check=True,
                           capture_output=True, text=True).stdout.split()
    subprocess.run(["cc", "-O3", "-o", out, GAPGEN_SRC] + flags, check=True)
    return out


class Switch:
    """A switchyard process on a config of its own, replaced as a cell says."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.config = os.path.join(tmp, "switchyard.toml")
        with open(self.config, "w") as f:
            f.write(f'control_socket = "{tmp}/control.sock"\n'
                    f'state_dir = "{tmp}/state"\n'
                    f'socket_dir = "{tmp}"\n'
                    '[[bridge]]\nname = "default"\n')
        self.log = open(os.path.join(tmp, "switchyard.log"), "ab")
        self.p = self.spawn([])
        self.wait_api()

    def spawn(self, extra):
        return subprocess.Popen([switchyard_bin(), "run", "--config", self.config] + extra,
                                stdout=self.log, stderr=self.log, start_new_session=True)

    def add_idle(self, n):
        """n idle ports on the default bridge, through one API connection."""
        import json
        import socket
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(f"{self.tmp}/control.sock")
            f = c.makefile("rw")
            for i in range(n):
                kind, role = ("memif", "master") if i % 2 == 0 else ("vhost-user", "server")
                port = {"name": f"idle{i}", "kind": kind, "role": role,
                        "socket": f"{self.tmp}/idle{i}.sock", "bridge": "default"}
                f.write(json.dumps({"op": "port_add", "port": port}) + "\n")
                f.flush()
                answer = json.loads(f.readline())
                if not answer.get("ok"):
                    raise RuntimeError(f"idle port {i}: {answer}")

    def pauses(self):
        """The switch's own account of each takeover, from its log: (workers
        paused ms, ports taken up before the pause, ports taken up in it)."""
        out = []
        with open(os.path.join(self.tmp, "switchyard.log"), errors="replace") as f:
            restored = float("nan")
            for line in f:
                if "took up the running switch's ports and bridges" in line and " ms=" in line:
                    restored = float(line.split(" ms=")[1].split()[0])
                if "handed over: exiting" not in line:
                    continue
                kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
                out.append((float(kv.get("paused_ms", "nan")), int(kv.get("prepared", 0)),
                            int(kv.get("in_pause", kv.get("ports", 0))),
                            [float(kv.get(k, "nan")) for k in ("saved_ms", "sent_ms", "ready_ms")]
                            + [restored]))
        return out

    def cli(self, *args):
        subprocess.run([switchyard_bin(), "--control", f"{self.tmp}/control.sock", *args],
                       check=True, capture_output=True)

    def wait_api(self):
        end = time.time() + 20
        while time.time() < end:
            r = subprocess.run([switchyard_bin(), "--control", f"{self.tmp}/control.sock",
                                "bridge", "list"], capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError("the switch did not answer")

    def takeover(self):
        old = self.p
        self.p = self.spawn(["--takeover", "--no-restart"])
        if old.wait(30) != 0:
            raise RuntimeError("the old switch failed to hand over")

    def restart(self, sig):
        os.kill(self.p.pid, sig)
        self.p.wait(30)
        self.p = self.spawn([])

    def stop(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGTERM)
            self.p.wait(30)


def cell(kind, what, takeovers, idle=0):
    """One cell: a fresh switch (with `idle` idle ports) and gapgen; returns
    (pauses in ms, counts, the switch's own account)."""
    with tempfile.TemporaryDirectory(prefix="sy-tkb") as tmp:
        sw = Switch(tmp)
        sw.add_idle(idle)
        socks = [os.path.join(tmp, f"g{i}.sock") for i in range(2)]
        for i, s in enumerate(socks):
            if kind == "memif":
                sw.cli("port", "add", f"p{i}", "--kind", "memif", "--role", "slave",
                       "--socket", s, "--bridge", "default")
            else:
                sw.cli("port", "add", f"p{i}", "--kind", "vhost-user", "--role", "client",
                       "--socket", s, "--bridge", "default")
        if kind == "memif":
            vdevs = [f"net_memif{i},role=server,id=0,socket={s},socket-abstract=no"
                     for i, s in enumerate(socks)]
        else:
            # As many descriptors as memif's rings hold (virtio_user: 256).
            vdevs = [f"net_virtio_user{i},path={s},server=1,queue_size=1024"
                     for i, s in enumerate(socks)]
        gen = Proc(["stdbuf", "-o0", gapgen_bin(), "--no-huge", "-m", "256", "--no-pci",
                    "--file-prefix", f"tkb-{os.getpid()}", "--lcores", "0@1"]
                   + [f"--vdev={v}" for v in vdevs] + ["--", str(INTERVAL_US), str(GAP_US)])
        try:
            gen.wait_for("links up", 30)
            time.sleep(1)
            events = 0
            if what == "takeover":
                for _ in range(takeovers):
                    sw.takeover()
                    sw.wait_api()
                    time.sleep(0.3)
                events = takeovers
            else:
                sw.restart(signal.SIGTERM if what == "sigterm" else signal.SIGKILL)
                sw.wait_api()
                time.sleep(10)
                events = 1
            time.sleep(0.5)
        finally:
            os.kill(gen.p.pid, signal.SIGINT)
            gen.p.wait(30)
            time.sleep(0.3)
            drops = subprocess.run([switchyard_bin(), "--control", f"{tmp}/control.sock",
                                    "stats", "--json"], capture_output=True, text=True).stdout
            sw.stop()
            own = sw.pauses()
            if os.environ.get("TAKEOVER_BENCH_LOGS"):
                import shutil
                shutil.copy(os.path.join(tmp, "switchyard.log"),
                            os.path.join(os.environ["TAKEOVER_BENCH_LOGS"],
                                         f"{kind}-{idle}-{what}.log"))
        out = gen.text()
        if os.environ.get("TAKEOVER_BENCH_LOGS"):
            with open(os.path.join(os.environ["TAKEOVER_BENCH_LOGS"],
                                   f"{kind}-{idle}-{what}.gapgen"), "w") as f:
                f.write(out)
        counts = {}
        gaps = []
        quiet = 0.0
        for line in out.splitlines():
            w = line.split()
            if w and w[0] == "quiet":
                quiet = float(w[1])
            elif w and w[0] == "sent":
                counts = dict(zip(w[0::2], (int(x) for x in w[1::2])))
            elif w and w[0] == "gap":
                gaps.append(float(w[2]) / 1000.0)
            elif w and w[0] == "skip":
                at = float(w[1])
                near = [g for g in out.splitlines()
                        if g.startswith("gap") and abs(float(g.split()[1]) - at) < 50]
                print(f"# {kind} {what}: {w[2]} frames missing before one at {at} ms "
                      f"(gaps near: {near})", file=sys.stderr)
        if not counts:
            raise RuntimeError(f"gapgen said nothing:\n{out}")
        try:
            import json
            dropped = {p["name"]: {k: v for k, v in p["drops"].items() if v}
                       for p in json.loads(drops)}
        except (ValueError, KeyError, TypeError):
            dropped = {}
        counts["switch drops"] = {k: v for k, v in dropped.items() if v}
        # Each event is one of the largest gaps; frames that never came back
        # are a pause as long as the rest of the run, at least.
        pauses = sorted(gaps, reverse=True)[:events]
        if quiet > 1000:
            pauses = [float("inf")]
        return pauses, counts, own


def sw_p50_of(v):
    return statistics.median(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="memif,vhost-user")
    ap.add_argument("--takeovers", type=int, default=20)
    ap.add_argument("--idle", default="0",
                    help="idle port counts (comma-separated) beside the two busy ports")
    args = ap.parse_args()
    rows = []
    for idle in (int(n) for n in args.idle.split(",")):
        for kind in args.kinds.split(","):
            # A restart's gap is the peers' redial, whatever the port count.
            for what in ("takeover",) if idle else ("takeover", "sigterm", "kill-9"):
                pauses, c, own = cell(kind, what, args.takeovers, idle)
                n = len(pauses)
                p50 = statistics.median(pauses) if pauses else float("nan")
                mx = max(pauses) if pauses else float("nan")
                sw = [p for p, _, _, _ in own]
                # Where the workers' pause goes (medians): saving, sending,
                # until the new switch is ready, until it confirms.
                if own:
                    at = [statistics.median(o[3][i] for o in own) for i in range(4)]
                    print(f"# {kind} +{idle} idle: paused -> saved {at[0]:.2f} ms, sent "
                          f"{at[1]:.2f}, new ready {at[2]:.2f} (its restore {at[3]:.2f}), "
                          f"confirmed {sw_p50_of(sw):.2f}",
                          file=sys.stderr, flush=True)
                sw_p50 = statistics.median(sw) if sw else float("nan")
                sw_max = max(sw) if sw else float("nan")
                split = f"{own[-1][1]}+{own[-1][2]}" if own else "-"
                rows.append((kind, idle, what, n, p50, mx, sw_p50, sw_max, split, c["sent"],
                             c["lost"], c["duplicated"], c["refused"]))
                print(f"# {kind} +{idle} idle {what}: pauses {[round(p, 2) for p in pauses]} ms,"
                      f" the switch's {[round(p, 2) for p in sw]} ms, {c}",
                      file=sys.stderr, flush=True)
    print("| kind       | idle | replaced by | events | pause p50 | pause max "
          "| workers paused p50 | max | ports before+in | sent |  lost | duplicated | refused |")
    print("|------------|------|-------------|--------|-----------|-----------"
          "|--------------------|-----|-----------------|------|-------|------------|---------|")
    for kind, idle, what, n, p50, mx, sw50, swmx, split, sent, lost, dup, refused in rows:
        def ms(v):
            if v != v:
                return "-"
            return "  never" + " " * 3 if v == float("inf") else f"{v:6.2f} ms"
        print(f"| {kind:10} | {idle:4} | {what:11} | {n:6} | {ms(p50):>9} | {ms(mx):>9} "
              f"| {ms(sw50):>18} | {ms(swmx)} | {split:>15} | {sent} "
              f"| {lost:5} | {dup:10} | {refused:7} |")


if __name__ == "__main__":
    main()
