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
#include <stdlib.h>
#include <string.h>

void skinny_linear(const float *x, long M, long K, const float *panels, long N, const float *bias, float *y,
                   int accumulate, int nthreads);
void stored_linear(const float *x, long M, long K, int kind, long group, const void *codes, const float *scales,
                   const float *offsets, long N, const float *bias, float *y, long ldy, int accumulate,
                   int nthreads);
int stored_linear_fast(const float *x, long M, long K, int kind, long group, const void *codes, const float *scales,
                       const float *offsets, long N, const float *bias, float *y, long ldy, int accumulate,
                       int nthreads);
void rms_norm(const float *x, long T, long H, const float *w, float eps, float *out);
void silu_mul(const float *gu, long T, long I, float *out);
void tree_attention(const float *q, long q_stride, const float *k, const float *v, long cap, long L, long T,
                    int nh, int nkv, int hd, const unsigned char *tree, long window, const long *positions,
                    float scale, float *out, int nthreads);
void rows_attention(const float *q, long q_stride, const float *k, const float *v, long cap, long T, int nh,
                    int nkv, int hd, const long *seg, const long *slots, long window, const long *positions,
                    float scale, float *out, int nthreads);

#define MAX_PARTS 3

/* One stored-format block of output columns (see stored.c for the fields). */
typedef struct {
    long kind, group, n;
    const void *codes;
    const float *scales, *offsets;
} part_t;

/* A linear layer: fp32 panels for skinny_linear, or up to three stored parts side by side. */
typedef struct {
    const float *panels; /* NULL: use parts */
    long n, k, nparts;
    const float *bias;
    part_t parts[MAX_PARTS];
} lin_t;

typedef struct {
    const float *ln_attn, *ln_mlp;
    lin_t qkv, o, gate_up, down;
} layer_t;

typedef struct {
    long hidden, heads, kv_heads, head_dim, inter, window, nthreads;
    float eps, scale;
    long fast; /* 1: the fast precision's integer products (fast.c) where a part's kind allows */
} dims_t;

static void linear(const lin_t *l, const float *x, long M, float *y, int accumulate, int nthreads, int fast) {
    if (l->panels) {
        skinny_linear(x, M, l->k, l->panels, l->n, l->bias, y, accumulate, nthreads);
        return;
    }
    long col = 0;
    for (long i = 0; i < l->nparts; i++) {
        const part_t *p = &l->parts[i];
        const float *b = l->bias ? l->bias + col : NULL;
        if (!fast || stored_linear_fast(x, M, l->k, (int)p->kind, p->group, p->codes, p->scales, p->offsets, p->n, b,
                                        y + col, l->n, accumulate, nthreads) != 0)
            stored_linear(x, M, l->k, (int)p->kind, p->group, p->codes, p->scales, p->offsets, p->n, b, y + col, l->n,
                          accumulate, nthreads);
        col += p->n;
    }
}

/* Rotate the first `heads` heads of each row in place; rot: [T][hd/2] (cos, sin) pairs. */
static void rotate(float *rows, long T, long stride, long heads, long hd, const float *rot) {
    for (long t = 0; t < T; t++) {
        const float *f = rot + t * hd;
        for (long h = 0; h < heads; h++) {
            float *r = rows + t * stride + h * hd;
            for (long j = 0; j < hd; j += 2) {
                const float a = r[j], b = r[j + 1], c = f[j], d = f[j + 1];
                const float ac = a * c, bd = b * d, ad = a * d, bc = b * c;
                r[j] = ac - bd;
                r[j + 1] = ad + bc;
            }
        }
    }
}

/*
 * The layers on x: [T, hidden] (updated in place, the residual stream). kc, vc: the first of
 * these layers' K/V caches, [kv_heads, cap, head_dim] each, consecutive layers layer_stride
 * floats apart. rot: [T][head_dim] (cos, sin) pairs. Token t's K/V go to slot slots[t] when
 * slots is given (rows mode: attention over seg[t]..slots[t], see rows_attention), else to slot
 * L + t (one sequence: attention over the L cached slots and the tree / causal new ones).
 */
static int run_layers(const layer_t *layers, long nlayers, const dims_t *d, float *x, long T, float *kc, float *vc,
                      long layer_stride, long cap, long L, const float *rot, const unsigned char *tree,
                      const long *positions, const long *seg, const long *slots) {
    const long H = d->hidden, nh = d->heads, nkv = d->kv_heads, hd = d->head_dim, I = d->inter;
    const int nt = (int)d->nthreads;
    const long qkv_w = (nh + 2 * nkv) * hd;
    float *h = malloc(sizeof(float) * (size_t)(T * (H + qkv_w + nh * hd + 3 * I)));
    if (!h) return -1;
    float *qkv = h + T * H, *att = qkv + T * qkv_w, *gu = att + T * nh * hd, *act = gu + T * 2 * I;
    for (long li = 0; li < nlayers; li++) {
        const layer_t *l = &layers[li];
        float *kl = kc + li * layer_stride, *vl = vc + li * layer_stride;
        rms_norm(x, T, H, l->ln_attn, d->eps, h);
        linear(&l->qkv, h, T, qkv, 0, nt, (int)d->fast);
        rotate(qkv, T, qkv_w, nh + nkv, hd, rot);
        for (long t = 0; t < T; t++) {
            const long slot = slots ? slots[t] : L + t;
            for (long g = 0; g < nkv; g++) {
                const float *row = qkv + t * qkv_w + (nh + g) * hd;
                memcpy(kl + (g * cap + slot) * hd, row, sizeof(float) * (size_t)hd);
                memcpy(vl + (g * cap + slot) * hd, row + nkv * hd, sizeof(float) * (size_t)hd);
            }
        }
        if (slots)
            rows_attention(qkv, qkv_w, kl, vl, cap, T, (int)nh, (int)nkv, (int)hd, seg, slots, d->window, positions,
                           d->scale, att, nt);
        else
            tree_attention(qkv, qkv_w, kl, vl, cap, L, T, (int)nh, (int)nkv, (int)hd, tree, d->window, positions,
                           d->scale, att, nt);
        linear(&l->o, att, T, x, 1, nt, (int)d->fast);
        rms_norm(x, T, H, l->ln_mlp, d->eps, h);
        linear(&l->gate_up, h, T, gu, 0, nt, (int)d->fast);
        silu_mul(gu, T, I, act);
        linear(&l->down, act, T, x, 1, nt, (int)d->fast);
    }
    free(h);
    return 0;
}

/*
 * One sequence: the T new tokens are written at slots L..L+T-1; tree: [T, T] bytes or NULL
 * (causal); positions: [T] (read with a sliding window). Returns 0, or -1 when out of memory.
 */
int decoder_layers(const layer_t *layers, long nlayers, const dims_t *d, float *x, long T, float *kc, float *vc,
                   long layer_stride, long cap, long L, const float *rot, const unsigned char *tree,
                   const long *positions) {
    return run_layers(layers, nlayers, d, x, T, kc, vc, layer_stride, cap, L, rot, tree, positions, NULL, NULL);
}

/*
 * Independent sequences in one call: token t belongs to the row whose slots start at seg[t],
 * is written at slots[t] and sees seg[t]..slots[t]; positions[t] = slots[t] - seg[t].
 */
int decoder_rows(const layer_t *layers, long nlayers, const dims_t *d, float *x, long T, float *kc, float *vc,
                 long layer_stride, long cap, const float *rot, const long *positions, const long *seg,
                 const long *slots) {
    return run_layers(layers, nlayers, d, x, T, kc, vc, layer_stride, cap, 0, rot, NULL, positions, seg, slots);
}
