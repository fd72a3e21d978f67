"""Native workers (executors/native.py): the tasks of generated kernels, submitted by compiled
code or from Python, run and complete without the GIL, and give the serial executor's results."""

import ctypes
import gc
import weakref
from pathlib import Path

import numba
import numpy as np
import pytest
from fuzzing import compiled_plan, native_plan, python_plan
from pto_gpu.kernels.elementwise import add, scale
from pto_gpu.kernels.llm import flash_normalise, swiglu
from pto_gpu.orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj
from pto_gpu.core.lock import monotonic_ns
from pto_gpu.executors import parallel
from pto_gpu.executors.native import (
    BUDGET,
    CONTROL,
    MIN_BUDGET,
    SHARE_NS,
    WAKE_AFTER_NS,
    NativeLanes,
    _time_to_return,
    budget,
)
from pto_gpu.jit.context import S_INT
from pto_gpu.jit.descriptor import D_BASE, D_ITEMSIZE, D_NDIM, D_SHAPE, D_STRIDE, DESC_WIDTH
from pto_gpu.native_abi import NjitEntries

TILE = 4


@numba.njit(cache=True)
def _tiles(o, x, acc, out, scale_id, add_id, swiglu_id):
    """Per row tile of x: a heap tile t = 3x; acc += t (one in-place chain through every tile);
    out's tile = x, then silu(out's tile) * t in place; then, per column block of out (strided
    windows), out *= 0.5."""
    for r in range(0, pj.shape(x, 0), TILE):
        rows, out_rows = pj.narrow(x, 0, r, r + TILE), pj.narrow(out, 0, r, r + TILE)
        t = pj.alloc(o, (TILE, pj.shape(x, 1)), pj.dtype(x))
        pj.submit(o, scale_id, (pj.input(rows), pj.output(t)), (3.0,))
        pj.submit(o, add_id, (pj.input(t), pj.input(acc), pj.output(acc)))
        pj.submit(o, scale_id, (pj.input(rows), pj.output(out_rows)), (1.0,))
        pj.submit(o, swiglu_id, (pj.inout(out_rows), pj.input(t)))
        pj.free(o, t)
    for c in range(0, pj.shape(out, 1), 8):
        block = pj.narrow(out, 1, c, c + 8)
        pj.submit(o, scale_id, (pj.input(block), pj.output(block)), (0.5,))


