#!/usr/bin/env python3
"""vs_pytorch: pipeweave's CPU pipeline beside PyTorch's on the same model.

The bench model of bench/pipeline_cpu (8 Linear layers of 256 features with a ReLU
between them, batch 512, MSE, SGD with momentum 0.9) trained on 2 devices for each
(schedule, M) of --configs, by

- PyTorch: torch.distributed.pipelining (PipelineStage, ScheduleGPipe,
  Schedule1F1B, ScheduleInterleaved1F1B with 2 stages per rank) over gloo, one
  process per rank with torch.set_num_threads(1); and sequentially in one process
  with one thread (every micro-batch forward and backward in turn, the loss a mean
  over the micro-batches, one update);
- pipeweave: build/bench/pipeline_cpu (one thread per device, one OpenBLAS thread
  each; its sequential run is the reference trainer on one thread).

The two alternate: each of --repeats rounds runs PyTorch (pipelined, then
sequential, every config) and then pipeweave (every config). Each run reports the
median step time of its timed steps; the table shows the median over the rounds
and the ratios PyTorch / pipeweave (above 1: pipeweave is faster).

Not part of the tests: it needs PyTorch (`tools/dev bench-vs-pytorch` installs
PyTorch from PyPI into a venv of its own). Usage:

    bench/vs_pytorch.py [--pipeline-cpu build/bench/pipeline_cpu] [--repeats 3]
                        [--configs gpipe:2,1f1b:2,1f1b:8,interleaved:2,interleaved:16]
                        [--warmup 3] [--iters 10]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

LAYERS, HIDDEN, BATCH, DEVICES, CHUNKS = 8, 256, 512, 2, 2
LR, MOMENTUM = 0.001, 0.9
NAMES = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved": "interleaved (V=2)"}


def parse_configs(text):
    configs = []
    for item in text.split(","):
        schedule, _, m = item.partition(":")
        if schedule not in NAMES or not m.isdigit() or int(m) < 1 or BATCH % int(m) != 0:
            raise SystemExit(f"vs_pytorch: --configs: '{item}' is not SCHEDULE:M with SCHEDULE one of "
                             f"{', '.join(NAMES)} and M dividing the batch of {BATCH}")
        if schedule == "interleaved" and int(m) % DEVICES != 0:
            raise SystemExit(f"vs_pytorch: --configs: '{item}': interleaved needs M to be a multiple of {DEVICES}")
        configs.append((schedule, int(m)))
    return configs


def layers_of(torch, first, last):
    """Layers [first, last) of the model: Linear, ReLU after each but the model's last."""
    mods = []
    for layer in range(first, last):
        mods.append(torch.nn.Linear(HIDDEN, HIDDEN))
        if layer + 1 < LAYERS:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def torch_rank(rank, port, configs, warmup, iters, results):
    """One rank of PyTorch's pipeline: every config in turn; rank 0 reports the step times."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=DEVICES)
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    out = {}
    for schedule, m in configs:
        chunks = CHUNKS if schedule == "interleaved" else 1
        stages_total = DEVICES * chunks
        per_stage = LAYERS // stages_total
        stages, params = [], []
        for c in range(chunks):
            s = c * DEVICES + rank  # loop placement, as pipeweave's
            module = layers_of(torch, s * per_stage, (s + 1) * per_stage)
            params += list(module.parameters())
            # Static shapes (no metadata exchange at the first step); the outputs and
            # the received inputs take gradients.
            rows = BATCH // m
            stages.append(PipelineStage(module, s, stages_total, torch.device("cpu"),
                                        input_args=(torch.empty(rows, HIDDEN, requires_grad=s > 0),),
                                        output_args=(torch.empty(rows, HIDDEN, requires_grad=True),)))
        loss = torch.nn.functional.mse_loss
        if schedule == "gpipe":
            sched = ScheduleGPipe(stages[0], m, loss_fn=loss)
        elif schedule == "1f1b":
            sched = Schedule1F1B(stages[0], m, loss_fn=loss)
        else:
            sched = ScheduleInterleaved1F1B(stages, m, loss_fn=loss)
        opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
        holds_first, holds_last = rank == 0, rank == (stages_total - 1) % DEVICES
        times = []
        for i in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            args = (x,) if holds_first else ()
            kwargs = {"target": y} if holds_last else {}
            sched.step(*args, **kwargs)
            opt.step()
            times.append(time.perf_counter() - t0)
        # The step of the pipeline ends when its last rank is done: the slowest rank's time.
        t = torch.tensor(times[warmup:], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[f"{schedule}:{m}"] = 1e3 * statistics.median(t.tolist())
    dist.destroy_process_group()
    if rank == 0:
        results.put(out)


def torch_sequential(configs, warmup, iters):
    """The same model on one process and one thread: every micro-batch in turn, one update."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(1)
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    out = {}
    for schedule, m in configs:
        model = layers_of(torch, 0, LAYERS)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        xs, ys = x.chunk(m), y.chunk(m)
        times = []
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            opt.zero_grad()
            for xm, ym in zip(xs, ys):
                (torch.nn.functional.mse_loss(model(xm), ym) / m).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        out[f"{schedule}:{m}"] = 1e3 * statistics.median(times[warmup:])
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(configs, warmup, iters):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(torch_rank, args=(free_port(), configs, warmup, iters, results), nprocs=DEVICES,
                       start_method="spawn")
    pipelined = results.get()
    return pipelined, torch_sequential(configs, warmup, iters)


