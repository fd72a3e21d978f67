"""The `o` of a compiled orchestration: a numba structref over the run's tables.

It holds the core's tables (shared with the Python orchestrator, not copied), the
per-slot argument tables compiled submits write so that a task's record can be built
later (`host.Session.materialise`), the log of tasks not yet handed to the executor, the
kernel table used to check signatures, what a submit remembers per kernel to skip work when
tiles repeat (`layouts`, `signatures`: a run's, made with its session), and a few counters in
`meta`. Fields are
reassignable from Python through `set_tensormap`, because a recording run may grow the
TensorMap while compiled code holds this reference.
"""

from __future__ import annotations

import collections
import struct

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic
from numba.experimental import structref

from ..core import state as cs
from ..layout import PARAM_WIDTH
from ..params import ParamKind
from .descriptor import D_NDIM, DESC_BYTES, DESC_WIDTH, MAX_JIT_DIMS, desc_bytes

MAX_SCALARS = 8  # scalar params per compiled submit
LOG_CAPACITY = 256  # tasks handed to the executor together
EDGE_CAPACITY = 4096  # recorded edges handed to the recorder together
SCOPE_CAPACITY = 4096  # buffers allocated in open scopes
MAX_SCOPE_DEPTH = 64
MAX_NAMES = cs.MAX_PARAMS * MAX_JIT_DIMS  # dim names in one kernel's shapes

# meta fields
M_LOGGED = 0  # tasks in the log
M_EDGES = 1  # edges in the edge log
M_SESSION = 2  # key of the host session (bridge.SESSIONS)
M_COMPLETE_AT_SUBMIT = 3  # dry runs: tasks retire inside compiled code
M_LOG_EDGES = 4  # each task's producers go to the edge log (for the recorder or the executor)
M_VALIDATE = 5
M_SCOPE_DEPTH = 6
M_SCOPE_TOP = 7
M_HEAP_BASE = 8
M_LOG_LIMIT = 9  # flush the log at this many tasks
M_SERVICE = 10  # the address of bridge.service's callback
M_PIPELINE = 11  # 1: submits queue the core's part for the core stage (jit/pipeline.py)
# Copies of header fields, for submits: in a pipelined run the header's lines are the core
# stage's, and a read of one took a line from the other core at every submit.
M_TASK_MASK = 12  # the task window - 1
M_BUFFER_MASK = 13  # the buffer table's length - 1
M_ALIVE_SEEN = 14  # the core stage's tasks done (its last_alive) when a submit last looked
# A distributed run's session (PLACED_*): the Python orchestrator places each heap buffer and
# free, and the submits compiled code does not place itself (jit/placing.py); a service call
# with an answer leaves it in M_ANSWER. M_RANK: this process's rank.
M_PLACED = 15
M_ANSWER = 16
M_RANK = 17
# Where compiled placement enters the transfers a task needs itself (jit/placing.py): 1 when
# the run's native workers post them through MPI; the kernel ids of the native send and
# receive, the run's communicator's handle, and its tags (the first, and how many before
# they wrap: Transport.tags).
M_TRANSFERS = 18
M_SEND_KERNEL = 19
M_RECV_KERNEL = 20
M_COMM = 21
M_FIRST_TAG = 22
M_TAGS = 23  # (NativeTransfers' fields, in its order: M_SEND_KERNEL to M_TAGS)
# Compiled placement's own tables of the heap buffers it allocates (jit/placing.hold_allocated):
# the ranks, the owner of an alloc that names none (o.on_rank's around the call), and the
# addresses of the session's per-slot owner and writer (int8) and valid bits (uint64).
M_RANKS = 24
M_DEFAULT_OWNER = 25
M_HEAP_OWNERS = 26
M_HEAP_WRITERS = 27
M_HEAP_VALID = 28
M_WIDTH = 29
PLACED_NOT, PLACED_BY_PYTHON, PLACED_COMPILED = 0, 1, 2

_NATIVE_TRANSFERS = "send_kernel recv_kernel comm first_tag tags"


class NativeTransfers(collections.namedtuple("NativeTransfers", _NATIVE_TRANSFERS)):
    """What compiled placement needs to enter a run's native transfers itself (jit/api.py), the
    meta fields M_SEND_KERNEL..M_TAGS: the kernel ids of the native send and receive, the run's
    communicator's handle, and its tags (Transport.tags)."""


