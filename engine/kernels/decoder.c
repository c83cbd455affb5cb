/*
 * A run of Llama decoder layers in one call: the same kernels the Python forward calls one by one
 * (rms_norm, skinny_linear / stored_linear, tree_attention, silu_mul), in the same order on the
 * same buffers, plus the rotary rotation and the KV cache writes.
 *
 * Why: once the matrix products read 4-bit weights, a one-token forward of the 135M model spends
 * about a third of its time between kernels: ~18 us of Python, ctypes and torch bookkeeping per
 * product and ~10 small torch ops per layer, 4-5 ms a token against ~10 ms of arithmetic. Here a
 * layer costs eight OpenMP regions and no Python at all.
 *
 * Exactness: every step is the very kernel the Python path calls, with the same arguments, so
 * the two paths agree bit for bit. The rotation is the complex product torch computes for
 * ``pairs * factors`` on complex64, (a + bi)(c + di) = (ac - bd) + (ad + bc)i with each product
 * and each sum rounded once; the library is built with -ffp-contract=off so the compiler cannot
 * fuse them into FMAs.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"

/* One head's K or V row into the cache: as is (fp32), or rounded to fp16 (kv16), to nearest even
 * as torch's .half() rounds, so the per-op path's tensor assignment writes the same bits. */
static __attribute__((target("avx2,f16c"))) void put_row(void *cache, long at, const float *row, long hd, int kv16) {
    if (!kv16) {
        memcpy((float *)cache + at, row, sizeof(float) * (size_t)hd);
        return;
    }
    unsigned short *dst = (unsigned short *)cache + at;
    for (long j = 0; j < hd; j += 8)
        _mm_storeu_si128((__m128i *)(dst + j), _mm256_cvtps_ph(_mm256_loadu_ps(row + j), _MM_FROUND_TO_NEAREST_INT));
}

/*
 * The layers on x: [T, hidden] (updated in place, the residual stream). kc, vc: the first of
 * these layers' K/V caches, [kv_heads, cap, head_dim] each, fp32 or (d->kv16) fp16 values,
 * consecutive layers layer_stride values apart. rot: [T][head_dim] (cos, sin) pairs. Token t's K/V go to slot slots[t] when
 * slots is given (rows mode: attention over seg[t]..slots[t], see rows_attention), else to slot
 * L + t (one sequence: attention over the L cached slots and the tree / causal new ones).
 *
 * Capture: the residual stream entering layer cap_at[c] (nlayers: the last layer's output, before
 * the final norm) is copied to cap_out[t][c][0..hidden), so the features an EAGLE-3 head reads come
 * out of the same call, side by side in cap_at's order (ncap 0: none).
 */
static void capture(const float *x, long T, long H, long li, const long *cap_at, long ncap, float *cap_out) {
    for (long c = 0; c < ncap; c++)
        if (cap_at[c] == li)
            for (long t = 0; t < T; t++) memcpy(cap_out + (t * ncap + c) * H, x + t * H, sizeof(float) * (size_t)H);
}

/* Row by row across the threads once there are enough rows to pay for the parallel region (each
 * row's arithmetic is the one-row call's, so the bits do not depend on the split): at 16 rows
 * SiLU*up was 2.6% of a forward's samples, run by one thread while the other waited. */
static void silu_mul_rows(const float *gu, long T, long I, float *out, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (T >= 8)
    for (long t = 0; t < T; t++) silu_mul(gu + t * 2 * I, 1, I, out + t * I);
}

static void rms_norm_rows(const float *x, long T, long H, const float *w, float eps, float *out, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (T >= 32)
    for (long t = 0; t < T; t++) rms_norm(x + t * H, 1, H, w, eps, out + t * H);
}

