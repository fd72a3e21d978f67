"""Random float16 tile programs of tensor-core products against the interpreter, bit for bit.

The CUDA generator's tensor-core path (pto_gpu/isa/cuda_codegen.py) chooses per program where
each tile lives: operands packed as float16 (read by ldmatrix, loaded 16 bytes at a time where
the rows allow), a transpose read in place, a result in registers from start to end or across
a loop, others in shared memory as float, with barriers where threads of different layouts
meet. Each program here mixes what decides those choices (products summed over chunks of k
with tails, a b loaded as its transpose, instructions on the result inside or after the loop,
an IF around a product, a result stored over overlapping windows and read back, operands from
strided or misaligned views) and runs on the host build (pto_isa.cuh: every thread a fiber,
warps in both orders between barriers, so a missing barrier gives a wrong result).

Inputs are integers in [-2, 2] (doubled once, where a is rewritten) and the instructions on
results add 1 or double, so every value on either side is an integer below 2048 in magnitude
(at most 4 x 2 x 48 + 6, doubled twice): exact in float16 (a column sum of c's, up to 80 of
them, exact in float and rounded to float16 once on either side). The generated code and the
interpreter (which rounds every instruction) must agree exactly, not within a tolerance.
"""

import random
import re
import shutil

import host_cuda
import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu.isa import cuda_codegen, interpret
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_codegen import MAX_STAGES, cuda_code
from pto_gpu.isa.ir import Module

F16 = pto.FLOAT16
PROGRAMS = 64