def _run(executor: str, seed: int = 0, python_tasks: bool = False, **options):
    """Run `_tiles` (with Python-level tasks around it if asked: the two kinds of submit share
    the run's argument tables); the arrays and the result."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 24)).astype(np.float32)
    acc, out = np.zeros((TILE, 24), np.float32), np.zeros((64, 24), np.float32)

    def orchestration(o):
        X, ACC, OUT = o.external(x), o.external(acc), o.external(out)
        if python_tasks:
            o.submit(scale, pto.input(ACC), pto.output(ACC), 2.0)
        o.compiled(_tiles, X, ACC, OUT, scale.id, add.id, swiglu.id)
        if python_tasks:
            o.submit(add, pto.input(OUT[0:TILE]), pto.input(ACC), pto.output(ACC))

    result = pto.Runtime(backend="cpu", executor=executor, **options).run(orchestration)
    return (x, acc, out), result


@pytest.mark.parametrize("python_tasks", [False, True])
@pytest.mark.parametrize("window", [1024, 8])
def test_native_workers_give_the_serial_results(python_tasks, window):
    (_, *expected), _ = _run("serial", python_tasks=python_tasks)
    # The first call of each instance runs the Python way (which compiles it) and enters its
    # native entry for the process's later runs: the second run's tasks are all native.
    for _ in range(2):
        (_, *arrays), result = _run("parallel", python_tasks=python_tasks, task_window=window,
                                    heap_bytes=4096)
        for got, want in zip(arrays, expected):
            assert got.tobytes() == want.tobytes()  # the same generated code on the same values
    assert result.native_tasks == result.num_tasks
    assert sum(k.tasks for k in result.kernels.values()) == result.num_tasks


def test_the_numbers_match_numpy():
    (x, acc, out), _ = _run("parallel")
    t = 3.0 * x.astype(np.float64)
    expected_acc = t.reshape(-1, TILE, x.shape[1]).sum(axis=0)
    silu = x / (1 + np.exp(-x.astype(np.float64)))
    # float32 arithmetic over 16 tiles of sums and a silu: a few ulps of the largest value
    np.testing.assert_allclose(acc, expected_acc, rtol=1e-5, atol=1e-5 * np.abs(expected_acc).max())
    np.testing.assert_allclose(out, 0.5 * silu * t, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["schedule", "trace", "validate"])
def test_runs_that_need_each_task_s_record_run_them_the_python_way(case, tmp_path):
    (_, *expected), _ = _run("serial")
    rt = pto.Runtime(backend="cpu", executor="parallel", validate=case == "validate")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 24)).astype(np.float32)
    acc, out = np.zeros((TILE, 24), np.float32), np.zeros((64, 24), np.float32)

    def orchestration(o):
        o.compiled(_tiles, o.external(x), o.external(acc), o.external(out), scale.id, add.id, swiglu.id)

    result = rt.run(orchestration, schedule=pto.Schedule() if case == "schedule" else None,
                    trace=tmp_path / "trace.json" if case == "trace" else None)
    assert result.native_tasks == 0
    assert acc.tobytes() == expected[0].tobytes() and out.tobytes() == expected[1].tobytes()


def test_the_compiled_llama_layer_runs_natively_with_the_serial_results():
    """Batched families (attention over heads), library matmuls handed to Python workers, rings
    that fill: the layer's output is the Python-level serial run's, bit for bit."""
    inputs = llama_layer_inputs(200, hidden=64, heads=4, ffn=96, seed=5)
    rt = pto.Runtime(backend="cpu", executor="parallel", task_window=32, heap_bytes=96 << 10)
    result = rt.run(llama_layer_compiled, inputs, adaptive=True)
    assert result.native_tasks > result.num_tasks // 3
    serial_inputs = llama_layer_inputs(200, hidden=64, heads=4, ffn=96, seed=5)
    pto.Runtime(backend="cpu", executor="serial").run(llama_layer, serial_inputs, adaptive=True)
    assert inputs["out"].tobytes() == serial_inputs["out"].tobytes()


@pytest.mark.parametrize("orchestration", [compiled_plan, python_plan], ids=["compiled", "python"])
@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_of_generated_kernels_give_the_serial_results(seed, orchestration):
    """Overlapping tiles of two arrays, in-place updates, small rings: native workers against
    the serial executor, bit for bit (the second run, when every instance has its entry)."""
    rng = np.random.default_rng(seed)
    plan = native_plan(rng, 150)
    start = rng.uniform(-1, 1, (2, 16, 32)).astype(np.float32)
    results = {}
    for executor, window in (("serial", 1024), ("parallel", 8), ("parallel", 64)):
        a, b = start[0].copy(), start[1].copy()
        runtime = pto.Runtime(backend="cpu", executor=executor, task_window=window)
        result = runtime.run(orchestration, a, b, plan)
        results[executor, window] = (a.tobytes(), b.tobytes(), result.native_tasks, result.num_tasks)
    serial = results["serial", 1024]
    for key in (("parallel", 8), ("parallel", 64)):
        assert results[key][:2] == serial[:2], key
    assert results["parallel", 64][2] == results["parallel", 64][3] == serial[3] > len(plan) // 2


@numba.njit(cache=True)
def _rows(o, x, y, scale_id, with_factor):
    for r in range(pj.shape(x, 0)):
        source, target = pj.narrow(x, 0, r, r + 1), pj.narrow(y, 0, r, r + 1)
        if with_factor:
            pj.submit(o, scale_id, (pj.input(source), pj.output(target)), (1.0 + r,))
        else:
            pj.submit(o, scale_id, (pj.input(source), pj.output(target)))


def _scale_rows(o, x, y, with_factor):
    o.compiled(_rows, o.external(x), o.external(y), scale.id, with_factor)


def test_each_task_runs_with_its_own_scalars_and_a_missing_one_is_named():
    """Scalars are per task (a factor per row); a task missing its scalar goes to a Python
    worker, which names the fault as the serial executor does, even once the instance runs
    natively."""
    x = np.ones((8, 16), np.float32)
    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):
        y = np.zeros_like(x)
        result = rt.run(_scale_rows, x, y, True)
        assert np.array_equal(y, np.arange(1, 9, dtype=np.float32)[:, None] * x)
    assert result.native_tasks == 8
    for executor in ("serial", "parallel"):
        with pytest.raises(pto.TaskError, match="not enough arguments"):
            pto.Runtime(backend="cpu", executor=executor).run(_scale_rows, x, np.zeros_like(x), False)


def test_a_kernel_declared_after_compiled_code_began_runs_on_a_python_worker():
    @numba.njit(cache=True)
    def double(o, x, scale_id):
        pj.submit(o, scale_id, (pj.input(x), pj.output(x)), (2.0,))

    def orchestration(o, x):
        X = o.external(x)
        o.compiled(double, X, scale.id)

        @pto.kernel(pto.VECTOR, name="late")
        def late(a):
            a += 1

        o.submit(late, pto.inout(X))

    x = np.ones((4, 8), np.float32)
    pto.Runtime(backend="cpu", executor="parallel").run(orchestration, x)
    assert np.array_equal(x, np.full((4, 8), 3.0, np.float32))


@numba.njit(cache=True)
def _empty_batches(o, acc, total, out, normalise_id):
    none = 0  # an empty batch of heads: a family runs nothing for it
    pj.submit(o, normalise_id, (pj.input(pj.narrow(acc, 0, 0, none)), pj.input(pj.narrow(total, 0, 0, none)),
                                pj.output(pj.narrow(out, 0, 0, none))))


def test_an_empty_batch_runs_nothing_natively_either(capfd):
    acc, total, out = (np.ones((2, 4, n), np.float32) for n in (8, 1, 8))

    def orchestration(o):
        o.compiled(_empty_batches, o.external(acc), o.external(total), o.external(out), flash_normalise.id)

    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):
        result = rt.run(orchestration)
    assert result.native_tasks == 0 and np.array_equal(out, np.ones_like(out))
    assert "Exception" not in capfd.readouterr().err


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"), njit=True)
def _axpy(x, out, a, times):
    """out = a * x + out, `times` times over (an int scalar beside a float one)."""
    for _ in range(times):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                out[i, j] += a * x[i, j]


@numba.njit(cache=True)
def _axpy_tiles(o, x, out, axpy_id):
    for r in range(0, pj.shape(x, 0), 2):
        for c in range(0, pj.shape(x, 1), 4):
            tile = pj.narrow(pj.narrow(x, 0, r, r + 2), 1, c, c + 4)
            target = pj.narrow(pj.narrow(out, 0, r, r + 2), 1, c, c + 4)
            pj.submit(o, axpy_id, (pj.input(tile), pj.inout(target)), (0.5 + r, 1 + c % 3))


def _orchestrate_axpy(o, x, out):
    o.compiled(_axpy_tiles, o.external(x), o.external(out), _axpy.id)


def test_hand_written_njit_kernels_run_natively_with_the_serial_results():
    x = np.random.default_rng(3).standard_normal((8, 16))
    results = []
    for executor in ("serial", "parallel", "parallel"):
        out = np.ones((8, 16))
        result = pto.Runtime(backend="cpu", executor=executor).run(_orchestrate_axpy, x, out)
        results.append((out.tobytes(), result.native_tasks))
    assert results[1][0] == results[0][0] and results[2][0] == results[0][0]
    assert results[2][1] == 16
    expected = np.ones((8, 16))
    for r in range(0, 8, 2):
        for c in range(0, 16, 4):
            expected[r:r + 2, c:c + 4] += (1 + c % 3) * (0.5 + r) * x[r:r + 2, c:c + 4]
    np.testing.assert_allclose(np.frombuffer(results[0][0]).reshape(8, 16), expected, rtol=1e-12)


@numba.njit
def _add_halves(x, out, times):
    out[...] = x + 0.5 * times


def _call_entry(address: int, arrays: list[np.ndarray], times: int) -> int:
    """Call a native entry (native_abi.ENTRY) on whole arrays and one int scalar."""
    descs = np.zeros((len(arrays), DESC_WIDTH), np.int64)
    for desc, array in zip(descs, arrays):
        desc[D_BASE], desc[D_ITEMSIZE], desc[D_NDIM] = array.ctypes.data, array.itemsize, array.ndim
        desc[D_SHAPE:D_SHAPE + array.ndim] = array.shape
        desc[D_STRIDE:D_STRIDE + array.ndim] = [s // array.itemsize for s in array.strides]
    kinds, ints, floats = np.full(1, S_INT, np.int64), np.full(1, times, np.int64), np.zeros(1)
    entry = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_void_p] * 4)(address)
    return entry(descs.ctypes.data, kinds.ctypes.data, ints.ctypes.data, floats.ctypes.data)


def test_the_native_entries_of_a_function_a_module_names_are_generated_into_the_cache(tmp_path, monkeypatch):
    """Such entries come from a module under the cache directory, which numba's cache keeps
    across processes; a function no module names (a closure) gets its entries made in the process."""
    monkeypatch.setenv("PTO_GPU_CACHE", str(tmp_path))

    def closure(x, out, times):
        out[...] = x + 0.5 * times

    x = np.random.default_rng(5).standard_normal((3, 5))
    shapes = (x.shape, x.shape)
    named, unnamed = NjitEntries(_add_halves), NjitEntries(numba.njit(closure))
    for entries in (named, unnamed, NjitEntries(_add_halves)):
        out = np.zeros_like(x)
        assert _call_entry(entries(shapes, x.dtype, (3,)), [x, out], 3) == 0
        np.testing.assert_array_equal(out, x + 1.5)
    generated = list(tmp_path.glob("njit_*.py"))
    assert len(generated) == 1
    assert f"# run: {__name__}._add_halves" in generated[0].read_text()
    assert named(shapes, x.dtype, (3,)) == NjitEntries(_add_halves)(shapes, x.dtype, (3,))
    # ... and numba cached it, for the next process
    cached = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else tmp_path
    assert list(cached.rglob(f"{generated[0].stem}.entry-*.nbi"))


def test_a_native_class_whose_workers_cannot_start_fails_the_run_and_the_runtime_goes_on(monkeypatch):
    """Native tasks queued before the workers start get their class's workers at the start
    (ParallelExecutor._hire_locked): a thread that cannot start fails the run, not hangs it."""
    rt = pto.Runtime(backend="cpu", executor="parallel")
    start = rt._threads.start

    def no_threads(name, target, args):
        raise RuntimeError("can't start new thread")

    x = np.random.default_rng(4).standard_normal((64, 24)).astype(np.float32)

    def orchestration(o, acc, out):
        o.compiled(_tiles, o.external(x), o.external(acc), o.external(out), scale.id, add.id, swiglu.id)

    monkeypatch.setattr(rt._threads, "start", no_threads)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        rt.run(orchestration, np.zeros((TILE, 24), np.float32), np.zeros((64, 24), np.float32))
    monkeypatch.setattr(rt._threads, "start", start)
    results = []
    for executor_rt in (rt, pto.Runtime(backend="cpu", executor="serial")):
        acc, out = np.zeros((TILE, 24), np.float32), np.zeros((64, 24), np.float32)
        executor_rt.run(orchestration, acc, out)
        results.append((acc.tobytes(), out.tobytes()))
    assert results[0] == results[1]


def test_njit_kernels_need_their_tensor_params_declared():
    with pytest.raises(pto.ParamError, match="njit=True needs shapes"):
        pto.kernel(njit=True)(lambda a: None)


@numba.njit(cache=True)
def _doublings(o, x, tasks, scale_id):
    for i in range(tasks):
        row = pj.narrow(x, 0, i % pj.shape(x, 0), i % pj.shape(x, 0) + 1)
        pj.submit(o, scale_id, (pj.input(row), pj.output(row)), (2.0,))


@pto.kernel(worker=pto.VECTOR)
def _fails(a):
    raise ValueError("a Python kernel among native tasks failed")


def test_failures_beside_native_workers_raise_and_leave_the_runtime_usable():
    """A Python task failing while native loops run raises its TaskError; an orchestration
    that raises after submitting still runs what it submitted (docs/ERRORS.md); then the same
    runtime runs natively again."""
    rt = pto.Runtime(backend="cpu", executor="parallel")
    x = np.ones((64, 4), np.float32)

    def kernel_fails(o):
        X = o.external(x)
        o.compiled(_doublings, X, 640, scale.id)
        o.submit(_fails, pto.inout(X[0:1]))
        o.compiled(_doublings, X, 640, scale.id)

    with pytest.raises(pto.TaskError, match="among native tasks failed"):
        rt.run(kernel_fails)

    def orchestration_fails(o):
        o.compiled(_doublings, o.external(x), 640, scale.id)
        raise KeyError("after submitting")

    x[...] = 1
    with pytest.raises(KeyError, match="after submitting"):
        rt.run(orchestration_fails)
    assert np.array_equal(x, np.full_like(x, 2.0 ** 10))  # each row doubled 10 times
    x[...] = 1
    result = rt.run(lambda o: o.compiled(_doublings, o.external(x), 640, scale.id))
    assert np.array_equal(x, np.full_like(x, 2.0 ** 10)) and result.native_tasks == 640


def test_the_compiled_tiled_matmul_runs_natively_with_the_python_bits():
    """Every task of the compiled tiled matmul, BLAS tiles included (kernels/blas.py), runs on
    native workers, with the bits of the Python orchestration on the serial executor."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((200, 130)).astype(np.float32)
    b = rng.standard_normal((130, 70)).astype(np.float32)
    by_python = np.zeros((200, 70), np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, by_python, 64)
    native = np.zeros((200, 70), np.float32)
    rt = pto.Runtime(backend="cpu", executor="parallel")
    rt.run(tiled_matmul_compiled, a, b, native, 64)  # the first run learns the entries
    native[...] = 0
    result = rt.run(tiled_matmul_compiled, a, b, native, 64)
    assert result.native_tasks == result.num_tasks == 4 * 2 * (2 + 3)
    assert native.tobytes() == by_python.tobytes()
    expected = a.astype(np.float64) @ b.astype(np.float64)
    # float32 sums of 130 products of unit normals: within 1e-5 of the largest entry
    assert np.abs(native - expected).max() <= 1e-5 * np.abs(expected).max()


