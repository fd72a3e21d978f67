// Element-wise tiles (kernels/elementwise.py): one output element per work item.
#include "pto.cuh"

#define BINARY(name, expr)                                                                          \
    extern "C" __global__ void pto_##name(TILE(const T, a_), TILE(const T, b_), TILE(T, out_)) {    \
        const Tile<const T> a_t = TILE_OF(a_), b_t = TILE_OF(b_);                                   \
        const Tile<T> out = TILE_OF(out_);                                                          \
        PTO_FOR(n, out.size()) {                                                                    \
            const ACC a = load(a_t.flat(n)), b = load(b_t.flat(n));                                 \
            out.flat(n) = store(expr);                                                              \
        }                                                                                           \
    }

#define UNARY(name, expr)                                                                           \
    extern "C" __global__ void pto_##name(TILE(const T, a_), TILE(T, out_)) {                       \
        const Tile<const T> a_t = TILE_OF(a_);                                                      \
        const Tile<T> out = TILE_OF(out_);                                                          \
        PTO_FOR(n, out.size()) {                                                                    \
            const ACC a = load(a_t.flat(n));                                                        \
            out.flat(n) = store(expr);                                                              \
        }                                                                                           \
    }

BINARY(add, a + b)
BINARY(sub, a - b)
BINARY(mul, a * b)
BINARY(div, a / b)
UNARY(exp, exp(a))
UNARY(log, log(a))
UNARY(sqrt, sqrt(a))
UNARY(silu, a / ((ACC)1 + exp(-a)))

extern "C" __global__ void pto_scale(TILE(const T, a_), TILE(T, out_), double factor) {
    const Tile<const T> a = TILE_OF(a_);
    const Tile<T> out = TILE_OF(out_);
    PTO_FOR(n, out.size()) out.flat(n) = store(load(a.flat(n)) * (ACC)factor);
}
