"""The stream executor and graph capture on the CPU backend's streams (host threads).

Everything here runs the code the CUDA backend runs too, except the backend's stream, event
and capture calls; tests/test_cuda.py repeats the essentials on a GPU.
"""

import gc
import threading
import time
import weakref

import numpy as np
import pytest
from conftest import fill, zeros
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.llama import llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul

import pto_gpu as pto

STREAMS = {pto.CUBE: 2, pto.VECTOR: 2}


def stream_runtime(**kwargs) -> pto.Runtime:
    return pto.Runtime(backend="cpu", executor="stream", **{"workers": STREAMS, **kwargs})


@pto.kernel(worker=pto.CUBE)
def slow_fill(out, value):
    time.sleep(0.05)  # long enough that a consumer not held back by an event would run first
    out[...] = value


@pto.kernel(worker=pto.VECTOR)
def copy(a, out):
    out[...] = a


def test_a_consumer_on_another_stream_waits_for_its_producer():
    def orch(o, out):
        X = o.external(out)
        for i in range(4):  # producers on both CUBE streams, consumers on both VECTOR streams
            tile = o.alloc((8,))
            o.submit(slow_fill, pto.output(tile), float(i + 1))
            o.submit(copy, pto.input(tile), pto.output(X[i]))
            o.free(tile)

    out = zeros(4, 8)
    result = stream_runtime().run(orch, out)
    np.testing.assert_array_equal(out, np.arange(1, 5, dtype=np.float32)[:, None].repeat(8, 1))
    assert result.executor == "stream"


@pto.kernel(worker=pto.VECTOR)
def slow_scale(a, out, factor, seconds):
    time.sleep(seconds)
    out[...] = a * factor


@pto.kernel(worker=pto.VECTOR)
def add_rows(a, b, out):
    out[...] = a + b


def chain_then_joins(o, x, y, z, w):
    """Six tasks scaling x in place (a chain; 0.01 s each), then three rounds of two slow producers (rows of
    z, 0.1 s and 0.05 s) and a consumer of both (a row of w)."""
    X, Y, Z, W = (o.external(a) for a in (x, y, z, w))
    for _ in range(6):
        o.submit(slow_scale, pto.input(X), pto.output(X), 2.0, 0.01)
    for i in range(3):
        o.submit(slow_scale, pto.input(Y[2 * i]), pto.output(Z[2 * i]), float(i + 1), 0.1)
        o.submit(slow_scale, pto.input(Y[2 * i + 1]), pto.output(Z[2 * i + 1]), float(i + 11), 0.05)
        o.submit(add_rows, pto.input(Z[2 * i]), pto.input(Z[2 * i + 1]), pto.output(W[i]))


def test_a_chain_stays_on_its_stream_and_a_join_waits_on_the_other():
    """On two VECTOR streams a chain's tasks follow each other on one stream: no event wait
    (taking the streams in turn, each would wait on the one before, still running). Each round's
    producers go to the two streams in turn; their consumer continues the newer one's stream
    and waits on the other's event (its slow producer is still running): one wait a round.
    The results are the serial executor's (a consumer that did not wait would read zeros)."""
    arrays = [np.arange(16, dtype=np.float32).reshape(2, 8), np.arange(48, dtype=np.float32).reshape(6, 8),
              zeros(6, 8), zeros(3, 8)]
    expected = [a.copy() for a in arrays]
    pto.Runtime(backend="cpu", executor="serial").run(chain_then_joins, *expected)
    result = stream_runtime().run(chain_then_joins, *arrays)
    for got, want in zip(arrays, expected):
        np.testing.assert_array_equal(got, want)
    assert result.cross_waits == 3


def test_a_fan_outs_consumers_run_side_by_side_whatever_went_where_in_between():
    """A producer, an unrelated task, then two consumers of the producer that each wait for the
    other to be running: the first continues the producer's stream, the second must go to the
    other (the one given a task least recently), or the two would meet never."""
    barrier = threading.Barrier(2, timeout=2)

    @pto.kernel(worker=pto.VECTOR)
    def meet(a, out):
        barrier.wait()
        out[...] = a + 1

    def orch(o, out):
        X = o.external(out)
        o.submit(slow_scale, pto.input(X[0]), pto.output(X[1]), 2.0, 0.05)
        o.submit(slow_scale, pto.input(X[5]), pto.output(X[4]), 3.0, 0.0)
        o.submit(meet, pto.input(X[1]), pto.output(X[2]))
        o.submit(meet, pto.input(X[1]), pto.output(X[3]))

    out = np.ones((6, 4), np.float32)
    stream_runtime().run(orch, out)
    np.testing.assert_array_equal(out[:4, 0], [1, 2, 3, 3])


def rendezvous_run(vector_streams: int) -> None:
    """Two independent VECTOR tasks that each wait for the other to be running."""
    barrier = threading.Barrier(2, timeout=2)

    @pto.kernel(worker=pto.VECTOR)
    def meet(out):
        barrier.wait()
        out[...] = 1

    def orch(o, out):
        X = o.external(out)
        o.submit(meet, pto.output(X[0]))
        o.submit(meet, pto.output(X[1]))

    out = zeros(2, 4)
    pto.Runtime(backend="cpu", executor="stream", workers={pto.VECTOR: vector_streams}).run(orch, out)
    np.testing.assert_array_equal(out, 1)


def test_independent_tasks_of_a_class_run_side_by_side_on_its_streams():
    rendezvous_run(vector_streams=2)


def test_one_stream_per_class_runs_its_tasks_one_after_another():
    with pytest.raises(pto.TaskError, match="BrokenBarrierError"):
        rendezvous_run(vector_streams=1)


