/* src/ref/ref_forward.c — plain-C reference forward pass (see ref_forward.h).
 *
 * Read it top to bottom next to docs/architecture.md: small math helpers, the three blocks
 * (Gated DeltaNet §5.6, gated attention §5.4, MoE §5.7), the decoder layer §5.3, the trunk and
 * the MTP head §6.1, then loading. Weights are fp32 (exact decodes); everything computed is
 * double. Speed is irrelevant here; being obviously right is the point. */
#include "ref/ref_forward.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/tensor_f32.h"

/* A decoded Linear: y = W·x with w [n][k]. */
typedef struct {
    float *w; /* [n][k] */
    int32_t n, k;
} mat;

typedef struct {
    mat qkv, z, b, a, out;
    float *conv;         /* [conv_dim][Kc] depthwise kernel, tap Kc-1 multiplies the current token */
    float *dt_bias;      /* [Hv] */
    float *A_log;        /* [Hv] */
    float *norm;         /* [Dv] plain gated-norm weight */
    double *conv_state;  /* [Kc-1][conv_dim] last raw inputs, oldest row first */
    double *S;           /* [Hv][Dk][Dv] recurrent state */
} gdn_layer;

typedef struct {
    mat q, k, v, o;
    float *q_norm, *k_norm; /* [hd] zero-centred */
    double *kc, *vc;        /* [n_ctx][nkv*hd] post-norm post-RoPE keys, values */
    int32_t n;              /* cache entries in use */
} attn_layer;

typedef struct {
    mat router;                   /* [E][H] */
    mat *gate, *up, *down;        /* [E] */
    mat sh_gate, sh_up, sh_down;  /* shared expert */
    mat sh_expert_gate;           /* [1][H] */
} moe_layer;

typedef struct {
    bool full;
    float *in_norm, *post_norm; /* [H] zero-centred */
    gdn_layer g;
    attn_layer at;
    moe_layer m;
} layer;

struct epyq_ref {
    const epyq_weights *w;
    const epyq_config *c;
    epyq_dims d; /* sizes (load/model_config.h) */
    int32_t n_ctx, pos;
    double eps;
    double *inv_freq;                   /* [rd/2] */
    double rope_attn;                   /* YaRN's cos/sin scale, 1 without it */
    layer *layers;                      /* [L] */
    float *final_norm;                  /* [H] */
    mat lm_head;                        /* [V][H] */
    bool has_mtp;
    mat mtp_fc;                         /* [H][2H] */
    float *mtp_norm_e, *mtp_norm_h, *mtp_norm; /* [H] each */
    layer mtp;
    /* workspace, sized at create for the largest use */
    double *x, *xn, *blk;               /* [H] residual, normed input, block output */
    double *t1, *t2, *t3, *t4;          /* [ws] scratch vectors */
    int32_t ws;
};

/* ---------------------------------------------------------------- math helpers */

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigmoid(x); }
/* torch.nn.functional.softplus returns x itself above its threshold 20 */
static double softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

/* y[n] = W[n][k] · x[k] */
static void matvec(const mat *m, const double *x, double *y) {
    for (int32_t o = 0; o < m->n; o++) {
        const float *row = m->w + (size_t)o * m->k;
        double s = 0.0;
        for (int32_t i = 0; i < m->k; i++) s += (double)row[i] * x[i];
        y[o] = s;
    }
}

/* y = x / sqrt(mean(x²) + eps) ⊙ (1 + w)   (zero-centred RMSNorm, §5.2); y may alias x */
static void rmsnorm_zc(const double *x, const float *w, int32_t n, double eps, double *y) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int32_t i = 0; i < n; i++) y[i] = x[i] * inv * (1.0 + (double)w[i]);
}

/* x ← x / sqrt(Σx² + 1e-6) (GDN L2 norm, HF/FLA form, eps fixed by the architecture) */
static void l2norm(double *x, int32_t n) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss + 1e-6);
    for (int32_t i = 0; i < n; i++) x[i] *= inv;
}

