/*
 * The fast precision's tile on CPUs with AMX-INT8 (Intel Sapphire Rapids and later): each group's
 * integer dot products for up to 16 rows by one 16-column panel in a single tile instruction,
 * then the same float steps as the VNNI tile (fast.c), row by row.
 *
 * Why: a tree verify or a prefill chunk of 16 rows spends most of its time in vpdpbusd, eight
 * per row per group (perf, 135M model, 16 rows: the q4 and q8 tiles were 45% of the samples, at
 * the VNNI port's limit), while one tdpbsud does all 16 rows' 8 x 64 products in the tile unit,
 * beside the vector ports, which are left with the scaling. One row stays on the VNNI tile: it is
 * bound by streaming the weights, and a 16-row tile would only add work.
 *
 * Same bits as the VNNI tile: a group's integer sum is exact however it is formed (at most
 * 32 * 127 * 127 in magnitude). q4 codes are unsigned and the activations signed: tdpbsud. q8
 * codes are signed: tdpbssd sums w * x directly, where vpdpbusd needed w + 128 and the row's
 * block sum to take it back out. Each sum is then scaled by g32_scale (fast.h), the VNNI tile's
 * own function, into the row's accumulator in group order, and the offset term after it as
 * fast.c adds it.
 *
 * The A tile always loads 16 rows (the caller pads the activations, and ignores rows past its
 * own), so one tile configuration serves every call. Groups are pipelined over two sets of tiles
 * (tile_amx says why and how).
 *
 * Linux hands a process the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM), once;
 * a kernel that refuses leaves fast_amx_available() at 0 and the VNNI tile in use.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fast.h"

#define AMX __attribute__((target(VNNI_TARGETS ",amx-tile,amx-int8")))
#define AMX_ROWS 16
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int amx_state = -1; /* 1: the CPU has AMX-INT8 and the kernel granted tile state; 0: not */

/* Whether the AMX tile can run in this process (asks the kernel for tile state the first time). */
int fast_amx_available(void) {
    if (amx_state < 0) {
        __builtin_cpu_init();
        amx_state = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
                    __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                    syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return amx_state;
}

/* This thread's tiles: C in 0 and 1 (16 rows x 16 int32), A in 2 and 3 (16 rows x 32 bytes), B in
 * 4 and 5 (8 rows x 64 bytes: a group's 32 k, four per column lane). Two of each: even and odd
 * groups. Tile state belongs to the thread, so every thread of a product configures its own. */
AMX void fast_amx_begin(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) {
        c.rows[t] = AMX_ROWS, c.colsb[t] = PANEL * 4;
        c.rows[2 + t] = AMX_ROWS, c.colsb[2 + t] = 32;
        c.rows[4 + t] = 8, c.colsb[4 + t] = 64;
    }
    /* gcc 12 drops the stores above as dead (it does not see ldtilecfg read them): a barrier that
     * reads the whole struct keeps them */
    __asm__ volatile("" : : "m"(c) : "memory");
    _tile_loadconfig(&c);
}

/* Give the tile state back (a thread holding it makes every context switch save 8 KB more). */
AMX void fast_amx_end(void) { _tile_release(); }

/* Group g's codes into the B buffer b: eight 64-byte rows, four k per column lane. */
static inline __attribute__((always_inline)) AMX void unpack(const int q4, const void *codes, long g, uint8_t *b) {
    __m512i wv[8];
    g32_codes(q4, codes, g, wv);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) _mm512_store_si512(b + 64 * j, wv[j]);
}

/* Group products into C tile `slot` (0 or 1): B from an unpacked buffer, A from 16 rows of
 * activations K bytes apart. Tile numbers must be constants, hence the macro. */
#define TILE_PRODUCTS(C, A, B)                                                                                      \
    do {                                                                                                            \
        _tile_loadd(B, b, 64);                                                                                      \
        _tile_loadd(A, xa, K);                                                                                      \
        _tile_zero(C);                                                                                              \
        if (q4)                                                                                                     \
            _tile_dpbsud(C, A, B);                                                                                  \
        else                                                                                                        \
            _tile_dpbssd(C, A, B);                                                                                  \
    } while (0)

static inline __attribute__((always_inline)) AMX void products(const int q4, const int slot, const int8_t *xa, long K,
                                                                const uint8_t *b) {
    if (slot)
        TILE_PRODUCTS(1, 3, 5);
    else
        TILE_PRODUCTS(0, 2, 4);
}