def test_a_loop_returns_to_wake_a_sleeping_worker_soon_only_beside_a_free_core():
    """A loop that has made ready a task a sleeping worker could take (here, of another class)
    returns for the executor to wake it after WAKE_AFTER_NS while fewer workers take a core
    than the process has, and after SHARE_NS (a turn on a core) while every core runs one."""
    control = np.zeros(1, CONTROL)
    c = control[0]
    c["cores"], c["sleeping"][pto.VECTOR], c["tail"][pto.VECTOR] = 2, 1, 1  # a VECTOR task, its worker asleep

    def returns(busy: int, ran_ns: int) -> bool:
        c["busy"] = busy
        return bool(_time_to_return(c, int(pto.CUBE), 1, BUDGET, 0, ran_ns))

    assert not returns(1, WAKE_AFTER_NS - 1) and returns(1, WAKE_AFTER_NS)
    assert not returns(2, SHARE_NS - 1) and returns(2, SHARE_NS)
    c["sleeping"][pto.VECTOR] = 0  # its worker is awake: nothing to wake it for
    assert not returns(1, SHARE_NS)


def test_the_compiled_matmul_s_products_run_in_one_loop_on_a_process_of_one_core(monkeypatch):
    """The compiled tiled matmul's copies (ACCELERATOR) follow its products (CUBE): on a
    process of one core, the products' loop does not return to wake the copies' worker after
    each product chain, for it would only take turns on that core (a round trip through
    Python on both threads each time); the products run in one loop (two, where the CUBE
    worker woke before the zeros before them had all run: the 64 products of 64² tiles take
    well under SHARE_NS). The results are the serial executor's."""
    monkeypatch.setattr(parallel, "process_cores", lambda: 1)
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    serial = np.zeros((256, 256), np.float32)
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, b, serial, 64)
    loops: list[int] = []
    drain = NativeLanes.drain

    def counted(lanes, worker, scratch, budget):
        done = drain(lanes, worker, scratch, budget)
        if worker is pto.CUBE and done:
            loops.append(done)
        return done

    monkeypatch.setattr(NativeLanes, "drain", counted)
    rt = pto.Runtime(backend="cpu", executor="parallel")
    rt.run(tiled_matmul_compiled, a, b, np.zeros_like(a), 64)  # the first run learns the entries
    loops.clear()
    out = np.zeros_like(a)
    assert rt.run(tiled_matmul_compiled, a, b, out, 64).native_tasks == 4 * 4 * (2 + 4)
    assert out.tobytes() == serial.tobytes()
    assert sum(loops) == 4 * 4 * 4 and len(loops) <= 2, loops


