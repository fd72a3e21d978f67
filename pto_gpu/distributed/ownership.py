"""Who owns a tensor's memory in a distributed run: one rank, or a distribution of it.

An owner is an int rank, a distribution of dim 0 (rows, or heads of a (heads, seq, dim)
array) over ranks 0..ranks-1, or a 2-D block-cyclic distribution of a matrix's tiles over a
grid of ranks (ScaLAPACK's). The owner of a region is the owner of its first element; a task
runs on the owner of what it writes (placement.py), and a tensor's owner holds its newest
data when a run ends.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import RankError


@dataclasses.dataclass(frozen=True)
class BlockRows:
    """Dim 0 cut into `ranks` contiguous blocks of (nearly) equal size, block r on rank r."""

    ranks: int

    def row_owners(self, rows: int) -> np.ndarray:
        return np.arange(rows, dtype=np.int64) * self.ranks // max(rows, 1)


@dataclasses.dataclass(frozen=True)
class BlockCyclic:
    """Dim 0 cut into blocks of `rows`, dealt to ranks 0..ranks-1 in turn."""

    rows: int
    ranks: int

    def row_owners(self, rows: int) -> np.ndarray:
        return np.arange(rows, dtype=np.int64) // self.rows % self.ranks


@dataclasses.dataclass(frozen=True)
class BlockCyclic2D:
    """A matrix cut into blocks of `rows` x `cols`, block (i, j) on the rank at (i mod P,
    j mod Q) of a P x Q grid of ranks numbered row by row (ScaLAPACK's distribution)."""

    rows: int
    cols: int
    grid: tuple[int, int]

    @property
    def ranks(self) -> int:
        return self.grid[0] * self.grid[1]

    def owners(self, shape: tuple[int, ...]) -> np.ndarray:
        """The rank owning each element of a matrix of `shape` (int8: the holdings' type; a
        2048² matrix's table in int64 took 9 ms a run)."""
        p, q = self.grid
        rows = (np.arange(shape[0], dtype=np.int64) // self.rows % p * q).astype(np.int8)
        cols = (np.arange(shape[1], dtype=np.int64) // self.cols % q).astype(np.int8)
        return rows[:, None] + cols[None, :]


Distribution = BlockRows | BlockCyclic
Owner = int | Distribution | BlockCyclic2D


def block_rows(ranks: int) -> BlockRows:
    """Rows (dim 0) in `ranks` contiguous blocks, block r owned by rank r."""
    _check_count("block_rows", "ranks", ranks)
    return BlockRows(int(ranks))


def block_cyclic(rows: int, ranks: int) -> BlockCyclic:
    """Rows (dim 0) in blocks of `rows`, dealt round-robin to ranks 0..ranks-1."""
    _check_count("block_cyclic", "rows", rows)
    _check_count("block_cyclic", "ranks", ranks)
    return BlockCyclic(int(rows), int(ranks))


def block_cyclic_2d(rows: int, cols: int, grid: tuple[int, int]) -> BlockCyclic2D:
    """A matrix in blocks of `rows` x `cols`, dealt over a `grid` = (P, Q) of ranks: block (i, j)
    on rank (i mod P) * Q + (j mod Q)."""
    _check_count("block_cyclic_2d", "rows", rows)
    _check_count("block_cyclic_2d", "cols", cols)
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise RankError(f"pto.block_cyclic_2d: grid={grid!r} must be (P, Q), the process grid's rows and "
                        "columns")
    for value in grid:
        _check_count("block_cyclic_2d", "grid", value)
    return BlockCyclic2D(int(rows), int(cols), (int(grid[0]), int(grid[1])))


def element_owners(owner: Owner, shape: tuple[int, ...], size: int, what: str) -> np.ndarray:
    """The rank owning each element of a tensor of `shape`, as an array that broadcasts to it
    (a distribution of rows: one entry per row), in a run of `size` ranks; RankError naming
    `what` when the owner does not fit the tensor or the run."""
    if isinstance(owner, BlockCyclic2D):
        if owner.ranks > size:
            raise RankError(f"{what}: owner={owner} spreads over {owner.ranks} ranks but the run has {size}")
        if len(shape) != 2:
            raise RankError(f"{what}: owner={owner} deals a matrix's blocks; this tensor is {len(shape)}-d")
        return owner.owners(shape)
    rows = row_owners(owner, shape[0] if shape else 1, size, what)
    return rows.reshape((-1,) + (1,) * max(len(shape) - 1, 0))


def row_owners(owner: Owner, rows: int, size: int, what: str) -> np.ndarray:
    """The rank owning each index of dim 0 of a tensor with `rows` of them, in a run of `size`
    ranks; RankError naming `what` when the owner names a rank the run does not have (or
    deals blocks of a matrix rather than rows)."""
    if isinstance(owner, BlockCyclic2D):
        raise RankError(f"{what}: owner={owner} deals a matrix's blocks, not its rows; this takes a rank, "
                        "pto.block_rows(n) or pto.block_cyclic(rows, n)")
    if isinstance(owner, (BlockRows, BlockCyclic)):
        if owner.ranks > size:
            raise RankError(f"{what}: owner={owner} spreads over {owner.ranks} ranks but the run has {size}")
        return owner.row_owners(rows)
    if isinstance(owner, bool) or not isinstance(owner, (int, np.integer)):
        raise RankError(f"{what}: owner={owner!r} is neither a rank (int) nor a distribution "
                        "(pto.block_rows(n), pto.block_cyclic(rows, n), "
                        "pto.block_cyclic_2d(rows, cols, grid))")
    check_rank(int(owner), size, what, "owner")
    return np.full(rows, int(owner), np.int64)


def check_rank(rank: int, size: int, what: str, name: str) -> None:
    if not 0 <= rank < size:
        raise RankError(f"{what}: {name}={rank} is out of range: the run has ranks 0..{size - 1}")


def _check_count(function: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RankError(f"pto.{function}: {name}={value!r} must be a positive int")
