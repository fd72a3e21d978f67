"""DistArray: an array of a distributed run of which each rank holds only the rows it owns.

Every rank reserves the whole array's address range (an anonymous mapping: untouched pages
cost no memory) and touches only its own rows, so its memory is its share. The rest of the
runtime sees an ordinary array (`o.external(d)`): the same addresses on every rank, so
dependencies, holdings and transfers work unchanged; a task that reads rows another rank owns
receives them into this rank's range first, as for any array of a distributed run. When a
run ends, the pages of rows this rank does not own are given back (`release_remote`), so
between runs each rank holds its own rows only.

`DistArray.scatter` and `gather` move a whole array from and to one rank; `.local` views this
rank's blocks with their global row ranges.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import mmap

import numpy as np

from ..dtypes import as_dtype
from ..errors import ParamError, RankError
from .ownership import Owner, row_owners

PAGE = mmap.PAGESIZE
_TAG = 7301  # scatter's and gather's messages (a distributed run's transfers use other tags)


@dataclasses.dataclass(frozen=True)
class Block:
    """Rows start..stop of the array, held by this rank: `view` is them."""

    start: int
    stop: int
    view: np.ndarray


class DistArray:
    """An array over the ranks of `comm` (an mpi4py communicator): dim 0 cut by `owner` (a
    rank, pto.block_rows(n) or pto.block_cyclic(rows, n)), each rank holding its own rows.
    Made zero; see the module docstring."""

    def __init__(self, shape: int | tuple[int, ...], dtype: object, owner: Owner, comm: object):
        self.shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if not self.shape or any(d < 0 for d in self.shape):
            raise ParamError(f"DistArray: shape={shape!r} must be one or more sizes >= 0")
        self.dtype = as_dtype(dtype).numpy
        self.comm, self.owner = comm, owner
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.row_owners = row_owners(owner, self.shape[0], self.size, f"DistArray(shape={self.shape})")
        self.row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        # Anonymous memory is zero and takes a page of memory only when first touched.
        whole_pages = max(-(-self.nbytes // PAGE), 1) * PAGE  # so the last page can be given back too
        self._map = mmap.mmap(-1, whole_pages, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # The whole range, which the runtime takes as the array (o.external): only the owned
        # rows hold data between runs.
        self.whole = np.frombuffer(self._map, self.dtype, math.prod(self.shape)).reshape(self.shape)
        self.blocks = _blocks(self.row_owners, self.rank)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    @property
    def local(self) -> list[Block]:
        """This rank's rows: a view of each run of consecutive rows it owns, with its place."""
        return [Block(start, stop, self.whole[start:stop]) for start, stop in self.blocks]

    @property
    def resident_nbytes(self) -> int:
        """The bytes of the array this rank holds in memory now (its pages that are resident)."""
        pages = len(self._map) // PAGE
        vector = (ctypes.c_ubyte * pages)()
        address = self.whole.ctypes.data  # the mapping's start: page aligned
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(len(self._map)), vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed on a DistArray's range")
        return sum(v & 1 for v in vector) * PAGE

    def release_remote(self) -> None:
        """Give back the pages that hold only rows this rank does not own (received for a
        run's tasks): their contents are stale once the run has ended."""
        owned = [(start * self.row_bytes, stop * self.row_bytes) for start, stop in self.blocks]
        edges = [0, *(edge for block in owned for edge in block), len(self._map)]
        for lo, hi in zip(edges[::2], edges[1::2]):  # the gaps between owned byte ranges
            first, last = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE
            if last > first:
                self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    # --- whole arrays --------------------------------------------------------------------
    @classmethod
    def scatter(cls, array: np.ndarray | None, owner: Owner, comm: object, root: int = 0) -> DistArray:
        """The DistArray of `array` (given on `root`, None elsewhere), each rank sent its rows."""
        rank, size = comm.Get_rank(), comm.Get_size()
        if not 0 <= root < size:
            raise RankError(f"DistArray.scatter: root={root} is out of range: the communicator has ranks "
                            f"0..{size - 1}")
        meta: object = None
        if rank == root:
            if array is None:
                meta = f"DistArray.scatter: rank {root} (the root) must pass the array"
            else:
                array = np.ascontiguousarray(array)
                meta = (array.shape, array.dtype)
        meta = comm.bcast(meta, root=root)
        if isinstance(meta, str):  # on every rank: none waits for rows that never come
            raise ParamError(meta)
        shape, dtype = meta
        dist = cls(shape, dtype, owner, comm)
        if rank == root:
            for start, stop, holder in _runs(dist.row_owners):
                if holder == root:
                    dist.whole[start:stop] = array[start:stop]
                else:
                    comm.Send(_bytes(array[start:stop]), dest=holder, tag=_TAG)
        else:
            for start, stop in dist.blocks:
                comm.Recv(_bytes(dist.whole[start:stop]), source=root, tag=_TAG)
        return dist

    def gather(self, root: int = 0) -> np.ndarray | None:
        """The whole array on `root` (a new numpy array), None on the other ranks."""
        if not 0 <= root < self.size:
            raise RankError(f"DistArray.gather: root={root} is out of range: the communicator has ranks "
                            f"0..{self.size - 1}")
        if self.rank != root:
            for start, stop in self.blocks:
                self.comm.Send(_bytes(self.whole[start:stop]), dest=root, tag=_TAG)
            return None
        out = np.empty(self.shape, self.dtype)
        for start, stop, holder in _runs(self.row_owners):
            if holder == root:
                out[start:stop] = self.whole[start:stop]
            else:
                self.comm.Recv(_bytes(out[start:stop]), source=holder, tag=_TAG)
        return out

    def owner_for(self, owner: Owner | None) -> Owner:
        """The owner an o.external of this array takes: its own; another one is refused."""
        if owner is not None and not np.array_equal(
                row_owners(owner, self.shape[0], self.size, repr(self)), self.row_owners):
            raise RankError(f"o.external({self!r}, owner={owner}): a DistArray's rows are where its owner "
                            f"({self.owner}) put them; pass no owner, or that one")
        return self.owner

    def __repr__(self) -> str:
        return (f"DistArray(shape={self.shape}, dtype={self.dtype}, owner={self.owner}, "
                f"rank {self.rank} of {self.size})")


def _bytes(rows: np.ndarray) -> np.ndarray:
    """Consecutive rows as bytes: MPI moves any element type (bfloat16 included) that way."""
    return rows.reshape(-1).view(np.uint8)


def _runs(owners: np.ndarray) -> list[tuple[int, int, int]]:
    """(start, stop, rank) of each run of consecutive rows one rank owns."""
    if len(owners) == 0:
        return []
    changes = [0, *(np.flatnonzero(owners[1:] != owners[:-1]) + 1).tolist(), len(owners)]
    return [(lo, hi, int(owners[lo])) for lo, hi in zip(changes, changes[1:])]


def _blocks(owners: np.ndarray, rank: int) -> list[tuple[int, int]]:
    return [(start, stop) for start, stop, holder in _runs(owners) if holder == rank]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
