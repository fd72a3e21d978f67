"""Overlap judgement between two layout rows of one owner, at the most precise common level.

BOUNDING_BOX compares byte ranges. STRIDED_EXACT walks the leaves (contiguous byte runs)
of one tensor, pruned to the other's byte range, and asks whether each meets the other,
which for a nested layout (every view that slicing, `.T` and `reshape` make) is a
successor search in O(dims): exact, including interleaved, transposed and
differently-typed views. A non-nested layout is judged conservatively: never a false
negative. `covers` answers whether every byte of one tensor lies in the other; a "no"
there is allowed to be conservative, since it only keeps an older TensorMap entry alive.
"""

from __future__ import annotations

import enum

from numba import njit
from numba.cpython.unsafe.tuple import tuple_setitem

from .layout import MAX_DIMS, R_COUNT, R_HI, R_LEVEL, R_LO, R_NDIM, R_RUN, R_STRIDE

# Per-dim scratch is a tuple (tuple_setitem makes the next one): the core calls these
# functions from code compiled without numba's runtime, which cannot allocate arrays.
_DIMS = (0,) * MAX_DIMS
_EXTENTS = (0,) * (MAX_DIMS + 1)


class Overlap(enum.IntEnum):
    """How precisely a descriptor's region is judged; a pair uses the lower of the two."""

    BOUNDING_BOX = 0
    STRIDED_EXACT = 1


