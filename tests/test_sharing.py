"""Params of one task that share memory with a param it writes (pto_gpu/sharing.py,
pto_gpu/isa/in_place.py; docs/DESIGN.md, "Params that share memory").

Generated code reads and writes in an order of its own on each backend, so a task whose
written param shares bytes with another of its params is refused, naming both, unless the
kernel updates in place (element-wise generated code) and the other is the very same view,
as an input: then every runtime gives numpy's answer, which is checked on each, from Python
and from compiled code. Kernels written as functions keep any sharing: their code decides.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from pto_gpu.kernels.elementwise import add, exp, scale
from pto_gpu.kernels.llm import rmsnorm, rope, swiglu
from pto_gpu.kernels.reduce import row_sum
from pto_gpu.kernels.tiles import copy, matmul, matmul_acc

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj
from pto_gpu.isa.in_place import updates_in_place
from pto_gpu.jit.context import K_SHARING
from pto_gpu.jit.host import kernel_tables
from pto_gpu.kernel import registered
from pto_gpu.sharing import Sharing

F32 = pto.FLOAT32
RUNTIMES = [("cpu", "serial"), ("cpu", "parallel"), ("cuda-emulated", "serial"), ("cuda-emulated", "stream"),
            ("cuda-emulated", "persistent")]


def test_library_kernels_are_judged_by_their_generated_code():
    for kernel in (add, exp, scale, swiglu, copy):
        assert kernel.sharing() == Sharing.SAME_VIEW, kernel.name
    # products, reductions, row broadcasts, pairs of columns (rope); matmul also runs as BLAS
    for kernel in (matmul, matmul_acc, rmsnorm, rope, row_sum):
        assert kernel.sharing() == Sharing.NONE, kernel.name


def _elementwise(loop_step: int = 16, load_after_store: bool = False, window_var: bool = True,
                 outer_tile: bool = False, reduce: bool = False) -> isa.Function:
    """out = exp(a) + 1 over 8 x 64 in a FOR over column blocks of 16, or a variant that breaks
    one of in_place.py's rules."""
    f = (isa.FunctionBuilder("f").in_core().memref("a", F32, (8, 64)).memref("out", F32, (8, 64))
         .tile("t", 8, 16, F32).tile("u", 8, 16, F32).tile("s", 8, 1, F32))
    if outer_tile:
        f.fill("u", 1.0)
    f.for_loop("j", 0, 64, loop_step)
    column = "j" if window_var else 0
    f.load("t", "a", 0, column)
    if not outer_tile:
        f.fill("u", 1.0)
    f.exp("t", "t").add("t", "t", "u")
    if reduce:
        f.rowsum("s", "t").rowexpandadd("t", "t", "s")
    f.store("out", "t", 0, column)
    if load_after_store:
        f.load("u", "a", 0, column)
    return f.end_for().build()


def _two_results(width: int, between_stores: bool = False, module: isa.Module | None = None) -> isa.Function:
    """b = a + 1, c = a * 2: element-wise, two outputs; `between_stores`: c's product computed
    after b's store."""
    f = (isa.FunctionBuilder("two_results", module=module).in_core()
         .memref("a", F32, (8, width)).memref("b", F32, (8, width)).memref("c", F32, (8, width))
         .tile("t", 8, width, F32).tile("u", 8, width, F32).tile("v", 8, width, F32)
         .load("t", "a").adds("u", "t", 1.0))
    if between_stores:
        return f.store("b", "u").muls("v", "t", 2.0).store("c", "v").build()
    return f.muls("v", "t", 2.0).store("b", "u").store("c", "v").build()


def _shifted_store() -> isa.Function:
    """out = a one row down: the same window operand, a scalar set between load and store."""
    return (isa.FunctionBuilder("shifted").in_core().memref("a", F32, (8, 8)).memref("out", F32, (8, 8))
            .scalar_var("k", pto.INT64).tile("t", 4, 8, F32)
            .scalar_li("k", 0).load("t", "a", "k", 0).scalar_li("k", 1).store("out", "t", "k", 0).build())


def test_the_judgement_of_a_function_names_each_rule():
    assert updates_in_place(_elementwise())
    assert updates_in_place(_elementwise(loop_step=32))  # iterations further apart than a tile
    assert not updates_in_place(_elementwise(loop_step=8))  # iteration 2 would load what 1 stored
    assert not updates_in_place(_elementwise(load_after_store=True))
    assert not updates_in_place(_elementwise(window_var=False))  # every iteration the same window
    assert not updates_in_place(_elementwise(outer_tile=True))  # a tile from outside the loop
    assert not updates_in_place(_elementwise(reduce=True))
    assert updates_in_place(_two_results(4096))
    # CUDA's column blocks would compute c in a second pass, loading `a` again after b's store
    # (a review's find: on the emulator c came out (a + 1) * 2 with b over a)
    assert not updates_in_place(_two_results(4096, between_stores=True))
    assert not updates_in_place(_shifted_store())


