"""The generated CPU (numba) code against the reference interpreter, and `isa.compile`'s kernels
run through the runtime.

Each generated function is compiled once per dtype and tile shape and reused across cases
(numba compile time dominates). Tolerances: generated code computes float32 tiles in float32
(fastmath reassoc/contract/arcp, a polynomial exp within 1 ulp), float64 in float64, and
float16 in float32 rounded once at the store, so an element-wise result is within a few ulps of
the interpreter's correctly rounded one (rtol = 4 eps(dtype)); a sum of K terms in the compute
type is within K eps(compute) sum|terms| of the exact one.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest
from test_isa_interpret import (
    CASES,
    DTYPES,
    MASK_COL,
    MASK_ROW,
    SCALE,
    all_ops,
    all_ops_arrays,
    assert_close,
    calls_module,
    expected,
    named,
    scalar_expected,
    scalar_module,
    tile_specs,
)

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj
from pto_gpu.isa import cpu_codegen, interpret
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.ops import Form


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("isa_cache")


@pytest.fixture(scope="module")
def generated(cache):
    """generated(module, name): the generated function, compiled once per module and name."""
    functions = {}

    def get(module, name):
        key = (module.name, name)
        if key not in functions:
            functions[key] = cpu_codegen.cpu_function(module, name, cache)
        return functions[key]

    return get


def run_both(generated, module, name, arrays, *scalars):
    """The interpreter's and the generated function's results on copies of `arrays`."""
    mine, theirs = [a.copy() for a in arrays], [a.copy() for a in arrays]
    interpret.run(module, name, *mine, *scalars)
    generated(module, name)(*theirs, *scalars)
    return mine, theirs


# One tile shape, so one compilation per dtype (numba takes seconds for a function of every
# instruction); the 8x8 and other memrefs are its windows (the interpreter's tests cover 8x8 tiles).
CPU_CASES = [(32, 128, 8, 8)] + [case for case in CASES if case[:2] == (32, 128)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: "{}x{}-in-{}x{}".format(*c[2:], *c[:2]))
def test_every_tile_instruction_matches_the_interpreter(generated, dtype, case):
    tile_rows, tile_cols, rows, cols = case
    module = all_ops(dtype, tile_rows, tile_cols)
    arrays = all_ops_arrays(module, dtype, rows, cols, tile_rows, tile_cols)
    want, got = run_both(generated, module, "ops", arrays, SCALE, MASK_ROW, MASK_COL)
    want, got = named(module, want), named(module, got)
    inputs = {name: a.astype(np.float64) for name, a in named(module, arrays).items()
              if not name.startswith("o_")}
    eps = np.finfo(dtype.numpy).eps
    compute_eps = np.finfo(np.float64 if dtype == pto.FLOAT64 else np.float32).eps
    for spec in tile_specs():
        terms = {Form.ROW_REDUCE: cols, Form.COL_REDUCE: rows, Form.MATMUL: cols + 1}.get(spec.form, 1)
        _, scale = expected(spec, inputs)
        atol = np.finfo(dtype.numpy).smallest_normal + terms * compute_eps * scale
        reference = want["o_" + spec.spelling].astype(np.float64)
        assert_close(got["o_" + spec.spelling], reference, 4 * eps, atol, spec.spelling)


@pytest.mark.parametrize("dtype", [pto.FLOAT32, pto.FLOAT64], ids=lambda d: d.name)
def test_zeros_and_negatives_give_the_interpreters_infinities_and_nans(generated, dtype):
    """Every tile instruction over inputs with zeros (a third of each) and negative "positive"
    operands, and a zero scalar: divisions, reciprocals, square roots and logs of them follow
    IEEE arithmetic as the interpreter's numpy does (no ZeroDivisionError), each inf and nan
    where the interpreter has it, the finite results as close as on ordinary inputs."""
    module = all_ops(dtype, 32, 128)
    arrays = all_ops_arrays(module, dtype, 32, 128, 32, 128)
    for memref, array in zip(module.functions["ops"].memrefs, arrays):
        if not memref.name.startswith("o_"):
            array.reshape(-1)[::3] = 0
            if memref.name == "p":
                array.reshape(-1)[1::5] = -1
    with np.errstate(all="ignore"):
        want, got = run_both(generated, module, "ops", arrays, 0.0, MASK_ROW, MASK_COL)
    eps = np.finfo(dtype.numpy).eps
    got = named(module, got)
    for name, w in named(module, want).items():
        if not name.startswith("o_"):
            continue
        g = got[name]
        for where in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(where(g), where(w), err_msg=f"{name}: {where.__name__}")
        finite = np.isfinite(w)
        scale = np.abs(w[finite]).max(initial=1.0)  # sums of up to 128 terms: 256 eps of the largest
        np.testing.assert_allclose(g[finite], w[finite], rtol=4 * eps, atol=256 * eps * scale, err_msg=name)


@pytest.mark.parametrize("n, m, x", [(7, -3, 2.5), (4, 9, -1.25)])
def test_scalars_and_control_flow(generated, n, m, x):
    out = np.full((1, 16), np.nan)
    want, got = run_both(generated, scalar_module(), "scalars", [np.zeros((1, 1)), out], n, m, x)
    np.testing.assert_array_equal(got[1], want[1])
    expected_values = scalar_expected(n, m, x)
    np.testing.assert_array_equal(got[1][0, :len(expected_values)], expected_values)


@pytest.mark.parametrize("name, shape", [("tiled", (32, 64)), ("tiled", (29, 57)), ("first_two", (32, 64))])
def test_inlined_calls_windows_and_return(generated, name, shape):
    rng = np.random.default_rng(3)
    arrays = [rng.uniform(-1, 1, shape).astype(np.float32), np.full(shape, np.nan, np.float32)]
    want, got = run_both(generated, calls_module(), name, arrays)
    np.testing.assert_array_equal(np.isnan(got[1]), np.isnan(want[1]))
    # y = x * (sum of 16 terms): float32 sums within 16 eps of the exact one (|x| <= 1)
    np.testing.assert_allclose(got[1], want[1], rtol=4 * np.finfo(np.float32).eps, atol=16 * 16 * 1.2e-7,
                               equal_nan=True)


def hazards_module() -> isa.Module:
    """Instruction sequences that a wrong fusion would reorder: a column reduction read by a
    column broadcast, a row reduction read right after it, a tile reduced and then overwritten
    in place, a store then a load of the same memref at other rows, a product into its own
    operand, tiles whose valid regions differ."""
    f32 = pto.FLOAT32
    module = isa.Module("hazards")
    (FunctionBuilder("hazards", module=module).in_core()
        .memref("x", f32, (8, 8)).memref("w", f32, (8, 8)).memref("scratch", f32, (16, 8))
        .memref("y", f32, (8, 8)).memref("z", f32, (16, 8)).memref("sums", f32, (8, 1))
        .tile("t", 8, 8, f32).tile("u", 8, 8, f32).tile("v", 8, 8, f32).tile("cs", 1, 8, f32)
        .tile("rs", 8, 1, f32).tile("h", 8, 8, f32)
        .load("t", "x").load("u", "w")
        .colsum("cs", "t").colexpandadd("v", "t", "cs")          # cs complete before it is broadcast
        .rowsum("rs", "v").rowexpandsub("v", "v", "rs")          # rs complete before it is broadcast
        .rowmax("rs", "v").muls("v", "v", 2.0).rowexpandadd("v", "v", "rs")
        .adds("rs", "rs", 1.0)
        .add("u", "u", "t")                                      # u's region (w's) differs from t's
        .store("scratch", "v").load("h", "scratch", 1, 0)        # a later row of what was just stored
        .store("scratch", "h", 8, 0).load("h", "scratch", 4, 0)
        .matmul("v", "h", "v")                                   # the product into its own operand
        .store("y", "u").store("z", "h", 8, 0).store("z", "v").store("sums", "rs")
        .build())
    return module


@pytest.mark.parametrize("w_shape", [(8, 8), (6, 8)])
def test_fusion_keeps_the_instruction_order(generated, w_shape):
    rng = np.random.default_rng(4)
    arrays = [rng.uniform(-1, 1, (8, 8)).astype(np.float32), rng.uniform(-1, 1, w_shape).astype(np.float32),
              np.zeros((16, 8), np.float32), np.full((8, 8), np.nan, np.float32),
              np.full((16, 8), np.nan, np.float32), np.full((8, 1), np.nan, np.float32)]
    want, got = run_both(generated, hazards_module(), "hazards", arrays)
    for name, mine, theirs in zip(["x", "w", "scratch", "y", "z", "sums"], want, got):
        np.testing.assert_allclose(theirs, mine, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=name)


def softmax_module(rows=8, cols=64) -> isa.Module:
    m = isa.Module("softmax_module")
    (FunctionBuilder("softmax_tile", module=m).in_core()
        .memref("input", pto.FLOAT32, (rows, cols)).memref("output", pto.FLOAT32, (rows, cols))
        .tile("x", rows, cols, pto.FLOAT32).tile("mx", rows, 1, pto.FLOAT32).tile("s", rows, 1, pto.FLOAT32)
        .load("x", "input").rowmax("mx", "x").rowexpandsub("x", "x", "mx").exp("x", "x")
        .rowsum("s", "x").rowexpanddiv("x", "x", "s").store("output", "x")
        .build())
    return m


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_an_elementwise_chain_is_one_loop_over_columns():
    source = cpu_codegen.cpu_source(softmax_module(), "softmax_tile")
    kernel = source.split("def kernel")[1].split("\n\n\n")[0]
    # The body twice: under the branch for unit-stride rows, then for any strides.
    unit, strided = kernel.split("if m0_input.strides[1] == 4 and m0_output.strides[1] == 4:\n")[1] \
        .split("\n    else:\n")
    assert unit.strip() == strided.strip()
    # load+rowmax, sub+exp+rowsum, div, store: four column loops in two row loops
    assert unit.count("for _c in range") == 4 and unit.count("for _r in range") == 2
    chain = unit.split("for _c in range")[2]
    assert "- _b" in chain and "exp32(" in chain and "_acc" in chain


def test_generated_source_is_cached_by_content(tmp_path):
    module = softmax_module()
    first = cpu_codegen.cpu_function(module, "softmax_tile", tmp_path)
    assert cpu_codegen.cpu_function(softmax_module(), "softmax_tile", tmp_path) is first
    files = list(tmp_path.glob("isa_*.py"))
    assert len(files) == 1 and "@softmax_tile" in files[0].read_text()
    x = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    out = np.zeros_like(x)
    first(x, out)
    # A new process loads numba's compiled code from the cache instead of compiling again.
    script = textwrap.dedent(f"""
        import numpy as np
        import test_isa_cpu
        from pto_gpu.isa import cpu_codegen
        f = cpu_codegen.cpu_function(test_isa_cpu.softmax_module(), "softmax_tile", {str(tmp_path)!r})
        x = np.ones((8, 64), np.float32)
        f(x, x)
        print(sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values()))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).parent)
    assert result.stdout.split() == ["1", "0"]


