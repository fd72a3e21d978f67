// The persistent kernel (executor="persistent"): the part of its module after the instances
// (pto_persistent.cuh says what comes before and how a block runs a task).
#undef blockIdx
#undef gridDim

// Run instance `kernel` (its index in the module) over a task's words: the module's switch.
__device__ void pto_run_task(unsigned kernel, const long long *words);

// What the host gives the kernel beside the scheduler (persistent_host.State writes it, every
// field 8 bytes): per slot, written back, when and where its task ran; per block, the task it
// runs; and the board of tasks whose pieces blocks share. A task's instance (its index in the
// module) and argument words are its record's past the protocol's header (PTO_RECORD_INSTANCE,
// then the words), which the block reads as the wirer staged them, in device memory.
enum { PTO_RECORD_INSTANCE = PTO_RECORD_HEADER, PTO_RECORD_WORDS };
static_assert(PTO_TASK_SHARED_BYTES >= PTO_SAID_WORDS * sizeof(pto_u64), "room for thread 0's words");
struct PtoRecords {
    pto_u64 *began;                     // per slot: pto_now_ns() when a block took the task
    unsigned long long *ended;          // ... and once its last piece to finish had run
    unsigned long long *ran_on;         // per slot: the block that ran that piece
    unsigned long long *running;        // per block: the ticket + 1 of its task, 0 between tasks
    pto_u32 *pieces_run;                // per slot, device memory: how many have run
    pto_u64 *board;                     // device memory, board_entries of them (the protocol's
                                        // pto_board: tasks whose pieces blocks share)
    unsigned long long board_entries;
    pto_u32 *open;                      // device memory: entries with a piece not taken
};

extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1)
pto_persistent(const pto_sched *pto_scheduler, const PtoRecords *pto_records) {
    // The protocol's words from thread 0 to the block, in the dynamic shared memory the
    // instances' tiles take turns in: read by all before pto_block_next_work returns.
    pto_u64 *const said = reinterpret_cast<pto_u64 *>(pto_dynamic_shared);
    pto_sched s = *pto_scheduler;
    const PtoRecords r = *pto_records;
    const pto_board board = {r.began, r.pieces_run, r.board, r.board_entries, r.open};
    const unsigned block = pto_block_index();
    pto_u32 kept = PTO_NO_SLOT;  // thread 0's: the task its last completion made ready
    for (;;) {
        pto_work work;
        if (pto_block_next_work(&s, &board, &work, &kept, said, threadIdx.x, PTO_THREADS) != PTO_GOT_TASK)
            return;
        const pto_u64 *const record = s.staged + (pto_u64)work.slot * s.record_words;
        const pto_u64 ticket = record[PTO_RECORD_TICKET];
        const unsigned kernel = (unsigned)record[PTO_RECORD_INSTANCE];
        const long long *const words = reinterpret_cast<const long long *>(record + PTO_RECORD_WORDS);
        if (threadIdx.x == 0) {
            r.running[block] = ticket + 1;
            pto_piece_count.x = work.pieces;
            pto_piece_index.x = work.first;
        }
        __syncthreads();  // and every thread has read pto_block_next_work's words (`said`)
        for (pto_u32 piece = work.first; piece < work.last; ++piece) {
            if (piece > work.first) {  // the next of pieces this block runs one after another
                if (threadIdx.x == 0) pto_piece_index.x = piece;
                __syncthreads();
            }
            pto_run_task(kernel, words);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            // the block's writes, before its successors may start on this GPU (the host sees
            // them through pto_show_done's system-scope release, which is cumulative)
            __threadfence();
            if (pto_pieces_ran(&board, &work)) {
                const pto_u64 ended = pto_now_ns();
                if (pto_complete(&s, work.slot, &kept)) pto_stop(&s, PTO_FAULTED);
                // the stores to mapped memory after the successors' hand-over (a fence waits
                // for them), and before `done`, with which the host reads them
                r.ended[work.slot] = ended;
                r.ran_on[work.slot] = block;
                pto_show_done(&s, work.slot, ticket);
            }
            r.running[block] = 0;
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
