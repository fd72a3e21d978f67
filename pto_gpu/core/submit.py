"""The submit core (spec 001 §6.3): one task's dependencies, fanin and TensorMap updates.

For each tensor param, reads wait for the overlapping writers, and writes for the
overlapping writers and readers (write-after-read included). The edges recorded are the
logical ones, whether or not the producer has completed; only producers still running or
pending join the task's fanin. A submit is all or nothing: it first checks that the task
ring, the TensorMap and the dep-list pool have room, and returns a FULL_* code otherwise.
"""

from __future__ import annotations

from numba import njit

from ..layout import P_KIND, R_OWNER, ROW_WIDTH
from ..overlap import row_covers, rows_overlap
from .lock import acquire, release
from .rings import dep_free_count, dep_prepend, is_done, task_ring_alloc
from .state import (
    FULL_DEPS,
    FULL_TASKS,
    FULL_TENSORMAP,
    INPUT,
    PENDING,
    READER,
    READY,
    WRITER,
)
from .tensormap import WIDE, chain_head, is_stale, lookup_blocks, tm_free_count, tm_insert, tm_remove


@njit(cache=True, _nrt=False)
def submit(header, tasks, buffers, deps, entries, buckets, producers, covered,
           kernel_id, worker, params):
    """Submit one task; its id, or a FULL_* code with nothing but stale entries changed.

    params: one row per tensor param, its layout row then its kind (INPUT, OUTPUT or INOUT).
    On success producers[:header[0].last_edges] holds the task's producers, ascending.
    """
    acquire(header)
    status = _submit(header, tasks, buffers, deps, entries, buckets, producers, covered, kernel_id, worker,
                     params)
    release(header)
    return status


@njit(cache=True, _nrt=False, inline="always")  # one call per submit, not two: the tables are 60 words
def _submit(header, tasks, buffers, deps, entries, buckets, producers, covered, kernel_id, worker, params):
    h = header[0]
    n_params = len(params)
    if h.next_task - h.last_alive >= h.window:
        return FULL_TASKS
    if tm_free_count(header, entries) < n_params:
        return FULL_TENSORMAP
    h.stamp += 1
    stamp = h.stamp

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
    mask = h.window - 1
    task = tasks[task_id & mask]
    task.kernel = kernel_id
    task.worker = worker
    for i in range(unique):
        producer = producers[i]
        if not is_done(header, tasks, producer):
            ptask = tasks[producer & mask]
            ptask.fanout = dep_prepend(header, deps, ptask.fanout, task_id)
    task.fanin = waiting
    task.state = READY if waiting == 0 else PENDING

    for i in range(n_covered):
        if entries[covered[i]].task >= 0:  # the same entry may be covered twice
            tm_remove(header, entries, buckets, covered[i])
    n_buf = 0
    bufs = task.bufs
    for p in range(n_params):
        owner = params[p, R_OWNER]
        kind = READER if params[p, P_KIND] == INPUT else WRITER
        tm_insert(header, entries, buckets, params[p, :ROW_WIDTH], task_id, kind)
        if owner >= 0 and not _contains(bufs, n_buf, owner):
            bufs[n_buf] = owner
            n_buf += 1
            buffers[owner & h.buf_mask].refs += 1
    task.nbuf = n_buf
    h.num_edges += unique
    h.last_edges = unique
    h.last_ready = 1 if waiting == 0 else 0
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
        e = entries[entry]
        hit = e.row[R_OWNER] == owner and rows_overlap(e.row, row)
        if hit and e.stamp != stamp:
            e.stamp = stamp
            producers[found] = e.task
            found += 1
        if hit and writes and n_covered < len(covered) and row_covers(row, e.row):
            covered[n_covered] = entry
            n_covered += 1
        entry = e.next
    return found, n_covered


@njit(cache=True, _nrt=False, inline="always")
def _sort_unique(values, count):
    """Sort values[:count] in place and drop repeats; the number left."""
    if count > 32:
        _heapsort(values, count)
    else:  # the usual handful of producers: insertion sort
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


@njit(cache=True, _nrt=False)
def _heapsort(values, count):
    """In place, without numba's sort (its quicksort needs the runtime to allocate)."""
    for root in range(count // 2 - 1, -1, -1):
        _sift_down(values, root, count)
    for end in range(count - 1, 0, -1):
        values[0], values[end] = values[end], values[0]
        _sift_down(values, 0, end)


@njit(cache=True, _nrt=False)
def _sift_down(values, root, end):
    while 2 * root + 1 < end:
        child = 2 * root + 1
        if child + 1 < end and values[child + 1] > values[child]:
            child += 1
        if values[root] >= values[child]:
            return
        values[root], values[child] = values[child], values[root]
        root = child


@njit(cache=True, inline="always")
def _contains(values, count, value):
    for i in range(count):
        if values[i] == value:
            return True
    return False
