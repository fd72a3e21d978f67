"""The stream executor on a CUDA driver: issue and retirement in nogil numba, no Python
object per task.

On the CUDA backend (a GPU's driver, or the emulator's: backends/driver.py) a task's way
through the streams is driver calls and bookkeeping, so it runs in numba: the tasks of
compiled orchestrations go from the log flush straight to the driver (`admit`: the launch
from the argument tables and the instance's launch, learnt at its first task), Python
submits whose arguments the orchestrator wrote to the same tables take the same path, one numba
call a task (`submit_python`; the others, and an instance's first task, have the backend
prepare their launch), and tasks retire (complete in the core) from one loop polling
cuEventQuery. The rules are those of
executors/streams.py, which serves the CPU backend's Python streams, captures, and runs that
trace, measure or validate (those keep a record of every task):

  - a task that continues a chain (a producer of it, in flight, is in the last launch on a
    stream of its class) goes to that stream, whose order stands for a wait; any other to
    the stream of its class given a task least recently; either after a wait on the event of
    the producer issued last of those still in flight on each other stream (stream order
    covers the rest);
  - tasks retire in the order they were issued as their events are reached: polled after each
    issue, waited on when a ring is full, and when the orchestration has ended;
  - an event is recorded again only once its task has retired and no wait issued on it is
    still ahead of its stream;
  - independent tasks of one instance whose tensors' pointers advance by constant steps go out
    as one launch over a batch (their tensors' leading dim), on one stream, and retire together
    on its one event (`_batch`, `_joins`, `_send`): a compiled flush's tasks in the order of its
    log, each batch led by the first task not issued and taking any later task whose producers
    in the flush have all been issued (`plan`: so the tiles of several chains, a row of a tiled
    matmul's accumulators, go out together), Python submits in order, held until a submit that
    does not join them (`submit_python`);
  - a run's new kernel instances compile side by side before the launches that need them: a
    flush's all at once (`_prefetch`), and a Python submit's as it comes, the submits from it
    on waiting in order (`_behind`) while the orchestration goes on, issued as their compiles
    end.

State is plain arrays (`Tables`) that only the orchestrator's thread changes, so there is no
lock: producers reach a task through the pending table (from the compiled edge log, or a
Python submit's producers), which keeps, per consumer, its producer issued last on each stream.
The instances' launches (the CUfunction, grid, block and each scalar's word type) are kept
per backend, for its later runs.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from concurrent.futures import Future
from typing import NamedTuple, NoReturn

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from ..backends.cuda_abi import MAX_BLOCKS
from ..backends.driver import NOT_READY, CudaError
from ..backends.launches import (
    CALLS,
    GEMM,
    GEMM_CALL,
    LAUNCH,
    NO_WORK,
    QUERY,
    RECORD,
    TENSOR_WORDS,
    WAIT,
    Scratch,
    Template,
    query_event,
    record_event,
    start,
    task_words,
    wait_event,
)
from ..core.complete import complete
from ..core.lock import monotonic_ns
from ..core.state import MAX_PARAMS
from ..dtypes import WorkerType
from ..errors import DeadlockError, InvariantError, TaskError, UsageError
from ..jit.context import EDGE_CAPACITY, LOG_CAPACITY, MAX_SCALARS, ArgTables
from ..jit.descriptor import D_ITEMSIZE, D_NDIM
from ..kernel import registered
from ..native_call import compiled_entry
from ..profile import Profile
from ..tasks import RINGS, Scheduler, Task
from .instance_keys import INSTANCES, KEY_WIDTH, cuda_kernel_info, find, instance_key, tables_key, takes_more

CLASSES = len(WorkerType)
_NOTED = np.zeros(0, np.int64)  # producers already in the pending table
_NO_EDGES = np.zeros((0, 2), np.int64)
MAX_STREAMS = 16
EVENT_BATCH = 64  # events taken from the backend at a time (at most a task window's)

# Why `issue_logged` stopped before the end of the log.
NEEDS_PYTHON, NEEDS_EVENTS, FAILED = 1, 2, 3
# What `submit_python` answers, besides 0 (held or issued): the task's instance is not learnt;
# it is to go the Python way (its arguments are not an instance's, or its GEMM record is for
# other strides); the held log was partly issued (Python goes on with its first held.upto
# tasks, issue_logged having stopped at the first); its producers do not fit the held edges.
# Nothing was done but for RESUME.
UNLEARNT, PYTHON_WAY, RESUME, EDGES_FULL = 1, 2, 3, 4
# Logged tasks of one instance one launch may take (`_batch`): a flush's worth (jit/host.py).
BATCH_LIMIT = LOG_CAPACITY
PROBE = 32  # of an instance whose Python submits go alone, every PROBE-th is held again
HELD_EDGES = 16 * BATCH_LIMIT  # producer edges of held Python submits, to start with
PREFETCH = 64  # new instances a flushed log starts compiling at once (CudaBackend.prefetch)
# Ready tasks of a planned flush that do not join a leader's batch, after which it looks no
# further (`_batch`): of other kernels (a glance each), and of its kernel (a comparison of
# their instances and words): a bound on the host's work a launch where few join.
STRANGERS, MISSES = 32, 4
ISSUING = np.iinfo(np.int64).max  # a slot's `seq` from its task's first driver call to its record

STATE = np.dtype([
    ("head", np.int64),  # the in-flight ring: the task issued first retires from here
    ("tail", np.int64),  # and the next issued goes here
    ("free", np.int64),  # event indices on `pool`
    ("made", np.int64),  # event indices with a handle
    ("why", np.int64),  # why issue_logged stopped (NEEDS_*, FAILED)
    ("failed_task", np.int64),  # the task whose driver call failed, or -1
    ("failed_status", np.int64),  # its CUresult
    ("failed_call", np.int64),  # which call (launches.CALLS)
    ("native", np.int64),  # tasks issued from the log without Python
    ("launches", np.int64),  # launches (and GEMM calls) made, for Python and logged tasks: a batch's one
    ("waits", np.int64),  # event waits enqueued: a stream waiting for a producer on another
], align=True)
FAILURE = ("failed_task", "failed_status", "failed_call")

SLOT = np.dtype([  # per task slot: the task in flight there
    ("task", np.int64),  # (-1: none yet)
    ("seq", np.int64),  # its place in the in-flight ring (ISSUING until its event is recorded)
    ("kernel", np.int64),
    ("stream", np.int64),
    ("event", np.int64),  # index into `events`
    ("waits", np.int64),  # how many of `after` it waited on
    ("after", np.int64, (MAX_STREAMS,)),  # the events of the producers it waited on
    ("issued", np.int64),  # monotonic ns
], align=True)

EVENT = np.dtype([
    ("handle", np.int64),  # the CUevent
    ("waiters", np.int64),  # tasks in flight whose stream waits on it
    ("busy", np.int64),  # how many tasks in flight it stands for (a batched launch's: several)
    ("end", np.int64),  # when its task's retirement was observed (monotonic ns)
], align=True)

PENDING = np.dtype([  # per task slot: the producers of the task submitted there, not yet issued
    ("consumer", np.int64),  # the task the row is for (-1: none)
    ("last", np.int64, (MAX_STREAMS,)),  # per stream: its producer issued last there, or -1
], align=True)

PLAN = np.dtype([  # per position of a planned flush's log (`plan`)
    ("left", np.int64),  # its producers in the log not issued yet
    ("issued", np.int64),
    ("first_successor", np.int64),  # its consumers in the log: successors[first_successor:next's]
    ("fill", np.int64),  # (while planning)
], align=True)

HELD = np.dtype([  # Python submits held to go out as one launch (`submit_python`)
    ("count", np.int64),  # tasks in held_log
    ("edges", np.int64),  # their producer edges in held_edges, (producer, consumer) by consumer
    ("instance", np.int64),  # the leader's learnt instance slot
    ("upto", np.int64),  # after RESUME: how many of held_log were to go out
], align=True)

LAUNCHES = np.dtype([  # per instance table slot: its launch
    ("function", np.int64),  # the CUfunction (0 with grid 0: no work items, only wait and record)
    ("grid", np.int64),
    ("block", np.int64),
    ("shared", np.int64),
    ("integer", np.int64, (MAX_SCALARS,)),  # each scalar's word: long long (1) or double
], align=True)


class LearntLaunches(NamedTuple):
    """A backend's learnt launches, by instance key (instance_keys.py)."""

    keys: np.ndarray
    filled: np.ndarray
    launches: np.ndarray
    gemms: np.ndarray  # GEMM_CALL per slot: the instance's cuBLAS call (batch 0: its kernel's launch)

    @classmethod
    def allocate(cls) -> LearntLaunches:
        return cls(np.zeros((INSTANCES, KEY_WIDTH), np.int64), np.zeros(INSTANCES, np.int64),
                   np.zeros(INSTANCES, LAUNCHES), np.zeros(INSTANCES, GEMM_CALL))


