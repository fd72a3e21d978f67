/* The persistent scheduler's protocol (pto_gpu/backends/persistent_protocol.h) fuzzed on host
 * threads: the main thread is the host, publishing a random graph into a ring of task slots
 * (each task waiting for up to `fanin` of the `window` tasks before it, wired while earlier ones
 * run, slots reused as they finish); `blocks` threads stand in for the persistent kernel's
 * blocks. Built with ThreadSanitizer by tests/test_persistent_protocol.py.
 *
 *   persistent_fuzz SEED TASKS SLOTS BLOCKS FANIN WINDOW [LOSE [PAUSE_AT PAUSE_MS]]
 *
 * Built with -DFUZZ_GPU and linked with tests/persistent_fuzz_gpu.cu (nvcc), the blocks are a
 * GPU's: a kernel of BLOCKS blocks of a warp (at most those resident at once), each running
 * the same loop (tests/persistent_fuzz_blocks.h), its threads staging records together, the
 * state laid out by pto_layout in device and mapped memory as the executor's is, so the
 * protocol's orders are the GPU's memory model's.
 *
 * Built with -DFUZZ_MAX_PIECES=n (default 1), each task runs as 1..n pieces (random), which the
 * blocks share through a board of FUZZ_BOARD entries (default 4; the protocol's pto_board).
 * Built with -DFUZZ_BLOCK_THREADS=n (default 1), each block is n threads meeting at a barrier
 * (PTO_BLOCK_SYNC), which stage records together as a GPU block's threads do.
 *
 * Checks: every piece of every task runs once, after every one of the task's producers has
 * finished, from its record as the host wrote it (its ticket, pieces and a random number of
 * words of the executor's, staged by the wirer); the run ends with all of them finished. With
 * LOSE = t (-1: none), the block that runs task t never completes it: the run must then stop
 * as stuck, and the host names the unfinished tasks and what each waits for. With PAUSE_AT,
 * the host sleeps PAUSE_MS before publishing that task (a slow orchestration is not a
 * deadlock). Built with -DFUZZ_STALL_US=n, a block stalls n microseconds between its loads of
 * `closed` and `submitted` (PTO_BETWEEN_LOADS), where a task the host publishes and closes on
 * meanwhile must not be missed; with -DFUZZ_CELL_STALL_US=n, a block stalls n microseconds
 * holding every fifth cell of the ready queue it pops, before it reads the cell's slot
 * (PTO_HOLDING_CELL), while the positions move on past the cell, which no push may take
 * until the block releases it. Prints "ok ..." or
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
#ifdef FUZZ_CELL_STALL_US
#define PTO_HOLDING_CELL(position) \
    ((position) % 5 == 0 ? (void)nanosleep(&(struct timespec){0, FUZZ_CELL_STALL_US * 1000}, NULL) : (void)0)
#endif
#ifndef FUZZ_BLOCK_THREADS
#define FUZZ_BLOCK_THREADS 1
#endif
#if FUZZ_BLOCK_THREADS > 1 && !defined(FUZZ_GPU)
static _Thread_local pthread_barrier_t *block_barrier; /* the calling thread's block's */
#define PTO_BLOCK_SYNC() pthread_barrier_wait(block_barrier)
#endif
#include "persistent_fuzz_blocks.h"

#ifndef FUZZ_BOARD
#define FUZZ_BOARD 4
#endif

#ifdef FUZZ_GPU
/* tests/persistent_fuzz_gpu.cu */
void *fuzz_gpu_device(size_t bytes);                               /* zeroed device memory */
void *fuzz_gpu_mapped(size_t bytes);                               /* zeroed, the GPU's address too */
void fuzz_gpu_copy(void *to, const void *from, size_t bytes);      /* between host and device */
unsigned fuzz_gpu_start(const fuzz_world *world, unsigned blocks); /* the blocks launched */
void fuzz_gpu_join(void);                                          /* exits where the kernel failed */
#endif

static fuzz_world world;

static void *zeroed(size_t count, size_t size) {
    void *p = calloc(count, size);
    if (!p) abort();
    return p;
}

/* Words the host writes or reads while the blocks run: mapped memory on a GPU. */
static void *shared_words(size_t count, size_t size) {
#ifdef FUZZ_GPU
    return fuzz_gpu_mapped(count * size);
#else
    return zeroed(count, size);
#endif
}

/* Words only the blocks touch while they run: device memory on a GPU. */
static void *blocks_words(size_t count, size_t size) {
#ifdef FUZZ_GPU
    return fuzz_gpu_device(count * size);
#else
    return zeroed(count, size);
#endif
}

/* The host's array, where the blocks read it (the graph, set before they start). */
static const void *for_blocks(const void *host, size_t bytes) {
#ifdef FUZZ_GPU
    void *device = fuzz_gpu_device(bytes);
    fuzz_gpu_copy(device, host, bytes);
    return device;
#else
    (void)bytes;
    return host;
#endif
}

