// wgmma (sm_90a): a warpgroup's tensor-core product with both operands in shared memory, and
// its host build. Pasted after pto_isa.cuh (whose T, pto_dynamic_shared and host runner it
// uses) into a source of 16-bit T (PTO_HALF or PTO_BF16) whose blocks are whole warpgroups.
//
// The first step of Hopper's tensor cores for the generated code (docs/ISA.md, "wgmma: the
// instruction first"): the instruction, its shared-memory layouts and its emulation, held to
// numpy on the host build and, by the `gpu` tests of tests/test_cuda_wgmma.py, on an H100 or
// H200, before any generated kernel relies on them. The layouts are the PTX ISA's canonical
// ones ("Shared Memory Matrix Layout", "Matrix Descriptor Format") in the 128-byte swizzle, the
// one dense GEMMs use:
//
// - An operand lies in panels of 64 elements (128 bytes) along its contiguous dimension. In a
//   panel, line r (of the other dimension) is the 128 bytes at r * 128 with its 16-byte chunks
//   swizzled: chunk c lies at chunk c ^ (r % 8) (pto_swizzle_128b, on the byte offset from a
//   1024-byte aligned base: the hardware swizzles shared-memory address bits 4-6 by bits 7-9).
//   Eight lines are an atom of 1024 bytes.
// - K-major (A always; B where TransposeB is false, as B^T lies row-major): a line is a row of A
//   (a column of B), its 64 elements along k. An instruction reads k0..k0+15, 32 bytes of each
//   line: the descriptor's start moves 32 bytes a step of 16 in a panel (the swizzle is taken on
//   the address, so the lines keep their chunks), a panel's bytes past 64. SBO: the bytes from
//   one atom to the next along M (N); LBO: unused (16 by convention).
// - MN-major (B where TransposeB, as a row-major K x N tile lies, n contiguous): a line is a row
//   k of B, its 64 elements along n. SBO: the bytes from 8 rows of k to the next 8; LBO: from one
//   panel of 64 columns to the next. An instruction reads 16 rows of k (2 atoms): its start
//   moves 2 * SBO a step.
//
// The accumulators of m64nNk16, N / 2 floats a thread, are mma.sync's m16n8 fragments with warp
// w of the warpgroup holding rows 16w..16w+15: lane 4g + t holds d[4j + e] = D(16w + g + 8 (e / 2),
// 8j + 2t + e % 2) for j < N / 8 (the PTX ISA's "Register Fragments" of .m64nNk16).
//
// On the host build each thread computes its own accumulators from shared memory when it waits
// for the instruction's group (pto_wgmma_wait), the latest a GPU may read the operands and write
// the registers: code that reads the accumulators, or writes the operands, before its wait gets
// a wrong result here. It is stricter than a GPU in one way: a warp past its wait knows the
// whole warpgroup's instruction is done, but here the other warps' threads compute theirs at
// their own waits, so an operand rewritten with no barrier between the waits and the rewrite
// is wrong here (on a GPU it is not). Nor does it check what a GPU requires and the host need
// not: the same descriptors in every thread. The fences are a GPU's (nothing on the host): the operands' ordinary
// stores made visible to the tensor cores (pto_wgmma_fence_operands: fence.proxy.async), the
// accumulators' registers ordered before the instructions (pto_wgmma_fence) and kept in place
// around them by the compiler (pto_wgmma_hold).
#ifndef PTO_WGMMA_CUH
#define PTO_WGMMA_CUH

#if !defined(PTO_HALF) && !defined(PTO_BF16)
#error "pto_wgmma.cuh: wgmma's operands here are float16 or bfloat16 (PTO_HALF or PTO_BF16)"
#endif
static_assert(PTO_THREADS % 128 == 0, "wgmma is a warpgroup's (4 warps): a block of whole warpgroups");

#define PTO_WGMMA_ATOM 1024  // bytes: 8 lines of 128, the swizzle's period
#define PTO_WGMMA_PANEL 64   // elements of a line
#define PTO_WGMMA_K 16       // k of one instruction

