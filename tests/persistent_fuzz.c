/* The persistent scheduler's protocol (pto_gpu/backends/persistent_protocol.h) fuzzed on host
 * threads: the main thread is the host, publishing a random graph into a ring of task slots
 * (each task waiting for up to `fanin` of the `window` tasks before it, wired while earlier ones
 * run, slots reused as they finish); `blocks` threads stand in for the persistent kernel's
 * blocks. Built with ThreadSanitizer by tests/test_persistent_protocol.py.
 *
 *   persistent_fuzz SEED TASKS SLOTS BLOCKS FANIN WINDOW [LOSE [PAUSE_AT PAUSE_MS]]
 *
 * Built with -DFUZZ_MAX_PIECES=n (default 1), each task runs as 1..n pieces (random), which the
 * blocks share through a board of FUZZ_BOARD entries (default 4; the protocol's pto_board).
 *
 * Checks: every piece of every task runs once, after every one of the task's producers has
 * finished; the run ends with all of them finished. With LOSE = t (-1: none), the block that runs task t never
 * completes it: the run must then stop as stuck, and the host names the unfinished tasks and
 * what each waits for. With PAUSE_AT, the host sleeps PAUSE_MS before publishing that task
 * (a slow orchestration is not a deadlock). Built with -DFUZZ_STALL_US=n, a block stalls n
 * microseconds between its loads of `closed` and `submitted` (PTO_BETWEEN_LOADS), where a task
 * the host publishes and closes on meanwhile must not be missed. Prints "ok ..." or
 * "stuck ..." and exits 0, or prints what went wrong and exits 1.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FUZZ_STALL_US
#define PTO_BETWEEN_LOADS() nanosleep(&(struct timespec){0, FUZZ_STALL_US * 1000}, NULL)
#endif
#include "persistent_protocol.h"

#ifndef FUZZ_MAX_PIECES
#define FUZZ_MAX_PIECES 1
#endif
#ifndef FUZZ_BOARD
#define FUZZ_BOARD 4
#endif

static pto_sched sched;
static pto_board board;
static long tasks, fanin, window, lose = -1;
static long *producers;          /* tasks x fanin: each task's producers, -1 past its last */
static pto_u64 *slot_ticket;     /* per slot: the task in it (the host's, published with it) */
static pto_u32 *slot_pieces;     /* per slot: its task's pieces (the host's, published with it) */
static long *task_pieces;        /* per task: its pieces */
static unsigned *finished_flag;  /* per task: 1 once it ran (release) */
static unsigned *runs;           /* per task x FUZZ_MAX_PIECES: times the piece ran */
static unsigned violations;

