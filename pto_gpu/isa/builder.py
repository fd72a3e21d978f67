"""FunctionBuilder: the fluent way to write a PTO function (spec 003 §2), destination first.

    (FunctionBuilder("softmax_tile", module=m).in_core()
        .memref("input", pto.FLOAT32, (8, 64)).tile("x", 8, 64, pto.FLOAT32)
        .load("x", "input").exp("x", "x").store("output", "x")
        .build())

Declarations (`memref`, `tile`, `scalar`, `scalar_var`, an Orchestration's local `tensor`s, and
`library` for a kernel of the library) and statements may come in any order;
blocks open with `for_loop` / `if_then` (`else_`) and close with `end_for` / `end_if`. There is
one instruction method per entry of ops.OPCODES, named by its `builder` field and generated
from the table, with the operands of operands.signature. `build` returns the verified
ir.Function and adds it to the module, if one was given.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Mapping

from ..dtypes import as_dtype
from ..errors import PTOError
from .errors import ISAError
from .ir import (
    Alloc,
    Call,
    CallArg,
    Direction,
    For,
    Function,
    FunctionKind,
    If,
    Index,
    MemRef,
    Module,
    Op,
    Operand,
    Predicate,
    Return,
    Scalar,
    Split,
    Statement,
    Tile,
    View,
)
from .operands import signature
from .ops import OPCODES, Form, OpSpec
from .verify import verify_function


@dataclasses.dataclass
class _Block:
    """An open for_loop or if_then: its header and the statements gathered so far."""

    opener: str  # the builder call that opened it, for error messages
    header: dict
    body: list[Statement] = dataclasses.field(default_factory=list)
    then_body: list[Statement] | None = None  # set by else_()


class FunctionBuilder:
    def __init__(self, name: str, module: Module | None = None):
        self._name, self._module = name, module
        self._kind = FunctionKind.INCORE
        self._memrefs: list[MemRef] = []
        self._scalars: list[Scalar] = []
        self._tiles: list[Tile] = []
        self._tensors: list[MemRef] = []
        self._library: str | None = None
        self._column_tails = False
        self._tf32 = False
        self._body: list[Statement] = []
        self._open: list[_Block] = []

    def _fail(self, message: str) -> ISAError:
        return ISAError(f"@{self._name}: {message}")

    def _dtype(self, where: str, dtype: object):
        try:
            return as_dtype(dtype)
        except PTOError as error:
            raise self._fail(f"{where}: {error}") from None

    def _emit(self, statement: Statement) -> FunctionBuilder:
        (self._open[-1].body if self._open else self._body).append(statement)
        return self

    # kind and declarations

    def in_core(self) -> FunctionBuilder:
        """Tile work on one core (the default)."""
        self._kind = FunctionKind.INCORE
        return self

    def not_in_core(self) -> FunctionBuilder:
        """An Orchestration: control flow and calls that become tasks."""
        self._kind = FunctionKind.ORCHESTRATION
        return self

    def sibling(self) -> FunctionBuilder:
        """An empty builder of a function of this one's name, kind, tails and precision, in no
        module: for trying a body (a family sizing its tiles) before writing it."""
        sibling = FunctionBuilder(self._name)
        sibling._kind, sibling._column_tails, sibling._tf32 = self._kind, self._column_tails, self._tf32
        return sibling

    def memref(self, name: str, dtype: object, shape: tuple[int, int] | None = None,
               direction: Direction | str | None = None) -> FunctionBuilder:
        """A memref parameter; `direction` ("input", "output", "inout") only for a library function."""
        dtype = self._dtype(f"memref %{name}", dtype)
        if isinstance(direction, str):
            try:
                direction = Direction(direction)
            except ValueError:
                raise self._fail(f"memref %{name}: direction {direction!r} is not one of "
                                 f"{', '.join(d.value for d in Direction)}") from None
        self._memrefs.append(MemRef(name, dtype, None if shape is None else tuple(shape), direction))
        return self

    def library(self, path: str) -> FunctionBuilder:
        """This InCore function is the library kernel at import path `path` (no body)."""
        self._library = path
        return self

    def column_tails(self) -> FunctionBuilder:
        """This InCore function takes memref windows narrower than declared (a column tail): it
        reads a window's width with `scalar_dim` where its results depend on it."""
        self._column_tails = True
        return self

    def tf32(self) -> FunctionBuilder:
        """This InCore function's float32 products may run on tensor cores as TF32 in its CUDA
        code (operands rounded to 10 mantissa bits, sums in float); without it they are exact."""
        self._tf32 = True
        return self

    def tensor(self, name: str, dtype: object) -> FunctionBuilder:
        """A local tensor of an Orchestration, bound by alloc, view or split."""
        self._tensors.append(MemRef(name, self._dtype(f"tensor %{name}", dtype)))
        return self

    def alloc(self, dst: str, shape: tuple[Index, ...], owner: str | None = None) -> FunctionBuilder:
        """dst = a new heap tensor of `shape`, freed after its last use; in a distributed run
        owned with tensor `owner`'s first element (None: the run's default)."""
        return self._emit(Alloc(dst, tuple(_operand(n) for n in shape), owner))

    def view(self, dst: str, src: str, slices: tuple[tuple[Index, Index] | None, ...]) -> FunctionBuilder:
        """dst = src sliced: per dim (start, stop), or None for the whole dim."""
        return self._emit(View(dst, src, tuple(None if b is None else (_operand(b[0]), _operand(b[1]))
                                               for b in slices)))

    def split(self, dst: str, src: str, groups: Index) -> FunctionBuilder:
        """dst = (rows, groups*c) src seen as (groups, rows, c)."""
        return self._emit(Split(dst, src, _operand(groups)))

    def tile(self, name: str, rows: int, cols: int, dtype: object) -> FunctionBuilder:
        self._tiles.append(Tile(name, rows, cols, self._dtype(f"tile %{name}", dtype)))
        return self

    def scalar(self, name: str, dtype: object) -> FunctionBuilder:
        """A scalar parameter: its value comes from the caller."""
        self._scalars.append(Scalar(name, self._dtype(f"scalar %{name}", dtype), param=True))
        return self

    def scalar_var(self, name: str, dtype: object) -> FunctionBuilder:
        """A local scalar, written by scalar instructions."""
        self._scalars.append(Scalar(name, self._dtype(f"scalar %{name}", dtype), param=False))
        return self

    # control flow

    def for_loop(self, var: str, start: Index, stop: Index, step: Index = 1, max_range: int | None = None,
                 min_range: int | None = None, tile_levels: Mapping[int, int] | None = None,
                 rows: str | None = None) -> FunctionBuilder:
        levels = tuple(sorted(dict(tile_levels).items())) if tile_levels else ()
        self._open.append(_Block(f"for_loop %{var}", dict(
            var=var, start=_operand(start), stop=_operand(stop), step=_operand(step),
            max_range=max_range, min_range=min_range, tile_levels=levels, rows=rows)))
        return self

    def end_for(self) -> FunctionBuilder:
        block = self._close("end_for", "for_loop")
        return self._emit(For(body=tuple(block.body), **block.header))

    def if_then(self, lhs: Index, predicate: Predicate | str, rhs: Index) -> FunctionBuilder:
        predicate = self._predicate("if_then", predicate)
        self._open.append(_Block(f"if_then {lhs} {predicate.value} {rhs}", dict(
            lhs=_operand(lhs), predicate=predicate, rhs=_operand(rhs))))
        return self

    def else_(self) -> FunctionBuilder:
        block = self._open[-1] if self._open else None
        if block is None or not block.opener.startswith("if_then") or block.then_body is not None:
            raise self._fail(f"else_() without an open if_then ({self._where()})")
        block.then_body, block.body = block.body, []
        return self

    def end_if(self) -> FunctionBuilder:
        block = self._close("end_if", "if_then")
        if block.then_body is None:
            return self._emit(If(then_body=tuple(block.body), **block.header))
        return self._emit(If(then_body=tuple(block.then_body), else_body=tuple(block.body), **block.header))

    def _where(self) -> str:
        return f"open: {self._open[-1].opener}" if self._open else "no block is open"

    def _close(self, closer: str, opener: str) -> _Block:
        if not self._open or not self._open[-1].opener.startswith(opener):
            raise self._fail(f"{closer}() without an open {opener} ({self._where()})")
        return self._open.pop()

    def _predicate(self, where: str, predicate: Predicate | str) -> Predicate:
        try:
            return Predicate(predicate)
        except ValueError:
            spellings = ", ".join(p.value for p in Predicate)
            raise self._fail(f"{where}: {predicate!r} is not a predicate ({spellings})") from None

    def call(self, callee: str, args: Mapping[str, str | tuple[str, Index, Index]],
             scalars: Mapping[str, Operand] | None = None) -> FunctionBuilder:
        """Call `callee`, binding each of its memrefs to a tensor: "t" whole, or ("t", row, col)
        the window of the callee memref's shape at rows row*rows, cols col*cols; and each of
        its scalar parameters, in `scalars`, to a number or a scalar of the caller."""
        bound = []
        for param, arg in args.items():
            if isinstance(arg, str):
                bound.append((param, CallArg(arg)))
            elif isinstance(arg, tuple) and len(arg) == 3:
                bound.append((param, CallArg(arg[0], _operand(arg[1]), _operand(arg[2]))))
            else:
                raise self._fail(f"call @{callee}: argument {param}={arg!r} is neither \"tensor\" nor "
                                 "(\"tensor\", row, col)")
        values = tuple((param, _operand(value)) for param, value in (scalars or {}).items())
        return self._emit(Call(callee, tuple(bound), values))

    def ret(self) -> FunctionBuilder:
        return self._emit(Return())

    def build(self) -> Function:
        if self._open:
            closer = "end_for" if self._open[-1].opener.startswith("for_loop") else "end_if"
            raise self._fail(f"{self._open[-1].opener} is not closed: call {closer}() before build()")
        # Parameters first (the order of a kernel's arguments), then locals: one order, so
        # that printing and parsing give back the same function.
        scalars = tuple(sorted(self._scalars, key=lambda s: not s.param))
        function = Function(self._name, self._kind, tuple(self._memrefs), scalars,
                            tuple(self._tiles), tuple(self._body), tuple(self._tensors), self._library,
                            self._column_tails, self._tf32)
        verify_function(function, self._module)
        if self._module is not None:
            self._module.add(function)
        return function


