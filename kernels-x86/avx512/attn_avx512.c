/* kernels-x86/avx512/attn_avx512.c — attention over a bf16 KV cache for the AVX-512 tables.
 *
 *   epyq_attn_bf16[_multi]_avx512  one token's query heads that share a kv head
 *   epyq_attn_bf16_tile_avx512     a tile of tokens x those heads (the model's prompts and
 *                                  decode tokens: one kernel, so the same bits for both)
 *
 * GQA entry: one pass over K/V with an online softmax per block of 16 keys: block scores ->
 * block max -> one vector exp for 16 probabilities -> rescale the running sum/output once
 * per block. Heads that share a kv head (GQA) are processed together so every K/V row is
 * loaded once per group of up to 8 heads.
 *
 * Tiles: the rows of a tile (token x head, up to 64 per pass) sit in the lanes of vectors
 * of 16 rows, q and the output transposed to [d][16 rows] in scratch. Each 16-key step widens
 * its K and V rows once into fp32 scratch; then per chunk of 16 rows a score vector per key
 * is a column of FMAs (broadcast k[key][d] times q[d][rows]), the softmax max, exp and
 * running sum are lane-wise, and the output update broadcasts v[key][d] against the 16
 * probability vectors held in registers. No horizontal sum is left, K/V cross the cache once
 * per tile instead of once per token, and every lane (row) is computed independently of the
 * others: a row's bits do not depend on which tile it was in. Up to 8 rows (a decode token's
 * GQA group) put the keys in the lanes instead (few_pass): each row's score vector is its own
 * FMA chain over d against a transposed block of K, widened in registers, and the output keeps
 * [row][d] with V widened once per key for all rows — every element sees the same operations
 * in the same order, so the same bits, with all 16 lanes busy where 8 rows filled half of them
 * (one kv head over 4096 cached keys, 1 thread: 445 -> 340 us).
 *
 * hd must be a multiple of 16 (the tile path also hd <= 256), else the ref twin runs. Error
 * bounds against a double reference are asserted in tests/kern/test_dense.c. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels-x86/avx512/vec512.h"
#include "kernels-x86/kern_impl.h"

/* ---- attention ------------------------------------------------------------------------- */

#define ATT_BLOCK 16 /* keys per online-softmax step: one vector of scores */
#define ATT_HEADS 8  /* query heads per pass over K/V (the model's GQA group) */

