/*
 * The fast precision's tile for CPUs with AVX2 but no AVX-512 VNNI (AMD Zen 3, older Intel):
 * the same integers and the same float steps as fast.c's VNNI tile, so both variants give every
 * output the same bits (tests/test_fast_kernel.py runs this one on any AVX2 machine).
 *
 * Why the integers agree: a block's dot product of 8-bit activations with the weight's codes is
 * an exact integer however it is summed. VNNI adds four byte products per lane (vpdpbusd); here
 * vpmaddubsw adds pairs into 16 bits and vpmaddwd pairs of those into 32. Nothing saturates:
 * q4 codes are 0..15 and activations -127..127, so a 16-bit lane holds at most 4 words' worth
 * (4 * 2 * 2 * 15 * 127 = 30480 < 32767) before it is widened; q8 codes go through |w| and the
 * activation's sign flipped by w's (at most 2 * 128 * 127 = 32512), widened every word.
 * The float steps are fast.c's, lane by lane, in the same order.
 *
 * Why a panel is done as two 8-column halves: AVX2 has 16 vector registers, which hold a few
 * rows' 8-column accumulators, not 16 columns' (the VNNI tile keeps 12 rows x 16 columns).
 *
 * CPUs with AVX-VNNI but no AVX-512 (Intel Alder Lake and later client cores) get tile_vnni():
 * the same halves and float steps, the integers by vpdpbusd on 8 lanes (four byte products a lane
 * in one instruction, where vpmaddubsw + vpaddw + vpmaddwd take three for the same sums).
 */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

#include "scales.h"

#define PANEL 16
#define PF_PANELS 2
#define AVX2F __attribute__((target("avx2,fma,f16c")))

/* Columns half*8 .. half*8+7 of four q8 k (16 bytes per k in the panel) as four k per 32-bit lane. */
static inline AVX2F __m256i q8_four_k(const int8_t *cb, int half) {
    const __m128i r0 = _mm_loadl_epi64((const __m128i *)(cb + half * 8));
    const __m128i r1 = _mm_loadl_epi64((const __m128i *)(cb + PANEL + half * 8));
    const __m128i r2 = _mm_loadl_epi64((const __m128i *)(cb + 2 * PANEL + half * 8));
    const __m128i r3 = _mm_loadl_epi64((const __m128i *)(cb + 3 * PANEL + half * 8));
    const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpacklo_epi8(r2, r3);
    return _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
}

/* Word w of a q4 half-panel (8 columns, eight k each) as two registers of four k per column
 * lane: the even-k codes (low nibbles) and the odd-k ones, as the activations are stored. */
static inline __attribute__((always_inline)) AVX2F void q4_word(const uint32_t *cw, long w, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi32(0x0F0F0F0F);
    const __m256i word = _mm256_loadu_si256((const __m256i *)(cw + w * PANEL));
    *lo = _mm256_and_si256(word, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi32(word, 4), m4);
}

/* A later panel's group g, as fast.c's tile_g32 (which says why); past the matrix's end is
 * harmless (a hint never faults). */
static inline __attribute__((always_inline)) AVX2F void
prefetch_group(const int q4, const void *codes, const void *sc, const void *of, long ng, long group, long g, int hs) {
    const long gbytes = q4 ? group * PANEL / 2 : group * PANEL;
    const char *nc = (const char *)codes + PF_PANELS * ng * gbytes + g * gbytes;
    for (long l = 0; l < gbytes; l += 64) _mm_prefetch(nc + l, _MM_HINT_T0);
    const long ahead = PF_PANELS * scales_panel_bytes(ng, hs) + scales_row_at(g, hs);
    _mm_prefetch((const char *)sc + ahead, _MM_HINT_T0);
    if (of) _mm_prefetch((const char *)of + ahead, _MM_HINT_T0);
}

/* Group g's exact integer sums of MR rows into their accumulators for columns half*8..+7, in
 * fast.c's float steps: acc + (float)isum * (scale * d), then acc + offset * (d * (float)sum). */
