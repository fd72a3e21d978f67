"""Launch records and the native issue path of the CUDA backend.

A kernel instance's launch is prepared once (`Template`: its CUfunction, grid, block, shared
memory and its argument words, each task's own words left blank: its tensors' pointers and its
scalars); a task's launch fills those in and goes out through `issue`, an nogil numba function
that calls the CUDA driver (`cuStreamWaitEvent` for each producer on another stream,
`cuLaunchKernel`, `cuEventRecord`) through function pointers taken once from the driver
library: libcuda on a GPU, the emulator (backends/emulator.py) without one. No CuPy object,
view or Python list per task; numba calls a function pointer in a few ns, so the driver's own
cost is what is left.

Every argument of the generated kernels is one 8-byte word (backends/cuda_abi.py: a pointer,
sizes and strides as long long, scalars as long long or double), so a launch's arguments are
an int64 row and kernelParams is the row's word addresses.

`cpu_code` is the emulator's other way to run a launch (emulate="cpu-code"): a C-callable
adaptor that reads the same argument words and calls the kernel instance's CPU native entry
(pto_gpu/native_abi.py), so scheduling runs at CPU-code speed while the words are still the ones
the launch carries.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from ..core.state import MAX_PARAMS
from ..dtypes import as_dtype
from ..jit.context import MAX_SCALARS, S_FLOAT, S_INT
from ..jit.descriptor import D_BASE, D_DTYPE, D_ITEMSIZE, D_NDIM, D_OFFSET, D_SHAPE, D_STRIDE, DESC_WIDTH
from ..kernel import CudaCode, Kernel
from ..native_call import call_entry
from . import cuda_abi

# The driver functions numba code calls (`issue`, executors/driver_streams.py), by their index
# in a driver's address table, and cuBLAS's GEMM (backends/cublas.py), whose address the
# backend enters there when it first makes a GEMM's launch.
CALLS = ("cuLaunchKernel", "cuEventRecord", "cuStreamWaitEvent", "cuEventQuery", "cublasGemmStridedBatchedEx")
LAUNCH, RECORD, WAIT, QUERY, GEMM = range(len(CALLS))
TENSOR_WORDS = 1 + 2 * cuda_abi.MAX_DIMS  # a pointer, the sizes, the element strides
MAX_WORDS = TENSOR_WORDS * MAX_PARAMS + MAX_SCALARS

GEMM_CALL = np.dtype([  # an instance's cuBLAS GEMM (backends/cublas.py), in cuBLAS's column-major terms
    ("batch", np.int64),  # products in the call; 0: the instance is a kernel launch, not a GEMM
    ("m", np.int64),  # rows of cuBLAS's C: the columns of the product
    ("n", np.int64),  # its columns: the rows of the product
    ("k", np.int64),
    ("a_word", np.int64),  # where cuBLAS's A pointer (the right operand's) is in the launch's words
    ("b_word", np.int64),  # cuBLAS's B: the left operand
    ("c_word", np.int64),
    ("lda", np.int64),
    ("ldb", np.int64),
    ("ldc", np.int64),
    ("stride_a", np.int64),  # elements between a batch's matrices
    ("stride_b", np.int64),
    ("stride_c", np.int64),
    ("data_type", np.int64),  # cudaDataType of A, B and C
    ("compute_type", np.int64),  # cublasComputeType_t
    ("alpha", np.int64),  # the addresses of alpha and beta, host memory in the compute type
    ("beta", np.int64),
], align=True)


@dataclasses.dataclass(frozen=True)
class Template:
    """One kernel instance's launch over tensors of given shapes, strides and element types:
    what the instance's tasks share. A task's own words (its tensors' pointers and its scalars,
    in param order) go in at `task_words`."""

    function: int  # the CUfunction
    grid: int
    block: int
    shared: int  # dynamic shared memory, bytes
    words: np.ndarray  # int64: the argument words, the task's own left 0
    task_words: np.ndarray  # int64: where the task's own words go in `words`, in param order
    scalar_slots: tuple[int, ...]  # which of the task's own words are scalars
    integer_scalars: tuple[bool, ...]  # each scalar's word: long long (True) or double
    # A cuBLAS GEMM instead of the kernel (one GEMM_CALL record; batch 0: the kernel), whose
    # pointers are the words' tensor pointers.
    gemm: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1, GEMM_CALL))


# The launch of an instance with no work items: its tasks only wait and record.
NO_WORK = Template(0, 0, 0, 0, np.zeros(0, np.int64), np.zeros(0, np.int64), (), ())


def template(function: int, grid: int, block: int, layout: list, integer_scalars: tuple[bool, ...],
             shared: int = 0) -> Template:
    """The template of a launch whose params are `layout`, in order: (shape, byte strides,
    itemsize) for a tensor, None for a scalar (of the types `integer_scalars` says), giving a
    block `shared` bytes of dynamic shared memory."""
    words: list[int] = []
    task_words = []
    scalar_slots = []
    for param in layout:
        task_words.append(len(words))
        if param is None:
            scalar_slots.append(len(task_words) - 1)
            words.append(0)
        else:
            shape, byte_strides, itemsize = param
            words += [0, *(int(w) for w in cuda_abi.tensor_words(shape, byte_strides, itemsize))]
    if len(words) > MAX_WORDS:
        raise ValueError(f"a launch of {len(words)} argument words; at most {MAX_WORDS}")
    return Template(function, grid, block, shared=shared, words=np.array(words, np.int64),
                    task_words=np.array(task_words, np.int64), scalar_slots=tuple(scalar_slots),
                    integer_scalars=integer_scalars)


def scalar_bits(value: object, integer: bool) -> int:
    """A scalar's argument word as an int64: its long long, or its double bit for bit."""
    return int(value) if integer else _DOUBLE_BITS.unpack(_DOUBLE.pack(float(value)))[0]


