"""The scheduler's Python face: task records, submission into the core, completion.

The numba core keeps the graph state; this keeps what the core cannot hold (each task's
kernel and params, until it completes) and turns the core's FULL_* codes into either room
made or a DeadlockError that names the ring, its size, what holds it and what to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .core import invariants, rings
from .core import state as cs
from .core.by_address import complete_at, start_at, submit_at
from .core.tensormap import tm_make_room
from .dtypes import WorkerType
from .errors import DeadlockError, InvariantError
from .kernel import Kernel
from .layout import PARAM_WIDTH
from .native_call import compiled_entry
from .params import Param

if TYPE_CHECKING:  # the compiled layer's, above this one
    from .jit.context import ArgWriter


@dataclasses.dataclass(slots=True, eq=False)
class Task:
    id: int
    kernel: Kernel
    worker: WorkerType
    params: tuple[Param, ...]
    tags: dict[str, int | str] | None = None  # from `with o.tags(...)`: what a Schedule sorts by
    # The classes it may run on, when its kernel has several and submit did not name one: the
    # executor places it (schedule.Heft), running a copy with `worker` set to the class chosen.
    classes: tuple[WorkerType, ...] | None = None
    # A distributed run (pto_gpu/distributed) places every task on every rank, and submits a
    # rank's own and its transfers: a task placed on another rank is not entered here (under a
    # schedule's window or critical path it is, and completes without running), and `label`
    # is the id users see (the task's place in the orchestration's own submissions; -1 for a
    # transfer), which the core's id is not once transfers are counted.
    runs_here: bool = True
    label: int | None = None
    # Run by the worker thread whose completion makes it ready, not queued for a worker of its
    # class: a distributed run's tasks of other ranks (nothing to run) and transfers (a copy
    # and a non-blocking MPI call), which cost less than a hand-over between threads.
    inline: bool = False
    # Completes when its data has arrived (the executor's Arrivals say when), not when its
    # kernel returns: a distributed run's receives, whose kernel posts the receive.
    arrives: bool = False
    # Its arguments are in the run's argument tables (jit/context.py) and its kernel has native
    # code: native workers run it without the GIL, and may complete it without its record.
    native: bool = False

    @property
    def public_id(self) -> int:
        """The id users see: in submission order, counting the orchestration's tasks only."""
        return self.id if self.label is None else self.label

    def describe_params(self) -> str:
        return ", ".join(f"{p.kind.name.lower()}({p.value!r})" for p in self.params)


class Ring(NamedTuple):
    label: str  # as error messages name it
    setting: str  # the Runtime argument that sizes it
    key: str  # its key in RunResult.high_water and RunResult.stalls
    header: str  # the header field of its high-water mark


RINGS = {
    cs.FULL_TASKS: Ring("task ring", "task_window", "task_ring", "hw_tasks"),
    cs.FULL_HEAP: Ring("heap ring", "heap_bytes", "heap_bytes", "hw_heap"),
    cs.FULL_BUFFERS: Ring("buffer table", "buffer_window", "buffer_table", "hw_buf"),
    cs.FULL_DEPS: Ring("dep-list pool", "dep_pool", "dep_pool", "hw_dep"),
    cs.FULL_TENSORMAP: Ring("TensorMap pool", "tensormap_entries", "tensormap", "hw_tm"),
}


