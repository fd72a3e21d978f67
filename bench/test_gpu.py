"""GPU benchmarks, each against what a user would write instead (skipped without a GPU).

- Per-task overhead: SUBMITS one-element `scale` kernels, in a chain and independent, through
  the stream executor and through a replayed capture, against the same compiled kernel
  launched back to back with plain CuPy. extra_info["us_per_task"] = median / SUBMITS.
  Targets (issue 40): at most 4 us per task through streams, at most 1 us with replay. The
  same from a compiled orchestration (bench/tiny_tasks.py's 20,000 tasks), all issued natively.
- The 2048² float32 tiled matmul in 128-row tiles (the demo's, 4,608 tasks) on the stream
  executor, from Python and compiled, each product one cuBLAS call, against numpy's time on the
  host's cores. Target (issue 40): at most 15 ms.
- The persistent executor (issue 44): the per-task overhead's tasks (Python and compiled) and the
  2048² matmul in one persistent kernel (targets: at most 0.5 us a task per SM independent, 2 us
  a chain; within
  2x of one cupy.matmul), and the compiled LLaMA layer at seq 1024 on it and on the stream
  executor side by side (target: faster).
- GEMM 8192x8192 float16 as 4x4 output tiles through the runtime (a cuBLAS call per tile) against one
  cupy.matmul. extra_info["tflops"]. Target: at least 70% of cuBLAS.
- The same GEMM as 1024x128 output tiles of the generated tile kernel (wgmma or mma.sync on
  tensor cores, each task's rows in bands of 64 rows over 16 blocks; beside it bands of 32 and
  of 128, and other chunks of k: test_gpu_code.BAND_FORMS; not cuBLAS), its 512 tasks submitted
  by compiled code (and once from Python, whose submits alone bench/test_host.py times). Target
  (issue 41): at least 60% of one cuBLAS call.
- Flash attention through the runtime against torch's scaled_dot_product_attention, when
  PyTorch is installed: float32, and float16 at head dims 64 and 128 (tensor cores), as
  three tasks a (query tile, key tile) pair and as one task a query tile (`fused`).
  extra_info["tflops"]. Target: at least 50% of SDPA.
- wgmma's rate from shared memory (tests/wgmma_probe.cu on an sm_90 GPU): extra_info["tflops"],
  against the H100/H200's dense float16 peak (~989 TFLOP/s) and the generated mma.sync tiles'.
- A user's LayerNorm (bench/user_kernels.py, `isa.compile`d; its 64 x 4096 tiles walked in column
  blocks, three passes over x) over 16384 x 4096 float32, against torch's layer_norm.
  extra_info["gb_per_s"]: the input read once and the output written once, per second.

Every round ends with a stream synchronise, so host wall time is the time to finished results.
The runtime's benchmarks also record how the run went (`how_it_ran`: the caller's CPU, its
stalls on full rings, launches), which tells a host-bound round from a GPU-bound one.
"""

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from gpu_graphs import (
    GEMM_COLS,
    GEMM_ROWS,
    SUBMITS,
    N,
    element_tasks,
    gemm_in_tiles,
    gemm_in_tiles_compiled,
    per_task,
)
from pto_gpu.kernels.elementwise import scale
from pto_gpu.kernels.tiles import matmul
from pto_gpu.orchestration.flash_attention import (
    flash_attention,
    flash_attention_compiled,
    flash_attention_fused_compiled,
)
from pto_gpu.orchestration.llama import llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled
from pto_gpu.orchestration.workloads import to_backend
from test_gpu_code import BAND_FORMS, band_code
from tiny_tasks import TASKS as COMPILED_TASKS
from tiny_tasks import generated, rows
from user_kernels import user_module

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.backends import cuda_abi
from pto_gpu.backends import wgmma_probe as wgmma
from pto_gpu.backends.cuda_device import CupyDevice
from pto_gpu.isa.family import family_of
from pto_gpu.runtime import cuda_unavailable

NO_GPU = cuda_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA GPU: {NO_GPU}")]

ROUNDS = 20


