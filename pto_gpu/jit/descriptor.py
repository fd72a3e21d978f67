"""Tensor descriptors inside compiled orchestrations: fixed-length int64 tuples.

A compiled orchestration cannot hold `TensorDescriptor` objects, so it passes tuples of
DESC_WIDTH int64s (no allocation: they live in registers and on the stack). The fields
mirror a TensorDescriptor: owning buffer (key, base address, size), byte offset of element
[0, ..., 0], dtype, version, overlap level and up to MAX_JIT_DIMS dims of shape and
element strides. The view operations (`narrow`, `split`, `swap`) check bounds like their
Python counterparts, and `write_layout` produces exactly the canonical row `layout_row`
does, so both paths see the same dependencies.
"""

from __future__ import annotations

import struct

from llvmlite import ir
from numba import njit, objmode, types
from numba.core import cgutils
from numba.cpython.unsafe.tuple import tuple_setitem
from numba.extending import intrinsic

from ..errors import LayoutError
from ..layout import (
    BLOCKS_PER_OWNER_LOG2,
    MAX_DIMS,
    MIN_BLOCK_SHIFT,
    R_COUNT,
    R_HI,
    R_LEVEL,
    R_LO,
    R_NDIM,
    R_OWNER,
    R_RUN,
    R_SHIFT,
    R_STRIDE,
)
from ..tensor import Buffer, TensorDescriptor

MAX_JIT_DIMS = 4

D_KEY = 0  # owning buffer's key (heap sequence number, or negative for externals)
D_BASE = 1  # owning buffer's base address
D_NBYTES = 2  # owning buffer's size
D_OFFSET = 3  # byte offset of element [0, ..., 0] from the base
D_DTYPE = 4  # DataType value
D_ITEMSIZE = 5
D_VERSION = 6
D_LEVEL = 7  # Overlap level
D_NDIM = 8
D_SHAPE = 9  # D_SHAPE + k: elements along dim k
D_STRIDE = D_SHAPE + MAX_JIT_DIMS  # D_STRIDE + k: element stride of dim k
DESC_WIDTH = D_STRIDE + MAX_JIT_DIMS


def from_tensor(tensor: TensorDescriptor) -> tuple:
    """The compiled-code form of a descriptor."""
    packed = desc_bytes(tensor)
    if packed is None:
        raise LayoutError(f"compiled orchestrations take tensors of at most {MAX_JIT_DIMS} dims, "
                          f"not {tensor.shape}")
    return _DESC.unpack(packed)


_DESC = struct.Struct(f"={DESC_WIDTH}q")
DESC_BYTES = _DESC.size
_PADS = [(0,) * (MAX_JIT_DIMS - n) for n in range(MAX_JIT_DIMS + 1)]


def desc_bytes(tensor: TensorDescriptor) -> bytes | None:
    """A tensor's compiled descriptor as DESC_BYTES native int64 bytes (the argument tables'
    rows), made once per tensor; None for a tensor of more than MAX_JIT_DIMS dims."""
    packed = tensor._desc
    if packed is None:
        shape, strides, buffer, dtype = tensor.repeats, tensor.strides, tensor.buffer, tensor.dtype
        if len(shape) > MAX_JIT_DIMS:
            return None
        itemsize = dtype.itemsize
        pad = _PADS[len(shape)]
        packed = _DESC.pack(buffer.key, buffer.base, buffer.nbytes,
                            tensor.addr - buffer.base + tensor.start_offset * itemsize, dtype, itemsize,
                            tensor.version, tensor.overlap, len(shape), *shape, *pad, *strides, *pad)
        object.__setattr__(tensor, "_desc", packed)  # a cache: the descriptor is immutable
    return packed


def to_tensor(desc, buffer: Buffer, dtype) -> TensorDescriptor:
    """The Python descriptor of a compiled one, over `buffer` (whose key the tuple names)."""
    words = desc.tolist()
    ndim = words[D_NDIM]
    # Anchored at the element itself: an external's offset need not be a multiple of itemsize.
    return TensorDescriptor.checked_elsewhere(buffer, buffer.base + words[D_OFFSET],
                                              tuple(words[D_STRIDE:D_STRIDE + ndim]),
                                              tuple(words[D_SHAPE:D_SHAPE + ndim]), dtype, words[D_VERSION])


def _raise_layout(what, a, b, c):
    raise LayoutError(what.format(a, b, c))


@njit(cache=True)
def _fail(what, a, b, c):
    with objmode():
        _raise_layout(what, a, b, c)


@njit(cache=True)
def shape(desc, dim):
    return desc[D_SHAPE + dim]


@njit(cache=True)
def ndim(desc):
    return desc[D_NDIM]


@njit(cache=True)
def dtype(desc):
    """The DataType code of a descriptor (alloc takes it)."""
    return desc[D_DTYPE]


@njit(cache=True)
def narrow(desc, dim, start, stop):
    """Elements start..stop of one dim (desc[..., start:stop, ...])."""
    if dim < 0 or dim >= desc[D_NDIM]:
        _fail("narrow: dim {} of a {}-d tensor{}", dim, desc[D_NDIM], "")
    if not 0 <= start <= stop <= desc[D_SHAPE + dim]:
        _fail("narrow: {}:{} is out of bounds for a dim of size {}", start, stop, desc[D_SHAPE + dim])
    out = tuple_setitem(desc, D_SHAPE + dim, stop - start)
    return tuple_setitem(out, D_OFFSET, desc[D_OFFSET] + start * desc[D_STRIDE + dim] * desc[D_ITEMSIZE])


