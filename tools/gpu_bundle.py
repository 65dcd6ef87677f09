#!/usr/bin/env python3
"""The GPU bundle: everything the GPU check runs, built here, to run on a GPU
machine that has the CUDA driver and libraries but no network and no compiler
packages.

  gpu_bundle.py targets BUILD          the `meson compile` targets the GPU check needs
  gpu_bundle.py make BUILD DIR [--xz-level N]
                                       puts them into DIR, with the libraries and the script `run`
  gpu_bundle.py check DIR              here: the size, and every library resolves inside DIR

A bundle holds:
  run                 the checks (tools/gpu_bundle_run.py); `DIR/run RESULTS_DIR` on the GPU machine
  build/...           the executables of the cuda test suite, train_mlp, train_mlp_mpi (where MPI
                      was found) and bench/pipeline_gpu, stripped, at their places in the build tree
  lib/                every shared library they need that the GPU machine is not expected to have:
                      not the CUDA toolkit's or the driver's (run finds those), not the C and C++
                      runtime, not MPI's (an MPI run needs the machine's own mpirun and its
                      libraries). A library over 4 MiB is stored xz-compressed as NAME.xz
                      (OpenBLAS: 36 MB of kernels for every x86 CPU, 4 MB compressed).
  share/bundle.json   what was built, from which commit, with which nvcc; the libraries; the
                      cuda suite's tests with their commands
  share/src.tar.xz    the sources, with Catch2's single header, CLI11 and OpenBLAS's headers as
                      Meson subprojects: `run` builds there from these if a carried binary does
                      not start
  share/find_cuda_libs.py   the search for cuBLAS and NCCL that meson.build uses too
"""
import argparse
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import meson_targets  # beside this file

SUITE = "cuda"
# Run by the GPU check besides the suite's tests (train_mlp_mpi only where MPI was found).
EXTRA_EXECUTABLES = ["examples/train_mlp", "bench/pipeline_gpu", "examples/train_mlp_mpi"]
MAX_BYTES = 40 << 20
COMPRESS_OVER = 4 << 20
HERE = os.path.dirname(os.path.abspath(__file__))

# Libraries the GPU machine provides, by soname.
PROVIDED = [
    (re.compile(r"^(linux-vdso|ld-linux[-\w.]*|libc|libm|libdl|librt|libpthread|libutil|libresolv|libstdc\+\+|libgcc_s)\.so"),
     "C and C++ runtime"),
    (re.compile(r"^lib(cuda|nvidia-[\w-]+)\.so"), "GPU driver"),
    (re.compile(r"^lib(cudart|cublas|cublasLt|nccl|nvJitLink|nvrtc[\w-]*|cufft\w*|curand|cusparse|cusolver\w*|cupti|nvToolsExt|nvtx3interop)\.so"),
     "CUDA toolkit"),
]
MPI_LIB = re.compile(r"^lib(mpi|mpi_cxx|mpich\w*)\.so")


def provided_by(soname, mpi_libs):
    for pattern, what in PROVIDED:
        if pattern.match(soname):
            return what
    if MPI_LIB.match(soname) or soname in mpi_libs:
        return "MPI"
    return None


def ldd(path, env=None):
    """[(soname, resolved path or None)] of an executable or library, transitively."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
    deps = []
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            deps.append((m.group(1), m.group(3)))
        elif re.match(r"^\S+ \(0x[0-9a-f]+\)$", line):  # the loader itself, vdso
            name = line.split()[0]
            deps.append((os.path.basename(name), name if name.startswith("/") else None))
    return deps


def mpi_closure(deps, env=None):
    """The sonames MPI's own libraries pull in (they come with the machine's MPI)."""
    out = set()
    for soname, path in deps:
        if MPI_LIB.match(soname) and path:
            out.update(s for s, _ in ldd(path, env) if provided_by(s, set()) is None)
    return out


def executables(build):
    """{build-relative path: target spec} of every executable the GPU check runs."""
    out = meson_targets.executables(build, [SUITE], extra=EXTRA_EXECUTABLES)
    missing = [e for e in EXTRA_EXECUTABLES[:2] if e not in out]
    if missing:
        raise SystemExit(f"gpu_bundle: {build} has no {', '.join(missing)}: configure it with -Dcuda=enabled")
    return out


def map_token(token, src, root):
    """A command-line token with the build and source trees as placeholders, and
    this machine's programs and library directories taken out."""
    for prefix in ("", "-I", "-L"):
        if not token.startswith(prefix + "/"):
            continue
        path = os.path.normpath(token[len(prefix):])
        for tree, mark in ((root, "@BUILD@"), (src, "@SRC@")):
            if path == tree or path.startswith(tree + os.sep):
                return prefix + mark + path[len(tree):]
        if prefix == "-L":
            return None  # a library directory of this machine: run sets LIBRARY_PATH
        if prefix == "":
            base = os.path.basename(path)
            if re.match(r"^python3(\.\d+)?$", base):
                return "@PYTHON@"
            if base == "nvcc":
                return "@NVCC@"
        return token
    return token


