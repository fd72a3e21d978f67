// Reductions and row broadcasts (kernels/reduce.py). Row results are (m, 1) columns.
#include "pto.cuh"

// One row per work item.
extern "C" __global__ void pto_row_sum(TILE(const T, a_), TILE(T, out_)) {
    const Tile<const T> a = TILE_OF(a_);
    const Tile<T> out = TILE_OF(out_);
    PTO_FOR(row, a.d[1]) {
        ACC sum = 0;
        for (long long col = 0; col < a.d[2]; ++col) sum += load(a.at(0, row, col));
        out.at(0, row, 0) = store(sum);
    }
}

extern "C" __global__ void pto_row_max(TILE(const T, a_), TILE(T, out_)) {
    const Tile<const T> a = TILE_OF(a_);
    const Tile<T> out = TILE_OF(out_);
    PTO_FOR(row, a.d[1]) {
        ACC most = -PTO_INFINITY;
        for (long long col = 0; col < a.d[2]; ++col) {
            const ACC x = load(a.at(0, row, col));
            most = x > most || x != x ? x : most;  // NaN wins, as in numpy
        }
        out.at(0, row, 0) = store(most);
    }
}

// One column per work item.
extern "C" __global__ void pto_col_sum(TILE(const T, a_), TILE(T, out_)) {
    const Tile<const T> a = TILE_OF(a_);
    const Tile<T> out = TILE_OF(out_);
    PTO_FOR(col, a.d[2]) {
        ACC sum = 0;
        for (long long row = 0; row < a.d[1]; ++row) sum += load(a.at(0, row, col));
        out.at(0, 0, col) = store(sum);
    }
}

#define ROW_BROADCAST(name, op)                                                                     \
    extern "C" __global__ void pto_##name(TILE(const T, a_), TILE(const T, r_), TILE(T, out_)) {    \
        const Tile<const T> a = TILE_OF(a_), r = TILE_OF(r_);                                       \
        const Tile<T> out = TILE_OF(out_);                                                          \
        const long long cols = out.d[2];                                                            \
        PTO_FOR(n, out.size()) {                                                                    \
            const long long row = n / cols, col = n % cols;                                         \
            out.at(0, row, col) = store(load(a.at(0, row, col)) op load(r.at(0, row, 0)));          \
        }                                                                                           \
    }

ROW_BROADCAST(row_expand_sub, -)
ROW_BROADCAST(row_expand_div, /)
ROW_BROADCAST(row_expand_mul, *)
