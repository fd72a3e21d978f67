"""Tile products as one cuBLAS call (pto_gpu/backends/cublas.py): the emulator's cuBLAS GEMM
against numpy, through ctypes with cuBLAS's own C signature and column-major rules; which tile
layouts become a GEMM record and with which words; and the CUDA backend on the emulator running
the matmul families' tasks as GEMMs, natively from compiled orchestrations, equal to the serial
CPU executor."""

import ctypes

import ml_dtypes
import numba
import numpy as np
import pytest
from pto_gpu.kernels.tiles import matmul, matmul_acc
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled, tiled_matmul_panels

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.backends import cublas, emulator
from pto_gpu.backends.launches import TENSOR_WORDS

SUCCESS, INVALID_VALUE, EXECUTION_FAILED, NOT_SUPPORTED = 0, 7, 13, 15
OP_N, OP_T = 0, 1
BOUND_NS = 5_000_000_000
TYPES = {np.float32: 0, np.float64: 1, np.float16: 2, ml_dtypes.bfloat16: 14}


class Blas:
    """The emulator's cuBLAS, a handle on a fresh stream, and a GEMM call in its C types."""

    def __init__(self):
        self.cu = emulator.driver()
        self.lib = emulator.library()
        self.stream = self.cu.new_stream()
        handle = ctypes.c_void_p()
        assert self.lib.cublasCreate_v2(ctypes.byref(handle)) == SUCCESS
        self.handle = handle.value
        handle, stream = ctypes.c_void_p(self.handle), ctypes.c_void_p(self.stream)
        assert self.lib.cublasSetStream_v2(handle, stream) == SUCCESS
        self.gemm = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_int] * 5, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int)(
            ctypes.cast(self.lib.cublasGemmStridedBatchedEx, ctypes.c_void_p).value)

    def call(self, a, b, c, *, m, n, k, lda, ldb, ldc, strides=(0, 0, 0), batch=1, alpha=1.0, beta=0.0,
             compute=cublas.COMPUTE_32F, trans=(OP_N, OP_N), data_type=None) -> int:
        scalar = np.float64 if compute == cublas.COMPUTE_64F else np.float32
        alpha_, beta_ = np.array([alpha], scalar), np.array([beta], scalar)
        kind = TYPES[a.dtype.type] if data_type is None else data_type
        return self.gemm(self.handle, *trans, m, n, k, alpha_.ctypes.data, a.ctypes.data, kind, lda,
                         strides[0], b.ctypes.data, kind, ldb, strides[1], beta_.ctypes.data, c.ctypes.data,
                         kind, ldc, strides[2], batch, compute, -1)

    def synchronize(self) -> int:
        event = self.cu.new_event()
        self.cu.call("cuEventRecord", event, self.stream)
        status = self.lib.pto_emu_event_wait(event, BOUND_NS)
        self.cu.call("cuEventDestroy_v2", event)
        return status

    def close(self) -> None:
        self.lib.cublasDestroy_v2(ctypes.c_void_p(self.handle))
        self.cu.call("cuStreamDestroy_v2", self.stream)


@pytest.fixture
def blas():
    made = Blas()
    yield made
    emulator.reset()
    made.close()