@pytest.mark.parametrize("executor", ["serial", "parallel"])
def test_compiled_kernels_run_through_the_runtime(executor, tmp_path, monkeypatch):
    monkeypatch.setenv("PTO_GPU_CACHE", str(tmp_path))
    module = softmax_module()
    (FunctionBuilder("square", module=module).in_core()
        .memref("a", pto.FLOAT32, (8, 8)).memref("c", pto.FLOAT32, (8, 8)).tile("t", 8, 8, pto.FLOAT32)
        .tile("p", 8, 8, pto.FLOAT32).load("t", "a").matmul("p", "t", "t").store("c", "p").build())
    program = isa.compile(module)
    kernel = program.kernels["softmax_tile"]
    assert isinstance(kernel, pto.Kernel) and kernel.name == "softmax_tile" and kernel.worker == pto.VECTOR
    assert program.kernels["square"].worker == pto.CUBE
    assert isa.compile(module).kernels["softmax_tile"] is not kernel  # a new compile declares new kernels
    x = np.random.default_rng(6).standard_normal((30, 64)).astype(np.float32)
    out = np.full_like(x, np.nan)

    def orchestration(o, x, out):
        X, OUT = o.external(x), o.external(out)
        for first in range(0, 30, 8):
            last = min(first + 8, 30)  # the last task gets a 6-row tail
            o.submit(kernel, pto.input(X[first:last]), pto.output(OUT[first:last]))

    pto.Runtime(backend="cpu", executor=executor).run(orchestration, x, out)
    reference = np.empty_like(x)
    for first in range(0, 30, 8):
        interpret.run(module, "softmax_tile", x[first:first + 8], reference[first:first + 8])
    np.testing.assert_allclose(out, reference, rtol=4 * np.finfo(np.float32).eps, atol=1e-7)
    np.testing.assert_allclose(out, softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)


