"""The CUDA backend's device without a GPU (backend="cuda-emulated"): host memory stands for
device memory and the CUDA emulator (emulator.py) is the driver, so the backend, its launch
records and its issue path run unchanged and are what is tested.

A launch runs one of two codes:
  gpu-code  the kernel's own generated CUDA source built for the host by g++ (pto_isa.cuh's host
            build: a block's threads are fibers meeting at its barriers and shuffles), entered
            through `pto_launch_<name>`, which reads the kernelParams words as a GPU kernel
            would: the default, and what checks the GPU code and its arguments, as any GPU
            from sm_80 on runs it (tensor-core products by mma.sync);
  gpu-code-sm90a  the same, as an H100 or H200 runs it (built with PTO_HOST_WGMMA: the products
            laid out for wgmma take it, pto_isa.cuh's PTO_WGMMA);
  cpu-code  the kernel instance's CPU native entry, through launches.cpu_code, which reads the
            same words: for speed, when only the scheduling is under test.
External arrays are numpy arrays (and what the CPU backend takes); `to_device` copies, as a GPU
would, so a GPU user's script runs unchanged with only the backend's name changed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
import weakref
from pathlib import Path

import numpy as np

from ..errors import PTOError
from ..kernel import CudaCode
from ..tensor import TensorDescriptor
from . import ExternalArray, cuda_abi, emulator
from .cpu import CpuBackend
from .keyed_locks import KeyedLocks
from .launches import TENSOR_WORDS, cpu_code, cpu_code_context, instance_scalars

EMULATE = ("gpu-code", "gpu-code-sm90a", "cpu-code")
WORD = 8  # every argument of the generated kernels is one 8-byte word (cuda_abi)
PERSISTENT_BLOCKS = 4


class EmulatedDevice:
    name = "cuda-emulated"
    runs_libraries = False  # CuPy's cuBLAS is not here: the matmuls run their generated code
    block_shared = cuda_abi.BLOCK_SHARED["sm_90"]  # cuda_emulator.c's MAX_DYNAMIC_SHARED: an H100's

    def __init__(self, heap_bytes: int, emulate: str = "gpu-code"):
        if emulate not in EMULATE:
            raise PTOError(f"emulate={emulate!r}; choose one of {', '.join(EMULATE)}")
        self.emulate = emulate
        self._host = CpuBackend(heap_bytes)  # the heap and the views, as on the CPU
        self.heap_base = self._host.heap_base
        self.heap_bytes = heap_bytes
        self.driver = emulator.driver()
        self._functions: dict[tuple, int] = {}
        self._kept: list = []  # host builds and cpu-code contexts whose addresses are registered
        self._lock = threading.Lock()
        # What it made, freed with it: an emulated stream is a thread, which its destruction
        # ends once its queue is empty.
        self._streams: list[int] = []
        self._events: list[int] = []
        weakref.finalize(self, _free, self.driver, self._streams, self._events)

    # --- memory: host memory ---------------------------------------------------------------
    def resolve(self, array: object) -> ExternalArray:
        return self._host.resolve(array)

    def view(self, tensor: TensorDescriptor) -> np.ndarray:
        return self._host.view(tensor)

    def to_device(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def wait_for_caller(self) -> None:
        pass  # the caller's numpy writes are done when they return

    # --- code, streams and events ----------------------------------------------------------
    def function(self, code: CudaCode, kernel, layout: list, scalars: tuple) -> int:
        words = sum(1 if param is None else TENSOR_WORDS for param in layout)
        dtype = np.dtype(next(param[1] for param in layout if param is not None))  # the first tensor's
        if self.emulate != "cpu-code":
            return self.module_function(code.source, dtype, kernel.name, words)
        key = (kernel.id, tuple(layout), instance_scalars(kernel, scalars))
        function = self._functions.get(key)  # a dict read is atomic under the GIL
        if function is None:  # built outside the lock: a run's new instances build side by side
            entry, context = self._cpu_code(code, kernel, layout, dtype, scalars)
            with self._lock:
                function = self._functions.get(key)
                if function is None:
                    function = self._functions[key] = emulator.function(entry, [WORD] * words, context)
        return function

    def module_function(self, source: Path, dtype, name: str, words: int) -> int:
        """The CUfunction of `pto_<name>` in CUDA source `source` compiled for element type
        `dtype` (None: the source defines its own), taking `words` 8-byte params: its host
        build's pto_launch_<name>."""
        key = (source, None if dtype is None else np.dtype(dtype), name)
        function = self._functions.get(key)
        if function is None:
            library = ctypes.CDLL(host_build(source, dtype, self.emulate == "gpu-code-sm90a"))
            entry = getattr(library, f"pto_launch_{name}", None)
            if entry is None:
                raise PTOError(f"{name}: emulate={self.emulate!r} runs generated CUDA code (PTO programs), "
                               f"whose pto_launch_{name} this source lacks; use emulate='cpu-code'")
            with self._lock:
                self._kept.append(library)
                function = self._functions.get(key)
                if function is None:
                    function = self._functions[key] = emulator.function(
                        ctypes.cast(entry, ctypes.c_void_p).value, [WORD] * words)
        return function

    def resident_blocks(self, function: int, shared: int) -> int:
        """Blocks of `function` the device runs at once: for the persistent kernel, whose host
        build runs its blocks side by side, each on a thread (PTO_HOST_THREADS), as many as
        make the blocks race for tasks, the wiring lock and the queue on any machine."""
        return PERSISTENT_BLOCKS

    # --- the persistent scheduler's memory (persistent_host.Memory): host memory ----------
    def mapped(self, nbytes: int) -> tuple[np.ndarray, int]:
        array = np.zeros(nbytes, np.uint8)
        return array, array.ctypes.data

    def device_words(self, nbytes: int) -> tuple[object, int]:
        return self.mapped(nbytes)

    def copy_in(self, address: int, data: np.ndarray) -> None:
        ctypes.memmove(address, data.ctypes.data, data.nbytes)

    def _cpu_code(self, code: CudaCode, kernel, layout: list, dtype, scalars: tuple) -> tuple[int, int]:
        shapes = tuple(param[0] for param in layout if param is not None)
        entry = kernel.native.entry(shapes, dtype, scalars) if kernel.native else None
        if entry is None:
            raise PTOError(f"{kernel.name}: emulate='cpu-code' runs a kernel's CPU native code, and "
                           f"this call (shapes {list(shapes)}, {dtype}) has none; use emulate='gpu-code'")
        context = cpu_code_context(entry, [None if param is None else (len(param[0]), param[1])
                                           for param in layout],
                                   cuda_abi.scalar_kinds(code.integer_scalars, scalars))
        self._kept.append(context)
        return cpu_code.address, context.ctypes.data

    def stream(self) -> int:
        stream = self.driver.new_stream()
        self._streams.append(stream)
        return stream

    def event(self, timed: bool = False) -> int:
        event = self.driver.new_event(timed)
        self._events.append(event)
        return event

    def enter(self) -> None:
        pass  # the emulator has no contexts

    def library(self, task, values: list, stream: int) -> None:
        raise AssertionError("runs_libraries is False")

    def blas(self) -> ctypes.CDLL:
        return emulator.library()  # its cuBLAS GEMM: cuda_emulator.c


