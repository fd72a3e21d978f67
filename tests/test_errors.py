"""The misuse catalogue: every way to misuse the API that we know of, and the error it gives.

Each case is one test, which then runs a task on every Runtime the misuse touched, to show
that it stays usable. docs/ERRORS.md is generated from the same list with the messages the
cases actually raise (`python tests/test_errors.py > docs/ERRORS.md`), and a test fails when
it drifts.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from collections.abc import Callable

import numba
import numpy as np
import pytest
from pto_gpu.kernels.elementwise import add
from pto_gpu.kernels.tiles import matmul

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu import jit as pj


@pto.kernel(worker=pto.VECTOR)
def _noop(*_):
    pass


@pto.kernel(worker=pto.VECTOR)
def _writes_its_input(a):
    a[...] = 1


@pto.kernel(worker=pto.VECTOR)
def _raises(*_):
    raise RuntimeError("kernel bug")


@pto.kernel(worker=pto.VECTOR)
def _fill(out, value):
    out[...] = value


@dataclasses.dataclass
class Case:
    what: str
    trigger: Callable[[list], object]  # given a list, to which it adds every Runtime it makes
    error: type
    note: str = ""


def _fill_external(o, out, value):
    o.submit(_fill, pto.output(o.external(out)), value)


class _OneRank:
    """What a DistArray asks of an mpi4py communicator to be made: rank 0 of `size`."""

    def __init__(self, size: int = 1):
        self.size = size

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's spelling)
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return self.size


def runtime(made: list, **config) -> pto.Runtime:
    made.append(rt := pto.Runtime(backend="cpu", **config))
    return rt


def run(orch, executor="serial", **config):
    return lambda made: runtime(made, executor=executor, **config).run(orch)


def _float_after_int(o):
    tensor = o.external(np.zeros((3, 4)))
    assert tensor[1].shape == (4,)
    return tensor[1.0]


def alloc_then(action):
    def orch(o):
        action(o, o.alloc((4, 4)))
    return orch


def freed(o, t):
    o.free(t)
    return t


class _GpuArray:
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


_ROW_SUM = """// PTO Module: errors
// Function Type: InCore
func @row_sum(%x: !pto.memref<f32, 4x8>, %out: !pto.memref<f32, 4x1>) {
  %t = alloc_tile : !pto.tile<4x8xf32>
  %s = alloc_tile : !pto.tile<4x1xf32>
  %t = tload %x[0, 0]
  %s = trowsum %t
  tstore %s, %out[0, 0]
}
"""


@functools.cache
def _row_sum() -> pto.Kernel:
    """A kernel a user compiled from .pto text: 4x8 float32 windows (row tails only)."""
    return isa.compile(isa.parse(_ROW_SUM)).kernels["row_sum"]


def _submit_row_sum(x):
    return run(lambda o: o.submit(_row_sum(), pto.input(o.external(x)), pto.output(o.alloc((4, 1)))))


def _leak_orchestrator(made):
    kept = {}
    runtime(made).run(lambda o: kept.update(o=o))
    kept["o"].alloc((4,))


def _tensor_from_another_run(made):
    kept = {}
    rt = runtime(made)
    rt.run(lambda o: kept.update(t=o.alloc((4,))))
    rt.run(lambda o: o.submit(_noop, pto.input(kept["t"])))


def _nested_run(made):
    rt = runtime(made)
    rt.run(lambda o: rt.run(lambda o2: None))


def _hoard(o):
    for t in [o.alloc((256,)) for _ in range(10)]:
        o.submit(_noop, pto.output(t))


def _pinned(o):
    o.alloc((16,))
    for _ in range(20):
        t = o.alloc((256,))
        o.submit(_noop, pto.output(t))
        o.free(t)


CASES = [
    Case("use after free", run(alloc_then(lambda o, t: o.submit(_noop, pto.input(freed(o, t))))),
         pto.UseAfterFreeError),
    Case("double free", run(alloc_then(lambda o, t: o.free(freed(o, t)))), pto.DoubleFreeError),
    Case("freeing an external", run(lambda o: o.free(o.external(np.zeros(4)))), pto.LifecycleError),
    Case("freeing something that is not a tensor", run(lambda o: o.free(np.zeros(4))), pto.ParamError),
    Case("stale version", run(alloc_then(lambda o, t: (o.submit(_noop, pto.output(o.version_inc(t))),
                                                      o.submit(_noop, pto.input(t))))),
         pto.StaleVersionError),
    Case("version_inc twice on one handle",
         run(alloc_then(lambda o, t: (o.version_inc(t), o.version_inc(t)))),
         pto.StaleVersionError, "versions are single-assignment"),
    Case("raw array as a param", run(lambda o: o.submit(_noop, np.zeros(4))), pto.ParamError),
    Case("tensor without a direction", run(alloc_then(lambda o, t: o.submit(_noop, t))), pto.ParamError),
    Case("raw array in pto.input()", lambda made: pto.input(np.zeros(4)), pto.ParamError),
    Case("non-number scalar", lambda made: pto.scalar("3"), pto.ParamError),
    Case("submitting a plain function", run(lambda o: o.submit(print)), pto.ParamError),
    Case("wrong shapes for a kernel", run(lambda o: o.submit(
        matmul, pto.input(o.alloc((4, 8))), pto.input(o.alloc((7, 8))), pto.output(o.alloc((4, 8))))),
         pto.ParamError),
    Case("wrong dtype for a kernel", run(lambda o: o.submit(
        matmul, pto.input(o.alloc((4, 8))), pto.input(o.alloc((8, 2), pto.FLOAT16)),
        pto.output(o.alloc((4, 2))))), pto.ParamError),
    Case("wrong number of tensor params", run(lambda o: o.submit(
        matmul, pto.input(o.alloc((4, 8))), pto.output(o.alloc((4, 8))))), pto.ParamError),
    Case("a kernel shape word that is no dim", lambda made: pto.kernel(shapes=("m <=0",)), pto.ParamError),
    Case("more than 16 tensor params", run(alloc_then(
        lambda o, t: o.submit(_noop, *[pto.input(t)] * 17))), pto.ParamError),
    Case("out-of-bounds slice", run(alloc_then(lambda o, t: t[0:5])), pto.LayoutError),
    Case("out-of-bounds index", run(alloc_then(lambda o, t: t[4])), pto.LayoutError),
    Case("more indices than dims", run(alloc_then(lambda o, t: t[0, 0, 0])), pto.LayoutError),
    Case("negative slice step", run(alloc_then(lambda o, t: t[::-1])), pto.LayoutError,
         "descriptors hold non-negative strides"),
    Case("reshape that needs a copy", run(alloc_then(lambda o, t: t[:, :2].reshape(8))), pto.LayoutError),
    Case("transpose with bad axes", run(alloc_then(lambda o, t: t.transpose(0, 0))), pto.LayoutError),
    Case("unknown dtype", run(lambda o: o.alloc((4,), np.str_)), pto.PTOError),
    Case("complex dtype", run(lambda o: o.alloc((4,), np.complex64)), pto.PTOError),
    Case("negative alloc shape", run(lambda o: o.alloc((4, -1))), pto.LayoutError),
    Case("alloc larger than the heap", run(lambda o: o.alloc((2048,)), heap_bytes=4096), pto.DeadlockError),
    Case("heap too small for the buffers kept live", run(_hoard, heap_bytes=4096, executor="parallel"),
         pto.DeadlockError),
    Case("long-lived buffer pinning the heap ring", run(_pinned, heap_bytes=4096), pto.DeadlockError,
         "the heap reclaims in allocation order"),
    Case("buffer table too small", run(lambda o: [o.alloc((4,)) for _ in range(3)], buffer_window=2),
         pto.DeadlockError),
    Case("TensorMap pool too small for one task", run(
        alloc_then(lambda o, t: o.submit(_noop, *[pto.input(t[i]) for i in range(4)], pto.output(t))),
        tensormap_entries=4), pto.DeadlockError,
         "a recording run (record=True) grows the pool instead"),
    Case("external that is not an array", run(lambda o: o.external([1.0, 2.0])), pto.PTOError),
    Case("GPU array on the CPU backend", run(lambda o: o.external(_GpuArray())), pto.PTOError),
    Case("external with negative strides", run(lambda o: o.external(np.zeros(8)[::-1])), pto.LayoutError),
    Case("a complex scalar", run(lambda o: o.submit(_noop, pto.output(o.external(np.zeros(4))), 2 + 3j)),
         pto.ParamError, "the CUDA backend once took its real part"),
    Case("a boolean index", run(lambda o: o.external(np.zeros((3, 4)))[True]), pto.LayoutError,
         "numpy's True adds an axis; it was taken as row 1"),
    Case("a list index", run(lambda o: o.external(np.zeros((3, 4)))[[0, 1]]), pto.LayoutError),
    Case("a float index after the int of its value", run(_float_after_int), pto.LayoutError,
         "the remembered slice of X[1] once answered X[1.0]"),
    Case("read-only array as an output", run(lambda o: o.submit(
        _noop, pto.output(o.external(np.frombuffer(bytes(32)))))), pto.ParamError),
    Case("broadcast view as an output", run(lambda o: o.submit(_noop, pto.inout(o.external(
        np.lib.stride_tricks.as_strided(np.zeros(4), (3, 4), (0, 8)))))), pto.ParamError,
         "a writeable stride-0 view; np.broadcast_to's are read-only and refused as such"),
    Case("an output sharing memory with another param of a generated kernel", run(alloc_then(
        lambda o, t: o.submit(matmul, pto.input(t), pto.input(t), pto.output(t)))), pto.ParamError,
         "generated code has its own order of reads and writes on each backend; an element-wise kernel "
         "may take the very view it writes as an input"),
    Case("an update in place through another view", run(alloc_then(
        lambda o, t: o.submit(add, pto.input(t.T), pto.input(t), pto.output(t)))), pto.ParamError),
    Case("orchestrator used after its run", _leak_orchestrator, pto.UsageError),
    Case("tensor from another run", _tensor_from_another_run, pto.UsageError),
    Case("nested runs", _nested_run, pto.UsageError),
    Case("kernel writing an input-only param", run(
        lambda o: o.submit(_writes_its_input, pto.input(o.external(np.zeros(4))))), pto.TaskError,
         "inputs reach kernels as read-only views"),
    Case("kernel that raises", run(lambda o: o.submit(_raises)), pto.TaskError,
         "the original exception is chained; dependents never run"),
    Case("task window not a power of two", lambda made: runtime(made, task_window=6), pto.PTOError),
    Case("unknown executor", lambda made: runtime(made, executor="gpu"), pto.PTOError),
    Case("unknown backend", lambda made: pto.Runtime(backend="tpu"), pto.PTOError),
    Case("emulate= on a backend other than the CUDA emulator",
         lambda made: pto.Runtime(backend="cpu", emulate="cpu-code"), pto.PTOError),
    Case("unknown emulate= mode", lambda made: pto.Runtime(backend="cuda-emulated", emulate="fast"),
         pto.PTOError),
    Case("more streams than the stream executor on a CUDA driver takes", lambda made: pto.Runtime(
        backend="cuda-emulated", executor="stream", workers={pto.CUBE: 9, pto.VECTOR: 9}).run(lambda o: None),
         pto.UsageError),
    Case("the persistent executor without CUDA",
         lambda made: pto.Runtime(backend="cpu", executor="persistent"), pto.PTOError),
    Case("a worker class with no workers", lambda made: runtime(made, workers={pto.CUBE: 0}), pto.PTOError),
    Case("workers= naming no worker class", lambda made: runtime(made, workers={"TENSOR": 2}), pto.PTOError),
    Case("negative threshold", lambda made: runtime(made).run(lambda o: None, threshold=-1), pto.PTOError),
    Case("schedule on an executor that does not follow one", lambda made: runtime(
        made, executor="serial").run(lambda o: None, schedule=pto.Schedule()), pto.PTOError),
    Case("unknown schedule order", lambda made: pto.Schedule(order_by="lifo"), pto.PTOError),
    Case("tag that is neither an int nor a str", run(lambda o: o.tags(batch=0.5).__enter__()), pto.PTOError),
    Case("owner out of range", run(lambda o: o.external(np.zeros(4), owner=1)), pto.RankError,
         "one process is rank 0 of 1"),
    Case("a distribution over more ranks than the run",
         run(lambda o: o.alloc((4, 4), owner=pto.block_rows(2))), pto.RankError),
    Case("owner that is neither a rank nor a distribution", run(lambda o: o.external(np.zeros(4), owner="0")),
         pto.RankError),
    Case("a distribution over no ranks", lambda made: pto.block_cyclic(4, 0), pto.RankError),
    Case("a process grid that is not (P, Q)", lambda made: pto.block_cyclic_2d(64, 64, grid=(4,)),
         pto.RankError),
    Case("blocks of a matrix for a 3-d tensor",
         run(lambda o: o.external(np.zeros((2, 4, 4)), owner=pto.block_cyclic_2d(2, 2, grid=(1, 1)))),
         pto.RankError),
    Case("a DistArray over more ranks than its communicator",
         lambda made: pto.DistArray((8, 2), np.float32, pto.block_rows(4), _OneRank()), pto.RankError),
    Case("a DistArray of another communicator size",
         run(lambda o: o.external(pto.DistArray((8, 2), np.float32, 0, _OneRank(size=2)))), pto.RankError),
    Case("rank= out of range", run(alloc_then(lambda o, t: o.submit(_noop, pto.output(t), rank=2))),
         pto.RankError),
    Case("on_rank out of range", run(lambda o: o.on_rank(-1).__enter__()), pto.RankError),
    Case("a distributed run on an executor that cannot run one",
         lambda made: pto.Runtime(backend="cpu", executor="stream", comm=object()), pto.PTOError),
    Case("transport='nccl' with one ACCELERATOR worker",
         lambda made: pto.Runtime(backend="cpu", comm=object(), transport="nccl",
                                  workers={pto.ACCELERATOR: 1}),
         pto.PTOError),
    Case("a distributed run on the CUDA emulator",
         lambda made: pto.Runtime(backend="cuda-emulated", comm=object()), pto.PTOError),
    Case("unknown transport", lambda made: pto.Runtime(backend="cpu", comm=object(), transport="tcp"),
         pto.PTOError),
    Case("unknown precision", lambda made: pto.Runtime(backend="cpu", precision="fp8"), pto.PTOError),
    Case("tier limits that do not increase", lambda made: pto.tiers([(8, _noop), (4, _noop)]),
         pto.ParamError),
    Case("a worker class named twice", lambda made: pto.kernel(worker=(pto.CUBE, pto.CUBE))(_noop),
         pto.ParamError),
    Case("running a kernel as an orchestration", lambda made: runtime(made).run(_row_sum(), np.zeros((4, 8))),
         pto.PTOError, "a kernel is callable on arrays, and an orchestration submits it"),
    Case("a compiled kernel given another element type than its memref's", _submit_row_sum(np.zeros((4, 8))),
         pto.ParamError),
    Case("a column tail for a function that does not declare column_tails",
         _submit_row_sum(np.zeros((4, 6), np.float32)), pto.ParamError,
         "a row tail is taken: fewer rows than declared"),
    Case("a direct kernel call on a window larger than its memref", lambda made: _row_sum()(
        np.zeros((8, 8), np.float32), np.zeros((8, 1), np.float32)), pto.ParamError),
    Case("interpreting a function on a window larger than its memref", lambda made: isa.interpret.run(
        isa.parse(_ROW_SUM), "row_sum", np.zeros((4, 9)), np.zeros((4, 1))), isa.ISAError),
    Case("an unknown instruction in .pto text", lambda made: isa.parse(
        _ROW_SUM.replace("trowsum", "trowsums")), isa.ISAError, "parse errors carry line:column"),
    Case("a tile read before any instruction writes it", lambda made: isa.parse(
        _ROW_SUM.replace("  %t = tload %x[0, 0]\n", "")), isa.ISAError, "so do the verifier's"),
    Case("column_tails on an Orchestration", lambda made: isa.FunctionBuilder("f").not_in_core()
         .column_tails().build(), isa.ISAError),
    Case("tf32 on a function of float16 memrefs", lambda made: isa.FunctionBuilder("f").in_core().tf32()
         .memref("m", pto.FLOAT16, (8, 8)).build(), isa.ISAError),
    Case("costs per class that miss one of the kernel's classes", lambda made: pto.kernel(
        worker=(pto.CUBE, pto.VECTOR), cost={pto.CUBE: _noop})(_noop), pto.ParamError),
]


def message_of(case: Case, made: list) -> str:
    with pytest.raises(case.error) as info:
        case.trigger(made)
    return str(info.value)


def normalised(message: str) -> str:
    """Addresses vary between runs; the rest of a message does not."""
    return re.sub(r"0x[0-9a-f]+", "0x…", message)


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_misuse_gives_a_clear_error_and_the_runtime_stays_usable(case):
    made: list[pto.Runtime] = []
    message = message_of(case, made)
    assert len(message) > 20
    # A misuse refused before any Runtime exists (a bad configuration, a param built outside a
    # run) leaves none to reuse; every other one must run the next orchestration correctly.
    for value, rt in enumerate(made, start=1):
        out = np.zeros(2)
        rt.run(_fill_external, out, value)
        np.testing.assert_array_equal(out, value)


def render() -> str:
    rows = ["# Misuse catalogue", "",
            "Every way to misuse the API that the tests know of, and the exact error it gives.",
            "Generated by `python tests/test_errors.py > docs/ERRORS.md`; "
            "`tests/test_errors.py` fails if this file drifts. Addresses are shown as `0x…`.", "",
            "| # | misuse | error | message |", "|---|---|---|---|"]
    notes = ["", "## When the orchestration raises", "",
             "Every executor first runs the tasks submitted before the raise (unless one of them fails; "
             "then no task that depends on it runs), then `run` raises the orchestration's own exception "
             "and the runtime is ready for the next run. The serial executor does this by construction "
             "(each task runs at submission) and a GPU cannot do otherwise (enqueued kernels run), so "
             "the parallel executor drains its queues and a compiled body hands over what it logged. "
             "Kernel failures are different: `run` raises the failed task's `TaskError` (rows above)."]
    for number, case in enumerate(CASES, 1):
        message = normalised(message_of(case, [])).replace("|", "\\|").replace("\n", " ")
        note = f" ({case.note})" if case.note else ""
        rows.append(f"| {number} | {case.what}{note} | `{case.error.__name__}` | {message} |")
    return "\n".join(rows + notes) + "\n"


def test_errors_doc_is_current():
    doc = pathlib.Path(__file__).parent.parent / "docs" / "ERRORS.md"
    assert doc.read_text() == render(), "regenerate with: python tests/test_errors.py > docs/ERRORS.md"


def test_worker_classes_are_named_by_class_value_or_name():
    rt = pto.Runtime(backend="cpu", workers={"VECTOR": 1, 0: 3, pto.AI_CPU: np.int64(2)})
    assert (rt.workers[pto.VECTOR], rt.workers[pto.CUBE], rt.workers[pto.AI_CPU]) == (1, 3, 2)



@numba.njit(cache=True)
def _write_empty(o, out, kernel_id):
    pj.submit(o, kernel_id, (pj.output(out),))


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
def test_an_empty_array_is_an_output_though_numpy_gives_it_stride_0(compiled):
    """numpy gives np.zeros((0, 8)) strides (0, 0): with no element, nothing is written over
    itself, so it is not refused as a broadcast view (it was, naming its 8 positions)."""
    out = np.zeros((0, 8), np.float32)
    assert 0 in out.strides

    def orchestration(o):
        if compiled:
            o.compiled(_write_empty, o.external(out), _noop.id)
        else:
            o.submit(_noop, pto.output(o.external(out)))
    assert pto.Runtime(backend="cpu").run(orchestration).num_tasks == 1


@pytest.mark.parametrize("backend", ["cpu", "cuda-emulated"])
def test_a_real_scalar_of_another_kind_is_taken_as_the_number_it_equals(backend):
    """A Fraction reached the CPU's kernels as an object they could not type, and the CUDA
    backend's as a float: both take it as the float it equals."""
    from fractions import Fraction

    from pto_gpu.kernels.elementwise import scale

    rt = pto.Runtime(backend=backend)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = rt.backend.to_device(np.zeros((2, 4), np.float32))
    rt.run(lambda o: o.submit(scale, pto.input(o.external(x)), pto.output(o.external(out)), Fraction(3, 4)))
    np.testing.assert_array_equal(rt.backend.to_host(out), x * np.float32(0.75))

if __name__ == "__main__":
    print(render(), end="")
