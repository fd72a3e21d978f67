"""GEMM on a right operand packed in panels of 32 columns: a register-blocked micro-kernel.

`panels_product(a, b, out, accumulate)` computes out[q] = a @ b[q] (or += with `accumulate`)
for every panel q of b (panels, k, 32) and out (panels, m, 32): the layout BLAS packs its right
operand into inside every call. A tiled matmul that packs B once (orchestration/matmul.py's
`tiled_matmul_panels`) gives each tile product contiguous panels, so a product is the
micro-kernel alone: 8 rows x 32 columns of out in sixteen 16-float vector accumulators, a's
elements read in place and broadcast, b's rows loaded as vectors, one fused multiply-add per
accumulator and step of k. A 128³ float32 product takes 22–24 µs on one core of the Sapphire
Rapids VM with its operands in cache, 29–31 µs in a run (its operands come from L3), against
42–46 µs for BLAS on the strided tiles, which packs them at every call.

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
def _block(typingctx, rows, accumulate, a, lda, b, out, ldo, k):
    """out[r, 0:32] (+)= sum over kk < k of a[r * lda + kk] * b[kk * 32 : kk * 32 + 32] for r <
    rows (a literal), all float32 addresses, lda and ldo in elements."""
    if not isinstance(rows, types.IntegerLiteral) or not isinstance(accumulate, types.BooleanLiteral):
        return None
    count, add = rows.literal_value, accumulate.literal_value

    def codegen(context, builder, signature, args):
        _, _, a_address, lda, b_address, out_address, ldo, depth = args
        f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
        vector = ir.VectorType(f32, _VECTOR)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                             f"llvm.fma.v{_VECTOR}f32")
        a_base, b_base, out_base = (builder.inttoptr(x, f32.as_pointer())
                                    for x in (a_address, b_address, out_address))

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
                target = vector_at(out_base, builder.add(builder.mul(i64(r), ldo), i64(h * _VECTOR)))
                if add:
                    total = builder.fadd(builder.load(target, align=4), total)
                builder.store(total, target, align=4)
        return context.get_dummy_value()

    return types.void(rows, accumulate, a, lda, b, out, ldo, k), codegen


@njit(nogil=True, cache=True)
def panels_product(a, b, out, accumulate):
    """out[q] = a @ b[q], or out[q] += a @ b[q] with `accumulate`, for every q: a (m, k),
    b (panels, k, n) and out (panels, m, n) of one float dtype."""
    m, k = a.shape
    panel_count, n = b.shape[0], b.shape[2]
    if b.shape[1] != k or out.shape[0] != panel_count or out.shape[1] != m or out.shape[2] != n:
        raise ValueError("panels_product: shapes are not a (m, k), b (panels, k, n), out (panels, m, n)")
    if out.size == 0:
        return
    if k == 0:
        if not accumulate:
            out[...] = 0
        return
    if _micro_kernel_takes(a, b, out):
        _run_blocks(a, b, out, accumulate)
    elif blas.overlaps(out, a) or blas.overlaps(out, b):
        # out shares memory with an operand (a task may name one array as input and output):
        # every product is read first, as numpy's a @ b reads before it writes.
        product = np.empty(out.shape, out.dtype)
        for q in range(panel_count):
            blas.gemm(a, b[q], product[q], False)
        if accumulate:
            out += product
        else:
            out[...] = product
    else:
        for q in range(panel_count):
            blas.gemm(a, b[q], out[q], accumulate)


@njit(nogil=True, cache=True, inline="always")
def _run_blocks(a, b, out, accumulate):
    m, k = a.shape
    lda, ldo = a.strides[0] // 4, out.strides[1] // 4
    for q in range(b.shape[0]):
        panel = b.ctypes.data + q * b.strides[0]
        rows = out.ctypes.data + q * out.strides[0]
        whole = m - m % ROWS
        for i in range(0, whole, ROWS):
            _rows(ROWS, accumulate, a.ctypes.data + i * a.strides[0], lda, panel, rows + i * out.strides[1],
                  ldo, k)
        for i in range(whole, m):  # the rows after the last whole block, one at a time
            _rows(1, accumulate, a.ctypes.data + i * a.strides[0], lda, panel, rows + i * out.strides[1],
                  ldo, k)


@njit(nogil=True, cache=True, inline="always")
def _rows(count, accumulate, a, lda, b, out, ldo, k):
    # _block's flag is a literal: one specialisation each
    if accumulate:
        _block(count, True, a, lda, b, out, ldo, k)
    else:
        _block(count, False, a, lda, b, out, ldo, k)


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


def _all_float32(*arrays):
    """Whether every array is float32 (a constant of the types)."""


@overload(_all_float32)
def _all_float32_impl(*arrays):
    verdict = all(x.dtype == types.float32 for x in arrays)
    return lambda *arrays: verdict
