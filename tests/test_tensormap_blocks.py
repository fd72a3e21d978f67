"""The TensorMap's block hashing (pto_gpu/core/tensormap.py) against the independent oracle
(oracle.py), on owners large enough to have many blocks.

A region hashes by (owner, block): a region of at most NARROW_BLOCKS blocks by the block it starts
in, a longer one by the owner's wide block; a lookup walks the blocks it spans, the NARROW_BLOCKS
blocks before them (cut at block 0) and the wide chain, or the wide chain alone when the owner has
no narrow entry of the kind it looks for. Blocks are 4 KiB at least, else about 1/256 of the owner
(layout.block_shift). Issue 43: narrowing that lookup window by one block passed every other test
and dropped a real edge (a write of X[512:8704] of a 1 MiB float32 X, then a read of X[8192:8194]).

So: windows narrower than a block, of one block, spanning two, up to NARROW_BLOCKS blocks and one
element past it (the narrowest wide region), many blocks and the whole owner, at offsets 0, one
element and one element short of a block, in block 0 and past the lookup window's cut; probed at
their head and tail (the first and last block they touch, the byte and the element before and past
each); over owners whose blocks are 4, 8, 16 and 32 KiB, one of a single block and one with a
partial last block; 1-D windows and 2-D bands of rows with exactly the same first and last byte,
through float32, float64 and uint8 views of one allocation, or on a heap buffer. The edges a dry
run records must be exactly the oracle's. Explicit grids, the issue's example, and hypothesis
programs (derandomized) that mix all of it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import pytest
from conftest import noop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import expected_edges, mismatch

import pto_gpu as pto
from pto_gpu.core.tensormap import NARROW_BLOCKS
from pto_gpu.jit.descriptor import from_tensor, write_layout
from pto_gpu.layout import MIN_BLOCK_SHIFT, PARAM_WIDTH, R_SHIFT, ROW_WIDTH, block_shift

N = NARROW_BLOCKS
KINDS = {"input": pto.input, "output": pto.output, "inout": pto.inout}
DTYPES = {"uint8": pto.DataType.UINT8, "float32": pto.DataType.FLOAT32, "float64": pto.DataType.FLOAT64}
NUMPY = {"uint8": np.uint8, "float32": np.float32, "float64": np.float64}

KIB, MIB = 1 << 10, 1 << 20
# Owners (bytes), by the block the TensorMap gives them: max(4 KiB, about 1/256 of the owner).
OWNERS = (
    4 * KIB,  # a single 4 KiB block: every region is narrow and in block 0
    40 * KIB,  # ten 4 KiB blocks: a wide region just fits
    1 * MIB,  # 256 blocks of 4 KiB: issue 43's array
    1 * MIB + 4 * KIB,  # 8 KiB blocks, the last one half full
    2 * MIB,  # 256 blocks of 8 KiB
    3 * MIB,  # 192 blocks of 16 KiB
    4 * MIB,  # 256 blocks of 16 KiB
    6 * MIB,  # 192 blocks of 32 KiB
)
GRID_OWNERS = (1 * MIB, 2 * MIB, 3 * MIB, 6 * MIB)  # one per block size


def block_of(nbytes: int) -> int:
    return 1 << block_shift(nbytes)


class Op(NamedTuple):
    """One task of one tensor param: a window whose first byte is lo and last is hi - 1 (bytes
    of the owner), through a view of dtype; rows > 1 asks for a band of that many rows (a 2-D
    strided window with the same first and last byte) where the owner has room for it."""

    kind: str
    dtype: str
    rows: int
    lo: int
    hi: int


def window(whole, lo: int, hi: int, rows: int):
    """The descriptor of [lo, hi) (bytes) cut from `whole`, an owner's 1-D descriptor: contiguous,
    or `rows` rows of a column band of a 2-D view, its first element at lo and its last at hi."""
    size = whole.dtype.itemsize
    first, stop = lo // size, hi // size
    n = stop - first
    if rows > 1 and n >= 2 * rows + 2:
        # The band ends the view's last row: a view starting `skip` elements before lo, rows of
        # `width`, the band the columns from `skip` on.
        skip = -n % rows or rows
        width = (n + skip) // rows
        if first >= skip and width > skip:
            return whole[first - skip:stop].reshape(rows, width)[:, skip:]
        # The band starts the view's first row: its columns up to `keep`.
        keep = (n - 1) % (rows - 1) + 1
        width = (n - keep) // (rows - 1)
        if width > keep and first + rows * width <= whole.shape[0]:
            return whole[first:first + rows * width].reshape(rows, width)[:, :keep]
    return whole[first:stop]


def describe(nbytes: int, ops, heap: bool = False, tensors=()) -> str:
    block = block_of(nbytes)
    lines = [f"a {'heap buffer' if heap else 'external array'} of {nbytes} B, blocks of {block} B "
             f"(narrow: at most {N} blocks long):"]
    for i, op in enumerate(ops):
        span = "empty" if op.hi == op.lo else (
            f"blocks {op.lo // block}..{(op.hi - 1) // block}, "
            f"{'wide' if op.hi - op.lo > N * block else 'narrow'}")
        view = f" shape {tensors[i].shape} strides {tensors[i].strides}" if i < len(tensors) else ""
        lines.append(f"  task {i}: {op.kind} {op.dtype} bytes [{op.lo}, {op.hi}) ({span}){view}")
    return "\n".join(lines)


@functools.cache
def dry_runtime() -> pto.Runtime:
    return pto.Runtime(backend="cpu", executor="dry")


def record(nbytes: int, ops, heap: bool = False):
    """The graph a dry run records for ops over one owner of nbytes (external memory seen through
    a view of each dtype, or a heap buffer: ops of one dtype), and the tensors of its tasks."""
    shift = block_shift(nbytes)
    tensors = []

    def orchestration(o, memory):
        if heap:
            (dtype,) = {op.dtype for op in ops}
            buffer = o.alloc((nbytes // DTYPES[dtype].itemsize,), DTYPES[dtype])
            wholes = {dtype: buffer}
        else:
            wholes = {name: o.external(memory.view(NUMPY[name])) for name in DTYPES}
        for op in ops:
            tensor = window(wholes[op.dtype], op.lo, op.hi, op.rows)
            # The windows lie where the test means them, by the blocks the TensorMap uses.
            assert tensor.byte_range == (op.lo, op.hi) and tensor.layout[R_SHIFT] == shift, (op, tensor)
            tensors.append(tensor)
            o.submit(noop, KINDS[op.kind](tensor))
        if heap:
            o.free(buffer)

    return dry_runtime().run(orchestration, np.zeros(nbytes, np.uint8), record=True).graph, tensors


def check(nbytes: int, ops, heap: bool = False):
    """The dry run's edges are exactly the oracle's."""
    graph, tensors = record(nbytes, ops, heap)
    wrong = mismatch(graph.tasks, graph.edges)
    assert not wrong, f"{wrong}\n{describe(nbytes, ops, heap, tensors)}"


# --- the issue's example -------------------------------------------------------------------------

def test_issue_43_a_read_in_the_last_block_of_a_narrow_write_waits_for_it():
    """A 1 MiB float32 X (4 KiB blocks): X[512:8704] is bytes 2048..34816, 8 blocks long, so narrow,
    hashed by block 0 and reaching into block 8; X[8192:8194] lies in block 8, whose lookup must
    walk back to block 0."""
    def orchestration(o, x):
        X = o.external(x)
        o.submit(noop, pto.output(X[512:8704]))
        o.submit(noop, pto.input(X[8192:8194]))

    x = np.zeros(MIB // 4, np.float32)
    graph = dry_runtime().run(orchestration, x, record=True).graph
    assert expected_edges(graph.tasks) == {(0, 1)}
    assert graph.edges == [(0, 1)]


# --- the owners reach every block size -----------------------------------------------------------

def test_the_owners_reach_each_block_size_and_the_blocks_the_tensormap_uses():
    shifts = [block_shift(n) for n in OWNERS]
    assert set(shifts) == set(range(MIN_BLOCK_SHIFT, MIN_BLOCK_SHIFT + 4))
    assert {block_shift(n) for n in GRID_OWNERS} == set(shifts)
    assert any(n <= block_of(n) for n in OWNERS)  # a single block
    assert any(n % block_of(n) for n in OWNERS)  # a partial last block
    assert any(n > N * block_of(n) for n in OWNERS if block_shift(n) == MIN_BLOCK_SHIFT)  # wide, small
    seen = {}

    def orchestration(o, memory, heap_bytes):
        seen["external"] = o.external(memory.view(np.float64)).layout[R_SHIFT]
        heap = o.alloc((heap_bytes,), pto.DataType.UINT8)
        seen["heap"] = heap[1:2].layout[R_SHIFT]
        o.free(heap)

    for n in OWNERS:
        dry_runtime().run(orchestration, np.zeros(n, np.uint8), n)
        assert seen == {"external": block_shift(n), "heap": block_shift(n)}, n


def test_compiled_descriptors_hash_into_the_blocks_python_ones_do():
    """A compiled orchestration makes its layout rows itself (jit/descriptor.py's write_layout,
    with its own copy of the block sizing): the same rows, block size included, for owners of
    every size, or a compiled task and a Python one over one owner would look in different chains."""
    rows = []

    def orchestration(o, memory):
        nbytes = len(memory)
        block = block_of(nbytes)
        heap = o.alloc((nbytes // 8,), pto.DataType.FLOAT64)
        for whole in (o.external(memory.view(np.float32)), o.external(memory), heap):
            size = whole.dtype.itemsize
            for lo, hi, band in ((0, nbytes, 1), (size, N * block + size, 3), (block - size, 2 * block, 1),
                                 (nbytes - N * block - size, nbytes, 8), (nbytes // 2, nbytes // 2, 1)):
                lo, hi = aligned(lo, hi, size, nbytes)
                tensor = window(whole, lo, hi, band)
                row = np.zeros(PARAM_WIDTH, np.int64)
                write_layout(from_tensor(tensor), row)
                rows.append((nbytes, tensor, row[:ROW_WIDTH].tolist(), tensor.layout.tolist()))
        o.free(heap)

    for nbytes in OWNERS:
        dry_runtime().run(orchestration, np.zeros(nbytes, np.uint8))
    for nbytes, tensor, compiled, python in rows:
        assert compiled == python, f"{nbytes} B owner, {tensor}: compiled {compiled}, Python {python}"


# --- explicit grids: a long window probed at its head and tail -----------------------------------

# Long windows: (blocks, elements) long, None for the whole owner.
LONG = [(0, 1), (1, -1), (1, 0), (1, 1), (2, 0), (N - 1, 1), (N, -1), (N, 0), (N, 1), (N + 1, 0),
        (N + 1, 1), (3 * N, 1), None]


def _long_id(value):
    return "whole" if value is None else f"{value[0]}blocks{value[1]:+d}"


def probes_around(lo: int, hi: int, block: int, size: int, nbytes: int, unit: int = 1, lengths=None):
    """Windows (bytes, multiples of unit) that start or end at the long window's first and last
    byte, give or take a unit and an element (size), and at the edges of the first and last block
    it touches, give or take a unit: one unit, one block or the narrowest wide region long."""
    first, last = lo // block, (max(hi, lo + 1) - 1) // block
    points = [(lo, {-size, -unit, 0, unit, size}), (hi, {-size, -unit, 0, unit, size}),
              ((first + 1) * block, {-unit, 0, unit}), (last * block, {-unit, 0, unit})]
    found = set()
    for point, deltas in points:
        for delta in deltas:
            for length in lengths or (unit, block, N * block + unit):
                for start in (point + delta, point + delta - length):
                    a, b = max(start, 0), min(start + length, nbytes)
                    if a < b:
                        found.add((a, b))
    return sorted(found)


def long_windows(nbytes: int, long, size: int):
    """[lo, hi) of the long window at offsets 0, one element and one element short of a block,
    in block 0 (where the lookup window is cut) and past N blocks."""
    block = block_of(nbytes)
    if long is None:
        yield 0, nbytes
        return
    length = long[0] * block + long[1] * size
    for anchor in (0, N + 3):
        for offset in (0, size, block - size):
            lo = anchor * block + offset
            if lo + length <= nbytes:
                yield lo, lo + length


# The long window's view, in turn: 1-D, or a band of rows with the same first and last byte.
VIEWS = (("float32", 1), ("float64", 8), ("uint8", 1), ("float32", 3), ("float64", 1), ("uint8", 5))


@pytest.mark.parametrize("long", LONG, ids=_long_id)
@pytest.mark.parametrize("nbytes", GRID_OWNERS, ids=lambda n: f"{n // KIB}KiB")
def test_byte_probes_at_a_long_windows_head_and_tail(nbytes, long):
    """A long write, then reads; a long read, then writes of a byte (those that cover it last):
    uint8 probes of an external array whose long window is a float32, float64 or uint8 view."""
    block = block_of(nbytes)
    for i, (dtype, rows) in enumerate(VIEWS):  # each view one of the long window's places
        size = DTYPES[dtype].itemsize
        places = list(long_windows(nbytes, long, size)) * (2 if long is None else 1)  # whole: 2 views
        for lo, hi in places[i:i + 1]:
            reads = probes_around(lo, hi, block, size, nbytes)
            check(nbytes, [Op("output", dtype, rows, lo, hi), *(Op("input", "uint8", 1, *p) for p in reads)])
            writes = probes_around(lo, hi, block, size, nbytes, lengths=(1, N * block + 1))
            writes.sort(key=lambda p: p[0] <= lo and hi <= p[1])  # covering writes remove the read
            check(nbytes, [Op("input", dtype, rows, lo, hi), *(Op("output", "uint8", 1, *p) for p in writes)])


@pytest.mark.parametrize("long", LONG, ids=_long_id)
@pytest.mark.parametrize("nbytes", GRID_OWNERS, ids=lambda n: f"{n // KIB}KiB")
def test_element_probes_at_a_long_windows_head_and_tail_on_the_heap(nbytes, long):
    """The same on a heap buffer of float32, probes of whole elements: a long inout, 1-D or a band
    of rows, then reads and writes in turn."""
    block = block_of(nbytes)
    size = 4
    for i, (lo, hi) in enumerate(long_windows(nbytes, long, size)):
        probes = probes_around(lo, hi, block, size, nbytes, unit=size, lengths=(size, N * block + size))
        probes.sort(key=lambda p: p[0] <= lo and hi <= p[1])
        ops = [Op("inout", "float32", (1, 5)[i % 2], lo, hi)]
        ops += [Op(("input", "output")[j % 2], "float32", 1, a, b) for j, (a, b) in enumerate(probes)]
        check(nbytes, ops, heap=True)


@pytest.mark.parametrize("nbytes", GRID_OWNERS, ids=lambda n: f"{n // KIB}KiB")
@pytest.mark.parametrize("blocks", [N - 1, N, N + 1])
def test_a_short_entry_meets_a_long_lookup_that_ends_in_its_block(nbytes, blocks):
    """The other way round: short writes at each block edge, then long reads (narrow and wide)
    whose last byte is the byte before, the first or the last byte of a write, or past it."""
    block = block_of(nbytes)
    for home in (0, 1, N, N + 1, 2 * N + 2):
        for offset in (0, 1, block // 2, block - 1):
            lo = home * block + offset
            ops = [Op("output", "uint8", 1, lo, lo + 1), Op("output", "uint8", 1, lo + 1, lo + 2)]
            for end in (lo, lo + 1, lo + 2, lo + 3):
                for length in (blocks * block - 1, blocks * block, blocks * block + 1):
                    ops += [Op("input", "uint8", rows, max(0, end - length), end) for rows in (1, 4)]
            check(nbytes, ops)


# --- hypothesis: programs of reads and writes over one large owner ------------------------------

def aligned(lo: int, hi: int, size: int, nbytes: int) -> tuple[int, int]:
    lo = min(max(lo, 0), nbytes) // size * size
    return lo, min(max(-(-hi // size) * size, lo), nbytes)


def some(draw, choices, otherwise):
    """One of choices, or (for None) a draw from otherwise."""
    choice = draw(st.sampled_from(choices))
    return draw(otherwise) if choice is None else choice


@st.composite
def lengths(draw, block: int, size: int, nbytes: int) -> int:
    """Mostly an element, a block or about NARROW_BLOCKS blocks (the widest narrow regions, the
    narrowest wide ones), give or take an element; else a long or whole-owner window."""
    many = st.integers(N + 2, max(N + 2, nbytes // block))
    blocks = some(draw, [0, 1, 2, N - 1, N, N, N, N + 1, None], many)
    if blocks > nbytes // block:
        return nbytes
    return max(size, blocks * block + some(draw, [0, -size, size, None], st.integers(1 - block, block - 1)))


@st.composite
def windows(draw, nbytes: int, size: int, earlier) -> tuple[int, int]:
    """A window by itself (a block, an offset in it, a length) or, given earlier windows, at one's
    head or tail: its first and last byte, the first byte of the last block it touches, the edge
    of its first block or the first block of the lookup window before it, give or take a byte or
    an element; starting or ending there."""
    block = block_of(nbytes)
    length = draw(lengths(block, size, nbytes))
    if earlier:
        lo, hi = draw(st.sampled_from(earlier))
        first, last = lo // block, (max(hi, lo + 1) - 1) // block
        # Starting in its last block, ending in its first, or either way at any of the points.
        way, point = draw(st.sampled_from([
            ("start", hi), ("start", last * block), ("end", lo), ("start", hi), ("start", last * block),
            ("end", lo), (None, lo), (None, hi), (None, (first + 1) * block), (None, (last + 1) * block),
            (None, (first - N) * block)]))
        point += draw(st.sampled_from([0, -1, 1, -size, size]))
        start = point if (way or draw(st.sampled_from(["start", "end"]))) == "start" else point - length
    else:
        offset = some(draw, [0, size, block - size, block // 2, None], st.integers(0, block - 1))
        room = max(0, (nbytes - offset - length) // block)  # blocks it may start at, whole
        start = some(draw, [0, 1, N, N + 3, None], st.integers(0, room)) * block + offset
    if not (0 < start + length and start < nbytes) and draw(st.booleans()):  # past an end: empty, or
        start = min(max(start, 0), nbytes - length)  # moved inside
    return aligned(start, start + length, size, nbytes)


class Program(NamedTuple):
    nbytes: int
    heap: bool
    ops: tuple[Op, ...]

    def __repr__(self) -> str:
        return describe(self.nbytes, self.ops, self.heap)


@st.composite
def programs(draw) -> Program:
    """Over one owner: a few windows anywhere, then windows at their heads and tails (and at those
    windows' own); kinds, views and bands drawn for each."""
    nbytes = draw(st.sampled_from(OWNERS))
    heap = draw(st.booleans())
    dtypes = [draw(st.sampled_from(list(DTYPES)))] if heap else list(DTYPES)
    ops: list[Op] = []
    anchors = draw(st.integers(1, 3))
    for i in range(anchors + draw(st.integers(1, 8))):
        dtype = draw(st.sampled_from(dtypes))
        earlier = [(op.lo, op.hi) for op in ops] if i >= anchors else []
        lo, hi = draw(windows(nbytes, DTYPES[dtype].itemsize, earlier))
        rows = draw(st.sampled_from([1, 1, 2, 3, 8]))
        ops.append(Op(draw(st.sampled_from(list(KINDS))), dtype, rows, lo, hi))
    return Program(nbytes, heap, tuple(ops))


@settings(max_examples=500, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_programs_over_large_owners_record_the_oracles_edges(program):
    check(program.nbytes, program.ops, program.heap)
