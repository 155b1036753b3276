/* src/model/attn.c — gated full attention over a batch (docs/architecture.md §4.3, §4.4).
 *
 * All tokens' keys/values are written to their sequences' caches first (slot = position), then
 * each (token, kv head) attends to slots [0, pos] of its own sequence — causal by
 * construction, and independent of the other sequences in the batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

/* zero-centred RMSNorm of one head in place */
static void head_norm(float *v, const float *w, int32_t n, float eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += (double)v[i] * v[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int32_t i = 0; i < n; i++) v[i] = v[i] * inv * (1.0f + w[i]);
}

/* rotate-half RoPE on dims [0, rd) of one head; angles formed in double. p3: the (t, h, w)
 * positions; frequency i turns with axis h when i % 3 == 1 and i < 3 * mrope_section[1], with w
 * when i % 3 == 2 and i < 3 * mrope_section[2], else with t (interleaved M-RoPE,
 * docs/vision.md §4; for text the three are equal). */
static void rope(const epyq_model *m, float *v, const int32_t *p3) {
    int32_t half = m->d.rd / 2;
    const int32_t *sec = m->c->mrope_section;
    for (int32_t i = 0; i < half; i++) {
        int32_t ax = i % 3 == 1 && i < 3 * sec[1] ? 1 : i % 3 == 2 && i < 3 * sec[2] ? 2 : 0;
        double ang = (double)p3[ax] * m->inv_freq[i];
        float c = (float)(cos(ang) * m->rope_attn), s = (float)(sin(ang) * m->rope_attn);
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

typedef struct {
    const epyq_model *m;
    const epyq_layer_rw *ly;
    const epyq_batch_plan *p;
    const float *qg;   /* [T][nq][2*hd] normed, rotated q | gate */
    float *o;          /* [T][nq*hd] */
    uint16_t **tmp;    /* [n_threads] fp8 widening scratch [2][max_ctx][hd] */
} attn_job;

static void attn_task(void *ctx, int32_t task, int32_t worker) {
    const attn_job *j = ctx;
    const epyq_model *m = j->m;
    int32_t t = task / m->d.nkv, kvh = task % m->d.nkv, group = m->d.nq / m->d.nkv, hd = m->d.hd;
    int32_t n = j->p->pos[t] + 1;
    const uint16_t *k, *v;
    int32_t stride;
    epyq_seq_kv_view(j->p->seq[t], j->ly->slot, kvh, n, j->tmp ? j->tmp[worker] : NULL, &k, &v, &stride);
    const float *q = j->qg + ((size_t)t * m->d.nq + (size_t)kvh * group) * 2 * hd;
    float *o = j->o + ((size_t)t * m->d.nq + (size_t)kvh * group) * hd;
    m->kt->attn_bf16_multi(q, group, 2 * hd, k, v, n, hd, stride, 1.0f / sqrtf((float)hd), o, hd);
    /* sigmoid output gate of this group's heads, here so the pool shares it */
    for (int32_t h = 0; h < group; h++) {
        const float *g = q + (size_t)h * 2 * hd + hd;
        float *oh = o + (size_t)h * hd;
        for (int32_t i = 0; i < hd; i++) oh[i] *= 1.0f / (1.0f + expf(-g[i]));
    }
}

epyq_status epyq_attn_block(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p,
                            const float *x, float *out, epyq_err *err) {
    const epyq_attn_rw *a = &ly->at;
    int32_t T = p->T, hd = m->d.hd, kvd = m->d.nkv * hd, qd = m->d.nq * 2 * hd;
    float *qg = epyq_model_alloc((size_t)T * qd, sizeof(float));
    float *kk = epyq_model_alloc((size_t)T * kvd, sizeof(float));
    float *vv = epyq_model_alloc((size_t)T * kvd, sizeof(float));
    float *o = epyq_model_alloc((size_t)T * m->d.nq * hd, sizeof(float));
    uint16_t **tmp = NULL;
    epyq_act act = {0}, oact = {0};
    void *abuf = NULL, *obuf = NULL;
    epyq_status st = qg && kk && vv && o ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "attention: out of memory");
    if (st != EPYQ_OK) goto done;
    if ((st = epyq_rlin_act(m, x, T, m->d.H, &act, &abuf, err)) != EPYQ_OK) goto done;
    const epyq_rlin_out proj[] = {{&a->q, qg, qd}, {&a->k, kk, kvd}, {&a->v, vv, kvd}};
    epyq_rlin_run_many(m, proj, 3, &act);
    for (int32_t t = 0; t < T; t++) {
        const int32_t p1[3] = {p->pos[t], p->pos[t], p->pos[t]},
                      *p3 = p->rpos ? p->rpos + 3 * t : p1;
        for (int32_t h = 0; h < m->d.nq; h++) {
            float *q = qg + (size_t)t * qd + (size_t)h * 2 * hd; /* per head: q then gate */
            head_norm(q, a->q_norm, hd, m->eps);
            rope(m, q, p3);
        }
        for (int32_t h = 0; h < m->d.nkv; h++) {
            float *k = kk + (size_t)t * kvd + (size_t)h * hd;
            head_norm(k, a->k_norm, hd, m->eps);
            rope(m, k, p3);
        }
        epyq_seq_kv_store(p->seq[t], ly->slot, p->pos[t], kk + (size_t)t * kvd,
                          vv + (size_t)t * kvd);
    }
    /* fp8 caches are widened per (token, kv head) into per-worker scratch */
    int32_t max_n = 0;
    bool fp8 = false;
    for (int32_t t = 0; t < T; t++) {
        max_n = p->pos[t] + 1 > max_n ? p->pos[t] + 1 : max_n;
        fp8 |= p->seq[t]->kv == EPYQ_KV_FP8;
    }
    if (fp8) {
        tmp = calloc((size_t)m->n_threads, sizeof *tmp);
        for (int32_t w = 0; tmp && w < m->n_threads; w++)
            if (!(tmp[w] = epyq_model_alloc((size_t)2 * max_n * hd, sizeof(uint16_t))))
                st = EPYQ_E_NOMEM;
        if (!tmp || st != EPYQ_OK) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "attention: out of memory");
            goto done;
        }
    }
    attn_job j = {m, ly, p, qg, o, tmp};
    epyq_pool_run(m->pool, attn_task, &j, T * m->d.nkv);
    if ((st = epyq_rlin_act(m, o, T, m->d.nq * hd, &oact, &obuf, err)) != EPYQ_OK) goto done;
    epyq_rlin_run(m, &a->o, &oact, out, m->d.H);
done:
    for (int32_t w = 0; tmp && w < m->n_threads; w++) free(tmp[w]);
    free(tmp), free(abuf), free(obuf), free(qg), free(kk), free(vv), free(o);
    return st;
}
