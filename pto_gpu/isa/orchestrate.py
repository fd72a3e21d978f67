"""Orchestration functions run against the Python orchestrator API (spec 003 §1.2, §6).

`orchestration(program, name)` is a function `(o, *arrays, *scalars)` for `rt.run`: each memref
of the Orchestration function takes an array (`o.external`), each scalar parameter a number,
and its body runs statement by statement: scalar instructions, FOR, IF, RETURN, CALLs, and the
local tensors' ALLOC (`o.alloc`, and `o.free` where lowering.free_points says), VIEW (a slice
of a descriptor) and SPLIT (a reshape and transpose). A CALL of an Orchestration function runs
its body on the tensors and values bound to it; a CALL of an InCore function is a task:
`o.submit(kernel, ...)` with each callee memref's tensor as input, output or inout by the
direction inferred (or, for a library kernel, declared) for it, never from its name, then the
callee's scalar parameters in declaration order. Dependencies come from the runtime exactly as
for a hand-written orchestration. Each activation of a function that allocates and can RETURN
runs in an `o.scope()`, so what a RETURN skips past is freed when the function leaves.

A window `("t", r, c)` is the callee memref's shape at rows r·rows, cols c·cols of `t`, cut
at `t`'s edge (a tail); a bare `"t"` is `t` cut to the callee memref's shape (a library
kernel's memrefs have none: it takes `t` whole). A window or view that starts past the edge is
an ISAError naming the statement.

Loops with max_range run as lowering.expansion says (the binary expansion, and with
tile_levels the adaptive tiles and their variants); more than max_range iterations is an
ISAError. This walker is the semantics the generated form (orchestration_codegen.py,
`compiled=True`) must match.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from .. import params as pto_params
from ..dtypes import DataType
from ..tensor import TensorDescriptor
from .dataflow import directions, tensor_roots
from .describe import describe
from .errors import ISAError
from .interpret import cast_scalar
from .ir import Alloc, Call, Direction, For, Function, If, Op, Predicate, Return, Split, View
from .lowering import Level, block_count, expansion, free_points, scaled_by, scoped, variant_name
from .ops import OPCODES, Form

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
    shared = _Shared({f.name: directions(f, program.module) for f in program.module.functions.values()
                      if f.in_core})

    def run(o, *args) -> None:
        tensors = dict(zip((m.name for m in memrefs), external(o, function, args)))
        values = dict(zip((s.name for s in params), args[len(memrefs):]))
        _Activation(program, shared, o, function, tensors, values).run()

    run.__name__ = name
    return run


def external(o, function: Function, args: tuple) -> list[TensorDescriptor]:
    """The arrays an Orchestration function is called with (memrefs, then scalars), checked
    against its parameters, as the orchestrator's descriptors of its memrefs."""
    params = [s for s in function.scalars if s.param]
    if len(args) != len(function.memrefs) + len(params):
        names = ", ".join([m.name for m in function.memrefs] + [s.name for s in params])
        raise ISAError(f"@{function.name} takes {len(function.memrefs)} arrays and {len(params)} scalars "
                       f"({names}), got {len(args)} arguments")
    tensors = [o.external(array) for array in args[:len(function.memrefs)]]
    for memref, tensor in zip(function.memrefs, tensors):
        if tensor.dtype != memref.dtype:
            raise ISAError(f"@{function.name}: %{memref.name} is {memref.dtype.name}, but its array is "
                           f"{tensor.dtype.name}")
    return tensors


class _Shared:
    """What every activation of one orchestration reads, computed once rather than once per
    iteration: the callees' memref directions, each function's facts, each CALL's bindings and
    each block's free points."""

    def __init__(self, flows: dict[str, dict[str, Direction]]):
        self.flows = flows
        self._frees: dict[int, tuple] = {}
        self._functions: dict[str, tuple] = {}
        self._bindings: dict[int, tuple] = {}

    def facts(self, function: Function) -> tuple[dict[str, str], bool, dict[str, DataType]]:
        """A function's local tensor roots, whether it runs in a scope, and its scalars' dtypes."""
        facts = self._functions.get(function.name)
        if facts is None:
            dtypes = {s.name: s.dtype for s in function.scalars}
            facts = self._functions[function.name] = (tensor_roots(function), scoped(function), dtypes)
        return facts

    def bindings(self, call: Call, callee: Function) -> tuple[list, list]:
        """For each memref of an InCore callee, in its order: the call's argument for it, and
        the param wrapper of its direction (computed once per CALL statement)."""
        entry = self._bindings.get(id(call))
        if entry is None or entry[0] is not call:
            args, flows = dict(call.args), self.flows[callee.name]
            entry = self._bindings[id(call)] = (call, [args[m.name] for m in callee.memrefs],
                                                [_WRAP[flows[m.name]] for m in callee.memrefs])
        return entry[1], entry[2]

    def frees(self, body: tuple, roots: dict[str, str]) -> tuple[tuple[str, ...], ...]:
        entry = self._frees.get(id(body))
        if entry is None or entry[0] is not body:  # the body is kept in the entry, so its id stays its own
            entry = self._frees[id(body)] = (body, free_points(body, roots))
        return entry[1]


