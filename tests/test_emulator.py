"""The CUDA driver emulator's semantics (pto_gpu/backends/cuda_emulator.c), through ctypes: stream
order and asynchrony, events and their generations, copied kernel params, memory commands, the
injected faults, stream capture and graphs, thread safety and the build. Kernels are Python
callbacks run on the streams' threads; every wait is bounded, so a broken emulator fails a test
instead of hanging it."""

import ctypes
import threading
import time

import numpy as np
import pytest

from pto_gpu.backends import driver, emulator
from pto_gpu.backends.emulated_device import EmulatedDevice
from pto_gpu.errors import PTOError

SUCCESS, INVALID_VALUE, NOT_INITIALIZED, INVALID_HANDLE = 0, 1, 3, 400
NOT_READY, ILLEGAL_ADDRESS, LAUNCH_OUT_OF_RESOURCES = 600, 700, 701
ILLEGAL_STATE, CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED = 401, 900, 901
CAPTURE_UNMATCHED, CAPTURE_UNJOINED, CAPTURE_ISOLATION, CAPTURED_EVENT = 903, 904, 905, 907
NOT_CAPTURING, CAPTURING, INVALIDATED = 0, 1, 2  # CU_STREAM_CAPTURE_STATUS_*
RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
BOUND = 5.0  # seconds: what a wait that must succeed may take
GLIMPSE = 0.05  # seconds: how long a wait that must time out is given


class Emulator:
    """The driver, and streams, events and kernels made for one test, destroyed after it."""

    def __init__(self):
        self.cu = emulator.driver()
        assert self.cu.init(0) == SUCCESS
        self.log: list = []  # what the kernels did, in the order they did it
        self.gate = threading.Event()  # `blocked` kernels wait for it
        self.started = threading.Event()  # set by a `blocked` kernel as it begins
        self._entries: list = []  # ctypes keeps no reference to a callback: held here
        self._streams: list[int] = []
        self._events: list[int] = []
        self._graphs: list[int] = []
        self._execs: list[int] = []
        self.tag = self.kernel(self._tag, [8])
        self.blocked = self.kernel(self._blocked, [])

    def kernel(self, body, sizes: list[int], context: int = 0) -> int:
        entry = emulator.ENTRY(body)
        self._entries.append(entry)
        return emulator.function(entry, sizes, context)

    def _tag(self, grid, block, shared, params, context) -> int:
        self.log.append(ctypes.c_longlong.from_address(params[0]).value)
        return 0

    def _blocked(self, grid, block, shared, params, context) -> int:
        self.started.set()
        released = self.gate.wait(BOUND)  # bounded: a failing test's kernel ends anyway
        self.log.append("gate" if released else "gate timed out")
        return 0

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        assert self.cu.stream_create(ctypes.byref(handle), 1) == SUCCESS
        self._streams.append(handle.value)
        return handle.value

    def event(self, timed: bool = False) -> int:
        handle = ctypes.c_void_p()
        assert self.cu.event_create(ctypes.byref(handle), 0 if timed else 2) == SUCCESS  # 2: DISABLE_TIMING
        self._events.append(handle.value)
        return handle.value

    def launch(self, function: int | None, stream: int | None, *values: ctypes._SimpleCData, grid=(1, 1, 1),
               block=(1, 1, 1), shared: int = 0) -> int:
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        return self.cu.launch_kernel(function, *grid, *block, shared, stream, params, None)

    def tagged(self, stream: int | None, tag: int) -> None:
        assert self.launch(self.tag, stream, ctypes.c_longlong(tag)) == SUCCESS

    def recorded(self, stream: int | None) -> int:
        event = self.event()
        assert self.cu.event_record(event, stream) == SUCCESS
        return event

    def capturing(self, stream: int | None) -> int:
        status = ctypes.c_int(-1)
        assert self.cu.stream_is_capturing(stream, ctypes.byref(status)) == SUCCESS
        return status.value

    def fork(self, origin: int, *workers: int) -> None:
        """As CudaBackend.begin_capture: the workers join the origin's capture."""
        fork = self.recorded(origin)
        for worker in workers:
            assert self.cu.stream_wait_event(worker, fork, 0) == SUCCESS

    def join(self, origin: int, *workers: int) -> None:
        """As CudaBackend.end_capture: the origin waits for each worker."""
        for worker in workers:
            assert self.cu.stream_wait_event(origin, self.recorded(worker), 0) == SUCCESS

    def end_capture(self, origin: int) -> tuple[int, int | None]:
        graph = ctypes.c_void_p(1)  # a failed end must set it to NULL
        result = self.cu.stream_end_capture(origin, ctypes.byref(graph))
        if graph.value is not None:
            self._graphs.append(graph.value)
        return result, graph.value

    def graph(self, origin: int) -> int:
        result, graph = self.end_capture(origin)
        assert result == SUCCESS and graph is not None
        return graph

    def instantiate(self, graph: int) -> int:
        executable = ctypes.c_void_p()
        assert self.cu.graph_instantiate_with_flags(ctypes.byref(executable), graph, 0) == SUCCESS
        self._execs.append(executable.value)
        return executable.value

    def replayed(self, executable: int, stream: int) -> int:
        """cuGraphLaunch, then an event recorded behind it, as CudaGraph.replay does (the event is
        made first: a graph that faults fails every later call)."""
        event = self.event()
        assert self.cu.graph_launch(executable, stream) == SUCCESS
        assert self.cu.event_record(event, stream) == SUCCESS
        return event

    def close(self) -> None:
        """Drops the test's queued work and waits for its running kernels: none runs into the
        next test."""
        self.gate.set()
        emulator.reset()
        for stream in [None, *self._streams]:
            assert bounded(self.cu.stream_synchronize, stream) == SUCCESS
        for stream in self._streams:
            self.cu.stream_destroy(stream)
        for event in self._events:
            self.cu.event_destroy(event)
        for executable in self._execs:  # those a test destroyed answer INVALID_HANDLE
            self.cu.graph_exec_destroy(executable)
        for graph in self._graphs:
            self.cu.graph_destroy(graph)


