/*
 * The "fast" precision's matrix product on stored quant weights: activations quantized to 8 bits
 * per block, integer dot products with the weights' own codes (AVX-512 VNNI here; AVX2 in
 * fast_avx2.c, AMX in fast_amx.c: the same bits), one float scaling per block.
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias).
 *
 * Why: on a CPU a forward of many rows (a draft tree, a prefill chunk, the data engine's batch)
 * is bound by multiply-adds, and vpdpbusd does 64 of them per instruction where an fp32 FMA does
 * 16; the 4-bit codes need no conversion to float at all.
 *
 * The arithmetic, which tests/test_fast_kernel.py recomputes in torch bit for bit:
 *   per row r and block b of `group` k (the weight's scale group):
 *     d[r,b] = max|x| / 127 (fp32 division), xq = rint(x / d) (ties to even; 0 when d = 0),
 *     sx[r,b] = sum of xq over the block;
 *   per output (r, n), over blocks in order from zero:
 *     isum = sum_k code[n,k] * xq[r,k]             (exact, int32)
 *     acc  = acc + (float)isum * (scale[n,b] * d[r,b])
 *     acc  = acc + offset[n,b] * (d[r,b] * (float)sx[r,b])   (kinds with an offset)
 *   then y = acc (+ bias) (+ y when accumulating), as stored.c does.
 * Every row is quantized and reduced on its own, in an order that does not depend on how many
 * rows share the call, so a row's result is the same in a one-token step, a tree or a prefill:
 * the property that keeps speculation lossless against the fast baseline.
 *
 * Codes as stored.c keeps them: q4 (0..15) eight k per 32-bit word per column, so the even-k and
 * odd-k codes come out as bytes with one mask each, and the activations are stored in the same
 * even/odd order; q8 (signed) as 16 bytes per k, transposed in registers to four k per lane and
 * offset by 128 (vpdpbusd multiplies unsigned by signed bytes), which the block sum corrects; q6
 * (0..63, the q8 value + 32) as q4 words plus a word of high bits per 16 k (q6.h), read by the
 * VNNI tile() with q4's activation order and corrected by 32 times the block sum: the q8 form's
 * exact integers, so its bits. The other variants widen a q6 panel to q8 first (q6.h says why).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fast.h"
#include "q6.h"

#define FAST_ROWS 12
#define AVX2F __attribute__((target("avx2,fma")))

enum { KIND_BF16 = 2, KIND_Q8 = 3, KIND_Q4 = 4, KIND_Q6 = 5 };

static int has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi");
}

/* 512: the AVX-512 VNNI tiles; 256: the AVX-VNNI tiles, 2: the AVX2 ones (both fast_avx2.c); 0: none;
 * -1: not chosen */
static int variant = -1;
static int amx = 0;      /* 1: calls of AMX_MIN_ROWS rows or more take the AMX tile (fast_amx.c) */

int fast_amx_available(void); /* fast_amx.c */
int fast_avxvnni_available(void); /* fast_avx2.c */
int fast_bf16_choose(int off); /* fast_bf16.c */
int fast_bf16_linear(const float *x, long M, long K, const void *codes, long N, const float *bias, float *y,
                     long ldy, int accumulate, int nthreads);
void fast_amx_begin(void);
void fast_amx_end(void);
void fast_amx_tile(int mr, int q4, const int8_t *xq, long K, const float *xd, const float *xc, const void *codes,
                   const void *sc, const void *of, int hs, float *out);

/* Choose the tiles for this CPU: 513 (AVX-512 VNNI, AMX for several rows), 512 (AVX-512 VNNI), 256
 * (AVX-VNNI on 8 lanes), 2 (AVX2) or 0 (none). force 2: AVX2 even where a VNNI variant runs; force
 * 3: AVX-VNNI even where AVX-512 VNNI runs (where the CPU has it); force 1: AVX-512 VNNI without AMX
 * (SPECCHAT_KERNEL_VARIANT=avx2 / avxvnni / avx512, how the suite tests every variant on one machine). */
