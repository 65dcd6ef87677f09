"""pipeweave's schedules in PyTorch's pipelining runtime (torch.distributed.pipelining).

Imported only where PyTorch (2.15 or later) is installed. schedule_for() gives a PyTorch schedule object that runs
pipeweave's proven program and communication order, without files:

>>> from pipeweave.torch import schedule_for                                # doctest: +SKIP
>>> schedule = schedule_for(my_stages, n_microbatches=8, loss_fn=loss_fn)   # doctest: +SKIP
>>> schedule.step(x, target=y, losses=losses)                               # doctest: +SKIP

measure_costs() times each stage's F, I and W in PyTorch, for schedule_for(kind="auto", costs=...) to synthesize for.
"""

import statistics
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from . import _core

__all__ = ["measure_costs", "program_for", "schedule_for"]


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


# The Costs keywords measure_costs() fills itself; every other one passes through.
_MEASURED = ("forward", "backward", "input", "weight")


def measure_costs(
    stages: Any,
    example_input: Any = None,
    loss_fn: Optional[Callable] = None,
    target: Any = None,
    *,
    warmup: int = 2,
    repeats: int = 5,
    **costs: Any,
) -> _core.Costs:
    """Times each stage's forward F, input gradient I and weight gradient W as PyTorch's runtime runs them, and returns
    the pipeweave.Costs with one (F, I, W) per virtual stage, in milliseconds, that synthesize() and
    schedule_for(kind="auto", costs=...) take.

    stages: every stage in order as nn.Module objects, or PipelineStage objects (their submod is timed; on several
    ranks, the ones this rank holds). example_input: one micro-batch's input of stage 0 (a tensor or a tuple of
    them; needed only where stage 0 is measured); stage k runs on stage k - 1's output, so shapes are the model's.
    loss_fn, target: as the schedule takes them, for one micro-batch; the last stage's F includes the loss and its
    backward starts from it (without loss_fn, from a gradient of ones, as every other stage's does).

    F is the module's forward; I is torch.distributed.pipelining's stage_backward_input (the gradient of the stage's
    input only), W its stage_backward_weight (the parameters' gradients from what I kept). Stage 0's input is the data,
    which needs no gradient: PyTorch's runtime runs no I there and a whole backward as its W, and so does this, so
    stage 0's I is 0. Each piece is the median of `repeats` runs after `warmup`; CUDA events time a CUDA stage, the
    wall clock any other (an accelerator synchronized around it). The modules' gradients, buffers and the random state
    are as they were. costs: the other pipeweave.Costs keywords (p2p_latency, stash_sizes, ...), passed on.

    Under torch.distributed (a process group of more than one rank) it is collective: every rank calls it with the
    stages it holds, the lowest rank holding a stage measures it (with nn.Module objects that is rank 0, every rank
    giving the whole model), stage outputs go to the next stage's rank, and every rank returns the same Costs, so
    that every rank synthesizes the same program.
    """
    for name in _MEASURED:
        if name in costs:
            raise _core.Error(f"measure_costs: {name} is what it measures; the other Costs keywords are allowed "
                              "(p2p_latency, stash_sizes, ...)")
    if not isinstance(warmup, int) or not isinstance(repeats, int) or warmup < 0 or repeats < 1:
        raise _core.Error(f"measure_costs: warmup must be at least 0 and repeats at least 1 (got {warmup!r}, "
                          f"{repeats!r})")
    local, total, group, problem = _measured_stages(stages)
    rank, size = (dist.get_rank(group), dist.get_world_size(group)) if _distributed(group) else (0, 1)
    # Which rank measures each stage: the lowest holding it. Every rank learns what every other holds, and raises the
    # same error when anything is wrong, so that none waits for a rank that raised.
    held = [(sorted(local), total, problem)]
    if size > 1:
        held = [None] * size
        dist.all_gather_object(held, (sorted(local), total, problem), group=group)
    for r, (_, _, p) in enumerate(held):
        if p:
            raise _core.Error(p if size == 1 else f"{p} (rank {r})")
    totals = sorted({t for _, t, _ in held})
    if len(totals) != 1:
        raise _core.Error(f"measure_costs: the ranks' stages are of pipelines of {totals} stages; every rank's must be "
                          "of one pipeline")
    measurer = {}
    for r, (indices, _, _) in enumerate(held):
        for s in indices:
            measurer.setdefault(s, r)
    missing = [s for s in range(total) if s not in measurer]
    if missing:
        raise _core.Error(f"measure_costs: no rank holds stages {missing} of {total}; give every stage in order "
                          "(nn.Module objects, or the PipelineStage objects of every rank)")
    triples, args = [], None
    for s in range(total):
        result = None
        if measurer[s] == rank:
            try:
                if s == 0:
                    if example_input is None:
                        raise _core.Error("measure_costs: example_input is missing; give one micro-batch's input of "
                                          "stage 0")
                    args = example_input if isinstance(example_input, tuple) else (example_input,)
                module, device = local[s]
                last = s == total - 1
                triple, args = _measure_stage(s, module, device, args, loss_fn if last else None,
                                              target if last else None, warmup, repeats)
                # The next stage's input travels only when another rank measures it.
                send = s + 1 < total and measurer[s + 1] != rank
                result = (None, triple, tuple(_to(a, torch.device("cpu")) for a in args) if send else None)
            except Exception as e:
                if size == 1:
                    raise
                # Every rank raises it, not only this one, so that none waits for this rank's next send.
                text = str(e) if isinstance(e, _core.Error) else f"measure_costs: stage {s} failed ({e!r})"
                result = (text, None, None)
        if size > 1:
            box = [result]
            dist.broadcast_object_list(box, group_src=measurer[s], group=group)
            result = box[0]
        error, triple, sent = result
        if error:
            raise _core.Error(error if size == 1 else f"{error} (rank {measurer[s]})")
        triples.append(triple)
        if sent is not None and s + 1 < total and measurer[s + 1] == rank:
            args = sent
    return _core.Costs(stages=triples, **costs)


