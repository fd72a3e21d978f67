"""InCore kernels; each declares its worker class, and its body is the CPU implementation."""
