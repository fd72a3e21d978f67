"""Tiled matmul (spec 001 §9.4): C = A @ B tile by tile, with explicit alloc and free."""

from pto_gpu.kernels.tiles import copy, matmul_acc, zero

import pto_gpu as pto


def tiled_matmul(o: pto.Orchestrator, a, b, c, tile: int = 128) -> None:
    """C[i, j] = sum_k A[i, k] @ B[k, j], accumulated in a heap tile per output tile. In a
    distributed run the rows of A, B and C are in blocks over the ranks, each output tile's
    accumulator is owned with the tile, so every rank computes its block of C rows and
    receives the blocks of B the others own."""
    rows = pto.block_rows(o.ranks)
    A, B, C = o.external(a, owner=rows), o.external(b, owner=rows), o.external(c, owner=rows)
    m, k_total = A.shape
    n = B.shape[1]
    for i in range(0, m, tile):
        for j in range(0, n, tile):
            rows, cols = min(tile, m - i), min(tile, n - j)
            acc = o.alloc((rows, cols), C.dtype, owner=o.owner_of(C[i:i + rows, j:j + cols]))
            o.submit(zero, pto.output(acc))
            for k in range(0, k_total, tile):
                depth = min(tile, k_total - k)
                o.submit(matmul_acc, pto.input(A[i:i + rows, k:k + depth]),
                         pto.input(B[k:k + depth, j:j + cols]), pto.inout(acc))
            o.submit(copy, pto.input(acc), pto.output(C[i:i + rows, j:j + cols]))
            o.free(acc)
