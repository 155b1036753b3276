/* src/model/deltanet.c — Gated DeltaNet over a batch (docs/architecture.md §4.5).
 *
 * Projections run over the whole batch; the causal conv and the delta rule run per sequence
 * in token order. The delta rule has two forms that compute the same thing: the recurrent one
 * (a value head's run of tokens through the gdn_seq kernel, bit-equal to one gdn_step per
 * token, which verification keeps for its per-token state snapshots) and the chunked one (chunks of
 * 64 tokens, a triangular solve per chunk), chosen per sequence by how many tokens it has in the
 * batch (epyq_model_opts.gdn_chunk_min; recurrent by default, see there). The state stays fp32
 * either way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

#define GDN_CHUNK 64
/* tokens per gdn_seq call of the recurrent form (each call re-reads the strip once more) */
#define GDN_SEQ_BLOCK 128

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
/* torch softplus: x itself above 20 */
static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* the q/k L2 norm's epsilon (the reference's l2norm) */
#define GDN_L2_EPS 1e-6

/* One chunk of c <= GDN_CHUNK tokens of one head in the WY/UT form (docs/architecture.md §4.5):
 * every step with O(c d^2) or O(c^2 d) work is one f32_gemm call, so the state S (dk x dv,
 * 64 KiB at 128 x 128) is read by register-blocked products once per chunk instead of three
 * times per token. Rows of q/k (stride ld_qk), v (ld_v), o (ld_o); g = log decay per token,
 * beta per token; ws holds chunk_ws_floats(dk, dv) floats. */
static void chunk_one(const epyq_kern_table *kt, float *S, const float *q, const float *k,
                      const float *v, const float *g, const float *beta, int32_t c, int32_t ld_qk,
                      int32_t ld_v, int32_t dk, int32_t dv, float *o, int32_t ld_o, float *ws) {
    enum { C = GDN_CHUNK };
    const int32_t dm = dk > dv ? dk : dv;
    float *Kt = ws;                 /* [dk][C] k transposed, later scaled per column */
    float *A = Kt + (size_t)dk * C; /* [C][C] beta_t k_t.k_s decay_ts, s < t; then P */
    float *Ti = A + (size_t)C * C;  /* [C][C] (I + A)^-1, unit lower triangular */
    float *D = Ti + (size_t)C * C;  /* [C][C] decay_ts = e^(gam_t - gam_s), s <= t */
    float *R = D + (size_t)C * C;   /* [C][dm] right-hand sides, then e^gam Q */
    float *U = R + (size_t)C * dm;  /* [C][dv] U, then V_new */
    float *W = U + (size_t)C * dv;  /* [C][dk] */
    double gam[C], acc = 0.0;
    float eg[C];
    for (int32_t t = 0; t < c; t++) gam[t] = (acc += g[t]), eg[t] = (float)exp(gam[t]);
    /* every decay the chunk needs (A, P and the state update's last row), once */
    for (int32_t t = 0; t < c; t++)
        for (int32_t s = 0; s <= t; s++) D[(size_t)t * C + s] = expf((float)(gam[t] - gam[s]));
    for (int32_t s = 0; s < c; s++)
        for (int32_t i = 0; i < dk; i++) Kt[(size_t)i * C + s] = k[(size_t)s * ld_qk + i];
    /* A[t][s] = beta_t (k_t . k_s) e^(gam_t - gam_s) below the diagonal, 0 elsewhere */
    kt->f32_gemm(A, C, k, ld_qk, Kt, C, c, c, dk, EPYQ_GEMM_SET);
    for (int32_t t = 0; t < c; t++) {
        float *at = A + (size_t)t * C;
        for (int32_t s = 0; s < t; s++) at[s] *= beta[t] * D[(size_t)t * C + s];
        for (int32_t s = t; s < c; s++) at[s] = 0.0f;
    }
    /* Ti = (I + A)^-1 by rows: Ti_t = e_t - sum_{s<t} A_ts Ti_s (Ti_s is zero beyond column s) */
    for (int32_t t = 0; t < c; t++) {
        float *tt = Ti + (size_t)t * C;
        for (int32_t j = 0; j < c; j++) tt[j] = j == t ? 1.0f : 0.0f;
        for (int32_t s = 0; s < t; s++) {
            const float a = A[(size_t)t * C + s], *ts = Ti + (size_t)s * C;
            for (int32_t j = 0; j <= s; j++) tt[j] -= a * ts[j];
        }
    }
    /* U = Ti (beta V), W = Ti (beta e^gam K), then V_new = U - W S0 */
    for (int32_t t = 0; t < c; t++)
        for (int32_t j = 0; j < dv; j++) R[(size_t)t * dm + j] = beta[t] * v[(size_t)t * ld_v + j];
    kt->f32_gemm(U, dv, Ti, C, R, dm, c, dv, c, EPYQ_GEMM_SET);
    for (int32_t t = 0; t < c; t++) {
        const float bw = beta[t] * eg[t];
        for (int32_t i = 0; i < dk; i++) R[(size_t)t * dm + i] = bw * k[(size_t)t * ld_qk + i];
    }
    kt->f32_gemm(W, dk, Ti, C, R, dm, c, dk, c, EPYQ_GEMM_SET);
    kt->f32_gemm(U, dv, W, dk, S, dv, c, dv, dk, EPYQ_GEMM_SUB);
    /* O = (e^gam Q) S0 + P V_new, P[t][s] = (q_t . k_s) e^(gam_t - gam_s) for s <= t */
    for (int32_t t = 0; t < c; t++)
        for (int32_t i = 0; i < dk; i++) R[(size_t)t * dm + i] = eg[t] * q[(size_t)t * ld_qk + i];
    kt->f32_gemm(o, ld_o, R, dm, S, dv, c, dv, dk, EPYQ_GEMM_SET);
    float *P = A;
    kt->f32_gemm(P, C, q, ld_qk, Kt, C, c, c, dk, EPYQ_GEMM_SET);
    for (int32_t t = 0; t < c; t++) {
        float *pt = P + (size_t)t * C;
        for (int32_t s = 0; s < t; s++) pt[s] *= D[(size_t)t * C + s];
        for (int32_t s = t + 1; s < c; s++) pt[s] = 0.0f;
    }
    kt->f32_gemm(o, ld_o, P, C, U, dv, c, dv, c, EPYQ_GEMM_ADD);
    /* S1 = e^gam_C S0 + sum_s e^(gam_C - gam_s) k_s V_new_s^T */
    const float eC = eg[c - 1];
    for (size_t i = 0; i < (size_t)dk * dv; i++) S[i] *= eC;
    for (int32_t s = 0; s < c; s++) {
        const float f = D[(size_t)(c - 1) * C + s];
        for (int32_t i = 0; i < dk; i++) Kt[(size_t)i * C + s] *= f;
    }
    kt->f32_gemm(S, dv, Kt, C, U, dv, dk, dv, c, EPYQ_GEMM_ADD);
}

