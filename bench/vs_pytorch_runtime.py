#!/usr/bin/env python3
"""vs_pytorch_runtime: pipeweave's programs and communication order in PyTorch's own runtime, beside PyTorch's classes.

P gloo processes (CPU, one per rank) run torch.distributed.pipelining on stages that sleep their cost instead of
computing, so that a 2-core machine measures the schedule and not the CPU: a stage's forward sleeps F, its backward
sleeps I in the activation path (what an I computes) and W in the weight path (what a W computes), so that a split
backward splits the time and a whole one sleeps I + W. One time unit is --unit milliseconds.

Two tables:

- kinds: for each kind with a PyTorch class, PyTorch's class (its own order and its own sends and receives) against
  pipeweave.torch.schedule_for(kind) (the same order, with_comms()'s sends and receives), uniform costs F = I = W = 1;
- synthesis: for each row (stage costs, a memory limit in activations), pipeweave.synthesize()'s program run by
  schedule_for(kind="auto") against the fastest PyTorch class whose program fits the limit (pipeweave's simulation of
  that class's order says which fit), with the simulated ratio beside the measured one;
- measured (only on request): one stage 1.5x the others; pipeweave.torch.measure_costs() times the stages in PyTorch
  (each rank its own, V = 1), synthesize() searches for those costs at 1F1B's memory (P activations), and
  schedule_for(kind="auto", costs=...) runs the program against Schedule1F1B (V = 1) and ScheduleInterleaved1F1B (the
  same model in 2P stages of half the cost); the synthesized program's gradients after one step are compared with
  the sequential model's.

Each cell is the median of --iters timed steps after --warmup, a step timed on rank 0 from a barrier before it to a
barrier after it. Not a test: it needs PyTorch and the pipeweave package in one Python (`pip install .`). Usage:

    bench/vs_pytorch_runtime.py [--devices 4] [--micro-batches 8] [--unit 10] [--warmup 2] [--iters 5]
                                [--tables kinds,synthesis,measured] [--receives early|late]
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time

WIDTH = 8

# Each generated kind with its PyTorch class and the stages per rank it is measured with.
KINDS = [
    ("gpipe", "ScheduleGPipe", 1),
    ("1f1b", "Schedule1F1B", 1),
    ("interleaved", "ScheduleInterleaved1F1B", 2),
    ("looped-bfs", "ScheduleLoopedBFS", 2),
    ("zb-h1", "ScheduleInterleavedZeroBubble", 1),
    ("interleaved-zb", "ScheduleInterleavedZeroBubble", 2),
    ("zb-v", "ScheduleZBVZeroBubble", 2),
    ("dualpipe-v", "ScheduleDualPipeV", 2),
]


def synthesis_rows(P):
    """(name, V, per-stage (F, I, W), memory limit in activations): limits at or below 1F1B's."""
    uniform = [(1.0, 1.0, 1.0)] * P
    last_slow = [(1.0, 1.0, 1.0)] * (P - 1) + [(1.3, 1.3, 1.3)]
    return [
        ("uniform, 1F1B's memory", 1, uniform, float(P)),
        ("last stage 1.3x, 1F1B's memory", 1, last_slow, float(P)),
        ("uniform, 3/4 of 1F1B's memory", 1, uniform, float(P) * 0.75),
    ]


def sleeping(torch, forward, backward):
    """An identity autograd function that sleeps `forward` seconds on the way in and `backward` on the way back."""
    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            time.sleep(forward)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(backward)
            return g

    return Sleep


def make_stage_module(torch, f, i, w, unit):
    """A stage whose forward sleeps F, whose input gradient (I) sleeps I and whose weight gradient (W) sleeps W."""
    act, weight = sleeping(torch, f * unit, i * unit), sleeping(torch, 0.0, w * unit)

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(WIDTH))

        def forward(self, x):
            return act.apply(x) * weight.apply(self.weight)

    return Stage()


