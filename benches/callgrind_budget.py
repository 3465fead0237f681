#!/usr/bin/env python3
"""Instructions per frame of the hot path, against the budget CI keeps.

Builds the hot-path benches (release, `cargo bench --no-run`), runs each
bench that `benches/budget.toml` names under callgrind, collecting only
inside the worker iteration (`--toggle-collect='*iterate_with*'`), and
divides the instructions collected by the frames forwarded (the calls of
`forward_burst_with` times the burst of 32): the noise-free figure this VM
gives (docs/benchmarks.md). Prints a table; exits 1 when a figure is above
its budget.

    benches/callgrind_budget.py                  check against benches/budget.toml
    benches/callgrind_budget.py --budget FILE    against another file
    benches/callgrind_budget.py --bin PATH       a hot_path binary built already

Raising a budget is a reviewed change with its reason in the commit.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BURST = 32


def build() -> str:
    """The hot_path bench binary, built in release."""
    out = subprocess.run(
        ["cargo", "bench", "-p", "switchyard-benches", "--bench", "hot_path",
         "--no-run", "--locked", "--message-format=json"],
        cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, check=True, text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "hot_path" \
                and msg.get("executable"):
            return msg["executable"]
    sys.exit("callgrind_budget: cargo built no hot_path bench")


def callgrind(binary: str, bench: str, seconds: float) -> tuple[int, int]:
    """(instructions collected in the worker iteration, frames forwarded)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--toggle-collect=*iterate_with*",
             f"--callgrind-out-file={path}", binary, "--bench", bench, "--exact",
             "--profile-time", str(seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
        if run.returncode != 0:
            sys.exit(f"callgrind_budget: {bench} under callgrind exited {run.returncode}:\n"
                     f"{run.stdout}{run.stderr}")
        return parse(path)


def parse(path: str) -> tuple[int, int]:
    """The totals of a callgrind output file, and the calls it records of
    `forward_burst_with` times the burst (the `cfn=`/`calls=` lines, names
    compressed as `(id) name` on first use)."""
    names: dict[str, str] = {}
    total = None
    bursts = 0
    callee = None
    name_re = re.compile(r"^c?fn=\((\d+)\)(?: (.*))?$")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = name_re.match(line)
            if m:
                ident, name = m.groups()
                if name is not None:
                    names[ident] = name
                if line.startswith("cfn="):
                    callee = names.get(ident, "")
                continue
            if line.startswith("calls=") and callee is not None:
                if "forward_burst_with" in callee:
                    bursts += int(line.split("=", 1)[1].split()[0])
                callee = None
                continue
            if line.startswith("totals:") or (line.startswith("summary:") and total is None):
                total = int(line.split(":", 1)[1].split()[0])
    if total is None or bursts == 0:
        sys.exit(f"callgrind_budget: {path}: no totals or no forward_burst_with calls")
    return total, bursts * BURST


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default=os.path.join(REPO, "benches", "budget.toml"))
    ap.add_argument("--bin", help="a hot_path bench binary built already")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="criterion's --profile-time for each bench (wall time under callgrind)")
    args = ap.parse_args()
    with open(args.budget, "rb") as f:
        budget = tomllib.load(f)["instructions_per_frame"]
    binary = args.bin or build()
    over = []
    print(f"{'bench':<48} {'instr/frame':>12} {'budget':>8}")
    for bench, limit in budget.items():
        instructions, frames = callgrind(binary, bench, args.seconds)
        per_frame = instructions / frames
        mark = "" if per_frame <= limit else "  OVER"
        print(f"{bench:<48} {per_frame:>12.1f} {limit:>8.1f}{mark}")
        if mark:
            over.append(bench)
    if over:
        print(f"callgrind_budget: over budget: {', '.join(over)} "
              f"(a slower hot path, or a budget to raise with its reason: {args.budget})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
