/*
 * Attention of a few new tokens (one, a draft tree, or the data engine's rows) over the KV cache.
 *
 * Exactness (see ops.c): each output row is computed on its own, over its keys in a fixed order
 * (the cached prefix, then its tree ancestors in index order, then itself), so a tree node gets the
 * bits plain decoding computes for it. Every code path below, the 16-lane ones included, runs the
 * same 8-lane FMA chains in the same order, so which path a row takes never changes a bit.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "vec.h"

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

/* Softmax numerators exp(s - mx) of a row's scores from element a on, in place, 8 at a time into
 * the running lane sums s8, then one at a time; returns 1 / the whole sum. */
static inline AVX2 float softmax_rest(float *sr, long a, long n, float mx, __m256 s8) {
    const __m256 m8 = _mm256_set1_ps(mx);
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

/* Softmax numerators of one row's n scores in place (exp(s - max)); returns 1 / their sum. */
static inline AVX2 float softmax_numerators(float *sr, long n) {
    return softmax_rest(sr, 0, n, max_of(sr, n), _mm256_setzero_ps());
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

/* Tokens of a tree that one work item of tree_attention's shared path takes at most. */
#define SHARED_TOKENS 16
#define SHARED_MAX_HD 256 /* head dims the shared path takes (multiples of 64 up to this) */

/* The 16-lane paths below run where the CPU has AVX-512F (attention_variant). */
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
static int wide = 0;

/* n fp16 cache values (a multiple of 16) widened to fp32, 16 an instruction: the values kv8()
 * gives (widening is exact). At two tree tokens the widening was a third of the attention's time. */
static AVX512 void widen16(float *dst, const unsigned short *src, long n) {
    for (long e = 0; e < n; e += 16)
        _mm512_storeu_ps(dst + e, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + e))));
}

/* exp8() on 16 lanes: the same body (vec.h's EXP_LANES), so every lane holds exp8()'s bits. */
INLINE AVX512 __m512 exp16(__m512 x) { return EXP_LANES(512, _mm512_roundscale_ps, x); }

/* softmax_numerators() with 16 exponentials an instruction: the 8-lane sum takes the low half then
 * the high half, the order the 8-lane loop adds them in, so the numerators and the sum keep its
 * bits (at 16 tree tokens the softmax was 15% of the attention's time). */
static AVX512 float softmax_numerators_wide(float *sr, long n) {
    const float mx = max_of(sr, n);
    const __m512 m16 = _mm512_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    long a = 0;
    for (; a + 16 <= n; a += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + a), m16));
        _mm512_storeu_ps(sr + a, e);
        s8 = _mm256_add_ps(s8, _mm512_castps512_ps256(e));
        s8 = _mm256_add_ps(s8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    return softmax_rest(sr, a, n, mx, s8);
}

/* 1 (AVX-512 paths) or 0 (8-lane paths only); force 2 keeps the 8-lane paths (the suite checks both
 * give the same bits). Called with the fast tiles' choice (native.choose_variant). */
int attention_variant(int force) {
    __builtin_cpu_init();
    wide = __builtin_cpu_supports("avx512f") && force != 2;
    return wide;
}

/*
 * Scores of rows r0..r1-1 (queries q[r]) against 8 consecutive keys (rows kf + i * hd), times
 * scale, to out[r * sstride + 0..7]: per row and key one 8-lane FMA chain over the head dim, then
 * hsum8x8 (the order dot_kv and attend() use).
 */
INLINE AVX2 void key_block(int r0, int r1, const float *const *q, const float *kf, int hd, float scale, float *out,
                           long sstride) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (int r = r0; r < r1; r++) {
        __m256 d[8];
        for (int i = 0; i < 8; i++) d[i] = _mm256_setzero_ps();
        for (int c = 0; c < hd; c += 8) {
            const __m256 qc = _mm256_loadu_ps(q[r] + c);
            for (int i = 0; i < 8; i++) d[i] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kf + i * hd + c), d[i]);
        }
        _mm256_storeu_ps(out + r * sstride, _mm256_mul_ps(hsum8x8(d), sc));
    }
}

/*
 * Rows r0..r1-1 of the value pass over n consecutive keys (value row a at vf + a * vs, 64 columns):
 * acc[r * hd + 0..63] += p[r * sstride + a] * v_a, key by key, one chain per column, starting from
 * acc (cont) or zero.
 */
