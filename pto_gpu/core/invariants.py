"""The scheduler's invariants, checked over the whole state (validation mode only).

`check` returns 0 when every invariant holds, else the number of the first one violated
(see VIOLATIONS) and writes the offending index to where[0].
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import R_OWNER
from .state import (
    B_REFS,
    B_SEQ,
    B_STATE,
    B_VEND,
    B_VSTART,
    COMPLETED,
    D_NEXT,
    D_TASK,
    DEAD,
    E_BUCKET,
    E_KIND,
    E_NEXT,
    E_PREV,
    E_ROW,
    FREED,
    H_BUF_CAP,
    H_BUF_NEXT,
    H_BUF_TAIL,
    H_DEP_USED,
    H_HEAP_CAP,
    H_HEAP_HEAD,
    H_HEAP_TAIL,
    H_LAST_ALIVE,
    H_NEXT_TASK,
    H_TM_USED,
    H_WINDOW,
    PENDING,
    READY,
    RUNNING,
    T_BUF,
    T_FANIN,
    T_FANOUT,
    T_ID,
    T_NBUF,
    T_STATE,
)
from .tensormap import NARROW, WIDE, bucket_of, home_block

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
    mask = header[H_WINDOW] - 1
    first, end = header[H_LAST_ALIVE], header[H_NEXT_TASK]
    if not (0 <= first <= end and end - first <= header[H_WINDOW]):
        return 1
    if not (header[H_HEAP_TAIL] <= header[H_HEAP_HEAD] <= header[H_HEAP_TAIL] + header[H_HEAP_CAP]
            and 0 <= header[H_BUF_TAIL] <= header[H_BUF_NEXT]
            and header[H_BUF_NEXT] - header[H_BUF_TAIL] <= header[H_BUF_CAP]):
        return 2
    waiting_on = np.zeros(len(tasks), np.int64)
    fanout_entries = 0
    for task in range(first, end):
        slot = task & mask
        where[0] = task
        if tasks[slot, T_ID] != task:
            return 3
        state, fanin = tasks[slot, T_STATE], tasks[slot, T_FANIN]
        if fanin < 0:
            return 4
        if (state == PENDING and fanin == 0) or ((state == READY or state == RUNNING) and fanin != 0):
            return 5
        entry = tasks[slot, T_FANOUT]
        while entry >= 0:
            consumer = deps[entry, D_TASK]
            if not (task < consumer < end) or tasks[consumer & mask, T_STATE] != PENDING:
                return 6
            waiting_on[consumer & mask] += 1
            fanout_entries += 1
            entry = deps[entry, D_NEXT]
    for task in range(first, end):
        where[0] = task
        if tasks[task & mask, T_STATE] < COMPLETED and waiting_on[task & mask] != tasks[task & mask, T_FANIN]:
            return 7
    if fanout_entries != header[H_DEP_USED]:
        return 8

    cap = header[H_BUF_CAP]
    users = np.zeros(cap, np.int64)
    for task in range(first, end):
        slot = task & mask
        if tasks[slot, T_STATE] < COMPLETED:
            for i in range(tasks[slot, T_NBUF]):
                users[tasks[slot, T_BUF + i] % cap] += 1
    previous_end = header[H_HEAP_TAIL]
    for seq in range(header[H_BUF_TAIL], header[H_BUF_NEXT]):
        slot = seq % cap
        where[0] = seq
        refs, state = buffers[slot, B_REFS], buffers[slot, B_STATE]
        if buffers[slot, B_SEQ] != seq or refs < 0 or (state == DEAD) != (refs == 0):
            return 9
        start, stop = buffers[slot, B_VSTART], buffers[slot, B_VEND]
        if start < previous_end or stop > header[H_HEAP_HEAD] or \
                start % header[H_HEAP_CAP] + (stop - start) > header[H_HEAP_CAP]:
            return 10
        previous_end = stop
        if state != DEAD and refs != users[slot] + (0 if state == FREED else 1):
            return 11

    linked = 0
    narrow = np.zeros((len(buckets), 2), np.int64)
    for bucket in range(len(buckets)):
        for kind in range(2):
            previous = -1
            entry = buckets[bucket, kind]
            while entry >= 0:
                where[0] = entry
                home = bucket_of(buckets, entries[entry, E_ROW + R_OWNER], home_block(entries[entry, E_ROW:]))
                if entries[entry, E_PREV] != previous or entries[entry, E_BUCKET] != bucket or \
                        entries[entry, E_KIND] != kind or home != bucket:
                    return 12
                if home_block(entries[entry, E_ROW:]) != WIDE:
                    narrow[bucket_of(buckets, entries[entry, E_ROW + R_OWNER], WIDE), kind] += 1
                linked += 1
                previous = entry
                entry = entries[entry, E_NEXT]
    if linked != header[H_TM_USED]:
        return 13
    for bucket in range(len(buckets)):
        where[0] = bucket
        if narrow[bucket, 0] != buckets[bucket, NARROW] or narrow[bucket, 1] != buckets[bucket, NARROW + 1]:
            return 14
    return 0
