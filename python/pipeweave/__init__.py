"""Pipeline-parallel schedules proven before they run.

Generate a schedule in exactly PyTorch's order, prove it (no deadlock, every
dependency met, its memory rules kept), lower it to the sends and receives a
runtime issues, simulate it under measured costs, or synthesize the fastest
proven schedule under a memory limit; read and write PyTorch's pipelining CSV.

>>> import pipeweave as pw
>>> costs = pw.Costs(forward=1, input=1, weight=1)
>>> found = pw.synthesize(4, 1, 8, costs, memory_limit=4)
>>> bool(pw.verify(found.program)), found.makespan
(True, 29.0)

Every error is a pipeweave.Error carrying the library's message.
"""

from typing import Sequence

from ._core import (
    Comms,
    CommsProof,
    Costs,
    Error,
    Event,
    Lowered,
    Program,
    Synthesis,
    Trace,
    Verification,
    kinds,
    load_comms,
    load_csv,
    lower,
    overlap,
    parse_comms,
    parse_csv,
    prove_comms,
    schedule,
    simulate,
    smallest_memory_limit,
    synthesize,
    to_cpp,
    to_csv,
    verify,
    with_comms,
    with_grad_reduce,
    with_offload,
    with_recompute,
)

__all__ = [
    "Comms",
    "CommsProof",
    "Costs",
    "Error",
    "Event",
    "Lowered",
    "Program",
    "Synthesis",
    "Trace",
    "Verification",
    "kinds",
    "load_comms",
    "load_csv",
    "lower",
    "overlap",
    "parse_comms",
    "parse_csv",
    "program",
    "prove_comms",
    "schedule",
    "simulate",
    "smallest_memory_limit",
    "synthesize",
    "to_cpp",
    "to_csv",
    "verify",
    "with_comms",
    "with_grad_reduce",
    "with_offload",
    "with_recompute",
]


def program(actions: Sequence[Sequence[str]]) -> Program:
    """A program from each device's actions in PyTorch's spelling, as parse_csv() reads them.

    >>> pw.program([["0F0", "0B0"], ["1F0", "1B0"]]).devices
    2
    """
    if isinstance(actions, str) or any(isinstance(row, str) for row in actions):
        raise Error("program: actions must be one list of action strings per device, e.g. [['0F0', '0B0'], ['1F0', '1B0']]")
    for d, row in enumerate(actions):
        for k, action in enumerate(row):
            if not isinstance(action, str) or "," in action or "\n" in action:
                raise Error(f"program: device {d}'s action {k} must be one action string such as '0F3' (got {action!r})")
    return parse_csv("".join(",".join(row) + "\n" for row in actions))
