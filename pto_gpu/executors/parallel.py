"""The parallel executor: a pool of CPU threads per worker class (spec 001 §7, spec 003 §4.5).

The orchestration runs on the caller's thread while workers execute. Each worker class has
a ready queue; a worker pops a task, runs its kernel (numpy BLAS and nogil kernels release
the GIL), then completes it in the core, which hands back the consumers it made ready.
With threshold=0 no worker starts until the orchestration ends or a ring fills; with
threshold=N, once N tasks are pending. (Inline tasks ready at submission, a distributed
run's transfers and other ranks' tasks, run at once on the orchestrator's thread.) A ring
that is full while nothing runs or waits to run can never drain: that raises DeadlockError
at once instead of waiting.

Ready queues are FIFO; with a `schedule=` (schedule.py) they are heaps in its order, keyed
when a task is queued and all again when the workers start (the critical path of a task
queued while the orchestration was still submitting its consumers has changed by then). With
stages or affinity, a worker takes the first task in that order for which schedule.Placement
chooses it among the idle workers of its class, and pushing a task wakes all of them (the
chosen one takes it); a busy home worker's tasks go to another.

Tasks that complete when their data arrives (Task.arrives: a distributed run's receives) are
run (posted) like others and then wait in `arrivals`; transfers native code posts (native.py:
sends too, where MPI allows) wait in the native lanes. One idle worker at a time holds the
poll (`_poll`) while one of the process's cores is free: it polls both, yielding then sleeping
(poll_pause), until something completes, a task of its class is queued, nothing waits any
more or every core runs a worker; every worker also polls `arrivals` as it finishes a Python
task (native loops poll their own), and one that goes on to another task (or returns from a
native loop) while nobody polls wakes an idle worker to, if a core is free. Whoever learns of
the data completes the transfer and goes on with what that made ready.
"""

from __future__ import annotations

import collections
import heapq
import os
import sys
import threading
import time
from collections.abc import Callable

from ..costs import CostHistory
from ..dtypes import WorkerType
from ..errors import PTOError, TaskError
from ..jit.context import ArgTables
from ..kernel import Kernel, multi_class
from ..polling import poll_pause, precise_sleeps, process_cores
from ..profile import Profile
from ..schedule import CriticalPaths, Heft, Placement, Schedule, mean_cost, priority
from ..tasks import RINGS, Scheduler, Task
from . import Arrivals, run_kernel
from .native import Instances, NativeLanes, WorkerScratch, budget
from .threads import WorkerThreads

WAIT_SLICE = 0.1  # seconds; waits are sliced so Ctrl-C reaches the caller's thread
DISPATCH_BATCH = 16  # ready-at-submit tasks handed to the workers together


