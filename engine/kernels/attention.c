/*
 * Attention of a few new tokens (one, a draft tree, or the data engine's rows) over the KV cache.
 *
 * Exactness (see ops.c): each output row is computed on its own, over its keys in a fixed order
 * (the cached prefix, then its tree ancestors in index order, then itself), so a tree node gets the
 * bits plain decoding computes for it. Every code path, here and in attention_shared.c (a tree's
 * tokens on shared key blocks, 16 lanes an instruction where the CPU has AVX-512), runs the same
 * 8-lane FMA chains in the same order, so which path a row takes never changes a bit.
 */
#include <immintrin.h>
#include <stdlib.h>

#include "attention.h"


/*
 * softmax(q_r . k_a * scale) . v_a for the G query heads r that share one KV head, over the keys
 * listed in keys[0..n-1] (slot indices into kh/vh), visited in list order. q row r at q + r * hd,
 * out row r at out + r * hd. scores: scratch for G * n floats; acc: scratch for G * hd floats.
 *
 * Why G rows at once: each row's arithmetic is the one-row computation (the same FMA chains in
 * the same key order), but the keys are read once for the group while they sit in L1, not once
 * per head from L2. With the 135M model's 3 heads per KV head a 16-node verify's attention cost
 * about half as much. A row's bits do not depend on G (tests/test_attention.py), so every entry
 * point below agrees with every other whenever it lists the same keys in the same order.
 */
INLINE AVX2 void attend(int G, const float *q, const void *kh, const void *vh, const int *keys, long n, int hd,
                       float scale, float *scores, float *acc, float *out, const int kv16) {
    const __m256 sc = _mm256_set1_ps(scale);
    /* scores, 8 keys at a time (8 independent FMA chains per row), then one at a time */
    long a0 = 0;
    for (; a0 + 8 <= n; a0 += 8) {
        long kr[8];
        for (int i = 0; i < 8; i++) kr[i] = (long)keys[a0 + i] * hd;
        for (int r = 0; r < G; r++) {
            const float *qr = q + (long)r * hd;
            __m256 d[8];
            for (int i = 0; i < 8; i++) d[i] = _mm256_setzero_ps();
            for (int c = 0; c < hd; c += 8) {
                const __m256 qc = _mm256_loadu_ps(qr + c);
                for (int i = 0; i < 8; i++) d[i] = _mm256_fmadd_ps(qc, kv8(kh, kr[i] + c, kv16), d[i]);
            }
            _mm256_storeu_ps(scores + r * n + a0, _mm256_mul_ps(hsum8x8(d), sc));
        }
    }
    for (; a0 < n; a0++)
        for (int r = 0; r < G; r++)
            scores[r * n + a0] = dot_kv(q + (long)r * hd, kh, (long)keys[a0] * hd, hd, kv16) * scale;
    /* softmax numerators in place, and each row's 1 / sum */
    float inv[MAX_GROUP];
    for (int r = 0; r < G; r++) inv[r] = softmax_numerators(scores + r * n, n);
    /* out_r = sum_a p_ra v_a / sum_r: 64 columns at a time in registers, the keys in blocks of
     * VBLOCK with each row's partial sums parked in acc between blocks (same chain, same order) */
    int c0 = 0;
    for (; c0 + 64 <= hd; c0 += 64) {
        for (long b0 = 0; b0 < n || b0 == 0; b0 += VBLOCK) {
            const long b1 = b0 + VBLOCK < n ? b0 + VBLOCK : n;
            for (int r = 0; r < G; r++) {
                const float *sr = scores + r * n;
                float *ar = acc + (long)r * hd + c0;
                __m256 v8[8];
                for (int c = 0; c < 8; c++) v8[c] = b0 ? _mm256_loadu_ps(ar + 8 * c) : _mm256_setzero_ps();
                for (long a = b0; a < b1; a++) {
                    const __m256 p = _mm256_set1_ps(sr[a]);
                    const long vr = (long)keys[a] * hd + c0;
                    for (int c = 0; c < 8; c++) v8[c] = _mm256_fmadd_ps(p, kv8(vh, vr + 8 * c, kv16), v8[c]);
                }
                for (int c = 0; c < 8; c++) _mm256_storeu_ps(ar + 8 * c, v8[c]);
            }
        }
        for (int r = 0; r < G; r++) {
            const __m256 iv = _mm256_set1_ps(inv[r]);
            for (int c = 0; c < 8; c++)
                _mm256_storeu_ps(out + (long)r * hd + c0 + 8 * c,
                                 _mm256_mul_ps(_mm256_loadu_ps(acc + (long)r * hd + c0 + 8 * c), iv));
        }
    }
    for (; c0 < hd; c0 += 8)
        for (int r = 0; r < G; r++) {
            const float *sr = scores + r * n;
            __m256 a8 = _mm256_setzero_ps();
            for (long a = 0; a < n; a++)
                a8 = _mm256_fmadd_ps(_mm256_set1_ps(sr[a]), kv8(vh, (long)keys[a] * hd + c0, kv16), a8);
            _mm256_storeu_ps(out + (long)r * hd + c0, _mm256_mul_ps(a8, _mm256_set1_ps(inv[r])));
        }
}

