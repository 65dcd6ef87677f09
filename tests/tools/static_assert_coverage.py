#!/usr/bin/env python3
"""Checks that every static_assert message of the library has a compile-fail test.

  static_assert_coverage.py --include DIR --tested MSG... [--unreachable MSG...]

Messages are compared whole.

Reads every header under DIR, collects the message of each static_assert (its
string literals joined, as the compiler joins adjacent ones) and fails naming
each message that is neither among the --tested ones (the messages the
compile-fail tests expect) nor among the --unreachable ones (asserts on the
library's own tables or on the host, which no user code can make fail). A
--tested or --unreachable message that no static_assert has any more fails too,
so that the lists cannot go stale.
"""
import argparse
import pathlib
import re
import sys

_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def static_assert_messages(text: str) -> list:
    """The messages of the static_asserts in a header's text (comments skipped)."""
    code = re.sub(r"//[^\n]*", "", text)  # doc comments show static_asserts without messages
    out = []
    for m in re.finditer(r"\bstatic_assert\s*\(", code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            c = code[i]
            if c == '"':  # skip a literal, which may hold parentheses
                j = i + 1
                while code[j] != '"':
                    j += 2 if code[j] == "\\" else 1
                i = j
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            i += 1
        args = code[m.end():i - 1]
        # The message is the run of adjacent literals after the top-level comma.
        tail = re.search(r',\s*((?:"(?:[^"\\]|\\.)*"\s*)+)$', args)
        if tail:
            out.append("".join(_LITERAL.findall(tail.group(1))).replace("\\'", "'").replace('\\"', '"'))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--include", required=True)
    ap.add_argument("--tested", nargs="*", default=[])
    ap.add_argument("--unreachable", nargs="*", default=[])
    args = ap.parse_args()
    found = {}
    for h in sorted(pathlib.Path(args.include).rglob("*.hpp")):
        for msg in static_assert_messages(h.read_text()):
            found.setdefault(msg, str(h.relative_to(args.include)))
    if not found:
        print(f"FAIL: no static_assert message found under {args.include}", file=sys.stderr)
        return 1
    covered = args.tested + args.unreachable
    untested = [(m, h) for m, h in found.items() if m not in covered]
    stale = [c for c in covered if c not in found]
    for m, h in untested:
        print(f"FAIL: {h}: static_assert message without a compile-fail test: \"{m}\"", file=sys.stderr)
    for c in stale:
        print(f"FAIL: a compile-fail test expects \"{c}\", which no static_assert under {args.include} has",
              file=sys.stderr)
    if untested or stale:
        return 1
    print(f"ok: {len(found)} static_assert messages, {len(args.tested)} with a compile-fail test, "
          f"{len(args.unreachable)} out of user code's reach")
    return 0


if __name__ == "__main__":
    sys.exit(main())
