"""Shared fixtures: small kernels whose results depend on every input, runtimes, and the
executor conformance suite: every test that should hold for each executor takes `executor`
(each one that runs kernels) or `graph_executor` (the dry executor too, for graph building);
hypothesis tests draw from the same lists."""

import numpy as np
import pytest

import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR)
def fill(out, value):
    out[...] = value


@pto.kernel(worker=pto.VECTOR)
def add_into(a, out):
    """out += a (inout)."""
    out += a


@pto.kernel(worker=pto.VECTOR)
def scale(a, out, factor):
    out[...] = a * factor


@pto.kernel(worker=pto.CUBE)
def mix(a, b, out):
    """out = 2a + b, over matching shapes: depends on both inputs."""
    out[...] = 2 * a + b


@pto.kernel(worker=pto.VECTOR)
def noop(*_):
    pass


@pto.kernel(worker=pto.VECTOR)
def explode(*_):
    raise ValueError("planted failure")


EXECUTORS = ["serial", "parallel", "stream"]  # every executor that runs kernels
CONCURRENT_EXECUTORS = ["parallel", "stream"]  # those that run kernels off the caller's thread
GRAPH_EXECUTORS = [*EXECUTORS, "dry"]  # every executor: each builds the same graph


@pytest.fixture(params=EXECUTORS)
def executor(request):
    return request.param


@pytest.fixture(params=GRAPH_EXECUTORS)
def graph_executor(request):
    return request.param


def running_workers(rt: pto.Runtime) -> int:
    """The runtime's parallel-executor threads still running a worker: none once a run has
    returned or raised (the threads stay, parked for the next run)."""
    return rt._threads.running()


def runtime(executor="serial", **kwargs) -> pto.Runtime:
    return pto.Runtime(backend="cpu", executor=executor, **kwargs)


def zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)