def map_arg(arg, src, root):
    if " " in arg:  # a list of flags in one argument (doc_examples.py --libs)
        return " ".join(t for t in (map_token(t, src, root) for t in arg.split()) if t is not None)
    mapped = map_token(arg, src, root)
    return "" if mapped is None else mapped


def make_manifest(build, exes, toolkit_libs, mpi_executables):
    src, root, tests, _ = meson_targets.load_build(build)
    rows = []
    for t in meson_targets.suite_tests(tests, [SUITE]):
        cmd = [map_arg(a, src, root) for a in t["cmd"]]
        uses = [e for e in exes if any(e in a for a in cmd)]
        rows.append({
            "name": t["name"],
            "cmd": cmd,
            "env": t["env"],
            "timeout": t["timeout"],
            "mpi": any(e in mpi_executables for e in uses),
        })
    return rows


def git(src, *args):
    return subprocess.run(["git", "-C", src, *args], capture_output=True, text=True).stdout.strip()


def pkg_config_includedir(name, header):
    """The directory that holds `header` of pkg-config package `name`."""
    flags = subprocess.run(["pkg-config", "--cflags-only-I", name], capture_output=True, text=True).stdout.split()
    dirs = [f[2:] for f in flags if f.startswith("-I")]
    dirs.append(subprocess.run(["pkg-config", "--variable=includedir", name], capture_output=True,
                               text=True).stdout.strip())
    for d in dirs + ["/usr/include", "/usr/local/include"]:
        if d and os.path.exists(os.path.join(d, header)):
            return d
    raise SystemExit(f"gpu_bundle: {header} of {name} not found (install its Debian package)")


def pkg_version(name):
    return subprocess.run(["pkg-config", "--modversion", name], capture_output=True, text=True).stdout.strip() or "0"


def library_subproject(name, lib):
    """The meson.build of subproject `name`: its include/ and lib/lib`lib`.so."""
    return (f"project('{name}', version: '{{v}}')\n"
            "lib = meson.current_source_dir() / 'lib'\n"
            f"{name}_dep = declare_dependency(\n"
            "  include_directories: include_directories('include', is_system: true),\n"
            f"  link_args: ['-L' + lib, '-l{lib}', '-Wl,-rpath,' + lib])\n")


# The header-only dependencies as Meson subprojects: a `.wrap` whose directory is
# present makes `dependency(NAME)` fall back to it without a download.
SUBPROJECTS = {
    "catch2": ("catch2", "catch2_dep", "project('catch2', version: '{v}')\n"
               "catch2_dep = declare_dependency(include_directories: include_directories('include', is_system: true))\n"),
    "cli11": ("CLI11", "cli11_dep", "project('CLI11', version: '{v}')\n"
              "cli11_dep = declare_dependency(include_directories: include_directories('include', is_system: true))\n"),
    # lib/libopenblas.so and lib/libz.so are linked by `run` to the bundle's libraries before it configures.
    "openblas": ("openblas", "openblas_dep", library_subproject("openblas", "openblas")),
    "nlohmann_json": ("nlohmann_json", "nlohmann_json_dep", "project('nlohmann_json', version: '{v}')\n"
                      "nlohmann_json_dep = declare_dependency(include_directories: include_directories('include', is_system: true))\n"),
    "zlib": ("zlib", "zlib_dep", library_subproject("zlib", "z")),
}


