"""The orchestrator: the `o` an orchestration function receives.

It turns `external`, `alloc`, `free`, `version_inc`, `scope` and `submit` into buffer
records and core calls, checks every argument at the call (so misuse fails where it is
written, not inside a worker), and when a ring is full asks the executor to make room.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from . import sharing
from .core import state as cs
from .core.rings import heap_size
from .distributed.dist_array import DistArray
from .distributed.ownership import Owner, check_rank, element_owners
from .distributed.placement import Placement
from .dtypes import DataType, WorkerType, as_dtype
from .errors import (
    DoubleFreeError,
    LayoutError,
    LifecycleError,
    ParamError,
    RankError,
    StaleVersionError,
    UsageError,
    UseAfterFreeError,
)
from .jit.context import ArgTables, ArgWriter, NativeTransfers
from .jit.descriptor import from_tensor
from .jit.host import Session
from .kernel import Kernel, registered
from .layout import PARAM_WIDTH
from .params import Param, ParamKind, as_param, core_rows
from .schedule import Windows, check_tags
from .tasks import Scheduler, Task
from .tensor import Buffer, BufferKind, TensorDescriptor, contiguous_strides


class Executor(Protocol):
    """Who runs the tasks of a run: what the orchestrator calls while the orchestration runs,
    and what the Runtime calls when it has returned or raised."""

    runs_kernels: bool  # False: tasks retire at submission unrun (compiled code retires them itself)
    wants_producers: bool  # whether `submitted` needs the producers (compiled code then logs them)

    def submitted(self, task: Task, ready: bool, producers: Sequence[int]) -> None:
        """A task entered the core; `ready` when it had no producer left to wait for;
        `producers` its producers' ids, when the executor wants them."""

    def make_room(self, status: int, unfreed: Callable[[], list[Buffer]]) -> None:
        """Wait until a full ring (a FULL_* code) may have room, or raise DeadlockError
        (naming the buffers `unfreed()` returns, the orchestration's own live set)."""

    def finish(self) -> None:
        """The orchestration has returned: return once every submitted task has run, or raise
        the TaskError of the first that failed."""

    # Executors that follow schedules (schedule.py) also have
    #     wait_until(done): run tasks until done() holds
    # which a max_concurrent window waits on; executors with native workers have
    #     native_lanes(args, kernels) -> executors.native.NativeLanes | None
    #     handed_over(): a compiled flush has handed its batch over (NativeLanes.admit, submitted)
    # which a compiled orchestration's session calls (jit/host.py).

    def abort(self) -> None:
        """The orchestration (or the run) raised: return once every submitted task has run or
        a task has failed, with nothing left running; raise nothing (the caller re-raises)."""


class Recorder:
    """The logical graph of a run: tasks and (producer, consumer) edges."""

    def __init__(self):
        self.tasks: list[Task] = []
        self.edges: list[tuple[int, int]] = []

    def add(self, task: Task, producers: np.ndarray) -> None:
        self.tasks.append(task)
        self.edges.extend((int(p), task.id) for p in producers)


