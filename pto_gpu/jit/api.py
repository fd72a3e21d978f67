"""The calls a compiled orchestration makes: alloc, free, version_inc, scopes, submit.

Each is an njit function over the JitOrchestrator `o` that calls the numba core directly,
or, in a pipelined run, queues a submit's core part for the core stage (jit/pipeline.py).
Compiled code leaves for Python only through `_service` (bridge.py's callback): to hand
a batch of submitted tasks to the executor, to wait when a ring is full, to check
invariants in validation mode, and to raise an error with a message that names the bad
argument. Tensor params come first in a compiled submit, scalars after (the convention of
every kernel in kernels/).

Like the core, they compile without numba's runtime (`_nrt=False`: no reference counts, no
allocation) and read `o`'s tables through `context.tables`.
"""

from __future__ import annotations

import numpy as np
from numba import literal_unroll, njit, types
from numba.core import cgutils
from numba.cpython.unsafe.tuple import tuple_setitem
from numba.extending import intrinsic, overload

from ..core import complete as core_complete
from ..core import rings
from ..core.lock import back_off, load_acquire, store_release
from ..core.state import FULL_TASKS, INOUT, INPUT, MAX_PARAMS, OUTPUT
from ..core.submit import submit as core_submit
from ..dtypes import DataType
from ..layout import P_KIND
from ..overlap import Overlap
from ..sharing import Sharing, next_shared
from . import bridge, placing
from .context import (
    C_LABEL,
    EDGE_CAPACITY,
    G_COUNT,
    G_PARAM,
    G_PARAM_WIDTH,
    K_MIXED,
    K_NAMES,
    K_SHARING,
    K_TENSORS,
    K_WORKER,
    L_CHECKED,
    L_DESC,
    M_ALIVE_SEEN,
    M_ANSWER,
    M_BUFFER_MASK,
    M_COMM,
    M_COMPLETE_AT_SUBMIT,
    M_EDGES,
    M_FIRST_TAG,
    M_HEAP_BASE,
    M_LOG_EDGES,
    M_LOG_LIMIT,
    M_LOGGED,
    M_PIPELINE,
    M_PLACED,
    M_RANK,
    M_RECV_KERNEL,
    M_SCOPE_DEPTH,
    M_SCOPE_TOP,
    M_SEND_KERNEL,
    M_SERVICE,
    M_SESSION,
    M_TAGS,
    M_TASK_MASK,
    M_VALIDATE,
    MAX_SCALARS,
    MAX_SCOPE_DEPTH,
    NO_DATATYPE,
    P_DONE,
    P_FULL,
    P_QUEUED,
    PARAM_DTYPE,
    PARAM_NDIM,
    PLACED_COMPILED,
    PLAN_DATATYPE,
    PLAN_DESC,
    PLAN_INDEX,
    PLAN_PEER,
    PLAN_SENDS,
    PLAN_SEQUENCE,
    S_FLOAT,
    S_INT,
    SCOPE_CAPACITY,
    SHAPE_BOUND,
    SHAPE_CODE,
    T_HANDLE,
    T_ITEMSIZE,
    T_NDIM,
    T_SHAPE,
    T_STRIDE,
    VERSION_LIVE,
    VERSION_MADE,
    VERSION_WRITTEN,
    PlacedOrchestratorType,
    tables,
)
from .descriptor import (
    D_BASE,
    D_DTYPE,
    D_ITEMSIZE,
    D_KEY,
    D_LEVEL,
    D_NBYTES,
    D_NDIM,
    D_OFFSET,
    D_SHAPE,
    D_STRIDE,
    D_VERSION,
    DESC_WIDTH,
    MAX_JIT_DIMS,
    with_version,
    write_layout,
)
from .pipeline import prefetch_slot

ITEMSIZES = tuple(DataType(code).itemsize for code in range(len(DataType)))
_ZERO_DESC = (0,) * DESC_WIDTH
_STRIDED_EXACT = int(Overlap.STRIDED_EXACT)
_SHARING_ANY, _SHARING_UNJUDGED = int(Sharing.ANY), int(Sharing.UNJUDGED)
_SHARING_SAME_VIEW = int(Sharing.SAME_VIEW)


# --- params ------------------------------------------------------------------------------
# A param's kind is a run-time int64, not its constant: numba types a constant as its literal
# value and compiles `submit` for each tuple of them, so a body's (input, input, output) and
# (inout, input, input) calls took a compile each (~3 s cold); now one for each count of params
# (and types of scalars).
@njit(cache=True, _nrt=False)
def input(desc):  # noqa: A001 - the contract's name
    return np.int64(INPUT), desc


@njit(cache=True, _nrt=False)
def output(desc):
    return np.int64(OUTPUT), desc


@njit(cache=True, _nrt=False)
def inout(desc):
    return np.int64(INOUT), desc


