"""The calls a compiled orchestration makes: alloc, free, version_inc, scopes, submit.

Each is an njit function over the JitOrchestrator `o` that calls the numba core directly.
Compiled code leaves for Python only through `_service` (a numba objmode block): to hand
a batch of submitted tasks to the executor, to wait when a ring is full, to check
invariants in validation mode, and to raise an error with a message that names the bad
argument. Tensor params come first in a compiled submit, scalars after (the convention of
every kernel in kernels/).
"""

from __future__ import annotations

import numpy as np
from numba import literal_unroll, njit, objmode, types
from numba.cpython.unsafe.tuple import tuple_setitem
from numba.extending import overload

from ..core import complete as core_complete
from ..core import rings
from ..core.state import INOUT, INPUT, MAX_PARAMS, OUTPUT
from ..core.submit import submit as core_submit
from ..dtypes import DataType
from ..layout import P_KIND
from ..overlap import Overlap
from . import bridge
from .context import (
    EDGE_CAPACITY,
    EXTERNAL_WRITEABLE,
    K_MIXED,
    K_NAMES,
    K_TENSORS,
    K_WORKER,
    M_COMPLETE_AT_SUBMIT,
    M_EDGES,
    M_HEAP_BASE,
    M_LOG_EDGES,
    M_LOG_LIMIT,
    M_LOGGED,
    M_SCOPE_DEPTH,
    M_SCOPE_TOP,
    M_SESSION,
    M_VALIDATE,
    MAX_SCALARS,
    MAX_SCOPE_DEPTH,
    S_FLOAT,
    S_INT,
    SCOPE_CAPACITY,
    SHAPE_BOUND,
    SHAPE_CODE,
    VERSION_MADE,
    VERSION_WRITTEN,
)
from .descriptor import (
    D_BASE,
    D_DTYPE,
    D_ITEMSIZE,
    D_KEY,
    D_LEVEL,
    D_NBYTES,
    D_NDIM,
    D_SHAPE,
    D_STRIDE,
    D_VERSION,
    DESC_WIDTH,
    MAX_JIT_DIMS,
    with_version,
    write_layout,
)

ITEMSIZES = tuple(DataType(code).itemsize for code in range(len(DataType)))
_ZERO_DESC = (0,) * DESC_WIDTH
_STRIDED_EXACT = int(Overlap.STRIDED_EXACT)


# --- params ------------------------------------------------------------------------------
@njit(cache=True)
def input(desc):  # noqa: A001 - the contract's name
    return INPUT, desc


@njit(cache=True)
def output(desc):
    return OUTPUT, desc


@njit(cache=True)
def inout(desc):
    return INOUT, desc


# --- memory ------------------------------------------------------------------------------
@njit(cache=True)
def alloc(o, shape, dtype):
    """A contiguous heap tensor of `shape` (a tuple of up to 4 ints) and DataType code `dtype`."""
    ndim = len(shape)
    if ndim > MAX_JIT_DIMS or dtype < 0 or dtype >= len(ITEMSIZES):
        _service(o, bridge.ERR_ALLOC_ARGS, ndim, dtype, 0)
    itemsize = ITEMSIZES[dtype]
    nbytes = itemsize
    for n in shape:
        if n < 0:
            _service(o, bridge.ERR_ALLOC_ARGS, ndim, dtype, n)
        nbytes *= n
    if rings.heap_size(nbytes) > o.header[0].heap_cap:
        _service(o, bridge.ERR_ALLOC_SIZE, nbytes, 0, 0)
    while True:
        seq = rings.heap_alloc(o.header, o.buffers, nbytes)
        if seq >= 0:
            break
        _service(o, bridge.SERVICE_ROOM, seq, 0, 0)
    if o.meta[M_VALIDATE]:
        _service(o, bridge.SERVICE_CHECK, seq, bridge.CHECK_ALLOC, 0)
    slot = seq & o.header[0].buf_mask
    o.heap_versions[slot, :] = 0
    desc = tuple_setitem(_ZERO_DESC, D_KEY, seq)
    desc = tuple_setitem(desc, D_BASE, o.meta[M_HEAP_BASE] + o.buffers[slot].offset)
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
    depth = o.meta[M_SCOPE_DEPTH]
    if depth > 0:
        top = o.meta[M_SCOPE_TOP]
        if top == SCOPE_CAPACITY:
            _service(o, bridge.ERR_SCOPE_FULL, SCOPE_CAPACITY, 0, 0)
        o.scope[top] = seq
        o.meta[M_SCOPE_TOP] = top + 1
    return desc


