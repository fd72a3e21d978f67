"""The CUDA backend: the heap ring is one device allocation, and a task's kernel goes out
through the CUDA driver from numba (backends/launches.py), with no CuPy call per task.

What the memory is and where a kernel's code comes from is the device's (a small object with
a narrow interface): `CupyDevice` (cuda_device.py) on a GPU, where CuPy owns memory, modules
and streams, and `EmulatedDevice` (emulated_device.py) without one, where host memory stands
for device memory and the emulator's driver runs each launch on CPU threads. Everything else,
the launch records, the issue path, streams, events and capture, is this module's, the same
for both.

Two ways to run a task. `run` (serial and parallel executors) enqueues on the calling
thread's own stream and waits for it there before the executor completes the task.
`enqueue` (stream executor) only enqueues on a given stream, behind waits on the events of
producers on other streams, and records an event behind the kernel, which tells the executor
when to retire it. A kernel's CUDA code is generated from its PTO program (a kernel family
picks the instance of the call's shapes: CudaCode.code_for). A matmul family's tile product
(`CudaInstances.gemm`) is one cuBLAS call instead (cublas.py), made from numba as a launch is,
wherever its tiles' layout is cuBLAS's. A kernel with a `library` implementation (through
CuPy) runs that instead on a GPU, except while capturing a CUDA graph, where CuPy refuses
cuBLAS, and in a TF32 run, where CuPy's float32 products would be exact.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import PTOError
from ..first_calls import preparing
from ..kernel import CudaCode
from ..native_call import compiled_entry
from ..params import ParamKind
from ..tensor import TensorDescriptor
from . import ExternalArray, cublas, cuda_abi
from .cuda_abi import MAX_BLOCKS, SHARED_LIMIT, THREADS_PER_BLOCK
from .driver import CAPTURE_MODE_RELAXED, MAX_DYNAMIC_SHARED_SIZE_BYTES, Driver
from .launches import (
    CALLS,
    GEMM,
    NO_WORK,
    Scratch,
    Template,
    instance_scalars,
    issue,
    scalar_bits,
    template,
)
from .persistent_module import ModuleInstance

GPU_TIMEOUT = 600.0  # seconds an event may take before a wait calls it a hang (PTO_GPU_TIMEOUT)
CLOCK_SECONDS = 1.0  # how old the timed enqueues' clock may grow before it is taken again


@dataclasses.dataclass(slots=True, eq=False)
class _Clock:
    """A timing event the GPU reached at `at` (a time.perf_counter() reading), against which
    other timing events' elapsed times are host times; `users`: the timed enqueues whose spans
    are still to be read against it (its event is recorded again only once there are none)."""

    event: int
    at: float
    users: int = 0


class Device(Protocol):
    """What a CUDA backend's memory and code are (cuda_device.py, emulated_device.py)."""

    name: str  # the backend's name: "cuda" or "cuda-emulated"
    driver: Driver
    heap_base: int
    heap_bytes: int
    runs_libraries: bool  # whether kernels' `library` implementations (CuPy) run here
    block_shared: int  # the dynamic shared memory a block may opt in to (cuda_abi.BLOCK_SHARED)

    def resolve(self, array: object) -> ExternalArray: ...

    def view(self, tensor: TensorDescriptor) -> object: ...

    def to_device(self, array: np.ndarray) -> object: ...

    def to_host(self, array: object) -> np.ndarray: ...

    def wait_for_caller(self) -> None: ...

    def function(self, code: CudaCode, kernel, layout: list, scalars: tuple) -> int:
        """The CUfunction of the code's kernel (and, where the device runs CPU code for it, of
        the call's instance): `layout` is the call's params in order, (shape, numpy dtype) for
        a tensor and None for a scalar; `scalars` their values."""

    def module_function(self, source: Path, dtype, name: str, words: int) -> int:
        """The CUfunction of `pto_<name>` in CUDA source `source` compiled for element type
        `dtype` (None: the source defines its own, as the persistent kernel's module does),
        taking `words` 8-byte params (that module, and `function`'s generated code)."""

    def resident_blocks(self, function: int, shared: int) -> int:
        """Blocks of `function`, each given `shared` bytes of dynamic shared memory, the device
        runs at once (the persistent kernel's grid). The
        device is also the persistent scheduler's memory: persistent_host.Memory."""

    def stream(self) -> int:
        """A new non-blocking stream's handle, freed with the device."""

    def event(self, timed: bool = False) -> int:
        """A new event's handle, freed with the device; timing disabled unless `timed`."""

    def enter(self) -> None:
        """Make the device's context current on the calling thread (once per thread)."""

    def library(self, task, values: list, stream: int) -> None:
        """Run the task's `library` implementation over `values` on `stream`."""

    def blas(self) -> ctypes.CDLL:
        """The cuBLAS library the GEMMs call (backends/cublas.py), loaded."""


