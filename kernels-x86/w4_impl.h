/* kernels-x86/w4_impl.h — the int4 kernel symbols the dispatch tables point at, and the
 * one seam every ISA shares: a "core" that multiplies a range of packed tiles by prepared
 * activations. The entry points (w4_gemm, w4_expert) are the same few lines for every ISA,
 * so they live once in w4_drive.c and take the ISA's cores as arguments.
 *
 * Private to kernels-x86/. Argument meanings of the table entries are those in kern.h. */
#ifndef EPYQ_W4_IMPL_H
#define EPYQ_W4_IMPL_H

#include "kernels-x86/kern.h"

/* y[t][j - n0] = (rw ? rw[t] : 1) * sum_{g in [g0, g1)} W[j][g] . x[t][g - g0] for j in
 * [n0, n1), t < x->m; y row stride ldy. x holds exactly the k columns of groups [g0, g1)
 * (x->k == (g1 - g0) * w->gs), so a caller can multiply by a column slice of W (the down
 * projection of one expert slice). A8 cores need x->gs == w->gs. */
typedef void (*epyq_w4_core_fn)(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0,
                                int32_t g1, const epyq_act *x, float *y, int32_t ldy,
                                const float *rw);

typedef struct {
    epyq_w4_core_fn a8, a16;
    void (*act_prep)(epyq_act *a, const float *x, int32_t m, int32_t k, int32_t gs,
                     epyq_numpath path, void *buf);
    /* h[i] = silu(g[i]) * u[i], i < n: the expert's gate/up combination. Every ISA computes it
     * with the same operations as epyq_silu_mul_ref (e = e^-|g| by one Cody-Waite split and
     * a degree-7 polynomial, then g / (1 + e) or g e / (1 + e)), so w4_expert gives the ref
     * twin's bits. */
    void (*silu_mul)(const float *g, const float *u, float *h, int32_t n);
} epyq_w4_cores;

void epyq_silu_mul_ref(const float *g, const float *u, float *h, int32_t n);
void epyq_silu_mul_avx2(const float *g, const float *u, float *h, int32_t n);
void epyq_silu_mul_avx512(const float *g, const float *u, float *h, int32_t n);

/* The shared entry points (kernels-x86/w4_drive.c). */
void epyq_w4_gemm_with(const epyq_w4_cores *c, const epyq_w4 *w, int32_t n0, int32_t n1,
                       const epyq_act *x, float *y, int32_t ldy);
void epyq_w4_expert_with(const epyq_w4_cores *c, const epyq_w4 *gate, const epyq_w4 *up,
                         const epyq_w4 *down, int32_t i0, int32_t i1, const epyq_act *x,
                         const float *rw, float *y, int32_t ldy, void *scratch);
void epyq_w4_expert_gu_with(const epyq_w4_cores *c, const epyq_w4 *gate, const epyq_w4 *up,
                            int32_t i0, int32_t i1, const epyq_act *x, float *h, int32_t ldh,
                            void *scratch);
void epyq_w4_expert_down_with(const epyq_w4_cores *c, const epyq_w4 *down, int32_t n0, int32_t n1,
                              int32_t i0, int32_t i1, const float *h, int32_t m,
                              epyq_numpath path, const float *rw, float *y, int32_t ldy,
                              void *scratch);
size_t epyq_w4_expert_scratch_bytes(int32_t m, int32_t n_inter, int32_t k);

/* Declares the table entries of one ISA suffix. */
#define EPYQ_DECLARE_W4(sfx)                                                                     \
    void epyq_w4_gemm_##sfx(const epyq_w4 *w, int32_t n0, int32_t n1, const epyq_act *x,        \
                            float *y, int32_t ldy);                                              \
    void epyq_w4_expert_##sfx(const epyq_w4 *gate, const epyq_w4 *up, const epyq_w4 *down,      \
                              int32_t i0, int32_t i1, const epyq_act *x, const float *rw,       \
                              float *y, int32_t ldy, void *scratch);                           \
    void epyq_w4_expert_gu_##sfx(const epyq_w4 *gate, const epyq_w4 *up, int32_t i0, int32_t i1, \
                                 const epyq_act *x, float *h, int32_t ldh, void *scratch);       \
    void epyq_w4_expert_down_##sfx(const epyq_w4 *down, int32_t n0, int32_t n1, int32_t i0,      \
                                   int32_t i1, const float *h, int32_t m, epyq_numpath path,     \
                                   const float *rw, float *y, int32_t ldy, void *scratch)

