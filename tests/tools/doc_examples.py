#!/usr/bin/env python3
"""Compiles and runs the C++ examples of the documentation.

  doc_examples.py --root SRC [--header H]... [--libs "-lx -ly"] -- CXX ARGS...

Each ```cpp block of README.md and of every .md file under docs/ (its subfolders included) and
each \\code ... \\endcode block of the umbrella headers that has a main() is compiled as a
program and run; it must exit 0.
A block without main() is compiled as a translation unit (-c).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def markdown_blocks(root):
    paths = ["README.md"]
    docs = os.path.join(root, "docs")
    for folder, dirs, files in os.walk(docs):
        dirs.sort()
        rel = os.path.relpath(folder, root)
        paths += [os.path.join(rel, f) for f in sorted(files) if f.endswith(".md")]
    out = []
    for rel in paths:
        text = open(os.path.join(root, rel)).read()
        out += [(rel, m.group(1)) for m in re.finditer(r"```cpp\n(.*?)```", text, re.S)]
    return out


def header_blocks(path, name):
    out = []
    for m in re.finditer(r"/// \\code\n(.*?)/// \\endcode", open(path).read(), re.S):
        lines = [re.sub(r"^/// ?", "", l) for l in m.group(1).splitlines()]
        body = "\n".join(lines) + "\n"
        if "#include" not in body:
            body = f'#include "{name}"\n' + body
        out.append((name, body))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--header", action="append", default=[], help="header (relative to include/) whose \\code blocks to check")
    ap.add_argument("--libs", default="", help="libraries to link, after the source (space-separated)")
    ap.add_argument("--no-readme", action="store_true", help="check only the headers' examples, not those of README.md and docs/")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cxx = [c for c in args.command if c != "--"]
    libs = args.libs.split()
    blocks = [] if args.no_readme else markdown_blocks(args.root)
    for h in args.header:
        blocks += header_blocks(os.path.join(args.root, "include", h), h)
    if not blocks:
        print("FAIL: no examples found")
        return 1
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (origin, code) in enumerate(blocks):
            src = os.path.join(tmp, f"example{i}.cpp")
            exe = os.path.join(tmp, f"example{i}")
            with open(src, "w") as f:
                f.write(code)
            has_main = re.search(r"\bint\s+main\s*\(", code) is not None
            cmd = cxx + ([src, "-o", exe] + libs if has_main else ["-c", src, "-o", exe + ".o"])
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"FAIL: example {i} of {origin} does not compile:\n{code}\n{proc.stderr[-3000:]}")
                failed += 1
                continue
            if has_main:
                run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
                if run.returncode != 0:
                    print(f"FAIL: example {i} of {origin} exits {run.returncode}:\n{run.stdout}{run.stderr}")
                    failed += 1
                    continue
            print(f"ok: example {i} of {origin}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
