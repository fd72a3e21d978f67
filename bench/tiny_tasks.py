"""Graphs of tiny generated-kernel tasks, shared by the throughput benchmarks (native workers
on the CPU) and the CUDA emulator's: each task scales one 16-float row, out = 2 * x
(independent: 64 rows over and over; `factors`: the same, each task by a factor of its own, so
that no two go out in one launch) or x *= 1 in place (one chain), submitted by a compiled
orchestration (`generated`) or from Python (`generated_python`), with the library's `scale`
or the same kernel as a user writes it (`user_scale`)."""

import numba
import numpy as np
from pto_gpu.kernels.elementwise import scale

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj

TASKS = 20_000


@numba.njit(cache=True)
def _generated_independent(o, x, y, tasks, scale_id, factors):
    rows = pj.shape(x, 0)
    for i in range(tasks):
        r = i % rows
        pj.submit(o, scale_id, (pj.input(pj.narrow(x, 0, r, r + 1)), pj.output(pj.narrow(y, 0, r, r + 1))),
                  (i + 1.0 if factors else 2.0,))


@numba.njit(cache=True)
def _generated_chain(o, x, tasks, scale_id):
    row = pj.narrow(x, 0, 0, 1)
    for _ in range(tasks):
        pj.submit(o, scale_id, (pj.input(row), pj.output(row)), (1.0,))


def _user_scale() -> pto.Kernel:
    """`scale` on float32 rows of 16 as a kernel author writes it from docs/ISA.md."""
    m = isa.Module("tiny_tasks")
    (isa.FunctionBuilder("user_scale", module=m).in_core()
        .memref("x", pto.FLOAT32, (1, 16)).memref("out", pto.FLOAT32, (1, 16)).scalar("factor", pto.FLOAT32)
        .tile("t", 1, 16, pto.FLOAT32).load("t", "x").muls("t", "t", "factor").store("out", "t")
        .build())
    return isa.compile(m).kernels["user_scale"]


user_scale = _user_scale()


def generated(o, x, y, shape, kernel=scale):
    if shape in ("independent", "factors"):
        o.compiled(_generated_independent, o.external(x), o.external(y), TASKS, kernel.id, shape == "factors")
    else:
        o.compiled(_generated_chain, o.external(x), TASKS, kernel.id)


def generated_python(o, x, y, shape, kernel=scale):
    """`generated`'s graph, submitted from Python: its tasks run natively too."""
    X, Y = o.external(x), o.external(y)
    if shape == "independent":
        pairs = [(pto.input(X[r:r + 1]), pto.output(Y[r:r + 1])) for r in range(len(x))]
        for i in range(TASKS):
            o.submit(kernel, *pairs[i % len(pairs)], 2.0)
    else:
        row = X[0:1]
        for _ in range(TASKS):
            o.submit(kernel, pto.input(row), pto.output(row), 1.0)


def rows() -> tuple[np.ndarray, np.ndarray]:
    """x and y, two allocations (views of one would share a TensorMap owner and so its chains)."""
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    return x, np.zeros_like(x)


