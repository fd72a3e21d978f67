"""The persistent scheduler's state in a device's memory, and the host's side of its protocol
(persistent_protocol.h, through persistent_host.c): what executors/persistent.py publishes
tasks with and polls.

The state is two regions (pto_layout): the blocks' own words in device memory, the words the
host writes or reads in mapped memory (host memory the GPU reaches). Among the protocol's
mapped words are the task records, per slot: the protocol's header (the ticket, where its
producers' tickets are, the pieces it runs as, its length), then the instance to run (its index
in the kernel's module) and the argument words, which the blocks read as the wirer staged them
in device memory. After them come, per slot, when and on which block its task ran (written
back); per block, the ticket + 1 of the task it runs (0 between tasks); then the scheduler
record and the records' record (PtoRecords) the kernel takes, their pointers the device's.
Beside them in device memory, the board of tasks run as several pieces. On the emulator all of
it is host memory.

The executor publishes tasks from nogil numba (executors/persistent_issue.py), which calls the
host's side by address (`HOST_CALLS`, `publish_at`, `look_at`).
"""

from __future__ import annotations

import ctypes
import enum
from typing import NamedTuple, Protocol

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import emulator

PROTOCOL = emulator.SOURCE.with_name("persistent_protocol.h")
HOST = emulator.SOURCE.with_name("persistent_host.c")
NO_WORK = 0xFFFFFFFF  # the instance of a task with no work items: it completes unrun


class Shown(enum.IntEnum):  # what the blocks show the host (PTO_WIRED ...)
    WIRED = 0  # records wired
    WORDS_READ = 1  # producers' words read
    LAST_DONE = 2  # the ticket + 1 of the task completed last


class Field(enum.IntEnum):  # a task record's words: the protocol's header (PTO_RECORD_*), then the kernel's
    TICKET = 0
    FIRST_WORD = 1  # where its producers' tickets start in the ring
    PRODUCERS = 2  # how many
    PIECES = 3  # the pieces it runs as
    LENGTH = 4  # the record's words in use
    INSTANCE = 5  # the kernel's (PTO_RECORD_INSTANCE): its index in the module,
    WORDS = 6  # then the argument words


class Abort(enum.IntEnum):  # an abort word: PTO_RUNNING, or why the run stopped
    RUNNING = 0
    STUCK = 1
    FAULTED = 2


class Memory(Protocol):
    """What a device gives the scheduler's state (cuda_device.py, emulated_device.py)."""

    def mapped(self, nbytes: int) -> tuple[np.ndarray, int]:
        """Zeroed host memory the device reaches, kept as long as the array: the host's view
        (uint8) and the device's address of it."""

    def device_words(self, nbytes: int) -> tuple[object, int]:
        """Device memory, kept as long as the first item: (it, its address)."""

    def copy_in(self, address: int, data: np.ndarray) -> None:
        """Copy host array `data` to device address `address`, and wait for it."""


# The kernel's PtoRecords (pto_persistent_kernel.cuh): where the task records are, at the
# device's addresses, in its field order.
RECORDS = np.dtype([(name, np.uint64) for name in ("began", "ended", "ran_on", "running", "pieces_run",
                                                   "board", "board_entries", "open")])


class Sizes(NamedTuple):
    slots: int  # task slots: tasks published and not yet seen done (a power of two)
    words: int  # the ring of producers' tickets (a power of two); also the most producers
    #             any `slots` consecutive tasks may name in all (the pool's bound)
    words_per_task: int  # argument words a task's record holds (past its instance)
    blocks: int  # of the kernel
    board: int  # entries of its board of tasks whose pieces blocks share


# What numba code calls (executors/persistent_issue.py): the host's pto_sched, and the
# addresses of its functions.
HOST_CALLS = np.dtype([(name, np.int64) for name in ("sched", "publish", "done", "shown")], align=True)


def _pointer(builder, value):
    return builder.inttoptr(value, ir.IntType(8).as_pointer())


