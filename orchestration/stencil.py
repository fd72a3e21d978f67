"""A 1-D three-point stencil, `steps` times, chunk by chunk: each chunk's task reads its left
and right neighbours as one-element halos, so in a distributed run only halos cross ranks."""

from pto_gpu.kernels.stencil import stencil3
from pto_gpu.kernels.tiles import copy

import pto_gpu as pto


def stencil(o: pto.Orchestrator, x, scratch, steps: int, chunk: int = 1024) -> None:
    """Smooth x in place `steps` times (scratch, of x's shape, holds every other step); the ends
    use their own value as the missing neighbour. Both arrays are block-distributed over the
    ranks."""
    owner = pto.block_rows(o.ranks)
    source, target = o.external(x, owner=owner), o.external(scratch, owner=owner)
    n = source.shape[0]
    for _ in range(steps):
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            left = source[start - 1:start] if start > 0 else source[0:1]
            right = source[stop:stop + 1] if stop < n else source[n - 1:n]
            o.submit(stencil3, pto.input(left), pto.input(source[start:stop]), pto.input(right),
                     pto.output(target[start:stop]))
        source, target = target, source
    if steps % 2:  # the last step wrote scratch
        for start in range(0, n, chunk):
            o.submit(copy, pto.input(source[start:start + chunk].reshape(1, -1)),
                     pto.output(target[start:start + chunk].reshape(1, -1)))
