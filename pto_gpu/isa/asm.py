"""The `.pto` assembly (spec 003 §3.1): a canonical printer and its parser.

`print_module(m)` writes one spelling for every module and `parse(text)` reads it back, so that
`parse(print_module(m)) == m` and printing is idempotent. The text is line-oriented:

    // PTO Module: <name>                                 first line that is not blank or a comment
    // Function Type: InCore | Orchestration              before each function
    func @f(%a: !pto.memref<f32, 8x64>, %b: !pto.memref<f32>, %n: i32) {
      %x = alloc_tile : !pto.tile<8x64xf32>              tiles, in declaration order
      %s = alloc_scalar : i32                            scalar locals, in declaration order
      %t = alloc_tensor : !pto.memref<f32>               local tensors (Orchestrations)
      statements
    }
    func @k(%a: in !pto.memref<f32>, %c: out !pto.memref<f32>, %eps: f32) = library pkg.module.name
    func @g(%a: !pto.memref<f32, 8x768>, ...) column_tails {   an InCore function taking narrower windows
    func @p(%a: !pto.memref<f32, 64x64>, ...) tf32 {           float32 products on tensor cores as TF32

Parameters are the memrefs (with a shape or without), then the scalar parameters, each group in
declaration order; the parser rebuilds `Function.scalars` as the parameters followed by the
locals. Declarations come before the first statement. Statements, one per line, indented two
spaces per level of nesting:

    %x = tload %mem[row, col]             LOAD
    tstore %x, %mem[row, col]             STORE (the destination is the memref)
    %y = texp %x                          UNARY, ROW_REDUCE, COL_REDUCE
    %y = tadd %a, %b                      BINARY, ROW_EXPAND, COL_EXPAND, MATMUL
    %y = tmuls %a, 0.5                    TILE_SCALAR (the scalar is a number or %name)
    %y = tcausalmask %a, row, col         MASK
    %s = sli 7                            SCALAR: SLI (an immediate)
    %s = sadd %a, 1                       SCALAR: the others (numbers or %names)
    %c = scmp lt %a, %b                   COMPARE (lt le gt ge eq ne)
    FOR %i:idx, start:idx, stop:idx, step:idx [max_range=N] [min_range=N] [tile_levels={N:N,...}] [rows=%r]
      statements
    ENDFOR
    IF lhs lt rhs
      statements
    [ELSE
      statements]
    ENDIF
    CALL @callee(%param -> %tensor, %param -> %tensor[row, col], %scalar = value)
    return
    %t = alloc [dim, dim] [owner %u]      ALLOC (dims: integers or %names; owner: see ir.Alloc)
    %v = view %t[start:stop, :]           VIEW (`:` keeps a dim whole)
    %h = split %t, groups                 SPLIT
    %n = sdim %t, axis                    DIM (a tensor's size; in InCore, a memref window's)

A function's parameter list and a CALL's arguments may break across lines (the printer writes
each on one line). Instructions are spelled in lower case; what each operand accepts is the
verifier's signature (operands.signature), which the printer checks and the parser follows.
row, col, loop bounds and IF operands are integers or %names; numbers are written as
Python's repr (so floats read back exactly, inf, -inf and nan included). Unset FOR
attributes and an empty ELSE are left out. dtypes are f32 f16 bf16 f64 i64 i32 i16 i8 u64
u8 bool. Comments run from `//` to the end of the line; only the two header forms above,
alone on their line, carry meaning.
"""

from __future__ import annotations

import dataclasses
import re

from ..dtypes import DataType
from .errors import ISAError
from .ir import (
    Alloc,
    Call,
    CallArg,
    Direction,
    For,
    Function,
    FunctionKind,
    If,
    MemRef,
    Module,
    Op,
    Predicate,
    Return,
    Scalar,
    Split,
    Tile,
    View,
)
from .operands import Kind, signature
from .ops import OPCODES, Form, OpSpec
from .verify import verify_module

DTYPE_NAMES: dict[DataType, str] = {
    DataType.FLOAT32: "f32", DataType.FLOAT16: "f16", DataType.BFLOAT16: "bf16", DataType.FLOAT64: "f64",
    DataType.INT64: "i64", DataType.INT32: "i32", DataType.INT16: "i16", DataType.INT8: "i8",
    DataType.UINT64: "u64", DataType.UINT8: "u8", DataType.BOOL: "bool",
}
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


