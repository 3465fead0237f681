#!/usr/bin/env python3
"""Scale and idle benchmark of the switch daemon (no traffic):

- adds memif master ports one by one over the control API, timing each add
  (the persisted state is rewritten on every add, as in production);
- reports the daemon's resident memory per port;
- measures the CPU the daemon uses while idle in adaptive mode, with 100
  ports and with all of them (utime + stime from /proc over a window).

  cargo build --release -p switchyard
  benches/loop/scale_bench.py [--ports 1000] [--idle-seconds 10]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def call(path, req):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall((json.dumps(req) + "\n").encode())
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    r = json.loads(buf)
    if not r.get("ok"):
        raise RuntimeError(f"{req['op']}: {r.get('error')}")
    return r.get("result")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def idle_cpu(pid, seconds):
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.time(), cpu_ticks(pid)
    time.sleep(seconds)
    return 100.0 * (cpu_ticks(pid) - c0) / hz / (time.time() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ports", type=int, default=1000)
    ap.add_argument("--idle-seconds", type=float, default=10)
    args = ap.parse_args()
    binary = os.path.join(REPO, "target", "release", "switchyard")
    tmp = tempfile.mkdtemp(prefix="sy-scale-")
    ctl = os.path.join(tmp, "control.sock")
    cfg = os.path.join(tmp, "switchyard.toml")
    with open(cfg, "w") as f:
        f.write(f'control_socket = "{ctl}"\nstate_dir = "{tmp}/state"\nsocket_dir = "{tmp}"\n'
                '[dataplane]\nworkers = 1\ncpus = [0]\npoll_mode = "adaptive"\n'
                '[[bridge]]\nname = "default"\n')
    p = subprocess.Popen([binary, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
    try:
        end = time.time() + 10
        while not os.path.exists(ctl) and time.time() < end:
            time.sleep(0.05)
        time.sleep(0.5)
        base = rss_kib(p.pid)
        print(f"idle, 0 ports: {idle_cpu(p.pid, args.idle_seconds):.2f}% of a CPU")
        times = []
        for i in range(args.ports):
            spec = {"name": f"p{i}", "kind": "memif", "role": "master",
                    "socket": os.path.join(tmp, f"p{i}.sock"), "bridge": "default"}
            t = time.perf_counter()
            call(ctl, {"op": "port_add", "port": spec})
            times.append((time.perf_counter() - t) * 1e3)
            if i + 1 == 100:
                time.sleep(0.5)
                print(f"idle, 100 ports: {idle_cpu(p.pid, args.idle_seconds):.2f}% of a CPU")
        times_sorted = sorted(times)
        print(f"port add over the API ({args.ports} memif ports): "
              f"median {statistics.median(times):.2f} ms, "
              f"p99 {times_sorted[int(len(times) * 0.99) - 1]:.2f} ms, "
              f"max {times_sorted[-1]:.2f} ms, first 100 median "
              f"{statistics.median(times[:100]):.2f} ms")
        time.sleep(0.5)
        grown = rss_kib(p.pid) - base
        print(f"resident memory: +{grown} KiB for {args.ports} ports = "
              f"{grown / args.ports:.1f} KiB per port (memif regions are mapped "
              f"when a peer connects, not before)")
        print(f"idle, {args.ports} ports: {idle_cpu(p.pid, args.idle_seconds):.2f}% of a CPU")
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