/* Rotate-half RoPE on the first rd dims of one head (§5.5): pairs (i, i + rd/2). */
static void rope(const epyq_ref *r, double *v, int32_t pos) {
    int32_t half = r->d.rd / 2;
    for (int32_t i = 0; i < half; i++) {
        double ang = (double)pos * r->inv_freq[i];
        double c = cos(ang) * r->rope_attn, s = sin(ang) * r->rope_attn;
        double a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

/* ---------------------------------------------------------------- Gated DeltaNet (§5.6) */

static void gated_deltanet(epyq_ref *r, gdn_layer *g, const double *h, double *out) {
    int32_t key_dim = r->d.Hk * r->d.Dk, Kc = r->d.Kc, cd = r->d.conv_dim;
    double *u = r->t1;                 /* [conv_dim] projections, then conv output */
    double *z = r->t2;                 /* [Hv*Dv] */
    double *y = r->t3;                 /* [Hv*Dv] gated-norm output */
    double *ba = r->t4;                /* [2*Hv]: b then a */
    matvec(&g->qkv, h, u);
    matvec(&g->z, h, z);
    matvec(&g->b, h, ba);
    matvec(&g->a, h, ba + r->d.Hv);

    /* 2. causal depthwise conv over [state rows…, current], SiLU; state keeps raw inputs */
    for (int32_t c = 0; c < cd; c++) {
        const float *wc = g->conv + (size_t)c * Kc;
        double s = (double)wc[Kc - 1] * u[c];
        for (int32_t j = 0; j < Kc - 1; j++) s += (double)wc[j] * g->conv_state[(size_t)j * cd + c];
        for (int32_t j = 0; j + 1 < Kc - 1; j++)
            g->conv_state[(size_t)j * cd + c] = g->conv_state[(size_t)(j + 1) * cd + c];
        if (Kc > 1) g->conv_state[(size_t)(Kc - 2) * cd + c] = u[c];
        u[c] = silu(s);
    }
    double *q = u, *k = u + key_dim, *v = u + 2 * key_dim;

    /* 6. L2-normalise q, k per key head; q scaled by Dk^-1/2 */
    for (int32_t kh = 0; kh < r->d.Hk; kh++) {
        l2norm(q + (size_t)kh * r->d.Dk, r->d.Dk);
        l2norm(k + (size_t)kh * r->d.Dk, r->d.Dk);
        for (int32_t i = 0; i < r->d.Dk; i++) q[(size_t)kh * r->d.Dk + i] /= sqrt((double)r->d.Dk);
    }

    int32_t group = r->d.Hv / r->d.Hk;
    for (int32_t vh = 0; vh < r->d.Hv; vh++) {
        /* 4. gates */
        double beta = sigmoid(ba[vh]);
        double gdec =
            -exp((double)g->A_log[vh]) * softplus(ba[r->d.Hv + vh] + (double)g->dt_bias[vh]);
        double alpha = exp(gdec);
        /* 5. value head vh reads key head vh / group (grouped, not tiled) */
        const double *kk = k + (size_t)(vh / group) * r->d.Dk;
        const double *qq = q + (size_t)(vh / group) * r->d.Dk;
        const double *vv = v + (size_t)vh * r->d.Dv;
        double *S = g->S + (size_t)vh * r->d.Dk * r->d.Dv;
        double *o = y + (size_t)vh * r->d.Dv;
        /* 7. decay, delta update, read with the updated state */
        for (size_t i = 0; i < (size_t)r->d.Dk * r->d.Dv; i++) S[i] *= alpha;
        for (int32_t j = 0; j < r->d.Dv; j++) {
            double m = 0.0;
            for (int32_t i = 0; i < r->d.Dk; i++) m += S[(size_t)i * r->d.Dv + j] * kk[i];
            double d = beta * (vv[j] - m);
            for (int32_t i = 0; i < r->d.Dk; i++) S[(size_t)i * r->d.Dv + j] += kk[i] * d;
        }
        for (int32_t j = 0; j < r->d.Dv; j++) {
            double s = 0.0;
            for (int32_t i = 0; i < r->d.Dk; i++) s += S[(size_t)i * r->d.Dv + j] * qq[i];
            o[j] = s;
        }
        /* 8. plain gated RMSNorm: n(o) ⊙ w ⊙ silu(z) */
        double ss = 0.0;
        for (int32_t j = 0; j < r->d.Dv; j++) ss += o[j] * o[j];
        double inv = 1.0 / sqrt(ss / r->d.Dv + r->eps);
        for (int32_t j = 0; j < r->d.Dv; j++)
            o[j] = o[j] * inv * (double)g->norm[j] * silu(z[(size_t)vh * r->d.Dv + j]);
    }
    matvec(&g->out, y, out);
}

/* ---------------------------------------------------------------- gated attention (§5.4) */

static void gated_attention(epyq_ref *r, attn_layer *at, const double *h, int32_t pos,
                            double *out) {
    int32_t hd = r->d.hd, kvd = r->d.nkv * hd;
    double *qg = r->t1;  /* [nq][2*hd]: per head q then gate */
    double *kv = r->t2;  /* [2*kvd]: k then v */
    double *o = r->t3;   /* [nq*hd] */
    double *sc = r->t4;  /* [n_ctx] scores */
    matvec(&at->q, h, qg);
    matvec(&at->k, h, kv);
    matvec(&at->v, h, kv + kvd);
    for (int32_t j = 0; j < r->d.nq; j++) {
        double *qj = qg + (size_t)j * 2 * hd;
        rmsnorm_zc(qj, at->q_norm, hd, r->eps, qj);
        rope(r, qj, pos);
    }
    for (int32_t i = 0; i < r->d.nkv; i++) {
        rmsnorm_zc(kv + (size_t)i * hd, at->k_norm, hd, r->eps, kv + (size_t)i * hd);
        rope(r, kv + (size_t)i * hd, pos);
    }
    /* the cache holds keys and values of every earlier token of this sequence */
    memcpy(at->kc + (size_t)at->n * kvd, kv, (size_t)kvd * sizeof(double));
    memcpy(at->vc + (size_t)at->n * kvd, kv + kvd, (size_t)kvd * sizeof(double));
    at->n++;

    int32_t group = r->d.nq / r->d.nkv;
    double scale = 1.0 / sqrt((double)hd);
    for (int32_t j = 0; j < r->d.nq; j++) {
        const double *qj = qg + (size_t)j * 2 * hd;
        const double *gate = qj + hd;
        int32_t kvh = j / group;
        double mx = -INFINITY;
        for (int32_t s = 0; s < at->n; s++) {
            const double *ks = at->kc + (size_t)s * kvd + (size_t)kvh * hd;
            double d = 0.0;
            for (int32_t i = 0; i < hd; i++) d += qj[i] * ks[i];
            sc[s] = d * scale;
            if (sc[s] > mx) mx = sc[s];
        }
        double sum = 0.0;
        for (int32_t s = 0; s < at->n; s++) sum += (sc[s] = exp(sc[s] - mx));
        double *oj = o + (size_t)j * hd;
        for (int32_t i = 0; i < hd; i++) oj[i] = 0.0;
        for (int32_t s = 0; s < at->n; s++) {
            const double *vs = at->vc + (size_t)s * kvd + (size_t)kvh * hd;
            for (int32_t i = 0; i < hd; i++) oj[i] += sc[s] / sum * vs[i];
        }
        for (int32_t i = 0; i < hd; i++) oj[i] *= sigmoid(gate[i]);
    }
    matvec(&at->o, o, out);
}

/* ---------------------------------------------------------------- MoE (§5.7) */

/* out += wgt · down(silu(gate·h) ⊙ up·h) */
static void swiglu_mlp(epyq_ref *r, const mat *gate, const mat *up, const mat *down,
                       const double *h, double wgt, double *out) {
    double *g = r->t2, *u = r->t3, *y = r->t4;
    matvec(gate, h, g);
    matvec(up, h, u);
    for (int32_t i = 0; i < gate->n; i++) g[i] = silu(g[i]) * u[i];
    matvec(down, g, y);
    for (int32_t i = 0; i < down->n; i++) out[i] += wgt * y[i];
}

static void moe(epyq_ref *r, moe_layer *m, const double *h, double *out) {
    double *p = r->t1; /* [E] router probabilities; t2..t4 are used by swiglu_mlp */
    matvec(&m->router, h, p);
    double mx = -INFINITY, sum = 0.0;
    for (int32_t e = 0; e < r->d.E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int32_t e = 0; e < r->d.E; e++) sum += (p[e] = exp(p[e] - mx));
    for (int32_t e = 0; e < r->d.E; e++) p[e] /= sum;

    /* top-k by probability, ties to the lower expert id; then renormalise */
    int32_t sel[EPYQ_MAX_TOPK];
    bool taken[EPYQ_MAX_EXPERTS] = {false};
    double tot = 0.0;
    for (int32_t t = 0; t < r->d.topk; t++) {
        int32_t best = -1;
        for (int32_t e = 0; e < r->d.E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = true;
        sel[t] = best;
        tot += p[best];
    }
    for (int32_t i = 0; i < r->d.H; i++) out[i] = 0.0;
    for (int32_t t = 0; t < r->d.topk; t++)
        swiglu_mlp(r, &m->gate[sel[t]], &m->up[sel[t]], &m->down[sel[t]], h, p[sel[t]] / tot, out);

    double gs;
    matvec(&m->sh_expert_gate, h, &gs);
    swiglu_mlp(r, &m->sh_gate, &m->sh_up, &m->sh_down, h, sigmoid(gs), out);
}

/* ---------------------------------------------------------------- decoder layer (§5.3) */

static void decoder_layer(epyq_ref *r, layer *ly, int32_t pos) {
    rmsnorm_zc(r->x, ly->in_norm, r->d.H, r->eps, r->xn);
    if (ly->full) gated_attention(r, &ly->at, r->xn, pos, r->blk);
    else gated_deltanet(r, &ly->g, r->xn, r->blk);
    for (int32_t i = 0; i < r->d.H; i++) r->x[i] += r->blk[i];
    rmsnorm_zc(r->x, ly->post_norm, r->d.H, r->eps, r->xn);
    moe(r, &ly->m, r->xn, r->blk);
    for (int32_t i = 0; i < r->d.H; i++) r->x[i] += r->blk[i];
}

static epyq_status embed(epyq_ref *r, int32_t token, double *dst, epyq_err *err) {
    if (token < 0 || token >= r->d.V)
        return epyq_err_set(err, EPYQ_E_ARG, "token id %d outside the vocabulary [0, %d)", token,
                            r->d.V);
    float *row = malloc((size_t)r->d.H * sizeof(float));
    if (!row) return epyq_err_set(err, EPYQ_E_NOMEM, "embedding row: out of memory");
    epyq_status st =
        epyq_tensor_read_f32(r->w->embed, (size_t)token * r->d.H, (size_t)r->d.H, row, err);
    for (int32_t i = 0; st == EPYQ_OK && i < r->d.H; i++) dst[i] = row[i];
    free(row);
    return st;
}

/* logits = lm_head · hn (hn already normed) */
static void lm_head(epyq_ref *r, const double *hn, double *logits) {
    if (logits) matvec(&r->lm_head, hn, logits);
}

epyq_status epyq_ref_forward(epyq_ref *r, int32_t token, double *logits, double *hidden,
                             epyq_err *err) {
    if (r->pos >= r->n_ctx)
        return epyq_err_set(err, EPYQ_E_CTX_FULL, "reference: position %d past the context of %d",
                            r->pos, r->n_ctx);
    epyq_status st = embed(r, token, r->x, err);
    if (st != EPYQ_OK) return st;
    for (int32_t l = 0; l < r->d.L; l++) decoder_layer(r, &r->layers[l], r->pos);
    rmsnorm_zc(r->x, r->final_norm, r->d.H, r->eps, r->xn);
    if (hidden) memcpy(hidden, r->xn, (size_t)r->d.H * sizeof(double));
    lm_head(r, r->xn, logits);
    r->pos++;
    return EPYQ_OK;
}

/* §6.1: u = fc·[n(e), n(h)] → full-attention MoE layer at `pos` → mtp.norm → lm_head */
epyq_status epyq_ref_mtp(epyq_ref *r, const double *h, int32_t token, int32_t pos, double *logits,
                         double *h_out, epyq_err *err) {
    if (!r->has_mtp) return epyq_err_set(err, EPYQ_E_ARG, "checkpoint has no MTP head (mtp.*)");
    if (r->mtp.at.n >= r->n_ctx)
        return epyq_err_set(err, EPYQ_E_CTX_FULL, "reference MTP: cache of %d entries is full", r->n_ctx);
    if (pos < 0) return epyq_err_set(err, EPYQ_E_ARG, "MTP position %d is negative", pos);
    double *cat = malloc((size_t)2 * r->d.H * sizeof(double));
    if (!cat) return epyq_err_set(err, EPYQ_E_NOMEM, "MTP input: out of memory");
    epyq_status st = embed(r, token, cat, err);
    if (st == EPYQ_OK) {
        rmsnorm_zc(cat, r->mtp_norm_e, r->d.H, r->eps, cat);        /* embedding first */
        rmsnorm_zc(h, r->mtp_norm_h, r->d.H, r->eps, cat + r->d.H); /* then the hidden */
        matvec(&r->mtp_fc, cat, r->x);
        decoder_layer(r, &r->mtp, pos);
        rmsnorm_zc(r->x, r->mtp_norm, r->d.H, r->eps, r->xn);
        if (h_out) memcpy(h_out, r->xn, (size_t)r->d.H * sizeof(double));
        lm_head(r, r->xn, logits);
    }
    free(cat);
    return st;
}

/* ---------------------------------------------------------------- state */

static void layer_reset(const epyq_ref *r, layer *ly) {
    if (ly->full) {
        ly->at.n = 0;
    } else {
        memset(ly->g.conv_state, 0, (size_t)(r->d.Kc - 1) * r->d.conv_dim * sizeof(double));
        memset(ly->g.S, 0, (size_t)r->d.Hv * r->d.Dk * r->d.Dv * sizeof(double));
    }
}

void epyq_ref_reset(epyq_ref *r) {
    for (int32_t l = 0; l < r->d.L; l++) layer_reset(r, &r->layers[l]);
    if (r->has_mtp) layer_reset(r, &r->mtp);
    r->pos = 0;
}

int32_t epyq_ref_pos(const epyq_ref *r) { return r->pos; }

/* ---------------------------------------------------------------- loading */

static void *zalloc(size_t n, size_t sz, bool *ok) {
    size_t bytes;
    void *p = NULL;
    if (epyq_mul_size(n, sz, &bytes)) p = calloc(1, bytes ? bytes : 1);
    if (!p) *ok = false;
    return p;
}

static epyq_status load_mat(epyq_ref *r, mat *m, const epyq_linear *l, epyq_err *err) {
    m->n = (int32_t)l->n_out;
    m->k = (int32_t)l->n_in;
    bool ok = true;
    m->w = zalloc((size_t)l->n_out, (size_t)l->n_in * sizeof(float), &ok);
    if (!ok) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory for [%lld][%lld] fp32", l->module,
                                 (long long)l->n_out, (long long)l->n_in);
    return epyq_linear_dequant(l, r->c, m->w, err);
}

static epyq_status load_vec(float **dst, const epyq_tensor *t, size_t n, epyq_err *err) {
    if (!t) return epyq_err_set(err, EPYQ_E_INTERNAL, "reference: unbound tensor");
    if (epyq_tensor_numel(t) != n)
        return epyq_err_set(err, EPYQ_E_SHAPE, "%s: %zu elements where %zu were expected", t->name,
                            epyq_tensor_numel(t), n);
    bool ok = true;
    *dst = zalloc(n, sizeof(float), &ok);
    if (!ok) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    return epyq_tensor_read_f32(t, 0, n, *dst, err);
}

static epyq_status load_layer(epyq_ref *r, layer *ly, const epyq_layer_w *lw, epyq_err *err) {
    ly->full = lw->full_attn;
    TRY(load_vec(&ly->in_norm, lw->input_norm, (size_t)r->d.H, err));
    TRY(load_vec(&ly->post_norm, lw->post_norm, (size_t)r->d.H, err));
    bool ok = true;
    if (ly->full) {
        const epyq_attn_w *a = &lw->attn;
        TRY(load_mat(r, &ly->at.q, &a->q_proj, err));
        TRY(load_mat(r, &ly->at.k, &a->k_proj, err));
        TRY(load_mat(r, &ly->at.v, &a->v_proj, err));
        TRY(load_mat(r, &ly->at.o, &a->o_proj, err));
        TRY(load_vec(&ly->at.q_norm, a->q_norm, (size_t)r->d.hd, err));
        TRY(load_vec(&ly->at.k_norm, a->k_norm, (size_t)r->d.hd, err));
        ly->at.kc = zalloc((size_t)r->n_ctx, (size_t)r->d.nkv * r->d.hd * sizeof(double), &ok);
        ly->at.vc = zalloc((size_t)r->n_ctx, (size_t)r->d.nkv * r->d.hd * sizeof(double), &ok);
    } else {
        const epyq_gdn_w *g = &lw->gdn;
        TRY(load_mat(r, &ly->g.qkv, &g->in_proj_qkv, err));
        TRY(load_mat(r, &ly->g.z, &g->in_proj_z, err));
        TRY(load_mat(r, &ly->g.b, &g->in_proj_b, err));
        TRY(load_mat(r, &ly->g.a, &g->in_proj_a, err));
        TRY(load_mat(r, &ly->g.out, &g->out_proj, err));
        TRY(load_vec(&ly->g.conv, g->conv1d, (size_t)r->d.conv_dim * r->d.Kc, err));
        TRY(load_vec(&ly->g.dt_bias, g->dt_bias, (size_t)r->d.Hv, err));
        TRY(load_vec(&ly->g.A_log, g->A_log, (size_t)r->d.Hv, err));
        TRY(load_vec(&ly->g.norm, g->norm, (size_t)r->d.Dv, err));
        ly->g.conv_state =
            zalloc((size_t)(r->d.Kc - 1) + 1, (size_t)r->d.conv_dim * sizeof(double), &ok);
        ly->g.S = zalloc((size_t)r->d.Hv * r->d.Dk, (size_t)r->d.Dv * sizeof(double), &ok);
    }
    const epyq_moe_w *m = &lw->moe;
    TRY(load_mat(r, &ly->m.router, &m->router, err));
    ly->m.gate = zalloc((size_t)r->d.E, sizeof(mat), &ok);
    ly->m.up = zalloc((size_t)r->d.E, sizeof(mat), &ok);
    ly->m.down = zalloc((size_t)r->d.E, sizeof(mat), &ok);
    if (!ok) return epyq_err_set(err, EPYQ_E_NOMEM, "reference layer state: out of memory");
    for (int32_t e = 0; e < r->d.E; e++) {
        TRY(load_mat(r, &ly->m.gate[e], &m->gate[e], err));
        TRY(load_mat(r, &ly->m.up[e], &m->up[e], err));
        TRY(load_mat(r, &ly->m.down[e], &m->down[e], err));
    }
    TRY(load_mat(r, &ly->m.sh_gate, &m->sh_gate, err));
    TRY(load_mat(r, &ly->m.sh_up, &m->sh_up, err));
    TRY(load_mat(r, &ly->m.sh_down, &m->sh_down, err));
    TRY(load_mat(r, &ly->m.sh_expert_gate, &m->sh_expert_gate, err));
    return EPYQ_OK;
}

static void layer_free(const epyq_ref *r, layer *ly) {
    free(ly->in_norm);
    free(ly->post_norm);
    free(ly->at.q.w), free(ly->at.k.w), free(ly->at.v.w), free(ly->at.o.w);
    free(ly->at.q_norm), free(ly->at.k_norm), free(ly->at.kc), free(ly->at.vc);
    free(ly->g.qkv.w), free(ly->g.z.w), free(ly->g.b.w), free(ly->g.a.w), free(ly->g.out.w);
    free(ly->g.conv), free(ly->g.dt_bias), free(ly->g.A_log), free(ly->g.norm);
    free(ly->g.conv_state), free(ly->g.S);
    free(ly->m.router.w);
    for (int32_t e = 0; e < r->d.E; e++) {
        if (ly->m.gate) free(ly->m.gate[e].w);
        if (ly->m.up) free(ly->m.up[e].w);
        if (ly->m.down) free(ly->m.down[e].w);
    }
    free(ly->m.gate), free(ly->m.up), free(ly->m.down);
    free(ly->m.sh_gate.w), free(ly->m.sh_up.w), free(ly->m.sh_down.w), free(ly->m.sh_expert_gate.w);
}

void epyq_ref_free(epyq_ref *r) {
    if (!r) return;
    if (r->layers)
        for (int32_t l = 0; l < r->d.L; l++) layer_free(r, &r->layers[l]);
    layer_free(r, &r->mtp);
    free(r->layers);
    free(r->final_norm);
    free(r->lm_head.w);
    free(r->mtp_fc.w);
    free(r->mtp_norm_e), free(r->mtp_norm_h), free(r->mtp_norm);
    free(r->inv_freq);
    free(r->x), free(r->xn), free(r->blk);
    free(r->t1), free(r->t2), free(r->t3), free(r->t4);
    free(r);
}

static int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }

static epyq_status ref_load(epyq_ref *r, const epyq_weights *w, epyq_err *err) {
    const epyq_config *c = &w->cfg;
    if (r->d.Hv % r->d.Hk || r->d.nq % r->d.nkv || r->d.rd % 2 || r->d.rd > r->d.hd ||
        r->d.topk > r->d.E || r->d.topk > EPYQ_MAX_TOPK || r->d.E > EPYQ_MAX_EXPERTS || r->d.Kc < 1)
        return epyq_err_set(
            err, EPYQ_E_SHAPE,
            "reference: unsupported shape (Hv %d / Hk %d, nq %d / nkv %d, rotary %d of %d,"
            " top-%d of %d experts, conv %d)",
            r->d.Hv, r->d.Hk, r->d.nq, r->d.nkv, r->d.rd, r->d.hd, r->d.topk, r->d.E, r->d.Kc);
    bool ok = true;
    r->inv_freq = zalloc((size_t)r->d.rd / 2 + 1, sizeof(double), &ok);
    if (!ok) return epyq_err_set(err, EPYQ_E_NOMEM, "reference: out of memory");
    if (r->inv_freq) epyq_config_rope_freq(c, r->inv_freq, &r->rope_attn);

    /* scratch vectors: the widest projection, the router, the cache length, an expert */
    r->ws = imax(imax(r->d.conv_dim, 2 * r->d.nq * r->d.hd),
                 imax(2 * r->d.nkv * r->d.hd, r->d.Hv * r->d.Dv));
    r->ws = imax(imax(r->ws, 2 * r->d.Hv), imax(r->d.E, r->n_ctx + 1));
    r->ws = imax(imax(r->ws, r->d.I), imax(r->d.Is, r->d.H));
    r->x = zalloc((size_t)r->d.H, sizeof(double), &ok);
    r->xn = zalloc((size_t)r->d.H, sizeof(double), &ok);
    r->blk = zalloc((size_t)r->d.H, sizeof(double), &ok);
    r->t1 = zalloc((size_t)r->ws, sizeof(double), &ok);
    r->t2 = zalloc((size_t)r->ws, sizeof(double), &ok);
    r->t3 = zalloc((size_t)r->ws, sizeof(double), &ok);
    r->t4 = zalloc((size_t)r->ws, sizeof(double), &ok);
    r->layers = zalloc((size_t)r->d.L, sizeof(layer), &ok);
    if (!ok) return epyq_err_set(err, EPYQ_E_NOMEM, "reference: out of memory");

    for (int32_t l = 0; l < r->d.L; l++) TRY(load_layer(r, &r->layers[l], &w->layers[l], err));
    TRY(load_vec(&r->final_norm, w->final_norm, (size_t)r->d.H, err));
    TRY(load_mat(r, &r->lm_head, &w->lm_head, err));
    if (r->has_mtp) {
        TRY(load_mat(r, &r->mtp_fc, &w->mtp.fc, err));
        TRY(load_vec(&r->mtp_norm_e, w->mtp.pre_fc_norm_embedding, (size_t)r->d.H, err));
        TRY(load_vec(&r->mtp_norm_h, w->mtp.pre_fc_norm_hidden, (size_t)r->d.H, err));
        TRY(load_vec(&r->mtp_norm, w->mtp.norm, (size_t)r->d.H, err));
        TRY(load_layer(r, &r->mtp, &w->mtp.layer, err));
    }
    return EPYQ_OK;
}

epyq_status epyq_ref_create(epyq_ref **out, const epyq_weights *w, int32_t n_ctx, epyq_err *err) {
    *out = NULL;
    if (n_ctx < 1) return epyq_err_set(err, EPYQ_E_ARG, "reference: context %d must be positive", n_ctx);
    epyq_ref *r = calloc(1, sizeof *r);
    if (!r) return epyq_err_set(err, EPYQ_E_NOMEM, "reference: out of memory");
    const epyq_config *c = &w->cfg;
    r->w = w;
    r->c = c;
    r->d = epyq_config_dims(c);
    r->n_ctx = n_ctx;
    r->eps = c->rms_norm_eps;
    r->has_mtp = w->has_mtp;
    r->mtp.full = true;
    epyq_status st = ref_load(r, w, err);
    if (st != EPYQ_OK) {
        epyq_ref_free(r);
        return st;
    }
    epyq_ref_reset(r);
    *out = r;
    return EPYQ_OK;
}