def _free(driver, streams: list[int], events: list[int]) -> None:
    for stream in streams:
        driver.stream_destroy(stream)
    for event in events:
        driver.event_destroy(event)


_building = KeyedLocks()  # per target: one g++ for a build, different builds side by side
# On x86-64, thread-local variables through TLS descriptors: the persistent kernel's blocks keep
# their fiber runner and __shared__ memory per thread (PTO_HOST_THREADS), and __tls_get_addr took
# 12% of an emulated block's time; with descriptors a tiny task took 28 us a block, not 38.
HOST_FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-pthread",
              *(("-mtls-dialect=gnu2",) if platform.machine() == "x86_64" else ()))


def host_build(source: Path, dtype, wgmma: bool = False) -> str:
    """Generated CUDA source built for the host by g++ (once: cached under the source's
    digest and the element type's options); with `wgmma`, as sm_90a runs it (PTO_HOST_WGMMA)."""
    compiler = shutil.which("g++")
    if compiler is None:
        raise PTOError("emulate='gpu-code' builds each kernel's CUDA source for the host with g++, which is "
                       "not installed; install it, or use emulate='cpu-code'")
    options = (*HOST_FLAGS, *cuda_abi.compile_options(dtype, source.stem),
               *(("-DPTO_HOST_WGMMA",) if wgmma else ()))
    text = source.read_text()
    digest = hashlib.sha256("\0".join([text, *options]).encode()).hexdigest()[:24]
    target = emulator.cache_dir() / f"{source.stem}-{digest}.so"
    with _building(target):
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            command = [compiler, "-x", "c++", *options, str(source), "-o", str(partial)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                raise PTOError(f"g++ could not build {source} for the CUDA emulator:\n{done.stderr}")
            partial.replace(target)
    return str(target)
