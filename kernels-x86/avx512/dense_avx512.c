/* kernels-x86/avx512/dense_avx512.c — dense kernels for the AVX-512 tables.
 *
 *   epyq_bf16_gemm_avx512bf16  y = W x, x rounded to bf16, VDPBF16PS (Zen 4/5, SPR+)
 *   epyq_bf16_gemm_avx512      the same numbers without VDPBF16PS: W widened to fp32 and
 *                              x rounded to bf16 in-register, FMA (Skylake-SP, Cascade Lake)
 *   epyq_bf16_gemm_f32_avx512  fp32-exact variant: W widened, x kept fp32, FMA
 *   epyq_gdn_step_avx512, epyq_conv_silu_avx512, epyq_l2norm_avx512,
 *   epyq_gated_rmsnorm_avx512, epyq_stream_read_avx512
 *   (attention: kernels-x86/avx512/attn_avx512.c)
 *
 * GEMM layout: W [n][k] bf16 row-major exactly as on disk, x [m][k] fp32. A register tile
 * is R = 4 weight rows x T <= 4 tokens of fp32 accumulators (8 rows for 1 to 3 tokens). The
 * widening paths walk k once per tile, weights reused T times from registers, rows in
 * L2-sized blocks under each L1-sized token tile (see gemm_many), and round x in-register; the
 * VDPBF16PS path converts x to bf16 once per block into a stack buffer (see below). Neither needs
 * scratch from the caller or epyq_act's private layout. Ragged k is handled with masked loads (zero
 * lanes add nothing), so any k works.
 *
 * Error bounds against a double reference are asserted in tests/kern/test_dense.c. */
#include <immintrin.h>
#include <math.h>

#include "kernels-x86/avx512/vec512.h"
#include "kernels-x86/kern_impl.h"
#include "kernels-x86/w4_impl.h"

enum { MODE_ROUND, MODE_F32 };
#define TILE_R 4
#define TILE_T 4
/* Rows per tile when there is one token: a GEMV is a pure weight stream, and 8 concurrent
 * row streams keep more prefetches in flight than 4 (see epyq_stream_read_avx512). */
#define GEMV_R 8

/* Round fp32 lanes to the nearest-even bf16 value (kept as fp32), like epyq_f32_to_bf16;
 * NaN lanes stay NaN. */
INLINE __m512 round_bf16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan, x);
}

/* The lanes of a 16-wide step at i that lie below n (all 16 when n - i >= 16). */
INLINE __mmask16 tail_mask(int32_t n, int32_t i) {
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}

/* Column i's line of each of R rows from p (rows ld elements apart): a GEMV tile's rows are
 * short streams the hardware prefetcher alone keeps too few lines ahead of (see gemm_tile). */
INLINE void prefetch_rows(const uint16_t *p, size_t ld, size_t i, const int R) {
    UNROLL
    for (int r = 0; r < R; r++)
        _mm_prefetch((const char *)(p + (size_t)r * ld + i), EPYQ_PF_WEIGHTS);
}

/* 16 columns [i, i + 16) of an R x T tile, lanes outside mask m read as zero. */
INLINE void tile_step(const uint16_t *w, size_t k, const float *x, size_t ldx, size_t i,
                      __mmask16 m, __m512 acc[GEMV_R][TILE_T], const int R, const int T,
                      const int mode) {
    __m512 xf[TILE_T];
    UNROLL
    for (int t = 0; t < T; t++) {
        xf[t] = _mm512_maskz_loadu_ps(m, x + (size_t)t * ldx + i);
        if (mode == MODE_ROUND) xf[t] = round_bf16(xf[t]);
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        const __m512 wf = widen_bf16(_mm256_maskz_loadu_epi16(m, w + (size_t)r * k + i));
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wf, xf[t], acc[r][t]);
    }
}

/* Columns [i, c1) in 16-wide steps, the last one masked. The full steps use a constant mask
 * so the loads fold into the widening and the FMAs; a mask computed in the loop kept them
 * apart (Zen 4, m = 32: 74 -> 93 GFLOP/s). */
INLINE void tile_steps_to(const uint16_t *w, size_t k, const float *x, size_t ldx, size_t i,
                          size_t c1, __m512 acc[GEMV_R][TILE_T], const int R, const int T,
                          const int mode) {
    for (; i + 16 <= c1; i += 16) tile_step(w, k, x, ldx, i, (__mmask16)0xffff, acc, R, T, mode);
    if (i < c1) tile_step(w, k, x, ldx, i, (__mmask16)((1u << (c1 - i)) - 1), acc, R, T, mode);
}