_LEARNT: weakref.WeakKeyDictionary[object, LearntLaunches] = weakref.WeakKeyDictionary()  # by backend


class Tables(NamedTuple):
    """One run's state on the streams, and what its numba code reads beside it."""

    state: np.ndarray  # STATE, one row
    ring: np.ndarray  # task ids in flight, in the order they were issued
    slots: np.ndarray  # SLOT per task slot
    events: np.ndarray  # EVENT per event index
    pool: np.ndarray  # free event indices, pool[:state.free]
    pending: np.ndarray  # PENDING per task slot
    class_streams: np.ndarray  # [class, i]: the i-th stream of the class
    class_count: np.ndarray  # [class]: how many streams it has
    handles: np.ndarray  # per stream: its CUstream
    given: np.ndarray  # per stream: the ring's tail when it was last given a task (-1: never)
    tail_events: np.ndarray  # and the event of its last launch
    blas: np.ndarray  # per stream: its cuBLAS handle, once a GEMM needs them (0 before)
    stream_end: np.ndarray  # per stream: when its last retired task ended (monotonic ns)
    stats: np.ndarray  # [stream, kernel]: tasks retired, their ns
    kernel_info: np.ndarray  # KERNEL_INFO per kernel id: `native` where the log's tasks issue here
    keys: np.ndarray  # the backend's LearntLaunches
    filled: np.ndarray
    launches: np.ndarray
    gemms: np.ndarray
    key: np.ndarray  # an instance key
    other_key: np.ndarray  # and another's, to compare (`_batch`)
    words: np.ndarray  # a launch's argument words
    other_words: np.ndarray  # another task's, to compare
    strides: np.ndarray  # per tensor param: its pointer's step from task to task in a batch, bytes
    tensors: np.ndarray  # per tensor param: its pointer's word, its itemsize (`_send`)
    gemm: np.ndarray  # one GEMM_CALL: the call being made
    params: np.ndarray  # kernelParams: the words' addresses
    double: np.ndarray  # one float64, and `bits` its int64 view: a scalar's double word
    bits: np.ndarray
    ready: np.ndarray  # the core's completion scratch
    held: np.ndarray  # HELD, one row
    held_log: np.ndarray  # (BATCH_LIMIT + 1, 2): the held tasks' ids (and one that did not join)
    held_edges: np.ndarray  # (n, 2): their producers, as a compiled flush's edge log
    held_key: np.ndarray  # the leader's instance key
    held_words: np.ndarray  # and its argument words
    held_strides: np.ndarray  # per tensor: bytes from one held task's pointer to the next's
    alone: np.ndarray  # per instance slot: its last held batches that no task joined, in a row
    skipped: np.ndarray  # per instance slot: its tasks not held since
    batch: np.ndarray  # the tasks of the launch being formed (`_batch`)
    batch_at: np.ndarray  # and their positions in the log
    plan: np.ndarray  # PLAN per position of the flush's log, and one more
    successors: np.ndarray  # the plan's consumers in the log, by producer
    ready_at: np.ndarray  # the plan's positions not issued whose producers in the log are: a bitset


# --- the bookkeeping -----------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def _in_flight(t, task_id):
    """Whether a task was issued and has not retired: its slot holds it, at a place in the
    in-flight ring that the head (tasks retire in the order they were issued) has not passed."""
    slot = t.slots[task_id & (len(t.slots) - 1)]
    return slot.task == task_id and slot.seq >= t.state[0].head


@njit(cache=True, _nrt=False, inline="always")
def _note(t, producer, consumer):
    """Note a producer of `consumer` if it is in flight, where it is the last issued of the
    consumer's producers on its stream (waiting for it covers those before it there)."""
    mask = len(t.pending) - 1
    row = t.pending[consumer & mask]
    if row.consumer != consumer:
        row.consumer = consumer
        row.last[:] = -1
    if _in_flight(t, producer):
        stream = t.slots[producer & mask].stream
        last = row.last[stream]
        if last < 0 or not _in_flight(t, last) or t.slots[producer & mask].seq > t.slots[last & mask].seq:
            row.last[stream] = producer


@njit(cache=True, _nrt=False, inline="always")
def _first_from(rows, column, end, value):
    """The first of rows[:end] whose `column` is at least `value` (they ascend there), or end."""
    first = 0
    while first < end:
        middle = (first + end) >> 1
        if rows[middle, column] < value:
            first = middle + 1
        else:
            end = middle
    return first


@njit(cache=True, _nrt=False, inline="always")
def _edges_of(edges, consumer):
    """Where a consumer's edges are in an edge log ordered by consumer (a flush's, the held
    submits'): edges[first:end]."""
    first = _first_from(edges, 1, len(edges), consumer)
    end = first
    while end < len(edges) and edges[end, 1] == consumer:
        end += 1
    return first, end


@njit(cache=True, _nrt=False, inline="always")
def _note_producers_in(t, edges, consumer):
    """Note a task's producers in an edge log, when it is about to be issued: they were issued
    before it (a consumer's edges may come in two flushes: those of the first are noted at its
    end, `note_after`)."""
    first, end = _edges_of(edges, consumer)
    for e in range(first, end):
        _note(t, edges[e, 0], consumer)


@njit(cache=True, _nrt=False)
def note_after(t, edges, last):
    """Note the edges of the consumers after task `last` (a flush's last): those the next flush
    brings, whose producers are issued."""
    first, _ = _edges_of(edges, last + 1)
    for e in range(first, len(edges)):
        _note(t, edges[e, 0], edges[e, 1])


@njit(cache=True, _nrt=False)
def note_producers(t, task_id, producers):
    mask = len(t.pending) - 1
    t.pending[task_id & mask].consumer = task_id
    t.pending[task_id & mask].last[:] = -1
    for i in range(len(producers)):
        _note(t, producers[i], task_id)


@njit(cache=True, _nrt=False, inline="always")
def _fail(t, task_id, status, call):
    s = t.state[0]
    s.why = FAILED
    if s.failed_task < 0:
        s.failed_task = task_id
        s.failed_status = status
        s.failed_call = call
    return status


@njit(cache=True, _nrt=False, inline="always")
def _stream(t, task_id, worker):
    """The stream a task goes to: where it continues a chain (a producer of it, in flight, is
    in the last launch on a stream of its class; the one issued last), that stream, whose order
    then stands for a wait on another; else the stream of its class that was given a task
    least recently (so a fan-out's consumers spread, whatever went where in between)."""
    mask = len(t.slots) - 1
    row = t.pending[task_id & mask]
    stream, latest = -1, -1
    if row.consumer == task_id:
        for i in range(t.class_count[worker]):
            candidate = t.class_streams[worker, i]
            producer = row.last[candidate]
            if producer >= 0 and _in_flight(t, producer) and t.slots[producer & mask].seq > latest and \
                    t.slots[producer & mask].event == t.tail_events[candidate]:
                stream, latest = candidate, t.slots[producer & mask].seq
    if stream < 0:
        for i in range(t.class_count[worker]):
            candidate = t.class_streams[worker, i]
            if stream < 0 or t.given[candidate] < t.given[stream]:
                stream = candidate
    return stream


@njit(cache=True, _nrt=False, inline="always")
def _waits_on(slot, event):
    """Whether the task in `slot` had its stream wait on `event`."""
    for i in range(slot.waits):
        if slot.after[i] == event:
            return True
    return False


