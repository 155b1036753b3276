/* kernels-x86/kern.h — the kernel ABI: what model code may call. Kernels never know the
 * model; model code never contains intrinsics.
 *
 * Threading: every kernel is single-threaded and works on a caller-chosen slice of output
 * rows [n0, n1) (or of an expert's intermediate rows), so a thread pool splits work by
 * rows and results do not depend on the number of threads (no cross-thread reductions
 * inside a kernel).
 *
 * Dispatch: epyq_kern() returns the table picked once from cpuid + xgetbv, capped by
 * EPYQ_MAX_ISA=ref|avx2|avx512|avx512_vnni|avx512_bf16|avx512_amx. Every entry has a plain-C twin
 * in the "ref" table; tests compare each table against it (tests/kern/).
 *
 * Numeric paths for int4 weights (caller chooses per call through epyq_act.path):
 *   EPYQ_PATH_A16 — activations quantised to int16 per group of gs on the fly (step =
 *                   max|x|/32767: finer than bf16 rounding for every element above 1/128 of
 *                   its group's largest), VPDPWSSD, fp32 per-group rescale;
 *   EPYQ_PATH_A8  — activations quantised to int8 per group of gs on the fly (step =
 *                   max|x|/127), VPDPBUSD, fp32 per-group rescale.
 * Both integer dots are exact and every table performs the ref twin's fp32 epilogue, so
 * every table's int4 results equal the ref twin's bit for bit; each kernel file states its
 * bound against a double reference. */
#ifndef EPYQ_KERN_H
#define EPYQ_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum {
    EPYQ_ISA_REF = 0,
    EPYQ_ISA_AVX2,        /* Haswell+, Zen1+ (AVX2 + FMA + F16C) */
    EPYQ_ISA_AVX512,      /* AVX-512 F/BW/VL/DQ */
    EPYQ_ISA_AVX512_VNNI, /* + VNNI: Cascade Lake+, Zen4+ */
    EPYQ_ISA_AVX512_BF16, /* + BF16: Cooper Lake, Sapphire Rapids+, Zen4/Zen5 */
    EPYQ_ISA_AVX512_AMX,  /* + AMX-TILE/INT8 granted by the OS: Sapphire Rapids+ (no EPYC) */
    EPYQ_ISA_COUNT
} epyq_isa;

typedef enum {
    EPYQ_PATH_A16 = 0, /* int16 per-group activations (default for conformance) */
    EPYQ_PATH_A8 = 1,  /* int8 per-group activations (VNNI) */
} epyq_numpath;

/* An int4 matrix in canonical (unpacked) form: what every on-disk format decodes to
 * (src/load/q4_unpack.c) and what the packer consumes. w[j][i] = (q[j][i] - z[j][g]) * s[j][g]
 * with g = i / gs. */
typedef struct {
    int32_t n, k, gs;   /* logical [n out][k in]; k % gs == 0; gs in {32, 64, 128} */
    const uint8_t *q;   /* [n][k]    codes 0..15 */
    const float *s;     /* [n][k/gs] scales (exact widening of the on-disk bf16/f16) */
    const uint8_t *z;   /* [n][k/gs] zero points (0..16: GPTQ v1 can give 16); NULL = all 8 */
} epyq_q4_canon;

/* An int4 matrix in the kernels' packed layout (private to kernels-x86/w4_pack.c).
 * The caller owns `mem` (so the NUMA loader can place it on a node). */
typedef struct {
    int32_t n, k, gs;
    int32_t asym;  /* 1 when zero points are not all 8 */
    void *mem;     /* epyq_w4_pack_bytes() bytes, 64-byte aligned, layout private */
    size_t bytes;  /* bytes one full pass over the matrix streams (for GB/s figures) */
} epyq_w4;

size_t epyq_w4_pack_bytes(int32_t n, int32_t k, int32_t gs, int asym);
/* Pack src into dst->mem (which the caller allocated with epyq_w4_pack_bytes bytes).
 * Refuses (EPYQ_E_UNSUPPORTED) group sizes or shapes the kernels cannot take.
 * The packed form is asymmetric exactly when src->z is non-NULL and holds a value other
 * than 8, so size mem with asym = (src->z != NULL) unless that scan was done. */
