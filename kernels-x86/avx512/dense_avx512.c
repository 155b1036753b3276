/* kernels-x86/avx512/dense_avx512.c — dense kernels for the AVX-512 tables.
 *
 *   epyq_bf16_gemm_avx512bf16  y = W x, x rounded to bf16, VDPBF16PS (Zen 4/5, SPR+)
 *   epyq_bf16_gemm_avx512      the same numbers without VDPBF16PS: W widened to fp32 and
 *                              x rounded to bf16 in-register, FMA (Skylake-SP, Cascade Lake)
 *   epyq_bf16_gemm_f32_avx512  fp32-exact variant: W widened, x kept fp32, FMA
 *   epyq_attn_bf16[_multi]_avx512, epyq_gdn_step_avx512, epyq_stream_read_avx512
 *
 * GEMM layout: W [n][k] bf16 row-major exactly as on disk, x [m][k] fp32. A register tile
 * is R = 4 weight rows x T <= 4 tokens of fp32 accumulators (8 rows for 1 to 3 tokens). The
 * widening paths walk k once per tile, weights reused T times from registers, rows in
 * L2-sized blocks under each L1-sized token tile (see gemm_many), and round x in-register; the
 * VDPBF16PS path converts x to bf16 once per block into a stack buffer (see below). Neither needs
 * scratch from the caller or epyq_act's private layout. Ragged k is handled with masked loads (zero
 * lanes add nothing), so any k works.
 *
 * Attention: one pass over K/V with an online softmax per block of 16 keys: block scores
 * -> block max -> one vector exp for 16 probabilities -> rescale the running sum/output
 * once per block. Heads that share a kv head (GQA) are processed together so every K/V
 * row is loaded once per group of up to 8 heads. hd must be a multiple of 16, else the
 * call is served by the ref twin.
 *
 * Error bounds against a double reference are asserted in tests/kern/test_dense.c. */
#include <immintrin.h>
#include <math.h>

#include "kernels-x86/kern_impl.h"

enum { MODE_ROUND, MODE_F32 };
#define TILE_R 4
#define TILE_T 4
/* Rows per tile when there is one token: a GEMV is a pure weight stream, and 8 concurrent
 * row streams keep more prefetches in flight than 4 (see epyq_stream_read_avx512). */
#define GEMV_R 8

#define INLINE static inline __attribute__((always_inline))
/* Tile loops have compile-time trip counts after inlining; -O2 does not always unroll them,
 * and a rolled loop keeps the accumulators in memory instead of registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* bf16 lanes (16 x u16) -> fp32: a bf16 is the top half of the fp32 with the same bits. */
INLINE __m512 widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

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

/* ---- exp ------------------------------------------------------------------------------- */

/* e^x for x <= 0 (softmax arguments): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of
 * ln2), e^r by its degree-6 Taylor polynomial (truncation < 1.2e-7 relative, ~1 ulp), then
 * scaled by 2^n with VSCALEFPS. Arguments below -87 are clamped: their true value is below
 * 1e-38, i.e. zero next to the block maximum's weight of 1. */
INLINE __m512 exp_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* ---- attention ------------------------------------------------------------------------- */

#define ATT_BLOCK 16 /* keys per online-softmax step: one vector of scores */
#define ATT_HEADS 8  /* query heads per pass over K/V (the model's GQA group) */