def wait(event: int, seconds: float = BOUND) -> int:
    """cuEventSynchronize, bounded: CUDA_ERROR_NOT_READY once `seconds` pass."""
    return emulator.library().pto_emu_event_wait(event, int(seconds * 1e9))


class Blocking:
    """A blocking driver call, made on a thread of its own so that the test can bound it."""

    def __init__(self, call, *args):
        self._results: list[int] = []
        self._thread = threading.Thread(target=lambda: self._results.append(call(*args)), daemon=True)
        self._thread.start()

    def blocks(self) -> bool:
        """Whether it has not returned after GLIMPSE."""
        self._thread.join(GLIMPSE)
        return not self._results

    def result(self) -> int:
        self._thread.join(BOUND)
        assert self._results, f"still blocking after {BOUND} s"
        return self._results[0]


def bounded(call, *args) -> int:
    """A blocking driver call's result, failing the test if it does not return in BOUND."""
    return Blocking(call, *args).result()


@pytest.fixture
def emu():
    emu = Emulator()
    yield emu
    emu.close()


def test_error_names_and_check(emu):
    assert emu.cu.error_name(SUCCESS) == "CUDA_SUCCESS"
    assert emu.cu.error_name(NOT_READY) == "CUDA_ERROR_NOT_READY"
    assert emu.cu.error_name(ILLEGAL_ADDRESS) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert emu.cu.error_name(LAUNCH_OUT_OF_RESOURCES) == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    assert emu.cu.error_name(INVALID_HANDLE) == "CUDA_ERROR_INVALID_HANDLE"
    assert emu.cu.error_name(CAPTURE_UNJOINED) == "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"
    assert emu.cu.error_name(CAPTURED_EVENT) == "CUDA_ERROR_CAPTURED_EVENT"
    name = ctypes.c_char_p()
    assert emu.cu.get_error_name(12345, ctypes.byref(name)) == INVALID_VALUE and name.value is None
    emulator.check(SUCCESS, "cuInit")
    with pytest.raises(PTOError, match=r"cuEventQuery failed: CUDA_ERROR_NOT_READY \(600\)"):
        emulator.check(NOT_READY, "cuEventQuery")


def test_bound_functions_and_addresses(emu):
    assert driver.DRIVER_FUNCTIONS == tuple(driver.SIGNATURES)
    for attribute in ("init", "stream_destroy", "stream_wait_event", "event_record", "launch_kernel",
                      "memset_d8_async", "memcpy_async", "get_error_name", "stream_begin_capture",
                      "stream_end_capture", "stream_is_capturing", "graph_instantiate_with_flags",
                      "graph_launch", "graph_exec_destroy", "graph_destroy"):
        assert callable(getattr(emu.cu, attribute))
    address = ctypes.cast(emulator.library().cuLaunchKernel, ctypes.c_void_p).value
    assert emu.cu.address("cuLaunchKernel") == address


def test_a_stream_runs_its_work_in_order(emu):
    stream = emu.stream()
    before = emulator.launches()
    for tag in range(50):
        emu.tagged(stream, tag)
    assert wait(emu.recorded(stream)) == SUCCESS
    assert emu.log == list(range(50))
    assert emulator.launches() - before == 50
    assert emu.cu.stream_query(stream) == SUCCESS
    assert bounded(emu.cu.stream_synchronize, stream) == SUCCESS


def test_launch_returns_before_the_kernel_runs(emu):
    stream = emu.stream()
    assert emu.launch(emu.blocked, stream) == SUCCESS
    assert emu.started.wait(BOUND)
    assert emu.cu.stream_query(stream) == NOT_READY  # its only command is running
    emu.tagged(stream, 1)
    event = emu.recorded(stream)
    assert emu.cu.event_query(event) == NOT_READY
    assert wait(event, GLIMPSE) == NOT_READY
    synchronizing_event = Blocking(emu.cu.event_synchronize, event)
    synchronizing_stream = Blocking(emu.cu.stream_synchronize, stream)
    assert synchronizing_event.blocks() and synchronizing_stream.blocks()
    assert emu.log == []
    emu.gate.set()
    assert synchronizing_event.result() == SUCCESS
    assert emu.log == ["gate", 1]
    assert emu.cu.event_query(event) == SUCCESS
    assert synchronizing_stream.result() == SUCCESS
    assert emu.cu.stream_query(stream) == SUCCESS


