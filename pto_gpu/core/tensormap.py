"""The TensorMap: for each owning buffer, the regions written and read by earlier tasks.

Entries hash by (owner, block) into buckets with two doubly linked chains each, writers
and readers, newest first: a read scans only the writers, a write scans both. An owner
has about 256 blocks (its row's R_SHIFT); a region of at most NARROW_BLOCKS blocks hashes
by the block it starts in, a longer one by the owner's "wide" block, so a lookup walks
the chains of the blocks it spans, the NARROW_BLOCKS blocks before them, and the wide
chain: the entries near a tile, not every entry of its array. Each bucket row also counts
the narrow entries of the owners whose wide block hashes there (columns NARROW + kind):
when that count is 0, a lookup walks the wide chain alone, so a read of a whole weight
matrix costs one probe, not one per block. An entry stops
mattering when a later write covers its region (it is removed once its edge is recorded)
or when its heap buffer dies (it is then stale and unlinked lazily, on the next walk or
sweep). Entries of retired tasks may be evicted when the pool is full: that cannot change
what runs, only how many logical edges a later task records.
"""

from __future__ import annotations

from numba import njit

from ..layout import R_HI, R_LO, R_OWNER, R_SHIFT
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
    READER,
    WRITER,
)

WIDE = -1  # the block of regions longer than NARROW_BLOCKS blocks
NARROW_BLOCKS = 8
NARROW = 2  # bucket columns NARROW + kind: narrow entries of the owners whose wide block is here


@njit(cache=True, inline="always")
def bucket_of(buckets, owner, block):
    return ((owner * 0x9E3779B1) ^ ((block + 1) * 0x85EBCA77)) & (len(buckets) - 1)


@njit(cache=True, inline="always")
def home_block(row):
    """The block a region's entry hashes by."""
    shift = row[R_SHIFT]
    if row[R_HI] - row[R_LO] > NARROW_BLOCKS << shift:
        return WIDE
    return row[R_LO] >> shift


@njit(cache=True, inline="always")
def lookup_blocks(buckets, row, kind):
    """The blocks whose `kind` chains may hold an entry overlapping row: first..last, then WIDE
    (first > last when the owner has no narrow entry of that kind)."""
    if buckets[bucket_of(buckets, row[R_OWNER], WIDE), NARROW + kind] == 0:
        return 0, -1
    shift = row[R_SHIFT]
    last = (max(row[R_HI], row[R_LO] + 1) - 1) >> shift
    return max(0, (row[R_LO] >> shift) - NARROW_BLOCKS), last


@njit(cache=True)
def _count_narrow(buckets, row, kind, change):
    if home_block(row) != WIDE:
        buckets[bucket_of(buckets, row[R_OWNER], WIDE), NARROW + kind] += change


@njit(cache=True, inline="always")
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
    bucket = bucket_of(buckets, row[R_OWNER], home_block(row))
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
    _count_narrow(buckets, row, kind, 1)
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
    _count_narrow(buckets, entries[entry, E_ROW:], entries[entry, E_KIND], -1)
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
        for kind in (WRITER, READER):
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


@njit(cache=True, inline="always")
def chain_head(buckets, owner, block, kind):
    return buckets[bucket_of(buckets, owner, block), kind]