# --- memory ------------------------------------------------------------------------------
@njit(cache=True, _nrt=False)
def alloc(o, shape, dtype, owner=-1):
    """A contiguous heap tensor of `shape` (a tuple of up to 4 ints) and DataType code `dtype`.
    In a distributed run it is rank `owner`'s, so the tasks that write it run there (-1: the
    default, o.on_rank's around the `o.compiled` call, else rank 0); one process is rank 0."""
    t = tables(o)
    ndim = len(shape)
    if ndim > MAX_JIT_DIMS or dtype < 0 or dtype >= len(ITEMSIZES):
        _service(t.meta, bridge.ERR_ALLOC_ARGS, ndim, dtype, 0)
    if not t.meta[M_PLACED] and owner != -1 and owner != 0:
        _service(t.meta, bridge.ERR_OWNER, owner, 0, 0)
    itemsize = ITEMSIZES[dtype]
    nbytes = itemsize
    for n in shape:
        if n < 0:
            _service(t.meta, bridge.ERR_ALLOC_ARGS, ndim, dtype, n)
        nbytes *= n
    wait_for_core(o)  # the heap ring's state, and the header's line, are the core stage's while it runs
    if rings.heap_size(nbytes) > t.header[0].heap_cap:
        _service(t.meta, bridge.ERR_ALLOC_SIZE, nbytes, 0, 0)
    while True:
        seq = rings.heap_alloc(t.header, t.buffers, nbytes)
        if seq >= 0:
            break
        _service(t.meta, bridge.SERVICE_ROOM, seq, 0, 0)
    if t.meta[M_VALIDATE]:
        _service(t.meta, bridge.SERVICE_CHECK, seq, bridge.CHECK_ALLOC, 0)
    slot = seq & t.meta[M_BUFFER_MASK]
    t.heap_versions[slot, VERSION_WRITTEN] = 0
    t.heap_versions[slot, VERSION_MADE] = 0
    t.heap_versions[slot, VERSION_LIVE] = seq
    desc = tuple_setitem(_ZERO_DESC, D_KEY, seq)
    desc = tuple_setitem(desc, D_BASE, t.meta[M_HEAP_BASE] + t.buffers[slot].offset)
    desc = tuple_setitem(desc, D_NBYTES, nbytes)
    desc = tuple_setitem(desc, D_DTYPE, dtype)
    desc = tuple_setitem(desc, D_ITEMSIZE, itemsize)
    desc = tuple_setitem(desc, D_LEVEL, _STRIDED_EXACT)
    desc = tuple_setitem(desc, D_NDIM, ndim)
    stride = 1
    for k in range(ndim - 1, -1, -1):
        desc = tuple_setitem(desc, D_SHAPE + k, shape[k])
        desc = tuple_setitem(desc, D_STRIDE + k, stride)
        stride *= shape[k]
    depth = t.meta[M_SCOPE_DEPTH]
    if depth > 0:
        top = t.meta[M_SCOPE_TOP]
        if top == SCOPE_CAPACITY:
            _service(t.meta, bridge.ERR_SCOPE_FULL, SCOPE_CAPACITY, 0, 0)
        t.scope[top] = seq
        t.meta[M_SCOPE_TOP] = top + 1
    if _placer_hears_of_alloc(o, seq, nbytes, itemsize, dtype, owner):
        _name(t, desc, 0)
        _service(t.meta, bridge.SERVICE_ALLOCATED, seq, owner, 0)
    return desc


@njit(cache=True, _nrt=False)
def free(o, desc):
    """No more uses will be added; the memory returns once every user has completed."""
    t = tables(o)
    key = desc[D_KEY]
    if key < 0:
        _service(t.meta, bridge.ERR_FREE_EXTERNAL, key, 0, 0)
    if not _unfreed(t, key):
        _service(t.meta, bridge.ERR_DOUBLE_FREE, key, 0, 0)
    # Frees reach the core in program order: after every submit queued before them, whose
    # references keep the buffer's memory until their tasks complete.
    wait_for_core(o)
    _free(o, key)


@njit(cache=True, _nrt=False)
def _free(o, key):
    t = tables(o)
    t.heap_versions[key & t.meta[M_BUFFER_MASK], VERSION_LIVE] = -1
    rings.buffer_free(t.header, t.buffers, key)
    if t.meta[M_VALIDATE]:
        _service(t.meta, bridge.SERVICE_CHECK, key, bridge.CHECK_FREE, 0)
    if _placer_hears_of_free(o, key):
        _service(t.meta, bridge.SERVICE_FREED, key, 0, 0)


@njit(cache=True, _nrt=False)
def version_inc(o, desc):
    """A handle to the same memory at version + 1; each version has one (single assignment)."""
    t = tables(o)
    _check_usable(o, desc, -1, -1)
    versions = _versions_of(o, desc[D_KEY])
    if desc[D_VERSION] < versions[VERSION_MADE]:
        _fail_naming(t, desc, 0, bridge.ERR_VERSION_TAKEN, 0, 0, 0)
    versions[VERSION_MADE] = desc[D_VERSION] + 1
    return with_version(desc, desc[D_VERSION] + 1)


@njit(cache=True, _nrt=False)
def owner_of(o, desc):
    """The rank owning the first element of `desc` (0 in one process): where tasks writing it
    run, and the owner to give a heap tile that accumulates it (alloc's `owner`)."""
    _check_usable(o, desc, -2, -1)
    return _owner(o, desc)


@njit(cache=True, _nrt=False)
def scope_begin(o):
    """Open a scope: scope_end frees every buffer allocated since that is not freed yet."""
    t = tables(o)
    depth = t.meta[M_SCOPE_DEPTH]
    if depth == MAX_SCOPE_DEPTH:
        _service(t.meta, bridge.ERR_SCOPE_DEPTH, MAX_SCOPE_DEPTH, 0, 0)
    t.scope_marks[depth] = t.meta[M_SCOPE_TOP]
    t.meta[M_SCOPE_DEPTH] = depth + 1