class Orchestrator:
    def __init__(self, scheduler: Scheduler, backend, executor: Executor, recorder: Recorder | None,
                 arguments: ArgTables, windows: Windows | None = None, ranks: Placement | None = None,
                 every_task: bool = False):
        """`every_task`: in a distributed run, enter other ranks' tasks into this rank's core too
        (completed unrun, as they become ready), so that its executor weighs them (a critical
        path over the whole graph); so does a window, which counts them."""
        self._scheduler = scheduler
        self._state = scheduler.state
        self._backend = backend
        self._executor = executor
        self._recorder = recorder
        self._externals: dict[int, Buffer] = {}  # by key: -1, -2, ... (the compiled tables' order)
        self._owners: dict[tuple[int, int], Buffer] = {}  # by the (base, bytes) of their allocation
        self._unfreed: dict[int, Buffer] = {}  # heap buffers not yet freed, by sequence number
        self._scopes: list[list[Buffer]] = []
        self._tags: dict[str, int | str] | None = None  # what `with o.tags(...)` gives the tasks inside
        self._windows = windows  # a schedule's max_concurrent
        self._every_task = every_task or windows is not None
        # Every submit writes its rows here, as bytes (a memoryview copy is the cheapest), and
        # hands the core the view of its first n rows.
        rows = np.empty((cs.MAX_PARAMS, PARAM_WIDTH), np.int64)
        self._row_bytes = memoryview(rows).cast("B")
        self._row_views = [rows[:n] for n in range(cs.MAX_PARAMS + 1)]
        # Whether `_enter` reads the producers (executors that do not want them are passed none)
        self._producers_wanted = recorder is not None or executor.wants_producers
        self._jit: Session | None = None  # created by the first compiled() call
        # The run's argument tables and the executor's native lanes (executors/native.py), taken
        # by the first compiled() call or submit of a kernel with native code or one of the
        # executor's `_driver_kernels` (_make_arguments): submits of the kernels the lanes run
        # (`_native_kernels`: native workers', or a CUDA driver's stream executor's) write their
        # arguments there.
        self._kept_args = arguments  # the runtime's, sized by its task window
        self._args: ArgTables | None = None
        self._writer: ArgWriter | None = None  # over _args, for Python submits
        self._lanes = None
        self._native_kernels: frozenset[int] = frozenset()
        # Only an executor with lanes needs the tables for Python submits.
        self._lanes_possible = executor.runs_kernels and hasattr(executor, "native_lanes")
        # Kernels whose tasks an executor issues from the tables though they have no native code
        # (a CUDA driver's stream executor: those with CUDA code)
        self._driver_kernels: frozenset[int] = getattr(executor, "kernel_ids", frozenset())
        self._ranks = ranks  # a distributed run's placement (pto_gpu/distributed); None: one process
        self._transfer_rows = np.empty((cs.MAX_PARAMS, PARAM_WIDTH), np.int64)
        self.dist_arrays: list[DistArray] = []  # taken by o.external: the run releases their others' rows
        self._open = True

    # --- memory --------------------------------------------------------------------------
    def external(self, array: object, owner: Owner | None = None) -> TensorDescriptor:
        """A tensor over caller memory (numpy, CuPy, PyTorch, JAX, ...: see backends/interop.py);
        aliases of one allocation share one owner. `owner` (a rank, or a distribution of dim 0
        such as pto.block_rows(n)) says which rank of a distributed run holds its data; the
        first o.external of an allocation sets it (default: rank 0, or o.on_rank's). A
        pto.DistArray brings its own owner, and this rank's memory holds only its rows."""
        self._check_open()
        if isinstance(array, DistArray):
            owner = self._distributed_array(array, owner)
            array = array.whole
        ext = self._backend.resolve(array)
        dtype = as_dtype(ext.dtype)
        buffer = self._check_no_partial_alias(ext)
        if buffer is None:
            buffer = Buffer(-1 - len(self._externals), BufferKind.EXTERNAL, ext.owner_base,
                            ext.owner_nbytes, ext.memory, writeable=ext.writeable)
            self._externals[buffer.key] = buffer
            self._owners[ext.owner_base, ext.owner_nbytes] = buffer
        if any(s % dtype.itemsize for s in ext.strides) or any(s < 0 for s in ext.strides):
            raise LayoutError(f"external array strides {ext.strides} are negative or not a multiple "
                              f"of its {dtype.itemsize}-byte elements; pass np.ascontiguousarray(a)")
        tensor = TensorDescriptor(buffer, ext.data, 0, tuple(s // dtype.itemsize for s in ext.strides),
                                  tuple(ext.shape), dtype)
        self._own(tensor, owner, self._ranks.external if self._ranks else None)
        return tensor

    def _distributed_array(self, array: DistArray, owner: Owner | None) -> Owner:
        """The owner of a DistArray's rows, checked against the run's ranks; the array is
        remembered so that the run gives back the rows it received (`dist_arrays`)."""
        ranks = self._ranks.size if self._ranks else 1
        if array.size != ranks:
            raise RankError(f"o.external({array!r}): its communicator has {array.size} ranks, this run "
                            f"{ranks}; make it with the runtime's comm")
        if all(array is not seen for seen in self.dist_arrays):
            self.dist_arrays.append(array)
        return array.owner_for(owner)

    def _own(self, tensor: TensorDescriptor, owner: Owner | None, hook) -> None:
        if hook is not None:
            hook(tensor, owner)
        elif owner is not None:  # one process is rank 0 of 1: owners are checked, then moot
            element_owners(owner, tensor.shape, 1, repr(tensor))

    def _check_no_partial_alias(self, ext) -> Buffer | None:
        """The external buffer whose memory holds ext's owner whole, or None if none overlaps it.

        Libraries that do not say which allocation an array views (DLPack, __array_interface__)
        give the array's own extent as its owner: one inside an external already taken is a
        view of that allocation, since memory belongs to one allocation. Externals never
        overlap partly, so at most one overlaps."""
        same = self._owners.get((ext.owner_base, ext.owner_nbytes))
        if same is not None:
            return same
        lo, hi = ext.owner_base, ext.owner_base + ext.owner_nbytes
        for other in self._externals.values():
            if other.base <= lo and hi <= other.base + other.nbytes:
                return other
            if other.base < hi and lo < other.base + other.nbytes:
                raise LayoutError(
                    f"external memory {lo:#x}..{hi:#x} partly overlaps {other!r} without being the same "
                    "allocation; pass the whole allocation and slice it with the tensor API")
        return None

    def alloc(self, shape, dtype: DataType = DataType.FLOAT32,
              owner: Owner | None = None) -> TensorDescriptor:
        """A contiguous heap tensor; its address is fixed now, so later tasks can use it.
        `owner` as for external: tasks that write it run there."""
        self._check_open()
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
            raise LayoutError(f"alloc shape {shape} must be non-negative integers")
        dtype = as_dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if heap_size(nbytes) > self._state.sizes.heap_bytes:
            raise self._scheduler.heap_too_small(nbytes, f" for {shape} {dtype.name}")
        while (seq := self._scheduler.heap_alloc(nbytes)) < 0:
            self._executor.make_room(seq, self.unfreed)
        base = self._backend.heap_base + self._scheduler.heap_offset(seq)
        buffer = Buffer(seq, BufferKind.HEAP, base, nbytes)
        self._unfreed[seq] = buffer
        if self._scopes:
            self._scopes[-1].append(buffer)
        tensor = TensorDescriptor(buffer, base, 0, contiguous_strides(shape), shape, dtype)
        self._own(tensor, owner, self._ranks.alloc if self._ranks else None)
        return tensor

    def free(self, tensor: TensorDescriptor) -> None:
        """No more uses will be added; the memory returns once every user has completed."""
        self._check_open()
        buffer = self._tensor_buffer(tensor, "free")
        if buffer.kind == BufferKind.EXTERNAL:
            raise LifecycleError(f"cannot free external {buffer!r}: the runtime never frees caller memory")
        if buffer.freed:
            raise DoubleFreeError(f"{buffer!r} was already freed")
        self._release(buffer)

    def _release(self, buffer: Buffer) -> None:
        buffer.freed = True
        del self._unfreed[buffer.key]
        self._scheduler.buffer_free(buffer.key)
        if self._ranks is not None:
            self._ranks.freed(buffer)

    def version_inc(self, tensor: TensorDescriptor) -> TensorDescriptor:
        """A handle to the same memory at version + 1 (SSA-style in-place update)."""
        self._check_open()
        self._check_usable(tensor)
        buffer = tensor.buffer
        if tensor.version < buffer.newest_handle:
            raise StaleVersionError(
                f"version_inc: version {tensor.version} of {buffer!r} already has a successor "
                f"(version {buffer.newest_handle} exists); versions are single-assignment, so "
                "increment the newest handle")
        buffer.newest_handle = tensor.version + 1
        return tensor.with_version(tensor.version + 1)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Frees, at exit, every buffer allocated inside that is not freed yet."""
        self._check_open()
        self._scopes.append([])
        try:
            yield
        finally:
            for buffer in self._scopes.pop():
                if not buffer.freed:
                    self._release(buffer)

    @contextlib.contextmanager
    def tags(self, /, **tags: int | str) -> Iterator[None]:
        """Tags for the tasks submitted inside (added to those of an enclosing `tags`): what a
        Schedule's order_by sorts by. They change when tasks run, never what they compute.
        Entering a new value of a max_concurrent tag waits until the window admits it, so the
        memory allocated inside follows the window too."""
        self._check_open()
        outer = self._tags
        inner = {**(outer or {}), **check_tags(tags)}
        self._wait_for_window(inner)
        self._tags = inner
        try:
            yield
        finally:
            self._tags = outer

    # --- ranks (a distributed run: Runtime(comm=...)) ------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the run (0 without comm=)."""
        return 0 if self._ranks is None else self._ranks.rank

    @property
    def ranks(self) -> int:
        """How many ranks run the orchestration (1 without comm=)."""
        return 1 if self._ranks is None else self._ranks.size

    def owner_of(self, tensor: TensorDescriptor) -> int:
        """The rank owning the tensor's first element: where tasks writing it run."""
        self._tensor_buffer(tensor, "owner_of")
        return 0 if self._ranks is None else self._ranks.owner_of(tensor)

    @contextlib.contextmanager
    def on_rank(self, rank: int) -> Iterator[None]:
        """Buffers allocated (and arrays first seen) inside without owner= are owned by `rank`,
        so the tasks writing them run there."""
        self._check_open()
        if self._ranks is None:
            check_rank(rank, 1, "o.on_rank", "rank")
            yield
        else:
            with self._ranks.owning(rank):
                yield

    def write_back(self) -> None:
        """The orchestration has returned: give each external array's owner the newest version
        of its elements (a distributed run's transfers; nothing in one process)."""
        if self._ranks is not None:
            for transfer in self._ranks.write_back():
                self._enter_transfer(transfer)

    # --- tasks ---------------------------------------------------------------------------
    def submit(self, kernel: Kernel, *params: object, worker: WorkerType | None = None,
               rank: int | None = None) -> int:
        """Submit one kernel call; its task id (ids count from 0 within a run). In a distributed
        run it runs on `rank`, by default the owner of the first region it writes."""
        self._check_open()
        if not isinstance(kernel, Kernel):
            raise ParamError(f"submit() takes a @pto.kernel, not {type(kernel).__name__}")
        for p in params:
            if type(p) is not Param:
                params = tuple([p if type(p) is Param else as_param(p, i) for i, p in enumerate(params)])
                break
        if len(params) > cs.MAX_PARAMS:
            count = sum(p.kind != ParamKind.SCALAR for p in params)
            if count > cs.MAX_PARAMS:
                raise ParamError(f"{kernel.name} has {count} tensor params; at most {cs.MAX_PARAMS}")
        # One pass over the tensor params. What the checks accept is tested inline (a buffer of
        # this run, heap keys >= 0 and externals < 0, not freed, at its newest version; for an
        # output, writeable with no stride-0 dim) and only the rest goes to them, to name the
        # fault: their calls, and the lists built for them, were half of submit's Python time.
        row_bytes = self._row_bytes
        tensors: list[TensorDescriptor] = []
        written: list[TensorDescriptor] = []
        signature = []
        for position, p in enumerate(params):
            kind = p.kind
            if kind == _SCALAR:
                continue
            tensor = p.value
            buffer = tensor.buffer if type(tensor) is TensorDescriptor else None
            if (buffer is None or buffer.freed or tensor.version < buffer.newest_version
                    or (self._unfreed if buffer.key >= 0 else self._externals).get(buffer.key) is not buffer):
                self._check_usable(tensor, position, kernel)
                buffer = tensor.buffer
            if kind != _INPUT:
                if not buffer.writeable or 0 in tensor.strides:
                    _check_writable(tensor, position, kernel)
                written.append(tensor)
            start = len(tensors) * _ROW_BYTES
            row_bytes[start:start + _ROW_BYTES] = tensor.param_row(kind)
            tensors.append(tensor)
            signature.append((tensor.repeats, tensor.dtype))
        kernel.check(tensors, tuple(signature))
        if written and kernel.sharing_rule is not None and _shares_a_buffer(tensors, written):
            sharing.check(kernel, tensors, self._row_views[len(tensors)])
        if worker is None:
            task = Task(-1, kernel, kernel.worker, params, self._tags,
                        kernel.workers if len(kernel.workers) > 1 else None)
        else:
            task = Task(-1, kernel, WorkerType(worker), params, self._tags)
        if self._windows is not None:  # the common case pays one test, not a call
            self._wait_for_window(self._tags)
        if self._ranks is not None:
            for transfer in self._ranks.place(task, [p for p in params if p.kind != _SCALAR], rank):
                self._enter_transfer(transfer)
        elif rank is not None:
            check_rank(rank, 1, f"submit({kernel.name})", "rank")
        # A task another rank runs does nothing to this rank but through its transfers, which
        # are this rank's own tasks: the core need not know it (unless a window counts it or a
        # critical path weighs it).
        if task.runs_here or self._every_task:
            arguments = None
            code = kernel.native is not None or kernel.id in self._driver_kernels
            if code and self._lanes_possible and task.runs_here:
                if self._args is None:
                    self._make_arguments()
                if kernel.id in self._native_kernels:
                    arguments = self._writer
            status = self._enter(task, self._row_views[len(tensors)], arguments)
        for tensor in written:
            buffer = tensor.buffer
            if tensor.version > buffer.newest_version:
                buffer.newest_version = tensor.version
        if self._windows is not None:
            self._windows.add(status, self._tags)
        return task.public_id

    def _enter(self, task: Task, rows: np.ndarray, arguments: ArgWriter | None = None) -> int:
        """Submit a checked task to the core (making room as needed) and hand it to the executor;
        with `arguments`, native workers may run it (Scheduler.try_submit)."""
        while (status := self._scheduler.try_submit(task, rows, arguments)) < 0:
            self._executor.make_room(status, self.unfreed)
        producers = self._scheduler.producers_of_last() if self._producers_wanted else ()
        if self._recorder is not None:
            self._recorder.add(task, producers)
        self._executor.submitted(task, self._scheduler.last_was_ready(), producers)
        return status

    def _enter_transfer(self, task: Task) -> None:
        """Enter a transfer task; with its arguments written where native workers post it
        (placement.py's native transfers)."""
        if task.kernel.native is not None and self._args is None and self._lanes_possible:
            self._make_arguments()
        arguments = self._writer if task.kernel.id in self._native_kernels else None
        self._enter(task, core_rows(task.params, self._transfer_rows), arguments)

    def _wait_for_window(self, tags: dict[str, int | str] | None) -> None:
        if self._windows is not None and not self._windows.admits(tags, self._scheduler.completed):
            self._executor.wait_until(lambda: self._windows.admits(tags, self._scheduler.completed))

    # --- compiled orchestration ----------------------------------------------------------
    def compiled(self, body: Callable, *args: object) -> object:
        """Run `body(jo, *args)`, an njit orchestration body (see pto_gpu.jit), in this run.

        Tensor descriptors among args arrive as compiled descriptors; other args as they are.
        The tasks it submits carry the tags around the call (`o.tags`). In a distributed run
        its tasks are placed as Python submits are, by compiled code where that is bookkeeping
        alone (jit/placing.py), else by this orchestrator's placement (jit/host.py).
        """
        self._check_open()
        if self._jit is None:
            if self._args is None:
                self._make_arguments()
            self._jit = Session(self._scheduler, self._executor, self._recorder,
                                self._backend.heap_base, len(self._externals), self._args, self._lanes,
                                None if self._ranks is None else _Placing(self))
        for arg in args:
            if isinstance(arg, TensorDescriptor):
                self._check_usable(arg)
        converted = tuple(from_tensor(a) if isinstance(a, TensorDescriptor) else a for a in args)
        self._jit.enter(list(self._externals.values()), list(self._unfreed.values()), self._tags)
        try:
            result = self._jit.call(body, *converted)
        except BaseException:
            # What the body submitted before it raised runs too, as from Python; the body's
            # error is the one `run` raises (docs/ERRORS.md), not a task's found on the way.
            with contextlib.suppress(Exception):
                self._jit.flush()
            raise
        else:
            self._jit.flush()
        finally:
            self._jit.leave()
            for key in [key for key, buffer in self._unfreed.items() if buffer.freed]:
                del self._unfreed[key]
        return result

    def _make_arguments(self) -> None:
        """The run's argument tables, and native lanes over them if the executor runs tasks and
        has lanes for this run."""
        self._args = self._kept_args.cleared()
        self._writer = ArgWriter(self._args)
        if self._lanes_possible:
            self._lanes = self._executor.native_lanes(self._args, list(registered()))
        if self._lanes is not None:
            self._native_kernels = self._lanes.kernel_ids

    # --- checks --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if not self._open:
            raise UsageError("this orchestrator's run has ended; use the `o` passed to the "
                             "orchestration function while it runs")

    def _tensor_buffer(self, tensor: object, what: str) -> Buffer:
        if not isinstance(tensor, TensorDescriptor):
            raise ParamError(f"{what} takes a tensor from o.external() or o.alloc(), "
                             f"not {type(tensor).__name__}")
        buffer = tensor.buffer
        if buffer.kind == BufferKind.EXTERNAL:
            known = self._externals.get(buffer.key) is buffer
        else:
            known = self._unfreed.get(buffer.key) is buffer or buffer.freed
        if not known:
            raise UsageError(f"{what}: {buffer!r} belongs to another run")
        return buffer

    def _check_usable(self, tensor: TensorDescriptor, position: int | None = None,
                      kernel: Kernel | None = None) -> None:
        what = "version_inc" if kernel is None else f"param {position} of {kernel.name}"
        buffer = self._tensor_buffer(tensor, what)
        if buffer.freed:
            raise UseAfterFreeError(f"{what}: {buffer!r} was freed")
        if tensor.version < buffer.newest_version:
            raise StaleVersionError(f"{what}: version {tensor.version} of {buffer!r} is stale; "
                                    f"version {buffer.newest_version} has been written")

    def close(self) -> None:
        self._open = False
        if self._jit is not None:
            self._jit.close()

    def unfreed(self) -> list[Buffer]:
        """Heap buffers allocated and not yet freed, oldest first."""
        return list(self._unfreed.values())


class _Placing:
    """How a distributed run's compiled code reaches its orchestrator and placement
    (jit.host.Placer)."""

    def __init__(self, o: Orchestrator):
        self._o, self._placement = o, o._ranks
        self.rank, self.ranks = self._placement.rank, self._placement.size
        self.counts = self._placement.counts
        # What compiled placement leaves out: a recording's logical graph, a window's count, a
        # critical path's other ranks' tasks.
        self.compiled = self._placement.graph is None and not o._every_task

    def submit(self, kernel: Kernel, *params: Param) -> int:
        return self._o.submit(kernel, *params)

    @property
    def default_owner(self) -> int:
        return self._placement.default_owner

    def adopt(self, buffer: Buffer, tensor: TensorDescriptor, owner: int | None,
              held: tuple[int, int] | None = None) -> None:
        self._o._unfreed[buffer.key] = buffer
        self._placement.alloc(tensor, owner, held)

    def forget(self, buffer: Buffer) -> None:
        """The core has freed it already (compiled code's free)."""
        buffer.freed = True
        del self._o._unfreed[buffer.key]
        self._placement.freed(buffer)

    def owner_of(self, tensor: TensorDescriptor) -> int:
        return self._placement.owner_of(tensor)

    def tables(self, buffer: Buffer) -> tuple[int, int, int, int, int, int] | None:
        return self._placement.tables(buffer)

    def written(self, buffer: Buffer) -> None:
        self._placement.written(buffer)

    def native_transfers(self) -> NativeTransfers | None:
        transfers = {self._placement.native_send.id, self._placement.native_recv.id}
        if not transfers <= self._o._native_kernels:
            return None  # not native workers' (no lanes, or MPI without MPICH's ABI): Python's to enter
        return self._placement.native_transfers()

    def datatype(self, tensor: TensorDescriptor) -> int | None:
        return self._placement.datatype(tensor)

    def ran(self, labels: list[int]) -> None:
        self._placement.tasks_run.extend(labels)


_SCALAR, _INPUT = ParamKind.SCALAR, ParamKind.INPUT
_ROW_BYTES = PARAM_WIDTH * 8  # a param row's bytes in the rows submit hands the core


def _shares_a_buffer(tensors: list[TensorDescriptor], written: list[TensorDescriptor]) -> bool:
    """Whether a written tensor's buffer is another param's too: the test before sharing.check."""
    for tensor in written:
        buffer = tensor.buffer
        count = 0
        for other in tensors:
            if other.buffer is buffer:
                count += 1
        if count > 1:
            return True
    return False


def _check_writable(tensor: TensorDescriptor, position: int, kernel: Kernel) -> None:
    """Refuse an output the kernel could not write, or could write only over itself."""
    if not tensor.buffer.writeable:
        raise ParamError(f"param {position} of {kernel.name}: {tensor.buffer!r} is read-only memory "
                         "and cannot be an output or inout; pass a writeable array")
    if 0 not in tensor.strides or 0 in tensor.repeats:  # the usual case; or no element to write over
        return
    for dim, (stride, count) in enumerate(zip(tensor.strides, tensor.repeats)):
        if stride == 0 and count > 1:
            raise ParamError(f"param {position} of {kernel.name}: dim {dim} has stride 0 (a broadcast "
                             f"view, shape {tensor.shape}), so its {count} positions along that dim share "
                             "memory and an output or inout would write over itself; pass a real array")
