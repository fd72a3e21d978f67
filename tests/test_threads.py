"""The runtime's worker threads (executors/threads.py): a job goes to a live thread whose last
job has returned, else to a new one; a thread whose job raised, or that a fork left behind,
gets no more."""

import os
import signal
import threading

import numpy as np
import pytest
from conftest import fill, runtime, zeros

import pto_gpu as pto
from pto_gpu.executors.threads import WorkerThreads


def test_a_job_goes_to_a_free_thread_and_never_to_one_whose_job_raised(monkeypatch):
    threads = WorkerThreads()
    ran_on = []
    started, release = threading.Event(), threading.Event()

    def note(wait=False):
        ran_on.append(threading.get_ident())
        if wait:
            started.set()
            release.wait()

    busy = threads.start("busy", note, (True,))
    assert started.wait(5)  # (on a loaded machine the next job could otherwise run first)
    assert threads.start("beside", note, ()).wait(5)
    assert ran_on[0] != ran_on[1] and threads.running() == 1  # the first thread is still busy
    release.set()
    assert busy.wait(5)
    for _ in range(4):  # every later job runs on one of the two threads
        assert threads.start("again", note, ()).wait(5)
    assert set(ran_on) == set(ran_on[:2]) and threads.running() == 0

    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the raise is this test's

    def explode():
        ran_on.append(threading.get_ident())
        raise RuntimeError("a bug in a worker")

    assert threads.start("raises", explode, ()).wait(5)  # set, so a run's shutdown does not hang
    broken = ran_on[-1]
    for _ in range(3):
        assert threads.start("after", note, ()).wait(5)
    assert broken not in ran_on[-3:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_runs_in_parallel_on_threads_of_its_own():
    rt = runtime("parallel")
    out = zeros(2)
    rt.run(lambda o: o.submit(fill, pto.output(o.external(out)), 1.0))  # its threads are parked now
    pid = os.fork()
    if pid == 0:  # the child: none of the parent's threads is here
        signal.alarm(30)  # a run waiting on them would hang: SIGALRM ends the child instead
        try:
            rt.run(lambda o: o.submit(fill, pto.output(o.external(out)), 2.0))
            os._exit(0 if np.all(out == 2.0) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(out, 1.0)  # the child's memory is its own