/* The blocks' words, where the host reads them once the blocks have ended. */
static void *for_host(void *words, size_t bytes) {
#ifdef FUZZ_GPU
    void *host = zeroed(bytes, 1);
    fuzz_gpu_copy(host, words, bytes);
    return host;
#else
    (void)bytes;
    return words;
#endif
}

/* The unfinished tasks and the producers each still waits for (the host's DeadlockError),
 * from the blocks' records. */
static void name_the_stuck(long submitted, pto_u64 finished, const pto_u32 *finished_flag, const pto_u32 *runs,
                           const long *producers) {
    const long fanin = world.fanin;
    printf("stuck: %llu of %ld tasks finished;", (unsigned long long)finished, submitted);
    for (long task = 0; task < submitted; ++task) {
        if (finished_flag[task] || runs[task * FUZZ_MAX_PIECES]) continue;
        printf(" task %ld waits for", task);
        for (long i = 0; i < fanin && producers[task * fanin + i] >= 0; ++i)
            if (!finished_flag[producers[task * fanin + i]]) printf(" %ld", producers[task * fanin + i]);
        printf(";");
    }
    for (long task = 0; task < submitted; ++task)
        if (runs[task * FUZZ_MAX_PIECES] && !finished_flag[task]) printf(" task %ld ran and did not complete;", task);
    printf("\n");
}

#ifndef FUZZ_GPU
#define FUZZ_MAX_BLOCKS 64
static pthread_barrier_t barriers[FUZZ_MAX_BLOCKS];
static pto_u64 said[FUZZ_MAX_BLOCKS][PTO_SAID_WORDS]; /* each block's shared words */

/* Thread `at` % FUZZ_BLOCK_THREADS of block `at` / FUZZ_BLOCK_THREADS. */
static void *block(void *at) {
    const pto_u32 index = (pto_u32)(size_t)at, block = index / FUZZ_BLOCK_THREADS,
                  thread = index % FUZZ_BLOCK_THREADS;
#if FUZZ_BLOCK_THREADS > 1
    block_barrier = &barriers[block];
#endif
    fuzz_block(&world, said[block], thread, FUZZ_BLOCK_THREADS);
    return NULL;
}
#endif

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s SEED TASKS SLOTS BLOCKS FANIN WINDOW [LOSE [PAUSE_AT PAUSE_MS]]\n", argv[0]);
        return 2;
    }
    srand((unsigned)atol(argv[1]));
    const long tasks = atol(argv[2]);
    const pto_u32 slots = (pto_u32)atol(argv[3]);
    pto_u32 blocks = (pto_u32)atol(argv[4]);
    const long fanin = atol(argv[5]), window = atol(argv[6]), lose = argc > 7 ? atol(argv[7]) : -1;
    const long pause_at = argc > 9 ? atol(argv[8]) : -1, pause_ms = argc > 9 ? atol(argv[9]) : 0;

    /* the words of a few slots' producers; the successor pool the header's bound asks for, at
     * most `fanin` producers a task; both regions laid out and set as the executor's are (on a
     * GPU the device region set in a host copy, then copied there) */
    pto_sched *sched = &world.sched;
    pto_u32 words = 1;
    while (words < 4 * (pto_u32)fanin + 1) words *= 2;
    const pto_u32 chunks = pto_pool_chunks(slots, (pto_u64)slots * (pto_u64)fanin);
    const pto_u32 record_words = PTO_RECORD_HEADER + FUZZ_OWN_WORDS;
    const pto_extent extent = pto_layout(sched, slots, words, chunks, record_words, NULL, NULL);
    char *staging = zeroed(extent.device_bytes, 1), *mapped = shared_words(extent.mapped_bytes, 1);
    pto_layout(sched, slots, words, chunks, record_words, staging, mapped);
    pto_initial(sched);
    char *device = blocks_words(extent.device_bytes, 1);
#ifdef FUZZ_GPU
    fuzz_gpu_copy(device, staging, extent.device_bytes);
#else
    memcpy(device, staging, extent.device_bytes);
#endif
    pto_layout(sched, slots, words, chunks, record_words, device, mapped);

    long *producers = zeroed((size_t)tasks * fanin, sizeof(long)), *task_pieces = zeroed(tasks, sizeof(long));
    long *own_words = zeroed(tasks, sizeof(long));
    for (long task = 0; task < tasks; ++task) {
        const long count = task ? rand() % (fanin + 1) : 0;
        for (long i = 0; i < fanin; ++i)
            producers[task * fanin + i] = i < count ? task - 1 - rand() % (task < window ? task : window) : -1;
        task_pieces[task] = 1 + rand() % FUZZ_MAX_PIECES;
        own_words[task] = rand() % (FUZZ_OWN_WORDS + 1);
    }
    world.board = (pto_board){blocks_words(slots, sizeof(pto_u64)), blocks_words(slots, sizeof(pto_u32)),
                              blocks_words(FUZZ_BOARD, sizeof(pto_u64)), FUZZ_BOARD,
                              blocks_words(1, sizeof(pto_u32))};
    world.fanin = fanin;
    world.lose = lose;
    world.producers = for_blocks(producers, (size_t)tasks * fanin * sizeof(long));
    world.task_pieces = for_blocks(task_pieces, tasks * sizeof(long));
    world.own_words = for_blocks(own_words, tasks * sizeof(long));
    world.finished_flag = blocks_words(tasks, sizeof(pto_u32));
    world.runs = blocks_words((size_t)tasks * FUZZ_MAX_PIECES, sizeof(pto_u32));
    world.violations = blocks_words(1, sizeof(pto_u32));
    world.kept = blocks_words(1, sizeof(pto_u32));

