/* The n-gram corpus's draft tree in one call (engine/drafters/ngram_corpus.py: CorpusIndex.tree is
 * the reference, and the tests hold the two equal node for node).
 *
 * Why C, and a hash table: the tree is ~8 lookups of up to 4 hashes each, run right after a target
 * forward has streamed ~100 MB of weights through the caches. In Python (numpy's binary search
 * over ~1M sorted hashes) a tree took ~150 us in the decode loop against ~50 us warm, enough to
 * make the n-gram drafter cost over 5% of a step; the same binary search in C still ~80 us, most
 * of it cache misses (~20 probes a hash); a probe of the table touches ~2 lines.
 *
 * Arithmetic matches the Python's: 64-bit wrapping hashes, float64 probabilities
 * (count / (total + 1), path = parent path * p), candidates popped by largest path, ties by the
 * order they were pushed in.
 */
#include <stdint.h>

#define CORPUS_MUL 0x9E3779B97F4A7C15ULL
#define MAX_ORDER 16
#define MAX_NODES 256
#define MAX_CANDS 1024

typedef struct {
    double path, p;
    long tie, parent;
    int64_t token;
} cand_t;

/* the row of the longest n-gram (n <= max_n) ending ctx[0..n-1] that the index holds, or -1: each
 * order's hash looked up in the linear-probing table (ngram_corpus.hash_slots), longest first */
static long corpus_find(const uint64_t *keys, long m, const int32_t *slots, long bits, const int64_t *ctx,
                        long n, long max_n) {
    uint64_t hashes[MAX_ORDER];
    uint64_t h = 0;
    uint64_t mask = (1ULL << bits) - 1;
    long orders = n < max_n ? n : max_n;
    for (long j = 1; j <= orders; j++) {
        h = h * CORPUS_MUL + (uint64_t)ctx[n - j] + (uint64_t)j;
        hashes[j - 1] = h;
    }
    for (long j = orders; j >= 1; j--) {
        uint64_t key = hashes[j - 1];
        uint64_t s = (key * CORPUS_MUL) >> (64 - bits);
        /* bounded and range-checked: a damaged table file can cost a miss, never a hang or a stray read */
        for (uint64_t probes = 0; probes <= mask; probes++, s = (s + 1) & mask) {
            int32_t row = slots[s];
            if (row < 0) break;
            if (row < m && keys[row] == key) return row;
        }
    }
    return -1;
}

/* context: the last max_n - 1 history tokens and the root (nctx <= max_n). Writes up to
 * max_drafts + 1 nodes (the root first) and returns how many; -1 past this file's limits (the
 * caller then builds the tree in Python). */
long corpus_tree(const uint64_t *keys, long m, const int32_t *slots, long bits, const int32_t *tokens,
                 const int32_t *counts,
                 const int32_t *totals, long top, long max_n, const int64_t *context, long nctx,
                 long max_drafts, long width, double min_path,
                 int64_t *out_tokens, int64_t *out_parents, double *out_probs) {
    if (max_n < 1 || max_n > MAX_ORDER || nctx < 1 || nctx > max_n || max_drafts + 1 > MAX_NODES || bits < 1 ||
        bits > 62 || m < 0)
        return -1;
    int64_t ctxs[MAX_NODES][MAX_ORDER];  /* ~80 KB of stack in all */
    long lens[MAX_NODES];
    double paths[MAX_NODES];
    cand_t cands[MAX_CANDS];
    long ncands = 0, tie = 0, nodes = 1;
    long w = (width > 0 && width < top) ? width : top;
    for (long i = 0; i < nctx; i++) ctxs[0][i] = context[i];
    lens[0] = nctx;
    paths[0] = 1.0;
    out_tokens[0] = context[nctx - 1];
    out_parents[0] = -1;
    out_probs[0] = 1.0;
    long expand = 0;  /* the node whose children are pushed next */
    for (;;) {
        if (expand >= 0) {
            long row = corpus_find(keys, m, slots, bits, ctxs[expand], lens[expand], max_n);
            if (row >= 0) {
                double total = (double)totals[row] + 1.0;
                for (long r = 0; r < w; r++) {
                    int32_t t = tokens[row * top + r];
                    if (t < 0) break;
                    double p = (double)counts[row * top + r] / total;
                    double path = paths[expand] * p;
                    if (path >= min_path) {
                        if (ncands >= MAX_CANDS) return -1;
                        cands[ncands++] = (cand_t){path, p, tie++, expand, t};
                    }
                }
            }
        }
        if (ncands == 0 || nodes > max_drafts) break;
        long best = 0;
        for (long i = 1; i < ncands; i++)
            if (cands[i].path > cands[best].path || (cands[i].path == cands[best].path && cands[i].tie < cands[best].tie))
                best = i;
        cand_t c = cands[best];
        cands[best] = cands[--ncands];
        long node = nodes++;
        out_tokens[node] = c.token;
        out_parents[node] = c.parent;
        out_probs[node] = c.p;
        paths[node] = c.path;
        /* the child's context: its parent's last max_n - 1 tokens, then its own */
        long keep = lens[c.parent] < max_n - 1 ? lens[c.parent] : max_n - 1;
        for (long i = 0; i < keep; i++) ctxs[node][i] = ctxs[c.parent][lens[c.parent] - keep + i];
        ctxs[node][keep] = c.token;
        lens[node] = keep + 1;
        expand = nodes <= max_drafts ? node : -1;
    }
    return nodes;
}
