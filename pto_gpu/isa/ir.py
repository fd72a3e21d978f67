"""The PTO ISA's intermediate representation: plain, immutable data (spec 003 §1).

A Module holds Functions by name. A Function is InCore (tile work on one core) or an
Orchestration (control flow plus CALLs that become tasks). It declares memrefs (tensors in
global memory: a dtype and, for InCore functions, a 2-d shape), tiles (rows x cols of a
dtype, in core-local memory) and scalars, then has a body of statements:

    Op      one instruction of the opcode table (ops.py): opcode, destination, sources
    For     a counted loop over a scalar variable; start/stop/step are ints or scalar names
    If      a branch on `lhs predicate rhs` over ints and scalar names
    Call    a call of another function: InCore callees are inlined into InCore callers and
            are tasks when an Orchestration calls them; each argument is a whole tensor or a
            window (CallArg)
    Return  leaves the function

An Orchestration may also declare local tensors (`Function.tensors`), each bound by one of

    Alloc   a heap tensor of the given dims, freed by the compiler after its last use
    View    a slice of a tensor, per dim `start:stop` or whole
    Split   (rows, n*c) seen as (n, rows, c): the per-head view of a projection

An InCore function with a `library` has no body: it is a kernel of the library (a pto.Kernel
named by its import path, such as `pto_gpu.kernels.tiles.matmul`), its memrefs unshaped and
with the directions it declares.

Operands are names (of a tile, memref or scalar) or numbers. Statements compare by value,
so two modules built the same way are equal, name for name.
"""

from __future__ import annotations

import dataclasses
import enum

from ..dtypes import DataType
from .errors import ISAError


class FunctionKind(enum.Enum):
    INCORE = "InCore"
    ORCHESTRATION = "Orchestration"