/* attend() for either cache kind, each an inlined copy with its loads fixed. */
static AVX2 void attend_any(int G, const float *q, const void *kh, const void *vh, const int *keys, long n, int hd,
                            float scale, float *scores, float *acc, float *out, int kv16) {
    if (kv16)
        attend(G, q, kh, vh, keys, n, hd, scale, scores, acc, out, 1);
    else
        attend(G, q, kh, vh, keys, n, hd, scale, scores, acc, out, 0);
}

/* How many query heads of a KV group one work item takes: the whole group, unless that leaves
 * too few items to keep every thread busy (one token, few KV heads); any split gives the same bits. */
static int heads_per_item(long T, int nkv, int group, int nthreads) {
    int sg = group < MAX_GROUP ? group : MAX_GROUP;
    while (sg > 1 && T * nkv * ((group + sg - 1) / sg) < 2L * nthreads) sg = (sg + 1) / 2;
    return sg;
}

/* One work item of the per-token paths: token t's query heads h .. h + rows - 1, which share KV
 * head g (items run over T tokens x nkv KV heads x parts of sg heads). */
typedef struct {
    long t;
    int g, h, rows;
} item_t;

static inline item_t split_item(long item, int nkv, int group, int sg, int parts) {
    item_t it;
    it.t = item / (nkv * parts);
    it.g = (int)(item / parts % nkv);
    it.h = it.g * group + (int)(item % parts) * sg;
    it.rows = it.h + sg <= (it.g + 1) * group ? sg : (it.g + 1) * group - it.h;
    return it;
}

/* attend() for one item over keys[0..n-1]: the rows' queries and outputs in the [T, nh * hd] layouts. */
static AVX2 void attend_item(item_t it, const float *q, long q_stride, const void *k, const void *v, long cap, int nh,
                             int hd, const int *keys, long n, float scale, float *scores, float *acc, float *out,
                             int kv16) {
    attend_any(it.rows, q + it.t * q_stride + (long)it.h * hd, kv_head(k, it.g, cap, hd, kv16),
               kv_head(v, it.g, cap, hd, kv16), keys, n, hd, scale, scores, acc,
               out + it.t * (long)nh * hd + (long)it.h * hd, kv16);
}

/*
 * Attention of T new tokens over L cached ones plus the new ones themselves.
 * q: row t, head h at q + t * q_stride + h * hd. k, v: [nkv, cap, hd] for this layer, the new
 * tokens already written at slots L..L+T-1. tree: [T, T] bytes (1 = may attend) or NULL for
 * causal. window > 0: a key at position pk is visible to a query at pq only if pq - pk < window
 * (positions: [T]; cached slot j has position j). out: [T, nh * hd]. hd a multiple of 8.
 */
