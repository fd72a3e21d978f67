"""The verifier (pto_gpu/isa/verify.py): every rule rejects a program that breaks it, with a
message naming the function and the instruction; directions are inferred from loads, stores
and calls."""

import dataclasses

import pytest

import pto_gpu as pto
from pto_gpu.isa import (
    Call,
    CallArg,
    Direction,
    For,
    Function,
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
    directions,
    verify_function,
    verify_module,
)

F32, F16, I32 = pto.FLOAT32, pto.FLOAT16, pto.INT32
INCORE, ORCH = FunctionKind.INCORE, FunctionKind.ORCHESTRATION

TILES = (Tile("x", 8, 64, F32), Tile("y", 8, 64, F32), Tile("w", 8, 32, F32), Tile("r", 8, 1, F32),
         Tile("c", 1, 64, F32), Tile("h", 8, 64, F16), Tile("k", 64, 16, F32), Tile("m", 8, 16, F32))
MEMREFS = (MemRef("input", F32, (8, 64)), MemRef("output", F32, (8, 64)))
SCALARS = (Scalar("n", I32), Scalar("v", F32), Scalar("t", I32, param=False))
LOAD = Op("TLOAD", "x", ("input", 0, 0))
LOAD_Y = Op("TLOAD", "y", ("input", 0, 0))
STORE = Op("TSTORE", "output", ("y", 0, 0))


def kernel(*body, name="tile_fn", **changes) -> Function:
    """A valid InCore function with `body` between loads of x and y and a store, then `changes`."""
    function = Function(name, INCORE, MEMREFS, SCALARS, TILES, (LOAD, LOAD_Y, *body, STORE))
    return dataclasses.replace(function, **changes)


def orchestration(*body, name="orch", **changes) -> Function:
    """An Orchestration over input/output that calls tile_fn on windows, then `body`."""
    call = Call("tile_fn", (("input", CallArg("input", "i", 0)), ("output", CallArg("output", "i", 0))))
    function = Function(name, ORCH, (MemRef("input", F32), MemRef("output", F32)), (SCALARS[0], SCALARS[2]),
                        (), (For("i", 0, "n", 1, (call,)), *body))
    return dataclasses.replace(function, **changes)


def callee() -> Function:
    """tile_fn as orchestrations call it: a CALL binds memrefs only, so no scalar parameters."""
    return kernel(scalars=SCALARS[2:])


def module(*functions: Function) -> Module:
    m = Module("m")
    for function in functions:
        m.add(function)
    return m


def loop(*body, **options) -> For:
    return For("i", 0, "n", 1, body, **options)


