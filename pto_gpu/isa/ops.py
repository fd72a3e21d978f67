"""The opcode table: one entry per instruction, so that adding an instruction is one line.

An entry gives the instruction's `.pto` spelling (upper case; the printer writes it in lower
case, as spec §3.1 does), its builder method, its form (the operands it takes and the shape
and dtype rule they follow, one per `Form`), its reference semantics in numpy (what the
interpreter runs, on float64 arrays), and the per-element expressions the CPU (numba) and
CUDA code generators emit. Expressions are templates over `{a}`, `{b}` (tile elements) and
`{s}` (a scalar operand); reductions give the combining expression over `{acc}`, `{x}` and
the identity they start from.

Forms, with destination first (docs/DESIGN.md, "Builder method names ... Destination first"):

    LOAD        tile, memref[, row, col]        tile = memref window at (row, col) elements
    STORE       memref, tile[, row, col]        memref window = tile
    UNARY       dst, a                          dst = f(a), same shape
    CONVERT     dst, a                          dst = a in dst's dtype (which may differ), same shape
    BINARY      dst, a, b                       dst = f(a, b), same shapes
    TILE_SCALAR dst, a, s                       dst = f(a, s), s an immediate or scalar name
    ROW_REDUCE  dst (r x 1), a (r x c)          dst = reduce over each row
    COL_REDUCE  dst (1 x c), a (r x c)          dst = reduce over each column
    ROW_EXPAND  dst (r x c), a (r x c), b (r x 1)   dst = f(a, b broadcast along rows)
    COL_EXPAND  dst (r x c), a (r x c), b (1 x c)   dst = f(a, b broadcast down columns)
    MATMUL      dst (m x n), a (m x k), b (k x n)   dst = a @ b  (MATMUL_ACC: dst += a @ b)
    MASK        dst, a, row, col                dst = a where col + c <= row + r, else -inf
    GENERATE    dst, s                          dst(r, c) = f(s, r, c) over the whole tile
    TRANSPOSE   dst (c x r), a (r x c)          dst = a transposed (dst differs from a)
    SCALAR      dst, a[, b]                     scalar arithmetic (SLI: dst = immediate)
    COMPARE     dst, a, b, predicate            dst = 1 if a predicate b else 0
    DIM         dst, memref, axis               dst = the memref's size along axis (InCore: its window's)

Tails: a tile loaded from a memref window smaller than the tile is valid only over that
window (its valid rows and columns); every form computes over the valid part, reductions
reduce only valid elements, and a store writes only the valid part.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

import numpy as np


class Form(enum.Enum):
    LOAD = "load"
    STORE = "store"
    UNARY = "unary"
    CONVERT = "convert"
    BINARY = "binary"
    TILE_SCALAR = "tile_scalar"
    ROW_REDUCE = "row_reduce"
    COL_REDUCE = "col_reduce"
    ROW_EXPAND = "row_expand"
    COL_EXPAND = "col_expand"
    MATMUL = "matmul"
    MASK = "mask"
    GENERATE = "generate"
    TRANSPOSE = "transpose"
    SCALAR = "scalar"
    COMPARE = "compare"
    DIM = "dim"


@dataclasses.dataclass(frozen=True)
class OpSpec:
    spelling: str  # upper case, as spec §1.1 names it
    builder: str  # the FunctionBuilder method
    form: Form
    reference: Callable | None  # numpy semantics (reductions: applied along the reduced axis)
    cpu: str = ""  # numba expression template for one element (or the combine of a reduction)
    cuda: str = ""  # CUDA C expression template, in the element type's accumulator type
    identity: float | None = None  # reductions: the value a reduction starts from
    accumulate: bool = False  # MATMUL_ACC: the destination is read too


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    from scipy.special import erf  # numpy has none; scipy is a dependency (numba's BLAS)

    return erf(x)


_SPECS = [
    OpSpec("TLOAD", "load", Form.LOAD, None),
    OpSpec("TSTORE", "store", Form.STORE, None),
    # element-wise, two tiles
    OpSpec("TADD", "add", Form.BINARY, np.add, "{a} + {b}", "{a} + {b}"),
    OpSpec("TSUB", "sub", Form.BINARY, np.subtract, "{a} - {b}", "{a} - {b}"),
    OpSpec("TMUL", "mul", Form.BINARY, np.multiply, "{a} * {b}", "{a} * {b}"),
    OpSpec("TDIV", "div", Form.BINARY, np.divide, "{a} / {b}", "{a} / {b}"),
    OpSpec("TMAX", "max", Form.BINARY, np.maximum, "max({a}, {b})", "fmax({a}, {b})"),
    OpSpec("TMIN", "min", Form.BINARY, np.minimum, "min({a}, {b})", "fmin({a}, {b})"),
    # element-wise, one tile
    OpSpec("TEXP", "exp", Form.UNARY, np.exp, "math.exp({a})", "pto_exp({a})"),
    OpSpec("TLOG", "log", Form.UNARY, np.log, "math.log({a})", "log({a})"),
    OpSpec("TSQRT", "sqrt", Form.UNARY, np.sqrt, "math.sqrt({a})", "sqrt({a})"),
    OpSpec("TRSQRT", "rsqrt", Form.UNARY, lambda x: 1.0 / np.sqrt(x), "math.sqrt(1.0 / {a})", "rsqrt({a})"),
    OpSpec("TRECIP", "recip", Form.UNARY, lambda x: 1.0 / x, "1.0 / {a}", "1.0f / {a}"),
    OpSpec("TNEG", "neg", Form.UNARY, np.negative, "-{a}", "-{a}"),
    OpSpec("TABS", "abs", Form.UNARY, np.abs, "abs({a})", "fabs({a})"),
    OpSpec("TSILU", "silu", Form.UNARY, _silu, "{a} / (1.0 + math.exp(-{a}))", "{a} / (1.0f + exp(-{a}))"),
    OpSpec("TSIGMOID", "sigmoid", Form.UNARY, _sigmoid, "1.0 / (1.0 + math.exp(-{a}))",
           "1.0f / (1.0f + exp(-{a}))"),
    OpSpec("TTANH", "tanh", Form.UNARY, np.tanh, "math.tanh({a})", "tanh({a})"),
    OpSpec("TERF", "erf", Form.UNARY, _erf, "math.erf({a})", "erf({a})"),
    OpSpec("TRELU", "relu", Form.UNARY, lambda x: np.maximum(x, 0.0), "max({a}, 0.0)",
           "({a} < 0.0f ? 0.0f : {a})"),  # NaN stays NaN, as Python's max(nan, 0.0) and numpy's
    OpSpec("TSIN", "sin", Form.UNARY, np.sin, "math.sin({a})", "sin({a})"),
    OpSpec("TCOS", "cos", Form.UNARY, np.cos, "math.cos({a})", "cos({a})"),
    # dtype conversion: the only instruction whose tiles may differ in dtype
    OpSpec("TCVT", "cvt", Form.CONVERT, lambda x: x, "{a}", "{a}"),
    # element-wise, a tile and a scalar
    OpSpec("TADDS", "adds", Form.TILE_SCALAR, np.add, "{a} + {s}", "{a} + {s}"),
    OpSpec("TSUBS", "subs", Form.TILE_SCALAR, np.subtract, "{a} - {s}", "{a} - {s}"),
    OpSpec("TMULS", "muls", Form.TILE_SCALAR, np.multiply, "{a} * {s}", "{a} * {s}"),
    OpSpec("TDIVS", "divs", Form.TILE_SCALAR, np.divide, "{a} / {s}", "{a} / {s}"),
    OpSpec("TMAXS", "maxs", Form.TILE_SCALAR, np.maximum, "max({a}, {s})", "fmax({a}, {s})"),
    OpSpec("TMINS", "mins", Form.TILE_SCALAR, np.minimum, "min({a}, {s})", "fmin({a}, {s})"),
    # reductions
    OpSpec("TROWSUM", "rowsum", Form.ROW_REDUCE, np.sum, "{acc} + {x}", "{acc} + {x}", identity=0.0),
    OpSpec("TROWMAX", "rowmax", Form.ROW_REDUCE, np.max, "max({acc}, {x})", "fmax({acc}, {x})",
           identity=-np.inf),
    OpSpec("TROWMIN", "rowmin", Form.ROW_REDUCE, np.min, "min({acc}, {x})", "fmin({acc}, {x})",
           identity=np.inf),
    OpSpec("TCOLSUM", "colsum", Form.COL_REDUCE, np.sum, "{acc} + {x}", "{acc} + {x}", identity=0.0),
    OpSpec("TCOLMAX", "colmax", Form.COL_REDUCE, np.max, "max({acc}, {x})", "fmax({acc}, {x})",
           identity=-np.inf),
    # broadcasts
    OpSpec("TROWEXPANDADD", "rowexpandadd", Form.ROW_EXPAND, np.add, "{a} + {b}", "{a} + {b}"),
    OpSpec("TROWEXPANDSUB", "rowexpandsub", Form.ROW_EXPAND, np.subtract, "{a} - {b}", "{a} - {b}"),
    OpSpec("TROWEXPANDMUL", "rowexpandmul", Form.ROW_EXPAND, np.multiply, "{a} * {b}", "{a} * {b}"),
    OpSpec("TROWEXPANDDIV", "rowexpanddiv", Form.ROW_EXPAND, np.divide, "{a} / {b}", "{a} / {b}"),
    OpSpec("TCOLEXPANDADD", "colexpandadd", Form.COL_EXPAND, np.add, "{a} + {b}", "{a} + {b}"),
    OpSpec("TCOLEXPANDMUL", "colexpandmul", Form.COL_EXPAND, np.multiply, "{a} * {b}", "{a} * {b}"),
    # generated over the whole tile from a scalar and the element's row r and column c
    OpSpec("TFILL", "fill", Form.GENERATE, lambda s, r, c: s + 0.0 * (r + c), "{s}", "{s}"),
    OpSpec("TROWIDX", "rowidx", Form.GENERATE, lambda s, r, c: s + r + 0.0 * c, "{s} + {r}", "{s} + {r}"),
    OpSpec("TCOLIDX", "colidx", Form.GENERATE, lambda s, r, c: s + c + 0.0 * r, "{s} + {c}", "{s} + {c}"),
    OpSpec("TTRANS", "trans", Form.TRANSPOSE, np.transpose),
    # matrix
    OpSpec("TMATMUL", "matmul", Form.MATMUL, np.matmul),
    OpSpec("TMATMUL_ACC", "matmul_acc", Form.MATMUL, np.matmul, accumulate=True),
    # masking (causal attention): keep a[r, c] where col + c <= row + r
    OpSpec("TCAUSALMASK", "causal_mask", Form.MASK, None),
    # scalars
    OpSpec("SLI", "scalar_li", Form.SCALAR, None),
    OpSpec("SADD", "scalar_add", Form.SCALAR, np.add, "{a} + {b}", "{a} + {b}"),
    OpSpec("SSUB", "scalar_sub", Form.SCALAR, np.subtract, "{a} - {b}", "{a} - {b}"),
    OpSpec("SMUL", "scalar_mul", Form.SCALAR, np.multiply, "{a} * {b}", "{a} * {b}"),
    OpSpec("SDIV", "scalar_div", Form.SCALAR, np.floor_divide, "{a} // {b}", "pto_floordiv({a}, {b})"),
    # a if a < b else b, in every form (so a NaN operand gives the same answer everywhere)
    OpSpec("SMIN", "scalar_min", Form.SCALAR, lambda a, b: a if a < b else b, "({a} if {a} < {b} else {b})",
           "({a} < {b} ? {a} : {b})"),
    OpSpec("SMAX", "scalar_max", Form.SCALAR, lambda a, b: a if a > b else b, "({a} if {a} > {b} else {b})",
           "({a} > {b} ? {a} : {b})"),
    OpSpec("SCMP", "scalar_cmp", Form.COMPARE, None),
    OpSpec("SDIM", "scalar_dim", Form.DIM, None),
]

OPCODES: dict[str, OpSpec] = {spec.spelling: spec for spec in _SPECS}
BY_BUILDER: dict[str, OpSpec] = {spec.builder: spec for spec in _SPECS}

# Tile instructions belong in InCore functions; scalar ones, DIM among them, anywhere (in an
# InCore function DIM reads a memref's window, which a row or column tail makes smaller).
SCALAR_FORMS = frozenset({Form.SCALAR, Form.COMPARE, Form.DIM})
