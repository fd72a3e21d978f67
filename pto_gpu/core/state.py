"""The core's state: preallocated tables of int64 records, their fields, and their sizes.

State is plain data: a header of counters plus one table per structure, passed as
arguments to the njit functions (numba freezes global arrays, so nothing lives in globals).
Positions that wrap (task ids, heap bytes, buffer sequence numbers) are kept as
ever-increasing virtual counters; a table slot is the counter masked by a power of two,
a heap offset the counter less the start of the heap's current pass.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from ..errors import PTOError
from ..layout import ROW_WIDTH

MAX_PARAMS = 16  # tensor params per task (spec 003: args[16])
HEAP_ALIGN = 64

# Every table is a numpy structured array of int64 fields, so njit code reads a row as a
# record (`tasks[slot].fanin`): a record is a pointer into the table, with no reference
# count to keep, where a row slice of a 2-D table was an array that had one. The header is
# the single record of a 1-element array: njit functions take the array and use `header[0]`.
_I8 = np.int64

HEADER = np.dtype([
    ("next_task", _I8),  # task ring head: id of the next task
    ("last_alive", _I8),  # task ring tail: oldest task not yet retired
    ("window", _I8),  # task ring capacity (power of two)
    ("heap_cap", _I8),
    ("heap_head", _I8),  # virtual byte position of the next allocation
    ("heap_tail", _I8),  # virtual byte position where the live part begins (the oldest live buffer)
    ("heap_lap", _I8),  # virtual position of physical byte 0 in the current pass over the heap
    ("buf_next", _I8),  # sequence number of the next heap buffer
    ("buf_tail", _I8),  # oldest heap buffer not yet dead
    ("buf_cap", _I8),  # heap buffers alive at most
    ("buf_mask", _I8),  # slot of buffer seq: seq & buf_mask (the table has a power of two of slots)
    ("dep_free", _I8),  # dep-list pool free-list head
    ("dep_used", _I8),
    ("tm_free", _I8),  # TensorMap entry free-list head (entries freed since the reset), or -1
    ("tm_fresh", _I8),  # TensorMap entries from here on are untaken since the reset (their rows stale)
    ("tm_used", _I8),
    ("num_edges", _I8),  # logical edges so far
    ("last_edges", _I8),  # edges of the last submitted task (written to the producers scratch)
    ("hw_tasks", _I8),  # high-water marks
    ("hw_heap", _I8),
    ("hw_dep", _I8),
    ("hw_tm", _I8),
    ("hw_buf", _I8),
    ("stamp", _I8),  # id of the current submit attempt, to collect each entry once
    ("last_ready", _I8),  # 1 when the last submitted task had no producer left to wait for
    ("completed", _I8),  # tasks completed so far
    ("locking", _I8),  # 1 once GIL-free code may enter the core: every entry takes `lock` (lock.py)
    ("lock", _I8),
], align=True)

# One row per task-ring slot.
TASK = np.dtype([
    ("id", _I8),
    ("state", _I8),
    ("kernel", _I8),
    ("worker", _I8),
    ("fanin", _I8),  # producers not yet completed
    ("fanout", _I8),  # head of the consumer list in the dep-list pool, -1 when empty
    ("nbuf", _I8),
    ("bufs", _I8, (MAX_PARAMS,)),  # bufs[:nbuf]: sequence numbers of the heap buffers it references
], align=True)

# Task states (spec 001 §3.3).
PENDING, READY, RUNNING, COMPLETED, CONSUMED = 0, 1, 2, 3, 4

# One row per heap buffer slot, in allocation order.
BUFFER = np.dtype([
    ("seq", _I8),
    ("state", _I8),
    ("refs", _I8),  # the orchestrator's reference until free, plus one per live task using it
    ("vstart", _I8),
    ("vend", _I8),
    ("offset", _I8),  # physical byte offset in the heap
], align=True)

LIVE, FREED, DEAD = 0, 1, 2

# The dep-list pool: consumer lists, and the free list through `next`.
DEP = np.dtype([("task", _I8), ("next", _I8)], align=True)

# TensorMap entries; `row` is the region's layout row (pto_gpu.layout's R_* columns). A chain
# walk reads `next`, `task` and the row's owner, bounds, level and dims of most entries it
# visits, and the rest only of those it hits: those come first, and an entry is four cache
# lines, aligned (`aligned_table`), so a visit misses one line, not two or three.
CACHE_LINE = 64
_ENTRY_FIELDS = [
    ("next", _I8),
    ("task", _I8),  # -1 when the entry is on the free list
    ("row", _I8, (ROW_WIDTH,)),
    ("stamp", _I8),  # id of the last submit that collected this entry's task (dedup)
    ("prev", _I8),
    ("bucket", _I8),
    ("kind", _I8),  # WRITER or READER: which chain of the bucket it is on
]
ENTRY = np.dtype(_ENTRY_FIELDS + [("pad", _I8, (4 * CACHE_LINE // 8 - 6 - ROW_WIDTH,))], align=True)
assert ENTRY.itemsize == 4 * CACHE_LINE

WRITER, READER = 0, 1

# TensorMap buckets, by kind: the chain heads, and the narrow entries of the owners whose
# wide block hashes here (tensormap.py). Two buckets to a cache line.
BUCKET = np.dtype([("head", _I8, (2,)), ("narrow", _I8, (2,))], align=True)

# Param kinds.
INPUT, OUTPUT, INOUT = 0, 1, 2

# Status codes of calls that can find a ring full (task ids are >= 0).
FULL_TASKS = -1
FULL_DEPS = -2
FULL_TENSORMAP = -3
FULL_HEAP = -4
FULL_BUFFERS = -5


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Capacities of the core's rings and pools."""

    task_window: int = 1024
    heap_bytes: int = 64 << 20
    buffer_window: int = 4096
    dep_pool: int = 8192
    tensormap_entries: int = 16384
    tensormap_buckets: int = 4096

    def __post_init__(self):
        for name, least in (("task_window", 1), ("tensormap_buckets", 2)):  # buckets: two halves
            value = getattr(self, name)
            if value < least or value & (value - 1):
                raise PTOError(f"{name}={value} must be a power of two, at least {least}")
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise PTOError(f"{field.name}={getattr(self, field.name)} must be positive")