def rank_main(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining.schedules as schedules
    from torch.distributed.pipelining import PipelineStage

    import pipeweave as pw
    from pipeweave.torch import measure_costs, program_for, schedule_for

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.devices, timeout=datetime.timedelta(seconds=300))
    P, M, unit = args.devices, args.micro_batches, args.unit / 1000.0

    def measure(make_schedule, stage_costs, program):
        """Median step time (ms) of the schedule that make_schedule(stages) builds over this rank's stages."""
        stages_count = len(stage_costs)
        mine = [s for s in range(stages_count) if program.device_of_stage(s) == rank]
        modules = {s: make_stage_module(torch, *stage_costs[s], unit) for s in mine}
        stages = [PipelineStage(modules[s], s, stages_count, torch.device("cpu")) for s in mine]
        schedule = make_schedule(stages)
        x = torch.randn(2 * M, WIDTH)
        y = torch.randn(2 * M, WIDTH)
        times = []
        for it in range(args.warmup + args.iters):
            dist.barrier()
            start = time.perf_counter()
            kwargs = {"target": y, "losses": []} if stages_count - 1 in mine else {}
            schedule.step(*((x,) if 0 in mine else ()), **kwargs)
            dist.barrier()
            if it >= args.warmup:
                times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    def pytorch_class(name, program):
        cls = getattr(schedules, name)
        single = issubclass(cls, schedules.PipelineScheduleSingle)
        return lambda stages: cls(stages[0] if single else stages, M, loss_fn=torch.nn.functional.mse_loss)

    def ours(kind, costs=None, limit=0.0):
        return lambda stages: schedule_for(stages, M, torch.nn.functional.mse_loss, kind=kind, costs=costs,
                                           memory_limit=limit, receives=args.receives)

    def gradient_difference(costs, limit, stage_costs):
        """The largest difference between one step's gradients under schedule_for(kind="auto") and the sequential
        model's (stages of weights drawn from a seed, sleeping nothing), in float64, on rank 0; 0 elsewhere."""
        count = len(stage_costs)

        def module(s, u):
            m = make_stage_module(torch, *stage_costs[s], u).double()
            with torch.no_grad():
                m.weight.copy_(torch.randn(WIDTH, generator=torch.Generator().manual_seed(s), dtype=torch.float64))
            return m

        x = torch.randn(2 * M, WIDTH, generator=torch.Generator().manual_seed(P), dtype=torch.float64)
        y = torch.sin(x)
        program = program_for(P, 1, M, kind="auto", costs=costs, memory_limit=limit)
        mine = [s for s in range(count) if program.device_of_stage(s) == rank]
        modules = {s: module(s, unit) for s in mine}
        stages = [PipelineStage(modules[s], s, count, torch.device("cpu")) for s in mine]
        schedule = ours("auto", costs, limit)(stages)
        schedule.step(*((x,) if 0 in mine else ()), **({"target": y, "losses": []} if count - 1 in mine else {}))
        gathered = [None] * P
        dist.all_gather_object(gathered, {s: modules[s].weight.grad for s in mine})
        if rank != 0:
            return 0.0
        sequential = [module(s, 0.0) for s in range(count)]
        out = x
        for m in sequential:
            out = m(out)
        torch.nn.functional.mse_loss(out, y).backward()
        grads = {s: g for part in gathered for s, g in part.items()}
        return max((grads[s] - sequential[s].weight.grad).abs().max().item() for s in range(count))

    if "kinds" in args.tables:
        for kind, cls, V in KINDS:
            program = program_for(P, V, M, kind=kind)
            costs = [(1.0, 1.0, 1.0)] * (P * V)
            theirs = measure(pytorch_class(cls, program), costs, program)
            mine = measure(ours(kind), costs, program)
            if rank == 0:
                queue.put(("kinds", kind, cls, V, theirs, mine))
    if "synthesis" in args.tables:
        for name, V, stage_costs, limit in synthesis_rows(P):
            costs = pw.Costs(stages=stage_costs)
            found = pw.synthesize(P, V, M, costs, memory_limit=limit)
            # PyTorch's classes whose order fits the limit, by pipeweave's simulation of that order.
            fitting = []
            for kind, cls, kv in KINDS:
                if kv != V:
                    continue
                program = program_for(P, V, M, kind=kind)
                trace = pw.simulate(program, costs)
                if max(trace.peak_memory) <= limit:
                    fitting.append((kind, cls, program, trace.makespan))
            best = None
            for kind, cls, program, simulated in fitting:
                measured = measure(pytorch_class(cls, program), stage_costs, program)
                if best is None or measured < best[3]:
                    best = (kind, cls, simulated, measured)
            synthesized = measure(ours("auto", costs, limit), stage_costs, found.program)
            if rank == 0:
                queue.put(("synthesis", name, V, limit, best, found.makespan, synthesized))
    if "measured" in args.tables:
        slow = [(1.0, 1.0, 1.0)] * P
        slow[1] = (1.5, 1.5, 1.5)
        micro_x, micro_y = torch.randn(2, WIDTH), torch.randn(2, WIDTH)
        held = [PipelineStage(make_stage_module(torch, *slow[rank], unit), rank, P, torch.device("cpu"))]
        costs = measure_costs(held, micro_x if rank == 0 else None, torch.nn.functional.mse_loss,
                              micro_y if rank == P - 1 else None, warmup=1, repeats=3)
        found = pw.synthesize(P, 1, M, costs, memory_limit=float(P))
        halves = [tuple(c / 2 for c in slow[s // 2]) for s in range(2 * P)]
        one_f1b = measure(pytorch_class("Schedule1F1B", None), slow, program_for(P, 1, M, kind="1f1b"))
        interleaved = measure(pytorch_class("ScheduleInterleaved1F1B", None), halves,
                              program_for(P, 2, M, kind="interleaved"))
        synthesized = measure(ours("auto", costs, float(P)), slow, found.program)
        difference = gradient_difference(costs, float(P), slow)
        simulated = found.makespan / pw.simulate(pw.schedule("1f1b", P, 1, M), costs).makespan
        if rank == 0:
            queue.put(("measured", costs.stages, found.program.kind, one_f1b, interleaved, synthesized, simulated,
                       difference))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=4, help="ranks P (default 4)")
    ap.add_argument("--micro-batches", type=int, default=8, help="micro-batches M (default 8)")
    ap.add_argument("--unit", type=float, default=10.0, help="milliseconds of one cost unit (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--iters", type=int, default=5, help="timed steps (default 5)")
    ap.add_argument("--tables", default="kinds,synthesis",
                    help="kinds, synthesis, measured, comma-separated (default kinds,synthesis)")
    ap.add_argument("--receives", choices=["early", "late"], default="early",
                    help="where pipeweave's placement posts its receives (pipeweave.with_comms; default early)")
    args = ap.parse_args()
    args.tables = args.tables.split(",")
    for t in args.tables:
        if t not in ("kinds", "synthesis", "measured"):
            sys.exit(f"vs_pytorch_runtime.py: --tables takes kinds, synthesis and measured (got '{t}')")
    try:
        import torch
        import torch.multiprocessing as mp

        import pipeweave  # noqa: F401
    except ImportError as e:
        sys.exit(f"vs_pytorch_runtime.py: PyTorch and the pipeweave package are needed in one Python ({e})")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"# PyTorch {torch.__version__}, P={args.devices}, M={args.micro_batches}, one unit = {args.unit:g} ms; "
          f"median of {args.iters} steps after {args.warmup}; pipeweave's receives {args.receives}")
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(args, port, queue), nprocs=args.devices, join=True)
    rows = []
    while not queue.empty():
        rows.append(queue.get())
    kinds = [r for r in rows if r[0] == "kinds"]
    if kinds:
        print("\n| kind | V | PyTorch's class | its step (ms) | pipeweave's order (ms) | pipeweave / PyTorch |")
        print("| --- | --: | --- | --: | --: | --: |")
        for _, kind, cls, V, theirs, mine in kinds:
            print(f"| {kind} | {V} | {cls} | {theirs:.1f} | {mine:.1f} | {mine / theirs:.3f} |")
    synth = [r for r in rows if r[0] == "synthesis"]
    if synth:
        print("\n| costs, limit | V | best fitting PyTorch class | its step (ms) | synthesized (ms) | measured ratio | "
              "simulated ratio | share of the simulated gain |")
        print("| --- | --: | --- | --: | --: | --: | --: | --: |")
        for _, name, V, limit, best, simulated_synth, synthesized in synth:
            if best is None:
                print(f"| {name} | {V} | none fits {limit:g} | | {synthesized:.1f} | | | |")
                continue
            kind, cls, simulated_best, measured_best = best
            measured = synthesized / measured_best
            simulated = simulated_synth / simulated_best
            share = (1 - measured) / (1 - simulated) if simulated < 1 else float("nan")
            print(f"| {name} | {V} | {cls} ({kind}) | {measured_best:.1f} | {synthesized:.1f} | {measured:.3f} | "
                  f"{simulated:.3f} | {share:.2f} |")

    for _, stages, kind, one_f1b, interleaved, synthesized, simulated, difference in (r for r in rows
                                                                                    if r[0] == "measured"):
        print("\nmeasured (F, I, W) per stage, ms: " + ", ".join(f"({f:.1f}, {i:.1f}, {w:.1f})" for f, i, w in stages))
        print("\n| schedule | V | step (ms) | / Schedule1F1B |")
        print("| --- | --: | --: | --: |")
        print(f"| Schedule1F1B | 1 | {one_f1b:.1f} | 1.000 |")
        print(f"| ScheduleInterleaved1F1B | 2 | {interleaved:.1f} | {interleaved / one_f1b:.3f} |")
        print(f"| synthesized for the measured costs, 1F1B's memory ({kind}) | 1 | {synthesized:.1f} | "
              f"{synthesized / one_f1b:.3f} (simulated {simulated:.3f}) |")
        print(f"\nthe synthesized program's gradients: largest difference from the sequential model's {difference:.1e}")


if __name__ == "__main__":
    main()
