"""The core stage of a pipelined compiled call: the core's part of every submit, on a thread
of its own (docs/ARCHITECTURE.md, "Pipelined submits").

In a run whose tasks complete at submit (the dry executor), a compiled submit's two halves
share nothing but the task's params: the arguments, checks and layout rows (jit/api.py's
`submit` and `_queue`), and the core's dependency analysis, ring allocation and completion. So the body's
thread queues each submit's params in its task slot and goes on, and this stage submits them
to the core in queue order, a core ahead or behind. The two threads meet only where the
program orders memory: an alloc, a free or a scope's end waits until the stage has caught up
(`api.wait_for_core`), so frees reach the core after the submits before them, as in a serial
run, and the heap ring is never written by both.

The stage needs no Python and no GIL. A full TensorMap it empties itself (every task has
retired, so a sweep frees the pool, as the serial submit's service would). A ring it cannot
make room in (in a dry run, where every producer has completed, only a pool smaller than the
task's params) it reports in `pipe[P_FULL]` and waits, unchanged, until the submits' side has
made room through the session's service, or raised the error the serial submit would, and
cleared it.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..core import complete as core_complete
from ..core.lock import back_off, load_acquire, prefetch, store_release
from ..core.state import FULL_TENSORMAP
from ..core.submit import submit as core_submit
from ..core.tensormap import tm_make_room
from ..polling import process_cores
from .context import M_ALIVE_SEEN, P_DONE, P_FULL, P_QUEUED, P_RUNNING, P_STOP, tables


def wanted(complete_at_submit: bool, log_edges: bool, validate: bool) -> bool:
    """Whether a session's compiled calls run pipelined: when its tasks complete at submit (a
    run that executes tasks needs the cores for its workers), no edge log or validation check
    must follow each submit, and there is a second core."""
    return complete_at_submit and not log_edges and not validate and process_cores() > 1


# A pipelined session runs a body's call pipelined when the body's last call there submitted at
# least this many tasks (the first call runs serially). Starting the stage takes ~0.5 ms on the
# 2-core VM, the time of ~2,000 serial submits, and pipelining saves a quarter of each submit:
# a one-tile dry matmul took 0.18 ms serially and 0.74 pipelined. (Starting the stage within a
# call, at its START_AFTER-th submit, was tried: the branch it took in the serial submit made
# the pipelined build 60-65 ms instead of 37-39, while waits slept after ~5 us of waiting,
# which may be all it measured: docs/ARCHITECTURE.md, "Pipelined submits".)
START_AFTER = 16384
# Pipelining a big call does not always pay: on the 2-core VM beside two busy processes, the 16K
# LLaMA layer built in 98 ms pipelined and 80 serially (35 and 50 on the idle machine). So a
# body's big calls measure both ways and keep the faster, each way's rate the best of its calls,
# older calls of that way counting _FORGET less each: one slow call among fast ones (pipelined,
# 35-38 ms, now and then 41-54) does not turn a body serial, and a machine turned slow for one
# way does, once that way's old best has faded below the other's (which may take some calls,
# and some going back, as the other way's old best fades in turn). After every _PROBE_EVERY
# measured calls one goes the other way, to see whether it has become the faster.
_FORGET = 0.9
_PROBE_EVERY = 16


@dataclass
class BodyCalls:
    """What a body's calls in pipelined sessions measured. Its first call, and its first
    pipelined call, are not measures: the first loads its code, and the first pipelined one
    after the body's compilation once took 55 ms where the later took 35."""

    last_tasks: int = 0  # tasks its last call submitted
    serial_rate: float = 0.0  # tasks a second: the best of its serial calls, older ones faded
    pipelined_rate: float = 0.0  # the same, of its pipelined calls
    pipelined_calls: int = 0
    measured: int = 0  # calls measured, either way (every _PROBE_EVERY-th, the next probes)


_CALLS: weakref.WeakKeyDictionary[object, BodyCalls] = weakref.WeakKeyDictionary()


def worth(body) -> bool:
    """Whether a call of body should run pipelined (in a session that may): when its last call
    submitted START_AFTER tasks or more, and pipelining pays."""
    calls = _CALLS.get(body)
    return calls is not None and calls.last_tasks >= START_AFTER and pays(calls)


def first_pipelined_next(body) -> bool:
    """Whether body's next call will be its first pipelined one."""
    calls = _CALLS.get(body)
    return calls is not None and calls.pipelined_calls == 0 and worth(body)


def pays(calls: BodyCalls) -> bool:
    """Whether pipelining pays, as a body's calls measured it: try it until it has been
    measured, then measure one call serially, then keep the faster (but probe the other way
    now and then)."""
    if not calls.pipelined_rate:
        return True
    if not calls.serial_rate:
        return False
    faster = calls.pipelined_rate >= calls.serial_rate
    return faster != (calls.measured % _PROBE_EVERY == 0)


