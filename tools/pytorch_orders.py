#!/usr/bin/env python3
"""Writes the golden files of the schedule tests from PyTorch's own generators.

    python3 tools/pytorch_orders.py tests/data/pytorch    # with a Python that has PyTorch >= 2.15

For each schedule class pipeweave reproduces (ScheduleLoopedBFS,
ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV), over a grid of shapes
(P devices, V stages per device, M micro-batches), it builds the schedule the
way every rank would, but without a process group: each rank's stages are
stand-in objects carrying only what the constructors read (index, count, rank,
group size). It writes each rank's compute order (`pipeline_order`, idle slots
dropped) in PyTorch's action notation, or the error PyTorch raises for that
shape, to <dir>/<class>.txt:

    # <header: PyTorch version, this command>
    ScheduleZBVZeroBubble P=2 V=2 M=4
    rank 0: 0F0 0F1 0F2 3F0 3I0 3W0 ...
    rank 1: 1F0 2F0 ...
    ScheduleInterleavedZeroBubble P=2 V=1 M=5
    error: ValueError: Zero bubble requires ...

and a few of PyTorch's CSV dumps (compute only, and with communication and
bookkeeping actions), <dir>/<class>_P<P>_M<M>_{compute,comms}.csv, for the CSV
import tests. The tests read these files; they never need PyTorch.
"""
import argparse
import os
import sys
import types
import warnings

warnings.filterwarnings("ignore")

# Each class: the stages per device (V) it is built with, the stage placement, and its grid.
GRIDS = {
    "ScheduleLoopedBFS": {
        "chunks": [1, 2, 3, 4],
        "style": "loop",
        "devices": [1, 2, 3, 4, 5, 6, 8],
        "micro_batches": list(range(1, 13)) + [16],
    },
    "ScheduleInterleavedZeroBubble": {
        "chunks": [1, 2, 3, 4],
        "style": "loop",
        "devices": [1, 2, 3, 4, 5, 6, 8],
        "micro_batches": list(range(1, 17)) + [18, 20, 24, 27],
    },
    "ScheduleZBVZeroBubble": {
        "chunks": [2],
        "style": "v",
        "devices": [1, 2, 3, 4, 5, 6, 7, 8, 12],
        "micro_batches": list(range(1, 19)) + [22, 23, 24, 32],
    },
    "ScheduleDualPipeV": {
        "chunks": [2],
        "style": "v",
        "devices": [1, 2, 3, 4, 5, 6, 7, 8, 12],
        "micro_batches": list(range(1, 19)) + [22, 23, 24, 32],
    },
}

# Shapes whose CSV dumps the import and compute_comms tests read: (class, P, V, M, placement style).
DUMPS = [("ScheduleZBVZeroBubble", 2, 2, 4, "v"), ("ScheduleInterleavedZeroBubble", 3, 1, 6, "loop"),
         ("ScheduleDualPipeV", 2, 2, 4, "v"), ("ScheduleInterleaved1F1B", 4, 2, 8, "loop"),
         ("ScheduleLoopedBFS", 2, 2, 4, "loop")]


def stand_in_stages(schedules, devices, stages, rank, style):
    """The stages `rank` holds, as objects with what the schedule constructors read."""
    mapping = schedules.generate_stage_to_rank_mapping(devices, stages, style=style)
    mine = sorted(s for s, r in mapping.items() if r == rank)
    return [
        types.SimpleNamespace(
            stage_index=s,
            num_stages=stages,
            group_size=devices,
            group_rank=rank,
            is_first=s == 0,
            is_last=s == stages - 1,
            stage_index_to_group_rank=dict(mapping),
            submod=None,
        )
        for s in mine
    ]


def build(schedules, name, devices, chunks, micro_batches, style):
    """The schedule object as rank 0 builds it (every rank computes every rank's order)."""
    cls = getattr(schedules, name)
    return cls(stand_in_stages(schedules, devices, devices * chunks, 0, style), micro_batches)


def order_lines(schedule):
    return [
        f"rank {rank}: " + " ".join(str(a) for a in schedule.pipeline_order[rank] if a is not None)
        for rank in sorted(schedule.pipeline_order)
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="directory for the golden files (tests/data/pytorch)")
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed.pipelining.schedules as schedules
    except ImportError as e:
        sys.exit(f"pytorch_orders.py: PyTorch is needed ({e})")
    os.makedirs(args.out_dir, exist_ok=True)
    header = [
        f"# PyTorch {torch.__version__}, torch.distributed.pipelining: compute orders of each rank",
        "# written by: python3 tools/pytorch_orders.py " + args.out_dir,
    ]
    for name, grid in GRIDS.items():
        lines = list(header)
        for devices in grid["devices"]:
            for chunks in grid["chunks"]:
                for micro_batches in grid["micro_batches"]:
                    lines.append(f"{name} P={devices} V={chunks} M={micro_batches}")
                    try:
                        schedule = build(schedules, name, devices, chunks, micro_batches, grid["style"])
                    except (ValueError, RuntimeError) as e:
                        lines.append(f"error: {type(e).__name__}: {e}")
                        continue
                    lines += order_lines(schedule)
        path = os.path.join(args.out_dir, name + ".txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {path}")
    for name, devices, chunks, micro_batches, style in DUMPS:
        schedule = build(schedules, name, devices, chunks, micro_batches, style)
        for fmt, suffix in (("compute_only", "compute"), ("compute_comms", "comms")):
            path = os.path.join(args.out_dir, f"{name}_P{devices}_M{micro_batches}_{suffix}.csv")
            schedule._dump_csv(path, format=fmt)
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
