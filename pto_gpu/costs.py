"""Cost models (spec 004): what a task will take, for the simulator and critical-path schedules.

A kernel's `cost=` function is its model. Without one, a `CostHistory` given to Runtimes
(`pto.Runtime(costs=history)`, as many as like) predicts from what their runs measured: per
(kernel, tensor shapes, worker class) the mean of the calls seen; for shapes not seen, a·n^b
fitted by least squares on log-log over the kernel's seen sizes on that worker class (n: the
elements of its tensor params; b = 1 from a single size); nothing for a kernel never run
there. A runtime without one measures nothing (a key per task costs a few microseconds).
Runs add their measured kernel times at the end (each worker thread tallies its own, so
measuring takes no lock), and the run's statistics report how far the predictions made
before it were from what it measured.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping

from .dtypes import WorkerType
from .errors import PTOError
from .params import ParamKind

Key = tuple[str, tuple[tuple[int, ...], ...], WorkerType]  # kernel name, tensor shapes, worker class


def key_of(task) -> Key:
    return (task.kernel.name, tuple(p.value.shape for p in task.params if p.kind != ParamKind.SCALAR),
            task.worker)


@dataclasses.dataclass
class Tally:
    """Calls measured for one key: count, sum and sum of squares of their seconds."""

    count: int = 0
    total: float = 0.0
    squares: float = 0.0

    def add(self, seconds: float, count: int = 1, squares: float | None = None) -> None:
        self.count += count
        self.total += seconds
        self.squares += seconds * seconds if squares is None else squares

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def spread(self) -> float:
        """The standard deviation of the calls' seconds."""
        return math.sqrt(max(0.0, self.squares / self.count - self.mean ** 2))


class CostHistory:
    def __init__(self):
        self.tallies: dict[Key, Tally] = {}

    def merge(self, measured: dict[Key, Tally]) -> None:
        for key, tally in measured.items():
            self.tallies.setdefault(key, Tally()).add(tally.total, tally.count, tally.squares)

    def predict(self, key: Key) -> float | None:
        """Seconds for one call, or None when the kernel never ran on that worker class."""
        tally = self.tallies.get(key)
        if tally is not None:
            return tally.mean
        name, shapes, worker = key
        points = {}  # elements -> mean seconds, over the kernel's seen shapes on this class
        for (other, seen, on), t in self.tallies.items():
            if other == name and on == worker:
                points[_elements(seen)] = t.mean
        points = {n: s for n, s in points.items() if n > 0 and s > 0}
        if not points:
            return None
        n = _elements(shapes)
        if len(points) == 1:
            (n0, s0), = points.items()
            return s0 * n / n0
        xs, ys = zip(*((math.log(k), math.log(v)) for k, v in points.items()))
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return math.exp(my - b * mx) * n ** b

    def typical(self) -> float | None:
        """The mean seconds of every call measured: what a kernel without a model is taken to
        cost beside kernels with one."""
        count = sum(t.count for t in self.tallies.values())
        return sum(t.total for t in self.tallies.values()) / count if count else None

    def cost(self, task, missing: float | None) -> float:
        """A task's seconds on its worker class: its kernel's cost= model, else this history's
        prediction, else `missing` (None: an error, as the simulator needs every cost)."""
        seconds = self.known(task)
        if seconds is not None:
            return seconds
        if missing is None:
            raise PTOError(f"executor='sim' has no cost for kernel {task.kernel.name} on {task.worker.name}: "
                           "declare @pto.kernel(cost=lambda *params: seconds), or measure it first into a "
                           "pto.CostHistory that both runtimes share (pto.Runtime(costs=history)); "
                           "a call that compiled its kernel's code is not measured, so run it twice")
        return missing

    def known(self, task) -> float | None:
        """A task's seconds on its worker class from its kernel's model or this history; None
        when neither has one."""
        model = task.kernel.cost
        if isinstance(model, Mapping):
            model = model.get(task.worker)
        if model is not None:
            try:
                seconds = model(*(p.value for p in task.params))
            except Exception as error:
                raise PTOError(f"kernel {task.kernel.name}'s cost model raised {type(error).__name__}: "
                               f"{error}") from error
            if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or \
                    not (math.isfinite(seconds) and seconds >= 0):
                raise PTOError(f"kernel {task.kernel.name}'s cost model gave {seconds!r}, not a finite "
                               "number of seconds >= 0")
            return float(seconds)
        return self.predict(key_of(task))

    def prediction_error(self, measured: dict[Key, Tally]) -> dict[str, float]:
        """Per kernel, (measured - predicted) / measured over a run's calls that this history
        (as it was before the run) could predict."""
        totals: dict[str, list[float]] = {}
        for key, tally in measured.items():
            predicted = self.predict(key)
            if predicted is not None and tally.total > 0:
                pair = totals.setdefault(key[0], [0.0, 0.0])
                pair[0] += tally.total
                pair[1] += predicted * tally.count
        return {name: (got - want) / got for name, (got, want) in totals.items()}


def _elements(shapes: tuple[tuple[int, ...], ...]) -> int:
    return sum(math.prod(shape) for shape in shapes)