def test_kernel_params_are_copied_at_launch(emu):
    seen = []

    def body(grid, block, shared, params, context):
        seen.append((grid[:3], block[:3], shared, ctypes.c_int.from_address(params[0]).value,
                     ctypes.c_double.from_address(params[1]).value, context))
        return 0

    probe = emu.kernel(body, [4, 8], context=0x1234)
    stream = emu.stream()
    assert emu.launch(emu.blocked, stream) == SUCCESS  # holds the probe until the buffers changed
    number, real = ctypes.c_int(7), ctypes.c_double(2.5)
    assert emu.launch(probe, stream, number, real, grid=(2, 3, 4), block=(32, 2, 1), shared=128) == SUCCESS
    number.value, real.value = -1, -1.0
    emu.gate.set()
    assert wait(emu.recorded(stream)) == SUCCESS
    assert seen == [([2, 3, 4], [32, 2, 1], 128, 7, 2.5, 0x1234)]


def test_dynamic_shared_memory_past_48_kib_needs_the_function_opted_in(emu):
    """As on a GPU: a launch may give a block 48 KiB of dynamic shared memory, more once
    cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) allows it, up to an
    sm_90 block's 227 KiB (what the emulated device says a block may opt in to); the bound is
    the function's."""
    given = []
    probe = emu.kernel(lambda grid, block, shared, params, context: given.append(shared) or 0, [])
    other = emu.kernel(lambda grid, block, shared, params, context: 0, [])
    stream, opt_in = emu.stream(), driver.MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert emu.launch(probe, stream, shared=48 * 1024) == SUCCESS
    assert emu.launch(probe, stream, shared=48 * 1024 + 16) == INVALID_VALUE
    assert emu.cu.func_set_attribute(probe, opt_in, 96 * 1024) == SUCCESS
    assert emu.launch(probe, stream, shared=96 * 1024) == SUCCESS
    assert emu.launch(probe, stream, shared=96 * 1024 + 16) == INVALID_VALUE
    assert emu.launch(other, stream, shared=96 * 1024) == INVALID_VALUE
    ceiling = EmulatedDevice.block_shared
    assert ceiling == 227 * 1024
    assert emu.cu.func_set_attribute(other, opt_in, ceiling) == SUCCESS
    assert emu.cu.func_set_attribute(probe, opt_in, ceiling + 1) == INVALID_VALUE
    assert emu.cu.func_set_attribute(probe, opt_in, -1) == INVALID_VALUE
    assert emu.cu.func_set_attribute(probe, 0, 1024) == INVALID_VALUE  # attributes not emulated
    assert emu.cu.func_set_attribute(None, opt_in, 1024) == INVALID_HANDLE
    assert wait(emu.recorded(stream)) == SUCCESS
    assert given == [48 * 1024, 96 * 1024]


def test_a_wait_holds_a_stream_until_the_record_is_reached(emu):
    first, second = emu.stream(), emu.stream()
    assert emu.launch(emu.blocked, first) == SUCCESS
    event = emu.recorded(first)
    assert emu.cu.stream_wait_event(second, event, 0) == SUCCESS
    emu.tagged(second, 2)
    after = emu.recorded(second)
    assert wait(after, GLIMPSE) == NOT_READY
    assert emu.cu.stream_query(second) == NOT_READY
    assert emu.log == []
    emu.gate.set()
    assert wait(after) == SUCCESS
    assert emu.log == ["gate", 2]


def test_a_wait_waits_for_the_record_current_when_it_was_enqueued(emu):
    blocked, waiting, other, later = emu.stream(), emu.stream(), emu.stream(), emu.stream()
    assert emu.launch(emu.blocked, blocked) == SUCCESS
    event = emu.recorded(blocked)  # generation 1: held by the gate
    assert emu.cu.stream_wait_event(waiting, event, 0) == SUCCESS
    emu.tagged(waiting, 1)
    waited = emu.recorded(waiting)
    assert emu.cu.event_record(event, other) == SUCCESS  # generation 2: reached at once
    assert wait(event) == SUCCESS
    assert emu.cu.stream_wait_event(later, event, 0) == SUCCESS  # waits for generation 2 only
    emu.tagged(later, 2)
    assert wait(emu.recorded(later)) == SUCCESS
    assert wait(waited, GLIMPSE) == NOT_READY  # still held by generation 1
    assert emu.log == [2]
    emu.gate.set()
    assert wait(waited) == SUCCESS
    assert emu.log == [2, "gate", 1]


def test_an_event_never_recorded_is_reached(emu):
    stream, event = emu.stream(), emu.event()
    assert emu.cu.event_query(event) == SUCCESS
    assert bounded(emu.cu.event_synchronize, event) == SUCCESS
    assert emu.cu.stream_wait_event(stream, event, 0) == SUCCESS
    emu.tagged(stream, 1)
    assert wait(emu.recorded(stream)) == SUCCESS
    assert emu.log == [1]


