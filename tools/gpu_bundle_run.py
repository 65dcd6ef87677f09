#!/usr/bin/env python3
"""pipeweave's GPU check, from a bundle made by `tools/dev gpu-bundle` (this file is
the bundle's `run`).

  run [RESULTS_DIR]        default: gpu-results-<UTC time> in the current directory

In this order, each under its own timeout and all within PIPEWEAVE_RUN_BUDGET_S
seconds (default 400; a fallback build's compile gets at most
PIPEWEAVE_RUN_BUILD_S of them, default 240):
  libraries    finds cuBLAS, the CUDA runtime and NCCL (toolkit, system, pip's
               site-packages); prints the GPU and the driver
  start        every carried executable resolves its libraries and answers --help;
               if one does not, builds them here from the carried sources (meson,
               ninja and nvcc of this machine, all cores) and uses those
  suite        every test of the cuda suite, its result and duration
  train_mlp    the seed example with 4 pipeline devices on one GPU (virtual
               transport) in fp32, tf32 and bf16, checked against sequential
               training on the GPU
  memcheck     compute-sanitizer --tool memcheck on a small bf16 run
  bench        bench/pipeline_gpu on a few shapes in bf16 and fp32, with the
               cuBLAS-only rows
  overlap      bench/pipeline_gpu --overlap: one device with two chunks and small
               micro-batches, each shape plain and overlapped (a pair's backward
               on the device's second stream)
  mpi          train_mlp_mpi under mpirun, one rank per GPU, only where mpirun is
  racecheck    compute-sanitizer --tool racecheck on a small run, if time is left
Without a GPU every GPU check reports SKIP.

Writes RESULTS_DIR/summary.txt (one line per check: PASS, FAIL or SKIP and its
figures), RESULTS_DIR/bench.txt and overlap.txt (the benchmark tables) and RESULTS_DIR/logs.tar.gz
(every command's output, the benchmark's JSON, the measured traces). Exits 0 when
no check failed.
"""
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

BUNDLE = os.path.dirname(os.path.realpath(__file__))
BUDGET_S = float(os.environ.get("PIPEWEAVE_RUN_BUDGET_S", "400"))
BUILD_S = float(os.environ.get("PIPEWEAVE_RUN_BUILD_S", "240"))  # the fallback build's compile, at most
NO_GPU = "no GPU visible"


