// The calling convention of every kernel in kernels/cuda (see pto_gpu/backends/cuda_abi.py).
//
// A tensor param arrives as TILE(x): its data pointer, then the sizes and element strides of
// three dims (shapes are padded with leading 1s); `const Tile<const T> x = TILE_OF(x);` makes
// it one value. Scalars are `double` (floats) or `long long` (ints and bools). T is the
// element type and ACC the type sums are kept in, both chosen when the module is compiled:
// -DPTO_T=float (the default), -DPTO_T=double, or -DPTO_T=__half -DPTO_ACC=float -DPTO_HALF.
//
// Every kernel is exported as pto_<kernel name> and walks its independent work items with
// PTO_FOR (a grid-stride loop), so it is correct for any launch geometry; no kernel here
// synchronises threads, so the host build the tests use (no __CUDACC__) runs every item on
// one thread.
#pragma once

#ifndef PTO_T
#define PTO_T float
#endif
#ifndef PTO_ACC
#define PTO_ACC PTO_T
#endif

#ifdef __CUDACC__  // nvcc, or NVRTC through CuPy (which has no <cmath>)
#ifdef PTO_HALF
#include <cuda_fp16.h>
#endif
#define PTO_INFINITY __int_as_float(0x7f800000)
#else
#include <cmath>
#define __global__
#define __device__
#define PTO_INFINITY INFINITY
struct PtoDim3 { long long x; };
static const PtoDim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
#endif

using T = PTO_T;
using ACC = PTO_ACC;

#define PTO_FOR(i, items) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (items); \
         i += gridDim.x * (long long)blockDim.x)

#define TILE(E, x) E *x##_p, long long x##_d0, long long x##_d1, long long x##_d2, \
    long long x##_s0, long long x##_s1, long long x##_s2
#define TILE_OF(x) {x##_p, {x##_d0, x##_d1, x##_d2}, {x##_s0, x##_s1, x##_s2}}

template <typename E>
struct Tile {
    E *p;
    long long d[3];
    long long s[3];
    __device__ E &at(long long i, long long j, long long k) const {
        return p[i * s[0] + j * s[1] + k * s[2]];
    }
    __device__ long long size() const { return d[0] * d[1] * d[2]; }
    // The element at flat row-major index `n` of this tile's shape.
    __device__ E &flat(long long n) const {
        return at(n / (d[1] * d[2]), n / d[2] % d[1], n % d[2]);
    }
};

__device__ inline ACC load(const T &x) { return (ACC)x; }
__device__ inline T store(ACC x) { return (T)x; }
