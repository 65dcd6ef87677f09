#!/usr/bin/env python3
"""Starts a multi-process program under `mpirun -n RANKS` where no rank can start
and checks that every rank refuses, with the same message, within a time limit
(no rank left hanging in a collective).

  refusal_check.py [--probe PROBE] --ranks 3 [--differ ARG ...] --expect TEXT [--expect TEXT ...] -- PROGRAM ARGS...

With --probe, PROBE exits 77 when no GPU is visible; with a GPU the ranks could
start, so the check is skipped (exit 77). --differ adds arguments to the last
rank's command line only (mpirun's `-n R-1 PROGRAM ARGS : -n 1 PROGRAM ARGS DIFFER`).
"""
import argparse
import os
import re
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe")
    ap.add_argument("--differ", action="append", default=[])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"]
    if args.probe and subprocess.run([args.probe, "--list-test-names-only"], capture_output=True).returncode != 77:
        print("a GPU is visible: the ranks could start; skipped")
        return 77
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1")
    try:
        ranks = ["-n", str(args.ranks)] + command
        if args.differ:
            ranks = ["-n", str(args.ranks - 1)] + command + [":", "-n", "1"] + command + args.differ
        run = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none"] + ranks,
                             capture_output=True, text=True, timeout=args.limit, env=env)
    except FileNotFoundError:
        print("mpirun could not be started: skipped")
        return 77
    except subprocess.TimeoutExpired:
        print(f"FAIL: the ranks did not stop within {args.limit} s")
        return 1
    messages = {}
    for line in run.stderr.splitlines():
        m = re.match(r"^\S+: rank (\d+): (.*)$", line)
        if m:
            messages[int(m.group(1))] = m.group(2)
    problems = []
    if run.returncode == 0:
        problems.append("mpirun exited 0")
    if sorted(messages) != list(range(args.ranks)):
        problems.append(f"ranks that reported: {sorted(messages)}")
    if len(set(messages.values())) > 1:
        problems.append("the ranks' messages differ")
    for text in args.expect:
        if not all(text in m for m in messages.values()):
            problems.append(f"not every message has: {text}")
    if problems:
        print("FAIL: " + "; ".join(problems) + "\n" + run.stdout + run.stderr)
        return 1
    print(f"ok: all {args.ranks} ranks refused with: {next(iter(messages.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
