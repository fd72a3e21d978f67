"""The `.pto` assembly and to_python: printing is canonical and parse inverts it, name for name;
parse errors point at line:column; to_python's code rebuilds the module through the builder."""

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa.asm import parse, print_module
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.ir import (
    Call,
    CallArg,
    For,
    Function,
    FunctionKind,
    If,
    MemRef,
    Module,
    Op,
    Predicate,
    Return,
    Scalar,
    Tile,
)
from pto_gpu.isa.operands import Kind, signature
from pto_gpu.isa.ops import OPCODES, SCALAR_FORMS
from pto_gpu.isa.pyize import to_python

F32 = pto.FLOAT32

# -- generated modules: syntactically complete, not necessarily valid programs ------------------

# Names a keyword or a number might be confused with, and a non-ASCII one (the verifier's rule for
# names is str.isidentifier).
names = st.sampled_from(["x", "y", "acc", "i", "n", "input", "_t0", "FOR", "ENDIF", "return", "tadd", "inf",
                         "nan", "idx", "lt", "f32", "x8", "αβ"])
dtypes = st.sampled_from(list(pto.DataType))
ints = st.integers(-(2**40), 2**40)
floats = st.floats(allow_nan=False, allow_infinity=True)  # nan != nan: test_nan_round_trips
indices = st.one_of(names, ints)
OPERANDS = {Kind.TILE: names, Kind.MEMREF: names, Kind.LOCAL: names, Kind.INDEX: indices,
            Kind.VALUE: st.one_of(names, ints, floats), Kind.IMMEDIATE: st.one_of(ints, floats),
            Kind.PREDICATE: st.sampled_from(Predicate)}


def ops(in_core: bool):
    specs = [spec for spec in OPCODES.values() if in_core or spec.form in SCALAR_FORMS]

    def op(spec):
        dst, *srcs = (OPERANDS[o.kind] for o in signature(spec))
        return st.builds(lambda d, s: Op(spec.spelling, d, s), dst, st.tuples(*srcs))

    return st.sampled_from(specs).flatmap(op)


call_args = st.one_of(st.builds(CallArg, names), st.builds(CallArg, names, indices, indices))
calls = st.builds(Call, names, st.lists(st.tuples(names, call_args), max_size=3).map(tuple),
                  st.lists(st.tuples(names, st.one_of(names, ints, floats)), max_size=2).map(tuple))
tile_levels = st.lists(st.tuples(st.integers(0, 8192), st.integers(1, 128)), max_size=3).map(tuple)


def bodies(in_core: bool):
    leaves = st.one_of(ops(in_core), ops(in_core), calls, st.just(Return()))

    def nest(children):
        block = st.lists(children, max_size=2).map(tuple)
        loops = st.builds(For, names, indices, indices, indices, block, st.none() | ints, st.none() | ints,
                          tile_levels)
        branches = st.builds(If, indices, st.sampled_from(Predicate), indices, block, block)
        return loops | branches

    return st.lists(st.recursive(leaves, nest, max_leaves=6), max_size=4).map(tuple)


@st.composite
def functions(draw, name):
    kind = draw(st.sampled_from(FunctionKind))
    in_core = kind is FunctionKind.INCORE
    shapes = st.tuples(st.integers(1, 256), st.integers(1, 256)) if in_core else st.none()
    memrefs = draw(st.lists(st.builds(MemRef, names, dtypes, shapes), max_size=3))
    # Parameters before locals: the printer puts parameters in the header, locals in the body.
    params = draw(st.lists(st.builds(Scalar, names, dtypes, st.just(True)), max_size=2))
    local_scalars = draw(st.lists(st.builds(Scalar, names, dtypes, st.just(False)), max_size=2))
    tiles = draw(st.lists(st.builds(Tile, names, st.integers(1, 64), st.integers(1, 64), dtypes),
                          max_size=3)) if in_core else []
    return Function(name, kind, tuple(memrefs), tuple(params + local_scalars), tuple(tiles),
                    draw(bodies(in_core)))


@st.composite
def modules(draw):
    module = Module(draw(st.sampled_from(["m", "softmax_module", "llama-7b.v2", "_"])))
    for name in draw(st.lists(names, min_size=1, max_size=3, unique=True)):
        module.add(draw(functions(name)))
    return module