def tasks_ran(run, x, chain: bool) -> None:
    """`run` once more with x's rows 1.. cleared: scaling by 1.0 leaves x as it was, so only rows
    written again show that tasks ran (a chain's first writes row 1; the independent ones write
    every row of 1..127), which the timed rounds alone would not."""
    x[1:] = 0
    run()
    assert float(x.sum()) == (2 if chain else 128)


def how_it_ran(benchmark, result) -> None:
    """What a run's last round did: tasks issued from the argument tables, launches (fewer than
    tasks where they were batched), event waits between streams; and where its time went, to
    tell a host-bound run from a GPU-bound one: the calling thread's CPU (the orchestration and
    the issue) and its waits for room in the rings (for the GPU to retire tasks)."""
    benchmark.extra_info.update(native_tasks=float(result.native_tasks),
                                launches=float(result.native_launches),
                                cross_waits=float(result.cross_waits or 0),  # None: no streams (persistent)
                                wall_ms=result.seconds * 1e3,
                                caller_cpu_ms=result.cpu_seconds.get("caller", 0.0) * 1e3,
                                stalled_ms=sum(result.stalls.values()) * 1e3)


def kernel_time(benchmark, run) -> None:
    """`run(trace=path)` once more, traced, so each task is its own launch (the Python stream
    executor) and its kernel is timed by events on the GPU: the mean kernel time a task,
    extra_info["kernel_us"], which with the kernel's blocks a task says whether the kernel is
    slow or the run is bound elsewhere (the host, too few blocks at once); and
    ["kernels_at_once"], the kernels' time over the span from the first one's start to the last
    one's end: how many were in flight on average (1: one after another, whatever the streams;
    below 1 where the host left gaps; a span starts when its stream reaches it, so kernels whose
    blocks wait for SMs count as in flight)."""
    with tempfile.TemporaryDirectory() as folder:
        run(trace=Path(folder) / "trace.json")
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in  # a task's kernel each, in microseconds
                 json.loads((Path(folder) / "trace.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    busy = sum(end - start for start, end in spans)
    extent = max(end for _, end in spans) - min(start for start, _ in spans)
    benchmark.extra_info.update(kernel_us=busy / len(spans), kernels_at_once=busy / extent)


@pytest.fixture(scope="module")
def cupy():
    import cupy

    return cupy


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "independent"])
def test_overhead_streams(benchmark, cupy, chain):
    rt = pto.Runtime(backend="cuda", executor="stream", task_window=4096)
    x = cupy.ones((128, 1), cupy.float32)
    result = benchmark.pedantic(rt.run, (element_tasks, x, chain), rounds=ROUNDS, warmup_rounds=2)
    assert result.num_tasks == SUBMITS
    tasks_ran(lambda: rt.run(element_tasks, x, chain), x, chain)
    per_task(benchmark)
    how_it_ran(benchmark, result)


@pytest.mark.parametrize("executor", ["stream", "persistent"])
@pytest.mark.parametrize("shape", ["chain", "independent"])
def test_overhead_compiled(benchmark, cupy, shape, executor):
    """bench/tiny_tasks.py's 20,000 one-row `scale` tasks from a compiled orchestration: issued
    (or published to the persistent kernel) and retired in numba, so what is left is the
    driver's cost, or the kernel's, and the executor's own."""
    rt = pto.Runtime(backend="cuda", executor=executor, task_window=4096)
    x, y = (cupy.asarray(a) for a in rows())
    result = benchmark.pedantic(rt.run, (generated, x, y, shape), rounds=ROUNDS, warmup_rounds=2)
    assert result.native_tasks == result.num_tasks == COMPILED_TASKS
    if shape == "independent":
        assert bool((y == 2 * x).all())
    per_task(benchmark, COMPILED_TASKS)
    how_it_ran(benchmark, result)


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "independent"])
def test_overhead_persistent(benchmark, cupy, chain):
    """The same tasks run by one persistent kernel (executor="persistent"): each Python submit
    published from the argument tables by numba, wired and run by the kernel's blocks, one
    block a task."""
    rt = pto.Runtime(backend="cuda", executor="persistent", task_window=4096)
    x = cupy.ones((128, 1), cupy.float32)
    result = benchmark.pedantic(rt.run, (element_tasks, x, chain), rounds=ROUNDS, warmup_rounds=2)
    assert result.num_tasks == SUBMITS
    tasks_ran(lambda: rt.run(element_tasks, x, chain), x, chain)
    per_task(benchmark)
    how_it_ran(benchmark, result)


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "independent"])
def test_overhead_replay(benchmark, cupy, chain):
    rt = pto.Runtime(backend="cuda", task_window=4096)
    x = cupy.ones((128, 1), cupy.float32)
    replay = rt.capture(element_tasks, x, chain)
    benchmark.pedantic(replay.replay, rounds=ROUNDS, warmup_rounds=2)
    assert replay.num_tasks == SUBMITS
    tasks_ran(replay.replay, x, chain)
    per_task(benchmark)


