"""Schedules (spec 004): when tasks run, never what they compute.

`pto.Schedule(order_by=...)` orders each worker class's ready tasks:

    "critical_path"  (Schedule()'s) the longest remaining cost to the end of the graph first:
                     a task's cost plus the most any chain of its consumers costs, from the
                     kernels' cost models over the tasks submitted so far
    "fifo"           submission order
    ("batch", ...)   tag names (`with o.tags(batch=b):`): lexicographic over the tasks' values
                     of them, ints before strings, a task without the tag after those with it

Ties go to the earlier submission.

    max_concurrent={"batch": n}   the orchestrator holds back a task whose `batch` tag is a new
                     value while n values have tasks not yet completed (a submit-side window:
                     memory in use follows n)
    affinity="batch" tasks with the same value of the tag go to the same worker of their class
                     (the first one that ran the value) when it is free; when it is busy another
                     may take them; RunResult.cross_waits counts consumers that ran on another
                     worker than a producer
    stages={"indexer": {pto.VECTOR: 1}, ...}   tasks tagged stage="indexer" run only on their
                     stage's workers of each class listed: the stages, in order, take
                     consecutive disjoint workers (spec PIPELINE / STAGE(CORES=k)); other tasks
                     run on any worker

A kernel declared with several worker classes (`worker=(pto.CUBE, pto.VECTOR)`) has each task
placed on the class where it would finish earliest (Heft), with or without a schedule.

The simulator (executor="sim"; without schedule= it takes Schedule()) and the thread executor
(executor="parallel"; without schedule= it keeps its FIFO queues) follow a schedule. Costs
come from costs.py: a kernel's model, else the Runtime's history; under the thread executor a
kernel with neither costs the history's typical call (1 when there is no history: a path's
length in tasks), and the simulator refuses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .dtypes import WorkerType
from .errors import PTOError

ORDERS = ("critical_path", "fifo")


@dataclasses.dataclass(frozen=True)
class Schedule:
    order_by: str | tuple[str, ...] = "critical_path"
    max_concurrent: Mapping[str, int] | None = None
    stages: Mapping[str, Mapping[WorkerType, int]] | None = None
    affinity: str | None = None

    def __post_init__(self) -> None:
        affinity = self.affinity
        if affinity is not None and not (isinstance(affinity, str) and affinity.isidentifier()):
            raise PTOError(f"Schedule(affinity={self.affinity!r}): a tag name")
        for tag, limit in (self.max_concurrent or {}).items():
            if not (isinstance(tag, str) and tag.isidentifier()) or isinstance(limit, bool) or \
                    not isinstance(limit, int) or limit < 1:
                raise PTOError(f"Schedule(max_concurrent={self.max_concurrent!r}): a tag name and at least 1 "
                               f"value in flight, not {tag!r}: {limit!r}")
        for stage, counts in (self.stages or {}).items():
            if not isinstance(stage, str) or not isinstance(counts, Mapping) or not all(
                    isinstance(w, WorkerType) and isinstance(k, int) and not isinstance(k, bool) and k >= 1
                    for w, k in counts.items()):
                raise PTOError(f"Schedule(stages=...): stage {stage!r} needs {{worker class: workers >= 1}}, "
                               f"not {counts!r}")
        order = self.order_by
        if isinstance(order, str):
            if order not in ORDERS:
                raise PTOError(f"Schedule(order_by={order!r}): choose {' or '.join(map(repr, ORDERS))}, or "
                               "a tuple of tag names")
        elif not (isinstance(order, tuple) and order and all(isinstance(t, str) and t.isidentifier()
                                                             for t in order)):
            raise PTOError(f"Schedule(order_by={order!r}): a tuple of tag names (identifiers), or "
                           f"{' or '.join(map(repr, ORDERS))}")


class CriticalPaths:
    """The remaining critical path of each submitted, unstarted task: its cost plus the
    costliest chain of its consumers. Started tasks leave, so the graph kept is at most the
    task window; levels are recomputed, in one backward pass (ids are a topological order),
    only after new submissions."""

    def __init__(self):
        self._costs: dict[int, float] = {}
        self._consumers: dict[int, list[int]] = {}
        self._levels: dict[int, float] | None = None
        self.version = 0  # changes with every submission: keys made before it may be stale

    def add(self, task_id: int, cost: float, producers) -> None:
        self._costs[task_id] = cost
        for producer in producers:
            producer = int(producer)
            if producer in self._costs:  # a started producer's path no longer matters
                self._consumers.setdefault(producer, []).append(task_id)
        self._levels = None
        self.version += 1

    def started(self, task_id: int) -> float:
        """Forget a task that starts; its cost."""
        self._consumers.pop(task_id, None)
        if self._levels is not None:
            self._levels.pop(task_id, None)
        return self._costs.pop(task_id)

    def level(self, task_id: int) -> float:
        if self._levels is None:
            levels: dict[int, float] = {}
            for tid in sorted(self._costs, reverse=True):
                after = (levels[c] for c in self._consumers.get(tid, ()) if c in levels)
                levels[tid] = self._costs[tid] + max(after, default=0.0)
            self._levels = levels
        return self._levels[task_id]


def priority(schedule: Schedule, task, paths: CriticalPaths | None) -> tuple:
    """A ready task's place in its class's queue (smaller first; the task id breaks ties)."""
    order = schedule.order_by
    if order == "critical_path":
        return (-paths.level(task.id),)
    if order == "fifo":
        return ()
    return tag_key(task.tags or {}, order)


Ranges = dict[str, dict[WorkerType, range]]  # stage -> worker class -> its workers' indices


def stage_workers(schedule: Schedule, workers: Mapping[WorkerType, int]) -> Ranges:
    """Each stage's workers per class (indices within the class), consecutive and disjoint in
    the stages' order; refused when a class has fewer workers than its stages take."""
    ranges: Ranges = {}
    taken = dict.fromkeys(workers, 0)
    for stage, counts in (schedule.stages or {}).items():
        ranges[stage] = {}
        for worker, count in counts.items():
            ranges[stage][worker] = range(taken[worker], taken[worker] + count)
            taken[worker] += count
    for worker, count in taken.items():
        if count > workers[worker]:
            raise PTOError(f"Schedule(stages=...) takes {count} {worker.name} workers; the runtime has "
                           f"{workers[worker]}")
    return ranges


