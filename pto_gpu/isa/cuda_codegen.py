"""CUDA code generation for InCore functions: one `extern "C" __global__ pto_<name>` per function
(`PTO_ENTRY`, which the persistent kernel's module makes a device function of each instance:
pto_persistent.cuh).

The kernel takes the runtime's descriptor ABI (backends/cuda_abi.py): each memref, in
declaration order, as a pointer, three sizes and three element strides, then the scalar
parameters as double or long long. Callees are inlined. Work is laid out by rows: a warp owns a
row of every tile, its lanes stride over the columns (lane l holds columns l, l+32, ... in a
per-lane register array), row reductions combine lanes with __shfl_xor_sync. Valid regions
(tails) are runtime ints kept per tile, set from the memref sizes (docs/ISA.md, "Semantics").

Two layouts, chosen per function:

  row layout    every instruction is row-local, so each warp runs the whole function for one
                row at a time and the grid strides over rows (work items: rows x 32 threads);
                no shared memory, no barriers.
  block layout  some instruction reads a whole tile (MATMUL's b, COL_REDUCE's a, COL_EXPAND's
                b unless it is a broadcast row, TRANSPOSE's a), or an element of a memref that
                one thread writes may be one another thread accesses (an offset that moves in
                a loop, overlapping windows of
                two accesses that do not line up by rows and warps of columns): one block
                serves each batch index (the whole task when there is no batch; each band of
                rows of one when the function is a band of a taller call), its warps
                own rows warp, warp+PTO_WARPS, ...; the whole-tile operands live in shared
                memory, and a __syncthreads() comes before and after each whole-tile read and
                each access of such a memref, but none between reads (Generator._emit).
                The tiles are references into the block's
                dynamic shared memory at offsets (PTO_SHARED, Generator.shared_offsets),
                whose bytes the launch gives (CudaCode.shared_bytes).

Broadcast rows: where nothing else needs the block layout, a one-row tile loaded only from
memrefs the kernel never stores and read only as COL_EXPAND's b (a LayerNorm's weight) is every
warp's own copy, in registers: each warp loads row 0 itself, so the kernel needs no shared
memory, no barrier and keeps the row layout.

Batches: a memref may come with three dims; the function then runs once per index of the
leading dim (the largest among the memrefs; a memref whose leading dim is 1 is the same window
for every index), each index a run of rows in the row layout and a block in the block layout.
So one task can cover every head of an attention tile.

Tiles are computed in ACC (the kernel's compute type), float64 tiles in double whatever the
kernel's element type (TCVT converts between them: RoPE's angles).

Tensor cores (the products' text: cuda_mma.py; the layout they need: here): in a kernel of
float16 or bfloat16 memrefs (ACC float) a product (MATMUL,
MATMUL_ACC) whose destination differs from both operands is mma.sync.m16n8k16 instructions
(pto_isa.cuh's pto_mma: operands of the element type, float accumulators; sm_80 and later):
its operands and result are in shared memory, and each warp takes units of the result of 16
rows x 32 columns, summing over k in steps of 16 with the accumulators in registers. A result
whose every instruction can work on registers stays in them (Generator._fragments), in those
units, or in whole rows (a warp 16 rows, FlashAttention-2's form) with the tiles it is reduced
to by rows and the product it is the a of: attention's scores, row max and sum and output.
An operand only loaded and only read by such products is packed
(Generator._packed): kept as the element type in padded rows, its fragments read by
ldmatrix. A product accumulated over a loop keeps its accumulators in registers across it
(Context.accumulated), and the loop's loads of its packed operands copy later iterations'
chunks while this one's is multiplied (cp.async into the tile's other buffers, as many as fit:
Context.early_loads, Generator._prefetched, Generator._emit_prefetching). A warp whose
units are all of the same columns loads b's fragments once a step of k for all of them
(Units.each_turn), and whole
16 x 16 blocks come by ldmatrix from addresses taken before the loop over k (_lean_fragments;
float operands' elements at offsets from places taken so).
In a kernel of float32 memrefs whose function says `tf32`, its float32 products are the same
units of mma.sync.m16n8k8 over operands rounded to TF32 (pto_mma_tf32, pto_tf32), in steps
of 8.
Where the shared memory that takes is over the limit, every product of the kernel is FMA
instead (_generator). Other float32 products, and float64 ones, stay FMA, exact.

Per-element arithmetic comes from each opcode's `cuda` template in ops.OPCODES, so a new
element-wise, tile-scalar, reduction, expand or scalar entry needs no change here.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from ..backends.cuda_abi import HEADER, SHARED_LIMIT, SHARED_OPT_IN, THREADS_PER_BLOCK, WGMMA_HEADER
from ..dtypes import DataType
from ..kernel import CudaCode
from . import column_blocks
from .cuda_lines import WARP, WARPS, Code, Lines, for_wgmma, indent, op_block
from .cuda_mma import (
    MMA_K,
    REGISTER_ACCUMULATORS,
    TENSOR_CORE_BYTES,
    TENSOR_CORE_DTYPES,
    Units,
    accumulators_moved,
    packed_pitch,
    tensor_core_dtypes,
    tensor_core_kernel,
    tensor_core_product,
    tensor_matmul,
)
from .dataflow import directions
from .describe import describe
from .errors import ISAError
from .ir import Call, Direction, For, Function, If, Module, Op, Predicate, Return, Statement, Tile, walk
from .operands import Kind, signature
from .ops import OPCODES, Form, OpSpec
from .verify import verify_module

# Registers a lane may hold tiles in before a function's widest tiles are walked in blocks of
# columns (column_blocks.py), counting every tile in registers at once: the library's RMSNorm
# at 32 x 4096 held 64 in the block layout (two tiles of 4 rows x 8 columns a lane); a 64 x 768
# LayerNorm's two tiles there held 384 and spilled.
REGISTER_WORDS = 128
# The widest column block, and the narrower ones tried when a block of it holds too many
# registers: a lane holds COLUMN_BLOCK / 32 columns of each tile row it owns (kernels.tiles
# writes the library's wide rows in blocks of it).
COLUMN_BLOCK = 256
_BLOCK_WIDTHS = (COLUMN_BLOCK, 128, 64, WARP)
# How far a product's inner loop over one lane slot of k is unrolled. Left to the compiler it
# is unrolled whole, inside the unrolled row and slot loops, and NVRTC took 12 s and 72 s for
# attention's two products at 128-row tiles (88 s for the demo's first run on an H200); at 4,
# about 2 s each. The loop indexes no register array, so a partial unroll cannot push a tile
# out of registers: only the loops that index one (rows, slots) must unroll whole.
MATMUL_K_UNROLL = 4
# The registers a lane may hold tiles in for a tensor-core kernel to be fitted to two blocks an
# SM (Generator.resident_blocks): the matmul bands and the MLP's matmul_acc (32), flash_pv and
# flash_scores (16, 0) fit 128 registers with no spill; the fused attention (40 at d 64, 56 at
# d 128) is left its own count.
TWO_BLOCK_WORDS = 32
# The floats a lane may hold of the tiles kept in whole rows (Generator._fragments): a 128-row
# attention pass at d 128 and 64 keys holds 106 (o 64, the scores 32, five row values 2 each),
# under REGISTER_WORDS with room for the rest; d 256 (o alone 128) keeps its tiles the other way.
WHOLE_ROW_FLOATS = 112
# The forms whose tiles may all be kept in registers together (Generator._fragments), besides
# the transfers and tensor-core products.
_IN_REGISTERS = frozenset({Form.UNARY, Form.BINARY, Form.TILE_SCALAR, Form.MASK, Form.GENERATE,
                           Form.ROW_EXPAND, Form.ROW_REDUCE})
# The most buffers a tile loaded ahead takes (Generator._prefetched): one read, the others'
# copies in flight (CUTLASS's sm_80 GEMMs keep 3 to 5 stages). As many as fit
# Generator.block_room.
MAX_STAGES = 4
_COMPARE = {Predicate.LT: "<", Predicate.LE: "<=", Predicate.GT: ">", Predicate.GE: ">=", Predicate.EQ: "==",
            Predicate.NE: "!="}


def cuda_source(module: Module, function: str, split: tuple[str, ...] = (),
                block_shared: int = SHARED_OPT_IN) -> str:
    """The CUDA C of InCore function `function` of `module`, callees inlined; with `split`, its
    rows over blocks (see Generator); for a GPU whose blocks may opt in to `block_shared` bytes
    of shared memory (Generator.tile_budget)."""
    return _generator(module, function, split, block_shared).source()


def cuda_code(module: Module, function: str, cache_dir: Path, split: tuple[str, ...] = (),
              block_shared: int = SHARED_OPT_IN) -> CudaCode:
    """The pto.CudaCode of an InCore function: its generated source, written to
    cache_dir/<name>_<hash>.cu, and the work items of its launch; `block_shared` as
    cuda_source's."""
    generator = _generator(module, function, split, block_shared)
    source = generator.source()
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"{function}_{digest}.cu"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_text(source)
        partial.replace(path)  # atomic: a concurrent compile never reads half a file
    return CudaCode(path, WorkItems(generator.items, generator.split_param, generator.split_rows),
                    integer_scalars=tuple(_integer(scalar.dtype) for scalar in generator.params),
                    batches=True, shared_bytes=generator.shared_offsets()[1])


def _generator(module: Module, function: str, split: tuple[str, ...], block_shared: int) -> Generator:
    """The generator of `function`: products on tensor cores (tensor_core_dtypes) where what
    they keep in shared memory fits (operands, and results not in registers), else every
    product on FMA; in column blocks where its tiles need more registers or shared memory than
    a block has."""
    generator = Generator(module, function, split, tensor_cores=True, block_shared=block_shared)
    if generator.tensor_products and generator.shared_bytes() > generator.tile_budget():
        generator = Generator(module, function, split, tensor_cores=False, block_shared=block_shared)
    if not generator.within_budget():
        generator = _in_column_blocks(generator, split)
    generator.check_shared()
    return generator


def fits(module: Module, function: str, block_shared: int = SHARED_OPT_IN) -> bool:
    """Whether the CUDA code of InCore `function` is laid out as first tried: its products on
    tensor cores where their dtypes allow, its tiles within its tile_budget of shared memory on
    a GPU whose blocks may opt in to `block_shared` bytes, and within REGISTER_WORDS registers a
    lane (else cuda_code takes FMA or column blocks, or refuses): for a family trying sizes of
    its tiles."""
    return Generator(module, function, tensor_cores=True, block_shared=block_shared).within_budget()


def _in_column_blocks(generator: Generator, split: tuple[str, ...]) -> Generator:
    """The generator of the function walked in blocks of columns (column_blocks.py): of the
    widest block whose code's tiles fit (counted in the blocked code, whose layout may differ),
    else of the narrowest it can be blocked in; or `generator`, its source saying why the
    function cannot be."""
    function = generator.function
    width = column_blocks.widest(function)
    blocked, refusal = None, None
    for block in (b for b in _BLOCK_WIDTHS if b < width):
        try:
            narrowed = column_blocks.blocked(function, block)
        except column_blocks.NotBlockable as why:
            refusal = refusal or why
            continue
        module = Module(generator.module.name, {**generator.module.functions, function.name: narrowed})
        blocked = Generator(module, function.name, split, tensor_cores=True,
                            block_shared=generator.block_shared)
        blocked.note = (f"columns in blocks of {block} (at {width}, its tiles would hold "
                        f"{generator.register_words()} registers a lane)")
        if blocked.within_budget():
            break
    if blocked is None:
        generator.note = f"not in column blocks ({generator.register_words()} registers a lane): {refusal}"
        return generator
    return blocked