def _operand(value: object) -> Operand | Predicate:
    """Numbers as plain Python ints and floats (numpy scalars included), so that built
    functions compare equal to hand-written ones; names and anything else unchanged (the
    verifier judges them)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


def _instruction(spec: OpSpec):
    operands = signature(spec)
    parameters = [inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if o.default is None else o.default)
                  for o in operands]
    accepts = inspect.Signature(parameters)
    usage = f"{spec.builder}{accepts}"

    def method(self: FunctionBuilder, *args, **kwargs) -> FunctionBuilder:
        try:
            bound = accepts.bind(*args, **kwargs)
        except TypeError as error:
            raise self._fail(f"{usage} ({spec.spelling}): {error}") from None
        bound.apply_defaults()
        values = [_operand(v) for v in bound.arguments.values()]
        if spec.form is Form.COMPARE:
            values[-1] = self._predicate(usage, values[-1])
        return self._emit(Op(spec.spelling, values[0], tuple(values[1:])))

    method.__name__ = method.__qualname__ = spec.builder
    method.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters])
    method.__doc__ = f"{spec.spelling} ({spec.form.value}, destination first)."
    return method


for _spec in OPCODES.values():
    # A table entry must not shadow a builder method such as `tile` or `call`.
    if hasattr(FunctionBuilder, _spec.builder):
        raise ISAError(f"opcode {_spec.spelling}: builder name {_spec.builder!r} is already a "
                       "FunctionBuilder method")
    setattr(FunctionBuilder, _spec.builder, _instruction(_spec))