#ifdef FUZZ_GPU
    blocks = fuzz_gpu_start(&world, blocks);
#else
    pthread_t threads[FUZZ_MAX_BLOCKS * FUZZ_BLOCK_THREADS];
    if (blocks > FUZZ_MAX_BLOCKS) return 2;
    for (pto_u32 b = 0; b < blocks; ++b) pthread_barrier_init(&barriers[b], NULL, FUZZ_BLOCK_THREADS);
    for (size_t t = 0; t < blocks * FUZZ_BLOCK_THREADS; ++t)
        pthread_create(&threads[t], NULL, block, (void *)t);
#endif

    /* The host's view: the blocks' own words (device memory on a GPU, which the host cannot
     * read) are not there, so a host function that touched one would crash the fuzz. */
    pto_sched host = *sched;
    host.counters = NULL;
    host.wiring = host.state = host.chunk_next = host.chunk_entry = host.cell_slot = NULL;
    host.successor_count = host.last_chunk = host.free_chunk_next = host.free_chunk_first = NULL;
    host.pending = NULL;
    host.cell_sequence = host.staged = host.staged_word = NULL;
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
        for (pto_u32 i = 0; i < (pto_u32)own_words[task]; ++i)
            host.record[(pto_u64)slot * record_words + PTO_RECORD_HEADER + i] =
                fuzz_own_word((pto_u64)task, i);
        if (pto_host_submit(&host, (pto_u64)task, &next_word, ticket_producers, count,
                            (pto_u32)task_pieces[task], (pto_u32)own_words[task]))
            break;
        submitted = task + 1;
    }
    pto_store_release32(host.closed, 1);
    int waited = 1;
    for (long task = submitted > (long)slots ? submitted - slots : 0; task < submitted && waited; ++task)
        waited = !pto_host_wait_done(&host, (pto_u32)(task % slots), (pto_u64)task);
#ifdef FUZZ_GPU
    fuzz_gpu_join();
#else
    for (size_t t = 0; t < blocks * FUZZ_BLOCK_THREADS; ++t) pthread_join(threads[t], NULL);
#endif

    const pto_u64 finished = *(pto_u64 *)for_host(&sched->counters[PTO_FINISHED], sizeof(pto_u64));
    const pto_u32 *finished_flag = for_host(world.finished_flag, tasks * sizeof(pto_u32));
    const pto_u32 *runs = for_host(world.runs, (size_t)tasks * FUZZ_MAX_PIECES * sizeof(pto_u32));
    unsigned violations = *(pto_u32 *)for_host(world.violations, sizeof(pto_u32));
    if (waited && finished != (pto_u64)submitted) ++violations; /* a done task not counted */
    if (pto_aborted(sched) == PTO_STUCK) {
        name_the_stuck(submitted, finished, finished_flag, runs, producers);
        return lose >= 0 ? 0 : 1;
    }
    unsigned twice = 0, never = 0;
    for (long task = 0; task < submitted; ++task)
        for (long piece = 0; piece < FUZZ_MAX_PIECES; ++piece) {
            const unsigned ran = runs[task * FUZZ_MAX_PIECES + piece], wanted = piece < task_pieces[task];
            twice += ran > wanted;
            never += ran < wanted;
        }
    /* the board empty at the end */
    unsigned left = *(pto_u32 *)for_host(world.board.open, sizeof(pto_u32)) != 0;
    const pto_u64 *entries = for_host(world.board.board, FUZZ_BOARD * sizeof(pto_u64));
    for (long e = 0; e < FUZZ_BOARD; ++e) left += entries[e] != 0;
    violations += left;
    if (twice || never || violations || submitted != tasks || lose >= 0 || pto_aborted(sched) != PTO_RUNNING) {
        printf("FAILED: submitted %ld of %ld, ran twice %u, never %u, before a producer %u, lost %ld, abort %u\n",
               submitted, tasks, twice, never, violations, lose, pto_aborted(sched));
        return 1;
    }
    printf("ok: %ld tasks, %u slots, %u blocks, %llu finished, %u kept\n", tasks, slots, blocks,
           (unsigned long long)finished, *(pto_u32 *)for_host(world.kept, sizeof(pto_u32)));
    return 0;
}
