/*
 * Skinny matrix products on weights kept in their stored format (GGUF quant blocks, f16, bf16):
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias), fp32 arithmetic, AVX2 + FMA (+ F16C for f16).
 *
 * Why: the fp32 kernel (skinny.c) streams 4 bytes per weight and sits at the memory roofline;
 * the embedded model's real weights are 4.5-8.5 bits. Here each 16-column panel is stored as
 * small integer codes plus one fp32 scale (and offset) per group of 16/32 k and per column (read
 * from a compact form where one gives the same floats: scales.h), repacked at load so that the
 * 16 columns of one k are adjacent (q4: the 16 columns of eight consecutive k, as one 32-bit
 * word per column: code[k+i] in bits 4i..4i+3, so a code comes out of its word with a shift and
 * a mask, no byte shuffles). A panel is decoded chunk by
 * chunk (KC values of k) into an L1-resident fp32 buffer, once for all rows, then the same
 * register tile as skinny.c runs over it (tile.h).
 *
 * Exactness: a decoded weight is the float32 value the reference dequantizer (gguf-py) gives:
 *   kind q8:  scale * code                 (Q8_0: d*q; Q6_K: (d*sc)*(q-32), one rounding)
 *   kind q4:  fma(scale, code, offset)     (Q4_1: d*q+m; Q4_0: d*q-8d; Q4_K: (d*sc)*q-dmin*m;
 *                                            scale*code is exact in fp32, so the reference's
 *                                            mul-then-add rounds once too)
 *   f16/bf16: the exact conversion.
 * Each output is one FMA chain over k = 0..K-1 from zero, like skinny.c: the accumulators are
 * kept in memory between chunks (a store and reload is exact), so a row's result equals the fp32
 * kernel on the dequantized weights and does not depend on how many rows share the call.
 *
 * Up to five rows (plain decoding, small trees) take a fused path instead: the decoded vectors go
 * straight into the FMAs from registers, the same chain without the buffer's stores and loads.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "q6.h"
#include "scales.h"
#include "tile.h"

/* Rows that take the fused decode-in-register tile; from 6 rows its 12 accumulators plus the
 * decode's registers spill (16 ymm), and the L1-buffer path is faster (gate|up of the 135M model,
 * 2 threads, same process: 6 rows 0.32 ms fused against 0.25 ms buffered; 5 rows 0.24 / 0.28). */
#define FUSED_MAX_ROWS 5
#define KC 256 /* k values decoded per chunk: 16 KB of fp32, stays in L1 */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

enum { KIND_F32 = 0, KIND_F16 = 1, KIND_BF16 = 2, KIND_Q8 = 3, KIND_Q4 = 4, KIND_Q6 = 5 };

/* ---- decoders: panel columns 0..15 of k = k0..k0+kc-1 into buf[kc][16] ---------------------- */

static AVX2 void decode_f32(const float *w, long k0, long kc, float *buf) {
    for (long k = 0; k < kc; k++) {
        _mm256_store_ps(buf + k * PANEL, _mm256_loadu_ps(w + (k0 + k) * PANEL));
        _mm256_store_ps(buf + k * PANEL + 8, _mm256_loadu_ps(w + (k0 + k) * PANEL + 8));
    }
}

static AVX2 void decode_f16(const uint16_t *w, long k0, long kc, float *buf) {
    for (long k = 0; k < kc; k++) {
        const __m128i *src = (const __m128i *)(w + (k0 + k) * PANEL);
        _mm256_store_ps(buf + k * PANEL, _mm256_cvtph_ps(_mm_loadu_si128(src)));
        _mm256_store_ps(buf + k * PANEL + 8, _mm256_cvtph_ps(_mm_loadu_si128(src + 1)));
    }
}

