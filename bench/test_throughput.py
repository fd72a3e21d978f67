"""Task throughput against dask.threaded.get, same graphs: no-op Python kernels through the
parallel and stream executors, and tiny generated kernels that a compiled orchestration or a
Python one submits (run by native workers) against Dask running the same numpy work.

Figures are tasks per second: extra_info["tasks_per_s"] = tasks / median.
"""

import numpy as np
import pytest
from pto_gpu.kernels.elementwise import scale
from tiny_tasks import TASKS, generated, generated_python, rows, user_scale

import pto_gpu as pto

dask = pytest.importorskip("dask")
from dask.threaded import get as dask_get  # noqa: E402


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


# --- tiny generated-kernel tasks (issue 16): compiled orchestration, native workers ------------
# tiny_tasks.py's graphs; Dask runs the same numpy work on the same rows.

def _scale_into(x, out, factor, *after):
    np.multiply(x, factor, out=out)


def dask_generated(x, y, shape):
    if shape == "independent":
        rows = [(x[r:r + 1], y[r:r + 1]) for r in range(len(x))]
        graph = {f"t{i}": (_scale_into, *rows[i % len(x)], 2.0) for i in range(TASKS)}
        return graph, list(graph)
    row = x[0:1]
    graph = {"t0": (_scale_into, row, row, 1.0)}
    graph.update({f"t{i}": (_scale_into, row, row, 1.0, f"t{i - 1}") for i in range(1, TASKS)})
    return graph, f"t{TASKS - 1}"


@pytest.mark.parametrize("kernel", [scale, user_scale], ids=["library", "user"])
@pytest.mark.parametrize("orchestration", [generated, generated_python], ids=["compiled", "python"])
@pytest.mark.parametrize("shape", ["independent", "chain"])
def test_pto_generated(benchmark, shape, orchestration, kernel):
    """The library's `scale` and the same kernel compiled from a user's program (issue 42's
    target: the user's at least 20x Dask's rate) run alike: natively."""
    rt = pto.Runtime(backend="cpu", executor="parallel")
    x, y = rows()
    result = benchmark.pedantic(rt.run, (orchestration, x, y, shape, kernel), rounds=5, warmup_rounds=1)
    assert result.num_tasks == TASKS and result.native_tasks == TASKS
    if shape == "independent":
        assert np.array_equal(y, 2 * x)
    rate(benchmark)


@pytest.mark.parametrize("shape", ["independent", "chain"])
def test_dask_generated(benchmark, shape):
    x, y = rows()
    graph, keys = dask_generated(x, y, shape)
    benchmark.pedantic(dask_get, (graph, keys), rounds=5, warmup_rounds=1)
    if shape == "independent":
        assert np.array_equal(y, 2 * x)
    rate(benchmark)
