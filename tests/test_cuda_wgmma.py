"""wgmma (pto_gpu/isa/pto_wgmma.cuh): Hopper's warpgroup tensor-core product with its operands in
swizzled shared memory, through pto_gpu/isa/wgmma_probe.cu (D = rounds x A B, A 64 x 128, B 128 x N, N
64 or 128, B MN-major and K-major, float16 and bfloat16; a D a block).

- On the host build (every machine): the emulation reads the layouts as the probe writes them,
  equal to numpy bit for bit (small integers: every product and sum exact in float32). Both sides
  come from one reading of the PTX ISA, so this holds the emulation and the probe to each other.
- NVRTC (every machine with the wheel): sm_90a code holds the instructions, assembles without
  spilling, and the build for any other arch is refused by name.
- On an sm_90 GPU (`gpu`): the hardware equals numpy too. This is what says the reading is the
  hardware's; `make gpu-check` runs it with the other `gpu` tests.
"""

from __future__ import annotations

import ctypes
import re
import subprocess

import ml_dtypes
import numpy as np
import pytest
from nvrtc import compile_source, cupy_options, library_or_skip

from pto_gpu.backends.emulated_device import HOST_FLAGS
from pto_gpu.backends.wgmma_probe import KERNELS, differences, launch, module, operands, options, source
from pto_gpu.runtime import cuda_unavailable

DTYPES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
NO_GPU = cuda_unavailable()


@pytest.fixture(scope="module")
def host_builds(tmp_path_factory) -> dict[np.dtype, ctypes.CDLL]:
    folder = tmp_path_factory.mktemp("wgmma")
    (folder / "probe.cpp").write_text(source())
    builds = {}
    for dtype in DTYPES:
        library = folder / f"probe-{dtype.name}.so"
        subprocess.run(["g++", "-x", "c++", *HOST_FLAGS, "-Wall", "-Werror", *options(dtype),
                        str(folder / "probe.cpp"), "-o", str(library)], check=True)
        builds[dtype] = ctypes.CDLL(str(library))
    return builds


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.name)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rounds, blocks", [(1, 1), (3, 2)])
def test_the_host_builds_wgmma_reads_the_swizzled_layouts_the_probe_writes(host_builds, kernel, dtype,
                                                                          rounds, blocks):
    n = KERNELS[kernel]
    a, b, want = operands(n, dtype, seed=n, rounds=rounds, blocks=blocks)
    got = np.full(want.shape, np.nan, np.float32)
    pointers = (ctypes.c_void_p(x.ctypes.data) for x in (a, b, got))
    entry = getattr(host_builds[dtype], f"pto_host_{kernel}")
    entry(ctypes.c_longlong(blocks), *pointers, ctypes.c_int(rounds))
    assert np.array_equal(got, want), differences(got, want)


def test_descriptors_are_encoded_as_cutlass_encodes_them(host_builds):
    """CUTLASS's values (cute/arch/mma_sm90_desc.hpp, make_gmma_desc): a K-major 128-byte
    swizzled operand at 0 (LBO 16, SBO 1024), and an MN-major one at 0x400 (LBO 0x4000, SBO
    1024): bits 0-13, 16-29 and 32-45 the byte values over 16, bits 62-63 the swizzle (1). The
    host tests use one encoding for both sides; this holds it to another's."""
    encode = host_builds[DTYPES[0]].pto_host_wgmma_descriptor
    encode.restype = ctypes.c_ulonglong
    assert encode(0, 16, 1024) == 0x4000004000010000
    assert encode(0x400, 0x4000, 1024) == 0x4000004004000040
    assert encode(0x3FFF0, 0x3FFF0, 0x3FFF0) == 0x40003FFF3FFF3FFF  # 14 bits each, nothing spills over


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.name)
def test_sm_90a_code_holds_wgmma_and_assembles_without_spilling(dtype):
    library_or_skip()
    inputs = {"float16": "f16.f16", "bfloat16": "bf16.bf16"}[dtype.name]
    ok, log, ptx = compile_source(source(), cupy_options(options(dtype), "90a", ptx=True), "probe.cu")
    assert ok, log
    text = ptx.rstrip(b"\0").decode()
    for n in (64, 128):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{inputs}" in text
    for needed in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                   "wgmma.wait_group.sync.aligned 0", "fence.proxy.async.shared::cta"):
        assert needed in text
    ok, log, _ = compile_source(source(), (*cupy_options(options(dtype), "90a"), "--ptxas-options=-v"),
                                "probe.cu")
    assert ok, log
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
    assert len(spills) == len(KERNELS) and not any(spills), log


