"""The numba-jitted core: rings, dep-list pool, TensorMap and task table over record tables.

Every function here is `@njit(cache=True)` and holds the GIL while it runs, which makes
each call atomic with respect to the other threads of a run (workers completing tasks
while the orchestrator submits). Kernels release the GIL; bookkeeping never does.

The transitions are compiled with `_nrt=False`, numba's switch for code without its
runtime: they allocate nothing and keep no reference counts. With the runtime, every
table passed to a helper was an atomic increment and decrement that numba's pruning
could not always remove (a third of a submit's time). The switch also applies to what
they call (pto_gpu.overlap), so nothing under a transition may allocate an array;
numba refuses to compile one that does. Validation's `invariants.check` allocates and
keeps the runtime.
"""