/* Columns [c0, c1) of an R x T register tile, y[t][r] = w[r] . x[t]; the accumulators start
 * at zero (c0 == 0) or from carry, and end reduced into y (c1 == k) or back in carry. pf: the
 * rows to prefetch, or NULL. R, T, mode are compile-time constants at every call site, so the
 * loops below unroll into registers. */
INLINE void block_tile(const uint16_t *w, size_t k, const float *x, size_t c0, size_t c1,
                       __m512 *carry, float *y, size_t ldy, const uint16_t *pf, const int R,
                       const int T, const int mode) {
    __m512 acc[GEMV_R][TILE_T];
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++)
            acc[r][t] = c0 == 0 ? _mm512_setzero_ps() : carry[r * TILE_T + t];
    }
    size_t i = c0;
    if (pf)
        for (; i + 32 <= c1; i += 32) {
            prefetch_rows(pf, k, i, R);
            tile_step(w, k, x, k, i, (__mmask16)0xffff, acc, R, T, mode);
            tile_step(w, k, x, k, i + 16, (__mmask16)0xffff, acc, R, T, mode);
        }
    tile_steps_to(w, k, x, k, i, c1, acc, R, T, mode);
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) {
            if (c1 == k) y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc[r][t]);
            else
                carry[r * TILE_T + t] = acc[r][t];
        }
    }
}

/* One R x T register tile over the whole k. An 8-row tile (1 to 3 tokens: decode, a speculative
 * verify step) prefetches the next row tile at the same offset, one line per row per 64 bytes: its
 * 8 rows are 8 short streams (4 KiB each at k = 2048) that the hardware prefetcher alone kept too
 * few lines ahead of; on this VM, 1 thread, lm_head shape, 84% -> 97% of the read probe (median of
 * 9). The columns are summed in the same order either way, so the results are the same bits. */
INLINE void gemm_tile(const uint16_t *w, size_t k, const float *x, float *y, size_t ldy,
                      const int R, const int T, const int mode) {
    block_tile(w, k, x, 0, k, NULL, y, ldy, R == GEMV_R ? w + (size_t)R * k : NULL, R, T, mode);
}

/* 1 to 3 tokens (a decode or speculative verify step) over one R-row tile: 8 prefetched row
 * streams as for one token (8 x 3 accumulators still fit the 32 registers; 8 x 4 would not),
 * R = 4 and 1 for the rows left below a whole 8-row tile. */
INLINE void gemm_rows_few(const uint16_t *w, size_t k, const float *x, int32_t m, float *y,
                          size_t ldy, const int R, const int mode) {
    switch (m) {
    case 3: gemm_tile(w, k, x, y, ldy, R, 3, mode); break;
    case 2: gemm_tile(w, k, x, y, ldy, R, 2, mode); break;
    default: gemm_tile(w, k, x, y, ldy, R, 1, mode); break;
    }
}

/* ---- 4 tokens and more ------------------------------------------------------------------
 * Rows go in blocks of GEMM_NB (64 x 2048 x 2 B = 256 KiB, held in L2) and each block runs
 * its token tiles in turn: a tile's x (4 x 2048 fp32 = 32 KiB) stays in L1 while the block's
 * rows stream from L2 under it. Walking all token tiles for each 4-row tile instead reloaded
 * x from L2 for every 16 FMAs. While the first token tile runs, the next block's rows are
 * prefetched into L2, which is what keeps 4 to 8 tokens fed from DRAM. k beyond GEMM_KC
 * carries the accumulators through memory unreduced, so every lane sums its columns in the
 * same order as gemm_tile: the same bits for a token whatever the tile or batch around it.
 * Zen 4 VM, 1 thread, lm_head shape: 46 -> 74 GFLOP/s at m = 4, 61 -> 87 at 8, 70 -> 94 at
 * 32, of a measured 111 GFLOP/s FMA peak. */
#define GEMM_NB 64
#define GEMM_KC 2048
#define GEMM_CARRY ((GEMM_NB / TILE_R + TILE_R - 1) * TILE_R * TILE_T) /* zmm slots per block */

