"""The host's own share of the GPU benchmarks' Python orchestrations (bench/gpu_graphs.py): their
submits on the dry executor (the orchestrator, its TensorMap and task ring; no kernel, no
driver), on any machine. `make gpu-check` runs it on the GPU's host beside bench/test_gpu.py, so
that a GPU figure from Python submits can be set against what the host's Python alone took, and
the same benchmark on a machine without a GPU says how fast that host is beside this one.
extra_info["us_per_task"] = median / tasks."""

import numpy as np
import pytest
from gpu_graphs import GEMM_COLS, GEMM_ROWS, SUBMITS, N, element_tasks, gemm_in_tiles, per_task
from pto_gpu.kernels.tiles import matmul

import pto_gpu as pto


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "independent"])
def test_element_submits(benchmark, chain):
    """test_gpu.py's test_overhead_streams's submits (its us_per_task less this one: the stream
    executor's and the driver's share)."""
    rt = pto.Runtime(backend="cpu", executor="dry", task_window=4096)
    x = np.ones((128, 1), np.float32)
    result = benchmark.pedantic(rt.run, (element_tasks, x, chain), rounds=20, warmup_rounds=2)
    assert result.num_tasks == SUBMITS
    per_task(benchmark, SUBMITS)


def test_gemm_submits(benchmark):
    """test_gpu.py's test_gemm_generated_tiles_python's 512 submits: a floor under that
    benchmark's time a round, whatever its kernel does (the GPU's time is the rest)."""
    rt = pto.Runtime(backend="cpu", executor="dry")
    a, b, c = (np.zeros((N, N), np.float16) for _ in range(3))  # never written: pages stay unmapped
    result = benchmark.pedantic(rt.run, (gemm_in_tiles, matmul, a, b, c), rounds=20, warmup_rounds=2)
    tasks = (N // GEMM_ROWS) * (N // GEMM_COLS)
    assert result.num_tasks == tasks
    per_task(benchmark, tasks)
    benchmark.extra_info["round_ms"] = benchmark.stats.stats.median * 1e3
