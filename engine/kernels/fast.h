/*
 * What the fast precision's VNNI tiles (fast.c) and AMX tiles (fast_amx.c) share: the panel width,
 * the target attribute, and the two register helpers both read weights with, so the variants
 * cannot drift apart in how they widen scales or order q8 codes; and the epilogue every fast tile
 * (fast_bf16.c's too) writes its results with.
 */
#ifndef SPECCHAT_FAST_H
#define SPECCHAT_FAST_H

#include <immintrin.h>
#include <stdint.h>

#include "scales.h"

#define PANEL 16
#define PF_PANELS 2 /* how many panels ahead a tile prefetches codes and scales (fast.c says why) */
#define VNNI_TARGETS "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma"
#define VNNI __attribute__((target(VNNI_TARGETS)))
/* Calls (and row chunks) of fewer rows stay on the VNNI tile even where AMX runs (measured: the
 * tile's fixed cost a group outweighs the products it saves below this;
 * docs/history/benchmarks-sessions.md, "Session 26"). */
#define AMX_MIN_ROWS 12

/* The byte shuffle that turns four k of a q8 panel (16 bytes per k) into four k per column lane:
 * byte 4j + i of the result = byte 16i + j of the source. */
static inline __attribute__((always_inline)) VNNI __m512i q8_transpose(void) {
    return _mm512_set_epi8(63, 47, 31, 15, 62, 46, 30, 14, 61, 45, 29, 13, 60, 44, 28, 12, 59, 43, 27, 11, 58, 42, 26,
                           10, 57, 41, 25, 9, 56, 40, 24, 8, 55, 39, 23, 7, 54, 38, 22, 6, 53, 37, 21, 5, 52, 36, 20, 4,
                           51, 35, 19, 3, 50, 34, 18, 2, 49, 33, 17, 1, 48, 32, 16, 0);
}

/* Group g (32 k) of a panel's codes as eight registers, wv[j] pairing with activation bytes
 * 4j..4j+3 (four k per column lane, the layout vpdpbusd and an AMX B tile both read): q4 codes
 * (0..15) by one mask per nibble; q8 codes as signed bytes, transposed from 16 bytes per k. */
static inline __attribute__((always_inline)) VNNI void g32_codes(const int q4, const void *codes, long g, __m512i *wv) {
    if (q4) {
        const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
        const uint32_t *cw = (const uint32_t *)codes + g * 4 * PANEL;
#pragma GCC unroll 4
        for (int w = 0; w < 4; w++) {
            const __m512i word = _mm512_loadu_si512(cw + w * PANEL);
            wv[2 * w] = _mm512_and_si512(word, m4);
            wv[2 * w + 1] = _mm512_and_si512(_mm512_srli_epi32(word, 4), m4);
        }
    } else {
        const __m512i tr = q8_transpose();
        const int8_t *cb = (const int8_t *)codes + g * 32 * PANEL;
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) wv[j] = _mm512_permutexvar_epi8(tr, _mm512_loadu_si512(cb + j * 4 * PANEL));
    }
}

/* A group's exact integer sum into a row's accumulator: acc + (float)isum * (scale * d), two
 * roundings in this order (fast.py's definition; every variant ends a group here). */
static inline __attribute__((always_inline)) VNNI __m512 g32_scale(__m512 acc, __m512i isum, __m512 s, float dx) {
    return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, _mm512_set1_ps(dx))));
}

/* A later panel's codes and scales for group g, so the products overlap the stream of weights
 * from DRAM (fast.c's tile_g32 says what it measured); past the matrix's end is harmless (a hint
 * never faults). */
static inline __attribute__((always_inline)) VNNI void
g32_prefetch(const int q4, const void *codes, const void *sc, const void *of, long K, long g, int hs) {
    const long ng = K / 32;
    const char *nc = (const char *)codes + PF_PANELS * (q4 ? K * PANEL / 2 : K * PANEL) + g * (q4 ? 256 : 512);
    for (int l = 0; l < (q4 ? 4 : 8); l++) _mm_prefetch(nc + 64 * l, _MM_HINT_T0);
    const long ahead = PF_PANELS * scales_panel_bytes(ng, hs) + scales_row_at(g, hs);
    _mm_prefetch((const char *)sc + ahead, _MM_HINT_T0);
    if (of) _mm_prefetch((const char *)of + ahead, _MM_HINT_T0);
}

/* A tile's results into y (row r at y + r * ldy): out + bias where there is one, then y + that
 * (accumulate) or that alone: per element the same two roundings in either loop. Why a full panel
 * goes 8 lanes at a time: as a scalar loop testing bias and accumulate per element, inlined in the
 * panel loop, it made that loop's own code 3.4% of a 16-node verify's samples (perf, fast, 300
 * cached; 2.1% for this function after), and a 16-node verify took 4% longer
 * (docs/history/benchmarks-sessions.md, "Session 38").
 * Out of line, as it was when it lived in fast.c: inlined into the panel loops, one-token steps
 * measured slower (old and new builds alternated, four rounds). */
static __attribute__((target("avx2,fma"), noinline, unused)) void
put_tile(const float *out, int mr, int ncols, const float *bias, float *y, long ldy, int accumulate) {
    for (int r = 0; r < mr; r++) {
        float *yr = y + r * ldy;
        const float *o = out + r * PANEL;
        if (ncols < PANEL) {
            for (int j = 0; j < ncols; j++) {
                const float val = bias ? o[j] + bias[j] : o[j];
                yr[j] = accumulate ? yr[j] + val : val;
            }
            continue;
        }
        for (int j = 0; j < PANEL; j += 8) {
            __m256 val = _mm256_loadu_ps(o + j);
            if (bias) val = _mm256_add_ps(val, _mm256_loadu_ps(bias + j));
            if (accumulate) val = _mm256_add_ps(_mm256_loadu_ps(yr + j), val);
            _mm256_storeu_ps(yr + j, val);
        }
    }
}

#endif
