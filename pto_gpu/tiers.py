"""Tiered kernels (spec 004 §6): precompiled variants of one operation by problem size.

    tier = pto.tiers([(2048, lightning_2k), (8192, lightning_8k), (None, lightning_big)])
    o.submit(tier.select(seq_len), ...)

`select(n)` is the kernel of the first tier whose limit is at least n (the None tier takes
every n past the others), found by bisection: O(log tiers).
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Sequence

from .errors import ParamError
from .kernel import Kernel


class Tiers:
    """Kernels by size limit, increasing; the last limit may be None (no limit)."""

    def __init__(self, limits: tuple[int, ...], kernels: tuple[Kernel, ...], unbounded: Kernel | None):
        self.limits, self.kernels, self.unbounded = limits, kernels, unbounded

    def select(self, n: int) -> Kernel:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ParamError(f"tiers.select({n!r}): the size is a non-negative int")
        index = bisect.bisect_left(self.limits, n)
        if index < len(self.kernels):
            return self.kernels[index]
        if self.unbounded is None:
            raise ParamError(f"tiers.select({n}): past the largest tier ({self.limits[-1]}) and no "
                             "(None, kernel) tier takes the rest")
        return self.unbounded

    def __repr__(self) -> str:
        tiers = [f"<={limit}: {k.name}" for limit, k in zip(self.limits, self.kernels)]
        if self.unbounded is not None:
            tiers.append(f"rest: {self.unbounded.name}")
        return f"Tiers({', '.join(tiers)})"


def tiers(entries: Sequence[tuple[int | None, Kernel]]) -> Tiers:
    """Tiers from (limit, kernel) pairs in increasing limit order; (None, kernel) last, if at all."""
    entries = list(entries)
    if not entries:
        raise ParamError("tiers([]): give at least one (limit, kernel) pair")
    limits, kernels, unbounded = [], [], None
    for position, entry in enumerate(entries):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Kernel)):
            raise ParamError(f"tiers: entry {position} is {entry!r}, not a (limit, kernel) pair")
        limit, kernel = entry
        if limit is None:
            if position != len(entries) - 1:
                raise ParamError(f"tiers: the (None, {kernel.name}) tier takes every size left, so it "
                                 "comes last")
            unbounded = kernel
            continue
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 0:
            raise ParamError(f"tiers: entry {position}'s limit {limit!r} is not a non-negative int")
        if limits and limit <= limits[-1]:
            raise ParamError(f"tiers: limits must increase; {limit} follows {limits[-1]}")
        limits.append(int(limit))
        kernels.append(kernel)
    return Tiers(tuple(limits), tuple(kernels), unbounded)