/* Floats of chunk_one's workspace: Kt [dk][C], A, Ti and D [C][C], R [C][max(dk, dv)],
 * U [C][dv], W [C][dk]. */
static size_t chunk_ws_floats(int32_t dk, int32_t dv) {
    return (size_t)GDN_CHUNK * (2 * (size_t)dk + 3 * GDN_CHUNK + (dk > dv ? dk : dv) + (size_t)dv);
}

static void chunk_head_ws(const epyq_kern_table *kt, float *S, const float *q, const float *k,
                          const float *v, const float *g, const float *beta, int32_t n,
                          int32_t ld_qk, int32_t ld_v, int32_t dk, int32_t dv, float *o,
                          int32_t ld_o, float *ws) {
    for (int32_t t0 = 0; t0 < n; t0 += GDN_CHUNK) {
        int32_t c = n - t0 < GDN_CHUNK ? n - t0 : GDN_CHUNK;
        chunk_one(kt, S, q + (size_t)t0 * ld_qk, k + (size_t)t0 * ld_qk, v + (size_t)t0 * ld_v,
                  g + t0, beta + t0, c, ld_qk, ld_v, dk, dv, o + (size_t)t0 * ld_o, ld_o, ws);
    }
}

epyq_status epyq_gdn_chunk_head(const epyq_kern_table *kt, float *S, const float *q, const float *k,
                                const float *v, const float *g, const float *beta, int32_t n,
                                int32_t ld_qk, int32_t ld_v, int32_t dk, int32_t dv, float *o,
                                int32_t ld_o, epyq_err *err) {
    float *ws = malloc(chunk_ws_floats(dk, dv) * sizeof(float));
    if (!ws)
        return epyq_err_set(err, EPYQ_E_NOMEM,
                            "DeltaNet: no memory for a chunk workspace of %zu floats",
                            chunk_ws_floats(dk, dv));
    chunk_head_ws(kt, S, q, k, v, g, beta, n, ld_qk, ld_v, dk, dv, o, ld_o, ws);
    free(ws);
    return EPYQ_OK;
}

