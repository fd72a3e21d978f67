"""No-op task throughput through the parallel and stream executors against dask.threaded.get,
same graphs.

Figures are tasks per second: extra_info["tasks_per_s"] = tasks / median.
"""

import numpy as np
import pytest

import pto_gpu as pto

dask = pytest.importorskip("dask")
from dask.threaded import get as dask_get  # noqa: E402

TASKS = 20_000


@pto.kernel(worker=pto.VECTOR)
def touch(out):
    pass


def independent(o, x):
    X = o.external(x)
    tiles = [X[i] for i in range(len(x))]
    for i in range(TASKS):  # readers of 64 distinct rows: no edges
        o.submit(touch, pto.input(tiles[i % len(tiles)]))


def chain(o, x):
    tile = o.external(x)[0]
    for _ in range(TASKS):
        o.submit(touch, pto.inout(tile))


def _noop(*_):
    return None


def dask_independent():
    return {f"t{i}": (_noop,) for i in range(TASKS)}, [f"t{i}" for i in range(TASKS)]


def dask_chain():
    graph = {"t0": (_noop,)}
    graph.update({f"t{i}": (_noop, f"t{i - 1}") for i in range(1, TASKS)})
    return graph, f"t{TASKS - 1}"


def rate(benchmark):
    benchmark.extra_info["tasks_per_s"] = TASKS / benchmark.stats.stats.median


@pytest.mark.parametrize("executor", ["parallel", "stream"])
@pytest.mark.parametrize("shape", ["independent", "chain"])
def test_pto(benchmark, shape, executor):
    rt = pto.Runtime(backend="cpu", executor=executor)
    x = np.zeros((64, 16), np.float32)
    orch = independent if shape == "independent" else chain
    result = benchmark.pedantic(rt.run, (orch, x), rounds=5, warmup_rounds=1)
    assert result.num_tasks == TASKS
    assert result.num_edges == (0 if shape == "independent" else TASKS - 1)
    rate(benchmark)


@pytest.mark.parametrize("shape", ["independent", "chain"])
def test_dask_threaded(benchmark, shape):
    graph, keys = dask_independent() if shape == "independent" else dask_chain()
    benchmark.pedantic(dask_get, (graph, keys), rounds=5, warmup_rounds=1)
    rate(benchmark)