int fast_variant(int force) {
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (has_vnni() && force != 2 && force != 3)
        variant = 512;
    else if (fast_avxvnni_available() && force != 2) /* it checks AVX2 and FMA too */
        variant = 256;
    else
        variant = avx2 ? 2 : 0;
    amx = variant == 512 && force == 0 && fast_amx_available();
    fast_bf16_choose(force == 2 || force == 3); /* an AVX2-class CPU has no AVX512_BF16 */
    return variant + amx;
}

/* Nonzero when some variant runs here (the VNNI one unless fast_variant(2) chose AVX2). */
int fast_supported(void) {
    if (variant < 0) fast_variant(0);
    return variant != 0;
}

/* Quantize one row: K values in blocks of `group` (a multiple of 8). q4_order: store each 8 k as
 * the four even-k bytes then the four odd-k bytes (the order the q4 words' nibbles come out in). */
static AVX2F void quantize_row(const float *x, long K, long group, int q4_order, int8_t *xq, float *d, int32_t *s) {
    const __m128i evenodd = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long b = 0; b < K / group; b++) {
        const float *xb = x + b * group;
        __m256 mx = _mm256_setzero_ps();
        for (long i = 0; i < group; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float db = _mm_cvtss_f32(m4) / 127.0f;
        d[b] = db;
        int8_t *qb = xq + b * group;
        __m256i sum = _mm256_setzero_si256();
        const __m256 dv = _mm256_set1_ps(db);
        for (long i = 0; i < group; i += 16) {
            __m256i q0 = _mm256_setzero_si256(), q1 = _mm256_setzero_si256();
            if (db != 0.0f) {
                q0 = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(xb + i), dv));
                if (i + 8 < group) q1 = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(xb + i + 8), dv));
            }
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(q0, q1));
            /* 16 int32 in -127..127 to bytes in order (the packs cannot saturate) */
            const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
            __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
            if (q4_order) bytes = _mm_shuffle_epi8(bytes, evenodd);
            if (i + 8 < group)
                _mm_storeu_si128((__m128i *)(qb + i), bytes);
            else
                _mm_storel_epi64((__m128i *)(qb + i), bytes);
        }
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, sum);
        s[b] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
}

enum { FORM_Q8, FORM_Q4, FORM_Q6 }; /* how tile() reads a panel's codes */

/* The four byte registers of one q6 block (16 k; q6.h) paired with activation words 0..3 of the
 * block in q4's order: register j's low nibbles as q4's (j = 0, 1 from the first word, 2, 3 from
 * the second), its high two bits shifted from the high word to bits 4-5 of each byte (left 4, left
 * 2, none, right 2) and merged in with one vpternlogd (low | (high & 0x30): imm 0xF8). */
static inline __attribute__((always_inline)) VNNI void q6_block(const uint32_t *blk, __m512i *wv) {
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F), m30 = _mm512_set1_epi32(0x30303030);
    const __m512i w0 = _mm512_loadu_si512(blk), w1 = _mm512_loadu_si512(blk + PANEL);
    const __m512i h = _mm512_loadu_si512(blk + 2 * PANEL);
    wv[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(w0, m4), _mm512_slli_epi32(h, 4), m30, 0xF8);
    wv[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 4), m4), _mm512_slli_epi32(h, 2), m30,
                                      0xF8);
    wv[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(w1, m4), h, m30, 0xF8);
    wv[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 4), m4), _mm512_srli_epi32(h, 2), m30,
                                      0xF8);
}

