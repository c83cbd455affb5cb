/*
 * Skinny fp32 matrix products for CPUs with AVX2 + FMA: y[M, N] = x[M, K] @ W[N, K]^T (+ bias).
 *
 * Why our own kernel: on a CPU the cost of verifying a draft tree (2-64 rows times every weight
 * matrix) decides whether speculative decoding pays. The stock fp32 paths (MKL sgemm, oneDNN,
 * a batched product over column blocks) leave half the machine idle at those shapes. Here the
 * weight is packed once into 16-column panels, each panel a contiguous [K][16] stream read from
 * DRAM exactly once per call, and up to six rows reuse every panel line from registers
 * (the 6x16 register tile of tile.h, shared with stored.c).
 *
 * Exactness: every output element is one fused multiply-add chain over k = 0..K-1 starting
 * from zero, whatever M is and whichever tile a row falls in. A row's result is therefore
 * bit-identical whether it is computed alone (plain decoding) or inside a tree (verification),
 * which is what keeps greedy speculation token-for-token equal to the baseline.
 *
 * Threads: one OpenMP loop over panels. The library links the process's libgomp (the one torch
 * already loaded), so it shares torch's thread team instead of starting a second one.
 */
#include <string.h>

#include "tile.h"

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
            memset(out, 0, sizeof(float) * mr * PANEL); /* the chains start from zero */
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