def test_elapsed_time_between_timing_events_as_the_driver_answers(emu):
    """cuEventElapsedTime: the milliseconds between two timing events' records being reached
    (the streams' order, whatever stream each is on); INVALID_HANDLE for an event made with
    CU_EVENT_DISABLE_TIMING or never recorded, NOT_READY while either is still to be reached."""
    first, second = emu.stream(), emu.stream()
    start, end, unrecorded = (emu.event(timed=True) for _ in range(3))
    plain = emu.event()
    ms = ctypes.c_float(-1.0)

    def elapsed(a, b) -> int:
        return emu.cu.event_elapsed_time(ctypes.byref(ms), a, b)

    assert emu.cu.event_record(start, first) == SUCCESS
    assert emu.launch(emu.blocked, first) == SUCCESS
    assert emu.cu.event_record(end, first) == SUCCESS
    assert emu.cu.event_record(plain, first) == SUCCESS
    assert emu.started.wait(BOUND)
    assert elapsed(start, end) == NOT_READY  # the kernel holds `end`
    time.sleep(GLIMPSE)  # the kernel runs at least this long
    emu.gate.set()
    assert wait(end) == SUCCESS and wait(plain) == SUCCESS
    assert elapsed(start, end) == SUCCESS and GLIMPSE * 1e3 <= ms.value < BOUND * 1e3
    forward = ms.value
    assert elapsed(end, start) == SUCCESS and ms.value == -forward
    assert elapsed(start, plain) == INVALID_HANDLE and elapsed(plain, end) == INVALID_HANDLE
    assert elapsed(start, unrecorded) == INVALID_HANDLE
    assert emu.cu.event_elapsed_time(None, start, end) == INVALID_VALUE
    # a record on another stream, later: the same clock
    assert emu.cu.event_record(unrecorded, second) == SUCCESS and wait(unrecorded) == SUCCESS
    assert elapsed(end, unrecorded) == SUCCESS and ms.value >= 0.0


def test_memset_and_memcpy_are_ordered_with_kernels(emu):
    a, b = np.zeros(64, np.uint8), np.zeros(64, np.uint8)

    def double(grid, block, shared, params, context):
        address = ctypes.c_void_p.from_address(params[0]).value
        view = np.ctypeslib.as_array((ctypes.c_uint8 * 64).from_address(address))
        view *= 2
        return 0

    doubling = emu.kernel(double, [8])
    stream = emu.stream()
    assert emu.launch(emu.blocked, stream) == SUCCESS
    assert emu.cu.memset_d8_async(a.ctypes.data, 7, a.nbytes, stream) == SUCCESS
    assert emu.launch(doubling, stream, ctypes.c_void_p(a.ctypes.data)) == SUCCESS
    assert emu.cu.memcpy_async(b.ctypes.data, a.ctypes.data, a.nbytes, stream) == SUCCESS
    assert emu.cu.memset_d8_async(a.ctypes.data, 1, 32, stream) == SUCCESS
    event = emu.recorded(stream)
    assert not a.any() and not b.any()  # nothing ran: the stream is held at the gate
    emu.gate.set()
    assert wait(event) == SUCCESS
    assert (b == 14).all()
    assert (a[:32] == 1).all() and (a[32:] == 14).all()


def test_an_injected_launch_failure_enqueues_nothing(emu):
    stream = emu.stream()
    before = emulator.launches()
    emulator.fail_launch(2)
    assert emu.launch(emu.tag, stream, ctypes.c_longlong(0)) == SUCCESS
    assert emu.launch(emu.tag, stream, ctypes.c_longlong(1)) == LAUNCH_OUT_OF_RESOURCES
    assert emu.launch(emu.tag, stream, ctypes.c_longlong(2)) == SUCCESS
    assert wait(emu.recorded(stream)) == SUCCESS  # not sticky
    assert emu.log == [0, 2]
    assert emulator.launches() - before == 2


def test_an_injected_kernel_fault_is_sticky_until_reset(emu):
    stream, other = emu.stream(), emu.stream()
    unrecorded = emu.event()
    before = emulator.launches()
    emulator.fault_kernel(3)  # the blocked kernel's launch is the first
    assert emu.launch(emu.blocked, stream) == SUCCESS
    emu.tagged(stream, 0)
    emu.tagged(stream, 1)  # faults
    emu.tagged(stream, 2)  # never runs
    event = emu.recorded(stream)
    synchronizing = Blocking(emu.cu.event_synchronize, event)
    assert synchronizing.blocks()
    emu.gate.set()
    assert synchronizing.result() == ILLEGAL_ADDRESS
    assert wait(event) == ILLEGAL_ADDRESS
    assert emu.log == ["gate", 0]
    assert emulator.launches() - before == 2
    for result in (emu.cu.event_query(event), emu.cu.event_query(unrecorded), emu.cu.stream_query(stream),
                   emu.cu.stream_query(other), bounded(emu.cu.stream_synchronize, other),
                   bounded(emu.cu.event_synchronize, event), emu.launch(emu.tag, other, ctypes.c_longlong(3)),
                   emu.cu.event_record(unrecorded, other)):
        assert result == ILLEGAL_ADDRESS
    emulator.reset()
    assert emu.cu.event_query(event) == SUCCESS
    emu.tagged(stream, 4)
    assert wait(emu.recorded(stream)) == SUCCESS
    assert emu.log == ["gate", 0, 4]


def test_a_kernel_returning_non_zero_faults(emu):
    stream = emu.stream()
    failing = emu.kernel(lambda grid, block, shared, params, context: 1, [])
    assert emu.launch(emu.blocked, stream) == SUCCESS  # so that the fault comes after what follows
    assert emu.launch(failing, stream) == SUCCESS
    emu.tagged(stream, 1)
    event = emu.recorded(stream)
    emu.gate.set()
    assert wait(event) == ILLEGAL_ADDRESS
    assert emu.cu.stream_query(stream) == ILLEGAL_ADDRESS
    assert emu.log == ["gate"]
    emulator.reset()
    assert emu.cu.stream_query(stream) == SUCCESS


