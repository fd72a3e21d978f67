"""Run under mpiexec -n 1 (tests/test_mpi.py): the pieces native workers post transfers with.

    mpiexec -n 1 python -m tests.mpi_programs.native_transfers

- A region sent in place with the transport's datatype for it (MpiTransport.datatype, posted
  through mpi_abi.mpi_post and completed by mpi_testsome, as native code does) arrives as the
  bytes `pack` makes of it, in C order, and a packed message received in place with it lands
  on those elements and no others, so either end of a transfer may take the Python way:
  contiguous regions, tiles, columns, strided and transposed views, unit dims.
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
from pto_gpu.mpi_abi import mpi_post, mpi_testsome


@numba.njit
def post(function, address, datatype, peer, tag, comm, request):
    return mpi_post(function, address, datatype, peer, tag, comm, request.ctypes.data)


@numba.njit
def wait(function, requests, done, indices, statuses):
    """MPI_Testsome until every request has completed, as native code tests; MPI's error code."""
    left = len(requests)
    while left:
        error = mpi_testsome(function, len(requests), requests.ctypes.data, done.ctypes.data,
                             indices.ctypes.data, statuses.ctypes.data)
        if error:
            return error
        left -= max(done[0], 0)
    return 0


class Region:
    """What `datatype` reads of a tensor descriptor, from a numpy view."""

    def __init__(self, view: np.ndarray):
        self.repeats = view.shape
        self.strides = tuple(s // view.itemsize for s in view.strides)
        self.dtype = view.dtype


LAYOUTS = [lambda a: a, lambda a: a[2:4, 3:5], lambda a: a[:, 5:6], lambda a: a[3], lambda a: a[::2, ::3],
           lambda a: a.T[1:4, 2:4], lambda a: a[1:3, None, 2:5], lambda a: a[2:3, 4:5]]


def main() -> None:
    comm = MPI.COMM_WORLD
    transport = MpiTransport(comm)
    assert transport.native is not None, "mpi4py's MPI has no MPICH ABI here: nothing to check"
    transport.begin("native_transfers")
    handle, request = transport.comm_handle(), np.zeros(1, np.int32)
    native = transport.native
    done, indices = np.zeros(1, np.int32), np.zeros(1, np.int32)
    statuses = np.zeros(native.status_bytes, np.uint8)
    for dtype in (np.float64, np.float32):
        source = np.arange(6 * 8, dtype=dtype).reshape(6, 8)
        for tag, layout in enumerate(LAYOUTS, start=100):
            view = layout(source)
            datatype = transport.datatype(Region(view))
            assert transport.datatype(Region(view)) == datatype  # committed once, kept
            # Sent in place: what arrives packed is what `pack` makes.
            assert post(native.isend, view.ctypes.data, datatype, 0, tag, handle, request) == 0
            got = np.zeros(view.nbytes, np.uint8)
            transport._comm.Recv(got, source=0, tag=tag)
            assert wait(native.testsome, request, done, indices, statuses) == 0
            assert np.array_equal(got, pack(view, None)), (view.shape, view.strides)
            # Received in place from a packed message: those elements, and nothing around them.
            target = np.zeros_like(source)
            assert post(native.irecv, layout(target).ctypes.data, datatype, 0, tag, handle, request) == 0
            transport._comm.Send(pack(view, None), dest=0, tag=tag)  # matched by the receive posted
            assert wait(native.testsome, request, done, indices, statuses) == 0
            expected = np.zeros_like(source)
            layout(expected)[...] = view
            assert np.array_equal(target, expected), (view.shape, view.strides)

    target = np.zeros(4)
    datatype = transport.datatype(Region(target))
    assert post(transport.native.irecv, target.ctypes.data, datatype, 0, 7, handle, request) == 0
    transport.cancel([int(request[0])], [], [])
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