static AVX2 void decode_bf16(const uint16_t *w, long k0, long kc, float *buf) {
    for (long k = 0; k < kc; k++) {
        const __m128i *src = (const __m128i *)(w + (k0 + k) * PANEL);
        const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(src)), 16);
        const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(src + 1)), 16);
        _mm256_store_ps(buf + k * PANEL, _mm256_castsi256_ps(lo));
        _mm256_store_ps(buf + k * PANEL + 8, _mm256_castsi256_ps(hi));
    }
}

/* int8 codes [K][16]; scales/offsets [K/group][16] stored as hs says (scales.h; offsets may be
 * NULL: a plain product). */
static AVX2 void decode_q8(const int8_t *codes, const void *scales, const void *offsets, int hs, long group,
                           long k0, long kc, float *buf) {
    for (long k = 0; k < kc;) {
        const long g = (k0 + k) / group;
        const long end = (g + 1) * group - k0 < kc ? (g + 1) * group - k0 : kc;
        const __m256 s0 = scales8(scales, g, 0, hs), s1 = scales8(scales, g, 1, hs);
        if (offsets) {
            const __m256 o0 = scales8(offsets, g, 0, hs), o1 = scales8(offsets, g, 1, hs);
            for (; k < end; k++) {
                const __m128i c = _mm_loadu_si128((const __m128i *)(codes + (k0 + k) * PANEL));
                const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
                const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
                _mm256_store_ps(buf + k * PANEL, _mm256_fmadd_ps(s0, q0, o0));
                _mm256_store_ps(buf + k * PANEL + 8, _mm256_fmadd_ps(s1, q1, o1));
            }
        } else {
            for (; k < end; k++) {
                const __m128i c = _mm_loadu_si128((const __m128i *)(codes + (k0 + k) * PANEL));
                const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
                const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
                _mm256_store_ps(buf + k * PANEL, _mm256_mul_ps(s0, q0));
                _mm256_store_ps(buf + k * PANEL + 8, _mm256_mul_ps(s1, q1));
            }
        }
    }
}

/* 4-bit codes, eight k per 32-bit word: word [k/8][c] holds code[k+i][c] << 4i (k multiple of 8);
 * group is a multiple of 8 and k0, kc are multiples of 8. */
static AVX2 void decode_q4(const uint32_t *codes, const void *scales, const void *offsets, int hs, long group,
                           long k0, long kc, float *buf) {
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (long k = 0; k < kc;) {
        const long g = (k0 + k) / group;
        const long end = (g + 1) * group - k0 < kc ? (g + 1) * group - k0 : kc;
        const __m256 s0 = scales8(scales, g, 0, hs), s1 = scales8(scales, g, 1, hs);
        const __m256 o0 = scales8(offsets, g, 0, hs), o1 = scales8(offsets, g, 1, hs);
        for (; k < end; k += 8) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(codes + (k0 + k) / 8 * PANEL));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(codes + (k0 + k) / 8 * PANEL + 8));
            for (int i = 0; i < 8; i++) {
                float *dst = buf + (k + i) * PANEL;
                _mm256_store_ps(dst, _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(_mm256_and_si256(v0, low)), o0));
                _mm256_store_ps(dst + 8, _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(_mm256_and_si256(v1, low)), o1));
                v0 = _mm256_srli_epi32(v0, 4);
                v1 = _mm256_srli_epi32(v1, 4);
            }
        }
    }
}

/* ---- fused decode + tile for one pass (M <= 6): the decoded vectors never leave registers ---- */

#define FROW(r, kk)                                                  \
    if (MR > r) {                                                    \
        const __m256 b = _mm256_broadcast_ss(x + r * ldx + (kk));    \
        a##r##0 = _mm256_fmadd_ps(b, w0, a##r##0);                   \
        a##r##1 = _mm256_fmadd_ps(b, w1, a##r##1);                   \
    }
