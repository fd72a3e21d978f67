"""kernels/blas.py's gemm against numpy in float64, over the layouts tile views have."""

import numpy as np
import pytest
from pto_gpu.kernels.blas import gemm, takes

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


def test_gemm_writes_only_its_view():
    c = np.zeros((8, 8), np.float32)
    gemm(np.ones((3, 2), np.float32), np.ones((2, 4), np.float32), c[2:5, 1:5], False)
    expected = np.zeros((8, 8), np.float32)
    expected[2:5, 1:5] = 2
    assert np.array_equal(c, expected)


def test_takes_only_blas_types():
    f32, f16 = np.ones((2, 2), np.float32), np.ones((2, 2), np.float16)
    assert takes(f32, f32, f32) and not takes(f16, f16, f16) and not takes(f32, f32, f32.astype(np.float64))
