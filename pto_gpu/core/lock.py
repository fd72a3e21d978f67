"""The core's lock: a spinlock in the header, taken by every entry into the core while
native workers (executors/native.py) run tasks without the GIL.

Until then the GIL serialises every core call, so the lock is only taken when the header's
`locking` is set (by the executor, before its workers start; `reset` clears it): one
predictable branch for runs that do not need it. Holders never wait for anything else
(core calls are short and never call back), so it cannot deadlock; a waiter yields its core
after a short spin, since on a machine with as many threads as cores the holder may be
waiting for that very core.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .state import HEADER

_LOCK_OFFSET = HEADER.fields["lock"][1]
_SPINS = 64  # compare-and-swaps before yielding the core
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
def yield_core(typingctx):
    """sched_yield(2): let another thread have this core."""
    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                  "sched_yield")
        builder.call(function, [])
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, _nrt=False, inline="always")
def acquire(header):
    if header[0].locking:
        address = header.ctypes.data + _LOCK_OFFSET
        spins = 0
        while not compare_and_swap(address, 0, 1):
            spins += 1
            if spins == _SPINS:
                yield_core()
                spins = 0


@njit(cache=True, _nrt=False, inline="always")
def release(header):
    if header[0].locking:
        store_release(header.ctypes.data + _LOCK_OFFSET, 0)
