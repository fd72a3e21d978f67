"""Run under mpiexec (bench/test_mpi.py); prints one JSON line of figures on rank 0.

    mpiexec -n 2 python -m bench.mpi_programs.timing matmul 256  # 2048² tiled matmul, 256 tiles
    mpiexec -n 2 python -m bench.mpi_programs.timing matmul-compiled 256  # the same, programs/matmul.pto's
    mpiexec -n 2 python -m bench.mpi_programs.timing latency  # a ping-pong of small tensors
    mpiexec -n 2 python -m bench.mpi_programs.timing latency-native  # the same, generated kernels
    mpiexec -n 2 python -m bench.mpi_programs.timing memory  # a DistArray of 8192² float32
    mpiexec -n 2 python -m bench.mpi_programs.timing cholesky 256  # 2048² tiled Cholesky, 2-D grid
    mpiexec -n 2 python -m bench.mpi_programs.timing cholesky 256 fifo  # the same, under a Schedule
    mpiexec -n 2 python -m bench.mpi_programs.timing tile-copies 256  # MPICH alone moving B's tiles

Every rank runs with one thread per worker class, so N ranks use N cores (bench/test_mpi.py
binds each rank to one). A round's time is
the slowest rank's, from a barrier to the end of its run; the figure is the median round,
with the busiest rank's CPU seconds beside it.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import threading
import time

import numpy as np
from mpi4py import MPI
from pto_gpu.kernels.elementwise import scale
from pto_gpu.orchestration.cholesky import cholesky
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled

import pto_gpu as pto

WORKERS = {pto.CUBE: 1, pto.VECTOR: 1, pto.AI_CPU: 1, pto.ACCELERATOR: 2}


@pto.kernel(worker=pto.VECTOR)
def bump(source, target):
    target[...] = source + 1


def ping_pong(o: pto.Orchestrator, x, hops: int, native: bool = False) -> None:
    """x's rows alternate between the ranks 0 and 1 (the last if only one): each hop reads the
    row the previous hop wrote and writes the other, so each hop moves a row between ranks.
    `native`: with a generated kernel (x[next] = x[this] * 1, float32 rows), which native
    workers run, so that a hop's time is the runtime's, not a Python kernel's."""
    X = o.external(x, owner=pto.block_rows(min(o.ranks, 2)))
    hop_to(o, X, hops, native)


def hop_to(o: pto.Orchestrator, X, hops: int, native: bool) -> None:
    for hop in range(hops):
        this, following = hop % 2, (hop + 1) % 2
        if native:
            o.submit(scale, pto.input(X[this:this + 1]), pto.output(X[following:following + 1]), 1.0)
        else:
            o.submit(bump, pto.input(X[this]), pto.output(X[following]))


GATE = threading.Event()  # opened once every rank has submitted the whole graph
# When the gate opened and the last hop ended, on this rank (perf_counter: one clock for the
# ranks of a machine).
STAMPS: list[float] = []


@pto.kernel(worker=pto.VECTOR)
def gate(tile):
    """Holds back the first hop until the gate opens."""
    if not GATE.wait(60):
        raise RuntimeError("the gate never opened: did an orchestration fail?")
    STAMPS.append(time.perf_counter())


@pto.kernel(worker=pto.VECTOR)
def stamp(tile):
    """Notes when the last hop has written its row."""
    STAMPS.append(time.perf_counter())


WAIT_S = 0.2  # how long `slow_fill` takes


@pto.kernel(worker=pto.VECTOR)
def slow_fill(tile):
    """A long kernel that leaves the core free (it sleeps), as a GPU's or another node's would."""
    time.sleep(WAIT_S)
    tile[...] = 1


def wait_for_data(o: pto.Orchestrator, x) -> None:
    """The last rank fills x's second row slowly; rank 0 waits for it, then bumps it into the first."""
    X = o.external(x, owner=pto.block_rows(min(o.ranks, 2)))
    o.submit(slow_fill, pto.output(X[1]))
    o.submit(bump, pto.input(X[1]), pto.output(X[0]))


def waiting_cpu_share(comm, x) -> float:
    """Rank 0's CPU seconds (all its threads) over the wall seconds of a run in which it waits
    WAIT_S for another rank's data: what waiting for a message costs a core."""
    rt = pto.Runtime(backend="cpu", comm=comm, workers=WORKERS)
    rt.run(wait_for_data, x)
    comm.Barrier()
    started, started_cpu = time.perf_counter(), time.process_time()
    rt.run(wait_for_data, x)
    return (time.process_time() - started_cpu) / (time.perf_counter() - started)


def timed(orchestration, spent: list[float]):
    """The orchestration, noting in `spent` the seconds each call takes (its submits and
    placement, with the rank's workers running beside it)."""
    def run(o: pto.Orchestrator, *args) -> None:
        started = time.perf_counter()
        orchestration(o, *args)
        spent.append(time.perf_counter() - started)

    return run


