"""Compiled orchestration: orchestration code that numba compiles, at C speed.

A compiled orchestration body is an `@numba.njit` function that takes the JitOrchestrator
`o` and calls these functions on it instead of the methods of the Python `o`:

    from pto_gpu import jit as pj

    @numba.njit
    def body(o, a, b, c, tile, matmul_id):          # a, b, c: compiled descriptors
        for i in range(0, pj.shape(c, 0), tile):
            pj.submit(o, matmul_id, (pj.input(pj.narrow(a, 0, i, i + tile)), pj.input(b),
                                     pj.output(pj.narrow(c, 0, i, i + tile))))

    def orchestration(o, a, b, c):                  # passed to rt.run like any other
        o.compiled(body, o.external(a), o.external(b), o.external(c), 64, matmul.id)

Kernels are referred to by id (`kernel.id`, passed in as an argument: ids depend on import
order, so they must not be baked into cached code). Descriptors are int64 tuples (see
descriptor.py) sliced with `narrow`, `split` and `swap`. Tensor params come before
scalar params. The same tasks and edges result as from the Python API, and full rings
wait for the executor as they do there.
"""

from .api import (
    alloc,
    flush,
    free,
    inout,
    input,
    output,
    scope_begin,
    scope_end,
    submit,
    version_inc,
)
from .descriptor import dtype, narrow, ndim, shape, split, swap, with_version

__all__ = ["alloc", "dtype", "flush", "free", "inout", "input", "narrow", "ndim", "output", "scope_begin",
           "scope_end", "shape", "split", "submit", "swap", "version_inc", "with_version"]
