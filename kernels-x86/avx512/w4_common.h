/* kernels-x86/avx512/w4_common.h — helpers shared by the AVX-512 int4 cores: broadcasting
 * 4 activation bytes from memory and writing one tile's 16 results to a slice of y.
 * Included only by files compiled with the AVX-512 flags. */
#ifndef EPYQ_W4_AVX512_COMMON_H
#define EPYQ_W4_AVX512_COMMON_H

#include <immintrin.h>
#include <string.h>

#include "kernels-x86/w4_layout.h"
#include "kernels-x86/w4_simd.h"

/* The 4 bytes at p in every 32-bit lane (folds into the {1to16} operand broadcast). */
W4_INLINE __m512i w4_bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* acc + VPDPBUSD(w, the 4 bytes at x4 broadcast). GCC 12 keeps the accumulators of an
 * unrolled row block in registers but copies each one before and after its VPDPBUSD (two
 * extra vector moves per multiply at 8 rows); the asm form ties the accumulator to its
 * register and folds the broadcast into the memory operand. clang needs no help. */
W4_INLINE __m512i w4_dpbusd_b(__m512i acc, __m512i w, const void *x4) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x4));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, w4_bcast32(x4));
#endif
}

/* acc + VPDPBUSD / VPDPWSSD(w, the 4 bytes at base + s * stride + disp broadcast), s = 0, 1 or
 * 2, for the activation rows of a chunk (stride bytes apart, known only at run time). Each row
 * addressed from its own pointer, GCC kept one pointer per row and advanced every one of them
 * each block (12 adds a block at 12 rows); rows 3q + s addressed as base_q + s * stride take
 * 4 pointers and one index register. Alternating runs on one thread (benchmarks/kernels
 * in_proj_qkv, A8, Zen 5, medians of 6): 8 rows 719 -> 658 us, 16 rows 1244 -> 1176 us, 32
 * rows 2261 -> 2165 us. clang picks its own addressing from the intrinsic. The asm names no
 * memory operand (one made GCC compute every row's address again): the prepared activation it
 * reads is written by the caller before the core is called and never during it. */
#define W4_ROW_ASM(OP, acc, w, base, stride, s, disp)                                              \
    do {                                                                                           \
        if ((s) == 0)                                                                              \
            __asm__(OP " %c3(%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "r"(base), "i"(disp));    \
        else if ((s) == 1)                                                                         \
            __asm__(OP " %c4(%2,%3,1)%{1to16%}, %1, %0"                                            \
                    : "+v"(acc)                                                                    \
                    : "v"(w), "r"(base), "r"(stride), "i"(disp));                                  \
        else                                                                                       \
            __asm__(OP " %c4(%2,%3,2)%{1to16%}, %1, %0"                                            \
                    : "+v"(acc)                                                                    \
                    : "v"(w), "r"(base), "r"(stride), "i"(disp));                                  \
    } while (0)

/* w4_dpbusd_row and w4_dpwssd_row: one body, the instruction (asm) or intrinsic (clang) named. */
#if defined(__GNUC__) && !defined(__clang__)
#define W4_ROW_FN(name, OP, intrin)                                                                \
    W4_INLINE __m512i name(__m512i acc, __m512i w, const void *base, size_t stride, const int s,   \
                           const int disp) {                                                       \
        W4_ROW_ASM(OP, acc, w, base, stride, s, disp);                                             \
        return acc;                                                                                \
    }
#else
#define W4_ROW_FN(name, OP, intrin)                                                                \
    W4_INLINE __m512i name(__m512i acc, __m512i w, const void *base, size_t stride, const int s,   \
                           const int disp) {                                                       \
        return intrin(acc, w, w4_bcast32((const uint8_t *)base + (size_t)s * stride + disp));      \
    }
#endif
W4_ROW_FN(w4_dpbusd_row, "vpdpbusd", _mm512_dpbusd_epi32)
W4_ROW_FN(w4_dpwssd_row, "vpdpwssd", _mm512_dpwssd_epi32)

/* A group's integer dot from an accumulator of plain codes and one of 16 times the codes
 * (both paths mask some codes in place, w4_layout.h): exact, every term of acc16 is a
 * multiple of 16. Each core states its bound on acc16. */
W4_INLINE __m512i w4_dot_x16(__m512i acc1, __m512i acc16) {
    return _mm512_add_epi32(acc1, _mm512_srai_epi32(acc16, 4));
}

/* The group epilogue of both integer paths, operation for operation the ref twin's:
 * f + (s * d) * (float)(dot - z * sumq), with s the 16 scales after the group's bpg code
 * blocks in rec, z the tile's zero points of group g (8 when zeros is NULL), d and sumq the
 * activation row's step and code sum for the group. */
W4_INLINE __m512 w4_int_epilogue(__m512 f, const uint8_t *rec, int32_t bpg, const uint8_t *zeros,
                                 int32_t g, __m512i dot, float d, int32_t sumq) {
    const __m512 s = _mm512_loadu_ps(rec + (size_t)bpg * W4_BLOCK);
    const __m512i zsum =
        zeros ? _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                       (const __m128i *)(zeros + (size_t)g * W4_TILE))),
                                   _mm512_set1_epi32(sumq))
              : _mm512_set1_epi32(8 * sumq);
    const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(d));
    return _mm512_fmadd_ps(sd, _mm512_cvtepi32_ps(_mm512_sub_epi32(dot, zsum)), f);
}

