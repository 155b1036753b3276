/* kernels-x86/avx2/dense_avx2.c — dense kernels for the AVX2 table (AVX2 + FMA + F16C:
 * Haswell+, AMD Zen 1-3). Same algorithms and numerics as dense_avx512.c with 8-lane
 * vectors and 16 registers:
 *   epyq_bf16_gemm_avx2      x rounded to bf16 in-register, W widened, FMA (no VDPBF16PS)
 *   epyq_bf16_gemm_f32_avx2  fp32-exact variant
 *   epyq_attn_bf16[_multi]_avx2, epyq_attn_bf16_tile_avx2, epyq_gdn_step_avx2,
 *   epyq_conv_silu_avx2, epyq_l2norm_avx2, epyq_gated_rmsnorm_avx2, epyq_stream_read_avx2
 * GEMM register tile: 4 rows x 2 tokens (8 accumulators + operands fit 16
 * ymm; 8 rows x 1 token for a GEMV, to keep 8 weight streams in flight). Ragged k tails (k % 8) go
 * through a zero-padded 8-lane copy. Attention needs hd % 8 == 0 and the GDN step dv % 8 == 0;
 * other shapes are served by the ref twins. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels-x86/kern_impl.h"
#include "kernels-x86/w4_impl.h"

enum { MODE_ROUND, MODE_F32 };
#define TILE_R 4
#define TILE_T 2
#define GEMV_R 8 /* rows per tile for one token: 8 concurrent weight streams */

#define INLINE static inline __attribute__((always_inline))
/* Tile loops have compile-time trip counts after inlining; -O2 does not always unroll them,
 * and a rolled loop keeps the accumulators in memory instead of registers. */
#define UNROLL _Pragma("GCC unroll 8")

INLINE __m256 widen_bf16(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Nearest-even rounding to bf16 (kept as fp32); NaN lanes stay NaN. */
INLINE __m256 round_bf16(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One 8-lane step of the tile at k offset i; w8/x8 point at 8 readable values. */
INLINE void gemm_step(__m256 acc[GEMV_R][TILE_T], const uint16_t *const w8[GEMV_R],
                      const float *const x8[TILE_T], const int R, const int T, const int mode) {
    __m256 xf[TILE_T];
    UNROLL
    for (int t = 0; t < T; t++) {
        xf[t] = _mm256_loadu_ps(x8[t]);
        if (mode == MODE_ROUND) xf[t] = round_bf16(xf[t]);
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        const __m256 wf = widen_bf16(_mm_loadu_si128((const __m128i *)w8[r]));
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wf, xf[t], acc[r][t]);
    }
}

INLINE void gemm_tile(const uint16_t *w, size_t k, const float *x, size_t ldx, float *y,
                      size_t ldy, const int R, const int T, const int mode) {
    __m256 acc[GEMV_R][TILE_T];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    const uint16_t *wp[GEMV_R];
    const float *xp[TILE_T];
    size_t i = 0;
    for (; i + 8 <= k; i += 8) {
        UNROLL
        for (int r = 0; r < R; r++) wp[r] = w + (size_t)r * k + i;
        UNROLL
        for (int t = 0; t < T; t++) xp[t] = x + (size_t)t * ldx + i;
        gemm_step(acc, wp, xp, R, T, mode);
    }
    if (i < k) {
        uint16_t wt[GEMV_R][8] = {{0}};
        float xt[TILE_T][8] = {{0}};
        UNROLL
        for (int r = 0; r < R; r++) {
            memcpy(wt[r], w + (size_t)r * k + i, (k - i) * sizeof(uint16_t));
            wp[r] = wt[r];
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            memcpy(xt[t], x + (size_t)t * ldx + i, (k - i) * sizeof(float));
            xp[t] = xt[t];
        }
        gemm_step(acc, wp, xp, R, T, mode);
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + (size_t)r] = hsum(acc[r][t]);
}

INLINE void gemm(const uint16_t *w, int32_t k, int32_t n0, int32_t n1, const epyq_act *x,
                 float *y, int32_t ldy, const int mode) {
    const size_t kk = (size_t)k, ld = (size_t)ldy;
    const int32_t m = x->m;
    int32_t j = n0;
    if (m == 1)
        for (; j + GEMV_R <= n1; j += GEMV_R)
            gemm_tile(w + (size_t)j * kk, kk, x->f32, kk, y + j, ld, GEMV_R, 1, mode);
    for (; j + TILE_R <= n1; j += TILE_R) {
        int32_t t = 0;
        for (; t + TILE_T <= m; t += TILE_T)
            gemm_tile(w + (size_t)j * kk, kk, x->f32 + (size_t)t * kk, kk, y + (size_t)t * ld + j,
                      ld, TILE_R, TILE_T, mode);
        if (t < m)
            gemm_tile(w + (size_t)j * kk, kk, x->f32 + (size_t)t * kk, kk, y + (size_t)t * ld + j,
                      ld, TILE_R, 1, mode);
    }
    for (; j < n1; j++) {
        int32_t t = 0;
        for (; t + TILE_T <= m; t += TILE_T)
            gemm_tile(w + (size_t)j * kk, kk, x->f32 + (size_t)t * kk, kk, y + (size_t)t * ld + j,
                      ld, 1, TILE_T, mode);
        if (t < m)
            gemm_tile(w + (size_t)j * kk, kk, x->f32 + (size_t)t * kk, kk, y + (size_t)t * ld + j,
                      ld, 1, 1, mode);
    }
}

void epyq_bf16_gemm_avx2(const uint16_t *w, int32_t k, int32_t n0, int32_t n1, const epyq_act *x,
                         float *y, int32_t ldy) {
    gemm(w, k, n0, n1, x, y, ldy, MODE_ROUND);
}

void epyq_bf16_gemm_f32_avx2(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,
                             const epyq_act *x, float *y, int32_t ldy) {
    gemm(w, k, n0, n1, x, y, ldy, MODE_F32);
}

/* e^x for x <= 0: same split and polynomial as vec512.h (deg7 there too); 2^n is built in
 * the exponent field (n >= -126 after the clamp, so the result stays normal). */
INLINE __m256 exp_neg_poly(__m256 x, const int deg7) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    if (deg7) p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 5040.0f), r, p);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
INLINE __m256 exp_neg(__m256 x) { return exp_neg_poly(x, 0); }

