"""Compiled orchestrations: an Orchestration function as generated numba code over pto_gpu.jit.

`orchestration(program, name)` gives `fn(o, *arrays, *scalars)` for `rt.run`, like
orchestrate.py's, whose walk over the same IR is the semantics this code must have: the same
tasks, params and edges. The body is one `@njit` function, written as a `.py` under the cache
directory (cpu_codegen.cache_dir) so numba's cache works across processes:

    def body(o, m_input, m_output, p_num_tiles, k_softmax_tile):
        s_num_tiles = np.int64(p_num_tiles)
        for i_i in range(0, s_num_tiles, 1):
            ...window of m_input for %input...
            pj.submit(o, k_softmax_tile, (pj.input(w1), pj.output(w2)), ())

Memrefs arrive as compiled descriptors (o.compiled converts them), scalar parameters as
numbers, then the kernel id of each InCore callee (ids depend on import order, so they are
arguments, never baked into cached code). Orchestration callees are inlined, their names
numbered per activation; a RETURN in an inlined callee leaves it through a `while True` block
and a flag, as cpu_codegen does. Errors a program can only meet at run time (a window that
starts past its tensor, more iterations than a loop's max_range) raise ValueError naming the
function and the statement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from ..dtypes import DataType
from .cpu_codegen import cache_dir, load_source
from .errors import ISAError
from .ir import Call, For, Function, If, Module, Op, Predicate, Return, walk
from .ops import OPCODES, Form
from .verify import Direction, describe, directions, verify_module

GENERATOR_VERSION = 1
_COMPARE = {Predicate.LT: "<", Predicate.LE: "<=", Predicate.GT: ">", Predicate.GE: ">=", Predicate.EQ: "==",
            Predicate.NE: "!="}
_WRAP = {Direction.INPUT: "pj.input", Direction.OUTPUT: "pj.output", Direction.INOUT: "pj.inout"}


def orchestration_source(module: Module, name: str) -> tuple[str, list[str]]:
    """The generated source of Orchestration function `name`, and the InCore callees whose
    kernel ids its body takes, in order."""
    verify_module(module)
    function = module.functions.get(name)
    if function is None:
        raise ISAError(f"module {module.name}: unknown function @{name}")
    if function.in_core:
        raise ISAError(f"@{name} is an InCore function: submit program.kernels[{name!r}] instead")
    writer = _Writer(module)
    return writer.source(function), writer.callees


def orchestration(program, name: str) -> Callable[..., None]:
    """Orchestration function `name` of a compiled program as a compiled orchestration."""
    source, callees = orchestration_source(program.module, name)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    body = load_source(cache_dir() / f"orchestration_{digest}.py", source, digest).body
    function = program.module.functions[name]
    memrefs = len(function.memrefs)
    params = [s for s in function.scalars if s.param]
    kernel_ids = tuple(program.kernels[callee].id for callee in callees)

    def run(o, *args) -> None:
        if len(args) != memrefs + len(params):
            names = ", ".join([m.name for m in function.memrefs] + [s.name for s in params])
            raise ISAError(f"@{name} takes {memrefs} arrays and {len(params)} scalars ({names}), "
                           f"got {len(args)} arguments")
        o.compiled(body, *(o.external(a) for a in args[:memrefs]), *args[memrefs:], *kernel_ids)

    run.__name__ = name
    return run


class _Writer:
    def __init__(self, module: Module):
        self.module = module
        self.lines: list[str] = []
        self.depth = 1
        self.activations = 0
        self.callees: list[str] = []
        self.flows = {f.name: directions(f, module) for f in module.functions.values() if f.in_core}

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def source(self, function: Function) -> str:
        params = [s for s in function.scalars if s.param]
        tensors = {m.name: f"m_{m.name}" for m in function.memrefs}
        activation = _Activation(self, function, tensors, {s.name: f"p_{s.name}" for s in params})
        activation.body()
        arguments = ["o", *tensors.values(), *(f"p_{s.name}" for s in params),
                     *(f"k_{callee}" for callee in self.callees)]
        text = [f"# PTO ISA orchestration generator v{GENERATOR_VERSION}: @{function.name}",
                "import numpy as np", "from numba import njit", "", "from pto_gpu import jit as pj", "", "",
                "@njit(cache=True)", f"def body({', '.join(arguments)}):"]
        return "\n".join(text + self.lines + ["    return"]) + "\n"

    def kernel(self, callee: str) -> str:
        if callee not in self.callees:
            self.callees.append(callee)
        return f"k_{callee}"


class _Activation:
    """One Orchestration function's body, inlined: its names as Python identifiers."""

    def __init__(self, writer: _Writer, function: Function, tensors: dict[str, str], values: dict[str, str],
                 top: bool = True):
        self.w, self.function, self.tensors, self.top = writer, function, tensors, top
        k = writer.activations
        writer.activations += 1
        self.names = {s.name: f"s{k}_{s.name}" for s in function.scalars}
        loops = [s for s in walk(function.body) if isinstance(s, For)]
        self.names.update({loop.var: f"i{k}_{loop.var}" for loop in loops})
        self.flag = None if top or not any(isinstance(s, Return) for s in walk(function.body)) else f"r{k}"
        self.loops = 0
        for scalar in function.scalars:
            value = values[scalar.name] if scalar.param else "0"
            writer.emit(f"{self.names[scalar.name]} = {_type(scalar.dtype)}({value})")

    def body(self) -> None:
        if self.flag is None:
            self.block(self.function.body)
            return
        self.w.emit(f"{self.flag} = False")
        self.w.emit("while True:  # left by break: a RETURN, or the end")
        self.w.depth += 1
        self.block(self.function.body)
        self.w.emit("break")
        self.w.depth -= 1

    def value(self, operand) -> str:
        return self.names[operand] if isinstance(operand, str) else repr(operand)

    def fail(self, where: str, message: str) -> str:
        return f"raise ValueError({f'@{self.function.name}: {where}: {message}'!r})"

    def block(self, body) -> None:
        start = len(self.w.lines)
        for statement in body:
            self.statement(statement)
        if len(self.w.lines) == start:
            self.w.emit("pass")

    def statement(self, statement) -> None:
        w = self.w
        if isinstance(statement, Op):
            self.op(statement)
        elif isinstance(statement, For):
            where = describe(statement)
            bounds = ", ".join(self.value(v) for v in (statement.start, statement.stop, statement.step))
            var = self.names[statement.var]
            if statement.max_range is not None:
                w.emit(f"if len(range({bounds})) > {statement.max_range}:")
                w.emit("    " + self.fail(where, f"more iterations than its max_range {statement.max_range}"))
            w.emit(f"for {var} in range({bounds}):")
            w.depth += 1
            self.loops += 1
            self.block(statement.body)
            self.loops -= 1
            w.depth -= 1
            if self.flag is not None and any(isinstance(s, Return) for s in walk(statement.body)):
                w.emit(f"if {self.flag}:")
                w.emit("    break")
        elif isinstance(statement, If):
            compare = _COMPARE[statement.predicate]
            w.emit(f"if {self.value(statement.lhs)} {compare} {self.value(statement.rhs)}:")
            w.depth += 1
            self.block(statement.then_body)
            w.depth -= 1
            if statement.else_body:
                w.emit("else:")
                w.depth += 1
                self.block(statement.else_body)
                w.depth -= 1
        elif isinstance(statement, Call):
            self.call(statement)
        elif isinstance(statement, Return):
            if self.top:
                w.emit("return")
            else:
                if self.loops:
                    w.emit(f"{self.flag} = True")
                w.emit("break")
        else:
            raise ISAError(f"@{self.function.name}: {statement!r} is not a statement")

    def op(self, op: Op) -> None:
        spec = OPCODES[op.opcode]  # the verifier admits only scalar instructions here
        dst = self.names[op.dst]
        cast = _type(self.function.scalar(op.dst).dtype)
        if spec.form is Form.COMPARE:
            a, b, predicate = op.srcs
            self.w.emit(f"{dst} = {cast}(1 if {self.value(a)} {_COMPARE[predicate]} {self.value(b)} else 0)")
        elif spec.reference is None:  # SLI
            self.w.emit(f"{dst} = {cast}({op.srcs[0]!r})")
        else:
            operands = {"a": self.value(op.srcs[0]), "b": self.value(op.srcs[1]) if len(op.srcs) > 1 else ""}
            self.w.emit(f"{dst} = {cast}({spec.cpu.format(**operands)})")

    def call(self, call: Call) -> None:
        w, where = self.w, describe(call)
        callee = self.w.module.functions[call.callee]
        args = dict(call.args)
        values = {param: self.value(value) for param, value in call.scalars}
        if not callee.in_core:  # bound to whole tensors (the verifier refuses windows)
            tensors = {param: self.tensors[arg.tensor] for param, arg in args.items()}
            w.emit(f"# {where}")
            _Activation(w, callee, tensors, values, top=False).body()
            return
        params = []
        for memref in callee.memrefs:
            arg, (rows, cols) = args[memref.name], memref.shape
            tensor = self.tensors[arg.tensor]
            window = f"w{len(w.lines)}_{memref.name}"
            row, col = ("0", "0")
            if arg.windowed:
                row, col = f"{self.value(arg.row)} * {rows}", f"{self.value(arg.col)} * {cols}"
            w.emit(f"{window}_r, {window}_c = {row}, {col}")
            height, width = f"pj.shape({tensor}, 0)", f"pj.shape({tensor}, 1)"
            w.emit(f"if not (0 <= {window}_r < {height} and 0 <= {window}_c < {width}):")
            w.emit("    " + self.fail(where, f"the window of %{arg.tensor} for %{memref.name} starts outside "
                                         "its shape"))
            rows_of = f"pj.narrow({tensor}, 0, {window}_r, min({window}_r + {rows}, {height}))"
            w.emit(f"{window} = pj.narrow({rows_of}, 1, {window}_c, min({window}_c + {cols}, {width}))")
            params.append(f"{_WRAP[self.w.flows[callee.name][memref.name]]}({window})")
        scalars = [f"{_type(s.dtype)}({values[s.name]})" for s in callee.scalars if s.param]
        w.emit(f"pj.submit(o, {w.kernel(callee.name)}, ({', '.join(params)},), "
               f"({''.join(s + ', ' for s in scalars)}))  # {where}")


def _type(dtype: DataType) -> str:
    """The numpy type a scalar of `dtype` is held in: int64, or its float type (half types in
    float32, which numba has)."""
    if dtype.numpy.kind in "iub":
        return "np.int64"
    return "np.float32" if dtype in (DataType.FLOAT16, DataType.BFLOAT16) else f"np.{dtype.numpy.name}"
