"""The reference interpreter: runs an InCore function on numpy arrays, instruction by instruction.

It is the oracle both code generators are tested against, so it is written to be obviously
right rather than fast: every tile instruction reads the valid region of its sources as
float64, applies the opcode table's numpy `reference`, and rounds the result into the
destination tile's dtype; reductions start from the table's `identity`. Each tile carries its
valid region (rows, cols), set by the rules of docs/ISA.md ("Semantics"). A CALL runs the callee in a
fresh frame of its own tiles and scalars, its memrefs bound to the caller's arrays or windows
of them, which is what inlining means.
"""

from __future__ import annotations

import operator

import numpy as np

from ..dtypes import DataType
from .describe import describe
from .errors import ISAError
from .ir import Call, For, Function, If, Module, Op, Predicate, Return
from .ops import OPCODES, Form
from .verify import verify_module

_COMPARE = {Predicate.LT: operator.lt, Predicate.LE: operator.le, Predicate.GT: operator.gt,
            Predicate.GE: operator.ge, Predicate.EQ: operator.eq, Predicate.NE: operator.ne}


class _Return(Exception):
    """RETURN: unwinds to the frame of the function that executed it."""


def run(module: Module, name: str, *args) -> None:
    """Run InCore function `name` on its memrefs (2-d numpy arrays, each at most the declared
    shape; outputs are written in place) followed by its scalar parameters' values. Any
    narrower window is run, column tails too: the interpreter defines what every window means,
    and the generators are tested against it; a kernel refuses a column tail its function does
    not declare (`column_tails`)."""
    verify_module(module)
    function = _function(module, name, f"module {module.name}")
    memrefs = function.memrefs
    params = [s for s in function.scalars if s.param]
    if len(args) != len(memrefs) + len(params):
        raise ISAError(f"@{name} takes {len(memrefs)} memrefs and {len(params)} scalars "
                       f"({', '.join([m.name for m in memrefs] + [s.name for s in params])}), "
                       f"got {len(args)} arguments")
    arrays = {}
    for memref, array in zip(memrefs, args):
        if not isinstance(array, np.ndarray) or array.ndim != 2:
            raise ISAError(f"@{name}: memref %{memref.name} must be a 2-d numpy array")
        if array.shape[0] > memref.shape[0] or array.shape[1] > memref.shape[1]:
            raise ISAError(f"@{name}: memref %{memref.name} is {memref.shape[0]}x{memref.shape[1]}, got an "
                           f"array of shape {array.shape}")
        arrays[memref.name] = array
    values = {s.name: v for s, v in zip(params, args[len(memrefs):])}
    _Frame(module, function, arrays, values).run()


def _function(module: Module, name: str, where: str) -> Function:
    function = module.functions.get(name)
    if function is None:
        raise ISAError(f"{where}: unknown function @{name}")
    if not function.in_core:
        raise ISAError(f"{where}: @{name} is an Orchestration; only InCore functions run on tiles")
    if function.library is not None:
        raise ISAError(f"{where}: @{name} is the library kernel {function.library}: run its family")
    return function


