"""Orchestration functions run through the Python orchestrator API (pto_gpu/isa/orchestrate.py):
the same tasks, params and edges as the hand-written orchestration that makes the same calls,
results equal to float64 numpy, scalar control flow, nested orchestrations, and errors that name
the call. Also the spec's programs kept as .pto files, and `pto-gpu compile` / `pto-gpu parse`."""

import importlib.resources
import re

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import cli, isa

F32 = pto.FLOAT32
ROWS, COLS = 8, 64  # the tile of dynamic_softmax.pto
PROGRAMS = importlib.resources.files("pto_gpu.orchestration") / "programs"


def softmax_module() -> isa.Module:
    """spec 003 §2's dynamic softmax (orchestration/programs/dynamic_softmax.pto), plus an
    in-place scaling and an orchestration that calls the others: softmax every tile, then scale
    the even ones (a scalar test, IF, RETURN)."""
    m = isa.parse(PROGRAMS.joinpath("dynamic_softmax.pto").read_text())
    (isa.FunctionBuilder("scale_tile", module=m).in_core()
        .memref("data", F32, (ROWS, COLS)).scalar("factor", pto.FLOAT64).tile("t", ROWS, COLS, F32)
        .load("t", "data").muls("t", "t", "factor").store("data", "t")
        .build())
    (isa.FunctionBuilder("softmax_then_scale_even", module=m).not_in_core()
        .memref("input", F32).memref("output", F32).scalar("num_tiles", pto.INT64).scalar("stop", pto.INT64)
        .scalar_var("half", pto.INT64).scalar_var("odd", pto.INT64)
        .call("dynamic_softmax", {"input": "input", "output": "output"}, scalars={"num_tiles": "num_tiles"})
        .for_loop("i", 0, "num_tiles", 1)
        .if_then("i", "ge", "stop").ret().end_if()
        .scalar_div("half", "i", 2).scalar_mul("odd", "half", 2).scalar_sub("odd", "i", "odd")
        .if_then("odd", "eq", 0)
        .call("scale_tile", {"data": ("output", "i", 0)}, scalars={"factor": 0.5})
        .end_if()
        .end_for()
        .build())
    return m


def hand_written(kernels, num_tiles, stop):
    """What softmax_then_scale_even does, written against the Python API."""
    def orchestration(o, x, y):
        X, Y = o.external(x), o.external(y)
        rows = X.shape[0]
        windows = [(i * ROWS, min((i + 1) * ROWS, rows)) for i in range(num_tiles)]
        for first, last in windows:
            window = (slice(first, last), slice(0, COLS))
            o.submit(kernels["softmax_tile"], pto.input(X[window]), pto.output(Y[window]))
        for i, (first, last) in enumerate(windows[:stop]):
            if i % 2 == 0:
                o.submit(kernels["scale_tile"], pto.inout(Y[first:last, :COLS]), 0.5)
    return orchestration


def signature(graph):
    def param(p):
        return int(p.kind), p.value if p.kind == pto.ParamKind.SCALAR else tuple(p.value.layout.tolist())
    return [(t.kernel.name, tuple(param(p) for p in t.params)) for t in graph.tasks], graph.edges


@pytest.fixture(scope="module")
def program():
    return isa.compile(softmax_module())


@pytest.mark.parametrize("rows, stop", [(64, 8), (61, 5), (8, 0)])
def test_the_program_makes_the_hand_written_graph_and_results(program, rows, stop):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, COLS)).astype(np.float32)
    num_tiles = -(-rows // ROWS)
    orchestration = program.orchestration("softmax_then_scale_even")
    graphs = []
    for run in (lambda o, x, y: orchestration(o, x, y, num_tiles, stop),
                hand_written(program.kernels, num_tiles, stop)):
        y = np.full_like(x, np.nan)
        result = pto.Runtime(executor="serial").run(run, x, y, record=True)
        graphs.append(signature(result.graph))
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
        for i in range(0, min(stop, num_tiles), 2):
            want[i * ROWS:(i + 1) * ROWS] *= 0.5
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-7)
    assert graphs[0] == graphs[1]
    assert len(graphs[0][0]) == num_tiles + len(range(0, min(stop, num_tiles), 2))