@numba.njit(cache=True)
def _submit_rows(o, x, out, kernel_id, rows):
    pj.submit(o, kernel_id, (pj.input(pj.narrow(x, 0, 0, rows)), pj.output(pj.narrow(out, 0, 0, rows))))


@pytest.mark.parametrize("compiled", [False, True])
def test_a_window_larger_than_the_functions_memref_is_refused_at_submit(compiled, tmp_path, monkeypatch):
    """A generated kernel computes only its tile: a larger window would be half done, silently."""
    monkeypatch.setenv("PTO_GPU_CACHE", str(tmp_path))
    kernel = isa.compile(softmax_module()).kernels["softmax_tile"]  # 8 x 64
    x, out = np.ones((16, 64), np.float32), np.zeros((16, 64), np.float32)

    def orchestration(o, rows):
        if compiled:
            o.compiled(_submit_rows, o.external(x), o.external(out), kernel.id, rows)
        else:
            o.submit(kernel, pto.input(o.external(x)[:rows]), pto.output(o.external(out)[:rows]))

    rt = pto.Runtime(backend="cpu", executor="serial")
    with pytest.raises(pto.ParamError, match=r"softmax_tile: tensor param 0 \(input\) dim 0 must be at most "
                                             r"8, got shape \(16, 64\)"):
        rt.run(orchestration, 16)
    assert not out.any()
    rt.run(orchestration, 5)  # a tail is fine
    np.testing.assert_allclose(out[:5], 1 / 64, rtol=1e-6)


