"""A GPU as the CUDA backend's device: CuPy owns the memory (the heap is its own cudaMalloc),
the modules (NVRTC through RawModule) and the streams and events; the backend calls the driver
on their handles (cuda.py). External arrays are CuPy arrays or any array with
`__cuda_array_interface__` or a CUDA `__dlpack__`."""

from __future__ import annotations

import ctypes
import threading
import warnings
import weakref
from pathlib import Path

import numpy as np

from ..errors import PTOError
from ..kernel import CudaCode
from ..tensor import TensorDescriptor
from . import ExternalArray, ExternalMemory, cuda_abi, locate, wgmma_probe
from .driver import libcuda
from .interop import dlpack_device, dlpack_read_only, extent, on_device, torch_storage, wrong_side
from .keyed_locks import KeyedLocks

LEGACY_STREAM = 1  # DLPack's name for CUDA's legacy default stream


class CupyDevice:
    name = "cuda"
    runs_libraries = True

    def __init__(self, heap_bytes: int):
        import cupy  # imported here so that the CPU path never needs CuPy

        self._cupy = cupy
        self._heap = cupy.cuda.Memory(heap_bytes)  # its own cudaMalloc: fixed addresses, no pool
        cupy.cuda.runtime.memset(self._heap.ptr, 0, heap_bytes)
        self.heap_base = self._heap.ptr
        self.heap_bytes = heap_bytes
        self._device_id = cupy.cuda.runtime.getDevice()
        self.block_shared = cupy.cuda.runtime.deviceGetAttribute(cuda_abi.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                                                 self._device_id)
        self.driver = libcuda()
        self._modules: dict[tuple[Path, np.dtype], object] = {}
        self._functions: dict[tuple[Path, np.dtype, str], object] = {}
        self._kept: list = []  # the CuPy streams and events whose handles the backend holds
        self._compiling = KeyedLocks()  # per module: NVRTC runs once for it, modules side by side
        self._wgmma: bool | None = None  # whether generated code takes wgmma here (wgmma()), once asked
        self._wgmma_asked = threading.Lock()

    # --- memory ----------------------------------------------------------------------------
    def resolve(self, array: object) -> ExternalArray:
        device_array, readonly = self._as_cupy(array)
        data = device_array.data
        if data.device_id != self._device_id:  # its kernels would read another GPU's memory
            raise PTOError(f"an array on GPU {data.device_id} given to a runtime on GPU {self._device_id}: "
                           "move it there first (cupy.asarray under cupy.cuda.Device"
                           f"({self._device_id}))")
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
        return self._cupy.asarray(array)

    def to_host(self, array) -> np.ndarray:
        return self._cupy.asnumpy(array)

    def wait_for_caller(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()

    # --- code, streams and events ------------------------------------------------------------
    def function(self, code: CudaCode, kernel, layout: list, scalars: tuple) -> int:
        dtype = next(param[1] for param in layout if param is not None)
        return self.module_function(code.source, dtype, kernel.name, 0)

    def module_function(self, source: Path, dtype, name: str, words: int) -> int:
        """The CUfunction of `pto_<name>` in CUDA source `source` compiled for element type
        `dtype` (None: the source defines its own) (its params are the kernel's own: `words` is
        the emulator's to know)."""
        key = (source, None if dtype is None else np.dtype(dtype), name)
        function = self._functions.get(key)  # a dict read is atomic under the GIL
        if function is None:
            # CuPy compiles a module at its first get_function, NVRTC without the GIL, so modules
            # compile side by side; a module once at a time.
            with self._compiling(key[:2]):
                module = self._modules.get(key[:2])
                if module is None:
                    text = source.read_text()
                    options = cuda_abi.nvrtc_options(source.parent, dtype, name)
                    if dtype is not None and "PTO_WGMMA_CUH" in text and self.wgmma():
                        options = (*options, wgmma_probe.SM_90A)  # its products laid out for wgmma take it
                    module = self._modules[key[:2]] = self._cupy.RawModule(code=text, options=options)
                function = self._functions[key] = module.get_function(cuda_abi.symbol(name))
        return function.kernel.ptr  # a RawKernel's Function: the CUfunction, loaded on this device

    def wgmma(self) -> bool:
        """Whether generated code is built for sm_90a here, its products laid out for wgmma taking
        it (docs/ISA.md): on a GPU of compute capability 9.0 (H100, H200) whose wgmma gives the
        probe's products (wgmma_probe.disagreement), asked once. Where it does not, a warning
        says why and the products take mma.sync, as on other GPUs; a probe whose launch fails
        raises, as a kernel's fault would."""
        with self._wgmma_asked:  # compiles run on threads of their own: one probe
            if self._wgmma is None:
                device = self._cupy.cuda.Device(self._device_id)
                if device.compute_capability != "90":
                    self._wgmma = False
                    return False
                with device:
                    why = wgmma_probe.disagreement(self._cupy)
                if why is not None:
                    warnings.warn(f"wgmma on this GPU does not give the probe's products ({why}): the "
                                  "generated kernels' products take mma.sync instead", RuntimeWarning,
                                  stacklevel=2)
                self._wgmma = why is None
            return self._wgmma

    def resident_blocks(self, function: int, shared: int) -> int:
        """Blocks of `function` (of THREADS_PER_BLOCK threads, `shared` bytes of dynamic shared
        memory) the GPU holds at once: its occupancy per SM times the SMs."""
        driver = self._cupy.cuda.driver
        threads = cuda_abi.THREADS_PER_BLOCK
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared)
        return max(1, per_sm) * self._cupy.cuda.Device(self._device_id).attributes["MultiProcessorCount"]

    # --- the persistent scheduler's memory (persistent_host.Memory) ------------------------
    def mapped(self, nbytes: int) -> tuple[np.ndarray, int]:
        """Pinned, mapped host memory (write-back: the host's release stores are plain ones):
        under unified addressing its device address is its host address."""
        runtime = self._cupy.cuda.runtime
        address = runtime.hostAlloc(nbytes, runtime.hostAllocMapped)
        buffer = (ctypes.c_uint8 * nbytes).from_address(address)
        weakref.finalize(buffer, runtime.freeHost, address)  # every view of it keeps it
        array = np.frombuffer(buffer, np.uint8)
        array[:] = 0
        return array, address

    def device_words(self, nbytes: int) -> tuple[object, int]:
        memory = self._cupy.cuda.Memory(nbytes)
        return memory, memory.ptr

    def copy_in(self, address: int, data: np.ndarray) -> None:
        runtime = self._cupy.cuda.runtime
        runtime.memcpy(address, data.ctypes.data, data.nbytes, runtime.memcpyHostToDevice)
        # From pageable memory cudaMemcpy returns once `data` is staged, its DMA perhaps still
        # under way on the legacy stream, which the kernel's non-blocking stream does not wait for.
        runtime.streamSynchronize(0)

    def stream(self) -> int:
        stream = self._cupy.cuda.Stream(non_blocking=True)
        self._kept.append(stream)
        return stream.ptr

    def event(self, timed: bool = False) -> int:
        event = self._cupy.cuda.Event(disable_timing=not timed)
        self._kept.append(event)
        return event.ptr

    def enter(self) -> None:
        # cudaSetDevice makes the device's primary context (CuPy's) current on this thread,
        # which the driver calls need.
        self._cupy.cuda.runtime.setDevice(self._device_id)

    def library(self, task, values: list, stream: int) -> None:
        with self._cupy.cuda.ExternalStream(stream):
            task.kernel.cuda.library(*values)

    def blas(self) -> ctypes.CDLL:
        self._cupy.cuda.device.get_cublas_handle()  # CuPy loads its libcublas: the one its wheel brings
        return ctypes.CDLL(_loaded("libcublas.so"))


def _loaded(name: str) -> str:
    """The path of the library this process has loaded whose file name starts with `name`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if Path(path).name.startswith(name):
                return path
    raise PTOError(f"{name} is not loaded in this process: CuPy's cuBLAS was not found")
