"""Task throughput against dask.threaded.get, same graphs: no-op Python kernels through the
parallel and stream executors, and tiny generated kernels that a compiled orchestration or a
Python one submits (run by native workers) against Dask running the same numpy work.

Figures are tasks per second: extra_info["tasks_per_s"] = tasks / median.
"""

import numba
import numpy as np
import pytest
from pto_gpu.kernels.elementwise import scale

import pto_gpu as pto
from pto_gpu import jit as pj

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


# --- tiny generated-kernel tasks (issue 16): compiled orchestration, native workers ------------
# Each task scales one 16-float row: out = 2 * x (independent, 64 rows over and over) or x *= 1
# in place (one chain). Dask runs the same numpy work on the same rows.

@numba.njit(cache=True)
def _generated_independent(o, x, y, tasks, scale_id):
    rows = pj.shape(x, 0)
    for i in range(tasks):
        r = i % rows
        pj.submit(o, scale_id, (pj.input(pj.narrow(x, 0, r, r + 1)), pj.output(pj.narrow(y, 0, r, r + 1))),
                  (2.0,))


@numba.njit(cache=True)
def _generated_chain(o, x, tasks, scale_id):
    row = pj.narrow(x, 0, 0, 1)
    for _ in range(tasks):
        pj.submit(o, scale_id, (pj.input(row), pj.output(row)), (1.0,))


def generated(o, x, y, shape):
    if shape == "independent":
        o.compiled(_generated_independent, o.external(x), o.external(y), TASKS, scale.id)
    else:
        o.compiled(_generated_chain, o.external(x), TASKS, scale.id)


def generated_python(o, x, y, shape):
    """`generated`'s graph, submitted from Python: its tasks run natively too."""
    X, Y = o.external(x), o.external(y)
    if shape == "independent":
        pairs = [(pto.input(X[r:r + 1]), pto.output(Y[r:r + 1])) for r in range(len(x))]
        for i in range(TASKS):
            o.submit(scale, *pairs[i % len(pairs)], 2.0)
    else:
        row = X[0:1]
        for _ in range(TASKS):
            o.submit(scale, pto.input(row), pto.output(row), 1.0)


def _rows() -> tuple[np.ndarray, np.ndarray]:
    """x and y, two allocations (views of one would share a TensorMap owner and so its chains)."""
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    return x, np.zeros_like(x)


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


@pytest.mark.parametrize("orchestration", [generated, generated_python], ids=["compiled", "python"])
@pytest.mark.parametrize("shape", ["independent", "chain"])
def test_pto_generated(benchmark, shape, orchestration):
    rt = pto.Runtime(backend="cpu", executor="parallel")
    x, y = _rows()
    result = benchmark.pedantic(rt.run, (orchestration, x, y, shape), rounds=5, warmup_rounds=1)
    assert result.num_tasks == TASKS and result.native_tasks == TASKS
    if shape == "independent":
        assert np.array_equal(y, 2 * x)
    rate(benchmark)


@pytest.mark.parametrize("shape", ["independent", "chain"])
def test_dask_generated(benchmark, shape):
    x, y = _rows()
    graph, keys = dask_generated(x, y, shape)
    benchmark.pedantic(dask_get, (graph, keys), rounds=5, warmup_rounds=1)
    if shape == "independent":
        assert np.array_equal(y, 2 * x)
    rate(benchmark)
