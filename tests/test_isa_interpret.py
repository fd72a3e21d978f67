"""The reference interpreter against float64 numpy written here, independently of ops.py: every
instruction of the opcode table (by Form) on float32, float64 and float16 tiles, full tiles and
tails (a window smaller than the tile), plus scalars, control flow, calls with windows, RETURN.

Tolerances: the interpreter computes each instruction in float64 and rounds once to the tile's
dtype, so it is within half an ulp of the float64 result: rtol = eps(dtype) leaves a factor 2
(ulp(x) <= eps * |x|); atol covers results below the smallest normal and the float64 summation
order of reductions and products (K * eps64 * sum|x|, far below rtol here).
"""

import functools
import math

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa import interpret
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.ops import OPCODES, Form

DTYPES = [pto.FLOAT32, pto.FLOAT64, pto.FLOAT16]
# (tile rows, tile cols, memref rows, memref cols): full tiles, then tails
CASES = [(8, 8, 8, 8), (32, 128, 32, 128), (32, 128, 5, 13), (32, 128, 31, 100)]
POSITIVE = {"TLOG", "TSQRT", "TRSQRT"}  # read |a| (the tile "p")
SCALE, MASK_ROW, MASK_COL = 0.75, 2, 3  # the scalar parameters s, mr, mc

# Independent float64 semantics of each tile instruction, by opcode.
ELEMENTWISE = {
    "TADD": lambda a, b: a + b, "TSUB": lambda a, b: a - b, "TMUL": lambda a, b: a * b,
    "TDIV": lambda a, b: a / b, "TMAX": np.fmax, "TMIN": np.fmin,
    "TEXP": np.exp, "TLOG": np.log, "TSQRT": np.sqrt, "TRSQRT": lambda a: 1 / np.sqrt(a),
    "TRECIP": lambda a: 1 / a, "TNEG": lambda a: -a, "TABS": np.abs, "TSILU": lambda a: a / (1 + np.exp(-a)),
    "TRELU": lambda a: np.where(a > 0, a, 0.0), "TSIN": np.sin, "TCOS": np.cos,
    "TSIGMOID": lambda a: 0.5 * (1 + np.tanh(a / 2)), "TTANH": lambda a: np.sinh(a) / np.cosh(a),
    "TERF": np.vectorize(math.erf, otypes=[np.float64]),
    "TADDS": lambda a, s: a + s, "TSUBS": lambda a, s: a - s, "TMULS": lambda a, s: a * s,
    "TDIVS": lambda a, s: a / s, "TMAXS": np.fmax, "TMINS": np.fmin,
    "TROWEXPANDADD": lambda a, b: a + b, "TROWEXPANDSUB": lambda a, b: a - b,
    "TROWEXPANDMUL": lambda a, b: a * b, "TROWEXPANDDIV": lambda a, b: a / b,
    "TCOLEXPANDADD": lambda a, b: a + b, "TCOLEXPANDMUL": lambda a, b: a * b,
}
REDUCTIONS = {"TROWSUM": np.sum, "TROWMAX": np.max, "TROWMIN": np.min, "TCOLSUM": np.sum, "TCOLMAX": np.max}
TILE_FORMS = {Form.UNARY, Form.BINARY, Form.TILE_SCALAR, Form.ROW_REDUCE, Form.COL_REDUCE, Form.ROW_EXPAND,
              Form.COL_EXPAND, Form.MATMUL, Form.MASK, Form.GENERATE, Form.TRANSPOSE, Form.CONVERT}
GENERATED = {"TFILL": lambda s, r, c: s + 0 * r + 0 * c, "TROWIDX": lambda s, r, c: s + r + 0 * c,
             "TCOLIDX": lambda s, r, c: s + c + 0 * r}


def tile_specs():
    return [spec for spec in OPCODES.values() if spec.form in TILE_FORMS]


def result_shape(spec, rows, cols):
    return {Form.ROW_REDUCE: (rows, 1), Form.COL_REDUCE: (1, cols), Form.MATMUL: (rows, rows),
            Form.TRANSPOSE: (cols, rows)}.get(spec.form, (rows, cols))