// The byte offset (from a 1024-byte aligned base) at which a panel's byte `offset` lies.
__device__ inline unsigned pto_swizzle_128b(unsigned offset) { return offset ^ (((offset >> 7) & 7u) << 4); }

// Where element (r, c) of a tile of `lines` rows lies in this layout, its row the line (a row-major
// tile: K-major as a, MN-major as b): panel c / 64 of `lines` lines from `tile`, 1024-byte
// aligned, `lines` a multiple of 8 (the generated code's operands: cuda_codegen's swizzled tiles).
// The 8 elements of a 16-byte chunk stay together, so a chunk is copied whole.
template <class E>
__device__ inline E *pto_wgmma_operand_at(E *tile, int lines, int r, int c) {
    // 32-bit: a tile's bytes are a block's shared memory (64-bit indices cost a kernel's tail of
    // k, which zeroes elements in a loop, registers enough to spill)
    const unsigned line = (unsigned)(c / PTO_WGMMA_PANEL * lines + r);
    return (E *)((unsigned char *)tile + pto_swizzle_128b(line * 128 + (unsigned)(c % PTO_WGMMA_PANEL) * sizeof(E)));
}

// The shared-memory address a descriptor holds: the shared window's on a GPU; on the host the
// offset in the block's dynamic shared memory (a 1024-byte aligned buffer, so that both swizzle
// alike).
__device__ inline unsigned pto_wgmma_address(const void *at) {
#ifdef __CUDACC__
    return (unsigned)__cvta_generic_to_shared(at);
#else
    return (unsigned)((const unsigned char *)at - pto_dynamic_shared);
#endif
}

// Faults unless shared-memory address bits `bits` are 1024-byte aligned, as the swizzled
// operands' starts must be (the dynamic shared memory's alignment): a wrong base would read every
// operand swizzled differently, a silent wrong product.
__device__ inline void pto_wgmma_aligned(unsigned bits) {
    if (bits % PTO_WGMMA_ATOM == 0) return;
#ifdef __CUDACC__
    __trap();
#else
    std::fprintf(stderr, "pto_isa.cuh host build: block %lld: wgmma operands at shared offsets not 1024-byte "
                         "aligned (%#x)\n", pto_host_run->block_index, bits);
    std::abort();
#endif
}

// A matrix descriptor in the 128-byte swizzle: the start address, LBO and SBO in bytes (each a
// multiple of 16, below 256 KiB) and base offset 0 (its atoms 1024-byte aligned).
__device__ inline unsigned long long pto_wgmma_descriptor(unsigned start, unsigned leading, unsigned stride) {
    return (unsigned long long)((start >> 4) & 0x3fffu) | ((unsigned long long)((leading >> 4) & 0x3fffu) << 16) |
           ((unsigned long long)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);
}

// The descriptors of an instruction's step of 16 of k from k0, for operands laid out by
// pto_wgmma_operand_at, each a tile of `lines` rows from `start` (its first line's address):
// K-major (k along its rows: a, or B^T) 32 bytes on a step within a panel of 64, a panel's lines
// on past it; MN-major (k down its rows: a row-major K x N b) 16 lines on a step, LBO its panels'
// stride, so an instruction of N 128 reads two panels.
__device__ inline unsigned long long pto_wgmma_k_major(unsigned start, unsigned lines, int k0) {
    return pto_wgmma_descriptor(start + lines * 128 * (k0 / PTO_WGMMA_PANEL) + 2 * (k0 % PTO_WGMMA_PANEL), 16,
                                PTO_WGMMA_ATOM);
}
__device__ inline unsigned long long pto_wgmma_mn_major(unsigned start, unsigned lines, int k0) {
    return pto_wgmma_descriptor(start + 128 * k0, lines * 128, PTO_WGMMA_ATOM);
}

