// The persistent kernel (executor="persistent"): the part of its module after the instances
// (pto_persistent.cuh says what comes before and how a block runs a task).
#undef blockIdx
#undef gridDim

// Run instance `kernel` (its index in the module) over a task's words: the module's switch.
__device__ void pto_run_task(unsigned kernel, const long long *words);

// What the host gives the kernel beside the scheduler (persistent_host.State writes it, every
// field 8 bytes): per slot, what the task is and, written back, when and where it ran; per
// block, the task it runs and its copy of that task's words.
struct PtoRecords {
    const unsigned *kernel;             // per slot: the instance (its index in the module)
    const unsigned long long *ticket;   // per slot
    const long long *words;             // per slot: words_per_task argument words
    unsigned long long words_per_task;
    unsigned long long *began, *ended;  // per slot: pto_now_ns() when its block took it, and once
                                        // its block had run it
    unsigned long long *ran_on;         // per slot: that block
    unsigned long long *running;        // per block: the ticket + 1 of its task, 0 between tasks
    long long *block_words;             // per block, device memory: its task's words
};

extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1)
pto_persistent(const pto_sched *pto_scheduler, const PtoRecords *pto_records) {
    // Thread 0's words to the block (the outcome of its pto_next_task, the slot, the instance),
    // in the instances' shared memory: read by all before a second barrier, then the task's.
    pto_u32 *const said = reinterpret_cast<pto_u32 *>(pto_task_shared);
    pto_sched s = *pto_scheduler;
    const PtoRecords r = *pto_records;
    const unsigned block = pto_block_index();
    // The task's words, copied by the block from the host's memory into its own device memory,
    // where its threads read them through the GPU's caches.
    long long *const words = r.block_words + block * r.words_per_task;
    for (;;) {
        if (threadIdx.x == 0) {
            said[0] = pto_next_task(&s, &said[1]);
            if (said[0] == PTO_GOT_TASK) {
                said[2] = r.kernel[said[1]];
                r.running[block] = r.ticket[said[1]] + 1;
                r.began[said[1]] = pto_now_ns();
            }
        }
        __syncthreads();
        const pto_u32 found = said[0], taken = said[1], kernel = said[2];
        if (found == PTO_GOT_TASK)  // in one pass: a task has fewer words than the block threads
            for (unsigned long long i = threadIdx.x; i < r.words_per_task; i += PTO_THREADS)
                words[i] = r.words[taken * r.words_per_task + i];
        __syncthreads();
        if (found != PTO_GOT_TASK) return;
        pto_run_task(kernel, words);
        __syncthreads();
        if (threadIdx.x == 0) {
            r.ended[taken] = pto_now_ns();
            r.ran_on[taken] = block;
            r.running[block] = 0;
            __threadfence_system();  // the block's writes, before its successors may start
            if (pto_complete(&s, taken, r.ticket[taken])) pto_store_release32(s.device_abort, PTO_FAULTED);
        }
    }
}

#ifndef __CUDACC__  // the host build (the CUDA emulator): its blocks side by side, each on a thread
// (PTO_HOST_THREADS, pto_isa.cuh), at most PTO_HOST_BLOCKS of them; its one symbol the others
// hide
#define PTO_HOST_BLOCKS 64
extern "C" __attribute__((visibility("default"))) int pto_launch_persistent(const unsigned *pto_grid, const unsigned *pto_block, unsigned,
                                     void **pto_params, void *) {
    if (pto_block[0] != PTO_THREADS || pto_block[1] != 1 || pto_block[2] != 1 || pto_grid[1] != 1 ||
        pto_grid[2] != 1 || pto_grid[0] > PTO_HOST_BLOCKS)
        return 1;
    pto_host_launch(pto_grid[0], [&] {
        pto_persistent(*(const pto_sched **)pto_params[0], *(const PtoRecords **)pto_params[1]);
    });
    return 0;
}
#endif
