"""Task params: a tensor with its direction (input, output, inout) or a scalar."""

from __future__ import annotations

import dataclasses
import enum
import numbers

import numpy as np

from .errors import ParamError
from .tensor import TensorDescriptor


class ParamKind(enum.IntEnum):
    INPUT = 0  # values match the core's INPUT / OUTPUT / INOUT
    OUTPUT = 1
    INOUT = 2
    SCALAR = 3


# A value: made by pto.input/output/inout/scalar and not changed after. Not frozen, because a
# frozen dataclass sets its fields through object.__setattr__: 300 ns a param against 115, and
# the two params of a Python-level submit were a tenth of its 5.8 µs. Hashable as before.
@dataclasses.dataclass(slots=True, unsafe_hash=True)
class Param:
    kind: ParamKind
    value: object

    @property
    def reads(self) -> bool:
        return self.kind in _READING  # a set's hash lookup: a tuple's compares enums, several times slower

    @property
    def writes(self) -> bool:
        return self.kind in _WRITING


_READING = frozenset((ParamKind.INPUT, ParamKind.INOUT))
_WRITING = frozenset((ParamKind.OUTPUT, ParamKind.INOUT))


def _tensor_param(kind: ParamKind, tensor: object) -> Param:
    if not isinstance(tensor, TensorDescriptor):
        raise ParamError(
            f"pto.{kind.name.lower()}() takes a tensor from o.external() or o.alloc(), "
            f"not {type(tensor).__name__}"
        )
    return Param(kind, tensor)


def input(tensor: TensorDescriptor) -> Param:  # noqa: A001 - the contract's name
    return _tensor_param(ParamKind.INPUT, tensor)


def output(tensor: TensorDescriptor) -> Param:
    return _tensor_param(ParamKind.OUTPUT, tensor)


def inout(tensor: TensorDescriptor) -> Param:
    return _tensor_param(ParamKind.INOUT, tensor)


def scalar(value: numbers.Number) -> Param:
    if not isinstance(value, numbers.Number):
        raise ParamError(f"pto.scalar() takes a number, not {type(value).__name__}")
    return Param(ParamKind.SCALAR, _real(value, "pto.scalar()"))


def _real(value: numbers.Number, what: object) -> numbers.Number:
    """A scalar as kernels take it: a real number; one of Python's other kinds (a Fraction, say)
    as the int or float it equals, which every kernel's code takes. A complex one is refused:
    no kernel takes it, and a conversion would drop its imaginary part."""
    if type(value) in _PLAIN_NUMBERS or isinstance(value, (bool, np.integer, np.floating)):
        return value
    if not isinstance(value, numbers.Real):
        where = what if isinstance(what, str) else f"param {what}"
        raise ParamError(f"{where} is the {type(value).__name__} scalar {value!r}; kernels take real "
                         "numbers (an int or a float)")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def as_param(value: object, position: int) -> Param:
    """A submit argument as a Param; plain numbers are scalars, anything else is refused."""
    if type(value) in _PLAIN_NUMBERS:  # before the ABC's isinstance, which costs ~0.5 µs a scalar
        return Param(ParamKind.SCALAR, value)
    if isinstance(value, Param):
        return value
    if isinstance(value, numbers.Number):
        return Param(ParamKind.SCALAR, _real(value, position))
    if isinstance(value, TensorDescriptor):
        raise ParamError(f"param {position} is a tensor without a direction: "
                         "wrap it in pto.input(), pto.output() or pto.inout()")
    raise ParamError(f"param {position} is a {type(value).__module__}.{type(value).__name__}; "
                     "pass arrays through o.external() and wrap them in pto.input/output/inout")


_PLAIN_NUMBERS = frozenset((int, float))


def core_rows(params: tuple[Param, ...], rows: np.ndarray) -> np.ndarray:
    """The rows the core takes for a task's tensor params (TensorDescriptor.param_row: its
    layout row, then its kind), written into the first rows of `rows` (PARAM_WIDTH wide, C
    order); those rows."""
    tensors = [p for p in params if p.kind != ParamKind.SCALAR]
    row_bytes = memoryview(rows).cast("B")
    width = rows.shape[1] * rows.itemsize
    for i, p in enumerate(tensors):
        row_bytes[i * width:(i + 1) * width] = p.value.param_row(p.kind)
    return rows[:len(tensors)]