def rounds(comm, run, count: int, before=None) -> tuple[float, float, list]:
    """Median over rounds of the slowest rank's wall seconds, and of the busiest rank's CPU
    seconds (all its threads): on a machine others share, the CPU time says what the ranks
    would take with a core each; and what `run` returned each round. `before` (untimed) sets
    each round up."""
    times, cpu, returned = [], [], []
    for _ in range(count):
        if before is not None:
            before()
        comm.Barrier()
        started, started_cpu = time.perf_counter(), time.process_time()
        returned.append(run())
        cpu.append(comm.allreduce(time.process_time() - started_cpu, op=MPI.MAX))
        times.append(comm.allreduce(time.perf_counter() - started, op=MPI.MAX))
    return statistics.median(times), statistics.median(cpu), returned


def cpu_by_thread(comm, results: list[pto.RunResult]) -> dict[str, float]:
    """Per group of a run's threads (RunResult.cpu_seconds: the caller, each worker class), the
    most CPU seconds any rank's spent (median over the runs): the groups' most may be different
    ranks', so they need not add up to one rank's."""
    groups = sorted({group for result in results for group in result.cpu_seconds})
    mine = {group: statistics.median(r.cpu_seconds.get(group, 0.0) for r in results) for group in groups}
    ranks = comm.allgather(mine)
    every = sorted({group for rank in ranks for group in rank})
    return {group: max(rank.get(group, 0.0) for rank in ranks) for group in every}


def raw_one_way(comm, count: int = 2000) -> float:
    """Half an mpi4py round trip of 32 bytes between ranks 0 and 1, in seconds."""
    buffer = np.zeros(4)
    comm.Barrier()
    started = time.perf_counter()
    for _ in range(count):
        if comm.rank == 0:
            comm.Send(buffer, dest=1)
            comm.Recv(buffer, source=1)
        elif comm.rank == 1:
            comm.Recv(buffer, source=0)
            comm.Send(buffer, dest=0)
    return (time.perf_counter() - started) / (2 * count)


def execution_per_hop(comm, x, hops: int, count: int, native: bool) -> float:
    """Median over rounds of the seconds a hop takes as it executes, the whole graph submitted
    before the first hop runs (a task window that holds it; the first hop waits for `gate`,
    which opens once every rank's orchestration has submitted everything): the hops alone,
    without the orchestration that submits them (transfers ready at submission start workers,
    so a threshold alone does not hold them back). From the gate's opening to a task after the
    last hop, per hop."""
    window = 1 << (4 * hops).bit_length()  # a power of two above the tasks of a rank
    rt = pto.Runtime(backend="cpu", comm=comm, workers=WORKERS, task_window=window, dep_pool=4 * window)

    def gated(o: pto.Orchestrator, x, hops: int) -> None:
        X = o.external(x, owner=pto.block_rows(min(o.ranks, 2)))
        o.submit(gate, pto.inout(X[0]))
        hop_to(o, X, hops, native)
        o.submit(stamp, pto.inout(X[hops % 2]))
        comm.Barrier()
        GATE.set()

    per_hop = []
    for round_ in range(count + 1):  # the first warms up
        GATE.clear()
        STAMPS.clear()
        comm.Barrier()
        rt.run(gated, x, hops)
        opened = comm.allreduce(min(STAMPS, default=float("inf")), op=MPI.MIN)
        ended = comm.allreduce(max(STAMPS, default=0.0), op=MPI.MAX)
        if round_:
            per_hop.append((ended - opened) / hops)
    return statistics.median(per_hop)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"))
def add_next(tile, following):
    tile += following


def next_rows(o: pto.Orchestrator, x, tile: int) -> None:
    """x[i] += x[i + 1] by tiles of rows, from the last tile back: the tile at each block's end
    reads the next rank's first."""
    X = o.external(x)
    for i in reversed(range(0, X.shape[0] - tile, tile)):
        o.submit(add_next, pto.inout(X[i:i + tile]), pto.input(X[i + tile:i + 2 * tile]))


def memory(comm, rt: pto.Runtime, tile: int) -> dict:
    """A DistArray of 8192² float32 (256 MiB) in block rows, scattered from rank 0, then a run
    whose tiles read the next rank's rows: the bytes each rank holds after each step."""
    n = 8192
    whole = np.random.default_rng(0).standard_normal((n, n), np.float32) if comm.rank == 0 else None
    x = pto.DistArray.scatter(whole, pto.block_rows(comm.size), comm)
    scattered = x.resident_nbytes
    started = time.perf_counter()
    rt.run(next_rows, x, tile)
    seconds = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    if comm.rank == 0:
        expected = whole.copy()
        for i in reversed(range(0, n - tile, tile)):
            expected[i:i + tile] += expected[i + tile:i + 2 * tile]
    got = x.gather()
    if comm.rank == 0:
        assert np.array_equal(got, expected)
    held = comm.gather((scattered, x.resident_nbytes), root=0)
    return {"whole_bytes": x.nbytes, "seconds": seconds, "bytes_after_scatter": [h[0] for h in held or []],
            "bytes_after_run": [h[1] for h in held or []]}


