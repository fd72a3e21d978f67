"""Buffer lifecycle, back-pressure, deadlock detection, misuse errors and task failures."""

import threading
import time

import numpy as np
import pytest
from conftest import add_into, explode, fill, noop, runtime, zeros

import pto_gpu as pto


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
    from pto_gpu.core import state as cs
    h = rt._scheduler.state.header
    assert h[cs.H_LAST_ALIVE] == h[cs.H_NEXT_TASK] == 2400
    assert h[cs.H_HEAP_HEAD] == h[cs.H_HEAP_TAIL] and h[cs.H_DEP_USED] == 0


@pytest.mark.parametrize("executor", ["serial", "parallel", "dry"])
def test_heap_too_small_for_live_set_raises_deadlock_quickly(executor):
    def hoard(o):
        kept = [o.alloc((256,)) for _ in range(10)]  # never freed: 10 KiB live in a 4 KiB heap
        for t in kept:
            o.submit(fill, pto.output(t), 0.0)

    started = time.perf_counter()
    with pytest.raises(pto.DeadlockError, match=r"heap ring \(heap_bytes=4096.*not freed.*heap_bytes="):
        runtime(executor, heap_bytes=4096).run(hoard)
    assert time.perf_counter() - started < 1.0


def test_buffer_table_too_small_raises_deadlock():
    with pytest.raises(pto.DeadlockError, match="buffer table.*buffer_window=2"):
        runtime("parallel", buffer_window=2).run(lambda o: [o.alloc((4,)) for _ in range(3)])


def test_alloc_larger_than_heap():
    with pytest.raises(pto.DeadlockError, match="cannot hold a buffer of 8192 bytes"):
        runtime(heap_bytes=4096).run(lambda o: o.alloc((2048,)))


def misuse_cases():
    def use_after_free(o):
        t = o.alloc((4,))
        o.free(t)
        o.submit(noop, pto.input(t))

    def double_free(o):
        t = o.alloc((4,))
        o.free(t)
        o.free(t)

    def free_external(o):
        o.free(o.external(zeros(4)))

    def raw_array(o):
        o.submit(noop, zeros(4))

    def bare_tensor(o):
        o.submit(noop, o.alloc((4,)))

    def out_of_bounds(o):
        o.alloc((4, 4))[0:5]

    def negative_step(o):
        o.alloc((4,))[::-1]

    def unknown_dtype(o):
        o.alloc((4,), np.complex64)

    def not_a_kernel(o):
        o.submit(print, pto.input(o.alloc((4,))))

    def bad_reshape(o):
        o.alloc((4, 4))[:, :2].reshape(8)

    return [
        (use_after_free, pto.UseAfterFreeError, "was freed"),
        (double_free, pto.DoubleFreeError, "already freed"),
        (free_external, pto.LifecycleError, "cannot free external"),
        (raw_array, pto.ParamError, "param 0 is a numpy.ndarray"),
        (bare_tensor, pto.ParamError, "param 0 is a tensor without a direction"),
        (out_of_bounds, pto.LayoutError, "out of bounds for dim 0 of size 4"),
        (negative_step, pto.LayoutError, "only positive steps"),
        (unknown_dtype, pto.PTOError, "unknown dtype"),
        (not_a_kernel, pto.ParamError, "takes a @pto.kernel"),
        (bad_reshape, pto.LayoutError, "without copying"),
    ]


@pytest.mark.parametrize("orch, error, message", misuse_cases(), ids=lambda c: getattr(c, "__name__", ""))
def test_misuse_is_rejected_at_the_call(orch, error, message):
    rt = runtime("parallel")
    with pytest.raises(error, match=message):
        rt.run(orch)
    out = zeros(2)  # the runtime stays usable
    rt.run(lambda o: o.submit(fill, pto.output(o.external(out)), 3.0))
    np.testing.assert_array_equal(out, 3.0)


def test_using_the_orchestrator_after_its_run_or_a_tensor_from_another_run():
    rt = runtime()
    kept = {}
    rt.run(lambda o: kept.update(o=o, t=o.alloc((4,))))
    with pytest.raises(pto.UsageError, match="run has ended"):
        kept["o"].alloc((4,))
    with pytest.raises(pto.UsageError, match="another run"):
        rt.run(lambda o: o.submit(noop, pto.input(kept["t"])))


def test_nested_run_is_refused():
    rt = runtime()
    with pytest.raises(pto.UsageError, match="already running"):
        rt.run(lambda o: rt.run(lambda o2: None))


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
    assert not [t for t in threading.enumerate() if t.name.startswith("pto-")]
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
    assert not [t for t in threading.enumerate() if t.name.startswith("pto-")]
    assert rt.run(lambda o: o.submit(noop)).num_tasks == 1


def test_backend_selection():
    assert pto.Runtime(backend="auto").backend.name in ("cpu", "cuda")
    with pytest.raises(pto.PTOError, match="backend='cuda' needs a GPU|not built yet"):
        pto.Runtime(backend="cuda")
    with pytest.raises(pto.PTOError, match="power of two"):
        pto.Runtime(task_window=6)


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
