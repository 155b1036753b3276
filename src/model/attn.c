/* src/model/attn.c — gated full attention over a batch (docs/architecture.md §4.3, §4.4).
 *
 * All tokens' keys/values are written to their sequences' caches first (slot = position), then
 * each (token, kv head) attends to slots [0, pos] of its own sequence — causal by
 * construction, and independent of the other sequences in the batch. Everything after the
 * projections and before the output projection is per kv head (its query heads' norms, RoPE,
 * scores, softmax, weighted V and gate; its k and v), so in NUMA mode it runs on the node that
 * holds that head's cache planes (numa_state.c). */
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
    float *qg;         /* [T][nq][2*hd] q | gate per head; q normed and rotated by prep_head */
    float *kk;         /* [T][nkv*hd] keys, normed and rotated by prep_head */
    const float *vv;   /* [T][nkv*hd] values */
    float *o;          /* [T][nq*hd] */
    uint16_t **tmp;    /* [epyq_numa_workers] fp8 widening scratch [2][max_ctx][hd] */
    bool fused;        /* one token per sequence: a task prepares its row, then attends */
} attn_job;

/* Token t, kv head kvh: RMSNorm and RoPE of the q of its query heads and of its k, and the
 * k, v row stored in the head's cache plane. Everything here belongs to one kv head, so it
 * runs with the head's attention, on the node that holds that head's cache (numa_state.c). */
static void prep_head(const attn_job *j, int32_t t, int32_t kvh) {
    const epyq_model *m = j->m;
    const epyq_batch_plan *p = j->p;
    const epyq_attn_rw *a = &j->ly->at;
    int32_t hd = m->d.hd, group = m->d.nq / m->d.nkv, kvd = m->d.nkv * hd, qd = m->d.nq * 2 * hd;
    const int32_t p1[3] = {p->pos[t], p->pos[t], p->pos[t]}, *p3 = p->rpos ? p->rpos + 3 * t : p1;
    for (int32_t h = kvh * group; h < (kvh + 1) * group; h++) {
        float *q = j->qg + (size_t)t * qd + (size_t)h * 2 * hd; /* per head: q then gate */
        head_norm(q, a->q_norm, hd, m->eps);
        rope(m, q, p3);
    }
    float *k = j->kk + (size_t)t * kvd + (size_t)kvh * hd;
    head_norm(k, a->k_norm, hd, m->eps);
    rope(m, k, p3);
    epyq_seq_kv_store(p->seq[t], j->ly->slot, p->pos[t], kvh, k,
                      j->vv + (size_t)t * kvd + (size_t)kvh * hd);
}

static void prep_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const attn_job *j = ctx;
    prep_head(j, task / j->m->d.nkv, task % j->m->d.nkv);
}

static void attn_task(void *ctx, int32_t task, int32_t worker) {
    const attn_job *j = ctx;
    const epyq_model *m = j->m;
    int32_t t = task / m->d.nkv, kvh = task % m->d.nkv, group = m->d.nq / m->d.nkv, hd = m->d.hd;
    if (j->fused) prep_head(j, t, kvh);
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

/* Bytes of task (t, kv head) reads from its sequence's cache: the K and V rows [0, pos]. */
static uint64_t attn_bytes(void *ctx, int32_t task, const epyq_seq **seq) {
    const attn_job *j = ctx;
    int32_t t = task / j->m->d.nkv;
    *seq = j->p->seq[t];
    return 2ull * (uint64_t)(j->p->pos[t] + 1) * (uint64_t)j->m->d.hd * (*seq)->kv_elem;
}

/* The (token, kv head) tasks on the nodes that own the heads, or on the model's pool. */
static void run_kv_heads(epyq_model *m, epyq_task_fn fn, attn_job *j, epyq_numa_bytes_fn bytes) {
    if (!epyq_numa_run_heads(m, EPYQ_NUMA_HEAD_KV, fn, j, j->p->T, bytes))
        epyq_pool_run(m->pool, fn, j, j->p->T * m->d.nkv);
}

epyq_status epyq_attn_block(epyq_model *m, const epyq_layer_rw *ly, const epyq_batch_plan *p,
                            const float *x, float *out, epyq_err *err) {
    const epyq_attn_rw *a = &ly->at;
    int32_t T = p->T, hd = m->d.hd, kvd = m->d.nkv * hd, qd = m->d.nq * 2 * hd;
    /* written whole by the projections and the (token, kv head) tasks before any read */
    float *qg = epyq_model_alloc_raw((size_t)T * qd, sizeof(float));
    float *kk = epyq_model_alloc_raw((size_t)T * kvd, sizeof(float));
    float *vv = epyq_model_alloc_raw((size_t)T * kvd, sizeof(float));
    float *o = epyq_model_alloc_raw((size_t)T * m->d.nq * hd, sizeof(float));
    uint16_t **tmp = NULL;
    epyq_act act = {0}, oact = {0};
    void *abuf = NULL, *obuf = NULL;
    epyq_status st = qg && kk && vv && o ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "attention: out of memory");
    if (st != EPYQ_OK) goto done;
    uint64_t t0 = epyq_prof_mark(m);
    if ((st = epyq_rlin_act(m, x, T, m->d.H, &act, &abuf, err)) != EPYQ_OK) goto done;
    const epyq_rlin_out proj[] = {{&a->q, qg, qd}, {&a->k, kk, kvd}, {&a->v, vv, kvd}};
    epyq_rlin_run_many(m, proj, 3, &act);
    epyq_prof_add(m, EPYQ_PROF_ATTN_PROJ, &t0);
    /* fp8 caches are widened per (token, kv head) into per-worker scratch */
    int32_t max_n = 0;
    bool fp8 = false;
    for (int32_t t = 0; t < T; t++) {
        max_n = p->pos[t] + 1 > max_n ? p->pos[t] + 1 : max_n;
        fp8 |= p->seq[t]->kv == EPYQ_KV_FP8;
    }
    const int32_t workers = epyq_numa_workers(m); /* node pools number theirs over all pools */
    if (fp8) {
        tmp = calloc((size_t)workers, sizeof *tmp);
        for (int32_t w = 0; tmp && w < workers; w++)
            if (!(tmp[w] = epyq_model_alloc((size_t)2 * max_n * hd, sizeof(uint16_t))))
                st = EPYQ_E_NOMEM;
        if (!tmp || st != EPYQ_OK) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "attention: out of memory");
            goto done;
        }
    }
    /* Every token's rows are stored before any token attends (a prompt's tokens read each
     * other's): two runs, unless each sequence has one token, whose task stores then reads. */
    attn_job j = {m, ly, p, qg, kk, vv, o, tmp, p->n_groups == T};
    if (!j.fused) run_kv_heads(m, prep_task, &j, NULL);
    run_kv_heads(m, attn_task, &j, attn_bytes);
    epyq_prof_add(m, EPYQ_PROF_ATTN_CORE, &t0);
    if ((st = epyq_rlin_act(m, o, T, m->d.nq * hd, &oact, &obuf, err)) != EPYQ_OK) goto done;
    epyq_rlin_run(m, &a->o, &oact, out, m->d.H);
    epyq_prof_add(m, EPYQ_PROF_ATTN_OUT, &t0);
done:
    for (int32_t w = 0; tmp && w < epyq_numa_workers(m); w++) free(tmp[w]);
    free(tmp), free(abuf), free(obuf), free(qg), free(kk), free(vv), free(o);
    return st;
}
