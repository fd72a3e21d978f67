"""The logical graph of a distributed run: what one process would record.

A rank's own core also holds its transfer tasks, whose writes (a receive writes the region it
brings) change which task later readers find as their producer. So a recording rank submits
the orchestration's tasks, and only those, to a second core as the dry executor would (each
retires at once), which gives the graph, ids included, that a single process records: the
same on every rank. Its heap follows the real one allocation for allocation (transfers
allocate none), so buffer keys agree.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.state import CoreState, Sizes
from ..errors import InvariantError
from ..layout import PARAM_WIDTH
from ..params import core_rows
from ..tasks import Scheduler, Task


class LogicalGraph:
    def __init__(self, sizes: Sizes):
        self._scheduler = Scheduler(CoreState.allocate(sizes))
        self._scheduler.reset(record=True)
        self._scratch = self._scheduler.ready_scratch()
        self.tasks: list[Task] = []
        self.edges: list[tuple[int, int]] = []

    def alloc(self, nbytes: int, seq: int) -> None:
        got = self._scheduler.heap_alloc(nbytes)
        if got != seq:
            raise InvariantError(f"the logical graph's heap gave buffer {got} where the run's gave {seq}")

    def free(self, seq: int) -> None:
        self._scheduler.buffer_free(seq)

    def add(self, task: Task) -> None:
        """Record one of the orchestration's tasks (its id becomes its label)."""
        copy = dataclasses.replace(task)
        rows = core_rows(task.params, np.empty((len(task.params), PARAM_WIDTH), np.int64))
        status = self._scheduler.try_submit(copy, rows)
        if status < 0:
            raise InvariantError(f"the logical graph's core refused task {task.label} (code {status})")
        copy.label = None
        self.edges.extend((int(p), status) for p in self._scheduler.producers_of_last())
        self._scheduler.retire(status, self._scratch)
        self.tasks.append(copy)