@intrinsic
def publish_at(typingctx, address, sched, ticket, next_word, producers, count, pieces, own_words):
    """pto_persistent_publish(sched, ticket, next_word, producers, count, pieces, own_words): 0,
    or 1 (refused: its producers are not all earlier tasks, more than the ring of words holds,
    or its record's words more than a record holds)."""
    def codegen(context, builder, signature, args):
        i8p, i32, i64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)
        fnty = ir.FunctionType(i32, [i8p, i64, i8p, i8p, i32, i32, i32])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(callee, [_pointer(builder, args[1]), args[2], _pointer(builder, args[3]),
                                     _pointer(builder, args[4]), *(builder.trunc(a, i32) for a in args[5:])])

    return types.int32(*[types.int64] * 8), codegen


@intrinsic
def look_at(typingctx, address, sched, which):
    """pto_persistent_done(sched, slot) or pto_persistent_shown(sched, which): an acquire load
    of a word the blocks store."""
    def codegen(context, builder, signature, args):
        i8p, i32, i64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)
        fnty = ir.FunctionType(i64, [i8p, i32])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(callee, [_pointer(builder, args[1]), builder.trunc(args[2], i32)])

    return types.int64(types.int64, types.int64, types.int64), codegen


_library: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """persistent_host.c with the protocol pasted above it, built once per text."""
    global _library
    if _library is None:
        source = "#define _POSIX_C_SOURCE 200809L\n" + PROTOCOL.read_text() + "\n" + HOST.read_text()
        path = emulator.build(source, emulator.cache_dir(), "persistent_host", 'executor="persistent"',
                              "the host's side of its scheduler")
        loaded = ctypes.CDLL(str(path))
        u32, u64, pointer = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
        for name, result, arguments in (
                ("pto_persistent_sched_bytes", u64, ()),
                ("pto_persistent_layout", None, (pointer, u32, u32, u32, pointer, pointer, pointer)),
                ("pto_persistent_records", pointer, (pointer,)),
                ("pto_persistent_staged", pointer, (pointer,)),
                ("pto_persistent_initial", None, (pointer,)),
                ("pto_persistent_close", None, (pointer,)),
                ("pto_persistent_stop", None, (pointer, u32)),
                ("pto_persistent_done", u64, (pointer, u32)),
                ("pto_persistent_shown", u64, (pointer, u32)),
                ("pto_persistent_device_abort", u32, (pointer,)),
                ("pto_persistent_aborted", u32, (pointer,))):
            function = getattr(loaded, name)
            function.restype, function.argtypes = result, arguments
        _library = loaded
    return _library


