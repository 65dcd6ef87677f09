#!/usr/bin/env python3
"""The executables that the tests of some suites run, read from a configured
meson build directory (its meson-info/), as `meson compile` targets.

  meson_targets.py BUILD --suite S [--suite S ...] [--no-suite S ...]

prints one target a line (e.g. tests/test_runtime_training, examples/train_mlp):
every executable a test of a named suite depends on (its program, and the
programs among its arguments), unless the test is also in an excluded suite.
tools/dev builds the sanitizers' test programs from it, and gpu_bundle.py the
GPU check's.
"""
import argparse
import json
import os
import sys


def load_build(build):
    """(source dir, build dir, tests, targets) of a configured build, from its meson-info/."""
    info = os.path.join(build, "meson-info")
    with open(os.path.join(info, "meson-info.json")) as f:
        dirs = json.load(f)["directories"]
    with open(os.path.join(info, "intro-tests.json")) as f:
        tests = json.load(f)
    with open(os.path.join(info, "intro-targets.json")) as f:
        targets = json.load(f)
    return dirs["source"], dirs["build"], tests, targets


def in_suite(test, suite):
    """True when `test` is in `suite` (meson names it "suite" or "project:suite")."""
    return any(s == suite or s.endswith(":" + suite) for s in test["suite"])


def suite_tests(tests, suites, excluded=()):
    """The tests in one of `suites` and in none of `excluded`."""
    return [t for t in tests
            if any(in_suite(t, s) for s in suites) and not any(in_suite(t, s) for s in excluded)]


def executables(build, suites, excluded=(), extra=()):
    """{build-relative path: target spec} of every executable the tests of `suites`
    (not of `excluded`) depend on, and of the build-relative paths in `extra`."""
    src, root, tests, targets = load_build(build)
    wanted = {dep for t in suite_tests(tests, suites, excluded) for dep in t["depends"]}
    out = {}
    for t in targets:
        if t["type"] != "executable":
            continue
        for filename in t["filename"]:
            rel = os.path.relpath(filename, root)
            if t["id"] in wanted or rel in extra:
                spec = os.path.relpath(os.path.dirname(t["defined_in"]), src)
                out[rel] = t["name"] if spec == "." else spec + "/" + t["name"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build")
    p.add_argument("--suite", action="append", required=True, help="a suite whose tests' programs to list")
    p.add_argument("--no-suite", action="append", default=[], help="leave out the tests of this suite")
    args = p.parse_args()
    found = executables(args.build, args.suite, args.no_suite)
    if not found:
        print(f"meson_targets: no test of the suites {', '.join(args.suite)} in {args.build}", file=sys.stderr)
        return 1
    print("\n".join(sorted(set(found.values()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