@settings(max_examples=100, deadline=None)
@given(modules())
def test_parse_inverts_print(module):
    text = print_module(module)
    parsed = parse(text, verify=False)
    assert parsed == module
    assert print_module(parsed) == text
    assert print_module(module) == text
    compile(to_python(module), "<to_python>", "exec")  # the builder would refuse most of these modules


def test_every_opcode_round_trips():
    """One instruction of each opcode, with each kind of operand its form takes."""
    sample = {Kind.TILE: "t", Kind.MEMREF: "m", Kind.LOCAL: "s", Kind.INDEX: "i", Kind.VALUE: -2.5e-07,
              Kind.IMMEDIATE: 3, Kind.PREDICATE: Predicate.NE}
    body = []
    for spec in OPCODES.values():
        dst, *srcs = (sample[o.kind] for o in signature(spec))
        body.append(Op(spec.spelling, dst, tuple(srcs)))
    module = Module("all")
    module.add(Function("f", FunctionKind.INCORE, (MemRef("m", F32, (8, 8)),), (Scalar("s", F32, False),),
                        (Tile("t", 8, 8, F32),), tuple(body)))
    text = print_module(module)
    for spec in OPCODES.values():
        assert re.search(rf"^  (%\w+ = )?{spec.spelling.lower()} ", text, re.M), spec.spelling
    assert "  %s = scmp ne -2.5e-07, -2.5e-07\n" in text
    assert "  tstore %t, %m[%i, %i]\n" in text
    assert parse(text, verify=False) == module


def test_floats_read_back_exactly_and_nan_survives():
    values = (0.1, 1e-300, -0.0, 2.0**60, float("inf"), float("-inf"), 5e-324)
    body = tuple(Op("TMULS", "x", ("x", v)) for v in (*values, float("nan")))
    module = Module("floats")
    module.add(Function("f", FunctionKind.INCORE, (), (), (Tile("x", 1, 1, F32),), body))
    text = print_module(module)
    assert "%x = tmuls %x, nan\n" in text and "%x = tmuls %x, -inf\n" in text
    parsed = parse(text, verify=False).functions["f"].body
    assert [op.srcs[1] for op in parsed[:-1]] == list(values)
    assert all(type(op.srcs[1]) is float for op in parsed)
    assert math.isnan(parsed[-1].srcs[1])
    assert math.copysign(1.0, parsed[2].srcs[1]) == -1.0  # -0.0 keeps its sign
    assert print_module(parse(text, verify=False)) == text


# -- the golden text ----------------------------------------------------------------------------

def softmax_module() -> Module:
    """docs/DESIGN.md's softmax module, from ir classes."""
    m = Module("softmax_module")
    m.add(Function(
        "softmax_tile", FunctionKind.INCORE, (MemRef("input", F32, (8, 64)), MemRef("output", F32, (8, 64))),
        (), (Tile("x", 8, 64, F32), Tile("mx", 8, 1, F32), Tile("s", 8, 1, F32)),
        (Op("TLOAD", "x", ("input", 0, 0)), Op("TROWMAX", "mx", ("x",)),
         Op("TROWEXPANDSUB", "x", ("x", "mx")), Op("TEXP", "x", ("x",)), Op("TROWSUM", "s", ("x",)),
         Op("TROWEXPANDDIV", "x", ("x", "s")), Op("TSTORE", "output", ("x", 0, 0)))))
    m.add(Function(
        "dynamic_softmax", FunctionKind.ORCHESTRATION, (MemRef("input", F32), MemRef("output", F32)),
        (Scalar("num_tiles", pto.INT32),), (),
        (For("i", 0, "num_tiles", 1, (Call("softmax_tile", (("input", CallArg("input", "i", 0)),
                                                           ("output", CallArg("output", "i", 0)))),),
             max_range=4096, min_range=256),)))
    return m


