"""Wide rows in column blocks (pto_gpu/isa/column_blocks.py) for a user's kernels on CUDA.

The rewrite is checked on its own against the reference interpreter: a blocked function,
interpreted, gives what the function gives (float64 memrefs; only the order of a row's sum
changes, so 1e-12 relative), on full windows and row and column tails, at several block
widths. Functions it cannot rewrite say why. Then the CUDA code: the user's GELU, LayerNorm
and log-softmax at 768 and 4096 columns compile for sm_80 and sm_90 with no spills and no
stack frame (before, LayerNorm at 64 x 768 spilled 1,636 bytes and at 4096 columns could not
be generated: its weight and bias rows overflowed shared memory), and run on the CUDA
emulator (their own GPU code, built for the host) equal to numpy in float64.
"""

import random
import re
import shutil
import subprocess

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.backends import cuda_abi
from pto_gpu.dtypes import as_dtype
from pto_gpu.isa import column_blocks, cuda_codegen, interpret, optimize
from pto_gpu.isa.column_blocks import NotBlockable
from pto_gpu.isa.ir import For, Module

F64 = pto.FLOAT64
GELU_C = float(np.sqrt(2 / np.pi))


def user_module(rows: int, width: int, dtype=pto.FLOAT32) -> isa.Module:
    """GELU (tanh form), LayerNorm (weight and bias; the window's width from SDIM, so it takes
    column tails) and log-softmax, as docs/ISA.md has a user write them."""
    m = isa.Module("user")
    (isa.FunctionBuilder("gelu", module=m).in_core()
        .memref("input", dtype, (rows, width)).memref("output", dtype, (rows, width))
        .tile("x", rows, width, dtype).tile("u", rows, width, dtype)
        .load("x", "input").mul("u", "x", "x").mul("u", "u", "x").muls("u", "u", 0.044715).add("u", "u", "x")
        .muls("u", "u", GELU_C).tanh("u", "u").adds("u", "u", 1.0).mul("u", "u", "x").muls("u", "u", 0.5)
        .store("output", "u")
        .build())
    (isa.FunctionBuilder("layernorm", module=m).in_core().column_tails()
        .memref("x", dtype, (rows, width)).memref("weight", dtype, (1, width))
        .memref("bias", dtype, (1, width)).memref("out", dtype, (rows, width))
        .scalar("eps", pto.FLOAT32).scalar_var("n", pto.INT64)
        .tile("t", rows, width, dtype).tile("sq", rows, width, dtype).tile("mean", rows, 1, dtype)
        .tile("var", rows, 1, dtype).tile("w", 1, width, dtype).tile("b", 1, width, dtype)
        .load("t", "x").load("w", "weight").load("b", "bias").scalar_dim("n", "x", 1)
        .rowsum("mean", "t").divs("mean", "mean", "n").rowexpandsub("t", "t", "mean")
        .mul("sq", "t", "t").rowsum("var", "sq").divs("var", "var", "n").adds("var", "var", "eps")
        .rsqrt("var", "var").rowexpandmul("t", "t", "var").colexpandmul("t", "t", "w")
        .colexpandadd("t", "t", "b").store("out", "t")
        .build())
    (isa.FunctionBuilder("log_softmax", module=m).in_core()
        .memref("input", dtype, (rows, width)).memref("output", dtype, (rows, width))
        .tile("x", rows, width, dtype).tile("e", rows, width, dtype).tile("mx", rows, 1, dtype)
        .tile("s", rows, 1, dtype)
        .load("x", "input").rowmax("mx", "x").rowexpandsub("x", "x", "mx").exp("e", "x").rowsum("s", "e")
        .log("s", "s").rowexpandsub("x", "x", "s").store("output", "x")
        .build())
    return m


