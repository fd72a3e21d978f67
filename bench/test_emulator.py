"""The CUDA backend's host path, measured on the CUDA emulator (backend="cuda-emulated",
emulate="cpu-code"), so it runs on any machine; the same code issues to a GPU's driver.

- End to end: 20,000 tiny tasks (1x16 rows, independent: the throughput benchmark's graph)
  through the stream executor, from a compiled orchestration and from Python `o.submit`.
  extra_info["tasks_per_s"]. Target (issue 40): at least 100k tasks/s.
- The issue path alone: `issue` called from a numba loop (the emulator's driver calls, each
  launch an emulated no-op kernel), and, over a driver whose per-task calls do nothing (so the
  host path's own cost is what is left), `enqueue` (what a Python submit's task costs the
  backend: the launch template's lookup, the task's words, one numba call) and the stream
  executor's host cost per task, from a compiled orchestration and from Python submits (issue
  and retirement: the run's time less the same orchestration's on the dry executor, which
  submits and completes the same tasks without issuing them), independent, a chain, and from
  compiled code independent tasks each of a factor of its own (where a flush's plan looks for a
  batch and finds none).
  extra_info["us_per_task"]. Targets: at most 5 us from Python, at most 1 us from compiled code.
- The compiled tiled matmul (512², 32-row tiles: 4,608 tasks in chains of 18): the launches its
  flushes' plans make (extra_info["launches"]).
- The same 20,000 tasks through the persistent executor (its kernel's host build runs them), and
  the host's own CPU time a task there (less its waits for the kernel).
- Python submits that no batch takes (a chain; factors that differ): extra_info["us_per_task"].
- A compiled orchestration's first run with six new kernel instances (emulate="gpu-code": g++
  builds their CUDA), compiled side by side before the first launch against one by one.
"""

import time
import types

import numba
import numpy as np
import pytest
from pto_gpu.kernels.elementwise import scale
from pto_gpu.orchestration.matmul import tiled_matmul_compiled
from tiny_tasks import TASKS, generated, generated_python, rows

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj
from pto_gpu.backends import emulator
from pto_gpu.backends.launches import CPU_CODE_ENTRY, NO_WORK, Scratch, issue
from pto_gpu.executors.driver_streams import DriverStreamExecutor
from pto_gpu.executors.persistent import PersistentExecutor

ISSUES = 20_000


@pytest.mark.parametrize("orchestration", [generated, generated_python], ids=["compiled", "python"])
def test_stream_executor_on_the_emulator(benchmark, orchestration):
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=4096)
    x, y = (rt.backend.to_device(a) for a in rows())
    result = benchmark.pedantic(rt.run, (orchestration, x, y, "independent"), rounds=5, warmup_rounds=1)
    assert result.num_tasks == TASKS and np.array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))
    benchmark.extra_info["tasks_per_s"] = TASKS / benchmark.stats.stats.median


class KernelWaits:
    """The CPU seconds the persistent executor's thread spends waiting for its kernel (polling
    for tasks to finish, for the kernel's end), counted while installed."""

    def __init__(self, monkeypatch):
        self.cpu_seconds = 0.0
        for name in ("_wait_done", "_wait_kernel_end"):
            monkeypatch.setattr(PersistentExecutor, name, self._timed(getattr(PersistentExecutor, name)))

    def _timed(self, wait):
        def timed(*args):
            started = time.thread_time()
            try:
                return wait(*args)
            finally:
                self.cpu_seconds += time.thread_time() - started

        return timed


