"""The native entry of generated CPU code: how a worker calls a kernel without the GIL.

An entry is a C function

    void entry(int64 *descs, int64 *kinds, int64 *ints, double *floats)

where `descs` are the task's tensor descriptors as compiled orchestrations write them
(jit/descriptor.py: DESC_WIDTH int64s each, in param order) and `kinds`, `ints`, `floats` its
scalar params as the argument tables hold them (jit/context.py). cpu_codegen.native_entry
writes one per kernel instance; its body makes each memref's view from its descriptor, as the
CPU backend's numpy views are, and calls the instance's generated function.
"""

from __future__ import annotations

from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic
from numpy.lib.stride_tricks import as_strided

from ..jit.context import S_INT
from ..jit.descriptor import D_BASE, D_ITEMSIZE, D_NDIM, D_OFFSET, D_SHAPE, D_STRIDE, DESC_WIDTH

_I64P = types.CPointer(types.int64)
ENTRY = types.void(_I64P, _I64P, _I64P, types.CPointer(types.float64))


@intrinsic
def _void_pointer(typingctx, address):
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(address), codegen


@njit(inline="always")
def tensor2(descs, p, dtype):
    """Tensor param p as a 2-d array of `dtype` (a memref of an unbatched instance)."""
    d = p * DESC_WIDTH
    size = descs[d + D_ITEMSIZE]
    base = carray(_void_pointer(descs[d + D_BASE] + descs[d + D_OFFSET]), 1, dtype)
    return as_strided(base, (descs[d + D_SHAPE], descs[d + D_SHAPE + 1]),
                      (descs[d + D_STRIDE] * size, descs[d + D_STRIDE + 1] * size))


@njit(inline="always")
def tensor3(descs, p, dtype):
    """Tensor param p as a 3-d array of `dtype` (a memref of a batched instance): a 2-d param
    is one window for every batch index, as family.py passes it."""
    d = p * DESC_WIDTH
    size = descs[d + D_ITEMSIZE]
    base = carray(_void_pointer(descs[d + D_BASE] + descs[d + D_OFFSET]), 1, dtype)
    if descs[d + D_NDIM] == 3:
        return as_strided(base, (descs[d + D_SHAPE], descs[d + D_SHAPE + 1], descs[d + D_SHAPE + 2]),
                          (descs[d + D_STRIDE] * size, descs[d + D_STRIDE + 1] * size,
                           descs[d + D_STRIDE + 2] * size))
    return as_strided(base, (1, descs[d + D_SHAPE], descs[d + D_SHAPE + 1]),
                      (0, descs[d + D_STRIDE] * size, descs[d + D_STRIDE + 1] * size))


@njit(inline="always")
def float_scalar(kinds, ints, floats, k):
    return float(ints[k]) if kinds[k] == S_INT else floats[k]


@njit(inline="always")
def int_scalar(kinds, ints, floats, k):
    return ints[k] if kinds[k] == S_INT else int(floats[k])


@intrinsic
def call_entry(typingctx, address, descs, kinds, ints, floats):
    """Call the native entry at `address` with the addresses of a task's argument rows."""
    if not all(isinstance(t, types.Integer) for t in (address, descs, kinds, ints, floats)):
        return None

    def codegen(context, builder, signature, args):
        i64p = ir.IntType(64).as_pointer()
        f64p = ir.DoubleType().as_pointer()
        signature = ir.FunctionType(ir.VoidType(), [i64p, i64p, i64p, f64p])
        function = builder.inttoptr(args[0], signature.as_pointer())
        builder.call(function, [builder.inttoptr(args[1], i64p), builder.inttoptr(args[2], i64p),
                                builder.inttoptr(args[3], i64p), builder.inttoptr(args[4], f64p)])
        return context.get_dummy_value()

    return types.void(address, descs, kinds, ints, floats), codegen
