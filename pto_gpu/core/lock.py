"""The core's lock, and the atomics with which threads hand each other data.

The lock is a spinlock in the header, taken by every entry into the core once code that
runs without the GIL may enter it: native workers (executors/native.py) and `nogil` compiled
bodies. Until then the GIL serialises every core call, so the lock is only taken when the
header's `locking` is set (by the parallel executor, at a run's first compiled call or native
submit, under the GIL, so no Python-held call is in the core then; `reset` clears it): one
predictable branch for runs that do not need it. Holders never wait for anything else
(core calls are short and never call back), so it cannot deadlock; a waiter yields its core
after a short spin, since on a machine with as many threads as cores the holder may be
waiting for that very core.

Release stores, acquire loads, prefetches, a clock and `back_off` serve the hand-offs: a compiled
submit's arguments to native workers (jit/api.py), and queued submits to the core stage of a
pipelined run (jit/pipeline.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .state import HEADER

_LOCK_OFFSET = HEADER.fields["lock"][1]
_SPINS = 64  # turns of the core lock's wait before it yields the core
# A wait loop (back_off) spins, then yields, then sleeps, by the time it has waited: a sleep
# costs far more than it asks on a VM (usleep(1) took 76 us on the 2-core VM, usleep(50) 129),
# so a waiter sleeps only once it has waited longer than that. (back_off is inlined into cached
# code, and numba checks only the caller's file: delete the numba caches after changing these.)
_SPIN_NS = 5_000
_YIELD_NS = 250_000
_NAP_US = 50
_I64 = ir.IntType(64)
_CLOCK_MONOTONIC = 1


@intrinsic
def compare_and_swap(typingctx, address, expected, new):
    """Atomically: if the int64 at `address` is `expected`, make it `new`; whether it was."""
    if not all(isinstance(t, types.Integer) for t in (address, expected, new)):
        return None

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], _I64.as_pointer())
        old_new = builder.cmpxchg(pointer, args[1], args[2], "acquire", "monotonic")
        return builder.extract_value(old_new, 1)

    return types.boolean(address, expected, new), codegen


@intrinsic
def store_release(typingctx, address, value):
    """Store an int64 at `address`, after every earlier store is visible."""
    if not all(isinstance(t, types.Integer) for t in (address, value)):
        return None

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], _I64.as_pointer())
        builder.store_atomic(args[1], pointer, "release", 8)
        return context.get_dummy_value()

    return types.void(address, value), codegen


@intrinsic
def load_acquire(typingctx, address):
    """The int64 at `address`, read before any later load or store."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.load_atomic(pointer, "acquire", 8)

    return types.int64(address), codegen


@intrinsic
def prefetch(typingctx, address, write):
    """Ask for the cache line at `address` (to write it when `write`, a literal)."""
    if not isinstance(address, types.Integer) or not isinstance(write, types.IntegerLiteral):
        return None
    rw = write.literal_value

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        pointer = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(function, [pointer, i32(rw), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(address, write), codegen


@intrinsic
def nap(typingctx, microseconds):
    """usleep(3): sleep at least `microseconds`."""
    if not isinstance(microseconds, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32]), "usleep")
        builder.call(function, [builder.trunc(args[0], i32)])
        return context.get_dummy_value()

    return types.void(microseconds), codegen


@intrinsic
def yield_core(typingctx):
    """sched_yield(2): let another thread have this core."""
    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                  "sched_yield")
        builder.call(function, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def monotonic_ns(typingctx):
    """clock_gettime(CLOCK_MONOTONIC) in nanoseconds: the clock of Python's time.perf_counter on
    Linux (a vDSO call, no system call)."""
    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), _I64
        timespec = ir.LiteralStructType([i64, i64])
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [i32, timespec.as_pointer()]), "clock_gettime")
        spec = cgutils.alloca_once(builder, timespec)
        builder.call(function, [i32(_CLOCK_MONOTONIC), spec])
        seconds = builder.load(builder.gep(spec, [i32(0), i32(0)]))
        nanoseconds = builder.load(builder.gep(spec, [i32(0), i32(1)]))
        return builder.add(builder.mul(seconds, i64(1_000_000_000)), nanoseconds)

    return types.int64(), codegen


@njit(cache=True, _nrt=False, inline="always")
def back_off(waiting_since):
    """One more turn of a wait loop; pass 0 on its first turn, and again whenever it sees the
    thread it waits for make progress, then what this returned. The waiter spins for
    _SPIN_NS, then yields its core between looks until _YIELD_NS, then sleeps _NAP_US between
    looks: on a machine busier than its cores the thread it waits for may need this core, and
    a yield did not always give it (a pipelined build beside two busy processes took 17 s
    instead of 0.05 when waits only yielded). Sleeping sooner cost more than it saved: when
    waits slept after 16 yields (~5 us), the 16K LLaMA build took 115-140 ms pipelined; waiting
    by time, 35."""
    now = monotonic_ns()
    if waiting_since == 0:
        return max(now, 1)  # never 0, which would start the wait again at every turn
    waited = now - waiting_since
    if waited >= _YIELD_NS:
        nap(_NAP_US)
    elif waited >= _SPIN_NS:
        yield_core()
    return waiting_since


@njit(cache=True, _nrt=False, inline="always")
def acquire(header):
    if header[0].locking:
        address = header.ctypes.data + _LOCK_OFFSET
        spins = 0
        while not compare_and_swap(address, 0, 1):
            spins += 1
            if spins == _SPINS:  # not back_off: a holder is never long, so a waiter never sleeps
                yield_core()
                spins = 0


@njit(cache=True, _nrt=False, inline="always")
def release(header):
    if header[0].locking:
        store_release(header.ctypes.data + _LOCK_OFFSET, 0)
