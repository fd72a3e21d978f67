"""Buffer lifecycle, back-pressure, deadlock detection, misuse errors and task failures."""

import gc
import threading
import time

import numpy as np
import pytest
from conftest import add_into, explode, fill, noop, running_workers, runtime, zeros

import pto_gpu as pto
from pto_gpu.core.state import CoreState


def test_scope_frees_what_it_allocated_and_heap_is_reused(executor):
    def orch(o, out):
        for i in range(50):  # 50 x 4 KiB through an 8 KiB heap: only works if space comes back
            with o.scope():
                t = o.alloc((1024,))
                o.submit(fill, pto.output(t), 0.0)
                with o.scope():
                    u = o.alloc((1024,))
                    o.submit(fill, pto.output(u), float(i))
                    o.submit(add_into, pto.input(u), pto.inout(t))
                    o.submit(fill, pto.output(t[:1]), float(i))
                o.submit(add_into, pto.input(t), pto.inout(o.external(out)))

    out = zeros(1024)
    result = runtime(executor, heap_bytes=8192).run(orch, out)
    expected = np.full(1024, sum(range(50)), np.float64)
    np.testing.assert_allclose(out, expected)
    assert result.high_water["heap_bytes"] <= 8192


def test_back_pressure_window_of_four(executor):
    def orch(o, out):
        X = o.external(out)
        for _ in range(200):
            o.submit(add_into, pto.input(o.external(np.ones(3, np.float32))), pto.inout(X))

    out = zeros(3)
    result = runtime(executor, task_window=4).run(orch, out)
    assert result.num_tasks == 200 and result.high_water["task_ring"] <= 4
    np.testing.assert_array_equal(out, 200.0)


def test_large_graph_leaves_rings_empty(executor):
    rt = runtime(executor, task_window=64, heap_bytes=1 << 16)

    def orch(o, out):
        X = o.external(out)
        for i in range(1200):
            t = o.alloc((16,))
            o.submit(fill, pto.output(t), 1.0)
            o.submit(add_into, pto.input(t), pto.inout(X[i % 4]))
            o.free(t)

    out = zeros(4, 16)
    result = rt.run(orch, out)
    assert result.num_tasks == 2400
    np.testing.assert_array_equal(out, 300.0)
    h = rt._scheduler.state.head
    assert h["last_alive"] == h["next_task"] == 2400
    assert h["heap_head"] == h["heap_tail"] and h["dep_used"] == 0


def test_heap_too_small_for_live_set_raises_deadlock_quickly(graph_executor):
    def hoard(o):
        kept = [o.alloc((256,)) for _ in range(10)]  # never freed: 10 KiB live in a 4 KiB heap
        for t in kept:
            o.submit(fill, pto.output(t), 0.0)

    for _ in range(2):  # the first may include numba compiling the path; time the second
        started = time.perf_counter()
        with pytest.raises(pto.DeadlockError, match=r"heap ring \(heap_bytes=4096.*not freed.*heap_bytes="):
            runtime(graph_executor, heap_bytes=4096).run(hoard)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("threshold", [0, 1])
def test_failing_kernel_raises_task_error_and_dependents_do_not_run(executor, threshold):
    ran = []

    @pto.kernel(worker=pto.VECTOR)
    def witness(a):
        ran.append(True)

    def orch(o):
        t = o.alloc((4,))
        o.submit(fill, pto.output(t), 1.0)   # 0
        o.submit(explode, pto.inout(t))      # 1 fails
        for _ in range(5):
            o.submit(witness, pto.input(t))  # depend on 1
        o.free(t)

    rt = runtime(executor)
    with pytest.raises(pto.TaskError, match=r"task 1 \(explode\) failed: ValueError: planted") as info:
        rt.run(orch, threshold=threshold)
    assert isinstance(info.value.__cause__, ValueError)
    assert ran == []
    assert not running_workers(rt)
    out = zeros(2)
    rt.run(lambda o: o.submit(fill, pto.output(o.external(out)), 4.0))
    np.testing.assert_array_equal(out, 4.0)


