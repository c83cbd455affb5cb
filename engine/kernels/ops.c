/*
 * The small per-layer operations of a Llama decoder step, for CPUs with AVX2 + FMA: RMS norm,
 * SiLU(gate) * up, argmax and the drafters' top-k picks (attention has a file of its own:
 * attention.c).
 *
 * Why: with the matrix products in skinny.c, what is left of a one-token forward on the 135M
 * model is mostly per-call overhead of ~20 small torch ops per layer (torch's RMS norm costs
 * ~40 us a call, its CPU flash attention ~65 us for one query and ~190 us for a 16-node tree).
 * These kernels do the same work in a few microseconds.
 *
 * Exactness: each output row is computed on its own, in a fixed order that does not depend on
 * how many rows the call has. Attention visits the cached prefix, then the row's tree
 * ancestors in index (= depth) order, then itself: exactly the keys, in exactly the order, that
 * plain decoding of that token would visit once those ancestors are committed. So a tree node's
 * logits are bit-identical to those plain decoding computes, and greedy speculation reproduces
 * greedy decoding token for token, by construction rather than by luck.
 */
#include <math.h>
#include <stdlib.h>

#include "vec.h"

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for T rows of H (H a multiple of 8). */
AVX2 void rms_norm(const float *x, long T, long H, const float *w, float eps, float *out) {
    for (long t = 0; t < T; t++) {
        const float *xr = x + t * H;
        float *yr = out + t * H;
        __m256 acc = _mm256_setzero_ps();
        for (long j = 0; j < H; j += 8) {
            const __m256 v = _mm256_loadu_ps(xr + j);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(acc) / (float)H + eps));
        for (long j = 0; j < H; j += 8)
            _mm256_storeu_ps(yr + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + j), inv),
                                                   _mm256_loadu_ps(w + j)));
    }
}

/* gu: [T, 2I] = [gate | up]; out: [T, I] = silu(gate) * up (I a multiple of 8). */
AVX2 void silu_mul(const float *gu, long T, long I, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        for (long j = 0; j < I; j += 8) {
            const __m256 gv = _mm256_loadu_ps(g + j);
            const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(o + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
        }
    }
}

/*
 * The index of each row's largest value: [rows, n] -> out[rows], the first index where the
 * maximum occurs, and the first NaN where a row has one (torch.argmax's answer in both cases).
 * With noise (perturbed_argmax_rows), of each row's x[i] * scale + noise[i] instead: coupled
 * sampling's draw (engine/sampling.py), the product and the sum each rounded once, as torch's
 * ``logits * scale + noise`` rounds them (this library is built without FMA contraction).
 *
 * Why: greedy verification takes the argmax of every verified row over the whole vocabulary
 * (49,152 floats on the embedded model), and torch's CPU argmax reads ~1 float per ns there:
 * ~45 us a row, ~1% of a plain step; eight lanes at a time it is a few microseconds. A sampled
 * step's three torch passes (scale, add, argmax) cost ~130 us a row.
 */
static inline __attribute__((always_inline)) AVX2 __m256 score8(const float *x, const float *g, __m256 s, long i) {
    const __m256 v = _mm256_loadu_ps(x + i);
    return g ? _mm256_add_ps(_mm256_mul_ps(v, s), _mm256_loadu_ps(g + i)) : v;
}

static inline __attribute__((always_inline)) float score1(const float *x, const float *g, float s, long i) {
    return g ? x[i] * s + g[i] : x[i];
}

static inline __attribute__((always_inline)) AVX2 long argmax_row(const float *x, long n, const float *g, float s) {
    long i = 0, best_i = 0;
    float best = score1(x, g, s, 0);
    if (n >= 8) {
        const __m256 vs = _mm256_set1_ps(s);
        __m256 vmax = score8(x, g, vs, 0), nan = _mm256_cmp_ps(vmax, vmax, _CMP_UNORD_Q);
        __m256i vidx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), cur = vidx;
        const __m256i eight = _mm256_set1_epi32(8);
        for (i = 8; i + 8 <= n; i += 8) {
            cur = _mm256_add_epi32(cur, eight);
            const __m256 v = score8(x, g, vs, i);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            const __m256 gt = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ); /* strictly greater: a lane keeps its first */
            vmax = _mm256_blendv_ps(vmax, v, gt);
            vidx = _mm256_blendv_epi8(vidx, cur, _mm256_castps_si256(gt));
        }
        if (_mm256_movemask_ps(nan)) { /* rare: the first NaN, as torch answers */
            for (long j = 0; j < n; j++) {
                const float v = score1(x, g, s, j);
                if (v != v) return j;
            }
        }
        float m[8];
        int ix[8];
        _mm256_storeu_ps(m, vmax);
        _mm256_storeu_si256((__m256i *)ix, vidx);
        best = m[0], best_i = ix[0];
        for (int l = 1; l < 8; l++)
            if (m[l] > best || (m[l] == best && ix[l] < best_i)) best = m[l], best_i = ix[l];
    }
    for (; i < n; i++) {
        const float v = score1(x, g, s, i);
        if (v != v) return i;
        if (v > best) best = v, best_i = i;
    }
    return best_i;
}

