/*
 * The small per-layer operations of a Llama decoder step, for CPUs with AVX2 + FMA: RMS norm,
 * SiLU(gate) * up, and attention of a few new tokens (a draft tree) over the KV cache.
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
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* Sum of 8 lanes in the canonical order ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)), the order
 * hsum8x8 uses too, so a dot product's value does not depend on which path computed it. */
static inline AVX2 float hsum(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The 8 lane sums of v[0..7] in one vector, each in hsum's order. */
static inline AVX2 __m256 hsum8x8(const __m256 *v) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp(x) for 8 lanes: range reduction by ln 2 and a degree-6 polynomial (about 1 ulp). */
static inline AVX2 __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

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
 * Eight cached K/V values from element i of a cache that holds fp32, or fp16 (kv16: the fast
 * precision's cache, half the bytes; F16C widens each value exactly, so the arithmetic after the
 * load is the fp32 cache's on the rounded values). The attention below is written once and
 * inlined for each kind (kv16 is a constant at every call site that matters).
 */
INLINE AVX2 __m256 kv8(const void *base, long i, const int kv16) {
    if (kv16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const unsigned short *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

/* A dot product of a query row with the cached K row at element i: one FMA chain, then hsum(). */
INLINE AVX2 float dot_kv(const float *a, const void *base, long i, int n, const int kv16) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), kv8(base, i + j, kv16), acc);
    return hsum(acc);
}

/* KV head g of one layer's cache [nkv, cap, hd] of fp32 or (kv16) fp16 values. */
static inline const char *kv_head(const void *cache, long g, long cap, int hd, int kv16) {
    return (const char *)cache + g * cap * hd * (kv16 ? 2 : 4);
}

/* The largest of x[0..n-1], 8 lanes at a time. Why not a scalar loop: its compare-and-keep
 * chain cost a third of a tree verify's attention. Which of two equal (or +0/-0) values wins
 * cannot change the softmax below, so this equals the scalar answer for every use here. */
static inline AVX2 float max_of(const float *x, long n) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    long a = 0;
    for (; a + 8 <= n; a += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + a));
    float l[8];
    _mm256_storeu_ps(l, m8);
    float mx = l[0];
    for (int i = 1; i < 8; i++) mx = l[i] > mx ? l[i] : mx;
    for (; a < n; a++) mx = x[a] > mx ? x[a] : mx;
    return mx;
}

/* Softmax numerators of one row's n scores in place (exp(s - max)); returns 1 / their sum. */
static inline AVX2 float softmax_numerators(float *sr, long n) {
    const float mx = max_of(sr, n);
    const __m256 m8 = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    long a = 0;
    for (; a + 8 <= n; a += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + a), m8));
        _mm256_storeu_ps(sr + a, e);
        s8 = _mm256_add_ps(s8, e);
    }
    float sum = hsum(s8);
    for (; a < n; a++) {
        float lane[8] = {sr[a] - mx};
        float e[8];
        _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(lane)));
        sr[a] = e[0];
        sum += e[0];
    }
    return 1.0f / sum;
}

/* Keys per block of the value pass: 64 keys of 64 floats (16 KB) stay in L1 while every row of
 * the group reads them. */
#define VBLOCK 64
/* Rows one call of attend() handles at most: the query heads that share a KV head. */
#define MAX_GROUP 16

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

/* Tokens of a tree that one work item of tree_attention's shared path takes at most. */
#define SHARED_TOKENS 16
#define SHARED_MAX_HD 256 /* head dims the shared path takes (multiples of 64 up to this) */

