"""The Python side of compiled orchestration: one Session per run that uses it.

The session builds the JitOrchestrator over the run's tables, answers compiled code's
service calls (bridge.py), and turns a compiled task back into a `Task` record when the
executor, a worker or the recorder needs one (`materialise`, from the argument tables).
Between compiled calls it carries versions and frees across to the Python orchestrator's
buffer records, so either side can go on where the other stopped.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import time
from collections.abc import Callable

import numba
import numpy as np

from ..core import rings
from ..core import state as cs
from ..dtypes import DataType, WorkerType
from ..errors import (
    DoubleFreeError,
    InvariantError,
    LayoutError,
    LifecycleError,
    ParamError,
    StaleVersionError,
    UsageError,
    UseAfterFreeError,
)
from ..kernel import registered
from ..params import Param, ParamKind
from ..tasks import Scheduler, Task
from ..tensor import Buffer, BufferKind
from . import api, bridge, context, pipeline
from .context import (
    K_MIXED,
    K_NAMES,
    K_TENSORS,
    K_WIDTH,
    K_WORKER,
    LOG_CAPACITY,
    M_BUFFER_MASK,
    M_COMPLETE_AT_SUBMIT,
    M_EDGES,
    M_HEAP_BASE,
    M_LOG_EDGES,
    M_LOG_LIMIT,
    M_LOGGED,
    M_PIPELINE,
    M_SERVICE,
    M_SESSION,
    M_TASK_MASK,
    M_VALIDATE,
    M_WIDTH,
    MAX_SCALARS,
    MAX_SCOPE_DEPTH,
    PARAM_DTYPE,
    PARAM_NDIM,
    S_INT,
    SHAPE_BOUND,
    SHAPE_CODE,
    VERSION_LIVE,
    VERSION_MADE,
    VERSION_WRITTEN,
)
from .descriptor import D_BASE, D_DTYPE, D_KEY, D_NBYTES, D_VERSION, MAX_JIT_DIMS, to_tensor

_KEYS = itertools.count()
MAX_REMEMBERED_BUFFERS = 4096


@functools.lru_cache(maxsize=1)
def kernel_tables(count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` registered kernels' worker classes, dtype rules and shape declarations
    as int64 tables, which compiled code only reads: kernels are never changed or dropped, so
    the tables of the same count are the same (made for each run, they took 0.1 ms of it).

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


class Session:
    def __init__(self, scheduler: Scheduler, executor, recorder, heap_base: int, num_externals: int,
                 args: context.ArgTables, lanes):
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
        self._pipelined = pipeline.wanted(self._complete_at_submit, bool(meta[M_LOG_EDGES]),
                                          scheduler.validate)
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

    def leave(self) -> None:
        """Carry versions and frees made in compiled code back to the Python records."""
        f = self._fields
        for b in self._externals.values():
            _take_versions(b, f["externals"][-1 - b.key])
        for b in self._python_heap.values():
            _take_versions(b, f["heap_versions"][self._slot(b.key)])
            b.freed = b.freed or not self._heap_live(b.key)

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
        else:
            raise self._error(code, a, b, c)

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
        f = self._fields
        slot = task_id & (self._scheduler.state.sizes.task_window - 1)
        tensors, scalars = f["arg_count"][slot].tolist()
        params = [Param(ParamKind(int(kind)), self._tensor(desc))
                  for desc, kind in zip(f["arg_desc"][slot, :tensors], f["arg_kind"][slot, :tensors])]
        for i in range(scalars):
            is_int = f["arg_scalar_kind"][slot, i] == S_INT
            params.append(Param(ParamKind.SCALAR, int(f["arg_int"][slot, i]) if is_int
                                else float(f["arg_float"][slot, i])))
        row = self._scheduler.state.tasks[slot]
        tags = self._tags[bisect.bisect_right(self._tag_starts, task_id) - 1]
        return Task(task_id, self._kernels[row["kernel"]], WorkerType(int(row["worker"])), tuple(params),
                    tags)

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
            what = "version_inc" if a < 0 else f"param {a} of {self._kernels[b].name}"
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