_NAMES = frozenset({Kind.TILE, Kind.MEMREF, Kind.LOCAL})
_EXPECTED = {Kind.INDEX: "an integer or %name", Kind.VALUE: "a number or %name", Kind.IMMEDIATE: "a number",
             **{kind: "a %name" for kind in _NAMES}}


def _sources(spec: OpSpec) -> tuple[Kind, ...]:
    """What each source of the instruction accepts (the verifier's signature, less the destination)."""
    return tuple(operand.kind for operand in signature(spec)[1:])


_IDENT = re.compile(r"[^\W\d]\w*")  # Python identifiers (the verifier's rule for names)
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_INDENT = "  "


# ---------------------------------------------------------------------------------------------
# Printer


def print_module(module: Module) -> str:
    """The module's canonical `.pto` text."""
    if not _MODULE_NAME.fullmatch(module.name):
        raise ISAError(f"cannot print module name {module.name!r}: it must match {_MODULE_NAME.pattern}")
    lines = [f"// PTO Module: {module.name}"]
    for function in module.functions.values():
        lines += ["", *_Printer(function).lines()]
    return "\n".join(lines) + "\n"


class _Printer:
    def __init__(self, function: Function):
        self.function = function

    def fail(self, what: str) -> ISAError:
        return ISAError(f"cannot print function @{self.function.name}: {what}")

    def name(self, name: object, sigil: str = "%") -> str:
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise self.fail(f"{name!r} is not a name (it must match {_IDENT.pattern})")
        return sigil + name

    def operand(self, value: object, kind: Kind, where: str) -> str:
        if isinstance(value, str) and kind is not Kind.IMMEDIATE:
            return self.name(value)
        if kind not in _NAMES and isinstance(value, int):
            return str(int(value))
        if kind in (Kind.VALUE, Kind.IMMEDIATE) and isinstance(value, float):
            return float.__repr__(value)  # float's own repr: numpy scalars would print np.float64(...)
        raise self.fail(f"{where}: {value!r} is not {_EXPECTED[kind]}")

    def index(self, value: object, where: str) -> str:
        return self.operand(value, Kind.INDEX, where)

    def integer(self, value: object, where: str) -> str:
        if not isinstance(value, int):
            raise self.fail(f"{where}: {value!r} is not an integer")
        return str(int(value))

    def lines(self) -> list[str]:
        f = self.function
        params = [f"{self.name(m.name)}: {self.direction(m)}{self.memref_type(m)}" for m in f.memrefs]
        params += [f"{self.name(s.name)}: {self.dtype(s.dtype)}" for s in f.scalars if s.param]
        head = f"func {self.name(f.name, '@')}({', '.join(params)})"
        if f.library is not None:
            if f.body or f.tiles or f.tensors or any(not s.param for s in f.scalars):
                raise self.fail("a library function has no body, tiles or locals")
            if not _PATH.fullmatch(str(f.library)):
                raise self.fail(f"library {f.library!r} is not an import path (package.module.name)")
            return [f"// Function Type: {f.kind.value}", f"{head} = library {f.library}"]
        flags = "".join(f" {flag}" for flag, on in (("column_tails", f.column_tails), ("tf32", f.tf32)) if on)
        out = [f"// Function Type: {f.kind.value}", f"{head}{flags} {{"]
        out += [f"{_INDENT}{self.name(t.name)} = alloc_tile : {self.tile_type(t)}" for t in f.tiles]
        out += [f"{_INDENT}{self.name(s.name)} = alloc_scalar : {self.dtype(s.dtype)}"
                for s in f.scalars if not s.param]
        out += [f"{_INDENT}{self.name(t.name)} = alloc_tensor : {self.memref_type(t)}" for t in f.tensors]
        self.body(f.body, 1, out)
        out.append("}")
        return out

    def direction(self, memref: MemRef) -> str:
        if memref.direction is None:
            return ""
        if not isinstance(memref.direction, Direction):
            raise self.fail(f"memref {memref.name}: direction {memref.direction!r} is not a Direction")
        return _DIRECTION_WORDS[memref.direction] + " "

    def dtype(self, dtype: DataType) -> str:
        if dtype not in DTYPE_NAMES:
            raise self.fail(f"{dtype!r} is not a dtype")
        return DTYPE_NAMES[dtype]

    def tile_type(self, tile: Tile) -> str:
        rows, cols = (self.integer(n, f"tile {tile.name}") for n in (tile.rows, tile.cols))
        return f"!pto.tile<{rows}x{cols}x{self.dtype(tile.dtype)}>"

    def memref_type(self, memref: MemRef) -> str:
        if memref.shape is None:
            return f"!pto.memref<{self.dtype(memref.dtype)}>"
        where = f"memref {memref.name}"
        rows, cols = (self.integer(n, where) for n in memref.shape)
        return f"!pto.memref<{self.dtype(memref.dtype)}, {rows}x{cols}>"

    def body(self, statements: tuple, depth: int, out: list[str]) -> None:
        pad = _INDENT * depth
        for s in statements:
            if isinstance(s, Op):
                out.append(pad + self.op(s))
            elif isinstance(s, For):
                out.append(pad + self.for_header(s))
                self.body(s.body, depth + 1, out)
                out.append(pad + "ENDFOR")
            elif isinstance(s, If):
                lhs, rhs = self.index(s.lhs, "IF"), self.index(s.rhs, "IF")
                out.append(f"{pad}IF {lhs} {s.predicate.value} {rhs}")
                self.body(s.then_body, depth + 1, out)
                if s.else_body:
                    out.append(pad + "ELSE")
                    self.body(s.else_body, depth + 1, out)
                out.append(pad + "ENDIF")
            elif isinstance(s, Call):
                out.append(pad + self.call(s))
            elif isinstance(s, Return):
                out.append(pad + "return")
            elif isinstance(s, Alloc):
                dims = ", ".join(self.index(v, "alloc") for v in s.shape)
                owner = "" if s.owner is None else f" owner {self.name(s.owner)}"
                out.append(f"{pad}{self.name(s.dst)} = alloc [{dims}]{owner}")
            elif isinstance(s, View):
                dims = [":" if b is None else f"{self.index(b[0], 'view')}:{self.index(b[1], 'view')}"
                        for b in s.slices]
                out.append(f"{pad}{self.name(s.dst)} = view {self.name(s.src)}[{', '.join(dims)}]")
            elif isinstance(s, Split):
                groups = self.index(s.groups, "split")
                out.append(f"{pad}{self.name(s.dst)} = split {self.name(s.src)}, {groups}")
            else:
                raise self.fail(f"{s!r} is not a statement")

    def op(self, op: Op) -> str:
        spec = OPCODES.get(op.opcode)
        if spec is None:
            raise self.fail(f"unknown instruction {op.opcode!r}")
        where = f"instruction {op.opcode} {op.dst}"
        kinds = _sources(spec)
        if len(op.srcs) != len(kinds):
            raise self.fail(f"{where}: {op.opcode} takes {len(kinds)} sources, not {len(op.srcs)}")
        predicates = [v.value for v, k in zip(op.srcs, kinds)
                      if k is Kind.PREDICATE and isinstance(v, Predicate)]
        if len(predicates) != kinds.count(Kind.PREDICATE):
            raise self.fail(f"{where}: its predicate is not a Predicate")
        words = [self.operand(v, k, where) for v, k in zip(op.srcs, kinds) if k is not Kind.PREDICATE]
        mnemonic = spec.spelling.lower()
        if spec.form is Form.STORE:
            return f"{mnemonic} {words[0]}, {self.name(op.dst)}[{words[1]}, {words[2]}]"
        if spec.form is Form.LOAD:
            text = f"{words[0]}[{words[1]}, {words[2]}]"
        else:
            text = " ".join([*predicates, ", ".join(words)])
        return f"{self.name(op.dst)} = {mnemonic} {text}"

    def for_header(self, loop: For) -> str:
        where = f"FOR {loop.var}"
        bounds = [self.name(loop.var)] + [self.index(v, where) for v in (loop.start, loop.stop, loop.step)]
        text = "FOR " + ", ".join(b + ":idx" for b in bounds)
        if loop.max_range is not None:
            text += f" max_range={self.integer(loop.max_range, where)}"
        if loop.min_range is not None:
            text += f" min_range={self.integer(loop.min_range, where)}"
        if loop.tile_levels:
            levels = [f"{self.integer(size, where)}:{self.integer(rows, where)}"
                      for size, rows in loop.tile_levels]
            text += " tile_levels={" + ",".join(levels) + "}"
        if loop.rows is not None:
            text += f" rows={self.name(loop.rows)}"
        return text

    def call(self, call: Call) -> str:
        where = f"CALL @{call.callee}"
        args = []
        for param, arg in call.args:
            text = f"{self.name(param)} -> {self.name(arg.tensor)}"
            if (arg.row is None) != (arg.col is None):
                raise self.fail(f"{where}: argument {param} has a row without a col or a col without a row")
            if arg.row is not None:
                text += f"[{self.index(arg.row, where)}, {self.index(arg.col, where)}]"
            args.append(text)
        args += [f"{self.name(param)} = {self.operand(value, Kind.VALUE, where)}"
                 for param, value in call.scalars]
        return f"CALL {self.name(call.callee, '@')}({', '.join(args)})"


