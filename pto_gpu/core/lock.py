"""The core's lock, and the atomics with which threads hand each other data.

The lock is a spinlock in the header, taken by every entry into the core while native
workers (executors/native.py) run tasks without the GIL. Until then the GIL serialises every
core call, so the lock is only taken when the header's `locking` is set (by the executor,
before its workers start; `reset` clears it): one predictable branch for runs that do not
need it. Holders never wait for anything else
(core calls are short and never call back), so it cannot deadlock; a waiter yields its core
after a short spin, since on a machine with as many threads as cores the holder may be
waiting for that very core.

Release stores, acquire loads, prefetches and `back_off` serve the hand-offs: a compiled
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
_SPINS = 64  # turns of a wait loop before it yields the core
_YIELDS = 16  # yields before it sleeps
_NAP_US = 50
_I64 = ir.IntType(64)


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


@njit(cache=True, _nrt=False, inline="always")
def back_off(spins):
    """One more turn of a wait loop that has turned `spins` times since it last saw progress;
    the count to pass next turn. Every _SPINS turns the core goes to another thread, and after
    _YIELDS of those the waiter sleeps _NAP_US between looks: on a machine busier than its
    cores, the thread it waits for may be waiting for this core, and a yield did not always
    give it (a pipelined build beside two busy processes took 17 s instead of 0.05)."""
    spins += 1
    if spins % _SPINS == 0:
        if spins >= _SPINS * _YIELDS:
            nap(_NAP_US)
        else:
            yield_core()
    return spins


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
