/* A CUDA driver API emulator: the driver functions the stream executor calls, with the real
 * driver's C signatures and CUDA's rules, run on the host, so that the CUDA stream path runs
 * and is tested where there is no GPU (backend="cuda-emulated"; emulator.py builds and loads
 * this file).
 *
 * Each stream is a host thread working through its own FIFO queue of commands (kernel launch,
 * event record, wait on an event, memset, memcpy, graph launch); every enqueue returns at once. Memory is host
 * memory: a CUdeviceptr is a host address. A kernel is a host function made a CUfunction by
 * pto_emu_function. A kernel that faults sets the sticky error, as on a GPU: from then on every
 * driver call returns CUDA_ERROR_ILLEGAL_ADDRESS and no queued work runs, until pto_emu_reset.
 *
 * Stream capture (cuStreamBeginCapture_v2 ... cuStreamEndCapture) and graphs (instantiate, launch,
 * destroy) follow CUDA's rules, simplified where they do not change what runs; the rules and
 * the simplifications are described at "stream capture and graphs" below.
 *
 * Not emulated: the legacy default stream (0, or CU_STREAM_LEGACY) is one more stream, without
 * its implicit synchronisation with blocking streams (the project uses non-blocking streams
 * only); cuLaunchKernel's `extra` argument (CUDA_ERROR_INVALID_VALUE); function attributes but
 * the dynamic shared memory a launch may give (CUDA_ERROR_INVALID_VALUE). As in CUDA,
 * cuStreamDestroy_v2 returns at once and the stream's queued work still runs; its thread ends
 * when the queue is empty. Destroy calls made under the sticky error still free the handle.
 *
 * All state is guarded by one mutex, g_lock, which is never held while a kernel runs or memory
 * is written. Streams, events, graphs and graph execs are pooled, never freed, so that a
 * destroyed handle can be told from a live one (CUDA_ERROR_INVALID_HANDLE) without reading
 * freed memory.
 */

#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct stream *CUstream;
typedef struct event *CUevent;
typedef struct function *CUfunction;
typedef struct graph *CUgraph;     /* what cuStreamEndCapture made */
typedef struct graph *CUgraphExec; /* what cuGraphInstantiateWithFlags made of one */
/* A kernel's host code, called on a stream's thread: params points at the emulator's copies of
 * the argument values; context is what pto_emu_function was given. 0, or non-zero for a kernel
 * that faulted. */
typedef int (*entry_fn)(const unsigned grid[3], const unsigned block[3], unsigned shared_bytes,
                        void **params, void *context);

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_CAPTURED_EVENT = 907,
};

enum { CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_INVALIDATED };
#define CU_STREAM_CAPTURE_MODE_RELAXED 2 /* the highest mode (GLOBAL 0, THREAD_LOCAL 1) */
/* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | _UPLOAD | _DEVICE_LAUNCH | _USE_NODE_PRIORITY:
 * accepted and ignored (the emulator allocates nothing, uploads nothing, has no priorities) */
#define GRAPH_INSTANTIATE_FLAGS 0xFull

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u
#define EVENT_FLAGS 0x7u /* CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS */
#define MAX_BLOCK_THREADS 1024ull
/* A launch's dynamic shared memory: at most 48 KiB, or what cuFuncSetAttribute's
 * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES set, which may be up to an sm_90 block's
 * 227 KiB (the emulated GPU is an H100's kind). */
#define DEFAULT_DYNAMIC_SHARED 49152u
#define MAX_DYNAMIC_SHARED 232448
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* The first member of every handle's struct: what a handle is, or DEAD once destroyed. */
enum magic {
    DEAD = 0,
    STREAM = 0x5354524du,
    EVENT = 0x45564e54u,
    FUNCTION = 0x46554e43u,
    GRAPH = 0x47524150u,
    GRAPH_EXEC = 0x47455845u,
    BLAS = 0x424c4153u,
};

/* One cuEventRecord. A wait holds the record current when it was enqueued, so re-recording
 * the event does not change what an enqueued wait waits for. A record made on a capturing
 * stream is never enqueued nor reached: it names a point of the capture (see below). */
struct record {
    int reached;
    long long reached_ns;      /* CLOCK_MONOTONIC when reached (cuEventElapsedTime) */
    int refs;                  /* the event while it is the event's latest, and each command naming it */
    unsigned long long capture; /* the id of the capture it was made in; 0 for an enqueued record */
    int width;                 /* in a capture: its stream's vector clock then, clock[0..width) */
    unsigned long long *clock;
};

struct event {
    enum magic magic;
    int timed; /* created without CU_EVENT_DISABLE_TIMING: cuEventElapsedTime may read it */
    struct record *latest; /* NULL until first recorded: queries and waits are then satisfied */
    struct event *next_free;
};

struct function {
    enum magic magic;
    entry_fn entry;
    void *context;
    unsigned max_shared; /* dynamic shared memory a launch may give it, bytes */
    int count;
    size_t sizes[]; /* parameter i's size in bytes */
};

enum kind { KERNEL, RECORD, WAIT, MEMSET, MEMCPY, GRAPH_LAUNCH };

struct command {
    enum kind kind;
    struct command *next;
    int injected;                  /* KERNEL: faults instead of running; RECORD: is never reached */
    struct record *record;         /* RECORD, GRAPH_LAUNCH: the record it reaches (none for a
                                      GRAPH_LAUNCH in a capture); WAIT: the one it waits for */
    struct program *program;       /* GRAPH_LAUNCH: the commands it runs */
    const struct function *function;
    unsigned grid[3], block[3], shared;
    void *dst;                     /* MEMSET, MEMCPY */
    const void *src;
    int value;
    size_t n;
    void **params;                 /* KERNEL: pointers to the argument values copied into data */
    max_align_t data[];            /* KERNEL: the values, each at a multiple of 16 bytes; then params */
};

struct stream {
    enum magic magic;
    pthread_cond_t work;          /* signalled when a command is queued or the stream is destroyed */
    struct command *head, *tail;
    atomic_int queued;            /* head != NULL, readable without g_lock: what an idle thread polls */
    struct command *current;      /* the command its thread is executing; NULL when idle */
    int live;                     /* its thread is running */
    int closing;                  /* destroyed: its thread ends once the queue is empty */
    struct stream *next_all;      /* every stream struct made: what pto_emu_reset visits */
    struct stream *next_free;
    struct capture *capture;      /* the capture it is in (began it, or joined it); NULL if none */
    int member;                   /* in a capture: its index among the capture's streams */
};

