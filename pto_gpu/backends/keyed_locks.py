"""Locks by key: one thread at a time makes a given thing (a kernel's build, its module), and
different things are made side by side (a run's new kernel instances compile in parallel)."""

from __future__ import annotations

import threading
from collections.abc import Hashable


class KeyedLocks:
    def __init__(self):
        self._locks: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def __call__(self, key: Hashable) -> threading.Lock:
        """The lock of `key` (made at its first use; kept: keys are few, one per instance)."""
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())