class ParallelExecutor:
    runs_kernels = True

    def __init__(self, scheduler: Scheduler, backend, profile: Profile, workers: dict[WorkerType, int],
                 threads: WorkerThreads, instances: Instances, threshold: int,
                 schedule: Schedule | None = None, costs: CostHistory | None = None,
                 arrivals: Arrivals | None = None):
        self._scheduler = scheduler
        self._backend = backend
        self._profile = profile
        self._tracing = profile.tracing
        self._threshold = threshold
        self._lock = threading.Lock()
        self._schedule = schedule
        self.wants_producers = schedule is not None and (schedule.order_by == "critical_path"
                                                          or schedule.affinity is not None)
        self._paths = CriticalPaths() if self.wants_producers else None
        self._costs = costs or CostHistory()
        # cross waits are counted under affinity, which is what they measure
        self._placement = Placement(schedule, workers, counting=schedule is not None and
                                    schedule.affinity is not None, window=scheduler.state.sizes.task_window)
        self._idle: dict[WorkerType, set[int]] = {w: set() for w in WorkerType}  # workers looking for a task
        # A worker may make a task ready (and queue it) between its entry into the core and
        # `submitted`: such a task is registered when queued (its producers have all
        # completed, so it has none to record) and `submitted` then skips it.
        self._registered: set[int] = set()  # by `submitted`, not started yet
        self._early: set[int] = set()  # registered when queued, before `submitted`
        # a kernel without a model, beside kernels with one: a typical call (1: a path's length in tasks)
        self._typical = self._costs.typical()  # a run adds to its history only at the end
        self._missing_cost = self._typical or 1.0
        self._heft = Heft(workers, _predicted(self._costs, self._typical), self._placement.ranges,
                          active=multi_class())
        # Nothing to register, place or count as a task is queued and started (no schedule's
        # bookkeeping, no kernel of several classes): the two calls return at once (~0.5 µs a
        # task, three times on a hop between ranks).
        self._plain = not (self.wants_producers or self._heft.active or self._placement.counting
                           or self._placement.affinity is not None)
        self._queues = {w: [] if schedule else collections.deque() for w in WorkerType}
        self._wake = {w: threading.Condition(self._lock) for w in WorkerType}
        self._progress = threading.Condition(self._lock)  # the orchestrator waits on it
        self._started = False
        self._stopping = False
        self._workers_running = 0  # `_running`'s
        self._completions = 0
        self._seen_completions = 0
        self._room_wanted = False  # the orchestrator waits for room in a full ring
        self._arrivals = arrivals
        self._awaiting = 0  # tasks run that complete when their data arrives
        self._submit_lane = None  # `_run_at_submission`'s, made at its first task
        self._submit_scratch = scheduler.ready_scratch()
        self._poll_held = False  # `_polling`'s
        # A poll beside workers that keep every core busy takes time from their kernels and
        # cannot start anything sooner; their own polls between tasks keep transfers moving.
        # (A tiled Cholesky on two ranks of a core each: its kernels ran 10-15% slower beside a
        # transfer worker's polls, and the run 6% faster without them.) A device backend's
        # kernels wait for the device, leaving the core to a poll.
        self._cores = process_cores() if backend.name == "cpu" else sys.maxsize
        self._completion_wanted = False  # the orchestrator waits for any completion (a window)
        self._ending = False  # the orchestrator waits for the last completion (finish, abort)
        # A full ring waits for a batch of completions, not one: handing the GIL back and
        # forth per task costs more than the tasks themselves.
        self._room_batch = max(1, scheduler.state.sizes.task_window // 8)
        self._error: BaseException | None = None
        # Tasks ready at submission wait here and reach the queues in batches: waking an idle
        # worker per task costs more than a small task does.
        self._outbox: list[Task] = []
        self._native_outbox: list[int] = []  # the same, of native tasks a Python submit wrote (by id)
        self._instances = instances  # the runtime's (native.py), for the lanes
        window = scheduler.state.sizes.task_window
        self._budgets = {worker: budget(window, count) for worker, count in workers.items()}
        self._native: NativeLanes | None = None  # once a task of native code is submitted (native.py)
        self.native_tasks = 0  # tasks its native workers ran
        self.thread_cpu: dict[WorkerType, float] = {}  # CPU seconds each class's worker threads used
        self._jobs: list[threading.Event] = []  # on the runtime's threads (threads.py): set as workers return
        # A class's workers start with its first task (`_hire_locked`): a one-tile matmul run,
        # whose tasks are all CUBE's, took 1.14-1.21 ms starting and joining six, 0.79-0.82 two.
        self._threads = threads
        self._lanes = {worker: [profile.lane(f"{worker.name}-{i}", (worker,)) for i in range(count)]
                       for worker, count in workers.items()}
        self._hired: set[WorkerType] = set()

    # --- the orchestrator's side ---------------------------------------------------------
    def submitted(self, task: Task, ready: bool, producers) -> None:
        self._raise_failure()
        # Native workers run it: queued by id if ready (unless this thread runs it now), else by
        # its last producer.
        if task.native and not (ready and task.inline):
            if ready:
                self._native_outbox.append(task.id)
        else:
            if self.wants_producers and not (ready and task.inline):  # (else it runs now, unqueued)
                cost = self._cost(task)
                with self._lock:
                    if task.id in self._early:
                        self._early.discard(task.id)
                    else:
                        self._register_locked(task, cost, producers)
                        self._registered.add(task.id)
            if ready:
                if task.inline:
                    self._run_at_submission(task)
                else:
                    self._outbox.append(task)
            if self._tracing:
                self._sample()
        threshold_reached = not self._started and 0 < self._threshold <= self._scheduler.pending
        if len(self._outbox) + len(self._native_outbox) >= DISPATCH_BATCH or threshold_reached:
            with self._lock:
                self._flush_locked()
                if threshold_reached:
                    self._start_locked()

    def _run_at_submission(self, task: Task) -> None:
        """Run a task ready at submission that costs less than queueing it (Task.inline: another
        rank's, a transfer) on the orchestrator's thread, and the inline tasks it makes ready: a
        rank's sends go out, and its receives are posted, while it still submits, not once a
        worker gets to them behind the rank's compute. A schedule does not order them: a
        completion runs those it makes ready at once too (`_dispatch_locked`)."""
        if self._submit_lane is None:
            self._submit_lane = self._profile.lane("orchestrator", (WorkerType.ACCELERATOR,))
        batch = [task]
        while batch:
            task = batch.pop()
            posts = self._native.posts if self._native is not None else 0
            made_ready = self._execute(task, self._submit_lane, self._submit_scratch)
            with self._lock:
                if made_ready is None:  # a worker must poll for its data: started, or woken
                    self._awaiting += not task.native
                    self._hire_locked(task.worker)
                    self._offer_poll_locked()
                else:
                    self._completed_locked(task, made_ready, batch, -1, False)
                    if self._native is not None and self._native.posts != posts:
                        # its completion posted native transfers (NativeLanes.complete): as above
                        self._hire_locked(WorkerType.ACCELERATOR)
                        self._offer_poll_locked()
                self._notify_progress_locked()

    def _flush_locked(self) -> None:
        if self._native_outbox:
            task_ids, self._native_outbox = self._native_outbox, []
            self._native.queue(task_ids)
            if self._started:
                self._wake_native_locked()
        outbox, self._outbox = self._outbox, []  # taken first: none is pushed twice
        for task in outbox:
            try:
                worker = self._push_locked(task)
            except BaseException as error:  # a cost model's: the run fails with it, as from a worker
                self._error = self._error or error
                self._stopping = True
                self._notify_all_locked()
                raise
            if self._started:
                self._notify_worker_locked(worker)

    def native_lanes(self, args: ArgTables, kernels: list[Kernel]) -> NativeLanes | None:
        """Native workers for the tasks of native code the run submits (native.py), where
        nothing needs a record of each task run: no schedule, trace, cost measurements or
        validation checks, and the CPU backend. (HEFT, which places the tasks of kernels with
        several classes, then weighs the backlog of Python-run tasks only.)

        Called at the run's first compiled call or native submit: from then on core entries
        take the core's lock, lanes or not, since a compiled body (generated ones are `nogil`)
        enters the core beside the workers."""
        self._scheduler.state.head["locking"] = 1
        if (self._native is None and self._schedule is None and not self._tracing
                and not self._profile.measuring and not self._scheduler.validate
                and self._backend.name == "cpu"):
            lanes = NativeLanes(self._scheduler, args, kernels, self._instances, self._cores)
            with self._lock:
                self._native = lanes
                self._count_busy_locked()
                if self._arrivals is not None and self._arrivals.mpi is not None:
                    lanes.use_mpi(*self._arrivals.mpi)
                for worker in WorkerType:
                    if worker not in self._hired:
                        # Counted as asleep until started: a native loop that makes the class's
                        # tasks ready then returns soon, and Python starts its workers.
                        lanes.sleeping(worker, 1)
        return self._native

    # Both change under the lock, and each change tells the native lanes how many workers take
    # a core (`_count_busy_locked`).
    @property
    def _running(self) -> int:
        """Workers running a task, a native loop or the poll."""
        return self._workers_running

    @_running.setter
    def _running(self, count: int) -> None:
        self._workers_running = count
        self._count_busy_locked()

    @property
    def _polling(self) -> bool:
        """A worker holds the poll for arrivals."""
        return self._poll_held

    @_polling.setter
    def _polling(self, held: bool) -> None:
        self._poll_held = held
        self._count_busy_locked()

    def _count_busy_locked(self) -> None:
        """Tell the native lanes how many workers take a core: the running ones, but for one
        that holds the poll, which mostly sleeps (poll_pause). (The orchestrator, in a compiled
        body, is left out: it submits for a short while, then waits.)"""
        if self._native is not None:
            self._native.busy(self._workers_running - self._poll_held)

    @property
    def native_transfers(self) -> int:
        """A distributed run's transfers native code posted (native.py)."""
        return 0 if self._native is None else self._native.posts

    def handed_over(self) -> None:
        """A compiled flush handed its tasks over (the ready native ones queued by
        NativeLanes.admit, the others through `submitted`): queue them all and wake the
        workers now, not once a batch has gathered; the flush is the batch."""
        self._raise_failure()
        with self._lock:
            if self._started:
                self._flush_locked()
                if self._native is not None:
                    self._wake_native_locked()
            elif 0 < self._threshold <= self._scheduler.pending:
                self._flush_locked()
                self._start_locked()

    def _wake_native_locked(self) -> None:
        if not self._native.any_work():
            return
        for worker in WorkerType:
            if self._native.has_work(worker):
                self._hire_locked(worker)
                if self._idle[worker]:
                    self._wake[worker].notify_all()

    def _hire_locked(self, worker: WorkerType) -> None:
        """Start class `worker`'s workers, if they have not started: it has a task. (Every
        path that queues a task comes here, or to `_start_locked`, before anyone waits for it.)"""
        if worker in self._hired or self._stopping:
            return
        self._hired.add(worker)
        if self._native is not None:
            self._native.sleeping(worker, -1)  # counted as asleep until now (native_lanes)
        try:
            for i, lane in enumerate(self._lanes.get(worker, ())):
                job = self._threads.start(f"pto-{worker.name}-{i}", self._work, (worker, i, lane))
                self._jobs.append(job)
        except BaseException as error:  # no thread: the run fails (nothing would take the class's tasks)
            self._error = self._error or error
            self._stopping = True
            self._notify_all_locked()
            raise

    @property
    def cross_waits(self) -> int | None:
        return self._placement.cross_waits if self._placement.counting else None

    def _notify_worker_locked(self, worker: WorkerType) -> None:
        if self._placement.choosy:
            self._wake[worker].notify_all()  # only some of them may run it
        else:
            self._wake[worker].notify()

    def _cost(self, task: Task) -> float:
        if self._paths is None:
            return 0.0
        return mean_cost(task, lambda t: self._costs.cost(t, missing=self._missing_cost))

    def _register_locked(self, task: Task, cost: float, producers) -> None:
        if self._paths is not None:
            self._paths.add(task.id, cost, producers)
        if task.runs_here:  # (another rank's task is here to be weighed: no worker of ours runs it)
            self._placement.submitted(task, producers)

    def _admit_locked(self, task: Task) -> Task:
        """A ready task, registered if `submitted` has not been called for it yet, placed on
        the class Heft chooses (a copy, if another)."""
        if self._plain and task.classes is None:
            return task
        if self.wants_producers and task.id not in self._registered:
            self._register_locked(task, self._cost(task), ())
            self._early.add(task.id)
        return self._heft.place(task) if task.runs_here else task

    def _push_locked(self, task: Task) -> WorkerType:
        """Queue a ready task (on the class Heft places it on); the class."""
        return self._queue_locked(self._admit_locked(task))

    def _queue_locked(self, task: Task) -> WorkerType:
        """Queue an admitted task; its class."""
        if self._schedule is None:
            self._queues[task.worker].append(task)
        else:
            key = priority(self._schedule, task, self._paths)
            heapq.heappush(self._queues[task.worker], (key, task.id, task))
        self._hire_locked(task.worker)
        return task.worker

    def _pop_locked(self, worker: WorkerType, index: int) -> Task | None:
        """The next task for worker `index` of class `worker`, or None."""
        queue = self._queues[worker]
        if self._schedule is None:
            return queue.popleft() if queue else None
        if not self._placement.choosy:
            task = heapq.heappop(queue)[2] if queue else None
        else:
            task, waiting, idle = None, [], sorted(self._idle[worker])
            while queue and task is None:
                entry = heapq.heappop(queue)
                if self._placement.choose(entry[2], idle, asking=index) == index:
                    task = entry[2]
                else:
                    waiting.append(entry)
            for entry in waiting:
                heapq.heappush(queue, entry)
            if waiting:
                self._wake[worker].notify_all()  # the tasks passed over are other idle workers' to take
        if task is not None:
            self._starting_locked(task, index)
        return task

    def _starting_locked(self, task: Task, index: int) -> None:
        if self._plain:  # (`_registered` holds tasks only when producers are wanted)
            return
        self._registered.discard(task.id)
        if task.runs_here:
            self._placement.started(task, index)
        if self._paths is not None:
            self._paths.started(task.id)

    def wait_until(self, done: Callable[[], bool]) -> None:
        """Run tasks until `done()` (a max_concurrent window admits), judged under the lock, so
        no completion slips between it and the check that something still runs."""
        with self._lock:
            self._flush_locked()
            self._start_locked()
            self._completion_wanted = True
            try:
                while not done() and self._error is None:
                    if self._idle_locked():
                        raise PTOError("a max_concurrent window waits for tasks to complete, but none runs")
                    self._progress.wait(WAIT_SLICE)
            finally:
                self._completion_wanted = False
        self._raise_failure()

    def make_room(self, status: int, unfreed) -> None:
        started = time.perf_counter()
        with self._lock:
            self._flush_locked()
            self._start_locked()
            self._room_wanted = True
            try:
                while self._completions - self._seen_completions < self._room_batch and self._error is None:
                    if self._idle_locked():
                        if self._completions == self._seen_completions:
                            raise self._scheduler.deadlock(status, unfreed())
                        break  # everything drained: whatever room there will be is there now
                    self._progress.wait(WAIT_SLICE)
            finally:
                self._room_wanted = False
                self._profile.stalled(RINGS[status].key, time.perf_counter() - started)
            self._seen_completions = self._completions
        self._raise_failure()

    def finish(self) -> None:
        with self._lock:
            self._flush_locked()
            self._start_locked()
            self._ending = True
            while self._scheduler.pending and self._error is None:
                if self._idle_locked():
                    raise PTOError(f"{self._scheduler.pending} tasks can never become ready")
                self._progress.wait(WAIT_SLICE)
        # A failure is raised before the workers are joined (abort joins them): in a
        # distributed run a worker may wait on a message that comes only once this rank has
        # told the others it failed, which the runtime does when this raises.
        self._raise_failure()
        self._shutdown()

    def abort(self) -> None:
        """The run is unwinding: run what was submitted, as the serial executor already has
        (docs/ERRORS.md), unless a task failed; then stop the workers, and cancel the transfers
        native code left posted (Arrivals.cancel)."""
        try:
            with self._lock:
                self._flush_locked()
                self._start_locked()
                self._ending = True
                while self._scheduler.pending and self._error is None and not self._idle_locked():
                    self._progress.wait(WAIT_SLICE)
        finally:
            self._shutdown()
            if self._native is not None and self._native.posted:
                self._arrivals.cancel(*self._native.posted_requests())

    # --- the workers' side ---------------------------------------------------------------
    def _work(self, worker: WorkerType, index: int, lane) -> None:
        native_scratch: list[WorkerScratch] = []  # made at this worker's first native loop
        started = time.thread_time()  # (its native loops run on this thread too)
        try:
            self._serve(worker, index, lane, native_scratch)
        finally:
            for made in native_scratch:
                # Counted once, as the worker leaves, not at each return from a native loop: the
                # 2048² panel matmul's kernels leave this thread's Python objects out of cache,
                # and that tally alone took ~70 us of every return's ~100.
                self._native.tally(made, lane)
            spent = time.thread_time() - started
            with self._lock:
                self.thread_cpu[worker] = self.thread_cpu.get(worker, 0.0) + spent

    def _serve(self, worker: WorkerType, index: int, lane, native_scratch: list[WorkerScratch]) -> None:
        """Take tasks until the run stops or this worker fails it."""
        wake, idle = self._wake[worker], self._idle[worker]
        scratch = self._scheduler.ready_scratch()
        while True:
            polls = False
            with self._lock:
                idle.add(index)
                while True:
                    if self._stopping:
                        return
                    task = self._pop_locked(worker, index) if self._started else None
                    if task is not None:
                        break
                    if self._started and self._native is not None and self._native.has_work(worker):
                        break
                    if self._poll_wanted_locked():
                        self._polling = polls = True  # this worker takes the poll
                        break
                    # Placement may pass a task to another idle worker: it was woken when the
                    # task was queued, and looks again now and then lest a wakeup be missed.
                    native = self._native
                    if native is not None:
                        native.sleeping(worker, 1)
                    wake.wait(WAIT_SLICE if self._placement.choosy else None)
                    if native is not None:
                        native.sleeping(worker, -1)
                idle.discard(index)
                self._running += 1
                if self._tracing:
                    self._sample()
            try:
                if task is not None:
                    self._run([task], worker, index, lane, scratch)
                elif polls:
                    self._poll(worker, index, lane, scratch)
                else:
                    if not native_scratch:
                        native_scratch.append(self._native.scratch(scratch))
                    inline, arrived = self._drain(worker, index, native_scratch[0])
                    if inline:
                        self._run(inline, worker, index, lane, scratch, arrived)
            except BaseException as error:  # a kernel's TaskError, validation mode's finding, a cost model's
                with self._lock:
                    self._error = self._error or error
                    self._running -= 1
                    self._stopping = True
                    self._notify_all_locked()
                return

    def _drain(self, worker: WorkerType, index: int, scratch: WorkerScratch) -> tuple[list[Task], set[int]]:
        """Run ready native tasks until there are none for this class or Python must look; the
        tasks this thread runs next (`_run`, still counted as running), and those of them that
        have run and only complete: the inline tasks (Task.inline: a distributed run's
        transfers) the loops handed over, as after a Python task (queued, they cost a hand-off
        between threads per message), and, while nobody polls, the receives that have arrived
        (a loop tests only the lanes' own transfers; beside loops that keep every core busy,
        nobody else would)."""
        completed = self._native.drain(worker, scratch, self._budgets[worker])
        failed = self._native.failed()
        came = self._arrivals.arrived() if self._awaiting and not self._polling else []
        with self._lock:
            self._completions += completed
            self.native_tasks += completed - int(scratch.transfers[0])
            if failed is not None:  # _work counts this worker out and stops the run
                raise self._native.failure(failed)
            inline = self._settle_locked(index, staying=bool(came))
            inline += map(self._scheduler.task, came)
            if not inline and self._awaiting:
                self._offer_poll_locked()
        return inline, set(came)

    def _settle_locked(self, index: int, staying: bool = False,
                       taking: WorkerType | None = None) -> list[Task]:
        """After native code completed tasks on this thread (a loop, a poll): take the hand-offs
        and wake whoever has work now; the inline hand-offs, which this thread runs next (still
        counted as running, as it is when `staying`: else it no longer is), with one of class
        `taking`, this thread's, if that class has none queued (`_dispatch_locked`)."""
        inline = self._take_handoffs_locked(index, taking)
        if not inline and not staying:
            self._running -= 1  # after the hand-offs: a failure there is counted by _work
        self._wake_native_locked()
        if self._tracing:
            self._sample()
        self._notify_progress_locked()
        return inline

    def _take_handoffs_locked(self, index: int, taking: WorkerType | None = None) -> list[Task]:
        """Queue for Python workers the tasks native loops handed over (native.py), but for the
        inline ones, returned to run on this thread (`_dispatch_locked`)."""
        if not self._native.has_handoffs():
            return []
        return self._dispatch_locked(map(self._scheduler.task, self._native.handoffs()), index, taking)

    def _dispatch_locked(self, tasks, index: int, taking: WorkerType | None = None) -> list[Task]:
        """Queue ready tasks for their classes' workers, but for the inline ones (Task.inline),
        started on this thread and returned as a stack for `_run`, which pops from the end: last
        first, so that they run in the order given, as queues run theirs. `taking`: this
        thread's class, free to run a task (a poll that saw a receive complete): the first task
        of that class, if none is queued for it and no placement chooses among its workers, is
        started here too, not queued for this thread to pop after a round of the lock (on a
        hop between ranks, ~1.5 µs of the reader's start)."""
        inline = []
        for task in tasks:
            task = self._admit_locked(task)  # a schedule's cost model may raise here
            if task.inline:
                inline.append(task)
                self._starting_locked(task, index)
            elif task.worker is taking and not self._queues[taking] and not self._placement.choosy:
                inline.append(task)
                self._starting_locked(task, index)
                taking = None
            else:
                self._notify_worker_locked(self._queue_locked(task))
        inline.reverse()
        return inline

    def _notify_progress_locked(self) -> None:
        if self._completion_wanted or (self._ending and not self._scheduler.pending) or (
                self._room_wanted and (self._completions - self._seen_completions >= self._room_batch
                                       or self._idle_locked())):
            self._progress.notify()

    def _run(self, batch: list[Task], worker: WorkerType, index: int, lane, scratch,
             arrived: set[int] | None = None) -> None:
        """Run the tasks of `batch` and complete each, then the inline tasks (Task.inline) that
        makes ready, on this thread: handing those to a worker would cost more than they do;
        then the next queued task of its class, popped under the lock its completion took
        (`_next_locked`). Tasks in `arrived` have run and their data has come: they complete
        only. A task that completes when its data arrives is left to wait for it (`_awaiting`),
        and before each look for the next task, this thread polls for arrivals. The thread
        counts as running until the last of them has completed."""
        arrived = arrived or set()
        while batch:
            task = batch.pop()
            if task.id in arrived:
                made_ready = self._complete(task, scratch)
            else:
                made_ready = self._execute(task, lane, scratch)
            # Before the next task, a look for arrivals, if any are awaited; not before inline
            # tasks it made ready, which this thread runs next (a send the Python way, which the
            # other rank waits for: an MPI_Testsome before it added 1.2 µs to every hop between
            # ranks; a native send its completion has posted already).
            looks = not batch and self._waiting() and not (
                made_ready and any(ready.inline for ready in made_ready))
            # (`_awaiting` still counts an arrived task until the lock below)
            came = self._arrivals.arrived() if looks and self._awaiting > (task.id in arrived) else ()
            polled = 0
            if looks and self._native is not None and self._native.posted:
                polled = self._poll_native(scratch)
            with self._lock:
                if made_ready is None:
                    self._awaiting += not task.native  # else the native lanes hold it
                else:
                    self._completed_locked(task, made_ready, batch, index, task.id in arrived)
                for task_id in came:
                    batch.append(self._scheduler.task(task_id))
                    arrived.add(task_id)
                if polled:
                    self._completions += polled
                    batch += self._take_handoffs_locked(index)
                if not batch:
                    following = self._next_locked(worker, index)
                    if following is None:
                        self._running -= 1
                    else:
                        batch.append(following)
                        self._offer_poll_locked()  # this thread is busy for a while
                if self._native is not None:
                    self._wake_native_locked()
                if self._tracing:
                    self._sample()
                self._notify_progress_locked()

    def _execute(self, task: Task, lane, scratch) -> list[Task] | None:
        """Run a task and complete it; the tasks that made ready, or None if it completes when its
        data arrives (in `arrivals`, or in the native lanes if native: a transfer they post)."""
        if task.native and task.kernel.native.transfer:
            if error := self._native.post(task.id):
                raise TaskError.of(task, RuntimeError(f"MPI could not post the transfer (error {error})"))
            return None
        self._scheduler.start(task.id)
        run_kernel(self._backend, task, lane)
        return None if task.arrives and task.runs_here else self._complete(task, scratch)

    def _complete(self, task: Task, scratch) -> list[Task]:
        """Complete a task that has run in the core; the tasks that made ready."""
        if self._native is None:
            return self._scheduler.complete(task.id, scratch)
        self._native.learn(task)  # native consumers made ready go straight to their rings
        return self._scheduler.complete(task.id, scratch, self._native.complete)

    def _completed_locked(self, task: Task, made_ready: list[Task], batch: list[Task], index: int,
                          arrived: bool) -> None:
        """`task` has completed: the inline tasks it made ready join `batch`, the others queue."""
        self._heft.done(task.id)
        batch += self._dispatch_locked(made_ready, index)
        self._completions += 1
        if arrived:
            self._awaiting -= 1

    def _poll(self, worker: WorkerType, index: int, lane, scratch) -> None:
        """Hold the poll for arrivals (taken in `_serve`) until data comes, a task of this class
        is queued, nothing waits any more or the run stops; then complete what came, and go on
        as after a task."""
        queue = self._queues[worker]
        started = time.perf_counter()
        precise_sleeps()
        polled = 0
        try:
            # (`_awaiting` counts the Python way's receives; read without the lock, a hint)
            while not (came := self._arrivals.arrived() if self._awaiting else ()):
                native = self._native  # (made at a run's first native task: read again each time)
                if native is not None and native.posted and (polled := self._poll_native(scratch)):
                    break
                # (`_running` counts this worker: above the cores, others keep them all busy)
                if queue or self._stopping or not self._waiting() or self._running > self._cores or (
                        native is not None and native.has_work(worker)):
                    break
                pause = poll_pause(time.perf_counter() - started)
                if not pause:
                    os.sched_yield()
                    continue
                if native is not None and native.posted:
                    # A failure notice (`arrived` tests with receives of its own), before each
                    # sleep, not at each spin: its ~2 µs (mpi4py) made the spin slower to see data.
                    self._arrivals.check()
                with self._lock:  # a task queued for this class wakes it (`_notify_worker_locked`)
                    if not (queue or self._stopping):
                        self._wake[worker].wait(pause)
        finally:
            with self._lock:
                self._polling = False
        if polled:
            with self._lock:
                self._completions += polled
                inline = self._settle_locked(index, taking=None if self._stopping else worker)
                if any(not task.inline for task in inline):  # a reader taken: busy for a while
                    self._offer_poll_locked()
            if inline:
                self._run(inline, worker, index, lane, scratch)
        elif came:
            self._run([self._scheduler.task(task_id) for task_id in came], worker, index, lane, scratch,
                      set(came))
        else:
            with self._lock:
                self._running -= 1
                self._offer_poll_locked()
                self._notify_progress_locked()

    def _poll_native(self, scratch) -> int:
        """Complete the transfers native code posted that MPI has finished (native.py); how many."""
        if (polled := self._native.poll(scratch)) < 0:
            failed = self._native.failed()
            if failed is None:  # (nothing was posted to blame)
                raise PTOError("MPI failed to test the transfers native workers posted")
            raise self._native.failure(failed)
        return polled

    def _waiting(self) -> bool:
        """Whether tasks wait for data, in `arrivals` or posted by native code (the count native
        loops change, read without the core's lock, is a hint: a poll settles it)."""
        return bool(self._awaiting or (self._native is not None and self._native.posted))

    def _poll_wanted_locked(self) -> bool:
        """Tasks wait for data, no worker polls and a core is free for one to."""
        return self._started and self._waiting() and not self._polling and self._running < self._cores

    def _offer_poll_locked(self) -> None:
        """Wake an idle worker to take the poll, if one is wanted. (None takes it before the
        start, which wakes them all: a wake-up then is a switch of threads for nothing, which
        cost a compiled matmul's orchestrator ~100 µs a transfer.)"""
        if self._poll_wanted_locked():
            for worker, idle in self._idle.items():
                if idle:
                    self._wake[worker].notify_all()
                    return

    def _next_locked(self, worker: WorkerType, index: int) -> Task | None:
        """The next queued task for a worker that has just completed one, or None when it should
        go back to `_work` (stopping; a placement that chooses among idle workers, which this
        one is not; native tasks of its class waiting): one lock round per task instead of two,
        which is most of what two Python workers of one class contend for."""
        if self._stopping or self._placement.choosy or (self._native is not None
                                                         and self._native.has_work(worker)):
            return None
        return self._pop_locked(worker, index)

    # --- helpers -------------------------------------------------------------------------
    def _start_locked(self) -> None:
        if not self._started:
            self._started = True
            if self._schedule is not None:  # keyed again, by what has been submitted by now
                for queue in self._queues.values():
                    queue[:] = sorted((priority(self._schedule, task, self._paths), task.id, task)
                                      for _, _, task in queue)
            if self._native is not None:  # native tasks admitted before the start: their classes' workers
                self._wake_native_locked()
            self._notify_all_locked()

    def _sample(self) -> None:
        # The orchestrator samples without the lock, so its ready count may be off by a task or two.
        ready = len(self._outbox) + sum(len(queue) for queue in self._queues.values())
        self._profile.sample(self._scheduler, ready)

    def _idle_locked(self) -> bool:
        """Nothing runs and nothing waits to run: no completion can come any more. (Only running
        workers and the orchestrator, which asks this, push on the native rings.)"""
        return self._running == 0 and self._awaiting == 0 and not any(self._queues.values()) and (
            self._native is None or not (self._native.any_work()
                                         or self._native.has_handoffs() or self._native.posted))

    def _notify_all_locked(self) -> None:
        for wake in self._wake.values():
            wake.notify_all()
        self._progress.notify_all()

    def _shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._notify_all_locked()
        for returned in self._jobs:
            returned.wait()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error


def _predicted(costs, typical: float | None) -> Callable[[Task], float | None]:
    """What Heft weighs: a task's predicted seconds, the history's typical call where it has no
    model, None without a history (not 1, the critical path's count of tasks). Not a method of
    the executor, which keeps its Heft: the two would be a cycle that only a garbage collection
    frees, with the backend and its device memory (a collection is held off while a persistent
    kernel runs: executors/persistent.py)."""

    def seconds(task: Task) -> float | None:
        known = costs.known(task)
        return known if known is not None else typical

    return seconds
