/* The persistent protocol's fuzz on a GPU's blocks: the GPU side of tests/persistent_fuzz.c
 * built with -DFUZZ_GPU (its host side, a C compiler's), linked by nvcc. A kernel of blocks
 * whose threads run the fuzz's block loop (tests/persistent_fuzz_blocks.h) over the state the
 * host laid out in device and mapped memory. */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "persistent_fuzz_blocks.h"

static void check(cudaError_t status, const char *what) {
    if (status == cudaSuccess) return;
    fprintf(stderr, "FAILED: %s: %s\n", what, cudaGetErrorString(status));
    exit(1);
}

__global__ void fuzz_blocks(fuzz_world world) {
    __shared__ pto_u64 said[PTO_SAID_WORDS];
    fuzz_block(&world, said, threadIdx.x, blockDim.x);
}

extern "C" void *fuzz_gpu_device(size_t bytes) {
    void *p = nullptr;
    check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    check(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset");
    return p;
}

/* Write-back (not write-combined) host memory the GPU reaches at the same address (unified
 * addressing), as the executor's mapped words are. */
extern "C" void *fuzz_gpu_mapped(size_t bytes) {
    void *p = nullptr, *device = nullptr;
    check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped), "cudaHostAlloc");
    check(cudaHostGetDevicePointer(&device, p, 0), "cudaHostGetDevicePointer");
    if (device != p) {
        fprintf(stderr, "FAILED: mapped memory at %p on the host is %p on the GPU\n", p, device);
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

extern "C" void fuzz_gpu_copy(void *to, const void *from, size_t bytes) {
    check(cudaMemcpy(to, from, bytes, cudaMemcpyDefault), "cudaMemcpy");
}

/* Launch `blocks` blocks of a warp, at most as many as the GPU holds resident at once (the
 * blocks wait for each other's tasks, as a persistent kernel's do). */
extern "C" unsigned fuzz_gpu_start(const fuzz_world *world, unsigned blocks) {
    int device = 0, sms = 0, per_sm = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fuzz_blocks, 32, 0), "occupancy");
    const unsigned resident = (unsigned)(sms * per_sm);
    if (blocks > resident) blocks = resident;
    fuzz_blocks<<<blocks, 32>>>(*world);
    check(cudaGetLastError(), "the launch");
    return blocks;
}

extern "C" void fuzz_gpu_join(void) { check(cudaDeviceSynchronize(), "the kernel"); }
