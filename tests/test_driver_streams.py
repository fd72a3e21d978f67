"""The stream executor on a CUDA driver (executors/driver_streams.py), on the CUDA emulator:
compiled orchestrations' tasks issue without Python once their instance's launch is learnt,
with the words the Python way passes; a chain stays on its stream and a consumer on another
stream than its producer waits for it; back-pressure; device faults and refused launches on
the native path are the TaskError of their task. (Equality with the serial CPU executor over
every orchestration and random graphs: test_cuda.py, test_fuzz.py.)"""

import ctypes
import threading
import time

import numba
import numpy as np
import pytest
from pto_gpu.kernels.elementwise import add, scale
from pto_gpu.kernels.tiles import copy
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.backends import emulator
from pto_gpu.executors import driver_streams
from pto_gpu.executors.driver_streams import DriverStreamExecutor


@numba.njit(cache=True)
def _rows_doubled(o, x, y, tasks, scale_id):
    """tasks tasks, task i: y[i % rows] = 2 * x[i % rows]."""
    rows = pj.shape(x, 0)
    for i in range(tasks):
        r = i % rows
        pj.submit(o, scale_id, (pj.input(pj.narrow(x, 0, r, r + 1)), pj.output(pj.narrow(y, 0, r, r + 1))),
                  (2.0,))


def rows_doubled(o, x, y, tasks):
    o.compiled(_rows_doubled, o.external(x), o.external(y), tasks, scale.id)


@numba.njit(cache=True)
def _chain(o, x, tasks, scale_id):
    """tasks tasks scaling x in place, task i by i + 1: each depends on the one before."""
    for i in range(tasks):
        pj.submit(o, scale_id, (pj.input(x), pj.output(x)), (i + 1.0,))


def chain(o, x, tasks):
    o.compiled(_chain, o.external(x), tasks, scale.id)


@pytest.fixture
def fresh_emulator():
    """A fresh context after the test: its faults disarmed, a sticky error cleared."""
    yield
    emulator.reset()


def test_a_compiled_orchestrations_tasks_issue_without_python_once_their_launch_is_learnt():
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=64)
    x = rt.backend.to_device(np.arange(8 * 16, dtype=np.float32).reshape(8, 16))
    y = rt.backend.to_device(np.zeros((8, 16), np.float32))
    first = rt.run(rows_doubled, x, y, 1000)  # 1000 tasks through a ring of 64: back-pressure
    np.testing.assert_array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))
    assert first.num_tasks == 1000
    assert first.native_tasks == 999  # the first task of the instance went the Python way
    y[:] = 0
    again = rt.run(rows_doubled, x, y, 1000)
    assert again.native_tasks == 1000  # the backend keeps the launch for its later runs
    np.testing.assert_array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))
    assert again.kernels["scale"].tasks == 1000 and again.kernels["scale"].seconds > 0


@numba.njit(cache=True)
def _rows_in_order(o, x, y, order, scale_id, add_id):
    """A task per entry of `order` (a row, or -1): y[r] = 2 * x[r]; at -1, x[0] += x[0] (a task
    of another instance between those of scale, which the next ones read when they read row 0)."""
    for r in order:
        if r < 0:
            row = pj.narrow(x, 0, 0, 1)
            pj.submit(o, add_id, (pj.input(row), pj.input(row), pj.output(row)), ())
        else:
            source, target = pj.narrow(x, 0, r, r + 1), pj.narrow(y, 0, r, r + 1)
            pj.submit(o, scale_id, (pj.input(source), pj.output(target)), (2.0,))


def rows_in_order(o, x, y, order):
    o.compiled(_rows_in_order, o.external(x), o.external(y), np.asarray(order, np.int64), scale.id, add.id)


def _serial(orchestration, *arrays, **kwargs):
    copies = [a.copy() for a in arrays]
    pto.Runtime(backend="cpu", executor="serial").run(orchestration, *copies, **kwargs)
    return copies