def test_python_level_tasks_of_native_kernels_run_natively():
    """The Python tiled matmul (BLAS matmul tiles, generated zero and copy tasks) on a ring that
    fills: its tasks' arguments go in the argument tables, native workers run every one of
    them, bit for bit the serial run's."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((96, 80)).astype(np.float32), rng.standard_normal((80, 72)).astype(np.float32)

    def run(executor):
        c = np.zeros((96, 72), np.float32)
        runtime = pto.Runtime(backend="cpu", executor=executor, task_window=16)
        return c, runtime.run(tiled_matmul, a, b, c, tile=32)

    expected, _ = run("serial")
    for _ in range(2):  # the first run learns each instance's entry (test_native_workers_give_...)
        got, result = run("parallel")
        assert got.tobytes() == expected.tobytes()
    assert result.native_tasks == result.num_tasks == 9 * (2 + 3)
    reference = a.astype(np.float64) @ b
    # float32 sums of 80 products: well under 1e-5 of the largest entry
    assert np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()


def _scale_rows_python(o, x, y, factors):
    X, Y = o.external(x), o.external(y)
    for r, factor in enumerate(factors):
        o.submit(scale, pto.input(X[r:r + 1]), pto.output(Y[r:r + 1]), factor)


def test_python_level_scalars_run_natively_where_native_code_takes_them_as_given():
    """Python ints and floats (and numpy's 64-bit ones) go to native code as they are; others
    (float32, bools) run the Python way, which hands a hand-written kernel the value as
    passed: either way the serial results."""
    x = np.random.default_rng(6).standard_normal((6, 16)).astype(np.float32)
    factors = [0.5, np.float64(1.5), 2, np.float32(0.25), True, np.int64(3)]
    expected = np.zeros_like(x)
    pto.Runtime(backend="cpu", executor="serial").run(_scale_rows_python, x, expected, factors)
    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):
        y = np.zeros_like(x)
        result = rt.run(_scale_rows_python, x, y, factors)
        assert y.tobytes() == expected.tobytes()
    assert result.native_tasks == 4


def _raise_on_negative(o, x, kernel):
    X = o.external(x)
    for r in range(x.shape[0]):
        o.submit(kernel, pto.inout(X[r:r + 1]))


@pto.kernel(worker=pto.VECTOR, shapes=("m n",), njit=True)
def _checked_double(a):
    if a[0, 0] < 0:
        raise ValueError("a negative row")
    for j in range(a.shape[1]):
        a[0, j] *= 2


def test_python_level_tasks_of_hand_written_kernels_raise_their_exceptions():
    """A hand-written njit kernel may raise, which a native entry cannot report: from Python its
    tasks run the Python way and the run raises the TaskError, as the serial executor does."""
    rt = pto.Runtime(backend="cpu", executor="parallel")
    x = np.ones((8, 4))
    result = rt.run(_raise_on_negative, x, _checked_double)
    assert np.array_equal(x, np.full((8, 4), 2.0)) and result.native_tasks == 0
    x[5] = -1
    for executor in ("serial", "parallel"):
        with pytest.raises(pto.TaskError, match="a negative row"):
            pto.Runtime(backend="cpu", executor=executor).run(_raise_on_negative, x.copy(), _checked_double)


def test_a_kernel_writing_a_param_submitted_as_input_fails_after_an_entry_was_learnt():
    """The instance key says which tensors are written: an entry learnt with an output is not
    used for the same call with an input, which the Python way refuses (a read-only view)."""
    x = np.ones((4, 8), np.float32)

    def scale_into(o, out, kind):
        o.submit(scale, pto.input(o.external(x)), kind(o.external(out)), 2.0)

    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):  # the first learns the entry (if no earlier run has): the second runs it
        out = np.zeros_like(x)
        result = rt.run(scale_into, out, pto.output)
        assert np.array_equal(out, 2 * x)
    assert result.native_tasks == 1
    out = np.zeros_like(x)
    with pytest.raises(pto.TaskError, match="readonly array"):
        rt.run(scale_into, out, pto.input)
    assert not out.any()


def test_a_scalar_before_the_tensors_runs_the_python_way():
    """The native entry passes tensors first; a call with a scalar first fails the Python way
    (the kernel gets its params in order), as on the serial executor."""
    x, out = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)

    for executor in ("parallel", "serial", "parallel"):
        rt = pto.Runtime(backend="cpu", executor=executor)
        rt.run(lambda o: o.submit(scale, pto.input(o.external(x)), pto.output(o.external(out)), 2.0))
        with pytest.raises(pto.TaskError):
            rt.run(lambda o: o.submit(scale, 2.0, pto.input(o.external(x)), pto.output(o.external(out))))


def test_a_run_keeps_no_task_record_and_so_no_array_of_its_caller():
    """Native workers complete tasks without Python, leaving their records in the slots; the run
    drops them when it ends, and with them the last reference to the caller's arrays."""
    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):
        x = np.ones((32, 16), np.float32)
        result = rt.run(_scale_rows_python, x, np.zeros_like(x), [2.0] * 32)
        alive = weakref.ref(x)
        del x
        gc.collect()
        assert alive() is None and not any(rt._scheduler.records)
    assert result.native_tasks == 32


