"""Instance keys of compiled tasks, and the open-addressing tables that map them to code.

A kernel instance is what picks a kernel's code for a call: the kernel, each tensor's element
type, dims and shape and whether it is written, each scalar's kind, and the values of the
scalars that pick a kernel family's instance (`structural`). Native workers (native.py) map
an instance to its CPU native entry; the stream executor on a CUDA driver (driver_streams.py)
to its launch. Both read a task's key from the run's argument tables (jit/context.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from ..core import state as cs
from ..jit.context import MAX_SCALARS, S_INT
from ..jit.descriptor import D_DTYPE, D_NDIM, D_SHAPE

INSTANCES = 1024  # instance table slots (a power of two); at most half are filled
KEY_WIDTH = 3 + cs.MAX_PARAMS * 4 + MAX_SCALARS * 2
ANY_SCALARS = -1  # KERNEL_INFO.scalars of a kernel whose scalar count its code does not fix

# Per kernel id: whether a table's owner runs its tasks (`native`) and may batch them (`batches`:
# driver_streams.py), how many scalars it takes
# (a task with other counts goes to Python, which names the fault; ANY_SCALARS: any count), and
# which of them pick its instance.
KERNEL_INFO = np.dtype([
    ("native", np.int64),
    ("batches", np.int64),  # consecutive independent tasks of one instance may be one launch
    ("scalars", np.int64),
    ("structural", np.int64, (MAX_SCALARS,)),
    ("transfer", np.int64),  # kernel.SEND or RECEIVE: posted through MPI (native.py), not called
], align=True)


def cuda_kernel_info(kernels: list, runs_library: Callable[[object], bool]) -> np.ndarray:
    """KERNEL_INFO of the kernels whose tasks a CUDA driver's executors issue from the argument
    tables: those with CUDA code that is not a library call (`runs_library`: CuPy's, on a GPU).
    Their scalar counts are the code's to check."""
    info = np.zeros(max(1, len(kernels)), KERNEL_INFO)
    info["scalars"] = ANY_SCALARS
    for kernel in kernels:
        cuda = kernel.cuda
        if cuda is None or runs_library(kernel):
            continue
        info[kernel.id]["native"] = 1
        info[kernel.id]["batches"] = cuda.batches
        structural = getattr(cuda, "structural", ())  # CudaInstances: None is every scalar
        if structural is None:
            info[kernel.id]["structural"][:] = 1
        else:
            info[kernel.id]["structural"][list(structural)] = 1
    return info


@njit(cache=True, _nrt=False, inline="always")
def instance_key(tasks, kernel_info, args, window, task_id, key):
    """Write the instance key of a task whose arguments are in `args` to `key`; False when it
    has none (more dims than any generated kernel takes, or scalars other than the kernel's).
    Whether each tensor is written is part of it: the Python way gives an input a read-only
    view, so a kernel that writes one fails there, and an entry learnt from an output must not
    run it. Each tensor's element type is (a kernel of mixed types compiles per combination)."""
    slot = task_id & (window - 1)
    kernel = tasks[slot].kernel
    expected = kernel_info[kernel].scalars
    if expected != ANY_SCALARS and args.count[slot, 1] != expected:
        return False
    key[:] = 0
    key[0] = kernel
    n = args.count[slot, 0]
    scalars = 3 + 4 * n  # where the scalars' words start, after the tensors'
    key[1] = scalars + 2 * args.count[slot, 1]  # the words in use (find reads no more)
    key[2] = n
    for p in range(n):
        ndim = args.desc[slot, p, D_NDIM]
        if ndim > 3:
            return False
        key[3 + 4 * p] = ndim + 4 * (args.kind[slot, p] != cs.INPUT) + 8 * args.desc[slot, p, D_DTYPE]
        for d in range(ndim):
            key[4 + 4 * p + d] = args.desc[slot, p, D_SHAPE + d]
    for k in range(args.count[slot, 1]):
        kind = args.scalar_kind[slot, k]
        key[scalars + 2 * k] = 1 + kind  # an int and a float may pick different code
        if kernel_info[kernel].structural[k]:
            key[scalars + 2 * k + 1] = args.int[slot, k] if kind == S_INT else args.float_bits[slot, k]
    return True


@njit(cache=True, _nrt=False, inline="always")
def tables_key(tasks, kernel_info, args, window, task_id, key):
    """Whether a task's arguments are in the run's tables `args` and its kernel's tasks are
    issued from them (kernel_info's `native`), its instance key written to `key` (False where
    it has none)."""
    slot = task_id & (window - 1)
    kernel = tasks[slot].kernel
    if args.task[slot] != task_id or kernel >= len(kernel_info) or not kernel_info[kernel].native:
        return False
    return instance_key(tasks, kernel_info, args, window, task_id, key)


@njit(cache=True, _nrt=False, inline="always")
def takes_more(filled):
    """Whether an instance table may take another key: at most half full, so probes stay short."""
    count = 0
    for i in range(len(filled)):
        count += filled[i] != 0
    return 2 * count < len(filled)


@njit(cache=True, _nrt=False, inline="always")
def find(keys, filled, key):
    """The table slot holding `key`, or the empty slot where it would go (`filled[slot]` is 0
    where a slot is empty). Only the words in use (key[1]) are hashed and compared: a matmul
    product's 15 of KEY_WIDTH's 83, which took ~0.1 us of every native task, under the core's
    lock."""
    mask = len(filled) - 1
    used = key[1]
    hashed = np.uint64(14695981039346656037)
    for i in range(used):
        hashed = (hashed ^ np.uint64(key[i])) * np.uint64(1099511628211)
    slot = np.int64(hashed >> np.uint64(1)) & mask
    while filled[slot] != 0:
        same = True
        for i in range(used):  # key[1] among them: a longer key differs there
            if keys[slot, i] != key[i]:
                same = False
                break
        if same:
            return slot
        slot = (slot + 1) & mask
    return slot