def scaled_module() -> isa.Module:
    """A callee with scalar parameters, called with an immediate and with a caller's scalar."""
    m = isa.Module("scaled")
    (FunctionBuilder("affine", module=m).in_core()
        .memref("x", pto.FLOAT32, (4, 8)).memref("y", pto.FLOAT32, (4, 8))
        .scalar("scale", pto.FLOAT32).scalar("shift", pto.FLOAT32).tile("t", 4, 8, pto.FLOAT32)
        .load("t", "x").muls("t", "t", "scale").adds("t", "t", "shift").store("y", "t").build())
    (FunctionBuilder("two_affines", module=m).in_core()
        .memref("x", pto.FLOAT32, (8, 8)).memref("y", pto.FLOAT32, (8, 8)).scalar("k", pto.FLOAT32)
        .call("affine", {"x": ("x", 0, 0), "y": ("y", 0, 0)}, scalars={"scale": 2.0, "shift": "k"})
        .call("affine", {"x": ("x", 1, 0), "y": ("y", 1, 0)}, scalars={"scale": "k", "shift": -1.0})
        .build())
    return m


def test_a_calls_scalar_arguments_reach_the_inlined_callee(generated):
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    mine, theirs = run_both(generated, scaled_module(), "two_affines", [x, np.zeros_like(x)], 3.0)
    expected = np.concatenate([x[:4] * 2.0 + 3.0, x[4:] * 3.0 - 1.0])
    np.testing.assert_array_equal(mine[1], expected)
    np.testing.assert_array_equal(theirs[1], expected)


def test_a_col_expand_is_not_fused_past_the_row_reduction_that_writes_its_operand(generated):
    """b = x + 100, then b = rowsum(x) (1x1 tiles), then t = x + b: 2x, not x + (x + 100)."""
    m = isa.Module("fusion_order")
    (FunctionBuilder("f", module=m).in_core()
        .memref("x", pto.FLOAT32, (1, 1)).memref("y", pto.FLOAT32, (1, 1))
        .tile("s", 1, 1, pto.FLOAT32).tile("b", 1, 1, pto.FLOAT32).tile("t", 1, 1, pto.FLOAT32)
        .load("s", "x").adds("b", "s", 100.0).rowsum("b", "s").colexpandadd("t", "s", "b").store("y", "t")
        .build())
    x, y = np.full((1, 1), 3.0, np.float32), np.zeros((1, 1), np.float32)
    mine, theirs = run_both(generated, m, "f", [x, y])
    assert mine[1][0, 0] == theirs[1][0, 0] == 6.0


