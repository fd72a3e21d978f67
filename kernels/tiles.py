"""Data movement and matrix tiles (TLOAD/TSTORE, TFILL, TMATMUL, TMATMUL_ACC).

The matmuls run BLAS on the task's views: cuBLAS through CuPy on the GPU (their generated
kernels run while a CUDA graph is being captured, where CuPy refuses cuBLAS calls), and on the
CPU, where the tile model's copies would cost more than the product when b is a whole weight
matrix (3x at 32x4096x4096), kernels/blas.py's gemm from numba code, which native workers run
without the GIL (numpy for dtypes BLAS lacks). Their programs stay the definition the tests
hold both to.
"""

import contextlib
from collections.abc import Iterator

import numpy as np
from numba import njit

import pto_gpu as pto
from pto_gpu.dtypes import DataType
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_codegen import COLUMN_BLOCK
from pto_gpu.isa.cuda_lines import WARP
from pto_gpu.isa.cuda_mma import (
    MMA_K,
    REGISTER_ACCUMULATORS,
    TENSOR_CORE_BYTES,
    TENSOR_CORE_DTYPES,
    accumulator_floats,
    packed_pitch,
)
from pto_gpu.isa.family import family
from pto_gpu.native_abi import NjitEntries

from . import blas, panels


@contextlib.contextmanager
def column_blocks(f: FunctionBuilder, n: int, local_memory: int | None,
                  var: str = "j") -> Iterator[tuple[int, int | str]]:
    """The body of a row-wise kernel over n columns, once (the CPU: local_memory None) or in a
    FOR %var over blocks of COLUMN_BLOCK (CUDA, n wider than that: a lane holds a tile row's
    columns in registers, so a 4096-wide tile would spill): yields (tile width, the column
    offset operand)."""
    if local_memory is None or n <= COLUMN_BLOCK:
        yield n, 0
        return
    f.for_loop(var, 0, n, COLUMN_BLOCK)
    yield COLUMN_BLOCK, var
    f.end_for()


def contract(f: FunctionBuilder, dtype: DataType, dst: str, a: str, b: str, m: int, k: int, n: int,
             local_memory: int | None, *, b_transposed: bool = False, accumulate: bool = False,
             b_col: int | str = 0, result_in_registers: bool = False) -> FunctionBuilder:
    """Tile `dst` (m x n, declared by the caller) = (or += with `accumulate`) memref `a` (m x k)
    @ memref `b` (k x n; n x k with `b_transposed`, so a @ bᵀ) from its column (row) `b_col`
    on, over chunks of k.

    The CUDA code keeps the right operand of a product (and a transpose's source) whole in shared
    memory, so a chunk's kc x n of them, in float64 at worst, must fit `local_memory` bytes; on
    the CPU (None) one chunk is the whole contraction, one BLAS call. `result_in_registers`: the
    caller only loads dst and stores it besides these products, so on tensor cores it takes no
    shared memory (cuda_codegen's fragments)."""
    if local_memory is None:
        chunk = k
    else:
        chunk = _chunk(dtype, m, k, n, b_transposed, local_memory, result_in_registers)
    left, right = f"{dst}_a", f"{dst}_b"
    f.tile(left, m, chunk, dtype).tile(right, chunk, n, dtype)
    if b_transposed:
        f.tile(f"{dst}_bt", n, chunk, dtype)

    def step(offset: int | str, product: str) -> None:
        f.load(left, a, 0, offset)
        if b_transposed:
            f.load(f"{dst}_bt", b, b_col, offset).trans(right, f"{dst}_bt")
        else:
            f.load(right, b, offset, b_col)
        getattr(f, product)(dst, left, right)

    step(0, "matmul_acc" if accumulate else "matmul")
    if chunk < k:
        f.for_loop(f"{dst}_k", chunk, k, chunk)
        step(f"{dst}_k", "matmul_acc")
        f.end_for()
    return f


# The widest chunk of k a tensor-core product summed over a loop takes at a time: four steps of
# the instruction, so that the chunks ahead take three or four buffers (cuda_codegen's stages:
# the 64 x 128 matmul band 3, 79,872 bytes; CUTLASS's sm_80 GEMMs take 32 or 64 of k a stage,
# 3 to 5 stages). Wider ones pushed the kernels held to 128 registers for two blocks an SM
# into spills (ptxas, sm_90: the 32 x 128 band spilled 20 bytes at 144) and leave two buffers;
# bench/test_gpu.py -k generated_tiles sets it to 96 and 48 beside it.
TENSOR_CHUNK_K = 64


