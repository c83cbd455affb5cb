/*
 * What attention.c (the per-token paths) and attention_shared.c (a tree's tokens on shared key
 * blocks) both use: the cache loads, one row's dot product and softmax, the limits of a work item.
 * Static inline, so each file gets its own copy with the same arithmetic (vec.h says why that
 * keeps every path's bits equal).
 */
#ifndef SPECCHAT_ATTENTION_H
#define SPECCHAT_ATTENTION_H

#include <immintrin.h>
#include <math.h>

#include "vec.h"

/*
 * Eight cached K/V values from element i of a cache that holds fp32, or fp16 (kv16: the fast
 * precision's cache, half the bytes; F16C widens each value exactly, so the arithmetic after the
 * load is the fp32 cache's on the rounded values). The attention in both files is written once and
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
 * the running lane sums s8, then the last n - a < 8 added to the sum one at a time; returns 1 /
 * the whole sum. The last ones' exponentials come from one exp8() (each lane's is the one-lane
 * call's: exp8 works lane by lane): one call per element was half a causal prefill's exponentials
 * (rows of ~70 keys). */
static inline AVX2 float softmax_rest(float *sr, long a, long n, float mx, __m256 s8) {
    const __m256 m8 = _mm256_set1_ps(mx);
    for (; a + 8 <= n; a += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + a), m8));
        _mm256_storeu_ps(sr + a, e);
        s8 = _mm256_add_ps(s8, e);
    }
    float sum = hsum(s8);
    if (a < n) {
        float lane[8] = {0};
        float e[8];
        for (long j = a; j < n; j++) lane[j - a] = sr[j] - mx;
        _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(lane)));
        for (long j = a; j < n; j++) {
            sr[j] = e[j - a];
            sum += e[j - a];
        }
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

/* Tokens of a tree that one work item of tree_attention's shared path takes at most. */
#define SHARED_TOKENS 16
#define SHARED_MAX_HD 256 /* head dims the shared path takes (multiples of 64 up to this) */

/* attention_shared.c: tree_attention() for T >= 2 without a window (it says how), hd a multiple of
 * 64 up to SHARED_MAX_HD, at most MAX_GROUP query heads a KV head. */
AVX2 void tree_attention_shared(const float *q, long q_stride, const void *k, const void *v, long cap, long L, long T,
                                int nh, int nkv, int hd, const unsigned char *tree, float scale, float *out,
                                int nthreads, int kv16);

#endif
