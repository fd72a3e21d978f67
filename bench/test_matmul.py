"""Tiled matmul 2048x2048 float32 with 128-row tiles: pto-gpu against numpy and dask.array.

`panels` is the tiled matmul with B packed into panels once (tiled_matmul_panels), whose tile
products run kernels/panels.py's micro-kernel; the others run BLAS on the strided tiles."""

import numpy as np
import pytest
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled, tiled_matmul_panels

import pto_gpu as pto

N = 2048
TILE = 128


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype(np.float32)
    b = rng.standard_normal((N, N)).astype(np.float32)
    return a, b, a.astype(np.float64) @ b.astype(np.float64)


def check(c, reference):
    # float32 sums of 2048 products: relative error well under 1e-4 of the largest entry.
    assert np.abs(c - reference).max() <= 1e-4 * np.abs(reference).max()


@pytest.mark.parametrize("orchestration", [tiled_matmul, tiled_matmul_compiled, tiled_matmul_panels],
                         ids=["python", "compiled", "panels"])
@pytest.mark.parametrize("tile", [TILE, 256])
def test_pto_parallel(benchmark, operands, tile, orchestration):
    """The Python orchestration's tasks run on Python workers; the compiled one's on native
    workers, without the GIL (BLAS tiles included)."""
    a, b, reference = operands
    c = np.zeros((N, N), np.float32)
    rt = pto.Runtime(backend="cpu")
    benchmark.pedantic(rt.run, (orchestration, a, b, c), {"tile": tile}, rounds=5, warmup_rounds=1)
    check(c, reference)


def test_numpy(benchmark, operands):
    a, b, reference = operands
    c = benchmark.pedantic(np.matmul, (a, b), rounds=5, warmup_rounds=1)
    check(c, reference)


def test_dask_array(benchmark, operands):
    da = pytest.importorskip("dask.array")
    a, b, reference = operands
    product = da.matmul(da.from_array(a, chunks=TILE), da.from_array(b, chunks=TILE))
    c = benchmark.pedantic(product.compute, kwargs={"scheduler": "threads"}, rounds=3, warmup_rounds=1)
    check(c, reference)