@njit(cache=True, _nrt=False)
def scope_end(o):
    t = tables(o)
    depth = t.meta[M_SCOPE_DEPTH] - 1
    if depth < 0:
        _service(t.meta, bridge.ERR_SCOPE_DEPTH, -1, 0, 0)
    mark = t.scope_marks[depth]
    if mark < t.meta[M_SCOPE_TOP]:
        wait_for_core(o)
    for i in range(mark, t.meta[M_SCOPE_TOP]):
        if _unfreed(t, t.scope[i]):
            _free(o, t.scope[i])
    t.meta[M_SCOPE_TOP] = mark
    t.meta[M_SCOPE_DEPTH] = depth


# --- tasks -------------------------------------------------------------------------------
@njit(cache=True, _nrt=False)
def submit(o, kernel_id, tensors, scalars=()):
    """Submit one kernel call: `tensors` a tuple of input()/output()/inout() params, then
    `scalars` a tuple of numbers. Returns the task id.

    Only what reads the tuples (the checks of their lengths and the stores of the arguments
    into the slot the task will have) is compiled for each signature of a call; what follows
    takes the slot and is compiled once (`_enter`, `_queue`; a distributed run's `_placed`,
    behind `_into_core`, which its type chooses for each signature). A body calls submit
    with several signatures (a LLaMA layer's, 6): compiled whole for each, they took ~15 s of
    numba's time each on a fresh machine (a 2-core Xeon VM), ~2 s now."""
    t = tables(o)
    n = len(tensors)
    if n > MAX_PARAMS or len(scalars) > MAX_SCALARS:
        _service(t.meta, bridge.ERR_TOO_MANY, n, len(scalars), 0)
    if kernel_id < 0 or kernel_id >= len(t.kernels):
        _service(t.meta, bridge.ERR_KERNEL, kernel_id, 0, 0)
    if t.meta[M_PIPELINE]:
        slot = _queue_slot(o, n)
        _store_arguments(tables(o), slot, tensors, scalars)
        return _queue(o, kernel_id, slot)
    slot = _free_slot(o, n)[1]
    _store_arguments(tables(o), slot, tensors, scalars)
    return _into_core(o, kernel_id, slot, tensors, scalars)


@njit(cache=True, _nrt=False, inline="always")
def _store_arguments(t, slot, tensors, scalars):
    """A submit's tensors and scalars into the slot's argument tables, unchecked."""
    _store_params(tensors, t.arg_desc[slot], t.arg_kind[slot])
    t.arg_count[slot, 0] = len(tensors)
    t.arg_count[slot, 1] = _store_scalars(t.arg_float[slot], t.arg_int[slot], t.arg_scalar_kind[slot],
                                          scalars)


@njit(cache=True, _nrt=False)
def _enter(o, kernel_id, slot):
    """A submit whose arguments are in `slot` (the next task's, free), into the core."""
    t = tables(o)
    task_id = t.header[0].next_task
    n = t.arg_count[slot, 0]
    while True:
        params = _checked_arguments(o, kernel_id, task_id, slot)
        status = core_submit(t.header, t.tasks, t.buffers, t.deps, t.entries, t.buckets, t.producers,
                             t.covered, kernel_id, t.kernels[kernel_id, K_WORKER], params[:n])
        if status >= 0:
            break
        # The slot is not the task's yet: making room may raise. It stays free (the window had
        # room for the task), so its arguments stay, checked again on the next try.
        t.arg_task[slot] = -1
        _service(t.meta, bridge.SERVICE_ROOM, status, n, 0)
        t = tables(o)  # a recording run's room is a grown TensorMap: new entries, producers, covered
    _entered(o, task_id, slot, n)
    return task_id


@njit(cache=True, _nrt=False, inline="always")
def _entered(o, task_id, slot, n):
    """What follows a submit's entry into the core: versions, checks, edges, the log."""
    t = tables(o)
    _note_versions(o, slot, n)
    if t.meta[M_VALIDATE]:
        _service(t.meta, bridge.SERVICE_CHECK, task_id, bridge.CHECK_SUBMIT, 0)
    if t.meta[M_LOG_EDGES]:
        _record_edges(o, task_id)
    ready = t.header[0].last_ready
    if t.meta[M_COMPLETE_AT_SUBMIT]:
        core_complete.complete(t.header, t.tasks, t.buffers, t.deps, task_id, t.ready)
        if t.meta[M_VALIDATE]:
            _service(t.meta, bridge.SERVICE_CHECK, task_id, bridge.CHECK_COMPLETE, 0)
        if not t.meta[M_LOG_EDGES]:
            return
    logged = t.meta[M_LOGGED]
    t.log[logged, 0] = task_id
    t.log[logged, 1] = ready
    t.meta[M_LOGGED] = logged + 1
    if logged + 1 >= t.meta[M_LOG_LIMIT]:
        _service(t.meta, bridge.SERVICE_FLUSH, 0, 0, 0)


# --- a distributed run's paths ----------------------------------------------------------------
# Each chosen by the type of `o` (context.PlacedOrchestratorType: a distributed run's), so the
# code of other runs never compiles `_placed` nor jit/placing.py's placement (plan, apply,
# hold_allocated, release_held, owner_of; its `unwritable` check serves every run).
_PLACED_PATH = {"_nrt": False}  # as the rest of this module: `o` passed without reference counts


def _into_core(o, kernel_id, slot, tensors, scalars):
    """A submit whose arguments are in `slot`, into the core (`_enter`), or a distributed run's
    placed (`_placed`, whose transfers may take the slot first: the arguments are stored again
    in the one `_placed_enter` takes); the task's id as users see it."""


