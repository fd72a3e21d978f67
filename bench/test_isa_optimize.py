"""Tile buffer reuse by liveness (pto_gpu.isa.optimize) on the generated CPU code: the LLaMA-7B
instances whose CPU program the pass changes (RoPE over 32 heads of 128; the online-softmax
update of 32 heads' 64 x 64 score tiles), with and without the pass, float32, one thread.

extra_info has the declared tile bytes of the program each row runs. RMSNorm's pass only
changes its CUDA program (two passes over column blocks), so it is not here.
"""

import numpy as np
import pytest
from pto_gpu.kernels import llm
from threadpoolctl import threadpool_limits

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa import cpu_codegen
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.family import family_of
from pto_gpu.isa.optimize import optimize_module, tile_bytes

HEADS = 32
INSTANCES = {  # kernel, its call's shapes, its scalars
    "rope": (llm.rope, ((32, 4096),), (0, HEADS)),
    "flash_softmax_update": (llm.flash_softmax_update, ((HEADS, 64, 64), (HEADS, 64, 1), (HEADS, 64, 1),
                                                        (HEADS, 64, 1)), ()),
}


def _entry(kernel, shapes, scalars, optimized: bool):
    """The generated CPU function of the instance (batched when its params are 3-d), as its
    builder writes it or through the pass, and its declared tile bytes."""
    instances = family_of(kernel)
    sizes = dict(instances.sizes(shapes))
    structural = {name: scalars[i] for name, i in zip(instances.structural_names, instances.structural)}
    module = isa.Module(f"{kernel.name}_" + "_".join(f"{w}{n}" for w, n in sizes.items()))
    builder = FunctionBuilder(kernel.name, module=module).in_core()
    budget = {"local_memory": None} if instances.budgeted else {}  # the CPU's: no limit
    instances.build(builder, pto.FLOAT32, **sizes, **structural, **budget)
    builder.build()
    if optimized:
        module = optimize_module(module)
    batched = any(len(s) == 3 for s in shapes)
    run = cpu_codegen.cpu_function(module, kernel.name, batched=batched)
    return run, tile_bytes(module.functions[kernel.name])


@pytest.mark.parametrize("optimized", [False, True], ids=["as-written", "tiles-reused"])
@pytest.mark.parametrize("name", list(INSTANCES))
def test_generated_cpu_kernel(benchmark, name, optimized):
    kernel, shapes, scalars = INSTANCES[name]
    benchmark.group = f"isa-optimize-{name}"
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(0.5, 2.0, shape).astype(np.float32) for shape in shapes]
    run, size = _entry(kernel, shapes, scalars, optimized)
    reference, _ = _entry(kernel, shapes, scalars, False)
    want, got = [a.copy() for a in arrays], [a.copy() for a in arrays]
    reference(*want, *scalars)
    run(*got, *scalars)
    for have, expected in zip(got, want):
        np.testing.assert_allclose(have, expected, rtol=1e-6, atol=1e-7)
    work = [a.copy() for a in arrays]
    with threadpool_limits(1):
        benchmark(run, *work, *scalars)  # in place: rope rotates x again, the update rescales again
    benchmark.extra_info.update(tile_bytes=size)