@pto.kernel(worker=pto.VECTOR, shapes=("a b c d e",), njit=True)
def _bump5(x):
    x += 1


def test_a_python_level_task_whose_arguments_do_not_fit_runs_on_a_python_worker():
    """Five dims are more than the argument tables hold (MAX_JIT_DIMS): the Python way runs it."""
    x = np.zeros((2, 1, 2, 1, 3))

    def orchestration(o):
        X = o.external(x)
        for _ in range(3):
            o.submit(_bump5, pto.inout(X))

    result = pto.Runtime(backend="cpu", executor="parallel").run(orchestration)
    assert np.array_equal(x, np.full_like(x, 3.0)) and result.native_tasks == 0


@numba.njit(cache=True)
def _checked_rows(o, x, kernel_id):
    for r in range(pj.shape(x, 0)):
        pj.submit(o, kernel_id, (pj.inout(pj.narrow(x, 0, r, r + 1)),))


def test_a_hand_written_kernel_raising_in_a_native_worker_fails_the_run():
    """An entry catches the exception (a cfunc cannot pass it on) and the native worker reports
    the task: the run raises its TaskError, and no task that depends on it runs."""
    def orchestration(o, x):
        X = o.external(x)
        o.compiled(_checked_rows, X, _checked_double.id)
        o.compiled(_checked_rows, X, _checked_double.id)  # each row again, after its first task

    rt = pto.Runtime(backend="cpu", executor="parallel")
    x = np.ones((8, 4))
    rt.run(orchestration, x)  # learns the entry
    x = np.ones((8, 4))
    assert rt.run(orchestration, x).native_tasks == 16 and np.array_equal(x, np.full((8, 4), 4.0))
    x[5] = -1
    with pytest.raises(pto.TaskError, match=r"task 5 \(_checked_double\) failed: .*inside a native worker"):
        rt.run(orchestration, x)
    assert np.array_equal(x[5], np.full(4, -1.0))  # its second task, which depends on it, never ran
    assert set(np.delete(x, 5, axis=0).ravel()) <= {4.0, 8.0, 16.0}  # the others ran or were stopped
    x = np.ones((8, 4))
    assert rt.run(orchestration, x).native_tasks == 16 and np.array_equal(x, np.full((8, 4), 4.0))


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "a b"), njit=True)
def _step(previous, out, clock):
    """out = previous + 1; clock = when it ran (CLOCK_MONOTONIC, ns)."""
    for j in range(out.shape[1]):
        out[0, j] = previous[0, j] + 1
    clock[0, 0] = monotonic_ns()