/*
 * MR rows (<= 16) by one panel; xq must hold 16 readable rows of K bytes from its start.
 *
 * A software pipeline, because the tile unit waits on memory written just before: a tile load of
 * codes stored by vector stores the instruction before, and vector loads of a tile stored the
 * instruction before, stalled for most of the first version's time (perf: 60% of its samples on
 * the instructions after tileloadd and tdpbsud). So in step g the products of group g run from
 * codes unpacked in step g-1, the codes of group g+1 are unpacked, the sums of group g-2 (stored
 * in step g-2) are scaled, and group g's sums are stored last.
 */
static inline __attribute__((always_inline)) AMX void
tile_amx(const int MR, const int q4, const int8_t *xq, long K, const float *xd, const float *xc, const void *codes,
         const void *sc, const void *of, int hs, float *out) {
    const long ng = K / 32;
    uint8_t b[2][512] __attribute__((aligned(64)));
    int32_t c[2][AMX_ROWS * PANEL] __attribute__((aligned(64)));
    __m512 acc[AMX_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    unpack(q4, codes, 0, b[0]);
    __m512 fs = _mm512_setzero_ps(), fo = _mm512_setzero_ps(); /* the super-block's factor rows */
    for (long g = 0; g < ng + 2; g++) {
        const int slot = (int)(g & 1);
        if (g < ng) products(q4, slot, xq + g * 32, K, b[slot]);
        if (g + 1 < ng) {
            unpack(q4, codes, g + 1, b[1 - slot]);
            g32_prefetch(q4, codes, sc, of, K, g + 1, hs);
        }
        if (g >= 2) { /* group h's sums, stored two steps ago, into the rows' accumulators */
            const long h = g - 2;
            const int32_t *ch = c[slot];
            const __m512 s = group_scales_next(sc, h, hs, &fs);
            if (of) {
                const __m512 o = group_scales_next(of, h, hs, &fo);
#pragma GCC unroll 16
                for (int r = 0; r < MR; r++) {
                    acc[r] = g32_scale(acc[r], _mm512_load_si512(ch + r * PANEL), s, xd[r * ng + h]);
                    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(o, _mm512_set1_ps(xc[r * ng + h])));
                }
            } else {
#pragma GCC unroll 16
                for (int r = 0; r < MR; r++)
                    acc[r] = g32_scale(acc[r], _mm512_load_si512(ch + r * PANEL), s, xd[r * ng + h]);
            }
        }
        if (g < ng) {
            if (slot)
                _tile_stored(1, c[1], PANEL * 4);
            else
                _tile_stored(0, c[0], PANEL * 4);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * PANEL, acc[r]);
}

typedef void (*amx_fn)(const int8_t *, long, const float *, const float *, const void *, const void *, const void *,
                       int, float *);
#define ATILE(n)                                                                                                    \
    static AMX void amx_q4_##n(const int8_t *xq, long K, const float *xd, const float *xc, const void *c,         \
                               const void *s, const void *o, int hs, float *out) {                                \
        tile_amx(n, 1, xq, K, xd, xc, c, s, o, hs, out);                                                           \
    }                                                                                                               \
    static AMX void amx_q8_##n(const int8_t *xq, long K, const float *xd, const float *xc, const void *c,         \
                               const void *s, const void *o, int hs, float *out) {                                \
        tile_amx(n, 0, xq, K, xd, xc, c, s, o, hs, out);                                                           \
    }
/* Only the row counts that reach this tile (AMX_MIN_ROWS..16, fast.h) are compiled. */
_Static_assert(AMX_MIN_ROWS == 12, "instantiate tile_amx for every row count from AMX_MIN_ROWS to 16");
ATILE(12) ATILE(13) ATILE(14) ATILE(15) ATILE(16)
static const amx_fn AMX_Q4[AMX_ROWS + 1] = {[12] = amx_q4_12, amx_q4_13, amx_q4_14, amx_q4_15, amx_q4_16};
static const amx_fn AMX_Q8[AMX_ROWS + 1] = {[12] = amx_q8_12, amx_q8_13, amx_q8_14, amx_q8_15, amx_q8_16};

/* mr rows (AMX_MIN_ROWS..16) of a group-32 panel on the AMX tile (fast_amx_begin first, this thread). */
void fast_amx_tile(int mr, int q4, const int8_t *xq, long K, const float *xd, const float *xc, const void *codes,
                   const void *sc, const void *of, int hs, float *out) {
    (q4 ? AMX_Q4 : AMX_Q8)[mr](xq, K, xd, xc, codes, sc, of, hs, out);
}
