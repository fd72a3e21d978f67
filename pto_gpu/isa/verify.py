"""The verifier: what a well-formed PTO program is.

It owns the rules a Function must follow (names declared once and in scope, operand kinds
(operands.py), shapes and dtypes per Form, tile instructions only in InCore functions, loop
parameters, calls that match their callees, no recursion, every memref used: dataflow.py
infers its direction from the uses). Every error is an ISAError naming the function and the
instruction or declaration at fault (describe.py quotes it).
"""

from __future__ import annotations

import contextlib
from typing import NoReturn

from ..dtypes import DataType
from .dataflow import check_uses
from .describe import describe
from .errors import ISAError
from .ir import (
    Alloc,
    Call,
    CallArg,
    Direction,
    For,
    Function,
    If,
    MemRef,
    Module,
    Op,
    Predicate,
    Return,
    Scalar,
    Split,
    Statement,
    Tile,
    View,
    walk,
)
from .operands import Kind, signature
from .ops import OPCODES, SCALAR_FORMS, Form

TILE_DTYPES = (DataType.FLOAT16, DataType.BFLOAT16, DataType.FLOAT32, DataType.FLOAT64)


def _shape(tile: Tile) -> str:
    return f"{tile.rows}x{tile.cols}"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_integer_dtype(dtype: DataType) -> bool:
    return dtype.numpy.kind in "iu"


def _power_of_two(value: object) -> bool:
    return _is_int(value) and value > 0 and value & (value - 1) == 0


def verify_function(function: Function, module: Module | None = None) -> None:
    """Check one function. Calls are checked against their callees when `module` holds them;
    a call to a function not (yet) in the module is left to verify_module."""
    _Checker(function, module, resolve_all=False).check()


def verify_module(module: Module) -> None:
    """Check every function, that every callee exists, and that no function calls itself,
    directly or through others."""
    for key, function in module.functions.items():
        if key != function.name:
            raise ISAError(f"module {module.name}: @{function.name} is filed under @{key}")
    _check_recursion(module)
    for function in module.functions.values():
        _Checker(function, module, resolve_all=True).check()


def _check_recursion(module: Module) -> None:
    finished: set[str] = set()

    def visit(function: Function, path: list[str]) -> None:
        path.append(function.name)
        for statement in walk(function.body):
            if not isinstance(statement, Call):
                continue
            if statement.callee in path:
                cycle = " -> ".join(f"@{name}" for name in [*path[path.index(statement.callee):],
                                                             statement.callee])
                raise ISAError(f"@{function.name}: {describe(statement)}: recursive call: {cycle}")
            callee = module.functions.get(statement.callee)
            if callee is not None and callee.name not in finished:
                visit(callee, path)
        path.pop()
        finished.add(function.name)

    for function in module.functions.values():
        if function.name not in finished:
            visit(function, [])


@contextlib.contextmanager
def _refusing(statement: Statement):
    """Errors raised inside name `statement` as the one refused (the innermost, where blocks
    nest), for the parser to give its line and column."""
    try:
        yield
    except ISAError as error:
        if error.statement is None:
            error.statement = statement
        raise


