"""FunctionBuilder (pto_gpu/isa/builder.py): it writes the same ir a hand-written program is,
has one method per opcode table entry, checks arity at the call and blocks at build."""

import inspect

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa import (
    OPCODES,
    Call,
    CallArg,
    For,
    Form,
    Function,
    FunctionBuilder,
    FunctionKind,
    If,
    ISAError,
    MemRef,
    Module,
    Op,
    Predicate,
    Return,
    Scalar,
    Tile,
)
from pto_gpu.isa.operands import signature

F32 = pto.FLOAT32


def test_design_softmax_example_builds_the_hand_written_module():
    m = Module("softmax_module")
    (FunctionBuilder("softmax_tile", module=m).in_core()
        .memref("input", pto.FLOAT32, (8, 64)).memref("output", pto.FLOAT32, (8, 64))
        .tile("x", 8, 64, pto.FLOAT32).tile("mx", 8, 1, pto.FLOAT32).tile("s", 8, 1, pto.FLOAT32)
        .load("x", "input").rowmax("mx", "x").rowexpandsub("x", "x", "mx").exp("x", "x")
        .rowsum("s", "x").rowexpanddiv("x", "x", "s").store("output", "x")
        .build())
    (FunctionBuilder("dynamic_softmax", module=m).not_in_core()
        .memref("input", pto.FLOAT32).memref("output", pto.FLOAT32).scalar("num_tiles", pto.INT32)
        .for_loop("i", 0, "num_tiles", 1, max_range=4096, min_range=256)
            .call("softmax_tile", {"input": ("input", "i", 0), "output": ("output", "i", 0)})
        .end_for()
        .build())

    expected = Module("softmax_module")
    expected.add(Function(
        "softmax_tile", FunctionKind.INCORE,
        (MemRef("input", F32, (8, 64)), MemRef("output", F32, (8, 64))), (),
        (Tile("x", 8, 64, F32), Tile("mx", 8, 1, F32), Tile("s", 8, 1, F32)),
        (Op("TLOAD", "x", ("input", 0, 0)), Op("TROWMAX", "mx", ("x",)),
         Op("TROWEXPANDSUB", "x", ("x", "mx")), Op("TEXP", "x", ("x",)), Op("TROWSUM", "s", ("x",)),
         Op("TROWEXPANDDIV", "x", ("x", "s")), Op("TSTORE", "output", ("x", 0, 0)))))
    expected.add(Function(
        "dynamic_softmax", FunctionKind.ORCHESTRATION, (MemRef("input", F32), MemRef("output", F32)),
        (Scalar("num_tiles", pto.INT32),), (),
        (For("i", 0, "num_tiles", 1, (Call("softmax_tile", (("input", CallArg("input", "i", 0)),
                                                             ("output", CallArg("output", "i", 0)))),),
             max_range=4096, min_range=256),)))
    assert m == expected
    assert m != Module("softmax_module", dict(list(expected.functions.items())[:1]))


# Operands for one instruction of each form, over the tiles of `program`: a, b, d are 8x8,
# r is 8x1, c is 1x8; m is an (8, 8) memref; k a local and n a parameter, both ints.
ARGS = {
    Form.LOAD: ("a", "m"), Form.STORE: ("m", "d"), Form.UNARY: ("d", "a"), Form.BINARY: ("d", "a", "b"),
    Form.TILE_SCALAR: ("d", "a", 2.0), Form.ROW_REDUCE: ("r", "a"), Form.COL_REDUCE: ("c", "a"),
    Form.ROW_EXPAND: ("d", "a", "r"), Form.COL_EXPAND: ("d", "a", "c"), Form.MATMUL: ("d", "a", "b"),
    Form.MASK: ("d", "a", "n", 0), Form.GENERATE: ("d", 2.0), Form.TRANSPOSE: ("d", "a"),
    Form.CONVERT: ("d", "a"),
    Form.SCALAR: ("k", "n", 3), Form.COMPARE: ("k", "n", 3, "ge"), Form.DIM: ("k", "m", 1),
}


TILES = (("a", 8, 8), ("b", 8, 8), ("d", 8, 8), ("r", 8, 1), ("c", 1, 8))


def program() -> FunctionBuilder:
    """A function whose tiles are all loaded (a tile is written before it is read), ready for
    one more instruction."""
    builder = FunctionBuilder("each").memref("m", F32, (8, 8)).scalar("n", pto.INT64)
    builder.scalar_var("k", pto.INT64)
    for name, rows, cols in TILES:
        builder.tile(name, rows, cols, F32)
    for name, *_ in TILES:
        builder.load(name, "m")
    return builder


