"""The numba-jitted core: rings, dep-list pool, TensorMap and task table over int64 tables.

Every function here is `@njit(cache=True)` and holds the GIL while it runs, which makes
each call atomic with respect to the other threads of a run (workers completing tasks
while the orchestrator submits). Kernels release the GIL; bookkeeping never does.
"""
