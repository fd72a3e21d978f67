"""A runtime's worker threads, kept from one parallel run to the next.

A parallel run's workers are jobs handed to these threads, not threads of their own: starting
and joining six threads took ~0.7 ms of the 2.4 ms a one-tile run took. Each thread serves a
queue of jobs. A job goes to a thread whose last job has returned, or to a new thread when
none has. The threads stop when their runtime is collected, as the CPU backend's stream
threads do (backends/cpu_streams.py).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable

_STOP = None


class _Thread:
    __slots__ = ("jobs", "done", "broken")

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()  # its last job has returned
        self.done.set()
        self.broken = False  # a job raised, which ended the thread
        threading.Thread(target=_serve, args=(self,), daemon=True).start()


class WorkerThreads:
    def __init__(self):
        self._threads: list[_Thread] = []
        weakref.finalize(self, _stop, self._threads)

    def start(self, name: str, target: Callable[..., None], args: tuple) -> threading.Event:
        """Run target(*args) on a free thread, named `name` while it does; the event is set when
        it returns."""
        thread = next((t for t in self._threads if t.done.is_set() and not t.broken), None)
        if thread is None:
            thread = _Thread()
            self._threads.append(thread)
        thread.done.clear()
        thread.jobs.put((name, target, args))
        return thread.done

    def running(self) -> int:
        """Threads whose last job has not returned."""
        return sum(not thread.done.is_set() for thread in self._threads)


def _serve(thread: _Thread) -> None:
    while (job := thread.jobs.get()) is not _STOP:
        name, target, args = job
        threading.current_thread().name = name
        try:
            target(*args)
        except BaseException:  # a worker reports its tasks' errors itself: this is a bug, shown as one
            thread.broken = True
            raise
        finally:
            # Dropped before waiting for the next job: a run's executor is not kept alive by its
            # threads until the next run.
            job = target = args = None
            thread.done.set()


def _stop(threads: list[_Thread]) -> None:
    for thread in threads:
        thread.jobs.put(_STOP)
