"""A new process's first run: with the caches warm, import pto_gpu, make a runtime and run the
2048² panel matmul once (128-row tiles, native workers), checked against numpy in float64; with
them cold, as on a fresh machine, a compiled LLaMA layer (small sizes: what costs is numba
compiling the runtime and the layer's generated body, whatever the sizes), and a tiled matmul
on the stream executor of the CUDA backend (on the emulator: its issue path is the GPU's numba
code, which every process of `make gpu-check` compiles before its first task), submitted from
Python, then by its compiled orchestration.

Its native entries (cfuncs over kernels/tiles.py's numba kernels) come from numba's cache:
made in each process, they took 8 of the first run's 8.5–9.1 s (docs/BENCHMARKS.md, eleventh
pass). A warm-up process fills the caches first."""

import os
import resource
import subprocess
import sys

SCRIPT = """
import numpy as np
import pto_gpu as pto
from pto_gpu.orchestration.matmul import tiled_matmul_panels

rng = np.random.default_rng(0)
a, b = (rng.standard_normal((2048, 2048)).astype(np.float32) for _ in range(2))
c = np.zeros((2048, 2048), np.float32)
pto.Runtime(backend="cpu").run(tiled_matmul_panels, a, b, c, tile=128)
reference = a.astype(np.float64) @ b.astype(np.float64)
# float32 sums of 2048 products: well under 1e-4 of the largest entry
assert np.abs(c - reference).max() <= 1e-4 * np.abs(reference).max()
"""


def first_run() -> None:
    subprocess.run([sys.executable, "-c", SCRIPT], check=True)


def test_first_panel_matmul_run_in_a_new_process(benchmark):
    first_run()  # the caches filled, as after any earlier run on the machine
    benchmark.pedantic(first_run, rounds=3)


COLD_LLAMA = """
import numpy as np
import pto_gpu as pto
from pto_gpu.orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs

compiled, walked = (llama_layer_inputs(64, hidden=128, heads=2, ffn=256) for _ in range(2))
pto.Runtime(backend="cpu", executor="serial").run(llama_layer_compiled, compiled)
pto.Runtime(backend="cpu", executor="serial").run(llama_layer, walked)
# the same tasks in the same order on the same kernels: the same bits
assert np.array_equal(compiled["out"], walked["out"]) and np.isfinite(compiled["out"]).all()
"""


def test_first_compiled_llama_layer_run_with_cold_caches(benchmark, tmp_path_factory):
    """numba's cache and the generated sources' folder empty: numba compiles every jit function
    the body calls, and a submit per signature of its calls (6 here)."""

    cold_run(benchmark, tmp_path_factory, COLD_LLAMA)


COLD_STREAMS = """
import numpy as np
import pto_gpu as pto
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled

rng = np.random.default_rng(0)
a, b = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
expected = a.astype(np.float64) @ b
rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream")
for orchestration in (tiled_matmul, tiled_matmul_compiled):
    c = rt.backend.to_device(np.zeros((128, 128), np.float32))
    result = rt.run(orchestration, rt.backend.to_device(a), rt.backend.to_device(b), c, tile=32)
    assert result.native_tasks > 0  # the driver stream executor's numba path issued them
    # float32 sums of 128 products: well under 1e-5 of the largest entry
    assert np.abs(rt.backend.to_host(c) - expected).max() <= 1e-5 * np.abs(expected).max()
"""


def test_first_stream_executor_runs_on_the_cuda_backend_with_cold_caches(benchmark, tmp_path_factory):
    """numba's cache and the generated sources' folder empty: the stream executor's issue path
    (driver_streams), the core and the orchestration's body compile before the first task (and
    the emulator's C library builds, a few seconds a GPU's process does not spend)."""

    cold_run(benchmark, tmp_path_factory, COLD_STREAMS)


def cold_run(benchmark, tmp_path_factory, script: str) -> None:
    """`script` in a new process whose numba cache and generated sources' folder are empty,
    timed; extra_info["cpu_s"]: the CPU seconds it took (compiling, mostly), which a loaded
    machine moves less than the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)

    def cold() -> None:
        folder = tmp_path_factory.mktemp("cold")
        env = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "numba"), "PTO_GPU_CACHE": str(folder / "isa")}
        subprocess.run([sys.executable, "-c", script], check=True, env=env)

    benchmark.pedantic(cold, rounds=1)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    benchmark.extra_info["cpu_s"] = round(spent, 1)
