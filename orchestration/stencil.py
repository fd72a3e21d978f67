"""A 1-D three-point stencil, `steps` times, chunk by chunk: each chunk's task reads its left
and right neighbours as one-element halos, so in a distributed run only halos cross ranks."""

from pto_gpu.kernels.stencil import stencil3

import pto_gpu as pto


def stencil(o: pto.Orchestrator, x, out, steps: int, chunk: int = 1024) -> None:
    """out = x smoothed `steps` times (at least 1); the ends use their own value as the missing
    neighbour. x, out and the scratch between steps are in blocks over the ranks."""
    owner = pto.block_rows(o.ranks)
    source, result = o.external(x, owner=owner), o.external(out, owner=owner)
    scratch = o.alloc(source.shape, source.dtype, owner=owner)
    n = source.shape[0]
    for step in range(steps):
        target = result if (steps - 1 - step) % 2 == 0 else scratch  # the last step writes out
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            left = source[start - 1:start] if start > 0 else source[0:1]
            right = source[stop:stop + 1] if stop < n else source[n - 1:n]
            o.submit(stencil3, pto.input(left), pto.input(source[start:stop]), pto.input(right),
                     pto.output(target[start:stop]))
        source = target
    o.free(scratch)
