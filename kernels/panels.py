"""GEMM on a right operand packed in panels of 32 columns: a register-blocked micro-kernel.

`panels_product(a, b, out, accumulate)` computes out[q] = a @ b[q] (or += with `accumulate`)
for every panel q of b (panels, k, 32) and out (panels, m, 32): the layout BLAS packs its right
operand into inside every call; `panels_product_add(a, b, acc, out)` computes out[q] = acc[q] +
a @ b[q]. A tiled matmul that packs B once (orchestration/matmul.py's `tiled_matmul_panels`)
gives each tile product contiguous panels, so a product is the micro-kernel alone: 8 rows x 32
columns of out in sixteen 16-float vector accumulators, a's elements read in place and
broadcast, b's rows loaded as vectors, one fused multiply-add per accumulator and step of k. A
128³ float32 product takes 22–24 µs on one core of the Sapphire Rapids VM with its operands in
cache, 29–31 µs in a run (its operands come from L3), against 42–46 µs for BLAS on the strided
tiles, which packs them at every call.

Other layouts and dtypes go through kernels/blas.py's gemm, one panel at a time. Numba code,
so native workers and Python workers run the same function and get the same bits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding, ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import blas

PANEL = 32  # columns per panel: two 16-float vectors
_VECTOR = 16
# Rows per block: 8 rows x 2 accumulators fill 16 of AVX-512's 32 vector registers. Without
# AVX-512, LLVM splits each 16-float vector into two 8-float registers of the 16 there are: 2 rows
# (8 registers of accumulators) keep the block in registers.
ROWS = 8 if "+avx512f" in binding.get_host_cpu_features().flatten() else 2


@intrinsic
def _block(typingctx, rows, accumulate, a, lda, b, source, lds, out, ldo, k):
    """out[r, 0:32] = sum over kk < k of a[r * lda + kk] * b[kk * 32 : kk * 32 + 32], plus
    source[r, 0:32] with `accumulate`, for r < rows (a literal); all float32 addresses, lda, lds
    and ldo in elements. Each 16-float vector of source is loaded just before the out vector at
    its place is stored, so source may be out itself but not a shifted view of it."""
    if not isinstance(rows, types.IntegerLiteral) or not isinstance(accumulate, types.BooleanLiteral):
        return None
    count, add = rows.literal_value, accumulate.literal_value

    def codegen(context, builder, signature, args):
        _, _, a_address, lda, b_address, source_address, lds, out_address, ldo, depth = args
        f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
        vector = ir.VectorType(f32, _VECTOR)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                             f"llvm.fma.v{_VECTOR}f32")
        a_base, b_base, source_base, out_base = (builder.inttoptr(x, f32.as_pointer())
                                                 for x in (a_address, b_address, source_address, out_address))

        def vector_at(base, index):
            return builder.bitcast(builder.gep(base, [index]), vector.as_pointer())

        zero, undefined = ir.Constant(vector, None), ir.Constant(vector, ir.Undefined)
        broadcast = ir.Constant(ir.VectorType(i32, _VECTOR), [0] * _VECTOR)
        start = builder.block
        loop, done = builder.append_basic_block("block.loop"), builder.append_basic_block("block.done")
        builder.cbranch(builder.icmp_signed(">", depth, i64(0)), loop, done)

        builder.position_at_end(loop)
        kk = builder.phi(i64)
        kk.add_incoming(i64(0), start)
        sums = []
        for _ in range(2 * count):
            phi = builder.phi(vector)
            phi.add_incoming(zero, start)
            sums.append(phi)
        row_of_b = builder.mul(kk, i64(PANEL))
        halves = [builder.load(vector_at(b_base, builder.add(row_of_b, i64(h * _VECTOR))), align=4)
                  for h in range(2)]
        stepped = []
        for r in range(count):
            element = builder.load(builder.gep(a_base, [builder.add(builder.mul(i64(r), lda), kk)]))
            spread = builder.shuffle_vector(builder.insert_element(undefined, element, i32(0)), undefined,
                                            broadcast)
            stepped += [builder.call(fma, [spread, halves[h], sums[2 * r + h]]) for h in range(2)]
        following = builder.add(kk, i64(1))
        end = builder.block
        kk.add_incoming(following, end)
        for phi, value in zip(sums, stepped):
            phi.add_incoming(value, end)
        builder.cbranch(builder.icmp_signed("<", following, depth), loop, done)

        builder.position_at_end(done)
        totals = []
        for value in stepped:  # every phi first: LLVM wants them at the top of the block
            totals.append(builder.phi(vector))
            totals[-1].add_incoming(zero, start)
            totals[-1].add_incoming(value, end)
        for r in range(count):
            for h in range(2):
                total = totals[2 * r + h]
                if add:
                    addend = vector_at(source_base, builder.add(builder.mul(i64(r), lds), i64(h * _VECTOR)))
                    total = builder.fadd(builder.load(addend, align=4), total)
                target = vector_at(out_base, builder.add(builder.mul(i64(r), ldo), i64(h * _VECTOR)))
                builder.store(total, target, align=4)
        return context.get_dummy_value()

    return types.void(rows, accumulate, a, lda, b, source, lds, out, ldo, k), codegen


@njit(nogil=True, cache=True)
def panels_product(a, b, out, accumulate):
    """out[q] = a @ b[q], or out[q] += a @ b[q] with `accumulate`, for every q: a (m, k),
    b (panels, k, n) and out (panels, m, n) of one float dtype."""
    _check_shapes(a, b, out)
    _product(a, b, out, out, accumulate)


@njit(nogil=True, cache=True)
def panels_product_add(a, b, acc, out):
    """out[q] = acc[q] + a @ b[q] for every q, acc (panels, m, n) as out and of its dtype: the
    last product of a chain that accumulated in acc, written into the output in the same pass
    (no copy after it)."""
    _check_shapes(a, b, out)
    if acc.shape != out.shape or not _one_dtype(acc, out):
        raise ValueError("panels_product_add: acc is not shaped as out, or not of its dtype")
    _product(a, b, acc, out, True)


@njit(nogil=True, cache=True, inline="always")
def _check_shapes(a, b, out):
    m, k = a.shape
    if b.shape[1] != k or out.shape[0] != b.shape[0] or out.shape[1] != m or out.shape[2] != b.shape[2]:
        raise ValueError("panel product: shapes are not a (m, k), b (panels, k, n), out (panels, m, n)")


@njit(nogil=True, cache=True, inline="always")
def _product(a, b, source, out, accumulate):
    """out = a @ b, plus source with `accumulate` (source is out itself, or another array)."""
    if out.size == 0:
        return
    separate = accumulate and not _same_view(source, out)  # a source other than out to add
    if a.shape[1] == 0:
        if not accumulate:
            out[...] = 0
        elif separate:
            out[...] = source
        return
    if _micro_kernel_takes(a, b, out) and (not separate or _source_takes(source, out)):
        _run_blocks(a, b, source, out, accumulate)
    elif blas.overlaps(out, a) or blas.overlaps(out, b) or (separate and blas.overlaps(out, source)):
        # out shares memory with an operand (a task may name one array as input and output):
        # everything is read first, as numpy's a @ b reads before it writes.
        product = np.empty(out.shape, out.dtype)
        for q in range(b.shape[0]):
            blas.gemm(a, b[q], product[q], False)
        if accumulate:
            out[...] = source + product
        else:
            out[...] = product
    else:
        if separate:
            out[...] = source
        for q in range(b.shape[0]):
            blas.gemm(a, b[q], out[q], accumulate)


@njit(nogil=True, cache=True, inline="always")
def _same_view(x, y):
    same_place = x.ctypes.data == y.ctypes.data and x.shape == y.shape and x.strides == y.strides
    return same_place and _one_dtype(x, y)


@njit(nogil=True, cache=True, inline="always")
def _run_blocks(a, b, source, out, accumulate):
    m, k = a.shape
    lda, lds, ldo = a.strides[0] // 4, source.strides[1] // 4, out.strides[1] // 4
    for q in range(b.shape[0]):
        panel = b.ctypes.data + q * b.strides[0]
        from_rows = source.ctypes.data + q * source.strides[0]
        rows = out.ctypes.data + q * out.strides[0]
        whole = m - m % ROWS
        for i in range(0, whole, ROWS):
            _rows(ROWS, accumulate, a.ctypes.data + i * a.strides[0], lda, panel,
                  from_rows + i * source.strides[1], lds, rows + i * out.strides[1], ldo, k)
        for i in range(whole, m):  # the rows after the last whole block, one at a time
            _rows(1, accumulate, a.ctypes.data + i * a.strides[0], lda, panel,
                  from_rows + i * source.strides[1], lds, rows + i * out.strides[1], ldo, k)


@njit(nogil=True, cache=True, inline="always")
def _rows(count, accumulate, a, lda, b, source, lds, out, ldo, k):
    # _block's flag is a literal: one specialisation each
    if accumulate:
        _block(count, True, a, lda, b, source, lds, out, ldo, k)
    else:
        _block(count, False, a, lda, b, source, lds, out, ldo, k)


@njit(nogil=True, cache=True, inline="always")
def _micro_kernel_takes(a, b, out):
    """float32 panels of 32 contiguous columns, rows of a and out in unit stride (element-aligned),
    and an output that shares no memory with an operand."""
    if not _all_float32(a, b, out):
        return False
    m, k = a.shape
    if b.shape[2] != PANEL or out.shape[2] != PANEL or m == 0 or k == 0 or b.shape[0] == 0:
        return False
    if a.strides[1] != 4 or b.strides[2] != 4 or b.strides[1] != 4 * PANEL or out.strides[2] != 4:
        return False
    if a.strides[0] % 4 or out.strides[1] % 4:
        return False
    return not (blas.overlaps(out, a) or blas.overlaps(out, b))


@njit(nogil=True, cache=True, inline="always")
def _source_takes(source, out):
    """Whether the micro-kernel can add a source other than out: float32 rows in unit stride
    (element-aligned) apart from out's memory (a block's source vectors are read as its out
    vectors are written, not before other blocks' are)."""
    if not _all_float32(source) or source.strides[2] != 4 or source.strides[1] % 4 or source.strides[0] % 4:
        return False
    return not blas.overlaps(out, source)


def _all_float32(*arrays):
    """Whether every array is float32 (a constant of the types)."""


@overload(_all_float32)
def _all_float32_impl(*arrays):
    verdict = all(x.dtype == types.float32 for x in arrays)
    return lambda *arrays: verdict


def _one_dtype(*arrays):
    """Whether the arrays share one dtype (a constant of the types)."""


@overload(_one_dtype)
def _one_dtype_impl(*arrays):
    verdict = len({x.dtype for x in arrays}) == 1
    return lambda *arrays: verdict
