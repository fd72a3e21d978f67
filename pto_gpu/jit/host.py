"""The Python side of compiled orchestration: one Session per run that uses it.

The session builds the JitOrchestrator over the run's tables, answers compiled code's
service calls (bridge.py), and turns a compiled task back into a `Task` record when the
executor, a worker or the recorder needs one (`materialise`, from the argument tables).
Between compiled calls it carries versions and frees across to the Python orchestrator's
buffer records, so either side can go on where the other stopped.

In a distributed run every rank must decide where each task runs and what moves between
ranks alike (distributed/placement.py). Compiled code places a submit itself where it can
(jit/placing.py), over the Python placement's own tables, which the session points it at
(`held`), and enters the native transfers it needs (M_TRANSFERS: where the run's native
workers post them); it hands every other submit, each heap buffer and each free to the
Python orchestrator (a `Placer`), which places them as from Python.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import time
from collections.abc import Callable
from typing import Protocol

import numba
import numpy as np

from .. import sharing
from ..core import rings
from ..core import state as cs
from ..dtypes import DataType, WorkerType
from ..errors import (
    DoubleFreeError,
    InvariantError,
    LayoutError,
    LifecycleError,
    ParamError,
    RankError,
    StaleVersionError,
    UsageError,
    UseAfterFreeError,
)
from ..kernel import RECEIVE, registered
from ..params import Param, ParamKind
from ..sharing import Sharing
from ..tasks import Scheduler, Task
from ..tensor import Buffer, BufferKind, TensorDescriptor
from . import api, bridge, context, pipeline
from .context import (
    H_DTYPE,
    H_ITEMSIZE,
    H_MINE,
    H_OWNER,
    H_UNIT,
    H_UNITS,
    H_VALID,
    H_WIDTH,
    H_WRITER,
    H_WRITTEN,
    K_MIXED,
    K_NAMES,
    K_SHARING,
    K_TENSORS,
    K_WIDTH,
    K_WORKER,
    LOG_CAPACITY,
    M_ANSWER,
    M_BUFFER_MASK,
    M_COMPLETE_AT_SUBMIT,
    M_DEFAULT_OWNER,
    M_EDGES,
    M_HEAP_BASE,
    M_HEAP_OWNERS,
    M_HEAP_VALID,
    M_HEAP_WRITERS,
    M_LOG_EDGES,
    M_LOG_LIMIT,
    M_LOGGED,
    M_PIPELINE,
    M_PLACED,
    M_RANK,
    M_RANKS,
    M_SEND_KERNEL,
    M_SERVICE,
    M_SESSION,
    M_TAGS,
    M_TASK_MASK,
    M_TRANSFERS,
    M_VALIDATE,
    M_WIDTH,
    MAX_SCALARS,
    MAX_SCOPE_DEPTH,
    NO_DATATYPE,
    PARAM_DTYPE,
    PARAM_NDIM,
    PLACED_BY_PYTHON,
    PLACED_COMPILED,
    PLACED_NOT,
    S_INT,
    SHAPE_BOUND,
    SHAPE_CODE,
    VERSION_LIVE,
    VERSION_MADE,
    VERSION_WRITTEN,
    NativeTransfers,
)
from .descriptor import D_BASE, D_DTYPE, D_KEY, D_NBYTES, D_VERSION, MAX_JIT_DIMS, to_tensor

_KEYS = itertools.count()
MAX_REMEMBERED_BUFFERS = 4096


@functools.lru_cache(maxsize=1)
def kernel_tables(count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` registered kernels' worker classes, dtype rules and shape declarations
    as int64 tables, which compiled code only reads: kernels are never changed or dropped, so
    the tables of the same count are the same (made for each run, they took 0.1 ms of it). The
    one exception, K_SHARING, is the kernel's judgement (Kernel.sharing(), which may build
    instances of it), written once when compiled code first asks for it (SERVICE_SHARING).

    shapes[kernel, param, 0] (PARAM_NDIM, PARAM_DTYPE) are the param's dims and the DataType it
    must have (-1: any); shapes[kernel, param, 1 + d] (SHAPE_CODE, SHAPE_BOUND) are the dim's
    word: its size when it is a number, else -1 - (the index of its name), and the largest size
    it may have (-1: no bound). `<=N` is a name of its own with bound N.
    """
    table = np.zeros((count, K_WIDTH), np.int64)
    shapes = np.zeros((count, cs.MAX_PARAMS, 1 + MAX_JIT_DIMS, 2), np.int64)
    shapes[..., SHAPE_BOUND] = -1  # and PARAM_DTYPE: any
    for k in registered()[:count]:
        table[k.id, K_WORKER] = int(k.worker)
        table[k.id, K_SHARING] = Sharing.ANY if k.sharing_rule is None else Sharing.UNJUDGED
        table[k.id, K_MIXED] = int(k.mixed_dtypes)
        table[k.id, K_TENSORS] = -1
        if k.shapes is None or len(k.shapes) > cs.MAX_PARAMS:
            continue
        names: dict[str, int] = {}
        for p, dims in enumerate(k.shapes):
            shapes[k.id, p, 0, PARAM_NDIM] = len(dims)  # more dims than MAX_JIT_DIMS can never match
            if k.dtypes is not None:
                shapes[k.id, p, 0, PARAM_DTYPE] = int(k.dtypes[p])
            for d, word in enumerate(dims[:MAX_JIT_DIMS]):
                if word.startswith("<="):
                    shapes[k.id, p, 1 + d, SHAPE_BOUND] = int(word[2:])
                    word = f"{p}.{d}"  # a name no declared word can be
                code = int(word) if word.isdigit() else -1 - names.setdefault(word, len(names))
                shapes[k.id, p, 1 + d, SHAPE_CODE] = code
        table[k.id, K_TENSORS] = len(k.shapes)
        table[k.id, K_NAMES] = len(names)
    return table, shapes


