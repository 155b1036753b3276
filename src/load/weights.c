/* src/load/weights.c — binding checkpoint tensors to the architecture (see weights.h).
 * Only names, dtypes and shapes are examined here (plus the 16-byte CT weight_shape
 * tensors); weight data is decoded later by q4_decode.c. */
#include "load/weights.h"

#include "load/qconfig.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const epyq_ckpt *ck;
    const epyq_config *cfg;
    uint8_t *claimed;   /* [ckpt count] 1 when a tensor was bound */
    epyq_weights *w;
    epyq_err *err;
} binder;

#define NAME_MAX_LEN 256

/* snprintf for tensor/module names; names are bounded by construction (prefix <= 64 bytes),
 * and a truncated name simply is not found, so truncation needs no handling. */
static void fmt_name(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_name(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

static const epyq_tensor *find(binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const epyq_tensor *find(binder *b, const char *fmt, ...) {
    char name[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const epyq_tensor *t = epyq_ckpt_find(b->ck, name);
    if (t) b->claimed[t - epyq_ckpt_at(b->ck, 0)] = 1;
    return t;
}

static bool is_float(epyq_dtype d) { return d == EPYQ_DT_BF16 || d == EPYQ_DT_F16 || d == EPYQ_DT_F32; }

static void shape_str(const epyq_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "%s [", epyq_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static bool shape_is(const epyq_tensor *t, int nd, const int64_t *d) {
    if (t->ndim != nd) return false;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != d[i]) return false;
    return true;
}

/* Check dtype class and exact shape; E_SHAPE naming expected vs found. */
static epyq_status expect(binder *b, const epyq_tensor *t, bool want_float, int nd, const int64_t *d) {
    bool dt_ok = want_float ? is_float(t->dtype) : t->dtype == EPYQ_DT_I32;
    if (dt_ok && shape_is(t, nd, d)) return EPYQ_OK;
    char found[128], want[128];
    shape_str(t, found, sizeof found);
    size_t o = (size_t)snprintf(want, sizeof want, "%s [", want_float ? "BF16/F16/F32" : "I32");
    for (int i = 0; i < nd && o < sizeof want; i++)
        o += (size_t)snprintf(want + o, sizeof want - o, "%s%" PRId64, i ? ", " : "", d[i]);
    if (o < sizeof want) snprintf(want + o, sizeof want - o, "]");
    const char *hint = nd == 2 && t->ndim == 2 && t->shape[0] == d[1] && t->shape[1] == d[0] && d[0] != d[1]
                           ? " (transposed?)" : "";
    return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: tensor %s: expected %s, found %s%s", epyq_ckpt_dir(b->ck), t->name,
                        want, found, hint);
}

static epyq_status missing(binder *b, const char *name, const char *want) {
    return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: tensor %s is missing (expected %s)", epyq_ckpt_dir(b->ck), name, want);
}

/* A required small float tensor (norm weights, dt_bias, A_log, conv1d). */
static epyq_status bind_vec(binder *b, const epyq_tensor **out, const char *name, int nd, const int64_t *d) {
    const epyq_tensor *t = find(b, "%s", name);
    if (!t) {
        char want[96];
        size_t o = (size_t)snprintf(want, sizeof want, "BF16/F16/F32 [");
        for (int i = 0; i < nd && o < sizeof want; i++)
            o += (size_t)snprintf(want + o, sizeof want - o, "%s%" PRId64, i ? ", " : "", d[i]);
        if (o < sizeof want) snprintf(want + o, sizeof want - o, "]");
        return missing(b, name, want);
    }
    *out = t;
    return expect(b, t, true, nd, d);
}

static void note_mismatch(binder *b, const char *module, bool stored_q4) {
    if (b->w->n_qc_mismatch++ == 0)
        snprintf(b->w->qc_mismatch, sizeof b->w->qc_mismatch, "%.160s is stored %s but the config says %s", module,
                 stored_q4 ? "int4" : "16-bit", stored_q4 ? "unquantized" : "int4");
}

/* ---- int4 companions, one per format (docs/quant-formats.md §4.2, §5.2, §6.2, §7) ---- */

static epyq_status need(binder *b, const epyq_tensor **t, const char *module, const char *suffix, const char *want) {
    *t = find(b, "%s.%s", module, suffix);
    if (*t) return EPYQ_OK;
    char name[NAME_MAX_LEN];
    fmt_name(name, sizeof name, "%s.%s", module, suffix);
    return missing(b, name, want);
}

static epyq_status bind_gptq_awq(binder *b, epyq_linear *l, int64_t N, int64_t K, int64_t Gn, bool awq) {
    epyq_status st;
    if (N % 8)
        return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: %s: out_features %" PRId64 " is not a multiple of 8, required by %s packing",
                            epyq_ckpt_dir(b->ck), l->module, N, awq ? "AWQ" : "GPTQ");
    int64_t dq[2] = {awq ? K : K / 8, awq ? N / 8 : N}, ds[2] = {Gn, N}, dz[2] = {Gn, N / 8}, dg[1] = {K};
    if ((st = expect(b, l->qweight, false, 2, dq))) return st;
    if ((st = need(b, &l->scales, l->module, "scales", "the scales of an int4 linear"))) return st;
    if ((st = expect(b, l->scales, true, 2, ds))) return st;
    l->qzeros = find(b, "%s.qzeros", l->module);
    if (!l->qzeros && (awq || !l->scheme.sym))
        return need(b, &l->qzeros, l->module, "qzeros", "zero points of an asymmetric int4 linear");
    if (l->qzeros && (st = expect(b, l->qzeros, false, 2, dz))) return st;
    if (!awq) {
        l->g_idx = find(b, "%s.g_idx", l->module);
        if (l->g_idx && (st = expect(b, l->g_idx, false, 1, dg))) return st;
    }
    return EPYQ_OK;
}

static epyq_status bind_ct(binder *b, epyq_linear *l, int64_t N, int64_t K, int64_t Gn) {
    epyq_status st;
    int64_t dq[2] = {N, (K + 7) / 8}, ds[2] = {N, Gn}, dz[2] = {(N + 7) / 8, Gn}, dg[1] = {K};
    if ((st = expect(b, l->qweight, false, 2, dq))) return st;
    if ((st = need(b, &l->scales, l->module, "weight_scale", "the scales of an int4 linear"))) return st;
    if ((st = expect(b, l->scales, true, 2, ds))) return st;
    l->qzeros = find(b, "%s.weight_zero_point", l->module);
    if (!l->qzeros && !l->scheme.sym)
        return need(b, &l->qzeros, l->module, "weight_zero_point", "zero points of an asymmetric int4 linear");
    if (l->qzeros && (st = expect(b, l->qzeros, false, 2, dz))) return st;
    l->g_idx = find(b, "%s.weight_g_idx", l->module);
    if (l->g_idx && (st = expect(b, l->g_idx, false, 1, dg))) return st;
    /* weight_shape holds the logical [N, K]; it must agree with the architecture. */
    const epyq_tensor *ws = find(b, "%s.weight_shape", l->module);
    if (ws) {
        size_t es = epyq_dtype_size(ws->dtype);
        bool ok = ws->ndim == 1 && ws->shape[0] == 2 && ws->data &&
                  (ws->dtype == EPYQ_DT_I64 || ws->dtype == EPYQ_DT_I32 || ws->dtype == EPYQ_DT_U64 ||
                   ws->dtype == EPYQ_DT_U32);
        int64_t v[2] = {0, 0};
        for (int i = 0; ok && i < 2; i++) {
            const uint8_t *p = (const uint8_t *)ws->data + (size_t)i * es;
            for (size_t j = es; j-- > 0;) v[i] = (int64_t)(((uint64_t)v[i] << 8) | p[j]);
            if (es == 4 && ws->dtype == EPYQ_DT_I32) v[i] = (int32_t)v[i];
        }
        if (!ok || v[0] != N || v[1] != K)
            return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: tensor %s: expected integer [2] = [%" PRId64 ", %" PRId64 "], found %s",
                                epyq_ckpt_dir(b->ck), ws->name, N, K, ok ? "other values" : epyq_dtype_name(ws->dtype));
    }
    return EPYQ_OK;
}

static epyq_status bind_quark(binder *b, epyq_linear *l, int64_t N, int64_t K, int64_t Gn) {
    epyq_status st;
    /* N may not be a multiple of 8: padding slots are zero and N comes from weight_scale. */
    int64_t dq[2] = {K, (N + 7) / 8}, ds[2] = {Gn, N}, dz[2] = {Gn, (N + 7) / 8};
    if ((st = expect(b, l->qweight, false, 2, dq))) return st;
    if ((st = need(b, &l->scales, l->module, "weight_scale", "the scales of an int4 linear"))) return st;
    if ((st = expect(b, l->scales, true, 2, ds))) return st;
    l->qzeros = find(b, "%s.weight_zero_point", l->module);
    if (!l->qzeros && !l->scheme.sym)
        return need(b, &l->qzeros, l->module, "weight_zero_point", "zero points of a uint4 linear");
    if (l->qzeros && (st = expect(b, l->qzeros, false, 2, dz))) return st;
    return EPYQ_OK;
}

/* One Linear W [N][K]: int4 if the format's packed tensor is present, else a float .weight. */
static epyq_status bind_linear(binder *b, epyq_linear *l, const char *module, int64_t N, int64_t K) {
    memset(l, 0, sizeof *l);
    fmt_name(l->module, sizeof l->module, "%s", module);
    l->n_out = N;
    l->n_in = K;
    const epyq_config *cfg = b->cfg;
    epyq_qscheme want = epyq_qconfig_for(cfg, module);
    const epyq_tensor *q = NULL, *wt = find(b, "%s.weight", module);
    switch (cfg->qformat) {
    case EPYQ_QF_GPTQ:
    case EPYQ_QF_AWQ: q = find(b, "%s.qweight", module); break;
    case EPYQ_QF_CT: q = find(b, "%s.weight_packed", module); break;
    case EPYQ_QF_QUARK:
        if (wt && wt->dtype == EPYQ_DT_I32) q = wt, wt = NULL;
        break;
    case EPYQ_QF_NONE: break;
    }
    if (!q) {
        if (!wt) {
            char name[NAME_MAX_LEN], want_s[64];
            fmt_name(name, sizeof name, "%s.weight", module);
            snprintf(want_s, sizeof want_s, "BF16/F16/F32 [%" PRId64 ", %" PRId64 "]%s", N, K,
                     cfg->qformat ? " or its int4 form" : "");
            return missing(b, name, want_s);
        }
        int64_t d[2] = {N, K};
        l->kind = EPYQ_LIN_DENSE;
        l->w = wt;
        /* Formats whose config lists every unquantized linear can be cross-checked both ways. */
        if (want.quantized && (cfg->qformat == EPYQ_QF_CT || cfg->qformat == EPYQ_QF_QUARK)) note_mismatch(b, module, false);
        return expect(b, wt, true, 2, d);
    }
    if (wt) {
        char name[NAME_MAX_LEN];
        fmt_name(name, sizeof name, "%s.weight", module);
        return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: %s has both a float weight and int4 tensors (%s)", epyq_ckpt_dir(b->ck),
                            module, q->name);
    }
    if (!want.quantized) {
        note_mismatch(b, module, true);
        want = epyq_qconfig_base(cfg->qc); /* trust the tensors, decode with the global scheme */
    }
    l->kind = EPYQ_LIN_Q4;
    l->scheme = want;
    l->qweight = q;
    int64_t gs = want.group_size;
    if (gs <= 0 || K % gs)
        return epyq_err_set(b->err, EPYQ_E_QUANT, "%s: %s: in_features %" PRId64 " is not a multiple of group_size %" PRId64,
                            epyq_ckpt_dir(b->ck), module, K, gs);
    int64_t Gn = K / gs;
    switch (cfg->qformat) {
    case EPYQ_QF_GPTQ: return bind_gptq_awq(b, l, N, K, Gn, false);
    case EPYQ_QF_AWQ: return bind_gptq_awq(b, l, N, K, Gn, true);
    case EPYQ_QF_CT: return bind_ct(b, l, N, K, Gn);
    case EPYQ_QF_QUARK: return bind_quark(b, l, N, K, Gn);
    case EPYQ_QF_NONE: break;
    }
    return epyq_err_set(b->err, EPYQ_E_INTERNAL, "%s: unreachable format", module);
}

