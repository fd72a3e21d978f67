/* The blocks of the persistent protocol's fuzz (tests/persistent_fuzz.c): what each does with
 * the work it takes and the checks it makes, written once over the protocol's own atomics for
 * both of the fuzz's builds: host threads as the blocks (C11, under ThreadSanitizer) and a
 * GPU's blocks (tests/persistent_fuzz_gpu.cu, thread 0 of each). */
#ifndef PERSISTENT_FUZZ_BLOCKS_H
#define PERSISTENT_FUZZ_BLOCKS_H

#include "persistent_protocol.h"

#ifndef FUZZ_MAX_PIECES
#define FUZZ_MAX_PIECES 1
#endif
/* The most words past its header a task's record holds: the fuzz's, each a function of the task
 * and its place (fuzz_own_word), in use 0 to all of them (random per task). */
#define FUZZ_OWN_WORDS 3

PTO_FN pto_u64 fuzz_own_word(pto_u64 task, pto_u32 i) { return task * 1000003u + i + 1; }

/* What the blocks reach: the scheduler and the board, the graph (the host's, set before the
 * blocks start) and what they record. */
typedef struct {
    pto_sched sched;
    pto_board board;
    long fanin, lose;
    const long *producers;   /* tasks x fanin: each task's producers, -1 past its last */
    const long *task_pieces; /* per task: its pieces */
    const long *own_words;   /* per task: its record's words in use past the header */
    pto_u32 *finished_flag;  /* per task: 1 once it ran (release) */
    pto_u32 *runs;           /* per task x FUZZ_MAX_PIECES: times the piece ran */
    pto_u32 *violations;     /* checks that failed */
    pto_u32 *kept;           /* tasks a block ran as the one its last completion kept */
} fuzz_world;

/* A block, thread `thread` of `threads` (`said`: PTO_SAID_WORDS of the block's shared words):
 * take work with the others until the run ends; each thread checks its share of the task's
 * record (as the kernel's threads read their task's words), then thread 0 runs each piece after
 * checking that every producer of its task has finished; the block whose pieces complete a task
 * sets its flag, then completes it in the scheduler (except task `lose`, whose completion is
 * lost). */
PTO_FN void fuzz_block(fuzz_world *w, pto_u64 *said, pto_u32 thread, pto_u32 threads) {
    pto_work work;
    pto_u32 kept = PTO_NO_SLOT;
    for (;;) {
        const int keeping = kept != PTO_NO_SLOT; /* thread 0's: the turn takes it first */
        if (pto_block_next_work(&w->sched, &w->board, &work, &kept, said, thread, threads) != PTO_GOT_TASK)
            break;
        if (keeping) pto_fetch_add32(w->kept, 1);
        const pto_u64 task = pto_staged(&w->sched, work.slot, PTO_RECORD_TICKET);
        const pto_u32 own = (pto_u32)w->own_words[task];
        if (thread == 0 && pto_staged(&w->sched, work.slot, PTO_RECORD_LENGTH) != PTO_RECORD_HEADER + own)
            pto_fetch_add32(w->violations, 1);
        for (pto_u32 i = thread; i < own; i += threads)
            if (pto_staged(&w->sched, work.slot, PTO_RECORD_HEADER + i) != fuzz_own_word(task, i))
                pto_fetch_add32(w->violations, 1);
        PTO_BLOCK_SYNC(); /* every thread's reads of the record before its task may complete */
        if (thread != 0) continue;
        if (work.pieces != (pto_u32)w->task_pieces[task] || work.last > work.pieces)
            pto_fetch_add32(w->violations, 1);
        for (pto_u32 piece = work.first; piece < work.last && piece < FUZZ_MAX_PIECES; ++piece) {
            for (long i = 0; i < w->fanin && w->producers[task * w->fanin + i] >= 0; ++i)
                if (!pto_block_load_acquire32(&w->finished_flag[w->producers[task * w->fanin + i]]))
                    pto_fetch_add32(w->violations, 1);
            pto_fetch_add32(&w->runs[task * FUZZ_MAX_PIECES + piece], 1);
        }
        if ((long)task == w->lose) continue; /* the lost completion */
        if (pto_pieces_ran(&w->board, &work)) {
            pto_block_store_release32(&w->finished_flag[task], 1);
            if (pto_complete(&w->sched, work.slot, &kept)) pto_fetch_add32(w->violations, 1);
            pto_show_done(&w->sched, work.slot, task);
        }
    }
}

#endif
