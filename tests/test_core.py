"""Unit tests of the numba core: task ring, heap ring, dep-list pool, TensorMap."""

import numpy as np

from pto_gpu.core import rings
from pto_gpu.core import state as cs
from pto_gpu.core.complete import complete
from pto_gpu.core.tensormap import chain_head, tm_free_count, tm_insert, tm_make_room, tm_remove
from pto_gpu.layout import R_OWNER, layout_row


def make(**sizes):
    return cs.CoreState.allocate(cs.Sizes(**sizes))


def test_task_ring_allocates_in_order_and_stalls_when_full():
    s = make(task_window=4)
    ids = [rings.task_ring_alloc(s.header, s.tasks) for _ in range(5)]
    assert ids == [0, 1, 2, 3, cs.FULL_TASKS]
    # Completing task 1 first retires nothing (task 0 still live); then task 0 frees both slots.
    s.tasks["state"][1] = cs.COMPLETED
    rings.retire_completed(s.header, s.tasks)
    assert s.head["last_alive"] == 0
    s.tasks["state"][0] = cs.COMPLETED
    rings.retire_completed(s.header, s.tasks)
    assert s.head["last_alive"] == 2
    assert [rings.task_ring_alloc(s.header, s.tasks) for _ in range(3)] == [4, 5, cs.FULL_TASKS]
    assert s.tasks["id"][4 & 3] == 4  # wrapped onto slot 0


def test_heap_ring_aligns_wraps_without_splitting_and_reclaims_in_order():
    s = make(heap_bytes=1024, buffer_window=8)
    a = rings.heap_alloc(s.header, s.buffers, 100)  # 128 bytes
    b = rings.heap_alloc(s.header, s.buffers, 500)  # 512 bytes
    c = rings.heap_alloc(s.header, s.buffers, 300)  # 320 bytes: 960 in use
    offsets = [int(s.buffers["offset"][x]) for x in (a, b, c)]
    assert offsets == [0, 128, 640]
    assert all(o % 64 == 0 for o in offsets)
    assert rings.heap_alloc(s.header, s.buffers, 100) == cs.FULL_HEAP
    # Freeing b does not move the tail past the still-live a: allocation order.
    rings.buffer_free(s.header, s.buffers, b)
    assert rings.heap_alloc(s.header, s.buffers, 100) == cs.FULL_HEAP
    rings.buffer_free(s.header, s.buffers, a)
    assert s.head["heap_tail"] == 640
    # 64 bytes remain before the end: a 128-byte buffer skips to offset 0 rather than split.
    d = rings.heap_alloc(s.header, s.buffers, 128)
    assert s.buffers["offset"][d % 8] == 0
    assert s.buffers["vstart"][d % 8] == 1024


def test_buffer_stays_until_its_last_user_completes():
    s = make(heap_bytes=1024)
    seq = rings.heap_alloc(s.header, s.buffers, 1024)
    task = rings.task_ring_alloc(s.header, s.tasks)
    s.tasks["nbuf"][task] = 1
    s.tasks["bufs"][task, 0] = seq
    s.tasks["fanout"][task] = -1
    s.buffers["refs"][seq] += 1
    rings.buffer_free(s.header, s.buffers, seq)
    assert rings.heap_alloc(s.header, s.buffers, 64) == cs.FULL_HEAP
    complete(s.header, s.tasks, s.buffers, s.deps, task, np.empty(4, np.int64))
    assert rings.heap_alloc(s.header, s.buffers, 64) >= 0


def test_buffer_table_full():
    s = make(buffer_window=2)
    assert rings.heap_alloc(s.header, s.buffers, 64) == 0
    assert rings.heap_alloc(s.header, s.buffers, 64) == 1
    assert rings.heap_alloc(s.header, s.buffers, 64) == cs.FULL_BUFFERS


def test_dep_pool_prepends_and_recycles_without_overwriting_live_entries():
    s = make(dep_pool=3)
    head = -1
    for task in (7, 8, 9):
        head = rings.dep_prepend(s.header, s.deps, head, task)
    assert rings.dep_prepend(s.header, s.deps, -1, 10) == cs.FULL_DEPS
    walked, entry = [], head
    while entry >= 0:
        walked.append(int(s.deps["task"][entry]))
        entry = s.deps["next"][entry]
    assert walked == [9, 8, 7]
    rings.dep_release(s.header, s.deps, head)
    reused = rings.dep_prepend(s.header, s.deps, -1, 11)
    assert reused == head and s.deps["task"][reused] == 11
    assert rings.dep_free_count(s.header, s.deps) == 0


def row(owner, offset=0, nbytes=64):
    return layout_row(owner, 1 << 20, offset, 1, (1,), (nbytes,), 1)


