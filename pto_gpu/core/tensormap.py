"""The TensorMap: for each owning buffer, the regions written and read by earlier tasks.

Entries hash by owner into buckets with two doubly linked chains each, writers and
readers, newest first: a read scans only the writers, a write scans both. An entry stops
mattering when a later write covers its region (it is removed once its edge is recorded)
or when its heap buffer dies (it is then stale and unlinked lazily, on the next walk or
sweep). Entries of retired tasks may be evicted when the pool is full: that cannot change
what runs, only how many logical edges a later task records.
"""

from __future__ import annotations

from numba import njit

from ..layout import R_OWNER
from .rings import buffer_is_live
from .state import (
    E_BUCKET,
    E_KIND,
    E_NEXT,
    E_PREV,
    E_ROW,
    E_STAMP,
    E_TASK,
    H_HW_TM,
    H_LAST_ALIVE,
    H_TM_FREE,
    H_TM_USED,
)


@njit(cache=True)
def bucket_of(buckets, owner):
    return (owner * 0x9E3779B1) & (len(buckets) - 1)


@njit(cache=True)
def is_stale(header, buffers, entries, entry):
    owner = entries[entry, E_ROW + R_OWNER]
    return owner >= 0 and not buffer_is_live(header, buffers, owner)


@njit(cache=True)
def tm_insert(header, entries, buckets, row, task_id, kind):
    """Insert a region at the head of its chain; the entry index, or -1 when the pool is full."""
    entry = header[H_TM_FREE]
    if entry < 0:
        return -1
    header[H_TM_FREE] = entries[entry, E_NEXT]
    bucket = bucket_of(buckets, row[R_OWNER])
    head = buckets[bucket, kind]
    entries[entry, E_TASK] = task_id
    entries[entry, E_NEXT] = head
    entries[entry, E_PREV] = -1
    entries[entry, E_BUCKET] = bucket
    entries[entry, E_KIND] = kind
    entries[entry, E_STAMP] = -1
    entries[entry, E_ROW:] = row
    if head >= 0:
        entries[head, E_PREV] = entry
    buckets[bucket, kind] = entry
    header[H_TM_USED] += 1
    header[H_HW_TM] = max(header[H_HW_TM], header[H_TM_USED])
    return entry


@njit(cache=True)
def tm_remove(header, entries, buckets, entry):
    """Unlink an entry and return it to the pool; the entry that followed it."""
    following = entries[entry, E_NEXT]
    previous = entries[entry, E_PREV]
    if previous >= 0:
        entries[previous, E_NEXT] = following
    else:
        buckets[entries[entry, E_BUCKET], entries[entry, E_KIND]] = following
    if following >= 0:
        entries[following, E_PREV] = previous
    entries[entry, E_TASK] = -1
    entries[entry, E_NEXT] = header[H_TM_FREE]
    header[H_TM_FREE] = entry
    header[H_TM_USED] -= 1
    return following


@njit(cache=True)
def tm_free_count(header, entries):
    return len(entries) - header[H_TM_USED]


@njit(cache=True)
def tm_sweep(header, buffers, entries, buckets, evict_retired):
    """Remove every stale entry (and, if asked, every entry of a retired task); the count removed."""
    removed = 0
    alive = header[H_LAST_ALIVE]
    for bucket in range(len(buckets)):
        for kind in range(2):
            entry = buckets[bucket, kind]
            while entry >= 0:
                if is_stale(header, buffers, entries, entry) or (
                    evict_retired and entries[entry, E_TASK] < alive
                ):
                    entry = tm_remove(header, entries, buckets, entry)
                    removed += 1
                else:
                    entry = entries[entry, E_NEXT]
    return removed


@njit(cache=True)
def chain_head(buckets, owner, kind):
    return buckets[bucket_of(buckets, owner), kind]