/* One tile of MR rows by one 16-column panel (codes read as `form` says); results to out[MR][16]. */
static inline __attribute__((always_inline)) VNNI void
tile(const int MR, const int form, const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,
     const void *codes, const void *sc, const void *of, int hs, float *out) {
    const long ng = K / group;
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i tr = q8_transpose();
    __m512 acc[FAST_ROWS];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    __m512 fs = _mm512_setzero_ps(), fo = _mm512_setzero_ps(); /* the super-block's factor rows */
    for (long g = 0; g < ng; g++) {
        __m512i isum[FAST_ROWS];
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) isum[r] = _mm512_setzero_si512();
        if (form == FORM_Q4) {
            const uint32_t *cw = (const uint32_t *)codes + g * (group / 8) * PANEL;
            for (long w = 0; w < group / 8; w++) {
                const __m512i word = _mm512_loadu_si512(cw + w * PANEL);
                const __m512i lo = _mm512_and_si512(word, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(word, 4), m4);
                const long k = g * group + w * 8;
#pragma GCC unroll 12
                for (int r = 0; r < MR; r++) {
                    const int32_t *xr = (const int32_t *)(xq + r * K + k);
                    isum[r] = _mm512_dpbusd_epi32(isum[r], lo, _mm512_set1_epi32(xr[0]));
                    isum[r] = _mm512_dpbusd_epi32(isum[r], hi, _mm512_set1_epi32(xr[1]));
                }
            }
        } else if (form == FORM_Q6) {
            /* a later panel's codes and scales for this group, as tile_g32 does (which says why):
             * this tile is the one-token step's for Q6_K weights (a Q4_K_M file's LM head) */
            const char *ahead = (const char *)codes + PF_PANELS * q6_panel_bytes(K) + g * q6_panel_bytes(group);
            for (long l = 0; l < q6_panel_bytes(group); l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
            _mm_prefetch((const char *)sc + PF_PANELS * scales_panel_bytes(ng, hs) + scales_row_at(g, hs), _MM_HINT_T0);
            const uint32_t *cb = (const uint32_t *)codes + g * (group / Q6_BLOCK) * 3 * PANEL;
            for (long b = 0; b < group / Q6_BLOCK; b++) {
                __m512i wv[4];
                q6_block(cb + b * 3 * PANEL, wv);
                const long k = g * group + b * Q6_BLOCK;
#pragma GCC unroll 12
                for (int r = 0; r < MR; r++) {
                    const int32_t *xr = (const int32_t *)(xq + r * K + k);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) isum[r] = _mm512_dpbusd_epi32(isum[r], wv[j], _mm512_set1_epi32(xr[j]));
                }
            }
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++)
                isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(Q6_BIAS * xs[r * ng + g]));
        } else {
            const int8_t *cb = (const int8_t *)codes + g * group * PANEL;
            for (long w = 0; w < group / 4; w++) {
                const __m512i raw = _mm512_loadu_si512(cb + w * 4 * PANEL);
                const __m512i wt = _mm512_xor_si512(_mm512_permutexvar_epi8(tr, raw), flip);
                const long k = g * group + w * 4;
#pragma GCC unroll 12
                for (int r = 0; r < MR; r++)
                    isum[r] = _mm512_dpbusd_epi32(isum[r], wt, _mm512_set1_epi32(*(const int32_t *)(xq + r * K + k)));
            }
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(128 * xs[r * ng + g]));
        }
        const __m512 s = group_scales_next(sc, g, hs, &fs);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            const float dx = xd[r * ng + g];
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r]),
                                                         _mm512_mul_ps(s, _mm512_set1_ps(dx))));
        }
        if (of) {
            const __m512 o = group_scales_next(of, g, hs, &fo);
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) {
                const float c = xd[r * ng + g] * (float)xs[r * ng + g];
                acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(o, _mm512_set1_ps(c)));
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * PANEL, acc[r]);
}

