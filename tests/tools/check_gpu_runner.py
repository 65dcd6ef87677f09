#!/usr/bin/env python3
"""The GPU bundle's runner (tools/gpu_bundle_run.py) against stand-ins, so that a
mistake in its own logic shows here and not on the GPU machine: a fake
nvidia-smi that lists one H200, a GPU test program that lists 15 tests and exits
15 as Catch2 2.13 does, and stand-ins for train_mlp, pipeline_gpu,
train_mlp_mpi, mpirun and compute-sanitizer that print what the real ones print.

  check_gpu_runner.py tools/gpu_bundle_run.py

Three runs:
  gpu       the probe decides "GPU present" and every step of the plan runs its
            program (train_mlp nccl is skipped for want of a second GPU) and
            passes; the summary carries the bench's figures
  no-gpu    the GPU test program exits 77 and nvidia-smi is absent: exit 0, every
            GPU step SKIP with "no GPU visible"
  no-time   a suite test and the bench that never end, in a plan scaled to 30 s:
            both are stopped at the end of their time and reported SKIP (no time),
            the steps after them run in their own time, every step of the plan has
            its line, and the run ends within the plan
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile

STANDIN = r'''
import json, os, subprocess, sys, time
me, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps([me] + args) + "\n")
gpu = os.environ.get("STANDIN_GPU") == "1"
if "--help" in args:
    print(me + ": usage")
    sys.exit(0)
if me == "nvidia-smi":
    print("NVIDIA H200, 570.124.06, 143771 MiB")
elif me == "test_cuda_gpu":
    if not gpu:
        print("no GPU visible: the GPU tests are skipped")
        sys.exit(77)
    if "--list-test-names-only" in args:
        for i in range(15):
            print(f"GPU test case {i}")
        sys.exit(15)  # Catch2 2.13: the number of tests listed
    if os.environ.get("STANDIN_HANG") == "1":
        time.sleep(3600)  # the runner kills its process group
    print("All tests passed (1234 assertions in 15 test cases)")
elif me == "cpu_test":
    print("All tests passed (12 assertions in 3 test cases)")
elif me == "train_mlp":
    print("loss 1.124388 -> 0.035566 over 60 steps")
    print("step time: pipelined 4.00 ms, sequential 8.00 ms (mean over 60 steps): 0.50 of the sequential step")
    print("  max |pipelined - sequential| over 4,202,496 parameters = 0 (bit-for-bit equal) (tolerance 0): ok")
    if "--replicas" in args:
        print("gradient reductions (replica 0's devices): 1.500 ms in all, exposed after the last compute 0.700 ms "
              "(most of any device); simulated with the measured costs: exposed 0.650 ms; beside compute: 53% "
              "measured, 57% simulated")
elif me == "train_mlp_mpi":
    if int(os.environ.get("STANDIN_RANKS", "1")) > 1:  # more ranks than the stand-in machine's one GPU
        print("train_mlp_mpi: rank 0: start-up: ranks 0 and 1 are both on GPU GPU-8f3e2a1c-0001-0203-4567-89abcdef107f, "
              "which a rank needs for itself: NCCL runs one rank per GPU; ...")
        sys.exit(1)
    print("check against sequential training on rank 0: max |pipelined - sequential| = 0 (bit-for-bit equal): ok")
elif me == "pipeline_gpu":
    if os.environ.get("STANDIN_HANG") == "1" and "--overlap" not in args:
        time.sleep(3600)
    out = args[args.index("--json-file") + 1]
    hiddens = [int(h) for h in args[args.index("--hidden") + 1].split(",")]
    rows = []
    for h in hiddens:
        rows.append({"schedule": "cublas", "dtype": "bf16", "hidden": h, "micro_batches": 8, "tflops": 700.0,
                     "peak_percent": 70.7, "tflops_dev": None, "peak_percent_dev": None, "step_ms": 10.0,
                     "sequential_ms": None, "transport": "none", "wrong": None, "vs_plain": None})
        acts = args[args.index("--activations") + 1].split(",") if "--activations" in args else ["fp32"]
        for s in args[args.index("--schedules") + 1].split(","):
            for a in acts:
                rows.append({"schedule": s, "dtype": "bf16", "activations": a, "hidden": h, "micro_batches": 8,
                             "tflops": 500.0, "peak_percent": 50.5, "tflops_dev": 550.0, "peak_percent_dev": 55.6,
                             "step_ms": 12.0 if a == "fp32" else 10.8, "sequential_ms": 11.0, "transport": "virtual",
                             "wrong": 0, "vs_plain": None, "handoff_kib": 4096.0 if a == "fp32" else 2048.0})
                plain = rows[-1]
                if "--overlap" in args:
                    rows.append(dict(plain, schedule=s + "+overlap", vs_plain=1.1))
                if "--offload" in args:
                    rows.append(dict(plain, schedule=s + "+offload", vs_plain=0.97))
                if "--replicas" in args:
                    rows[-1].update(replicas=int(args[args.index("--replicas") + 1]), exposed_reduction_ms=0.25,
                                    exposed_reduction_sim_ms=0.2, hidden_reduction_share=0.8,
                                    hidden_reduction_share_sim=0.9)
    with open(out, "w") as f:
        json.dump({"rows": rows}, f)
    print("schedule  dtype  hidden  TFLOP/s")
elif me == "mpirun":
    exe = next(a for a in args if os.path.sep in a)
    ranks = args[args.index("-n") + 1]
    sys.exit(subprocess.run([exe] + args[args.index(exe) + 1:], env=dict(os.environ, STANDIN_RANKS=ranks)).returncode)
elif me == "compute-sanitizer":
    rc = subprocess.run(args[args.index("--error-exitcode") + 2:], stdout=subprocess.DEVNULL).returncode
    print("========= ERROR SUMMARY: 0 errors")
    sys.exit(rc)
'''

PROGRAMS = {  # bundle path: stand-in name
    "tests/test_cuda_gpu": "test_cuda_gpu",
    "tests/test_cuda_host": "cpu_test",
    "examples/train_mlp": "train_mlp",
    "examples/train_mlp_mpi": "train_mlp_mpi",
    "bench/pipeline_gpu": "pipeline_gpu",
}


def write_standin(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n" + STANDIN)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_bundle(tmp, runner):
    b = os.path.join(tmp, "bundle")
    os.makedirs(os.path.join(b, "share"))
    os.makedirs(os.path.join(b, "lib"))
    shutil.copyfile(runner, os.path.join(b, "run"))
    os.chmod(os.path.join(b, "run"), 0o755)
    shutil.copyfile(os.path.join(os.path.dirname(runner), "find_cuda_libs.py"), os.path.join(b, "share", "find_cuda_libs.py"))
    for rel, name in PROGRAMS.items():  # a stand-in behaves as its file's name says
        path = os.path.join(b, "build", rel)
        real = os.path.join(os.path.dirname(path), name)
        write_standin(real)
        if real != path:
            os.symlink(real, path)
    with tarfile.open(os.path.join(b, "share", "src.tar.xz"), "w:xz") as tar:
        meson = os.path.join(tmp, "meson.build")
        with open(meson, "w") as f:
            f.write("project('stand-in')\n")
        tar.add(meson, arcname="src/meson.build")
    manifest = {
        "commit": "0000000", "made": "2026-01-01T00:00:00Z", "nvcc": "nvcc release 13.0", "gpu_arch": ["90"],
        "executables": {rel: rel.split("/")[-1] for rel in PROGRAMS},
        "mpi_executables": ["examples/train_mlp_mpi"], "toolkit_libs": [], "mpi_libs": [], "bundled_libs": [],
        "provided": {}, "needs_at_least": {"GLIBC": "GLIBC_2.34"}, "subproject_versions": {},
        "tests": [
            {"name": "cuda_host", "cmd": ["@BUILD@/tests/test_cuda_host"], "env": {}, "timeout": 300, "mpi": False},
            {"name": "cuda_gpu", "cmd": ["@BUILD@/tests/test_cuda_gpu"], "env": {}, "timeout": 600, "mpi": False},
        ],
    }
    with open(os.path.join(b, "share", "bundle.json"), "w") as f:
        json.dump(manifest, f)
    return b


def run(tmp, bundle, name, gpu, smi=True, hang=False, budget=None):
    bin_dir = os.path.join(tmp, "bin-" + name)
    for tool in ["mpirun", "compute-sanitizer"] + (["nvidia-smi"] if smi else []):
        write_standin(os.path.join(bin_dir, tool))
    log = os.path.join(tmp, name + ".calls")
    env = {"PATH": bin_dir + ":/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "STANDIN_LOG": log,
           "STANDIN_GPU": "1" if gpu else "0", "STANDIN_HANG": "1" if hang else "0", "CUDA_HOME": "/nonexistent"}
    if budget:
        env["PIPEWEAVE_RUN_BUDGET_S"] = str(budget)
    results = os.path.join(tmp, "results-" + name)
    p = subprocess.run([sys.executable, os.path.join(bundle, "run"), results], env=env, capture_output=True, text=True,
                       timeout=300)
    with open(os.path.join(results, "summary.txt")) as f:
        summary = f.read()
    calls = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
    calls = [c for c in calls if "--help" not in c]  # the setup step's start check asks every program
    return p.returncode, summary, calls, p.stdout + p.stderr


def plan_steps(runner):
    text = open(runner).read()
    body = text[text.index("PLAN = ["):text.index("]\nPLAN_S")]
    return re.findall(r'\("([^"]+)", \d+, \d+\)', body)


def line_of(summary, step):
    hits = [l for l in summary.splitlines() if re.match(r"^(PASS|FAIL|SKIP|SKIP \(no time\)) " + re.escape(step) + ":", l)]
    return hits[0] if len(hits) == 1 else None


def main() -> int:
    runner = os.path.abspath(sys.argv[1])
    steps = plan_steps(runner)
    problems, shown = [], ""

    def expect(cond, what, out=""):
        if not cond:
            problems.append(what + (("\n" + out) if out else ""))

    expect(len(steps) >= 10, f"the plan lists {steps}")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(tmp, runner)

        # 1. A GPU: every step runs.
        rc, summary, calls, out = run(tmp, bundle, "gpu", gpu=True)
        shown = summary
        expect(rc == 0, f"gpu run: exit {rc}", summary + out)
        expect(line_of(summary, "probe") is not None and line_of(summary, "probe").startswith("PASS probe: ") and
               "lists 15 test cases (exit 15)" in line_of(summary, "probe"), "gpu run: the probe did not decide "
               "'GPU present' from a list that exits 15", summary)
        for step in steps:
            if step == "setup":
                continue
            line = line_of(summary, step)
            if step == "train_mlp nccl":
                expect(line is not None and line.startswith("SKIP") and "GPU per pipeline device" in line,
                       f"gpu run: {step}: {line}")
            else:
                expect(line is not None and line.startswith("PASS"), f"gpu run: step {step}: {line}", summary)
        ran = [c[0] for c in calls]
        expect(ran.count("train_mlp") == 3 + 1 + 2, f"gpu run: train_mlp ran {ran.count('train_mlp')} times, not "
               "3 + 1 with replicas + 2 under compute-sanitizer")
        bf16 = [c for c in calls if c[0] == "train_mlp" and "--dtype" in c and c[c.index("--dtype") + 1] == "bf16"]
        expect(len(bf16) == 2 and all(c[c.index("--math") + 1] == "bf16" for c in bf16),
               f"gpu run: train_mlp with bf16 activations and bf16 GEMMs, once alone and once under memcheck: {bf16}")
        expect("bf16 GEMMs, bf16 activations" in (line_of(summary, "train_mlp bf16") or ""),
               "gpu run: the bf16 run's line names its activations", summary)
        replicas = [c for c in calls if c[0] == "train_mlp" and "--replicas" in c]
        expect(len(replicas) == 1 and replicas[0][replicas[0].index("--replicas") + 1] == "2" and
               replicas[0][replicas[0].index("--transport") + 1] == "virtual", f"gpu run: the replicas run: {replicas}")
        expect("reductions 1.500 ms, exposed 0.700 ms (simulated 0.650), beside compute 53% (simulated 57%)" in
               (line_of(summary, "train_mlp replicas") or ""), "gpu run: the replicas' figures", summary)
        expect(ran.count("pipeline_gpu") == 3, f"gpu run: pipeline_gpu ran {ran.count('pipeline_gpu')} times")
        dp = [c for c in calls if c[0] == "pipeline_gpu" and "--replicas" in c]
        expect(len(dp) == 1 and dp[0][dp[0].index("--replicas") + 1] == "2" and
               dp[0][dp[0].index("--transport") + 1] == "virtual", f"gpu run: the replicas bench: {dp}")
        r = line_of(summary, "bench replicas") or ""
        for want in ("1f1b: exposed 0.250 ms (simulated 0.200 ms), beside compute 80% (simulated 90%)",
                     "interleaved: exposed 0.250 ms", "#wrong 0", "(table in replicas.txt)"):
            expect(want in r, f"gpu run: the replicas bench line lacks {want!r}: {r}")
        o = line_of(summary, "overlap") or ""
        for want in ("interleaved+overlap M=8 bf16: the plain step over the overlapped 1.10",
                     "interleaved+offload M=8 bf16: the plain step over the offloaded 0.97", "#wrong 0"):
            expect(want in o, f"gpu run: the overlap line lacks {want!r}: {o}")
        expect(["test_cuda_gpu"] in calls, "gpu run: the suite did not run the GPU test program")
        expect(ran.count("train_mlp_mpi") == 2 and ran.count("compute-sanitizer") == 2, f"gpu run: calls {ran}")
        m = line_of(summary, "mpi") or ""
        expect(m.startswith("PASS mpi:") and "; 2 ranks on 1 GPU refused: start-up: ranks 0 and 1 are both on GPU "
               "GPU-8f3e2a1c-0001-0203-4567-89abcdef107f" in m, f"gpu run: the mpi line: {m}")
        bench = [c for c in calls if c[0] == "pipeline_gpu" and "--overlap" not in c and "--replicas" not in c]
        expect(bench and "bf16" == bench[0][bench[0].index("--dtypes") + 1], "gpu run: the bench is not bf16")
        b = line_of(summary, "bench") or ""
        for want in ("cuBLAS alone 700 TFLOP/s (70.7% of 990)", "550 TFLOP/s of device time",
                     "pipelined/sequential step over virtual: 1f1b 1.09", "bf16 hidden 4096, bf16 activations: ",
                     "step with bf16 activations / with fp32: 1f1b 0.90 (hand-over 4096 -> 2048 KiB)", "#wrong 0"):
            expect(want in b, f"gpu run: the bench line lacks {want!r}: {b}")
        expect("pipelined 4.00 ms against sequential 8.00 ms a step (0.50)" in (line_of(summary, "train_mlp bf16") or ""),
               "gpu run: train_mlp's figures", summary)
        expect(re.search(r"\[\d+ s( of its \d+ s|; budget \d+ s, \d+ s with what earlier steps left)\]",
                         line_of(summary, "bench") or "") is not None,
               "gpu run: a step's line does not say its time against its budget")
        expect("# time plan (s): setup 20, probe 10, suite 70" in summary, "gpu run: no printed time plan", summary)
        plan_total = re.search(r"; (\d+) in all", summary)
        expect(plan_total is not None and int(plan_total.group(1)) <= 300,
               "gpu run: the plan is over the 300 s a run may take", summary)

        # 2. No GPU: exit 0, the GPU steps SKIP.
        rc, summary, calls, out = run(tmp, bundle, "no-gpu", gpu=False, smi=False)
        expect(rc == 0, f"no-gpu run: exit {rc}", summary + out)
        for step in steps:
            if step in ("setup", "probe", "suite"):
                continue
            line = line_of(summary, step)
            expect(line is not None and line.startswith("SKIP " + step + ": no GPU visible"),
                   f"no-gpu run: {step}: {line}", summary)
        expect(not any(c[0] in ("train_mlp", "pipeline_gpu") for c in calls), "no-gpu run: a GPU program ran")

        # 3. Out of time: a suite test and the bench that never end.
        rc, summary, calls, out = run(tmp, bundle, "no-time", gpu=True, hang=True, budget=30)
        expect(rc == 0, f"no-time run: exit {rc}", summary + out)
        for name, why in (("suite cuda_gpu", "stopped at the end of the suite's budget"),
                          ("bench", "stopped at the end of its budget")):
            line = line_of(summary, name) or ""
            expect(line.startswith(f"SKIP (no time) {name}: {why}"), f"no-time run: {name}: {line}", summary)
        lines = {s: line_of(summary, s) for s in steps if s != "setup"}
        expect(all(lines.values()), "no-time run: a step of the plan has no line", summary)
        for s in ("train_mlp fp32", "overlap", "mpi", "memcheck", "racecheck"):
            expect((lines[s] or "").startswith("PASS"), f"no-time run: {s} did not run in its own time: {lines[s]}")
        took = re.search(r"; (\d+) s \(the plan: 30 s\)", summary)
        expect(took is not None and int(took.group(1)) <= 32, "no-time run: the run overran its plan", summary)
    for p in problems:
        print("FAIL: " + p)
    print(f"{len(problems)} problems")
    if os.environ.get("SHOW"):  # the stand-in GPU run's summary, to read
        print(shown)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