class Placer(Protocol):
    """A distributed run's Python orchestrator and its placement, as a session whose compiled
    code they place (`Session(placer=...)`) calls them."""

    rank: int  # this process's
    ranks: int  # the run's
    default_owner: int  # of a heap buffer allocated without one (o.on_rank's, else 0), now
    counts: np.ndarray  # the run's tasks placed, bytes written and moved (context.C_*)
    compiled: bool  # whether compiled code may place tasks itself (not while recording, say)

    def submit(self, kernel, *params: Param) -> int:
        """Place, check and enter one task, with the transfers it needs before it; its id."""

    def adopt(self, buffer: Buffer, tensor: TensorDescriptor, owner: int | None,
              held: tuple[int, int] | None = None) -> None:
        """A heap buffer compiled code allocated (`tensor` views it whole), owned by `owner`;
        `held`: the writer and valid bits of its one entry, where compiled placement kept its
        tables until now (jit/placing.hold_allocated)."""

    def forget(self, buffer: Buffer) -> None:
        """Compiled code freed a heap buffer it or the placer allocated."""

    def owner_of(self, tensor: TensorDescriptor) -> int:
        """The rank owning the tensor's first element."""

    def tables(self, buffer: Buffer) -> tuple[int, int, int, int, int, int] | None:
        """The buffer's holdings tables: unit, itemsize, entries, and the addresses of owner,
        writer and valid (or None)."""

    def written(self, buffer: Buffer) -> None:
        """Compiled code wrote the buffer's holdings tables."""

    def ran(self, labels: list[int]) -> None:
        """Compiled code entered these tasks (their ids as users see them) on this rank."""

    def native_transfers(self) -> NativeTransfers | None:
        """What compiled code needs to enter the run's transfers itself; None where it cannot
        (they are not native, or not the run's native workers')."""

    def datatype(self, tensor: TensorDescriptor) -> int | None:
        """The MPI datatype a native transfer of the region posts with; None if none."""


