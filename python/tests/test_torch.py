"""pipeweave.torch.measure_costs: with PyTorch installed; skipped without it."""
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

import pipeweave as pw  # noqa: E402
from pipeweave.torch import measure_costs  # noqa: E402

WIDTH = 16


class Block(torch.nn.Module):
    """Linear + Tanh that sleeps `seconds` in its forward: a stage made slower by a known amount."""

    def __init__(self, seconds=0.0, width=WIDTH):
        super().__init__()
        self.linear, self.seconds = torch.nn.Linear(width, width), seconds

    def forward(self, x):
        if self.seconds:
            time.sleep(self.seconds)
        return torch.tanh(self.linear(x))


def batch(rows=4):
    g = torch.Generator().manual_seed(3)
    return torch.randn(rows, WIDTH, generator=g), torch.randn(rows, WIDTH, generator=g)


def test_each_stage_gets_its_f_i_w_and_a_slow_stage_measures_slower():
    torch.manual_seed(0)
    stages = [Block(), Block(0.02), Block(), Block()]
    x, y = batch()
    costs = measure_costs(stages, x, torch.nn.functional.mse_loss, y, warmup=1, repeats=3)
    assert isinstance(costs, pw.Costs) and len(costs.stages) == 4
    for s, (f, i, w) in enumerate(costs.stages):
        assert f > 0 and w > 0, (s, f, i, w)
        # Stage 0's input is the data: PyTorch's runtime runs no I there and its whole backward as the W.
        assert i == 0 if s == 0 else i > 0, (s, f, i, w)
        assert w < i + w or s == 0
    fast = [costs.stages[s][0] for s in (0, 2, 3)]
    assert costs.stages[1][0] >= 20.0 and costs.stages[1][0] > 3 * max(fast), costs.stages  # milliseconds


def test_measuring_leaves_the_modules_as_they_were():
    torch.manual_seed(0)
    stages = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.BatchNorm1d(WIDTH), torch.nn.Dropout(0.5))
              for _ in range(2)]
    for m in stages:
        m[0].weight.grad = torch.full_like(m[0].weight, 7.0)
    running = [m[1].running_mean.clone() for m in stages]
    rng = torch.get_rng_state()
    x, y = batch()
    measure_costs(stages, x, torch.nn.functional.mse_loss, y, warmup=0, repeats=2)
    assert all(torch.equal(m[0].weight.grad, torch.full_like(m[0].weight, 7.0)) for m in stages)
    assert all(m[1].bias.grad is None for m in stages)
    assert all(torch.equal(m[1].running_mean, r) for m, r in zip(stages, running))
    assert torch.equal(torch.get_rng_state(), rng) and torch.is_grad_enabled()