@pytest.mark.parametrize("emulate", ["gpu-code", "cpu-code"])
def test_tasks_of_one_instance_whose_tiles_advance_by_one_stride_go_out_as_one_launch(emulate):
    """Independent logged tasks of one instance whose pointers each advance by the same stride
    are one launch over a batch (their tensors' leading dim), led by the first task not issued
    and joined by later ones of the flush whose producers there are issued, even past tasks
    that do not join; a stride that changes, a task of another instance, or one that depends on
    a task not issued, does not join. Each result equals the serial CPU executor's."""
    rt = pto.Runtime(backend="cuda-emulated", emulate=emulate, executor="stream", task_window=256)
    x0 = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    order = [0, 1, 2, 3, 4, 5, 6, 7,  # a stride of one row: one launch
             9, 11, 13,  # two rows: another
             -1,  # x[0] += x[0]: add's, after the first task read x[0]
             0, 1, 2,  # the first reads the add's output: waits for it, in one launch
             8, 8]  # the first joins [0..7]; the second writes y[8] after it: a launch of its own
    x, y = rt.backend.to_device(x0), rt.backend.to_device(np.zeros_like(x0))
    rt.run(rows_in_order, x, y, [0, -1])  # both instances learnt: the run below is all native
    x[:], y[:] = rt.backend.to_device(x0), 0
    result = rt.run(rows_in_order, x, y, order)
    want_x, want_y = _serial(rows_in_order, x0, np.zeros_like(x0), order=order)
    np.testing.assert_array_equal(rt.backend.to_host(x), want_x)
    np.testing.assert_array_equal(rt.backend.to_host(y), want_y)
    assert result.native_tasks == len(order)
    assert result.native_launches == 5  # [0..8], [9, 11, 13], add, [0, 1, 2], [8]


def rows_in_order_python(o, x, y, order, compiled_tail: bool = False):
    """rows_in_order's graph from Python submits; with `compiled_tail`, then rows 0..3 again from a
    compiled orchestration (which must see the held submits issued before its own tasks)."""
    X, Y = o.external(x), o.external(y)
    for r in order:
        if r < 0:
            o.submit(add, pto.input(X[0:1]), pto.input(X[0:1]), pto.output(X[0:1]))
        else:
            o.submit(scale, pto.input(X[r:r + 1]), pto.output(Y[r:r + 1]), 2.0)
    if compiled_tail:
        o.compiled(_rows_in_order, X, Y, np.arange(4, dtype=np.int64), scale.id, add.id)


@pytest.mark.parametrize("compiled_tail", [False, True], ids=["python", "then_compiled"])
def test_python_submits_of_one_instance_go_out_as_one_launch_too(compiled_tail):
    """The same batches from Python submits, held until a submit that does not join them (or a
    compiled orchestration's flush, or the run's end) sends them: equal to the serial CPU
    executor, in the launches the compiled path makes."""
    rt = pto.Runtime(backend="cuda-emulated", executor="stream", task_window=256)
    x0 = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    order = [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 13, -1, 0, 1, 2, 8, 8]
    x, y = rt.backend.to_device(x0), rt.backend.to_device(np.zeros_like(x0))
    result = rt.run(rows_in_order_python, x, y, order, compiled_tail)
    want_x, want_y = _serial(rows_in_order_python, x0, np.zeros_like(x0), order=order,
                             compiled_tail=compiled_tail)
    np.testing.assert_array_equal(rt.backend.to_host(x), want_x)
    np.testing.assert_array_equal(rt.backend.to_host(y), want_y)
    # the tail: rows 0..3 in one launch (the Python submits learnt the instance); every task
    # issued from the argument tables, the Python submits' too
    assert result.native_launches == 6 + compiled_tail and result.native_tasks == result.num_tasks