BAD = [
    # names
    ("unknown name", kernel(Op("TADD", "y", ("x", "q"))), "@tile_fn: TADD %y, %x, %q: unknown name %q"),
    ("duplicate name", kernel(tiles=TILES + (Tile("input", 8, 64, F32),)),
     "@tile_fn: tile %input: %input is already declared as a memref"),
    ("invalid name", kernel(scalars=(Scalar("a b", I32),)),
     "@tile_fn: scalar %a b: 'a b' is not a valid name"),
    ("dtype not a DataType", kernel(tiles=TILES + (Tile("z", 8, 8, "f32"),)),
     "@tile_fn: tile %z: dtype 'f32' is not a pto.DataType"),
    ("tile shape", kernel(tiles=TILES + (Tile("z", 0, 8, F32),)),
     "@tile_fn: tile %z: shape 0x8 is not of positive"),
    ("memref shape", kernel(memrefs=MEMREFS + (MemRef("z", F32, (8,)),)),
     "@tile_fn: memref %z: shape (8,) is not (rows, cols)"),
    # operand kinds and arity
    ("memref as tile", kernel(Op("TADD", "y", ("x", "input"))),
     "@tile_fn: TADD %y, %x, %input: %input is a memref, not a tile"),
    ("tile as memref", kernel(Op("TLOAD", "y", ("x", 0, 0))),
     "@tile_fn: TLOAD %y, %x, 0, 0: %x is a tile, not a memref"),
    ("tile as scalar", kernel(Op("TMULS", "y", ("x", "w"))),
     "@tile_fn: TMULS %y, %x, %w: %w is a tile, not a value"),
    ("unknown opcode", kernel(Op("TFOO", "y", ("x",))), "@tile_fn: TFOO %y, %x: unknown instruction TFOO"),
    # dataflow
    ("tile read before written", kernel(Op("TEXP", "w", ("w",))),
     "@tile_fn: TEXP %w, %w: reads tile %w before any instruction writes it"),
    ("tile read in a loop before the loop writes it",
     kernel(loop(Op("TMULS", "y", ("z", 2.0)), Op("TLOAD", "z", ("input", 0, 0))),
            tiles=TILES + (Tile("z", 8, 64, F32),)),
     "@tile_fn: TMULS %y, %z, 2.0: reads tile %z before any instruction writes it"),
    ("accumulator never written", kernel(Op("TMATMUL_ACC", "m", ("x", "k"))),
     "@tile_fn: TMATMUL_ACC %m, %x, %k: reads tile %k before any instruction writes it"),
    ("arity", kernel(Op("TADD", "y", ("x",))),
     "@tile_fn: TADD %y, %x: TADD takes 3 operands (dst, a, b), got 2"),
    ("float offset", kernel(Op("TLOAD", "y", ("input", 1.5, 0))),
     "@tile_fn: TLOAD %y, %input, 1.5, 0: 1.5 is not an integer"),
    ("float scalar offset", kernel(Op("TLOAD", "y", ("input", "v", 0))),
     "@tile_fn: TLOAD %y, %input, %v, 0: %v is FLOAT32, not an integer"),
    ("immediate expected", kernel(Op("SLI", "t", ("n",))), "@tile_fn: SLI %t, %n: 'n' is not a number"),
    ("predicate", kernel(Op("SCMP", "t", ("n", 1, "lt"))),
     "@tile_fn: SCMP %t, %n, 1, %lt: 'lt' is not a Predicate"),
    # shapes per Form
    ("binary shape", kernel(Op("TADD", "y", ("x", "w"))),
     "@tile_fn: TADD %y, %x, %w: tile %w is 8x32 but %x is 8x64"),
    ("binary dst shape", kernel(Op("TADD", "w", ("x", "y"))),
     "@tile_fn: TADD %w, %x, %y: tile %w is 8x32 but %x is 8x64"),
    ("unary shape", kernel(Op("TEXP", "w", ("x",))), "@tile_fn: TEXP %w, %x: tile %w is 8x32 but %x is 8x64"),
    ("tile-scalar shape", kernel(Op("TMULS", "w", ("x", 2.0))),
     "@tile_fn: TMULS %w, %x, 2.0: tile %w is 8x32 but %x is 8x64"),
    ("mask shape", kernel(Op("TCAUSALMASK", "w", ("x", 0, "n"))),
     "@tile_fn: TCAUSALMASK %w, %x, 0, %n: tile %w is 8x32 but %x is 8x64"),
    ("row reduce shape", kernel(Op("TROWMAX", "c", ("x",))),
     "@tile_fn: TROWMAX %c, %x: tile %c is 1x64 but the row reduction of %x (8x64) is 8x1"),
    ("col reduce shape", kernel(Op("TCOLSUM", "r", ("x",))),
     "@tile_fn: TCOLSUM %r, %x: tile %r is 8x1 but the column reduction of %x (8x64) is 1x64"),
    ("row expand shape", kernel(Op("TROWEXPANDSUB", "y", ("x", "c"))),
     "@tile_fn: TROWEXPANDSUB %y, %x, %c: tile %c is 1x64 but broadcasting along the rows of %x (8x64) "
     "needs 8x1"),
    ("col expand shape", kernel(Op("TCOLEXPANDADD", "y", ("x", "r"))),
     "@tile_fn: TCOLEXPANDADD %y, %x, %r: tile %r is 8x1 but broadcasting down the columns of %x (8x64) "
     "needs 1x64"),
    ("matmul inner", kernel(Op("TMATMUL", "m", ("x", "m"))),
     "@tile_fn: TMATMUL %m, %x, %m: tile %m is 8x16 but %x is 8x64, so %m needs 64 rows"),
    ("matmul dst", kernel(Op("TMATMUL_ACC", "y", ("x", "k"))),
     "@tile_fn: TMATMUL_ACC %y, %x, %k: tile %y is 8x64 but %x @ %k is 8x16"),
    # dtypes
    ("tile dtypes", kernel(Op("TADD", "y", ("x", "h"))),
     "@tile_fn: TADD %y, %x, %h: tile %h is FLOAT16 but %x is FLOAT32"),
    ("load dtype", kernel(Op("TLOAD", "h", ("input", 0, 0))),
     "@tile_fn: TLOAD %h, %input, 0, 0: memref %input is FLOAT32 but tile %h is FLOAT16"),
    # memrefs of InCore functions
    ("no shape", kernel(memrefs=(MemRef("input", F32), MEMREFS[1])),
     "@tile_fn: memref %input: memrefs of InCore functions need a shape"),
    ("does not fit", kernel(Op("TSTORE", "output", ("x", 0, 4))),
     "@tile_fn: TSTORE %output, %x, 0, 4: tile %x (8x64) at col 4 does not fit memref %output (8x64)"),
    ("negative offset", kernel(Op("TLOAD", "x", ("input", -1, 0))),
     "@tile_fn: TLOAD %x, %input, -1, 0: negative row offset -1"),
    ("unused memref", kernel(memrefs=MEMREFS + (MemRef("extra", F32, (8, 64)),)),
     "@tile_fn: memref %extra: neither loaded nor stored"),
    # kinds of function
    ("tile op in orchestration", orchestration(Op("TEXP", "x", ("x",))),
     "@orch: TEXP %x, %x: tile instructions belong in InCore functions"),
    ("tiles in orchestration", orchestration(tiles=TILES[:1]),
     "@orch: tile %x: Orchestration functions have no tiles"),
    ("unused orchestration memref", orchestration(memrefs=(MemRef("input", F32), MemRef("output", F32),
                                                           MemRef("spare", F32))),
     "@orch: memref %spare: neither passed to a call"),
    # scalars and loops
    ("integer tile", kernel(tiles=TILES + (Tile("ints", 8, 8, I32),)),
     "@tile_fn: tile %ints: tiles hold floating point (FLOAT16, BFLOAT16, FLOAT32, FLOAT64), not INT32"),
    ("local before a parameter", kernel(scalars=(SCALARS[2], SCALARS[0])),
     "@tile_fn: scalar %n: parameters come before locals (%t is a local)"),
    ("assign a parameter", kernel(Op("SLI", "n", (3,))),
     "@tile_fn: SLI %n, 3: scalar parameter %n is not assignable"),
    ("assign a loop variable", kernel(loop(Op("SADD", "i", ("i", 1)))),
     "@tile_fn: SADD %i, %i, 1: loop variable %i is not assignable"),
    ("loop variable out of scope", kernel(loop(), Op("TLOAD", "x", ("input", "i", 0))),
     "@tile_fn: TLOAD %x, %input, %i, 0: unknown name %i"),
    ("loop variable shadows", kernel(For("t", 0, 4, 1, ())),
     "@tile_fn: FOR %t, 0, 4, 1: loop variable %t is already declared as a local scalar"),
    ("nested loop variable", kernel(loop(loop())),
     "@tile_fn: FOR %i, 0, %n, 1: loop variable %i is already the variable of an enclosing loop"),
    ("float bound", kernel(For("i", 0, "v", 1, ())),
     "@tile_fn: FOR %i, 0, %v, 1: %v is FLOAT32, not an integer"),
    ("zero step", kernel(For("i", 0, 4, 0, ())), "@tile_fn: FOR %i, 0, 4, 0: step 0 never ends"),
    ("if operand", kernel(If("v", Predicate.LT, 3, ())),
     "@tile_fn: IF %v lt 3: %v is FLOAT32, not an integer"),
    ("binary expansion in InCore", kernel(loop(max_range=64)),
     "@tile_fn: FOR %i, 0, %n, 1: binary expansion"),
    ("max_range", orchestration(loop(max_range=100)),
     "@orch: FOR %i, 0, %n, 1: max_range 100 is not a power of two"),
    ("min_range above max_range", orchestration(loop(max_range=64, min_range=128)),
     "@orch: FOR %i, 0, %n, 1: min_range 128 is not a power of two <= max_range 64"),
    ("min_range not a power of two", orchestration(loop(max_range=64, min_range=12)),
     "@orch: FOR %i, 0, %n, 1: min_range 12 is not a power of two"),
    ("min_range alone", orchestration(loop(min_range=16)),
     "@orch: FOR %i, 0, %n, 1: min_range and tile_levels need max_range"),
    ("tile level size", orchestration(loop(max_range=64, min_range=16, tile_levels=((0, 8), (8, 16)))),
     "@orch: FOR %i, 0, %n, 1: tile_levels block size 8 is neither 0"),
    ("tile level rows", orchestration(loop(max_range=64, min_range=16, tile_levels=((16, 0),))),
     "@orch: FOR %i, 0, %n, 1: tile_levels rows 0 for block size 16"),
    ("tile levels unsorted", orchestration(loop(max_range=64, tile_levels=((32, 8), (16, 8)))),
     "@orch: FOR %i, 0, %n, 1: tile_levels ((32, 8), (16, 8)) are not sorted"),
]


