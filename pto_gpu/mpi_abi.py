"""Calling MPI's nonblocking point-to-point functions from numba code, by their addresses:
native workers post a distributed run's transfers and learn of their completion without
Python (executors/native.py). The ABI is MPICH's (MPICH, Intel MPI, MVAPICH, Cray MPICH):
every handle is a 32-bit int. distributed/transport.py finds the functions' addresses and
says when the MPI library has another ABI (its transfers then take the Python way); nothing
here imports MPI, and every address arrives as an int64."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_VOID_P = ir.IntType(8).as_pointer()


def _words(context, builder, signature, args) -> list:
    """The integer arguments as int64s, whatever their width: handles and ints are then
    truncated to C's int, addresses made pointers."""
    return [context.cast(builder, value, kind, types.int64) for value, kind in zip(args, signature.args)]


@intrinsic
def mpi_post(typingctx, function, buffer, datatype, peer, tag, comm, request):
    """MPI_Isend or MPI_Irecv (`function`) of one `datatype` at `buffer` with rank `peer`,
    writing its request handle at address `request`; MPI's error code."""
    if not all(isinstance(t, types.Integer) for t in (function, buffer, datatype, peer, tag, comm, request)):
        return None

    def codegen(context, builder, signature, args):
        # int MPI_Isend(const void *buf, int count, MPI_Datatype, int dest, int tag, MPI_Comm, MPI_Request *)
        called = ir.FunctionType(_I32, [_VOID_P, _I32, _I32, _I32, _I32, _I32, _I32.as_pointer()])
        address, buffer, datatype, peer, tag, comm, request = _words(context, builder, signature, args)
        made = builder.call(builder.inttoptr(address, called.as_pointer()), [
            builder.inttoptr(buffer, _VOID_P), ir.Constant(_I32, 1), builder.trunc(datatype, _I32),
            builder.trunc(peer, _I32), builder.trunc(tag, _I32), builder.trunc(comm, _I32),
            builder.inttoptr(request, _I32.as_pointer())])
        return builder.sext(made, _I64)

    return types.int64(function, buffer, datatype, peer, tag, comm, request), codegen


@intrinsic
def mpi_testsome(typingctx, function, count, requests, done, indices, statuses):
    """MPI_Testsome over the `count` request handles at address `requests`: how many completed
    is written at `done` (MPI_UNDEFINED, negative, when none was active), their positions at
    `indices`; MPI's error code."""
    if not all(isinstance(t, types.Integer) for t in (function, count, requests, done, indices, statuses)):
        return None

    def codegen(context, builder, signature, args):
        # int MPI_Testsome(int incount, MPI_Request[], int *outcount, int indices[], MPI_Status[])
        int_p = _I32.as_pointer()
        called = ir.FunctionType(_I32, [_I32, int_p, int_p, int_p, _VOID_P])
        address, count, requests, done, indices, statuses = _words(context, builder, signature, args)
        made = builder.call(builder.inttoptr(address, called.as_pointer()), [
            builder.trunc(count, _I32), builder.inttoptr(requests, _I32.as_pointer()),
            builder.inttoptr(done, _I32.as_pointer()), builder.inttoptr(indices, _I32.as_pointer()),
            builder.inttoptr(statuses, _VOID_P)])
        return builder.sext(made, _I64)

    return types.int64(function, count, requests, done, indices, statuses), codegen
