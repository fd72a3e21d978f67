"""The generated CPU code of the ISA compiler against numpy running the same instructions one by
one: the library's softmax and RMSNorm on a 32x128 float32 tile (issue 14's target: at least 4x
faster), and kernels as a user writes them from docs/ISA.md on 64x768 tiles (issue 42's: GELU at
least numpy's speed, LayerNorm and log-softmax at least 3x)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from user_kernels import GELU_C, user_module

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


# --- kernels as a user writes them (issue 42's targets), 64x768 float32 tiles -------------------
# GELU (tanh form) at least numpy's speed; LayerNorm and log-softmax at least 3x numpy op by op.

TILE_ROWS, WIDTH = 64, 768




def numpy_gelu(x, out):
    u = x * x                                     # TMUL
    u *= x                                        # TMUL
    u *= 0.044715                                 # TMULS
    u += x                                        # TADD
    u *= GELU_C                                   # TMULS
    np.tanh(u, out=u)                             # TTANH
    u += 1.0                                      # TADDS
    u *= x                                        # TMUL
    u *= 0.5                                      # TMULS
    out[...] = u                                  # TSTORE


def numpy_layernorm(x, weight, bias, out, eps):
    t = x.copy()                                  # TLOAD
    m = t.sum(axis=1, keepdims=True)              # TROWSUM
    m /= WIDTH                                    # TDIVS
    t -= m                                        # TROWEXPANDSUB
    v = (t * t).sum(axis=1, keepdims=True)        # TMUL, TROWSUM
    v /= WIDTH                                    # TDIVS
    v += eps                                      # TADDS
    v = 1.0 / np.sqrt(v)                          # TRSQRT
    t *= v                                        # TROWEXPANDMUL
    t *= weight                                   # TCOLEXPANDMUL
    t += bias                                     # TCOLEXPANDADD
    out[...] = t                                  # TSTORE


def numpy_log_softmax(x, out):
    t = x.copy()                                  # TLOAD
    t -= t.max(axis=1, keepdims=True)             # TROWMAX, TROWEXPANDSUB
    s = np.exp(t).sum(axis=1, keepdims=True)      # TEXP, TROWSUM
    t -= np.log(s)                                # TLOG, TROWEXPANDSUB
    out[...] = t                                  # TSTORE


@pytest.fixture(scope="module")
def user_kernels():
    return isa.compile(user_module(TILE_ROWS, WIDTH)).kernels


@pytest.fixture(scope="module")
def wide():
    rng = np.random.default_rng(2)
    return (rng.standard_normal((TILE_ROWS, WIDTH)).astype(np.float32),
            rng.uniform(0.5, 1.5, (1, WIDTH)).astype(np.float32),
            rng.standard_normal((1, WIDTH)).astype(np.float32))


def _gelu(x64, weight, bias):
    return 0.5 * x64 * (1 + np.tanh(GELU_C * (x64 + 0.044715 * x64 ** 3)))


def _layernorm(x64, weight, bias):
    centred = x64 - x64.mean(axis=1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + EPS) * weight + bias


def _log_softmax(x64, weight, bias):
    shifted = x64 - x64.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


# name: (numpy op by op, whether it takes the weight, bias and eps, float64 reference, rtol, atol)
USER_TILES = {"gelu": (numpy_gelu, False, _gelu, 1e-5, 1e-6),
              "layernorm": (numpy_layernorm, True, _layernorm, 1e-4, 1e-5),
              "log_softmax": (numpy_log_softmax, False, _log_softmax, 1e-5, 1e-5)}


@pytest.mark.parametrize("implementation", ["generated", "numpy"])
@pytest.mark.parametrize("name", USER_TILES)
def test_user_tile(benchmark, user_kernels, wide, name, implementation):
    numpy_way, affine, reference, rtol, atol = USER_TILES[name]
    benchmark.group = f"user-{name}-64x768"
    x, weight, bias = wide
    run = user_kernels[name].cpu if implementation == "generated" else numpy_way
    out = np.zeros_like(x)
    args = (x, weight, bias, out, EPS) if affine else (x, out)
    benchmark(run, *args)
    np.testing.assert_allclose(out, reference(x.astype(np.float64), weight, bias), rtol=rtol, atol=atol)


# --- a kernel author's costs (issue 42's targets): the first kernel in a new process with the
# disk cache warm (<= 50 ms), and an interpreted orchestration's cost a task (<= 20 us) ----------

PROGRAM = Path(__file__).resolve().parent.parent / "orchestration" / "programs" / "dynamic_softmax.pto"
FIRST_KERNEL = f"""
import time
import numpy as np
import pto_gpu as pto
from pto_gpu import isa
started = time.perf_counter()
kernel = isa.compile(isa.parse(open({str(PROGRAM)!r}).read())).kernels["softmax_tile"]
x = np.ones((8, 64), np.float32)
out = np.zeros_like(x)
kernel(x, out)
print(time.perf_counter() - started)
assert np.allclose(out, 1 / 64)
"""


def test_first_kernel_in_a_new_process(benchmark):
    """parse + verify + compile + the first call of dynamic_softmax.pto's kernel, in a new
    process whose disk cache a warm-up filled; extra_info["ms"] is the median in-process time
    (the process's start and import of pto_gpu, ~0.7 s, are outside it)."""
    def first_kernel() -> float:
        done = subprocess.run([sys.executable, "-c", FIRST_KERNEL], check=True, capture_output=True,
                              text=True)
        return float(done.stdout)

    first_kernel()
    times = []
    benchmark.pedantic(lambda: times.append(first_kernel()), rounds=5)
    benchmark.extra_info["ms"] = float(np.median(times)) * 1e3


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_orchestration_function_per_task(benchmark, compiled):
    """dynamic_softmax's Orchestration function, 4,096 tasks on the dry executor (the build
    alone): extra_info["us_per_task"]."""
    program = isa.compile(isa.parse(PROGRAM.read_text()))
    orchestration = program.orchestration("dynamic_softmax", compiled=compiled)
    runtime = pto.Runtime(backend="cpu", executor="dry")
    tiles = 4096
    x = np.ones((8 * tiles, 64), np.float32)
    y = np.zeros_like(x)
    result = benchmark.pedantic(runtime.run, (orchestration, x, y, tiles), rounds=5, warmup_rounds=1)
    assert result.num_tasks == tiles
    benchmark.extra_info["us_per_task"] = benchmark.stats.stats.median / tiles * 1e6