@overload(_into_core, jit_options=_PLACED_PATH)
def _into_core_impl(o, kernel_id, slot, tensors, scalars):
    if not isinstance(o, PlacedOrchestratorType):
        return lambda o, kernel_id, slot, tensors, scalars: _enter(o, kernel_id, slot)

    def placed(o, kernel_id, slot, tensors, scalars):
        label, again = _placed(o, kernel_id, slot)
        if again < 0:
            return label
        _store_arguments(tables(o), again, tensors, scalars)  # its transfers took the slot
        return _placed_enter(o, kernel_id, again)

    return placed


def _placer_hears_of_alloc(o, seq, nbytes, itemsize, dtype, owner):
    """Whether a distributed run's Python placer hears of a new heap tile: unless compiled
    placement keeps its tables itself (placing.hold_allocated). Other runs have no placer."""


@overload(_placer_hears_of_alloc, jit_options=_PLACED_PATH)
def _placer_hears_of_alloc_impl(o, seq, nbytes, itemsize, dtype, owner):
    if not isinstance(o, PlacedOrchestratorType):
        return lambda o, seq, nbytes, itemsize, dtype, owner: False

    def hears(o, seq, nbytes, itemsize, dtype, owner):
        t = tables(o)
        return not (t.meta[M_PLACED] == PLACED_COMPILED
                    and placing.hold_allocated(t, seq, nbytes, itemsize, dtype, owner))

    return hears


def _placer_hears_of_free(o, key):
    """Whether a distributed run's Python placer hears of a freed buffer: unless compiled
    placement held it (placing.release_held). Other runs have no placer."""


@overload(_placer_hears_of_free, jit_options=_PLACED_PATH)
def _placer_hears_of_free_impl(o, key):
    if not isinstance(o, PlacedOrchestratorType):
        return lambda o, key: False
    return lambda o, key: not placing.release_held(tables(o), key)


def _owner(o, desc):
    """The rank owning the first element of `desc`: 0 in one process; in a distributed run
    compiled placement's answer where it has one, else the Python placer's (SERVICE_OWNER)."""


@overload(_owner, jit_options=_PLACED_PATH)
def _owner_impl(o, desc):
    if not isinstance(o, PlacedOrchestratorType):
        return lambda o, desc: np.int64(0)  # an int64, as the placed one's: not a literal (see `input`)

    def owner(o, desc):
        t = tables(o)
        if t.meta[M_PLACED] == PLACED_COMPILED:
            found = placing.owner_of(t, desc)
            if found >= 0:
                return found
        _name(t, desc, 0)
        _service(t.meta, bridge.SERVICE_OWNER, 0, 0, 0)
        return t.meta[M_ANSWER]

    return owner


@njit(cache=True, _nrt=False)
def _placed(o, kernel_id, slot):
    """A distributed run's submit, its arguments in `slot` (the next task's): checked as
    `_enter` does, then placed by compiled code where it can be (jit/placing.py), with the
    transfers to and from this rank it needs entered first, and entered into the core if it
    runs on this rank; else taken from the slot by the Python orchestrator, which places it and
    enters it with the transfers it needs (SERVICE_PLACE). (Its id as users see it, -1) when
    that is all; (-1, the slot) where the task's transfers took the slot first: `submit` writes
    its arguments there again and `_placed_enter` enters it."""
    t = tables(o)
    n = t.arg_count[slot, 0]
    params = _checked_arguments(o, kernel_id, t.header[0].next_task, slot)
    rank, planned = placing.plan(t, slot, n) if t.meta[M_PLACED] == PLACED_COMPILED else (-1, 0)
    if planned and not _found_datatypes(o, planned):
        rank = -1
    if rank >= 0:
        placing.apply(t, slot, n, rank, planned)
    here = rank == t.meta[M_RANK]
    if not here or planned:
        # Not this rank's task, not placed yet, or its transfers take this id first: the slot
        # is no task's (the Python orchestrator's transfers may take the id too, and it writes
        # the task's arguments where the task lands).
        t.arg_task[slot] = -1
        if not here:  # (this rank's notes them once entered: its arguments are checked again)
            _note_versions(o, slot, n)
        if rank < 0:
            _service(t.meta, bridge.SERVICE_PLACE, slot, kernel_id, 0)
            return t.meta[M_ANSWER], -1
        for j in range(planned):
            _enter_transfer(o, tables(o).plan[j])
        if not here:
            return _next_label(tables(o)), -1
        return -1, _free_slot(o, n)[1]
    return _placed_core(o, kernel_id, t.header[0].next_task, slot, params), -1


@njit(cache=True, _nrt=False)
def _placed_enter(o, kernel_id, slot):
    """A placed task of this rank whose transfers went first, its arguments stored again in
    `slot` (the next task's), into the core: its id as users see it."""
    task_id = tables(o).header[0].next_task
    return _placed_core(o, kernel_id, task_id, slot, _checked_arguments(o, kernel_id, task_id, slot))


@njit(cache=True, _nrt=False, inline="always")
def _placed_core(o, kernel_id, task_id, slot, params):
    """A placed task of this rank, its arguments checked in `slot`, into the core."""
    t = tables(o)  # (making room may have grown a recording run's TensorMap)
    n = t.arg_count[slot, 0]
    label = _next_label(t)
    t.labels[slot] = label
    while True:
        status = core_submit(t.header, t.tasks, t.buffers, t.deps, t.entries, t.buckets, t.producers,
                             t.covered, kernel_id, t.kernels[kernel_id, K_WORKER], params[:n])
        if status >= 0:
            break
        t.arg_task[slot] = -1  # making room may raise
        _service(t.meta, bridge.SERVICE_ROOM, status, n, 0)
        t = tables(o)
        store_release(t.arg_task.ctypes.data + 8 * slot, task_id)
    _entered(o, task_id, slot, n)
    return label


