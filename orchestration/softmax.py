"""Row-wise softmax in five tasks per row tile (the dump in spec 003 §5.1)."""

from pto_gpu.kernels.elementwise import exp
from pto_gpu.kernels.reduce import row_expand_div, row_expand_sub, row_max, row_sum

import pto_gpu as pto


def fused_softmax(o: pto.Orchestrator, x, out, tile_rows: int = 8) -> None:
    X, OUT = o.external(x), o.external(out)
    rows, cols = X.shape
    for first in range(0, rows, tile_rows):
        n = min(tile_rows, rows - first)
        tile = X[first:first + n]
        with o.scope():
            peak = o.alloc((n, 1), X.dtype)
            total = o.alloc((n, 1), X.dtype)
            shifted = o.alloc((n, cols), X.dtype)
            o.submit(row_max, pto.input(tile), pto.output(peak))
            o.submit(row_expand_sub, pto.input(tile), pto.input(peak), pto.output(shifted))
            o.submit(exp, pto.input(shifted), pto.output(shifted))
            o.submit(row_sum, pto.input(shifted), pto.output(total))
            o.submit(row_expand_div, pto.input(shifted), pto.input(total), pto.output(OUT[first:first + n]))
