"""How error messages quote a statement: `TADD %y, %x, %w`, `FOR %i, 0, %n, 1`."""

from __future__ import annotations

from .ir import Alloc, Call, For, If, Op, Predicate, Return, Split, Statement, View


def _text(value: object) -> str:
    if isinstance(value, str):
        return f"%{value}"
    if isinstance(value, Predicate):
        return value.value
    return repr(value)


def describe(statement: Statement) -> str:
    """An instruction as error messages quote it: `TADD %y, %x, %w`, `FOR %i, 0, %n, 1`."""
    if isinstance(statement, Op):
        return f"{statement.opcode} " + ", ".join(_text(v) for v in (statement.dst, *statement.srcs))
    if isinstance(statement, For):
        return "FOR " + ", ".join(_text(v) for v in (statement.var, statement.start, statement.stop,
                                                      statement.step))
    if isinstance(statement, If):
        return f"IF {_text(statement.lhs)} {_text(statement.predicate)} {_text(statement.rhs)}"
    if isinstance(statement, Call):
        args = [f"%{param} -> %{arg.tensor}" + (f"[{_text(arg.row)}, {_text(arg.col)}]" if arg.windowed
                                                  else "")
                for param, arg in statement.args]
        args += [f"%{param} = {_text(value)}" for param, value in statement.scalars]
        return f"CALL @{statement.callee}({', '.join(args)})"
    if isinstance(statement, Return):
        return "RETURN"
    if isinstance(statement, Alloc):
        owner = "" if statement.owner is None else f" OWNER %{statement.owner}"
        return f"%{statement.dst} = ALLOC [{', '.join(_text(v) for v in statement.shape)}]{owner}"
    if isinstance(statement, View):
        dims = [":" if s is None else f"{_text(s[0])}:{_text(s[1])}" for s in statement.slices]
        return f"%{statement.dst} = VIEW %{statement.src}[{', '.join(dims)}]"
    if isinstance(statement, Split):
        return f"%{statement.dst} = SPLIT %{statement.src}, {_text(statement.groups)}"
    return repr(statement)