epyq_status epyq_w4_pack(epyq_w4 *dst, void *mem, const epyq_q4_canon *src, epyq_err *err);
/* A view of output rows [n0, n1) of a packed matrix as a matrix of its own (row 0 = row n0),
 * sharing w's memory: n0 must be a multiple of 16 (tiles are contiguous). False otherwise. */
int epyq_w4_view(const epyq_w4 *w, int32_t n0, int32_t n1, epyq_w4 *view);
/* A copy of input columns [g0 gs, g1 gs) (whole groups g0 <= g < g1) of every row of w as a
 * matrix of its own, written to mem (epyq_w4_pack_bytes(w->n, (g1 - g0) * w->gs, w->gs,
 * w->asym) bytes, 64-byte aligned). Every core computes a row of the copy over its groups
 * [0, g1 - g0) exactly as it computes w's row over [g0, g1): the NUMA loader places one
 * intermediate slice of an expert's down projection on a node this way. 0 on a bad range. */
int epyq_w4_cols(const epyq_w4 *w, int32_t g0, int32_t g1, void *mem, epyq_w4 *out);
/* Decode one packed matrix back to canonical codes/scales/zeros (tests, --check). */
void epyq_w4_unpack(const epyq_w4 *w, uint8_t *q /*[n][k]*/, float *s /*[n][k/gs]*/, uint8_t *z /*[n][k/gs]*/);

/* Activations prepared once per input and shared by every kernel and thread that reads it. */
typedef struct {
    int32_t m, k, gs;     /* m rows of k values; gs = group size used for A8 scales */
    epyq_numpath path;
    const float *f32;     /* [m][k] the original activations */
    void *buf;            /* epyq_act_bytes() bytes: path-specific copy, layout private */
} epyq_act;

/* 0 when the int4 kernels cannot use the shape: k must be a multiple of 32 and of gs
 * (gs >= 32). The int4 kernels need x->gs equal to the weight's gs. */
size_t epyq_act_bytes(int32_t m, int32_t k, int32_t gs, epyq_numpath path);

/* dst = rows rows[0..n) of the prepared src, in that order, into buf (epyq_act_bytes(n, src->k,
 * src->gs, src->path) bytes): the bytes act_prep gives those rows, since a row's preparation
 * never depends on the other rows. dst->f32 is NULL (only the int4 kernels may read dst). */
void epyq_act_gather(const epyq_act *src, const int32_t *rows, int32_t n, void *buf, epyq_act *dst);

/* How quant_codes rounds one value x to an int4 code q in 0..15, given the per-group
 * factor a and the zero z, an integer in 0..15 (t, the scaled value, must be finite with
 * |t| < 2^31). rne = round half to even; bf16() = round to bf16, nearest even; each step
 * in fp32.
 *   EPYQ_Q4_ROUND_DIV      t = x / a;       q = clamp(rne(t) + z, 0, 15)
 *                          (GPTQ- and AWQ-style; z = 8 for a symmetric group)
 *   EPYQ_Q4_ROUND_DIV_BF16 t = bf16(x / a); q = rne(clamp(t, -8, 7)) + 8, z unused
 *                          (the quotient formed in a bf16 dtype: compressed-tensors-style)
 *   EPYQ_Q4_ROUND_MUL_SYM  t = x * a;       q = clamp(rne(t), -8, 7) + 8, z unused
 *                          (a is the reciprocal of the scale: Quark-style) */
typedef enum {
    EPYQ_Q4_ROUND_DIV = 0,
    EPYQ_Q4_ROUND_DIV_BF16,
    EPYQ_Q4_ROUND_MUL_SYM,
} epyq_q4_round;

/* How f32_gemm stores its product into C. */
typedef enum { EPYQ_GEMM_SET = 0, EPYQ_GEMM_ADD, EPYQ_GEMM_SUB } epyq_gemm_op;