def more_kernels(rows: int, width: int, dtype=F64) -> isa.Module:
    """What the user kernels do not reach: a stored memref loaded again (in place), narrow
    stores, min and max, a scalar written again between passes, generated wide tiles."""
    m = isa.Module("more")
    (isa.FunctionBuilder("softmax_in_place", module=m).in_core()
        .memref("x", dtype, (rows, width)).tile("t", rows, width, dtype).tile("e", rows, width, dtype)
        .tile("mx", rows, 1, dtype).tile("s", rows, 1, dtype)
        .load("t", "x").rowmax("mx", "t").rowexpandsub("t", "t", "mx").exp("e", "t").rowsum("s", "e")
        .rowexpanddiv("e", "e", "s").store("x", "e")
        .build())
    (isa.FunctionBuilder("rescale", module=m).in_core()
        .memref("x", dtype, (rows, width)).memref("out", dtype, (rows, width))
        .memref("spread", dtype, (rows, 1))
        .tile("t", rows, width, dtype).tile("lo", rows, 1, dtype).tile("hi", rows, 1, dtype)
        .load("t", "x").rowmin("lo", "t").rowmax("hi", "t").sub("hi", "hi", "lo").store("spread", "hi")
        .rowexpandsub("t", "t", "lo").rowexpanddiv("t", "t", "hi").store("out", "t")
        .build())
    (isa.FunctionBuilder("scaled_twice", module=m).in_core()
        .memref("x", dtype, (rows, width)).memref("out", dtype, (rows, width)).scalar_var("k", dtype)
        .tile("t", rows, width, dtype).tile("y", rows, width, dtype).tile("s", rows, 1, dtype)
        .load("t", "x").scalar_li("k", 2.0).muls("y", "t", "k").rowsum("s", "y")
        .scalar_li("k", 3.0).rowexpandsub("y", "y", "s").muls("y", "y", "k").store("out", "y")
        .build())
    (isa.FunctionBuilder("positions", module=m).in_core()
        .memref("x", dtype, (rows, width)).memref("out", dtype, (rows, width)).scalar("first", dtype)
        .tile("t", rows, width, dtype).tile("g", rows, width, dtype).tile("s", rows, 1, dtype)
        .load("t", "x").colidx("g", "first").muls("g", "g", 1e-3).add("t", "t", "g").rowmax("s", "t")
        .rowexpandsub("t", "t", "s").store("out", "t")
        .build())
    (isa.FunctionBuilder("generated", module=m).in_core()
        .memref("x", dtype, (rows, width)).memref("out", dtype, (rows, width))
        .tile("t", rows, width, dtype).tile("g", rows, width, dtype).tile("s", rows, 1, dtype)
        .load("t", "x").rowidx("g", 1.0).mul("t", "t", "g").fill("g", 1.0).rowsum("s", "g")
        .rowexpandadd("t", "t", "s").store("out", "t")
        .build())
    return m


def _arrays(function, shape, seed):
    """Inputs in [0.5, 2) for `function`'s memrefs, windows of `shape` (rows, cols) where the
    memref is that wide and tall, outputs prefilled."""
    rng = np.random.default_rng(seed)
    arrays = []
    for memref in function.memrefs:
        rows = shape[0] if memref.shape[0] > 1 else 1
        cols = shape[1] if memref.shape[1] > 1 else 1
        arrays.append(rng.uniform(0.5, 2.0, (rows, cols)).astype(memref.dtype.numpy))
    return arrays


def _blocked_module(module: Module, name: str, block: int) -> Module:
    blocked = column_blocks.blocked(module.functions[name], block)
    return Module(module.name, {**module.functions, name: blocked})


CASES = [("gelu", ()), ("layernorm", (1e-5,)), ("log_softmax", ()), ("softmax_in_place", ()), ("rescale", ()),
         ("scaled_twice", ()), ("positions", (2.5,)), ("generated", ())]


def _module(name: str, rows: int, width: int) -> Module:
    module = user_module(rows, width, F64) if name in ("gelu", "layernorm", "log_softmax") else \
        more_kernels(rows, width)
    return optimize.optimize_module(module)  # as compile gives it to the CUDA generator: tiles reused


@pytest.mark.parametrize("block", [32, 128, 256])
@pytest.mark.parametrize("name,scalars", CASES, ids=[name for name, _ in CASES])
def test_a_blocked_function_computes_what_the_function_computes(name, scalars, block):
    """Interpreted, blocked and not, on a full window and a row tail (and a column tail where
    the function takes one): equal up to the order of each row's sums."""
    rows, width = 8, 768
    module = _module(name, rows, width)
    blocked = _blocked_module(module, name, block)
    function = blocked.functions[name]
    assert {t.cols for t in function.tiles} <= {1, block}
    assert sum(isinstance(s, For) for s in function.body) >= 1
    windows = [(rows, width), (5, width)]
    if module.functions[name].column_tails:
        windows += [(5, 700), (rows, 1)]
    for seed, window in enumerate(windows):
        want = _arrays(module.functions[name], window, seed)
        got = [a.copy() for a in want]
        interpret.run(module, name, *want, *scalars)
        interpret.run(blocked, name, *got, *scalars)
        for expected, actual in zip(want, got):
            np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12, err_msg=f"{name} {window}")


