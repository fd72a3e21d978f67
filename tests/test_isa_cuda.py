"""CUDA code generated from PTO InCore functions (pto_gpu/isa/cuda_codegen.py).

Functions covering every ops.Form (each table entry of a form in one function, so a new entry
is covered without a change here), calls, loops, branches, returns, scalar arithmetic and a
memref written and read at offsets that move (cross-warp hazards) are generated and:
  - compiled by nvcc for sm_80 and sm_90, warnings as errors, for float32, float64 and
    float16 (the float32 text, and the float16 one whose products run on tensor cores), with
    ptxas' report checked: no spills, no stack frame (tiles stay in registers), static shared
    memory within 48 KiB;
  - built for the host by g++ (pto_isa.cuh runs each block's threads as fibers that meet at
    every barrier and shuffle, so the same kernel text runs, a missing rendezvous deadlocks
    and aborts, and a missing barrier shows as a race in one of the orders the fibers take)
    and compared on full and tail windows with the reference interpreter;
  - on a GPU (marker `gpu`), run through pto.Runtime(backend="cuda") against the interpreter.
"""

import ctypes
import math
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import host_cuda
import numpy as np
import pytest
from kernel_references import tf32_rounded

import pto_gpu as pto
from pto_gpu.backends import cuda_abi
from pto_gpu.backends.cuda_abi import MAX_BLOCKS, SHARED_LIMIT, SHARED_OPT_IN, THREADS_PER_BLOCK
from pto_gpu.isa import ISAError, cuda_codegen, interpret, optimize
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_codegen import MAX_STAGES, WorkItems, cuda_code, cuda_source
from pto_gpu.isa.cuda_mma import packed_pitch
from pto_gpu.isa.ir import (
    Call,
    CallArg,
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
    Tile,
    walk,
)
from pto_gpu.isa.ops import OPCODES, Form
from pto_gpu.runtime import cuda_unavailable

R, C, K, N = 10, 40, 40, 20  # tiles of 10 x 40: two column slots per lane, rows over two blocks of warps
DTYPES = {np.float32: pto.FLOAT32, np.float64: pto.FLOAT64, np.float16: pto.FLOAT16}
# float32: the interpreter rounds each instruction's float64 result, the kernel computes in
# float32 (and sums in another order): a few ulps per instruction, ~K ulps through a matmul.
# float16: the kernel computes in float (products on tensor cores) and rounds only at stores,
# the interpreter at every instruction: a few float16 ulps (2^-11 relative) per element.
TOLERANCE = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12),
             np.float16: dict(rtol=4e-3, atol=4e-3)}
INT = pto.INT64


def _opcodes(form: Form) -> list[str]:
    return [name for name, spec in OPCODES.items() if spec.form is form]


def _incore(name, memrefs, tiles, body, scalars=()) -> Function:
    return Function(name, FunctionKind.INCORE, tuple(memrefs), tuple(scalars), tuple(tiles), tuple(body))


def _per_opcode(name, form, dt, sources, make, scalars=()):
    """out[:, k*C:(k+1)*C] = opcode k of `form` applied to the sources' tiles (memref m: tile m_)."""
    ops = _opcodes(form)
    memrefs = [MemRef(m, dt, shape) for m, shape in sources] + [MemRef("out", dt, (R, C * len(ops)))]
    tiles = [Tile(m + "_", *shape, dt) for m, shape in sources] + [Tile("y", R, C, dt)]
    body = [Op("TLOAD", m + "_", (m, 0, 0)) for m, _ in sources]
    for k, opcode in enumerate(ops):
        body += [make(opcode, k), Op("TSTORE", "out", ("y", 0, k * C))]
    return _incore(name, memrefs, tiles, body, scalars)


def _reduce(name, form, dt, out_shape, dst_shape, store_at):
    ops = _opcodes(form)
    body = [Op("TLOAD", "x_", ("x", 0, 0))]
    for k, opcode in enumerate(ops):
        body += [Op(opcode, "y", ("x_",)), Op("TSTORE", "out", ("y", *store_at(k)))]
    return _incore(name, [MemRef("x", dt, (R, C)), MemRef("out", dt, out_shape(len(ops)))],
                   [Tile("x_", R, C, dt), Tile("y", *dst_shape, dt)], body)