/* ---- architecture (docs/architecture.md §3) ---- */

static epyq_status bind_moe(binder *b, epyq_moe_w *m, const char *p /* "...layers.N.mlp." */) {
    const epyq_config *c = b->cfg;
    int64_t E = c->num_experts, H = c->hidden_size, I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
    char mod[NAME_MAX_LEN];
    epyq_status st;
    fmt_name(mod, sizeof mod, "%sgate", p);
    if ((st = bind_linear(b, &m->router, mod, E, H))) return st;
    m->gate = calloc((size_t)E, sizeof *m->gate);
    m->up = calloc((size_t)E, sizeof *m->up);
    m->down = calloc((size_t)E, sizeof *m->down);
    if (!m->gate || !m->up || !m->down) return epyq_err_set(b->err, EPYQ_E_NOMEM, "out of memory binding %s", p);
    const epyq_tensor *gu = find(b, "%sexperts.gate_up_proj", p);
    if (gu) { /* fused 3-D (the original BF16 release): [E][2I][H] gate rows first, [E][H][I] */
        const epyq_tensor *dn = find(b, "%sexperts.down_proj", p);
        int64_t dgu[3] = {E, 2 * I, H}, ddn[3] = {E, H, I};
        if ((st = expect(b, gu, true, 3, dgu))) return st;
        if (!dn) {
            fmt_name(mod, sizeof mod, "%sexperts.down_proj", p);
            return missing(b, mod, "the fused 3-D down_proj beside gate_up_proj");
        }
        if ((st = expect(b, dn, true, 3, ddn))) return st;
        m->fused = true;
        for (int64_t e = 0; e < E; e++) {
            epyq_linear *l[3] = {&m->gate[e], &m->up[e], &m->down[e]};
            static const char *nm[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int j = 0; j < 3; j++) {
                fmt_name(l[j]->module, sizeof l[j]->module, "%sexperts.%" PRId64 ".%s", p, e, nm[j]);
                l[j]->kind = EPYQ_LIN_DENSE;
                l[j]->slice = e;
                l[j]->w = j == 2 ? dn : gu;
                l[j]->n_out = j == 2 ? H : I;
                l[j]->n_in = j == 2 ? I : H;
                l[j]->row0 = j == 1 ? I : 0;
            }
        }
    } else {
        for (int64_t e = 0; e < E; e++) {
            /* rare variant: per expert but gate/up fused, [2I][H] */
            const epyq_tensor *pgu = find(b, "%sexperts.%" PRId64 ".gate_up_proj.weight", p, e);
            if (pgu) {
                int64_t d[2] = {2 * I, H};
                if ((st = expect(b, pgu, true, 2, d))) return st;
                for (int j = 0; j < 2; j++) {
                    epyq_linear *l = j ? &m->up[e] : &m->gate[e];
                    fmt_name(l->module, sizeof l->module, "%sexperts.%" PRId64 ".%s", p, e, j ? "up_proj" : "gate_proj");
                    l->kind = EPYQ_LIN_DENSE;
                    l->w = pgu;
                    l->n_out = I;
                    l->n_in = H;
                    l->row0 = j ? I : 0;
                }
            } else {
                fmt_name(mod, sizeof mod, "%sexperts.%" PRId64 ".gate_proj", p, e);
                if ((st = bind_linear(b, &m->gate[e], mod, I, H))) return st;
                fmt_name(mod, sizeof mod, "%sexperts.%" PRId64 ".up_proj", p, e);
                if ((st = bind_linear(b, &m->up[e], mod, I, H))) return st;
            }
            fmt_name(mod, sizeof mod, "%sexperts.%" PRId64 ".down_proj", p, e);
            if ((st = bind_linear(b, &m->down[e], mod, H, I))) return st;
        }
    }
    fmt_name(mod, sizeof mod, "%sshared_expert.gate_proj", p);
    if ((st = bind_linear(b, &m->sh_gate, mod, Is, H))) return st;
    fmt_name(mod, sizeof mod, "%sshared_expert.up_proj", p);
    if ((st = bind_linear(b, &m->sh_up, mod, Is, H))) return st;
    fmt_name(mod, sizeof mod, "%sshared_expert.down_proj", p);
    if ((st = bind_linear(b, &m->sh_down, mod, H, Is))) return st;
    fmt_name(mod, sizeof mod, "%sshared_expert_gate", p);
    return bind_linear(b, &m->sh_expert_gate, mod, 1, H);
}