#define FROWS(kk) FROW(0, kk) FROW(1, kk) FROW(2, kk) FROW(3, kk) FROW(4, kk) FROW(5, kk)
#define FSTORE(r)                                                    \
    if (MR > r) {                                                    \
        _mm256_storeu_ps(out + r * PANEL, a##r##0);                  \
        _mm256_storeu_ps(out + r * PANEL + 8, a##r##1);              \
    }
#define FZERO                                                        \
    __m256 a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51; \
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = a40 = a41 = a50 = a51 = _mm256_setzero_ps();

static inline __attribute__((always_inline)) AVX2 void
ftile_q4(const int MR, const float *x, long ldx, const uint32_t *codes, const void *scales, const void *offsets,
         int hs, long group, long K, float *out) {
    FZERO
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (long g = 0; g < K / group; g++) {
        const __m256 s0 = scales8(scales, g, 0, hs), s1 = scales8(scales, g, 1, hs);
        const __m256 o0 = scales8(offsets, g, 0, hs), o1 = scales8(offsets, g, 1, hs);
        for (long k = g * group; k < (g + 1) * group; k += 8) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(codes + k / 8 * PANEL));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(codes + k / 8 * PANEL + 8));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256 w0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(_mm256_and_si256(v0, low)), o0);
                const __m256 w1 = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(_mm256_and_si256(v1, low)), o1);
                FROWS(k + i)
                v0 = _mm256_srli_epi32(v0, 4);
                v1 = _mm256_srli_epi32(v1, 4);
            }
        }
    }
    FSTORE(0) FSTORE(1) FSTORE(2) FSTORE(3) FSTORE(4) FSTORE(5)
}

static inline __attribute__((always_inline)) AVX2 void
ftile_q8(const int MR, const float *x, long ldx, const int8_t *codes, const void *scales, const void *offsets,
         int hs, long group, long K, float *out) {
    FZERO
    for (long g = 0; g < K / group; g++) {
        const __m256 s0 = scales8(scales, g, 0, hs), s1 = scales8(scales, g, 1, hs);
        if (offsets) {
            const __m256 o0 = scales8(offsets, g, 0, hs), o1 = scales8(offsets, g, 1, hs);
            for (long k = g * group; k < (g + 1) * group; k++) {
                const __m128i c = _mm_loadu_si128((const __m128i *)(codes + k * PANEL));
                const __m256 w0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), o0);
                const __m256 w1 = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8))), o1);
                FROWS(k)
            }
        } else {
            for (long k = g * group; k < (g + 1) * group; k++) {
                const __m128i c = _mm_loadu_si128((const __m128i *)(codes + k * PANEL));
                const __m256 w0 = _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)));
                const __m256 w1 = _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8))));
                FROWS(k)
            }
        }
    }
    FSTORE(0) FSTORE(1) FSTORE(2) FSTORE(3) FSTORE(4) FSTORE(5)
}

typedef void (*ftile_fn)(const float *, long, const void *, const void *, const void *, int, long, long, float *);
#define FTILE(n)                                                                                              \
    static AVX2 void ftile_q4_##n(const float *x, long ldx, const void *c, const void *s, const void *o,       \
                                  int hs, long g, long K, float *out) { ftile_q4(n, x, ldx, c, s, o, hs, g, K, out); } \
    static AVX2 void ftile_q8_##n(const float *x, long ldx, const void *c, const void *s, const void *o,       \
                                  int hs, long g, long K, float *out) { ftile_q8(n, x, ldx, c, s, o, hs, g, K, out); }
FTILE(1) FTILE(2) FTILE(3) FTILE(4) FTILE(5) FTILE(6)
static const ftile_fn FTILES_Q4[MAX_ROWS + 1] = {0, ftile_q4_1, ftile_q4_2, ftile_q4_3, ftile_q4_4, ftile_q4_5,
                                                 ftile_q4_6};
static const ftile_fn FTILES_Q8[MAX_ROWS + 1] = {0, ftile_q8_1, ftile_q8_2, ftile_q8_3, ftile_q8_4, ftile_q8_5,
                                                 ftile_q8_6};

