"""Calling compiled code cheaply: a native entry by its address, from numba code (what the
native workers, executors/native.py, and the CUDA emulator's CPU code, backends/launches.py,
do), and an njit function from Python without numba's type dispatch (`compiled_entry`).
Entries (`int64 entry(int64 *descs, int64 *kinds, int64 *ints, double *floats)`) are made by
native_abi.py; this module sits below all of them, so none imports another."""

from __future__ import annotations

from collections.abc import Callable

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def compiled_entry(function, *example) -> Callable:
    """The machine code njit `function` compiled for the types of `example` (compiled now if
    need be), callable from Python without numba's per-call type dispatch, which types every
    argument at every call: ~170 ns a record array, µs for a call over a run's tables. It checks
    nothing: callers pass arguments of exactly those types."""
    return function.compile(tuple(numba.typeof(value) for value in example))


@intrinsic
def call_entry(typingctx, address, descs, kinds, ints, floats):
    """Call the native entry at `address` with the addresses of a task's argument rows; its
    status (0, or RAISED)."""
    if not all(isinstance(t, types.Integer) for t in (address, descs, kinds, ints, floats)):
        return None

    def codegen(context, builder, signature, args):
        i64p = ir.IntType(64).as_pointer()
        f64p = ir.DoubleType().as_pointer()
        signature = ir.FunctionType(ir.IntType(64), [i64p, i64p, i64p, f64p])
        function = builder.inttoptr(args[0], signature.as_pointer())
        return builder.call(function, [builder.inttoptr(args[1], i64p), builder.inttoptr(args[2], i64p),
                                       builder.inttoptr(args[3], i64p), builder.inttoptr(args[4], f64p)])

    return types.int64(address, descs, kinds, ints, floats), codegen
