// What the CUDA code generated from PTO InCore functions (pto_gpu/isa/cuda_codegen.py) needs
// beyond its own text. The generator pastes this header at the top of every source it writes,
// so a generated .cu compiles alone (nvcc, NVRTC through CuPy, g++) and several of them can be
// pasted into one translation unit (the include guard below).
//
// The argument convention is pto_gpu/backends/cuda_abi.py's, written
// out by the generator: a memref is its pointer, three sizes, three element strides; a scalar
// is a double or a long long. T is the element type and ACC the type tiles are computed in,
// chosen when the module is compiled (-DPTO_T=float, -DPTO_T=double, or -DPTO_T=__half
// -DPTO_ACC=float -DPTO_HALF). PTO_WARPS (warps per block) is defined by the generated source
// from the backend's THREADS_PER_BLOCK.
//
// The host build (no __CUDACC__, used by the tests on machines without a GPU) runs the very
// same kernel text: each thread of a block is a std::thread with its own threadIdx, a block's
// threads run together so that __syncthreads(), __syncwarp() and the shuffles are real
// rendezvous (a mutex-and-condition barrier per block and per warp), __shared__ arrays are
// function statics (one block runs at a time), and pto_host_launch runs the blocks of a grid one
// after another. So the host build checks the generated code's indexing, valid regions,
// reductions across lanes and barrier placement, not a sequential rewrite of it; a missing
// rendezvous (a shuffle some lanes skip) deadlocks, which the barrier reports and aborts on.
#ifndef PTO_ISA_CUH
#define PTO_ISA_CUH

#ifndef PTO_T
#define PTO_T float
#endif
#ifndef PTO_ACC
#define PTO_ACC PTO_T
#endif
#ifndef PTO_WARPS
#define PTO_WARPS 8
#endif
#define PTO_THREADS (PTO_WARPS * 32)
#define PTO_FULL 0xffffffffu

#ifdef __CUDACC__  // nvcc, or NVRTC through CuPy (which has no <cmath>)
#ifdef PTO_HALF
#include <cuda_fp16.h>
#endif
#define PTO_INF __int_as_float(0x7f800000)
#define PTO_UNROLL _Pragma("unroll")
#define PTO_PRAGMA(text) _Pragma(#text)
#define PTO_UNROLL_BY(count) PTO_PRAGMA(unroll count)
// The opcode table's templates mix the tile type with double literals (fmax(x, 0.0)); these keep
// float tiles in float where nvcc would otherwise find only std's host-side template.
__device__ inline float fmax(float a, double b) { return fmaxf(a, (float)b); }
__device__ inline float fmin(float a, double b) { return fminf(a, (float)b); }
#else
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(...)
#define PTO_INF INFINITY
#define PTO_UNROLL
#define PTO_UNROLL_BY(count)
using std::cos;
using std::exp;
using std::fabs;
using std::floor;
using std::fmax;
using std::fmin;
using std::log;
using std::sin;
using std::sqrt;
template <typename V>
inline V rsqrt(V x) { return V(1) / std::sqrt(x); }

struct PtoDim3 { unsigned x; };
inline thread_local PtoDim3 threadIdx, blockIdx;
inline PtoDim3 blockDim, gridDim;

// A reusable rendezvous of `count` threads.
struct PtoBarrier {
    std::mutex mutex;
    std::condition_variable turned;
    int count = 0, waiting = 0;
    long long generation = 0;
    void wait() {
        std::unique_lock<std::mutex> lock(mutex);
        const long long mine = generation;
        if (++waiting == count) {
            waiting = 0;
            ++generation;
            turned.notify_all();
            return;
        }
        if (!turned.wait_for(lock, std::chrono::seconds(60), [&] { return generation != mine; })) {
            std::fprintf(stderr, "pto_isa.cuh host build: a barrier waited 60 s (threads that skip a "
                                 "__syncthreads, __syncwarp or shuffle)\n");
            std::abort();
        }
    }
};

struct PtoHostBlock {
    PtoBarrier block, warps[PTO_WARPS];
    alignas(8) unsigned char lanes[PTO_THREADS][8];  // what each thread offers to a shuffle
};
inline PtoHostBlock *pto_host_block;

template <typename V>
inline V pto_host_exchange(V value, int source_lane) {
    static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
    PtoHostBlock &block = *pto_host_block;
    const int warp = threadIdx.x / 32;
    std::memcpy(block.lanes[threadIdx.x], &value, sizeof value);
    block.warps[warp].wait();  // every lane has offered its value
    V got;
    std::memcpy(&got, block.lanes[warp * 32 + source_lane], sizeof got);
    block.warps[warp].wait();  // every lane has read before any offers again
    return got;
}

template <typename V>
inline V __shfl_xor_sync(unsigned, V value, int lane_mask) {
    return pto_host_exchange(value, (threadIdx.x % 32) ^ lane_mask);
}
template <typename V>
inline V __shfl_sync(unsigned, V value, int source_lane) { return pto_host_exchange(value, source_lane); }
inline void __syncthreads() { pto_host_block->block.wait(); }
inline void __syncwarp() { pto_host_block->warps[threadIdx.x / 32].wait(); }

// Run `kernel` (a call of the __global__ function) over `blocks` blocks of PTO_THREADS threads.
template <typename F>
inline void pto_host_launch(long long blocks, F kernel) {
    PtoHostBlock block;
    block.block.count = PTO_THREADS;
    for (PtoBarrier &warp : block.warps) warp.count = 32;
    pto_host_block = &block;
    gridDim.x = (unsigned)blocks;
    blockDim.x = PTO_THREADS;
    for (long long b = 0; b < blocks; ++b) {
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < PTO_THREADS; ++t)
            threads.emplace_back([&kernel, b, t] {
                blockIdx.x = (unsigned)b;
                threadIdx.x = t;
                kernel();
            });
        for (std::thread &thread : threads) thread.join();
    }
    pto_host_block = nullptr;
}
#endif

using T = PTO_T;
using ACC = PTO_ACC;

// The rows (or cols) of a window of `size` wanted where `available` remain: never negative.
__device__ inline long long pto_clip(long long size, long long available) {
    return available < 0 ? 0 : (size < available ? size : available);
}

// SDIV: floor division, as the interpreter's numpy floor_divide.
__device__ inline long long pto_floordiv(long long a, long long b) {
    const long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ inline double pto_floordiv(double a, double b) { return floor(a / b); }

#endif  // PTO_ISA_CUH
