"""Dense factorisation tiles for a tiled Cholesky (orchestration/cholesky.py): POTRF, TRSM,
SYRK and GEMM on float64 tiles, LAPACK and BLAS through numpy and SciPy (which release the GIL).

CPU kernels only: a triangular factorisation or solve is not a tile instruction of the PTO ISA,
so these have no PTO program and no CUDA code (a run on the CUDA backend refuses them by name).
"""

import numpy as np
from scipy.linalg import get_blas_funcs, get_lapack_funcs

import pto_gpu as pto

# Seconds of a tile operation at about 20 GFLOP/s (one core of this machine kind), for
# critical-path schedules: what matters is the ratio between the four.
FLOPS = 20e9


def _cube(tensor) -> float:
    return float(tensor.shape[0]) ** 3 / FLOPS


@pto.kernel(worker=pto.CUBE, cost=lambda a: _cube(a) / 3)
def potrf(a):
    """a = its lower Cholesky factor (the upper triangle zero); np.linalg.LinAlgError if a is
    not positive definite, as numpy's cholesky says (a tile factored in place is then left
    part done, where numpy's left it as it was: the run has failed either way)."""
    # LAPACK on aᵀ, which Fortran order reads as a's own memory: 2.3x numpy's cholesky on a
    # 256² tile, which copies a into and out of Fortran order around the same call.
    upper, info = get_lapack_funcs("potrf", (a,))(a.T, lower=False, clean=True, overwrite_a=True)
    if info > 0:
        raise np.linalg.LinAlgError(f"Matrix is not positive definite (its leading minor of order {info})")
    if info < 0:
        raise ValueError(f"potrf: LAPACK refused argument {-info}")
    if not np.may_share_memory(upper, a):  # a strided tile: f2py worked on a copy
        a[...] = upper.T


@pto.kernel(worker=pto.CUBE, cost=lambda l, a: _cube(a))
def trsm(l, a):
    """a = a l⁻ᵀ, l lower triangular."""
    # x lᵀ = a as l xᵀ = aᵀ: BLAS's trsm from the left on aᵀ, which Fortran order reads as the
    # memory of a (or of its C-order copy, for a strided tile) and solves in place. On a
    # strided 256² tile, in a tiled Cholesky's run, 0.95 ms against 1.01 from the right, where
    # f2py copies a into Fortran order and back (SciPy's solve_triangular: more still).
    rows = np.ascontiguousarray(a)
    solve = get_blas_funcs("trsm", (l, rows))
    solved = solve(1.0, np.ascontiguousarray(l).T, rows.T, side=0, lower=False, trans_a=1, overwrite_b=True)
    if not np.may_share_memory(solved, a):
        a[...] = solved.T


@pto.kernel(worker=pto.CUBE, cost=lambda a, c: _cube(c))
def syrk(a, c):
    """c -= a aᵀ."""
    c -= a @ a.T


@pto.kernel(worker=pto.CUBE, cost=lambda a, b, c: 2 * _cube(c))
def gemm_nt(a, b, c):
    """c -= a bᵀ."""
    c -= a @ b.T