_DOUBLE, _DOUBLE_BITS = struct.Struct("<d"), struct.Struct("<q")


def instance_scalars(kernel: Kernel, scalars: tuple) -> tuple:
    """What of a call's scalars picks its code and its launch's word types: each one's kind,
    and the values of those that pick a kernel family's instance. The other values are each
    task's own words."""
    kinds = tuple(map(cuda_abi.is_integer, scalars))
    cuda = kernel.cuda
    if isinstance(cuda, CudaCode):  # one code, whatever the values
        return kinds
    picked = scalars if cuda.structural is None else tuple(scalars[i] for i in cuda.structural)
    return (*kinds, *picked)


@njit(cache=True, _nrt=False, inline="always")
def task_words(words, args, slot, integer, double, bits):
    """A task's launch argument words from its arguments in the run's tables (slot `slot` of
    `args`), into `words`: per tensor its pointer, three sizes and three element strides
    (leading dims padded, as `template` pads them), then each scalar as its kernel takes it
    (`integer[k]`: long long, else double). `double` is one float64 whose int64 view is `bits`.
    How many words it wrote."""
    w = 0
    for p in range(args.count[slot, 0]):
        ndim = args.desc[slot, p, D_NDIM]
        pad = 3 - ndim
        words[w] = args.desc[slot, p, D_BASE] + args.desc[slot, p, D_OFFSET]
        for k in range(3):
            words[w + 1 + k] = 1 if k < pad else args.desc[slot, p, D_SHAPE + k - pad]
            words[w + 4 + k] = 0 if k < pad else args.desc[slot, p, D_STRIDE + k - pad]
        w += TENSOR_WORDS
    for k in range(args.count[slot, 1]):
        is_int = args.scalar_kind[slot, k] == S_INT
        if integer[k]:
            words[w] = args.int[slot, k] if is_int else np.int64(args.float[slot, k])
        elif is_int:
            double[0] = np.float64(args.int[slot, k])
            words[w] = bits[0]
        else:
            words[w] = args.float_bits[slot, k]
        w += 1
    return w


class Scratch:
    """An issuing thread's argument row and its kernelParams (the row's word addresses):
    the driver copies the words at the launch, so one row serves every launch of a thread."""

    def __init__(self):
        self.words = np.zeros(MAX_WORDS, np.int64)
        self.params = self.words.ctypes.data + 8 * np.arange(MAX_WORDS, dtype=np.int64)
        self.failed = np.zeros(1, np.int64)  # which call of `issue` failed


# --- calling the driver by address -------------------------------------------------------------
def _pointer(builder, value):
    return builder.inttoptr(value, ir.IntType(8).as_pointer())


@intrinsic
def launch_kernel(typingctx, address, function, grid, block, shared, stream, params):
    """cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared, stream, params, NULL)."""
    def codegen(context, builder, signature, args):
        i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [i8p, i32, i32, i32, i32, i32, i32, i32, i8p, i8p, i8p])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        one = ir.Constant(i32, 1)
        narrow = [builder.trunc(a, i32) for a in (args[2], args[3], args[4])]
        return builder.call(callee, [_pointer(builder, args[1]), narrow[0], one, one, narrow[1], one, one,
                                     narrow[2], _pointer(builder, args[5]), _pointer(builder, args[6]),
                                     ir.Constant(i8p, None)])

    return types.int32(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                       types.int64), codegen


