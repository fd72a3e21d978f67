"""The serial and dry executors: every task completes at submission, on the caller's thread."""

from __future__ import annotations

import time

from ..dtypes import WorkerType
from ..errors import InvariantError
from ..polling import pause
from ..profile import Profile
from ..tasks import Scheduler, Task
from . import Arrivals, run_kernel


class SerialExecutor:
    """Runs each task as it is submitted: all its producers have completed by then. A task
    that completes when its data arrives (a receive) is waited for there."""

    runs_kernels = True
    wants_producers = False

    def __init__(self, scheduler: Scheduler, backend, profile: Profile, arrivals: Arrivals | None = None):
        self._scheduler = scheduler
        self._backend = backend
        self._profile = profile
        self._arrivals = arrivals
        self._lane = profile.lane("main", tuple(WorkerType))
        self._scratch = scheduler.ready_scratch()

    def submitted(self, task: Task, ready: bool, producers) -> None:
        if self.runs_kernels:
            run_kernel(self._backend, task, self._lane)
            if task.arrives and task.runs_here:
                self._wait_for(task.id)
        self._scheduler.retire(task.id, self._scratch)
        self._profile.sample(self._scheduler, 0)

    def _wait_for(self, task_id: int) -> None:
        started = time.perf_counter()
        while not (arrived := self._arrivals.arrived()):
            pause(time.perf_counter() - started)
        if arrived != [task_id]:  # one waits at a time
            raise InvariantError(f"waiting for task {task_id}'s data, tasks {arrived} completed")

    def make_room(self, status: int, unfreed) -> None:
        # Everything submitted has completed: only the orchestration's own live set is left.
        raise self._scheduler.deadlock(status, unfreed())

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


class DryExecutor(SerialExecutor):
    """Builds the graph (dependencies, rings, reclamation) and retires tasks unrun."""

    runs_kernels = False
