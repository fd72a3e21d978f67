"""Executors: who runs the tasks of a run, and when.

serial: each task at submission, on the caller's thread (the reference every other
executor is tested against). dry: each task retires at submission without running its
kernel (graph building only). parallel: worker threads per worker class. stream: each task
enqueued at submission on a stream of its worker class, ordered across streams by events.
"""

from __future__ import annotations

import time
from typing import Protocol

from ..errors import TaskError
from ..first_calls import first_calls
from ..profile import Lane
from ..tasks import Task


class Arrivals(Protocol):
    """Where an executor learns that tasks whose kernel has run (Task.arrives) may complete: a
    distributed run's inbox (distributed/inbox.py)."""

    # Where native workers may post the run's transfers themselves (native.py): the transport's
    # NativeMpi (MPI's functions), else None.
    mpi: tuple | None

    def arrived(self) -> list[int]:
        """The ids of those whose data has come since the last call; never waits."""

    def check(self) -> None:
        """Raise PeerFailed if a rank has said it failed (`arrived` does too, with receives of
        its own posted); for a poll of transfers native code posted."""

    def cancel(self, receives: list[int], sends: list[int], read: list) -> None:
        """The MPI requests of transfers native code posted that a stopped run leaves, and the
        buffers those sends read (Transport.cancel)."""


def run_kernel(backend, task: Task, lane: Lane) -> None:
    """Run one task's kernel on the backend and note its time in `lane`, and whether it was a
    first call (first_calls.preparing); a failure becomes TaskError with the cause chained. A task
    another rank runs completes here unrun."""
    if not task.runs_here:
        return
    prepared = first_calls()
    started = time.perf_counter()
    try:
        backend.run(task)
    except Exception as cause:
        raise TaskError.of(task, cause) from cause
    lane.ran(task, started, time.perf_counter(), first_calls() != prepared)