@njit(cache=True)
def free(o, desc):
    """No more uses will be added; the memory returns once every user has completed."""
    key = desc[D_KEY]
    if key < 0:
        _service(o, bridge.ERR_FREE_EXTERNAL, key, 0, 0)
    if not rings.buffer_unfreed(o.header, o.buffers, key):
        _service(o, bridge.ERR_DOUBLE_FREE, key, 0, 0)
    _free(o, key)


@njit(cache=True)
def _free(o, key):
    rings.buffer_free(o.header, o.buffers, key)
    if o.meta[M_VALIDATE]:
        _service(o, bridge.SERVICE_CHECK, key, bridge.CHECK_FREE, 0)


@njit(cache=True)
def version_inc(o, desc):
    """A handle to the same memory at version + 1; each version has one (single assignment)."""
    for i in range(DESC_WIDTH):
        o.pending[0, i] = desc[i]  # where the host finds the descriptor an error names
    _check_usable(o, desc, -1, -1)
    versions = _versions_of(o, desc[D_KEY])
    if desc[D_VERSION] < versions[VERSION_MADE]:
        _service(o, bridge.ERR_VERSION_TAKEN, 0, 0, 0)
    versions[VERSION_MADE] = desc[D_VERSION] + 1
    return with_version(desc, desc[D_VERSION] + 1)


@njit(cache=True)
def scope_begin(o):
    """Open a scope: scope_end frees every buffer allocated since that is not freed yet."""
    depth = o.meta[M_SCOPE_DEPTH]
    if depth == MAX_SCOPE_DEPTH:
        _service(o, bridge.ERR_SCOPE_DEPTH, MAX_SCOPE_DEPTH, 0, 0)
    o.scope_marks[depth] = o.meta[M_SCOPE_TOP]
    o.meta[M_SCOPE_DEPTH] = depth + 1


@njit(cache=True)
def scope_end(o):
    depth = o.meta[M_SCOPE_DEPTH] - 1
    if depth < 0:
        _service(o, bridge.ERR_SCOPE_DEPTH, -1, 0, 0)
    mark = o.scope_marks[depth]
    for i in range(mark, o.meta[M_SCOPE_TOP]):
        if rings.buffer_unfreed(o.header, o.buffers, o.scope[i]):
            _free(o, o.scope[i])
    o.meta[M_SCOPE_TOP] = mark
    o.meta[M_SCOPE_DEPTH] = depth


# --- tasks -------------------------------------------------------------------------------
@njit(cache=True)
def submit(o, kernel_id, tensors, scalars=()):
    """Submit one kernel call: `tensors` a tuple of input()/output()/inout() params, then
    `scalars` a tuple of numbers. Returns the task id."""
    n = len(tensors)
    if n > MAX_PARAMS or len(scalars) > MAX_SCALARS:
        _service(o, bridge.ERR_TOO_MANY, n, len(scalars), 0)
    if kernel_id < 0 or kernel_id >= len(o.kernels):
        _service(o, bridge.ERR_KERNEL, kernel_id, 0, 0)
    for p in range(n):
        kind, desc = tensors[p]
        for i in range(DESC_WIDTH):
            o.pending[p, i] = desc[i]
        _check_usable(o, desc, p, kernel_id)
        if kind != INPUT:
            _check_writable(o, desc, p, kernel_id)
        write_layout(desc, o.params[p])
        o.params[p, P_KIND] = kind
    if not _signature_ok(o, kernel_id, n):
        _service(o, bridge.ERR_SIGNATURE, kernel_id, n, 0)

    while True:
        task_id = core_submit(o.header, o.tasks, o.buffers, o.deps, o.entries, o.buckets, o.producers,
                              o.covered, kernel_id, o.kernels[kernel_id, K_WORKER], o.params[:n])
        if task_id >= 0:
            break
        _service(o, bridge.SERVICE_ROOM, task_id, n, 0)

    slot = task_id & (o.header[0].window - 1)
    for p in range(n):
        kind, desc = tensors[p]
        o.arg_desc[slot, p, :] = o.pending[p, :]
        o.arg_kind[slot, p] = kind
        if kind != INPUT:
            _note_version(o, desc)
    o.arg_count[slot, 0] = n
    o.arg_count[slot, 1] = _store_scalars(o.arg_float[slot], o.arg_int[slot], o.arg_scalar_kind[slot],
                                          scalars)
    if o.meta[M_VALIDATE]:
        _service(o, bridge.SERVICE_CHECK, task_id, bridge.CHECK_SUBMIT, 0)
    if o.meta[M_LOG_EDGES]:
        _record_edges(o, task_id)
    ready = o.header[0].last_ready
    if o.meta[M_COMPLETE_AT_SUBMIT]:
        core_complete.complete(o.header, o.tasks, o.buffers, o.deps, task_id, o.ready)
        if o.meta[M_VALIDATE]:
            _service(o, bridge.SERVICE_CHECK, task_id, bridge.CHECK_COMPLETE, 0)
        if not o.meta[M_LOG_EDGES]:
            return task_id
    logged = o.meta[M_LOGGED]
    o.log[logged, 0] = task_id
    o.log[logged, 1] = ready
    o.meta[M_LOGGED] = logged + 1
    if logged + 1 >= o.meta[M_LOG_LIMIT]:
        _service(o, bridge.SERVICE_FLUSH, 0, 0, 0)
    return task_id


