"""Every executor must leave every byte as the serial one does, on real graphs
(random ones are in test_fuzz.py)."""

import numpy as np
import pytest
from conftest import EXECUTORS
from pto_gpu.orchestration.matmul import tiled_matmul

import pto_gpu as pto


@pytest.mark.parametrize("shape", [(256, 384, 256), (200, 130, 70)])
def test_tiled_matmul_matches_numpy(executor, shape):
    m, k, n = shape
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    result = pto.Runtime(backend="cpu", executor=executor).run(tiled_matmul, a, b, c, tile=64)
    tiles = -(-m // 64) * -(-n // 64)
    assert result.num_tasks == tiles * (2 + -(-k // 64))
    # float32 accumulation over k terms: error grows ~ sqrt(k) * eps * |a||b|; 1e-4 relative is ample.
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("executor", [e for e in EXECUTORS if e != "serial"])
def test_matmul_is_bit_identical_to_serial(executor):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    expected, got = np.zeros((256, 256), np.float32), np.zeros((256, 256), np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, expected, tile=64)
    pto.Runtime(backend="cpu", executor=executor).run(tiled_matmul, a, b, got, tile=64)
    assert got.any() and got.tobytes() == expected.tobytes()


def test_hundred_thousand_tasks_complete_with_rings_empty():
    @pto.kernel(worker=pto.VECTOR)
    def tick(out):
        out += 1

    def orch(o, counters):
        X = o.external(counters)
        for i in range(100_000):
            o.submit(tick, pto.inout(X[i % 8]))

    counters = np.zeros(8, np.int64)
    rt = pto.Runtime(backend="cpu", executor="parallel", task_window=256)
    result = rt.run(orch, counters, threshold=64)
    assert result.num_tasks == 100_000
    np.testing.assert_array_equal(counters, 12_500)
    h = rt._scheduler.state.head
    assert h["last_alive"] == 100_000 and h["dep_used"] == 0
