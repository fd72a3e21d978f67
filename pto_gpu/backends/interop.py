"""Callers' arrays from any array library, taken in place as externals.

Each backend imports an array into its own type without copying: numpy on the CPU (numpy
arrays, `__array_interface__`, host DLPack), CuPy on CUDA (`__cuda_array_interface__`, CUDA
DLPack). What does not depend on the backend is here: which DLPack device an array is on,
the bytes a strided array spans, the allocation a PyTorch tensor's views share, DLPack's
read-only flag, and the error for an array on the other side of the bus.
"""

from __future__ import annotations

import ctypes

from ..errors import PTOError

DL_CPU, DL_CUDA, DL_ROCM = 1, 2, 10  # DLPack's DLDeviceType codes
DL_DEVICE_MEMORY = (DL_CUDA, DL_ROCM)
DL_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_FLAGS_OFFSET = 24  # DLManagedTensorVersioned: version (2 x u32), manager_ctx, deleter, then flags

_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes, _capsule_valid.restype = (ctypes.py_object, ctypes.c_char_p), ctypes.c_int
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes, _capsule_pointer.restype = (ctypes.py_object, ctypes.c_char_p), ctypes.c_void_p


def dlpack_device(array: object) -> int | None:
    """The DLPack device type of an array that exports DLPack; None for one that does not."""
    if not (hasattr(array, "__dlpack__") and hasattr(array, "__dlpack_device__")):
        return None
    return int(array.__dlpack_device__()[0])


def on_device(array: object) -> bool:
    """Whether an array says it lives in GPU memory."""
    device = dlpack_device(array)
    return device in DL_DEVICE_MEMORY if device is not None else hasattr(array, "__cuda_array_interface__")


def extent(data: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """[first byte, one past the last byte) of a strided array whose element [0, ..., 0] is at `data`."""
    if 0 in shape:
        return data, data
    low = data + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = data + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + itemsize
    return low, high


def torch_storage(array: object) -> tuple[int, int] | None:
    """[first byte, one past the last byte) of the storage a PyTorch tensor views, which all
    its views share (as numpy views share their base), as `extent` gives; None for anything
    else."""
    if not type(array).__module__.startswith("torch") or not hasattr(array, "untyped_storage"):
        return None
    storage = array.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def dlpack_read_only(capsule: object) -> bool:
    """Whether a DLPack capsule's producer marked the memory read-only. Only DLPack 1.0's
    versioned capsules carry flags; an unversioned one says nothing, so it is writeable."""
    name = b"dltensor_versioned"
    if not _capsule_valid(capsule, name):
        return False
    flags = ctypes.c_uint64.from_address(_capsule_pointer(capsule, name) + _FLAGS_OFFSET).value
    return bool(flags & DL_READ_ONLY)


def wrong_side(array: object, backend: str) -> PTOError:
    """The error for a host array on the CUDA backend or a GPU array on the CPU backend."""
    kind = type(array).__name__
    if backend == "cpu":
        return PTOError(f"o.external() got a GPU array ({kind}) on the CPU backend; copy it to the host "
                        "(cupy.asnumpy(a), t.cpu()) or use backend='cuda'")
    return PTOError(f"o.external() got a host array ({kind}) on the CUDA backend; move it to the GPU first "
                    "(rt.backend.to_device(a), cupy.asarray(a), t.cuda()) or use backend='cpu'")
