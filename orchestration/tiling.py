"""Row tilings of a sequence: fixed tiles, and the binary loop expansion of spec 003 §2.5–2.6.

The binary expansion splits a dynamic trip count n (at most max_range, a power of two) into
power-of-two blocks, one per set bit of n rounded down to min_range, plus a residual loop
for what is left. With adaptive tile sizes each block level picks its own tile: the LLaMA
layer uses 64-row tiles in the blocks and 32-row tiles in the residual, which halves the
number of tiles and quarters the attention pairs.
"""

from __future__ import annotations


def binary_blocks(n: int, max_range: int, min_range: int) -> list[tuple[int, int, int]]:
    """The blocks of iterations 0..n as (start, count, level); level 0 marks the residual."""
    if max_range & (max_range - 1) or min_range & (min_range - 1) or min_range > max_range:
        raise ValueError(f"max_range={max_range} and min_range={min_range} must be powers of two, "
                         "min_range <= max_range")
    if not 0 <= n <= max_range:
        raise ValueError(f"trip count {n} exceeds max_range={max_range}")
    residual = n & (min_range - 1)
    quantised = n - residual
    blocks, start, level = [], 0, max_range
    while level >= min_range:
        if quantised & level:
            blocks.append((start, level, level))
            start += level
        level //= 2
    if residual:
        blocks.append((start, residual, 0))
    return blocks


def fixed_tiles(length: int, rows: int) -> list[tuple[int, int]]:
    """(first row, rows) tiles of `rows` rows; the last may be partial."""
    return [(start, min(rows, length - start)) for start in range(0, length, rows)]


def adaptive_tiles(length: int, base_rows: int = 32, block_rows: int = 64, max_range: int = 4096,
                   min_range: int = 16) -> list[tuple[int, int]]:
    """Tiles from the binary expansion over base tiles: block_rows in blocks, base_rows in the residual."""
    base_tiles = -(-length // base_rows)
    scale = block_rows // base_rows
    tiles = []
    for start, count, level in binary_blocks(base_tiles, max_range, min_range):
        rows = base_rows if level == 0 else block_rows
        step = 1 if level == 0 else scale
        for tile in range(start, start + count, step):
            first = tile * base_rows
            if first < length:
                tiles.append((first, min(rows, length - first)))
    return tiles
