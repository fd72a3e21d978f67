"""Run under mpiexec -n 1 (tests/test_mpi.py): the pieces native workers post transfers with.

    mpiexec -n 1 python -m tests.mpi_programs.native_transfers

- A region sent in place with the transport's datatype for it (MpiTransport.datatype, posted
  through mpi_abi.mpi_post as native code posts it) arrives as the bytes `pack` makes of it,
  in C order, so either end of a transfer may take the Python way: contiguous regions, tiles,
  columns, strided and transposed views, unit dims.
- A receive native code posted and a failed run cancels (MpiTransport.cancel) never lands:
  the message it would have matched goes to a later receive.
Prints "OK native-transfers".
"""

from __future__ import annotations

import time

import numba
import numpy as np
from mpi4py import MPI

from pto_gpu.distributed.transport import MpiTransport, pack
from pto_gpu.mpi_abi import mpi_post


@numba.njit
def post(function, address, datatype, peer, tag, comm, request):
    return mpi_post(function, address, datatype, peer, tag, comm, request.ctypes.data)


class Region:
    """What `datatype` reads of a tensor descriptor, from a numpy view."""

    def __init__(self, view: np.ndarray):
        self.repeats = view.shape
        self.strides = tuple(s // view.itemsize for s in view.strides)
        self.dtype = view.dtype


def views() -> list[np.ndarray]:
    x = np.arange(8 * 12, dtype=np.float64).reshape(8, 12)
    y = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    return [x, x[2:5, 3:9], x[:, 5:6], x[3], x[::2, ::3], x.T[1:4, 2:6], y[1:3, :, 2:5], y[:, 1:2, :],
            y[..., 0], y[2:3, 4:5, 1:2]]


def main() -> None:
    comm = MPI.COMM_WORLD
    transport = MpiTransport(comm)
    assert transport.native is not None, "mpi4py's MPI has no MPICH ABI here: nothing to check"
    transport.begin("native_transfers")
    handle, request = transport.comm_handle(), np.zeros(1, np.int32)
    for tag, view in enumerate(views(), start=100):
        datatype = transport.datatype(Region(view))
        assert transport.datatype(Region(view)) == datatype  # committed once, kept
        error = post(transport.native.isend, view.ctypes.data, datatype, 0, tag, handle, request)
        assert error == 0, error
        got = np.zeros(view.nbytes, np.uint8)
        transport._comm.Recv(got, source=0, tag=tag)
        MPI.Request.fromhandle(int(request[0]) % (1 << 64)).Wait()
        assert np.array_equal(got, pack(view, None)), (view.shape, view.strides)

    target = np.zeros(4)
    datatype = transport.datatype(Region(target))
    assert post(transport.native.irecv, target.ctypes.data, datatype, 0, 7, handle, request) == 0
    transport.cancel([int(request[0])])
    later = np.zeros(4)
    sent = transport._comm.Isend(np.ones(4), dest=0, tag=7)
    received = transport._comm.Irecv(later, source=0, tag=7)
    deadline = time.monotonic() + 10
    while not received.Test():  # had the cancelled receive matched, this one never would
        assert time.monotonic() < deadline, f"the message went to the cancelled receive: {target}"
    sent.Wait()
    assert np.array_equal(target, np.zeros(4)) and np.array_equal(later, np.ones(4)), (target, later)
    assert transport.conclude(None) == []
    print("OK native-transfers", flush=True)


if __name__ == "__main__":
    main()
