"""Run under mpiexec (tests/test_mpi.py): one distributed case, checked on rank 0 against one
process's serial run. Prints "OK <case> <ranks>" on rank 0 when every check holds.

    mpiexec -n 2 python -m tests.mpi_programs.cases parallel matmul stencil flash

Each case runs twice: recorded, then not (where compiled code places tasks itself:
jit/placing.py). Checks: each output row block of both runs, from its owner, bitwise equal to
the serial executor's; every rank's recorded graph equal to the serial run's; placement's
counts (tasks, tasks by rank, bytes written and moved) the same on every rank in both runs; the
ranks' executed tasks a partition of the graph; each rank's bytes sent and received equal to
the count worked out from the case. The "compiled*" cases submit from compiled code (the
generated orchestration of programs/matmul.pto, and a hand-written body of strided views),
whose unrecorded runs place most of their tasks in compiled code.
"""

from __future__ import annotations

import sys

import numba
import numpy as np
from mpi4py import MPI
from pto_gpu.orchestration.cholesky import cholesky, grid
from pto_gpu.orchestration.flash_attention import flash_attention_heads
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled
from pto_gpu.orchestration.stencil import stencil

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.distributed.ownership import element_owners
from pto_gpu.jit import bridge, host


def matmul(size: int):
    n, tile = 256, 32
    rng = np.random.default_rng(1)
    arrays = (rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32),
              np.zeros((n, n), np.float32))
    # Each rank receives the B rows the others own, once, and sends its own to each other rank.
    block = n // size * n * 4
    expected = [((size - 1) * block, n * n * 4 - block)] * size
    return tiled_matmul, arrays, (tile,), [2], expected


def compiled_case(size: int):
    """programs/matmul.pto's generated orchestration (its accumulators owned with their C
    tiles: `alloc ... owner %c_tile`)."""
    _, arrays, extra, outputs, expected = matmul(size)
    return tiled_matmul_compiled, arrays, extra, outputs, expected


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


@pto.kernel(worker=pto.VECTOR)
def axpy_any(x, y, out):
    out[...] = 2 * x + y


@numba.njit
def _columns(desc, parity):
    """Every other column of a matrix, from column `parity`: a (rows, columns / 2, 1) view."""
    return pj.narrow(pj.split(desc, 1, 2), 2, parity, parity + 1)


@numba.njit(nogil=True)
def spread_body(o, x, y, z, axpy_id):
    pj.submit(o, axpy_id, (pj.input(_columns(x, 0)), pj.input(_columns(y, 0)), pj.output(_columns(z, 0))))
    pj.submit(o, axpy_id, (pj.input(_columns(z, 0)), pj.input(_columns(x, 1)), pj.output(_columns(z, 1))))
    pj.submit(o, axpy_id, (pj.input(pj.narrow(z, 0, 4, 12)), pj.input(pj.narrow(y, 0, 4, 12)),
                           pj.output(pj.narrow(x, 0, 4, 12))))


def compiled_spread(o: pto.Orchestrator, x, y, z) -> None:
    """spread's reads and writes (but the second task's rank=) from compiled code: strided
    regions, reads spanning owners, a table split by rows of 3."""
    X = o.external(x, owner=pto.block_cyclic(3, o.ranks))
    Y = o.external(y, owner=o.ranks - 1)
    Z = o.external(z, owner=pto.block_rows(o.ranks))
    o.compiled(spread_body, X, Y, Z, axpy_any.id)


def compiled_spread_case(size: int):
    _, arrays, extra, outputs, expected = spread_case(size)
    return compiled_spread, arrays, extra, outputs, expected


@pto.kernel(worker=pto.VECTOR)
def bump(x):
    x += 1


@numba.njit(nogil=True)
def read_body(o, k, m, axpy_id):
    pj.submit(o, axpy_id, (pj.input(k), pj.input(k), pj.output(m)))


def rewrite_between(o: pto.Orchestrator, k, m, out) -> None:
    """Rank 0 writes k from Python, rank 1 reads it from compiled code, rank 0 rewrites it from
    Python, and rank 1 reads it again: its first copy is stale, so it moves twice. The other
    ranks (on 3 or more) place the first read in compiled code (it moves nothing of theirs) and
    must still see the rewrite (which Holdings skips only when nothing changed since the last
    write)."""
    reader = min(1, o.ranks - 1)
    K = o.external(k, owner=0)
    M, OUT = o.external(m, owner=reader), o.external(out, owner=reader)
    o.submit(bump, pto.inout(K))
    o.compiled(read_body, K, M, axpy_any.id)
    o.submit(bump, pto.inout(K))
    o.submit(axpy_any, pto.input(K), pto.input(K), pto.output(OUT))


