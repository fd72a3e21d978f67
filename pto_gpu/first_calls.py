"""One-time work of a kernel's first call at a shape (generating, compiling or loading its
code, or waiting for another thread doing it), counted per thread: cost histories leave a call
that did such work out, so they learn what calls take, not what compiling took. Below the
kernel declarations and the code generators, which both mark such work."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_first_calls = threading.local()  # per thread: how many first calls it has made


@contextlib.contextmanager
def preparing() -> Iterator[None]:
    """Around a call's one-time work."""
    try:
        yield
    finally:
        _first_calls.count = getattr(_first_calls, "count", 0) + 1


def first_calls() -> int:
    """How many times this thread has done first-call work (compare before and after a call)."""
    return getattr(_first_calls, "count", 0)