WHOLE_WIDTH_ONLY = ("generated", "positions")  # generated wide tiles: refused where W is not whole blocks


@pytest.mark.parametrize("name,scalars", [c for c in CASES if c[0] not in WHOLE_WIDTH_ONLY],
                         ids=[name for name, _ in CASES if name not in WHOLE_WIDTH_ONLY])
def test_a_width_that_is_not_whole_blocks_ends_in_a_narrower_block(name, scalars):
    """700 columns in blocks of 256: the last block's loads take 188 columns (its valid region),
    and reductions count no more."""
    module = _module(name, 4, 700)
    blocked = _blocked_module(module, name, 256)
    want = _arrays(module.functions[name], (4, 700), 7)
    got = [a.copy() for a in want]
    interpret.run(module, name, *want, *scalars)
    interpret.run(blocked, name, *got, *scalars)
    for expected, actual in zip(want, got):
        np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)


def test_layernorm_recomputes_its_rows_from_the_load_in_three_passes():
    """The shape of the rewrite: the mean's pass, the variance's (x loaded again, centred by a
    copy of the mean, which tile reuse would otherwise overwrite with the variance), then the
    output's; weight and bias loaded where they are used."""
    module = _module("layernorm", 64, 768)
    function = column_blocks.blocked(module.functions["layernorm"], 128)
    loops = [s for s in function.body if isinstance(s, For)]
    assert [(loop.start, loop.stop, loop.step) for loop in loops] == [(0, 768, 128)] * 3
    loads = [[op.srcs[0] for op in loop.body if op.opcode == "TLOAD"] for loop in loops]
    assert loads == [["x"], ["x"], ["x", "weight", "bias"]]
    stores = [[op.dst for op in loop.body if op.opcode == "TSTORE"] for loop in loops]
    assert stores == [[], [], ["out"]]


def test_functions_it_cannot_walk_in_blocks_say_why():
    f = pto.FLOAT32
    rows, width = 8, 512

    def function(build):
        m = isa.Module("refused")
        build(isa.FunctionBuilder("k", module=m).in_core().memref("x", f, (rows, width))
              .memref("out", f, (rows, width)).tile("t", rows, width, f).tile("s", rows, 1, f)).build()
        return m.functions["k"]

    cases = [
        (lambda b: b.load("t", "x").causal_mask("t", "t", 0, 0).store("out", "t"),
         r"TCAUSALMASK %t, %t, 0, 0: not computed column"),
        (lambda b: b.load("t", "x").fill("t", 1.0).store("out", "t"),
         r"a generated wide tile with 512 columns"),
        (lambda b: b.load("t", "x").for_loop("i", 0, 2, 1).store("out", "t").end_for(),
         r"FOR %i, 0, 2, 1: only a body of instructions"),
        (lambda b: b.scalar("r", pto.INT64).load("t", "x").store("out", "t").store("out", "t", "r", 0),
         r"%out is stored and accessed through different windows"),
        (lambda b: b.load("t", "x").rowsum("s", "t").store("x", "t").rowexpandadd("t", "t", "s")
         .store("out", "t"),
         r"TLOAD %t, %x, 0, 0: %x is stored after it and before a pass that needs its result"),
        (lambda b: b.load("t", "x").store("out", "t"), r"no tile is wider than 512 columns"),
        # a local scalar in a stored memref's window: one name, two windows
        (lambda b: b.scalar_var("c", pto.INT64).scalar_li("c", 0).load("t", "x").store("out", "t", 0, "c")
         .scalar_li("c", 1).store("out", "t", 0, "c"),
         r"%out is stored and accessed through different windows"),
        (lambda b: b.memref("bias", f, (1, width)).tile("w", 1, width, f).load("w", "bias").load("t", "x")
         .store("out", "t"), r"memref %bias is only loaded into tiles nothing uses"),
    ]
    for build, reason in cases:
        # 96: 512 columns are not whole blocks of it
        block = 512 if "no tile is wider" in reason else 96 if "generated" in reason else 128
        with pytest.raises(NotBlockable, match=reason):
            column_blocks.blocked(function(build), block)
    m = isa.Module("products")
    (isa.FunctionBuilder("k", module=m).in_core().memref("x", f, (rows, width)).memref("y", f, (width, 16))
        .memref("out", f, (rows, 16)).tile("a", rows, width, f).tile("b", width, 16, f).tile("c", rows, 16, f)
        .load("a", "x").load("b", "y").matmul("c", "a", "b").store("out", "c").build())
    with pytest.raises(NotBlockable, match=r"TMATMUL %c, %a, %b: not computed column by column"):
        column_blocks.blocked(m.functions["k"], 256)