class Session:
    def __init__(self, scheduler: Scheduler, executor, recorder, heap_base: int, num_externals: int,
                 args: context.ArgTables, lanes, placer: Placer | None = None):
        self._scheduler = scheduler
        self._executor = executor
        self._recorder = recorder
        self._complete_at_submit = not executor.runs_kernels
        # Producers by consumer from the edge log; a task's may span two flushes.
        self._producers: dict[int, list[int]] | None = {} if executor.wants_producers else None
        self.key = next(_KEYS)
        state = scheduler.state
        meta = np.zeros(M_WIDTH, np.int64)
        meta[M_SESSION] = self.key
        meta[M_SERVICE] = bridge.SERVICE_ADDRESS
        meta[M_COMPLETE_AT_SUBMIT] = self._complete_at_submit
        meta[M_LOG_EDGES] = recorder is not None or executor.wants_producers
        meta[M_VALIDATE] = scheduler.validate
        meta[M_HEAP_BASE] = heap_base
        # A logged task's arguments must outlive the flush: at most a window of tasks.
        meta[M_LOG_LIMIT] = min(LOG_CAPACITY, state.sizes.task_window)
        meta[M_TASK_MASK] = state.sizes.task_window - 1
        meta[M_BUFFER_MASK] = len(state.buffers) - 1
        self._placer = placer
        if placer is not None:
            # Compiled placement reports the tasks it entered from the log (flush), which a
            # run whose tasks complete at submit does not keep.
            compiled = placer.compiled and not self._complete_at_submit
            meta[M_PLACED] = PLACED_COMPILED if compiled else PLACED_BY_PYTHON
            meta[M_RANK] = placer.rank
            transfers = placer.native_transfers() if compiled else None
            if transfers is not None:
                meta[M_TRANSFERS] = 1
                meta[M_SEND_KERNEL:M_TAGS + 1] = transfers
        else:
            meta[M_PLACED] = PLACED_NOT
        self._pipelined = placer is None and pipeline.wanted(
            self._complete_at_submit, bool(meta[M_LOG_EDGES]), scheduler.validate)
        self._kernels = list(registered())
        table, shapes = kernel_tables(len(self._kernels))
        self.o, self._fields = context.allocate(state, args, num_externals, table, shapes, meta)
        # The run's native lanes (executors/native.py), if its executor has them: they run this
        # session's tasks of generated kernels without records; the log flush hands those over by id.
        self._native = lanes
        # what the parallel executor does at the end of each flush (queue the batch, wake workers)
        self._handed_over = getattr(executor, "handed_over", None)
        self._externals: dict[int, Buffer] = {}
        self._python_heap: dict[int, Buffer] = {}  # heap buffers the Python side allocated
        self._seen_heap: dict[int, Buffer] = {}  # records made for compiled allocations
        # The tags around each entry, from the first task id it could submit: a task compiled
        # code submits carries the tags of the `o.compiled` call that submitted it.
        self._tag_starts: list[int] = []
        self._tags: list[dict[str, int | str] | None] = []
        if placer is not None:
            self._fields.update(counts=placer.counts, labels=np.full(state.sizes.task_window, -1, np.int64))
            self._placing_tables(num_externals)
            self._held_heap_tables(placer.ranks)
        scheduler.materialise = self.materialise
        bridge.SESSIONS[self.key] = self

    # --- entering and leaving compiled code ----------------------------------------------
    def enter(self, externals: list[Buffer], python_heap: list[Buffer],
              tags: dict[str, int | str] | None) -> None:
        """Bring the Python side's buffer records in: versions, writeability, buffers known;
        and the tags of the tasks submitted until the next entry."""
        self._tag_starts.append(int(self._scheduler.state.head["next_task"]))
        self._tags.append(tags)
        self._follow_tensormap()  # Python-level submits since the last entry may have grown it
        f = self._fields
        if len(externals) > len(f["externals"]):
            f["externals"] = np.zeros((len(externals), 3), np.int64)
            context.set_externals(self.o, f["externals"])
            if self._placer is not None:
                self._placing_tables(len(externals))
        self._externals = {b.key: b for b in externals}
        for b in externals:
            f["externals"][-1 - b.key] = (b.newest_version, b.newest_handle, b.writeable)
        # A buffer the Python side freed since the last entry is not live to compiled code,
        # which may still hold its descriptor (a body can return one, and be given it back).
        unfreed = {b.key: b for b in python_heap}
        for key in self._python_heap.keys() - unfreed.keys():
            row = f["heap_versions"][self._slot(key)]
            if row[VERSION_LIVE] == key:
                row[VERSION_LIVE] = -1
        self._python_heap = unfreed
        for b in python_heap:
            f["heap_versions"][self._slot(b.key)] = (b.newest_version, b.newest_handle, b.key)
        if self._placer is not None:  # Python's submits since the last entry may have split tables
            for b in (*externals, *python_heap):
                self._hold(b)
            f["meta"][M_DEFAULT_OWNER] = self._placer.default_owner

    def leave(self) -> None:
        """Carry versions and frees made in compiled code back to the Python records, and the
        heap tiles compiled placement held to the placer: the next entry may rebuild the `held`
        table (`_placing_tables`), and the orchestrator's live set must have them."""
        f = self._fields
        if self._placer is not None:
            for slot in np.flatnonzero(f["held"][:len(f["heap_versions"]), H_MINE]).tolist():
                self._adopt(int(f["heap_versions"][slot, VERSION_LIVE]))
        for b in self._externals.values():
            _take_versions(b, f["externals"][-1 - b.key])
        for b in self._python_heap.values():
            _take_versions(b, f["heap_versions"][self._slot(b.key)])
            b.freed = b.freed or not self._heap_live(b.key)
        if self._placer is not None:
            for b in (*self._externals.values(), *self._python_heap.values()):
                self._tell_written(b)

    def _slot(self, key: int) -> int:
        return key % len(self._fields["heap_versions"])

    def call(self, body: Callable, *args: object) -> object:
        """body(o, *args), compiled code of this session, raising what its service calls raise.
        In a pipelined session, a body whose last call submitted many tasks (pipeline.worth)
        runs with its submits' core stage beside it (jit/pipeline.py), which has submitted all
        of them when this returns."""
        if not self._pipelined:
            return bridge.call(self.key, body, self.o, *args)
        head = self._scheduler.state.head
        first = int(head["next_task"])
        meta = self._fields["meta"]
        was_worth = pipeline.worth(body)
        started = time.perf_counter()
        try:
            if not was_worth:
                result = bridge.call(self.key, body, self.o, *args)
            else:
                with pipeline.CoreStage(self.o, self._fields, head):
                    meta[M_PIPELINE] = 1
                    try:
                        result = bridge.call(self.key, body, self.o, *args)
                        # any room the stage waits for is made here, through the services
                        bridge.call(self.key, api.wait_for_core, self.o)
                    finally:
                        meta[M_PIPELINE] = 0
        finally:
            pipeline.submitted(body, int(head["next_task"]) - first, time.perf_counter() - started, was_worth)
        if pipeline.first_pipelined_next(body):
            # Load the stage's code and touch its tables' pages now, in the serial call that made
            # the body worth it, not in the first pipelined call: they took 20 ms of that 37 ms build.
            signature = (numba.typeof(self.o),)
            for function in (pipeline.core_stage, pipeline.stop, api.wait_for_core):
                function.compile(signature)
            self._fields["slot_params"].fill(0)
            self._fields["slot_info"].fill(0)
        return result

    def close(self) -> None:
        bridge.forget(self.key)

    # --- service calls -------------------------------------------------------------------
    def service(self, code: int, a: int, b: int, c: int) -> None:
        if code == bridge.SERVICE_FLUSH:
            self.flush()
        elif code == bridge.SERVICE_ROOM:
            self._make_room(a, b)
        elif code == bridge.SERVICE_CHECK:
            self._scheduler.check_invariants(f"{bridge.CHECKED_AFTER[b]} {a}")
        elif code == bridge.SERVICE_SHARING:
            self._fields["kernels"][a, K_SHARING] = self._kernels[a].sharing()
        elif self._placer is not None and bridge.SERVICE_PLACE <= code <= bridge.SERVICE_DATATYPE:
            self._place(code, a, b)
        else:
            raise self._error(code, a, b, c)

    def _place(self, code: int, a: int, b: int) -> None:
        """A distributed run's service calls (bridge.SERVICE_PLACE...), handed to the placer."""
        meta, named = self._fields["meta"], self._fields["named"]
        if code == bridge.SERVICE_PLACE:
            # The logged tasks first: the placer's submit may wait for room they would make.
            self.flush()
            f = self._fields
            for key in f["arg_desc"][a, :int(f["arg_count"][a, 0]), D_KEY].tolist():
                self._adopt(key)
            params = self._params(a)
            buffers = {p.value.buffer.key: p.value.buffer for p in params if p.kind != ParamKind.SCALAR}
            for buffer in buffers.values():
                self._tell_written(buffer)
            try:
                meta[M_ANSWER] = self._placer.submit(self._kernels[b], *params)
            finally:  # its placement may have split their tables, even if it then raised
                for buffer in buffers.values():
                    self._hold(buffer)
                self._follow_tensormap()  # a recording run's grows
        elif code == bridge.SERVICE_ALLOCATED:
            buffer = Buffer(a, BufferKind.HEAP, int(named[0, D_BASE]), int(named[0, D_NBYTES]))
            self._python_heap[a] = buffer  # the placer's now: carried across as its others are
            self._placer.adopt(buffer, self._tensor(named[0]), None if b == -1 else b)
            self._held_row(a)[H_WRITTEN] = 0
            self._hold(buffer)
        elif code == bridge.SERVICE_FREED:
            self._placer.forget(self._python_heap.pop(a))
            self._held_row(a)[:] = 0
        elif code == bridge.SERVICE_OWNER:
            self._adopt(int(named[0, D_KEY]))
            meta[M_ANSWER] = self._placer.owner_of(self._tensor(named[0]))
        else:
            datatype = self._placer.datatype(self._tensor(named[0]))
            meta[M_ANSWER] = NO_DATATYPE if datatype is None else datatype

    def _placing_tables(self, externals: int) -> None:
        """Compiled placement's tables (jit/placing.py): `held`, a row for each heap slot and for
        `externals` externals (filled by `_hold`), the placer's counts, the per-slot labels.
        (Rebuilt between entries only: `leave` has handed every H_MINE row's tile over.)"""
        f = self._fields
        if "held" in f and f["held"][:, H_MINE].any():
            raise InvariantError("compiled placement's own heap tables would be dropped")
        f["held"] = np.zeros((len(f["heap_versions"]) + max(1, externals), H_WIDTH), np.int64)
        context.set_placing(self.o, f["held"], f["counts"], f["labels"])

    def _held_heap_tables(self, ranks: int) -> None:
        """Per heap slot, the one entry of the tables compiled placement keeps itself for the
        tiles it allocates (placing.hold_allocated), and the run's ranks."""
        f, slots = self._fields, len(self._fields["heap_versions"])
        f.update(heap_owners=np.zeros(slots, np.int8), heap_writers=np.zeros(slots, np.int8),
                 heap_valid=np.zeros(slots, np.uint64))
        meta = f["meta"]
        meta[M_RANKS] = ranks
        for field, name in ((M_HEAP_OWNERS, "heap_owners"), (M_HEAP_WRITERS, "heap_writers"),
                            (M_HEAP_VALID, "heap_valid")):
            meta[field] = f[name].ctypes.data

    def _adopt(self, key: int) -> None:
        """Hand heap buffer `key` to the placer with its tables' state, if compiled placement
        holds it itself (H_MINE): Python is to place a task that uses it or say its owner, or
        the body that allocated it returns (`leave`)."""
        if key < 0:
            return
        row = self._held_row(key)
        if not row[H_MINE]:
            return
        f, slot = self._fields, self._slot(key)
        nbytes = int(row[H_UNIT] * row[H_ITEMSIZE])
        buffer = self._seen_heap.pop(key, None)  # a record made for a task's arguments stays the one
        if buffer is None:
            base = int(f["meta"][M_HEAP_BASE]) + int(self._scheduler.state.buffers[slot]["offset"])
            buffer = Buffer(key, BufferKind.HEAP, base, nbytes)
        self._python_heap[key] = buffer
        dtype = DataType(int(row[H_DTYPE]))
        whole = TensorDescriptor(buffer, buffer.base, 0, (1,), (nbytes // dtype.itemsize,), dtype)
        self._placer.adopt(buffer, whole, int(f["heap_owners"][slot]),
                           (int(f["heap_writers"][slot]), int(f["heap_valid"][slot])))
        row[H_MINE] = row[H_WRITTEN] = 0  # (the placer's tables start as compiled placement left them)
        self._hold(buffer)

    def _held_row(self, key: int) -> np.ndarray:
        """Buffer `key`'s row of `held` (placing.held_row's)."""
        f = self._fields
        return f["held"][self._slot(key) if key >= 0 else len(f["heap_versions"]) + (-1 - key)]

    def _hold(self, buffer: Buffer) -> None:
        """Point compiled placement at the buffer's holdings tables as they are now."""
        row = self._held_row(buffer.key)
        tables = self._placer.tables(buffer)
        if tables is None:
            row[:] = 0
            return
        row[H_UNIT], row[H_ITEMSIZE], row[H_UNITS], row[H_OWNER], row[H_WRITER], row[H_VALID] = tables

    def _tell_written(self, buffer: Buffer) -> None:
        """If compiled code wrote the buffer's tables since the placer last heard, tell it."""
        row = self._held_row(buffer.key)
        if row[H_WRITTEN]:
            row[H_WRITTEN] = 0
            self._placer.written(buffer)

    def flush(self) -> int:
        """Hand the logged tasks to the executor (and the recorder); how many there were."""
        meta = self._fields["meta"]
        logged, edges = int(meta[M_LOGGED]), int(meta[M_EDGES])
        meta[M_LOGGED] = meta[M_EDGES] = 0
        edge_log = self._fields["edges"][:edges]
        if self._recorder is not None:
            self._recorder.edges.extend(map(tuple, edge_log.tolist()))
        if self._native is not None and self._native.takes_edges:  # it follows producers itself
            self._native.edges(edge_log)
        elif self._producers is not None:
            for producer, consumer in edge_log.tolist():
                self._producers.setdefault(consumer, []).append(producer)
        log = self._fields["log"]
        if self._placer is not None:
            labels, mask = self._fields["labels"], self._scheduler.state.sizes.task_window - 1
            entered = labels[log[:logged, 0] & mask]
            self._placer.ran(entered[entered >= 0].tolist())  # (compiled code's transfers have none: -1)
        recorded: dict[int, Task] = {}  # one record per task, for the recorder and the executor
        if self._recorder is not None:
            recorded = {task_id: self._scheduler.task(task_id) for task_id in log[:logged, 0].tolist()}
            self._recorder.tasks.extend(recorded.values())
        if self._complete_at_submit:
            return logged
        delivered = logged
        if self._native is not None:
            logged = self._native.admit(log, logged)
        for task_id, ready in log[:logged].tolist():
            task = recorded.get(task_id) or self._scheduler.task(task_id)
            producers = self._producers.pop(task_id, ()) if self._producers is not None else ()
            self._executor.submitted(task, bool(ready), producers)
        if self._handed_over is not None:
            self._handed_over()
        return delivered

    def _follow_tensormap(self) -> None:
        """Point compiled code at the core's TensorMap tables, which a recording run replaces
        when it grows them (from compiled code's room requests or from Python-level submits)."""
        state, f = self._scheduler.state, self._fields
        if f["entries"] is not state.entries:
            context.set_tensormap(self.o, state.entries, state.producers, state.covered)
            f.update(entries=state.entries, producers=state.producers, covered=state.covered)

    def _make_room(self, status: int, needed: int) -> None:
        delivered = self.flush()
        if status == cs.FULL_TENSORMAP:
            made = self._scheduler.make_tensormap_room(needed)
            self._follow_tensormap()
            if made:
                return
        if not delivered:  # the tasks just handed over may free the ring; else wait or fail
            self._executor.make_room(status, self.unfreed)

    # --- records -------------------------------------------------------------------------
    def materialise(self, task_id: int) -> Task:
        """The Task record of a task compiled code submitted (live, or logged for recording)."""
        slot = task_id & (self._scheduler.state.sizes.task_window - 1)
        row = self._scheduler.state.tasks[slot]
        tags = self._tags[bisect.bisect_right(self._tag_starts, task_id) - 1]
        task = Task(task_id, self._kernels[row["kernel"]], WorkerType(int(row["worker"])),
                    tuple(self._params(slot)), tags)
        if self._placer is not None:  # placed by compiled code (jit/placing.py)
            task.label = int(self._fields["labels"][slot])
            transfer = task.kernel.native.transfer if task.kernel.native is not None else 0
            if transfer:  # one it entered (jit/api.py): native, as Placement._transfer's are
                task.native = task.inline = True
                task.arrives = transfer == RECEIVE
        return task

    def _params(self, slot: int) -> list[Param]:
        """The params whose arguments compiled code wrote in `slot`."""
        f = self._fields
        tensors, scalars = f["arg_count"][slot].tolist()
        params = [Param(ParamKind(int(kind)), self._tensor(desc))
                  for desc, kind in zip(f["arg_desc"][slot, :tensors], f["arg_kind"][slot, :tensors])]
        for i in range(scalars):
            is_int = f["arg_scalar_kind"][slot, i] == S_INT
            params.append(Param(ParamKind.SCALAR, int(f["arg_int"][slot, i]) if is_int
                                else float(f["arg_float"][slot, i])))
        return params

    def _tensor(self, desc: np.ndarray):
        return to_tensor(desc, self._buffer(desc), DataType(int(desc[D_DTYPE])))

    def _buffer(self, desc: np.ndarray) -> Buffer:
        key = int(desc[D_KEY])
        if key < 0:
            return self._externals[key]
        buffer = self._python_heap.get(key) or self._seen_heap.get(key)
        if buffer is None:
            if len(self._seen_heap) >= MAX_REMEMBERED_BUFFERS:
                self._seen_heap.clear()
            buffer = Buffer(key, BufferKind.HEAP, int(desc[D_BASE]), int(desc[D_NBYTES]))
            self._seen_heap[key] = buffer
        return buffer

    def unfreed(self) -> list[Buffer]:
        """Heap buffers allocated and not freed, oldest first, from either side."""
        h, buffers = self._scheduler.state.head, self._scheduler.state.buffers
        base = int(self._fields["meta"][M_HEAP_BASE])
        found = []
        for seq in range(int(h["buf_tail"]), int(h["buf_next"])):
            if self._heap_live(seq):
                row = buffers[seq % len(buffers)]
                nbytes = int(row["vend"] - row["vstart"])
                found.append(self._python_heap.get(seq)
                             or Buffer(seq, BufferKind.HEAP, base + int(row["offset"]), nbytes))
        return found

    def _heap_live(self, seq: int) -> bool:
        state = self._scheduler.state
        return bool(rings.buffer_unfreed(state.header, state.buffers, seq))

    # --- errors --------------------------------------------------------------------------
    def _error(self, code: int, a: int, b: int, c: int) -> Exception:
        named = self._fields["named"]
        if code in (bridge.ERR_USE_AFTER_FREE, bridge.ERR_STALE):
            desc = named[max(a, 0)]
            what = {-1: "version_inc", -2: "owner_of"}.get(a) or f"param {a} of {self._kernels[b].name}"
            name = self._describe(int(desc[D_KEY]))
            if code == bridge.ERR_USE_AFTER_FREE:
                return UseAfterFreeError(f"{what}: {name} was freed")
            newest = self._versions(int(desc[D_KEY]))[VERSION_WRITTEN]
            return StaleVersionError(f"{what}: version {int(desc[D_VERSION])} of {name} is stale; "
                                     f"version {int(newest)} has been written")
        if code == bridge.ERR_VERSION_TAKEN:
            desc = named[0]
            made = self._versions(int(desc[D_KEY]))[VERSION_MADE]
            return StaleVersionError(
                f"version_inc: version {int(desc[D_VERSION])} of {self._describe(int(desc[D_KEY]))} already "
                f"has a successor (version {int(made)} exists); versions are single-assignment, so "
                "increment the newest handle")
        if code == bridge.ERR_UNWRITABLE:
            what, desc = f"param {a} of {self._kernels[b].name}", named[a]
            if c < 0:
                return ParamError(f"{what}: {self._describe(int(desc[D_KEY]))} is read-only memory and "
                                  "cannot be an output or inout; pass a writeable array")
            return ParamError(f"{what}: dim {c} has stride 0 (a broadcast view), so its elements are one "
                              "memory location and an output or inout would write over itself; pass a "
                              "real array")
        if code == bridge.ERR_SHARED:
            kernel = self._kernels[a]
            return sharing.error(kernel, b, c, self._tensor(named[0]), self._tensor(named[1]))
        if code == bridge.ERR_SIGNATURE:
            kernel = self._kernels[a]
            try:
                kernel.check([self._tensor(desc) for desc in named[:b]])
            except ParamError as error:
                return error
            return InvariantError(f"compiled signature check of {kernel.name} disagrees with Kernel.check")
        if code == bridge.ERR_TOO_MANY:
            return ParamError(f"a compiled submit has {a} tensor params and {b} scalars; at most "
                              f"{cs.MAX_PARAMS} and {MAX_SCALARS}")
        if code == bridge.ERR_KERNEL:
            return ParamError(f"kernel id {a} names no kernel (ids 0..{len(self._kernels) - 1}); "
                              "pass kernel.id of a @pto.kernel declared before the run")
        if code == bridge.ERR_FREE_EXTERNAL:
            return LifecycleError(f"cannot free external {self._describe(a)}: the runtime never frees "
                                  "caller memory")
        if code == bridge.ERR_DOUBLE_FREE:
            return DoubleFreeError(f"{self._describe(a)} was already freed")
        if code == bridge.ERR_SCOPE_DEPTH:
            return UsageError("scope_end without a matching scope_begin" if a < 0 else
                              f"scopes nest at most {MAX_SCOPE_DEPTH} deep in compiled code")
        if code == bridge.ERR_SCOPE_FULL:
            return UsageError(f"open scopes in compiled code hold at most {a} buffers; free some or "
                              "close a scope")
        if code == bridge.ERR_ALLOC_SIZE:
            return self._scheduler.heap_too_small(a, "")
        if code == bridge.ERR_OWNER:
            return RankError(f"alloc: owner={a} is out of range: a run of one process has rank 0 only "
                             "(-1: the default)")
        if code == bridge.ERR_ALLOC_ARGS:
            return LayoutError(f"alloc takes up to {MAX_JIT_DIMS} non-negative dims and a DataType "
                               f"code 0..{len(DataType) - 1}; got {a} dims, dtype {b}, a dim of {c}")
        return InvariantError(f"unknown service code {code} from compiled code")

    def _versions(self, key: int) -> np.ndarray:
        f = self._fields
        return f["externals"][-1 - key] if key < 0 else f["heap_versions"][self._slot(key)]

    def _describe(self, key: int) -> str:
        if key < 0:
            return repr(self._externals[key])
        buffer = self._python_heap.get(key) or self._seen_heap.get(key)
        return repr(buffer) if buffer is not None else f"Buffer(heap #{key})"


def _take_versions(buffer: Buffer, versions: np.ndarray) -> None:
    """Raise a buffer's Python version record to what compiled code wrote and made."""
    buffer.newest_version = max(buffer.newest_version, int(versions[VERSION_WRITTEN]))
    buffer.newest_handle = max(buffer.newest_handle, int(versions[VERSION_MADE]))
