"""Tensor-core products in the generated CUDA (cuda_codegen.py's TMATMUL rule on tensor cores):
which products and kernels take them, the padded rows of operands kept as their element type
(packed), how a result's units of 16 x 32 lie over a block's warps (Units), and the text of a
product: mma.sync over fragments read by ldmatrix or element by element, whole blocks of k the
lean way, accumulators carried in registers across a loop, an a kept in registers in whole rows
read as it lies."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Protocol

from ..dtypes import DataType
from .cuda_lines import WARPS, Code, for_wgmma, indent, op_block
from .ir import Function, Op, Tile
from .ops import OpSpec


class Layout(Protocol):
    """What a product's text reads of its kernel's layout (cuda_codegen.Generator): the tiles
    by C name, those packed (kept as T), kept in registers (fragments) or read as another's
    transpose (result -> source), those whose units lie as wgmma's accumulators (wgmma: the
    results of the products that take it where the build does), each row's pitch in shared
    memory, and what the rules record of their tiles' uses."""

    tiles: dict[str, Tile]
    packed: set[str]
    wgmma: set[str]
    fragments: set[str]
    transposed: dict[str, str]
    whole: set[str]
    reads: dict[str, set]
    writes: dict[str, set]
    tensor_products: int

    def pitch(self, tile: str) -> int: ...

    def units(self, tile: str) -> Units: ...


class Scope(Protocol):
    """Where a product is written (cuda_codegen.Context): the layout, the C names of the IR's
    tiles, and the registers a loop keeps a result's accumulators in."""

    g: Layout
    names: dict[str, str]
    registers: dict[str, str]

# The products that run on tensor cores (float accumulators): of float16 and bfloat16 tiles
# (mma.sync.m16n8k16), and of float32 tiles in a function that says tf32 (mma.sync.m16n8k8 of
# operands rounded to TF32). Operands not packed, and results not in registers, are in shared
# memory as float (TENSOR_CORE_BYTES an element).
TENSOR_CORE_DTYPES = (DataType.FLOAT16, DataType.BFLOAT16)
TENSOR_CORE_BYTES = 4
MMA_K, TF32_MMA_K = 16, 8  # k of one instruction: 16-bit operands, TF32 ones
# The floats of accumulators a lane may keep in registers, four units of 16 x 32 (a 128 x 128
# result over 8 warps): for the results kept there throughout (Generator._fragments), and as
# many again for those a loop keeps there (Context.accumulated). Beyond it, shared memory.
REGISTER_ACCUMULATORS = 64


def tensor_core_dtypes(function: Function) -> tuple[DataType, ...]:
    """The tile type whose products may take tensor cores in a function's CUDA code: the one
    type of its memrefs (the build's element type: its pto_mma is that type's) where that is
    16-bit, or float32 where the function says tf32; none otherwise. Tiles of another type
    (TCVT's) multiply on FMA."""
    types = {m.dtype for m in function.memrefs}
    if len(types) == 1 and ((dtype := types.pop()) in TENSOR_CORE_DTYPES
                            or (dtype == DataType.FLOAT32 and function.tf32)):
        return (dtype,)
    return ()


def tensor_core_kernel(function: Function) -> bool:
    """Whether a function's products may take tensor cores (tensor_core_dtypes)."""
    return bool(tensor_core_dtypes(function))


def tensor_core_product(op: Op, dtype: Callable[[str], DataType], allowed: tuple[DataType, ...]) -> bool:
    """Whether a MATMUL(_ACC) of a tensor-core kernel runs on tensor cores: its three tiles of
    the `allowed` types (tensor_core_dtypes; `dtype` of a tile name) and its destination neither
    operand (the units of the result are written while other warps still read the operands)."""
    dst, a, b = op.dst, op.srcs[0], op.srcs[1]
    return dst not in (a, b) and all(dtype(tile) in allowed for tile in (dst, a, b))


def packed_pitch(cols: int) -> int:
    """The row pitch, in elements, of a packed tile (Generator._packed): at least `cols`, and 8
    more than a multiple of 16 (16 bytes more than a multiple of 32): every row starts 16-byte
    aligned (ldmatrix and 16-byte copies read 16-byte rows), and the 8 rows of an ldmatrix
    matrix fall in 8 different 16-byte groups of banks (a pitch of a multiple of 16 elements
    would put them in 4), as do a tail block's pairs of elements read a lane at a time."""
    return cols + (8 - cols % 16) % 16


# A lane's group and thread in the group (t2 = 2t), as the fragment layouts name them.
_LANE = "[[maybe_unused]] const int g = pto_lane / 4, t = pto_lane % 4, t2 = 2 * t;"


