"""Task ring, heap ring with its buffer table, and the dep-list pool (spec 001 §4).

The heap ring hands out 64-byte-aligned buffers in allocation order, never split across
the wrap, and reclaims them in that order: a buffer dies when it has been freed and every
task that used it has completed, and the tail moves to the start of the oldest buffer still
alive. When none is, the next buffer starts at the beginning of the heap again.
"""

from __future__ import annotations

from numba import njit

from .lock import acquire, release
from .state import (
    COMPLETED,
    CONSUMED,
    DEAD,
    FREED,
    FULL_BUFFERS,
    FULL_DEPS,
    FULL_HEAP,
    FULL_TASKS,
    HEAP_ALIGN,
    LIVE,
)

# --- task ring ---------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def task_ring_alloc(header, tasks):
    """Claim the next task id and its slot, or FULL_TASKS when the window is full."""
    h = header[0]
    task_id = h.next_task
    live = task_id - h.last_alive
    if live >= h.window:
        return FULL_TASKS
    task = tasks[task_id & (h.window - 1)]
    task.id = task_id
    task.state = 0
    task.kernel = 0
    task.worker = 0
    task.fanin = 0
    task.fanout = -1
    task.nbuf = 0
    h.next_task = task_id + 1
    h.hw_tasks = max(h.hw_tasks, live + 1)
    return task_id


@njit(cache=True, _nrt=False, inline="always")
def is_done(header, tasks, task_id):
    """Whether a task has completed (retired ids no longer own their slot)."""
    h = header[0]
    if task_id < h.last_alive:
        return True
    return tasks[task_id & (h.window - 1)].state >= COMPLETED


@njit(cache=True, _nrt=False, inline="always")
def retire_completed(header, tasks):
    """Move last_task_alive past the leading completed tasks, freeing their slots."""
    h = header[0]
    mask = h.window - 1
    alive = h.last_alive
    end = h.next_task
    while alive < end and tasks[alive & mask].state == COMPLETED:
        tasks[alive & mask].state = CONSUMED
        alive += 1
    h.last_alive = alive


# --- heap ring and buffer table ----------------------------------------------------------


@njit(cache=True, _nrt=False)
def heap_size(nbytes):
    """The bytes a buffer of nbytes takes in the heap ring: whole 64-byte blocks, at least one."""
    return max(HEAP_ALIGN, (nbytes + HEAP_ALIGN - 1) // HEAP_ALIGN * HEAP_ALIGN)


# The two heap entries are inlined into their callers (compiled alloc and free): with the lock
# around them, LLVM stopped inlining them, and a call cost more than the operation.
@njit(cache=True, _nrt=False, inline="always")
def heap_alloc(header, buffers, nbytes):
    """Allocate a heap buffer; its sequence number, or FULL_HEAP / FULL_BUFFERS."""
    acquire(header)
    seq = _heap_alloc(header, buffers, nbytes)
    release(header)
    return seq


@njit(cache=True, _nrt=False, inline="always")
def _heap_alloc(header, buffers, nbytes):
    h = header[0]
    seq = h.buf_next
    if seq - h.buf_tail >= h.buf_cap:
        return FULL_BUFFERS
    capacity = h.heap_cap
    size = heap_size(nbytes)
    head = h.heap_head
    tail = h.heap_tail
    lap = h.heap_lap  # kept rather than head // capacity: a division is most of an alloc
    if seq == h.buf_tail:
        # Nothing is alive: start again at physical 0, so that a buffer as large as the heap
        # fits whatever position the last one ended at.
        if head != lap:
            lap += capacity
            head = lap
        tail = head
    if head - lap + size > capacity:  # never split a buffer across the wrap
        lap += capacity
        head = lap
    if head + size - tail > capacity:
        return FULL_HEAP
    h.heap_tail = tail
    h.heap_lap = lap
    buffer = buffers[seq & h.buf_mask]
    buffer.seq = seq
    buffer.state = LIVE
    buffer.refs = 1
    buffer.vstart = head
    buffer.vend = head + size
    buffer.offset = head - lap
    h.heap_head = head + size
    h.buf_next = seq + 1
    h.hw_heap = max(h.hw_heap, head + size - tail)
    h.hw_buf = max(h.hw_buf, seq + 1 - h.buf_tail)
    return seq


@njit(cache=True, _nrt=False, inline="always")
def buffer_is_live(header, buffers, seq):
    buffer = buffers[seq & header[0].buf_mask]
    return buffer.seq == seq and buffer.state != DEAD


@njit(cache=True, _nrt=False)
def buffer_unfreed(header, buffers, seq):
    """Whether heap buffer `seq` is allocated and the orchestration has not freed it."""
    buffer = buffers[seq & header[0].buf_mask]
    return buffer.seq == seq and buffer.state == LIVE


@njit(cache=True, _nrt=False, inline="always")
def buffer_release(header, buffers, seq):
    """Drop one reference to a heap buffer; reclaim heap space when it dies."""
    h = header[0]
    mask = h.buf_mask
    buffer = buffers[seq & mask]
    buffer.refs -= 1
    if buffer.refs == 0:
        buffer.state = DEAD
        tail = h.buf_tail
        end = h.buf_next
        while tail < end and buffers[tail & mask].state == DEAD:
            tail += 1
        h.buf_tail = tail
        # The live part starts where the oldest live buffer does, which after a wrap lies
        # past the end of the one before it: the skipped bytes are free too.
        h.heap_tail = buffers[tail & mask].vstart if tail < end else h.heap_head


@njit(cache=True, _nrt=False, inline="always")
def buffer_free(header, buffers, seq):
    """The orchestrator's `free`: no more references will be added."""
    acquire(header)
    buffers[seq & header[0].buf_mask].state = FREED
    buffer_release(header, buffers, seq)
    release(header)


# --- dep-list pool -----------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def dep_prepend(header, deps, head, task_id):
    """Prepend task_id to the list starting at head (O(1)); the new head, or FULL_DEPS."""
    h = header[0]
    entry = h.dep_free
    if entry < 0:
        return FULL_DEPS
    dep = deps[entry]
    h.dep_free = dep.next
    dep.task = task_id
    dep.next = head
    h.dep_used += 1
    h.hw_dep = max(h.hw_dep, h.dep_used)
    return entry


@njit(cache=True, _nrt=False, inline="always")
def dep_release(header, deps, entry):
    """Return one entry to the pool; the next entry of its list."""
    h = header[0]
    dep = deps[entry]
    following = dep.next
    dep.task = -1
    dep.next = h.dep_free
    h.dep_free = entry
    h.dep_used -= 1
    return following


@njit(cache=True, _nrt=False, inline="always")
def dep_free_count(header, deps):
    return len(deps) - header[0].dep_used