def test_overhead_cupy_back_to_back(benchmark, cupy):
    """The same pto_scale kernel, launched SUBMITS times on one stream with precomputed arguments."""
    source = family_of(scale).cuda(((1, 1), (1, 1)), np.float32, (1.0,)).source
    module = cupy.RawModule(code=source.read_text(),
                            options=cuda_abi.nvrtc_options(source.parent, np.float32, "scale"))
    function = module.get_function(cuda_abi.symbol("scale"))
    x = cupy.ones((128, 1), cupy.float32)
    tile = x[0:1, :1]
    words = cuda_abi.tensor_words(tile.shape, tile.strides, tile.itemsize)
    args = (tile, *words, tile, *words, np.float64(1.0))
    stream = cupy.cuda.Stream(non_blocking=True)

    def launches():
        with stream:
            for _ in range(SUBMITS):
                function((1,), (256,), args)
        stream.synchronize()

    benchmark.pedantic(launches, rounds=ROUNDS, warmup_rounds=2)
    per_task(benchmark)


# --- the demo's tiled matmul ------------------------------------------------------------------
def tiled_matmul_rounds(benchmark, cupy, orchestration, tile: int, executor: str = "stream"):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2048, 2048)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda", executor=executor)
    da, db, dc = cupy.asarray(a), cupy.asarray(b), cupy.zeros((2048, 2048), cupy.float32)
    result = benchmark.pedantic(rt.run, (orchestration, da, db, dc), {"tile": tile}, rounds=ROUNDS,
                                warmup_rounds=2)
    expected = a.astype(np.float64) @ b
    assert result.num_tasks == (2048 // tile) ** 2 * (2048 // tile + 2)
    assert np.abs(dc.get() - expected).max() <= 1e-4 * np.abs(expected).max()
    per_task(benchmark, result.num_tasks)
    how_it_ran(benchmark, result)


@pytest.mark.parametrize("orchestration", [tiled_matmul, tiled_matmul_compiled], ids=["python", "compiled"])
def test_tiled_matmul_2048(benchmark, cupy, orchestration):
    """The demo's 128 tiles, each product one cuBLAS call (beta 1) issued from numba; the compiled
    orchestration's tasks are issued without Python."""
    tiled_matmul_rounds(benchmark, cupy, orchestration, 128)


@pytest.mark.parametrize("tile", [256, 512])
def test_tiled_matmul_2048_tiles(benchmark, cupy, tile):
    """The compiled orchestration in larger tiles: fewer, longer cuBLAS calls."""
    tiled_matmul_rounds(benchmark, cupy, tiled_matmul_compiled, tile)


def test_tiled_matmul_2048_persistent(benchmark, cupy):
    """The demo's 128 tiles, compiled, in one persistent kernel: each tile product the generated
    kernel's code on one block (issue 44's target: within 2x of one cupy.matmul). (The Python
    orchestration's 4,608 submits alone took 104 ms of the host's CPU on an H200's host.)"""
    tiled_matmul_rounds(benchmark, cupy, tiled_matmul_compiled, 128, "persistent")


def test_tiled_matmul_2048_cupy(benchmark, cupy):
    """One cupy.matmul of the same operands: what the persistent kernel's 4,608 tasks are
    measured against (issue 44: within 2x)."""
    rng = np.random.default_rng(0)
    a, b = (cupy.asarray(rng.standard_normal((2048, 2048)).astype(np.float32)) for _ in range(2))

    def product():
        cupy.matmul(a, b)
        cupy.cuda.get_current_stream().synchronize()

    benchmark.pedantic(product, rounds=ROUNDS, warmup_rounds=2)


def test_tiled_matmul_2048_numpy(benchmark):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2048, 2048)).astype(np.float32) for _ in range(2))
    benchmark.pedantic(np.matmul, (a, b), rounds=ROUNDS, warmup_rounds=2)