@njit(cache=True)
def flush(o):
    """Hand every logged task to the executor (the session calls it when the body returns)."""
    _service(o, bridge.SERVICE_FLUSH, 0, 0, 0)


# --- helpers -----------------------------------------------------------------------------
@njit(cache=True)
def _service(o, code, a, b, c):
    session = o.meta[M_SESSION]
    with objmode():
        bridge.service(session, code, a, b, c)


@njit(cache=True)
def _versions_of(o, key):
    """The row of a buffer's versions (VERSION_* columns): a heap slot's or an external's."""
    if key >= 0:
        return o.heap_versions[key & o.header[0].buf_mask]
    return o.externals[-1 - key]


@njit(cache=True)
def _check_usable(o, desc, position, kernel_id):
    key = desc[D_KEY]
    if key >= 0 and not rings.buffer_unfreed(o.header, o.buffers, key):
        _service(o, bridge.ERR_USE_AFTER_FREE, position, kernel_id, key)
    if desc[D_VERSION] < _versions_of(o, key)[VERSION_WRITTEN]:
        _service(o, bridge.ERR_STALE, position, kernel_id, key)


@njit(cache=True)
def _check_writable(o, desc, position, kernel_id):
    """An output must be writeable memory, and not a broadcast view that would write over itself."""
    key = desc[D_KEY]
    if key < 0 and o.externals[-1 - key, EXTERNAL_WRITEABLE] == 0:
        _service(o, bridge.ERR_UNWRITABLE, position, kernel_id, -1)
    for dim in range(desc[D_NDIM]):
        if desc[D_STRIDE + dim] == 0 and desc[D_SHAPE + dim] > 1:
            _service(o, bridge.ERR_UNWRITABLE, position, kernel_id, dim)


@njit(cache=True)
def _note_version(o, desc):
    versions = _versions_of(o, desc[D_KEY])
    versions[VERSION_WRITTEN] = max(versions[VERSION_WRITTEN], desc[D_VERSION])


@njit(cache=True)
def _signature_ok(o, kernel_id, n):
    """The check Kernel.check makes, over the pending descriptors (the host names the fault)."""
    declared = o.kernels[kernel_id, K_TENSORS]
    if declared >= 0:
        if declared != n:
            return False
        o.names[:o.kernels[kernel_id, K_NAMES]] = -1
        for p in range(n):
            ndim = o.pending[p, D_NDIM]
            if o.kernel_shapes[kernel_id, p, 0, SHAPE_CODE] != ndim:
                return False
            for d in range(ndim):
                code = o.kernel_shapes[kernel_id, p, 1 + d, SHAPE_CODE]
                bound = o.kernel_shapes[kernel_id, p, 1 + d, SHAPE_BOUND]
                size = o.pending[p, D_SHAPE + d]
                if bound >= 0 and size > bound:
                    return False
                if code >= 0:
                    if code != size:
                        return False
                elif o.names[-1 - code] < 0:
                    o.names[-1 - code] = size
                elif o.names[-1 - code] != size:
                    return False
    if o.kernels[kernel_id, K_MIXED] == 0:
        for p in range(1, n):
            if o.pending[p, D_DTYPE] != o.pending[0, D_DTYPE]:
                return False
    return True


@njit(cache=True)
def _record_edges(o, task_id):
    for i in range(o.header[0].last_edges):
        if o.meta[M_EDGES] == EDGE_CAPACITY:
            _service(o, bridge.SERVICE_FLUSH, 0, 0, 0)
        e = o.meta[M_EDGES]
        o.edges[e, 0] = o.producers[i]
        o.edges[e, 1] = task_id
        o.meta[M_EDGES] = e + 1


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
