"""README's Python examples run as written: each ```python block in a fresh interpreter, and
the MPI one also on two ranks with the venv's mpiexec (the mpich wheel's launcher)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_mpi import MPIEXEC

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def run(command: list[str], folder: Path) -> str:
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_readme_has_the_examples_this_file_runs():
    assert len(BLOCKS) >= 2 and sum("MPI.COMM_WORLD" in block for block in BLOCKS) == 1


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_example_runs_as_written(index, tmp_path):
    (tmp_path / "example.py").write_text(BLOCKS[index])
    out = run([sys.executable, "example.py"], tmp_path)
    assert out.strip()  # every example prints what it found


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich mpi4py)")
def test_the_mpi_example_runs_on_two_ranks(tmp_path):
    (tmp_path / "mpi_example.py").write_text(next(b for b in BLOCKS if "MPI.COMM_WORLD" in b))
    out = run([MPIEXEC, "-n", "2", sys.executable, "mpi_example.py"], tmp_path)
    # rank 0 prints each rank's (rank, tasks it ran, bytes it sent): the four row tiles split
    shares = ast.literal_eval(out.strip())
    assert [(rank, tasks) for rank, tasks, _ in shares] == [(0, 2), (1, 2)]
