#!/usr/bin/env python3
"""Prints the public headers under include/, one path a line, relative to include/."""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
for p in sorted(root.rglob("*.hpp")):
    print(p.relative_to(root).as_posix())
