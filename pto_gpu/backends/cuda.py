"""The CUDA backend: the heap ring is one device allocation and views are CuPy arrays.

Two ways to run a task. `run` (serial and parallel executors) launches on the calling
thread's own non-blocking stream and waits on that stream, never the device, before the
executor completes the task. `launch` (stream executor) only enqueues on a given stream;
`record`/`wait`/`done` are CUDA events, which order streams and tell the executor when to
retire tasks. A kernel's CUDA code is generated from its PTO program (a kernel family picks
the instance of the call's shapes: CudaCode.code_for), compiled by NVRTC once per source and
element type; a kernel with a `library` implementation (cuBLAS through CuPy) runs that
instead, except while capturing a CUDA graph, where CuPy refuses cuBLAS.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np

from ..errors import PTOError
from ..kernel import preparing
from ..params import ParamKind
from ..tensor import TensorDescriptor
from . import ExternalArray, ExternalMemory, cuda_abi, locate
from .interop import dlpack_device, dlpack_read_only, extent, on_device, torch_storage, wrong_side

THREADS_PER_BLOCK = 256
MAX_BLOCKS = 4096  # kernels loop over their work items, so more blocks only add launch cost
LEGACY_STREAM = 1  # DLPack's name for CUDA's legacy default stream
NOT_READY = 600  # cudaErrorNotReady: an event not reached yet


class CudaBackend:
    name = "cuda"

    def __init__(self, heap_bytes: int):
        import cupy  # imported here so that the CPU path never needs CuPy

        self._cupy = cupy
        self._heap = cupy.cuda.Memory(heap_bytes)  # its own cudaMalloc: fixed addresses, no pool
        cupy.cuda.runtime.memset(self._heap.ptr, 0, heap_bytes)
        self.heap_base = self._heap.ptr
        self.heap_bytes = heap_bytes
        self._modules: dict[tuple[Path, np.dtype], object] = {}
        self._functions: dict[tuple[Path, np.dtype, str], object] = {}
        self._modules_lock = threading.Lock()
        self._events: list = []  # handed back by the stream executor, to record again
        self._local = threading.local()
        self._streams: dict[object, object] = {}
        self._origin = None  # the stream a capture begins and ends on
        self._capturing = False

    # --- memory --------------------------------------------------------------------------
    def resolve(self, array: object) -> ExternalArray:
        device_array, readonly = self._as_cupy(array)
        data = device_array.data
        storage = torch_storage(array)
        if isinstance(array, self._cupy.ndarray):
            owner = data.mem  # the allocation (a memory pool chunk, say) its views share
        else:  # a foreign array: its allocation as its library tells it, else its own extent
            low, high = storage or extent(data.ptr, device_array.shape, device_array.strides,
                                          device_array.itemsize)
            owner = self._cupy.cuda.UnownedMemory(low, high - low, array, data.device_id)
        return ExternalArray(owner.ptr, owner.size, ExternalMemory(owner, (device_array, array)), data.ptr,
                             device_array.shape, device_array.strides, device_array.dtype, not readonly)

    def _as_cupy(self, array: object) -> tuple[object, bool]:
        """The caller's array as CuPy, in place, and whether its memory is read-only."""
        if not on_device(array):
            if isinstance(array, np.ndarray) or dlpack_device(array) is not None or \
                    hasattr(array, "__array_interface__"):
                raise wrong_side(array, "cuda")
            raise PTOError(f"o.external() takes a CuPy array or an array with __cuda_array_interface__ or a "
                           f"CUDA __dlpack__ (PyTorch, JAX, ...), not {type(array).__name__}")
        if hasattr(array, "__cuda_array_interface__"):
            readonly = array.__cuda_array_interface__["data"][1]
            return (array if isinstance(array, self._cupy.ndarray) else self._cupy.asarray(array)), readonly
        # DLPack: take the capsule here (on the caller's stream, as cupy.from_dlpack does) to
        # read its read-only flag, which CuPy ignores.
        stream = self._cupy.cuda.get_current_stream().ptr or LEGACY_STREAM
        try:
            capsule = array.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:  # a producer of DLPack before 1.0
            capsule = array.__dlpack__(stream=stream)
        readonly = dlpack_read_only(capsule)  # before CuPy consumes (renames) the capsule
        return self._cupy.from_dlpack(capsule), readonly

    def view(self, tensor: TensorDescriptor):
        memory, offset = locate(tensor, self._heap, self.heap_base)
        pointer = self._cupy.cuda.MemoryPointer(memory, offset)
        return self._cupy.ndarray(tensor.shape, tensor.dtype.numpy, pointer, strides=tensor.byte_strides)

    def to_device(self, array: np.ndarray):
        """A device copy of a host array, for orchestrations' arguments."""
        return self._cupy.asarray(array)

    def to_host(self, array) -> np.ndarray:
        return self._cupy.asnumpy(array)

    def wait_for_caller(self) -> None:
        """Wait for the caller's current stream: the runtime's streams are non-blocking, so
        they would not wait for the copies and fills that made the inputs on their own."""
        self._cupy.cuda.get_current_stream().synchronize()

    # --- kernels -------------------------------------------------------------------------
    def run(self, task) -> None:
        """Run a task's CUDA implementation on this thread's stream and wait for it there."""
        stream = self._thread_stream()
        self.launch(task, stream)
        stream.synchronize()

    def launch(self, task, stream) -> None:
        """Enqueue a task's CUDA implementation on `stream`."""
        kernel = task.kernel
        if kernel.cuda is None:
            raise PTOError(f"{kernel.name} has no CUDA implementation: declare it with "
                           "@pto.kernel(..., cuda=pto.CudaCode(...))")
        with stream:
            values = [p.value if p.kind == ParamKind.SCALAR else self.view(p.value) for p in task.params]
            if kernel.cuda.library is not None and not self._capturing:
                kernel.cuda.library(*values)
            else:
                self._launch(task, values)

    def _launch(self, task, values: list) -> None:
        kernel = task.kernel
        tensors = [v for p, v in zip(task.params, values) if p.kind != ParamKind.SCALAR]
        shapes = [t.shape for t in tensors]
        scalars = tuple(v for p, v in zip(task.params, values) if p.kind == ParamKind.SCALAR)
        code = kernel.cuda.code_for(shapes, tensors[0].dtype, scalars)
        function = self._function(code, kernel.name, tensors[0].dtype)
        items = code.items(shapes)
        if items == 0:
            return
        args = []
        integers = iter(code.integer_scalars or [None] * len(scalars))
        for param, value in zip(task.params, values):
            if param.kind == ParamKind.SCALAR:
                args.append(cuda_abi.scalar_word(value, next(integers)))
            else:
                args += [value, *cuda_abi.tensor_words(value.shape, value.strides, value.itemsize)]
        blocks = min(MAX_BLOCKS, math.ceil(items / THREADS_PER_BLOCK))
        function((blocks,), (THREADS_PER_BLOCK,), tuple(args))

    def _function(self, code, name: str, dtype):
        key = (code.source, np.dtype(dtype), name)
        function = self._functions.get(key)  # a dict read is atomic under the GIL
        if function is None:
            with preparing(), self._modules_lock:  # worker threads share the compiled modules
                module_key = key[:2]
                module = self._modules.get(module_key)
                if module is None:
                    options = cuda_abi.nvrtc_options(code.source.parent, dtype, name)
                    module = self._modules[module_key] = self._cupy.RawModule(
                        code=code.source.read_text(), options=options)
                function = self._functions[key] = module.get_function(cuda_abi.symbol(name))
        return function

    def _thread_stream(self):
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = self._cupy.cuda.Stream(non_blocking=True)
        return stream

    # --- streams, events and capture (see backends/__init__.py) --------------------------
    def stream(self, key):
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self._cupy.cuda.Stream(non_blocking=True)
        return stream

    def record(self, stream):
        # Recording again is safe: a wait already enqueued waits for the record it saw.
        event = self._events.pop() if self._events else self._cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def done(self, event) -> bool:
        return event_done(self._cupy.cuda.runtime, event)

    def synchronize(self, event) -> None:
        event.synchronize()  # cudaEventSynchronize, whose status CuPy checks

    def release(self, event) -> None:
        self._events.append(event)

    def begin_capture(self, streams: list) -> None:
        """Capture everything enqueued on `streams` from here on into one CUDA graph: the
        streams fork from and join back to one origin stream, which the capture runs on."""
        if self._origin is None:
            self._origin = self._cupy.cuda.Stream(non_blocking=True)
        self._origin.begin_capture()
        self._capturing = True
        fork = self.record(self._origin)
        for stream in streams:
            stream.wait_event(fork)

    def end_capture(self, streams: list, memory: tuple) -> CudaGraph:
        try:
            for stream in streams:
                self._origin.wait_event(self.record(stream))
        finally:
            self._capturing = False
            graph = self._origin.end_capture()  # ends the capture even when a join failed
        return CudaGraph(graph, self._origin, (self._heap, *memory))


def event_done(runtime, event) -> bool:
    """Whether `event` was reached, from `runtime` (cupy.cuda.runtime): raises the error of a
    kernel that faulted before it. CuPy's Event.done is False for every status but success,
    so a fault would stay unseen until some later, unrelated call failed."""
    status = runtime.eventQuery(event.ptr)
    if status == NOT_READY:
        return False
    runtime.check_status(status)  # raises CUDARuntimeError unless cudaSuccess
    return True


class CudaGraph:
    """A captured run; `replay` launches it and waits for it on its stream (not the device)."""

    def __init__(self, graph, stream, memory: tuple):
        self._graph = graph
        self._stream = stream
        # A CUDA graph holds bare addresses: the memory behind them must outlive it, or arrays
        # made inside the orchestration would go back to CuPy's pool and a replay write there.
        self._memory = memory

    def replay(self) -> None:
        self._graph.launch(self._stream)
        self._stream.synchronize()