/* ---- plain decoding (one row): two panels at once ---------------------------------------------
 * With one row a panel has two accumulators, each one FMA chain over k, so the loop waits on the
 * FMA latency (4 cycles) instead of issuing. Two panels side by side give four independent chains
 * and twice the decode work to overlap with them. Each column's chain is unchanged (same FMAs in
 * the same order), so the result is bit-identical to ftile_q4/q8 with MR = 1. */
static AVX2 void ftile_pair_q4(const float *x, const uint32_t *ca, const void *sa, const void *oa,
                               const uint32_t *cb, const void *sb, const void *ob, int hs, long group, long K,
                               float *outa, float *outb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (long g = 0; g < K / group; g++) {
        const __m256 sa0 = scales8(sa, g, 0, hs), sa1 = scales8(sa, g, 1, hs);
        const __m256 oa0 = scales8(oa, g, 0, hs), oa1 = scales8(oa, g, 1, hs);
        const __m256 sb0 = scales8(sb, g, 0, hs), sb1 = scales8(sb, g, 1, hs);
        const __m256 ob0 = scales8(ob, g, 0, hs), ob1 = scales8(ob, g, 1, hs);
        for (long k = g * group; k < (g + 1) * group; k += 8) {
            __m256i va0 = _mm256_loadu_si256((const __m256i *)(ca + k / 8 * PANEL));
            __m256i va1 = _mm256_loadu_si256((const __m256i *)(ca + k / 8 * PANEL + 8));
            __m256i vb0 = _mm256_loadu_si256((const __m256i *)(cb + k / 8 * PANEL));
            __m256i vb1 = _mm256_loadu_si256((const __m256i *)(cb + k / 8 * PANEL + 8));
#define Q4W(v, s, o) _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_and_si256(v, low)), o)
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256 xi = _mm256_broadcast_ss(x + k + i);
                a0 = _mm256_fmadd_ps(xi, Q4W(va0, sa0, oa0), a0);
                a1 = _mm256_fmadd_ps(xi, Q4W(va1, sa1, oa1), a1);
                b0 = _mm256_fmadd_ps(xi, Q4W(vb0, sb0, ob0), b0);
                b1 = _mm256_fmadd_ps(xi, Q4W(vb1, sb1, ob1), b1);
                va0 = _mm256_srli_epi32(va0, 4);
                va1 = _mm256_srli_epi32(va1, 4);
                vb0 = _mm256_srli_epi32(vb0, 4);
                vb1 = _mm256_srli_epi32(vb1, 4);
            }
#undef Q4W
        }
    }
    _mm256_storeu_ps(outa, a0);
    _mm256_storeu_ps(outa + 8, a1);
    _mm256_storeu_ps(outb, b0);
    _mm256_storeu_ps(outb + 8, b1);
}

