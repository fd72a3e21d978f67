"""Run under mpiexec (tests/test_mpi.py): the critical-path schedule weighs every rank's tasks.

    mpiexec -n 2 python -m tests.mpi_programs.critical_path

Rank 0 has two tasks ready when its worker starts: `leaf` (cost 10), which nothing reads, and
`head` (cost 1), whose result rank 1 reads and goes on from with a chain of CHAIN tasks of
cost 5. Counting its own tasks only, rank 0 would run the leaf first (10 against the head and
its send: 2 at the default cost of a task without a model); over the whole graph the head
comes first (1 + 5 CHAIN). Rank 0 prints the order its tasks started in ("ORDER head leaf"),
then "CHAIN OK": every rank's rows are what one process computes.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import pto_gpu as pto

CHAIN = 5
started: list[str] = []


@pto.kernel(worker=pto.CUBE, cost=lambda x: 10.0)
def leaf(x):
    started.append("leaf")
    x += 1


@pto.kernel(worker=pto.CUBE, cost=lambda x: 1.0)
def head(x):
    started.append("head")
    x[...] = 2


@pto.kernel(worker=pto.CUBE, cost=lambda x, y: 5.0)
def step(x, y):
    y += x


def graph(o: pto.Orchestrator, a) -> None:
    """a's row 0 is rank 0's, row 1 rank 1's (with 2 ranks)."""
    A = o.external(a, owner=pto.block_rows(o.ranks))
    o.submit(leaf, pto.inout(A[0:1, 0:4]))  # submitted first: a tie would go to it
    o.submit(head, pto.output(A[0:1, 4:8]))
    for _ in range(CHAIN):
        o.submit(step, pto.input(A[0:1, 4:8]), pto.inout(A[1:2, 0:4]))


def main() -> None:
    comm = MPI.COMM_WORLD
    rt = pto.Runtime(backend="cpu", comm=comm, workers={pto.CUBE: 1, pto.VECTOR: 1, pto.AI_CPU: 1})
    a = np.zeros((2, 8))
    rt.run(graph, a, schedule=pto.Schedule())
    order = list(started)
    expected = np.zeros((2, 8))
    pto.Runtime(backend="cpu", executor="serial").run(graph, expected)
    mine = pto.block_rows(comm.size).row_owners(2) == comm.rank
    assert np.array_equal(a[mine], expected[mine]), f"rank {comm.rank}: {a[mine]} != {expected[mine]}"
    orders = comm.gather(order, root=0)  # one rank prints: two ranks' lines can interleave
    if comm.rank == 0:
        print(f"ORDER {' '.join(orders[0])}\nCHAIN OK", flush=True)


if __name__ == "__main__":
    main()