def _module(dt) -> Module:
    m = Module("cuda_tests")
    x, xb = [("x", (R, C))], [("x", (R, C)), ("b", (R, C))]
    m.add(_per_opcode("unary", Form.UNARY, dt, x, lambda op, k: Op(op, "y", ("x_",))))
    m.add(_per_opcode("binary", Form.BINARY, dt, xb, lambda op, k: Op(op, "y", ("x_", "b_"))))
    m.add(_per_opcode("row_expand", Form.ROW_EXPAND, dt, [("x", (R, C)), ("b", (R, 1))],
                      lambda op, k: Op(op, "y", ("x_", "b_"))))
    m.add(_per_opcode("col_expand", Form.COL_EXPAND, dt, [("x", (R, C)), ("b", (1, C))],
                      lambda op, k: Op(op, "y", ("x_", "b_"))))
    # b loaded and used only as the row broadcast: every warp holds a copy (row layout); b
    # computed after its load: in shared memory, written once (block layout)
    m.add(_incore("col_expand_computed",
                  [MemRef("x", dt, (R, C)), MemRef("b", dt, (1, C)), MemRef("y", dt, (R, C))],
                  [Tile("x_", R, C, dt), Tile("b_", 1, C, dt), Tile("y_", R, C, dt)],
                  [Op("TLOAD", "x_", ("x", 0, 0)), Op("TLOAD", "b_", ("b", 0, 0)),
                   Op("TMULS", "b_", ("b_", 2.0)), Op("TCOLEXPANDMUL", "y_", ("x_", "b_")),
                   Op("TSTORE", "y", ("y_", 0, 0))]))
    m.add(_per_opcode("tile_scalar", Form.TILE_SCALAR, dt, x,
                      lambda op, k: Op(op, "y", ("x_", "alpha" if k % 2 else 0.75)), [Scalar("alpha", dt)]))
    m.add(_per_opcode("generate", Form.GENERATE, dt, [],
                      lambda op, k: Op(op, "y", ("alpha" if k % 2 else -0.5,)), [Scalar("alpha", dt)]))
    m.add(_incore("transpose", [MemRef("x", dt, (R, C)), MemRef("out", dt, (C, R))],
                  [Tile("x_", R, C, dt), Tile("y", C, R, dt)],
                  [Op("TLOAD", "x_", ("x", 0, 0)), Op("TTRANS", "y", ("x_",)),
                   Op("TSTORE", "out", ("y", 0, 0))]))
    # A row walked in place in column blocks: a step of a whole warp of columns keeps every
    # element with its lane (row layout); a step of half a warp makes the windows overlap across
    # iterations, read by other lanes than wrote them (block layout, barriers).
    for name, step in (("columns_in_steps", 32), ("columns_overlapping", 16)):
        m.add(_incore(name, [MemRef("acc", dt, (R, 96))], [Tile("t", R, 32, dt)],
                      [For("j", 0, 64 + step, step, (
                          Op("TLOAD", "t", ("acc", 0, "j")), Op("TMULS", "t", ("t", 2.0)),
                          Op("TADDS", "t", ("t", 1.0)), Op("TSTORE", "acc", ("t", 0, "j"))))]))
    # ... and where a loop symbol must not keep the row layout (a review's reproductions): an
    # inner loop whose start moves with the outer loop, two loops under one name (the first with
    # a constant step, the second with a runtime one; or both constant with other starts), and
    # windows of one memref that are disjoint at one iteration but not across iterations.
    def twice(start, step):
        return For("j", start, 64, step, (Op("TLOAD", "t", ("acc", 0, "j")), Op("TMULS", "t", ("t", 2.0)),
                                          Op("TADDS", "t", ("t", 1.0)), Op("TSTORE", "acc", ("t", 0, "j"))))
    m.add(_incore("triangular", [MemRef("acc", dt, (1, 96))], [Tile("t", 1, 32, dt)],
                  [For("i", 0, 4, 1, (twice("i", 32),))]))
    m.add(_incore("stale_step", [MemRef("acc", dt, (1, 96))], [Tile("t", 1, 32, dt)],
                  [For("j", 0, 0, 32, ()), twice(0, "s")], [Scalar("s", INT)]))
    m.add(_incore("reused_name", [MemRef("acc", dt, (1, 96))], [Tile("t", 1, 32, dt)],
                  [twice(0, 32), twice(16, 32)]))
    # Two loops over column blocks that both start at whole warps (column_blocks' passes): every
    # column stays on its lane in both, so a memref loaded and stored by both keeps the row layout.
    m.add(_incore("two_passes", [MemRef("acc", dt, (R, 96))], [Tile("t", R, 32, dt)],
                  [twice(0, 32), twice(32, 32)]))
    m.add(_incore("aliased_callee",
                  [MemRef("a", dt, (1, 96)), MemRef("b", dt, (1, 56)), MemRef("o", dt, (1, 96))],
                  [Tile("t", 1, 48, dt)],
                  [For("j", 0, 64, 32, (Op("TLOAD", "t", ("a", 0, "j")), Op("TSTORE", "o", ("t", 0, "j")),
                                        Op("TMULS", "t", ("t", 2.0)), Op("TSTORE", "b", ("t", 0, "j"))))]))
    m.add(_incore("aliased_windows", [MemRef("m", dt, (1, 160)), MemRef("o", dt, (1, 96))], [],
                  [Call("aliased_callee", (("a", CallArg("m", 0, 0)), ("b", CallArg("m", 0, 1)),
                                           ("o", CallArg("o"))))]))
    # float64 tiles in a kernel of another element type: exp and a product in double between TCVTs
    m.add(_incore("convert", [MemRef("x", dt, (R, C)), MemRef("out", dt, (R, C))],
                  [Tile("x_", R, C, dt), Tile("w", R, C, pto.FLOAT64), Tile("v", R, 1, pto.FLOAT64)],
                  [Op("TLOAD", "x_", ("x", 0, 0)), Op("TCVT", "w", ("x_",)), Op("TEXP", "w", ("w",)),
                   Op("TMULS", "w", ("w", 1e-3)), Op("TROWSUM", "v", ("w",)),
                   Op("TROWEXPANDADD", "w", ("w", "v")),
                   Op("TCVT", "x_", ("w",)), Op("TSTORE", "out", ("x_", 0, 0))]))
    m.add(_reduce("row_reduce", Form.ROW_REDUCE, dt, lambda n: (R, n), (R, 1), lambda k: (0, k)))
    m.add(_reduce("col_reduce", Form.COL_REDUCE, dt, lambda n: (n, C), (1, C), lambda k: (k, 0)))
    m.add(_incore("matmul", [MemRef("a", dt, (R, K)), MemRef("b", dt, (K, N)), MemRef("out", dt, (R, 2 * N))],
                  [Tile("a_", R, K, dt), Tile("b_", K, N, dt), Tile("c_", R, N, dt)],
                  [Op("TLOAD", "a_", ("a", 0, 0)), Op("TLOAD", "b_", ("b", 0, 0)),
                   Op("TMATMUL", "c_", ("a_", "b_")), Op("TSTORE", "out", ("c_", 0, 0)),
                   Op("TMATMUL_ACC", "c_", ("a_", "b_")), Op("TSTORE", "out", ("c_", 0, N))]))
    # ... and summed over chunks of k (as the matmul families do), the last chunk a tail: on
    # tensor cores the result in registers throughout, or, where it is doubled after the loop,
    # in shared memory with its accumulators in registers across the loop
    chunk = (Op("TLOAD", "a_", ("a", 0, "kk")), Op("TLOAD", "b_", ("b", "kk", 0)),
             Op("TMATMUL_ACC", "c_", ("a_", "b_")))
    for name, after in (("matmul_chunks", ()), ("matmul_chunks_doubled", (Op("TADD", "c_", ("c_", "c_")),))):
        m.add(_incore(name, [MemRef("a", dt, (R, K)), MemRef("b", dt, (K, N)), MemRef("out", dt, (R, N))],
                      [Tile("a_", R, 16, dt), Tile("b_", 16, N, dt), Tile("c_", R, N, dt)],
                      [Op("TLOAD", "a_", ("a", 0, 0)), Op("TLOAD", "b_", ("b", 0, 0)),
                       Op("TMATMUL", "c_", ("a_", "b_")), For("kk", 16, K, 16, chunk), *after,
                       Op("TSTORE", "out", ("c_", 0, 0))]))
    m.add(_incore("mask", [MemRef("x", dt, (R, C)), MemRef("out", dt, (R, C))], [Tile("x_", R, C, dt)],
                  [Op("TLOAD", "x_", ("x", 0, 0)), Op("TCAUSALMASK", "x_", ("x_", "row", 3)),
                   Op("TSTORE", "out", ("x_", 0, 0))], [Scalar("row", INT)]))
    m.add(_incore("softmax", [MemRef("x", dt, (R, C)), MemRef("out", dt, (R, C))],
                  [Tile("x_", R, C, dt), Tile("m_", R, 1, dt)],
                  [Op("TLOAD", "x_", ("x", 0, 0)), Op("TROWMAX", "m_", ("x_",)),
                   Op("TROWEXPANDSUB", "x_", ("x_", "m_")), Op("TEXP", "x_", ("x_",)),
                   Op("TROWSUM", "m_", ("x_",)), Op("TROWEXPANDDIV", "x_", ("x_", "m_")),
                   Op("TSTORE", "out", ("x_", 0, 0))]))
    # A callee on windows, scaling by a scalar parameter the call binds: it returns before its
    # last store, which must not happen.
    half = (R // 2, C // 2)
    m.add(_incore("halve", [MemRef("src", dt, half), MemRef("dst", dt, half)], [Tile("t", *half, dt)],
                  [Op("TLOAD", "t", ("src", 0, 0)), Op("TMULS", "t", ("t", "factor")),
                   Op("TSTORE", "dst", ("t", 0, 0)), Return(), Op("TSTORE", "dst", ("t", 0, 0))],
                  [Scalar("factor", dt)]))
    scalars = [Scalar("n", INT), Scalar("alpha", dt), Scalar("k", INT, False), Scalar("q", INT, False),
               Scalar("flag", INT, False), Scalar("f", dt, False)]
    m.add(_incore("control", [MemRef("x", dt, (R, C)), MemRef("out", dt, (R, C)), MemRef("half", dt, half)],
                  [Tile("t", R, C, dt)],
                  [Op("SLI", "k", (3,)), Op("SADD", "k", ("k", "n")), Op("SMUL", "q", ("k", 2)),
                   Op("SSUB", "q", ("q", 1)), Op("SDIV", "q", ("q", 2)), Op("SMIN", "q", ("q", 3)),
                   Op("SMAX", "q", ("q", -7)), Op("SCMP", "flag", ("q", 0, Predicate.LT)),
                   Op("SDIV", "f", ("alpha", 0.2)),
                   Op("TLOAD", "t", ("x", 0, 0)),
                   For("i", 0, "k", 1, (Op("TADDS", "t", ("t", "alpha")),)),
                   If("flag", Predicate.EQ, 1, (Op("TMULS", "t", ("t", -1.0)),),
                      (Op("TADDS", "t", ("t", "f")),)),
                   Op("TADDS", "t", ("t", "q")), Op("TSTORE", "out", ("t", 0, 0)),
                   Call("halve", (("src", CallArg("x", 1, 1)), ("dst", CallArg("half"))),
                        (("factor", "alpha"),)),
                   If("k", Predicate.GT, 0, (Return(),)),
                   Op("TMULS", "t", ("t", 3.0)), Op("TSTORE", "out", ("t", 0, 0))], scalars))
    # Each step reads two rows the step before wrote, one of them another warp's.
    step = (Op("SSUB", "p", ("i", 1)), Op("TLOAD", "t", ("acc", "p", 0)), Op("TLOAD", "u", ("acc", "i", 0)),
            Op("TADD", "u", ("u", "t")), Op("TSTORE", "acc", ("u", "i", 0)))
    m.add(_incore("prefix", [MemRef("acc", dt, (R, C))], [Tile("t", 2, C, dt), Tile("u", 2, C, dt)],
                  [For("i", 1, R - 1, 1, step)], [Scalar("p", INT, False)]))
    # Cases where the three implementations once disagreed (a review's reproductions):
    # a whole tensor bound to a smaller callee memref is a window of the callee's shape ...
    quarter = (R // 2, C)
    m.add(_incore("rows_in_steps", [MemRef("p", dt, quarter), MemRef("q", dt, quarter)],
                  [Tile("t", R // 4, C, dt)],
                  [For("i", 0, R, R // 4, (Op("TLOAD", "t", ("p", "i", 0)),
                                           Op("TSTORE", "q", ("t", "i", 0))))]))
    m.add(_incore("whole_argument", [MemRef("x", dt, (R, C)), MemRef("y", dt, (R, C))], [],
                  [Call("rows_in_steps", (("p", CallArg("x")), ("q", CallArg("y"))))]))
    # ... float32 scalars round as the interpreter's do (alpha == 0.1 only in double) ...
    m.add(_incore("float_scalars", [MemRef("x", dt, (R, C)), MemRef("y", dt, (R, C))],
                  [Tile("t", R, C, dt)],
                  [Op("SCMP", "flag", ("alpha", 0.1, Predicate.EQ)), Op("SDIV", "q", ("alpha", 0.1)),
                   Op("TLOAD", "t", ("x", 0, 0)), Op("TADDS", "t", ("t", "flag")),
                   Op("TADDS", "t", ("t", "q")), Op("TSTORE", "y", ("t", 0, 0))],
                  [Scalar("alpha", pto.FLOAT32), Scalar("flag", INT, False),
                   Scalar("q", pto.FLOAT32, False)]))
    # ... floor division as numpy's floor_divide: 1.0 // 0.1 is 9 (floor(1.0 / 0.1) is 10), an
    # int by 0 is 0 (the host build died of SIGFPE), the least int by -1 wraps ...
    m.add(_incore("floor_division", [MemRef("x", dt, (R, C)), MemRef("y", dt, (R, C))],
                  [Tile("t", R, C, dt)],
                  [Op("SDIV", "f", ("alpha", "beta")), Op("SDIV", "q", ("n", "d")),
                   Op("TLOAD", "t", ("x", 0, 0)), Op("TADDS", "t", ("t", "f")),
                   Op("TADDS", "t", ("t", "q")), Op("TSTORE", "y", ("t", 0, 0))],
                  [Scalar("alpha", pto.FLOAT64), Scalar("beta", pto.FLOAT64), Scalar("n", INT),
                   Scalar("d", INT), Scalar("f", pto.FLOAT64, False), Scalar("q", INT, False)]))
    # ... and a tile named like another's valid-region variable is its own C name.
    m.add(_incore("clash", [MemRef("x", dt, (R, C)), MemRef("y", dt, (R, C))],
                  [Tile("t", R, C, dt), Tile("t_vr", R, C, dt)],
                  [Op("TLOAD", "t", ("x", 0, 0)), Op("TADD", "t_vr", ("t", "t")),
                   Op("TSTORE", "y", ("t_vr", 0, 0))]))
    return m


FUNCTIONS = ["unary", "binary", "row_expand", "col_expand", "tile_scalar", "generate", "transpose",
             "convert", "row_reduce", "col_reduce", "matmul", "matmul_chunks", "matmul_chunks_doubled",
             "mask", "softmax", "control", "prefix", "whole_argument", "float_scalars", "clash",
             "columns_in_steps", "columns_overlapping", "triangular", "stale_step", "reused_name",
             "aliased_windows", "two_passes", "col_expand_computed", "floor_division"]
# whole-tile reads, or moving offsets (hazards)
# sm_90's ptxas spills 8 bytes of "triangular"'s nested loop state (float32): not a tile, which
# is what the spill checks are about.
LOOP_STATE_SPILLS = {"pto_triangular"}
BLOCK_LAYOUT = {"col_expand_computed", "transpose", "col_reduce", "matmul", "matmul_chunks",
                "matmul_chunks_doubled", "prefix",
                "whole_argument", "columns_overlapping", "triangular", "stale_step", "reused_name",
                "aliased_windows"}
# b's valid rows must be a's valid columns
TAILS = {(name, "b"): (K - 7, N - 7) for name in ("matmul", "matmul_chunks", "matmul_chunks_doubled")}
SCALARS = {"tile_scalar": [(1.5,)], "generate": [(2.5,)], "mask": [(0,), (4,)],
           "control": [(2, 0.5), (-8, 0.25)], "float_scalars": [(0.1,), (0.3,)], "stale_step": [(1,)],
           "floor_division": [(1.0, 0.1, 7, 0), (-1.0, 0.1, -7, 2), (7.5, -2.0, 7, -2),
                              (5.0, 2.5, -(2**63), -1)]}


def _arrays(module, name, dt, tail, seed):
    """Random inputs in [0.5, 2) (logs, roots and quotients stay finite), outputs prefilled."""
    rng = np.random.default_rng(seed)
    arrays = []
    for memref in module.functions[name].memrefs:
        rows, cols = memref.shape
        shape = TAILS.get((name, memref.name), (max(1, rows - 3), max(1, cols - 7))) if tail else (rows, cols)
        arrays.append(rng.uniform(0.5, 2.0, shape).astype(dt))
    return arrays


def _source(dt) -> str:
    module = _module(DTYPES[dt])
    return "".join(cuda_source(module, name) for name in FUNCTIONS)


def test_every_form_is_covered():
    module = _module(pto.FLOAT32)
    used = {op.opcode for f in module.functions.values() for op in walk(f.body) if isinstance(op, Op)}
    # DIM reads a tensor's size, which only an Orchestration may (an InCore shape is a constant).
    assert {spec.form for name, spec in OPCODES.items() if name in used} == set(Form) - {Form.DIM}


def test_layout_and_work_items(tmp_path):
    module = _module(pto.FLOAT32)
    for name in FUNCTIONS:
        code = cuda_code(module, name, tmp_path)
        assert code.source.parent == tmp_path
        assert re.fullmatch(rf"{name}_[0-9a-f]{{16}}\.cu", code.source.name)
        assert code.source.read_text() == cuda_source(module, name)
        assert cuda_code(module, name, tmp_path) == code  # same source, same file
        items = code.items([(R, C)])
        assert items == (THREADS_PER_BLOCK if name in BLOCK_LAYOUT else R * 32), name
        assert ("block layout" in code.source.read_text()) == (name in BLOCK_LAYOUT)
    assert isinstance(code.items, WorkItems)


def test_a_row_broadcast_is_each_warps_copy_only_where_every_copy_is_the_same():
    """COL_EXPAND's b loaded from an input is every warp's own copy (row layout, no shared
    memory); loaded from a memref the kernel also stores, copies could differ (a warp loading
    after another stored), so it is one row in shared memory (block layout, barriers)."""
    f = pto.FLOAT32

    def kernel(weights: str) -> str:
        m = Module("broadcast")
        memrefs = [MemRef("x", f, (R, C)), MemRef("y", f, (R, C))] + \
            ([MemRef("w", f, (1, C))] if weights == "w" else [])
        m.add(_incore("k", memrefs, [Tile("x_", R, C, f), Tile("w_", 1, C, f)],
                      [Op("TLOAD", "x_", ("x", 0, 0)), Op("TLOAD", "w_", (weights, 0, 0)),
                       Op("TCOLEXPANDMUL", "x_", ("x_", "w_")), Op("TSTORE", "y", ("x_", 0, 0))]))
        return cuda_source(m, "k")

    own = kernel("w")
    assert "row layout" in own.splitlines()[0] and "PTO_SHARED" not in own.split("pto_k(")[1]
    shared = kernel("y")
    assert "block layout" in shared.splitlines()[0] and "PTO_SHARED(ACC, t_w_, [1][40], " in shared
    # where the kernel is in the block layout anyway (a store whose offset moves: a hazard), or
    # its rows are split into bands, the row is one copy in shared memory, not one per warp
    m = Module("hazard")
    m.add(_incore("k", [MemRef("x", f, (R, C)), MemRef("w", f, (1, C)), MemRef("y", f, (R, C + 8))],
                  [Tile("x_", R, C, f), Tile("w_", 1, C, f)],
                  [Op("TLOAD", "w_", ("w", 0, 0)),
                   For("i", 0, 16, 8, (Op("TLOAD", "x_", ("x", 0, 0)),
                                        Op("TCOLEXPANDMUL", "x_", ("x_", "w_")),
                                        Op("TSTORE", "y", ("x_", 0, "i"))))]))
    hazard = cuda_source(m, "k")
    assert "block layout" in hazard.splitlines()[0] and "PTO_SHARED(ACC, t_w_, [1][40], " in hazard
    m = Module("bands")
    m.add(_incore("k", [MemRef("x", f, (R, C)), MemRef("w", f, (1, C)), MemRef("y", f, (R, C))],
                  [Tile("x_", R, C, f), Tile("w_", 1, C, f)],
                  [Op("TLOAD", "x_", ("x", 0, 0)), Op("TLOAD", "w_", ("w", 0, 0)),
                   Op("TCOLEXPANDMUL", "x_", ("x_", "w_")), Op("TSTORE", "y", ("x_", 0, 0))]))
    assert "PTO_SHARED(ACC, t_w_, [1][40], " in cuda_source(m, "k", split=("x", "y"))


def test_block_layout_synchronises_around_whole_tile_reads():
    source = cuda_source(_module(pto.FLOAT32), "matmul")
    kernel = source[source.index("pto_matmul("):]
    assert "PTO_SHARED(ACC, t_b_, [40][20], " in kernel and "PTO_SHARED(ACC, t_a_" not in kernel
    product = kernel.index("// TMATMUL %c_")
    assert kernel.rfind("__syncthreads();", 0, product) > kernel.index("// TLOAD %b_")
    assert "__syncthreads" not in cuda_source(_module(pto.FLOAT32), "softmax").split("pto_softmax(")[1]


def test_refusals_name_the_function_and_instruction():
    f = pto.FLOAT32
    module = Module("bad")
    module.add(_incore("square", [MemRef("a", f, (8, 8)), MemRef("out", f, (8, 8))], [Tile("t", 8, 8, f)],
                       [Op("TLOAD", "t", ("a", 0, 0)), Op("TMATMUL", "t", ("t", "t")),
                        Op("TSTORE", "out", ("t", 0, 0))]))
    with pytest.raises(ISAError, match=r"@square: TMATMUL %t, %t, %t: .*differ from the right operand"):
        cuda_source(module, "square")
    big = Module("big")
    big.add(_incore("huge", [MemRef("a", f, (128, 64)), MemRef("out", f, (1, 64))],
                    [Tile("t", 128, 64, f), Tile("s", 1, 64, f)],
                    [Op("TLOAD", "t", ("a", 0, 0)), Op("TCOLSUM", "s", ("t",)),
                     Op("TSTORE", "out", ("s", 0, 0))]))
    with pytest.raises(ISAError, match=r"@huge: .*65536 bytes of shared memory"):
        cuda_source(big, "huge")
    mixed = Module("mixed")
    mixed.add(_incore(
        "widen", [MemRef("a", f, (8, 8)), MemRef("out", f, (8, 8)), MemRef("b", pto.FLOAT64, (8, 8))],
        [Tile("t", 8, 8, f), Tile("u", 8, 8, pto.FLOAT64)],
        [Op("TLOAD", "t", ("a", 0, 0)), Op("TSTORE", "out", ("t", 0, 0)), Op("TLOAD", "u", ("b", 0, 0)),
         Op("TSTORE", "b", ("u", 0, 0))]))
    with pytest.raises(ISAError, match=r"@widen: its memrefs are FLOAT32, FLOAT64; CUDA code is generated"):
        cuda_source(mixed, "widen")


# --- nvcc ---------------------------------------------------------------------------------------
NVCC_OPTIONS = {"float32": cuda_abi.COMPILE_OPTIONS[np.dtype(np.float32)],
                "float64": cuda_abi.COMPILE_OPTIONS[np.dtype(np.float64)],
                "float16": cuda_abi.COMPILE_OPTIONS[np.dtype(np.float16)],
                "float16-tensor-cores": cuda_abi.COMPILE_OPTIONS[np.dtype(np.float16)]}


@pytest.fixture(scope="module")
def ptxas_reports(tmp_path_factory):
    """ptxas' report per element type: every function, for sm_80 and sm_90, in one nvcc run."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit)")
    folder = tmp_path_factory.mktemp("nvcc")
    # The float32 functions' text serves every element type (float16 products on FMA); the
    # float16 functions' has their products on tensor cores.
    sources = {"float32": folder / "generated.cu", "float16": folder / "generated_float16.cu"}
    for dt, source in sources.items():
        source.write_text(_source(np.dtype(dt).type))

    def compile_one(label):
        source = sources["float16" if label == "float16-tensor-cores" else "float32"]
        done = subprocess.run(["nvcc", "--fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                               "arch=compute_90,code=sm_90", "-std=c++17", "-Werror", "all-warnings",
                               "-Xptxas", "-v", *NVCC_OPTIONS[label], str(source), "-o",
                               str(folder / f"{label}.fatbin")], capture_output=True, text=True)
        return label, done.returncode, done.stdout + done.stderr

    with ThreadPoolExecutor(2) as pool:
        return {label: (rc, out) for label, rc, out in pool.map(compile_one, NVCC_OPTIONS)}


@pytest.mark.parametrize("label", NVCC_OPTIONS)
def test_nvcc_compiles_without_warnings_spills_or_local_memory(ptxas_reports, label):
    rc, report = ptxas_reports[label]
    assert rc == 0, report
    functions = re.findall(r"Compiling entry function '(\w+)' for '(sm_\d+)'\n.*?Function properties for \1\n"
                           r"\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\n"
                           r".*?Used (\d+) registers.*?(?:(\d+) bytes smem)?[,\n]", report, re.S)
    seen = {(name, arch) for name, arch, *_ in functions}
    assert seen == {(f"pto_{n}", arch) for n in FUNCTIONS for arch in ("sm_80", "sm_90")}, report
    for name, arch, stack, stores, loads, _, smem in functions:
        assert (stores, loads) == ("0", "0") or name in LOOP_STATE_SPILLS, (name, arch, report)
        # sin and cos keep an array for their argument reduction (sinf's Payne-Hanek path: 7
        # words, a 32-byte frame), not a tile
        assert stack == "0" or name == "pto_unary" or name in LOOP_STATE_SPILLS, (name, arch, report)
        assert int(smem or 0) == 0, (name, arch)  # tiles in dynamic shared memory, which the launch sizes


# --- host build ---------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[np.float32, np.float64, np.float16],
                ids=["float32", "float64", "float16"])
def host_build(request, tmp_path_factory):
    """Every function's source in one shared library, per element type, built by g++."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    dt = request.param
    folder = tmp_path_factory.mktemp(f"host-{np.dtype(dt)}")
    source, library = folder / "generated.cpp", folder / "generated.so"
    source.write_text(_source(dt))
    return dt, host_cuda.compile_source(source, dt, library)


def _host_call(library, name, items, arrays, scalars):
    args = [ctypes.c_longlong(min(MAX_BLOCKS, math.ceil(items / THREADS_PER_BLOCK)))]  # as CudaBackend
    for array in arrays:
        args.append(ctypes.c_void_p(array.ctypes.data))
        words = cuda_abi.tensor_words(array.shape, array.strides, array.itemsize)
        args += [ctypes.c_longlong(int(w)) for w in words]
    for value in scalars:
        word = cuda_abi.scalar_word(value)
        is_int = isinstance(word, np.int64)
        args.append(ctypes.c_longlong(int(word)) if is_int else ctypes.c_double(float(word)))
    getattr(library, f"pto_host_{name}")(*args)


@pytest.mark.parametrize("tail", [False, True], ids=["full", "tail"])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_host_build_matches_the_interpreter(host_build, name, tail, tmp_path):
    dt, library = host_build
    module = _module(DTYPES[dt])
    items = cuda_code(module, name, tmp_path).items([])
    for seed, scalars in enumerate(SCALARS.get(name, [()])):
        expected = _arrays(module, name, dt, tail, seed)
        got = [a.copy() for a in expected]
        interpret.run(module, name, *expected, *scalars)
        _host_call(library, name, items, got, scalars)
        for memref, want, have in zip(module.functions[name].memrefs, expected, got):
            np.testing.assert_allclose(have, want, err_msg=f"{name} {memref.name} {scalars}", **TOLERANCE[dt])


@pytest.mark.parametrize("name", ["softmax", "matmul"])  # the row and the block layout
def test_host_build_runs_a_batch_once_per_leading_index(host_build, name, tmp_path):
    """Memrefs with a leading dim of 3 are three runs; one with a leading dim of 1 (matmul's b,
    passed 2-d) is the same window for each."""
    dt, library = host_build
    module = _module(DTYPES[dt])
    code = cuda_code(module, name, tmp_path)
    shared = {"matmul": "b"}.get(name)
    rng = np.random.default_rng(5)
    arrays = [rng.uniform(0.5, 2.0, m.shape if m.name == shared else (3, *m.shape)).astype(dt)
              for m in module.functions[name].memrefs]
    got = [a.copy() for a in arrays]
    _host_call(library, name, code.items([a.shape for a in arrays]), got, ())
    for index in range(3):
        expected = [a.copy() if a.ndim == 2 else a[index].copy() for a in arrays]
        interpret.run(module, name, *expected)
        for want, have in zip(expected, got):
            if have.ndim == 3:
                np.testing.assert_allclose(have[index], want, **TOLERANCE[dt])


def test_floor_division_and_early_returns_are_seen(host_build, tmp_path):
    """The cases above would pass with C's truncating division or a RETURN that did nothing
    only if the interpreter were wrong the same way: pin what it computes."""
    dt, library = host_build
    module = _module(DTYPES[dt])
    x, out, half = _arrays(module, "control", dt, False, 0)
    # One block: warps 0 and 1 run rows 8 and 9 too, with scalars and valid regions afresh.
    # k = -5, q = max(min(-11 // 2, 3), -7) = -6 (C's truncating division would give -5)
    _host_call(library, "control", THREADS_PER_BLOCK, [x, out, half], (-8, 0.25))
    np.testing.assert_allclose(out, 3 * (-x - 6), **TOLERANCE[dt])
    # k = 5 > 0: returns; q = max(min(9 // 2, 3), -7) = 3; f = 0.5 // 0.2 = 2
    _host_call(library, "control", THREADS_PER_BLOCK, [x, out, half], (2, 0.5))
    np.testing.assert_allclose(out, x + 5 * 0.5 + 2.0 + 3, **TOLERANCE[dt])
    np.testing.assert_allclose(half, x[R // 2:, C // 2:] * 0.5, **TOLERANCE[dt])  # factor = alpha


# --- GPU ----------------------------------------------------------------------------------------
NO_GPU = cuda_unavailable()


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA GPU: {NO_GPU}")
@pytest.mark.parametrize("tail", [False, True], ids=["full", "tail"])
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16], ids=["float32", "float64", "float16"])
def test_generated_kernels_on_the_gpu_match_the_interpreter(name, dt, tail, tmp_path):
    module = _module(DTYPES[dt])
    code = cuda_code(module, name, tmp_path)
    kernel = pto.kernel(name=name, cuda=code)(lambda *args: None)  # runs pto_<name>
    rt = pto.Runtime(backend="cuda", executor="serial")
    for seed, scalars in enumerate(SCALARS.get(name, [()])):
        expected = _arrays(module, name, dt, tail, seed)
        device = [rt.backend.to_device(a) for a in expected]
        interpret.run(module, name, *expected, *scalars)
        rt.run(lambda o, device=device, scalars=scalars:
               o.submit(kernel, *(pto.inout(o.external(a)) for a in device), *scalars))
        for want, have in zip(expected, device):
            np.testing.assert_allclose(rt.backend.to_host(have), want, **TOLERANCE[dt])


# --- tensor cores: what a review found ---------------------------------------------------------
F16 = pto.FLOAT16
F32 = pto.FLOAT32


def _tensor_core_module(build) -> Module:
    module = Module("tensor_cores")
    f = FunctionBuilder("k", module=module).in_core()
    build(f)
    f.build()
    return module


def _run_host(module: Module, arrays, dt, tmp_path, scalars=()) -> str:
    """Build @k of `module` for the host and run it over `arrays`; its source."""
    code = cuda_code(module, "k", tmp_path)
    host_cuda.call(host_cuda.build(code, dt, tmp_path), "k", code, arrays, scalars)
    return code.source.read_text()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("start, stop", [(0, 4), (5, 0)])
def test_a_loop_whose_step_is_0_at_run_time_is_named_and_never_runs_for_ever(start, stop, tmp_path):
    """A FOR's step a scalar parameter that is 0: the interpreter names the loop (it raised
    range()'s bare ValueError); the CUDA code runs no iteration (with start > stop it looped for
    ever)."""
    def build(f):
        f.memref("o", F32, (1, 8)).scalar("a", pto.INT64).scalar("b", pto.INT64).scalar("s", pto.INT64)
        f.tile("t", 1, 8, F32).fill("t", 0.0).for_loop("i", "a", "b", "s").adds("t", "t", 1.0).end_for()
        f.store("o", "t")
    module = _tensor_core_module(build)
    with pytest.raises(ISAError, match=r"FOR %i, %a, %b, %s: its step is 0"):
        interpret.run(module, "k", np.zeros((1, 8), np.float32), start, stop, 0)
    out = np.full((1, 8), 7.0, np.float32)
    _run_host(module, [out], np.float32, tmp_path, (start, stop, 0))
    assert (out == 0).all()

@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_a_product_written_over_its_left_operand_beside_tensor_core_products(tmp_path):
    """h = x @ w1 on tensor cores puts h in shared memory; h = h @ w2 (FMA: dst is an operand)
    then reads h's row from every lane while writing it: the lanes meet before the write."""
    def build(f):
        f.memref("x", F16, (16, 32)).memref("w1", F16, (32, 32)).memref("w2", F16, (32, 32))
        f.memref("out", F16, (16, 32)).tile("xa", 16, 32, F16).tile("wa", 32, 32, F16)
        f.tile("wb", 32, 32, F16).tile("h", 16, 32, F16)
        f.load("xa", "x").load("wa", "w1").load("wb", "w2").matmul("h", "xa", "wa").matmul("h", "h", "wb")
        f.store("out", "h")

    rng = np.random.default_rng(0)
    x, w1, w2 = rng.standard_normal((16, 32)), rng.standard_normal((32, 32)), rng.standard_normal((32, 32))
    arrays = [a.astype(np.float16) for a in (x, w1 / 6, w2 / 6)] + [np.zeros((16, 32), np.float16)]
    source = _run_host(_tensor_core_module(build), arrays, np.float16, tmp_path)
    first, in_place = source.split("TMATMUL %h, %h, %wb")  # the first product on tensor cores, the other FMA
    assert "pto_mma(acc" in first and "pto_mma(" not in in_place
    want = arrays[0].astype(np.float64) @ arrays[1] @ arrays[2]
    np.testing.assert_allclose(arrays[3], want, rtol=0, atol=4e-3 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("rows", [16, 32])
def test_tile_reuse_keeps_tensor_core_operands_apart_from_broadcast_columns(rows, tmp_path):
    """A ROW_EXPAND's column P and a tensor-core product's operand Y (both rows x 1): the
    optimizer once merged them, so lane 0's load of Y overtook the lanes still reading P."""
    def build(f):
        f.memref("mo", F16, (rows, 32)).memref("mp", F16, (rows, 1)).memref("my", F16, (rows, 1))
        f.memref("mb", F16, (1, 32)).memref("out", F16, (rows, 32))
        f.tile("o", rows, 32, F16).tile("P", rows, 1, F16).tile("Y", rows, 1, F16).tile("B", 1, 32, F16)
        f.tile("Z", rows, 32, F16)
        f.load("o", "mo").load("P", "mp").rowexpandmul("o", "o", "P")
        f.load("Y", "my").load("B", "mb").matmul("Z", "Y", "B").add("o", "o", "Z").store("out", "o")

    rng = np.random.default_rng(0)
    shapes = ((rows, 32), (rows, 1), (rows, 1), (1, 32))
    arrays = [rng.standard_normal(shape).astype(np.float16) for shape in shapes]
    arrays.append(np.zeros((rows, 32), np.float16))
    module = optimize.optimize_module(_tensor_core_module(build))
    assert "pto_mma(acc" in _run_host(module, arrays, np.float16, tmp_path)
    mo, mp, my, mb = (a.astype(np.float64) for a in arrays[:4])
    want = mo * mp + my @ mb
    np.testing.assert_allclose(arrays[4], want, rtol=0, atol=4e-3 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_a_float64_product_in_a_float16_kernel_stays_exact(tmp_path):
    """Tensor cores take 16-bit tiles only: float64 tiles (TCVT) multiply exactly (FMA), so
    (x/3) @ x * 3 - x @ x is 0 to float64's precision, where float16 operands leave ~1."""
    n = 16
    F64 = pto.FLOAT64

    def build(f):
        f.memref("x", F16, (n, n)).memref("out", F16, (n, n)).tile("t", n, n, F16).tile("d", n, n, F64)
        f.tile("e", n, n, F64).tile("p", n, n, F64).tile("s", n, n, F64).tile("o", n, n, F16)
        f.load("t", "x").cvt("d", "t").muls("d", "d", 1 / 3).cvt("e", "t").matmul("p", "d", "e")
        f.muls("p", "p", 3.0).matmul("s", "e", "e").sub("p", "p", "s").muls("p", "p", 1000.0)
        f.cvt("o", "p").store("out", "o")

    x = np.random.default_rng(1).integers(-3, 4, (n, n)).astype(np.float16)
    out = np.full((n, n), np.nan, np.float16)
    source = _run_host(_tensor_core_module(build), [x, out], np.float16, tmp_path)
    assert "pto_mma(" not in source.split("TMATMUL %p")[1].split("TMATMUL")[0]
    np.testing.assert_allclose(out, 0.0, atol=1e-6)


def test_float64_tiles_of_a_float16_kernel_count_as_double_in_shared_memory():
    """An 80 x 80 float64 tile read whole needs 51,200 bytes as double: refused by name, as
    in a float32 kernel (counted as float it passed, and nvcc failed on the source)."""
    def build(f):
        f.memref("x", F16, (80, 80)).memref("out", F16, (80, 80)).tile("t", 80, 80, F16)
        f.tile("d", 80, 80, pto.FLOAT64).tile("dT", 80, 80, pto.FLOAT64).tile("o", 80, 80, F16)
        f.load("t", "x").cvt("d", "t").trans("dT", "d").cvt("o", "dT").store("out", "o")

    with pytest.raises(ISAError, match=r"@k: the tiles read whole \(t_d\) need 51200 bytes of shared memory"):
        cuda_source(_tensor_core_module(build), "k")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("m, k, n, accumulate", [(16, 8, 8, False), (32, 64, 48, False), (20, 37, 27, True),
                                                 (128, 40, 64, False)],
                         ids=["one-instruction", "units", "tails-accumulate", "turns-sharing-b"])
def test_a_tf32_function_multiplies_float32_tiles_on_tensor_cores_and_an_exact_one_does_not(
        m, k, n, accumulate, tmp_path):
    """With `tf32` a float32 product is mma.sync.m16n8k8 over operands rounded to TF32: it is
    the float64 product of the rounded operands to float32's accumulation (k x 2^-24 of the
    sum of |a||b|), and TF32's rounding (up to 2^-10 of it) away from the exact product; without
    it, the exact product. Tails of every dim, and an accumulating product; whole units the lean
    way (32 x 64 x 48: the first 32 columns; 128 x 64: a warp's two turns, sharing b), tails with
    tests."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32) if accumulate else np.zeros((m, n), np.float32)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b) + np.abs(c)
    exact = a.astype(np.float64) @ b + c
    for tf32 in (True, False):
        def build(f, tf32=tf32):
            if tf32:
                f.tf32()
            f.memref("a", F32, (m, k)).memref("b", F32, (k, n)).memref("out", F32, (m, n))
            f.tile("ta", m, k, F32).tile("tb", k, n, F32).tile("tc", m, n, F32)
            f.load("ta", "a").load("tb", "b")
            if accumulate:
                f.load("tc", "out").matmul_acc("tc", "ta", "tb")
            else:
                f.matmul("tc", "ta", "tb")
            f.store("out", "tc")

        out = c.copy()
        source = _run_host(_tensor_core_module(build), [a, b, out], np.float32, tmp_path / str(tf32))
        assert ("pto_mma_tf32(acc" in source) == tf32
        # whole units' whole steps read their elements at offsets from places taken once
        assert ("pto_tf32(pto_a_row[" in source) == tf32
        assert ("pto_a_row0 + " in source) == (tf32 and m == 128)  # the turns' places in a
        accumulation = (k + 2) * 2.0**-24 * magnitude
        want = tf32_rounded(a) @ tf32_rounded(b) + c if tf32 else exact
        assert np.all(np.abs(out - want) <= accumulation), (tf32, np.abs(out - want).max())
        if tf32:
            assert np.all(np.abs(out - exact) <= 2.0**-10 * magnitude + accumulation)
            assert np.abs(out - exact).max() > 10 * accumulation.max()  # the rounding is there


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_tiles_of_another_type_in_a_tf32_kernel_multiply_on_fma(tmp_path):
    """Only the kernel's own type's products take tensor cores (its build's pto_mma is that
    type's): float16 tiles (TCVT's) in a tf32 float32 kernel multiply on FMA, and the kernel
    builds (it did not: their product went to the float16 pto_mma, absent from a float32 build)."""
    def build(f):
        f.tf32().memref("a", F32, (16, 16)).memref("b", F32, (16, 16)).memref("out", F32, (16, 16))
        f.tile("ta", 16, 16, F32).tile("tb", 16, 16, F32).tile("ha", 16, 16, F16).tile("hb", 16, 16, F16)
        f.tile("hc", 16, 16, F16).tile("tc", 16, 16, F32)
        f.load("ta", "a").load("tb", "b").cvt("ha", "ta").cvt("hb", "tb").matmul("hc", "ha", "hb")
        f.cvt("tc", "hc").store("out", "tc")

    rng = np.random.default_rng(4)
    a, b = (rng.integers(-3, 4, (16, 16)).astype(np.float32) for _ in range(2))
    out = np.zeros((16, 16), np.float32)
    source = _run_host(_tensor_core_module(build), [a, b, out], np.float32, tmp_path)
    assert "pto_mma" not in source.split("TMATMUL %")[1].split("TCVT")[0]
    np.testing.assert_array_equal(out, a @ b)  # small integers: exact in float16 and float

def test_tf32_is_for_float32_functions_with_a_body():
    def build(f):
        f.tf32().memref("x", F16, (16, 16)).memref("out", F16, (16, 16)).tile("t", 16, 16, F16)
        f.load("t", "x").store("out", "t")

    with pytest.raises(ISAError, match="only an InCore function with a body and float32 memrefs has TF32"):
        _tensor_core_module(build)


# --- tensor cores: a product summed over chunks of k ---------------------------------------------
def _chunked_product(m: int, k: int, n: int, chunk: int, *, start: int | None = None, touch: str = "",
                     returns: bool = False):
    """c = out (loaded) + a @ b over chunks of k: the FOR of TLOAD a, TLOAD b, TMATMUL_ACC c that
    the matmul families write (kernels.tiles.contract); its first chunk at `start` (default:
    chunk, after one TMATMUL of the first; k: no iteration). `touch`: an instruction on c inside
    the loop ("scale"); `returns`: the loop may RETURN."""
    def build(f):
        f.memref("a", F16, (m, k)).memref("b", F16, (k, n))
        f.memref("acc", F16, (m, n)).memref("out", F16, (m, n))
        f.scalar("stop", INT)
        f.tile("ta", m, chunk, F16).tile("tb", chunk, n, F16).tile("c", m, n, F16).tile("first", m, n, F16)
        f.load("c", "acc").load("ta", "a", 0, 0).load("tb", "b", 0, 0).matmul("first", "ta", "tb")
        f.add("c", "c", "first")
        f.for_loop("kk", chunk if start is None else start, k, chunk)
        f.load("ta", "a", 0, "kk").load("tb", "b", "kk", 0).matmul_acc("c", "ta", "tb")
        if touch == "scale":
            f.muls("c", "c", 0.5)
        if returns:
            f.if_then("kk", "ge", "stop").store("out", "c").ret().end_if()
        f.end_for()
        f.store("out", "c")

    return _tensor_core_module(build)


def _assert_chunked(out, a, b, acc, chunk, start, scale=1.0):
    """`out` is what _chunked_product computes, the first chunk's product, then each chunk's
    added (and the sum scaled by `scale` after each), to float16's rounding at the store (2^-11
    relative, 2^-25 absolute below its normal range) and float accumulation (2^-24 relative at
    each of fewer than k + 2 sums of magnitudes up to |acc| + |a| @ |b|)."""
    a, b, acc = (x.astype(np.float64) for x in (a, b, acc))
    want = acc + a[:, :chunk] @ b[:chunk]
    for kk in range(start, a.shape[1], chunk):
        want = (want + a[:, kk:kk + chunk] @ b[kk:kk + chunk]) * scale
    magnitude = np.abs(acc) + np.abs(a) @ np.abs(b)
    bound = 2.0**-11 * np.abs(want) + 2.0**-25 + (a.shape[1] + 2) * 2.0**-24 * magnitude
    assert np.all(np.abs(out - want) <= bound), np.abs(out - want).max()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("m, k, n, chunk, start", [
    (48, 96, 96, 32, None),  # 9 units of 16 x 32: two turns for warp 0
    (20, 37, 27, 16, None),  # tails: m, n not whole units, the last chunk 5 of k (odd: no pairs)
    (32, 64, 40, 32, 64),  # the loop runs no iteration: the accumulators go out as they came in
    (80, 96, 64, 16, None),  # 10 units of 16 x 32, warp w's of columns 32 (w % 2): b's fragments shared
    (72, 37, 60, 16, None),  # the same in tails
], ids=["turns", "tails", "no-iteration", "turns-sharing-b", "turns-sharing-b-tails"])
def test_a_product_summed_over_chunks_keeps_its_accumulators_in_registers(m, k, n, chunk, start, tmp_path):
    """Across the FOR the result's accumulators stay in each warp's registers (read from shared
    memory before it, written after it); the operands are in shared memory as float16, in rows
    padded to packed_pitch, their fragments read as they are: whole 16 x 16 blocks by ldmatrix
    (the host build checks each row address is 16-byte aligned), tails a pair at a time. The
    result is the float64 product's to float16's precision (float accumulators, one rounding at
    the store)."""
    rng = np.random.default_rng(m + k)
    a, b, acc = (rng.uniform(-1, 1, shape).astype(np.float16) for shape in ((m, k), (k, n), (m, n)))
    out = np.full((m, n), np.nan, np.float16)
    module = _chunked_product(m, k, n, chunk, start=start)
    code = cuda_code(module, "k", tmp_path)
    host_cuda.call(host_cuda.build(code, np.float16, tmp_path), "k", code, [a, b, acc, out], (k,))
    source = code.source.read_text()
    loop = source.split("for (long long i_kk")[1].split("accumulators from registers")[0]
    assert "its products' accumulators in registers" in source and "t_c[r][c]" not in loop
    # in several buffers where those fit beside the float tiles (test_loads_copy_ahead_where_they_can)
    staged = re.search(r"PTO_SHARED\(T, pto_buf_t_ta, (\[\d+\])", source)
    a_tile, b_tile = ((f"pto_buf_t_ta, {staged[1]}", f"pto_buf_t_tb, {staged[1]}") if staged
                      else ("t_ta, ", "t_tb, "))
    assert f"PTO_SHARED(T, {a_tile}[{m}][{packed_pitch(chunk)}], " in source
    assert f"PTO_SHARED(T, {b_tile}[{chunk}][{packed_pitch(n)}], " in source
    assert "pto_ldmatrix(fa" in loop and "pto_ldmatrix_trans(&fb" in loop  # the steps with tests
    # whole steps of whole units: from addresses taken before the loop over k, stepped by bytes
    assert "pto_ldmatrix_at(fa, pto_a_row + 2 * k0);" in loop and "pto_ldmatrix_trans_at(&fb[4 * p]" in loop
    # a warp's turns, where they are of the same columns, take b's fragments once a step of k
    shares = m > 64 and n <= 64
    assert ("const int c0 = 32 * (pto_warp % 2);" in loop) == shares
    _assert_chunked(out, a, b, acc, chunk, chunk if start is None else start)


# The hand-written cases' loops run 7 iterations after the first chunk: more than MAX_STAGES + 1,
# so that every buffer is copied into while the others are read, at every count of buffers.
DEPTH = 128


def _moving_by_a_scalar(f):
    """A FOR whose b window moves by a scalar its body changes, a's by the loop variable."""
    f.memref("a", F16, (32, DEPTH)).memref("b", F16, (DEPTH, 32)).memref("out", F16, (32, 32))
    f.scalar_var("row", INT).tile("ta", 32, 16, F16).tile("tb", 16, 32, F16).tile("c", 32, 32, F16)
    f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb")
    f.for_loop("kk", 16, DEPTH, 16).scalar_add("row", "kk", 0)
    f.load("ta", "a", 0, "kk").load("tb", "b", "row", 0).matmul_acc("c", "ta", "tb").end_for()
    f.store("out", "c")


def _transpose_of_the_iteration_before(f):
    """A FOR whose product reads, in place, the transpose of b's chunk loaded in the iteration
    before (a loop pipelined by hand): b's load is not the first to touch its tile."""
    f.memref("a", F16, (32, DEPTH)).memref("b", F16, (32, DEPTH)).memref("out", F16, (32, 32))
    f.tile("ta", 32, 16, F16).tile("tbt", 32, 16, F16).tile("tb", 16, 32, F16).tile("c", 32, 32, F16)
    f.load("ta", "a").load("tbt", "b").trans("tb", "tbt").matmul("c", "ta", "tb")
    f.for_loop("kk", 16, DEPTH, 16).load("ta", "a", 0, "kk").matmul_acc("c", "ta", "tb")
    f.load("tbt", "b", 0, "kk").trans("tb", "tbt").end_for()
    f.store("out", "c")


def _read_after_the_loop(f):
    """The chunks' product, and then, after the loop, the last chunk's once more: the tiles the
    loop leaves are the buffers its last iteration read."""
    f.memref("a", F16, (32, DEPTH)).memref("b", F16, (DEPTH, 32)).memref("out", F16, (32, 32))
    f.tile("ta", 32, 16, F16).tile("tb", 16, 32, F16).tile("c", 32, 32, F16)
    f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb")
    f.for_loop("kk", 16, DEPTH, 16).load("ta", "a", 0, "kk").load("tb", "b", "kk", 0)
    f.matmul_acc("c", "ta", "tb")
    f.end_for().matmul_acc("c", "ta", "tb").store("out", "c")


def _entered_again(f):
    """The chunks' loop inside another, entered three times: each entry finds the tiles where
    the one before left them, at a buffer past the first."""
    f.memref("a", F16, (32, DEPTH)).memref("b", F16, (DEPTH, 32)).memref("out", F16, (32, 32))
    f.tile("ta", 32, 16, F16).tile("tb", 16, 32, F16).tile("c", 32, 32, F16).tile("sum", 32, 32, F16)
    f.load("sum", "out").for_loop("j", 0, 3, 1)
    f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb")
    f.for_loop("kk", 16, DEPTH, 16).load("ta", "a", 0, "kk").load("tb", "b", "kk", 0)
    f.matmul_acc("c", "ta", "tb")
    f.end_for().add("sum", "sum", "c").end_for().store("out", "sum")


HAND_WRITTEN = {"moving by a scalar": (_moving_by_a_scalar, (DEPTH, 32)),
                "transpose read before": (_transpose_of_the_iteration_before, (32, DEPTH)),
                "read after the loop": (_read_after_the_loop, (DEPTH, 32)),
                "entered again": (_entered_again, (DEPTH, 32))}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("case, ahead", [
    ("fits", {"t_ta", "t_tb"}),  # beside a 20 x 27 result in registers and one in shared memory
    # 48 x 224 x 96 by 32, the results in shared memory: the buffers pass SHARED_LIMIT
    ("past the static limit", {"t_ta", "t_tb"}),
    ("returns", set()),  # a RETURN may leave the loop with copies in flight
    ("moving by a scalar", {"t_ta"}),  # b's next window is not known an iteration before
    ("transpose read before", {"t_ta"}),  # b's tile is read (transposed) before its load
    ("read after the loop", {"t_ta", "t_tb"}),
    ("entered again", {"t_ta", "t_tb"}),
])
@pytest.mark.parametrize("stages", range(2, MAX_STAGES + 1))
def test_loads_copy_ahead_where_they_can(case, ahead, stages, tmp_path, monkeypatch):
    """A FOR's TLOADs into packed operands copy a later iteration's window (`stages` - 1 ahead,
    into the tile's next buffer) where the loop, the window and shared memory allow, and the
    results are the same: the host build lands each thread's copies at once and at its wait in
    turn, so a copy read before its wait, or one into a buffer still read, is wrong."""
    monkeypatch.setattr(cuda_codegen, "MAX_STAGES", stages)
    if case == "past the static limit":  # no registers for the results: they take shared memory
        monkeypatch.setattr(cuda_codegen, "REGISTER_ACCUMULATORS", 0)
    if case in HAND_WRITTEN:
        build, b_shape = HAND_WRITTEN[case]
        module, scalars = _tensor_core_module(build), ()
        rng = np.random.default_rng(5)
        arrays = [rng.integers(-2, 3, s).astype(np.float16) for s in ((32, DEPTH), b_shape)]
        arrays.append(np.zeros((32, 32), np.float16))
    else:
        # 6 and 7 iterations after the first chunk, the last one's a tail in the second
        m, k, n, chunk = (48, 224, 96, 32) if case == "past the static limit" else (20, 117, 27, 16)
        module = _chunked_product(m, k, n, chunk, returns=case == "returns")
        rng = np.random.default_rng(6)
        arrays = [rng.integers(-2, 3, s).astype(np.float16) for s in ((m, k), (k, n), (m, n))]
        arrays.append(np.full((m, n), np.nan, np.float16))
        scalars = (k,)
    expected = [x.copy() for x in arrays]
    interpret.run(module, "k", *expected, *scalars)
    source = _run_host(module, arrays, np.float16, tmp_path, scalars)
    copied = set(re.findall(r"pto_copy8_async\(&pto_next_(\w+)\[", source))
    assert copied == ahead
    assert all(f"PTO_SHARED(T, pto_buf_{tile}, [{stages}]" in source for tile in ahead)
    assert (f"pto_async_wait<{stages - 1}>();" in source) == bool(ahead)
    shared = cuda_code(module, "k", tmp_path).shared_bytes
    assert (shared > SHARED_LIMIT) == (case == "past the static limit") and shared <= SHARED_OPT_IN
    for have, want in zip(arrays, expected):  # small integers: exact
        np.testing.assert_array_equal(have, want)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("rows", [48, 40])  # whole units; a tail unit of 8 rows the way with tests
def test_an_operand_computed_in_shared_memory_is_read_the_lean_way_too(rows, tmp_path):
    """A product's a written by another instruction (attention's probabilities) stays float in
    shared memory: a whole unit's whole steps read its pairs at constant offsets from the
    lane's place, rounded to float16 as they are paired; b, loaded only, by ldmatrix."""
    def build(f):
        f.memref("a", F16, (rows, 40)).memref("b", F16, (40, 64)).memref("out", F16, (rows, 64))
        f.tile("ta", rows, 40, F16).tile("tb", 40, 64, F16).tile("c", rows, 64, F16)
        f.load("ta", "a").muls("ta", "ta", 2.0).load("tb", "b").matmul("c", "ta", "tb").store("out", "c")

    rng = np.random.default_rng(rows)
    arrays = [rng.integers(-2, 3, s).astype(np.float16) for s in ((rows, 40), (40, 64))]
    arrays.append(np.zeros((rows, 64), np.float16))
    expected = [x.copy() for x in arrays]
    module = _tensor_core_module(build)
    interpret.run(module, "k", *expected)
    source = _run_host(module, arrays, np.float16, tmp_path)
    assert "fa[q] = pto_pack_pair(pto_a_row[" in source and "pto_ldmatrix_trans_at(&fb" in source
    np.testing.assert_array_equal(arrays[2], expected[2])  # small integers: exact


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("layout", ["ragged", "misaligned", "strided"])
def test_packed_operands_load_8_elements_at_a_time_only_where_their_rows_allow(layout, tmp_path):
    """A packed operand's TLOAD copies 16 bytes at a time where the memref's rows are contiguous
    and 16-byte aligned (rows of whole groups of 8 elements from an aligned start), element by
    element where a group reaches past the valid columns, and as any load elsewhere: views of
    wider arrays (rows of 128 and 64 elements; valid columns 12 of a's last chunk, 27 of b's),
    the same one element in (every row misaligned), every other column (a stride of 2)."""
    m, k, n, chunk = 32, 60, 27, 32
    rng = np.random.default_rng(7)
    wide = [rng.uniform(-1, 1, shape).astype(np.float16) for shape in ((m, 2 * 64), (k, 2 * 32))]
    first = 1 if layout == "misaligned" else 0
    step = 2 if layout == "strided" else 1
    a, b = (x[:, first:first + step * width:step] for x, width in zip(wide, (k, n)))
    acc, out = rng.uniform(-1, 1, (m, n)).astype(np.float16), np.full((m, n), np.nan, np.float16)
    code = cuda_code(_chunked_product(m, k, n, chunk), "k", tmp_path)
    host_cuda.call(host_cuda.build(code, np.float16, tmp_path), "k", code, [a, b, acc, out], (k,))
    source = code.source.read_text()
    # a and b: before the loop; in it, copied ahead, the first ones before it
    assert source.count("pto_copy8(&t_t") == 2 and source.count("pto_copy8_async(&t_t") == 2
    assert source.count("pto_copy8_async(&pto_next_t_t") == 2
    _assert_chunked(out, a, b, acc, chunk, chunk)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("variant", ["in-place", "reloaded", "stored"])
@pytest.mark.parametrize("m, k, n", [(32, 32, 64), (20, 37, 36)], ids=["whole-blocks", "tails"])
def test_a_loaded_tiles_transpose_that_only_products_read_is_the_loaded_tile_read_across(variant, m, k, n,
                                                                                        tmp_path):
    """s = q @ kᵀ through TLOAD kt, TTRANS kT: the products read kt's rows as kT's columns (kt
    packed, ldmatrix without .trans, no kT in shared memory, no copy). Not where kt is loaded
    again before the product (the product needs the first load: kT is its copy) or where kT is
    read by something else (here a TSTORE): kT is then a float tile of its own."""
    def build(f):
        f.memref("q", F16, (m, k)).memref("k", F16, (n, k)).memref("s", F16, (m, n))
        f.tile("tq", m, k, F16).tile("kt", n, k, F16).tile("kT", k, n, F16).tile("ts", m, n, F16)
        f.load("tq", "q").load("kt", "k").trans("kT", "kt")
        if variant == "reloaded":
            f.memref("k2", F16, (n, k)).load("kt", "k2")
        if variant == "stored":
            f.memref("kT_out", F16, (k, n)).store("kT_out", "kT")
        f.matmul("ts", "tq", "kT").store("s", "ts")

    rng = np.random.default_rng(m + n)
    q, kmat, k2 = (rng.uniform(-1, 1, shape).astype(np.float16) for shape in ((m, k), (n, k), (n, k)))
    s, kT_out = np.full((m, n), np.nan, np.float16), np.zeros((k, n), np.float16)
    extra = {"in-place": [], "reloaded": [k2], "stored": [kT_out]}[variant]
    source = _run_host(_tensor_core_module(build), [q, kmat, s, *extra], np.float16, tmp_path)
    assert ("read as t_kt, transposed" in source) == (variant == "in-place")
    declarations = source.split("{  // TLOAD")[0]
    declared = "t_kT[" in declarations or ", t_kT, [" in declarations  # in registers, or PTO_SHARED
    assert (not declared) == (variant == "in-place")
    if variant == "in-place":
        assert "pto_ldmatrix(&fb[4 * p], &t_kt[" in source
    want = q.astype(np.float64) @ kmat.astype(np.float64).T
    bound = 2.0**-11 * np.abs(want) + 2.0**-25 + (k + 2) * 2.0**-24 * (np.abs(q) @ np.abs(kmat).T)
    assert np.all(np.abs(s - want) <= bound), np.abs(s - want).max()
    if variant == "stored":
        np.testing.assert_array_equal(kT_out, kmat.T)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("case", ["store-then-load", "load-then-store", "two-loads"])
def test_a_packed_load_meets_the_owners_of_its_elements(case, tmp_path):
    """A packed tile is loaded in groups of 8 columns a thread, not by the threads that own its
    elements in the row layout: a memref the kernel also stores is loaded after the stores
    before it and stored after the load (barriers), and two loads of the tile, one 16 bytes at
    a time and one element by element, write each element from the same thread (a review's
    reproductions: all three were wrong). Small integers: every result exact."""
    def build(f):
        f.memref("m", F16, (16, 16)).memref("y", F16, (16, 32)).memref("b", F16, (16, 16))
        f.memref("out", F16, (16, 16)).scalar("flag", INT)
        f.tile("ta", 16, 16, F16).tile("tb", 16, 16, F16).tile("c", 16, 16, F16)
        if case == "store-then-load":  # m = 2 y, then a = m
            f.tile("ty", 16, 16, F16).load("ty", "y").muls("ty", "ty", 2.0).store("m", "ty").load("ta", "m")
        elif case == "load-then-store":  # a = m, then m = y
            f.tile("ty", 16, 16, F16).load("ta", "m").load("ty", "y").store("m", "ty")
        else:  # a = y (element by element), then, with flag, a = m (16 bytes at a time)
            f.load("ta", "y").if_then("flag", "ne", 0).load("ta", "m").end_if()
        f.load("tb", "b").matmul("c", "ta", "tb").store("out", "c")

    rng = np.random.default_rng(11)
    m, b = (rng.integers(-3, 4, (16, 16)).astype(np.float16) for _ in range(2))
    wide = rng.integers(-3, 4, (16, 64)).astype(np.float16)
    y = wide[:, ::2]  # a stride of 2: loaded element by element
    out = np.zeros((16, 16), np.float16)
    operands = [m.copy(), y, b, out]
    source = _run_host(_tensor_core_module(build), operands, np.float16, tmp_path, scalars=(1,))
    assert "PTO_SHARED(T, t_ta," in source
    y16 = y[:, :16].astype(np.float64)
    a = {"store-then-load": 2 * y16, "load-then-store": m, "two-loads": m}[case]
    np.testing.assert_array_equal(out, a.astype(np.float64) @ b)
    if case != "two-loads":
        np.testing.assert_array_equal(operands[0], 2 * y16 if case == "store-then-load" else y16)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("first", ["matmul", "load"])
@pytest.mark.parametrize("m, k, n", [(48, 96, 96), (20, 37, 27)], ids=["turns", "tails"])
def test_a_product_result_only_loaded_and_stored_lives_in_registers(first, m, k, n, tmp_path):
    """c = a @ b over chunks of k (its first chunk a TMATMUL, or c loaded and every chunk
    accumulated), then stored, then read back from the memref by a tile of the row layout: c
    is only written by products and its TLOAD and only read by its TSTORE and the products, so
    it lives in each lane's registers from the start to the end (no shared memory, no moves
    around the loop), and its TSTORE meets the row layout's TLOAD of the same memref at a
    barrier (other threads own the elements there)."""
    chunk = 16

    def build(f):
        f.memref("a", F16, (m, k)).memref("b", F16, (k, n)).memref("out", F16, (m, n))
        f.memref("twice", F16, (m, n))
        f.tile("ta", m, chunk, F16).tile("tb", chunk, n, F16).tile("c", m, n, F16).tile("t", m, n, F16)
        f.load("ta", "a", 0, 0).load("tb", "b", 0, 0)
        if first == "matmul":
            f.matmul("c", "ta", "tb")
        else:
            f.load("c", "out").matmul_acc("c", "ta", "tb")
        f.for_loop("kk", chunk, k, chunk)
        f.load("ta", "a", 0, "kk").load("tb", "b", "kk", 0).matmul_acc("c", "ta", "tb")
        f.end_for()
        f.store("out", "c").load("t", "out").add("t", "t", "t").store("twice", "t")

    rng = np.random.default_rng(m + 1)
    a, b, acc = (rng.uniform(-1, 1, shape).astype(np.float16) for shape in ((m, k), (k, n), (m, n)))
    out = acc.copy() if first == "load" else np.full((m, n), np.nan, np.float16)
    twice = np.zeros((m, n), np.float16)
    source = _run_host(_tensor_core_module(build), [a, b, out, twice], np.float16, tmp_path)
    assert "float pto_frag_t_c[" in source and "t_c[" not in source.replace("pto_frag_t_c[", "")
    assert "accumulators into registers" not in source
    _assert_chunked(out, a, b, acc if first == "load" else np.zeros_like(acc), chunk, chunk)
    np.testing.assert_array_equal(twice, (out.astype(np.float32) * 2).astype(np.float16))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_a_result_in_registers_stored_through_windows_that_overlap_across_a_loop(tmp_path):
    """c (in registers: 32 x 64) stored at columns j = 0, 32 of a 96-column memref: the second
    store overwrites half of the first, from other warps than wrote it there (a warp holds 32
    columns of c, not of the memref), so the stores meet at barriers (a review's reproduction:
    the second half held the first store's)."""
    def build(f):
        f.memref("a", F16, (32, 16)).memref("b", F16, (16, 64)).memref("out", F16, (32, 96))
        f.tile("ta", 32, 16, F16).tile("tb", 16, 64, F16).tile("c", 32, 64, F16)
        f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb")
        f.for_loop("j", 0, 64, 32).store("out", "c", 0, "j").end_for()

    rng = np.random.default_rng(13)
    a, b = rng.integers(-3, 4, (32, 16)).astype(np.float16), rng.integers(-3, 4, (16, 64)).astype(np.float16)
    out = np.zeros((32, 96), np.float16)
    source = _run_host(_tensor_core_module(build), [a, b, out], np.float16, tmp_path)
    assert "float pto_frag_t_c[" in source
    c = a.astype(np.float64) @ b
    np.testing.assert_array_equal(out[:, :32], c[:, :32])
    np.testing.assert_array_equal(out[:, 32:], c)  # the second store's


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("m, k, n", [(48, 32, 64), (20, 16, 27)], ids=["turns", "tails"])
def test_a_product_result_scaled_by_row_factors_in_place_lives_in_registers(m, k, n, tmp_path):
    """c = a @ b, then per iteration c = c * exp(factor column j) + a @ b, then c / the last
    factor: the online softmax's running output. c is written only by products and ROW_EXPANDs
    of itself, so it lives in each lane's registers, and the factors (computed by the row
    layout) are in shared memory, where the lanes of the units layout read their rows' (at
    barriers). The interpreter's result to float16's precision: it rounds every instruction's
    result to float16, the kernel keeps c in float."""
    def build(f):
        f.memref("a", F16, (m, k)).memref("b", F16, (k, n)).memref("w", F16, (m, 3))
        f.memref("out", F16, (m, n)).tile("ta", m, k, F16).tile("tb", k, n, F16).tile("c", m, n, F16)
        f.tile("factor", m, 1, F16)
        f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb")
        f.for_loop("j", 0, 3, 1).load("factor", "w", 0, "j").exp("factor", "factor")
        f.rowexpandmul("c", "c", "factor").matmul_acc("c", "ta", "tb").end_for()
        f.rowexpanddiv("c", "c", "factor").store("out", "c")

    rng = np.random.default_rng(m)
    a, b = rng.uniform(-1, 1, (m, k)).astype(np.float16), rng.uniform(-1, 1, (k, n)).astype(np.float16)
    w = rng.uniform(-1, 0.5, (m, 3)).astype(np.float16)
    out = np.full((m, n), np.nan, np.float16)
    module = _tensor_core_module(build)
    source = _run_host(module, [a, b, w, out], np.float16, tmp_path)
    assert "float pto_frag_t_c[" in source and "t_c[" not in source.replace("pto_frag_t_c[", "")
    assert re.search(r"PTO_SHARED\(ACC, t_factor, \[", source)
    want = [a, b, w, np.zeros_like(out)]
    interpret.run(module, "k", *want)
    scale = np.abs(want[3].astype(np.float64)).max()
    np.testing.assert_allclose(out.astype(np.float64), want[3], rtol=0, atol=8 * 2.0**-11 * scale)


def _softmax_weighted(rows: int, keys: int, d: int, dtype=F16, tf32: bool = False):
    """FlashAttention-2's block on tiles of rows x keys scores: s = q·kᵀ / 4, the row max
    mx = max(m, rowmax(s)) (m loaded, mx stored back to it), p = exp(s - mx), l = rowsum(p) + 1,
    out = p·v / l; k, v and m may have fewer rows than their tiles (a tail of keys, of rows)."""
    def build(f):
        if tf32:
            f.tf32()
        f.memref("q", dtype, (rows, d)).memref("k", dtype, (keys, d)).memref("v", dtype, (keys, d))
        f.memref("m", dtype, (rows, 1)).memref("out", dtype, (rows, d))
        f.tile("tq", rows, d, dtype).tile("tk", keys, d, dtype).tile("kt", d, keys, dtype)
        f.tile("tv", keys, d, dtype).tile("s", rows, keys, dtype).tile("o", rows, d, dtype)
        for column in ("mx", "part", "l"):
            f.tile(column, rows, 1, dtype)
        f.load("tq", "q").load("tk", "k").trans("kt", "tk").matmul("s", "tq", "kt").muls("s", "s", 0.25)
        f.load("mx", "m").rowmax("part", "s").max("mx", "mx", "part").store("m", "mx")
        f.rowexpandsub("s", "s", "mx").exp("s", "s").fill("l", 1.0).rowsum("part", "s").add("l", "part", "l")
        f.load("tv", "v").matmul("o", "s", "tv").rowexpanddiv("o", "o", "l").store("out", "o")

    return _tensor_core_module(build)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("rows, keys, valid_rows, valid_keys", [
    (64, 48, 64, 48), (40, 48, 37, 45), (144, 32, 144, 32)], ids=["whole", "tails", "turns"])
def test_scores_reduced_by_rows_and_multiplied_again_stay_in_registers_in_whole_rows(
        rows, keys, valid_rows, valid_keys, tmp_path):
    """The scores, their rows' values and the output stay in registers, a warp a band of 16
    rows (two bands a warp at 144 rows): rows reduced by each group's four lanes, the scores'
    accumulators handed to p·v as its a fragments, zero past the valid keys (45 of 48: a step
    of k partly valid, b's fragments tested there), and no float tile in shared memory. The
    interpreter's results to float16's precision (it rounds every instruction to float16, the
    kernel keeps float), the row max stored by one lane a row."""
    d = 32
    rng = np.random.default_rng(rows + valid_keys)
    q = rng.uniform(-2, 2, (valid_rows, d)).astype(np.float16)
    k, v = (rng.uniform(-2, 2, (valid_keys, d)).astype(np.float16) for _ in range(2))
    m = rng.uniform(-1, 3, (valid_rows, 1)).astype(np.float16)
    out = np.full((valid_rows, d), np.nan, np.float16)
    module = _softmax_weighted(rows, keys, d)
    arrays = [q, k, v, m.copy(), out]
    source = _run_host(module, arrays, np.float16, tmp_path)
    assert "pto_a[kb]" in source and "PTO_SHARED(ACC" not in source
    assert all(re.search(rf"float pto_frag_t_{column}\[\d\]\[2\]", source) for column in ("mx", "part", "l"))
    want = [q, k, v, m.copy(), np.zeros_like(out)]
    interpret.run(module, "k", *want)
    for have, expected in zip(arrays[3:], want[3:]):
        scale = np.abs(expected.astype(np.float64)).max()
        np.testing.assert_allclose(have.astype(np.float64), expected, rtol=0, atol=8 * 2.0**-11 * scale)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("second_b", ["loaded before", "loaded over the first"])
def test_products_that_only_read_shared_memory_meet_no_barrier_between_them_but_a_write_does(second_b,
                                                                                              tmp_path):
    """Two products of 16-bit tiles whose results stay in registers only read shared memory, so
    no barrier comes between them, nor between them and the instructions on registers that
    follow: the barrier after a read waits for an instruction that may write shared memory.
    Where the second product's b is loaded over the first's tile, that load is such a write, and
    the barrier comes before it (without it, warps that ran ahead would overwrite b while others
    still read it for the first product: the host build runs warps in both orders between
    barriers). Small integers: exact on both sides, equal to the interpreter bit for bit."""
    over = second_b == "loaded over the first"

    def build(f):
        f.memref("a", F16, (16, 32)).memref("b", F16, (32, 32)).memref("c", F16, (32, 32))
        f.memref("out", F16, (16, 32)).memref("out2", F16, (16, 32))
        f.tile("ta", 16, 32, F16).tile("tb", 32, 32, F16).tile("r1", 16, 32, F16).tile("r2", 16, 32, F16)
        f.load("ta", "a").load("tb", "b")
        second = "tb" if over else "tc"
        if not over:
            f.tile("tc", 32, 32, F16).load("tc", "c")
        f.matmul("r1", "ta", "tb").adds("r1", "r1", 1.0)
        if over:
            f.load("tb", "c")
        f.matmul("r2", "ta", second).store("out", "r1").store("out2", "r2")

    rng = np.random.default_rng(11)
    a, b, c = (rng.integers(-2, 3, shape).astype(np.float16) for shape in ((16, 32), (32, 32), (32, 32)))
    module = _tensor_core_module(build)
    arrays = [a, b, c, np.zeros((16, 32), np.float16), np.zeros((16, 32), np.float16)]
    source = _run_host(module, arrays, np.float16, tmp_path)
    kernel = source[source.index("pto_k("):]
    rest = kernel.split("// TMATMUL %r2")[0].split("// TMATMUL %r1")[1]  # from the first product on
    assert "pto_frag_t_r1" in kernel and "pto_frag_t_r2" in kernel  # results in registers
    assert ("__syncthreads" in rest) == over, rest
    if over:  # the barrier before the load, which writes what the first product read
        assert rest.index("__syncthreads") < rest.index("// TLOAD %tb, %c")
    want = [a, b, c, np.zeros((16, 32), np.float16), np.zeros((16, 32), np.float16)]
    interpret.run(module, "k", *want)
    np.testing.assert_array_equal(arrays[3], want[3])
    np.testing.assert_array_equal(arrays[4], want[4])
    np.testing.assert_array_equal(arrays[3], a.astype(np.float64) @ b + 1)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("valid", [13, 15])
def test_a_product_reads_only_the_valid_columns_of_its_a_in_registers(valid, tmp_path):
    """s = exp(q·kᵀ) is infinite everywhere, then loaded over from w, `valid` columns of its 16:
    the columns past them keep the infinities, which p·v must not read (inf · 0 is NaN; the
    interpreter refuses to read them at all), nor v's rows past them, infinite too (15: one
    column short of a whole step of k, which packs a's fragments with no test)."""
    def build(f):
        f.memref("q", F16, (16, 16)).memref("k", F16, (16, 16)).memref("w", F16, (16, 16))
        f.memref("v", F16, (16, 16)).memref("out", F16, (16, 16))
        f.tile("tq", 16, 16, F16).tile("tk", 16, 16, F16).tile("kt", 16, 16, F16).tile("tv", 16, 16, F16)
        f.tile("s", 16, 16, F16).tile("o", 16, 16, F16)
        f.load("tq", "q").load("tk", "k").trans("kt", "tk").matmul("s", "tq", "kt").exp("s", "s")
        f.load("s", "w").load("tv", "v").matmul("o", "s", "tv").store("out", "o")

    rng = np.random.default_rng(1)
    q, k = np.full((16, 16), 8, np.float16), np.full((16, 16), 8, np.float16)
    w = rng.integers(-2, 3, (16, valid)).astype(np.float16)
    v = rng.integers(-2, 3, (16, 16)).astype(np.float16)
    v[valid:] = np.inf
    out = np.full((16, 16), np.nan, np.float16)
    source = _run_host(_tensor_core_module(build), [q, k, w, v, out], np.float16, tmp_path)
    assert "pto_a[kb]" in source
    np.testing.assert_array_equal(out, w.astype(np.float64) @ v[:valid])  # small integers: exact


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("rows", [16, 13])
def test_rows_reduced_in_registers_read_only_their_valid_columns(rows, tmp_path):
    """s = exp(q·kᵀ) is infinite everywhere, then loaded over from w, `rows` x 13 of its 16 x 16:
    its rows' max and sum, taken in registers in whole rows, read the 13 valid columns alone (the
    columns past them keep the infinities; a reduction whose columns are all valid reads them
    without a test, and this one's tests each), and the element-wise instructions on s (whole
    units untested, cut ones tested) change its valid region only."""
    def build(f):
        f.memref("q", F16, (16, 16)).memref("k", F16, (16, 16)).memref("w", F16, (16, 16))
        f.memref("out", F16, (16, 1)).tile("tq", 16, 16, F16).tile("tk", 16, 16, F16)
        f.tile("kt", 16, 16, F16).tile("s", 16, 16, F16).tile("mx", 16, 1, F16).tile("l", 16, 1, F16)
        f.load("tq", "q").load("tk", "k").trans("kt", "tk").matmul("s", "tq", "kt").exp("s", "s")
        f.load("s", "w").adds("s", "s", 1.0).rowmax("mx", "s").rowsum("l", "s").add("mx", "mx", "l")
        f.store("out", "mx")

    rng = np.random.default_rng(rows)
    q, k = np.full((16, 16), 8, np.float16), np.full((16, 16), 8, np.float16)
    w = rng.integers(-4, 0, (rows, 13)).astype(np.float16)  # past its columns s holds +inf
    out = np.full((rows, 1), np.nan, np.float16)
    source = _run_host(_tensor_core_module(build), [q, k, w, out], np.float16, tmp_path)
    assert "pto_frag_t_s" in source and "every column valid" in source
    plus = w.astype(np.float64) + 1
    np.testing.assert_array_equal(out[:, 0], plus.max(axis=1) + plus.sum(axis=1))  # small integers: exact


def _one_column_result_beside_scores(f):
    """y = q·w (one column) + the scores' row max."""
    f.memref("q", F16, (32, 16)).memref("k", F16, (16, 16)).memref("w", F16, (16, 1))
    f.memref("out", F16, (32, 1)).tile("tq", 32, 16, F16).tile("tk", 16, 16, F16)
    f.tile("kt", 16, 16, F16).tile("tw", 16, 1, F16).tile("s", 32, 16, F16).tile("mx", 32, 1, F16)
    f.tile("y", 32, 1, F16).load("tq", "q").load("tk", "k").trans("kt", "tk").matmul("s", "tq", "kt")
    f.rowmax("mx", "s").load("tw", "w").matmul("y", "tq", "tw").add("y", "y", "mx").store("out", "y")


def _one_column_result_scaled(f):
    """y = q·w (one column), scaled by a loaded factor a row."""
    f.memref("q", F16, (32, 16)).memref("w", F16, (16, 1)).memref("k", F16, (32, 1))
    f.memref("out", F16, (32, 1)).tile("tq", 32, 16, F16).tile("tw", 16, 1, F16)
    f.tile("y", 32, 1, F16).tile("factor", 32, 1, F16).load("tq", "q").load("tw", "w").load("factor", "k")
    f.matmul("y", "tq", "tw").rowexpandmul("y", "y", "factor").store("out", "y")


def _row_value_reduced(f):
    """The row max of the scores' row sums (a one-column tile's rows reduced)."""
    f.memref("q", F16, (32, 16)).memref("k", F16, (16, 16)).memref("out", F16, (32, 1))
    f.tile("tq", 32, 16, F16).tile("tk", 16, 16, F16)
    f.tile("kt", 16, 16, F16).tile("s", 32, 16, F16).tile("l", 32, 1, F16).tile("l2", 32, 1, F16)
    f.load("tq", "q").load("tk", "k").trans("kt", "tk").matmul("s", "tq", "kt").rowsum("l", "s")
    f.rowmax("l2", "l").store("out", "l2")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("build", [_one_column_result_beside_scores, _one_column_result_scaled,
                                   _row_value_reduced], ids=["beside scores", "scaled", "row value reduced"])
def test_one_column_tiles_beside_tiles_kept_in_registers(build, tmp_path):
    """A product of one column is its accumulators, not a row's value, and a one-column tile's
    rows are reduced in the row layout: such tiles leave the register groups (a review's
    cases, which did not compile), and the results are the interpreter's to float16's
    precision."""
    rng = np.random.default_rng(4)
    shapes = {_one_column_result_beside_scores: ((32, 16), (16, 16), (16, 1)),
              _one_column_result_scaled: ((32, 16), (16, 1), (32, 1)),
              _row_value_reduced: ((32, 16), (16, 16))}
    arrays = [rng.uniform(-1, 1, shape).astype(np.float16) for shape in shapes[build]]
    arrays.append(np.full((32, 1), np.nan, np.float16))
    module = _tensor_core_module(build)
    want = [a.copy() for a in arrays]
    interpret.run(module, "k", *want)
    _run_host(module, arrays, np.float16, tmp_path)
    scale = np.abs(want[-1].astype(np.float64)).max()
    np.testing.assert_allclose(arrays[-1].astype(np.float64), want[-1], rtol=0, atol=8 * 2.0**-11 * scale)


def test_tiles_kept_in_registers_are_chosen_by_every_instruction_that_touches_them():
    """Whole rows where a group of tiles reduces rows or hands a product its a; a result's own
    units where it does neither (flash_pv's output: its row factor, loaded, in shared memory,
    and p, only loaded, packed for ldmatrix); none for a result an instruction reads across
    rows (a column sum); none in whole rows for TF32, whose a fragments are not its results'
    layout (the output alone then, in its own units)."""
    attention = cuda_codegen.Generator(_softmax_weighted(64, 48, 32), "k", tensor_cores=True)
    assert attention.row_owned == attention.fragments == {"t_s", "t_o", "t_mx", "t_part", "t_l"}
    assert {"t_tq", "t_tv"} <= attention.packed and attention.units("t_o").blocks == 4
    assert attention.units("t_s").slices == 1 and attention.row_values("t_mx")

    def pv(f):
        f.memref("p", F16, (64, 64)).memref("v", F16, (64, 128)).memref("w", F16, (64, 1))
        f.memref("out", F16, (64, 128)).tile("tp", 64, 64, F16).tile("tv", 64, 128, F16)
        f.tile("o", 64, 128, F16).tile("factor", 64, 1, F16)
        f.load("o", "out").load("factor", "w").rowexpandmul("o", "o", "factor")
        f.load("tp", "p").load("tv", "v").matmul_acc("o", "tp", "tv").store("out", "o")

    flash_pv = cuda_codegen.Generator(_tensor_core_module(pv), "k", tensor_cores=True)
    assert flash_pv.fragments == {"t_o"} and not flash_pv.row_owned
    assert "t_factor" in flash_pv.whole and "t_tp" in flash_pv.packed and flash_pv.units("t_o").slices == 4

    def column_sum(f):
        f.memref("a", F16, (32, 16)).memref("b", F16, (16, 32)).memref("out", F16, (1, 32))
        f.tile("ta", 32, 16, F16).tile("tb", 16, 32, F16).tile("c", 32, 32, F16).tile("sum", 1, 32, F16)
        f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb").muls("c", "c", 2.0)
        f.colsum("sum", "c").store("out", "sum")

    summed = cuda_codegen.Generator(_tensor_core_module(column_sum), "k", tensor_cores=True)
    assert not summed.fragments and "t_c" in summed.whole
    tf32 = cuda_codegen.Generator(_softmax_weighted(64, 48, 32, F32, tf32=True), "k", tensor_cores=True)
    assert tf32.fragments == {"t_o"} and not tf32.row_owned and "t_s" in tf32.whole


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("touch, returns", [("scale", False), ("", True)], ids=["touched", "returns"])
def test_a_product_whose_result_the_loop_touches_or_leaves_accumulates_in_shared_memory(touch, returns,
                                                                                        tmp_path):
    """Registers across the loop would be wrong where another instruction of the loop reads or
    writes the result (it would see shared memory's stale copy) or a RETURN leaves the loop (it
    would skip the write back): such products read and write it in shared memory each time."""
    m, k, n, chunk = 32, 128, 32, 32
    rng = np.random.default_rng(3)
    a, b, acc = (rng.uniform(-1, 1, shape).astype(np.float16) for shape in ((m, k), (k, n), (m, n)))
    out = np.full((m, n), np.nan, np.float16)
    stop = 64 if returns else k  # returns at its second iteration (kk = 64), after its product,
    # without the last chunk's
    module = _chunked_product(m, k, n, chunk, touch=touch, returns=returns)
    code = cuda_code(module, "k", tmp_path)
    host_cuda.call(host_cuda.build(code, np.float16, tmp_path), "k", code, [a, b, acc, out], (stop,))
    assert "accumulators in registers" not in code.source.read_text()
    scale = 0.5 if touch else 1.0
    _assert_chunked(out, a[:, :stop + chunk], b[:stop + chunk], acc, chunk, chunk, scale)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_an_operand_read_by_another_instruction_stays_float_in_shared_memory(tmp_path):
    """A tile is kept as float16 in shared memory only where it is loaded and only a tensor-core
    product reads it: one that is also stored (here after a scaling, which a float16 copy
    would round differently) stays float."""
    def build(f):
        f.memref("a", F16, (16, 32)).memref("b", F16, (32, 16)).memref("out", F16, (16, 16))
        f.memref("scaled", F16, (32, 16))
        f.tile("ta", 16, 32, F16).tile("tb", 32, 16, F16).tile("c", 16, 16, F16)
        f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb").store("out", "c")
        f.muls("tb", "tb", 1 / 3).muls("tb", "tb", 3.0).store("scaled", "tb")

    rng = np.random.default_rng(5)
    a, b = rng.uniform(-1, 1, (16, 32)).astype(np.float16), rng.uniform(-1, 1, (32, 16)).astype(np.float16)
    out, scaled = np.zeros((16, 16), np.float16), np.zeros((32, 16), np.float16)
    source = _run_host(_tensor_core_module(build), [a, b, out, scaled], np.float16, tmp_path)
    assert f"PTO_SHARED(T, t_ta, [16][{packed_pitch(32)}], " in source
    assert "PTO_SHARED(ACC, t_tb, [32][16], " in source
    np.testing.assert_array_equal(scaled, ((b.astype(np.float32) / np.float32(3)) * 3).astype(np.float16))
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(out, want, rtol=2.0**-10, atol=32 * 2.0**-21)


def test_packed_rows_keep_fragment_loads_on_distinct_banks():
    """In rows of packed_pitch 16-bit elements every row starts 16-byte aligned (ldmatrix,
    16-byte copies); the 8 rows of an ldmatrix matrix (16 bytes each) fall in 8 different
    16-byte groups of banks (of 32 banks, 4 bytes wide); and a tail block's loads, of a (rows
    g + 8i, a pair at column 2t + 8j) one 32-bit word a lane and of b (rows 2t + 8j, column
    g + 8n) one element a lane, put no two lanes on different words of one bank."""
    lanes = [(lane // 4, lane % 4) for lane in range(32)]
    for cols in range(1, 300):
        pitch = packed_pitch(cols)
        assert cols <= pitch < cols + 16 and (2 * pitch) % 16 == 0, cols
        assert len({(row * 2 * pitch // 16) % 8 for row in range(8)}) == 8, cols
        a_words = {(g * pitch + 2 * t) // 2 for g, t in lanes}  # in 4-byte words
        assert len({word % 32 for word in a_words}) == len(a_words) == 32, cols
        b_words = {(2 * t * pitch + g) // 2 for g, t in lanes}  # lanes g, g + 1 share a word
        assert len({word % 32 for word in b_words}) == len(b_words) == 16, cols
