/* src/model/attn.c — gated full attention over a batch (docs/architecture.md §4.3, §4.4).
 *
 * All tokens' keys/values are written to their sequences' caches first (slot = position), then
 * each (token, kv head) attends to slots [0, pos] of its own sequence — causal by
 * construction, and independent of the other sequences in the batch. Tokens attend in tiles of
 * consecutive tokens of one sequence (attn_bf16_tile: each K/V row loaded once for the tile's
 * token x head rows; a decode token is a tile of one); a row's bits do not depend on its tile,
 * so neither on how a prompt is cut into calls nor on the batch. Everything after the
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

/* rotate-half RoPE on dims [0, rd) of a head; angles formed in double. p3: the (t, h, w)
 * positions; frequency i turns with axis h when i % 3 == 1 and i < 3 * mrope_section[1], with w
 * when i % 3 == 2 and i < 3 * mrope_section[2], else with t (interleaved M-RoPE,
 * docs/vision.md §4; for text the three are equal). The angles depend on the token only, so
 * rope_angles forms them once for all the heads a task rotates (a prompt spent most of its
 * attention prep in sin/cos, once per head). */
#define ROPE_CHUNK 64 /* frequencies formed at a time */
static void rope_angles(const epyq_model *m, const int32_t *p3, int32_t i0, int32_t i1, float *c,
                        float *s) {
    const int32_t *sec = m->c->mrope_section;
    for (int32_t i = i0; i < i1; i++) {
        int32_t ax = i % 3 == 1 && i < 3 * sec[1] ? 1 : i % 3 == 2 && i < 3 * sec[2] ? 2 : 0;
        double ang = (double)p3[ax] * m->inv_freq[i];
        c[i - i0] = (float)(cos(ang) * m->rope_attn);
        s[i - i0] = (float)(sin(ang) * m->rope_attn);
    }
}

/* frequencies [i0, i1) of one head, cos/sin from rope_angles */
static void rope_apply(float *v, int32_t half, int32_t i0, int32_t i1, const float *c,
                       const float *s) {
    for (int32_t i = i0; i < i1; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * c[i - i0] - b * s[i - i0];
        v[i + half] = b * c[i - i0] + a * s[i - i0];
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
    const int32_t *tile0; /* [n_tiles + 1] first token of each prompt tile, then T */
} attn_job;

/* Tokens per prompt tile: ATTN_TILE_ROWS query rows (tokens x the group's heads), the most the
 * SIMD kernel keeps in one pass over K/V. A tile of 8 tokens x 8 heads at 4096 tokens of
 * context: ~1.3-1.8x the per-token GQA entry (benchmarks/dense --only attn). */
#define ATTN_TILE_ROWS 64

/* Token t, kv head kvh: RMSNorm and RoPE of the q of its query heads and of its k, and the
 * k, v row stored in the head's cache plane. Everything here belongs to one kv head, so it
 * runs with the head's attention, on the node that holds that head's cache (numa_state.c). */
static void prep_head(const attn_job *j, int32_t t, int32_t kvh) {
    const epyq_model *m = j->m;
    const epyq_batch_plan *p = j->p;
    const epyq_attn_rw *a = &j->ly->at;
    int32_t hd = m->d.hd, group = m->d.nq / m->d.nkv, kvd = m->d.nkv * hd, qd = m->d.nq * 2 * hd;
    const int32_t p1[3] = {p->pos[t], p->pos[t], p->pos[t]}, *p3 = p->rpos ? p->rpos + 3 * t : p1;
    float *q0 = j->qg + (size_t)t * qd + (size_t)kvh * group * 2 * hd; /* per head: q, gate */
    float *k = j->kk + (size_t)t * kvd + (size_t)kvh * hd;
    for (int32_t h = 0; h < group; h++) head_norm(q0 + (size_t)h * 2 * hd, a->q_norm, hd, m->eps);
    head_norm(k, a->k_norm, hd, m->eps);
    const int32_t half = m->d.rd / 2;
    float c[ROPE_CHUNK], s[ROPE_CHUNK];
    for (int32_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
        const int32_t i1 = half - i0 < ROPE_CHUNK ? half : i0 + ROPE_CHUNK;
        rope_angles(m, p3, i0, i1, c, s);
        for (int32_t h = 0; h < group; h++) rope_apply(q0 + (size_t)h * 2 * hd, half, i0, i1, c, s);
        rope_apply(k, half, i0, i1, c, s);
    }
    epyq_seq_kv_store(p->seq[t], j->ly->slot, p->pos[t], kvh, k,
                      j->vv + (size_t)t * kvd + (size_t)kvh * hd);
}

static void prep_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const attn_job *j = ctx;
    prep_head(j, task / j->m->d.nkv, task % j->m->d.nkv);
}

/* sigmoid output gate of heads [0, nh) of one token (q [nh][2*hd] q | gate, o [nh][hd]) */
static void gate_heads(const float *q, float *o, int32_t nh, int32_t hd) {
    for (int32_t h = 0; h < nh; h++) {
        const float *g = q + (size_t)h * 2 * hd + hd;
        float *oh = o + (size_t)h * hd;
        for (int32_t i = 0; i < hd; i++) oh[i] *= 1.0f / (1.0f + expf(-g[i]));
    }
}

