"""CPU code generation: one numba function per InCore function, written as Python source.

The generated function takes the memref arrays, then the scalar parameters, like every kernel's
CPU implementation. Callees are inlined (their names get an instance number); memref windows
become array views. Each tile is a preallocated array of its compute type (float16/bfloat16
tiles compute in float32; numba has no half types, so a plain-Python wrapper passes such
memrefs as float32 copies and copies stored ones back: the generated source, and so the numba
compilation, is the float32 one). Valid regions are runtime ints: each tile's
region is tracked at generation time as the names of the int variables holding it, so an
element-wise chain knows statically that its operands share bounds.

Fusion: consecutive row-local instructions (everything but MATMUL, COL_REDUCE and scalar or
control instructions) share one loop over rows; inside it, consecutive instructions with the
same column bound share one loop over columns (a segment), and row reductions are running
accumulators in that loop. The rules below keep each fused order equivalent to running the
instructions one after another:
  - a group never holds both a TLOAD and a TSTORE, nor two TSTOREs to one memref (memory may
    alias across rows);
  - COL_EXPAND reads row 0 of b whatever the row, but b has one row, and every instruction that
    writes a one-row tile iterates one row: it is never in a group over more rows;
  - a row reduction's result (written after its segment's column loop) is not read or written
    by a later instruction of the same segment, and a broadcast row operand (read before the
    column loop) is not written earlier in its segment.

Floating point: the generated function runs with numba's numpy error model (IEEE division, as the
interpreter: x / 0 is +-inf or nan, not ZeroDivisionError, and a loop with a division vectorises:
the Python model tests every divisor) and fastmath flags reassoc, nsz, contract
and arcp (never nnan/ninf: -inf is the identity of max and the value of masked elements), so
sums vectorise; max and min reductions, which LLVM vectorises only under nnan, run LANES
columns per iteration into as many accumulators (softmax's row max: 4.2 -> 3.4 us a tile);
float32 exp is `exp32` below, a branch-free polynomial that LLVM inlines and vectorises
(within 1 ulp of exp over the whole float32 range, subnormals and inf included; a 32x128
softmax tile took 4.3 us with it against 13 us with math.exp's scalar expf), and float32 tanh
`tanh32`, a rational function that vectorises likewise (within 6 ulps; a user's 64x768 GELU
tile took 834 us with math.tanh's scalar tanhf, 31 us with it: bench/test_isa.py -k user_tile).

Sources are written to the cache directory (`PTO_GPU_CACHE`, else ~/.cache/pto_gpu/isa) under a
hash of the generated text, which is a function of the inlined function's content and of
GENERATOR_VERSION (in the header), so `@njit(cache=True)` reuses compiled code across processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

# numba's np.dot calls SciPy's own OpenBLAS, loaded lazily at its first call; load it now, so
# that the parallel executor's threadpool_limits(1), applied to the libraries loaded when a run
# starts, holds it to one thread too (else 2 workers x 2 BLAS threads on 2 cores).
import scipy.linalg.cython_blas  # noqa: F401
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.extending import intrinsic

from ..dtypes import DataType
from ..generated import cache_dir, load_source
from ..native_abi import entry_source
from .describe import describe
from .errors import ISAError
from .ir import Call, For, Function, If, Module, Op, Predicate, Return, Statement, walk
from .ops import OPCODES, Form, OpSpec
from .verify import verify_module

GENERATOR_VERSION = 9
_IEEE = "error_model='numpy'"  # division as the interpreter's: see the module docstring
LANES = 8  # columns per iteration of a column loop that holds a max or min reduction

_HALF = (DataType.FLOAT16, DataType.BFLOAT16)
_PYTHON_COMPARE = {Predicate.LT: "<", Predicate.LE: "<=", Predicate.GT: ">", Predicate.GE: ">=",
                   Predicate.EQ: "==", Predicate.NE: "!="}
_ROW_LOCAL = frozenset({Form.LOAD, Form.STORE, Form.UNARY, Form.CONVERT, Form.BINARY, Form.TILE_SCALAR,
                        Form.ROW_REDUCE, Form.ROW_EXPAND, Form.COL_EXPAND, Form.MASK, Form.GENERATE})
FASTMATH = ("reassoc", "nsz", "contract", "arcp")  # the generated function's (module docstring)
_FASTMATH = "{" + ", ".join(repr(flag) for flag in FASTMATH) + "}"  # as the generated text spells it


@intrinsic
def _float32_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _fma32(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma): an operation of its own, which fastmath's
    reassociation leaves whole."""
    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@njit
