"""kernels/blas.py's gemm against numpy in float64, over the layouts tile views have."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import binding
from pto_gpu.kernels import blas
from pto_gpu.kernels.blas import gemm, takes
from threadpoolctl import threadpool_limits

RNG = np.random.default_rng(0)
BIG = RNG.standard_normal((300, 300))


def views(dtype):
    """(a, b) pairs: tiles of a larger matrix (BLAS reads them in place), transposed tiles
    (column-major), single rows and columns, views with no unit-stride dim (copied first), and
    an empty inner dim."""
    big = BIG.astype(dtype)
    return [
        (big[:128, :64], big[128:192, 5:133]),
        (big[:64, :32].T, big[100:164, :16]),
        (big[:40, :50], big[:20, 200:250].T),
        (big[::2, :50][:40], big[:50, ::3][:, :20]),
        (big[1:2, :7], big[:7, 3:4]),
        (big[:5, :0], big[:0, :4]),
    ]


# float32 sums of at most 128 products of unit normals: within 1e-5 of the largest entry
# (~2^-24 per operation, growing with sqrt(k)); float64 far tighter.
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_matches_numpy_on_every_layout(dtype, accumulate):
    for a, b in views(dtype):
        start = RNG.standard_normal((a.shape[0], b.shape[1])).astype(dtype)
        out = start.copy()
        gemm(a, b, out, accumulate)
        expected = a.astype(np.float64) @ b.astype(np.float64) + (start if accumulate else 0)
        scale = max(1.0, np.abs(expected).max())
        assert np.abs(out - expected).max() <= TOLERANCE[dtype] * scale, (a.shape, a.strides, b.strides)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_output_sharing_memory_with_an_operand_gets_the_product_of_the_old_values(dtype):
    x = RNG.standard_normal((96, 96)).astype(dtype)
    w = RNG.standard_normal((96, 96)).astype(dtype)
    expected = x.astype(np.float64) + x.astype(np.float64) @ w.astype(np.float64)
    gemm(x, w, x, True)  # x += x @ w
    assert np.abs(x - expected).max() <= 1e-4 * np.abs(expected).max()
    big = RNG.standard_normal((128, 128)).astype(dtype)
    a, out = big[:64, :64], big[32:96, 32:96]  # overlapping windows of one matrix
    expected = a.astype(np.float64) @ w[:64, :64].astype(np.float64)
    gemm(a, w[:64, :64], out, False)
    assert np.abs(out - expected).max() <= 1e-4 * np.abs(expected).max()


def test_a_stride_that_is_not_a_whole_element_is_not_read_as_one():
    raw = RNG.standard_normal(64 * 12)
    odd = np.ndarray((8, 4), np.float64, raw.data, strides=(96, 12))  # 12 bytes: 1.5 elements
    b = RNG.standard_normal((4, 3))
    out = np.zeros((8, 3))
    gemm(odd, b, out, False)
    expected = np.array(odd) @ b
    assert np.abs(out - expected).max() <= 1e-12 * np.abs(expected).max()


def test_gemm_writes_only_its_view():
    c = np.zeros((8, 8), np.float32)
    gemm(np.ones((3, 2), np.float32), np.ones((2, 4), np.float32), c[2:5, 1:5], False)
    expected = np.zeros((8, 8), np.float32)
    expected[2:5, 1:5] = 2
    assert np.array_equal(c, expected)


def test_takes_only_blas_types():
    f32, f16 = np.ones((2, 2), np.float32), np.ones((2, 2), np.float16)
    assert takes(f32, f32, f32) and not takes(f16, f16, f16) and not takes(f32, f32, f32.astype(np.float64))


def test_where_numpy_brings_openblas_gemm_is_numpys_own_routine():
    """The routine is numpy's, and gives numpy's product bit for bit, where numpy's wheel brings
    scipy-openblas64."""
    numpys = blas._numpy_cblas()
    if numpys is None:
        pytest.skip("this numpy does not bring scipy-openblas64")
    assert binding.address_of_symbol("pto_cblas_sgemm") == numpys["pto_cblas_sgemm"]
    a, b = BIG[:96, :80].astype(np.float32), BIG[100:180, :72].astype(np.float32)
    out = np.empty((96, 72), np.float32)
    with threadpool_limits(1):  # (the thread count changes OpenBLAS's sums)
        gemm(a, b, out, False)
        assert np.array_equal(out, a @ b)


def test_without_numpys_openblas_gemm_is_scipys_through_adapters():
    """A process whose numpy brings no OpenBLAS of its own (none found) computes through SciPy's
    ?gemm, for every layout and both dtypes."""
    code = """
from numpy._core import _multiarray_umath
_multiarray_umath.__file__ = "/nonexistent"  # numpy's OpenBLAS not found
import numpy as np
from pto_gpu.kernels import blas
from test_blas import TOLERANCE, views
assert len(blas._ADAPTERS) == 2
for dtype in blas.DTYPES:
    for a, b in views(dtype):
        out = np.ones((a.shape[0], b.shape[1]), dtype)
        blas.gemm(a, b, out, True)
        expected = a.astype(np.float64) @ b.astype(np.float64) + 1
        assert np.abs(out - expected).max() <= TOLERANCE[dtype] * max(1.0, np.abs(expected).max())
print("OK")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.splitlines()[-1:] == ["OK"], done.stderr