typedef struct {
    const epyq_model *m;
    const epyq_layer_rw *ly;
    const epyq_batch_plan *p;
    float *u;            /* [T][conv_dim] conv output: q | k | v, q/k normalised */
    const float *g;      /* [T][Hv] log decay */
    const float *beta;   /* [T][Hv] */
    float *o;            /* [T][Hv*Dv] */
    const float *z;      /* [T][Hv*Dv] output gate input */
    bool *chunked;       /* [n_groups] */
    float *work;         /* chunked groups: per worker, work_per floats (gather + chunk buffers) */
    size_t work_per;
} gdn_job;

/* Asks for floats [0, n) of row p ahead of use (rw: 1 if it will be written). The conv and
 * the gated norm walk one head's channels through each token's row of the projection output,
 * rows a whole projection row (32 KiB) apart that no hardware prefetcher follows; without
 * this they waited on each row (8-layer pp512: the gated norm 140 -> 42 us a head). */
static void prefetch_row(const float *p, int32_t n, int rw) {
    for (int32_t c = 0; c < n; c += 16) { /* one 64-byte line per 16 floats */
        if (rw) __builtin_prefetch(p + c, 1, 3);
        else
            __builtin_prefetch(p + c, 0, 3);
    }
}

/* The gated RMSNorm of one value head over the task's tokens (n(o) * w * silu(z), in place): in
 * the head's task, so the pool runs it in parallel rather than the caller alone afterwards. */
static void gated_norm_rows(const gdn_job *j, const int32_t *toks, int32_t n, int32_t vh) {
    const epyq_model *m = j->m;
    size_t vd = (size_t)m->d.Hv * m->d.Dv, off = (size_t)vh * m->d.Dv;
    for (int32_t i = 0; i < n; i++) {
        if (i + 2 < n) prefetch_row(j->z + (size_t)toks[i + 2] * vd + off, m->d.Dv, 0);
        m->kt->gated_rmsnorm(j->o + (size_t)toks[i] * vd + off, j->z + (size_t)toks[i] * vd + off,
                             j->ly->g.norm, m->d.Dv, m->eps);
    }
}

