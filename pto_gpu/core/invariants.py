"""The scheduler's invariants, checked over the whole state (validation mode only).

`check` returns 0 when every invariant holds, else the number of the first one violated
(see VIOLATIONS) and writes the offending index to where[0].
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import R_OWNER
from .lock import acquire, release
from .state import COMPLETED, DEAD, FREED, PENDING, READY, RUNNING
from .tensormap import WIDE, bucket_of, home_block

VIOLATIONS = {
    1: "task ring head and tail out of order, or more live tasks than the window",
    2: "heap ring or buffer table head and tail out of order, or over capacity",
    3: "a task slot holds the wrong task id",
    4: "a task's count of producers still to complete is negative",
    5: "a task is PENDING with no producer left, or READY/RUNNING while producers are unfinished",
    6: "a fanout list names a consumer that is not a later, pending task",
    7: "a task's fanin count differs from the fanout entries that point at it",
    8: "the dep-list pool's used count differs from the entries in fanout lists",
    9: "a heap buffer's refcount is negative, or it is dead with references or alive without",
    10: "two live heap buffers overlap, or one lies outside the live part of the heap or splits at the wrap",
    11: "a heap buffer's refcount differs from its users (unfinished tasks, plus one until freed)",
    12: "a TensorMap chain is broken (prev/next or bucket links disagree, or an entry is in the "
        "wrong bucket)",
    13: "the TensorMap's used count differs from the entries on its chains",
    14: "a TensorMap bucket's count of narrow entries disagrees with its chains",
}


@njit(cache=True)
def check(header, tasks, buffers, deps, entries, buckets, where):
    """0, or the first violation found (VIOLATIONS), with where[0] naming the task, buffer or
    bucket; under the core's lock: a compiled body (`nogil`) may be submitting meanwhile."""
    acquire(header)
    violated = _check(header, tasks, buffers, deps, entries, buckets, where)
    release(header)
    return violated


@njit(cache=True)
def _check(header, tasks, buffers, deps, entries, buckets, where):
    h = header[0]
    mask = h.window - 1
    first, end = h.last_alive, h.next_task
    if not (0 <= first <= end and end - first <= h.window):
        return 1
    if not (h.heap_tail <= h.heap_head <= h.heap_tail + h.heap_cap
            and 0 <= h.buf_tail <= h.buf_next
            and h.buf_next - h.buf_tail <= h.buf_cap):
        return 2
    waiting_on = np.zeros(len(tasks), np.int64)
    fanout_entries = 0
    for task_id in range(first, end):
        task = tasks[task_id & mask]
        where[0] = task_id
        if task.id != task_id:
            return 3
        state, fanin = task.state, task.fanin
        if fanin < 0:
            return 4
        if (state == PENDING and fanin == 0) or ((state == READY or state == RUNNING) and fanin != 0):
            return 5
        entry = task.fanout
        while entry >= 0:
            consumer = deps[entry].task
            if not (task_id < consumer < end) or tasks[consumer & mask].state != PENDING:
                return 6
            waiting_on[consumer & mask] += 1
            fanout_entries += 1
            entry = deps[entry].next
    for task_id in range(first, end):
        where[0] = task_id
        task = tasks[task_id & mask]
        if task.state < COMPLETED and waiting_on[task_id & mask] != task.fanin:
            return 7
    if fanout_entries != h.dep_used:
        return 8

    users = np.zeros(len(buffers), np.int64)
    for task_id in range(first, end):
        task = tasks[task_id & mask]
        if task.state < COMPLETED:
            for i in range(task.nbuf):
                users[task.bufs[i] & h.buf_mask] += 1
    previous_end = h.heap_tail
    for seq in range(h.buf_tail, h.buf_next):
        slot = seq & h.buf_mask
        buffer = buffers[slot]
        where[0] = seq
        refs, state = buffer.refs, buffer.state
        if buffer.seq != seq or refs < 0 or (state == DEAD) != (refs == 0):
            return 9
        start, stop = buffer.vstart, buffer.vend
        if start < previous_end or stop > h.heap_head or start % h.heap_cap + (stop - start) > h.heap_cap:
            return 10
        previous_end = stop
        if state != DEAD and refs != users[slot] + (0 if state == FREED else 1):
            return 11

    linked = 0
    narrow = np.zeros((len(buckets), 2), np.int64)
    for bucket in range(len(buckets)):
        for kind in range(2):
            previous = -1
            entry = buckets[bucket].head[kind]
            while entry >= 0:
                where[0] = entry
                e = entries[entry]
                home = bucket_of(buckets, e.row[R_OWNER], home_block(e.row))
                if e.prev != previous or e.bucket != bucket or e.kind != kind or home != bucket:
                    return 12
                if home_block(e.row) != WIDE:
                    narrow[bucket_of(buckets, e.row[R_OWNER], WIDE), kind] += 1
                linked += 1
                previous = entry
                entry = e.next
    if linked != h.tm_used:
        return 13
    for bucket in range(len(buckets)):
        where[0] = bucket
        if narrow[bucket, 0] != buckets[bucket].narrow[0] or narrow[bucket, 1] != buckets[bucket].narrow[1]:
            return 14
    return 0
