// Data movement and matrix tiles (kernels/tiles.py): copy, zero, matmul, matmul_acc.
#include "pto.cuh"

extern "C" __global__ void pto_copy(TILE(const T, src_), TILE(T, dst_)) {
    const Tile<const T> src = TILE_OF(src_);
    const Tile<T> dst = TILE_OF(dst_);
    PTO_FOR(n, dst.size()) dst.flat(n) = src.flat(n);
}

extern "C" __global__ void pto_zero(TILE(T, out_)) {
    const Tile<T> out = TILE_OF(out_);
    PTO_FOR(n, out.size()) out.flat(n) = store(0);
}

// out (+)= a @ b for (1, m, k) @ (1, k, n): one output element per item, summed in ACC.
__device__ inline void matmul_into(const Tile<const T> &a, const Tile<const T> &b, const Tile<T> &out,
                                   bool accumulate) {
    const long long depth = a.d[2], cols = out.d[2];
    PTO_FOR(n, out.size()) {
        const long long row = n / cols, col = n % cols;
        ACC sum = accumulate ? load(out.at(0, row, col)) : (ACC)0;
        for (long long k = 0; k < depth; ++k) sum += load(a.at(0, row, k)) * load(b.at(0, k, col));
        out.at(0, row, col) = store(sum);
    }
}

extern "C" __global__ void pto_matmul(TILE(const T, a_), TILE(const T, b_), TILE(T, out_)) {
    const Tile<const T> a = TILE_OF(a_), b = TILE_OF(b_);
    const Tile<T> out = TILE_OF(out_);
    matmul_into(a, b, out, false);
}

extern "C" __global__ void pto_matmul_acc(TILE(const T, a_), TILE(const T, b_), TILE(T, acc_)) {
    const Tile<const T> a = TILE_OF(a_), b = TILE_OF(b_);
    const Tile<T> acc = TILE_OF(acc_);
    matmul_into(a, b, acc, true);
}