/* --- stream capture and graphs ---------------------------------------------------------
 *
 * A capture begins on one stream, its origin (cuStreamBeginCapture_v2; every mode behaves as
 * CU_STREAM_CAPTURE_MODE_RELAXED: other threads and streams may use the driver meanwhile).
 * Another stream joins it by waiting on an event last recorded on one of its streams. While
 * a stream is in a capture, nothing enqueued on it runs: kernel launches (their params copied
 * as for any launch), memsets, memcpys and graph launches are appended to the capture's
 * command list, in the global order of the calls across all its streams. Records and waits
 * within the capture add no command: every dependency they make goes from an earlier call to
 * a later one, so that global order is a topological order of the graph CUDA would build,
 * and a replay runs the list in that order on one thread: the same results, without the
 * concurrency between independent nodes.
 *
 * What the records and waits still do is tell whether every stream rejoined the origin
 * before cuStreamEndCapture, as CUDA requires (else CUDA_ERROR_STREAM_CAPTURE_UNJOINED): each
 * stream in the capture has a vector clock, the number of commands of each stream that its
 * next command would follow. A command bumps its own stream's entry, a record snapshots the
 * clock, a wait merges the snapshot into the waiting stream's clock. The capture was joined
 * when the origin's clock covers every stream's own count, directly or through other streams.
 *
 * Calls CUDA refuses during capture: cuStreamQuery, cuStreamSynchronize and cuStreamDestroy_v2
 * of a stream in a capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); a wait of a capturing
 * stream on an event recorded outside it that was not reached yet (CUDA_ERROR_STREAM_CAPTURE_
 * ISOLATION: the emulator has no external-event nodes; an event already reached is a
 * dependency already met, and adds nothing) or recorded in another capture (ISOLATION too);
 * cuStreamEndCapture on a stream in a capture it did not begin (CUDA_ERROR_STREAM_CAPTURE_
 * UNMATCHED); the legacy stream beginning or joining a capture (UNSUPPORTED, as in CUDA; begin
 * refuses it without a capture to invalidate). Each of those, as in CUDA, invalidates the capture: the streams stay in it, but
 * enqueues on them return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and so does its
 * cuStreamEndCapture, which ends it without a graph. cuEventQuery, cuEventSynchronize and
 * waits on an event last recorded in a capture, during it or after it ended, return
 * CUDA_ERROR_CAPTURED_EVENT until the event is recorded again outside a capture; those calls
 * leave the capture valid.
 *
 * cuStreamEndCapture on the origin ends the capture for all its streams, and makes the list a
 * graph. A graph and the execs instantiated from it share the list (a program, immutable and
 * counted), so that either may be destroyed first. cuGraphLaunch enqueues one GRAPH_LAUNCH
 * command, which runs the program's commands in order on the stream's thread; a kernel that
 * faults there sets the sticky error and the rest is dropped, as for queued work. As in CUDA,
 * a launch is also ordered after the exec's previous launch, on whatever stream that was, and
 * an exec destroyed while launches of it are queued is freed once they ran. cuGraphLaunch on
 * a capturing stream captures the launch, as a child graph in CUDA. */

/* A graph's commands (KERNEL, MEMSET, MEMCPY, GRAPH_LAUNCH), linked by `next`; never changed
 * once made. */
struct program {
    int refs; /* the graph, each exec, each GRAPH_LAUNCH command naming it */
    struct command *head;
};

struct graph {
    enum magic magic;         /* GRAPH, GRAPH_EXEC, or DEAD */
    struct program *program;
    struct record *last;      /* GRAPH_EXEC: reached when its latest launch has run; NULL if none */
    struct graph *next_free;
};

struct capture {
    unsigned long long id;    /* what its records name: it may end while they live on */
    int invalid;              /* a refused call invalidated it */
    struct stream *origin;
    struct command *head, *tail; /* the graph so far */
    int count, cap;           /* its streams, and the room for them */
    struct stream **members;
    unsigned long long *clocks; /* cap x cap: row i is member i's vector clock */
    struct capture *next;     /* the live captures */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast when a record is reached, a stream goes idle, the sticky error is set, or on reset:
 * what host waits and a stream's waits on events sleep on. */
static pthread_cond_t g_progress;
static int g_initialized;
static CUresult g_error;                /* the sticky error: CUDA_SUCCESS or ILLEGAL_ADDRESS */
static unsigned long long g_epoch;      /* counts resets: work from before one is abandoned */
static struct stream *g_legacy;
static struct stream *g_streams, *g_free_streams;
static struct event *g_free_events;
static struct graph *g_free_graphs;
static struct capture *g_captures;      /* the live captures */
static unsigned long long g_capture_ids;
static long long g_fail_launch, g_fault_kernel, g_lose_event; /* calls left until each fault */
static atomic_llong g_launches;

/* The driver's status for any call: not initialised, the sticky error, or success. */
static CUresult status(void) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return g_error;
}

static CUresult stream_of(CUstream handle, struct stream **out) {
    if (handle == NULL || handle == CU_STREAM_LEGACY) {
        *out = g_legacy;
        return CUDA_SUCCESS;
    }
    if (handle->magic != STREAM) return CUDA_ERROR_INVALID_HANDLE;
    *out = handle;
    return CUDA_SUCCESS;
}

static CUresult event_of(CUevent handle) {
    return handle != NULL && handle->magic == EVENT ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Counts one call towards an armed fault: true on the call it was armed for. */
static int tick(long long *left) {
    return *left > 0 && --*left == 0;
}

static size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

static void reach(struct record *record) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    record->reached_ns = t.tv_sec * 1000000000LL + t.tv_nsec;
    record->reached = 1;
    pthread_cond_broadcast(&g_progress);
}

static void unref(struct record *record) {
    if (record != NULL && --record->refs == 0) {
        free(record->clock);
        free(record);
    }
}

static void release(struct command *command);

static void release_all(struct command *head) {
    while (head != NULL) {
        struct command *next = head->next;
        release(head);
        head = next;
    }
}

static void unref_program(struct program *program) {
    if (program != NULL && --program->refs == 0) {
        release_all(program->head);
        free(program);
    }
}