@njit(cache=True, _nrt=False, inline="always")
def _begin(t, driver, task_id, kernel, worker, now):
    """Take the task's slot, a stream of its class (`_stream`) and an event, and enqueue its
    waits on its producer issued last of those in flight on each other stream. -1 when no event is free
    (nothing taken); else the first CUresult that is not 0, or 0."""
    s = t.state[0]
    if s.free == 0:
        return -1
    stream = _stream(t, task_id, worker)
    s.free -= 1
    event = t.pool[s.free]
    t.events[event].busy = 0
    t.events[event].waiters = 0
    return _join(t, driver, task_id, kernel, stream, event, now, task_id)


@njit(cache=True, _nrt=False, inline="always")
def _join(t, driver, task_id, kernel, stream, event, now, leader):
    """Take the task's slot for a launch on `stream` whose record is `event` (its own, or the
    batch's it joins, led by `leader`), and enqueue its waits on its producer issued last of
    those in flight on each other stream, but for those the leader's stream already waits on;
    the first CUresult that is not 0, or 0."""
    mask = len(t.slots) - 1
    t.events[event].busy += 1
    t.given[stream] = t.state[0].tail
    t.tail_events[stream] = event
    slot = t.slots[task_id & mask]
    slot.task = task_id
    slot.seq = ISSUING
    slot.kernel = kernel
    slot.stream = stream
    slot.event = event
    slot.waits = 0
    slot.issued = now
    row = t.pending[task_id & mask]
    if row.consumer == task_id:
        for other in range(len(t.handles)):
            producer = row.last[other]
            if other != stream and producer >= 0 and _in_flight(t, producer):
                waited = t.slots[producer & mask].event
                if leader != task_id and _waits_on(t.slots[leader & mask], waited):
                    continue
                status = wait_event(driver[WAIT], t.handles[stream], t.events[waited].handle)
                if status != 0:
                    return _fail(t, task_id, status, WAIT)
                slot.after[slot.waits] = waited
                slot.waits += 1
                t.events[waited].waiters += 1
                t.state[0].waits += 1
    return 0


@njit(cache=True, _nrt=False, inline="always")
def _record(t, driver, task_id):
    """Record the task's event behind its kernel and put it in flight; a CUresult."""
    slot = t.slots[task_id & (len(t.slots) - 1)]
    status = record_event(driver[RECORD], t.events[slot.event].handle, t.handles[slot.stream])
    if status != 0:
        return _fail(t, task_id, status, RECORD)
    _enter(t, task_id)
    return 0


@njit(cache=True, _nrt=False, inline="always")
def _enter(t, task_id):
    """Put an issued task at the in-flight ring's tail."""
    s = t.state[0]
    t.slots[task_id & (len(t.slots) - 1)].seq = s.tail
    t.ring[s.tail & (len(t.ring) - 1)] = task_id
    s.tail += 1


@njit(cache=True, _nrt=False)
def begin(t, driver, task_id, kernel, worker):
    return _begin(t, driver, task_id, kernel, worker, monotonic_ns())


@njit(cache=True, _nrt=False)
def record(t, driver, task_id):
    return _record(t, driver, task_id)


@njit(cache=True, _nrt=False, inline="always")
def _release(t, event):
    s = t.state[0]
    t.pool[s.free] = event
    s.free += 1


@njit(cache=True, _nrt=False)
def retire_reached(t, driver, header, tasks, buffers, deps, limit):
    """Retire, in the order issued, up to `limit` tasks whose events are reached, up to the first that
    is not (or whose kernel failed: state.failed_*); how many retired."""
    s = t.state[0]
    mask = len(t.slots) - 1
    retired = 0
    while s.head != s.tail and retired < limit:
        task_id = t.ring[s.head & (len(t.ring) - 1)]
        slot = t.slots[task_id & mask]
        event = slot.event
        status = query_event(driver[QUERY], t.events[event].handle)
        if status == NOT_READY:
            break
        if status != 0:
            _fail(t, task_id, status, QUERY)
            break
        s.head += 1
        # The host sees when a task was issued and when its retirement was noticed; it ran no
        # earlier than its stream's previous task and its producers elsewhere ended.
        now = monotonic_ns()
        start = max(slot.issued, t.stream_end[slot.stream])
        for i in range(slot.waits):
            start = max(start, t.events[slot.after[i]].end)
        if slot.kernel < t.stats.shape[1]:
            t.stats[slot.stream, slot.kernel, 0] += 1
            t.stats[slot.stream, slot.kernel, 1] += now - start
        t.stream_end[slot.stream] = now
        # Its stream has passed its waits: a producer's event no other wait refers to is free.
        for i in range(slot.waits):
            waited = slot.after[i]
            t.events[waited].waiters -= 1
            if t.events[waited].waiters == 0 and t.events[waited].busy == 0:
                _release(t, waited)
        t.events[event].busy -= 1
        t.events[event].end = now
        if t.events[event].waiters == 0 and t.events[event].busy == 0:
            _release(t, event)
        complete(header, tasks, buffers, deps, task_id, t.ready)
        retired += 1
    return retired


@njit(cache=True, _nrt=False)
def issue_prepared(t, driver, header, tasks, buffers, deps, task, kernel, worker, producers, noted, function,
                   grid, block, shared, gemm, template_words, task_at, own):
    """Issue a task whose launch the backend prepared (CudaBackend.prepare: the template's
    words, the task's own at `task_at`) behind its `producers` (unless `noted`: already in the
    pending table), and retire what is reached: one call from Python. -1 when no event is free
    (call again); else the first status that is not 0 (state.failed_*), or 0."""
    if not noted:
        note_producers(t, task[0], producers)
    if grid != 0:
        for i in range(len(template_words)):
            t.words[i] = template_words[i]
        for i in range(len(task_at)):
            t.words[task_at[i]] = own[i]
    status = _send(t, driver, task, kernel, worker, function, grid, block, shared, gemm[0], t.tensors[:0])
    if status == 0:
        retire_reached(t, driver, header, tasks, buffers, deps, np.int64(1))  # see _issue_held
    return status


# --- the log's tasks -----------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def _word_count(args, slot):
    return args.count[slot, 0] * TENSOR_WORDS + args.count[slot, 1]


@njit(cache=True, _nrt=False, inline="always")
def _matrix_fits(words, param, ld):
    """Whether tensor `param`'s words are a row-major matrix of leading dim `ld` (rows
    contiguous; a one-row matrix any row step), as a GEMM record learnt for its shapes says."""
    w = param * TENSOR_WORDS
    rows, columns, row_step, column_step = words[w + 2], words[w + 3], words[w + 5], words[w + 6]
    return (columns <= 1 or column_step == 1) and (rows <= 1 or row_step == ld)


@njit(cache=True, _nrt=False, inline="always")
def _gemm_takes(gemm, words):
    """Whether a learnt GEMM (keyed by shapes, not strides) is this task's: its tiles' leading
    dims, and a panel batch's strides, are the record's (cuBLAS's A is our b, its B our a)."""
    fits = _matrix_fits(words, 0, gemm.ldb) and _matrix_fits(words, 1, gemm.lda)
    fits &= _matrix_fits(words, 2, gemm.ldc)
    if gemm.batch > 1:
        fits &= words[TENSOR_WORDS + 4] == gemm.stride_a and words[2 * TENSOR_WORDS + 4] == gemm.stride_c
    return fits