def test_directions_come_from_the_callee_not_from_names(program):
    result = pto.Runtime(executor="dry").run(program.orchestration("softmax_then_scale_even"),
                                             np.ones((16, COLS), np.float32), np.ones((16, COLS), np.float32),
                                             2, 2, record=True)
    kinds = [[p.kind for p in t.params] for t in result.graph.tasks]
    assert kinds[0] == [pto.ParamKind.INPUT, pto.ParamKind.OUTPUT]
    assert kinds[2] == [pto.ParamKind.INOUT, pto.ParamKind.SCALAR]


@pytest.mark.parametrize("case, message", [
    (lambda p: p.orchestration("dynamic_softmax")(None, 1), r"@dynamic_softmax takes 2 arrays and 1 scalars "
                                                           r"\(input, output, num_tiles\), got 1 arguments"),
    (lambda p: p.orchestration("softmax_tile"), r"@softmax_tile is an InCore function"),
    (lambda p: p.orchestration("nowhere"), r"unknown function @nowhere"),
    (lambda p: p.orchestration("dynamic_softmax", compiled=True)(None, 1),
     r"@dynamic_softmax takes 2 arrays"),
])
def test_misuse_is_refused_by_name(program, case, message):
    with pytest.raises(isa.ISAError, match=message):
        case(program)


def test_a_window_past_the_edge_names_the_call(program):
    x = np.ones((16, COLS), np.float32)
    message = (r"@dynamic_softmax: CALL @softmax_tile.*: the window of %input for %input starts at "
               r"\(16, 0\), outside its shape \(16, 64\)")
    with pytest.raises(isa.ISAError, match=message):
        pto.Runtime(executor="serial").run(program.orchestration("dynamic_softmax"), x, np.empty_like(x), 3)


def test_a_binary_expanded_loop_refuses_more_than_max_range(program):
    x = np.ones((8 * 4097, COLS), np.float32)
    with pytest.raises(isa.ISAError, match=r"@dynamic_softmax: FOR %i.*: 4097 iterations, over its max_"):
        pto.Runtime(executor="dry").run(program.orchestration("dynamic_softmax"), x, x, 4097)


# --- the spec's programs as .pto files, and the command line ---------------------------------------


@pytest.mark.parametrize("name", ["dynamic_softmax", "llama"])
def test_the_spec_programs_round_trip_and_rebuild(name):
    text = PROGRAMS.joinpath(f"{name}.pto").read_text()
    module = isa.parse(text)
    assert isa.parse(isa.print_module(module)) == module
    namespace = {}
    exec(isa.to_python(module), namespace)  # noqa: S102 - the builder code the compiler wrote
    assert namespace["m"] == module


def test_dynamic_softmax_pto_runs_to_numpy():
    prog = isa.compile(isa.parse(PROGRAMS.joinpath("dynamic_softmax.pto").read_text()))
    x = np.random.default_rng(3).standard_normal((37, COLS)).astype(np.float32)
    y = np.zeros_like(x)
    pto.Runtime().run(prog.orchestration("dynamic_softmax"), x, y, 5)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("emit, expected", [("pto", "func @dynamic_softmax("), ("cpu", "def kernel("),
                                            ("python", "isa.FunctionBuilder("), ("cuda", "__global__"),
                                            ("orchestration", "@njit(cache=True, nogil=True)\ndef body(o, ")])
def test_pto_gpu_compile_prints_each_form(capsys, emit, expected):
    assert cli.main(["compile", str(PROGRAMS / "dynamic_softmax.pto"), "--emit", emit]) == 0
    assert expected in capsys.readouterr().out


def test_pto_gpu_parse_writes_builders_that_rebuild_the_modules(tmp_path):
    source = (PROGRAMS / "dynamic_softmax.pto").read_text()
    (tmp_path / "softmax.pto").write_text(source)
    assert cli.main(["parse", str(tmp_path)]) == 0
    namespace = {}
    exec((tmp_path / "softmax_builder.py").read_text(), namespace)  # noqa: S102
    assert namespace["m"] == isa.parse(source)


def test_errors_in_a_pto_file_name_the_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.pto"
    bad.write_text("// PTO Module: bad\n\n// Function Type: InCore\nfunc @f(%a: !pto.memref<f32, 8x8>) {\n"
                   "  %t = tfrobnicate %a\n}\n")
    assert cli.main(["compile", str(bad)]) == 2
    assert re.match(rf"pto-gpu: {re.escape(str(bad))}:5:\d+: ", capsys.readouterr().err)