@dataclasses.dataclass(frozen=True)
class WorkItems:
    """A generated kernel's work items per batch index, whatever its memrefs' shapes: rows x 32
    threads in the row layout (a warp per row), one block's threads in the block layout; times
    the batch (the largest leading dim of the memrefs with three); in a kernel whose rows are
    split over blocks, times the blocks of `split_rows` rows of tensor param `split_param`."""

    count: int
    split_param: int | None = None
    split_rows: int = 0

    def __call__(self, shapes: list[tuple[int, ...]]) -> int:
        batch = max((s[0] for s in shapes if len(s) == 3), default=1)
        if self.split_param is None:
            return self.count * batch
        return self.count * batch * -(-shapes[self.split_param][-2] // self.split_rows)


@dataclasses.dataclass(frozen=True)
class _View:
    """A memref as an inlined function sees it: the parameter it lives in (its C prefix) and a
    window of it, as C expressions."""

    param: str
    row0: str
    col0: str
    rows: str
    cols: str


@dataclasses.dataclass(frozen=True)
class _Affine:
    """An offset as constant + sum of coefficient * name, to compare accesses' offsets."""

    const: int
    terms: tuple[tuple[str, int], ...] = ()

    def plus(self, other: _Affine, scale: int = 1) -> _Affine:
        terms = dict(self.terms)
        for name, coef in other.terms:
            terms[name] = terms.get(name, 0) + coef * scale
        return _Affine(self.const + other.const * scale, tuple(sorted((n, c) for n, c in terms.items() if c)))


@dataclasses.dataclass
class _Inlined:
    """A braced scope: a call inlined (its windows' definitions, then its body under the
    callee's C names), or a loop with its products' accumulators moved into registers before it
    and out after it (Context.loop)."""

    where: str
    body: list
    returns: bool
    label: str


@dataclasses.dataclass(frozen=True)
class _Access:
    """A TLOAD or TSTORE after inlining: the memref parameter, the offset and the tile's shape."""

    param: str
    offset: tuple[_Affine, _Affine] | None  # None: not an affine function of constants
    rows: int
    cols: int
    store: bool

    def apart(self, other: _Access, warp_aligned: Callable[[str, int], bool]) -> bool:
        """Whether no element is accessed by both, or each by the same thread in both: their
        offsets differ by constants and the windows are disjoint, or they differ by whole rows
        of zero and columns of whole warps, terms that are `warp_aligned` aside (column blocks
        of two loops over one row: each column stays on its lane in both)."""
        if self.offset is None or other.offset is None:
            return False
        (r, c), (r2, c2) = self.offset, other.offset
        dr, dc = r2.const - r.const, c2.const - c.const

        def fixed(terms: tuple) -> tuple:
            return tuple(term for term in terms if not warp_aligned(*term))

        same_thread = r.terms == r2.terms and dr == 0 and fixed(c.terms) == fixed(c2.terms) and dc % WARP == 0
        if (r.terms, c.terms) != (r2.terms, c2.terms):
            return same_thread
        # a loop symbol (named var@n, which no C name is) differs between iterations: columns
        # disjoint at one value of it may overlap at another (rows never carry one)
        moving = any("@" in name for name, _ in c.terms)
        disjoint = dr >= self.rows or -dr >= other.rows or \
            (not moving and (dc >= self.cols or -dc >= other.cols))
        return disjoint or same_thread



class Generator:
    """The CUDA code of one InCore function. With `split` (names of its memrefs, all of R rows)
    the function is one band of R rows of a taller call: the block layout's blocks take (batch
    index, band) pairs, each with those memrefs' windows moved down by its band's first row
    (pto_row0), their rows clipped to what is left, and MASK and GENERATE counting rows from
    the top of the call; the other memrefs are whole in every band. So a call of m rows is
    ceil(m / R) blocks per batch index where it would be one: right for a function whose rows
    of the split memrefs depend only on the same rows of the others split (a product's a and
    result, attention's query rows), which the caller (a family) vouches for."""

    def __init__(self, module: Module, name: str, split: tuple[str, ...] = (), tensor_cores: bool = False,
                 block_shared: int = SHARED_OPT_IN):
        verify_module(module)
        function = module.functions.get(name)
        if function is None:
            raise ISAError(f"module {module.name}: unknown function @{name}")
        if not function.in_core:
            raise ISAError(f"@{name} is an Orchestration; only InCore functions become CUDA kernels")
        if function.library is not None:
            raise ISAError(f"@{name} is the library kernel {function.library}, generated per call size by it")
        dtypes = sorted({m.dtype.name for m in function.memrefs})
        if len(dtypes) > 1:
            raise ISAError(f"@{name}: its memrefs are {', '.join(dtypes)}; CUDA code is generated for one "
                           "element type (PTO_T) per kernel")
        self.module, self.function = module, function
        self.block_shared = block_shared  # what a block may opt in to on the GPU (tile_budget)
        # Products on tensor cores (mma.sync, compute type float): the tiles are float in every
        # build of such a kernel, so shared memory counts 4 bytes an element.
        self.tensor_cores = tensor_cores and tensor_core_kernel(function)
        self.tensor_core_dtypes = tensor_core_dtypes(function)
        self.tensor_products = 0
        self.tiles: dict[str, Tile] = {}  # C name -> tile
        self.scalars: dict[str, str] = {}  # C name of a local scalar -> its C type
        self.types: dict[str, str] = {}  # C name of any scalar or loop variable -> its C type
        self.accesses: list[_Access] = []
        self.steps: dict[str, int] = {}  # a loop's symbol -> its constant step (loop-invariant start)
        self.starts: dict[str, int] = {}  # a loop's symbol -> its start, where a constant
        self.loops = 0
        self.whole: set[str] = set()  # tiles some instruction reads whole: shared memory
        self.expanded: set[str] = set()  # COL_EXPAND's b operands: whole, unless broadcast
        # tile -> per write ("load", memref param), ("transpose", the source tile), ("mma", None)
        # (a tensor-core product's result) or ("op", None)
        self.writes: dict[str, set] = {}
        # tile -> how it is read: "expand" (COL_EXPAND's b), "mma" and "mma_b" (a tensor-core
        # product's a and b), "mma_acc" (its accumulated result), "transpose" (TRANSPOSE's
        # source), "store" (TSTORE's), "other"
        self.reads: dict[str, set] = {}
        self.uses: list[_TileUse] = []  # every tile instruction, as _fragments weighs it
        self.loads: collections.Counter[str] = collections.Counter()  # tile -> its TLOADs
        # tile -> its TLOADs a TTRANS of it follows at once
        self.loads_transposed: collections.Counter[str] = collections.Counter()
        self.activations = 0
        self.prefetches: list[_Prefetch] = []  # TLOADs a FOR's earlier iteration may start (Context.loop)
        self.params = [s for s in function.scalars if s.param]
        self.split_param, self.split_rows = self._split(function, split)
        self.directions = directions(function, module)
        self.split = frozenset(split)
        top = {}
        for m in function.memrefs:
            rows = f"m_{_c(m.name)}_d1" + (" - pto_row0" if m.name in self.split else "")
            top[m.name] = _View(f"m_{_c(m.name)}", "0", "0", f"pto_clip({m.shape[0]}, {rows})",
                                f"pto_clip({m.shape[1]}, m_{_c(m.name)}_d2)")
        offsets = {m.name: (_Affine(0), _Affine(0)) for m in function.memrefs}
        self.body, self.returns, self.label = self._inline(function, top, offsets)
        self.hazards = self._hazards()
        self.stored = {access.param for access in self.accesses if access.store}  # memref params
        self.accessed = collections.Counter(access.param for access in self.accesses)  # its TLOAD/TSTOREs
        self.broadcast = self._broadcast()
        self.whole |= self.expanded - self.broadcast
        self.transposed = self._transposed()
        self.fragments, self.row_owned = self._fragments()
        self.whole -= set(self.transposed) | self.fragments
        # a row's factor not in registers is read by the lanes that hold the row's elements
        self.whole |= {use.srcs[1] for use in self.uses if use.form is Form.ROW_EXPAND
                       and use.dst in self.fragments and use.srcs[1] not in self.fragments}
        self.packed = self._packed()
        self.swizzled, self.wgmma = self._wgmma()
        self.block = bool(self.whole or self.hazards)
        self.staged: set[str] = set()  # tiles in `stages` buffers: one read, the others copied into
        self.prefetched, self.stages = self._prefetched()
        self.staged = {prefetch.tile for prefetch in self.prefetched}
        if split and not self.block:
            raise ISAError(f"@{name}: its rows cannot be split over blocks: it is in the row layout, whose "
                           "grid is over rows already")
        self.rows = max((t.rows for t in self.tiles.values()), default=1)
        self.items = THREADS_PER_BLOCK if self.block else self.rows * WARP
        self.note = ""  # said in the source's first line: how wide rows are walked

    def _split(self, function: Function, split: tuple[str, ...]) -> tuple[int | None, int]:
        """(the index of the first split memref, its rows), or (None, 0) without a split."""
        if not split:
            return None, 0
        names = [m.name for m in function.memrefs]
        unknown = [name for name in split if name not in names]
        rows = {function.memref(name).shape[0] for name in split if name in names}
        if unknown or len(rows) != 1:
            why = f"no memref {', '.join(unknown)}" if unknown else f"their rows differ: {sorted(rows)}"
            raise ISAError(f"@{function.name}: cannot split rows of {', '.join(split)}: {why}")
        return names.index(split[0]), rows.pop()

    # --- inlining and analysis --------------------------------------------------------------
    def _inline(self, function: Function, views: dict[str, _View],
                offsets: dict[str, tuple[_Affine, _Affine] | None]) -> tuple[list, bool, str]:
        """The body of one activation with C names: tiles t<k>_x, scalars s<k>_x, loop variables
        i<k>_x; memrefs as views. Returns (body, whether it returns, its end label)."""
        k = self.activations
        self.activations += 1
        suffix = "" if k == 0 else str(k)
        names: dict[str, str] = {}
        for tile in function.tiles:
            names[tile.name] = f"t{suffix}_{_c(tile.name)}"
            self.tiles[names[tile.name]] = tile
        for scalar in function.scalars:
            names[scalar.name] = f"s{suffix}_{_c(scalar.name)}"
            ctype = _scalar_ctype(scalar.dtype)
            self.types[names[scalar.name]] = ctype
            if not scalar.param:
                self.scalars[names[scalar.name]] = ctype
        context = Context(self, function, names, views, offsets, suffix)
        body = context.block(function.body)
        return body, context.returns, context.label

    def _broadcast(self) -> set[str]:
        """The one-row tiles every warp holds a copy of in registers: read only as COL_EXPAND's
        b (a weight row) and loaded only from memrefs the kernel never stores (so every copy is
        the same). So a LayerNorm's or RMSNorm's weight needs no shared memory and the kernel
        keeps the row layout (a warp per row) rather than one block per task; where something
        else puts it in the block layout (another whole read, a hazard, a split into bands),
        the row stays in shared memory, once for the block, not in every warp's registers."""
        if self.whole or self.hazards or self.split:
            return set()
        return {tile for tile in self.expanded
                if self.tiles[tile].rows == 1 and self.reads.get(tile) == {"expand"} and self.writes.get(tile)
                and all(kind == "load" and param not in self.stored for kind, param in self.writes[tile])}

    def _transposed(self) -> dict[str, str]:
        """The tiles read only as tensor-core products' b that are each a loaded 16-bit tile's
        transpose: tile -> the loaded tile, which the products read in its place, transposed
        (k's rows are the fragments' pairs of a q·kᵀ), so the tile needs no shared memory, no
        copy and no barrier. Each write of the tile is a TTRANS of the loaded one, which nothing
        else reads and whose every TLOAD comes right before such a TTRANS: nothing changes it
        between the two."""
        views = {}
        for tile, writes in self.writes.items():
            if self.reads.get(tile) != {"mma_b"} or len(writes) != 1:
                continue
            (kind, source), = writes
            others = [t for t, w in self.writes.items() if t != tile and ("transpose", source) in w]
            if kind == "transpose" and self.tiles[source].dtype in TENSOR_CORE_DTYPES and not others \
                    and self.reads.get(source) == {"transpose"} and self.writes.get(source) \
                    and all(write == "load" for write, _ in self.writes[source]) \
                    and self.loads.get(source) == self.loads_transposed.get(source):
                views[tile] = source
        return views

    def _fragments(self) -> tuple[set[str], set[str]]:
        """(the tiles kept in registers from the kernel's start to its end, as tensor-core
        products' units hold them (pto_frag_<tile>), those of them in whole rows). A tile may be
        (_in_registers) where every instruction that touches it can work on registers: a
        tensor-core product (as its result, or as its a where that is the result's own rows),
        a transfer, or an element-wise, generated, row-expanded or row-reduced instruction
        whose tiles are all in registers (a ROW_EXPAND's b may be in shared memory). Of those,
        the groups the instructions join that hold a product's result are kept:

        - in whole rows (Units.rows_of: a warp a band of 16 rows, one-column tiles as each
          row's value in the lanes that hold its elements) where the group reduces rows or
          hands a product its a: attention's scores, their row max and sum, its output, with
          no shared memory and no barrier between its products (FlashAttention-2's form), while
          a lane holds at most WHOLE_ROW_FLOATS of them all;
        - else in the result's own units (Units.of), its tiles all of the result's shape (a
          ROW_EXPAND's b, the row factors of attention's output, then in shared memory), while
          a lane holds at most REGISTER_ACCUMULATORS floats of them.

        In the order of their first tile's name; a group over its budget, and a tile a group
        cannot take, go to shared memory (of a group in whole rows, all but its results, which
        may then be kept in their own units), and the choice is made again without them."""
        excluded: set[str] = set()
        while True:
            candidates = self._in_registers(excluded)
            kept, owned, dropped, floats = set(), set(), set(), 0
            for group in self._groups(candidates):
                results = sorted(use.dst for use in self.uses if use.tensor and use.dst in group)
                if not results:
                    dropped |= group
                    continue
                whole_rows = any(use.form is Form.ROW_REDUCE and use.dst in group or
                                 use.tensor and use.srcs[0] in group for use in self.uses)
                if whole_rows:  # a one-column result is a product's accumulators, not its rows' values
                    misfits = {tile for tile in results if self.tiles[tile].cols == 1}
                    cost, budget = sum(map(self._row_floats, group)), WHOLE_ROW_FLOATS
                else:  # one shape; a ROW_EXPAND's b, read by rows, in shared memory
                    factors = {use.srcs[1] for use in self.uses if use.form is Form.ROW_EXPAND}
                    misfits = {tile for tile in group if self._shape(tile) != self._shape(results[0])
                               or tile in factors}
                    cost = sum(Units.of(self.tiles[tile]).floats for tile in group)
                    budget = REGISTER_ACCUMULATORS
                if misfits:
                    dropped |= misfits
                    continue
                if floats + cost > budget:  # whole rows past the budget: its results alone, maybe
                    dropped |= (group - set(results) if whole_rows else set()) or group
                    continue
                floats += cost
                kept |= group
                if whole_rows:
                    owned |= group
            if not dropped:
                return kept, owned
            excluded |= dropped

    def _shape(self, tile: str) -> tuple[int, int]:
        return self.tiles[tile].rows, self.tiles[tile].cols

    def _in_registers(self, excluded: set[str]) -> set[str]:
        """The tiles that may be kept in registers (_fragments), but for `excluded`: of a
        tensor-core kernel's type, every instruction touching them able to work on them there
        with the others so kept, found by dropping misfits until none is left. A product's a
        is one only in a 16-bit kernel (a TF32 fragment is not its C's layout), of whole steps
        of k, computed in the kernel (a tile only loaded is read better packed, by ldmatrix)
        and where its result is one too."""
        if not self.tensor_cores:
            return set()
        kept = {tile for tile, declared in self.tiles.items()
                if declared.dtype in self.tensor_core_dtypes and tile not in excluded}
        only_loaded = {tile for tile, writes in self.writes.items()
                       if all(kind == "load" for kind, _ in writes)}
        sixteen_bit = self.tensor_core_dtypes[0] in TENSOR_CORE_DTYPES

        def misfits(use: _TileUse) -> set[str]:
            tiles = {use.dst, *use.srcs} - {None}
            if use.form in (Form.LOAD, Form.STORE):
                return set()
            if use.form is Form.MATMUL:
                if not use.tensor:
                    return tiles
                dst, a, b = use.dst, *use.srcs
                drop_a = a in kept and (not sixteen_bit or a in only_loaded or dst not in kept
                                        or self.tiles[a].cols % MMA_K != 0)
                return {b, *((a,) if drop_a else ())}
            one_column = use.form is Form.ROW_REDUCE and self.tiles[use.srcs[0]].cols == 1
            if use.form not in _IN_REGISTERS or one_column:  # a row value is not reduced again
                return tiles
            together = {use.dst, use.srcs[0]} if use.form is Form.ROW_EXPAND else tiles
            if together & kept and not together <= kept:
                return tiles
            return {use.srcs[1]} if use.form is Form.ROW_EXPAND and use.dst not in kept else set()

        while dropped := set().union(*map(misfits, self.uses)) & kept:
            kept -= dropped
        return kept

    def _groups(self, kept: set[str]) -> list[set[str]]:
        """The tiles of `kept` in groups that instructions join (a product's result and its a,
        an element-wise instruction's tiles, a ROW_EXPAND's b), by their first tile's name."""
        group_of = {tile: {tile} for tile in kept}
        for use in self.uses:
            joined = [tile for tile in (use.dst, *use.srcs) if tile in kept]
            if use.form is Form.MATMUL:
                joined = joined[:2] if use.srcs[0] in kept else joined[:1]
            for tile in joined[1:]:
                first, other = group_of[joined[0]], group_of[tile]
                if first is not other:
                    first |= other
                    for member in other:
                        group_of[member] = first
        groups = {id(group): group for group in group_of.values()}
        return sorted(groups.values(), key=min)

    def _row_floats(self, tile: str) -> int:
        """The floats a lane holds of a tile kept in whole rows."""
        units = Units.rows_of(self.tiles[tile].rows, self.tiles[tile].cols)
        return 2 * units.turns if self.tiles[tile].cols == 1 else units.floats

    def units(self, tile: str) -> Units:
        """How the warps share a tile kept in registers (or a product's result) out."""
        declared = self.tiles[tile]
        if tile in self.row_owned:
            return Units.rows_of(declared.rows, declared.cols)
        return Units.for_wgmma(declared.rows, declared.cols) if tile in self.wgmma else Units.of(declared)

    def row_values(self, tile: str) -> bool:
        """Whether a tile in registers is one column in whole rows: a row's value a lane."""
        return tile in self.row_owned and self.tiles[tile].cols == 1

    def fragment_floats(self, tile: str) -> int:
        """The floats a lane holds of a tile kept in registers."""
        return self._row_floats(tile) if tile in self.row_owned else Units.of(self.tiles[tile]).floats

    def _packed(self) -> set[str]:
        """The tiles kept in shared memory as T, 16-bit, in rows of packed_pitch elements: read
        only as operands of tensor-core products (or transposed for one: _transposed) and written
        only by TLOADs (from memrefs of T), so the values are T's exactly and the products read
        their bits as fragments with no conversion. Others are float there."""
        sources = set(self.transposed.values())

        def operand(tile: str) -> bool:
            allowed = {"mma", "mma_b", "transpose"} if tile in sources else {"mma", "mma_b"}
            return self.reads.get(tile, set()) <= allowed

        return {tile for tile in self.whole
                if self.tiles[tile].dtype in TENSOR_CORE_DTYPES and self.reads.get(tile) and operand(tile)
                and self.writes.get(tile) and all(kind == "load" for kind, _ in self.writes[tile])}

    def _wgmma(self) -> tuple[set[str], set[str]]:
        """(the tiles laid out for wgmma, the tiles whose units lie as its accumulators do), for
        the products that take wgmma where the build says so (PTO_WGMMA: sm_90a), mma.sync
        elsewhere. A product does whose result is kept in registers in its own units, of a shape
        Units.for_wgmma fits, and whose a and b are packed with rows and columns of whole
        64s: the operands (`swizzled`) then lie in panels of 64 columns of 128-byte swizzled
        lines (pto_wgmma_operand_at), 1024-byte aligned, in the room every build gives them
        (their padded rows as packed tiles take more). So every product that reads such an
        operand must take wgmma, and every product whose result is in the register group of
        such a result (its units then lie as wgmma's in every instruction touching the group):
        the products for which that fails are dropped until none does."""
        if not self.tensor_cores or self.tensor_core_dtypes[0] not in TENSOR_CORE_DTYPES:
            return set(), set()
        products = [use for use in self.uses if use.form is Form.MATMUL and use.tensor]
        group_of = {tile: group for group in self._groups(self.fragments) for tile in group}

        def fits(use: _TileUse) -> bool:
            (dst, a, b), (rows, cols) = (use.dst, *use.srcs), self._shape(use.dst)
            operands = (self._shape(a), self._shape(b))
            return dst in self.fragments and dst not in self.row_owned \
                and Units.for_wgmma(rows, cols) is not None \
                and {a, b} <= self.packed and not {a, b} & set(self.transposed.values()) \
                and operands[0][0] == rows and operands[1][1] == cols and operands[0][1] == operands[1][0] \
                and all(size % 64 == 0 for shape in operands for size in shape)

        chosen = [use for use in products if fits(use)]
        while True:
            dropped = {use.dst for use in products if use not in chosen}
            operands = {tile for use in products if use not in chosen for tile in use.srcs}
            kept = [use for use in chosen if not {*use.srcs} & operands
                    and not any(group_of[use.dst] is group_of.get(tile) for tile in dropped)]
            if kept == chosen:
                break
            chosen = kept
        swizzled = {tile for use in chosen for tile in use.srcs}
        return swizzled, {tile for use in chosen for tile in group_of[use.dst]}

    def _prefetched(self) -> tuple[set[_Prefetch], int]:
        """The TLOADs whose copies for a FOR's later iterations start before those iterations
        (cp.async into the tile's other buffers, Generator._emit_prefetching), so the copies
        run while the products of the iterations before do, and the buffers each such tile
        takes (stages): each into a packed tile (read only by products, whose barriers fence
        the buffers) from a memref the kernel never stores (so the copy may run early). All
        such loads, in as many buffers, up to MAX_STAGES, as fit block_room beside the
        other tiles as they are laid out (shared_offsets: a packed tile's bytes are a multiple
        of 16); where not even two do (the tiles of a kernel within budget take at most
        tile_budget, half of it, so only if their rounding to 16 bytes tips it), two for
        those that fit, in the loops' order."""
        candidates = [prefetch for prefetch in self.prefetches
                      if prefetch.tile in self.packed and prefetch.param not in self.stored]
        room = self.block_room() - self.shared_offsets()[1]
        per_stage = sum(map(self.buffer_bytes, {prefetch.tile for prefetch in candidates}))
        stages = min(MAX_STAGES, 1 + room // per_stage) if per_stage else 1
        if stages >= 2 or not candidates:
            return set(candidates), stages
        chosen, staged = set(), set()
        for prefetch in candidates:
            extra = 0 if prefetch.tile in staged else self.buffer_bytes(prefetch.tile)
            if extra <= room:
                room -= extra
                staged.add(prefetch.tile)
                chosen.add(prefetch)
        return chosen, 2

    def _hazards(self) -> set[str]:
        """Memrefs written where an element one thread writes may be one another thread
        accesses (at an offset that moves, or a window that overlaps another differently)."""
        hazards = set()
        for first in self.accesses:
            for second in self.accesses:
                if first.param == second.param and (first.store or second.store) and \
                        not first.apart(second, self._warp_aligned):
                    hazards.add(first.param)
        return hazards

    def _warp_aligned(self, symbol: str, coefficient: int) -> bool:
        """Whether a column term moves by whole warps of columns from a multiple of 32: a loop
        from a constant multiple of 32 in steps of multiples of 32 (after the coefficient), so
        every value of it keeps a column on its lane, whatever the loop."""
        start, step = self.starts.get(symbol), self.steps.get(symbol)
        return start is not None and step is not None and (start * coefficient) % WARP == 0 and \
            (step * coefficient) % WARP == 0

    def call_row(self, row: str) -> str:
        """A tile row as a row of the call: below the band's first row when the rows are split."""
        return f"{row} + pto_row0" if self.split else row

    def element_bytes(self, tile: str) -> int:
        """Bytes of a tile's element in shared memory: a double's for a float64 tile, T's for a
        packed one, a float's for the others of a tensor-core kernel (16-bit, or float32 as TF32:
        built for that type only), else a double's (one source serves every element type the
        kernel is compiled for)."""
        if tile in self.packed:
            return self.tiles[tile].dtype.numpy.itemsize
        return TENSOR_CORE_BYTES if self.tensor_cores and self.ctype(tile) != "double" else 8

    def pitch(self, tile: str) -> int:
        """Elements from one row of a tile in shared memory to the next."""
        cols = self.tiles[tile].cols
        return packed_pitch(cols) if tile in self.packed else cols

    def buffer_bytes(self, tile: str) -> int:
        """The shared memory one buffer of tile `tile`, read whole, takes."""
        return self.tiles[tile].rows * self.pitch(tile) * self.element_bytes(tile)

    def tile_bytes(self, tile: str) -> int:
        """The shared memory tile `tile` takes, read whole (all the buffers of one loaded ahead)."""
        return (self.stages if tile in self.staged else 1) * self.buffer_bytes(tile)

    def shared_bytes(self) -> int:
        """The shared memory its tiles take, a buffer each: what tile_budget bounds (the other
        buffers of loads ahead come on top, within block_room)."""
        return sum(map(self.buffer_bytes, self.whole))

    def shared_offsets(self) -> tuple[dict[str, int], int]:
        """Where each tile read whole lies in the block's dynamic shared memory (PTO_SHARED;
        in the persistent kernel, the memory the instances of a run take turns in), and the
        bytes they span, the launch's: in name order, each at a multiple of 16 bytes (a packed
        tile's rows are read 16 bytes at a time), the tiles laid out for wgmma first: their
        buffers' bytes are multiples of 1024 (rows of whole 64s), so each lies 1024-byte
        aligned, as wgmma's atoms must, with no room lost to it."""
        offsets, end = {}, 0
        for tile in sorted(self.whole, key=lambda tile: (tile not in self.swizzled, tile)):
            offsets[tile] = end
            end += -(-self.tile_bytes(tile) // 16) * 16
        return offsets, end

    def register_words(self) -> int:
        """Registers a lane holds tiles in, all at once (an upper bound: some are never live
        together): per register tile, its rows this warp owns times its columns per lane, and
        the accumulators of the results kept in registers throughout (not a loop's, which live
        in the loop only)."""
        rows = (lambda tile: math.ceil(tile.rows / WARPS)) if self.block else (lambda tile: 1)
        elsewhere = self.whole | set(self.transposed) | self.fragments
        return sum(rows(tile) * math.ceil(tile.cols / WARP)
                   for c_name, tile in self.tiles.items() if c_name not in elsewhere) + \
            sum(map(self.fragment_floats, self.fragments))

    def resident_blocks(self) -> int:
        """The blocks an SM should hold at once, which ptxas fits the registers to
        (__launch_bounds__): 2 for a tensor-core kernel whose tiles in registers are at most
        TWO_BLOCK_WORDS a lane, whose barriers then stall one block while the other multiplies
        (the 64 x 128 matmul band took 136 registers, one block an SM; held to two, 108 and no
        spill; 108 at chunks of 64 of k in three buffers); 1 otherwise, where holding to 128 spilled (flash_pv
        at 8 x 128 x 128 once: 196 bytes, with 234 needed; the fused attention at d 128: 192)."""
        small = self.tensor_products and self.register_words() <= TWO_BLOCK_WORDS
        return 2 if small else 1

    def holds_an_sm(self) -> bool:
        """Whether a block of it is alone on its SM: a tensor-core kernel whose registers hold it
        to one block an SM (resident_blocks), so the SM's shared memory is its block's."""
        return bool(self.tensor_products) and self.resident_blocks() == 1

    def tile_budget(self) -> int:
        """The shared memory its tiles may take, a buffer each: SHARED_LIMIT, which leaves two
        blocks an SM room for loads ahead on any GPU; a kernel that holds an SM, half of what a
        block may opt in to where that is more (so that each load ahead still has a second
        buffer beside them): the fused attention's q whole at head dim 128 on sm_80 and sm_90,
        where it took q in chunks loaded again every key block."""
        return max(SHARED_LIMIT, self.block_shared // 2) if self.holds_an_sm() else SHARED_LIMIT

    def block_room(self) -> int:
        """The shared memory a block of it may take, loads ahead's buffers included: what a
        block may opt in to on the GPU where it holds an SM, else SHARED_OPT_IN (two blocks an
        SM on an H100's 228 KiB)."""
        return self.block_shared if self.holds_an_sm() else min(SHARED_OPT_IN, self.block_shared)

    def within_budget(self) -> bool:
        """Whether its tiles fit a block: tile_budget bytes of shared memory, REGISTER_WORDS
        registers a lane."""
        return self.shared_bytes() <= self.tile_budget() and self.register_words() <= REGISTER_WORDS

    def check_shared(self) -> None:
        size, budget = self.shared_bytes(), self.tile_budget()
        if size > budget:
            kind = "float" if self.tensor_cores else "float64"
            raise ISAError(f"@{self.function.name}: the tiles read whole ({', '.join(sorted(self.whole))}) "
                           f"need {size} bytes of shared memory as {kind}, over {budget}")

    # --- emission ---------------------------------------------------------------------------
    def source(self) -> str:
        name = self.function.name
        params = []
        for memref in self.function.memrefs:
            prefix = f"m_{_c(memref.name)}"
            const = "const " if self.directions[memref.name] == Direction.INPUT else ""
            params.append(f"{const}T *{prefix}_base, " + ", ".join(f"long long {prefix}_{w}" for w in
                                                                  ("d0", "d1", "d2", "s0", "s1", "s2")))
        for scalar in self.params:  # as the ABI passes them; rounded to their type below
            params.append(f"{'long long' if _integer(scalar.dtype) else 'double'} p_{_c(scalar.name)}")
        out = Lines()
        layout = "block layout: a block per batch index" if self.block else "row layout: a warp per row"
        layout += f"; {self.note}" if self.note else ""
        out.add(f"// Generated by pto_gpu.isa.cuda_codegen from @{name} ({self.module.name}): {layout}.")
        out.add(f"#define PTO_WARPS {WARPS}")
        out.extend(HEADER.read_text().splitlines())
        if self.wgmma:
            out.extend(WGMMA_HEADER.read_text().splitlines())
        out.add("")
        out.add(f"PTO_ENTRY({self.resident_blocks()}) pto_{name}(")
        out.add("    " + ",\n    ".join(params) + ") {")
        out.indent += 1
        out.add("[[maybe_unused]] const int pto_lane = threadIdx.x % 32;")
        for scalar in self.params:
            c_name = f"s_{_c(scalar.name)}"
            ctype = self.types[c_name]
            out.add(f"[[maybe_unused]] const {ctype} {c_name} = ({ctype})p_{_c(scalar.name)};")
        # A batch: memrefs of three dims run the function once per leading index; one whose
        # leading dim is 1 (every 2-d memref) is the same window for every index.
        batch = "1"
        for memref in self.function.memrefs:
            d0 = f"m_{_c(memref.name)}_d0"
            batch = d0 if batch == "1" else f"({d0} > {batch} ? {d0} : {batch})"
        out.add(f"const long long pto_batch = {batch};")
        if self.block:
            out.add("[[maybe_unused]] const int pto_warp = threadIdx.x / 32;")
            offsets, _ = self.shared_offsets()
            for tile in sorted(self.whole):
                shape = f"[{self.tiles[tile].rows}][{self.pitch(tile)}]"
                ctype = "T" if tile in self.packed else self.ctype(tile)
                if tile in self.staged:  # the tile is the buffer read now, the others are copied into
                    out.add(f"PTO_SHARED({ctype}, pto_buf_{tile}, [{self.stages}]{shape}, {offsets[tile]});")
                    out.add(f"{ctype} (*{tile})[{self.pitch(tile)}] = pto_buf_{tile}[0];")
                else:
                    out.add(f"PTO_SHARED({ctype}, {tile}, {shape}, {offsets[tile]});")
            if self.split_param is None:
                out.add("for (long long pto_b = blockIdx.x; pto_b < pto_batch; pto_b += gridDim.x) {"
                        "  // a block")
                out.indent += 1
            else:  # a block per (batch index, band of rows)
                rows, band = f"m_{_c(self.function.memrefs[self.split_param].name)}_d1", self.split_rows
                out.add(f"const long long pto_bands = ({rows} + {band - 1}) / {band};")
                out.add("for (long long pto_i = blockIdx.x; pto_i < pto_batch * pto_bands; "
                        "pto_i += gridDim.x) {  // a block")
                out.indent += 1
                out.add(f"const long long pto_b = pto_i / pto_bands, pto_row0 = pto_i % pto_bands * {band};")
            self._windows(out)
            self._declarations(out)
            self._emit_body(out, self.body, self.returns, self.label)
            out.add("__syncthreads();  // the next index's shared memory writes wait for this one's reads")
            out.owed = False
            out.indent -= 1
            out.add("}")
        else:
            out.add("for (long long pto_w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; "
                    f"pto_w < pto_batch * {self.rows};")
            out.add("     pto_w += gridDim.x * (long long)blockDim.x / 32) {  // a warp per row")
            out.indent += 1
            out.add(f"const long long pto_b = pto_w / {self.rows}, pto_r = pto_w % {self.rows};")
            self._windows(out)
            self._declarations(out)
            self._emit_body(out, self.body, self.returns, self.label)
            out.indent -= 1
            out.add("}")
        out.indent -= 1
        out.add("}")
        words = [p for param in params for p in param.split(", ")]
        args = ", ".join(re.sub(r".*[ *]", "", p) for p in words)
        # The driver's form, for the CUDA emulator: each argument read from kernelParams[i] (a
        # pointer to its value, as cuLaunchKernel takes them), so the emulator tests the words a
        # GPU would receive. A block of other than PTO_THREADS threads is refused, as a GPU would
        # refuse one past __launch_bounds__.
        types = [re.sub(r"\w+$", "", word).strip() for word in words]
        unpacked = ", ".join(f"*({ctype} *)pto_params[{i}]" for i, ctype in enumerate(types))
        # The persistent kernel's call of this instance (pto_persistent.cuh): its words as
        # the host wrote them for the task, each read as its param's type.
        read = ", ".join(f"pto_word<{ctype}>(pto_words + {i})" for i, ctype in enumerate(types))
        out.add("#ifdef PTO_PERSISTENT")
        out.add("PTO_TASK(const long long *pto_words) {")
        out.add(f"    pto_{name}({read});")
        out.add("}")
        out.add("#endif")
        shared = self.shared_offsets()[1]
        out.add("#if !defined(__CUDACC__) && !defined(PTO_PERSISTENT)  // the host build: run a grid of "
                "blocks of threads (pto_isa.cuh)")
        out.add(f'extern "C" void pto_host_{name}(long long pto_blocks, {", ".join(params)}) {{')
        out.add(f"    pto_host_launch(pto_blocks, {shared}, [&] {{ pto_{name}({args}); }});")
        out.add("}")
        # A launch with less dynamic shared memory than the tiles take faults, as its first
        # access past the end would on a GPU.
        out.add(f'extern "C" int pto_launch_{name}(const unsigned *pto_grid, const unsigned *pto_block, '
                "unsigned pto_shared, void **pto_params, void *) {")
        too_little = f" || pto_shared < {shared}" if shared else ""
        out.add("    if (pto_block[0] != PTO_THREADS || pto_block[1] != 1 || pto_block[2] != 1 || "
                f"pto_grid[1] != 1 || pto_grid[2] != 1{too_little}) return 1;")
        out.add(f"    pto_host_launch(pto_grid[0], pto_shared, [&] {{ pto_{name}({unpacked}); }});")
        out.add("    return 0;")
        out.add("}")
        out.add("#endif")
        return out.text()

    def ctype(self, tile: str) -> str:
        """The C type tile `tile` (a C name) is computed in: ACC (the kernel's compute type), or
        double for a float64 tile in a kernel of another element type (TCVT's other side)."""
        return "double" if self.tiles[tile].dtype == DataType.FLOAT64 else "ACC"

    def _windows(self, out: Lines) -> None:
        """Each memref's window for batch index pto_b."""
        for memref in self.function.memrefs:
            prefix = f"m_{_c(memref.name)}"
            const = "const " if self.directions[memref.name] == Direction.INPUT else ""
            band = f" + pto_row0 * {prefix}_s1" if memref.name in self.split else ""
            out.add(f"{const}T *{prefix}_p = {prefix}_base + pto_b % {prefix}_d0 * {prefix}_s0{band};")

    def _declarations(self, out: Lines) -> None:
        for c_name, tile in self.tiles.items():
            if c_name in self.fragments:
                units = self.units(c_name)
                declare = units.row_values if self.row_values(c_name) else units.registers
                out.add(declare(f"pto_frag_{c_name}"))
            elif c_name not in self.whole and c_name not in self.transposed:
                slots = math.ceil(tile.rows / WARPS) if self.block else 1
                # zeroed: a shuffle reads every lane's slot, owned or not
                out.add(f"{self.ctype(c_name)} {c_name}[{slots}][{math.ceil(tile.cols / WARP)}] = {{}};")
            out.add(f"[[maybe_unused]] long long vr_{c_name} = 0, vc_{c_name} = 0;")
        for c_name, ctype in self.scalars.items():
            out.add(f"[[maybe_unused]] {ctype} {c_name} = 0;")

    def _emit_body(self, out: Lines, body: list, returns: bool, label: str) -> None:
        for statement in body:
            self._emit(out, statement)
        if returns:
            out.settle()  # the paths that meet at the label owe nothing
            out.add(f"{label}:;")

    def _emit(self, out: Lines, statement) -> None:
        """A statement's lines, and the barriers its shared memory needs (the block layout):
        before and after an instruction that reads or writes a tile whole, or accesses a memref
        where threads meet (hazards), except that reads need none between them: where an
        instruction only reads shared memory whole (a product whose result is in registers),
        its barrier after waits (`out.owed`) past instructions that touch no shared memory for
        the first that may write it, and an instruction of such reads after it needs none
        before. Scalar statements touch none. Paths meet owing the same: a loop settles what it
        owes before it and at its body's end, an IF's branch what it owes that the other path
        does not, a RETURN's jump before it (FlashAttention-2's key block: a barrier before its
        products and one after, where four were)."""
        if isinstance(statement, str):
            if statement.startswith("goto "):
                out.settle()
            out.add(statement)
        elif isinstance(statement, _Inlined):
            out.add(f"{{  // {statement.where}")
            out.indent += 1
            self._emit_body(out, statement.body, statement.returns, statement.label)
            out.indent -= 1
            out.add("}")
        elif isinstance(statement, _Loop) and statement.ahead and \
                (early := [load for load in statement.ahead.loads if load in self.prefetched]):
            out.settle()
            self._emit_prefetching(out, statement, early)
        elif isinstance(statement, _Loop) and statement.head.startswith("if "):
            self._emit_if(out, statement)
        elif isinstance(statement, _Loop):
            out.settle()
            out.add(statement.head + " {")
            out.indent += 1
            for inner in statement.body:
                self._emit(out, inner)
            out.settle()  # for the next iteration's instructions, or those after the loop
            out.indent -= 1
            out.add("}")
        else:
            self._emit_instruction(out, statement)

    def _emit_if(self, out: Lines, statement: _Loop) -> None:
        """An IF: each branch from the barrier owed before it; where the branches (or a branch
        and the path around it) end owing differently, what is owed is settled."""
        owed = out.owed
        ends = []
        out.add(statement.head + " {")
        for branch in (statement.body, statement.orelse):
            if branch is None:
                ends.append(owed)
                continue
            if ends:
                out.indent -= 1
                out.add("} else {")
            out.owed = owed
            out.indent += 1
            for inner in branch:
                self._emit(out, inner)
            if out.owed and not owed:  # started owing here: the other path does not
                out.settle()
            ends.append(out.owed)
        out.indent -= 1
        out.add("}")
        out.owed = ends[0]
        if ends[0] != ends[1]:
            out.barrier()

    def _emit_instruction(self, out: Lines, statement: Code) -> None:
        whole = statement.whole(self) if callable(statement.whole) else statement.whole
        barrier = self.block and (whole or statement.memref in self.hazards)
        reads, writes = self._shared(statement)
        if self.block and not barrier and reads is not None and not reads and not writes:
            out.extend(statement.lines(self))  # no shared memory, no memref threads meet at
        elif barrier and reads and writes is not None and not writes and statement.memref not in self.hazards:
            if not out.owed:  # else only reads came since the last barrier
                out.barrier()
            out.extend(statement.lines(self))
            out.owed = True
        else:
            out.settle()
            if barrier:
                out.barrier()
            out.extend(statement.lines(self))
            if barrier:
                out.barrier()

    def _shared(self, statement: Code) -> tuple[set[str] | None, set[str] | None]:
        """The tiles in shared memory an instruction reads and those it writes (a transpose
        read in place stands for its source); (None, None) where it may touch any, as a product
        laid out for wgmma (its reads are the async proxy's) may."""
        if statement.touches is None:
            return None, None
        reads, writes = statement.touches(self)
        if any(tile in self.wgmma or tile in self.swizzled for tile in (*reads, *writes)):
            return None, None
        return ({self.transposed.get(tile, tile) for tile in reads} & self.whole,
                {self.transposed.get(tile, tile) for tile in writes} & self.whole)

    def _emit_prefetching(self, out: Lines, loop: _Loop, early: list[_Prefetch]) -> None:
        """A FOR whose `early` loads copy `stages` - 1 iterations ahead: the first iterations'
        before the loop, each later one's at the top of the iteration that many before it, into
        the tile's next buffer, one commit group an iteration (empty past the last); an
        iteration waits for its own group, and the buffers turn at its end (the tile is the
        buffer read, pto_next_ the one copied into). The load's place in the body keeps its
        valid region, and the products' barriers order the buffers: the copy into a buffer
        starts after the products of the iteration before have read it (the barrier owed after
        them is settled at the body's end), and it lands before any product of its own
        iteration reads it."""
        ahead, stages = loop.ahead, self.stages

        def buffer(tile: str, later: int) -> str:
            """The buffer `later` iterations after the one the tile reads."""
            if later == 0:
                return tile
            return f"pto_next_{tile}" if later == stages - 1 else f"pto_later{later}_{tile}"

        out.add(f"{{  // {', '.join(load.tile for load in early)} loaded {stages - 1} iteration(s) ahead "
                f"(cp.async), in {stages} buffers")
        out.indent += 1
        for load in early:
            pitch, rows = self.pitch(load.tile), self.tiles[load.tile].rows
            out.add(f"const int pto_at_{load.tile} = (int)({load.tile} - pto_buf_{load.tile}[0]) / {rows};")
            for later in range(1, stages):
                out.add(f"T (*{buffer(load.tile, later)})[{pitch}] = "
                        f"pto_buf_{load.tile}[(pto_at_{load.tile} + {later}) % {stages}];")
        for later in range(stages - 1):
            out.add(f"{{  // iteration {later}'s, into the buffer it reads")
            out.add(f"    const long long {ahead.next} = {ahead.after(ahead.start, later)};")
            out.add(f"    if ({ahead.runs(ahead.next)}) {{")
            for load in early:
                out.extend(indent(load.copy(self, buffer(load.tile, later)), 2))
            out.add("    }")
            out.add("}")
            out.add("pto_async_commit();")
        out.add(loop.head + " {")
        out.indent += 1
        out.add(f"const long long {ahead.next} = {ahead.after(ahead.var, stages - 1)};")
        out.add(f"if ({ahead.runs(ahead.next)}) {{  // iteration {stages - 1} ahead's, into the next buffers")
        for load in early:
            out.extend(indent(load.copy(self, buffer(load.tile, stages - 1))))
        out.add("}")
        out.add("pto_async_commit();")
        out.add(f"pto_async_wait<{stages - 1}>();  // this thread's copies for this iteration have landed")
        if any(load.tile in self.swizzled for load in early):
            out.extend(for_wgmma(["pto_wgmma_fence_operands();  // the copies, seen by wgmma's reads"]))
        for inner in loop.body:
            self._emit(out, inner)
        out.settle()  # the next iteration's copies write buffers this one's products read
        out.add(f"if ({ahead.runs(ahead.after(ahead.var, 1))}) {{")
        for load in early:
            out.add(f"    {{  // {load.tile}'s buffers turn")
            out.add(f"        T (*pto_read)[{self.pitch(load.tile)}] = {load.tile};")
            for later in range(stages - 1):
                out.add(f"        {buffer(load.tile, later)} = {buffer(load.tile, later + 1)};")
            out.add(f"        {buffer(load.tile, stages - 1)} = pto_read;")
            out.add("    }")
        out.add("}")
        out.indent -= 1
        out.add("}")
        out.indent -= 1
        out.add("}")


@dataclasses.dataclass(frozen=True)
class _TileUse:
    """A tile instruction as Generator._fragments weighs it: its form, its destination tile
    (None for a TSTORE) and source tiles (C names; a product's a, then b), and whether it is a
    product on tensor cores."""

    form: Form
    dst: str | None
    srcs: tuple[str, ...]
    tensor: bool = False


@dataclasses.dataclass
class _Loop:
    """A FOR or IF: its C head and bodies; a FOR whose loads may copy iterations ahead, how."""

    head: str
    body: list
    orelse: list | None = None
    ahead: _Ahead | None = None


@dataclasses.dataclass(eq=False)
class _Prefetch:
    """A TLOAD of a FOR's own body whose copy for the next iteration may start in this one
    (Context.early_loads): its tile, its memref's parameter, and `copy(generator, buffer)`, the
    lines copying its window at the FOR's next value (_Ahead.next) into `buffer` (C: rows of T)."""

    tile: str
    param: str
    copy: Callable[[Generator, str], list[str]]


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """A FOR's variable, the name the prefetches' copies read the variable's value by (`next`),
    its first value, step and stop and how a value is compared to the stop (C), and its TLOADs
    that may copy iterations ahead (Generator._emit_prefetching)."""

    var: str
    next: str
    start: str
    step: str
    compare: str  # the loop runs while value `compare` stop
    stop: str
    loads: tuple[_Prefetch, ...]

    def after(self, value: str, steps: int) -> str:
        """The variable's value `steps` iterations after `value` (C)."""
        if steps == 0:
            return value
        return f"{value} + {self.step}" if steps == 1 else f"{value} + {steps} * {self.step}"

    def runs(self, value: str) -> str:
        """Whether the loop runs an iteration at `value` (C)."""
        return f"{value} {self.compare} {self.stop}"


def _c(name: str) -> str:
    """A declared name as part of a C identifier (names are Python identifiers: maybe not ASCII)."""
    return re.sub(r"[^A-Za-z0-9_]", lambda m: f"_u{ord(m.group()):x}_", name)


def _integer(dtype: DataType) -> bool:
    return dtype.numpy.kind in "iub"


def _scalar_ctype(dtype: DataType) -> str:
    """The C type a scalar of `dtype` is kept in: float32 (and half) scalars round as the
    interpreter's do, at every write; a parameter arrives as the ABI's double or long long."""
    if _integer(dtype):
        return "long long"
    return "double" if dtype == DataType.FLOAT64 else "float"


def _literal(value: int | float) -> str:
    if isinstance(value, int):
        return f"{value}LL"
    if math.isinf(value):
        return "PTO_INF" if value > 0 else "(-PTO_INF)"
    if math.isnan(value):
        raise ISAError("a NaN immediate has no CUDA spelling")
    return repr(float(value))


_SCALAR_FORMS = (Form.SCALAR, Form.COMPARE, Form.DIM)  # instructions that write a scalar


class Context:
    """Turns one activation's statements into the generator's tree, with C names."""

    def __init__(self, generator: Generator, function: Function, names: dict[str, str],
                 views: dict[str, _View], offsets: dict, suffix: str):
        self.g, self.function, self.names = generator, function, names
        self.views, self.offsets = views, offsets
        self.suffix, self.label, self.returns = suffix, f"pto_end{suffix}", False
        self.symbols: dict[str, str] = {}  # loop variable -> the symbol of its (innermost current) loop
        # tile -> the registers its accumulators are in, inside a loop that keeps them there
        self.registers: dict[str, str] = {}
        # a TLOAD (by id) that may copy iterations ahead -> (its FOR's variable, the C name of
        # the FOR's value it copies for); then its _Prefetch, once made (early_loads, _transfer)
        self.early: dict[int, tuple[str, str]] = {}
        self.prefetches: dict[int, _Prefetch] = {}

    def fail(self, where: str, message: str) -> ISAError:
        return ISAError(f"@{self.function.name}: {where}: {message}")

    # operands
    def operand(self, value) -> str:
        """An operand as C: a literal, or the C name of a scalar or loop variable."""
        return _literal(value) if not isinstance(value, str) else self.names[value]

    def affine(self, value, column_scale: int | None = None) -> _Affine | None:
        """An index operand as an _Affine of constants (immediates and scalar parameters of the
        kernel) or, as a column offset (`column_scale` elements per unit), of a loop variable
        whose step moves it by whole warps of columns; else None.

        A loop variable is a constant within an iteration, and across iterations a column moved
        by a multiple of 32 belongs to the same lane of the same warp: so accesses that agree on
        it, and only differ as `_Access.apart` allows, never cross threads (the row layout stays
        valid for kernels that walk a row in column blocks)."""
        if not isinstance(value, str):
            return _Affine(int(value))
        c_name = self.names[value]
        # The verifier keeps parameters unassignable, so a kernel parameter is constant.
        constant = any(f"s_{_c(s.name)}" == c_name for s in self.g.params)
        step = self.g.steps.get(self.symbols.get(value))
        lane_preserving = column_scale is not None and step is not None and (step * column_scale) % WARP == 0
        if constant:
            return _Affine(0, ((c_name, 1),))
        return _Affine(0, ((self.symbols[value], 1),)) if lane_preserving else None

    # statements
    def block(self, body: tuple[Statement, ...]) -> list:
        for first, second in zip(body, body[1:]):  # a TLOAD a TTRANS of its tile follows at once
            if isinstance(first, Op) and isinstance(second, Op) and OPCODES[first.opcode].form is Form.LOAD \
                    and OPCODES[second.opcode].form is Form.TRANSPOSE and second.srcs[0] == first.dst:
                tile = self.names[first.dst]
                self.g.loads_transposed[tile] += 1
        return [self.statement(s) for s in body]

    def statement(self, statement: Statement):
        if isinstance(statement, Op):
            return self.op(statement)
        if isinstance(statement, For):
            return self.loop(statement)
        if isinstance(statement, If):
            lhs, rhs = self.operand(statement.lhs), self.operand(statement.rhs)
            condition = f"{lhs} {_COMPARE[statement.predicate]} {rhs}"
            return _Loop(f"if ({condition})", self.block(statement.then_body),
                         self.block(statement.else_body) if statement.else_body else None)
        if isinstance(statement, Call):
            return self.call(statement)
        if isinstance(statement, Return):
            self.returns = True
            return f"goto {self.label};"
        raise self.fail(repr(statement), "not a statement")

    def loop(self, loop: For) -> _Loop | _Inlined:
        var = f"i{self.suffix}_{_c(loop.var)}"
        self.names[loop.var] = var
        self.g.types[var] = "long long"
        self.g.loops += 1
        symbol = self.symbols[loop.var] = f"{var}@{self.g.loops}"  # one per FOR: never another loop's
        invariant = not isinstance(loop.start, str) or \
            any(f"s_{_c(s.name)}" == self.names[loop.start] for s in self.g.params)
        if isinstance(loop.step, int) and invariant:
            self.g.steps[symbol] = loop.step
        if isinstance(loop.start, int):
            self.g.starts[symbol] = loop.start
        start, stop, step = (self.operand(v) for v in (loop.start, loop.stop, loop.step))
        if isinstance(loop.step, int):
            condition = f"{var} {'<' if loop.step > 0 else '>'} {stop}"
        else:
            # a step of 0 runs no iteration (where the interpreter and the CPU code raise), not for ever
            condition = f"({step} > 0 ? {var} < {stop} : {step} < 0 && {var} > {stop})"
        kept = self.accumulated(loop)
        self.registers.update((tile, f"pto_acc_{tile}") for tile in kept)
        following = f"pto_next_{var}"
        early = self.early_loads(loop)
        self.early.update((id(load), (loop.var, following)) for load in early)
        body = self.block(loop.body)
        loads = tuple(self.prefetches.pop(id(load)) for load in early if id(load) in self.prefetches)
        ahead = None
        if loads:
            ahead = _Ahead(var, following, start, step, "<" if loop.step > 0 else ">", stop, loads)
        built = _Loop(f"for (long long {var} = {start}; {condition}; {var} += {step})", body, ahead=ahead)
        if not kept:
            return built
        for tile in kept:
            del self.registers[tile]
        units = {tile: Units.of(self.g.tiles[tile]) for tile in kept}

        def moved(into_registers: bool) -> list[Code]:
            return [accumulators_moved(tile, f"pto_acc_{tile}", units[tile], into_registers)
                    for tile in kept]

        def declared(tile: str) -> Code:
            return Code(lambda g: [] if tile in g.fragments else [units[tile].registers(f"pto_acc_{tile}")])

        return _Inlined(f"FOR %{loop.var}, its products' accumulators in registers",
                        [*(declared(tile) for tile in kept), *moved(True), built, *moved(False)], False, "")

    def early_loads(self, loop: For) -> list[Op]:
        """The TLOADs of `loop`'s own body whose copy for the next iteration may start in this
        one: in a tensor-core kernel, a loop of a constant step to a stop its body does not
        change, which no RETURN leaves; each load the only one of its tile in the loop and the
        first statement of the body to touch the tile (a TTRANS's source and result count as
        one: a product may read the result in place, Generator._transposed), its window
        moving only with the loop's variable (its other offsets constants, parameters or
        scalars the body does not change). Whether one does is the layout's to say
        (Generator._prefetched)."""
        statements = list(walk(loop.body))
        if not self.g.tensor_cores or not isinstance(loop.step, int) or \
                any(isinstance(s, Return) for s in statements):
            return []
        changed = {s.var for s in statements if isinstance(s, For)} | \
            {s.dst for s in statements if isinstance(s, Op) and OPCODES[s.opcode].form in _SCALAR_FORMS}
        if isinstance(loop.stop, str) and loop.stop in changed:
            return []
        loads = collections.Counter(s.dst for s in statements
                                    if isinstance(s, Op) and OPCODES[s.opcode].form is Form.LOAD)
        transposes = [(s.dst, s.srcs[0]) for s in statements
                      if isinstance(s, Op) and OPCODES[s.opcode].form is Form.TRANSPOSE]
        aliases = {name: {name} for pair in transposes for name in pair}
        for result, source in transposes:
            aliases[result].add(source)
            aliases[source].add(result)
        early, touched = [], set()
        for statement in loop.body:
            if isinstance(statement, Op) and OPCODES[statement.opcode].form is Form.LOAD and \
                    loads[statement.dst] == 1 and statement.dst not in touched and \
                    all(not isinstance(v, str) or v == loop.var or v not in changed
                        for v in statement.srcs[1:3]):
                early.append(statement)
            for inner in walk((statement,)):
                if isinstance(inner, Op):
                    for name in (inner.dst, *inner.srcs):
                        if isinstance(name, str):
                            touched |= aliases.get(name, {name})
        return early

    def accumulated(self, loop: For) -> list[str]:
        """The tiles (C names) whose accumulators stay in registers across `loop`: each the
        destination of a tensor-core TMATMUL_ACC of the loop's own body (not under an IF or an
        inner FOR) that no other instruction of the loop touches, in a loop no RETURN leaves (it
        would skip the write back), in order while a lane's share of them all is at most
        REGISTER_ACCUMULATORS floats. So a product summed over chunks of k whose result other
        instructions also touch (attention's) reads and writes it in shared memory once, not
        once a chunk."""
        statements = list(walk(loop.body))
        if not self.g.tensor_cores or any(isinstance(s, Return) for s in statements):
            return []
        touches: dict[str, int] = {}
        for statement in statements:
            if isinstance(statement, Op):
                for name in {statement.dst, *statement.srcs}:
                    if isinstance(name, str) and name in self.names:
                        touches[self.names[name]] = touches.get(self.names[name], 0) + 1

        def candidate(op: Op) -> bool:
            spec, dst = OPCODES[op.opcode], self.names.get(op.dst)
            return spec.form is Form.MATMUL and spec.accumulate and touches.get(dst) == 1 and \
                tensor_core_product(op, lambda name: self.g.tiles[self.names[name]].dtype,
                                    self.g.tensor_core_dtypes)

        kept, floats = [], 0
        for op in (s for s in loop.body if isinstance(s, Op) and candidate(s)):
            units = Units.of(self.g.tiles[self.names[op.dst]])
            if floats + units.floats <= REGISTER_ACCUMULATORS:
                kept.append(self.names[op.dst])
                floats += units.floats
        return kept

    def call(self, call: Call) -> _Inlined:
        callee = self.g.module.functions[call.callee]
        k = self.g.activations  # the number the callee's activation gets
        views, offsets, head = {}, {}, []
        for param, arg in call.args:
            view, offset = self.views[arg.tensor], self.offsets[arg.tensor]
            rows, cols = callee.memref(param).shape
            if arg.windowed:
                prefix = f"w{k}_{_c(param)}"
                row, col = f"{self.operand(arg.row)} * {rows}", f"{self.operand(arg.col)} * {cols}"
                head.append(f"const long long {prefix}_r0 = {view.row0} + {row}, "
                            f"{prefix}_c0 = {view.col0} + {col};")
                head.append(f"const long long {prefix}_rows = pto_clip({rows}, {view.rows} - {row}), "
                            f"{prefix}_cols = pto_clip({cols}, {view.cols} - {col});")
                view = _View(view.param, f"{prefix}_r0", f"{prefix}_c0", f"{prefix}_rows", f"{prefix}_cols")
                shift = (self.affine(arg.row), self.affine(arg.col, cols))
                offset = None if offset is None or None in shift else \
                    (offset[0].plus(shift[0], rows), offset[1].plus(shift[1], cols))
            views[param] = _View(view.param, view.row0, view.col0, f"pto_clip({rows}, {view.rows})",
                                 f"pto_clip({cols}, {view.cols})")
            offsets[param] = offset
        for param, value in call.scalars:  # the callee's parameters, under its activation's names
            ctype = _scalar_ctype(callee.scalar(param).dtype)
            head.append(f"const {ctype} s{k}_{_c(param)} = ({ctype})({self.operand(value)});")
        body, returns, label = self.g._inline(callee, views, offsets)
        return _Inlined(describe(call), head + body, returns, label)

    # instructions
    def op(self, op: Op):
        spec = OPCODES[op.opcode]
        where = describe(op)
        if spec.form in _SCALAR_FORMS:
            return self.scalar_op(op, spec, where)
        self.note_uses(op, spec)
        code = _TILE_RULES[spec.form](self, op, spec, where)
        if code.touches is None:  # its operands: the sources read, the destination written
            operands = signature(spec)
            reads = tuple(self.names[value] for value, operand in zip(op.srcs, operands[1:])
                          if operand.kind is Kind.TILE)
            writes = (self.names[op.dst],) if operands[0].kind is Kind.TILE else ()
            code.touches = lambda g: (reads, writes)
        return code

    def note_uses(self, op: Op, spec: OpSpec) -> None:
        """How the instruction writes and reads tiles (Generator._broadcast, _transposed,
        _fragments and _packed read it). A product's tiles are recorded by its rule (_matmul: on
        tensor cores or not), and a TLOAD that a TTRANS of its tile follows at once by `block`."""
        operands = signature(spec)
        if spec.form is not Form.MATMUL:
            tiles = tuple(self.names[value] for value, operand in zip(op.srcs, operands[1:])
                          if operand.kind is Kind.TILE)
            dst = self.names[op.dst] if operands[0].kind is Kind.TILE else None
            self.g.uses.append(_TileUse(spec.form, dst, tiles))
        for position, (value, operand) in enumerate(zip(op.srcs, operands[1:])):
            if operand.kind is Kind.TILE and spec.form is not Form.MATMUL:  # _matmul says how
                use = {Form.TRANSPOSE: "transpose", Form.STORE: "store"}.get(spec.form, "other")
                if spec.form is Form.COL_EXPAND and position == 1:
                    use = "expand"
                self.g.reads.setdefault(self.names[value], set()).add(use)
        if operands[0].kind is Kind.TILE and spec.form is not Form.MATMUL:
            dst = self.names[op.dst]
            if spec.form is Form.LOAD:
                write = ("load", self.views[op.srcs[0]].param)
                self.g.loads[dst] += 1
            else:
                write = ("transpose", self.names[op.srcs[0]]) if spec.form is Form.TRANSPOSE else ("op", None)
            self.g.writes.setdefault(dst, set()).add(write)

    def scalar_op(self, op: Op, spec: OpSpec, where: str) -> str:
        dst = self.names[op.dst]
        ctype = self.g.types[dst]
        if spec.form is Form.COMPARE:
            a, b, predicate = op.srcs
            expression = f"({self.operand(a)} {_COMPARE[predicate]} {self.operand(b)}) ? 1 : 0"
        elif spec.form is Form.DIM:  # a memref window's rows or columns
            view = self.views[op.srcs[0]]
            expression = view.cols if op.srcs[1] else view.rows
        elif spec.reference is None:  # SLI: an immediate
            expression = self.operand(op.srcs[0])
        else:
            operands = {"a": f"({ctype})({self.operand(op.srcs[0])})"}
            if len(op.srcs) > 1:
                operands["b"] = f"({ctype})({self.operand(op.srcs[1])})"
            expression = spec.cuda.format(**operands)
        return f"{dst} = ({ctype})({expression});  // {where}"



# --- tile instructions --------------------------------------------------------------------------
# Inside a row loop `r` is the row and `i` its slot in the warp's register arrays; inside a
# column loop `c` is the column and `j` its slot in the lane's. A register tile's element (r, c)
# lives in the thread that owns it: lane c % 32 of the warp owning row r.


def _rows(g: Generator, tile: Tile, valid: str, body: list[str]) -> list[str]:
    """`body` for each row r < valid of `tile` that this warp owns."""
    if not g.block:
        return [f"if (pto_r < {valid}) {{", "    [[maybe_unused]] const int i = 0;",
                "    [[maybe_unused]] const long long r = pto_r;", *indent(body), "}"]
    return ["PTO_UNROLL", f"for (int i = 0; i < {math.ceil(tile.rows / WARPS)}; ++i) {{",
            "    const long long r = pto_warp + PTO_WARPS * i;", f"    if (r < {valid}) {{",
            *indent(body, 2), "    }", "}"]


def _cols(tile: Tile, valid: str, body: list[str]) -> list[str]:
    """`body` for each column c < valid of `tile` that this lane owns."""
    return ["PTO_UNROLL", f"for (int j = 0; j < {math.ceil(tile.cols / WARP)}; ++j) {{",
            "    const long long c = pto_lane + 32 * j;", f"    if (c < {valid}) {{", *indent(body, 2),
            "    }", "}"]


def _el(g: Generator, tile: str, row: str = "r", col: str = "c", slot: str = "j") -> str:
    return f"{tile}[{row}][{col}]" if tile in g.whole else f"{tile}[i][{slot}]"


def _elementwise(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    """UNARY, CONVERT, BINARY, TILE_SCALAR, ROW_EXPAND, COL_EXPAND, MASK: dst(r, c) from a(r, c)."""
    dst, a = ctx.names[op.dst], ctx.names[op.srcs[0]]
    form = spec.form
    b = ctx.names[op.srcs[1]] if form in (Form.BINARY, Form.ROW_EXPAND, Form.COL_EXPAND) else None
    if form is Form.COL_EXPAND:
        ctx.g.expanded.add(b)
    scalar = ctx.operand(op.srcs[1]) if form is Form.TILE_SCALAR else None
    if form is Form.MASK:
        row, col = (ctx.operand(v) for v in op.srcs[1:3])
        expression = f"c + {col} <= {ctx.g.call_row('r')} + {row} ? x_a : -PTO_INF"
    else:
        expression = spec.cuda.format(a="x_a", b="x_b", s=f"({ctx.g.ctype(dst)})({scalar})")
    tile = ctx.g.tiles[dst]

    def lines(g: Generator) -> list[str]:
        if dst in g.fragments:  # each lane its elements of the units
            return op_block(where, f"vr_{a}", f"vc_{a}", _in_registers(g, dst, a, b, form, expression), dst)
        x_b = "" if b is None else f"const {g.ctype(b)} x_b"
        per_row, after_row, per_element = [], [], [f"const {g.ctype(a)} x_a = {_el(g, a)};"]
        if form is Form.BINARY:
            per_element.append(f"{x_b} = {_el(g, b)};")
        elif form is Form.COL_EXPAND:  # shared memory's row, or this warp's copy of it
            per_element.append(f"{x_b} = {b}[0][c];" if b in g.whole else f"{x_b} = {b}[0][j];")
        elif form is Form.ROW_EXPAND and b in g.whole:  # written by lane 0 of this warp
            per_row = ["__syncwarp();", f"{x_b} = {b}[r][0];"]
            after_row = ["__syncwarp();"]  # every lane has read it before lane 0 may write it again
        elif form is Form.ROW_EXPAND:
            per_row = [f"{x_b} = __shfl_sync(PTO_FULL, {b}[i][0], 0);"]
        per_element.append(f"{_el(g, dst)} = ({g.ctype(dst)})({expression});")
        body = _rows(g, tile, "vr", per_row + _cols(tile, "vc", per_element) + after_row)
        return op_block(where, f"vr_{a}", f"vc_{a}", body, dst)

    # COL_EXPAND's b is read whole unless every warp holds it (broadcast); a ROW_EXPAND of a
    # tile in registers reads its rows' factors in shared memory where other threads wrote them
    return Code(lines, whole=lambda g: (form is Form.COL_EXPAND and b in g.whole) or
                (dst in g.fragments and b is not None and b not in g.fragments))


def _in_registers(g: Generator, dst: str, a: str, b: str | None, form: Form, expression: str) -> list[str]:
    """An element-wise instruction over tiles in registers (Generator._fragments): each lane its
    elements of dst's units from its own of a and b (BINARY), or from its rows' values of b
    (ROW_EXPAND; a row's factor in shared memory where b is there); one-column tiles in whole
    rows a value a row."""
    units = g.units(dst)
    rows = g.row_values(dst)
    element = "[pto_ui][h]" if rows else "[pto_ui][n][e]"
    x_b = ""
    if form is Form.BINARY or (b is not None and rows):
        x_b = f", x_b = pto_frag_{b}{element}" if b in g.fragments else f", x_b = (float){b}[r][0]"
    elif form is Form.ROW_EXPAND:
        x_b = f", x_b = pto_frag_{b}[pto_ui][e / 2]" if b in g.fragments else f", x_b = (float){b}[r][0]"
    statement = f"{{ const float x_a = pto_frag_{a}{element}{x_b}; pto_frag_{dst}{element} = {expression}; }}"
    if rows:
        return units.each(units.each_row(statement), unrolled=True)
    return units.each(units.computed(statement), unrolled=True)


def _identity(spec: OpSpec, ctype: str) -> str:
    return f"({ctype})({_literal(float(spec.identity))})"


def _row_reduce(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    dst, a = ctx.names[op.dst], ctx.names[op.srcs[0]]
    combine = spec.cuda.format(acc="acc", x="x")
    source = ctx.g.tiles[a]

    def lines(g: Generator) -> list[str]:
        if dst in g.fragments:  # a's rows whole in this warp: its lanes combine in their groups of four
            units = g.units(a)

            def combined(test: str) -> list[str]:
                return ["PTO_UNROLL", f"for (int n = 0; n < {units.blocks}; ++n) {{", "    PTO_UNROLL",
                        "    for (int e = 0; e < 2; ++e) {",
                        f"        const float x = pto_frag_{a}[pto_ui][n][2 * h + e];",
                        f"        {test}acc = {combine};", "    }", "}"]

            row = [f"float acc = {_identity(spec, 'float')};",
                   f"if (c0 + {8 * units.blocks} <= vc_{a}) {{  // every column valid: no test an element",
                   *indent(combined("")), "} else {",
                   *indent(combined(f"if (c0 + 8 * n + t2 + e < vc_{a}) ")), "}",
                   "for (int o = 1; o < 4; o *= 2) {  // every lane of the group gets the row's result",
                   "    const float x = __shfl_xor_sync(PTO_FULL, acc, o);", f"    acc = {combine};", "}",
                   "const long long r = r0 + g + 8 * h;", f"if (r < vr) pto_frag_{dst}[pto_ui][h] = acc;"]
            rows = ["PTO_UNROLL", "for (int h = 0; h < 2; ++h) {", *indent(row), "}"]
            return op_block(where, f"vr_{a}", "1", units.each(rows, unrolled=True), dst)
        t = g.ctype(a)
        body = [f"{t} acc = {_identity(spec, t)};",
                *_cols(source, "vc_a", [f"const {t} x = {_el(g, a)};", f"acc = {combine};"]),
                "for (int o = 16; o > 0; o /= 2) {  // lanes combine: every lane gets the row's result",
                f"    const {t} x = __shfl_xor_sync(PTO_FULL, acc, o);", f"    acc = {combine};", "}",
                f"if (pto_lane == 0) {_el(g, dst, col='0', slot='0')} = acc;"]
        work = [f"const long long vc_a = vc_{a};", *_rows(g, source, "vr", body)]
        return op_block(where, f"vr_{a}", "1", work, dst)

    return Code(lines)


def _col_reduce(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    dst, a = ctx.names[op.dst], ctx.names[op.srcs[0]]
    ctx.g.whole.add(a)
    combine = spec.cuda.format(acc="acc", x="x")
    tile = ctx.g.tiles[dst]

    def lines(g: Generator) -> list[str]:
        t = g.ctype(a)
        per_element = [f"{t} acc = {_identity(spec, t)};", f"for (long long k = 0; k < vr_{a}; ++k) {{",
                       f"    const {t} x = {a}[k][c];", f"    acc = {combine};", "}", f"{_el(g, dst)} = acc;"]
        return op_block(where, "1", f"vc_{a}", _rows(g, tile, "vr", _cols(tile, "vc", per_element)), dst)

    return Code(lines, whole=True)


def _matmul(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    dst, a, b = ctx.names[op.dst], ctx.names[op.srcs[0]], ctx.names[op.srcs[1]]
    if dst == b:
        raise ctx.fail(where, "the CUDA code generator needs the destination to differ from the right "
                              "operand (other warps still read it while the product is written)")
    tensor = ctx.g.tensor_cores and tensor_core_product(op, lambda name: ctx.g.tiles[ctx.names[name]].dtype,
                                                         ctx.g.tensor_core_dtypes)
    ctx.g.uses.append(_TileUse(Form.MATMUL, dst, (a, b), tensor))
    if tensor:
        return tensor_matmul(ctx, op, spec, where)
    for operand in (a, b, *((dst,) if spec.accumulate else ())):
        ctx.g.reads.setdefault(operand, set()).add("other")
    ctx.g.writes.setdefault(dst, set()).add(("op", None))
    ctx.g.whole.add(b)
    tile, left = ctx.g.tiles[dst], ctx.g.tiles[a]
    region = (f"vr_{dst}", f"vc_{dst}") if spec.accumulate else (f"vr_{a}", f"vc_{b}")

    def lines(g: Generator) -> list[str]:
        slots = math.ceil(tile.cols / WARP)
        # a(r, k): from shared memory, or from lane k % 32 of this warp, which holds it in slot k / 32
        x_a = f"{a}[r][k]" if a in g.whole else f"__shfl_sync(PTO_FULL, {a}[i][kj], kl)"
        t = g.ctype(dst)
        body = [f"{t} acc[{slots}];",
                "PTO_UNROLL", f"for (int j = 0; j < {slots}; ++j) acc[j] = ({t})0;",
                *(_cols(tile, "vc", [f"acc[j] = {_el(g, dst)};"]) if spec.accumulate else []),
                "PTO_UNROLL", f"for (int kj = 0; kj < {math.ceil(left.cols / WARP)}; ++kj) {{",
                f"    PTO_UNROLL_BY({MATMUL_K_UNROLL})",
                "    for (int kl = 0; kl < 32; ++kl) {", "        const long long k = 32 * kj + kl;",
                "        if (k >= kn) break;", f"        const {g.ctype(a)} x_a = {x_a};",
                *indent(_cols(tile, "vc", [f"acc[j] += x_a * {b}[k][c];"]), 2), "    }", "}",
                # a in shared memory and written in place: every lane's reads of the row first
                *(["__syncwarp();"] if dst == a and a in g.whole else []),
                *_cols(tile, "vc", [f"{_el(g, dst)} = acc[j];"])]
        return op_block(where, *region, [f"const long long kn = vc_{a};", *_rows(g, tile, "vr", body)], dst)

    return Code(lines, whole=True)


def _transfer(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    """TLOAD and TSTORE: a tile's valid region from or to a window of a memref."""
    load = spec.form is Form.LOAD
    tile_name, memref = (op.dst, op.srcs[0]) if load else (op.srcs[0], op.dst)
    tile, view = ctx.names[tile_name], ctx.views[memref]
    row, col = (ctx.operand(v) for v in op.srcs[1:3])
    offset, shift = ctx.offsets[memref], (ctx.affine(op.srcs[1]), ctx.affine(op.srcs[2], 1))
    if offset is not None and None not in shift:
        offset = (offset[0].plus(shift[0]), offset[1].plus(shift[1]))
    else:
        offset = None
    declared = ctx.g.tiles[tile]
    ctx.g.accesses.append(_Access(view.param, offset, declared.rows, declared.cols, not load))
    p = view.param
    element = f"{p}_p[({view.row0} + {row} + r) * {p}_s1 + ({view.col0} + {col} + c) * {p}_s2]"
    rows, cols = (declared.rows, declared.cols) if load else (f"vr_{tile}", f"vc_{tile}")
    region = (f"pto_clip({rows}, {view.rows} - {row})", f"pto_clip({cols}, {view.cols} - {col})")

    prefetch = None
    if op_ahead := ctx.early.get(id(op)):  # also a copy of the window at a later value of the loop's
        var, following = op_ahead
        row_next, col_next = (following if v == var else ctx.operand(v) for v in op.srcs[1:3])
        window_next = f"{p}_p + ({view.row0} + {row_next}) * {p}_s1 + ({view.col0} + {col_next}) * {p}_s2"
        region_next = (f"pto_clip({rows}, {view.rows} - {row_next})",
                       f"pto_clip({cols}, {view.cols} - {col_next})")

        def copy(g: Generator, buffer: str) -> list[str]:
            body = _packed_load(buffer, declared, window_next, p, tile in g.swizzled, "pto_copy8_async")
            return op_block(f"{where}, for an iteration ahead", *region_next, body, None)

        prefetch = ctx.prefetches[id(op)] = _Prefetch(tile, p, copy)
        ctx.g.prefetches.append(prefetch)

    def lines(g: Generator) -> list[str]:
        if prefetch in g.prefetched:  # copied iterations before: only its valid region is set here
            return op_block(f"{where}: copied ahead", *region, [], tile)
        if load:
            copy = f"{_el(g, tile)} = ({g.ctype(tile)})({element});"
        else:
            copy = f"{element} = (T)({_el(g, tile)});"
        if g.row_values(tile):  # each group's lanes their rows' values, the first of them stores
            units = g.units(tile)
            move = f"pto_frag_{tile}[pto_ui][h] = (float)({element});" if load else \
                f"if (t == 0) {element} = (T)(pto_frag_{tile}[pto_ui][h]);"
            body = units.each(units.each_row(move), unrolled=True)
        elif tile in g.fragments:  # each lane its accumulators' elements
            units = g.units(tile)
            move = f"acc[n][e] = (float)({element});" if load else f"{element} = (T)(acc[n][e]);"
            body = units.each([units.bound(f"pto_frag_{tile}"), *units.moved(move)], unrolled=True)
        elif load and tile in g.packed:
            window = f"{p}_p + ({view.row0} + {row}) * {p}_s1 + ({view.col0} + {col}) * {p}_s2"
            body = _packed_load(tile, declared, window, p, tile in g.swizzled)
        elif load and tile in g.broadcast:  # every warp its own copy of the row
            body = ["{", "    [[maybe_unused]] const int i = 0;", "    const long long r = 0;",
                    "    if (r < vr) {", *indent(_cols(declared, "vc", [copy]), 2), "    }", "}"]
        else:
            body = _rows(g, declared, "vr", _cols(declared, "vc", [copy]))
        return op_block(where, *region, body, tile if load else None)

    # a window that moves from one iteration of a loop to the next (or cannot be told)
    moving = offset is None or any("@" in name for axis in offset for name, _ in axis.terms)

    def whole(g: Generator) -> bool:
        """A packed tile is loaded in groups of 8 columns a thread (_packed_load), a tile in
        registers by the lanes its units give each element: not the threads that own those
        elements in the row layout _hazards reasons about. So where the kernel stores the memref
        and accesses it elsewhere too, or a store's window moves in a loop (its iterations'
        windows may overlap), the accesses meet at barriers."""
        others = p in g.stored and g.accessed[p] > 1
        return (load and tile in g.packed and p in g.stored) or \
            (tile in g.fragments and (others or (not load and moving)))

    def touches(g: Generator) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A TLOAD copied ahead moves nothing here (its copies are the loop's: _emit_prefetching)."""
        if not load:
            return (tile,), ()
        return (), () if prefetch in g.prefetched else (tile,)

    return Code(lines, memref=p, whole=whole, touches=touches)


def _packed_load(tile: str, declared: Tile, window: str, param: str, swizzled: bool,
                 copy: str = "pto_copy8") -> list[str]:
    """A TLOAD into a packed tile (read only by products, after a barrier: any thread may write
    any element) in groups of 8 columns, group e of the tile's (rows x ceil(cols / 8)) to thread
    e % PTO_THREADS whatever the path, so two loads of the tile write each element from one
    thread: a group in one 16-byte copy where the memref's rows are contiguous and 16-byte
    aligned and the valid columns whole groups, else element by element (the rare case: a loop
    kept short, where the unrolled loads of the tile's own layout doubled the compile time).
    `copy` makes a 16-byte copy: pto_copy8, or pto_copy8_async for a copy ahead
    (element by element, the rare case stays synchronous: the buffer is not read before the
    barrier after the wait). A `swizzled` tile (Generator._wgmma) lies as wgmma reads it where
    the build takes wgmma, its stores then fenced for wgmma's reads (pto_wgmma_fence_operands;
    a copy ahead's after its wait: Generator._emit_prefetching)."""
    groups = math.ceil(declared.cols / 8)  # of 8 columns in a row
    turns = math.ceil(declared.rows * groups / THREADS_PER_BLOCK)
    each_group = [f"for (int pto_n = 0; pto_n < {turns}; ++pto_n) {{",
                  "    const long long pto_e = threadIdx.x + PTO_THREADS * pto_n;",
                  f"    const long long r = pto_e / {groups}, c = 8 * (pto_e % {groups});"]

    def load(at: Callable[[str, str], str], fenced: bool) -> list[str]:
        """The copies into element (r, c) at `at`, fenced for wgmma's reads where they are
        synchronous (pto_copy8) and `fenced`."""
        fence = ["pto_wgmma_fence_operands();"] if fenced and copy == "pto_copy8" else []
        return [f"if ({param}_s2 == 1 && {param}_s1 % 8 == 0 && (unsigned long long)pto_window % 16 == 0 "
                "&& vc % 8 == 0) {",
                "    PTO_UNROLL", *indent(each_group),
                f"        if (r < vr && c < vc) {copy}({at('r', 'c')}, pto_window + r * {param}_s1 + c);",
                "    }", "} else {", *indent(each_group),
                f"        for (long long e = c; r < vr && e < c + 8 && e < vc; ++e) "
                f"*{at('r', 'e')} = pto_window[r * {param}_s1 + e * {param}_s2];", "    }", "}", *fence]

    body = load(lambda r, c: f"&{tile}[{r}][{c}]", False)
    if swizzled:
        body = for_wgmma(load(lambda r, c: f"pto_wgmma_operand_at(&{tile}[0][0], {declared.rows}, {r}, {c})",
                              True), body)
    return [f"const T *pto_window = {window};", *body]


def _generate(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    """GENERATE: the whole of dst from a scalar and each element's (row, col)."""
    dst, tile = ctx.names[op.dst], ctx.g.tiles[ctx.names[op.dst]]
    t = ctx.g.ctype(dst)
    expression = spec.cuda.format(s=f"({t})({ctx.operand(op.srcs[0])})", r=f"({t})({ctx.g.call_row('r')})",
                                  c=f"({t})c")

    def lines(g: Generator) -> list[str]:
        units = g.units(dst) if dst in g.fragments else None
        if g.row_values(dst):
            value = f"pto_frag_{dst}[pto_ui][h] = (float)({expression});"
            body = units.each(units.each_row(value), unrolled=True)
        elif units is not None:
            value = f"pto_frag_{dst}[pto_ui][n][e] = (float)({expression});"
            body = units.each(units.moved(value), unrolled=True)
        else:
            body = _rows(g, tile, "vr", _cols(tile, "vc", [f"{_el(g, dst)} = ({t})({expression});"]))
        return op_block(where, str(tile.rows), str(tile.cols), body, dst)

    return Code(lines)


def _transpose(ctx: Context, op: Op, spec: OpSpec, where: str) -> Code:
    """TRANSPOSE: dst(r, c) = a(c, r); a is read whole, from shared memory."""
    dst, a = ctx.names[op.dst], ctx.names[op.srcs[0]]
    ctx.g.whole.add(a)
    tile = ctx.g.tiles[dst]

    def lines(g: Generator) -> list[str]:
        if dst in g.transposed:  # the products read a, transposed: only the valid region moves
            return op_block(f"{where}: read as {a}, transposed", f"vc_{a}", f"vr_{a}", [], dst)
        body = _rows(g, tile, "vr", _cols(tile, "vc", [f"{_el(g, dst)} = {a}[c][r];"]))
        return op_block(where, f"vc_{a}", f"vr_{a}", body, dst)

    return Code(lines, whole=lambda g: dst not in g.transposed)  # read in place: nothing moves


_TILE_RULES = {Form.LOAD: _transfer, Form.STORE: _transfer, Form.UNARY: _elementwise,
               Form.CONVERT: _elementwise, Form.BINARY: _elementwise, Form.TILE_SCALAR: _elementwise,
               Form.ROW_EXPAND: _elementwise, Form.COL_EXPAND: _elementwise, Form.MASK: _elementwise,
               Form.ROW_REDUCE: _row_reduce,
               Form.COL_REDUCE: _col_reduce, Form.MATMUL: _matmul, Form.GENERATE: _generate,
               Form.TRANSPOSE: _transpose}
