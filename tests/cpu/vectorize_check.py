#!/usr/bin/env python3
"""Checks that the compiler vectorizes every elementwise loop of the CPU backend.

  vectorize_check.py --header HEADER -- CXX ARGS... SOURCE

HEADER is include/pipeweave/cpu/backend.hpp: its loops are the ones that follow
PIPEWEAVE_INDEPENDENT_ITERATIONS. SOURCE instantiates them with every functor the
library runs through them; it is compiled with GCC's vectorization report
(-fopt-info-vec-all). Each such loop must be reported vectorized at least once and
never "couldn't vectorize". Prints the loops and what the compiler said.
"""
import argparse
import os
import re
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--header", required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = [c for c in args.command if c != "--"]
    with open(args.header) as f:
        lines = f.read().splitlines()
    # The loop on the line after each use of the pragma (1-based line numbers).
    loops = [i + 2 for i, line in enumerate(lines) if line.strip() == "PIPEWEAVE_INDEPENDENT_ITERATIONS"]
    if not loops:
        print(f"FAIL: no loop marked PIPEWEAVE_INDEPENDENT_ITERATIONS in {args.header}", file=sys.stderr)
        return 1
    proc = subprocess.run(cmd + ["-fopt-info-vec-all", "-c", "-o", os.devnull], capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        print("FAIL: the source does not compile", file=sys.stderr)
        return 1
    name = re.escape(os.path.basename(args.header))
    bad = 0
    for loop in loops:
        at = re.compile(rf"{name}:{loop}:\d+: (optimized|missed): (loop vectorized[^\n]*|couldn't vectorize loop)")
        said = [m.group(2) for m in at.finditer(proc.stderr)]
        vectorized = sum(s.startswith("loop vectorized") for s in said)
        missed = sum(s == "couldn't vectorize loop" for s in said)
        ok = vectorized > 0 and missed == 0
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'}: {os.path.basename(args.header)}:{loop} `{lines[loop - 1].strip()}`: "
              f"vectorized {vectorized} times, not vectorized {missed} times")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
