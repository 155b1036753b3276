/* src/model/forward.c — the trunk over a batch (docs/architecture.md §4.1): embedding, decoder
 * layers with an fp32 residual stream, final norm, lm_head. The blocks live in attn.c,
 * deltanet.c and moe.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "load/tensor_f32.h"
#include "model/model_impl.h"

void epyq_rmsnorm_zc_rows(const float *x, const float *w, int32_t T, int32_t n, float eps,
                          float *y) {
    for (int32_t t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        double ss = 0.0; /* double: the sum over 2048 squares is the one long reduction here */
        for (int32_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / n + eps));
        for (int32_t i = 0; i < n; i++) yr[i] = xr[i] * inv * (1.0f + w[i]);
    }
}

typedef struct {
    void (*fn)(void *ctx, int32_t r0, int32_t r1);
    void *ctx;
    int32_t n, per;
} rows_job;

static void rows_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const rows_job *j = ctx;
    int32_t r0 = task * j->per, r1 = r0 + j->per < j->n ? r0 + j->per : j->n;
    j->fn(j->ctx, r0, r1);
}

void epyq_model_rows_run(epyq_model *m, int32_t n, int32_t min_rows,
                         void (*fn)(void *ctx, int32_t r0, int32_t r1), void *ctx) {
    if (n <= 0) return;
    if (!m->pool || m->n_threads <= 1 || n < min_rows) {
        fn(ctx, 0, n);
        return;
    }
    /* 4 tasks per thread: even enough when a vCPU is briefly away, few hand-outs */
    int32_t tasks = 4 * m->n_threads, per = (n + tasks - 1) / tasks;
    rows_job j = {fn, ctx, n, per};
    epyq_pool_run(m->pool, rows_task, &j, (n + per - 1) / per);
}

/* x += add (when given), then y = RMSNorm(x) with weight w (when given), rows [r0, r1). */
typedef struct {
    float *x;
    const float *add, *w;
    float *y;
    int32_t n;
    float eps;
} add_norm_job;

static void add_norm_rows(void *ctx, int32_t r0, int32_t r1) {
    const add_norm_job *j = ctx;
    size_t a = (size_t)r0 * j->n, b = (size_t)r1 * j->n;
    if (j->add)
        for (size_t i = a; i < b; i++) j->x[i] += j->add[i];
    if (j->w) epyq_rmsnorm_zc_rows(j->x + a, j->w, r1 - r0, j->n, j->eps, j->y + a);
}

static void add_norm(epyq_model *m, float *x, const float *add, const float *w, int32_t T,
                     float *y) {
    add_norm_job j = {x, add, w, y, m->d.H, m->eps};
    epyq_model_rows_run(m, T, EPYQ_ROWS_POOL_MIN, add_norm_rows, &j);
}

epyq_status epyq_layer_forward(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p,
                               float *x, epyq_err *err) {
    size_t n = (size_t)p->T * m->d.H;
    float *xn = epyq_model_alloc_raw(n, sizeof(float)),
          *blk = epyq_model_alloc_raw(n, sizeof(float));
    epyq_status st = xn && blk ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "layer: out of memory");
    uint64_t t0 = epyq_prof_mark(m);
    if (st == EPYQ_OK) {
        add_norm(m, x, NULL, ly->in_norm, p->T, xn);
        epyq_prof_add(m, EPYQ_PROF_NORM, &t0);
        st = ly->full ? epyq_attn_block(m, ly, p, xn, blk, err) : epyq_gdn_block(m, ly, p, xn, blk, err);
        t0 = epyq_prof_mark(m);
    }
    if (st == EPYQ_OK) {
        add_norm(m, x, blk, ly->post_norm, p->T, xn);
        epyq_prof_add(m, EPYQ_PROF_NORM, &t0);
        st = epyq_moe_block(m, &ly->m, p->T, xn, blk, err);
        t0 = epyq_prof_mark(m);
    }
    if (st == EPYQ_OK) {
        add_norm(m, x, blk, NULL, p->T, NULL);
        epyq_prof_add(m, EPYQ_PROF_NORM, &t0);
    }
    free(xn), free(blk);
    return st;
}

epyq_status epyq_head_run(epyq_model *m, const epyq_rlin *head, const float *x, int32_t rows,
                          float *logits, epyq_err *err) {
    if (rows <= 0) return EPYQ_OK;
    epyq_act a;
    void *buf;
    int32_t gs = head->q4 ? head->w4.gs : m->gs; /* a requantised head has its own */
    epyq_status st = epyq_rlin_act_gs(m, x, rows, m->d.H, gs, &a, &buf, err);
    if (st == EPYQ_OK) epyq_rlin_run(m, head, &a, logits, m->d.V);
    free(buf);
    return st;
}