/* Up to ATT_HEADS heads over all n_ctx keys; hd % 16 == 0. */
INLINE void attn_group(const float *q, const int32_t nq, size_t ldq, const uint16_t *k,
                       const uint16_t *v, int32_t n_ctx, size_t hd, size_t kv_stride,
                       float scale, float *out, size_t ldo) {
    float mx[ATT_HEADS], sum[ATT_HEADS];
    float p[ATT_HEADS][ATT_BLOCK];
    UNROLL
    for (int32_t h = 0; h < nq; h++) {
        mx[h] = -INFINITY;
        sum[h] = 0.0f;
        for (size_t d = 0; d < hd; d++) out[h * ldo + d] = 0.0f;
    }
    for (int32_t s0 = 0; s0 < n_ctx; s0 += ATT_BLOCK) {
        const int32_t nb = n_ctx - s0 < ATT_BLOCK ? n_ctx - s0 : ATT_BLOCK;
        /* Scores: each key row is widened once and reused by every head of the group. */
        for (int32_t s = 0; s < nb; s++) {
            const uint16_t *ks = k + (size_t)(s0 + s) * kv_stride;
            __m512 acc[ATT_HEADS];
            UNROLL
            for (int32_t h = 0; h < nq; h++) acc[h] = _mm512_setzero_ps();
            for (size_t d = 0; d < hd; d += 16) {
                const __m512 kf = widen_bf16(_mm256_loadu_si256((const __m256i *)(ks + d)));
                UNROLL
                for (int32_t h = 0; h < nq; h++)
                    acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * ldq + d), kf, acc[h]);
            }
            UNROLL
            for (int32_t h = 0; h < nq; h++) p[h][s] = _mm512_reduce_add_ps(acc[h]) * scale;
        }
        /* Online softmax update per head; lanes past the block end get probability 0. */
        const __mmask16 live = (__mmask16)((1u << nb) - 1);
        UNROLL
        for (int32_t h = 0; h < nq; h++) {
            const __m512 sc = _mm512_maskz_loadu_ps(live, p[h]);
            const float bmax = _mm512_mask_reduce_max_ps(live, sc);
            const float nmax = bmax > mx[h] ? bmax : mx[h];
            const float r = mx[h] == -INFINITY ? 0.0f : expf(mx[h] - nmax);
            const __m512 e = _mm512_maskz_mov_ps(live, exp_neg(_mm512_sub_ps(sc, _mm512_set1_ps(nmax))));
            _mm512_storeu_ps(p[h], e);
            sum[h] = sum[h] * r + _mm512_reduce_add_ps(e);
            mx[h] = nmax;
            if (r != 1.0f) {
                const __m512 rv = _mm512_set1_ps(r);
                float *o = out + h * ldo;
                for (size_t d = 0; d < hd; d += 16)
                    _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), rv));
            }
        }
        /* Weighted V: one 16-column strip of all heads' outputs stays in registers while
         * the block's V rows stream through it. */
        for (size_t d = 0; d < hd; d += 16) {
            __m512 o[ATT_HEADS];
            UNROLL
            for (int32_t h = 0; h < nq; h++) o[h] = _mm512_loadu_ps(out + h * ldo + d);
            for (int32_t s = 0; s < nb; s++) {
                const uint16_t *vs = v + (size_t)(s0 + s) * kv_stride;
                const __m512 vf = widen_bf16(_mm256_loadu_si256((const __m256i *)(vs + d)));
                UNROLL
                for (int32_t h = 0; h < nq; h++)
                    o[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[h][s]), vf, o[h]);
            }
            UNROLL
            for (int32_t h = 0; h < nq; h++) _mm512_storeu_ps(out + h * ldo + d, o[h]);
        }
    }
    UNROLL
    for (int32_t h = 0; h < nq; h++) {
        if (!(sum[h] > 0.0f)) continue;
        const __m512 inv = _mm512_set1_ps(1.0f / sum[h]);
        float *o = out + h * ldo;
        for (size_t d = 0; d < hd; d += 16)
            _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), inv));
    }
}

/* attn_group with the head count as a compile-time constant, so the per-head
 * accumulators live in registers. */
static void attn_group_n(const float *q, int32_t nq, size_t ldq, const uint16_t *k,
                         const uint16_t *v, int32_t n_ctx, size_t hd, size_t kv_stride,
                         float scale, float *out, size_t ldo) {
    switch (nq) {
#define CASE(N)                                                                                  \
    case N: attn_group(q, N, ldq, k, v, n_ctx, hd, kv_stride, scale, out, ldo); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    default: break; /* callers pass 1..ATT_HEADS */
    }
}

void epyq_attn_bf16_multi_avx512(const float *q, int32_t nq, int32_t ldq, const uint16_t *k,
                                 const uint16_t *v, int32_t n_ctx, int32_t hd, int32_t kv_stride,
                                 float scale, float *out, int32_t ldo) {
    if (hd % 16 != 0) {
        epyq_attn_bf16_multi_ref(q, nq, ldq, k, v, n_ctx, hd, kv_stride, scale, out, ldo);
        return;
    }
    for (int32_t h = 0; h < nq; h += ATT_HEADS) {
        const int32_t g = nq - h < ATT_HEADS ? nq - h : ATT_HEADS;
        attn_group_n(q + (size_t)h * (size_t)ldq, g, (size_t)ldq, k, v, n_ctx, (size_t)hd,
                   (size_t)kv_stride, scale, out + (size_t)h * (size_t)ldo, (size_t)ldo);
    }
}

void epyq_attn_bf16_avx512(const float *q, const uint16_t *k, const uint16_t *v, int32_t n_ctx,
                           int32_t hd, int32_t kv_stride, float scale, float *out) {
    epyq_attn_bf16_multi_avx512(q, 1, hd, k, v, n_ctx, hd, kv_stride, scale, out, hd);
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

/* s / (1 + e^-s) with the exp argument never positive: sigmoid(s) = 1 / (1 + e) for s >= 0
 * and e / (1 + e) for s < 0, e = e^-|s|. */
INLINE __m512 silu(__m512 s) {
    const __m512 e = exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(s)));
    const __mmask16 neg = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg, e);
    return _mm512_mul_ps(s, _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}

/* 16 channels a step, the last one masked; each tap row is read once and written one row up. */
void epyq_conv_silu_avx512(float *x, float *st, size_t lds, const float *w, size_t ldw, int32_t kc,
                           int32_t n) {
    for (int32_t c = 0; c < n; c += 16) {
        const int32_t rem = n - c;
        const __mmask16 m = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);
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