static inline __attribute__((always_inline)) AVX2F void
scale_group(const int MR, __m256 *acc, const __m256i *isum, const float *xd, const int32_t *xs, long ng, long g,
            const void *sc, const void *of, int half, int hs) {
    const __m256 s = scales8(sc, g, half, hs);
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) {
        const float dx = xd[r * ng + g];
        const __m256 sd = _mm256_mul_ps(s, _mm256_set1_ps(dx));
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[r]), sd));
    }
    if (of) {
        const __m256 o = scales8(of, g, half, hs);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            const float c = xd[r * ng + g] * (float)xs[r * ng + g];
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(o, _mm256_set1_ps(c)));
        }
    }
}

/* The integer sums of MR rows (<= 4) for group g of a panel's columns half*8..+7 (isum[r]: the
 * exact dot product of row r's 8-bit activations with the codes), with vpmaddubsw + vpmaddwd. */
static inline __attribute__((always_inline)) AVX2F void
isums_avx2(const int MR, const int q4, const int8_t *xq, long K, const int32_t *xs, long group, const void *codes,
           long ng, long g, int half, __m256i *isum) {
    (void)xs, (void)ng; /* the q8 path here needs no block sums (isums_vnni does) */
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) isum[r] = _mm256_setzero_si256();
    if (q4) {
        const uint32_t *cw = (const uint32_t *)codes + g * (group / 8) * PANEL + half * 8;
        for (long w0 = 0; w0 < group / 8; w0 += 4) {
            const long w1 = w0 + 4 < group / 8 ? w0 + 4 : group / 8;
            __m256i part[4];
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) part[r] = _mm256_setzero_si256();
            for (long w = w0; w < w1; w++) {
                __m256i lo, hi;
                q4_word(cw, w, &lo, &hi);
                const long k = g * group + w * 8;
#pragma GCC unroll 4
                for (int r = 0; r < MR; r++) {
                    const int32_t *xr = (const int32_t *)(xq + r * K + k);
                    part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xr[0])));
                    part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xr[1])));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(part[r], ones));
        }
    } else {
        const int8_t *cb = (const int8_t *)codes + g * group * PANEL;
        for (long w = 0; w < group / 4; w++) {
            const __m256i wt = q8_four_k(cb + w * 4 * PANEL, half);
            const __m256i mag = _mm256_abs_epi8(wt); /* -128 -> 0x80, read as unsigned 128 */
            const long k = g * group + w * 4;
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xq + r * K + k));
                const __m256i prod = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xb, wt));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(prod, ones));
            }
        }
    }
}

/*
 * The tile of an AVX2-class variant: MR rows (<= 4) by one 16-column panel, as fast.c's tile(),
 * results to out[MR][16]; NAME compiled for TARGET with ISUMS for the integers, so the variants
 * share their layout, prefetch and float steps and differ only in how they sum the integers.
 */
#define HALF_PANEL_TILE(NAME, TARGET, ISUMS)                                                                        \
    static inline __attribute__((always_inline)) TARGET void NAME(                                                  \
        const int MR, const int q4, const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,      \
        const void *codes, const void *sc, const void *of, int hs, float *out) {                                    \
        const long ng = K / group;                                                                                   \
        for (int half = 0; half < 2; half++) {                                                                       \
            __m256 acc[4];                                                                                           \
            _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();                      \
            for (long g = 0; g < ng; g++) {                                                                          \
                __m256i isum[4];                                                                                     \
                ISUMS(MR, q4, xq, K, xs, group, codes, ng, g, half, isum);                                           \
                if (half == 0) prefetch_group(q4, codes, sc, of, ng, group, g, hs);                                  \
                scale_group(MR, acc, isum, xd, xs, ng, g, sc, of, half, hs);                                         \
            }                                                                                                        \
            _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) _mm256_storeu_ps(out + r * PANEL + half * 8, acc[r]); \
        }                                                                                                            \
    }
HALF_PANEL_TILE(tile2, AVX2F, isums_avx2)

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define HAVE_AVXVNNI 1
#define AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* isums_avx2() by vpdpbusd (AVX-VNNI): q4 codes (0..15, unsigned) times the activation bytes as
 * they are; q8 codes flipped to w + 128 (vpdpbusd takes unsigned weights) and 128 * the block's
 * activation sum taken off, as fast.c does. The same exact integers, so the same bits. */
