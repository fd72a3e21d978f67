"""Run under mpiexec (tests/test_mpi.py): one rank fails, and every rank must raise, soon.

    mpiexec -n 2 python -m tests.mpi_programs.failure kernel|receiving|sending|read-only|orchestration

kernel: the last rank's kernel raises while rank 0 waits for the data that task would have
made. receiving: the same, while the failing rank itself waits for a message (W) that rank 0
sends only after a receive of its own, and rank 0 also waits for one that never comes (A):
only the failing rank's notice frees both. sending: rank 0 posts a send of 1 MiB (too large
for MPI to buffer: it completes only once received) whose receive the last rank never posts,
since a task before it fails, which waits until rank 0 says (on a communicator of the test's
own) that it is about to post it; rank 0 must let it go, not wait for it. read-only: the last
rank reads rank 0's rows of an array that is read-only everywhere, so its receive cannot
unpack them. orchestration: the last rank's orchestration raises while the others go on.
Each rank prints
"RAISED <rank> <error type> <task id or -> <its __cause__'s type or -> <seconds>",
then runs a matmul with the same Runtime and prints "AGAIN <rank> OK" when it is right.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI
from pto_gpu.kernels.tiles import copy
from pto_gpu.orchestration.matmul import tiled_matmul

import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR)
def boom(x):
    raise ValueError("boom")


@pto.kernel(worker=pto.VECTOR)
def slow_fill(x):
    time.sleep(0.2)
    x[...] = 1


def failing(o: pto.Orchestrator, x, y, mode: str) -> None:
    X, Y = o.external(x, owner=pto.block_rows(o.ranks)), o.external(y, owner=0)
    last = X[(o.ranks - 1) * 8:]
    for _ in range(3):  # work on every rank before the failure
        for r in range(o.ranks):
            o.submit(slow_fill, pto.output(X[r * 8:(r + 1) * 8]))
    if mode == "orchestration" and o.rank == o.ranks - 1:
        raise RuntimeError("the last rank's orchestration gave up")
    o.submit(boom if mode == "kernel" else slow_fill, pto.output(last))
    o.submit(copy, pto.input(last), pto.output(Y[:8]))  # rank 0 needs what boom would have made


@pto.kernel(worker=pto.VECTOR)
def late_boom(x):
    time.sleep(0.5)  # the other ranks are waiting by now
    raise ValueError("boom")


def receiving(o: pto.Orchestrator, a, z, b, w, c, mode: str) -> None:
    last = o.ranks - 1
    A, Z, C = (o.external(x, owner=last) for x in (a, z, c))
    B, W = (o.external(x, owner=0) for x in (b, w))
    o.submit(late_boom, pto.output(A))            # the last rank: fails
    o.submit(slow_fill, pto.output(Z))            # the last rank
    o.submit(copy, pto.input(A), pto.output(B))   # rank 0 receives A, which never comes
    o.submit(copy, pto.input(Z), pto.output(W))   # rank 0 receives Z
    o.submit(copy, pto.input(W), pto.output(C))   # the last rank receives W: sent once W is made


SIDE: MPI.Comm | None = None  # the test's own messages between ranks (main makes it)
SIGNAL_TAG = 7


@pto.kernel(worker=pto.VECTOR)
def late_fail(x, y):
    """Fails once rank 0 has posted its second send: told so by fill_then_signal, then 0.2 s."""
    said = SIDE.irecv(source=0, tag=SIGNAL_TAG)
    deadline = time.perf_counter() + 30
    while not said.Test():
        if time.perf_counter() > deadline:
            raise RuntimeError("rank 0 never said it was posting its send")
        time.sleep(0.001)
    time.sleep(0.2)  # its send is posted as soon as the fill completes
    raise ValueError("boom")


@pto.kernel(worker=pto.VECTOR)
def fill_then_signal(x):
    """slow_fill, then tell the last rank that the send of x follows."""
    time.sleep(0.2)
    x[...] = 1
    SIDE.send(None, dest=SIDE.Get_size() - 1, tag=SIGNAL_TAG)


def sending(o: pto.Orchestrator, x, y, z, mode: str) -> None:
    last = o.ranks - 1
    X = o.external(x, owner=0)
    Y, Z = (o.external(a, owner=last) for a in (y, z))
    o.submit(late_fail, pto.input(X), pto.output(Y))  # the last rank receives X, then fails
    o.submit(fill_then_signal, pto.output(X))         # rank 0: X's next version, once it has sent X
    o.submit(copy, pto.input(X), pto.output(Z))       # rank 0 sends it; the last rank's receive waits
    # for late_fail (a reader of the copy it would overwrite): never posted


def read_only(o: pto.Orchestrator, x, y, mode: str) -> None:
    X, Y = o.external(x, owner=pto.block_rows(o.ranks)), o.external(y, owner=o.ranks - 1)
    o.submit(copy, pto.input(X[:8]), pto.output(Y))  # the last rank receives rank 0's rows


def main(mode: str) -> None:
    global SIDE
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    SIDE = comm.Dup()
    rt = pto.Runtime(backend="cpu", comm=comm)
    started = time.perf_counter()
    try:
        if mode == "receiving":
            rt.run(receiving, *(np.zeros((8, 4)) for _ in range(5)), mode)
        elif mode == "sending":
            rt.run(sending, *(np.zeros((512, 256)) for _ in range(3)), mode)
        elif mode == "read-only":
            x = np.ones((8 * comm.Get_size(), 4))
            x.flags.writeable = False
            rt.run(read_only, x, np.zeros((8, 4)), mode)
        else:
            rt.run(failing, np.zeros((8 * comm.Get_size(), 4)), np.zeros((8, 4)), mode)
    except Exception as error:  # the failing rank's own, else the TaskError or RankError of it
        task = error.task_id if isinstance(error, pto.TaskError) else "-"
        cause = type(error.__cause__).__name__ if error.__cause__ is not None else "-"
        print(f"RAISED {rank} {type(error).__name__} {task} {cause} {time.perf_counter() - started:.2f}",
              flush=True)
    else:
        print(f"RAISED {rank} nothing - - {time.perf_counter() - started:.2f}", flush=True)
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
    c = np.zeros_like(a)
    rt.run(tiled_matmul, a, a, c, 16)
    mine = pto.block_rows(comm.Get_size()).row_owners(64) == rank
    print(f"AGAIN {rank} {'OK' if np.allclose(c[mine], (a @ a)[mine], rtol=1e-5) else 'WRONG'}", flush=True)
    SIDE.Free()


if __name__ == "__main__":
    main(sys.argv[1])
