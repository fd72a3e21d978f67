"""Tiled matmul (spec 001 §9.4): C = A @ B tile by tile, with explicit alloc and free.

`tiled_matmul` is the Python orchestration (and the distributed one); `tiled_matmul_compiled`
submits the same graph from programs/matmul.pto's generated numba code, so its tasks run on
native workers (executors/native.py).
"""

import functools
import importlib.resources
import itertools

from pto_gpu.kernels.panels import PANEL
from pto_gpu.kernels.tiles import copy, matmul_acc, zero

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.errors import ParamError


def tiled_matmul(o: pto.Orchestrator, a, b, c, tile: int = 128) -> None:
    """C[i, j] = sum_k A[i, k] @ B[k, j], accumulated in a heap tile per output tile. In a
    distributed run the rows of A, B and C are in blocks over the ranks, each output tile's
    accumulator is owned with the tile, so every rank computes its block of C rows and
    receives the blocks of B the others own."""
    rows = pto.block_rows(o.ranks)
    A, B, C = o.external(a, owner=rows), o.external(b, owner=rows), o.external(c, owner=rows)
    m, k_total = A.shape
    n = B.shape[1]
    for i in interleaved(o, C, tile):
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


def tiled_matmul_compiled(o: pto.Orchestrator, a, b, c, tile: int = 128) -> None:
    """tiled_matmul's graph for float32 arrays (the program's memrefs), submitted by compiled
    code; in a distributed run placed as tiled_matmul's (the arrays in block rows, each
    accumulator owned with its tile of C: the program's `alloc ... owner`)."""
    rows = pto.block_rows(o.ranks)
    for array in (a, b, c):
        o.external(array, owner=rows)
    program().orchestration("tiled_matmul", compiled=True)(o, a, b, c, tile)


def tiled_matmul_panels(o: pto.Orchestrator, a, b, c, tile: int = 128) -> None:
    """C = A @ B for float32 arrays with B packed into panels of 32 columns, a block of `tile`
    columns at a time, in a heap buffer, so that every tile product runs on contiguous panels
    (kernels/panels.py's micro-kernel on the CPU), into a heap accumulator from which the last
    product writes C's tile; submitted by programs/matmul.pto's compiled code. The heap must
    hold a column block's panels and the accumulators of its row tiles, which the heap ring
    frees only after the panels allocated before them: (k + m) x tile x 4 bytes, 2 MB for 2048²
    in 128-column blocks (B packed whole took k x n x 4)."""
    if tile <= 0 or tile % PANEL or b.shape[1] % PANEL:
        raise ParamError(f"tiled_matmul_panels: the tile ({tile}) and B's columns ({b.shape[1]}) must be "
                         f"positive multiples of the panel width, {PANEL}")
    if c.size:  # else nothing to compute (a task's tiles are never empty)
        program().orchestration("tiled_matmul_panels", compiled=True)(o, a, b, c, tile)


@functools.cache
def program() -> isa.Program:
    text = importlib.resources.files("pto_gpu.orchestration").joinpath("programs", "matmul.pto").read_text()
    return isa.compile(isa.parse(text))


def interleaved(o: pto.Orchestrator, C: pto.TensorDescriptor, tile: int) -> list[int]:
    """C's row-tile starts, the ranks' turns interleaved (in order with one rank): every rank
    submits its own first tiles, and the transfers they need, early rather than when the
    ranks before it have submitted theirs. Each tile's sum runs in the same order either way."""
    by_rank: dict[int, list[int]] = {}
    for i in range(0, C.shape[0], tile):
        by_rank.setdefault(o.owner_of(C[i:i + 1]), []).append(i)
    turns = itertools.zip_longest(*(by_rank[rank] for rank in sorted(by_rank)))
    return [i for turn in turns for i in turn if i is not None]
