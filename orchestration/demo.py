"""`make run`: the tiled-matmul demo, on the GPU when there is one, else the CPU."""

import argparse
import time

import numpy as np

import pto_gpu as pto
from orchestration.matmul import tiled_matmul


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--tile", type=int, default=128)
    args = parser.parse_args()
    n = args.size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    c = np.zeros((n, n), np.float32)

    rt = pto.Runtime(backend="auto")
    rt.run(tiled_matmul, a[:256, :256], b[:256, :256], c[:256, :256], tile=args.tile)  # warm-up
    result = rt.run(tiled_matmul, a, b, c, tile=args.tile)
    started = time.perf_counter()
    reference = a @ b
    numpy_seconds = time.perf_counter() - started

    error = np.abs(c - reference).max() / np.abs(reference).max()
    print(f"tiled matmul {n}x{n} float32, {args.tile}-row tiles, backend={result.backend}, "
          f"executor={result.executor}")
    print(f"  tasks {result.num_tasks:,}  edges {result.num_edges:,}")
    print(f"  pto-gpu {result.seconds * 1e3:8.1f} ms   numpy {numpy_seconds * 1e3:8.1f} ms   "
          f"ratio {result.seconds / numpy_seconds:.2f}x")
    print(f"  max relative error vs numpy {error:.2e}: {'OK' if error < 1e-4 else 'MISMATCH'}")
    if error >= 1e-4:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
