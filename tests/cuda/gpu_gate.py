#!/usr/bin/env python3
"""Runs a command only where a GPU is present; exits 77 (meson: SKIP) otherwise.

  gpu_gate.py PROBE -- COMMAND ARGS...

PROBE is a program that exits 77 without a GPU (the GPU test program, asked only
to list its tests).
"""
import subprocess
import sys


def main() -> int:
    args = sys.argv[1:]
    if "--" not in args or args.index("--") != 1:
        print("usage: gpu_gate.py PROBE -- COMMAND ARGS...", file=sys.stderr)
        return 2
    probe, command = args[0], args[2:]
    if subprocess.run([probe, "--list-test-names-only"], capture_output=True).returncode == 77:
        print("no GPU visible: skipped")
        return 77
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