INLINE AVX2 void value_block(int r0, int r1, const float *p, long sstride, const float *vf, long vs, long n, int cont,
                             float *acc, int hd) {
    for (int r = r0; r < r1; r++) {
        const float *sr = p + r * sstride;
        float *ar = acc + (long)r * hd;
        __m256 v8[8];
        for (int c = 0; c < 8; c++) v8[c] = cont ? _mm256_loadu_ps(ar + 8 * c) : _mm256_setzero_ps();
        for (long a = 0; a < n; a++) {
            const __m256 pa = _mm256_set1_ps(sr[a]);
            const float *vr = vf + a * vs;
            for (int c = 0; c < 8; c++) v8[c] = _mm256_fmadd_ps(pa, _mm256_loadu_ps(vr + 8 * c), v8[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(ar + 8 * c, v8[c]);
    }
}

/* Eight floats from a in lanes 0-7 and eight from b in lanes 8-15. */
INLINE AVX512 __m512 pair8(const float *a, const float *b) {
    const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

/* The eight floats at a in both halves. */
INLINE AVX512 __m512 twice8(const float *a) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(a))));
}

/*
 * key_block() for all R rows, two rows a register: lanes 0-7 carry row r's 8-lane chains and lanes
 * 8-15 row r + 1's, each lane the very FMA sequence key_block() runs, so the bits are its bits in
 * half the instructions (the 8-lane loop was at its FMA ports' limit: a 16-node verify spent 17% of
 * its time here).
 */
static AVX512 void key_block_wide(int R, const float *const *q, const float *kf, int hd, float scale, float *out,
                                  long sstride) {
    const __m256 sc = _mm256_set1_ps(scale);
    int r = 0;
    /* four rows (two registers) on each key load: the two-row loop spent as many loads as FMAs */
    for (; r + 4 <= R; r += 4) {
        __m512 d[8], e[8];
        for (int i = 0; i < 8; i++) d[i] = e[i] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 8) {
            const __m512 qa = pair8(q[r] + c, q[r + 1] + c), qb = pair8(q[r + 2] + c, q[r + 3] + c);
            for (int i = 0; i < 8; i++) {
                const __m512 kk = twice8(kf + i * hd + c);
                d[i] = _mm512_fmadd_ps(qa, kk, d[i]);
                e[i] = _mm512_fmadd_ps(qb, kk, e[i]);
            }
        }
        for (int half = 0; half < 2; half++) {
            const __m512 *v = half ? e : d;
            __m256 lo[8], hi[8];
            for (int i = 0; i < 8; i++) {
                lo[i] = _mm512_castps512_ps256(v[i]);
                hi[i] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[i]), 1));
            }
            _mm256_storeu_ps(out + (r + 2 * half) * sstride, _mm256_mul_ps(hsum8x8(lo), sc));
            _mm256_storeu_ps(out + (r + 2 * half + 1) * sstride, _mm256_mul_ps(hsum8x8(hi), sc));
        }
    }
    for (; r + 2 <= R; r += 2) {
        __m512 d[8];
        for (int i = 0; i < 8; i++) d[i] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 8) {
            const __m512 qc = pair8(q[r] + c, q[r + 1] + c);
            for (int i = 0; i < 8; i++) d[i] = _mm512_fmadd_ps(qc, twice8(kf + i * hd + c), d[i]);
        }
        __m256 lo[8], hi[8];
        for (int i = 0; i < 8; i++) {
            lo[i] = _mm512_castps512_ps256(d[i]);
            hi[i] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d[i]), 1));
        }
        _mm256_storeu_ps(out + r * sstride, _mm256_mul_ps(hsum8x8(lo), sc));
        _mm256_storeu_ps(out + (r + 1) * sstride, _mm256_mul_ps(hsum8x8(hi), sc));
    }
    if (r < R) { /* a last odd row: two keys a register (lanes 0-7 key i, 8-15 key i + 1), the same chains */
        __m512 d[4];
        for (int i = 0; i < 4; i++) d[i] = _mm512_setzero_ps();
        for (int c = 0; c < hd; c += 8) {
            const __m512 qc = twice8(q[r] + c);
            for (int i = 0; i < 4; i++)
                d[i] = _mm512_fmadd_ps(qc, pair8(kf + 2 * i * hd + c, kf + (2 * i + 1) * hd + c), d[i]);
        }
        __m256 keys[8];
        for (int i = 0; i < 4; i++) {
            keys[2 * i] = _mm512_castps512_ps256(d[i]);
            keys[2 * i + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d[i]), 1));
        }
        _mm256_storeu_ps(out + r * sstride, _mm256_mul_ps(hsum8x8(keys), sc));
    }
}

