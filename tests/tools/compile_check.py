#!/usr/bin/env python3
"""Compiles one source (or one header, wrapped in a source) and checks the outcome.

  compile_check.py --expect fail --message TEXT [--message TEXT ...] [--only] -- CXX ARGS... SOURCE
  compile_check.py --expect pass --header pipeweave/x.hpp --ext .cpp [--forbid REGEX] -- CXX ARGS...

--expect fail: the compiler must fail and print every --message; with --only, every
               static_assert that fails must be one of them (no other rule fires).
--expect pass: the compiler must succeed; with --forbid, no header whose path
               matches REGEX may be included (checked with the compiler's -H).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


# A failed static_assert's message as GCC prints it ("static assertion failed:
# MSG") and as Clang does ('static_assert failed due to requirement '...' "MSG"',
# or since Clang 16 "static assertion failed due to requirement '...': MSG").
_STATIC_ASSERT = [
    re.compile(r"static assertion failed: (.*)$"),
    re.compile(r'static_assert failed(?: due to requirement .*?)? "(.*)"$'),
    re.compile(r"static assertion failed due to requirement '.*?': (.*)$"),
]


def failed_static_asserts(out: str) -> list:
    """The messages of the static_asserts a compiler's output reports as failed."""
    found = []
    for line in out.splitlines():
        for pattern in _STATIC_ASSERT:
            m = pattern.search(line.strip())
            if m:
                found.append(m.group(1))
                break
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect", choices=["fail", "pass"], required=True)
    ap.add_argument("--message", action="append", default=[])
    ap.add_argument("--header")
    ap.add_argument("--ext", default=".cpp")
    ap.add_argument("--forbid")
    ap.add_argument("--only", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = [c for c in args.command if c != "--"]
    if not cmd:
        print("compile_check: no compiler command given", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.header:
            src = os.path.join(tmp, "header_alone" + args.ext)
            with open(src, "w") as f:
                f.write(f'#include "{args.header}"\n#include "{args.header}"\nint main() {{ return 0; }}\n')
            cmd = cmd + [src]
        if args.forbid:
            cmd = cmd + ["-H"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    out = proc.stdout + proc.stderr
    what = args.header or " ".join([cmd[-1]] + [c for c in cmd if c.startswith("-D")])
    if args.expect == "fail":
        if proc.returncode == 0:
            print(f"FAIL: {what} compiled, but it must not", file=sys.stderr)
            return 1
        missing = [m for m in args.message if m not in out]
        if missing:
            print(out, file=sys.stderr)
            print(f"FAIL: {what} failed to compile, but without: {missing}", file=sys.stderr)
            return 1
        if args.only:
            fired = failed_static_asserts(out)
            others = sorted({m for m in fired if not any(e in m for e in args.message)})
            if not fired or others:
                print(out, file=sys.stderr)
                print(f"FAIL: {what}: the static_asserts that failed were {sorted(set(fired))}, "
                      f"expected only {args.message}", file=sys.stderr)
                return 1
        print(f"ok: {what} is rejected with {args.message}")
        return 0
    if proc.returncode != 0:
        print(out, file=sys.stderr)
        print(f"FAIL: {what} does not compile alone", file=sys.stderr)
        return 1
    if args.forbid:
        pattern = re.compile(args.forbid)
        included = [l.lstrip(". ").strip() for l in proc.stderr.splitlines() if l.startswith(".")]
        # A header under one of the -I directories is judged by its path below that
        # directory, so that the checkout's own location cannot match the pattern.
        roots = [os.path.realpath(c[2:]) + os.sep for c in cmd if c.startswith("-I") and len(c) > 2]

        def shown(h):
            real = os.path.realpath(h)
            for r in roots:
                if real.startswith(r):
                    return real[len(r):]
            return h

        bad = [h for h in included if pattern.search(shown(h))]
        if bad:
            print(f"FAIL: {what} pulls in forbidden headers: {bad[:5]}", file=sys.stderr)
            return 1
        print(f"ok: {what} compiles alone and includes {len(included)} headers, none matching {args.forbid}")
    else:
        print(f"ok: {what} compiles alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
