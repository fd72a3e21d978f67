"""The operands each instruction form takes, destination first: what the verifier checks
(verify.py) and what the builder's generated methods take (builder.py)."""

from __future__ import annotations

import dataclasses
import enum

from .ops import Form, OpSpec


class Kind(enum.Enum):
    """What an operand position accepts."""

    TILE = "tile"
    MEMREF = "memref"
    INDEX = "integer"  # an int immediate, or an integer scalar or loop variable
    VALUE = "value"  # a number, or any scalar or loop variable
    IMMEDIATE = "immediate"
    PREDICATE = "predicate"
    LOCAL = "local scalar"  # a scalar destination


@dataclasses.dataclass(frozen=True)
class Operand:
    """One operand of an instruction, destination first: its builder parameter name, what it
    accepts and, for optional ones, the default."""

    name: str
    kind: Kind
    default: int | None = None


def _operands(*spec: tuple) -> tuple[Operand, ...]:
    return tuple(Operand(*entry) for entry in spec)


_T, _M, _I, _V = Kind.TILE, Kind.MEMREF, Kind.INDEX, Kind.VALUE
_SIGNATURES = {
    Form.LOAD: _operands(("tile", _T), ("memref", _M), ("row", _I, 0), ("col", _I, 0)),
    Form.STORE: _operands(("memref", _M), ("tile", _T), ("row", _I, 0), ("col", _I, 0)),
    Form.UNARY: _operands(("dst", _T), ("a", _T)),
    Form.CONVERT: _operands(("dst", _T), ("a", _T)),
    Form.BINARY: _operands(("dst", _T), ("a", _T), ("b", _T)),
    Form.TILE_SCALAR: _operands(("dst", _T), ("a", _T), ("s", _V)),
    Form.ROW_REDUCE: _operands(("dst", _T), ("a", _T)),
    Form.COL_REDUCE: _operands(("dst", _T), ("a", _T)),
    Form.ROW_EXPAND: _operands(("dst", _T), ("a", _T), ("b", _T)),
    Form.COL_EXPAND: _operands(("dst", _T), ("a", _T), ("b", _T)),
    Form.MATMUL: _operands(("dst", _T), ("a", _T), ("b", _T)),
    Form.MASK: _operands(("dst", _T), ("a", _T), ("row", _I), ("col", _I)),
    Form.GENERATE: _operands(("dst", _T), ("s", _V)),
    Form.TRANSPOSE: _operands(("dst", _T), ("a", _T)),
    Form.SCALAR: _operands(("dst", Kind.LOCAL), ("a", _V), ("b", _V)),
    Form.COMPARE: _operands(("dst", Kind.LOCAL), ("a", _V), ("b", _V), ("predicate", Kind.PREDICATE)),
    Form.DIM: _operands(("dst", Kind.LOCAL), ("memref", _M), ("axis", Kind.IMMEDIATE)),
}
_LOAD_IMMEDIATE = _operands(("dst", Kind.LOCAL), ("value", Kind.IMMEDIATE))


def signature(spec: OpSpec) -> tuple[Operand, ...]:
    """The operands of an instruction, destination first (the builder's parameter order)."""
    # The SCALAR form's one entry without numpy semantics is SLI, which loads an immediate.
    if spec.form is Form.SCALAR and spec.reference is None:
        return _LOAD_IMMEDIATE
    return _SIGNATURES[spec.form]
