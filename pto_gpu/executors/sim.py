"""The simulating executor (executor="sim"): a deterministic discrete-event run from the
kernels' cost models (spec 004; costs.py: a kernel's cost=, else the Runtime's history).

Each worker class has its configured number of workers. The simulation keeps a clock, each
class's ready tasks in the order the Schedule gives (critical path, FIFO or tags), and the
running tasks by the time they end: idle workers start the first ready tasks of their class
(the worker as schedule.Placement chooses: stages, affinity), each ending its cost later; the
earliest ends complete in the core, together, which hands back the consumers they made ready.
Kernels really run, on the caller's thread, at the moment the simulation starts them, so
results equal the serial executor's and the recorded graph is every executor's. Nothing
starts until the orchestration returns, a ring fills or a max_concurrent window waits
(whatever the threshold): then the simulation runs until a task completes.
`makespan` is the simulated time of the last end; it depends on the graph, the costs and the
schedule only, so tests can assert it exactly.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from collections.abc import Callable

from ..costs import CostHistory
from ..dtypes import WorkerType
from ..errors import PTOError
from ..profile import Profile
from ..schedule import CriticalPaths, Heft, Placement, Schedule, mean_cost, priority
from ..tasks import Scheduler, Task
from . import run_kernel


class SimExecutor:
    runs_kernels = True
    wants_producers = True  # the successors give each task's critical path

    def __init__(self, scheduler: Scheduler, backend, profile: Profile, workers: dict[WorkerType, int],
                 schedule: Schedule, costs: CostHistory | None):
        self._scheduler = scheduler
        self._backend = backend
        self._lane = profile.lane("sim", tuple(WorkerType))
        self._schedule = schedule
        self._costs = costs or CostHistory()
        self._placement = Placement(schedule, workers, counting=True,
                                    window=scheduler.state.sizes.task_window)
        self._heft = Heft(workers, self._costs.known, self._placement.ranges, active=True)
        self._idle = {w: list(range(n)) for w, n in workers.items()}  # free workers' indices, ascending
        self._scratch = scheduler.ready_scratch()
        self._paths = CriticalPaths()  # also where each unstarted task's cost waits
        self._ready: dict[WorkerType, list] = {w: [] for w in WorkerType}  # heaps of (key, id, task)
        self._waiting: list[Task] = []  # ready, queued once the priorities are known
        self._running: list = []  # heap of (end, id, task, worker index)
        self._keyed = 0  # the critical paths' version the ready queues were keyed at
        self._failed = False
        self.makespan = 0.0

    # --- the orchestrator's side ---------------------------------------------------------
    def submitted(self, task: Task, ready: bool, producers) -> None:
        cost = mean_cost(task, self._costs.known)
        self._paths.add(task.id, self._costs.cost(task, missing=None) if cost is None else cost, producers)
        self._placement.submitted(task, producers)
        if ready:
            self._waiting.append(task)

    def make_room(self, status: int, unfreed) -> None:
        if not self._advance(until_a_completion=True):
            raise self._scheduler.deadlock(status, unfreed())

    def finish(self) -> None:
        self._advance(until_a_completion=False)
        if self._scheduler.pending:
            raise PTOError(f"{self._scheduler.pending} tasks can never become ready")

    @property
    def cross_waits(self) -> int:
        return self._placement.cross_waits

    def wait_until(self, done: Callable[[], bool]) -> None:
        while not done():
            if not self._advance(until_a_completion=True):
                raise PTOError("a max_concurrent window waits for tasks to complete, but none can run")

    def abort(self) -> None:
        """Run what was submitted, as every executor does (docs/ERRORS.md), unless a task
        failed; raise nothing (a task whose cost could not be had stops it there)."""
        if not self._failed:
            with contextlib.suppress(Exception):
                self._advance(until_a_completion=False)

    # --- the simulation ------------------------------------------------------------------
    def _advance(self, until_a_completion: bool) -> bool:
        """Run the simulation until every task has ended, or until one has; False when nothing
        could run."""
        if self._schedule.order_by == "critical_path" and self._paths.version != self._keyed:
            self._keyed = self._paths.version  # new submissions: every queued task's path may be longer
            for queue in self._ready.values():
                queue[:] = sorted((priority(self._schedule, t, self._paths), t.id, t) for _, _, t in queue)
        self._queue_waiting()
        while True:
            self._start_ready()
            if not self._running:
                return False
            end = self._running[0][0]
            self.makespan = end
            while self._running and self._running[0][0] == end:  # tasks that end together, together
                _, _, task, index = heapq.heappop(self._running)
                bisect.insort(self._idle[task.worker], index)
                self._heft.done(task.id)
                self._waiting += self._scheduler.complete(task.id, self._scratch)
            self._queue_waiting()
            if until_a_completion:
                return True

    def _queue_waiting(self) -> None:
        for task in self._waiting:
            task = self._heft.place(task)
            key = priority(self._schedule, task, self._paths)
            heapq.heappush(self._ready[task.worker], (key, task.id, task))
        self._waiting = []

    def _start_ready(self) -> None:
        """Each class's ready tasks in order onto its idle workers, as Placement chooses; a
        task none of whose workers is idle waits, without holding up others."""
        for worker, queue in self._ready.items():
            idle, waiting = self._idle[worker], []
            while queue and idle:
                entry = heapq.heappop(queue)
                task = entry[2]
                index = self._placement.choose(task, idle)
                if index is None:
                    waiting.append(entry)
                    continue
                idle.remove(index)
                self._placement.started(task, index)
                self._scheduler.start(task.id)
                try:
                    run_kernel(self._backend, task, self._lane)
                except BaseException:
                    self._failed = True  # so an abort runs nothing more
                    raise
                seconds = self._paths.started(task.id)  # the critical path's cost: its class's, or a mean
                end = self.makespan + (seconds if task.classes is None else self._heft.seconds(task.id))
                heapq.heappush(self._running, (end, task.id, task, index))
            for entry in waiting:
                heapq.heappush(queue, entry)

