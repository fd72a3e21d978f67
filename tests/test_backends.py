"""The backend contract (backends/__init__.py) and what the stream executor asks of it: both
backends offer every member of the Protocols, events are pooled without ever being recorded
again while a queued wait refers to them, and CUDA event statuses become errors (on the CUDA
emulator's driver here; through the runtime in tests/test_cuda.py)."""

import threading
import time
import types

import numpy as np
import pytest
from pto_gpu.kernels.elementwise import scale
from test_cuda import ON_GPU

import pto_gpu as pto
from pto_gpu import polling
from pto_gpu.backends import Backend, StreamBackend, emulator, memory_of
from pto_gpu.backends.cpu import CpuBackend
from pto_gpu.backends.cuda import CudaBackend
from pto_gpu.backends.driver import CudaError
from pto_gpu.tensor import Buffer, BufferKind, TensorDescriptor


def protocol_members(protocol) -> set[str]:
    names = set()
    for klass in protocol.__mro__:
        if klass not in (object,) and klass.__name__ != "Protocol" and klass.__name__ != "Generic":
            names |= {n for n in vars(klass) if not n.startswith("_")}
            names |= set(getattr(klass, "__annotations__", {}))
    return names


@pytest.mark.parametrize("backend", [CpuBackend, CudaBackend], ids=lambda b: b.__name__)
def test_each_backend_offers_every_member_of_the_stream_backend_protocol(backend):
    members = protocol_members(StreamBackend)
    assert protocol_members(Backend) < members and {"release", "view", "resolve"} <= members
    instance_attributes = {"heap_base", "heap_bytes", "name"}  # set in __init__ (CUDA's name: its device's)
    assert not {m for m in members - instance_attributes if not hasattr(backend, m)}


def test_memory_of_gives_each_external_allocation_of_the_tasks_once():
    def tensor(kind, memory):
        return TensorDescriptor(Buffer(-1, kind, 4096, 64, memory), 4096, 0, (1,), (16,), pto.FLOAT32)

    a, b = object(), object()
    first = types.SimpleNamespace(params=[pto.input(tensor(BufferKind.EXTERNAL, a)), pto.scalar(2.0),
                                          pto.output(tensor(BufferKind.HEAP, None))])
    second = types.SimpleNamespace(params=[pto.input(tensor(BufferKind.EXTERNAL, b)),
                                           pto.output(tensor(BufferKind.EXTERNAL, a))])
    assert memory_of([first, second]) == (a, b)


@pytest.fixture
def driver():
    """The emulator's driver, reset after the test (its faults disarmed, a sticky error cleared)."""
    yield emulator.driver()
    emulator.reset()


def test_an_event_reads_as_reached_or_not_yet_and_a_fault_raises_instead(driver):
    stream, event = driver.new_stream(), driver.new_event()
    emulator.lose_event(1)  # its record is never reached
    driver.call("cuEventRecord", event, stream)
    assert driver.reached(event) is False
    emulator.reset()  # a stalled record counts as reached
    assert driver.reached(event) is True
    nothing = emulator.function(NOTHING, [])
    emulator.fault_kernel(1)
    driver.call("cuLaunchKernel", nothing, 1, 1, 1, 1, 1, 1, 0, stream, None, None)
    assert driver.event_record(event, stream) in (0, 700)  # 700 once the fault happened: sticky
    with pytest.raises(CudaError, match=r"cuEventQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS \(700\)") as raised:
        driver.wait_until_reached(event, 30)  # the sticky error, once the kernel "ran"
    assert raised.value.status == 700


def test_a_wait_for_an_event_never_reached_gives_up_with_a_deadlock_error(driver):
    stream, event = driver.new_stream(), driver.new_event()
    emulator.lose_event(1)
    driver.call("cuEventRecord", event, stream)
    started = time.perf_counter()
    with pytest.raises(pto.DeadlockError, match="a CUDA event was not reached within 0.2 s"):
        driver.wait_until_reached(event, 0.2)
    assert 0.2 <= time.perf_counter() - started < 5


def test_a_wait_for_an_event_sleeps_at_most_an_eighth_of_what_it_has_waited(driver, monkeypatch):
    """So a wait of a few ms (a run's end on a GPU) sees the event within an eighth of its
    length: the pauses (polling.pause) asked for, against the time waited when each was asked."""
    stream, event = driver.new_stream(), driver.new_event()
    emulator.lose_event(1)
    driver.call("cuEventRecord", event, stream)
    asked = []
    real_sleep = time.sleep
    started = time.perf_counter()

    def sleep(seconds):
        if threading.current_thread() is waiter:
            asked.append((seconds, time.perf_counter() - started))
        real_sleep(seconds)

    waiter = threading.current_thread()

    monkeypatch.setattr(polling.time, "sleep", sleep)
    with pytest.raises(pto.DeadlockError):
        driver.wait_until_reached(event, 0.05)
    assert asked and all(seconds <= waited / 8 for seconds, waited in asked), asked[:8]