def rewrite_case(size: int):
    rng = np.random.default_rng(6)
    arrays = tuple(rng.standard_normal((8, 4)) for _ in range(3))
    moved = 2 * 8 * 4 * 8 if size > 1 else 0  # k to rank 1, twice
    expected = [(moved, 0), (0, moved)] + [(0, 0)] * (size - 2) if size > 1 else [(0, 0)]
    return rewrite_between, arrays, (), [0, 1, 2], expected


@numba.njit(nogil=True)
def versioned_body(o, x, y, axpy_id):
    rows = pj.shape(x, 0)
    pj.submit(o, axpy_id, (pj.input(pj.narrow(x, 0, rows - 1, rows)), pj.input(pj.narrow(y, 0, 0, 1)),
                           pj.output(pj.narrow(pj.version_inc(o, x), 0, 0, 1))))


def versioned(o: pto.Orchestrator, x, y) -> None:
    """From compiled code, x's first row at x's next version = 2 x's last row + y's first
    row: a task that receives a row of one buffer (the last rank's) and writes another row of
    it, on rank 0, placed with its transfer by compiled code."""
    X = o.external(x, owner=pto.block_cyclic(1, o.ranks))
    Y = o.external(y, owner=pto.block_cyclic(1, o.ranks))
    o.compiled(versioned_body, X, Y, axpy_any.id)


def versioned_case(size: int):
    rng = np.random.default_rng(7)
    arrays = tuple(rng.standard_normal((8, 4)) for _ in range(2))
    last = 7 % size  # the owner of x's last row, which rank 0 receives
    expected = [(0, 0)] * size
    if last:
        expected[0], expected[last] = (0, 4 * 8), (4 * 8, 0)
    return versioned, arrays, (), [0], expected


@numba.njit(nogil=True)
def heap_body(o, x, out, axpy_id):
    """Two heap tiles whose tables compiled placement keeps itself: t, rank 0's, = 3 x's
    first rows, read whole on the last rank; u, the default owner's (the last rank: o.on_rank
    around the call), = 3 x's last rows, read whole on rank 0 (both placed with their
    transfers by compiled code), then its first row again (a region that cuts u's one-entry
    table: Python's placement, which adopts u with what compiled code did to it, so that
    nothing moves again), and freed. t is returned, adopted as the body returns."""
    rows = pj.shape(x, 0)
    t = pj.alloc(o, (2, pj.shape(x, 1)), pj.dtype(x), 0)
    pj.submit(o, axpy_id, (pj.input(pj.narrow(x, 0, 0, 2)), pj.input(pj.narrow(x, 0, 0, 2)), pj.output(t)))
    pj.submit(o, axpy_id, (pj.input(t), pj.input(pj.narrow(x, 0, rows - 2, rows)),
                           pj.output(pj.narrow(out, 0, rows - 2, rows))))
    u = pj.alloc(o, (2, pj.shape(x, 1)), pj.dtype(x))
    last = pj.narrow(x, 0, rows - 2, rows)
    pj.submit(o, axpy_id, (pj.input(last), pj.input(last), pj.output(u)))
    pj.submit(o, axpy_id, (pj.input(u), pj.input(pj.narrow(x, 0, 0, 2)), pj.output(pj.narrow(out, 0, 0, 2))))
    first_row = pj.narrow(out, 0, 0, 1)
    pj.submit(o, axpy_id, (pj.input(pj.narrow(u, 0, 0, 1)), pj.input(first_row), pj.output(first_row)))
    pj.free(o, u)
    return t


@numba.njit(nogil=True)
def heap_again_body(o, t, out, axpy_id):
    """The tile back in compiled code, adopted: its last row read on the last rank (Python's
    placement: the tile's table is cut; nothing moves again), then freed."""
    rows = pj.shape(out, 0)
    last_row = pj.narrow(out, 0, rows - 1, rows)
    pj.submit(o, axpy_id, (pj.input(pj.narrow(t, 0, 1, 2)), pj.input(last_row), pj.output(last_row)))
    pj.free(o, t)


def heap_tiles(o: pto.Orchestrator, x, out) -> None:
    X = o.external(x, owner=pto.block_rows(o.ranks))
    OUT = o.external(out, owner=pto.block_rows(o.ranks))
    for row in range(x.shape[0]):  # (tables by rows, which compiled code then places on)
        o.submit(axpy_any, pto.input(X[row]), pto.input(X[row]), pto.output(OUT[row]))
    with o.on_rank(o.ranks - 1):
        t = o.compiled(heap_body, X, OUT, axpy_any.id)
    o.external(np.zeros(4), owner=0)  # (another external: the next call's session grows its tables)
    o.compiled(heap_again_body, t, OUT, axpy_any.id)