def allowed(task, ranges: Ranges) -> range | None:
    """The workers of its class a task may run on, under stages; None: any."""
    stage = task.tags.get("stage") if task.tags else None
    return ranges[stage].get(task.worker) if stage in ranges else None


class Placement:
    """Which worker of its class a task runs on (indices within the class): one its stage
    allows, its affinity value's home worker first, else an idle worker that is not the home
    of a value with tasks still to start, else any idle one; and the count of consumers that
    ran on another worker than one of their producers (the cross-worker waits a stream
    executor would pay events for). Where each task ran is kept for two task windows of
    submissions: a producer older than that completed long before (the ring has turned over
    twice since), and a stream waiting for it would not wait, so it is not counted."""

    def __init__(self, schedule: Schedule | None, workers: Mapping[WorkerType, int], counting: bool,
                 window: int):
        self.ranges = stage_workers(schedule, workers) if schedule else {}
        self.affinity = schedule.affinity if schedule else None
        self.homes: dict[tuple[WorkerType, object], int] = {}
        self.unstarted: dict[tuple[WorkerType, object], int] = {}  # tasks of each value still to start
        self.counted_under: dict[int, tuple[WorkerType, object]] = {}  # multi-class tasks: their key
        # cross waits, when counting: each task's producers until it starts, and where each ran
        self.counting = counting
        self.producers: dict[int, tuple[int, ...]] = {}
        self.ran_on: dict[int, tuple[WorkerType, int]] = {}
        self.cross_waits = 0
        self.window = window
        self.newest = 0  # the newest task submitted

    def _value(self, task) -> object:
        return task.tags.get(self.affinity) if self.affinity and task.tags else None

    @property
    def choosy(self) -> bool:
        """Whether a task's worker matters (else any idle one of its class will do)."""
        return bool(self.ranges) or self.affinity is not None

    def choose(self, task, idle, asking: int | None = None) -> int | None:
        """The worker among `idle` (ascending indices of the task's class) for `task`, the
        `asking` one where nothing prefers another; None: it waits for one of its stage's."""
        mask = allowed(task, self.ranges)
        candidates = [i for i in idle if mask is None or i in mask]
        if not candidates:
            return None
        value = self._value(task)
        if value is not None:
            home = self.homes.get((task.worker, value))
            if home in candidates:
                return home
            homes = {i for key, i in self.homes.items() if key[0] == task.worker and self.unstarted.get(key)}
            candidates = [i for i in candidates if i not in homes] or candidates
        return asking if asking in candidates else candidates[0]

    def submitted(self, task, producers) -> None:
        value = self._value(task)
        if value is not None:
            key = (task.worker, value)
            self.unstarted[key] = self.unstarted.get(key, 0) + 1
            if task.classes is not None:  # Heft may run it on another class: remember where it counts
                self.counted_under[task.id] = key
        if self.counting:
            self.producers[task.id] = tuple(int(p) for p in producers)
            self.newest = max(self.newest, task.id)

    def started(self, task, index: int) -> None:
        value = self._value(task)
        if value is not None:
            self.unstarted[self.counted_under.pop(task.id, (task.worker, value))] -= 1
            self.homes.setdefault((task.worker, value), index)  # the first worker that ran it
        if self.counting:
            where = (task.worker, index)
            producers = self.producers.pop(task.id, ())
            self.cross_waits += sum(1 for p in producers if self.ran_on.get(p, where) != where)
            self.ran_on[task.id] = where
            if len(self.ran_on) > 4 * self.window:  # amortised: a pass per 2 windows of starts
                oldest = self.newest - 2 * self.window
                self.ran_on = {i: w for i, w in self.ran_on.items() if i > oldest}