@functools.cache
def all_ops(dtype, rows, cols) -> isa.Module:
    """One InCore function `ops` that runs every tile instruction of the table once, each into its
    own tile and output memref o_<OPCODE>; inputs a (signed), p (positive), b, bt (b for TMATMUL),
    rowv, colv (broadcast operands), acc (TMATMUL_ACC's start); scalars s, mr, mc."""
    module = isa.Module(f"ops_{dtype.name}_{rows}x{cols}")
    f = FunctionBuilder("ops", module=module).in_core()
    inputs = {"a": (rows, cols), "p": (rows, cols), "b": (rows, cols), "bt": (cols, rows), "rowv": (rows, 1),
              "colv": (1, cols), "acc": (rows, rows)}
    for name, shape in inputs.items():
        f.memref(name, dtype, shape).tile("t_" + name, *shape, dtype).load("t_" + name, name)
    f.scalar("s", pto.FLOAT32).scalar("mr", pto.INT64).scalar("mc", pto.INT64)
    operands = {Form.UNARY: ("t_a",), Form.BINARY: ("t_a", "t_b"), Form.TILE_SCALAR: ("t_a", "s"),
                Form.ROW_REDUCE: ("t_a",), Form.COL_REDUCE: ("t_a",), Form.ROW_EXPAND: ("t_a", "t_rowv"),
                Form.COL_EXPAND: ("t_a", "t_colv"), Form.MATMUL: ("t_a", "t_bt"),
                Form.MASK: ("t_a", "mr", "mc"), Form.GENERATE: ("s",), Form.TRANSPOSE: ("t_a",),
                Form.CONVERT: ("t_a",)}
    for spec in tile_specs():
        shape, dst, out = result_shape(spec, rows, cols), "d_" + spec.spelling, "o_" + spec.spelling
        f.memref(out, dtype, shape).tile(dst, *shape, dtype)
        if spec.accumulate:
            f.load(dst, "acc")
        srcs = operands[spec.form]
        if spec.spelling in POSITIVE:
            srcs = ("t_p", *srcs[1:])
        getattr(f, spec.builder)(dst, *srcs)
        f.store(out, dst)
    f.build()
    return module


def all_ops_arrays(module, dtype, rows, cols, tile_rows, tile_cols):
    """Arrays for every memref of `ops` at the memref shape (rows, cols) standing for the tile's."""
    rng = np.random.default_rng(rows * 1000 + cols)
    arrays = []
    for memref in module.functions["ops"].memrefs:
        shape = tuple({tile_rows: rows, tile_cols: cols, 1: 1}[n] for n in memref.shape)
        if memref.name.startswith("o_"):
            arrays.append(np.full(shape, np.nan, dtype.numpy))
            continue
        values = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
        arrays.append((np.abs(values) if memref.name == "p" else values).astype(dtype.numpy))
    return arrays


def expected(spec, inputs):
    """The float64 result of one instruction from the (dtype-rounded) inputs, and the magnitude
    its rounding errors scale with (for sums: the sum of |terms|)."""
    a = inputs["p"] if spec.spelling in POSITIVE else inputs["a"]
    form = spec.form
    if form is Form.UNARY:
        return ELEMENTWISE[spec.spelling](a), np.abs(a)
    if form is Form.BINARY:
        return ELEMENTWISE[spec.spelling](a, inputs["b"]), np.abs(a)
    if form is Form.TILE_SCALAR:
        return ELEMENTWISE[spec.spelling](a, np.full_like(a, SCALE)), np.abs(a)
    if form is Form.ROW_EXPAND:
        return ELEMENTWISE[spec.spelling](a, inputs["rowv"]), np.abs(a)
    if form is Form.COL_EXPAND:
        return ELEMENTWISE[spec.spelling](a, inputs["colv"]), np.abs(a)
    if form in (Form.ROW_REDUCE, Form.COL_REDUCE):
        axis = 1 if form is Form.ROW_REDUCE else 0
        return REDUCTIONS[spec.spelling](a, axis=axis, keepdims=True), np.abs(a).sum(axis=axis, keepdims=True)
    if form is Form.MATMUL:
        product = a @ inputs["bt"]
        scale = np.abs(a) @ np.abs(inputs["bt"])
        if spec.accumulate:
            return inputs["acc"] + product, scale + np.abs(inputs["acc"])
        return product, scale
    if form is Form.GENERATE:  # over the window of a's shape that the output memref is
        r, c = np.indices(a.shape)
        value = GENERATED[spec.spelling](SCALE, r, c).astype(np.float64)
        return value, np.abs(value)
    if form is Form.TRANSPOSE:
        return a.T, np.abs(a.T)
    if form is Form.CONVERT:  # to the same dtype here; test_isa_cuda's "convert" crosses dtypes
        return a, np.abs(a)
    if form is Form.MASK:
        r, c = np.indices(a.shape)
        return np.where(c + MASK_COL <= r + MASK_ROW, a, -np.inf), np.abs(a)
    raise AssertionError(f"no independent reference for {spec.spelling}")