static void release(struct command *command) {
    unref(command->record);
    unref_program(command->program);
    free(command);
}

/* Work from before a reset (or, with the sticky error, from after a fault) is dropped
 * unrun; its records count as reached, so that nothing waits on them for ever. */
static void abandon(struct command *command) {
    if (command->kind != WAIT && command->record != NULL) reach(command->record);
    release(command);
}

static void fault(unsigned long long epoch) {
    if (epoch != g_epoch || g_error) return; /* a kernel from before a reset poisons nothing */
    g_error = CUDA_ERROR_ILLEGAL_ADDRESS;
    pthread_cond_broadcast(&g_progress);
}

static void enqueue(struct stream *stream, struct command *command) {
    command->next = NULL;
    if (stream->tail != NULL)
        stream->tail->next = command;
    else
        stream->head = command;
    stream->tail = command;
    atomic_store_explicit(&stream->queued, 1, memory_order_release);
    pthread_cond_signal(&stream->work);
}

/* How long a stream's thread that ran out of work polls for more before it sleeps: an issuer
 * feeding it small kernels one by one then hands each over without a futex wake-up and a
 * reschedule (~10 us each on a loaded two-core machine), as a GPU's stream takes work at once. */
#define IDLE_POLL_NS 50000LL

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Called with g_lock held and the queue empty; returns with it held, after polling (without
 * the lock, yielding the core) for up to IDLE_POLL_NS for work to arrive. */
static void poll_for_work(struct stream *s) {
    pthread_mutex_unlock(&g_lock);
    const long long until = now_ns() + IDLE_POLL_NS;
    while (!atomic_load_explicit(&s->queued, memory_order_acquire) && now_ns() < until) sched_yield();
    pthread_mutex_lock(&g_lock);
}

/* Does the work of a KERNEL, MEMSET, MEMCPY or GRAPH_LAUNCH command: called, and returns, with
 * g_lock held; drops it while a kernel runs or memory is written. A graph's commands stop at
 * the first fault (the sticky error, here or on another stream) or reset, as queued work does. */
static void perform(const struct command *c, unsigned long long epoch) {
    switch (c->kind) {
    case KERNEL: {
        if (c->injected) {
            fault(epoch);
            break;
        }
        pthread_mutex_unlock(&g_lock);
        int failed = c->function->entry(c->grid, c->block, c->shared, c->params, c->function->context);
        atomic_fetch_add(&g_launches, 1);
        pthread_mutex_lock(&g_lock);
        if (failed) fault(epoch);
        break;
    }
    case MEMSET:
        pthread_mutex_unlock(&g_lock);
        if (c->n > 0) memset(c->dst, c->value, c->n);
        pthread_mutex_lock(&g_lock);
        break;
    case MEMCPY:
        pthread_mutex_unlock(&g_lock);
        if (c->n > 0) memmove(c->dst, c->src, c->n);
        pthread_mutex_lock(&g_lock);
        break;
    case GRAPH_LAUNCH: /* the program is held by the command, which outlives this call */
        for (const struct command *node = c->program->head; node != NULL && !g_error && epoch == g_epoch;
             node = node->next)
            perform(node, epoch);
        break;
    case RECORD:
    case WAIT: /* never in a graph; execute runs them */
        break;
    }
}

/* Runs one queued command: called, and returns, with g_lock held. */
static void execute(struct command *c) {
    unsigned long long epoch = g_epoch;
    if (g_error) {
        abandon(c);
        return;
    }
    switch (c->kind) {
    case RECORD:
        while (c->injected && epoch == g_epoch) /* lost: the stream stalls here, as on a hung kernel */
            pthread_cond_wait(&g_progress, &g_lock);
        reach(c->record);
        break;
    case WAIT:
        while (!c->record->reached && !g_error && epoch == g_epoch) pthread_cond_wait(&g_progress, &g_lock);
        break;
    default:
        perform(c, epoch);
        if (c->record != NULL) reach(c->record); /* a graph's end: reached even if it faulted */
        break;
    }
    release(c);
}

static void *stream_main(void *arg) {
    struct stream *s = arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        if (s->head == NULL && !s->closing) poll_for_work(s);
        while (s->head == NULL && !s->closing) pthread_cond_wait(&s->work, &g_lock);
        if (s->head == NULL) break; /* destroyed and drained */
        struct command *c = s->head;
        s->head = c->next;
        if (s->head == NULL) {
            s->tail = NULL;
            atomic_store_explicit(&s->queued, 0, memory_order_relaxed);
        }
        s->current = c;
        execute(c);
        s->current = NULL;
        if (s->head == NULL) pthread_cond_broadcast(&g_progress); /* idle: cuStreamSynchronize */
    }
    s->live = 0;
    s->next_free = g_free_streams;
    g_free_streams = s;
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