def _chunk(dtype: DataType, m: int, k: int, n: int, b_transposed: bool, local_memory: int,
           result_in_registers: bool) -> int:
    """The chunk of k a CUDA product takes at a time. On tensor cores (float16, bfloat16) the
    result is in shared memory as float (unless it is in registers) and the chunks of the
    operands as T in padded rows (cuda_codegen's packed tiles; a transposed b is read from its
    load, n x kc): all of k where that fits beside the result, else the widest chunk of whole
    steps of the instruction's k, at most TENSOR_CHUNK_K, that fits (the generator then gives
    the operands more buffers above `local_memory`, so the next chunks' copies run while this
    one is multiplied: cuda_codegen's prefetched loads), else the product runs on FMA, and the
    chunk is as there: b's kc x n, as float64, fills the budget."""
    if dtype in TENSOR_CORE_DTYPES:
        size = dtype.numpy.itemsize
        result = 0 if result_in_registers else TENSOR_CORE_BYTES * m * n

        def need(kc: int) -> int:
            right = size * n * packed_pitch(kc) if b_transposed else size * kc * packed_pitch(n)
            return result + size * m * packed_pitch(kc) + right

        if need(k) <= local_memory:
            return k
        fitting = [kc for kc in range(MMA_K, min(k, TENSOR_CHUNK_K + 1), MMA_K) if need(kc) <= local_memory]
        if fitting:
            return fitting[-1]
    whole = 2 if b_transposed else 1  # tiles of kc x n read whole: b's, and its transpose's source
    chunk = max(1, min(k, local_memory // (8 * n * whole)))
    if chunk < k and chunk > WARP:  # whole warps of columns: a's chunk fills its lanes' registers
        chunk -= chunk % WARP
    return chunk


def _copy(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
    f.memref("src", dtype, (m, n)).memref("dst", dtype, (m, n))
    with column_blocks(f, n, local_memory) as (cols, j):
        f.tile("t", m, cols, dtype).load("t", "src", 0, j).store("dst", "t", 0, j)


copy = family(worker=pto.ACCELERATOR, shapes=("m n", "m n"), name="copy")(_copy)
# The same copy for each index of a leading batch dim, on the CUBE workers: its user,
# tiled_matmul_panels, packs B's panels with it, so these copies run beside the products. On
# the one ACCELERATOR worker each took a wake-up across classes: the 2048² run was 1.6x slower.
copy_batched = family(worker=pto.CUBE, shapes=("b m n", "b m n"), name="copy_batched")(_copy)


@family(worker=pto.VECTOR, shapes=("m n",))
def zero(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
    f.memref("out", dtype, (m, n))
    with column_blocks(f, n, local_memory) as (cols, j):
        f.tile("t", m, cols, dtype).fill("t", 0.0).store("out", "t", 0, j)


def _accumulate_product(a, b, acc):
    acc += a @ b  # numpy arrays (a broadcast over the panels of the panel families)


def _numpy_matmul(a, b, out):
    np.matmul(a, b, out=out)


@njit(nogil=True, cache=True)
def _gemm(a, b, out):
    blas.gemm(a, b, out, False)


@njit(nogil=True, cache=True)
def _gemm_acc(a, b, acc):
    blas.gemm(a, b, acc, True)


def _cpu_library(native, numpy_way):
    """A matmul family's CPU library: on a Python worker, the njit function its native workers
    run (so both give the same bits) where BLAS takes the dtype, else `numpy_way` (numpy
    broadcasts a over the panels of the panel families as BLAS's per-panel calls do)."""
    def run(*operands):
        if blas.takes(*operands):
            native(*operands)
        else:
            numpy_way(*operands)

    return run


# The floats a lane holds of a tensor-core band's result in registers (_product): half of what
# the generator allows, which leaves registers for the loads in flight and two blocks an SM. For
# the LLaMA MLP's matmul_acc (64 x 11008 in column blocks) a 64 x 256 block took 254 registers a
# thread when it was allowed, 64 x 128 takes 128 (bench/test_gpu_code.py -k ptxas). A warp's
# share of the band is then 32 x 32, whose fragments cost a byte of ldmatrix for 16 flops: an
# SM's shared memory (128 bytes a clock) feeds half an H100's or H200's mma peak at most. A
# 128 x 128 band (64 floats, a warp's share 64 x 32: 21 flops a byte) takes 180 registers, a
# block an SM; bench/test_gpu.py -k generated_tiles measures it beside the family's.
BAND_RESULT_FLOATS = REGISTER_ACCUMULATORS // 2


def _product(f: FunctionBuilder, dtype: DataType, out: str, m: int, k: int, n: int, local_memory: int | None,
             accumulate: bool, source: str | None = None) -> None:
    """out = a @ b, plus `source` (default: out itself) with `accumulate`; on CUDA in blocks of
    COLUMN_BLOCK columns when b is too wide for even 8 of its rows to fit shared memory (a
    4096 x 11008 weight), and on tensor cores (float16, bfloat16) as well, the result of a
    band's rows (TENSOR_BAND: the families split m) in registers, at most BAND_RESULT_FLOATS a
    lane."""
    if local_memory is not None and dtype in TENSOR_CORE_DTYPES:
        cols = min(n, COLUMN_BLOCK)
        while cols > WARP and accumulator_floats(m, cols) > BAND_RESULT_FLOATS:
            cols //= 2
    elif local_memory is not None and 8 * n * min(k, 8) > local_memory:
        cols = min(n, COLUMN_BLOCK)
    else:
        cols = n
    wide = cols < n
    column: int | str = "j" if wide else 0
    f.tile("c", m, cols, dtype)
    if wide:
        f.for_loop("j", 0, n, cols)
    if accumulate:
        f.load("c", source or out, 0, column)
    contract(f, dtype, "c", "a", "b", m, k, cols, local_memory, accumulate=accumulate, b_col=column,
             result_in_registers=True)
    f.store(out, "c", 0, column)
    if wide:
        f.end_for()


def _matmul(f: FunctionBuilder, dtype: DataType, m: int, k: int, n: int, local_memory: int | None) -> None:
    """out = a @ b."""
    f.memref("a", dtype, (m, k)).memref("b", dtype, (k, n)).memref("out", dtype, (m, n))
    _product(f, dtype, "out", m, k, n, local_memory, accumulate=False)


def _matmul_acc(f: FunctionBuilder, dtype: DataType, m: int, k: int, n: int,
                local_memory: int | None) -> None:
    """acc += a @ b."""
    f.memref("a", dtype, (m, k)).memref("b", dtype, (k, n)).memref("acc", dtype, (m, n))
    _product(f, dtype, "acc", m, k, n, local_memory, accumulate=True)


def _matmul_add(f: FunctionBuilder, dtype: DataType, m: int, k: int, n: int,
                local_memory: int | None) -> None:
    """out = acc + a @ b."""
    f.memref("a", dtype, (m, k)).memref("b", dtype, (k, n)).memref("acc", dtype, (m, n))
    f.memref("out", dtype, (m, n))
    _product(f, dtype, "out", m, k, n, local_memory, accumulate=True, source="acc")


# On CUDA a product is one cuBLAS call (gemm=beta), where its tiles' layout is cuBLAS's. On
# tensor cores a band's result is in registers (_product), so bands of 64 rows fit: b's chunk,
# the bulk of what a block reads, then serves twice the rows (a 32-row band read 1.67x the
# bytes a multiply-add, at 128 columns).
TENSOR_BAND = 64
matmul = family(worker=pto.CUBE, split="m", tensor_band=TENSOR_BAND, shapes=("m k", "k n", "m n"),
                name="matmul", gemm=0.0, library_cpu=_cpu_library(_gemm, _numpy_matmul),
                library_native=NjitEntries(_gemm, blas.DTYPES))(_matmul)
matmul_acc = family(worker=pto.CUBE, split="m", tensor_band=TENSOR_BAND, shapes=("m k", "k n", "m n"),
                    name="matmul_acc", gemm=1.0, library_cpu=_cpu_library(_gemm_acc, _accumulate_product),
                    library_native=NjitEntries(_gemm_acc, blas.DTYPES))(_matmul_acc)


# The products of a tiled matmul whose right operand is packed in panels of 32 columns
# (orchestration/matmul.py's tiled_matmul_panels): out[q] (+)= a @ b[q] for each panel q of b
# (panels, k, n) and of out (panels, m, n), a SPLIT view of the output tile, and out[q] =
# acc[q] + a @ b[q]. Each panel's program is a matmul's (the definition, and the CUDA code);
# the CPU runs kernels/panels.py's micro-kernel, CUDA one strided-batched cuBLAS call over the
# panels (a's stride 0), where their layout allows; panels_add through CuPy.
@njit(nogil=True, cache=True)
def _panels(a, b, out):
    panels.panels_product(a, b, out, False)


@njit(nogil=True, cache=True)
def _panels_acc(a, b, acc):
    panels.panels_product(a, b, acc, True)


def _add_product(a, b, acc, out):
    out[...] = acc + a @ b  # numpy or CuPy arrays, a broadcast over the panels (with CuPy: cuBLAS)


@njit(nogil=True, cache=True)
def _panels_add(a, b, acc, out):
    panels.panels_product_add(a, b, acc, out)


matmul_panels = family(worker=pto.CUBE, split="m", tensor_band=TENSOR_BAND,
                       shapes=("m k", "p k n", "p m n"), name="matmul_panels", gemm=0.0,
                       library_cpu=_cpu_library(_panels, _numpy_matmul),
                       library_native=NjitEntries(_panels, blas.DTYPES))(_matmul)
matmul_panels_acc = family(worker=pto.CUBE, split="m", tensor_band=TENSOR_BAND,
                           shapes=("m k", "p k n", "p m n"), name="matmul_panels_acc", gemm=1.0,
                           library_cpu=_cpu_library(_panels_acc, _accumulate_product),
                           library_native=NjitEntries(_panels_acc, blas.DTYPES))(_matmul_acc)
# The last product of a chain accumulated in a heap tile, written into C's tile from it: one
# pass over C's strided rows, where a product into the accumulator and a copy took two tasks.
matmul_panels_add = family(worker=pto.CUBE, split="m", tensor_band=TENSOR_BAND,
                           shapes=("m k", "p k n", "p m n", "p m n"),
                           name="matmul_panels_add", library=_add_product,
                           library_cpu=_cpu_library(_panels_add, _add_product),
                           library_native=NjitEntries(_panels_add, blas.DTYPES))(_matmul_add)