def exp32(value):
    """exp in float32, branch-free so that it vectorises: Cody-Waite reduction by ln 2 in two
    fused multiply-adds and the Cephes expf polynomial; 2**n is applied as 2**(n - m) (a
    select, 1 when n is in range) and then 2**m, m = n clamped to float32's normal exponents,
    so that n from -150 to 128 needs no special case (underflow to subnormals and zero,
    overflow to inf). The select matters: the generated code's fastmath reassociates a plain
    product of the two factors into 2**n, which overflows for n = 128 (exp(88.4) was inf
    there). The reduction's steps are FMAs because reassociation merged them as plain
    products and sums (4.5 ulps off at 88.7); done in float64 instead it halved the vector
    width: 34 us for 64 x 768 elements, 20 us now, numpy's 19."""
    x = np.float32(value)
    t = min(max(x, np.float32(-104.0)), np.float32(88.8))
    n = np.floor(t * np.float32(1.4426950408889634) + np.float32(0.5))
    t = _fma32(-n, np.float32(0.693359375), t)  # ln 2 to 9 bits: this step is exact
    t = _fma32(-n, np.float32(-2.12194440e-4), t)  # the rest of ln 2
    y = np.float32(1.9875691500e-4)
    y = y * t + np.float32(1.3981999507e-3)
    y = y * t + np.float32(8.3334519073e-3)
    y = y * t + np.float32(4.1665795894e-2)
    y = y * t + np.float32(1.6666665459e-1)
    y = y * t + np.float32(5.0000001201e-1)
    y = y * (t * t) + t + np.float32(1.0)
    power = np.int32(n)
    normal = min(max(power, np.int32(-126)), np.int32(127))
    y = y if power == normal else y * _float32_from_bits((power - normal + np.int32(127)) << np.int32(23))
    y = y * _float32_from_bits((normal + np.int32(127)) << np.int32(23))
    return x if x != x else y


@njit
def tanh32(value):
    """tanh in float32, branch-free so that it vectorises: Eigen's rational approximation (odd
    numerator of degree 13, even denominator of degree 6 in x clamped to +-7.9), x itself
    where |x| < 4e-4 (and for nan), +-1 from |x| >= 9, where float32's tanh is; within 6 ulps
    of the correctly rounded value over the whole float32 range."""
    x = np.float32(value)
    c = min(max(x, np.float32(-7.90531110763549805)), np.float32(7.90531110763549805))
    c2 = c * c
    p = c2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = c2 * p + np.float32(-8.60467152213735e-11)
    p = c2 * p + np.float32(5.12229709037114e-08)
    p = c2 * p + np.float32(1.48572235717979e-05)
    p = c2 * p + np.float32(6.37261928875436e-04)
    p = c2 * p + np.float32(4.89352455891786e-03)
    q = c2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = c2 * q + np.float32(2.26843463243900e-03)
    q = c2 * q + np.float32(4.89352518554385e-03)
    y = c * p / q
    if abs(x) >= np.float32(9.0):
        y = np.float32(1.0) if x > 0 else np.float32(-1.0)
    return x if abs(x) < np.float32(4e-4) or x != x else y


def _compute_type(dtype: DataType) -> str:
    """The numpy type generated code computes a dtype in."""
    return "np.float32" if dtype in _HALF else f"np.{dtype.numpy.name}"


def _compute_itemsize(dtype: DataType) -> int:
    """The bytes of an element of a memref of `dtype` in generated code (a half-precision one
    arrives as a float32 copy)."""
    return 4 if dtype in _HALF else dtype.numpy.itemsize


def _scalar_type(dtype: DataType) -> str:
    return "np.int64" if dtype.numpy.kind in "iu" else _compute_type(dtype)


def _element(spec: OpSpec, dtype: DataType, **operands: str) -> str:
    """The instruction's per-element CPU template, with float32 exp and tanh vectorisable."""
    text = spec.cpu.format(**operands)
    if _compute_type(dtype) != "np.float32":
        return text
    return text.replace("math.exp(", "exp32(").replace("math.tanh(", "tanh32(")


def _literal(value: float | int) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "math.inf" if value > 0 else "-math.inf"
    if isinstance(value, float) and math.isnan(value):
        return "math.nan"
    return repr(value)


@dataclasses.dataclass(frozen=True)
class _TileVar:
    ident: str
    rows: int
    cols: int
    dtype: DataType


@dataclasses.dataclass
class _Scope:
    """One inlined instance of a function: its names mapped to generated identifiers."""

    function: Function
    number: int
    memrefs: dict[str, str]  # name -> identifier
    roots: dict[str, str]  # name -> identifier of the kernel memref it is a view of
    return_flag: str | None = None  # inlined callees that RETURN leave through this flag
    loop_depth: int = 0

    def tile(self, name: str) -> str:
        return f"t{self.number}_{name}"

    def scalar(self, name: str) -> str:
        return f"s{self.number}_{name}"

    def index(self, value) -> str:
        return self.scalar(value) if isinstance(value, str) else repr(int(value))

    def value(self, value) -> str:
        return self.scalar(value) if isinstance(value, str) else _literal(value)