/*
 * The tile for scale groups of 32 k (Q4_0, Q4_1, Q4_K, Q8_0, Q5_0 as 8-bit, and every head we
 * quantize): the group's codes are unpacked once into eight registers, then each row runs its
 * eight products as one chain into a single integer register and scales it at once.
 *
 * Why: tile() keeps an integer accumulator per row live across the group's words, and gcc then
 * copies all of them between registers on every word (three vector moves per product, measured
 * in its assembly); here a row needs one accumulator and one temporary, so 16 rows fit in the 32
 * registers and a 16-node tree is one tile. Same integers (exact sums), same float steps in the
 * same order as tile(): the same bits.
 *
 * A tile also prefetches the codes and scales PF_PANELS panels ahead while it computes, so the
 * products overlap the stream of weights from DRAM instead of following it. Measured in one
 * process, interleaved (135M model, fast, 2 threads, 300 cached tokens), one panel ahead and from
 * two rows up: a 16-node verify 17.9 -> 15.9 ms, 8 nodes 11.8 -> 10.7 ms (Zen 4, where one-token
 * steps gained nothing: its hardware prefetcher keeps up with one row). On the Intel Xeon of
 * session 24 it did not: one-token steps prefetching two panels ahead took the decoder layers
 * 3.6-3.8 -> 2.9-3.1 ms (old and new builds alternated, three rounds; two panels ahead against
 * one: the same at one row, 0.1-0.2 ms less at 2-4 rows), so every tile prefetches.
 */
#define G32_ROWS 16
/* Tiles of up to this many rows read a q4 word's high nibbles unshifted (16 times the code, still a
 * byte): their products sum to 16 times the high half's, which one arithmetic shift a row divides
 * back exactly. That trades the group's four shifts for one per row: fewer instructions at one or two
 * rows (its time gain was within the Zen 4's noise, docs/BENCHMARKS.md, session 45). */
#define HI16_ROWS 2

/* Group g's q4 codes as g32_codes gives them, but with the high nibbles left in place (16 * code). */
static inline __attribute__((always_inline)) VNNI void g32_codes_hi16(const void *codes, long g, __m512i *wv) {
    const __m512i lo = _mm512_set1_epi32(0x0F0F0F0F), hi = _mm512_set1_epi32((int)0xF0F0F0F0);
    const uint32_t *cw = (const uint32_t *)codes + g * 4 * PANEL;
#pragma GCC unroll 4
    for (int w = 0; w < 4; w++) {
        const __m512i word = _mm512_loadu_si512(cw + w * PANEL);
        wv[2 * w] = _mm512_and_si512(word, lo);
        wv[2 * w + 1] = _mm512_and_si512(word, hi);
    }
}

/* One row's group: the eight products as two interleaved chains of four (a chain of eight waited
 * out vpdpbusd's latency: 10% more time per product on the Zen 4 at 2-48 rows, 7% for q8 codes,
 * measured on warm weights), their exact integer sum scaled into the row's accumulator. */
static inline __attribute__((always_inline)) VNNI __m512
g32_row(__m512 acc, const int q4, const int hi16, const __m512i *wv, const int8_t *xb, int32_t xsum, __m512 s,
        float dx) {
    const int32_t *xr = (const int32_t *)xb;
    __m512i ia = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_set1_epi32(xr[0]));
    __m512i ib = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], _mm512_set1_epi32(xr[1]));
#pragma GCC unroll 3
    for (int j = 1; j < 4; j++) {
        ia = _mm512_dpbusd_epi32(ia, wv[2 * j], _mm512_set1_epi32(xr[2 * j]));
        ib = _mm512_dpbusd_epi32(ib, wv[2 * j + 1], _mm512_set1_epi32(xr[2 * j + 1]));
    }
    __m512i isum = _mm512_add_epi32(ia, hi16 ? _mm512_srai_epi32(ib, 4) : ib); /* hi16: ib is 16x, exactly */
    if (!q4) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(128 * xsum));
    return g32_scale(acc, isum, s, dx);
}

