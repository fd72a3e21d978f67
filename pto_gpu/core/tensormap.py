"""The TensorMap: for each owning buffer, the regions written and read by earlier tasks.

Entries hash by (owner, block) into buckets with two doubly linked chains each, writers
and readers, newest first: a read scans only the writers, a write scans both. An owner
has about 256 blocks (its row's R_SHIFT); a region of at most NARROW_BLOCKS blocks hashes
by the block it starts in, a longer one by the owner's "wide" block, so a lookup walks
the chains of the blocks it spans, the NARROW_BLOCKS blocks before them, and the wide
chain: the entries near a tile, not every entry of its array. Each bucket also counts
the narrow entries of the owners whose wide block hashes there (`narrow[kind]`):
when that count is 0, a lookup walks the wide chain alone, so a read of a whole weight
matrix costs one probe, not one per block. Heap buffers and external arrays hash into
separate halves of the buckets: the reader entries of inputs that nobody writes again stay
until the pool fills, and in shared chains they lengthened the walks of the short-lived heap
tiles every write makes (5 of a LLaMA build's 9 visits per task were such entries, 0.16 now).
An entry stops mattering when a later write covers its region (it is removed once its edge is recorded)
or when its heap buffer dies (it is then stale and unlinked lazily, on the next walk or
sweep). Entries of retired tasks may be evicted when the pool is full: that cannot change
what runs, only how many logical edges a later task records.
"""

from __future__ import annotations

from numba import njit

from ..layout import R_HI, R_LO, R_OWNER, R_SHIFT
from .lock import acquire, release
from .rings import buffer_is_live

WIDE = -1  # the block of regions longer than NARROW_BLOCKS blocks
NARROW_BLOCKS = 8


@njit(cache=True, inline="always")
def bucket_of(buckets, owner, block):
    half = len(buckets) >> 1
    spread = ((owner * 0x9E3779B1) ^ ((block + 1) * 0x85EBCA77)) & (half - 1)
    return spread + half if owner < 0 else spread


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
    if buckets[bucket_of(buckets, row[R_OWNER], WIDE)].narrow[kind] == 0:
        return 0, -1
    shift = row[R_SHIFT]
    last = (max(row[R_HI], row[R_LO] + 1) - 1) >> shift
    return max(0, (row[R_LO] >> shift) - NARROW_BLOCKS), last


@njit(cache=True, inline="always")
def _count_narrow(buckets, row, kind, change):
    if home_block(row) != WIDE:
        buckets[bucket_of(buckets, row[R_OWNER], WIDE)].narrow[kind] += change


@njit(cache=True, inline="always")
def is_stale(header, buffers, entries, entry):
    owner = entries[entry].row[R_OWNER]
    return owner >= 0 and not buffer_is_live(header, buffers, owner)


@njit(cache=True, _nrt=False, inline="always")
def tm_insert(header, entries, buckets, row, task_id, kind):
    """Insert a region at the head of its chain; the entry index, or -1 when the pool is full.
    The entry is the free list's head, else the first untaken one (`tm_fresh`): a reset empties
    the pool without rewriting an entry."""
    h = header[0]
    entry = h.tm_free
    if entry >= 0:
        h.tm_free = entries[entry].next
    elif h.tm_fresh < len(entries):
        entry = h.tm_fresh
        h.tm_fresh = entry + 1
    else:
        return -1
    e = entries[entry]
    bucket = bucket_of(buckets, row[R_OWNER], home_block(row))
    chains = buckets[bucket].head
    head = chains[kind]
    e.task = task_id
    e.next = head
    e.prev = -1
    e.bucket = bucket
    e.kind = kind
    e.stamp = -1
    region = e.row
    for k in range(len(region)):
        region[k] = row[k]
    if head >= 0:
        entries[head].prev = entry
    chains[kind] = entry
    _count_narrow(buckets, row, kind, 1)
    h.tm_used += 1
    h.hw_tm = max(h.hw_tm, h.tm_used)
    return entry


@njit(cache=True, _nrt=False, inline="always")
def tm_remove(header, entries, buckets, entry):
    """Unlink an entry and return it to the pool; the entry that followed it."""
    h = header[0]
    e = entries[entry]
    following = e.next
    previous = e.prev
    if previous >= 0:
        entries[previous].next = following
    else:
        buckets[e.bucket].head[e.kind] = following
    if following >= 0:
        entries[following].prev = previous
    _count_narrow(buckets, e.row, e.kind, -1)
    e.task = -1
    e.next = h.tm_free
    h.tm_free = entry
    h.tm_used -= 1
    return following


@njit(cache=True, _nrt=False, inline="always")
def tm_free_count(header, entries):
    return len(entries) - header[0].tm_used


@njit(cache=True, _nrt=False)
def tm_make_room(header, buffers, entries, buckets, needed, evict, scratch):
    """Remove every stale entry; then, if `evict` and that left fewer than `needed` entries free,
    or less than an eighth of the pool, every entry of a retired task. When `evict` and every
    task submitted has retired (a dry run), the whole pool, without a scan. The number free
    after. `scratch` is of len(entries).

    The eighth makes sweeps cheap per insert while live tasks' entries fill less than 7/8 of
    the pool: a sweep scans all of it that was taken (before tm_fresh), and one that freed a
    handful of stale entries was followed by another a few submits later (a LLaMA build met 13
    such sweeps of its 27, each freeing 9 to 1,100 of 16,384 entries)."""
    acquire(header)  # staleness reads what completions write
    alive = header[0].last_alive
    if evict and alive == header[0].next_task:  # every entry is stale or retired (a dry run's)
        _free_all(header, buckets)
        release(header)
        return len(entries)
    # In pool order, not chain by chain: a walk of the chains jumps around the pool. One scan
    # notes the stale entries (from the front of scratch) and the retired ones (from its back).
    n_stale = 0
    n_retired = 0
    last = len(entries) - 1
    for entry in range(header[0].tm_fresh):  # the entries past it are untaken
        task = entries[entry].task
        if task >= 0:
            if is_stale(header, buffers, entries, entry):
                scratch[n_stale] = entry
                n_stale += 1
            elif task < alive:
                scratch[last - n_retired] = entry
                n_retired += 1
    free = tm_free_count(header, entries) + n_stale
    evicting = evict and free < max(needed, len(entries) >> 3)
    if evicting and n_stale + n_retired == header[0].tm_used:
        _free_all(header, buckets)  # the entries removing each would free, in one pass
    else:
        for i in range(n_stale):
            tm_remove(header, entries, buckets, scratch[i])
        if evicting:
            for i in range(n_retired):
                tm_remove(header, entries, buckets, scratch[last - i])
    release(header)
    return tm_free_count(header, entries)


@njit(cache=True, _nrt=False)
def _free_all(header, buckets):
    """Every entry free (untaken, as after a reset) and every chain empty: in a dry run a full
    pool is all retired entries, and unlinking them one by one touched two neighbours and two
    buckets each."""
    for bucket in range(len(buckets)):
        b = buckets[bucket]
        b.head[0] = -1
        b.head[1] = -1
        b.narrow[0] = 0
        b.narrow[1] = 0
    h = header[0]
    h.tm_free = -1
    h.tm_fresh = 0
    h.tm_used = 0


@njit(cache=True, inline="always")
def chain_head(buckets, owner, block, kind):
    return buckets[bucket_of(buckets, owner, block)].head[kind]