@pytest.mark.parametrize("arch", ["80", "90"])
def test_wgmma_code_for_another_arch_is_refused_by_name(arch):
    library_or_skip()
    ok, log, _ = compile_source(source(), cupy_options(options(DTYPES[0]), arch), "probe.cu")
    assert not ok and "wgmma runs on sm_90a only" in log


@pytest.fixture(scope="module")
def gpu_module():
    import cupy

    capability = cupy.cuda.Device().compute_capability  # "90", "100", ...
    if capability != "90":
        pytest.skip(f"wgmma is sm_90a's; this GPU is sm_{capability}")
    # Built by CuPy's NVRTC, as the backend builds (the device image has no NVRTC wheel).
    return cupy, {dtype: module(cupy, dtype) for dtype in DTYPES}


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA GPU: {NO_GPU}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.name)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rounds, blocks", [(1, 1), (3, 264)])
def test_wgmma_on_the_gpu_equals_numpy(gpu_module, kernel, dtype, rounds, blocks):
    cupy, modules = gpu_module
    n = KERNELS[kernel]
    a, b, want = operands(n, dtype, seed=n, rounds=rounds, blocks=blocks)
    function = modules[dtype].get_function(kernel)
    got = cupy.asnumpy(launch(cupy, function, n, dtype, a, b, rounds, blocks))
    assert np.array_equal(got, want), differences(got, want)


class _FakeCupy:
    """What wgmma_probe.disagreement uses of CuPy but launches (the test's): its builds' options,
    or a build NVRTC refuses."""

    def __init__(self, refuse: bool = False):
        self.refuse, self.built = refuse, []

    def RawModule(self, code, options):  # noqa: N802 - CuPy's name
        if self.refuse:
            raise RuntimeError("nvrtc: invalid option -arch=sm_90a")
        self.built.append(options)
        return self

    def get_function(self, kernel):
        return kernel

    @staticmethod
    def asnumpy(array):
        return array


@pytest.mark.parametrize("wrong", [None, ("wgmma_n128_mn_major", np.dtype(ml_dtypes.bfloat16))])
def test_the_backends_probe_says_which_kernel_disagrees(monkeypatch, wrong):
    """The CUDA backend's gate (CupyDevice.wgmma): None where every kernel gives numpy's D, in
    float16 and bfloat16 built for sm_90a; else the first that does not, named with its type;
    a build NVRTC refuses is a reason too, with nothing launched."""
    from pto_gpu.backends import wgmma_probe

    def launch(cupy, kernel, n, dtype, a, b):
        want = operands(n, dtype, seed=n)[2].astype(np.float32)
        if (kernel, dtype) == wrong:
            want[3, 5] += 1
        return want

    monkeypatch.setattr(wgmma_probe, "launch", launch)
    fake = _FakeCupy()
    why = wgmma_probe.disagreement(fake)
    assert all(wgmma_probe.SM_90A in options for options in fake.built) and len(fake.built) >= 1
    if wrong is None:
        assert why is None and len(fake.built) == 2
    else:
        assert why.startswith("wgmma_n128_mn_major, bfloat16: 1 of 8192 elements differ: (3, 5)")
    refused = wgmma_probe.disagreement(_FakeCupy(refuse=True))
    assert refused.startswith("the probe does not build for sm_90a: RuntimeError: nvrtc: invalid option")