@pytest.mark.parametrize("orchestration", [generated, generated_python], ids=["compiled", "python"])
def test_persistent_executor_on_the_emulator(benchmark, monkeypatch, orchestration):
    """The same tasks through executor="persistent": published from the argument tables by
    numba (an instance's first task the Python way) and run by the kernel's host build (each
    block's threads as fibers, its blocks side by side on OS threads, which share the machine
    with the host's thread), so the end to end figure is mostly the emulated blocks'. Beside it,
    extra_info["host_cpu_us_per_task"]: the CPU time of the run's thread a task, less what its
    waits for the kernel took (the orchestration's submits included; CPU time, as the blocks'
    threads take the machine's cores from the host's thread for a wall time that says little)."""
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=4096)
    x, y = (rt.backend.to_device(a) for a in rows())
    rt.run(orchestration, x, y, "independent")  # the instances learnt, the module built
    waits = KernelWaits(monkeypatch)
    results = []

    def run():
        results.append(rt.run(orchestration, x, y, "independent"))

    benchmark.pedantic(run, rounds=3)
    assert all(r.num_tasks == r.native_tasks == TASKS for r in results)
    assert np.array_equal(rt.backend.to_host(y), 2 * rt.backend.to_host(x))
    benchmark.extra_info["tasks_per_s"] = TASKS / benchmark.stats.stats.median
    host = sum(r.cpu_seconds["caller"] for r in results) - waits.cpu_seconds
    benchmark.extra_info["host_cpu_us_per_task"] = host / (len(results) * TASKS) * 1e6


def _scalars_differ(o, x, y):
    """generated_python's independent rows, each task scaling by a factor of its own: no two
    tasks go out in one launch."""
    X, Y = o.external(x), o.external(y)
    for i in range(TASKS):
        r = i % len(x)
        o.submit(scale, pto.input(X[r:r + 1]), pto.output(Y[r:r + 1]), float(i % 7 + 1))