def default_gpu_timeout() -> float:
    """GPU_TIMEOUT, or the seconds the environment's PTO_GPU_TIMEOUT says (make gpu-check sets
    less, so that a hung wait costs a test, not the budget of them all)."""
    configured = os.environ.get("PTO_GPU_TIMEOUT")
    if configured is None:
        return GPU_TIMEOUT
    try:
        seconds = float(configured)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise PTOError(f"PTO_GPU_TIMEOUT={configured!r}: give the seconds a wait for the GPU may take (> 0)")
    return seconds


class CudaBackend:
    def __init__(self, device: Device, gpu_timeout: float | None = None, precision: str = "exact"):
        self.name = device.name
        self.device = device
        self.tf32 = precision == "tf32"  # families' float32 products as TF32 (cuda_abi.PRECISIONS)
        self.block_shared = cuda_abi.instance_shared(device.block_shared)  # an instance's block's
        self._driver = device.driver
        self.heap_base = device.heap_base
        self.heap_bytes = device.heap_bytes
        self.gpu_timeout = default_gpu_timeout() if gpu_timeout is None else gpu_timeout
        self._templates: dict[tuple, Template] = {}
        self._making: dict[tuple, Future] = {}  # instances being compiled, by template key
        self._templates_lock = threading.Lock()  # guards both
        self._compilers: ThreadPoolExecutor | None = None  # prefetch's threads, made at its first use
        self._local = threading.local()  # per issuing thread: its Scratch and its own stream
        self._events: list[int] = []  # handed back by the stream executor, to record again
        self._timed_events: list[int] = []  # the same, made with timing (timed enqueues)
        # A timed enqueue's event -> the event recorded at its kernel's start, and the clock
        # its span is read against (_clock).
        self._starts: dict[int, tuple[int, _Clock]] = {}
        self._clock: _Clock | None = None
        self._streams: dict[object, int] = {}
        self._origin: int | None = None  # the stream a capture begins and ends on
        self._capturing = False
        self._issue = None  # launches.issue's compiled entry, once a launch has typed it
        self._blas_handles: cublas.Handles | None = None  # at the first GEMM
        # The persistent executor's (executors/persistent.py; only the orchestrator's thread uses
        # them): instances by template key; the generated code of those its kernels have run
        # and their element types, in the order first seen (a run's kernel holds all of them),
        # and how many of them have compiled in a module (the rest are dropped when one fails);
        # and the scheduler states of ended runs, by their sizes, for the next.
        self._instances: dict[tuple, Instance] = {}
        self.persistent_codes: list[ModuleInstance] = []
        self.persistent_compiled = 0
        self.persistent_states: dict = {}

    # --- memory: the device's ------------------------------------------------------------
    def resolve(self, array: object) -> ExternalArray:
        return self.device.resolve(array)

    def view(self, tensor: TensorDescriptor):
        return self.device.view(tensor)

    def to_device(self, array: np.ndarray):
        """A device copy of a host array, for orchestrations' arguments."""
        return self.device.to_device(array)

    def to_host(self, array) -> np.ndarray:
        return self.device.to_host(array)

    def wait_for_caller(self) -> None:
        """Wait for the caller's queued work: the runtime's streams are non-blocking, so they
        would not wait for the copies and fills that made the inputs on their own."""
        self.device.wait_for_caller()

    # --- kernels ---------------------------------------------------------------------------
    def run(self, task) -> None:
        """Run a task's CUDA implementation on this thread's stream and wait for it there."""
        stream = self._thread_stream()
        event = self.enqueue(task, stream, ())
        try:
            self._driver.wait_until_reached(event, self.gpu_timeout)
        finally:
            self.release(event)

    def enqueue(self, task, stream: int, after, timed: bool = False) -> int:
        """Enqueue a task's kernel on `stream` behind the events `after` (producers on other
        streams); the event recorded behind it. `timed`: a timing event, and another recorded
        just before the kernel, once its waits are passed (`span`)."""
        self._enter()
        if not timed:
            event = self.take_event()
            try:
                self._enqueue(task, stream, after, event)
                return event
            except BaseException:
                self._events.append(event)  # recorded or not, nothing waits on it
                raise
        clock = self._timing_clock()
        start, event = self._take_timed(), self._take_timed()
        try:
            self._enqueue(task, stream, after, event, start)
        except BaseException:
            self._timed_events += (start, event)
            raise
        self._starts[event] = (start, clock)
        clock.users += 1
        return event

    def span(self, event: int) -> tuple[float, float]:
        start, clock = self._starts[event]
        return (clock.at + self._driver.elapsed(clock.event, start),
                clock.at + self._driver.elapsed(clock.event, event))

    def _take_timed(self) -> int:
        try:
            return self._timed_events.pop()
        except IndexError:
            return self.device.event(timed=True)

    def _timing_clock(self) -> _Clock:
        """The clock timed enqueues' spans are read against: a timing event this thread's own
        stream has reached, and when; made anew once it is CLOCK_SECONDS old (the elapsed times
        are floats of milliseconds: ~0.06 us fine a second from their clock, ~4 us a minute).
        With nothing timed out, its time is the host's just before the record is made (the GPU is
        idle then, and reaches it within microseconds: no sooner, so that no span read against it
        ends later than the host saw its event reached); while spans are still to be read against
        the old clock, the new one is placed on the GPU's timeline from the old one, so that
        spans read against either agree (the record may wait behind a kernel of a stream that
        shares its hardware queue)."""
        old = self._clock
        if old is not None and time.perf_counter() - old.at <= CLOCK_SECONDS:
            return old
        self._clock = None
        if old is not None and old.users == 0:
            self._timed_events.append(old.event)
        event, stream = self._take_timed(), self._thread_stream()
        at = time.perf_counter()
        self._driver.call("cuEventRecord", event, stream)
        self.synchronize(event)
        if old is not None and old.users > 0:
            at = old.at + self._driver.elapsed(old.event, event)
        self._clock = _Clock(event, at)
        return self._clock

    def prepare(self, task, wait: bool = True) -> tuple[Template, np.ndarray] | Future | None:
        """A task's launch: its instance's template and the task's own words (in param order,
        as `launches.issue` takes them); None where its kernel's library implementation runs
        instead (`library`). Not `wait`: where the instance is still to be made, the Future of
        its making (started now, on a thread of its own, or under way) instead."""
        _check_cuda(task)
        if self.runs_library(task.kernel):
            return None
        key, own, scalars = _split(task)
        launch = self._templates.get(key)  # a dict read is atomic under the GIL
        if launch is None:
            making = None if wait else self._start_key(key, task)[0]
            if making is not None and not making.done():
                return making
            launch = self._template(key, task)
        return launch, _own_words(launch, own, scalars)

    def launch(self, function: int, blocks: int, shared: int, params: tuple[int, ...], stream: int,
               event: int) -> None:
        """Launch `function` over `blocks` blocks of THREADS_PER_BLOCK threads with `shared` bytes
        of dynamic shared memory each (allowed already: allow_shared, which the occupancy that
        sizes `blocks` needs first), its params the 8-byte words `params`, on `stream`, and
        record `event` behind it."""
        self._enter()
        words = np.array(params, np.uint64)
        pointers = (ctypes.c_void_p * len(params))(*(words.ctypes.data + 8 * i for i in range(len(params))))
        self._driver.call("cuLaunchKernel", function, blocks, 1, 1, THREADS_PER_BLOCK, 1, 1, shared, stream,
                          pointers, None)
        self._driver.call("cuEventRecord", event, stream)

    def allow_shared(self, function: int, shared: int) -> None:
        """Let launches of `function` give a block `shared` bytes of dynamic shared memory: past
        SHARED_LIMIT the driver refuses them until the function is opted in (generated code
        has no static shared memory, which would count against SHARED_LIMIT too)."""
        if shared > SHARED_LIMIT:
            self._enter()
            self._driver.call("cuFuncSetAttribute", function, MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)

    def library(self, task, stream: int) -> None:
        """Run a task's library implementation on `stream` (no waits before, no event after)."""
        self._enter()
        values = [p.value if p.kind == ParamKind.SCALAR else self.view(p.value) for p in task.params]
        self.device.library(task, values, stream)

    def runs_library(self, kernel) -> bool:
        """Whether the kernel's tasks run its `library` implementation here, not a launch. Not
        while capturing, nor in a TF32 run (CuPy's float32 products are exact, its TF32 switch
        process-wide: the families' generated TF32 code runs instead), unless the library is
        all there is (`library_only`)."""
        cuda = kernel.cuda
        return (cuda.library is not None and self.device.runs_libraries
                and (cuda.library_only or not (self._capturing or self.tf32)))

    def _enqueue(self, task, stream: int, after, event: int, start: int | None = None) -> None:
        """The launch (or library call) of `task` on `stream` after the waits `after`, `event`
        recorded behind it; `start` (a timed enqueue's) recorded before it, once the waits are
        passed and the instance made (a first call's compile is not the kernel's time)."""
        prepared = self.prepare(task)
        if prepared is None or prepared[0].grid == 0:  # a library call, or no work items
            for producer in after:
                self._driver.call("cuStreamWaitEvent", stream, producer, 0)
            if start is not None:
                self._driver.call("cuEventRecord", start, stream)
            if prepared is None:
                self.library(task, stream)
            self._driver.call("cuEventRecord", event, stream)
            return
        launch, own = prepared
        scratch = self._scratch()
        blas = self.blas_handle(stream) if launch.gemm[0]["batch"] else 0
        args = (self._driver.addresses, launch.function, launch.grid, launch.block, launch.shared,
                launch.gemm, blas, stream, launch.words, launch.task_words, own,
                np.array(after, np.int64) if after else _NO_WAITS, start or 0, event, scratch.words,
                scratch.params, scratch.failed)
        if self._issue is None:  # issue's entry for these types: half of its call's cost was dispatch
            self._issue = compiled_entry(issue, *args)
        status = self._issue(*args)
        if status != 0:
            self._driver.check(status, CALLS[int(scratch.failed[0])])

    def _template(self, key: tuple, task) -> Template:
        """The launch of the task's kernel instance over tensors of its shapes, strides and
        element types, made at the first such call (then looked up by `key`, from _split), or
        by a thread already making it (`prefetch`'s), which this one waits for."""
        self._enter()  # the launches that follow need the device's context on this thread
        with self._templates_lock:
            found = self._templates.get(key)
            if found is not None:
                return found
            making = self._making.get(key)
            if making is None:
                making = self._making[key] = Future()
                mine = True
            else:
                mine = False
        if mine:
            self._make(key, task, making)
        with preparing():  # compiling, or waiting for it: a cost history leaves this call out
            return making.result()

    def prefetch(self, tasks) -> None:
        """Start making the launches of `tasks`' kernel instances that are neither made nor
        being made, on threads of their own, and return: a run's new instances then compile
        side by side (NVRTC, or g++ on the emulator, outside the GIL) before the launches
        that need them, which wait for theirs. A failure is the failure of the first task
        that needs the instance, as if it had compiled it itself."""
        for task in tasks:
            if self._start(task)[1]:  # no thread took it: the rest are made as they are issued
                return

    def start(self, task) -> Future | None:
        """Start making `task`'s launch on a thread of its own where its instance is neither
        made nor being made, and return the Future of its making (done where no thread could
        take it: made here); None where there is nothing to wait for (made already, a library
        call, no CUDA code: `prepare` says what)."""
        return self._start(task)[0]

    def _start(self, task) -> tuple[Future | None, bool]:
        """`start`'s Future, and whether it was made on this thread (no thread took it)."""
        if task.kernel.cuda is None or self.runs_library(task.kernel):
            return None, False
        return self._start_key(_split(task)[0], task)

    def _start_key(self, key: tuple, task) -> tuple[Future | None, bool]:
        """_start for the instance `key` (_split's) of `task`."""
        with self._templates_lock:
            if key in self._templates:
                return None, False
            if key in self._making:
                return self._making[key], False
            making = self._making[key] = Future()
        try:
            if self._compilers is None:
                self._compilers = ThreadPoolExecutor(os.cpu_count() or 1, "pto-compile")
                weakref.finalize(self, self._compilers.shutdown, wait=False)
            self._compilers.submit(self._make, key, task, making)
        except Exception:  # no thread for it (the interpreter exiting, a thread limit): here
            self._make(key, task, making)
            return making, True
        except BaseException as interrupted:  # nothing may wait for it forever
            with self._templates_lock:
                del self._making[key]
            making.set_exception(interrupted)
            raise
        return making, False

    def _make(self, key: tuple, task, making: Future) -> None:
        """Make the launch of `key` into `making`, and publish it (a failure is not kept: the
        next task of the instance tries again and fails in its own name)."""
        try:
            self._enter()  # loading the code needs the device's context on this thread
            with preparing():
                made = self._prepare(task)
        except BaseException as error:
            with self._templates_lock:
                del self._making[key]
            making.set_exception(error)
            return
        with self._templates_lock:
            self._templates[key] = made
            del self._making[key]
        making.set_result(made)

    def instance(self, task) -> tuple[Instance, np.ndarray]:
        """A task as the persistent kernel runs it (executors/persistent.py): its kernel
        instance, always its generated code (never a library call or a cuBLAS GEMM), and the
        task's argument words."""
        _check_cuda(task)
        key, own, scalars = _split(task)
        made = self._instances.get(key)
        if made is None:
            call = _Call.of(task)
            code, items, integer = self._generated(task.kernel, call)
            launch = template(0, _grid(items), THREADS_PER_BLOCK, call.words, integer)
            made = self._instances[key] = Instance(code if items else None, call.dtype, launch)
        words = made.template.words.copy()
        words[made.template.task_words] = _own_words(made.template, own, scalars)
        return made, words

    def _prepare(self, task) -> Template:
        kernel = task.kernel
        call = _Call.of(task)
        shapes, scalars, params, words = call.shapes, call.scalars, call.params, call.words
        beta = getattr(kernel.cuda, "gemm", None)
        if beta is not None and all(math.prod(shape) for shape in shapes):  # before any code is made
            gemm = cublas.gemm_call([None if t is None else (t.shape, t.byte_strides, t.dtype.numpy)
                                     for t in params], beta, self.tf32)
            if gemm is not None:  # a product of three tensors, no scalars; else its own code runs
                self._blas()
                return dataclasses.replace(template(0, 1, 1, words, ()), gemm=gemm)
        code, items, integer_scalars = self._generated(kernel, call)
        if items == 0:
            return NO_WORK
        layout = [None if t is None else (t.shape, t.dtype.numpy) for t in params]
        function = self.device.function(code, kernel, layout, scalars)
        self.allow_shared(function, code.shared_bytes)
        return template(function, _grid(items), THREADS_PER_BLOCK, words, integer_scalars, code.shared_bytes)

    def _generated(self, kernel, call: _Call) -> tuple[CudaCode, int, tuple[bool, ...]]:
        """The generated code of a call's instance, its work items, and each scalar's word type."""
        code = kernel.cuda.code_for(call.shapes, call.dtype, call.scalars, self.tf32, self.block_shared)
        return code, code.items(call.shapes), cuda_abi.scalar_kinds(code.integer_scalars, call.scalars)

    def _blas(self) -> cublas.Handles:
        """The device's cuBLAS, loaded at the first GEMM, its GEMM entered in the driver's table."""
        with self._templates_lock:
            if self._blas_handles is None:
                self._blas_handles = cublas.Handles(self.device.blas(), f"cuBLAS ({self.name})")
                self._driver.addresses[GEMM] = self._blas_handles.gemm
                weakref.finalize(self, self._blas_handles.close)
            return self._blas_handles

    def blas_handle(self, stream: int) -> int:
        """The cuBLAS handle whose calls go to `stream`."""
        self._enter()
        return self._blas().of(stream)

    def _enter(self) -> None:
        """The device's context on this thread, before its first driver call here."""
        if not getattr(self._local, "entered", False):
            self.device.enter()
            self._local.entered = True

    def take_event(self) -> int:
        """An event to record (from the pool `release` refills, else a new one)."""
        try:
            return self._events.pop()  # atomic: a pool shared by the parallel executor's threads
        except IndexError:
            return self.device.event()

    def _scratch(self) -> Scratch:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = Scratch()
        return scratch

    def _thread_stream(self) -> int:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            self._enter()
            stream = self._local.stream = self.device.stream()
        return stream

    # --- streams, events and capture (see backends/__init__.py) --------------------------
    def stream(self, key) -> int:
        stream = self._streams.get(key)
        if stream is None:
            self._enter()
            stream = self._streams[key] = self.device.stream()
        return stream

    def done(self, event: int) -> bool:
        self._enter()
        return self._driver.reached(event)

    def synchronize(self, event: int, timeout: float | None = None) -> None:
        """Wait for `event`; DeadlockError after `timeout` seconds (gpu_timeout unless given)."""
        self._enter()
        self._driver.wait_until_reached(event, self.gpu_timeout if timeout is None else timeout)

    def release(self, event: int) -> None:
        timed = self._starts.pop(event, None)
        if timed is None:
            self._events.append(event)
            return
        start, clock = timed
        self._timed_events += (start, event)
        clock.users -= 1
        if clock.users == 0 and clock is not self._clock:  # an old clock no span reads any more
            self._timed_events.append(clock.event)

    def begin_capture(self, streams: list) -> None:
        """Capture everything enqueued on `streams` from here on into one CUDA graph: the
        streams fork from and join back to one origin stream, which the capture runs on."""
        self._enter()
        if self._origin is None:
            self._origin = self.device.stream()
        for stream in streams:  # a handle made while capturing would allocate in the capture
            self._blas().of(stream)
        self._driver.call("cuStreamBeginCapture_v2", self._origin, CAPTURE_MODE_RELAXED)
        self._capturing = True
        fork = self.take_event()
        try:
            self._driver.call("cuEventRecord", fork, self._origin)
            for stream in streams:
                self._driver.call("cuStreamWaitEvent", stream, fork, 0)
        except BaseException:
            self._abandon_capture()
            raise
        finally:
            self.release(fork)  # recording it again later is a new record, not the graph's edge

    def end_capture(self, streams: list, memory: tuple) -> CudaGraph:
        joins = []
        try:
            for stream in streams:
                joins.append(self.take_event())
                self._driver.call("cuEventRecord", joins[-1], stream)
                self._driver.call("cuStreamWaitEvent", self._origin, joins[-1], 0)
        except BaseException:
            self._abandon_capture()
            raise
        finally:
            self._events += joins
        self._capturing = False
        graph = ctypes.c_void_p()
        self._driver.call("cuStreamEndCapture", self._origin, ctypes.byref(graph))
        return CudaGraph(self, graph.value, self._origin, (self.device, *memory))

    def _abandon_capture(self) -> None:
        """End a capture that failed, without a graph: the failure is the error to report, so
        what the driver answers here is not looked at."""
        self._capturing = False
        graph = ctypes.c_void_p()
        if self._driver.stream_end_capture(self._origin, ctypes.byref(graph)) == 0 and graph.value:
            self._driver.graph_destroy(graph.value)


