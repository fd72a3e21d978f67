"""An independent dependency oracle: the logical edges of a recorded run, from docs/DESIGN.md's rules.

It shares no code with what it checks (pto_gpu's layout, overlap and core modules, the TensorMap
and its hashing). Each tensor param becomes the exact set of bytes it touches, found by marking
a numpy byte mask through a strided view with the descriptor's byte strides and shape, kept as
sorted byte intervals. Externals are judged by absolute address, so arrays that alias meet
wherever their memory does; a heap allocation is its own owner, so a buffer that reuses freed
memory never meets the one before it. The rules ("Dependency semantics"):
- a read waits for the earlier writers it overlaps; a write for the writers and readers;
- a pair is judged exactly unless either descriptor asks for BOUNDING_BOX (byte ranges then);
- a write whose bytes include all of an earlier entry's bytes removes that entry (writer or
  reader) once the edge is recorded, so a region keeps its last writer and the readers since;
- a task's params are looked up against the entries before it, then its own are added.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import pto_gpu as pto
from pto_gpu.tensor import BufferKind

EXTERNAL_MEMORY = "external memory"  # the owner of every external byte: absolute addresses


@dataclasses.dataclass(frozen=True, eq=False)
class Region:
    """The bytes one tensor param touches: disjoint, non-adjacent intervals [starts, ends)."""

    owner: object
    starts: np.ndarray
    ends: np.ndarray
    bounding_box_only: bool

    @property
    def empty(self) -> bool:
        return len(self.starts) == 0

    @property
    def lo(self) -> int:
        return int(self.starts[0])

    @property
    def hi(self) -> int:
        return int(self.ends[-1])


def region_of(tensor: pto.TensorDescriptor) -> Region:
    itemsize = tensor.dtype.itemsize
    first = tensor.addr + tensor.start_offset * itemsize  # absolute address of element [0, ..., 0]
    owner = tensor.buffer if tensor.buffer.kind == BufferKind.HEAP else EXTERNAL_MEMORY
    bounding_box_only = tensor.overlap == pto.Overlap.BOUNDING_BOX
    shape = tuple(tensor.repeats)
    if 0 in shape:
        nothing = np.empty(0, np.int64)
        return Region(owner, nothing, nothing, bounding_box_only)
    byte_strides = tuple(s * itemsize for s in tensor.strides)
    touched = np.zeros(sum((n - 1) * s for n, s in zip(shape, byte_strides)) + itemsize, np.int8)
    # Every element's bytes, as numpy addresses them: one extra dim walks the bytes of an element.
    np.lib.stride_tricks.as_strided(touched, shape + (itemsize,), byte_strides + (1,))[...] = 1
    steps = np.diff(np.concatenate(([0], touched, [0])))
    return Region(owner, np.flatnonzero(steps == 1) + first, np.flatnonzero(steps == -1) + first,
                  bounding_box_only)


def overlaps(a: Region, b: Region) -> bool:
    if a.owner is not b.owner or a.empty or b.empty or a.lo >= b.hi or b.lo >= a.hi:
        return False
    if a.bounding_box_only or b.bounding_box_only:
        return True
    # For each interval of b, the first interval of a ending after b's starts: do they meet?
    index = np.searchsorted(a.ends, b.starts, side="right")
    inside = index < len(a.starts)
    return bool(np.any(a.starts[index[inside]] < b.ends[inside]))


def covers(outer: Region, inner: Region) -> bool:
    """Whether every byte of inner is a byte of outer (exactly, whatever the overlap levels)."""
    if outer.owner is not inner.owner or inner.empty or outer.empty:
        return False
    if inner.lo < outer.lo or inner.hi > outer.hi:
        return False
    # outer's intervals never touch, so each of inner's must lie inside a single one of them.
    index = np.searchsorted(outer.ends, inner.starts, side="right")
    if np.any(index >= len(outer.starts)):
        return False
    return bool(np.all((outer.starts[index] <= inner.starts) & (inner.ends <= outer.ends[index])))


@dataclasses.dataclass(frozen=True, eq=False)
class Entry:
    task: int
    wrote: bool
    region: Region


def expected_edges(tasks) -> set[tuple[int, int]]:
    """The (producer, consumer) edges docs/DESIGN.md gives for tasks (objects with id and params)."""
    live: list[Entry] = []
    edges: set[tuple[int, int]] = set()
    for task in sorted(tasks, key=lambda t: t.id):
        params = [(p.writes, region_of(p.value)) for p in task.params if p.kind != pto.ParamKind.SCALAR]
        covered: set[int] = set()
        for writes, region in params:
            for entry in live:
                if (entry.wrote or writes) and overlaps(entry.region, region):
                    edges.add((entry.task, task.id))
                    if writes and covers(region, entry.region):
                        covered.add(id(entry))
        live = [e for e in live if id(e) not in covered]
        live += [Entry(task.id, writes, region) for writes, region in params]
    return edges


def mismatch(tasks, edges) -> str:
    """'' when edges are exactly the oracle's, else which edges are missing and which extra."""
    expected, got = expected_edges(tasks), set(edges)
    if expected == got:
        return ""
    return (f"edges the rules require but the graph lacks: {sorted(expected - got)}; "
            f"edges the graph has that the rules do not give: {sorted(got - expected)}")