@pytest.mark.parametrize("shape", ["chain", "scalars_differ"])
def test_python_submits_that_go_alone(benchmark, shape):
    """Python submits no batch takes (a chain; factors that differ): what holding submits for a
    batch must not cost them (driver_streams.submit_python)."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=4096)
    x, y = (rt.backend.to_device(a) for a in rows())
    run = (generated_python, x, y, "chain") if shape == "chain" else (_scalars_differ, x, y)
    result = benchmark.pedantic(rt.run, run, rounds=5, warmup_rounds=1)
    assert result.num_tasks == TASKS and result.native_launches > TASKS * 0.9
    benchmark.extra_info["us_per_task"] = benchmark.stats.stats.median / TASKS * 1e6


@numba.cfunc(CPU_CODE_ENTRY, nopython=True)
def _nothing(grid, block, shared, params, context):
    return np.int32(0)


@pytest.fixture(scope="module")
def no_op():
    """An emulated kernel that does nothing (native code: no GIL on the stream's thread)."""
    return _nothing, emulator.function(_nothing.address, [8] * 15)


def _tasks(rt: pto.Runtime) -> list:
    """Scale tasks over the rows of an array, as `enqueue` reads them (kernel and params)."""
    tasks = []
    x = rt.backend.to_device(np.zeros((64, 16), np.float32))

    def orch(o, x):
        X = o.external(x)
        for r in range(64):
            params = (pto.input(X[r:r + 1]), pto.output(X[r:r + 1]), pto.scalar(2.0))
            tasks.append(types.SimpleNamespace(kernel=scale, params=params))

    rt.run(orch, x)
    return tasks, x


_U32, _PTR = numba.types.uint32, numba.types.voidptr


@numba.cfunc(numba.types.int32(_PTR, _U32, _U32, _U32, _U32, _U32, _U32, _U32, _PTR, _PTR, _PTR))
def _null_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    return np.int32(0)


@numba.cfunc(numba.types.int32(_PTR, _PTR))
def _null_record(event, stream):
    return np.int32(0)


@numba.cfunc(numba.types.int32(_PTR, _PTR, _U32))
def _null_wait(stream, event, flags):
    return np.int32(0)


@numba.cfunc(numba.types.int32(_PTR))
def _null_query(event):
    return np.int32(0)


NULL = [_null_launch, _null_record, _null_wait, _null_query]  # in launches.CALLS order


@pytest.fixture
def null_driver(monkeypatch):
    """Make a runtime's per-task driver calls (launches.CALLS) do nothing, every event reached
    at once: what is left of a task's cost is the host path's own."""
    def patch(rt: pto.Runtime) -> None:
        addresses = np.array([f.address for f in NULL], np.int64)
        monkeypatch.setattr(rt.backend.device.driver, "addresses", addresses)

    return patch


def test_enqueue_from_python(benchmark, null_driver):
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code")
    tasks, _ = _tasks(rt)
    backend = rt.backend
    stream = backend.stream("bench")
    backend.synchronize(backend.enqueue(tasks[0], stream, []))  # the template made
    null_driver(rt)

    def enqueue_all():
        for i in range(ISSUES):
            backend.release(backend.enqueue(tasks[i % 64], stream, []))
        backend.synchronize(backend.enqueue(tasks[0], stream, []))

    benchmark.pedantic(enqueue_all, rounds=5, warmup_rounds=1)
    benchmark.extra_info["us_per_task"] = benchmark.stats.stats.median / ISSUES * 1e6


@numba.njit(nogil=True)
def _issue_many(driver, function, gemm, stream, words, at, own, waits, scratch_words, params, failed, count):
    for i in range(count):
        own[0] = i
        if issue(driver, function, 1, 256, 0, gemm, 0, stream, words, at, own, waits, 0, 0, scratch_words,
                 params, failed) != 0:
            return i
    return count


def test_issue_from_compiled_code(benchmark, no_op):
    driver = emulator.driver()
    stream, done = driver.new_stream(), driver.new_event()
    scratch = Scratch()
    words, at, own, waits = (np.zeros(15, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64),
                             np.zeros(0, np.int64))

    def issue_all():
        issued = _issue_many(driver.addresses, no_op[1], NO_WORK.gemm, stream, words, at, own, waits,
                             scratch.words, scratch.params, scratch.failed, ISSUES)
        assert issued == ISSUES
        driver.call("cuEventRecord", done, stream)
        driver.call("cuEventSynchronize", done)

    benchmark.pedantic(issue_all, rounds=5, warmup_rounds=1)
    benchmark.extra_info["us_per_task"] = benchmark.stats.stats.median / ISSUES * 1e6


@pytest.mark.parametrize("orchestration, shape", [
    (generated, "independent"), (generated, "chain"), (generated, "factors"),
    (generated_python, "independent"), (generated_python, "chain")],
    ids=["compiled", "compiled-chain", "compiled-factors", "python-independent", "python-chain"])
def test_stream_executor_host_cost(benchmark, null_driver, orchestration, shape):
    """Over a driver whose per-task calls do nothing: the executor's own issue and retirement
    of a task, from a compiled orchestration or a Python submit (its arguments written to the
    tables, its numba call), less what the dry executor takes for the same submits."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=4096)
    null_driver(rt)
    x, y = (rt.backend.to_device(a) for a in rows())
    result = benchmark.pedantic(rt.run, (orchestration, x, y, shape), rounds=5, warmup_rounds=1)
    assert result.native_tasks == TASKS  # the warm-up run learnt the launch
    dry = pto.Runtime(backend="cuda-emulated", executor="dry", task_window=4096)
    dry.run(orchestration, x, y, shape)
    submits = []
    for _ in range(5):
        started = time.perf_counter()
        dry.run(orchestration, x, y, shape)
        submits.append(time.perf_counter() - started)
    benchmark.extra_info["us_per_task"] = (benchmark.stats.stats.median - np.median(submits)) / TASKS * 1e6
    benchmark.extra_info["orchestration_us_per_task"] = np.median(submits) / TASKS * 1e6


def test_tiled_matmul_launches_on_the_emulator(benchmark):
    """The compiled tiled matmul's chains (a tile of C each) on the stream executor: its flushes'
    plans send a row of tiles' k-th products as one cuBLAS call (the emulator's)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream")
    c = rt.backend.to_device(np.zeros((512, 512), np.float32))
    result = benchmark.pedantic(rt.run, (tiled_matmul_compiled, a, b, c), {"tile": 32}, rounds=3,
                                warmup_rounds=1)
    expected = a.astype(np.float64) @ b
    assert result.num_tasks == result.native_tasks == 16 * 16 * 18
    assert np.abs(rt.backend.to_host(c) - expected).max() <= 1e-4 * np.abs(expected).max()
    benchmark.extra_info["launches"] = result.native_launches
    benchmark.extra_info["tasks"] = result.num_tasks


