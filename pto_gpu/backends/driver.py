"""The CUDA driver API as the CUDA backend calls it: the driver's functions typed (the calls
made once in a while: streams, events, capture) and a table of their addresses for the calls
made per task from numba (launches.CALLS). The library is libcuda on a GPU and the emulator
(emulator.py) without one: the same names and C signatures, so the backend cannot tell them
apart."""

from __future__ import annotations

import ctypes
import re
import time

import numpy as np

from ..errors import DeadlockError, PTOError
from ..polling import pause
from .launches import CALLS

CUBLAS_STATUS_NAMES = {1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
                       7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH",
                       11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
                       14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED"}

SUCCESS, NOT_READY = 0, 600
STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED: other threads may call the driver meanwhile
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

_int, _uint, _handle = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
_deviceptr = ctypes.c_ulonglong

# The driver functions the backend calls, by their names in libcuda.so.1, as ctypes prototypes.
# (A name of NEWER is loaded under its newer name where the library has it.)
SIGNATURES: dict[str, type] = {
    "cuInit": ctypes.CFUNCTYPE(_int, _uint),
    "cuStreamCreate": ctypes.CFUNCTYPE(_int, ctypes.POINTER(_handle), _uint),
    "cuStreamDestroy_v2": ctypes.CFUNCTYPE(_int, _handle),
    "cuStreamSynchronize": ctypes.CFUNCTYPE(_int, _handle),
    "cuStreamQuery": ctypes.CFUNCTYPE(_int, _handle),
    "cuStreamWaitEvent": ctypes.CFUNCTYPE(_int, _handle, _handle, _uint),
    "cuEventCreate": ctypes.CFUNCTYPE(_int, ctypes.POINTER(_handle), _uint),
    "cuEventDestroy_v2": ctypes.CFUNCTYPE(_int, _handle),
    "cuEventRecord": ctypes.CFUNCTYPE(_int, _handle, _handle),
    "cuEventQuery": ctypes.CFUNCTYPE(_int, _handle),
    "cuEventSynchronize": ctypes.CFUNCTYPE(_int, _handle),
    "cuEventElapsedTime": ctypes.CFUNCTYPE(_int, ctypes.POINTER(ctypes.c_float), _handle, _handle),
    "cuFuncSetAttribute": ctypes.CFUNCTYPE(_int, _handle, _int, _int),
    "cuLaunchKernel": ctypes.CFUNCTYPE(_int, _handle, *[_uint] * 7, _handle, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_void_p)),
    "cuMemsetD8Async": ctypes.CFUNCTYPE(_int, _deviceptr, ctypes.c_ubyte, ctypes.c_size_t, _handle),
    "cuMemcpyAsync": ctypes.CFUNCTYPE(_int, _deviceptr, _deviceptr, ctypes.c_size_t, _handle),
    "cuGetErrorName": ctypes.CFUNCTYPE(_int, _int, ctypes.POINTER(ctypes.c_char_p)),
    "cuStreamBeginCapture_v2": ctypes.CFUNCTYPE(_int, _handle, _int),
    "cuStreamEndCapture": ctypes.CFUNCTYPE(_int, _handle, ctypes.POINTER(_handle)),
    "cuStreamIsCapturing": ctypes.CFUNCTYPE(_int, _handle, ctypes.POINTER(_int)),
    "cuGraphInstantiateWithFlags": ctypes.CFUNCTYPE(_int, ctypes.POINTER(_handle), _handle,
                                                    ctypes.c_ulonglong),
    "cuGraphLaunch": ctypes.CFUNCTYPE(_int, _handle, _handle),
    "cuGraphExecDestroy": ctypes.CFUNCTYPE(_int, _handle),
    "cuGraphDestroy": ctypes.CFUNCTYPE(_int, _handle),
}
DRIVER_FUNCTIONS = tuple(SIGNATURES)
# The same call's later versions (CUDA 12.8's cuEventElapsedTime_v2: the same arguments and
# answers, without the errors of earlier asynchronous work, which the executors get elsewhere).
NEWER = {"cuEventElapsedTime": "cuEventElapsedTime_v2"}



class CudaError(PTOError):
    """A CUDA driver call failed: `status` is its CUresult."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _attribute(name: str) -> str:
    """cuStreamWaitEvent -> stream_wait_event; the ABI version (_v2) is left off."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name[2:].removesuffix("_v2")).lower()