# --- the LLaMA layer ---------------------------------------------------------------------------
_LLAMA_OUT = {}  # the stream executor's output, which the persistent kernel's must equal


def llama_layer(executor: str):
    """A runtime on `executor` and the layer's inputs at seq 1024 on its device."""
    rt = pto.Runtime(backend="cuda", executor=executor, heap_bytes=1 << 30)
    return rt, to_backend(rt.backend, llama_layer_inputs(1024))


def llama_reference(cupy) -> np.ndarray:
    """The stream executor's output (its test's, or made here: gpu_check runs the persistent
    executor's benchmarks in a process of their own)."""
    if "out" not in _LLAMA_OUT:
        rt, inputs = llama_layer("stream")
        rt.run(llama_layer_compiled, inputs)
        _LLAMA_OUT["out"] = cupy.asnumpy(inputs["out"]).astype(np.float64)
    return _LLAMA_OUT["out"]


@pytest.mark.parametrize("executor", ["stream", "persistent"])
def test_llama_layer_compiled(benchmark, cupy, executor):
    """The compiled LLaMA-7B layer at seq 1024, float32, on the stream executor (native issue,
    its tile products cuBLAS calls) and in one persistent kernel (every task the generated
    code on one block), side by side (issue 44: the persistent one faster), their outputs equal
    within float32 sums in other orders."""
    rt, inputs = llama_layer(executor)
    result = benchmark.pedantic(rt.run, (llama_layer_compiled, inputs), rounds=3, warmup_rounds=1)
    per_task(benchmark, result.num_tasks)
    how_it_ran(benchmark, result)
    out = cupy.asnumpy(inputs["out"]).astype(np.float64)
    assert np.isfinite(out).all() and np.abs(out).max() > 0
    if executor == "stream":
        _LLAMA_OUT["out"] = out
    else:
        want = llama_reference(cupy)
        np.testing.assert_allclose(out, want, atol=1e-3 * np.abs(want).max())


# --- GEMM --------------------------------------------------------------------------------
GEMM_TILES = 4


def gemm_tiles(o, a, b, c):
    """C = A @ B as GEMM_TILES x GEMM_TILES output tiles, each one CUBE task over all of k."""
    A, B, C = o.external(a), o.external(b), o.external(c)
    step = N // GEMM_TILES
    for i in range(0, N, step):
        for j in range(0, N, step):
            o.submit(matmul, pto.input(A[i:i + step]), pto.input(B[:, j:j + step]),
                     pto.output(C[i:i + step, j:j + step]))


@pytest.fixture(scope="module")
def gemm_operands(cupy):
    # Two pairs, alternated between rounds, so no round finds its inputs already in L2.
    generator = cupy.random.default_rng(0)
    pairs = [tuple(generator.standard_normal((N, N), dtype=cupy.float32).astype(cupy.float16)
                   for _ in range(2)) for _ in range(2)]
    return pairs, cupy.zeros((N, N), cupy.float16)


def gemm_check(cupy, a, b, c):
    rows = slice(0, None, 31)  # float16 sums of 8192 products in float32: rows of every task, warp, unit row
    reference = a[rows].astype(cupy.float32) @ b.astype(cupy.float32)
    assert float(cupy.abs(c[rows].astype(cupy.float32) - reference).max()) <= 0.05 * float(
        cupy.abs(reference).max())