static epyq_status bind_layer(binder *b, epyq_layer_w *L, const char *p /* "...layers.N." */, bool full) {
    const epyq_config *c = b->cfg;
    int64_t H = c->hidden_size, hd = c->head_dim;
    char n[NAME_MAX_LEN];
    epyq_status st;
    int64_t dH[1] = {H};
    L->full_attn = full;
    fmt_name(n, sizeof n, "%sinput_layernorm.weight", p);
    if ((st = bind_vec(b, &L->input_norm, n, 1, dH))) return st;
    fmt_name(n, sizeof n, "%spost_attention_layernorm.weight", p);
    if ((st = bind_vec(b, &L->post_norm, n, 1, dH))) return st;
    if (full) {
        epyq_attn_w *a = &L->attn;
        int64_t nq = c->num_attention_heads, nkv = c->num_key_value_heads, dhd[1] = {hd};
        const struct {
            epyq_linear *l;
            const char *nm;
            int64_t N, K;
        } lin[] = {
            {&a->q_proj, "q_proj", nq * hd * (c->attn_output_gate ? 2 : 1), H},
            {&a->k_proj, "k_proj", nkv * hd, H},
            {&a->v_proj, "v_proj", nkv * hd, H},
            {&a->o_proj, "o_proj", H, nq * hd},
        };
        for (size_t i = 0; i < 4; i++) {
            fmt_name(n, sizeof n, "%sself_attn.%s", p, lin[i].nm);
            if ((st = bind_linear(b, lin[i].l, n, lin[i].N, lin[i].K))) return st;
        }
        fmt_name(n, sizeof n, "%sself_attn.q_norm.weight", p);
        if ((st = bind_vec(b, &a->q_norm, n, 1, dhd))) return st;
        fmt_name(n, sizeof n, "%sself_attn.k_norm.weight", p);
        if ((st = bind_vec(b, &a->k_norm, n, 1, dhd))) return st;
    } else {
        epyq_gdn_w *g = &L->gdn;
        int64_t Hk = c->lin_num_key_heads, Hv = c->lin_num_value_heads, Dk = c->lin_key_head_dim,
                Dv = c->lin_value_head_dim, conv = 2 * Hk * Dk + Hv * Dv;
        const struct {
            epyq_linear *l;
            const char *nm;
            int64_t N, K;
        } lin[] = {
            {&g->in_proj_qkv, "in_proj_qkv", conv, H}, {&g->in_proj_z, "in_proj_z", Hv * Dv, H},
            {&g->in_proj_b, "in_proj_b", Hv, H},       {&g->in_proj_a, "in_proj_a", Hv, H},
            {&g->out_proj, "out_proj", H, Hv * Dv},
        };
        for (size_t i = 0; i < 5; i++) {
            fmt_name(n, sizeof n, "%slinear_attn.%s", p, lin[i].nm);
            if ((st = bind_linear(b, lin[i].l, n, lin[i].N, lin[i].K))) return st;
        }
        int64_t dconv[3] = {conv, 1, c->conv_kernel}, dHv[1] = {Hv}, dDv[1] = {Dv};
        fmt_name(n, sizeof n, "%slinear_attn.conv1d.weight", p);
        if ((st = bind_vec(b, &g->conv1d, n, 3, dconv))) return st;
        fmt_name(n, sizeof n, "%slinear_attn.dt_bias", p);
        if ((st = bind_vec(b, &g->dt_bias, n, 1, dHv))) return st;
        fmt_name(n, sizeof n, "%slinear_attn.A_log", p);
        if ((st = bind_vec(b, &g->A_log, n, 1, dHv))) return st;
        fmt_name(n, sizeof n, "%slinear_attn.norm.weight", p);
        if ((st = bind_vec(b, &g->norm, n, 1, dDv))) return st;
    }
    fmt_name(n, sizeof n, "%smlp.", p);
    return bind_moe(b, &L->moe, n);
}

