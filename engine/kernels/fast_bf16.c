/*
 * The fast precision's product on bf16 weights (a hub checkpoint kept as stored): activations
 * rounded to bf16, then vdpbf16ps (AVX512_BF16), which multiplies 32 bf16 pairs into 16 fp32 sums
 * per instruction where an fp32 FMA does 16 products; the weights are read as stored, no widening.
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W in stored.c's bf16 panels ([N/16][K][16], 2 bytes).
 *
 * Why: a tree's verify on a CPU is bound by multiply-adds once it has more than a few rows, and
 * the exact kernel widens every bf16 weight to fp32 and runs 16-lane FMAs; here the same bytes go
 * straight into twice as many products per instruction. Where the CPU lacks AVX512_BF16 the fast
 * precision keeps the exact kernel for bf16 weights (fast.c returns -1 and its caller falls back).
 *
 * The arithmetic, which engine/kernels/fast.py (fast_bf16_reference) recomputes in torch:
 *   xb = x rounded to bf16, to nearest even (torch's float -> bfloat16; NaN to the quiet NaN);
 *   per output (r, n), over the pairs of k in order from zero, from acc = 0:
 *     acc = acc + xb[r,2j+1] * w[n,2j+1]     (the product of two bf16 values is exact in fp32)
 *     acc = acc + xb[r,2j] * w[n,2j]         (each sum rounded once: vdpbf16ps's odd-then-even)
 *   then y = acc (+ bias) (+ y when accumulating), as stored.c does.
 * vdpbf16ps treats bf16 denormals as zero and flushes denormal results; the reference does the
 * former, and on values of any realistic magnitude (activations and weights are never within
 * 2^-120 of zero) the two agree bit for bit (tests/test_fast_bf16.py).
 *
 * Batch invariance: every row is rounded on its own and each output is one chain over k in a
 * fixed order, whatever the number of rows in the call, so a row's result is the same in a
 * one-token step, a tree or a prefill: the property that keeps speculation lossless.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fast.h"

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10) || (defined(__clang__) && __clang_major__ >= 9)
#define BF16T __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define BF16_ROWS 16

static int bf16_on = -1; /* -1: not chosen yet */

/* AVX512_BF16 from CPUID (leaf 7, subleaf 1, EAX bit 5), as fast_avx2.c reads AVX-VNNI: the
 * compilers' names for __builtin_cpu_supports differ; the registers' OS support comes with avx512f. */
static int bf16_cpu(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
}

/* On (where the CPU has AVX512_BF16) unless `off`: fast.c's fast_variant() turns it off when an
 * AVX2-class CPU is asked for (SPECCHAT_KERNEL_VARIANT=avx2 / avxvnni). Returns whether it runs. */
int fast_bf16_choose(int off) {
    bf16_on = !off && bf16_cpu();
    return bf16_on;
}

/* Whether bf16 weights take these products in the fast precision (what the bench title reports). */
int fast_bf16_enabled(void) {
    if (bf16_on < 0) fast_bf16_choose(0);
    return bf16_on;
}

