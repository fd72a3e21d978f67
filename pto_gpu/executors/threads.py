"""A runtime's worker threads, kept from one parallel run to the next.

A parallel run's workers are jobs handed to these threads, not threads of their own: starting
and joining a run's threads (six by default on two cores) took ~0.7 ms of the 2.4 ms a
one-tile run took. Each thread serves a queue of jobs. A job goes to a live thread whose last
job has returned, or to a new thread when none has: a forked child's copies of its parent's
threads are not alive, nor are threads stopped at interpreter exit. The threads stop when
their runtime is collected, as the CPU backend's stream threads do (backends/cpu_streams.py),
so a runtime that has run in parallel keeps its workers' threads, parked, until then.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable

_STOP = None


class _Thread:
    __slots__ = ("jobs", "done", "broken", "thread")

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()  # its last job has returned
        self.done.set()
        self.broken = False  # a job raised, which ended the thread
        self.thread = threading.Thread(target=_serve, args=(self,), daemon=True)
        self.thread.start()

    def free(self) -> bool:
        return self.done.is_set() and not self.broken and self.thread.is_alive()


class WorkerThreads:
    def __init__(self):
        self._threads: list[_Thread] = []
        weakref.finalize(self, _stop, self._threads)

    def start(self, name: str, target: Callable[..., None], args: tuple) -> threading.Event:
        """Run target(*args) on a free thread, which takes `name`; the event is set when it returns."""
        thread = next((t for t in self._threads if t.free()), None)
        if thread is None:
            self._threads[:] = [t for t in self._threads if t.thread.is_alive() and not t.broken]
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
