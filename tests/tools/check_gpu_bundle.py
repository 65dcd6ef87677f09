#!/usr/bin/env python3
"""Makes the GPU bundle of a build in a temporary directory and checks it: at
most 40 MiB, every library its executables need outside the CUDA toolkit, the
driver, the C/C++ runtime and MPI resolves inside the bundle (gpu_bundle.py
check), every test of the cuda suite is in its manifest, no command there
names a path of this machine's build or source tree, and its `run` in a clean
environment (env -i, PATH=/usr/bin:/bin) exits 0 here, with the suite run and
every GPU check SKIP.

  check_gpu_bundle.py tools/gpu_bundle.py BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    tool, build = sys.argv[1], os.path.abspath(sys.argv[2])
    with open(os.path.join(build, "meson-info", "meson-info.json")) as f:
        dirs = json.load(f)["directories"]
    with open(os.path.join(build, "meson-info", "intro-tests.json")) as f:
        suite = [t["name"] for t in json.load(f) if any(s.endswith("cuda") for s in t["suite"])]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bundle")
        subprocess.run([sys.executable, tool, "make", build, out, "--xz-level", "0"], check=True)
        rc = subprocess.run([sys.executable, tool, "check", out]).returncode
        with open(os.path.join(out, "share", "bundle.json")) as f:
            manifest = json.load(f)
        problems = []
        listed = [t["name"] for t in manifest["tests"]]
        if listed != suite:
            problems.append(f"the manifest lists {listed}, the cuda suite is {suite}")
        for t in manifest["tests"]:
            for arg in t["cmd"]:
                for tree in (dirs["build"], dirs["source"]):
                    if tree in arg:
                        problems.append(f"test {t['name']!r}: argument {arg!r} names {tree}")
        if not os.access(os.path.join(out, "run"), os.X_OK):
            problems.append("the bundle has no executable `run`")
        results = os.path.join(tmp, "results")
        clean = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"}
        run = subprocess.run([os.path.join(out, "run"), results], env=clean, capture_output=True, text=True,
                             timeout=280)
        summary = open(os.path.join(results, "summary.txt")).read() if os.path.exists(
            os.path.join(results, "summary.txt")) else ""
        if run.returncode != 0:
            problems.append(f"run in a clean environment exits {run.returncode}:\n{summary}{run.stderr[-2000:]}")
        for want in ("PASS suite: ", "SKIP train_mlp bf16: no GPU visible", "SKIP bench: no GPU visible",
                     "PASS libraries: CUDA runtime "):
            if want not in summary:
                problems.append(f"run's summary has no line {want!r}:\n{summary}")
        for p in problems:
            print("FAIL: " + p)
        return 1 if problems or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
