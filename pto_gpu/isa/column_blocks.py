"""Column blocks: an InCore function whose wide tiles would not fit in registers, rewritten to
walk its rows in blocks of columns (for CUDA code; the CPU's code takes rows whole).

The CUDA code keeps a tile row in registers, lane l holding columns l, l + 32, ..., so a 64 x
768 tile of the block layout is 192 registers a lane, and a LayerNorm of two of them spills.
The library's families walk wide rows in blocks by hand (kernels.tiles.column_blocks);
`blocked(function, block)` does it for any function it can: it returns an equivalent function
whose tiles of the widest width W are `block` columns wide, or raises NotBlockable saying why
it cannot. Its body is a sequence of passes, each a FOR over the blocks of columns, with the
function's other instructions between them:

- An instruction that touches no wide tile (row reductions' r x 1 results, scalars) stays as
  it is, between passes.
- The instructions over wide tiles are column-local (element-wise, tile-scalar, row and column
  broadcasts, TFILL and TROWIDX, TCOLIDX counting from the block's column, loads and stores at
  the block's column), so each block computes its own columns; a row reduction of a wide tile
  combines the blocks' partial results into its r x 1 destination, filled with the
  reduction's identity before the pass (TROWSUM's partial sums added, TROWMAX's maxed,
  TROWMIN's mined).
- Wide tiles do not outlive a pass. A pass computes what its effects (stores and reductions)
  need from the loads they came from: for each wide tile read, the instruction that last
  wrote it before the read, transitively, as Triton's two-pass LayerNorm loads x again. So a
  wide instruction that reads a reduction of the current pass, and a narrow instruction after
  a pass with effects, start the next pass.

Recomputing is only right when what a recomputed instruction reads is as it was. A narrow tile
or scalar that such an instruction reads is copied before it is written again (tile reuse
makes LayerNorm's mean and variance one tile; a reduction's destination is written by its
pass), and the instruction reads the copy; a load is not recomputed after a store to its
memref that came after it. A stored memref keeps one fixed window for all its wide accesses
and has no narrow ones, so its blocks never overlap. Not blocked, NotBlockable saying why: a
wide tile in an instruction that is not column-local (products, transposes, column
reductions, masks); where W is not whole blocks, a generated wide tile (valid over
all its columns: the last block would count some past W) or a window that may reach past W
(the last block's loads stop at the window's end); a memref loaded only into tiles nothing
uses (recomputing would drop its only access); a body with control flow or calls.
"""

from __future__ import annotations

import dataclasses

from ..dtypes import DataType
from .describe import describe
from .ir import For, Function, Op, Return, Scalar, Statement, Tile, walk
from .operands import Kind, signature
from .ops import OPCODES, Form

# Forms computed element by element along columns, whose wide destination needs only the same
# columns of its sources.
_COLUMN_LOCAL = frozenset({Form.LOAD, Form.UNARY, Form.CONVERT, Form.BINARY, Form.TILE_SCALAR,
                           Form.ROW_EXPAND, Form.COL_EXPAND})
_GENERATED = frozenset({"TFILL", "TROWIDX", "TCOLIDX"})  # TCOLIDX counts from the block's column
_COMBINE = {"TROWSUM": "TADD", "TROWMAX": "TMAX", "TROWMIN": "TMIN"}  # blocks' partial results


class NotBlockable(Exception):
    """Why a function cannot be walked in column blocks (it is then generated as it is)."""


def widest(function: Function) -> int:
    """The widest tile's columns (0 without tiles)."""
    return max((t.cols for t in function.tiles), default=0)


