"""Composite tiles for LLM layers: RMSNorm, rotary embedding, SwiGLU, flash-attention blocks.

Attention kernels take (heads, rows, head_dim) views, whose leading dim is a batch: one task
covers every head of a tile. The flash-attention state of a query tile is its running max m and
sum l, each (heads, rows, 1), and its unnormalised output o. Each (query tile, key tile) pair is
three tasks: scores S = q·kᵀ/√d (masked when causal), the online-softmax update (S becomes
P = exp(S − m_new), l and m move on, `rescale` = exp(m_old − m_new)), and o = o·rescale + P·v.
"""

import math

from pto_gpu.kernels.tiles import COLUMN_BLOCK, column_blocks, contract

import pto_gpu as pto
from pto_gpu.dtypes import DataType
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.family import family


@family(worker=pto.VECTOR, shapes=("m n", "1 n", "m n"), scalars=("eps",))
def rmsnorm(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
    """out = x / sqrt(mean(x², row) + eps) * weight. On CUDA a row wider than COLUMN_BLOCK goes
    in column blocks (a lane holds its columns of a tile row in registers), in two passes: the
    sum of squares, then the scaling."""
    f.memref("x", dtype, (m, n)).memref("weight", dtype, (1, n)).memref("out", dtype, (m, n))
    f.scalar("eps", pto.FLOAT64)
    cols = n if local_memory is None or n <= COLUMN_BLOCK else COLUMN_BLOCK
    f.tile("t", m, cols, dtype).tile("square", m, cols, dtype).tile("w", 1, cols, dtype)
    f.tile("norm", m, 1, dtype)
    if cols == n:
        f.load("t", "x").mul("square", "t", "t").rowsum("norm", "square")
    else:
        f.tile("part", m, 1, dtype).fill("norm", 0.0).for_loop("j", 0, n, cols)
        f.load("t", "x", 0, "j").mul("square", "t", "t").rowsum("part", "square").add("norm", "part", "norm")
        f.end_for()
    f.muls("norm", "norm", 1.0 / n).adds("norm", "norm", "eps").rsqrt("norm", "norm")
    column: int | str = 0 if cols == n else "j"
    if cols != n:
        f.for_loop("j", 0, n, cols).load("t", "x", 0, "j")
    f.rowexpandmul("t", "t", "norm").load("w", "weight", 0, column).colexpandmul("t", "t", "w")
    f.store("out", "t", 0, column)
    if cols != n:
        f.end_for()


@family(worker=pto.VECTOR, shapes=("m n",), scalars=("first_position", "heads"), structural=("heads",))
def rope(f: FunctionBuilder, dtype: DataType, m: int, n: int, heads: int) -> None:
    """Rotate each head's two halves by position-dependent angles (in place): with
    θ(r, j) = (first_position + r) · 10000^(−2j/dim), (x1, x2) -> (x1 cos θ − x2 sin θ,
    x2 cos θ + x1 sin θ). The angles and their cos and sin are float64 tiles whatever x's
    dtype: θ reaches the thousands, where float32 would lose 1e-4 of it (3e-4 at position 4000)."""
    if heads <= 0 or n % heads or (n // heads) % 2:
        raise pto.ParamError(f"rope: a row of {n} does not split into {heads} heads of an even size")
    dim = n // heads
    half = dim // 2
    f.memref("x", dtype, (m, n)).scalar("first_position", pto.INT64).scalar("heads", pto.INT64)
    f.scalar_var("second", pto.INT64)
    for tile in ("angle", "frequency", "cos64", "sin64"):
        f.tile(tile, m, half, pto.FLOAT64)
    for tile in ("cos", "sin", "x1", "x2", "y1", "y2", "term"):
        f.tile(tile, m, half, dtype)
    f.rowidx("angle", "first_position").colidx("frequency", 0.0)
    f.muls("frequency", "frequency", -2.0 * math.log(10000.0) / dim).exp("frequency", "frequency")
    f.mul("angle", "angle", "frequency").cos("cos64", "angle").sin("sin64", "angle")
    f.cvt("cos", "cos64").cvt("sin", "sin64")
    f.for_loop("first", 0, n, dim).scalar_add("second", "first", half)
    f.load("x1", "x", 0, "first").load("x2", "x", 0, "second")
    f.mul("y1", "x1", "cos").mul("term", "x2", "sin").sub("y1", "y1", "term")
    f.mul("y2", "x2", "cos").mul("term", "x1", "sin").add("y2", "y2", "term")
    f.store("x", "y1", 0, "first").store("x", "y2", 0, "second")
    f.end_for()


@family(worker=pto.VECTOR, shapes=("m n", "m n"))
def swiglu(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
    """gate = silu(gate) * up (in place)."""
    f.memref("gate", dtype, (m, n)).memref("up", dtype, (m, n))
    with column_blocks(f, n, local_memory) as (cols, j):
        f.tile("g", m, cols, dtype).tile("u", m, cols, dtype).load("g", "gate", 0, j).load("u", "up", 0, j)
        f.silu("g", "g").mul("g", "g", "u").store("gate", "g", 0, j)


@family(worker=pto.VECTOR, shapes=("h m 1", "h m 1", "h m d"))
def flash_init(f: FunctionBuilder, dtype: DataType, m: int, d: int) -> None:
    f.memref("running_max", dtype, (m, 1)).memref("running_sum", dtype, (m, 1)).memref("out", dtype, (m, d))
    f.tile("column", m, 1, dtype).tile("o", m, d, dtype)
    f.fill("column", -math.inf).store("running_max", "column")
    f.fill("column", 0.0).store("running_sum", "column")
    f.fill("o", 0.0).store("out", "o")


@family(worker=pto.CUBE, split="m", shapes=("h m d", "h n d", "h m n"),
        scalars=("q_start", "k_start", "causal"))
def flash_scores(f: FunctionBuilder, dtype: DataType, m: int, d: int, n: int,
                 local_memory: int | None) -> None:
    """scores = q·kᵀ/√d, -inf where a key comes after its query (when causal)."""
    f.memref("q", dtype, (m, d)).memref("k", dtype, (n, d)).memref("scores", dtype, (m, n))
    f.scalar("q_start", pto.INT64).scalar("k_start", pto.INT64).scalar("causal", pto.INT64)
    f.tile("s", m, n, dtype)
    contract(f, dtype, "s", "q", "k", m, d, n, local_memory, b_transposed=True)
    f.muls("s", "s", 1.0 / math.sqrt(d))
    f.if_then("causal", "ne", 0).causal_mask("s", "s", "q_start", "k_start").end_if()
    f.store("scores", "s")


@family(worker=pto.VECTOR, shapes=("h m n", "h m 1", "h m 1", "h m 1"))
def flash_softmax_update(f: FunctionBuilder, dtype: DataType, m: int, n: int) -> None:
    f.memref("scores", dtype, (m, n)).memref("running_max", dtype, (m, 1))
    f.memref("running_sum", dtype, (m, 1)).memref("rescale", dtype, (m, 1))
    f.tile("s", m, n, dtype)
    for tile in ("old_max", "new_max", "total", "factor", "part"):
        f.tile(tile, m, 1, dtype)
    f.load("s", "scores").load("old_max", "running_max").load("total", "running_sum")
    f.rowmax("part", "s").max("new_max", "old_max", "part")
    f.sub("factor", "old_max", "new_max").exp("factor", "factor").store("rescale", "factor")
    f.rowexpandsub("s", "s", "new_max").exp("s", "s").store("scores", "s")
    f.mul("total", "total", "factor").rowsum("part", "s").add("total", "total", "part")
    f.store("running_sum", "total").store("running_max", "new_max")


@family(worker=pto.CUBE, split="m", shapes=("h m n", "h n d", "h m 1", "h m d"))
def flash_pv(f: FunctionBuilder, dtype: DataType, m: int, n: int, d: int, local_memory: int | None) -> None:
    """out = out * rescale + probabilities @ v."""
    f.memref("probabilities", dtype, (m, n)).memref("v", dtype, (n, d)).memref("rescale", dtype, (m, 1))
    f.memref("out", dtype, (m, d)).tile("o", m, d, dtype).tile("factor", m, 1, dtype)
    f.load("o", "out").load("factor", "rescale").rowexpandmul("o", "o", "factor")
    contract(f, dtype, "o", "probabilities", "v", m, n, d, local_memory, accumulate=True).store("out", "o")


@family(worker=pto.VECTOR, shapes=("h m d", "h m 1", "h m d"))
def flash_normalise(f: FunctionBuilder, dtype: DataType, m: int, d: int) -> None:
    f.memref("acc", dtype, (m, d)).memref("running_sum", dtype, (m, 1)).memref("out", dtype, (m, d))
    f.tile("o", m, d, dtype).tile("total", m, 1, dtype)
    f.load("o", "acc").load("total", "running_sum").rowexpanddiv("o", "o", "total").store("out", "o")
