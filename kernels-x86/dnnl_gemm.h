/* kernels-x86/dnnl_gemm.h — oneDNN bf16 matmul for large prefill GEMMs.
 *
 * Promise: y[m][n] (row stride ldy) = x[m][k] . W^T with W bf16 [n][k] row-major as on disk
 * (the bf16_gemm contract of kern.h: x is rounded to bf16, products summed in fp32). One
 * primitive per (m, n, k, ldy) is built on first use and cached (LRU, 32 entries), so a
 * prefill loop over equal chunks pays primitive creation once. Safe to call from several
 * threads. Without oneDNN (configure found none) every call declines with
 * EPYQ_E_UNSUPPORTED and callers use epyq_kern()->bf16_gemm.
 *
 * Threads: oneDNN (Debian's build) runs on OpenMP, which our process serves with LLVM
 * libomp (see tests/unit/test_omp_runtime.c). Each call sets the calling thread's team size
 * to `threads` and libomp's block time to 0, so its workers sleep as soon as the GEMM
 * returns instead of spinning for 200 ms on the cores our decode pools are pinned to. */
#ifndef EPYQ_DNNL_GEMM_H
#define EPYQ_DNNL_GEMM_H

#include <stdint.h>

#include "core/status.h"

/* Smallest m for which callers should prefer this over epyq_kern()->bf16_gemm. Measured
 * with benchmarks/dense (8192 x 2048, M = 64/256/512): oneDNN's AMX kernels win by 4-10x on
 * Sapphire Rapids; restricted to AVX512_CORE_BF16 (what Zen 4/5 get) it still wins by
 * 5-25% (noisy, shared machine). Smaller m is decode-like: our kernels run on epyq's pinned
 * pools with no OpenMP team to wake, and the weight stream dominates. */
#define EPYQ_DNNL_MIN_M 64

/* 1 when the library was built with oneDNN. */
int epyq_dnnl_available(void);

epyq_status epyq_dnnl_gemm_bf16(const float *x /*[m][k]*/, int32_t m, int32_t k,
                                const uint16_t *w /*[n][k]*/, int32_t n, float *y /*[m][ldy]*/,
                                int32_t ldy, int32_t threads, epyq_err *err);

/* Drop every cached primitive (end of run; leak checkers). */
void epyq_dnnl_release(void);

#endif
