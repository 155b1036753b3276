/* kernels-x86/ref/dense_ref.c — plain-C twins of the dense kernels (bf16 GEMM, attention
 * over a bf16 KV cache, Gated DeltaNet step, its causal conv and per-head norms, streaming
 * read).
 *
 * These are the readable definitions: every SIMD version performs the same roundings
 * (x -> bf16 for bf16_gemm, nothing for the rest) and differs only in fp32 summation
 * order and in its exp() approximation. tests/kern/test_dense.c checks both this file and
 * the SIMD tables against a double-precision reference; the bounds live there. */
#include <math.h>

#include "core/util.h"
#include "kernels-x86/kern_impl.h"

/* Dot products are summed strictly left to right in fp32: the simplest order to reason
 * about, and the one the error bounds in the tests were sized for (worst case). */
static void gemm_ref(const uint16_t *w, int32_t k, int32_t n0, int32_t n1, const epyq_act *x,
                     float *y, int32_t ldy, int round_x) {
    for (int32_t t = 0; t < x->m; t++) {
        const float *xt = x->f32 + (size_t)t * (size_t)k; /* [k] */
        for (int32_t j = n0; j < n1; j++) {
            const uint16_t *wj = w + (size_t)j * (size_t)k; /* [k] */
            float acc = 0.0f;
            for (int32_t i = 0; i < k; i++) {
                const float xi = round_x ? epyq_bf16_to_f32(epyq_f32_to_bf16(xt[i])) : xt[i];
                acc += epyq_bf16_to_f32(wj[i]) * xi;
            }
            y[(size_t)t * (size_t)ldy + (size_t)j] = acc;
        }
    }
}

void epyq_bf16_gemm_ref(const uint16_t *w, int32_t k, int32_t n0, int32_t n1, const epyq_act *x,
                        float *y, int32_t ldy) {
    gemm_ref(w, k, n0, n1, x, y, ldy, 1);
}

void epyq_bf16_gemm_f32_ref(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,
                            const epyq_act *x, float *y, int32_t ldy) {
    gemm_ref(w, k, n0, n1, x, y, ldy, 0);
}

/* Online softmax (one pass over K and V): keep the running max mx, the running sum of
 * exp(score - mx) and the weighted V sum; when a new score raises the max, rescale both by
 * exp(old - new). This is what the SIMD versions do block-wise. */
