"""`make run`: the tiled-matmul and flash-attention demos, on the GPU when there is one, else the CPU.

They run the orchestrations' compiled forms: on the CPU their tasks run on native workers
without the GIL, on a GPU the stream executor issues them from numba. Each line compares the
run with numpy's one call on this machine: "ratio" is pto-gpu's time over numpy's (below 1:
faster than numpy). The matmul runs twice: the plain tiled matmul (a tile product is a BLAS
call on a strided view of B) and the panel matmul (B packed into panels first, so every tile
product reads contiguous memory: the project's fastest CPU matmul). The matmul tiles are 128
rows on the CPU and 512 on a GPU, where a tile product is one cuBLAS call whose own latency a
128-row tile does not cover (2048² on an H200: 67 ms in 128-row tiles, 3.2 ms in 512-row
ones; docs/GPU.md). Attention runs twice too: three tasks a (query tile, key tile) pair, and
one task a query tile (the loop over its keys inside the kernel).
"""

import argparse
import time

import numpy as np
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import flash_attention_compiled, flash_attention_fused_compiled
from pto_gpu.orchestration.matmul import tiled_matmul_compiled, tiled_matmul_panels

import pto_gpu as pto

FORM = ", compiled orchestration"


def timed(function, *args) -> tuple[object, float]:
    """function(*args) and its best time of three runs (the first warms BLAS's threads up)."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        value = function(*args)
        seconds.append(time.perf_counter() - started)
    return value, min(seconds)


def report(name: str, result: pto.RunResult, numpy_seconds: float, error: float, tolerance: float) -> bool:
    print(f"{name}: backend={result.backend}, executor={result.executor}")
    print(f"  tasks {result.num_tasks:,}  edges {result.num_edges:,}")
    print(f"  pto-gpu {result.seconds * 1e3:8.1f} ms   numpy {numpy_seconds * 1e3:8.1f} ms   "
          f"ratio {result.seconds / numpy_seconds:.2f}x (pto-gpu / numpy)")
    print(f"  max relative error vs numpy {error:.2e}: {'OK' if error < tolerance else 'MISMATCH'}")
    return error < tolerance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048, help="matmul size")
    parser.add_argument("--tile", type=int, default=None, help="matmul tile rows (default: 128 on the CPU, "
                        "512 on a GPU)")
    parser.add_argument("--seq", type=int, default=1024, help="flash-attention sequence length")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rt = pto.Runtime(backend="auto")
    tile = args.tile or (128 if rt.backend.name == "cpu" else 512)

    device, host = rt.backend.to_device, rt.backend.to_host  # the identity on the CPU backend
    n = args.size
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    expected, numpy_seconds = timed(np.matmul, a, b)
    all_ok = True
    for label, matmul in (("tiled matmul", tiled_matmul_compiled), ("panel matmul", tiled_matmul_panels)):
        operands = device(a), device(b), device(np.zeros((n, n), np.float32))
        rt.run(matmul, *operands, tile=tile)  # warm-up: numba's cache, BLAS, page faults
        result = rt.run(matmul, *operands, tile=tile)
        c = host(operands[2])
        all_ok &= report(f"{label} {n}x{n} float32, {tile}-row tiles{FORM}", result,
                         numpy_seconds, np.abs(c - expected).max() / np.abs(expected).max(), 1e-4)

    q, k, v = (rng.standard_normal((8, args.seq, 64)).astype(np.float32) for _ in range(3))
    _, numpy_seconds = timed(reference.attention, q, k, v, True, np.float32)  # monolithic float32
    expected = reference.attention(q, k, v, causal=True)
    for label, attention in (("a task per tile pair", flash_attention_compiled),
                             ("a task per query tile", flash_attention_fused_compiled)):
        operands = device(q), device(k), device(v), device(np.zeros_like(q))
        rt.run(attention, *operands, tile=128, causal=True)  # warm-up
        result = rt.run(attention, *operands, tile=128, causal=True)
        out = host(operands[3])
        all_ok &= report(f"causal flash attention, 8 heads x {args.seq} x 64, 128-row tiles, {label}{FORM}",
                         result, numpy_seconds, np.abs(out - expected).max() / np.abs(expected).max(), 1e-4)
    if not all_ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
