"""The core's entries for Python callers, with the tables passed by address.

A call from Python into numba code unboxes every array argument (~30 ns each). The core's
tables are eight arrays, and a Python-level submit enters the core twice, to submit and to
complete: a tenth of its time went to unboxing. These entries take one int64 array
instead, `CoreState.addresses` (every table's address and length, remade whenever one is
replaced), and make the tables from it; the arrays stay the CoreState's, which outlive every call.
"""

from __future__ import annotations

import numpy as np
from numba import njit, typeof, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from . import state as cs
from .complete import complete, start
from .submit import submit

# The types of CoreState's tables, which `_table` makes: so the core runs the code it compiled for them.
_HEADER, _TASKS, _BUFFERS, _DEPS, _ENTRIES, _BUCKETS = (typeof(cs.aligned_table(1, dtype)) for dtype in (
    cs.HEADER, cs.TASK, cs.BUFFER, cs.DEP, cs.ENTRY, cs.BUCKET))
_SCRATCH = typeof(np.zeros(1, np.int64))


@intrinsic
def _table(typingctx, at, index, array_type):
    """Table `index` of the addresses `at` (CoreState.addresses): the 1-d C-contiguous array of
    `array_type` (a type) at at[2 * index], of at[2 * index + 1] rows."""
    addresses = isinstance(at, types.Array) and at.ndim == 1 and at.layout == "C" and at.dtype == types.int64
    if not (addresses and isinstance(array_type, types.TypeRef) and isinstance(index, types.IntegerLiteral)):
        return None
    made = array_type.instance_type
    position = 2 * index.literal_value

    def codegen(context, builder, signature, args):
        at_array = context.make_array(signature.args[0])(context, builder, args[0])
        address, length = (builder.load(cgutils.gep(builder, at_array.data, position + k)) for k in (0, 1))
        array = context.make_array(made)(context, builder)
        row_type = context.get_data_type(made.dtype)
        row_bytes = context.get_constant(types.intp, context.get_abi_sizeof(row_type))
        populate_array(array, data=builder.inttoptr(address, row_type.as_pointer()), shape=[length],
                       strides=[row_bytes], itemsize=row_bytes, meminfo=None)
        return array._getvalue()

    return made(at, index, array_type), codegen


@njit(cache=True, _nrt=False)
def submit_at(at, kernel_id, worker, params):
    """core.submit.submit over the tables at `at`."""
    return submit(_table(at, 0, _HEADER), _table(at, 1, _TASKS), _table(at, 2, _BUFFERS),
                  _table(at, 3, _DEPS), _table(at, 4, _ENTRIES), _table(at, 5, _BUCKETS),
                  _table(at, 6, _SCRATCH), _table(at, 7, _SCRATCH), kernel_id, worker, params)


@njit(cache=True, _nrt=False)
def complete_at(at, task_id, ready):
    """core.complete.complete over the tables at `at`."""
    return complete(_table(at, 0, _HEADER), _table(at, 1, _TASKS), _table(at, 2, _BUFFERS),
                    _table(at, 3, _DEPS), task_id, ready)


@njit(cache=True, _nrt=False)
def start_at(at, task_id):
    """core.complete.start over the tables at `at`."""
    start(_table(at, 0, _HEADER), _table(at, 1, _TASKS), task_id)