SOFTMAX_PTO = """\
// PTO Module: softmax_module

// Function Type: InCore
func @softmax_tile(%input: !pto.memref<f32, 8x64>, %output: !pto.memref<f32, 8x64>) {
  %x = alloc_tile : !pto.tile<8x64xf32>
  %mx = alloc_tile : !pto.tile<8x1xf32>
  %s = alloc_tile : !pto.tile<8x1xf32>
  %x = tload %input[0, 0]
  %mx = trowmax %x
  %x = trowexpandsub %x, %mx
  %x = texp %x
  %s = trowsum %x
  %x = trowexpanddiv %x, %s
  tstore %x, %output[0, 0]
}

// Function Type: Orchestration
func @dynamic_softmax(%input: !pto.memref<f32>, %output: !pto.memref<f32>, %num_tiles: i32) {
  FOR %i:idx, 0:idx, %num_tiles:idx, 1:idx max_range=4096 min_range=256
    CALL @softmax_tile(%input -> %input[%i, 0], %output -> %output[%i, 0])
  ENDFOR
}
"""


def test_golden_softmax():
    assert print_module(softmax_module()) == SOFTMAX_PTO
    assert parse(SOFTMAX_PTO) == softmax_module()


def test_comments_blank_lines_and_crlf_are_tolerated():
    text = (SOFTMAX_PTO.replace("\n", "  // a remark\n", 3)
            .replace("// Function Type: InCore", "\n\n// Entry: @x\n// Function Type: InCore")
            .replace("%x = texp %x", "%x = texp %x // exp"))
    text = "// a file comment\n\n" + text.replace("\n", "\r\n")
    assert parse(text) == softmax_module()


def test_everything_else_prints_as_documented():
    m = Module("m")
    m.add(Function("orch", FunctionKind.ORCHESTRATION, (MemRef("t", pto.BFLOAT16),),
                   (Scalar("k", pto.INT64, False), Scalar("n", pto.UINT8)), (),
                   (Op("SLI", "k", (-7,)), Op("SCMP", "k", ("n", 2, Predicate.LE)),
                    If("k", Predicate.EQ, 0, (Return(),), (Op("SDIV", "k", ("k", "n")),)),
                    If(1, Predicate.GT, "n", (), ()),
                    For("j", "n", 0, -1, (Call("g", ()),), max_range=8, tile_levels=((8, 64), (0, 32))))))
    assert print_module(m) == """\
// PTO Module: m

// Function Type: Orchestration
func @orch(%t: !pto.memref<bf16>, %n: u8) {
  %k = alloc_scalar : i64
  %k = sli -7
  %k = scmp le %n, 2
  IF %k eq 0
    return
  ELSE
    %k = sdiv %k, %n
  ENDIF
  IF 1 gt %n
  ENDIF
  FOR %j:idx, %n:idx, 0:idx, -1:idx max_range=8 tile_levels={8:64,0:32}
    CALL @g()
  ENDFOR
}
"""
    parsed = parse(print_module(m), verify=False)
    assert parsed.functions["orch"].scalars == (Scalar("n", pto.UINT8), Scalar("k", pto.INT64, False))


@pytest.mark.parametrize("statement, problem", [
    (Op("TADD", "x", ("x",)), "TADD takes 2 sources, not 1"),
    (Op("TMULS", "x", ("x", None)), "None is not a number or %name"),
    (Op("TLOAD", "x", ("m", 0.5, 0)), "0.5 is not an integer or %name"),
    (Op("SCMP", "x", (1, 2, "lt")), "its predicate is not a Predicate"),
    (Op("TEXP", "x y", ("x",)), "'x y' is not a name"),
    (Op("TNOPE", "x", ()), "unknown instruction 'TNOPE'"),
    (Call("g", (("p", CallArg("t", 1)),)), "argument p has a row without a col"),
])
def test_printer_refuses_what_it_cannot_spell(statement, problem):
    m = Module("m")
    m.add(Function("f", FunctionKind.INCORE, (), (), (), (statement,)))
    with pytest.raises(isa.ISAError, match="cannot print function @f: .*" + re.escape(problem)):
        print_module(m)


# -- parse errors -------------------------------------------------------------------------------

HEAD = "// PTO Module: m\n// Function Type: InCore\nfunc @f(%a: !pto.memref<f32, 8x8>) {\n"


