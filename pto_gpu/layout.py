"""The canonical byte layout of a tensor: one int64 row that the numba core compares.

A descriptor's bytes, relative to its owning buffer's base, are the "leaves"
``lo + sum(i_k * stride_k) + [0, run)`` for ``0 <= i_k < count_k``. Dims of one
element are dropped, dims are sorted by byte stride (largest first, so transposed views
look like their originals), and dims that continue the contiguous innermost run or the
next dim are merged. Two descriptors of different dtypes are then compared in bytes.
"""

from __future__ import annotations

from .errors import LayoutError

MAX_DIMS = 6  # canonical dims after merging; descriptors may have more before merging

# Columns of a layout row.
R_OWNER = 0  # owning buffer key: heap buffer sequence number (>= 0) or external key (< 0)
R_LO = 1  # first byte, relative to the owner's base
R_HI = 2  # one past the last byte (== R_LO for an empty tensor)
R_LEVEL = 3  # Overlap level of this descriptor
R_RUN = 4  # bytes in each contiguous leaf
R_NDIM = 5  # canonical dims
R_SHIFT = 6  # log2 of the owner's TensorMap block size (see block_shift)
R_STRIDE = 7  # R_STRIDE + k: byte stride of dim k
R_COUNT = R_STRIDE + MAX_DIMS  # R_COUNT + k: count of dim k
ROW_WIDTH = R_COUNT + MAX_DIMS
P_KIND = ROW_WIDTH  # a submitted param is its layout row plus its kind (INPUT, OUTPUT, INOUT)
PARAM_WIDTH = ROW_WIDTH + 1


MIN_BLOCK_SHIFT = 12
BLOCKS_PER_OWNER_LOG2 = 8


def block_shift(owner_nbytes: int) -> int:
    """The TensorMap hashes regions by (owner, block): about 256 blocks per owner, so a tile
    lookup walks the entries near it rather than every entry of its array. Blocks are 4 KB at
    least, a trade measured on compiled dry builds: 64-byte blocks gave each row of a small
    array a chain of its own (20,000 one-row tasks on 4 KB arrays: 5.7 against 8.4 ms), but
    made a whole-buffer read after row writes probe every block (a 16 KB tile written by rows,
    then read whole: 2.2x the cost per task); the LLaMA build did not change."""
    return max(MIN_BLOCK_SHIFT, (owner_nbytes - 1).bit_length() - BLOCKS_PER_OWNER_LOG2)


def layout_row(owner: int, owner_nbytes: int, byte_offset: int, itemsize: int, strides, repeats,
               level: int) -> tuple:
    """The canonical layout row of a strided tensor (strides and repeats in elements)."""
    shift = block_shift(owner_nbytes)
    if 0 in repeats:
        return (owner, byte_offset, byte_offset, level, 0, 0, shift) + _PADS[MAX_DIMS] * 2
    dims = [(s * itemsize, r) for s, r in zip(strides, repeats) if r != 1]
    if len(dims) > 1:
        dims.sort(reverse=True)
    run = itemsize
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    merged_strides: list[int] = []
    merged_counts: list[int] = []
    for stride, count in dims:
        if merged_strides and merged_strides[-1] == stride * count:
            merged_strides[-1] = stride
            merged_counts[-1] *= count
        else:
            merged_strides.append(stride)
            merged_counts.append(count)
    ndim = len(merged_strides)
    if ndim > MAX_DIMS:
        raise LayoutError(f"a tensor layout needs {ndim} dims after merging; at most {MAX_DIMS}")
    extent = run
    for stride, count in zip(merged_strides, merged_counts):
        extent += (count - 1) * stride
    pad = _PADS[MAX_DIMS - ndim]
    return (owner, byte_offset, byte_offset + extent, level, run, ndim, shift, *merged_strides, *pad,
            *merged_counts, *pad)


_PADS = [(0,) * n for n in range(MAX_DIMS + 1)]