def tflops(benchmark, flops):
    benchmark.extra_info["tflops"] = flops / benchmark.stats.stats.median / 1e12


def test_gemm_runtime(benchmark, cupy, gemm_operands):
    pairs, c = gemm_operands
    rt = pto.Runtime(backend="cuda", executor="stream")
    turn = iter(range(10**9))
    result = benchmark.pedantic(lambda: rt.run(gemm_tiles, *pairs[next(turn) % 2], c), rounds=ROUNDS,
                                warmup_rounds=2)
    gemm_check(cupy, *pairs[(ROUNDS + 2 - 1) % 2], c)
    tflops(benchmark, 2 * N**3)
    how_it_ran(benchmark, result)


def test_gemm_cublas(benchmark, cupy, gemm_operands):
    """One cuBLAS call, what the tiled GEMMs are measured against: beside the first of them, so
    that a budget that runs out leaves the ratio."""
    cublas_rounds(benchmark, cupy, *gemm_operands)
    tflops(benchmark, 2 * N**3)


def generated_matmul(dtype=np.float16, tf32: bool = False, form: str = "band64"):
    """The matmul family's generated CUDA code for 1024 x 8192 @ 8192 x 128 tiles (float16, or
    float32 with its products as TF32), as a kernel of its own: the family's tasks would run
    cuBLAS. `form`: its bands' rows, chunks of k and result registers (test_gpu_code.BAND_FORMS;
    bench/test_gpu_code.py -k ptxas has their registers and shared memory)."""
    shapes = ((GEMM_ROWS, N), (N, GEMM_COLS), (GEMM_ROWS, GEMM_COLS))
    code = band_code(shapes, dtype, *BAND_FORMS[form], tf32=tf32)
    return pto.kernel(worker=pto.CUBE, name="matmul", cuda=code)(lambda a, b, out: None)


def generated_rounds(benchmark, cupy, kernel, pairs, c, orchestration=gemm_in_tiles_compiled) -> None:
    """Three rounds of the generated-tiles GEMM through the stream executor, pairs alternated:
    its 512 tasks submitted by compiled code unless `orchestration` says otherwise, so that the
    figure is the kernel's. (From Python, on an H200's host, ~20-35 us a submit: 10-18 ms of the
    host's a round, what the best forms took in all on 2026-11-30, test_gemm_generated_tiles_python
    and bench/test_host.py's gemm submits say how much.)"""
    rt = pto.Runtime(backend="cuda", executor="stream")
    turn = iter(range(10**9))
    result = benchmark.pedantic(lambda: rt.run(orchestration, kernel, *pairs[next(turn) % 2], c), rounds=3,
                                warmup_rounds=1)
    gemm_check(cupy, *pairs[(3 + 1 - 1) % 2], c)
    tflops(benchmark, 2 * N**3)
    how_it_ran(benchmark, result)
    kernel_time(benchmark, lambda **traced: rt.run(orchestration, kernel, *pairs[0], c, **traced))


@pytest.mark.parametrize("form", BAND_FORMS)
def test_gemm_generated_tiles(benchmark, cupy, gemm_operands, form):
    generated_rounds(benchmark, cupy, generated_matmul(form=form), *gemm_operands)


def test_gemm_generated_tiles_python(benchmark, cupy, gemm_operands):
    """band64's tasks submitted from Python, as the benchmark did up to 2026-11-30, beside the
    compiled submits of test_gemm_generated_tiles[band64]: their difference is the host's."""
    generated_rounds(benchmark, cupy, generated_matmul(form="band64"), *gemm_operands,
                     orchestration=gemm_in_tiles)


def test_gemm_generated_tiles_mma_sync(benchmark, cupy, gemm_operands, monkeypatch):
    """band64 built for sm_90 (mma.sync) on a GPU whose runs take wgmma (sm_90a), to set beside
    test_gemm_generated_tiles[band64] from the same run: on two H200 runs of 2026-11-30 one
    mma.sync kernel, its PTX unchanged, gave 68.5 and 43.9 TFLOP/s."""
    monkeypatch.setattr(CupyDevice, "wgmma", lambda device: False)
    generated_rounds(benchmark, cupy, generated_matmul(form="band64"), *gemm_operands)