/* One token tile of T tokens over rows [j0, j1) of a block; rows up to n1 exist. */
INLINE void gemm_block(const uint16_t *w, size_t k, int32_t j0, int32_t j1, int32_t n1,
                       const float *x, float *y, size_t ldy, __m512 *carry, int prefetch,
                       const int T, const int mode) {
    for (size_t c0 = 0; c0 < k; c0 += GEMM_KC) {
        const size_t c1 = k - c0 < GEMM_KC ? k : c0 + GEMM_KC;
        int32_t j = j0;
        __m512 *cr = carry;
        for (; j + TILE_R <= j1; j += TILE_R, cr += TILE_R * TILE_T) {
            const int32_t jn = j + GEMM_NB; /* the same tile of the next block */
            const uint16_t *pf = prefetch && jn + TILE_R <= n1 ? w + (size_t)jn * k : NULL;
            block_tile(w + (size_t)j * k, k, x, c0, c1, cr, y + j, ldy, pf, TILE_R, T, mode);
        }
        for (; j < j1; j++, cr += TILE_R * TILE_T)
            block_tile(w + (size_t)j * k, k, x, c0, c1, cr, y + j, ldy, NULL, 1, T, mode);
    }
}

INLINE void gemm_many(const uint16_t *w, size_t k, int32_t n0, int32_t n1, const float *x,
                      int32_t m, float *y, size_t ldy, const int mode) {
    __m512 carry[GEMM_CARRY];
    for (int32_t jb = n0; jb < n1; jb += GEMM_NB) {
        const int32_t je = n1 - jb < GEMM_NB ? n1 : jb + GEMM_NB;
        for (int32_t t = 0; t < m; t += TILE_T) {
            const float *xt = x + (size_t)t * k;
            float *yt = y + (size_t)t * ldy;
            const int pf = t == 0;
            switch (m - t < TILE_T ? m - t : TILE_T) {
            case 1: gemm_block(w, k, jb, je, n1, xt, yt, ldy, carry, pf, 1, mode); break;
            case 2: gemm_block(w, k, jb, je, n1, xt, yt, ldy, carry, pf, 2, mode); break;
            case 3: gemm_block(w, k, jb, je, n1, xt, yt, ldy, carry, pf, 3, mode); break;
            default: gemm_block(w, k, jb, je, n1, xt, yt, ldy, carry, pf, TILE_T, mode); break;
            }
        }
    }
}

INLINE void gemm(const uint16_t *w, int32_t k, int32_t n0, int32_t n1, const epyq_act *x,
                 float *y, int32_t ldy, const int mode) {
    const size_t kk = (size_t)k, ld = (size_t)ldy;
    if (x->m <= 0) return;
    if (x->m > 3) {
        gemm_many(w, kk, n0, n1, x->f32, x->m, y, ld, mode);
        return;
    }
    int32_t j = n0;
    for (; j + GEMV_R <= n1; j += GEMV_R)
        gemm_rows_few(w + (size_t)j * kk, kk, x->f32, x->m, y + j, ld, GEMV_R, mode);
    for (; j + TILE_R <= n1; j += TILE_R)
        gemm_rows_few(w + (size_t)j * kk, kk, x->f32, x->m, y + j, ld, TILE_R, mode);
    for (; j < n1; j++) gemm_rows_few(w + (size_t)j * kk, kk, x->f32, x->m, y + j, ld, 1, mode);
}

/* ---- VDPBF16PS path ---------------------------------------------------------------------
 * x is rounded to bf16 once per (row block, token tile, k chunk) into a 16 KiB stack buffer
 * (4 tokens x BF_KC values, zero-padded to whole 32-value steps), so the inner loop is only
 * loads and VDPBF16PS. Rows go in blocks of BF_NB: a block (64 x 2048 x 2 B = 256 KiB) is
 * read from DRAM by the first token tile and from L2 by the others, so for M > 4 the weights
 * still cross the memory bus once. k beyond BF_KC is done in chunks whose partial sums are
 * added into y (one extra fp32 rounding per chunk, inside the test bound). */
#define BF_KC 2048
#define BF_NB 64

INLINE void bf_convert_x(const float *x, size_t ldx, size_t kl, size_t kp, uint16_t *xb,
                         const int T) {
    UNROLL
    for (int t = 0; t < T; t++)
        for (size_t i = 0; i < kp; i += 32) {
            const size_t rem = kl > i ? kl - i : 0;
            const __mmask32 m = rem >= 32 ? ~(__mmask32)0 : (__mmask32)((1ull << rem) - 1);
            const float *xt = x + (size_t)t * ldx + i;
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps((__mmask16)(m >> 16), xt + 16),
                                                   _mm512_maskz_loadu_ps((__mmask16)m, xt));
            _mm512_store_si512(xb + (size_t)t * kp + i, (__m512i)v);
        }
}

