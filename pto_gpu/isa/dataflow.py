"""The directions of a function's memrefs, inferred from their uses: a memref an InCore
function (with its inlined callees) only loads is an input, only stores is an output, both is
inout; an Orchestration's memrefs take the directions of the callee parameters they are passed
to, through views of views (`tensor_roots`)."""

from __future__ import annotations

from .describe import describe
from .errors import ISAError
from .ir import Call, Direction, Function, Module, Op, Split, View, walk


def directions(function: Function, module: Module | None = None) -> dict[str, Direction]:
    """The direction of each memref, in declaration order, inferred from loads, stores and
    calls (callees resolved in `module`)."""
    access = _Access(module, resolve_all=True).of(function)
    return {m.name: _DIRECTION[access[m.name]] for m in function.memrefs}


_READ, _WRITE, _UNKNOWN = 1, 2, 4
_DIRECTION = {_READ: Direction.INPUT, _WRITE: Direction.OUTPUT, _READ | _WRITE: Direction.INOUT}
_BITS = {direction: bits for bits, direction in _DIRECTION.items()}


def check_uses(function: Function, module: Module | None, resolve_all: bool) -> None:
    """Refuse a memref with no load, store or call: it has no direction. With resolve_all False,
    a memref passed to a callee not in the module counts as used."""
    _Access(module, resolve_all).of(function)


class _Access:
    """Read/write bits per memref. With resolve_all False, a memref passed to a callee not in
    the module is marked _UNKNOWN (used, direction not yet known) instead of an error."""

    def __init__(self, module: Module | None, resolve_all: bool):
        self.module, self.resolve_all = module, resolve_all
        self.done: dict[str, dict[str, int]] = {}
        self.active: list[str] = []

    def of(self, function: Function) -> dict[str, int]:
        if function.name in self.done:
            return self.done[function.name]
        if function.library is not None:
            bits = {m.name: _BITS.get(m.direction, 0) for m in function.memrefs}
            self.done[function.name] = bits
            return bits
        self.active.append(function.name)
        bits = {m.name: 0 for m in function.memrefs}
        roots = tensor_roots(function)
        for statement in walk(function.body):
            if isinstance(statement, Op) and statement.opcode == "TLOAD" and statement.srcs:
                self._mark(bits, statement.srcs[0], _READ)
            elif isinstance(statement, Op) and statement.opcode == "TSTORE":
                self._mark(bits, statement.dst, _WRITE)
            elif isinstance(statement, Call):
                self._call(function, statement, bits, roots)
        self.active.pop()
        unused = next((m for m in function.memrefs if not bits[m.name]), None)
        if unused is not None:
            how = "loaded nor stored" if function.in_core else "passed to a call"
            raise ISAError(f"@{function.name}: memref %{unused.name}: neither {how}, so it has no "
                           "direction (directions are inferred from its uses)")
        self.done[function.name] = bits
        return bits

    def _mark(self, bits: dict[str, int], name: object, bit: int) -> None:
        if name in bits:
            bits[name] |= bit

    def _call(self, caller: Function, call: Call, bits: dict[str, int], roots: dict[str, str]) -> None:
        callee = self.module.functions.get(call.callee) if self.module is not None else None
        if callee is None:
            if self.resolve_all:
                raise ISAError(f"@{caller.name}: {describe(call)}: unknown function @{call.callee}")
            for _, arg in call.args:
                self._mark(bits, roots.get(arg.tensor, arg.tensor), _UNKNOWN)
            return
        if callee.name in self.active:
            cycle = " -> ".join(f"@{name}" for name in [*self.active, callee.name])
            raise ISAError(f"@{caller.name}: {describe(call)}: recursive call: {cycle}")
        callee_bits = self.of(callee)
        for param, arg in call.args:  # a view passes on the direction to what it views
            self._mark(bits, roots.get(arg.tensor, arg.tensor), callee_bits.get(param, 0))


def tensor_roots(function: Function) -> dict[str, str]:
    """Each local tensor of an Orchestration: the tensor it is a view of, through views of
    views (a memref parameter or an allocated local); an allocated local is its own root."""
    sources = {s.dst: s.src for s in walk(function.body) if isinstance(s, View | Split)}
    roots = {}
    for tensor in function.tensors:
        root, seen = tensor.name, set()
        while root in sources and root not in seen:  # the verifier refuses cycles; don't loop on them
            seen.add(root)
            root = sources[root]
        roots[tensor.name] = root
    return roots
