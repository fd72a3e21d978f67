// A probe of wgmma and its layouts (backends/wgmma_probe.py, tests/test_cuda_wgmma.py), pasted
// after pto_isa.cuh and pto_wgmma.cuh with PTO_WARPS 4 (one warpgroup a block): D = rounds x A B,
// A 64 x K and B K x N row major in global memory, laid out in shared memory in pto_wgmma.cuh's swizzled panels (B
// MN-major where TransposeB, else K-major) and multiplied in steps of 16 of k, `rounds` times
// over (the first step not adding the accumulators' NaN). The same text runs on the host build
// (against its emulation) and on an sm_90a GPU (against the hardware), each held to numpy: where
// the host passes and the GPU does not, pto_wgmma.cuh's reading of the layouts is wrong, not this
// probe's arithmetic. Each block writes its own D (d + 64 N blockIdx.x); with many rounds over
// many blocks (bench/test_gpu.py) it measures the tensor cores' rate from shared memory.

// The bytes of A's panels, then B's, from the 1024-byte aligned base.
template <int N, int K>
constexpr unsigned pto_probe_bytes() { return (64 * K + K * N) * sizeof(T); }

template <int N, bool TransposeB, int K>
__device__ void pto_wgmma_probe(const T *a, const T *b, float *d, int rounds) {
    static_assert(K % PTO_WGMMA_PANEL == 0 && N % PTO_WGMMA_PANEL == 0, "whole panels");
    // The generated kernels rely on the dynamic shared memory's alignment (pto_isa.cuh's
    // __align__(1024) where PTO_WGMMA); so does the probe: where it does not hold, D is NaN.
    const bool aligned = pto_wgmma_address(pto_dynamic_shared) % PTO_WGMMA_ATOM == 0;
    T *sa = (T *)pto_dynamic_shared, *sb = sa + 64 * K;
    // Laid out as the generated code lays its operands (pto_wgmma_operand_at): A's rows its lines,
    // B's rows where MN-major (a K x N tile), else its columns (B^T, an N x K tile).
    for (int i = threadIdx.x; i < 64 * K; i += PTO_THREADS) *pto_wgmma_operand_at(sa, 64, i / K, i % K) = a[i];
    for (int i = threadIdx.x; i < K * N; i += PTO_THREADS) {
        const int k = i / N, n = i % N;
        *(TransposeB ? pto_wgmma_operand_at(sb, K, k, n) : pto_wgmma_operand_at(sb, N, n, k)) = b[i];
    }
    pto_wgmma_fence_operands();
    __syncthreads();

    float acc[N / 2];
    for (int i = 0; i < N / 2; ++i) acc[i] = PTO_INF - PTO_INF;  // NaN: the first step must not add it
    pto_wgmma_hold(acc);
    pto_wgmma_fence();
    const unsigned a_start = pto_wgmma_address(sa), b_start = pto_wgmma_address(sb);
    PTO_UNROLL_BY(1)  // unrolled, ptxas orders the registers between rounds with more warpgroup.arrive
    for (int round = 0; round < rounds; ++round) {
        PTO_UNROLL
        for (int k0 = 0; k0 < K; k0 += PTO_WGMMA_K) {
            const unsigned long long b_step =
                TransposeB ? pto_wgmma_mn_major(b_start, K, k0) : pto_wgmma_k_major(b_start, N, k0);
            pto_wgmma<N, TransposeB>(acc, pto_wgmma_k_major(a_start, 64, k0), b_step, round > 0 || k0 > 0);
        }
    }
    pto_wgmma_commit();
    pto_wgmma_wait<0>();
    pto_wgmma_hold(acc);

    const int thread = threadIdx.x, lane = thread % 32, group = lane / 4, pair = 2 * (lane % 4);
    d += (long long)blockIdx.x * 64 * N;
    for (int j = 0; j < N / 8; ++j)
        for (int e = 0; e < 4; ++e)
            d[(16 * (thread / 32) + group + 8 * (e / 2)) * N + 8 * j + pair + e % 2] =
                aligned ? acc[4 * j + e] : PTO_INF - PTO_INF;
}

// The kernels the test runs (name: N, B's major, K), and the host build's entries to them.
#define PTO_PROBE(name, N, TransposeB, K)                                                                   \
    extern "C" __global__ void __launch_bounds__(PTO_THREADS, 1) name(const T *a, const T *b, float *d, \
                                                                     int rounds) {                        \
        pto_wgmma_probe<N, TransposeB, K>(a, b, d, rounds);                                                 \
    }                                                                                                       \
    PTO_PROBE_HOST(name, N, K)
#ifdef __CUDACC__
#define PTO_PROBE_HOST(name, N, K)
#else
#define PTO_PROBE_HOST(name, N, K)                                                              \
    extern "C" void pto_host_##name(long long blocks, const T *a, const T *b, float *d, int rounds) { \
        pto_host_launch(blocks, pto_probe_bytes<N, K>(), [&] { name(a, b, d, rounds); });         \
    }

// The descriptor of pto_wgmma.cuh's encoding, for the test to hold to CUTLASS's values.
extern "C" unsigned long long pto_host_wgmma_descriptor(unsigned start, unsigned leading, unsigned stride) {
    return pto_wgmma_descriptor(start, leading, stride);
}
#endif

PTO_PROBE(wgmma_n64_mn_major, 64, true, 128)
PTO_PROBE(wgmma_n128_mn_major, 128, true, 128)
PTO_PROBE(wgmma_n64_k_major, 64, false, 128)
PTO_PROBE(wgmma_n128_k_major, 128, false, 128)