def assert_close(got, want, rtol, atol, what):
    """|got - want| <= atol + rtol * |want| elementwise (atol may be an array); infinities equal."""
    got = got.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: equal, caught by ==
        ok = (got == want) | (np.abs(got - want) <= atol + rtol * np.abs(want))
    if not ok.all():
        index = tuple(np.argwhere(~ok)[0])
        raise AssertionError(f"{what}: {(~ok).sum()} of {ok.size} elements differ; first at {index}: "
                             f"got {got[index]!r}, want {want[index]!r}")


def named(module, arrays):
    return {m.name: array for m, array in zip(module.functions["ops"].memrefs, arrays)}


def test_every_tile_instruction_has_an_independent_reference():
    for spec in tile_specs():
        known = {Form.ROW_REDUCE: REDUCTIONS, Form.COL_REDUCE: REDUCTIONS, Form.GENERATE: GENERATED}.get(
            spec.form, ELEMENTWISE)
        independent = spec.form in (Form.MATMUL, Form.MASK, Form.TRANSPOSE, Form.CONVERT)
        assert independent or spec.spelling in known, spec.spelling


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}x{}-in-{}x{}".format(*c[2:], *c[:2]))
def test_every_tile_instruction_matches_numpy(dtype, case):
    tile_rows, tile_cols, rows, cols = case
    module = all_ops(dtype, tile_rows, tile_cols)
    arrays = all_ops_arrays(module, dtype, rows, cols, tile_rows, tile_cols)
    interpret.run(module, "ops", *arrays, SCALE, MASK_ROW, MASK_COL)
    by_name = named(module, arrays)
    inputs = {name: array.astype(np.float64) for name, array in by_name.items() if not name.startswith("o_")}
    eps = np.finfo(dtype.numpy).eps
    for spec in tile_specs():
        got = by_name["o_" + spec.spelling]
        want, scale = expected(spec, inputs)
        assert got.shape == want.shape, spec.spelling
        atol = np.finfo(dtype.numpy).smallest_normal + 64 * np.finfo(np.float64).eps * scale
        assert_close(got, want, eps, atol, spec.spelling)


def test_reductions_start_from_their_identity():
    """An empty valid region (a tile loaded from a 0-column window) reduces to the identity."""
    module = isa.Module("empty")
    (FunctionBuilder("f", module=module).in_core()
        .memref("x", pto.FLOAT32, (4, 8)).memref("mx", pto.FLOAT32, (4, 1)).memref("sm", pto.FLOAT32, (4, 1))
        .tile("t", 4, 8, pto.FLOAT32).tile("m", 4, 1, pto.FLOAT32).tile("s", 4, 1, pto.FLOAT32)
        .load("t", "x").rowmax("m", "t").rowsum("s", "t").store("mx", "m").store("sm", "s").build())
    mx, sm = np.zeros((4, 1), np.float32), np.ones((4, 1), np.float32)
    interpret.run(module, "f", np.zeros((4, 0), np.float32), mx, sm)
    assert np.all(mx == -np.inf) and np.all(sm == 0)


def test_store_writes_the_valid_region_at_its_offset():
    module = isa.Module("window")
    (FunctionBuilder("f", module=module).in_core()
        .memref("x", pto.FLOAT64, (4, 4)).memref("y", pto.FLOAT64, (8, 8)).tile("t", 4, 4, pto.FLOAT64)
        .scalar("row", pto.INT32)
        .load("t", "x").store("y", "t", "row", 4).build())
    x, y = np.arange(6.0).reshape(2, 3), np.zeros((7, 8))
    interpret.run(module, "f", x, y, 4)
    want = np.zeros((7, 8))
    want[4:6, 4:7] = x  # the tile is valid over x's 2x3
    np.testing.assert_array_equal(y, want)
    y[:] = 0
    interpret.run(module, "f", x, y, 6)  # from row 6 only one row of the window remains
    want = np.zeros((7, 8))
    want[6, 4:7] = x[0]
    np.testing.assert_array_equal(y, want)