static void *block(void *unused) {
    (void)unused;
    pto_work work;
    while (pto_next_work(&sched, &board, &work) == PTO_GOT_TASK) {
        const pto_u64 task = slot_ticket[work.slot];
        if (work.pieces != (pto_u32)task_pieces[task] || work.last > work.pieces)
            __atomic_fetch_add(&violations, 1, __ATOMIC_RELAXED);
        for (pto_u32 piece = work.first; piece < work.last && piece < FUZZ_MAX_PIECES; ++piece) {
            for (long i = 0; i < fanin && producers[task * fanin + i] >= 0; ++i)
                if (!__atomic_load_n(&finished_flag[producers[task * fanin + i]], __ATOMIC_ACQUIRE))
                    __atomic_fetch_add(&violations, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&runs[task * FUZZ_MAX_PIECES + piece], 1, __ATOMIC_RELAXED);
        }
        if ((long)task == lose) continue;  /* the lost completion */
        if (pto_pieces_ran(&board, &work)) {
            __atomic_store_n(&finished_flag[task], 1, __ATOMIC_RELEASE);
            if (pto_complete(&sched, work.slot, task)) __atomic_fetch_add(&violations, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

/* The unfinished tasks and the producers each still waits for (the host's DeadlockError). */
static void name_the_stuck(long submitted) {
    printf("stuck: %llu of %ld tasks finished;", (unsigned long long)sched.counters[PTO_FINISHED], submitted);
    for (long task = 0; task < submitted; ++task) {
        if (__atomic_load_n(&finished_flag[task], __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&runs[task * FUZZ_MAX_PIECES], __ATOMIC_RELAXED))
            continue;
        printf(" task %ld waits for", task);
        for (long i = 0; i < fanin && producers[task * fanin + i] >= 0; ++i)
            if (!__atomic_load_n(&finished_flag[producers[task * fanin + i]], __ATOMIC_ACQUIRE))
                printf(" %ld", producers[task * fanin + i]);
        printf(";");
    }
    for (long task = 0; task < submitted; ++task)
        if (__atomic_load_n(&runs[task * FUZZ_MAX_PIECES], __ATOMIC_RELAXED) &&
            !__atomic_load_n(&finished_flag[task], __ATOMIC_ACQUIRE))
            printf(" task %ld ran and did not complete;", task);
    printf("\n");
}

static void *zeroed(size_t count, size_t size) {
    void *p = calloc(count, size);
    if (!p) abort();
    return p;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s SEED TASKS SLOTS BLOCKS FANIN WINDOW [LOSE [PAUSE_AT PAUSE_MS]]\n", argv[0]);
        return 2;
    }
    srand((unsigned)atol(argv[1]));
    tasks = atol(argv[2]);
    const pto_u32 slots = (pto_u32)atol(argv[3]), blocks = (pto_u32)atol(argv[4]);
    fanin = atol(argv[5]);
    window = atol(argv[6]);
    if (argc > 7) lose = atol(argv[7]);
    const long pause_at = argc > 9 ? atol(argv[8]) : -1, pause_ms = argc > 9 ? atol(argv[9]) : 0;

    /* the words of a few slots' producers; the successor pool the header's bound asks for, at
     * most `fanin` producers a task; both regions laid out and set as the executor's are */
    pto_u32 words = 1;
    while (words < 4 * (pto_u32)fanin + 1) words *= 2;
    const pto_u32 chunks = pto_pool_chunks(slots, (pto_u64)slots * (pto_u64)fanin);
    const pto_extent extent = pto_layout(&sched, slots, words, chunks, NULL, NULL);
    pto_layout(&sched, slots, words, chunks, zeroed(extent.device_bytes, 1), zeroed(extent.mapped_bytes, 1));
    pto_initial(&sched);

    producers = zeroed((size_t)tasks * fanin, sizeof(long));
    slot_ticket = zeroed(slots, sizeof(pto_u64));
    slot_pieces = zeroed(slots, sizeof(pto_u32));
    task_pieces = zeroed(tasks, sizeof(long));
    finished_flag = zeroed(tasks, sizeof(unsigned));
    runs = zeroed((size_t)tasks * FUZZ_MAX_PIECES, sizeof(unsigned));
    for (long task = 0; task < tasks; ++task) {
        const long count = task ? rand() % (fanin + 1) : 0;
        for (long i = 0; i < fanin; ++i)
            producers[task * fanin + i] = i < count ? task - 1 - rand() % (task < window ? task : window) : -1;
        task_pieces[task] = 1 + rand() % FUZZ_MAX_PIECES;
    }
    /* the board in the blocks' memory, as the kernel's is in device memory */
    board = (pto_board){slot_ticket, slot_pieces, zeroed(slots, sizeof(pto_u64)), zeroed(slots, sizeof(pto_u32)),
                        zeroed(FUZZ_BOARD, sizeof(pto_u64)), FUZZ_BOARD, zeroed(1, sizeof(pto_u32))};

    pthread_t threads[64];
    if (blocks > 64) return 2;
    for (pto_u32 b = 0; b < blocks; ++b) pthread_create(&threads[b], NULL, block, NULL);

    /* The host's view: the blocks' own words (device memory on a GPU, which the host cannot
     * read) are not there, so a host function that touched one would crash the fuzz. */
    pto_sched host = sched;
    host.counters = NULL;
    host.wiring = host.state = host.first_chunk = host.chunk_next = host.chunk_entry = host.cell_slot = NULL;
    host.successor_count = host.last_chunk = host.free_chunk_next = host.free_chunk_first = NULL;
    host.pending = NULL;
    host.cell_sequence = NULL;
    long submitted = 0;
    pto_u64 next_word = 0, ticket_producers[64];
    for (long task = 0; task < tasks; ++task) {
        if (task == pause_at) nanosleep(&(struct timespec){pause_ms / 1000, pause_ms % 1000 * 1000000}, NULL);
        pto_u32 count = 0;
        for (long i = 0; i < fanin && producers[task * fanin + i] >= 0; ++i)
            ticket_producers[count++] = (pto_u64)producers[task * fanin + i];
        const pto_u32 slot = (pto_u32)(task % slots);
        /* the slot's previous task must be done before its ticket is rewritten */
        if (task >= (long)slots && pto_host_wait_done(&host, slot, (pto_u64)(task - slots))) break;
        slot_ticket[slot] = (pto_u64)task;
        slot_pieces[slot] = (pto_u32)task_pieces[task];
        if (pto_host_submit(&host, (pto_u64)task, &next_word, ticket_producers, count)) break;
        submitted = task + 1;
    }
    pto_store_release32(host.closed, 1);
    int waited = 1;
    for (long task = submitted > (long)slots ? submitted - slots : 0; task < submitted && waited; ++task)
        waited = !pto_host_wait_done(&host, (pto_u32)(task % slots), (pto_u64)task);
    if (waited && pto_load_acquire64(&sched.counters[PTO_FINISHED]) != (pto_u64)submitted)
        __atomic_fetch_add(&violations, 1, __ATOMIC_RELAXED);  /* a done task not counted */
    for (pto_u32 b = 0; b < blocks; ++b) pthread_join(threads[b], NULL);

    if (pto_aborted(&sched) == PTO_STUCK) {
        name_the_stuck(submitted);
        return lose >= 0 ? 0 : 1;
    }
    unsigned twice = 0, never = 0;
    for (long task = 0; task < submitted; ++task)
        for (long piece = 0; piece < FUZZ_MAX_PIECES; ++piece) {
            const unsigned ran = runs[task * FUZZ_MAX_PIECES + piece], wanted = piece < task_pieces[task];
            twice += ran > wanted;
            never += ran < wanted;
        }
    unsigned left = *board.open != 0;  /* the board empty at the end */
    for (long e = 0; e < FUZZ_BOARD; ++e) left += board.board[e] != 0;
    violations += left;
    if (twice || never || violations || submitted != tasks || lose >= 0 || pto_aborted(&sched) != PTO_RUNNING) {
        printf("FAILED: submitted %ld of %ld, ran twice %u, never %u, before a producer %u, lost %ld, abort %u\n",
               submitted, tasks, twice, never, violations, lose, pto_aborted(&sched));
        return 1;
    }
    printf("ok: %ld tasks, %u slots, %u blocks, %llu finished\n", tasks, slots, blocks,
           (unsigned long long)sched.counters[PTO_FINISHED]);
    return 0;
}
