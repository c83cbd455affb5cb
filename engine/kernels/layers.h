/*
 * What the native decoder (decoder.c) and the native EAGLE head (eagle_native.c) share: the C view of a
 * linear layer (fp32 panels or up to three stored-format parts), the product over it in either
 * precision, and the rotary rotation.
 */
#ifndef SPECCHAT_LAYERS_H
#define SPECCHAT_LAYERS_H

void skinny_linear(const float *x, long M, long K, const float *panels, long N, const float *bias, float *y,
                   int accumulate, int nthreads);
void stored_linear(const float *x, long M, long K, int kind, long group, const void *codes, const void *scales,
                   const void *offsets, long N, const float *bias, float *y, long ldy, int accumulate,
                   int nthreads, int hs);
int stored_linear_fast(const float *x, long M, long K, int kind, long group, const void *codes, const void *scales,
                       const void *offsets, long N, const float *bias, float *y, long ldy, int accumulate,
                       int nthreads, int hs);
void rms_norm(const float *x, long T, long H, const float *w, float eps, float *out);
void silu_mul(const float *gu, long T, long I, float *out);
/* Attention over a KV cache of fp32 values, or fp16 ones (kv16) */
void tree_attention(const float *q, long q_stride, const void *k, const void *v, long cap, long L, long T,
                    int nh, int nkv, int hd, const unsigned char *tree, long window, const long *positions,
                    float scale, float *out, int nthreads, int kv16);
void rows_attention(const float *q, long q_stride, const void *k, const void *v, long cap, long T, int nh,
                    int nkv, int hd, const long *seg, const long *slots, long window, const long *positions,
                    float scale, float *out, int nthreads, int kv16);

#define MAX_PARTS 3

/* One stored-format block of output columns (see stored.c for the fields); compact_scales /
 * compact_offsets: the compact copies of the scales and offsets both precisions read, stored as
 * scale_form says (scales.h: the exact fp16 copies, or a K-quant's factored form), or NULL
 * (scale_form 0: they read the fp32 ones). */
typedef struct {
    long kind, group, n;
    const void *codes;
    const float *scales, *offsets;
    const void *compact_scales, *compact_offsets;
    long scale_form;
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
    long kv16; /* 1: the KV cache holds fp16 values (the fast precision's cache), 0: fp32 */
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
        const int hs = p->compact_scales ? (int)p->scale_form : 0;
        const void *sc = hs ? p->compact_scales : (const void *)p->scales;
        const void *of = hs ? p->compact_offsets : (const void *)p->offsets;
        if (!fast || stored_linear_fast(x, M, l->k, (int)p->kind, p->group, p->codes, sc, of, p->n, b, y + col, l->n,
                                        accumulate, nthreads, hs) != 0)
            stored_linear(x, M, l->k, (int)p->kind, p->group, p->codes, sc, of, p->n, b, y + col, l->n, accumulate,
                          nthreads, hs);
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

#endif