def test_a_whole_tensor_bound_to_a_smaller_memref_is_a_window_of_its_shape(generated):
    m = isa.Module("whole_window")
    (FunctionBuilder("steps", module=m).in_core()
        .memref("p", pto.FLOAT32, (4, 8)).memref("q", pto.FLOAT32, (4, 8)).tile("t", 4, 8, pto.FLOAT32)
        .for_loop("i", 0, 8, 4).load("t", "p", "i", 0).store("q", "t", "i", 0).end_for()
        .build())
    (FunctionBuilder("outer", module=m).in_core()
        .memref("x", pto.FLOAT32, (8, 8)).memref("y", pto.FLOAT32, (8, 8))
        .call("steps", {"p": "x", "q": "y"})
        .build())
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    mine, theirs = run_both(generated, m, "outer", [x, np.zeros_like(x)])
    expected = np.zeros_like(x)
    expected[:4] = x[:4]  # rows 4.. lie outside the callee's 4x8 window of x
    np.testing.assert_array_equal(mine[1], expected)
    np.testing.assert_array_equal(theirs[1], expected)


def test_a_function_over_several_dtypes_compiles_for_the_cpu_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PTO_GPU_CACHE", str(tmp_path))
    m = isa.Module("mixed")
    (FunctionBuilder("widen", module=m).in_core()
        .memref("a", pto.FLOAT32, (2, 4)).memref("b", pto.FLOAT64, (2, 4))
        .tile("t", 2, 4, pto.FLOAT64).load("t", "b").adds("t", "t", 1.0).store("b", "t")
        .tile("u", 2, 4, pto.FLOAT32).load("u", "a").store("a", "u")
        .build())
    kernel = isa.compile(m).kernels["widen"]
    assert kernel.cuda is None and kernel.mixed_dtypes
    a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float64).reshape(2, 4)
    pto.Runtime(backend="cpu", executor="serial").run(
        lambda o: o.submit(kernel, pto.inout(o.external(a)), pto.inout(o.external(b))))
    np.testing.assert_array_equal(b, np.arange(8).reshape(2, 4) + 1.0)


@numba.njit(error_model="numpy", fastmath=set(cpu_codegen.FASTMATH))
def _each(function, x, out):
    """function over x, with the generated code's fastmath flags (cpu_codegen.FASTMATH), under
    which the function is inlined there: reassociation must not change its results."""
    for i in range(x.size):
        out[i] = function(x[i])


@pytest.mark.parametrize(("name", "reference", "ulps"), [("exp32", np.exp, 1), ("tanh32", np.tanh, 6)])
def test_the_vectorisable_float32_functions_are_within_their_ulps_everywhere(name, reference, ulps):
    """Generated float32 code computes exp and tanh with branch-free polynomials (so loops of
    them vectorise): over float32's whole range, both signs, subnormals and the specials, each
    is within its documented ulps of float64 numpy's value, with numpy's inf, nan and signed
    zeros. (exp32 gave inf from 88.4 to ln(FLT_MAX) under fastmath until its scaling was a
    select and a product.)"""
    function = getattr(cpu_codegen, name)
    magnitudes = np.geomspace(np.float32(1e-45), np.finfo(np.float32).max, 200_001)
    x = np.concatenate([magnitudes, -magnitudes, np.linspace(-100, 100, 200_001),
                        [0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    got = np.empty_like(x)
    _each(function, x, got)
    with np.errstate(over="ignore", under="ignore"):
        want = reference(x.astype(np.float64))
        rounded = want.astype(np.float32)
    finite = np.isfinite(rounded)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(rounded))
    np.testing.assert_array_equal(got[~finite & ~np.isnan(rounded)], rounded[~finite & ~np.isnan(rounded)])
    spacing = np.spacing(np.abs(rounded[finite])).astype(np.float64)
    assert (np.abs(got[finite] - want[finite]) / spacing).max() <= ulps + 0.5  # + rounding's half ulp
    assert np.signbit(got[x == 0]).tolist() == np.signbit(rounded[x == 0]).tolist()
