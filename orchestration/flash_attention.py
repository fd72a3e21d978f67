"""Flash attention over (heads, seq, head_dim) arrays: query tiles against key/value tiles
with the online softmax, any seq_len (the last tile may be partial). The orchestration is the
@flash_attention function of programs/llama.pto, beside the LLaMA layer that uses the same
attention tiles."""

import numpy as np
from pto_gpu.orchestration.llama import program

import pto_gpu as pto


def flash_attention(o: pto.Orchestrator, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                    tile: int = 64, causal: bool = False) -> None:
    program().orchestration("flash_attention")(o, q, k, v, out, tile, int(causal))
