"""pipeweave-schedule (and python -m pipeweave): print_schedule's command line.

The flags, their help and everything they do are print_schedule's own (examples/common/print_schedule.hpp, run by the
C++ print_schedule too): argparse reads the command line over that table, and the tool's run() does the rest, so
both front ends take the same flags, print the same output and refuse the same input with the same words.

    $ pipeweave-schedule --schedule zb-h1 --devices 4 --micro-batches 8 --format summary
    $ python -m pipeweave --schedule auto --stage-costs 1:2:1,1:2:1,1:2:1,1.3:2.6:1.3 --chunks 1 --memory-limit 4

Exit statuses: 0; 1 when the program fails verification or --output cannot be written; 2 for bad arguments, with one
line on stderr saying what is wrong and what is allowed.
"""

import argparse
import sys
from typing import NoReturn, Optional, Sequence

from . import _core

PROG = "pipeweave-schedule"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are the tool's one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see --help)\n")
        raise SystemExit(2)


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line's parser, made from print_schedule's table of flags."""
    ap = _Parser(prog=prog, description=_core._print_schedule_description, allow_abbrev=False)
    for name, metavar, help_text, takes_value in _core._print_schedule_flags():
        help_text = help_text.replace("%", "%%")
        if takes_value:
            ap.add_argument(name, dest=name, metavar=metavar, help=help_text, default=argparse.SUPPRESS)
        else:
            ap.add_argument(name, dest=name, action="store_true", help=help_text, default=argparse.SUPPRESS)
    return ap


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    """Runs the command line on `argv` (default sys.argv[1:]); returns the exit status."""
    given = vars(parser(prog).parse_args(argv))
    status, out, err = _core._print_schedule({name: "" if value is True else value for name, value in given.items()},
                                             prog)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status
