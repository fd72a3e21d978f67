"""What the two ways of running an Orchestration share, so that they cannot drift apart:
orchestrate.py walks the IR against the Python orchestrator, orchestration_codegen.py writes
numba code over pto_gpu.jit, and both take these decisions from here.

- **Frees.** A local tensor bound by an Alloc is freed right after the last statement of the
  block that allocates it which uses it or a view of it (`free_points`); the verifier keeps
  every use inside that block.
- **Binary expansion** (spec 003 §2.5). A loop with max_range runs its n iterations as blocks
  of max_range, max_range/2, ..., min_range iterations, one for each set bit of n rounded down
  to min_range, then a residual loop for the n mod min_range left (`expansion`, `block_count`):
  the same iterations in the same order as the plain loop.
- **Adaptive tiles** (§2.6). With tile_levels, the loop variable counts base tiles (the
  smallest rows among the levels); a level of R rows steps R/base of them at a time (its
  scale) and binds the loop's `rows` scalar to R. A CALL in that loop whose window rows are
  indexed by the variable runs the callee's variant for R rows: `<callee>_<R>` if the module
  defines it, else the callee with those windows and its tiles of their rows scaled
  (`variants`). A window's offset is index x the callee's rows either way, and its extent the
  variant's rows. Library kernels take any size, so calls to them pass views instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable, Mapping

from .dataflow import directions
from .describe import describe
from .errors import ISAError
from .ir import Alloc, Call, For, Function, If, Module, Op, Return, Split, Statement, Tile, View, walk
from .ops import OPCODES, Form


@dataclasses.dataclass(frozen=True)
class Level:
    """One level of a binary-expanded loop: `size` iterations in a block (0: the residual),
    taken `scale` at a time, each a tile of `rows` rows (None without tile_levels)."""

    size: int
    scale: int
    rows: int | None


def expansion(loop: For) -> tuple[Level, ...]:
    """The levels of a loop with max_range, largest block first, the residual last."""
    rows_of = dict(loop.tile_levels)
    base = min(rows_of.values(), default=None)

    def level(size: int) -> Level:
        rows = rows_of.get(size, base)
        return Level(size, 1 if base is None else rows // base, rows)

    sizes, size = [], loop.max_range
    while size >= (loop.min_range or 1):
        sizes.append(size)
        size //= 2
    return tuple(level(size) for size in (*sizes, 0))


def block_count(level: Level, trip_count: int, min_range: int | None) -> int:
    """How many iterations (base tiles) the block of `level` runs for a loop of `trip_count`."""
    residual = trip_count & ((min_range or 1) - 1)
    if level.size == 0:
        return residual
    return level.size if (trip_count - residual) & level.size else 0


def free_points(body: tuple[Statement, ...], roots: Mapping[str, str]) -> tuple[tuple[str, ...], ...]:
    """For each statement of a block, the tensors it allocates to free right after it."""
    last: dict[str, int] = {}
    for index, statement in enumerate(body):
        if isinstance(statement, Alloc):
            last[statement.dst] = index
        for name in _tensors_used(statement):
            root = roots.get(name, name)
            if root in last:
                last[root] = index
    points: list[list[str]] = [[] for _ in body]
    for name, index in last.items():
        points[index].append(name)
    return tuple(tuple(names) for names in points)


def _tensors_used(statement: Statement) -> Iterable[str]:
    for s in walk((statement,)):
        if isinstance(s, Call):
            yield from (arg.tensor for _, arg in s.args)
        elif isinstance(s, View | Split):
            yield s.src
        elif isinstance(s, Alloc) and s.owner is not None:
            yield s.owner
        elif isinstance(s, Op) and OPCODES[s.opcode].form is Form.DIM:
            yield s.srcs[0]


def scoped(function: Function) -> bool:
    """Whether an activation of `function` runs in a scope: when it allocates and can RETURN,
    so that the scope frees what the RETURN skipped past. free_points frees everything else,
    and a scope would hold an entry per allocation until it ends (compiled scopes hold at most
    SCOPE_CAPACITY)."""
    statements = list(walk(function.body))
    return any(isinstance(s, Alloc) for s in statements) and any(isinstance(s, Return) for s in statements)


def scaled_by(call: Call, adaptive: Container[str]) -> str | None:
    """The adaptive loop variable that indexes the rows of a window of `call`, if any (the
    verifier allows one)."""
    return next((arg.row for _, arg in call.args if arg.windowed and arg.row in adaptive), None)


def variant_name(callee: str, rows: int) -> str:
    return f"{callee}_{rows}"


def variants(module: Module) -> dict[str, Function]:
    """The variants the module's adaptive loops call that it does not define: name -> the
    callee scaled. Every call site of a callee in adaptive loops must window the same memrefs
    (one variant serves them all) with rows of the loop's base tile; variants the module
    defines are checked to take the callee's parameters at the scaled shapes."""
    made: dict[str, Function] = {}
    windowed_by: dict[str, frozenset[str]] = {}
    for function in module.functions.values():
        if not function.in_core:
            _collect(module, function.body, {}, made, windowed_by)
    return made


