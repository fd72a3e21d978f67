"""The `pto-gpu` command runs every orchestration, checks it, and writes the artefacts it is asked for;
it is the product's command (pto_gpu.cli) over the catalogue in pto_gpu.orchestration.workloads."""

import dataclasses
import importlib.metadata
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pto_gpu.kernels.tiles import zero
from pto_gpu.orchestration import workloads

import pto_gpu as pto
from pto_gpu import cli


@pytest.mark.parametrize("name", sorted(workloads.WORKLOADS))
def test_runs_each_orchestration_small_and_writes_the_artefacts(name, tmp_path, capsys):
    trace, dump, graph = tmp_path / "trace.json", tmp_path / "dump.txt", tmp_path / "graph.dot"
    status = cli.main(["run", name, "--size", "64", "--backend", "cpu", "--runs", "2", "--trace", str(trace),
                       "--dump", str(dump), "--graph", str(graph)])
    out = capsys.readouterr().out
    assert status == 0 and "(OK, tolerance" in out
    counts = re.search(r": ([\d,]+) tasks, ([\d,]+) edges", out).groups()
    tasks, edges = (int(n.replace(",", "")) for n in counts)
    kernel_rows = out[out.index("  kernel "):out.index("  worker class")].splitlines()[1:]
    assert sum(int(row.split()[1].replace(",", "")) for row in kernel_rows) == tasks > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == tasks
    assert f"Total tasks scheduled:  {tasks}" in dump.read_text()
    assert graph.read_text().count(" -> ") == edges


def test_dry_runs_build_the_graph_without_checking(capsys):
    assert cli.main(["run", "llama", "--size", "64", "--executor", "dry", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "no kernel ran" in out and "numpy" not in out


def test_a_wrong_result_exits_1(monkeypatch, capsys):
    strict = dataclasses.replace(workloads.WORKLOADS["matmul"], tolerance=0.0)  # float32 never equals float64
    monkeypatch.setitem(workloads.WORKLOADS, "matmul", strict)
    assert cli.main(["run", "matmul", "--size", "32", "--backend", "cpu"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_bad_arguments_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "no_such_orchestration"])
    assert "invalid choice: 'no_such_orchestration'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--size"):
        cli.main(["run", "matmul", "--size", "0"])
    with pytest.raises(SystemExit, match="--graph g.png must end in .dot, .svg or .pdf"):
        cli.main(["run", "matmul", "--graph", "g.png"])
    assert cli.main(["run", "matmul", "--executor", "dry", "--trace", "t.json"]) == 2
    assert "pto-gpu: trace= draws when kernels ran" in capsys.readouterr().err


def test_help_explains_every_option_and_lists_the_orchestrations():
    text = cli.parser(workloads.WORKLOADS)._subparsers._group_actions[0].choices["run"].format_help()
    for option in ("--size", "--backend", "--executor", "--trace", "--dump", "--graph", "--runs"):
        assert option in text
    assert all(name in text for name in workloads.WORKLOADS)


def test_installed_as_the_pto_gpu_console_script():
    script = importlib.metadata.entry_points(group="console_scripts")["pto-gpu"]
    assert script.value == "pto_gpu.cli:main" and script.load() is cli.main


def test_python_dash_m_pto_gpu_runs_the_command():
    command = [sys.executable, "-m", "pto_gpu", "run", "softmax", "--size", "64", "--backend", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "(OK, tolerance" in done.stdout, done.stderr


def test_importing_the_runtime_or_its_command_loads_no_kernel_or_orchestration():
    code = ("import sys, pto_gpu, pto_gpu.cli; "
            "print([m for m in sys.modules if m.startswith(('pto_gpu.kernels', 'pto_gpu.orchestration'))])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeRuntime:
    """`progress` steps through the given (completed, submitted) pairs, one per read, then stays."""

    def __init__(self, *steps: tuple[int, int]):
        self.steps = list(steps)

    @property
    def progress(self) -> tuple[int, int]:
        return self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]


def run_until_polled(stream, delay: float, rt: FakeRuntime | None = None, patience: float = 0.3) -> None:
    """A body that lasts until the bar has read every step (or `patience` seconds), then a few polls more."""
    rt = rt or FakeRuntime((0, 2), (1, 4), (3, 4))
    with cli.progress_bar(rt, stream, delay=delay, every=0.01):
        deadline = time.monotonic() + patience
        while len(rt.steps) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)


def screen(text: str) -> list[str]:
    """The lines a terminal shows after `text`, each as its carriage returns overwrote it."""
    lines = []
    for line in text.split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown.rstrip())
    return lines


