"""The compiler's one error type."""

from __future__ import annotations

from ..errors import PTOError


class ISAError(PTOError):
    """A malformed PTO program: the message names the function and the instruction (and, from
    the parser, the line and column). `statement`: the verifier's, the statement it refused
    (the parser turns it into its line and column)."""

    statement: object | None = None
