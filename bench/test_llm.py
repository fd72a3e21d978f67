"""LLM workloads: LLaMA-layer graph build (dry executor) and end-to-end CPU runs vs numpy.

Graph build, by the Python-level and the compiled orchestration: extra_info has tasks,
tasks per ms, and memory: the runtime's fixed core tables
(sized by its settings, not by the graph) and the peak of everything else allocated during
one run, measured in a separate pass under tracemalloc (which sees numpy's allocations and
slows Python down, so it is kept out of the timed rounds). Inputs and the heap ring's one
allocation (untouched by a dry run) are excluded. Spec 003 §4.4 reports the C prototype's
build time and memory for the same counts.
"""

import tracemalloc

import numpy as np
import pytest
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import flash_attention, flash_attention_fused
from pto_gpu.orchestration.llama import expected_tasks, llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.softmax import fused_softmax

import pto_gpu as pto


def peak_run_memory(rt, orchestration, inputs, adaptive) -> int:
    tracemalloc.start()
    rt.run(orchestration, inputs, adaptive=adaptive)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("orchestration", [llama_layer, llama_layer_compiled], ids=["python", "compiled"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["32-row", "adaptive"])
@pytest.mark.parametrize("seq_len", [1024, 2048, 4096, 8192, 16384])
def test_llama_graph_build(benchmark, seq_len, adaptive, orchestration):
    inputs = llama_layer_inputs(seq_len, lazy=True)
    tasks = expected_tasks(seq_len // (64 if adaptive else 32))
    rt = pto.Runtime(backend="cpu", executor="dry")
    rounds = 1 if tasks > 100_000 else 3
    result = benchmark.pedantic(rt.run, (orchestration, inputs), {"adaptive": adaptive},
                                rounds=rounds, iterations=1, warmup_rounds=1)
    assert result.num_tasks == tasks
    tables = sum(getattr(rt._scheduler.state, f).nbytes for f in
                 ("header", "tasks", "buffers", "deps", "entries", "buckets", "producers", "covered"))
    benchmark.extra_info.update(
        tasks=tasks, tasks_per_ms=tasks / (benchmark.stats.stats.median * 1e3),
        core_tables_mb=tables / 2**20,
        run_peak_mb=peak_run_memory(rt, orchestration, inputs, adaptive) / 2**20)


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((8, 2048, 64)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize("orchestration", [flash_attention, flash_attention_fused], ids=["pairs", "fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_pto(benchmark, qkv, causal, orchestration):
    """Three tasks a (query tile, key tile) pair, or one task a query tile (the loop over the
    keys inside it)."""
    out = np.zeros_like(qkv[0])
    rt = pto.Runtime(backend="cpu")
    benchmark.pedantic(rt.run, (orchestration, *qkv, out), {"tile": 128, "causal": causal},
                       rounds=5, warmup_rounds=1)
    expected = reference.attention(*qkv, causal)
    assert np.abs(out - expected).max() < 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_numpy(benchmark, qkv, causal):
    out = benchmark.pedantic(reference.attention, (*qkv, causal, np.float32), rounds=5, warmup_rounds=1)
    assert out.dtype == np.float32


@pytest.fixture(scope="module")
def softmax_input():
    return np.random.default_rng(1).standard_normal((4096, 1024)).astype(np.float32)


def test_fused_softmax_pto(benchmark, softmax_input):
    out = np.zeros_like(softmax_input)
    rt = pto.Runtime(backend="cpu")
    benchmark.pedantic(rt.run, (fused_softmax, softmax_input, out), {"tile_rows": 256},
                       rounds=5, warmup_rounds=1)
    np.testing.assert_allclose(out, reference.softmax(softmax_input), rtol=1e-5, atol=1e-7)


def test_fused_softmax_numpy(benchmark, softmax_input):
    benchmark.pedantic(reference.softmax, (softmax_input, np.float32), rounds=5, warmup_rounds=1)