/* Up to ATT_HEADS heads over all n_ctx keys; hd % 16 == 0. */
INLINE void attn_group(const float *q, const int32_t nq, size_t ldq, const uint16_t *k,
                       const uint16_t *v, int32_t n_ctx, size_t hd, size_t kv_stride, float scale,
                       float *out, size_t ldo) {
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
            const __m512 e =
                _mm512_maskz_mov_ps(live, exp_neg(_mm512_sub_ps(sc, _mm512_set1_ps(nmax))));
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
                         const uint16_t *v, int32_t n_ctx, size_t hd, size_t kv_stride, float scale,
                         float *out, size_t ldo) {
    /* clang-format off */
    switch (nq) {
#define CASE(N) \
    case N: attn_group(q, N, ldq, k, v, n_ctx, hd, kv_stride, scale, out, ldo); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    default: break; /* callers pass 1..ATT_HEADS */
    }
    /* clang-format on */
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
/* ---- prompt tiles ---------------------------------------------------------------------- */

#define TL_KEYS 16 /* keys per online-softmax step: one score vector (16 rows) per key */
#define TL_CH 4    /* chunks of 16 rows per pass over K/V */
#define TL_HD 256  /* the largest hd the scratch holds */
#define TL_FEW 8   /* rows that take few_pass: a decode token's GQA group */
#define UNROLL16 _Pragma("GCC unroll 16")

/* Per-thread scratch (160 KiB): transposed q and output of a pass, the step's K/V in fp32. */
typedef struct {
    _Alignas(64) float qt[TL_CH * TL_HD * 16]; /* [chunk][d][16 rows] */
    _Alignas(64) float ot[TL_CH * TL_HD * 16]; /* [chunk][d][16 rows], unnormalised */
    _Alignas(64) float kw[TL_KEYS][TL_HD];     /* [key][d] */
    _Alignas(64) float vw[TL_KEYS][TL_HD];     /* [key][d] */
} tile_ws;
static _Thread_local tile_ws tl_ws;

typedef struct {
    const float *q;
    int32_t nh, ldq_t, ldq_h, ldo_t, ldo_h;
    const int32_t *n_ctx;
    float *out;
} tile_rows;

static const float *row_q(const tile_rows *r, int32_t row) {
    return r->q + (size_t)(row / r->nh) * (size_t)r->ldq_t +
           (size_t)(row % r->nh) * (size_t)r->ldq_h;
}

static float *row_out(const tile_rows *r, int32_t row) {
    return r->out + (size_t)(row / r->nh) * (size_t)r->ldo_t +
           (size_t)(row % r->nh) * (size_t)r->ldo_h;
}

/* Scores and the online-softmax update of one chunk of 16 rows over one step of 16 keys (kw):
 * p[j] the step's probabilities (0 at or past a row's n_ctx, and for the zeroed keys past the
 * cache end), alpha the factor for what the rows summed before. */
INLINE void tile_scores(const float *qt, const float (*kw)[TL_HD], size_t hd, int32_t s0,
                        __m512i lim, __m512 scale, __m512 *m, __m512 *l, __m512 *p, __m512 *alpha) {
    UNROLL16
    for (int32_t j = 0; j < TL_KEYS; j++) p[j] = _mm512_setzero_ps();
    for (size_t d = 0; d < hd; d++) {
        const __m512 qv = _mm512_load_ps(qt + d * 16);
        UNROLL16
        for (int32_t j = 0; j < TL_KEYS; j++)
            p[j] = _mm512_fmadd_ps(_mm512_set1_ps(kw[j][d]), qv, p[j]);
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __mmask16 live[TL_KEYS];
    __m512 bmax = ninf;
    UNROLL16
    for (int32_t j = 0; j < TL_KEYS; j++) {
        live[j] = _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(s0 + j));
        p[j] = _mm512_mask_mul_ps(ninf, live[j], p[j], scale);
        bmax = _mm512_max_ps(bmax, p[j]);
    }
    const __m512 mnew = _mm512_max_ps(*m, bmax);
    /* rows without a live key yet keep max -inf; they shift by 0 so no lane sees inf - inf */
    const __m512 shift = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_UQ), mnew);
    *alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(*m, ninf, _CMP_NEQ_UQ),
                                 exp_neg(_mm512_sub_ps(*m, shift)));
    __m512 sum = _mm512_mul_ps(*l, *alpha);
    UNROLL16
    for (int32_t j = 0; j < TL_KEYS; j++) {
        p[j] = _mm512_maskz_mov_ps(live[j], exp_neg(_mm512_sub_ps(p[j], shift)));
        sum = _mm512_add_ps(sum, p[j]);
    }
    *l = sum;
    *m = mnew;
}

/* The output update with the rows in lanes, ot [d][16 rows]: o = o * alpha, then one FMA per
 * key in key order, v[key][d] broadcast against the probability vectors in registers. */
INLINE void tile_pv_lanes(float *ot, const float (*vw)[TL_HD], size_t hd, const __m512 *p,
                          __m512 alpha) {
    for (size_t d = 0; d < hd; d += 2) {
        __m512 o0 = _mm512_mul_ps(_mm512_load_ps(ot + d * 16), alpha);
        __m512 o1 = _mm512_mul_ps(_mm512_load_ps(ot + d * 16 + 16), alpha);
        UNROLL16
        for (int32_t j = 0; j < TL_KEYS; j++) {
            o0 = _mm512_fmadd_ps(_mm512_set1_ps(vw[j][d]), p[j], o0);
            o1 = _mm512_fmadd_ps(_mm512_set1_ps(vw[j][d + 1]), p[j], o1);
        }
        _mm512_store_ps(ot + d * 16, o0);
        _mm512_store_ps(ot + d * 16 + 16, o1);
    }
}

