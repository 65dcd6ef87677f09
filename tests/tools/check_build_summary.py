#!/usr/bin/env python3
"""Checks that the configure summary of a build tells what was built: the
`pipeweave` section names the CUDA backend, where NCCL was found and whether the
multi-process (MPI) host is built, and these agree with the build's targets.

  check_build_summary.py BUILD_DIR
"""
import json
import os
import re
import sys

MPI = "MPI (multi-process host)"


def main() -> int:
    build = sys.argv[1]
    with open(os.path.join(build, "meson-logs", "meson-log.txt")) as f:
        log = f.read()
    start = log.rfind("\n  pipeweave\n")
    if start < 0:
        print("FAIL: the configure log has no pipeweave summary section")
        return 1
    section = log[start:].split("\n\n")[0]
    values = dict(re.findall(r"^\s{4}(.+?)\s*: (.*)$", section, re.M))
    with open(os.path.join(build, "meson-info", "intro-targets.json")) as f:
        targets = {t["name"] for t in json.load(f)}
    problems = []
    for key in ("CUDA backend", "NCCL", MPI):
        if key not in values:
            problems.append(f"the summary has no '{key}' line")
    if not problems:
        cuda = values["CUDA backend"] == "true"
        mpi = values[MPI] == "true"
        if cuda != ("test_cuda_gpu" in targets):
            problems.append(f"'CUDA backend: {values['CUDA backend']}' but test_cuda_gpu is "
                            f"{'' if 'test_cuda_gpu' in targets else 'not '}a target")
        if mpi != ("test_mpi_host" in targets):
            problems.append(f"'{MPI}: {values[MPI]}' but test_mpi_host is "
                            f"{'' if 'test_mpi_host' in targets else 'not '}a target")
        if (cuda and mpi) != ("train_mlp_mpi" in targets):
            problems.append(f"'CUDA backend: {values['CUDA backend']}', '{MPI}: {values[MPI]}' but train_mlp_mpi is "
                            f"{'' if 'train_mlp_mpi' in targets else 'not '}a target")
        if cuda and not re.match(r"^(NCCL_HOME|system|pip site-packages|CUDA toolkit) \(/", values["NCCL"]):
            problems.append(f"'NCCL: {values['NCCL']}' does not say where NCCL was found")
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print("summary: " + ", ".join(f"{k}: {values[k]}" for k in ("CUDA backend", "NCCL", MPI)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