NOTHING = emulator.ENTRY(lambda *_: 0)


def counted_events(rt: pto.Runtime) -> list:
    """Every event the backend's enqueue returns, kept (so ids stay distinct)."""
    seen = []
    enqueue = rt.backend.enqueue

    def counting(task, stream, after, timed=False):
        event = enqueue(task, stream, after, timed)
        seen.append(event)
        return event

    rt.backend.enqueue = counting
    return seen


def scale_chain(o, x, n):
    """n dependent tasks, alternating between the VECTOR streams: each waits on the one before."""
    X = o.external(x)
    for _ in range(n):
        o.submit(scale, pto.input(X), pto.output(X), 1.5)


@pytest.mark.parametrize("backend", ["cpu", "cuda-emulated", pytest.param("cuda", marks=ON_GPU)])
def test_a_long_chain_records_a_bounded_number_of_distinct_events_and_matches_serial(backend):
    expected = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    x = expected.copy()
    pto.Runtime(backend="cpu", executor="serial").run(scale_chain, expected, 200)
    window = 8
    rt = pto.Runtime(backend=backend, executor="stream", task_window=window, workers={pto.VECTOR: 2})
    if backend == "cpu":
        events = counted_events(rt)
    else:  # the driver stream executor takes its events from the backend and records them itself
        events = []
        take = rt.backend.take_event
        rt.backend.take_event = lambda: events.append(take()) or events[-1]
    data = rt.backend.to_device(x)
    rt.run(scale_chain, data, 200)
    assert len(events) == 200 if backend == "cpu" else 0 < len(events) < 200
    # At most the tasks in flight (the task window) plus the retired producers they wait on.
    assert len({e if isinstance(e, int) else id(e) for e in events}) <= 2 * window  # CUDA's are handles
    assert rt.backend.to_host(data).tobytes() == expected.tobytes()


@pto.kernel(worker=pto.CUBE)
def slow_write(out):
    time.sleep(0.1)
    out[...] = 1


@pto.kernel(worker=pto.VECTOR)
def sleep_then_write(out):
    time.sleep(0.5)
    out[...] = 2


@pto.kernel(worker=pto.VECTOR)
def copy_into(a, out):
    out[...] = a


def test_an_event_with_a_wait_still_queued_is_not_recorded_again():
    """P (CUBE) retires while its consumer C's wait is still queued behind a slow task on the
    one VECTOR stream. Were P's event recorded again behind C on that stream, the wait would
    wait for a record queued after itself: a hang."""

    def orch(o, out):
        X = o.external(out)
        o.submit(slow_write, pto.output(X[0]))  # P
        o.submit(sleep_then_write, pto.output(X[1]))  # S, ahead of C on the VECTOR stream
        o.submit(copy_into, pto.input(X[0]), pto.output(X[2]))  # C waits for P's event
        time.sleep(0.25)  # P has run; S has not
        o.submit(copy_into, pto.input(X[1]), pto.output(X[3]))  # P retires after this submit
        o.submit(copy_into, pto.input(X[2]), pto.output(X[4]))  # a record that could take P's event

    out = np.zeros((5, 4), np.float32)
    rt = pto.Runtime(backend="cpu", executor="stream", workers={pto.CUBE: 1, pto.VECTOR: 1})
    runner = threading.Thread(target=rt.run, args=(orch, out), daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the run hung: an event was recorded again while a wait referred to it"
    np.testing.assert_array_equal(out, [[1] * 4, [2] * 4, [1] * 4, [2] * 4, [1] * 4])


def test_a_kernel_gets_its_own_view_of_a_tile_that_recurs_and_inputs_stay_read_only(executor):
    """The CPU backend cuts a descriptor's views once and hands each call a new array over them:
    a kernel that reshapes its view changes nothing the tile's next task sees."""
    seen = []

    @pto.kernel(worker=pto.VECTOR)
    def flatten_and_add(out):
        seen.append((out.shape, out.flags.writeable))
        out.shape = (out.size,)
        out += 1

    @pto.kernel(worker=pto.VECTOR)
    def note(a):
        seen.append((a.shape, a.flags.writeable, float(a.sum())))

    x = np.zeros((4, 4), np.float32)

    def orch(o):
        tile = o.external(x)
        for _ in range(2):
            o.submit(flatten_and_add, pto.inout(tile))
            o.submit(note, pto.input(tile))

    pto.Runtime(backend="cpu", executor=executor).run(orch)
    assert seen == [((4, 4), True), ((4, 4), False, 16.0), ((4, 4), True), ((4, 4), False, 32.0)]