def run_pipeweave(binary, configs, warmup, iters):
    pipelined, sequential = {}, {}
    for schedule in dict.fromkeys(s for s, _ in configs):
        ms = ",".join(str(m) for s, m in configs if s == schedule)
        cmd = [binary, "--devices", str(DEVICES), "--chunks", str(CHUNKS), "--layers", str(LAYERS), "--hidden",
               str(HIDDEN), "--batch", str(BATCH), "--schedules", schedule, "--micro-batches", ms, "--warmup",
               str(warmup), "--iters", str(iters), "--json"]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"vs_pytorch: {' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
        for row in json.loads(done.stdout)["rows"]:
            if row["wrong"] != 0:
                raise SystemExit(f"vs_pytorch: pipeline_cpu reports {row['wrong']} wrong parameters for {schedule}")
            key = f"{row['schedule']}:{row['micro_batches']}"
            pipelined[key], sequential[key] = row["pipelined_ms"], row["sequential_ms"]
    return pipelined, sequential


def load():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipeline-cpu", default="build/bench/pipeline_cpu", help="the pipeline_cpu binary")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--configs", default="gpipe:2,1f1b:2,1f1b:8,interleaved:2,interleaved:16",
                        help="comma-separated SCHEDULE:M (default gpipe:2,1f1b:2,1f1b:8,interleaved:2,interleaved:16)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per run (default 3)")
    parser.add_argument("--iters", type=int, default=10, help="timed steps per run (default 10)")
    a = parser.parse_args()
    configs = parse_configs(a.configs)
    if not os.access(a.pipeline_cpu, os.X_OK):
        raise SystemExit(f"vs_pytorch: {a.pipeline_cpu} is not an executable (build it: meson compile -C build "
                         "bench/pipeline_cpu)")
    try:
        import torch
    except ImportError:
        raise SystemExit("vs_pytorch: PyTorch is not installed for this Python (tools/dev bench-vs-pytorch installs "
                         "it into a venv of its own)")
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # the ranks' threads, before they start

    load_before = load()
    runs = {k: [] for k in ("pw_pipe", "pw_seq", "pt_pipe", "pt_seq")}
    for r in range(a.repeats):
        print(f"vs_pytorch: round {r + 1} of {a.repeats}: PyTorch", file=sys.stderr)
        pt_pipe, pt_seq = run_torch(configs, a.warmup, a.iters)
        print(f"vs_pytorch: round {r + 1} of {a.repeats}: pipeweave", file=sys.stderr)
        pw_pipe, pw_seq = run_pipeweave(a.pipeline_cpu, configs, a.warmup, a.iters)
        for name, d in (("pw_pipe", pw_pipe), ("pw_seq", pw_seq), ("pt_pipe", pt_pipe), ("pt_seq", pt_seq)):
            runs[name].append(d)

    def med(name, key):
        return statistics.median(d[key] for d in runs[name])

    print(f"# vs_pytorch: {LAYERS} layers x {HIDDEN} features, batch {BATCH}, MSE, SGD with momentum, "
          f"{DEVICES} devices; PyTorch {torch.__version__} (gloo, 1 thread per rank) against pipeweave "
          f"({os.path.basename(a.pipeline_cpu)}, 1 thread per device)")
    print(f"# medians over {a.repeats} alternating rounds of {a.warmup} warm-up + {a.iters} timed steps; "
          f"{os.cpu_count()} cores, load average {load_before} before, {load()} after")
    print()
    print("| schedule | M | pipeweave pipelined ms | pipeweave sequential ms | PyTorch pipelined ms "
          "| PyTorch sequential ms | PyTorch / pipeweave, pipelined | PyTorch / pipeweave, sequential |")
    print("| --- | --: | --: | --: | --: | --: | --: | --: |")
    for schedule, m in configs:
        k = f"{schedule}:{m}"
        pw_pipe, pw_seq, pt_pipe, pt_seq = (med(n, k) for n in ("pw_pipe", "pw_seq", "pt_pipe", "pt_seq"))
        print(f"| {NAMES[schedule]} | {m} | {pw_pipe:.1f} | {pw_seq:.1f} | {pt_pipe:.1f} | {pt_seq:.1f} "
              f"| {pt_pipe / pw_pipe:.2f} | {pt_seq / pw_seq:.2f} |")


if __name__ == "__main__":
    main()
