"""The receives a rank has posted and whose data has not come yet, as its executor sees them.

A receive task's kernel posts its receive here (`post`) and returns; the task completes when
its data has come, which the executor learns by polling (`arrived`), between tasks and while
a worker has nothing else to do (executors/__init__.py, `Arrivals`). So no thread is handed a
message and none waits inside MPI: the worker that learns of the data completes the receive
and goes on with the reader it made ready.
"""

from __future__ import annotations

import threading

from ..errors import TaskError
from ..tasks import Task
from .transport import Posted, Transport


class Inbox:
    """Posted receives by task id; see the module docstring. Any worker may post or poll."""

    def __init__(self, transport: Transport):
        self._transport = transport
        self._lock = threading.Lock()
        # An ordered transport's transfers go in their order, on its own streams: not native.
        self.mpi = None if transport.ordered else transport.native
        self.clear()

    def clear(self) -> None:
        """A run starts: nothing is posted (a failed run's receives were given up)."""
        self._tasks: list[Task] = []
        self._posted: list[Posted] = []

    def post(self, task: Task, view, mask, source: int, sequence: int) -> None:
        posted = self._transport.receive(view, mask, source, sequence)
        with self._lock:
            self._tasks.append(task)
            self._posted.append(posted)

    def arrived(self) -> list[int]:
        """The ids of the tasks whose data has come since the last call, now in place;
        PeerFailed once a rank has failed, the receive's TaskError if unpacking fails."""
        if not self._tasks or not self._lock.acquire(blocking=False):
            return []  # another worker is polling: it completes what has come
        try:
            done = self._transport.arrived(self._posted)
            came = [(self._tasks[i], self._posted[i]) for i in done]
            for i in sorted(done, reverse=True):
                del self._tasks[i], self._posted[i]
            for task, posted in came:
                try:
                    self._transport.deliver(posted)
                except Exception as error:  # a read-only array, say: the receive fails as a task
                    raise TaskError.of(task, error) from error
            return [task.id for task, _ in came]
        finally:
            self._lock.release()

    def check(self) -> None:
        """PeerFailed once a rank has said it failed."""
        with self._lock:
            self._transport.arrived([])

    def cancel(self, receives: list[int], sends: list[int], read: list) -> None:
        self._transport.cancel(receives, sends, read)

    def give_up(self) -> None:
        """A run failed: what it left posted stays posted (Transport.give_up)."""
        with self._lock:
            self._transport.give_up(self._posted)
            self.clear()