/* 32 columns [i, i + 32) of an R x T tile, lanes outside mask m read as zero. */
INLINE void bf_step(const uint16_t *w, size_t ldw, const uint16_t *xb, size_t kp, size_t i,
                    __mmask32 m, __m512 acc[GEMV_R][TILE_T], const int R, const int T) {
    __m512bh xv[TILE_T];
    UNROLL
    for (int t = 0; t < T; t++) xv[t] = (__m512bh)_mm512_load_si512(xb + (size_t)t * kp + i);
    UNROLL
    for (int r = 0; r < R; r++) {
        const __m512bh wb = (__m512bh)_mm512_maskz_loadu_epi16(m, w + (size_t)r * ldw + i);
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wb, xv[t]);
    }
}

/* y[t][r] (+)= w[r][0..kl) . xb[t][0..kl) for an R x T tile. */
INLINE void bf_tile(const uint16_t *w, size_t ldw, size_t kl, const uint16_t *xb, size_t kp,
                    float *y, size_t ldy, int accumulate, const int R, const int T) {
    __m512 acc[GEMV_R][TILE_T];
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    }
    size_t i = 0;
    for (; i + 32 <= kl; i += 32) { /* constant mask: see tile_steps_to */
        if (R == GEMV_R) prefetch_rows(w + (size_t)R * ldw, ldw, i, R);
        bf_step(w, ldw, xb, kp, i, ~(__mmask32)0, acc, R, T);
    }
    if (i < kl) bf_step(w, ldw, xb, kp, i, (__mmask32)((1ull << (kl - i)) - 1), acc, R, T);
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int t = 0; t < T; t++) {
            const float s = _mm512_reduce_add_ps(acc[r][t]);
            float *yo = y + (size_t)t * ldy + (size_t)r;
            *yo = accumulate ? *yo + s : s;
        }
    }
}

/* One token tile over rows [j0, j1) for one k chunk. */
INLINE void bf_rows(const uint16_t *w, size_t k, int32_t j0, int32_t j1, size_t kc0, size_t kl,
                    const float *x, uint16_t *xb, float *y, size_t ldy, const int T) {
    const size_t kp = (kl + 31) & ~(size_t)31;
    bf_convert_x(x + kc0, k, kl, kp, xb, T);
    int32_t j = j0;
    if (T <= 3) /* 8 prefetched row streams, as gemm_rows_few */
        for (; j + GEMV_R <= j1; j += GEMV_R)
            bf_tile(w + (size_t)j * k + kc0, k, kl, xb, kp, y + j, ldy, kc0 > 0, GEMV_R, T);
    for (; j + TILE_R <= j1; j += TILE_R)
        bf_tile(w + (size_t)j * k + kc0, k, kl, xb, kp, y + j, ldy, kc0 > 0, TILE_R, T);
    for (; j < j1; j++) bf_tile(w + (size_t)j * k + kc0, k, kl, xb, kp, y + j, ldy, kc0 > 0, 1, T);
}

void epyq_bf16_gemm_avx512bf16(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,
                               const epyq_act *x, float *y, int32_t ldy) {
    _Alignas(64) uint16_t xb[TILE_T * BF_KC]; /* [T][kp] bf16 x of one token tile and chunk */
    const size_t kk = (size_t)k, ld = (size_t)ldy;
    for (int32_t jb = n0; jb < n1; jb += BF_NB) {
        const int32_t je = n1 - jb < BF_NB ? n1 : jb + BF_NB;
        for (int32_t t0 = 0; t0 < x->m; t0 += TILE_T) {
            const float *xt = x->f32 + (size_t)t0 * kk;
            float *yt = y + (size_t)t0 * ld;
            for (size_t kc0 = 0; kc0 < kk; kc0 += BF_KC) {
                const size_t kl = kk - kc0 < BF_KC ? kk - kc0 : BF_KC;
                switch (x->m - t0 < TILE_T ? x->m - t0 : TILE_T) {
                case 1: bf_rows(w, kk, jb, je, kc0, kl, xt, xb, yt, ld, 1); break;
                case 2: bf_rows(w, kk, jb, je, kc0, kl, xt, xb, yt, ld, 2); break;
                case 3: bf_rows(w, kk, jb, je, kc0, kl, xt, xb, yt, ld, 3); break;
                default: bf_rows(w, kk, jb, je, kc0, kl, xt, xb, yt, ld, 4); break;
                }
            }
        }
    }
}