def heap_case(size: int):
    rng = np.random.default_rng(8)
    arrays = (rng.standard_normal((8, 4)), np.zeros((8, 4)))
    tile = 2 * 4 * 8  # t, once, from rank 0 to the last; u, once, back
    expected = [(tile, tile)] + [(0, 0)] * (size - 2) + [(tile, tile)] if size > 1 else [(0, 0)]
    return heap_tiles, arrays, (), [1], expected


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
    other ranks' tasks too, completed unrun as they become ready."""
    return matmul(size)


def cholesky_scheduled(size: int):
    """cholesky_case under the critical-path schedule, over every rank's tasks: each rank's core
    holds the others' tasks too, completed unrun as they become ready."""
    return cholesky_case(size)


def compiled_scheduled(size: int):
    """compiled_case under the critical-path schedule: every submit of the compiled body is
    placed by Python, which enters the other ranks' tasks too, and its tile products queue for
    Python workers."""
    return compiled_case(size)


CASES = {"matmul": matmul, "stencil": stencil_case, "flash": flash, "spread": spread_case,
         "pressed": matmul_pressed, "scheduled": matmul_scheduled, "cholesky": cholesky_case,
         "compiled": compiled_case, "compiled-pressed": compiled_case,
         "compiled-spread": compiled_spread_case, "compiled-rewrite": rewrite_case,
         "compiled-versioned": versioned_case, "compiled-heap": heap_case,
         "scheduled-cholesky": cholesky_scheduled, "compiled-scheduled": compiled_scheduled}
SETTINGS = {"pressed": ({"task_window": 16}, {"threshold": 4}),  # Runtime's, run's
            "compiled-pressed": ({"task_window": 16}, {"threshold": 4}),
            "scheduled": ({}, {"schedule": pto.Schedule(max_concurrent={"batch": 2})}),
            "scheduled-cholesky": ({}, {"schedule": pto.Schedule()}),
            "compiled-scheduled": ({}, {"schedule": pto.Schedule()})}


def _count_allocations() -> list[int]:
    """The heap buffers compiled code tells Python it allocated (SERVICE_ALLOCATED), from now
    on: a list the caller clears."""
    told: list[int] = []
    service = host.Session.service

    def counted(session, code, a, b, c):
        if code == bridge.SERVICE_ALLOCATED:
            told.append(a)
        return service(session, code, a, b, c)

    host.Session.service = counted
    return told


ALLOCATED = _count_allocations()  # (this program's cases, each run: `main` clears it)