def _two_results_kernel(width: int) -> pto.Kernel:
    m = isa.Module(f"two_results_{width}")
    _two_results(width, module=m)
    return isa.compile(m).kernels["two_results"]


TWO_RESULTS = _two_results_kernel(8)
WIDE_TWO_RESULTS = _two_results_kernel(4096)  # CUDA code in column blocks (isa/column_blocks.py)


@numba.njit(nogil=True)
def _in_place_body(o, x, y, add_id, scale_id):
    """x = (x + y) * 0.5 by column blocks of 320, each through the same view of x."""
    n = pj.shape(x, 1)
    for j in range(0, n, 320):
        xj = pj.narrow(x, 1, j, min(j + 320, n))
        pj.submit(o, add_id, (pj.input(xj), pj.input(pj.narrow(y, 1, j, min(j + 320, n))), pj.output(xj)))
        pj.submit(o, scale_id, (pj.input(xj), pj.output(xj)), (0.5,))


def _in_place(o, x, y, compiled):
    x, y = o.external(x), o.external(y)
    if compiled:
        o.compiled(_in_place_body, x, y, add.id, scale.id)
        return
    for j in range(0, x.shape[1], 320):
        stop = min(j + 320, x.shape[1])
        block = x[:, j:stop]
        o.submit(add, pto.input(block), pto.input(y[:, j:stop]), pto.output(block))
        o.submit(scale, pto.input(block), pto.output(block), 0.5)


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
@pytest.mark.parametrize("backend,executor", RUNTIMES, ids=[f"{b}-{e}" for b, e in RUNTIMES])
def test_an_update_in_place_through_the_same_view_gives_numpys_answer_on_every_runtime(backend, executor,
                                                                                      compiled):
    # Blocks of 320 columns: the CUDA code loops over its column blocks of 256 and a tail. A
    # float32 sum and a halving round as numpy's, so the answer is exact.
    rng = np.random.default_rng(7)
    x, y = (rng.standard_normal((48, 640)).astype(np.float32) for _ in range(2))
    want = (x + y) * np.float32(0.5)
    pto.Runtime(backend=backend, executor=executor).run(_in_place, x, y, compiled)
    np.testing.assert_array_equal(x, want)


@numba.njit(nogil=True)
def _refused_body(o, a, b, kernel_id, case):
    """REFUSED's tasks from compiled code, case by case."""
    if case == 0:
        pj.submit(o, kernel_id, (pj.input(a), pj.input(b), pj.output(a)))
    elif case == 1:
        pj.submit(o, kernel_id, (pj.input(pj.narrow(a, 0, 0, 4)), pj.input(pj.narrow(b, 0, 0, 4)),
                                 pj.output(pj.narrow(a, 0, 2, 6))))
    elif case == 2:
        pj.submit(o, kernel_id, (pj.input(pj.swap(a, 0, 1)), pj.input(b), pj.output(a)))
    elif case == 3:
        pj.submit(o, kernel_id, (pj.input(a), pj.input(pj.swap(a, 0, 1)), pj.output(a)))
    else:
        pj.submit(o, kernel_id, (pj.input(b), pj.output(a), pj.output(a)))


