"""The persistent executor (executor="persistent"): one kernel whose blocks run the run's
tasks, taking them from queues in device memory, while the host keeps submitting (spec 001's
scheduler and workers, on the GPU; docs/DESIGN.md, "GPU").

The host's side stays the other executors': the orchestrator, the TensorMap and the rings
decide dependencies and memory. Each submitted task becomes a record the blocks read (its
kernel instance's index in the kernel's module, its argument words) in a slot of the
scheduler's state (backends/persistent_host.py), published with the tickets of its producers
still in flight; the blocks wire it to them, run it when they have finished, and say so in
its slot, which the host polls: tasks retire (complete in the core, which reclaims their
ring and heap space) in submission order as they are seen done, as on the stream executor.
That work per task is nogil numba (executors/persistent_issue.py): a compiled orchestration's
flushed log is published whole from the argument tables, and so is a Python submit whose
arguments the orchestrator wrote there, once its instance is learnt; an instance's first task
goes the Python way (its code generated and checked), and so do waits.

The kernel's module holds the generated code of the instances it may run. It is launched at
the first wait (a slot or the ring of producers' words to free, a full task ring, the end of
the run), over the instances seen so far; a task of an instance not in it ends the kernel (it
finishes what it has) and the next one is launched over all the instances seen. A backend's
instances carry over to its next runs, so a run like an earlier one launches one kernel.

A task runs as the pieces its stream launch would have had blocks, on one block or several
(pto_persistent_kernel.cuh). Each task's slot says when a block took it and when its last piece
had run (the device's clock), and which block ran that: trace= draws the tasks on a lane per
block.

Every wait is bounded: a kernel whose blocks make no progress for `patience` seconds while a
task is unfinished is stopped, and the run fails with a DeadlockError naming the tasks left;
a kernel that faults fails the run with the task that was running named.

While the kernel runs it holds the GPU until the run ends, its idle blocks waiting for the
host: an orchestration must not wait for the device meanwhile (a synchronize, a copy back to
the host, freeing device memory), which would wait for the kernel's end. Nor does Python's
garbage collection run then (_COLLECTIONS): a collection may free another backend's device
memory or cuBLAS handle, calls that wait for every kernel on the device, this one too.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import weakref

import numpy as np

from ..backends.cuda_abi import MAX_BLOCKS
from ..backends.launches import MAX_WORDS
from ..backends.persistent_host import NO_WORK, Abort, Shown, Sizes, State
from ..backends.persistent_module import NAME, ModuleInstance, check, check_shared, shared_bytes, write
from ..dtypes import WorkerType
from ..errors import DeadlockError, InvariantError, PTOError, TaskError
from ..first_calls import first_calls, preparing
from ..jit.context import MAX_SCALARS, ArgTables
from ..kernel import registered
from ..native_call import compiled_entry
from ..polling import pause
from ..profile import Lane, Profile
from ..tasks import RINGS, Scheduler, Task
from .instance_keys import cuda_kernel_info
from .persistent_issue import (
    FLIGHT,
    NEEDS_PYTHON,
    NEEDS_WAIT,
    REFUSED,
    RETIRED,
    RUN,
    SLOT_TAKEN,
    TICKET,
    Learnt,
    Tables,
    gather,
    learn,
    publish,
    publish_logged,
    retire_done,
    slot_free,
    submit_python,
)

PATIENCE = 10.0  # seconds without progress, with a task unfinished, before a wait gives up
KERNEL_PARAMS = 2  # pto_persistent's (pto_persistent_kernel.cuh)
WORDS_PER_SLOT = 16  # producers' words in the ring per task slot
BOARD = 64  # entries of the kernel's board of tasks whose pieces blocks share (pto_persistent_kernel.cuh)


class _Collections:
    """Python's cyclic garbage collection, held off while any persistent kernel runs: it may
    free device memory or a cuBLAS handle (cudaFree, cublasDestroy), which waits for every
    kernel on the device, a persistent one too, whose idle blocks wait for the very thread in
    that call: a deadlock no patience sees (a review's find, 2026-11-30)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kernels = 0  # running
        self._was_enabled = False  # when the first of them started

    def hold(self) -> None:
        with self._lock:
            if self._kernels == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._kernels += 1

    def release(self) -> None:
        with self._lock:
            self._kernels -= 1
            if self._kernels == 0 and self._was_enabled:
                gc.enable()


_COLLECTIONS = _Collections()
_NO_EDGES = np.zeros((0, 2), np.int64)
# The states of kernels stopped before they were seen to end (held from starting): they may
# still read them, so they are kept for the process.
_ABANDONED: list[State] = []
_LEARNT: weakref.WeakKeyDictionary[object, Learnt] = weakref.WeakKeyDictionary()  # by backend


class PersistentExecutor:
    runs_kernels = True
    wants_producers = True
    # The lanes protocol of compiled sessions (jit/host.py): this executor is its own lanes.
    takes_edges = True

    def __init__(self, scheduler: Scheduler, backend, profile: Profile):
        """On a CUDA backend (Runtime refuses the executor on the CPU's)."""
        self._scheduler = scheduler
        self._backend = backend
        self._device = backend.device
        self._profile = profile
        state = scheduler.state
        self._core = (state.header, state.tasks, state.buffers, state.deps)
        # A row a retired task, to the lanes: each task's when tracing or measuring, else counts.
        self._recording = profile.tracing or profile.measuring
        self._lanes: dict[int, Lane] = {}  # per block that ran tasks
        self._ran: list[tuple] = []  # tracing: the kernel's retired tasks, to draw at its end
        self._tallies: dict[tuple[int, int, int], list] = {}  # (block, kernel, worker): [tasks, ns]
        self._patience = PATIENCE
        window = state.sizes.task_window
        slots = 1 << max(1, (window - 1).bit_length())
        self._slots = slots
        self._run = np.zeros(1, RUN)
        self._run[0] = 0
        for field in ("launched", "gathered"):
            self._run[field] = -1
        self._run["ring"] = slots * WORDS_PER_SLOT
        self._state: State | None = None
        self._t: Tables | None = None
        self._stream = backend.stream(("persistent", 0))
        self._ended = backend.take_event()  # recorded behind the kernel
        self._kernel_info = cuda_kernel_info(list(registered()), _no_library)
        learnt = _LEARNT.get(backend)
        if learnt is None:
            learnt = _LEARNT[backend] = Learnt.allocate()
        self._learnt = learnt
        self._args: ArgTables | None = None
        self._edges = _NO_EDGES  # the flush's edge log (`edges`)
        # the backend's instances' index in their list, by source and element type (_key)
        self._index: dict | None = None
        # Calls from Python by their compiled entries: numba's dispatch types each of the tables
        # at every call (µs)
        self._submit_python = self._retire_done = None
        self._one = np.zeros(1, np.int64)  # a Python submit without producers
        self._retired_some = False  # tasks retired since make_room last looked
        self.kernels_launched = 0

    @property
    def kernel_ids(self) -> frozenset[int]:
        """The kernels whose Python submits may be published from the argument tables: those
        with CUDA code (which the orchestrator then writes there); none in a validating run."""
        if self._scheduler.validate:
            return frozenset()
        return frozenset(int(k) for k in np.flatnonzero(self._kernel_info["native"]))

    @property
    def native_tasks(self) -> int:
        """Tasks published from the argument tables (compiled orchestrations' and Python
        submits') without Python making their record."""
        return int(self._run[0]["native"])

    # --- compiled sessions (jit/host.py) ------------------------------------------------
    def native_lanes(self, args: ArgTables, kernels: list) -> PersistentExecutor | None:
        """This executor, over the run's argument tables; None in a validating run, which checks
        the core after each completion: its tasks go the Python way, and retire one by one."""
        if self._scheduler.validate:
            return None
        self._args = args
        self._kernel_info = cuda_kernel_info(kernels, _no_library)
        if self._t is not None:
            self._t = self._t._replace(kernel_info=self._kernel_info)
        return self

    def edges(self, edge_log: np.ndarray) -> None:
        """A flush's edge log, which the next `admit` reads."""
        self._edges = edge_log
        self._run[0]["edge"] = 0

    def admit(self, log: np.ndarray, logged: int) -> int:
        """Publish a flushed log's tasks, in order; none is left for the session to submit."""
        t = self._tables()
        run = self._run[0]
        i = 0
        while i < logged:
            i, status = publish_logged(t, *self._core, self._args, log, i, logged, self._edges)
            if status == NEEDS_WAIT:
                self._wait_done(int(run["wait"]), "room for its producers' words")
            elif status == NEEDS_PYTHON:
                self._publish_python(self._scheduler.task(int(log[i, 0])))
                i += 1
            elif status:
                self._refused(self._scheduler.task(int(log[i, 0])), status)
        self._carry(log, logged)
        self._retire()
        return 0

    def _carry(self, log: np.ndarray, logged: int) -> None:
        """Keep the edges of consumers the flush did not bring (a later one does) for `admit`."""
        t = self._t
        run = self._run[0]
        last = int(log[logged - 1, 0]) if logged else -1
        old = t.carried[:int(run["carried"])]
        if not len(old) and run["edge"] == len(self._edges):
            self._edges = _NO_EDGES
            return
        kept = np.concatenate([old[old[:, 1] > last], self._edges[int(run["edge"]):]])
        if len(kept) > len(t.carried):
            self._t = t._replace(carried=np.zeros((2 * len(kept), 2), np.int64))
        self._t.carried[:len(kept)] = kept
        run["carried"] = len(kept)
        self._edges = _NO_EDGES
        run["edge"] = 0

    # --- the orchestrator's side ---------------------------------------------------------
    def submitted(self, task: Task, ready: bool, producers) -> None:
        t = self._tables()
        producers = np.ascontiguousarray(producers, np.int64) if len(producers) else self._one[:0]
        if task.native:  # its arguments are in the tables
            if self._submit_python is None:
                self._submit_python = compiled_entry(submit_python, t, *self._core, self._args, 0, self._one)
            status = self._submit_python(t, *self._core, self._args, task.id, producers)
        else:
            gather(t, task.id, producers)
            status = NEEDS_PYTHON
        while status == NEEDS_WAIT:
            self._wait_done(int(self._run[0]["wait"]), "room for its producers' words")
            status = self._submit_python(t, *self._core, self._args, task.id, producers)
        if status == NEEDS_PYTHON:
            self._publish_python(task)
        elif status:
            self._refused(task, status)
        run = self._run[0]
        self._profile.sample(self._scheduler, int(run["next"] - run["head"]))
        self._retire()

    def make_room(self, status: int, unfreed) -> None:
        """Wait for a batch of the oldest tasks, not one (streams.py's make_room says why)."""
        run = self._run[0]
        retired, self._retired_some = self._retired_some, False
        if run["head"] == run["next"]:
            if retired:  # since the ring was seen full (a compiled session's flush retires too)
                return
            raise self._scheduler.deadlock(status, unfreed())
        started = time.perf_counter()
        batch = max(1, self._slots // 8)
        self._retire_until(min(int(run["next"]), int(run["head"]) + batch), "room in a ring")
        self._profile.stalled(RINGS[status].key, time.perf_counter() - started)

    def finish(self) -> None:
        if self._state is not None:
            self._end_kernel()
            self._backend.persistent_states[self._state.sizes] = self._state
        self._report()
        self._backend.release(self._ended)

    def abort(self) -> None:
        """Run what was published, as every executor runs the tasks submitted before a raise
        (launching the kernel if it has not been: a run that raised before its first wait),
        unless the kernel was stopped (stuck) or that fails (a task faulted; the error being
        raised is the one to report). Then, or where it failed, stop the kernel and wait for it
        to end (the next run's buffers may take this run's heap space), for `patience` at most:
        a kernel that has not started by then (its stream held) stops at its first look at the
        state, which is kept for it. Tasks left are dropped unretired."""
        try:
            if self._state is not None and self._state.aborted() == Abort.RUNNING:
                with contextlib.suppress(Exception):
                    self._end_kernel()
                    self._backend.persistent_states[self._state.sizes] = self._state
        finally:  # an interrupt in that wait too: the kernel must not be left running
            self._stop_kernel()

    def _stop_kernel(self) -> None:
        run = self._run[0]
        try:
            if run["launched"] >= 0:
                self._state.stop(Abort.FAULTED)
                try:
                    self._backend.synchronize(self._ended, self._patience)
                    self._backend.persistent_states[self._state.sizes] = self._state
                except DeadlockError:  # not ended in time
                    _ABANDONED.append(self._state)
                except Exception:  # a fault's: the error being raised is the one to report
                    pass
        finally:  # an interrupt in that wait too: collections must not stay held off
            if run["launched"] >= 0:
                self._kernel_gone()
            run["head"] = run["next"]
            self._backend.release(self._ended)
        self._scheduler.release_records()

    # --- the Python way ------------------------------------------------------------------
    def _publish_python(self, task: Task) -> None:
        """Publish a task whose producers are gathered by its instance as the backend makes it
        (its code generated at its first task), and learn the instance for the tables' later
        tasks of it."""
        prepared = first_calls()
        try:
            instance, words = self._backend.instance(task)
        except Exception as cause:
            raise TaskError.of(task, cause) from cause
        index = NO_WORK if instance.code is None else self._kernel_index(task, instance)
        pieces = max(1, instance.template.grid)
        first_call = first_calls() != prepared
        t = self._t
        run = self._run[0]
        if not slot_free(t):
            self._refused(task, SLOT_TAKEN)
        t.words[int(run["next"]) & (self._slots - 1), :len(words)] = words
        if self._args is not None:
            integer = np.zeros(MAX_SCALARS, np.int64)
            integer[:len(instance.template.integer_scalars)] = instance.template.integer_scalars
            learn(t, self._core[1], self._args, task.id, index, pieces, integer)
        while (status := publish(t, task.id, task.kernel.id, index, pieces, len(words),
                                 first_call)) == NEEDS_WAIT:
            self._wait_done(int(run["wait"]), "room for its producers' words")
        if status:
            self._refused(task, status)

    def _refused(self, task: Task, status: int) -> None:
        run = self._run[0]
        if status == REFUSED:
            raise PTOError(f"the persistent scheduler refused task {task.id}: its producers are not all "
                           f"earlier tasks, more than its ring of {int(run['ring'])} words holds, or its "
                           f"argument words more than a record's {MAX_WORDS}")
        raise InvariantError(f"task {task.id}: the slot of ticket {int(run['next'])} holds ticket "
                             f"{int(run['next']) - self._slots}, in flight")

    # --- the kernel ----------------------------------------------------------------------
    def _kernel_index(self, task: Task, instance) -> int:
        """The instance's index in the kernel's module; a new instance (checked first: what
        the backend keeps must compile) ends the kernel running (it is launched again over
        every instance seen, at its next wait)."""
        codes = self._codes()
        member = ModuleInstance(instance.code, np.dtype(instance.dtype))
        k = self._index.get(_key(member))
        if k is None:
            try:
                check(*member)
                check_shared(member.code, self._device.block_shared)
            except PTOError as cause:
                raise TaskError.of(task, cause) from cause
            k = self._index[_key(member)] = len(codes)
            codes.append(member)
        if 0 <= self._run[0]["launched"] <= k:
            self._end_kernel()
        return k

    def _tables(self) -> Tables:
        """The run's tables over its scheduler state: the backend's from an earlier run of these
        sizes (its pinned and device memory are not allocated, and freed, a run), else a new one."""
        if self._t is None:
            sizes = Sizes(self._slots, self._slots * WORDS_PER_SLOT, MAX_WORDS, MAX_BLOCKS, BOARD)
            state = self._backend.persistent_states.pop(sizes, None) or State(self._device, sizes)
            state.reset()
            self._state = state
            ticket_of = np.zeros(len(self._scheduler.state.tasks), TICKET)
            ticket_of["task"] = -1
            double = np.zeros(1, np.float64)
            self._t = Tables(
                run=self._run, flights=np.zeros(self._slots, FLIGHT), ticket_of=ticket_of,
                tickets=np.zeros(self._slots, np.int64), carried=np.zeros((0, 2), np.int64),
                retired=np.zeros(self._slots, RETIRED), keys=self._learnt.keys, filled=self._learnt.filled,
                learnt=self._learnt.entries, kernel_info=self._kernel_info,
                key=np.zeros_like(self._learnt.keys[0]), double=double, bits=double.view(np.int64),
                ready=self._scheduler.ready_scratch(), calls=state.calls, kernel=state.kernel,
                words=state.words, began=state.began, ended=state.ended, ran_on=state.ran_on)
        return self._t

    def _launch(self) -> None:
        """Launch the kernel over every instance seen (its module compiled once per set of
        them), as many blocks as the device holds at once."""
        codes = self._codes()
        try:
            with preparing():
                function = self._device.module_function(write(codes), None, NAME, KERNEL_PARAMS)
        except BaseException:  # what the backend keeps must compile: drop the instances not yet built
            del codes[self._backend.persistent_compiled:]
            self._index = {_key(member): k for k, member in enumerate(codes)}
            self._learnt.filled[:] = 0  # (some may be of those dropped)
            raise
        self._backend.persistent_compiled = len(codes)
        shared = shared_bytes([member.code for member in codes])
        # Launched from here on, whatever fails below (the event recorded after the launch, say):
        # abort then stops it; and no collection from before the kernel starts (_COLLECTIONS).
        self._run[0]["launched"] = len(codes)
        _COLLECTIONS.hold()
        try:
            # occupancy counts the opted-in shared memory: opt in first
            self._backend.allow_shared(function, shared)
            blocks = min(MAX_BLOCKS, self._device.resident_blocks(function, shared))
            self._backend.launch(function, blocks, shared, self._state.kernel_args, self._stream, self._ended)
        except Exception as cause:  # refused, or the device has faulted already
            raise self._fault(cause) from cause
        self.kernels_launched += 1

    def _codes(self) -> list[ModuleInstance]:
        """The instances the backend's runs have seen, in order: the kernel's module."""
        codes = self._backend.persistent_codes
        if self._index is None:
            self._index = {_key(member): k for k, member in enumerate(codes)}
        return codes

    def _end_kernel(self) -> None:
        """Close the kernel's run: every published task finishes, then it ends; retire them
        all, and start afresh (tickets from 0, the producers gathered all retired)."""
        run = self._run[0]
        if run["launched"] < 0 and run["next"]:
            self._launch()
        if run["launched"] >= 0:
            self._state.close()
            self._retire_until(int(run["next"]), "the end of the run")
            self._wait_kernel_end()
            self._draw()
            # never silently short
            if self._state.device_abort() != Abort.RUNNING or run["head"] != run["next"]:
                raise PTOError(f"the persistent kernel ended with {int(run['next'] - run['head'])} tasks "
                               f"unretired and its abort word {self._state.device_abort().name} "
                               f"({self._counters()})")
            self._kernel_gone()
        self._state.reset()
        run["base"] += run["next"]
        for field in ("head", "next", "next_word", "named", "count"):
            run[field] = 0
        self._t.flights["named"] = 0

    def _kernel_gone(self) -> None:
        """The kernel has ended (or been given up on): collections may run again."""
        self._run[0]["launched"] = -1
        _COLLECTIONS.release()

    # --- waits ---------------------------------------------------------------------------
    def _retire_until(self, ticket: int, why: str) -> None:
        """Retire every task before `ticket`: wait for the oldest, retire what is done (tasks
        finish in any order), again."""
        run = self._run[0]
        while run["head"] < ticket:
            self._wait_done(int(run["head"]), why)
            self._retire()

    def _wait_done(self, ticket: int, why: str) -> None:
        """Wait until task `ticket` is done, launching the kernel first if need be."""
        if self._run[0]["launched"] < 0:
            self._launch()
        state = self._state
        if state.done(ticket):
            return
        seen, since = state.progress(), time.perf_counter()
        while not state.done(ticket):
            self._check_kernel(why, ticket)
            progress = state.progress()
            now = time.perf_counter()
            if progress != seen:
                seen, since = progress, now
            elif now - since > self._patience:
                state.stop(Abort.STUCK)
                raise self._stuck(why)
            pause(now - since)  # (since the blocks' last progress)

    def _wait_kernel_end(self) -> None:
        try:
            self._backend.synchronize(self._ended)
        except Exception as cause:
            raise self._fault(cause) from cause

    def _check_kernel(self, why: str, ticket: int) -> None:
        """Raise if the kernel has stopped: a fault, an abort, or an end with task `ticket`
        unfinished (a closed kernel may have finished it, and every other, and ended since the
        caller looked: its end makes its slots' words visible, so it is looked at again)."""
        abort = self._state.device_abort()
        if abort != Abort.RUNNING:
            raise self._stuck(why) if abort == Abort.STUCK else PTOError(
                "the persistent kernel stopped: its pool of successor chunks ran out, or a ready "
                f"queue cell stayed taken (a protocol error; {self._counters()})")
        try:
            ended = self._backend.done(self._ended)
        except Exception as cause:
            raise self._fault(cause) from cause
        if ended and not self._state.done(ticket):
            raise PTOError(f"the persistent kernel ended while waiting for {why}, with "
                           f"{self._unfinished()} tasks unfinished ({self._counters()})")

    def _in_flight(self) -> range:
        run = self._run[0]
        return range(int(run["head"]), int(run["next"]))

    def _unfinished(self) -> int:
        return sum(not self._state.done(ticket) for ticket in self._in_flight())

    def _stuck(self, why: str) -> DeadlockError:
        left = [ticket for ticket in self._in_flight() if not self._state.done(ticket)]
        running = [self._task_of(t - 1) for t in dict.fromkeys(int(t) for t in self._state.running if t)]
        named = ", ".join(self._task_of(ticket) for ticket in left[:8])
        return DeadlockError(
            f"the persistent kernel made no progress for {self._patience:g} s while waiting for {why}: "
            f"{len(left)} tasks unfinished ({named}{', ...' if len(left) > 8 else ''}); running: "
            f"{', '.join(running) or 'none'} ({self._counters()})")

    def _fault(self, cause: Exception) -> Exception:
        for ticket in (int(t) - 1 for t in self._state.running if t):
            if ticket in self._in_flight():
                return TaskError.of(self._task(ticket), cause)
        return PTOError(f"the persistent kernel failed with no task running: {cause}")

    def _task(self, ticket: int) -> Task:
        return self._scheduler.task(int(self._t.flights[ticket & (self._slots - 1)]["task"]))

    def _task_of(self, ticket: int) -> str:
        if ticket in self._in_flight():
            task = self._task(ticket)
            return f"{task.kernel.name} (task {task.id})"
        return f"ticket {ticket}"

    def _counters(self) -> str:
        flights = self._in_flight()
        return (f"published {flights.stop}, wired {self._state.shown(Shown.WIRED)}, "
                f"{len(flights) - self._unfinished()} of {len(flights)} in flight done")

    # --- retiring --------------------------------------------------------------------------
    def _retire(self) -> None:
        """Retire, oldest first, the tasks seen done, up to the first that is not (one at a time
        in a validating run, the core checked after each); their rows go to the lanes when each
        task's is wanted (its record must be read before the orchestrator may reuse its slot:
        before returning to it), else when the rows fill."""
        if self._t is None:
            return
        run = self._run[0]
        limit = 1 if self._scheduler.validate else len(self._t.retired)
        if self._retire_done is None:
            self._retire_done = compiled_entry(retire_done, self._t, *self._core, limit)
        while True:
            retired = self._retire_done(self._t, *self._core, limit)
            if retired:
                self._retired_some = True
                if self._scheduler.validate:
                    last = int(self._t.retired[run["rows"] - 1]["task"])
                    self._scheduler.check_invariants(f"completing task {last}")
            stopped_short = run["rows"] == len(self._t.retired) or retired == limit  # more may be done
            if stopped_short or self._recording:
                self._drain()
            if not stopped_short:
                return

    def _drain(self) -> None:
        """The retired tasks' rows to the lanes: each task's when tracing (drawn at the kernel's
        end) or measuring, else counts and time per block, kernel and worker class."""
        run = self._run[0]
        rows = self._t.retired[:int(run["rows"])]
        run["rows"] = 0
        if not len(rows):
            return
        if self._recording:
            for task_id, _, _, block, began, ended, first_call, seen in rows.tolist():
                task = self._scheduler.task(task_id)
                if self._profile.tracing:
                    self._ran.append((task, block, began, ended, bool(first_call), seen * 1e-9))
                else:
                    self._lane(block).ran(task, 0.0, (ended - began) * 1e-9, bool(first_call))
            return
        keys = (rows["block"] << 32) | (rows["kernel"] << 8) | rows["worker"]  # (a 1-D sort: fast)
        groups, at, counts = np.unique(keys, return_inverse=True, return_counts=True)
        ns = np.bincount(at, weights=rows["ended"] - rows["began"], minlength=len(counts))
        for key, count, spent in zip(groups.tolist(), counts.tolist(), ns.tolist()):
            tally = self._tallies.setdefault((key >> 32, (key >> 8) & 0xFFFFFF, key & 0xFF), [0, 0.0])
            tally[0] += count
            tally[1] += spent

    def _report(self) -> None:
        """The counted runs into the lanes, and the records compiled code's tasks left back."""
        self._drain() if self._t is not None else None
        kernels = registered()
        for (block, kernel, worker), (count, ns) in sorted(self._tallies.items()):
            self._lane(block).ran_natively(kernels[kernel].name, WorkerType(worker), count, ns * 1e-9)
        self._tallies.clear()
        self._scheduler.release_records()

    def _draw(self) -> None:
        """Put the kernel's tasks on their blocks' lanes, the device's clock read as the host's
        by the least lag seen between a task's end and its retirement (the tightest bound on
        the clocks' offset); in ns from the earliest start first, which a float holds exactly
        (a GPU's clock counts from 1970)."""
        if not self._ran:
            return
        base = min(began for _, _, began, _, _, _ in self._ran)
        offset = min(seen - (ended - base) * 1e-9 for _, _, _, ended, _, seen in self._ran)
        for task, block, began, ended, first_call, _ in self._ran:
            self._lane(block).ran(task, (began - base) * 1e-9 + offset, (ended - base) * 1e-9 + offset,
                                  first_call)
        self._ran.clear()

    def _lane(self, block: int) -> Lane:
        lane = self._lanes.get(block)
        if lane is None:
            lane = self._lanes[block] = self._profile.lane(f"persistent-block-{block}",
                                                           (WorkerType.CUBE, WorkerType.VECTOR))
        return lane


def _no_library(kernel) -> bool:
    """The persistent kernel runs every kernel's generated code, never a library call."""
    return False


def _key(member: ModuleInstance) -> tuple:
    """An instance's key in the module: its source (one serves every element type) and type."""
    return member.code.source, member.dtype
