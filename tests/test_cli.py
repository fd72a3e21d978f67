"""The `pto-gpu` command runs every orchestration, checks it, and writes the artefacts it is asked for."""

import dataclasses
import importlib.metadata
import io
import json
import re
import threading

import numpy as np
import pytest
from pto_gpu.kernels.tiles import zero
from pto_gpu.orchestration import cli

import pto_gpu as pto


@pytest.mark.parametrize("name", sorted(cli.WORKLOADS))
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
    strict = dataclasses.replace(cli.WORKLOADS["matmul"], tolerance=0.0)  # float32 never equals float64
    monkeypatch.setitem(cli.WORKLOADS, "matmul", strict)
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
    text = cli.parser()._subparsers._group_actions[0].choices["run"].format_help()
    for option in ("--size", "--backend", "--executor", "--trace", "--dump", "--graph", "--runs"):
        assert option in text
    assert all(name in text for name in cli.WORKLOADS)


def test_installed_as_the_pto_gpu_console_script():
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert scripts["pto-gpu"].value == "pto_gpu.orchestration.cli:main"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeRuntime:
    progress = (3, 4)


def test_progress_bar_draws_on_a_terminal_only():
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        started = threading.Event()
        with cli.progress_bar(FakeRuntime(), stream, delay=0, every=0.01):
            started.wait(0.1)  # a few redraws
        assert ("3 / 4 tasks" in stream.getvalue()) == drawn
        assert not drawn or stream.getvalue().endswith("\r\033[K")  # the bar's line is cleared


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