def test_pto_gpu_run_names_a_file_without_an_orchestration_as_such(tmp_path, capsys):
    kernels_only = tmp_path / "kernels.pto"
    kernels_only.write_text("// PTO Module: k\n\n// Function Type: InCore\n"
                            "func @f(%a: !pto.memref<f32, 8x8>, %b: !pto.memref<f32, 8x8>) {\n"
                            "  %t = alloc_tile : !pto.tile<8x8xf32>\n  %t = tload %a[0, 0]\n"
                            "  tstore %t, %b[0, 0]\n}\n")
    assert cli.main(["run", str(kernels_only)]) == 2
    assert "has no Orchestration function to run, only InCore ones (@f)" in capsys.readouterr().err
    assert cli.main(["compile", str(kernels_only), "--emit", "orchestration"]) == 2
    assert "has no Orchestration function, only InCore ones" in capsys.readouterr().err


NESTED = """// PTO Module: nested

// Function Type: InCore
func @f(%a: !pto.memref<f32, 8x8>, %b: !pto.memref<f32, 8x8>, %n: i32) {
  %t = alloc_tile : !pto.tile<8x8xf32>
  %u = alloc_tile : !pto.tile<8x8xf32>
  %t = tload %a[0, 0]
  FOR %i:idx, 0:idx, %n:idx, 1:idx
    %u = tadd %t, %{operand}
  ENDFOR
  tstore %u, %b[0, 0]
}
"""


@pytest.mark.parametrize("operand, message", [("q", "unknown name %q"),
                                              ("u", "reads tile %u before any instruction writes it")])
def test_verifier_errors_from_text_give_the_line_and_column_of_the_statement(tmp_path, capsys, operand,
                                                                            message):
    """Inside a loop: the innermost statement's place, not the loop's."""
    text = NESTED.replace("{operand}", operand)
    with pytest.raises(isa.ISAError, match=rf"^9:5: @f: TADD %u, %t, %{operand}: {message}"):
        isa.parse(text)
    assert isa.parse(text, verify=False).functions["f"].name == "f"  # the text is well formed
    bad = tmp_path / "bad.pto"
    bad.write_text(text)
    assert cli.main(["compile", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"pto-gpu: {bad}:9:5: @f: TADD")


# --- compiled=True: generated numba over pto_gpu.jit ------------------------------------------------
@pytest.mark.parametrize("rows, stop", [(64, 8), (61, 5), (8, 0)])
def test_the_compiled_orchestration_makes_the_interpreted_graph_and_results(program, rows, stop):
    x = np.random.default_rng(rows).standard_normal((rows, COLS)).astype(np.float32)
    num_tiles = -(-rows // ROWS)
    results = []
    for compiled in (False, True):
        run = program.orchestration("softmax_then_scale_even", compiled=compiled)
        y = np.full_like(x, np.nan)
        result = pto.Runtime(executor="serial").run(run, x, y, num_tiles, stop, record=True)
        results.append((signature(result.graph), y))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_the_compiled_orchestration_runs_on_every_executor(program, executor):
    x = np.random.default_rng(7).standard_normal((45, COLS)).astype(np.float32)
    want, got = np.zeros_like(x), np.zeros_like(x)
    pto.Runtime(executor="serial").run(program.orchestration("dynamic_softmax"), x, want, 6)
    pto.Runtime(executor=executor).run(program.orchestration("dynamic_softmax", compiled=True), x, got, 6)
    np.testing.assert_array_equal(got, want)


def test_the_compiled_orchestration_names_a_window_past_the_edge(program):
    x = np.ones((16, COLS), np.float32)
    with pytest.raises(isa.ISAError, match=r"@dynamic_softmax: CALL @softmax_tile.*: the window of %input "
                                           r"for %input starts outside its shape"):
        pto.Runtime(executor="serial").run(program.orchestration("dynamic_softmax", compiled=True),
                                           x, np.empty_like(x), 3)


def test_the_generated_source_is_plain_numba_over_pto_gpu_jit():
    from pto_gpu.isa.orchestration_codegen import orchestration_source

    source, callees = orchestration_source(softmax_module(), "softmax_then_scale_even")
    assert callees == [("k_softmax_tile", ("softmax_tile",)), ("k_scale_tile", ("scale_tile",))]
    assert "def body(o, m_input, m_output, p_num_tiles, p_stop, k_softmax_tile, k_scale_tile):" in source
    assert "while True:" not in source  # the inlined dynamic_softmax has no RETURN
