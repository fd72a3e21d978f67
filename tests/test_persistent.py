"""executor="persistent": one kernel runs a run's tasks (executors/persistent.py), on the CUDA
emulator (its blocks' host build: pto_persistent.cuh) and, marked gpu, on a GPU. The
orchestrations and random graphs against the serial CPU executor are in test_cuda.py (its
executor lists name "persistent"); here: rings smaller than the graph, one kernel a run once
its instances are known, the errors, and the module's GPU build."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import numpy as np
import pytest
from pto_gpu.kernels.elementwise import add
from pto_gpu.kernels.tiles import copy, matmul_acc, zero
from pto_gpu.orchestration.flash_attention import flash_attention_fused
from pto_gpu.orchestration.matmul import tiled_matmul
from test_cuda import ON_GPU, axpy_kernel, random_buffers, random_kernel_program

import pto_gpu as pto
from pto_gpu.backends import cuda_abi, emulated_device, emulator, persistent_module
from pto_gpu.errors import DeadlockError, PTOError, TaskError
from pto_gpu.executors import persistent

BACKENDS = [pytest.param("cuda", marks=ON_GPU), "cuda-emulated"]


@pytest.fixture
def fresh_emulator():
    """The emulator's faults disarmed and its context fresh, after as before."""
    emulator.reset()
    yield
    emulator.reset()


def expected(seed: int) -> list[np.ndarray]:
    buffers = random_buffers(seed)
    pto.Runtime(backend="cpu", executor="serial").run(random_kernel_program, buffers, seed, 80)
    return buffers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [2, 4, 16])
def test_a_graph_larger_than_the_rings_runs_and_a_later_run_launches_one_kernel(window, backend):
    """80 tasks through task rings of 2 to 16 slots (so slots of the kernel's state are used
    again and again, and the host waits on them), bitwise equal to the serial CPU executor.
    The first run's new instances end and relaunch the kernel; the backend keeps them, so a
    second run of the same graph is one kernel."""
    rt = pto.Runtime(backend=backend, executor="persistent", task_window=window)
    for run in range(2):
        launched = emulator.launches()
        got = [rt.backend.to_device(b) for b in random_buffers(5)]
        rt.run(random_kernel_program, got, 5, 80)
        for want, array in zip(expected(5), got):
            assert rt.backend.to_host(array).tobytes() == want.tobytes(), f"run {run}"
        if backend == "cuda-emulated" and run == 1:
            assert emulator.launches() - launched == 1


def test_a_heap_of_two_tiles_stalls_the_orchestrator_until_the_kernel_frees_one():
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", heap_bytes=2 * 64 * 64 * 4,
                     task_window=8)
    c = np.zeros((256, 256), np.float32)
    result = rt.run(tiled_matmul, a, b, c, tile=64)
    assert result.high_water["heap_bytes"] == 2 * 64 * 64 * 4 and result.stalls
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(c, want, atol=1e-4 * np.abs(want).max())


def hold_the_stream(rt: pto.Runtime) -> None:
    """Put an event that is never reached on the persistent kernel's stream: a kernel launched
    behind it never starts."""
    emulator.lose_event(1)
    event = rt.backend.take_event()
    rt.backend.device.driver.call("cuEventRecord", event, rt.backend.stream(("persistent", 0)))


def test_a_kernel_that_makes_no_progress_is_a_deadlock_that_names_the_tasks_left(fresh_emulator, monkeypatch):
    monkeypatch.setattr(persistent, "PATIENCE", 0.5)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=4)
    hold_the_stream(rt)
    with pytest.raises(DeadlockError, match=r"no progress for 0.5 s while waiting for room in a ring: 4 "
                                            r"tasks unfinished \((add|scale|copy|zero) \(task 0\), .*"
                                            r"running: none \(published 4, wired 0, 0 of 4 in flight done\)"):
        rt.run(random_kernel_program, random_buffers(1), 1, 20)


def test_a_kernel_that_faults_fails_the_run_and_the_backend_runs_again(fresh_emulator):
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    emulator.fault_kernel(1)
    with pytest.raises(PTOError, match="the persistent kernel failed with no task running: .*ILLEGAL_ADDR"):
        rt.run(random_kernel_program, random_buffers(2), 2, 20)
    emulator.reset()
    got = random_buffers(2)
    pto.Runtime(backend="cuda-emulated", executor="persistent").run(random_kernel_program, got, 2, 80)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, expected(2)))


def test_a_launch_the_driver_refuses_fails_the_run(fresh_emulator):
    emulator.fail_launch(1)
    with pytest.raises(PTOError, match="the persistent kernel failed with no task running: cuLaunchKernel "
                                       "failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        pto.Runtime(backend="cuda-emulated", executor="persistent").run(random_kernel_program,
                                                                        random_buffers(3), 3, 20)


