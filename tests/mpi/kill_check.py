#!/usr/bin/env python3
"""Loses a rank of a multi-process run and checks that the others notice.

  kill_check.py --ranks 4 --kill-rank 2 --timeout-ms 1000 -- FAULT_RANK

Starts `mpirun --enable-recovery -n RANKS FAULT_RANK ...` (tests/mpi/fault_rank.cpp),
whose rank KILL_RANK ends its process with SIGKILL in the middle of a step.
(--enable-recovery keeps mpirun from ending the other ranks itself, so that
what is checked is the library's own failure protocol.) Checks that every other
rank reports an error naming the lost rank and exits non-zero within the
timeout plus a second of the kill, that mpirun ends within a time limit, and
that no process of the run is left. The whole run is bounded: on a hang the
process group is killed and the check fails.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time


def processes_with(token):
    """PIDs of the processes whose command line holds `token`, other than this one."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=2)
    ap.add_argument("--timeout-ms", type=int, default=1000)
    ap.add_argument("--limit", type=float, default=60.0, help="seconds the whole run may take")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"]
    token = f"pw-kill-check-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    argv = ["mpirun", "--oversubscribe", "--bind-to", "none", "--enable-recovery", "-n", str(args.ranks)] + command + [
        "--kill-rank", str(args.kill_rank), "--kill-step", str(args.kill_step), "--timeout-ms", str(args.timeout_ms),
        "--token", token]
    try:
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    except FileNotFoundError:
        print("mpirun could not be started: skipped")
        return 77
    try:
        out, err = run.communicate(timeout=args.limit)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, err = run.communicate()
        for pid in processes_with(token):
            os.kill(pid, signal.SIGKILL)
        print(f"FAIL: the run did not end within {args.limit} s\n{out}{err}")
        return 1
    problems = []
    killed_at, exits, errors = None, {}, {}
    for line in err.splitlines():
        m = re.match(r"^fault_rank: rank (\d+): (killed at|exit (-?\d+) at) (\d+)$", line)
        if m and m.group(2) == "killed at":
            killed_at = int(m.group(4))
        elif m:
            exits[int(m.group(1))] = (int(m.group(3)), int(m.group(4)))
        m = re.match(r"^fault_rank: rank (\d+): error: (.*)$", line)
        if m:
            errors[int(m.group(1))] = m.group(2)
    for report in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer"):
        if report in err:
            problems.append(f"a sanitizer report: {report}")
    others = [r for r in range(args.ranks) if r != args.kill_rank]
    lost = f"rank {args.kill_rank} does not answer"
    if killed_at is None:
        problems.append(f"rank {args.kill_rank} did not report its kill")
    for r in others:
        if r not in exits:
            problems.append(f"rank {r} did not exit")
            continue
        status, at = exits[r]
        if status == 0:
            problems.append(f"rank {r} exited 0")
        if lost not in errors.get(r, ""):
            problems.append(f"rank {r}'s error does not name the lost rank: {errors.get(r, '(none)')}")
        if killed_at is not None and (at - killed_at) / 1e6 > args.timeout_ms + 1000:
            problems.append(f"rank {r} exited {(at - killed_at) / 1e6:.0f} ms after the kill "
                            f"(more than the timeout, {args.timeout_ms} ms, plus a second)")
    if args.kill_rank in exits:
        problems.append(f"rank {args.kill_rank} was not killed")
    deadline = time.monotonic() + 2
    left = processes_with(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_with(token)
    if left:
        problems.append(f"processes left: {left}")
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    if problems:
        print("FAIL: " + "; ".join(problems) + "\n" + out + err)
        return 1
    slowest = max((exits[r][1] - killed_at) / 1e6 for r in others)
    print(f"ok: rank {args.kill_rank} killed; ranks {', '.join(map(str, others))} reported it and exited non-zero "
          f"within {slowest:.0f} ms of the kill (timeout {args.timeout_ms} ms); no process left\n"
          f"  e.g. rank {others[0]}: {errors[others[0]]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