static epyq_status bind_mtp(binder *b, epyq_mtp_w *m) {
    int64_t H = b->cfg->hidden_size, dH[1] = {H};
    epyq_status st;
    if ((st = bind_linear(b, &m->fc, "mtp.fc", H, 2 * H))) return st;
    if ((st = bind_vec(b, &m->pre_fc_norm_embedding, "mtp.pre_fc_norm_embedding.weight", 1, dH))) return st;
    if ((st = bind_vec(b, &m->pre_fc_norm_hidden, "mtp.pre_fc_norm_hidden.weight", 1, dH))) return st;
    if ((st = bind_vec(b, &m->norm, "mtp.norm.weight", 1, dH))) return st;
    return bind_layer(b, &m->layer, "mtp.layers.0.", true);
}

static bool has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static void free_layer(epyq_layer_w *L) {
    free(L->moe.gate);
    free(L->moe.up);
    free(L->moe.down);
}

void epyq_weights_free(epyq_weights *w) {
    if (!w) return;
    if (w->layers)
        for (int32_t i = 0; i < w->cfg.num_hidden_layers; i++) free_layer(&w->layers[i]);
    free(w->layers);
    free_layer(&w->mtp.layer);
    for (size_t i = 0; i < w->n_unexpected; i++) free(w->unexpected[i]);
    free(w->unexpected);
    epyq_ckpt_free(w->ckpt);
    epyq_config_free(&w->cfg);
    free(w);
}