@njit(cache=True, _nrt=False)
def _index_range(base, stride, count, inner_extent, lo, hi):
    """Indices i in [0, count) whose sub-block [base + i*stride, + inner_extent) meets [lo, hi)."""
    first = -((-(lo - base - inner_extent + 1)) // stride)
    last = (hi - 1 - base) // stride
    return max(first, 0), min(last, count - 1)


@njit(cache=True, _nrt=False)
def _extents(row):
    """extent[k]: bytes spanned by one sub-block at dim k (extent[ndim] is the leaf run).

    Returns whether the layout is nested (each stride at least the extent below it), which
    makes its leaves disjoint and sorted in index order, and the extents.
    """
    nd = row[R_NDIM]
    extent = tuple_setitem(_EXTENTS, nd, row[R_RUN])
    nested = True
    for k in range(nd - 1, -1, -1):
        stride = row[R_STRIDE + k]
        nested = nested and stride >= extent[k + 1]
        extent = tuple_setitem(extent, k, (row[R_COUNT + k] - 1) * stride + extent[k + 1])
    return nested, extent


@njit(cache=True, _nrt=False)
def _leaf_at_or_after(row, extent, point):
    """Start of the first leaf that ends after `point` (a nested layout, point < row's end)."""
    offset = row[R_LO]
    before = point < offset
    for k in range(row[R_NDIM]):
        if before:
            break  # every deeper index is 0: the block's first leaf starts at `offset`
        stride = row[R_STRIDE + k]
        i = min((point - offset) // stride, row[R_COUNT + k] - 1)
        if offset + i * stride + extent[k + 1] <= point:
            i += 1  # `point` is in the gap after sub-block i; i + 1 exists, see below
            before = True
        offset += i * stride
    # The gap case never runs past the last index: the enclosing block ends after `point`.
    return offset


@njit(cache=True, _nrt=False)
def _meets(row, extent, nested, lo, hi):
    """Whether [lo, hi) shares a byte with `row` (conservatively True for non-nested layouts)."""
    if lo >= row[R_HI] or hi <= row[R_LO]:
        return False
    if row[R_NDIM] == 0 or not nested:
        return True
    return _leaf_at_or_after(row, extent, lo) < hi


@njit(cache=True, _nrt=False)
def _inside_one_leaf(row, extent, nested, lo, hi):
    """Whether [lo, hi) lies within a single leaf of `row` (conservatively False if not nested)."""
    if lo < row[R_LO] or hi > row[R_HI]:
        return False
    if row[R_NDIM] == 0:
        return True
    if not nested:
        return False
    start = _leaf_at_or_after(row, extent, lo)
    return start <= lo and hi <= start + row[R_RUN]


@njit(cache=True, _nrt=False)
def _walk(row, lo, hi, other, coverage):
    """Walk the leaves of `row` that meet [lo, hi), testing each against `other`.

    coverage False: True when any such leaf meets `other` (exact intersection).
    coverage True: True when every leaf lies inside one leaf of `other`; [lo, hi) must
    then span all of `row`.
    """
    other_nested, other_extent = _extents(other)
    nd = row[R_NDIM]
    run = row[R_RUN]
    if nd == 0:
        start = row[R_LO]
        if coverage:
            return _inside_one_leaf(other, other_extent, other_nested, start, start + run)
        return _meets(other, other_extent, other_nested, start, start + run)
    extent = _extents(row)[1]
    base = tuple_setitem(_DIMS, 0, row[R_LO])
    first, end = _index_range(base[0], row[R_STRIDE], row[R_COUNT], extent[1], lo, hi)
    idx = tuple_setitem(_DIMS, 0, first)
    last = tuple_setitem(_DIMS, 0, end)
    k = 0
    while True:
        if idx[k] > last[k]:
            if k == 0:
                return coverage
            k -= 1
            idx = tuple_setitem(idx, k, idx[k] + 1)
            continue
        offset = base[k] + idx[k] * row[R_STRIDE + k]
        if k == nd - 1:
            if coverage:
                if not _inside_one_leaf(other, other_extent, other_nested, offset, offset + run):
                    return False
            elif _meets(other, other_extent, other_nested, offset, offset + run):
                return True
            idx = tuple_setitem(idx, k, idx[k] + 1)
            continue
        k += 1
        base = tuple_setitem(base, k, offset)
        first, end = _index_range(offset, row[R_STRIDE + k], row[R_COUNT + k], extent[k + 1], lo, hi)
        idx = tuple_setitem(idx, k, first)
        last = tuple_setitem(last, k, end)


@njit(cache=True, _nrt=False, inline="always")
def _row_and_column(offset, stride):
    """divmod(offset, stride) for stride > 0, without dividing when the offset is under one
    row either way (tiles side by side): a 64-bit division is ~40 cycles."""
    if 0 <= offset < stride:
        return 0, offset
    if -stride <= offset < 0:
        return -1, offset + stride
    return divmod(offset, stride)


@njit(cache=True, _nrt=False)
def _same_lattice_overlap(a, b):
    """Exact test for two nested rows of one outer dim with the same stride (2-D tiles).

    A = {a0 + i*S + [0, ra)}, B = {b0 + j*S + [0, rb)}. With b0 - a0 = q*S + m, B's run of
    row j starts at column m of A's row j + q and may spill into row j + q + 1.
    """
    stride = a[R_STRIDE]
    q, m = _row_and_column(b[R_LO] - a[R_LO], stride)
    na, nb = a[R_COUNT], b[R_COUNT]
    if m < a[R_RUN] and max(q, 0) <= min(q + nb - 1, na - 1):
        return True
    return m + b[R_RUN] > stride and max(q + 1, 0) <= min(q + nb, na - 1)


@njit(cache=True, _nrt=False, inline="always")
def _ranges_meet(a, b):
    """Whether two layout rows' byte ranges share a byte (neither empty)."""
    return a[R_LO] < b[R_HI] and b[R_LO] < a[R_HI] and a[R_LO] != a[R_HI] and b[R_LO] != b[R_HI]


@njit(cache=True, _nrt=False, inline="always")  # a TensorMap walk mostly ends in these tests
def rows_overlap(a, b):
    """Whether two layout rows of the same owner share a byte, at their common level."""
    if not _ranges_meet(a, b):
        return False
    # Both non-empty: each holds its first byte, so a common start is a shared byte.
    if a[R_LO] == b[R_LO] or min(a[R_LEVEL], b[R_LEVEL]) == 0 or (a[R_NDIM] == 0 and b[R_NDIM] == 0):
        return True
    return _layouts_overlap(a, b)


@njit(cache=True, _nrt=False)
def rows_share_bytes(a, b):
    """Whether two layout rows of the same owner share a byte, judged by their leaves whatever
    their levels (conservatively only for a non-nested layout): which bytes, not their order."""
    if not _ranges_meet(a, b):
        return False
    if a[R_LO] == b[R_LO] or (a[R_NDIM] == 0 and b[R_NDIM] == 0):
        return True
    return _layouts_overlap(a, b)


@njit(cache=True, _nrt=False)
def _layouts_overlap(a, b):
    """rows_overlap for two non-empty rows with intersecting byte ranges, judged by leaves."""
    if (a[R_NDIM] == 1 and b[R_NDIM] == 1 and a[R_STRIDE] == b[R_STRIDE]
            and a[R_STRIDE] >= a[R_RUN] and b[R_STRIDE] >= b[R_RUN]):
        return _same_lattice_overlap(a, b)
    # Walk the tensor with fewer leaves, pruned to the other's byte range.
    leaves_a = 1
    leaves_b = 1
    for k in range(a[R_NDIM]):
        leaves_a *= a[R_COUNT + k]
    for k in range(b[R_NDIM]):
        leaves_b *= b[R_COUNT + k]
    if leaves_a <= leaves_b:
        return _walk(a, b[R_LO], b[R_HI], b, False)
    return _walk(b, a[R_LO], a[R_HI], a, False)


@njit(cache=True, _nrt=False)
def row_covers(outer, inner):
    """Whether every byte of `inner` is a byte of `outer` (False may be conservative)."""
    if inner[R_LO] == inner[R_HI]:
        return True
    if inner[R_LO] < outer[R_LO] or inner[R_HI] > outer[R_HI]:
        return False
    if outer[R_NDIM] == 0:
        return True
    # Fast paths for a tile written again or inside a wider one; each gives _walk's verdict.
    if _identical(outer, inner):
        return _nested(outer)
    if (outer[R_NDIM] == 1 and inner[R_NDIM] == 1 and outer[R_STRIDE] == inner[R_STRIDE]
            and outer[R_STRIDE] >= outer[R_RUN] and inner[R_STRIDE] >= inner[R_RUN]):
        # Inner leaf j starts at column m of outer leaf j + q (q >= 0: the ranges nest).
        q, m = _row_and_column(inner[R_LO] - outer[R_LO], outer[R_STRIDE])
        return m + inner[R_RUN] <= outer[R_RUN] and q + inner[R_COUNT] <= outer[R_COUNT]
    return _walk(inner, inner[R_LO], inner[R_HI], outer, True)


@njit(cache=True, inline="always")
def _identical(a, b):
    """Whether two rows (of one owner) describe the same leaves."""
    nd = a[R_NDIM]
    if a[R_LO] != b[R_LO] or a[R_HI] != b[R_HI] or a[R_RUN] != b[R_RUN] or nd != b[R_NDIM]:
        return False
    for k in range(nd):
        if a[R_STRIDE + k] != b[R_STRIDE + k] or a[R_COUNT + k] != b[R_COUNT + k]:
            return False
    return True



@njit(cache=True, _nrt=False, inline="always")
def _nested(row):
    """_extents' first answer without building the extents (the common case of a tile
    written again asks only this)."""
    extent = row[R_RUN]
    for k in range(row[R_NDIM] - 1, -1, -1):
        if row[R_STRIDE + k] < extent:
            return False
        extent += (row[R_COUNT + k] - 1) * row[R_STRIDE + k]
    return True