@dataclasses.dataclass
class CoreState:
    """The tables of one runtime; `reset` empties them for the next run."""

    sizes: Sizes
    header: np.ndarray
    tasks: np.ndarray
    buffers: np.ndarray
    deps: np.ndarray
    entries: np.ndarray
    buckets: np.ndarray
    producers: np.ndarray  # scratch: the producers of the last submitted task
    covered: np.ndarray  # scratch: entries the last submit's writes made obsolete

    def __post_init__(self) -> None:
        # One-element views of the header's fields, for Python's hot reads: `at.next_task[0]`
        # costs a fifth of `head["next_task"]` (a record made, then a field looked up), and
        # the scheduler reads three per submit. The header is never replaced, so they stay valid.
        self.at = types.SimpleNamespace(**{name: self.header[name] for name in HEADER.names})
        self.remember_addresses()

    def remember_addresses(self) -> None:
        """`addresses`: the address and length of each table, what core/by_address.py's entries
        take; remade whenever a table is replaced."""
        tables = (*self.tables, self.producers, self.covered)
        self.addresses = np.array([value for table in tables for value in (table.ctypes.data, len(table))],
                                  np.int64)

    @classmethod
    def allocate(cls, sizes: Sizes) -> CoreState:
        state = cls(
            sizes=sizes,
            header=aligned_table(1, HEADER),
            tasks=aligned_table(sizes.task_window, TASK),
            buffers=aligned_table(1 << (sizes.buffer_window - 1).bit_length(), BUFFER),
            deps=aligned_table(sizes.dep_pool, DEP),
            entries=aligned_table(sizes.tensormap_entries, ENTRY),
            buckets=aligned_table(sizes.tensormap_buckets, BUCKET),
            producers=np.zeros(sizes.tensormap_entries, np.int64),
            covered=np.zeros(sizes.tensormap_entries, np.int64),
        )
        state.reset(whole=True)  # zeroed memory is not an empty table (free ids are -1)
        return state

    def reset(self, whole: bool = False) -> None:
        """Empty the tables for the next run. `whole`: rewrite all of the task ring, buffer
        table and dep pool, not only the rows the last run touched (after a run that failed:
        its counts may be off); the TensorMap pool is emptied without a rewrite either way."""
        reset_tables(self, whole)

    @property
    def head(self) -> np.void:
        """The header record (a view: assigning a field writes the table)."""
        return self.header[0]

    @property
    def tables(self) -> tuple:
        """The arguments every core call takes, in order."""
        return (self.header, self.tasks, self.buffers, self.deps, self.entries, self.buckets)

    def grow_tensormap(self) -> None:
        """Double the TensorMap entry pool (recording runs keep every region's history)."""
        old = self.entries
        grown = aligned_table(2 * len(old), ENTRY)
        grown[: len(old)] = old  # the new entries lie past tm_fresh: untaken
        self.entries = grown
        self.producers = np.zeros(len(grown), np.int64)
        self.covered = np.zeros(len(grown), np.int64)
        self.sizes = dataclasses.replace(self.sizes, tensormap_entries=len(grown))
        self.remember_addresses()