/* Text-only re-exports use "model." instead of "model.language_model."
 * (docs/architecture.md §3.2). */
static void pick_prefix(binder *b, epyq_config *cfg) {
    static const char *cands[] = {"model.language_model.", "model."};
    char n[NAME_MAX_LEN];
    fmt_name(n, sizeof n, "%sembed_tokens.weight", cfg->prefix);
    if (epyq_ckpt_find(b->ck, n)) return;
    for (size_t i = 0; i < 2; i++) {
        fmt_name(n, sizeof n, "%sembed_tokens.weight", cands[i]);
        if (epyq_ckpt_find(b->ck, n)) {
            snprintf(cfg->prefix, sizeof cfg->prefix, "%s", cands[i]);
            return;
        }
    }
}

static epyq_status bind_all(binder *b, epyq_weights *w, const epyq_bind_opts *o) {
    epyq_config *cfg = &w->cfg;
    int64_t V = cfg->vocab_size, H = cfg->hidden_size, dVH[2] = {V, H}, dH[1] = {H};
    char n[NAME_MAX_LEN];
    epyq_status st;
    pick_prefix(b, cfg);
    fmt_name(n, sizeof n, "%sembed_tokens.weight", cfg->prefix);
    if ((st = bind_vec(b, &w->embed, n, 2, dVH))) return st;
    fmt_name(n, sizeof n, "%snorm.weight", cfg->prefix);
    if ((st = bind_vec(b, &w->final_norm, n, 1, dH))) return st;
    bool have_head = epyq_ckpt_find(b->ck, "lm_head.weight") || epyq_ckpt_find(b->ck, "lm_head.qweight") ||
                     epyq_ckpt_find(b->ck, "lm_head.weight_packed");
    if (!have_head && cfg->tie_word_embeddings) {
        memset(&w->lm_head, 0, sizeof w->lm_head);
        fmt_name(w->lm_head.module, sizeof w->lm_head.module, "lm_head");
        w->lm_head.kind = EPYQ_LIN_DENSE;
        w->lm_head.w = w->embed;
        w->lm_head.n_out = V;
        w->lm_head.n_in = H;
    } else if ((st = bind_linear(b, &w->lm_head, "lm_head", V, H))) {
        return st;
    }
    w->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *w->layers);
    if (!w->layers) return epyq_err_set(b->err, EPYQ_E_NOMEM, "out of memory");
    for (int32_t i = 0; i < cfg->num_hidden_layers; i++) {
        fmt_name(n, sizeof n, "%slayers.%d.", cfg->prefix, i);
        if ((st = bind_layer(b, &w->layers[i], n, cfg->full_attn[i]))) return st;
    }
    size_t nt = epyq_ckpt_count(b->ck);
    for (size_t i = 0; i < nt; i++) {
        const char *nm = epyq_ckpt_at(b->ck, i)->name;
        if (has_prefix(nm, "model.visual.") || has_prefix(nm, "visual.")) w->n_vision++;
        else if (has_prefix(nm, "mtp.")) w->n_mtp++;
    }
    if (cfg->mtp_num_hidden_layers > 0 && w->n_mtp && !o->skip_mtp) {
        if ((st = bind_mtp(b, &w->mtp))) return st;
        w->has_mtp = true;
    }
    size_t nu = 0;
    for (size_t i = 0; i < nt; i++) {
        const char *nm = epyq_ckpt_at(b->ck, i)->name;
        bool known = b->claimed[i] || has_prefix(nm, "model.visual.") || has_prefix(nm, "visual.") ||
                     (!w->has_mtp && has_prefix(nm, "mtp."));
        if (!known) nu++;
    }
    if (nu && !o->allow_unexpected) {
        for (size_t i = 0; i < nt; i++) {
            const char *nm = epyq_ckpt_at(b->ck, i)->name;
            if (!b->claimed[i] && !has_prefix(nm, "model.visual.") && !has_prefix(nm, "visual.") &&
                (w->has_mtp || !has_prefix(nm, "mtp.")))
                return epyq_err_set(b->err, EPYQ_E_SHAPE, "%s: unexpected tensor %s (%zu tensors outside the architecture)",
                                    epyq_ckpt_dir(b->ck), nm, nu);
        }
    }
    if (nu) {
        w->unexpected = calloc(nu, sizeof *w->unexpected);
        if (!w->unexpected) return epyq_err_set(b->err, EPYQ_E_NOMEM, "out of memory");
        for (size_t i = 0; i < nt; i++) {
            const char *nm = epyq_ckpt_at(b->ck, i)->name;
            if (b->claimed[i] || has_prefix(nm, "model.visual.") || has_prefix(nm, "visual.") ||
                (!w->has_mtp && has_prefix(nm, "mtp.")))
                continue;
            if (!(w->unexpected[w->n_unexpected] = strdup(nm))) return epyq_err_set(b->err, EPYQ_E_NOMEM, "out of memory");
            w->n_unexpected++;
        }
    }
    return EPYQ_OK;
}

