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
 * others: a row's bits do not depend on which tile it was in. Up to 8 rows (a decode token)
 * keep the output as [row][d] and update it with d in the lanes, the same operations per
 * element in the same order, so the same bits at half the FMAs of 8 lanes of 16.
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
#define TL_FEW 8   /* rows that take tile_pv_rows: a decode token's GQA group */
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

/* The same update with d in lanes for a few rows (a decode token's GQA group), o [nr][hd]:
 * per element the same operations in the same order as tile_pv_lanes, so the same bits, at
 * nr/16 of its FMAs. */
INLINE void tile_pv_rows(float *o, int32_t nr, const float (*vw)[TL_HD], size_t hd, const __m512 *p,
                         __m512 alpha) {
    _Alignas(64) float pv[TL_KEYS][16], av[16];
    UNROLL16
    for (int32_t j = 0; j < TL_KEYS; j++) _mm512_store_ps(pv[j], p[j]);
    _mm512_store_ps(av, alpha);
    for (int32_t r = 0; r < nr; r++) {
        __m512 pr[TL_KEYS];
        UNROLL16
        for (int32_t j = 0; j < TL_KEYS; j++) pr[j] = _mm512_set1_ps(pv[j][r]);
        const __m512 ar = _mm512_set1_ps(av[r]);
        float *orow = o + (size_t)r * hd;
        for (size_t d = 0; d < hd; d += 16) {
            __m512 acc = _mm512_mul_ps(_mm512_load_ps(orow + d), ar);
            UNROLL16
            for (int32_t j = 0; j < TL_KEYS; j++)
                acc = _mm512_fmadd_ps(_mm512_load_ps(&vw[j][d]), pr[j], acc);
            _mm512_store_ps(orow + d, acc);
        }
    }
}

/* Rows [r0, r0 + nr) of a tile, nr <= 16 * TL_CH, in one pass over the keys they see. */
static void tile_pass(const tile_rows *r, int32_t r0, int32_t nr, const uint16_t *k,
                      const uint16_t *v, size_t hd, size_t kv_stride, float scale) {
    tile_ws *w = &tl_ws;
    const int32_t nc = (nr + 15) / 16;
    /* up to TL_FEW rows keep their output as [row][d] (tile_pv_rows), else [d][16 rows] */
    const bool few = nr <= TL_FEW;
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
        memset(w->ot + (size_t)c * hd * 16, 0, hd * 16 * sizeof(float)); /* either layout */
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
            if (few) tile_pv_rows(w->ot, nr, (const float(*)[TL_HD])w->vw, hd, p, alpha);
            else
                tile_pv_lanes(w->ot + (size_t)c * hd * 16, (const float(*)[TL_HD])w->vw, hd, p,
                              alpha);
        }
    }
    for (int32_t c = 0; c < nc; c++) {
        /* rows that saw no key (n_ctx = 0) have sum 0 and output 0 */
        const __m512 inv = _mm512_maskz_div_ps(
            _mm512_cmp_ps_mask(l[c], _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), l[c]);
        const float *ot = w->ot + (size_t)c * hd * 16;
        const int32_t rows = nr - c * 16 < 16 ? nr - c * 16 : 16;
        if (few) { /* the same multiply per element as below */
            _Alignas(64) float iv[16];
            _mm512_store_ps(iv, inv);
            for (int32_t i = 0; i < rows; i++) {
                const __m512 ri = _mm512_set1_ps(iv[i]);
                float *dst = row_out(r, r0 + i);
                for (size_t d = 0; d < hd; d += 16)
                    _mm512_storeu_ps(dst + d,
                                     _mm512_mul_ps(_mm512_load_ps(ot + (size_t)i * hd + d), ri));
            }
            continue;
        }
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
    for (int32_t r0 = 0; r0 < rows; r0 += 16 * TL_CH)
        tile_pass(&r, r0, rows - r0 < 16 * TL_CH ? rows - r0 : 16 * TL_CH, k, v, (size_t)hd,
                  (size_t)kv_stride, scale);
}