class Direction(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    INOUT = "inout"


class Predicate(enum.Enum):
    """Comparisons of SCMP and IF, by their `.pto` spelling."""

    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"


Operand = str | int | float  # a declared name, or an immediate number
Index = str | int  # an integer immediate or the name of an integer scalar / loop variable


@dataclasses.dataclass(frozen=True)
class MemRef:
    """A tensor in global memory. `shape` (rows, cols) is the window an InCore function works
    on (a task may pass a smaller one: the tail); orchestration memrefs have none."""

    name: str
    dtype: DataType
    shape: tuple[int, int] | None = None
    direction: Direction | None = None  # declared by library functions; inferred for the others


@dataclasses.dataclass(frozen=True)
class Tile:
    """A rows x cols block in core-local memory."""

    name: str
    rows: int
    cols: int
    dtype: DataType


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A scalar: a parameter of the function (its value comes from the caller; for a kernel,
    after the memrefs), or a local that scalar instructions write. Loop variables are
    declared by their For, not here."""

    name: str
    dtype: DataType
    param: bool = True


@dataclasses.dataclass(frozen=True)
class Op:
    """One instruction: `opcode` names its entry in ops.OPCODES."""

    opcode: str
    dst: str
    srcs: tuple[Operand, ...] = ()


@dataclasses.dataclass(frozen=True)
class For:
    var: str
    start: Index
    stop: Index
    step: Index
    body: tuple[Statement, ...]
    max_range: int | None = None  # binary expansion (spec §2.5): the largest trip count
    min_range: int | None = None  # the smallest power-of-two block; fewer go to one residual loop
    tile_levels: tuple[tuple[int, int], ...] = ()  # (block size, tile rows), 0 for the residual
    rows: str | None = None  # with tile_levels: the scalar holding this iteration's tile rows


@dataclasses.dataclass(frozen=True)
class If:
    lhs: Index
    predicate: Predicate
    rhs: Index
    then_body: tuple[Statement, ...]
    else_body: tuple[Statement, ...] = ()


@dataclasses.dataclass(frozen=True)
class CallArg:
    """A tensor passed to a callee: `tensor` whole, or with `row`/`col` the window of the
    callee memref's shape at rows row*rows, cols col*cols (docs/DESIGN.md, "The PTO ISA compiler")."""

    tensor: str
    row: Index | None = None
    col: Index | None = None

    @property
    def windowed(self) -> bool:
        return self.row is not None


@dataclasses.dataclass(frozen=True)
class Call:
    callee: str
    args: tuple[tuple[str, CallArg], ...]  # (callee memref, the tensor bound to it)
    scalars: tuple[tuple[str, Operand], ...] = ()  # (callee scalar parameter, its value)


@dataclasses.dataclass(frozen=True)
class Return:
    pass


@dataclasses.dataclass(frozen=True)
class Alloc:
    """`dst` (a local tensor) = a new heap tensor of these dims, in dst's dtype. In a
    distributed run it belongs to the rank owning the first element of tensor `owner`, so the
    tasks that write it run there (None: the run's default owner, rank 0)."""

    dst: str
    shape: tuple[Index, ...]
    owner: str | None = None


@dataclasses.dataclass(frozen=True)
class View:
    """`dst` = `src` sliced: per dim, (start, stop) or None for the whole dim. A stop past the
    edge is cut at it (a tail); a start at or past it is an error at run time."""

    dst: str
    src: str
    slices: tuple[tuple[Index, Index] | None, ...]


@dataclasses.dataclass(frozen=True)
class Split:
    """`dst` = 2-d `src` (rows, groups*c) seen as (groups, rows, c), no copy."""

    dst: str
    src: str
    groups: Index


Statement = Op | For | If | Call | Return | Alloc | View | Split
TENSOR_STATEMENTS = (Alloc, View, Split)


def walk(body: tuple[Statement, ...]):
    """Every statement of `body`, those inside FOR and IF bodies included, in order (calls are
    not followed)."""
    for statement in body:
        yield statement
        if isinstance(statement, For):
            yield from walk(statement.body)
        elif isinstance(statement, If):
            yield from walk(statement.then_body)
            yield from walk(statement.else_body)


@dataclasses.dataclass(frozen=True)
class Function:
    name: str
    kind: FunctionKind
    memrefs: tuple[MemRef, ...]
    scalars: tuple[Scalar, ...]  # parameters (in call order), then locals
    tiles: tuple[Tile, ...]
    body: tuple[Statement, ...]
    tensors: tuple[MemRef, ...] = ()  # an Orchestration's local tensors (Alloc, View, Split)
    library: str | None = None  # an InCore function that is a library kernel: its import path
    # An InCore function that takes windows narrower than its memrefs (a column tail), and so
    # reads their width (SDIM) where it matters; without it a narrower window is refused.
    column_tails: bool = False
    # An InCore function of float32 memrefs whose products may run on tensor cores as TF32 in
    # its CUDA code (each operand rounded to 10 mantissa bits, float sums); else exact (FMA).
    tf32: bool = False

    @property
    def in_core(self) -> bool:
        return self.kind == FunctionKind.INCORE

    def memref(self, name: str) -> MemRef | None:
        """A memref parameter or local tensor by name."""
        return next((m for m in (*self.memrefs, *self.tensors) if m.name == name), None)

    def tile(self, name: str) -> Tile | None:
        return next((t for t in self.tiles if t.name == name), None)

    def scalar(self, name: str) -> Scalar | None:
        return next((s for s in self.scalars if s.name == name), None)


@dataclasses.dataclass
class Module:
    """Functions by name, in the order they were added (callees may come after callers)."""

    name: str
    functions: dict[str, Function] = dataclasses.field(default_factory=dict)

    def add(self, function: Function) -> Function:
        if function.name in self.functions:
            raise ISAError(f"module {self.name} already has a function @{function.name}")
        self.functions[function.name] = function
        return function

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Module) and self.name == other.name
                and list(self.functions.items()) == list(other.functions.items()))
