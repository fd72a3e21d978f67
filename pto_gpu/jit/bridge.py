"""The one door from compiled orchestration code back to Python.

Compiled code calls `service(session, code, a, b, c)` through a C function pointer (a ctypes
callback, at `SERVICE_ADDRESS`, which compiled code reads from its tables: an address is this
process's, so no cached code may hold it). The session (host.Session) registered under that key
does the work: hand logged tasks to the executor, make room in a full ring, check invariants, or
raise the error a code names. An exception cannot cross a C frame, so the callback keeps it under
the session's key and returns RAISED; compiled code then raises `ServiceRaised`, and `call`
raises the kept exception in its place.

Not a numba objmode block, as it was: such a block is compiled in the process, not cached, once
for every cached function that contains a call, on that call. A run met 40 ms of compiling
whenever it first flushed from a submit of a kernel signature it had not flushed from before,
one of a matmul benchmark's five rounds, say. (The descriptor helpers' errors, descriptor._fail,
still leave through one: it is compiled only when such an error is raised.)
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

SERVICE_FLUSH = 0  # hand the logged tasks and edges over
SERVICE_ROOM = 1  # a: the FULL_* status of a full ring
SERVICE_CHECK = 2  # validation mode: a: task id or buffer key, b: what just happened (CHECK_*)
# A distributed run's (meta M_PLACED), each answered in meta M_ANSWER where it has an answer:
SERVICE_PLACE = 3  # submit the task whose arguments slot a holds (kernel id b); answer: its id
SERVICE_ALLOCATED = 4  # heap buffer a (its descriptor in named[0]) is owned by rank b (-1: the default)
SERVICE_FREED = 5  # heap buffer a was freed
SERVICE_OWNER = 6  # answer: the rank owning the first element of the descriptor in named[0]
SERVICE_DATATYPE = 7  # answer: the MPI datatype of the region in named[0] (native transfers), or NO_DATATYPE
SERVICE_SHARING = 8  # judge kernel a's Sharing into its kernel table's K_SHARING

CHECK_SUBMIT, CHECK_COMPLETE, CHECK_ALLOC, CHECK_FREE = 0, 1, 2, 3
CHECKED_AFTER = ("submitting task", "completing task", "allocating heap buffer", "freeing heap buffer")

# Errors: the session raises the matching PTOError with a message naming the argument.
ERR_USE_AFTER_FREE = 10  # a: param position (-1: version_inc), b: kernel id, c: buffer key
ERR_STALE = 11  # same arguments
ERR_SIGNATURE = 12  # a: kernel id, b: tensor params
ERR_TOO_MANY = 13  # a: tensor params, b: scalars
ERR_KERNEL = 14  # a: kernel id
ERR_FREE_EXTERNAL = 15  # a: buffer key
ERR_DOUBLE_FREE = 16  # a: buffer key
ERR_SCOPE_DEPTH = 17  # a: limit, or -1 for scope_end without scope_begin
ERR_SCOPE_FULL = 18  # a: limit
ERR_ALLOC_SIZE = 19  # a: bytes
ERR_ALLOC_ARGS = 20  # a: dims, b: dtype code, c: a negative dim (or 0)
ERR_VERSION_TAKEN = 21  # version_inc of a version that already has a successor (descriptor in named[0])
ERR_UNWRITABLE = 22  # a: param position, b: kernel id, c: -1 read-only memory, else the dim of stride 0
ERR_OWNER = 23  # alloc's owner a in a run of one process
ERR_SHARED = 24  # a: kernel id, b: a written param, c: a param sharing its memory (named[0], named[1])

RAISED = 1  # what the callback returns when the service raised

SESSIONS: dict[int, object] = {}
_RAISED: dict[int, BaseException] = {}  # by session key: what its last service call raised


class ServiceRaised(Exception):
    """Compiled code's signal that a service call raised; `call` raises what it raised."""


def service(session: int, code: int, a: int, b: int, c: int) -> None:
    """Do what `code` asks of the session (raising as it does). Old cached compiled code may
    still call this from its objmode block, so it keeps raising."""
    SESSIONS[session].service(code, a, b, c)


def _callback(session: int, code: int, a: int, b: int, c: int) -> int:
    try:
        service(session, code, a, b, c)
    except BaseException as error:  # noqa: BLE001 - handed on by `call`, KeyboardInterrupt included
        _RAISED[session] = error
        return RAISED
    return 0


_CALLBACK = ctypes.CFUNCTYPE(*[ctypes.c_int64] * 6)(_callback)
SERVICE_ADDRESS = ctypes.cast(_CALLBACK, ctypes.c_void_p).value


def call(session: int, function: Callable, *args: object) -> object:
    """function(*args), compiled code of `session`, raising what a service call raised in
    place of ServiceRaised; also when the body caught ServiceRaised and went on."""
    try:
        result = function(*args)
    except ServiceRaised:
        kept = True
    else:
        kept = session in _RAISED
    if kept:
        raise _RAISED.pop(session)  # outside the except: not "during handling of ServiceRaised"
    return result


def forget(session: int) -> None:
    """Drop what a closed session's service calls raised and nobody took (none should be left)."""
    SESSIONS.pop(session, None)
    _RAISED.pop(session, None)


@intrinsic
def call_service(typingctx, address, session, code, a, b, c):
    """Call the callback at `address` (SERVICE_ADDRESS) with five integers; what it returns."""
    arguments = (address, session, code, a, b, c)
    if not all(isinstance(t, types.Integer) for t in arguments):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        function = builder.inttoptr(args[0], ir.FunctionType(i64, [i64] * 5).as_pointer())
        values = [context.cast(builder, value, kind, types.int64)
                  for value, kind in zip(args[1:], signature.args[1:])]
        return builder.call(function, values)

    return types.int64(*arguments), codegen
