"""Tiled Cholesky factorisation (right-looking, LAPACK's dpotrf by tiles): a symmetric positive
definite matrix's lower triangle becomes L with a = L Lᵀ, tile by tile. In a distributed run
the tiles are dealt 2-D block-cyclically over a grid of ranks (ScaLAPACK's layout), and each
task runs on the owner of the tile it updates."""

import math

from pto_gpu.kernels.linalg import gemm_nt, potrf, syrk, trsm

import pto_gpu as pto


def grid(ranks: int) -> tuple[int, int]:
    """The most square P x Q process grid of `ranks`, P <= Q (ScaLAPACK's advice): tile (i, j) of
    the lower triangle takes j + 1 tasks, so on 2 ranks alternating columns share 8 x 8 tiles'
    120 tasks 60 / 60, where alternating rows shared them 50 / 70."""
    q = max(d for d in range(1, math.isqrt(ranks) + 1) if ranks % d == 0)
    return q, ranks // q


def cholesky(o: pto.Orchestrator, a, tile: int = 256) -> None:
    """a's lower triangle = its Cholesky factor L; above the diagonal, the diagonal tiles are
    zero and the other tiles are left as they were. a is n x n, n a multiple of `tile`."""
    n = a.shape[0]
    if a.ndim != 2 or a.shape[1] != n or n % tile:
        raise pto.ParamError(f"cholesky: a must be square with a side that is a multiple of tile={tile}, "
                             f"not {a.shape}")
    A = o.external(a, owner=pto.block_cyclic_2d(tile, tile, grid(o.ranks)))
    count = n // tile

    def t(i: int, j: int):
        return A[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile]

    for k in range(count):
        o.submit(potrf, pto.inout(t(k, k)))
        for i in range(k + 1, count):
            o.submit(trsm, pto.input(t(k, k)), pto.inout(t(i, k)))
        for i in range(k + 1, count):
            o.submit(syrk, pto.input(t(i, k)), pto.inout(t(i, i)))
            for j in range(k + 1, i):
                o.submit(gemm_nt, pto.input(t(i, k)), pto.input(t(j, k)), pto.inout(t(i, j)))
