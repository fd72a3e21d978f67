"""The submit core (spec 001 §6.3): one task's dependencies, fanin and TensorMap updates.

For each tensor param, reads wait for the overlapping writers, and writes for the
overlapping writers and readers (write-after-read included). The edges recorded are the
logical ones, whether or not the producer has completed; only producers still running or
pending join the task's fanin. A submit is all or nothing: it first checks that the task
ring, the TensorMap and the dep-list pool have room, and returns a FULL_* code otherwise.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import P_KIND, R_OWNER, ROW_WIDTH
from ..overlap import row_covers, rows_overlap
from .rings import dep_free_count, dep_prepend, is_done, task_ring_alloc
from .state import (
    B_REFS,
    E_NEXT,
    E_ROW,
    E_STAMP,
    E_TASK,
    FULL_DEPS,
    FULL_TASKS,
    FULL_TENSORMAP,
    H_BUF_CAP,
    H_LAST_ALIVE,
    H_LAST_EDGES,
    H_LAST_READY,
    H_NEXT_TASK,
    H_NUM_EDGES,
    H_STAMP,
    H_WINDOW,
    INPUT,
    PENDING,
    READER,
    READY,
    T_BUF,
    T_FANIN,
    T_FANOUT,
    T_KERNEL,
    T_NBUF,
    T_STATE,
    T_WORKER,
    WRITER,
)
from .tensormap import WIDE, chain_head, is_stale, lookup_blocks, tm_free_count, tm_insert, tm_remove


@njit(cache=True)
def submit(header, tasks, buffers, deps, entries, buckets, producers, covered,
           kernel_id, worker, params):
    """Submit one task; its id, or a FULL_* code with nothing but stale entries changed.

    params: one row per tensor param, its layout row then its kind (INPUT, OUTPUT or INOUT).
    On success producers[:header[H_LAST_EDGES]] holds the task's producers, ascending.
    """
    n_params = len(params)
    if header[H_NEXT_TASK] - header[H_LAST_ALIVE] >= header[H_WINDOW]:
        return FULL_TASKS
    if tm_free_count(header, entries) < n_params:
        return FULL_TENSORMAP
    header[H_STAMP] += 1
    stamp = header[H_STAMP]

    # Look up every param's producers; note the entries a write makes obsolete.
    found = 0
    n_covered = 0
    for p in range(n_params):
        row = params[p, :ROW_WIDTH]
        owner = row[R_OWNER]
        writes = params[p, P_KIND] != INPUT
        for kind in range(WRITER, READER + 1 if writes else READER):
            first_block, last_block = lookup_blocks(buckets, row, kind)
            for block in range(first_block, last_block + 2):
                head = chain_head(buckets, owner, WIDE if block > last_block else block, kind)
                found, n_covered = _collect(header, buffers, entries, buckets, head, row, writes, stamp,
                                            producers, found, covered, n_covered)

    unique = _sort_unique(producers, found)
    waiting = 0
    for i in range(unique):
        if not is_done(header, tasks, producers[i]):
            waiting += 1
    if dep_free_count(header, deps) < waiting:
        return FULL_DEPS

    # Commit: nothing below can fail.
    task_id = task_ring_alloc(header, tasks)
    mask = header[H_WINDOW] - 1
    slot = task_id & mask
    tasks[slot, T_KERNEL] = kernel_id
    tasks[slot, T_WORKER] = worker
    tasks[slot, T_FANOUT] = -1
    for i in range(unique):
        producer = producers[i]
        if not is_done(header, tasks, producer):
            ps = producer & mask
            tasks[ps, T_FANOUT] = dep_prepend(header, deps, tasks[ps, T_FANOUT], task_id)
    tasks[slot, T_FANIN] = waiting
    tasks[slot, T_STATE] = READY if waiting == 0 else PENDING

    for i in range(n_covered):
        if entries[covered[i], E_TASK] >= 0:  # the same entry may be covered twice
            tm_remove(header, entries, buckets, covered[i])
    n_buf = 0
    for p in range(n_params):
        owner = params[p, R_OWNER]
        kind = READER if params[p, P_KIND] == INPUT else WRITER
        tm_insert(header, entries, buckets, params[p, :ROW_WIDTH], task_id, kind)
        if owner >= 0 and not _contains(tasks[slot, T_BUF:T_BUF + n_buf], owner):
            tasks[slot, T_BUF + n_buf] = owner
            n_buf += 1
            buffers[owner % header[H_BUF_CAP], B_REFS] += 1
    tasks[slot, T_NBUF] = n_buf
    header[H_NUM_EDGES] += unique
    header[H_LAST_EDGES] = unique
    header[H_LAST_READY] = 1 if waiting == 0 else 0
    return task_id


@njit(cache=True, inline="always")  # called per probed chain: a call costs more than the walk
def _collect(header, buffers, entries, buckets, entry, row, writes, stamp, producers, found, covered,
             n_covered):
    """Walk one chain: note the tasks of entries overlapping row (once per submit), and the
    entries a write covers. Stale entries met on the way are unlinked."""
    owner = row[R_OWNER]
    while entry >= 0:
        if is_stale(header, buffers, entries, entry):
            entry = tm_remove(header, entries, buckets, entry)
            continue
        hit = entries[entry, E_ROW + R_OWNER] == owner and rows_overlap(entries[entry, E_ROW:], row)
        if hit and entries[entry, E_STAMP] != stamp:
            entries[entry, E_STAMP] = stamp
            producers[found] = entries[entry, E_TASK]
            found += 1
        if hit and writes and n_covered < len(covered) and row_covers(row, entries[entry, E_ROW:]):
            covered[n_covered] = entry
            n_covered += 1
        entry = entries[entry, E_NEXT]
    return found, n_covered


@njit(cache=True)
def _sort_unique(values, count):
    """Sort values[:count] in place and drop repeats; the number left."""
    if count > 32:
        values[:count] = np.sort(values[:count])
    else:  # the usual handful of producers: insertion sort, no allocation
        for i in range(1, count):
            value = values[i]
            j = i - 1
            while j >= 0 and values[j] > value:
                values[j + 1] = values[j]
                j -= 1
            values[j + 1] = value
    kept = min(count, 1)
    for i in range(1, count):
        if values[i] != values[kept - 1]:
            values[kept] = values[i]
            kept += 1
    return kept


@njit(cache=True)
def _contains(values, value):
    for v in values:
        if v == value:
            return True
    return False