def _program(module: Module, name: str, rng: random.Random) -> dict:
    """A random program @name in `module`; what calling it needs (shapes, views, scalars)."""
    m, n = rng.choice([16, 20, 32, 48, 80]), rng.choice([8, 16, 24, 40, 64])
    k, chunk = rng.choice([16, 24, 37, 48]), rng.choice([8, 16, 32])
    chunk = min(chunk, k)
    transposed = rng.random() < 0.4  # b loaded as its transpose (n x k), then TTRANS
    # c from the memref, the first chunk's product, or loaded and then overwritten by it
    start = rng.choice(["load", "matmul", "overwrite"])
    rewrite_a = rng.random() < 0.2  # a doubled through the memref first: its later loads read what was stored
    keep_b = rng.random() < 0.2  # b's last chunk also stored: b a tile of its own, not a view
    inside = rng.choice(["", "", "add"])  # an instruction on c in the loop: not kept across it alone
    # one on c after the loop (c in registers throughout), or a column sum (c in shared memory,
    # kept in registers only across the loop; the sums exact in float, rounded once either side)
    after = rng.choice(["", "double", "column sums"])
    branch = rng.random() < 0.3  # the loop's product under an IF
    stores = rng.choice(["one", "overlapping"])  # c stored once, or at columns 0 and n / 2 in a loop
    read_back = rng.random() < 0.5  # the stored memref loaded again by a tile of the row layout

    memrefs = {"a": (m, k), "b": (n, k) if transposed else (k, n), "out": (m, 2 * n)}
    if start != "matmul":
        memrefs["c_in"] = (m, n)
    if read_back:
        memrefs["again"] = (m, 2 * n)
    if keep_b:
        memrefs["b_out"] = (chunk, n)
    f = FunctionBuilder(name, module=module).in_core()
    for memref, shape in memrefs.items():
        f.memref(memref, F16, shape)
    f.scalar("flag", pto.INT64)
    f.tile("ta", m, chunk, F16).tile("tb", chunk, n, F16).tile("c", m, n, F16)
    if transposed:
        f.tile("tbt", n, chunk, F16)
    if read_back:
        f.tile("t", m, 2 * n, F16)
    if rewrite_a:
        f.tile("all_a", m, k, F16).load("all_a", "a").muls("all_a", "all_a", 2.0).store("a", "all_a")

    def load_b(offset):
        if transposed:
            f.load("tbt", "b", 0, offset).trans("tb", "tbt")
        else:
            f.load("tb", "b", offset, 0)

    first = 0
    if start != "matmul":
        f.load("c", "c_in")
    if start != "load":
        f.load("ta", "a", 0, 0)
        load_b(0)
        f.matmul("c", "ta", "tb")
        first = chunk
    f.for_loop("kk", first, k, chunk).load("ta", "a", 0, "kk")
    load_b("kk")
    if branch:
        f.if_then("flag", "ne", 0).matmul_acc("c", "ta", "tb").end_if()
    else:
        f.matmul_acc("c", "ta", "tb")
    if inside == "add":
        f.adds("c", "c", 1.0)
    f.end_for()
    if after == "double":
        f.add("c", "c", "c")
    elif after == "column sums":
        f.tile("sums", 1, n, F16).colsum("sums", "c").store("out", "sums")
    if stores == "one":
        f.store("out", "c", 0, n // 2)
    else:
        f.for_loop("j", 0, n, n // 2).store("out", "c", 0, "j").end_for()
    if read_back:
        f.load("t", "out").muls("t", "t", 2.0).store("again", "t")
    if keep_b:
        f.store("b_out", "tb")
    f.build()

    views = {memref: rng.choice(["plain", "plain", "strided", "misaligned"]) for memref in ("a", "b")}
    return dict(memrefs=memrefs, views=views, flag=rng.choice([0, 1]))


def _inputs(case: dict, seed: int) -> list[np.ndarray]:
    """Small integers in the program's memrefs (in their order); a and b as views of wider
    arrays where asked (every other column, or one element in: rows not 16-byte aligned)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for memref, (rows, cols) in case["memrefs"].items():
        view = case["views"].get(memref, "plain")
        if memref in ("out", "again", "b_out"):
            arrays.append(np.full((rows, cols), 7.0, np.float16))  # what is not stored stays 7
        elif view == "strided":
            arrays.append(rng.integers(-2, 3, (rows, 2 * cols)).astype(np.float16)[:, ::2])
        elif view == "misaligned":
            arrays.append(rng.integers(-2, 3, (rows, cols + 8)).astype(np.float16)[:, 1:cols + 1])
        else:
            arrays.append(rng.integers(-2, 3, (rows, cols)).astype(np.float16))
    return arrays


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """PROGRAMS random programs, their CUDA sources in one library built by g++. Their tiles are
    small, so loads ahead take all the buffers they may: program i may take 2 + i % (MAX_STAGES
    - 1), so that every count of buffers is in the sample."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    rng = random.Random(2026)
    module = Module("tensor_core_fuzz")
    cases = {f"p{i}": _program(module, f"p{i}", rng) for i in range(PROGRAMS)}
    folder = tmp_path_factory.mktemp("tensor-core-fuzz")
    codes = {}
    with pytest.MonkeyPatch.context() as patch:
        for i, name in enumerate(cases):
            patch.setattr(cuda_codegen, "MAX_STAGES", 2 + i % (MAX_STAGES - 1))
            codes[name] = cuda_code(module, name, folder)
    return module, cases, codes, host_cuda.build_all(codes.values(), np.float16, folder)


def test_the_programs_take_every_layout_the_generator_has(programs):
    """The sample is worth its time: between them the programs have packed operands read by
    ldmatrix and loaded 16 bytes at a time, a transpose read in place, results in registers
    throughout and across a loop only, results in shared memory, a loop's loads copied an
    iteration or more ahead (b's and its transpose's source; in every count of buffers) and not
    (a's where a is rewritten), a
    warp's turns sharing b's fragments, and fragments by whole blocks from addresses taken
    before the loop over k (b's transposed or its source's as they are)."""
    _, _, codes, _ = programs
    sources = "".join(code.source.read_text() for code in codes.values())
    for feature in ("pto_ldmatrix(fa", "pto_ldmatrix_trans(", "pto_copy8(", "read as t_tbt, transposed",
                    "float pto_frag_t_c[", "its products' accumulators in registers",
                    "PTO_SHARED(ACC, t_c, [", "pto_copy8_async(&pto_next_t_tb[",
                    "pto_copy8_async(&pto_next_t_tbt[", "TLOAD %ta, %a, 0, %kk\n",
                    "const int c0 = 32 * (pto_warp % 2);", "pto_ldmatrix_at(fa, pto_a_row",
                    "pto_ldmatrix_trans_at(&fb[4 * p], pto_b_row", "pto_ldmatrix_at(&fb[4 * p], pto_b_row",
                    "pto_a_row0 + ", *(f"pto_async_wait<{pending}>();" for pending in range(1, MAX_STAGES))):
        assert feature in sources, feature


# Copies ahead done wrong, as the generated code would have them: the wait for an iteration's
# copies after its products rather than before, or no barrier between a buffer's last products
# and the copies into it that follow. The host build lands a thread's copies at once and at its
# wait in turn, so each gives some program a wrong result.
MUTANTS = {
    "the wait after the products": [
        (r"(?s)(\n\s*)(pto_async_wait<\d+>\(\);)[^\n]*(.*?)"
         r"(\n\s*if \([^\n]*\) \{\n\s*\{  // \w+'s buffers turn)", r"\3\1\2\4")],
    "no barrier before the buffers turn": [
        (r"__syncthreads\(\);\n(\s*if \([^\n]*\) \{\n\s*\{  // \w+'s buffers turn)", r"\1")],
}
MUTATED = 16  # programs a mutant's library holds


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_host_build_catches_copies_ahead_out_of_order(programs, tmp_path, mutant):
    module, cases, codes, _ = programs
    names = [f"p{i}" for i in range(MUTATED)]
    source = "".join(codes[name].source.read_text() for name in names)
    for pattern, replacement in MUTANTS[mutant]:
        source, count = re.subn(pattern, replacement, source)
        assert count > 0, pattern
    (tmp_path / "mutant.cpp").write_text(source)
    library = host_cuda.compile_source(tmp_path / "mutant.cpp", np.float16, tmp_path / "mutant.so")
    wrong = []
    for index, name in enumerate(names):
        expected = _inputs(cases[name], index)
        got = [a.copy() for a in expected]
        interpret.run(module, name, *expected, cases[name]["flag"])
        host_cuda.call(library, name, codes[name], got, (cases[name]["flag"],))
        if any(not np.array_equal(have, want) for have, want in zip(got, expected)):
            wrong.append(name)
    assert wrong, f"{mutant}: every program still equals the interpreter"


def _long_loop(module: Module) -> None:
    """@long: c = a @ b over chunks of 16 of k, 7 iterations after the first: every buffer of
    every count is copied into while others are read, where the random programs' loops are
    mostly shorter than the buffers."""
    f = FunctionBuilder("long", module=module).in_core()
    f.memref("a", F16, (32, 128)).memref("b", F16, (128, 64)).memref("out", F16, (32, 64))
    f.tile("ta", 32, 16, F16).tile("tb", 16, 64, F16).tile("c", 32, 64, F16)
    f.load("ta", "a").load("tb", "b").matmul("c", "ta", "tb")
    f.for_loop("kk", 16, 128, 16).load("ta", "a", 0, "kk").load("tb", "b", "kk", 0)
    f.matmul_acc("c", "ta", "tb").end_for().store("out", "c")
    f.build()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("stages", range(2, MAX_STAGES + 1))
@pytest.mark.parametrize("mutant", MUTANTS)
def test_every_count_of_buffers_catches_copies_ahead_out_of_order(stages, mutant, tmp_path, monkeypatch):
    """With each count of buffers, a long loop is right as generated and wrong with either
    mistake made in its text."""
    monkeypatch.setattr(cuda_codegen, "MAX_STAGES", stages)
    module = Module("long_loop")
    _long_loop(module)
    code = cuda_code(module, "long", tmp_path)
    source = code.source.read_text()
    assert f"pto_buf_t_ta, [{stages}]" in source
    rng = np.random.default_rng(stages)
    arrays = [rng.integers(-2, 3, shape).astype(np.float16) for shape in ((32, 128), (128, 64))]
    expected = [*arrays, np.zeros((32, 64), np.float16)]
    interpret.run(module, "long", *expected)
    for pattern, replacement in MUTANTS[mutant]:
        source, count = re.subn(pattern, replacement, source)
        assert count > 0, pattern
    results = {}
    for label, text in (("as generated", code.source.read_text()), ("mutant", source)):
        (tmp_path / f"{label}.cpp").write_text(text)
        library = host_cuda.compile_source(tmp_path / f"{label}.cpp", np.float16, tmp_path / f"{label}.so")
        got = [*(a.copy() for a in arrays), np.zeros((32, 64), np.float16)]
        host_cuda.call(library, "long", code, got, ())
        results[label] = np.array_equal(got[2], expected[2])
    assert results == {"as generated": True, "mutant": False}


@pytest.mark.parametrize("index", range(PROGRAMS))
def test_a_random_tensor_core_program_equals_the_interpreter_bit_for_bit(programs, index):
    module, cases, codes, library = programs
    name = f"p{index}"
    case = cases[name]
    expected = _inputs(case, index)
    got = [a.copy() for a in expected]
    interpret.run(module, name, *expected, case["flag"])
    host_cuda.call(library, name, codes[name], got, (case["flag"],))
    for memref, want, have in zip(module.functions[name].memrefs, expected, got):
        np.testing.assert_array_equal(have, want, err_msg=f"{name}: {memref.name} ({case})")