#define ATT_BLOCK 8 /* keys per online-softmax step: one vector of scores */
#define ATT_HEADS 8 /* query heads per pass over K/V */

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
        for (int32_t s = 0; s < nb; s++) {
            const uint16_t *ks = k + (size_t)(s0 + s) * kv_stride;
            __m256 acc[ATT_HEADS];
            UNROLL
            for (int32_t h = 0; h < nq; h++) acc[h] = _mm256_setzero_ps();
            for (size_t d = 0; d < hd; d += 8) {
                const __m256 kf = widen_bf16(_mm_loadu_si128((const __m128i *)(ks + d)));
                UNROLL
                for (int32_t h = 0; h < nq; h++)
                    acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * ldq + d), kf, acc[h]);
            }
            UNROLL
            for (int32_t h = 0; h < nq; h++) p[h][s] = hsum(acc[h]) * scale;
        }
        UNROLL
        for (int32_t h = 0; h < nq; h++) {
            for (int32_t s = nb; s < ATT_BLOCK; s++) p[h][s] = -INFINITY;
            const __m256 sc = _mm256_loadu_ps(p[h]);
            const float bmax = hmax(sc);
            const float nmax = bmax > mx[h] ? bmax : mx[h];
            const float r = mx[h] == -INFINITY ? 0.0f : expf(mx[h] - nmax);
            __m256 e = exp_neg(_mm256_sub_ps(sc, _mm256_set1_ps(nmax)));
            /* dead lanes (score -inf) must weigh exactly 0, not the clamp's e^-87 */
            e = _mm256_and_ps(e, _mm256_cmp_ps(sc, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
            _mm256_storeu_ps(p[h], e);
            sum[h] = sum[h] * r + hsum(e);
            mx[h] = nmax;
            if (r != 1.0f) {
                const __m256 rv = _mm256_set1_ps(r);
                float *o = out + h * ldo;
                for (size_t d = 0; d < hd; d += 8)
                    _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), rv));
            }
        }
        for (size_t d = 0; d < hd; d += 8) {
            __m256 o[ATT_HEADS];
            UNROLL
            for (int32_t h = 0; h < nq; h++) o[h] = _mm256_loadu_ps(out + h * ldo + d);
            for (int32_t s = 0; s < nb; s++) {
                const uint16_t *vs = v + (size_t)(s0 + s) * kv_stride;
                const __m256 vf = widen_bf16(_mm_loadu_si128((const __m128i *)(vs + d)));
                UNROLL
                for (int32_t h = 0; h < nq; h++)
                    o[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[h][s]), vf, o[h]);
            }
            UNROLL
            for (int32_t h = 0; h < nq; h++) _mm256_storeu_ps(out + h * ldo + d, o[h]);
        }
    }
    UNROLL
    for (int32_t h = 0; h < nq; h++) {
        if (!(sum[h] > 0.0f)) continue;
        const __m256 inv = _mm256_set1_ps(1.0f / sum[h]);
        float *o = out + h * ldo;
        for (size_t d = 0; d < hd; d += 8)
            _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), inv));
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