/* value_block() for `rows` rows (1, 2 or 4: a constant where inlined) at once, 16 columns a
 * register: each value row is loaded once for all of them, and each column's chain is
 * value_block()'s, key for key, so the bits are its bits. */
static inline __attribute__((always_inline)) AVX512 void
value_rows16(const int rows, const float *p, long sstride, const float *vf, long vs, long n, int cont, float *acc,
             int hd) {
    __m512 u[4][4];
    for (int j = 0; j < rows; j++)
        for (int c = 0; c < 4; c++) u[j][c] = cont ? _mm512_loadu_ps(acc + (long)j * hd + 16 * c) : _mm512_setzero_ps();
    for (long a = 0; a < n; a++) {
        const float *vr = vf + a * vs;
        const __m512 va[4] = {_mm512_loadu_ps(vr), _mm512_loadu_ps(vr + 16), _mm512_loadu_ps(vr + 32),
                              _mm512_loadu_ps(vr + 48)};
        for (int j = 0; j < rows; j++) {
            const __m512 pj = _mm512_set1_ps(p[j * sstride + a]);
            for (int c = 0; c < 4; c++) u[j][c] = _mm512_fmadd_ps(pj, va[c], u[j][c]);
        }
    }
    for (int j = 0; j < rows; j++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + (long)j * hd + 16 * c, u[j][c]);
}

/*
 * value_block() for all R rows: four rows on each value row's loads (16 chains; two rows a load
 * were bounded by the loads), then two, then one.
 */
