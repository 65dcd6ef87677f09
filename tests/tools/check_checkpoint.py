#!/usr/bin/env python3
"""Checks checkpoints end to end through the command-line tools.

  check_checkpoint.py resume --train-mlp T [--train-mlp-mpi M --mpirun R] --work DIR
      N steps, then a resume under another schedule, P, V, layer allocation or
      host and N more, equal bit for bit (every tensor, parameters and optimizer state) to 2N
      steps in one run.
  check_checkpoint.py kill --train-mlp T [--train-mlp-mpi M --mpirun R] --work DIR [--instants 50]
      kill -9 the process, a rank, or the whole job at random instants of a run
      that saves every step; each time the latest checkpoint loads completely
      and the run resumed from it ends equal bit for bit to one never killed.
  check_checkpoint.py safetensors --train-mlp T --sample S --work DIR
      the `safetensors` Python library (with numpy) reads a checkpoint, and every
      tensor equals what the run holds (S writes a checkpoint and the run's state
      as raw floats); exit 77 (skip) when safetensors or numpy is missing.

The safetensors files are parsed here by hand (8-byte length, JSON header,
little-endian data) for the first two, so they need nothing but Python.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib


def fail(message):
    print('FAIL: ' + message)
    sys.exit(1)


def read_safetensors(path):
    with open(path, 'rb') as f:
        data = f.read()
    (n,) = struct.unpack('<Q', data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == '__metadata__':
            continue
        b, e = t['data_offsets']
        out[name] = (t['dtype'], tuple(t['shape']), data[8 + n + b:8 + n + e])
    return out


def latest(root):
    with open(os.path.join(root, 'latest')) as f:
        return os.path.join(root, f.read().strip())


def load(directory):
    """Every tensor of a checkpoint directory, checked against its manifest."""
    with open(os.path.join(directory, 'manifest.json')) as f:
        manifest = json.load(f)
    tensors = {}
    for rec in manifest['files']:
        path = os.path.join(directory, rec['name'])
        with open(path, 'rb') as f:
            data = f.read()
        if len(data) != rec['bytes'] or zlib.crc32(data) != int(rec['crc32'], 16):
            fail(path + ': size or checksum differs from the manifest')
        tensors.update(read_safetensors(path))
    if set(tensors) != set(manifest['tensors']):
        fail(directory + ': the files do not hold the tensors the manifest lists')
    return manifest, tensors


def same_state(a_dir, b_dir, what):
    ma, ta = load(a_dir)
    mb, tb = load(b_dir)
    if ma['step'] != mb['step'] or ma['optimizer']['updates'] != mb['optimizer']['updates']:
        fail(f'{what}: step {mb["step"]} ({mb["optimizer"]["updates"]} updates) against {ma["step"]} '
             f'({ma["optimizer"]["updates"]})')
    if set(ta) != set(tb):
        fail(f'{what}: the tensors differ: {sorted(set(ta) ^ set(tb))[:4]}')
    for name in sorted(ta):
        if ta[name] != tb[name]:
            fail(f'{what}: tensor {name} differs')
    return len(ta)


class Tools:
    def __init__(self, args):
        self.train_mlp = args.train_mlp
        self.train_mlp_mpi = args.train_mlp_mpi
        self.mpirun = args.mpirun
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1',
                        OPENBLAS_NUM_THREADS='1', OMPI_MCA_rmaps_base_oversubscribe='1')

    def command(self, host, ranks, flags):
        if host == 'threads':
            return [self.train_mlp, '--backend', 'cpu'] + flags
        return [self.mpirun, '--oversubscribe', '--bind-to', 'none', '-n', str(ranks), self.train_mlp_mpi,
                '--backend', 'cpu'] + flags

    def run(self, host, ranks, flags, expect=0):
        cmd = self.command(host, ranks, flags)
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=300)
        if p.returncode != expect:
            fail(f'{" ".join(cmd)} exited {p.returncode}, expected {expect}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}')
        return p


MODEL = ['--layers', '8', '--hidden', '16', '--batch', '32', '--micro-batches', '4', '--timeout-ms', '20000']


def resume(args):
    tools = Tools(args)
    with_mpi = bool(args.train_mlp_mpi and args.mpirun)
    # (first host, ranks, schedule flags), (second ...), optimizer
    cases = [
        (('threads', 2, ['--devices', '2', '--schedule', 'interleaved', '--chunks', '2']),
         ('threads', 4, ['--devices', '4', '--schedule', '1f1b']), ['--optimizer', 'adam']),
        (('threads', 4, ['--devices', '4', '--schedule', 'gpipe']),
         ('threads', 2, ['--devices', '2', '--schedule', 'zb-v']), ['--optimizer', 'sgd', '--lr', '0.01']),
        (('threads', 2, ['--devices', '2', '--schedule', '1f1b', '--overlap']),
         ('threads', 1, ['--devices', '1', '--schedule', 'gpipe']), ['--optimizer', 'adam']),
        # Another layer allocation: the checkpoint's tensors are per layer, not per stage.
        (('threads', 2, ['--devices', '2', '--schedule', 'interleaved', '--chunks', '2', '--layers-per-stage', '1,3,3,1']),
         ('threads', 2, ['--devices', '2', '--schedule', '1f1b', '--layers-per-stage', '5,3']), ['--optimizer', 'adam']),
    ]
    if with_mpi:
        cases += [
            (('threads', 2, ['--devices', '2', '--schedule', 'interleaved', '--chunks', '2']),
             ('mpi', 4, ['--schedule', '1f1b']), ['--optimizer', 'adam']),
            (('mpi', 2, ['--schedule', 'zb-v']),
             ('threads', 4, ['--devices', '4', '--schedule', 'interleaved', '--chunks', '2']), ['--optimizer', 'sgd']),
            (('mpi', 2, ['--schedule', 'zb-v', '--layers-per-stage', '2,1,1,4']),
             ('threads', 2, ['--devices', '2', '--schedule', 'interleaved', '--chunks', '2']), ['--optimizer', 'adam']),
        ]
    n = 3
    for i, (first, second, opt) in enumerate(cases):
        def flags(spec, steps, extra):
            host, ranks, sched = spec
            f = MODEL + opt + ['--steps', str(steps)] + extra
            return f + (sched if host == 'threads' else [s for s in sched])
        whole, part, cont = (os.path.join(args.work, f'case{i}-{k}') for k in ('whole', 'part', 'cont'))
        for d in (whole, part, cont):
            shutil.rmtree(d, ignore_errors=True)
        tools.run(first[0], first[1], flags(first, 2 * n, ['--save', whole]))
        tools.run(first[0], first[1], flags(first, n, ['--save', part]))
        p = tools.run(second[0], second[1], flags(second, 2 * n, ['--resume', part, '--save', cont]))
        if 'bit-for-bit equal' not in p.stdout:
            fail(f'case {i}: the resumed run is not equal to its own sequential reference')
        count = same_state(latest(whole), latest(cont), f'case {i}')
        def name(spec):
            return ' '.join([spec[0]] + ([f'-n {spec[1]}'] if spec[0] == 'mpi' else []) + spec[2])
        print(f'ok: {name(first)} for {n} steps, then {name(second)} for {n} more = {2 * n} steps in one run '
              f'({count} tensors equal)')
    # --save-every and --keep: the newest two remain, latest names the last.
    d = os.path.join(args.work, 'keep')
    shutil.rmtree(d, ignore_errors=True)
    tools.run('threads', 2, MODEL + ['--devices', '2', '--steps', '6', '--save', d, '--save-every', '2', '--keep', '2'])
    kept = sorted(x for x in os.listdir(d) if x.startswith('step-'))
    if kept != ['step-00000004', 'step-00000006'] or latest(d) != os.path.join(d, 'step-00000006'):
        fail(f'--save-every 2 --keep 2 left {kept}')
    print('ok: --save-every 2 --keep 2 keeps step-00000004 and step-00000006; latest names the second')


def alive(pid):
    """True while `pid` runs (a zombie counts as ended)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(')')[-1].split()[0] != 'Z'
    except OSError:
        return False


