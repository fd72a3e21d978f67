"""Dependency semantics (docs/DESIGN.md): exact edge sets on small orchestrations, every executor."""

import time

import numpy as np
import pytest
from conftest import GRAPH_EXECUTORS, add_into, fill, mix, noop, runtime, zeros
from numpy.lib.stride_tricks import as_strided
from oracle import expected_edges

import pto_gpu as pto


def edges(orch, *args, executor="serial", **kwargs):
    result = runtime(executor, **kwargs).run(orch, *args, record=True)
    assert result.num_edges == len(result.graph.edges)
    return sorted(result.graph.edges)


def test_linear_chain(graph_executor):
    def chain(o, x):
        X = o.external(x)
        t = o.alloc(x.shape)
        o.submit(fill, pto.output(t), 1.0)          # 0
        o.submit(add_into, pto.input(t), pto.inout(X))  # 1
        o.submit(add_into, pto.input(X), pto.inout(t))  # 2
        o.free(t)

    x = zeros(8)
    assert edges(chain, x, executor=graph_executor) == [(0, 1), (0, 2), (1, 2)]


@pto.kernel(worker=pto.VECTOR)
def slow_fill(out, value):
    time.sleep(0.2)  # the other producer finishes first, on another worker
    out[...] = value


def test_a_consumer_of_two_producers_runs_after_the_slower(executor):
    """The consumer becomes ready at its last producer's completion, not its first."""
    def orchestration(o, x, y, out):
        X, Y = o.external(x), o.external(y)
        o.submit(slow_fill, pto.output(X), 1.0)
        o.submit(fill, pto.output(Y), 2.0)
        o.submit(mix, pto.input(X), pto.input(Y), pto.output(o.external(out)))

    x, y, out = zeros(4), zeros(4), zeros(4)
    runtime(executor, workers={pto.VECTOR: 2}).run(orchestration, x, y, out)
    np.testing.assert_array_equal(out, 4.0)  # 2 * 1 + 2


def test_diamond(graph_executor):
    def diamond(o, out):
        a, b, c = (o.alloc((4,)) for _ in range(3))
        o.submit(fill, pto.output(a), 2.0)                                  # 0: A
        o.submit(add_into, pto.input(a), pto.inout(b))                      # 1: B
        o.submit(add_into, pto.input(a), pto.inout(c))                      # 2: C
        o.submit(mix, pto.input(b), pto.input(c), pto.output(o.external(out)))  # 3: D
        for t in (a, b, c):
            o.free(t)

    out = zeros(4)
    assert edges(diamond, out, executor=graph_executor) == [(0, 1), (0, 2), (1, 3), (2, 3)]
    if graph_executor != "dry":
        np.testing.assert_array_equal(out, np.full(4, 2 * 2.0 + 2.0))


def test_write_after_read_and_write_after_write():
    def orch(o, x, y):
        X, Y = o.external(x), o.external(y)
        o.submit(fill, pto.output(X), 1.0)              # 0 writes X
        o.submit(add_into, pto.input(X), pto.inout(Y))  # 1 reads X
        o.submit(add_into, pto.input(X), pto.inout(Y))  # 2 reads X, RAW+WAW on Y from 1
        o.submit(fill, pto.output(X), 5.0)              # 3: WAW on 0 (covered), WAR on 1 and 2

    x, y = zeros(6), zeros(6)
    assert edges(orch, x, y) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    np.testing.assert_array_equal(y, 2.0)
    np.testing.assert_array_equal(x, 5.0)


def test_in_place_updates_give_a_chain_not_a_clique():
    def orch(o, x):
        X = o.external(x)
        for _ in range(6):
            o.submit(add_into, pto.input(o.external(np.ones(4, np.float32))), pto.inout(X))

    assert edges(orch, zeros(4)) == [(i, i + 1) for i in range(5)]


def test_disjoint_and_interleaved_slices_are_independent():
    def orch(o, x):
        X = o.external(x)
        o.submit(fill, pto.output(X[:, 0::2]), 1.0)  # 0
        o.submit(fill, pto.output(X[:, 1::2]), 2.0)  # 1: interleaved, no edge
        o.submit(fill, pto.output(X[0:2, :]), 3.0)   # 2: overlaps both
        o.submit(noop, pto.input(X[3, 1::2]))        # 3: reads only what 1 wrote
        o.submit(noop, pto.input(X[3, 1::2].with_overlap(pto.Overlap.BOUNDING_BOX)))  # 4: bbox also meets 0

    x = zeros(4, 8)
    assert edges(orch, x) == [(0, 2), (0, 4), (1, 2), (1, 3), (1, 4)]
    assert x[0, 0] == 3 and x[3, 0] == 1 and x[3, 1] == 2