/* A 16 x 16 transpose of 32-bit elements: t[i] lane j <- t[j] lane i. */
INLINE void transpose16_epi32(__m512i *t) {
    __m512i u[16], w[16];
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_epi32(t[i], t[i + 1]);
        u[i + 1] = _mm512_unpackhi_epi32(t[i], t[i + 1]);
    }
    /* w[4i + c], 128-bit lane L: element 4L + c of rows 4i .. 4i + 3 */
    for (int i = 0; i < 16; i += 4) {
        w[i] = _mm512_unpacklo_epi64(u[i], u[i + 2]);
        w[i + 1] = _mm512_unpackhi_epi64(u[i], u[i + 2]);
        w[i + 2] = _mm512_unpacklo_epi64(u[i + 1], u[i + 3]);
        w[i + 3] = _mm512_unpackhi_epi64(u[i + 1], u[i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i x0 = _mm512_shuffle_i32x4(w[c], w[4 + c], 0x88),
                      x1 = _mm512_shuffle_i32x4(w[c], w[4 + c], 0xDD),
                      y0 = _mm512_shuffle_i32x4(w[8 + c], w[12 + c], 0x88),
                      y1 = _mm512_shuffle_i32x4(w[8 + c], w[12 + c], 0xDD);
        t[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        t[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

/* The score chains of nr rows over one step's keys [0, nb) (keys in the lanes, keys past nb
 * zero): sc[i] lane j = sum over d, in d order, of k[j][d] q_i[d] by FMA from 0. A bf16 pair
 * (d, d + 1) is one 32-bit element, so a 16 x 16 transpose of the step's 32-column block
 * moves pairs; a shift and a mask widen the even and the odd column into the lanes. */
INLINE void few_scores(__m512 *sc, const float *const *q, const int32_t nr, const uint16_t *k,
                       int32_t nb, size_t hd, size_t kv_stride, const uint16_t *pf_k, int32_t npf) {
    const __m512i hi = _mm512_set1_epi32((int32_t)0xFFFF0000u);
    UNROLL
    for (int32_t i = 0; i < nr; i++) sc[i] = _mm512_setzero_ps();
    for (size_t d0 = 0; d0 < hd; d0 += 32) {
        const __mmask16 pairs = hd - d0 >= 32 ? 0xFFFF : 0x00FF; /* hd % 16 == 0 */
        __m512i t[16];
        for (int32_t j = 0; j < npf; j++)
            _mm_prefetch((const char *)(pf_k + (size_t)j * kv_stride + d0), _MM_HINT_T0);
        for (int32_t j = 0; j < TL_KEYS; j++)
            t[j] = j < nb ? _mm512_maskz_loadu_epi32(pairs, k + (size_t)j * kv_stride + d0)
                          : _mm512_setzero_si512();
        transpose16_epi32(t);
        const int np = pairs == 0xFFFF ? 16 : 8;
        for (int c = 0; c < np; c++) {
            const size_t d = d0 + 2 * (size_t)c;
            const __m512 ke = _mm512_castsi512_ps(_mm512_slli_epi32(t[c], 16)),
                         ko = _mm512_castsi512_ps(_mm512_and_si512(t[c], hi));
            UNROLL
            for (int32_t i = 0; i < nr; i++)
                sc[i] = _mm512_fmadd_ps(ke, _mm512_set1_ps(q[i][d]), sc[i]);
            UNROLL
            for (int32_t i = 0; i < nr; i++)
                sc[i] = _mm512_fmadd_ps(ko, _mm512_set1_ps(q[i][d + 1]), sc[i]);
        }
    }
}

/* o[i] = o[i] * al[i] + sum over the step's keys j, in key order, of p[i][j] v[j] (one FMA per
 * key; keys past nb are zero rows, as in the row-lane form, where a zero term turns a -0 into
 * +0). V is widened once per key and 16 columns, in a register, for all rows. */
INLINE void few_pv(float *o, const int32_t nr, const float (*p)[TL_KEYS], const float *al,
                   const uint16_t *v, int32_t nb, size_t hd, size_t kv_stride, const uint16_t *pf_v,
                   int32_t npf) {
    for (size_t d = 0; d < hd; d += 16) {
        if (d % 32 == 0)
            for (int32_t j = 0; j < npf; j++)
                _mm_prefetch((const char *)(pf_v + (size_t)j * kv_stride + d), _MM_HINT_T0);
        __m512 acc[TL_FEW];
        UNROLL
        for (int32_t i = 0; i < nr; i++)
            acc[i] = _mm512_mul_ps(_mm512_load_ps(o + (size_t)i * hd + d), _mm512_set1_ps(al[i]));
        for (int32_t j = 0; j < TL_KEYS; j++) {
            const __m512 vj = j < nb ? widen_bf16(_mm256_loadu_si256(
                                           (const __m256i *)(v + (size_t)j * kv_stride + d)))
                                     : _mm512_setzero_ps();
            UNROLL
            for (int32_t i = 0; i < nr; i++)
                acc[i] = _mm512_fmadd_ps(vj, _mm512_set1_ps(p[i][j]), acc[i]);
        }
        UNROLL
        for (int32_t i = 0; i < nr; i++) _mm512_store_ps(o + (size_t)i * hd + d, acc[i]);
    }
}

/* A decode token's rows (up to TL_FEW: its GQA group), keys in the lanes instead of rows: a
 * row's score vector is a chain of FMAs over d, so all 16 lanes work where the row-lane form
 * filled nr of them, and K/V are widened in registers instead of through scratch. Every row
 * still does the row-lane form's operations in its order — the FMA chain over d from 0, the
 * scale or -inf, the max, alpha and exp of the same lane-wise functions, the running sum in
 * key order, the output's multiply by alpha and one FMA per key in key order, the final
 * multiply by 1/sum — so a row's bits are those it gets in a prompt tile
 * (tests/kern/test_dense.c compares each row with the row in a 64-row pass). The max over 16
 * lanes equals the max over 16 vectors but for the sign of a zero maximum, which exp_neg and
 * the subtractions map to the same values. */
INLINE void few_pass(const tile_rows *r, int32_t r0, const int32_t nr, const uint16_t *k,
                     const uint16_t *v, size_t hd, size_t kv_stride, float scale) {
    const float *q[TL_FEW];
    float *o = tl_ws.ot; /* [nr][hd], unnormalised */
    int32_t n[TL_FEW], max_n = 0;
    _Alignas(64) float mx[16], sm[16];
    for (int32_t i = 0; i < 16; i++) {
        mx[i] = -INFINITY;
        sm[i] = 0.0f;
    }
    for (int32_t i = 0; i < nr; i++) {
        q[i] = row_q(r, r0 + i);
        n[i] = r->n_ctx[(r0 + i) / r->nh];
        max_n = n[i] > max_n ? n[i] : max_n;
    }
    memset(o, 0, (size_t)nr * hd * sizeof(float));
    const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int32_t s0 = 0; s0 < max_n; s0 += TL_KEYS) {
        const int32_t nb = max_n - s0 < TL_KEYS ? max_n - s0 : TL_KEYS;
        __m512 sc[TL_FEW];
        /* the next step's K and V rows, spread over this step's blocks: the hardware
         * prefetchers fall behind a walk this slow (one kv head over 8192 keys from DRAM
         * 1.25-1.45 ms without, 0.68-0.71 ms with, the in-cache time) */
        const int32_t sp = s0 + TL_KEYS, npf = max_n - sp < TL_KEYS ? max_n - sp : TL_KEYS;
        few_scores(sc, q, nr, k + (size_t)s0 * kv_stride, nb, hd, kv_stride,
                   k + (size_t)sp * kv_stride, npf);
        _Alignas(64) float bm[16];
        __mmask16 live[TL_FEW];
        _mm512_store_ps(bm, ninf);
        UNROLL
        for (int32_t i = 0; i < nr; i++) {
            const int32_t nl = n[i] - s0;
            live[i] = nl >= TL_KEYS ? (__mmask16)0xFFFF
                      : nl <= 0     ? (__mmask16)0
                                    : (__mmask16)((1u << nl) - 1);
            sc[i] = _mm512_mask_mul_ps(ninf, live[i], sc[i], vscale);
            bm[i] = _mm512_reduce_max_ps(sc[i]);
        }
        /* the running max, shift and alpha as vectors over rows, as in tile_scores */
        const __m512 m = _mm512_load_ps(mx), mnew = _mm512_max_ps(m, _mm512_load_ps(bm));
        const __m512 shift = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_UQ), mnew);
        const __m512 alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_NEQ_UQ),
                                                 exp_neg(_mm512_sub_ps(m, shift)));
        _Alignas(64) float sh[16], al[16], p[TL_FEW][TL_KEYS];
        _mm512_store_ps(sh, shift);
        _mm512_store_ps(al, alpha);
        _mm512_store_ps(mx, mnew);
        _mm512_store_ps(sm, _mm512_mul_ps(_mm512_load_ps(sm), alpha));
        UNROLL
        for (int32_t i = 0; i < nr; i++) {
            _mm512_store_ps(
                p[i],
                _mm512_maskz_mov_ps(live[i], exp_neg(_mm512_sub_ps(sc[i], _mm512_set1_ps(sh[i])))));
            float s = sm[i];
            for (int32_t j = 0; j < TL_KEYS; j++) s += p[i][j];
            sm[i] = s;
        }
        few_pv(o, nr, (const float(*)[TL_KEYS])p, al, v + (size_t)s0 * kv_stride, nb, hd, kv_stride,
               v + (size_t)sp * kv_stride, npf);
    }
    const __m512 l = _mm512_load_ps(sm);
    /* rows that saw no key (n_ctx = 0) have sum 0 and output 0 */
    _Alignas(64) float iv[16];
    _mm512_store_ps(iv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_GT_OQ),
                                            _mm512_set1_ps(1.0f), l));
    for (int32_t i = 0; i < nr; i++) {
        const __m512 ri = _mm512_set1_ps(iv[i]);
        float *dst = row_out(r, r0 + i);
        for (size_t d = 0; d < hd; d += 16)
            _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_load_ps(o + (size_t)i * hd + d), ri));
    }
}