@intrinsic
def query_event(typingctx, address, event):
    """cuEventQuery(event)."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(8).as_pointer()])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(callee, [_pointer(builder, args[1])])

    return types.int32(types.int64, types.int64), codegen


@intrinsic
def record_event(typingctx, address, first, second):
    """cuEventRecord(event, stream)."""
    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [i8p, i8p])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(callee, [_pointer(builder, args[1]), _pointer(builder, args[2])])

    return types.int32(types.int64, types.int64, types.int64), codegen


@intrinsic
def wait_event(typingctx, address, stream, event):
    """cuStreamWaitEvent(stream, event, 0)."""
    def codegen(context, builder, signature, args):
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(i32, [i8p, i8p, i32])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(callee, [_pointer(builder, args[1]), _pointer(builder, args[2]),
                                     ir.Constant(i32, 0)])

    return types.int32(types.int64, types.int64, types.int64), codegen


@intrinsic
def gemm_strided_batched(typingctx, address, handle, m, n, k, alpha, a, data_type, lda, stride_a, b, ldb,
                         stride_b, beta, c, ldc, stride_c, batch, compute):
    """cublasGemmStridedBatchedEx(handle, N, N, m, n, k, alpha, a, data_type, lda, stride_a, b,
    data_type, ldb, stride_b, beta, c, data_type, ldc, stride_c, batch, compute,
    CUBLAS_GEMM_DEFAULT)."""
    def codegen(context, builder, signature, args):
        i32, i64, i8p = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [i8p, i32, i32, i32, i32, i32, i8p, i8p, i32, i32, i64, i8p, i32, i32,
                                     i64, i8p, i8p, i32, i32, i64, i32, i32, i32])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        (handle, m, n, k, alpha, a, data_type, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch,
         compute) = args[1:]

        def narrow(value):
            return builder.trunc(value, i32)

        no_transpose = ir.Constant(i32, 0)
        return builder.call(callee, [
            _pointer(builder, handle), no_transpose, no_transpose, narrow(m), narrow(n), narrow(k),
            _pointer(builder, alpha), _pointer(builder, a), narrow(data_type), narrow(lda), stride_a,
            _pointer(builder, b), narrow(data_type), narrow(ldb), stride_b, _pointer(builder, beta),
            _pointer(builder, c), narrow(data_type), narrow(ldc), stride_c, narrow(batch), narrow(compute),
            ir.Constant(i32, -1)])

    return types.int32(*[types.int64] * 19), codegen


@njit(nogil=True, cache=True, inline="always")
def start(driver, blas, function, grid, block, shared, gemm, stream, words, params):
    """A task's work on `stream`, its argument words in `words`: its instance's cuBLAS GEMM
    (gemm.batch != 0, through `blas`, the stream's handle) or its kernel's launch. The status,
    of the call that launches.CALLS[GEMM if gemm.batch else LAUNCH] names."""
    if gemm.batch != 0:
        return gemm_strided_batched(driver[GEMM], blas, gemm.m, gemm.n, gemm.k, gemm.alpha,
                                    words[gemm.a_word], gemm.data_type, gemm.lda, gemm.stride_a,
                                    words[gemm.b_word], gemm.ldb, gemm.stride_b, gemm.beta,
                                    words[gemm.c_word], gemm.ldc, gemm.stride_c, gemm.batch,
                                    gemm.compute_type)
    return launch_kernel(driver[LAUNCH], function, grid, block, shared, stream, params.ctypes.data)


@njit(nogil=True, cache=True)
def issue(driver, function, grid, block, shared, gemm, blas, stream, template_words, task_at, task_words,
          waits, began, event, words, params, failed):
    """Enqueue one task's work on `stream`: wait for each event in `waits`, record `began` (0:
    none; a timed launch's start), launch `function` (or make the GEMM call `gemm[0]` through
    the stream's cuBLAS handle `blas`) over `template_words` with `task_words` filled in at
    `task_at`, then record `event` (0: none). Returns the first status that is not 0, and which
    call it was in failed[0]; else 0."""
    for i in range(waits.size):
        status = wait_event(driver[WAIT], stream, waits[i])
        if status != 0:
            failed[0] = WAIT
            return status
    if began != 0:
        status = record_event(driver[RECORD], began, stream)
        if status != 0:
            failed[0] = RECORD
            return status
    n = template_words.size
    words[:n] = template_words
    for i in range(task_at.size):
        words[task_at[i]] = task_words[i]
    status = start(driver, blas, function, grid, block, shared, gemm[0], stream, words, params)
    if status != 0:
        failed[0] = GEMM if gemm[0].batch != 0 else LAUNCH
        return status
    if event != 0:
        status = record_event(driver[RECORD], event, stream)
        if status != 0:
            failed[0] = RECORD
            return status
    return 0


# --- the emulator's CPU code ---------------------------------------------------------------------
# A cpu-code function's context: the native entry and its param count, then per param, in
# order, P_WIDTH columns: a tensor's dims (0 for a scalar), DataType and itemsize, or a
# scalar's kind (S_INT or S_FLOAT).
C_ENTRY, C_PARAMS, C_LAYOUT = range(3)
P_NDIM, P_DTYPE, P_ITEMSIZE, P_KIND = range(4)
P_WIDTH = 4
CONTEXT_WIDTH = C_LAYOUT + P_WIDTH * (MAX_PARAMS + MAX_SCALARS)


_U32P = types.CPointer(types.uint32)
_VOIDPP = types.CPointer(types.voidptr)
CPU_CODE_ENTRY = types.int32(_U32P, _U32P, types.uint32, _VOIDPP, types.voidptr)


@njit(inline="always")
def _word(params, i):
    """The 8-byte argument kernelParams[i] points at."""
    return carray(params[i], 1, np.int64)[0]


@cfunc(CPU_CODE_ENTRY, nopython=True, cache=True)
def cpu_code(grid, block, shared, params, context):
    """The emulator's entry for a launch of a kernel instance's CPU code: each tensor's words
    (pointer, three sizes, three element strides, padded with leading dims) back into a
    descriptor of its own dims, each scalar's word into the argument tables' form. A tensor of
    fewer than three dims whose padded leading size is more than 1 is a batch of them (a
    batched launch of several tasks: driver_streams.py), which the entry is called for one by
    one, as the GPU code walks it."""
    c = carray(context, CONTEXT_WIDTH, np.int64)
    descs = np.zeros(DESC_WIDTH * MAX_PARAMS, np.int64)
    kinds = np.zeros(MAX_SCALARS, np.int64)
    ints = np.zeros(MAX_SCALARS, np.int64)
    floats = np.zeros(MAX_SCALARS, np.float64)
    steps = np.zeros(MAX_PARAMS, np.int64)  # each tensor's bytes from one batch index to the next
    batch = 1
    w = 0  # the param's first word
    tensors = scalars = 0
    for p in range(c[C_PARAMS]):
        column = C_LAYOUT + p * P_WIDTH
        ndim = c[column + P_NDIM]
        if ndim == 0:
            kinds[scalars] = c[column + P_KIND]
            if kinds[scalars] == S_INT:
                ints[scalars] = _word(params, w)
            else:
                floats[scalars] = np.array([_word(params, w)]).view(np.float64)[0]
            scalars += 1
            w += 1
            continue
        d = tensors * DESC_WIDTH
        descs[d + D_BASE] = _word(params, w)
        descs[d + D_OFFSET] = 0
        descs[d + D_DTYPE] = c[column + P_DTYPE]
        descs[d + D_ITEMSIZE] = c[column + P_ITEMSIZE]
        descs[d + D_NDIM] = ndim
        for k in range(ndim):
            descs[d + D_SHAPE + k] = _word(params, w + 1 + cuda_abi.MAX_DIMS - ndim + k)
            descs[d + D_STRIDE + k] = _word(params, w + 4 + cuda_abi.MAX_DIMS - ndim + k)
        if ndim < cuda_abi.MAX_DIMS:
            batch = max(batch, _word(params, w + 1))
            steps[tensors] = _word(params, w + 4) * c[column + P_ITEMSIZE]
        tensors += 1
        w += TENSOR_WORDS
    status = 0
    for _ in range(batch):
        status = call_entry(c[C_ENTRY], descs.ctypes.data, kinds.ctypes.data, ints.ctypes.data,
                            floats.ctypes.data)
        if status != 0:
            break
        for k in range(tensors):
            descs[k * DESC_WIDTH + D_BASE] += steps[k]
    return np.int32(status)


def cpu_code_context(entry: int, layout: list, integer_scalars: tuple[bool, ...]) -> np.ndarray:
    """The context `cpu_code` reads for one instance, whose params are `layout` in order: a
    tensor's (dims, numpy dtype), or None for a scalar (kept alive by whoever registers it)."""
    context = np.zeros(CONTEXT_WIDTH, np.int64)
    context[C_ENTRY] = entry
    context[C_PARAMS] = len(layout)
    kinds = iter(integer_scalars)
    for p, param in enumerate(layout):
        column = C_LAYOUT + p * P_WIDTH
        if param is None:
            context[column + P_KIND] = S_INT if next(kinds) else S_FLOAT
        else:
            ndim, dtype = param
            context[column + P_NDIM] = ndim
            context[column + P_DTYPE] = int(as_dtype(dtype))
            context[column + P_ITEMSIZE] = np.dtype(dtype).itemsize
    return context
