"""An orchestration that raises mid-run: every executor runs what was submitted before the
raise, then `run` raises the orchestration's own exception (docs/ERRORS.md), and the same
runtime goes on. Also validation mode's checks at every transition."""

import numba
import numpy as np
import pytest
from conftest import fill, runtime

import pto_gpu as pto
from pto_gpu import jit as pj

SUBMITTED = 31


class Planted(Exception):
    pass


def submit_then_raise(o, out):
    target = o.external(out)
    for i in range(SUBMITTED):
        o.submit(fill, pto.output(target[i:i + 1]), float(i + 1))
    raise Planted("the orchestration failed after submitting")


@numba.njit(cache=True)
def _submit_all(o, target, fill_id, count):
    for i in range(count):
        pj.submit(o, fill_id, (pj.output(pj.narrow(target, 0, i, i + 1)),), (float(i + 1),))


def compiled_then_raise(o, out):
    o.compiled(_submit_all, o.external(out), fill.id, SUBMITTED)  # fewer than a hand-over batch
    raise Planted("the orchestration failed after submitting")


@pytest.mark.parametrize("orchestration", [submit_then_raise, compiled_then_raise])
@pytest.mark.parametrize("threshold", [0, 4])
def test_what_was_submitted_before_a_raise_runs_on_every_executor(executor, threshold, orchestration):
    rt = runtime(executor, task_window=64)
    out = np.zeros(SUBMITTED + 1, np.float32)
    with pytest.raises(Planted):
        rt.run(orchestration, out, threshold=threshold)
    np.testing.assert_array_equal(out[:SUBMITTED], np.arange(1, SUBMITTED + 1))
    assert out[SUBMITTED] == 0
    # The same runtime runs the next orchestration from empty rings.
    again = np.zeros(4, np.float32)
    result = rt.run(lambda o: o.submit(fill, pto.output(o.external(again)), 3.0))
    assert result.num_tasks == 1
    np.testing.assert_array_equal(again, 3.0)


@pto.kernel(worker=pto.VECTOR)
def leave(out, how):
    raise (SystemExit(3) if how == 0 else KeyboardInterrupt())


@pytest.mark.parametrize("how", [0, 1], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_kernel_that_raises_what_is_not_an_exception_fails_the_run_on_every_executor(executor, how):
    """SystemExit and KeyboardInterrupt from a kernel are raised by `run` as they are (on the
    stream executor the stream's thread once died of them, and the run waited for ever), and
    the runtime runs again."""
    rt = runtime(executor, task_window=8)
    out = np.zeros(4, np.float32)

    def orchestration(o):
        target = o.external(out)
        o.submit(fill, pto.output(target[:2]), 1.0)
        o.submit(leave, pto.output(target), how)
        o.submit(fill, pto.output(target[2:]), 2.0)

    with pytest.raises(SystemExit if how == 0 else KeyboardInterrupt):
        rt.run(orchestration)
    again = np.zeros(4, np.float32)
    rt.run(lambda o: o.submit(fill, pto.output(o.external(again)), 3.0))
    np.testing.assert_array_equal(again, 3.0)

def corrupt_before(o, rt, step):
    """Corrupt the dep-list pool's count, then take one transition of kind `step`."""
    kept = o.alloc((4,))
    o.submit(fill, pto.output(kept), 1.0)
    rt._scheduler.state.head["dep_used"] += 1
    if step == "alloc":
        o.alloc((4,))
    else:
        o.free(kept)


@pytest.mark.parametrize("step, words", [("alloc", "after allocating heap buffer 1"),
                                         ("free", "after freeing heap buffer 0")])
def test_validation_checks_after_alloc_and_free(step, words):
    rt = pto.Runtime(backend="cpu", executor="serial", validate=True)
    with pytest.raises(pto.InvariantError, match=words):
        rt.run(corrupt_before, rt, step)


def test_validation_checks_when_a_worker_starts_a_task():
    rt = pto.Runtime(backend="cpu", executor="parallel", validate=True)
    out = np.zeros(4, np.float32)

    def orchestration(o):
        o.submit(fill, pto.output(o.external(out)), 1.0)
        # With threshold=0 nothing has started yet, so a worker's start is the next transition.
        rt._scheduler.state.head["dep_used"] += 1

    with pytest.raises(pto.InvariantError, match="after starting task 0: the dep-list pool"):
        rt.run(orchestration)
