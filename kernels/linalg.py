"""Dense factorisation tiles for a tiled Cholesky (orchestration/cholesky.py): POTRF, TRSM,
SYRK and GEMM on float64 tiles, LAPACK and BLAS through numpy and SciPy (which release the GIL).

CPU kernels only: a triangular factorisation or solve is not a tile instruction of the PTO ISA,
so these have no PTO program and no CUDA code (a run on the CUDA backend refuses them by name).
"""

import numpy as np
from scipy.linalg import solve_triangular

import pto_gpu as pto

# Seconds of a tile operation at about 20 GFLOP/s (one core of this machine kind), for
# critical-path schedules: what matters is the ratio between the four.
FLOPS = 20e9


def _cube(tensor) -> float:
    return float(tensor.shape[0]) ** 3 / FLOPS


@pto.kernel(worker=pto.CUBE, cost=lambda a: _cube(a) / 3)
def potrf(a):
    """a = its lower Cholesky factor (the upper triangle zero)."""
    a[...] = np.linalg.cholesky(a)


@pto.kernel(worker=pto.CUBE, cost=lambda l, a: _cube(a))
def trsm(l, a):
    """a = a l⁻ᵀ, l lower triangular."""
    a[...] = solve_triangular(l, a.T, lower=True).T


@pto.kernel(worker=pto.CUBE, cost=lambda a, c: _cube(c))
def syrk(a, c):
    """c -= a aᵀ."""
    c -= a @ a.T


@pto.kernel(worker=pto.CUBE, cost=lambda a, b, c: 2 * _cube(c))
def gemm_nt(a, b, c):
    """c -= a bᵀ."""
    c -= a @ b.T