@numba.njit(cache=True)
def _two_chains(o, values, clocks, step_id):
    """A gate task (values row 0 -> 1), then two chains of three that each start from the
    gate's row: rows 2-4 and 5-7, each task reading the row before. Task i's clock: clocks[i]."""
    pj.submit(o, step_id, (pj.input(pj.narrow(values, 0, 0, 1)), pj.output(pj.narrow(values, 0, 1, 2)),
                           pj.output(pj.narrow(clocks, 0, 0, 1))))
    for chain in range(2):
        previous = 1
        for link in range(3):
            row = 2 + 3 * chain + link
            pj.submit(o, step_id, (pj.input(pj.narrow(values, 0, previous, previous + 1)),
                                   pj.output(pj.narrow(values, 0, row, row + 1)),
                                   pj.output(pj.narrow(clocks, 0, row - 1, row))))
            previous = row


def _orchestrate_two_chains(o, values, clocks):
    o.compiled(_two_chains, o.external(values), o.external(clocks), _step.id)


def test_a_worker_runs_next_the_consumer_its_completion_made_ready():
    """The gate's completion makes both chains ready; the one worker of their class follows the
    chain it started (its output is in that worker's cache) instead of the ready ring's order,
    which would alternate between the two."""
    rt = pto.Runtime(backend="cpu", workers={pto.VECTOR: 1})
    for _ in range(2):  # the first run learns the kernel's entry
        values, clocks = np.zeros((8, 4)), np.zeros((7, 1))
        result = rt.run(_orchestrate_two_chains, values, clocks)
    assert result.native_tasks == result.num_tasks == 7
    np.testing.assert_array_equal(values[:, 0], [0, 1, 2, 3, 4, 2, 3, 4])
    order = np.argsort(clocks[1:, 0], kind="stable").tolist()  # chain tasks: 0-2 one chain, 3-5 the other
    assert order in ([0, 1, 2, 3, 4, 5], [3, 4, 5, 0, 1, 2])