/*
 * attend() for the G query heads of one KV head in ntok tokens of a tree at once (R = ntok * G
 * rows: row r is head r % G of token r / G, its query at q[r], its output at out[r]). Every token
 * sees the cached slots 0..L-1 first, then its own tree keys tail[i][0..ntail[i]-1].
 *
 * Why: attend() reads the cached K/V rows once per token; a layer's K/V (150 KB per KV head at
 * 300 tokens) is evicted by the weights streamed between layers, so each token of a tree read it
 * from memory again: a 2-token verify cost ~1.2x one token, mostly in attention. Here the cached
 * rows are read once for every token of the item. Measured in one process, interleaved (135M
 * model, fast, 2 threads): with 1200 cached tokens a 2-node verify 11.3 -> 8.3 ms, 4 nodes
 * 14.9 -> 10.9, 8 nodes 21.9 -> 17.1 (one token: 8.5); with 300 cached, 3-6% less.
 *
 * Exactness: each row runs attend()'s arithmetic on its own key list, key for key: a score is the
 * same 8-lane FMA chain and hsum order in a block or alone (hsum and hsum8x8 agree), the softmax
 * is softmax_numerators() over the row's list, and each output is one FMA chain over the keys in
 * list order (cached slots, then the tail) whatever the blocking, so a row's bits do not change.
 * hd: a multiple of 64. scores: R * (L + max tail) floats (row stride sstride); acc: R * hd.
 */
INLINE AVX2 void attend_tokens(int R, int G, const float *const *q, const void *kh, const void *vh, long L,
                              const int *const *tail, const long *ntail, int hd, float scale, float *scores,
                              long sstride, float *acc, float *const *out, const int kv16) {
    const __m256 sc = _mm256_set1_ps(scale);
    /* kv16: each block of cached keys / values widened once into these for all R rows (widening
     * per row doubled the instructions of a compute-bound loop: a 16-node tree at 1,200 cached
     * tokens cost 8% more than with the fp32 cache). The same values, so the same bits. */
    float kb[8 * SHARED_MAX_HD] __attribute__((aligned(32)));
    float vb[VBLOCK * 64] __attribute__((aligned(32)));
    long a0 = 0;
    for (; a0 + 8 <= L; a0 += 8) { /* the cached keys, 8 at a time, for every row */
        const float *kf = kv16 ? kb : (const float *)kh + a0 * hd;
        if (kv16)
            for (long e = 0; e < 8 * hd; e += 8) _mm256_store_ps(kb + e, kv8(kh, a0 * hd + e, 1));
        for (int r = 0; r < R; r++) {
            __m256 d[8];
            for (int i = 0; i < 8; i++) d[i] = _mm256_setzero_ps();
            for (int c = 0; c < hd; c += 8) {
                const __m256 qc = _mm256_loadu_ps(q[r] + c);
                for (int i = 0; i < 8; i++) d[i] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kf + i * hd + c), d[i]);
            }
            _mm256_storeu_ps(scores + r * sstride + a0, _mm256_mul_ps(hsum8x8(d), sc));
        }
    }
    for (int r = 0; r < R; r++) {
        float *sr = scores + r * sstride;
        for (long a = a0; a < L; a++) sr[a] = dot_kv(q[r], kh, a * hd, hd, kv16) * scale;
        for (long j = 0; j < ntail[r / G]; j++)
            sr[L + j] = dot_kv(q[r], kh, (long)tail[r / G][j] * hd, hd, kv16) * scale;
    }
    float inv[SHARED_TOKENS * MAX_GROUP];
    for (int r = 0; r < R; r++) inv[r] = softmax_numerators(scores + r * sstride, L + ntail[r / G]);
    for (int c0 = 0; c0 < hd; c0 += 64) {
        for (long b0 = 0; b0 < L; b0 += VBLOCK) { /* the cached values, a block at a time, for every row */
            const long b1 = b0 + VBLOCK < L ? b0 + VBLOCK : L;
            /* row a of the block at vf + (a - b0) * vs */
            const float *vf = kv16 ? vb : (const float *)vh + b0 * hd + c0;
            const long vs = kv16 ? 64 : hd;
            if (kv16)
                for (long a = b0; a < b1; a++)
                    for (int c = 0; c < 64; c += 8) _mm256_store_ps(vb + (a - b0) * 64 + c, kv8(vh, a * hd + c0 + c, 1));
            for (int r = 0; r < R; r++) {
                const float *sr = scores + r * sstride;
                float *ar = acc + (long)r * hd + c0;
                __m256 v8[8];
                for (int c = 0; c < 8; c++) v8[c] = b0 ? _mm256_loadu_ps(ar + 8 * c) : _mm256_setzero_ps();
                for (long a = b0; a < b1; a++) {
                    const __m256 p = _mm256_set1_ps(sr[a]);
                    const float *vr = vf + (a - b0) * vs;
                    for (int c = 0; c < 8; c++) v8[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * c), v8[c]);
                }
                for (int c = 0; c < 8; c++) _mm256_storeu_ps(ar + 8 * c, v8[c]);
            }
        }
        for (int r = 0; r < R; r++) { /* each row's own tree keys continue its chains */
            const float *sr = scores + r * sstride;
            const float *ar = acc + (long)r * hd + c0;
            __m256 v8[8];
            for (int c = 0; c < 8; c++) v8[c] = L ? _mm256_loadu_ps(ar + 8 * c) : _mm256_setzero_ps();
            for (long j = 0; j < ntail[r / G]; j++) {
                const __m256 p = _mm256_set1_ps(sr[L + j]);
                const long vr = (long)tail[r / G][j] * hd + c0;
                for (int c = 0; c < 8; c++) v8[c] = _mm256_fmadd_ps(p, kv8(vh, vr + 8 * c, kv16), v8[c]);
            }
            const __m256 iv = _mm256_set1_ps(inv[r]);
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(out[r] + c0 + 8 * c, _mm256_mul_ps(v8[c], iv));
        }
    }
}