def _rounded(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16],
                         ids=["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_emulated_gemm_is_cublas_column_major_product(blas, dtype, beta):
    """C = alpha op(A) op(B) + beta C in column-major storage with leading dims past the rows,
    against numpy in float64; with beta 0, C's old values (NaN here) are not read. Tolerance: one
    rounding of the float64 sum to the element type (the emulator sums in float64)."""
    rng = np.random.default_rng(3)
    m, n, k, lda, ldb, ldc = 5, 7, 6, 9, 8, 11
    a = rng.standard_normal(lda * k).astype(dtype)
    b = rng.standard_normal(ldb * n).astype(dtype)
    c = (np.full(ldc * n, np.nan) if beta == 0 else rng.standard_normal(ldc * n)).astype(dtype)
    old = c.copy()
    compute = cublas.COMPUTE_64F if dtype == np.float64 else cublas.COMPUTE_32F
    assert blas.call(a, b, c, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, alpha=0.5, beta=beta,
                     compute=compute) == SUCCESS
    assert blas.synchronize() == SUCCESS
    A = _rounded(a).reshape(k, lda).T[:m]  # column j of A is a[j*lda : j*lda + m]
    B = _rounded(b).reshape(n, ldb).T[:k]
    want = 0.5 * A @ B + (beta * _rounded(old).reshape(n, ldc).T[:m] if beta else 0)
    got = _rounded(c).reshape(n, ldc).T
    eps = float(np.finfo(np.float32).eps) if dtype == np.float32 else 2.0**-52 if dtype == np.float64 else \
        2.0**-10 if dtype == np.float16 else 2.0**-7
    np.testing.assert_allclose(got[:m], want, rtol=eps, atol=eps * np.abs(want).max())
    np.testing.assert_array_equal(c.reshape(n, ldc)[:, m:].view(np.uint8),
                                  old.reshape(n, ldc)[:, m:].view(np.uint8))  # past the rows: untouched


def test_the_emulated_gemm_transposes_batches_and_broadcasts(blas):
    """op = T reads A and B row by row; a batch strides through A, B and C, a stride of 0 is a
    matrix every product shares (the panel families' a)."""
    rng = np.random.default_rng(4)
    m, n, k, batch = 3, 4, 5, 3
    a = rng.standard_normal(k * m).astype(np.float32)  # A^T stored: column i of A^T is row i of A
    b = rng.standard_normal(batch * n * k).astype(np.float32)  # per batch, B^T stored (n columns of k)
    c = np.zeros(batch * m * n, np.float32)
    assert blas.call(a, b, c, m=m, n=n, k=k, lda=k, ldb=n, ldc=m, strides=(0, n * k, m * n), batch=batch,
                     trans=(OP_T, OP_T)) == SUCCESS
    assert blas.synchronize() == SUCCESS
    A = a.astype(np.float64).reshape(m, k)
    for q in range(batch):
        B = b[q * n * k:(q + 1) * n * k].astype(np.float64).reshape(k, n)
        np.testing.assert_allclose(c[q * m * n:(q + 1) * m * n].reshape(n, m).T, A @ B, rtol=1e-6, atol=1e-5)


def test_tf32_compute_rounds_the_inputs_to_ten_mantissa_bits(blas):
    """COMPUTE_32F_FAST_TF32: 1 + 2^-12 is 1 in TF32 (ties away: 1 + 2^-11 becomes 1 + 2^-10)."""
    a = np.array([1 + 2.0**-12, 1 + 2.0**-11], np.float32)
    b = np.array([1.0, 1.0], np.float32)
    c = np.zeros(1, np.float32)
    for compute, want in ((cublas.COMPUTE_32F, (1 + 2.0**-12) + (1 + 2.0**-11)),
                          (cublas.COMPUTE_32F_FAST_TF32, 1 + (1 + 2.0**-10))):
        assert blas.call(a, b, c, m=1, n=1, k=2, lda=1, ldb=2, ldc=1, compute=compute) == SUCCESS
        assert blas.synchronize() == SUCCESS
        assert c[0] == np.float32(want)


def test_the_emulated_gemm_refuses_what_cublas_refuses(blas):
    x = np.zeros(64, np.float32)
    assert blas.call(x, x, x, m=4, n=4, k=4, lda=3, ldb=4, ldc=4) == INVALID_VALUE  # lda < m
    assert blas.call(x, x, x, m=-1, n=4, k=4, lda=4, ldb=4, ldc=4) == INVALID_VALUE
    assert blas.call(x, x, x, m=4, n=4, k=4, lda=4, ldb=4, ldc=4, compute=cublas.COMPUTE_64F) == NOT_SUPPORTED
    assert blas.call(x, x, x, m=4, n=4, k=4, lda=4, ldb=4, ldc=4, data_type=TYPES[np.float16],
                     compute=cublas.COMPUTE_32F_FAST_TF32) == NOT_SUPPORTED
    emulator.fail_launch(1)  # the GEMM's kernel cannot launch
    assert blas.call(x, x, x, m=4, n=4, k=4, lda=4, ldb=4, ldc=4) == EXECUTION_FAILED


# --- which tile layouts are one cuBLAS call ----------------------------------------------------
def _layout(*arrays):
    return [(x.shape, x.strides, x.dtype) for x in arrays]


def test_a_row_major_product_is_cublas_transposed_product():
    """c (m x n) = a @ b is cuBLAS's C^T = B^T A^T: its A is b, its B is a, sizes (n, m, k),
    leading dims the row strides; the pointers come from the launch's words (a, b, c in order)."""
    big = np.zeros((64, 100), np.float32)
    a, b, c = big[:8, :5], big[10:15, 20:26], big[30:38, 40:46]
    call = cublas.gemm_call(_layout(a, b, c), 1.0, tf32=False)[0]
    assert (call["batch"], call["m"], call["n"], call["k"]) == (1, 6, 8, 5)
    assert (call["lda"], call["ldb"], call["ldc"]) == (100, 100, 100)
    assert (call["a_word"], call["b_word"], call["c_word"]) == (TENSOR_WORDS, 0, 2 * TENSOR_WORDS)
    assert call["data_type"] == 0 and call["compute_type"] == cublas.COMPUTE_32F
    assert np.frombuffer(ctypes.string_at(int(call["beta"]), 4), np.float32)[0] == 1
    tf32 = cublas.gemm_call(_layout(a, b, c), 0.0, tf32=True)[0]
    assert tf32["compute_type"] == cublas.COMPUTE_32F_FAST_TF32
    assert np.frombuffer(ctypes.string_at(int(tf32["beta"]), 4), np.float32)[0] == 0


def test_panels_are_one_batched_call_and_what_cublas_cannot_take_is_refused():
    a = np.zeros((8, 5), np.float64)
    b = np.zeros((3, 5, 32), np.float64)
    out = np.zeros((8, 96), np.float64).reshape(8, 3, 32).transpose(1, 0, 2)  # a SPLIT view
    call = cublas.gemm_call(_layout(a, b, out), 0.0, tf32=True)[0]
    assert (call["batch"], call["stride_a"], call["stride_b"], call["stride_c"]) == (3, 5 * 32, 0, 32)
    assert call["ldc"] == 96 and call["compute_type"] == cublas.COMPUTE_64F  # TF32 is float32's
    square = np.zeros((6, 6), np.float32)
    for refused in ((square.T, square, square),  # a column-major a
                    (square, square[:, ::2][:3], square[:, :3]),  # b's columns strided
                    (square.astype(np.int32),) * 3,  # no cuBLAS GEMM of int32
                    (square, square, square.astype(np.float64))):  # mixed types
        assert cublas.gemm_call(_layout(*refused), 0.0, tf32=False) is None


# --- the backend on the emulator -----------------------------------------------------------------
def _operands(rt, dtype, m=96, k=80, n=64, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    return a, b, [rt.backend.to_device(x) for x in (a, b, np.zeros((m, n), dtype))]


@pytest.mark.parametrize("executor", ["serial", "parallel", "stream"])
def test_tile_products_run_as_cublas_calls_and_equal_the_serial_cpu_executor(executor):
    """Every product of the tiled matmul is one GEMM (no kernel of its own compiled, one launch
    each: no temporary; on the stream executor, which issues the compiled orchestration
    natively, the products of a row of tiles are one call); the result is the serial CPU
    executor's within float32's rounding of the sums."""
    want = np.zeros((96, 64), np.float32)
    rt = pto.Runtime(backend="cuda-emulated", executor=executor, workers={pto.CUBE: 2, pto.VECTOR: 2})
    a, b, device = _operands(rt, np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, want, tile=32)
    bound = 2**-22 * (np.abs(a.astype(np.float64)) @ np.abs(b)) + 2**-40
    for _ in range(2):  # the second run's products are all learnt: on the stream executor all native
        before = emulator.launches()
        result = rt.run(tiled_matmul_compiled, *device, tile=32)
        # One launch a task (a GEMM's included), or a batch's, on the stream executor.
        batches = result.native_launches if executor == "stream" else result.num_tasks
        assert emulator.launches() - before == batches <= result.num_tasks
        assert np.all(np.abs(rt.backend.to_host(device[2]) - want) <= bound)
    products = [launch for key, launch in rt.backend._templates.items() if key[0] == matmul_acc.id]
    assert products and all(launch.gemm[0]["batch"] == 1 and launch.function == 0 for launch in products)
    if executor == "stream":
        assert result.native_tasks == result.num_tasks and result.native_launches < result.num_tasks / 2


def test_a_product_cublas_cannot_take_runs_its_generated_kernel():
    """A transposed left operand (its rows not contiguous) is not cuBLAS's layout: the family's
    own CUDA code runs it, with the same result."""
    rng = np.random.default_rng(5)
    stored = rng.standard_normal((24, 16)).astype(np.float32)  # a = stored.T
    b = rng.standard_normal((24, 8)).astype(np.float32)

    def product(o, stored, b, c):
        o.submit(matmul, pto.input(o.external(stored).T), pto.input(o.external(b)), pto.output(o.external(c)))

    rt = pto.Runtime(backend="cuda-emulated")
    device = [rt.backend.to_device(x) for x in (stored, b, np.zeros((16, 8), np.float32))]
    rt.run(product, *device)
    launches = [launch for key, launch in rt.backend._templates.items() if key[0] == matmul.id]
    assert len(launches) == 1 and launches[0].gemm[0]["batch"] == 0 and launches[0].function != 0
    want = stored.T.astype(np.float64) @ b
    np.testing.assert_allclose(rt.backend.to_host(device[2]), want, rtol=1e-5, atol=1e-5)


def test_panel_products_are_batched_cublas_calls():
    """64-column blocks: each product is two panels' in one call (a broadcast, C a SPLIT view)."""
    want = np.zeros((64, 128), np.float32)
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 128)).astype(np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul_panels, a, b, want, tile=64)
    rt = pto.Runtime(backend="cuda-emulated", executor="stream")
    device = [rt.backend.to_device(x) for x in (a, b, np.zeros_like(want))]
    rt.run(tiled_matmul_panels, *device, tile=64)
    assert any(launch.gemm[0]["batch"] > 1 for launch in rt.backend._templates.values())
    bound = 2**-22 * (np.abs(a.astype(np.float64)) @ np.abs(b)) + 2**-40
    assert np.all(np.abs(rt.backend.to_host(device[2]) - want) <= bound)