@njit(cache=True, _nrt=False, inline="always")
def _same_key(a, b):
    for w in range(b[1]):  # the words in use
        if a[w] != b[w]:
            return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def _batchable(t, tasks, args, slot, launch, gemm):
    """Whether the task in `slot` may lead a batch: its instance has work and is a generated
    kernel's (which walks its memrefs' leading dim as a batch) or a GEMM of one product, and
    its tensors have at most two dims."""
    if launch.grid == 0 or gemm.batch > 1 or not t.kernel_info[tasks[slot].kernel].batches:
        return False
    for p in range(args.count[slot, 0]):
        if args.desc[slot, p, D_NDIM] > 2:
            return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def _joins(t, tasks, args, leader, key, words, strides, n, task_id, launch, gemm):
    """Whether task `task_id` may follow the n - 1 tasks after `leader` (a slot; its instance
    key `key`, its argument words `words`) in one launch: the leader's instance, its words equal
    but for its tensors' pointers, each advancing from the previous task's by the batch's step
    (`strides`, bytes; set here by the first follower: whole elements, and for a GEMM not
    backwards, as cuBLAS documents no negative strides). Dependencies are the caller's."""
    window = len(t.slots)
    other = task_id & (window - 1)
    if args.task[other] != task_id or tasks[other].kernel != tasks[leader].kernel:
        return False
    if not instance_key(tasks, t.kernel_info, args, window, task_id, t.other_key) or \
            not _same_key(t.other_key, key):
        return False
    task_words(t.other_words, args, other, launch.integer, t.double, t.bits)
    tensors = args.count[leader, 0]
    same = True
    for w in range(_word_count(args, leader)):
        if w % TENSOR_WORDS != 0 or w >= tensors * TENSOR_WORDS:
            same &= t.other_words[w] == words[w]
    for p in range(tensors):
        step = t.other_words[p * TENSOR_WORDS] - words[p * TENSOR_WORDS] - (n - 1) * strides[p]
        if n == 1:
            if step % args.desc[leader, p, D_ITEMSIZE] != 0 or (step < 0 and gemm.batch != 0):
                return False
            strides[p] = step
        same &= step == strides[p]
    return same


@njit(cache=True, _nrt=False)
def _batch(t, tasks, args, log, first, logged, edges, planned, launch, gemm):
    """How many tasks go out as one launch with log[first] (its key in t.key, its words in
    t.words; t.batch[0] and t.batch_at[0] the caller's), left in t.batch[:n] (their positions
    in t.batch_at): it and later tasks of the
    log that depend on none of them and join it (`_joins`; the steps in t.strides), at most
    BATCH_LIMIT. In a planned log (`plan`) they are any of its ready tasks, in the log's order,
    until STRANGERS of other kernels or MISSES of its own did not join; in another, those right
    after it. 1: it goes alone."""
    leader = log[first, 0]
    slot = leader & (len(t.slots) - 1)
    if not _batchable(t, tasks, args, slot, launch, gemm):
        return 1
    n = 1
    if planned:
        strangers = misses = 0
        at = _next_ready(t.ready_at, first + 1)
        while 0 <= at < logged and n < BATCH_LIMIT and strangers < STRANGERS and misses < MISSES:
            task_id = log[at, 0]
            if tasks[task_id & (len(t.slots) - 1)].kernel != tasks[slot].kernel:
                strangers += 1
            elif _joins(t, tasks, args, slot, t.key, t.words, t.strides, n, task_id, launch, gemm):
                t.batch[n] = task_id
                t.batch_at[n] = at
                n += 1
            else:
                misses += 1
            at = _next_ready(t.ready_at, at + 1)
        return n
    while first + n < logged and n < BATCH_LIMIT:
        task_id = log[first + n, 0]
        edge, end = _edges_of(edges, task_id)
        dependent = False
        for e in range(edge, end):  # on the leader or a task after it: on one of the batch
            dependent |= edges[e, 0] >= leader
        if dependent or not _joins(t, tasks, args, slot, t.key, t.words, t.strides, n, task_id, launch, gemm):
            break
        t.batch[n] = task_id
        t.batch_at[n] = first + n
        n += 1
    return n


# --- a flush's plan: its tasks' producers in the flush, and which are ready ---------------------


@njit(cache=True, _nrt=False, inline="always")
def _position(log, logged, task_id):
    """Where a task is in a log of ascending ids, or -1."""
    if log[logged - 1, 0] - log[0, 0] == logged - 1:  # consecutive ids, as a compiled flush's mostly are
        at = task_id - log[0, 0]
        return at if 0 <= at < logged else -1
    at = _first_from(log, 0, logged, task_id)
    return at if at < logged and log[at, 0] == task_id else -1


@njit(cache=True, _nrt=False, inline="always")
def _next_ready(ready, at):
    """The first ready position from `at` on, or -1."""
    word = at >> 6
    if word >= len(ready):
        return -1
    bits = ready[word] & (np.int64(-1) << (at & 63))
    while bits == 0:
        word += 1
        if word == len(ready):
            return -1
        bits = ready[word]
    return (word << 6) + trailing_zeros(bits)


@njit(cache=True, _nrt=False)
def plan(t, log, logged, edges):
    """Plan the issue of a flushed log: per position its producers in the log and its consumers
    there (from the flush's edge log), and the positions whose producers in the log are all
    issued (none yet: those with none). Whether it is planned; a log of more tasks or edges than
    the plan holds, or not in ascending ids, is not, and issues in order."""
    if logged == 0 or logged >= len(t.plan) or len(edges) > len(t.successors):
        return False
    for at in range(1, logged):
        if log[at, 0] <= log[at - 1, 0]:
            return False
    for at in range(logged + 1):
        row = t.plan[at]
        row.left = row.issued = row.first_successor = 0
    for e in range(len(edges)):
        consumer, producer = _position(log, logged, edges[e, 1]), _position(log, logged, edges[e, 0])
        if consumer >= 0 and producer >= 0:
            t.plan[consumer].left += 1
            t.plan[producer + 1].first_successor += 1
    for at in range(1, logged + 1):
        t.plan[at].first_successor += t.plan[at - 1].first_successor
    for at in range(logged):
        t.plan[at].fill = t.plan[at].first_successor
    for e in range(len(edges)):
        consumer, producer = _position(log, logged, edges[e, 1]), _position(log, logged, edges[e, 0])
        if consumer >= 0 and producer >= 0:
            t.successors[t.plan[producer].fill] = consumer
            t.plan[producer].fill += 1
    t.ready_at[:] = 0
    for at in range(logged):
        if t.plan[at].left == 0:
            t.ready_at[at >> 6] |= np.int64(1) << (at & 63)
    return True


@njit(cache=True, _nrt=False, inline="always")
def _issued(t, at):
    """Position `at` of a planned log is issued: its consumers there whose last producer it was
    are ready."""
    row = t.plan[at]
    row.issued = 1
    t.ready_at[at >> 6] &= ~(np.int64(1) << (at & 63))
    for k in range(row.first_successor, t.plan[at + 1].first_successor):
        consumer = t.successors[k]
        t.plan[consumer].left -= 1
        if t.plan[consumer].left == 0 and t.plan[consumer].issued == 0:
            t.ready_at[consumer >> 6] |= np.int64(1) << (consumer & 63)


@njit(cache=True, _nrt=False, inline="always")
def _send(t, driver, ids, kernel, worker, function, grid, block, shared, gemm, tensors):
    """Issue the tasks `ids` (their producers noted; ids[0] the leader, whose argument words are
    in t.words) as one launch of `function`, or one call of the GEMM `gemm`: with several, each
    tensor's leading dim is their count and its stride t.strides (bytes from one task's pointer
    to the next; `tensors` rows: each tensor's pointer word and itemsize), the grid times the
    count. The followers run on the leader's stream and retire on its event. -1 when no event
    is free (nothing taken); else the first status that is not 0 (state.failed_*), or 0."""
    s = t.state[0]
    n = len(ids)
    leader = ids[0]
    now = monotonic_ns()
    status = _begin(t, driver, leader, kernel, worker, now)
    if status != 0:
        return status
    slot = t.slots[leader & (len(t.slots) - 1)]
    for f in range(1, n):
        status = _join(t, driver, ids[f], kernel, slot.stream, slot.event, now, leader)
        if status != 0:
            return status
    if grid != 0:
        if n > 1:
            for p in range(len(tensors)):
                t.words[tensors[p, 0] + 1] = n
                t.words[tensors[p, 0] + 4] = t.strides[p] // tensors[p, 1]
            grid = min(MAX_BLOCKS, grid * n)
            if gemm.batch != 0:  # cuBLAS's A is our b, its B our a
                gemm.batch = n
                gemm.stride_a = t.strides[1] // tensors[1, 1]
                gemm.stride_b = t.strides[0] // tensors[0, 1]
                gemm.stride_c = t.strides[2] // tensors[2, 1]
        stream = slot.stream
        status = start(driver, t.blas[stream], function, grid, block, shared, gemm, t.handles[stream],
                       t.words, t.params)
        if status != 0:
            return _fail(t, leader, status, GEMM if gemm.batch != 0 else LAUNCH)
        s.launches += 1
    status = _record(t, driver, leader)
    if status != 0:
        return status
    for f in range(1, n):  # in flight behind the leader, on its event
        _enter(t, ids[f])
    return 0