def test_keyboard_interrupt_in_the_orchestration_stops_cleanly():
    def orch(o):
        for _ in range(10):
            o.submit(noop)
        raise KeyboardInterrupt

    rt = runtime("parallel")
    with pytest.raises(KeyboardInterrupt):
        rt.run(orch, threshold=2)
    assert not running_workers(rt)
    assert rt.run(lambda o: o.submit(noop)).num_tasks == 1


def test_rings_that_cannot_deadlock_complete_at_their_smallest(executor):
    """A task's slot and its dep entries are released by completion alone, so a task window of
    one and a dep pool of one only slow a run down; tasks with many producers still run."""
    def orch(o, out):
        X = o.external(out)
        for i in range(8):
            o.submit(fill, pto.output(X[i]), float(i))
        o.submit(add_into, pto.input(X[0:4]), pto.inout(X[4:8]))  # four producers
    out = zeros(8, 4)
    result = runtime(executor, task_window=1, dep_pool=1).run(orch, out)
    assert result.num_tasks == 9 and result.high_water["dep_pool"] <= 1
    np.testing.assert_array_equal(out[4:], np.repeat((4 + 2 * np.arange(4))[:, None], 4, axis=1))


def test_tensormap_pool_too_small_raises_deadlock_quickly(executor):
    def orch(o):
        t = o.alloc((8, 4))
        o.submit(noop, *[pto.input(t[i]) for i in range(4)], pto.output(t[4:]))  # needs 5 entries

    for _ in range(2):  # the first may include numba compiling the path; time the second
        started = time.perf_counter()
        with pytest.raises(pto.DeadlockError, match=r"TensorMap pool \(tensormap_entries=4 entries\).*"
                                                    r"raise tensormap_entries="):
            runtime(executor, tensormap_entries=4).run(orch)
    assert time.perf_counter() - started < 1.0
    # A recording run keeps every region's history instead, growing the pool.
    assert runtime(executor, tensormap_entries=4).run(orch, record=True).num_tasks == 1


def test_a_recording_run_that_grows_the_tensormap_again_and_again_records_the_same_graph(executor):
    """Each growth replaces the core's entry tables, which Python's core calls reach by address
    (core/by_address.py): every submit after one must use the new tables."""
    def orch(o, out):
        X = o.external(out)
        for i in range(64):  # every row read by later tasks: the pool only grows
            o.submit(fill, pto.output(X[i]), float(i))
            o.submit(add_into, pto.input(X[i]), pto.inout(X[(i + 1) % 64]))

    grown, roomy = zeros(64, 4), zeros(64, 4)
    small = runtime(executor, tensormap_entries=4).run(orch, grown, record=True)
    large = runtime(executor).run(orch, roomy, record=True)
    assert small.high_water["tensormap"] > 4 * 8  # grown at least four times
    assert small.graph.edges == large.graph.edges and len(small.graph.edges) > 128
    np.testing.assert_array_equal(grown, roomy)


