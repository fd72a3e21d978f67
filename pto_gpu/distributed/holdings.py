"""Which rank owns, last wrote, and holds the newest data of each element of one buffer.

Every rank keeps the same Holdings for every buffer, updated at submission in submission
order, so every rank reaches the same conclusions about what must move where without
talking. Per element: `owner` (from o.external / o.alloc), `writer` (the rank whose task wrote
it last, or its owner before that) and `valid`, a bit per rank holding its newest version.
A write by rank w leaves only w valid; a read by rank r of elements it lacks is a transfer
from their writer, after which r holds them too, so each version reaches each rank once.

The tables are kept per *unit* of `unit` consecutive elements, the coarsest granularity at
which the owners and every region seen so far start and end on unit boundaries: one entry
for a buffer one rank owns and tasks use whole, one per tile row for a tiled matrix in
block rows (a 256-column tile of a 2048² matrix: 16K entries, not 4M). A region that cuts a
unit splits the tables once (`_refine`); masks leave as masks over elements.

The common transitions (a read of a region the reader holds whole, or lacks whole and one
rank wrote; a write) run compiled placement's sweeps over the units
(jit/placing.py: one implementation for Python's placement and compiled code's); the others
(masks of some elements, several writers, regions of more dims than compiled code has) run
here, on views of the tables.

Tiled orchestrations read the same tiles again and again, so each region's AND of valid
bits is remembered (`_full`) until a write to the buffer changes what it could be; and they
write one tile again and again (an accumulator), so a write the tables already show (the
region and rank of the last write, nothing changed since: `_last_write`) changes nothing.
A region's place in units depends on its layout and the unit only, not on the buffer or the
run, so it is worked out once per process (`_GEOMETRIES`): every run's tiles, and every
accumulator allocated alike, are the same regions again.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import DataType
from ..errors import RankError
from ..jit.context import MAX_RANKS
from ..jit.placing import MAX_JIT_DIMS as SWEPT_DIMS
from ..jit.placing import (
    UNITS_EXTENTS,
    UNITS_FIRST,
    UNITS_RUN,
    UNITS_STRIDES,
    UNITS_WIDTH,
    fetch_whole,
    write,
)
from ..tensor import TensorDescriptor

# (unit, itemsize, a region's layout key without its buffer's) -> its UNITS_* array, or None if
# the sweeps cannot take it: the 2048² matmul's 256 regions a run took ~1.5 ms to work out anew.
_GEOMETRIES: dict[tuple, np.ndarray | None] = {}
KEPT_GEOMETRIES = 4096


def element_view(array: np.ndarray, tensor: TensorDescriptor, itemsize: int) -> np.ndarray:
    """A per-element table of a buffer (flat, one entry per `itemsize` bytes) seen through
    `tensor`'s layout."""
    _check_itemsize(tensor, itemsize)
    offset = tensor.byte_offset // itemsize * array.itemsize
    return np.ndarray(tensor.shape, array.dtype, buffer=array, offset=offset,
                      strides=tuple(s * array.itemsize for s in tensor.strides))


def _check_itemsize(tensor: TensorDescriptor, itemsize: int) -> None:
    if tensor.dtype.itemsize != itemsize or tensor.byte_offset % itemsize:
        raise RankError(f"{tensor!r}: a distributed run tracks each buffer in elements of the dtype it "
                        f"was first used with ({itemsize} bytes); views of it in another dtype "
                        "are not supported")


def runs_of(tensor: TensorDescriptor, itemsize: int) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """The region as runs of consecutive elements: (first element, the shape and element
    strides of the grid of runs, elements per run), dims of one element left out."""
    outer_shape: list[int] = []
    outer_strides: list[int] = []
    run, contiguous = 1, True
    for extent, stride in zip(reversed(tensor.shape), reversed(tensor.strides)):
        if extent == 1:
            continue
        if contiguous and stride == run:  # the dims so far and this one are consecutive elements
            run *= extent
        else:
            contiguous = False
            outer_shape.insert(0, extent)
            outer_strides.insert(0, stride)
    return tensor.byte_offset // itemsize, tuple(outer_shape), tuple(outer_strides), run