@pytest.fixture(scope="module")
def gemm_operands_float32(cupy):
    generator = cupy.random.default_rng(0)
    pairs = [tuple(generator.standard_normal((N, N), dtype=cupy.float32) for _ in range(2)) for _ in range(2)]
    return pairs, cupy.zeros((N, N), cupy.float32)


def test_gemm_generated_tiles_tf32(benchmark, cupy, gemm_operands_float32):
    """float32 operands, the generated tiles' products on tensor cores as TF32 (docs/ISA.md,
    "TF32, on request"); cuBLAS's float32 GEMM beside it is test_gemm_cublas_float32."""
    generated_rounds(benchmark, cupy, generated_matmul(np.float32, tf32=True), *gemm_operands_float32)


def cublas_rounds(benchmark, cupy, pairs, c) -> None:
    """One cuBLAS GEMM (CuPy's matmul) a round, the pairs alternated; c holds the last."""
    turn = iter(range(10**9))

    def one():
        cupy.matmul(*pairs[next(turn) % 2], out=c)
        cupy.cuda.get_current_stream().synchronize()

    benchmark.pedantic(one, rounds=ROUNDS, warmup_rounds=2)
    gemm_check(cupy, *pairs[(ROUNDS + 2 - 1) % 2], c)


def test_gemm_cublas_float32(benchmark, cupy, gemm_operands_float32):
    """CuPy's float32 matmul as it is configured (cuBLAS; TF32 only if CUPY_TF32 says so)."""
    cublas_rounds(benchmark, cupy, *gemm_operands_float32)
    tflops(benchmark, 2 * N**3)


# wgmma's rate: the probe's m64n128k16 kernel (pto_gpu/isa/wgmma_probe.cu; B MN-major, as a
# row-major tile lies), each block multiplying its 64 x 128 @ 128 x 128 in shared memory
# WGMMA_ROUNDS times, 4 blocks an SM: the tensor cores' rate fed from shared memory by
# descriptors, the ceiling of the generated products that take wgmma (tests/test_cuda_wgmma.py
# checks the layouts).
WGMMA_ROUNDS, WGMMA_N = 2000, 128


@pytest.fixture(scope="module")
def wgmma_probe(cupy):
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip(f"wgmma is sm_90a's; this GPU is sm_{cupy.cuda.Device().compute_capability}")
    return wgmma.module(cupy, np.float16).get_function("wgmma_n128_mn_major")


def test_wgmma_rate(benchmark, cupy, wgmma_probe):
    blocks = 4 * cupy.cuda.Device().attributes["MultiProcessorCount"]
    generator = np.random.default_rng(0)
    a = generator.integers(-2, 3, (64, wgmma.K)).astype(np.float16)
    b = generator.integers(-2, 3, (wgmma.K, WGMMA_N)).astype(np.float16)
    d = wgmma.launch(cupy, wgmma_probe, WGMMA_N, np.float16, a, b, WGMMA_ROUNDS, blocks)

    def one():
        wgmma.launch(cupy, wgmma_probe, WGMMA_N, np.float16, a, b, WGMMA_ROUNDS, blocks)
        cupy.cuda.get_current_stream().synchronize()

    benchmark.pedantic(one, rounds=ROUNDS, warmup_rounds=2)
    # small integers: every sum exact in float32 (|d| <= 2000 x 128 x 4)
    want = WGMMA_ROUNDS * (a.astype(np.float64) @ b.astype(np.float64))
    assert np.array_equal(cupy.asnumpy(d[-64:]), want) and np.array_equal(cupy.asnumpy(d[:64]), want)
    tflops(benchmark, 2 * 64 * wgmma.K * WGMMA_N * WGMMA_ROUNDS * blocks)