/* One (sequence, value head): the delta rule over that sequence's tokens in order. */
static void gdn_task(void *ctx, int32_t task, int32_t worker) {
    const gdn_job *j = ctx;
    const epyq_model *m = j->m;
    const epyq_batch_plan *p = j->p;
    int32_t grp = task / m->d.Hv, vh = task % m->d.Hv, kh = vh / (m->d.Hv / m->d.Hk);
    int32_t key_dim = m->d.Hk * m->d.Dk, cd = m->d.conv_dim, Hv = m->d.Hv;
    const int32_t *toks = p->grp_tok + p->grp_off[grp];
    int32_t n = p->grp_off[grp + 1] - p->grp_off[grp];
    epyq_seq *s = p->seq[toks[0]];
    float *S = s->S + ((size_t)j->ly->slot * Hv + vh) * m->d.Dk * m->d.Dv;
    if (j->chunked[grp]) {
        /* gather this head's rows (tokens of one sequence need not be adjacent in the batch)
         * into the worker's workspace, allocated before any state moved (epyq_gdn_block) */
        size_t rows = (size_t)n;
        float *q = j->work + (size_t)worker * j->work_per, *k = q + rows * m->d.Dk,
              *v = k + rows * m->d.Dk;
        float *o = v + rows * m->d.Dv, *g = o + rows * m->d.Dv, *b = g + rows;
        for (int32_t i = 0; i < n; i++) {
            const float *ut = j->u + (size_t)toks[i] * cd;
            memcpy(q + (size_t)i * m->d.Dk, ut + (size_t)kh * m->d.Dk,
                   (size_t)m->d.Dk * sizeof(float));
            memcpy(k + (size_t)i * m->d.Dk, ut + key_dim + (size_t)kh * m->d.Dk,
                   (size_t)m->d.Dk * sizeof(float));
            memcpy(v + (size_t)i * m->d.Dv, ut + 2 * key_dim + (size_t)vh * m->d.Dv,
                   (size_t)m->d.Dv * sizeof(float));
            g[i] = j->g[(size_t)toks[i] * Hv + vh];
            b[i] = j->beta[(size_t)toks[i] * Hv + vh];
        }
        chunk_head_ws(m->kt, S, q, k, v, g, b, n, m->d.Dk, m->d.Dv, m->d.Dk, m->d.Dv, o, m->d.Dv,
                      b + rows);
        for (int32_t i = 0; i < n; i++)
            memcpy(j->o + (size_t)toks[i] * Hv * m->d.Dv + (size_t)vh * m->d.Dv,
                   o + (size_t)i * m->d.Dv, (size_t)m->d.Dv * sizeof(float));
        gated_norm_rows(j, toks, n, vh);
        return;
    }
    /* The run through gdn_seq (one pass over an L1-resident strip of S per token), in blocks
     * whose gates sit on the stack. Speculative verification needs the state after each token
     * but the last (the state itself is that after the forward, seq.c): blocks of one token
     * there, which gdn_seq runs as one gdn_step. */
    size_t sd = (size_t)m->d.Dk * m->d.Dv;
    const int32_t blk = s->spec_n > 1 ? 1 : GDN_SEQ_BLOCK;
    float al[GDN_SEQ_BLOCK], be[GDN_SEQ_BLOCK];
    for (int32_t i0 = 0; i0 < n; i0 += blk) {
        int32_t nb = n - i0 < blk ? n - i0 : blk;
        for (int32_t b = 0; b < nb; b++) {
            size_t gi = (size_t)toks[i0 + b] * Hv + vh;
            al[b] = expf(j->g[gi]);
            be[b] = j->beta[gi];
        }
        m->kt->gdn_seq(S, j->u + key_dim + (size_t)kh * m->d.Dk,
                       j->u + 2 * key_dim + (size_t)vh * m->d.Dv, j->u + (size_t)kh * m->d.Dk,
                       (size_t)cd, toks + i0, nb, al, be, m->d.Dk, m->d.Dv,
                       j->o + (size_t)vh * m->d.Dv, (size_t)Hv * m->d.Dv);
        if (i0 < s->spec_n - 1) /* blk is 1 here: the state after token i0 */
            memcpy(s->spec_S + (((size_t)i0 * m->n_gdn + j->ly->slot) * Hv + vh) * sd, S,
                   sd * sizeof(float));
    }
    gated_norm_rows(j, toks, n, vh);
}

/* Causal depthwise conv + SiLU of channels [c0, c1) for one sequence's tokens, in order. The
 * key head's block keeps the raw inputs, [taps][ch] with channel c0 at column l0; snap: the
 * block's copy in the first speculative slot (slots snap_stride floats apart). */
static void conv_range(const epyq_model *m, const epyq_gdn_rw *g, float *state, const int32_t *toks,
                       int32_t n, float *u, int32_t c0, int32_t c1, int32_t l0, float *snap,
                       size_t snap_stride, int32_t n_snap) {
    int32_t cd = m->d.conv_dim, Kc = m->d.Kc, ch = epyq_seq_conv_ch(m);
    for (int32_t i = 0; i < n; i++) {
        if (i + 2 < n) prefetch_row(u + (size_t)toks[i + 2] * cd + c0, c1 - c0, 1);
        if (i > 0 && i - 1 < n_snap) /* the state after token i - 1 (speculative verification) */
            for (int32_t r = 0; r < Kc - 1; r++)
                memcpy(snap + (size_t)(i - 1) * snap_stride + (size_t)r * ch + l0,
                       state + (size_t)r * ch + l0, (size_t)(c1 - c0) * sizeof(float));
        /* state [Kc-1][ch], channel c0 at column l0 */
        m->kt->conv_silu(u + (size_t)toks[i] * cd + c0, state + l0, (size_t)ch, g->conv + c0,
                         (size_t)cd, Kc, c1 - c0);
    }
    if (n > 0 && n - 1 < n_snap)
        for (int32_t r = 0; r < Kc - 1; r++)
            memcpy(snap + (size_t)(n - 1) * snap_stride + (size_t)r * ch + l0,
                   state + (size_t)r * ch + l0, (size_t)(c1 - c0) * sizeof(float));
}

typedef struct {
    const epyq_model *m;
    const epyq_layer_rw *ly;
    const epyq_batch_plan *p;
    float *u;            /* [T][conv_dim] projections in, conv output out */
    const float *ba;     /* [T][2 Hv] b | a */
    float *g, *beta;     /* [T][Hv] */
} prep_job;