static AVX512 void value_block_wide(int R, const float *p, long sstride, const float *vf, long vs, long n, int cont,
                                    float *acc, int hd) {
    int r = 0;
    for (; r + 4 <= R; r += 4) value_rows16(4, p + r * sstride, sstride, vf, vs, n, cont, acc + (long)r * hd, hd);
    for (; r + 2 <= R; r += 2) value_rows16(2, p + r * sstride, sstride, vf, vs, n, cont, acc + (long)r * hd, hd);
    if (r < R) value_rows16(1, p + r * sstride, sstride, vf, vs, n, cont, acc + (long)r * hd, hd);
}

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
    /* kv16: each block of cached keys / values widened once into these for all R rows (widening
     * per row doubled the instructions of a compute-bound loop: a 16-node tree at 1,200 cached
     * tokens cost 8% more than with the fp32 cache). The same values, so the same bits. */
    float kb[8 * SHARED_MAX_HD] __attribute__((aligned(32)));
    float vb[VBLOCK * 64] __attribute__((aligned(32)));
    long a0 = 0;
    for (; a0 + 8 <= L; a0 += 8) { /* the cached keys, 8 at a time, for every row */
        const float *kf = kv16 ? kb : (const float *)kh + a0 * hd;
        if (kv16 && wide)
            widen16(kb, (const unsigned short *)kh + a0 * hd, 8 * hd);
        else if (kv16)
            for (long e = 0; e < 8 * hd; e += 8) _mm256_store_ps(kb + e, kv8(kh, a0 * hd + e, 1));
        if (wide)
            key_block_wide(R, q, kf, hd, scale, scores + a0, sstride);
        else
            key_block(0, R, q, kf, hd, scale, scores + a0, sstride);
    }
    for (int r = 0; r < R; r++) {
        float *sr = scores + r * sstride;
        for (long a = a0; a < L; a++) sr[a] = dot_kv(q[r], kh, a * hd, hd, kv16) * scale;
        for (long j = 0; j < ntail[r / G]; j++)
            sr[L + j] = dot_kv(q[r], kh, (long)tail[r / G][j] * hd, hd, kv16) * scale;
    }
    float inv[SHARED_TOKENS * MAX_GROUP];
    for (int r = 0; r < R; r++)
        inv[r] = wide ? softmax_numerators_wide(scores + r * sstride, L + ntail[r / G])
                      : softmax_numerators(scores + r * sstride, L + ntail[r / G]);
    for (int c0 = 0; c0 < hd; c0 += 64) {
        for (long b0 = 0; b0 < L; b0 += VBLOCK) { /* the cached values, a block at a time, for every row */
            const long b1 = b0 + VBLOCK < L ? b0 + VBLOCK : L;
            /* row a of the block at vf + (a - b0) * vs */
            const float *vf = kv16 ? vb : (const float *)vh + b0 * hd + c0;
            const long vs = kv16 ? 64 : hd;
            if (kv16 && wide)
                for (long a = b0; a < b1; a++)
                    widen16(vb + (a - b0) * 64, (const unsigned short *)vh + a * hd + c0, 64);
            else if (kv16)
                for (long a = b0; a < b1; a++)
                    for (int c = 0; c < 64; c += 8)
                        _mm256_store_ps(vb + (a - b0) * 64 + c, kv8(vh, a * hd + c0 + c, 1));
            if (wide)
                value_block_wide(R, scores + b0, sstride, vf, vs, b1 - b0, b0 > 0, acc + c0, hd);
            else
                value_block(0, R, scores + b0, sstride, vf, vs, b1 - b0, b0 > 0, acc + c0, hd);
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

/* Scratch one thread of tree_attention_shared() keeps across its items. */
typedef struct {
    float *scores, *acc;
    int *tails;
} shared_scratch;

/*
 * One item of tree_attention_shared(): KV head g for tokens t0..t1-1 (t0 < t1 <= T). Each row
 * sees `shared` slots first (the cached ones, and for a causal call the new tokens before t0
 * too), then its own list: its tree keys, or the run's tokens up to itself.
 */
INLINE AVX2 void shared_item(const float *q, long q_stride, const void *k, const void *v, long cap, long L, long T,
                             int nh, int nkv, int hd, const unsigned char *tree, float scale, float *out, int kv16,
                             int g, long t0, long t1, shared_scratch w) {
    const int group = nh / nkv;
    const long shared = tree ? L : L + t0;
    const float *qrow[SHARED_TOKENS * MAX_GROUP];
    float *orow[SHARED_TOKENS * MAX_GROUP];
    const int *tail[SHARED_TOKENS];
    long ntail[SHARED_TOKENS];
    for (long t = t0; t < t1; t++) {
        int *tt = w.tails + (t - t0) * T;
        long n = 0;
        for (long i = shared - L; i < (tree ? T : t + 1); i++)
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
        attend_tokens(R, group, qrow, kg, vg, shared, tail, ntail, hd, scale, w.scores, L + T, w.acc, orow, 1);
    else
        attend_tokens(R, group, qrow, kg, vg, shared, tail, ntail, hd, scale, w.scores, L + T, w.acc, orow, 0);
}

/*
 * tree_attention() for T >= 2 without a window: work items are (KV head, a run of tokens), so the
 * cached K/V of a KV head is read once per run instead of once per token (attend_tokens). Runs
 * are split so that every thread has items: with 3 KV heads on 2 threads, two runs per head.
 *
 * Causal (no tree): the new tokens before a run are keys of every row in it, so they join the
 * cached slots as the run's shared keys, and a row's own list is only the run's tokens up to
 * itself. Same keys in the same order (slots L..L+t0-1 come right after the cached ones either
 * way), so the same bits; but a prefill from an empty cache had every key in its rows' own lists,
 * one key and one row at a time: a fifth of a 115-token prefill's samples (now 0.94x the time; 512
 * tokens 0.72x, 1,024 tokens 0.61x; docs/BENCHMARKS.md, "Session 35").
 *
 * Schedules: trees and chains of up to SHARED_TOKENS go KV head by KV head, statically, as before,
 * so a thread's second run of a head finds that head's K/V in its own cache (handing their runs out
 * as threads free up timed a 4-token chain 1-2% slower, near the noise). Longer causal calls
 * (prefill chunks) have runs of unequal work, the later ones sharing more keys, so threads take
 * them as they free up, longest first.
 */
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
    const int longest_first = !tree && T > SHARED_TOKENS;
#pragma omp parallel num_threads(nthreads)
    {
        const long R = per * group;
        shared_scratch w = {malloc(sizeof(float) * (size_t)(R * (L + T))), malloc(sizeof(float) * (size_t)(R * hd)),
                            malloc(sizeof(int) * (size_t)(per * T))};
        if (longest_first) {
#pragma omp for schedule(dynamic, 1)
            for (long item = 0; item < nkv * runs; item++) {
                const long t0 = (runs - 1 - item / nkv) * per;
                if (t0 < T)
                    shared_item(q, q_stride, k, v, cap, L, T, nh, nkv, hd, tree, scale, out, kv16, (int)(item % nkv),
                                t0, t0 + per < T ? t0 + per : T, w);
            }
        } else {
#pragma omp for schedule(static)
            for (long item = 0; item < nkv * runs; item++) {
                const long t0 = item % runs * per; /* past T: more runs than tokens (many threads) */
                if (t0 < T)
                    shared_item(q, q_stride, k, v, cap, L, T, nh, nkv, hd, tree, scale, out, kv16, (int)(item / runs),
                                t0, t0 + per < T ? t0 + per : T, w);
            }
        }
        free(w.scores);
        free(w.acc);
        free(w.tails);
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