# --- a run's new instances compile side by side (issue 41, item 5) ---------------------------------
NEW_INSTANCES = 6
_salts = iter(range(1, 1_000_000))


def _fresh_program() -> list:
    """NEW_INSTANCES kernels whose CUDA sources no cache holds (a constant of their own)."""
    salt = next(_salts) + time.time_ns() % 1_000_000 * 1e-9
    m = isa.Module("fresh")
    for i in range(NEW_INSTANCES):
        (isa.FunctionBuilder(f"k{i}", module=m).in_core()
            .memref("x", pto.FLOAT32, (32, 64)).memref("y", pto.FLOAT32, (32, 64))
            .tile("t", 32, 64, pto.FLOAT32)

            .load("t", "x").muls("t", "t", float(i + 1)).adds("t", "t", salt).store("y", "t").build())
    return [isa.compile(m).kernels[f"k{i}"] for i in range(NEW_INSTANCES)]


@numba.njit(cache=True)
def _one_task_each(o, x, y, kernel_ids):
    for i in range(len(kernel_ids)):
        pj.submit(o, kernel_ids[i], (pj.input(x), pj.output(pj.narrow(y, 0, 32 * i, 32 * i + 32))))


def _one_task_each_from_python(o, x, y, kernels):
    X, Y = o.external(x), o.external(y)
    for i, kernel in enumerate(kernels):
        o.submit(kernel, pto.input(X), pto.output(Y[32 * i:32 * i + 32]))


@pytest.mark.benchmark(group="emulator-first-run")
@pytest.mark.parametrize("orchestration", ["compiled", "python"])
@pytest.mark.parametrize("together", [True, False], ids=["compiled-together", "one-by-one"])
def test_first_run_of_new_instances(benchmark, monkeypatch, orchestration, together):
    """A first run whose six kernels are new (emulate='gpu-code': each instance a g++ build of
    its generated CUDA), its instances compiled side by side (a compiled orchestration's when
    its log is admitted, CudaBackend.prefetch; a Python one's as each submit comes, the submits
    after it waiting behind it, DriverStreamExecutor._wait_behind), against one by one as each task
    is issued (both switched off)."""
    if not together:
        monkeypatch.setattr(DriverStreamExecutor, "_prefetch", lambda *args: None)
        prepare = DriverStreamExecutor._prepare

        def waiting(executor, task, wait=True):  # each compile waited for where its task is issued
            return prepare(executor, task)

        monkeypatch.setattr(DriverStreamExecutor, "_prepare", waiting)
    x = np.ones((32, 64), np.float32)

    def setup():
        kernels = _fresh_program()
        y = np.zeros((32 * NEW_INSTANCES, 64), np.float32)
        rt = pto.Runtime(backend="cuda-emulated", executor="stream")
        return (rt, kernels, y), {}

    def first_run(rt, kernels, y):
        if orchestration == "compiled":
            ids = np.array([k.id for k in kernels], np.int64)
            rt.run(lambda o: o.compiled(_one_task_each, o.external(x), o.external(y), ids))
        else:
            rt.run(_one_task_each_from_python, x, y, kernels)
        assert np.all(y[::32, 0] > np.arange(1, NEW_INSTANCES + 1))  # each kernel ran: (i + 1) + salt

    benchmark.pedantic(first_run, setup=setup, rounds=3)