/* 16 activations to bf16 by round to nearest even on their bits (as torch rounds). */
static inline __attribute__((always_inline)) BF16T __m256i round16(const float *x) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i up = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    const __m512i r = _mm512_mask_mov_epi32(_mm512_srli_epi32(up, 16), nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

static BF16T void round_row(const float *x, long K, uint16_t *xb) {
    long k = 0;
    for (; k + 16 <= K; k += 16) _mm256_storeu_si256((__m256i *)(xb + k), round16(x + k));
    if (k < K) { /* the tail through a padded copy: the same rounding */
        float pad[16] = {0};
        uint16_t out[16];
        memcpy(pad, x + k, sizeof(float) * (size_t)(K - k));
        _mm256_storeu_si256((__m256i *)out, round16(pad));
        memcpy(xb + k, out, sizeof(uint16_t) * (size_t)(K - k));
    }
}

/* MR rows by one panel: for each pair of k, the panel's two k rows (16 columns each, 64
 * contiguous bytes) interleaved into column pairs by one vpermw, then one vdpbf16ps per row.
 * (Two panels a tile, so that a one-row call had two independent chains, measured the same: at
 * one row the product waits on memory, not on the chain.) */
static inline __attribute__((always_inline)) BF16T void
tile(const int MR, const uint32_t *xp, long K, const uint16_t *codes, float *out) {
    /* word 2i of the result = column i of the even k (word i), word 2i + 1 = of the odd k (16 + i) */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const long K2 = K / 2;
    __m512 acc[BF16_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (long j = 0; j < K2; j++) {
        const char *src = (const char *)codes + j * 64;
        _mm_prefetch(src + PF_PANELS * K * PANEL * 2, _MM_HINT_T0); /* a later panel's pair, as fast.c does */
        const __m512bh w = (__m512bh)_mm512_permutexvar_epi16(pairs, _mm512_loadu_si512(src));
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++)
            acc[r] = _mm512_dpbf16_ps(acc[r], w, (__m512bh)_mm512_set1_epi32((int)xp[r * K2 + j]));
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * PANEL, acc[r]);
}

typedef void (*bf16_tile_fn)(const uint32_t *, long, const uint16_t *, float *);
#define BTILE(n) \
    static BF16T void bt_##n(const uint32_t *x, long K, const uint16_t *c, float *o) { tile(n, x, K, c, o); }
BTILE(1) BTILE(2) BTILE(3) BTILE(4) BTILE(5) BTILE(6) BTILE(7) BTILE(8) BTILE(9) BTILE(10) BTILE(11) BTILE(12)
BTILE(13) BTILE(14) BTILE(15) BTILE(16)
static const bf16_tile_fn TILES[BF16_ROWS + 1] = {0, bt_1, bt_2, bt_3, bt_4, bt_5, bt_6, bt_7, bt_8, bt_9, bt_10,
                                                  bt_11, bt_12, bt_13, bt_14, bt_15, bt_16};

/* Arguments as stored_linear's for a bf16 weight. Returns 0, -1 when this CPU (or the variant
 * chosen) has no bf16 products or K is odd (the caller runs the exact kernel), -2 out of memory. */
int fast_bf16_linear(const float *x, long M, long K, const void *codes, long N, const float *bias, float *y,
                     long ldy, int accumulate, int nthreads) {
    if (bf16_on < 0) fast_bf16_choose(0);
    if (!bf16_on || K % 2) return -1;
    if (M <= 0 || N <= 0) return 0;
    uint16_t *xb = aligned_alloc(64, (size_t)((M * K * 2 + 63) / 64 * 64));
    if (!xb) return -2;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1)
    for (long r = 0; r < M; r++) round_row(x + r * K, K, xb + r * K);
    const long npanels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long p = 0; p < npanels; p++) {
        float out[BF16_ROWS * PANEL] __attribute__((aligned(64)));
        const long col0 = p * PANEL;
        const int ncols = (int)(N - col0 < PANEL ? N - col0 : PANEL);
        for (long m0 = 0; m0 < M; m0 += BF16_ROWS) {
            const int mr = (int)(M - m0 < BF16_ROWS ? M - m0 : BF16_ROWS);
            TILES[mr]((const uint32_t *)(xb + m0 * K), K, (const uint16_t *)codes + p * K * PANEL, out);
            put_tile(out, mr, ncols, bias ? bias + col0 : NULL, y + m0 * ldy + col0, ldy, accumulate);
        }
    }
    free(xb);
    return 0;
}

#else /* a compiler without the AVX512_BF16 intrinsics: the exact kernel everywhere */
int fast_bf16_choose(int off) {
    (void)off;
    return 0;
}
int fast_bf16_enabled(void) { return 0; }
int fast_bf16_linear(const float *x, long M, long K, const void *codes, long N, const float *bias, float *y,
                     long ldy, int accumulate, int nthreads) {
    (void)x, (void)M, (void)K, (void)codes, (void)N, (void)bias, (void)y, (void)ldy, (void)accumulate, (void)nthreads;
    return -1;
}
#endif
