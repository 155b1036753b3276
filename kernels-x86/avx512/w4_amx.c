/* kernels-x86/avx512/w4_amx.c — the int4 cores of both paths on AMX-INT8 tiles, for 16 or
 * more activation rows (prompt processing); fewer rows go to the VNNI cores (w4_vnni.c,
 * w4_i16.c).
 *
 * A8 maps directly: the prepared x8 rows are A tiles (16 rows x 64 int8), the VPDPBUSD
 * core's two unpacked operands of each weight block are two rows of a B tile, and
 * TDPBSSD (codes 0..15 are valid signed bytes) gives the group's exact int32 dot.
 *
 * AMX multiplies bytes, the A16 path has int16 activations. The prepared x16 rows are used
 * as they are, as A tiles of 16 rows x 64 bytes (32 int16, little-endian: low byte, high
 * byte), against two B tiles made from the same 64-byte weight blocks:
 *   B_lo: each row's two codes in the low byte of each 16-bit half ([q, 0, q', 0]),
 *   B_hi: the same codes in the high bytes              ([0, q, 0, q']).
 * TDPBUSD(x16 bytes as unsigned, B_lo) sums lo(x) * q (the high bytes meet zeros) and
 * TDPBSSD(x16 bytes as signed, B_hi) sums hi(x) * q with hi(x) the signed high byte, so
 * x = 256 hi(x) + lo(x) gives the group's dot = C_lo + 256 C_hi, exactly in int32 (at most
 * 128 x 15 x 32767 < 2^26). Half of the byte products are with zero: the price of needing
 * no second copy of the activations. The B rows are the VPDPWSSD core's unpacked operands
 * ((v >> 4t) & 0x000f000f puts codes k0+t and k0+t+4 in the two halves of a row's lane,
 * matching the 0,4,1,5,2,6,3,7 order of the prepared activations), so B row i of a 32-k
 * chunk is unpack t = i % 4 of block i / 4.
 *
 * Each group's dot then goes through the ref twin's epilogue (w4_int_epilogue), group by
 * group in k order, so results are bit-identical to ref/w4_ref.c and every other table.
 *
 * Tiles: C 0..3 = {lo, hi} x two blocks of 16 activation rows, A 4..5 = those blocks' x16,
 * B 6..7 = B_lo, B_hi of one weight tile (16 output rows). Per 32-k chunk: 4 tile loads and
 * 4 tile multiplies. Per group the C tiles are stored and folded into fp32 accumulators
 * kept in a thread-local buffer (16 floats per activation row).
 *
 * Loop order: a pass takes as many activation rows as fit AMX_A_BYTES of x16 (32 to 256)
 * and runs every weight tile of the call over them, so the activations come from L2 and
 * the weights are streamed once per pass. Taking all 512 rows of a prompt (2 MiB of x16 at
 * k = 2048) in one pass made every tile re-read them from L3: 1.6x the VPDPWSSD core
 * instead of the tiles' rate. */
#include <immintrin.h>
#include <string.h>

#include "kernels-x86/avx512/w4_common.h"
#include "kernels-x86/w4_impl.h"

#define AMX_ROWS_CHUNK 256      /* most activation rows per pass over the weight tiles (f buffer) */
#define AMX_A_BYTES (512 << 10) /* x16 bytes of one pass: kept in L2 while every tile reads it */
/* Fewer activation rows go to the VNNI cores: at 16 rows the tiles are 1.4x (A16) and
 * 1.07x (A8, a 512 x 2048 expert) faster, at 8 and below the VNNI cores' multi-tile weight
 * streams win (benchmarks/kernels, 2 threads, this Xeon VM: A8 m = 8 expert 84 us on VNNI,
 * 105 us on tiles). */
#define AMX_MIN_ROWS 16
#define AMX_GS_MAX 128 /* largest group size (kern.h): 4 chunks */

/* The 64-byte LDTILECFG operand (palette 1). */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* The configuration this thread has loaded (amx_key). A thread loads another whenever it
 * needs other rows (the last, partial block of a call) or the other path's layout. */
static _Thread_local int cfg_loaded = -1;

static int amx_key(int r0, int r1, int a8) { return a8 * 1024 + r0 * 32 + r1; }

/* Tile rows for activation blocks of r0 (set 0) and r1 (set 1) rows. Layouts:
 *   A16: C 0, 1 = lo, hi of set 0; C 2, 3 = set 1; A 4 / 5 = set 0 / 1; B 6, 7 = B_lo, B_hi
 *        of the chunk (reloaded per chunk: a group has up to 8 B tiles);
 *   A8:  C 0 / 1 = set 0 / 1; A 2, 3 = chunks 0, 1 of set 0, A 4, 5 of set 1; B 6, 7 = the
 *        group's (at most 2) chunks, loaded once per group and kept while every block
 *        multiplies them, so no tile a multiply reads is reloaded behind it. */