@dataclasses.dataclass
class _RowOp:
    """One row-local instruction, lowered: what one row of it does and what it touches."""

    rows: str  # the variable (or literal) bounding its rows
    cols: str  # ... and its columns
    decl_rows: int  # the declared rows of the tiles it iterates
    body: list[str]  # inside the column loop, for row _r and column _c
    before: list[str] = dataclasses.field(default_factory=list)  # in the row, before the column loop
    after: list[str] = dataclasses.field(default_factory=list)  # in the row, after the column loop
    reads: frozenset = frozenset()  # tiles read at (_r, _c)
    writes: frozenset = frozenset()  # tiles written at (_r, _c)
    row_reads: frozenset = frozenset()  # tiles read at (_r, 0) before the column loop
    row_writes: frozenset = frozenset()  # tiles written at (_r, 0) after the column loop
    load: bool = False
    store_root: str | None = None
    # A row reduction: its accumulator and its combine template over {acc} and {x}
    reduction: tuple[str, str] | None = None


@dataclasses.dataclass
class _Group:
    decl_rows: int
    segments: list[list[_RowOp]]

    def ops(self):
        return [op for segment in self.segments for op in segment]


class _Generator:
    def __init__(self, module: Module, function: Function):
        self.module, self.function = module, function
        self.prologue: list[str] = []  # tile and scratch allocations, local initialisations
        self.lines: list[str] = []
        self.depth = 1
        self.counter = 0
        self.instances = 0
        self.tiles: dict[str, _TileVar] = {}
        self.region: dict[str, tuple[str, str]] = {}  # tile identifier -> (rows var, cols var)
        self.group: _Group | None = None
        self.stored_roots: set[str] = set()

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"_{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    # declarations

    def instance(self, function: Function, memrefs: dict[str, str], roots: dict[str, str]) -> _Scope:
        scope = _Scope(function, self.instances, memrefs, roots)
        self.instances += 1
        for tile in function.tiles:
            ident = scope.tile(tile.name)
            self.tiles[ident] = _TileVar(ident, tile.rows, tile.cols, tile.dtype)
            shape = f"({tile.rows}, {tile.cols})"
            # Uninitialised: a tile's region starts empty, so a correct program never reads it.
            self.prologue.append(f"{ident} = np.empty({shape}, {_compute_type(tile.dtype)})")
            self.prologue.append(f"_vr_{ident} = 0")
            self.prologue.append(f"_vc_{ident} = 0")
            self.region[ident] = ("0", "0")  # nothing is defined before a write
        for scalar in function.scalars:
            if not scalar.param:
                self.prologue.append(f"{scope.scalar(scalar.name)} = {_scalar_type(scalar.dtype)}(0)")
        for loop in _loops(function.body):
            self.prologue.append(f"{scope.scalar(loop.var)} = 0")
        return scope

    # the function

    def source(self) -> str:
        f = self.function
        params = [s for s in f.scalars if s.param]
        memrefs = {m.name: f"m0_{m.name}" for m in f.memrefs}
        scope = self.instance(f, memrefs, dict(memrefs))
        for scalar in params:
            cast = _scalar_type(scalar.dtype)
            self.prologue.append(f"{scope.scalar(scalar.name)} = {cast}(p_{scalar.name})")
        self.block(scope, f.body)
        self.flush()
        arguments = [memrefs[m.name] for m in f.memrefs] + [f"p_{s.name}" for s in params]
        # The body twice: once where every memref's elements are adjacent within a row, which the
        # branch tells LLVM, so that the loops over columns vectorise on the strided views tasks
        # get (a 64 KB tile copy 12 -> 5 us; fused softmax 1.8x -> 1.1x numpy), and once for any
        # strides. The branch is a property of the tensors, so every path takes the same one.
        # (Written out twice: numba cannot inline a call with as many arguments as a large kernel
        # has, which Python passes as one tuple.)
        unit = " and ".join(f"{memrefs[m.name]}.strides[1] == {_compute_itemsize(m.dtype)}"
                            for m in f.memrefs) or "True"
        body = ["    " + line for line in self.prologue] + self.lines + ["    return"]
        text = [f"# PTO ISA CPU code generator v{GENERATOR_VERSION}: InCore function @{f.name}",
                "import math", "", "import numpy as np", "from numba import njit, types", "",
                "from pto_gpu.isa.cpu_codegen import exp32, tanh32", "", "",
                f"@njit({self.signature(2)}, cache=True, nogil=True, fastmath={_FASTMATH}, {_IEEE})",
                f"def kernel({', '.join(arguments)}):",
                f"    if {unit}:"]
        text += ["    " + line for line in body] + ["    else:"] + ["    " + line for line in body]
        # Batched: every memref 3-d, the function once per leading index; a memref whose
        # leading dim is 1 is the same window for every index.
        leading = [f"{memrefs[m.name]}.shape[0]" for m in f.memrefs]
        count = leading[0] if len(leading) == 1 else f"max({', '.join(leading)})"
        windows = [f"{memrefs[m.name]}[_b % {memrefs[m.name]}.shape[0]]" for m in f.memrefs]
        text += ["", "", f"@njit({self.signature(3)}, cache=True, nogil=True, {_IEEE})",
                 f"def batched({', '.join(arguments)}):",
                 f"    for _b in range({count}):",
                 f"        kernel({', '.join(windows + arguments[len(windows):])})"]
        return "\n".join(text) + "\n"

    def signature(self, ndim: int) -> str:
        """The one numba signature of the generated function (`ndim`: 3 for `batched`): every
        memref an array of any layout ('A'), read-only where the function only loads it, every
        scalar param int64 or float64. Contiguous views convert to it, so the Python path and
        native workers (pto_gpu/native_abi.py), whose views are strided, run the same machine code: a
        specialisation per numba layout vectorises differently, and under fastmath's
        reassociation that changes the last bits of sums (the unit-stride branch `source` adds
        depends on the strides alone, which a tensor has on either path)."""
        f = self.function
        memrefs = [f"types.Array(types.{_compute_type(m.dtype)[3:]}, {ndim}, 'A', "
                   f"readonly={f'm0_{m.name}' not in self.stored_roots})" for m in f.memrefs]
        scalars = ["types.int64" if s.dtype.numpy.kind in "iu" else "types.float64"
                   for s in f.scalars if s.param]
        return f"types.void({', '.join(memrefs + scalars)})"

    # statements

    def block(self, scope: _Scope, body: tuple[Statement, ...]) -> None:
        for statement in body:
            if isinstance(statement, Op):
                self.op(scope, statement)
                continue
            self.flush()
            self.settle()
            if isinstance(statement, For):
                self.loop(scope, statement)
            elif isinstance(statement, If):
                self.branch(scope, statement)
            elif isinstance(statement, Call):
                self.call(scope, statement)
            elif isinstance(statement, Return):
                self.ret(scope)
            else:
                raise ISAError(f"@{scope.function.name}: {statement!r} is not a statement")
        self.flush()

    def settle(self) -> None:
        """Put every tile's valid region in its canonical variables (before control flow joins)."""
        for ident, (rows, cols) in self.region.items():
            if rows != f"_vr_{ident}":
                self.emit(f"_vr_{ident} = {rows}")
            if cols != f"_vc_{ident}":
                self.emit(f"_vc_{ident} = {cols}")
            self.region[ident] = (f"_vr_{ident}", f"_vc_{ident}")

    def nested(self, scope: _Scope, body: tuple[Statement, ...]) -> None:
        self.depth += 1
        start = len(self.lines)
        self.block(scope, body)
        self.settle()
        if len(self.lines) == start:
            self.emit("pass")
        self.depth -= 1

    def loop(self, scope: _Scope, loop: For) -> None:
        bounds = ", ".join(scope.index(v) for v in (loop.start, loop.stop, loop.step))
        self.emit(f"for {scope.scalar(loop.var)} in range({bounds}):")
        scope.loop_depth += 1
        self.nested(scope, loop.body)
        scope.loop_depth -= 1
        if scope.return_flag is not None and _returns(loop.body):
            self.emit(f"if {scope.return_flag}:")
            self.emit("    break")

    def branch(self, scope: _Scope, branch: If) -> None:
        compare = _PYTHON_COMPARE[branch.predicate]
        self.emit(f"if {scope.index(branch.lhs)} {compare} {scope.index(branch.rhs)}:")
        self.nested(scope, branch.then_body)
        if branch.else_body:
            self.emit("else:")
            self.nested(scope, branch.else_body)

    def ret(self, scope: _Scope) -> None:
        if scope.return_flag is None:
            self.emit("return")
        elif scope.loop_depth:
            self.emit(f"{scope.return_flag} = True")
            self.emit("break")
        else:
            self.emit("break")

    def call(self, scope: _Scope, call: Call) -> None:
        callee = self.module.functions.get(call.callee)
        if callee is None or not callee.in_core:
            raise ISAError(f"@{scope.function.name}: {describe(call)}: @{call.callee} is not an InCore "
                           "function of the module")
        memrefs, roots = {}, {}
        for param, arg in call.args:
            ident = f"m{self.instances}_{param}"
            source = scope.memrefs[arg.tensor]
            rows, cols = callee.memref(param).shape  # a memref is a window of at most its shape
            if arg.windowed:
                row = f"{scope.index(arg.row)} * {rows}"
                col = f"{scope.index(arg.col)} * {cols}"
                self.emit(f"{ident} = {source}[{row}:{row} + {rows}, {col}:{col} + {cols}]")
            else:
                self.emit(f"{ident} = {source}[:{rows}, :{cols}]")
            memrefs[param], roots[param] = ident, scope.roots[arg.tensor]
        inner = self.instance(callee, memrefs, roots)
        for param, value in call.scalars:
            cast = _scalar_type(callee.scalar(param).dtype)
            self.emit(f"{inner.scalar(param)} = {cast}({scope.value(value)})")
        if not _returns(callee.body):
            self.block(inner, callee.body)
            return
        inner.return_flag = self.fresh("returned")
        self.emit(f"{inner.return_flag} = False")
        self.emit("while True:")
        self.depth += 1
        self.block(inner, callee.body)
        self.emit("break")
        self.depth -= 1
        # The callee's tiles are never read after the call; their region variables may be unset
        # on the paths that returned, so nothing may refer to them.
        for ident in self.tiles:
            if ident.startswith(f"t{inner.number}_"):
                self.region[ident] = ("0", "0")

    # instructions

    def op(self, scope: _Scope, op: Op) -> None:
        spec = OPCODES.get(op.opcode)
        if spec is None:
            raise ISAError(f"@{scope.function.name}: {describe(op)}: unknown instruction")
        if spec.form in _ROW_LOCAL:
            self.row_op(self.lower(scope, op, spec))
            return
        self.flush()
        if spec.form is Form.MATMUL:
            self.matmul(scope, op, spec)
        elif spec.form is Form.COL_REDUCE:
            self.col_reduce(scope, op, spec)
        elif spec.form is Form.TRANSPOSE:
            dst, a = self.tiles[scope.tile(op.dst)], self.tiles[scope.tile(op.srcs[0])]
            rows, cols = self.region[a.ident]
            self.emit(f"for _r in range({rows}):")
            self.emit(f"    for _c in range({cols}):")
            self.emit(f"        {dst.ident}[_c, _r] = {a.ident}[_r, _c]")
            self.region[dst.ident] = (cols, rows)
        elif spec.form is Form.SCALAR:
            self.scalar_op(scope, op, spec)
        elif spec.form is Form.COMPARE:
            a, b, predicate = op.srcs
            dtype = scope.function.scalar(op.dst).dtype
            self.emit(f"{scope.scalar(op.dst)} = {_scalar_type(dtype)}(1 if {scope.value(a)} "
                      f"{_PYTHON_COMPARE[predicate]} {scope.value(b)} else 0)")
        elif spec.form is Form.DIM:  # a memref window's size (the batch index is not an axis)
            memref, axis = op.srcs
            dtype = _scalar_type(scope.function.scalar(op.dst).dtype)
            self.emit(f"{scope.scalar(op.dst)} = {dtype}({scope.memrefs[memref]}.shape[{axis}])")
        else:
            raise ISAError(f"@{scope.function.name}: {describe(op)}: no CPU rule for form {spec.form.name}")

    def scalar_op(self, scope: _Scope, op: Op, spec: OpSpec) -> None:
        dtype = _scalar_type(scope.function.scalar(op.dst).dtype)
        if spec.reference is None:  # SLI: load an immediate
            value = _literal(op.srcs[0])
        else:
            value = spec.cpu.format(a=scope.value(op.srcs[0]), b=scope.value(op.srcs[1]))
        self.emit(f"{scope.scalar(op.dst)} = {dtype}({value})")

    def constant(self, dtype: DataType, value: str) -> str:
        """A value hoisted before the group, in the compute type of `dtype`."""
        ident = self.fresh("k")
        self.emit(f"{ident} = {_compute_type(dtype)}({value})")
        return ident

    def lower(self, scope: _Scope, op: Op, spec: OpSpec) -> _RowOp:
        """A row-local instruction as one row of work, its valid region computed (here, before the
        group's loop: regions depend only on shapes, scalars and other regions)."""
        form, srcs = spec.form, op.srcs
        if form is Form.LOAD:
            tile, memref = self.tiles[scope.tile(op.dst)], scope.memrefs[srcs[0]]
            row, col = scope.index(srcs[1]), scope.index(srcs[2])
            rows, cols = self.fresh("v"), self.fresh("v")
            self.emit(f"{rows} = min({tile.rows}, max(0, {memref}.shape[0] - {row}))")
            self.emit(f"{cols} = min({tile.cols}, max(0, {memref}.shape[1] - {col}))")
            self.region[tile.ident] = (rows, cols)
            return _RowOp(rows, cols, tile.rows, [f"{tile.ident}[_r, _c] = {memref}[{row} + _r, {col} + _c]"],
                          writes=frozenset({tile.ident}), load=True)
        if form is Form.STORE:
            tile, memref = self.tiles[scope.tile(srcs[0])], scope.memrefs[op.dst]
            row, col = scope.index(srcs[1]), scope.index(srcs[2])
            valid_rows, valid_cols = self.region[tile.ident]
            rows, cols = self.fresh("v"), self.fresh("v")
            self.emit(f"{rows} = min({valid_rows}, max(0, {memref}.shape[0] - {row}))")
            self.emit(f"{cols} = min({valid_cols}, max(0, {memref}.shape[1] - {col}))")
            self.stored_roots.add(scope.roots[op.dst])
            return _RowOp(rows, cols, tile.rows, [f"{memref}[{row} + _r, {col} + _c] = {tile.ident}[_r, _c]"],
                          reads=frozenset({tile.ident}), store_root=scope.roots[op.dst])
        if form is Form.GENERATE:  # the whole tile, from a scalar and each element's (row, col)
            dst = self.tiles[scope.tile(op.dst)]
            s = self.constant(dst.dtype, scope.value(srcs[0]))
            value = _element(spec, dst.dtype, s=s, r="_r", c="_c")
            self.region[dst.ident] = (str(dst.rows), str(dst.cols))
            return _RowOp(str(dst.rows), str(dst.cols), dst.rows, [f"{dst.ident}[_r, _c] = {value}"],
                          writes=frozenset({dst.ident}))
        dst, a = self.tiles[scope.tile(op.dst)], self.tiles[scope.tile(srcs[0])]
        rows, cols = self.region[a.ident]
        element = f"{a.ident}[_r, _c]"
        lowered = _RowOp(rows, cols, a.rows, [], reads=frozenset({a.ident}), writes=frozenset({dst.ident}))
        target = f"{dst.ident}[_r, _c] = "
        if form in (Form.UNARY, Form.CONVERT):  # CONVERT: the assignment rounds into dst's type
            lowered.body.append(target + _element(spec, a.dtype, a=element))
        elif form is Form.BINARY:
            b = scope.tile(srcs[1])
            lowered.body.append(target + _element(spec, a.dtype, a=element, b=f"{b}[_r, _c]"))
            lowered.reads |= {b}
        elif form is Form.TILE_SCALAR:
            s = self.constant(a.dtype, scope.value(srcs[1]))
            lowered.body.append(target + _element(spec, a.dtype, a=element, s=s))
        elif form is Form.ROW_EXPAND:
            b, value = scope.tile(srcs[1]), self.fresh("b")
            lowered.before.append(f"{value} = {b}[_r, 0]")
            lowered.body.append(target + _element(spec, a.dtype, a=element, b=value))
            lowered.row_reads = frozenset({b})
        elif form is Form.COL_EXPAND:
            b = scope.tile(srcs[1])
            lowered.body.append(target + _element(spec, a.dtype, a=element, b=f"{b}[0, _c]"))
            lowered.reads |= {b}  # so a row reduction earlier in the segment is not fused past it
        elif form is Form.MASK:
            row, col = scope.index(srcs[1]), scope.index(srcs[2])
            minus_inf = self.constant(a.dtype, "-math.inf")
            keep = f"_c + {col} <= _r + {row}"
            lowered.body.append(f"{target}{element} if {keep} else {minus_inf}")
        elif form is Form.ROW_REDUCE:
            identity, acc = self.constant(a.dtype, _literal(spec.identity)), self.fresh("acc")
            lowered.before.append(f"{acc} = {identity}")
            lowered.body.append(f"{acc} = {_element(spec, a.dtype, acc=acc, x=element)}")
            lowered.reduction = (acc, spec.cpu)
            lowered.after.append(f"{dst.ident}[_r, 0] = {acc}")
            lowered.writes, lowered.row_writes = frozenset(), frozenset({dst.ident})
            self.region[dst.ident] = (rows, "1")
            return lowered
        self.region[dst.ident] = (rows, cols)
        return lowered

    def row_op(self, op: _RowOp) -> None:
        group = self.group
        if group is not None and _joins_group(group, op):
            segment = group.segments[-1]
            if _joins_segment(segment, op):
                segment.append(op)
            else:
                group.segments.append([op])
            return
        self.flush()
        self.group = _Group(op.decl_rows, [[op]])

    def flush(self) -> None:
        group, self.group = self.group, None
        if group is None:
            return
        bounds = {segment[0].rows for segment in group.segments}
        shared = bounds.pop() if len(bounds) == 1 else None
        self.emit(f"for _r in range({shared or group.decl_rows}):")
        self.depth += 1
        for segment in group.segments:
            rows = segment[0].rows
            guarded = shared is None and rows != str(group.decl_rows)
            if guarded:
                self.emit(f"if _r < {rows}:")
                self.depth += 1
            for op in segment:
                for line in op.before:
                    self.emit(line)
            self.columns(segment)
            for op in segment:
                for line in op.after:
                    self.emit(line)
            if guarded:
                self.depth -= 1
        self.depth -= 1

    def columns(self, segment: list[_RowOp]) -> None:
        """A segment's column loop. With a max or min reduction in it (which LLVM vectorises only
        under nnan, which the generator does not use: see the top), LANES columns per iteration,
        each reduction keeping a accumulator per lane, combined after; then the remainder."""
        cols = segment[0].cols
        body = [line for op in segment for line in op.body]
        reductions = [op.reduction for op in segment if op.reduction]
        if not any(combine.startswith(("max(", "min(")) for _, combine in reductions):
            self.emit(f"for _c in range({cols}):")
            for line in body:
                self.emit("    " + line)
            return
        whole = self.fresh("w")
        self.emit(f"{whole} = {cols} - {cols} % {LANES}")
        lanes = {acc: [acc] + [f"{acc}_{lane}" for lane in range(1, LANES)] for acc, _ in reductions}
        for acc, names in lanes.items():
            for name in names[1:]:
                self.emit(f"{name} = {acc}")  # the identity, set just before
        self.emit(f"for _c8 in range(0, {whole}, {LANES}):")
        for lane in range(LANES):
            for line in body:
                line = re.sub(r"\b_c\b", f"(_c8 + {lane})", line)
                for acc, names in lanes.items():
                    line = re.sub(rf"\b{acc}\b", names[lane], line)
                self.emit("    " + line)
        for acc, combine in reductions:
            for name in lanes[acc][1:]:
                self.emit(f"{acc} = {combine.format(acc=acc, x=name)}")
        self.emit(f"for _c in range({whole}, {cols}):")
        for line in body:
            self.emit("    " + line)

    def col_reduce(self, scope: _Scope, op: Op, spec: OpSpec) -> None:
        dst, a = self.tiles[scope.tile(op.dst)], self.tiles[scope.tile(op.srcs[0])]
        rows, cols = self.region[a.ident]
        acc = self.fresh("acc")
        self.prologue.append(f"{acc} = np.empty({a.cols}, {_compute_type(a.dtype)})")
        identity = self.constant(a.dtype, _literal(spec.identity))
        self.emit(f"for _c in range({cols}):")
        self.emit(f"    {acc}[_c] = {identity}")
        self.emit(f"for _r in range({rows}):")
        self.emit(f"    for _c in range({cols}):")
        self.emit(f"        {acc}[_c] = {_element(spec, a.dtype, acc=f'{acc}[_c]', x=f'{a.ident}[_r, _c]')}")
        self.emit(f"for _c in range({cols}):")
        self.emit(f"    {dst.ident}[0, _c] = {acc}[_c]")
        self.region[dst.ident] = ("1", cols)

    def matmul(self, scope: _Scope, op: Op, spec: OpSpec) -> None:
        """BLAS (numba's np.dot, through scipy). Whole tiles, dst neither a nor b: straight into
        dst (TMATMUL) or added to it (TMATMUL_ACC); otherwise on contiguous copies of the valid
        regions, the product then written or added into dst's region."""
        dst, a, b = (self.tiles[scope.tile(name)] for name in (op.dst, *op.srcs))
        a_rows, inner = self.region[a.ident]
        rows, cols = self.region[dst.ident] if spec.accumulate else (a_rows, self.region[b.ident][1])
        product = self.fresh("mm")
        update = "+=" if spec.accumulate else "="
        general = [f"{product} = np.dot(np.ascontiguousarray({a.ident}[:{rows}, :{inner}]), "
                   f"np.ascontiguousarray({b.ident}[:{inner}, :{cols}]))",
                   f"for _i in range({rows}):",
                   f"    for _j in range({cols}):",
                   f"        {dst.ident}[_i, _j] {update} {product}[_i, _j]"]
        if dst.ident in (a.ident, b.ident):
            lines = general
        else:
            whole = f"{dst.ident} += np.dot({a.ident}, {b.ident})" if spec.accumulate else \
                f"np.dot({a.ident}, {b.ident}, {dst.ident})"
            lines = [f"if {rows} == {dst.rows} and {cols} == {dst.cols} and {inner} == {a.cols}:",
                     f"    {whole}", "else:", *("    " + line for line in general)]
        for line in lines:
            self.emit(line)
        self.region[dst.ident] = (rows, cols)


