#!/usr/bin/env python3
"""Trains a small model in PyTorch's pipelining runtime with pipeweave's schedule and communication order.

    python3 examples/train_pytorch.py --kind interleaved --devices 2 --chunks 2 --micro-batches 4
    python3 examples/train_pytorch.py --kind auto --devices 2 --chunks 1 --micro-batches 8 --memory-limit 2
    python3 examples/train_pytorch.py --kind auto --measure --devices 4 --chunks 1 --micro-batches 8 --memory-limit 4

Needs PyTorch (2.15 or later) and the pipeweave package (pip install .) in one Python. It starts one CPU process per
rank (gloo, 127.0.0.1), builds P*V blocks of Linear + Tanh in float64, each rank wrapping the blocks its stages are
(as the program places them) in PipelineStage, and trains them with SGD through
pipeweave.torch.schedule_for(...): pipeweave's program, its sends and receives placed and proved by
pipeweave.with_comms(). With --kind auto, the program is the one pipeweave.synthesize() finds for uniform costs, or
with --measure for the costs pipeweave.torch.measure_costs() times on one micro-batch (rank 0 measures; every rank
gets the same costs, so the same program). Rank 0 trains the same model without pipelining beside it; at the end
every rank's parameters are compared with that reference. Prints the loss of each step and the largest difference.
"""
import argparse
import datetime
import os
import socket
import sys

WIDTH = 32
SEED = 7


def make_model(torch, stages):
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(stages)]).double()


def batch(torch, step, rows):
    g = torch.Generator().manual_seed(SEED + step)
    x = torch.randn(rows, WIDTH, generator=g, dtype=torch.float64)
    return x, torch.sin(x)  # a target the model can learn


def run(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    import pipeweave
    from pipeweave.torch import measure_costs, program_for, schedule_for

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.devices, timeout=datetime.timedelta(seconds=60))
    try:
        stages = args.devices * args.chunks
        model = make_model(torch, stages)
        # Which blocks this rank holds: the program's placement (loop, or v for zb-v and dualpipe-v).
        costs = pipeweave.Costs() if args.kind == "auto" else None
        if args.measure:  # one micro-batch of the first step's batch, through every block (collective: every rank)
            x, y = batch(torch, 0, 2 * args.micro_batches)
            costs = measure_costs(list(model), x[:2], torch.nn.functional.mse_loss, y[:2])
            if rank == 0:
                queue.put(("costs", costs.stages))
        program = program_for(args.devices, args.chunks, args.micro_batches, kind=args.kind, costs=costs,
                              memory_limit=args.memory_limit)
        mine = [s for s in range(stages) if program.device_of_stage(s) == rank]
        pipeline = [PipelineStage(model[s], s, stages, torch.device("cpu")) for s in mine]
        schedule = schedule_for(pipeline, args.micro_batches, torch.nn.functional.mse_loss, kind=args.kind,
                                costs=costs, memory_limit=args.memory_limit)
        params = [p for s in mine for p in model[s].parameters()]
        optimizer = torch.optim.SGD(params, lr=args.lr)
        reference = make_model(torch, stages) if rank == 0 else None
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=args.lr) if reference is not None else None
        for step in range(args.steps):
            x, y = batch(torch, step, 2 * args.micro_batches)
            optimizer.zero_grad()
            losses = []
            schedule.step(*((x,) if 0 in mine else ()), **({"target": y, "losses": losses} if stages - 1 in mine else {}))
            optimizer.step()
            if reference is not None:
                reference_optimizer.zero_grad()
                torch.nn.functional.mse_loss(reference(x), y).backward()
                reference_optimizer.step()
            if losses:
                queue.put(("loss", step, (torch.stack(losses).sum() / args.micro_batches).item()))
        # Every rank's blocks against the reference's, which rank 0 trained.
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]) if reference is None else \
            torch.cat([p.detach().flatten() for p in reference.parameters()])
        dist.broadcast(flat, src=0)
        ours = torch.cat([p.detach().flatten() for s in mine for p in model[s].parameters()])
        offsets, at = {}, 0
        for s, block in enumerate(model):
            n = sum(p.numel() for p in block.parameters())
            offsets[s] = (at, at + n)
            at += n
        theirs = torch.cat([flat[offsets[s][0]:offsets[s][1]] for s in mine])
        queue.put(("difference", rank, (ours - theirs).abs().max().item(), program.kind, mine))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="interleaved", help="a pipeweave schedule (pipeweave.kinds()) or auto")
    ap.add_argument("--devices", type=int, default=2, help="ranks P (default 2)")
    ap.add_argument("--chunks", type=int, default=2, help="stages per rank V (default 2)")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches M (default 4)")
    ap.add_argument("--memory-limit", type=float, default=0.0, help="for --kind auto: each rank's cap, in activations")
    ap.add_argument("--measure", action="store_true",
                    help="for --kind auto: synthesize for the costs measure_costs() times (default: uniform costs)")
    ap.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD's learning rate (default 0.1)")
    args = ap.parse_args()
    if args.measure and args.kind != "auto":
        sys.exit(f"train_pytorch.py: --measure gives the costs --kind auto synthesizes for ({args.kind} has its own "
                 "order)")
    try:
        import torch.multiprocessing as mp

        import pipeweave  # noqa: F401
    except ImportError as e:
        sys.exit(f"train_pytorch.py: PyTorch and the pipeweave package are needed in one Python ({e})")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(args, port, queue), nprocs=args.devices, join=True)
    reports = []
    while not queue.empty():
        reports.append(queue.get())
    for _, stages in (r for r in reports if r[0] == "costs"):
        print("measured (F, I, W) per stage, ms: " + ", ".join(f"({f:.3f}, {i:.3f}, {w:.3f})" for f, i, w in stages))
    for _, step, loss in sorted(r for r in reports if r[0] == "loss"):
        print(f"step {step:3d}: loss {loss:.6f}")
    worst = 0.0
    for _, rank, difference, kind, mine in sorted(r for r in reports if r[0] == "difference"):
        print(f"rank {rank} ({kind}, stages {mine}): largest difference from sequential training {difference:.1e}")
        worst = max(worst, difference)
    print("parameters: " + ("OK" if worst <= 1e-10 else "DIFFERENT") + f" (largest difference {worst:.1e})")
    sys.exit(0 if worst <= 1e-10 else 1)


if __name__ == "__main__":
    main()