AVX2 void argmax_rows(const float *x, long rows, long n, long *out) {
    for (long r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n, NULL, 1.0f);
}

AVX2 void perturbed_argmax_rows(const float *x, long rows, long n, float scale, const float *noise, long *out) {
    for (long r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n, noise, scale);
}

/* Value v at index a into the k best so far (best[0..*filled-1], descending): a value equal to one
 * kept goes after it, so equals keep the lower index when indices come in order. */
static inline void keep_best(float *best, long *idx, long *filled, long k, float v, long a) {
    long p = *filled < k ? (*filled)++ : k - 1;
    while (p > 0 && best[p - 1] < v) {
        best[p] = best[p - 1];
        idx[p] = idx[p - 1];
        p--;
    }
    best[p] = v;
    idx[p] = a;
}

/*
 * In place, each of R rows of V floats becomes its log-softmax, x - (max + log(sum exp(x - max)));
 * with k > 0 each row's k largest (ties: the lower index; NaN never) go to ids[r * k..] (mapped through
 * vocab[] where given: a draft head's indices as target token ids) and vals[r * k..], best first.
 *
 * Why here: a draft level on the CPU is a handful of small steps after the head's forward, and each
 * torch operation between them costs ~15-20 us on average when the target's forward has just pushed torch's
 * code and data out of the caches (measured in a bench run: ~0.45 ms of a 0.8 ms drafted step was
 * the Python and torch around one native forward). The greedy tree search reads the picks as plain
 * lists from here instead of a log_softmax, a top-k, an index and a copy per level.
 */
AVX2 void log_softmax_topk(float *x, long R, long V, long k, const long *vocab, long *ids, float *vals) {
    for (long r = 0; r < R; r++) {
        float *xr = x + r * V;
        const float mx = max_of(xr, V);
        const __m256 m8 = _mm256_set1_ps(mx);
        __m256 s8 = _mm256_setzero_ps();
        long a = 0;
        for (; a + 8 <= V; a += 8) s8 = _mm256_add_ps(s8, exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + a), m8)));
        float tail[8] = {0}, e[8];
        for (long j = a; j < V; j++) tail[j - a] = xr[j] - mx;
        _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(tail)));
        float sum = hsum(s8);
        for (long j = a; j < V; j++) sum += e[j - a];
        const float lse = mx + logf(sum);
        const __m256 l8 = _mm256_set1_ps(lse);
        for (a = 0; a + 8 <= V; a += 8) _mm256_storeu_ps(xr + a, _mm256_sub_ps(_mm256_loadu_ps(xr + a), l8));
        for (; a < V; a++) xr[a] -= lse;
        if (k <= 0) continue;
        /* the k best by insertion; a value enters only above the current k-th (so equals keep the
         * lower index), and blocks of 8 with nothing above it are skipped in one compare */
        long *ir = ids + r * k;
        float *vr = vals + r * k;
        long filled = 0;
        float floor_ = -INFINITY;
        for (a = 0; a < V; a++) {
            if (a % 8 == 0 && a + 8 <= V && filled == k &&
                !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(xr + a), _mm256_set1_ps(floor_), _CMP_GT_OQ))) {
                a += 7;
                continue;
            }
            const float v = xr[a];
            if (!(v > floor_) && filled == k) continue;
            if (v != v) continue;
            keep_best(vr, ir, &filled, k, v, a);
            if (filled == k) floor_ = vr[k - 1];
        }
        for (long j = filled; j < k; j++) vr[j] = -INFINITY, ir[j] = 0; /* fewer than k numbers */
        if (vocab)
            for (long j = 0; j < k; j++) ir[j] = vocab[ir[j]];
    }
}

/*
 * Coupled drafting's picks (engine/sampling.py): for each of R rows of V log-probabilities, the k
 * largest logp[i] / T + noise[vocab[i]] (noise over the target's vocabulary; vocab NULL: i itself),
 * as target ids in ids[r * k..] and their log-probabilities (not the scores) in vals[r * k..], best
 * first, ties to the lower index. This is the top-k of log(softmax(logp / T)) + noise without top-k
 * or top-p processing: the softmax's normaliser is the same for every entry of a row, so it does not
 * reorder them. Why in C: the tensor path is ten operations a level (log_softmax_topk says why that
 * costs more than the arithmetic).
 */
void perturbed_topk(const float *logp, long R, long V, long k, float inv_t, const float *noise, const long *vocab,
                    long *ids, float *vals) {
    for (long r = 0; r < R; r++) {
        const float *xr = logp + r * V;
        long *ir = ids + r * k;
        float *vr = vals + r * k;
        float best[64];
        const long kk = k < 64 ? k : 64;
        long filled = 0;
        for (long a = 0; a < V; a++) {
            const long t = vocab ? vocab[a] : a;
            const float s = xr[a] * inv_t + noise[t];
            if (s != s || (filled == kk && !(s > best[kk - 1]))) continue;
            keep_best(best, ir, &filled, kk, s, a);
        }
        for (long j = 0; j < filled; j++) vr[j] = xr[ir[j]];
        for (long j = filled; j < k; j++) vr[j] = -INFINITY, ir[j] = 0;
        if (vocab)
            for (long j = 0; j < filled; j++) ir[j] = vocab[ir[j]];
    }
}