/* tree_attention() for T >= 2 without a window: work items are (KV head, a run of tokens), so the
 * cached K/V of a KV head is read once per run instead of once per token (attend_tokens). Runs
 * are split so that every thread has items: with 3 KV heads on 2 threads, two runs per head. */
static AVX2 void tree_attention_shared(const float *q, long q_stride, const void *k, const void *v, long cap,
                                       long L, long T, int nh, int nkv, int hd, const unsigned char *tree,
                                       float scale, float *out, int nthreads, int kv16) {
    const int group = nh / nkv;
    /* enough items that the threads share them evenly: 3 KV heads on 2 threads as whole items
     * left one thread idle a third of the time, so the tokens are split into runs as well */
    long runs = 1;
    while (runs < T && (nkv * runs) % nthreads != 0 && nkv * runs < 4L * nthreads) runs++;
    while ((T + runs - 1) / runs > SHARED_TOKENS) runs++;
    const long per = (T + runs - 1) / runs;
#pragma omp parallel num_threads(nthreads)
    {
        const long R = per * group;
        float *scores = malloc(sizeof(float) * (size_t)(R * (L + T)));
        float *acc = malloc(sizeof(float) * (size_t)(R * hd));
        int *tails = malloc(sizeof(int) * (size_t)(per * T));
#pragma omp for schedule(static)
        for (long item = 0; item < nkv * runs; item++) {
            const int g = (int)(item / runs);
            const long t0 = item % runs * per, t1 = t0 + per < T ? t0 + per : T;
            const float *qrow[SHARED_TOKENS * MAX_GROUP];
            float *orow[SHARED_TOKENS * MAX_GROUP];
            const int *tail[SHARED_TOKENS];
            long ntail[SHARED_TOKENS];
            for (long t = t0; t < t1; t++) {
                int *tt = tails + (t - t0) * T;
                long n = 0;
                for (long i = 0; i < (tree ? T : t + 1); i++)
                    if (!tree || tree[t * T + i]) tt[n++] = (int)(L + i);
                tail[t - t0] = tt;
                ntail[t - t0] = n;
                for (int j = 0; j < group; j++) {
                    const long h = (long)g * group + j, r = (t - t0) * group + j;
                    qrow[r] = q + t * q_stride + h * hd;
                    orow[r] = out + t * (long)nh * hd + h * hd;
                }
            }
            const char *kg = kv_head(k, g, cap, hd, kv16), *vg = kv_head(v, g, cap, hd, kv16);
            const int R = (int)((t1 - t0) * group);
            if (kv16)
                attend_tokens(R, group, qrow, kg, vg, L, tail, ntail, hd, scale, scores, L + T, acc, orow, 1);
            else
                attend_tokens(R, group, qrow, kg, vg, L, tail, ntail, hd, scale, scores, L + T, acc, orow, 0);
        }
        free(scores);
        free(acc);
        free(tails);
    }
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
            const long t = item / (nkv * parts);
            const int g = (int)(item / parts % nkv), h = g * group + (int)(item % parts) * sg;
            const int rows = h + sg <= (g + 1) * group ? sg : (g + 1) * group - h;
            const long pq = positions ? positions[t] : L + t;
            long n = 0;
            for (long j = 0; j < L; j++)
                if (window <= 0 || pq - j < window) keys[n++] = (int)j;
            for (long i = 0; i < (tree ? T : t + 1); i++) {
                const int visible = tree ? tree[t * T + i] : 1;
                const long pk = positions ? positions[i] : L + i;
                if (visible && (window <= 0 || pq - pk < window)) keys[n++] = (int)(L + i);
            }
            attend_any(rows, q + t * q_stride + (long)h * hd, kv_head(k, g, cap, hd, kv16),
                       kv_head(v, g, cap, hd, kv16), keys, n, hd, scale, scores, acc,
                       out + t * (long)nh * hd + (long)h * hd, kv16);
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
            const long t = item / (nkv * parts);
            const int g = (int)(item / parts % nkv), h = g * group + (int)(item % parts) * sg;
            const int rows = h + sg <= (g + 1) * group ? sg : (g + 1) * group - h;
            long n = 0;
            for (long j = first[t]; j <= last[t]; j++)
                if (window <= 0 || positions[t] - (j - first[t]) < window) keys[n++] = (int)j;
            for (long i = 0; extra && i < nextra[t]; i++) keys[n++] = extra[t * max_extra + i];
            attend_any(rows, q + t * q_stride + (long)h * hd, kv_head(k, g, cap, hd, kv16),
                       kv_head(v, g, cap, hd, kv16), keys, n, hd, scale, scores, acc,
                       out + t * (long)nh * hd + (long)h * hd, kv16);
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

/*
 * The index of each row's largest value: [rows, n] -> out[rows], the first index where the
 * maximum occurs, and the first NaN where a row has one (torch.argmax's answer in both cases).
 *
 * Why: greedy verification takes the argmax of every verified row over the whole vocabulary
 * (49,152 floats on the embedded model), and torch's CPU argmax reads ~1 float per ns there:
 * ~45 us a row, ~1% of a plain step; eight lanes at a time it is a few microseconds.
 */
static AVX2 long argmax_row(const float *x, long n) {
    long i = 0, best_i = 0;
    float best = x[0];
    if (n >= 8) {
        __m256 vmax = _mm256_loadu_ps(x), nan = _mm256_cmp_ps(vmax, vmax, _CMP_UNORD_Q);
        __m256i vidx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), cur = vidx;
        const __m256i eight = _mm256_set1_epi32(8);
        for (i = 8; i + 8 <= n; i += 8) {
            cur = _mm256_add_epi32(cur, eight);
            const __m256 v = _mm256_loadu_ps(x + i);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            const __m256 gt = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ); /* strictly greater: a lane keeps its first */
            vmax = _mm256_blendv_ps(vmax, v, gt);
            vidx = _mm256_blendv_epi8(vidx, cur, _mm256_castps_si256(gt));
        }
        if (_mm256_movemask_ps(nan)) { /* rare: the first NaN, as torch answers */
            for (long j = 0; j < n; j++)
                if (x[j] != x[j]) return j;
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
        if (x[i] != x[i]) return i;
        if (x[i] > best) best = x[i], best_i = i;
    }
    return best_i;
}

void argmax_rows(const float *x, long rows, long n, long *out) {
    for (long r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
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
