"""The CPU backend: the heap is one numpy allocation and views are numpy arrays.

Its streams are host threads (cpu_streams.py), so the stream executor and graph capture
work here as on the GPU.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..errors import PTOError
from ..params import ParamKind
from ..tensor import BufferKind, TensorDescriptor
from . import ExternalArray
from .cpu_streams import CpuEvent, CpuGraph, CpuStream

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

    def resolve(self, array: object) -> ExternalArray:
        if not isinstance(array, np.ndarray):
            if hasattr(array, "__cuda_array_interface__"):
                raise PTOError(f"o.external() got a GPU array ({type(array).__name__}) on the CPU "
                               "backend; copy it to the host (cupy.asnumpy) or use backend='cuda'")
            raise PTOError(f"o.external() takes a numpy array, not {type(array).__name__}")
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        low, high = np.lib.array_utils.byte_bounds(root)
        # A flat byte view of the whole owning allocation, which kernels' views are cut from.
        memory = np.frombuffer((ctypes.c_uint8 * (high - low)).from_address(low), dtype=np.uint8)
        if not root.flags.writeable:
            memory.flags.writeable = False
        return ExternalArray(low, high - low, (memory, root), array.ctypes.data,
                             array.shape, array.strides, array.dtype, bool(root.flags.writeable))

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

    def launch(self, task, stream: CpuStream) -> None:
        call = self._call(task)
        if self._captured is not None:
            self._captured.append((task, call))
        else:
            stream.call(call)

    def record(self, stream: CpuStream) -> CpuEvent:
        event = CpuEvent()
        if self._captured is not None:
            event.reach()  # order within a capture is issue order: nothing to wait for
        else:
            stream.record(event)
        return event

    def wait(self, stream: CpuStream, event: CpuEvent) -> None:
        if self._captured is None:
            stream.wait(event)

    def done(self, event: CpuEvent) -> bool:
        if not event.done():
            return False
        if event.failure is not None:
            raise event.failure
        return True

    def synchronize(self, event: CpuEvent) -> None:
        event.wait()
        self.done(event)

    def begin_capture(self, streams: list) -> None:
        self._captured = []

    def end_capture(self, streams: list) -> CpuGraph:
        graph, self._captured = CpuGraph(self._captured), None
        return graph

    def _param_view(self, param):
        if param.kind == ParamKind.SCALAR:
            return param.value
        view = self.view(param.value)
        if param.kind == ParamKind.INPUT:
            view.flags.writeable = False
        return view

    def view(self, tensor: TensorDescriptor) -> np.ndarray:
        buffer = tensor.buffer
        memory = self.heap if buffer.kind == BufferKind.HEAP else buffer.memory[0]
        offset = tensor.byte_offset + (buffer.base - self.heap_base if buffer.kind == BufferKind.HEAP else 0)
        return np.ndarray(tensor.shape, tensor.dtype.numpy, buffer=memory, offset=offset,
                          strides=tensor.byte_strides)
