"""Compiled placement: a distributed run's compiled submit placed by compiled code, with the
transfers it needs, where compiled code can.

Every rank places every task alike (distributed/placement.py). A compiled submit whose regions
start and end on their buffers' holdings units is placed here (`plan`, then `apply`), as
Placement.place would place it: on the owner of the first element of the first region it
writes (rank 0 if it writes none); a rank that lacks what it reads gets it from another and
holds it from then on; what it writes is its rank's alone. A transfer of other ranks' this
rank only counts. One this rank sends or receives is entered by compiled code too (jit/api.py)
where the session allows (M_TRANSFERS: the run's native workers post transfers through MPI)
and it is one Placement would make native: a whole region one rank wrote, and one MPI may
write where it lands. Anything else (a region that cuts a unit, a transfer of part of a
region or the Python way's, a buffer without holdings) goes to Placement through the session
(SERVICE_PLACE), which works on the same tables and counts, the transfers' sequences too.

The sweeps over a region's units (`_sweep`) are also what Python's Holdings runs for the
common cases of its own transitions (`fetch_whole`, `write`): one implementation of how a read
and a write change the tables.

The tables are the Python Holdings' own arrays (owner, writer and valid bits per unit of a
buffer: holdings.py), found through `held`, a row per buffer (H_* columns: a heap buffer's
ring slot, then the externals) that the session fills from the placer; the run's counts (C_*)
are Placement's `counts`. A heap tile compiled code allocates with one owner has tables of
one entry in the session's per-slot arrays instead (`hold_allocated`: an H_MINE row), until
the placer adopts it (host.Session._adopt) or compiled code frees it. A row whose tables
compiled code changed (a write, or a read that gains valid bits) is marked (H_WRITTEN), so
that Python drops what it remembers of them (Holdings' AND of valid bits per region, and the
last write, a repeat of which it skips).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.tuple import tuple_setitem

from ..core.address import array_at
from ..core.state import INPUT, OUTPUT
from .context import (
    C_BYTES_RECEIVED,
    C_BYTES_SENT,
    C_COMPILED,
    C_MOVED,
    C_PLACED,
    C_RECEIVED_FROM,
    C_SENT_TO,
    C_TRANSFERS,
    C_WRITTEN,
    EXTERNAL_WRITEABLE,
    H_DTYPE,
    H_ITEMSIZE,
    H_MINE,
    H_OWNER,
    H_UNIT,
    H_UNITS,
    H_VALID,
    H_WRITER,
    H_WRITTEN,
    M_BUFFER_MASK,
    M_DEFAULT_OWNER,
    M_HEAP_OWNERS,
    M_HEAP_VALID,
    M_HEAP_WRITERS,
    M_RANK,
    M_RANKS,
    M_TRANSFERS,
    PLAN_DATATYPE,
    PLAN_DESC,
    PLAN_INDEX,
    PLAN_PEER,
    PLAN_SENDS,
    PLAN_SEQUENCE,
)
from .descriptor import D_ITEMSIZE, D_KEY, D_NDIM, D_OFFSET, D_SHAPE, D_STRIDE, DESC_WIDTH, MAX_JIT_DIMS

_ONES, _ZEROS = (1,) * MAX_JIT_DIMS, (0,) * MAX_JIT_DIMS
if MAX_JIT_DIMS != 4:
    raise ImportError("jit/placing.py's _sweep has a loop per dim of MAX_JIT_DIMS (4)")


@njit(cache=True, _nrt=False, inline="always")
def held_row(t, key):
    """The `held` row of buffer `key` (a heap buffer's ring slot, then the externals)."""
    if key >= 0:
        return t.held[key & t.meta[M_BUFFER_MASK]]
    return t.held[t.meta[M_BUFFER_MASK] + 1 + (-1 - key)]


@njit(cache=True, _nrt=False)
def hold_allocated(t, seq, nbytes, itemsize, dtype, owner):
    """Give heap buffer `seq`, just allocated, tables of one owner (Placement.alloc's) of
    compiled placement's own, so that Python hears of it only if it needs to (an adoption,
    host.Session._adopt); whether it did: `owner` is a rank, or -1 for the default (else
    Python's alloc names what is wrong), and the buffer holds an element."""
    if owner == -1:
        owner = t.meta[M_DEFAULT_OWNER]
    if owner < 0 or owner >= t.meta[M_RANKS] or nbytes < itemsize:
        return False
    slot = seq & t.meta[M_BUFFER_MASK]
    row = t.held[slot]
    row[H_OWNER] = t.meta[M_HEAP_OWNERS] + slot
    row[H_WRITER] = t.meta[M_HEAP_WRITERS] + slot
    row[H_VALID] = t.meta[M_HEAP_VALID] + 8 * slot
    array_at(row[H_OWNER], 1, np.int8)[0] = owner
    array_at(row[H_WRITER], 1, np.int8)[0] = owner
    array_at(row[H_VALID], 1, np.uint64)[0] = np.uint64(1) << np.uint64(owner)
    row[H_UNIT] = nbytes // itemsize
    row[H_UNITS] = 1
    row[H_ITEMSIZE] = itemsize
    row[H_WRITTEN] = 0
    row[H_MINE] = 1
    row[H_DTYPE] = dtype
    return True


@njit(cache=True, _nrt=False)
def release_held(t, key):
    """Forget the tables of heap buffer `key`, being freed, if they are compiled placement's
    own (`hold_allocated`): whether they were (else the Python placer's, which must hear)."""
    row = held_row(t, key)
    if not row[H_MINE]:
        return False
    row[:] = 0
    return True


@njit(cache=True, _nrt=False, inline="always")
def _geometry(desc, row):
    """The region of `desc` in units of its buffer's tables: (first unit, extents and strides
    of the grid of runs, runs in it, units per run), holdings.runs_of's grouping; first -1
    when its elements are not the tables' or it does not start and end on units."""
    unit, itemsize = row[H_UNIT], desc[D_ITEMSIZE]
    extents, strides = _ONES, _ZEROS
    size = 1
    for d in range(desc[D_NDIM]):
        size *= desc[D_SHAPE + d]
    if unit == 0 or itemsize != row[H_ITEMSIZE] or desc[D_OFFSET] % itemsize or size == 0:
        return -1, extents, strides, 0, 0
    first = desc[D_OFFSET] // itemsize
    run, contiguous, outer, runs = 1, True, 0, 1
    ok = first % unit == 0
    for d in range(desc[D_NDIM] - 1, -1, -1):
        extent, stride = desc[D_SHAPE + d], desc[D_STRIDE + d]
        if extent == 1:
            continue
        if contiguous and stride == run:
            run *= extent
        else:
            contiguous = False
            ok = ok and stride % unit == 0
            extents = tuple_setitem(extents, outer, extent)
            strides = tuple_setitem(strides, outer, stride // unit)
            outer += 1
            runs *= extent
    if not ok or run % unit:
        return -1, extents, strides, 0, 0
    return first // unit, extents, strides, runs, run // unit


# What `_sweep` does to each unit of a region (bit: a rank's valid bit)
_INVOLVES = 0  # whether a unit lacks `bit` and this rank would send it or receive it
_LACKING = 1  # count the units that lack `bit`
_GAIN = 2  # set `bit`
_WRITE = 3  # `rank` wrote it: its writer, and its only holder (`bit`)
_OTHER_WRITER = 4  # whether a unit that lacks `bit` was written by another rank than `rank`


@njit(cache=True, _nrt=False, inline="always")
def _sweep(geometry, what, writer, valid, bit, rank, me):
    """Do `what` to every unit of a region (its `_geometry`); the units found (_INVOLVES and
    _OTHER_WRITER: 1 at the first, _LACKING: each)."""
    first, extents, strides, _, run = geometry
    found = 0
    for i3 in range(extents[3]):  # a loop per dim of MAX_JIT_DIMS: multiplies, not divisions
        for i2 in range(extents[2]):
            for i1 in range(extents[1]):
                for i0 in range(extents[0]):
                    start = first + i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]
                    for u in range(start, start + run):
                        if what == _INVOLVES:
                            if valid[u] & bit == 0 and (rank == me or writer[u] == me):
                                return 1
                        elif what == _LACKING:
                            found += valid[u] & bit == 0
                        elif what == _GAIN:
                            valid[u] |= bit
                        elif what == _OTHER_WRITER:
                            if valid[u] & bit == 0 and writer[u] != rank:
                                return 1
                        else:
                            writer[u] = rank
                            valid[u] = bit
    return found


@njit(cache=True, _nrt=False)
def plan(t, slot, n):
    """Where the task whose n tensor params `slot` holds runs, if compiled code can place it
    (module docstring), changing nothing but `t.plan`: its rank, and how many transfers this
    rank enters for it, each a row of `t.plan` (its datatype -1: the caller finds it);
    (-1, 0) to leave the task to Python."""
    rows, kinds = t.arg_desc[slot], t.arg_kind[slot]
    rank = -1
    for p in range(n):
        row = held_row(t, rows[p, D_KEY])
        geometry = _geometry(rows[p], row)
        if geometry[0] < 0:
            return -1, 0
        if rank < 0 and kinds[p] != INPUT:
            rank = array_at(row[H_OWNER], row[H_UNITS], np.int8)[geometry[0]]
    rank = max(rank, 0)
    me = t.meta[M_RANK]
    bit = np.uint64(1) << np.uint64(rank)
    planned = 0
    for p in range(n):
        if kinds[p] != OUTPUT:
            row = held_row(t, rows[p, D_KEY])
            geometry = _geometry(rows[p], row)
            writer = array_at(row[H_WRITER], row[H_UNITS], np.int8)
            valid = array_at(row[H_VALID], row[H_UNITS], np.uint64)
            if _sweep(geometry, _INVOLVES, writer, valid, bit, rank, me):
                peer = _native_peer(t, rows, kinds, n, p, geometry, writer, valid, bit, rank, me)
                if peer < 0:
                    return -1, 0
                entry = t.plan[planned]
                entry[PLAN_PEER] = peer
                entry[PLAN_SENDS] = rank != me
                entry[PLAN_DATATYPE] = -1
                for i in range(DESC_WIDTH):
                    entry[PLAN_DESC + i] = rows[p, i]
                planned += 1
    return rank, planned


@njit(cache=True, _nrt=False, inline="always")
def _native_peer(t, rows, kinds, n, p, geometry, writer, valid, bit, rank, me):
    """The peer of the transfer of read param p, which this rank sends or receives (its
    region lacks `bit`), if it is one native workers post (Placement._transfer): the whole
    region, from one writer, and a region MPI may write if received here; else -1."""
    if not t.meta[M_TRANSFERS]:
        return -1
    if _sweep(geometry, _LACKING, writer, valid, bit, rank, me) != geometry[3] * geometry[4]:
        return -1  # some of it is held already: a mask of the rest, Python's
    source = writer[geometry[0]]
    if source == rank or _sweep(geometry, _OTHER_WRITER, writer, valid, bit, source, me):
        return -1
    key = rows[p, D_KEY]
    for q in range(n):  # a second read of the buffer would find what the first brings: Python's
        if q != p and kinds[q] != OUTPUT and rows[q, D_KEY] == key:
            return -1
    if rank != me:
        return rank  # (sent from here: a unit it lacks is this rank's, and all are one writer's)
    if unwritable(t, rows[p]) != WRITABLE:
        return -1  # the Python way's: its unpacking fails the task (MPI would write it)
    return source


WRITABLE = -2  # what `unwritable` says of a region a task may write


@njit(cache=True, _nrt=False, inline="always")
def unwritable(t, desc):
    """Why a task may not write desc's region: -1, it is read-only memory (an external's);
    d >= 0, its dim d has stride 0, so that its elements are one location (a broadcast view);
    WRITABLE if it may. (An output's check, jit/api.py, and a receive's here.)"""
    key = desc[D_KEY]
    if key < 0 and t.externals[-1 - key, EXTERNAL_WRITEABLE] == 0:
        return -1
    for d in range(desc[D_NDIM]):
        if desc[D_SHAPE + d] == 0:  # no element to write over
            return WRITABLE
    for d in range(desc[D_NDIM]):
        if desc[D_STRIDE + d] == 0 and desc[D_SHAPE + d] > 1:
            return d
    return WRITABLE


@njit(cache=True, _nrt=False)
def apply(t, slot, n, rank, planned):
    """Place the task whose n tensor params `slot` holds on `rank`, as `plan` found, with the
    `planned` transfers of `t.plan`: update the tables and counts as Placement.place would,
    and give each transfer its place in its sequence and its index."""
    rows, kinds = t.arg_desc[slot], t.arg_kind[slot]
    bit = np.uint64(1) << np.uint64(rank)
    me = t.meta[M_RANK]
    for p in range(n):  # Placement.place's order: every read, then every write
        if kinds[p] != OUTPUT:
            row = held_row(t, rows[p, D_KEY])
            geometry = _geometry(rows[p], row)
            writer = array_at(row[H_WRITER], row[H_UNITS], np.int8)
            valid = array_at(row[H_VALID], row[H_UNITS], np.uint64)
            # counted before any is marked: a region may see a unit twice (Holdings.fetch)
            lacking = _sweep(geometry, _LACKING, writer, valid, bit, rank, me)
            if lacking:  # the valid bits change: what Python remembers of them may not hold
                _sweep(geometry, _GAIN, writer, valid, bit, rank, me)
                row[H_WRITTEN] = 1
            t.counts[C_MOVED] += lacking * row[H_UNIT] * row[H_ITEMSIZE]
    for p in range(n):
        if kinds[p] != INPUT:
            row = held_row(t, rows[p, D_KEY])
            geometry = _geometry(rows[p], row)
            _sweep(geometry, _WRITE, array_at(row[H_WRITER], row[H_UNITS], np.int8),
                   array_at(row[H_VALID], row[H_UNITS], np.uint64), bit, rank, me)
            row[H_WRITTEN] = 1
            t.counts[C_WRITTEN] += geometry[3] * geometry[4] * row[H_UNIT] * row[H_ITEMSIZE]
    for j in range(planned):  # Placement._transfer's counts
        entry = t.plan[j]
        peer = entry[PLAN_PEER]
        sequences = C_SENT_TO if entry[PLAN_SENDS] else C_RECEIVED_FROM
        entry[PLAN_SEQUENCE] = t.counts[sequences + peer]
        t.counts[sequences + peer] += 1
        entry[PLAN_INDEX] = t.counts[C_TRANSFERS]
        t.counts[C_TRANSFERS] += 1
        nbytes = entry[PLAN_DESC + D_ITEMSIZE]
        for d in range(entry[PLAN_DESC + D_NDIM]):
            nbytes *= entry[PLAN_DESC + D_SHAPE + d]
        t.counts[C_BYTES_SENT if entry[PLAN_SENDS] else C_BYTES_RECEIVED] += nbytes
    t.counts[C_PLACED + rank] += 1
    t.counts[C_COMPILED] += 1


@njit(cache=True, _nrt=False, inline="always")
def owner_of(t, desc):
    """The owner of desc's first element from its buffer's tables; -1 where they cannot say."""
    row = held_row(t, desc[D_KEY])
    if row[H_UNIT] == 0 or desc[D_ITEMSIZE] != row[H_ITEMSIZE] or desc[D_OFFSET] % row[H_ITEMSIZE]:
        return -1
    entry = desc[D_OFFSET] // row[H_ITEMSIZE] // row[H_UNIT]
    if entry >= row[H_UNITS]:
        return -1
    return array_at(row[H_OWNER], row[H_UNITS], np.int8)[entry]


# A region in units as Python's Holdings hands it to the sweeps: an int64 array of
# UNITS_WIDTH, its first unit, then the extents and unit strides of its grid of runs
# (MAX_JIT_DIMS each, 1 and 0 past its dims), then its units per run.
UNITS_FIRST, UNITS_EXTENTS, UNITS_STRIDES = 0, 1, 1 + MAX_JIT_DIMS
UNITS_RUN = UNITS_STRIDES + MAX_JIT_DIMS
UNITS_WIDTH = UNITS_RUN + 1


@njit(cache=True, _nrt=False, inline="always")
def _unpacked(g):
    """`_geometry`'s tuple of a UNITS_* array (its count of runs unused by the sweeps)."""
    extents, strides = UNITS_EXTENTS, UNITS_STRIDES
    return (g[UNITS_FIRST], (g[extents], g[extents + 1], g[extents + 2], g[extents + 3]),
            (g[strides], g[strides + 1], g[strides + 2], g[strides + 3]), 0, g[UNITS_RUN])


@njit(cache=True, _nrt=False)
def fetch_whole(g, writer, valid, bit):
    """Holdings.fetch's common cases: -1 if every unit of the region holds `bit`; else, if
    every unit lacks it and one rank wrote them all, they gain it and that rank is returned;
    else -2, having changed nothing (some lack it, or several wrote them: Python's masks)."""
    geometry = _unpacked(g)
    lacking = _sweep(geometry, _LACKING, writer, valid, bit, 0, 0)
    if lacking == 0:
        return -1
    units = g[UNITS_RUN]
    for d in range(MAX_JIT_DIMS):
        units *= g[UNITS_EXTENTS + d]
    source = writer[g[UNITS_FIRST]]
    if lacking != units or _sweep(geometry, _OTHER_WRITER, writer, valid, bit, source, 0):
        return -2
    _sweep(geometry, _GAIN, writer, valid, bit, 0, 0)
    return source


@njit(cache=True, _nrt=False)
def write(g, writer, valid, rank):
    """Holdings.wrote: `rank` wrote every unit of the region, and alone holds them."""
    _sweep(_unpacked(g), _WRITE, writer, valid, np.uint64(1) << np.uint64(rank), rank, 0)