static inline __attribute__((always_inline)) VNNI void
tile_g32(const int MR, const int q4, const int8_t *xq, long K, const float *xd, const int32_t *xs, const float *xc,
         const void *codes, const void *sc, const void *of, int hs, float *out) {
    const long ng = K / 32;
    const int hi16 = q4 && MR <= HI16_ROWS;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[G32_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    __m512 fs = _mm512_setzero_ps(), fo = _mm512_setzero_ps(); /* the super-block's factor rows */
    for (long g = 0; g < ng; g++) {
        __m512i wv[8]; /* wv[j] pairs with the activation bytes 4j..4j+3 of the group */
        if (hi16)
            g32_codes_hi16(codes, g, wv);
        else
            g32_codes(q4, codes, g, wv);
        if (!q4) /* vpdpbusd takes unsigned weights: w + 128, which the row's block sum corrects */
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) wv[j] = _mm512_xor_si512(wv[j], flip);
        const __m512 s = group_scales_next(sc, g, hs, &fs);
        const __m512 o = of ? group_scales_next(of, g, hs, &fo) : _mm512_setzero_ps();
        g32_prefetch(q4, codes, sc, of, K, g, hs); /* a later panel's, a group's worth per group */
        if (of) { /* the branch out of the row loop: gcc tested it once per row */
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++) {
                acc[r] = g32_row(acc[r], q4, hi16, wv, xq + r * K + g * 32, xs[r * ng + g], s, xd[r * ng + g]);
                acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(o, _mm512_set1_ps(xc[r * ng + g])));
            }
        } else {
#pragma GCC unroll 16
            for (int r = 0; r < MR; r++)
                acc[r] = g32_row(acc[r], q4, hi16, wv, xq + r * K + g * 32, xs[r * ng + g], s, xd[r * ng + g]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * PANEL, acc[r]);
}

typedef void (*fast_g32_fn)(const int8_t *, long, const float *, const int32_t *, const float *, const void *,
                            const void *, const void *, int, float *);
#define GTILE(n)                                                                                                    \
    static VNNI void g32_q4_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, const float *xc,    \
                                const void *c, const void *s, const void *o, int hs, float *out) {                \
        tile_g32(n, 1, xq, K, xd, xs, xc, c, s, o, hs, out);                                                       \
    }                                                                                                               \
    static VNNI void g32_q8_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, const float *xc,    \
                                const void *c, const void *s, const void *o, int hs, float *out) {                \
        tile_g32(n, 0, xq, K, xd, xs, xc, c, s, o, hs, out);                                                       \
    }
GTILE(1) GTILE(2) GTILE(3) GTILE(4) GTILE(5) GTILE(6) GTILE(7) GTILE(8) GTILE(9) GTILE(10) GTILE(11) GTILE(12)
GTILE(13) GTILE(14) GTILE(15) GTILE(16)
static const fast_g32_fn G32_Q4[G32_ROWS + 1] = {0, g32_q4_1, g32_q4_2, g32_q4_3, g32_q4_4, g32_q4_5,
                                                 g32_q4_6, g32_q4_7, g32_q4_8, g32_q4_9, g32_q4_10, g32_q4_11,
                                                 g32_q4_12, g32_q4_13, g32_q4_14, g32_q4_15, g32_q4_16};
static const fast_g32_fn G32_Q8[G32_ROWS + 1] = {0, g32_q8_1, g32_q8_2, g32_q8_3, g32_q8_4, g32_q8_5,
                                                 g32_q8_6, g32_q8_7, g32_q8_8, g32_q8_9, g32_q8_10, g32_q8_11,
                                                 g32_q8_12, g32_q8_13, g32_q8_14, g32_q8_15, g32_q8_16};

typedef void (*fast_tile_fn)(const int8_t *, long, const float *, const int32_t *, long, const void *, const void *,
                             const void *, int, float *);