# ---------------------------------------------------------------------------------------------
# Tokenizer

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r]+)
  | (?P<comment>//.*)
  | (?P<shape>\d+x\d+(?:x[A-Za-z0-9_]+)?)
  | (?P<number>-?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|inf\b|nan\b))
  | (?P<arrow>->)
  | (?P<name>%[^\W\d]\w*)
  | (?P<func>@[^\W\d]\w*)
  | (?P<type>![A-Za-z_][A-Za-z0-9_.]*)
  | (?P<path>[^\W\d]\w*(?:\.[^\W\d]\w*)+)
  | (?P<word>[^\W\d]\w*)
  | (?P<punct>[(){}\[\],:=<>])
""", re.VERBOSE)
# A header's value is one word; a comment may follow it.
_HEADERS = {"module": re.compile(r"//\s*PTO Module:\s*(\S*)\s*(?://.*)?"),
            "kind": re.compile(r"//\s*Function Type:\s*(\S*)\s*(?://.*)?")}
_LOOP_ATTRIBUTES = ("max_range", "min_range", "tile_levels", "rows")
_CLOSERS = frozenset({"}", "ELSE", "ENDFOR", "ENDIF"})  # the ends of blocks
_ALLOCS = ("alloc_tile", "alloc_scalar", "alloc_tensor")
_DIRECTION_WORDS = {Direction.INPUT: "in", Direction.OUTPUT: "out", Direction.INOUT: "inout"}
_DIRECTIONS = {word: direction for direction, word in _DIRECTION_WORDS.items()}
_PATH = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)+")
_INTEGER = re.compile(r"-?\d+")
_PREDICATES = {p.value: p for p in Predicate}


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str  # a group of _TOKEN, "module"/"kind" (the headers), "bad", "newline" or "eof"
    text: str
    line: int
    col: int

    def describe(self) -> str:
        if self.kind in ("newline", "eof"):
            return "end of line" if self.kind == "newline" else "end of input"
        return repr(self.text)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        start = len(tokens)
        pos = 0
        while pos < len(line):
            match = _TOKEN.match(line, pos)
            if match is None:  # no rule takes a "bad" token: the parser reports it where it stands
                tokens.append(_Token("bad", line[pos], number, pos + 1))
                pos += 1
                continue
            kind, word = match.lastgroup, match.group()
            if kind == "comment" and len(tokens) == start:
                header = next(((k, h) for k, h in _HEADERS.items() if h.fullmatch(word)), None)
                if header is not None:
                    tokens.append(_Token(header[0], header[1].fullmatch(word).group(1), number, pos + 1))
            elif kind not in ("space", "comment"):
                tokens.append(_Token(kind, word, number, pos + 1))
            pos = match.end()
        if len(tokens) > start:
            tokens.append(_Token("newline", "", number, len(line) + 1))
    tokens.append(_Token("eof", "", len(lines), len(lines[-1]) + 1))
    return tokens


# ---------------------------------------------------------------------------------------------
# Parser


def parse(text: str, verify: bool = True) -> Module:
    """The module that `.pto` text describes, verified (verify.verify_module) unless `verify` is
    False; errors are ISAErrors that start with the line and column of what they refuse (a
    verifier error of the module as a whole, such as a recursion, with none)."""
    parser = _Parser(_tokenize(text))
    module = parser.module()
    if verify:
        try:
            verify_module(module)
        except ISAError as error:
            where = parser.positions.get(id(error.statement))
            if where is None:
                raise
            raise ISAError(f"{where[0]}:{where[1]}: {error}") from None
    return module


class _Parser:
    def __init__(self, tokens: list[_Token]):
        self.tokens = tokens
        self.pos = 0
        self.function = ""  # the function being read, for messages
        self.positions: dict[int, tuple[int, int]] = {}  # id of each statement read -> (line, column)

    # -- token helpers ----------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        token = self.peek()
        self.pos += 1
        return token

    def error(self, message: str, token: _Token | None = None) -> ISAError:
        token = token or self.peek()
        where = f" in @{self.function}" if self.function else ""
        return ISAError(f"{token.line}:{token.col}:{where} {message}")

    def expected(self, what: str, token: _Token | None = None) -> ISAError:
        token = token or self.peek()
        return self.error(f"expected {what}, found {token.describe()}", token)

    def at(self, kind: str, text: str | None = None) -> bool:
        token = self.peek()
        return token.kind == kind and (text is None or token.text == text)

    def expect(self, kind: str, text: str | None = None, what: str | None = None) -> _Token:
        if not self.at(kind, text):
            raise self.expected(what or (repr(text) if text is not None else kind))
        return self.advance()

    def punct(self, text: str) -> None:
        self.expect("punct", text)

    def wrapped_at(self, text: str) -> bool:
        """Inside parentheses a line may break (the printer never breaks one): skip the breaks,
        then whether the next token is `text`."""
        while self.at("newline"):
            self.advance()
        return self.at("punct", text)

    def end_of_line(self) -> None:
        self.expect("newline", what="end of line")

    def name(self) -> str:
        return self.expect("name", what="a %name").text[1:]

    def integer(self) -> int:
        token = self.peek()
        if token.kind != "number" or not _INTEGER.fullmatch(token.text):
            raise self.expected("an integer")
        return int(self.advance().text)

    def operand(self, kind: Kind) -> str | int | float:
        token = self.peek()
        if token.kind == "name" and kind is not Kind.IMMEDIATE:
            return self.advance().text[1:]
        if kind not in _NAMES and token.kind == "number":
            if _INTEGER.fullmatch(token.text):
                return int(self.advance().text)
            if kind is not Kind.INDEX:
                return float(self.advance().text)
        raise self.expected(_EXPECTED[kind])

    def index(self) -> str | int:
        return self.operand(Kind.INDEX)

    def predicate(self) -> Predicate:
        token = self.peek()
        if token.kind != "word" or token.text not in _PREDICATES:
            raise self.expected("a predicate (" + " ".join(_PREDICATES) + ")")
        return _PREDICATES[self.advance().text]

    def dtype(self) -> DataType:
        token = self.peek()
        if token.kind != "word" or token.text not in _DTYPES:
            raise self.expected("a dtype (" + " ".join(_DTYPES) + ")")
        return _DTYPES[self.advance().text]

    # -- structure --------------------------------------------------------------------------

    def module(self) -> Module:
        header = self.expect("module", what="'// PTO Module: <name>'")
        if not _MODULE_NAME.fullmatch(header.text):
            raise self.expected(f"a module name matching {_MODULE_NAME.pattern}", header)
        module = Module(header.text)
        self.end_of_line()
        while not self.at("eof"):
            kind_token = self.expect("kind", what="'// Function Type: InCore|Orchestration' or end of input")
            kinds = {k.value: k for k in FunctionKind}
            if kind_token.text not in kinds:
                raise self.expected(f"a function type ({' or '.join(kinds)})", kind_token)
            self.end_of_line()
            name_token = self.peek(1)
            function = self.function_(kinds[kind_token.text])
            try:
                module.add(function)
            except ISAError as e:
                raise self.error(str(e), name_token) from None
            self.function = ""
        return module

    def function_(self, kind: FunctionKind) -> Function:
        self.expect("word", "func", "'func'")
        name = self.expect("func", what="a function name '@name'").text[1:]
        self.function = name
        memrefs: list[MemRef] = []
        scalars: list[Scalar] = []
        self.punct("(")
        while not self.wrapped_at(")"):
            if memrefs or scalars:
                self.punct(",")
                self.wrapped_at(",")
            param = self.name()
            self.punct(":")
            direction = _DIRECTIONS[self.advance().text] if self.peek().text in _DIRECTIONS else None
            if self.at("type"):
                memrefs.append(dataclasses.replace(self.memref_type(param), direction=direction))
            elif direction is not None:
                raise self.expected("'!pto.memref' (a direction is for a memref)")
            else:
                scalars.append(Scalar(param, self.dtype(), param=True))
        self.punct(")")
        if self.at("punct", "="):
            self.advance()
            self.expect("word", "library", "'library'")
            library = self.expect("path", what="an import path package.module.name").text
            if not self.at("eof"):
                self.end_of_line()
            return Function(name, kind, tuple(memrefs), tuple(scalars), (), (), library=library)
        column_tails = self.at("word", "column_tails")
        if column_tails:
            self.advance()
        tf32 = self.at("word", "tf32")
        if tf32:
            self.advance()
        self.punct("{")
        self.end_of_line()
        tiles: list[Tile] = []
        tensors: list[MemRef] = []
        while self.at("name") and self.peek(1).text == "=" and self.peek(2).text in _ALLOCS:
            declared = self.name()
            self.punct("=")
            declaration = self.advance().text
            if declaration == "alloc_tile":
                tiles.append(self.tile_type(declared))
            elif declaration == "alloc_tensor":
                self.punct(":")
                tensors.append(self.memref_type(declared))
            else:
                self.punct(":")
                scalars.append(Scalar(declared, self.dtype(), param=False))
            self.end_of_line()
        body = self.statements(("}",))
        self.punct("}")
        if not self.at("eof"):
            self.end_of_line()
        return Function(name, kind, tuple(memrefs), tuple(scalars), tuple(tiles), body, tuple(tensors),
                        column_tails=column_tails, tf32=tf32)

    def memref_type(self, name: str) -> MemRef:
        self.expect("type", "!pto.memref", "'!pto.memref'")
        self.punct("<")
        dtype = self.dtype()
        shape = None
        if self.at("punct", ","):
            self.advance()
            token = self.peek()
            dims = token.text.split("x")
            if token.kind != "shape" or len(dims) != 2:
                raise self.expected("a shape ROWSxCOLS")
            self.advance()
            shape = (int(dims[0]), int(dims[1]))
        self.punct(">")
        return MemRef(name, dtype, shape)

    def tile_type(self, name: str) -> Tile:
        self.punct(":")
        self.expect("type", "!pto.tile", "'!pto.tile'")
        self.punct("<")
        token = self.peek()
        dims = token.text.split("x")
        if token.kind != "shape" or len(dims) != 3 or dims[2] not in _DTYPES:
            raise self.expected("ROWSxCOLSxDTYPE")
        self.advance()
        self.punct(">")
        return Tile(name, int(dims[0]), int(dims[1]), _DTYPES[dims[2]])

    # -- statements -------------------------------------------------------------------------

    def statements(self, ends: tuple[str, ...]) -> tuple:
        """Statements up to (not including) a token whose text is in `ends`."""
        body = []
        while not (self.peek().kind in ("word", "punct") and self.peek().text in ends):
            if self.at("eof") or self.peek().text in _CLOSERS:
                raise self.expected(" or ".join(repr(e) for e in ends))
            token = self.peek()
            statement = self.statement()
            self.positions[id(statement)] = (token.line, token.col)  # the module keeps it alive
            body.append(statement)
        return tuple(body)

    def statement(self):
        token = self.peek()
        if token.kind == "name":
            statement = self.assignment()
        elif token.kind != "word":
            raise self.expected("a statement")
        elif token.text == "FOR":
            return self.for_()
        elif token.text == "IF":
            return self.if_()
        elif token.text == "CALL":
            statement = self.call()
        elif token.text == "return":
            self.advance()
            statement = Return()
        else:
            spec = self.opcode()
            if spec.form is not Form.STORE:
                raise self.expected(f"'%dst = {token.text} ...' ({token.text} writes a destination)", token)
            tile = self.name()
            self.punct(",")
            memref, row, col = self.window()
            statement = Op(spec.spelling, memref, (tile, row, col))
        self.end_of_line()
        return statement

    def opcode(self) -> OpSpec:
        token = self.peek()
        spec = OPCODES.get(token.text.upper()) if token.kind == "word" and token.text.islower() else None
        if spec is None:
            raise self.expected("an instruction")
        self.advance()
        return spec

    def window(self) -> tuple[str, str | int, str | int]:
        """`%name[row, col]`"""
        name = self.name()
        self.punct("[")
        row = self.index()
        self.punct(",")
        col = self.index()
        self.punct("]")
        return name, row, col

    def assignment(self) -> Op | Alloc | View | Split:
        dst = self.name()
        self.punct("=")
        token = self.peek()
        if token.kind == "word" and token.text in ("alloc", "view", "split"):
            return self.tensor_statement(dst)
        spec = self.opcode()
        form = spec.form
        if form is Form.STORE:
            raise self.expected(f"'{token.text} %tile, %mem[row, col]' (no destination)", token)
        if form is Form.LOAD:
            return Op(spec.spelling, dst, self.window())
        kinds = _sources(spec)
        # Predicates come first (`scmp lt %a, %b`), then the other operands, comma-separated.
        predicates = [self.predicate() for kind in kinds if kind is Kind.PREDICATE]
        values = []
        for i, kind in enumerate(k for k in kinds if k is not Kind.PREDICATE):
            if i:
                self.punct(",")
            values.append(self.operand(kind))
        srcs = [predicates.pop(0) if kind is Kind.PREDICATE else values.pop(0) for kind in kinds]
        return Op(spec.spelling, dst, tuple(srcs))

    def tensor_statement(self, dst: str) -> Alloc | View | Split:
        word = self.advance().text
        if word == "split":
            source = self.name()
            self.punct(",")
            return Split(dst, source, self.index())
        source = self.name() if word == "view" else None
        self.punct("[")
        dims: list = []
        while not self.at("punct", "]"):
            if dims:
                self.punct(",")
            if word == "alloc":
                dims.append(self.index())
            elif self.at("punct", ":"):
                self.advance()
                dims.append(None)
            else:
                start = self.index()
                self.punct(":")
                dims.append((start, self.index()))
        self.advance()
        if word == "view":
            return View(dst, source, tuple(dims))
        owner = None
        if self.at("word", "owner"):
            self.advance()
            owner = self.name()
        return Alloc(dst, tuple(dims), owner)

    def bound(self) -> str | int:
        value = self.index()
        self.punct(":")
        self.expect("word", "idx", "'idx'")
        return value

    def for_(self) -> For:
        self.advance()
        var = self.name()
        self.punct(":")
        self.expect("word", "idx", "'idx'")
        bounds = []
        for _ in range(3):
            self.punct(",")
            bounds.append(self.bound())
        attributes: dict[str, object] = {}
        while self.at("word"):
            token = self.advance()
            if token.text not in _LOOP_ATTRIBUTES or token.text in attributes:
                raise self.expected(f"one of {', '.join(_LOOP_ATTRIBUTES)}, each at most once", token)
            self.punct("=")
            read = {"tile_levels": self.levels, "rows": self.name}.get(token.text, self.integer)
            attributes[token.text] = read()
        self.end_of_line()
        body = self.statements(("ENDFOR",))
        self.advance()
        self.end_of_line()
        return For(var, *bounds, body, **attributes)

    def levels(self) -> tuple[tuple[int, int], ...]:
        """`{size:rows,...}`"""
        self.punct("{")
        levels = []
        while not self.at("punct", "}"):
            if levels:
                self.punct(",")
            size = self.integer()
            self.punct(":")
            levels.append((size, self.integer()))
        self.advance()
        return tuple(levels)

    def if_(self) -> If:
        self.advance()
        lhs = self.index()
        predicate = self.predicate()
        rhs = self.index()
        self.end_of_line()
        then_body = self.statements(("ELSE", "ENDIF"))
        else_body: tuple = ()
        if self.advance().text == "ELSE":
            self.end_of_line()
            else_body = self.statements(("ENDIF",))
            self.advance()
        self.end_of_line()
        return If(lhs, predicate, rhs, then_body, else_body)

    def call(self) -> Call:
        self.advance()
        callee = self.expect("func", what="a function name '@name'").text[1:]
        self.punct("(")
        args, scalars = [], []
        while not self.wrapped_at(")"):
            if args or scalars:
                self.punct(",")
                self.wrapped_at(",")
            param = self.name()
            if self.at("punct", "="):
                self.advance()
                scalars.append((param, self.operand(Kind.VALUE)))
                continue
            if scalars:
                raise self.expected("'=' (tensors are bound before scalars)")
            self.expect("arrow", what="'->' or '='")
            if self.peek(1).text == "[":
                tensor, row, col = self.window()
                args.append((param, CallArg(tensor, row, col)))
            else:
                args.append((param, CallArg(self.name())))
        self.punct(")")
        return Call(callee, tuple(args), tuple(scalars))
