"""Where each task runs, and the transfers that bring it what it reads (StarPU-MPI's model).

Every rank runs the whole orchestration and calls these hooks at each alloc, external, free
and submit, in the same order, so every rank makes the same decisions:
- a task runs on `rank=` if given, else on the owner of the first region it writes;
- for each region it reads, the elements its rank lacks (holdings.py) come from the rank
  that wrote them: a send task on that rank (reads the region) and a receive task on the
  reader's rank (writes it), both ACCELERATOR tasks submitted just before the reader. Other
  ranks submit neither;
- every other rank places the task too, with `runs_here` False, so all decide alike, but its
  orchestrator does not enter it in its core: what the task does to that rank goes through
  the transfers, which are that rank's own tasks (under a schedule's window, which counts
  tasks, or critical path, which weighs them, it is entered and completes unrun).
Neither transfer waits: a send copies the elements out and posts them; a receive posts its
receive in the inbox (inbox.py) and completes when its data has come (Task.arrives), which
the executor polls for. Where the transport allows (Transport.native) a transfer of a whole
region is a native task instead (`native_send`, `native_recv`: kernel.transfer_kernel),
which native code posts through MPI in place, no copy, and completes, the send too, when MPI
says it has (executors/native.py); run the Python way, it is the transfer above. Both run as soon as
they are ready, on the worker that made them ready (Task.inline), as do other ranks' tasks
here (those compiled code enters ready at submission wait for its next log flush, as its
other tasks do: jit/api.py). So no worker ever waits for a message, which is what makes the
protocol deadlock-free (docs/ARCHITECTURE.md, "Several ranks"; a native send that holds its
region until its receiver has posted delays only tasks submitted after it, which that
receiver never waits for).
Messages are matched by their place in the sequence of transfers between their two ranks,
which both count alike. A transport whose transfers must go in that order (NCCL: no tags,
and its sends wait for their receiver) has each rank's transfers chained through an inout of
one small tensor, the lane, run by ACCELERATOR workers. When the orchestration returns,
elements of external arrays whose owner lacks their newest version are sent to it
(`write_back`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..core.state import Sizes
from ..dtypes import WorkerType
from ..errors import InvariantError, RankError
from ..jit.context import (
    C_BYTES_RECEIVED,
    C_BYTES_SENT,
    C_COMPILED,
    C_LABEL,
    C_MOVED,
    C_PLACED,
    C_RECEIVED_FROM,
    C_SENT_TO,
    C_TRANSFERS,
    C_WIDTH,
    C_WRITTEN,
    NativeTransfers,
)
from ..kernel import RECEIVE, SEND, CudaCode, kernel, transfer_kernel
from ..params import Param, inout, input, output, scalar
from ..tasks import Task
from ..tensor import Buffer, TensorDescriptor
from .holdings import Holdings, element_view
from .inbox import Inbox
from .logical import LogicalGraph
from .ownership import Owner, check_rank, element_owners
from .transport import Transport, tag

TRAFFIC_WORTH_SAYING = 1 << 20  # bytes moved by a run
KEPT_OWNER_TABLES = 16  # distributed arrays' owner tables a Runtime keeps for its later runs


@dataclasses.dataclass(slots=True)
class Transfer:
    mask: np.ndarray | None  # the elements of the region that move (None: all)
    peer: int  # the rank sent to, or received from
    sequence: int  # its place among the transfers from its sender to its receiver
    task: Task  # the transfer's task (a receive posts under its id)


def _kept(tables: dict[tuple, Holdings], key: tuple, make) -> Holdings:
    """A copy of the Holdings kept under `key`, made (`make()`) and kept if there is none; the
    kept ones all go once KEPT_OWNER_TABLES are."""
    made = tables.get(key)
    if made is None:
        if len(tables) >= KEPT_OWNER_TABLES:
            tables.clear()
        made = tables[key] = make()
    return made.copy()


class Placement:
    """One Runtime's distributed side: the transport, the transfer kernels, and the current
    run's decisions (`start` begins a run)."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.inbox = Inbox(transport)
        # Their CUDA "implementation" is the same host function (library=): no device code.
        no_device_code = CudaCode(Path(__file__), lambda shapes: 0, library_only=True)
        self.send_kernel = kernel(WorkerType.ACCELERATOR, name="send", mixed_dtypes=True,
                                  cuda=dataclasses.replace(no_device_code, library=self._send))(self._send)
        self.recv_kernel = kernel(WorkerType.ACCELERATOR, name="recv", mixed_dtypes=True,
                                  cuda=dataclasses.replace(no_device_code, library=self._recv))(self._recv)
        self.native_send = transfer_kernel("send", self._native_send, SEND,
                                           dataclasses.replace(no_device_code, library=self._native_send))
        self.native_recv = transfer_kernel("recv", self._native_recv, RECEIVE,
                                           dataclasses.replace(no_device_code, library=self._native_recv))
        self.warned_idle = self.warned_traffic = False
        # Holdings as made for an array's first run, by its owner, shape, layout and dtype,
        # copied for each run: a 2048² matrix's 2-D block-cyclic owners took 8 ms of every run
        # on every rank to make. Apart (lest they push those out), those of buffers one rank
        # owns, by the rank, elements and dtype: an accumulator's took ~10 µs an allocation.
        self._owner_tables: dict[tuple, Holdings] = {}
        self._one_owner_tables: dict[tuple, Holdings] = {}
        self.start(None, record=False)

    @property
    def submitted(self) -> int:
        """The orchestration's tasks submitted so far in this run."""
        return int(self.counts[C_LABEL])

    @property
    def placed(self) -> list[int]:
        """The run's tasks placed on each rank (all ranks agree)."""
        return self.counts[C_PLACED:C_PLACED + self.size].tolist()

    @property
    def bytes_written(self) -> int:
        """Bytes the run's tasks wrote (all ranks agree)."""
        return int(self.counts[C_WRITTEN])

    @property
    def bytes_moved(self) -> int:
        """Bytes the run moved between ranks (all ranks agree)."""
        return int(self.counts[C_MOVED])

    @property
    def transfers(self) -> int:
        """The run's sends and receives on this rank."""
        return int(self.counts[C_TRANSFERS])

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank's transfers sent in the run (packed)."""
        return int(self.counts[C_BYTES_SENT])

    @property
    def bytes_received(self) -> int:
        """Bytes this rank's transfers received in the run (packed)."""
        return int(self.counts[C_BYTES_RECEIVED])

    @property
    def placed_by_compiled_code(self) -> int:
        """The run's tasks compiled code placed itself, on this rank (jit/placing.py)."""
        return int(self.counts[C_COMPILED])

    def start(self, sizes: Sizes | None, record: bool) -> None:
        self._holdings: dict[int, Holdings] = {}  # by buffer key
        self._externals: list[Buffer] = []
        # The transfers Python placed, by the index a transfer task carries; the Python way
        # takes its own when it runs them (native ones stay, as compiled code's never come)
        self._transfers: dict[int, Transfer] = {}
        self._default_owner = [0]
        # Tasks placed (the next one's id, C_LABEL), on each rank, bytes written and moved, this
        # rank's transfers and their sequences: an array compiled placement (jit/placing.py)
        # counts in too.
        self.counts = np.zeros(C_WIDTH, np.int64)
        self.tasks_run: list[int] = []
        self.graph = LogicalGraph(sizes) if record else None
        self.lane: TensorDescriptor | None = None  # an ordered transport's chain (module docstring)
        self._comm: int | None = None  # the run's communicator's handle, for native transfers
        self.inbox.clear()

    # --- memory --------------------------------------------------------------------------
    def external(self, tensor: TensorDescriptor, owner: Owner | None) -> None:
        buffer = tensor.buffer
        if buffer.key in self._holdings:
            if owner is not None and not self._same_owners(tensor, owner):
                raise RankError(f"o.external(owner={owner}): {buffer!r} already has other owners; give an "
                                "array's owners once, at its first o.external")
            return
        self._holdings[buffer.key] = self._track(tensor, owner)
        self._externals.append(buffer)

    def alloc(self, tensor: TensorDescriptor, owner: Owner | None,
              held: tuple[int, int] | None = None) -> None:
        """A heap buffer (`tensor` views it whole); `held`: the writer and valid bits of the
        one entry of one rank's buffer, where compiled placement kept its tables until now."""
        holdings = self._holdings[tensor.buffer.key] = self._track(tensor, owner)
        if held is not None:
            if len(holdings.owner) != 1:
                raise InvariantError(f"{tensor.buffer!r}: compiled placement held one owner's table, not "
                                     f"{len(holdings.owner)} entries")
            holdings.writer[0], holdings.valid[0] = held
        if self.graph is not None:
            self.graph.alloc(tensor.buffer.nbytes, tensor.buffer.key)

    @property
    def default_owner(self) -> int:
        """The owner of a heap buffer allocated without one: o.on_rank's, else rank 0."""
        return self._default_owner[-1]

    def freed(self, buffer: Buffer) -> None:
        del self._holdings[buffer.key]
        if self.graph is not None:
            self.graph.free(buffer.key)

    @contextlib.contextmanager
    def owning(self, rank: int) -> Iterator[None]:
        check_rank(rank, self.size, "o.on_rank", "rank")
        self._default_owner.append(rank)
        try:
            yield
        finally:
            self._default_owner.pop()

    def owner_of(self, tensor: TensorDescriptor) -> int:
        return self._holding(tensor).owner_of(tensor)

    def _track(self, tensor: TensorDescriptor, owner: Owner | None) -> Holdings:
        count = tensor.buffer.nbytes // tensor.dtype.itemsize
        whole = self._default_owner[-1] if owner is None else owner
        if type(whole) is int and 0 <= whole < self.size:  # one rank's (a heap tile, say): nothing to check
            return _kept(self._one_owner_tables, (whole, count, tensor.dtype),
                         lambda: Holdings(whole, count, tensor.dtype, self.size))
        # What the owners depend on. Not the layout key: it merges and sorts dims (a (4, 2)
        # array's is a (2, 4) one's), and its buffer key is a per-run counter. The owner's type:
        # True, 1.0 and np.int64(1) are equal keys, and only the last is an owner.
        key = (type(whole), whole, tensor.shape, tensor.strides, tensor.byte_offset, count, tensor.dtype)
        try:
            hash(key)
        except TypeError:  # not a distribution at all: _owners names what is wrong
            return self._made(tensor, owner, count)
        return _kept(self._owner_tables, key, lambda: self._made(tensor, owner, count))

    def _made(self, tensor: TensorDescriptor, owner: Owner | None, count: int) -> Holdings:
        """The Holdings of a tensor's buffer by its owners, as at the start of a run."""
        owners = self._owners(tensor, owner).astype(np.int8)  # broadcasts to the tensor's shape
        if owners.size == 0 or (owners == owners.flat[0]).all():
            return Holdings(int(owners.flat[0]) if owners.size else 0, count, tensor.dtype, self.size)
        whole_array = tensor.byte_offset == 0 and tensor.size == count and tensor.is_contiguous()
        if whole_array and owners.size in (len(owners), count):  # an entry per row, or per element
            table = owners.ravel()  # the usual whole array: a row's owner covers its elements
        else:
            table = np.full(count, owners.flat[0], np.int8)
            element_view(table, tensor, tensor.dtype.itemsize)[...] = owners
        return Holdings(table, count, tensor.dtype, self.size)

    def _owners(self, tensor: TensorDescriptor, owner: Owner | None) -> np.ndarray:
        return element_owners(self._default_owner[-1] if owner is None else owner, tensor.shape, self.size,
                              f"{tensor!r}")

    def _same_owners(self, tensor: TensorDescriptor, owner: Owner) -> bool:
        shape = tensor.shape or (1,)
        held = self._holding(tensor).owners_of(tensor).reshape(shape)
        return np.array_equal(np.broadcast_to(self._owners(tensor, owner), shape), held)

    def _holding(self, tensor: TensorDescriptor) -> Holdings:
        return self._holdings[tensor.buffer.key]

    # --- what compiled placement reads and writes (jit/placing.py) ---------------------------
    def tables(self, buffer: Buffer) -> tuple[int, int, int, int, int, int] | None:
        """A buffer's holdings tables as they are now (a split makes new ones): elements per
        entry, the elements' itemsize, entries, and the addresses of the owner, writer and
        valid tables; None if the run has not seen it."""
        holdings = self._holdings.get(buffer.key)
        if holdings is None:
            return None
        return holdings.unit, holdings.itemsize, len(holdings.owner), *holdings.addresses()

    def written(self, buffer: Buffer) -> None:
        """Compiled code wrote the buffer's tables: what Holdings remembers of them is stale."""
        self._holdings[buffer.key].forget()

    def native_transfers(self) -> NativeTransfers | None:
        """What compiled code needs to enter the run's native transfers itself, as `_transfer`
        does; None where the transport has none (ordered, or no MPICH ABI)."""
        if self.transport.ordered or self.transport.native is None:
            return None
        if self._comm is None:
            self._comm = self.transport.comm_handle()
        return NativeTransfers(self.native_send.id, self.native_recv.id, self._comm, *self.transport.tags)

    def datatype(self, tensor: TensorDescriptor) -> int | None:
        """The MPI datatype a native transfer of the region posts with (Transport.datatype)."""
        return self.transport.datatype(tensor)

    # --- tasks ---------------------------------------------------------------------------
    def place(self, task: Task, tensors: list[Param], rank: int | None) -> list[Task]:
        """Decide where `task` runs and mark it; the transfer tasks to submit before it."""
        counts, holdings = self.counts, self._holdings
        task.label = int(counts[C_LABEL])
        counts[C_LABEL] += 1
        if rank is None:
            rank = 0
            for p in tensors:
                if p.writes:
                    rank = holdings[p.value.buffer.key].owner_of(p.value)
                    break
        else:
            check_rank(rank, self.size, f"submit({task.kernel.name})", "rank")
        counts[C_PLACED + rank] += 1
        task.runs_here = rank == self.rank
        task.inline = not task.runs_here  # completes unrun: whichever worker makes it ready does that
        if task.runs_here:
            self.tasks_run.append(task.label)
        if self.graph is not None:
            self.graph.add(task)
        transfers = []
        for p in tensors:
            if p.reads:
                for source, mask in holdings[p.value.buffer.key].fetch(p.value, rank):
                    transfers += self._transfer(p.value, mask, source, rank)
        for p in tensors:
            if p.writes:
                holdings[p.value.buffer.key].wrote(p.value, rank)
                counts[C_WRITTEN] += p.value.nbytes
        return transfers

    def idle_ranks(self) -> str | None:
        """Once per Runtime: a warning naming the ranks a finished run gave no task, when it had
        enough tasks for every rank (its owners put every write elsewhere)."""
        idle = [rank for rank, count in enumerate(self.placed) if count == 0]
        if self.warned_idle or len(idle) == 0 or self.submitted < self.size:
            return None
        self.warned_idle = True
        return (f"ranks {', '.join(map(str, idle))} of {self.size} ran none of the run's {self.submitted} "
                "tasks: a task runs on the owner of what it writes, and no region it wrote is theirs (give "
                "o.external/o.alloc owners whose blocks match the tiles the tasks write, e.g. "
                "pto.block_rows(o.ranks) over tiles of rows); said once per Runtime")

    def heavy_traffic(self) -> str | None:
        """Once per Runtime: a warning when a finished run moved more bytes between ranks than
        its tasks wrote (owners whose blocks cut across the tiles the tasks read), and at least
        TRAFFIC_WORTH_SAYING: less costs less than a millisecond."""
        if self.warned_traffic or self.bytes_moved <= max(self.bytes_written, TRAFFIC_WORTH_SAYING):
            return None
        self.warned_traffic = True
        return (f"the run moved {self.bytes_moved / 2**20:.1f} MiB between ranks, more than its tasks wrote "
                f"({self.bytes_written / 2**20:.1f} MiB): most of what they read is another rank's (give "
                "o.external/o.alloc owners whose blocks match the tiles the tasks read and write, e.g. "
                "pto.block_rows(o.ranks) over tiles of rows); said once per Runtime")

    def write_back(self) -> list[Task]:
        """Transfers that give each external array's owner the newest version of its elements."""
        transfers = []
        for buffer in self._externals:
            holdings = self._holdings[buffer.key]
            whole = TensorDescriptor(buffer, buffer.base, 0, (1,), (holdings.count,), holdings.dtype)
            for writer, owner, mask in holdings.stale_at_owner():
                transfers += self._transfer(whole, mask, writer, owner)
        return transfers

    def _transfer(self, tensor: TensorDescriptor, mask: np.ndarray | None, source: int,
                  dest: int) -> list[Task]:
        count = tensor.size if mask is None else int(np.count_nonzero(mask))
        self.counts[C_MOVED] += count * tensor.dtype.itemsize
        if self.rank not in (source, dest):
            return []
        sending = self.rank == source
        peer = dest if sending else source
        counts = self.counts
        sequence = int(counts[(C_SENT_TO if sending else C_RECEIVED_FROM) + peer])
        counts[(C_SENT_TO if sending else C_RECEIVED_FROM) + peer] += 1
        # counted as placed: native transfers never pass through Python
        counts[C_BYTES_SENT if sending else C_BYTES_RECEIVED] += count * tensor.dtype.itemsize
        index = int(counts[C_TRANSFERS])
        counts[C_TRANSFERS] += 1
        ordered = self.transport.ordered  # see the module docstring
        region = (input if sending else output)(tensor)
        # A receive into a read-only array goes the Python way, whose unpacking fails the task
        # (MPI would write it), as does one into elements a zero stride repeats (MPI forbids it).
        writable = tensor.buffer.writeable and all(
            stride or n == 1 for stride, n in zip(tensor.strides, tensor.repeats))
        native = not ordered and mask is None and self.transport.native is not None and (sending or writable)
        datatype = self.transport.datatype(tensor) if native else None
        if datatype is not None:  # (region, index, peer, tag, datatype, comm): what native code reads
            if self._comm is None:
                self._comm = self.transport.comm_handle()  # the run's own communicator
            params = (region, scalar(index), scalar(peer), scalar(tag(self.transport.tags, sequence)),
                      scalar(datatype), scalar(self._comm))
            kernel = self.native_send if sending else self.native_recv
        else:
            params = (region, inout(self.lane), scalar(index)) if ordered else (region, scalar(index))
            kernel = self.send_kernel if sending else self.recv_kernel
        task = Task(-1, kernel, WorkerType.ACCELERATOR, params, label=-1, inline=not ordered,
                    arrives=not sending)
        self._transfers[index] = Transfer(mask, peer, sequence, task)
        return [task]

    # --- the transfer kernels: (region, [lane,] index of the transfer) --------------------
    def _send(self, region, *lane_and_index) -> None:
        transfer = self._take(lane_and_index[-1])
        self.transport.send(region, transfer.mask, transfer.peer, transfer.sequence)

    def _recv(self, region, *lane_and_index) -> None:
        transfer = self._take(lane_and_index[-1])
        self.inbox.post(transfer.task, region, transfer.mask, transfer.peer, transfer.sequence)

    # the Python way of the native ones: (region, index, what native code reads)
    def _native_send(self, region, index, *native) -> None:
        self._send(region, index)

    def _native_recv(self, region, index, *native) -> None:
        self._recv(region, index)

    def _take(self, index: int) -> Transfer:
        return self._transfers.pop(index)