def test_a_lost_event_stalls_its_stream_until_reset(emu):
    stream = emu.stream()
    emulator.lose_event(1)
    lost = emu.recorded(stream)
    emu.tagged(stream, 1)
    assert wait(lost, GLIMPSE) == NOT_READY
    assert emu.cu.event_query(lost) == NOT_READY
    assert emu.cu.stream_query(stream) == NOT_READY
    assert emu.log == []
    emulator.reset()
    assert emu.cu.event_query(lost) == SUCCESS
    emu.tagged(stream, 2)
    assert wait(emu.recorded(stream)) == SUCCESS
    assert emu.log == [2]  # the work queued behind the lost record was dropped


def test_concurrent_launches_each_run_once(emu):
    streams = [emu.stream() for _ in range(4)]
    threads, per_thread = 8, 200
    before = emulator.launches()
    results: list[int] = []

    def launch_all(t: int) -> None:
        results.extend(emu.launch(emu.tag, streams[t % 4], ctypes.c_longlong(t * 1000 + i))
                       for i in range(per_thread))

    workers = [threading.Thread(target=launch_all, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(BOUND)
    assert results == [SUCCESS] * threads * per_thread
    for stream in streams:
        assert wait(emu.recorded(stream)) == SUCCESS
    assert emulator.launches() - before == threads * per_thread
    assert sorted(emu.log) == sorted(t * 1000 + i for t in range(threads) for i in range(per_thread))
    for t in range(threads):  # one thread's launches all went to one stream: in its order
        mine = [tag for tag in emu.log if tag // 1000 == t]
        assert mine == sorted(mine)


def test_invalid_handles_and_values(emu):
    assert emu.cu.event_query(None) == INVALID_HANDLE
    assert emu.cu.event_record(None, None) == INVALID_HANDLE
    assert emu.launch(None, None) == INVALID_HANDLE
    stream, event = ctypes.c_void_p(), ctypes.c_void_p()
    assert emu.cu.stream_create(ctypes.byref(stream), 1) == SUCCESS
    assert emu.cu.stream_destroy(stream) == SUCCESS
    assert emu.cu.stream_query(stream) == INVALID_HANDLE
    assert emu.cu.stream_destroy(stream) == INVALID_HANDLE
    assert emu.cu.event_create(ctypes.byref(event), 0) == SUCCESS
    assert emu.cu.event_destroy(event) == SUCCESS
    assert emu.cu.event_query(event) == INVALID_HANDLE
    assert emu.cu.stream_destroy(None) == INVALID_HANDLE  # the legacy stream
    assert emu.cu.launch_kernel(emu.tag, 1, 1, 1, 1, 1, 1, 0, None, None, None) == INVALID_VALUE
    assert emu.launch(emu.blocked, None, grid=(0, 1, 1)) == INVALID_VALUE
    assert emu.launch(emu.blocked, None, block=(1024, 2, 1)) == INVALID_VALUE


def test_a_destroyed_stream_finishes_its_work(emu):
    stream = ctypes.c_void_p()
    assert emu.cu.stream_create(ctypes.byref(stream), 1) == SUCCESS
    ran = threading.Event()
    setting = emu.kernel(lambda grid, block, shared, params, context: ran.set() or 0, [])
    assert emu.launch(emu.blocked, stream) == SUCCESS
    assert emu.launch(setting, stream) == SUCCESS
    assert emu.cu.stream_destroy(stream) == SUCCESS  # returns at once, as in CUDA
    assert not ran.is_set()
    emu.gate.set()
    assert ran.wait(BOUND)


def test_the_legacy_stream(emu):
    emu.tagged(None, 1)
    assert wait(emu.recorded(None)) == SUCCESS
    assert emu.log == [1]
    assert bounded(emu.cu.stream_synchronize, None) == SUCCESS


def view(params, n: int) -> np.ndarray:
    """The n int64s a kernel's first parameter (a pointer) points at."""
    address = ctypes.c_void_p.from_address(params[0]).value
    return np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(address))


def cells(emu: Emulator, n: int):
    """An int64 array, and a kernel (pointer, index, value) adding value into array[index]."""
    array = np.zeros(n, np.int64)

    def add(grid, block, shared, params, context):
        index, value = (ctypes.c_longlong.from_address(params[i]).value for i in (1, 2))
        view(params, n)[index] += value
        return 0

    return array, emu.kernel(add, [8, 8, 8])


def test_a_capture_runs_nothing_until_launched(emu):
    origin = emu.stream()
    filled = np.zeros(16, np.uint8)
    before = emulator.launches()
    assert emu.capturing(origin) == NOT_CAPTURING
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    assert emu.capturing(origin) == CAPTURING
    emu.tagged(origin, 1)
    assert emu.cu.memset_d8_async(filled.ctypes.data, 7, filled.nbytes, origin) == SUCCESS
    emu.tagged(origin, 2)
    graph = emu.graph(origin)
    assert emu.capturing(origin) == NOT_CAPTURING
    assert bounded(emu.cu.stream_synchronize, origin) == SUCCESS  # nothing was queued
    assert emu.log == [] and not filled.any() and emulator.launches() == before
    executable = emu.instantiate(graph)
    assert emu.log == [] and emulator.launches() == before
    assert wait(emu.replayed(executable, origin)) == SUCCESS
    assert emu.log == [1, 2] and (filled == 7).all()
    filled[:] = 0
    assert wait(emu.replayed(executable, origin)) == SUCCESS  # runs again
    assert emu.log == [1, 2, 1, 2] and (filled == 7).all()
    assert emulator.launches() - before == 4


def test_a_fork_join_capture_replays_cross_stream_dependencies(emu):
    origin, first, second = emu.stream(), emu.stream(), emu.stream()
    array, add = cells(emu, 2)
    pointer = ctypes.c_void_p(array.ctypes.data)

    def scale(grid, block, shared, params, context):  # reads what the first stream's kernel wrote
        array = view(params, 2)
        emu.log.append(("second saw", int(array[0])))
        array[1] += 10 * array[0]
        return 0

    scaling = emu.kernel(scale, [8])
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, first, second)
    assert emu.capturing(first) == emu.capturing(second) == CAPTURING  # joined by their waits
    emu.tagged(second, 0)  # independent of the first stream
    assert emu.launch(add, first, pointer, ctypes.c_longlong(0), ctypes.c_longlong(1)) == SUCCESS
    written = emu.recorded(first)
    assert emu.cu.stream_wait_event(second, written, 0) == SUCCESS  # inside the graph: nothing to wait for
    assert emu.launch(scaling, second, pointer) == SUCCESS
    emu.join(origin, first, second)
    graph = emu.graph(origin)
    assert emu.capturing(first) == emu.capturing(second) == NOT_CAPTURING
    for stream in (origin, first, second):
        assert bounded(emu.cu.stream_synchronize, stream) == SUCCESS
    assert emu.log == [] and not array.any()
    executable = emu.instantiate(graph)
    assert wait(emu.replayed(executable, origin)) == SUCCESS
    assert emu.log == [0, ("second saw", 1)] and array.tolist() == [1, 10]
    assert wait(emu.replayed(executable, origin)) == SUCCESS
    assert emu.log == [0, ("second saw", 1), 0, ("second saw", 2)] and array.tolist() == [2, 30]


def test_kernel_params_are_copied_at_capture(emu):
    origin = emu.stream()
    value = ctypes.c_longlong(5)
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    assert emu.launch(emu.tag, origin, value) == SUCCESS
    value.value = -1  # the caller reuses its buffer at once
    executable = emu.instantiate(emu.graph(origin))
    value.value = -2
    assert wait(emu.replayed(executable, origin)) == SUCCESS
    assert emu.log == [5]


def test_work_after_a_graph_launch_waits_for_the_whole_graph(emu):
    origin = emu.stream()
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    assert emu.launch(emu.blocked, origin) == SUCCESS
    emu.tagged(origin, 1)
    executable = emu.instantiate(emu.graph(origin))
    done = emu.replayed(executable, origin)
    emu.tagged(origin, 2)
    after = emu.recorded(origin)
    assert emu.started.wait(BOUND)
    assert wait(done, GLIMPSE) == NOT_READY
    assert emu.cu.event_query(done) == NOT_READY and emu.cu.stream_query(origin) == NOT_READY
    assert emu.log == []
    emu.gate.set()
    assert wait(after) == SUCCESS
    assert emu.log == ["gate", 1, 2]


def test_queries_during_a_capture_are_refused(emu):
    origin, worker = emu.stream(), emu.stream()
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, worker)
    inside = emu.recorded(worker)
    # An event last recorded in a capture: refused, and the capture goes on.
    assert emu.cu.event_query(inside) == CAPTURED_EVENT
    assert bounded(emu.cu.event_synchronize, inside) == CAPTURED_EVENT
    assert wait(inside) == CAPTURED_EVENT
    assert emu.capturing(origin) == CAPTURING
    # A stream in a capture: refused, and the capture is invalidated, as in CUDA.
    assert emu.cu.stream_query(worker) == CAPTURE_UNSUPPORTED
    assert emu.capturing(origin) == emu.capturing(worker) == INVALIDATED
    assert bounded(emu.cu.stream_synchronize, origin) == CAPTURE_UNSUPPORTED
    assert emu.cu.stream_destroy(worker) == CAPTURE_UNSUPPORTED  # still a stream
    assert emu.launch(emu.tag, worker, ctypes.c_longlong(1)) == CAPTURE_INVALIDATED
    assert emu.cu.event_record(inside, origin) == CAPTURE_INVALIDATED
    emu.join(origin)
    assert emu.end_capture(origin) == (CAPTURE_INVALIDATED, None)
    assert emu.capturing(origin) == emu.capturing(worker) == NOT_CAPTURING
    assert emu.cu.event_query(inside) == CAPTURED_EVENT  # until recorded again outside a capture
    assert emu.cu.stream_wait_event(worker, inside, 0) == CAPTURED_EVENT
    assert emu.cu.event_record(inside, worker) == SUCCESS
    assert wait(inside) == SUCCESS
    emu.tagged(worker, 2)
    assert wait(emu.recorded(worker)) == SUCCESS
    assert emu.log == [2]