class _Checker:
    """One function's checks, in order: declarations, then statements (with loop variables in
    scope), then that every memref is used."""

    def __init__(self, function: Function, module: Module | None, resolve_all: bool):
        self.function, self.module, self.resolve_all = function, module, resolve_all
        self.declared: dict[str, MemRef | Tile | Scalar] = {}
        self.loop_vars: list[str] = []
        self.adaptive: list[str] = []  # variables of the enclosing loops with tile_levels
        self.locals = {t.name for t in function.tensors}
        self.bound: list[set[str]] = []  # local tensors bound so far, per enclosing block
        self.defined: set[str] = set()  # local tensors with their binding statement seen

    def fail(self, where: str, message: str) -> NoReturn:
        raise ISAError(f"@{self.function.name}: {where}: {message}")

    def check(self) -> None:
        self._declarations()
        self._block(self.function.body)
        if self.function.in_core:
            self._tiles_written(self.function.body, set())
        # Directions are inferred: a memref with no load, store or call has none.
        check_uses(self.function, self.module, self.resolve_all)

    def _tiles_written(self, body: tuple[Statement, ...], written: set[str]) -> None:
        """Every tile an instruction reads was written by an instruction before it (a read of a
        tile never loaded or computed gives garbage). Loops and branches count as taken: a
        write in one of them reaches the reads after it, so only a read with no write at all
        before it is refused, never a program whose paths the verifier cannot follow."""
        tiles = {t.name for t in self.function.tiles}
        for statement in body:
            if isinstance(statement, For):
                self._tiles_written(statement.body, written)
            elif isinstance(statement, If):
                self._tiles_written(statement.then_body, written)
                self._tiles_written(statement.else_body, written)
            elif isinstance(statement, Op):
                spec = OPCODES[statement.opcode]
                reads = [src for src, operand in zip(statement.srcs, signature(spec)[1:])
                         if operand.kind is Kind.TILE and src in tiles]
                for name in reads + ([statement.dst] if spec.accumulate else []):
                    if name not in written:
                        with _refusing(statement):
                            self.fail(describe(statement), f"reads tile %{name} before any instruction "
                                                           "writes it (load, compute or fill it first)")
                if spec.form is not Form.STORE and statement.dst in tiles:
                    written.add(statement.dst)

    # declarations

    def _declarations(self) -> None:
        f = self.function
        if not f.in_core and f.tiles:
            self.fail(f"tile %{f.tiles[0].name}", "Orchestration functions have no tiles")
        if f.library is not None:
            self._library()
        if f.column_tails and (not f.in_core or f.library is not None):
            self.fail("column_tails", "only an InCore function with a body takes column tails (a library "
                                      "kernel takes the shapes its own declaration says)")
        if f.tf32 and (not f.in_core or f.library is not None or any(m.dtype != DataType.FLOAT32
                                                                      for m in f.memrefs)):
            self.fail("tf32", "only an InCore function with a body and float32 memrefs has TF32 products")
        for tensor in f.tensors:
            where = f"tensor %{tensor.name}"
            self._declare(where, tensor)
            if f.in_core:
                self.fail(where, "local tensors belong to Orchestration functions (InCore ones have tiles)")
            if tensor.shape is not None or tensor.direction is not None:
                self.fail(where, "a local tensor has no declared shape or direction (its binding gives them)")
        for memref in f.memrefs:
            where = f"memref %{memref.name}"
            self._declare(where, memref)
            if memref.direction is not None and f.library is None:
                self.fail(where, "directions are inferred from the function's body; only a library "
                                 "function declares them")
            if f.library is not None:
                continue
            if memref.shape is None:
                if f.in_core:
                    self.fail(where, "memrefs of InCore functions need a shape (rows, cols)")
            elif len(memref.shape) != 2 or not all(_is_int(n) and n > 0 for n in memref.shape):
                self.fail(where, f"shape {memref.shape} is not (rows, cols) of positive ints")
        for scalar, following in zip(f.scalars, f.scalars[1:]):
            if following.param and not scalar.param:
                self.fail(f"scalar %{following.name}",
                          f"parameters come before locals (%{scalar.name} is a local)")
        for scalar in f.scalars:
            self._declare(f"scalar %{scalar.name}", scalar)
        for tile in f.tiles:
            where = f"tile %{tile.name}"
            self._declare(where, tile)
            if not (_is_int(tile.rows) and _is_int(tile.cols) and tile.rows > 0 and tile.cols > 0):
                self.fail(where, f"shape {tile.rows}x{tile.cols} is not of positive ints")
            if tile.dtype not in TILE_DTYPES:
                # Integer tiles have no -inf to mask with and no common rounding rule across
                # the interpreter and the generators.
                self.fail(where, f"tiles hold floating point ({', '.join(d.name for d in TILE_DTYPES)}), "
                                 f"not {tile.dtype.name}")

    def _library(self) -> None:
        f = self.function
        where = f"library {f.library!r}"
        if not (isinstance(f.library, str) and all(part.isidentifier() for part in f.library.split("."))
                and "." in f.library):
            self.fail(where, "a library function names its kernel by import path (package.module.name)")
        if not f.in_core:
            self.fail(where, "only an InCore function can be a library kernel")
        if f.body or f.tiles or any(not s.param for s in f.scalars):
            self.fail(where, "a library function is a declaration: no body, tiles or local scalars")
        for memref in f.memrefs:
            if memref.shape is not None or not isinstance(memref.direction, Direction):
                self.fail(f"memref %{memref.name}", "a library function's memrefs have no shape (the "
                                                    "kernel takes any) and a declared direction")

    def _declare(self, where: str, declaration: MemRef | Tile | Scalar) -> None:
        self._check_name(where, declaration.name)
        if not isinstance(declaration.dtype, DataType):
            self.fail(where, f"dtype {declaration.dtype!r} is not a pto.DataType")
        previous = self.declared.get(declaration.name)
        if previous is not None:
            self.fail(where, f"%{declaration.name} is already declared as a {self._kind(previous)}")
        self.declared[declaration.name] = declaration

    def _check_name(self, where: str, name: object) -> None:
        if not (isinstance(name, str) and name.isidentifier()):
            self.fail(where, f"{name!r} is not a valid name")

    def _kind(self, declaration: MemRef | Tile | Scalar) -> str:
        if isinstance(declaration, Scalar):
            return "scalar parameter" if declaration.param else "local scalar"
        if isinstance(declaration, MemRef):
            return "local tensor" if declaration.name in self.locals else "memref"
        return "tile"

    # statements

    def _block(self, body: tuple[Statement, ...]) -> None:
        self.bound.append(set())  # a local tensor bound in a block is used only there
        for statement in body:
            with _refusing(statement):
                self._statement(statement)
        self.bound.pop()

    def _statement(self, statement: Statement) -> None:
        if isinstance(statement, Alloc | View | Split):
            self._tensor_statement(statement)
        elif isinstance(statement, Op):
            self._op(statement)
        elif isinstance(statement, For):
            self._for(statement)
        elif isinstance(statement, If):
            self._if(statement)
        elif isinstance(statement, Call):
            self._call(statement)
        elif not isinstance(statement, Return):
            self.fail(repr(statement), "not a statement (Op, For, If, Call, Return, Alloc, View, Split)")

    def _tensor_statement(self, statement: Alloc | View | Split) -> None:
        where = describe(statement)
        if self.function.in_core:
            self.fail(where, "tensors are allocated and viewed in Orchestration functions")
        dst = statement.dst
        if dst not in self.locals:
            self.fail(where, f"%{dst} is not a local tensor of @{self.function.name} (declare it)")
        if dst in self.defined:
            self.fail(where, f"local tensor %{dst} is already bound (each is bound by one statement)")
        if isinstance(statement, Alloc):
            if not 1 <= len(statement.shape) <= 4:
                self.fail(where, f"an allocation has 1 to 4 dims, not {len(statement.shape)}")
            for size in statement.shape:
                self._operand(where, Kind.INDEX, size)
            if statement.owner is not None:
                self._operand(where, Kind.MEMREF, statement.owner)
        else:
            source = self._operand(where, Kind.MEMREF, statement.src)
            if source.dtype != self.declared[dst].dtype:
                self.fail(where, f"%{statement.src} is {source.dtype.name} but %{dst} is "
                                 f"{self.declared[dst].dtype.name}")
            if isinstance(statement, Split):
                self._operand(where, Kind.INDEX, statement.groups)
            else:
                if not 1 <= len(statement.slices) <= 4:
                    self.fail(where, f"a view slices 1 to 4 dims, not {len(statement.slices)}")
                for bounds in statement.slices:
                    if bounds is None:
                        continue
                    if not (isinstance(bounds, tuple) and len(bounds) == 2):
                        self.fail(where, f"{bounds!r} is neither None (the whole dim) nor (start, stop)")
                    for bound in bounds:
                        self._operand(where, Kind.INDEX, bound)
        self.defined.add(dst)
        self.bound[-1].add(dst)

    def _op(self, op: Op) -> None:
        where = describe(op)
        spec = OPCODES.get(op.opcode)
        if spec is None:
            self.fail(where, f"unknown instruction {op.opcode}")
        if spec.form not in SCALAR_FORMS and not self.function.in_core:
            self.fail(where, "tile instructions belong in InCore functions, not an Orchestration")
        operands = signature(spec)
        values = (op.dst, *op.srcs)
        if len(values) != len(operands):
            names = ", ".join(o.name for o in operands)
            self.fail(where, f"{op.opcode} takes {len(operands)} operands ({names}), got {len(values)}")
        resolved = [self._operand(where, o.kind, v) for o, v in zip(operands, values)]
        if spec.form is Form.DIM:
            axes = 2 if self.function.in_core else 4  # an InCore memref is a 2-d window
            if not (_is_int(op.srcs[1]) and 0 <= op.srcs[1] < axes):
                self.fail(where, f"axis {op.srcs[1]!r} is not an integer in [0, {axes})")
        elif spec.form in (Form.LOAD, Form.STORE):
            tile, memref = resolved[:2] if spec.form is Form.LOAD else resolved[1::-1]
            self._transfer(where, tile, memref, values[2], values[3])
        elif spec.form is Form.TRANSPOSE and op.dst == op.srcs[0]:
            self.fail(where, f"{op.opcode} needs its destination to differ from its source")
        elif spec.form not in SCALAR_FORMS and spec.form is not Form.GENERATE:
            tiles = [r for r, o in zip(resolved, operands) if o.kind is Kind.TILE]
            self._tile_shapes(where, spec.form, *tiles)

    def _operand(self, where: str, kind: Kind, value: object) -> MemRef | Tile | Scalar | None:
        if kind is Kind.PREDICATE:
            if not isinstance(value, Predicate):
                self.fail(where, f"{value!r} is not a Predicate")
            return None
        if kind is Kind.IMMEDIATE or (kind in (Kind.INDEX, Kind.VALUE) and not isinstance(value, str)):
            ok = _is_int(value) if kind is Kind.INDEX else _is_number(value)
            if not ok:
                self.fail(where, f"{value!r} is not {'an integer' if kind is Kind.INDEX else 'a number'}")
            return None
        if not isinstance(value, str):
            self.fail(where, f"{value!r} is not a {kind.value} name")
        if value in self.loop_vars:
            if kind is Kind.LOCAL:
                self.fail(where, f"loop variable %{value} is not assignable")
            if kind in (Kind.INDEX, Kind.VALUE):
                return None
            self.fail(where, f"%{value} is a loop variable, not a {kind.value}")
        declared = self.declared.get(value)
        if declared is None:
            self.fail(where, f"unknown name %{value}")
        wanted = {Kind.TILE: Tile, Kind.MEMREF: MemRef}.get(kind, Scalar)
        if not isinstance(declared, wanted):
            self.fail(where, f"%{value} is a {self._kind(declared)}, not a {kind.value}")
        if value in self.locals and not any(value in names for names in self.bound):
            self.fail(where, f"local tensor %{value} is used before its binding or outside the block "
                             "that binds it")
        if kind is Kind.LOCAL and declared.param:
            self.fail(where, f"scalar parameter %{value} is not assignable (declare a local with scalar_var)")
        if kind is Kind.INDEX and not _is_integer_dtype(declared.dtype):
            self.fail(where, f"%{value} is {declared.dtype.name}, not an integer")
        return declared

    def _transfer(self, where: str, tile: Tile, memref: MemRef, row: object, col: object) -> None:
        if memref.dtype != tile.dtype:
            self.fail(where, f"memref %{memref.name} is {memref.dtype.name} but tile %{tile.name} is "
                             f"{tile.dtype.name}")
        for axis, offset, extent, size in (("row", row, tile.rows, 0), ("col", col, tile.cols, 1)):
            if not _is_int(offset):
                continue
            if offset < 0:
                self.fail(where, f"negative {axis} offset {offset}")
            if memref.shape is not None and offset + extent > memref.shape[size]:
                self.fail(where, f"tile %{tile.name} ({_shape(tile)}) at {axis} {offset} does not fit "
                                 f"memref %{memref.name} ({memref.shape[0]}x{memref.shape[1]})")

    def _tile_shapes(self, where: str, form: Form, dst: Tile, a: Tile, b: Tile | None = None) -> None:
        tiles = [t for t in (dst, a, b) if t is not None]
        for tile in tiles if form is not Form.CONVERT else ():
            if tile.dtype != a.dtype:
                self.fail(where, f"tile %{tile.name} is {tile.dtype.name} but %{a.name} is {a.dtype.name}")
        rows, cols = a.rows, a.cols
        same = f"%{a.name} is {_shape(a)}"
        # (tile, expected rows, expected cols, why), checked in order
        expected = {
            Form.UNARY: [(dst, rows, cols, same)],
            Form.CONVERT: [(dst, rows, cols, same)],
            Form.BINARY: [(b, rows, cols, same), (dst, rows, cols, same)],
            Form.TILE_SCALAR: [(dst, rows, cols, same)],
            Form.MASK: [(dst, rows, cols, same)],
            Form.TRANSPOSE: [(dst, cols, rows, f"the transpose of %{a.name} ({_shape(a)}) is {cols}x{rows}")],
            Form.ROW_REDUCE: [(dst, rows, 1, f"the row reduction of %{a.name} ({_shape(a)}) is {rows}x1")],
            Form.COL_REDUCE: [(dst, 1, cols, f"the column reduction of %{a.name} ({_shape(a)}) is 1x{cols}")],
            Form.ROW_EXPAND: [(b, rows, 1, f"broadcasting along the rows of %{a.name} ({_shape(a)}) "
                                           f"needs {rows}x1"), (dst, rows, cols, same)],
            Form.COL_EXPAND: [(b, 1, cols, f"broadcasting down the columns of %{a.name} ({_shape(a)}) "
                                           f"needs 1x{cols}"), (dst, rows, cols, same)],
        }.get(form)
        if form is Form.MATMUL:
            expected = [(b, cols, b.cols, f"%{a.name} is {_shape(a)}, so %{b.name} needs {cols} rows"),
                        (dst, rows, b.cols, f"%{a.name} @ %{b.name} is {rows}x{b.cols}")]
        for tile, want_rows, want_cols, why in expected:
            if (tile.rows, tile.cols) != (want_rows, want_cols):
                self.fail(where, f"tile %{tile.name} is {_shape(tile)} but {why}")

    def _for(self, loop: For) -> None:
        where = describe(loop)
        self._check_name(where, loop.var)
        if loop.var in self.loop_vars:
            self.fail(where, f"loop variable %{loop.var} is already the variable of an enclosing loop")
        if loop.var in self.declared:
            self.fail(where, f"loop variable %{loop.var} is already declared as a "
                             f"{self._kind(self.declared[loop.var])}")
        for bound in (loop.start, loop.stop, loop.step):
            self._operand(where, Kind.INDEX, bound)
        if loop.step == 0:
            self.fail(where, "step 0 never ends")
        self._binary_expansion(where, loop)
        names = [loop.var]
        if loop.rows is not None:
            if not loop.tile_levels:
                self.fail(where, f"rows=%{loop.rows} is the tile rows of a loop with tile_levels")
            self._check_name(where, loop.rows)
            if loop.rows in self.loop_vars or loop.rows == loop.var or loop.rows in self.declared:
                self.fail(where, f"rows=%{loop.rows} is already a name in scope")
            names.append(loop.rows)
        self.loop_vars += names
        self.adaptive += [loop.var] if loop.tile_levels else []
        self._block(loop.body)
        del self.loop_vars[-len(names):]
        if loop.tile_levels:
            self.adaptive.pop()

    def _binary_expansion(self, where: str, loop: For) -> None:
        if loop.max_range is None and loop.min_range is None and not loop.tile_levels:
            return
        if self.function.in_core:
            self.fail(where, "binary expansion (max_range, min_range, tile_levels) is for Orchestration "
                             "loops")
        if loop.max_range is None:
            self.fail(where, "min_range and tile_levels need max_range")
        if not _power_of_two(loop.max_range):
            self.fail(where, f"max_range {loop.max_range!r} is not a power of two")
        low = 1 if loop.min_range is None else loop.min_range
        if not _power_of_two(low) or low > loop.max_range:
            self.fail(where, f"min_range {low!r} is not a power of two <= max_range {loop.max_range}")
        sizes = [level[0] for level in loop.tile_levels]
        if sizes != sorted(set(sizes)):
            self.fail(where, f"tile_levels {loop.tile_levels} are not sorted by block size without repeats")
        for size, rows in loop.tile_levels:
            if not (size == 0 or (_power_of_two(size) and low <= size <= loop.max_range)):
                self.fail(where, f"tile_levels block size {size!r} is neither 0 (the residual) nor a power "
                                 f"of two in [{low}, {loop.max_range}]")
            if not (_is_int(rows) and rows > 0):
                self.fail(where, f"tile_levels rows {rows!r} for block size {size} is not a positive int")
        if not loop.tile_levels:
            return
        # The variable counts base tiles and a level of `rows` takes rows/base of them at a
        # time: consecutive tiles, so the loop steps by 1, and a block (a power of two >=
        # min_range) holds whole steps; the residual, which ends the loop, takes base tiles
        # (a bigger one would run past the trip count).
        if loop.step != 1:
            self.fail(where, f"a loop with tile_levels steps by 1 (its tiles are consecutive), not "
                             f"{loop.step!r}")
        base = min(rows for _, rows in loop.tile_levels)
        for size, rows in loop.tile_levels:
            if size == 0 and rows != base:
                self.fail(where, f"tile_levels rows {rows} for the residual (0) is not the base tile "
                                 f"({base} rows): a residual of bigger tiles would run past the trip count")
            if rows % base or not _power_of_two(rows // base) or (size and rows // base > size):
                self.fail(where, f"tile_levels rows {rows} for block size {size} is not the base tile "
                                 f"({base} rows) times a power of two that divides the block")

    def _if(self, branch: If) -> None:
        where = describe(branch)
        self._operand(where, Kind.INDEX, branch.lhs)
        self._operand(where, Kind.PREDICATE, branch.predicate)
        self._operand(where, Kind.INDEX, branch.rhs)
        self._block(branch.then_body)
        self._block(branch.else_body)

    def _call(self, call: Call) -> None:
        where = describe(call)
        params = [param for param, _ in call.args]
        scalar_args = [param for param, _ in call.scalars]
        if len(set(params + scalar_args)) != len(params) + len(scalar_args):
            self.fail(where, "a callee parameter is bound twice")
        for _, value in call.scalars:
            self._operand(where, Kind.VALUE, value)
        for _, arg in call.args:
            if not isinstance(arg, CallArg):
                self.fail(where, f"{arg!r} is not a CallArg")
            self._operand(where, Kind.MEMREF, arg.tensor)
            if (arg.row is None) != (arg.col is None):
                self.fail(where, f"a window of %{arg.tensor} needs both row and col")
            if arg.windowed:
                self._operand(where, Kind.INDEX, arg.row)
                self._operand(where, Kind.INDEX, arg.col)
        if any(arg.windowed and arg.col in self.adaptive for _, arg in call.args):
            self.fail(where, "a window's column is indexed by an adaptive loop variable, which counts "
                             "row tiles: adaptive tiles scale rows only")
        scaled = {arg.row for _, arg in call.args if arg.windowed and arg.row in self.adaptive}
        if len(scaled) > 1:
            loops = ", ".join(f"%{v}" for v in sorted(scaled))
            self.fail(where, f"windows scaled by two adaptive loops ({loops}) have no one variant: index by "
                             "one of them, or pass views")
        callee = self.module.functions.get(call.callee) if self.module is not None else None
        if callee is None:
            if self.resolve_all:
                self.fail(where, f"unknown function @{call.callee}")
            return
        if self.function.in_core and not callee.in_core:
            self.fail(where, f"an InCore function can only call InCore functions; @{callee.name} is an "
                             "Orchestration")
        if self.function.in_core and callee.library is not None:
            self.fail(where, f"@{callee.name} is a library kernel, which has no body to inline: call it "
                             "from an Orchestration (as a task)")
        expected = [m.name for m in callee.memrefs]
        missing = [name for name in expected if name not in params]
        unexpected = [name for name in params if name not in expected]
        problems = []
        if missing:
            problems.append("missing " + ", ".join(f"%{name}" for name in missing))
        if unexpected:
            problems.append("no memref " + ", ".join(f"%{name}" for name in unexpected))
        if problems:
            self.fail(where, f"@{callee.name} takes memrefs ({', '.join(expected)}): " + "; ".join(problems))
        for param, arg in call.args:
            target, source = callee.memref(param), self.function.memref(arg.tensor)
            if arg.windowed and target.shape is None:
                self.fail(where, f"%{param} of @{callee.name} has no shape, so %{arg.tensor} cannot be "
                                 "passed as a window")
            if arg.windowed and not callee.in_core:
                self.fail(where, f"@{callee.name} is an Orchestration, whose memrefs take whole tensors: "
                                 f"pass %{arg.tensor}, not a window of it")
            if target.dtype != source.dtype:
                self.fail(where, f"%{arg.tensor} is {source.dtype.name} but %{param} of @{callee.name} is "
                                 f"{target.dtype.name}")
        scalar_params = [s.name for s in callee.scalars if s.param]
        if sorted(scalar_args) != sorted(scalar_params):
            self.fail(where, f"@{callee.name} takes scalar parameters ({', '.join(scalar_params)}); the call "
                             f"binds ({', '.join(scalar_args)})")
