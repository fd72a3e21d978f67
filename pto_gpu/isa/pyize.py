"""to_python (spec 003 §3.3): the FunctionBuilder code that rebuilds a module.

Running the code leaves the module in the variable `m`: one builder chain per function, in the
module's order (the builder accepts calls to functions not yet added), declarations in
declaration order, one builder call per statement, nested blocks indented:

    m = isa.Module("softmax_module")
    (isa.FunctionBuilder("dynamic_softmax", module=m).not_in_core()
        .memref("input", pto.FLOAT32)
        .scalar("num_tiles", pto.INT32)
        .for_loop("i", 0, "num_tiles", 1, max_range=4096, min_range=256)
            .call("softmax_tile", {"input": ("input", "i", 0)})
        .end_for()
        .build())
"""

from __future__ import annotations

import json
import math

from .errors import ISAError
from .ir import Alloc, Call, For, Function, If, Module, Op, Predicate, Return, Split, View
from .ops import OPCODES

_INDENT = "    "


def to_python(module: Module) -> str:
    """Python source that rebuilds `module` (as `m`) with isa.FunctionBuilder."""
    lines = ["import pto_gpu as pto", "from pto_gpu import isa", "",
             f"m = isa.Module({_literal(module.name)})"]
    for function in module.functions.values():
        lines += _function(function)
    return "\n".join(lines) + "\n"


def _function(function: Function) -> list[str]:
    kind = "in_core" if function.in_core else "not_in_core"
    lines = [f"(isa.FunctionBuilder({_literal(function.name)}, module=m).{kind}()"]
    if function.library is not None:
        lines.append(f"{_INDENT}.library({_literal(function.library)})")
    if function.column_tails:
        lines.append(f"{_INDENT}.column_tails()")
    if function.tf32:
        lines.append(f"{_INDENT}.tf32()")
    for memref in function.memrefs:
        shape = "" if memref.shape is None else f", {_literal(tuple(memref.shape))}"
        if memref.direction is not None:
            shape += f", direction={_literal(memref.direction.value)}"
        lines.append(f"{_INDENT}.memref({_literal(memref.name)}, pto.{memref.dtype.name}{shape})")
    for scalar in function.scalars:
        method = "scalar" if scalar.param else "scalar_var"
        lines.append(f"{_INDENT}.{method}({_literal(scalar.name)}, pto.{scalar.dtype.name})")
    for tile in function.tiles:
        lines.append(f"{_INDENT}.tile({_arguments(tile.name, tile.rows, tile.cols)}, pto.{tile.dtype.name})")
    for tensor in function.tensors:
        lines.append(f"{_INDENT}.tensor({_literal(tensor.name)}, pto.{tensor.dtype.name})")
    _body(function.body, 1, lines)
    lines.append(f"{_INDENT}.build())")
    return lines


def _body(statements: tuple, depth: int, lines: list[str]) -> None:
    pad = _INDENT * depth
    for s in statements:
        if isinstance(s, Op):
            lines.append(f"{pad}.{OPCODES[s.opcode].builder}({_arguments(s.dst, *s.srcs)})")
        elif isinstance(s, For):
            options = [f"{key}={_literal(value)}" for key, value in
                       (("max_range", s.max_range), ("min_range", s.min_range)) if value is not None]
            if s.tile_levels:
                options.append(f"tile_levels={_literal(dict(s.tile_levels))}")
            if s.rows is not None:
                options.append(f"rows={_literal(s.rows)}")
            header = ", ".join([_arguments(s.var, s.start, s.stop, s.step), *options])
            lines.append(f"{pad}.for_loop({header})")
            _body(s.body, depth + 1, lines)
            lines.append(f"{pad}.end_for()")
        elif isinstance(s, If):
            lines.append(f"{pad}.if_then({_arguments(s.lhs, s.predicate, s.rhs)})")
            _body(s.then_body, depth + 1, lines)
            if s.else_body:
                lines.append(f"{pad}.else_()")
                _body(s.else_body, depth + 1, lines)
            lines.append(f"{pad}.end_if()")
        elif isinstance(s, Call):
            args = {param: arg.tensor if not arg.windowed else (arg.tensor, arg.row, arg.col)
                    for param, arg in s.args}
            scalars = f", scalars={_literal(dict(s.scalars))}" if s.scalars else ""
            lines.append(f"{pad}.call({_literal(s.callee)}, {_literal(args)}{scalars})")
        elif isinstance(s, Return):
            lines.append(f"{pad}.ret()")
        elif isinstance(s, Alloc):
            owner = () if s.owner is None else (s.owner,)
            lines.append(f"{pad}.alloc({_arguments(s.dst, s.shape, *owner)})")
        elif isinstance(s, View):
            lines.append(f"{pad}.view({_arguments(s.dst, s.src, s.slices)})")
        elif isinstance(s, Split):
            lines.append(f"{pad}.split({_arguments(s.dst, s.src, s.groups)})")
        else:
            raise ISAError(f"to_python: {s!r} is not a statement")


def _arguments(*values: object) -> str:
    return ", ".join(_literal(v) for v in values)


def _literal(value: object) -> str:
    """A Python expression for a name, number, predicate, tuple or dict of them."""
    if isinstance(value, Predicate):
        value = value.value
    if value is None:
        return "None"
    if isinstance(value, str):
        return json.dumps(value)  # a valid Python string literal, in double quotes
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'  # inf, -inf, nan
    if isinstance(value, tuple):
        return "(" + ", ".join(_literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return float.__repr__(value)
    return repr(int(value))