class Scheduler:
    """Owns the core state of one runtime and the Python records of its live tasks.

    Tasks submitted from Python have their record in `records`, at their task ring slot (a
    native worker may complete one without touching Python: the next task in the slot
    replaces it); tasks a compiled orchestration submitted have none until someone asks:
    `materialise(task_id)` builds it from the argument tables the compiled code wrote.
    """

    def __init__(self, state: cs.CoreState):
        self.state = state
        s = state
        self._core_submit = compiled_entry(submit_at, s.addresses, 0, 0, np.zeros((1, PARAM_WIDTH), np.int64))
        self._core_complete = compiled_entry(complete_at, s.addresses, 0, self.ready_scratch())
        self._core_start = compiled_entry(start_at, s.addresses, 0)
        self._slot_mask = state.sizes.task_window - 1
        self.records: list[Task | None] = [None] * state.sizes.task_window
        self.materialise: Callable[[int], Task] | None = None
        self.record = False
        self.validate = False

    def release_records(self) -> None:
        """Drop the records native completions left in their slots: they hold the run's arrays."""
        self.records = [None] * len(self.records)

    def reset(self, record: bool, whole: bool = False) -> None:
        self.state.reset(whole)
        self.release_records()
        self.materialise = None
        self.record = record

    # --- submission ----------------------------------------------------------------------
    def try_submit(self, task: Task, params: np.ndarray, arguments: ArgWriter | None = None) -> int:
        """Submit to the core; the task id, or a FULL_* code after room-making that needs no wait.
        With `arguments`, the task's arguments go in its slot first (ArgWriter.write), so that
        native workers may run it (task.native)."""
        s = self.state
        task_id = int(s.at.next_task[0])
        if task_id - int(s.at.last_alive[0]) > self._slot_mask:
            return cs.FULL_TASKS  # its slot is still an earlier task's (the core would say so too)
        # Recorded before the core sees it: a worker may make it ready the moment it exists.
        task.id = task_id
        slot = task_id & self._slot_mask
        self.records[slot] = task
        if arguments is not None:
            task.native = arguments.write(slot, task)
        while True:
            status = self._core_submit(s.addresses, task.kernel.id, int(task.worker), params)
            if status >= 0:
                if self.validate:
                    self.check_invariants(f"submitting task {status}")
                return status
            if status != cs.FULL_TENSORMAP or not self.make_tensormap_room(len(params)):
                if task.native:
                    arguments.tables.task[slot] = -1
                    task.native = False
                self.records[slot] = None
                return status

    def make_tensormap_room(self, needed: int) -> bool:
        """Sweep stale entries, evict retired ones, or grow when recording the full graph."""
        s = self.state
        # `covered` is the submit's scratch, free while the submit waits for room.
        free = tm_make_room(s.header, s.buffers, s.entries, s.buckets, needed, not self.record, s.covered)
        if free >= needed:
            return True
        if self.record:
            s.grow_tensormap()
            return True
        return False

    # --- heap buffers --------------------------------------------------------------------
    def heap_alloc(self, nbytes: int) -> int:
        """A heap buffer's sequence number, or FULL_HEAP / FULL_BUFFERS."""
        s = self.state
        seq = rings.heap_alloc(s.header, s.buffers, nbytes)
        if self.validate and seq >= 0:
            self.check_invariants(f"allocating heap buffer {seq}")
        return seq

    def heap_offset(self, seq: int) -> int:
        return int(self.state.buffers["offset"][seq & self.state.at.buf_mask[0]])

    def buffer_free(self, seq: int) -> None:
        s = self.state
        rings.buffer_free(s.header, s.buffers, seq)
        if self.validate:
            self.check_invariants(f"freeing heap buffer {seq}")

    def completed(self, task_id: int) -> bool:
        return bool(rings.is_done(self.state.header, self.state.tasks, task_id))

    def last_was_ready(self) -> bool:
        """Whether the task just submitted had nothing to wait for (completion never reports it)."""
        return bool(self.state.at.last_ready[0])

    def producers_of_last(self) -> np.ndarray:
        return self.state.producers[: self.state.at.last_edges[0]]

    # --- execution -----------------------------------------------------------------------
    def start(self, task_id: int) -> None:
        self._core_start(self.state.addresses, task_id)
        if self.validate:
            self.check_invariants(f"starting task {task_id}")

    def complete(self, task_id: int, ready_scratch: np.ndarray,
                 core: Callable[[int, np.ndarray], int] | None = None) -> list[Task]:
        """Complete a task; the tasks it made ready. `core(task_id, ready_scratch)` completes it
        in the core instead, leaving the consumers it returns no record for in ready_scratch[:n]
        (native workers queue their own: executors/native.py)."""
        n = self.retire(task_id, ready_scratch, core)
        return [self.task(int(t)) for t in ready_scratch[:n]]

    def retire(self, task_id: int, ready_scratch: np.ndarray,
               core: Callable[[int, np.ndarray], int] | None = None) -> int:
        """Complete a task without building records of the consumers it made ready (their ids
        are in ready_scratch[:n], n returned), for callers that do not queue them."""
        s = self.state
        # Before the core: once it completes the task, the orchestrator may fill its slot.
        slot = task_id & self._slot_mask
        record = self.records[slot]
        if record is not None and record.id == task_id:
            self.records[slot] = None
        if core is None:
            n = self._core_complete(s.addresses, task_id, ready_scratch)
        else:
            n = core(task_id, ready_scratch)
        if self.validate:
            self.check_invariants(f"completing task {task_id}")
        return n

    def task(self, task_id: int) -> Task:
        """The record of a live task."""
        record = self.records[task_id & self._slot_mask]
        return record if record is not None and record.id == task_id else self.materialise(task_id)

    def ready_scratch(self) -> np.ndarray:
        return np.empty(len(self.state.deps), np.int64)

    def check_invariants(self, after: str) -> None:
        """Raise InvariantError naming the first scheduler invariant that does not hold."""
        where = np.zeros(1, np.int64)
        violated = invariants.check(*self.state.tables, where)
        if violated:
            raise InvariantError(f"after {after}: {invariants.VIOLATIONS[violated]} (at {int(where[0])})")

    # --- inspection ----------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Tasks submitted and not yet completed (the parallel executor asks after every task)."""
        at = self.state.at
        return int(at.next_task[0]) - int(at.completed[0])

    def high_water(self) -> dict[str, int]:
        """The most each ring held at once, by Ring.key."""
        return {ring.key: int(self.state.head[ring.header]) for ring in RINGS.values()}

    def capacity(self) -> dict[str, int]:
        """Each ring's size, by Ring.key."""
        return {ring.key: int(getattr(self.state.sizes, ring.setting)) for ring in RINGS.values()}

    def heap_too_small(self, nbytes: int, what: str) -> DeadlockError:
        """The error for one buffer larger than the whole heap ring; `what` describes it."""
        size = rings.heap_size(nbytes)
        blocks = f" ({size} in whole {cs.HEAP_ALIGN}-byte blocks)" if size != nbytes else ""
        return DeadlockError(f"heap ring (heap_bytes={self.state.sizes.heap_bytes} bytes) cannot hold a "
                             f"buffer of {nbytes} bytes{blocks}{what}; raise heap_bytes=")

    def deadlock(self, status: int, unfreed: list) -> DeadlockError:
        """The error for a ring that is full with nothing left that could free it."""
        ring, setting = RINGS[status].label, RINGS[status].setting
        s, h = self.state, self.state.head
        size = getattr(s.sizes, setting)
        if status == cs.FULL_HEAP or status == cs.FULL_BUFFERS:
            in_use = int(h["heap_head"] - h["heap_tail"])
            live = int(h["buf_next"] - h["buf_tail"])
            shown = ", ".join(repr(b) for b in unfreed[:4]) + (" ..." if len(unfreed) > 4 else "")
            holds = (f"{live} buffers from the oldest live one on span {in_use} bytes; "
                     f"{len(unfreed)} of them are not freed yet ({shown})")
            if unfreed and live > len(unfreed):
                holds += (f". The heap reclaims in allocation order, so the oldest unfreed buffer "
                          f"{unfreed[0]!r} also holds the {live - len(unfreed)} freed buffers "
                          "allocated after it")
            advice = (f"free buffers once their last use is submitted, allocate long-lived buffers "
                      f"before short-lived ones or reuse them, or raise {setting}=")
        elif status == cs.FULL_TASKS:
            holds = (f"tasks {int(h['last_alive'])}..{int(h['next_task']) - 1} are live and "
                     f"none can complete")
            advice = f"raise {setting}= above the tasks the orchestration keeps waiting at once"
        else:
            used = int(h["tm_used"] if status == cs.FULL_TENSORMAP else h["dep_used"])
            holds = (f"{used} entries are held by the regions or edges of {self.pending} unfinished "
                     "tasks and external arrays, and the task being submitted needs more")
            advice = f"raise {setting}="
        unit = "bytes" if status == cs.FULL_HEAP else "entries"
        return DeadlockError(f"{ring} ({setting}={size} {unit}) is full and nothing running can free "
                             f"it: {holds}. To go on, {advice}")