/* One (sequence, key head): conv + SiLU of its q, k and value-head channels, q/k L2 norms and
 * the decay and beta gates of its value heads. Channels and heads are disjoint between tasks,
 * so the pool shares what the caller used to do alone (8192 SiLUs per token and layer); in
 * NUMA mode it runs on the node holding the key head's conv block (numa_state.c). */
static void prep_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const prep_job *j = ctx;
    const epyq_model *m = j->m;
    const epyq_gdn_rw *gw = &j->ly->g;
    int32_t grp = task / m->d.Hk, kh = task % m->d.Hk, r = m->d.Hv / m->d.Hk, Hv = m->d.Hv;
    int32_t key_dim = m->d.Hk * m->d.Dk, cd = m->d.conv_dim;
    const int32_t *toks = j->p->grp_tok + j->p->grp_off[grp];
    int32_t n = j->p->grp_off[grp + 1] - j->p->grp_off[grp];
    epyq_seq *sq = j->p->seq[toks[0]];
    size_t blk_off = ((size_t)j->ly->slot * m->d.Hk + (size_t)kh) * epyq_seq_conv_blk(m);
    size_t snap_stride = (size_t)m->n_gdn * m->d.Hk * epyq_seq_conv_blk(m);
    int32_t n_snap = sq->spec_n > 1 ? sq->spec_n - 1 : 0; /* the last token's: the state itself */
    float *state = sq->conv + blk_off, *snap = n_snap ? sq->spec_conv + blk_off : NULL;
    int32_t q0 = kh * m->d.Dk, k0 = key_dim + kh * m->d.Dk, v0 = 2 * key_dim + kh * r * m->d.Dv;
    conv_range(m, gw, state, toks, n, j->u, q0, q0 + m->d.Dk, 0, snap, snap_stride, n_snap);
    conv_range(m, gw, state, toks, n, j->u, k0, k0 + m->d.Dk, m->d.Dk, snap, snap_stride, n_snap);
    conv_range(m, gw, state, toks, n, j->u, v0, v0 + r * m->d.Dv, 2 * m->d.Dk, snap, snap_stride,
               n_snap);
    float qscale = 1.0f / sqrtf((float)m->d.Dk);
    for (int32_t i = 0; i < n; i++) {
        size_t t = (size_t)toks[i];
        float *ut = j->u + t * cd;
        m->kt->l2norm(ut + q0, m->d.Dk, qscale, GDN_L2_EPS);
        m->kt->l2norm(ut + k0, m->d.Dk, 1.0f, GDN_L2_EPS);
        for (int32_t h = kh * r; h < (kh + 1) * r; h++) {
            j->beta[t * Hv + h] = sigmoidf_(j->ba[t * 2 * Hv + h]);
            j->g[t * Hv + h] = gw->neg_exp_A[h] * softplusf_(j->ba[t * 2 * Hv + Hv + h] + gw->dt_bias[h]);
        }
    }
}

/* What a (sequence, key head) task reads of the sequence: its conv block, once per token. */
static uint64_t prep_bytes(void *ctx, int32_t task, const epyq_seq **seq) {
    const prep_job *j = ctx;
    const epyq_model *m = j->m;
    int32_t grp = task / m->d.Hk;
    *seq = j->p->seq[j->p->grp_tok[j->p->grp_off[grp]]];
    return (uint64_t)(j->p->grp_off[grp + 1] - j->p->grp_off[grp]) * (uint64_t)(m->d.Kc - 1) *
           (uint64_t)epyq_seq_conv_ch(m) * sizeof(float);
}

/* What a (sequence, value head) task reads of the sequence: its state, once per token. */
static uint64_t gdn_bytes(void *ctx, int32_t task, const epyq_seq **seq) {
    const gdn_job *j = ctx;
    const epyq_model *m = j->m;
    int32_t grp = task / m->d.Hv;
    *seq = j->p->seq[j->p->grp_tok[j->p->grp_off[grp]]];
    return (uint64_t)(j->p->grp_off[grp + 1] - j->p->grp_off[grp]) * (uint64_t)m->d.Dk *
           (uint64_t)m->d.Dv * sizeof(float);
}

