"""pipeweave-schedule: print_schedule's command line in Python.

Every row of print_schedule's own command-line table (tests/schedule/meson.build, print_cli) runs here through
pipeweave.cli with the row's checks; where the C++ print_schedule is at hand (PIPEWEAVE_PRINT_SCHEDULE, which
`tools/dev python-test` sets after a build), both front ends give the same exit status and the same output, byte for
byte, with only the program's name in the messages differing.
"""

import ast
import io
import os
import pathlib
import subprocess
import sys
import tokenize

import pytest

from pipeweave import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "schedule" / "meson.build"
CXX = os.environ.get("PIPEWEAVE_PRINT_SCHEDULE")
# Rows whose command line the parser itself refuses or answers (--help, an unknown flag, a flag without its value):
# CLI11 and argparse word these differently; the status is the same and the row's own checks hold for both.
PARSER_ROWS = {"help", "unknown-flag", "missing-value"}


def _value(node):
    """A Meson literal of the table: strings (joined by +), integers, lists and dicts; the two paths it names."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left) + _value(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        base = ast.unparse(node.left)
        where = {"tests_data_dir": ROOT / "tests" / "data", "meson.project_source_root()": ROOT}[base]
        return str(where / _value(node.right))
    raise ValueError(f"{TABLE}: {ast.unparse(node)} is not a literal of the table")


def print_cli_rows():
    """print_cli's rows: name -> (status, checks, args)."""
    text = TABLE.read_text()
    source = text[text.index("print_cli = {") + len("print_cli = "):]
    depth, lines = 0, source.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.OP and token.string in "{}":
            depth += 1 if token.string == "{" else -1
            if depth == 0:
                row, col = token.end
                table = "".join(lines[:row - 1]) + lines[row - 1][:col]
                return _value(ast.parse("(" + table + ")", mode="eval").body)
    raise ValueError(f"{TABLE}: print_cli's table does not close")


ROWS = print_cli_rows()


def run_python(args, capsys):
    try:
        status = cli.main(args)
    except SystemExit as stop:  # argparse: --help, or a command line it refuses
        status = stop.code
    out, err = capsys.readouterr()
    return status, out, err


def check_row(checks, status, expected, out, err, args):
    """The row's own checks (tests/tools/cli_check.py's flags) on one run; the problems found."""
    problems = [] if status == expected else [f"exit status {status}, expected {expected}"]
    it = iter(checks)
    for flag in it:
        flag, value = flag.split("=", 1) if "=" in flag else (flag, next(it))
        if flag == "--stdout-has" and value not in out:
            problems.append(f"stdout lacks {value!r}")
        elif flag == "--stderr-has" and value.replace("print_schedule: ", cli.PROG + ": ") not in err:
            problems.append(f"stderr lacks {value!r}")
        elif flag == "--stderr-lines" and len(err.splitlines()) != int(value):
            problems.append(f"stderr has {len(err.splitlines())} lines, expected {value}")
        elif flag == "--stdout-file" and out != pathlib.Path(value).read_text():
            problems.append(f"stdout differs from {value}")
        elif flag == "--stdout-readme":
            shown = "$ build/examples/print_schedule" + "".join(" " + a for a in args) + "\n"
            text = pathlib.Path(value).read_text()
            start = text.index(shown) + len(shown)
            if out != text[start:text.index("```", start)]:
                problems.append(f"stdout differs from README's block after {shown!r}")
    return problems


def test_the_table_is_read_whole():
    assert len(ROWS) >= 60 and {"seed-actions", "auto-summary", "unknown-flag"} <= ROWS.keys()
    assert ROWS["seed-actions"][2][:2] == ["--schedule", "interleaved"]


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_row_of_print_schedules_table(name, capsys):
    expected, checks, args = ROWS[name]
    status, out, err = run_python(args, capsys)
    assert check_row(checks, status, expected, out, err, args) == []
    if CXX is None:
        return
    cxx = subprocess.run([CXX, *args], capture_output=True, text=True, timeout=120)
    assert cxx.returncode == status
    if name not in PARSER_ROWS:
        assert (out, err) == (cxx.stdout, cxx.stderr.replace("print_schedule: ", cli.PROG + ": "))


def test_help_lists_every_flag_of_the_table(capsys):
    status, out, _ = run_python(["--help"], capsys)
    assert status == 0 and out.startswith("usage: pipeweave-schedule")
    assert all(name in out for name, _, _, _ in cli._core._print_schedule_flags())


def test_errors_are_one_line_and_refuse_what_print_schedule_refuses(capsys):
    assert run_python(["--devices", "x"], capsys) == (
        2, "", "pipeweave-schedule: --devices: must be a whole number in 1..4096 (got 'x') (see --help)\n")
    assert run_python(["--dev", "2"], capsys)[0] == 2  # no abbreviations: print_schedule has none
    assert run_python(["--overlap-efficiency", "nan"], capsys)[2].endswith(
        "--overlap-efficiency: must be a number in 0..1 (got 'nan') (see --help)\n")


def test_output_is_written_whole(tmp_path, capsys):
    target = tmp_path / "order.csv"
    assert run_python(["--schedule", "1f1b", "--devices", "2", "--micro-batches", "4", "--format", "csv",
                       "--output", str(target)], capsys) == (0, "", "")
    assert target.read_text().splitlines()[0] == "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3"
    status, _, err = run_python(["--format", "csv", "--output", str(tmp_path / "no" / "such.csv")], capsys)
    assert status == 2 and "cannot create a file next to" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["order.csv"]


def test_the_module_and_the_console_command_run_it():
    for command in ([sys.executable, "-m", "pipeweave"], [str(pathlib.Path(sys.executable).parent / "pipeweave-schedule")]):
        done = subprocess.run([*command, "--schedule", "zb-h1", "--devices", "4", "--micro-batches", "8",
                               "--format", "summary"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout.startswith("ZB-H1: P=4 devices, V=1 chunk, M=8 micro-batches\n")


def test_print_schedules_own_checks_hold_for_the_command():
    """tests/tools/check_print_schedule.py (formats, --input, --output, errors) on pipeweave-schedule."""
    command = pathlib.Path(sys.executable).parent / "pipeweave-schedule"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "tools" / "check_print_schedule.py"), str(command)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