def test_a_run_does_not_take_the_arguments_a_runs_before_left_in_its_slots():
    """The runtime keeps its argument tables between runs, and task ids start at 0 in each: a
    task whose arguments do not fit the tables (a float32 scalar) must not pass for native
    with the arguments the last run's task of its id left there."""
    x = np.arange(32, dtype=np.float32).reshape(4, 8)

    def chain(o, a, b, c, factor):
        A, B, C = o.external(a), o.external(b), o.external(c)
        o.submit(scale, pto.input(A), pto.output(B), factor)
        o.submit(scale, pto.input(B), pto.output(C), factor)  # made ready by a completion

    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):  # the first learns the entry: the second runs both tasks natively
        earlier = [x, np.zeros_like(x), np.zeros_like(x)]
        result = rt.run(chain, *earlier, 2.0)
    assert result.native_tasks == 2 and np.array_equal(earlier[2], 4 * x)
    earlier[1][:] = earlier[2][:] = 0
    out = [x, np.zeros_like(x), np.zeros_like(x)]
    assert rt.run(chain, *out, np.float32(3.0)).native_tasks == 0
    assert np.array_equal(out[2], 9 * x) and not earlier[1].any() and not earlier[2].any()


def test_a_runtime_takes_at_each_run_the_entries_other_runtimes_learnt_since_its_last():
    """A runtime keeps its instance table between runs (native.Instances): what another
    runtime of the process learns enters at its next run, and what it learnt itself is
    entered once."""
    x = np.arange(6 * 41, dtype=np.float32).reshape(6, 41)  # rows of a shape no other test takes
    first, second = (pto.Runtime(backend="cpu", executor="parallel") for _ in range(2))
    second.run(_scale_rows_python, np.ones((6, 8), np.float32), np.zeros((6, 8), np.float32), [2.0] * 6)
    out = np.zeros_like(x)
    assert first.run(_scale_rows_python, x, out, [2.0] * 6).native_tasks < 6  # the first row learns
    entered = int(first._instances.filled[0])
    out = np.zeros_like(x)
    assert second.run(_scale_rows_python, x, out, [3.0] * 6).native_tasks == 6 and np.array_equal(out, 3 * x)
    assert first.run(_scale_rows_python, x, out, [2.0] * 6).native_tasks == 6 and np.array_equal(out, 2 * x)
    assert int(first._instances.filled[0]) == entered


@pytest.mark.parametrize(("window", "workers", "expected"),
                         [(1024, 1, 256), (1024, 2, 256), (1024, 4, 128), (1024, 16, 64), (64, 2, 64)])
def test_a_class_of_native_loops_reports_at_least_twice_a_task_window(window, workers, expected):
    """A loop reports its completions (and the orchestrator hears of room) after its budget of
    tasks: a class's loops together run at most half the window between reports, unless that
    is fewer than MIN_BUDGET each (a return costs as much as 64 tiny tasks)."""
    assert budget(window, workers) == expected
    assert workers * expected <= window // 2 or expected == MIN_BUDGET


def _scaled_sigmoid_program():
    """A kernel as a user writes it: out = sigmoid(alpha * x) over (at most) 4×16 windows,
    compiled from its `.pto` text."""
    m = isa.Module("user_kernels")
    (isa.FunctionBuilder("scaled_sigmoid", module=m).in_core()
        .memref("x", pto.FLOAT32, (4, 16)).memref("out", pto.FLOAT32, (4, 16)).scalar("alpha", pto.FLOAT32)
        .tile("t", 4, 16, pto.FLOAT32)
        .load("t", "x").muls("t", "t", "alpha").sigmoid("t", "t").store("out", "t").build())
    return isa.compile(isa.parse(isa.print_module(m)))