class Holdings:
    """See the module docstring. `owners` gives the owners in order, each entry covering
    count / len(owners) consecutive elements (a matrix's row owners, say), or is one int for
    one owner of every element; the elements are of `dtype`."""

    def __init__(self, owners: np.ndarray | int, count: int, dtype: DataType, size: int):
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.count = count  # elements of the buffer
        if size > MAX_RANKS:
            raise RankError(f"a distributed run supports at most {MAX_RANKS} ranks, not {size}")
        owners = np.array([owners] if isinstance(owners, int) else owners, np.int8)
        self.unit = max(count, 1) // len(owners)  # elements per table entry
        # The coarsest unit the owners allow: the gcd of the places where the owner changes.
        changes = np.flatnonzero(owners[1:] != owners[:-1]) + 1
        coarser = math.gcd(len(owners), *changes.tolist())
        owners = owners[::coarser].copy()  # its own table, contiguous for the views
        self.unit *= coarser
        self.owner = owners
        self.writer = owners.copy()
        self.valid = np.left_shift(np.uint64(1), owners.astype(np.uint64))
        self._full: dict[tuple, int] = {}  # region layout -> AND of its elements' valid bits
        self._views: dict[tuple, tuple] = {}  # (layout, shape, strides) -> (elements per entry, views)
        self._last_write: tuple | None = None  # (region layout, rank) while the tables are as it left them
        self._addresses: tuple[int, int, int] | None = None  # of owner, writer, valid (`addresses`)

    def copy(self) -> Holdings:
        """Another Holdings of the same owners, in the state this one was made in (every element
        valid at its owner, its owner its writer): a run's, from a table made for an earlier one."""
        fresh = object.__new__(Holdings)
        fresh.dtype, fresh.itemsize, fresh.count = self.dtype, self.itemsize, self.count
        fresh.unit = self.unit
        fresh.owner = self.owner  # never written in place (_refine makes new tables)
        fresh.writer, fresh.valid = self.writer.copy(), self.valid.copy()
        fresh._full, fresh._views, fresh._last_write = {}, {}, None
        fresh._addresses = None
        return fresh

    def addresses(self) -> tuple[int, int, int]:
        """Where the owner, writer and valid tables are, for compiled placement (remembered
        until a split makes new tables: `.ctypes.data` takes ~1 µs, and a compiled matmul's
        placement asks for a buffer's tables at every Python service, ~260 times a run)."""
        if self._addresses is None:
            self._addresses = tuple(table.ctypes.data for table in (self.owner, self.writer, self.valid))
        return self._addresses

    def forget(self) -> None:
        """Drop what is remembered of the tables (each region's AND of valid bits, the last
        write), which someone else wrote: compiled placement (jit/placing.py)."""
        self._full.clear()
        self._last_write = None

    # --- the tables seen through a region --------------------------------------------------
    def _in_units(self, tensor: TensorDescriptor) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
        """runs_of's grouping of the region in units (splitting the tables first if the region
        cuts a unit)."""
        _check_itemsize(tensor, self.itemsize)
        first, shape, strides, run = runs_of(tensor, self.itemsize)
        unit = math.gcd(self.unit, first, run, *strides)
        if unit != self.unit:
            self._refine(unit)
        return first // unit, shape, tuple(s // unit for s in strides), run // unit

    def _region(self, tensor: TensorDescriptor) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray]:
        """The region's layout key and its views of the owner, writer and valid tables, in
        units (splitting the tables first if the region cuts a unit)."""
        key = tensor.layout_key
        # The views are in the region's own order of dims, which its layout key leaves out (a
        # transposed region has its original's): masks made through another's would be transposed.
        ordered = (key, tensor.shape, tensor.strides)
        cached = self._views.get(ordered)
        if cached is not None and cached[0] == self.unit:
            return key, *cached[1]
        first, shape, strides, run = self._in_units(tensor)
        shape, strides = shape + (run,), strides + (1,)
        views = tuple(np.ndarray(shape, table.dtype, buffer=table, offset=first * table.itemsize,
                                 strides=tuple(s * table.itemsize for s in strides))
                      for table in (self.owner, self.writer, self.valid))
        self._views[ordered] = (self.unit, views)
        return key, *views

    def _geometry(self, key: tuple, tensor: TensorDescriptor) -> np.ndarray | None:
        """The region as the sweeps take it (jit/placing.py's UNITS_* array); None if its grid of
        runs has more dims than they sweep."""
        if tensor.dtype.itemsize == self.itemsize:  # (else _in_units says what is wrong)
            try:
                return _GEOMETRIES[self.unit, self.itemsize, key[1:]]
            except KeyError:
                pass
        first, shape, strides, run = self._in_units(tensor)
        geometry = None
        if len(shape) <= SWEPT_DIMS:
            geometry = np.zeros(UNITS_WIDTH, np.int64)
            geometry[UNITS_FIRST], geometry[UNITS_RUN] = first, run
            geometry[UNITS_EXTENTS:UNITS_STRIDES] = 1
            geometry[UNITS_EXTENTS:UNITS_EXTENTS + len(shape)] = shape
            geometry[UNITS_STRIDES:UNITS_STRIDES + len(strides)] = strides
        if len(_GEOMETRIES) >= KEPT_GEOMETRIES:
            _GEOMETRIES.clear()
        _GEOMETRIES[self.unit, self.itemsize, key[1:]] = geometry  # (the unit a split made)
        return geometry

    def _refine(self, unit: int) -> None:
        """Split every table entry into entries of `unit` elements."""
        factor = self.unit // unit
        tables = (self.owner, self.writer, self.valid)
        self.owner, self.writer, self.valid = (np.repeat(table, factor) for table in tables)
        self.unit = unit
        self._addresses = None

    def _elements(self, units: np.ndarray, tensor: TensorDescriptor) -> np.ndarray:
        """A per-unit array of a region's view as one per element, in the region's shape."""
        return np.repeat(units.reshape(-1), self.unit).reshape(tensor.shape)

    # --- what the placement asks ------------------------------------------------------------
    def owner_of(self, tensor: TensorDescriptor) -> int:
        """The owner of the region's first element."""
        return int(self.owner[tensor.byte_offset // self.itemsize // self.unit])

    def owners_of(self, tensor: TensorDescriptor) -> np.ndarray:
        """The owners of the region's elements."""
        return self._elements(self._region(tensor)[1], tensor)

    def fetch(self, tensor: TensorDescriptor, rank: int) -> list[tuple[int, np.ndarray | None]]:
        """What `rank` must receive to read `tensor`: (source rank, mask over the tensor's
        elements, None for all of them) per source; from now on `rank` holds them."""
        key = tensor.layout_key
        full = self._full.get(key)
        if full is not None and full >> rank & 1 or tensor.size == 0:
            return []
        geometry = self._geometry(key, tensor)
        if geometry is not None:
            source = fetch_whole(geometry, self.writer, self.valid, np.uint64(1 << rank))
            if source != -2:
                # at most the region's AND now (it had `full`, and has gained the bit)
                self._full[key] = (full or 0) | 1 << rank
                if source == -1:
                    return []
                self._last_write = None
                return [(int(source), None)]
        key, _, writers, valid = self._region(tensor)
        bit = valid.dtype.type(1 << rank)
        missing = (valid & bit) == 0
        if not missing.any():  # rank gained them by another region's transfer since `full` was noted
            self._full[key] = int(np.bitwise_and.reduce(valid, axis=None))
            return []
        needed = []  # a transfer per writer of the missing elements, a mask unless it is all of them
        for source in np.flatnonzero(np.bincount(writers[missing].astype(np.intp))):
            mask = missing & (writers == source)
            needed.append((int(source), None if mask.all() else self._elements(mask, tensor)))
        valid[missing] |= bit
        self._last_write = None
        # Other regions' remembered ANDs can only have gained `bit` from this: a stale entry
        # costs a recount, never a wrong answer.
        self._full[key] = int(np.bitwise_and.reduce(valid, axis=None))
        return needed

    def wrote(self, tensor: TensorDescriptor, rank: int) -> None:
        """`rank` wrote the region: it alone holds the newest version."""
        if self._last_write == (tensor.layout_key, rank) or tensor.size == 0:
            return  # (an accumulator's every product after the first)
        key = tensor.layout_key
        geometry = self._geometry(key, tensor)
        if geometry is not None:
            write(geometry, self.writer, self.valid, rank)
        else:
            _, _, writers, valid = self._region(tensor)
            writers[...] = rank
            valid[...] = 1 << rank
        self._full.clear()
        self._full[key] = 1 << rank
        self._last_write = (key, rank)

    def stale_at_owner(self) -> list[tuple[int, int, np.ndarray | None]]:
        """(writer, owner, flat mask over the buffer's elements, None for all) for the elements
        whose owner lacks their newest version."""
        stale = (self.valid >> self.owner.astype(self.valid.dtype)) & 1 == 0
        if not stale.any():
            return []
        if stale.all() and len(set(self.writer.tolist())) == 1 and len(set(self.owner.tolist())) == 1:
            return [(int(self.writer[0]), int(self.owner[0]), None)]
        pairs = np.unique(np.stack([self.writer[stale], self.owner[stale]]), axis=1)
        return [(int(w), int(o), np.repeat(stale & (self.writer == w) & (self.owner == o), self.unit))
                for w, o in pairs.T]