# --- flash attention ---------------------------------------------------------------------
HEADS, SEQ, DIM = 32, 4096, 64
HALF_DIMS = [64, 128]


def attention_flops(dim: int) -> int:
    return 4 * HEADS * SEQ * SEQ * dim // 2  # QK^T and PV, causal: half the pairs


@pytest.fixture(scope="module")
def qkv(cupy):
    generator = cupy.random.default_rng(1)
    return [generator.standard_normal((HEADS, SEQ, DIM), dtype=cupy.float32) for _ in range(3)]


def half_operands(cupy, dim: int) -> list:
    generator = cupy.random.default_rng(2)
    return [generator.standard_normal((HEADS, SEQ, dim), dtype=cupy.float32).astype(cupy.float16)
            for _ in range(3)]


@pytest.fixture(scope="module", params=HALF_DIMS, ids=[f"d{d}" for d in HALF_DIMS])
def qkv_half(cupy, request):
    """The runtime and SDPA at each head dim first (pytest groups a module fixture's tests by its
    parameter); the other forms' own fixture, qkv_half_forms, after them."""
    return half_operands(cupy, request.param)


@pytest.fixture(scope="module", params=HALF_DIMS, ids=[f"d{d}" for d in HALF_DIMS])
def qkv_half_forms(cupy, request):
    return half_operands(cupy, request.param)


def runtime_attention(benchmark, cupy, qkv, rounds: int, tolerance: float, orchestration=flash_attention,
                      streams: int = 2, tile: int = 128, timed: bool = False) -> None:
    """Causal flash attention through the runtime in `tile`-row tiles, on `streams` streams a
    worker class; its first and last heads against float64 within `tolerance` of the output's
    scale; `timed`: its kernels' mean time a task too (kernel_time)."""
    out = cupy.zeros_like(qkv[0])
    dim = qkv[0].shape[-1]
    rt = pto.Runtime(backend="cuda", executor="stream", heap_bytes=1 << 30,
                     workers={pto.CUBE: streams, pto.VECTOR: streams})
    result = benchmark.pedantic(rt.run, (orchestration, *qkv, out), {"tile": tile, "causal": True},
                                rounds=rounds, warmup_rounds=1)
    how_it_ran(benchmark, result)
    if timed:
        kernel_time(benchmark, lambda **traced: rt.run(orchestration, *qkv, out, tile=tile, causal=True,
                                                       **traced))
    mask = cupy.triu(cupy.full((SEQ, SEQ), -cupy.inf), 1)
    for head in (0, HEADS - 1):
        q, k, v = (a[head].astype(cupy.float64) for a in qkv)
        scores = q @ k.T / math.sqrt(dim) + mask
        weights = cupy.exp(scores - scores.max(axis=1, keepdims=True))
        expected = (weights / weights.sum(axis=1, keepdims=True)) @ v
        error = float(cupy.abs(out[head] - expected).max())
        assert error <= tolerance * float(cupy.abs(expected).max()), (head, error)
    tflops(benchmark, attention_flops(dim))


def sdpa(benchmark, qkv) -> None:
    torch = pytest.importorskip("torch")
    q, k, v = (torch.as_tensor(a, device="cuda")[None] for a in qkv)

    def one():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()

    benchmark.pedantic(one, rounds=ROUNDS, warmup_rounds=2)
    tflops(benchmark, attention_flops(q.shape[-1]))


def test_flash_attention_runtime(benchmark, cupy, qkv):
    runtime_attention(benchmark, cupy, qkv, rounds=5, tolerance=1e-4)


def test_flash_attention_torch_sdpa(benchmark, qkv):
    sdpa(benchmark, qkv)


def test_flash_attention_float16_runtime(benchmark, cupy, qkv_half):
    """Each task's products run as bands of 32 query rows (4 blocks a head, 128 a task) whose
    results and operands' chunks fit shared memory at d = 64 and 128, so both products run on
    tensor cores; float16 stores between the tasks: 1e-2 of the scale."""
    runtime_attention(benchmark, cupy, qkv_half, rounds=3, tolerance=1e-2)


