"""The parallel executor must leave every byte as the serial one does, on real and random graphs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pto_gpu as pto
from orchestration.matmul import tiled_matmul


def _combine(n_inputs, *views):
    """Every output depends on every input: out = out / 2 + sum(inputs) + 1."""
    total = sum(float(v.sum()) for v in views[:n_inputs]) + 1.0
    for out in views[n_inputs:]:
        out[...] = out * 0.5 + total


combine_cube = pto.kernel(worker=pto.CUBE, name="combine_cube")(_combine)
combine_vector = pto.kernel(worker=pto.VECTOR, name="combine_vector")(_combine)


@pto.kernel(worker=pto.VECTOR)
def stamp(out, value):
    out[...] = value


def random_slice(rng, t):
    key = []
    for n in t.shape:
        start = int(rng.integers(0, n))
        key.append(slice(start, int(rng.integers(start + 1, n + 1)), int(rng.integers(1, 3))))
    view = t[tuple(key)]
    if rng.random() < 0.2:
        view = view.T
    if rng.random() < 0.2:
        view = view.with_overlap(pto.Overlap.BOUNDING_BOX)
    return view


def random_program(o, xs, seed, n_ops):
    """A deterministic random orchestration: slices, alloc/free/scopes, versions, inout."""
    rng = np.random.default_rng(seed)
    externals = [o.external(x) for x in xs] + [o.external(xs[0][2:, :])]  # an aliasing view
    live = []
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.12:
            t = o.alloc((8, 8), pto.FLOAT64)
            o.submit(stamp, pto.output(t), float(rng.integers(10)))
            live.append(t)
        elif r < 0.2 and live:
            o.free(live.pop(int(rng.integers(len(live)))))
        elif r < 0.25 and live:
            i = int(rng.integers(len(live)))
            live[i] = o.version_inc(live[i])
        elif r < 0.3:
            with o.scope():
                t = o.alloc((8, 8), pto.FLOAT64)
                o.submit(stamp, pto.output(t), 3.0)
                o.submit(combine_vector, 1, pto.input(t), pto.inout(random_slice(rng, externals[0])))
        else:
            pool = externals + live
            n_in = int(rng.integers(0, 3))
            n_out = int(rng.integers(1, 3))
            picks = [random_slice(rng, pool[int(rng.integers(len(pool)))]) for _ in range(n_in + n_out)]
            kinds = [pto.input] * n_in + [
                pto.inout if rng.random() < 0.5 else pto.output for _ in range(n_out)]
            kernel = combine_cube if rng.random() < 0.5 else combine_vector
            o.submit(kernel, n_in, *(k(t) for k, t in zip(kinds, picks)))
    for t in live:
        o.free(t)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 80),
       window=st.sampled_from([4, 8, 64, 1024]), threshold=st.sampled_from([0, 1, 5]),
       workers=st.integers(1, 3))
def test_random_programs_match_serial(seed, n_ops, window, threshold, workers):
    def run(executor, **config):
        xs = [np.arange(64, dtype=np.float64).reshape(8, 8) / 7, np.ones((8, 8))]
        rt = pto.Runtime(backend="cpu", executor=executor, heap_bytes=1 << 16, **config)
        result = rt.run(random_program, xs, seed, n_ops, record=True,
                        threshold=threshold if executor == "parallel" else 0)
        return xs, result

    expected, reference = run("serial")
    got, result = run("parallel", task_window=window,
                      workers={pto.CUBE: workers, pto.VECTOR: workers})
    for e, g in zip(expected, got):
        assert e.tobytes() == g.tobytes()
    assert result.graph.edges == reference.graph.edges
    assert result.num_tasks == reference.num_tasks


@pytest.mark.parametrize("executor", ["serial", "parallel"])
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


def test_parallel_matmul_is_bit_identical_to_serial():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    outputs = []
    for executor in ("serial", "parallel"):
        c = np.zeros((256, 256), np.float32)
        pto.Runtime(backend="cpu", executor=executor).run(tiled_matmul, a, b, c, tile=64)
        outputs.append(c)
    assert outputs[0].tobytes() == outputs[1].tobytes()


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
    from pto_gpu.core import state as cs
    h = rt._scheduler.state.header
    assert h[cs.H_LAST_ALIVE] == 100_000 and h[cs.H_DEP_USED] == 0
