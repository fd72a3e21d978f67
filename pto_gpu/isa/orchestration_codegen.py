"""Compiled orchestrations: an Orchestration function as generated numba code over pto_gpu.jit.

`orchestration(program, name)` gives `fn(o, *arrays, *scalars)` for `rt.run`, like
orchestrate.py's, whose walk over the same IR is the semantics this code must have: the same
tasks, params, edges, allocations and frees (both take them from lowering.py). The body is one
`@njit` function, written as a `.py` under the cache directory (generated.cache_dir) so
numba's cache works across processes:

    def body(o, m_input, m_output, p_num_tiles, k_softmax_tile):
        pj.scope_begin(o)
        s0_num_tiles = np.int64(p_num_tiles)
        for i0_i in range(0, s0_num_tiles, 1):
            ...window of m_input for %input...
            pj.submit(o, k_softmax_tile, (pj.input(w1), pj.output(w2)), ())
        pj.scope_end(o)

Memrefs arrive as compiled descriptors (o.compiled converts them), scalar parameters as
numbers, then the kernel id of each InCore callee and, for a call in an adaptive loop, a tuple
of the ids of its variant per level (ids depend on import order, so they are arguments, never
baked into cached code). A binary-expanded loop is one loop over its levels (a tuple of
constants) around the body, so the body is written once however many levels there are.
Orchestration callees are inlined, their names numbered per activation, each activation that
allocates and can RETURN in a scope (lowering.scoped); a RETURN in an inlined callee leaves it
through a `while True` block and a flag, as cpu_codegen does. Errors a program can only meet
at run time (a window or view that starts past its tensor, more iterations than a loop's
max_range) raise an ISAError naming the function and the statement, as the walker does (with
fewer of the values in the message).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from ..dtypes import DataType
from ..generated import cache_dir, load_source
from ..jit import source_fingerprint
from .dataflow import directions, tensor_roots
from .describe import describe
from .errors import ISAError
from .ir import Alloc, Call, Direction, For, Function, If, Module, Op, Predicate, Return, Split, View, walk
from .lowering import expansion, free_points, scaled_by, scoped, variant_name, variants
from .ops import OPCODES, Form
from .orchestrate import external
from .verify import verify_module

GENERATOR_VERSION = 4
_COMPARE = {Predicate.LT: "<", Predicate.LE: "<=", Predicate.GT: ">", Predicate.GE: ">=", Predicate.EQ: "==",
            Predicate.NE: "!="}
_WRAP = {Direction.INPUT: "pj.input", Direction.OUTPUT: "pj.output", Direction.INOUT: "pj.inout"}


def orchestration_source(module: Module, name: str) -> tuple[str, list[tuple[str, tuple[str, ...]]]]:
    """The generated source of Orchestration function `name`, and its kernel arguments in
    order: (argument, the kernels whose ids it takes: one, or one per level of a loop)."""
    verify_module(module)
    function = module.functions.get(name)
    if function is None:
        raise ISAError(f"module {module.name}: unknown function @{name}")
    if function.in_core:
        raise ISAError(f"@{name} is an InCore function: submit program.kernels[{name!r}] instead")
    writer = _Writer(module)
    return writer.source(function), writer.kernel_args


def orchestration(program, name: str) -> Callable[..., None]:
    """Orchestration function `name` of a compiled program as a compiled orchestration."""
    source, kernel_args = orchestration_source(program.module, name)
    # The runtime's fingerprint too: numba's cache of the body holds the jit functions it calls.
    digest = hashlib.sha256((source + source_fingerprint()).encode()).hexdigest()[:24]
    body = load_source(cache_dir() / f"orchestration_{digest}.py", source, digest).body
    function = program.module.functions[name]
    memrefs = len(function.memrefs)
    ids = [tuple(program.kernels[k].id for k in kernels) if argument.startswith("kv")
           else program.kernels[kernels[0]].id for argument, kernels in kernel_args]

    def run(o, *args) -> None:
        tensors = external(o, function, args)  # checked before anything else is touched
        o.compiled(body, *tensors, *args[memrefs:], *ids)

    run.__name__ = name
    return run


class _Writer:
    def __init__(self, module: Module):
        self.module = module
        self.functions = {**module.functions, **variants(module)}  # the variants' shapes give extents
        self.lines: list[str] = []
        self.depth = 1
        self.activations = 0
        self.temporaries = 0
        self.kernel_args: list[tuple[str, tuple[str, ...]]] = []
        self.flows = {f.name: directions(f, module) for f in module.functions.values() if f.in_core}

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def fresh(self, stem: str) -> str:
        self.temporaries += 1
        return f"{stem}{self.temporaries}"

    def source(self, function: Function) -> str:
        params = [s for s in function.scalars if s.param]
        tensors = {m.name: f"m_{m.name}" for m in function.memrefs}
        activation = _Activation(self, function, tensors, {s.name: f"p_{s.name}" for s in params})
        activation.body()
        arguments = ["o", *tensors.values(), *(f"p_{s.name}" for s in params),
                     *(argument for argument, _ in self.kernel_args)]
        text = [f"# PTO ISA orchestration generator v{GENERATOR_VERSION}: @{function.name}",
                "import numpy as np", "from numba import njit", "", "from pto_gpu import jit as pj",
                "from pto_gpu.isa.errors import ISAError", "", "",
                "@njit(cache=True, nogil=True)", f"def body({', '.join(arguments)}):"]
        return "\n".join(text + self.lines + ["    return"]) + "\n"

    def kernel(self, names: tuple[str, ...], per_level: bool) -> str:
        """The argument that holds the id of kernel names[0], or (per_level) the tuple of the
        ids of `names`, one per level of a loop."""
        argument = f"kv{len(self.kernel_args)}_{names[0]}" if per_level else f"k_{names[0]}"
        if (argument, names) not in self.kernel_args:
            self.kernel_args.append((argument, names))
        return argument


class _Activation:
    """One Orchestration function's body, inlined: its names as Python identifiers."""

    def __init__(self, writer: _Writer, function: Function, tensors: dict[str, str], values: dict[str, str],
                 top: bool = True):
        self.w, self.function, self.top = writer, function, top
        k = writer.activations
        writer.activations += 1
        self.names = {s.name: f"s{k}_{s.name}" for s in function.scalars}
        loops = [s for s in walk(function.body) if isinstance(s, For)]
        self.names.update({loop.var: f"i{k}_{loop.var}" for loop in loops})
        self.names.update({loop.rows: f"i{k}_{loop.rows}" for loop in loops if loop.rows is not None})
        self.tensors = {**tensors, **{t.name: f"t{k}_{t.name}" for t in function.tensors}}
        self.roots = tensor_roots(function)
        self.levels: dict[str, tuple[For, str]] = {}  # adaptive loop variable -> (loop, its level index)
        self.flag = None if top or not any(isinstance(s, Return) for s in walk(function.body)) else f"r{k}"
        self.scoped = scoped(function)
        self.loops = 0
        for scalar in function.scalars:
            value = values[scalar.name] if scalar.param else "0"
            writer.emit(f"{self.names[scalar.name]} = {_type(scalar.dtype)}({value})")

    def body(self) -> None:
        if self.scoped:
            self.w.emit("pj.scope_begin(o)")
        if self.flag is None:
            self.block(self.function.body)
        else:
            self.w.emit(f"{self.flag} = False")
            self.w.emit("while True:  # left by break: a RETURN, or the end")
            self.w.depth += 1
            self.block(self.function.body)
            self.w.emit("break")
            self.w.depth -= 1
        if self.scoped:
            self.w.emit("pj.scope_end(o)")

    def value(self, operand) -> str:
        return self.names[operand] if isinstance(operand, str) else repr(operand)

    def fail(self, where: str, message: str) -> str:
        return f"raise ISAError({f'@{self.function.name}: {where}: {message}'!r})"

    def block(self, body) -> None:
        start = len(self.w.lines)
        for statement, frees in zip(body, free_points(body, self.roots)):
            self.statement(statement)
            for name in frees:
                self.w.emit(f"pj.free(o, {self.tensors[name]})")
        if len(self.w.lines) == start:
            self.w.emit("pass")

    def nested(self, body) -> None:
        self.w.depth += 1
        self.block(body)
        self.w.depth -= 1

    def statement(self, statement) -> None:
        w = self.w
        if isinstance(statement, Op):
            self.op(statement)
        elif isinstance(statement, For):
            self.loop(statement)
        elif isinstance(statement, If):
            compare = _COMPARE[statement.predicate]
            w.emit(f"if {self.value(statement.lhs)} {compare} {self.value(statement.rhs)}:")
            self.nested(statement.then_body)
            if statement.else_body:
                w.emit("else:")
                self.nested(statement.else_body)
        elif isinstance(statement, Call):
            self.call(statement)
        elif isinstance(statement, Alloc):
            dims = "".join(f"np.int64({self.value(n)}), " for n in statement.shape)
            code = int(self.function.memref(statement.dst).dtype)
            owner = "-1" if statement.owner is None else f"pj.owner_of(o, {self.tensors[statement.owner]})"
            allocated = f"pj.alloc(o, ({dims}), {code}, {owner})"
            w.emit(f"{self.tensors[statement.dst]} = {allocated}  # {describe(statement)}")
        elif isinstance(statement, View):
            self.view(statement)
        elif isinstance(statement, Split):
            where, source = describe(statement), self.tensors[statement.src]
            groups = w.fresh("g")
            w.emit(f"{groups} = {self.value(statement.groups)}")
            w.emit(f"if pj.ndim({source}) != 2 or {groups} <= 0 or pj.shape({source}, 1) % {groups} != 0:")
            w.emit("    " + self.fail(where, f"cannot split %{statement.src} into that many column groups"))
            w.emit(f"{self.tensors[statement.dst]} = pj.swap(pj.split({source}, 1, pj.shape({source}, 1) "
                   f"// {groups}), 0, 1)  # {where}")
        elif isinstance(statement, Return):
            if self.top:
                if self.scoped:
                    w.emit("pj.scope_end(o)")
                w.emit("return")
            else:
                if self.loops:
                    w.emit(f"{self.flag} = True")
                w.emit("break")
        else:
            raise ISAError(f"@{self.function.name}: {statement!r} is not a statement")

    def leave_if_returned(self, body) -> None:
        """After a loop: a RETURN inside it (flag set) leaves the enclosing one too."""
        if self.flag is not None and any(isinstance(s, Return) for s in walk(body)):
            self.w.emit(f"if {self.flag}:")
            self.w.emit("    break")

    def loop(self, loop: For) -> None:
        w, where = self.w, describe(loop)
        bounds = ", ".join(self.value(v) for v in (loop.start, loop.stop, loop.step))
        var = self.names[loop.var]
        self.loops += 1
        if loop.max_range is None:
            w.emit(f"for {var} in range({bounds}):")
            self.nested(loop.body)
        else:
            self.expanded(loop, where, bounds, var)
        self.loops -= 1
        self.leave_if_returned(loop.body)

    def expanded(self, loop: For, where: str, bounds: str, var: str) -> None:
        """lowering.expansion: one loop over the levels around one copy of the body."""
        w = self.w
        levels = expansion(loop)
        trips, done, level, count, k = (w.fresh(stem) for stem in ("n", "d", "lv", "c", "k"))
        start, step = w.fresh("s"), w.fresh("t")
        low = (loop.min_range or 1) - 1
        sizes = _tuple(v.size for v in levels)
        # start and step are read once, at the loop's entry, as range() reads them
        w.emit(f"{start}, {step} = {self.value(loop.start)}, {self.value(loop.step)}")
        w.emit(f"{trips} = len(range({bounds}))")
        w.emit(f"if {trips} > {loop.max_range}:")
        w.emit("    " + self.fail(where, f"more iterations than its max_range {loop.max_range}"))
        w.emit(f"{done} = 0")
        w.emit(f"for {level} in range({len(levels)}):  # blocks of {', '.join(str(v.size) for v in levels)}"
               " (0: the residual)")
        w.depth += 1
        w.emit(f"{count} = ({trips} & {low}) if {sizes}[{level}] == 0 else "
               f"({sizes}[{level}] if ({trips} - ({trips} & {low})) & {sizes}[{level}] else 0)")
        if loop.rows is not None:
            w.emit(f"{self.names[loop.rows]} = np.int64({_tuple(v.rows for v in levels)}[{level}])")
        w.emit(f"for {k} in range({done}, {done} + {count}, {_tuple(v.scale for v in levels)}[{level}]):")
        w.emit(f"    {var} = {start} + {k} * {step}")
        if loop.tile_levels:
            self.levels[loop.var] = (loop, level)
        self.loops += 1
        self.nested(loop.body)
        self.loops -= 1
        self.levels.pop(loop.var, None)
        self.leave_if_returned(loop.body)
        w.emit(f"{done} += {count}")
        w.depth -= 1

    def view(self, view: View) -> None:
        w, where, source = self.w, describe(view), self.tensors[view.src]
        dst = self.tensors[view.dst]
        w.emit(f"if pj.ndim({source}) != {len(view.slices)}:")
        w.emit("    " + self.fail(where, f"{len(view.slices)} slices for a tensor of another rank"))
        w.emit(f"{dst} = {source}  # {where}")
        for axis, bounds in enumerate(view.slices):
            if bounds is None:
                continue
            first, stop = w.fresh("a"), w.fresh("b")
            w.emit(f"{first}, {stop} = {self.value(bounds[0])}, {self.value(bounds[1])}")
            w.emit(f"if not (0 <= {first} < pj.shape({dst}, {axis}) and {stop} > {first}):")
            message = f"the dim {axis} slice of %{view.src} is empty or starts outside it"
            w.emit("    " + self.fail(where, message))
            w.emit(f"{dst} = pj.narrow({dst}, {axis}, {first}, min({stop}, pj.shape({dst}, {axis})))")

    def op(self, op: Op) -> None:
        spec = OPCODES[op.opcode]  # the verifier admits only scalar instructions here
        dst = self.names[op.dst]
        cast = _type(self.function.scalar(op.dst).dtype)
        if spec.form is Form.COMPARE:
            a, b, predicate = op.srcs
            self.w.emit(f"{dst} = {cast}(1 if {self.value(a)} {_COMPARE[predicate]} {self.value(b)} else 0)")
        elif spec.form is Form.DIM:
            tensor, axis = self.tensors[op.srcs[0]], op.srcs[1]
            self.w.emit(f"if pj.ndim({tensor}) <= {axis}:")
            self.w.emit("    " + self.fail(describe(op), f"%{op.srcs[0]} has no axis {axis}"))
            self.w.emit(f"{dst} = {cast}(pj.shape({tensor}, {axis}))")
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
        scaled = scaled_by(call, self.levels)
        if scaled is None:
            targets, kernel, level = [callee], w.kernel((callee.name,), per_level=False), "0"
        else:
            loop, level = self.levels[scaled]
            targets = [callee if v.scale == 1 else w.functions[variant_name(callee.name, v.rows)]
                       for v in expansion(loop)]
            kernel = f"{w.kernel(tuple(t.name for t in targets), per_level=True)}[{level}]"
        params = []
        for memref in callee.memrefs:
            arg, tensor = args[memref.name], self.tensors[args[memref.name].tensor]
            wrap = _WRAP[w.flows[callee.name][memref.name]]
            if memref.shape is None:  # a library kernel: the tensor as it is
                params.append(f"{wrap}({tensor})")
                continue
            rows, cols = memref.shape
            extents = [t.memref(memref.name).shape for t in targets]
            window = w.fresh(f"w_{memref.name}_")
            row, col = ("0", "0")
            if arg.windowed:
                row, col = f"{self.value(arg.row)} * {rows}", f"{self.value(arg.col)} * {cols}"
            w.emit(f"if pj.ndim({tensor}) != 2:")
            w.emit("    " + self.fail(where, f"%{arg.tensor} is not 2-d, but %{memref.name} of "
                                         f"@{callee.name} takes a 2-d window"))
            w.emit(f"{window}_r, {window}_c = {row}, {col}")
            height, width = f"pj.shape({tensor}, 0)", f"pj.shape({tensor}, 1)"
            w.emit(f"if not (0 <= {window}_r < {height} and 0 <= {window}_c < {width}):")
            w.emit("    " + self.fail(where, f"the window of %{arg.tensor} for %{memref.name} starts outside "
                                         "its shape"))
            extent_rows = _tuple(e[0] for e in extents) + f"[{level}]"
            extent_cols = _tuple(e[1] for e in extents) + f"[{level}]"
            rows_of = f"pj.narrow({tensor}, 0, {window}_r, min({window}_r + {extent_rows}, {height}))"
            stop = f"min({window}_c + {extent_cols}, {width})"
            w.emit(f"{window} = pj.narrow({rows_of}, 1, {window}_c, {stop})")
            params.append(f"{wrap}({window})")
        scalars = [f"{_type(s.dtype)}({values[s.name]})" for s in callee.scalars if s.param]
        w.emit(f"pj.submit(o, {kernel}, ({', '.join(params)},), "
               f"({''.join(s + ', ' for s in scalars)}))  # {where}")


def _tuple(values) -> str:
    """A tuple literal of ints (its trailing comma kept for one element)."""
    values = [int(v) for v in values]
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


def _type(dtype: DataType) -> str:
    """The numpy type a scalar of `dtype` is held in: int64, or its float type (half types in
    float32, which numba has)."""
    if dtype.numpy.kind in "iub":
        return "np.int64"
    return "np.float32" if dtype in (DataType.FLOAT16, DataType.BFLOAT16) else f"np.{dtype.numpy.name}"