@pytest.mark.parametrize("text, message", [
    ("func @f() {\n}\n", "1:1: expected '// PTO Module: <name>', found 'func'"),
    ("// PTO Module: m\nfunc @f() {\n}\n", "2:1: expected '// Function Type: InCore|Orchestration' or end"),
    ("// PTO Module: m\n// Function Type: Inline\n", "2:1: expected a function type (InCore or Orchestra"),
    (HEAD + "  %x = tfoo %a\n}\n", "4:8: in @f expected an instruction, found 'tfoo'"),
    (HEAD + "  %x = TADD %a, %a\n}\n", "4:8: in @f expected an instruction, found 'TADD'"),
    (HEAD + "  %x = tload %a[0.5, 0]\n}\n", "4:17: in @f expected an integer or %name, found '0.5'"),
    (HEAD + "  %x = tadd %a %a\n}\n", "4:16: in @f expected ',', found '%a'"),
    (HEAD + "  %x = tadd %a, %a, %a\n}\n", "4:19: in @f expected end of line, found ','"),
    (HEAD + "  %x = tstore %a, %a[0, 0]\n}\n", "4:8: in @f expected 'tstore %tile, %mem[row, col]'"),
    (HEAD + "  texp %a\n}\n", "4:3: in @f expected '%dst = texp ...'"),
    (HEAD + "  %x = scmp lq %a, 1\n}\n", "4:13: in @f expected a predicate (lt le gt ge eq ne), found 'lq'"),
    (HEAD + "  FOR %i:idx, 0:idx, 4:idx, 1:idx\n    return\n}\n", "6:1: in @f expected 'ENDFOR', found '}'"),
    (HEAD + "  FOR %i:idx, 0:idx, 4:idx, 1:idx max_range=8 max_range=8\n  ENDFOR\n}\n",
     "4:47: in @f expected one of max_range, min_range, tile_levels, rows, each at most once, "
     "found 'max_range'"),
    (HEAD + "  IF %i lt 3\n  ENDFOR\n}\n", "5:3: in @f expected 'ELSE' or 'ENDIF', found 'ENDFOR'"),
    (HEAD + "  CALL @g(%p %t)\n}\n", "4:14: in @f expected '->' or '=', found '%t'"),
    (HEAD + "  return\n", "5:1: in @f expected '}', found end of input"),
    (HEAD.replace("f32, 8x8", "f33"), "3:25: in @f expected a dtype (f32 f16 bf16 f64 i64 i32 i16 i8 u64 u8"),
    (HEAD + "  %t = alloc_tile : !pto.tile<8x8xq>\n}\n", "4:31: in @f expected ROWSxCOLSxDTYPE, found '8x8"),
    (HEAD + "  %x = texp %a $\n}\n", "4:16: in @f expected end of line, found '$'"),
    (HEAD + "}\n// Function Type: InCore\nfunc @f() {\n}\n", "6:6: in @f module m already has a function @f"),
])
def test_parse_errors_point_at_line_and_column(text, message):
    with pytest.raises(isa.ISAError) as error:
        parse(text)
    assert str(error.value).startswith(message), str(error.value)


# -- to_python ----------------------------------------------------------------------------------

def rich_module() -> Module:
    """A valid module (the builder verifies each function) using most of the builder: an
    Orchestration that calls a function defined after it, then InCore functions."""
    m = Module("rich")
    (FunctionBuilder("orch", module=m).not_in_core()
        .memref("x", F32).memref("y", F32).scalar("n", pto.INT64).scalar_var("h", pto.INT64)
        .scalar_div("h", "n", 2)
        .for_loop("i", 0, "n", 1, max_range=4096, min_range=256, tile_levels={0: 32, 4096: 64})
            .for_loop("j", 0, "h", 1)
                .call("copy", {"src": ("x", "i", "j"), "dst": "y"})
            .end_for()
        .end_for()
        .build())
    (FunctionBuilder("copy", module=m).in_core()
        .memref("src", F32, (8, 8)).memref("dst", F32, (8, 8)).tile("t", 8, 8, F32)
        .load("t", "src").store("dst", "t")
        .build())
    (FunctionBuilder("tile_ops", module=m).in_core()
        .memref("a", F32, (16, 16)).memref("o", F32, (16, 16)).scalar("k", pto.INT32).scalar_var("s", F32)
        .scalar_var("c", pto.INT32)
        .tile("t", 8, 8, F32).tile("u", 8, 8, F32).tile("r", 8, 1, F32).tile("q", 1, 8, F32)
        .scalar_li("s", float("-inf")).scalar_cmp("c", "k", 2, "ge")
        .for_loop("i", 0, 2, 1)
            .load("t", "a", "i", 8).matmul("u", "t", "t").matmul_acc("u", "t", "t")
            .causal_mask("u", "u", "i", 0)
            .rowmax("r", "u").rowexpandsub("u", "u", "r").colsum("q", "u").colexpandmul("u", "u", "q")
            .muls("u", "u", 0.125).maxs("u", "u", "s").silu("u", "u").add("u", "u", "t")
            .if_then("i", "lt", "k").store("o", "u", 0, 0).else_().store("o", "u", 8, 8).end_if()
            .call("copy", {"src": ("a", 1, "i"), "dst": "o"})
        .end_for()
        .ret()
        .build())
    return m


