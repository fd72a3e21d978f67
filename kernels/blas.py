"""GEMM for the matmul families' CPU library: BLAS called from numba code, without the GIL.

`gemm(a, b, out, accumulate)` computes out = a @ b (or out += a @ b) for float32 and float64
views straight on their memory: BLAS reads the strided tiles of a large matrix in place and
accumulates into `out` (beta = 1), with no temporary; a view with no unit-stride dim is copied
first, and an output that shares memory with an operand gets a product of its own. Being
numba code, it runs the same on a Python worker and inside a native worker's loop
(executors/native.py), so both give the same bits.

The routine is CBLAS's ?gemm (64-bit ints) under the names `pto_cblas_sgemm` and
`pto_cblas_dgemm`, which this module gives, before any code that calls them is loaded (cached
code names them, not an address), the address of numpy's own BLAS where numpy brings OpenBLAS
(its wheels' scipy-openblas64): the library numpy's products run, and the faster of the two
OpenBLAS builds a process loads (256² float32 products on strided tiles 15-20% faster than
SciPy's, OpenBLAS 0.3.31 against 0.3.30, a Xeon). Elsewhere they are adapters to SciPy's
?gemm, the one numba's own np.dot calls (through numba's helper library), which the generated
CPU code's products still use.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding, ir
from numba import cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numpy._core import _multiarray_umath
from scipy.linalg import cython_blas

# numba_xxgemm loads these on first use and reports a failure only as a status, which a native
# worker could not raise: refuse to import without them instead.
if not {"sgemm", "dgemm"} <= set(cython_blas.__pyx_capi__):
    raise ImportError("kernels/blas.py needs SciPy's BLAS (scipy.linalg.cython_blas sgemm and dgemm)")

DTYPES = (np.float32, np.float64)
_COL_MAJOR, _NO_TRANSPOSE, _TRANSPOSE = 102, 111, 112  # CBLAS's
_ROUTINES = {types.float32: "pto_cblas_sgemm", types.float64: "pto_cblas_dgemm"}
_NUMPY_NAMES = {"pto_cblas_sgemm": "scipy_cblas_sgemm64_", "pto_cblas_dgemm": "scipy_cblas_dgemm64_"}


def takes(*arrays: np.ndarray) -> bool:
    """Whether gemm takes these operands' dtype: one of DTYPES, the same for all (their dims are
    the calling family's, which refuses other ranks before its library runs)."""
    dtype = arrays[0].dtype
    return dtype in DTYPES and all(a.dtype == dtype for a in arrays)


@intrinsic
def _cblas_gemm(typingctx, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """pto_cblas_?gemm in column-major order, for the dtype of alpha and beta, with every
    pointer passed as an integer address."""
    ints = (transa, transb, m, n, k, a, lda, b, ldb, c, ldc)
    if not all(isinstance(t, types.Integer) for t in ints) or alpha != beta or alpha not in _ROUTINES:
        return None
    name = _ROUTINES[alpha]

    def codegen(context, builder, signature, values):
        enum, size, pointer = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        scalar = context.get_value_type(alpha)
        shape = (enum, enum, enum, size, size, size, scalar, pointer, size, pointer, size, scalar, pointer,
                 size)
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), shape), name)
        # every integer as an int64 first (whatever width the caller's), then as the routine takes it
        wide = [context.cast(builder, v, t, types.int64) if isinstance(t, types.Integer) else v
                for v, t in zip(values, signature.args)]
        arguments = [ir.Constant(enum, _COL_MAJOR), *wide]
        converted = [builder.trunc(v, t) if t == enum else builder.inttoptr(v, t) if t == pointer else v
                     for v, t in zip(arguments, shape)]
        builder.call(function, converted)
        return context.get_dummy_value()

    return types.void(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), codegen


@intrinsic
def _xxgemm(typingctx, kind, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """numba's own `numba_xxgemm` (its helper library: SciPy's ?gemm, loaded on first use),
    with every pointer passed as an integer address."""
    args = (kind, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    if not all(isinstance(t, types.Integer) for t in args):
        return None
    char, size, pointer = ir.IntType(8), ir.IntType(64), ir.IntType(8).as_pointer()
    shape = (char, char, char, size, size, size, pointer, pointer, size, pointer, size, pointer, pointer,
             size)

    def codegen(context, builder, signature, values):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), shape),
                                                  "numba_xxgemm")
        converted = [builder.trunc(v, t) if t == char else builder.inttoptr(v, t) if t == pointer else v
                     for v, t in zip(values, shape)]
        return builder.call(function, converted)

    return types.int32(*args), codegen


