"""One LLaMA-7B decoder layer (spec 003 §4.4): 16 tasks per row tile, 3 per attention pair.

The layer is a PTO program, programs/llama.pto (its orchestration functions over the kernel
library), and this module its entry points: the inputs, and the layer run from the program
interpreted (`llama_layer`) or as generated numba code (`llama_layer_compiled`). Per tile:
RMSNorm; Q, K, V projections; RoPE on q and k; flash-attention init and normalise; output
projection; residual; RMSNorm; gate and up projections; SwiGLU; down projection; residual.
Per (query tile, key tile) pair: scores, online-softmax update, output update. Attention is
causal by masking, over every pair, so the counts are the spec's: 16·N + 3·N² for N tiles
(32-row tiles, or with `adaptive` the binary-expanded tiling of tiling.adaptive_tiles).
"""

from __future__ import annotations

import functools
import importlib.resources

import numpy as np

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.dtypes import DataType, as_dtype
from pto_gpu.isa.asm import DTYPE_NAMES

WEIGHTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm", "ffn_norm")
WORKSPACES = ("q", "k", "v", "attn", "out")


def llama_layer_inputs(seq_len: int, hidden: int = 4096, heads: int = 32, ffn: int = 11008,
                       seed: int = 0, lazy: bool = False, dtype: object = np.float32) -> dict:
    """The layer's input x, weights, and workspaces (q, k, v, attn) plus the output `out`, of
    `dtype` (float32; float16 or bfloat16 run the program retyped, see `program`).

    lazy=True gives np.empty arrays (no pages touched), for graph-only runs at large sizes.
    """
    dtype = as_dtype(dtype).numpy
    if hidden % heads or (hidden // heads) % 2:
        raise ValueError(f"hidden={hidden} must split into {heads} heads of even size")
    shapes = {"x": (seq_len, hidden), "wq": (hidden, hidden), "wk": (hidden, hidden),
              "wv": (hidden, hidden), "wo": (hidden, hidden), "w_gate": (hidden, ffn),
              "w_up": (hidden, ffn), "w_down": (ffn, hidden), "attn_norm": (1, hidden),
              "ffn_norm": (1, hidden)}
    shapes.update({name: (seq_len, hidden) for name in WORKSPACES})
    if lazy:
        arrays = {name: np.empty(shape, dtype) for name, shape in shapes.items()}
    else:
        rng = np.random.default_rng(seed)
        arrays = {name: np.zeros(shape, dtype) for name, shape in shapes.items()}
        arrays["x"][...] = rng.standard_normal(shapes["x"])
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            arrays[name][...] = rng.standard_normal(shapes[name]) / np.sqrt(shapes[name][0])
        for name in ("attn_norm", "ffn_norm"):
            arrays[name][...] = 1 + 0.1 * rng.standard_normal(shapes[name])
    arrays["heads"] = heads
    return arrays


def llama_layer(o: pto.Orchestrator, inputs: dict, adaptive: bool = False) -> None:
    """The layer over inputs from llama_layer_inputs: the program's @llama_layer (32-row tiles)
    or @llama_layer_adaptive, its IR walked against `o`."""
    _entry(adaptive, False, as_dtype(inputs["x"].dtype))(o, *_arguments(inputs))


def llama_layer_compiled(o: pto.Orchestrator, inputs: dict, adaptive: bool = False) -> None:
    """llama_layer as the program's generated numba orchestration: the same tasks and edges."""
    _entry(adaptive, True, as_dtype(inputs["x"].dtype))(o, *_arguments(inputs))


def _arguments(inputs: dict) -> list:
    return [inputs[name] for name in ("x", *WEIGHTS, *WORKSPACES)] + [inputs["heads"]]


@functools.cache
def _entry(adaptive: bool, compiled: bool, dtype: DataType):
    name = "llama_layer_adaptive" if adaptive else "llama_layer"
    return program(dtype).orchestration(name, compiled=compiled)


def program(dtype: object = np.float32) -> isa.Program:
    """orchestration/programs/llama.pto, compiled: the layer's and flash attention's one source,
    for arrays of `dtype`. The text's memrefs are float32; for another element type (float16:
    its products on tensor cores on a GPU) they are of that type, and nothing else changes."""
    return _program(as_dtype(dtype))


@functools.cache
def _program(dtype: DataType) -> isa.Program:
    text = importlib.resources.files("pto_gpu.orchestration").joinpath("programs", "llama.pto").read_text()
    if dtype != DataType.FLOAT32:
        text = text.replace("!pto.memref<f32>", f"!pto.memref<{DTYPE_NAMES[dtype]}>")
    return isa.compile(isa.parse(text))


def expected_tasks(num_tiles: int) -> int:
    """16 tasks per tile plus 3 per attention pair (spec 003 §4.4)."""
    return 16 * num_tiles + 3 * num_tiles ** 2