class Heft:
    """Earliest finish time across worker classes (HEFT's choice of processor) for tasks whose
    kernel runs on several (Task.classes). Each class has a backlog: the predicted seconds of
    the tasks queued or running on it, over the workers that may take them. A task goes to the
    class where backlog / workers + its cost there is least (the first listed on a tie) and
    runs as a copy of itself with that `worker`; the recorded task keeps the class it was
    submitted with. Under stages, only the classes its stage lists are considered, over the
    stage's workers. `cost_on(task)` is the executor's cost model for the task's `worker`,
    None where it has none: a task with no cost anywhere goes where the fewest tasks are
    queued or running per worker. Every task counts once `active` (from the start when a
    kernel with several classes exists: kernel.multi_class), so other runs pay nothing."""

    def __init__(self, workers: Mapping[WorkerType, int], cost_on, ranges: Ranges, active: bool):
        self.workers = {w: n for w, n in workers.items() if n > 0}
        self.cost_on = cost_on
        self.ranges = ranges
        self.active = active
        self.backlog = dict.fromkeys(WorkerType, 0.0)
        self.tasks = dict.fromkeys(WorkerType, 0)  # queued or running, per class
        self.queued: dict[int, tuple[WorkerType, float]] = {}  # task id -> where it counts, seconds

    def place(self, task):
        """The task to queue: `task`, or a copy on the class chosen."""
        if task.classes is None:
            if self.active:
                self._count(task.id, task.worker, self.cost_on(task))
            return task
        stage = self.ranges.get(task.tags.get("stage")) if task.tags else None
        classes = [w for w in task.classes if w in self.workers and (not stage or w in stage)]
        if not classes:
            raise PTOError(f"{task.kernel.name} runs on {', '.join(w.name for w in task.classes)}, but "
                           "this run has no workers there" + (" in its stage" if stage else ""))
        options = []
        for worker in classes:
            option = task if worker == task.worker else dataclasses.replace(task, worker=worker)
            workers = len(stage[worker]) if stage else self.workers[worker]
            options.append((option, workers, self.cost_on(option)))
        if any(seconds is not None for _, _, seconds in options):
            finish = [(self.backlog[o.worker] / n + seconds, k) for k, (o, n, seconds) in enumerate(options)
                      if seconds is not None]
        else:
            finish = [(self.tasks[o.worker] / n, k) for k, (o, n, _) in enumerate(options)]
        placed, _, seconds = options[min(finish)[1]]  # the first listed on a tie
        self._count(task.id, placed.worker, seconds)
        return placed

    def seconds(self, task_id: int) -> float:
        """The predicted seconds of a placed task on the class it was placed on."""
        return self.queued[task_id][1]

    def done(self, task_id: int) -> None:
        counted = self.queued.pop(task_id, None)
        if counted is not None:
            worker, seconds = counted
            self.tasks[worker] -= 1
            # An empty class's backlog is 0 exactly: rounding left over would break ties.
            self.backlog[worker] = self.backlog[worker] - seconds if self.tasks[worker] else 0.0

    def _count(self, task_id: int, worker: WorkerType, seconds: float | None) -> None:
        self.tasks[worker] += 1
        self.backlog[worker] += seconds or 0.0
        self.queued[task_id] = (worker, seconds or 0.0)