def blocked(function: Function, block: int) -> Function:
    """`function` (a verified InCore function) with its tiles of the widest width W > `block`
    narrowed to `block` columns and its body in passes over blocks of columns (module doc)."""
    width = widest(function)
    if width <= block:
        raise NotBlockable(f"no tile is wider than {block} columns")
    wide = frozenset(t.name for t in function.tiles if t.cols == width)
    other = next((t for t in function.tiles if t.name not in wide and t.cols > block), None)
    if other is not None:
        raise NotBlockable(f"tiles of two widths over {block} columns: {width} and {other.cols} "
                           f"(%{other.name})")
    body = function.body[:-1] if function.body and isinstance(function.body[-1], Return) else function.body
    passes = _Passes(function, wide, width, block)
    for index, statement in enumerate(body):
        if not isinstance(statement, Op):
            raise NotBlockable(f"{describe(statement)}: only a body of instructions is walked in blocks")
        passes.add(index, statement)
    passes.flush()
    dropped = sorted(_accessed(function.body) - _accessed(passes.body))
    if dropped:  # the verifier infers a memref's direction from its accesses: it must keep one
        raise NotBlockable(f"memref %{dropped[0]} is only loaded into tiles nothing uses")
    tiles = tuple(Tile(t.name, t.rows, block, t.dtype) if t.name in wide else t for t in function.tiles)
    return dataclasses.replace(function, tiles=tiles + tuple(passes.new_tiles),
                               scalars=function.scalars + tuple(passes.new_scalars), body=tuple(passes.body))


def _accessed(body) -> set[str]:
    """The memrefs the body's loads and stores access."""
    accessed = set()
    for statement in walk(tuple(body)):
        if isinstance(statement, Op) and OPCODES[statement.opcode].form is Form.LOAD:
            accessed.add(statement.srcs[0])
        elif isinstance(statement, Op) and OPCODES[statement.opcode].form is Form.STORE:
            accessed.add(statement.dst)
    return accessed


@dataclasses.dataclass(frozen=True)
class _Recorded:
    """An instruction that writes a wide tile, kept to be computed again by the passes that
    need its value: where it was, and the version of each narrow tile or scalar it read."""

    index: int
    op: Op
    reads: tuple[tuple[str, int], ...]