class State:
    """One kernel's scheduler state: `reset` before each launch of the kernel."""

    def __init__(self, memory: Memory, sizes: Sizes):
        self.sizes = sizes
        self._memory = memory
        self._lib = lib = library()
        sched_bytes = int(lib.pto_persistent_sched_bytes())
        record_words = Field.WORDS + sizes.words_per_task
        extent = (ctypes.c_uint64 * 2)()

        def laid_out(device: int | None, mapped: int | None) -> ctypes.Array:
            """A pto_sched over regions at these addresses (None: sizes only, in `extent`)."""
            sched = ctypes.create_string_buffer(sched_bytes)
            lib.pto_persistent_layout(sched, sizes.slots, sizes.words, record_words, device, mapped, extent)
            return sched

        laid_out(None, None)
        device_bytes, protocol_bytes = int(extent[0]), int(extent[1])
        # The mapped region: the protocol's words (pto_layout: each array at 128 bytes), then the
        # kernel's, each at 64 bytes.
        offsets, end = {}, protocol_bytes
        for name, count, dtype in (("began", sizes.slots, np.uint64), ("ended", sizes.slots, np.uint64),
                                   ("ran_on", sizes.slots, np.uint64), ("running", sizes.blocks, np.uint64),
                                   ("sched", sched_bytes, np.uint8), ("records", 1, RECORDS)):
            offsets[name] = end
            end += -(-count * np.dtype(dtype).itemsize // 64) * 64
        self._mapped, mapped_address = memory.mapped(end)
        self._device, device_address = memory.device_words(max(device_bytes, 64))
        # The board of tasks whose pieces blocks share (pto_persistent_kernel.cuh), the count of
        # its open entries (in a 128-byte line of its own: every idle block loads it each turn),
        # and per slot the pieces run: zeros at each reset.
        pieces_run_bytes = -(-sizes.slots * 4 // 128) * 128
        self._shared_zeros = np.zeros(pieces_run_bytes + sizes.board * 8 + 128, np.uint8)
        self._pieces_memory, pieces_address = memory.device_words(len(self._shared_zeros))
        board_address = pieces_address + pieces_run_bytes
        device_records = {"pieces_run": pieces_address, "board": board_address, "board_entries": sizes.board,
                          "open": board_address + sizes.board * 8}
        mapped = self._mapped
        # The host's pto_sched (it touches the mapped words only); one over the host's copy of
        # the device region's state (its arrays before the staged records), which `reset` sets
        # and copies in; and the kernel's, in mapped memory: the same layout at the device's
        # addresses.
        self._host = laid_out(device_address, mapped.ctypes.data)
        self._staging = np.zeros(lib.pto_persistent_staged(self._host) - device_address, np.uint8)
        self._first_state = laid_out(self._staging.ctypes.data, mapped.ctypes.data)
        # the task records, the protocol's last array in the mapped region: the header the
        # protocol writes (PTO_RECORD_*), then the instance and the argument words the executor
        # writes (pto_persistent_kernel.cuh); reset leaves them as they are
        records_at = lib.pto_persistent_records(self._host) - mapped.ctypes.data
        self.records = mapped[records_at:].view(np.int64)[:sizes.slots * record_words].reshape(
            sizes.slots, record_words)
        self.kernel = self.records[:, Field.INSTANCE]
        self.words = self.records[:, Field.WORDS:]
        self.running = mapped[offsets["running"]:].view(np.uint64)[:sizes.blocks]
        # when and where each slot's task ran: pto_now_ns() (the device's clock) and the block
        self.began, self.ended, self.ran_on = (mapped[offsets[name]:].view(np.uint64)[:sizes.slots]
                                               for name in ("began", "ended", "ran_on"))
        mapped[offsets["sched"]:offsets["sched"] + sched_bytes] = np.frombuffer(
            laid_out(device_address, mapped_address).raw, np.uint8)
        kernel_records = mapped[offsets["records"]:offsets["records"] + RECORDS.itemsize].view(RECORDS)
        in_mapped = {name: mapped_address + offsets[name] for name in ("began", "ended", "ran_on", "running")}
        for name, value in (in_mapped | device_records).items():
            kernel_records[name] = value
        self._pieces_address = pieces_address
        self.kernel_args = (mapped_address + offsets["sched"], mapped_address + offsets["records"])
        self._records_at = records_at
        self._device_address = device_address
        self.calls = np.zeros(1, HOST_CALLS)
        self.calls[0] = (ctypes.addressof(self._host), *(
            ctypes.cast(getattr(lib, f"pto_persistent_{name}"), ctypes.c_void_p).value
            for name in HOST_CALLS.names[1:]))

    def reset(self) -> None:
        """The first state: no task published, every chunk free (the device region's state set
        through a host copy of it, then copied there)."""
        self._mapped[:self._records_at] = 0
        self.running[:] = 0
        self._staging[:] = 0
        self._lib.pto_persistent_initial(self._first_state)
        self._memory.copy_in(self._device_address, self._staging)
        self._memory.copy_in(self._pieces_address, self._shared_zeros)

    # --- the host's side -------------------------------------------------------------------
    def done(self, ticket: int) -> bool:
        return self._lib.pto_persistent_done(self._host, ticket & (self.sizes.slots - 1)) == ticket

    def shown(self, which: Shown) -> int:
        return int(self._lib.pto_persistent_shown(self._host, which))

    def progress(self) -> tuple[int, int]:
        """What moves when the blocks wire a task or complete one (the host cannot read their
        counters: device memory)."""
        return self.shown(Shown.WIRED), self.shown(Shown.LAST_DONE)

    def device_abort(self) -> Abort:
        return Abort(self._lib.pto_persistent_device_abort(self._host))

    def aborted(self) -> Abort:
        """Why the run was stopped, by the host or a block (RUNNING: it was not)."""
        return Abort(self._lib.pto_persistent_aborted(self._host))

    def close(self) -> None:
        """The last task is published: the blocks end once every task has finished."""
        self._lib.pto_persistent_close(self._host)

    def stop(self, why: Abort) -> None:
        """Stop the blocks at their next look (a host error, or they are stuck)."""
        self._lib.pto_persistent_stop(self._host, why)