def _collect(module: Module, body: tuple[Statement, ...], loops: dict[str, For], made: dict[str, Function],
             windowed_by: dict[str, frozenset[str]]) -> None:
    for statement in body:
        if isinstance(statement, For):
            inner = {**loops, statement.var: statement} if statement.tile_levels else loops
            _collect(module, statement.body, inner, made, windowed_by)
        elif isinstance(statement, If):
            _collect(module, statement.then_body, loops, made, windowed_by)
            _collect(module, statement.else_body, loops, made, windowed_by)
        elif isinstance(statement, Call):
            var = scaled_by(statement, loops)
            callee = module.functions[statement.callee]
            if var is None or not callee.in_core:
                continue
            where = f"{describe(statement)} in the adaptive loop %{var}"
            windowed = frozenset(param for param, arg in statement.args if arg.windowed and arg.row == var)
            if windowed_by.setdefault(callee.name, windowed) != windowed:
                raise ISAError(f"{where}: another call of @{callee.name} in an adaptive loop windows "
                               f"{_names(windowed_by[callee.name])}, this one {_names(windowed)}: one "
                               "variant cannot serve both")
            levels = expansion(loops[var])
            base = min(level.rows for level in levels)
            for param in sorted(windowed):
                if callee.memref(param).shape[0] != base:
                    raise ISAError(f"{where}: %{param} of @{callee.name} has {callee.memref(param).shape[0]} "
                                   f"rows, but the loop's index counts base tiles of {base} rows")
            for level in levels:
                name = variant_name(callee.name, level.rows)
                if level.scale == 1 or name in made:
                    continue
                defined = module.functions.get(name)
                if defined is None:
                    made[name] = _scaled(module, callee, windowed, level.scale, name)
                else:
                    _check_variant(module, callee, defined, windowed, level.scale)


def _names(memrefs: frozenset[str]) -> str:
    return "(" + ", ".join(f"%{name}" for name in sorted(memrefs)) + ")"


def _check_variant(module: Module, callee: Function, variant: Function, windowed: frozenset[str],
                   scale: int) -> None:
    """A variant the module defines takes the callee's parameters, the windowed memrefs at
    `scale` times their rows, with the same directions."""
    def parameters(function: Function, scaled: bool) -> list:
        shapes = [(m.name, m.dtype, (m.shape[0] * scale, m.shape[1]) if scaled and m.name in windowed
                   else m.shape) for m in function.memrefs]
        return [shapes, [(s.name, s.dtype) for s in function.scalars if s.param]]

    wanted = parameters(callee, True)
    if not variant.in_core or parameters(variant, False) != wanted or \
            directions(variant, module) != directions(callee, module):
        memrefs = ", ".join(f"%{name} {shape[0]}x{shape[1]}" for name, _, shape in wanted[0])
        raise ISAError(f"@{variant.name}, a variant of @{callee.name} for {scale}x its tile rows, must be an "
                       f"InCore function with its memrefs ({memrefs}), directions and scalar parameters")


def _scaled(module: Module, callee: Function, windowed: frozenset[str], scale: int, name: str) -> Function:
    """`callee` with the rows of its `windowed` memrefs, and of its tiles of those rows, times
    `scale`: right for a function that works on its window as whole tiles (a row-wise softmax).
    One that walks its window in steps, passes it to a callee, or moves tiles of those rows
    to other memrefs needs a variant of its own in the module: those are refused here."""
    rows = {m.shape[0] for m in callee.memrefs if m.name in windowed}
    for statement in walk(callee.body):
        if isinstance(statement, Call) and any(arg.tensor in windowed for _, arg in statement.args):
            problem = "passes a windowed memref on"
        elif isinstance(statement, Op) and statement.opcode in ("TLOAD", "TSTORE"):
            tile, memref = ((statement.dst, statement.srcs[0]) if statement.opcode == "TLOAD"
                            else (statement.srcs[0], statement.dst))
            if memref in windowed or callee.tile(tile).rows not in rows:
                continue
            problem = f"moves a tile of the scaled rows to or from %{memref}, which is not windowed"
        else:
            continue
        raise ISAError(f"cannot make @{name} by scaling @{callee.name}: {describe(statement)} {problem}; "
                       f"define @{name} in the module")
    memrefs = tuple(dataclasses.replace(m, shape=(m.shape[0] * scale, m.shape[1])) if m.name in windowed
                    else m for m in callee.memrefs)
    tiles = tuple(Tile(t.name, t.rows * scale, t.cols, t.dtype) if t.rows in rows else t
                  for t in callee.tiles)
    return dataclasses.replace(callee, name=name, memrefs=memrefs, tiles=tiles)