/* few_pass with the row count as a compile-time constant, so the score chains stay in
 * registers. */
static void few_pass_n(const tile_rows *r, int32_t r0, int32_t nr, const uint16_t *k,
                       const uint16_t *v, size_t hd, size_t kv_stride, float scale) {
    switch (nr) {
    case 1: few_pass(r, r0, 1, k, v, hd, kv_stride, scale); break;
    case 2: few_pass(r, r0, 2, k, v, hd, kv_stride, scale); break;
    case 3: few_pass(r, r0, 3, k, v, hd, kv_stride, scale); break;
    case 4: few_pass(r, r0, 4, k, v, hd, kv_stride, scale); break;
    case 5: few_pass(r, r0, 5, k, v, hd, kv_stride, scale); break;
    case 6: few_pass(r, r0, 6, k, v, hd, kv_stride, scale); break;
    case 7: few_pass(r, r0, 7, k, v, hd, kv_stride, scale); break;
    default: few_pass(r, r0, 8, k, v, hd, kv_stride, scale); break; /* nr == TL_FEW */
    }
}

/* Rows [r0, r0 + nr) of a tile, nr <= 16 * TL_CH, in one pass over the keys they see. */
static void tile_pass(const tile_rows *r, int32_t r0, int32_t nr, const uint16_t *k,
                      const uint16_t *v, size_t hd, size_t kv_stride, float scale) {
    tile_ws *w = &tl_ws;
    const int32_t nc = (nr + 15) / 16;
    __m512i lim[TL_CH];
    __m512 m[TL_CH], l[TL_CH];
    int32_t max_n = 0;
    for (int32_t c = 0; c < nc; c++) {
        int32_t lv[16];
        float *qt = w->qt + (size_t)c * hd * 16;
        for (int32_t i = 0; i < 16; i++) {
            const int32_t row = c * 16 + i;
            lv[i] = row < nr ? r->n_ctx[(r0 + row) / r->nh] : 0;
            max_n = lv[i] > max_n ? lv[i] : max_n;
            const float *src = row < nr ? row_q(r, r0 + row) : NULL;
            for (size_t d = 0; d < hd; d++) qt[d * 16 + (size_t)i] = src ? src[d] : 0.0f;
        }
        lim[c] = _mm512_loadu_si512(lv);
        m[c] = _mm512_set1_ps(-INFINITY);
        l[c] = _mm512_setzero_ps();
        memset(w->ot + (size_t)c * hd * 16, 0, hd * 16 * sizeof(float));
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int32_t s0 = 0; s0 < max_n; s0 += TL_KEYS) {
        const int32_t nb = max_n - s0 < TL_KEYS ? max_n - s0 : TL_KEYS;
        for (int32_t j = 0; j < TL_KEYS; j++) {
            const uint16_t *ks = k + (size_t)(s0 + j) * kv_stride,
                           *vs = v + (size_t)(s0 + j) * kv_stride;
            for (size_t d = 0; d < hd; d += 16) {
                /* rows past the cache end are zero: probability 0 times a finite value */
                const bool in = j < nb;
                _mm512_store_ps(&w->kw[j][d],
                                in ? widen_bf16(_mm256_loadu_si256((const __m256i *)(ks + d)))
                                   : _mm512_setzero_ps());
                _mm512_store_ps(&w->vw[j][d],
                                in ? widen_bf16(_mm256_loadu_si256((const __m256i *)(vs + d)))
                                   : _mm512_setzero_ps());
            }
        }
        for (int32_t c = 0; c < nc; c++) {
            if (!_mm512_cmpgt_epi32_mask(lim[c], _mm512_set1_epi32(s0))) continue;
            __m512 p[TL_KEYS], alpha;
            tile_scores(w->qt + (size_t)c * hd * 16, (const float(*)[TL_HD])w->kw, hd, s0, lim[c],
                        vscale, &m[c], &l[c], p, &alpha);
            tile_pv_lanes(w->ot + (size_t)c * hd * 16, (const float(*)[TL_HD])w->vw, hd, p, alpha);
        }
    }
    for (int32_t c = 0; c < nc; c++) {
        /* rows that saw no key (n_ctx = 0) have sum 0 and output 0 */
        const __m512 inv = _mm512_maskz_div_ps(
            _mm512_cmp_ps_mask(l[c], _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), l[c]);
        const float *ot = w->ot + (size_t)c * hd * 16;
        const int32_t rows = nr - c * 16 < 16 ? nr - c * 16 : 16;
        float *dst[16];
        for (int32_t i = 0; i < rows; i++) dst[i] = row_out(r, r0 + c * 16 + i);
        for (size_t d = 0; d < hd; d++) {
            float o[16];
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_load_ps(ot + d * 16), inv));
            for (int32_t i = 0; i < rows; i++) dst[i][d] = o[i];
        }
    }
}

void epyq_attn_bf16_tile_avx512(const float *q, int32_t nt, int32_t nh, int32_t ldq_t,
                                int32_t ldq_h, const int32_t *n_ctx, const uint16_t *k,
                                const uint16_t *v, int32_t hd, int32_t kv_stride, float scale,
                                float *out, int32_t ldo_t, int32_t ldo_h) {
    if (hd % 16 != 0 || hd > TL_HD) {
        epyq_attn_bf16_tile_ref(q, nt, nh, ldq_t, ldq_h, n_ctx, k, v, hd, kv_stride, scale, out,
                                ldo_t, ldo_h);
        return;
    }
    const tile_rows r = {q, nh, ldq_t, ldq_h, ldo_t, ldo_h, n_ctx, out};
    const int32_t rows = nt * nh;
    for (int32_t r0 = 0; r0 < rows; r0 += 16 * TL_CH) {
        const int32_t nr = rows - r0 < 16 * TL_CH ? rows - r0 : 16 * TL_CH;
        if (nr <= TL_FEW) few_pass_n(&r, r0, nr, k, v, (size_t)hd, (size_t)kv_stride, scale);
        else
            tile_pass(&r, r0, nr, k, v, (size_t)hd, (size_t)kv_stride, scale);
    }
}
