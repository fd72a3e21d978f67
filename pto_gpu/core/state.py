"""The core's state: preallocated int64 tables, their column layout, and their sizes.

State is plain data: a header of counters plus one table per structure, passed as
arguments to the njit functions (numba freezes global arrays, so nothing lives in globals).
Positions that wrap (task ids, heap bytes, buffer sequence numbers) are kept as
ever-increasing virtual counters; the physical slot is the counter modulo the capacity.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import PTOError
from ..layout import ROW_WIDTH

MAX_PARAMS = 16  # tensor params per task (spec 003: args[16])
HEAP_ALIGN = 64

# Header fields.
H_NEXT_TASK = 0  # task ring head: id of the next task
H_LAST_ALIVE = 1  # task ring tail: oldest task not yet retired
H_WINDOW = 2  # task ring capacity (power of two)
H_HEAP_CAP = 3
H_HEAP_HEAD = 4  # virtual byte position of the next allocation
H_HEAP_TAIL = 5  # virtual byte position where the live part begins (the oldest live buffer)
H_BUF_NEXT = 6  # sequence number of the next heap buffer
H_BUF_TAIL = 7  # oldest heap buffer not yet dead
H_BUF_CAP = 8
H_DEP_FREE = 9  # dep-list pool free-list head
H_DEP_USED = 10
H_TM_FREE = 11  # TensorMap entry free-list head
H_TM_USED = 12
H_NUM_EDGES = 13  # logical edges so far
H_LAST_EDGES = 14  # edges of the last submitted task (written to the producers scratch)
H_HW_TASKS = 15  # high-water marks
H_HW_HEAP = 16
H_HW_DEP = 17
H_HW_TM = 18
H_HW_BUF = 19
H_STAMP = 20  # id of the current submit attempt, to collect each entry once
H_LAST_READY = 21  # 1 when the last submitted task had no producer left to wait for
H_COMPLETED = 22  # tasks completed so far
H_WIDTH = 23

# Task table columns (one row per task-ring slot).
T_ID = 0
T_STATE = 1
T_KERNEL = 2
T_WORKER = 3
T_FANIN = 4  # producers not yet completed
T_FANOUT = 5  # head of the consumer list in the dep-list pool, -1 when empty
T_NBUF = 6
T_BUF = 7  # T_BUF + i: sequence numbers of the heap buffers the task references
T_WIDTH = T_BUF + MAX_PARAMS

# Task states (spec 001 §3.3).
PENDING, READY, RUNNING, COMPLETED, CONSUMED = 0, 1, 2, 3, 4

# Heap buffer table columns (one row per buffer slot, in allocation order).
B_SEQ = 0
B_STATE = 1
B_REFS = 2  # the orchestrator's reference until free, plus one per live task using it
B_VSTART = 3
B_VEND = 4
B_OFFSET = 5  # physical byte offset in the heap
B_WIDTH = 6

LIVE, FREED, DEAD = 0, 1, 2

# Dep-list pool columns.
D_TASK = 0
D_NEXT = 1

# TensorMap entry columns; the entry's layout row follows at E_ROW.
E_TASK = 0  # -1 when the entry is on the free list
E_NEXT = 1
E_PREV = 2
E_BUCKET = 3
E_KIND = 4  # WRITER or READER: which chain of the bucket it is on
E_STAMP = 5  # id of the last submit that collected this entry's task (dedup)
E_ROW = 6
E_WIDTH = E_ROW + ROW_WIDTH

WRITER, READER = 0, 1

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
        for name in ("task_window", "tensormap_buckets"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise PTOError(f"{name}={value} must be a power of two")
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

    @classmethod
    def allocate(cls, sizes: Sizes) -> CoreState:
        state = cls(
            sizes=sizes,
            header=np.zeros(H_WIDTH, np.int64),
            tasks=np.zeros((sizes.task_window, T_WIDTH), np.int64),
            buffers=np.zeros((sizes.buffer_window, B_WIDTH), np.int64),
            deps=np.zeros((sizes.dep_pool, 2), np.int64),
            entries=np.zeros((sizes.tensormap_entries, E_WIDTH), np.int64),
            # writer chain head, reader chain head, then narrow-entry counts (tensormap.py)
            buckets=np.zeros((sizes.tensormap_buckets, 4), np.int64),
            producers=np.zeros(sizes.tensormap_entries, np.int64),
            covered=np.zeros(sizes.tensormap_entries, np.int64),
        )
        state.reset()
        return state

    def reset(self) -> None:
        reset_tables(self)

    @property
    def tables(self) -> tuple:
        """The arguments every core call takes, in order."""
        return (self.header, self.tasks, self.buffers, self.deps, self.entries, self.buckets)

    def grow_tensormap(self) -> None:
        """Double the TensorMap entry pool (recording runs keep every region's history)."""
        old = self.entries
        grown = np.zeros((2 * len(old), E_WIDTH), np.int64)
        grown[: len(old)] = old
        grown[len(old):, E_TASK] = -1
        grown[len(old):, E_NEXT] = np.arange(len(old) + 1, 2 * len(old) + 1)
        grown[-1, E_NEXT] = self.header[H_TM_FREE]
        self.header[H_TM_FREE] = len(old)
        self.entries = grown
        self.producers = np.zeros(len(grown), np.int64)
        self.covered = np.zeros(len(grown), np.int64)
        self.sizes = dataclasses.replace(self.sizes, tensormap_entries=len(grown))


def reset_tables(state: CoreState) -> None:
    s, h = state.sizes, state.header
    h[:] = 0
    h[H_WINDOW] = s.task_window
    h[H_HEAP_CAP] = s.heap_bytes
    h[H_BUF_CAP] = s.buffer_window
    state.tasks[:] = 0
    state.tasks[:, T_ID] = -1
    state.buffers[:] = 0
    state.buffers[:, B_SEQ] = -1
    # Free lists thread through the NEXT column; -1 ends them.
    state.deps[:, D_TASK] = -1
    state.deps[:, D_NEXT] = np.arange(1, len(state.deps) + 1)
    state.deps[-1, D_NEXT] = -1
    h[H_DEP_FREE] = 0
    state.entries[:] = 0
    state.entries[:, E_TASK] = -1
    state.entries[:, E_NEXT] = np.arange(1, len(state.entries) + 1)
    state.entries[-1, E_NEXT] = -1
    h[H_TM_FREE] = 0
    state.buckets[:, :2] = -1
    state.buckets[:, 2:] = 0
