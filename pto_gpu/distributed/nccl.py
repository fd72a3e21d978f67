"""GPU-to-GPU transfers over NCCL (cupy.cuda.nccl), one GPU per rank.

NOT YET RUN: it needs two GPUs, which no machine this was written on had. MPI still carries
everything but the data: the NCCL id at the start, failure notices, and the end-of-run
exchange. NCCL has no tags: a pair's messages match in the order they are issued, so unlike
MPI's sends, NCCL's must go in their sequence order; and an NCCL send completes only when
its peer receives. So this transport has its transfers chained in their order and run by
ACCELERATOR workers (the `ordered` flag placement.py reads), and a receive waits for its data
inside `receive`, which keeps the protocol deadlock-free by the argument for fully ordered
transfers (docs/ARCHITECTURE.md, "Several ranks"). A wait that learns of a failure aborts
the NCCL communicator, the only way to stop an NCCL operation in flight.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import PTOError
from .transport import MpiTransport, PeerFailed, Posted, packed_bytes


def _mpi():
    from mpi4py import MPI

    return MPI


def use_local_gpu(comm) -> int:
    """Make the GPU of this rank's index among the ranks on its node the current device (before
    the runtime allocates its heap there); its index."""
    import cupy

    local = comm.Split_type(_mpi().COMM_TYPE_SHARED)
    index = local.Get_rank()
    local.Free()
    cupy.cuda.Device(index % cupy.cuda.runtime.getDeviceCount()).use()
    return index


class NcclTransport(MpiTransport):
    """Transport whose data moves GPU to GPU; see the module docstring."""

    ordered = True

    def __init__(self, comm):
        super().__init__(comm)
        from cupy.cuda import nccl

        self._nccl = nccl
        self._aborted = False
        self._communicator = self._connect(comm)

    def _connect(self, comm):
        # CuPy imports its nccl module without NCCL (its `available` says): every rank must know
        # before rank 0 is asked for an id, or the others would wait for it for ever.
        if not comm.allreduce(bool(self._nccl.available), op=_mpi().LAND):
            raise PTOError("transport='nccl': NCCL is not installed on every rank (CuPy finds no libnccl: "
                           "install nvidia-nccl-cu12 or -cu13 beside CuPy)")
        uid = comm.bcast(self._nccl.get_unique_id() if self.rank == 0 else None, root=0)
        return self._nccl.NcclCommunicator(self.size, uid, self.rank)

    def begin(self, name: str) -> None:
        super().begin(name)
        if self._communicator is None:  # the last run failed: NCCL has no tags to tell runs apart
            self._communicator = self._connect(self._comm)

    def conclude(self, failure: tuple | None) -> list[tuple[int, tuple]]:
        failures = super().conclude(failure)
        if failures and self._communicator is not None:  # (None: a reconnect in `begin` failed)
            # its unfinished operations would pair with the next run's: a fresh one then
            if not self._aborted:
                self._communicator.abort()
            self._communicator, self._aborted = None, False
        return failures

    def send(self, view, mask: np.ndarray | None, dest: int, sequence: int) -> None:
        import cupy

        data = self._packed(view, mask)
        stream = cupy.cuda.get_current_stream()
        self._communicator.send(data.data.ptr, data.nbytes, self._nccl.NCCL_UINT8, dest, stream.ptr)
        self._finish(stream, f"a send to rank {dest}")

    def receive(self, view, mask: np.ndarray | None, source: int, sequence: int) -> Posted:
        import cupy

        data = cupy.empty(packed_bytes(view, mask), cupy.uint8)
        stream = cupy.cuda.get_current_stream()
        self._communicator.recv(data.data.ptr, data.nbytes, self._nccl.NCCL_UINT8, source, stream.ptr)
        self._finish(stream, f"data from rank {source}")
        return Posted(None, data, view, mask, source)

    def arrived(self, posted: list[Posted]) -> list[int]:
        return list(range(len(posted)))  # `receive` waited for each

    @staticmethod
    def _packed(view, mask):
        import cupy

        chosen = view if mask is None else view[cupy.asarray(mask)]
        return cupy.ascontiguousarray(chosen).reshape(-1).view(cupy.uint8)

    def _finish(self, stream, what: str) -> None:
        """Wait for the stream, polling it and the failure notice (MpiTransport's)."""
        pause = 1e-6
        while not stream.done:
            if self._someone_failed or self._notice.Test():
                self._someone_failed = True
                self._communicator.abort()
                self._aborted = True
                raise PeerFailed(f"stopped waiting for {what}: a rank failed")
            time.sleep(pause)
            pause = min(2 * pause, 1e-4)