def _joins_group(group: _Group, op: _RowOp) -> bool:
    ops = group.ops()
    if op.decl_rows != group.decl_rows:
        return False
    if op.load and any(o.store_root for o in ops):
        return False
    return not (op.store_root and any(o.load or o.store_root == op.store_root for o in ops))


def _joins_segment(segment: list[_RowOp], op: _RowOp) -> bool:
    first = segment[0]
    if (op.rows, op.cols) != (first.rows, first.cols):
        return False
    written = set().union(*(o.writes for o in segment))
    reduced = set().union(*(o.row_writes for o in segment))
    touched = op.reads | op.writes | op.row_reads | op.row_writes
    return not (op.row_reads & written) and not (touched & reduced)


def _loops(body: tuple[Statement, ...]):
    return (statement for statement in walk(body) if isinstance(statement, For))


def _returns(body: tuple[Statement, ...]) -> bool:
    return any(isinstance(statement, Return) for statement in walk(body))


def _generate(module: Module, name: str) -> tuple[_Generator, str]:
    verify_module(module)  # as the interpreter and the CUDA generator do: one notion of valid
    function = module.functions.get(name)
    if function is None or not function.in_core:
        raise ISAError(f"module {module.name}: @{name} is not an InCore function")
    if function.library is not None:
        raise ISAError(f"@{name} is the library kernel {function.library}, generated per call size by it")
    generator = _Generator(module, function)
    return generator, generator.source()


