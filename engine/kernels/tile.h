/*
 * The 6x16 AVX2 register tile that skinny.c (fp32 panels) and stored.c (decoded stored panels)
 * both run: MR rows (1..6) of x times one 16-column panel of kc values of k, continuing the FMA
 * chains held in acc[MR][16] (a caller starting a product zeroes acc; a chunked one passes the
 * previous chunk's sums back in: a store and a reload are exact, so the chain is the same).
 *
 * 12 accumulators, 2 weight vectors and 1 broadcast fill the 16 ymm registers. Every output is
 * one fused multiply-add chain over k in order, whatever MR is, so a row gets the same bits
 * whether it is computed alone (plain decoding) or inside a tree (verification).
 */
#ifndef SPECCHAT_TILE_H
#define SPECCHAT_TILE_H

#include <immintrin.h>

#define PANEL 16
#define MAX_ROWS 6
#define TILE_TARGET __attribute__((target("avx2,fma")))

/* w: [kc][16] floats (any alignment); x: MR rows with leading dimension ldx. */
static inline __attribute__((always_inline)) TILE_TARGET void
tile(const int MR, const float *x, long ldx, const float *w, long kc, float *acc) {
    __m256 a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51;
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = a40 = a41 = a50 = a51 = _mm256_setzero_ps();
#define LOAD(r)                                                  \
    if (MR > r) {                                                \
        a##r##0 = _mm256_loadu_ps(acc + r * PANEL);              \
        a##r##1 = _mm256_loadu_ps(acc + r * PANEL + 8);          \
    }
    LOAD(0) LOAD(1) LOAD(2) LOAD(3) LOAD(4) LOAD(5)
#undef LOAD
#define ROW(r)                                                   \
    if (MR > r) {                                                \
        const __m256 b = _mm256_broadcast_ss(x + r * ldx + k);   \
        a##r##0 = _mm256_fmadd_ps(b, w0, a##r##0);               \
        a##r##1 = _mm256_fmadd_ps(b, w1, a##r##1);               \
    }
    for (long k = 0; k < kc; k++) {
        const __m256 w0 = _mm256_loadu_ps(w + k * PANEL);
        const __m256 w1 = _mm256_loadu_ps(w + k * PANEL + 8);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
    }
#undef ROW
#define STORE(r)                                                 \
    if (MR > r) {                                                \
        _mm256_storeu_ps(acc + r * PANEL, a##r##0);              \
        _mm256_storeu_ps(acc + r * PANEL + 8, a##r##1);          \
    }
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
#undef STORE
}

/* The tile for each row count, so a caller picks it by a runtime MR: TILES[mr](x, ldx, w, kc, acc). */
typedef void (*tile_fn)(const float *, long, const float *, long, float *);
#define TILE(n) \
    static TILE_TARGET void tile##n(const float *x, long ldx, const float *w, long kc, float *a) { tile(n, x, ldx, w, kc, a); }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
#undef TILE
static const tile_fn TILES[MAX_ROWS + 1] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

#endif