# `pipe`, a pipelined run's counters, each on a cache line of its own (jit/pipeline.py)
P_QUEUED = 0  # tasks queued: the next task id (written by the submits)
P_DONE = 8  # tasks the core stage has submitted to the core
P_FULL = 16  # the FULL_* code the core stage waits on, 0 when it does not
P_STOP = 24  # 1: the core stage returns once it has caught up
P_RUNNING = 32  # 1 once the core stage's thread is in its loop
PIPE_WIDTH = 40
SLOT_INFO_WIDTH = 8  # `slot_info` columns, a cache line per slot: kernel, worker, tensor params


# the last axis of kernel_shapes (host.kernel_tables): a dim's word and bound, and in a param's
# first row its dims and element type
SHAPE_CODE = 0
SHAPE_BOUND = 1
PARAM_NDIM = 0
PARAM_DTYPE = 1

# columns of heap_versions and externals
VERSION_WRITTEN = 0  # the newest version a task has written
VERSION_MADE = 1  # the newest version version_inc has made
EXTERNAL_WRITEABLE = 2  # externals only: 0 for read-only memory
# heap_versions only: the buffer's sequence number while it is allocated and not freed, else -1.
# Submits check this, not the core's buffer table, whose lines a pipelined run's core stage writes.
VERSION_LIVE = 2

# `held` columns (jit/placing.py; a distributed run's)
H_UNIT = 0  # elements per table entry; 0: the row holds no buffer's tables
H_UNITS = 1  # table entries
H_ITEMSIZE = 2  # bytes of the elements the tables count
H_OWNER = 3  # addresses of the int8 owner and writer tables and the uint64 valid bits
H_WRITER = 4
H_VALID = 5
H_WRITTEN = 6  # 1 once compiled code wrote the tables
# 1 while the tables are compiled placement's own (a heap buffer it allocated, which the
# Python placer has not adopted: host.Session._adopt), then H_DTYPE is its DataType
H_MINE = 7
H_DTYPE = 8
H_WIDTH = 9

# `counts` columns (distributed/placement.py's Placement.counts; a distributed run's)
MAX_RANKS = 64  # a bit each in a holdings table's valid bits, a uint64 (jit/placing.py)
C_LABEL = 0  # the run's tasks placed so far: the next task's id
C_WRITTEN = 1  # bytes the run's tasks wrote
C_MOVED = 2  # bytes moved between ranks
C_COMPILED = 3  # tasks compiled code placed itself (this rank's count: the others may differ)
C_PLACED = 4  # C_PLACED + r: tasks placed on rank r
# This rank's: its transfers so far (the next one's index), the bytes they sent and received
# (packed), and per peer r the transfers sent to r (C_SENT_TO + r) and received from r so far:
# the next one's place in their sequence between the two ranks.
C_TRANSFERS = C_PLACED + MAX_RANKS
C_BYTES_SENT = C_TRANSFERS + 1
C_BYTES_RECEIVED = C_TRANSFERS + 2
C_SENT_TO = C_TRANSFERS + 3
C_RECEIVED_FROM = C_SENT_TO + MAX_RANKS
C_WIDTH = C_RECEIVED_FROM + MAX_RANKS

# `datatypes` columns: the MPI datatypes (Transport.datatype) of the regions compiled
# placement has sent or received in a run, by what picks the elements: dims, itemsize, then
# MAX_JIT_DIMS extents and strides (0 past the dims); the handle, an int32, or NO_DATATYPE.
T_NDIM = 0
T_ITEMSIZE = 1
T_SHAPE = 2
T_STRIDE = T_SHAPE + MAX_JIT_DIMS
T_HANDLE = T_STRIDE + MAX_JIT_DIMS
T_WIDTH = T_HANDLE + 1
DATATYPES = 16
NO_DATATYPE = 1 << 32  # the region has none (no int32 handle is this)

# `plan` columns, a row per transfer compiled placement enters for one task, in its order:
# the peer, 1 if this rank sends, the datatype's handle, its place in the sequence between the
# two ranks, its index among this rank's transfers, and the region it moves (a descriptor).
PLAN_PEER = 0
PLAN_SENDS = 1
PLAN_DATATYPE = 2
PLAN_SEQUENCE = 3
PLAN_INDEX = 4
PLAN_DESC = 5
PLAN_WIDTH = PLAN_DESC + DESC_WIDTH