/* Tile, kv head: its tokens' rows against their sequence's cache (a decode token is a tile of
 * one, which first prepares its row when fused). */
static void tile_task(void *ctx, int32_t task, int32_t worker) {
    const attn_job *j = ctx;
    const epyq_model *m = j->m;
    const int32_t tile = task / m->d.nkv, kvh = task % m->d.nkv, group = m->d.nq / m->d.nkv,
                  hd = m->d.hd;
    const int32_t t0 = j->tile0[tile], nt = j->tile0[tile + 1] - t0, qd = m->d.nq * 2 * hd,
                  od = m->d.nq * hd;
    if (j->fused) prep_head(j, t0, kvh);
    int32_t n[ATTN_TILE_ROWS], max_n = 0;
    for (int32_t i = 0; i < nt; i++) {
        n[i] = j->p->pos[t0 + i] + 1;
        max_n = n[i] > max_n ? n[i] : max_n;
    }
    const uint16_t *k, *v;
    int32_t stride;
    epyq_seq_kv_view(j->p->seq[t0], j->ly->slot, kvh, max_n, j->tmp ? j->tmp[worker] : NULL, &k, &v,
                     &stride);
    const float *q = j->qg + (size_t)t0 * qd + (size_t)kvh * group * 2 * hd;
    float *o = j->o + (size_t)t0 * od + (size_t)kvh * group * hd;
    m->kt->attn_bf16_tile(q, nt, group, qd, 2 * hd, n, k, v, hd, stride, 1.0f / sqrtf((float)hd), o,
                          od, hd);
    for (int32_t i = 0; i < nt; i++) gate_heads(q + (size_t)i * qd, o + (size_t)i * od, group, hd);
}

/* Bytes task (tile, kv head) reads from its sequence's cache: the K and V rows [0, max pos],
 * once for the whole tile. */
static uint64_t tile_bytes(void *ctx, int32_t task, const epyq_seq **seq) {
    const attn_job *j = ctx;
    const int32_t tile = task / j->m->d.nkv;
    int32_t max_n = 0;
    for (int32_t t = j->tile0[tile]; t < j->tile0[tile + 1]; t++)
        max_n = j->p->pos[t] + 1 > max_n ? j->p->pos[t] + 1 : max_n;
    *seq = j->p->seq[j->tile0[tile]];
    return 2ull * (uint64_t)max_n * (uint64_t)j->m->d.hd * (*seq)->kv_elem;
}

/* The (token, kv head) tasks on the nodes that own the heads, or on the model's pool. */
static void run_kv_heads(epyq_model *m, epyq_task_fn fn, attn_job *j, int32_t n_outer,
                         epyq_numa_bytes_fn bytes) {
    if (!epyq_numa_run_heads(m, EPYQ_NUMA_HEAD_KV, fn, j, n_outer, bytes))
        epyq_pool_run(m->pool, fn, j, n_outer * m->d.nkv);
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
    int32_t *tile0 = NULL;
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
    /* Tiles: runs of consecutive tokens of one sequence, up to the kernel's rows; one token
     * per sequence (decode) gives tiles of one, whose task stores its row and then reads.
     * Otherwise every token's rows are stored before any token attends (a prompt's tokens
     * read each other's). Decode and prompt rows share the kernel, and a row's bits do not
     * depend on its tile: a token gets the same result alone, batched or in a verify. */
    const int32_t group = m->d.nq / m->d.nkv,
                  per = group < ATTN_TILE_ROWS ? ATTN_TILE_ROWS / group : 1;
    if (!(tile0 = malloc(((size_t)T + 1) * sizeof *tile0))) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "attention: out of memory");
        goto done;
    }
    int32_t n_tiles = 0;
    for (int32_t t = 0; t < T; n_tiles++) {
        tile0[n_tiles] = t;
        const int32_t first = t;
        while (++t < T && t - first < per && p->seq[t] == p->seq[first]) {}
    }
    tile0[n_tiles] = T;
    attn_job j = {m, ly, p, qg, kk, vv, o, tmp, p->n_groups == T, tile0};
    if (!j.fused) run_kv_heads(m, prep_task, &j, T, NULL);
    run_kv_heads(m, tile_task, &j, n_tiles, tile_bytes);
    epyq_prof_add(m, EPYQ_PROF_ATTN_CORE, &t0);
    if ((st = epyq_rlin_act(m, o, T, m->d.nq * hd, &oact, &obuf, err)) != EPYQ_OK) goto done;
    epyq_rlin_run(m, &a->o, &oact, out, m->d.H);
    epyq_prof_add(m, EPYQ_PROF_ATTN_OUT, &t0);
done:
    for (int32_t w = 0; tmp && w < epyq_numa_workers(m); w++) free(tmp[w]);
    free(tmp), free(tile0), free(abuf), free(obuf), free(qg), free(kk), free(vv), free(o);
    return st;
}