void epyq_attn_bf16_multi_avx2(const float *q, int32_t nq, int32_t ldq, const uint16_t *k,
                               const uint16_t *v, int32_t n_ctx, int32_t hd, int32_t kv_stride,
                               float scale, float *out, int32_t ldo) {
    if (hd % 8 != 0) {
        epyq_attn_bf16_multi_ref(q, nq, ldq, k, v, n_ctx, hd, kv_stride, scale, out, ldo);
        return;
    }
    for (int32_t h = 0; h < nq; h += ATT_HEADS) {
        const int32_t g = nq - h < ATT_HEADS ? nq - h : ATT_HEADS;
        attn_group_n(q + (size_t)h * (size_t)ldq, g, (size_t)ldq, k, v, n_ctx, (size_t)hd,
                   (size_t)kv_stride, scale, out + (size_t)h * (size_t)ldo, (size_t)ldo);
    }
}

/* A prompt tile on AVX2: each token's heads share its K/V pass (the GQA kernel above); the
 * transposed-tile form of the AVX-512 table would need twice the registers AVX2 has. */
void epyq_attn_bf16_tile_avx2(const float *q, int32_t nt, int32_t nh, int32_t ldq_t, int32_t ldq_h,
                              const int32_t *n_ctx, const uint16_t *k, const uint16_t *v,
                              int32_t hd, int32_t kv_stride, float scale, float *out, int32_t ldo_t,
                              int32_t ldo_h) {
    for (int32_t i = 0; i < nt; i++)
        epyq_attn_bf16_multi_avx2(q + (size_t)i * (size_t)ldq_t, nh, ldq_h, k, v, n_ctx[i], hd,
                                  kv_stride, scale, out + (size_t)i * (size_t)ldo_t, ldo_h);
}

void epyq_attn_bf16_avx2(const float *q, const uint16_t *k, const uint16_t *v, int32_t n_ctx,
                         int32_t hd, int32_t kv_stride, float scale, float *out) {
    epyq_attn_bf16_multi_avx2(q, 1, hd, k, v, n_ctx, hd, kv_stride, scale, out, hd);
}

#define GDN_COLS 32 /* value columns per strip: 4 vectors each of m/delta and o */

/* One strip of nvec vectors of value columns starting at j0 (nvec a compile-time constant
 * at each call, so m/delta/o stay in registers). */
INLINE void gdn_strip(float *S, const float *k, const float *v, const float *q, __m256 va, __m256 vb,
                      int32_t dk, int32_t dv, int32_t j0, const int nvec, float *o) {
    __m256 acc[GDN_COLS / 8], dlt[GDN_COLS / 8];
    UNROLL
    for (int c = 0; c < nvec; c++) acc[c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < dk; i++) {
        const float *Si = S + (size_t)i * (size_t)dv + (size_t)j0;
        const __m256 ki = _mm256_set1_ps(k[i]);
        UNROLL
        for (int c = 0; c < nvec; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(Si + 8 * c), ki, acc[c]);
    }
    UNROLL
    for (int c = 0; c < nvec; c++) {
        const __m256 vv = _mm256_loadu_ps(v + j0 + 8 * c);
        dlt[c] = _mm256_mul_ps(vb, _mm256_fnmadd_ps(va, acc[c], vv));
        acc[c] = _mm256_setzero_ps();
    }
    for (int32_t i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * (size_t)dv + (size_t)j0;
        const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
        UNROLL
        for (int c = 0; c < nvec; c++) {
            const __m256 sn =
                _mm256_fmadd_ps(ki, dlt[c], _mm256_mul_ps(va, _mm256_loadu_ps(Si + 8 * c)));
            _mm256_storeu_ps(Si + 8 * c, sn);
            acc[c] = _mm256_fmadd_ps(sn, qi, acc[c]);
        }
    }
    UNROLL
    for (int c = 0; c < nvec; c++) _mm256_storeu_ps(o + j0 + 8 * c, acc[c]);
}

/* Same two-pass scheme as dense_avx512.c, in strips of 32 columns. */
void epyq_gdn_step_avx2(float *S, const float *k, const float *v, const float *q, float alpha,
                        float beta, int32_t dk, int32_t dv, float *o) {
    if (dv % 8 != 0) {
        epyq_gdn_step_ref(S, k, v, q, alpha, beta, dk, dv, o);
        return;
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int32_t j0 = 0; j0 < dv; j0 += GDN_COLS) {
        switch ((dv - j0 < GDN_COLS ? dv - j0 : GDN_COLS) / 8) {
#define CASE(N)                                                                                  \
    case N: gdn_strip(S, k, v, q, va, vb, dk, dv, j0, N, o); break;
            CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
        default: break; /* GDN_COLS / 8 == 4 */
        }
    }
}

