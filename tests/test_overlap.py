"""Overlap judgement against brute force: the exact sets of bytes two descriptors touch."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pto_gpu.dtypes import DataType
from pto_gpu.layout import R_HI, R_LO, R_NDIM, layout_row
from pto_gpu.overlap import Overlap, _walk, row_covers, rows_overlap
from pto_gpu.tensor import Buffer, BufferKind, TensorDescriptor, contiguous_strides

BUFFER_BYTES = 4096
BUFFER = Buffer(0, BufferKind.HEAP, 0, BUFFER_BYTES)
DTYPES = [DataType.UINT8, DataType.FLOAT16, DataType.FLOAT32, DataType.INT64]


def byte_set(t: TensorDescriptor) -> set[int]:
    """Every byte a descriptor touches, by enumerating its elements."""
    size = t.dtype.itemsize
    out = set()
    for index in np.ndindex(*t.shape):
        element = t.byte_offset + sum(i * s for i, s in zip(index, t.byte_strides))
        out.update(range(element, element + size))
    return out


@st.composite
def views(draw):
    """A random view: a 1- to 3-d array of one dtype, sliced with steps, maybe transposed."""
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 8), min_size=ndim, max_size=ndim)))
    elements = BUFFER_BYTES // dtype.itemsize
    total = int(np.prod(shape))
    offset = draw(st.integers(0, elements - total))
    t = TensorDescriptor(BUFFER, 0, offset, contiguous_strides(shape), shape, dtype)
    key = []
    for n in shape:
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        key.append(slice(start, stop, draw(st.integers(1, 3))))
    t = t[tuple(key)]
    if draw(st.booleans()):
        t = t.T
    return t


@settings(max_examples=1500, deadline=None)
@given(views(), views())
def test_strided_exact_equals_brute_force(a, b):
    assert rows_overlap(a.layout, b.layout) == bool(byte_set(a) & byte_set(b))


@settings(max_examples=500, deadline=None)
@given(views(), views())
def test_bounding_box_never_false_negative(a, b):
    judged = rows_overlap(a.with_overlap(Overlap.BOUNDING_BOX).layout, b.layout)
    assert judged or not (byte_set(a) & byte_set(b))
    lo_a, hi_a = a.byte_range
    lo_b, hi_b = b.byte_range
    assert judged == (a.size > 0 and b.size > 0 and lo_a < hi_b and lo_b < hi_a)


@settings(max_examples=1000, deadline=None)
@given(views(), views())
def test_covers_is_never_wrong(a, b):
    # A "covers" verdict removes a TensorMap entry, so it must be true; "no" may be conservative.
    if row_covers(a.layout, b.layout):
        assert byte_set(b) <= byte_set(a)


@settings(max_examples=1000, deadline=None)
@given(views(), views())
def test_covers_fast_paths_agree_with_the_walk(a, b):
    # Covering decides which TensorMap entries go, so a fast path must not change a verdict.
    outer, inner = a.layout, b.layout
    lo, hi = inner[R_LO], inner[R_HI]
    if lo < hi and outer[R_LO] <= lo and hi <= outer[R_HI] and outer[R_NDIM] > 0:
        assert row_covers(outer, inner) == _walk(inner, lo, hi, outer, True)
    if outer[R_LO] < outer[R_HI] and outer[R_NDIM] > 0:
        assert row_covers(outer, outer) == _walk(outer, outer[R_LO], outer[R_HI], outer, True)


def test_covers_recognises_common_cases():
    t = TensorDescriptor(BUFFER, 0, 0, (32, 1), (32, 32), DataType.FLOAT32)
    assert row_covers(t.layout, t.layout)
    assert row_covers(t.layout, t[3:9, 4:20].layout)
    assert row_covers(t[2:10, 4:20].layout, t[3:9, 4:20].layout)
    assert row_covers(t[:, ::2].layout, t[1:5, 4:20:2].layout)
    assert not row_covers(t[2:10, 4:20].layout, t[3:11, 4:20].layout)
    assert row_covers(t.T.layout, t[5].layout)


def test_interleaved_columns_do_not_overlap():
    t = TensorDescriptor(BUFFER, 0, 0, (16, 1), (16, 16), DataType.FLOAT32)
    even, odd = t[:, 0::2], t[:, 1::2]
    assert not rows_overlap(even.layout, odd.layout)
    assert rows_overlap(even.with_overlap(Overlap.BOUNDING_BOX).layout, odd.layout)
    # The same bytes viewed as uint8 overlap the float32 column they alias.
    as_bytes = TensorDescriptor(BUFFER, 0, 0, (64, 1), (16, 64), DataType.UINT8)
    assert rows_overlap(as_bytes[:, 4:8].layout, odd.layout)
    assert not rows_overlap(as_bytes[:, 8:12].layout, odd.layout)


def test_descriptor_views_and_contiguity():
    t = TensorDescriptor(BUFFER, 0, 0, (32, 1), (32, 32), DataType.FLOAT32)
    assert t.is_contiguous() and t[4:8].is_contiguous() and t[4:5, 3:9].is_contiguous()
    assert not t[:, :8].is_contiguous() and not t.T.is_contiguous() and not t[::2].is_contiguous()
    assert t[4:8].reshape(2, 64).strides == (64, 1)
    assert t[:, 4:8].reshape(32, 2, 2).strides == (32, 2, 1)
    assert t.transpose(1, 0).strides == t.T.strides == (1, 32)
    assert t[2:10:3, 5].shape == (3,) and t[2:10:3, 5].start_offset == 2 * 32 + 5
    assert t[-1, -2].start_offset == 31 * 32 + 30


@settings(max_examples=300, deadline=None)
@given(views(), st.sampled_from(list(Overlap)))
def test_a_layout_row_is_its_own_buffers_whatever_buffers_of_its_layout_came_first(t, level):
    """Descriptors remember the rest of a layout row by their layout (tensor.py): the same view
    of another buffer, of the same size or not, made after it, has the row layout_row makes
    for that buffer, its key included."""
    t = t.with_overlap(level)
    for key, nbytes in ((0, BUFFER_BYTES), (-3, BUFFER_BYTES), (7, 512 * BUFFER_BYTES)):  # (another shift)
        buffer = Buffer(key, BufferKind.HEAP if key >= 0 else BufferKind.EXTERNAL, 0, nbytes)
        view = TensorDescriptor(buffer, 0, t.start_offset, t.strides, t.repeats, t.dtype).with_overlap(level)
        assert view.layout_key == layout_row(key, nbytes, view.byte_offset, view.dtype.itemsize, view.strides,
                                             view.repeats, int(level))


@settings(max_examples=500, deadline=None)
@given(views(), st.integers(-64, 64))
def test_a_shifted_view_is_the_view_made_at_its_new_offset(t, elements):
    """TensorDescriptor.shifted moves a view's layout row rather than making it again (the
    interpreted orchestration's windows): it must be the row a view made at the new offset
    has, and touch the same bytes moved."""
    last = t.byte_range[1] // t.dtype.itemsize
    elements = max(-t.start_offset, min(elements, BUFFER_BYTES // t.dtype.itemsize - last))
    moved = t.shifted(elements)
    made = TensorDescriptor(BUFFER, 0, t.start_offset + elements, t.strides, t.repeats, t.dtype)
    assert moved.layout_key == made.layout_key
    assert (moved.shape, moved.strides, moved.version) == (t.shape, t.strides, t.version)
    assert byte_set(moved) == {b + elements * t.dtype.itemsize for b in byte_set(t)}