NO_INSTANCE, NOT_LEARNT = -2, -1  # what `_learnt` answers instead of a slot


@njit(cache=True, _nrt=False, inline="always")
def _learnt(t, tasks, args, task_id):
    """The learnt launches' slot of the instance of a task whose arguments are in `args` (its
    key left in t.key); NO_INSTANCE where it has no instance key, NOT_LEARNT where its
    instance's launch is not learnt."""
    if not instance_key(tasks, t.kernel_info, args, len(t.slots), task_id, t.key):
        return NO_INSTANCE
    found = find(t.keys, t.filled, t.key)
    return found if t.filled[found] != 0 else NOT_LEARNT


@njit(cache=True, _nrt=False, nogil=True)
def issue_logged(t, driver, header, tasks, buffers, deps, args, log, first, logged, edges, planned):
    """Issue the logged tasks log[first:logged], each behind its producers in `edges` (the
    flushed edge log), retiring those reached on the way, until one needs Python (an instance
    not learnt yet, a kernel not issued here: state.why NEEDS_PYTHON; its edges are noted), no
    event is free (NEEDS_EVENTS) or a driver call fails (FAILED); the position to go on from:
    logged, the one that stopped it (NEEDS_*; the Python way's next, which a planned log marks
    issued), or after the launch that failed. Each launch is led by the first task not issued
    (in a `planned` log, `plan`, its followers may be later ones, which the positions after it
    skip)."""
    s = t.state[0]
    s.why = 0
    window = len(t.slots)
    i = first
    while i < logged:
        if planned and t.plan[i].issued:
            i += 1
            continue
        task_id = log[i, 0]
        _note_producers_in(t, edges, task_id)
        slot = task_id & (window - 1)
        kernel = tasks[slot].kernel
        s.why = NEEDS_PYTHON
        if args.task[slot] != task_id or kernel >= len(t.kernel_info) or not t.kernel_info[kernel].native:
            return _to_python(t, i, planned)
        found = _learnt(t, tasks, args, task_id)
        if found < 0:
            return _to_python(t, i, planned)
        launch = t.launches[found]
        t.gemm[0] = t.gemms[found]  # a copy: a batch sets its count and strides
        gemm = t.gemm[0]
        n = 1
        t.batch[0] = task_id
        t.batch_at[0] = i
        if launch.grid != 0:
            task_words(t.words, args, slot, launch.integer, t.double, t.bits)
            if gemm.batch != 0 and not _gemm_takes(gemm, t.words):
                return _to_python(t, i, planned)  # learnt from tiles of these shapes, other strides
            n = _batch(t, tasks, args, log, i, logged, edges, planned, launch, gemm)
        if s.free == 0:  # before the followers' edges are noted: a retry forms the batch again
            s.why = NEEDS_EVENTS
            return i
        for f in range(1, n):
            _note_producers_in(t, edges, t.batch[f])
        tensors = args.count[slot, 0]
        for p in range(tensors):
            t.tensors[p, 0] = p * TENSOR_WORDS
            t.tensors[p, 1] = args.desc[slot, p, D_ITEMSIZE]
        if _send(t, driver, t.batch[:n], kernel, tasks[slot].worker, launch.function, launch.grid,
                 launch.block, launch.shared, gemm, t.tensors[:tensors]) != 0:
            return i
        s.native += n
        if planned:
            for f in range(n):
                _issued(t, t.batch_at[f])
        retire_reached(t, driver, header, tasks, buffers, deps, n)
        if s.failed_task >= 0:
            s.why = FAILED
            return i + (1 if planned else n)
        i += 1 if planned else n
    return logged


@njit(cache=True, _nrt=False, inline="always")
def _to_python(t, at, planned):
    """Position `at` goes the Python way, which issues it next (or fails the run)."""
    if planned:
        _issued(t, at)
    return at


# --- Python submits ------------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def _issue_held(t, driver, header, tasks, buffers, deps, args, go):
    """Issue the first `go` held tasks (the log's way: batches as `_batch` forms them) and drop
    them and their noted edges from the held log, which so holds only tasks not issued; 0, or
    RESUME where issue_logged stopped (at the log's first task now; held.upto: the tasks from
    there that were to go)."""
    h = t.held[0]
    # A constant argument is typed as its literal value, and numba compiles a callee again for
    # each literal (issue_logged and its _batch took 10 s and 5 s cold): np.int64 and np.bool_
    # give the types of the calls from Python.
    issued = issue_logged(t, driver, header, tasks, buffers, deps, args, t.held_log, np.int64(0), go,
                          t.held_edges[:h.edges], np.bool_(False))
    _drop_held(t, issued)
    if issued < go:
        h.upto = go - issued
        return RESUME
    return 0


@njit(cache=True, _nrt=False, inline="always")
def _drop_held(t, go):
    """Forget the first `go` held tasks, issued, and their edges."""
    h = t.held[0]
    if go == 0:
        return
    noted, _ = _edges_of(t.held_edges[:h.edges], t.held_log[go - 1, 0] + 1)
    for i in range(go, h.count):
        t.held_log[i - go, 0] = t.held_log[i, 0]
    h.count -= go
    for e in range(noted, h.edges):
        t.held_edges[e - noted, 0] = t.held_edges[e, 0]
        t.held_edges[e - noted, 1] = t.held_edges[e, 1]
    h.edges -= noted


@njit(cache=True, _nrt=False)
def drop_held(t, go):
    _drop_held(t, go)


@njit(cache=True, _nrt=False)
def submit_python(t, driver, header, tasks, buffers, deps, args, task_id, producers):
    """A Python submit whose arguments are in `args` (Scheduler.try_submit wrote them), behind
    `producers`, of a learnt instance: held to go out with the next ones of its instance as one
    launch when it joins the held ones (`_joins`; it depends on none of them), or after them,
    leading a new batch where its instance batches, or issued at once: one call from Python.
    An instance whose last batches went alone (a chain, scalars that differ) is not held but
    for every PROBE-th task: a held task starts only once the next submit comes. 0, or what
    Python is to do (UNLEARNT, PYTHON_WAY, RESUME, EDGES_FULL)."""
    h = t.held[0]
    window = len(t.slots)
    slot = task_id & (window - 1)
    found = _learnt(t, tasks, args, task_id)
    if found < 0:
        return PYTHON_WAY if found == NO_INSTANCE else UNLEARNT
    launch = t.launches[found]
    gemm = t.gemms[found]
    if launch.grid != 0 and gemm.batch != 0:
        task_words(t.words, args, slot, launch.integer, t.double, t.bits)
        if not _gemm_takes(gemm, t.words):
            return PYTHON_WAY  # learnt from tiles of these shapes but other strides
    if h.edges + len(producers) > len(t.held_edges):
        return EDGES_FULL
    if h.count > 0:
        leader = t.held_log[0, 0]
        joins = h.count < BATCH_LIMIT
        for i in range(len(producers)):
            joins &= producers[i] < leader
        if joins and _joins(t, tasks, args, leader & (window - 1), t.held_key, t.held_words, t.held_strides,
                            h.count, task_id, launch, gemm):
            _hold(t, task_id, producers)
            return 0
        _held_batch_goes(t)
    go = h.count  # the held ones go; this one leads a batch, or goes with them
    holds = _batchable(t, tasks, args, slot, launch, gemm)
    if holds and t.alone[found] > 2:
        t.skipped[found] += 1
        holds = t.skipped[found] % PROBE == 0
    _hold(t, task_id, producers)
    if holds:
        h.instance = found
        task_words(t.held_words, args, slot, launch.integer, t.double, t.bits)
        for w in range(len(t.key)):
            t.held_key[w] = t.key[w]
    else:
        go += 1
    if go == 0:
        return 0
    return _issue_held(t, driver, header, tasks, buffers, deps, args, go)