def source_archive(src, out, xz_level):
    files = [f for f in git(src, "ls-files", "-co", "--exclude-standard").split("\n") if f]
    if "meson.build" not in files:
        raise SystemExit(f"gpu_bundle: cannot list the sources of {src} (git ls-files): the fallback build needs them")
    headers = {
        "catch2": [(os.path.join(pkg_config_includedir("catch2", "catch2/catch.hpp"), "catch2"), "include/catch2")],
        "cli11": [(os.path.join(pkg_config_includedir("CLI11", "CLI/CLI.hpp"), "CLI"), "include/CLI")],
        "openblas": [(pkg_config_includedir("openblas", "cblas.h"), "include")],
        "nlohmann_json": [(os.path.join(pkg_config_includedir("nlohmann_json", "nlohmann/json.hpp"), "nlohmann"),
                           "include/nlohmann")],
        "zlib": [(os.path.join(pkg_config_includedir("zlib", "zlib.h"), f), "include/" + f) for f in ("zlib.h", "zconf.h")],
    }
    versions = {"catch2": pkg_version("catch2"), "cli11": pkg_version("CLI11"), "openblas": pkg_version("openblas"),
                "nlohmann_json": pkg_version("nlohmann_json"), "zlib": pkg_version("zlib")}
    with tarfile.open(out, "w:xz", preset=xz_level) as tar:
        for f in files:
            if f and os.path.isfile(os.path.join(src, f)):
                tar.add(os.path.join(src, f), arcname="src/" + f, recursive=False)
        for name, (dep, var, build_text) in SUBPROJECTS.items():
            base = f"src/subprojects/{name}"
            add_text(tar, f"src/subprojects/{name}.wrap",
                     f"[wrap-file]\ndirectory = {name}\n\n[provide]\n{dep} = {var}\n")
            add_text(tar, base + "/meson.build", build_text.format(v=versions[name]))
            for from_dir, to_dir in headers[name]:
                if os.path.isfile(from_dir):  # one header
                    tar.add(from_dir, arcname=f"{base}/{to_dir}")
                    continue
                for dirpath, _, names in os.walk(from_dir):
                    for n in names:
                        if n.endswith((".h", ".hpp")):
                            p = os.path.join(dirpath, n)
                            tar.add(p, arcname=f"{base}/{to_dir}/{os.path.relpath(p, from_dir)}")
    return versions


def add_text(tar, name, text):
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def newest_symbol_versions(paths):
    """The newest GLIBC_ and GLIBCXX_ symbol versions the files need (the C and
    C++ runtime the GPU machine must have at least)."""
    found = {}
    for path in paths:
        out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True).stdout
        for family, version in re.findall(r"\b(GLIBC|GLIBCXX)_(\d+(?:\.\d+)*)\b", out):
            key = tuple(int(x) for x in version.split("."))
            if key > found.get(family, ()):
                found[family] = key
    return {f: f + "_" + ".".join(map(str, v)) for f, v in found.items()}


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(d, f)))