#ifdef __CUDACC__
// wgmma is sm_90a's: a kernel that uses it does not compile for another arch (the assertions
// fire where the templates are instantiated; nvcc's host pass sees empty bodies).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PTO_WGMMA_HERE false
#else
#define PTO_WGMMA_HERE true
#endif
#define PTO_WGMMA_ARCH(dependent)                                                                        \
    static_assert(PTO_WGMMA_HERE || (dependent) < 0, "wgmma runs on sm_90a only (NVRTC -arch=sm_90a; nvcc " \
                                                     "-gencode arch=compute_90a,code=sm_90a)")

// An instruction of no operands, as a function of its own.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define PTO_WGMMA_STATEMENT(name, instruction)      \
    template <int Unused = 0>                       \
    __device__ inline void name() {                 \
        asm volatile(instruction ::: "memory");     \
    }
#else
#define PTO_WGMMA_STATEMENT(name, instruction) \
    template <int Unused = 0>                  \
    __device__ inline void name() {            \
        PTO_WGMMA_ARCH(Unused);                \
    }
#endif
PTO_WGMMA_STATEMENT(pto_wgmma_fence_operands, "fence.proxy.async.shared::cta;")
PTO_WGMMA_STATEMENT(pto_wgmma_fence, "wgmma.fence.sync.aligned;")
PTO_WGMMA_STATEMENT(pto_wgmma_commit, "wgmma.commit_group.sync.aligned;")
// Waits until at most Pending of the warpgroup's newest groups are in flight.
template <int Pending>
__device__ inline void pto_wgmma_wait() {
    static_assert(Pending >= 0 && Pending <= 7, "wgmma.wait_group takes 0 to 7 groups in flight");
    PTO_WGMMA_ARCH(Pending);
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
#endif
}
// The compiler moves no read or write of the accumulators across this point (between an
// instruction and its wait the registers are the tensor cores').
template <int Count>
__device__ inline void pto_wgmma_hold(float (&d)[Count]) {
    PTO_UNROLL
    for (int i = 0; i < Count; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Each accumulator moved into its register by an instruction of its own, before a group's first
// wgmma: where a load from memory wrote one straight into its register (a product's result loaded
// to accumulate into), ptxas otherwise serializes every wgmma of the kernel, each waiting for the
// one before (C7515: "non wgmma instructions defining accumulator registers").
template <int Count>
__device__ inline void pto_wgmma_take(float (&d)[Count]) {
    PTO_UNROLL
    for (int i = 0; i < Count; ++i) {
        const float value = d[i];
        asm volatile("mov.b32 %0, %1;" : "=f"(d[i]) : "f"(value));
    }
}

#define PTO_WGMMA_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define PTO_WGMMA_D32(i) PTO_WGMMA_D8(i), PTO_WGMMA_D8(i + 8), PTO_WGMMA_D8(i + 16), PTO_WGMMA_D8(i + 24)
#define PTO_WGMMA_D64(i) PTO_WGMMA_D32(i), PTO_WGMMA_D32(i + 32)

// D = A * B (+ D where `accumulate`) on the warpgroup's tensor cores: A 64 x 16 and B 16 x N of
// T through their descriptors (B MN-major where TransposeB), D 64 x N floats as above; N is 64
// or 128. Every thread of the warpgroup calls it together, after pto_wgmma_fence.
template <int N, bool TransposeB>
__device__ inline void pto_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b, bool accumulate) {
    static_assert(N == 64 || N == 128, "pto_wgmma: N is 64 or 128");
    PTO_WGMMA_ARCH(N);
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    if constexpr (N == 64) {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTO_MMA_INPUTS " {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "%32, %33, p, 1, 1, 0, %35; }"
                     : PTO_WGMMA_D32(0)
                     : "l"(a), "l"(b), "r"((int)accumulate), "n"((int)TransposeB));
    } else {
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n\t"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTO_MMA_INPUTS " {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "%64, %65, p, 1, 1, 0, %67; }"
                     : PTO_WGMMA_D64(0)
                     : "l"(a), "l"(b), "r"((int)accumulate), "n"((int)TransposeB));
    }