@njit(cache=True, _nrt=False, inline="always")
def _held_batch_goes(t):
    """The held batch is about to go out: its instance's count of batches in a row that went
    alone (one task) grows, or starts again (the alone/PROBE policy of `submit_python`)."""
    h = t.held[0]
    t.alone[h.instance] = t.alone[h.instance] + 1 if h.count == 1 else 0


@njit(cache=True, _nrt=False, inline="always")
def _hold(t, task_id, producers):
    """Append a task and its producer edges to the held log."""
    h = t.held[0]
    t.held_log[h.count, 0] = task_id
    h.count += 1
    for i in range(len(producers)):
        t.held_edges[h.edges, 0] = producers[i]
        t.held_edges[h.edges, 1] = task_id
        h.edges += 1


@njit(cache=True, _nrt=False)
def release_python(t, driver, header, tasks, buffers, deps, args):
    """Issue the held Python submits; 0, or RESUME."""
    h = t.held[0]
    if h.count == 0:
        return 0
    _held_batch_goes(t)
    return _issue_held(t, driver, header, tasks, buffers, deps, args, h.count)


@njit(cache=True, _nrt=False)
def unlearnt(t, tasks, args, log, first, logged, seen, seen_filled, ids):
    """The first task of each instance among log[first:logged] whose launch is not learnt,
    ids[:n], at most len(ids) of them: n. Their keys go to `seen`, an instance table of its
    own (twice len(ids) slots, so at most half full). `admit` has the backend start compiling
    them all before it issues the first."""
    window = len(t.slots)
    n = 0
    for i in range(first, logged):
        task_id = log[i, 0]
        if not tables_key(tasks, t.kernel_info, args, window, task_id, t.key):
            continue
        if t.filled[find(t.keys, t.filled, t.key)] != 0:
            continue
        found = find(seen, seen_filled, t.key)
        if seen_filled[found] != 0:
            continue
        for w in range(len(t.key)):
            seen[found, w] = t.key[w]
        seen_filled[found] = 1
        ids[n] = task_id
        n += 1
        if n == len(ids):
            break
    return n


@njit(cache=True, _nrt=False)
def learn(t, tasks, args, task_id, function, grid, block, shared, gemm, integer):
    """Enter the launch of a logged task's instance, made the Python way, for its later tasks;
    whether the instance is learnt (here or before)."""
    if not tables_key(tasks, t.kernel_info, args, len(t.slots), task_id, t.key):
        return False
    found = find(t.keys, t.filled, t.key)
    if t.filled[found] != 0:
        return True
    if not takes_more(t.filled):
        return False
    for i in range(len(t.key)):
        t.keys[found, i] = t.key[i]
    launch = t.launches[found]
    launch.function = function
    launch.grid = grid
    launch.block = block
    launch.shared = shared
    t.gemms[found] = gemm[0]
    for i in range(len(integer)):
        launch.integer[i] = integer[i]
    t.filled[found] = 1
    return True


# --- the executor --------------------------------------------------------------------------------


def serves(backend, profile: Profile, scheduler: Scheduler) -> bool:
    """Whether a stream run goes through this executor: on a CUDA driver, and no record of each
    task is wanted (a trace, cost measurements, validation checks)."""
    return (getattr(backend, "device", None) is not None and hasattr(backend.device, "driver")
            and not profile.tracing and not profile.measuring and not scheduler.validate)