def _exported(library: ctypes.CDLL, name: str) -> str:
    """The name `library` exports call `name` under: its newer version's (NEWER) if it has it."""
    newer = NEWER.get(name)
    return newer if newer is not None and hasattr(library, newer) else name


class Driver:
    """The driver functions of one library (libcuda, or the emulator), typed, as attributes
    named without `cu`, in snake case and without `_v2` (stream_create, launch_kernel, ...);
    calls release the GIL. `addresses` is the table numba code calls through (launches.CALLS)."""

    def __init__(self, library: ctypes.CDLL, label: str):
        self.label = label  # "libcuda" or "the CUDA emulator", for messages
        self._functions = {name: SIGNATURES[name]((_exported(library, name), library))
                           for name in DRIVER_FUNCTIONS}
        for name, function in self._functions.items():
            setattr(self, _attribute(name), function)
        # cuBLAS's GEMM is not the driver's: the backend enters it when it loads cuBLAS.
        self.addresses = np.array([self.address(name) if name in SIGNATURES else 0 for name in CALLS],
                                  np.int64)

    def address(self, name: str) -> int:
        """The address of driver function `name` (as in DRIVER_FUNCTIONS)."""
        return ctypes.cast(self._functions[name], ctypes.c_void_p).value

    def call(self, name: str, *args) -> None:
        """Driver function `name`(*args); CudaError unless it succeeded."""
        self.check(self._functions[name](*args), name)

    def check(self, status: int, call: str) -> None:
        """CudaError for a call's non-zero CUresult, named by this library's cuGetErrorName."""
        if status != SUCCESS:
            if call.startswith("cublas"):  # a cublasStatus_t
                name = CUBLAS_STATUS_NAMES.get(status, "an unknown cuBLAS status")
                raise CudaError(f"{call} failed: {name} ({status})", status)
            raise CudaError(f"{call} failed: {self.error_name(status)} ({status}) from {self.label}", status)

    def error_name(self, status: int) -> str:
        name = ctypes.c_char_p()
        if self._functions["cuGetErrorName"](status, ctypes.byref(name)) != SUCCESS or name.value is None:
            return "unknown CUDA error"
        return name.value.decode()

    def new_stream(self) -> int:
        handle = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(handle), STREAM_NON_BLOCKING)
        return handle.value

    def new_event(self, timed: bool = False) -> int:
        """A new event; `timed`: one whose records cuEventElapsedTime measures (`elapsed`)."""
        handle = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(handle), 0 if timed else EVENT_DISABLE_TIMING)
        return handle.value

    def elapsed(self, start: int, end: int) -> float:
        """Seconds from timed event `start` being reached to timed event `end` (both reached);
        the driver's resolution is ~0.5 us, and a float of milliseconds."""
        ms = ctypes.c_float()
        self.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value / 1e3

    def reached(self, event: int) -> bool:
        """Whether `event` was reached; CudaError for a kernel that failed before it."""
        status = self._functions["cuEventQuery"](event)
        if status == NOT_READY:
            return False
        self.check(status, "cuEventQuery")
        return True

    def wait_until_reached(self, event: int, timeout: float) -> None:
        """Block until `event` is reached, polling (a kernel that never ends would hang
        cuEventSynchronize) as polling.pause says: yielding for 50 us, then sleeping an eighth of
        what it has waited, at most 1 ms, so that a wait of a few ms (a run's end on a GPU) ends
        within an eighth of its length of the event; DeadlockError after `timeout` seconds."""
        started = time.perf_counter()
        while not self.reached(event):
            waited = time.perf_counter() - started
            if waited > timeout:
                raise DeadlockError(f"a CUDA event was not reached within {timeout:g} s: a kernel that does "
                                    "not end, or a stream waiting for work that never comes (for kernels "
                                    "that run longer, raise rt.backend.gpu_timeout, in seconds)")
            pause(waited)


def libcuda() -> Driver:
    """The GPU's driver."""
    try:
        return Driver(ctypes.CDLL("libcuda.so.1"), "libcuda")
    except OSError as error:
        raise PTOError(f"cannot load the CUDA driver (libcuda.so.1): {error}") from error