/* The table of kernels for one ISA level. */
typedef struct epyq_kern_table {
    const char *name; /* "ref", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "avx512_amx" */
    epyq_isa isa;

    /* Prepare x [m][k] for `path` into buf (epyq_act_bytes bytes); fills *a. */
    void (*act_prep)(epyq_act *a, const float *x, int32_t m, int32_t k, int32_t gs,
                     epyq_numpath path, void *buf);

    /* y[t][j] = sum_i W[j][i] * x[t][i] for j in [n0, n1), t < x->m; y row stride ldy floats. */
    void (*w4_gemm)(const epyq_w4 *w, int32_t n0, int32_t n1, const epyq_act *x, float *y,
                    int32_t ldy);

    /* Fused routed expert over intermediate rows [i0, i1) (multiples of down->gs):
     *   y[t][:] = rw[t] * down[:, i0:i1] · ( silu(gate[i0:i1]·x_t) ⊙ (up[i0:i1]·x_t) )
     * y [m][down->n] with row stride ldy is WRITTEN (not accumulated); the caller sums the
     * slices of one expert and the experts of one token in a fixed order. gate/up/down use
     * x->path. scratch: w4_expert_scratch_bytes(m, i1 - i0, ...) bytes. */
    void (*w4_expert)(const epyq_w4 *gate, const epyq_w4 *up, const epyq_w4 *down, int32_t i0,
                      int32_t i1, const epyq_act *x, const float *rw, float *y, int32_t ldy,
                      void *scratch);
    size_t (*w4_expert_scratch_bytes)(int32_t m, int32_t n_inter, int32_t k);
    /* w4_expert in two phases, so one expert can be spread over several threads (one token's
     * 8 experts + shared expert do not divide evenly among 2 threads):
     *   w4_expert_gu:   h[t][i - i0] = silu(gate[i]·x_t) * (up[i]·x_t) for i in [i0, i1),
     *                   h row stride ldh (fp32);
     *   w4_expert_down: y[t][j] = rw[t] * down[j, i0:i1] · h_t for j in [n0, n1), t < m, from
     *                   h [m][i1 - i0] (contiguous), prepared for `path` inside.
     * gu over any split of [i0, i1) into multiples of 16 rows, then down over any split of
     * [0, down->n) into multiples of 16 rows, gives exactly w4_expert's bits. Scratch per call:
     * w4_expert_scratch_bytes(m, i1 - i0, k) bytes (either phase). */
    void (*w4_expert_gu)(const epyq_w4 *gate, const epyq_w4 *up, int32_t i0, int32_t i1,
                         const epyq_act *x, float *h, int32_t ldh, void *scratch);
    void (*w4_expert_down)(const epyq_w4 *down, int32_t n0, int32_t n1, int32_t i0, int32_t i1,
                           const float *h, int32_t m, epyq_numpath path, const float *rw,
                           float *y, int32_t ldy, void *scratch);

    /* Dense bf16 weights as stored on disk, row-major w [n][k] (row stride k):
     * y[t][j] = sum_i w[j][i] * x[t][i] for j in [n0, n1), t < x->m; y row stride ldy floats.
     * Only x->f32 [m][k] is read (x->path and x->buf are ignored, so an act prepared for any
     * path works): each x value is rounded to bf16 (nearest-even) and the bf16 x bf16 products
     * are summed in fp32 (VDPBF16PS on avx512_bf16) — what HF's bf16 matmul computes.
     * Any k >= 1 (ragged tails are masked); m in 1..64 is the tuned range, any m works. */
    void (*bf16_gemm)(const uint16_t *w, int32_t k, int32_t n0, int32_t n1, const epyq_act *x,
                      float *y, int32_t ldy);
    /* The fp32-exact variant: same contract, but x->f32 is NOT rounded; bf16 weights are
     * widened to fp32 (exact) and multiplied with fp32 FMA. The caller selects it by calling
     * this entry instead of bf16_gemm (e.g. for the router and lm_head when logits must match
     * an fp32 reference more closely); it streams the same bytes, so a GEMV costs the same. */
    void (*bf16_gemm_f32)(const uint16_t *w, int32_t k, int32_t n0, int32_t n1,
                          const epyq_act *x, float *y, int32_t ldy);

    /* Attention over a bf16 KV cache for one query head and one token:
     *   out[d] = sum_s softmax_s(scale * q·k_s) v_s[d], s < n_ctx; k/v rows of hd bf16,
     * row stride kv_stride elements. q, out: fp32 [hd]. n_ctx = 0 gives out = 0. Causal
     * masking is the caller's n_ctx (keys 0..pos). Any hd; SIMD tables need hd % 16 == 0
     * (avx512) / hd % 8 == 0 (avx2) and otherwise run the ref twin. */
    void (*attn_bf16)(const float *q, const uint16_t *k, const uint16_t *v, int32_t n_ctx,
                      int32_t hd, int32_t kv_stride, float scale, float *out);
    /* The same for nq query heads that share one kv head (GQA group, or several prefill
     * tokens of one head that see the same n_ctx): each k/v row is loaded once for all
     * heads. q [nq][ldq] fp32, out [nq][ldo] fp32; results equal nq calls of attn_bf16 up
     * to fp32 summation order. Online softmax (one pass over K/V) in both entries. */
    void (*attn_bf16_multi)(const float *q, int32_t nq, int32_t ldq, const uint16_t *k,
                            const uint16_t *v, int32_t n_ctx, int32_t hd, int32_t kv_stride,
                            float scale, float *out, int32_t ldo);
    /* Causal attention of a tile of prompt tokens of one sequence and the nh query heads of
     * one kv head: row (i, h), i < nt, h < nh, is attn_bf16 of q + i*ldq_t + h*ldq_h over the
     * keys [0, n_ctx[i]) into out + i*ldo_t + h*ldo_h (n_ctx [nt], any order, 0 allowed).
     * The SIMD tables load each K/V row once per up to 64 rows and compute every row
     * independently of the others (its bits do not depend on the tile it came in); results
     * equal attn_bf16 up to fp32 summation order and the block-wise exp. */
    void (*attn_bf16_tile)(const float *q, int32_t nt, int32_t nh, int32_t ldq_t, int32_t ldq_h,
                           const int32_t *n_ctx, const uint16_t *k, const uint16_t *v, int32_t hd,
                           int32_t kv_stride, float scale, float *out, int32_t ldo_t,
                           int32_t ldo_h);

    /* One Gated DeltaNet recurrent step for one value head (docs/architecture.md §4.5 step 7):
     *   S <- alpha*S; m = S^T k; d = beta*(v - m); S += k d^T; o = S^T q.
     * S fp32 [dk][dv] updated in place; k, q (already L2-normalised/scaled) [dk]; v, o [dv]. */
    void (*gdn_step)(float *S, const float *k, const float *v, const float *q, float alpha,
                     float beta, int32_t dk, int32_t dv, float *o);

    /* The same step over n >= 0 tokens of one value head, in order: token t (row
     * r = rows ? rows[t] : t) is gdn_step(S, k + r ld, v + r ld, q + r ld, alpha[t], beta[t],
     * dk, dv, o + r ldo). Every table gives the bits of n calls of its own gdn_step. The SIMD
     * tables walk S in column strips copied to an L1-sized buffer for all n tokens (value
     * columns are independent), and fold each token's m = S^T k into the previous token's
     * update pass: one pass over the strip per token instead of two over the whole state. */
    void (*gdn_seq)(float *S, const float *k, const float *v, const float *q, size_t ld,
                    const int32_t *rows, int32_t n, const float *alpha, const float *beta,
                    int32_t dk, int32_t dv, float *o, size_t ldo);

    /* Small fp32 matrix product (the chunked DeltaNet's WY/UT steps):
     *   C[i][j] (op) sum_l A[i][l] B[l][j],  i < m, j < n, l < k ascending,
     * op EPYQ_GEMM_SET (=), EPYQ_GEMM_ADD (+=) or EPYQ_GEMM_SUB (-=). A [m][lda], B [k][ldb],
     * C [m][ldc] fp32 row-major; m, n, k >= 0 (k = 0 is a zero product); C overlaps neither
     * A nor B. Each element's sum is one fp32 accumulator (the SIMD tables fuse the
     * multiply-adds), added into C once; elements of C outside m x n are not touched. */
    void (*f32_gemm)(float *C, int32_t ldc, const float *A, int32_t lda, const float *B,
                     int32_t ldb, int32_t m, int32_t n, int32_t k, epyq_gemm_op op);

    /* One token of a causal depthwise conv with SiLU over channels c < n (DeltaNet's conv1d):
     *   s[c] = w[kc-1][c] x[c] + sum_{r < kc-1} w[r][c] st[r][c], r ascending;
     *   st[r][c] <- st[r+1][c] for r < kc-2, st[kc-2][c] <- x[c] (the raw input);
     *   x[c] <- s[c] / (1 + e^-s[c]).
     * x [n] in place; st [kc-1][lds] fp32 (row r = tap r, oldest first); w [kc][ldw] fp32,
     * tap-major; kc >= 1. The state moves exactly; the SIMD tables fuse the multiply-adds
     * and use their own exp (error bound in tests/kern/test_dense.c). */
    void (*conv_silu)(float *x, float *st, size_t lds, const float *w, size_t ldw, int32_t kc,
                      int32_t n);

    /* DeltaNet's per-head norms over n >= 1 elements, in place:
     *   l2norm:        v[i] <- v[i] * (scale / sqrt(sum_j v[j]^2 + eps))
     *   gated_rmsnorm: o[i] <- o[i] * (1 / sqrt(sum_j o[j]^2 / n + eps)) * w[i] * silu(z[i])
     * The squares are summed in double and the factor in parentheses is rounded to fp32 once
     * (so every table's factor is the ref twin's but in rare rounding ties); the ref twin
     * takes expf, the SIMD tables their own exp (error bounds in tests/kern/test_dense.c).
     * Elements past n are not touched. */
    void (*l2norm)(float *v, int32_t n, float scale, double eps);
    void (*gated_rmsnorm)(float *o, const float *z, const float *w, int32_t n, double eps);

    /* Memory-bandwidth probe: sum of n floats (streaming loads). */
    double (*stream_read)(const float *buf, size_t n);

    /* Counter-based pseudo-normal numbers (the stream is defined in kernels-x86/counter_rng.h):
     *   out[o] = bf16(mean + sigma * epyq_rng_normal(epyq_rng_bits(key, i0 + o))), o < n,
     * product and sum each rounded to fp32 (never fused), bf16() rounding to nearest even,
     * the result kept as a float. A value depends only on (key, index), so any split of a
     * range into calls gives the same values; every table gives identical bits. Any i0 and
     * n; mean and sigma finite. */
    void (*fill_normal)(uint64_t key, float mean, float sigma, uint64_t i0, size_t n,
                        float *out);
    /* *mn / *mx = the smallest / largest of x[0..n), n >= 1, x free of NaN (a scan keeping
     * the first of equal values; only the sign of a zero result, when x holds both +0 and
     * -0, may differ between tables). */
    void (*minmax)(const float *x, size_t n, float *mn, float *mx);
    /* q[i] = int4 code of x[i] by `rule` with factor a and zero z (see epyq_q4_round), for
     * i < n: one quantisation group with its factor already chosen by the caller. Every
     * table gives identical codes. */
    void (*quant_codes)(const float *x, size_t n, float a, float z, epyq_q4_round rule,
                        uint8_t *q);
} epyq_kern_table;

