"""Backends: where the heap lives and how a descriptor becomes an array view.

A backend is a small object with a narrow interface:
  name, heap_base, heap_bytes     the heap ring's one allocation
  resolve(array) -> ExternalArray the caller's array and the allocation that owns it
  view(tensor) -> array           a kernel's view of a descriptor
  run(task)                       run a task's kernel; it has finished on return
  to_device(a), to_host(a)        move a numpy array to where this backend's arrays live, and back
  wait_for_caller()               return once work the caller queued (writing inputs) is done

and, for the stream executor, CUDA's stream model (host threads on the CPU):
  stream(key) -> stream           the backend's stream for `key`, made on first use
  launch(task, stream)            enqueue a task's kernel; returns at once
  record(stream) -> event         an event reached when everything enqueued so far has run
  wait(stream, event)             later work on `stream` waits for `event`
  done(event) -> bool             non-blocking; raises the failure of a kernel it waited for
  synchronize(event)              block until `event` is reached; raises as done does
  begin_capture(streams)          from here on, record what is enqueued on `streams` instead of
  end_capture(streams) -> graph     running it; graph.replay() runs it and waits for it

cpu.py (with cpu_streams.py) and cuda.py are the two; cuda_abi.py is the argument convention
of the CUDA sources.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ExternalArray:
    """A caller's array, located inside the allocation that owns its memory."""

    owner_base: int  # byte address of the owning allocation
    owner_nbytes: int
    memory: object  # the backend's handle on the owning allocation (kept alive by the run)
    data: int  # byte address of the array's element [0, ..., 0]
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes
    dtype: object  # numpy dtype
    writeable: bool  # False when the owning memory is read-only: tasks may read it, never write it