def submitted(body, tasks: int, seconds: float, pipelined: bool) -> None:
    """Note how many tasks a call of body submitted, and how fast, if it measures."""
    calls = _CALLS.get(body)
    if calls is None:
        _CALLS[body] = BodyCalls(last_tasks=tasks)
        return
    calls.last_tasks = tasks
    calls.pipelined_calls += pipelined
    if tasks < START_AFTER or (pipelined and calls.pipelined_calls == 1):
        return
    rate = tasks / max(seconds, 1e-9)
    calls.measured += 1
    if pipelined:
        calls.pipelined_rate = max(rate, calls.pipelined_rate * _FORGET)
    else:
        calls.serial_rate = max(rate, calls.serial_rate * _FORGET)


class CoreStage:
    """The core stage's thread, for one compiled call: running from entry, ended at exit
    once every queued task is submitted (or at once, if the stage waits for room that the
    call, raising, will not make)."""

    def __init__(self, o, fields: dict[str, np.ndarray], head: np.ndarray):
        self._o = o
        self._fields = fields
        self._head = head
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CoreStage:
        pipe, meta = self._fields["pipe"], self._fields["meta"]
        pipe[:] = 0
        pipe[P_QUEUED] = pipe[P_DONE] = int(self._head["next_task"])
        meta[M_ALIVE_SEEN] = int(self._head["last_alive"])
        self._thread = threading.Thread(target=core_stage, args=(self._o,), name="pto-core-stage",
                                        daemon=True)
        self._thread.start()
        # A hand-written body may hold the GIL while it runs, and wait for the stage without
        # releasing it: the stage must be in its GIL-free loop first (its start may load or
        # compile it).
        try:
            while not pipe[P_RUNNING]:
                if not self._thread.is_alive():
                    raise RuntimeError("the core stage's thread ended before it ran")
                time.sleep(0)
        except BaseException:  # a KeyboardInterrupt: the stage must not outlive the call
            pipe[P_STOP] = 1
            self._thread.join()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop(self._o)
        self._thread.join()


@njit(cache=True, _nrt=False, nogil=True)
def core_stage(o):
    """Submit the queued tasks to the core in queue order and complete each, until stopped
    with nothing queued."""
    t = tables(o)
    pipe = t.pipe.ctypes.data
    mask = t.header[0].window - 1
    done = t.pipe[P_DONE]
    store_release(pipe + 8 * P_RUNNING, 1)
    waiting = 0
    while True:
        queued = load_acquire(pipe + 8 * P_QUEUED)
        if done == queued:
            if load_acquire(pipe + 8 * P_STOP):
                return
            waiting = back_off(waiting)
            continue
        waiting = 0
        while done < queued:
            if done + 2 < queued:  # the body's thread wrote these lines: ask for them early
                prefetch_slot(t, (done + 2) & mask, 4, 0)
            slot = done & mask
            info = t.slot_info[slot]
            n = info[2]
            while True:
                task_id = core_submit(t.header, t.tasks, t.buffers, t.deps, t.entries, t.buckets, t.producers,
                                      t.covered, info[0], info[1], t.slot_params[slot][:n])
                if task_id >= 0:
                    break
                if task_id == FULL_TENSORMAP:  # evict=True: a dry run's entries are all retired
                    if tm_make_room(t.header, t.buffers, t.entries, t.buckets, n, True, t.covered) >= n:
                        continue
                if not _wait_for_room(t, task_id, n):
                    return
            core_complete.complete(t.header, t.tasks, t.buffers, t.deps, task_id, t.ready)
            done += 1
            store_release(pipe + 8 * P_DONE, done)


@njit(cache=True, _nrt=False, inline="always")
def _wait_for_room(t, status, needed):
    """Report a full ring and wait until the submits' side has made room (True) or the call
    ends (False)."""
    pipe = t.pipe.ctypes.data
    t.pipe[P_FULL + 1] = needed
    store_release(pipe + 8 * P_FULL, status)
    waiting = 0
    while load_acquire(pipe + 8 * P_FULL) != 0:
        if load_acquire(pipe + 8 * P_STOP):
            return False
        waiting = back_off(waiting)
    return True


@njit(cache=True, _nrt=False, nogil=True)
def stop(o):
    """End the core stage once it has submitted every queued task, or at once if it waits for
    room (the call is raising: nobody will make it)."""
    t = tables(o)
    pipe = t.pipe.ctypes.data
    waiting = 0
    last = -1
    while load_acquire(pipe + 8 * P_FULL) == 0:
        done = load_acquire(pipe + 8 * P_DONE)
        if done == t.pipe[P_QUEUED]:
            break
        if done != last:  # the stage is working: no sleeping (as in api._wait_for_done)
            last, waiting = done, 0
        waiting = back_off(waiting)
    store_release(pipe + 8 * P_STOP, 1)


@njit(cache=True, _nrt=False, inline="always")
def prefetch_slot(t, slot, n, write):
    """Ask for the cache lines of a queued slot's kernel and first n params (write: a literal
    1 when the asker will write them)."""
    prefetch(t.slot_info.ctypes.data + slot * t.slot_info.strides[0], write)
    rows = t.slot_params.ctypes.data + slot * t.slot_params.strides[0]
    for line in range(0, n * t.slot_params.strides[1], 64):
        prefetch(rows + line, write)
