"""Scheduler transitions (spec 001 §7): a task starts running, a task completes.

Completion releases the task's consumers (a consumer whose last producer completed becomes
READY and is returned to the caller to queue), drops the task's buffer references (heap
space comes back when a freed buffer's last user completes), and retires completed tasks
from the front of the task ring.
"""

from __future__ import annotations

from numba import njit

from .lock import acquire, release
from .rings import buffer_release, dep_release, retire_completed
from .state import COMPLETED, PENDING, READY, RUNNING


@njit(cache=True, _nrt=False)
def start(header, tasks, task_id):
    acquire(header)
    start_held(header, tasks, task_id)
    release(header)


@njit(cache=True, _nrt=False, inline="always")
def start_held(header, tasks, task_id):
    """`start`, by a caller that holds the core lock."""
    tasks[task_id & (header[0].window - 1)].state = RUNNING


@njit(cache=True, _nrt=False)
def complete(header, tasks, buffers, deps, task_id, ready):
    """Complete a task; the number of consumers it made ready, written to ready[:n]."""
    acquire(header)
    n_ready = complete_held(header, tasks, buffers, deps, task_id, ready)
    release(header)
    return n_ready


@njit(cache=True, _nrt=False, inline="always")
def complete_held(header, tasks, buffers, deps, task_id, ready):
    """`complete`, by a caller that holds the core lock."""
    h = header[0]
    mask = h.window - 1
    task = tasks[task_id & mask]
    task.state = COMPLETED
    h.completed += 1
    n_ready = 0
    entry = task.fanout
    while entry >= 0:
        consumer_id = deps[entry].task
        consumer = tasks[consumer_id & mask]
        consumer.fanin -= 1
        if consumer.fanin == 0 and consumer.state == PENDING:
            consumer.state = READY
            ready[n_ready] = consumer_id
            n_ready += 1
        entry = dep_release(header, deps, entry)
    task.fanout = -1
    # The fanout list is newest first (submit prepends): hand the consumers back in submission
    # order, so that FIFO queues run the tasks one completion releases as the program wrote them.
    low, high = 0, n_ready - 1
    while low < high:
        ready[low], ready[high] = ready[high], ready[low]
        low += 1
        high -= 1
    for i in range(task.nbuf):
        buffer_release(header, buffers, task.bufs[i])
    retire_completed(header, tasks)
    return n_ready