static int run_layers(const layer_t *layers, long nlayers, const dims_t *d, float *x, long T, void *kc, void *vc,
                      long layer_stride, long cap, long L, const float *rot, const unsigned char *tree,
                      const long *positions, const long *seg, const long *slots, const long *cap_at, long ncap,
                      float *cap_out) {
    const long H = d->hidden, nh = d->heads, nkv = d->kv_heads, hd = d->head_dim, I = d->inter;
    const int nt = (int)d->nthreads, kv16 = (int)d->kv16;
    const long qkv_w = (nh + 2 * nkv) * hd, esize = kv16 ? 2 : 4;
    float *h = malloc(sizeof(float) * (size_t)(T * (H + qkv_w + nh * hd + 3 * I)));
    if (!h) return -1;
    float *qkv = h + T * H, *att = qkv + T * qkv_w, *gu = att + T * nh * hd, *act = gu + T * 2 * I;
    for (long li = 0; li < nlayers; li++) {
        const layer_t *l = &layers[li];
        capture(x, T, H, li, cap_at, ncap, cap_out);
        char *kl = (char *)kc + li * layer_stride * esize, *vl = (char *)vc + li * layer_stride * esize;
        rms_norm_rows(x, T, H, l->ln_attn, d->eps, h, nt);
        linear(&l->qkv, h, T, qkv, 0, nt, (int)d->fast);
        rotate(qkv, T, qkv_w, nh + nkv, hd, rot);
        for (long t = 0; t < T; t++) {
            const long slot = slots ? slots[t] : L + t;
            for (long g = 0; g < nkv; g++) {
                const float *row = qkv + t * qkv_w + (nh + g) * hd;
                put_row(kl, (g * cap + slot) * hd, row, hd, kv16);
                put_row(vl, (g * cap + slot) * hd, row + nkv * hd, hd, kv16);
            }
        }
        if (slots)
            rows_attention(qkv, qkv_w, kl, vl, cap, T, (int)nh, (int)nkv, (int)hd, seg, slots, d->window, positions,
                           d->scale, att, nt, kv16);
        else
            tree_attention(qkv, qkv_w, kl, vl, cap, L, T, (int)nh, (int)nkv, (int)hd, tree, d->window, positions,
                           d->scale, att, nt, kv16);
        linear(&l->o, att, T, x, 1, nt, (int)d->fast);
        rms_norm_rows(x, T, H, l->ln_mlp, d->eps, h, nt);
        linear(&l->gate_up, h, T, gu, 0, nt, (int)d->fast);
        silu_mul_rows(gu, T, I, act, nt);
        linear(&l->down, act, T, x, 1, nt, (int)d->fast);
    }
    capture(x, T, H, nlayers, cap_at, ncap, cap_out);
    free(h);
    return 0;
}

/*
 * One sequence: the T new tokens are written at slots L..L+T-1; tree: [T, T] bytes or NULL
 * (causal); positions: [T] (read with a sliding window). Returns 0, or -1 when out of memory.
 */
int decoder_layers(const layer_t *layers, long nlayers, const dims_t *d, float *x, long T, void *kc, void *vc,
                   long layer_stride, long cap, long L, const float *rot, const unsigned char *tree,
                   const long *positions, const long *cap_at, long ncap, float *cap_out) {
    return run_layers(layers, nlayers, d, x, T, kc, vc, layer_stride, cap, L, rot, tree, positions, NULL, NULL, cap_at,
                      ncap, cap_out);
}

/*
 * Independent sequences in one call: token t belongs to the row whose slots start at seg[t],
 * is written at slots[t] and sees seg[t]..slots[t]; positions[t] = slots[t] - seg[t].
 */
int decoder_rows(const layer_t *layers, long nlayers, const dims_t *d, float *x, long T, void *kc, void *vc,
                 long layer_stride, long cap, const float *rot, const long *positions, const long *seg,
                 const long *slots, const long *cap_at, long ncap, float *cap_out) {
    return run_layers(layers, nlayers, d, x, T, kc, vc, layer_stride, cap, 0, rot, NULL, positions, seg, slots, cap_at,
                      ncap, cap_out);
}