/* Defines the table entries of one ISA suffix over its cores (one line per ISA file). */
#define EPYQ_DEFINE_W4(sfx, cores)                                                               \
    void epyq_w4_gemm_##sfx(const epyq_w4 *w, int32_t n0, int32_t n1, const epyq_act *x,        \
                            float *y, int32_t ldy) {                                             \
        epyq_w4_gemm_with(&(cores), w, n0, n1, x, y, ldy);                                       \
    }                                                                                            \
    void epyq_w4_expert_##sfx(const epyq_w4 *gate, const epyq_w4 *up, const epyq_w4 *down,      \
                              int32_t i0, int32_t i1, const epyq_act *x, const float *rw,       \
                              float *y, int32_t ldy, void *scratch) {                           \
        epyq_w4_expert_with(&(cores), gate, up, down, i0, i1, x, rw, y, ldy, scratch);           \
    }                                                                                            \
    void epyq_w4_expert_gu_##sfx(const epyq_w4 *gate, const epyq_w4 *up, int32_t i0, int32_t i1, \
                                 const epyq_act *x, float *h, int32_t ldh, void *scratch) {      \
        epyq_w4_expert_gu_with(&(cores), gate, up, i0, i1, x, h, ldh, scratch);                  \
    }                                                                                            \
    void epyq_w4_expert_down_##sfx(const epyq_w4 *down, int32_t n0, int32_t n1, int32_t i0,      \
                                   int32_t i1, const float *h, int32_t m, epyq_numpath path,     \
                                   const float *rw, float *y, int32_t ldy, void *scratch) {      \
        epyq_w4_expert_down_with(&(cores), down, n0, n1, i0, i1, h, m, path, rw, y, ldy,         \
                                 scratch);                                                       \
    }

/* ref: plain C (kernels-x86/ref/w4_ref.c) and the activation preparation (w4_act.c): one
 * rounding rule that every table must follow to the bit (the SIMD preparation repeats its
 * operations exactly). */
void epyq_act_prep_ref(epyq_act *a, const float *x, int32_t m, int32_t k, int32_t gs,
                       epyq_numpath path, void *buf);
void epyq_w4_core_a8_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                         const epyq_act *x, float *y, int32_t ldy, const float *rw);
void epyq_w4_core_a16_ref(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw);
EPYQ_DECLARE_W4(ref);

/* avx2: VPMADDUBSW (A8) and VPMADDWD (A16) (kernels-x86/avx2/w4_avx2.c).
 * Also serves the avx512 level (AVX-512 F/BW without VNNI has no faster int4 path here). */
void epyq_w4_core_a8_avx2(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw);
void epyq_w4_core_a16_avx2(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                           const epyq_act *x, float *y, int32_t ldy, const float *rw);
EPYQ_DECLARE_W4(avx2);

/* avx512: the activation preparation (kernels-x86/avx512/act_avx512.c), same bytes as ref. */
void epyq_act_prep_avx512(epyq_act *a, const float *x, int32_t m, int32_t k, int32_t gs,
                          epyq_numpath path, void *buf);

/* avx512_vnni: VPDPBUSD for A8 (kernels-x86/avx512/w4_vnni.c) and VPDPWSSD for A16
 * (kernels-x86/avx512/w4_i16.c); the avx512_bf16 level has no int4 kernels of its own. */
void epyq_w4_core_a8_avx512vnni(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0,
                                int32_t g1, const epyq_act *x, float *y, int32_t ldy,
                                const float *rw);
void epyq_w4_core_a16_avx512vnni(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0,
                                 int32_t g1, const epyq_act *x, float *y, int32_t ldy,
                                 const float *rw);
EPYQ_DECLARE_W4(avx512vnni);

/* avx512_amx: the A16 core on AMX-INT8 tiles for 16 or more activation rows (kernels-x86/
 * avx512/w4_amx.c; fewer rows and A8 use the avx512_vnni cores). Same bits as ref. */
void epyq_w4_core_a16_amx(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                          const epyq_act *x, float *y, int32_t ldy, const float *rw);
void epyq_w4_core_a8_amx(const epyq_w4 *w, int32_t n0, int32_t n1, int32_t g0, int32_t g1,
                         const epyq_act *x, float *y, int32_t ldy, const float *rw);
EPYQ_DECLARE_W4(amx);

/* Register-only peak probes for benchmarks/kernels (kernels-x86/avx512/w4_peak.c): run
 * `iters` rounds of 16 independent VPDPBUSD / VPDPWSSD / VDPBF16PS / fp32 VFMADD (zmm) and
 * return the operations done. */
uint64_t epyq_w4_peak_dpbusd_avx512vnni(uint64_t iters, int32_t *sink);
uint64_t epyq_w4_peak_dpwssd_avx512vnni(uint64_t iters, int32_t *sink);
uint64_t epyq_w4_peak_dpbf16_avx512bf16(uint64_t iters, float *sink);
uint64_t epyq_w4_peak_fma_avx512(uint64_t iters, float *sink);
/* The same for AMX (kernels-x86/avx512/w4_amx.c): 4 independent TDPBSSD per round. */
uint64_t epyq_w4_peak_tdpbssd_amx(uint64_t iters, int32_t *sink);

#endif