def test_a_stream_that_did_not_rejoin_fails_the_capture(emu):
    origin, first, second = emu.stream(), emu.stream(), emu.stream()
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, first)
    emu.tagged(first, 1)
    assert emu.end_capture(origin) == (CAPTURE_UNJOINED, None)
    assert emu.capturing(origin) == emu.capturing(first) == NOT_CAPTURING  # ended all the same
    # Work after the join record is unjoined too.
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, first)
    emu.tagged(first, 2)
    emu.join(origin, first)
    emu.tagged(first, 3)
    assert emu.end_capture(origin) == (CAPTURE_UNJOINED, None)
    # Joined through another stream: the second waited for all of the first's work.
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, first, second)
    emu.tagged(first, 4)
    assert emu.cu.stream_wait_event(second, emu.recorded(first), 0) == SUCCESS
    emu.tagged(second, 5)
    emu.join(origin, second)
    executable = emu.instantiate(emu.graph(origin))
    assert bounded(emu.cu.stream_synchronize, first) == SUCCESS
    assert emu.log == []  # nothing of the failed captures ran
    assert wait(emu.replayed(executable, origin)) == SUCCESS
    assert emu.log == [4, 5]


def test_capture_misuse_is_refused(emu):
    origin, worker, other = emu.stream(), emu.stream(), emu.stream()
    graph = ctypes.c_void_p()
    assert emu.cu.stream_end_capture(origin, ctypes.byref(graph)) == ILLEGAL_STATE  # not capturing
    assert emu.cu.stream_begin_capture(origin, 3) == INVALID_VALUE
    assert emu.cu.stream_begin_capture(None, RELAXED) == CAPTURE_UNSUPPORTED  # the legacy stream
    assert emu.cu.stream_begin_capture(origin, 0) == SUCCESS  # global mode: behaves as relaxed
    assert emu.cu.stream_begin_capture(origin, RELAXED) == ILLEGAL_STATE
    emu.fork(origin, worker)
    assert emu.cu.stream_begin_capture(worker, RELAXED) == ILLEGAL_STATE  # in a capture already
    assert emu.cu.stream_end_capture(origin, None) == INVALID_VALUE
    assert emu.capturing(origin) == CAPTURING
    assert emu.end_capture(worker) == (CAPTURE_UNMATCHED, None)  # not where it began
    assert emu.capturing(worker) == INVALIDATED
    assert emu.cu.event_record(emu.event(), worker) == CAPTURE_INVALIDATED  # no join is possible now
    assert emu.end_capture(origin) == (CAPTURE_INVALIDATED, None)
    assert emu.end_capture(other) == (ILLEGAL_STATE, None)