@pytest.mark.parametrize("spec", OPCODES.values(), ids=OPCODES.keys())
def test_every_opcode_has_a_builder_method(spec):
    method = getattr(FunctionBuilder, spec.builder)
    operands = signature(spec)
    assert list(inspect.signature(method).parameters)[1:] == [o.name for o in operands]
    args = (("k", 7) if spec.spelling == "SLI" else ARGS[spec.form])
    if spec.form is Form.DIM:  # orchestrations only: the memref goes to a call so it has a direction
        builder = FunctionBuilder("each").not_in_core().memref("m", F32).scalar_var("k", pto.INT64)
        function = getattr(builder, spec.builder)(*args).call("g", {"x": "m"}).build()
        assert function.body[0] == Op(spec.spelling, args[0], args[1:])
        return
    function = getattr(program(), spec.builder)(*args).store("m", "d").build()
    op = function.body[len(TILES)]
    filled = args + tuple(o.default for o in operands[len(args):])
    expected_srcs = filled[1:-1] + (Predicate(filled[-1]),) if spec.form is Form.COMPARE else filled[1:]
    assert op == Op(spec.spelling, filled[0], expected_srcs)


@pytest.mark.parametrize("call, message", [
    (lambda b: b.add("d", "a"), r"^@each: add\(dst, a, b\) \(TADD\): missing a required argument: 'b'"),
    (lambda b: b.exp("d", "a", "b"), r"^@each: exp\(dst, a\) \(TEXP\): too many positional arguments"),
    (lambda b: b.load("a"), r"^@each: load\(tile, memref, row=0, col=0\) \(TLOAD\): missing .* 'memref'"),
    (lambda b: b.causal_mask("d", "a", 0),
     r"^@each: causal_mask\(dst, a, row, col\) \(TCAUSALMASK\): missing"),
    (lambda b: b.scalar_li("k"), r"^@each: scalar_li\(dst, value\) \(SLI\): missing .* 'value'"),
    (lambda b: b.scalar_cmp("k", "n", 1), r"^@each: scalar_cmp\(dst, a, b, predicate\) \(SCMP\): missing"),
    (lambda b: b.store("m", "d", rows=1),
     r"^@each: store\(memref, tile, row=0, col=0\) \(TSTORE\): .*'rows'"),
    (lambda b: b.scalar_cmp("k", "n", 1, "<"), r"^@each: scalar_cmp.*: '<' is not a predicate \(lt, le, gt"),
])
def test_wrong_arity_is_refused_at_the_call(call, message):
    with pytest.raises(ISAError, match=message):
        call(program())


def test_offsets_by_keyword_and_numpy_numbers_build_plain_operands():
    function = (program().load("a", "m", col=np.int64(0)).muls("d", "a", np.float32(0.5))
                .store("m", "d", row=np.int32(0)).build())
    assert function.body[len(TILES):] == (Op("TLOAD", "a", ("m", 0, 0)), Op("TMULS", "d", ("a", 0.5)),
                                         Op("TSTORE", "m", ("d", 0, 0)))
    assert all(type(v) in (str, int, float) for op in function.body for v in op.srcs)


def test_control_flow_nests_and_tile_levels_are_stored_sorted():
    m = Module("m")
    (FunctionBuilder("leaf", module=m).memref("t", F32, (8, 8)).tile("x", 8, 8, F32)
        .load("x", "t").store("t", "x").build())
    built = (FunctionBuilder("orch", module=m).not_in_core().memref("t", F32).scalar("n", pto.INT32)
             .scalar_var("flag", pto.INT32)
             .for_loop("i", 0, "n", max_range=64, min_range=16, tile_levels={64: 16, 0: 4, 16: 8})
             .scalar_cmp("flag", "i", 2, Predicate.LT)
             .if_then("flag", "ne", 0).call("leaf", {"t": ("t", "i", 0)})
             .else_().call("leaf", {"t": "t"}).ret().end_if()
             .if_then("i", "eq", 0).scalar_li("flag", 1).end_if()
             .end_for().ret().build())
    expected = Function("orch", FunctionKind.ORCHESTRATION, (MemRef("t", F32),),
                        (Scalar("n", pto.INT32), Scalar("flag", pto.INT32, param=False)), (), (
        For("i", 0, "n", 1, (
            Op("SCMP", "flag", ("i", 2, Predicate.LT)),
            If("flag", Predicate.NE, 0, (Call("leaf", (("t", CallArg("t", "i", 0)),)),),
               (Call("leaf", (("t", CallArg("t")),)), Return())),
            If("i", Predicate.EQ, 0, (Op("SLI", "flag", (1,)),)),
        ), max_range=64, min_range=16, tile_levels=((0, 4), (16, 8), (64, 16))),
        Return()))
    assert built == expected
    assert list(m.functions) == ["leaf", "orch"]


