"""Distributed runs (Runtime(comm=...)) on 1, 2 and 4 MPI ranks of this machine.

Each test starts `mpiexec -n N python -m tests.mpi_programs....` (the programs check the
results on rank 0 and print what they found): results bitwise equal to the serial executor,
every rank's graph the serial run's, the executed tasks a partition, bytes as counted;
DistArrays holding each rank's rows only; and a failure on one rank raising on every rank
within seconds, after which the Runtime still runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The mpich wheel's launcher sits beside the interpreter in a virtual environment.
MPIEXEC = next((str(p) for p in (Path(sys.executable).parent / "mpiexec",) if p.exists()),
               shutil.which("mpiexec"))

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich mpi4py)")


def mpiexec(ranks: int, module: str, *args: str, timeout: float = 120, bind: bool = False) -> str:
    """`bind`: each rank bound to a core of its own (`-bind-to core`)."""
    binding = ["-bind-to", "core"] if bind else []
    command = [MPIEXEC, *binding, "-n", str(ranks), sys.executable, "-m", module, *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_cases_match_the_serial_executor(ranks):
    cases = ("matmul", "stencil", "flash", "spread", "pressed", "scheduled", "scheduled-cholesky", "cholesky",
             "compiled", "compiled-pressed", "compiled-spread", "compiled-rewrite", "compiled-versioned",
             "compiled-heap", "compiled-scheduled")
    # (every rank compiles the cases' compiled bodies, uncached: 4 ranks took 215 s with every
    # numba cache cold and other tests running beside them)
    out = mpiexec(ranks, "tests.mpi_programs.cases", "parallel", *cases, timeout=300)
    for case in cases:
        assert f"OK {case} {ranks}" in out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks of a core each need two cores")
def test_cases_match_the_serial_executor_on_ranks_of_one_core():
    """Each rank bound to one core, as MPI runs are launched for speed: its workers poll for
    arrivals between their tasks while one of them computes, and only an idle one holds the
    poll (ParallelExecutor._poll_wanted_locked), where unbound ranks see every core."""
    probe = [MPIEXEC, "-bind-to", "core", "-n", "2", sys.executable, "-m", "tests.mpi_programs.cores"]
    found = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if sorted(re.findall(r"CORES (\d+)", found.stdout)) != ["1", "1"]:
        pytest.skip(f"mpiexec -bind-to core gave the ranks other cores here: {found.stdout} {found.stderr}")
    cases = ("matmul", "spread", "cholesky", "compiled", "compiled-rewrite")
    out = mpiexec(2, "tests.mpi_programs.cases", "parallel", *cases, bind=True)
    for case in cases:
        assert f"OK {case} 2" in out


def test_a_critical_path_schedule_weighs_the_tasks_of_every_rank():
    """Rank 0 runs first the task another rank's long chain waits for, not its own costlier
    leaf, which it would were its critical paths those of its own tasks."""
    out = mpiexec(2, "tests.mpi_programs.critical_path")
    assert "ORDER head leaf" in out and "CHAIN OK" in out, out


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_dist_arrays_hold_their_rows_and_match_one_process(ranks):
    out = mpiexec(ranks, "tests.mpi_programs.dist_arrays")
    assert f"OK dist {ranks}" in out, out
    held = [tuple(map(int, line)) for line in re.findall(r"MEMORY (\d+) (\d+) (\d+) (\d+)", out)]
    assert sorted(rank for rank, *_ in held) == list(range(ranks)), out
    whole = 3 * 256 * 256 * 4  # the matmul's three 256² float32 DistArrays
    for rank, share, after_scatter, after_run in held:
        # a rank's share of rows and no more: of a and b after scatter (c untouched yet), of all
        # three after the run (the rows of b it received given back)
        assert share == whole // ranks and after_scatter == 2 * share // 3 and after_run == share, \
            (rank, share, after_scatter, after_run)


def test_native_transfers_move_what_python_packs_and_cancel_cleanly():
    out = mpiexec(1, "tests.mpi_programs.native_transfers")
    assert "OK native-transfers" in out, out


def test_serial_executor_on_each_rank():
    out = mpiexec(2, "tests.mpi_programs.cases", "serial", "matmul", "spread", "compiled")
    assert "OK matmul 2" in out and "OK spread 2" in out and "OK compiled 2" in out


@pytest.mark.parametrize("ranks, mode", [(2, "kernel"), (4, "kernel"), (2, "receiving"), (2, "sending"),
                                         (2, "read-only"), (2, "orchestration")])
def test_a_failure_on_one_rank_raises_on_every_rank(ranks, mode):
    out = mpiexec(ranks, "tests.mpi_programs.failure", mode, timeout=60)
    raised = dict((int(rank), (error, task, cause, float(seconds))) for rank, error, task, cause, seconds
                  in re.findall(r"RAISED (\d+) (\w+) (\S+) (\S+) ([\d.]+)", out))
    assert sorted(raised) == list(range(ranks)), out
    last = ranks - 1
    if mode != "orchestration":  # the same TaskError everywhere: the task that failed on the last rank
        assert {error for error, _, _, _ in raised.values()} == {"TaskError"}, out
        assert len({task for _, task, _, _ in raised.values()}) == 1, out
        # chained as in one process: the kernel's exception there, the failing rank's news elsewhere
        assert raised[last][2] == "ValueError", out
        assert all(raised[r][2] == "RankError" for r in range(last)), out
    else:  # the last rank's own error; the others are told of it
        assert raised[last][0] == "RuntimeError", out
        assert all(raised[r][0] == "RankError" for r in range(last)), out
    # The failing program works 0.6 s before the failure; waiting ranks give up at once.
    assert max(seconds for _, _, _, seconds in raised.values()) < 10, out
    assert len(re.findall(r"AGAIN \d+ OK", out)) == ranks, out


@pytest.mark.parametrize("name, size", [("matmul", 512), ("stencil", 256), ("flash_attention_heads", 128)])
def test_the_command_runs_a_workload_over_the_ranks_and_merges_their_traces(name, size, tmp_path):
    trace = tmp_path / "run.json"
    out = mpiexec(2, "pto_gpu", "run", name, "--ranks", "--size", str(size), "--backend", "cpu",
                  "--trace", str(trace))
    assert "(OK, tolerance" in out and "rank 1: ran" in out
    merged = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert names == {"rank 0", "rank 1"}
    ran = {pid: sum(e["ph"] == "X" and e["name"] not in ("send", "recv") for e in merged if e["pid"] == pid)
           for pid in (1, 2)}
    tasks = int(re.search(r": ([\d,]+) tasks", out).group(1).replace(",", ""))
    assert sum(ran.values()) == tasks and all(ran.values())