def test_what_the_persistent_executor_cannot_run_is_named():
    with pytest.raises(PTOError, match=r'executor="persistent" runs the tasks in one CUDA kernel: it needs '
                                       r'backend="cuda" or "cuda-emulated", not "cpu"'):
        pto.Runtime(backend="cpu", executor="persistent")

    def mixed(o, x, y):
        o.submit(add, pto.input(o.external(x)), pto.input(o.external(x)), pto.output(o.external(x)))
        o.submit(add, pto.input(o.external(y)), pto.input(o.external(y)), pto.output(o.external(y)))

    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    with pytest.raises(TaskError, match=r"runs one element type in a run .*: add is float64, the run's tasks "
                                        r"so far float32"):
        rt.run(mixed, np.ones((4, 8), np.float32), np.ones((4, 8), np.float64))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_module_compiles_for_the_gpu(arch, tmp_path):
    """The module a float16 fused attention run makes (tensor-core instances whose tiles are
    shared memory references, with a row-layout one beside them), built by nvcc as the GPU
    would load it, with every warning an error."""
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    q = np.random.default_rng(0).standard_normal((2, 100, 32)).astype(np.float16)
    rt.run(flash_attention_fused, q, q, q, np.zeros_like(q), tile=64, causal=True)
    rt.run(lambda o, x: o.submit(add, pto.input(o.external(x)), pto.input(o.external(x)),
                                 pto.output(o.external(x))), np.ones((4, 8), np.float16))
    codes = rt.backend.persistent_codes[np.dtype(np.float16)]
    assert len(codes) >= 2 and max(code.shared_bytes for code in codes) > 0
    path = persistent_module.write(codes)
    command = ["nvcc", f"-arch={arch}", "-std=c++17", "-Werror", "all-warnings", "-c", "-o",
               str(tmp_path / "module.o"), *cuda_abi.compile_options(np.float16, "persistent"), "-x", "cu",
               str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


def matmuls_then_a_new_instance(o, a, b, c, x, y, with_copy: bool) -> None:
    """Tasks that finish out of order (adds beside three accumulating 128 x 128 products), then,
    with `with_copy`, one of an instance the kernel has not got: the kernel ends with every
    task before it finished and retired, and the next starts its tickets afresh."""
    A, B, C, X, Y = (o.external(t) for t in (a, b, c, x, y))
    for _ in range(4):
        o.submit(add, pto.input(X), pto.input(X), pto.output(Y))
    acc = o.alloc((128, 128), A.dtype)
    o.submit(zero, pto.output(acc))
    for _ in range(3):
        o.submit(matmul_acc, pto.input(A), pto.input(B), pto.inout(acc))
    o.submit(add, pto.input(X), pto.input(X), pto.output(Y))
    if with_copy:
        o.submit(copy, pto.input(acc), pto.output(C))
    o.free(acc)


@pytest.mark.parametrize("window", [8, 16])
def test_a_kernel_ended_for_a_new_instance_retires_every_task_first(window):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
    x, y, c = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32), np.zeros((128, 128), np.float32)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=window)
    first = rt.run(matmuls_then_a_new_instance, a, b, c, x, y, False)
    second = rt.run(matmuls_then_a_new_instance, a, b, c, x, y, True)
    assert first.num_tasks == 9 and second.num_tasks == 10
    want = 3 * (a.astype(np.float64) @ b)
    np.testing.assert_allclose(c, want, atol=1e-4 * np.abs(want).max())
    assert (y == 2).all()


def test_a_kernel_it_cannot_run_is_refused_and_later_runs_are_not_spoilt(tmp_path):
    axpy = axpy_kernel(tmp_path)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    x, y = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(TaskError, match=r"axpy.*runs the generated CUDA code of PTO programs; .*axpy.cu is "
                                        r"not generated code"):
        rt.run(lambda o: o.submit(axpy, 2.0, pto.input(o.external(x)), 32, pto.output(o.external(y))))
    for _ in range(2):
        rt.run(lambda o: o.submit(add, pto.input(o.external(x)), pto.input(o.external(x)),
                                  pto.output(o.external(y))))
        assert (y == 2).all()
        y[:] = 0


def test_the_trace_draws_each_task_on_the_block_that_ran_it_after_its_producers(tmp_path):
    """trace= draws the kernel's tasks on a lane per block, from the times the blocks wrote (the
    device's clock, read as the host's): every task once, inside the run, none before the
    producers it waited for had ended, a block's one after another (the emulator's blocks run
    side by side, each on a thread)."""
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=8)
    path = tmp_path / "trace.json"
    started = time.perf_counter()
    result = rt.run(random_kernel_program, random_buffers(4), 4, 60, trace=path)
    took = (time.perf_counter() - started) * 1e6
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = {e["args"]["task"]: e for e in events if e["ph"] == "X"}
    assert len(spans) == result.num_tasks > 50 and result.num_edges > 20
    blocks = {f"persistent-block-{b}" for b in range(emulated_device.PERSISTENT_BLOCKS)}
    assert {lanes[e["tid"]] for e in spans.values()} <= blocks
    assert all(0 <= e["ts"] and e["ts"] + e["dur"] <= took for e in spans.values())
    for tid in lanes:  # a block runs one task at a time
        on_it = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans.values() if e["tid"] == tid)
        assert all(end <= start + 0.002 for (_, end), (start, _) in zip(on_it, on_it[1:]))
    for producer, consumer in result.graph.edges:
        assert spans[consumer]["ts"] >= spans[producer]["ts"] + spans[producer]["dur"] - 0.002