#endif
}
#else
// The host build: an instruction waits in its thread's list (pto_host_run->wgmma, one a
// launch's thread; pto_isa.cuh) for the wait of its group.

// Element (line, k) of an operand as its descriptor lays it out (above), read from the block's
// shared memory; a descriptor of another form, or an element past the block's shared memory, is
// the kernel's bug, named.
inline float pto_host_wgmma_element(unsigned long long descriptor, int line, int k, bool k_major) {
    const unsigned start = (unsigned)(descriptor & 0x3fff) << 4;
    const unsigned leading = (unsigned)((descriptor >> 16) & 0x3fff) << 4;
    const unsigned stride = (unsigned)((descriptor >> 32) & 0x3fff) << 4;
    if ((descriptor >> 62) != 1 || ((descriptor >> 49) & 7) != 0) {
        std::fprintf(stderr, "pto_isa.cuh host build: block %lld: a wgmma descriptor %#llx is not of the 128-byte "
                             "swizzle with base offset 0, the one form emulated\n",
                     pto_host_run->block_index, descriptor);
        std::abort();
    }
    const unsigned offset = k_major
        ? start + (line % 8) * 128 + (line / 8) * stride + 2 * k
        : start + (line % 64) * 2 + (line / 64) * leading + (k % 8) * 128 + (k / 8) * stride;
    const unsigned at = pto_swizzle_128b(offset);
    if (at + sizeof(T) > pto_dynamic_shared_bytes) {
        std::fprintf(stderr, "pto_isa.cuh host build: block %lld: wgmma reads byte %u of shared memory, past the "
                             "launch's %u (descriptor %#llx, line %d, k %d)\n",
                     pto_host_run->block_index, at, pto_dynamic_shared_bytes, descriptor, line, k);
        std::abort();
    }
    T value;
    std::memcpy(&value, pto_dynamic_shared + at, sizeof value);
    return (float)value;
}

// One instruction's share of this thread: its accumulators, from shared memory as it is now.
inline void pto_host_wgmma_run(const PtoWgmmaIssue &issue) {
    const int thread = (int)threadIdx.x % 128, lane = thread % 32, group = lane / 4, pair = 2 * (lane % 4);
    for (int j = 0; j < issue.n / 8; ++j)
        for (int e = 0; e < 4; ++e) {
            const int row = 16 * (thread / 32) + group + 8 * (e / 2), col = 8 * j + pair + e % 2;
            float sum = issue.accumulate ? issue.d[4 * j + e] : 0.0f;
            for (int k = 0; k < PTO_WGMMA_K; ++k)
                sum += pto_host_wgmma_element(issue.a, row, k, true) *
                       pto_host_wgmma_element(issue.b, col, k, !issue.transpose_b);
            issue.d[4 * j + e] = sum;
        }
}

inline void pto_wgmma_fence_operands() {}
inline void pto_wgmma_fence() {}
template <int Count>
inline void pto_wgmma_hold(float (&)[Count]) {}
template <int Count>
inline void pto_wgmma_take(float (&)[Count]) {}

template <int N, bool TransposeB>
inline void pto_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b, bool accumulate) {
    static_assert(N == 64 || N == 128, "pto_wgmma: N is 64 or 128");
    PtoWgmmaThread &mine = pto_host_run->wgmma[threadIdx.x];
    mine.pending.push_back({d, N, a, b, accumulate, TransposeB, mine.committed});
}

inline void pto_wgmma_commit() { ++pto_host_run->wgmma[threadIdx.x].committed; }

template <int Pending>
inline void pto_wgmma_wait() {
    static_assert(Pending >= 0 && Pending <= 7, "wgmma.wait_group takes 0 to 7 groups in flight");
    PtoWgmmaThread &mine = pto_host_run->wgmma[threadIdx.x];
    pto_host_wait_groups(mine.pending, mine.committed, Pending, pto_host_wgmma_run);
}
#endif

#endif  // PTO_WGMMA_CUH