epyq_status epyq_weights_bind(epyq_weights **out, const char *dir, const epyq_bind_opts *opts, epyq_err *err) {
    *out = NULL;
    epyq_bind_opts none = {0};
    if (!opts) opts = &none;
    epyq_weights *w = calloc(1, sizeof *w);
    if (!w) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
    epyq_status st = epyq_config_load(&w->cfg, dir, err);
    if (st) {
        free(w);
        return st;
    }
    if ((st = epyq_ckpt_open(&w->ckpt, dir, err))) {
        epyq_weights_free(w);
        return st;
    }
    binder b = {.ck = w->ckpt, .cfg = &w->cfg, .w = w, .err = err};
    b.claimed = calloc(epyq_ckpt_count(w->ckpt) + 1, 1);
    if (!b.claimed) st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", dir);
    else st = bind_all(&b, w, opts);
    free(b.claimed);
    if (st) {
        epyq_weights_free(w);
        return st;
    }
    *out = w;
    return EPYQ_OK;
}

/* ---- iteration for summaries ---- */

const char *epyq_module_kind_name(epyq_module_kind k) {
    static const char *names[EPYQ_MK_COUNT] = {"gdn", "attention", "router", "experts", "shared_expert",
                                               "shared_expert_gate", "lm_head", "mtp_fc"};
    return (unsigned)k < EPYQ_MK_COUNT ? names[k] : "?";
}

