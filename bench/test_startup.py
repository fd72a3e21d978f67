"""A new process's first run: with the caches warm, import pto_gpu, make a runtime and run the
2048² panel matmul once (128-row tiles, native workers), checked against numpy in float64; with
them cold, as on a fresh machine, a compiled LLaMA layer (small sizes: what costs is numba
compiling the runtime and the layer's generated body, whatever the sizes).

Its native entries (cfuncs over kernels/tiles.py's numba kernels) come from numba's cache:
made in each process, they took 8 of the first run's 8.5–9.1 s (docs/BENCHMARKS.md, eleventh
pass). A warm-up process fills the caches first."""

import os
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
    the body calls, and a submit per signature of its calls (8 here)."""

    def cold() -> None:
        folder = tmp_path_factory.mktemp("cold")
        env = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "numba"), "PTO_GPU_CACHE": str(folder / "isa")}
        subprocess.run([sys.executable, "-c", COLD_LLAMA], check=True, env=env)

    benchmark.pedantic(cold, rounds=1)