epyq_status epyq_lm_head_run(epyq_model *m, const float *x, int32_t rows, float *logits,
                             epyq_err *err) {
    return epyq_head_run(m, &m->lm_head, x, rows, logits, err);
}

static void plan_free(epyq_batch_plan *p) {
    free(p->seq), free(p->pos), free(p->rpos), free(p->grp_off), free(p->grp_tok);
}

/* Positions, per-sequence groups and the context check, before any state changes. */
static epyq_status plan_make(epyq_model *m, const epyq_batch *b, const int32_t *mrope,
                             epyq_batch_plan *p, epyq_err *err) {
    memset(p, 0, sizeof *p);
    int32_t T = b->n;
    p->T = T;
    p->seq = calloc((size_t)T, sizeof *p->seq);
    p->pos = calloc((size_t)T, sizeof *p->pos);
    p->rpos = calloc((size_t)T * 3, sizeof *p->rpos);
    p->grp_off = calloc((size_t)T + 1, sizeof *p->grp_off);
    p->grp_tok = calloc((size_t)T, sizeof *p->grp_tok);
    int32_t *grp_of = calloc((size_t)T, sizeof *grp_of), *cnt = calloc((size_t)T + 1, sizeof *cnt);
    epyq_seq **gseq = calloc((size_t)T, sizeof *gseq); /* [n_groups] the group's sequence */
    epyq_status st = EPYQ_OK;
    if (!p->seq || !p->pos || !p->rpos || !p->grp_off || !p->grp_tok || !grp_of || !cnt || !gseq)
        st = epyq_err_set(err, EPYQ_E_NOMEM, "batch of %d tokens: out of memory", T);
    for (int32_t t = 0; st == EPYQ_OK && t < T; t++) {
        epyq_seq *s = b->seq[t];
        if (!s || s->m != m)
            st = epyq_err_set(err, EPYQ_E_ARG, "batch token %d: sequence of another model", t);
        else if (s->broken[0])
            st = epyq_err_set(err, EPYQ_E_ARG,
                              "batch token %d: its sequence was left half-advanced by a failed forward (%s);"
                              " reset it before use", t, s->broken);
        else if (b->tok[t] < 0 || b->tok[t] >= m->d.V)
            st = epyq_err_set(err, EPYQ_E_ARG,
                              "batch token %d: id %d outside the vocabulary [0, %d)", t, b->tok[t],
                              m->d.V);
        if (st != EPYQ_OK) break;
        /* linear search: the number of distinct sequences in a batch is small */
        int32_t g = 0;
        while (g < p->n_groups && gseq[g] != s) g++;
        if (g == p->n_groups) gseq[p->n_groups++] = s;
        grp_of[t] = g;
        p->seq[t] = s;
        p->pos[t] = s->pos + cnt[g]++;
        for (int a = 0; a < 3; a++)
            p->rpos[3 * t + a] = mrope ? mrope[3 * t + a] : p->pos[t] + s->rope_delta;
    }
    for (int32_t g = 0; st == EPYQ_OK && g < p->n_groups; g++)
        if ((int64_t)gseq[g]->pos + cnt[g] > gseq[g]->n_ctx)
            st = epyq_err_set(err, EPYQ_E_CTX_FULL,
                              "a sequence at position %d given %d more tokens needs %lld positions;"
                              " its context is %d", gseq[g]->pos, cnt[g],
                              (long long)gseq[g]->pos + cnt[g], gseq[g]->n_ctx);
    if (st == EPYQ_OK) {
        /* counting sort into groups, keeping batch order inside each sequence */
        int32_t acc = 0;
        for (int32_t g = 0; g < p->n_groups; g++) {
            int32_t c = cnt[g];
            p->grp_off[g] = acc;
            cnt[g] = acc;
            acc += c;
        }
        p->grp_off[p->n_groups] = acc;
        for (int32_t t = 0; t < T; t++) p->grp_tok[cnt[grp_of[t]]++] = t;
    }
    free(gseq);
    free(grp_of), free(cnt);
    if (st != EPYQ_OK) plan_free(p);
    return st;
}

epyq_status epyq_model_forward(epyq_model *m, const epyq_batch *b, float *logits, float *hidden,
                               epyq_err *err) {
    return epyq_model_forward_img(m, b, NULL, logits, hidden, err);
}