@numba.njit(cache=True)
def _products(o, a, b, c, tile, matmul_id, backwards=False):
    """c = a @ b by c's tiles in row-major order (each row `backwards`: from its last tile), each
    one product over all of k (a row of tiles: consecutive independent products whose pointers
    advance, or go back, by one tile)."""
    width = pj.shape(c, 1)
    for i in range(0, pj.shape(c, 0), tile):
        for jj in range(0, width, tile):
            j = width - tile - jj if backwards else jj
            rows, columns = pj.narrow(a, 0, i, i + tile), pj.narrow(b, 1, j, j + tile)
            out = pj.narrow(pj.narrow(c, 0, i, i + tile), 1, j, j + tile)
            pj.submit(o, matmul_id, (pj.input(rows), pj.input(columns), pj.output(out)), ())


@numba.njit(cache=True)
def _two_products(o, a1, b1, c1, a2, b2, c2, tile, matmul_id):
    _products(o, a1, b1, c1, tile, matmul_id, False)
    _products(o, a2, b2, c2, tile, matmul_id, False)


@pytest.mark.parametrize("backwards", [False, True], ids=["forwards", "backwards"])
def test_independent_tile_products_go_out_as_one_strided_batched_gemm(backwards):
    """A compiled orchestration's row of independent tile products (batched launches,
    executors/driver_streams.py) is one strided-batched cuBLAS call, right on every tile. A row
    walked backwards would need negative strides, which cuBLAS does not document: the launch
    led by a row's last tile takes those below it instead (steps forward), a column a call."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 32)).astype(np.float32)
    rt = pto.Runtime(backend="cuda-emulated", executor="stream")
    device = [rt.backend.to_device(m) for m in (a, b, np.zeros((64, 32), np.float32))]

    def products(o, a, b, c):
        o.compiled(_products, o.external(a), o.external(b), o.external(c), 16, matmul.id, backwards)

    rt.run(products, *device)
    result = rt.run(products, *device)
    # 4 x 2 tiles: forwards 4 rows of 2; backwards 2 columns of 4.
    assert result.native_tasks == 8 and result.native_launches == (2 if backwards else 4)
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(rt.backend.to_host(device[2]), want, rtol=1e-5, atol=1e-5)


def test_a_learnt_gemm_serves_only_tiles_of_its_leading_dims():
    """Tiles of the same shapes in matrices of other widths (row strides 64 and 32): the GEMM
    learnt from the first (keyed by shapes) must not run the second's, whose leading dims differ:
    on the stream executor's native path they go the Python way, and both products are right."""
    rng = np.random.default_rng(2)
    a1, a2 = (rng.standard_normal((32, 48)).astype(np.float32) for _ in range(2))
    b1, b2 = (rng.standard_normal((48, width)).astype(np.float32) for width in (64, 32))

    def two(o, *arrays):
        o.compiled(_two_products, *(o.external(x) for x in arrays), 16, matmul.id)

    rt = pto.Runtime(backend="cuda-emulated", executor="stream")
    device = [rt.backend.to_device(m) for m in (a1, b1, np.zeros((32, 64), np.float32), a2, b2,
                                                 np.zeros((32, 32), np.float32))]
    result = rt.run(two, *device)
    assert result.native_tasks == 7  # the first product's other tiles; none of the second's
    for (a, b), c in (((a1, b1), device[2]), ((a2, b2), device[5])):
        np.testing.assert_allclose(rt.backend.to_host(c), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_a_capture_whose_first_products_are_gemms_replays_them():
    """A fresh runtime's first run is a capture: the cuBLAS handles are made before it begins."""
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 64)).astype(np.float32)
    rt = pto.Runtime(backend="cuda-emulated")
    device = [rt.backend.to_device(m) for m in (a, b, np.zeros((64, 64), np.float32))]
    replay = rt.capture(tiled_matmul, *device, tile=32)
    assert any(launch.gemm[0]["batch"] for launch in rt.backend._templates.values())
    device[2][:] = 0
    replay.replay()
    bound = 2**-22 * (np.abs(a.astype(np.float64)) @ np.abs(b)) + 2**-40
    assert np.all(np.abs(rt.backend.to_host(device[2]) - a.astype(np.float64) @ b) <= bound)


@pytest.mark.parametrize("executor", ["serial", "stream"])
def test_a_gemm_that_cannot_launch_is_the_task_error_of_its_task(executor):
    rt = pto.Runtime(backend="cuda-emulated", executor=executor)
    _, _, device = _operands(rt, np.float32, 32, 32, 32)
    rt.run(tiled_matmul, *device, tile=32)  # zero, product, copy: the instances made
    emulator.fail_launch(2)  # the product's
    try:
        with pytest.raises(pto.TaskError, match=r"task 1 \(matmul_acc\) failed: CudaError: cublasGemm"
                                                r"StridedBatchedEx failed: CUBLAS_STATUS_EXECUTION_FAILED"):
            rt.run(tiled_matmul, *device, tile=32)
    finally:
        emulator.reset()
