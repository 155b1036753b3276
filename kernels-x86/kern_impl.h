/* kernels-x86/kern_impl.h — the per-ISA kernel symbols the dispatch tables point at.
 *
 * Private to kernels-x86/: model code reaches kernels only through epyq_kern(). Each name
 * carries its ISA as a suffix; an ISA file defines only the entries it speeds up, and
 * dispatch.c fills every other slot of its table from the best lower level. Argument
 * meanings are those of the matching epyq_kern_table entry in kern.h. */
#ifndef EPYQ_KERN_IMPL_H
#define EPYQ_KERN_IMPL_H

#include "kernels-x86/kern.h"

/* The locality hint of every software prefetch along a weight stream (the bf16 GEMV's next
 * tile 32 KiB ahead, the int4 kernels' W4_PREFETCH ahead of each of up to 8 tile streams):
 * L2, not L1. Into a 32 KiB L1 (Zen 4) those lines were evicted before use. Zen 4 VM,
 * 2 threads, benchmarks/kernels: exact bf16 lm_head 78% -> 94% of the read probe, VDPBF16PS
 * 84% -> 97%, MoE of 8 experts A8 86% -> 95%, int4 lm_head-shaped GEMV 91% -> 99%. */
#define EPYQ_PF_WEIGHTS _MM_HINT_T1

/* Declares one dense kernel family for an ISA suffix. */
#define EPYQ_DECLARE_BF16_GEMM(sfx)                                                              \
    void epyq_bf16_gemm_##sfx(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,             \
                              const epyq_act *x, float *y, int32_t ldy)
#define EPYQ_DECLARE_BF16_GEMM_F32(sfx)                                                          \
    void epyq_bf16_gemm_f32_##sfx(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,         \
                                  const epyq_act *x, float *y, int32_t ldy)
#define EPYQ_DECLARE_ATTN(sfx)                                                                     \
    void epyq_attn_bf16_##sfx(const float *q, const uint16_t *k, const uint16_t *v, int32_t n_ctx, \
                              int32_t hd, int32_t kv_stride, float scale, float *out);             \
    void epyq_attn_bf16_multi_##sfx(const float *q, int32_t nq, int32_t ldq, const uint16_t *k,    \
                                    const uint16_t *v, int32_t n_ctx, int32_t hd,                  \
                                    int32_t kv_stride, float scale, float *out, int32_t ldo);      \
    void epyq_attn_bf16_tile_##sfx(const float *q, int32_t nt, int32_t nh, int32_t ldq_t,          \
                                   int32_t ldq_h, const int32_t *n_ctx, const uint16_t *k,         \
                                   const uint16_t *v, int32_t hd, int32_t kv_stride, float scale,  \
                                   float *out, int32_t ldo_t, int32_t ldo_h)
#define EPYQ_DECLARE_GDN(sfx)                                                                      \
    void epyq_gdn_step_##sfx(float *S, const float *k, const float *v, const float *q,             \
                             float alpha, float beta, int32_t dk, int32_t dv, float *o);           \
    void epyq_gdn_seq_##sfx(float *S, const float *k, const float *v, const float *q, size_t ld,   \
                            const int32_t *rows, int32_t n, const float *alpha, const float *beta, \
                            int32_t dk, int32_t dv, float *o, size_t ldo)
#define EPYQ_DECLARE_STREAM(sfx) double epyq_stream_read_##sfx(const float *buf, size_t n)
#define EPYQ_DECLARE_F32_GEMM(sfx)                                                                 \
    void epyq_f32_gemm_##sfx(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,   \
                             int32_t ldb, int32_t m, int32_t n, int32_t k, epyq_gemm_op op)
#define EPYQ_DECLARE_CONV(sfx)                                                                     \
    void epyq_conv_silu_##sfx(float *x, float *st, size_t lds, const float *w, size_t ldw,         \
                              int32_t kc, int32_t n)
#define EPYQ_DECLARE_NORMS(sfx)                                                                    \
    void epyq_l2norm_##sfx(float *v, int32_t n, float scale, double eps);                          \
    void epyq_gated_rmsnorm_##sfx(float *o, const float *z, const float *w, int32_t n, double eps)
/* Counter-based normal fill, group min/max and int4 rounding (the generator's loops). */
#define EPYQ_DECLARE_FILL_QUANT(sfx)                                                             \
    void epyq_fill_normal_##sfx(uint64_t key, float mean, float sigma, uint64_t i0, size_t n,   \
                                float *out);                                                    \
    void epyq_minmax_##sfx(const float *x, size_t n, float *mn, float *mx);                     \
    void epyq_quant_codes_##sfx(const float *x, size_t n, float a, float z, epyq_q4_round rule, \
                                uint8_t *q)

/* ref: plain C, always built (kernels-x86/ref/dense_ref.c). */
EPYQ_DECLARE_BF16_GEMM(ref);
EPYQ_DECLARE_BF16_GEMM_F32(ref);
EPYQ_DECLARE_ATTN(ref);
EPYQ_DECLARE_GDN(ref);
EPYQ_DECLARE_STREAM(ref);
EPYQ_DECLARE_F32_GEMM(ref);
EPYQ_DECLARE_CONV(ref);
EPYQ_DECLARE_NORMS(ref);
EPYQ_DECLARE_FILL_QUANT(ref); /* kernels-x86/ref/fill_quant_ref.c */

/* avx2: AVX2 + FMA + F16C (kernels-x86/avx2/dense_avx2.c). */
EPYQ_DECLARE_BF16_GEMM(avx2);
EPYQ_DECLARE_BF16_GEMM_F32(avx2);
EPYQ_DECLARE_ATTN(avx2);
EPYQ_DECLARE_GDN(avx2);
EPYQ_DECLARE_STREAM(avx2);
EPYQ_DECLARE_F32_GEMM(avx2); /* kernels-x86/avx2/f32_gemm_avx2.c */
EPYQ_DECLARE_CONV(avx2);
EPYQ_DECLARE_NORMS(avx2);
EPYQ_DECLARE_FILL_QUANT(avx2); /* kernels-x86/avx2/fill_quant_avx2.c */

/* avx512: F/BW/VL/DQ (kernels-x86/avx512/dense_avx512.c, attention in attn_avx512.c);
 * avx512bf16 adds VDPBF16PS. */
EPYQ_DECLARE_BF16_GEMM(avx512);
EPYQ_DECLARE_BF16_GEMM_F32(avx512);
EPYQ_DECLARE_ATTN(avx512);
EPYQ_DECLARE_GDN(avx512);
EPYQ_DECLARE_STREAM(avx512);
EPYQ_DECLARE_F32_GEMM(avx512); /* kernels-x86/avx512/f32_gemm_avx512.c */
EPYQ_DECLARE_CONV(avx512);
EPYQ_DECLARE_NORMS(avx512);
EPYQ_DECLARE_BF16_GEMM(avx512bf16);

/* int4 kernels (act_prep, w4_gemm, w4_expert, ...) are declared below by their owner. */

#endif
