"""Whether an InCore function may update in place: a task may pass one view both as a memref
the function loads and as one it stores (docs/DESIGN.md, "Params that share memory").

That holds when every element the function stores is computed from the loaded elements at the
same place, each loaded before any store could have changed it, on every backend: then the
order in which generated code reads and writes (by tiles on the CPU, by threads and blocks on
the GPU) cannot matter. The judgement is conservative (a "no" may be wrong, a "yes" never):

- one element type, and no instruction that moves an element to another place or combines
  several (reductions, broadcasts, products, transposes), no IF and no call;
- every TLOAD and TSTORE in one body (the function's, or its innermost FOR's), all at the same
  window operands, nothing but TSTOREs after the first TSTORE (CUDA's column blocks,
  isa/column_blocks.py, would start a pass there and load again what the stores changed), and
  every tile they and the instructions between them read written earlier in that body (so no
  value is carried from elsewhere);
- a window operand is a number, a loop variable or a scalar the function never sets, and each
  enclosing FOR's variable is one whose step is at least the extent of every tile loaded or
  stored along that axis, so no two iterations touch the same element.
"""

from __future__ import annotations

from ..sharing import Sharing
from .ir import For, Function, Op, Statement, walk
from .ops import OPCODES, Form

# Forms whose every element depends only on the element at the same place (and on scalars).
_SAME_PLACE = frozenset({Form.UNARY, Form.CONVERT, Form.BINARY, Form.TILE_SCALAR, Form.MASK,
                         Form.GENERATE, Form.SCALAR, Form.COMPARE, Form.DIM})


def sharing(*functions: Function) -> Sharing:
    """A kernel's Sharing from the functions its code is generated from: SAME_VIEW when every
    one updates in place, else NONE."""
    return Sharing.SAME_VIEW if all(map(updates_in_place, functions)) else Sharing.NONE


def updates_in_place(function: Function) -> bool:
    """Whether a task may pass one view as a memref `function` loads and as one it stores."""
    if len({m.dtype for m in function.memrefs}) > 1:
        return False
    found = _memory_body(function.body, ())
    if found is None:
        return False
    body, loops = found
    if body is None:
        return True  # no load or store at all
    return _one_pass(function, body, loops)


def _memory_body(body: tuple[Statement, ...], loops: tuple[For, ...]):
    """(the one body holding every TLOAD and TSTORE, its enclosing FORs), (None, ()) when there
    are none, or None when they are spread over several bodies or a statement is not allowed."""
    here = False
    inner = None
    for statement in body:
        if isinstance(statement, For):
            if statement.tile_levels or statement.max_range is not None:
                return None
            found = _memory_body(statement.body, (*loops, statement))
            if found is None or (found[0] is not None and (inner is not None or here)):
                return None
            if found[0] is not None:
                inner = found
        elif isinstance(statement, Op):
            spec = OPCODES[statement.opcode]
            if spec.form in (Form.LOAD, Form.STORE):
                if inner is not None:
                    return None
                here = True
            elif spec.form not in _SAME_PLACE:
                return None
        else:
            return None  # IF, CALL, RETURN and the orchestration statements
    if here:
        return body, loops
    return inner if inner is not None else (None, ())


def _one_pass(function: Function, body: tuple[Statement, ...], loops: tuple[For, ...]) -> bool:
    """The rest of the rules, for the body holding the loads and stores."""
    written: set[str] = set()  # tiles written so far in an iteration of the body
    windows: set[tuple] = set()
    rows = cols = 0  # the largest tile loaded or stored
    stored = False
    for statement in body:
        if isinstance(statement, For):
            return False  # a FOR beside the loads and stores: its tiles' values cross iterations
        form = OPCODES[statement.opcode].form
        if stored and form is not Form.STORE:
            return False  # CUDA's column blocks would start a pass there, loading again
        if form in (Form.SCALAR, Form.COMPARE, Form.DIM):
            continue
        if form in (Form.LOAD, Form.STORE):
            tile = function.tile(statement.dst if form is Form.LOAD else statement.srcs[0])
            if form is Form.LOAD:
                written.add(tile.name)
            elif tile.name not in written:
                return False
            stored = stored or form is Form.STORE
            windows.add((*statement.srcs[1:3], 0, 0)[:2])
            rows, cols = max(rows, tile.rows), max(cols, tile.cols)
            continue
        tiles = [s for s in statement.srcs if isinstance(s, str) and function.tile(s) is not None]
        if any(s not in written for s in tiles):
            return False
        written.add(statement.dst)
    if len(windows) != 1:
        return False
    window = windows.pop()
    variables = {loop.var for loop in loops}
    assigned = {s.dst for s in walk(function.body)
                if isinstance(s, Op) and OPCODES[s.opcode].form in (Form.SCALAR, Form.COMPARE, Form.DIM)}
    if any(operand in assigned and operand not in variables for operand in window):
        return False  # a scalar the function sets: the same name need not be the same place
    row, col = window
    for loop in loops:
        extent = max(rows if loop.var == row else 0, cols if loop.var == col else 0)
        if not extent or not isinstance(loop.step, int) or loop.step < extent:
            return False
    return True
