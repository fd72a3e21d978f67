// The persistent kernel (executor="persistent"): the part of its module after the instances
// (pto_persistent.cuh says what comes before and how a block runs a task).
#undef blockIdx
#undef gridDim

// Run instance `kernel` (its index in the module) over a task's words: the module's switch.
__device__ void pto_run_task(unsigned kernel, const long long *words);

// What the host gives the kernel beside the scheduler (persistent_host.State writes it, every
// field 8 bytes): per slot, what the task is and, written back, when and where it ran; per
// block, the task it runs and its copy of that task's words; and the board of tasks whose
// pieces blocks share.
struct PtoRecords {
    const unsigned *kernel;             // per slot: the instance (its index in the module)
    const pto_u64 *ticket;              // per slot
    const long long *words;             // per slot: words_per_task argument words
    unsigned long long words_per_task;
    pto_u64 *began;                     // per slot: pto_now_ns() when a block popped the task
    unsigned long long *ended;          // ... and once its last piece to finish had run
    unsigned long long *ran_on;         // per slot: the block that ran that piece
    unsigned long long *running;        // per block: the ticket + 1 of its task, 0 between tasks
    long long *block_words;             // per block, device memory: its task's words
    const pto_u32 *pieces;              // per slot: the pieces its task is run as (its launch's grid)
    pto_u32 *pieces_run;                // per slot, device memory: how many have run
    pto_u64 *board;                     // device memory, board_entries of them (the protocol's
                                        // pto_board: tasks whose pieces blocks share)
    unsigned long long board_entries;
    pto_u32 *open;                      // device memory: entries with a piece not taken
};

extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1)
pto_persistent(const pto_sched *pto_scheduler, const PtoRecords *pto_records) {
    // Thread 0's words to the block (the outcome, then the work: the slot, the instance, the
    // pieces to run first..last of how many), in the dynamic shared memory the instances' tiles
    // take turns in: read by all before a second barrier, then the task's.
    pto_u32 *const said = reinterpret_cast<pto_u32 *>(pto_dynamic_shared);
    pto_sched s = *pto_scheduler;
    const PtoRecords r = *pto_records;
    const pto_board board = {r.ticket, r.pieces, r.began, r.pieces_run, r.board, r.board_entries, r.open};
    const unsigned block = pto_block_index();
    // The task's words, copied by the block from the host's memory into its own device memory,
    // where its threads read them through the GPU's caches.
    long long *const words = r.block_words + block * r.words_per_task;
    for (;;) {
        if (threadIdx.x == 0) {
            pto_work work;
            said[0] = pto_next_work(&s, &board, &work);
            if (said[0] == PTO_GOT_TASK) {
                said[1] = work.slot;
                said[2] = r.kernel[work.slot];
                said[3] = work.first;
                said[4] = work.last;
                said[5] = work.pieces;
                r.running[block] = r.ticket[work.slot] + 1;
            }
        }
        __syncthreads();
        const pto_u32 found = said[0];
        const pto_work work = {said[1], said[3], said[4], said[5]};
        const pto_u32 kernel = said[2];
        if (found == PTO_GOT_TASK)  // in one pass: a task has fewer words than the block threads
            for (unsigned long long i = threadIdx.x; i < r.words_per_task; i += PTO_THREADS)
                words[i] = r.words[work.slot * r.words_per_task + i];
        if (threadIdx.x == 0) {
            pto_piece_count.x = work.pieces;
            pto_piece_index.x = work.first;
        }
        __syncthreads();
        if (found != PTO_GOT_TASK) return;
        for (pto_u32 piece = work.first; piece < work.last; ++piece) {
            if (piece > work.first) {  // the next of pieces this block runs one after another
                if (threadIdx.x == 0) pto_piece_index.x = piece;
                __syncthreads();
            }
            pto_run_task(kernel, words);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            r.running[block] = 0;
            __threadfence_system();  // the block's writes, before its successors may start
            if (pto_pieces_ran(&board, &work)) {
                r.ended[work.slot] = pto_now_ns();
                r.ran_on[work.slot] = block;
                if (pto_complete(&s, work.slot, r.ticket[work.slot]))
                    pto_stop(&s, PTO_FAULTED);
            }
        }
    }
}

#ifndef __CUDACC__  // the host build (the CUDA emulator): its blocks side by side, each on a thread
// (PTO_HOST_THREADS, pto_isa.cuh), at most PTO_HOST_BLOCKS of them; its one symbol the others
// hide
#define PTO_HOST_BLOCKS 64
extern "C" __attribute__((visibility("default"))) int pto_launch_persistent(const unsigned *pto_grid, const unsigned *pto_block, unsigned pto_shared,
                                     void **pto_params, void *) {
    if (pto_block[0] != PTO_THREADS || pto_block[1] != 1 || pto_block[2] != 1 || pto_grid[1] != 1 ||
        pto_grid[2] != 1 || pto_grid[0] > PTO_HOST_BLOCKS || pto_shared < PTO_LAUNCH_SHARED_BYTES)
        return 1;
    pto_host_launch(pto_grid[0], pto_shared, [&] {
        pto_persistent(*(const pto_sched **)pto_params[0], *(const PtoRecords **)pto_params[1]);
    });
    return 0;
}
#endif