void epyq_attn_bf16_ref(const float *q, const uint16_t *k, const uint16_t *v, int32_t n_ctx,
                        int32_t hd, int32_t kv_stride, float scale, float *out) {
    float mx = -INFINITY, sum = 0.0f;
    for (int32_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (int32_t s = 0; s < n_ctx; s++) {
        const uint16_t *ks = k + (size_t)s * (size_t)kv_stride; /* [hd] */
        const uint16_t *vs = v + (size_t)s * (size_t)kv_stride; /* [hd] */
        float dot = 0.0f;
        for (int32_t d = 0; d < hd; d++) dot += q[d] * epyq_bf16_to_f32(ks[d]);
        const float sc = dot * scale;
        if (sc > mx) {
            const float r = expf(mx - sc); /* 0 on the first key (mx = -inf) */
            sum *= r;
            for (int32_t d = 0; d < hd; d++) out[d] *= r;
            mx = sc;
        }
        const float p = expf(sc - mx);
        sum += p;
        for (int32_t d = 0; d < hd; d++) out[d] += p * epyq_bf16_to_f32(vs[d]);
    }
    if (sum > 0.0f) {
        const float inv = 1.0f / sum;
        for (int32_t d = 0; d < hd; d++) out[d] *= inv;
    }
}

void epyq_attn_bf16_multi_ref(const float *q, int32_t nq, int32_t ldq, const uint16_t *k,
                              const uint16_t *v, int32_t n_ctx, int32_t hd, int32_t kv_stride,
                              float scale, float *out, int32_t ldo) {
    for (int32_t h = 0; h < nq; h++)
        epyq_attn_bf16_ref(q + (size_t)h * (size_t)ldq, k, v, n_ctx, hd, kv_stride, scale,
                           out + (size_t)h * (size_t)ldo);
}

void epyq_attn_bf16_tile_ref(const float *q, int32_t nt, int32_t nh, int32_t ldq_t, int32_t ldq_h,
                             const int32_t *n_ctx, const uint16_t *k, const uint16_t *v, int32_t hd,
                             int32_t kv_stride, float scale, float *out, int32_t ldo_t,
                             int32_t ldo_h) {
    for (int32_t i = 0; i < nt; i++)
        for (int32_t h = 0; h < nh; h++)
            epyq_attn_bf16_ref(q + (size_t)i * (size_t)ldq_t + (size_t)h * (size_t)ldq_h, k, v,
                               n_ctx[i], hd, kv_stride, scale,
                               out + (size_t)i * (size_t)ldo_t + (size_t)h * (size_t)ldo_h);
}

/* docs/architecture.md §4.5 step 7, in the order written there: decay, read m = S^T k, rank-1
 * update with delta = beta (v - m), then read the output with the updated state. */
void epyq_gdn_step_ref(float *S, const float *k, const float *v, const float *q, float alpha,
                       float beta, int32_t dk, int32_t dv, float *o) {
    for (size_t e = 0; e < (size_t)dk * (size_t)dv; e++) S[e] *= alpha;
    for (int32_t j = 0; j < dv; j++) {
        float m = 0.0f;
        for (int32_t i = 0; i < dk; i++) m += S[(size_t)i * (size_t)dv + (size_t)j] * k[i];
        o[j] = beta * (v[j] - m); /* o holds delta until the last loop */
    }
    for (int32_t i = 0; i < dk; i++)
        for (int32_t j = 0; j < dv; j++) S[(size_t)i * (size_t)dv + (size_t)j] += k[i] * o[j];
    for (int32_t j = 0; j < dv; j++) {
        float acc = 0.0f;
        for (int32_t i = 0; i < dk; i++) acc += S[(size_t)i * (size_t)dv + (size_t)j] * q[i];
        o[j] = acc;
    }
}

void epyq_gdn_seq_ref(float *S, const float *k, const float *v, const float *q, size_t ld,
                      const int32_t *rows, int32_t n, const float *alpha, const float *beta,
                      int32_t dk, int32_t dv, float *o, size_t ldo) {
    for (int32_t t = 0; t < n; t++) {
        const size_t r = (size_t)(rows ? rows[t] : t);
        epyq_gdn_step_ref(S, k + r * ld, v + r * ld, q + r * ld, alpha[t], beta[t], dk, dv,
                          o + r * ldo);
    }
}

void epyq_conv_silu_ref(float *x, float *st, size_t lds, const float *w, size_t ldw, int32_t kc,
                        int32_t n) {
    for (int32_t c = 0; c < n; c++) {
        const float raw = x[c];
        float s = w[(size_t)(kc - 1) * ldw + (size_t)c] * raw;
        for (int32_t r = 0; r < kc - 1; r++)
            s += w[(size_t)r * ldw + (size_t)c] * st[(size_t)r * lds + (size_t)c];
        for (int32_t r = 0; r + 1 < kc - 1; r++)
            st[(size_t)r * lds + (size_t)c] = st[(size_t)(r + 1) * lds + (size_t)c];
        if (kc > 1) st[(size_t)(kc - 2) * lds + (size_t)c] = raw;
        x[c] = s / (1.0f + expf(-s));
    }
}

/* The squares summed in double: the fp32 result does not depend on their order. */
static double sum_squares(const float *v, int32_t n) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += (double)v[i] * v[i];
    return ss;
}

void epyq_l2norm_ref(float *v, int32_t n, float scale, double eps) {
    const float inv = (float)(scale / sqrt(sum_squares(v, n) + eps));
    for (int32_t i = 0; i < n; i++) v[i] *= inv;
}

void epyq_gated_rmsnorm_ref(float *o, const float *z, const float *w, int32_t n, double eps) {
    const float inv = (float)(1.0 / sqrt(sum_squares(o, n) / n + eps));
    for (int32_t i = 0; i < n; i++)
        o[i] = o[i] * inv * w[i] * (z[i] * (1.0f / (1.0f + expf(-z[i]))));
}

double epyq_stream_read_ref(const float *buf, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += buf[i];
    return acc;
}

/* Row i of C in column blocks of GEMM_REF_NB: the block's accumulators walk l ascending, as
 * every element's sum does in the SIMD tables (there fused, here two roundings per term). */
#define GEMM_REF_NB 64
void epyq_f32_gemm_ref(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,
                       int32_t ldb, int32_t m, int32_t n, int32_t k, epyq_gemm_op op) {
    float acc[GEMM_REF_NB];
    for (int32_t i = 0; i < m; i++)
        for (int32_t j0 = 0; j0 < n; j0 += GEMM_REF_NB) {
            const int32_t nb = n - j0 < GEMM_REF_NB ? n - j0 : GEMM_REF_NB;
            for (int32_t j = 0; j < nb; j++) acc[j] = 0.0f;
            for (int32_t l = 0; l < k; l++) {
                const float a = A[(size_t)i * (size_t)lda + (size_t)l];
                const float *b = B + (size_t)l * (size_t)ldb + (size_t)j0;
                for (int32_t j = 0; j < nb; j++) acc[j] += a * b[j];
            }
            float *c = C + (size_t)i * (size_t)ldc + (size_t)j0;
            for (int32_t j = 0; j < nb; j++)
                c[j] = op == EPYQ_GEMM_SET   ? acc[j]
                       : op == EPYQ_GEMM_ADD ? c[j] + acc[j]
                                             : c[j] - acc[j];
        }
}
