"""InCore kernels (spec 003 §1.1): each declares its worker class and param shapes; its body
is the CPU implementation, written to the view it is given (outputs are never rebound).

tiles        copy, fill, matmul, matmul-accumulate
elementwise  add, sub, mul, div, exp, log, sqrt, silu, scalar multiply
reduce       row sum, row max, column sum, row-broadcast sub / div / mul
llm          RMSNorm, rotary embedding, SwiGLU, flash-attention blocks
"""