def tile_copies(comm, tile: int, count: int = 21) -> dict:
    """What MPI alone costs a rank to move the 2-rank 2048² matmul's B tiles as the run does:
    each rank posts a receive of every tile of the other's rows and a send of every tile of
    its own (32 each at 256), then waits for all; the tiles in place in the array, with the
    datatype the runtime's transfers take (distributed/transport.py: rows of bytes, an hvector
    of them), and packed (a buffer each). The median round's seconds and CPU seconds of the
    busiest rank."""
    n, other = 2048, 1 - comm.rank
    b = np.ones((n, n), np.float32)
    packed = {(k, j): np.ones((tile, tile), np.float32) for k in range(0, n, tile) for j in range(0, n, tile)}
    row = MPI.BYTE.Create_contiguous(tile * b.itemsize)
    strided = row.Create_hvector(tile, 1, n * b.itemsize).Commit()
    row.Free()
    mine = range(0, n // 2, tile) if comm.rank == 0 else range(n // 2, n, tile)
    theirs = range(n // 2, n, tile) if comm.rank == 0 else range(0, n // 2, tile)

    def message(k: int, j: int, in_place: bool):
        if not in_place:
            return packed[k, j]
        start = (k * n + j) * b.itemsize
        return [MPI.memory.fromaddress(b.ctypes.data + start, b.nbytes - start), 1, strided]

    def exchange(in_place: bool) -> None:
        requests = [comm.Irecv(message(k, j, in_place), source=other, tag=k * n + j)
                    for k in theirs for j in range(0, n, tile)]
        requests += [comm.Isend(message(k, j, in_place), dest=other, tag=k * n + j)
                     for k in mine for j in range(0, n, tile)]
        MPI.Request.Waitall(requests)

    figures = {}
    for name, in_place in (("strided", True), ("packed", False)):
        exchange(in_place)  # warm-up
        seconds, cpu, _ = rounds(comm, functools.partial(exchange, in_place), count)
        figures[f"{name}_seconds"], figures[f"{name}_cpu_seconds"] = seconds, cpu
    strided.Free()
    return figures


def main(what: str, tile: int = 256, order: str | None = None) -> None:
    """`order`: a Schedule's order for the Cholesky (the other cases take none)."""
    comm = MPI.COMM_WORLD
    rt = pto.Runtime(backend="cpu", comm=comm, workers=WORKERS)
    if what == "memory":
        figures = memory(comm, rt, tile)
    elif what == "tile-copies":
        figures = tile_copies(comm, tile)
    elif what == "cholesky":
        n = 2048
        m = np.random.default_rng(0).standard_normal((n, n))
        spd = m @ m.T + n * np.eye(n)
        a = spd.copy()
        schedule = None if order is None else pto.Schedule(order_by=order)
        rt.run(cholesky, a, tile, schedule=schedule)  # warm-up
        seconds, cpu, results = rounds(comm, lambda: rt.run(cholesky, a, tile, schedule=schedule), 5,
                                       before=lambda: np.copyto(a, spd))
        figures = {"seconds": seconds, "cpu_seconds": cpu, "cpu_by_thread": cpu_by_thread(comm, results)}
    elif what in ("matmul", "matmul-compiled"):
        spent: list[float] = []
        orchestration = timed(tiled_matmul if what == "matmul" else tiled_matmul_compiled, spent)
        n = 2048
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
        c = np.zeros((n, n), np.float32)
        # Not pipelined: measured here, a rank's orchestrator and workers sharing its core
        # while both run slowed its kernels more than the overlap gained.
        rt.run(orchestration, a, b, c, tile)  # warm-up: numba caches, BLAS, page faults
        spent.clear()
        seconds, cpu, results = rounds(comm, lambda: rt.run(orchestration, a, b, c, tile), 5)
        figures = {"seconds": seconds, "cpu_seconds": cpu, "cpu_by_thread": cpu_by_thread(comm, results),
                   "orchestration_seconds": comm.allreduce(statistics.median(spent), op=MPI.MAX)}
        mine = pto.block_rows(comm.size).row_owners(n) == comm.rank
        assert np.allclose(c[mine], (a @ b)[mine], rtol=1e-3, atol=1e-2)
    else:
        native = what == "latency-native"
        hops = 2000
        x = np.zeros((2, 4), np.float32 if native else np.float64)
        rt.run(ping_pong, x, 10, native)
        seconds, cpu, _ = rounds(comm, lambda: rt.run(ping_pong, x, hops, native), 5)
        figures = {"per_hop_us": seconds / hops * 1e6, "cpu_per_hop_us": cpu / hops * 1e6,
                   "execution_per_hop_us": execution_per_hop(comm, x, hops, 5, native) * 1e6}
        if comm.size > 1:
            figures["mpi_one_way_us"] = raw_one_way(comm) * 1e6
            figures["waiting_cpu_share"] = waiting_cpu_share(comm, x)
    figures["ranks"] = comm.size
    if comm.rank == 0:
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:2], *map(int, sys.argv[2:3]), *sys.argv[3:4])
