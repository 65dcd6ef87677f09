#!/usr/bin/env python3
"""Runs a command only where enough GPUs are present; exits 77 (meson: SKIP) otherwise.

  gpu_gate.py [--gpus N | --one-gpu] PROBE -- COMMAND ARGS...

PROBE is a program that exits 77 without a GPU (the GPU test program, asked only
to list its tests). With --gpus N the command needs N GPUs: PROBE --count-gpus
prints how many the CUDA runtime sees, and fewer skip it. With --one-gpu the
command sees only the first GPU it would have seen (CUDA_VISIBLE_DEVICES set to
the first entry of the one it inherits, or 0).
"""
import os
import subprocess
import sys

PROBE_S = 120  # a probe that takes longer is stuck (a wedged driver): it fails the test, never hangs it


def probe(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=PROBE_S)
    except subprocess.TimeoutExpired:
        print(f"gpu_gate.py: {' '.join(args)} did not end in {PROBE_S} s", file=sys.stderr)
        sys.exit(1)


def main() -> int:
    args = sys.argv[1:]
    needed, env = 1, None
    if args[:1] == ["--one-gpu"]:
        mask = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        env, args = dict(os.environ, CUDA_VISIBLE_DEVICES=mask or "0"), args[1:]
    elif args[:1] == ["--gpus"]:
        if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            print("gpu_gate.py: --gpus takes a count of at least 1", file=sys.stderr)
            return 2
        needed, args = int(args[1]), args[2:]
    if "--" not in args or args.index("--") != 1:
        print("usage: gpu_gate.py [--gpus N | --one-gpu] PROBE -- COMMAND ARGS...", file=sys.stderr)
        return 2
    prober, command = args[0], args[2:]
    if probe([prober, "--list-test-names-only"]).returncode == 77:
        print("no GPU visible: skipped")
        return 77
    if needed > 1:
        counted = probe([prober, "--count-gpus"])
        text = counted.stdout.strip()
        if counted.returncode != 0 or not text.isdigit():
            print(f"gpu_gate.py: {prober} --count-gpus exited {counted.returncode} with {text!r}", file=sys.stderr)
            return 1
        if int(text) < needed:
            print(f"needs {needed} GPUs, {text} visible: skipped")
            return 77
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
