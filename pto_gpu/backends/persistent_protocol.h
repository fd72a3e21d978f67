/* The device-resident scheduler's protocol (executor="persistent", issue 44): how a persistent
 * kernel's blocks take the tasks the host submits, wire them to their producers, and pull the
 * ready ones, while the host keeps submitting. Written once for two builds:
 *
 *   - CUDA (nvcc, NVRTC): the persistent kernel's blocks, one thread of each speaking for it;
 *     atomics are PTX (ld.acquire, st.release, atom.acq_rel): at system scope on the words
 *     the host shares (pto_load_*, pto_store_*), at GPU scope on the words only blocks touch
 *     (pto_block_load_*, pto_block_store_*, and every read-modify-write: one writer a word
 *     with the host, below), whose system-scope forms each cost a MEMBAR.SYS;
 *   - C11 on the host: the protocol's fuzz (tests/persistent_fuzz.c), host threads standing in
 *     for the blocks and for the host, under ThreadSanitizer, with GCC's __atomic builtins in
 *     the same orders. The host's side (pto_host_*) is host code, built by a C compiler.
 *
 * One writer a shared word. The host and the GPU only load and store each other's words: an
 * H200 has no host-native atomics (cudaDevAttrHostNativeAtomicSupported is 0), and a review
 * measured a host fetch_add and a GPU atom.add on one word of mapped memory losing 12,155 of
 * 40,000 increments with a single block. Every read-modify-write is the blocks' alone, and on
 * device memory; the host reads only words the blocks store (`shown`, `done`, `device_abort`):
 *   - the host writes task `ticket`'s record (its slot is ticket % slots; the producers' tickets
 *     go into a ring of words) once the slot's previous task is done, then publishes it with a
 *     release store of `submitted`;
 *   - a block that holds the wiring lock copies the records published since the last it wired,
 *     and the producers' tickets they name, into device memory (`staged`, `staged_word`), its
 *     threads side by side (pto_stage), then wires them in order from those copies
 *     (pto_wire_staged): the slot's pending count starts at 1, a guard; for each producer whose
 *     slot it still holds, it writes the task into the producer's successor list (chunks of
 *     PTO_CHUNK: the producer slot's own first, then chunks from a pool it owns under the
 *     lock), adds 1 to pending, then publishes the entry with a fetch_add on the producer's
 *     state word, whose COMPLETED bit, where set, says the producer finished first: the 1 is
 *     taken back; then the guard is dropped (by a fetch_add, or where no producer was linked
 *     and none can take a 1 back, by none). Whoever brings pending to 0 (the wirer, or a
 *     producer completing) pushes the task to the ready queue, or keeps it: exactly one of them;
 *   - a block that completes a task (pto_complete) sets COMPLETED (fetch_or: how many
 *     successors were published before it), decrements those, keeps the first that reaches 0
 *     to run next itself (a chain's next task starts on the block that finished its producer,
 *     without a push or a pop, on the block's next turn's first check) and pushes the others,
 *     then stores the task's ticket as the slot's `done` (release: pto_show_done), which the
 *     host polls.
 * The ready queue is Vyukov's bounded multi-producer multi-consumer queue; it holds each slot
 * at most once, so a capacity of `slots` never fills.
 *
 * The host's words cross PCIe: a block's load of one takes a microsecond or more. A record is
 * read from there once, by the wirer's block with all its threads' loads in flight together (a
 * few round trips for a batch of records, where the wirer reading each field in turn took two or
 * three for each task and one more for each producer); the block that runs the task, and the
 * blocks that take its pieces, read the staged copy in device memory. And every
 * idle block looking at them on every turn (thousands on an H200) flooded the link, so that
 * each task's own loads of its record took tens of microseconds (2026-11-30: 40-115 us a task,
 * the fuzz's resident blocks too slow to end). So one block at a time looks at them: the
 * wiring lock's holder (pto_look_at_host), as it wires, or where none has looked for
 * PTO_LOOK_NS; it leaves what it saw in the blocks' own words (PTO_PUBLISHED, PTO_CLOSED,
 * PTO_STOPPED), which the others read.
 *
 * No wait is unbounded. While some submitted task is unfinished, a block that sees none of
 * the counters move (tasks wired, popped, finished) for PTO_PATIENCE_NS stores PTO_STUCK in
 * `device_abort`: a task has run that long, or tasks wait for producers that will never
 * finish; the host names them (a DeadlockError). With every submitted task finished the blocks
 * wait for the host as long as it takes, so every way the host stops (an error, an exception)
 * must store `host_abort`. The host's waits are bounded the same way, watching what the blocks
 * show (records wired, the last completion); they measure the blocks' progress only, so the
 * executor must also watch the kernel's stream (a kernel that starts late, or dies in a fault,
 * looks like no progress).
 *
 * Sizes. A producer's successor list holds the links of the tasks after it while its slot
 * holds it, and its chunks past the slot's own first go back to the pool when its slot is
 * wired again, so every link alive is from one of the last `slots` tasks wired (a repeated
 * producer is a link each time). Where any `slots` consecutive tasks name at most L producers
 * in all, slots + ceil(L / PTO_CHUNK) chunks never run out (each slot's own first chunk, and
 * from the pool one more for every PTO_CHUNK links past a list's first); for tasks of at most
 * P producers each, L = slots x P.
 * Running out stops the run (PTO_FAULTED). Memory the host writes must be write-back
 * (cudaHostAlloc without WriteCombined): the host's release stores are plain x86 stores,
 * ordered by TSO.
 */
#ifndef PTO_PERSISTENT_PROTOCOL_H
#define PTO_PERSISTENT_PROTOCOL_H

#ifdef __CUDACC__
#define PTO_FN static __device__ __forceinline__
typedef unsigned int pto_u32;
typedef unsigned long long pto_u64;
typedef int pto_i32;
#else
#include <sched.h>
#include <stdint.h>
#include <time.h>
#define PTO_FN static inline
typedef uint32_t pto_u32;
typedef uint64_t pto_u64;
typedef int32_t pto_i32;
#endif

#define PTO_COMPLETED 0x80000000u /* in a slot's state word, above its count of successors */
#define PTO_CHUNK 14              /* successors a chunk holds */
#define PTO_NO_CHUNK 0xFFFFFFFFu
#define PTO_NO_SLOT 0xFFFFFFFFu
#ifndef PTO_PATIENCE_NS
#define PTO_PATIENCE_NS 10000000000ull /* no progress this long, with work left: stuck */
#endif
#ifndef PTO_LOOK_NS
#define PTO_LOOK_NS 2000ull /* the longest idle blocks go without looking at the host's words */
#endif
#ifndef PTO_BETWEEN_LOADS
#define PTO_BETWEEN_LOADS() /* where the fuzz may stall a block (tests/persistent_fuzz.c) */
#endif
#ifndef PTO_HOLDING_CELL
#define PTO_HOLDING_CELL(position) /* ... and where it may stall one holding a popped cell */
#endif

#define PTO_PUSH_MOST 8    /* the ready slots a push takes cells for at once */
#define PTO_CHECK_EVERY 64 /* an idle block's turns between its looks at the end and at its patience */
#define PTO_STAGE_LOADS 8 /* the loads of the host's memory a thread has in flight while it stages */
#ifdef __CUDACC__
#define PTO_UNROLL _Pragma("unroll")
#else
#define PTO_UNROLL
#endif

