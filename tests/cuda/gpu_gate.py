#!/usr/bin/env python3
"""Runs a command only where enough GPUs are present; exits 77 (meson: SKIP) otherwise.

  gpu_gate.py [--gpus N] PROBE -- COMMAND ARGS...

PROBE is a program that exits 77 without a GPU (the GPU test program, asked only
to list its tests). With --gpus N the command needs N GPUs: they are counted
with `nvidia-smi -L` (within CUDA_VISIBLE_DEVICES where it is set), and fewer,
or no way to count them, skip it.
"""
import os
import shutil
import subprocess
import sys


def visible_gpus() -> int:
    """The GPUs a CUDA program here may use, or -1 where they cannot be counted."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return -1
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True)
    if listed.returncode != 0:
        return -1
    count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        count = min(count, len([d for d in mask.split(",") if d.strip()]))
    return count


def main() -> int:
    args = sys.argv[1:]
    needed = 1
    if args[:1] == ["--gpus"]:
        if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            print("gpu_gate.py: --gpus takes a count of at least 1", file=sys.stderr)
            return 2
        needed, args = int(args[1]), args[2:]
    if "--" not in args or args.index("--") != 1:
        print("usage: gpu_gate.py [--gpus N] PROBE -- COMMAND ARGS...", file=sys.stderr)
        return 2
    probe, command = args[0], args[2:]
    if subprocess.run([probe, "--list-test-names-only"], capture_output=True).returncode == 77:
        print("no GPU visible: skipped")
        return 77
    if needed > 1:
        have = visible_gpus()
        if have < needed:
            print(f"needs {needed} GPUs, " + ("cannot count them (no nvidia-smi)" if have < 0 else f"{have} visible") +
                  ": skipped")
            return 77
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