def owned_module() -> isa.Module:
    """An allocation owned with a view of an array (`alloc ... owner %v`: distributed runs)."""
    m = isa.Module("owned")
    (FunctionBuilder("fill", module=m).library("pto_gpu.kernels.tiles.zero")
        .memref("out", pto.FLOAT32, direction="output").build())
    (FunctionBuilder("copy", module=m).library("pto_gpu.kernels.tiles.copy")
        .memref("src", pto.FLOAT32, direction="input").memref("dst", pto.FLOAT32, direction="output").build())
    (FunctionBuilder("orch", module=m).not_in_core().memref("x", pto.FLOAT32).scalar("n", pto.INT64)
        .tensor("rows", pto.FLOAT32).tensor("acc", pto.FLOAT32)
        .view("rows", "x", ((0, "n"), None)).alloc("acc", ("n", 4), owner="rows")
        .call("fill", {"out": "acc"}).call("copy", {"src": "acc", "dst": "rows"}).build())
    return m


def test_an_allocation_owned_with_a_tensor_prints_and_parses():
    text = print_module(owned_module())
    assert "  %acc = alloc [%n, 4] owner %rows\n" in text
    assert parse(text) == owned_module()


@pytest.mark.parametrize("build", [softmax_module, rich_module, owned_module])
def test_to_python_rebuilds_the_module(build):
    module = build()
    source = to_python(module)
    namespace: dict = {}
    exec(compile(source, "<to_python>", "exec"), namespace)
    assert namespace["m"] == module
    assert to_python(parse(print_module(module))) == source


def test_to_python_text():
    assert to_python(softmax_module()) == """\
import pto_gpu as pto
from pto_gpu import isa

m = isa.Module("softmax_module")
(isa.FunctionBuilder("softmax_tile", module=m).in_core()
    .memref("input", pto.FLOAT32, (8, 64))
    .memref("output", pto.FLOAT32, (8, 64))
    .tile("x", 8, 64, pto.FLOAT32)
    .tile("mx", 8, 1, pto.FLOAT32)
    .tile("s", 8, 1, pto.FLOAT32)
    .load("x", "input", 0, 0)
    .rowmax("mx", "x")
    .rowexpandsub("x", "x", "mx")
    .exp("x", "x")
    .rowsum("s", "x")
    .rowexpanddiv("x", "x", "s")
    .store("output", "x", 0, 0)
    .build())
(isa.FunctionBuilder("dynamic_softmax", module=m).not_in_core()
    .memref("input", pto.FLOAT32)
    .memref("output", pto.FLOAT32)
    .scalar("num_tiles", pto.INT32)
    .for_loop("i", 0, "num_tiles", 1, max_range=4096, min_range=256)
        .call("softmax_tile", {"input": ("input", "i", 0), "output": ("output", "i", 0)})
    .end_for()
    .build())
"""


def test_a_functions_flags_round_trip_through_text_and_to_python():
    """`column_tails` and `tf32` after the parameters, in that order, and their builder calls."""
    module = Module("flags")
    module.add(Function("f", FunctionKind.INCORE, (MemRef("m", F32, (8, 8)),), (), (Tile("t", 8, 8, F32),),
                        (Op("TLOAD", "t", ("m", 0, 0)), Op("TSTORE", "m", ("t", 0, 0))), column_tails=True,
                        tf32=True))
    text = print_module(module)
    assert "func @f(%m: !pto.memref<f32, 8x8>) column_tails tf32 {" in text
    assert parse(text) == module
    scope = {"isa": isa, "pto": pto}
    exec(to_python(module), scope)
    assert scope["m"] == module