static AVX2 void ftile_pair_q8(const float *x, const int8_t *ca, const void *sa, const void *oa,
                               const int8_t *cb, const void *sb, const void *ob, int hs, long group, long K,
                               float *outa, float *outb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    for (long g = 0; g < K / group; g++) {
        const __m256 sa0 = scales8(sa, g, 0, hs), sa1 = scales8(sa, g, 1, hs);
        const __m256 sb0 = scales8(sb, g, 0, hs), sb1 = scales8(sb, g, 1, hs);
        const __m256 oa0 = oa ? scales8(oa, g, 0, hs) : _mm256_setzero_ps();
        const __m256 oa1 = oa ? scales8(oa, g, 1, hs) : _mm256_setzero_ps();
        const __m256 ob0 = ob ? scales8(ob, g, 0, hs) : _mm256_setzero_ps();
        const __m256 ob1 = ob ? scales8(ob, g, 1, hs) : _mm256_setzero_ps();
        for (long k = g * group; k < (g + 1) * group; k++) {
            const __m128i qa = _mm_loadu_si128((const __m128i *)(ca + k * PANEL));
            const __m128i qb = _mm_loadu_si128((const __m128i *)(cb + k * PANEL));
            const __m256 xk = _mm256_broadcast_ss(x + k);
            const __m256 fa0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qa));
            const __m256 fa1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qa, 8)));
            const __m256 fb0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qb));
            const __m256 fb1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qb, 8)));
            /* no offsets: d*q exactly as ftile_q8 (a multiply, not an FMA with zero: same value) */
            a0 = _mm256_fmadd_ps(xk, oa ? _mm256_fmadd_ps(sa0, fa0, oa0) : _mm256_mul_ps(sa0, fa0), a0);
            a1 = _mm256_fmadd_ps(xk, oa ? _mm256_fmadd_ps(sa1, fa1, oa1) : _mm256_mul_ps(sa1, fa1), a1);
            b0 = _mm256_fmadd_ps(xk, ob ? _mm256_fmadd_ps(sb0, fb0, ob0) : _mm256_mul_ps(sb0, fb0), b0);
            b1 = _mm256_fmadd_ps(xk, ob ? _mm256_fmadd_ps(sb1, fb1, ob1) : _mm256_mul_ps(sb1, fb1), b1);
        }
    }
    _mm256_storeu_ps(outa, a0);
    _mm256_storeu_ps(outa + 8, a1);
    _mm256_storeu_ps(outb, b0);
    _mm256_storeu_ps(outb + 8, b1);
}

/* ---- AVX-512 (F, BW, VL): one zmm is a whole 16-column panel line, so one pass holds up to 12
 * rows (12 accumulators + weights + broadcasts of the 32 registers). Chosen at run time only on
 * CPUs that report the three flags; the per-element chain is the same FMA over k = 0..K-1, so the
 * answers equal the AVX2 kernel's. NOT tested on hardware yet (the dev machine has no AVX-512). */
#define MAX_ROWS_512 12
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

static inline __attribute__((always_inline)) AVX512 void
ftile512(const int MR, const int q4, const float *x, long ldx, const void *codes, const void *scales,
         const void *offsets, int hs, long group, long K, float *out) {
    __m512 a[MAX_ROWS_512];
#pragma GCC unroll 12
    for (int r = 0; r < MAX_ROWS_512; r++)
        if (r < MR) a[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi32(0x0F);
    __m512 fs = _mm512_setzero_ps(), fo = _mm512_setzero_ps(); /* the super-block's factor rows */
    for (long g = 0; g < K / group; g++) {
        const __m512 s = group_scales_next(scales, g, hs, &fs);
        const __m512 o = offsets ? group_scales_next(offsets, g, hs, &fo) : _mm512_setzero_ps();
        if (q4) {
            for (long k = g * group; k < (g + 1) * group; k += 8) {
                __m512i v = _mm512_loadu_si512((const void *)((const uint32_t *)codes + k / 8 * PANEL));
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    const __m512 w = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(v, low)), o);
#pragma GCC unroll 12
                    for (int r = 0; r < MAX_ROWS_512; r++)
                        if (r < MR) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + k + i]), w, a[r]);
                    v = _mm512_srli_epi32(v, 4);
                }
            }
            continue;
        }
        for (long k = g * group; k < (g + 1) * group; k += 2) {
            __m512 w[2];
            {
                const int8_t *c = (const int8_t *)codes + k * PANEL;
                const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)c)));
                const __m512 q1 =
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + PANEL))));
                w[0] = offsets ? _mm512_fmadd_ps(s, q0, o) : _mm512_mul_ps(s, q0);
                w[1] = offsets ? _mm512_fmadd_ps(s, q1, o) : _mm512_mul_ps(s, q1);
            }
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) {
#pragma GCC unroll 12
                for (int r = 0; r < MAX_ROWS_512; r++)
                    if (r < MR) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + k + i]), w[i], a[r]);
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MAX_ROWS_512; r++)
        if (r < MR) _mm512_storeu_ps(out + r * PANEL, a[r]);
}