@pytest.mark.parametrize("entries", [4, None], ids=["grown", "roomy"])
def test_each_run_starts_from_a_tensormap_pool_as_a_new_one(entries):
    """A reset empties the pool without rewriting an entry: each run begins with a new
    runtime's pool (nothing taken, nothing on the free list or the chains), after a run that
    grew it or failed too, and records the same graph; what runs leave in the entries is
    never read (tm_insert takes untaken entries from tm_fresh on)."""
    rt = runtime("serial", **({} if entries is None else {"tensormap_entries": entries}))
    state = rt._scheduler.state
    new_buckets = CoreState.allocate(rt.sizes).buckets
    as_new = []

    def orch(o, out, rows, fail):
        as_new.append(tuple(int(state.head[f]) for f in ("tm_free", "tm_fresh", "tm_used")) == (-1, 0, 0)
                      and np.array_equal(state.buckets, new_buckets))
        X = o.external(out)
        for i in range(rows):
            t = o.alloc((4,))  # heap tiles: their entries go stale and are swept
            o.submit(fill, pto.output(t), float(i))
            o.submit(add_into, pto.input(t), pto.inout(X[i]))
            o.free(t)
            o.submit(add_into, pto.input(X[i]), pto.inout(X[(i + 1) % rows]))
        if fail:
            o.submit(explode, pto.inout(X[0]))

    graphs = []
    for rows, fail in ((40, False), (8, False), (30, True), (8, False), (40, False)):
        if fail:
            with pytest.raises(pto.TaskError, match="planted"):
                rt.run(orch, zeros(rows, 4), rows, fail, record=True)
            continue
        graphs.append(rt.run(orch, zeros(rows, 4), rows, fail, record=True).graph.edges)
        assert state.head["tm_fresh"] > 0  # the run took entries, which the next one must not see
    assert entries is None or len(state.entries) > entries  # grown
    assert as_new == [True] * 5
    assert graphs[0] == graphs[3] and graphs[1] == graphs[2]


def _tables_as_new(state) -> bool:
    """Whether the task ring, buffer table and dep pool are as a new runtime's: free ids and
    sequence numbers -1, every dep entry free, the free list in pool order."""
    dep_list = np.arange(1, len(state.deps) + 1)
    dep_list[-1] = -1
    return (all((state.tasks[f] == (-1 if f == "id" else 0)).all() for f in state.tasks.dtype.names)
            and all((state.buffers[f] == (-1 if f == "seq" else 0)).all() for f in state.buffers.dtype.names)
            and (state.deps["task"] == -1).all() and np.array_equal(state.deps["next"], dep_list))


def test_each_run_starts_from_a_task_ring_buffer_table_and_dep_pool_as_new_ones():
    """A reset rewrites the rows of these a run used (ids, sequence numbers and dep entries are
    taken in order), all of them after a failed run: each run begins with them as new."""
    rt = runtime("parallel", task_window=64)
    state = rt._scheduler.state
    as_new, deps_used = [], []

    def orch(o, out, rows, fail):
        as_new.append(_tables_as_new(state))
        X = o.external(out)
        for i in range(rows):
            t = o.alloc((4,))
            o.submit(fill, pto.output(t), float(i))
            o.submit(add_into, pto.input(t), pto.inout(X[i]))  # waits for fill: a dep entry
            o.free(t)
            o.submit(add_into, pto.input(X[i]), pto.inout(X[(i + 1) % rows]))
        if fail:
            o.submit(explode, pto.inout(X[0]))
        deps_used.append(int(state.head["hw_dep"]))

    for rows, fail in ((40, False), (8, False), (30, True), (8, False), (12, False)):
        out = zeros(rows, 4)
        if fail:
            with pytest.raises(pto.TaskError, match="planted"):
                rt.run(orch, out, rows, fail)
            continue
        rt.run(orch, out, rows, fail)
        expected = np.zeros((rows, 4))
        for i in range(rows):
            expected[i] += i
            expected[(i + 1) % rows] += expected[i]
        np.testing.assert_array_equal(out, expected)
    assert as_new == [True] * 5
    assert min(deps_used) > 0 and state.head["hw_dep"] < len(state.deps)  # a reset of part of the pool


def test_deadlock_names_the_old_buffer_that_pins_reclamation():
    def orch(o):
        o.alloc((16,))  # long-lived, never freed: everything allocated after it waits behind it
        for _ in range(20):
            t = o.alloc((256,))
            o.submit(fill, pto.output(t), 1.0)
            o.free(t)

    with pytest.raises(pto.DeadlockError, match=r"allocation order, so the oldest unfreed buffer "
                                                r"Buffer\(heap #0.*also holds the \d+ freed buffers"):
        runtime("serial", heap_bytes=4096).run(orch)