def scalar_module() -> isa.Module:
    """Scalar instructions, FOR and IF: each result k goes to column k of `out` (through TADDS
    on a zero tile and a TSTORE at column k); RETURN skips the last store."""
    module = isa.Module("scalars")
    f = (FunctionBuilder("scalars", module=module).in_core()
         .memref("zero", pto.FLOAT64, (1, 1)).memref("out", pto.FLOAT64, (1, 16))
         .tile("z", 1, 1, pto.FLOAT64).tile("v", 1, 1, pto.FLOAT64)
         .scalar("n", pto.INT64).scalar("m", pto.INT64).scalar("x", pto.FLOAT64))
    for name in ("k", "sum", "q"):
        f.scalar_var(name, pto.INT64)
    f.scalar_var("w", pto.FLOAT64)
    f.load("z", "zero")
    column = iter(range(16))

    def emit(name):
        f.adds("v", "z", name).store("out", "v", 0, next(column))

    for opcode, a, b in (("scalar_add", "n", "m"), ("scalar_sub", "n", 5), ("scalar_mul", "m", "n"),
                         ("scalar_div", "n", "m"), ("scalar_div", "m", 2)):
        getattr(f, opcode)("k", a, b)
        emit("k")
    f.scalar_add("w", "x", 1.5)
    emit("w")
    f.scalar_div("w", "x", 0.75)
    emit("w")
    for predicate in isa.Predicate:
        f.scalar_cmp("k", "n", "m", predicate)
        emit("k")
    f.scalar_li("sum", 0).for_loop("i", 0, "n", 2).scalar_add("sum", "sum", "i").end_for()
    emit("sum")
    f.if_then("n", "gt", "m").scalar_li("q", 1).else_().scalar_li("q", 2).end_if()
    emit("q")
    f.if_then("m", "lt", 0).ret().end_if()
    emit("n")  # not reached when m < 0
    f.build()
    return module


def scalar_expected(n, m, x):
    compare = [n < m, n <= m, n > m, n >= m, n == m, n != m]
    values = [n + m, n - 5, m * n, n // m, m // 2, x + 1.5, x // 0.75, *map(int, compare),
              sum(range(0, n, 2)), 1 if n > m else 2]
    return values + ([np.nan] if m < 0 else [n])


@pytest.mark.parametrize("n, m, x", [(7, -3, 2.5), (4, 9, -1.25)])
def test_scalar_instructions_and_control_flow(n, m, x):
    out = np.full((1, 16), np.nan)
    interpret.run(scalar_module(), "scalars", np.zeros((1, 1)), out, n, m, x)
    want = scalar_expected(n, m, x)
    np.testing.assert_array_equal(out[0, :len(want)], want)


def calls_module() -> isa.Module:
    """`rows_scaled` (an 8x16 tile: y = x * rowsum(x)) called on every 8x16 window of a 32x64
    memref; `first_half` RETURNs from inside its loop after two windows."""
    module = isa.Module("calls")
    (FunctionBuilder("rows_scaled", module=module).in_core()
        .memref("x", pto.FLOAT32, (8, 16)).memref("y", pto.FLOAT32, (8, 16))
        .tile("t", 8, 16, pto.FLOAT32).tile("s", 8, 1, pto.FLOAT32)
        .load("t", "x").rowsum("s", "t").rowexpandmul("t", "t", "s").store("y", "t").build())
    (FunctionBuilder("tiled", module=module).in_core()
        .memref("src", pto.FLOAT32, (32, 64)).memref("dst", pto.FLOAT32, (32, 64))
        .for_loop("i", 0, 4).for_loop("j", 0, 4)
        .call("rows_scaled", {"x": ("src", "i", "j"), "y": ("dst", "i", "j")})
        .end_for().end_for().build())
    (FunctionBuilder("first_two", module=module).in_core()
        .memref("src", pto.FLOAT32, (32, 64)).memref("dst", pto.FLOAT32, (32, 64)).scalar_var("k", pto.INT64)
        .call("windows", {"src": "src", "dst": "dst"}).build())
    (FunctionBuilder("windows", module=module).in_core()
        .memref("src", pto.FLOAT32, (32, 64)).memref("dst", pto.FLOAT32, (32, 64)).scalar_var("k", pto.INT64)
        .scalar_li("k", 0)
        .for_loop("i", 0, 4)
        .if_then("k", "ge", 2).ret().end_if()
        .call("rows_scaled", {"x": ("src", "i", 0), "y": ("dst", "i", 0)})
        .scalar_add("k", "k", 1)
        .end_for().build())
    return module


