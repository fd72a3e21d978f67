"""How a distributed run ends: every rank raises when any rank failed, with the failure's cause.

A rank that fails (a task's kernel raised, the orchestration raised, a ring deadlocked)
tells the others at once (Transport.fail), so none waits for it: their waits raise
PeerFailed, a secondary error. At the end of every run the ranks exchange what happened
(Transport.conclude); each rank raises the first primary failure: its own, or another
rank's, as the TaskError of the task that failed there (or a RankError). A TaskError's cause
is chained on every rank: the kernel's exception where it raised, a RankError carrying its
message on the others.
"""

from __future__ import annotations

from ..errors import RankError, TaskError
from .transport import PeerFailed, Transport


def describe(error: BaseException) -> tuple:
    """What the other ranks are told about this rank's failure."""
    if isinstance(error, PeerFailed) or isinstance(error.__cause__, PeerFailed):
        return ("secondary", str(error))
    if isinstance(error, TaskError):
        return ("task", error.task_id, error.kernel, str(error))
    return ("run", f"{type(error).__name__}: {error}")


def conclude(transport: Transport, error: BaseException | None) -> BaseException | None:
    """End the run on every rank; the error this rank must raise, or None."""
    failures = transport.conclude(None if error is None else describe(error))
    if error is not None and describe(error)[0] != "secondary":
        return error
    primary = [(rank, failure) for rank, failure in failures if failure[0] != "secondary"]
    if not primary:  # only waits that gave up: they name who failed
        if error is not None or not failures:
            return error
        return RankError(f"ranks {[rank for rank, _ in failures]} failed: {failures[0][1][1]}")
    rank, failure = primary[0]
    if failure[0] == "task":
        _, task_id, kernel, message = failure
        cause = RankError(f"on rank {rank}: {message}")
        failed = TaskError(task_id, kernel, f"see rank {rank}", cause)
        failed.__cause__ = cause  # as the failing rank's TaskError has its kernel's exception
        return failed
    return RankError(f"rank {rank} failed: {failure[1]}")