def test_a_tiny_heap_and_window_stall_the_orchestrator_and_the_result_is_unchanged():
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((192, 192)).astype(np.float32) for _ in range(2))
    expected = zeros(192, 192)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, expected, tile=64)
    c = zeros(192, 192)
    # Two 64x64 float32 tiles of heap and a window of 4 tasks.
    result = stream_runtime(heap_bytes=2 * 64 * 64 * 4, task_window=4).run(tiled_matmul, a, b, c, tile=64)
    assert c.tobytes() == expected.tobytes()
    assert result.high_water["task_ring"] == 4 and sum(result.stalls.values()) > 0


def test_stream_threads_end_with_their_runtime():
    rt = stream_runtime()
    before = set(threading.enumerate())
    rt.run(lambda o: o.submit(fill, pto.output(o.external(zeros(4))), 1.0))
    streams = [t for t in set(threading.enumerate()) - before if t.name.startswith("pto-stream")]
    assert len(streams) == sum(rt.workers.values())
    del rt
    gc.collect()
    for thread in streams:
        thread.join(timeout=5)
    assert not [t for t in streams if t.is_alive()]


# --- capture and replay ------------------------------------------------------------------
def matmul_inputs(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((160, 96), (96, 128))]


def serial_matmul(a, b):
    c = zeros(160, 128)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, c, tile=64)
    return c


def test_a_capture_runs_nothing_and_each_replay_equals_a_run_on_the_current_inputs():
    a, b = matmul_inputs(1)
    c = zeros(160, 128)
    rt = stream_runtime()
    replay = rt.capture(tiled_matmul, a, b, c, tile=64)
    assert not c.any()
    assert replay.num_tasks == rt.run(tiled_matmul, a, b, zeros(160, 128), tile=64).num_tasks
    replay.replay()
    assert c.tobytes() == serial_matmul(a, b).tobytes()
    new_a, new_b = matmul_inputs(2)
    a[...], b[...] = new_a, new_b  # in place: the graph reads the same memory
    replay.replay()
    assert c.tobytes() == serial_matmul(new_a, new_b).tobytes()


def test_a_compiled_llama_layer_replays_to_the_serial_result():
    expected = llama_layer_inputs(64, hidden=64, heads=4, ffn=96, seed=5)
    pto.Runtime(backend="cpu", executor="serial").run(llama_layer_compiled, expected)
    inputs = llama_layer_inputs(64, hidden=64, heads=4, ffn=96, seed=5)
    replay = pto.Runtime(backend="cpu", executor="parallel").capture(llama_layer_compiled, inputs)
    replay.replay()
    assert inputs["out"].tobytes() == expected["out"].tobytes()
    # Same tolerance as test_workloads.py's LLaMA tests.
    np.testing.assert_allclose(inputs["out"], reference.llama_layer(inputs),
                               atol=1e-5 * np.abs(expected["out"]).max())


def test_a_capture_that_does_not_fit_the_rings_is_refused_and_the_runtime_goes_on():
    a, b = matmul_inputs(3)
    rt = stream_runtime(task_window=4)
    with pytest.raises(pto.DeadlockError, match=r"task ring \(task_window=4\) filled while capturing.*"
                                                r"raise task_window="):
        rt.capture(tiled_matmul, a, b, zeros(160, 128), tile=64)
    c = zeros(160, 128)
    rt.run(tiled_matmul, a, b, c, tile=64)
    assert c.tobytes() == serial_matmul(a, b).tobytes()


@pto.kernel(worker=pto.VECTOR)
def fail_when_negative(a, out):
    if a.min() < 0:
        raise ValueError("negative input")
    out[...] = a


def test_a_failing_kernel_in_a_replay_raises_task_error_naming_it():
    x, out = np.ones(4, np.float32), zeros(4)

    def orch(o, x, out):
        o.submit(fill, pto.output(o.external(out)), 0.0)
        o.submit(fail_when_negative, pto.input(o.external(x)), pto.output(o.external(out)))

    replay = stream_runtime().capture(orch, x, out)
    replay.replay()
    x[0] = -1
    with pytest.raises(pto.TaskError, match=r"task 1 \(fail_when_negative\) failed: ValueError"):
        replay.replay()


def test_replaying_inside_a_run_of_the_same_runtime_is_refused():
    rt = stream_runtime()
    replay = rt.capture(lambda o: o.submit(fill, pto.output(o.external(zeros(4))), 1.0))
    with pytest.raises(pto.UsageError, match="same heap"):
        rt.run(lambda o: replay.replay())


def test_a_replay_keeps_the_memory_its_tasks_use_alive():
    """Arrays made inside the orchestration are owned by nobody but the graph afterwards: the
    CPU kernels' views are cut from ctypes byte views, which do not hold them, so the graph
    must (it holds its tasks' external memory, and its bound calls hold their tasks too)."""
    made = []

    def orch(o, a):
        out = np.zeros_like(a)  # only the orchestration and the graph ever hold it
        made.append(weakref.ref(out))
        tile = o.alloc(a.shape)
        o.submit(copy, pto.input(o.external(a)), pto.output(tile))
        o.submit(copy, pto.input(tile), pto.output(o.external(out)))

    a = np.arange(32, dtype=np.float32)
    replay = stream_runtime().capture(orch, a.copy())  # the argument too is the graph's alone
    gc.collect()
    out = made[0]()
    assert out is not None, "the captured graph let an array its tasks write be freed"
    assert not out.any()
    replay.replay()
    np.testing.assert_array_equal(out, a)