/* SiLU as in dense_avx512.c: the exp argument is -|s|, one division, 0 below s = -87. */
INLINE __m256 silu(__m256 s) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 e = exp_neg_poly(_mm256_or_ps(s, sign), 1); /* -|s| */
    const __m256 neg = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 under = _mm256_cmp_ps(s, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    const __m256 num = _mm256_andnot_ps(under, _mm256_blendv_ps(s, _mm256_mul_ps(s, e), neg));
    return _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* silu(g) * u, 8 at a time; the tail takes the ref twin, whose operations these are
 * (w4_impl.h), so every element has the same bits either way. */
void epyq_silu_mul_avx2(const float *g, const float *u, float *h, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(h + i,
                         _mm256_mul_ps(silu(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (i < n) epyq_silu_mul_ref(g + i, u + i, h + i, n - i);
}

/* 8 channels a step; the channels past the last whole step take the ref twin. */
void epyq_conv_silu_avx2(float *x, float *st, size_t lds, const float *w, size_t ldw, int32_t kc,
                         int32_t n) {
    int32_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 raw = _mm256_loadu_ps(x + c);
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(w + (size_t)(kc - 1) * ldw + c), raw);
        for (int32_t r = 0; r < kc - 1; r++) {
            const __m256 t = _mm256_loadu_ps(st + (size_t)r * lds + c);
            s = _mm256_fmadd_ps(_mm256_loadu_ps(w + (size_t)r * ldw + c), t, s);
            if (r > 0) _mm256_storeu_ps(st + (size_t)(r - 1) * lds + c, t);
        }
        if (kc > 1) _mm256_storeu_ps(st + (size_t)(kc - 2) * lds + c, raw);
        _mm256_storeu_ps(x + c, silu(s));
    }
    if (c < n) epyq_conv_silu_ref(x + c, st + c, lds, w + c, ldw, kc, n - c);
}

/* ---- DeltaNet's per-head norms ------------------------------------------------------------ */

/* The lanes of an 8-wide step at i that lie below n (all 8 when n - i >= 8), as a maskload mask. */
INLINE __m256i tail_mask(int32_t n, int32_t i) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Sum of squares in double lanes, as the ref twin sums (see dense_avx512.c); the ragged tail
 * by a masked load. */
INLINE double sum_squares(const float *v, int32_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(v + i));
        const __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(v + i + 4));
        a0 = _mm256_fmadd_pd(x0, x0, a0);
        a1 = _mm256_fmadd_pd(x1, x1, a1);
    }
    for (; i < n; i += 4) {
        const __m128i m = _mm_cmpgt_epi32(_mm_set1_epi32(n - i), _mm_setr_epi32(0, 1, 2, 3));
        const __m256d x = _mm256_cvtps_pd(_mm_maskload_ps(v + i, m));
        a0 = _mm256_fmadd_pd(x, x, a0);
    }
    const __m256d a = _mm256_add_pd(a0, a1);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

void epyq_l2norm_avx2(float *v, int32_t n, float scale, double eps) {
    const __m256 inv = _mm256_set1_ps((float)(scale / sqrt(sum_squares(v, n) + eps)));
    for (int32_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n, i);
        _mm256_maskstore_ps(v + i, m, _mm256_mul_ps(_mm256_maskload_ps(v + i, m), inv));
    }
}

void epyq_gated_rmsnorm_avx2(float *o, const float *z, const float *w, int32_t n, double eps) {
    const __m256 inv = _mm256_set1_ps((float)(1.0 / sqrt(sum_squares(o, n) / n + eps)));
    for (int32_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n, i);
        const __m256 on = _mm256_mul_ps(_mm256_maskload_ps(o + i, m), inv);
        const __m256 ow = _mm256_mul_ps(on, _mm256_maskload_ps(w + i, m));
        _mm256_maskstore_ps(o + i, m, _mm256_mul_ps(ow, silu(_mm256_maskload_ps(z + i, m))));
    }
}

/* 8 interleaved streams, as in dense_avx512.c (see the reason there). */
#define READ_STREAMS 8

double epyq_stream_read_avx2(const float *buf, size_t n) {
    __m256 a[READ_STREAMS];
    UNROLL
    for (int s = 0; s < READ_STREAMS; s++) a[s] = _mm256_setzero_ps();
    const size_t per = n / READ_STREAMS / 16 * 16; /* floats per stream, whole cache lines */
    for (size_t i = 0; i < per; i += 16) {
        UNROLL
        for (int s = 0; s < READ_STREAMS; s++) {
            const float *p = buf + (size_t)s * per + i;
            a[s] = _mm256_add_ps(a[s], _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)));
        }
    }
    double tail = 0.0;
    for (size_t i = per * READ_STREAMS; i < n; i++) tail += buf[i];
    UNROLL
    for (int s = 1; s < READ_STREAMS; s++) a[0] = _mm256_add_ps(a[0], a[s]);
    return (double)hsum(a[0]) + tail;
}
