"""Tiled matmul (spec 001 §9.4): C = A @ B tile by tile, with explicit alloc and free."""

from pto_gpu.kernels.tiles import copy, matmul_acc, zero

import pto_gpu as pto


def tiled_matmul(o: pto.Orchestrator, a, b, c, tile: int = 128) -> None:
    """C[i, j] = sum_k A[i, k] @ B[k, j], accumulated in a heap tile per output tile."""
    A, B, C = o.external(a), o.external(b), o.external(c)
    m, k_total = A.shape
    n = B.shape[1]
    for i in range(0, m, tile):
        for j in range(0, n, tile):
            rows, cols = min(tile, m - i), min(tile, n - j)
            acc = o.alloc((rows, cols), C.dtype)
            o.submit(zero, pto.output(acc))
            for k in range(0, k_total, tile):
                depth = min(tile, k_total - k)
                o.submit(matmul_acc, pto.input(A[i:i + rows, k:k + depth]),
                         pto.input(B[k:k + depth, j:j + cols]), pto.inout(acc))
            o.submit(copy, pto.input(acc), pto.output(C[i:i + rows, j:j + cols]))
            o.free(acc)