def _scipy_adapter(dtype: type):
    """A C function of pto_cblas_?gemm's signature (column-major only) over SciPy's ?gemm."""
    scalar = types.float32 if dtype == np.float32 else types.float64
    kind, itemsize = ord("s" if dtype == np.float32 else "d"), np.dtype(dtype).itemsize
    i32, i64 = types.int32, types.int64
    signature = types.void(i32, i32, i32, i64, i64, i64, scalar, i64, i64, i64, i64, scalar, i64, i64)

    @cfunc(signature, cache=True)
    def adapter(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        factors = np.empty(2, dtype)  # BLAS takes alpha and beta by address
        factors[0], factors[1] = alpha, beta
        address = factors.ctypes.data
        _xxgemm(kind, ord("N") if transa == _NO_TRANSPOSE else ord("T"),
                ord("N") if transb == _NO_TRANSPOSE else ord("T"), m, n, k, address, a, lda, b, ldb,
                address + itemsize, c, ldc)

    return adapter


def _numpy_cblas() -> dict[str, int] | None:
    """The addresses of numpy's own BLAS's CBLAS sgemm and dgemm, where numpy's wheels bring
    scipy-openblas64; None elsewhere. Looked up through numpy's extension module, whose
    handle's symbols include the libraries it loaded: the BLAS numpy runs, not a file beside it."""
    try:
        library = ctypes.CDLL(_multiarray_umath.__file__)
        return {name: ctypes.cast(getattr(library, numpy_name), ctypes.c_void_p).value
                for name, numpy_name in _NUMPY_NAMES.items()}
    except (OSError, AttributeError):
        return None


def _give_routines() -> None:
    addresses = _numpy_cblas()
    if addresses is None:
        _ADAPTERS.extend(_scipy_adapter(dtype) for dtype in DTYPES)  # kept: the symbols point into them
        for adapter, dtype in zip(_ADAPTERS, DTYPES):
            _check_adapter(adapter, dtype)
        addresses = {name: adapter.address for name, adapter in zip(_ROUTINES.values(), _ADAPTERS)}
    for name, address in addresses.items():
        binding.add_symbol(name, address)


def _check_adapter(adapter, dtype: type) -> None:
    """A 1x1 product through the adapter, here under the GIL: its first call loads SciPy's
    routine (numba's helper takes the GIL for that), and one that cannot would leave a worker's
    output unwritten, with no error."""
    one = np.ones(1, dtype)
    out = np.zeros(1, dtype)
    adapter.ctypes(_COL_MAJOR, _NO_TRANSPOSE, _NO_TRANSPOSE, 1, 1, 1, 2.0, one.ctypes.data, 1,
                   one.ctypes.data, 1, 0.0, out.ctypes.data, 1)
    if out[0] != 2:
        raise ImportError("kernels/blas.py: SciPy's ?gemm did not compute through numba's helper")


_ADAPTERS: list = []
_give_routines()


@njit(nogil=True, cache=True)
def gemm(a, b, out, accumulate):
    """out = a @ b, or out += a @ b with `accumulate`, for 2-d float32 or float64 a (m, k),
    b (k, n) and out (m, n) of one dtype."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        if not accumulate:
            out[...] = 0
        return
    # BLAS writes its output while it reads the operands: an output sharing memory with one
    # (a task may name the same array as input and inout) goes through a product of its own.
    if overlaps(out, a) or overlaps(out, b) or not _blas_gemm(a, b, out, accumulate):
        product = np.empty((m, n), out.dtype)
        if not _blas_gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), product, False):
            raise RuntimeError("BLAS gemm failed")  # unreachable: BLAS takes contiguous operands
        if accumulate:
            out += product
        else:
            out[...] = product


@njit(nogil=True, cache=True, inline="always")
def _operand(x):
    """How BLAS reads the row-major matrix x as its column-major transpose: (transpose flag,
    leading dimension), or (0, 0) when x has no unit-stride dim (in elements, not bytes)."""
    rows, cols = x.shape
    itemsize = x.itemsize
    row_bytes, col_bytes = x.strides[0], x.strides[1]
    if (cols == 1 or col_bytes == itemsize) and row_bytes % itemsize == 0:
        ld = row_bytes // itemsize if rows > 1 else cols
        if ld >= max(1, cols):
            return _NO_TRANSPOSE, ld
    if (rows == 1 or row_bytes == itemsize) and col_bytes % itemsize == 0:
        ld = col_bytes // itemsize if cols > 1 else rows
        if ld >= max(1, rows):
            return _TRANSPOSE, ld
    return 0, 0


@njit(nogil=True, cache=True, inline="always")
def overlaps(x, y):
    """Whether the byte ranges of two non-empty views meet (conservative for interleaved ones)."""
    x_low, x_high = _extent(x)
    y_low, y_high = _extent(y)
    return x_low < y_high and y_low < x_high


@njit(nogil=True, cache=True, inline="always")
def _extent(x):
    low = high = x.ctypes.data
    for dim in range(x.ndim):
        span = (x.shape[dim] - 1) * x.strides[dim]
        if span < 0:
            low += span
        else:
            high += span
    return low, high + x.itemsize


def _blas_gemm(a, b, out, accumulate):
    """Whether BLAS computed it (the layouts it reads); False leaves `out` untouched."""


@overload(_blas_gemm)
def _blas_gemm_impl(a, b, out, accumulate):
    if a.dtype not in _ROUTINES or not (a.dtype == b.dtype == out.dtype):
        return None
    scalar = np.float32 if a.dtype == types.float32 else np.float64

    def run(a, b, out, accumulate):
        m, k = a.shape
        n = b.shape[1]
        flag_a, lda = _operand(a)
        flag_b, ldb = _operand(b)
        flag_out, ldc = _operand(out)
        if flag_a == 0 or flag_b == 0 or flag_out != _NO_TRANSPOSE:
            return False
        # Row-major out = a @ b is column-major out^T = b^T @ a^T: BLAS gets b first, and each
        # operand as the column-major transpose _operand describes.
        _cblas_gemm(flag_b, flag_a, n, m, k, scalar(1), b.ctypes.data, ldb, a.ctypes.data, lda,
                    scalar(1 if accumulate else 0), out.ctypes.data, ldc)
        return True

    return run