epyq_status epyq_model_forward_img(epyq_model *m, const epyq_batch *b, const epyq_batch_img *img,
                                   float *logits, float *hidden, epyq_err *err) {
    if (b->n <= 0) return EPYQ_OK;
    epyq_batch_plan p;
    const float *const *embd = img ? img->embd : NULL;
    const int32_t *mrope = img ? img->mrope : NULL;
    epyq_status st = plan_make(m, b, mrope, &p, err);
    if (st != EPYQ_OK) return st;
    int32_t T = b->n, H = m->d.H;
    m->fwd_bytes = 0;
    uint64_t t0 = epyq_prof_mark(m);
    float *x = epyq_model_alloc((size_t)T * H, sizeof(float));
    if (!x) st = epyq_err_set(err, EPYQ_E_NOMEM, "residual [%d][%d]: out of memory", T, H);
    for (int32_t t = 0; T > 1 && !m->embed_mem && t < T; t++) /* mapped rows' reads at once */
        if (!(embd && embd[t]))                               /* tokens checked by plan_make */
            epyq_tensor_prefetch(&m->embed, (size_t)b->tok[t] * H, (size_t)H);
    for (int32_t t = 0; st == EPYQ_OK && t < T; t++)
        if (embd && embd[t]) /* image features in place of <|image_pad|> (docs/vision.md §4) */
            memcpy(x + (size_t)t * H, embd[t], (size_t)H * sizeof(float));
        else
            st = epyq_tensor_read_f32(&m->embed, (size_t)b->tok[t] * H, (size_t)H,
                                      x + (size_t)t * H, err);
    epyq_prof_add(m, EPYQ_PROF_EMBED, &t0);
    bool moved = false; /* whether any sequence state (KV, DeltaNet conv/state) may have changed */
    for (int32_t l = 0; st == EPYQ_OK && l < m->d.L; l++) {
        moved = true;
        st = epyq_layer_forward(m, &m->layers[l], &p, x, err);
    }
    if (st == EPYQ_OK) {
        t0 = epyq_prof_mark(m);
        add_norm(m, x, NULL, m->final_norm, T, x);
        if (hidden) memcpy(hidden, x, (size_t)T * H * sizeof(float));
        /* lm_head only over the rows asked for, packed in batch order */
        int32_t nw = 0;
        for (int32_t t = 0; t < T; t++) {
            if (b->want && !b->want[t]) continue;
            if (nw != t) memmove(x + (size_t)nw * H, x + (size_t)t * H, (size_t)H * sizeof(float));
            nw++;
        }
        if (logits) st = epyq_lm_head_run(m, x, nw, logits, err);
        if (logits && nw > 0) m->fwd_bytes += epyq_rlin_bytes(&m->lm_head);
        epyq_prof_add(m, EPYQ_PROF_HEAD, &t0);
        epyq_prof_forward_done(m);
    }
    /* the states advanced in the blocks; positions advance once the whole batch is through */
    if (st == EPYQ_OK)
        for (int32_t t = 0; t < T; t++)
            if (p.pos[t] + 1 > p.seq[t]->pos) p.seq[t]->pos = p.pos[t] + 1;
    if (st == EPYQ_OK && mrope) /* decode resumes after the largest rotary position given */
        for (int32_t g = 0; g < p.n_groups; g++) {
            epyq_seq *s = p.seq[p.grp_tok[p.grp_off[g]]];
            int32_t mx = INT32_MIN;
            for (int32_t i = p.grp_off[g]; i < p.grp_off[g + 1]; i++)
                for (int a = 0; a < 3; a++)
                    mx = p.rpos[3 * p.grp_tok[i] + a] > mx ? p.rpos[3 * p.grp_tok[i] + a] : mx;
            s->rope_delta = mx + 1 - s->pos;
        }
    /* A failure past the first layer (out of memory in a block, in the lm_head) leaves some
     * layers' recurrent states advanced and others not: rolling back would mean copying every
     * DeltaNet state of the batch before each step, so the sequences are marked instead, and
     * refused until reset (model.h). Positions stay where they were. */
    if (st != EPYQ_OK && moved)
        for (int32_t t = 0; t < T; t++)
            snprintf(p.seq[t]->broken, sizeof p.seq[t]->broken, "%.150s", err && err->msg[0] ? err->msg : epyq_status_name(st));
    free(x);
    plan_free(&p);
    return st;
}
