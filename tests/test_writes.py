"""What a task may write, from Python and from compiled code: outputs must be writeable memory
that is not a broadcast view, and a version has exactly one successor (spec 000 §6)."""

import re

import numba
import numpy as np
import pytest
from conftest import add_into, fill, runtime

import pto_gpu as pto
from pto_gpu import jit as pj


def read_only(shape=(4,)):
    array = np.zeros(shape, np.float32)
    array.flags.writeable = False
    return array


@pytest.mark.parametrize("make, kind, words", [
    (read_only, pto.output, "is read-only memory and cannot be an output"),
    (read_only, pto.inout, "is read-only memory and cannot be an output"),
    (lambda: np.broadcast_to(np.zeros(1, np.float32), (4,)), pto.output, "dim 0 has stride 0"),
    (lambda: np.broadcast_to(np.zeros((1, 4), np.float32), (3, 4)), pto.inout, "dim 0 has stride 0"),
])
def test_an_output_the_kernel_cannot_write_is_refused_at_submit(make, kind, words):
    rt = runtime("serial")
    target = make()
    before = target.copy()

    def orchestration(o):
        o.submit(fill, kind(o.external(target)), 5.0)

    with pytest.raises(pto.ParamError, match=f"param 0 of fill: .*{re.escape(words)}"):
        rt.run(orchestration)
    np.testing.assert_array_equal(target, before)


def test_read_only_and_broadcast_arrays_are_fine_as_inputs():
    source = np.broadcast_to(np.arange(4, dtype=np.float32), (3, 4))  # read-only and stride 0
    out = np.zeros((3, 4), np.float32)
    runtime("serial").run(lambda o: o.submit(add_into, pto.input(o.external(source)),
                                             pto.inout(o.external(out))))
    np.testing.assert_array_equal(out, source)


@numba.njit(cache=True)
def _write_into(o, target, fill_id):
    pj.submit(o, fill_id, (pj.output(target),), (5.0,))


@pytest.mark.parametrize("make, words", [
    (read_only, "param 0 of fill: Buffer(external #-1"),
    (lambda: np.broadcast_to(np.zeros(1, np.float32), (4,)), "param 0 of fill: dim 0 has stride 0"),
])
def test_compiled_code_refuses_the_same_outputs(make, words):
    target = make()

    def orchestration(o):
        o.compiled(_write_into, o.external(target), fill.id)

    with pytest.raises(pto.ParamError, match=re.escape(words)):
        runtime("serial").run(orchestration)


def test_version_inc_twice_on_one_handle_is_refused():
    def orchestration(o):
        t = o.alloc((4,))
        o.version_inc(t)
        o.version_inc(t)

    with pytest.raises(pto.StaleVersionError, match="version 0 of Buffer.* already has a successor"):
        runtime("serial").run(orchestration)


def test_version_inc_chains_from_the_newest_handle():
    out = np.zeros(4, np.float32)

    def orchestration(o):
        t = o.external(out)
        v1 = o.version_inc(t)
        o.submit(fill, pto.output(v1), 1.0)
        v2 = o.version_inc(v1)
        o.submit(add_into, pto.input(v1), pto.output(v2))  # reads v1 and writes v2 in one task

    runtime("serial").run(orchestration)
    np.testing.assert_array_equal(out, 2.0)


@numba.njit(cache=True)
def _increment(o, t, times):
    for _ in range(times):
        pj.version_inc(o, t)


@pytest.mark.parametrize("python_first", [False, True])
def test_compiled_version_inc_twice_is_refused_and_crosses_to_python(python_first):
    def orchestration(o):
        t = o.alloc((4,))
        if python_first:
            o.version_inc(t)
            o.compiled(_increment, t, 1)
        else:
            o.compiled(_increment, t, 1)
            o.version_inc(t)

    taken = r"version 0 of Buffer\(heap #0.* already has a successor"
    with pytest.raises(pto.StaleVersionError, match=taken):
        runtime("serial").run(orchestration)
    with pytest.raises(pto.StaleVersionError, match="version 1 exists"):
        runtime("serial").run(lambda o: o.compiled(_increment, o.alloc((4,)), 2))
