"""Compiled orchestration: orchestration code that numba compiles, at C speed.

A compiled orchestration body is an `@numba.njit` function that takes the JitOrchestrator
`o` and calls these functions on it instead of the methods of the Python `o`; with
`nogil=True`, as generated bodies are, Python workers run beside it while it submits:

    from pto_gpu import jit as pj

    @numba.njit(nogil=True)
    def body(o, a, b, c, tile, matmul_id):          # a, b, c: compiled descriptors
        for i in range(0, pj.shape(c, 0), tile):
            pj.submit(o, matmul_id, (pj.input(pj.narrow(a, 0, i, i + tile)), pj.input(b),
                                     pj.output(pj.narrow(c, 0, i, i + tile))))

    def orchestration(o, a, b, c):                  # passed to rt.run like any other
        o.compiled(body, o.external(a), o.external(b), o.external(c), 64, matmul.id)

Kernels are referred to by id (`kernel.id`, passed in as an argument: ids depend on import
order, so they must not be baked into cached code). In a distributed run (Runtime(comm=...))
a body places its tasks as Python submits are placed (jit/placing.py); `owner_of(o, t)` and
`alloc(o, shape, dtype, owner)` give a heap tile the owner of the tile it accumulates.
Descriptors are int64 tuples (see descriptor.py) sliced with `narrow`, `split` and `swap`.
Tensor params come before scalar params. The same tasks and edges result as from the Python
API, and full rings wait for the executor as they do there.

A body compiled with `cache=True` keeps, in numba's cache, its own copy of every function of
this package it calls, and numba never checks those again: after pto-gpu changes, delete
such a body's cache (its `__pycache__/*.nbi`, `*.nbc`). Orchestrations generated from PTO
programs need not: their cache names include `source_fingerprint()`.
"""

import functools
import hashlib
from pathlib import Path

from .api import (
    alloc,
    flush,
    free,
    inout,
    input,
    output,
    owner_of,
    scope_begin,
    scope_end,
    submit,
    version_inc,
)
from .descriptor import dtype, narrow, ndim, shape, split, swap, with_version


@functools.cache
def source_fingerprint() -> str:
    """A digest of the sources compiled orchestrations link in: this package, the core, the
    overlap judgement and the layouts."""
    package = Path(__file__).resolve().parent.parent
    files = sorted([*package.joinpath("jit").glob("*.py"), *package.joinpath("core").glob("*.py"),
                    package / "overlap.py", package / "layout.py"])
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


__all__ = ["alloc", "dtype", "flush", "free", "inout", "input", "narrow", "ndim", "output", "owner_of",
           "scope_begin", "scope_end", "shape", "source_fingerprint", "split", "submit", "swap",
           "version_inc", "with_version"]