def rows_scaled(x):
    x = x.astype(np.float64)
    return x * x.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("shape", [(32, 64), (29, 57)], ids=["full", "tail"])
def test_calls_bind_windows(shape):
    rng = np.random.default_rng(1)
    src = rng.uniform(-1, 1, shape).astype(np.float32)
    dst = np.full(shape, np.nan, np.float32)
    interpret.run(calls_module(), "tiled", src, dst)
    want = np.empty(shape)
    for i in range(0, shape[0], 8):
        for j in range(0, shape[1], 16):
            want[i:i + 8, j:j + 16] = rows_scaled(src[i:i + 8, j:j + 16])
    np.testing.assert_allclose(dst, want, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)


def test_return_leaves_the_callee_only_at_its_point():
    rng = np.random.default_rng(2)
    src = rng.uniform(-1, 1, (32, 64)).astype(np.float32)
    dst = np.full((32, 64), np.nan, np.float32)
    interpret.run(calls_module(), "first_two", src, dst)
    want = np.vstack([rows_scaled(src[:8, :16]), rows_scaled(src[8:16, :16])])
    np.testing.assert_allclose(dst[:16, :16], want, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)
    assert np.isnan(dst[16:]).all() and np.isnan(dst[:, 16:]).all()


def test_errors_name_the_function_and_instruction():
    module = isa.Module("bad")
    (FunctionBuilder("mm", module=module).in_core()
        .memref("a", pto.FLOAT32, (4, 4)).memref("b", pto.FLOAT32, (4, 4)).memref("c", pto.FLOAT32, (4, 4))
        .tile("ta", 4, 4, pto.FLOAT32).tile("tb", 4, 4, pto.FLOAT32).tile("tc", 4, 4, pto.FLOAT32)
        .load("ta", "a").load("tb", "b").matmul("tc", "ta", "tb").store("c", "tc").build())
    a, c = np.ones((4, 3), np.float32), np.zeros((4, 4), np.float32)
    with pytest.raises(isa.ISAError, match=r"@mm: TMATMUL %tc, %ta, %tb: %ta has 3 valid columns"):
        interpret.run(module, "mm", a, np.ones((4, 4), np.float32), c)
    with pytest.raises(isa.ISAError, match=r"@mm takes 3 memrefs"):
        interpret.run(module, "mm", a, c)
    with pytest.raises(isa.ISAError, match=r"@mm: memref %a is 4x4"):
        interpret.run(module, "mm", np.ones((5, 4), np.float32), c, c)


def test_reads_past_a_valid_region_and_negative_offsets_are_program_errors():
    """What the generators would read there is undefined, and numpy would wrap a negative offset
    around: the reference refuses both, so tests built on it catch such programs."""
    module = isa.Module("undefined")
    (FunctionBuilder("add_two", module=module).in_core()
        .memref("a", pto.FLOAT32, (4, 4)).memref("b", pto.FLOAT32, (4, 4)).memref("c", pto.FLOAT32, (4, 4))
        .tile("ta", 4, 4, pto.FLOAT32).tile("tb", 4, 4, pto.FLOAT32)
        .load("ta", "a").load("tb", "b").add("ta", "ta", "tb").store("c", "ta").build())
    (FunctionBuilder("shifted", module=module).in_core()
        .memref("a", pto.FLOAT32, (4, 4)).memref("c", pto.FLOAT32, (4, 4)).scalar("k", pto.INT32)
        .tile("t", 2, 4, pto.FLOAT32).load("t", "a", "k", 0).store("c", "t").build())
    full, short = np.ones((4, 4), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(isa.ISAError, match=r"@add_two: TADD %ta, %ta, %tb: reads 4x4 of %tb, which holds "
                                           r"3x4 valid elements"):
        interpret.run(module, "add_two", full, short, np.zeros((4, 4), np.float32))
    with pytest.raises(isa.ISAError, match=r"@shifted: TLOAD %t, %a, %k, 0: offset k is -1, below 0"):
        interpret.run(module, "shifted", full, np.zeros((4, 4), np.float32), -1)
