"""Windows smaller than a compiled function's memrefs (docs/ISA.md, "Semantics"): a row tail is
always taken, a column tail only by a function that declares `column_tails`, which reads the
window's size with SDIM; everything else that does not fit is refused, by name, before any
memory is touched: at submit and in a direct call of the kernel. (The interpreter runs any
window up to the memrefs: it defines what each means.)"""

import numba
import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj
from pto_gpu.isa import ISAError

F32 = pto.FLOAT32
ROWS, COLS = 4, 64


def means_module(column_tails: bool) -> isa.Module:
    """@row_mean: each row's mean over the window's columns; @col_mean: each column's mean over
    its rows. Both divide by the window's size (SDIM), not the memref's."""
    m = isa.Module("means")
    row = isa.FunctionBuilder("row_mean", module=m).in_core()
    col = isa.FunctionBuilder("col_mean", module=m).in_core()
    if column_tails:
        row, col = row.column_tails(), col.column_tails()
    (row.memref("x", F32, (ROWS, COLS)).memref("out", F32, (ROWS, 1)).scalar_var("n", pto.INT64)
        .tile("t", ROWS, COLS, F32).tile("s", ROWS, 1, F32)
        .load("t", "x").rowsum("s", "t").scalar_dim("n", "x", 1).divs("s", "s", "n").store("out", "s")
        .build())
    (col.memref("x", F32, (ROWS, COLS)).memref("out", F32, (1, COLS)).scalar_var("n", pto.INT64)
        .tile("t", ROWS, COLS, F32).tile("s", 1, COLS, F32)
        .load("t", "x").colsum("s", "t").scalar_dim("n", "x", 0).divs("s", "s", "n").store("out", "s")
        .build())
    return m


PROGRAM = isa.compile(means_module(column_tails=True))
STRICT = isa.compile(means_module(column_tails=False))


def test_column_tails_round_trip_through_text_and_builder_code():
    m = means_module(column_tails=True)
    text = isa.print_module(m)
    assert "func @row_mean(%x: !pto.memref<f32, 4x64>, %out: !pto.memref<f32, 4x1>) column_tails {" in text
    assert isa.parse(text) == m
    namespace: dict = {}
    exec(isa.to_python(m), namespace)  # noqa: S102 - the module's own builder code
    assert namespace["m"] == m
    assert isa.parse(isa.print_module(means_module(column_tails=False))) != m


def test_only_an_incore_function_with_a_body_declares_column_tails():
    with pytest.raises(ISAError, match="only an InCore function with a body takes column tails"):
        isa.FunctionBuilder("orch").not_in_core().column_tails().memref("x", F32).build()
    with pytest.raises(ISAError, match=r"axis 2 is not an integer in \[0, 2\)"):
        (isa.FunctionBuilder("third").in_core().memref("x", F32, (4, 4)).scalar_var("n", pto.INT64)
            .scalar_dim("n", "x", 2).build())


def _direct(kernel, x, out):
    kernel(x, out)


def _task(backend):
    def run(kernel, x, out):
        pto.Runtime(backend=backend, executor="serial").run(
            lambda o: o.submit(kernel, pto.input(o.external(x)), pto.output(o.external(out))))
    return run


def _interpreted(kernel, x, out):
    isa.interpret.run(PROGRAM.module, kernel.name, x, out)


@pytest.mark.parametrize("run", [_interpreted, _direct, _task("cpu"), _task("cuda-emulated")],
                         ids=["interpreter", "direct", "cpu", "cuda-emulated"])
@pytest.mark.parametrize("shape", [(ROWS, COLS), (ROWS, 50), (3, 17), (1, 1)])
def test_sdim_gives_the_window_s_size_in_every_implementation(run, shape):
    """The means of a full window and of tails in rows, columns and both: each implementation
    divides by the window's count (the memref's 64 would give 50/64 of the mean), within
    float32 rounding of a sum of at most 64 values of numpy's float64 mean."""
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    rows, cols = np.zeros((shape[0], 1), np.float32), np.zeros((1, shape[1]), np.float32)
    run(PROGRAM.kernels["row_mean"], x, rows)
    run(PROGRAM.kernels["col_mean"], x, cols)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(rows[:, 0], x64.mean(axis=1), rtol=0, atol=1e-6)
    np.testing.assert_allclose(cols[0], x64.mean(axis=0), rtol=0, atol=1e-6)


@numba.njit(cache=True)
def _submit_rows(o, x, out, kernel_id, rows):
    pj.submit(o, kernel_id, (pj.input(pj.narrow(x, 0, 0, rows)), pj.output(pj.narrow(out, 0, 0, rows))))


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
def test_a_column_tail_is_refused_where_the_function_does_not_declare_it(compiled):
    """A kernel that normalises by a constant width would be silently wrong on a narrower
    window: without column_tails it is refused at submit (Python or compiled) and in a direct
    call, and nothing is written; a row tail is still taken."""
    kernel = STRICT.kernels["row_mean"]
    x, out = np.ones((ROWS, 50), np.float32), np.zeros((ROWS, 1), np.float32)
    refusal = r"row_mean: tensor param 0 \(x\) dim 1 must be 64, got shape \(4, 50\)"

    def orchestration(o):
        if compiled:
            o.compiled(_submit_rows, o.external(x), o.external(out), kernel.id, ROWS)
        else:
            o.submit(kernel, pto.input(o.external(x)), pto.output(o.external(out)))

    with pytest.raises(pto.ParamError, match=refusal):
        pto.Runtime(backend="cpu", executor="serial").run(orchestration)
    with pytest.raises(pto.ParamError, match=refusal):
        kernel(x, out)
    assert not out.any()
    kernel(np.ones((3, COLS), np.float32), out[:3])
    assert out[:3, 0].tolist() == [1.0] * 3 and out[3, 0] == 0


def test_a_direct_call_checks_what_a_submit_checks():
    """Calling a kernel on arrays is the documented way to try one (docs/ISA.md): more rows than
    its memref, another element type, a missing array are refused by name, before it runs."""
    kernel = STRICT.kernels["row_mean"]
    out = np.zeros((ROWS, 1), np.float32)
    x = np.ones((ROWS, COLS), np.float32)
    cases = [((np.ones((8, COLS), np.float32), out), r"\(x\) dim 0 must be at most 4, got shape \(8, 64\)"),
             ((np.ones((ROWS, COLS)), out), r"tensor param 0 \(x\) must be FLOAT32, got FLOAT64"),
             ((x, [0.0] * 4), r"tensor param 1 \(out\) must be a numpy array, got list"),
             ((x,), r"row_mean takes 2 tensor params, got 1")]
    for args, message in cases:
        with pytest.raises(pto.ParamError, match=message):
            kernel(*args)
    assert not out.any()