def test_waits_across_a_capture_boundary(emu):
    origin, outside, second = emu.stream(), emu.stream(), emu.stream()
    reached = emu.recorded(outside)
    assert wait(reached) == SUCCESS
    assert emu.launch(emu.blocked, outside) == SUCCESS
    pending = emu.recorded(outside)
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    assert emu.cu.stream_wait_event(origin, reached, 0) == SUCCESS  # a dependency met already
    emu.tagged(origin, 1)
    assert emu.cu.stream_begin_capture(second, RELAXED) == SUCCESS  # a capture of its own
    inside_second = emu.recorded(second)
    assert emu.cu.stream_wait_event(origin, inside_second, 0) == CAPTURE_ISOLATION
    assert emu.capturing(origin) == INVALIDATED and emu.capturing(second) == CAPTURING
    assert emu.end_capture(origin) == (CAPTURE_INVALIDATED, None)
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    assert emu.cu.stream_wait_event(origin, pending, 0) == CAPTURE_ISOLATION  # not reached: refused
    assert emu.end_capture(origin) == (CAPTURE_INVALIDATED, None)
    emu.tagged(second, 2)
    executable = emu.instantiate(emu.graph(second))
    emu.gate.set()
    assert wait(emu.replayed(executable, second)) == SUCCESS
    assert wait(pending) == SUCCESS
    # The two streams are independent (the waits were refused), so in either order; tag 1, in
    # the invalidated capture, never runs.
    assert sorted(emu.log, key=str) == [2, "gate"]


def test_a_kernel_fault_in_a_replay_is_sticky_until_reset(emu):
    origin = emu.stream()
    before = emulator.launches()
    emulator.fail_launch(2)  # both count the launches made while capturing
    emulator.fault_kernel(3)
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.tagged(origin, 0)
    assert emu.launch(emu.tag, origin, ctypes.c_longlong(1)) == LAUNCH_OUT_OF_RESOURCES  # not captured
    emu.tagged(origin, 2)  # captured as a kernel that faults
    emu.tagged(origin, 3)
    executable = emu.instantiate(emu.graph(origin))  # the failed launch left the capture valid
    assert emu.log == []
    for replay in range(2):
        # The stream is held at the gate until the record behind the graph is enqueued: a
        # fault fails every call made after it.
        emu.gate = threading.Event()
        assert emu.launch(emu.blocked, origin) == SUCCESS
        done = emu.replayed(executable, origin)
        emu.gate.set()
        assert wait(done) == ILLEGAL_ADDRESS
        assert emu.log == ["gate", 0] * (replay + 1)  # nothing after the fault ran
        for result in (emu.cu.stream_query(origin), emu.cu.graph_launch(executable, origin),
                       emu.cu.stream_begin_capture(origin, RELAXED), emu.cu.event_query(done)):
            assert result == ILLEGAL_ADDRESS
        emulator.reset()
        assert emu.cu.stream_query(origin) == SUCCESS and emu.cu.event_query(done) == SUCCESS
        # The second replay faults again: the faulting kernel is in the graph.
    assert emulator.launches() - before == 4


def test_launches_of_one_graph_run_one_after_another(emu):
    first, second = emu.stream(), emu.stream()

    def gated(grid, block, shared, params, context):
        emu.log.append("in")
        emu.started.set()
        emu.log.append("out" if emu.gate.wait(BOUND) else "gate timed out")
        return 0

    gating = emu.kernel(gated, [])
    assert emu.cu.stream_begin_capture(first, RELAXED) == SUCCESS
    assert emu.launch(gating, first) == SUCCESS
    executable = emu.instantiate(emu.graph(first))
    assert emu.cu.graph_launch(executable, first) == SUCCESS
    assert emu.started.wait(BOUND)
    done = emu.replayed(executable, second)  # on another stream: after the first launch all the same
    assert wait(done, GLIMPSE) == NOT_READY
    assert emu.log == ["in"]
    emu.gate.set()
    assert wait(done) == SUCCESS
    assert emu.log == ["in", "out", "in", "out"]


