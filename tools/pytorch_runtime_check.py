#!/usr/bin/env python3
"""Runs a schedule in PyTorch's CSV format on PyTorch's own pipelining runtime and checks its gradients.

    build/examples/print_schedule --schedule auto --devices 2 --chunks 2 --micro-batches 4 --format csv > /tmp/s.csv
    python3 tools/pytorch_runtime_check.py /tmp/s.csv --devices 2 --chunks 2 --micro-batches 4 --placement loop
                                                    # with a Python that has PyTorch >= 2.15

    python3 tools/pytorch_runtime_check.py order.csv --format compute_comms --pytorch-class ScheduleInterleaved1F1B \
        --devices 4 --chunks 2 --micro-batches 8   # rows with their sends and receives (pipeweave.with_comms), and
                                                   # the gradients of PyTorch's own class beside them, bit for bit

A development-time check, not a test: the tests never need PyTorch. It spawns
P CPU processes (gloo backend, 127.0.0.1 and a free port), one per rank. Each
builds the same small model with a fixed seed, in float64: P*V blocks of
Linear(16, 16) + Tanh, block s being pipeline stage s, and wraps the stages
its rank holds under the placement (loop: stage s on rank s mod P; v: down the
ranks and back up, PyTorch's generate_stage_to_rank_mapping) in PipelineStage.
It builds torch.distributed.pipelining's _PipelineScheduleRuntime over them
with n_microbatches=M and an MSE loss (mean over each micro-batch), loads the
CSV with _load_csv(path, format=--format): compute_only infers the stage of
each rank from the CSV and lowers it with PyTorch's own sends and receives,
compute_comms runs the file's sends, receives and waits as written; and runs
one step() on a fixed batch of 2*M rows. With --pytorch-class, each rank then
runs PyTorch's own schedule class on a fresh copy of the model and the same
batch, and its gradients must equal the CSV's bit for bit.

PyTorch sums the micro-batches' gradients and, with scale_grads=True (the
default), divides them by M; the reference is therefore the same model run
sequentially on the whole batch with MSE averaged over the whole batch. It
prints one line per check and exits non-zero on a mismatch or on any error
(the error text of the rank that raised it is printed):

    placement: OK (stage -> rank {0: 0, 1: 1, 2: 0, 3: 1})
    loss: OK (largest difference 0.0e+00)
    stage 0 gradients: OK (largest difference 1.1e-16)
    ...
"""
import argparse
import datetime
import os
import socket
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")

WIDTH = 16
SEED = 1234
TOLERANCE = 1e-12  # float64; the pipeline only sums the same terms in another order


def make_model(torch, stages):
    """The whole model, identical in every process: one Linear + Tanh block per stage."""
    torch.manual_seed(SEED)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(stages)]
    return torch.nn.Sequential(*blocks).double()


def make_batch(torch, micro_batches):
    generator = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(2 * micro_batches, WIDTH, generator=generator, dtype=torch.float64)
    y = torch.randn(2 * micro_batches, WIDTH, generator=generator, dtype=torch.float64)
    return x, y