# kernel table columns
K_WORKER = 0
K_TENSORS = 1  # tensor params the shapes declare, -1 when undeclared
K_MIXED = 2  # 1 when tensor params may differ in dtype
K_NAMES = 3  # distinct dim names in the shapes
K_SHARING = 4  # a sharing.Sharing: what may share memory with a written param (UNJUDGED: ask once)
K_WIDTH = 5

# scalar kinds in the argument tables
S_FLOAT, S_INT = 0, 1

# Columns of `layouts`, per kernel and tensor position: the last descriptor submitted there and
# whether it passed the output checks; `layout_rows` holds its layout row and kind, the param
# the core reads. A layout row is a function of the descriptor alone, and tiles repeat (flash
# attention's state tiles are the same descriptors at every pair of a query tile), so a submit
# whose descriptor equals the last one keeps its row, and the core reads the kernel's rows where
# they are: `layout_rows[kernel, :n]` is the submit's params, with no copy.
L_DESC = 0
L_CHECKED = L_DESC + DESC_WIDTH  # 1 when the descriptor passed _check_writable
L_WIDTH = L_CHECKED + 1
# Columns of `signatures`, per kernel: the tensor count of the last call that passed the shape
# and dtype check (-1: none), then per param its dtype, dims and MAX_JIT_DIMS sizes: what the
# check reads. A call with the same is the same verdict.
G_COUNT = 0
G_PARAM = 1
G_PARAM_WIDTH = 2 + MAX_JIT_DIMS
G_WIDTH = G_PARAM + cs.MAX_PARAMS * G_PARAM_WIDTH

FIELDS = (
    "header", "tasks", "buffers", "deps", "entries", "buckets", "producers", "covered",
    "named", "ready", "names",
    "arg_desc", "arg_kind", "arg_count", "arg_float", "arg_int", "arg_scalar_kind",
    "log", "edges", "heap_versions", "externals", "scope", "scope_marks",
    "kernels", "kernel_shapes", "meta", "arg_task", "layouts", "layout_rows", "signatures",
    "pipe", "slot_params", "slot_info", "held", "counts", "labels", "datatypes", "plan",
)


@structref.register
class JitOrchestratorType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class JitOrchestrator(structref.StructRefProxy):
    """What a compiled orchestration receives as `o` (see pto_gpu.jit)."""


structref.define_proxy(JitOrchestrator, JitOrchestratorType, list(FIELDS))


@structref.register
class PlacedOrchestratorType(JitOrchestratorType):
    """A distributed run's `o` (meta M_PLACED not PLACED_NOT): a type of its own, so that only
    its code compiles the placement paths (jit/api.py, "a distributed run's paths"). Every
    run's compiled them before: a fifth of a fresh process's numba time (Xeon VM)."""


class PlacedOrchestrator(structref.StructRefProxy):
    """What a distributed run's compiled orchestration receives as `o`. (A subclass of
    JitOrchestrator would be typed as one.)"""


structref.define_proxy(PlacedOrchestrator, PlacedOrchestratorType, list(FIELDS))


# `o`'s fields as a named tuple, for code compiled without numba's runtime (see `tables`).
Tables = collections.namedtuple("Tables", FIELDS)
# numba's MemInfo: reference count, destructor, its argument, data, size (nrtdynmod.py).
_MEMINFO = ir.LiteralStructType([ir.IntType(64), ir.IntType(8).as_pointer(), ir.IntType(8).as_pointer(),
                                 ir.IntType(8).as_pointer(), ir.IntType(64)])


@intrinsic
def tables(typingctx, o):
    """`o`'s fields as a `Tables`, read without counting references: for code compiled without
    numba's runtime (jit/api.py), where a structref's own field reads are refused. With the
    runtime, every read of a field was an atomic increment and decrement, half of a compiled
    submit's time. The references stay `o`'s, which outlives every call that reads them."""
    if not isinstance(o, JitOrchestratorType):
        return None
    result = types.NamedTuple([o.field_dict[name] for name in FIELDS], Tables)

    def codegen(context, builder, signature, args):
        # structref._Utils.get_data_struct, but finding the data as NRT_MemInfo_data_fast does
        # (the MemInfo's fourth member) rather than through numba's runtime, which is off here.
        meminfo = cgutils.create_struct_proxy(o)(context, builder, value=args[0]).meminfo
        header = builder.bitcast(meminfo, _MEMINFO.as_pointer())
        data = builder.load(cgutils.gep(builder, header, 0, 3))
        payload = context.data_model_manager[o.get_data_type()].get_value_type()
        fields = cgutils.create_struct_proxy(o.get_data_type())(
            context, builder, ref=builder.bitcast(data, payload.as_pointer()))
        return context.make_tuple(builder, signature.return_type, [getattr(fields, name) for name in FIELDS])

    return result(o), codegen


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INTS, _FLOATS = (int, np.int64), (float, np.float64)
_SCALAR = ParamKind.SCALAR


