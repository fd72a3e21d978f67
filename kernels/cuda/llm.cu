// Composite LLM tiles (kernels/llm.py). Attention tiles are (heads, rows, head_dim) views and
// the running max, running sum and rescale of a query tile are (heads, rows, 1).
#include "pto.cuh"

// One row per work item.
extern "C" __global__ void pto_rmsnorm(TILE(const T, x_), TILE(const T, weight_), TILE(T, out_), double eps) {
    const Tile<const T> x = TILE_OF(x_), weight = TILE_OF(weight_);
    const Tile<T> out = TILE_OF(out_);
    const long long cols = x.d[2];
    PTO_FOR(row, x.d[1]) {
        ACC squares = 0;
        for (long long col = 0; col < cols; ++col) squares += load(x.at(0, row, col)) * load(x.at(0, row, col));
        const ACC inverse = (ACC)1 / sqrt(squares / (ACC)cols + (ACC)eps);
        for (long long col = 0; col < cols; ++col)
            out.at(0, row, col) = store(load(x.at(0, row, col)) * inverse * load(weight.at(0, 0, col)));
    }
}

// In place: each head's two halves rotate by angles of the row's position. One (row, head,
// pair) per work item; angles in double, as the CPU kernel computes them.
extern "C" __global__ void pto_rope(TILE(T, x_), long long first_position, long long heads) {
    const Tile<T> x = TILE_OF(x_);
    const long long dim = x.d[2] / heads, half = dim / 2;
    PTO_FOR(n, x.d[1] * heads * half) {
        const long long row = n / (heads * half), head = n / half % heads, i = n % half;
        const double angle = (double)(first_position + row) * pow(10000.0, -2.0 * (double)i / (double)dim);
        const ACC c = (ACC)(T)cos(angle), s = (ACC)(T)sin(angle);
        T &first = x.at(0, row, head * dim + i), &second = x.at(0, row, head * dim + half + i);
        const ACC a = load(first), b = load(second);
        first = store(a * c - b * s);
        second = store(b * c + a * s);
    }
}

// In place: gate = silu(gate) * up.
extern "C" __global__ void pto_swiglu(TILE(T, gate_), TILE(const T, up_)) {
    const Tile<T> gate = TILE_OF(gate_);
    const Tile<const T> up = TILE_OF(up_);
    PTO_FOR(n, gate.size()) {
        const ACC g = load(gate.flat(n));
        gate.flat(n) = store(g * (load(up.flat(n)) / ((ACC)1 + exp(-g))));
    }
}

// One output element per work item; the first of each row also resets its max and sum.
extern "C" __global__ void pto_flash_init(TILE(T, running_max_), TILE(T, running_sum_), TILE(T, out_)) {
    const Tile<T> running_max = TILE_OF(running_max_), running_sum = TILE_OF(running_sum_);
    const Tile<T> out = TILE_OF(out_);
    PTO_FOR(n, out.size()) {
        out.flat(n) = store(0);
        if (n % out.d[2] == 0) {
            const long long head = n / (out.d[1] * out.d[2]), row = n / out.d[2] % out.d[1];
            running_max.at(head, row, 0) = store(-PTO_INFINITY);
            running_sum.at(head, row, 0) = store(0);
        }
    }
}

// scores = q kᵀ / sqrt(d), -inf where a key comes after its query (causal). One score per item.
extern "C" __global__ void pto_flash_scores(TILE(const T, q_), TILE(const T, k_), TILE(T, scores_),
                                            long long q_start, long long k_start, long long causal) {
    const Tile<const T> q = TILE_OF(q_), k = TILE_OF(k_);
    const Tile<T> scores = TILE_OF(scores_);
    const long long rows = scores.d[1], keys = scores.d[2], dim = q.d[2];
    const ACC inverse_sqrt_dim = (ACC)(1.0 / sqrt((double)dim));
    PTO_FOR(n, scores.size()) {
        const long long head = n / (rows * keys), row = n / keys % rows, key = n % keys;
        ACC dot = 0;
        for (long long i = 0; i < dim; ++i) dot += load(q.at(head, row, i)) * load(k.at(head, key, i));
        const bool masked = causal && k_start + key > q_start + row;
        scores.at(head, row, key) = store(masked ? -PTO_INFINITY : dot * inverse_sqrt_dim);
    }
}

// Online softmax over one key tile, one (head, row) per item: scores become exp(s - new max),
// the running sum is rescaled and grows, and `rescale` = exp(old max - new max).
extern "C" __global__ void pto_flash_softmax_update(TILE(T, scores_), TILE(T, running_max_),
                                                    TILE(T, running_sum_), TILE(T, rescale_)) {
    const Tile<T> scores = TILE_OF(scores_), running_max = TILE_OF(running_max_);
    const Tile<T> running_sum = TILE_OF(running_sum_), rescale = TILE_OF(rescale_);
    const long long rows = scores.d[1], keys = scores.d[2];
    PTO_FOR(n, scores.d[0] * rows) {
        const long long head = n / rows, row = n % rows;
        const ACC old_max = load(running_max.at(head, row, 0));
        ACC new_max = old_max;
        for (long long key = 0; key < keys; ++key) {
            const ACC s = load(scores.at(head, row, key));
            new_max = s > new_max ? s : new_max;
        }
        const ACC factor = exp(old_max - new_max);
        ACC sum = 0;
        for (long long key = 0; key < keys; ++key) {
            const T p = store(exp(load(scores.at(head, row, key)) - new_max));
            scores.at(head, row, key) = p;
            sum += load(p);
        }
        rescale.at(head, row, 0) = store(factor);
        running_sum.at(head, row, 0) = store(load(running_sum.at(head, row, 0)) * factor + sum);
        running_max.at(head, row, 0) = store(new_max);
    }
}

// out = out * rescale + p v, one output element per item.
extern "C" __global__ void pto_flash_pv(TILE(const T, p_), TILE(const T, v_), TILE(const T, rescale_),
                                        TILE(T, out_)) {
    const Tile<const T> p = TILE_OF(p_), v = TILE_OF(v_), rescale = TILE_OF(rescale_);
    const Tile<T> out = TILE_OF(out_);
    const long long rows = out.d[1], dim = out.d[2], keys = p.d[2];
    PTO_FOR(n, out.size()) {
        const long long head = n / (rows * dim), row = n / dim % rows, i = n % dim;
        ACC sum = 0;
        for (long long key = 0; key < keys; ++key) sum += load(p.at(head, row, key)) * load(v.at(head, key, i));
        out.at(head, row, i) = store(load(out.at(head, row, i)) * load(rescale.at(head, row, 0)) + sum);
    }
}

extern "C" __global__ void pto_flash_normalise(TILE(const T, acc_), TILE(const T, running_sum_), TILE(T, out_)) {
    const Tile<const T> acc = TILE_OF(acc_), running_sum = TILE_OF(running_sum_);
    const Tile<T> out = TILE_OF(out_);
    const long long rows = out.d[1], dim = out.d[2];
    PTO_FOR(n, out.size()) {
        const long long head = n / (rows * dim), row = n / dim % rows, i = n % dim;
        out.at(head, row, i) = store(load(acc.at(head, row, i)) / load(running_sum.at(head, row, 0)));
    }
}
