"""IR-to-IR optimisations of InCore functions (spec 003 §1.3 "compiler optimisations").

Owns tile buffer reuse by liveness: `reuse_tiles(function)` returns an equivalent Function in
which tiles of the same rows, cols and dtype whose live ranges never overlap are one tile (the
later ones renamed to the first, their declarations dropped, as are tiles nothing uses), and
`optimize_module(module)` applies it to every InCore function; `assignment(function)` says
which tile takes which storage. `tile_bytes` measures a function's declared tile memory.

What "live" means here follows the semantics of docs/ISA.md, which the interpreter implements:
  - every write of a tile replaces its valid region and the contents within it (a tail TLOAD
    leaves the rest of the tile untouched, but that rest is past the new valid region, and
    reading past it is a program error), so a write kills the tile's earlier value; except
    that an instruction whose destination is also read (`accumulate` in ops.py: TMATMUL_ACC)
    reads it first;
  - a tile read before any write on some path reads its initial (empty) state: such a tile is
    never merged;
  - FOR: liveness is solved to a fixpoint over the back edge (and the zero-trip path), and a
    tile live at the loop head (across the back edge, or after the loop) is then treated as live
    over the whole loop: it interferes with every tile the loop touches;
  - IF: a tile is live at the branch when it is live at the start of either arm;
  - CALL touches no tile of the caller (an inlined callee has its own frame); RETURN ends every
    live range.
Two tiles interfere when one is written while the other is live (the classic condition, which
is sound given the above). An instruction's destination may share storage with its sources
only where both generators compute element by element from the same element (UNARY, CONVERT,
BINARY, TILE_SCALAR, MASK, and the full-size operand of ROW/COL_EXPAND); every other form
keeps its destination apart from its sources (MATMUL's CUDA code refuses dst == b, TRANSPOSE's
verifier dst == a, and reductions and broadcasts read other elements than they write).
A tile the CUDA code keeps in shared memory (read whole: MATMUL's b, COL_REDUCE's a,
COL_EXPAND's b, TRANSPOSE's a; a tensor-core product's a and dst) shares only with such
tiles (COL_EXPAND's b may instead be every warp's register copy, a broadcast row: treating
it as shared here only keeps more tiles apart), so no register tile moves to shared memory
or back, and one that is also a ROW_EXPAND's b shares with none (the CUDA code reads it per
row with no barrier after). In a tensor-core kernel a 16-bit tile's role in the products
is kept too (`_roles`): a loaded operand merges only with loaded operands, a transpose's
source or result only with its like, so the generator can still keep each as 16-bit in
shared memory (packed) or read a transpose in place (a merge of two of one role can still
cost that: two transposes in one storage are read as copies); and the b of a ROW_EXPAND of a
product's result in place counts as read whole (the generator may keep the result in
registers and its factors in shared memory), so, a ROW_EXPAND's b, it shares with none.
Keeping roles apart may cost a kernel whose tensor-core layout does not fit, and whose CUDA
code falls back to FMA, a merge that fallback would have used. When in doubt tiles stay
apart: a wrong merge would be a silent wrong answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .cuda_mma import TENSOR_CORE_DTYPES, tensor_core_dtypes, tensor_core_kernel, tensor_core_product
from .errors import ISAError
from .ir import Call, For, Function, If, Module, Op, Return, Statement, Tile, walk
from .operands import Kind, signature
from .ops import OPCODES, Form
from .verify import verify_function, verify_module

# Forms whose destination element (r, c) is computed from source elements (r, c) only, on the
# same thread (CUDA) and in the same iteration (CPU), so dst may be one of these sources.
_ELEMENTWISE = frozenset({Form.UNARY, Form.CONVERT, Form.BINARY, Form.TILE_SCALAR, Form.MASK})
# Broadcasts: element-wise in their first source only (b is read at another row or column).
_EXPAND = frozenset({Form.ROW_EXPAND, Form.COL_EXPAND})
# The source each form reads whole (its position in srcs), as cuda_codegen's `whole` set.
_WHOLE_OPERAND = {Form.MATMUL: 1, Form.COL_REDUCE: 0, Form.COL_EXPAND: 1, Form.TRANSPOSE: 0}

Names = frozenset[str]


def tile_bytes(function: Function) -> int:
    """The tile memory a function declares: rows x cols x itemsize summed over its tiles (the
    declared dtype's size; generated code may compute half-precision tiles in float32)."""
    return sum(t.rows * t.cols * t.dtype.itemsize for t in function.tiles)


def optimize_module(module: Module) -> Module:
    """A new module with each InCore function passed through `reuse_tiles` (Orchestration
    functions as they are): same names, same order, same results."""
    verify_module(module)
    optimized = Module(module.name)
    for function in module.functions.values():
        optimized.add(reuse_tiles(function, module) if function.in_core else function)
    return optimized


def reuse_tiles(function: Function, module: Module | None = None) -> Function:
    """`function` (a verified InCore function) with tiles whose live ranges never overlap and
    that have the same rows, cols and dtype merged into one, and unused tiles dropped.
    `module` resolves calls for verification only: callees keep their own tiles."""
    verify_function(function, module)
    if not function.in_core or not function.tiles:  # an Orchestration, a library kernel: no tiles
        return function
    storage = assignment(function)
    renames = {tile: owner for tile, owner in storage.items() if tile != owner}
    body = _rename_block(function.body, renames)
    used = _tiles_touched(body)
    tiles = tuple(t for t in function.tiles if t.name in used)
    optimized = dataclasses.replace(function, tiles=tiles, body=body)
    verify_function(optimized, module)  # a merge the verifier refuses is a bug here, not the user's
    return optimized


def assignment(function: Function) -> dict[str, str]:
    """Each tile of an InCore function -> the tile whose storage `reuse_tiles` gives it (itself
    when it keeps its own), in declaration order."""
    renames = _assign(function, _interference(function))
    return {t.name: renames.get(t.name, t.name) for t in function.tiles}


# --- what an instruction does to tiles --------------------------------------------------------------
def _accesses(op: Op) -> tuple[Names, Names]:
    """(tiles read, tiles written) by one instruction. The destination operand (position 0)
    is written; an accumulating one (TMATMUL_ACC) is read too; every other tile operand is read."""
    spec = OPCODES[op.opcode]
    reads, writes = set(), set()
    for position, (operand, value) in enumerate(zip(signature(spec), (op.dst, *op.srcs))):
        if operand.kind is not Kind.TILE:
            continue
        if position == 0:
            writes.add(value)
            if spec.accumulate:
                reads.add(value)
        else:
            reads.add(value)
    return frozenset(reads), frozenset(writes)


def _apart_from_dst(op: Op) -> Names:
    """The sources the destination must not share storage with (see the module docstring)."""
    form = OPCODES[op.opcode].form
    reads, _ = _accesses(op)
    if form in _ELEMENTWISE:
        return frozenset()
    if form in _EXPAND:
        return frozenset({op.srcs[1]}) - {op.srcs[0]}  # b, unless b is also the element-wise a
    return reads


def _tiles_touched(body: tuple[Statement, ...]) -> Names:
    touched: set[str] = set()
    for statement in walk(body):
        if isinstance(statement, Op):
            reads, writes = _accesses(statement)
            touched |= reads | writes
    return frozenset(touched)


def _read_whole(function: Function) -> Names:
    """Tiles some instruction reads whole (MATMUL's b, COL_REDUCE's a, COL_EXPAND's b,
    TRANSPOSE's a), and in a tensor-core kernel a tensor-core product's a and dst, and the b of
    a ROW_EXPAND in place of such a dst: the CUDA code keeps these in shared memory, the others
    in registers."""
    products = _tensor_products(function)
    whole = set()
    for statement in walk(function.body):
        if isinstance(statement, Op):
            form = OPCODES[statement.opcode].form
            position = _WHOLE_OPERAND.get(form)
            if position is not None:
                whole.add(statement.srcs[position])
            if statement in products:
                whole |= {statement.dst, statement.srcs[0]}
    results = {op.dst for op in products}
    return frozenset(whole | {s.srcs[1] for s in walk(function.body) if isinstance(s, Op)
                              and OPCODES[s.opcode].form is Form.ROW_EXPAND
                              and s.dst == s.srcs[0] and s.dst in results})


def _tensor_products(function: Function) -> frozenset[Op]:
    """The products of a tensor-core kernel that run on tensor cores."""
    if not tensor_core_kernel(function):
        return frozenset()
    dtypes, allowed = {t.name: t.dtype for t in function.tiles}, tensor_core_dtypes(function)
    return frozenset(s for s in walk(function.body)
                     if isinstance(s, Op) and OPCODES[s.opcode].form is Form.MATMUL
                     and tensor_core_product(s, dtypes.__getitem__, allowed))


def _roles(function: Function) -> dict[str, str]:
    """16-bit tile -> its part in a tensor-core kernel's products, for those with one: "operand"
    (only loaded, only read as a product's a or b), "source" (only loaded, only transposed),
    "transposed" (only a transpose's result, only read as a product's b). (TF32 operands stay
    float: no layout of theirs depends on a role.)"""
    products = _tensor_products(function)
    if not products:
        return {}
    writes: dict[str, set[str]] = {}
    reads: dict[str, set[str]] = {}
    for statement in (s for s in walk(function.body) if isinstance(s, Op)):
        form = OPCODES[statement.opcode].form
        read, written = _accesses(statement)
        kind = "load" if form is Form.LOAD else "transpose" if form is Form.TRANSPOSE else "other"
        for tile in written:
            writes.setdefault(tile, set()).add(kind)
        for tile in read:
            use = "transpose" if form is Form.TRANSPOSE else "other"
            if statement in products and tile != statement.dst:
                use = "b" if tile == statement.srcs[1] else "a"
            reads.setdefault(tile, set()).add(use)
    roles = {}
    sixteen_bit = {t.name for t in function.tiles if t.dtype in TENSOR_CORE_DTYPES}
    for tile, written in ((t, w) for t, w in writes.items() if t in sixteen_bit):
        read = reads.get(tile, set())
        if written == {"load"} and read and read <= {"a", "b"}:
            roles[tile] = "operand"
        elif written == {"load"} and read == {"transpose"}:
            roles[tile] = "source"
        elif written == {"transpose"} and read == {"b"}:
            roles[tile] = "transposed"
    return roles


# --- liveness and interference --------------------------------------------------------------------
class _Interference:
    """Backward liveness over the structured body, recording which tiles interfere."""

    def __init__(self, tiles: Iterable[str]):
        self.edges: dict[str, set[str]] = {name: set() for name in tiles}

    def add(self, tile: str, others: Iterable[str]) -> None:
        for other in others:
            if other != tile:
                self.edges[tile].add(other)
                self.edges[other].add(tile)

    def block(self, body: tuple[Statement, ...], live_out: Names) -> Names:
        """The tiles live at the start of `body`, given those live at its end."""
        live = live_out
        for statement in reversed(body):
            live = self.statement(statement, live)
        return live

    def statement(self, statement: Statement, live: Names) -> Names:
        if isinstance(statement, Op):
            return self.op(statement, live)
        if isinstance(statement, For):
            return self.loop(statement, live)
        if isinstance(statement, If):
            return self.block(statement.then_body, live) | self.block(statement.else_body, live)
        if isinstance(statement, Return):
            return frozenset()  # nothing after a RETURN runs: every live range ends here
        if isinstance(statement, Call):
            return live  # the callee's tiles are its own; the caller's are not touched
        raise ISAError(f"tile reuse: {statement!r} is not a statement of an InCore function")

    def op(self, op: Op, live: Names) -> Names:
        reads, writes = _accesses(op)
        for tile in writes:
            # written while the others are live (a dead write still clobbers its storage)
            self.add(tile, live)
            self.add(tile, _apart_from_dst(op))
        return (live - writes) | reads

    def loop(self, loop: For, live_out: Names) -> Names:
        """The loop head's live set: the fixpoint of head = after | live_in(body, head) (the
        body may run zero times, and its end flows back to the head). A tile live at the head
        is then held live over the whole loop."""
        head = live_out
        while True:  # edges found on the way come from subsets of the final live sets: all true
            grown = live_out | self.block(loop.body, head)
            if grown == head:
                break
            head = grown
        for tile in head:
            self.add(tile, _tiles_touched(loop.body))
        return head


def _interference(function: Function) -> dict[str, set[str]]:
    """Each tile's set of tiles it may not share storage with."""
    names = [t.name for t in function.tiles]
    graph = _Interference(names)
    live_at_entry = graph.block(function.body, frozenset())
    # Read before any write on some path: the initial (empty) state is observed; keep it alone.
    for tile in live_at_entry | _broadcast_from_shared(function):
        graph.add(tile, names)
    return graph.edges


def _broadcast_from_shared(function: Function) -> Names:
    """Tiles read whole (CUDA shared memory) that are also a ROW_EXPAND's b: the CUDA code reads
    b[r][0] in every lane of row r's warp after a __syncwarp() but with no barrier after, so
    lane 0 writing that element for a later tile could overtake a lane still reading it.
    Rare (an r x 1 tile read whole); kept alone rather than trusted."""
    broadcast = {s.srcs[1] for s in walk(function.body)
                 if isinstance(s, Op) and OPCODES[s.opcode].form is Form.ROW_EXPAND}
    return _read_whole(function) & broadcast


# --- assignment and renaming ----------------------------------------------------------------------
def _first_use_order(function: Function) -> list[Tile]:
    """Tiles in the order the body first touches them (then the untouched ones): in straight-line
    code that is the order live ranges start, in which greedy colouring of intervals is optimal."""
    order: dict[str, None] = {}
    for statement in walk(function.body):
        if isinstance(statement, Op):
            reads, writes = _accesses(statement)
            operands = [v for v in (statement.dst, *statement.srcs) if v in reads | writes]
            order.update((name, None) for name in operands)
    by_name = {t.name: t for t in function.tiles}
    rest = [t for t in function.tiles if t.name not in order]
    return [by_name[name] for name in order] + rest


def _assign(function: Function, interference: dict[str, set[str]]) -> dict[str, str]:
    """tile -> the tile whose storage it takes: each joins the first group of its shape and
    dtype none of whose members it interferes with (groups are named by their first member).
    A tile read whole joins only tiles read whole, so no register tile of the CUDA code moves
    to shared memory (slower, and under other synchronisation rules) nor the reverse, and a
    tile with a role in tensor-core products only tiles of that role (_roles)."""
    whole, roles = _read_whole(function), _roles(function)
    groups: dict[tuple, list[list[str]]] = {}
    renames: dict[str, str] = {}
    for tile in _first_use_order(function):
        shape = (tile.rows, tile.cols, tile.dtype, tile.name in whole, roles.get(tile.name))
        candidates = groups.setdefault(shape, [])
        group = next((g for g in candidates if not interference[tile.name] & set(g)), None)
        if group is None:
            candidates.append([tile.name])
        else:
            group.append(tile.name)
            renames[tile.name] = group[0]
    return renames


def _rename_block(body: tuple[Statement, ...], renames: dict[str, str]) -> tuple[Statement, ...]:
    return tuple(_rename(statement, renames) for statement in body)


def _rename(statement: Statement, renames: dict[str, str]) -> Statement:
    """Tile names replaced in instructions (names are unique in a function, so a string
    operand equal to a tile's name is that tile)."""
    if isinstance(statement, Op):
        def name(value: object) -> object:
            return renames.get(value, value) if isinstance(value, str) else value
        return dataclasses.replace(statement, dst=name(statement.dst), srcs=tuple(map(name, statement.srcs)))
    if isinstance(statement, For):
        return dataclasses.replace(statement, body=_rename_block(statement.body, renames))
    if isinstance(statement, If):
        return dataclasses.replace(statement, then_body=_rename_block(statement.then_body, renames),
                                   else_body=_rename_block(statement.else_body, renames))
    return statement
