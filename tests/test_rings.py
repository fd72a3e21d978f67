"""The heap ring against a model that shares nothing with it, and the empty-heap case end to end.

The model says what a ring must do in physical terms: buffers are placed in allocation order
at the head, or at offset 0 when they would cross the end; a placement succeeds exactly when
it overlaps no buffer not yet reclaimed; reclaiming is in allocation order; an empty ring
starts again at 0. The core keeps virtual counters instead, so agreeing on every success,
failure and offset is a real check.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import runtime
from hypothesis import given, settings
from hypothesis import strategies as st

import pto_gpu as pto
from pto_gpu.core import rings
from pto_gpu.core import state as cs

ALIGN = 64


class RingModel:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.head = 0
        self.held: list[list] = []  # [start, end, alive] not yet reclaimed, oldest first

    def alloc(self, nbytes: int) -> int | None:
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        if not self.held:
            self.head = 0
        start = self.head if self.head + size <= self.capacity else 0
        end = start + size
        if end > self.capacity or any(s < end and start < e for s, e, _ in self.held):
            return None
        self.held.append([start, end, True])
        self.head = end
        return start

    def release(self, index: int) -> None:
        """Kill the index-th buffer held (alive or not) and reclaim from the oldest."""
        self.held[index][2] = False
        while self.held and not self.held[0][2]:
            self.held.pop(0)


operations = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 4096)),
    st.tuples(st.just("release"), st.integers(0, 1 << 16)),
), max_size=60)


@settings(max_examples=400, deadline=None)
@given(capacity_blocks=st.integers(4, 64), program=operations)
def test_heap_ring_places_and_refuses_exactly_as_the_model(capacity_blocks, program):
    capacity = capacity_blocks * ALIGN
    state = cs.CoreState.allocate(cs.Sizes(heap_bytes=capacity, buffer_window=128))
    model = RingModel(capacity)
    held: list[int] = []  # core sequence numbers of model.held, oldest first
    alive: list[int] = []  # those not yet released
    for op, value in program:
        if op == "alloc":
            expected = model.alloc(value)
            seq = rings.heap_alloc(state.header, state.buffers, value)
            if expected is None:
                assert seq == cs.FULL_HEAP, f"core placed {value} B where the model finds no room"
                continue
            assert seq >= 0, f"core refused {value} B that fit at offset {expected} ({model.held})"
            assert state.buffers["offset"][seq % 128] == expected
            held.append(seq)
            alive.append(seq)
        elif alive:
            seq = alive.pop(value % len(alive))
            model.release(held.index(seq))
            rings.buffer_free(state.header, state.buffers, seq)
            held = held[len(held) - len(model.held):]  # the model reclaims from the oldest
            assert state.head["buf_tail"] == (held[0] if held else state.head["buf_next"])


@pto.kernel(worker=pto.VECTOR)
def fill_bytes(out, value):
    out[...] = value


def test_an_empty_heap_takes_a_buffer_that_would_cross_its_end(executor):
    """4 KiB heap: 3000 B used and freed leaves the head at 3008; 3500 B must start again at 0."""
    rt = runtime(executor, heap_bytes=4096)
    out = np.zeros(3500, np.uint8)

    def orchestration(o, out):
        first = o.alloc(3000, pto.UINT8)
        o.submit(fill_bytes, pto.output(first), 1)
        o.free(first)
        second = o.alloc(3500, pto.UINT8)
        o.submit(fill_bytes, pto.output(second), 7)
        o.submit(copy_bytes, pto.input(second), pto.output(o.external(out)))
        o.free(second)

    rt.run(orchestration, out)
    assert (out == 7).all()


@pto.kernel(worker=pto.VECTOR)
def copy_bytes(src, dst):
    dst[...] = src


def test_a_buffer_that_fits_only_unrounded_is_too_large_for_the_heap(executor):
    """heap_bytes=100: 100 bytes take two 64-byte blocks, which no ring of 100 bytes holds."""
    rt = runtime(executor, heap_bytes=100, validate=True)

    def orchestration(o):
        small = o.alloc(4, pto.UINT8)
        o.submit(fill_bytes, pto.output(small), 1)
        o.free(small)
        o.alloc(100, pto.UINT8)

    with pytest.raises(pto.DeadlockError, match=r"cannot hold a buffer of 100 bytes \(128 in whole 64-byte "
                                                r"blocks\) for \(100,\) UINT8"):
        rt.run(orchestration)
