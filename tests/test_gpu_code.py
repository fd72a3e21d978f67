"""pto_gpu.isa.gpu_code and `pto-gpu compile --emit ptx`: the PTX of a kernel instance, made by
NVRTC on a machine without a GPU, from the source and options the CUDA backend compiles with;
and the errors of a call that cannot give one."""

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from nvrtc import library_or_skip
from pto_gpu.kernels import llm
from pto_gpu.kernels.elementwise import scale
from pto_gpu.kernels.tiles import matmul, matmul_acc

import pto_gpu as pto
from pto_gpu import cli, isa
from pto_gpu.isa.family import family_of

PROGRAMS = Path(__file__).resolve().parent.parent / "orchestration" / "programs"


@pytest.fixture(autouse=True)
def nvrtc():
    library_or_skip()


def entries(ptx: str) -> list[str]:
    return re.findall(r"\.visible \.entry (\w+)\(", ptx)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_ptx_of_a_family_instance_is_for_its_arch_and_holds_its_kernel(arch):
    ptx = isa.gpu_code(matmul, [(64, 32), (32, 48), (64, 48)], np.float32, arch=arch)
    assert re.search(rf"^\.target {arch}$", ptx, re.M)
    assert entries(ptx) == ["pto_matmul"]
    # its parameters are the backend's words: a pointer, three sizes, three strides per tensor
    assert len(re.findall(r"\.param \.u64 pto_matmul_param_\d+", ptx)) == 3 * 7


def test_each_element_type_and_instance_gets_its_own_code():
    small = isa.gpu_code(scale, [(4, 16), (4, 16)], np.float32, (2.0,))
    half = isa.gpu_code(scale, [(4, 16), (4, 16)], np.float16, (2.0,))
    wide = isa.gpu_code(scale, [(4, 4096), (4, 4096)], np.float32, (2.0,))
    assert small != half and small != wide
    assert ".b16" in half and ".b16" not in small  # half loads and stores


TENSOR_CORE_INSTANCES = [(matmul, [(64, 96), (96, 64), (64, 64)], ()),
                         (matmul_acc, [(64, 96), (96, 64), (64, 64)], ()),
                         (llm.flash_scores, [(8, 128, 128), (8, 128, 128), (8, 128, 128)], (0, 0, 1)),
                         (llm.flash_pv, [(8, 128, 128), (8, 128, 128), (8, 128, 1), (8, 128, 128)], ()),
                         (llm.flash_pv, [(8, 128, 128), (8, 128, 64), (8, 128, 1), (8, 128, 64)], ())]
MMA = {np.float16: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
       ml_dtypes.bfloat16: "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", list(MMA), ids=lambda dtype: np.dtype(dtype).name)
@pytest.mark.parametrize("kernel, shapes, scalars", TENSOR_CORE_INSTANCES,
                         ids=[k.name for k, *_ in TENSOR_CORE_INSTANCES])