class ArgTables(collections.namedtuple("ArgTables",
                                       "desc kind count scalar_kind int float float_bits task params info")):
    """A runtime's argument tables (`cleared` for each run), one slot per task ring slot: what
    compiled submits (jit/api.py) and Python submits of native kernels, or of the kernels a CUDA
    driver's stream executor issues (orchestrator.py), write, and what native workers
    (executors/native.py), that executor (executors/driver_streams.py) and
    `host.Session.materialise` read.
    `float_bits` is `float` viewed as int64, `task` the task whose arguments each slot holds
    (-1: none). `params` and `info` (kernel, worker, tensor params) are a pipelined submit's
    for the core stage (jit/pipeline.py), on cache lines of their own: kept with the rest, since
    allocating their 1.8 MB for each run took 0.3 ms of a one-tile dry run's 0.2."""

    @classmethod
    def allocate(cls, window: int) -> ArgTables:
        i64 = np.int64
        floats = np.zeros((window, MAX_SCALARS), np.float64)
        return cls(desc=np.zeros((window, cs.MAX_PARAMS, DESC_WIDTH), i64),
                   kind=np.zeros((window, cs.MAX_PARAMS), i64),
                   count=np.zeros((window, 2), i64),  # tensor and scalar params
                   scalar_kind=np.zeros((window, MAX_SCALARS), i64), int=np.zeros((window, MAX_SCALARS), i64),
                   float=floats, float_bits=floats.view(i64), task=np.full(window, -1, i64),
                   params=cs.aligned_table((window, cs.MAX_PARAMS, PARAM_WIDTH), i64),
                   info=cs.aligned_table((window, SLOT_INFO_WIDTH), i64))

    def cleared(self) -> ArgTables:
        """The tables, for a new run: no slot holds a task's arguments. (Task ids start at 0
        again in every run, so a slot the last run left would pass for the new task of its id.)"""
        self.task.fill(-1)
        return self


class ArgWriter:
    """Writes Python-submitted tasks' arguments into a run's ArgTables, as a compiled submit
    does (Scheduler.try_submit calls it): through flat memoryviews of the tables, as bytes or
    single words, which costs a fifth of numpy row and element stores."""

    def __init__(self, tables: ArgTables):
        self.tables = tables
        self._desc = memoryview(tables.desc).cast("B")
        self._kind = memoryview(tables.kind).cast("B")
        self._count = memoryview(tables.count).cast("B")
        self._int = memoryview(tables.int).cast("B").cast("q")
        self._float = memoryview(tables.float).cast("B").cast("d")
        self._scalar_kind = memoryview(tables.scalar_kind).cast("B").cast("q")
        self._task = memoryview(tables.task).cast("B").cast("q")
        self._slot_descs = cs.MAX_PARAMS * DESC_BYTES

    def write(self, slot: int, task) -> bool:
        """Write the arguments of `task` in `slot` (free: the caller checked), its id last;
        whether native code would run it as the Python way does: tensors (of at most
        MAX_JIT_DIMS dims) before scalars, as the native entry passes them, and at most
        MAX_SCALARS scalars that are Python or numpy 64-bit ints and floats (the entry's
        int64 and float64; a hand-written kernel called the Python way with a float32 or a
        bool would compile for that type). If not, the slot stays no task's."""
        descs, kinds = [], []
        scalars = 0
        first_scalar = slot * MAX_SCALARS
        for param in task.params:
            kind = param.kind
            if kind != _SCALAR:
                desc = desc_bytes(param.value)
                if desc is None or scalars:
                    return False
                descs.append(desc)
                kinds.append(_KIND_BYTES[kind])
                continue
            if scalars == MAX_SCALARS:
                return False
            value = param.value
            if type(value) in _FLOATS:
                self._float[first_scalar + scalars] = value
                self._scalar_kind[first_scalar + scalars] = S_FLOAT
            elif type(value) in _INTS and _INT64_MIN <= value <= _INT64_MAX:
                self._int[first_scalar + scalars] = value
                self._scalar_kind[first_scalar + scalars] = S_INT
            else:
                return False
            scalars += 1
        n = len(descs)
        start = slot * self._slot_descs
        self._desc[start:start + n * DESC_BYTES] = b"".join(descs)
        start = slot * cs.MAX_PARAMS * 8
        self._kind[start:start + n * 8] = b"".join(kinds)
        self._count[slot * 16:slot * 16 + 16] = _PAIR.pack(n, scalars)
        self._task[slot] = task.id
        return True


