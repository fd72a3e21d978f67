"""The CUDA backend, on a GPU (marker `gpu`, skipped without one) and on the CUDA emulator
(backend="cuda-emulated", everywhere: the same backend, launch records and issue path, with
the driver emulated and each launch running the kernel's own GPU code built for the host).
Everywhere: backend="auto" falls back to the CPU with one log line and backend="cuda" is
refused by name when there is no GPU. On both: every kernel's CUDA implementation against its
CPU one, every orchestration on every executor against the serial CPU executor, random graphs
of real kernels against it too (also on the CPU backend's streams), back-pressure with a tiny
heap, captured graphs replayed against the serial CPU executor, and device faults as the
TaskError of the task that faulted."""

import ctypes
import gc
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
import pytest
from kernel_samples import KERNELS, SCALARS, arrays
from pto_gpu.kernels.elementwise import add, scale
from pto_gpu.kernels.tiles import copy, zero
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import flash_attention, flash_attention_fused
from pto_gpu.orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_panels
from pto_gpu.orchestration.reference import attention
from pto_gpu.orchestration.softmax import fused_softmax
from pto_gpu.orchestration.workloads import to_backend

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj
from pto_gpu.backends import cuda as cuda_backend
from pto_gpu.backends import emulator
from pto_gpu.backends.cuda_abi import SHARED_LIMIT, SHARED_OPT_IN
from pto_gpu.backends.driver import CudaError
from pto_gpu.runtime import cuda_unavailable

NO_GPU = cuda_unavailable()


ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA GPU: {NO_GPU}")]


def needs_gpu(test):
    for mark in ON_GPU:
        test = mark(test)
    return test


# The CUDA backend on a GPU and on the emulator.
BACKENDS = [pytest.param("cuda", marks=ON_GPU), "cuda-emulated"]


def test_auto_falls_back_to_the_cpu_with_one_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="pto_gpu"):
        backend = pto.Runtime(backend="auto").backend
    if NO_GPU is None:
        assert backend.name == "cuda" and not caplog.records
    else:
        assert backend.name == "cpu"
        logged = [r.getMessage() for r in caplog.records]
        assert logged == [f"pto-gpu: no CUDA ({NO_GPU}); using the CPU backend"]


def test_the_environment_may_say_how_long_a_wait_for_the_gpu_may_take(monkeypatch):
    """PTO_GPU_TIMEOUT (seconds; make gpu-check sets 60) in place of GPU_TIMEOUT; anything but a
    positive number is refused by name."""
    monkeypatch.setenv("PTO_GPU_TIMEOUT", "45")
    assert pto.Runtime(backend="cuda-emulated").backend.gpu_timeout == 45
    for wrong in ("soon", "0", "nan"):
        monkeypatch.setenv("PTO_GPU_TIMEOUT", wrong)
        with pytest.raises(pto.PTOError, match=f"PTO_GPU_TIMEOUT='{wrong}': give the seconds"):
            pto.Runtime(backend="cuda-emulated")
    monkeypatch.delenv("PTO_GPU_TIMEOUT")
    assert pto.Runtime(backend="cuda-emulated").backend.gpu_timeout == cuda_backend.GPU_TIMEOUT


@pytest.mark.skipif(NO_GPU is None, reason="there is a GPU here")
def test_cuda_without_a_gpu_is_refused_by_name():
    with pytest.raises(pto.PTOError, match=f"backend='cuda' cannot be used: {NO_GPU}; use backend='cpu'"):
        pto.Runtime(backend="cuda")


def test_auto_never_picks_the_emulator_and_emulate_belongs_to_it():
    assert pto.Runtime(backend="auto").backend.name in ("cpu", "cuda")
    with pytest.raises(pto.PTOError, match=r"emulate='cpu-code' is an option of backend='cuda-emulated', "
                                           r"not of backend='cpu'"):
        pto.Runtime(backend="cpu", emulate="cpu-code")
    with pytest.raises(pto.PTOError, match=r"emulate='fast'; choose one of gpu-code, gpu-code-sm90a, "
                                           r"cpu-code"):
        pto.Runtime(backend="cuda-emulated", emulate="fast")
    with pytest.raises(pto.PTOError, match=r"a distributed run \(comm=\) cannot use backend='cuda-emulated'"):
        pto.Runtime(backend="cuda-emulated", comm=object())


@needs_gpu
def test_numpy_arrays_are_refused_with_the_way_to_move_them():
    with pytest.raises(pto.PTOError, match=r"host array \(ndarray\) on the CUDA backend; move it to the GPU"):
        pto.Runtime(backend="cuda").run(lambda o, a: o.external(a), np.zeros(4, np.float32))


# float16 and bfloat16: tests/test_kernels.py holds every kernel's CUDA code in both to numpy;
# their tiled matmuls and attention run through the runtime below.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_each_cuda_kernel_matches_its_cpu_kernel(kernel, dtype, backend):
    rt = pto.Runtime(backend=backend, executor="serial")
    expected = arrays(kernel, dtype)
    device = [rt.backend.to_device(a) for a in arrays(kernel, dtype)]  # strided copies, same values
    scalars = SCALARS.get(kernel.name, ())
    kernel.cpu(*expected, *scalars)
    rt.run(lambda o: o.submit(kernel, *(pto.inout(o.external(a)) for a in device), *scalars))
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for got, want in zip(device, expected):
        np.testing.assert_allclose(rt.backend.to_host(got), want, **tolerance)


