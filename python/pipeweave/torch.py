"""pipeweave's schedules in PyTorch's pipelining runtime (torch.distributed.pipelining).

Imported only where PyTorch (2.15 or later) is installed. schedule_for() gives a PyTorch schedule object that runs
pipeweave's proven program and communication order, without files:

>>> from pipeweave.torch import schedule_for                                # doctest: +SKIP
>>> schedule = schedule_for(my_stages, n_microbatches=8, loss_fn=loss_fn)   # doctest: +SKIP
>>> schedule.step(x, target=y, losses=losses)                               # doctest: +SKIP
"""

from typing import Any, Callable, Optional

import torch  # noqa: F401  (PyTorch must be there: the module is its bridge)
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from . import _core

__all__ = ["program_for", "schedule_for"]


def _stage_list(stages: Any) -> list:
    if isinstance(stages, (list, tuple)):
        stages = list(stages)
    else:
        stages = [stages]
    if not stages:
        raise _core.Error("schedule_for: stages is empty; give the PipelineStage objects this rank holds")
    return stages


def program_for(
    devices: int,
    chunks: int,
    n_microbatches: int,
    *,
    kind: str = "interleaved",
    costs: Optional[_core.Costs] = None,
    memory_limit: float = 0.0,
    placement: Optional[str] = None,
) -> _core.Program:
    """The program schedule_for() runs on `devices` ranks of `chunks` stages each: the generated `kind`, or with kind
    "auto" the fastest program synthesize() finds for `costs` under `memory_limit`. Its placement says which stages
    each rank holds: program.device_of_stage(s)."""
    if kind == "auto":
        return _core.synthesize(devices, chunks, n_microbatches, costs, memory_limit=memory_limit,
                                placement=placement or "loop").program
    if costs is not None or memory_limit:
        raise _core.Error(f"schedule_for: costs and memory_limit are what kind='auto' synthesizes for; {kind} has its "
                          "own order")
    return _core.schedule(kind, devices, chunks, n_microbatches, placement=placement)


def schedule_for(
    stages: Any,
    n_microbatches: int,
    loss_fn: Optional[Callable] = None,
    *,
    kind: str = "interleaved",
    costs: Optional[_core.Costs] = None,
    memory_limit: float = 0.0,
    placement: Optional[str] = None,
    receives: str = "early",
    **runtime_kwargs: Any,
) -> _PipelineScheduleRuntime:
    """A PyTorch schedule object loaded with pipeweave's program and its proven communication order.

    stages: the PipelineStage objects this rank holds (one, or a list); n_microbatches: M; loss_fn: as PyTorch's
    schedules take it. kind: a generated schedule (pipeweave.kinds()) or "auto", the fastest program synthesize()
    finds for `costs` under `memory_limit`; placement: for "auto", "loop" or "v". The program's sends, receives and
    waits are pipeweave.with_comms(program, receives)'s, proved not to hang under the in-order and asynchronous semantics; the
    object is PyTorch's _PipelineScheduleRuntime (runtime_kwargs go to it: scale_grads, ...), and its step() trains
    as PyTorch's own classes do.
    """
    stages = _stage_list(stages)
    devices, total, rank = stages[0].group_size, stages[0].num_stages, stages[0].group_rank
    if total % devices != 0:
        raise _core.Error(f"schedule_for: {total} stages on {devices} ranks; each rank must hold the same number of "
                          "stages (stages = ranks * chunks)")
    program = program_for(devices, total // devices, n_microbatches, kind=kind, costs=costs,
                          memory_limit=memory_limit, placement=placement)
    mine = sorted(s.stage_index for s in stages)
    placed = [s for s in range(total) if program.device_of_stage(s) == rank]
    if mine != placed:
        raise _core.Error(f"schedule_for: rank {rank} holds stages {mine}, but {program.kind} places stages {placed} on "
                          f"it ({program.placement} placement); build this rank's PipelineStage objects for those")
    comms = _core.with_comms(program, receives)
    schedule = _PipelineScheduleRuntime(stages, n_microbatches, loss_fn=loss_fn, **runtime_kwargs)
    actions = {rank: [_Action.from_str(a) for a in row] for rank, row in enumerate(comms.rows)}
    schedule._prepare_schedule_with_comms(actions, format="compute_comms")
    schedule.pipeweave_program = program
    schedule.pipeweave_comms = comms
    return schedule