class _Passes:
    """The blocked body, built instruction by instruction (blocked's state)."""

    def __init__(self, function: Function, wide: frozenset[str], width: int, block: int):
        self.function, self.wide, self.width, self.block = function, wide, width, block
        self.tiles = {t.name: t for t in function.tiles}
        self.names = {m.name for m in function.memrefs} | set(self.tiles) | {s.name for s in function.scalars}
        self.body: list[Statement] = []
        self.new_tiles: list[Tile] = []
        self.new_scalars: list[Scalar] = []
        self.versions: dict[str, int] = {}  # narrow tile or scalar -> how often it was written
        self.recorded: list[_Recorded] = []
        self.effects: list[tuple[int, Op]] = []  # the current pass's stores and reductions
        self.pending: set[str] = set()  # the current pass's reductions' destinations
        self.stores: dict[str, list[int]] = {}  # memref -> indices of its stores in the body so far
        self.partials: dict[tuple[int, DataType], str] = {}  # a reduction's per-block result tile
        self._check_windows(function)

    # --- classifying -----------------------------------------------------------------------
    def _check_windows(self, function: Function) -> None:
        """The windows of the wide accesses: a stored memref keeps one, fixed (no local scalar
        in it), and has no narrow accesses, so that its blocks never overlap; and where W is not
        whole blocks, each window ends with its memref, so that the last block's loads and
        stores stop at W (a load takes a block's columns up to the window's end, not W's)."""
        windows: dict[str, set] = {}
        narrow, stored = set(), set()
        for statement in function.body:
            if not isinstance(statement, Op) or OPCODES[statement.opcode].form not in (Form.LOAD, Form.STORE):
                continue
            load = OPCODES[statement.opcode].form is Form.LOAD
            tile, memref = (statement.dst, statement.srcs[0]) if load else (statement.srcs[0], statement.dst)
            if tile in self.wide:
                windows.setdefault(memref, set()).add(statement.srcs[1:3])
                col, width = statement.srcs[2], function.memref(memref).shape[1]
                if self.width % self.block and not (isinstance(col, int) and col + self.width == width):
                    raise NotBlockable(f"{describe(statement)}: %{memref}'s window may reach past the tiles' "
                                       f"{self.width} columns, which are not whole blocks of {self.block}")
            else:
                narrow.add(memref)
            if not load:
                stored.add(memref)
        assignable = {s.name for s in function.scalars if not s.param}
        for memref in stored & set(windows):
            moving = {v for window in windows[memref] for v in window if v in assignable}
            if len(windows[memref]) > 1 or memref in narrow or moving:
                raise NotBlockable(f"memref %{memref} is stored and accessed through different windows: its "
                                   "column blocks could overlap")
        return {memref: next(iter(w)) for memref, w in windows.items()}

    def _reads(self, op: Op) -> tuple[list[str], list[str]]:
        """(wide tiles, narrow tiles and scalars) the instruction reads."""
        wide, narrow = [], []
        for value, operand in zip(op.srcs, signature(OPCODES[op.opcode])[1:]):
            if not isinstance(value, str) or operand.kind in (Kind.MEMREF, Kind.PREDICATE):
                continue
            (wide if value in self.wide else narrow).append(value)
        return wide, narrow

    def add(self, index: int, op: Op) -> None:
        spec = OPCODES[op.opcode]
        wide_reads, narrow_reads = self._reads(op)
        writes_wide = op.dst in self.wide
        if not writes_wide and not wide_reads:  # narrow: between passes
            if self.effects:
                self.flush()
            if spec.form is Form.STORE:
                self.stores.setdefault(op.dst, []).append(index)
            else:
                self._keep_for_recomputing(op.dst)
                self.versions[op.dst] = self.versions.get(op.dst, 0) + 1
            self.body.append(op)
            return
        column_local = spec.form in _COLUMN_LOCAL or (spec.form is Form.GENERATE and op.opcode in _GENERATED)
        if writes_wide and column_local:
            if spec.form is Form.GENERATE and self.width % self.block:
                raise NotBlockable(f"{describe(op)}: a generated wide tile with {self.width} columns, not a "
                                   f"whole number of blocks of {self.block}")
            if self.pending.intersection(narrow_reads):
                self.flush()  # it reads a reduction of this pass: only whole after it
            reads = tuple((name, self.versions.get(name, 0)) for name in narrow_reads)
            self.recorded.append(_Recorded(index, op, reads))
        elif spec.form is Form.ROW_REDUCE:
            if op.dst in self.pending:
                self.flush()
            self.effects.append((index, op))
            self.pending.add(op.dst)
        elif spec.form is Form.STORE:
            self.effects.append((index, op))
        else:
            raise NotBlockable(f"{describe(op)}: not computed column by column")

    # --- passes ----------------------------------------------------------------------------
    def flush(self) -> None:
        """The current pass: a FOR over the blocks of columns computing its effects and what
        they need."""
        if not self.effects:
            return
        for name in sorted(self.pending):  # the reductions' destinations are written from here on
            self._keep_for_recomputing(name)
        needed = self._closure(self._effect_reads())
        for recorded in needed:
            self._check_unchanged(recorded)
        ordered = sorted([(r.index, r.op) for r in needed] + self.effects, key=lambda entry: entry[0])
        column = self._fresh("col")
        offsets: dict[object, str] = {}
        head: list[Statement] = []
        before, inner = [], []
        for _, op in ordered:
            spec = OPCODES[op.opcode]
            if spec.form in (Form.LOAD, Form.STORE):
                col = op.srcs[2]
                if col not in offsets:
                    offsets[col] = column if col == 0 else self._offset(head, column, col)
                inner.append(Op(op.opcode, op.dst, (op.srcs[0], op.srcs[1], offsets[col])))
            elif spec.form is Form.ROW_REDUCE:  # the blocks' results combined in the destination
                part = self._partial(self.tiles[op.dst])
                before.append(Op("TFILL", op.dst, (float(spec.identity),)))
                # part first: the result's valid rows are the source's (a fill's are all)
                inner += [Op(op.opcode, part, op.srcs), Op(_COMBINE[op.opcode], op.dst, (part, op.dst))]
            elif op.opcode == "TCOLIDX":  # s + c over the tile: s + the block's column + c in the block
                inner.append(Op(op.opcode, op.dst, (self._position(head, column, op.srcs[0]),)))
            else:
                inner.append(op)
        self.body += before
        self.body.append(For(column, 0, self.width, self.block, tuple(head + inner)))
        for index, op in self.effects:
            if OPCODES[op.opcode].form is Form.STORE:
                self.stores.setdefault(op.dst, []).append(index)
        for name in self.pending:
            self.versions[name] = self.versions.get(name, 0) + 1
        self.effects, self.pending = [], set()

    def _effect_reads(self) -> list[tuple[int, str]]:
        """(where, wide tile) for each wide tile the current pass's effects read."""
        return [(index, tile) for index, op in self.effects for tile in self._reads(op)[0]]

    def _closure(self, work: list[tuple[int, str]]) -> list[_Recorded]:
        """The recorded instructions whose values the reads `work` (where, wide tile) see,
        transitively: for each, the tile's last writer before the read."""
        needed: dict[int, _Recorded] = {}
        while work:
            index, tile = work.pop()
            writer = next((r for r in reversed(self.recorded) if r.index < index and r.op.dst == tile), None)
            if writer is None:  # the verifier refuses a tile read before any write
                raise NotBlockable(f"tile %{tile} is read before it is written")
            if writer.index not in needed:
                needed[writer.index] = writer
                work += [(writer.index, t) for t in self._reads(writer.op)[0]]
        return list(needed.values())

    def _keep_for_recomputing(self, name: str) -> None:
        """Before narrow tile or scalar `name` is written: the recorded instructions a later
        pass may compute again that read its current value read a copy of it from now on."""
        version = self.versions.get(name, 0)
        # What a later pass can need: the current value of every wide tile, and what this pass's
        # effects read, with all they were computed from.
        computed = {r.op.dst for r in self.recorded}
        live = self._closure(self._effect_reads() + [(len(self.function.body), t) for t in computed])

        readers = {r.index for r in live if (name, version) in r.reads}
        if not readers:
            return
        tile = self.tiles.get(name)
        if tile is not None:
            copy = self._new_tile(f"{name}_was", tile)
            self.body.append(Op("TMULS", copy, (name, 1.0)))  # exact: -0.0, inf and NaN too
        else:
            copy = self._fresh(f"{name}_was")
            self.new_scalars.append(Scalar(copy, self.function.scalar(name).dtype, param=False))
            self.body.append(Op("SMUL", copy, (name, 1)))
        self.versions[copy] = 0
        self.recorded = [self._reading_copy(r, name, copy) if r.index in readers else r
                         for r in self.recorded]

    @staticmethod
    def _reading_copy(recorded: _Recorded, name: str, copy: str) -> _Recorded:
        op = recorded.op
        srcs = tuple(copy if value == name else value for value in op.srcs)
        reads = tuple((copy, 0) if read == name else (read, version) for read, version in recorded.reads)
        return _Recorded(recorded.index, Op(op.opcode, op.dst, srcs), reads)

    def _check_unchanged(self, recorded: _Recorded) -> None:
        """A recorded instruction computed again reads what it read where it was written."""
        where = describe(recorded.op)
        # The copies keep this from failing; a slip there must refuse, never miscompute.
        for name, version in recorded.reads:
            if self.versions.get(name, 0) != version:
                raise NotBlockable(f"{where}: %{name} is written after it and before a pass that needs its "
                                   "result, which would read the new value")
        if OPCODES[recorded.op.opcode].form is Form.LOAD:
            memref = recorded.op.srcs[0]
            if any(store > recorded.index for store in self.stores.get(memref, ())):
                raise NotBlockable(f"{where}: %{memref} is stored after it and before a pass that needs its "
                                   "result, which would load the stored values")

    # --- new names -------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def _offset(self, head: list[Statement], column: str, col: object) -> str:
        """A local scalar holding the block's column `column` plus a window's column `col`."""
        name = self._fresh(f"{column}_at")
        self.new_scalars.append(Scalar(name, DataType.INT64, param=False))
        head.append(Op("SADD", name, (column, col)))
        return name

    def _position(self, head: list[Statement], column: str, start: object) -> str:
        """A local float64 scalar holding a TCOLIDX's `start` plus the block's column `column`."""
        name = self._fresh(f"{column}_from")
        self.new_scalars.append(Scalar(name, DataType.FLOAT64, param=False))
        head.append(Op("SADD", name, (start, column)))
        return name

    def _new_tile(self, base: str, like: Tile) -> str:
        """A new tile of `like`'s shape and dtype, named after `base`."""
        name = self._fresh(base)
        self.tiles[name] = Tile(name, like.rows, like.cols, like.dtype)
        self.new_tiles.append(self.tiles[name])
        return name

    def _partial(self, result: Tile) -> str:
        """The tile a block's reduction goes to before it is combined: one per rows and dtype."""
        key = (result.rows, result.dtype)
        if key not in self.partials:
            self.partials[key] = self._new_tile("block_part", result)
        return self.partials[key]