def owners_in_map(s):
    """The owners of the entries in use, in pool order: taken (before tm_fresh) and not freed."""
    return [int(s.entries["row"][e, R_OWNER]) for e in range(s.head["tm_fresh"]) if s.entries["task"][e] >= 0]


def test_tensormap_insert_chain_order_remove_and_reuse():
    s = make(tensormap_entries=3, tensormap_buckets=4)
    e = [tm_insert(s.header, s.entries, s.buckets, row(5, 64 * i), 10 + i, cs.WRITER) for i in range(3)]
    assert tm_insert(s.header, s.entries, s.buckets, row(5), 99, cs.WRITER) == -1
    chain, entry = [], chain_head(s.buckets, 5, 0, cs.WRITER)
    while entry >= 0:
        chain.append(int(s.entries["task"][entry]))
        entry = s.entries["next"][entry]
    assert chain == [12, 11, 10]  # newest first
    tm_remove(s.header, s.entries, s.buckets, e[1])
    assert tm_free_count(s.header, s.entries) == 1
    assert tm_insert(s.header, s.entries, s.buckets, row(5), 13, cs.READER) == e[1]
    assert chain_head(s.buckets, 5, 0, cs.READER) == e[1]


def test_tensormap_sweep_drops_dead_buffers_and_evicts_only_retired_tasks():
    s = make(tensormap_entries=8)
    live = rings.heap_alloc(s.header, s.buffers, 64)
    dead = rings.heap_alloc(s.header, s.buffers, 64)
    tm_insert(s.header, s.entries, s.buckets, row(live), 0, cs.WRITER)
    tm_insert(s.header, s.entries, s.buckets, row(dead), 0, cs.WRITER)
    tm_insert(s.header, s.entries, s.buckets, row(-1), 0, cs.READER)
    tm_insert(s.header, s.entries, s.buckets, row(-1), 3, cs.READER)
    rings.buffer_free(s.header, s.buffers, dead)
    s.head["last_alive"] = 2  # tasks 0 and 1 have retired
    scratch = np.zeros(8, np.int64)
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 8, False, scratch) == 5  # the dead one
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 5, True, scratch) == 5  # room: no eviction
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 6, True, scratch) == 7
    assert owners_in_map(s) == [-1] and s.head["tm_used"] == 1


def test_a_sweep_that_frees_less_than_an_eighth_evicts_and_one_after_every_task_retired_empties_the_pool():
    s = make(tensormap_entries=16)
    dead = rings.heap_alloc(s.header, s.buffers, 64)
    live = rings.heap_alloc(s.header, s.buffers, 64)
    tm_insert(s.header, s.entries, s.buckets, row(dead), 0, cs.WRITER)
    for task in range(1, 15):
        tm_insert(s.header, s.entries, s.buckets, row(-1, 64 * task), task, cs.READER)
    tm_insert(s.header, s.entries, s.buckets, row(live), 20, cs.WRITER)
    rings.buffer_free(s.header, s.buffers, dead)
    s.head["last_alive"], s.head["next_task"] = 15, 21  # task 20 is live
    scratch = np.zeros(16, np.int64)
    # The dead buffer's entry alone would make the room asked for, but a sweep scans the whole
    # pool: freeing 1 of 16 entries (< 1/8) evicts the retired tasks' entries too.
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 1, True, scratch) == 15
    assert owners_in_map(s) == [live]

    for task in range(21, 30):
        tm_insert(s.header, s.entries, s.buckets, row(-1, 64 * task), task, cs.READER)
    s.head["last_alive"] = s.head["next_task"] = 30
    # A recording run evicts nothing, retired or not: nothing here is stale.
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 1, False, scratch) == 6
    # Every task retired: the whole pool is free, untaken and its chains empty, as a new pool.
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 1, True, scratch) == 16
    fresh = make(tensormap_entries=16)
    assert np.array_equal(s.buckets, fresh.buckets)
    assert (s.head["tm_free"], s.head["tm_fresh"], s.head["tm_used"]) == (-1, 0, 0) == tuple(
        fresh.head[field] for field in ("tm_free", "tm_fresh", "tm_used"))
    assert owners_in_map(s) == []
    assert tm_insert(s.header, s.entries, s.buckets, row(live), 30, cs.WRITER) == 0

    # A live task without entries: the scan finds every entry retired, and frees them in one pass too.
    for i in range(1, 16):
        tm_insert(s.header, s.entries, s.buckets, row(-1, 64 * i), 30, cs.READER)
    s.head["last_alive"], s.head["next_task"] = 31, 32
    assert tm_make_room(s.header, s.buffers, s.entries, s.buckets, 1, True, scratch) == 16
    assert s.head["tm_fresh"] == 0 and owners_in_map(s) == []
    assert np.array_equal(s.buckets, fresh.buckets)