def aligned_table(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zeroed table whose first row starts a cache line (numpy aligns to 16 bytes), and whose
    lines hold no other memory: so a 64-byte bucket or a 256-byte entry's first line is one
    line, not parts of two, and two threads that each write their own table (a pipelined
    call's, jit/pipeline.py) do not take each other's lines."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(-(-nbytes // CACHE_LINE) * CACHE_LINE + CACHE_LINE, np.uint8)
    skip = -raw.ctypes.data % CACHE_LINE
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def reset_tables(state: CoreState, whole: bool = False) -> None:
    s, h = state.sizes, state.head
    # Task ids and buffer sequence numbers are taken in order, and dep entries from the front
    # of a free list that reset puts in pool order: a run wrote the first slots of the task
    # ring and the buffer table and the first hw_dep dep entries, and only those are
    # rewritten. Whole tables took 0.1 ms of a one-tile run's 1.3.
    used_tasks = len(state.tasks) if whole else min(len(state.tasks), int(h["next_task"]))
    used_buffers = len(state.buffers) if whole else min(len(state.buffers), int(h["buf_next"]))
    used_deps = len(state.deps) if whole else int(h["hw_dep"])
    state.header[:] = 0
    h["window"] = s.task_window
    h["heap_cap"] = s.heap_bytes
    h["buf_cap"] = s.buffer_window
    h["buf_mask"] = len(state.buffers) - 1
    tasks, buffers, deps = state.tasks[:used_tasks], state.buffers[:used_buffers], state.deps[:used_deps]
    tasks[:] = 0
    tasks["id"] = -1
    buffers[:] = 0
    buffers["seq"] = -1
    # Free lists thread through `next`; -1 ends them.
    deps["task"] = -1
    deps["next"] = np.arange(1, used_deps + 1)
    state.deps["next"][-1] = -1
    h["dep_free"] = 0
    # The TensorMap pool is empty with no entry rewritten: tm_insert takes untaken entries from
    # tm_fresh (zeroed above) on, and nothing reads an entry past it. Rewriting the entries a
    # 2048² panel matmul had taken, 9,472 of 16,384, took 0.3 ms of every run's start.
    h["tm_free"] = -1
    state.buckets["head"] = -1
    state.buckets["narrow"] = 0
