"""Scheduler transitions (spec 001 §7): a task starts running, a task completes.

Completion releases the task's consumers (a consumer whose last producer completed becomes
READY and is returned to the caller to queue), drops the task's buffer references (heap
space comes back when a freed buffer's last user completes), and retires completed tasks
from the front of the task ring.
"""

from __future__ import annotations

from numba import njit

from .rings import buffer_release, dep_release, retire_completed
from .state import (
    COMPLETED,
    D_TASK,
    H_COMPLETED,
    H_WINDOW,
    PENDING,
    READY,
    RUNNING,
    T_BUF,
    T_FANIN,
    T_FANOUT,
    T_NBUF,
    T_STATE,
)


@njit(cache=True)
def start(header, tasks, task_id):
    tasks[task_id & (header[H_WINDOW] - 1), T_STATE] = RUNNING


@njit(cache=True)
def complete(header, tasks, buffers, deps, task_id, ready):
    """Complete a task; the number of consumers it made ready, written to ready[:n]."""
    mask = header[H_WINDOW] - 1
    slot = task_id & mask
    tasks[slot, T_STATE] = COMPLETED
    header[H_COMPLETED] += 1
    n_ready = 0
    entry = tasks[slot, T_FANOUT]
    while entry >= 0:
        consumer = deps[entry, D_TASK]
        cs = consumer & mask
        tasks[cs, T_FANIN] -= 1
        if tasks[cs, T_FANIN] == 0 and tasks[cs, T_STATE] == PENDING:
            tasks[cs, T_STATE] = READY
            ready[n_ready] = consumer
            n_ready += 1
        entry = dep_release(header, deps, entry)
    tasks[slot, T_FANOUT] = -1
    for i in range(tasks[slot, T_NBUF]):
        buffer_release(header, buffers, tasks[slot, T_BUF + i])
    retire_completed(header, tasks)
    return n_ready
