"""Who owns a tensor's memory in a distributed run: one rank, or a distribution of its rows.

An owner is an int rank or a distribution of dim 0 (rows, or heads of a (heads, seq, dim)
array) over ranks 0..ranks-1. The owner of a region is the owner of its first element; a task
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


Distribution = BlockRows | BlockCyclic
Owner = int | Distribution


def block_rows(ranks: int) -> BlockRows:
    """Rows (dim 0) in `ranks` contiguous blocks, block r owned by rank r."""
    _check_count("block_rows", "ranks", ranks)
    return BlockRows(int(ranks))


def block_cyclic(rows: int, ranks: int) -> BlockCyclic:
    """Rows (dim 0) in blocks of `rows`, dealt round-robin to ranks 0..ranks-1."""
    _check_count("block_cyclic", "rows", rows)
    _check_count("block_cyclic", "ranks", ranks)
    return BlockCyclic(int(rows), int(ranks))


def row_owners(owner: Owner, rows: int, size: int, what: str) -> np.ndarray:
    """The rank owning each index of dim 0 of a tensor with `rows` of them, in a run of `size`
    ranks; RankError naming `what` when the owner names a rank the run does not have."""
    if isinstance(owner, (BlockRows, BlockCyclic)):
        if owner.ranks > size:
            raise RankError(f"{what}: owner={owner} spreads over {owner.ranks} ranks but the run has {size}")
        return owner.row_owners(rows)
    if isinstance(owner, bool) or not isinstance(owner, (int, np.integer)):
        raise RankError(f"{what}: owner={owner!r} is neither a rank (int) nor a distribution "
                        "(pto.block_rows(n), pto.block_cyclic(rows, n))")
    check_rank(int(owner), size, what, "owner")
    return np.full(rows, int(owner), np.int64)


def check_rank(rank: int, size: int, what: str, name: str) -> None:
    if not 0 <= rank < size:
        raise RankError(f"{what}: {name}={rank} is out of range: the run has ranks 0..{size - 1}")


def _check_count(function: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RankError(f"pto.{function}: {name}={value!r} must be a positive int")