def test_progress_bar_follows_the_growing_total_on_a_terminal_and_is_cleared():
    stream = Terminal()
    rt = FakeRuntime((0, 2), (1, 4), (3, 4))
    run_until_polled(stream, delay=0, rt=rt, patience=10)
    drawn = stream.getvalue()
    assert "0/2" in drawn and "1/4" in drawn and "3/4" in drawn and "75%" in drawn
    assert not rt.steps[1:]  # every step was read
    assert screen(drawn) == [""]  # nothing left on the terminal, not even a new line


def test_progress_bar_draws_nothing_off_a_terminal_or_for_a_short_run():
    for stream, delay in ((io.StringIO(), 0), (Terminal(), 60)):
        run_until_polled(stream, delay)
        assert stream.getvalue() == ""


def test_progress_bar_without_tqdm_draws_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if the `progress` extra were not installed
    stream = Terminal()
    run_until_polled(stream, delay=0)
    assert stream.getvalue() == ""


def test_runtime_progress_counts_completed_and_submitted_tasks():
    rt = pto.Runtime(backend="cpu", workers={pto.VECTOR: 1})
    seen = []

    def three_tiles(o, x):
        tensor = o.external(x)
        for row in range(3):
            o.submit(zero, pto.output(tensor[row:row + 1]))
        seen.append(rt.progress)  # threshold 0: nothing runs before the orchestration returns

    assert rt.progress == (0, 0)
    rt.run(three_tiles, np.ones((3, 8), np.float32))
    assert seen == [(0, 3)] and rt.progress == (3, 3)


SOFTMAX = Path(__file__).parents[1] / "orchestration" / "programs" / "dynamic_softmax.pto"
SHAPES = ["--shape", "input=64x64", "--shape", "output=64x64"]


def run_softmax(*options: str) -> int:
    return cli.main(["run", str(SOFTMAX), *options, "--backend", "cpu"])


def checksums(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("  output ")]


