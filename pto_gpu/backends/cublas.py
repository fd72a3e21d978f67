"""cuBLAS as the CUDA backend calls it: a matmul family's tile product (`CudaInstances.gemm`)
as one cuBLAS call, made per task from numba through the library's function pointer, without
CuPy, a view or a temporary.

The call is cublasGemmStridedBatchedEx for every product: one GEMM is a batch of one, the
panel families' `out[q] = a @ b[q]` a batch over the panels with a's stride 0, and a batched
launch of independent tile products (executors/driver_streams.py) a batch over the tasks. Its
sizes, leading dims, strides and types are one instance's (`gemm_call`, a launches.GEMM_CALL
record, made once); a task's tensors' pointers come from its launch's argument words
(launches.py), so a GEMM task is issued as a kernel launch is. Row-major tiles are column-major transposes, so
c = a @ b + beta c is cuBLAS's C^T = B^T A^T + beta C^T: cuBLAS's A is our b and its B our a.

A handle per stream (`Handles`): one handle shared by streams would share its workspace between
kernels that may run at once. The library is CuPy's libcublas on a GPU and the CUDA emulator
without one (the same names and C signatures).
"""

from __future__ import annotations

import ctypes
import threading

import ml_dtypes
import numpy as np

from ..errors import PTOError
from .driver import CUBLAS_STATUS_NAMES
from .launches import GEMM_CALL, TENSOR_WORDS

# cudaDataType and cublasComputeType_t (library_types.h, cublas_api.h).
DATA_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2,
              np.dtype(ml_dtypes.bfloat16): 14}
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77
INT_MAX = 2**31 - 1

# alpha = 1 and beta = 0 or 1 as cuBLAS reads them (host memory, in the compute type: TF32's
# is float), kept for the life of the process.
_SCALARS = {(compute, value): np.array([value], np.float64 if compute == COMPUTE_64F else np.float32)
            for compute in (COMPUTE_32F, COMPUTE_64F) for value in (0.0, 1.0)}


def gemm_call(layout: list, beta: float, tf32: bool) -> np.ndarray | None:
    """The GEMM_CALL record of a product c = a @ b + beta c whose params are `layout` (shape, byte
    strides, numpy dtype of a, b, c, in order: matrices, or a matrix a and batches of matrices b
    and c), or None where cuBLAS cannot take it (a row not contiguous, an element type it has
    no GEMM of, a size past its int) and the kernel's own code runs."""
    if len(layout) != 3 or any(param is None for param in layout):
        return None
    (a_shape, a_strides, a_type), (b_shape, b_strides, b_type), (c_shape, c_strides, c_type) = layout
    dtype = np.dtype(a_type)
    if dtype not in DATA_TYPES or {np.dtype(b_type), np.dtype(c_type)} != {dtype} or len(a_shape) != 2:
        return None
    batched = len(b_shape) == 3
    if len(c_shape) != len(b_shape) or (batched and b_shape[0] != c_shape[0]):
        return None
    rows, depth = a_shape
    columns = c_shape[-1]
    if b_shape[-2:] != (depth, columns) or c_shape[-2:] != (rows, columns):
        return None
    itemsize = dtype.itemsize
    leading = []
    for (height, width), strides in ((a_shape, a_strides), (b_shape[-2:], b_strides[-2:]),
                                     (c_shape[-2:], c_strides[-2:])):
        row_step, column_step = (stride // itemsize for stride in strides)
        if width > 1 and column_step != 1 or height > 1 and row_step < width:
            return None  # not a row-major matrix with contiguous rows
        leading.append(max(1, width, row_step if height > 1 else width))
    lda, ldb, ldc = leading
    stride_b = b_strides[0] // itemsize if batched else 0
    stride_c = c_strides[0] // itemsize if batched else 0
    if max(rows, depth, columns, lda, ldb, ldc) > INT_MAX or (batched and b_shape[0] > INT_MAX):
        return None
    compute = COMPUTE_64F if dtype == np.float64 else COMPUTE_32F
    call = np.zeros(1, GEMM_CALL)
    row = call[0]
    row["batch"] = b_shape[0] if batched else 1
    row["m"], row["n"], row["k"] = columns, rows, depth
    row["a_word"], row["b_word"], row["c_word"] = TENSOR_WORDS, 0, 2 * TENSOR_WORDS
    row["lda"], row["ldb"], row["ldc"] = ldb, lda, ldc  # cuBLAS's A is our b, its B our a
    row["stride_a"], row["stride_b"], row["stride_c"] = stride_b, 0, stride_c
    row["data_type"] = DATA_TYPES[dtype]
    row["compute_type"] = COMPUTE_32F_FAST_TF32 if tf32 and dtype == np.float32 else compute
    row["alpha"] = _SCALARS[compute, 1.0].ctypes.data
    row["beta"] = _SCALARS[compute, float(beta)].ctypes.data
    return call


class Handles:
    """cuBLAS handles of one library, one per stream, made at a stream's first GEMM and
    destroyed with this object. `gemm` is the address numba code calls."""

    def __init__(self, library: ctypes.CDLL, label: str):
        self._label = label
        self._create = library.cublasCreate_v2
        self._create.argtypes, self._create.restype = (ctypes.POINTER(ctypes.c_void_p),), ctypes.c_int
        self._set_stream = library.cublasSetStream_v2
        self._set_stream.argtypes, self._set_stream.restype = (ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int
        self._destroy = library.cublasDestroy_v2
        self._destroy.argtypes, self._destroy.restype = (ctypes.c_void_p,), ctypes.c_int
        self.gemm = ctypes.cast(library.cublasGemmStridedBatchedEx, ctypes.c_void_p).value
        self._handles: dict[int, int] = {}
        self._lock = threading.Lock()

    def of(self, stream: int) -> int:
        """The handle whose calls go to `stream` (the caller has the device's context current)."""
        handle = self._handles.get(stream)  # a dict read is atomic under the GIL
        if handle is None:
            with self._lock:
                handle = self._handles.get(stream)
                if handle is None:
                    made = ctypes.c_void_p()
                    self._check(self._create(ctypes.byref(made)), "cublasCreate_v2")
                    self._check(self._set_stream(made, stream), "cublasSetStream_v2")
                    handle = self._handles[stream] = made.value
        return handle

    def close(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                self._destroy(handle)  # whatever it answers (a sticky fault's error), the handle goes
            self._handles.clear()

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            name = CUBLAS_STATUS_NAMES.get(status, "an unknown cuBLAS status")
            raise PTOError(f"{call} failed: {name} ({status}) from {self._label}")