def test_partial_write_keeps_the_older_writer_visible():
    def orch(o, x):
        X = o.external(x)
        o.submit(fill, pto.output(X), 1.0)       # 0
        o.submit(fill, pto.output(X[2:4]), 2.0)  # 1: partial, WAW with 0
        o.submit(noop, pto.input(X))             # 2: reads both writers

    assert edges(orch, zeros(8)) == [(0, 1), (0, 2), (1, 2)]


def test_aliasing_externals_resolve_to_one_owner():
    def orch(o, base):
        whole = o.external(base)
        tail = o.external(base[4:])
        as_bytes = o.external(base.view(np.uint8))
        o.submit(fill, pto.output(tail), 7.0)                 # 0 writes base[4:]
        o.submit(noop, pto.input(whole[0:4]))                 # 1: no overlap
        o.submit(noop, pto.input(whole[4:5]))                 # 2: RAW on 0
        o.submit(fill, pto.output(as_bytes[16:20]), 0)        # 3: bytes of base[4] -> WAW 0, WAR 2

    base = zeros(8)
    assert edges(orch, base) == [(0, 2), (0, 3), (2, 3)]


def test_versions():
    def orch(o, out):
        t = o.alloc((4,))
        o.submit(fill, pto.output(t), 1.0)               # 0 writes v0
        o.submit(noop, pto.input(t))                     # 1 reads v0
        t1 = o.version_inc(t)
        o.submit(fill, pto.output(t1), 2.0)              # 2 writes v1: waits for 0's write and 1's read
        o.submit(add_into, pto.input(t1), pto.inout(o.external(out)))  # 3 reads v1
        with pytest.raises(pto.StaleVersionError, match="version 0"):
            o.submit(noop, pto.input(t))
        o.free(t1)

    out = zeros(4)
    assert edges(orch, out) == [(0, 1), (0, 2), (1, 2), (2, 3)]
    np.testing.assert_array_equal(out, 2.0)


def test_graph_is_identical_for_every_executor_and_window():
    def orch(o, x):
        X = o.external(x)
        for i in range(40):
            t = o.alloc((4,))
            o.submit(fill, pto.output(t), float(i))
            o.submit(add_into, pto.input(t), pto.inout(X[i % 3: i % 3 + 4]))
            o.free(t)

    graphs = {(ex, w): edges(orch, zeros(8), executor=ex, task_window=w)
              for ex in GRAPH_EXECUTORS for w in (4, 1024)}
    assert len(set(map(tuple, graphs.values()))) == 1


def test_task_ids_count_from_zero_each_run(graph_executor):
    rt = runtime(graph_executor)

    def orch(o):
        return [o.submit(noop) for _ in range(3)]

    for _ in range(2):
        result = rt.run(orch, record=True)
        assert [t.id for t in result.graph.tasks] == [0, 1, 2]
        assert [t.kernel.name for t in result.graph.tasks] == ["noop"] * 3


@pytest.mark.xfail(strict=True, reason="the core's covering test is conservative where two leaves of "
                   "the covering write touch (core/overlap.py row_covers); docs/DESIGN.md says a "
                   "write that fully covers an entry replaces it")
def test_a_write_covering_an_entry_across_a_row_seam_replaces_it():
    def orch(o, x):
        X = o.external(x)
        flat_bytes = o.external(x.reshape(-1).view(np.uint8))
        o.submit(fill, pto.output(flat_bytes[48:64]), 1)  # 0: the bytes of x[0, 6] and x[1, 0]
        o.submit(fill, pto.output(X[:, 0::2]), 2.0)       # 1: every even column, so all of 0's bytes
        o.submit(noop, pto.input(flat_bytes[48:64]))      # 2: only 1 is left to read

    x = np.zeros((4, 7))  # rows of 56 bytes: x[0, 6] ends where x[1, 0] starts
    result = runtime().run(orch, x, record=True)
    assert expected_edges(result.graph.tasks) == {(0, 1), (1, 2)}  # what the independent oracle says
    assert result.graph.edges == [(0, 1), (1, 2)]


@pytest.mark.xfail(strict=True, reason="STRIDED_EXACT judges a view whose elements overlap (a "
                   "non-nested layout) conservatively (core/overlap.py _meets); docs/DESIGN.md says "
                   "STRIDED_EXACT is exact")
def test_a_view_with_overlapping_windows_meets_only_its_own_bytes():
    x = np.zeros(32)
    windows = as_strided(x, shape=(2, 5, 2), strides=(128, 8, 8))  # bytes 0..48 and 128..176

    def orch(o, x, windows):
        o.submit(fill, pto.output(o.external(x)[8:12]), 1.0)  # 0: bytes 64..96, between the two
        o.submit(noop, pto.input(o.external(windows)))        # 1: shares no byte with 0

    result = runtime().run(orch, x, windows, record=True)
    assert expected_edges(result.graph.tasks) == set()  # what the independent oracle says
    assert result.graph.edges == []