_SCALAR = ParamKind.SCALAR
_NO_WAITS = np.zeros(0, np.int64)


def _check_cuda(task) -> None:
    if task.kernel.cuda is None:
        raise PTOError(f"{task.kernel.name} has no CUDA implementation: declare it with "
                       "@pto.kernel(..., cuda=pto.CudaCode(...))")


def _own_words(launch: Template, own: list, scalars: list) -> np.ndarray:
    """A task's own words (from `_split`), its scalars made words of the types `launch` says."""
    if scalars:
        for slot, integer in zip(launch.scalar_slots, launch.integer_scalars):
            own[slot] = scalar_bits(own[slot], integer)
    return np.array(own, np.int64)


def _grid(items: int) -> int:
    """The blocks of a launch over `items` work items (a generated kernel's grid-stride loops
    take any grid; more blocks than fill a GPU only add launch cost)."""
    return min(MAX_BLOCKS, math.ceil(items / THREADS_PER_BLOCK))


@dataclasses.dataclass(frozen=True)
class Instance:
    """A kernel instance as the persistent kernel runs it: its generated code (None: it has no
    work items), element type, and the template of its argument words (launches.template),
    whose grid is the pieces a task of it runs as."""

    code: CudaCode | None
    dtype: np.dtype
    template: Template