@dataclasses.dataclass(frozen=True)
class Units:
    """How the warps share out a tensor-core product's result: units of 16 rows x `blocks`
    blocks of 8 columns (a unit's accumulators are blocks x 4 floats a lane), unit u taken by
    warp u % PTO_WARPS, in its turn u / PTO_WARPS. A result's own units (`of`) are up to 4
    blocks wide; a tile kept in whole rows (`rows_of`) has a unit a band of 16 rows.

    Where a wgmma product computes the result (`for_wgmma`), its units lie as the instruction's
    accumulators do (pto_wgmma.cuh) wherever PTO_WGMMA says the build takes it: each warpgroup
    a 64-row band of it, N columns wide, warp w of the group its 16 rows w % 4, its turns the
    N / 32 units along them. `warpgroup_step` is then the units from the first warpgroup's
    first unit to the second's (0: the order above in every build)."""

    blocks: int
    bands: int
    slices: int
    warpgroup_step: int = 0

    @classmethod
    def of(cls, tile: Tile) -> Units:
        return cls.shaped(tile.rows, tile.cols)

    @classmethod
    def shaped(cls, rows: int, cols: int) -> Units:
        blocks = min(4, math.ceil(cols / 8))
        return cls(blocks, math.ceil(rows / 16), math.ceil(cols / (8 * blocks)))

    @classmethod
    def for_wgmma(cls, rows: int, cols: int) -> Units | None:
        """The units of a rows x cols result a block's two warpgroups compute by wgmma, or None
        where no instruction shape fits it: 64 rows split by columns (each warpgroup 64 or 128
        of them), or 128 rows split by rows (each warpgroup 64 rows of 64 or 128 columns)."""
        if WARPS != 8 or (rows, cols) not in ((64, 128), (64, 256), (128, 64), (128, 128)):
            return None
        slices = cols // 32
        step = slices // 2 if rows == 64 else 4 * slices
        return cls(4, rows // 16, slices, step)

    @property
    def wgmma_n(self) -> int:
        """The N of a warpgroup's instruction over these units (for_wgmma)."""
        return 32 * self.turns

    @classmethod
    def rows_of(cls, rows: int, cols: int) -> Units:
        """Units of whole rows, a band of 16 rows each: every element of a row in one warp's
        lanes (the four of a group), so the warp reduces a row by itself, and a row of a
        product's result there is also its rows of a (Generator._fragments)."""
        return cls(math.ceil(cols / 8), math.ceil(rows / 16), 1)

    @property
    def count(self) -> int:
        return self.bands * self.slices

    @property
    def turns(self) -> int:
        return math.ceil(self.count / WARPS)

    @property
    def floats(self) -> int:
        """A lane's accumulators, every turn's."""
        return self.turns * self.blocks * 4

    def each(self, body: list[str], unrolled: bool = False) -> list[str]:
        """`body` for each unit this warp takes: pto_ui its turn, (r0, c0) its first element, g
        and t (t2 = 2t) the lane's group and thread in the group, as the fragment layouts name
        them. `unrolled` for a body that indexes registers by the turn."""
        first = (f"[[maybe_unused]] const int r0 = 16 * (pto_u / {self.slices}), "
                 f"c0 = {8 * self.blocks} * (pto_u % {self.slices});")
        return self._turns([first, _LANE, *body], unrolled)

    def _turns(self, body: list[str], unrolled: bool) -> list[str]:
        """`body` for each unit this warp takes, pto_ui its turn and pto_u the unit."""
        unit = "pto_warp + PTO_WARPS * pto_ui"
        if self.warpgroup_step:
            wgmma = f"pto_warp % 4 * {self.slices} + pto_warp / 4 * {self.warpgroup_step} + pto_ui"
            unit = f"PTO_WGMMA ? {wgmma} : {unit}"
        return [*(["PTO_UNROLL"] if unrolled else []),
                f"for (int pto_ui = 0; pto_ui < {self.turns}; ++pto_ui) {{",
                f"    const int pto_u = {unit};",
                f"    if (pto_u >= {self.count}) break;", *indent(body), "}"]

    @property
    def shares_columns(self) -> bool:
        """Whether a warp takes more than one unit, all of the same columns (PTO_WARPS a multiple
        of the slices): its turns may share b's fragments (each_turn)."""
        return self.turns > 1 and WARPS % self.slices == 0

    def warp_columns(self) -> list[str]:
        """c0, the first column of every unit of this warp (shares_columns), and the lane's g, t
        and t2, as `each` names them."""
        return [f"const int c0 = {8 * self.blocks} * (pto_warp % {self.slices});", _LANE]

    def each_turn(self, body: list[str]) -> list[str]:
        """`body` for each unit this warp takes, unrolled (pto_ui its turn, r0 its first row), in
        the columns of warp_columns: so a step of k loads b's fragments once for every turn, and
        the turns' products of the step go side by side (their accumulators are not one chain).
        Each unit still sums its steps in order: the same bits as a turn at a time."""
        return self._turns([f"[[maybe_unused]] const int r0 = 16 * (pto_u / {self.slices});", *body], True)

    def moved(self, statement: str) -> list[str]:
        """`statement` for each accumulator acc[n][e] of the unit and its element (r, c) of the
        result, where that is in the valid region (vr, vc)."""
        return self._elements("if (r < vr && c < vc) ", statement, "const long long")

    def computed(self, statement: str) -> list[str]:
        """moved's, for an instruction computing on tiles in registers: a unit inside the valid
        region (tested once) takes every element with no test, one the region cuts a test each.
        Not for moves between registers and memory (a result's TLOAD and TSTORE, accumulators
        around a loop), which run once outside the loops that matter and whose two bodies cost
        registers (the LLaMA MLP's matmul_acc spilled 20 bytes with them at two blocks an SM)."""
        return [f"if (r0 + 16 <= vr && c0 + {8 * self.blocks} <= vc) {{",
                *indent(self._elements("", statement, "[[maybe_unused]] const int")), "} else {",
                *indent(self._elements("if (r < vr && c < vc) ", statement, "const int")), "}"]

    def _elements(self, test: str, statement: str, index: str) -> list[str]:
        """`statement` for each element, under `test`, its indices r and c declared `index`."""
        return ["PTO_UNROLL", f"for (int n = 0; n < {self.blocks}; ++n) {{", "    PTO_UNROLL",
                "    for (int e = 0; e < 4; ++e) {",
                f"        {index} r = r0 + g + 8 * (e / 2), c = c0 + 8 * n + t2 + e % 2;",
                f"        {test}{statement}", "    }", "}"]

    def registers(self, name: str) -> str:
        """The declaration of `name`, every turn's accumulators, zero."""
        return f"float {name}[{self.turns}][{self.blocks}][4] = {{}};"

    def row_values(self, name: str) -> str:
        """The declaration of `name`, a one-column tile in whole rows: a unit's two rows a lane
        (r0 + g, r0 + g + 8), the same in the four lanes of the group, zero."""
        return f"float {name}[{self.turns}][2] = {{}};"

    @staticmethod
    def each_row(statement: str) -> list[str]:
        """`statement` for each row r of this lane in the unit (h: 0 for r0 + g, 1 for
        r0 + g + 8; its column c is 0), where that is in the valid region (vr rows, vc columns)."""
        return ["PTO_UNROLL", "for (int h = 0; h < 2; ++h) {",
                "    [[maybe_unused]] const long long r = r0 + g + 8 * h, c = 0;",
                f"    if (r < vr && vc > 0) {statement}", "}"]

    def bound(self, name: str) -> str:
        """acc, this turn's accumulators in `name`."""
        return f"float (&acc)[{self.blocks}][4] = {name}[pto_ui];"


def accumulator_floats(rows: int, cols: int) -> int:
    """The floats a lane holds of a tensor-core product's rows x cols result in registers."""
    return Units.shaped(rows, cols).floats


def tensor_matmul(ctx: Scope, op: Op, spec: OpSpec, where: str) -> Code:
    """MATMUL(_ACC) on tensor cores: a, b and dst all in shared memory (a and b packed as T where
    they can be, else as float); the warps take units of dst (Units), and a unit is a sum over
    k of pto_mma (float16, bfloat16 tiles: mma.sync.m16n8k16, in steps of 16) or pto_mma_tf32
    (float32 tiles: mma.sync.m16n8k8 of TF32, in steps of 8), float accumulators in registers,
    its fragments from shared memory, zero outside the valid regions: a whole unit's whole steps
    of k from places taken before them (_lean_fragments), the rest with a test an element
    (_fragment_loads). Where dst is kept in registers (Generator._fragments), or its
    accumulators are across the loop the product is in (Context.loop), dst is neither read nor
    written in shared memory: the accumulators carry over from the product before. A warp whose
    units share columns takes b's fragments once a step for all its turns (Units.each_turn)."""
    dst, a, b = ctx.names[op.dst], ctx.names[op.srcs[0]], ctx.names[op.srcs[1]]
    ctx.g.whole.update((dst, a, b))
    ctx.g.reads.setdefault(a, set()).add("mma")
    ctx.g.reads.setdefault(b, set()).add("mma_b")
    if spec.accumulate:
        ctx.g.reads.setdefault(dst, set()).add("mma_acc")
    ctx.g.writes.setdefault(dst, set()).add(("mma", None))
    ctx.g.tensor_products += 1
    looped = ctx.registers.get(dst)
    region = (f"vr_{dst}", f"vc_{dst}") if spec.accumulate else (f"vr_{a}", f"vc_{b}")

    def lines(g: Layout) -> list[str]:
        units = g.units(dst)
        step, product, a_loads, b_loads = _fragment_loads(g, a, b, units.blocks)
        lean = _lean_fragments(g, a, b, units.blocks)
        products = ["PTO_UNROLL",
                    f"for (int n = 0; n < {units.blocks}; ++n) {product}(acc[n], fa, &fb[2 * n], acc[n]);"]

        def steps(body: list[str], first: str = "0") -> list[str]:
            return [f"for (int k0 = {first}; k0 < pto_kn; k0 += {step}) {{", *indent(body), "}"]

        def lean_steps(whole_rows: str, setup: list[str], body: list[str]) -> list[str]:
            """The whole steps of k where the rows of a and columns of b are whole (`whole_rows`):
            after them the loop with tests (steps(first="pto_k0")) takes what is left."""
            if lean is None:
                return []
            return ["int pto_k0 = 0;  // the first step of k the loop with tests takes",
                    f"if ({whole_rows} && {lean.b_whole}) {{", *indent(setup),
                    f"    for (int k0 = 0; k0 + {step} <= pto_kn; k0 += {step}) {{", *indent(body, 2),
                    "    }", f"    pto_k0 = pto_kn - pto_kn % {step};", "}"]

        first = "0" if lean is None else "pto_k0"
        registers = f"pto_frag_{dst}" if dst in g.fragments else looped
        zero = [] if spec.accumulate or dst not in g.fragments else \
            ["PTO_UNROLL", f"for (int n = 0; n < {units.blocks}; ++n) "
             "acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;"]
        if a in g.fragments:  # dst's rows are a's in whole rows (Generator._fragments)
            body = units.each([units.bound(registers), *zero,
                               *_a_in_registers(g, a, b, units.blocks, b_loads, products)], unrolled=True)
        elif registers is not None and units.shares_columns:
            turns = units.each_turn
            lean_rows, lean_body = [], []
            if lean is not None:
                # a turn's unit is 16 (PTO_WARPS / slices) rows below the turn before's: its place
                # in a a constant step from the first's
                turn_step = 16 * (WARPS // units.slices) * lean.a.row_step
                lean_rows = [f"const int r0 = 16 * (pto_warp / {units.slices});  // the first turn's",
                             f"const {lean.b.pointer} pto_b_row = {lean.b.place};",
                             f"const {lean.a.pointer} pto_a_row0 = {lean.a.place};"]
                a_row = f"const {lean.a.pointer} pto_a_row = pto_a_row0 + {turn_step} * pto_ui;"
                lean_body = [*lean.b.loads, *turns([units.bound(registers), a_row, *lean.a.loads, *products])]
            last = f"pto_warp + PTO_WARPS * (({units.count} - 1 - pto_warp) / PTO_WARPS)"  # greatest rows
            whole_rows = f"16 * (({last}) / {units.slices}) + 16 <= vr_{a}"
            body = [*(units.each([units.bound(registers), *zero], unrolled=True) if zero else []),
                    *units.warp_columns(), *lean_steps(whole_rows, lean_rows, lean_body),
                    *steps([*b_loads, *turns([units.bound(registers), *a_loads, *products])], first)]
        else:
            lean_rows, lean_body = [], []
            if lean is not None:
                lean_rows = [f"const {lean.a.pointer} pto_a_row = {lean.a.place};",
                             f"const {lean.b.pointer} pto_b_row = {lean.b.place};"]
                lean_body = [*lean.a.loads, *lean.b.loads, *products]
            k_loops = [*lean_steps(f"r0 + 16 <= vr_{a}", lean_rows, lean_body),
                       *steps(a_loads + b_loads + products, first)]
            if registers is not None:
                body = units.each([units.bound(registers), *zero, *k_loops], unrolled=True)
            else:
                body = units.each([f"float acc[{units.blocks}][4] = {{}};",
                                   *(units.moved(f"acc[n][e] = {dst}[r][c];") if spec.accumulate else []),
                                   *k_loops, *units.moved(f"{dst}[r][c] = acc[n][e];")])
        if dst in g.wgmma:
            body = _wgmma_product(g, dst, a, b, spec.accumulate, body)
        return op_block(where, *region, [f"const int pto_kn = (int)vc_{a};", *body], dst)

    return Code(lines, whole=True)


def _wgmma_product(g: Layout, dst: str, a: str, b: str, accumulate: bool, mma_sync: list[str]) -> list[str]:
    """A product whose result's units lie as wgmma's (Generator._wgmma), where the build takes
    it (PTO_WGMMA; else `mma_sync`, the product's text elsewhere): each warpgroup its band of
    dst (its first unit: Units.for_wgmma), a pto_wgmma<N, true> a step of 16 of k, a K-major
    and b MN-major through their descriptors (pto_wgmma_k_major, pto_wgmma_mn_major), all
    committed as one group and waited for. The accumulators are the result's
    registers as they are. wgmma has no tests: where k's valid part ends within a step, the
    rest of the step is zeroed in a's columns and b's rows first (outside both valid regions,
    which the interpreter holds equal: what lies there may be anything, NaN too)."""
    units, declared_a, declared_b = g.units(dst), g.tiles[a], g.tiles[b]
    floats, lines_a, lines_b = 16 * units.turns, declared_a.rows, declared_b.rows

    def zeroed(tile: str, lines: int, count: str, at: str) -> list[str]:
        # not unrolled: the LLaMA MLP's matmul_acc (a loop over column blocks) spilled 48 bytes
        # at two blocks an SM with it, none without (115 registers)
        return ["PTO_UNROLL_BY(1)",
                f"for (int pto_e = threadIdx.x; pto_e < {count}; pto_e += PTO_THREADS) {{", f"    {at}",
                f"    if (k < pto_kw) *pto_wgmma_operand_at(&{tile}[0][0], {lines}, r, c) = (T)0.0f;", "}"]

    tail = ["if (pto_kn % 16 != 0) {  // the last step's k past the valid ones: zero in a and b",
            "    const int pto_kw = pto_kn + 15 - (pto_kn + 15) % 16;",
            *indent(zeroed(a, lines_a, f"{16 * lines_a}",
                           "const int r = pto_e / 16, c = pto_kn + pto_e % 16, k = c;")),
            *indent(zeroed(b, lines_b, f"{16 * declared_b.cols}", f"const int r = pto_kn + pto_e / "
                           f"{declared_b.cols}, c = pto_e % {declared_b.cols}, k = r;")),
            "    pto_wgmma_fence_operands();", "    __syncthreads();", "}"]
    zero = [] if accumulate else [f"for (int i = 0; i < {floats}; ++i) pto_d[i] = 0.0f;"]
    steps = [
        *tail,
        f"float (&pto_d)[{floats}] = reinterpret_cast<float (&)[{floats}]>(pto_frag_{dst});",
        *zero,
        f"const int pto_u0 = pto_warp / 4 * {units.warpgroup_step};  // the warpgroup's first unit",
        f"const unsigned pto_a = pto_wgmma_address(&{a}[0][0]), pto_b = pto_wgmma_address(&{b}[0][0]);",
        "pto_wgmma_aligned(pto_a | pto_b);",
        f"const unsigned pto_a_band = pto_a + 128 * 16 * (pto_u0 / {units.slices});",
        f"const unsigned pto_b_band = pto_b + {128 * lines_b} * (32 * (pto_u0 % {units.slices}) / 64);  "
        "// its panel",
        "pto_wgmma_take(pto_d);", "pto_wgmma_hold(pto_d);", "pto_wgmma_fence();",
        "for (int k0 = 0; k0 < pto_kn; k0 += 16) {",
        f"    const unsigned long long pto_da = pto_wgmma_k_major(pto_a_band, {lines_a}, k0);",
        f"    const unsigned long long pto_db = pto_wgmma_mn_major(pto_b_band, {lines_b}, k0);",
        f"    pto_wgmma<{units.wgmma_n}, true>(pto_d, pto_da, pto_db, true);", "}",
        "pto_wgmma_commit();", "pto_wgmma_wait<0>();", "pto_wgmma_take(pto_d);", "pto_wgmma_hold(pto_d);"]
    return for_wgmma(steps, mma_sync)


def _a_in_registers(g: Layout, a: str, b: str, blocks: int, b_loads: list[str],
                    products: list[str]) -> list[str]:
    """The loop over k of a 16-bit product whose a is in registers in whole rows, the unit's own
    rows (FlashAttention-2's probabilities handed to p·v): a's accumulators are A's fragments as
    they lie (C(g, 2t..) of a's 8-column blocks kb and kb + 1 are A(g, 2t..) and A(g, 2t + 8..)
    of the step from 8 kb), rounded to T in pairs, zero past a's valid columns (tested in the
    step they end in alone). b's fragments by
    ldmatrix where b is read in whole pairs of blocks (_lean_16_bit_b), its rows past a's valid
    columns (the last step's tail) zeroed in the registers: what lies there may be anything, NaN
    too; its columns past its valid ones reach only dst's past them. Else with a test an element
    (`b_loads`, _fragment_loads's). The loop is unrolled whole: a's registers are indexed by the
    step."""
    lean = _lean_16_bit_b(g, b, blocks)
    declared, tested = b_loads[0], b_loads[1:]
    assert declared.startswith("unsigned fb[")
    a_lines = [f"const float (&pto_a)[{g.units(a).blocks}][4] = pto_frag_{a}[pto_ui];"]

    def pairs(whole: bool) -> list[str]:
        first, second = ("pto_a[kb][e]", "pto_a[kb][e + 1]") if whole else \
            ("k < pto_kn ? pto_a[kb][e] : 0.0f", "k + 1 < pto_kn ? pto_a[kb][e + 1] : 0.0f")
        return ["PTO_UNROLL", "for (int q = 0; q < 4; ++q) {",
                "    [[maybe_unused]] const int kb = k0 / 8 + q / 2, e = 2 * (q % 2), k = 8 * kb + t2;",
                f"    fa[q] = pto_pack_pair({first}, {second});", "}"]

    fa = ["unsigned fa[4];  // A(g, t2..), A(g + 8, t2..), A(g, t2 + 8..), A(g + 8, t2 + 8..): C(g, 2t..)",
          f"if (k0 + {MMA_K} <= pto_kn) {{  // a whole step: no test an element", *indent(pairs(True)),
          "} else {", *indent(pairs(False)), "}"]
    if lean is None:
        fb = [declared, *tested]
    else:
        a_lines.append(f"const {lean.pointer} pto_b_row = {lean.place};")
        assert lean.loads[0].startswith("unsigned fb[")
        fb = [declared, *lean.loads[1:], f"if (k0 + {MMA_K} > pto_kn) {{  // B(k, c) past the valid k: zero",
              "    PTO_UNROLL", f"    for (int j = 0; j < {2 * blocks}; ++j) {{",
              "        const int k = k0 + t2 + 8 * (j % 2);  // the pair's first k",
              "        fb[j] &= (k < pto_kn ? 0xffffu : 0u) | (k + 1 < pto_kn ? 0xffff0000u : 0u);",
              "    }", "}"]
    return [*a_lines, "PTO_UNROLL", f"for (int k0 = 0; k0 < {g.tiles[a].cols}; k0 += {MMA_K}) {{",
            "    if (k0 >= pto_kn) break;", *indent(fa), *indent(fb), *indent(products), "}"]


@dataclasses.dataclass(frozen=True)
class _LeanOperand:
    """How a lane reads one operand's fragments by whole blocks (_lean_fragments): the C type of
    its place in the operand (a shared address for ldmatrix, else a pointer to ACC), that place
    (in a at (r0, 0), in b at (0, c0)), the lines that fill the fragment (fa, fb) at the step
    from k0 from the place once taken (pto_a_row, pto_b_row), and how far the place moves from
    a row of the operand to the next."""

    pointer: str
    place: str
    loads: list[str]
    row_step: int


@dataclasses.dataclass(frozen=True)
class _Lean:
    """A tensor-core product's fragments by whole blocks only: a's and b's, and the test that
    a unit's columns of b are whole."""

    a: _LeanOperand
    b: _LeanOperand
    b_whole: str


def _lean_fragments(g: Layout, a: str, b: str, blocks: int) -> _Lean | None:
    """The lean form of a product's fragments, with no test of the valid region a step (the
    unit's rows and columns are tested once, whole steps of k are the loop's), each read from a
    place in its operand taken before the loop over k: a packed operand's (or b's transposed
    source's) by ldmatrix at an address stepped by bytes (b's where a unit's columns are whole
    pairs of 8-column blocks), a float one's (a 16-bit product's operand computed in shared
    memory, as attention's probabilities; a TF32 product's) element by element at constant
    offsets. None where the fragments need the tests (_fragment_loads)."""
    if g.tiles[a].dtype == DataType.FLOAT32:
        lean_a, lean_b = _lean_tf32_a(g, a), _lean_tf32_b(g, b, blocks)
    else:
        lean_a, lean_b = _lean_16_bit_a(g, a), _lean_16_bit_b(g, b, blocks)
    return None if lean_b is None else _Lean(lean_a, lean_b, f"c0 + {8 * blocks} <= vc_{b}")


def _lean_16_bit_a(g: Layout, a: str) -> _LeanOperand:
    """a's fragment of a 16-bit product: a packed a's 16 x 16 block by one ldmatrix; a float
    one's A(g, 2t..), A(g + 8, 2t..), A(g, 2t + 8..), A(g + 8, 2t + 8..) as pairs from a's
    (r0 + g, 2t), each rounded to T (pto_pack_pair)."""
    pitch = g.pitch(a)
    if a in g.packed:
        size = g.tiles[a].dtype.numpy.itemsize
        place = f"pto_shared_address(&{a}[r0 + {_MATRIX_ROW} + {_MATRIX_LANE_ROW}][{_MATRIX_COL}])"
        loads = ["unsigned fa[4];", f"pto_ldmatrix_at(fa, pto_a_row + {size} * k0);"]
        return _LeanOperand("pto_shared_t", place, loads, size * pitch)
    pair = f"pto_a_row[k0 + {8 * pitch} * (q % 2) + 8 * (q / 2)"
    loads = ["unsigned fa[4];", "PTO_UNROLL",
             f"for (int q = 0; q < 4; ++q) fa[q] = pto_pack_pair({pair}], {pair} + 1]);"]
    return _LeanOperand("ACC *", f"&{a}[r0 + g][t2]", loads, pitch)


def _lean_16_bit_b(g: Layout, b: str, blocks: int) -> _LeanOperand | None:
    """b's fragments of a 16-bit product: a packed b's two 16 x 8 blocks at a time by one
    ldmatrix.trans (its transposed source's across, by ldmatrix), where the unit's blocks come
    in pairs (else None); a float b's B(2t.., c), B(2t + 8.., c) of each block's column
    c = c0 + 8n + g as pairs from b's (2t, c0 + g), each rounded to T."""
    source = g.transposed.get(b)
    size = g.tiles[b].dtype.numpy.itemsize
    if b in g.packed or source:
        if blocks % 2 != 0:
            return None
        if source:  # b's block of k0.. x c0 + 16p.. is the source's across: its matrices as they are
            place = f"pto_shared_address(&{source}[c0 + {_MATRIX_COL} + {_MATRIX_LANE_ROW}][{_MATRIX_ROW}])"
            pair = f"pto_ldmatrix_at(&fb[4 * p], pto_b_row + {size} * (k0 + {16 * g.pitch(source)} * p));"
        else:
            place = f"pto_shared_address(&{b}[{_MATRIX_ROW} + {_MATRIX_LANE_ROW}][c0 + {_MATRIX_COL}])"
            pair = f"pto_ldmatrix_trans_at(&fb[4 * p], pto_b_row + {size} * ({g.pitch(b)} * k0 + 16 * p));"
        loads = [f"unsigned fb[{2 * blocks}];", "PTO_UNROLL",
                 f"for (int p = 0; p < {blocks // 2}; ++p) {pair}"]
        return _LeanOperand("pto_shared_t", place, loads, size * g.pitch(b))
    pitch = g.pitch(b)
    element = f"pto_b_row[(k0 + 8 * q) * {pitch} + 8 * n"
    loads = [f"unsigned fb[{2 * blocks}];", "PTO_UNROLL", f"for (int n = 0; n < {blocks}; ++n) {{",
             "    PTO_UNROLL", f"    for (int q = 0; q < 2; ++q) fb[2 * n + q] = "
             f"pto_pack_pair({element}], {element} + {pitch}]);", "}"]
    return _LeanOperand("ACC *", f"&{b}[t2][c0 + g]", loads, pitch)


def _lean_tf32_a(g: Layout, a: str) -> _LeanOperand:
    """a's fragment of a TF32 product: A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4) at
    constant offsets from a's (r0 + g, t), each rounded to TF32 (pto_tf32)."""
    pitch = g.pitch(a)
    element = f"pto_a_row[k0 + {8 * pitch} * (q % 2) + 4 * (q / 2)]"
    loads = ["unsigned fa[4];", "PTO_UNROLL", f"for (int q = 0; q < 4; ++q) fa[q] = pto_tf32({element});"]
    return _LeanOperand("ACC *", f"&{a}[r0 + g][t]", loads, pitch)


def _lean_tf32_b(g: Layout, b: str, blocks: int) -> _LeanOperand:
    """b's fragments of a TF32 product: B(t, c), B(t + 4, c) of each block's column
    c = c0 + 8n + g from b's (t, c0 + g), each rounded to TF32."""
    pitch = g.pitch(b)
    loads = [f"unsigned fb[{2 * blocks}];", "PTO_UNROLL", f"for (int n = 0; n < {blocks}; ++n) {{",
             "    PTO_UNROLL", f"    for (int q = 0; q < 2; ++q) fb[2 * n + q] = "
             f"pto_tf32(pto_b_row[(k0 + 4 * q) * {pitch} + 8 * n]);", "}"]
    return _LeanOperand("ACC *", f"&{b}[t][c0 + g]", loads, pitch)


# The row a lane gives ldmatrix.x4 of a 16 x 16 block, as the offsets of its 8 x 8 matrix
# (matrix pto_lane / 8: 0 and 1 one above the other, 2 and 3 to their right) and its row in it:
# the matrix's first row and column in the block, and the lane's row in the matrix.
_MATRIX_ROW, _MATRIX_COL, _MATRIX_LANE_ROW = "8 * (pto_lane / 8 % 2)", "8 * (pto_lane / 16)", "pto_lane % 8"


def _fragment_loads(g: Layout, a: str, b: str, blocks: int) -> tuple[int, str, list[str], list[str]]:
    """(the step of k, the product function, the lines that fill a's fragment fa, and those that
    fill b's, for each block n of 8 columns, fb[2n], fb[2n + 1], at the step from k0), zero
    outside the valid regions. A packed operand's elements are read as they are: a whole 16 x 16
    block of it by one ldmatrix (b's transposed, two blocks of columns), else a pair of elements
    at a time."""
    source = g.transposed.get(b)  # b is this loaded tile, transposed: b(k, c) is source(c, k)

    def at(operand: str, row: str, col: str) -> str:
        return f"{source}[{col}][{row}]" if operand == b and source else f"{operand}[{row}][{col}]"

    def element(operand: str, row: str, col: str, valid: str) -> str:
        """An element of an operand in shared memory, 0 where `valid` (of the element's row
        {0} and column {1}) is false: as float, or as T where the operand is packed."""
        if operand in g.packed or (operand == b and source):
            return f"{valid.format(row, col)} ? {at(operand, row, col)} : (T)0.0f"
        return f"{valid.format(row, col)} ? (float){at(operand, row, col)} : 0.0f"

    def pair(operand: str, row: str, col: str, valid: str, row2: str, col2: str) -> str:
        """A register of two 16-bit elements: the bits of a packed operand's, else floats rounded."""
        packed = operand in g.packed or (operand == b and source)
        return f"{'pto_pair' if packed else 'pto_pack_pair'}({element(operand, row, col, valid)}, " \
            f"{element(operand, row2, col2, valid)})"

    a_valid, b_valid = f"r < vr_{a} && {{1}} < pto_kn", f"c < vc_{b} && {{0}} < pto_kn"
    if g.tiles[a].dtype == DataType.FLOAT32:  # TF32: an element a register, rounded
        step, a_k, b_k, product = TF32_MMA_K, "k0 + t + 4 * (q / 2)", "k0 + t + 4 * q", "pto_mma_tf32"
        a_register = f"pto_tf32({element(a, 'r', 'k', a_valid)})"
        b_register = f"pto_tf32({element(b, 'k', 'c', b_valid)})"
        fragments = ("A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4)", "B(t, c), B(t + 4, c)")
    else:  # 16-bit: two elements a register, along k
        step, a_k, b_k, product = MMA_K, "k0 + t2 + 8 * (q / 2)", "k0 + t2 + 8 * q", "pto_mma"
        a_register = pair(a, "r", "k", a_valid, "r", "k + 1")
        b_register = pair(b, "k", "c", b_valid, "k + 1", "c")
        fragments = ("A(g, t2..), A(g + 8, t2..), A(g, t2 + 8..), A(g + 8, t2 + 8..)",
                     "B(t2.., c), B(t2 + 8.., c)")
    a_lines = ["PTO_UNROLL", "for (int q = 0; q < 4; ++q) {",
               f"    const int r = r0 + g + 8 * (q % 2), k = {a_k};", f"    fa[q] = {a_register};", "}"]
    if a in g.packed:
        a_lines = [f"if (r0 + 16 <= vr_{a} && k0 + 16 <= pto_kn) {{",
                   f"    pto_ldmatrix(fa, &{a}[r0 + {_MATRIX_ROW} + {_MATRIX_LANE_ROW}]"
                   f"[k0 + {_MATRIX_COL}]);",
                   "} else {", *indent(a_lines), "}"]

    def b_blocks(first: int | str, stop: int | str) -> list[str]:
        return ["PTO_UNROLL", f"for (int n = {first}; n < {stop}; ++n) {{", "    PTO_UNROLL",
                "    for (int q = 0; q < 2; ++q) {",
                f"        const int c = c0 + 8 * n + g, k = {b_k};",
                f"        fb[2 * n + q] = {b_register};", "    }", "}"]

    pairs = blocks // 2 if b in g.packed or source else 0
    # b's block of k0.. x c0 + 16p..: matrix (q, n) of fb's order, its rows along k transposed;
    # in the source, whose rows are b's columns, the same block across, its matrices as they are
    if source:
        whole_block = f"pto_ldmatrix(&fb[4 * p], " \
            f"&{source}[c0 + 16 * p + {_MATRIX_COL} + {_MATRIX_LANE_ROW}][k0 + {_MATRIX_ROW}]);"
    else:
        whole_block = f"pto_ldmatrix_trans(&fb[4 * p], &{b}[k0 + {_MATRIX_ROW} + {_MATRIX_LANE_ROW}]" \
            f"[c0 + 16 * p + {_MATRIX_COL}]);"
    b_lines = [] if not pairs else [
        "PTO_UNROLL", f"for (int p = 0; p < {pairs}; ++p) {{",
        f"    if (k0 + 16 <= pto_kn && c0 + 16 * (p + 1) <= vc_{b}) {{", f"        {whole_block}",
        "    } else {", *indent(b_blocks("2 * p", "2 * p + 2"), 2), "    }", "}"]
    if 2 * pairs < blocks:
        b_lines += b_blocks(2 * pairs, blocks)
    b_declared = f"unsigned fb[{2 * blocks}];  // block n's, of columns c = c0 + 8 n + g: {fragments[1]}"
    return step, product, [f"unsigned fa[4];  // {fragments[0]}", *a_lines], [b_declared, *b_lines]


def accumulators_moved(tile: str, registers: str, units: Units, into_registers: bool) -> Code:
    """The valid region of `tile`'s accumulators moved between shared memory and `registers`
    (before and after a loop that keeps them there); nothing where the tile is in registers
    throughout (Generator._fragments)."""
    statement = f"acc[n][e] = {tile}[r][c];" if into_registers else f"{tile}[r][c] = acc[n][e];"
    where = f"{tile}'s accumulators {'into' if into_registers else 'from'} registers"

    def lines(g: Layout) -> list[str]:
        if tile in g.fragments:
            return []
        body = units.each([units.bound(registers), *units.moved(statement)], unrolled=True)
        return op_block(where, f"vr_{tile}", f"vc_{tile}", body, None)

    return Code(lines, whole=lambda g: tile not in g.fragments)
