"""Dense factorisation tiles for a tiled Cholesky (orchestration/cholesky.py): POTRF, TRSM,
SYRK and GEMM on float64 tiles, LAPACK and BLAS through numpy and SciPy (which release the GIL).

CPU kernels only: a triangular factorisation or solve is not a tile instruction of the PTO ISA,
so these have no PTO program and no CUDA code (a run on the CUDA backend refuses them by name).
"""

import numpy as np
from scipy.linalg import solve_triangular

import pto_gpu as pto


@pto.kernel(worker=pto.CUBE)
def potrf(a):
    """a = its lower Cholesky factor (the upper triangle zero)."""
    a[...] = np.linalg.cholesky(a)


@pto.kernel(worker=pto.CUBE)
def trsm(l, a):
    """a = a l⁻ᵀ, l lower triangular."""
    a[...] = solve_triangular(l, a.T, lower=True).T


@pto.kernel(worker=pto.CUBE)
def syrk(a, c):
    """c -= a aᵀ."""
    c -= a @ a.T


@pto.kernel(worker=pto.CUBE)
def gemm_nt(a, b, c):
    """c -= a bᵀ."""
    c -= a @ b.T