@dataclasses.dataclass(frozen=True)
class _Call:
    """What picks a task's kernel instance: its tensors' shapes and element type, its scalars,
    and its params in order (a tensor, or None for a scalar) with each tensor's words' layout."""

    shapes: list
    dtype: np.dtype
    scalars: tuple
    params: list
    words: list

    @classmethod
    def of(cls, task) -> _Call:
        params = [None if p.kind == _SCALAR else p.value for p in task.params]
        tensors = [t for t in params if t is not None]
        if not tensors:
            raise PTOError(f"{task.kernel.name}: a CUDA kernel takes at least one tensor, to say its element "
                           "type")
        return cls([t.shape for t in tensors], tensors[0].dtype.numpy,
                   tuple(p.value for p in task.params if p.kind == _SCALAR), params,
                   [None if t is None else (t.shape, t.byte_strides, t.dtype.itemsize) for t in params])


def _split(task) -> tuple[tuple, list, list]:
    """A task's launch template key (its kernel, each tensor's shape, element strides and
    type, the scalars' kinds and those values that pick its instance), its own words in param
    order (each tensor's pointer; each scalar's value, made a word once its template says how)
    and its scalars: one pass over the params, as this runs for every task."""
    key = [task.kernel.id]
    own = []
    scalars = []
    for param in task.params:
        if param.kind is _SCALAR:
            scalars.append(param.value)
            own.append(param.value)
        else:
            tensor = param.value
            key += (tensor.repeats, tensor.strides, tensor.dtype)
            own.append(tensor.addr + tensor.start_offset * tensor.dtype.itemsize)
    if scalars:
        key.append(instance_scalars(task.kernel, tuple(scalars)))
    return tuple(key), own, scalars


