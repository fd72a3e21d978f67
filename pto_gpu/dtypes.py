"""Element types and worker classes: the enums of the public contract and their numpy mapping."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from .errors import PTOError


class DataType(enum.IntEnum):
    """The spec's nine element types, plus FLOAT64 for numpy users and references and BOOL
    for masks. New types go last: compiled orchestrations pass these codes."""

    FLOAT32 = 0
    FLOAT16 = 1
    INT32 = 2
    INT16 = 3
    INT8 = 4
    UINT8 = 5
    BFLOAT16 = 6
    INT64 = 7
    UINT64 = 8
    FLOAT64 = 9
    BOOL = 10

    @property
    def itemsize(self) -> int:
        return _NUMPY[self].itemsize

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]


_NUMPY = {
    DataType.FLOAT32: np.dtype(np.float32),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.INT64: np.dtype(np.int64),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.FLOAT64: np.dtype(np.float64),
    DataType.BOOL: np.dtype(np.bool_),
}
_FROM_NUMPY = {dt: pto for pto, dt in _NUMPY.items()}


def element_size(dtype: DataType) -> int:
    """Bytes per element (spec 002 #4, `get_element_size`)."""
    return as_dtype(dtype).itemsize


def as_dtype(value: object) -> DataType:
    """A DataType from a DataType, a numpy dtype or a numpy type; anything else is refused."""
    if isinstance(value, DataType):
        return value
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise PTOError(f"unknown dtype {value!r}; pto-gpu supports {_SUPPORTED}") from None
    found = _FROM_NUMPY.get(dtype)
    if found is None:
        if dtype.kind == "c":
            raise PTOError(f"complex dtypes ({dtype}) are not supported; pass the real and imaginary parts "
                           f"as two real arrays (a.real, a.imag). pto-gpu supports {_SUPPORTED}")
        raise PTOError(f"unknown dtype {value!r}; pto-gpu supports {_SUPPORTED}")
    return found


_SUPPORTED = ", ".join(d.name for d in DataType)


class WorkerType(enum.IntEnum):
    """Worker classes; each has its own ready queue and pool of workers."""

    CUBE = 0
    VECTOR = 1
    AI_CPU = 2
    ACCELERATOR = 3


NUM_WORKER_TYPES = len(WorkerType)