enum { PTO_RUNNING = 0, PTO_STUCK = 1, PTO_FAULTED = 2 }; /* an abort word */
/* What a block's wait for work found (pto_block_next_work: the first three), and what one of
 * thread 0's turns may find besides (pto_turn): records to stage, or nothing yet. */
enum { PTO_GOT_TASK, PTO_ALL_DONE, PTO_ABORTED, PTO_TO_STAGE, PTO_NOTHING_YET };

/* A task's record: per slot, `record_words` words (PTO_RECORD_HEADER at least) that the host
 * writes before it publishes the task: the protocol's header (pto_host_submit writes it), then
 * the executor's (the persistent kernel's: the instance, then the argument words). */
enum {
    PTO_RECORD_TICKET,     /* the task's ticket */
    PTO_RECORD_FIRST_WORD, /* where its producers' tickets start in `word` */
    PTO_RECORD_PRODUCERS,  /* how many */
    PTO_RECORD_PIECES,     /* the pieces it runs as */
    PTO_RECORD_LENGTH,     /* the record's words in use, the header's included (the wirer stages
                              the header and the words up to this) */
    PTO_RECORD_HEADER
};

/* The words a block's thread 0 tells its threads in the block's shared memory (`said`). */
enum {
    PTO_SAID_OUTCOME,                                              /* what the turn found */
    PTO_SAID_SLOT, PTO_SAID_FIRST, PTO_SAID_LAST, PTO_SAID_PIECES, /* the work (pto_work) */
    PTO_SAID_FROM, PTO_SAID_COUNT,                                 /* the records to stage */
    PTO_SAID_WORDS
};

/* A barrier of a block's threads: a GPU's, and the persistent kernel's host build's (pto_isa.cuh's
 * fibers); a block of one thread has none to wait for (the C11 fuzz defines its own where its
 * blocks are several threads). */
#ifndef PTO_BLOCK_SYNC
#if defined(__CUDACC__) || defined(PTO_HOST_THREADS)
#define PTO_BLOCK_SYNC() __syncthreads()
#else
#define PTO_BLOCK_SYNC() ((void)0)
#endif
#endif

/* The blocks' counters: device words that only blocks touch (read-modify-writes, which must
 * not meet the host's accesses on one word, and are cheapest in device memory), each in a line
 * of its own (PTO_LINE_WORDS: 128 bytes, an L2 line), as every idle block loads several of them
 * on each of its turns: on one line, those loads queued the atomics of the blocks that push,
 * pop, wire and complete. */
#define PTO_LINE_WORDS 16
enum {
    PTO_ENQUEUED = 0 * PTO_LINE_WORDS,  /* the ready queue's enqueue position */
    PTO_DEQUEUED = 1 * PTO_LINE_WORDS,  /* ... and dequeue position: tasks popped */
    PTO_FINISHED = 2 * PTO_LINE_WORDS,  /* tasks completed */
    /* the host's words and the wirer's, as the block that last looked saw them: */
    PTO_WIRED_SEEN = 3 * PTO_LINE_WORDS, /* records wired (shown[PTO_WIRED]) */
    PTO_PUBLISHED = 4 * PTO_LINE_WORDS,  /* records published (`submitted`) */
    PTO_CLOSED = 5 * PTO_LINE_WORDS,     /* 1 once a block has read `closed` as 1, its PTO_PUBLISHED
                                            then the last */
    PTO_STOPPED = 6 * PTO_LINE_WORDS,    /* PTO_RUNNING, or why the run stopped (`host_abort`, or a
                                            block's own) */
    PTO_LOOKED_AT = 7 * PTO_LINE_WORDS,  /* pto_now_ns() when a block last looked */
    PTO_COUNTERS = 8 * PTO_LINE_WORDS
};
/* What the blocks show the host: words they only store (the wirer, under the lock; a completing
 * block), which the host reads. */
enum {
    PTO_WIRED,      /* records wired (tickets below it) */
    PTO_WORDS_READ, /* producer words the wirer has read (positions below it are free) */
    PTO_LAST_DONE,  /* the ticket + 1 of the task completed last, 0 before any (each is stored
                       once: the word changes with every completion after the host read it) */
    PTO_SHOWN
};

/* The scheduler's state: arrays in one allocation that the host and the blocks share. */
typedef struct {
    pto_u32 slots, words, chunks, /* task slots, producer words, successor chunks (slots and
                                     words powers of two) */
        record_words;             /* a task record's words */
    /* written by the host, read by the blocks */
    pto_u64 *submitted;           /* records published (tickets below it) */
    pto_u32 *closed;              /* 1 once the host has published its last record */
    pto_u32 *host_abort;          /* PTO_RUNNING, or why the host stopped the run */
    pto_u64 *record;              /* per slot: its task's record (PTO_RECORD_TICKET ...) */
    pto_u64 *word;                /* the ring of producers' tickets */
    /* written by the blocks, read by the host */
    pto_u64 *done;                /* per slot: the ticket of the task that last finished in it */
    pto_u64 *shown;               /* PTO_WIRED ... PTO_LAST_DONE */
    pto_u32 *device_abort;        /* PTO_RUNNING, or why a block stopped the run */
    /* the blocks' own */
    pto_u64 *staged;              /* per slot: its record as the wirer copied it */
    pto_u64 *staged_word;         /* the ring of producers' tickets as the wirer copied them */
    pto_u64 *counters;            /* PTO_ENQUEUED ... PTO_FINISHED */
    pto_u32 *wiring;              /* the wiring lock: 1 while a block wires */
    pto_u32 *state;               /* per slot: PTO_COMPLETED | successors published */
    pto_i32 *pending;             /* per slot: unfinished producers, + 1 while it is wired */
    pto_u32 *chunk_next;          /* per chunk: the next chunk of its list (chunk `slot`: slot's
                                     first, for good) */
    pto_u32 *chunk_entry;         /* per chunk: PTO_CHUNK successor slots */
    pto_u64 *cell_sequence;       /* the ready queue: per cell, Vyukov's sequence number */
    pto_u32 *cell_slot;           /* ... and the slot it holds */
    /* the wirer's own (under the lock) */
    pto_u32 *successor_count;     /* per slot: successors written */
    pto_u32 *last_chunk;          /* per slot: the chunk the next successor goes into */
    pto_u32 *free_chunk_next;     /* per chunk: the next free chunk */
    pto_u32 *free_chunk_first;    /* the first free chunk, or PTO_NO_CHUNK */
} pto_sched;

/* --- atomics: one spelling, two builds ------------------------------------------------------- */
#ifdef __CUDACC__
/* A load or store of one ordering and scope (PTX's names), on a word of `bits` (register
 * constraint `reg`). */
#define PTO_LOAD(name, order, scope, type, bits, reg)                                \
    PTO_FN type name(const type *p) {                                                \
        type v;                                                                      \
        asm volatile("ld." #order "." #scope ".u" #bits " %0, [%1];"                 \
                     : "=" reg(v) : "l"(p) : "memory");                              \
        return v;                                                                    \
    }
#define PTO_STORE(name, order, scope, type, bits, reg)                               \
    PTO_FN void name(type *p, type v) {                                              \
        asm volatile("st." #order "." #scope ".u" #bits " [%0], %1;"                 \
                     ::"l"(p), reg(v) : "memory");                                   \
    }