def test_held_python_submits_go_out_when_the_ring_is_full_and_when_a_run_fails():
    """A task window of 16 and 100 tasks that all join one batch: back-pressure sends the held
    ones rather than waiting for them forever. An orchestration that raises: the tasks it
    submitted before the raise run, as on every executor (docs/ERRORS.md), held ones too."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=16)
    x = rt.backend.to_device(np.arange(100 * 16, dtype=np.float32).reshape(100, 16))
    y = rt.backend.to_device(np.zeros((100, 16), np.float32))
    result = rt.run(rows_in_order_python, x, y, list(range(100)))
    np.testing.assert_array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))
    assert 1 < result.native_launches < 100

    def fails(o, x, y):
        rows_in_order_python(o, x, y, [0, 1, 2])
        raise ValueError("the orchestration's own error")

    y[:] = 0
    with pytest.raises(ValueError, match="the orchestration's own error"):
        rt.run(fails, x, y)
    np.testing.assert_array_equal(rt.backend.to_host(y)[:3], 2 * rt.backend.to_host(x)[:3])
    assert not rt.backend.to_host(y)[3:].any()


def test_python_submits_past_a_launchs_limit_start_another_batch():
    """300 rows, a task each, that would all join one batch: a launch takes at most BATCH_LIMIT
    (256) of them, the rest go in a second."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=1024)
    x = rt.backend.to_device(np.arange(300 * 16, dtype=np.float32).reshape(300, 16))
    y = rt.backend.to_device(np.zeros((300, 16), np.float32))
    result = rt.run(rows_in_order_python, x, y, list(range(300)))
    np.testing.assert_array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))
    assert result.native_launches == 2 and driver_streams.BATCH_LIMIT == 256


def test_a_full_ring_whose_held_submits_finish_as_they_go_out_is_not_a_deadlock(monkeypatch):
    """Back-pressure sends the held batch; when it has finished by the time it is polled, the
    ring is empty and has room: not a DeadlockError (a race on a GPU, forced here)."""
    release = DriverStreamExecutor._release_held

    def release_and_let_it_finish(self):
        release(self)
        state = self._t.state[0]
        while state["head"] != state["tail"]:
            self._wait_for_oldest()
            self._retire(len(self._t.ring))

    monkeypatch.setattr(DriverStreamExecutor, "_release_held", release_and_let_it_finish)
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=16)
    x = rt.backend.to_device(np.arange(40 * 16, dtype=np.float32).reshape(40, 16))
    y = rt.backend.to_device(np.zeros((40, 16), np.float32))
    rt.run(rows_in_order_python, x, y, list(range(40)))
    np.testing.assert_array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))


def rows_then_sum(o, x, y, z, w):
    """Rows of x doubled into y, a task a row (one batch); rows of y doubled into z, each task
    behind its row's producer (a batch of tasks with a producer each); then w = z + z whole, a
    task whose producers are the eight before it."""
    X, Y, Z, W = (o.external(a) for a in (x, y, z, w))
    for source, target in ((X, Y), (Y, Z)):
        for r in range(len(x)):
            o.submit(scale, pto.input(source[r:r + 1]), pto.output(target[r:r + 1]), 2.0)
    o.submit(add, pto.input(Z), pto.input(Z), pto.output(W))


def test_held_submits_whose_producers_overflow_the_held_edges(monkeypatch):
    """Held Python submits keep their producers as edges. With room for 3, the second batch goes
    out in threes (the fourth's edge does not fit: the held ones go first), and the sum's eight
    producers, more than the room, grow it: equal to the serial CPU executor, every task issued
    from the argument tables."""
    monkeypatch.setattr(driver_streams, "HELD_EDGES", 3)
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream")
    x0 = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    arrays = [x0, *(np.zeros_like(x0) for _ in range(3))]
    device = [rt.backend.to_device(a) for a in arrays]
    result = rt.run(rows_then_sum, *device)
    for got, want in zip(device, _serial(rows_then_sum, *arrays)):
        np.testing.assert_array_equal(rt.backend.to_host(got), want)
    assert result.native_tasks == result.num_tasks == 17
    assert result.native_launches == 5  # x -> y; y -> z in 3, 3 and 2; the sum


def test_runs_that_trace_or_capture_take_the_python_stream_executor(tmp_path):
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream")
    x = rt.backend.to_device(np.ones((4, 16), np.float32))
    made = []
    original = rt._make_executor

    def spy(*args):
        made.append(original(*args))
        return made[-1]

    rt._make_executor = spy
    rt.run(chain, x, 3)
    rt.run(chain, x, 3, trace=tmp_path / "trace.json")
    rt.capture(chain, x, 3).replay()
    assert [type(executor).__name__ for executor in made] == ["DriverStreamExecutor", "StreamExecutor",
                                                               "StreamExecutor"]
    np.testing.assert_array_equal(rt.backend.to_host(x), 6.0 ** 3)


