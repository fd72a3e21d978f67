"""Flash attention over (heads, seq, head_dim) arrays of float32 or float16: query tiles against
key/value tiles with the online softmax, any seq_len (the last tile may be partial). The orchestration is the
@flash_attention function of programs/llama.pto, beside the LLaMA layer that uses the same
attention tiles."""

import numpy as np
from pto_gpu.orchestration.llama import program

import pto_gpu as pto


def flash_attention(o: pto.Orchestrator, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                    tile: int = 64, causal: bool = False) -> None:
    program(q.dtype).orchestration("flash_attention")(o, q, k, v, out, tile, int(causal))


def flash_attention_compiled(o: pto.Orchestrator, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                             out: np.ndarray, tile: int = 64, causal: bool = False) -> None:
    """flash_attention submitted by the program's compiled form (one process): on the CPU its
    tasks run on native workers."""
    program(q.dtype).orchestration("flash_attention", compiled=True)(o, q, k, v, out, tile, int(causal))


def flash_attention_fused(o: pto.Orchestrator, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                          tile: int = 64, causal: bool = False) -> None:
    """The same attention with each query tile one task (kernels.llm.flash_attention_tile: the
    online softmax over the keys inside it), the program's @flash_attention_fused."""
    program(q.dtype).orchestration("flash_attention_fused")(o, q, k, v, out, tile, int(causal))


def flash_attention_fused_compiled(o: pto.Orchestrator, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                   out: np.ndarray, tile: int = 64, causal: bool = False) -> None:
    """flash_attention_fused submitted by the program's compiled form."""
    program(q.dtype).orchestration("flash_attention_fused", compiled=True)(o, q, k, v, out, tile, int(causal))


def flash_attention_heads(o: pto.Orchestrator, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                          tile: int = 64, causal: bool = False) -> None:
    """flash_attention with the heads in blocks over the ranks of a distributed run: each head's
    tasks, and the scratch they allocate, are on the rank owning its rows, so nothing moves."""
    heads = pto.block_rows(o.ranks)
    tensors = [o.external(array, owner=heads) for array in (q, k, v, out)]
    attention = program(q.dtype).orchestration("flash_attention")
    for h in range(q.shape[0]):
        with o.on_rank(o.owner_of(tensors[0][h])):
            attention(o, q[h:h + 1], k[h:h + 1], v[h:h + 1], out[h:h + 1], tile, int(causal))
