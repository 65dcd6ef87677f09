#!/usr/bin/env python3
"""Makes the GPU bundle of a build in a temporary directory and checks it: at
most 40 MiB, every library its executables need outside the CUDA toolkit, the
driver, the C/C++ runtime and MPI resolves inside the bundle (gpu_bundle.py
check), every test of the cuda suite is in its manifest, and no command there
names a path of this machine's build or source tree.

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
        for p in problems:
            print("FAIL: " + p)
        return 1 if problems or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
