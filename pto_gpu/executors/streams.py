"""The stream executor: issue-ahead dispatch onto the backend's streams (docs/DESIGN.md, "GPU").

A task is issued the moment it is submitted, since its producers were submitted, so issued,
before it. A task that continues a chain (a producer of it is the last task issued to a
stream of its class; the newest such) goes to that stream, whose order then stands for a
wait; any other to the stream of its class given a task least recently, so a fan-out's
consumers spread whatever went where in between. The chosen stream first waits on the
event of the newest producer still in flight on each other stream (stream order covers the
older ones and those on its own stream), then the kernel is enqueued with an event recorded
behind it. Tasks retire (complete in the core, which reclaims their heap space) in
submission order as their events are reached: polled after each submission, waited on (a
batch at a time) when a ring is full, and waited on when the orchestration has ended.
Retiring in submission order keeps the core's view the serial executor's, every task
completing after its producers, and only the orchestrator's thread touches the core, so
there is no lock.

A run that traces or measures enqueues its kernels timed: its spans and kernel times are
when each kernel ran on its stream (a GPU's timing events, a CPU stream's thread), not
inferred from issue and retirement, which the host may notice late.

Capturing records the run into a graph instead (backend.begin_capture). Nothing may poll or
wait while capturing, so no task retires before the run ends and a ring that fills is an
error: a captured run must fit in the rings whole.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time

from ..backends import StreamBackend, memory_of
from ..dtypes import WorkerType
from ..errors import DeadlockError, TaskError
from ..first_calls import first_calls
from ..profile import Profile
from ..tasks import RINGS, Scheduler, Task


@dataclasses.dataclass(slots=True, eq=False)
class Issued:
    """A task on its way through a stream."""

    task: Task
    stream: int  # index into StreamExecutor._streams
    event: object  # reached when the kernel has run
    at: float  # perf_counter() when issued
    after: tuple[Issued, ...]  # the in-flight producers it waits for on other streams
    first_call: bool  # whether issuing it did first-call work (compiling: first_calls.preparing)
    end: float = 0.0  # when its retirement was observed
    waiters: int = 0  # tasks in flight whose stream waits on `event`


class StreamExecutor:
    runs_kernels = True
    wants_producers = True

    def __init__(self, scheduler: Scheduler, backend: StreamBackend, profile: Profile,
                 streams: dict[WorkerType, int], capture: bool = False):
        self._scheduler = scheduler
        self._backend = backend
        self._profile = profile
        self._streams: list = []
        self._lanes = []
        self._of_class: dict[WorkerType, list[int]] = {}
        for worker, count in streams.items():
            self._of_class[worker] = list(range(len(self._streams), len(self._streams) + count))
            for i in range(count):
                self._streams.append(backend.stream((worker.name, i)))
                self._lanes.append(profile.lane(f"{worker.name}-stream-{i}", (worker,)))
        self._tails: list[int] = [-1] * len(self._streams)  # per stream: the last task issued to it
        self.cross_waits = 0  # event waits enqueued: a stream waiting for a producer on another
        self._last_end = [0.0] * len(self._streams)  # per stream: when its last retired task ended
        self._in_flight: collections.deque[Issued] = collections.deque()
        self._issued: dict[int, Issued] = {}  # the in-flight tasks by id
        self._scratch = scheduler.ready_scratch()
        self._room_batch = max(1, scheduler.state.sizes.task_window // 8)
        self.graph = None  # what a capture made, once the run has ended
        self._capturing = capture
        self._timed = (profile.tracing or profile.measuring) and not capture  # see the docstring
        if capture:
            backend.begin_capture(self._streams)

    # --- the orchestrator's side ---------------------------------------------------------
    def submitted(self, task: Task, ready: bool, producers) -> None:
        in_flight = [issued for issued in map(self._issued.get, map(int, producers)) if issued is not None]
        index = self._stream_for(task, in_flight)
        stream = self._streams[index]
        newest: dict[int, Issued] = {}  # other stream -> its newest in-flight producer
        for issued in in_flight:
            if issued.stream != index:
                held = newest.get(issued.stream)
                if held is None or held.task.id < issued.task.id:
                    newest[issued.stream] = issued
        prepared = first_calls()
        try:  # refused on the host (no CUDA implementation, bad arguments), or a device fault
            event = self._backend.enqueue(task, stream, [issued.event for issued in newest.values()],
                                          timed=self._timed)
            for issued in newest.values():
                issued.waiters += 1
        except Exception as cause:
            if not self._capturing:
                # A device fault fails every later CUDA call: name the task it came from.
                self._retire_reached()
            raise TaskError.of(task, cause) from cause
        self.cross_waits += len(newest)
        self._tails[index] = task.id
        record = Issued(task, index, event, time.perf_counter(), tuple(newest.values()),
                        first_calls() != prepared)
        self._in_flight.append(record)
        self._issued[task.id] = record
        self._profile.sample(self._scheduler, len(self._in_flight))
        if not self._capturing:
            self._retire_reached()

    def _stream_for(self, task: Task, in_flight: list[Issued]) -> int:
        """The stream a task goes to (see the module docstring)."""
        streams = self._of_class[task.worker]
        chained = [issued for issued in in_flight
                   if issued.stream in streams and self._tails[issued.stream] == issued.task.id]
        if chained:
            return max(chained, key=lambda issued: issued.task.id).stream
        return min(streams, key=self._tails.__getitem__)  # the one given a task least recently

    def make_room(self, status: int, unfreed) -> None:
        ring = RINGS[status]
        if self._capturing:
            size = getattr(self._scheduler.state.sizes, ring.setting)
            raise DeadlockError(f"{ring.label} ({ring.setting}={size}) filled while capturing: a captured "
                                f"run reclaims nothing before it ends, so it must fit whole; raise "
                                f"{ring.setting}=")
        if not self._in_flight:
            raise self._scheduler.deadlock(status, unfreed())
        started = time.perf_counter()
        # Wait for a batch of the oldest tasks, not one: a round trip per task would cost more
        # than small tasks do, and the streams stay busy with the rest meanwhile. The submit
        # that asked comes back here if that was not room enough.
        for _ in range(min(self._room_batch, len(self._in_flight))):
            self._reached(self._in_flight[0], block=True)
            self._retire_oldest()
        self._retire_reached()
        self._profile.stalled(ring.key, time.perf_counter() - started)

    def finish(self) -> None:
        if self._capturing:
            self._capturing = False
            memory = memory_of(record.task for record in self._in_flight)
            self.graph = self._backend.end_capture(self._streams, memory)
            # Nothing ran: the tasks leave the core as the dry executor's do, unrecorded. Their
            # events go back: the graph keeps the order they made, not the events.
            for record in self._in_flight:
                self._scheduler.retire(record.task.id, self._scratch)
                self._backend.release(record.event)
            self._in_flight.clear()
            self._issued.clear()
            return
        while self._in_flight:
            self._reached(self._in_flight[0], block=True)
            self._retire_oldest()

    def abort(self) -> None:
        """Leave nothing enqueued: the next run's buffers may take this run's heap space."""
        if self._capturing:
            self._capturing = False
            with contextlib.suppress(Exception):  # the error being raised is the one to report
                self._backend.end_capture(self._streams, ())
        for record in self._in_flight:
            try:
                self._backend.synchronize(record.event)
            except DeadlockError:  # a stuck stream: every later wait would time out again
                break
            except Exception:  # a failed task's: the error being raised is the one to report
                continue
            except BaseException as failure:  # a kernel's SystemExit, say, which its stream kept
                if failure is not getattr(record.event, "failure", None):
                    raise  # an interrupt of this wait
        else:  # every stream has passed every wait and record: the events go back, as at retirement
            for record in self._in_flight:
                self._release_events(record)
        self._in_flight.clear()
        self._issued.clear()

    # --- helpers -------------------------------------------------------------------------
    def _reached(self, record: Issued, block: bool) -> bool:
        """Whether a task's kernel has run; a kernel's failure becomes that task's TaskError."""
        try:
            if block:
                self._backend.synchronize(record.event)
                return True
            return self._backend.done(record.event)
        except Exception as cause:
            raise TaskError.of(record.task, cause) from cause

    def _retire_reached(self) -> None:
        """Retire, oldest first, the tasks whose kernels have run, up to the first that has not."""
        while self._in_flight and self._reached(self._in_flight[0], block=False):
            self._retire_oldest()

    def _release_events(self, record: Issued) -> None:
        """Its stream has passed the record's waits: its producers' events may be recorded
        again once no other wait refers to them (a CPU stream reads an event when it reaches the
        wait), and its own once none does."""
        for producer in record.after:
            producer.waiters -= 1
            if producer.waiters == 0:
                self._backend.release(producer.event)
        if record.waiters == 0:
            self._backend.release(record.event)
        record.after = ()  # its producers' ends are used: let their records go

    def _retire_oldest(self) -> None:
        record = self._in_flight.popleft()
        del self._issued[record.task.id]
        record.end = time.perf_counter()
        if self._timed:
            start, end = self._backend.span(record.event)
        else:
            # The host sees only when a task was issued and when its retirement was noticed: it
            # ran no earlier than its stream's previous task and its producers elsewhere ended.
            start = max(record.at, self._last_end[record.stream], *(a.end for a in record.after))
            end = record.end
        self._release_events(record)
        self._last_end[record.stream] = record.end
        self._lanes[record.stream].ran(record.task, start, end, record.first_call)
        self._scheduler.retire(record.task.id, self._scratch)