def _distributed(group: Any) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _measured_stages(stages: Any) -> tuple:
    """({stage index: (module, device)}, stages in all, the process group, a problem's text or None)."""
    stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
    allowed = "give the stages in order as nn.Module objects, or the PipelineStage objects this rank holds"
    if not stages:
        return {}, 0, None, f"measure_costs: stages is empty; {allowed}"
    pipelined = [isinstance(s, PipelineStage) for s in stages]
    if all(pipelined):
        group = stages[0].group
        local = {s.stage_index: (s.submod, s.device) for s in stages}
        if len(local) != len(stages):
            return {}, 0, group, f"measure_costs: a stage index comes twice in {[s.stage_index for s in stages]}"
        return local, stages[0].num_stages, group, None
    for k, s in enumerate(stages):
        if not isinstance(s, torch.nn.Module) or pipelined[k]:
            return {}, 0, None, (f"measure_costs: stage {k} is a {type(s).__name__} among "
                                 f"{'PipelineStage' if any(pipelined) else 'nn.Module'} objects; {allowed}")
    return {k: (m, _device_of(m)) for k, m in enumerate(stages)}, len(stages), None, None


def _device_of(module: torch.nn.Module) -> torch.device:
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def _to(value: Any, device: torch.device) -> Any:
    return value.detach().to(device) if isinstance(value, torch.Tensor) else value


def _clock(device: torch.device) -> Callable:
    """A function that runs fn() on the device and returns (its result, its time in milliseconds)."""
    if device.type == "cuda":
        def timed(fn):
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(device))
            out = fn()
            end.record(torch.cuda.current_stream(device))
            end.synchronize()
            return out, start.elapsed_time(end)
        return timed

    def sync():
        if device.type != "cpu":
            torch.accelerator.synchronize(device)

    def timed(fn):
        sync()
        start = time.perf_counter()
        out = fn()
        sync()
        return out, (time.perf_counter() - start) * 1000.0
    return timed


def _failed(what: str, e: Exception, allowed: str) -> _core.Error:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return _core.Error(f"measure_costs: {what} failed ({lines[-1] if lines else type(e).__name__}); {allowed}")


def _measure_stage(s: int, module: torch.nn.Module, device: torch.device, args: tuple, loss_fn: Optional[Callable],
                   target: Any, warmup: int, repeats: int) -> tuple:
    """((F, I, W) in milliseconds, the stage's output, detached) of stage s run on args as PyTorch's runtime runs it."""
    timed = _clock(device)
    params = list(module.parameters())
    grads = [p.grad for p in params]
    buffers = [b.detach().clone() for b in module.buffers()]
    shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args]
    if loss_fn is not None and target is None:
        raise _core.Error(f"measure_costs: loss_fn needs a target, one micro-batch's labels for the last stage ({s})")
    times: list = [[], [], []]
    # The random state is the caller's again afterwards (dropout draws from it): the CPU's, and a CUDA stage's device's.
    forks = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=forks, device_type="cuda"), torch.enable_grad():
            for p in params:
                p.grad = None
            for k in range(warmup + repeats):
                # Stage 0 takes the data as given; a later stage a received activation, a leaf that needs a gradient.
                if s == 0:
                    inputs = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
                else:
                    inputs = [_to(a, device).requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor)
                              else a for a in args]

                def forward():
                    out = module(*inputs)
                    return out, (loss_fn(out, target) if loss_fn is not None else None)

                try:
                    (out, loss), f = timed(forward)
                except Exception as e:
                    source = "example_input" if s == 0 else f"stage {s - 1}'s output"
                    raise _failed(f"stage {s}'s forward on {source} (shapes {shapes})", e,
                                  "stage 0 takes example_input, each later stage the output of the one before") from e
                outputs = out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)
                roots = (loss,) if loss is not None else outputs
                ones = None if loss is not None else [torch.ones_like(o) if isinstance(o, torch.Tensor) else None
                                                      for o in outputs]
                following = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outputs)
                try:
                    if s == 0:  # the runtime's I is nothing here, its W the whole backward
                        i, (_, w) = 0.0, timed(lambda: stage_backward(loss if loss is not None else outputs, ones,
                                                                      inputs))
                    else:
                        (_, groups), i = timed(lambda: stage_backward_input(roots, ones, inputs, iter(params)))
                        _, w = timed(lambda: stage_backward_weight(iter(params), groups))
                except Exception as e:
                    raise _failed(f"stage {s}'s backward", e, "a stage's output must be tensors that autograd can "
                                  "differentiate (the last stage's: loss_fn's, given loss_fn)") from e
                if k >= warmup:
                    for t, x in zip(times, (f, i, w)):
                        t.append(x)
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        with torch.no_grad():
            for b, saved in zip(module.buffers(), buffers):
                b.copy_(saved)
    return tuple(statistics.median(t) for t in times), following