static CUresult new_stream(struct stream **out) {
    struct stream *s = g_free_streams;
    if (s != NULL) {
        g_free_streams = s->next_free;
    } else {
        s = calloc(1, sizeof *s);
        if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_cond_init(&s->work, NULL);
        s->next_all = g_streams;
        g_streams = s;
    }
    s->head = s->tail = s->current = NULL;
    atomic_store_explicit(&s->queued, 0, memory_order_relaxed);
    s->closing = 0;
    s->capture = NULL;
    s->member = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int failed = pthread_create(&thread, &attr, stream_main, s);
    pthread_attr_destroy(&attr);
    if (failed) {
        s->next_free = g_free_streams;
        g_free_streams = s;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->live = 1;
    s->magic = STREAM;
    *out = s;
    return CUDA_SUCCESS;
}

/* --- capture helpers (all called with g_lock held) --------------------------------------- */

/* Member i's vector clock. */
static unsigned long long *clock_of(const struct capture *x, int i) {
    return x->clocks + (size_t)i * (size_t)x->cap;
}

/* The live capture with that id; NULL once it ended. */
static struct capture *live_capture(unsigned long long id) {
    struct capture *x = g_captures;
    while (x != NULL && x->id != id) x = x->next;
    return x;
}

/* Makes `s` a stream of capture `x`, with a clock of zeros. */
static CUresult add_member(struct capture *x, struct stream *s) {
    if (x->count == x->cap) {
        int cap = x->cap > 0 ? 2 * x->cap : 4;
        struct stream **members = realloc(x->members, (size_t)cap * sizeof *members);
        if (members == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        x->members = members;
        unsigned long long *clocks = calloc((size_t)cap * (size_t)cap, sizeof *clocks);
        if (clocks == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        for (int i = 0; i < x->count; i++) memcpy(clocks + (size_t)i * cap, clock_of(x, i), x->count * sizeof *clocks);
        free(x->clocks);
        x->clocks = clocks;
        x->cap = cap;
    }
    x->members[x->count] = s;
    s->capture = x;
    s->member = x->count++;
    return CUDA_SUCCESS;
}

/* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for an enqueue on a stream of an invalidated capture. */
static CUresult capturable(const struct stream *s) {
    return s->capture != NULL && s->capture->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

/* A refused call on a stream in a capture: that capture is invalidated, as in CUDA. */
static CUresult refuse(struct stream *s, CUresult rc) {
    if (s->capture != NULL) s->capture->invalid = 1;
    return rc;
}

/* Enqueues a KERNEL, MEMSET, MEMCPY or GRAPH_LAUNCH command on `s`, or, while `s` is in a
 * capture, appends it to the capture's graph as one more command of s's. */
static void submit(struct stream *s, struct command *c) {
    struct capture *x = s->capture;
    if (x == NULL) {
        enqueue(s, c);
        return;
    }
    c->next = NULL;
    if (x->tail != NULL)
        x->tail->next = c;
    else
        x->head = c;
    x->tail = c;
    clock_of(x, s->member)[s->member]++;
}

/* Whether every stream of `x` rejoined its origin: the origin's clock covers every stream's
 * own count of commands. */
static int joined(const struct capture *x) {
    const unsigned long long *origin = clock_of(x, x->origin->member);
    for (int i = 0; i < x->count; i++)
        if (origin[i] < clock_of(x, i)[i]) return 0;
    return 1;
}

/* Ends capture `x` for all its streams, dropping the commands left in its list. */
static void end(struct capture *x) {
    struct capture **link = &g_captures;
    while (*link != x) link = &(*link)->next;
    *link = x->next;
    for (int i = 0; i < x->count; i++) x->members[i]->capture = NULL;
    release_all(x->head);
    free(x->members);
    free(x->clocks);
    free(x);
}

/* A CUgraph or CUgraphExec of `program` (taking the caller's reference); NULL when out of memory. */
static struct graph *new_graph(enum magic magic, struct program *program) {
    struct graph *g = g_free_graphs;
    if (g != NULL)
        g_free_graphs = g->next_free;
    else
        g = calloc(1, sizeof *g);
    if (g == NULL) return NULL;
    g->magic = magic;
    g->program = program;
    g->last = NULL;
    return g;
}

static CUresult destroy_graph(struct graph *g, enum magic magic) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (g == NULL || g->magic != magic) return CUDA_ERROR_INVALID_HANDLE;
    g->magic = DEAD;
    unref_program(g->program); /* queued launches hold it themselves */
    unref(g->last);
    g->program = NULL;
    g->last = NULL;
    g->next_free = g_free_graphs;
    g_free_graphs = g;
    return g_error;
}

/* --- the driver's functions ------------------------------------------------------------- */

CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult rc = CUDA_SUCCESS;
    if (!g_initialized) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* pto_emu_event_wait's timeouts */
        pthread_cond_init(&g_progress, &attr);
        pthread_condattr_destroy(&attr);
        rc = new_stream(&g_legacy);
        g_initialized = rc == CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuStreamCreate(CUstream *out, unsigned flags) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (out == NULL || (flags & ~CU_STREAM_NON_BLOCKING))) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) rc = new_stream(out);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuStreamDestroy_v2(CUstream handle) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS && (handle == NULL || handle == CU_STREAM_LEGACY || handle->magic != STREAM))
        rc = CUDA_ERROR_INVALID_HANDLE;
    /* Not while it is in a capture: the capture still names it (and its struct is pooled). */
    if (rc == CUDA_SUCCESS && handle->capture != NULL) rc = refuse(handle, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (rc == CUDA_SUCCESS) {
        handle->magic = DEAD;
        handle->closing = 1;
        pthread_cond_signal(&handle->work);
        rc = g_error;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuStreamSynchronize(CUstream handle) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS && s->capture != NULL) rc = refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (rc == CUDA_SUCCESS) {
        while (!g_error && (s->head != NULL || s->current != NULL)) pthread_cond_wait(&g_progress, &g_lock);
        rc = g_error;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuStreamQuery(CUstream handle) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS && s->capture != NULL) rc = refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (rc == CUDA_SUCCESS && (s->head != NULL || s->current != NULL)) rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* cuStreamWaitEvent's work once its arguments are valid: see "stream capture and graphs". */
static CUresult wait_on(struct stream *s, struct record *r) {
    struct capture *mine = s->capture;
    if (mine != NULL && mine->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (r != NULL && r->capture != 0) { /* recorded in a capture: a dependency inside its graph */
        struct capture *x = live_capture(r->capture);
        if (x == NULL) return CUDA_ERROR_CAPTURED_EVENT; /* that capture has ended */
        if (mine != NULL && mine != x) return refuse(s, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
        if (x->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (mine == NULL) { /* s joins the capture */
            if (s == g_legacy) {
                x->invalid = 1;
                return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            }
            CUresult rc = add_member(x, s);
            if (rc != CUDA_SUCCESS) return rc;
        }
        unsigned long long *clock = clock_of(x, s->member);
        for (int i = 0; i < r->width; i++)
            if (r->clock[i] > clock[i]) clock[i] = r->clock[i];
        return CUDA_SUCCESS;
    }
    /* A never-recorded event, or a record already reached, leaves nothing to wait for. */
    if (r == NULL || r->reached) return CUDA_SUCCESS;
    /* An external dependency of a capture, which the emulator cannot put in a graph. */
    if (mine != NULL) return refuse(s, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    struct command *c = calloc(1, sizeof *c);
    if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    c->kind = WAIT;
    c->record = r;
    r->refs++;
    enqueue(s, c);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream handle, CUevent event, unsigned flags) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && flags != 0) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS) rc = event_of(event);
    if (rc == CUDA_SUCCESS) rc = wait_on(s, event->latest);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuEventCreate(CUevent *out, unsigned flags) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (out == NULL || (flags & ~EVENT_FLAGS))) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct event *e = g_free_events;
        if (e != NULL)
            g_free_events = e->next_free;
        else
            e = calloc(1, sizeof *e);
        if (e == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->magic = EVENT;
            e->timed = !(flags & CU_EVENT_DISABLE_TIMING);
            e->latest = NULL;
            *out = e;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuEventDestroy_v2(CUevent event) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = g_initialized ? event_of(event) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) {
        event->magic = DEAD;
        unref(event->latest); /* waits already enqueued hold their record themselves */
        event->latest = NULL;
        event->next_free = g_free_events;
        g_free_events = event;
        rc = g_error;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuEventRecord(CUevent event, CUstream handle) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = event_of(event);
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS) rc = capturable(s);
    if (rc == CUDA_SUCCESS && s->capture != NULL) {
        /* A point of the capture: a snapshot of the stream's clock; nothing is enqueued, and
         * lose_event does not count it. */
        struct capture *x = s->capture;
        struct record *record = calloc(1, sizeof *record);
        unsigned long long *clock = malloc((size_t)x->count * sizeof *clock);
        if (record == NULL || clock == NULL) {
            free(record);
            free(clock);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            memcpy(clock, clock_of(x, s->member), (size_t)x->count * sizeof *clock);
            *record = (struct record){.refs = 1, .capture = x->id, .width = x->count, .clock = clock};
            unref(event->latest);
            event->latest = record;
        }
    } else if (rc == CUDA_SUCCESS) {
        struct command *c = calloc(1, sizeof *c);
        struct record *record = malloc(sizeof *record);
        if (c == NULL || record == NULL) {
            free(c);
            free(record);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *record = (struct record){.reached = 0, .refs = 2};
            c->kind = RECORD;
            c->record = record;
            c->injected = tick(&g_lose_event);
            unref(event->latest);
            event->latest = record;
            enqueue(s, c);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuEventQuery(CUevent event) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = event_of(event);
    if (rc == CUDA_SUCCESS && event->latest != NULL && event->latest->capture != 0) rc = CUDA_ERROR_CAPTURED_EVENT;
    if (rc == CUDA_SUCCESS && event->latest != NULL && !event->latest->reached) rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The milliseconds from `start`'s latest record being reached to `end`'s, as the driver answers:
 * CUDA_ERROR_INVALID_HANDLE for an event made with CU_EVENT_DISABLE_TIMING or never recorded,
 * CUDA_ERROR_NOT_READY while either is still to be reached. */
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = event_of(start);
    if (rc == CUDA_SUCCESS) rc = event_of(end);
    if (rc == CUDA_SUCCESS && ms == NULL) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && (!start->timed || !end->timed || start->latest == NULL || end->latest == NULL))
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && (start->latest->capture != 0 || end->latest->capture != 0))
        rc = CUDA_ERROR_CAPTURED_EVENT;
    if (rc == CUDA_SUCCESS && (!start->latest->reached || !end->latest->reached)) rc = CUDA_ERROR_NOT_READY;
    if (rc == CUDA_SUCCESS) *ms = (float)((double)(end->latest->reached_ns - start->latest->reached_ns) / 1e6);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Waits until `event`'s latest record is reached, for at most timeout_ns (< 0: no bound). */
static CUresult event_wait(CUevent event, long long timeout_ns) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = event_of(event);
    if (rc == CUDA_SUCCESS && event->latest != NULL && event->latest->capture != 0) rc = CUDA_ERROR_CAPTURED_EVENT;
    struct record *record = rc == CUDA_SUCCESS ? event->latest : NULL;
    if (record != NULL) {
        record->refs++; /* the event may be re-recorded or destroyed meanwhile */
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        if (timeout_ns >= 0) {
            long long ns = deadline.tv_nsec + timeout_ns % 1000000000LL;
            deadline.tv_sec += (time_t)(timeout_ns / 1000000000LL + ns / 1000000000LL);
            deadline.tv_nsec = (long)(ns % 1000000000LL);
        }
        int timed_out = 0;
        while (!record->reached && !g_error && !timed_out) {
            if (timeout_ns < 0)
                pthread_cond_wait(&g_progress, &g_lock);
            else
                timed_out = pthread_cond_timedwait(&g_progress, &g_lock, &deadline) == ETIMEDOUT;
        }
        rc = g_error ? g_error : record->reached ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
        unref(record);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuEventSynchronize(CUevent event) {
    return event_wait(event, -1);
}

/* Only the attribute the backend sets: the dynamic shared memory a launch may give `f`. */
CUresult cuFuncSetAttribute(CUfunction f, int attribute, int value) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (f == NULL || f->magic != FUNCTION)) rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS &&
        (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value < 0 || value > MAX_DYNAMIC_SHARED))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) f->max_shared = (unsigned)value;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                        unsigned blockY, unsigned blockZ, unsigned sharedMemBytes, CUstream handle,
                        void **kernelParams, void **extra) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (f == NULL || f->magic != FUNCTION)) rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS) rc = capturable(s);
    if (rc == CUDA_SUCCESS &&
        (gridX == 0 || gridY == 0 || gridZ == 0 || blockX == 0 || blockY == 0 || blockZ == 0 ||
         (unsigned long long)blockX * blockY * blockZ > MAX_BLOCK_THREADS || extra != NULL ||
         sharedMemBytes > f->max_shared ||
         (kernelParams == NULL && f->count > 0)))
        rc = CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0; /* the values' room in command.data */
    for (int i = 0; rc == CUDA_SUCCESS && i < f->count; i++) {
        if (kernelParams[i] == NULL && f->sizes[i] > 0) rc = CUDA_ERROR_INVALID_VALUE;
        bytes += round16(f->sizes[i]);
    }
    if (rc == CUDA_SUCCESS) {
        int fail = tick(&g_fail_launch), injected = tick(&g_fault_kernel);
        struct command *c = fail ? NULL : calloc(1, sizeof *c + bytes + (size_t)f->count * sizeof(void *));
        if (fail) {
            rc = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES; /* not sticky: nothing was enqueued */
        } else if (c == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            c->kind = KERNEL;
            c->injected = injected;
            c->function = f;
            c->grid[0] = gridX;
            c->grid[1] = gridY;
            c->grid[2] = gridZ;
            c->block[0] = blockX;
            c->block[1] = blockY;
            c->block[2] = blockZ;
            c->shared = sharedMemBytes;
            /* Copied now, as the real driver does: the caller may reuse its buffers at once. */
            char *value = (char *)c->data;
            c->params = (void **)(value + bytes);
            for (int i = 0; i < f->count; i++) {
                if (f->sizes[i] > 0) memcpy(value, kernelParams[i], f->sizes[i]);
                c->params[i] = value;
                value += round16(f->sizes[i]);
            }
            submit(s, c);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

static CUresult enqueue_memory(enum kind kind, CUdeviceptr dst, CUdeviceptr src, int value, size_t n,
                               CUstream handle) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS) rc = capturable(s);
    if (rc == CUDA_SUCCESS && n > 0 && (dst == 0 || (kind == MEMCPY && src == 0))) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct command *c = calloc(1, sizeof *c);
        if (c == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            c->kind = kind;
            c->dst = (void *)(size_t)dst;
            c->src = (const void *)(size_t)src;
            c->value = value;
            c->n = n;
            submit(s, c);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream handle) {
    return enqueue_memory(MEMSET, dst, 0, value, n, handle);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream handle) {
    return enqueue_memory(MEMCPY, dst, src, 0, n, handle);
}

CUresult cuStreamBeginCapture_v2(CUstream handle, int mode) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (mode < 0 || mode > CU_STREAM_CAPTURE_MODE_RELAXED)) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS && s == g_legacy) rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* as in CUDA */
    if (rc == CUDA_SUCCESS && s->capture != NULL) rc = CUDA_ERROR_ILLEGAL_STATE;
    if (rc == CUDA_SUCCESS) {
        struct capture *x = calloc(1, sizeof *x);
        if (x == NULL || add_member(x, s) != CUDA_SUCCESS) {
            if (x != NULL) free(x->members);
            free(x);
            s->capture = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            x->id = ++g_capture_ids;
            x->origin = s;
            x->next = g_captures;
            g_captures = x;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Ends the capture begun on `handle`, for all its streams, even when it fails: the graph, or
 * *graph = NULL and why not (the sticky error, INVALIDATED, UNJOINED, OUT_OF_MEMORY). */
CUresult cuStreamEndCapture(CUstream handle, CUgraph *graph) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS && graph == NULL) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        *graph = NULL;
        rc = stream_of(handle, &s);
    }
    if (rc == CUDA_SUCCESS && s->capture == NULL) rc = CUDA_ERROR_ILLEGAL_STATE;
    if (rc == CUDA_SUCCESS && s->capture->origin != s) rc = refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    if (rc == CUDA_SUCCESS) {
        struct capture *x = s->capture;
        rc = g_error      ? g_error
             : x->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
             : !joined(x) ? CUDA_ERROR_STREAM_CAPTURE_UNJOINED
                          : CUDA_SUCCESS;
        if (rc == CUDA_SUCCESS) {
            struct program *program = malloc(sizeof *program);
            struct graph *g = program != NULL ? new_graph(GRAPH, program) : NULL;
            if (g == NULL) {
                free(program);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                *program = (struct program){.refs = 1, .head = x->head};
                x->head = x->tail = NULL; /* the program's now */
                *graph = g;
            }
        }
        end(x);
    }
    if (rc != CUDA_ERROR_NOT_INITIALIZED && g_error) rc = g_error; /* as every call answers then */
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuStreamIsCapturing(CUstream handle, int *capture_status) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && capture_status == NULL) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS)
        *capture_status = s->capture == NULL ? CU_STREAM_CAPTURE_STATUS_NONE
                          : s->capture->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (exec == NULL || (flags & ~GRAPH_INSTANTIATE_FLAGS))) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && (graph == NULL || graph->magic != GRAPH)) rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        struct graph *e = new_graph(GRAPH_EXEC, graph->program);
        if (e == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            graph->program->refs++; /* shared, not copied: a program never changes */
            *exec = e;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream handle) {
    pthread_mutex_lock(&g_lock);
    struct stream *s;
    CUresult rc = status();
    if (rc == CUDA_SUCCESS && (exec == NULL || exec->magic != GRAPH_EXEC)) rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) rc = stream_of(handle, &s);
    if (rc == CUDA_SUCCESS) rc = capturable(s);
    if (rc == CUDA_SUCCESS) {
        /* Outside a capture: the launch's end, and a wait for the previous launch's end when it
         * may still be ahead (on another stream; on this one the queue orders them anyway). */
        int outside = s->capture == NULL;
        int after = outside && exec->last != NULL && !exec->last->reached;
        struct command *c = calloc(1, sizeof *c), *wait = after ? calloc(1, sizeof *wait) : NULL;
        struct record *done = outside ? malloc(sizeof *done) : NULL;
        if (c == NULL || (after && wait == NULL) || (outside && done == NULL)) {
            free(c);
            free(wait);
            free(done);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            c->kind = GRAPH_LAUNCH;
            c->program = exec->program;
            c->program->refs++;
            if (after) {
                wait->kind = WAIT;
                wait->record = exec->last;
                wait->record->refs++;
                enqueue(s, wait);
            }
            if (outside) {
                *done = (struct record){.reached = 0, .refs = 2};
                c->record = done;
                unref(exec->last);
                exec->last = done;
            }
            submit(s, c);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = destroy_graph(exec, GRAPH_EXEC);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGraphDestroy(CUgraph graph) {
    pthread_mutex_lock(&g_lock);
    CUresult rc = destroy_graph(graph, GRAPH);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    static const struct {
        CUresult code;
        const char *name;
    } names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"},
        {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
        {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
        {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"},
        {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
        {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
        {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"},
        {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
        {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"},
        {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT"},
    };
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].code == error) {
            *name = names[i].name;
            return CUDA_SUCCESS;
        }
    }
    *name = NULL; /* as the real driver does for a code it does not know */
    return CUDA_ERROR_INVALID_VALUE;
}

/* --- cuBLAS: the GEMM the CUDA backend calls (backends/cublas.py) ------------------------
 * cublasGemmStridedBatchedEx with cuBLAS's C signature and column-major semantics, enqueued on
 * the handle's stream as a kernel launch of the emulator's own GEMM (so it is ordered, faults
 * and is counted as a launch is). Element types float, double, half and bfloat16; compute types
 * 32F, 64F and 32F_FAST_TF32 (inputs rounded to TF32 as the tensor cores' cvt.rna does). Sums
 * are in double, rounded to C's type (half and bfloat16 through float, as 32F compute rounds
 * from float): within any GPU's rounding of the same product. */
typedef struct blas *cublasHandle_t;
struct blas {
    enum magic magic; /* BLAS, or DEAD once destroyed (handles are never freed) */
    CUstream stream;
};

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14 };
enum { COMPUTE_32F = 68, COMPUTE_64F = 70, COMPUTE_32F_FAST_TF32 = 77 };
enum { OP_N = 0, OP_T = 1 };

static float half_to_float(unsigned short h) {
    unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    float f;
    if (exp == 0) { /* zero or subnormal: mant x 2^-24 */
        f = (float)mant / 16777216.0f;
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest, ties to even, as a float32-to-float16 conversion does. */
static unsigned short float_to_half(float f) {
    unsigned x;
    memcpy(&x, &f, sizeof x);
    unsigned sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int e = (int)((x >> 23) & 0xffu) - 127 + 15;
    if (e == 255 - 127 + 15) return (unsigned short)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (e >= 31) return (unsigned short)(sign | 0x7c00u);
    unsigned shift = e <= 0 ? (unsigned)(14 - e) : 13, half;
    if (e <= 0) {
        if (e < -10) return (unsigned short)sign;
        mant |= 0x800000u;
        half = mant >> shift;
    } else {
        half = ((unsigned)e << 10) | (mant >> 13);
    }
    unsigned rest = mant & ((1u << shift) - 1), middle = 1u << (shift - 1);
    if (rest > middle || (rest == middle && (half & 1))) half++; /* a carry rounds up the exponent */
    return (unsigned short)(sign | half);
}

static float bfloat16_to_float(unsigned short h) {
    unsigned bits = (unsigned)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static unsigned short float_to_bfloat16(float f) {
    unsigned x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u); /* NaN stays NaN */
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* TF32 (10 mantissa bits), rounded to nearest with ties away from zero: cvt.rna.tf32.f32. */
static float tf32(float f) {
    unsigned x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7f800000u) != 0x7f800000u) x = (x + 0x1000u) & 0xffffe000u;
    memcpy(&f, &x, sizeof f);
    return f;
}

static double element(const void *base, int type, long long i, int compute) {
    switch (type) {
    case R_32F: {
        float f = ((const float *)base)[i];
        return compute == COMPUTE_32F_FAST_TF32 ? tf32(f) : f;
    }
    case R_64F: return ((const double *)base)[i];
    case R_16F: return half_to_float(((const unsigned short *)base)[i]);
    default: return bfloat16_to_float(((const unsigned short *)base)[i]);
    }
}

static void store(void *base, int type, long long i, double value) {
    switch (type) {
    case R_32F: ((float *)base)[i] = (float)value; break;
    case R_64F: ((double *)base)[i] = value; break;
    case R_16F: ((unsigned short *)base)[i] = float_to_half((float)value); break;
    default: ((unsigned short *)base)[i] = float_to_bfloat16((float)value); break;
    }
}

/* The GEMM's parameters, in the order cublas_gemm passes them to its launch: each 8 bytes. */
enum { G_TRANSA, G_TRANSB, G_M, G_N, G_K, G_ALPHA, G_A, G_LDA, G_STRIDE_A, G_B, G_LDB, G_STRIDE_B,
       G_BETA, G_C, G_LDC, G_STRIDE_C, G_BATCH, G_TYPE, G_COMPUTE, G_PARAMS };

static int gemm_entry(const unsigned grid[3], const unsigned block[3], unsigned shared, void **params,
                      void *context) {
    (void)grid, (void)block, (void)shared, (void)context;
    long long w[G_PARAMS];
    for (int i = 0; i < G_PARAMS; i++) memcpy(&w[i], params[i], sizeof w[i]);
    double alpha, beta;
    memcpy(&alpha, &w[G_ALPHA], sizeof alpha);
    memcpy(&beta, &w[G_BETA], sizeof beta);
    const void *a = (const void *)(size_t)w[G_A], *b = (const void *)(size_t)w[G_B];
    void *c = (void *)(size_t)w[G_C];
    int type = (int)w[G_TYPE], compute = (int)w[G_COMPUTE];
    for (long long q = 0; q < w[G_BATCH]; q++)
        for (long long j = 0; j < w[G_N]; j++)
            for (long long i = 0; i < w[G_M]; i++) {
                double sum = 0;
                for (long long l = 0; l < w[G_K]; l++) {
                    long long ai = w[G_TRANSA] == OP_N ? i + l * w[G_LDA] : l + i * w[G_LDA];
                    long long bi = w[G_TRANSB] == OP_N ? l + j * w[G_LDB] : j + l * w[G_LDB];
                    sum += element(a, type, q * w[G_STRIDE_A] + ai, compute) *
                           element(b, type, q * w[G_STRIDE_B] + bi, compute);
                }
                long long ci = q * w[G_STRIDE_C] + i + j * w[G_LDC];
                /* beta == 0: C is not read, as in cuBLAS (it may hold NaN) */
                store(c, type, ci, alpha * sum + (beta != 0 ? beta * element(c, type, ci, COMPUTE_64F) : 0));
            }
    return 0;
}

static struct function g_gemm = {FUNCTION, gemm_entry, NULL, DEFAULT_DYNAMIC_SHARED, G_PARAMS,
                                 {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}};

int cublasCreate_v2(cublasHandle_t *handle) {
    if (handle == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    pthread_mutex_unlock(&g_lock);
    if (rc != CUDA_SUCCESS) return CUBLAS_STATUS_NOT_INITIALIZED;
    struct blas *h = calloc(1, sizeof *h);
    if (h == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = BLAS;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

int cublasDestroy_v2(cublasHandle_t handle) {
    if (handle == NULL || handle->magic != BLAS) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = DEAD;
    return CUBLAS_STATUS_SUCCESS;
}

int cublasSetStream_v2(cublasHandle_t handle, CUstream stream) {
    if (handle == NULL || handle->magic != BLAS) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

static double scalar(const void *value, int compute) {
    return compute == COMPUTE_64F ? *(const double *)value : *(const float *)value;
}

int cublasGemmStridedBatchedEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                               const void *alpha, const void *A, int Atype, int lda, long long strideA,
                               const void *B, int Btype, int ldb, long long strideB, const void *beta,
                               void *C, int Ctype, int ldc, long long strideC, int batchCount,
                               int computeType, int algo) {
    (void)algo;
    if (handle == NULL || handle->magic != BLAS) return CUBLAS_STATUS_NOT_INITIALIZED;
    int a_rows = transa == OP_N ? m : k, b_rows = transb == OP_N ? k : n;
    if ((transa != OP_N && transa != OP_T) || (transb != OP_N && transb != OP_T) || m < 0 || n < 0 || k < 0 ||
        batchCount < 0 || alpha == NULL || beta == NULL || lda < (a_rows > 1 ? a_rows : 1) ||
        ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    int wide = computeType == COMPUTE_64F;
    if (Atype != Btype || Atype != Ctype ||
        !(Atype == R_64F ? wide : (Atype == R_32F || Atype == R_16F || Atype == R_16BF) &&
                                      (computeType == COMPUTE_32F ||
                                       (Atype == R_32F && computeType == COMPUTE_32F_FAST_TF32))))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
    double alpha_value = scalar(alpha, computeType), beta_value = scalar(beta, computeType);
    long long w[G_PARAMS] = {transa, transb, m, n, k, 0, (long long)(size_t)A, lda, strideA,
                             (long long)(size_t)B, ldb, strideB, 0, (long long)(size_t)C, ldc, strideC,
                             batchCount, Atype, computeType};
    memcpy(&w[G_ALPHA], &alpha_value, sizeof alpha_value);
    memcpy(&w[G_BETA], &beta_value, sizeof beta_value);
    void *params[G_PARAMS];
    for (int i = 0; i < G_PARAMS; i++) params[i] = &w[i];
    CUresult rc = cuLaunchKernel(&g_gemm, 1, 1, 1, 1, 1, 1, 0, handle->stream, params, NULL);
    return rc == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* --- the emulator's own functions ------------------------------------------------------- */

/* *out: a kernel the emulator can launch, `entry` (an entry_fn) called with `context` (what it
 * needs beyond the arguments, which the caller keeps alive). sizes[i] is parameter i's size in
 * bytes, which the real driver learns from the module. It stands for cuModuleLoadData and
 * cuModuleGetFunction, so under the sticky error it answers that error, as they do. Never freed,
 * as a loaded module's functions live on. */
CUresult pto_emu_function(CUfunction *out, void *entry, void *context, int count,
                          const unsigned long long *sizes) {
    if (out == NULL || entry == NULL || count < 0 || (count > 0 && sizes == NULL)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUresult rc = status();
    pthread_mutex_unlock(&g_lock);
    if (rc != CUDA_SUCCESS) return rc;
    struct function *f = malloc(sizeof *f + (size_t)count * sizeof f->sizes[0]);
    if (f == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    f->magic = FUNCTION;
    memcpy(&f->entry, &entry, sizeof entry); /* POSIX: the pointers share a representation */
    f->context = context;
    f->max_shared = DEFAULT_DYNAMIC_SHARED;
    f->count = count;
    for (int i = 0; i < count; i++) f->sizes[i] = (size_t)sizes[i];
    *out = f;
    return CUDA_SUCCESS;
}

/* Fault injection, each armed for the n-th counted call from now (n >= 1; n <= 0 disarms).
 * fail_launch and fault_kernel count cuLaunchKernel calls with valid arguments (a call both
 * would hit fails), captured ones included: a captured launch that fail_launch hits is not
 * captured (the capture stays valid); one that fault_kernel hits is captured as a faulting
 * kernel, which faults at every launch of the graph. lose_event counts valid cuEventRecord
 * calls that enqueue a record, so not those made in a capture. */
static void arm(long long *left, long long n) {
    pthread_mutex_lock(&g_lock);
    *left = n > 0 ? n : 0;
    pthread_mutex_unlock(&g_lock);
}

/* That cuLaunchKernel returns CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES and enqueues nothing. */
void pto_emu_fail_launch(long long n) {
    arm(&g_fail_launch, n);
}

/* That launch's kernel faults instead of running: the sticky CUDA_ERROR_ILLEGAL_ADDRESS. */
void pto_emu_fault_kernel(long long n) {
    arm(&g_fault_kernel, n);
}

/* That record is never reached: its stream stalls there until pto_emu_reset. */
void pto_emu_lose_event(long long n) {
    arm(&g_lose_event, n);
}

/* A fresh context for the next test: clears the sticky error, disarms the faults, ends every
 * capture (without a graph), drops every stream's queued work unrun (their records count as
 * reached; a graph launch running stops after its current command) and frees stalled streams.
 * Kernels already running finish. Streams, events, graphs and execs stay valid; an event last
 * recorded in a capture still answers CUDA_ERROR_CAPTURED_EVENT until recorded again. */
void pto_emu_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_fail_launch = g_fault_kernel = g_lose_event = 0;
    if (g_initialized) {
        g_error = CUDA_SUCCESS;
        g_epoch++;
        while (g_captures != NULL) end(g_captures);
        for (struct stream *s = g_streams; s != NULL; s = s->next_all) {
            if (!s->live) continue;
            while (s->head != NULL) {
                struct command *c = s->head;
                s->head = c->next;
                abandon(c);
            }
            s->tail = NULL;
            atomic_store_explicit(&s->queued, 0, memory_order_relaxed);
            if (s->current != NULL && s->current->kind == RECORD) reach(s->current->record); /* stalled */
            pthread_cond_signal(&s->work); /* a destroyed stream's thread may end now */
        }
        pthread_cond_broadcast(&g_progress); /* stalled records and waits see the new epoch */
    }
    pthread_mutex_unlock(&g_lock);
}

/* Kernels run so far (an injected fault runs none). */
long long pto_emu_launches(void) {
    return atomic_load(&g_launches);
}

/* cuEventSynchronize with a bound: CUDA_ERROR_NOT_READY when timeout_ns (>= 0) passes first. */
CUresult pto_emu_event_wait(CUevent event, long long timeout_ns) {
    if (timeout_ns < 0) return CUDA_ERROR_INVALID_VALUE;
    return event_wait(event, timeout_ns);
}
