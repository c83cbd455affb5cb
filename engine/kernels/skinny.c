/*
 * Skinny fp32 matrix products for CPUs with AVX2 + FMA: y[M, N] = x[M, K] @ W[N, K]^T (+ bias).
 *
 * Why our own kernel: on a CPU the cost of verifying a draft tree (2-64 rows times every weight
 * matrix) decides whether speculative decoding pays. The stock fp32 paths (MKL sgemm, oneDNN,
 * a batched product over column blocks) leave half the machine idle at those shapes. Here the
 * weight is packed once into 16-column panels, each panel a contiguous [K][16] stream read from
 * DRAM exactly once per call, and up to six rows reuse every panel line from registers
 * (a 6x16 register tile: 12 accumulators, 2 weight vectors, 1 broadcast).
 *
 * Exactness: every output element is one fused multiply-add chain over k = 0..K-1 starting
 * from zero, whatever M is and whichever tile a row falls in. A row's result is therefore
 * bit-identical whether it is computed alone (plain decoding) or inside a tree (verification),
 * which is what keeps greedy speculation token-for-token equal to the baseline.
 *
 * Threads: one OpenMP loop over panels. The library links the process's libgomp (the one torch
 * already loaded), so it shares torch's thread team instead of starting a second one.
 */
#include <immintrin.h>

#define PANEL 16
#define MAX_ROWS 6
#define AVX2 __attribute__((target("avx2,fma")))

/* One register tile: MR rows (1..6) times one 16-column panel, written to out[MR][16]. */
static inline __attribute__((always_inline)) AVX2 void
tile(const int MR, const float *x, long ldx, const float *w, long K, float *out) {
    const __m256 z = _mm256_setzero_ps();
    __m256 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z;
    __m256 a30 = z, a31 = z, a40 = z, a41 = z, a50 = z, a51 = z;
#define ROW(r)                                                   \
    if (MR > r) {                                                \
        const __m256 b = _mm256_broadcast_ss(x + r * ldx + k);   \
        a##r##0 = _mm256_fmadd_ps(b, w0, a##r##0);               \
        a##r##1 = _mm256_fmadd_ps(b, w1, a##r##1);               \
    }
    for (long k = 0; k < K; k++) {
        const __m256 w0 = _mm256_loadu_ps(w + k * PANEL);
        const __m256 w1 = _mm256_loadu_ps(w + k * PANEL + 8);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
    }
#undef ROW
#define STORE(r)                                                 \
    if (MR > r) {                                                \
        _mm256_storeu_ps(out + r * PANEL, a##r##0);              \
        _mm256_storeu_ps(out + r * PANEL + 8, a##r##1);          \
    }
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
#undef STORE
}

typedef void (*tile_fn)(const float *, long, const float *, long, float *);
#define TILE(n) \
    static AVX2 void tile##n(const float *x, long ldx, const float *w, long K, float *o) { tile(n, x, ldx, w, K, o); }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
static const tile_fn TILES[MAX_ROWS + 1] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

/* 1 when this CPU can run the kernel; checked before the first call. */
int skinny_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/*
 * x: [M, K] row-major; panels: [ceil(N/16), K, 16] (columns past N are zero padding);
 * bias: [N] or NULL; y: [M, N] row-major. accumulate: y += result (a fused residual add).
 */
void skinny_linear(const float *x, long M, long K, const float *panels, long N, const float *bias, float *y,
                   int accumulate, int nthreads) {
    const long npanels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long p = 0; p < npanels; p++) {
        const float *w = panels + p * K * PANEL;
        const long col0 = p * PANEL;
        const int ncols = (int)(N - col0 < PANEL ? N - col0 : PANEL);
        float out[MAX_ROWS * PANEL];
        /* as few passes over the panel as the registers allow, with rows spread evenly: a
         * short pass is FMA-latency-bound (4 cycles per k whatever its rows), so 7 rows go
         * 4 + 3, not 6 + 1 */
        const long passes = (M + MAX_ROWS - 1) / MAX_ROWS;
        for (long pass = 0, m0 = 0; pass < passes; pass++) {
            const int mr = (int)((M - m0) / (passes - pass) + ((M - m0) % (passes - pass) != 0));
            TILES[mr](x + m0 * K, K, w, K, out);
            for (int r = 0; r < mr; r++) {
                float *yr = y + (m0 + r) * N + col0;
                const float *o = out + r * PANEL;
                for (int j = 0; j < ncols; j++) {
                    const float val = bias ? o[j] + bias[col0 + j] : o[j];
                    yr[j] = accumulate ? yr[j] + val : val;
                }
            }
            m0 += mr;
        }
    }
}