class DriverStreamExecutor:
    runs_kernels = True
    wants_producers = True
    # The lanes protocol of compiled sessions (jit/host.py): this executor is its own lanes.
    takes_edges = True

    def __init__(self, scheduler: Scheduler, backend, profile: Profile, streams: dict[WorkerType, int]):
        self._scheduler = scheduler
        self._backend = backend
        self._profile = profile
        self._driver = backend.device.driver
        self._addresses = self._driver.addresses
        state = scheduler.state
        self._core = (state.header, state.tasks, state.buffers, state.deps)
        window = state.sizes.task_window
        handles, self._lanes, self._stream_class = [], [], []
        class_streams = np.zeros((CLASSES, MAX_STREAMS), np.int64)
        class_count = np.zeros(CLASSES, np.int64)
        for worker, count in streams.items():
            for i in range(count):
                if len(handles) == MAX_STREAMS:
                    raise UsageError(f"workers= gives {sum(streams.values())} streams in all; the stream "
                                     f"executor on a CUDA driver takes at most {MAX_STREAMS}")
                class_streams[worker, i] = len(handles)
                handles.append(backend.stream((worker.name, i)))
                self._lanes.append(profile.lane(f"{worker.name}-stream-{i}", (worker,)))
                self._stream_class.append(worker)
            class_count[worker] = count
        kernels = list(registered())
        instances = _LEARNT.get(backend)
        if instances is None:
            instances = _LEARNT[backend] = LearntLaunches.allocate()
        scratch = Scratch()
        double = np.zeros(1, np.float64)
        pending = np.zeros(window, PENDING)
        pending["consumer"] = -1
        state_row = np.zeros(1, STATE)
        state_row["failed_task"] = -1
        slots = np.zeros(window, SLOT)
        slots["task"] = -1
        # A view of the field, tested after every submit: 80 ns, where state[0]["failed_task"]
        # took 380 of a Python submit's ~5 µs.
        self._failed_task = state_row["failed_task"]
        self._t = Tables(
            state=state_row, ring=np.zeros(window, np.int64), slots=slots,
            # In use at once: the tasks in flight, and the retired producers they wait on.
            events=np.zeros(window * len(handles) + EVENT_BATCH, EVENT),
            pool=np.zeros(window * len(handles) + EVENT_BATCH, np.int64), pending=pending,
            class_streams=class_streams, class_count=class_count, handles=np.array(handles, np.int64),
            given=np.full(len(handles), -1, np.int64), tail_events=np.full(len(handles), -1, np.int64),
            blas=np.zeros(len(handles), np.int64), stream_end=np.zeros(len(handles), np.int64),
            stats=np.zeros((len(handles), len(kernels), 2), np.int64),
            kernel_info=cuda_kernel_info(kernels, backend.runs_library), keys=instances.keys,
            filled=instances.filled, launches=instances.launches, gemms=instances.gemms,
            key=np.zeros(KEY_WIDTH, np.int64), other_key=np.zeros(KEY_WIDTH, np.int64), words=scratch.words,
            other_words=np.zeros_like(scratch.words), strides=np.zeros(MAX_PARAMS, np.int64),
            tensors=np.zeros((MAX_PARAMS, 2), np.int64),
            gemm=np.zeros(1, GEMM_CALL), params=scratch.params, double=double, bits=double.view(np.int64),
            ready=scheduler.ready_scratch(), held=np.zeros(1, HELD),
            held_log=np.zeros((BATCH_LIMIT + 1, 2), np.int64), held_edges=np.zeros((HELD_EDGES, 2), np.int64),
            held_key=np.zeros(KEY_WIDTH, np.int64),
            held_words=np.zeros_like(scratch.words), held_strides=np.zeros(MAX_PARAMS, np.int64),
            alone=np.zeros(INSTANCES, np.int64), skipped=np.zeros(INSTANCES, np.int64),
            batch=np.zeros(BATCH_LIMIT, np.int64), batch_at=np.zeros(BATCH_LIMIT, np.int64),
            plan=np.zeros(LOG_CAPACITY + 1, PLAN), successors=np.zeros(EDGE_CAPACITY, np.int64),
            ready_at=np.zeros((LOG_CAPACITY + 63) // 64, np.int64))
        # Python submits of these write their arguments to the run's tables (Scheduler.try_submit),
        # which `submit_python` issues from as a compiled flush's tasks are.
        self.kernel_ids = frozenset(int(k) for k in np.flatnonzero(self._t.kernel_info["native"]))
        if instances.gemms["batch"].any():  # the native path may meet a GEMM learnt in an earlier run
            self._take_blas_handles()
        self._scratch = scratch  # owns the words `params` points at
        self._kernels = kernels
        self._args: ArgTables | None = None
        self._edges = _NO_EDGES  # the flush's edge log (`edges`)
        self._room_batch = max(1, window // 8)
        self._event_batch = min(EVENT_BATCH, window)
        # A Python submit's numba calls, by their compiled entries: numba's dispatch types each of
        # the tables' arrays at every call (2.3 us), an entry only unboxes them (~0.6 us).
        words = np.zeros(1, np.int64)
        self._issue_prepared = compiled_entry(
            issue_prepared, self._t, self._addresses, *self._core, words, 0, 0, words, False, 0, 0, 0, 0,
            NO_WORK.gemm, words, words, words)
        # compiled for the run's argument tables (native_lanes), which Python submits write first
        self._submit_python = self._release_python = None
        self._one = np.zeros(1, np.int64)  # a task issued the Python way: its id
        self._released = False  # held submits were issued since make_room last looked
        # Python submits from one whose instance was compiling when it came, in order: each with
        # its producers and its own instance's compile (None where made), issued as those end.
        self._behind: deque[tuple[Task, np.ndarray, Future | None]] = deque()

    @property
    def native_tasks(self) -> int:
        """Tasks issued from the argument tables (compiled orchestrations' and Python submits'),
        without the backend preparing their launch."""
        return int(self._t.state[0]["native"])

    @property
    def cross_waits(self) -> int:
        """Event waits enqueued: a stream waiting for a producer's event on another."""
        return int(self._t.state[0]["waits"])

    @property
    def native_launches(self) -> int:
        """The launches (and cuBLAS calls) made, Python submits' and compiled tasks': fewer than
        the tasks where tasks were batched."""
        return int(self._t.state[0]["launches"])

    # --- compiled sessions (jit/host.py) ------------------------------------------------
    def native_lanes(self, args: ArgTables, kernels: list) -> DriverStreamExecutor:
        self._args = args
        self._submit_python = compiled_entry(submit_python, self._t, self._addresses, *self._core, args, 0,
                                             np.zeros(1, np.int64))
        self._release_python = compiled_entry(release_python, self._t, self._addresses, *self._core, args)
        return self

    def edges(self, edge_log: np.ndarray) -> None:
        """A flush's edge log, which the next `admit` reads."""
        self._issue_behind(wait=True)  # submitted before the log's tasks: issued before them
        self._release_held()
        self._edges = edge_log

    def admit(self, log: np.ndarray, logged: int) -> int:
        """Issue a flushed log's tasks (`plan`: each launch led by the first not issued, in the
        log's order); none is left for the session to submit."""
        self._issue_behind(wait=True)
        planned = plan(self._t, log, logged, self._edges)
        self._issue_log(log, 0, logged, self._edges, planned=planned)
        note_after(self._t, self._edges, int(log[logged - 1, 0]) if logged else -1)
        self._edges = _NO_EDGES
        return 0

    # --- the orchestrator's side ---------------------------------------------------------
    def submitted(self, task: Task, ready: bool, producers) -> None:
        if self._behind:  # after a submit whose instance is compiling: in order behind it
            self._behind.append((task, np.array(producers, np.int64), self._backend.start(task)))
            self._issue_behind(wait=False)
        else:
            self._submit(task, producers, may_wait=True)

    def _submit(self, task: Task, producers, may_wait: bool) -> None:
        """Issue (or hold) a Python submit; `may_wait`: where its instance is compiling, have
        it wait for that behind the submits to come (_wait_behind) instead of waiting here."""
        prepared = False  # not yet
        while task.native:  # its arguments are in the tables: issued (or held) from there
            status = self._submit_python(self._t, self._addresses, *self._core, self._args, task.id,
                                         producers)
            if status == 0:
                self._raise_any_failure()  # one found while retiring what was reached
                return
            if status == RESUME:
                self._resume_held()
                return
            if status == EDGES_FULL:
                self._release_held()
                if len(producers) > len(self._t.held_edges):
                    self._t = self._t._replace(held_edges=np.zeros((2 * len(producers), 2), np.int64))
            elif status == UNLEARNT and prepared is False:  # its instance's first task: learnt here
                prepared = self._prepare(task, wait=not may_wait)
                if isinstance(prepared, Future):
                    self._wait_behind(task, producers, prepared)
                    return
                if not self._learn(task.id, None if prepared is None else prepared[0]):
                    break
            else:
                break  # PYTHON_WAY, or an instance the table did not take
        if prepared is False and may_wait:
            prepared = self._prepare(task, wait=False)
            if isinstance(prepared, Future):
                self._wait_behind(task, producers, prepared)
                return
        self._release_held()
        self._issue(task, np.ascontiguousarray(producers, np.int64), prepared)

    def _wait_behind(self, task: Task, producers, making: Future) -> None:
        """`task` waits for its instance's compile (`making`, started by `prepare`, or under
        way): the submits before it go out, and it and those after wait in order (_behind)
        while the orchestration goes on submitting, whose new instances so compile beside it."""
        self._release_held()
        self._behind.append((task, np.array(producers, np.int64), making))

    def _issue_behind(self, wait: bool) -> None:
        """Issue the submits behind a compile, in order: those whose instances are made (every
        one, waiting for each compile, with `wait`). A compile that failed is the TaskError of
        its first task, and none after it is issued."""
        while self._behind:
            task, producers, making = self._behind[0]
            if not wait and making is not None and not making.done():
                return
            self._released = True  # issued since make_room last looked, as held submits are
            try:
                self._behind.popleft()
                if making is not None and (failed := making.exception()) is not None:
                    self._release_held()
                    self._fail(task, failed)
                self._submit(task, producers, may_wait=False)
            except BaseException:
                self._behind.clear()
                raise

    def make_room(self, status: int, unfreed) -> None:
        self._issue_behind(wait=True)
        self._release_held()
        released, self._released = self._released, False
        state = self._t.state[0]
        if state["head"] == state["tail"]:
            if released:  # held submits went out (here, or at a compiled flush) and have retired
                return
            raise self._scheduler.deadlock(status, unfreed())
        # Wait for a batch of the oldest tasks, not one (streams.py's make_room says why).
        started = time.perf_counter()
        retired = 0
        while retired < self._room_batch and state["head"] != state["tail"]:
            self._wait_for_oldest()
            retired += self._retire(self._room_batch - retired)
        self._profile.stalled(RINGS[status].key, time.perf_counter() - started)

    def _issue_log(self, log: np.ndarray, i: int, logged: int, edges: np.ndarray,
                   stopped: bool = False, planned: bool = False) -> None:
        """Issue log[i:logged] (a compiled flush's log, `planned`, or the held Python submits')
        behind the producers in `edges`, the Python way where issue_logged cannot; `stopped`:
        issue_logged has just stopped at log[i] (why: in the state). At the first task of an
        instance not learnt yet, the log's other new instances start compiling too, side by
        side, before it is issued."""
        t = self._t
        prefetched = False
        while i < logged:
            if not stopped:
                i = issue_logged(t, self._addresses, *self._core, self._args, log, i, logged, edges, planned)
            stopped = False
            why = int(t.state[0]["why"])
            if i == logged and why != FAILED:
                break
            if why == FAILED:
                self._raise_failure()
            if why == NEEDS_EVENTS:
                self._more_events()
                continue
            if not prefetched:
                self._prefetch(log, i, logged)
                prefetched = True
            self._learn(int(log[i, 0]), self._issue(self._scheduler.task(int(log[i, 0])), _NOTED))
            i += 1

    def finish(self) -> None:
        self._issue_behind(wait=True)
        self._release_held()
        state = self._t.state[0]
        while state["head"] != state["tail"]:
            self._wait_for_oldest()
            self._retire(len(self._t.ring))
        self._report()

    def abort(self) -> None:
        """Run what was submitted (held submits too: the tasks submitted before a raise run, as on
        every executor), leaving nothing enqueued: the next run's buffers may take this run's
        heap space. An interrupt while it waits for compiles drops the submits behind them and
        is raised once nothing is enqueued."""
        interrupted = None
        try:
            self._issue_behind(wait=True)
            self._release_held()
        except Exception:  # the error being raised is the one to report
            self._behind.clear()
            self._forget_held()
        except BaseException as again:  # an interrupt while waiting for compiles: stop waiting
            self._behind.clear()
            self._forget_held()
            interrupted = again
        t = self._t
        state = t.state[0]
        for position in range(int(state["head"]), int(state["tail"])):
            task_id = int(t.ring[position & (len(t.ring) - 1)])
            event = int(t.events[t.slots[task_id & (len(t.slots) - 1)]["event"]]["handle"])
            try:
                self._backend.synchronize(event)
            except DeadlockError:  # a stuck stream: every later wait would time out again
                break
            except Exception:  # a failed task's: the error being raised is the one to report
                continue
        state["head"] = state["tail"]
        self._scheduler.release_records()
        if interrupted is not None:
            raise interrupted

    # --- helpers -------------------------------------------------------------------------
    def _prepare(self, task: Task, wait: bool = True) -> tuple[Template, np.ndarray] | Future | None:
        """The task's launch and own words (the backend's `prepare`), None for a library call;
        not `wait`: the Future of its instance's compile where that is still to end."""
        try:
            return self._backend.prepare(task, wait)
        except Exception as cause:  # a compile error, or a new instance's module load under a fault
            self._release_held()
            self._fail(task, cause)

    def _issue(self, task: Task, producers: np.ndarray, prepared=False) -> Template | None:
        """Issue a task the Python way (its launch prepared by the backend, or `prepared`), behind
        `producers` (_NOTED: those in the pending table); the instance's launch, None where a
        library call ran."""
        if prepared is False:
            prepared = self._prepare(task)
        if prepared is None:
            self._run_library(task, producers)
            return None
        launch, own = prepared
        t = self._t
        self._blas_for(launch)
        self._one[0] = task.id
        while (status := self._issue_prepared(
                t, self._addresses, *self._core, self._one, task.kernel.id, int(task.worker), producers,
                producers is _NOTED, launch.function, launch.grid, launch.block, launch.shared, launch.gemm,
                launch.words, launch.task_words, own)) < 0:
            self._more_events()
        if status != 0 or self._failed_task[0] >= 0:
            self._raise_failure()
        return launch

    def _release_held(self) -> None:
        """Issue the held Python submits (as the batches they form)."""
        if self._t.held[0]["count"]:
            self._released = True
            if self._release_python(self._t, self._addresses, *self._core, self._args) == RESUME:
                self._resume_held()
            self._raise_any_failure()

    def _resume_held(self) -> None:
        """Go on issuing held Python submits where submit_python or release_python stopped (no
        free event, or a failed call: held tasks are all of learnt instances)."""
        t = self._t
        held = t.held[0]
        upto = int(held["upto"])
        try:
            self._issue_log(t.held_log, 0, upto, t.held_edges[:int(held["edges"])], True)
        except BaseException:
            self._forget_held()  # a failed run: what was not issued is not (as a compiled flush's)
            raise
        drop_held(t, upto)

    def _forget_held(self) -> None:
        self._t.held[0]["count"] = self._t.held[0]["edges"] = 0

    def _blas_for(self, launch: Template) -> None:
        """Each stream's cuBLAS handle, before the first GEMM is issued or learnt here."""
        if launch.gemm[0]["batch"] and not self._t.blas[0]:
            self._take_blas_handles()

    def _take_blas_handles(self) -> None:
        t = self._t
        for stream, handle in enumerate(t.handles):
            t.blas[stream] = self._backend.blas_handle(int(handle))

    def _run_library(self, task: Task, producers: np.ndarray) -> None:
        """A library call (cuBLAS through CuPy, on a GPU) between the waits and the record."""
        t = self._t
        if producers is not _NOTED:
            note_producers(t, task.id, producers)
        while (status := begin(t, self._addresses, task.id, task.kernel.id, int(task.worker))) < 0:
            self._more_events()
        if status == 0:
            stream = int(t.handles[t.slots[task.id & (len(t.slots) - 1)]["stream"]])
            try:
                self._backend.library(task, stream)
            except Exception as cause:
                self._fail(task, cause)
            status = record(t, self._addresses, task.id)
        if status != 0:
            self._raise_failure()
        self._retire(1)

    def _fail(self, task: Task, cause: Exception) -> NoReturn:
        """The TaskError of a call made for `task` that failed: that of a task in flight that
        faulted, if one did (a device fault fails every later call, a module load's too), else
        `task`'s."""
        self._retire(len(self._t.ring))
        raise TaskError.of(task, cause) from cause

    def _prefetch(self, log: np.ndarray, first: int, logged: int) -> None:
        """Have the backend start compiling the instances of log[first:logged] not learnt yet."""
        ids = np.zeros(PREFETCH, np.int64)
        seen, seen_filled = np.zeros((2 * PREFETCH, KEY_WIDTH), np.int64), np.zeros(2 * PREFETCH, np.int64)
        count = unlearnt(self._t, self._core[1], self._args, log, first, logged, seen, seen_filled, ids)
        if count > 1:  # one alone compiles as it is issued
            self._backend.prefetch([self._scheduler.task(int(task_id)) for task_id in ids[:count]])

    def _learn(self, task_id: int, launch: Template | None) -> bool:
        """Enter the launch of a task whose arguments are in the tables for its instance's later
        tasks; whether the instance is learnt."""
        if launch is None or self._args is None:
            return False
        self._blas_for(launch)
        integer = np.zeros(MAX_SCALARS, np.int64)
        integer[:len(launch.integer_scalars)] = launch.integer_scalars
        return learn(self._t, self._core[1], self._args, task_id, launch.function, launch.grid, launch.block,
                     launch.shared, launch.gemm, integer)

    def _retire(self, limit: int) -> int:
        retired = retire_reached(self._t, self._addresses, *self._core, limit)
        if self._failed_task[0] >= 0:
            self._raise_failure()
        return retired

    def _wait_for_oldest(self) -> None:
        t = self._t
        task_id = int(t.ring[t.state[0]["head"] & (len(t.ring) - 1)])
        event = int(t.events[t.slots[task_id & (len(t.slots) - 1)]["event"]]["handle"])
        try:
            self._backend.synchronize(event)
        except CudaError:
            self._retire(1)  # names the task
            raise
        except Exception as cause:  # the wait timed out
            raise TaskError.of(self._scheduler.task(task_id), cause) from cause

    def _raise_any_failure(self) -> None:
        if self._failed_task[0] >= 0:
            self._raise_failure()

    def _raise_failure(self) -> None:
        state = self._t.state[0]
        failed = tuple(int(state[f]) for f in FAILURE)
        if failed[2] != QUERY and state["head"] != state["tail"]:
            # A device fault fails every later call: a task in flight that faulted is the one to name.
            state["failed_task"] = -1
            retire_reached(self._t, self._addresses, *self._core, len(self._t.ring))
            if state["failed_task"] < 0:
                for field, value in zip(FAILURE, failed):
                    state[field] = value
        task_id, status, call = (int(state[f]) for f in FAILURE)
        if task_id < 0:
            raise InvariantError("a driver stream call failed with no task to name")
        try:
            self._driver.check(status, CALLS[call])
        except CudaError as cause:
            raise TaskError.of(self._scheduler.task(task_id), cause) from cause

    def _more_events(self) -> None:
        t = self._t
        state = t.state[0]
        made = int(state["made"])
        if made + self._event_batch > len(t.events):
            raise InvariantError(f"{made} events in use: more than the executor's bound")
        for index in range(made, made + self._event_batch):
            t.events[index]["handle"] = self._backend.take_event()
            t.pool[state["free"]] = index
            state["free"] += 1
        state["made"] = made + self._event_batch

    def _report(self) -> None:
        """The run's kernel times into the lanes, and its events back to the backend."""
        t = self._t
        for stream, lane in enumerate(self._lanes):
            for kernel in np.flatnonzero(t.stats[stream, :, 0]):
                tasks, ns = (int(n) for n in t.stats[stream, kernel])
                lane.ran_natively(self._kernels[kernel].name, self._stream_class[stream], tasks, ns / 1e9)
        for index in range(int(t.state[0]["made"])):
            self._backend.release(int(t.events[index]["handle"]))
        t.state[0]["made"] = t.state[0]["free"] = 0
        self._scheduler.release_records()