void epyq_bf16_gemm_avx512(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,
                           const epyq_act *x, float *y, int32_t ldy) {
    gemm(w, k, n0, n1, x, y, ldy, MODE_ROUND);
}

void epyq_bf16_gemm_f32_avx512(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,
                               const epyq_act *x, float *y, int32_t ldy) {
    gemm(w, k, n0, n1, x, y, ldy, MODE_F32);
}

/* ---- Gated DeltaNet step --------------------------------------------------------------- */

#define GDN_COLS 128 /* value columns per strip: 8 vectors of m, delta and o in registers */

/* One strip of nvec vectors of value columns starting at j0 (nvec a compile-time constant
 * at each call, so m/delta/o stay in registers). */
INLINE void gdn_strip(float *S, const float *k, const float *v, const float *q, __m512 va, __m512 vb,
                      int32_t dk, int32_t dv, int32_t j0, const int nvec, float *o) {
    __m512 acc[GDN_COLS / 16], dlt[GDN_COLS / 16];
    UNROLL
    for (int c = 0; c < nvec; c++) acc[c] = _mm512_setzero_ps();
    for (int32_t i = 0; i < dk; i++) {
        const float *Si = S + (size_t)i * (size_t)dv + (size_t)j0;
        const __m512 ki = _mm512_set1_ps(k[i]);
        UNROLL
        for (int c = 0; c < nvec; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_loadu_ps(Si + 16 * c), ki, acc[c]);
    }
    UNROLL
    for (int c = 0; c < nvec; c++) {
        const __m512 vv = _mm512_loadu_ps(v + j0 + 16 * c);
        dlt[c] = _mm512_mul_ps(vb, _mm512_fnmadd_ps(va, acc[c], vv));
        acc[c] = _mm512_setzero_ps();
    }
    for (int32_t i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * (size_t)dv + (size_t)j0;
        const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
        UNROLL
        for (int c = 0; c < nvec; c++) {
            const __m512 sn =
                _mm512_fmadd_ps(ki, dlt[c], _mm512_mul_ps(va, _mm512_loadu_ps(Si + 16 * c)));
            _mm512_storeu_ps(Si + 16 * c, sn);
            acc[c] = _mm512_fmadd_ps(sn, qi, acc[c]);
        }
    }
    UNROLL
    for (int c = 0; c < nvec; c++) _mm512_storeu_ps(o + j0 + 16 * c, acc[c]);
}

/* Two passes over each strip of S (64 KiB for 128 x 128: L2-resident between tokens):
 *   pass 1: m = alpha * (S^T k)                      (decay folded into the read)
 *   pass 2: S = alpha*S + k delta^T, o += q_i S_i     (update and output read fused) */
void epyq_gdn_step_avx512(float *S, const float *k, const float *v, const float *q, float alpha,
                          float beta, int32_t dk, int32_t dv, float *o) {
    if (dv % 16 != 0) {
        epyq_gdn_step_ref(S, k, v, q, alpha, beta, dk, dv, o);
        return;
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int32_t j0 = 0; j0 < dv; j0 += GDN_COLS) {
        switch ((dv - j0 < GDN_COLS ? dv - j0 : GDN_COLS) / 16) {
#define CASE(N)                                                                                  \
    case N: gdn_strip(S, k, v, q, va, vb, dk, dv, j0, N, o); break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
        default: break; /* GDN_COLS / 16 <= 8 */
        }
    }
}

/* ---- causal conv + SiLU ------------------------------------------------------------------ */

/* s sigmoid(s) with the exp argument never positive, e = e^-|s|: s / (1 + e) for s >= 0 and
 * s e / (1 + e) for s < 0, one division either way; 0 below s = -87, where the exp argument
 * is clamped (silu(-1e30) is 0 as s / (1 + expf(-s)) gives, not -1e30 e^-87). */