def test_16_bit_products_run_on_tensor_cores(kernel, shapes, scalars, dtype, arch):
    """The products of float16 and bfloat16 tiles are mma.sync instructions (float
    accumulators) whose operands come from shared memory by ldmatrix, at the sizes attention
    (128-row tiles, head dims 64 and 128) and a tiled matmul use; float32 ones stay exact
    (FMA, no TF32)."""
    ptx = isa.gpu_code(kernel, shapes, dtype, scalars, arch=arch)
    assert MMA[dtype] in ptx and "ldmatrix.sync.aligned.m8n8.x4" in ptx
    assert "mma." not in isa.gpu_code(kernel, shapes, np.float32, scalars, arch=arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_a_products_chunks_of_k_are_copied_ahead(arch):
    """A 16-bit product summed over chunks of k copies the next chunks' operands while this
    one's are multiplied: cp.async into shared memory, one commit group an iteration, each
    iteration waiting for all but its newest S - 1, with S buffers a tile (3 for the 64 x 128
    band of a matmul)."""
    shapes = [(64, 1024), (1024, 128), (64, 128)]
    source = family_of(matmul).cuda(shapes, np.dtype(np.float16), ()).source.read_text()
    stages = {int(s) for s in re.findall(r"PTO_SHARED\(T, pto_buf_\w+, \[(\d)\]", source)}
    assert stages == {3}, stages
    ptx = isa.gpu_code(matmul, shapes, np.float16, arch=arch)
    assert "cp.async.cg.shared.global" in ptx and "cp.async.commit_group" in ptx
    assert "cp.async.wait_group 2" in ptx


def test_small_tensor_core_kernels_are_fitted_to_two_blocks_an_sm():
    """A tensor-core kernel with few tiles in registers asks ptxas for two blocks an SM (a matmul
    band); one with more (the fused attention), or without tensor cores, for one."""
    def blocks(kernel, shapes, dtype, scalars=()):
        ptx = isa.gpu_code(kernel, shapes, dtype, scalars, arch="sm_90")
        return int(re.search(r"\.minnctapersm (\d+)", ptx).group(1))

    band = [(64, 1024), (1024, 128), (64, 128)]
    assert blocks(matmul, band, np.float16) == 2 and blocks(matmul, band, np.float32) == 1
    attention = [(8, 64, 128), (8, 512, 128), (8, 512, 128), (8, 64, 128)]
    assert blocks(llm.flash_attention_tile, attention, np.float16, (0, 1)) == 1


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32],
                         ids=lambda t: np.dtype(t).name)
def test_a_16_bit_kernels_exp_is_the_fast_one_and_others_keep_expf(dtype):
    """TEXP in a 16-bit kernel is __expf, x times log2(e) and then ex2.approx, whose error stays
    far inside the 16-bit rounding its results take (pto_isa.cuh, pto_exp); a float32 kernel's
    exp keeps expf's range reduction around its ex2.approx."""
    attention = [(2, 64, 64), (2, 256, 64), (2, 256, 64), (2, 64, 64)]
    ptx = isa.gpu_code(llm.flash_attention_tile, attention, dtype, (0, 1), arch="sm_90")
    exps = len(re.findall(r"ex2\.approx", ptx))
    log2e_then_ex2 = r"mul(?:\.ftz)?\.f32\s+(%f\d+), %f\d+, 0f3FB8AA3B;\s*ex2\.approx\.ftz\.f32\s+%f\d+, \1;"
    fast = re.findall(log2e_then_ex2, ptx)
    assert exps > 0 and len(fast) == (exps if np.dtype(dtype).itemsize == 2 else 0)


def test_16_bit_kernels_build_for_older_gpus_unless_they_need_tensor_cores():
    """sm_75 has no mma.sync.m16n8k16: a float16 kernel without products builds for it, one
    with a product is refused by the compiler with the reason."""
    assert entries(isa.gpu_code(scale, [(4, 16), (4, 16)], np.float16, (2.0,), arch="sm_75")) == ["pto_scale"]
    with pytest.raises(isa.ISAError, match=r"tile products run on tensor cores .*sm_80 or newer"):
        isa.gpu_code(matmul, [(64, 96), (96, 64), (64, 64)], np.float16, arch="sm_75")


def test_a_kernel_without_cuda_code_and_a_bad_arch_are_refused_by_name():
    @pto.kernel(worker=pto.VECTOR)
    def python_only(out):
        out[...] = 0

    with pytest.raises(pto.PTOError, match="python_only has no CUDA code"):
        isa.gpu_code(python_only, [(4, 4)], np.float32)
    with pytest.raises(pto.ParamError, match="arch='hopper' is not a GPU architecture"):
        isa.gpu_code(scale, [(4, 16), (4, 16)], np.float32, (2.0,), arch="hopper")