@pytest.mark.parametrize("steps, message", [
    (lambda b: b.end_for(), r"^@each: end_for\(\) without an open for_loop \(no block is open\)"),
    (lambda b: b.for_loop("i", 0, 4).end_if(),
     r"^@each: end_if\(\) without an open if_then \(open: for_loop %i\)"),
    (lambda b: b.if_then("n", "lt", 2).end_for(),
     r"^@each: end_for\(\) without an open for_loop \(open: if_then n lt 2\)"),
    (lambda b: b.if_then("n", "lt", 2).else_().else_(), r"^@each: else_\(\) without an open if_then"),
    (lambda b: b.for_loop("i", 0, 4).else_(), r"^@each: else_\(\) without an open if_then"),
    (lambda b: b.for_loop("i", 0, 4).build(),
     r"^@each: for_loop %i is not closed: call end_for\(\) before build"),
    (lambda b: b.if_then("n", "lt", 2).build(), r"^@each: if_then n lt 2 is not closed: call end_if\(\)"),
    (lambda b: b.if_then("n", "below", 2), r"^@each: if_then: 'below' is not a predicate"),
    (lambda b: b.call("leaf", {"t": ("t", 0)}), r"^@each: call @leaf: argument t=\('t', 0\) is neither"),
    (lambda b: b.memref("z", "float128"), r"^@each: memref %z: unknown dtype 'float128'"),
])
def test_blocks_and_arguments_are_checked(steps, message):
    with pytest.raises(ISAError, match=message):
        steps(program())


def test_build_verifies_and_adds_to_the_module():
    m = Module("m")
    with pytest.raises(ISAError, match=r"^@each: TADD %d, %a, %r: tile %r is 8x1 but %a is 8x8"):
        program().add("d", "a", "r").store("m", "d").build()
    function = FunctionBuilder("copy", module=m).memref("m", np.float32, (8, 8)).tile("x", 8, 8, "float32") \
        .load("x", "m").store("m", "x").build()
    assert m.functions == {"copy": function}
    assert function.memrefs == (MemRef("m", F32, (8, 8)),) and function.in_core
    with pytest.raises(ISAError, match="already has a function @copy"):
        FunctionBuilder("copy", module=m).memref("m", F32, (8, 8)).tile("x", 8, 8, F32).load("x", "m").build()


def test_parameters_come_first_whatever_the_declaration_order_so_the_assembly_round_trips():
    m = isa.Module("m")
    function = (isa.FunctionBuilder("f", module=m).in_core()
                .memref("input", pto.FLOAT32, (8, 8)).memref("output", pto.FLOAT32, (8, 8))
                .tile("x", 8, 8, pto.FLOAT32).scalar_var("k", pto.INT32).scalar("n", pto.INT32)
                .scalar("scale", pto.FLOAT32)
                .load("x", "input").scalar_li("k", 2).muls("x", "x", "scale").store("output", "x")
                .build())
    assert [(s.name, s.param) for s in function.scalars] == [("n", True), ("scale", True), ("k", False)]
    assert isa.parse(isa.print_module(m)) == m



def test_a_call_binds_the_callees_scalar_parameters_and_round_trips():
    m = isa.Module("m")
    (isa.FunctionBuilder("scale_tile", module=m).in_core()
        .memref("input", pto.FLOAT32, (8, 8)).memref("output", pto.FLOAT32, (8, 8))
        .scalar("factor", pto.FLOAT32).tile("x", 8, 8, pto.FLOAT32)
        .load("x", "input").muls("x", "x", "factor").store("output", "x")
        .build())
    (isa.FunctionBuilder("scale_all", module=m).not_in_core()
        .memref("input", pto.FLOAT32).memref("output", pto.FLOAT32).scalar("n", pto.INT32)
        .scalar("factor", pto.FLOAT32)
        .for_loop("i", 0, "n", 1)
            .call("scale_tile", {"input": ("input", "i", 0), "output": ("output", "i", 0)},
                  scalars={"factor": "factor"})
        .end_for()
        .build())
    isa.verify_module(m)
    call = m.functions["scale_all"].body[0].body[0]
    assert call.scalars == (("factor", "factor"),)
    binds = "CALL @scale_tile(%input -> %input[%i, 0], %output -> %output[%i, 0], %factor = %factor)"
    assert binds in isa.print_module(m)
    assert isa.parse(isa.print_module(m)) == m
    rebuilt = {}
    exec(isa.to_python(m), rebuilt)
    assert rebuilt["m"] == m
