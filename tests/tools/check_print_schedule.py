#!/usr/bin/env python3
"""Checks print_schedule's analysis formats, --input, --output and its errors.

  check_print_schedule.py PATH/TO/print_schedule

Chrome output must load as JSON, SVG as XML, CSV must read back to the same
program; bad arguments must give exit status 2, one line on stderr and nothing
on stdout; --output must write the whole file or leave nothing behind.
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

failures = []


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def main() -> int:
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        # Chrome trace: JSON with a track per device and an event per action.
        r = run(exe, "--format", "chrome")
        check(r.returncode == 0, "chrome: exit status 0")
        doc = json.loads(r.stdout)
        events = doc["traceEvents"]
        names = [e for e in events if e.get("name") == "thread_name"]
        check(len(names) == 4, "chrome: 4 device tracks")
        compute = [e for e in events if e.get("cat") in ("forward", "backward")]
        check(len(compute) == 128, "chrome: 128 actions")
        check(any(e["name"] == "F c1 m3" and e["args"]["stage"] == 4 for e in compute), "chrome: F c1 m3 at stage 4")
        check(doc["otherData"]["bubble_ratio"] == 0.1875, "chrome: bubble ratio of the lowered steps")

        # SVG: well-formed XML with a title that states the bubble ratio.
        r = run(exe, "--format", "svg", "--schedule", "1f1b", "--micro-batches", "16", "--forward-cost", "2")
        root = ET.fromstring(r.stdout)
        check(root.tag.endswith("svg"), "svg: root element")
        text = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
        check("bubble ratio 0.1875" in text, "svg: subtitle with the bubble ratio")
        check("forward 2, backward 4" in text, "svg: subtitle with the cost model")

        # CSV round trip through --input.
        csv = os.path.join(tmp, "order.csv")
        r = run(exe, "--format", "csv", "--devices", "3", "--chunks", "2", "--micro-batches", "6")
        with open(csv, "w") as f:
            f.write(r.stdout)
        a = run(exe, "--format", "actions", "--devices", "3", "--chunks", "2", "--micro-batches", "6").stdout
        b = run(exe, "--format", "actions", "--input", csv)
        check(b.returncode == 0 and b.stdout == a, "csv: --input reads back the same actions")
        s = run(exe, "--format", "summary", "--input", csv, "--replay", "dataflow")
        check(s.returncode == 0 and "bubble ratio: 0.166667" in s.stdout, "csv: dataflow summary of the import")

        # Bad arguments: status 2, one line on stderr, nothing on stdout.
        bad_csv = os.path.join(tmp, "bad.csv")
        with open(bad_csv, "w") as f:
            f.write("0F0,0X0\n")
        for args, words in [
            (["--format", "pdf"], "--format"),
            (["--forward-cost", "0"], "--forward-cost"),
            (["--backward-cost", "inf"], "--backward-cost"),
            (["--p2p-latency", "-1"], "--p2p-latency"),
            (["--p2p-latency", "nan"], "--p2p-latency"),
            (["--replay", "eager"], "--replay"),
            (["--input", bad_csv], "line 1, column 5"),
            (["--input", csv, "--schedule", "gpipe"], "excludes"),
            (["--input", csv, "--micro-batches", "4"], "the program has 6 micro-batches"),
            (["--input", os.path.join(tmp, "missing.csv")], "cannot open"),
            (["--output", os.path.join(tmp, "no", "such", "dir.svg")], "cannot create"),
            (["--schedule", "interleaved", "--micro-batches", "6"], "multiple of devices"),
            (["--schedule", "zb-v", "--chunks", "3"], "chunks must be 2"),
            (["--schedule", "interleaved-zb", "--micro-batches", "9"], "multiple of the rounds"),
            (["--schedule", "zb-h1", "--w-cost", "2"], "less than the backward cost, 2"),
            (["--w-cost", "0"], "--w-cost"),
        ]:
            r = run(exe, *args)
            lines = r.stderr.splitlines()
            check(r.returncode == 2, f"{args}: exit status 2 (got {r.returncode})")
            check(len(lines) == 1 and words in r.stderr, f"{args}: one line naming {words!r} (got {r.stderr!r})")
            check(r.stdout == "", f"{args}: nothing on stdout")

        # --output: the same bytes as stdout; a failure leaves an existing file alone.
        out = os.path.join(tmp, "timeline.svg")
        r = run(exe, "--format", "svg", "--output", out)
        check(r.returncode == 0 and r.stdout == "", "--output: quiet success")
        with open(out) as f:
            check(f.read() == run(exe, "--format", "svg").stdout, "--output: same content as stdout")
        wrong = os.path.join(tmp, "wrong.csv")
        with open(wrong, "w") as f:
            f.write("0F0,0B0\n1B0,1F0\n")
        r = run(exe, "--input", wrong, "--format", "svg", "--output", out)
        check(r.returncode == 1 and "verification failed" in r.stderr, "--output: verification failure is status 1")
        with open(out) as f:
            check(f.read().startswith("<svg"), "--output: the earlier file is intact")
        check(sorted(os.listdir(tmp)) == ["bad.csv", "order.csv", "timeline.svg", "wrong.csv"],
              f"--output: no temporary files left ({sorted(os.listdir(tmp))})")

        # The zero-bubble family: I and W in the CSV, the v placement read back, the split costs.
        zbv = os.path.join(tmp, "zbv.csv")
        r = run(exe, "--format", "csv", "--schedule", "zb-v", "--devices", "2", "--micro-batches", "4")
        check(r.stdout.startswith("0F0,0F1,0F2,3F0,3I0,3W0,"), "zb-v csv: PyTorch's order, stage 3 on device 0")
        with open(zbv, "w") as f:
            f.write(r.stdout)
        a = run(exe, "--format", "actions", "--schedule", "zb-v", "--devices", "2", "--micro-batches", "4").stdout
        b = run(exe, "--format", "actions", "--input", zbv)
        check(b.returncode == 0 and b.stdout == a, "zb-v csv: --input reads back the same actions")
        o = run(exe, "--format", "overview", "--input", zbv)
        check("chunk 1 = layers 7-8 (stage 3)" in o.stdout, "zb-v csv: the v placement inferred")
        s = run(exe, "--format", "summary", "--schedule", "zb-h1", "--micro-batches", "8", "--backward-cost", "3",
                "--w-cost", "1", "--replay", "dataflow")
        check("backward 3 (I 2 + W 1)" in s.stdout, "zb-h1 summary: the split costs")
        # M(F + I + W) + (P - 1)(F + I - W) = 8 * 4 + 3 * 2, simulated and closed form.
        check("makespan: 38 units" in s.stdout and "closed form (free communication): bubble ratio 0.1875, makespan 38"
              in s.stdout, "zb-h1 summary: the closed form of its makespan")
        for schedule in ("looped-bfs", "zb-h1", "interleaved-zb", "zb-v"):
            for fmt in ("actions", "steps", "overview", "ascii", "summary", "svg", "chrome"):
                r = run(exe, "--schedule", schedule, "--format", fmt)
                check(r.returncode == 0 and r.stdout, f"--schedule {schedule} --format {fmt}")
        os.remove(zbv)

        # Overlapped pairs: every format, the CSV read back pairs and all, a second Chrome track.
        pairs = os.path.join(tmp, "pairs.csv")
        for args in (["--schedule", "dualpipe-v"], ["--overlap"], ["--schedule", "1f1b", "--overlap"]):
            for fmt in ("actions", "steps", "overview", "ascii", "summary", "svg", "chrome", "csv"):
                r = run(exe, *args, "--format", fmt, "--overlap-efficiency", "0.5")
                check(r.returncode == 0 and r.stdout, f"{' '.join(args)} --format {fmt}")
            r = run(exe, *args, "--format", "csv")
            check("OVERLAP_F_B" in r.stdout, f"{' '.join(args)} csv: pairs as OVERLAP_F_B")
            with open(pairs, "w") as f:
                f.write(r.stdout)
            a = run(exe, *args, "--format", "actions").stdout
            b = run(exe, "--format", "actions", "--input", pairs)
            check(b.returncode == 0 and b.stdout == a, f"{' '.join(args)} csv: --input reads back the same pairs")
            doc = json.loads(run(exe, *args, "--format", "chrome").stdout)
            tracks = [e for e in doc["traceEvents"] if e.get("name") == "thread_name"]
            check(any("overlapped backward" in e["args"]["name"] for e in tracks),
                  f"{' '.join(args)} chrome: a second track for the pairs' backwards")
        os.remove(pairs)

        # The older formats still work.
        for fmt in ("actions", "steps", "overview", "ascii", "summary"):
            r = run(exe, "--format", fmt)
            check(r.returncode == 0 and r.stdout, f"--format {fmt}")
    if failures:
        print(f"{len(failures)} checks failed", file=sys.stderr)
        return 1
    print("ok: print_schedule formats, --input, --output and errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
