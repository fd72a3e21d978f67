"""The CPU backend: the heap is one numpy allocation and views are numpy arrays.

Its streams are host threads (cpu_streams.py), so the stream executor and graph capture
work here as on the GPU.
"""

from __future__ import annotations

import ctypes
import functools
import time

import numpy as np

from ..errors import PTOError
from ..params import ParamKind
from ..tensor import TensorDescriptor
from . import ExternalArray, ExternalMemory, locate
from .cpu_streams import CpuEvent, CpuGraph, CpuStream
from .interop import dlpack_device, extent, on_device, torch_storage, wrong_side

HEAP_ALIGN = 64


class CpuBackend:
    name = "cpu"

    def __init__(self, heap_bytes: int):
        raw = np.zeros(heap_bytes + HEAP_ALIGN, dtype=np.uint8)  # calloc: pages zeroed lazily
        skip = -raw.ctypes.data % HEAP_ALIGN
        self.heap = raw[skip:skip + heap_bytes]
        self.heap_base = self.heap.ctypes.data
        self.heap_bytes = heap_bytes
        self._streams: dict[object, CpuStream] = {}
        self._captured: list | None = None  # the calls of the run being captured
        self._events: list[CpuEvent] = []  # handed back by the stream executor, to record again

    def resolve(self, array: object) -> ExternalArray:
        host = _as_numpy(array)
        root = host
        while isinstance(root.base, np.ndarray):  # numpy views share their base
            root = root.base
        low, high = torch_storage(array) or extent(root.ctypes.data, root.shape, root.strides, root.itemsize)
        # A flat byte view of the whole owning allocation, which kernels' views are cut from.
        # It does not keep the allocation alive (ctypes over an address): `keep` does.
        handle = np.frombuffer((ctypes.c_uint8 * (high - low)).from_address(low), dtype=np.uint8)
        writeable = bool(root.flags.writeable)
        handle.flags.writeable = writeable
        return ExternalArray(low, high - low, ExternalMemory(handle, (root, array)), host.ctypes.data,
                             host.shape, host.strides, host.dtype, writeable)

    def to_device(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def wait_for_caller(self) -> None:
        pass  # numpy has finished writing an array when the call that writes it returns

    def run(self, task) -> None:
        """Run a task's CPU implementation on views of its tensor params.

        Input params are read-only views, so a kernel that writes one fails loudly instead of
        racing with the tasks the dependency analysis let run beside it.
        """
        self._call(task)()

    def _call(self, task) -> functools.partial:
        return functools.partial(task.kernel.cpu, *(self._param_view(p) for p in task.params))

    # --- streams and capture (see backends/__init__.py) ----------------------------------
    def stream(self, key) -> CpuStream:
        stream = self._streams.get(key)
        if stream is None or stream.failed:  # a failed run's streams are not the next run's
            stream = self._streams[key] = CpuStream(f"pto-stream-{key}")
        return stream

    def enqueue(self, task, stream: CpuStream, after: list[CpuEvent], timed: bool = False) -> CpuEvent:
        call = self._call(task)
        event = self._events.pop() if self._events else CpuEvent()
        if timed:
            call = functools.partial(_timed, call, event)
        if self._captured is not None:
            self._captured.append((task, call))
            event.reach()  # order within a capture is issue order: nothing to wait for
            return event
        for producer in after:
            stream.wait(producer)
        stream.call(call)
        stream.record(event)
        return event

    def span(self, event: CpuEvent) -> tuple[float, float]:
        return event.started, event.ended

    def done(self, event: CpuEvent) -> bool:
        if not event.done():
            return False
        if event.failure is not None:
            raise event.failure
        return True

    def synchronize(self, event: CpuEvent) -> None:
        event.wait()
        self.done(event)

    def release(self, event: CpuEvent) -> None:
        # Safe to clear: it was reached, so its stream is done with it, and no queued wait
        # refers to it (the executor's promise), so no stream thread will look at it again.
        event.reset()
        self._events.append(event)

    def begin_capture(self, streams: list) -> None:
        self._captured = []

    def end_capture(self, streams: list, memory: tuple) -> CpuGraph:
        graph, self._captured = CpuGraph(self._captured, (self.heap, *memory)), None
        return graph

    def _param_view(self, param):
        if param.kind == ParamKind.SCALAR:
            return param.value
        tensor = param.value
        views = tensor._host_views
        if views is None:  # cut once per descriptor: tiles recur (a chain's, a weight's), and a cut is ~2 us
            writeable = self.view(tensor)
            read_only = writeable.view()
            read_only.flags.writeable = False
            views = (writeable, read_only)
            object.__setattr__(tensor, "_host_views", views)  # a cache: the descriptor is immutable
        # A new array object per call, over the same memory: a kernel may reshape its own.
        return views[param.kind == ParamKind.INPUT].view()

    def view(self, tensor: TensorDescriptor) -> np.ndarray:
        memory, offset = locate(tensor, self.heap, self.heap_base)
        return np.ndarray(tensor.shape, tensor.dtype.numpy, buffer=memory, offset=offset,
                          strides=tensor.byte_strides)


def _timed(call: functools.partial, event: CpuEvent) -> None:
    """`call` on its stream's thread, its start and end noted in `event` (CpuBackend.span)."""
    event.started = time.perf_counter()
    call()
    event.ended = time.perf_counter()


def _as_numpy(array: object) -> np.ndarray:
    """The caller's array as numpy, in place: a numpy array, host DLPack, __array_interface__."""
    if isinstance(array, np.ndarray):
        return array
    if on_device(array):
        raise wrong_side(array, "cpu")
    if dlpack_device(array) is not None:
        try:
            return np.from_dlpack(array)  # a read-only export gives a read-only array
        except (BufferError, TypeError, ValueError, RuntimeError) as error:
            raise PTOError(f"o.external(): numpy cannot take the {type(array).__name__} in place by "
                           f"DLPack: {error}") from error
    if hasattr(array, "__array_interface__"):
        return np.asarray(array)
    raise PTOError(f"o.external() takes a numpy array or an array with __array_interface__ or a host "
                   f"__dlpack__ (PyTorch, JAX, ...), not {type(array).__name__}")
