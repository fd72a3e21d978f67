"""Calling compiled code cheaply: a native entry by its address, from numba code (what the
native workers, executors/native.py, and the CUDA emulator's CPU code, backends/launches.py,
do), and an njit function from Python without numba's type dispatch (`compiled_entry`).
Entries (`int64 entry(int64 *descs, int64 *kinds, int64 *ints, double *floats)`) are made by
native_abi.py; this module sits below all of them, so none imports another."""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def compiled_entry(function, *example) -> Callable:
    """The machine code njit `function` compiled for the types of `example` (compiled now if
    need be), callable from Python without numba's per-call type dispatch, which types every
    argument at every call: ~170 ns a record array, µs for a call over a run's tables. It checks
    nothing: callers pass arguments of exactly those types."""
    key = (function, tuple(map(_typeof, example)))
    entry = _entries.get(key)
    if entry is None:  # Dispatcher.compile takes ~50 µs to find one it has (none recompiles)
        entry = _entries[key] = function.compile(key[1])
    return entry


_entries: dict[tuple, Callable] = {}  # (function, argument types) -> its entry
_types: dict[tuple, types.Type] = {}  # _type_key -> numba's type


def _typeof(value) -> types.Type:
    """numba.typeof(value), remembered for arrays, records and tuples of them: numba types a
    record dtype field by field (~50 µs a table of the core's), and the native lanes each
    distributed run makes took the entries of their functions over ten such tables afresh
    (~2 ms a run)."""
    key = _type_key(value)
    if key is None:
        return numba.typeof(value)
    known = _types.get(key)
    if known is None:
        known = _types[key] = numba.typeof(value)
    return known


def _dtype_key(dtype: np.dtype) -> object:
    """A dtype and, through its fields and subarrays, whether each struct in it is aligned:
    numpy calls a packed struct equal to its aligned twin where their offsets agree, and
    numba types the two apart."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return dtype, shape, _dtype_key(base)
    if dtype.fields is None:
        return dtype
    return dtype, dtype.isalignedstruct, tuple(_dtype_key(dtype.fields[name][0]) for name in dtype.names)


def _type_key(value) -> tuple | None:
    """What numba's type of `value` depends on, where that is cheap to tell; None elsewhere."""
    if isinstance(value, np.ndarray):
        flags = value.flags
        return (type(value), _dtype_key(value.dtype), value.ndim, flags.c_contiguous, flags.f_contiguous,
                flags.writeable, flags.aligned)
    if isinstance(value, np.void):
        return np.void, _dtype_key(value.dtype)
    if isinstance(value, tuple):
        keys = tuple(map(_type_key, value))
        return None if None in keys else (type(value), keys)
    return None


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
