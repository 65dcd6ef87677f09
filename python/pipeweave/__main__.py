"""python -m pipeweave: the command line of pipeweave-schedule (pipeweave/cli.py)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