def sequential_reference(torch, stages, micro_batches):
    """Loss and per-stage parameter gradients of the model run without pipelining."""
    model = make_model(torch, stages)
    x, y = make_batch(torch, micro_batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = {s: [p.grad.clone() for p in block.parameters()] for s, block in enumerate(model)}
    return loss.detach(), grads


def largest_difference(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def run_rank(rank, args, port, results):
    """One rank: run the pipeline step, compare with the reference, and report to the parent."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    stages = args.devices * args.chunks
    lines = []
    try:
        dist.init_process_group("gloo", rank=rank, world_size=args.devices,
                                timeout=datetime.timedelta(seconds=args.timeout))
        mapping = generate_stage_to_rank_mapping(args.devices, stages, style=args.placement)
        mine = sorted(s for s, r in mapping.items() if r == rank)
        model = make_model(torch, stages)
        pipeline_stages = [PipelineStage(model[s], s, stages, torch.device("cpu")) for s in mine]
        schedule = _PipelineScheduleRuntime(pipeline_stages, args.micro_batches,
                                            loss_fn=torch.nn.functional.mse_loss)
        schedule._load_csv(args.csv, format=args.format)
        inferred = dict(sorted(schedule.stage_index_to_group_rank.items()))
        if inferred != mapping:
            raise ValueError(f"the CSV places the stages {inferred} (stage -> rank), "
                             f"--placement {args.placement} places them {mapping}")
        if rank == 0:
            lines.append(f"placement: OK (stage -> rank {mapping})")

        x, y = make_batch(torch, args.micro_batches)
        step_args = (x,) if 0 in mine else ()
        step_kwargs = {"target": y, "losses": []} if stages - 1 in mine else {}
        schedule.step(*step_args, **step_kwargs)

        reference_loss, reference_grads = sequential_reference(torch, stages, args.micro_batches)
        if stages - 1 in mine:
            pipeline_loss = torch.stack(step_kwargs["losses"]).sum() / args.micro_batches
            lines.append(("loss", (pipeline_loss - reference_loss).abs().item()))
        for s in mine:
            grads = [p.grad for p in model[s].parameters()]
            if any(g is None for g in grads):
                lines.append((f"stage {s} gradients", None))
            else:
                lines.append((f"stage {s} gradients", largest_difference(grads, reference_grads[s])))
        if args.pytorch_class:
            # PyTorch's own class on a fresh copy of the model: its gradients, against the CSV's, bit for bit.
            import torch.distributed.pipelining.schedules as schedules
            cls = getattr(schedules, args.pytorch_class)
            own_model = make_model(torch, stages)
            own_stages = [PipelineStage(own_model[s], s, stages, torch.device("cpu")) for s in mine]
            single = issubclass(cls, schedules.PipelineScheduleSingle)
            own = cls(own_stages[0] if single else own_stages, args.micro_batches, loss_fn=torch.nn.functional.mse_loss)
            own_kwargs = {"target": y, "losses": []} if stages - 1 in mine else {}
            own.step(*step_args, **own_kwargs)
            for s in mine:
                ours = [p.grad for p in model[s].parameters()]
                theirs = [p.grad for p in own_model[s].parameters()]
                same = all(a is not None and b is not None and torch.equal(a, b) for a, b in zip(ours, theirs))
                lines.append(f"stage {s} gradients against {args.pytorch_class}: " +
                             ("OK (bit for bit)" if same else
                              f"DIFFERENT (largest difference {largest_difference(ours, theirs):.3e})"))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:
        results.put((rank, lines, (f"rank {rank}: {type(e).__name__}: {e}", traceback.format_exc())))
        raise
    results.put((rank, lines, None))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the schedule, one line per rank (print_schedule --format csv)")
    ap.add_argument("--devices", type=int, required=True, help="ranks P")
    ap.add_argument("--chunks", type=int, required=True, help="stages per rank V")
    ap.add_argument("--micro-batches", type=int, required=True, help="micro-batches M")
    ap.add_argument("--placement", choices=["loop", "v"], default="loop", help="stage placement (default loop)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds a rank waits on another (default 120)")
    ap.add_argument("--format", choices=["compute_only", "compute_comms"], default="compute_only",
                    help="the CSV's format: compute actions only (PyTorch places the sends and receives), or with "
                         "its sends, receives and waits (pipeweave.with_comms) (default compute_only)")
    ap.add_argument("--pytorch-class", help="also run this class of torch.distributed.pipelining.schedules "
                                            "(ScheduleInterleaved1F1B, ...) and compare its gradients bit for bit")
    args = ap.parse_args()
    args.csv = os.path.abspath(args.csv)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        sys.exit(f"pytorch_runtime_check.py: PyTorch is needed ({e})")
    print(f"# PyTorch {torch.__version__}: {args.csv} P={args.devices} V={args.chunks} "
          f"M={args.micro_batches} placement={args.placement}")

    results = mp.get_context("spawn").SimpleQueue()
    spawn_error = None
    try:
        mp.spawn(run_rank, args=(args, free_port(), results), nprocs=args.devices, join=True)
    except Exception as e:  # a rank raised or died; its own report says why
        spawn_error = " ".join(line for line in str(e).splitlines() if line.strip())[:200]
    reports = []
    while not results.empty():
        reports.append(results.get())

    failed = failed_traceback_shown = False
    for rank, lines, error in sorted(reports, key=lambda r: r[0]):
        for line in lines:
            if isinstance(line, str):
                print(line)
                failed = failed or "DIFFERENT" in line
            elif line[1] is None:
                print(f"{line[0]}: MISSING (no .grad on rank {rank})")
                failed = True
            elif line[1] <= TOLERANCE:
                print(f"{line[0]}: OK (largest difference {line[1]:.1e})")
            else:
                print(f"{line[0]}: DIFFERENT (largest difference {line[1]:.3e})")
                failed = True
        if error is not None:
            message, trace = error
            print("error: " + message)
            if not failed_traceback_shown:  # the first failing rank's traceback, on stderr
                print(trace, file=sys.stderr, end="")
                failed_traceback_shown = True
            failed = True
    if len(reports) != args.devices:
        print(f"error: only {len(reports)} of {args.devices} ranks reported"
              + (f" ({spawn_error})" if spawn_error else ""))
        failed = True
    elif spawn_error is not None and not failed:
        print(f"error: {spawn_error}")
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
