"""How a thread that waits for something no lock signals (a message from another rank) polls:
it yields the core between polls for SPIN_S, then sleeps an eighth of what it has waited so
far, at most MAX_PAUSE_S, so data that comes soon is seen within microseconds and a long wait
costs a poll every MAX_PAUSE_S, not a core (which the other ranks on the node may need)."""

from __future__ import annotations

import os
import time

SPIN_S = 50e-6
MAX_PAUSE_S = 1e-3


def poll_pause(waited: float) -> float:
    """Seconds to sleep before the next poll after `waited` seconds of waiting; 0: yield."""
    return 0.0 if waited < SPIN_S else min(waited / 8, MAX_PAUSE_S)


def pause(waited: float) -> None:
    """Yield the core or sleep, as `poll_pause` says, before the next poll."""
    seconds = poll_pause(waited)
    if seconds:
        time.sleep(seconds)
    else:
        os.sched_yield()