@njit(cache=True, _nrt=False, inline="always")
def _free_slot(o, n):
    """The next task's id and slot, once the slot is free: a live task's arguments are its
    workers'."""
    t = tables(o)
    while True:
        h = t.header[0]
        if h.next_task - h.last_alive < h.window:
            return h.next_task, h.next_task & (h.window - 1)
        _service(t.meta, bridge.SERVICE_ROOM, FULL_TASKS, n, 0)
        t = tables(o)


@njit(cache=True, _nrt=False)
def _found_datatypes(o, planned):
    """Give each planned transfer (`plan`) the MPI datatype of its region, asking Python
    (SERVICE_DATATYPE) for those `datatypes` lacks; whether each has one."""
    t = tables(o)
    for j in range(planned):
        entry = t.plan[j]
        known = _datatype_row(t.datatypes, entry)
        if known < 0:
            _name(t, entry[PLAN_DESC:], 0)
            _service(t.meta, bridge.SERVICE_DATATYPE, 0, 0, 0)
            handle = t.meta[M_ANSWER]
            for row in range(len(t.datatypes)):
                if t.datatypes[row, T_NDIM] < 0:  # kept while there is room: a run has a few
                    _datatype_key(t.datatypes[row], entry)
                    t.datatypes[row, T_HANDLE] = handle
                    break
        else:
            handle = t.datatypes[known, T_HANDLE]
        if handle == NO_DATATYPE:
            return False
        entry[PLAN_DATATYPE] = handle
    return True


@njit(cache=True, _nrt=False, inline="always")
def _datatype_row(datatypes, entry):
    """The row of `datatypes` whose key is the region of plan row `entry`; -1 if none."""
    ndim, itemsize = entry[PLAN_DESC + D_NDIM], entry[PLAN_DESC + D_ITEMSIZE]
    for row in range(len(datatypes)):
        known = datatypes[row]
        if known[T_NDIM] == ndim and known[T_ITEMSIZE] == itemsize:
            same = True
            for d in range(ndim):
                same = same and known[T_SHAPE + d] == entry[PLAN_DESC + D_SHAPE + d] and \
                    known[T_STRIDE + d] == entry[PLAN_DESC + D_STRIDE + d]
            if same:
                return row
    return -1


@njit(cache=True, _nrt=False, inline="always")
def _datatype_key(known, entry):
    known[T_NDIM] = entry[PLAN_DESC + D_NDIM]
    known[T_ITEMSIZE] = entry[PLAN_DESC + D_ITEMSIZE]
    for d in range(MAX_JIT_DIMS):
        inside = d < known[T_NDIM]
        known[T_SHAPE + d] = entry[PLAN_DESC + D_SHAPE + d] if inside else 0
        known[T_STRIDE + d] = entry[PLAN_DESC + D_STRIDE + d] if inside else 0


@njit(cache=True, _nrt=False)
def _enter_transfer(o, entry):
    """Enter the transfer of plan row `entry` into the core, with its arguments where native
    workers post it (Placement._transfer's native transfers): the region, then its index,
    peer, tag, datatype and the run's communicator."""
    t = tables(o)
    sends = entry[PLAN_SENDS]
    kernel_id = t.meta[M_SEND_KERNEL] if sends else t.meta[M_RECV_KERNEL]
    kind = INPUT if sends else OUTPUT
    tag = t.meta[M_FIRST_TAG] + entry[PLAN_SEQUENCE] % t.meta[M_TAGS]  # (transport.tag)
    words = (entry[PLAN_INDEX], entry[PLAN_PEER], tag, entry[PLAN_DATATYPE], t.meta[M_COMM])
    while True:
        task_id, slot = _free_slot(o, 1)
        t = tables(o)
        region = t.arg_desc[slot, 0]
        for i in range(DESC_WIDTH):
            region[i] = entry[PLAN_DESC + i]
        t.arg_kind[slot, 0] = kind
        t.arg_count[slot, 0] = 1
        t.arg_count[slot, 1] = len(words)
        for i in range(len(words)):
            t.arg_int[slot, i] = words[i]
            t.arg_scalar_kind[slot, i] = S_INT
        _layout(o, kernel_id, 0, region, kind)  # (placing.plan found the region writable)
        params = t.layout_rows[kernel_id]
        params[0, P_KIND] = kind
        t.labels[slot] = -1  # not a task of the orchestration's
        store_release(t.arg_task.ctypes.data + 8 * slot, task_id)
        status = core_submit(t.header, t.tasks, t.buffers, t.deps, t.entries, t.buckets, t.producers,
                             t.covered, kernel_id, t.kernels[kernel_id, K_WORKER], params[:1])
        if status >= 0:
            break
        t.arg_task[slot] = -1
        _service(t.meta, bridge.SERVICE_ROOM, status, 1, 0)
    _entered(o, task_id, slot, 1)


@njit(cache=True, _nrt=False, inline="always")
def _next_label(t):
    label = t.counts[C_LABEL]
    t.counts[C_LABEL] = label + 1
    return label