def test_uneven_measured_costs_synthesize_a_proven_program():
    torch.manual_seed(0)
    stages = [Block(), Block(), Block(0.01), Block()]
    x, y = batch()
    costs = measure_costs(stages, x, torch.nn.functional.mse_loss, y, warmup=1, repeats=3, p2p_latency=0.01)
    assert costs.p2p_latency == 0.01
    found = pw.synthesize(4, 1, 8, costs, memory_limit=4)
    assert pw.verify(found.program)
    assert found.makespan <= pw.simulate(pw.schedule("1f1b", 4, 1, 8), costs).makespan
    # Without a loss the last stage's backward starts from a gradient of ones; outputs may be tuples.
    pair = [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)]

    class Split(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = pair

        def forward(self, x):
            return self.a(x), self.b(x)

    class Join(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Linear(WIDTH, 1)

        def forward(self, u, v):
            return self.c(u * v)

    costs = measure_costs([Split(), Join()], x, repeats=1)
    assert len(costs.stages) == 2 and all(w > 0 for _, _, w in costs.stages)


def test_bad_input_says_what_was_wrong_and_what_is_allowed():
    x, y = batch()
    loss = torch.nn.functional.mse_loss
    with pytest.raises(pw.Error, match=r"^measure_costs: stages is empty; give the stages in order as nn.Module "
                                       r"objects, or the PipelineStage objects this rank holds$"):
        measure_costs([], x)
    with pytest.raises(pw.Error, match=r"^measure_costs: stage 1 is a str among nn.Module objects; give the stages"):
        measure_costs([Block(), "block"], x)
    with pytest.raises(pw.Error, match=r"^measure_costs: stage 1's forward on stage 0's output "
                                       r"\(shapes \[\(4, 16\)\]\) failed \(.*shapes cannot be multiplied.*\); "
                                       r"stage 0 takes example_input, each later stage the output of the one before$"):
        measure_costs([Block(), Block(width=8)], x)
    with pytest.raises(pw.Error, match=r"^measure_costs: stage 0's forward on example_input \(shapes \[\(4, 3\)\]\) "):
        measure_costs([Block()], torch.randn(4, 3))
    with pytest.raises(pw.Error, match=r"^measure_costs: example_input is missing; give one micro-batch's input of "
                                       r"stage 0$"):
        measure_costs([Block()])
    with pytest.raises(pw.Error, match=r"^measure_costs: loss_fn needs a target, one micro-batch's labels for the "
                                       r"last stage \(1\)$"):
        measure_costs([Block(), Block()], x, loss)
    with pytest.raises(pw.Error, match=r"^measure_costs: forward is what it measures; the other Costs keywords are "
                                       r"allowed \(p2p_latency, stash_sizes, \.\.\.\)$"):
        measure_costs([Block()], x, forward=1.0)
    with pytest.raises(pw.Error, match=r"^measure_costs: warmup must be at least 0 and repeats at least 1 "
                                       r"\(got 2, 0\)$"):
        measure_costs([Block()], x, repeats=0)


RANKS = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.distributed.pipelining import PipelineStage
    import pipeweave as pw
    from pipeweave.torch import measure_costs, schedule_for

    def block(s):
        torch.manual_seed(s)
        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 8)
            def forward(self, x):
                time.sleep(0.02 if s == 2 else 0.0)
                return torch.tanh(self.linear(x))
        return Block()

    def run(rank, port, queue):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
        try:
            torch.manual_seed(9)
            x, y = torch.randn(2, 8), torch.randn(2, 8)
            mine = [s for s in range(4) if s % 2 == rank]  # the loop placement
            stages = [PipelineStage(block(s), s, 4, torch.device("cpu")) for s in mine]
            costs = measure_costs(stages, x if rank == 0 else None, torch.nn.functional.mse_loss,
                                  y if rank == 1 else None, warmup=1, repeats=2)
            schedule = schedule_for(stages, 4, torch.nn.functional.mse_loss, kind="auto", costs=costs,
                                    memory_limit=2)
            whole = measure_costs([block(s) for s in range(4)], x, torch.nn.functional.mse_loss, y, repeats=1)
            refused = []
            bad = [PipelineStage(torch.nn.Linear(4, 4) if s == 3 else block(s), s, 4, torch.device("cpu"))
                   for s in mine]
            for given in (stages[:1], bad):
                try:
                    measure_costs(given, x, torch.nn.functional.mse_loss, y, repeats=1)
                except pw.Error as e:
                    refused.append(str(e))
            queue.put((rank, costs.stages, whole.stages, schedule.pipeweave_program.actions, refused))
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(run, args=(port, queue), nprocs=2, join=True)
        got = sorted(queue.get() for _ in range(2))
        assert got[0][1:4] == got[1][1:4], got  # every rank: the same costs, so the same program
        costs = got[0][1]
        assert len(costs) == 4 and costs[2][0] > 3 * max(costs[s][0] for s in (0, 1, 3)), costs
        assert len(got[0][2]) == 4
        assert got[0][4] == got[1][4], got
        for refused in got[0][4]:
            print(refused)
        print("ranks: OK")
""")


def test_on_several_ranks_each_measures_its_stages_and_all_get_the_same_costs(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=pathlib.Path(__file__).parent)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "ranks: OK"
    # Each rank gave only its first stage, then a stage 3 that cannot take stage 2's output: every rank raises the
    # same error, and none waits for another.
    assert lines[0] == ("measure_costs: no rank holds stages [2, 3] of 4; give every stage in order "
                        "(nn.Module objects, or the PipelineStage objects of every rank)")
    assert lines[1].startswith("measure_costs: stage 3's forward on stage 2's output (shapes [(2, 8)]) failed (")
    assert lines[1].endswith("; stage 0 takes example_input, each later stage the output of the one before (rank 1)")
