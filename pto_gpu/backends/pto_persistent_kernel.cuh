// The persistent kernel (executor="persistent"): the part of its module after the instances
// (pto_persistent.cuh says what comes before and how a block runs a task).
#undef blockIdx
#undef gridDim

// Run instance `kernel` (its index in the module) over a task's words: the module's switch.
__device__ void pto_run_task(unsigned kernel, const long long *words);

extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1)
pto_persistent(const pto_sched *pto_scheduler, const unsigned *task_kernel, const unsigned long long *task_ticket,
               const long long *task_words, unsigned long long words_per_task, unsigned long long *running,
               long long *block_words) {
    // Thread 0's words to the block (the outcome of its pto_next_task, the slot, the instance),
    // in the instances' shared memory: read by all before a second barrier, then the task's.
    pto_u32 *const said = reinterpret_cast<pto_u32 *>(pto_task_shared);
    pto_sched s = *pto_scheduler;
    const unsigned block = pto_block_index();
    // The task's words, copied by warp 0 from the host's memory into the block's own device
    // memory, where its threads read them through the GPU's caches.
    long long *const words = block_words + block * words_per_task;
    for (;;) {
        if (threadIdx.x == 0) {
            said[0] = pto_next_task(&s, &said[1]);
            if (said[0] == PTO_GOT_TASK) {
                said[2] = task_kernel[said[1]];
                running[block] = task_ticket[said[1]] + 1;
            }
        }
        __syncthreads();
        const pto_u32 found = said[0], taken = said[1], kernel = said[2];
        if (found == PTO_GOT_TASK && threadIdx.x < 32)
            for (unsigned long long i = threadIdx.x; i < words_per_task; i += 32)
                words[i] = task_words[taken * words_per_task + i];
        __syncthreads();
        if (found != PTO_GOT_TASK) return;
        pto_run_task(kernel, words);
        __syncthreads();
        if (threadIdx.x == 0) {
            running[block] = 0;
            __threadfence_system();  // the block's writes, before its successors may start
            if (pto_complete(&s, taken, task_ticket[taken])) pto_store_release32(s.device_abort, PTO_FAULTED);
        }
    }
}

#ifndef __CUDACC__  // the host build (the CUDA emulator): its blocks one after another (pto_isa.cuh)
extern "C" int pto_launch_persistent(const unsigned *pto_grid, const unsigned *pto_block, unsigned,
                                     void **pto_params, void *) {
    if (pto_block[0] != PTO_THREADS || pto_block[1] != 1 || pto_block[2] != 1 || pto_grid[1] != 1 ||
        pto_grid[2] != 1)
        return 1;
    pto_host_launch(pto_grid[0], [&] {
        pto_persistent(*(const pto_sched **)pto_params[0], *(const unsigned **)pto_params[1],
                       *(const unsigned long long **)pto_params[2], *(const long long **)pto_params[3],
                       *(unsigned long long *)pto_params[4], *(unsigned long long **)pto_params[5],
                       *(long long **)pto_params[6]);
    });
    return 0;
}
#endif
