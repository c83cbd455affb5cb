/*
 * Where a panel's scales (and offsets) lie in the forms the fast tiles read, the `hs` argument
 * every tile takes (weights.py's StoredPanels.fast_format writes it):
 *   SCALES_F32 (0): fp32, [ng][16] per panel (ng = K / group);
 *   SCALES_F16 (1): the exact fp16 copy, [ng][16];
 *   SCALES_FACTORED + s (s >= 0): a K-quant's own factoring (Q4_K: d * sc and dmin * m, Q6_K:
 *     d * sc) for super-blocks of 2^s groups: per super-block one factor row (fp16 [16]), then
 *     the super-block's sub-scale rows (int8 [2^s][16]). A group's scale is (float)factor *
 *     (float)sub, which weights.py checked, at load, equals the fp32 scale bit for bit: the same
 *     floats from about a quarter of the bytes (Q4_K 4.6 bits a weight instead of 6, Q6_K 8.6
 *     instead of 10).
 * Each ISA's loader (fast.h's group_scales, fast_avx2.c's scales8) reads all three through these
 * offsets, so the tiles differ only in vector width.
 */
#ifndef SPECCHAT_SCALES_H
#define SPECCHAT_SCALES_H

#define SCALES_H_PANEL 16 /* the panel width (PANEL in fast.h and fast_avx2.c) */
#define SCALES_F32 0
#define SCALES_F16 1
#define SCALES_FACTORED 2

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

#endif