epyq_status epyq_gdn_block(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p,
                           const float *x, float *out, epyq_err *err) {
    const epyq_gdn_rw *gw = &ly->g;
    int32_t T = p->T, cd = m->d.conv_dim, Hv = m->d.Hv, Dv = m->d.Dv, vd = Hv * Dv;
    /* every element written before it is read: by the projections, prep_task and gdn_task */
    float *u = epyq_model_alloc_raw((size_t)T * cd, sizeof(float));
    float *z = epyq_model_alloc_raw((size_t)T * vd, sizeof(float));
    float *o = epyq_model_alloc_raw((size_t)T * vd, sizeof(float));
    float *ba = epyq_model_alloc_raw((size_t)T * 2 * Hv, sizeof(float)); /* b | a per token */
    float *gl = epyq_model_alloc_raw((size_t)T * Hv, sizeof(float)),
          *beta = epyq_model_alloc_raw((size_t)T * Hv, sizeof(float));
    bool *chunked = calloc((size_t)p->n_groups + 1, sizeof(bool));
    epyq_act act = {0}, oact = {0};
    void *abuf = NULL, *obuf = NULL;
    epyq_status st = u && z && o && ba && gl && beta && chunked
                         ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "DeltaNet: out of memory");
    /* the job is whole before the first exit: done frees its chunked scratch */
    gdn_job j = {m, ly, p, u, gl, beta, o, z, chunked, NULL, 0};
    if (st != EPYQ_OK) goto done;
    uint64_t t0 = epyq_prof_mark(m);
    if ((st = epyq_rlin_act(m, x, T, m->d.H, &act, &abuf, err)) != EPYQ_OK) goto done;
    const epyq_rlin_out proj[] = {
        {&gw->qkv, u, cd}, {&gw->z, z, vd}, {&gw->b, ba, 2 * Hv}, {&gw->a, ba + Hv, 2 * Hv}};
    epyq_rlin_run_many(m, proj, 4, &act);
    epyq_prof_add(m, EPYQ_PROF_GDN_PROJ, &t0);
    int32_t max_rows = 0;
    for (int32_t grp = 0; grp < p->n_groups; grp++) {
        int32_t rows = p->grp_off[grp + 1] - p->grp_off[grp];
        chunked[grp] = m->gdn_chunk_min > 0 && rows >= m->gdn_chunk_min &&
                       !p->seq[p->grp_tok[p->grp_off[grp]]]->spec_n; /* snapshots need each token */
        if (chunked[grp] && rows > max_rows) max_rows = rows;
    }
    /* The chunked form's buffers for every worker, allocated here so that no task can run
     * out of memory after the conv states moved: a fallback inside the task would give
     * other bits (the recurrent form is only equal within rounding) and a failure there
     * would leave some heads advanced and others not. */
    if (max_rows) {
        j.work_per = (size_t)max_rows * (2 * (size_t)m->d.Dk + 2 * (size_t)m->d.Dv + 2) +
                     chunk_ws_floats(m->d.Dk, m->d.Dv);
        j.work = epyq_model_alloc(j.work_per * (size_t)epyq_numa_workers(m), sizeof(float));
        if (!j.work) {
            st =
                epyq_err_set(err, EPYQ_E_NOMEM,
                             "DeltaNet: out of memory for the chunked form of %d tokens", max_rows);
            goto done;
        }
    }
    /* NUMA mode: each key head's conv on the node holding its conv block, each value head's
     * delta rule on the node holding its state (numa_state.c) */
    prep_job pj = {m, ly, p, u, ba, gl, beta};
    if (!epyq_numa_run_heads(m, EPYQ_NUMA_HEAD_KEY, prep_task, &pj, p->n_groups, prep_bytes))
        epyq_pool_run(m->pool, prep_task, &pj, p->n_groups * m->d.Hk);
    if (!epyq_numa_run_heads(m, EPYQ_NUMA_HEAD_VALUE, gdn_task, &j, p->n_groups, gdn_bytes))
        epyq_pool_run(m->pool, gdn_task, &j, p->n_groups * Hv);
    epyq_prof_add(m, EPYQ_PROF_GDN_CORE, &t0);
    st = epyq_rlin_act(m, o, T, vd, &oact, &obuf, err);
    free(j.work), j.work = NULL; /* the scratch goes before the out projection, as it always did */
    if (st != EPYQ_OK) goto done;
    epyq_rlin_run(m, &gw->out, &oact, out, m->d.H);
    epyq_prof_add(m, EPYQ_PROF_GDN_OUT, &t0);
done:
    free(j.work);
    free(abuf), free(obuf), free(u), free(z), free(o), free(ba), free(gl), free(beta), free(chunked);
    return st;
}