INLINE __m512 silu(__m512 s) {
    const __m512 e = exp_neg_poly(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(s)), 1);
    const __mmask16 neg = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __mmask16 under = _mm512_cmp_ps_mask(s, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    __m512 num = _mm512_mask_mul_ps(s, neg, s, e);
    num = _mm512_mask_mov_ps(num, under, _mm512_setzero_ps());
    return _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* silu(g) * u, 16 at a time, the tail masked: epyq_silu_mul_ref's operations (w4_impl.h). */
void epyq_silu_mul_avx512(const float *g, const float *u, float *h, int32_t n) {
    for (int32_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n, i);
        const __m512 s = silu(_mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* 16 channels a step, the last one masked; each tap row is read once and written one row up. */
void epyq_conv_silu_avx512(float *x, float *st, size_t lds, const float *w, size_t ldw, int32_t kc,
                           int32_t n) {
    for (int32_t c = 0; c < n; c += 16) {
        const __mmask16 m = tail_mask(n, c);
        const __m512 raw = _mm512_maskz_loadu_ps(m, x + c);
        __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + (size_t)(kc - 1) * ldw + c), raw);
        for (int32_t r = 0; r < kc - 1; r++) {
            const __m512 t = _mm512_maskz_loadu_ps(m, st + (size_t)r * lds + c);
            s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + (size_t)r * ldw + c), t, s);
            if (r > 0) _mm512_mask_storeu_ps(st + (size_t)(r - 1) * lds + c, m, t);
        }
        if (kc > 1) _mm512_mask_storeu_ps(st + (size_t)(kc - 2) * lds + c, m, raw);
        _mm512_mask_storeu_ps(x + c, m, silu(s));
    }
}

/* ---- DeltaNet's per-head norms ------------------------------------------------------------ */

/* Sum of squares in double lanes, as the ref twin sums: the rounded factor then matches its bits
 * but in rare ties (an fp32 sum moved the fixtures' KL both ways by up to 1.3x). A head is 128
 * floats: 16 conversions and FMAs. */
INLINE double sum_squares(const float *v, int32_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(v + i));
        const __m512d x1 = _mm512_cvtps_pd(_mm256_loadu_ps(v + i + 8));
        a0 = _mm512_fmadd_pd(x0, x0, a0);
        a1 = _mm512_fmadd_pd(x1, x1, a1);
    }
    for (; i < n; i += 8) {
        const __mmask8 m = n - i >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (n - i)) - 1);
        const __m512d x = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, v + i));
        a0 = _mm512_fmadd_pd(x, x, a0);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

void epyq_l2norm_avx512(float *v, int32_t n, float scale, double eps) {
    const __m512 inv = _mm512_set1_ps((float)(scale / sqrt(sum_squares(v, n) + eps)));
    for (int32_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n, i);
        _mm512_mask_storeu_ps(v + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + i), inv));
    }
}

void epyq_gated_rmsnorm_avx512(float *o, const float *z, const float *w, int32_t n, double eps) {
    const __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt(sum_squares(o, n) / n + eps)));
    for (int32_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n, i);
        const __m512 on = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, o + i), inv);
        const __m512 ow = _mm512_mul_ps(on, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(ow, silu(_mm512_maskz_loadu_ps(m, z + i))));
    }
}

/* ---- streaming read -------------------------------------------------------------------- */

/* The buffer is read as 8 interleaved sequential streams (one per eighth), each with its own
 * accumulator: several streams keep more hardware prefetches in flight than one, and on the
 * machines measured a single stream read 20-40% below what a 4-row GEMV streams. The probe
 * must show the best read rate, or kernel figures quoted against it would exceed 100%. */
#define READ_STREAMS 8

double epyq_stream_read_avx512(const float *buf, size_t n) {
    __m512 a[READ_STREAMS];
    UNROLL
    for (int s = 0; s < READ_STREAMS; s++) a[s] = _mm512_setzero_ps();
    const size_t per = n / READ_STREAMS / 16 * 16; /* floats per stream, whole vectors */
    for (size_t i = 0; i < per; i += 16) {
        UNROLL
        for (int s = 0; s < READ_STREAMS; s++)
            a[s] = _mm512_add_ps(a[s], _mm512_loadu_ps(buf + (size_t)s * per + i));
    }
    for (size_t i = per * READ_STREAMS; i < n; i += 16) {
        const size_t rem = n - i;
        const __mmask16 m = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);
        a[0] = _mm512_add_ps(a[0], _mm512_maskz_loadu_ps(m, buf + i));
    }
    UNROLL
    for (int s = 1; s < READ_STREAMS; s++) a[0] = _mm512_add_ps(a[0], a[s]);
    return (double)_mm512_reduce_add_ps(a[0]);
}
