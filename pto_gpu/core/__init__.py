"""The numba-jitted core: rings, dep-list pool, TensorMap and task table over record tables.

Every function here is `@njit(cache=True)`. Called from Python it holds the GIL, which
makes each call atomic with respect to the other threads of a run until native loops or a
`nogil` compiled body enter the core without it; from then on every entry takes the core's
lock (lock.py). Kernels release the GIL.

The transitions are compiled with `_nrt=False`, numba's switch for code without its
runtime: they allocate nothing and keep no reference counts. With the runtime, every
table passed to a helper was an atomic increment and decrement that numba's pruning
could not always remove (a third of a submit's time). The switch also applies to what
they call (pto_gpu.overlap), so nothing under a transition may allocate an array;
numba refuses to compile one that does. Validation's `invariants.check` allocates and
keeps the runtime.
"""