# A 16-bit type's rounding, relative: float16 keeps 11 significant bits, bfloat16 8.
ROUNDING = {np.float16: 2.0**-11, ml_dtypes.bfloat16: 2.0**-8}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", list(ROUNDING), ids=lambda dtype: np.dtype(dtype).name)
def test_a_16_bit_tiled_matmul_on_tensor_cores_matches_the_serial_cpu_executor(dtype, backend):
    """Every tile product of a float16 or bfloat16 tiled matmul is an mma.sync kernel (on the
    emulator, the host build meets each warp's lanes at every one): the result is the serial
    CPU executor's (float sums of exact products on both, 16-bit accumulator tiles between the
    k steps) within a few roundings of the result's scale, and float64's within a few more."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((160, 96)).astype(dtype)
    b = rng.standard_normal((96, 112)).astype(dtype)
    want = np.zeros((160, 112), dtype)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, want, tile=64)
    rt = pto.Runtime(backend=backend, executor="stream", workers={pto.CUBE: 2, pto.VECTOR: 2})
    device = [rt.backend.to_device(x) for x in (a, b, np.zeros_like(want))]
    rt.run(tiled_matmul, *device, tile=64)
    got = rt.backend.to_host(device[2]).astype(np.float64)
    scale = np.abs(want.astype(np.float64)).max() * ROUNDING[dtype]
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=0, atol=4 * scale)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=0, atol=8 * scale)



@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tf32_kernel_through_the_runtime_is_the_cpu_product_within_tf32s_tolerance(backend):
    """A float32 product in a function that says tf32 runs on tensor cores in its CUDA code
    (on the emulator, the host build's mma.sync.m16n8k8): within 2^-10 of sum |a||b| of the
    serial CPU executor's exact product (docs/ISA.md, "TF32, on request"), and not equal to it."""
    module = isa.Module("tf32")
    f = isa.FunctionBuilder("product", module=module).in_core().tf32()
    f32 = pto.FLOAT32
    f.memref("a", f32, (48, 40)).memref("b", f32, (40, 24)).memref("c", f32, (48, 24))
    f.tile("ta", 48, 40, f32).tile("tb", 40, 24, f32).tile("tc", 48, 24, f32)
    f.load("ta", "a").load("tb", "b").matmul("tc", "ta", "tb").store("c", "tc").build()
    product = isa.compile(module).kernels["product"]
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((48, 40)).astype(np.float32), rng.standard_normal((40, 24)).astype(np.float32)

    def run(o, a, b, c):
        o.submit(product, pto.input(o.external(a)), pto.input(o.external(b)), pto.output(o.external(c)))

    want = np.zeros((48, 24), np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(run, a, b, want)
    rt = pto.Runtime(backend=backend)
    device = [rt.backend.to_device(x) for x in (a, b, np.zeros_like(want))]
    rt.run(run, *device)
    got = rt.backend.to_host(device[2]).astype(np.float64)
    bound = 2.0**-10 * (np.abs(a.astype(np.float64)) @ np.abs(b)) + 2.0**-20
    assert np.all(np.abs(got - want) <= bound) and not np.array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_that_asks_for_tf32_multiplies_the_familys_float32_tiles_as_tf32(backend):
    """Runtime(precision="tf32"): the tiled matmul's float32 tile products (the families'
    generated code on the emulator) within TF32's tolerance of the serial CPU executor's exact
    ones, and not equal to them; the same run without it is the exact product."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((96, 80)).astype(np.float32)
    b = rng.standard_normal((80, 64)).astype(np.float32)
    want = np.zeros((96, 64), np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, want, tile=32)
    bound = 2.0**-10 * (np.abs(a.astype(np.float64)) @ np.abs(b)) + 2.0**-18
    for precision in ("tf32", "exact"):
        rt = pto.Runtime(backend=backend, precision=precision)
        device = [rt.backend.to_device(x) for x in (a, b, np.zeros_like(want))]
        rt.run(tiled_matmul, *device, tile=32)
        got = rt.backend.to_host(device[2]).astype(np.float64)
        if precision == "tf32":
            assert np.all(np.abs(got - want) <= bound) and not np.allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

def workloads():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((256, 192)).astype(np.float32)
    b = rng.standard_normal((192, 160)).astype(np.float32)
    x = rng.standard_normal((100, 33)).astype(np.float32)
    q, k, v = (rng.standard_normal((4, 200, 32)).astype(np.float32) for _ in range(3))
    llama = llama_layer_inputs(96, hidden=64, heads=4, ffn=96)
    return {
        "matmul": (tiled_matmul, [a, b, np.zeros((256, 160), np.float32)], {"tile": 64}, 2),
        "matmul_panels": (tiled_matmul_panels, [a, b, np.zeros((256, 160), np.float32)], {"tile": 64}, 2),
        "softmax": (fused_softmax, [x, np.zeros_like(x)], {"tile_rows": 16}, 1),
        "flash_attention": (flash_attention, [q, k, v, np.zeros_like(q)], {"tile": 64, "causal": True}, 3),
        "flash_attention_fused": (flash_attention_fused, [q, k, v, np.zeros_like(q)],
                                  {"tile": 64, "causal": True}, 3),
        "llama": (llama_layer, [llama], {}, "out"),
        "llama_compiled": (llama_layer_compiled, [llama], {"adaptive": True}, "out"),
    }


def copied(value):
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    return value.copy() if isinstance(value, np.ndarray) else value


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("executor", ["serial", "parallel", "stream", "persistent"])
@pytest.mark.parametrize("name", ["matmul", "matmul_panels", "softmax", "flash_attention",
                                  "flash_attention_fused", "llama", "llama_compiled"])
def test_orchestrations_on_cuda_match_the_serial_cpu_executor(name, executor, backend):
    orchestration, args, options, output = workloads()[name]
    cpu_args = [copied(a) for a in args]  # the GPU run starts from the untouched originals
    cpu = pto.Runtime(backend="cpu", executor="serial").run(orchestration, *cpu_args, **options)
    rt = pto.Runtime(backend=backend, executor=executor, workers={pto.CUBE: 2, pto.VECTOR: 2})
    gpu_args = [to_backend(rt.backend, a) for a in args]
    result = rt.run(orchestration, *gpu_args, **options)
    assert (result.num_tasks, result.num_edges) == (cpu.num_tasks, cpu.num_edges)
    got = gpu_args[0][output] if isinstance(output, str) else gpu_args[output]
    want = cpu_args[0][output] if isinstance(output, str) else cpu_args[output]
    # float32 on both; summation orders differ: 1e-5 of the output's scale (as the references).
    np.testing.assert_allclose(rt.backend.to_host(got), want, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("executor", ["stream", "persistent"])
@pytest.mark.parametrize("orchestration, d", [
    (flash_attention, 32), (flash_attention_fused, 32), (flash_attention_fused, 64),
    (flash_attention_fused, 128)], ids=["tasks", "fused", "fused-d64", "fused-d128"])
def test_float16_flash_attention_on_tensor_cores_matches_the_serial_cpu_executor(orchestration, d, executor,
                                                                                  backend, monkeypatch):
    """llama.pto's flash attention over float16 arrays (its memrefs retyped): the scores and
    PV products are mma.sync kernels on CUDA. Both runs compute in float and round to float16
    (the CPU's interpretation at every instruction; the three-task form stores the scores,
    probabilities and running output between tasks), so they agree to a float16 ulp or two of
    the output's scale, and both are within a few of float64 attention. The fused kernel keeps
    its scores, their rows' max and sum and its output in registers in whole rows; at head dim
    64 its blocks of q, k and v, k and v in four buffers each, take more than 48 KiB of shared
    memory a block: its launches are opted in (the emulator, as a GPU, refuses them otherwise);
    at head dim 32 and the three-task form's kernels take less. At head dim 128 a block holds
    its q whole where the GPU gives it more than SHARED_OPT_IN (an A100, an H100: the emulated
    one is an H100's kind; not a 99 KiB GPU)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 100, d)).astype(np.float16) for _ in range(3))
    want = np.zeros_like(q)
    pto.Runtime(backend="cpu", executor="serial").run(orchestration, q, k, v, want, tile=64, causal=True)
    rt = pto.Runtime(backend=backend, executor=executor, workers={pto.CUBE: 2, pto.VECTOR: 2})
    allowed = []  # the shared memory each instance's launches were allowed to give a block
    allow_shared = rt.backend.allow_shared

    def noted(function: int, shared: int) -> None:
        allowed.append(shared)
        allow_shared(function, shared)

    monkeypatch.setattr(rt.backend, "allow_shared", noted)
    device = [rt.backend.to_device(x) for x in (q, k, v, np.zeros_like(q))]
    rt.run(orchestration, *device, tile=64, causal=True)
    assert (max(allowed) > SHARED_LIMIT) == (orchestration is flash_attention_fused and d >= 64)
    # q, k and v whole at 64 rows of 128 columns (rows padded to 136): on a GPU with the room
    roomy = rt.backend.block_shared // 2 >= 3 * 64 * 136 * 2
    assert (max(allowed) > SHARED_OPT_IN) == (orchestration is flash_attention_fused and d == 128 and roomy)
    got = rt.backend.to_host(device[3]).astype(np.float64)
    exact = attention(q, k, v, causal=True)
    scale = np.abs(exact).max()
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=0, atol=2e-3 * scale)
    np.testing.assert_allclose(got, exact, rtol=0, atol=4e-3 * scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float16_llama_layer_matches_the_serial_cpu_executor(backend):
    """llama.pto over float16 inputs (its memrefs retyped; every projection and attention
    product of 16-bit tiles on tensor cores on CUDA) against the serial CPU executor, and both
    within a few float16 roundings of the float64 layer on the same (rounded) inputs."""
    def inputs():
        return llama_layer_inputs(64, hidden=64, heads=4, ffn=96, dtype=np.float16)

    cpu = inputs()
    pto.Runtime(backend="cpu", executor="serial").run(llama_layer, cpu)
    exact = reference.llama_layer({k: v.astype(np.float64) if isinstance(v, np.ndarray) else v
                                   for k, v in inputs().items()})
    rt = pto.Runtime(backend=backend, executor="stream", workers={pto.CUBE: 2, pto.VECTOR: 2})
    device = to_backend(rt.backend, inputs())
    rt.run(llama_layer, device)
    got = rt.backend.to_host(device["out"]).astype(np.float64)
    scale = np.abs(exact).max() * ROUNDING[np.float16]
    np.testing.assert_allclose(got, cpu["out"].astype(np.float64), rtol=0, atol=8 * scale)
    np.testing.assert_allclose(got, exact, rtol=0, atol=16 * scale)


HOLD = r"""
extern "C" __global__ void hold(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < nanoseconds);
}"""


def hold_streams(rt: pto.Runtime, workers: dict, seconds: float) -> None:
    """Keep the stream executor's streams busy for `seconds`, so that nothing the run issues
    retires before the orchestrator has filled the heap: a GPU runs a 64-wide tile's tasks
    faster than Python submits them, and the heap would never fill."""
    streams = [rt.backend.stream((worker.name, i)) for worker, count in workers.items() for i in range(count)]
    if rt.backend.name == "cuda":
        import cupy

        hold = cupy.RawKernel(HOLD, "hold")
        for stream in streams:
            with cupy.cuda.ExternalStream(stream):
                hold((1,), (1,), (np.uint64(seconds * 1e9),))
        return
    sleep = HELD.setdefault("entry", emulator.ENTRY(lambda *_: time.sleep(HELD["seconds"]) or 0))
    HELD["seconds"] = seconds
    function = emulator.function(sleep, [])
    for stream in streams:
        emulator.check(emulator.driver().launch_kernel(function, 1, 1, 1, 1, 1, 1, 0, stream, None, None),
                       "cuLaunchKernel")


HELD: dict = {}  # the emulator's holding kernel, kept alive while streams may run it


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("executor", ["parallel", "stream"])
def test_back_pressure_with_a_heap_of_two_tiles(executor, backend):
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    workers = {pto.CUBE: 2, pto.VECTOR: 2}
    rt = pto.Runtime(backend=backend, executor=executor, heap_bytes=2 * 64 * 64 * 4, task_window=8,
                     workers=workers)
    c = rt.backend.to_device(np.zeros((256, 256), np.float32))
    if executor == "stream":  # kernels compiled first, so that compiling outlasts no hold
        rt.run(tiled_matmul, rt.backend.to_device(a), rt.backend.to_device(b), c, tile=64)
        hold_streams(rt, workers, 0.2 if backend == "cuda" else 1.0)  # the emulator's host may be loaded
    result = rt.run(tiled_matmul, rt.backend.to_device(a), rt.backend.to_device(b), c, tile=64)
    assert result.high_water["heap_bytes"] == 2 * 64 * 64 * 4 and result.stalls
    expected = a.astype(np.float64) @ b
    np.testing.assert_allclose(rt.backend.to_host(c), expected, atol=1e-4 * np.abs(expected).max())


@needs_gpu
def test_a_copy_in_and_a_received_regions_unpacking_have_landed_when_they_return():
    """Both write on the legacy default stream, which the backend's streams (non-blocking) do
    not wait for: the persistent scheduler's copy_in (cudaMemcpy from pageable memory may
    return once the data is staged, before its DMA lands) and a transfer's unpack (a CuPy
    kernel on this thread's stream) wait for it before they return, and the data is there."""
    import cupy

    from pto_gpu.distributed.transport import unpack

    data = np.random.default_rng(0).integers(0, 256, 64 << 20, np.uint8)
    target = cupy.zeros(data.size, cupy.uint8)
    pto.Runtime(backend="cuda").backend.device.copy_in(target.data.ptr, data)
    assert cupy.cuda.Stream.null.done
    np.testing.assert_array_equal(target.get(), data)
    region = cupy.zeros((4096, 4096), cupy.float32)[:, ::2]
    unpack(data[:4096 * 2048 * 4], region, None)
    assert cupy.cuda.get_current_stream().done
    np.testing.assert_array_equal(region.get().reshape(-1).view(np.uint8), data[:4096 * 2048 * 4])


@needs_gpu
def test_an_array_on_another_gpu_is_refused_by_name():
    """A runtime's kernels run on its heap's GPU: an array on another one is refused, not read
    across devices (a distributed run's ranks each take a GPU of their node)."""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU here")
    rt = pto.Runtime(backend="cuda")
    with cupy.cuda.Device(1):
        elsewhere = cupy.ones((4, 16), cupy.float32)
    with pytest.raises(pto.PTOError, match="an array on GPU 1 given to a runtime on GPU 0"):
        rt.run(lambda o: o.submit(scale, pto.input(o.external(elsewhere)), pto.output(o.external(elsewhere)),
                                  2.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_chooses_the_stream_executor_on_a_gpu(backend):
    assert pto.Runtime(backend=backend).executor == "stream"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["matmul", "softmax", "flash_attention", "flash_attention_fused",
                                  "llama_compiled"])
def test_a_replayed_capture_matches_the_serial_cpu_executor(name, backend):
    orchestration, args, options, output = workloads()[name]
    cpu_args = [copied(a) for a in args]
    pto.Runtime(backend="cpu", executor="serial").run(orchestration, *cpu_args, **options)
    rt = pto.Runtime(backend=backend, task_window=4096, workers={pto.CUBE: 2, pto.VECTOR: 2})
    gpu_args = [to_backend(rt.backend, a) for a in args]
    replay = rt.capture(orchestration, *gpu_args, **options)
    replay.replay()
    got = gpu_args[0][output] if isinstance(output, str) else gpu_args[output]
    want = cpu_args[0][output] if isinstance(output, str) else cpu_args[output]
    np.testing.assert_allclose(rt.backend.to_host(got), want, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replay_reads_inputs_changed_in_place(backend):
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal((192, 192)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend=backend)
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
    pytest.param("cuda", "persistent", marks=ON_GPU),
    ("cuda-emulated", "stream"),
    ("cuda-emulated", "parallel"),
    ("cuda-emulated", "persistent"),
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


# --- interop, memory held by captures, device faults, per-launch cost --------------------
class DLPackOnly:
    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def copy_then_read(o, whole, part, out):
    """Task 0 writes whole[:, 2:6]; task 1 reads `part`, which overlaps it."""
    W, P = o.external(whole), o.external(part)
    assert W.buffer is P.buffer
    o.submit(scale, pto.input(W[:, 8:12]), pto.output(W[:, 2:6]), 2.0)
    o.submit(copy, pto.input(P), pto.output(o.external(out)))


@needs_gpu
@pytest.mark.parametrize("wrap", [lambda a: a, DLPackOnly], ids=["cuda_array_interface", "dlpack"])
def test_cupy_views_share_an_owner_and_their_dependency_is_found(wrap):
    import cupy

    rt = pto.Runtime(backend="cuda", executor="stream")
    whole = cupy.arange(16, dtype=cupy.float32).reshape(1, 16)
    out = cupy.zeros((1, 4), cupy.float32)
    result = rt.run(copy_then_read, wrap(whole), wrap(whole[:, 4:8]), out, record=True)
    assert (0, 1) in result.graph.edges
    np.testing.assert_array_equal(out.get(), [[20, 22, 6, 7]])


@needs_gpu
@pytest.mark.parametrize("wrap", [lambda a: a, DLPackOnly], ids=["cuda_array_interface", "dlpack"])
def test_torch_cuda_views_share_their_storage_and_their_dependency_is_found(wrap):
    torch = pytest.importorskip("torch")
    rt = pto.Runtime(backend="cuda", executor="stream")
    base = torch.arange(16, dtype=torch.float32, device="cuda").reshape(1, 16)
    out = torch.zeros((1, 4), device="cuda")
    result = rt.run(copy_then_read, wrap(base), wrap(base[:, 4:8]), out, record=True)
    assert (0, 1) in result.graph.edges
    np.testing.assert_array_equal(out.cpu().numpy(), [[20, 22, 6, 7]])


@needs_gpu
def test_torch_views_that_overlap_partly_share_their_storage():
    torch = pytest.importorskip("torch")
    base = torch.zeros(16, device="cuda")
    owners = []
    # Neither view holds the other: only the storage makes them one owner.
    views = (base[2:8], base[4:12])
    pto.Runtime(backend="cuda").run(lambda o: owners.extend(o.external(t).buffer for t in views))
    assert owners[0] is owners[1] and owners[0].nbytes == 16 * 4


@needs_gpu
def test_a_host_dlpack_array_on_cuda_is_refused_with_what_to_do():
    with pytest.raises(pto.PTOError, match=r"host array \(DLPackOnly\) on the CUDA backend; move it"):
        pto.Runtime(backend="cuda").run(lambda o: o.external(DLPackOnly(np.zeros(4))))


@needs_gpu
def test_a_replay_keeps_arrays_made_inside_the_orchestration_allocated():
    import cupy

    pointers = []

    def orch(o, a):
        out = cupy.zeros_like(a)  # back to CuPy's pool once nothing holds it
        pointers.append(out.data.ptr)
        o.submit(copy, pto.input(o.external(a)), pto.output(o.external(out)))

    a = cupy.arange(64, dtype=cupy.float32).reshape(8, 8)
    replay = pto.Runtime(backend="cuda").capture(orch, a)
    gc.collect()
    taken = [cupy.empty_like(a) for _ in range(8)]  # a freed block of this size would be reused
    assert pointers[0] not in [t.data.ptr for t in taken]
    replay.replay()
    kept = cupy.ndarray(a.shape, a.dtype, cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(pointers[0], a.nbytes, None), 0))
    np.testing.assert_array_equal(kept.get(), a.get())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_launch_is_prepared_once_per_instance_and_geometry(backend, monkeypatch):
    rt = pto.Runtime(backend=backend, executor="serial")
    made = []
    function = rt.backend.device.function
    monkeypatch.setattr(rt.backend.device, "function", lambda code, kernel, *rest: made.append(
        kernel.name) or function(code, kernel, *rest))

    def orch(o, x, y):
        X, Y = o.external(x), o.external(y)
        for _ in range(3):
            o.submit(scale, pto.input(X[:8]), pto.output(Y[:8]), 2.0)
            o.submit(scale, pto.input(X[8:]), pto.output(Y[8:]), 2.0)  # the same geometry
        o.submit(scale, pto.input(X[:, :4]), pto.output(Y[:, :4]), 3.0)  # another one
        o.submit(add, pto.input(X), pto.input(Y), pto.output(Y))

    x = np.arange(256, dtype=np.float32).reshape(16, 16)
    y = rt.backend.to_device(np.zeros_like(x))
    rt.run(orch, rt.backend.to_device(x), y)
    assert made == ["scale", "scale", "add"]
    want = 2 * x
    want[:, :4] = 3 * x[:, :4]
    np.testing.assert_array_equal(rt.backend.to_host(y), x + want)


@numba.njit(cache=True)
def _three_instances(o, x, y, z, add_id, scale_id):
    pj.submit(o, add_id, (pj.input(x), pj.input(x), pj.output(y)))
    pj.submit(o, scale_id, (pj.input(y), pj.output(z)), (2.0,))
    pj.submit(o, add_id, (pj.input(pj.narrow(z, 0, 0, 4)), pj.input(pj.narrow(z, 0, 0, 4)),
                          pj.output(pj.narrow(x, 0, 0, 4))))


def _three_instances_from_python(o, x, y, z):
    X, Y, Z = o.external(x), o.external(y), o.external(z)
    o.submit(add, pto.input(X), pto.input(X), pto.output(Y))
    o.submit(scale, pto.input(Y), pto.output(Z), 2.0)
    o.submit(add, pto.input(Z[:4]), pto.input(Z[:4]), pto.output(X[:4]))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: the compile pool has one thread, builds go "
                    "one at a time")
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_runs_new_instances_compile_side_by_side(monkeypatch, compiled):
    """The stream executor on a CUDA driver has the backend compile a run's new instances side
    by side: a compiled orchestration's flushed log's all together before its first launch
    (CudaBackend.prefetch); a Python submit's as it comes, the submit waiting for its compile
    behind the submits to come (DriverStreamExecutor._wait_behind), so that the orchestration
    goes on to the next. The first two host builds meet at a barrier, which builds made one at
    a time as each task is issued never would (it would break after 60 s). The tasks still go
    in order: results are numpy's."""
    from pto_gpu.backends import emulated_device

    meeting = threading.Barrier(2, timeout=60)
    calls = []
    build = emulated_device.host_build

    def met(source, dtype, wgmma):
        calls.append(source.name)
        if len(calls) <= 2:
            meeting.wait()
        return build(source, dtype, wgmma)

    monkeypatch.setattr(emulated_device, "host_build", met)
    x = np.arange(128, dtype=np.float32).reshape(8, 16)
    y, z = np.zeros_like(x), np.zeros_like(x)
    rt = pto.Runtime(backend="cuda-emulated", executor="stream")
    if compiled:
        rt.run(lambda o: o.compiled(_three_instances, o.external(x), o.external(y), o.external(z), add.id,
                                    scale.id))
    else:
        rt.run(_three_instances_from_python, x, y, z)
    assert len(calls) == 3  # add at 8 x 16 and at 4 x 16, scale
    want_y = 2 * np.arange(128, dtype=np.float32).reshape(8, 16)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(z, 2 * want_y)
    np.testing.assert_array_equal(x[:4], 4 * want_y[:4])


def test_python_submits_behind_a_compile_that_fill_the_task_window_wait_for_it(monkeypatch):
    """Submits waiting behind a compile hold their task-window slots: a full window issues
    them (waiting for the compile) and then waits for room, as it would for issued tasks,
    instead of finding nothing in flight and calling it a deadlock."""
    from pto_gpu.backends import emulated_device

    build = emulated_device.host_build
    monkeypatch.setattr(emulated_device, "host_build", lambda *args: time.sleep(0.2) or build(*args))
    x = np.arange(64, dtype=np.float32).reshape(4, 16)

    def orchestration(o):
        X = o.external(x)
        for _ in range(20):
            o.submit(scale, pto.input(X), pto.output(X), 2.0)

    rt = pto.Runtime(backend="cuda-emulated", executor="stream", task_window=4)
    assert rt.run(orchestration).stalls
    np.testing.assert_array_equal(x, 2.0**20 * np.arange(64, dtype=np.float32).reshape(4, 16))


def test_python_submits_behind_a_compile_run_before_the_orchestrations_error_is_raised(monkeypatch):
    """Submits waiting behind a new instance's compile when the orchestration raises (all
    three: each build takes 0.2 s) are issued and run before the run raises its error, as
    every executor runs what was submitted (docs/ERRORS.md)."""
    from pto_gpu.backends import emulated_device

    build = emulated_device.host_build
    monkeypatch.setattr(emulated_device, "host_build", lambda *args: time.sleep(0.2) or build(*args))
    x = np.arange(128, dtype=np.float32).reshape(8, 16)
    y, z = np.zeros_like(x), np.zeros_like(x)
    waiting = []

    def orchestration(o):
        _three_instances_from_python(o, x, y, z)
        waiting.append(len(o._executor._behind))
        raise ValueError("the orchestration's own")

    with pytest.raises(ValueError, match="the orchestration's own"):
        pto.Runtime(backend="cuda-emulated", executor="stream").run(orchestration)
    assert waiting == [3]
    want_y = 2 * np.arange(128, dtype=np.float32).reshape(8, 16)
    np.testing.assert_array_equal(z, 2 * want_y)
    np.testing.assert_array_equal(x[:4], 4 * want_y[:4])


def test_a_run_whose_compiles_find_no_thread_compiles_them_as_it_issues(monkeypatch):
    """Where the pool cannot take a compile (a thread limit; the interpreter exiting), prefetch
    makes that instance on the caller's thread and leaves the rest to their launches: the run
    is right, and nothing is left waiting for a compile that will not come."""
    from pto_gpu.backends import cuda

    def no_thread(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(cuda.ThreadPoolExecutor, "submit", no_thread)
    x = np.arange(128, dtype=np.float32).reshape(8, 16)
    y, z = np.zeros_like(x), np.zeros_like(x)
    rt = pto.Runtime(backend="cuda-emulated", executor="stream")
    rt.run(lambda o: o.compiled(_three_instances, o.external(x), o.external(y), o.external(z), add.id,
                                scale.id))
    want_y = 2 * np.arange(128, dtype=np.float32).reshape(8, 16)
    np.testing.assert_array_equal(z, 2 * want_y)
    assert rt.backend._making == {}


BROKEN_CU = "this is not CUDA\n"


def _broken_kernel(folder) -> pto.Kernel:
    """A kernel whose CUDA source (in `folder`) g++ refuses."""
    source = folder / "broken.cu"
    source.write_text(BROKEN_CU)

    @pto.kernel(worker=pto.VECTOR, cuda=pto.CudaCode(source, lambda shapes: 1))
    def broken(out):
        pass

    return broken


@numba.njit(cache=True)
def _broken_second(o, x, y, add_id, broken_id):
    pj.submit(o, add_id, (pj.input(x), pj.input(x), pj.output(y)))
    pj.submit(o, broken_id, (pj.output(x),))


def test_an_instance_that_fails_to_compile_ahead_fails_the_task_that_needs_it(tmp_path):
    """Compiled ahead with the first task's instance (prefetch), a source g++ refuses is the
    TaskError of its own task, the second, once the first has run."""
    broken = _broken_kernel(tmp_path)
    x = np.ones((4, 16), np.float32)
    y = np.zeros_like(x)
    with pytest.raises(pto.TaskError, match=r"task 1 \(broken\) failed: .*g\+\+ could not build"):
        pto.Runtime(backend="cuda-emulated", executor="stream").run(
            lambda o: o.compiled(_broken_second, o.external(x), o.external(y), add.id, broken.id))
    np.testing.assert_array_equal(y, 2)


def test_a_python_submits_instance_that_fails_to_compile_behind_fails_its_task_and_none_after(tmp_path):
    """From Python, a new instance that g++ refuses, compiled while the submits after it wait
    (DriverStreamExecutor._wait_behind), is the TaskError of its own task, the second, once the first
    has run; the third, behind it, is not issued."""
    broken = _broken_kernel(tmp_path)
    x = np.ones((4, 16), np.float32)
    y, z = np.zeros_like(x), np.zeros_like(x)

    def orchestration(o):
        X, Y, Z = o.external(x), o.external(y), o.external(z)
        o.submit(add, pto.input(X), pto.input(X), pto.output(Y))
        o.submit(broken, pto.output(X))
        o.submit(add, pto.input(Y), pto.input(Y), pto.output(Z))

    with pytest.raises(pto.TaskError, match=r"task 1 \(broken\) failed: .*g\+\+ could not build"):
        pto.Runtime(backend="cuda-emulated", executor="stream").run(orchestration)
    np.testing.assert_array_equal(y, 2)
    np.testing.assert_array_equal(z, 0)


FAULTING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import cupy
    import pto_gpu as pto

    source = Path(sys.argv[1])
    cuda = pto.CudaCode(source, lambda shapes: 1)

    @pto.kernel(worker=pto.VECTOR, cuda=cuda)
    def trap(out):
        pass

    @pto.kernel(worker=pto.VECTOR, cuda=cuda)
    def fine(out):
        pass

    def orch(o, x):
        X = o.external(x)
        o.submit(trap, pto.output(X[0]))
        time.sleep(1)  # the fault has happened: every later CUDA call fails with it
        o.submit(fine, pto.output(X[1]))

    try:
        pto.Runtime(backend="cuda", executor="stream", workers={pto.VECTOR: 2}).run(
            orch, cupy.zeros((2, 4), cupy.float32))
    except pto.TaskError as error:
        print("TaskError:", error)
""")
KERNELS_CU = """
#define WORDS long long, long long, long long, long long, long long, long long
extern "C" __global__ void pto_trap(float* out, WORDS) { __trap(); }
extern "C" __global__ void pto_fine(float* out, WORDS) { out[0] = 1; }
"""


@needs_gpu
def test_a_device_fault_is_the_task_error_of_the_task_that_faulted(tmp_path):
    """In a subprocess: a device fault kills the process's CUDA context."""
    source = tmp_path / "faulting.cu"
    source.write_text(KERNELS_CU)
    run = subprocess.run([sys.executable, "-c", FAULTING, str(source)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent.parent)
    assert "TaskError: task 0 (trap) failed" in run.stdout, run.stdout + run.stderr


# --- the emulator: faults and the launch's words -------------------------------------------
@pytest.fixture
def fresh_emulator():
    """A fresh context after the test: its faults disarmed, a sticky error cleared."""
    yield
    emulator.reset()


def chain(o, x, n):
    """n tasks, each scaling x by 2 in place: a chain of dependencies."""
    X = o.external(x)
    for _ in range(n):
        o.submit(scale, pto.input(X), pto.output(X), 2.0)


def warmed(executor: str) -> tuple[pto.Runtime, np.ndarray]:
    """A runtime on the emulator and an array of ones that one chain task has doubled: the
    instance is built before a test arms a fault, so the fault counts only the test's launches."""
    rt = pto.Runtime(backend="cuda-emulated", executor=executor, workers={pto.VECTOR: 2})
    x = rt.backend.to_device(np.ones((4, 8), np.float32))
    rt.run(chain, x, 1)
    return rt, x


@pytest.mark.parametrize("executor", ["serial", "parallel", "stream"])
def test_a_kernel_fault_is_a_task_error_and_a_fresh_context_runs_again(fresh_emulator, executor):
    rt, x = warmed(executor)
    emulator.fault_kernel(3)
    fault = r"\(scale\) failed: CudaError: .*CUDA_ERROR_ILLEGAL_ADDRESS"
    with pytest.raises(pto.TaskError, match=fault) as raised:
        rt.run(chain, x, 5)
    if executor == "serial":  # each task waited for: the one that faulted is named
        assert raised.value.task_id == 2
    emulator.reset()
    y = rt.backend.to_device(np.ones((4, 8), np.float32))
    rt.run(chain, y, 3)
    np.testing.assert_array_equal(rt.backend.to_host(y), 8)


@pytest.mark.parametrize("later", ["loads_new_code", "launches"])
def test_a_fault_is_the_task_error_of_the_faulted_task_not_of_the_later_call_it_fails(fresh_emulator, later):
    """As on a GPU (the `gpu` test above), a later task's module load or launch answers the
    fault's sticky error: the TaskError is the faulted task's, not the later task's."""
    rt, x = warmed("stream")
    driver = emulator.driver()
    never_recorded = driver.new_event()  # reached, until a fault's sticky error is set

    def faulted() -> bool:
        try:
            return not driver.reached(never_recorded)
        except CudaError:
            return True

    def fault_then_new_code(o, x):
        X = o.external(x)
        o.submit(scale, pto.input(X), pto.output(X), 2.0)
        deadline = time.monotonic() + 30
        while not faulted() and time.monotonic() < deadline:
            time.sleep(0.001)
        if later == "launches":
            o.submit(scale, pto.input(X), pto.output(X), 2.0)
        else:
            o.submit(add, pto.input(X), pto.input(X), pto.output(X))  # add's code is not loaded yet

    emulator.fault_kernel(1)
    with pytest.raises(pto.TaskError, match=r"task 0 \(scale\) failed: CudaError: .*ILLEGAL_ADDRESS"):
        rt.run(fault_then_new_code, x)


def test_a_launch_short_of_its_tiles_shared_memory_faults(fresh_emulator, monkeypatch):
    """A launch record whose dynamic shared memory is less than the kernel's tiles take faults
    the kernel (on a GPU its first access past the end would), rather than running it over
    memory it was not given: 16 bytes short, the fused attention's first task is a TaskError."""
    made = cuda_backend.template

    def short(function, grid, block, layout, integer_scalars, shared=0):
        return made(function, grid, block, layout, integer_scalars, max(0, shared - 16))

    monkeypatch.setattr(cuda_backend, "template", short)
    rt = pto.Runtime(backend="cuda-emulated", executor="serial")
    q, out = (rt.backend.to_device(np.full((1, 64, 32), value, np.float16)) for value in (1, 0))
    with pytest.raises(pto.TaskError, match=r"task 0 \(flash_attention_tile\) failed: .*ILLEGAL_ADDRESS"):
        rt.run(flash_attention_fused, q, q, q, out, tile=64)


@pytest.mark.parametrize("executor", ["serial", "stream"])
def test_a_refused_launch_is_the_task_error_of_its_task(fresh_emulator, executor):
    rt, x = warmed(executor)
    emulator.fail_launch(2)
    with pytest.raises(pto.TaskError, match=r"task 1 \(scale\) failed: CudaError: cuLaunchKernel failed: "
                                            r"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES \(701\)"):
        rt.run(chain, x, 4)
    # Not sticky: the tasks before it ran, those after it did not, and the runtime goes on.
    np.testing.assert_array_equal(rt.backend.to_host(x), 4)
    rt.run(chain, x, 1)
    np.testing.assert_array_equal(rt.backend.to_host(x), 8)


@pytest.mark.parametrize("executor", ["serial", "stream"])
def test_an_event_never_reached_is_a_deadlock_error_not_a_hang(fresh_emulator, executor):
    rt, x = warmed(executor)
    rt.backend.gpu_timeout = 0.3
    emulator.lose_event(1)
    started = time.perf_counter()
    with pytest.raises(pto.PTOError, match=r"a CUDA event was not reached within 0.3 s"):
        rt.run(chain, x, 2)
    assert time.perf_counter() - started < 30


def _declared_words(source: str, name: str) -> list[str]:
    """The C types of `pto_<name>`'s parameters, as its generated source declares them."""
    declaration = source[source.index(f" pto_{name}(") + len(name) + 6:]
    params = declaration[:declaration.index(")")].split(",")
    return [re.sub(r"\s*\*", "*", re.sub(r"\w+$", "", p.strip()).strip()) for p in params]


def _expected_word(ctype: str, value) -> int:
    if ctype.endswith("*"):
        return value.ctypes.data if isinstance(value, np.ndarray) else value
    if ctype == "double":
        return int(np.array(float(value)).view(np.int64))
    return int(value)


AXPY_CU = """
extern "C" __global__ void pto_axpy(double alpha,
    const float *x, long long x0, long long x1, long long x2, long long xs0, long long xs1, long long xs2,
    long long n, float *y, long long y0, long long y1, long long y2, long long ys0, long long ys1,
    long long ys2) {}
"""


def axpy_kernel(folder: Path) -> pto.Kernel:
    """A hand-written CUDA kernel whose scalars come before and between its tensors."""
    source = folder / "axpy.cu"
    source.write_text(AXPY_CU)
    return pto.kernel(worker=pto.VECTOR, name="axpy", cuda=pto.CudaCode(source, lambda shapes: 1))(
        lambda alpha, x, n, y: None)


@pytest.mark.parametrize("name", ["scale", "add", "copy", "axpy"])
def test_the_words_a_launch_passes_are_those_its_kernel_declares(name, monkeypatch, tmp_path):
    """Checked against the CUDA source's own parameter list and numpy's view of each array, not
    against cuda_abi: in param order, a tensor's pointer to element [0, 0], three sizes padded
    with leading 1s and three element strides padded with 0s, a scalar as its declared type,
    every one an 8-byte word."""
    kernel = {"scale": scale, "add": add, "copy": copy}.get(name) or axpy_kernel(tmp_path)
    rt = pto.Runtime(backend="cuda-emulated", executor="serial")
    received = []
    arity = {}

    def record(grid, block, shared, params, context):
        words = ctypes.POINTER(ctypes.c_int64)
        received.append([ctypes.cast(params[i], words)[0] for i in range(arity["n"])])
        return 0

    entry = emulator.ENTRY(record)

    def function(code, kernel, layout, scalars):
        arity["declared"] = _declared_words(code.source.read_text(), kernel.name)
        arity["n"] = len(arity["declared"])
        return emulator.function(entry, [8] * arity["n"])

    monkeypatch.setattr(rt.backend.device, "function", function)
    whole = np.zeros((6, 20), np.float32)
    x, y, z = whole[1:4, 2:7], whole[::2, 10:15], whole[3:6, 15:20]
    params = {"scale": [x, y, 2.5], "add": [x, y, z], "copy": [x, y], "axpy": [-1.5, x, 7, y]}[name]
    rt.run(lambda o: o.submit(kernel, *(pto.inout(o.external(p)) if isinstance(p, np.ndarray) else p
                                        for p in params)))
    values = []
    for p in params:
        tensor = isinstance(p, np.ndarray)
        values += [p, 1, *p.shape, 0, *(s // p.itemsize for s in p.strides)] if tensor else [p]
    assert len(arity["declared"]) == len(values)
    assert received == [[_expected_word(t, v) for t, v in zip(arity["declared"], values)]]
