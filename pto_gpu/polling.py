"""How a thread that waits for something no lock signals (a message from another rank) polls:
it yields the core between polls for SPIN_S, then sleeps an eighth of what it has waited so
far, at most MAX_PAUSE_S, so data that comes soon is seen within microseconds and a long wait
costs a poll every MAX_PAUSE_S, not a core (which the other ranks on the node may need)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import time

SPIN_S = 50e-6
MAX_PAUSE_S = 1e-3
TIMER_SLACK_NS = 1_000
PR_SET_TIMERSLACK = 29  # prctl(2)

_precise = threading.local()


def precise_sleeps() -> None:
    """Let the calling thread's short sleeps end when asked: Linux lets a sleep of a normal
    thread run up to 50 µs late (its timer slack) to batch wake-ups, which a poll's pauses of a
    few µs to tens of µs would pay at every message. Once per thread; a no-op elsewhere."""
    if getattr(_precise, "done", False):
        return
    _precise.done = True
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(TIMER_SLACK_NS), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))


def process_cores() -> int:
    """The cores this process may run on: its CPU affinity (an MPI rank bound to one core has
    one), where the OS tells it."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def poll_pause(waited: float) -> float:
    """Seconds to sleep before the next poll after `waited` seconds of waiting; 0: yield."""
    return 0.0 if waited < SPIN_S else min(waited / 8, MAX_PAUSE_S)


def pause(waited: float) -> None:
    """Yield the core or sleep, as `poll_pause` says, before the next poll."""
    seconds = poll_pause(waited)
    if seconds:
        precise_sleeps()
        time.sleep(seconds)
    else:
        os.sched_yield()