/* Rows [lo, hi) of tile `tile` (values v, lane = row - 16*tile) into yrow[row - n0]. */
W4_INLINE void w4_store_tile(float *yrow, int32_t n0, int32_t tile, int32_t lo, int32_t hi,
                             __m512 v) {
    const int32_t base = tile * W4_TILE;
    if (lo == base && hi == base + W4_TILE) {
        _mm512_storeu_ps(yrow + (base - n0), v);
    } else {
        float tmp[W4_TILE];
        _mm512_storeu_ps(tmp, v);
        memcpy(yrow + (lo - n0), tmp + (lo - base), (size_t)(hi - lo) * sizeof(float));
    }
}

/* Computes mr (1..mr_max) activation rows starting at t0 against one tile, groups [g0, g1):
 * facc[r] = the tile's 16 outputs for row t0 + r, before the routing weight. `view` is the
 * path's prepared-activation view (w4_a8_view / w4_a16_view). */
typedef void (*w4_rows_fn)(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,
                           const void *view, int32_t kx, int32_t t0, __m512 *facc);

/* One activation row against nt consecutive tiles (nt = 1..W4_MULTI_NT), groups [g0, g1):
 * facc[i] = tile tile0 + i's 16 outputs. A GEMV is a pure weight stream, and one sequential
 * stream keeps too few hardware prefetches in flight to reach the read bandwidth (the read
 * probe, epyq_stream_read_avx512, sees the same); walking several tiles side by side makes
 * several streams. Each tile's arithmetic is exactly that of its rows_fn, so results are
 * identical to the one-tile-at-a-time walk.
 * pf: software prefetch distance in bytes, the distance from a tile to the same tile of the
 * next batch (nt tiles on), so each stream prefetches its successor at the same offset;
 * 0 on the last batch of a range, whose successor the caller will not read (at k = 512 a
 * fixed 4 KiB distance lands in the neighbouring stream and helps little; measured on this
 * VM, 1 thread: 4 tiles with this prefetch stream at 82-96% of the read probe, with a fixed
 * 4 KiB distance 72-88%, one tile at a time 67-74%; 8 tiles add another 5-8%). */
typedef void (*w4_tiles1_fn)(const epyq_w4 *w, const uint8_t *tile0, int32_t g0, int32_t g1,
                             const void *view, int32_t kx, size_t pf, __m512 *facc);
#define W4_MULTI_NT 8

/* Prepared activation bytes of one row block of a many-row call (w4_tiles_run): a quarter of
 * the 1 MiB L2 of Zen 4 and Zen 5 (Sapphire Rapids has 2 MiB), so the tiles streaming past and
 * the hardware prefetches keep the rest; 64 A16 rows at k = 2048 ran at 81% of the VPDPWSSD
 * peak, 256 rows (1 MiB) at 80%, 512 rows at 73% before the blocking. */
#define W4_ROW_BLOCK_BYTES (256u << 10)

/* Stamp out fn_N (a w4_rows_fn / w4_tiles1_fn) calling the always-inline impl with the
 * compile-time count N (activation rows / tiles), so the register arrays indexed by it stay
 * in registers; W4_TILES1_TABLE also defines fn_of[], the walks for 1..W4_MULTI_NT tiles. */
#define W4_ROWS_FN(fn, impl, VIEW, MR)                                                           \
    static void fn##_##MR(const epyq_w4 *w, const uint8_t *tile, int32_t g0, int32_t g1,        \
                          const void *a, int32_t kx, int32_t t0, __m512 *facc) {                \
        impl(w, tile, g0, g1, (const VIEW *)a, kx, t0, MR, facc);                                \
    }
#define W4_TILES1_FN(fn, impl, VIEW, NT)                                                         \
    static void fn##_##NT(const epyq_w4 *w, const uint8_t *tile0, int32_t g0, int32_t g1,       \
                          const void *a, int32_t kx, size_t pf, __m512 *facc) {                 \
        impl(w, tile0, g0, g1, (const VIEW *)a, kx, pf, NT, facc);                               \
    }