class _Activation:
    """One running Orchestration function: its tensors (descriptors) and scalars, and the
    level of each adaptive loop it is inside (for the variants of the calls it makes)."""

    def __init__(self, program, shared: _Shared, o, function: Function, tensors: dict[str, TensorDescriptor],
                 params: dict):
        self.program, self.shared, self.o, self.function, self.tensors = program, shared, o, function, tensors
        self.module = program.module
        self.scalars = {s.name: cast_scalar(s.dtype, params[s.name]) if s.param else cast_scalar(s.dtype, 0)
                        for s in function.scalars}
        self.roots, self.scoped, self.dtypes = shared.facts(function)
        self.allocations: dict[str, TensorDescriptor] = {}  # what o.free takes, per allocated local
        self.levels: dict[str, Level] = {}  # adaptive loop variable -> its level now
        # Per CALL argument and window shape: (the tensor, its window at (0, 0)), which the
        # argument's whole windows are, moved (TensorDescriptor.shifted: no slicing, no layout
        # made again).
        self.windows: dict[tuple, tuple[TensorDescriptor, TensorDescriptor]] = {}

    def run(self) -> None:
        if not self.scoped:
            self.body()
            return
        with self.o.scope():
            self.body()

    def body(self) -> None:
        try:
            self.block(self.function.body)
        except _Return:
            pass

    def fail(self, statement, message: str) -> ISAError:
        return ISAError(f"@{self.function.name}: {describe(statement)}: {message}")

    def value(self, operand):
        return self.scalars[operand] if isinstance(operand, str) else operand

    def index(self, operand, statement) -> int:
        value = self.value(operand)
        if not isinstance(value, int):
            raise self.fail(statement, f"{operand!r} is {value!r}, not an integer")
        return value

    def block(self, body) -> None:
        for statement, frees in zip(body, self.shared.frees(body, self.roots)):
            self.statement(statement)
            for name in frees:
                self.o.free(self.allocations.pop(name))

    def statement(self, statement) -> None:
        if isinstance(statement, Op):
            self.op(statement)
        elif isinstance(statement, For):
            self.loop(statement)
        elif isinstance(statement, If):
            taken = _COMPARE[statement.predicate](self.value(statement.lhs), self.value(statement.rhs))
            self.block(statement.then_body if taken else statement.else_body)
        elif isinstance(statement, Call):
            self.call(statement)
        elif isinstance(statement, Alloc):
            shape = tuple(self.index(n, statement) for n in statement.shape)
            owner = None if statement.owner is None else self.o.owner_of(self.tensors[statement.owner])
            tensor = self.o.alloc(shape, self.function.memref(statement.dst).dtype, owner=owner)
            self.tensors[statement.dst] = self.allocations[statement.dst] = tensor
        elif isinstance(statement, View):
            self.tensors[statement.dst] = self.view(statement)
        elif isinstance(statement, Split):
            source = self.tensors[statement.src]
            groups = self.index(statement.groups, statement)
            if source.ndim != 2 or groups <= 0 or source.shape[1] % groups:
                raise self.fail(statement, f"cannot split %{statement.src} of shape {source.shape} into "
                                           f"{groups} column groups")
            rows, cols = source.shape
            self.tensors[statement.dst] = source.reshape(rows, groups, cols // groups).transpose(1, 0, 2)
        elif isinstance(statement, Return):
            raise _Return
        else:
            raise self.fail(repr(statement), "not a statement")

    def loop(self, loop: For) -> None:
        start, stop, step = (self.index(v, loop) for v in (loop.start, loop.stop, loop.step))
        trip_count = len(range(start, stop, step))
        if loop.max_range is None:
            for value in range(start, stop, step):
                self.scalars[loop.var] = value
                self.block(loop.body)
            return
        if trip_count > loop.max_range:
            raise self.fail(loop, f"{trip_count} iterations, over its max_range {loop.max_range}")
        done = 0
        for level in expansion(loop):
            count = block_count(level, trip_count, loop.min_range)
            if level.rows is not None:
                self.levels[loop.var] = level
                if loop.rows is not None:
                    self.scalars[loop.rows] = level.rows
            for k in range(done, done + count, level.scale):
                self.scalars[loop.var] = start + k * step
                self.block(loop.body)
            done += count
        self.levels.pop(loop.var, None)

    def window(self, call: Call, position: int, tensor: TensorDescriptor, rows: int,
               cols: int) -> TensorDescriptor:
        """The window of `tensor` at (0, 0) that CALL argument `position` takes (rows x cols:
        an adaptive loop's variant takes more rows), made once."""
        key = (id(call), position, rows, cols)
        made = self.windows.get(key)
        if made is None or made[0] is not tensor:
            made = self.windows[key] = (tensor, tensor[:rows, :cols])
        return made[1]

    def view(self, view: View) -> TensorDescriptor:
        source = self.tensors[view.src]
        if len(view.slices) != source.ndim:
            raise self.fail(view, f"{len(view.slices)} slices for %{view.src} of shape {source.shape}")
        key = []
        for axis, (bounds, size) in enumerate(zip(view.slices, source.shape)):
            if bounds is None:
                key.append(slice(None))
                continue
            first, stop = (self.index(v, view) for v in bounds)
            if not 0 <= first < size or stop <= first:
                raise self.fail(view, f"dim {axis} slice {first}:{stop} of %{view.src} (shape "
                                       f"{source.shape}) is empty or starts outside it")
            key.append(slice(first, min(stop, size)))
        return source[tuple(key)]

    def op(self, op: Op) -> None:
        spec = OPCODES[op.opcode]  # the verifier admits only scalar instructions here
        dtype = self.dtypes[op.dst]
        if spec.form is Form.COMPARE:
            a, b, predicate = op.srcs
            self.scalars[op.dst] = cast_scalar(dtype, int(_COMPARE[predicate](self.value(a), self.value(b))))
        elif spec.form is Form.DIM:
            tensor, axis = self.tensors[op.srcs[0]], op.srcs[1]
            if axis >= tensor.ndim:
                raise self.fail(op, f"%{op.srcs[0]} has {tensor.ndim} dims, so no axis {axis}")
            self.scalars[op.dst] = cast_scalar(dtype, tensor.shape[axis])
        elif spec.reference is None:  # SLI
            self.scalars[op.dst] = cast_scalar(dtype, op.srcs[0])
        else:
            self.scalars[op.dst] = cast_scalar(dtype, spec.reference(*(self.value(v) for v in op.srcs)))

    def call(self, call: Call) -> None:
        callee = self.module.functions[call.callee]
        values = {param: self.value(value) for param, value in call.scalars}
        if not callee.in_core:  # bound to whole tensors (the verifier refuses windows)
            tensors = {param: self.tensors[arg.tensor] for param, arg in call.args}
            _Activation(self.program, self.shared, self.o, callee, tensors, values).run()
            return
        scaled = scaled_by(call, self.levels) if self.levels else None
        level = None if scaled is None else self.levels[scaled]
        target = callee if level is None or level.scale == 1 else self.program.function(
            variant_name(callee.name, level.rows))
        kernel = self.program.kernels[target.name]
        params = []
        args, wraps = self.shared.bindings(call, callee)
        bound = zip(callee.memrefs, target.memrefs, args, wraps)
        for position, (memref, shaped, arg, wrap) in enumerate(bound):
            tensor = self.tensors[arg.tensor]
            if memref.shape is None:  # a library kernel: the tensor as it is
                params.append(wrap(tensor))
                continue
            if tensor.ndim != 2:
                raise self.fail(call, f"%{arg.tensor} is {tensor.ndim}-d, but %{memref.name} of "
                                      f"@{callee.name} takes a 2-d window")
            rows, cols = shaped.shape  # the extent is the variant's; the offset counts the callee's tiles
            row, col = (0, 0)
            if arg.windowed:
                row = self.index(arg.row, call) * memref.shape[0]
                col = self.index(arg.col, call) * memref.shape[1]
            if not (0 <= row < tensor.shape[0] and 0 <= col < tensor.shape[1]):
                raise self.fail(call, f"the window of %{arg.tensor} for %{memref.name} starts at "
                                       f"({row}, {col}), outside its shape {tensor.shape}")
            if row + rows <= tensor.shape[0] and col + cols <= tensor.shape[1]:  # whole: not a tail
                window = self.window(call, position, tensor, rows, cols).shifted(
                    row * tensor.strides[0] + col * tensor.strides[1])
            else:
                window = tensor[row:min(row + rows, tensor.shape[0]), col:min(col + cols, tensor.shape[1])]
            params.append(wrap(window))
        scalars = [cast_scalar(s.dtype, values[s.name]) for s in callee.scalars if s.param]
        self.o.submit(kernel, *params, *scalars)