def test_runs_a_pto_file_on_seeded_inputs_and_gives_the_numpy_softmax(tmp_path, capsys):
    assert run_softmax(*SHAPES, "--scalar", "num_tiles=8", "--seed", "3", "--check",
                       "--save", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "dynamic_softmax: 8 tasks" in out and "check: every output is bitwise equal" in out
    x = np.load(tmp_path / "input.in.npy")
    assert np.array_equal(x, np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    got = np.load(tmp_path / "output.out.npy")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert checksums(out) == [f"  output 64x64: sum {got.sum(dtype=np.float64):.9g}, "
                              f"max abs {np.abs(got).max():.9g}"]


def test_the_compiled_orchestration_gives_the_same_checksums(capsys):
    assert run_softmax(*SHAPES, "--scalar", "num_tiles=8") == 0
    interpreted = checksums(capsys.readouterr().out)
    assert run_softmax(*SHAPES, "--scalar", "num_tiles=8", "--compiled", "--check", "--runs", "2") == 0
    assert checksums(capsys.readouterr().out) == interpreted != []


def test_runs_the_llama_programs_flash_attention_on_3d_inputs(tmp_path, capsys):
    program = SOFTMAX.with_name("llama.pto")
    shapes = [f"--shape={name}=2x40x8" for name in ("q", "k", "v", "out")]
    assert cli.main(["run", str(program), "--entry", "flash_attention", *shapes, "--scalar", "tile=16",
                     "--scalar", "causal=1", "--check", "--save", str(tmp_path), "--backend", "cpu"]) == 0
    assert "flash_attention: 24 tasks" in capsys.readouterr().out  # 3 tiles: 2·3 + 3·6 pairs
    q, k, v = (np.load(tmp_path / f"{name}.in.npy").astype(np.float64) for name in "qkv")
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(8)
    scores[:, np.triu_indices(40, 1)[0], np.triu_indices(40, 1)[1]] = -np.inf
    weights = np.exp(scores - scores.max(axis=2, keepdims=True))
    expected = weights / weights.sum(axis=2, keepdims=True) @ v
    np.testing.assert_allclose(np.load(tmp_path / "out.out.npy"), expected, rtol=1e-4, atol=2e-5)


def test_check_exits_1_when_the_serial_run_differs(monkeypatch, capsys):
    class SerialOffByOne(pto.Runtime):
        def run(self, orchestration, *args, **kwargs):
            result = super().run(orchestration, *args, **kwargs)
            if self.executor == "serial":
                args[1][0, 0] += 1  # the output
            return result

    monkeypatch.setattr(cli, "Runtime", SerialOffByOne)
    assert run_softmax(*SHAPES, "--scalar", "num_tiles=8", "--check") == 1
    assert "check: not bitwise equal to the serial executor's result: output" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--shape", "input=64x64", "--scalar", "num_tiles=8"],
     "@dynamic_softmax: missing --shape output=ROWSxCOLS"),
    ([*SHAPES, "--shape", "bias=1x64", "--scalar", "num_tiles=8"],
     "--shape bias=1x64: @dynamic_softmax has no memref bias (its memrefs: input, output)"),
    (["--shape", "input=64by64", "--shape", "output=64x64", "--scalar", "num_tiles=8"],
     "--shape input=64by64: expected ROWSxCOLS (up to 4 dims), such as 64x64"),
    (["--shape", "input", "--shape", "output=64x64", "--scalar", "num_tiles=8"],
     "--shape input: expected NAME=ROWSxCOLS"),
    ([*SHAPES, "--shape", "input=8x64", "--scalar", "num_tiles=8"], "--shape input: given twice"),
    (SHAPES, "@dynamic_softmax: missing --scalar num_tiles=VALUE"),
    ([*SHAPES, "--scalar", "num_tiles=eight"], "--scalar num_tiles=eight: not a number of type int32"),
    ([*SHAPES, "--scalar", "num_tiles=8", "--entry", "softmax_tile"],
     "--entry softmax_tile: no Orchestration function @softmax_tile (it has: @dynamic_softmax)"),
    ([*SHAPES, "--scalar", "num_tiles=9"], "the window of %input for %input starts at (64, 0), outside"),
    ([*SHAPES, "--scalar", "num_tiles=9", "--compiled"], "the window of %input for %input starts outside"),
])
def test_bad_program_inputs_are_refused_by_name(options, message, capsys):
    assert run_softmax(*options) == 2
    assert message in capsys.readouterr().err


def test_a_file_with_several_orchestrations_needs_an_entry(tmp_path, capsys):
    text = SOFTMAX.read_text()
    path = tmp_path / "two.pto"
    again = text[text.index("// Function Type: Orchestration"):].replace("@dynamic_softmax", "@again")
    path.write_text(text + again)
    assert cli.main(["run", str(path), *SHAPES, "--scalar", "num_tiles=8", "--backend", "cpu"]) == 2
    assert "choose the Orchestration function with --entry (it has: @dynamic_softmax, @again)" in \
        capsys.readouterr().err
    assert cli.main(["run", str(path), *SHAPES, "--scalar", "num_tiles=1", "--entry", "again",
                     "--backend", "cpu"]) == 0
    assert "again: 1 tasks" in capsys.readouterr().out


def test_run_reports_a_pto_file_error_at_its_line_and_column_as_compile_does(tmp_path, capsys):
    path = tmp_path / "broken.pto"
    path.write_text(SOFTMAX.read_text().replace("trowmax %x", "trowmaxx %x"))
    assert cli.main(["run", str(path), *SHAPES, "--scalar", "num_tiles=8"]) == 2
    error = capsys.readouterr().err
    assert re.match(rf"pto-gpu: {re.escape(str(path))}:\d+:\d+: ", error)
    assert cli.main(["compile", str(path)]) == 2 and capsys.readouterr().err == error


def test_options_of_the_other_kind_of_run_are_refused():
    with pytest.raises(SystemExit, match="--size: only for a workload"):
        run_softmax(*SHAPES, "--scalar", "num_tiles=8", "--size", "64")
    with pytest.raises(SystemExit, match="--shape, --compiled: only for a FILE.pto"):
        cli.main(["run", "softmax", "--shape", "x=1x1", "--compiled"])
