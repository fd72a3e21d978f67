"""Params of one task that share memory with a param it writes (docs/DESIGN.md, "Params that
share memory").

What such a task computes depends on the order its kernel reads and writes, and generated code
has its own order on each backend (whole tiles on the CPU, threads and blocks on the GPU), where
numpy reads every input first. So a submit finds the pairs (`next_shared`, on the layout rows
the core takes, exactly whatever the params' overlap levels) and refuses those the kernel's
`Kernel.sharing()` does not allow: the Python submit here (`check`), compiled submits in
jit/api.py, both naming the pair with `error`.
"""

from __future__ import annotations

import enum
from typing import Protocol

from numba import njit

from .core.state import INPUT, MAX_PARAMS
from .errors import ParamError
from .layout import P_KIND, R_OWNER
from .overlap import rows_share_bytes
from .tensor import TensorDescriptor


class Sharing(enum.IntEnum):
    """What a kernel's task may pass, in a param sharing memory with a param the task writes."""

    UNJUDGED = 0  # not yet asked (compiled code's kernel table: it asks once)
    ANY = 1  # anything: the kernel's own code, the same on every backend, decides what it reads
    SAME_VIEW = 2  # an input that is the very view written: generated code that updates in place
    NONE = 3  # nothing: generated code reads and writes in an order of its own on each backend


class Kernel(Protocol):
    """What this module reads of a pto_gpu.kernel.Kernel (which imports it)."""

    name: str

    def sharing(self) -> Sharing: ...

    def param_name(self, index: int) -> str: ...


@njit(cache=True, _nrt=False)
def next_shared(params, n, after):
    """The first pair after `after` (-1: from the start), as w * MAX_PARAMS + q, of a param w
    the task writes and another param q sharing a byte with it; -1 when there is none.
    params: a submit's rows (layout row, then kind)."""
    start = after + 1
    for w in range(start // MAX_PARAMS, n):
        if params[w, P_KIND] == INPUT:
            continue
        for q in range(start % MAX_PARAMS if w == start // MAX_PARAMS else 0, n):
            if q != w and params[q, R_OWNER] == params[w, R_OWNER] and rows_share_bytes(params[w], params[q]):
                return w * MAX_PARAMS + q
    return -1


def check(kernel: Kernel, tensors: list[TensorDescriptor], params) -> None:
    """Refuse a task of `kernel` on `tensors` (params: their rows) whose params share memory
    where the kernel does not allow it."""
    rule = kernel.sharing()
    if rule == Sharing.ANY:
        return
    pair = next_shared(params, len(tensors), -1)
    while pair >= 0:
        written, other = divmod(pair, MAX_PARAMS)
        if not (rule == Sharing.SAME_VIEW and params[other, P_KIND] == INPUT
                and same_view(tensors[written], tensors[other])):
            raise error(kernel, written, other, tensors[written], tensors[other])
        pair = next_shared(params, len(tensors), pair)


def same_view(a: TensorDescriptor, b: TensorDescriptor) -> bool:
    """Whether two descriptors are one view: the same elements in the same order (a dim of one
    element has no order, so its stride is not compared)."""
    return (a.buffer is b.buffer and a.byte_offset == b.byte_offset and a.dtype == b.dtype
            and a.shape == b.shape
            and all(n == 1 or s == t for n, s, t in zip(a.shape, a.strides, b.strides)))


def error(kernel: Kernel, written: int, other: int, a: TensorDescriptor, b: TensorDescriptor) -> ParamError:
    """The error refusing a task of `kernel` whose tensor param `written` (a) shares memory with
    its tensor param `other` (b)."""
    if kernel.sharing() == Sharing.NONE:
        why = ("its generated code reads and writes in an order of its own on each backend, so what "
               "it would compute depends on where it runs")
    elif same_view(a, b):  # so b is written too: the same view as an input is allowed
        why = "both are written, and which write lands last depends on where it runs"
    else:
        why = ("it updates in place only through the very same view (same start, shape, strides and "
               f"dtype), and these differ: shape {a.shape} strides {a.strides} {a.dtype.name} at byte "
               f"{a.byte_offset}, shape {b.shape} strides {b.strides} {b.dtype.name} at byte {b.byte_offset}")
    return ParamError(f"{kernel.name}: {kernel.param_name(written)}, which it writes, shares memory with "
                      f"{kernel.param_name(other)} ({a.buffer!r}): {why}; write to another buffer, or copy "
                      "the input first")
