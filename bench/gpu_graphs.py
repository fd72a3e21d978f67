"""Orchestrations of the GPU benchmarks (bench/test_gpu.py) whose Python submits bench/test_host.py
also times alone, on the dry executor, on any machine: so a GPU host's figure says how much of
a run the host's Python took, and the same benchmark here says how that host compares.

- `element_tasks`: SUBMITS `scale` kernels on one-element tiles, in a chain or independent.
- `gemm_in_tiles` / `gemm_in_tiles_compiled`: the N x N GEMM as GEMM_ROWS x GEMM_COLS output
  tiles of a tile kernel over all of k, submitted from Python or by compiled code.

And the figure both report: `per_task`."""

import numba
from pto_gpu.kernels.elementwise import scale

import pto_gpu as pto
from pto_gpu import jit as pj

SUBMITS = 2_000
N = 8192
GEMM_ROWS, GEMM_COLS = 1024, 128  # a task of the generated tiles' GEMM: bands of its rows


def per_task(benchmark, tasks: int = SUBMITS) -> None:
    """extra_info["us_per_task"]: a round's median time over its `tasks`."""
    benchmark.extra_info["us_per_task"] = benchmark.stats.stats.median / tasks * 1e6


def element_tasks(o, x, chain: bool):
    """SUBMITS scale kernels on one-element tiles of x (128 x 1): in a chain, each reads the
    last one's output; else all read row 0 and write rows 1.. in turn (almost no edges)."""
    X = o.external(x)
    for i in range(SUBMITS):
        source, target = (i % 2, 1 - i % 2) if chain else (0, 1 + i % 127)
        o.submit(scale, pto.input(X[source:source + 1]), pto.output(X[target:target + 1]), 1.0)


def gemm_in_tiles(o, kernel, a, b, c):
    """c = a @ b, a task of `kernel` (a, b, out) a GEMM_ROWS x GEMM_COLS tile of c, from Python."""
    A, B, C = o.external(a), o.external(b), o.external(c)
    for i in range(0, N, GEMM_ROWS):
        for j in range(0, N, GEMM_COLS):
            o.submit(kernel, pto.input(A[i:i + GEMM_ROWS]), pto.input(B[:, j:j + GEMM_COLS]),
                     pto.output(C[i:i + GEMM_ROWS, j:j + GEMM_COLS]))


@numba.njit(cache=True)
def _gemm_tiles(o, a, b, c, kernel_id):
    for i in range(0, pj.shape(c, 0), GEMM_ROWS):
        for j in range(0, pj.shape(c, 1), GEMM_COLS):
            tile = pj.narrow(pj.narrow(c, 0, i, i + GEMM_ROWS), 1, j, j + GEMM_COLS)
            pj.submit(o, kernel_id, (pj.input(pj.narrow(a, 0, i, i + GEMM_ROWS)),
                                     pj.input(pj.narrow(b, 1, j, j + GEMM_COLS)), pj.output(tile)))


def gemm_in_tiles_compiled(o, kernel, a, b, c):
    """gemm_in_tiles's tasks, in the same order, submitted by compiled code."""
    o.compiled(_gemm_tiles, o.external(a), o.external(b), o.external(c), kernel.id)