@njit(cache=True, _nrt=False)
def _queue_slot(o, n):
    """A pipelined run's next slot, once free, for a submit of n tensors. The task id is the
    queue's next: the core stage's task ring alloc gives the same."""
    t = tables(o)
    task_id = t.pipe[P_QUEUED]
    mask = t.meta[M_TASK_MASK]
    if task_id - t.meta[M_ALIVE_SEEN] > mask:  # the slot may be a live task's: look again
        t.meta[M_ALIVE_SEEN] = _wait_for_slot(t, task_id)
    # The core stage last read the slot's lines a window ago, from its cache: taken back
    # early, they are here when the stores of the arguments need them (the stores stalled
    # without).
    prefetch_slot(t, (task_id + 2) & mask, n, 1)
    return task_id & mask


@njit(cache=True, _nrt=False)
def _queue(o, kernel_id, slot):
    """A pipelined run's submit, its arguments in `slot` (_queue_slot's): the checks and params
    as `_enter` makes them, the params copied into the task's slot for the core stage, which
    submits to the core in queue order."""
    t = tables(o)
    task_id = t.pipe[P_QUEUED]
    n = t.arg_count[slot, 0]
    params = _checked_arguments(o, kernel_id, task_id, slot)
    queued = t.slot_params[slot]
    for p in range(n):
        for i in range(params.shape[1]):
            queued[p, i] = params[p, i]
    info = t.slot_info[slot]
    info[0] = kernel_id
    info[1] = t.kernels[kernel_id, K_WORKER]
    info[2] = n
    _note_versions(o, slot, n)
    store_release(t.pipe.ctypes.data + 8 * P_QUEUED, task_id + 1)  # after everything it says
    return task_id


@njit(cache=True, _nrt=False, inline="always")
def _checked_arguments(o, kernel_id, task_id, slot):
    """Check the arguments a submit stored in the task's slot, and write its params (layout
    rows and kinds) into layout_rows[kernel_id], which it returns. The slot is free (its last
    task retired) and the submit's its only writer (_store_arguments, then this): a native
    worker (executors/native.py) finds the arguments as soon as the core publishes the task."""
    t = tables(o)
    n = t.arg_count[slot, 0]
    rows, kinds = t.arg_desc[slot], t.arg_kind[slot]
    params = t.layout_rows[kernel_id]
    for p in range(n):
        _check_usable(o, rows[p], p, kernel_id)
        _layout(o, kernel_id, p, rows[p], kinds[p])
        params[p, P_KIND] = kinds[p]
    if not _same_signature(t.signatures[kernel_id], rows, n):
        _check_signature(o, kernel_id, rows, n)
    if t.kernels[kernel_id, K_SHARING] != _SHARING_ANY:
        _check_sharing(o, kernel_id, params, rows, n)
    # Released before the core publishes the task: whoever sees it sees its arguments.
    store_release(t.arg_task.ctypes.data + 8 * slot, task_id)
    return params


@njit(cache=True, _nrt=False)
def _check_sharing(o, kernel_id, params, rows, n):
    """sharing.check for a compiled submit: params its layout rows, rows its descriptors."""
    t = tables(o)
    pair = next_shared(params, n, -1)
    while pair >= 0:
        rule = t.kernels[kernel_id, K_SHARING]
        if rule == _SHARING_UNJUDGED:
            _service(t.meta, bridge.SERVICE_SHARING, kernel_id, 0, 0)
            continue
        if rule == _SHARING_ANY:
            return
        written, other = pair // MAX_PARAMS, pair % MAX_PARAMS
        if not (rule == _SHARING_SAME_VIEW and params[other, P_KIND] == INPUT
                and _same_view(rows[written], rows[other])):
            _name(t, rows[written], 0)
            _name(t, rows[other], 1)
            _service(t.meta, bridge.ERR_SHARED, kernel_id, written, other)
        pair = next_shared(params, n, pair)


@njit(cache=True, _nrt=False, inline="always")
def _same_view(a, b):
    """sharing.same_view of two compiled descriptors."""
    if a[D_KEY] != b[D_KEY] or a[D_OFFSET] != b[D_OFFSET] or a[D_DTYPE] != b[D_DTYPE]:
        return False
    if a[D_NDIM] != b[D_NDIM]:
        return False
    for d in range(a[D_NDIM]):
        if a[D_SHAPE + d] != b[D_SHAPE + d]:
            return False
        if a[D_SHAPE + d] != 1 and a[D_STRIDE + d] != b[D_STRIDE + d]:
            return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def _note_versions(o, slot, n):
    """The versions the task in `slot` writes are written (its n tensors' outputs)."""
    t = tables(o)
    for p in range(n):
        if t.arg_kind[slot, p] != INPUT:
            _note_version(o, t.arg_desc[slot, p])


@njit(cache=True, _nrt=False)
def _wait_for_slot(t, task_id):
    """Wait until task_id's slot is free, serving the core stage if it waits for room; the
    tasks the stage has done then (the ring's last_alive)."""
    # The stage completes each task it submits (a dry run), so the tasks it has done are the
    # retired ones; P_DONE, unlike the header's last_alive, is stored with a release.
    return _wait_for_done(t, task_id - t.meta[M_TASK_MASK])


@njit(cache=True, _nrt=False)
def wait_for_core(o):
    """In a pipelined run, wait until the core stage has submitted every queued task, serving
    it when it waits for room; else nothing."""
    t = tables(o)
    if t.meta[M_PIPELINE]:
        _wait_for_done(t, t.pipe[P_QUEUED])