#define FTILE(n)                                                                                                    \
    static VNNI void ft_q4_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,          \
                               const void *c, const void *s, const void *o, int hs, float *out) {                 \
        tile(n, FORM_Q4, xq, K, xd, xs, group, c, s, o, hs, out);                                                  \
    }                                                                                                               \
    static VNNI void ft_q8_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,          \
                               const void *c, const void *s, const void *o, int hs, float *out) {                 \
        tile(n, FORM_Q8, xq, K, xd, xs, group, c, s, o, hs, out);                                                  \
    }                                                                                                               \
    static VNNI void ft_q6_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,          \
                               const void *c, const void *s, const void *o, int hs, float *out) {                 \
        tile(n, FORM_Q6, xq, K, xd, xs, group, c, s, o, hs, out);                                                  \
    }
#define FAST_AVX2_ROWS 4
/* fast_avx2.c: the AVX2 tiles and the AVX-VNNI ones (the same rows a tile) */
extern const fast_tile_fn FAST_AVX2_Q4[FAST_AVX2_ROWS + 1], FAST_AVX2_Q8[FAST_AVX2_ROWS + 1];
extern const fast_tile_fn FAST_AVXVNNI_Q4[FAST_AVX2_ROWS + 1], FAST_AVXVNNI_Q8[FAST_AVX2_ROWS + 1];
FTILE(1) FTILE(2) FTILE(3) FTILE(4) FTILE(5) FTILE(6) FTILE(7) FTILE(8) FTILE(9) FTILE(10) FTILE(11) FTILE(12)
static const fast_tile_fn FT_Q4[FAST_ROWS + 1] = {0, ft_q4_1, ft_q4_2, ft_q4_3, ft_q4_4, ft_q4_5, ft_q4_6,
                                                  ft_q4_7, ft_q4_8, ft_q4_9, ft_q4_10, ft_q4_11, ft_q4_12};
static const fast_tile_fn FT_Q8[FAST_ROWS + 1] = {0, ft_q8_1, ft_q8_2, ft_q8_3, ft_q8_4, ft_q8_5, ft_q8_6,
                                                  ft_q8_7, ft_q8_8, ft_q8_9, ft_q8_10, ft_q8_11, ft_q8_12};
static const fast_tile_fn FT_Q6[FAST_ROWS + 1] = {0, ft_q6_1, ft_q6_2, ft_q6_3, ft_q6_4, ft_q6_5, ft_q6_6,
                                                  ft_q6_7, ft_q6_8, ft_q6_9, ft_q6_10, ft_q6_11, ft_q6_12};

/*
 * Arguments as stored_linear's (stored.c), except that the scales and offsets are stored as hs
 * says (scales.h: fp32, the weight's exact fp16 copies, or a K-quant's factored form; both alike).
 * Returns 0, -1 for a kind, shape or scale form this kernel does not take (the caller runs the
 * exact kernel and says so), -2 when out of memory.
 */