def owners(orchestration, index: int, shape: tuple[int, ...], size: int) -> np.ndarray:
    """The rank owning each element of the orchestration's output `index`."""
    if orchestration in (spread, compiled_spread) and index == 0:
        owner = pto.block_cyclic(3, size)
    elif orchestration is cholesky:
        owner = pto.block_cyclic_2d(64, 64, grid(size))
    elif orchestration is versioned:
        owner = pto.block_cyclic(1, size)
    elif orchestration is rewrite_between:
        owner = 0 if index == 0 else min(1, size - 1)
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
    # The second run starts from the owner tables the first made (Placement._track), and is not
    # recorded, so compiled code places what it can itself (jit/placing.py).
    results, graph, counts = [], None, []
    for record in (True, False):
        ALLOCATED.clear()
        inputs = [a.copy() for a in arrays]
        result = rt.run(orchestration, *inputs, *extra, record=record, **options)
        results.append([inputs[i] for i in outputs])
        placement = rt.placement
        counts.append((result.num_tasks, placement.placed, placement.bytes_written, placement.bytes_moved))
        if record:
            graph = graph_of(result)
    # Whether MPI has MPICH's ABI (the pip wheel's: native code posts transfers), on every rank
    native_mpi = rt.placement.transport.native is not None
    mine = (results, graph, result.ranks, result.native_tasks, counts, native_mpi, len(ALLOCATED))
    gathered = comm.gather(mine, root=0)
    if rank != 0:
        return
    reference = [a.copy() for a in arrays]
    serial = pto.Runtime(backend="cpu", executor="serial").run(orchestration, *reference, *extra, record=True)
    for position, index in enumerate(outputs):
        held_by = owners(orchestration, index, reference[index].shape, size)
        for owner in range(size):
            mine = held_by == owner
            for recorded, got in zip((True, False), gathered[owner][0]):
                assert np.array_equal(got[position][mine], reference[index][mine]), \
                    f"output {index}, elements of rank {owner}: differ from serial (recorded: {recorded})"
    want_graph = graph_of(serial)
    for owner, (_, graph, *_) in enumerate(gathered):
        assert graph == want_graph, f"rank {owner}'s recorded graph differs from the serial run's"
    # What placement counts (tasks, by rank, bytes written and moved): every rank and both runs
    # alike, whether Python (recorded) or compiled code (not) placed them.
    counted = [run for *_, counts, _, _ in gathered for run in counts]
    assert counted == [counted[0]] * (2 * size) and counted[0][0] == serial.num_tasks, \
        f"placement's counts by rank and run: {counted}; {serial.num_tasks} tasks"
    runs = [ranks.tasks_run for _, _, ranks, *_ in gathered]
    assert sorted(t for ran in runs for t in ran) == list(range(serial.num_tasks)), \
        f"the ranks' executed tasks {[len(r) for r in runs]} are not a partition of {serial.num_tasks} tasks"
    moved = [(ranks.bytes_sent, ranks.bytes_received) for _, _, ranks, *_ in gathered]
    assert expected is None or moved == expected, f"bytes (sent, received) by rank: {moved}, not {expected}"
    if case in ("compiled", "compiled-pressed", "compiled-versioned"):  # (compiled-spread's: any count)
        # Compiled code placed the unrecorded run's tasks itself, but for those that first cut
        # an external array's holdings into tiles (the matmul's 3 arrays), and, unless native
        # workers post them, those that move data to or from its rank.
        placed = [ranks.placed_by_compiled_code for _, _, ranks, *_ in gathered]
        native_transfers = executor == "parallel" and all(abi for *_, abi, _ in gathered)
        if case == "compiled-versioned":  # (on one rank its row cuts the one owner's table)
            least = 1 if size > 1 and native_transfers else 0
        else:
            least = serial.num_tasks - 3 if size == 1 or native_transfers else 1
        assert all(least <= count <= serial.num_tasks for count in placed), \
            f"tasks placed by compiled code, by rank: {placed} of {serial.num_tasks}"
    if case in ("compiled", "compiled-pressed", "compiled-heap"):
        # Compiled placement keeps its heap tiles' tables itself (jit/placing.hold_allocated):
        # the Python placer hears of one only when it places a task that uses it.
        told = [count for *_, count in gathered]
        assert told == [0] * size, f"heap tiles compiled code allocated that Python heard of, by rank: {told}"
    if case == "compiled-heap" and executor == "parallel" and all(abi for *_, abi, _ in gathered):
        # both tiles written and read whole, the reads with their transfers (native workers'):
        # placed by compiled code on every rank
        placed = [ranks.placed_by_compiled_code for _, _, ranks, *_ in gathered]
        assert placed == [4] * size, f"tasks placed by compiled code, by rank: {placed}"
    if executor == "parallel" and case in ("matmul", "compiled"):  # tile products on native workers
        native = [count for *_, count, _, _, _ in gathered]
        assert all(0 < count <= len(ran) for count, ran in zip(native, runs)), \
            f"native tasks by rank {native} of {[len(r) for r in runs]} run"
        # whole tiles, each read whole: every transfer posted by native code where MPI has
        # MPICH's ABI, else none
        transfers = [(ranks.native_transfers, ranks.transfers, abi)
                     for _, _, ranks, *_, abi, _ in gathered]
        assert all(posted == (count if abi else 0) and (count > 0) == (size > 1)
                   for posted, count, abi in transfers), \
            f"transfers posted by native code, of all, and MPICH's ABI, by rank: {transfers}"
    if executor == "parallel" and case in ("scheduled", "scheduled-cholesky", "compiled-scheduled"):
        # A schedule orders every task in Python's queues: none on native workers, and no
        # transfer posted by native code.
        native = [(count, ranks.native_transfers) for _, _, ranks, count, *_ in gathered]
        assert native == [(0, 0)] * size, f"native tasks and native transfers by rank: {native}"
    if case == "compiled-scheduled":  # (compiled placement leaves other ranks' tasks out)
        placed = [ranks.placed_by_compiled_code for _, _, ranks, *_ in gathered]
        assert placed == [0] * size, f"tasks placed by compiled code under a critical path, by rank: {placed}"
    print(f"OK {case} {size}", flush=True)


if __name__ == "__main__":
    for name in sys.argv[2:]:
        main(name, sys.argv[1])