def test_a_window_past_the_tiles_width_needs_whole_blocks():
    """700 columns of a 1024-wide memref: a last block of 256 would load and store columns 700
    to 767, which the function never touches; refused, and on CUDA the widest block that divides
    the width is taken (4000 = 125 x 32), which computes what the interpreter does."""
    f = pto.FLOAT64

    def module(width, memref_width):
        m = isa.Module("past")
        (isa.FunctionBuilder("k", module=m).in_core().memref("x", f, (8, memref_width))
            .memref("out", f, (8, memref_width)).memref("s", f, (8, 1)).tile("t", 8, width, f)
            .tile("u", 8, width, f).tile("r", 8, 1, f)
            .load("t", "x").rowsum("r", "t").store("s", "r").muls("u", "t", 2.0).add("u", "u", "t")
            .store("out", "u").build())
        return m

    with pytest.raises(NotBlockable, match=r"%x's window may reach past the tiles' 700 columns"):
        column_blocks.blocked(module(700, 1024).functions["k"], 256)
    program = isa.compile(module(4000, 4096))
    assert "columns in blocks of 32" in program.kernels["k"].cuda.source.read_text().splitlines()[0]
    want = _arrays(program.module.functions["k"], (8, 4096), 5)
    got = [a.copy() for a in want]
    interpret.run(program.module, "k", *want)
    pto.Runtime(backend="cuda-emulated", executor="serial").run(
        lambda o: o.submit(program.kernels["k"], *(pto.inout(o.external(a)) for a in got)))
    for expected, actual in zip(want, got):
        np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)


def test_the_cuda_source_says_how_its_rows_are_walked():
    module = optimize.optimize_module(user_module(64, 4096))
    first_line = cuda_codegen.cuda_source(module, "layernorm").splitlines()[0]
    assert "row layout: a warp per row; columns in blocks of 256 (at 4096, its tiles would hold 513 " \
           "registers a lane)" in first_line
    # at 768 columns the row layout's 4 tiles of 24 registers a lane (weight and bias each warp's
    # own copy: broadcast rows) fit: no blocks
    narrow = optimize.optimize_module(user_module(64, 768))
    for name in ("gelu", "layernorm"):
        assert cuda_codegen.cuda_source(narrow, name).splitlines()[0].endswith("row layout: a warp per row.")
    # In place: x loaded by the first pass and stored by the last, each column on its lane in
    # both (their loops start at 0 and step by whole warps): the row layout stays
    in_place = optimize.optimize_module(more_kernels(64, 4096, pto.FLOAT32))
    first_line = cuda_codegen.cuda_source(in_place, "softmax_in_place").splitlines()[0]
    assert "row layout: a warp per row; columns in blocks of 256" in first_line
    m = isa.Module("positions")
    f = pto.FLOAT32
    (isa.FunctionBuilder("k", module=m).in_core().memref("x", f, (64, 4096)).memref("w", f, (1, 4096))
        .memref("out", f, (64, 4096)).tile("t", 64, 4096, f).tile("c", 64, 4096, f).tile("v", 1, 4096, f)
        .load("t", "x").load("v", "w").colexpandmul("t", "t", "v").causal_mask("c", "t", 0, 0)
        .add("t", "t", "c").store("out", "t").build())
    first_line = cuda_codegen.cuda_source(m, "k").splitlines()[0]
    assert "not in column blocks (384 registers a lane): TCAUSALMASK %c, %t, 0, 0: not computed column" \
        in first_line




