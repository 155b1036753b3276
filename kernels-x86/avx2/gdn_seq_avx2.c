/* kernels-x86/avx2/gdn_seq_avx2.c — the Gated DeltaNet step over a run of tokens
 * (epyq_kern_table.gdn_seq) for the AVX2 table: gdn_seq_avx512.c's scheme with 8-lane
 * vectors, strips of 16 columns (16 ymm registers: m, delta and o of 2 vectors, 3 broadcasts).
 *
 * Why: one gdn_step reads the whole 64 KiB state twice per token (pass 1 for m = S^T k,
 * pass 2 for the update and o), more than a 48 KiB L1, so a prompt's DeltaNet ran at the
 * speed of L2. Value columns of the delta rule are independent, so a strip of SEQ_VEC
 * vectors of columns is copied to a contiguous stack buffer (8 KiB at dk = 128: whole rows
 * of S are 512 bytes apart and a strided strip would alias in the L1's sets) and carried
 * through all n tokens; token t + 1's pass 1 rides on token t's update pass (its m is the
 * sum over the freshly stored rows), so each token is one pass over an L1-resident strip.
 *
 * Bits: every lane does the operations of epyq_gdn_step_avx2 in its order (m by fmadd
 * from zero over ascending i on the state the next token's pass 1 would read, delta =
 * beta (v - alpha m), S = fma(k, delta, alpha S), o by fmadd over ascending i), so the
 * result equals n calls of that step bit for bit (tests/kern/test_gdn_seq.c). */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels-x86/kern_impl.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

#define SEQ_VEC 2      /* vectors of value columns per strip: 16 columns */
#define SEQ_DK_MAX 256 /* rows the strip buffer holds; larger dk runs step by step */

INLINE size_t row_of(const int32_t *rows, int32_t t) { return (size_t)(rows ? rows[t] : t); }

/* Token t's pass over the strip B [dk][w]: S = fma(k, delta, alpha S) stored back,
 * o += q_i S_i, and with next the following token's m += kn_i S_i (its pass 1). */
INLINE void update_pass(float *B, int w, int32_t dk, const float *kt, const float *qt,
                        const float *kn, __m256 va, const __m256 *dl, __m256 *acc, __m256 *m,
                        const int nvec, const bool next) {
    for (int32_t i = 0; i < dk; i++) {
        float *Bi = B + (size_t)i * w;
        const __m256 ki = _mm256_set1_ps(kt[i]), qi = _mm256_set1_ps(qt[i]);
        const __m256 ni = next ? _mm256_set1_ps(kn[i]) : _mm256_setzero_ps();
        UNROLL
        for (int c = 0; c < nvec; c++) {
            const __m256 sn =
                _mm256_fmadd_ps(ki, dl[c], _mm256_mul_ps(va, _mm256_loadu_ps(Bi + 8 * c)));
            _mm256_storeu_ps(Bi + 8 * c, sn);
            acc[c] = _mm256_fmadd_ps(sn, qi, acc[c]);
            if (next) m[c] = _mm256_fmadd_ps(sn, ni, m[c]);
        }
    }
}

/* One strip of nvec vectors at column j0 over all n tokens; B [dk][8 nvec] the strip. */
INLINE void seq_strip(float *B, const float *k, const float *v, const float *q, size_t ld,
                      const int32_t *rows, int32_t n, const float *alpha, const float *beta,
                      int32_t dk, int32_t j0, const int nvec, float *o, size_t ldo) {
    const int w = 8 * nvec;
    __m256 m[SEQ_VEC], dl[SEQ_VEC], acc[SEQ_VEC];
    const float *k0 = k + row_of(rows, 0) * ld;
    UNROLL
    for (int c = 0; c < nvec; c++) m[c] = _mm256_setzero_ps();
    for (int32_t i = 0; i < dk; i++) {
        const __m256 ki = _mm256_set1_ps(k0[i]);
        UNROLL
        for (int c = 0; c < nvec; c++)
            m[c] = _mm256_fmadd_ps(_mm256_loadu_ps(B + (size_t)i * w + 8 * c), ki, m[c]);
    }
    for (int32_t t = 0; t < n; t++) {
        const size_t r = row_of(rows, t);
        const float *kt = k + r * ld, *qt = q + r * ld, *vt = v + r * ld + j0;
        const __m256 va = _mm256_set1_ps(alpha[t]), vb = _mm256_set1_ps(beta[t]);
        UNROLL
        for (int c = 0; c < nvec; c++) {
            dl[c] = _mm256_mul_ps(vb, _mm256_fnmadd_ps(va, m[c], _mm256_loadu_ps(vt + 8 * c)));
            acc[c] = _mm256_setzero_ps();
            m[c] = _mm256_setzero_ps();
        }
        if (t + 1 < n)
            update_pass(B, w, dk, kt, qt, k + row_of(rows, t + 1) * ld, va, dl, acc, m, nvec, true);
        else
            update_pass(B, w, dk, kt, qt, kt, va, dl, acc, m, nvec, false);
        float *ot = o + r * ldo + j0;
        UNROLL
        for (int c = 0; c < nvec; c++) _mm256_storeu_ps(ot + 8 * c, acc[c]);
    }
}

void epyq_gdn_seq_avx2(float *S, const float *k, const float *v, const float *q, size_t ld,
                       const int32_t *rows, int32_t n, const float *alpha, const float *beta,
                       int32_t dk, int32_t dv, float *o, size_t ldo) {
    if (n <= 1 || dv % 8 != 0 || dk > SEQ_DK_MAX) {
        for (int32_t t = 0; t < n; t++) {
            const size_t r = row_of(rows, t);
            epyq_gdn_step_avx2(S, k + r * ld, v + r * ld, q + r * ld, alpha[t], beta[t], dk, dv,
                               o + r * ldo);
        }
        return;
    }
    _Alignas(32) float B[SEQ_DK_MAX * 8 * SEQ_VEC]; /* [dk][8 nvec] one strip */
    for (int32_t j0 = 0; j0 < dv; j0 += 8 * SEQ_VEC) {
        const int nvec = (dv - j0) / 8 < SEQ_VEC ? (dv - j0) / 8 : SEQ_VEC;
        const size_t wb = (size_t)nvec * 8 * sizeof(float);
        for (int32_t i = 0; i < dk; i++)
            memcpy(B + (size_t)i * 8 * nvec, S + (size_t)i * dv + j0, wb);
        switch (nvec) { /* nvec a constant in each strip: its vectors stay in registers */
        case 1: seq_strip(B, k, v, q, ld, rows, n, alpha, beta, dk, j0, 1, o, ldo); break;
        default: seq_strip(B, k, v, q, ld, rows, n, alpha, beta, dk, j0, 2, o, ldo); break;
        }
        for (int32_t i = 0; i < dk; i++)
            memcpy(S + (size_t)i * dv + j0, B + (size_t)i * 8 * nvec, wb);
    }
}
