"""Results do not depend on the executor or on the machine's BLAS: every executor runs kernels
with one BLAS thread, so OpenBLAS sums in the same order on each (its Haswell kernels sum in
another order with two threads). Checked in fresh processes, since OPENBLAS_CORETYPE is read
when OpenBLAS loads: under the Haswell core type and under the machine's own, the sparse
attention's schedules and a BLAS-heavy tiled Cholesky on every executor, bitwise equal to the
serial executor."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import pto_gpu as pto

PROGRAM = textwrap.dedent("""
    import numpy as np
    import pto_gpu as pto
    from pto_gpu.orchestration.sparse_attention import (
        SCHEDULES, run_sparse_attention, sparse_attention_inputs)

    @pto.kernel(worker=pto.CUBE)
    def potrf(a):
        a[...] = np.linalg.cholesky(a)

    @pto.kernel(worker=pto.CUBE)
    def trsm(l, a):  # a = a l^-T
        a[...] = np.linalg.solve(l, a.T).T

    @pto.kernel(worker=pto.CUBE)
    def gemm_sub(a, b, c):  # c -= a b^T
        c -= a @ b.T

    def cholesky(o, a, tile):
        A = o.external(a)
        n = a.shape[0] // tile
        t = lambda i, j: A[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile]
        for k in range(n):
            o.submit(potrf, pto.inout(t(k, k)))
            for i in range(k + 1, n):
                o.submit(trsm, pto.input(t(k, k)), pto.inout(t(i, k)))
            for i in range(k + 1, n):
                for j in range(k + 1, i + 1):
                    o.submit(gemm_sub, pto.input(t(i, k)), pto.input(t(j, k)), pto.inout(t(i, j)))

    def spd(n):
        m = np.random.default_rng(1).standard_normal((n, n))
        return m @ m.T + n * np.eye(n)

    workers = {pto.CUBE: 2, pto.VECTOR: 2, pto.ACCELERATOR: 1, pto.AI_CPU: 1}
    results = {}
    for executor in ("serial", "parallel", "stream"):
        a = spd(768)
        pto.Runtime(backend="cpu", executor=executor, workers=workers).run(cholesky, a, 192)
        results[("cholesky", executor)] = np.tril(a).tobytes()
        for name, schedule in SCHEDULES.items():
            inputs = sparse_attention_inputs([64, 256, 96, 192])
            rt = pto.Runtime(backend="cpu", executor=executor, workers=workers)
            run_sparse_attention(rt, inputs, schedule=schedule if executor == "parallel" else None)
            results[(name, executor)] = b"".join(x.tobytes() for x in inputs.out + inputs.chosen)
    a = spd(768)
    rt = pto.Runtime(backend="cpu")
    rt.capture(cholesky, a, 192).replay()
    results[("cholesky", "replay")] = np.tril(a).tobytes()
    differ = sorted(f"{w} on {e}" for (w, e), got in results.items()
                    if e != "serial" and got != results[(w if w == "cholesky" else "default", "serial")])
    print("differ:", ", ".join(differ) or "none")
""")


def _run(coretype: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS",
                                                             "OPENBLAS_NUM_THREADS")}
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("coretype", ["Haswell", None], ids=["haswell", "machine-default"])
def test_every_executor_gives_the_serial_result_under_any_blas_kernel(coretype):
    assert _run(coretype) == "differ: none"


def _blas_threads() -> dict[str, int]:
    return {pool["filepath"]: pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


SEEN: list[dict[str, int]] = []  # each gemm task's BLAS thread counts, as it ran


@pto.kernel(worker=pto.CUBE)
def counted_gemm(a, c):
    SEEN.append(_blas_threads())
    c[...] = a @ a


def test_kernels_run_with_one_blas_thread_and_the_callers_setting_comes_back():
    def product(o, a, c):
        o.submit(counted_gemm, pto.input(o.external(a)), pto.output(o.external(c)))

    before = _blas_threads()
    assert before, "threadpoolctl finds no BLAS: nothing here would be checked"
    a, c = np.ones((64, 64)), np.zeros((64, 64))
    for executor in ("serial", "parallel", "stream"):
        SEEN.clear()
        pto.Runtime(backend="cpu", executor=executor).run(product, a, c)
        assert SEEN and all(set(counts.values()) == {1} for counts in SEEN), (executor, SEEN)
        after = _blas_threads()  # libraries loaded since (scipy's, for numba) are the runtime's
        assert {path: after[path] for path in before} == before, executor
    np.testing.assert_array_equal(c, a @ a)
