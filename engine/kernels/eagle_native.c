/*
 * One EAGLE head forward (EAGLE-3, or EAGLE-1/2) over T entries in one call: the whole draft
 * level of a tree, or the catch-up over newly committed positions.
 *
 * Why: the head is ~9 M parameters against the target's 135 M, so a level should cost a small
 * fraction of a target step; run as ~20 torch operations with their Python between, a level cost
 * as much as the arithmetic of several. Here it is the kernels the per-op path calls (rms_norm,
 * the stored / fp32 products in either precision, the rotation, attention over listed keys,
 * silu_mul), in the same order on the same buffers, so the two agree bit for bit
 * (tests/test_eagle_native.py).
 *
 *   EAGLE-3: h = fc(stream) when the stream is the target's features (width != hidden), else the
 *            stream (the parent's output); a = [rms(e, ln_in) | rms(h, ln_hidden)]
 *   EAGLE-1/2: h = a = fc([e | stream])
 *   then qkv(a), rotation, K/V to the head cache at slots[t], attention over each entry's listed
 *   keys, x = h + o(att), g = x + down(silu(gate) * up)(rms(x, ln_post)); logits = lm_head(rms(g,
 *   norm)) (EAGLE-3) or lm_head(g) when asked for, as log-probabilities, with each row's best topk
 *   (log_softmax_topk in ops.c says why they are picked here).
 */
#include <stdlib.h>
#include <string.h>

#include "layers.h"

void keyed_attention(const float *q, long q_stride, const void *k, const void *v, long cap, long T, int nh,
                     int nkv, int hd, const long *first, const long *last, const int *extra, long max_extra,
                     const int *nextra, long window, const long *positions, float scale, float *out, int nthreads,
                     int kv16);
void log_softmax_topk(float *x, long R, long V, long k, const long *vocab, long *ids, float *vals);

typedef struct {
    const float *ln_in, *ln_hidden, *ln_post, *norm; /* NULL where the head has none (EAGLE-1/2) */
    lin_t fc, qkv, o, gate_up, down, lm_head;
    long eagle3;
} head_t;

/*
 * emb: [T, H] token embeddings; stream: [T, F]; kc, vc: the head's one-layer cache
 * [kv_heads, cap, head_dim]; slots: where each entry's K/V go (NULL: start, start + 1, ...); table:
 * the rotary factors of positions 0..table_len-1, [table_len][head_dim] (cos, sin pairs); positions:
 * [T] each entry's (NULL: its slot);
 * first / last / extra / nextra: the keys each entry sees (keyed_attention; no window), or first NULL for
 * a catch-up: entry t sees slots 0..slots[t]. g_out: [T, H];
 * logp_out: [nlogits, vocab] log-probabilities for the last nlogits entries (0: none); with topk > 0,
 * each of those rows' topk best as target ids (through vocab[], or head indices where it is NULL) in
 * top_ids and their log-probabilities in top_vals, [nlogits, topk]. Returns 0, -1 when out of memory, -2
 * for a position outside the table (nothing written).
 */