/* The table for this process (host ISA capped by EPYQ_MAX_ISA), chosen once.
 * Every entry of every table is non-NULL once implemented at some level: a level that has
 * no own version of an entry serves the best lower level's (ref at the bottom). An
 * unparsable EPYQ_MAX_ISA makes epyq_kern() log one error and use "ref"; tools call
 * epyq_kern_init() first so the user gets the error and exit status instead. */
const epyq_kern_table *epyq_kern(void);
/* Validate EPYQ_MAX_ISA and pick the process table now; EPYQ_E_ARG names the bad value. */
epyq_status epyq_kern_init(epyq_err *err);
/* The table for host level `host` capped by the EPYQ_MAX_ISA-style string `cap` (NULL or
 * "" = no cap): a pure function of its arguments, so tests can exercise every case. */
epyq_status epyq_kern_select(epyq_isa host, const char *cap, const epyq_kern_table **out,
                             epyq_err *err);
/* The table for one level, or NULL if the host cannot run it (tests iterate these). */
const epyq_kern_table *epyq_kern_for_isa(epyq_isa isa);
/* What the host supports (cpuid + xgetbv), ignoring EPYQ_MAX_ISA. */
epyq_isa epyq_cpu_isa(void);
const char *epyq_isa_name(epyq_isa isa);
/* Parse "ref|avx2|avx512|avx512_vnni|avx512_bf16|avx512_amx"; -1 if unknown. */
int epyq_isa_parse(const char *s);
/* Parse a numeric path name "a16" | "a8" (the --path flag of every tool); -1 if unknown. */
int epyq_numpath_parse(const char *s);

#endif
