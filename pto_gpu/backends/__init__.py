"""Backends: where the heap lives and how a descriptor becomes an array view.

The contract is written as Protocols: `Backend` for every executor, `StreamBackend` for the
stream executor (CUDA's stream model; host threads on the CPU). cpu.py (with cpu_streams.py)
and cuda.py are the two; interop.py takes in callers' arrays from any array library;
cuda_abi.py is the argument convention of the CUDA sources. What both backends share is
written once here: where a descriptor's bytes are (`locate`) and what a captured graph
keeps alive (`memory_of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from ..params import ParamKind
from ..tensor import BufferKind, TensorDescriptor


@dataclasses.dataclass(frozen=True, eq=False)
class ExternalMemory:
    """The allocation that owns an external array's memory, as a backend holds it."""

    handle: object  # what views are cut from: a flat uint8 numpy array, a CuPy memory object
    keep: object  # the caller's object(s) whose memory it is: held as long as the handle is used


@dataclasses.dataclass(frozen=True)
class ExternalArray:
    """A caller's array, located inside the allocation that owns its memory."""

    owner_base: int  # byte address of the owning allocation
    owner_nbytes: int
    memory: ExternalMemory  # kept alive by the run and by any graph captured from it
    data: int  # byte address of the array's element [0, ..., 0]
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes
    dtype: object  # numpy dtype
    writeable: bool  # False when the owning memory is read-only: tasks may read it, never write it


class Backend(Protocol):
    """What every executor uses."""

    name: str
    heap_base: int  # the heap ring's one allocation
    heap_bytes: int

    def resolve(self, array: object) -> ExternalArray:
        """The caller's array and the allocation that owns it; PTOError for an array this
        backend cannot use in place (wrong device, unknown kind), saying what to do."""

    def view(self, tensor: TensorDescriptor) -> object:
        """A kernel's view of a descriptor (numpy or CuPy), sharing its memory."""

    def run(self, task) -> None:
        """Run a task's kernel; it has finished on return."""

    def to_device(self, array: object) -> object:
        """A copy of a numpy array where this backend's arrays live."""

    def to_host(self, array: object) -> object:
        """A numpy copy of one of this backend's arrays."""

    def wait_for_caller(self) -> None:
        """Return once work the caller queued (writing inputs) is done."""


class Event(Protocol):
    """Reached when everything enqueued on its stream before its record has run."""


class CapturedGraph(Protocol):
    """A captured run."""

    def replay(self) -> None:
        """Run it again and return when it has run; a kernel's failure is its TaskError."""


class StreamBackend(Backend, Protocol):
    """CUDA's stream model, for the stream executor."""

    def stream(self, key: object) -> object:
        """The backend's stream for `key`, made on first use."""

    def enqueue(self, task, stream: object, after: list[Event], timed: bool = False) -> Event:
        """Enqueue a task's kernel on `stream` behind the events `after` (its producers on
        other streams); returns at once, with an event reached when the kernel has run.
        `timed`: also measure when the kernel starts and ends where it runs (`span`)."""

    def span(self, event: Event) -> tuple[float, float]:
        """When the kernel of a timed enqueue, whose `event` was reached, started and ended
        where it ran (a GPU's clock, or the stream's thread), as time.perf_counter() readings."""

    def done(self, event: Event) -> bool:
        """Non-blocking; raises the failure of a kernel the event waited for."""

    def synchronize(self, event: Event) -> None:
        """Block until `event` is reached; raises as `done` does."""

    def release(self, event: Event) -> None:
        """Hand back an event that was reached (or recorded in a capture that has ended) and
        that no wait still queued refers to; a later `enqueue` may return it again."""

    def begin_capture(self, streams: list) -> None:
        """From here on, record what is enqueued on `streams` instead of running it."""

    def end_capture(self, streams: list, memory: tuple) -> CapturedGraph:
        """The graph of what was enqueued since begin_capture, holding `memory` (memory_of
        its tasks) and the heap, so that what it reads and writes outlives the run."""


def locate(tensor: TensorDescriptor, heap: object, heap_base: int) -> tuple[object, int]:
    """The memory handle a descriptor's view is cut from, and the byte offset of its element
    [0, ..., 0] there: the heap, or the external's owning allocation."""
    buffer = tensor.buffer
    if buffer.kind == BufferKind.HEAP:
        return heap, buffer.base - heap_base + tensor.byte_offset
    return buffer.memory.handle, tensor.byte_offset


def memory_of(tasks: Iterable) -> tuple[ExternalMemory, ...]:
    """The external memory the tasks' tensor params use, each allocation once."""
    memory = {}
    for task in tasks:
        for param in task.params:
            if param.kind != ParamKind.SCALAR and param.value.buffer.kind == BufferKind.EXTERNAL:
                memory[id(param.value.buffer.memory)] = param.value.buffer.memory
    return tuple(memory.values())