static void amx_config(int r0, int r1, int a8) {
    const int key = amx_key(r0, r1, a8);
    if (key == cfg_loaded) return;
    _Alignas(64) amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int r16[8] = {r0, r0, r1, r1, r0, r1, 16, 16}, r8[8] = {r0, r1, r0, r0, r1, r1, 16, 16};
    const int *rows = a8 ? r8 : r16;
    for (int t = 0; t < 8; t++)
        if (rows[t]) {
            c.rows[t] = (uint8_t)rows[t];
            c.colsb[t] = 64;
        }
    _tile_loadconfig(&c);
    cfg_loaded = key;
}

/* The B tiles of every chunk of one group record (bpg blocks of 64 bytes):
 *   A16: B_lo / B_hi per 32-k chunk (b[0][c], b[1][c]); row i = unpack t = i % 4 of block
 *        i / 4, in the low / high bytes;
 *   A8:  one B per 64-k chunk (b[0][c]); rows 2i, 2i + 1 = the VPDPBUSD core's two
 *        operands of block i (codes of k0+{0,2,4,6} and k0+{1,3,5,7}, matching the prepared
 *        activations' 0,2,4,6,1,3,5,7 order).
 * The record two groups on (records and tiles are stored back to back) is prefetched: the
 * weights arrive in bursts between long runs of tile multiplies, which the hardware
 * prefetcher alone followed too late (perf: the block loads stalled on DRAM). */
W4_INLINE void amx_unpack_b(const uint8_t *rec, int32_t bpg, size_t rb,
                            uint8_t (*bt)[AMX_GS_MAX / 32][16 * 64], const int A8) {
    for (size_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)(rec + 2 * rb + o), _MM_HINT_T0);
    for (int32_t b = 0; b < bpg; b++) {
        const __m512i v = _mm512_loadu_si512(rec + (size_t)b * W4_BLOCK);
        if (A8) {
            const __m512i m0f = _mm512_set1_epi8(0x0f);
            uint8_t *row = bt[0][b / 8] + (size_t)(b % 8) * 2 * 64;
            _mm512_store_si512(row, _mm512_and_si512(v, m0f));
            _mm512_store_si512(row + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f));
        } else {
            const __m512i mask = _mm512_set1_epi32(0x000f000f);
            uint8_t *lo = bt[0][b / 4] + (size_t)(b % 4) * 4 * 64;
            uint8_t *hi = bt[1][b / 4] + (size_t)(b % 4) * 4 * 64;
            for (int t = 0; t < 4; t++) {
                const __m512i c = _mm512_and_si512(_mm512_srli_epi32(v, (unsigned)(4 * t)), mask);
                _mm512_store_si512(lo + t * 64, c);
                _mm512_store_si512(hi + t * 64, _mm512_slli_epi32(c, 8));
            }
        }
    }
}

/* Zero tile set `set`'s C tiles (0, 1 or 2, 3) and multiply the 16-row activation block at
 * a0 (row stride lda) by every chunk of the group's B tiles into them (A tile 4 or 5). */
