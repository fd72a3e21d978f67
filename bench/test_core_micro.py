"""Core micro-benchmarks inside njit loops (spec 001 §9.3 targets, in cycles).

Each benchmark runs N operations in one njit call; ns/op = median / N. Every loop must stay
in a steady state (nothing fills up), and the submit loops count refused submits so that
a benchmark never measures the FULL_* fast path by accident. The loops are compiled as the
core's own transitions are (`_nrt=False`, see pto_gpu/core), since the helpers they call
are inlined into their callers and run inside submit and complete in the runtime.
"""

import numpy as np
import pytest
from numba import njit
from pto_gpu.kernels.elementwise import scale

import pto_gpu as pto
from pto_gpu.core import rings
from pto_gpu.core import state as cs
from pto_gpu.core.complete import complete
from pto_gpu.core.submit import submit
from pto_gpu.core.tensormap import tm_insert, tm_remove
from pto_gpu.layout import layout_row

N = 100_000


def fresh(**sizes):
    return cs.CoreState.allocate(cs.Sizes(**sizes))


@njit(cache=True, _nrt=False)
def _task_ring_loop(header, tasks, n):
    for _ in range(n):
        task = rings.task_ring_alloc(header, tasks)
        tasks[task & (header[0].window - 1)].state = cs.COMPLETED
        rings.retire_completed(header, tasks)


@njit(cache=True, _nrt=False)
def _heap_ring_loop(header, buffers, n):
    for _ in range(n):
        seq = rings.heap_alloc(header, buffers, 4096)
        rings.buffer_free(header, buffers, seq)


@njit(cache=True, _nrt=False)
def _tm_insert_loop(header, entries, buckets, row, n):
    for i in range(n):
        entry = tm_insert(header, entries, buckets, row, i, cs.WRITER)
        tm_remove(header, entries, buckets, entry)


@njit(cache=True, _nrt=False)
def _submit_complete_loop(header, tasks, buffers, deps, entries, buckets, producers, covered, even, odd,
                          ready, n):
    """Tasks alternate between reading tile A and writing B, and the reverse: each write covers
    the entries of the previous task on its tile, so the TensorMap stays at a few entries."""
    refused = 0
    for i in range(n):
        params = odd if i & 1 else even
        task = submit(header, tasks, buffers, deps, entries, buckets, producers, covered, 0, 1, params)
        if task < 0:
            refused += 1
        else:
            complete(header, tasks, buffers, deps, task, ready)
    return refused


def per_op(benchmark, n):
    benchmark.extra_info["ns_per_op"] = benchmark.stats.stats.median / n * 1e9


def test_task_ring_alloc(benchmark):
    s = fresh()
    benchmark(_task_ring_loop, s.header, s.tasks, N)
    per_op(benchmark, N)


def test_heap_ring_alloc(benchmark):
    s = fresh()
    benchmark(_heap_ring_loop, s.header, s.buffers, N)
    per_op(benchmark, N)


def test_tensormap_insert(benchmark):
    s = fresh()
    row = np.array(layout_row(-1, 1 << 30, 0, 4, (128, 1), (32, 32), 1), np.int64)
    benchmark(_tm_insert_loop, s.header, s.entries, s.buckets, row, N)
    per_op(benchmark, N)


def tile(offset, kind):
    return layout_row(-1, 1 << 30, offset, 4, (1024, 1), (32, 32), 1) + (kind,)


@pytest.mark.parametrize("chain", [0, 16, 256])
def test_submit_and_complete(benchmark, chain):
    """One task reading one tile and writing another, against `chain` live entries of its owner."""
    s = fresh(tensormap_entries=4096)
    for i in range(chain):  # earlier disjoint writers of other tiles of the same matrix
        tm_insert(s.header, s.entries, s.buckets, np.array(tile(4096 * 128 * (i + 2), 0)[:-1]), 0, cs.WRITER)
    even = np.array([tile(0, cs.INPUT), tile(128, cs.OUTPUT)], np.int64)
    odd = np.array([tile(128, cs.INPUT), tile(0, cs.OUTPUT)], np.int64)
    ready = np.empty(64, np.int64)
    n = N // 10
    refused = benchmark(_submit_complete_loop, *s.tables, s.producers, s.covered, even, odd, ready, n)
    assert refused == 0 and s.head["tm_used"] <= chain + 4
    per_op(benchmark, n)


@pytest.mark.parametrize("slicing", [False, True], ids=["reused-descriptors", "slicing"])
def test_python_submit(benchmark, slicing):
    """The Python-level o.submit of a task with two tensor params, dry executor; with
    slicing, both params are sliced from their arrays at each submit, as orchestrations do."""
    @pto.kernel(worker=pto.VECTOR)
    def k(a, b):
        pass

    n = 20_000

    def orch(o, x, y):
        X, Y = o.external(x), o.external(y)
        a, b = X[0:32, 0:32], Y[0:32, 0:32]
        for i in range(n):
            if slicing:
                j = (i % 32) * 32
                a, b = X[0:32, j:j + 32], Y[0:32, j:j + 32]
            o.submit(k, pto.input(a), pto.output(b))

    rt = pto.Runtime(backend="cpu", executor="dry")
    benchmark(rt.run, orch, np.zeros((32, 1024), np.float32), np.zeros((32, 1024), np.float32))
    per_op(benchmark, n)


def test_python_submit_of_a_generated_kernel(benchmark):
    """The same for a kernel with generated code (the library's `scale`): its submit also asks
    whether a written param shares memory with another (pto_gpu/sharing.py); here none does."""
    n = 20_000

    def orch(o, x, y):
        a, b = o.external(x)[0:32, 0:32], o.external(y)[0:32, 0:32]
        for _ in range(n):
            o.submit(scale, pto.input(a), pto.output(b), 0.5)

    rt = pto.Runtime(backend="cpu", executor="dry")
    benchmark(rt.run, orch, np.zeros((32, 1024), np.float32), np.zeros((32, 1024), np.float32))
    per_op(benchmark, n)
