"""Task ring, heap ring with its buffer table, and the dep-list pool (spec 001 §4).

The heap ring hands out 64-byte-aligned buffers in allocation order, never split across
the wrap, and reclaims them in that order: a buffer dies when it has been freed and every
task that used it has completed, and the tail moves to the start of the oldest buffer still
alive. When none is, the next buffer starts at the beginning of the heap again.
"""

from __future__ import annotations

from numba import njit

from .state import (
    B_OFFSET,
    B_REFS,
    B_SEQ,
    B_STATE,
    B_VEND,
    B_VSTART,
    COMPLETED,
    CONSUMED,
    D_NEXT,
    D_TASK,
    DEAD,
    FREED,
    FULL_BUFFERS,
    FULL_DEPS,
    FULL_HEAP,
    FULL_TASKS,
    H_BUF_CAP,
    H_BUF_NEXT,
    H_BUF_TAIL,
    H_DEP_FREE,
    H_DEP_USED,
    H_HEAP_CAP,
    H_HEAP_HEAD,
    H_HEAP_TAIL,
    H_HW_BUF,
    H_HW_DEP,
    H_HW_HEAP,
    H_HW_TASKS,
    H_LAST_ALIVE,
    H_NEXT_TASK,
    H_WINDOW,
    HEAP_ALIGN,
    LIVE,
    T_ID,
    T_STATE,
)

# --- task ring ---------------------------------------------------------------------------


@njit(cache=True)
def task_ring_alloc(header, tasks):
    """Claim the next task id and its slot, or FULL_TASKS when the window is full."""
    task_id = header[H_NEXT_TASK]
    live = task_id - header[H_LAST_ALIVE]
    if live >= header[H_WINDOW]:
        return FULL_TASKS
    slot = task_id & (header[H_WINDOW] - 1)
    tasks[slot, :] = 0
    tasks[slot, T_ID] = task_id
    header[H_NEXT_TASK] = task_id + 1
    header[H_HW_TASKS] = max(header[H_HW_TASKS], live + 1)
    return task_id


@njit(cache=True)
def is_done(header, tasks, task_id):
    """Whether a task has completed (retired ids no longer own their slot)."""
    if task_id < header[H_LAST_ALIVE]:
        return True
    return tasks[task_id & (header[H_WINDOW] - 1), T_STATE] >= COMPLETED


@njit(cache=True)
def retire_completed(header, tasks):
    """Move last_task_alive past the leading completed tasks, freeing their slots."""
    mask = header[H_WINDOW] - 1
    alive = header[H_LAST_ALIVE]
    end = header[H_NEXT_TASK]
    while alive < end and tasks[alive & mask, T_STATE] == COMPLETED:
        tasks[alive & mask, T_STATE] = CONSUMED
        alive += 1
    header[H_LAST_ALIVE] = alive


# --- heap ring and buffer table ----------------------------------------------------------


@njit(cache=True)
def heap_size(nbytes):
    """The bytes a buffer of nbytes takes in the heap ring: whole 64-byte blocks, at least one."""
    return max(HEAP_ALIGN, (nbytes + HEAP_ALIGN - 1) // HEAP_ALIGN * HEAP_ALIGN)


@njit(cache=True)
def heap_alloc(header, buffers, nbytes):
    """Allocate a heap buffer; its sequence number, or FULL_HEAP / FULL_BUFFERS."""
    seq = header[H_BUF_NEXT]
    if seq - header[H_BUF_TAIL] >= header[H_BUF_CAP]:
        return FULL_BUFFERS
    capacity = header[H_HEAP_CAP]
    size = heap_size(nbytes)
    head = header[H_HEAP_HEAD]
    tail = header[H_HEAP_TAIL]
    if seq == header[H_BUF_TAIL]:
        # Nothing is alive: start again at physical 0, so that a buffer as large as the heap
        # fits whatever position the last one ended at.
        head = (head + capacity - 1) // capacity * capacity
        tail = head
    physical = head % capacity
    if physical + size > capacity:  # never split a buffer across the wrap
        head += capacity - physical
    if head + size - tail > capacity:
        return FULL_HEAP
    header[H_HEAP_TAIL] = tail
    slot = seq % header[H_BUF_CAP]
    buffers[slot, B_SEQ] = seq
    buffers[slot, B_STATE] = LIVE
    buffers[slot, B_REFS] = 1
    buffers[slot, B_VSTART] = head
    buffers[slot, B_VEND] = head + size
    buffers[slot, B_OFFSET] = head % capacity
    header[H_HEAP_HEAD] = head + size
    header[H_BUF_NEXT] = seq + 1
    header[H_HW_HEAP] = max(header[H_HW_HEAP], head + size - tail)
    header[H_HW_BUF] = max(header[H_HW_BUF], seq + 1 - header[H_BUF_TAIL])
    return seq


@njit(cache=True)
def buffer_is_live(header, buffers, seq):
    slot = seq % header[H_BUF_CAP]
    return buffers[slot, B_SEQ] == seq and buffers[slot, B_STATE] != DEAD


@njit(cache=True)
def buffer_unfreed(header, buffers, seq):
    """Whether heap buffer `seq` is allocated and the orchestration has not freed it."""
    slot = seq % header[H_BUF_CAP]
    return buffers[slot, B_SEQ] == seq and buffers[slot, B_STATE] == LIVE


@njit(cache=True)
def buffer_release(header, buffers, seq):
    """Drop one reference to a heap buffer; reclaim heap space when it dies."""
    slot = seq % header[H_BUF_CAP]
    buffers[slot, B_REFS] -= 1
    if buffers[slot, B_REFS] == 0:
        buffers[slot, B_STATE] = DEAD
        tail = header[H_BUF_TAIL]
        end = header[H_BUF_NEXT]
        cap = header[H_BUF_CAP]
        while tail < end and buffers[tail % cap, B_STATE] == DEAD:
            tail += 1
        header[H_BUF_TAIL] = tail
        # The live part starts where the oldest live buffer does, which after a wrap lies
        # past the end of the one before it: the skipped bytes are free too.
        header[H_HEAP_TAIL] = buffers[tail % cap, B_VSTART] if tail < end else header[H_HEAP_HEAD]


@njit(cache=True)
def buffer_free(header, buffers, seq):
    """The orchestrator's `free`: no more references will be added."""
    buffers[seq % header[H_BUF_CAP], B_STATE] = FREED
    buffer_release(header, buffers, seq)


# --- dep-list pool -----------------------------------------------------------------------


@njit(cache=True)
def dep_prepend(header, deps, head, task_id):
    """Prepend task_id to the list starting at head (O(1)); the new head, or FULL_DEPS."""
    entry = header[H_DEP_FREE]
    if entry < 0:
        return FULL_DEPS
    header[H_DEP_FREE] = deps[entry, D_NEXT]
    deps[entry, D_TASK] = task_id
    deps[entry, D_NEXT] = head
    header[H_DEP_USED] += 1
    header[H_HW_DEP] = max(header[H_HW_DEP], header[H_DEP_USED])
    return entry


@njit(cache=True)
def dep_release(header, deps, entry):
    """Return one entry to the pool; the next entry of its list."""
    following = deps[entry, D_NEXT]
    deps[entry, D_TASK] = -1
    deps[entry, D_NEXT] = header[H_DEP_FREE]
    header[H_DEP_FREE] = entry
    header[H_DEP_USED] -= 1
    return following


@njit(cache=True)
def dep_free_count(header, deps):
    return len(deps) - header[H_DEP_USED]
