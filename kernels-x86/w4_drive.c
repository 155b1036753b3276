/* kernels-x86/w4_drive.c — the int4 table entries, written once over an ISA's cores.
 *
 * w4_gemm is one core call. w4_expert fuses a routed expert over an intermediate slice:
 * gate and up are computed a round of rows at a time into a few KiB of scratch (they never reach
 * DRAM), combined into h = silu(gate) * up, h is prepared as the activation of the down
 * projection (same numeric path as x), and the down core multiplies the matching column
 * slice of down and applies the routing weight while writing y. Every step is a fixed
 * sequence, so a slice's result does not depend on how the caller splits other slices. */

#include "kernels-x86/w4_impl.h"
#include "kernels-x86/w4_layout.h"

/* Intermediate rows computed per gate/up round: large enough to amortise a core call,
 * small enough that gate/up results stay in L1 (2 x m x ch floats). With few tokens the
 * round is the core's whole stream, so it gets more rows: a one-row core walks 8 tiles
 * (128 rows) at once and prefetches only inside its call (w4_tiles1_fn), and 64-row
 * rounds left the gate/up streams without any software prefetch. */
static int32_t round_rows(int32_t m) { return m <= 4 ? 512 : 64; }

static epyq_w4_core_fn core_for(const epyq_w4_cores *c, epyq_numpath path) {
    return path == EPYQ_PATH_A8 ? c->a8 : c->a16;
}

void epyq_w4_gemm_with(const epyq_w4_cores *c, const epyq_w4 *w, int32_t n0, int32_t n1,
                       const epyq_act *x, float *y, int32_t ldy) {
    if (n1 <= n0) return;
    core_for(c, x->path)(w, n0, n1, 0, w->k / w->gs, x, y + n0, ldy, NULL);
}

/* Floats of each of the gate/up buffers: at least m x round_rows(m), and never less than for
 * a smaller m, so scratch sized for m rows serves every call with fewer (callers size it once
 * for their largest batch; m x round_rows(m) alone drops from 4 x 512 to 5 x 64). */
static size_t gu_floats(int32_t m) {
    const size_t many = (size_t)m * 64, few = (size_t)(m < 4 ? m : 4) * 512;
    return many > few ? many : few;
}

/* Scratch: h [m][n_inter] fp32 | gate, up [gu_floats(m)] fp32 each | h's prepared activation. */
static size_t off_gu(int32_t m, int32_t n_inter) {
    return w4_align64((size_t)m * (size_t)n_inter * sizeof(float));
}
static size_t off_act(int32_t m, int32_t n_inter) {
    return off_gu(m, n_inter) + 2 * w4_align64(gu_floats(m) * sizeof(float));
}

size_t epyq_w4_expert_scratch_bytes(int32_t m, int32_t n_inter, int32_t k) {
    (void)k; /* x is prepared by the caller; only intermediate-sized buffers live here */
    size_t a8 = epyq_act_bytes(m, n_inter, 32, EPYQ_PATH_A8);
    size_t a16 = epyq_act_bytes(m, n_inter, 32, EPYQ_PATH_A16);
    return off_act(m, n_inter) + (a8 > a16 ? a8 : a16);
}

void epyq_w4_expert_gu_with(const epyq_w4_cores *c, const epyq_w4 *gate, const epyq_w4 *up,
                            int32_t i0, int32_t i1, const epyq_act *x, float *h, int32_t ldh,
                            void *scratch) {
    const int32_t m = x->m, ch = round_rows(m);
    const epyq_w4_core_fn core = core_for(c, x->path);
    float *gt = (float *)scratch;                                               /* [m][ch] */
    float *ut = gt + w4_align64(gu_floats(m) * sizeof(float)) / sizeof(float); /* [m][ch] */
    for (int32_t r0 = i0; r0 < i1; r0 += ch) {
        const int32_t r1 = r0 + ch < i1 ? r0 + ch : i1;
        core(gate, r0, r1, 0, gate->k / gate->gs, x, gt, ch, NULL);
        core(up, r0, r1, 0, up->k / up->gs, x, ut, ch, NULL);
        for (int32_t t = 0; t < m; t++)
            c->silu_mul(gt + (size_t)t * (size_t)ch, ut + (size_t)t * (size_t)ch,
                        h + (size_t)t * (size_t)ldh + (size_t)(r0 - i0), r1 - r0);
    }
}

void epyq_w4_expert_down_with(const epyq_w4_cores *c, const epyq_w4 *down, int32_t n0, int32_t n1,
                              int32_t i0, int32_t i1, const float *h, int32_t m,
                              epyq_numpath path, const float *rw, float *y, int32_t ldy,
                              void *scratch) {
    if (n1 <= n0) return;
    epyq_act hx;
    c->act_prep(&hx, h, m, i1 - i0, down->gs, path, scratch);
    core_for(c, path)(down, n0, n1, i0 / down->gs, i1 / down->gs, &hx, y + n0, ldy, rw);
}

/* The fused expert is the two phases back to back, so splitting them over threads (rows of
 * h, rows of y) reproduces its bits. */
void epyq_w4_expert_with(const epyq_w4_cores *c, const epyq_w4 *gate, const epyq_w4 *up,
                         const epyq_w4 *down, int32_t i0, int32_t i1, const epyq_act *x,
                         const float *rw, float *y, int32_t ldy, void *scratch) {
    const int32_t m = x->m, ni = i1 - i0;
    uint8_t *sb = (uint8_t *)scratch;
    float *h = (float *)sb; /* [m][ni] */
    epyq_w4_expert_gu_with(c, gate, up, i0, i1, x, h, ni, sb + off_gu(m, ni));
    epyq_w4_expert_down_with(c, down, 0, down->n, i0, i1, h, m, x->path, rw, y, ldy,
                             sb + off_act(m, ni));
}
