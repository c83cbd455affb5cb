/*
 * Kind q6 (weights.py's QuantRows): Q6_K's 6-bit codes u = q + 32 (0..63) kept at 6 bits a weight,
 * where the q8 form (the same values as int8 codes q = u - 32) streams 8. The value of a weight is
 * scale * (u - 32), the q8 form's scale * q.
 *
 * A panel (16 columns) is K / 16 blocks of 16 k, each three rows of 16 32-bit words (one a column):
 *   row 0: the low nibbles of k 0..7 as a q4 word (code k+i in bits 4i..4i+3),
 *   row 1: the same for k 8..15,
 *   row 2: the high two bits of all 16: those of k = 8w + 2b + e (w: the q4 word, b = 0..3, e:
 *          even/odd) in byte b, bits 2j..2j+1 with j = 2w + e (weights.py's _q6_high_shift).
 * So a panel is K * 12 bytes, one sequential stream. fast.c's VNNI tile reads the block's four byte
 * registers from the two q4 words (as q4 does: j = 0, 1 from word 0's low and high nibbles, j = 2, 3
 * from word 1's) and brings register j's high bits to bits 4-5 of each byte with one shift of row 2
 * (left 4, left 2, none, right 2), merged in by one masked vpternlogd. Every other product (stored.c's
 * exact one, the AVX2, AVX-VNNI and AMX tiles) widens a panel to the q8 layout (q6_to_q8) in a
 * buffer of its thread and runs its q8 code on it: the same codes, so the same bits. Why only one
 * tile reads q6 itself: it is the one the default (fast) precision runs for Q6_K (group 16) on an
 * AVX-512 CPU; elsewhere the widening still reads 6 bits a weight from memory, at the cost of a
 * pass over each panel in cache, and each variant keeps a single 8-bit code path.
 */
#ifndef SPECCHAT_Q6_H
#define SPECCHAT_Q6_H

#include <immintrin.h>
#include <stdint.h>

#define Q6_PANEL 16 /* the panel width (PANEL elsewhere) */
#define Q6_BLOCK 16 /* k values of one block */
#define Q6_BIAS 32  /* u = q + 32 */

/* Bytes of one panel of K k (K a multiple of 16). */
static inline long q6_panel_bytes(long K) { return K * Q6_PANEL * 6 / 8; }

/* Codes of one 16-k block's k offset t for 8 columns (lo: their q4 word of k 8w..8w+7, already
 * shifted right 4 * (t % 8); hi: their high word) as int32 q in -32..31. */
#define Q6_CODE8(lo, hi, t)                                                                                         \
    _mm256_sub_epi32(                                                                                               \
        _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)),                                               \
                        _mm256_and_si256(_mm256_slli_epi32(_mm256_srli_epi32(                                      \
                                             hi, 8 * ((t) % 8 / 2) + 2 * (2 * ((t) / 8) + (t) % 2)), 4),           \
                                         _mm256_set1_epi32(0x30))),                                                \
        _mm256_set1_epi32(Q6_BIAS))

/* One q6 panel of K k (K a multiple of 16) widened to the q8 layout: q8[k * 16 + c] = u - 32 of
 * column c at k, int8, as the q8 kernels read it. AVX2, so every CPU the kernels run on has it. */
static __attribute__((target("avx2"), unused)) void q6_to_q8(const uint32_t *panel, long K, int8_t *q8) {
    for (long b = 0; b < K / Q6_BLOCK; b++) {
        const uint32_t *blk = panel + b * 3 * Q6_PANEL;
        const __m256i h0 = _mm256_loadu_si256((const __m256i *)(blk + 2 * Q6_PANEL));
        const __m256i h1 = _mm256_loadu_si256((const __m256i *)(blk + 2 * Q6_PANEL + 8));
        int8_t *out = q8 + b * Q6_BLOCK * Q6_PANEL;
#pragma GCC unroll 2
        for (int w = 0; w < 2; w++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + w * Q6_PANEL));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + w * Q6_PANEL + 8));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int t = 8 * w + i;
                const __m256i c0 = Q6_CODE8(l0, h0, t), c1 = Q6_CODE8(l1, h1, t);
                /* 16 int32 in -32..31 to bytes in column order (the packs cannot saturate) */
                const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xD8);
                const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
                _mm_storeu_si128((__m128i *)(out + t * Q6_PANEL), bytes);
                l0 = _mm256_srli_epi32(l0, 4);
                l1 = _mm256_srli_epi32(l1, 4);
            }
        }
    }
}

#endif
