"""The pipeweave Python package: every binding against the library's own results and texts."""

import doctest
import json
import pathlib
import re

import pytest

import pipeweave as pw

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTORCH = ROOT / "tests" / "data" / "pytorch"


def test_kinds_are_the_generated_schedules():
    assert pw.kinds() == ["gpipe", "1f1b", "interleaved", "looped-bfs", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v"]


def test_a_schedule_has_its_shape_and_pytorch_actions():
    p = pw.schedule("interleaved", 4, 2, 8)
    assert (p.kind, p.devices, p.chunks, p.micro_batches, p.stages, p.placement) == ("interleaved", 4, 2, 8, 8, "loop")
    assert all(len(row) == 2 * 2 * 8 for row in p.actions)
    # Megatron-LM's warm-up on device 0: 2 * (P - 1) + (V - 1) * P forwards, micro-batches in rounds of P.
    assert p.actions[0][:10] == ["0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3", "0F4", "0F5"]
    assert repr(p) == "<pipeweave.Program Interleaved 1F1B: P=4 devices, V=2 chunks, M=8 micro-batches>"
    assert str(p).startswith("device 0: F0.0 F0.1 F0.2 F0.3 F1.0")
    assert pw.schedule("zb-v", 2, None, 4).chunks == 2 and pw.schedule("zb-v", 2, None, 4).placement == "v"
    assert [pw.schedule("zb-v", 2, None, 4).device_of_stage(s) for s in range(4)] == [0, 1, 1, 0]
    assert [p.device_of_stage(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    with pytest.raises(pw.Error, match=r"^device_of_stage: stage 8 is not a virtual stage of the program \(0 to 7\)$"):
        p.device_of_stage(8)
    assert pw.schedule("1f1b", 2, 1, 2) == pw.schedule("1f1b", 2, None, 2)
    assert pw.schedule("1f1b", 2, 1, 2) != pw.schedule("gpipe", 2, 1, 2)
    with pytest.raises(TypeError):
        hash(p)


def pytorch_orders(name):
    """(P, V, M, rank lines or None for a refusal) of tools/pytorch_orders.py's file for a PyTorch class."""
    header, ranks, error = None, [], False
    for line in (PYTORCH / f"{name}.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("rank "):
            ranks.append(line)
        elif line.startswith("error: "):
            error = True
        else:
            if header:
                yield (*header, None if error else ranks)
            P, V, M = map(int, re.fullmatch(rf"{name} P=(\d+) V=(\d+) M=(\d+)", line).groups())
            header, ranks, error = (P, V, M), [], False
    if header:
        yield (*header, None if error else ranks)


def test_the_orders_are_pytorchs_and_so_are_the_refusals():
    classes = {
        "ScheduleLoopedBFS": ["looped-bfs"],
        "ScheduleInterleavedZeroBubble": ["interleaved-zb", "zb-h1"],
        "ScheduleZBVZeroBubble": ["zb-v"],
        "ScheduleDualPipeV": ["dualpipe-v"],
    }
    orders = refusals = 0
    for name, kinds in classes.items():
        for P, V, M, ranks in pytorch_orders(name):
            for kind in kinds:
                if kind == "zb-h1" and V != 1:
                    continue
                if ranks is None:
                    with pytest.raises(pw.Error, match=f"^{kind} schedule: "):
                        pw.schedule(kind, P, V, M)
                    refusals += 1
                    continue
                p = pw.schedule(kind, P, V, M)
                assert [f"rank {d}: " + " ".join(row) for d, row in enumerate(p.actions)] == ranks, (kind, P, V, M)
                assert pw.verify(p), (kind, P, V, M)
                orders += 1
    assert orders > 1200 and refusals > 150


def test_bad_shapes_and_names_raise_the_librarys_words():
    with pytest.raises(pw.Error) as e:
        pw.schedule("1f1x", 2, 1, 2)
    assert str(e.value) == ("make_schedule: no schedule is called '1f1x'; the schedules are gpipe 1f1b interleaved "
                            "looped-bfs zb-h1 interleaved-zb zb-v dualpipe-v")
    with pytest.raises(pw.Error, match=r"^interleaved schedule: micro-batches \(3\) must be a multiple of devices \(4\)$"):
        pw.schedule("interleaved", 4, 2, 3)
    with pytest.raises(pw.Error, match=r"^dualpipe-v schedule: chunks must be 2 \(got 3\)"):
        pw.schedule("dualpipe-v", 2, 3, 8)
    with pytest.raises(pw.Error, match=r"^zb-v schedule: the placement must be v \(got loop\)$"):
        pw.schedule("zb-v", 2, 2, 4, placement="loop")
    with pytest.raises(pw.Error, match=r"^placement must be 'loop' or 'v' \(got 'ring'\)$"):
        pw.schedule("1f1b", 2, 1, 2, placement="ring")
    with pytest.raises(TypeError):
        pw.schedule("1f1b", 2, 1, "two")


def test_verify_names_the_deadlock_of_a_hand_made_program():
    good = pw.program([["0F0", "0B0"], ["1F0", "1B0"]])
    assert good.kind == "custom" and bool(pw.verify(good)) and pw.verify(good).message == "ok"
    bad = pw.program([["0F0", "0B0"], ["1B0", "1F0"]])  # device 1's backward before the forward it needs
    r = pw.verify(bad)
    assert not r and not r.ok
    assert r.message and r.message != "ok" and str(r) == r.message
    assert repr(r) == f"<pipeweave.Verification {r.message}>"
    with pytest.raises(pw.Error) as e:
        pw.lower(bad)
    assert str(e.value) == r.message
    with pytest.raises(pw.Error, match=r"^program: device 0's action 1 must be one action string"):
        pw.program([["0F0", 3]])
    with pytest.raises(pw.Error, match=r"^program: actions must be one list of action strings per device"):
        pw.program(["0F0,0B0"])


def test_lower_places_the_sends_and_receives():
    lp = pw.lower(pw.schedule("1f1b", 2, 1, 2))
    assert lp.steps == [
        ["F0.0", "[send act s0 m0 -> d1] F0.1", "[send act s0 m1 -> d1]", "[recv grad s1 m0 <- d1] B0.0",
         "[recv grad s1 m1 <- d1] B0.1"],
        ["[recv act s0 m0 <- d0] F0.0", "[recv act s0 m1 <- d0] B0.0", "[send grad s1 m0 -> d0] F0.1", "B0.1",
         "[send grad s1 m1 -> d0]"],
    ]
    assert str(lp).startswith("device 0: 5 steps\n  step 0: F0.0\n")


@pytest.mark.parametrize("P, M", [(2, 2), (4, 8), (8, 32)])
def test_1f1b_simulates_to_its_closed_form(P, M):
    t = pw.simulate(pw.schedule("1f1b", P, 1, M))
    assert t.makespan == pytest.approx((M + P - 1) * 3)  # F 1, B 2 by default
    assert t.bubble_ratio == pytest.approx((P - 1) / M)
    assert t.peak_activations == [min(P - d, M) for d in range(P)]
    events = t.events
    assert len(events) == 2 * P * M
    assert {e.phase for e in events} == {"F", "B"}
    first = min(events, key=lambda e: (e.start, e.device))
    assert (first.device, first.stage, first.phase, first.micro_batch, first.start, first.end) == (0, 0, "F", 0, 0, 1)


def test_costs_reach_the_simulator():
    p = pw.schedule("zb-h1", 4, 1, 8)
    slow = pw.simulate(p, pw.Costs(forward=2, input=2, weight=2))
    assert slow.makespan == pytest.approx(2 * pw.simulate(p).makespan)
    staged = pw.Costs(stages=[(1, 1, 1)] * 3 + [(2, 2, 2)])
    assert staged.stages == [(1, 1, 1)] * 3 + [(2, 2, 2)]
    assert repr(staged) == "<pipeweave.Costs 4 stages, F:I:W 1:1:1, 1:1:1, 1:1:1, 2:2:2>"
    assert pw.simulate(p, staged).makespan > pw.simulate(p).makespan
    c = pw.Costs(forward=1, input=1.5)
    assert (c.forward, c.input, c.weight, c.backward) == (1, 1.5, 1, 2.5)
    assert repr(c) == "<pipeweave.Costs F 1, I 1.5, W 1, B 2.5>"
    with pytest.raises(pw.Error, match=r"^cost model: 3 stage costs for 4 virtual stages"):
        pw.simulate(p, pw.Costs(stages=[(1, 1, 1)] * 3))
    with pytest.raises(pw.Error, match=r"^cost model: the forward cost must be finite and at least 0"):
        pw.Costs(forward=-1)
    with pytest.raises(pw.Error, match=r"^replay must be 'steps' or 'dataflow' \(got 'fast'\)$"):
        pw.Costs(replay="fast")
    bound = pw.simulate(p, pw.Costs(replay="dataflow"))
    assert bound.makespan <= pw.simulate(p).makespan


def test_synthesis_beats_1f1b_at_its_memory_and_proves_its_program():
    costs = pw.Costs(forward=1, input=1, weight=1)
    found = pw.synthesize(4, 1, 8, costs, memory_limit=4)
    assert found.program.kind == "auto" and pw.verify(found.program)
    name, builtin, makespan = found.best_builtin
    assert name == "1f1b" and pw.verify(builtin) and makespan == pytest.approx(33)
    assert found.lower_bound <= found.makespan < makespan
    assert pw.simulate(found.program, costs).makespan == pytest.approx(found.makespan)
    assert max(pw.simulate(found.program, costs).peak_memory) <= 4
    assert found.peak_memory <= 4 and found.evaluated > 0 and found.origin
    assert pw.smallest_memory_limit(4, 1, 8) == 1
    with pytest.raises(pw.Error, match="memory"):
        pw.synthesize(4, 1, 8, costs, memory_limit=0.5)


def test_transforms():
    p = pw.schedule("1f1b", 2, 1, 4)
    r = pw.with_grad_reduce(p)
    assert r.actions[0][-1] == "0REDUCE_GRAD" and r.actions[1][-1] == "1REDUCE_GRAD" and pw.verify(r)
    o = pw.overlap(pw.schedule("interleaved", 2, 2, 4))
    assert any("OVERLAP_F_B" in a for row in o.actions for a in row) and pw.verify(o)
    c = pw.with_recompute(p, [0])
    assert "C0.0" in str(c) and pw.verify(c)
    with pytest.raises(pw.Error, match="PyTorch's schedules and CSV do not have"):
        c.actions
    assert pw.with_recompute(p, "all") == pw.with_recompute(p, [0, 1])
    with pytest.raises(pw.Error, match=r"^with_recompute: stages must be a list of virtual stages or 'all' \(got 'every'\)$"):
        pw.with_recompute(p, "every")
    off = pw.with_offload(pw.schedule("gpipe", 2, 1, 8), "all")
    assert "O0." in str(off) and pw.verify(off)


def test_csv_round_trips_and_names_the_bad_field(tmp_path):
    p = pw.schedule("interleaved-zb", 3, 2, 6)
    text = pw.to_csv(p)
    assert text.splitlines()[0].split(",") == p.actions[0]
    back = pw.parse_csv(text)
    assert back.kind == "custom" and back.actions == p.actions and back.placement == "loop"
    path = tmp_path / "order.csv"
    path.write_text(text)
    assert pw.load_csv(path).actions == p.actions and pw.load_csv(str(path)).actions == p.actions
    # PyTorch's own compute_comms dump: its sends and receives are skipped, its compute kept.
    comms = pw.load_csv(PYTORCH / "ScheduleZBVZeroBubble_P2_M4_comms.csv")
    compute = pw.load_csv(PYTORCH / "ScheduleZBVZeroBubble_P2_M4_compute.csv")
    assert [[a for a in row if not a.endswith("REDUCE_GRAD")] for row in comms.actions] == compute.actions
    assert comms.placement == "v" and pw.verify(comms)
    with pytest.raises(pw.Error, match=r"^csv line 2, column 5 \('1X0'\): unknown action kind 'X'; "):
        pw.parse_csv("0F0,0B0\n1F0,1X0\n")
    with pytest.raises(pw.Error):
        pw.load_csv(tmp_path / "missing.csv")


def test_the_renderers():
    t = pw.simulate(pw.schedule("1f1b", 2, 1, 2))
    assert t.ascii().splitlines()[0] == ("1F1B: P=2 devices, V=1 chunk, M=2 micro-batches; simulated, makespan 9 units, "
                                         "bubble ratio 0.5")
    svg = t.svg(title="two devices", width=800)
    assert svg.startswith("<svg") and "two devices" in svg and 'width="800"' in svg
    trace = json.loads(t.chrome_trace(name="run"))
    assert len([e for e in trace["traceEvents"] if e.get("cat") in ("forward", "backward")]) == 8
    assert "\nmakespan: 9 units\nbubble ratio: 0.5 " in t.summary()
    assert t.to_csv() == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def test_to_cpp_is_a_header_that_proves_the_program():
    header = pw.to_cpp(pw.schedule("1f1b", 2, 1, 2), "TwoByTwo")
    assert "struct TwoByTwo {" in header and header.rstrip().endswith("static_assert(pipeweave::verify(TwoByTwo{}));")


def test_the_docstring_examples_hold():
    for module in (pw, pw._core):
        failures, tried = doctest.testmod(module, extraglobs={"pw": pw, "pipeweave": pw})
        assert tried > 0 and failures == 0, module.__name__


def test_the_checked_in_stubs_are_stubgens(tmp_path):
    stubgen = pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_core.pyi"
    stubgen.main(["-q", "-m", "pipeweave._core", "-o", str(out)])
    assert out.read_text() == (ROOT / "python" / "pipeweave" / "_core.pyi").read_text(), (
        "python/pipeweave/_core.pyi is stale: python -m nanobind.stubgen -m pipeweave._core -o python/pipeweave/_core.pyi")


def test_the_readme_script_prints_what_the_readme_says(capsys):
    readme = (ROOT / "README.md").read_text()
    script = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(script, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    said = re.search(r"It ends `(proof: ok)` and `(bubble [^`]*)`: ([0-9.]+) of 1F1B's time", readme)
    assert said, "README: the sentence after the script names its last two lines and the ratio"
    assert printed[-2:] == [said.group(1), said.group(2)]
    synthesized, builtin = map(float, re.search(r"makespan ([0-9.]+) \(1f1b: ([0-9.]+)\)", printed[-1]).groups())
    assert f"{synthesized / builtin:.2f}" == said.group(3)
    assert printed[0].startswith("device 0: F0.0")


CROSSED_SENDS = (
    "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1\n"
    "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n"
)


def test_with_comms_places_the_communication_and_proves_it():
    for kind in pw.kinds():
        p = pw.schedule(kind, 2, None, 4)
        c = pw.with_comms(p)
        assert c.program == pw.with_grad_reduce(p)  # PyTorch's runtime scales each stage's gradients at REDUCE_GRAD
        assert [[a for a in row if not re.search("SEND|RECV|WAIT", a)] for row in c.rows] == c.program.actions
        for semantics in ("async", "pair"):
            assert pw.prove_comms(c, semantics), (kind, semantics)
        assert pw.parse_comms(c.to_csv()) == c and str(c) == c.to_csv()
    c = pw.with_comms(pw.schedule("1f1b", 2, 1, 2))  # receives as early as the pair's order allows
    assert c.rows[1] == ["1RECV_F0", "1RECV_F1", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1", "1REDUCE_GRAD",
                         "1WAIT_REDUCE_GRAD", "1WAIT_SEND_B0", "1WAIT_SEND_B1"]
    late = pw.with_comms(pw.schedule("1f1b", 2, 1, 2), "late")  # as late: 1RECV_F1 just before the send it precedes
    assert late.rows[1][:5] == ["1RECV_F0", "1F0", "1B0", "1RECV_F1", "1SEND_B0"] and pw.prove_comms(late)
    with pytest.raises(pw.Error, match=r"^with_comms: receives must be 'late' or 'early' \(got 'soon'\)$"):
        pw.with_comms(pw.schedule("1f1b", 2, 1, 2), "soon")
    assert repr(c) == "<pipeweave.Comms 1F1B: P=2 devices, V=1 chunk, M=2 micro-batches>"
    with pytest.raises(pw.Error, match="which PyTorch's schedules and CSV do not have"):
        pw.with_comms(pw.with_recompute(pw.schedule("1f1b", 2, 1, 2), [0]))


def test_prove_comms_names_the_hang_and_proves_pytorchs_own_dumps(tmp_path):
    crossed = pw.parse_comms(CROSSED_SENDS)
    assert pw.prove_comms(crossed, "async")
    r = pw.prove_comms(crossed)  # "pair", the default
    assert not r and (r.rank, r.index) == (0, 5)
    assert r.message.endswith("which waits for 0RECV_B0 (rank 0, action 4); cycle of waits: rank 0 -> rank 1 -> rank 0")
    assert str(r) == r.message and repr(r) == f"<pipeweave.CommsProof {r.message}>"
    for name in ("ScheduleDualPipeV_P2_M4", "ScheduleInterleavedZeroBubble_P3_M6", "ScheduleZBVZeroBubble_P2_M4",
                 "ScheduleInterleaved1F1B_P4_M8", "ScheduleLoopedBFS_P2_M4"):
        c = pw.load_comms(PYTORCH / f"{name}_comms.csv")
        for semantics in ("async", "pair", "rank"):
            assert pw.prove_comms(c, semantics).message == "ok", (name, semantics)
    path = tmp_path / "crossed.csv"
    path.write_text(CROSSED_SENDS)
    assert pw.load_comms(path) == crossed
    with pytest.raises(pw.Error, match=r"^semantics must be one of 'async', 'pair', 'rank' \(got 'nccl'\)$"):
        pw.prove_comms(crossed, "nccl")
    with pytest.raises(pw.Error, match=r"^csv line 1, column 5 \('0SEND_X0'\): unknown action kind 'SEND_X'; "):
        pw.parse_comms("0F0,0SEND_X0\n")


def test_pipeweave_torch_trains_as_sequential_training_does():
    """With PyTorch installed: examples/train_pytorch.py through pipeweave.torch.schedule_for, P gloo processes."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    for kind, chunks, extra in (("interleaved", 2, []), ("zb-v", 2, []), ("auto", 1, ["--memory-limit", "2"]),
                                ("auto", 1, ["--memory-limit", "2", "--measure"])):
        run = subprocess.run([sys.executable, str(ROOT / "examples" / "train_pytorch.py"), "--kind", kind, "--devices",
                              "2", "--chunks", str(chunks), "--micro-batches", "4", "--steps", "3"] + extra,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "parameters: OK" in run.stdout


def test_pipeweave_torch_needs_torch_and_says_so():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            import pipeweave.torch  # noqa: F401
        return
    from pipeweave.torch import program_for

    assert program_for(2, 2, 4, kind="zb-v").placement == "v"
    with pytest.raises(pw.Error, match="^schedule_for: costs and memory_limit are what kind='auto' synthesizes for"):
        program_for(2, 1, 4, kind="1f1b", memory_limit=2)
