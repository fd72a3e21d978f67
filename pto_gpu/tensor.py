"""Buffers and tensor descriptors: the immutable values that orchestrations pass to tasks.

A `Buffer` is one owned region of memory: a heap allocation or an external array (resolved
to the allocation that owns it). A `TensorDescriptor` is a strided view of a buffer in
elements (index 0 outermost), with a dtype, a version and an overlap level. Slicing,
`.T` and `reshape` return new descriptors over the same memory, checked against the
buffer's bounds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct

import numpy as np

from .dtypes import DataType
from .errors import LayoutError
from .layout import PARAM_WIDTH, R_HI, R_LO, layout_row
from .overlap import Overlap

MAX_REMEMBERED_SLICES = 4096  # per parent descriptor


class BufferKind(enum.IntEnum):
    HEAP = 0
    EXTERNAL = 1


@dataclasses.dataclass(eq=False, slots=True)
class Buffer:
    """One owned region of memory; `key` identifies it to the TensorMap.

    Heap buffers have key = their allocation sequence number (>= 0); externals a negative key.
    `freed` and `newest_version` are the orchestrator's bookkeeping for misuse checks.
    """

    key: int
    kind: BufferKind
    base: int  # byte address of the first byte
    nbytes: int
    memory: object = None  # what keeps external memory alive (the caller's root array)
    freed: bool = False
    newest_version: int = 0  # the newest version a task has written
    newest_handle: int = 0  # the newest version version_inc has made (single assignment)
    writeable: bool = True  # False for a read-only external array

    def __repr__(self) -> str:
        return f"Buffer({self.kind.name.lower()} #{self.key}, {self.nbytes} B at {self.base:#x})"


class TensorDescriptor:
    """An immutable strided view of a buffer. See the module docstring."""

    __slots__ = ("buffer", "addr", "start_offset", "strides", "repeats", "dtype", "version",
                 "overlap", "_row", "_layout", "_slices", "_param_rows", "_desc", "_host_views")

    def __init__(self, buffer: Buffer, addr: int, start_offset: int, strides: tuple[int, ...],
                 repeats: tuple[int, ...], dtype: DataType, version: int = 0,
                 overlap: Overlap = Overlap.STRIDED_EXACT):
        strides, repeats = tuple(int(s) for s in strides), tuple(int(r) for r in repeats)
        if len(strides) != len(repeats):
            raise LayoutError(f"strides {strides} and repeats {repeats} differ in length")
        if any(s < 0 for s in strides) or start_offset < 0:
            raise LayoutError("negative strides and offsets are not supported")
        _init(self, buffer, addr, start_offset, strides, repeats, dtype, version, overlap)
        lo, hi = self.byte_range
        if hi > lo and (lo < 0 or hi > buffer.nbytes):
            raise LayoutError(f"tensor {self.shape} at bytes {lo}..{hi} lies outside its {buffer!r}")

    @staticmethod
    def checked_elsewhere(buffer: Buffer, addr: int, strides: tuple[int, ...], repeats: tuple[int, ...],
                          dtype: DataType, version: int) -> TensorDescriptor:
        """A descriptor whose layout was checked where it was made (a compiled orchestration's
        view operations check bounds as slicing does), so it is not checked again: a compiled
        task's tensors are made into descriptors whenever Python runs or issues it."""
        made = object.__new__(TensorDescriptor)
        _init(made, buffer, addr, 0, strides, repeats, dtype, version, Overlap.STRIDED_EXACT)
        return made

    def _replace(self, start_offset=None, strides=None, repeats=None, version=None,
                 overlap=None) -> TensorDescriptor:
        """A derived view; callers guarantee it stays inside the buffer (slices are bounds-checked)."""
        derived = object.__new__(TensorDescriptor)
        _init(derived, self.buffer, self.addr,
              self.start_offset if start_offset is None else start_offset,
              self.strides if strides is None else strides,
              self.repeats if repeats is None else repeats, self.dtype,
              self.version if version is None else version,
              self.overlap if overlap is None else overlap)
        return derived

    def shifted(self, elements: int) -> TensorDescriptor:
        """The same view moved by `elements` (a tile of a loop's next iteration); the caller
        guarantees it stays inside the buffer. Its layout row is this one's moved, not made
        again: moving a view changes its bytes, never their pattern."""
        moved = self._replace(start_offset=self.start_offset + elements)
        row = self.layout_key
        delta = elements * self.dtype.itemsize
        _SET(moved, "_row", (*row[:R_LO], row[R_LO] + delta, row[R_HI] + delta, *row[R_HI + 1:]))
        return moved

    def __setattr__(self, name, value):
        raise AttributeError("TensorDescriptor is immutable; slicing returns a new one")

    def __repr__(self) -> str:
        return (f"Tensor({self.dtype.name} {self.shape}, {self.buffer!r}, offset={self.start_offset}, "
                f"strides={self.strides}, v{self.version})")

    # --- shape -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.repeats

    @property
    def ndim(self) -> int:
        return len(self.repeats)

    @property
    def size(self) -> int:
        return math.prod(self.repeats)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def byte_offset(self) -> int:
        """Byte offset of element [0, ..., 0] from the owning buffer's base."""
        return self.addr - self.buffer.base + self.start_offset * self.dtype.itemsize

    @property
    def byte_strides(self) -> tuple[int, ...]:
        return tuple(s * self.dtype.itemsize for s in self.strides)

    @property
    def byte_range(self) -> tuple[int, int]:
        """[first byte, one past the last byte), relative to the buffer's base."""
        lo = self.byte_offset
        if self.size == 0:
            return lo, lo
        extent = sum((r - 1) * s for r, s in zip(self.repeats, self.strides)) + 1
        return lo, lo + extent * self.dtype.itemsize

    def is_contiguous(self) -> bool:
        """Whether the elements are dense in row-major order (dims of one element ignored)."""
        expected = 1
        for stride, count in zip(reversed(self.strides), reversed(self.repeats)):
            if count != 1 and stride != expected:
                return False
            expected *= count
        return True

    # --- views -------------------------------------------------------------------------
    def __getitem__(self, key) -> TensorDescriptor:
        if not isinstance(key, tuple):
            key = (key,)
        # Orchestrations slice the same tiles over and over (A[i, k] for every j); descriptors
        # are immutable, so each parent remembers its slices, with their layouts computed once.
        # (an index not an int is kept with its type: True and 1.0 equal 1 as keys)
        memo_key = tuple([(k.start, k.stop, k.step) if type(k) is slice else k if type(k) is int
                          else (type(k), k) for k in key])
        if self._slices is None:
            _SET(self, "_slices", {})
        try:
            view = self._slices.get(memo_key)
        except TypeError:  # unhashable: not an index _slice takes, which it says
            return self._slice(key)
        if view is None:
            view = self._slice(key)
            if len(self._slices) < MAX_REMEMBERED_SLICES:
                self._slices[memo_key] = view
        return view

    def _slice(self, key: tuple) -> TensorDescriptor:
        if len(key) > self.ndim:
            raise LayoutError(f"{len(key)} indices for a {self.ndim}-d tensor {self.shape}")
        offset = self.start_offset
        strides: list[int] = []
        repeats: list[int] = []
        for dim, index in enumerate(key):
            stride, count = self.strides[dim], self.repeats[dim]
            if type(index) is slice and index.step is None and type(index.start) is int \
                    and type(index.stop) is int and 0 <= index.start <= index.stop <= count:
                offset += index.start * stride  # the common tile slice, checked as it stands
                strides.append(stride)
                repeats.append(index.stop - index.start)
            elif isinstance(index, slice):
                start, stop, step = _checked_slice(index, count, dim)
                offset += start * stride
                strides.append(stride * step)
                repeats.append(max(0, -(-(stop - start) // step)))
            elif isinstance(index, (bool, np.bool_)):  # numpy's mask of a new axis, not row 0 or 1
                raise LayoutError(f"unsupported index {index!r}: use ints and slices")
            elif isinstance(index, (int, np.integer)):
                i = int(index) + count if index < 0 else int(index)
                if not 0 <= i < count:
                    raise LayoutError(f"index {index} out of bounds for dim {dim} of size {count}")
                offset += i * stride
            else:
                raise LayoutError(f"unsupported index {index!r}: use ints and slices")
        strides.extend(self.strides[len(key):])
        repeats.extend(self.repeats[len(key):])
        return self._replace(start_offset=offset, strides=tuple(strides), repeats=tuple(repeats))

    @property
    def T(self) -> TensorDescriptor:
        return self._replace(strides=self.strides[::-1], repeats=self.repeats[::-1])

    def transpose(self, *axes: int) -> TensorDescriptor:
        """Permute the dims (all reversed when no axes are given), as numpy does."""
        if not axes:
            return self.T
        if sorted(axes) != list(range(self.ndim)):
            raise LayoutError(f"transpose axes {axes} are not a permutation of {self.ndim} dims")
        return self._replace(strides=tuple(self.strides[a] for a in axes),
                             repeats=tuple(self.repeats[a] for a in axes))

    def reshape(self, *shape) -> TensorDescriptor:
        """A view with a new shape, where the layout allows it without a copy."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _resolve_shape(shape, self.size)
        strides = _reshape_strides(self.strides, self.repeats, shape)
        if strides is None:
            raise LayoutError(f"cannot reshape {self.shape} with strides {self.strides} "
                              f"to {shape} without copying")
        return self._replace(strides=strides, repeats=shape)

    def with_overlap(self, level: Overlap) -> TensorDescriptor:
        return self._replace(overlap=Overlap(level))

    def with_version(self, version: int) -> TensorDescriptor:
        return self._replace(version=version)

    @property
    def layout(self) -> np.ndarray:
        """The canonical layout row the numba core compares (see layout.py), computed once."""
        if self._layout is None:
            _SET(self, "_layout", np.array(self.layout_key, np.int64))
        return self._layout

    @property
    def layout_key(self) -> tuple[int, ...]:
        """The layout row as a tuple: equal for two descriptors exactly when their layouts are."""
        row = self._row
        if row is None:
            # The row but for its buffer's key, from the layout alone: a tiled orchestration's
            # fresh descriptors of each run are the same tiles, of the same arrays, again.
            layout = (self.buffer.nbytes, self.byte_offset, self.dtype.itemsize, self.strides, self.repeats,
                      int(self.overlap))
            rest = _ROW_RESTS.get(layout)
            if rest is None:
                if len(_ROW_RESTS) >= KEPT_ROW_RESTS:
                    _ROW_RESTS.clear()
                rest = _ROW_RESTS[layout] = layout_row(0, *layout)[1:]
            row = (self.buffer.key, *rest)
            _SET(self, "_row", row)
        return row

    def param_row(self, kind: int) -> bytes:
        """The row the core takes for this tensor as a param of `kind` (INPUT, OUTPUT, INOUT):
        its layout row, then the kind, as bytes, made once per kind, since submit copies it
        whole into the rows it hands the core."""
        if self._param_rows is None:
            _SET(self, "_param_rows", {})
        row = self._param_rows.get(kind)
        if row is None:
            row = self._param_rows[kind] = _PARAM_ROW.pack(*self.layout_key, kind)
        return row


_SET = object.__setattr__
# layout_row's row past its first column (the buffer's key), by the layout it depends on:
# working it out took ~4 µs a descriptor, a fifth of a distributed tiled matmul's submit.
_ROW_RESTS: dict[tuple, tuple[int, ...]] = {}
KEPT_ROW_RESTS = 4096
_PARAM_ROW = struct.Struct(f"={PARAM_WIDTH}q")  # a layout row and a kind, as numpy's int64 bytes


def _init(t, buffer, addr, start_offset, strides, repeats, dtype, version, overlap) -> None:
    _SET(t, "buffer", buffer)
    _SET(t, "addr", addr)
    _SET(t, "start_offset", start_offset)
    _SET(t, "strides", strides)
    _SET(t, "repeats", repeats)
    _SET(t, "dtype", dtype)
    _SET(t, "version", version)
    _SET(t, "overlap", overlap)
    _SET(t, "_row", None)
    _SET(t, "_layout", None)
    _SET(t, "_slices", None)
    _SET(t, "_param_rows", None)
    _SET(t, "_desc", None)  # its compiled descriptor's bytes, made once (jit/descriptor.desc_bytes)
    _SET(t, "_host_views", None)  # its numpy views, writeable and read-only (backends/cpu.py)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for count in reversed(shape):
        strides.append(step)
        step *= count
    return tuple(reversed(strides))


def _checked_slice(index: slice, count: int, dim: int) -> tuple[int, int, int]:
    step = 1 if index.step is None else int(index.step)
    if step <= 0:
        raise LayoutError(f"slice step {step} on dim {dim}: only positive steps are supported")
    start = 0 if index.start is None else int(index.start)
    stop = count if index.stop is None else int(index.stop)
    start = start + count if start < 0 else start
    stop = stop + count if stop < 0 else stop
    if not (0 <= start <= count and 0 <= stop <= count):
        raise LayoutError(f"slice {index.start}:{index.stop} out of bounds for dim {dim} of size {count}")
    return start, max(start, stop), step


def _resolve_shape(shape: tuple, size: int) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise LayoutError(f"invalid shape {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise LayoutError(f"cannot infer -1 in {shape} for {size} elements")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if math.prod(shape) != size:
        raise LayoutError(f"cannot reshape {size} elements to {shape}")
    return shape


def _reshape_strides(strides, repeats, shape):
    """Strides for `shape` over the same elements in row-major order, or None if a copy is needed.

    Old and new dims are matched in groups of equal element count; each old group must be
    one strided run (stride[i] == stride[i+1] * count[i+1]) so it can be split any way.
    """
    old = [(s, r) for s, r in zip(strides, repeats) if r != 1]
    if math.prod(shape) == 0:
        return contiguous_strides(shape)
    new_strides = [0] * len(shape)
    new_dims = [i for i, n in enumerate(shape) if n != 1]
    oi = ni = 0
    while oi < len(old) and ni < len(new_dims):
        o_end, n_end = oi + 1, ni + 1
        o_prod, n_prod = old[oi][1], shape[new_dims[ni]]
        while o_prod != n_prod:
            if o_prod < n_prod:
                o_prod *= old[o_end][1]
                o_end += 1
            else:
                n_prod *= shape[new_dims[n_end]]
                n_end += 1
        for k in range(oi, o_end - 1):
            if old[k][0] != old[k + 1][0] * old[k + 1][1]:
                return None
        step = old[o_end - 1][0]
        for k in range(n_end - 1, ni - 1, -1):
            new_strides[new_dims[k]] = step
            step *= shape[new_dims[k]]
        oi, ni = o_end, n_end
    for i, n in enumerate(shape):
        if n == 1:
            new_strides[i] = 1
    return tuple(new_strides)