@numba.njit(cache=True)
def _twice(o, kernel_id, a, b, c, arity, value):
    """The kernel over (a, b[, c]) twice: the first launch made the Python way, the second not."""
    for _ in range(2):
        if arity == 2:
            pj.submit(o, kernel_id, (pj.input(a), pj.output(b)))
        elif arity == 3:
            pj.submit(o, kernel_id, (pj.input(a), pj.input(b), pj.output(c)))
        else:
            pj.submit(o, kernel_id, (pj.input(a), pj.output(b)), (value,))


@pytest.mark.parametrize("name, value", [("scale", 2.5), ("scale", 3), ("add", None), ("copy", None)])
def test_a_native_launch_passes_the_words_of_the_python_way(name, value, monkeypatch):
    """Tensors over strided views of one array; a scalar given as a float, and as an int to a
    kernel that takes a double (the word is the double's bits). Checked against numpy's view of
    each array, as test_cuda.py checks the Python way."""
    kernel = {"scale": scale, "add": add, "copy": copy}[name]
    rt = pto.Runtime(backend="cuda-emulated", executor="stream", workers={pto.VECTOR: 1})
    received = []
    words = 7 * (3 if name == "add" else 2) + (value is not None)

    def record(grid, block, shared, params, context):
        pointer = ctypes.POINTER(ctypes.c_int64)
        received.append([ctypes.cast(params[i], pointer)[0] for i in range(words)])
        return 0

    entry = emulator.ENTRY(record)
    monkeypatch.setattr(rt.backend.device, "function",
                        lambda code, kernel, layout, scalars: emulator.function(entry, [8] * words))
    whole = np.zeros((6, 20), np.float32)
    x, y, z = whole[1:4, 2:7], whole[::2, 10:15], whole[3:6, 15:20]

    def orchestration(o):
        tensors = [o.external(a) for a in (x, y, z)]
        o.compiled(_twice, kernel.id, *tensors, 3 if name == "add" else 2 if value is None else 1,
                   0.0 if value is None else value)

    result = rt.run(orchestration)
    assert result.native_tasks == 1
    expected = []
    for view in (x, y, z)[:3 if name == "add" else 2]:
        expected += [view.ctypes.data, 1, *view.shape, 0, *(s // view.itemsize for s in view.strides)]
    if value is not None:
        expected.append(int(np.array(float(value)).view(np.int64)))
    assert received == [expected, expected]


def joins(o, y, z, w):
    """Rounds of two producers (rows of z; factors that differ, so no batch) and a consumer of
    both (a row of w)."""
    Y, Z, W = (o.external(a) for a in (y, z, w))
    for i in range(len(w)):
        first, second = slice(2 * i, 2 * i + 1), slice(2 * i + 1, 2 * i + 2)
        o.submit(scale, pto.input(Y[first]), pto.output(Z[first]), float(i + 1))
        o.submit(scale, pto.input(Y[second]), pto.output(Z[second]), float(i + 11))
        o.submit(add, pto.input(Z[first]), pto.input(Z[second]), pto.output(W[i:i + 1]))


def slow_kernels(monkeypatch, rt: pto.Runtime) -> list:
    """Make the runtime's `scale` and `add` launches sleep (a scale by less than 10: 30 ms, by
    more: 10 ms; an add 5 ms: long beside the microseconds between a run's submits, even on a
    loaded machine) and note (scale's factor or add's output pointer, start, end)
    in the list returned."""
    runs = []
    lock = threading.Lock()

    def word(params, i):
        return ctypes.cast(params[i], ctypes.POINTER(ctypes.c_int64))[0]

    def record(what, seconds):
        started = time.perf_counter()
        time.sleep(seconds)
        with lock:
            runs.append((what, started, time.perf_counter()))
        return 0

    def scaled(grid, block, shared, params, context):  # the factor's word is the 15th
        factor = np.array([word(params, 14)]).view(np.float64)[0]
        return record(factor, 0.03 if factor < 10 else 0.01)

    def added(grid, block, shared, params, context):  # the output's pointer is the 15th word
        return record(word(params, 14), 0.005)

    entries = {"scale": emulator.ENTRY(scaled), "add": emulator.ENTRY(added)}
    monkeypatch.setattr(rt.backend.device, "function", lambda code, kernel, layout, scalars:
                        emulator.function(entries[kernel.name], [8] * (15 if kernel.name == "scale" else 21)))
    return runs


def test_a_chain_stays_on_its_stream_and_a_join_waits_on_the_other(monkeypatch):
    """Two VECTOR streams and kernels that sleep, so a consumer that did not wait for a
    producer would start before it ends. A chain stays on one stream: no event wait. Each
    round's producers go to the two streams and the consumer continues the newer one's
    stream: it starts after both ended, through one event wait a round."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", workers={pto.VECTOR: 2})
    runs = slow_kernels(monkeypatch, rt)
    x = rt.backend.to_device(np.ones((2, 4), np.float32))
    assert rt.run(chain, x, 12).cross_waits == 0
    y, z, w = (rt.backend.to_device(np.zeros(shape, np.float32)) for shape in ((6, 4), (6, 4), (3, 4)))
    rt.run(joins, y, z, w)  # the instances learnt: no first-use work between a round's tasks
    runs.clear()
    result = rt.run(joins, y, z, w)
    assert result.cross_waits == 3
    ran = {what: (started, ended) for what, started, ended in runs}
    for i in range(3):
        consumer_start = ran[w[i:i + 1].ctypes.data][0]
        assert consumer_start >= max(ran[float(i + 1)][1], ran[float(i + 11)][1])


def fan_out(o, y):
    """p: y[1] = y[0]; x, unrelated: y[4] = 11 y[5]; a and b, both of p's output: y[2], y[3]."""
    Y = o.external(y)
    for source, target, factor in ((0, 1, 1.0), (5, 4, 11.0), (1, 2, 2.0), (1, 3, 3.0)):
        o.submit(scale, pto.input(Y[source:source + 1]), pto.output(Y[target:target + 1]), factor)


def two_stages(o, x, y, z):
    """Rows of x scaled into y, then rows of y into z: two batches, each row of the second
    behind its row of the first."""
    X, Y, Z = (o.external(a) for a in (x, y, z))
    for source, target, factor in ((X, Y, 1.0), (Y, Z, 2.0)):
        for r in range(len(x)):
            o.submit(scale, pto.input(source[r:r + 1]), pto.output(target[r:r + 1]), factor)


def test_a_fan_outs_consumers_spread_and_a_batch_continues_the_batch_it_reads(monkeypatch):
    """A producer p, an unrelated task x, then two consumers of p: the first continues p's
    stream, the second goes to the stream given a task least recently (x's), so the two run
    side by side (taking the streams in turn, it went to p's stream too, behind the first).
    A batch whose tasks read a batch still running continues its stream: no event wait, for
    the leader or any follower."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", workers={pto.VECTOR: 2})
    runs = slow_kernels(monkeypatch, rt)
    y = rt.backend.to_device(np.zeros((6, 4), np.float32))
    rt.run(fan_out, y)  # the instance learnt
    runs.clear()
    rt.run(fan_out, y)
    ran = {what: (started, ended) for what, started, ended in runs}
    (a_start, a_end), (b_start, b_end) = ran[2.0], ran[3.0]
    assert max(a_start, b_start) < min(a_end, b_end)  # side by side
    x, y, z = (rt.backend.to_device(np.zeros((8, 4), np.float32)) for _ in range(3))
    result = rt.run(two_stages, x, y, z)
    assert result.native_launches == 2 and result.cross_waits == 0


@pytest.mark.parametrize("emulate", ["gpu-code", "cpu-code"])
def test_a_flushs_chains_go_out_together(emulate):
    """The tiled matmul's compiled graph is a chain per tile of C (zero its accumulator, the
    products into it, the copy into C), logged one chain after another. A launch is led by the
    first task not issued and takes the later ones of its flush whose producers there are
    issued, so the chains of a row of tiles go out as one launch a step (their k-th products one
    cuBLAS call, A's tile a step of 0): far fewer launches than tasks, where Python submits of
    the same graph, issued in order, are a launch each. C equals the product."""
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    expected = a.astype(np.float64) @ b
    rt = pto.Runtime(backend="cuda-emulated", emulate=emulate, executor="stream")
    launches = {}
    for orchestration in (tiled_matmul_compiled, tiled_matmul):
        c = rt.backend.to_device(np.zeros((256, 256), np.float32))
        rt.run(orchestration, a, b, c, tile=32)  # the instances learnt
        c[:] = 0
        result = rt.run(orchestration, a, b, c, tile=32)
        np.testing.assert_allclose(rt.backend.to_host(c), expected, atol=1e-4 * np.abs(expected).max())
        assert result.native_tasks == result.num_tasks == 8 * 8 * (8 + 2)
        launches[orchestration] = result.native_launches
    assert launches[tiled_matmul_compiled] < 640 / 4 and launches[tiled_matmul] == 640


@numba.njit(cache=True)
def _pulled_ahead(o, x, y, scale_id, add_id):
    """t0: y[0] = 2 x[0]; t1: y[2] = y[0] + y[0]; t2: y[1] = 2 x[1], which joins t0's launch;
    t3: y[3] = 20 y[2]; t4: y[4] = y[1] + y[2], of t1 and t2."""
    def row(a, r):
        return pj.narrow(a, 0, r, r + 1)

    pj.submit(o, scale_id, (pj.input(row(x, 0)), pj.output(row(y, 0))), (2.0,))
    pj.submit(o, add_id, (pj.input(row(y, 0)), pj.input(row(y, 0)), pj.output(row(y, 2))), ())
    pj.submit(o, scale_id, (pj.input(row(x, 1)), pj.output(row(y, 1))), (2.0,))
    pj.submit(o, scale_id, (pj.input(row(y, 2)), pj.output(row(y, 3))), (20.0,))
    pj.submit(o, add_id, (pj.input(row(y, 1)), pj.input(row(y, 2)), pj.output(row(y, 4))), ())


def pulled_ahead(o, x, y):
    o.compiled(_pulled_ahead, o.external(x), o.external(y), scale.id, add.id)


def test_a_task_issued_ahead_of_its_turn_is_covered_by_the_wait_on_the_one_issued_last(monkeypatch):
    """t2 joins t0's launch, ahead of t1, on one stream; t1 and t3 continue it there, so t4 (of
    t1 and t2) goes to the other stream and waits on one event there: t1's, issued after t2's
    launch, which stream order then covers (not t2's, the newer task: t4 would start before t1
    ended). Kernels that sleep (scale by 2: 30 ms; by 20: 10; add: 5) show the order."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", workers={pto.VECTOR: 2})
    runs = slow_kernels(monkeypatch, rt)
    x = rt.backend.to_device(np.arange(8 * 4, dtype=np.float32).reshape(8, 4))
    y = rt.backend.to_device(np.zeros((8, 4), np.float32))
    rt.run(pulled_ahead, x, y)  # the instances learnt
    runs.clear()
    result = rt.run(pulled_ahead, x, y)
    assert result.native_launches == 4 and result.cross_waits == 1
    ran = {what: (started, ended) for what, started, ended in runs}
    t1, t4 = ran[y[2:3].ctypes.data], ran[y[4:5].ctypes.data]
    assert t4[0] >= max(t1[1], ran[2.0][1])


@pytest.mark.parametrize("fault", ["kernel", "launch"])
def test_a_fault_on_the_native_path_is_the_task_error_of_its_task(fresh_emulator, fault):
    rt = pto.Runtime(backend="cuda-emulated", executor="stream", workers={pto.VECTOR: 2})
    x = rt.backend.to_device(np.ones((4, 8), np.float32))
    rt.run(chain, x, 1)  # the launch learnt: the faults below count only native launches
    if fault == "kernel":
        emulator.fault_kernel(3)
        match = r"\(scale\) failed: CudaError: .*CUDA_ERROR_ILLEGAL_ADDRESS"
    else:
        emulator.fail_launch(2)
        match = r"task 1 \(scale\) failed: CudaError: cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RES"
    with pytest.raises(pto.TaskError, match=match):
        rt.run(chain, x, 5)
    emulator.reset()
    y = rt.backend.to_device(np.ones((4, 8), np.float32))
    result = rt.run(chain, y, 3)
    assert result.native_tasks == 3
    np.testing.assert_array_equal(rt.backend.to_host(y), 6)