def cpu_source(module: Module, name: str) -> str:
    """The generated Python source of InCore function `name` (its callees inlined)."""
    return _generate(module, name)[1]


def _on_float32(kernel: Callable, half: list[int], stored: list[int]) -> Callable:
    """numba has no half types: run `kernel` on float32 copies of the half-precision memrefs (at
    positions `half`), then copy the stored ones back."""
    def run(*args):
        copies = list(args)
        for index in half:
            copies[index] = args[index].astype(np.float32)
        kernel(*copies)
        for index in stored:
            args[index][...] = copies[index]

    return run


def cpu_function(module: Module, name: str, directory: Path | None = None, batched: bool = False) -> Callable:
    """The generated function for InCore function `name`, imported from the cache directory.
    `batched`: the entry that takes every memref 3-d and runs the function once per leading
    index (a leading dim of 1 is shared by every index)."""
    generator, source = _generate(module, name)
    memrefs = generator.function.memrefs
    half = [i for i, m in enumerate(memrefs) if m.dtype in _HALF]
    stored = [i for i in half if f"m0_{memrefs[i].name}" in generator.stored_roots]
    directory = cache_dir() if directory is None else Path(directory)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = directory / f"isa_{digest}.py"
    generated = load_source(path, source, digest)
    kernel = generated.batched if batched else generated.kernel
    return _on_float32(kernel, half, stored) if half else kernel


