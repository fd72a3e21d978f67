"""CUDA's stream model on host threads, so that issue-ahead dispatch and graph capture run,
and are tested, where there is no GPU.

A stream is a thread that works through its queue in order: kernel calls, event records, and
waits on other streams' events. An event is done when its stream has reached it. A kernel
that raises poisons its stream: later calls are skipped, every event recorded after carries
the exception, and a stream that waits on such an event is poisoned too, so no task that
depends on a failed one runs. The backend replaces a poisoned stream when next asked for it.
A captured run is the list of calls its launches would have made, replayed in issue order.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable

from ..errors import TaskError

_STOP = None


class CpuEvent:
    __slots__ = ("_reached", "failure", "started", "ended")

    def __init__(self):
        self._reached = threading.Event()
        self.failure: BaseException | None = None  # what poisoned its stream before the record
        # A timed call's perf_counter() readings on the stream's thread, around the kernel.
        self.started = self.ended = 0.0

    def done(self) -> bool:
        return self._reached.is_set()

    def wait(self) -> None:
        self._reached.wait()

    def reach(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self._reached.set()

    def reset(self) -> None:
        """Unreached again, to be recorded anew (only once nothing waits on it any more)."""
        self.failure = None
        self._reached.clear()


class _Poison:
    __slots__ = ("failure",)

    def __init__(self):
        self.failure: BaseException | None = None


class CpuStream:
    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._poison = _Poison()
        threading.Thread(target=_serve, args=(self._queue, self._poison), name=name, daemon=True).start()
        # The thread holds only the queue and the poison, so a dropped stream stops its thread.
        weakref.finalize(self, self._queue.put, _STOP)

    @property
    def failed(self) -> bool:
        return self._poison.failure is not None

    def call(self, function: Callable[[], None]) -> None:
        self._queue.put(("call", function))

    def record(self, event: CpuEvent) -> None:
        self._queue.put(("record", event))

    def wait(self, event: CpuEvent) -> None:
        self._queue.put(("wait", event))


def _serve(work: queue.SimpleQueue, poison: _Poison) -> None:
    while (item := work.get()) is not _STOP:
        action, subject = item
        if action == "call":
            if poison.failure is None:
                try:
                    subject()
                except BaseException as error:  # SystemExit too: the thread must live to record
                    poison.failure = error
        elif action == "record":
            subject.reach(poison.failure)
        else:
            subject.wait()
            poison.failure = poison.failure or subject.failure


class CpuGraph:
    """A captured run: its tasks' kernel calls, in the order they were issued (a topological order)."""

    def __init__(self, calls: list[tuple[object, Callable[[], None]]], memory: tuple):
        self.calls = calls  # (task, call)
        # The calls' views are cut from ctypes byte views, which do not keep the callers'
        # arrays alive: the graph does, or a replay would touch freed memory.
        self._memory = memory

    def replay(self) -> None:
        for task, call in self.calls:
            try:
                call()
            except Exception as cause:
                raise TaskError.of(task, cause) from cause