@njit(cache=True, _nrt=False, inline="always")
def _wait_for_done(t, target):
    """Wait until the core stage has done `target` tasks, serving it when it waits for room;
    how many it has done then."""
    done = t.pipe.ctypes.data + 8 * P_DONE
    waiting = 0
    last = -1
    while True:
        seen = load_acquire(done)
        if seen >= target:
            return seen
        if seen != last:  # the stage is working: the wait will be short, so it must not sleep
            last, waiting = seen, 0
        if not _serve_core(t):
            waiting = back_off(waiting)


@njit(cache=True, _nrt=False, inline="always")
def _serve_core(t):
    """If the core stage waits for room, make it (or raise, as `submit` would) and let it go
    on; whether it waited. It waits with nothing changed, so the service may sweep the core."""
    full = t.pipe.ctypes.data + 8 * P_FULL
    status = load_acquire(full)
    if status == 0:
        return False
    _service(t.meta, bridge.SERVICE_ROOM, status, t.pipe[P_FULL + 1], 0)
    store_release(full, 0)
    return True


@njit(cache=True, _nrt=False)
def flush(o):
    """Hand every logged task to the executor (the session calls it when the body returns)."""
    _service(tables(o).meta, bridge.SERVICE_FLUSH, 0, 0, 0)


# --- helpers -----------------------------------------------------------------------------
@njit(cache=True, _nrt=False)
def _service(meta, code, a, b, c):
    if bridge.call_service(meta[M_SERVICE], meta[M_SESSION], code, a, b, c) == bridge.RAISED:
        raise bridge.ServiceRaised()


@njit(cache=True, _nrt=False)
def _fail_naming(t, desc, position, code, a, b, c):
    """Raise the error `code` names, with the descriptor it is about in named[position]."""
    _name(t, desc, position)
    _service(t.meta, code, a, b, c)


@njit(cache=True, _nrt=False, inline="always")
def _name(t, desc, position):
    """named[position] = desc, for a service call about it."""
    for i in range(DESC_WIDTH):
        t.named[position, i] = desc[i]


@njit(cache=True, _nrt=False, inline="always")  # inlined: code without the runtime returns no views
def _versions_of(o, key):
    """The row of a buffer's versions (VERSION_* columns): a heap slot's or an external's."""
    t = tables(o)
    if key >= 0:
        return t.heap_versions[key & t.meta[M_BUFFER_MASK]]
    return t.externals[-1 - key]


@njit(cache=True, _nrt=False, inline="always")
def _check_usable(o, desc, position, kernel_id):
    t = tables(o)
    key = desc[D_KEY]
    if key >= 0 and not _unfreed(t, key):
        _fail_naming(t, desc, max(position, 0), bridge.ERR_USE_AFTER_FREE, position, kernel_id, key)
    if desc[D_VERSION] < _versions_of(o, key)[VERSION_WRITTEN]:
        _fail_naming(t, desc, max(position, 0), bridge.ERR_STALE, position, kernel_id, key)


@njit(cache=True, _nrt=False, inline="always")
def _unfreed(t, key):
    """Whether heap buffer `key` is allocated and not freed (VERSION_LIVE)."""
    return t.heap_versions[key & t.meta[M_BUFFER_MASK], VERSION_LIVE] == key


@njit(cache=True, _nrt=False)
def _check_writable(o, desc, position, kernel_id):
    """An output must be writeable memory, and not a broadcast view that would write over itself."""
    t = tables(o)
    why = placing.unwritable(t, desc)
    if why != placing.WRITABLE:
        _fail_naming(t, desc, position, bridge.ERR_UNWRITABLE, position, kernel_id, why)


@njit(cache=True, _nrt=False, inline="always")
def _note_version(o, desc):
    versions = _versions_of(o, desc[D_KEY])
    versions[VERSION_WRITTEN] = max(versions[VERSION_WRITTEN], desc[D_VERSION])


@njit(cache=True, _nrt=False, inline="always")
def _layout(o, kernel_id, position, desc, kind):
    """layout_rows[kernel_id, position] = the layout row of desc, which an output must be able to
    take; desc remembered for the kernel's position (`layouts`), so a descriptor submitted there
    again (flash attention's state tiles, a weight matrix) costs a comparison, not write_layout."""
    t = tables(o)
    memo = t.layouts[kernel_id, position]
    for i in range(DESC_WIDTH):
        if memo[L_DESC + i] != desc[i]:
            for j in range(DESC_WIDTH):
                memo[L_DESC + j] = desc[j]
            memo[L_CHECKED] = 0
            write_layout(desc, t.layout_rows[kernel_id, position])
            break
    if kind != INPUT and memo[L_CHECKED] == 0:
        _check_writable(o, desc, position, kernel_id)
        memo[L_CHECKED] = 1


@njit(cache=True, _nrt=False, inline="always")
def _same_signature(memo, rows, n):
    """Whether rows[:n] have the tensor count, dtypes and shapes of the call that last passed
    _signature_ok for this kernel (`signatures`): what it reads, so the same verdict."""
    if memo[G_COUNT] != n:
        return False
    for p in range(n):
        at = G_PARAM + p * G_PARAM_WIDTH
        ndim = rows[p, D_NDIM]
        if memo[at] != rows[p, D_DTYPE] or memo[at + 1] != ndim:
            return False
        for d in range(ndim):
            if memo[at + 2 + d] != rows[p, D_SHAPE + d]:
                return False
    return True


