"""Validation mode: every scheduler invariant is checked after every transition."""

import numpy as np
import pytest
from conftest import add_into, fill, noop

import pto_gpu as pto


def corrupting(corrupt):
    """An orchestration that builds a little live state, corrupts it, then submits once more."""
    def orch(o, rt):
        t = o.alloc((4,))
        o.submit(fill, pto.output(t), 1.0)
        o.submit(add_into, pto.input(t), pto.inout(o.external(np.zeros(4, np.float32))))
        corrupt(rt._scheduler.state)
        o.submit(noop, pto.input(t))
        o.free(t)
    return orch


@pytest.mark.parametrize("corrupt, message", [
    (lambda s: s.head.__setitem__("dep_used", s.head["dep_used"] + 1), "dep-list pool"),
    (lambda s: s.buffers["refs"].__setitem__(0, 7), "refcount differs"),
    (lambda s: s.head.__setitem__("tm_used", 0), "TensorMap's used count"),
    (lambda s: s.head.__setitem__("heap_tail", s.head["heap_head"] + 64), "heap ring"),
])
def test_validation_catches_corrupted_state(corrupt, message):
    rt = pto.Runtime(backend="cpu", executor="serial", validate=True)
    with pytest.raises(pto.PTOError, match=message):
        rt.run(corrupting(corrupt), rt)


def test_validation_off_does_not_check():
    rt = pto.Runtime(backend="cpu", executor="serial", validate=False)
    rt.run(corrupting(lambda s: s.head.__setitem__("tm_used", s.head["tm_used"] + 1)), rt)


def test_validation_env_var(monkeypatch):
    monkeypatch.setenv("PTO_VALIDATE", "1")
    rt = pto.Runtime(backend="cpu", executor="parallel")
    with pytest.raises(pto.PTOError, match="dep-list pool|fanin count"):
        rt.run(corrupting(lambda s: s.head.__setitem__("dep_used", 5)), rt, threshold=1)
