"""Composite tiles for LLM layers: RMSNorm, rotary embedding, SwiGLU, flash-attention blocks.

Attention kernels take (heads, rows, head_dim) views, whose leading dim is a batch: one task
covers every head of a tile. The flash-attention state of a query tile is its running max m and
sum l, each (heads, rows, 1), and its unnormalised output o. Each (query tile, key tile) pair is
three tasks: scores S = q·kᵀ/√d (masked when causal), the online-softmax update (S becomes
P = exp(S − m_new), l and m move on, `rescale` = exp(m_old − m_new)), and o = o·rescale + P·v.
`flash_attention_tile` is the same arithmetic as one task per query tile: the loop over key
blocks runs inside it, the state in its tiles, where the three tasks kept it in memory.
"""

import math

from pto_gpu.kernels.tiles import COLUMN_BLOCK, column_blocks, contract

import pto_gpu as pto
from pto_gpu.backends.cuda_abi import SHARED_OPT_IN
from pto_gpu.dtypes import DataType
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_mma import TENSOR_CORE_DTYPES
from pto_gpu.isa.family import family, first_fitting


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
    """scores = q·kᵀ/√d, -inf where a key comes after its query (when causal: a tile whose keys
    all come before its first query has none)."""
    f.memref("q", dtype, (m, d)).memref("k", dtype, (n, d)).memref("scores", dtype, (m, n))
    f.scalar("q_start", pto.INT64).scalar("k_start", pto.INT64).scalar("causal", pto.INT64)
    f.scalar_var("last_key", pto.INT64).tile("s", m, n, dtype)
    contract(f, dtype, "s", "q", "k", m, d, n, local_memory, b_transposed=True)
    f.muls("s", "s", 1.0 / math.sqrt(d))
    f.if_then("causal", "ne", 0).scalar_add("last_key", "k_start", n - 1)
    f.if_then("last_key", "gt", "q_start").causal_mask("s", "s", "q_start", "k_start").end_if()
    f.end_if()
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


# Keys a block of flash_attention_tile on the CPU: s is a query tile's rows x this many floats,
# each product one BLAS call.
CPU_KEY_BLOCK = 128


@family(worker=pto.CUBE, shapes=("h m d", "h n d", "h n d", "h m d"), scalars=("q_start", "causal"))
def flash_attention_tile(f: FunctionBuilder, dtype: DataType, m: int, d: int, n: int,
                         local_memory: int | None, block_shared: int = SHARED_OPT_IN) -> None:
    """out = softmax(q·kᵀ/√d)·v over the n keys of k and v, the keys after each query masked
    when causal (query i is row q_start + i, key j row j; a row that sees no key, q_start + i
    < 0, is NaN, as a softmax over nothing is): a query tile's attention in one task, the
    online softmax over blocks of keys in a loop inside it, which stops at the last key a
    causal tile sees. The CUDA code goes
    over the tile's rows in passes and d in chunks where its tiles would not fit a block whole
    (the first of `attention_sizes` that does on the GPU: a block holds an SM, so where the GPU
    gives it the shared memory, sm_80's and sm_90's, q stays whole at head dim 128)."""
    if local_memory is None:  # the CPU: the whole tile a pass, BLAS over CPU_KEY_BLOCK keys
        sizes = m, min(n, CPU_KEY_BLOCK), d
    else:
        # 16-bit tiles keep the scores and output in registers in whole rows, a warp 16 rows of
        # the pass: 128 rows keep every warp at work; the other forms stay at 64
        widest = 128 if dtype in TENSOR_CORE_DTYPES else 64
        sizes = first_fitting(f, attention_sizes(m, d, n, widest),
                              lambda trial, sizes: _attention(trial, dtype, m, d, n, *sizes), block_shared)
    _attention(f, dtype, m, d, n, *sizes)


def attention_sizes(m: int, d: int, n: int, widest: int = 64) -> list[tuple[int, int, int]]:
    """The (query rows a pass, at most `widest`; keys a block; columns of d a chunk of q·kᵀ) a
    CUDA instance may take, preferred first: the most scores a key block (the work between two
    of its barriers), then the most rows (a key block read serves more of them), then the
    widest chunk."""
    candidates = [(rows, keys, chunk) for rows in _halves(m, widest) for keys in _halves(n, 64)
                  for chunk in _halves(d, d)]
    return sorted(candidates, key=lambda c: (c[0] * c[1], c[0], c[2]), reverse=True)


