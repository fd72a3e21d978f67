"""The dense factorisation tiles (kernels/linalg.py) through the tiled Cholesky
(orchestration/cholesky.py), against numpy's float64 Cholesky.

Tolerance: 1e-12 relative to the largest element of L. The matrices are m mᵀ + n I, so
cond(a) < 10 and L's elements are O(sqrt(n)); a float64 Cholesky is backward stable with an
error of a few n·ulp relative to ‖a‖, here ~1e-13, and the tiled and unblocked orders round
differently only within that.
"""

import numpy as np
import pytest
from pto_gpu.kernels.linalg import trsm
from pto_gpu.orchestration.cholesky import cholesky

import pto_gpu as pto


def spd(n: int, seed: int = 3) -> np.ndarray:
    m = np.random.default_rng(seed).standard_normal((n, n))
    return m @ m.T + n * np.eye(n)


@pytest.mark.parametrize("executor", ["serial", "parallel"])
@pytest.mark.parametrize("n, tile", [(384, 96), (128, 128)], ids=["strided-tiles", "one-whole-tile"])
def test_the_tiled_cholesky_is_numpys(executor, n, tile):
    a = spd(n)
    got = a.copy()
    pto.Runtime(backend="cpu", executor=executor).run(cholesky, got, tile)
    want = np.linalg.cholesky(a)
    lower = np.tril(got)
    np.testing.assert_allclose(lower, want, rtol=0, atol=1e-12 * np.abs(want).max())
    # above the diagonal: the diagonal tiles are zero, the other tiles are left as they were
    blocks = np.kron(np.eye(n // tile), np.ones((tile, tile))) > 0
    above = np.triu(np.ones((n, n), bool), 1)
    assert (got[above & blocks] == 0).all()
    np.testing.assert_array_equal(got[above & ~blocks], a[above & ~blocks])


def test_a_matrix_that_is_not_positive_definite_fails_its_potrf_with_numpys_error():
    a = spd(256)
    a[200, 200] = -1e6  # in the second diagonal tile of 128
    with pytest.raises(pto.TaskError, match="potrf") as failed:
        pto.Runtime(backend="cpu", executor="serial").run(cholesky, a, 128)
    assert isinstance(failed.value.__cause__, np.linalg.LinAlgError)
    assert "not positive definite" in str(failed.value.__cause__)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_trsm_solves_a_tile_in_place(layout):
    """a = a l⁻ᵀ against numpy's solve in float64, on a tile of its own memory (solved where it
    lies) and on a tile of a larger matrix (solved in a copy and written back), leaving the
    matrix around it and l as they were. Tolerance: cond(l)² = cond(a) < 10 (spd), so the
    backward-stable solve is within a few n·ulp of ‖x‖."""
    n = 64
    l = np.linalg.cholesky(spd(n))
    whole = np.random.default_rng(5).standard_normal((2 * n, 2 * n))
    before = whole.copy()
    a = whole[n:, :n] if layout == "strided" else whole[n:, :n].copy()
    want = np.linalg.solve(l, a.T).T
    l_before = l.copy()
    trsm.cpu(l, a)
    np.testing.assert_allclose(a, want, rtol=0, atol=1e-13 * np.abs(want).max())
    np.testing.assert_array_equal(l, l_before)
    if layout == "strided":
        untouched = np.ones(whole.shape, bool)
        untouched[n:, :n] = False
        np.testing.assert_array_equal(whole[untouched], before[untouched])
