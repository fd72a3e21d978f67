"""Kernels as a user writes them from docs/ISA.md, at any tile size: what bench/test_isa.py
measures on the CPU against numpy and bench/test_gpu.py on a GPU against PyTorch."""

import numpy as np

import pto_gpu as pto
from pto_gpu import isa

F32 = pto.FLOAT32
GELU_C = float(np.sqrt(2 / np.pi))


def user_module(rows: int, width: int) -> isa.Module:
    """GELU (tanh form), LayerNorm (weight, bias, eps) and log-softmax on rows x width float32
    tiles, written instruction by instruction as a user writes them from docs/ISA.md."""
    m = isa.Module("user_tiles")
    (isa.FunctionBuilder("gelu", module=m).in_core()
        .memref("input", F32, (rows, width)).memref("output", F32, (rows, width))
        .tile("x", rows, width, F32).tile("u", rows, width, F32)
        .load("x", "input").mul("u", "x", "x").mul("u", "u", "x").muls("u", "u", 0.044715).add("u", "u", "x")
        .muls("u", "u", GELU_C).tanh("u", "u").adds("u", "u", 1.0).mul("u", "u", "x").muls("u", "u", 0.5)
        .store("output", "u")
        .build())
    (isa.FunctionBuilder("layernorm", module=m).in_core()
        .memref("input", F32, (rows, width)).memref("weight", F32, (1, width))
        .memref("bias", F32, (1, width)).memref("output", F32, (rows, width)).scalar("eps", F32)
        .tile("x", rows, width, F32).tile("sq", rows, width, F32).tile("m", rows, 1, F32)
        .tile("v", rows, 1, F32).tile("w", 1, width, F32).tile("b", 1, width, F32)
        .load("x", "input").load("w", "weight").load("b", "bias")
        .rowsum("m", "x").divs("m", "m", float(width)).rowexpandsub("x", "x", "m")
        .mul("sq", "x", "x").rowsum("v", "sq").divs("v", "v", float(width)).adds("v", "v", "eps")
        .rsqrt("v", "v").rowexpandmul("x", "x", "v").colexpandmul("x", "x", "w").colexpandadd("x", "x", "b")
        .store("output", "x")
        .build())
    (isa.FunctionBuilder("log_softmax", module=m).in_core()
        .memref("input", F32, (rows, width)).memref("output", F32, (rows, width))
        .tile("x", rows, width, F32).tile("e", rows, width, F32).tile("mx", rows, 1, F32)
        .tile("s", rows, 1, F32)
        .load("x", "input").rowmax("mx", "x").rowexpandsub("x", "x", "mx").exp("e", "x").rowsum("s", "e")
        .log("s", "s").rowexpandsub("x", "x", "s").store("output", "x")
        .build())
    return m
