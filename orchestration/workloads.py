"""The catalogue of runnable workloads: each orchestration here with its inputs, float64
reference and tolerance, by name. The `pto-gpu` command (pto_gpu.cli) runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import flash_attention, flash_attention_heads
from pto_gpu.orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_panels
from pto_gpu.orchestration.softmax import fused_softmax
from pto_gpu.orchestration.stencil import stencil


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A workload at one size, with host (numpy) arguments."""

    orchestration: Callable
    args: tuple
    options: dict
    output: Callable[[tuple], object]  # the output array among `args` (or a device copy of them)
    reference: Callable[[], np.ndarray]  # the float64 numpy result


@dataclasses.dataclass(frozen=True)
class Workload:
    summary: str  # what --size means is part of it
    default_size: int
    tolerance: float  # relative to the reference's largest magnitude; see tests/test_workloads.py
    prepare: Callable[[int, np.random.Generator], Prepared]
    # Whether the output's dim 0 is in blocks over the ranks of a distributed run (pto.block_rows),
    # each block's newest version on its rank; otherwise rank 0 owns it all.
    distributed: bool = False


def to_backend(backend, value: object) -> object:
    """`value` with every numpy array in it (or in its dict, as llama's inputs) moved to the
    backend's memory."""
    if isinstance(value, dict):
        return {key: to_backend(backend, item) for key, item in value.items()}
    return backend.to_device(value) if isinstance(value, np.ndarray) else value


def _matmul(n: int, rng: np.random.Generator) -> Prepared:
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    return Prepared(tiled_matmul, (a, b, np.zeros((n, n), np.float32)), {"tile": 128}, lambda args: args[2],
                    lambda: a.astype(np.float64) @ b)


def _matmul_panels(n: int, rng: np.random.Generator) -> Prepared:
    return dataclasses.replace(_matmul(n, rng), orchestration=tiled_matmul_panels)


def _softmax(rows: int, rng: np.random.Generator) -> Prepared:
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    return Prepared(fused_softmax, (x, np.zeros_like(x)), {"tile_rows": 32}, lambda args: args[1],
                    lambda: reference.softmax(x))


def _flash_attention(seq: int, rng: np.random.Generator) -> Prepared:
    q, k, v = (rng.standard_normal((8, seq, 64)).astype(np.float32) for _ in range(3))
    return Prepared(flash_attention, (q, k, v, np.zeros_like(q)), {"tile": 128, "causal": True},
                    lambda args: args[3], lambda: reference.attention(q, k, v, causal=True))


def _flash_attention_heads(seq: int, rng: np.random.Generator) -> Prepared:
    prepared = _flash_attention(seq, rng)
    return dataclasses.replace(prepared, orchestration=flash_attention_heads)


def _stencil(n: int, rng: np.random.Generator) -> Prepared:
    x, steps = rng.standard_normal(n), 4

    def smoothed() -> np.ndarray:
        y = x.copy()
        for _ in range(steps):
            padded = np.concatenate([y[:1], y, y[-1:]])
            y = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
        return y

    return Prepared(stencil, (x, np.zeros(n)), {"steps": steps, "chunk": max(16, n // 16)},
                    lambda args: args[1], smoothed)


def _llama(orchestration: Callable) -> Callable[[int, np.random.Generator], Prepared]:
    def prepare(seq: int, rng: np.random.Generator) -> Prepared:
        inputs = llama_layer_inputs(seq, hidden=1024, heads=16, ffn=2752, seed=int(rng.integers(1 << 31)))
        return Prepared(orchestration, (inputs,), {"adaptive": True}, lambda args: args[0]["out"],
                        lambda: reference.llama_layer(inputs))
    return prepare


WORKLOADS: dict[str, Workload] = {
    "matmul": Workload("tiled float32 matmul, size x size, 128-square tiles", 1024, 1e-4, _matmul,
                       distributed=True),
    "matmul_panels": Workload("the matmul with B packed into panels of 32 columns, each tile product "
                              "on a register-blocked micro-kernel (compiled)", 1024, 1e-4, _matmul_panels),
    "softmax": Workload("row softmax of size x 256 float32, 32-row tiles", 4096, 1e-5, _softmax),
    "flash_attention": Workload("causal flash attention, 8 heads x size x 64, 128-row tiles", 1024, 1e-4,
                                _flash_attention),
    "flash_attention_heads": Workload("flash_attention, by heads: the heads in blocks over the ranks of "
                                      "a distributed run", 1024, 1e-4, _flash_attention_heads,
                                      distributed=True),
    "stencil": Workload("4 steps of a 3-point stencil over size float64 values, in 16 chunks", 1 << 16,
                        1e-12, _stencil, distributed=True),
    "llama": Workload("one LLaMA layer (hidden 1024, 16 heads, ffn 2752) over size tokens, adaptive "
                      "tiles", 256, 1e-4, _llama(llama_layer)),
    "llama_compiled": Workload("the llama workload, orchestrated by compiled (numba) code", 256, 1e-4,
                               _llama(llama_layer_compiled)),
}