_USER_KERNEL = _scaled_sigmoid_program().kernels["scaled_sigmoid"]


@numba.njit(cache=True)
def _sigmoid_tiles(o, x, out, kernel_id):
    for r in range(0, pj.shape(x, 0), 4):  # the last row tile is a tail of 2
        for c in range(0, pj.shape(x, 1), 16):
            window = (pj.narrow(pj.narrow(x, 0, r, min(r + 4, pj.shape(x, 0))), 1, c, c + 16),
                      pj.narrow(pj.narrow(out, 0, r, min(r + 4, pj.shape(x, 0))), 1, c, c + 16))
            pj.submit(o, kernel_id, (pj.input(window[0]), pj.output(window[1])), (0.5 + c / 16,))


def _sigmoid_compiled(o, x, out):
    o.compiled(_sigmoid_tiles, o.external(x), o.external(out), _USER_KERNEL.id)


def _sigmoid_python(o, x, out):
    X, Out = o.external(x), o.external(out)
    for r in range(0, x.shape[0], 4):
        rows = slice(r, min(r + 4, x.shape[0]))
        for c in range(0, x.shape[1], 16):
            columns = slice(c, c + 16)
            o.submit(_USER_KERNEL, pto.input(X[rows, columns]), pto.output(Out[rows, columns]), 0.5 + c / 16)


@pytest.mark.parametrize("orchestration", [_sigmoid_compiled, _sigmoid_python], ids=["compiled", "python"])
def test_kernels_a_user_compiles_run_natively_with_the_serial_results(orchestration):
    """A kernel from isa.compile (here of .pto text) has native code like the library's: once
    its instance is learnt, every task of it runs on native workers, bit for bit the serial
    executor's, and within float32 rounding of numpy in float64."""
    x = np.random.default_rng(8).standard_normal((18, 48)).astype(np.float32)
    expected = np.zeros_like(x)
    pto.Runtime(backend="cpu", executor="serial").run(orchestration, x, expected)
    rt = pto.Runtime(backend="cpu", executor="parallel")
    for _ in range(2):  # the first run learns the instances (a full tile and the tail)
        out = np.zeros_like(x)
        result = rt.run(orchestration, x, out)
        assert out.tobytes() == expected.tobytes()
    assert result.native_tasks == result.num_tasks == 5 * 3
    alpha = 0.5 + np.arange(48) // 16
    reference = 1 / (1 + np.exp(-alpha * x.astype(np.float64)))
    # a product, an exp and a division in float32: a few ulps of values in (0, 1)
    np.testing.assert_allclose(out, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("orchestration", [_sigmoid_compiled, _sigmoid_python], ids=["compiled", "python"])
def test_a_compiled_kernel_refuses_an_element_type_its_memrefs_do_not_have(orchestration):
    """The memrefs fix the element types: float64 data for a float32 kernel is refused at
    submit, naming the memref, before any task runs (native code would read it as float32)."""
    x = np.ones((4, 16))
    out = np.zeros_like(x)
    refusal = r"scaled_sigmoid: tensor param 0 \(x\) must be FLOAT32, got FLOAT64"
    with pytest.raises(pto.ParamError, match=refusal):
        pto.Runtime(backend="cpu", executor="parallel").run(orchestration, x, out)
    assert not out.any()


def test_compiled_entries_type_their_arguments_as_numba_does():
    """native_call remembers numba's type of an array by what that type depends on (dtype,
    dimensions, layout, writability, alignment): each of these arrays, and a named tuple of
    them, gets numba's own type, whichever was typed before it (a key that missed one of them
    would hand a read-only or strided array the type of the first one it saw)."""
    from collections import namedtuple

    from pto_gpu.native_call import _typeof

    record = np.dtype([("id", np.int64), ("state", np.int32)], align=True)
    # numpy calls these two equal (their offsets agree); numba types them apart
    packed, aligned = (np.dtype([("a", np.int64), ("b", np.int64)], align=align) for align in (False, True))
    base = np.zeros((4, 6), np.int64)
    readonly = base.copy()
    readonly.flags.writeable = False
    unaligned = np.frombuffer(bytearray(8 * 6 + 1), np.int64, 6, offset=1)
    arrays = [base, base.T, base[:, ::2], readonly, base[0], base.astype(np.float32), unaligned,
              np.zeros(3, record), np.zeros(3, record)[0], np.zeros(2, packed), np.zeros(2, aligned),
              np.zeros(2, packed)[0], np.zeros(2, aligned)[0]]
    Pair = namedtuple("Pair", "left right")
    values = arrays + [Pair(base, readonly), Pair(readonly, base), (base, base.T)]
    for value in values + values[::-1]:
        assert _typeof(value) == numba.typeof(value), value
    distinct = [value for value in values if value is not unaligned]  # numba's type ignores alignment
    assert len({_typeof(value) for value in distinct}) == len(distinct)