typedef void (*ftile512_fn)(const float *, long, const void *, const void *, const void *, int, long, long, float *);
#define FTILE512(n)                                                                                            \
    static AVX512 void ftile512_q4_##n(const float *x, long ldx, const void *c, const void *s, const void *o,   \
                                       int hs, long g, long K, float *out) {                                    \
        ftile512(n, 1, x, ldx, c, s, o, hs, g, K, out);                                                          \
    }                                                                                                            \
    static AVX512 void ftile512_q8_##n(const float *x, long ldx, const void *c, const void *s, const void *o,   \
                                       int hs, long g, long K, float *out) {                                    \
        ftile512(n, 0, x, ldx, c, s, o, hs, g, K, out);                                                          \
    }
FTILE512(1) FTILE512(2) FTILE512(3) FTILE512(4) FTILE512(5) FTILE512(6)
FTILE512(7) FTILE512(8) FTILE512(9) FTILE512(10) FTILE512(11) FTILE512(12)
static const ftile512_fn FTILES512_Q4[MAX_ROWS_512 + 1] = {
    0, ftile512_q4_1, ftile512_q4_2, ftile512_q4_3, ftile512_q4_4, ftile512_q4_5, ftile512_q4_6,
    ftile512_q4_7, ftile512_q4_8, ftile512_q4_9, ftile512_q4_10, ftile512_q4_11, ftile512_q4_12};
static const ftile512_fn FTILES512_Q8[MAX_ROWS_512 + 1] = {
    0, ftile512_q8_1, ftile512_q8_2, ftile512_q8_3, ftile512_q8_4, ftile512_q8_5, ftile512_q8_6,
    ftile512_q8_7, ftile512_q8_8, ftile512_q8_9, ftile512_q8_10, ftile512_q8_11, ftile512_q8_12};

static int use_avx512 = -1; /* -1: not decided yet */

/* 512 when this CPU runs the AVX-512 tiles, else 2 (AVX2). force: 0 = auto, 2 = AVX2 only. */
int stored_variant(int force) {
    __builtin_cpu_init();
    const int has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl");
    use_avx512 = has && force != 2;
    return use_avx512 ? 512 : 2;
}

int stored_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* One row (plain decoding) on quant weights: panels two at a time (ftile_pair_*), the odd one alone. */
static void write_panel(const float *acc, long col0, long N, const float *bias, float *y, int accumulate) {
    const int ncols = (int)(N - col0 < PANEL ? N - col0 : PANEL);
    for (int j = 0; j < ncols; j++) {
        const float val = bias ? acc[j] + bias[col0 + j] : acc[j];
        y[col0 + j] = accumulate ? y[col0 + j] + val : val;
    }
}

static void stored_linear_row(const float *x, long K, int kind, long group, const void *codes, const void *scales,
                              const void *offsets, int hs, long N, const float *bias, float *y, int accumulate,
                              int nthreads, long panel_bytes, long ngroups) {
    const long npanels = (N + PANEL - 1) / PANEL;
    const long npairs = (npanels + 1) / 2;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long q = 0; q < npairs; q++) {
        float acc[2 * PANEL] __attribute__((aligned(32)));
        const long p = 2 * q;
        const char *pa = (const char *)codes + p * panel_bytes;
        const long sbytes = scales_panel_bytes(ngroups, hs);
        const char *sa = (const char *)scales + p * sbytes;
        const char *oa = offsets ? (const char *)offsets + p * sbytes : 0;
        if (p + 1 < npanels) {
            const char *pb = pa + panel_bytes;
            const char *sb = sa + sbytes;
            const char *ob = oa ? oa + sbytes : 0;
            if (kind == KIND_Q4)
                ftile_pair_q4(x, (const uint32_t *)pa, sa, oa, (const uint32_t *)pb, sb, ob, hs, group, K, acc,
                              acc + PANEL);
            else
                ftile_pair_q8(x, (const int8_t *)pa, sa, oa, (const int8_t *)pb, sb, ob, hs, group, K, acc,
                              acc + PANEL);
            write_panel(acc, p * PANEL, N, bias, y, accumulate);
            write_panel(acc + PANEL, (p + 1) * PANEL, N, bias, y, accumulate);
        } else {
            (kind == KIND_Q4 ? FTILES_Q4 : FTILES_Q8)[1](x, K, pa, sa, oa, hs, group, K, acc);
            write_panel(acc, p * PANEL, N, bias, y, accumulate);
        }
    }
}

