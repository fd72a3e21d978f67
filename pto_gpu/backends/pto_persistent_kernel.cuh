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
    const unsigned long long *ticket;   // per slot
    const long long *words;             // per slot: words_per_task argument words
    unsigned long long words_per_task;
    unsigned long long *began, *ended;  // per slot: pto_now_ns() when a block popped the task, and
                                        // once its last piece to finish had run
    unsigned long long *ran_on;         // per slot: the block that ran that piece
    unsigned long long *running;        // per block: the ticket + 1 of its task, 0 between tasks
    long long *block_words;             // per block, device memory: its task's words
    const pto_u32 *pieces;              // per slot: the pieces its task is run as (its launch's grid)
    pto_u32 *pieces_run;                // per slot, device memory: how many have run
    pto_u64 *board;                     // device memory, board_entries of them: a task whose pieces
                                        // blocks take (pto_board_word); 0: free
    unsigned long long board_entries;
    pto_u32 *open;                      // device memory: entries with a piece not taken
};

// A board entry: the task's ticket + 1 (its low 32 bits: a run of 2^32 tasks would wrap), its
// pieces (at most 4096: MAX_BLOCKS) and how many are taken.
__device__ inline pto_u64 pto_board_word(pto_u64 ticket, pto_u32 pieces, pto_u32 taken) {
    return (ticket + 1) << 32 | (pto_u64)pieces << 16 | taken;
}

// A task of several pieces: piece p runs its code with blockIdx.x = p and gridDim.x = pieces,
// as block p of its stream launch's grid would, so its grid-stride loops share the work. The
// block that pops it runs piece 0 and puts it on the board, where blocks waiting for a task
// (and blocks between tasks) take its other pieces one by one; where the board is full, it runs
// them all. The block that runs the last piece to finish completes the task.

// Take a piece of a task on the board: 1, its slot and piece in *slot, *piece; 0 where there
// is none. An entry's task is not complete while it has a piece not taken, so its slot holds
// it where the swap succeeds.
__device__ int pto_take_piece(const pto_sched *s, const PtoRecords *r, pto_u32 *slot, pto_u32 *piece) {
    if (pto_load_acquire32(r->open) == 0) return 0;
    for (unsigned long long e = 0; e < r->board_entries; ++e) {
        for (;;) {
            const pto_u64 word = pto_load_acquire64(&r->board[e]);
            if (word == 0) break;
            const pto_u32 at = (pto_u32)((word >> 32) - 1) & (s->slots - 1);
            const pto_u32 pieces = (pto_u32)(word >> 16) & 0xFFFFu, taken = (pto_u32)word & 0xFFFFu;
            if (taken >= pieces) break;  // the last taker frees the entry
            if (pto_cas64(&r->board[e], word, word + 1)) {
                if (taken + 1 == pieces) {
                    pto_store_release64(&r->board[e], 0);
                    pto_fetch_add32(r->open, (pto_u32)-1);
                }
                *slot = at;
                *piece = taken;
                return 1;
            }
        }
    }
    return 0;
}

// Put the task in `slot` (ticket `ticket`, of `pieces`; its piece 0 the caller's) on the
// board: 1, or 0 where the board is full.
__device__ int pto_post_pieces(const PtoRecords *r, pto_u32 slot, pto_u64 ticket, pto_u32 pieces) {
    r->pieces_run[slot] = 0;  // published with the entry
    for (unsigned long long e = 0; e < r->board_entries; ++e)
        if (pto_cas64(&r->board[e], 0, pto_board_word(ticket, pieces, 1))) {
            pto_fetch_add32(r->open, 1);
            return 1;
        }
    return 0;
}

extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1)
pto_persistent(const pto_sched *pto_scheduler, const PtoRecords *pto_records) {
    // Thread 0's words to the block (the outcome, the slot, the instance, the pieces to run
    // first..last of how many), in the instances' shared memory: read by all before a second
    // barrier, then the task's.
    pto_u32 *const said = reinterpret_cast<pto_u32 *>(pto_task_shared);
    pto_sched s = *pto_scheduler;
    const PtoRecords r = *pto_records;
    const unsigned block = pto_block_index();
    // The task's words, copied by the block from the host's memory into its own device memory,
    // where its threads read them through the GPU's caches.
    long long *const words = r.block_words + block * r.words_per_task;
    if (threadIdx.x == 0) pto_open_pieces = r.open;  // what the protocol's wait looks at
    for (;;) {
        if (threadIdx.x == 0) {
            pto_u32 slot = 0, first = 0;
            int found = PTO_GOT_TASK;
            // one wait, however many turns find a piece on the board and another block takes it
            pto_patience patience = pto_patience_now(&s);
            for (pto_u32 spins = 0;; ++spins) {
                if (pto_aborted(&s) != PTO_RUNNING) {
                    found = PTO_ABORTED;
                    break;
                }
                if (pto_take_piece(&s, &r, &slot, &first)) break;
                found = pto_next_task_patiently(&s, &slot, &patience);
                if (found != PTO_OTHER_WORK) break;
                found = PTO_GOT_TASK;
                pto_pause(spins);  // another block took the piece first
            }
            said[0] = found;
            if (found == PTO_GOT_TASK) {
                const pto_u32 listed = r.pieces[slot], pieces = listed > 0 ? listed : 1;
                const bool popped = first == 0;  // else a piece from the board
                if (popped) r.began[slot] = pto_now_ns();  // before the board shows the task
                // a task popped: its piece 0 here and the others on the board; or, that full, all here
                const bool alone = popped && pieces > 1 && !pto_post_pieces(&r, slot, r.ticket[slot], pieces);
                said[1] = slot;
                said[2] = r.kernel[slot];
                said[3] = first;
                said[4] = alone ? pieces : first + 1;
                said[5] = pieces;
                r.running[block] = r.ticket[slot] + 1;
            }
        }
        __syncthreads();
        const pto_u32 found = said[0], taken = said[1], kernel = said[2], first = said[3], last = said[4],
                      pieces = said[5];
        if (found == PTO_GOT_TASK)  // in one pass: a task has fewer words than the block threads
            for (unsigned long long i = threadIdx.x; i < r.words_per_task; i += PTO_THREADS)
                words[i] = r.words[taken * r.words_per_task + i];
        if (threadIdx.x == 0) pto_piece_count.x = pieces;
        __syncthreads();
        if (found != PTO_GOT_TASK) return;
        for (pto_u32 piece = first; piece < last; ++piece) {
            if (threadIdx.x == 0) pto_piece_index.x = piece;
            __syncthreads();
            pto_run_task(kernel, words);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            r.running[block] = 0;
            __threadfence_system();  // the block's writes, before its successors may start
            if (pieces == 1 || pto_fetch_add32(&r.pieces_run[taken], last - first) + (last - first) == pieces) {
                r.ended[taken] = pto_now_ns();
                r.ran_on[taken] = block;
                if (pto_complete(&s, taken, r.ticket[taken])) pto_store_release32(s.device_abort, PTO_FAULTED);
            }
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