AVX2 void tree_attention(const float *q, long q_stride, const void *k, const void *v, long cap, long L,
                         long T, int nh, int nkv, int hd, const unsigned char *tree, long window,
                         const long *positions, float scale, float *out, int nthreads, int kv16) {
    if (T >= 2 && window <= 0 && hd % 64 == 0 && hd <= SHARED_MAX_HD && nh / nkv <= MAX_GROUP) {
        tree_attention_shared(q, q_stride, k, v, cap, L, T, nh, nkv, hd, tree, scale, out, nthreads, kv16);
        return;
    }
    const int group = nh / nkv, sg = heads_per_item(T, nkv, group, nthreads), parts = (group + sg - 1) / sg;
#pragma omp parallel num_threads(nthreads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(sg * (L + T)));
        float *acc = malloc(sizeof(float) * (size_t)(sg * hd));
        int *keys = malloc(sizeof(int) * (size_t)(L + T));
#pragma omp for schedule(static)
        for (long item = 0; item < T * nkv * parts; item++) {
            const item_t it = split_item(item, nkv, group, sg, parts);
            const long t = it.t, pq = positions ? positions[t] : L + t;
            long n = 0;
            for (long j = 0; j < L; j++)
                if (window <= 0 || pq - j < window) keys[n++] = (int)j;
            for (long i = 0; i < (tree ? T : t + 1); i++) {
                const int visible = tree ? tree[t * T + i] : 1;
                const long pk = positions ? positions[i] : L + i;
                if (visible && (window <= 0 || pq - pk < window)) keys[n++] = (int)(L + i);
            }
            attend_item(it, q, q_stride, k, v, cap, nh, hd, keys, n, scale, scores, acc, out, kv16);
        }
        free(scores);
        free(acc);
        free(keys);
    }
}

/*
 * Attention where each query lists its keys: the slots first[t] .. last[t] in order (a range that
 * may be empty, last < first), then the nextra[t] slots extra[t * max_extra ..] in the given
 * order (extra may be NULL). With window > 0, a key at range slot j sits at position j - first[t]
 * and is visible to the query at positions[t] only if their distance is below the window (extra
 * keys are not windowed).
 *
 * Two callers: the data engine's rows (each token sees its own sequence's slots seg..slot:
 * rows_attention) and an EAGLE head drafting a tree level (the committed entries 0..n-1, then the
 * node's ancestors and itself, never a sibling's branch). A token lists the same keys in the same
 * order as a one-sequence call would, so its output is bit-identical to that call's.
 */
AVX2 void keyed_attention(const float *q, long q_stride, const void *k, const void *v, long cap, long T, int nh,
                          int nkv, int hd, const long *first, const long *last, const int *extra, long max_extra,
                          const int *nextra, long window, const long *positions, float scale, float *out,
                          int nthreads, int kv16) {
    const int group = nh / nkv;
    long most = 1;
    for (long t = 0; t < T; t++) {
        const long n = (last[t] >= first[t] ? last[t] - first[t] + 1 : 0) + (extra ? nextra[t] : 0);
        if (n > most) most = n;
    }
    const int sg = heads_per_item(T, nkv, group, nthreads), parts = (group + sg - 1) / sg;
#pragma omp parallel num_threads(nthreads) if (T * nh * most > 4096)
    {
        float *scores = malloc(sizeof(float) * (size_t)(sg * most));
        float *acc = malloc(sizeof(float) * (size_t)(sg * hd));
        int *keys = malloc(sizeof(int) * (size_t)most);
#pragma omp for schedule(dynamic, 2)
        for (long item = 0; item < T * nkv * parts; item++) {
            const item_t it = split_item(item, nkv, group, sg, parts);
            const long t = it.t;
            long n = 0;
            for (long j = first[t]; j <= last[t]; j++)
                if (window <= 0 || positions[t] - (j - first[t]) < window) keys[n++] = (int)j;
            for (long i = 0; extra && i < nextra[t]; i++) keys[n++] = extra[t * max_extra + i];
            attend_item(it, q, q_stride, k, v, cap, nh, hd, keys, n, scale, scores, acc, out, kv16);
        }
        free(scores);
        free(acc);
        free(keys);
    }
}

/* The data engine's rows: token t sees its own sequence's slots seg[t] .. slots[t]. */
AVX2 void rows_attention(const float *q, long q_stride, const void *k, const void *v, long cap, long T, int nh,
                         int nkv, int hd, const long *seg, const long *slots, long window, const long *positions,
                         float scale, float *out, int nthreads, int kv16) {
    keyed_attention(q, q_stride, k, v, cap, T, nh, nkv, hd, seg, slots, NULL, 0, NULL, window, positions, scale, out,
                    nthreads, kv16);
}
