"""InCore kernels (spec 003 §1.1), each written once as a PTO program (pto_gpu.isa.family): a
function that writes the InCore function for the tile sizes a task passes, from which the
compiler generates the CPU (numba) and CUDA implementations. Each declares its worker class and
param shapes; the leading dim of a 3-d param is a batch (attention kernels run every head of a
tile in one task).

tiles        copy, fill with zero, matmul, matmul-accumulate (cuBLAS on the GPU)
elementwise  add, sub, mul, div, exp, log, sqrt, silu, scalar multiply
reduce       row sum, row max, column sum, row-broadcast sub / div / mul
llm          RMSNorm, rotary embedding, SwiGLU, flash-attention blocks
"""