def children(pid):
    p = subprocess.run(['pgrep', '-P', str(pid)], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def save_ms(stdout):
    """The mean time of the saves a run reports (train_mlp: writing; train_mlp_mpi: copying and writing)."""
    times = [float(m) for m in re.findall(r'(?:written in|copying and writing) ([0-9.]+) ms', stdout)]
    return sum(times) / len(times) if times else 50.0


def kill(args):
    """Each kill lands in a save: the driver reads the run's lines, waits for the
    line of a random step (printed just before that step's checkpoint is
    written) and kills after a random part of a save's measured time."""
    tools = Tools(args)
    rng = random.Random(args.seed)
    steps = 8
    model = ['--layers', '8', '--hidden', '384', '--batch', '8', '--micro-batches', '4', '--timeout-ms', '20000',
             '--steps', str(steps), '--log-every', '1']
    modes = [('threads', 'process')] * (args.instants if not args.train_mlp_mpi else args.instants * 3 // 5)
    if args.train_mlp_mpi and args.mpirun:
        rest = args.instants - len(modes)
        modes += [('mpi', 'rank')] * (rest // 2) + [('mpi', 'job')] * (rest - rest // 2)
    sched = {'threads': ['--devices', '2'], 'mpi': []}
    reference, save_time = {}, {}
    for host in sorted(set(h for h, _ in modes)):
        d = os.path.join(args.work, 'kill-reference-' + host)
        shutil.rmtree(d, ignore_errors=True)
        p = tools.run(host, 2, model + sched[host] + ['--save', d, '--save-every', '1'])
        save_time[host] = save_ms(p.stdout) / 1e3
        reference[host] = latest(d)
    stats = {'mid-save': 0, 'none yet': 0, 'previous': 0, 'new': 0}
    for i, (host, what) in enumerate(modes):
        d = os.path.join(args.work, 'kill')
        shutil.rmtree(d, ignore_errors=True)
        cmd = tools.command(host, 2, model + sched[host] + ['--save', d, '--save-every', '1'])
        proc = subprocess.Popen(cmd, env=tools.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        step = rng.randint(1, steps)
        for line in proc.stdout:
            if re.match(rf'step\s+{step}\s+loss', line):
                break
        at = rng.uniform(0.0, 1.2) * save_time[host]
        time.sleep(at)
        ranks = children(proc.pid) if host == 'mpi' else []
        if what == 'rank':
            os.kill(rng.choice(ranks) if ranks else proc.pid, signal.SIGKILL)
        else:  # the whole job: the launcher and every rank at once
            for pid in [proc.pid] + ranks:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 60
        rest = ''
        try:
            rest = proc.communicate(timeout=60)[0] or ''
        except subprocess.TimeoutExpired:
            pass
        # The last step whose line the run printed before it died: a loaded machine may read step k's line
        # late, when the run has gone on to later steps; no checkpoint can be of a step past that line.
        printed = max([step] + [int(n) for n in re.findall(r'^step\s+(\d+)\s+loss', rest, re.M)])
        while any(alive(pid) for pid in [proc.pid] + ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        if any(alive(pid) for pid in [proc.pid] + ranks):
            for pid in [proc.pid] + ranks:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            fail(f'instant {i}: the job did not end within 60 s of a {what} killed {at * 1e3:.1f} ms into the save '
                 f'of step {step}')
        if os.path.isdir(d) and any(x.startswith('.tmp-') for x in os.listdir(d)):
            stats['mid-save'] += 1
        if not os.path.exists(os.path.join(d, 'latest')):
            stats['none yet'] += 1
            p = tools.run(host, 2, model + sched[host] + ['--resume', d], expect=2 if host == 'threads' else 1)
            if 'holds no checkpoint' not in p.stderr and 'is not a directory' not in p.stderr:
                fail(f'instant {i}: --resume of a directory without a checkpoint: {p.stderr[-500:]}')
            continue
        before = latest(d)
        manifest, _ = load(before)  # complete, every checksum as the manifest says
        stats['new' if manifest['step'] == step else 'previous'] += 1  # of the step's line
        # With threads the save of step k - 1 may still be in flight at step k's line (it is written beside
        # the training of step k); under mpirun a save ends before the next step.
        if not step - 2 <= manifest['step'] <= printed:
            fail(f'instant {i}: killed in the save of step {step} (the last line printed: step {printed}), but the '
                 f'latest checkpoint is of step {manifest["step"]}')
        tools.run(host, 2, model + sched[host] + ['--resume', d, '--save', d])
        same_state(reference[host], latest(d), f'instant {i} ({host}, {what} killed {at * 1e3:.1f} ms into the save '
                                                f'of step {step}, resumed from {os.path.basename(before)})')
    print(f'ok: {len(modes)} kills in saves ({sum(1 for m in modes if m[0] == "threads")} of the threads run, '
          f'{sum(1 for m in modes if m[1] == "rank")} of one rank, {sum(1 for m in modes if m[1] == "job")} of the '
          f'whole mpirun job; a save takes {save_time.get("threads", 0) * 1e3:.1f} ms with threads, '
          f'{save_time.get("mpi", 0) * 1e3:.1f} ms under mpirun): {stats["mid-save"]} left a partial save behind, '
          f'{stats["previous"]} resumed from the previous checkpoint, {stats["new"]} from the new one, '
          f'{stats["none yet"]} before the first (refused to resume, by name); every resumed run ended equal bit '
          f'for bit to the run never killed')


def python_reader(args):
    try:
        import numpy as np
        from safetensors.numpy import load_file
    except ImportError as e:
        venv_python = os.path.join(args.venv or '', 'bin', 'python3')
        if args.venv and os.path.exists(venv_python) and 'PIPEWEAVE_IN_VENV' not in os.environ:
            os.environ['PIPEWEAVE_IN_VENV'] = '1'
            os.execv(venv_python, [venv_python] + sys.argv)
        print(f'SKIP: {e} (tools/dev py-deps installs safetensors and numpy into .venv-py)')
        sys.exit(77)
    d = os.path.join(args.work, 'python-reader')
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    p = subprocess.run([args.sample, d], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f'{args.sample} exited {p.returncode}: {p.stderr}')
    with open(os.path.join(d, 'expected.json')) as f:
        expected = json.load(f)
    raw = np.fromfile(os.path.join(d, 'expected.f32'), dtype='<f4')
    directory = latest(os.path.join(d, 'checkpoint'))
    loaded = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith('.safetensors'):
            part = load_file(os.path.join(directory, name))
            if set(part) & set(loaded):
                fail(f'{name} repeats a tensor of another file')
            loaded.update(part)
    if set(loaded) != set(expected):
        fail(f'the files hold {sorted(set(loaded) ^ set(expected))[:6]} where the run does not, or the reverse')
    for name, (offset, shape) in expected.items():
        want = raw[offset:offset + int(np.prod(shape))].reshape(shape)
        got = loaded[name]
        if got.dtype != np.float32 or tuple(got.shape) != tuple(shape) or not np.array_equal(got, want):
            fail(f'tensor {name}: {got.dtype} {got.shape} differs from the run\'s')
    print(f'ok: safetensors.numpy.load_file read {len(loaded)} tensors from {directory}, each equal to the run\'s')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('what', choices=['resume', 'kill', 'safetensors'])
    ap.add_argument('--train-mlp')
    ap.add_argument('--train-mlp-mpi')
    ap.add_argument('--mpirun')
    ap.add_argument('--sample')
    ap.add_argument('--venv')
    ap.add_argument('--work', required=True)
    ap.add_argument('--instants', type=int, default=50)
    ap.add_argument('--seed', type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    {'resume': resume, 'kill': kill, 'safetensors': python_reader}[args.what](args)


if __name__ == '__main__':
    main()
