"""What a run measured: the raw material of RunResult's statistics and of the trace.

Each thread that runs kernels owns a Lane and records into it without a lock: per kernel the
tasks run and their time, per worker class the busy time, and, when tracing, every task's
span. The run's Profile holds the lanes, the time the orchestrator waited on each full ring,
and, when tracing, samples of the ready-queue depth and the rings' occupancy. Times are
seconds of `time.perf_counter()` since the run began.
"""

from __future__ import annotations

import dataclasses
import time

from .costs import Key, Tally, key_of
from .dtypes import WorkerType
from .tasks import Scheduler, Task


@dataclasses.dataclass(slots=True)
class Span:
    task: Task
    start: float
    end: float


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """The state of the queues and rings at one moment of a traced run."""

    at: float
    ready: int  # tasks ready and waiting for a worker (stream executor: issued, not yet retired)
    live_tasks: int  # task ring occupancy
    heap_bytes: int  # heap ring occupancy


class Lane:
    """One thread of execution: a worker thread, or the caller's thread for the serial executor."""

    def __init__(self, name: str, serves: tuple[WorkerType, ...], origin: float, tracing: bool,
                 measuring: bool):
        self.name = name
        self.kernels: dict[str, list] = {}  # kernel name -> [tasks, seconds]
        self.busy = dict.fromkeys(serves, 0.0)  # worker class -> seconds
        self.spans: list[Span] | None = [] if tracing else None
        # per (kernel, shapes, worker class), when a cost history wants them (a key per task costs)
        self.measured: dict[Key, Tally] | None = {} if measuring else None
        self._origin = origin

    def ran(self, task: Task, started: float, ended: float, first_call: bool = False) -> None:
        """Record one task's kernel run, between two perf_counter() readings; a first call
        (compiling its code) is left out of the measurements for a cost history."""
        seconds = ended - started
        self._tally(task.kernel.name, task.worker, 1, seconds)
        if self.measured is not None and not first_call:
            key = key_of(task)
            measured = self.measured.get(key)
            if measured is None:
                measured = self.measured[key] = Tally()
            measured.add(seconds)
        if self.spans is not None:
            self.spans.append(Span(task, started - self._origin, ended - self._origin))

    def ran_natively(self, kernel: str, worker: WorkerType, tasks: int, seconds: float) -> None:
        """Record `tasks` runs of a kernel by native workers (executors/native.py), which time
        kernels but keep no spans: runs that trace or measure have none."""
        self._tally(kernel, worker, tasks, seconds)

    def _tally(self, kernel: str, worker: WorkerType, tasks: int, seconds: float) -> None:
        tally = self.kernels.get(kernel)
        if tally is None:
            tally = self.kernels[kernel] = [0, 0.0]
        tally[0] += tasks
        tally[1] += seconds
        # an inline task (scheduler.Task.inline) may be of a class the lane does not serve
        self.busy[worker] = self.busy.get(worker, 0.0) + seconds


class Profile:
    def __init__(self, tracing: bool, measuring: bool = False):
        self.origin = time.perf_counter()
        self.tracing = tracing
        self.measuring = measuring  # kernel times per (kernel, shapes, worker class), for a CostHistory
        self.lanes: list[Lane] = []
        self.stalls: dict[str, float] = {}  # ring (as in RunResult.high_water) -> seconds waited
        self.samples: list[Sample] = []

    def lane(self, name: str, serves: tuple[WorkerType, ...]) -> Lane:
        lane = Lane(name, serves, self.origin, self.tracing, self.measuring)
        self.lanes.append(lane)
        return lane

    def measured(self) -> dict[Key, Tally]:
        """Every lane's kernel times per (kernel, shapes, worker class), added up."""
        total: dict[Key, Tally] = {}
        for lane in self.lanes:
            for key, tally in (lane.measured or {}).items():
                total.setdefault(key, Tally()).add(tally.total, tally.count, tally.squares)
        return total

    def stalled(self, ring: str, seconds: float) -> None:
        # Only the orchestrator's thread waits for room, so this needs no lock.
        self.stalls[ring] = self.stalls.get(ring, 0.0) + seconds

    def sample(self, scheduler: Scheduler, ready: int) -> None:
        """When tracing, note the ready-queue depth and how full the task and heap rings are."""
        if self.tracing:
            h = scheduler.state.head
            self.samples.append(Sample(time.perf_counter() - self.origin, ready,
                                       int(h["next_task"] - h["last_alive"]),
                                       int(h["heap_head"] - h["heap_tail"])))
