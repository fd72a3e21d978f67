"""The CUDA backend. Everywhere: backend="auto" falls back to the CPU with one log line and
backend="cuda" is refused by name when there is no GPU. With a GPU (marker `gpu`): every
kernel's CUDA implementation against its CPU one, every orchestration against the serial CPU
executor, and back-pressure with a tiny heap."""

import logging

import numpy as np
import pytest
from kernel_samples import KERNELS, SCALARS, arrays

import pto_gpu as pto
from orchestration.cli import to_backend
from orchestration.flash_attention import flash_attention
from orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs
from orchestration.matmul import tiled_matmul
from orchestration.softmax import fused_softmax
from pto_gpu.runtime import cuda_unavailable

NO_GPU = cuda_unavailable()


def needs_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA GPU: {NO_GPU}")(test))


def test_auto_falls_back_to_the_cpu_with_one_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="pto_gpu"):
        backend = pto.Runtime(backend="auto").backend
    if NO_GPU is None:
        assert backend.name == "cuda" and not caplog.records
    else:
        assert backend.name == "cpu"
        logged = [r.getMessage() for r in caplog.records]
        assert logged == [f"pto-gpu: no CUDA ({NO_GPU}); using the CPU backend"]


@pytest.mark.skipif(NO_GPU is None, reason="there is a GPU here")
def test_cuda_without_a_gpu_is_refused_by_name():
    with pytest.raises(pto.PTOError, match=f"backend='cuda' cannot be used: {NO_GPU}; use backend='cpu'"):
        pto.Runtime(backend="cuda")


@needs_gpu
def test_numpy_arrays_are_refused_with_the_way_to_move_them():
    with pytest.raises(pto.PTOError, match=r"numpy array on the CUDA backend; move it to the GPU"):
        pto.Runtime(backend="cuda").run(lambda o, a: o.external(a), np.zeros(4, np.float32))


@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_each_cuda_kernel_matches_its_cpu_kernel(kernel, dtype):
    rt = pto.Runtime(backend="cuda", executor="serial")
    expected = arrays(kernel, dtype)
    device = [rt.backend.to_device(a) for a in arrays(kernel, dtype)]  # strided copies, same values
    scalars = SCALARS.get(kernel.name, ())
    kernel.cpu(*expected, *scalars)
    rt.run(lambda o: o.submit(kernel, *(pto.inout(o.external(a)) for a in device), *scalars))
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for got, want in zip(device, expected):
        np.testing.assert_allclose(rt.backend.to_host(got), want, **tolerance)


def workloads():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((256, 192)).astype(np.float32)
    b = rng.standard_normal((192, 160)).astype(np.float32)
    x = rng.standard_normal((100, 33)).astype(np.float32)
    q, k, v = (rng.standard_normal((4, 200, 32)).astype(np.float32) for _ in range(3))
    llama = llama_layer_inputs(96, hidden=64, heads=4, ffn=96)
    return {
        "matmul": (tiled_matmul, [a, b, np.zeros((256, 160), np.float32)], {"tile": 64}, 2),
        "softmax": (fused_softmax, [x, np.zeros_like(x)], {"tile_rows": 16}, 1),
        "flash_attention": (flash_attention, [q, k, v, np.zeros_like(q)], {"tile": 64, "causal": True}, 3),
        "llama": (llama_layer, [llama], {}, "out"),
        "llama_compiled": (llama_layer_compiled, [llama], {"adaptive": True}, "out"),
    }


def copied(value):
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    return value.copy() if isinstance(value, np.ndarray) else value


@needs_gpu
@pytest.mark.parametrize("executor", ["serial", "parallel"])
@pytest.mark.parametrize("name", ["matmul", "softmax", "flash_attention", "llama", "llama_compiled"])
def test_orchestrations_on_cuda_match_the_serial_cpu_executor(name, executor):
    orchestration, args, options, output = workloads()[name]
    cpu_args = [copied(a) for a in args]  # the GPU run starts from the untouched originals
    cpu = pto.Runtime(backend="cpu", executor="serial").run(orchestration, *cpu_args, **options)
    rt = pto.Runtime(backend="cuda", executor=executor, workers={pto.CUBE: 2, pto.VECTOR: 2})
    gpu_args = [to_backend(rt.backend, a) for a in args]
    result = rt.run(orchestration, *gpu_args, **options)
    assert (result.num_tasks, result.num_edges) == (cpu.num_tasks, cpu.num_edges)
    got = gpu_args[0][output] if isinstance(output, str) else gpu_args[output]
    want = cpu_args[0][output] if isinstance(output, str) else cpu_args[output]
    # float32 on both; summation orders differ: 1e-5 of the output's scale (as the references).
    np.testing.assert_allclose(rt.backend.to_host(got), want, atol=1e-5 * np.abs(want).max())


@needs_gpu
def test_back_pressure_with_a_heap_of_two_tiles():
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda", heap_bytes=2 * 64 * 64 * 4, task_window=8,
                     workers={pto.CUBE: 2, pto.VECTOR: 2})
    c = rt.backend.to_device(np.zeros((256, 256), np.float32))
    result = rt.run(tiled_matmul, rt.backend.to_device(a), rt.backend.to_device(b), c, tile=64)
    assert result.high_water["heap_bytes"] == 2 * 64 * 64 * 4 and result.stalls
    expected = a.astype(np.float64) @ b
    np.testing.assert_allclose(rt.backend.to_host(c), expected, atol=1e-4 * np.abs(expected).max())
