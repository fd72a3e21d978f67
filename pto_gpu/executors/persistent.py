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

The kernel's module holds the generated code of the instances it may run. It is launched at
the first wait (a slot or the ring of producers' words to free, a full task ring, the end of
the run), over the instances seen so far; a task of an instance not in it ends the kernel (it
finishes what it has) and the next one is launched over all the instances seen. A backend's
instances carry over to its next runs, so a run like an earlier one launches one kernel.

Each task's slot says when its block took it and had run it (the device's clock) and which
block: trace= draws the tasks on a lane per block.

Every wait is bounded: a kernel whose blocks make no progress for `patience` seconds while a
task is unfinished is stopped, and the run fails with a DeadlockError naming the tasks left;
a kernel that faults fails the run with the task that was running named.

While the kernel runs it holds the GPU until the run ends, its idle blocks waiting for the
host: an orchestration must not wait for the device meanwhile (a synchronize, a copy back to
the host, freeing device memory), which would wait for the kernel's end.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np

from ..backends.cuda_abi import MAX_BLOCKS
from ..backends.launches import MAX_WORDS
from ..backends.persistent_host import NO_WORK, Abort, Shown, Sizes, State
from ..backends.persistent_module import NAME, check, write
from ..dtypes import WorkerType
from ..errors import DeadlockError, InvariantError, PTOError, TaskError
from ..first_calls import first_calls, preparing
from ..profile import Lane, Profile
from ..tasks import RINGS, Scheduler, Task

PATIENCE = 10.0  # seconds without progress, with a task unfinished, before a wait gives up
KERNEL_PARAMS = 2  # pto_persistent's (pto_persistent_kernel.cuh)
WORDS_PER_SLOT = 16  # producers' words in the ring per task slot
# The states of kernels stopped before they were seen to end (held from starting): they may
# still read them, so they are kept for the process.
_ABANDONED: list[State] = []


@dataclasses.dataclass(slots=True, eq=False)
class Flight:
    """A task published to the kernel, not yet retired."""

    task: Task
    ticket: int
    first_call: bool  # whether publishing it compiled its instance