#define W4_TILES1_TABLE(fn, impl, VIEW)                                                          \
    W4_TILES1_FN(fn, impl, VIEW, 1) W4_TILES1_FN(fn, impl, VIEW, 2)                              \
    W4_TILES1_FN(fn, impl, VIEW, 3) W4_TILES1_FN(fn, impl, VIEW, 4)                              \
    W4_TILES1_FN(fn, impl, VIEW, 5) W4_TILES1_FN(fn, impl, VIEW, 6)                              \
    W4_TILES1_FN(fn, impl, VIEW, 7) W4_TILES1_FN(fn, impl, VIEW, 8)                              \
    static const w4_tiles1_fn fn##_of[W4_MULTI_NT + 1] = {                                       \
        NULL, fn##_1, fn##_2, fn##_3, fn##_4, fn##_5, fn##_6, fn##_7, fn##_8};

/* The tile loop every AVX-512 core shares: rows split into equal chunks of at most mr_max
 * (17 rows = 9 + 8, not 16 + 1, so every chunk reuses each unpack), routing weight applied,
 * rows [n0, n1) written. rows_of[mr] handles a chunk of mr rows; with one activation row,
 * tiles1_of[nt] (if given) walks nt tiles at once. */
W4_INLINE void w4_tiles_run(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                            const epyq_act *x, float *y, int32_t ldy, const float *rw,
                            const void *view, const w4_rows_fn *rows_of, int32_t mr_max,
                            const w4_tiles1_fn *tiles1_of) {
    const int32_t t_end = (n1 + W4_TILE - 1) / W4_TILE;
    if (x->m == 1 && tiles1_of) {
        for (int32_t tile = n0 / W4_TILE; tile < t_end; tile += W4_MULTI_NT) {
            const int nt = t_end - tile < W4_MULTI_NT ? (int)(t_end - tile) : W4_MULTI_NT;
            __m512 facc[W4_ROWS_MAX];
            const size_t pf = tile + 2 * W4_MULTI_NT <= t_end
                                  ? (size_t)W4_MULTI_NT * w4_tile_bytes(w->k, w->gs, w->asym)
                                  : 0;
            tiles1_of[nt](w, w4_tile_ptr(w, tile), g0, g1, view, x->k, pf, facc);
            for (int i = 0; i < nt; i++) {
                const int32_t t = tile + i;
                const int32_t lo = t * W4_TILE > n0 ? t * W4_TILE : n0;
                const int32_t hi = t * W4_TILE + W4_TILE < n1 ? t * W4_TILE + W4_TILE : n1;
                __m512 v = facc[i];
                if (rw) v = _mm512_mul_ps(v, _mm512_set1_ps(rw[0]));
                w4_store_tile(y, n0, t, lo, hi, v);
            }
        }
        return;
    }
    /* Many rows: equal blocks of them, each block over every tile before the next, so the
     * block's prepared activation (at most W4_ROW_BLOCK_BYTES) stays in L2 while the tiles
     * stream past. One block of all 512 rows of a prompt chunk (2 MiB at k = 2048, A16) was
     * read from L3 for every tile: 72.7% of the VPDPWSSD peak against 80.8% at 64 rows
     * (benchmarks/kernels, 1 thread, Zen 5). Every (row, tile) result is the same bits in
     * any blocking: a row's sums never depend on which rows share its chunk. */
    const size_t row_bytes = (size_t)x->k * (x->path == EPYQ_PATH_A8 ? 1u : 2u);
    int32_t rb = (int32_t)(W4_ROW_BLOCK_BYTES / row_bytes) / mr_max * mr_max;
    if (rb < mr_max) rb = mr_max;
    const int32_t nb = (x->m + rb - 1) / rb;
    for (int32_t b = 0; b < nb; b++) {
        const int32_t b0 = x->m * b / nb, bm = x->m * (b + 1) / nb - b0;
        const int32_t nch = (bm + mr_max - 1) / mr_max;
        for (int32_t tile = n0 / W4_TILE; tile < t_end; tile++) {
            const uint8_t *tp = w4_tile_ptr(w, tile);
            const int32_t lo = tile * W4_TILE > n0 ? tile * W4_TILE : n0;
            const int32_t hi = tile * W4_TILE + W4_TILE < n1 ? tile * W4_TILE + W4_TILE : n1;
            for (int32_t c = 0; c < nch; c++) {
                const int32_t t0 = b0 + bm * c / nch;
                const int mr = (int)(b0 + bm * (c + 1) / nch - t0);
                __m512 facc[W4_ROWS_MAX];
                rows_of[mr](w, tp, g0, g1, view, x->k, t0, facc);
                for (int r = 0; r < mr; r++) {
                    __m512 v = facc[r];
                    if (rw) v = _mm512_mul_ps(v, _mm512_set1_ps(rw[t0 + r]));
                    w4_store_tile(y + (size_t)(t0 + r) * (size_t)ldy, n0, tile, lo, hi, v);
                }
            }
        }
    }
}

#endif