/* Words only blocks touch: GPU scope. */
PTO_LOAD(pto_block_load_acquire32, acquire, gpu, pto_u32, 32, "r")
PTO_LOAD(pto_block_load_acquire64, acquire, gpu, pto_u64, 64, "l")
PTO_LOAD(pto_block_load_relaxed64, relaxed, gpu, pto_u64, 64, "l")
PTO_STORE(pto_block_store_release32, release, gpu, pto_u32, 32, "r")
PTO_STORE(pto_block_store_release64, release, gpu, pto_u64, 64, "l")
/* Words the host shares: system scope. */
PTO_LOAD(pto_load_acquire32, acquire, sys, pto_u32, 32, "r")
PTO_LOAD(pto_load_acquire64, acquire, sys, pto_u64, 64, "l")
PTO_STORE(pto_store_release32, release, sys, pto_u32, 32, "r")
PTO_STORE(pto_store_release64, release, sys, pto_u64, 64, "l")
PTO_STORE(pto_store_relaxed64, relaxed, sys, pto_u64, 64, "l")
/* Every read-modify-write is on a word only blocks touch (one writer a word with the host). */
PTO_FN pto_u32 pto_fetch_add32(pto_u32 *p, pto_u32 v) {
    pto_u32 old;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
PTO_FN pto_u64 pto_fetch_add64(pto_u64 *p, pto_u64 v) {
    pto_u64 old;
    asm volatile("atom.acq_rel.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}
PTO_FN pto_u32 pto_fetch_or32(pto_u32 *p, pto_u32 v) {
    pto_u32 old;
    asm volatile("atom.acq_rel.gpu.or.b32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
PTO_FN int pto_cas32(pto_u32 *p, pto_u32 expected, pto_u32 desired) {
    pto_u32 old;
    asm volatile("atom.acq_rel.gpu.cas.b32 %0, [%1], %2, %3;"
                 : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
    return old == expected;
}
PTO_FN int pto_cas64(pto_u64 *p, pto_u64 expected, pto_u64 desired) {
    pto_u64 old;
    asm volatile("atom.acq_rel.gpu.cas.b64 %0, [%1], %2, %3;"
                 : "=l"(old) : "l"(p), "l"(expected), "l"(desired) : "memory");
    return old == expected;
}
/* Fenced accesses, on words only blocks touch: one fence orders them all (one MEMBAR where an
 * acquire load or a release store each is one each, and the loads are in flight side by side):
 * loads that the fence after them makes acquires (pto_block_load_fenced64, then pto_fence_gpu),
 * stores that the fence before them makes releases (pto_fence_gpu, then
 * pto_block_store_fenced64). */
PTO_FN void pto_fence_gpu(void) { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
PTO_FN pto_u64 pto_block_load_fenced64(const pto_u64 *p) { return pto_block_load_relaxed64(p); }
PTO_FN void pto_block_store_fenced64(pto_u64 *p, pto_u64 v) {
    asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
PTO_FN pto_u64 pto_now_ns(void) {
    pto_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
PTO_FN void pto_pause(pto_u32 spins) { __nanosleep(spins < 64 ? 32 : 256); }
#else
/* One scope on the host: the blocks' words' functions are the others. */
#define pto_block_load_acquire32 pto_load_acquire32
#define pto_block_load_acquire64 pto_load_acquire64
#define pto_block_store_release32 pto_store_release32
#define pto_block_store_release64 pto_store_release64
PTO_FN pto_u32 pto_load_acquire32(const pto_u32 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
PTO_FN pto_u64 pto_load_acquire64(const pto_u64 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
PTO_FN pto_u64 pto_block_load_relaxed64(const pto_u64 *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
PTO_FN void pto_store_release32(pto_u32 *p, pto_u32 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
PTO_FN void pto_store_release64(pto_u64 *p, pto_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
PTO_FN void pto_store_relaxed64(pto_u64 *p, pto_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
PTO_FN pto_u32 pto_fetch_add32(pto_u32 *p, pto_u32 v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
PTO_FN pto_u64 pto_fetch_add64(pto_u64 *p, pto_u64 v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
PTO_FN pto_u32 pto_fetch_or32(pto_u32 *p, pto_u32 v) { return __atomic_fetch_or(p, v, __ATOMIC_ACQ_REL); }
/* Fenced accesses (above): ThreadSanitizer does not model fences, so here each fenced load is an
 * acquire and each fenced store a release of its own, and the fence is none. */
PTO_FN void pto_fence_gpu(void) {}
PTO_FN pto_u64 pto_block_load_fenced64(const pto_u64 *p) { return pto_load_acquire64(p); }
PTO_FN void pto_block_store_fenced64(pto_u64 *p, pto_u64 v) { pto_store_release64(p, v); }
PTO_FN int pto_cas32(pto_u32 *p, pto_u32 expected, pto_u32 desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
PTO_FN int pto_cas64(pto_u64 *p, pto_u64 expected, pto_u64 desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
PTO_FN pto_u64 pto_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (pto_u64)t.tv_sec * 1000000000ull + (pto_u64)t.tv_nsec;
}
PTO_FN void pto_pause(pto_u32 spins) {  /* a CPU's threads: yield, then sleep, not spin */
    if (spins >= 4096) {
        const struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    } else if (spins >= 64) {
        sched_yield();
    }
}
#endif

/* pending counts are signed words moved by the same unsigned additions */
PTO_FN pto_i32 pto_pending_add(pto_sched *s, pto_u32 slot, pto_i32 delta) {
    return (pto_i32)pto_fetch_add32((pto_u32 *)&s->pending[slot], (pto_u32)delta);
}

/* Why the run stopped, as a block sees it: PTO_RUNNING, or the reason the last look found in
 * `host_abort`, or a block's own (pto_aborted is the host's view). */
PTO_FN pto_u32 pto_stopped(const pto_sched *s) {
    return (pto_u32)pto_block_load_acquire64(&s->counters[PTO_STOPPED]);
}

/* A block stops the run: the host sees why, and so do the other blocks. */
PTO_FN void pto_stop(pto_sched *s, pto_u32 why) {
    pto_store_release32(s->device_abort, why);
    pto_block_store_release64(&s->counters[PTO_STOPPED], why);
}

/* The blocks' progress, as a block sees it: a sum of counters that only grow, so it moves when
 * any of them does. */
PTO_FN pto_u64 pto_progress(const pto_sched *s) {
    return pto_block_load_acquire64(&s->counters[PTO_WIRED_SEEN]) +
           pto_block_load_acquire64(&s->counters[PTO_DEQUEUED]) +
           pto_block_load_acquire64(&s->counters[PTO_FINISHED]);
}

/* Waiting on the blocks: how far they were and since when. */
typedef struct {
    pto_u64 seen, since;
} pto_patience;

PTO_FN pto_patience pto_patience_now(const pto_sched *s) {
    const pto_patience patience = {pto_progress(s), pto_now_ns()};
    return patience;
}

/* Whether the blocks have made no progress for PTO_PATIENCE_NS: renewed where they have, or
 * where `owed_nothing` (every published task finished: they wait for the host). */
PTO_FN int pto_out_of_patience(const pto_sched *s, pto_patience *patience, int owed_nothing) {
    const pto_u64 progress = pto_progress(s), now = pto_now_ns();
    if (progress != patience->seen || owed_nothing) {
        patience->seen = progress;
        patience->since = now;
        return 0;
    }
    return now - patience->since > PTO_PATIENCE_NS;
}

/* --- the ready queue ------------------------------------------------------------------------- */
/* Push `count` slots into consecutive cells, as many at a time as are free: their sequences
 * loaded side by side and fenced, one compare-and-swap to take them, one fence before their
 * release. 0, or
 * 1 where a cell stays taken for PTO_PATIENCE_NS (a protocol error). The queue holds each slot
 * at most once, but a cell is free only once the block that popped its last entry has released
 * it: a block stalled between the two holds its cell while the positions move on past it, so a
 * push that finds its cell not yet released waits for it. */
PTO_FN int pto_ready_push(pto_sched *s, const pto_u32 *slots, pto_u32 count) {
    const pto_u64 mask = s->slots - 1;
    pto_u64 since = 0;
    for (pto_u32 spins = 0; count > 0; ++spins) {
        const pto_u64 position = pto_block_load_relaxed64(&s->counters[PTO_ENQUEUED]);
        const pto_u32 trying = count < PTO_PUSH_MOST ? count : PTO_PUSH_MOST;
        pto_u64 sequence[PTO_PUSH_MOST];
        PTO_UNROLL
        for (pto_u32 k = 0; k < PTO_PUSH_MOST; ++k)
            if (k < trying) sequence[k] = pto_block_load_fenced64(&s->cell_sequence[(position + k) & mask]);
        pto_fence_gpu();
        pto_u32 free = 0;
        while (free < trying && sequence[free] == position + free) ++free;
        if (free > 0) {
            if (!pto_cas64(&s->counters[PTO_ENQUEUED], position, position + free)) continue;
            for (pto_u32 k = 0; k < free; ++k) s->cell_slot[(position + k) & mask] = slots[k];
            pto_fence_gpu();
            for (pto_u32 k = 0; k < free; ++k)
                pto_block_store_fenced64(&s->cell_sequence[(position + k) & mask], position + k + 1);
            slots += free;
            count -= free;
            since = 0;
        } else if ((long long)(sequence[0] - position) < 0) {
            const pto_u64 now = pto_now_ns();
            if (since == 0) since = now;
            if (now - since > PTO_PATIENCE_NS) return 1;
            pto_pause(spins);
        }
    }
    return 0;
}

/* Ready slots gathered to be pushed together (pto_ready_push): pto_push_later adds one, pushing
 * them all once there are PTO_PUSH_MOST, pto_push_now pushes what there is. 0, or 1 as the push. */
typedef struct {
    pto_u32 count;
    pto_u32 slot[PTO_PUSH_MOST];
} pto_ready_slots;

PTO_FN int pto_push_now(pto_sched *s, pto_ready_slots *ready) {
    const int full = pto_ready_push(s, ready->slot, ready->count);
    ready->count = 0;
    return full;
}

PTO_FN int pto_push_later(pto_sched *s, pto_ready_slots *ready, pto_u32 slot) {
    ready->slot[ready->count++] = slot;
    return ready->count == PTO_PUSH_MOST ? pto_push_now(s, ready) : 0;
}

/* Pop a slot into *slot: 1, or 0 where the queue is empty. */
PTO_FN int pto_ready_pop(pto_sched *s, pto_u32 *slot) {
    const pto_u64 mask = s->slots - 1;
    pto_u64 position = pto_block_load_relaxed64(&s->counters[PTO_DEQUEUED]);
    for (;;) {
        pto_u64 *sequence = &s->cell_sequence[position & mask];
        const long long lag = (long long)(pto_block_load_acquire64(sequence) - (position + 1));
        if (lag == 0) {
            if (pto_cas64(&s->counters[PTO_DEQUEUED], position, position + 1)) break;
        } else if (lag < 0) {
            return 0;
        }
        position = pto_block_load_relaxed64(&s->counters[PTO_DEQUEUED]);
    }
    PTO_HOLDING_CELL(position);
    *slot = s->cell_slot[position & mask];
    pto_block_store_release64(&s->cell_sequence[position & mask], position + mask + 1);
    return 1;
}

/* --- wiring (a block holding the lock) ------------------------------------------------------- */
/* Successor lists: chunk `slot` is slot's first, for good (its list's other chunks come from
 * the pool, the chunks past the slots', and go back when the slot is wired again). */
PTO_FN pto_u32 pto_take_chunk(pto_sched *s) {
    const pto_u32 chunk = *s->free_chunk_first;
    if (chunk != PTO_NO_CHUNK) {
        *s->free_chunk_first = s->free_chunk_next[chunk];
        s->chunk_next[chunk] = PTO_NO_CHUNK;
    }
    return chunk;
}

/* The pool's chunks of the done task in `slot` back to the pool. */
PTO_FN void pto_retire(pto_sched *s, pto_u32 slot) {
    for (pto_u32 chunk = s->chunk_next[slot], next; chunk != PTO_NO_CHUNK; chunk = next) {
        next = s->chunk_next[chunk];
        s->free_chunk_next[chunk] = *s->free_chunk_first;
        *s->free_chunk_first = chunk;
    }
    s->chunk_next[slot] = PTO_NO_CHUNK;
}

/* Make the task in `slot` wait for the task in `producer`: 0, or 1 where the pool is empty. */
PTO_FN int pto_link(pto_sched *s, pto_u32 producer, pto_u32 slot) {
    const pto_u32 index = s->successor_count[producer];
    if (index > 0 && index % PTO_CHUNK == 0) {
        const pto_u32 chunk = pto_take_chunk(s);
        if (chunk == PTO_NO_CHUNK) return 1;
        s->chunk_next[s->last_chunk[producer]] = chunk;
        s->last_chunk[producer] = chunk;
    }
    s->chunk_entry[(pto_u64)s->last_chunk[producer] * PTO_CHUNK + index % PTO_CHUNK] = slot;
    s->successor_count[producer] = index + 1;
    pto_pending_add(s, slot, 1);
    if (pto_fetch_add32(&s->state[producer], 1) & PTO_COMPLETED) pto_pending_add(s, slot, -1);
    return 0;
}

/* The host's words, read by the wiring lock's holder and left in the blocks' own: what was
 * published (the value returned) and whether that was the last, and whether the host stopped. */
PTO_FN pto_u64 pto_look_at_host(pto_sched *s) {
    const pto_u32 host = pto_load_acquire32(s->host_abort);
    if (host != PTO_RUNNING) pto_block_store_release64(&s->counters[PTO_STOPPED], host);
    /* `closed` first: once it reads 1, `submitted` is the last task's (read the other way
     * round, a task published between the two loads would be left unrun) */
    const int closed = pto_load_acquire32(s->closed) != 0;
    PTO_BETWEEN_LOADS();
    const pto_u64 published = pto_load_acquire64(s->submitted);
    pto_block_store_release64(&s->counters[PTO_PUBLISHED], published);
    if (closed) pto_block_store_release64(&s->counters[PTO_CLOSED], 1);
    pto_block_store_release64(&s->counters[PTO_LOOKED_AT], pto_now_ns());
    return published;
}

/* A task's field (PTO_RECORD_TICKET ...) as the wirer staged it. */
PTO_FN pto_u64 pto_staged(const pto_sched *s, pto_u32 slot, pto_u32 field) {
    return s->staged[(pto_u64)slot * s->record_words + field];
}

/* Take the wiring lock for the records published after the last wired, at most `budget` of them,
 * if no other block holds it, looking at the host's words first; where none is left to wire, only
 * if none has looked for PTO_LOOK_NS. How many, from ticket *from, the caller holding the lock
 * for its block to stage them (pto_stage) and then to wire them (pto_wire_staged); or 0, the
 * lock not held. */
PTO_FN pto_u32 pto_wire_claim(pto_sched *s, pto_u32 budget, pto_u64 *from) {
    if (pto_block_load_acquire64(&s->counters[PTO_WIRED_SEEN]) ==
            pto_block_load_acquire64(&s->counters[PTO_PUBLISHED]) &&
        pto_now_ns() - pto_block_load_relaxed64(&s->counters[PTO_LOOKED_AT]) < PTO_LOOK_NS)
        return 0;
    if (pto_block_load_acquire32(s->wiring) != 0 || !pto_cas32(s->wiring, 0, 1)) return 0;
    const pto_u64 published = pto_look_at_host(s);
    /* under the lock: current */
    const pto_u64 wired = pto_block_load_acquire64(&s->counters[PTO_WIRED_SEEN]);
    /* a stopped run: nothing more made ready (the host may have moved on) */
    if (pto_stopped(s) != PTO_RUNNING || published == wired) {
        pto_block_store_release32(s->wiring, 0);
        return 0;
    }
    *from = wired;
    return published - wired < budget ? (pto_u32)(published - wired) : budget;
}

/* A word to stage: where it comes from, in the host's memory, and where it goes (`from` 0: none). */
typedef struct {
    const pto_u64 *from;
    pto_u64 *to;
} pto_copy;

/* The producers' tickets that the staged records of tickets [from, from + count) name: where
 * they start in the ring and how many (contiguous: the host gives each task the words after the
 * last's; kept within the ring, as every bound the host gives). */
typedef struct {
    pto_u64 begin, words;
} pto_span;

PTO_FN pto_span pto_named_words(const pto_sched *s, pto_u64 from, pto_u32 count) {
    const pto_u64 mask = s->slots - 1;
    const pto_u32 first = (pto_u32)(from & mask), last = (pto_u32)((from + count - 1) & mask);
    const pto_u64 begin = pto_staged(s, first, PTO_RECORD_FIRST_WORD),
                  end = pto_staged(s, last, PTO_RECORD_FIRST_WORD) +
                        pto_staged(s, last, PTO_RECORD_PRODUCERS);
    const pto_span span = {begin, end - begin < s->words ? end - begin : s->words};
    return span;
}

/* The words to stage for records [from, from + count): in phase 0 their headers; in phase 1
 * the producers' tickets they name (`named`), then the rest of each record, word by word
 * across the records, so that the words in use (each record's first) come first. */
PTO_FN pto_u64 pto_stage_words(const pto_sched *s, pto_u32 count, int phase, pto_span named) {
    return phase == 0 ? (pto_u64)count * PTO_RECORD_HEADER
                      : named.words + (pto_u64)count * (s->record_words - PTO_RECORD_HEADER);
}

/* Word `i` of that phase: where from and where to; none where it is past its record's length. */
PTO_FN pto_copy pto_stage_word(const pto_sched *s, pto_u64 from, pto_u32 count, int phase, pto_span named,
                               pto_u64 i) {
    const pto_u64 mask = s->slots - 1, width = s->record_words;
    pto_copy copy = {0, 0};
    if (phase == 0) {
        const pto_u64 at = ((from + i / PTO_RECORD_HEADER) & mask) * width + i % PTO_RECORD_HEADER;
        copy.from = &s->record[at];
        copy.to = &s->staged[at];
    } else if (i < named.words) {
        const pto_u64 at = (named.begin + i) & (s->words - 1);
        copy.from = &s->word[at];
        copy.to = &s->staged_word[at];
    } else {
        const pto_u64 slot = (from + (i - named.words) % count) & mask,
                      word = PTO_RECORD_HEADER + (i - named.words) / count;
        if (word < pto_staged(s, (pto_u32)slot, PTO_RECORD_LENGTH)) {
            copy.from = &s->record[slot * width + word];
            copy.to = &s->staged[slot * width + word];
        }
    }
    return copy;
}

/* The block's staging of the records of tickets [from, from + count), the caller's thread
 * `thread` of `threads`: in each phase (pto_stage_words) every threads-th word, PTO_STAGE_LOADS
 * of its loads of the host's memory in flight together, so that the block's loads cross PCIe
 * side by side. Every thread of the block calls it; a barrier ends each phase. */
PTO_FN void pto_stage(pto_sched *s, pto_u64 from, pto_u32 count, pto_u32 thread, pto_u32 threads) {
    pto_span named = {0, 0};
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1) named = pto_named_words(s, from, count); /* from the headers staged */
        const pto_u64 words = pto_stage_words(s, count, phase, named);
        for (pto_u64 base = thread; base < words; base += (pto_u64)threads * PTO_STAGE_LOADS) {
            pto_copy copy[PTO_STAGE_LOADS];
            pto_u64 value[PTO_STAGE_LOADS];
            PTO_UNROLL
            for (pto_u32 k = 0; k < PTO_STAGE_LOADS; ++k) {
                const pto_u64 i = base + (pto_u64)k * threads;
                const pto_copy none = {0, 0};
                copy[k] = i < words ? pto_stage_word(s, from, count, phase, named, i) : none;
            }
            PTO_UNROLL
            for (pto_u32 k = 0; k < PTO_STAGE_LOADS; ++k)
                if (copy[k].from) value[k] = *copy[k].from;
            PTO_UNROLL
            for (pto_u32 k = 0; k < PTO_STAGE_LOADS; ++k)
                if (copy[k].from) *copy[k].to = value[k];
        }
        PTO_BLOCK_SYNC();
    }
}

/* Wire the staged records of tickets [from, from + count), the wiring lock's holder, then let
 * the lock go: 0, or 1 on an error (an empty chunk pool, a full queue, a record staged for
 * another ticket), which stops the run. */
PTO_FN int pto_wire_staged(pto_sched *s, pto_u64 from, pto_u32 count) {
    pto_u64 ticket = from, words_read = 0;
    int failed = 0, read = 0;
    pto_ready_slots ready = {0, {0}};
    for (; ticket < from + count && !failed; ++ticket) {
        const pto_u32 slot = (pto_u32)(ticket & (s->slots - 1));
        if (pto_staged(s, slot, PTO_RECORD_TICKET) != ticket) {
            failed = 1;
            break;
        }
        if (ticket >= s->slots) pto_retire(s, slot);  /* the host saw its task done */
        s->last_chunk[slot] = slot;
        s->successor_count[slot] = 0;
        s->pending[slot] = 1;
        s->state[slot] = 0;
        const pto_u64 first = pto_staged(s, slot, PTO_RECORD_FIRST_WORD);
        const pto_u32 producers = (pto_u32)pto_staged(s, slot, PTO_RECORD_PRODUCERS);
        int linked = 0;
        for (pto_u32 i = 0; i < producers && !failed; ++i) {
            const pto_u64 producer = s->staged_word[(first + i) & (s->words - 1)];
            if (producer + s->slots > ticket) {  /* its slot still holds it */
                failed = pto_link(s, (pto_u32)(producer & (s->slots - 1)), slot);
                linked = 1;
            }
        }
        words_read = first + producers;
        read = 1;
        /* the guard dropped: by an atomic where a producer may take its 1 back, else none */
        if (!failed && (!linked || pto_pending_add(s, slot, -1) == 1))
            failed = pto_push_later(s, &ready, slot);
    }
    failed |= pto_push_now(s, &ready);
    /* once a batch: each system-scope release is a MEMBAR.SYS on the GPU */
    if (read) pto_store_release64(&s->shown[PTO_WORDS_READ], words_read);
    if (ticket != from) {
        pto_store_release64(&s->shown[PTO_WIRED], ticket);
        pto_block_store_release64(&s->counters[PTO_WIRED_SEEN], ticket);
    }
    /* the look counted from now: staging takes longer than PTO_LOOK_NS, and the block is to pop
     * what it wired before it looks again (unless more was published than it took) */
    pto_block_store_release64(&s->counters[PTO_LOOKED_AT], pto_now_ns());
    pto_block_store_release32(s->wiring, 0);
    return failed;
}

/* --- a block's side -------------------------------------------------------------------------- */
/* Pieces. A task runs as its record's PTO_RECORD_PIECES pieces (the blocks of its stream
 * launch's grid: piece p runs its code as block p of that many), each on one block. The block
 * that pops a task of several runs piece 0 and puts the task on the board, where blocks waiting
 * for work take its other pieces one at a time; where the board is full, the popper runs them
 * all. The block whose pieces bring the count run to the total completes the task
 * (pto_pieces_ran). A board entry is the task's ticket + 1 (its low 32 bits: a run of 2^32 tasks
 * would wrap), its pieces (at most 0xFFFF) and how many are taken; 0 is free, and `open` counts
 * the entries with a piece not taken. An entry's task cannot complete while it has a piece not
 * taken, so its slot holds it wherever a block's swap of the entry succeeds. */
typedef struct {
    pto_u64 *began;         /* per slot: pto_now_ns() when a block took its task (pto_start) */
    pto_u32 *pieces_run;    /* per slot: pieces of its task run so far */
    pto_u64 *board;         /* `entries` of them */
    pto_u64 entries;
    pto_u32 *open;          /* entries with a piece not taken */
} pto_board;

/* What a block runs next: pieces first..last-1 of the `pieces` of the task in `slot`. */
typedef struct {
    pto_u32 slot, first, last, pieces;
} pto_work;

PTO_FN pto_u64 pto_board_word(pto_u64 ticket, pto_u32 pieces, pto_u32 taken) {
    return (ticket + 1) << 32 | (pto_u64)pieces << 16 | taken;
}

/* Take a piece of a task on the board into *w: 1, or 0 where there is none. */
PTO_FN int pto_take_piece(const pto_sched *s, const pto_board *b, pto_work *w) {
    if (pto_block_load_acquire32(b->open) == 0) return 0;
    for (pto_u64 e = 0; e < b->entries; ++e) {
        for (;;) {
            const pto_u64 word = pto_block_load_acquire64(&b->board[e]);
            if (word == 0) break;
            const pto_u32 pieces = (pto_u32)(word >> 16) & 0xFFFFu, taken = (pto_u32)word & 0xFFFFu;
            if (taken >= pieces) break; /* the last taker frees the entry */
            if (pto_cas64(&b->board[e], word, word + 1)) {
                if (taken + 1 == pieces) {
                    pto_block_store_release64(&b->board[e], 0);
                    pto_fetch_add32(b->open, (pto_u32)-1);
                }
                w->slot = (pto_u32)((word >> 32) - 1) & (s->slots - 1);
                w->first = taken;
                w->last = taken + 1;
                w->pieces = pieces;
                return 1;
            }
        }
    }
    return 0;
}

/* Put the popped task in `slot` (ticket `ticket`, of `pieces`; its piece 0 the caller's) on
 * the board: 1, or 0 where the board is full. */
PTO_FN int pto_post_pieces(const pto_board *b, pto_u32 slot, pto_u64 ticket, pto_u32 pieces) {
    b->pieces_run[slot] = 0; /* published with the entry */
    for (pto_u64 e = 0; e < b->entries; ++e)
        if (pto_cas64(&b->board[e], 0, pto_board_word(ticket, pieces, 1))) {
            pto_fetch_add32(b->open, 1);
            return 1;
        }
    return 0;
}

/* The ready task in w->slot is the block's (popped, or kept): w says its piece 0, the task put
 * on the board if it has more, all its pieces where the board is full. */
PTO_FN void pto_start(const pto_sched *s, const pto_board *b, pto_work *w) {
    const pto_u32 listed = (pto_u32)pto_staged(s, w->slot, PTO_RECORD_PIECES);
    const pto_u32 pieces = listed > 0 ? listed : 1;
    b->began[w->slot] = pto_now_ns(); /* before the board shows the task */
    w->first = 0;
    w->last = pieces > 1 && pto_post_pieces(b, w->slot, pto_staged(s, w->slot, PTO_RECORD_TICKET), pieces)
                  ? 1 : pieces;
    w->pieces = pieces;
}

/* Thread 0's turn of its block's wait for work (pto_block_next_work): PTO_GOT_TASK (in *w: the
 * task in *kept, which the block's last completion made ready (pto_complete), else a piece of a
 * task on the board, else a ready task: pto_start); PTO_TO_STAGE, holding the wiring lock for
 * *count records from ticket *from; PTO_ALL_DONE once the host has closed and every task it
 * published has finished; PTO_ABORTED where the run was stopped (by the host, another block, or
 * this one: a task left unfinished and no progress for PTO_PATIENCE_NS); or PTO_NOTHING_YET,
 * after a pause. */
PTO_FN int pto_turn(pto_sched *s, const pto_board *b, pto_work *w, pto_u32 *kept, pto_patience *patience,
                    pto_u32 spins, pto_u64 *from, pto_u32 *count) {
    if (pto_stopped(s) != PTO_RUNNING) return PTO_ABORTED;
    if (*kept != PTO_NO_SLOT) {
        w->slot = *kept;
        *kept = PTO_NO_SLOT;
        pto_start(s, b, w);
        return PTO_GOT_TASK;
    }
    if (pto_take_piece(s, b, w)) return PTO_GOT_TASK;
    if ((*count = pto_wire_claim(s, 64, from)) != 0) return PTO_TO_STAGE;
    /* again: this block's look may have found the run stopped (a kernel that starts after the
     * host gave up on it runs nothing: its tasks' memory may be another run's now) */
    if (pto_stopped(s) != PTO_RUNNING) return PTO_ABORTED;
    if (pto_ready_pop(s, &w->slot)) {
        pto_start(s, b, w);
        return PTO_GOT_TASK;
    }
    /* PTO_CLOSED first, as pto_look_at_host reads the host's words; the rest every
     * PTO_CHECK_EVERY turns until the host closes (the end needs `closed`, and patience is
     * seconds): an idle turn's loads are what every idle block puts on the L2 */
    const int closed = pto_block_load_acquire64(&s->counters[PTO_CLOSED]) != 0;
    if (patience->since == 0) *patience = pto_patience_now(s);
    if (closed || spins % PTO_CHECK_EVERY == 0) {
        PTO_BETWEEN_LOADS();
        const pto_u64 published = pto_block_load_acquire64(&s->counters[PTO_PUBLISHED]);
        const pto_u64 finished = pto_block_load_acquire64(&s->counters[PTO_FINISHED]);
        if (closed && finished == published) return PTO_ALL_DONE;
        if (pto_out_of_patience(s, patience, finished == published)) {
            pto_stop(s, PTO_STUCK);
            return PTO_ABORTED;
        }
    }
    pto_pause(spins);
    return PTO_NOTHING_YET;
}

/* Wait for work, the block's threads together: each calls it (the caller is thread `thread` of
 * `threads`; `said`, PTO_SAID_WORDS words of the block's shared memory; `kept`, thread 0's).
 * Thread 0 takes turns (pto_turn) alone until one finds something, and tells the others what:
 * records to stage, which the block stages together (pto_stage) and thread 0 then wires, or
 * the outcome.
 * PTO_GOT_TASK (in *w, for every thread), PTO_ALL_DONE or PTO_ABORTED as pto_turn says, over one
 * patience however many turns it takes. The threads read `said` until they return: they must
 * meet at a barrier before the block calls it again (where thread 0 writes it), as a task's run
 * has them do. */
PTO_FN int pto_block_next_work(pto_sched *s, const pto_board *b, pto_work *w, pto_u32 *kept, pto_u64 *said,
                               pto_u32 thread, pto_u32 threads) {
    pto_patience patience = {0, 0}; /* from the first turn that finds nothing (pto_turn) */
    pto_u32 spins = 0;
    for (;;) {
        if (thread == 0) {
            pto_u64 from = 0;
            pto_u32 count = 0;
            const pto_work none = {0, 0, 0, 0};
            int found;
            do { /* an idle block's turns cost its other threads no barrier */
                *w = none;
                found = pto_turn(s, b, w, kept, &patience, spins++, &from, &count);
            } while (found == PTO_NOTHING_YET);
            said[PTO_SAID_OUTCOME] = (pto_u64)found;
            said[PTO_SAID_SLOT] = w->slot;
            said[PTO_SAID_FIRST] = w->first;
            said[PTO_SAID_LAST] = w->last;
            said[PTO_SAID_PIECES] = w->pieces;
            said[PTO_SAID_FROM] = from;
            said[PTO_SAID_COUNT] = count;
        }
        PTO_BLOCK_SYNC();
        const int found = (int)said[PTO_SAID_OUTCOME];
        if (found == PTO_TO_STAGE) { /* pto_stage's barriers come after every thread's reads */
            const pto_u64 from = said[PTO_SAID_FROM];
            const pto_u32 count = (pto_u32)said[PTO_SAID_COUNT];
            pto_stage(s, from, count, thread, threads);
            if (thread == 0 && pto_wire_staged(s, from, count)) pto_stop(s, PTO_FAULTED);
            spins = 0;
            continue;
        }
        w->slot = (pto_u32)said[PTO_SAID_SLOT];
        w->first = (pto_u32)said[PTO_SAID_FIRST];
        w->last = (pto_u32)said[PTO_SAID_LAST];
        w->pieces = (pto_u32)said[PTO_SAID_PIECES];
        return found;
    }
}

/* The block has run w's pieces (its writes fenced at GPU scope): 1 where they were the task's
 * last to finish, and the caller completes it. */
PTO_FN int pto_pieces_ran(const pto_board *b, const pto_work *w) {
    const pto_u32 ran = w->last - w->first;
    return ran == w->pieces || pto_fetch_add32(&b->pieces_run[w->slot], ran) + ran == w->pieces;
}

/* The task in `slot` has run: its successors published so far lose a pending producer (of
 * those that reach 0, the first goes into *kept where that is PTO_NO_SLOT, for the block to run
 * next, and the others are pushed), and it counts as finished; the caller then shows the host
 * (pto_show_done). 0, or 1 on a full queue. */
PTO_FN int pto_complete(pto_sched *s, pto_u32 slot, pto_u32 *kept) {
    const pto_u32 published = pto_fetch_or32(&s->state[slot], PTO_COMPLETED) & ~PTO_COMPLETED;
    int full = 0;
    pto_ready_slots ready = {0, {0}};
    pto_u32 chunk = slot;  /* its list's first */
    for (pto_u32 i = 0; i < published; ++i) {
        if (i > 0 && i % PTO_CHUNK == 0) chunk = s->chunk_next[chunk];
        const pto_u32 successor = s->chunk_entry[(pto_u64)chunk * PTO_CHUNK + i % PTO_CHUNK];
        if (pto_pending_add(s, successor, -1) != 1) continue;
        if (*kept == PTO_NO_SLOT)
            *kept = successor;
        else
            full |= pto_push_later(s, &ready, successor);
    }
    full |= pto_push_now(s, &ready);
    pto_fetch_add64(&s->counters[PTO_FINISHED], 1);
    return full;
}

/* The completed task in `slot` (ticket `ticket`) is done, as the host sees it: a system-scope
 * release of the slot's `done`, a MEMBAR.SYS that waits for the block's stores to the host's
 * memory, which is why it comes after the successors' hand-over (pto_complete). */
PTO_FN void pto_show_done(pto_sched *s, pto_u32 slot, pto_u64 ticket) {
    pto_store_release64(&s->done[slot], ticket);
    pto_store_relaxed64(&s->shown[PTO_LAST_DONE], ticket + 1); /* a sign of progress, no more */
}

/* --- the host's side: loads and stores only ----------------------------------------------------- */
#ifndef __CUDACC__
/* Lay the arrays of a scheduler of these sizes out in two regions, and say how many bytes each
 * takes: the blocks' own words in `device` memory, the words the host writes or reads in
 * `mapped` memory (host memory the GPU reaches: cudaHostAllocMapped, write-back), each array
 * at a multiple of 128 bytes (an L2 line) from its region's base. With bases of 0, only the
 * sizes. */
typedef struct {
    pto_u64 device_bytes, mapped_bytes;
} pto_extent;

/* The successor pool the header's bound asks for: where any `slots` consecutive tasks name at
 * most `named` producers in all, slots + ceil(named / PTO_CHUNK) chunks. */
PTO_FN pto_u32 pto_pool_chunks(pto_u32 slots, pto_u64 named) {
    return slots + (pto_u32)((named + PTO_CHUNK - 1) / PTO_CHUNK);
}

PTO_FN void *pto_carve(char *base, pto_u64 *used, pto_u64 count, pto_u64 size) {
    void *at = (void *)((uintptr_t)base + *used);
    *used += (count * size + 127) / 128 * 128;
    return at;
}

PTO_FN pto_extent pto_layout(pto_sched *s, pto_u32 slots, pto_u32 words, pto_u32 chunks, pto_u32 record_words,
                             char *device, char *mapped) {
    pto_extent e = {0, 0};
    s->slots = slots;
    s->words = words;
    s->chunks = chunks;
    s->record_words = record_words;
    s->submitted = (pto_u64 *)pto_carve(mapped, &e.mapped_bytes, 1, sizeof(pto_u64));
    s->closed = (pto_u32 *)pto_carve(mapped, &e.mapped_bytes, 1, sizeof(pto_u32));
    s->host_abort = (pto_u32 *)pto_carve(mapped, &e.mapped_bytes, 1, sizeof(pto_u32));
    s->word = (pto_u64 *)pto_carve(mapped, &e.mapped_bytes, words, sizeof(pto_u64));
    s->done = (pto_u64 *)pto_carve(mapped, &e.mapped_bytes, slots, sizeof(pto_u64));
    s->shown = (pto_u64 *)pto_carve(mapped, &e.mapped_bytes, PTO_SHOWN, sizeof(pto_u64));
    s->device_abort = (pto_u32 *)pto_carve(mapped, &e.mapped_bytes, 1, sizeof(pto_u32));
    /* last, what a run's first state leaves as it is (pto_initial) */
    s->record = (pto_u64 *)pto_carve(mapped, &e.mapped_bytes, (pto_u64)slots * record_words, sizeof(pto_u64));
    s->counters = (pto_u64 *)pto_carve(device, &e.device_bytes, PTO_COUNTERS, sizeof(pto_u64));
    s->wiring = (pto_u32 *)pto_carve(device, &e.device_bytes, 1, sizeof(pto_u32));
    s->state = (pto_u32 *)pto_carve(device, &e.device_bytes, slots, sizeof(pto_u32));
    s->pending = (pto_i32 *)pto_carve(device, &e.device_bytes, slots, sizeof(pto_i32));
    s->chunk_next = (pto_u32 *)pto_carve(device, &e.device_bytes, chunks, sizeof(pto_u32));
    s->chunk_entry = (pto_u32 *)pto_carve(device, &e.device_bytes, (pto_u64)chunks * PTO_CHUNK, sizeof(pto_u32));
    s->cell_sequence = (pto_u64 *)pto_carve(device, &e.device_bytes, slots, sizeof(pto_u64));
    s->cell_slot = (pto_u32 *)pto_carve(device, &e.device_bytes, slots, sizeof(pto_u32));
    s->successor_count = (pto_u32 *)pto_carve(device, &e.device_bytes, slots, sizeof(pto_u32));
    s->last_chunk = (pto_u32 *)pto_carve(device, &e.device_bytes, slots, sizeof(pto_u32));
    s->free_chunk_next = (pto_u32 *)pto_carve(device, &e.device_bytes, chunks, sizeof(pto_u32));
    s->free_chunk_first = (pto_u32 *)pto_carve(device, &e.device_bytes, 1, sizeof(pto_u32));
    /* last, what a run's first state leaves as it is (pto_initial) */
    s->staged = (pto_u64 *)pto_carve(device, &e.device_bytes, (pto_u64)slots * record_words, sizeof(pto_u64));
    s->staged_word = (pto_u64 *)pto_carve(device, &e.device_bytes, words, sizeof(pto_u64));
    return e;
}

/* A run's first state, written through `s` into zeroed regions (the host's view of both: on a
 * GPU, of a copy of the device region that the host then copies there): every cell of the
 * ready queue free, no task done in any slot, each slot's first chunk alone in its list and
 * the chunks past the slots' in the pool. The records and their
 * staged copies, each region's last arrays, need none (each word is written before it is read):
 * only the bytes before them need be zeroed. */
PTO_FN void pto_initial(pto_sched *s) {
    for (pto_u32 i = 0; i < s->slots; ++i) {
        s->cell_sequence[i] = i;
        s->done[i] = (pto_u64)-1;
    }
    for (pto_u32 i = 0; i < s->chunks; ++i) {
        if (i < s->slots) s->chunk_next[i] = PTO_NO_CHUNK;
        s->free_chunk_next[i] = i + 1 < s->chunks ? i + 1 : PTO_NO_CHUNK;
    }
    *s->free_chunk_first = s->chunks > s->slots ? s->slots : PTO_NO_CHUNK;
}

/* Why the run stopped, as the host sees it: PTO_RUNNING, or a reason of its own or a block's. */
PTO_FN pto_u32 pto_aborted(const pto_sched *s) {
    const pto_u32 host = pto_load_acquire32(s->host_abort);
    return host != PTO_RUNNING ? host : pto_load_acquire32(s->device_abort);
}

/* The host's patience: it reads only the words the blocks show (their counters may be device
 * memory), so the blocks' progress is their wiring and their completions. */
typedef struct {
    pto_u64 wired, last_done, since;
} pto_host_patience;

PTO_FN pto_host_patience pto_host_patience_now(const pto_sched *s) {
    const pto_host_patience patience = {pto_load_acquire64(&s->shown[PTO_WIRED]),
                                        pto_load_acquire64(&s->shown[PTO_LAST_DONE]), pto_now_ns()};
    return patience;
}

/* One turn of a host's wait on the blocks: 1 where it must stop, the run stopped, or the
 * blocks out of patience (the host then stores PTO_STUCK in host_abort: a task has run that
 * long, or waits for ever). */
PTO_FN int pto_host_gives_up(pto_sched *s, pto_host_patience *patience) {
    if (pto_aborted(s) != PTO_RUNNING) return 1;
    const pto_host_patience now = pto_host_patience_now(s);
    if (now.wired != patience->wired || now.last_done != patience->last_done) {
        *patience = now;
        return 0;
    }
    if (now.since - patience->since <= PTO_PATIENCE_NS) return 0;
    pto_store_release32(s->host_abort, PTO_STUCK);
    return 1;
}

/* Wait until the task with `ticket` in `slot` is done: 0, or 1 where the host gave up. */
PTO_FN int pto_host_wait_done(pto_sched *s, pto_u32 slot, pto_u64 ticket) {
    pto_host_patience patience = pto_host_patience_now(s);
    for (pto_u32 spins = 0; pto_load_acquire64(&s->done[slot]) != ticket; ++spins) {
        if (pto_host_gives_up(s, &patience)) return 1;
        pto_pause(spins);
    }
    return 0;
}

/* Publish task `ticket` (the next one) with its producers' tickets (each below `ticket`), run as
 * `pieces`, its record's words past the header (the caller's, written) `own_words` of them:
 * waits for its slot's previous task and for room in the ring of words. 0, or 1 where a wait
 * failed (pto_host_wait_done), or where the ring cannot hold `count` words, a producer is not an
 * earlier task or the record not `own_words` (each stops the run: PTO_FAULTED). */
PTO_FN int pto_host_submit(pto_sched *s, pto_u64 ticket, pto_u64 *next_word, const pto_u64 *producers,
                           pto_u32 count, pto_u32 pieces, pto_u32 own_words) {
    const pto_u32 slot = (pto_u32)(ticket & (s->slots - 1));
    int refused = count > s->words || (pto_u64)PTO_RECORD_HEADER + own_words > s->record_words;
    for (pto_u32 i = 0; i < count && !refused; ++i) refused = producers[i] >= ticket;
    if (refused) {
        pto_store_release32(s->host_abort, PTO_FAULTED);
        return 1;
    }
    if (ticket >= s->slots && pto_host_wait_done(s, slot, ticket - s->slots)) return 1;
    pto_host_patience patience = pto_host_patience_now(s);
    for (pto_u32 spins = 0; *next_word + count - pto_load_acquire64(&s->shown[PTO_WORDS_READ]) > s->words;
         ++spins) {
        if (pto_host_gives_up(s, &patience)) return 1;
        pto_pause(spins);
    }
    for (pto_u32 i = 0; i < count; ++i) s->word[(*next_word + i) & (s->words - 1)] = producers[i];
    pto_u64 *record = &s->record[(pto_u64)slot * s->record_words];
    record[PTO_RECORD_TICKET] = ticket;
    record[PTO_RECORD_FIRST_WORD] = *next_word;
    record[PTO_RECORD_PRODUCERS] = count;
    record[PTO_RECORD_PIECES] = pieces;
    record[PTO_RECORD_LENGTH] = PTO_RECORD_HEADER + own_words;
    *next_word += count;
    pto_store_release64(s->submitted, ticket + 1);
    return 0;
}
#endif

#endif