int eagle_head_forward(const head_t *hd_, const dims_t *d, const float *emb, const float *stream, long F, long T,
                       float *kc, float *vc, long cap, const long *slots, long start, const float *table, long table_len,
                       const long *positions, const long *first,
                       const long *last, const int *extra, long max_extra, const int *nextra, float *g_out, long nlogits,
                       float *logp_out, long topk, const long *vocab, long *top_ids, float *top_vals) {
    const long H = d->hidden, nh = d->heads, nkv = d->kv_heads, hd = d->head_dim, I = d->inter;
    const int nt = (int)d->nthreads, fast = (int)d->fast;
    const long qkv_w = (nh + 2 * nkv) * hd;
    /* 3T longs: the slots start.. where none are given, then a catch-up's first / last keys below */
    long *own = malloc(sizeof(long) * (size_t)(3 * T));
    if (!own) return -1;
    if (!slots) {
        for (long t = 0; t < T; t++) own[t] = start + t;
        slots = own;
    }
    if (!positions) positions = slots; /* a catch-up: each entry at its own slot */
    for (long t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= table_len) {
            free(own);
            return -2;
        }
    float *buf = malloc(sizeof(float) * (size_t)(T * (2 * H + qkv_w + nh * hd + 3 * I + H + hd)));
    if (!buf) {
        free(own);
        return -1;
    }
    float *a = buf, *qkv = a + T * 2 * H, *att = qkv + T * qkv_w, *gu = att + T * nh * hd, *act = gu + T * 2 * I;
    float *h = act + T * I, *rot = h + T * H;
    for (long t = 0; t < T; t++) memcpy(rot + t * hd, table + positions[t] * hd, sizeof(float) * (size_t)hd);
    if (!first) { /* keys 0..slots[t]: built here, not as four host tensors a step */
        long *causal = own + T;
        memset(causal, 0, sizeof(long) * (size_t)T);
        memcpy(causal + T, slots, sizeof(long) * (size_t)T);
        first = causal, last = causal + T, extra = NULL, max_extra = 0, nextra = NULL;
    }
    if (hd_->eagle3) {
        if (F != H)
            linear(&hd_->fc, stream, T, h, 0, nt, fast);
        else
            memcpy(h, stream, sizeof(float) * (size_t)(T * H));
        float *tmp = qkv; /* free until the product below: the two normed halves, then interleaved */
        rms_norm(emb, T, H, hd_->ln_in, d->eps, tmp);
        rms_norm(h, T, H, hd_->ln_hidden, d->eps, tmp + T * H);
        for (long t = 0; t < T; t++) {
            memcpy(a + t * 2 * H, tmp + t * H, sizeof(float) * (size_t)H);
            memcpy(a + t * 2 * H + H, tmp + T * H + t * H, sizeof(float) * (size_t)H);
        }
        linear(&hd_->qkv, a, T, qkv, 0, nt, fast);
    } else {
        for (long t = 0; t < T; t++) {
            memcpy(a + t * 2 * H, emb + t * H, sizeof(float) * (size_t)H);
            memcpy(a + t * 2 * H + H, stream + t * F, sizeof(float) * (size_t)H);
        }
        linear(&hd_->fc, a, T, h, 0, nt, fast);
        linear(&hd_->qkv, h, T, qkv, 0, nt, fast);
    }
    rotate(qkv, T, qkv_w, nh + nkv, hd, rot);
    for (long t = 0; t < T; t++)
        for (long g = 0; g < nkv; g++) {
            const float *row = qkv + t * qkv_w + (nh + g) * hd;
            memcpy(kc + (g * cap + slots[t]) * hd, row, sizeof(float) * (size_t)hd);
            memcpy(vc + (g * cap + slots[t]) * hd, row + nkv * hd, sizeof(float) * (size_t)hd);
        }
    keyed_attention(qkv, qkv_w, kc, vc, cap, T, (int)nh, (int)nkv, (int)hd, first, last, extra, max_extra, nextra, 0,
                    NULL, d->scale, att, nt, 0); /* the head's own cache is fp32 */
    memcpy(g_out, h, sizeof(float) * (size_t)(T * H));
    linear(&hd_->o, att, T, g_out, 1, nt, fast);
    rms_norm(g_out, T, H, hd_->ln_post, d->eps, a);
    linear(&hd_->gate_up, a, T, gu, 0, nt, fast);
    silu_mul(gu, T, I, act);
    linear(&hd_->down, act, T, g_out, 1, nt, fast);
    if (nlogits > 0) {
        const float *y = g_out + (T - nlogits) * H;
        if (hd_->norm) {
            rms_norm(y, nlogits, H, hd_->norm, d->eps, a);
            y = a;
        }
        linear(&hd_->lm_head, y, nlogits, logp_out, 0, nt, fast);
        log_softmax_topk(logp_out, nlogits, hd_->lm_head.n, topk, vocab, top_ids, top_vals);
    }
    free(buf);
    free(own);
    return 0;
}