def make(build, out, xz_level):
    src, root, _, _ = meson_targets.load_build(build)
    exes = executables(build)
    for rel in exes:
        if not os.path.isfile(os.path.join(root, rel)):
            raise SystemExit(f"gpu_bundle: {os.path.join(root, rel)} is not built (meson compile -C {build} {exes[rel]})")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "lib"))
    os.makedirs(os.path.join(out, "share"))
    bundled, toolkit, mpi_libs, mpi_executables, provided = {}, set(), set(), [], {}
    for rel in sorted(exes):
        dest = os.path.join(out, "build", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        subprocess.run(["strip", "-o", dest, os.path.join(root, rel)], check=True)
        deps = ldd(os.path.join(root, rel))
        closure = mpi_closure(deps)
        if any(MPI_LIB.match(s) for s, _ in deps):
            mpi_executables.append(rel)
        for soname, path in deps:
            what = provided_by(soname, closure)
            if what is None:
                if path is None:
                    raise SystemExit(f"gpu_bundle: {rel} needs {soname}, which is not found here")
                bundled[soname] = os.path.realpath(path)
            else:
                provided.setdefault(what, set()).add(soname)
            if what == "CUDA toolkit":
                toolkit.add(soname)
            if what == "MPI":
                mpi_libs.add(soname)
    for soname, path in sorted(bundled.items()):
        dest = os.path.join(out, "lib", soname)
        if os.path.getsize(path) > COMPRESS_OVER:
            with open(path, "rb") as f, lzma.open(dest + ".xz", "wb", preset=xz_level) as g:
                shutil.copyfileobj(f, g)
        else:
            shutil.copyfile(path, dest)
    runtime = newest_symbol_versions([os.path.join(out, "build", rel) for rel in exes] + list(bundled.values()))
    versions = source_archive(src, os.path.join(out, "share", "src.tar.xz"), max(xz_level, 6))
    shutil.copyfile(os.path.join(HERE, "find_cuda_libs.py"), os.path.join(out, "share", "find_cuda_libs.py"))
    shutil.copyfile(os.path.join(HERE, "gpu_bundle_run.py"), os.path.join(out, "run"))
    os.chmod(os.path.join(out, "run"), 0o755)
    nvcc = re.findall(r"release .*", subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout)
    options = {o["name"]: o["value"] for o in json.load(open(os.path.join(root, "meson-info", "intro-buildoptions.json")))}
    manifest = {
        "commit": git(src, "rev-parse", "--short", "HEAD") + ("+changes" if git(src, "status", "--porcelain") else ""),
        "made": subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True).stdout.strip(),
        "nvcc": "nvcc " + (nvcc[0] if nvcc else "of unknown version"),
        "gpu_arch": options.get("gpu_arch"),
        "executables": exes,
        "mpi_executables": mpi_executables,
        "toolkit_libs": sorted(toolkit),
        "mpi_libs": sorted(mpi_libs),
        "bundled_libs": sorted(bundled),
        "provided": {k: sorted(v) for k, v in provided.items()},
        "needs_at_least": runtime,
        "subproject_versions": versions,
        "tests": make_manifest(build, exes, toolkit, mpi_executables),
    }
    with open(os.path.join(out, "share", "bundle.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    size = tree_bytes(out)
    print(f"gpu-bundle: {out}: {len(exes)} executables, {len(bundled)} libraries ({', '.join(sorted(bundled))}), "
          f"{len(manifest['tests'])} tests of the {SUITE} suite; {size / 2**20:.1f} MiB")
    if size > MAX_BYTES:
        raise SystemExit(f"gpu_bundle: {out} is {size / 2**20:.1f} MiB, more than {MAX_BYTES >> 20} MiB")


def check(out):
    """The bundle is small enough, and every library its executables need that
    the GPU machine does not provide resolves inside the bundle."""
    with open(os.path.join(out, "share", "bundle.json")) as f:
        manifest = json.load(f)
    problems = []
    size = tree_bytes(out)
    if size > MAX_BYTES:
        problems.append(f"the bundle is {size / 2**20:.1f} MiB, more than {MAX_BYTES >> 20} MiB")
    bundle_lib = os.path.realpath(os.path.join(out, "lib"))
    with tempfile.TemporaryDirectory() as tmp:
        for packed in os.listdir(bundle_lib):
            if packed.endswith(".xz"):
                with lzma.open(os.path.join(bundle_lib, packed)) as f, open(os.path.join(tmp, packed[:-3]), "wb") as g:
                    shutil.copyfileobj(f, g)
        env = dict(os.environ, LD_LIBRARY_PATH=tmp + ":" + bundle_lib)
        inside = (os.path.realpath(tmp), bundle_lib)
        checked = 0
        for rel in manifest["executables"]:
            exe = os.path.join(out, "build", rel)
            deps = ldd(exe, env)
            if not deps:
                problems.append(f"{rel}: ldd lists no library (not a dynamic executable?)")
            closure = mpi_closure(deps, env)
            for soname, path in deps:
                what = provided_by(soname, closure)
                if what is not None:
                    continue
                checked += 1
                if path is None:
                    problems.append(f"{rel}: {soname} is not found")
                elif not os.path.realpath(path).startswith(inside):
                    problems.append(f"{rel}: {soname} resolves to {path}, outside the bundle")
    for p in problems:
        print("gpu-bundle check: " + p, file=sys.stderr)
    print(f"gpu-bundle check: {out}: {size / 2**20:.1f} MiB; {len(manifest['executables'])} executables, "
          f"{checked} library uses outside the toolkit, driver, C/C++ runtime and MPI, "
          f"{'all inside the bundle' if not problems else str(len(problems)) + ' problems'}")
    return 1 if problems else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("targets")
    t.add_argument("build")
    m = sub.add_parser("make")
    m.add_argument("build")
    m.add_argument("out")
    m.add_argument("--xz-level", type=int, default=6)
    c = sub.add_parser("check")
    c.add_argument("out")
    args = p.parse_args()
    if args.command == "targets":
        print("\n".join(sorted(set(executables(args.build).values()))))
        return 0
    if args.command == "make":
        make(args.build, args.out, args.xz_level)
        return 0
    return check(args.out)


if __name__ == "__main__":
    sys.exit(main())
