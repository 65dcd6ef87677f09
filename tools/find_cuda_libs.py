#!/usr/bin/env python3
"""Finds NCCL and the CUDA libraries outside the toolkit too.

NCCL often lives apart from the CUDA toolkit: Debian/Ubuntu's libnccl-dev puts it
in the system directories, pip's nvidia-nccl-cu13 in site-packages/nvidia/nccl
(the CUDA 13 wheels put cuBLAS and the runtime in site-packages/nvidia/cu13).
One search, used by meson.build to build against NCCL and by the GPU bundle's
`run` to find the shared libraries its binaries need:

  find_cuda_libs.py nccl [--link-dir DIR]
      NCCL for building: prints one line
      `INCLUDE_DIR<TAB>LINK_DIR<TAB>LIB_DIR<TAB>WHERE` (INCLUDE_DIR empty when
      nccl.h is on the compiler's own path; -L LINK_DIR -lnccl links it, LIB_DIR
      holds libnccl.so.N) and exits 0, or says what it searched and exits 1.
      Searched in this order: $NCCL_HOME, the system directories, Python's
      site-packages, the CUDA toolkit. A library without its unversioned name
      (pip ships only libnccl.so.2) gets a link libnccl.so in --link-dir, which
      LINK_DIR then names.

  find_cuda_libs.py runtime FILE...
      For each shared library file name (libcublas.so.13, libnccl.so.2): one line
      `FILE<TAB>DIR<TAB>WHERE`, DIR and WHERE empty when it is nowhere. Searched:
      the CUDA toolkit, the system directories, site-packages; for NCCL, $NCCL_HOME
      first. Exits 1 when one is missing.

--cuda-root, --system-prefix (repeatable) and --site-packages (repeatable) replace
the places searched (defaults: $CUDA_HOME or /usr/local/cuda; /usr and
/usr/local; this Python's site-packages).
"""
import argparse
import glob
import os
import site
import sys
import sysconfig

MULTIARCH = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"


def lib_dirs(prefix):
    """Library directories under an installation prefix, most specific first."""
    return [os.path.join(prefix, d) for d in (os.path.join("lib", MULTIARCH), "lib64", "lib",
                                               os.path.join("targets", "x86_64-linux", "lib"))]


def site_prefixes(site_dirs):
    """Prefixes inside site-packages holding NVIDIA's wheels: nvidia/nccl, nvidia/cu13, nvidia/cublas, ..."""
    return [p for s in site_dirs for p in sorted(glob.glob(os.path.join(s, "nvidia", "*"))) if os.path.isdir(p)]


def places(args, nccl, toolkit_first):
    """(prefix, description) in search order."""
    home = [(os.environ["NCCL_HOME"], "NCCL_HOME")] if nccl and os.environ.get("NCCL_HOME") else []
    toolkit = [(args.cuda_root, "CUDA toolkit")] if args.cuda_root else []
    system = [(p, "system") for p in args.system_prefix]
    pip = [(p, "pip site-packages") for p in site_prefixes(args.site_packages)]
    return home + (toolkit + system + pip if toolkit_first else system + pip + toolkit)


def find_nccl_for_build(args):
    searched = []
    for prefix, where in places(args, nccl=True, toolkit_first=False):
        header = os.path.join(prefix, "include", "nccl.h")
        searched.append(prefix)
        if not os.path.isfile(header):
            continue
        for d in lib_dirs(prefix):
            plain, versioned = os.path.join(d, "libnccl.so"), sorted(glob.glob(os.path.join(d, "libnccl.so.[0-9]*")))
            if not os.path.exists(plain) and not versioned:
                continue
            link_dir = d
            if not os.path.exists(plain):
                if not args.link_dir:
                    continue
                os.makedirs(args.link_dir, exist_ok=True)
                link = os.path.join(args.link_dir, "libnccl.so")
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(versioned[0], link)
                link_dir = args.link_dir
            include = os.path.dirname(header)
            # The compiler searches these itself; naming them again would reorder its system headers.
            on_path = include in ("/usr/include", "/usr/local/include") or (
                args.cuda_root and os.path.realpath(include) == os.path.realpath(os.path.join(args.cuda_root, "include")))
            print(f"{'' if on_path else include}\t{link_dir}\t{d}\t{where} ({d})")
            return 0
    print("NCCL not found (nccl.h with libnccl.so*) in: " + ", ".join(searched), file=sys.stderr)
    return 1


def find_runtime(args, files):
    missing = 0
    for name in files:
        nccl = name.startswith("libnccl")
        found = None
        for prefix, where in places(args, nccl, toolkit_first=not nccl):
            for d in lib_dirs(prefix):
                if os.path.exists(os.path.join(d, name)):
                    found = (d, where)
                    break
            if found:
                break
        if found:
            print(f"{name}\t{found[0]}\t{found[1]}")
        else:
            print(f"{name}\t\t")
            missing += 1
    return 1 if missing else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["nccl", "runtime"])
    p.add_argument("files", nargs="*")
    p.add_argument("--cuda-root", default=os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    p.add_argument("--system-prefix", action="append")
    p.add_argument("--site-packages", action="append")
    p.add_argument("--link-dir")
    args = p.parse_args()
    if args.system_prefix is None:
        args.system_prefix = ["/usr", "/usr/local"]
    if args.site_packages is None:
        args.site_packages = list(site.getsitepackages())
        user = site.getusersitepackages()
        if isinstance(user, str):
            args.site_packages.append(user)
    if args.what == "nccl":
        return find_nccl_for_build(args)
    return find_runtime(args, args.files)


if __name__ == "__main__":
    sys.exit(main())