def test_pto_gpu_compile_emits_the_ptx_of_a_programs_functions(capsys):
    program = str(PROGRAMS / "dynamic_softmax.pto")
    assert cli.main(["compile", program, "--emit", "ptx", "--arch", "sm_80"]) == 0
    ptx = capsys.readouterr().out
    assert re.search(r"^\.target sm_80$", ptx, re.M) and entries(ptx) == ["pto_softmax_tile"]


def test_pto_gpu_compile_says_why_a_program_of_library_kernels_has_no_code_to_emit(capsys):
    assert cli.main(["compile", str(PROGRAMS / "matmul.pto"), "--emit", "cuda"]) != 0
    err = capsys.readouterr().err
    assert "no InCore function of its own to emit cuda for" in err
    assert "pto_gpu.kernels.tiles.matmul_acc" in err


def _float32_product(tf32: bool):
    """@product of a program: out = a @ b of 64 x 32 by 32 x 64 float32 tiles, with `tf32` or not
    (all three in shared memory: 32 KiB)."""
    module = isa.Module("products")
    f = isa.FunctionBuilder("product", module=module).in_core()
    if tf32:
        f.tf32()
    f32 = pto.FLOAT32
    f.memref("a", f32, (64, 32)).memref("b", f32, (32, 64)).memref("out", f32, (64, 64))
    f.tile("ta", 64, 32, f32).tile("tb", 32, 64, f32).tile("tc", 64, 64, f32)
    f.load("ta", "a").load("tb", "b").matmul("tc", "ta", "tb").store("out", "tc").build()
    return isa.compile(module).kernels["product"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_float32_products_take_tensor_cores_as_tf32_only_where_the_function_says_so(arch):
    shapes = [(64, 32), (32, 64), (64, 64)]
    ptx = isa.gpu_code(_float32_product(True), shapes, np.float32, arch=arch)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx and "cvt.rna.tf32.f32" in ptx
    exact = isa.gpu_code(_float32_product(False), shapes, np.float32, arch=arch)
    assert "mma." not in exact and "tf32" not in exact
    with pytest.raises(isa.ISAError, match=r"TF32 tile products run on tensor cores .*sm_80 or newer"):
        isa.gpu_code(_float32_product(True), shapes, np.float32, arch="sm_75")
    # a run's precision="tf32" makes the library family's float32 instance so; exact by default
    family = [(64, 32), (32, 64), (64, 64)]
    assert "tf32.tf32" in isa.gpu_code(matmul, family, np.float32, arch=arch, precision="tf32")
    assert "tf32" not in isa.gpu_code(matmul, family, np.float32, arch=arch)
    with pytest.raises(pto.PTOError, match=r"gpu_code: precision='fp8'; choose one of 'exact', 'tf32'"):
        isa.gpu_code(matmul, family, np.float32, arch=arch, precision="fp8")


def test_float32_element_wise_code_stays_in_float():
    """The activations' templates (TRECIP, TSILU, TSIGMOID, TRELU) keep float tiles in float:
    no double instruction in a float32 instance's PTX (double literals made them convert and
    divide in double, at 1/64 of float's rate on most GPUs); a float64 instance's has them."""
    m = isa.Module("activations")
    for dtype in (pto.FLOAT32, pto.FLOAT64):
        name = f"act_{dtype.name.lower()}"
        (isa.FunctionBuilder(name, module=m).in_core()
            .memref("x", dtype, (8, 64)).memref("y", dtype, (8, 64)).tile("t", 8, 64, dtype)
            .load("t", "x").recip("t", "t").silu("t", "t").sigmoid("t", "t").relu("t", "t").store("y", "t")
            .build())
    program = isa.compile(m)
    single = isa.gpu_code(program.kernels["act_float32"], [(8, 64), (8, 64)], np.float32)
    double = isa.gpu_code(program.kernels["act_float64"], [(8, 64), (8, 64)], np.float64)
    assert re.findall(r"^\s*\w+(?:\.\w+)*\.f64\b.*$", single, re.M) == []
    assert re.search(r"\brcp\.rn\.f64\b|\bdiv\.rn\.f64\b", double)
