/*
 * Attention of a draft tree's tokens (or a prefill chunk's) over the KV cache on shared key blocks:
 * the cached keys and values of a KV head are read once for all the tokens of a work item, and on
 * AVX-512 CPUs 16 lanes an instruction. Each row still runs the per-token path's arithmetic key for
 * key (attention.c says why that keeps a tree node's bits those of plain decoding); the functions
 * below say how each wide loop keeps the 8-lane chains.
 */
#include <immintrin.h>
#include <stdlib.h>

#include "attention.h"

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
 * tokens 0.72x, 1,024 tokens 0.61x; docs/history/benchmarks-sessions.md, "Session 35").
 *
 * Schedules: trees and chains of up to SHARED_TOKENS go KV head by KV head, statically, as before,
 * so a thread's second run of a head finds that head's K/V in its own cache (handing their runs out
 * as threads free up timed a 4-token chain 1-2% slower, near the noise). Longer causal calls
 * (prefill chunks) have runs of unequal work, the later ones sharing more keys, so threads take
 * them as they free up, longest first.
 */
AVX2 void tree_attention_shared(const float *q, long q_stride, const void *k, const void *v, long cap,
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