_PAIR = struct.Struct("=2q")
_KIND_BYTES = {kind: struct.pack("=q", kind) for kind in ParamKind}


def allocate(state: cs.CoreState, args: ArgTables, num_externals: int, kernels: np.ndarray,
             kernel_shapes: np.ndarray, meta: np.ndarray
             ) -> tuple[JitOrchestrator | PlacedOrchestrator, dict[str, np.ndarray]]:
    """A new context over the state's tables and the run's argument tables (a PlacedOrchestrator
    where meta M_PLACED says the run is distributed), and its fields for the host side to read."""
    i64 = np.int64
    fields = dict(
        header=state.header, tasks=state.tasks, buffers=state.buffers, deps=state.deps,
        entries=state.entries, buckets=state.buckets, producers=state.producers, covered=state.covered,
        named=np.zeros((cs.MAX_PARAMS, DESC_WIDTH), i64),  # descriptors an error names (jit.api._fail_naming)
        ready=np.zeros(len(state.deps), i64),  # completion scratch
        names=np.zeros(MAX_NAMES, i64),  # sizes bound to dim names while checking shapes
        arg_desc=args.desc, arg_kind=args.kind, arg_count=args.count, arg_float=args.float, arg_int=args.int,
        arg_scalar_kind=args.scalar_kind,
        log=np.zeros((LOG_CAPACITY, 2), i64),  # task id, ready at submit
        edges=np.zeros((EDGE_CAPACITY, 2), i64),
        heap_versions=np.full((len(state.buffers), 3), -1, i64),  # per buffer slot: VERSION_*
        externals=np.zeros((max(1, num_externals), 3), i64),  # per external: VERSION_*, EXTERNAL_WRITEABLE
        scope=np.zeros(SCOPE_CAPACITY, i64),
        scope_marks=np.zeros(MAX_SCOPE_DEPTH, i64),
        kernels=kernels, kernel_shapes=kernel_shapes, meta=meta,
        arg_task=args.task,
        layouts=np.zeros((len(kernels), cs.MAX_PARAMS, L_WIDTH), i64),
        layout_rows=np.zeros((len(kernels), cs.MAX_PARAMS, PARAM_WIDTH), i64),
        signatures=np.zeros((len(kernels), G_WIDTH), i64),
        pipe=cs.aligned_table(PIPE_WIDTH, i64),  # its lines are the core stage's and the submits'
        slot_params=args.params,
        slot_info=args.info,
        # A distributed run's (jit/placing.py), which its session makes (set_placing): a row per
        # buffer of its holdings tables (heap slots, then externals), the run's counts, each
        # slot's task id as users see it. Other runs' code never reads them.
        held=np.zeros((1, H_WIDTH), i64),
        counts=np.zeros(C_WIDTH, i64),
        labels=np.zeros(1, i64),
        datatypes=np.zeros((DATATYPES, T_WIDTH), i64),
        plan=np.zeros((cs.MAX_PARAMS, PLAN_WIDTH), i64),
    )
    fields["datatypes"][:, T_NDIM] = -1  # no region has: none known yet
    fields["layouts"][:, :, L_DESC + D_NDIM] = -1  # no descriptor has: nothing remembered yet
    fields["signatures"][:, G_COUNT] = -1
    proxy = JitOrchestrator if meta[M_PLACED] == PLACED_NOT else PlacedOrchestrator
    return proxy(*(fields[name] for name in FIELDS)), fields


@njit(cache=True)
def set_tensormap(o, entries, producers, covered):
    o.entries = entries
    o.producers = producers
    o.covered = covered


@njit(cache=True)
def set_externals(o, externals):
    o.externals = externals


@njit(cache=True)
def set_placing(o, held, counts, labels):
    o.held = held
    o.counts = counts
    o.labels = labels