def test_parallel_runs_share_the_runtimes_threads_which_end_with_it():
    ran_on = set()

    @pto.kernel(worker=pto.VECTOR)
    def note_thread(out):
        ran_on.add(threading.get_ident())
        out += 1

    rt = runtime("parallel")
    before = set(threading.enumerate())
    out = zeros(4)
    for _ in range(3):
        rt.run(lambda o: [o.submit(note_thread, pto.inout(o.external(out))) for _ in range(8)])
    with pytest.raises(pto.TaskError):
        rt.run(lambda o: o.submit(explode, pto.output(o.external(zeros(2)))))
    rt.run(lambda o: o.submit(note_thread, pto.inout(o.external(out))))
    np.testing.assert_array_equal(out, 25)
    threads = [t for t in set(threading.enumerate()) - before if t.name.startswith("pto-")]
    # five runs, one failed: one set of threads, for the classes with tasks (VECTOR's here)
    assert rt.workers[pto.VECTOR] <= len(threads) <= sum(rt.workers.values())
    assert ran_on <= {t.ident for t in threads} and not running_workers(rt)
    del rt
    gc.collect()
    for thread in threads:
        thread.join(timeout=5)
    assert not [t for t in threads if t.is_alive()]


def test_a_run_starts_the_workers_of_the_classes_it_has_tasks_for():
    """Workers of a class start at its first task: a run of VECTOR tasks wakes and joins no
    CUBE worker; a CUBE task that makes VECTOR tasks ready starts both classes' workers."""
    @pto.kernel(worker=pto.VECTOR)
    def double(x):
        x *= 2

    @pto.kernel(worker=pto.CUBE)
    def add_one(x):
        x += 1

    rt = runtime("parallel")
    before = set(threading.enumerate())

    def started() -> set[str]:
        return {t.name.rsplit("-", 1)[0] for t in set(threading.enumerate()) - before}

    out = zeros(4)
    rt.run(lambda o: [o.submit(double, pto.inout(o.external(out)[i:i + 1])) for i in range(4)])
    assert started() == {"pto-VECTOR"}
    out[:] = 1
    rt.run(lambda o: (o.submit(add_one, pto.inout(X := o.external(out))), o.submit(double, pto.inout(X))))
    np.testing.assert_array_equal(out, 4)
    assert started() >= {"pto-VECTOR", "pto-CUBE"} and not running_workers(rt)


def test_a_worker_thread_that_cannot_start_fails_the_run_and_the_runtime_goes_on(monkeypatch):
    rt = runtime("parallel")
    start = rt._threads.start

    def no_vector_threads(name, target, args):
        if name.startswith("pto-VECTOR"):
            raise RuntimeError("can't start new thread")
        return start(name, target, args)

    @pto.kernel(worker=pto.VECTOR)
    def double(x):
        x *= 2

    out = zeros(4)
    monkeypatch.setattr(rt._threads, "start", no_vector_threads)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        rt.run(lambda o: o.submit(double, pto.inout(o.external(out))))
    monkeypatch.undo()
    out[:] = 1
    rt.run(lambda o: o.submit(double, pto.inout(o.external(out))))
    np.testing.assert_array_equal(out, 2)
    assert not running_workers(rt)


def test_a_runtime_refuses_a_run_from_another_thread_while_one_runs():
    """Runs of one runtime share its rings and tables: a second, from another thread, is
    refused with a UsageError, and the first runs on unharmed."""
    rt = runtime("parallel")
    inside, attempted, refusals = threading.Event(), threading.Event(), []

    def first(o, x):
        inside.set()
        assert attempted.wait(10)
        o.submit(fill, pto.output(o.external(x)), 3.0)

    def second():
        assert inside.wait(10)
        try:
            rt.run(lambda o: o.submit(fill, pto.output(o.external(zeros(4))), 1.0))
        except pto.UsageError as error:
            refusals.append(str(error))
        attempted.set()

    other = threading.Thread(target=second)
    other.start()
    x = zeros(4)
    rt.run(first, x)
    other.join(10)
    assert refusals and "already running" in refusals[0] and np.array_equal(x, np.full(4, 3.0))
    rt.run(first, x)  # free again (the events are still set)