def test_flash_attention_float16_torch_sdpa(benchmark, qkv_half):
    sdpa(benchmark, qkv_half)


@pytest.mark.parametrize("streams", [2, 6])
def test_flash_attention_float16_compiled(benchmark, cupy, qkv_half_forms, streams):
    """The same from the program's compiled orchestration (tasks issued natively), on 2 and 6
    streams a class (the executor takes 16 in all): how much more of the GPU the chains of 32
    query tiles take with more streams."""
    runtime_attention(benchmark, cupy, qkv_half_forms, rounds=3, tolerance=1e-2,
                      orchestration=flash_attention_compiled, streams=streams)


@pytest.mark.parametrize("tile", [64, 128])
def test_flash_attention_float16_fused(benchmark, cupy, qkv_half_forms, tile):
    """One task a query tile (flash_attention_tile: the keys' loop inside it, a block a head;
    64-row tiles: 64 tasks of 32 blocks), from the compiled orchestration on 6 streams; the
    scores stay in float tiles, so the tolerance is the three-task form's."""
    runtime_attention(benchmark, cupy, qkv_half_forms, rounds=3, tolerance=1e-2,
                      orchestration=flash_attention_fused_compiled, streams=6, tile=tile, timed=True)


# --- a user's kernel in column blocks -------------------------------------------------------------
NORM_ROWS, NORM_TILE, NORM_WIDTH = 16384, 64, 4096


def layernorm_kernel() -> pto.Kernel:
    """The user's LayerNorm of bench/user_kernels.py at 64 x 4096 tiles."""
    return isa.compile(user_module(NORM_TILE, NORM_WIDTH)).kernels["layernorm"]


def layernorm_rows(o, kernel, x, weight, bias, out):
    X, W, B, Y = (o.external(a) for a in (x, weight, bias, out))
    for row in range(0, x.shape[0], NORM_TILE):
        o.submit(kernel, pto.input(X[row:row + NORM_TILE]), pto.input(W), pto.input(B),
                 pto.output(Y[row:row + NORM_TILE]), 1e-5)


@pytest.fixture(scope="module")
def norm_operands(cupy):
    generator = cupy.random.default_rng(3)
    return (generator.standard_normal((NORM_ROWS, NORM_WIDTH), dtype=cupy.float32),
            generator.uniform(0.5, 1.5, (1, NORM_WIDTH), dtype=cupy.float32),
            generator.standard_normal((1, NORM_WIDTH), dtype=cupy.float32))


def bandwidth(benchmark, array) -> None:
    benchmark.extra_info["gb_per_s"] = 2 * array.nbytes / benchmark.stats.stats.median / 1e9


def test_user_layernorm_runtime(benchmark, cupy, norm_operands):
    x, weight, bias = norm_operands
    out = cupy.zeros_like(x)
    kernel = layernorm_kernel()
    rt = pto.Runtime(backend="cuda", executor="stream")
    result = benchmark.pedantic(rt.run, (layernorm_rows, kernel, x, weight, bias, out), rounds=ROUNDS,
                                warmup_rounds=1)
    how_it_ran(benchmark, result)
    x64 = x[:256].astype(cupy.float64)
    centred = x64 - x64.mean(axis=1, keepdims=True)
    expected = centred / cupy.sqrt((centred ** 2).mean(axis=1, keepdims=True) + 1e-5) * weight + bias
    assert float(cupy.abs(out[:256] - expected).max()) <= 1e-4 * float(cupy.abs(expected).max())
    bandwidth(benchmark, x)


def test_user_layernorm_torch(benchmark, norm_operands):
    torch = pytest.importorskip("torch")
    x, weight, bias = (torch.as_tensor(a, device="cuda") for a in norm_operands)

    def one():
        torch.nn.functional.layer_norm(x, (NORM_WIDTH,), weight[0], bias[0], 1e-5)
        torch.cuda.synchronize()

    benchmark.pedantic(one, rounds=ROUNDS, warmup_rounds=2)
    bandwidth(benchmark, x)