int stored_linear_fast(const float *x, long M, long K, int kind, long group, const void *codes, const void *scales,
                       const void *offsets, long N, const float *bias, float *y, long ldy, int accumulate,
                       int nthreads, int hs) {
    if (kind == KIND_BF16) /* vdpbf16ps where the CPU has it (fast_bf16.c) */
        return fast_bf16_linear(x, M, K, codes, N, bias, y, ldy, accumulate, nthreads);
    const int q4 = kind == KIND_Q4, q6 = kind == KIND_Q6;
    if ((!q4 && !q6 && kind != KIND_Q8) || group <= 0 || K % group || group % (q4 ? 8 : q6 ? 16 : 4) ||
        !fast_supported())
        return -1;
    if (!scales_form_fits(K / group, hs)) return -1;
    const int vnni = variant == 512, g32 = vnni && group == 32 && !q6, tiles_amx = g32 && amx && M >= AMX_MIN_ROWS;
    const int widen = q6 && !vnni; /* q6 panels to q8 first: every variant but the VNNI tile() */
    const int rows_max = g32 ? G32_ROWS : vnni ? FAST_ROWS : FAST_AVX2_ROWS;
    const long ng = K / group;
    if (M <= 0 || N <= 0) return 0;
    /* the AMX tile reads 16 rows from every chunk's first: rows past M are padding it ignores */
    const long xq_rows = tiles_amx ? M + G32_ROWS - 1 : M;
    int8_t *xq = aligned_alloc(64, (size_t)((xq_rows * K + 63) / 64 * 64));
    float *xd = malloc(sizeof(float) * (size_t)(M * ng) * 2);
    int32_t *xs = malloc(sizeof(int32_t) * (size_t)(M * ng));
    if (!xq || !xd || !xs) {
        free(xq);
        free(xd);
        free(xs);
        return -2;
    }
    float *xc = xd + M * ng; /* d * (float)sum per row and block: the offset term's factor */
    memset(xq + M * K, 0, (size_t)((xq_rows - M) * K));
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1)
    for (long r = 0; r < M; r++) {
        quantize_row(x + r * K, K, group, q4 || (q6 && !widen), xq + r * K, xd + r * ng, xs + r * ng);
        for (long b = 0; b < ng; b++) xc[r * ng + b] = xd[r * ng + b] * (float)xs[r * ng + b];
    }
    const long npanels = (N + PANEL - 1) / PANEL;
    const long panel_bytes = q4 ? K * PANEL / 2 : q6 ? q6_panel_bytes(K) : K * PANEL;
    const fast_tile_fn *tiles = vnni               ? (q4 ? FT_Q4 : q6 ? FT_Q6 : FT_Q8)
                                : variant == 256 ? (q4 ? FAST_AVXVNNI_Q4 : FAST_AVXVNNI_Q8)
                                                 : (q4 ? FAST_AVX2_Q4 : FAST_AVX2_Q8);
    const fast_g32_fn *gtiles = q4 ? G32_Q4 : G32_Q8;
    int failed = 0; /* a thread could not allocate its q6 buffer: the call fails (-2), its output undefined */
#pragma omp parallel num_threads(nthreads)
    {
        if (tiles_amx) fast_amx_begin(); /* tile state is per thread */
        int8_t *wide = widen ? aligned_alloc(64, (size_t)((K * PANEL + 63) / 64 * 64)) : 0; /* a q6 panel as q8 */
#pragma omp for schedule(static)
        for (long p = 0; p < npanels; p++) {
            float out[G32_ROWS * PANEL] __attribute__((aligned(64)));
            const char *pc = (const char *)codes + p * panel_bytes;
            if (widen && !wide) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            if (widen) {
                q6_to_q8((const uint32_t *)pc, K, wide);
                pc = (const char *)wide;
            }
            const long sbytes = p * scales_panel_bytes(ng, hs);
            const void *ps = (const char *)scales + sbytes;
            const void *po = offsets ? (const char *)offsets + sbytes : 0;
            const long col0 = p * PANEL;
            const int ncols = (int)(N - col0 < PANEL ? N - col0 : PANEL);
            for (long m0 = 0; m0 < M; m0 += rows_max) {
                const int mr = (int)(M - m0 < rows_max ? M - m0 : rows_max);
                if (tiles_amx && mr >= AMX_MIN_ROWS)
                    fast_amx_tile(mr, q4, xq + m0 * K, K, xd + m0 * ng, xc + m0 * ng, pc, ps, po, hs, out);
                else if (g32)
                    gtiles[mr](xq + m0 * K, K, xd + m0 * ng, xs + m0 * ng, xc + m0 * ng, pc, ps, po, hs, out);
                else
                    tiles[mr](xq + m0 * K, K, xd + m0 * ng, xs + m0 * ng, group, pc, ps, po, hs, out);
                put_tile(out, mr, ncols, bias ? bias + col0 : NULL, y + m0 * ldy + col0, ldy, accumulate);
            }
        }
        if (tiles_amx) fast_amx_end();
        free(wide);
    }
    free(xq);
    free(xd);
    free(xs);
    return failed ? -2 : 0;
}
