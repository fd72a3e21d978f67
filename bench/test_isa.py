"""The generated CPU code of the ISA compiler on one 32x128 float32 tile against numpy running the
same instructions one by one (the issue's target: the generated code at least 4x faster)."""

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa import cpu_codegen

ROWS, COLS, EPS = 32, 128, 1e-6
F32 = pto.FLOAT32


def module() -> isa.Module:
    m = isa.Module("bench")
    (isa.FunctionBuilder("softmax", module=m).in_core()
        .memref("input", F32, (ROWS, COLS)).memref("output", F32, (ROWS, COLS))
        .tile("x", ROWS, COLS, F32).tile("mx", ROWS, 1, F32).tile("s", ROWS, 1, F32)
        .load("x", "input").rowmax("mx", "x").rowexpandsub("x", "x", "mx").exp("x", "x")
        .rowsum("s", "x").rowexpanddiv("x", "x", "s").store("output", "x")
        .build())
    (isa.FunctionBuilder("rmsnorm", module=m).in_core()
        .memref("input", F32, (ROWS, COLS)).memref("weight", F32, (1, COLS))
        .memref("output", F32, (ROWS, COLS)).scalar("eps", F32)
        .tile("x", ROWS, COLS, F32).tile("sq", ROWS, COLS, F32).tile("ms", ROWS, 1, F32)
        .tile("w", 1, COLS, F32)
        .load("x", "input").load("w", "weight")
        .mul("sq", "x", "x").rowsum("ms", "sq").divs("ms", "ms", float(COLS)).adds("ms", "ms", "eps")
        .rsqrt("ms", "ms").rowexpandmul("x", "x", "ms").colexpandmul("x", "x", "w").store("output", "x")
        .build())
    return m


def numpy_softmax(x, out):
    t = x.copy()                                  # TLOAD
    mx = t.max(axis=1, keepdims=True)             # TROWMAX
    np.subtract(t, mx, out=t)                     # TROWEXPANDSUB
    np.exp(t, out=t)                              # TEXP
    s = t.sum(axis=1, keepdims=True)              # TROWSUM
    np.divide(t, s, out=t)                        # TROWEXPANDDIV
    out[...] = t                                  # TSTORE


def numpy_rmsnorm(x, weight, out, eps):
    t, w = x.copy(), weight.copy()                # TLOAD x2
    sq = t * t                                    # TMUL
    ms = sq.sum(axis=1, keepdims=True)            # TROWSUM
    ms /= COLS                                    # TDIVS
    ms += eps                                     # TADDS
    ms = 1.0 / np.sqrt(ms)                        # TRSQRT
    t *= ms                                       # TROWEXPANDMUL
    t *= w                                        # TCOLEXPANDMUL
    out[...] = t                                  # TSTORE


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((ROWS, COLS)).astype(np.float32),
            rng.uniform(0.5, 1.5, (1, COLS)).astype(np.float32))


@pytest.mark.benchmark(group="isa-softmax-32x128")
@pytest.mark.parametrize("implementation", ["generated", "numpy"])
def test_softmax(benchmark, data, implementation):
    x, _ = data
    run = cpu_codegen.cpu_function(module(), "softmax") if implementation == "generated" else numpy_softmax
    out = np.zeros_like(x)
    run(x, out)
    benchmark(run, x, out)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.benchmark(group="isa-rmsnorm-32x128")
@pytest.mark.parametrize("implementation", ["generated", "numpy"])
def test_rmsnorm(benchmark, data, implementation):
    x, weight = data
    run = cpu_codegen.cpu_function(module(), "rmsnorm") if implementation == "generated" else numpy_rmsnorm
    out = np.zeros_like(x)
    run(x, weight, out, EPS)
    benchmark(run, x, weight, out, EPS)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS) * weight
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.benchmark(group="matmul-acc-tile")
@pytest.mark.parametrize("tile", [128, 256])
@pytest.mark.parametrize("implementation", ["generated", "numpy"])
def test_matmul_acc_tile(benchmark, implementation, tile):
    """One library matmul_acc tile on strided windows of 2048² matrices, one BLAS thread: the
    generated kernel (TLOAD copies, one BLAS call, TSTORE) against `c += a @ b` in place."""
    from pto_gpu.kernels.tiles import matmul_acc
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((2048, 2048)).astype(np.float32)[:tile, :tile] for _ in range(2))
    c = np.zeros((2048, 2048), np.float32)[:tile, :tile]

    def numpy_matmul_acc(a, b, c):
        c += a @ b

    run = matmul_acc.cpu if implementation == "generated" else numpy_matmul_acc
    with threadpool_limits(1):
        run(a, b, c)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
        benchmark(run, a, b, c)