static inline __attribute__((always_inline)) AVXVNNI void
isums_vnni(const int MR, const int q4, const int8_t *xq, long K, const int32_t *xs, long group, const void *codes,
           long ng, long g, int half, __m256i *isum) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) isum[r] = _mm256_setzero_si256();
    if (q4) {
        const uint32_t *cw = (const uint32_t *)codes + g * (group / 8) * PANEL + half * 8;
        for (long w = 0; w < group / 8; w++) {
            __m256i lo, hi;
            q4_word(cw, w, &lo, &hi);
            const long k = g * group + w * 8;
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const int32_t *xr = (const int32_t *)(xq + r * K + k);
                isum[r] = _mm256_dpbusd_avx_epi32(isum[r], lo, _mm256_set1_epi32(xr[0]));
                isum[r] = _mm256_dpbusd_avx_epi32(isum[r], hi, _mm256_set1_epi32(xr[1]));
            }
        }
    } else {
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        const int8_t *cb = (const int8_t *)codes + g * group * PANEL;
        for (long w = 0; w < group / 4; w++) {
            const __m256i wt = _mm256_xor_si256(q8_four_k(cb + w * 4 * PANEL, half), flip);
            const long k = g * group + w * 4;
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++)
                isum[r] = _mm256_dpbusd_avx_epi32(isum[r], wt, _mm256_set1_epi32(*(const int32_t *)(xq + r * K + k)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) isum[r] = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(128 * xs[r * ng + g]));
    }
}
HALF_PANEL_TILE(tile_vnni, AVXVNNI, isums_vnni)
#endif

typedef void (*fast_tile_fn)(const int8_t *, long, const float *, const int32_t *, long, const void *, const void *,
                             const void *, int, float *);
/* The entry points of a tile for each row count, q4 and q8: PRE_q4_n / PRE_q8_n, compiled for TARGET. */
#define FTILE(PRE, TARGET, TILE, n)                                                                                 \
    static TARGET void PRE##_q4_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,     \
                                    const void *c, const void *s, const void *o, int hs, float *out) {            \
        TILE(n, 1, xq, K, xd, xs, group, c, s, o, hs, out);                                                        \
    }                                                                                                               \
    static TARGET void PRE##_q8_##n(const int8_t *xq, long K, const float *xd, const int32_t *xs, long group,     \
                                    const void *c, const void *s, const void *o, int hs, float *out) {            \
        TILE(n, 0, xq, K, xd, xs, group, c, s, o, hs, out);                                                        \
    }
#define FTILE2(n) FTILE(ft2, AVX2F, tile2, n)
FTILE2(1) FTILE2(2) FTILE2(3) FTILE2(4)
const fast_tile_fn FAST_AVX2_Q4[5] = {0, ft2_q4_1, ft2_q4_2, ft2_q4_3, ft2_q4_4};
const fast_tile_fn FAST_AVX2_Q8[5] = {0, ft2_q8_1, ft2_q8_2, ft2_q8_3, ft2_q8_4};

#ifdef HAVE_AVXVNNI
#define FTILEV(n) FTILE(ftv, AVXVNNI, tile_vnni, n)
FTILEV(1) FTILEV(2) FTILEV(3) FTILEV(4)
const fast_tile_fn FAST_AVXVNNI_Q4[5] = {0, ftv_q4_1, ftv_q4_2, ftv_q4_3, ftv_q4_4};
const fast_tile_fn FAST_AVXVNNI_Q8[5] = {0, ftv_q8_1, ftv_q8_2, ftv_q8_3, ftv_q8_4};
#else
const fast_tile_fn FAST_AVXVNNI_Q4[5] = {0}, FAST_AVXVNNI_Q8[5] = {0}; /* this compiler has no AVX-VNNI */
#endif

/* Nonzero when the AVX-VNNI tiles were compiled and this CPU runs them. The flag is read from
 * CPUID (leaf 7, subleaf 1, EAX bit 4) rather than __builtin_cpu_supports, whose list of names
 * differs between compilers; the OS's support for the registers comes with the avx2 check. */
int fast_avxvnni_available(void) {
#ifdef HAVE_AVXVNNI
    unsigned a = 0, b = 0, c = 0, d = 0;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 4) & 1;
#else
    return 0;
#endif
}
