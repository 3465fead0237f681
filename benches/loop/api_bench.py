#!/usr/bin/env python3
"""Control API round trips while peers misbehave.

Starts the switch (release build, or SWITCHYARD_BIN) with 50 vhost-user
server ports and 50 memif master ports, then measures the round trip of
`{"op":"port_list"}` on one persistent control connection (p50, p99, max
over --requests calls), first with no hostile connection, then with
--hostile of them held open meanwhile, in four shapes taken in turn:

  partial   the first 4 bytes of a vhost-user header, then nothing
  drip      a vhost-user header one byte every 0.5 s
  silent    a memif connection that sends nothing (the switch's HELLO
            goes unread)
  api-stall a control connection with half a request line

Run as root on an otherwise idle machine:
  cargo build --release -p switchyard
  benches/loop/api_bench.py [--hostile 100] [--requests 2000]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def switch_bin():
    return os.environ.get("SWITCHYARD_BIN", os.path.join(REPO, "target/release/switchyard"))


class Switch:
    def __init__(self, d):
        self.dir = d
        self.control = os.path.join(d, "control.sock")
        cfg = os.path.join(d, "switchyard.toml")
        with open(cfg, "w") as f:
            f.write(f'control_socket = "{self.control}"\nstate_dir = "{d}/state"\n'
                    f'socket_dir = "{d}"\n[[bridge]]\nname = "default"\n')
        self.log = open(os.path.join(d, "switch.log"), "w")
        self.proc = subprocess.Popen([switch_bin(), "run", "--config", cfg],
                                     stdout=self.log, stderr=self.log)
        deadline = time.time() + 10
        while not os.path.exists(self.control):
            if time.time() > deadline:
                sys.exit("the switch did not start")
            time.sleep(0.05)
        self.api = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.api.connect(self.control)
        self.reader = self.api.makefile("rb")

    def call(self, req):
        """The answer, or None when the API answered with an error."""
        self.api.sendall(json.dumps(req).encode() + b"\n")
        resp = json.loads(self.reader.readline())
        return resp.get("result") if resp.get("ok") else None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def hostile(kind, path, stop):
    try:
        if kind == "silent":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
    except OSError:
        return
    header = (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + (0).to_bytes(4, "little")
    try:
        if kind == "partial":
            s.send(header[:4])
        elif kind == "api-stall":
            s.send(b'{"op":"port_l')
        elif kind == "drip":
            for b in header:
                if stop.is_set():
                    break
                s.send(bytes([b]))
                stop.wait(0.5)
        stop.wait()
    except OSError:
        pass
    finally:
        s.close()


def measure(sw, n, limit):
    """p50, p99, max (us) and failed calls; stops after `limit` seconds
    (a stalled switch answers one call a minute)."""
    times, failed, end = [], 0, time.time() + limit
    for _ in range(n):
        t = time.perf_counter()
        if sw.call({"op": "port_list"}) is None:
            failed += 1
        times.append((time.perf_counter() - t) * 1e6)
        if time.time() > end:
            break
    times.sort()
    return times[len(times) // 2], times[max(0, int(len(times) * 0.99) - 1)], times[-1], failed, len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hostile", type=int, default=100)
    ap.add_argument("--requests", type=int, default=2000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sy-api-bench") as d:
        sw = Switch(d)
        try:
            vhost, memif = [], []
            for i in range(50):
                p = os.path.join(d, f"v{i}.sock")
                sw.call({"op": "port_add", "port": {"name": f"v{i}", "kind": "vhost-user", "role": "server",
                                                     "socket": p, "bridge": "default"}})
                vhost.append(p)
                p = os.path.join(d, f"m{i}.sock")
                sw.call({"op": "port_add", "port": {"name": f"m{i}", "kind": "memif", "role": "master",
                                                     "socket": p, "bridge": "default"}})
                memif.append(p)
            rows = [("0", measure(sw, a.requests, 120))]
            stop = threading.Event()
            shapes = ["partial", "drip", "silent", "api-stall"]
            threads = []
            for i in range(a.hostile):
                kind, k = shapes[i % len(shapes)], i // len(shapes)
                # Each vhost-user and memif port serves one connection: the
                # partial and drip peers take different ports.
                path = {"partial": vhost[k % 50], "drip": vhost[(k + 25) % 50],
                        "silent": memif[k % 50]}.get(kind, sw.control)
                t = threading.Thread(target=hostile, args=(kind, path, stop), daemon=True)
                t.start()
                threads.append(t)
            time.sleep(0.5)
            rows.append((str(a.hostile), measure(sw, a.requests, 120)))
            stop.set()
        finally:
            sw.stop()
    print(f"control API round trip (port_list, {a.requests} calls, one persistent connection)")
    print()
    print("| hostile connections |      p50 |      p99 |        max | calls | failed |")
    print("|---------------------|----------|----------|------------|-------|--------|")
    for n, (p50, p99, mx, failed, calls) in rows:
        print(f"| {n:>19} | {p50:5.0f} us | {p99:5.0f} us | {mx:8.0f} us | {calls:5} | {failed:6} |")


if __name__ == "__main__":
    main()
