"""Orchestration functions run against the Python orchestrator API (spec 003 §1.2, §6).

`orchestration(program, name)` is a function `(o, *arrays, *scalars)` for `rt.run`: each memref
of the Orchestration function takes an array (`o.external`), each scalar parameter a number,
and its body runs statement by statement: scalar instructions, FOR, IF, RETURN, and CALLs. A
CALL of an Orchestration function runs its body on the tensors and values bound to it; a CALL
of an InCore function is a task: `o.submit(program.kernels[callee], ...)` with each callee
memref's window as input, output or inout by the direction inferred for it (never from its
name), then the callee's scalar parameters in declaration order. Dependencies come from the
runtime exactly as for a hand-written orchestration.

A window `("t", r, c)` is the callee memref's shape at rows r·rows, cols c·cols of `t`, cut
at `t`'s edge (a tail); a bare `"t"` is `t` cut to the callee memref's shape. A window that
starts past the edge is an ISAError naming the call.

A binary-expanded loop (max_range, min_range) runs its iterations in order, as its expansion
would; more than max_range of them is an ISAError. This walker is the semantics the generated
form (orchestration_codegen.py, `compiled=True`) must match; adaptive tiles (tile_levels) are
not built yet.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from .. import params as pto_params
from ..tensor import TensorDescriptor
from .errors import ISAError
from .interpret import cast_scalar
from .ir import Call, For, Function, If, Op, Predicate, Return
from .ops import OPCODES, Form
from .verify import Direction, describe, directions

_COMPARE = {Predicate.LT: operator.lt, Predicate.LE: operator.le, Predicate.GT: operator.gt,
            Predicate.GE: operator.ge, Predicate.EQ: operator.eq, Predicate.NE: operator.ne}
_WRAP = {Direction.INPUT: pto_params.input, Direction.OUTPUT: pto_params.output,
         Direction.INOUT: pto_params.inout}


class _Return(Exception):
    """RETURN: unwinds to the activation of the function that executed it."""


def orchestration(program, name: str) -> Callable[..., None]:
    """The Orchestration function `name` of a compiled program as a Python orchestration."""
    function = program.module.functions.get(name)
    if function is None:
        raise ISAError(f"module {program.module.name}: unknown function @{name}")
    if function.in_core:
        raise ISAError(f"@{name} is an InCore function: submit program.kernels[{name!r}] instead")
    memrefs = function.memrefs
    params = [s for s in function.scalars if s.param]
    flows = {f.name: directions(f, program.module) for f in program.module.functions.values() if f.in_core}

    def run(o, *args) -> None:
        if len(args) != len(memrefs) + len(params):
            names = ", ".join([m.name for m in memrefs] + [s.name for s in params])
            raise ISAError(f"@{name} takes {len(memrefs)} arrays and {len(params)} scalars ({names}), "
                           f"got {len(args)} arguments")
        tensors = {m.name: o.external(a) for m, a in zip(memrefs, args)}
        values = dict(zip((s.name for s in params), args[len(memrefs):]))
        _Activation(program, flows, o, function, tensors, values).run()

    run.__name__ = name
    return run


class _Activation:
    """One running Orchestration function: its tensors (descriptors) and scalars."""

    def __init__(self, program, flows: dict[str, dict[str, Direction]], o, function: Function,
                 tensors: dict[str, TensorDescriptor], params: dict):
        self.program, self.flows, self.o, self.function, self.tensors = program, flows, o, function, tensors
        self.module = program.module
        self.scalars = {s.name: cast_scalar(s.dtype, params[s.name]) if s.param else cast_scalar(s.dtype, 0)
                        for s in function.scalars}

    def run(self) -> None:
        try:
            self.block(self.function.body)
        except _Return:
            pass

    def fail(self, where: str, message: str) -> ISAError:
        return ISAError(f"@{self.function.name}: {where}: {message}")

    def value(self, operand):
        return self.scalars[operand] if isinstance(operand, str) else operand

    def index(self, operand, where: str) -> int:
        value = self.value(operand)
        if not isinstance(value, int):
            raise self.fail(where, f"{operand!r} is {value!r}, not an integer")
        return value

    def block(self, body) -> None:
        for statement in body:
            if isinstance(statement, Op):
                self.op(statement)
            elif isinstance(statement, For):
                where = describe(statement)
                start, stop, step = (self.index(v, where) for v in (statement.start, statement.stop,
                                                                    statement.step))
                iterations = range(start, stop, step)
                # A binary-expanded loop (spec §2.5) runs the same iterations in the same order,
                # as blocks of max_range, max_range/2, ...: more than max_range would be lost.
                if statement.max_range is not None and len(iterations) > statement.max_range:
                    raise self.fail(where, f"{len(iterations)} iterations, over its max_range "
                                           f"{statement.max_range}")
                for value in iterations:
                    self.scalars[statement.var] = value
                    self.block(statement.body)
            elif isinstance(statement, If):
                where = describe(statement)
                taken = _COMPARE[statement.predicate](self.value(statement.lhs), self.value(statement.rhs))
                self.block(statement.then_body if taken else statement.else_body)
            elif isinstance(statement, Call):
                self.call(statement)
            elif isinstance(statement, Return):
                raise _Return
            else:
                raise self.fail(repr(statement), "not a statement")

    def op(self, op: Op) -> None:
        spec = OPCODES[op.opcode]  # the verifier admits only scalar instructions here
        dtype = self.function.scalar(op.dst).dtype
        if spec.form is Form.COMPARE:
            a, b, predicate = op.srcs
            self.scalars[op.dst] = cast_scalar(dtype, int(_COMPARE[predicate](self.value(a), self.value(b))))
        elif spec.reference is None:  # SLI
            self.scalars[op.dst] = cast_scalar(dtype, op.srcs[0])
        else:
            self.scalars[op.dst] = cast_scalar(dtype, spec.reference(*(self.value(v) for v in op.srcs)))

    def call(self, call: Call) -> None:
        where = describe(call)
        callee = self.module.functions[call.callee]
        args = dict(call.args)
        values = {param: self.value(value) for param, value in call.scalars}
        if not callee.in_core:  # bound to whole tensors (the verifier refuses windows)
            tensors = {param: self.tensors[arg.tensor] for param, arg in args.items()}
            _Activation(self.program, self.flows, self.o, callee, tensors, values).run()
            return
        flows = self.flows[callee.name]
        params = []
        for memref in callee.memrefs:
            arg = args[memref.name]
            tensor = self.tensors[arg.tensor]
            rows, cols = memref.shape
            row, col = (0, 0)
            if arg.windowed:
                row, col = self.index(arg.row, where) * rows, self.index(arg.col, where) * cols
            if not (0 <= row < tensor.shape[0] and 0 <= col < tensor.shape[1]):
                raise self.fail(where, f"the window of %{arg.tensor} for %{memref.name} starts at "
                                       f"({row}, {col}), outside its shape {tensor.shape}")
            window = tensor[row:min(row + rows, tensor.shape[0]), col:min(col + cols, tensor.shape[1])]
            params.append(_WRAP[flows[memref.name]](window))
        scalars = [cast_scalar(s.dtype, values[s.name]) for s in callee.scalars if s.param]
        self.o.submit(self.program.kernels[callee.name], *params, *scalars)