def _halves(size: int, widest: int) -> list[int]:
    """min(size, widest), then its halves while they are 16 or more (an mma instruction's rows
    and k)."""
    sizes = [min(size, widest)]
    while sizes[-1] // 2 >= 16:
        sizes.append(sizes[-1] // 2)
    return sizes


def _attention(f: FunctionBuilder, dtype: DataType, m: int, d: int, n: int, rows: int, keys: int,
               chunk: int) -> None:
    """flash_attention_tile's program in passes of `rows` query rows, blocks of `keys` keys and
    chunks of `chunk` columns of q·kᵀ's d. The first key block starts a row's state (its max,
    sum and o), a later one rescales it by exp(old max − new max): the state tiles take the
    valid rows of the pass (a tile's last pass may be a tail) from the scores."""
    f.memref("q", dtype, (m, d)).memref("k", dtype, (n, d)).memref("v", dtype, (n, d))
    f.memref("out", dtype, (m, d)).scalar("q_start", pto.INT64).scalar("causal", pto.INT64)
    for scalar in ("first_query", "last_key", "stop", "block_last"):
        f.scalar_var(scalar, pto.INT64)
    f.tile("s", rows, keys, dtype).tile("q_part", rows, chunk, dtype).tile("k_part", keys, chunk, dtype)
    f.tile("k_t", chunk, keys, dtype).tile("vt", keys, d, dtype).tile("o", rows, d, dtype)
    for tile in ("running_max", "new_max", "factor", "total", "part"):
        f.tile(tile, rows, 1, dtype)
    row: int | str = 0
    if rows < m:
        f.scalar_var("query_rows", pto.INT64).scalar_dim("query_rows", "q", 0)
        f.for_loop("row", 0, "query_rows", rows)
        row = "row"
    f.scalar_add("first_query", "q_start", row).scalar_dim("stop", "k", 0)
    f.if_then("causal", "ne", 0)  # no key past the pass's last query, but one block at least
    f.scalar_add("last_key", "first_query", rows).scalar_min("stop", "stop", "last_key")
    f.scalar_max("stop", "stop", 1).end_if()
    if chunk == d:
        f.load("q_part", "q", row, 0)
    f.for_loop("key", 0, "stop", keys)
    if chunk < d:
        f.load("q_part", "q", row, 0)
    f.load("k_part", "k", "key", 0).trans("k_t", "k_part").matmul("s", "q_part", "k_t")
    if chunk < d:
        f.for_loop("column", chunk, d, chunk).load("q_part", "q", row, "column")
        f.load("k_part", "k", "key", "column").trans("k_t", "k_part").matmul_acc("s", "q_part", "k_t")
        f.end_for()
    f.muls("s", "s", 1.0 / math.sqrt(d))
    # The mask changes a block only where a key of it is past the pass's first query: the
    # blocks below the diagonal skip its pass over the scores.
    f.if_then("causal", "ne", 0).scalar_add("block_last", "key", keys - 1)
    f.if_then("block_last", "gt", "first_query").causal_mask("s", "s", "first_query", "key").end_if()
    f.end_if()
    f.load("vt", "v", "key", 0)
    f.if_then("key", "eq", 0)
    f.rowmax("running_max", "s").rowexpandsub("s", "s", "running_max").exp("s", "s")
    f.rowsum("total", "s").matmul("o", "s", "vt")
    f.else_()
    f.rowmax("new_max", "s").max("new_max", "new_max", "running_max")
    f.sub("factor", "running_max", "new_max").exp("factor", "factor")
    f.rowexpandsub("s", "s", "new_max").exp("s", "s").max("running_max", "running_max", "new_max")
    f.mul("total", "total", "factor").rowsum("part", "s").add("total", "total", "part")
    f.rowexpandmul("o", "o", "factor").matmul_acc("o", "s", "vt")
    f.end_if()
    f.end_for()
    f.rowexpanddiv("o", "o", "total").store("out", "o", row, 0)
    if rows < m:
        f.end_for()
