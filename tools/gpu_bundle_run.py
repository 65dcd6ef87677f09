#!/usr/bin/env python3
"""pipeweave's GPU check, from a bundle made by `tools/dev gpu-bundle` (this file is
the bundle's `run`).

  run [RESULTS_DIR]        default: gpu-results-<UTC time> in the current directory

The steps, in priority order, each with a budget of seconds (PLAN below; 295 s in
all, PIPEWEAVE_RUN_BUDGET_S scales them to another total). A step may run until
the plan's clock reaches the sum of the budgets up to its own, so the time an
earlier step leaves unused goes to the next; a step whose time is gone is
reported `SKIP (no time)`, never dropped:
  setup        the GPU (nvidia-smi), cuBLAS, the CUDA runtime and NCCL (toolkit,
               system, pip's site-packages) with their versions; every carried
               executable resolves its libraries and answers --help (if one does
               not, it is built here from the carried sources, with meson, ninja and
               nvcc of this machine: that build's time, at most
               PIPEWEAVE_RUN_BUILD_S = 240 s, comes on top of the plan)
  probe        the GPU test program lists its tests (Catch2 2.13 exits with the
               number listed; 77 means no GPU)
  suite        every test of the cuda suite, its result and duration
  train_mlp    the seed example with 4 pipeline devices on one GPU (virtual
               transport) in fp32, tf32 and bf16, checked against sequential
               training on the GPU; with two GPUs or more, also over NCCL; and
               2 data-parallel replicas of a 2-device pipeline on one GPU, with
               their gradient reductions' exposed and hidden time
  bench        bench/pipeline_gpu in bf16 at hidden 2048 and 4096, with the
               cuBLAS-only rows: TFLOP/s from device time and wall clock, the
               share of the GPU's dense peak, pipelined against sequential
  overlap      bench/pipeline_gpu --overlap --offload: one device with two chunks and
               small micro-batches, each shape plain, overlapped and with every
               stage's stashes offloaded (the copy stream beside the kernels)
  bench replicas  bench/pipeline_gpu --replicas 2: 2 data-parallel replicas of a
               2-device pipeline on one GPU, the gradient reductions' exposed time
               and share beside compute, measured against simulated
  mpi          train_mlp_mpi under mpirun, one rank per GPU, only where mpirun is;
               then one rank more than GPUs, which every rank must refuse, naming the GPU
  memcheck     compute-sanitizer --tool memcheck on a small bf16 run
  racecheck    compute-sanitizer --tool racecheck on a small fp32 run
Without a GPU every GPU check reports SKIP.

Writes RESULTS_DIR/summary.txt (one line per check: PASS, FAIL or SKIP, its
figures, and its seconds of its budget), RESULTS_DIR/bench.txt and overlap.txt
(the benchmark tables) and RESULTS_DIR/logs.tar.gz (every command's output, the
benchmark's JSON, the measured traces). Exits 0 when no check failed.
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
BUILD_S = float(os.environ.get("PIPEWEAVE_RUN_BUILD_S", "240"))  # the fallback build's compile, at most
NO_GPU = "no GPU visible"
NO_TIME = "SKIP (no time)"

# The time plan: (step, budget in seconds, the least time the step can use). The
# whole run must fit in 300 s on the GPU machine, so that its start and a second
# try fit in the 15 minutes of GPU time one check gets.
PLAN = [
    ("setup", 20, 0),  # always runs: nothing else can without it
    ("probe", 10, 0),  # always runs: it decides what the rest does
    ("suite", 70, 10),
    ("train_mlp fp32", 15, 8),
    ("train_mlp tf32", 15, 8),
    ("train_mlp bf16", 15, 8),
    ("train_mlp nccl", 10, 8),
    ("train_mlp replicas", 10, 8),
    ("bench", 40, 15),
    ("overlap", 25, 10),
    ("bench replicas", 15, 8),
    ("mpi", 15, 8),
    ("memcheck", 20, 10),
    ("racecheck", 20, 10),
]
PLAN_S = sum(b for _, b, _ in PLAN)
TOTAL_S = float(os.environ.get("PIPEWEAVE_RUN_BUDGET_S", PLAN_S))

class Runner:
    def __init__(self, results):
        self.t0 = time.monotonic()
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
        self.lib_paths = {}  # soname: the file found for it
        # The plan's clock: step i may run until t0 + shift + the budgets of steps 0..i.
        scale = TOTAL_S / PLAN_S
        self.budget, self.floor, self.until, total = {}, {}, {}, 0.0
        for name, budget, floor in PLAN:
            total += budget * scale
            self.budget[name], self.floor[name], self.until[name] = budget * scale, floor * scale, total
        self.shift = 0.0  # a fallback build's time, which the plan does not hold
        self.step_name, self.step_start, self.step_allowed = None, 0.0, 0.0

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
        if name == self.step_name and status != "SKIP":  # a step that ran: its time against its budget
            took, budget = time.monotonic() - self.step_start, self.budget[name]
            text += (f" [{took:.0f} s of its {budget:.0f} s]" if self.step_allowed < budget + 1 else
                     f" [{took:.0f} s; budget {budget:.0f} s, {self.step_allowed:.0f} s with what earlier steps left]")
        line = f"{status} {name}: {text}"
        self.lines.append(line)
        self.failures += status == "FAIL"
        self.emit(line)

    def left(self, name):
        """Seconds step `name` may take: until the plan's clock reaches its end, and at most twice its
        budget, so that a step that hangs leaves the later ones their time."""
        return min(self.t0 + self.shift + self.until[name] - time.monotonic(), 2 * self.budget[name])

    def step(self, name, body, needs_gpu=True):
        """Runs body(seconds) for step `name` within its time, or reports why it cannot run."""
        self.step_name, self.step_start = name, time.monotonic()
        left = self.step_allowed = self.left(name)
        if needs_gpu and not self.gpu:
            self.result("SKIP", name, NO_GPU)
        elif left < self.floor[name]:
            self.result(NO_TIME, name, f"{max(left, 0):.0f} s of the plan left, the step needs at least "
                        f"{self.floor[name]:.0f} s")
        else:
            body(left)
        self.step_name = None

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
            self.lib_paths[name] = os.path.join(where_dir, name)
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
        versions = self.library_versions()
        if missing:
            self.result("FAIL", "libraries", f"not found: {', '.join(missing)} (searched the CUDA toolkit, the system "
                        "directories and Python's site-packages; set CUDA_HOME or NCCL_HOME); " + versions)
        else:
            self.result("PASS", "libraries", versions + f"; {len(found)} of {len(wanted)} found: " +
                        "; ".join(f.split(" (")[0] for f in found))

    def library_versions(self):
        """'CUDA runtime 13.0, driver for CUDA 13.0, cuBLAS 13.0.2, NCCL 2.27.7', as the libraries
        found say of themselves (asked in a process of its own: a broken library cannot stop the run)."""
        rc, _, text = self.run([sys.executable, os.path.join(BUNDLE, "run"), "--library-versions",
                                json.dumps(self.lib_paths)], 20, "library-versions.log")
        try:
            return json.loads(text.strip().splitlines()[-1])["text"] if rc == 0 else f"versions unknown ({last_line(text)})"
        except (ValueError, KeyError, IndexError):
            return f"versions unknown ({last_line(text)})"

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
            rc, _, text = self.run([self.exe(rel), "--help"], 30, "start-" + os.path.basename(rel) + ".log")
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
        # The libraries of the header subprojects: the bundle's copy, else the machine's.
        for project, soname, linked in (("openblas", "libopenblas.so.0", "libopenblas.so"),
                                         ("zlib", "libz.so.1", "libz.so")):
            link = os.path.join(self.src, "subprojects", project, "lib")
            os.makedirs(link, exist_ok=True)
            for d in (lib, os.path.join(BUNDLE, "lib"), "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
                if os.path.exists(os.path.join(d, soname)):
                    os.symlink(os.path.join(d, soname), os.path.join(link, linked))
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
                                           "--force-fallback-for=catch2,CLI11,openblas,nlohmann_json,zlib"],
                                  60, "fallback-configure.log", env=env)
        targets = sorted(set(self.manifest["executables"].values()))
        if mpi == "disabled":
            targets = [t for rel, t in self.manifest["executables"].items() if rel not in self.manifest["mpi_executables"]]
        if rc == 0:
            rc, secs, text = self.run(meson + ["compile", "-C", build, "-j", str(os.cpu_count() or 4), *targets],
                                      BUILD_S, "fallback-build.log", env=env)
        took = time.monotonic() - start
        self.shift += took
        if rc != 0:
            self.result("FAIL", "fallback build", f"{'timed out' if rc is None else 'exit ' + str(rc)} after "
                        f"{took:.0f} s: {last_line(text)} (logs fallback-*.log)")
            return
        self.build = build
        self.result("PASS", "fallback build", f"{len(targets)} targets built here in {took:.0f} s "
                    f"({os.cpu_count()} jobs, MPI {mpi}); the checks below use them, and the plan moves on by that time")

    def probe_gpu(self, limit):
        """Whether the GPU test program sees a GPU. It exits 77 when it does not; asked to list its
        tests, Catch2 2.13 exits with the number it listed (at most 255), so 15 is a GPU with 15 tests."""
        rc, secs, text = self.run([self.exe("tests/test_cuda_gpu"), "--list-test-names-only"], min(limit, 30),
                                  "probe-gpu.log")
        listed = [l for l in text.splitlines() if l.strip()]
        self.gpu = rc is not None and rc != 77 and len(listed) > 0 and rc in (0, min(len(listed), 255))
        smi = f"nvidia-smi lists {self.smi_gpus} GPU{'s' if self.smi_gpus != 1 else ''}"
        if self.gpu:
            self.result("PASS", "probe", f"the GPU test program lists {len(listed)} test cases (exit {rc}); {smi}")
        elif rc == 77:
            status = "FAIL" if self.smi_gpus else "PASS"
            self.result(status, "probe", f"{NO_GPU} to CUDA; {smi}" +
                        (" (driver or container setup)" if self.smi_gpus else ""))
        elif rc is None:
            self.result("FAIL", "probe", f"the GPU test program's list timed out after {secs:.0f} s; {smi}")
        else:
            self.result("FAIL", "probe", f"the GPU test program's list exits {rc} with {len(listed)} lines, neither 77 "
                        f"(no GPU) nor the number listed: {last_line(text)}; {smi}")

    # --- checks -------------------------------------------------------------------
    def substitute(self, arg):
        return (arg.replace("@BUILD@", self.build).replace("@SRC@", self.src)
                .replace("@PYTHON@", sys.executable).replace("@NVCC@", self.nvcc() or "nvcc"))

    def suite(self, limit):
        tests = self.manifest["tests"]
        end = time.monotonic() + limit
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
            if why:
                counts["SKIP"] += 1
                self.result("SKIP", name, why)
                continue
            left = end - time.monotonic()
            if left < 5:
                counts["SKIP"] += 1
                self.result(NO_TIME, name, f"{max(left, 0):.0f} s of the suite's budget left")
                continue
            limit = min(t["timeout"], left)
            cmd = [self.substitute(a) for a in t["cmd"] if a != ""]
            env = dict(self.env, **{k: self.substitute(v) for k, v in t["env"].items()})
            rc, secs, text = self.run(cmd, limit, "suite-" + slug(t["name"]) + ".log", cwd=self.build, env=env)
            if rc == 0:
                status, what = "PASS", f"{secs:.1f} s"
            elif rc == 77:
                status, what = "SKIP", f"{last_line(text)} ({secs:.1f} s)"
            elif rc is None and limit < t["timeout"]:
                status, what = NO_TIME, f"stopped at the end of the suite's budget after {secs:.0f} s"
            elif rc is None:
                status, what = "FAIL", f"timed out after {secs:.0f} s"
            else:
                status, what = "FAIL", f"exit {rc} after {secs:.1f} s: {last_line(text)}"
            counts[status.split()[0]] += 1
            self.result(status, name, what)
        ran = counts["PASS"] + counts["FAIL"]
        text = (f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped of {len(tests)} "
                f"({time.monotonic() - start:.0f} s)")
        if ran == 0:
            self.result("FAIL", "suite", text + ": no test ran")
        elif self.gpu and any(l.startswith("SKIP suite cuda_gpu:") for l in self.lines):
            self.result("FAIL", "suite", text + ": the GPU tests skipped although a GPU is visible")
        else:
            self.result("FAIL" if counts["FAIL"] else "PASS", "suite", text)

    def train_mlp(self, name, transport, devices, math, limit, replicas=1, dtype="fp32"):
        trace = os.path.join(self.logs, "traces", f"train_mlp_seed_{math}_{transport}"
                             + (f"_replicas{replicas}" if replicas > 1 else "") + ".svg")
        rc, secs, text = self.run([self.exe("examples/train_mlp"), "--backend", "cuda", "--transport", transport,
                                   "--devices", str(devices), "--math", math, "--dtype", dtype, "--trace", trace]
                                  + (["--replicas", str(replicas)] if replicas > 1 else []), limit,
                                  slug(name) + ".log")
        loss = re.search(r"^loss (\S+) -> (\S+) over (\d+) steps", text, re.M)
        times = re.search(r"^step time: pipelined (\S+) ms, sequential (\S+) ms", text, re.M)
        diff = re.search(r"max \|pipelined - sequential\| over [\d,]+ parameters = ([^:]+): (\w+)", text)
        reduced = re.search(r"^gradient reductions \(replica 0's devices\): (\S+) ms in all, exposed after the last "
                            r"compute (\S+) ms .*exposed (\S+) ms; beside compute: (\d+)% measured, (\d+)% simulated",
                            text, re.M)
        figures = "; ".join(x for x in [
            f"pipelined {times.group(1)} ms against sequential {times.group(2)} ms a step "
            f"({float(times.group(1)) / float(times.group(2)):.2f})" if times else "",
            f"loss {loss.group(1)} -> {loss.group(2)} in {loss.group(3)} steps" if loss else "",
            f"against sequential training on the GPU: {diff.group(1).strip()}" if diff else "",
            f"reductions {reduced.group(1)} ms, exposed {reduced.group(2)} ms (simulated {reduced.group(3)}), "
            f"beside compute {reduced.group(4)}% (simulated {reduced.group(5)}%)" if reduced else ""] if x)
        arithmetic = f"{math}" + (f" GEMMs, {dtype} activations" if dtype != "fp32" else "")
        where = (f"seed example, {devices} devices on 1 GPU (virtual), {arithmetic}" if transport == "virtual" else
                 f"seed example, {devices} GPUs over NCCL, {arithmetic}")
        if replicas > 1:
            where = (f"seed example, {replicas} replicas x {devices} devices on 1 GPU (virtual; reductions through "
                     f"host memory), {math}")
        if rc == 0 and diff and diff.group(2) == "ok":
            self.result("PASS", name, f"{where}; {figures}")
        else:
            why = "timed out" if rc is None else f"exit {rc}"
            self.result("FAIL", name, f"{where}; {why}; {figures}; {last_line(text)}")

    def train_mlp_nccl(self, limit):
        if self.smi_gpus < 2:
            return self.result("SKIP", "train_mlp nccl", f"{self.smi_gpus} GPU: the nccl transport needs a GPU per "
                               "pipeline device (the virtual rows above share one)")
        self.train_mlp("train_mlp nccl", "nccl", min(self.smi_gpus, 4) // 2 * 2, "bf16", limit)

    def sanitizer(self, tool, math, limit):
        name = tool
        cs = shutil.which("compute-sanitizer")
        nvcc = self.nvcc()
        if not cs and nvcc and os.path.exists(os.path.join(os.path.dirname(nvcc), "compute-sanitizer")):
            cs = os.path.join(os.path.dirname(nvcc), "compute-sanitizer")
        if not cs:
            return self.result("SKIP", name, "compute-sanitizer not found")
        rc, secs, text = self.run([cs, "--tool", tool, "--error-exitcode", "99", self.exe("examples/train_mlp"),
                                   "--backend", "cuda", "--transport", "virtual", "--devices", "2", "--layers", "4",
                                   "--hidden", "32", "--batch", "32", "--micro-batches", "4", "--steps", "2",
                                   "--math", math, "--dtype", "bf16" if math == "bf16" else "fp32"], limit,
                                  f"{tool}.log")
        summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
        what = (f"train_mlp {math} GEMMs{' and activations' if math == 'bf16' else ''}, 2 devices on 1 GPU, 2 steps: "
                f"{summary[-1] if summary else 'no summary'}")
        if rc is None:
            self.result(NO_TIME, name, f"stopped at the end of its budget after {secs:.0f} s; {what}")
        else:
            self.result("PASS" if rc == 0 else "FAIL", name, what if rc == 0 else f"exit {rc}; {what}")

    def pipeline_gpu(self, name, args, limit, json_name, table_name):
        """Runs bench/pipeline_gpu; writes its table to RESULTS_DIR/table_name; returns (rc, rows or an error)."""
        json_file = os.path.join(self.logs, json_name)
        rc, secs, text = self.run([self.exe("bench/pipeline_gpu"), *args, "--json-file", json_file], limit,
                                  name + ".log")
        table = [l for l in text.splitlines() if not l.startswith("pipeline_gpu: ")]
        with open(os.path.join(self.results, table_name), "w") as f:
            f.write("\n".join(table) + "\n")
        try:
            with open(json_file) as f:
                return rc, json.load(f)["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return rc, f"no JSON ({e})"

    def report(self, name, rc, figures, table):
        what = "; ".join(figures) + f" (table in {table})"
        if rc == 0:
            self.result("PASS", name, what)
        elif rc is None:
            self.result(NO_TIME, name, "stopped at the end of its budget; " + what)
        else:
            self.result("FAIL", name, f"exit {rc}; " + what)

    def bench(self, limit):
        rc, rows = self.pipeline_gpu("bench", [
            "--schedules", "1f1b,interleaved", "--devices", "4", "--chunks", "2", "--micro-batches", "8",
            "--layers", "16", "--hidden", "2048,4096", "--batch", "4096", "--dtypes", "bf16",
            "--activations", "fp32,bf16", "--transport", "virtual",
            "--warmup", "2", "--iters", "5", "--trace-dir", os.path.join(self.logs, "traces")], limit,
            "bench.json", "bench.txt")
        self.report("bench", rc, bench_figures(rows) if isinstance(rows, list) else [rows], "bench.txt")

    def overlap(self, limit):
        rc, rows = self.pipeline_gpu("overlap", [
            "--schedules", "interleaved,1f1b", "--devices", "1", "--chunks", "2", "--micro-batches", "8,32",
            "--layers", "8", "--hidden", "1024", "--batch", "1024", "--dtypes", "bf16", "--overlap", "--offload",
            "--warmup", "2", "--iters", "5"], limit, "overlap.json", "overlap.txt")
        figures = [rows] if not isinstance(rows, list) else [
            f"{r['schedule']} M={r['micro_batches']} {r['dtype']}: the plain step over the "
            f"{'overlapped' if r['schedule'].endswith('+overlap') else 'offloaded'} {r['vs_plain']:.2f}"
            for r in rows if r["schedule"].endswith(("+overlap", "+offload"))] + [
            f"#wrong {sum(r['wrong'] for r in rows if r['wrong'] is not None)}"]
        self.report("overlap", rc, ["P = 1, V = 2"] + figures, "overlap.txt")

    def bench_replicas(self, limit):
        rc, rows = self.pipeline_gpu("bench replicas", [
            "--schedules", "1f1b,interleaved", "--devices", "2", "--chunks", "2", "--replicas", "2",
            "--micro-batches", "8", "--layers", "8", "--hidden", "1024", "--batch", "1024", "--dtypes", "fp32",
            "--transport", "virtual", "--warmup", "2", "--iters", "5"], limit, "replicas.json", "replicas.txt")

        def share(x):
            return "?" if x is None else f"{100 * x:.0f}%"

        def ms(x):
            return "?" if x is None else f"{x:.3f} ms"

        figures = [rows] if not isinstance(rows, list) else [
            f"{r['schedule']}: exposed {ms(r.get('exposed_reduction_ms'))} (simulated "
            f"{ms(r.get('exposed_reduction_sim_ms'))}), beside compute {share(r.get('hidden_reduction_share'))} "
            f"(simulated {share(r.get('hidden_reduction_share_sim'))})"
            for r in rows if (r.get("replicas") or 1) > 1] + [
            f"#wrong {sum(r['wrong'] for r in rows if r.get('wrong') is not None)}"]
        self.report("bench replicas", rc, ["P = 2 x D = 2 on one GPU (reductions through host memory), fp32"] + figures,
                    "replicas.txt")

    def mpi(self, limit):
        name = "mpi"
        rel = "examples/train_mlp_mpi"
        if rel not in self.manifest["executables"]:
            return self.result("SKIP", name, "the bundle has no train_mlp_mpi (MPI was not found where it was made)")
        why = self.mpi_ready(rel)
        if why:
            return self.result("SKIP", name, why)
        gpus = max(self.smi_gpus, 1)
        env = dict(self.env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        rc, secs, text = self.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(gpus), self.exe(rel),
                                   "--steps", "20"], limit, "mpi.log", env=env)
        check = re.search(r"max \|pipelined - sequential\| = .*", text)
        what = f"{gpus} rank{'s' if gpus > 1 else ''} (one per GPU), NCCL across processes: " + (
            check.group(0) if check else last_line(text))
        if rc is None:
            return self.result("FAIL", name, f"timed out after {secs:.0f} s; " + what)
        if rc != 0:
            return self.result("FAIL", name, what)
        # One rank more than GPUs: two ranks land on one GPU, which every rank refuses at start-up, naming its UUID.
        rc2, secs2, text2 = self.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(gpus + 1),
                                      self.exe(rel), "--steps", "1"], max(limit - secs, 1), "mpi_shared.log", env=env)
        shared = re.search(r"start-up: ranks \d+ and \d+ are both on GPU GPU-[0-9a-f-]+", text2)
        on = f"; {gpus + 1} ranks on {gpus} GPU{'s' if gpus > 1 else ''}"
        if rc2 is None:
            return self.result("FAIL", name, what + on + f": timed out after {secs2:.0f} s")
        if rc2 == 0 or not shared:
            return self.result("FAIL", name, what + on + " were not refused by GPU: " + last_line(text2))
        self.result("PASS", name, what + on + " refused: " + shared.group(0))

    # --- the whole run --------------------------------------------------------------
    def setup(self, limit):
        self.describe_machine()
        with tarfile.open(os.path.join(BUNDLE, "share", "src.tar.xz")) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(self.work, filter="data")
            else:
                tar.extractall(self.work)
        self.libraries()
        self.link_build_tree()
        self.start()

    def main(self):
        self.note("time plan (s): " + ", ".join(f"{n} {self.budget[n]:.0f}" for n, _, _ in PLAN) +
                  f"; {self.until[PLAN[-1][0]]:.0f} in all")
        steps = {
            "setup": (self.setup, False),
            "probe": (self.probe_gpu, False),
            "suite": (self.suite, False),
            "train_mlp fp32": (lambda t: self.train_mlp("train_mlp fp32", "virtual", 4, "fp32", t), True),
            "train_mlp tf32": (lambda t: self.train_mlp("train_mlp tf32", "virtual", 4, "tf32", t), True),
            "train_mlp bf16": (lambda t: self.train_mlp("train_mlp bf16", "virtual", 4, "bf16", t, dtype="bf16"), True),
            "train_mlp nccl": (self.train_mlp_nccl, True),
            "train_mlp replicas": (lambda t: self.train_mlp("train_mlp replicas", "virtual", 2, "fp32", t, 2), True),
            "bench": (self.bench, True),
            "overlap": (self.overlap, True),
            "bench replicas": (self.bench_replicas, True),
            "mpi": (self.mpi, True),
            "memcheck": (lambda t: self.sanitizer("memcheck", "bf16", t), True),
            "racecheck": (lambda t: self.sanitizer("racecheck", "fp32", t), True),
        }
        assert list(steps) == [n for n, _, _ in PLAN], "every step of the plan runs, in the plan's order"
        for name, (body, needs_gpu) in steps.items():
            self.step(name, body, needs_gpu)
        self.finish()
        return 1 if self.failures else 0

    def finish(self):
        took = time.monotonic() - self.t0
        summary = self.header + self.lines + [
            f"# {len(self.lines)} checks, {self.failures} failed; {took:.0f} s (the plan: {self.until[PLAN[-1][0]]:.0f} s"
            + (f", and {self.shift:.0f} s of a fallback build" if self.shift else "") + ")"]
        with open(os.path.join(self.results, "summary.txt"), "w") as f:
            f.write("\n".join(summary) + "\n")
        shutil.copyfile(os.path.join(self.results, "summary.txt"), os.path.join(self.logs, "summary.txt"))
        with tarfile.open(os.path.join(self.results, "logs.tar.gz"), "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
        print(summary[-1])
        print(f"# results in {self.results}: {', '.join(sorted(os.listdir(self.results)))}")
        if not os.environ.get("PIPEWEAVE_KEEP_WORK"):
            shutil.rmtree(self.work, ignore_errors=True)


def bench_figures(rows):
    """The bench's summary: per dtype, activations and hidden size, cuBLAS alone on the step's GEMMs,
    the best pipelined row from device time and from the wall clock with their shares of the dense
    peak, and pipelined against sequential step time for each transport; then, where a row ran with
    bf16 and with fp32 activations, the one step time over the other and the bytes of a hand-over."""
    def share(tflops, pct):
        return f" ({pct:.1f}% of {100 * tflops / pct:.0f})" if pct not in (None, 0) and pct > 0 else ""

    def acts(r):
        return r.get("activations") or "fp32"
    out = []
    for dtype, hidden in sorted({(r["dtype"], r["hidden"]) for r in rows}):
        same = [r for r in rows if r["dtype"] == dtype and r["hidden"] == hidden]
        alone = [r for r in same if r["schedule"] == "cublas"]
        for a in sorted({acts(r) for r in same if r["schedule"] != "cublas"}) or ["fp32"]:
            pipe = [r for r in same if r["schedule"] != "cublas" and acts(r) == a]
            parts = []
            if alone:
                c = max(alone, key=lambda r: r["tflops"])
                parts.append(f"cuBLAS alone {c['tflops']:.0f} TFLOP/s{share(c['tflops'], c.get('peak_percent'))}")
            if pipe:
                b = max(pipe, key=lambda r: r.get("tflops_dev") or r["tflops"])
                if b.get("tflops_dev") is not None:
                    parts.append(f"{b['schedule']} {b['tflops_dev']:.0f} TFLOP/s of device time"
                                 f"{share(b['tflops_dev'], b.get('peak_percent_dev'))}")
                parts.append(f"{b['schedule']} {b['tflops']:.0f} TFLOP/s of wall clock"
                             f"{share(b['tflops'], b.get('peak_percent'))}")
                for transport in sorted({r.get("transport", "?") for r in pipe}):
                    ratios = [f"{r['schedule']} {r['step_ms'] / r['sequential_ms']:.2f}" for r in pipe
                              if r.get("transport", "?") == transport and r.get("sequential_ms")]
                    if ratios:
                        parts.append(f"pipelined/sequential step over {transport}: " + ", ".join(ratios))
            out.append(f"{dtype} hidden {hidden}" + (f", {a} activations" if a != "fp32" else "") + ": " +
                       ", ".join(parts))
        by = {(r["schedule"], acts(r)): r for r in same if r["schedule"] != "cublas"}
        versus = [f"{s} {by[(s, 'bf16')]['step_ms'] / by[(s, 'fp32')]['step_ms']:.2f}"
                  + (f" (hand-over {by[(s, 'fp32')]['handoff_kib']:.0f} -> {by[(s, 'bf16')]['handoff_kib']:.0f} KiB)"
                     if by[(s, 'fp32')].get("handoff_kib") and by[(s, 'bf16')].get("handoff_kib") else "")
                  for s in sorted({s for s, _ in by}) if (s, "bf16") in by and (s, "fp32") in by]
        if versus:
            out.append(f"{dtype} hidden {hidden}: step with bf16 activations / with fp32: " + ", ".join(versus))
    out.append(f"#wrong {sum(r['wrong'] for r in rows if r.get('wrong') is not None)}")  # cublas rows: null
    return out


def library_versions(paths):
    """What the CUDA runtime, the driver, cuBLAS and NCCL found say their versions are: {"text": ...}."""
    import ctypes

    def load(prefix):
        path = next((p for n, p in sorted(paths.items()) if n.startswith(prefix + ".so")), None)
        return ctypes.CDLL(path) if path else None

    def ask(lib, fn, *args):
        v = ctypes.c_int(0)
        return v.value if lib is not None and getattr(lib, fn)(*args, ctypes.byref(v)) == 0 else None

    parts = []
    cudart = load("libcudart")
    for what, fn in (("CUDA runtime", "cudaRuntimeGetVersion"), ("driver for CUDA", "cudaDriverGetVersion")):
        v = ask(cudart, fn)
        parts.append(f"{what} " + (f"{v // 1000}.{v % 1000 // 10}" if v else "none" if v == 0 else "unknown"))
    cublas = load("libcublas")
    v = [ask(cublas, "cublasGetProperty", ctypes.c_int(k)) for k in range(3)]  # major, minor, patch
    parts.append("cuBLAS " + (".".join(map(str, v)) if None not in v else "unknown"))
    v = ask(load("libnccl"), "ncclGetVersion")
    parts.append("NCCL " + (f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v else "unknown"))
    return {"text": ", ".join(parts)}


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
    if len(sys.argv) == 3 and sys.argv[1] == "--library-versions":  # run by Runner.library_versions
        print(json.dumps(library_versions(json.loads(sys.argv[2]))))
        return 0
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    results = sys.argv[1] if len(sys.argv) == 2 else "gpu-results-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Runner(results).main()


if __name__ == "__main__":
    sys.exit(main())