/*
 * x: [M, K] row-major. codes: per panel p (0..ceil(N/16)-1) a block of K*16 codes
 * (q4: K*8 bytes; q6: K*12, q6.h's layout, each panel widened to the q8 one in a buffer of its
 * thread and multiplied as q8: the same codes, the same bits); scales/offsets: per panel
 * [K/group][16], stored as hs says (scales.h: fp32, the exact fp16 copies or a K-quant's factored
 * form; the same floats), NULL where the kind has none.
 * y: row stride ldy; columns 0..N-1 written (accumulate: added). bias: [N] or NULL.
 */
void stored_linear(const float *x, long M, long K, int kind, long group, const void *codes, const void *scales,
                   const void *offsets, long N, const float *bias, float *y, long ldy, int accumulate,
                   int nthreads, int hs) {
    const long npanels = (N + PANEL - 1) / PANEL;
    const long code_bytes = kind == KIND_F32 ? 4 : (kind == KIND_F16 || kind == KIND_BF16) ? 2 : 1;
    const long panel_bytes = kind == KIND_Q4   ? K * PANEL / 2
                             : kind == KIND_Q6 ? q6_panel_bytes(K)
                                               : K * PANEL * code_bytes;
    const long ngroups = group > 0 ? K / group : 0;
    const long passes = (M + MAX_ROWS - 1) / MAX_ROWS;
    if (M <= 0 || N <= 0) return; /* nothing to compute (and no zero-row tile to call) */
    /* (q6 takes the loop below, its buffer one panel: FTILES_Q8[1] there gives the pair tile's bits) */
    if (M == 1 && use_avx512 != 1 && (kind == KIND_Q4 || kind == KIND_Q8)) {
        stored_linear_row(x, K, kind, group, codes, scales, offsets, hs, N, bias, y, accumulate, nthreads,
                          panel_bytes, ngroups);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
        float buf[KC * PANEL] __attribute__((aligned(64)));
        float *acc = aligned_alloc(64, ((M * PANEL * sizeof(float)) + 63) / 64 * 64);
        int8_t *wide = kind == KIND_Q6 ? aligned_alloc(64, (K * PANEL + 63) / 64 * 64) : 0; /* a q6 panel as q8 */
        const int pkind = kind == KIND_Q6 ? KIND_Q8 : kind; /* the kind the panel is multiplied as */
#pragma omp for schedule(static)
        for (long p = 0; p < npanels; p++) {
            const char *pc = (const char *)codes + p * panel_bytes;
            if (kind == KIND_Q6) { /* (a failed allocation faults here, as acc's would above) */
                q6_to_q8((const uint32_t *)pc, K, wide);
                pc = (const char *)wide;
            }
            const long sbytes = p * scales_panel_bytes(ngroups, hs);
            const char *ps = scales ? (const char *)scales + sbytes : 0;
            const char *po = offsets ? (const char *)offsets + sbytes : 0;
            const int quant = pkind == KIND_Q4 || pkind == KIND_Q8;
            const int wide512 = use_avx512 == 1 && quant && M <= MAX_ROWS_512;
            const int fused = wide512 || (quant && M <= FUSED_MAX_ROWS);
            if (wide512)
                (pkind == KIND_Q4 ? FTILES512_Q4 : FTILES512_Q8)[M](x, K, pc, ps, po, hs, group, K, acc);
            else if (fused)
                (pkind == KIND_Q4 ? FTILES_Q4 : FTILES_Q8)[M](x, K, pc, ps, po, hs, group, K, acc);
            else
                for (long i = 0; i < M * PANEL; i++) acc[i] = 0.0f;
            for (long k0 = 0; k0 < K && !fused; k0 += KC) {
                const long kc = K - k0 < KC ? K - k0 : KC;
                switch (pkind) {
                case KIND_F32: decode_f32((const float *)pc, k0, kc, buf); break;
                case KIND_F16: decode_f16((const uint16_t *)pc, k0, kc, buf); break;
                case KIND_BF16: decode_bf16((const uint16_t *)pc, k0, kc, buf); break;
                case KIND_Q8: decode_q8((const int8_t *)pc, ps, po, hs, group, k0, kc, buf); break;
                default: decode_q4((const uint32_t *)pc, ps, po, hs, group, k0, kc, buf); break;
                }
                /* rows spread evenly over passes, as in skinny.c (7 rows go 4 + 3) */
                for (long pass = 0, m0 = 0; pass < passes; pass++) {
                    const int mr = (int)((M - m0) / (passes - pass) + ((M - m0) % (passes - pass) != 0));
                    TILES[mr](x + m0 * K + k0, K, buf, kc, acc + m0 * PANEL);
                    m0 += mr;
                }
            }
            const long col0 = p * PANEL;
            const int ncols = (int)(N - col0 < PANEL ? N - col0 : PANEL);
            for (long r = 0; r < M; r++) {
                float *yr = y + r * ldy + col0;
                const float *o = acc + r * PANEL;
                for (int j = 0; j < ncols; j++) {
                    const float val = bias ? o[j] + bias[col0 + j] : o[j];
                    yr[j] = accumulate ? yr[j] + val : val;
                }
            }
        }
        free(acc);
        free(wide);
    }
}