def mean_cost(task, cost_on) -> float | None:
    """A task's cost for its critical path: with several classes, the mean over those it has a
    cost on (HEFT's upward rank); else its cost."""
    if task.classes is None:
        return cost_on(task)
    known = [s for w in task.classes
             if (s := cost_on(task if w == task.worker else dataclasses.replace(task, worker=w))) is not None]
    return sum(known) / len(known) if known else None


class Windows:
    """max_concurrent: per tag name, the values with tasks not yet completed, and those tasks."""

    def __init__(self, limits: Mapping[str, int]):
        self.limits = dict(limits)
        self.in_flight: dict[str, dict[object, list[int]]] = {tag: {} for tag in limits}

    def admits(self, tags: Mapping[str, object] | None, completed) -> bool:
        """Whether a task with these tags may be submitted now; `completed(task_id)` says which
        tasks have completed."""
        for tag, limit in self.limits.items():
            value = tags.get(tag) if tags else None
            values = self.in_flight[tag]
            if value is None or value in values:
                continue
            for other, ids in list(values.items()):
                ids[:] = [i for i in ids if not completed(i)]  # a completed task is checked no more
                if not ids:
                    del values[other]
            if len(values) >= limit:
                return False
        return True

    def add(self, task_id: int, tags: Mapping[str, object] | None) -> None:
        for tag in self.limits:
            value = tags.get(tag) if tags else None
            if value is not None:
                self.in_flight[tag].setdefault(value, []).append(task_id)


def tag_key(tags: Mapping[str, int | str], names: tuple[str, ...]) -> tuple:
    """The sort key of a task's tags under order_by=names."""
    return tuple((0, tags[name]) if isinstance(tags.get(name), int) else
                 (1, tags[name]) if name in tags else (2, 0) for name in names)


def check_tags(tags: Mapping[str, object]) -> dict[str, int | str]:
    """Tags as `o.tags(**tags)` takes them: identifiers to ints or strings."""
    for name, value in tags.items():
        if not name.isidentifier():
            raise PTOError(f"o.tags: tag name {name!r} is not an identifier (a Schedule could not name it)")
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise PTOError(f"o.tags({name}={value!r}): a tag's value is an int or a str")
    return dict(tags)