def cast_scalar(dtype: DataType, value) -> int | float:
    """A scalar as the program sees it: ints are int64, floats rounded to their dtype."""
    if dtype.numpy.kind in "iu":
        if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # the common case, without numpy
            return value
        return int(np.int64(value))
    if type(value) is float and dtype is DataType.FLOAT64:
        return value
    return float(dtype.numpy.type(value))


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class _Frame:
    """One activation of an InCore function: its memref arrays, tiles, valid regions, scalars."""

    def __init__(self, module: Module, function: Function, arrays: dict[str, np.ndarray], params: dict):
        self.module, self.function, self.arrays = module, function, arrays
        self.tiles = {t.name: np.zeros((t.rows, t.cols), t.dtype.numpy) for t in function.tiles}
        self.valid = {t.name: (0, 0) for t in function.tiles}  # nothing is defined before a write
        self.scalars = {s.name: cast_scalar(s.dtype, params[s.name]) for s in function.scalars if s.param}

    def run(self) -> None:
        try:
            self.block(self.function.body)
        except _Return:
            pass

    # values

    def index(self, value, where: str) -> int:
        resolved = self.scalars[value] if isinstance(value, str) else value
        if not isinstance(resolved, int | np.integer):
            raise ISAError(f"@{self.function.name}: {where}: {value!r} is not an integer")
        return int(resolved)

    def number(self, value):
        return self.scalars[value] if isinstance(value, str) else value

    def read(self, name: str, rows: int, cols: int, where: str) -> np.ndarray:
        """The first rows x cols of a tile; reading past its valid region is a program error
        (the generators would read whatever is there), so it is refused here."""
        valid_rows, valid_cols = self.valid[name]
        if rows > valid_rows or cols > valid_cols:
            raise ISAError(f"@{self.function.name}: {where}: reads {rows}x{cols} of %{name}, which holds "
                           f"{valid_rows}x{valid_cols} valid elements")
        return self.tiles[name][:rows, :cols].astype(np.float64)

    def offset(self, value, where: str) -> int:
        """A row or column offset into a memref: never negative (numpy would wrap around)."""
        offset = self.index(value, where)
        if offset < 0:
            raise ISAError(f"@{self.function.name}: {where}: offset {value} is {offset}, below 0")
        return offset

    def write(self, name: str, value: np.ndarray) -> None:
        rows, cols = value.shape
        self.tiles[name][:rows, :cols] = value  # numpy rounds to the tile's dtype
        self.valid[name] = (rows, cols)

    # statements

    def block(self, body) -> None:
        for statement in body:
            if isinstance(statement, Op):
                self.op(statement)
            elif isinstance(statement, For):
                where = describe(statement)
                bounds = (statement.start, statement.stop, statement.step)
                start, stop, step = (self.index(v, where) for v in bounds)
                if step == 0:
                    raise ISAError(f"{where}: its step is 0")
                for value in range(start, stop, step):
                    self.scalars[statement.var] = value
                    self.block(statement.body)
            elif isinstance(statement, If):
                where = describe(statement)
                taken = _COMPARE[statement.predicate](self.index(statement.lhs, where),
                                                      self.index(statement.rhs, where))
                self.block(statement.then_body if taken else statement.else_body)
            elif isinstance(statement, Call):
                self.call(statement)
            elif isinstance(statement, Return):
                raise _Return
            else:
                raise ISAError(f"@{self.function.name}: {statement!r} is not a statement")

    def call(self, call: Call) -> None:
        where = describe(call)
        callee = _function(self.module, call.callee, f"@{self.function.name}: {where}")
        arrays = {}
        for param, arg in call.args:
            array = self.arrays[arg.tensor]
            rows, cols = callee.memref(param).shape
            if arg.windowed:
                row = self.offset(arg.row, where) * rows
                col = self.offset(arg.col, where) * cols
                array = array[row:row + rows, col:col + cols]
            arrays[param] = array[:rows, :cols]  # a memref is a window of at most its declared shape
        values = {param: self.number(value) for param, value in call.scalars}
        _Frame(self.module, callee, arrays, values).run()

    def op(self, op: Op) -> None:
        spec = OPCODES.get(op.opcode)
        where = describe(op)
        if spec is None:
            raise ISAError(f"@{self.function.name}: {where}: unknown instruction")
        form, srcs = spec.form, op.srcs
        if form is Form.LOAD:
            array = self.arrays[srcs[0]]
            row, col = (self.offset(v, where) for v in srcs[1:3])
            tile = self.tiles[op.dst]
            rows = min(tile.shape[0], max(0, array.shape[0] - row))
            cols = min(tile.shape[1], max(0, array.shape[1] - col))
            self.write(op.dst, array[row:row + rows, col:col + cols].astype(np.float64))
        elif form is Form.STORE:
            array = self.arrays[op.dst]
            row, col = (self.offset(v, where) for v in srcs[1:3])
            valid_rows, valid_cols = self.valid[srcs[0]]
            rows = min(valid_rows, max(0, array.shape[0] - row))
            cols = min(valid_cols, max(0, array.shape[1] - col))
            array[row:row + rows, col:col + cols] = self.tiles[srcs[0]][:rows, :cols]
        elif form is Form.SCALAR:
            value = srcs[0] if spec.reference is None else spec.reference(*(self.number(v) for v in srcs))
            self.set_scalar(op.dst, value)
        elif form is Form.COMPARE:
            a, b, predicate = srcs
            self.set_scalar(op.dst, int(_COMPARE[predicate](self.number(a), self.number(b))))
        elif form is Form.DIM:
            self.set_scalar(op.dst, self.arrays[srcs[0]].shape[srcs[1]])
        else:
            self.tile_op(op, spec, where)

    def set_scalar(self, name: str, value) -> None:
        scalar = self.function.scalar(name)
        self.scalars[name] = cast_scalar(scalar.dtype, value)

    def tile_op(self, op: Op, spec, where: str) -> None:
        form, srcs = spec.form, op.srcs
        if form is Form.GENERATE:  # the whole tile, from a scalar and each element's (row, col)
            rows, cols = self.tiles[op.dst].shape
            row, col = np.arange(rows, dtype=float)[:, None], np.arange(cols, dtype=float)[None, :]
            self.write(op.dst, spec.reference(float(self.number(srcs[0])), row, col))
            return
        rows, cols = self.valid[srcs[0]]
        a = self.read(srcs[0], rows, cols, where)
        if form in (Form.UNARY, Form.CONVERT):  # CONVERT: write rounds into dst's dtype
            result = spec.reference(a)
        elif form is Form.BINARY:
            result = spec.reference(a, self.read(srcs[1], rows, cols, where))
        elif form is Form.TILE_SCALAR:
            result = spec.reference(a, float(self.number(srcs[1])))
        elif form is Form.ROW_REDUCE:
            result = spec.reference(a, axis=1, initial=spec.identity, keepdims=True)
        elif form is Form.COL_REDUCE:
            result = spec.reference(a, axis=0, initial=spec.identity, keepdims=True)
        elif form is Form.ROW_EXPAND:
            result = spec.reference(a, self.read(srcs[1], rows, 1, where))
        elif form is Form.COL_EXPAND:
            result = spec.reference(a, self.read(srcs[1], 1, cols, where))
        elif form is Form.MASK:
            row, col = (self.index(v, where) for v in srcs[1:3])
            keep = np.arange(cols)[None, :] + col <= np.arange(rows)[:, None] + row
            result = np.where(keep, a, -np.inf)
        elif form is Form.TRANSPOSE:
            result = spec.reference(a)
        elif form is Form.MATMUL:
            b_rows, b_cols = self.valid[srcs[1]]
            if b_rows != cols:
                raise ISAError(f"@{self.function.name}: {where}: %{srcs[0]} has {cols} valid columns but "
                               f"%{srcs[1]} has {b_rows} valid rows")
            if spec.accumulate:  # dst keeps its valid region and is read too
                rows, b_cols = self.valid[op.dst]
                product = spec.reference(self.read(srcs[0], rows, cols, where),
                                         self.read(srcs[1], cols, b_cols, where))
                result = self.read(op.dst, rows, b_cols, where) + product
            else:
                result = spec.reference(a, self.read(srcs[1], cols, b_cols, where))
        else:
            raise ISAError(f"@{self.function.name}: {where}: no interpreter rule for form {form.name}")
        self.write(op.dst, result)