/*
 * Rows ids[0..n-1] of a row-form weight (QuantRows: codes [rows, K], int8 for q8 and uint8 for
 * q4 and q6; scales, offsets [rows, K / group]) decoded to fp32 out[n, K]: an embedding lookup. The
 * values QuantRows.dequantize gives: code * scale (q6: (code - 32) * scale), then + offset (q4;
 * the product is exact).
 * Returns 0, or -1 when an id is outside 0..nrows-1 (nothing decoded past it).
 *
 * Why: the lookup runs on every target forward and every draft level; as torch ops (two
 * index_selects, a widening, a broadcast product) it cost ~29 us for one token.
 */
int dequantize_rows(int kind, long group, const void *codes, const float *scales, const float *offsets, long nrows,
                    long K, const long *ids, long n, float *out) {
    const long ng = K / group;
    for (long i = 0; i < n; i++) {
        const long r = ids[i];
        if (r < 0 || r >= nrows) return -1;
        float *y = out + i * K;
        for (long g = 0; g < ng; g++) {
            const float s = scales[r * ng + g];
            float *yg = y + g * group;
            if (kind == KIND_Q8) {
                const int8_t *c = (const int8_t *)codes + r * K + g * group;
                for (long j = 0; j < group; j++) yg[j] = (float)c[j] * s;
            } else {
                const uint8_t *c = (const uint8_t *)codes + r * K + g * group;
                const int bias = kind == KIND_Q6 ? Q6_BIAS : 0;
                for (long j = 0; j < group; j++) yg[j] = (float)(c[j] - bias) * s;
            }
            if (offsets) {
                const float o = offsets[r * ng + g];
                for (long j = 0; j < group; j++) yg[j] = yg[j] + o;
            }
        }
    }
    return 0;
}