SIZES = [(32, 4096), (64, 768)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_user_kernels_at_768_and_4096_columns_keep_their_tiles_in_registers(dtype, tmp_path):
    """ptxas' report for sm_80 and sm_90: no spill stores or loads and no stack frame; with the
    in-place softmax (its memref loaded and stored in two passes is a hazard: the block layout,
    8 rows a lane at 64 rows, so narrower blocks) and a kernel of narrow stores."""
    unit = tmp_path / "user.cu"
    sources = []
    for rows, width in SIZES:
        kernels = ((user_module(rows, width, as_dtype(dtype)), ("gelu", "layernorm", "log_softmax")),
                   (more_kernels(rows, width, as_dtype(dtype)), ("softmax_in_place", "rescale")))
        for module, names in kernels:
            module = optimize.optimize_module(module)
            for name in names:
                source = cuda_codegen.cuda_source(module, name)
                sources.append(source.replace(f"pto_{name}", f"pto_{name}_{rows}x{width}"))
    unit.write_text("".join(sources))
    done = subprocess.run(["nvcc", "--fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                           "arch=compute_90,code=sm_90", "-std=c++17", "-Xptxas", "-v",
                           *cuda_abi.COMPILE_OPTIONS[np.dtype(dtype)], str(unit), "-o",
                           str(tmp_path / "user.fatbin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = re.findall(r"Compiling entry function '(pto_\w+)' for '(sm_\d+)'\n.*?"
                         r"Function properties for \1\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", done.stderr, re.S)

    assert len(reports) == 2 * 5 * len(SIZES), done.stderr
    assert [r for r in reports if r[2:] != ("0", "0", "0")] == [], done.stderr


@pytest.mark.parametrize("rows,width", SIZES, ids=[f"{r}x{w}" for r, w in SIZES])
def test_user_kernels_run_their_gpu_code_on_the_emulator(rows, width):
    """Through the CUDA backend on the emulator (each launch runs the kernel's own GPU code,
    built for the host), a row tail included, against numpy in float64: float32 rounding of
    each instruction, sums of up to 4096 terms."""
    program = isa.compile(user_module(rows, width))
    rng = np.random.default_rng(width)
    x = rng.standard_normal((rows - 3, width)).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, (1, width)).astype(np.float32)
    bias = rng.standard_normal((1, width)).astype(np.float32)
    outputs = {name: np.zeros_like(x) for name in ("gelu", "layernorm", "log_softmax")}

    def orchestration(o):
        xs, outs = o.external(x), {name: o.external(out) for name, out in outputs.items()}
        o.submit(program.kernels["gelu"], pto.input(xs), pto.output(outs["gelu"]))
        o.submit(program.kernels["layernorm"], pto.input(xs), pto.input(o.external(weight)),
                 pto.input(o.external(bias)), pto.output(outs["layernorm"]), 1e-5)
        o.submit(program.kernels["log_softmax"], pto.input(xs), pto.output(outs["log_softmax"]))

    pto.Runtime(backend="cuda-emulated", executor="serial").run(orchestration)
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(axis=1, keepdims=True)
    layernorm = centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + 1e-5) * weight + bias
    shifted = x64 - x64.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    gelu = 0.5 * x64 * (1 + np.tanh(GELU_C * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(outputs["gelu"], gelu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs["layernorm"], layernorm, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(outputs["log_softmax"], log_softmax, rtol=1e-5, atol=1e-4)


MORE = [(name, scalars) for name, scalars in CASES if name in more_kernels(1, 64).functions]


@pytest.mark.parametrize("name,scalars", MORE, ids=[name for name, _ in MORE])
def test_the_rest_run_blocked_on_the_emulator_as_the_interpreter_runs_them(name, scalars):
    """In place, narrow stores, min and max, a scalar copied, generated tiles: 4096 columns in
    float64 on the CUDA emulator (a row tail of 5 of 8 rows) equal the interpreter's."""
    program = isa.compile(more_kernels(8, 4096))
    kernel = program.kernels[name]
    assert "columns in blocks of 256" in kernel.cuda.source.read_text().splitlines()[0]
    want = _arrays(program.module.functions[name], (5, 4096), 3)
    got = [a.copy() for a in want]
    interpret.run(program.module, name, *want, *scalars)
    pto.Runtime(backend="cuda-emulated", executor="serial").run(
        lambda o: o.submit(kernel, *(pto.inout(o.external(a)) for a in got), *scalars))
    for expected, actual in zip(want, got):
        np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)


# --- random programs -------------------------------------------------------------------------------
def random_program(rng: random.Random, rows: int, width: int) -> isa.Module:
    """A random straight-line function over three wide tiles (rows x width), a 1 x width row for
    column broadcasts, two r x 1 tiles and two local scalars: loads of an input (some through a
    scalar column offset), loads and stores of an in-place memref, element-wise and broadcast
    instructions, reductions, generated tiles, narrow arithmetic and stores, scalars written
    between passes."""
    f = F64
    m = isa.Module("random")
    b = (isa.FunctionBuilder("k", module=m).in_core()
         .memref("x", f, (rows, width)).memref("y", f, (rows, width)).memref("w", f, (1, width))
         .memref("n", f, (rows, 1)).tile("a", rows, width, f).tile("c", rows, width, f)
         .tile("d", rows, width, f).tile("v", 1, width, f).tile("p", rows, 1, f).tile("q", rows, 1, f)
         .scalar_var("s", f).scalar_var("o", pto.INT64)
         .scalar_li("s", 0.5).scalar_li("o", 0).load("a", "x").load("c", "y").load("p", "n"))
    wide, narrow = ["a", "c", "d"], ["p", "q"]
    written, broadcast = {"a", "c", "p"}, False
    for _ in range(rng.randint(3, 12)):
        choice, target = rng.random(), rng.choice(wide)
        ready = [t for t in wide if t in written]
        ready_narrow = [t for t in narrow if t in written]
        if choice < 0.15:
            b.load(target, "x", 0, rng.choice([0, 0, "o"])) if rng.random() < 0.6 else b.load(target, "y")
        elif choice < 0.27:
            b.store("y", rng.choice(ready))
            continue
        elif choice < 0.42:
            operation = rng.choice(["add", "sub", "mul", "max", "min"])
            getattr(b, operation)(target, rng.choice(ready), rng.choice(ready))
        elif choice < 0.50:
            getattr(b, rng.choice(["muls", "adds"]))(target, rng.choice(ready), rng.choice(["s", 0.75]))
        elif choice < 0.62:
            result = rng.choice(narrow)
            getattr(b, rng.choice(["rowsum", "rowmax", "rowmin"]))(result, rng.choice(ready))
            written.add(result)
            continue
        elif choice < 0.70:
            getattr(b, rng.choice(["rowexpandadd", "rowexpandsub", "rowexpandmul"]))(
                target, rng.choice(ready), rng.choice(ready_narrow))
        elif choice < 0.75:
            b.load("v", "w")
            getattr(b, rng.choice(["colexpandadd", "colexpandmul"]))(target, rng.choice(ready), "v")
            broadcast = True
        elif choice < 0.80:
            getattr(b, rng.choice(["fill", "rowidx", "colidx"]))(target, rng.choice(["s", 0.25]))
        elif choice < 0.88:
            result = rng.choice(narrow)
            b.muls(result, rng.choice(ready_narrow), 0.5) if rng.random() < 0.5 else b.load(result, "n")
            written.add(result)
            continue
        elif choice < 0.94:
            b.scalar_add("s", "s", 0.25) if rng.random() < 0.7 else b.scalar_li("o", 0)
            continue
        else:
            b.store("n", rng.choice(ready_narrow))
            continue
        written.add(target)
    final = rng.choice([t for t in wide if t in written])
    if not broadcast:  # every memref is accessed
        b.load("v", "w").colexpandadd(final, final, "v")
    b.store("y", final).store("n", rng.choice([t for t in narrow if t in written]))
    b.build()
    return m


@pytest.mark.parametrize("width,block", [(256, 64), (256, 128), (200, 64)])
def test_random_programs_blocked_compute_what_they_compute(width, block):
    """300 random programs a width (whole blocks, or not: 200 columns in blocks of 64), tile
    reuse on half of them: blocked, or refused with a reason, never different from the
    interpreted function on a full window and a row tail (where the function runs there)."""
    blocked_count = 0
    for seed in range(300):
        module = random_program(random.Random(seed), 4, width)
        if seed % 2:
            module = optimize.optimize_module(module)
        try:
            blocked = _blocked_module(module, "k", block)
        except NotBlockable:
            continue
        blocked_count += 1
        for window in ((4, width), (3, width)):
            want = _arrays(module.functions["k"], window, seed)
            got = [a.copy() for a in want]
            try:  # on a row tail a generated tile (all rows valid) may meet a loaded one: an error
                interpret.run(module, "k", *want)
            except isa.ISAError:
                continue
            interpret.run(blocked, "k", *got)
            for expected, actual in zip(want, got):
                np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-9, err_msg=f"seed {seed}")
    assert blocked_count >= 75  # the comparison is not vacuous (a quarter at least)