@njit(cache=True, _nrt=False)
def _check_signature(o, kernel_id, rows, n):
    """Raise the signature error if rows[:n] do not fit the kernel; else remember them."""
    t = tables(o)
    if not _signature_ok(o, kernel_id, rows, n):
        for p in range(n):
            for i in range(DESC_WIDTH):
                t.named[p, i] = rows[p, i]
        _service(t.meta, bridge.ERR_SIGNATURE, kernel_id, n, 0)
    _remember_signature(t.signatures[kernel_id], rows, n)


@njit(cache=True, _nrt=False, inline="always")
def _remember_signature(memo, rows, n):
    memo[G_COUNT] = n
    for p in range(n):
        at = G_PARAM + p * G_PARAM_WIDTH
        memo[at] = rows[p, D_DTYPE]
        memo[at + 1] = rows[p, D_NDIM]
        for d in range(rows[p, D_NDIM]):
            memo[at + 2 + d] = rows[p, D_SHAPE + d]


@njit(cache=True, _nrt=False)
def _signature_ok(o, kernel_id, rows, n):
    """The check Kernel.check makes, over the descriptors rows[:n] (the host names the fault)."""
    t = tables(o)
    declared = t.kernels[kernel_id, K_TENSORS]
    if declared >= 0:
        if declared != n:
            return False
        t.names[:t.kernels[kernel_id, K_NAMES]] = -1
        for p in range(n):
            ndim = rows[p, D_NDIM]
            if t.kernel_shapes[kernel_id, p, 0, PARAM_NDIM] != ndim:
                return False
            dtype = t.kernel_shapes[kernel_id, p, 0, PARAM_DTYPE]
            if dtype >= 0 and rows[p, D_DTYPE] != dtype:
                return False
            for d in range(ndim):
                code = t.kernel_shapes[kernel_id, p, 1 + d, SHAPE_CODE]
                bound = t.kernel_shapes[kernel_id, p, 1 + d, SHAPE_BOUND]
                size = rows[p, D_SHAPE + d]
                if bound >= 0 and size > bound:
                    return False
                if code >= 0:
                    if code != size:
                        return False
                elif t.names[-1 - code] < 0:
                    t.names[-1 - code] = size
                elif t.names[-1 - code] != size:
                    return False
    if t.kernels[kernel_id, K_MIXED] == 0:
        for p in range(1, n):
            if rows[p, D_DTYPE] != rows[0, D_DTYPE]:
                return False
    return True


@njit(cache=True, _nrt=False)
def _record_edges(o, task_id):
    t = tables(o)
    for i in range(t.header[0].last_edges):
        if t.meta[M_EDGES] == EDGE_CAPACITY:
            _service(t.meta, bridge.SERVICE_FLUSH, 0, 0, 0)
        e = t.meta[M_EDGES]
        t.edges[e, 0] = t.producers[i]
        t.edges[e, 1] = task_id
        t.meta[M_EDGES] = e + 1


@intrinsic
def _store_params(typingctx, tensors, rows, kinds):
    """rows[p] = the descriptor of tensors[p] and kinds[p] its kind, for every p, in straight-line
    code: a tuple read at a variable index is a jump table, per element (a fifth of a submit)."""
    if not isinstance(tensors, types.BaseTuple):
        return None

    def codegen(context, builder, signature, args):
        tensors_type, rows_type, kinds_type = signature.args
        rows_array = context.make_array(rows_type)(context, builder, args[1])
        kinds_array = context.make_array(kinds_type)(context, builder, args[2])
        for p, param_type in enumerate(tensors_type.types[:MAX_PARAMS]):  # submit refuses more first
            param = builder.extract_value(args[0], p)
            position = context.get_constant(types.intp, p)
            kind = context.cast(builder, builder.extract_value(param, 0), param_type.types[0], types.int64)
            kind_pointer = cgutils.get_item_pointer(context, builder, kinds_type, kinds_array, [position])
            builder.store(kind, kind_pointer)
            desc = builder.extract_value(param, 1)
            for i, field_type in enumerate(param_type.types[1].types):
                value = context.cast(builder, builder.extract_value(desc, i), field_type, types.int64)
                index = [position, context.get_constant(types.intp, i)]
                builder.store(value, cgutils.get_item_pointer(context, builder, rows_type, rows_array, index))
        return context.get_dummy_value()

    return types.void(tensors, rows, kinds), codegen


def _store_scalars(floats, ints, kinds, scalars):
    """Write the scalars of a submit into one slot's tables; how many there are."""


@overload(_store_scalars)
def _store_scalars_impl(floats, ints, kinds, scalars):
    if len(scalars) == 0:  # literal_unroll cannot iterate an empty tuple
        return lambda floats, ints, kinds, scalars: 0

    def store(floats, ints, kinds, scalars):
        i = 0
        for value in literal_unroll(scalars):
            _store_scalar(floats, ints, kinds, i, value)
            i += 1
        return i

    return store


def _store_scalar(floats, ints, kinds, i, value):
    """One scalar: integers (and bools) exactly, floats as float64."""


@overload(_store_scalar)
def _store_scalar_impl(floats, ints, kinds, i, value):
    if isinstance(value, (types.Integer, types.Boolean)):
        def store_int(floats, ints, kinds, i, value):
            ints[i] = np.int64(value)
            kinds[i] = S_INT
        return store_int

    def store_float(floats, ints, kinds, i, value):
        floats[i] = np.float64(value)
        kinds[i] = S_FLOAT
    return store_float
