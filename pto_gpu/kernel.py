"""Kernel declarations: an InCore function recorded as plain data.

`@pto.kernel(worker=...)` turns a function into a `Kernel` whose body is the CPU
implementation; a CUDA implementation attaches to the same record. Each kernel gets a
small integer id, which is what the numba core stores in the task table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .dtypes import WorkerType

_REGISTRY: list[Kernel] = []


@dataclasses.dataclass(eq=False)
class Kernel:
    name: str
    worker: WorkerType
    cpu: Callable
    cuda: Callable | None = None
    id: int = -1

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.worker.name})"


def kernel(worker: WorkerType = WorkerType.VECTOR, name: str | None = None) -> Callable[[Callable], Kernel]:
    """Declare an InCore kernel; the decorated function is its CPU implementation.

    It receives one array view per tensor param and the scalar values, in param order.
    """

    def declare(function: Callable) -> Kernel:
        declared = Kernel(name or function.__name__, WorkerType(worker), function, id=len(_REGISTRY))
        _REGISTRY.append(declared)
        return declared

    return declare


def kernel_by_id(kernel_id: int) -> Kernel:
    return _REGISTRY[kernel_id]