class Runner:
    def __init__(self, results):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + BUDGET_S
        self.results = os.path.abspath(results)
        os.makedirs(self.results, exist_ok=True)
        open(os.path.join(self.results, "summary.txt"), "w").close()
        self.work = tempfile.mkdtemp(prefix="pipeweave-gpu-")
        self.logs = os.path.join(self.work, "logs")
        os.makedirs(os.path.join(self.logs, "traces"))
        with open(os.path.join(BUNDLE, "share", "bundle.json")) as f:
            self.manifest = json.load(f)
        self.header, self.lines, self.failures = [], [], 0
        self.env = dict(os.environ)
        self.build = os.path.join(self.work, "build")  # the build tree in use
        self.src = os.path.join(self.work, "src")
        self.gpu = False
        self.smi_gpus = 0  # GPUs nvidia-smi lists

    # --- output -----------------------------------------------------------------
    # summary.txt grows line by line, so that a run stopped from outside still
    # leaves what it found; finish() writes it whole.
    def emit(self, line):
        print(line, flush=True)
        with open(os.path.join(self.results, "summary.txt"), "a") as f:
            f.write(line + "\n")

    def note(self, text):
        self.header.append("# " + text)
        self.emit("# " + text)

    def result(self, status, name, text):
        line = f"{status} {name}: {text}"
        self.lines.append(line)
        self.failures += status == "FAIL"
        self.emit(line)

    def left(self):
        return self.deadline - time.monotonic()

    def timeout(self, cap, reserve=0.0):
        """The timeout of a check: its cap, or what the budget leaves after `reserve`
        seconds kept for the checks after it."""
        return min(cap, self.left() - reserve)

    def run(self, cmd, timeout, log, cwd=None, env=None, stdout_file=None):
        """Runs cmd; returns (exit status or None on timeout, seconds, output)."""
        start = time.monotonic()
        with open(os.path.join(self.logs, log), "w") as out:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            try:
                p = subprocess.Popen(cmd, cwd=cwd, env=env or self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                out.write(f"cannot start: {e}\n")
                return 127, 0.0, f"cannot start: {e}"
            try:
                text, _ = p.communicate(timeout=max(timeout, 1))
                rc = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                text, _ = p.communicate()
                rc = None
            text = text.decode(errors="replace")
            out.write(text)
            out.write(f"\n[exit {rc}, {time.monotonic() - start:.1f} s]\n")
        if stdout_file:
            with open(stdout_file, "w") as f:
                f.write(text)
        return rc, time.monotonic() - start, text

    def exe(self, rel):
        return os.path.join(self.build, rel)

    # --- libraries, GPU, executables ---------------------------------------------
    def libraries(self):
        lib = os.path.join(self.work, "lib")
        os.makedirs(lib)
        for name in os.listdir(os.path.join(BUNDLE, "lib")):
            if name.endswith(".xz"):
                with lzma.open(os.path.join(BUNDLE, "lib", name)) as f, open(os.path.join(lib, name[:-3]), "wb") as g:
                    shutil.copyfileobj(f, g)
        wanted = self.manifest["toolkit_libs"]
        sites = [a for d in site_packages() for a in ("--site-packages", d)]
        p = subprocess.run([sys.executable, os.path.join(BUNDLE, "share", "find_cuda_libs.py"), "runtime", *wanted,
                            *sites], capture_output=True, text=True)
        dirs, found, missing = [], [], []
        links = os.path.join(self.work, "linklib")  # unversioned names, for programs linked here (nvcc -lnccl)
        os.makedirs(links)
        for row in p.stdout.splitlines():
            name, where_dir, where = (row.split("\t") + ["", ""])[:3]
            if not where_dir:
                missing.append(name)
                continue
            found.append(f"{name} from {where} ({where_dir})")
            if where_dir not in dirs:
                dirs.append(where_dir)
            plain = re.sub(r"\.so\.\d+$", ".so", name)
            if not os.path.exists(os.path.join(links, plain)):
                os.symlink(os.path.join(where_dir, name), os.path.join(links, plain))
        join = lambda parts: ":".join(x for x in parts if x)
        self.env["LD_LIBRARY_PATH"] = join([lib, os.path.join(BUNDLE, "lib"), *dirs, os.environ.get("LD_LIBRARY_PATH", "")])
        self.env["LIBRARY_PATH"] = join([links, *dirs, os.environ.get("LIBRARY_PATH", "")])
        for f in found:
            self.note("library " + f)
        if missing:
            self.result("FAIL", "libraries", f"not found: {', '.join(missing)} (searched the CUDA toolkit, the system "
                        "directories and Python's site-packages; set CUDA_HOME or NCCL_HOME)")
        else:
            self.result("PASS", "libraries", f"{len(found)} of {len(wanted)} found: " +
                        "; ".join(f.split(" (")[0] for f in found))

    def describe_machine(self):
        m = self.manifest
        self.note(f"bundle {m['commit']}, made {m['made']}, {m['nvcc']}, GPU architectures {m['gpu_arch']}; "
                  f"needs {', '.join(sorted(m['needs_at_least'].values()))} or newer")
        self.note(f"host {os.uname().nodename}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
        smi = shutil.which("nvidia-smi") or next(
            (p for p in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi") if os.path.exists(p)), None)
        if smi:
            q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
            gpus = q.stdout.strip().splitlines() if q.returncode == 0 else []
            self.smi_gpus = len(gpus)
            for line in gpus or [(q.stdout.strip() or q.stderr.strip() or "no answer").splitlines()[0]]:
                self.note("GPU (name, driver, memory): " + line.strip() if gpus else "GPU: nvidia-smi says " + line)
        else:
            self.note("GPU: nvidia-smi not found")
        nvcc = self.nvcc()
        if nvcc:
            v = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
            self.note(f"nvcc {nvcc}: {release(v)}")
        else:
            self.note("nvcc: not found")

    def nvcc(self):
        for d in [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]:
            if d and os.path.isfile(os.path.join(d, "bin", "nvcc")):
                return os.path.join(d, "bin", "nvcc")
        return shutil.which("nvcc")

    def link_build_tree(self):
        """The carried executables at their places in a build tree of the work directory."""
        for rel in self.manifest["executables"]:
            os.makedirs(os.path.dirname(self.exe(rel)), exist_ok=True)
            os.symlink(os.path.join(BUNDLE, "build", rel), self.exe(rel))

    def missing_libraries(self, path):
        out = subprocess.run(["ldd", path], capture_output=True, text=True, env=self.env).stdout
        return re.findall(r"^\s*(\S+) => not found", out, re.M)

    def mpi_ready(self, rel):
        """Why an MPI executable cannot run here, or None."""
        if not shutil.which("mpirun"):
            return "mpirun not found"
        missing = self.missing_libraries(self.exe(rel))
        return f"needs {', '.join(missing)} (this machine's MPI differs)" if missing else None

    def start(self):
        broken = []
        mpi = set(self.manifest["mpi_executables"])
        for rel in self.manifest["executables"]:
            if rel in mpi:
                continue  # they need the machine's MPI: checked where they run
            missing = self.missing_libraries(self.exe(rel))
            if missing:
                broken.append(f"{rel} ({', '.join(missing)} not found)")
                continue
            rc, _, text = self.run([self.exe(rel), "--help"], self.timeout(30), "start-" + os.path.basename(rel) + ".log")
            if rc not in (0, 77):  # 77: a GPU test program without a GPU
                broken.append(f"{rel} (--help: exit {rc}: {last_line(text)})")
        n = len(self.manifest["executables"]) - len(mpi)
        if not broken:
            self.result("PASS", "start", f"{n} of {n} carried executables start (ldd, --help); "
                        f"{len(mpi)} MPI ones are checked where they run")
            return
        self.result("FAIL", "start", f"{len(broken)} of {n} carried executables do not start: " + "; ".join(broken) +
                    "; building them here instead")
        self.fallback_build()

    def fallback_build(self):
        start = time.monotonic()
        lib = os.path.join(self.work, "lib")
        link = os.path.join(self.src, "subprojects", "openblas", "lib")
        os.makedirs(link, exist_ok=True)
        for d in (lib, os.path.join(BUNDLE, "lib")):
            if os.path.exists(os.path.join(d, "libopenblas.so.0")):
                os.symlink(os.path.join(d, "libopenblas.so.0"), os.path.join(link, "libopenblas.so"))
                break
        meson = [shutil.which("meson")] if shutil.which("meson") else [sys.executable, "-m", "mesonbuild.mesonmain"]
        env = dict(self.env)
        if not shutil.which("ninja"):
            try:
                import ninja  # pip's ninja
                env["NINJA"] = os.path.join(ninja.BIN_DIR, "ninja")
            except ImportError:
                pass
        nvcc = self.nvcc()
        if nvcc:
            env["PATH"] = os.path.dirname(nvcc) + ":" + env.get("PATH", "/usr/bin:/bin")
        build = os.path.join(self.work, "fallback")
        mpi = "auto" if shutil.which("mpicxx") else "disabled"
        arch = ",".join(self.manifest["gpu_arch"] or ["90"])
        rc, secs, text = self.run(meson + ["setup", build, self.src, "-Dcuda=enabled", f"-Dgpu_arch={arch}",
                                           f"-Dmpi={mpi}", "--wrap-mode=nodownload",
                                           "--force-fallback-for=catch2,CLI11,openblas"],
                                  self.timeout(60, 150), "fallback-configure.log", env=env)
        targets = sorted(set(self.manifest["executables"].values()))
        if mpi == "disabled":
            targets = [t for rel, t in self.manifest["executables"].items() if rel not in self.manifest["mpi_executables"]]
        if rc == 0:
            rc, secs, text = self.run(meson + ["compile", "-C", build, "-j", str(os.cpu_count() or 4), *targets],
                                      self.timeout(BUILD_S, 120), "fallback-build.log", env=env)
        took = time.monotonic() - start
        if rc != 0:
            self.result("FAIL", "fallback build", f"{'timed out' if rc is None else 'exit ' + str(rc)} after "
                        f"{took:.0f} s: {last_line(text)} (logs fallback-*.log)")
            return
        self.build = build
        self.result("PASS", "fallback build", f"{len(targets)} targets built here in {took:.0f} s "
                    f"({os.cpu_count()} jobs, MPI {mpi}); the checks below use them")

    def probe_gpu(self):
        rc, _, text = self.run([self.exe("tests/test_cuda_gpu"), "--list-test-names-only"], self.timeout(30),
                               "probe-gpu.log")
        self.gpu = rc == 0
        smi_sees = self.smi_gpus > 0
        if not self.gpu and smi_sees and rc != 77:
            self.result("FAIL", "gpu", f"nvidia-smi lists a GPU but the GPU test program exits {rc}: {last_line(text)}")
        elif not self.gpu and smi_sees:
            self.result("FAIL", "gpu", "nvidia-smi lists a GPU but CUDA sees none (driver or container setup)")

    # --- checks -------------------------------------------------------------------
    def substitute(self, arg):
        return (arg.replace("@BUILD@", self.build).replace("@SRC@", self.src)
                .replace("@PYTHON@", sys.executable).replace("@NVCC@", self.nvcc() or "nvcc"))

    def suite(self, reserve):
        tests = self.manifest["tests"]
        end = time.monotonic() + self.timeout(240, reserve)
        counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        start = time.monotonic()
        for t in tests:
            name = "suite " + t["name"]
            why = None
            if t["mpi"]:
                mpi_exes = [e for e in self.manifest["mpi_executables"] if any(e in a for a in t["cmd"])]
                why = next((w for w in (self.mpi_ready(e) for e in mpi_exes) if w), None)
            if why is None and any("@NVCC@" in a for a in t["cmd"]) and not self.nvcc():
                why = "nvcc not found"
            limit = min(t["timeout"], end - time.monotonic())
            if why is None and limit < 5:
                why = "no time left in the budget"
            if why:
                counts["SKIP"] += 1
                self.result("SKIP", name, why)
                continue
            cmd = [self.substitute(a) for a in t["cmd"] if a != ""]
            env = dict(self.env, **{k: self.substitute(v) for k, v in t["env"].items()})
            rc, secs, text = self.run(cmd, limit, "suite-" + slug(t["name"]) + ".log", cwd=self.build, env=env)
            if rc == 0:
                status, what = "PASS", f"{secs:.1f} s"
            elif rc == 77:
                status, what = "SKIP", f"{last_line(text)} ({secs:.1f} s)"
            elif rc is None:
                status, what = "FAIL", f"timed out after {secs:.0f} s"
            else:
                status, what = "FAIL", f"exit {rc} after {secs:.1f} s: {last_line(text)}"
            counts[status] += 1
            self.result(status, name, what)
        ran = counts["PASS"] + counts["FAIL"]
        text = (f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped of {len(tests)} "
                f"({time.monotonic() - start:.0f} s)")
        if ran == 0:
            self.result("FAIL", "suite", text + ": no test ran")
        elif self.gpu and any(l.startswith("SKIP suite cuda_gpu") for l in self.lines):
            self.result("FAIL", "suite", text + ": the GPU tests skipped although a GPU is visible")
        else:
            self.result("FAIL" if counts["FAIL"] else "PASS", "suite", text)

    def train_mlp(self, math, reserve):
        name = f"train_mlp {math}"
        if not self.gpu:
            return self.result("SKIP", name, NO_GPU)
        limit = self.timeout(45, reserve)
        if limit < 10:
            return self.result("SKIP", name, "no time left in the budget")
        trace = os.path.join(self.logs, "traces", f"train_mlp_seed_{math}.svg")
        rc, secs, text = self.run([self.exe("examples/train_mlp"), "--backend", "cuda", "--transport", "virtual",
                                   "--devices", "4", "--math", math, "--trace", trace], limit,
                                  f"train_mlp-{math}.log")
        loss = re.search(r"^loss (\S+) -> (\S+) over (\d+) steps", text, re.M)
        times = re.search(r"^step time: pipelined (\S+) ms, sequential (\S+) ms", text, re.M)
        diff = re.search(r"max \|pipelined - sequential\| over [\d,]+ parameters = ([^:]+): (\w+)", text)
        figures = "; ".join(x for x in [
            f"loss {loss.group(1)} -> {loss.group(2)} in {loss.group(3)} steps" if loss else "",
            f"step {times.group(1)} ms pipelined, {times.group(2)} ms sequential" if times else "",
            f"against sequential training on the GPU: {diff.group(1).strip()}" if diff else "",
            f"{secs:.1f} s"] if x)
        if rc == 0 and diff and diff.group(2) == "ok":
            self.result("PASS", name, "seed example, 4 devices on 1 GPU (virtual); " + figures)
        else:
            why = "timed out" if rc is None else f"exit {rc}"
            self.result("FAIL", name, f"{why}; {figures}; {last_line(text)}")

    def sanitizer(self, tool, math, reserve, cap):
        name = tool
        if not self.gpu:
            return self.result("SKIP", name, NO_GPU)
        cs = shutil.which("compute-sanitizer")
        nvcc = self.nvcc()
        if not cs and nvcc and os.path.exists(os.path.join(os.path.dirname(nvcc), "compute-sanitizer")):
            cs = os.path.join(os.path.dirname(nvcc), "compute-sanitizer")
        if not cs:
            return self.result("SKIP", name, "compute-sanitizer not found")
        limit = self.timeout(cap, reserve)
        if limit < 20:
            return self.result("SKIP", name, "no time left in the budget")
        rc, secs, text = self.run([cs, "--tool", tool, "--error-exitcode", "99", self.exe("examples/train_mlp"),
                                   "--backend", "cuda", "--transport", "virtual", "--devices", "2", "--layers", "4",
                                   "--hidden", "32", "--batch", "32", "--micro-batches", "4", "--steps", "2",
                                   "--math", math], limit, f"{tool}.log")
        summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
        what = f"train_mlp {math}, 2 devices on 1 GPU, 2 steps: {summary[-1] if summary else 'no summary'} ({secs:.0f} s)"
        if rc is None:
            self.result("FAIL", name, f"timed out after {secs:.0f} s")
        else:
            self.result("PASS" if rc == 0 else "FAIL", name, what if rc == 0 else f"exit {rc}; {what}")

    def bench(self, reserve):
        name = "bench"
        if not self.gpu:
            return self.result("SKIP", name, NO_GPU)
        limit = self.timeout(150, reserve)
        if limit < 30:
            return self.result("SKIP", name, "no time left in the budget")
        json_file = os.path.join(self.logs, "bench.json")
        rc, secs, text = self.run([self.exe("bench/pipeline_gpu"), "--schedules", "1f1b,interleaved", "--devices", "4",
                                   "--chunks", "2", "--micro-batches", "8", "--layers", "16", "--hidden", "2048,4096",
                                   "--batch", "4096", "--dtypes", "bf16,fp32", "--transport", "virtual",
                                   "--warmup", "2", "--iters", "5", "--trace-dir", os.path.join(self.logs, "traces"),
                                   "--json-file", json_file], limit, "bench.log")
        table = [l for l in text.splitlines() if not l.startswith("pipeline_gpu: ")]
        with open(os.path.join(self.results, "bench.txt"), "w") as f:
            f.write("\n".join(table) + "\n")
        figures = []
        try:
            with open(json_file) as f:
                rows = json.load(f)["rows"]
            for dtype in ("bf16", "fp32"):
                pipe = [r for r in rows if r["dtype"] == dtype and r["schedule"] != "cublas"]
                alone = [r for r in rows if r["dtype"] == dtype and r["schedule"] == "cublas"]
                if pipe:
                    best = max(pipe, key=lambda r: r["tflops"])
                    peak = f", {best['peak_percent']:.1f}% of peak" if best["peak_percent"] is not None else ""
                    base = max(alone, key=lambda r: r["tflops"])["tflops"] if alone else float("nan")
                    figures.append(f"{dtype} best {best['tflops']:.1f} TFLOP/s ({best['schedule']} hidden "
                                   f"{best['hidden']}{peak}; cuBLAS alone {base:.1f})")
            figures.append(f"#wrong {sum(r['wrong'] for r in rows if r['wrong'] is not None)}")  # cublas rows: null
        except (OSError, ValueError, KeyError, TypeError) as e:
            figures.append(f"no JSON ({e})")
        what = "; ".join(figures) + f" ({secs:.0f} s; table in bench.txt)"
        if rc == 0:
            self.result("PASS", name, what)
        else:
            self.result("FAIL", name, ("timed out; " if rc is None else f"exit {rc}; ") + what)

    def overlap(self, reserve):
        name = "overlap"
        if not self.gpu:
            return self.result("SKIP", name, NO_GPU)
        limit = self.timeout(90, reserve)
        if limit < 20:
            return self.result("SKIP", name, "no time left in the budget")
        json_file = os.path.join(self.logs, "overlap.json")
        rc, secs, text = self.run([self.exe("bench/pipeline_gpu"), "--schedules", "interleaved,1f1b", "--devices", "1",
                                   "--chunks", "2", "--micro-batches", "8,32", "--layers", "8", "--hidden", "1024",
                                   "--batch", "1024", "--dtypes", "bf16,fp32", "--overlap", "--warmup", "2",
                                   "--iters", "5", "--json-file", json_file], limit, "overlap.log")
        table = [l for l in text.splitlines() if not l.startswith("pipeline_gpu: ")]
        with open(os.path.join(self.results, "overlap.txt"), "w") as f:
            f.write("\n".join(table) + "\n")
        figures = []
        try:
            with open(json_file) as f:
                rows = json.load(f)["rows"]
            for r in rows:
                if r["schedule"].endswith("+overlap"):
                    figures.append(f"{r['schedule']} M={r['micro_batches']} {r['dtype']} {r['vs_plain']:.2f}x")
            figures.append(f"#wrong {sum(r['wrong'] for r in rows if r['wrong'] is not None)}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            figures.append(f"no JSON ({e})")
        what = "P = 1, V = 2, overlapped step vs plain: " + "; ".join(figures) + f" ({secs:.0f} s; table in overlap.txt)"
        if rc == 0:
            self.result("PASS", name, what)
        else:
            self.result("FAIL", name, ("timed out; " if rc is None else f"exit {rc}; ") + what)

    def mpi(self, reserve):
        name = "mpi"
        rel = "examples/train_mlp_mpi"
        if rel not in self.manifest["executables"]:
            return self.result("SKIP", name, "the bundle has no train_mlp_mpi (MPI was not found where it was made)")
        why = self.mpi_ready(rel)
        if why:
            return self.result("SKIP", name, why)
        if not self.gpu:
            return self.result("SKIP", name, NO_GPU)
        limit = self.timeout(60, reserve)
        if limit < 15:
            return self.result("SKIP", name, "no time left in the budget")
        gpus = max(self.smi_gpus, 1)
        env = dict(self.env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        rc, secs, text = self.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(gpus), self.exe(rel),
                                   "--steps", "20"], limit, "mpi.log", env=env)
        check = re.search(r"max \|pipelined - sequential\| = .*", text)
        what = f"{gpus} ranks (one per GPU), NCCL across processes: {check.group(0) if check else last_line(text)} ({secs:.0f} s)"
        self.result("PASS" if rc == 0 else "FAIL", name, what if rc is not None else "timed out; " + what)

    # --- the whole run --------------------------------------------------------------
    def main(self):
        self.describe_machine()
        with tarfile.open(os.path.join(BUNDLE, "share", "src.tar.xz")) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(self.work, filter="data")
            else:
                tar.extractall(self.work)
        self.libraries()
        self.link_build_tree()
        self.start()
        self.probe_gpu()
        # Seconds kept for the mandatory checks that follow each one.
        floors = {"train": 3 * 20, "memcheck": 30, "bench": 60, "overlap": 30, "mpi": 20}
        self.suite(reserve=sum(floors.values()))
        for i, math in enumerate(("fp32", "tf32", "bf16")):
            self.train_mlp(math, reserve=floors["memcheck"] + floors["bench"] + floors["overlap"] + floors["mpi"] +
                           20 * (2 - i))
        self.sanitizer("memcheck", "bf16", reserve=floors["bench"] + floors["overlap"] + floors["mpi"], cap=90)
        self.bench(reserve=floors["overlap"] + floors["mpi"])
        self.overlap(reserve=floors["mpi"])
        self.mpi(reserve=0)
        self.sanitizer("racecheck", "fp32", reserve=0, cap=90)
        self.finish()
        return 1 if self.failures else 0

    def finish(self):
        took = time.monotonic() - self.t0
        summary = self.header + self.lines + [
            f"# {len(self.lines)} checks, {self.failures} failed; {took:.0f} s of the {BUDGET_S:.0f} s budget"]
        with open(os.path.join(self.results, "summary.txt"), "w") as f:
            f.write("\n".join(summary) + "\n")
        shutil.copyfile(os.path.join(self.results, "summary.txt"), os.path.join(self.logs, "summary.txt"))
        with tarfile.open(os.path.join(self.results, "logs.tar.gz"), "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
        print(summary[-1])
        print(f"# results in {self.results}: {', '.join(sorted(os.listdir(self.results)))}")
        if not os.environ.get("PIPEWEAVE_KEEP_WORK"):
            shutil.rmtree(self.work, ignore_errors=True)


def site_packages():
    """Python's site-packages directories here: this interpreter's, those of every
    python3 on PATH, and the usual places of virtual environments and of the
    system's Python (pip's NVIDIA wheels live in one of them)."""
    import glob
    import site
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    for d in os.environ.get("PATH", "").split(":"):
        python = os.path.join(d, "python3")
        if d and os.access(python, os.X_OK) and os.path.realpath(python) != os.path.realpath(sys.executable):
            out = subprocess.run([python, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                                 capture_output=True, text=True).stdout
            dirs += out.split()
    for pattern in ("/opt/*/.venv/lib/python3*/site-packages", "/opt/*/lib/python3*/site-packages",
                    "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages"):
        dirs += sorted(glob.glob(pattern))
    out = []
    for d in dirs:
        if os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def release(nvcc_version):
    """'release 13.0, V13.0.88' from nvcc --version."""
    m = re.search(r"release .*", nvcc_version)
    return m.group(0) if m else "unknown version"


def last_line(text):
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else "no output"


def slug(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def main():
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    results = sys.argv[1] if len(sys.argv) == 2 else "gpu-results-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Runner(results).main()


if __name__ == "__main__":
    sys.exit(main())
