"""The CUDA backend. Everywhere: backend="auto" falls back to the CPU with one log line and
backend="cuda" is refused by name when there is no GPU. With a GPU (marker `gpu`): every
kernel's CUDA implementation against its CPU one, every orchestration on every executor
against the serial CPU executor, random graphs of real kernels against it too (also on the
CPU backend's streams, so the generator is checked everywhere), back-pressure with a tiny
heap, and captured graphs replayed against the serial CPU executor."""

import logging

import numpy as np
import pytest
from kernel_samples import KERNELS, SCALARS, arrays
from pto_gpu.kernels.elementwise import add, scale
from pto_gpu.kernels.tiles import copy, zero
from pto_gpu.orchestration.flash_attention import flash_attention
from pto_gpu.orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul
from pto_gpu.orchestration.softmax import fused_softmax
from pto_gpu.orchestration.workloads import to_backend

import pto_gpu as pto
from pto_gpu.runtime import cuda_unavailable

NO_GPU = cuda_unavailable()


ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA GPU: {NO_GPU}")]


def needs_gpu(test):
    for mark in ON_GPU:
        test = mark(test)
    return test


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
@pytest.mark.parametrize("executor", ["serial", "parallel", "stream"])
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
@pytest.mark.parametrize("executor", ["parallel", "stream"])
def test_back_pressure_with_a_heap_of_two_tiles(executor):
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda", executor=executor, heap_bytes=2 * 64 * 64 * 4, task_window=8,
                     workers={pto.CUBE: 2, pto.VECTOR: 2})
    c = rt.backend.to_device(np.zeros((256, 256), np.float32))
    result = rt.run(tiled_matmul, rt.backend.to_device(a), rt.backend.to_device(b), c, tile=64)
    assert result.high_water["heap_bytes"] == 2 * 64 * 64 * 4 and result.stalls
    expected = a.astype(np.float64) @ b
    np.testing.assert_allclose(rt.backend.to_host(c), expected, atol=1e-4 * np.abs(expected).max())


@needs_gpu
def test_auto_chooses_the_stream_executor_on_a_gpu():
    assert pto.Runtime().executor == "stream"


@needs_gpu
@pytest.mark.parametrize("name", ["matmul", "softmax", "flash_attention", "llama_compiled"])
def test_a_replayed_capture_matches_the_serial_cpu_executor(name):
    orchestration, args, options, output = workloads()[name]
    cpu_args = [copied(a) for a in args]
    pto.Runtime(backend="cpu", executor="serial").run(orchestration, *cpu_args, **options)
    rt = pto.Runtime(backend="cuda", task_window=4096, workers={pto.CUBE: 2, pto.VECTOR: 2})
    gpu_args = [to_backend(rt.backend, a) for a in args]
    replay = rt.capture(orchestration, *gpu_args, **options)
    replay.replay()
    got = gpu_args[0][output] if isinstance(output, str) else gpu_args[output]
    want = cpu_args[0][output] if isinstance(output, str) else cpu_args[output]
    np.testing.assert_allclose(rt.backend.to_host(got), want, atol=1e-5 * np.abs(want).max())


@needs_gpu
def test_a_replay_reads_inputs_changed_in_place():
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal((192, 192)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda")
    da, db = rt.backend.to_device(a), rt.backend.to_device(b)
    dc = rt.backend.to_device(np.zeros((192, 192), np.float32))
    replay = rt.capture(tiled_matmul, da, db, dc, tile=64)  # CUBE tiles on the .cu matmul
    assert not rt.backend.to_host(dc).any()  # capturing runs nothing
    for factor in (1.0, -2.0):
        da[...] = rt.backend.to_device(a * factor)
        replay.replay()
        expected = (a * factor).astype(np.float64) @ b
        np.testing.assert_allclose(rt.backend.to_host(dc), expected, atol=1e-4 * np.abs(expected).max())


def random_kernel_program(o, buffers, seed: int, n_ops: int) -> None:
    """add / scale / copy tasks on random equal-shaped windows of three 16x16 float32 arrays
    and of 8x8 heap tiles allocated and freed on the way; a task's output never overlaps its
    inputs (element-wise kernels are not defined on partly aliased operands). Scaling is by
    0.5 or -1 and adding float32s is exact in float64, so CPU and GPU agree to the bit."""
    rng = np.random.default_rng(seed)
    sources = [o.external(b) for b in buffers]
    for _ in range(n_ops):
        rows, cols = (int(n) for n in rng.integers(1, 9, 2))
        if rng.random() < 0.15:
            tile = o.alloc((8, 8), pto.FLOAT32)
            o.submit(zero, pto.output(tile))
            sources.append(tile)
            continue
        if rng.random() < 0.1 and len(sources) > 3:
            o.free(sources.pop(int(rng.integers(3, len(sources)))))
            continue
        kernel = (add, scale, copy)[int(rng.integers(3))]
        picked = rng.choice(len(sources), size=3 if kernel is add else 2, replace=False)
        views = []
        for index in picked:
            whole = sources[int(index)]
            r = int(rng.integers(0, whole.shape[0] - rows + 1))
            c = int(rng.integers(0, whole.shape[1] - cols + 1))
            views.append(whole[r:r + rows, c:c + cols])
        params = [pto.input(v) for v in views[:-1]] + [pto.output(views[-1])]
        o.submit(kernel, *params, *((float(rng.choice([0.5, -1.0])),) if kernel is scale else ()))


def random_buffers(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("backend, executor", [
    ("cpu", "stream"),
    pytest.param("cuda", "stream", marks=ON_GPU),
    pytest.param("cuda", "parallel", marks=ON_GPU),
])
@pytest.mark.parametrize("seed", range(20))
def test_random_kernel_graphs_match_the_serial_cpu_executor(backend, executor, seed):
    expected = random_buffers(seed)
    pto.Runtime(backend="cpu", executor="serial").run(random_kernel_program, expected, seed, 60)
    for streams in (1, 3):
        workers = dict.fromkeys((pto.CUBE, pto.VECTOR, pto.ACCELERATOR), streams)
        rt = pto.Runtime(backend=backend, executor=executor, workers=workers)
        got = [to_backend(rt.backend, b) for b in random_buffers(seed)]
        rt.run(random_kernel_program, got, seed, 60)
        for want, array in zip(expected, got):
            assert rt.backend.to_host(array).tobytes() == want.tobytes(), f"seed={seed} streams={streams}"
