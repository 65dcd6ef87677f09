#!/usr/bin/env python3
"""Runs a command-line tool and checks its exit status and output.

  cli_check.py [--status N] [--stdout-file F] [--stdout-has TEXT]... [--stderr-has TEXT]...
               [--stderr-lines N] -- PROGRAM ARGS...
"""
import argparse
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--status", type=int, default=0)
    ap.add_argument("--stdout-file")
    ap.add_argument("--stdout-has", action="append", default=[])
    ap.add_argument("--stderr-has", action="append", default=[])
    ap.add_argument("--stderr-lines", type=int)
    ap.add_argument("--stdout-readme", help="README whose '$ build/examples/NAME ARGS' block must equal stdout")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = [c for c in args.command if c != "--"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    problems = []
    if proc.returncode != args.status:
        problems.append(f"exit status {proc.returncode}, expected {args.status}")
    if args.stdout_file:
        with open(args.stdout_file) as f:
            expected = f.read()
        if proc.stdout != expected:
            problems.append(f"stdout differs from {args.stdout_file}")
    if args.stdout_readme:
        shown = "$ build/examples/" + os.path.basename(cmd[0]) + (" " + " ".join(cmd[1:]) if cmd[1:] else "")
        with open(args.stdout_readme) as f:
            text = f.read()
        start = text.find(shown + "\n")
        if start < 0:
            problems.append(f"{args.stdout_readme} shows no block for {shown!r}")
        else:
            block = text[start + len(shown) + 1:text.find("```", start)]
            if block != proc.stdout:
                problems.append(f"stdout differs from what {args.stdout_readme} shows after {shown!r}")
    problems += [f"stdout lacks {t!r}" for t in args.stdout_has if t not in proc.stdout]
    problems += [f"stderr lacks {t!r}" for t in args.stderr_has if t not in proc.stderr]
    if args.stderr_lines is not None and len(proc.stderr.splitlines()) != args.stderr_lines:
        problems.append(f"stderr has {len(proc.stderr.splitlines())} lines, expected {args.stderr_lines}")
    if problems:
        print("$ " + " ".join(cmd))
        print("--- stdout ---\n" + proc.stdout[-4000:])
        print("--- stderr ---\n" + proc.stderr[-4000:])
        for p in problems:
            print("FAIL: " + p)
        return 1
    print("ok: " + " ".join(cmd[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
