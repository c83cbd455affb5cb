/*
 * The 8-lane helpers ops.c and attention.c share: horizontal sums in one canonical order, exp()
 * (its body written once for 8 and 16 lanes) and a row's maximum.
 * Static inline, so each file gets its own copy with the same arithmetic.
 */
#ifndef SPECCHAT_VEC_H
#define SPECCHAT_VEC_H

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))


/* Sum of 8 lanes in the canonical order ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)), the order
 * hsum8x8 uses too, so a dot product's value does not depend on which path computed it. */
static inline AVX2 float hsum(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The 8 lane sums of v[0..7] in one vector, each in hsum's order. */
static inline AVX2 __m256 hsum8x8(const __m256 *v) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp(x) lane by lane on a W-bit register (256 or 512; ROUND: that width's round-to-integer):
 * range reduction by ln 2 and a degree-6 polynomial (about 1 ulp). One body for both widths, so a
 * lane computes the same bits in either (each step is exact or correctly rounded per lane). */
#define EXP_LANES(W, ROUND, x_in)                                                                                   \
    __extension__({                                                                                                \
        const __m##W x_ =                                                                                          \
            _mm##W##_min_ps(_mm##W##_max_ps((x_in), _mm##W##_set1_ps(-87.3f)), _mm##W##_set1_ps(88.7f));           \
        const __m##W n_ = ROUND(_mm##W##_mul_ps(x_, _mm##W##_set1_ps(1.44269504088896341f)),                       \
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                                     \
        __m##W r_ = _mm##W##_fnmadd_ps(n_, _mm##W##_set1_ps(0.693359375f), x_);                                    \
        r_ = _mm##W##_fnmadd_ps(n_, _mm##W##_set1_ps(-2.12194440e-4f), r_);                                        \
        __m##W p_ = _mm##W##_set1_ps(1.9875691500e-4f);                                                             \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(1.3981999507e-3f));                                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(8.3334519073e-3f));                                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(4.1665795894e-2f));                                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(1.6666665459e-1f));                                        \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(5.0000001201e-1f));                                        \
        p_ = _mm##W##_fmadd_ps(p_, _mm##W##_mul_ps(r_, r_), _mm##W##_add_ps(r_, _mm##W##_set1_ps(1.0f)));          \
        const __m##W##i e_ =                                                                                        \
            _mm##W##_slli_epi32(_mm##W##_add_epi32(_mm##W##_cvtps_epi32(n_), _mm##W##_set1_epi32(127)), 23);       \
        _mm##W##_mul_ps(p_, _mm##W##_castsi##W##_ps(e_));                                                          \
    })

/* exp(x) for 8 lanes (EXP_LANES; attention.c's exp16 is the 16-lane one). */
static inline AVX2 __m256 exp8(__m256 x) { return EXP_LANES(256, _mm256_round_ps, x); }

/* The largest of x[0..n-1], 8 lanes at a time. Why not a scalar loop: its compare-and-keep
 * chain cost a third of a tree verify's attention. Which of two equal (or +0/-0) values wins
 * cannot change the softmax below, so this equals the scalar answer for every use here. */
static inline AVX2 float max_of(const float *x, long n) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    long a = 0;
    for (; a + 8 <= n; a += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + a));
    float l[8];
    _mm256_storeu_ps(l, m8);
    float mx = l[0];
    for (int i = 1; i < 8; i++) mx = l[i] > mx ? l[i] : mx;
    for (; a < n; a++) mx = x[a] > mx ? x[a] : mx;
    return mx;
}

#endif
