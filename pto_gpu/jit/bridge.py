"""The one door from compiled orchestration code back to Python.

Compiled code calls `service(session, code, a, b, c)` from a numba objmode block; the
session (host.Session) registered under that key does the work: hand logged tasks to the
executor, make room in a full ring, check invariants, or raise the error a code names.
"""

from __future__ import annotations

SERVICE_FLUSH = 0  # hand the logged tasks and edges over
SERVICE_ROOM = 1  # a: the FULL_* status of a full ring
SERVICE_CHECK = 2  # validation mode: a: task id or buffer key, b: what just happened (CHECK_*)

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

SESSIONS: dict[int, object] = {}


def service(session: int, code: int, a: int, b: int, c: int) -> None:
    SESSIONS[session].service(code, a, b, c)
