"""Run under mpiexec (tests/test_mpi.py): one distributed case, checked on rank 0 against one
process's serial run. Prints "OK <case> <ranks>" on rank 0 when every check holds.

    mpiexec -n 2 python -m tests.mpi_programs.cases parallel matmul stencil flash

Checks: each output row block, from its owner, bitwise equal to the serial executor's; every
rank's recorded graph equal to the serial run's; the ranks' executed tasks a partition of the
graph; each rank's bytes sent and received equal to the count worked out from the case.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI
from pto_gpu.orchestration.cholesky import cholesky, grid
from pto_gpu.orchestration.flash_attention import flash_attention_heads
from pto_gpu.orchestration.matmul import tiled_matmul
from pto_gpu.orchestration.stencil import stencil

import pto_gpu as pto
from pto_gpu.distributed.ownership import element_owners


def matmul(size: int):
    n, tile = 256, 32
    rng = np.random.default_rng(1)
    arrays = (rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32),
              np.zeros((n, n), np.float32))
    # Each rank receives the B rows the others own, once, and sends its own to each other rank.
    block = n // size * n * 4
    expected = [((size - 1) * block, n * n * 4 - block)] * size
    return tiled_matmul, arrays, (tile,), [2], expected


def stencil_case(size: int):
    n, steps = 4096, 5
    arrays = (np.random.default_rng(2).standard_normal(n), np.zeros(n))
    # Per step, one halo element each way across each boundary between ranks.
    inner = [(rank > 0) + (rank < size - 1) for rank in range(size)]
    expected = [(steps * 8 * k, steps * 8 * k) for k in inner]
    return stencil, arrays, (steps, 512), [1], expected


def flash(size: int):
    heads, seq, dim = 4, 128, 32
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((heads, seq, dim), np.float32) for _ in range(3))
    # Every head's tasks run where its rows are: nothing moves.
    return flash_attention_heads, (q, k, v, np.zeros_like(q)), (64,), [3], [(0, 0)] * size


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
def axpy(x, y, out):
    out[...] = 2 * x + y


def spread(o: pto.Orchestrator, x, y, z) -> None:
    """Reads spanning several owners (one masked transfer per source), strided columns (packed),
    a task placed off its owner with rank= (the owner gets the result back at the end), and
    rows dealt block-cyclically."""
    X = o.external(x, owner=pto.block_cyclic(3, o.ranks))
    Y = o.external(y, owner=o.ranks - 1)
    Z = o.external(z, owner=pto.block_rows(o.ranks))
    o.submit(axpy, pto.input(X[:, ::2]), pto.input(Y[:, ::2]), pto.output(Z[:, ::2]))
    o.submit(axpy, pto.input(Z[:, ::2]), pto.input(X[:, 1::2]), pto.output(Z[:, 1::2]), rank=o.ranks - 1)
    o.submit(axpy, pto.input(Z[4:12]), pto.input(Y[4:12]), pto.output(X[4:12]))


def spread_case(size: int):
    rng = np.random.default_rng(4)
    arrays = tuple(rng.standard_normal((24, 6)) for _ in range(3))
    return spread, arrays, (), [0, 2], None  # bytes: the other cases count them


def cholesky_case(size: int):
    """A 384² tiled Cholesky in 64² tiles dealt over a 2-D grid of the ranks (2 x 2 on 4)."""
    n = 384
    m = np.random.default_rng(5).standard_normal((n, n))
    return cholesky, (m @ m.T + n * np.eye(n),), (64,), [0], None


def matmul_pressed(size: int):
    """matmul with a task window of 16 and tasks starting 4 at a time: ranks stall on a full
    ring while their transfers wait."""
    return matmul(size)


def matmul_scheduled(size: int):
    """matmul under a schedule with a max_concurrent window: every rank's core then holds the
    other ranks' tasks too, and transfers queue for workers instead of running at submission."""
    return matmul(size)


CASES = {"matmul": matmul, "stencil": stencil_case, "flash": flash, "spread": spread_case,
         "pressed": matmul_pressed, "scheduled": matmul_scheduled, "cholesky": cholesky_case}
SETTINGS = {"pressed": ({"task_window": 16}, {"threshold": 4}),  # Runtime's, run's
            "scheduled": ({}, {"schedule": pto.Schedule(max_concurrent={"batch": 2})})}


def owners(orchestration, index: int, shape: tuple[int, ...], size: int) -> np.ndarray:
    """The rank owning each element of the orchestration's output `index`."""
    if orchestration is spread and index == 0:
        owner = pto.block_cyclic(3, size)
    elif orchestration is cholesky:
        owner = pto.block_cyclic_2d(64, 64, grid(size))
    else:
        owner = pto.block_rows(size)
    return np.broadcast_to(element_owners(owner, shape, size, "output"), shape)


def graph_of(result: pto.RunResult) -> tuple:
    return ([(t.id, t.kernel.name) for t in result.graph.tasks], sorted(result.graph.edges))


def main(case: str, executor: str) -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    orchestration, arrays, extra, outputs, expected = CASES[case](size)
    settings, options = SETTINGS.get(case, ({}, {}))
    rt = pto.Runtime(backend="cpu", executor=executor, comm=comm,
                     workers={pto.CUBE: 1, pto.VECTOR: 1, pto.AI_CPU: 1}, **settings)
    for _ in range(2):  # the second run starts from the owner tables the first made (Placement._track)
        inputs = [a.copy() for a in arrays]
        result = rt.run(orchestration, *inputs, *extra, record=True, **options)
    mine = ([inputs[i] for i in outputs], graph_of(result), result.ranks, result.native_tasks)
    gathered = comm.gather(mine, root=0)
    if rank != 0:
        return
    reference = [a.copy() for a in arrays]
    serial = pto.Runtime(backend="cpu", executor="serial").run(orchestration, *reference, *extra, record=True)
    for position, index in enumerate(outputs):
        held_by = owners(orchestration, index, reference[index].shape, size)
        for owner in range(size):
            mine = held_by == owner
            got, want = gathered[owner][0][position][mine], reference[index][mine]
            assert np.array_equal(got, want), f"output {index}, elements of rank {owner}: differ from serial"
    want_graph = graph_of(serial)
    for owner, (_, graph, _, _) in enumerate(gathered):
        assert graph == want_graph, f"rank {owner}'s recorded graph differs from the serial run's"
    runs = [ranks.tasks_run for _, _, ranks, _ in gathered]
    assert sorted(t for ran in runs for t in ran) == list(range(serial.num_tasks)), \
        f"the ranks' executed tasks {[len(r) for r in runs]} are not a partition of {serial.num_tasks} tasks"
    moved = [(ranks.bytes_sent, ranks.bytes_received) for _, _, ranks, _ in gathered]
    assert expected is None or moved == expected, f"bytes (sent, received) by rank: {moved}, not {expected}"
    if executor == "parallel" and case == "matmul":  # each rank's tile products on its native workers
        native = [count for *_, count in gathered]
        assert all(0 < count <= len(ran) for count, ran in zip(native, runs)), \
            f"native tasks by rank {native} of {[len(r) for r in runs]} run"
    print(f"OK {case} {size}", flush=True)


if __name__ == "__main__":
    for name in sys.argv[2:]:
        main(name, sys.argv[1])