@pytest.mark.parametrize("function, message", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_each_rule_rejects_with_function_and_instruction(function, message):
    others = [callee()] if function.kind is ORCH else []
    with pytest.raises(ISAError) as error:
        verify_module(module(function, *others))
    assert str(error.value).startswith(message)
    with pytest.raises(ISAError, match="^" + message.split(":")[0]):
        verify_function(function, module(*others))


def test_the_cases_are_otherwise_valid():
    verify_function(kernel())
    verify_module(module(callee(), orchestration()))


WHOLE = (("input", CallArg("input")), ("output", CallArg("output")))


def windowed(**args) -> Call:
    return Call("tile_fn", tuple((param, CallArg(*arg)) for param, arg in args.items()))


BAD_CALLS = [
    ("unknown callee", [callee(), orchestration(Call("nowhere", ()))],
     "@orch: CALL @nowhere(): unknown function @nowhere"),
    ("missing and unexpected", [callee(), orchestration(windowed(input=("input",), extra=("output",)))],
     "@orch: CALL @tile_fn(%input -> %input, %extra -> %output): @tile_fn takes memrefs (input, output): "
     "missing %output; no memref %extra"),
    ("unknown tensor", [callee(), orchestration(windowed(input=("input",), output=("q",)))],
     "@orch: CALL @tile_fn(%input -> %input, %output -> %q): unknown name %q"),
    ("bound twice", [callee(), orchestration(Call("tile_fn", (("input", CallArg("input")),) * 2))],
     "@orch: CALL @tile_fn(%input -> %input, %input -> %input): a callee parameter is bound twice"),
    ("half a window", [callee(), orchestration(windowed(input=("input", 0), output=("output",)))],
     "@orch: CALL @tile_fn(%input -> %input[0, None], %output -> %output): a window of %input needs both"),
    ("window of a shapeless memref",
     [callee(), orchestration(), orchestration(Call("orch", (("input", CallArg("input", 0, 0)),
                                                   ("output", CallArg("output")))), name="outer")],
     "@outer: CALL @orch(%input -> %input[0, 0], %output -> %output): %input of @orch has no shape"),
    ("window into an Orchestration",
     [callee(), orchestration(memrefs=MEMREFS),
      orchestration(Call("orch", (("input", CallArg("input", 0, 0)), ("output", CallArg("output")))),
                    name="outer")],
     "@outer: CALL @orch(%input -> %input[0, 0], %output -> %output): @orch is an Orchestration, whose "
     "memrefs take whole tensors: pass %input, not a window of it"),
    ("dtype", [callee(), orchestration(memrefs=(MemRef("input", F16), MemRef("output", F32)))],
     "@orch: CALL @tile_fn(%input -> %input[%i, 0], %output -> %output[%i, 0]): %input is FLOAT16 "
     "but %input of @tile_fn is FLOAT32"),
    ("unbound scalar parameter", [kernel(scalars=(Scalar("n", I32),)), orchestration()],
     "@orch: CALL @tile_fn(%input -> %input[%i, 0], %output -> %output[%i, 0]): @tile_fn takes scalar "
     "parameters (n); the call binds ()"),
    ("unknown scalar parameter", [callee(), orchestration(Call("tile_fn", WHOLE, (("eps", 0.5),)))],
     "@orch: CALL @tile_fn(%input -> %input, %output -> %output, %eps = 0.5): @tile_fn takes scalar "
     "parameters (); the call binds (eps)"),
    ("scalar argument not a scalar", [callee(), orchestration(Call("tile_fn", WHOLE, (("n", "input"),)))],
     "@orch: CALL @tile_fn(%input -> %input, %output -> %output, %n = %input): %input is a memref"),
    ("InCore calls Orchestration",
     [callee(), orchestration(), kernel(Call("orch", WHOLE), name="caller")],
     "@caller: CALL @orch(%input -> %input, %output -> %output): an InCore function can only call InCore"),
    ("self recursion", [kernel(Call("tile_fn", WHOLE))],
     "@tile_fn: CALL @tile_fn(%input -> %input, %output -> %output): recursive call: @tile_fn -> @tile_fn"),
    ("mutual recursion",
     [kernel(Call("other", WHOLE)), kernel(Call("tile_fn", WHOLE), name="other")],
     "@other: CALL @tile_fn(%input -> %input, %output -> %output): recursive call: "
     "@tile_fn -> @other -> @tile_fn"),
]


@pytest.mark.parametrize("functions, message", [case[1:] for case in BAD_CALLS],
                         ids=[case[0] for case in BAD_CALLS])
def test_calls_are_checked_against_their_callees(functions, message):
    with pytest.raises(ISAError) as error:
        verify_module(module(*functions))
    assert str(error.value).startswith(message)


def test_module_key_must_be_the_function_name():
    m = Module("m", {"alias": kernel()})
    with pytest.raises(ISAError, match="module m: @tile_fn is filed under @alias"):
        verify_module(m)


def test_verify_function_leaves_calls_to_absent_functions_to_verify_module():
    caller = orchestration()
    verify_function(caller, Module("m"))  # tile_fn may be added later
    with pytest.raises(ISAError, match="unknown function @tile_fn"):
        verify_module(module(caller))
    with pytest.raises(ISAError, match="unknown function @tile_fn"):
        directions(caller, Module("m"))


def in_core(*body, memrefs=("a", "b")) -> Function:
    return Function("f", INCORE, tuple(MemRef(name, F32, (8, 64)) for name in memrefs), (), TILES[:2], body)


@pytest.mark.parametrize("body, expected", [
    ((Op("TLOAD", "x", ("a", 0, 0)), Op("TSTORE", "b", ("x", 0, 0))),
     {"a": Direction.INPUT, "b": Direction.OUTPUT}),
    ((Op("TLOAD", "x", ("a", 0, 0)), Op("TLOAD", "y", ("b", 0, 0)), Op("TADD", "x", ("x", "y")),
      Op("TSTORE", "b", ("x", 0, 0))), {"a": Direction.INPUT, "b": Direction.INOUT}),
    # a store before a load of the same memref, inside control flow: still both
    ((Op("TFILL", "x", (0.0,)),
      For("i", 0, 2, 1, (If("i", Predicate.EQ, 0, (Op("TSTORE", "a", ("x", 0, 0)),),
                            (Op("TLOAD", "x", ("a", 0, 0)),)),)), Op("TSTORE", "b", ("x", 0, 0))),
     {"a": Direction.INOUT, "b": Direction.OUTPUT}),
])
def test_in_core_directions_come_from_loads_and_stores(body, expected):
    function = in_core(*body)
    verify_function(function)
    assert directions(function) == expected


def test_inlined_callees_give_directions_through_their_bindings():
    # copy: src is an input, dst an output; the caller passes a as src and b both as src and dst
    copy = Function("copy", INCORE, (MemRef("src", F32, (8, 32)), MemRef("dst", F32, (8, 32))), (),
                    (Tile("t", 8, 32, F32),),
                    (Op("TLOAD", "t", ("src", 0, 0)), Op("TSTORE", "dst", ("t", 0, 0))))
    caller = in_core(Call("copy", (("src", CallArg("a", 0, 1)), ("dst", CallArg("b", 0, 0)))),
                     Call("copy", (("src", CallArg("b")), ("dst", CallArg("c")))), memrefs=("a", "b", "c"))
    m = module(copy, caller)
    verify_module(m)
    assert directions(caller, m) == {"a": Direction.INPUT, "b": Direction.INOUT, "c": Direction.OUTPUT}


def test_orchestration_directions_come_from_the_calls():
    # stage 1 writes tmp from x, stage 2 reads tmp into y: tmp is written by one call, read by another
    x, tmp, y = (MemRef(name, F32) for name in ("x", "tmp", "y"))
    stage = callee()
    orch = Function("orch", ORCH, (x, tmp, y), (), (), (
        For("i", 0, 4, 1, (
            Call("tile_fn", (("input", CallArg("x", "i", 0)), ("output", CallArg("tmp", "i", 0)))),
            Call("tile_fn", (("input", CallArg("tmp", "i", 0)), ("output", CallArg("y", "i", 0)))))),
        Return()))
    outer = Function("outer", ORCH, (MemRef("p", F32), MemRef("q", F32), MemRef("r", F32)), (), (),
                     (Call("orch", (("x", CallArg("p")), ("tmp", CallArg("q")), ("y", CallArg("r")))),))
    m = module(outer, orch, stage)
    verify_module(m)
    assert directions(orch, m) == {"x": Direction.INPUT, "tmp": Direction.INOUT, "y": Direction.OUTPUT}
    assert directions(outer, m) == {"p": Direction.INPUT, "q": Direction.INOUT, "r": Direction.OUTPUT}


def test_directions_refuse_recursion_naming_the_call():
    m = Module("m", {"tile_fn": kernel(Call("tile_fn", WHOLE))})
    message = r"^@tile_fn: CALL @tile_fn\(.*\): recursive call: @tile_fn -> @tile_fn$"
    with pytest.raises(ISAError, match=message):
        directions(m.functions["tile_fn"], m)
