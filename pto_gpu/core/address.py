"""Memory that compiled code finds by address.

Native entries view their tensors from descriptors' addresses (native_abi.py: `void_pointer`
for numba.carray), and compiled placement a distributed run's holdings tables from addresses
the session notes (jit/placing.py: `array_at`, since code compiled without numba's runtime
cannot call carray).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array


@intrinsic
def void_pointer(typingctx, address):
    """An integer address as a pointer, for numba.carray."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(address), codegen


@intrinsic
def array_at(typingctx, address, length, dtype):
    """The 1-d array of `length` elements of `dtype` (np.int8, say) at an integer address: a
    view that owns nothing, whose memory must outlive it."""
    if not (isinstance(address, types.Integer) and isinstance(length, types.Integer)
            and isinstance(dtype, types.NumberClass)):
        return None
    made = types.Array(dtype.instance_type, 1, "C")

    def codegen(context, builder, signature, args):
        array = context.make_array(made)(context, builder)
        item = context.get_data_type(made.dtype)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(item))
        count = context.cast(builder, args[1], signature.args[1], types.intp)
        populate_array(array, data=builder.inttoptr(args[0], item.as_pointer()), shape=[count],
                       strides=[itemsize], itemsize=itemsize, meminfo=None)
        return array._getvalue()

    return made(address, length, dtype), codegen