# (kernel, its params from Python as _refused_body's case, what the error says of them, and why)
REFUSED = {
    # the product's output over its left operand: BLAS on the CPU reads it first, GPU code does not
    "a product over its operand": (matmul, lambda a, b: (pto.input(a), pto.input(b), pto.output(a)),
                                   "tensor param 2, which it writes, shares memory with tensor param 0",
                                   "reads and writes in an order of its own"),
    "an overlapping window": (add, lambda a, b: (pto.input(a[0:4]), pto.input(b[0:4]), pto.output(a[2:6])),
                              "tensor param 2, which it writes, shares memory with tensor param 0",
                              "differ: shape (4, 8) strides (8, 1) FLOAT32 at byte 64"),
    "a transpose of the view written": (add, lambda a, b: (pto.input(a.T), pto.input(b), pto.output(a)),
                                        "tensor param 2, which it writes, shares memory with tensor param 0",
                                        "strides (1, 8) FLOAT32 at byte 0"),
    # the first pair (a, out) is allowed, the second (a.T, out) not
    "the same view beside a transpose": (add, lambda a, b: (pto.input(a), pto.input(a.T), pto.output(a)),
                                         "tensor param 2, which it writes, shares memory with tensor param 1",
                                         "strides (1, 8) FLOAT32 at byte 0"),
    "two outputs on one view": (TWO_RESULTS, lambda a, b: (pto.input(b), pto.output(a), pto.output(a)),
                                "tensor param 1 (b), which it writes, shares memory with tensor param 2 (c)",
                                "both are written"),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_sharing_names_both_params_and_loses_nothing(case, compiled):
    kernel, params, names, why = REFUSED[case]
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    b = np.ones((8, 8), np.float32)
    out = np.zeros((8, 8), np.float32)
    before = a.copy()

    def orchestration(o, a, b, out):
        a, b, out = o.external(a), o.external(b), o.external(out)
        o.submit(add, pto.input(b), pto.input(b), pto.output(out))  # a task before the refused one
        if compiled:
            o.compiled(_refused_body, a, b, kernel.id, list(REFUSED).index(case))
        else:
            o.submit(kernel, *params(a, b))

    rt = pto.Runtime(executor="parallel")
    with pytest.raises(pto.ParamError) as error:
        rt.run(orchestration, a, b, out)
    assert f"{kernel.name}: {names}" in str(error.value) and why in str(error.value)
    np.testing.assert_array_equal(a, before)  # the refused task never ran
    np.testing.assert_array_equal(out, 2 * b)  # the one before it did
    rt.run(_in_place, a, np.ones_like(a), compiled)  # the runtime goes on
    np.testing.assert_array_equal(a, (before + 1) * np.float32(0.5))


def test_params_judged_by_their_bytes_whatever_their_overlap_level():
    """Interleaved columns share no byte, though their bounding boxes meet: not refused."""
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    want = x.copy()
    want[:, 1::2] = x[:, ::2] + 1

    def orchestration(o, x, one):
        x = o.external(x)
        o.submit(add, pto.input(x[:, ::2].with_overlap(pto.Overlap.BOUNDING_BOX)), pto.input(o.external(one)),
                 pto.output(x[:, 1::2]))

    pto.Runtime().run(orchestration, x, np.ones((8, 4), np.float32))
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("backend", ["cpu", "cuda-emulated"])
def test_the_same_view_as_an_input_and_an_output_of_two_results(backend):
    """two_results(a, b=a, c) over 4096 columns: b = a + 1 over a, c = a * 2 from a's old values."""
    a = np.arange(8 * 4096, dtype=np.float32).reshape(8, 4096)
    c = np.zeros_like(a)
    want_b, want_c = a + 1, a * 2

    def orchestration(o, a, c):
        a = o.external(a)
        o.submit(WIDE_TWO_RESULTS, pto.input(a), pto.output(a), pto.output(o.external(c)))

    pto.Runtime(backend=backend).run(orchestration, a, c)
    np.testing.assert_array_equal(a, want_b)
    np.testing.assert_array_equal(c, want_c)


@pto.kernel(worker=pto.VECTOR)
def _shift(a, out):
    out[...] = a + 1


def test_a_kernel_written_as_a_function_keeps_any_sharing():
    """Its code, the same on every backend, decides: here numpy's, which reads `a` whole first."""
    x = np.arange(8.0)
    want = x.copy()
    want[1:] = x[:-1] + 1
    def orchestration(o, x):
        x = o.external(x)
        o.submit(_shift, pto.input(x[:-1]), pto.output(x[1:]))

    pto.Runtime().run(orchestration, x)
    np.testing.assert_array_equal(x, want)


def test_compiled_code_asks_for_a_kernels_judgement_once():
    a = np.ones((8, 8), np.float32)
    pto.Runtime().run(_in_place, a, a.copy(), True)
    table, _ = kernel_tables(len(registered()))
    assert table[add.id, K_SHARING] == Sharing.SAME_VIEW and table[scale.id, K_SHARING] == Sharing.SAME_VIEW
    assert table[_shift.id, K_SHARING] == Sharing.ANY


@pto.kernel(worker=pto.VECTOR, name="shift_judged")
def _shift_judged(a, out):
    out[...] = a + 1


_shift_judged.sharing_rule = lambda: Sharing.ANY  # a rule may allow anything, as no rule does


@numba.njit(nogil=True)
def _shift_body(o, x, kernel_id):
    n = pj.shape(x, 0)
    pj.submit(o, kernel_id, (pj.input(pj.narrow(x, 0, 0, n - 1)), pj.output(pj.narrow(x, 0, 1, n))))


def test_compiled_code_follows_a_rule_that_allows_anything():
    x = np.arange(8.0)
    want = x.copy()
    want[1:] = x[:-1] + 1
    pto.Runtime().run(lambda o, x: o.compiled(_shift_body, o.external(x), _shift_judged.id), x)
    np.testing.assert_array_equal(x, want)