W4_INLINE void amx_issue_set(const int set, const uint8_t *a0, size_t lda,
                             uint8_t (*bt)[AMX_GS_MAX / 32][16 * 64], int32_t nkc, const int A8) {
#define AMX_ISSUE(CL, CH, TA)                                                                      \
    do {                                                                                           \
        _tile_zero(CL);                                                                            \
        if (!A8) _tile_zero(CH);                                                                   \
        for (int32_t c = 0; c < nkc; c++) {                                                        \
            _tile_loadd(6, bt[0][c], 64);                                                          \
            if (!A8) _tile_loadd(7, bt[1][c], 64);                                                 \
            _tile_loadd(TA, a0 + (size_t)c * 64, lda);                                             \
            if (A8) {                                                                              \
                _tile_dpbssd(CL, TA, 6);                                                           \
            } else {                                                                               \
                _tile_dpbusd(CL, TA, 6);                                                           \
                _tile_dpbssd(CH, TA, 7);                                                           \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    if (A8) {
        if (set) {
            _tile_zero(1);
            _tile_loadd(4, a0, lda);
            if (nkc > 1) _tile_loadd(5, a0 + 64, lda);
            _tile_dpbssd(1, 4, 6);
            if (nkc > 1) _tile_dpbssd(1, 5, 7);
        } else {
            _tile_zero(0);
            _tile_loadd(2, a0, lda);
            if (nkc > 1) _tile_loadd(3, a0 + 64, lda);
            _tile_dpbssd(0, 2, 6);
            if (nkc > 1) _tile_dpbssd(0, 3, 7);
        }
    } else if (set) {
        AMX_ISSUE(2, 3, 5);
    } else {
        AMX_ISSUE(0, 1, 4);
    }
#undef AMX_ISSUE
}

/* A8: the group's B tiles into 6, 7 (after unpacking, and again after a configuration
 * load, which clears the tiles). */
W4_INLINE void amx_load_b8(uint8_t (*bt)[AMX_GS_MAX / 32][16 * 64], int32_t nkc) {
    _tile_loadd(6, bt[0][0], 64);
    if (nkc > 1) _tile_loadd(7, bt[0][1], 64);
}

/* Store tile set `set`'s C tiles to cb[0] (lo / the A8 dot) and cb[1] (hi). */
W4_INLINE void amx_store(const int set, int32_t (*cb)[16][16], const int A8) {
    if (A8) {
        if (set) _tile_stored(1, cb[0], 64);
        else
            _tile_stored(0, cb[0], 64);
    } else if (set) {
        _tile_stored(2, cb[0], 64);
        if (!A8) _tile_stored(3, cb[1], 64);
    } else {
        _tile_stored(0, cb[0], 64);
        if (!A8) _tile_stored(1, cb[1], 64);
    }
}

/* Fold one block's stored dots of group g into its rows' accumulators fr[0 .. rows): the
 * ref twin's epilogue. Activation row t0 + r, group column gx of the prepared steps/sums. */
W4_INLINE void amx_fold(int32_t (*cb)[16][16], float (*fr)[W4_TILE], int rows, int32_t t0,
                        int32_t Gx, int32_t gx, const uint8_t *rec, int32_t bpg,
                        const uint8_t *zeros, int32_t g, const float *xd, const int32_t *xsum,
                        const int A8) {
    for (int r = 0; r < rows; r++) {
        __m512i dot = _mm512_load_si512(cb[0][r]);
        if (!A8) dot = _mm512_add_epi32(dot, _mm512_slli_epi32(_mm512_load_si512(cb[1][r]), 8));
        const size_t tg = (size_t)(t0 + r) * (size_t)Gx + (size_t)gx;
        _mm512_store_ps(fr[r], w4_int_epilogue(_mm512_load_ps(fr[r]), rec, bpg, zeros, g, dot,
                                               xd[tg], xsum[tg]));
    }
}

/* The core of either path (A8 a compile-time constant): a w4_core_fn. */
W4_INLINE void amx_core(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                        const epyq_act *x, float *y, int32_t ldy, const float *rw, const int A8) {
    static _Thread_local _Alignas(64) uint8_t bt[2][AMX_GS_MAX / 32][16 * 64];
    static _Thread_local _Alignas(64) int32_t cbuf[2][2][16][16]; /* [set][lo, hi] */
    static _Thread_local _Alignas(64) float f[AMX_ROWS_CHUNK][W4_TILE];

    const uint8_t *xq;
    const float *xd;
    const int32_t *xsum;
    if (A8) {
        const w4_a8_view a = w4_a8_of(x);
        xq = (const uint8_t *)a.x8, xd = a.d, xsum = a.sum8;
    } else {
        const w4_a16_view a = w4_a16_of(x);
        xq = (const uint8_t *)a.x16, xd = a.d, xsum = a.sum16;
    }
    const int32_t m = x->m, kx = x->k, gs = w->gs, bpg = gs / W4_KBLK;
    const int32_t nkc = gs / (A8 ? 64 : 32), Gx = kx / gs;
    const size_t rb = w4_rec_bytes(gs), lda = (size_t)kx * (A8 ? 1u : 2u);
    const int32_t t_end = (n1 + W4_TILE - 1) / W4_TILE;

    int32_t chunk = (int32_t)(AMX_A_BYTES / lda) / 32 * 32;
    chunk = chunk < 32 ? 32 : chunk > AMX_ROWS_CHUNK ? AMX_ROWS_CHUNK : chunk;
    for (int32_t tc0 = 0; tc0 < m; tc0 += chunk) {
        const int32_t tc1 = tc0 + chunk < m ? tc0 + chunk : m;
        for (int32_t tile = n0 / W4_TILE; tile < t_end; tile++) {
            const uint8_t *tp = w4_tile_ptr(w, tile);
            const uint8_t *zeros = w->asym ? w4_tile_zeros(w, tp) : NULL;
            memset(f, 0, (size_t)(tc1 - tc0) * sizeof f[0]);
            for (int32_t g = g0; g < g1; g++) {
                const uint8_t *rec = tp + (size_t)g * rb;
                amx_unpack_b(rec, bpg, rb, bt, A8);
                if (A8 && cfg_loaded / 1024 == 1) amx_load_b8(bt, nkc);
                /* Blocks of 16 rows alternate between two tile sets, and a block's
                 * epilogue runs after the next block's multiplies are issued, so the
                 * vector units fold one block while the tiles multiply the next. */
                int pend = 0, pend_set = 0, pend_rows = 0;
                int32_t pend_t0 = 0;
                for (int32_t t0 = tc0, i = 0; t0 < tc1; t0 += 16, i++) {
                    const int rows = tc1 - t0 < 16 ? (int)(tc1 - t0) : 16, set = i & 1;
                    const int key = amx_key(set ? 16 : rows, set ? rows : 16, A8);
                    if (key != cfg_loaded) { /* loading a configuration clears the tiles */
                        if (pend) {
                            amx_store(pend_set, cbuf[pend_set], A8);
                            amx_fold(cbuf[pend_set], &f[pend_t0 - tc0], pend_rows, pend_t0, Gx,
                                     g - g0, rec, bpg, zeros, g, xd, xsum, A8);
                            pend = 0;
                        }
                        amx_config(set ? 16 : rows, set ? rows : 16, A8);
                        if (A8) amx_load_b8(bt, nkc);
                    }
                    const uint8_t *a0 =
                        xq +
                        ((size_t)t0 * (size_t)kx + (size_t)(g - g0) * (size_t)gs) * (A8 ? 1u : 2u);
                    amx_issue_set(set, a0, lda, bt, nkc, A8);
                    if (pend) {
                        amx_store(pend_set, cbuf[pend_set], A8);
                        amx_fold(cbuf[pend_set], &f[pend_t0 - tc0], pend_rows, pend_t0, Gx, g - g0,
                                 rec, bpg, zeros, g, xd, xsum, A8);
                    }
                    pend = 1, pend_set = set, pend_rows = rows, pend_t0 = t0;
                }
                if (pend) {
                    amx_store(pend_set, cbuf[pend_set], A8);
                    amx_fold(cbuf[pend_set], &f[pend_t0 - tc0], pend_rows, pend_t0, Gx, g - g0, rec,
                             bpg, zeros, g, xd, xsum, A8);
                }
            }
            const int32_t lo = tile * W4_TILE > n0 ? tile * W4_TILE : n0;
            const int32_t hi = tile * W4_TILE + W4_TILE < n1 ? tile * W4_TILE + W4_TILE : n1;
            for (int32_t t = tc0; t < tc1; t++) {
                __m512 v = _mm512_load_ps(f[t - tc0]);
                if (rw) v = _mm512_mul_ps(v, _mm512_set1_ps(rw[t]));
                w4_store_tile(y + (size_t)t * (size_t)ldy, n0, tile, lo, hi, v);
            }
        }
    }
}

void epyq_w4_core_a16_amx(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    if (x->m < AMX_MIN_ROWS || w->gs > AMX_GS_MAX)
        epyq_w4_core_a16_avx512vnni(w, n0, n1, g0, g1, x, y, ldy, rw);
    else
        amx_core(w, n0, n1, g0, g1, x, y, ldy, rw, 0);
}

void epyq_w4_core_a8_amx(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                         const epyq_act *x, float *y, int32_t ldy, const float *rw) {
    if (x->m < AMX_MIN_ROWS || w->gs < 64 || w->gs > AMX_GS_MAX)
        epyq_w4_core_a8_avx512vnni(w, n0, n1, g0, g1, x, y, ldy, rw);
    else
        amx_core(w, n0, n1, g0, g1, x, y, ldy, rw, 1);
}

static const epyq_w4_cores cores_amx = {epyq_w4_core_a8_amx, epyq_w4_core_a16_amx,
                                        epyq_act_prep_avx512, epyq_silu_mul_avx512};

EPYQ_DEFINE_W4(amx, cores_amx)

/* Register-only AMX peak for benchmarks/kernels: 4 independent TDPBSSD (C 0..3 from A 4..5 x
 * B 6..7, full 16 x 64-byte tiles) per iteration; returns the int8 operations executed (a
 * multiply-add counts 2). */
uint64_t epyq_w4_peak_tdpbssd_amx(uint64_t iters, int32_t *sink) {
    static _Thread_local _Alignas(64) int8_t src[16 * 64];
    static _Thread_local _Alignas(64) int32_t out[16][16];
    memset(src, 1, sizeof src);
    amx_config(16, 16, 0);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (uint64_t it = 0; it < iters; it++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    *sink = out[0][0];
    _tile_stored(3, out, 64);
    *sink += out[15][15];
    return iters * 4u * 16u * 16u * 64u * 2u;
}
