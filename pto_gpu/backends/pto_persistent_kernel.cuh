// The persistent kernel (executor="persistent"): the part of its module after the instances
// (pto_persistent.cuh says what comes before and how a block runs a task).
#undef blockIdx
#undef gridDim

// Run instance `kernel` (its index in the module) over a task's words: the module's switch.
__device__ void pto_run_task(unsigned kernel, const long long *words);

extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1)
pto_persistent(const pto_sched *pto_scheduler, const unsigned *task_kernel, const unsigned long long *task_ticket,
               const long long *task_words, unsigned long long words_per_task, unsigned long long *running) {
    // Thread 0's word to the block (the outcome of its pto_next_task, and the slot), in the
    // instances' shared memory: read by all before a second barrier, then the task's.
    pto_u32 *const said = reinterpret_cast<pto_u32 *>(pto_task_shared);
    pto_sched s = *pto_scheduler;
    const unsigned block = pto_block_index();
    for (;;) {
        if (threadIdx.x == 0) {
            said[0] = pto_next_task(&s, &said[1]);
            if (said[0] == PTO_GOT_TASK) running[block] = task_ticket[said[1]] + 1;
        }
        __syncthreads();
        const pto_u32 found = said[0], taken = said[1];
        __syncthreads();
        if (found != PTO_GOT_TASK) return;
        pto_run_task(task_kernel[taken], task_words + taken * words_per_task);
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
                       *(unsigned long long *)pto_params[4], *(unsigned long long **)pto_params[5]);
    });
    return 0;
}
#endif