static void each_layer(const epyq_layer_w *L, int32_t layer, int32_t E, bool mtp, epyq_linear_fn fn, void *ctx) {
    if (L->full_attn) {
        const epyq_linear *a[4] = {&L->attn.q_proj, &L->attn.k_proj, &L->attn.v_proj, &L->attn.o_proj};
        for (int i = 0; i < 4; i++) fn(a[i], EPYQ_MK_ATTN, layer, -1, mtp, ctx);
    } else {
        const epyq_linear *g[5] = {&L->gdn.in_proj_qkv, &L->gdn.in_proj_z, &L->gdn.in_proj_b, &L->gdn.in_proj_a,
                                   &L->gdn.out_proj};
        for (int i = 0; i < 5; i++) fn(g[i], EPYQ_MK_GDN, layer, -1, mtp, ctx);
    }
    const epyq_moe_w *m = &L->moe;
    fn(&m->router, EPYQ_MK_ROUTER, layer, -1, mtp, ctx);
    for (int32_t e = 0; e < E; e++) {
        fn(&m->gate[e], EPYQ_MK_EXPERT, layer, e, mtp, ctx);
        fn(&m->up[e], EPYQ_MK_EXPERT, layer, e, mtp, ctx);
        fn(&m->down[e], EPYQ_MK_EXPERT, layer, e, mtp, ctx);
    }
    fn(&m->sh_gate, EPYQ_MK_SHARED, layer, -1, mtp, ctx);
    fn(&m->sh_up, EPYQ_MK_SHARED, layer, -1, mtp, ctx);
    fn(&m->sh_down, EPYQ_MK_SHARED, layer, -1, mtp, ctx);
    fn(&m->sh_expert_gate, EPYQ_MK_SHARED_GATE, layer, -1, mtp, ctx);
}

void epyq_weights_foreach_linear(const epyq_weights *w, epyq_linear_fn fn, void *ctx) {
    for (int32_t i = 0; i < w->cfg.num_hidden_layers; i++) each_layer(&w->layers[i], i, w->cfg.num_experts, false, fn, ctx);
    fn(&w->lm_head, EPYQ_MK_LM_HEAD, -1, -1, false, ctx);
    if (w->has_mtp) {
        fn(&w->mtp.fc, EPYQ_MK_MTP_FC, 0, -1, true, ctx);
        each_layer(&w->mtp.layer, 0, w->cfg.num_experts, true, fn, ctx);
    }
}