class CudaGraph:
    """A captured run; `replay` launches it and waits for it on its stream (not the device)."""

    def __init__(self, backend: CudaBackend, graph: int, stream: int, memory: tuple):
        self._backend = backend
        self._stream = stream
        driver = backend.device.driver
        handles = [graph, None]  # what the finaliser frees: the graph, and its executable once made
        weakref.finalize(self, _destroy, driver, handles)
        executable = ctypes.c_void_p()
        driver.call("cuGraphInstantiateWithFlags", ctypes.byref(executable), graph, 0)
        handles[1] = self._executable = executable.value
        # A CUDA graph holds bare addresses: the memory behind them must outlive it, or arrays
        # made inside the orchestration would go back to CuPy's pool and a replay write there.
        self._memory = memory

    def replay(self) -> None:
        backend = self._backend
        backend._enter()
        driver = backend.device.driver
        done = backend.take_event()
        try:
            driver.call("cuGraphLaunch", self._executable, self._stream)
            driver.call("cuEventRecord", done, self._stream)
            driver.wait_until_reached(done, backend.gpu_timeout)
        finally:
            backend.release(done)


def _destroy(driver: Driver, handles: list) -> None:
    # Whatever they answer (a sticky fault's error, say), the handles are freed.
    graph, executable = handles
    if executable is not None:
        driver.graph_exec_destroy(executable)
    driver.graph_destroy(graph)
