"""Which rank owns, last wrote, and holds the newest data of each element of one buffer.

Every rank keeps the same Holdings for every buffer, updated at submission in submission
order, so every rank reaches the same conclusions about what must move where without
talking. Per element: `owner` (from o.external / o.alloc), `writer` (the rank whose task wrote
it last, or its owner before that) and `valid`, a bit per rank holding its newest version.
A write by rank w leaves only w valid; a read by rank r of elements it lacks is a transfer
from their writer, after which r holds them too, so each version reaches each rank once.

Tiled orchestrations read the same tiles again and again, so each region's AND of valid
bits is remembered (`_full`) until a write to the buffer changes what it could be.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DataType
from ..errors import RankError
from ..tensor import TensorDescriptor

# The narrowest unsigned type with a bit per rank.
_BITS = ((8, np.uint8), (16, np.uint16), (32, np.uint32), (64, np.uint64))


def valid_dtype(size: int) -> type:
    for bits, dtype in _BITS:
        if size <= bits:
            return dtype
    raise RankError(f"a distributed run supports at most 64 ranks, not {size}")


def element_view(array: np.ndarray, tensor: TensorDescriptor, itemsize: int) -> np.ndarray:
    """A per-element table of a buffer (flat, one entry per `itemsize` bytes) seen through
    `tensor`'s layout."""
    if tensor.dtype.itemsize != itemsize or tensor.byte_offset % itemsize:
        raise RankError(f"{tensor!r}: a distributed run tracks each buffer in elements of the dtype it "
                        f"was first used with ({itemsize} bytes); views of it in another dtype "
                        "are not supported")
    offset = tensor.byte_offset // itemsize * array.itemsize
    return np.ndarray(tensor.shape, array.dtype, buffer=array, offset=offset,
                      strides=tuple(s * array.itemsize for s in tensor.strides))


class Holdings:
    """See the module docstring. `owners` gives every element's owner, flat over the buffer,
    whose elements are of `dtype` (an int for one owner of every element: the tables are then
    made only when a region smaller than the buffer first makes the elements differ, which a
    tile-sized accumulator never does)."""

    def __init__(self, owners: np.ndarray | int, count: int, dtype: DataType, size: int):
        """`owners`: int8, one per element, or one int for all."""
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.count = count  # elements of the buffer
        self._valid_type = valid_dtype(size)
        self._full: dict[bytes, int] = {}  # region layout -> AND of its elements' valid bits
        # Uniform: (owner, writer, valid bits) shared by every element, until _tables() splits it.
        self._uniform: tuple[int, int, int] | None = None
        if isinstance(owners, int):
            self._uniform = (owners, owners, 1 << owners)
            self.owner = self.writer = self.valid = None
        else:
            self.owner = owners
            self.writer = owners.copy()
            self.valid = np.left_shift(self._valid_type(1), owners.astype(self._valid_type, copy=False))

    def _tables(self) -> None:
        owner, writer, valid = self._uniform
        self.owner = np.full(self.count, owner, np.int8)
        self.writer = np.full(self.count, writer, np.int8)
        self.valid = np.full(self.count, valid, self._valid_type)
        self._uniform = None

    def _whole(self, tensor: TensorDescriptor) -> bool:
        return tensor.byte_offset == 0 and tensor.size == self.count and tensor.is_contiguous()

    def view(self, array: np.ndarray, tensor: TensorDescriptor) -> np.ndarray:
        """`array` (one of the per-element tables) seen through `tensor`'s layout."""
        return element_view(array, tensor, self.itemsize)

    def owner_of(self, tensor: TensorDescriptor) -> int:
        """The owner of the region's first element."""
        if self._uniform is not None:
            return self._uniform[0]
        return int(self.owner[tensor.byte_offset // self.itemsize])

    def owners_of(self, tensor: TensorDescriptor) -> np.ndarray:
        """The owners of the region's elements."""
        if self._uniform is not None:
            return np.full(tensor.shape, self._uniform[0], np.int8)
        return self.view(self.owner, tensor)

    def fetch(self, tensor: TensorDescriptor, rank: int) -> list[tuple[int, np.ndarray | None]]:
        """What `rank` must receive to read `tensor`: (source rank, mask over the tensor's
        elements, None for all of them) per source; from now on `rank` holds them."""
        if tensor.size == 0:
            return []
        if self._uniform is not None:
            owner, writer, valid = self._uniform
            if valid >> rank & 1:
                return []
            if self._whole(tensor):
                self._uniform = (owner, writer, valid | 1 << rank)
                return [(writer, None)]
            self._tables()
        key = tensor.layout.tobytes()
        full = self._full.get(key)
        if full is not None and full >> rank & 1:
            return []
        valid = self.view(self.valid, tensor)
        bit = valid.dtype.type(1 << rank)
        missing = (valid & bit) == 0
        if not missing.any():  # rank gained them by another region's transfer since `full` was noted
            self._full[key] = int(np.bitwise_and.reduce(valid, axis=None))
            return []
        writers = self.view(self.writer, tensor)
        if missing.all() and (writers == writers.flat[0]).all():  # the common case: one tile, one writer
            needed = [(int(writers.flat[0]), None)]
        else:
            needed = []
            for source in np.flatnonzero(np.bincount(writers[missing].astype(np.intp))):
                mask = missing & (writers == source)
                needed.append((int(source), None if mask.all() else mask))
        valid[missing] |= bit
        # Other regions' remembered ANDs can only have gained `bit` from this: a stale entry
        # costs a recount, never a wrong answer.
        self._full[key] = int(np.bitwise_and.reduce(valid, axis=None))
        return needed

    def wrote(self, tensor: TensorDescriptor, rank: int) -> None:
        """`rank` wrote the region: it alone holds the newest version."""
        if tensor.size == 0:
            return
        if self._uniform is not None:
            if self._whole(tensor):
                self._uniform = (self._uniform[0], rank, 1 << rank)
                return
            self._tables()
        self.view(self.writer, tensor)[...] = rank
        self.view(self.valid, tensor)[...] = 1 << rank
        self._full.clear()
        self._full[tensor.layout.tobytes()] = 1 << rank

    def stale_at_owner(self) -> list[tuple[int, int, np.ndarray | None]]:
        """(writer, owner, flat mask, None for all) for the elements whose owner lacks their
        newest version."""
        if self._uniform is not None:
            owner, writer, valid = self._uniform
            return [] if valid >> owner & 1 else [(writer, owner, None)]
        stale = (self.valid >> self.owner.astype(self.valid.dtype)) & 1 == 0
        if not stale.any():
            return []
        pairs = np.unique(np.stack([self.writer[stale], self.owner[stale]]), axis=1)
        return [(int(w), int(o), stale & (self.writer == w) & (self.owner == o)) for w, o in pairs.T]
