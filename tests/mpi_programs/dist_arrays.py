"""Run under mpiexec (tests/test_mpi.py): pto.DistArray on every rank of COMM_WORLD. Prints
"OK dist <ranks>" on rank 0 when every check holds, and each rank's "MEMORY <rank> <share>
<after scatter> <after run>" (bytes of the arrays it holds).

    mpiexec -n 2 python -m tests.mpi_programs.dist_arrays

Checks: scatter then gather is the array (float32, and bfloat16 in blocks of 5 rows); each
rank's `.local` blocks are the rows its distribution gives it, and the ranks' blocks partition
the rows; the tiled matmul over
DistArrays in block rows, from Python and from compiled code, gathered, is bitwise the serial
executor's on whole arrays; an
orchestration over block-cyclic DistArrays reading other ranks' rows is bitwise numpy's; each
rank holds its share of the arrays' memory (and a page per block edge) after scatter and
after a run (the rows it received given back); a scatter whose root passes no array raises
on every rank; an owner other than the array's, and a DistArray of another communicator
size, are RankErrors naming the array, and a heap tile's owner out of range in compiled
code one naming the owner; a run that leaves
ranks without a task warns once per Runtime, naming them, and so does one that moves more
between ranks than its tasks write.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numba
import numpy as np
from mpi4py import MPI
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.distributed.dist_array import PAGE

N, TILE = 256, 32


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
def axpy(x, y, out):
    out[...] = 2 * x + y


def shifted_axpy(o: pto.Orchestrator, x, y, out, tile: int) -> None:
    """out[i] = 2 x[i] + y[i + 1] by tiles of rows: each tile reads the next one of y, which
    another rank owns where the rows are dealt block-cyclically by tiles."""
    X, Y, OUT = o.external(x), o.external(y), o.external(out)
    rows = X.shape[0]
    for i in range(0, rows, tile):
        j = (i + tile) % rows
        o.submit(axpy, pto.input(X[i:i + tile]), pto.input(Y[j:j + tile]), pto.output(OUT[i:i + tile]))


@numba.njit
def alloc_on(o, rank, dtype):
    pj.alloc(o, (4, 4), dtype, rank)


def said_once(run, words: str, rank: int) -> str:
    """Call `run` twice; the warning containing `words`, which the first call gives and the
    second (the same Runtime) does not."""
    said = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        said.append([str(w.message) for w in caught if words in str(w.message)])
    assert [len(s) for s in said] == [1, 0], (rank, said)
    return said[0][0]


def held(arrays: list[pto.DistArray]) -> int:
    return sum(a.resident_nbytes for a in arrays)


def share(arrays: list[pto.DistArray]) -> tuple[int, int]:
    """The bytes of this rank's rows, and the most its pages may add: a page at each block edge."""
    rows = sum(stop - start for a in arrays for start, stop in a.blocks)
    edges = sum(2 * len(a.blocks) for a in arrays)
    return rows * arrays[0].row_bytes, edges * PAGE


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(11)
    whole = [rng.standard_normal((N, N)).astype(np.float32) for _ in range(2)] if rank == 0 else [None, None]
    rows = pto.block_rows(size)

    # scatter, gather, local blocks
    a, b = (pto.DistArray.scatter(w, rows, comm) for w in whole)
    c = pto.DistArray((N, N), np.float32, rows, comm)
    back = a.gather()
    mine = np.flatnonzero(rows.row_owners(N) == rank)
    local_rows = [r for block in a.local for r in range(block.start, block.stop)]
    assert local_rows == mine.tolist(), f"rank {rank}: .local covers rows {local_rows[:4]}..., not its own"
    everyone = comm.gather(local_rows, root=0)
    short = None if rank else whole[0].astype(ml_dtypes.bfloat16)  # any element type moves
    short_back = pto.DistArray.scatter(short, pto.block_cyclic(5, size), comm).gather()
    if rank == 0:
        assert np.array_equal(back, whole[0]), "scatter then gather is not the array"
        assert short_back.dtype == short.dtype and np.array_equal(short_back, short), "bfloat16 rows differ"
        assert sorted(r for rows_of in everyone for r in rows_of) == list(range(N)), "blocks are no partition"
    own, slack = share([a, b])  # c is untouched: no memory yet
    after_scatter = held([a, b, c])
    assert own - slack <= after_scatter <= own + slack, (rank, own, after_scatter)
    own, slack = share([a, b, c])

    # the tiled matmul over DistArrays, against one process
    rt = pto.Runtime(backend="cpu", executor="parallel", comm=comm, workers={pto.CUBE: 1, pto.VECTOR: 1})
    rt.run(tiled_matmul, a, b, c, TILE)
    after_run = held([a, b, c])
    assert own - slack <= after_run <= own + slack, f"rank {rank} holds {after_run} bytes after the run, " \
                                                    f"its share {own}"
    product = c.gather()
    if rank == 0:
        reference = np.zeros((N, N), np.float32)
        pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, *whole, reference, TILE)
        assert np.array_equal(product, reference), "the DistArray matmul differs from one process's"
    print(f"MEMORY {rank} {own} {after_scatter} {after_run}", flush=True)
    compiled = pto.DistArray((N, N), np.float32, rows, comm)
    rt.run(tiled_matmul_compiled, a, b, compiled, TILE)
    product = compiled.gather()
    if rank == 0:
        assert np.array_equal(product, reference), "the compiled DistArray matmul differs from one process's"

    # block-cyclic rows, read across ranks
    cyclic = pto.block_cyclic(TILE, size)
    x, y = (pto.DistArray.scatter(w, cyclic, comm) for w in whole)
    out = pto.DistArray((N, N), np.float32, cyclic, comm)
    rt.run(shifted_axpy, x, y, out, TILE)
    got = out.gather()
    if rank == 0:
        want = 2 * whole[0] + np.roll(whole[1], -TILE, axis=0)
        assert np.array_equal(got, want), "the block-cyclic orchestration differs from numpy"

    # refusals: a scatter whose root has no array, on every rank (none waits for rows) ...
    try:
        pto.DistArray.scatter(None, rows, comm)
        raise AssertionError("a scatter without an array went on")
    except pto.ParamError as error:
        assert "rank 0 (the root) must pass the array" in str(error), error
    # ... a heap tile that compiled code gives an owner the run lacks (-1 is the default)
    for owner in (size, -2):
        try:
            rt.run(lambda o, owner=owner: o.compiled(alloc_on, owner, int(pto.FLOAT32)))
            raise AssertionError(f"compiled code's owner {owner} was taken")
        except pto.RankError as error:
            assert f"owner={owner} is out of range: the run has ranks 0..{size - 1}" in str(error), error
    # ... (one rank: every owner is rank 0's, and the run's size is the array's)
    if size > 1:
        try:
            rt.run(lambda o: o.external(x, owner=rows))
            raise AssertionError("an owner other than the DistArray's was taken")
        except pto.RankError as error:
            assert "a DistArray's rows are where its owner" in str(error), error
        try:
            pto.Runtime(backend="cpu", executor="serial").run(lambda o: o.external(x))
            raise AssertionError("a DistArray of another communicator size was taken")
        except pto.RankError as error:
            assert f"its communicator has {size} ranks, this run 1" in str(error), error
        # every row on rank 0: the other ranks idle, said once per Runtime, on every rank
        on_zero = [pto.DistArray.scatter(w, 0, comm) for w in whole]
        on_zero.append(pto.DistArray((N, N), np.float32, 0, comm))
        said = said_once(lambda: rt.run(shifted_axpy, *on_zero, TILE), "ran none of the run's", rank)
        assert said.startswith(f"ranks {', '.join(map(str, range(1, size)))} of {size}"), said
        # rows dealt one at a time under tiles of TILE rows: a run moves more of other ranks'
        # rows (1.5 MiB and more) than its tasks write (1 MiB), said once per Runtime, on every rank
        dealt = [pto.DistArray((4 * N, N), np.float32, pto.block_cyclic(1, size), comm) for _ in range(3)]
        heavy = pto.Runtime(backend="cpu", comm=comm, workers={pto.CUBE: 1, pto.VECTOR: 1})
        said_once(lambda: heavy.run(shifted_axpy, *dealt, TILE), "more than its tasks wrote", rank)
    comm.Barrier()
    if rank == 0:
        print(f"OK dist {size}", flush=True)


if __name__ == "__main__":
    main()