class PersistentExecutor:
    runs_kernels = True
    wants_producers = True

    def __init__(self, scheduler: Scheduler, backend, profile: Profile):
        if not hasattr(backend, "instance"):
            raise PTOError(f'executor="persistent" runs tasks in a CUDA kernel: it needs backend="cuda" or '
                           f'"cuda-emulated", not {backend.name!r}')
        self._scheduler = scheduler
        self._backend = backend
        self._device = backend.device
        self._profile = profile
        self._lanes: dict[int, Lane] = {}  # per block that ran tasks
        self._ran: list[tuple] = []  # tracing: the kernel's retired tasks, to draw at its end
        self._patience = PATIENCE
        slots = 1 << max(1, (scheduler.state.sizes.task_window - 1).bit_length())
        self._slots = slots
        self._state: State | None = None
        self._launched: tuple | None = None  # the running kernel's instances' sources
        self._stream = backend.stream(("persistent", 0))
        self._ended = backend.take_event()  # recorded behind the kernel
        self._in_flight: collections.deque[Flight] = collections.deque()
        self._ticket_of: dict[int, int] = {}  # in-flight task id -> ticket
        self._producers_named = np.zeros(slots, np.int64)  # per slot: producers its task named
        self._named = 0  # ... in all, over the last `slots` tickets
        self._next_ticket = 0
        self._scratch = scheduler.ready_scratch()
        self._dtype = None
        self._compiled: int | None = None  # the backend's instances that have compiled in a module
        self._index: dict = {}  # their index by source
        self.kernels_launched = 0

    # --- the orchestrator's side ---------------------------------------------------------
    def submitted(self, task: Task, ready: bool, producers) -> None:
        prepared = first_calls()
        try:
            instance, words = self._backend.instance(task)
        except Exception as cause:
            raise TaskError.of(task, cause) from cause
        self._check_dtype(task, instance.dtype)
        kernel = NO_WORK if instance.code is None else self._kernel_index(task, instance)
        ticket = self._next_ticket
        state = self._state_for_publishing()
        slot = ticket & (self._slots - 1)
        if self._in_flight and self._in_flight[0].ticket <= ticket - self._slots:
            # the task window (at most `slots`) keeps the slot's last task retired, its record read
            raise InvariantError(f"task {task.id}: the slot of ticket {ticket} holds ticket "
                                 f"{self._in_flight[0].ticket}, in flight")
        tickets = self._producer_tickets(producers)
        self._named -= int(self._producers_named[slot])
        while self._named + len(tickets) > state.sizes.words or not state.room(len(tickets)):
            # the producers' words: named by too many recent tasks for the successor pool's
            # bound, or the ring full; a producer seen done needs no word
            self._wait_done(int(tickets[0]), "room for its producers' words")
            tickets = tickets[1:]
        self._producers_named[slot] = len(tickets)
        self._named += len(tickets)
        state.kernel[slot] = kernel
        state.ticket[slot] = ticket
        state.words[slot, :len(words)] = words
        state.publish(ticket, tickets)
        self._next_ticket += 1
        self._in_flight.append(Flight(task, ticket, first_calls() != prepared))
        self._ticket_of[task.id] = ticket
        self._profile.sample(self._scheduler, len(self._in_flight))
        self._retire_done()

    def make_room(self, status: int, unfreed) -> None:
        if not self._in_flight:
            raise self._scheduler.deadlock(status, unfreed())
        started = time.perf_counter()
        self._wait_done(self._in_flight[0].ticket, "room in a ring")
        self._retire_done()
        self._profile.stalled(RINGS[status].key, time.perf_counter() - started)

    def finish(self) -> None:
        if self._state is not None:
            self._end_kernel()
            self._backend.persistent_states[self._state.sizes] = self._state
        self._backend.release(self._ended)

    def abort(self) -> None:
        """Stop the kernel and wait for it to end (the next run's buffers may take this run's
        heap space), for `patience` at most: a kernel that has not started by then (its stream
        held) stops at its first look at the state, which is kept for it. Its tasks are
        dropped unretired, as on the other executors."""
        if self._launched is not None:
            self._state.stop(Abort.FAULTED)
            try:
                self._backend.synchronize(self._ended, self._patience)
                self._backend.persistent_states[self._state.sizes] = self._state
            except DeadlockError:  # not ended in time
                _ABANDONED.append(self._state)
            except Exception:  # a fault's: the error being raised is the one to report
                pass
            self._launched = None
        self._in_flight.clear()
        self._ticket_of.clear()
        self._backend.release(self._ended)

    # --- the kernel ----------------------------------------------------------------------
    def _check_dtype(self, task: Task, dtype) -> None:
        if self._dtype is None:
            self._dtype = dtype
        elif dtype != self._dtype:
            raise TaskError.of(task, PTOError(
                f'executor="persistent" runs one element type in a run (its kernel is compiled for one): '
                f"{task.kernel.name} is {dtype}, the run's tasks so far {self._dtype}"))

    def _kernel_index(self, task: Task, instance) -> int:
        """The instance's index in the kernel's module; a new instance (checked first: what
        the backend keeps must compile) ends the kernel running (it is launched again over
        every instance seen, at its next wait)."""
        codes = self._codes()
        k = self._index.get(instance.code.source)
        if k is None:
            try:
                check(instance.code)
            except PTOError as cause:
                raise TaskError.of(task, cause) from cause
            k = self._index[instance.code.source] = len(codes)
            codes.append(instance.code)
        if self._launched is not None and k >= len(self._launched):
            self._end_kernel()
        return k

    def _state_for_publishing(self) -> State:
        """The run's scheduler state: the backend's from an earlier run of these sizes (its
        pinned and device memory are not allocated, and freed, a run), else a new one."""
        if self._state is None:
            sizes = Sizes(self._slots, self._slots * WORDS_PER_SLOT, MAX_WORDS, MAX_BLOCKS)
            self._state = self._backend.persistent_states.pop(sizes, None) or State(self._device, sizes)
            self._state.reset()
        return self._state

    def _launch(self) -> None:
        """Launch the kernel over every instance seen (its module compiled once per set of
        them), as many blocks as the device holds at once."""
        codes = self._codes()
        sources = tuple(code.source for code in codes)
        try:
            with preparing():
                function = self._device.module_function(write(codes), self._dtype, NAME, KERNEL_PARAMS)
        except BaseException:  # what the backend keeps must compile: drop the instances not yet built
            del codes[self._compiled:]
            self._index = {code.source: k for k, code in enumerate(codes)}
            raise
        self._compiled = len(codes)
        blocks = min(MAX_BLOCKS, self._device.resident_blocks(function))
        try:
            self._backend.launch(function, blocks, self._state.kernel_args, self._stream, self._ended)
        except Exception as cause:  # refused, or the device has faulted already
            raise self._fault(cause) from cause
        self._launched = sources
        self.kernels_launched += 1

    def _codes(self) -> list:
        """The instances of the run's element type that the backend's runs have seen, in order."""
        codes = self._backend.persistent_codes.setdefault(self._dtype, [])
        if self._compiled is None:  # those of earlier runs have compiled
            self._compiled = len(codes)
            self._index = {code.source: k for k, code in enumerate(codes)}
        return codes

    def _end_kernel(self) -> None:
        """Close the kernel's run: every published task finishes, then it ends; retire them
        all, and start afresh (a new state at the next task)."""
        if self._launched is None and self._next_ticket:
            self._launch()
        if self._launched is not None:
            self._state.close()
            for flight in self._in_flight:  # they finish in any order
                self._wait_done(flight.ticket, "the end of the run")
            self._retire_done()
            self._wait_kernel_end()
            self._draw()
            if self._state.device_abort() != Abort.RUNNING or self._in_flight:  # never silently short
                raise PTOError(f"the persistent kernel ended with {len(self._in_flight)} tasks unretired "
                               f"and its abort word {self._state.device_abort().name} ({self._counters()})")
        self._launched = None
        self._state.reset()
        self._next_ticket = 0
        self._producers_named[:] = 0
        self._named = 0

    # --- waits ---------------------------------------------------------------------------
    def _wait_done(self, ticket: int, why: str) -> None:
        """Wait until task `ticket` is done, launching the kernel first if need be."""
        if self._launched is None:
            self._launch()
        state = self._state
        seen, since, pause = state.progress(), time.perf_counter(), 0.0
        while not state.done(ticket):
            self._check_kernel(why)
            progress = state.progress()
            now = time.perf_counter()
            if progress != seen:
                seen, since, pause = progress, now, 0.0
            elif now - since > self._patience:
                state.stop(Abort.STUCK)
                raise self._stuck(why)
            time.sleep(pause)
            pause = min(1e-3, pause * 2 or 1e-6)

    def _wait_kernel_end(self) -> None:
        try:
            self._backend.synchronize(self._ended)
        except Exception as cause:
            raise self._fault(cause) from cause

    def _check_kernel(self, why: str) -> None:
        """Raise if the kernel has stopped: a fault, an abort, or an end with tasks unfinished."""
        abort = self._state.device_abort()
        if abort != Abort.RUNNING:
            raise self._stuck(why) if abort == Abort.STUCK else PTOError(
                "the persistent kernel stopped: its pool of successor chunks ran out, or a ready "
                f"queue cell stayed taken (a protocol error; {self._counters()})")
        try:
            ended = self._backend.done(self._ended)
        except Exception as cause:
            raise self._fault(cause) from cause
        if ended:
            raise PTOError(f"the persistent kernel ended while waiting for {why}, with "
                           f"{len(self._in_flight)} tasks unfinished ({self._counters()})")

    def _stuck(self, why: str) -> DeadlockError:
        left = [flight for flight in self._in_flight if not self._state.done(flight.ticket)]
        running = [self._task_of(int(t) - 1) for t in self._state.running if t]
        named = ", ".join(f"{flight.task.kernel.name} (task {flight.task.id})" for flight in left[:8])
        return DeadlockError(
            f"the persistent kernel made no progress for {self._patience:g} s while waiting for {why}: "
            f"{len(left)} tasks unfinished ({named}{', ...' if len(left) > 8 else ''}); running: "
            f"{', '.join(running) or 'none'} ({self._counters()})")

    def _fault(self, cause: Exception) -> Exception:
        running = [int(t) - 1 for t in self._state.running if t]
        for flight in self._in_flight:
            if flight.ticket in running:
                return TaskError.of(flight.task, cause)
        return PTOError(f"the persistent kernel failed with no task running: {cause}")

    def _task_of(self, ticket: int) -> str:
        for flight in self._in_flight:
            if flight.ticket == ticket:
                return f"{flight.task.kernel.name} (task {flight.task.id})"
        return f"ticket {ticket}"

    def _counters(self) -> str:
        done = sum(self._state.done(flight.ticket) for flight in self._in_flight)
        return (f"published {self._next_ticket}, wired {self._state.shown(Shown.WIRED)}, "
                f"{done} of {len(self._in_flight)} in flight done")

    # --- retiring --------------------------------------------------------------------------
    def _producer_tickets(self, producers) -> np.ndarray:
        """The tickets of a task's producers still in flight, once each, oldest first."""
        tickets = {self._ticket_of[p] for p in map(int, producers) if p in self._ticket_of}
        return np.array(sorted(tickets), np.uint64)

    def _retire_done(self) -> None:
        """Retire, oldest first, the tasks seen done, up to the first that is not, noting how
        long each ran on which block (its slot says, in the device's clock); when tracing, when,
        and when it was seen done, to draw at the kernel's end."""
        state = self._state
        while self._in_flight and state.done(self._in_flight[0].ticket):
            flight = self._in_flight.popleft()
            slot = flight.ticket & (self._slots - 1)
            block, began, ended = int(state.ran_on[slot]), int(state.began[slot]), int(state.ended[slot])
            if self._profile.tracing:
                self._ran.append((flight.task, block, began, ended, flight.first_call, time.perf_counter()))
            else:  # the lane keeps the time only
                self._lane(block).ran(flight.task, 0.0, (ended - began) * 1e-9, flight.first_call)
            del self._ticket_of[flight.task.id]
            self._scheduler.retire(flight.task.id, self._scratch)

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
