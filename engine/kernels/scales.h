/*
 * The forms a panel's scales (and offsets) are read in by every quant kernel, exact (stored.c)
 * and fast (fast*.c), named by the `hs` argument each tile takes (weights.py's
 * StoredPanels.scale_form writes it), and the two loaders that read them:
 *   SCALES_F32 (0): fp32, [ng][16] per panel (ng = K / group);
 *   SCALES_F16 (1): the exact fp16 copy, [ng][16];
 *   SCALES_FACTORED + s (s >= 0): a K-quant's own factoring (Q4_K: d * sc and (-dmin) * m, Q6_K:
 *     d * sc) for super-blocks of 2^s groups: per super-block one factor row (fp16 [16]), then
 *     the super-block's sub-scale rows (int8 [2^s][16]). A group's scale is (float)factor *
 *     (float)sub, which weights.py checked, at load, equals the fp32 scale bit for bit: the same
 *     floats from about a quarter of the bytes (Q4_K 4.6 bits a weight instead of 6, Q6_K 8.6
 *     instead of 10).
 * group_scales (16 lanes: the AVX-512 and AMX tiles) and scales8 (8 lanes: the AVX2 and AVX-VNNI
 * tiles) read all three, so no tile has a scale reader of its own and one test covers the logic.
 */
#ifndef SPECCHAT_SCALES_H
#define SPECCHAT_SCALES_H

#include <immintrin.h>

#define SCALES_H_PANEL 16 /* the panel width (PANEL in fast.h and fast_avx2.c) */
#define SCALES_F32 0
#define SCALES_F16 1
#define SCALES_FACTORED 2

/* Whether a row of ng groups can be read in form hs: a known form, factored super-blocks of at most
 * 256 groups that tile the row. */
static inline int scales_form_fits(long ng, int hs) {
    if (hs < SCALES_FACTORED) return hs >= 0;
    return hs - SCALES_FACTORED <= 8 && ng % (1L << (hs - SCALES_FACTORED)) == 0;
}

/* Bytes of one factored super-block: the factor row, then 2^s sub-scale rows. */
static inline long scales_super_bytes(int hs) {
    return 2 * SCALES_H_PANEL + ((long)SCALES_H_PANEL << (hs - SCALES_FACTORED));
}

/* Bytes of one panel's scales (ng groups; factored: ng a multiple of 2^s). */
static inline long scales_panel_bytes(long ng, int hs) {
    if (hs >= SCALES_FACTORED) return (ng >> (hs - SCALES_FACTORED)) * scales_super_bytes(hs);
    return ng * SCALES_H_PANEL * (hs == SCALES_F16 ? 2 : 4);
}

/* Byte offset in its panel of group g's row of scales (factored: of its sub-scales). */
static inline long scales_row_at(long g, int hs) {
    if (hs < SCALES_FACTORED) return g * SCALES_H_PANEL * (hs == SCALES_F16 ? 2 : 4);
    const int s = hs - SCALES_FACTORED;
    return (g >> s) * scales_super_bytes(hs) + 2 * SCALES_H_PANEL + (g & ((1L << s) - 1)) * SCALES_H_PANEL;
}

/* Byte offset in its panel of the factor row of group g's super-block (factored only). */
static inline long scales_factor_at(long g, int hs) {
    return (g >> (hs - SCALES_FACTORED)) * scales_super_bytes(hs);
}

/* A factored form's two halves, apart so that a tile can widen a super-block's factor row once and
 * reuse it for each of its groups: the factor row of group g's super-block, widened exactly, and
 * group g's int8 sub-scales, widened exactly. (AVX512F only, so that the exact and the fast
 * kernels' targets both inline them.) */
static inline __attribute__((always_inline, target("avx512f"))) __m512 group_factor(const void *p, long g, int hs) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const char *)p + scales_factor_at(g, hs))));
}

static inline __attribute__((always_inline, target("avx512f"))) __m512 group_sub(const void *p, long g, int hs) {
    const char *at = (const char *)p + scales_row_at(g, hs);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)at)));
}

/* The sixteen scales (or offsets) of group g of a panel stored as hs says: fp32; the fp16 copy the
 * GGUF kinds' scales round-trip through exactly, widened exactly; or a K-quant's factor times its
 * int8 sub-scale, one exact product. The same floats from fewer bytes. */
static inline __attribute__((always_inline, target("avx512f"))) __m512
group_scales(const void *p, long g, int hs) {
    if (hs >= SCALES_FACTORED) return _mm512_mul_ps(group_factor(p, g, hs), group_sub(p, g, hs));
    const char *at = (const char *)p + scales_row_at(g, hs);
    return hs ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)at)) : _mm512_loadu_ps((const float *)at);
}

/* group_scales for a tile that reads groups in order from 0: a factored form's factor row is
 * widened once per super-block (into *factor, kept by the caller between groups) instead of once
 * per group; the same product, so the same floats. Why: in a one-row product of Q4_K weights the
 * scale and offset factors' two fp16 widenings were 4 of the ~60 instructions of a 32-k group. */
static inline __attribute__((always_inline, target("avx512f"))) __m512
group_scales_next(const void *p, long g, int hs, __m512 *factor) {
    if (hs < SCALES_FACTORED) return group_scales(p, g, hs);
    if ((g & ((1L << (hs - SCALES_FACTORED)) - 1)) == 0) *factor = group_factor(p, g, hs);
    return _mm512_mul_ps(*factor, group_sub(p, g, hs));
}

/* Columns half*8..+7 of group g's scales (or offsets): group_scales on 8 lanes, the same floats. */
static inline __attribute__((always_inline, target("avx2,f16c"))) __m256
scales8(const void *p, long g, int half, int hs) {
    const long lane_bytes = hs >= SCALES_FACTORED ? 1 : hs == SCALES_F16 ? 2 : 4;
    const char *at = (const char *)p + scales_row_at(g, hs) + half * 8 * lane_bytes;
    if (hs >= SCALES_FACTORED) {
        const char *f = (const char *)p + scales_factor_at(g, hs) + half * 16;
        const __m256 sub = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)at)));
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)f)), sub);
    }
    return hs ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)at)) : _mm256_loadu_ps((const float *)at);
}

#endif