@njit(cache=True)
def split(desc, dim, inner):
    """Dim `dim` of size n as two dims (n // inner, inner): a reshape that never copies."""
    ndim = desc[D_NDIM]
    if ndim >= MAX_JIT_DIMS or dim < 0 or dim >= ndim or inner <= 0 or desc[D_SHAPE + dim] % inner:
        _fail("split: cannot split dim {} of size {} into rows of {}", dim, desc[D_SHAPE + dim], inner)
    out = desc
    for k in range(ndim - 1, dim, -1):  # dims after `dim` move up by one
        out = tuple_setitem(out, D_SHAPE + k + 1, desc[D_SHAPE + k])
        out = tuple_setitem(out, D_STRIDE + k + 1, desc[D_STRIDE + k])
    stride = desc[D_STRIDE + dim]
    out = tuple_setitem(out, D_SHAPE + dim, desc[D_SHAPE + dim] // inner)
    out = tuple_setitem(out, D_STRIDE + dim, stride * inner)
    out = tuple_setitem(out, D_SHAPE + dim + 1, inner)
    out = tuple_setitem(out, D_STRIDE + dim + 1, stride)
    return tuple_setitem(out, D_NDIM, ndim + 1)


@njit(cache=True)
def swap(desc, a, b):
    """Dims a and b exchanged (a transpose of two axes)."""
    if not (0 <= a < desc[D_NDIM] and 0 <= b < desc[D_NDIM]):
        _fail("swap: dims {} and {} of a {}-d tensor", a, b, desc[D_NDIM])
    out = tuple_setitem(desc, D_SHAPE + a, desc[D_SHAPE + b])
    out = tuple_setitem(out, D_SHAPE + b, desc[D_SHAPE + a])
    out = tuple_setitem(out, D_STRIDE + a, desc[D_STRIDE + b])
    return tuple_setitem(out, D_STRIDE + b, desc[D_STRIDE + a])


@njit(cache=True)
def with_version(desc, version):
    return tuple_setitem(desc, D_VERSION, version)


@njit(cache=True)
def write_layout(desc, row):
    """Write the canonical layout row of a descriptor (see layout.layout_row) into row[:ROW_WIDTH].

    `desc` is a descriptor tuple or its DESC_WIDTH values in an array row (jit/api.py's submit:
    an array is read at a variable index without the jump table a tuple needs)."""
    offset = desc[D_OFFSET]
    itemsize = desc[D_ITEMSIZE]
    row[R_OWNER] = desc[D_KEY]
    row[R_LO] = offset
    row[R_HI] = offset
    row[R_LEVEL] = desc[D_LEVEL]
    row[R_SHIFT] = max(MIN_BLOCK_SHIFT, _bit_length(desc[D_NBYTES] - 1) - BLOCKS_PER_OWNER_LOG2)
    ndim = desc[D_NDIM]
    for k in range(ndim):
        if desc[D_SHAPE + k] == 0:  # empty: no bytes, no dims
            row[R_RUN] = 0
            row[R_NDIM] = 0
            for i in range(MAX_DIMS):
                row[R_STRIDE + i] = 0
                row[R_COUNT + i] = 0
            return
    # Dims of more than one element, by byte stride then count, largest first.
    n = 0
    for k in range(ndim):
        count = desc[D_SHAPE + k]
        if count == 1:
            continue
        stride = desc[D_STRIDE + k] * itemsize
        j = n
        while j > 0 and (row[R_STRIDE + j - 1] < stride or (
                row[R_STRIDE + j - 1] == stride and row[R_COUNT + j - 1] < count)):
            row[R_STRIDE + j] = row[R_STRIDE + j - 1]
            row[R_COUNT + j] = row[R_COUNT + j - 1]
            j -= 1
        row[R_STRIDE + j] = stride
        row[R_COUNT + j] = count
        n += 1
    run = itemsize
    while n > 0 and row[R_STRIDE + n - 1] == run:  # dims that continue the contiguous run
        n -= 1
        run *= row[R_COUNT + n]
    merged = 0
    for i in range(n):
        stride, count = row[R_STRIDE + i], row[R_COUNT + i]
        if merged > 0 and row[R_STRIDE + merged - 1] == stride * count:
            row[R_STRIDE + merged - 1] = stride
            row[R_COUNT + merged - 1] *= count
        else:
            row[R_STRIDE + merged] = stride
            row[R_COUNT + merged] = count
            merged += 1
    extent = run
    for i in range(MAX_DIMS):
        if i < merged:
            extent += (row[R_COUNT + i] - 1) * row[R_STRIDE + i]
        else:
            row[R_STRIDE + i] = 0
            row[R_COUNT + i] = 0
    row[R_HI] = offset + extent
    row[R_RUN] = run
    row[R_NDIM] = merged


@intrinsic
def _leading_zeros(typingctx, value):
    """The zero bits above the highest one of an int64 (llvm.ctlz: one instruction)."""
    if not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        ctlz = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]),
                                              "llvm.ctlz.i64")
        return builder.call(ctlz, [args[0], ir.Constant(ir.IntType(1), 0)])

    return types.int64(value), codegen


@njit(cache=True, inline="always")
def _bit_length(value):
    """int.bit_length for value >= 0 (0 below): a shift loop cost 15% of a compiled build."""
    return 64 - _leading_zeros(value) if value > 0 else 0