def test_a_graph_launched_while_capturing_runs_inside_the_new_graph(emu):
    origin = emu.stream()
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.tagged(origin, 1)
    inner = emu.instantiate(emu.graph(origin))
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.tagged(origin, 0)
    assert emu.cu.graph_launch(inner, origin) == SUCCESS
    emu.tagged(origin, 2)
    outer = emu.instantiate(emu.graph(origin))
    assert emu.log == []
    assert wait(emu.replayed(outer, origin)) == SUCCESS
    assert emu.log == [0, 1, 2]


def test_graphs_and_execs_are_destroyed(emu):
    stream = emu.stream()
    assert emu.cu.stream_begin_capture(stream, RELAXED) == SUCCESS
    assert emu.launch(emu.blocked, stream) == SUCCESS
    emu.tagged(stream, 1)
    graph = emu.graph(stream)
    first, second = emu.instantiate(graph), emu.instantiate(graph)
    assert emu.cu.graph_destroy(graph) == SUCCESS  # the execs do not need it
    assert emu.cu.graph_destroy(graph) == INVALID_HANDLE
    executable = ctypes.c_void_p()
    assert emu.cu.graph_instantiate_with_flags(ctypes.byref(executable), graph, 0) == INVALID_HANDLE
    assert emu.cu.graph_launch(first, stream) == SUCCESS
    assert emu.cu.graph_exec_destroy(first) == SUCCESS  # its queued launch still runs, as in CUDA
    assert emu.cu.graph_exec_destroy(first) == INVALID_HANDLE
    assert emu.cu.graph_launch(first, stream) == INVALID_HANDLE
    emu.gate.set()
    assert wait(emu.replayed(second, stream)) == SUCCESS
    assert emu.log == ["gate", 1, "gate", 1]
    assert emu.cu.graph_exec_destroy(second) == SUCCESS
    assert emu.cu.graph_launch(None, stream) == INVALID_HANDLE
    assert emu.cu.graph_instantiate_with_flags(ctypes.byref(executable), stream, 0) == INVALID_HANDLE


def test_concurrent_launches_into_one_capture(emu):
    origin = emu.stream()
    workers = [emu.stream() for _ in range(4)]
    per_thread = 100
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, *workers)
    results: list[int] = []

    def launch_all(t: int) -> None:
        results.extend(emu.launch(emu.tag, workers[t], ctypes.c_longlong(t * 1000 + i))
                       for i in range(per_thread))

    threads = [threading.Thread(target=launch_all, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    assert results == [SUCCESS] * 4 * per_thread
    emu.join(origin, *workers)
    executable = emu.instantiate(emu.graph(origin))
    assert emu.log == []
    assert wait(emu.replayed(executable, origin)) == SUCCESS
    assert sorted(emu.log) == sorted(t * 1000 + i for t in range(4) for i in range(per_thread))
    for t in range(4):  # each stream's commands in its order
        assert [tag for tag in emu.log if tag // 1000 == t] == [t * 1000 + i for i in range(per_thread)]


def test_reset_ends_a_capture(emu):
    origin, worker = emu.stream(), emu.stream()
    assert emu.cu.stream_begin_capture(origin, RELAXED) == SUCCESS
    emu.fork(origin, worker)
    emu.tagged(worker, 1)
    emulator.reset()
    assert emu.capturing(origin) == emu.capturing(worker) == NOT_CAPTURING
    assert emu.end_capture(origin) == (ILLEGAL_STATE, None)
    emu.tagged(worker, 2)  # runs now: no longer captured
    assert wait(emu.recorded(worker)) == SUCCESS
    assert emu.log == [2]


def test_an_edited_source_rebuilds(tmp_path):
    source = emulator.SOURCE.read_text()
    first = emulator.build(source, tmp_path)
    built = first.stat().st_mtime_ns
    assert emulator.build(source, tmp_path) == first and first.stat().st_mtime_ns == built
    edited = emulator.build(source + "\n/* edited */\n", tmp_path)
    assert edited != first and edited.exists()
    assert not list(tmp_path.glob("*.tmp"))
    # another library: its own, uninitialised state
    fresh = driver.Driver(ctypes.CDLL(str(edited)), "an edited emulator")
    handle = ctypes.c_void_p()
    assert fresh.stream_create(ctypes.byref(handle), 1) == NOT_INITIALIZED
    assert fresh.launch_kernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None) == NOT_INITIALIZED
    assert fresh.init(0) == SUCCESS
    assert fresh.launch_kernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None) == INVALID_HANDLE


def test_build_errors_name_the_command(tmp_path, monkeypatch):
    with pytest.raises(PTOError, match=r"(?s)cc -std=c11 .*error"):
        emulator.build("this is not C", tmp_path)
    monkeypatch.setattr(emulator.shutil, "which", lambda name: None)
    with pytest.raises(PTOError, match=r'backend="cuda-emulated" needs a C compiler \(`cc`\)'):
        emulator.build("int x;", tmp_path / "other")