def native_entry(module: Module, name: str, directory: Path | None = None,
                 batched: bool = False) -> int | None:
    """The address of the native entry (pto_gpu/native_abi.py) of InCore function `name`'s generated
    function (its `batched` one), or None where there is none: numba has no half types, so
    those kernels run through the float32 copies of `cpu_function`. Written beside the
    function's module, in a module of its own: only runs with native workers compile it."""
    generator, source = _generate(module, name)
    function = generator.function
    if any(m.dtype in _HALF for m in function.memrefs):
        return None
    directory = cache_dir() if directory is None else Path(directory)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = directory / f"isa_{digest}.py"
    load_source(path, source, digest)  # the entry imports it by name
    view = "tensor3" if batched else "tensor2"
    arguments = [f"{view}(descs, {i}, {_compute_type(m.dtype)})" for i, m in enumerate(function.memrefs)]
    scalars = [s for s in function.scalars if s.param]
    arguments += [f"{'int' if s.dtype.numpy.kind in 'iu' else 'float'}_scalar(kinds, ints, floats, {k})"
                  for k, s in enumerate(scalars)]
    text = [f"# PTO ISA CPU code generator v{GENERATOR_VERSION}: the native entry of @{function.name}",
            "import numpy as np", "from numba import cfunc", "",
            "from pto_gpu.native_abi import ENTRY, RAISED, float_scalar, int_scalar, tensor2, tensor3",
            f"from pto_gpu_isa_{digest} import {'batched' if batched else 'kernel'} as run", "", "",
            "@cfunc(ENTRY, cache=True)", *entry_source(arguments)]
    entry_text = "\n".join(text)
    entry_digest = hashlib.sha256(entry_text.encode()).hexdigest()[:24]
    entry_path = directory / f"isa_{entry_digest}.py"
    generated = load_source(entry_path, entry_text, entry_digest)
    return generated.entry.address
