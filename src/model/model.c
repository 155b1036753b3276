/* src/model/model.c — loading: bind the checkpoint, turn every weight into runtime form. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/log.h"
#include "core/util.h"
#include "load/tensor_f32.h"
#include "model/model_impl.h"

#define TRY(x)                          \
    do {                                \
        epyq_status st_ = (x);          \
        if (st_ != EPYQ_OK) return st_; \
    } while (0)

static epyq_status load_vec(float **dst, const epyq_tensor *t, size_t n, epyq_err *err) {
    if (!t) return epyq_err_set(err, EPYQ_E_INTERNAL, "model: unbound vector tensor");
    if (epyq_tensor_numel(t) != n)
        return epyq_err_set(err, EPYQ_E_SHAPE, "%s: %zu elements where %zu were expected", t->name,
                            epyq_tensor_numel(t), n);
    *dst = epyq_model_alloc(n, sizeof(float));
    if (!*dst) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    return epyq_tensor_read_f32(t, 0, n, *dst, err);
}

/* The depthwise conv kernel [conv_dim][Kc] as on disk, transposed tap-major [Kc][conv_dim]: the
 * conv_silu kernel reads one tap for a run of channels at a time. */
static epyq_status load_conv(float **dst, const epyq_tensor *t, int32_t cd, int32_t kc,
                             epyq_err *err) {
    float *raw = NULL;
    epyq_status st = load_vec(&raw, t, (size_t)cd * kc, err);
    if (st == EPYQ_OK && !(*dst = epyq_model_alloc((size_t)cd * kc, sizeof(float))))
        st = epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", t->name);
    for (int32_t c = 0; st == EPYQ_OK && c < cd; c++)
        for (int32_t r = 0; r < kc; r++) (*dst)[(size_t)r * cd + c] = raw[(size_t)c * kc + r];
    free(raw);
    return st;
}

static epyq_status load_expert(epyq_model *m, epyq_moe_rw *mr, const epyq_moe_w *mw, int32_t e,
                               epyq_err *err) {
    /* NUMA mode: int4 experts past 0 are packed on their nodes (numa_moe.c) */
    if (e > 0 && m->numa_experts && mr->gate[0].q4) return EPYQ_OK;
    if (e > 0 && !epyq_model_ep_owns(m, e)) return EPYQ_OK; /* another rank's (model.h: epyq_ep) */
    if (m->rq_experts != EPYQ_REQUANT_NONE && mw->gate[e].kind != EPYQ_LIN_Q4) {
        TRY(epyq_rlin_requant(m, &mr->gate[e], &mw->gate[e], m->rq_experts, m->rq_gs, err));
        TRY(epyq_rlin_requant(m, &mr->up[e], &mw->up[e], m->rq_experts, m->rq_gs, err));
        TRY(epyq_rlin_requant(m, &mr->down[e], &mw->down[e], m->rq_experts, m->rq_gs, err));
    } else {
        TRY(epyq_rlin_load_expert(m, &mr->gate[e], &mr->up[e], &mr->down[e], &mw->gate[e], &mw->up[e],
                                  &mw->down[e], err));
    }
    /* the fused expert kernel wants gate/up/down of one kind and one intermediate size */
    const epyq_rlin *g = &mr->gate[e], *u = &mr->up[e], *d = &mr->down[e];
    if (g->q4 != u->q4 || g->q4 != d->q4 || g->n != u->n || d->k != g->n || g->q4 != mr->gate[0].q4)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                            "%s: experts mix int4 and 16-bit or disagree on the intermediate size",
                            mw->gate[e].module);
    return EPYQ_OK;
}

/* Packing 256 experts per layer dominates load time; experts are independent. Each task
 * reports into its own error slot. Safe in parallel once an int4 expert 0 has set m->gs:
 * epyq_rlin_load then only reads it. */
typedef struct {
    epyq_model *m;
    epyq_moe_rw *mr;
    const epyq_moe_w *mw;
    epyq_err *errs; /* [E] */
} expert_job;

static void expert_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    expert_job *j = ctx;
    load_expert(j->m, j->mr, j->mw, task + 1, &j->errs[task + 1]);
}

/* A dense projection: requantised when --requant dense= asks and it is stored 16-bit. */
static epyq_status load_dense(epyq_model *m, epyq_rlin *dst, const epyq_linear *src, epyq_err *err) {
    if (m->rq_dense != EPYQ_REQUANT_NONE && src->kind != EPYQ_LIN_Q4)
        return epyq_rlin_requant(m, dst, src, m->rq_dense, m->rq_gs, err);
    return epyq_rlin_load(m, dst, src, false, err);
}

static epyq_status load_layer(epyq_model *m, epyq_layer_rw *ly, const epyq_layer_w *lw,
                              epyq_err *err) {
    ly->full = lw->full_attn;
    TRY(load_vec(&ly->in_norm, lw->input_norm, (size_t)m->d.H, err));
    TRY(load_vec(&ly->post_norm, lw->post_norm, (size_t)m->d.H, err));
    if (ly->full) {
        const epyq_attn_w *a = &lw->attn;
        TRY(load_dense(m, &ly->at.q, &a->q_proj, err));
        TRY(load_dense(m, &ly->at.k, &a->k_proj, err));
        TRY(load_dense(m, &ly->at.v, &a->v_proj, err));
        TRY(load_dense(m, &ly->at.o, &a->o_proj, err));
        TRY(load_vec(&ly->at.q_norm, a->q_norm, (size_t)m->d.hd, err));
        TRY(load_vec(&ly->at.k_norm, a->k_norm, (size_t)m->d.hd, err));
    } else {
        const epyq_gdn_w *g = &lw->gdn;
        TRY(load_dense(m, &ly->g.qkv, &g->in_proj_qkv, err));
        TRY(load_dense(m, &ly->g.z, &g->in_proj_z, err));
        /* b and a feed exp/softplus gates: keep their inputs fp32 when stored 16-bit */
        TRY(epyq_rlin_load(m, &ly->g.b, &g->in_proj_b, true, err));
        TRY(epyq_rlin_load(m, &ly->g.a, &g->in_proj_a, true, err));
        TRY(load_dense(m, &ly->g.out, &g->out_proj, err));
        TRY(load_conv(&ly->g.conv, g->conv1d, m->d.conv_dim, m->d.Kc, err));
        TRY(load_vec(&ly->g.dt_bias, g->dt_bias, (size_t)m->d.Hv, err));
        TRY(load_vec(&ly->g.neg_exp_A, g->A_log, (size_t)m->d.Hv, err));
        for (int32_t h = 0; h < m->d.Hv; h++) ly->g.neg_exp_A[h] = -expf(ly->g.neg_exp_A[h]);
        TRY(load_vec(&ly->g.norm, g->norm, (size_t)m->d.Dv, err));
    }
    const epyq_moe_w *mw = &lw->moe;
    TRY(epyq_rlin_load(m, &ly->m.router, &mw->router, true, err));
    ly->m.gate = calloc((size_t)m->d.E, sizeof(epyq_rlin));
    ly->m.up = calloc((size_t)m->d.E, sizeof(epyq_rlin));
    ly->m.down = calloc((size_t)m->d.E, sizeof(epyq_rlin));
    if (!ly->m.gate || !ly->m.up || !ly->m.down)
        return epyq_err_set(err, EPYQ_E_NOMEM, "experts: out of memory");
    /* expert 0 first (it fixes the model's int4 group size), then the rest on the pool */
    TRY(load_expert(m, &ly->m, mw, 0, err));
    expert_job j = {m, &ly->m, mw, calloc((size_t)m->d.E, sizeof(epyq_err))};
    if (!j.errs) return epyq_err_set(err, EPYQ_E_NOMEM, "experts: out of memory");
    if (ly->m.gate[0].q4) epyq_pool_run(m->pool, expert_task, &j, m->d.E - 1);
    else /* a 16-bit expert 0 leaves gs unset: an int4 expert would set it, so stay serial */
        for (int32_t e = 1; e < m->d.E; e++) expert_task(&j, e - 1, 0);
    for (int32_t e = 1; e < m->d.E; e++)
        if (j.errs[e].code != EPYQ_OK) {
            *err = j.errs[e]; /* the lowest failing expert, whatever the thread timing */
            free(j.errs);
            return err->code;
        }
    free(j.errs);
    if (m->rq_dense != EPYQ_REQUANT_NONE && mw->sh_gate.kind != EPYQ_LIN_Q4) {
        TRY(load_dense(m, &ly->m.sh_gate, &mw->sh_gate, err));
        TRY(load_dense(m, &ly->m.sh_up, &mw->sh_up, err));
        TRY(load_dense(m, &ly->m.sh_down, &mw->sh_down, err));
    } else {
        TRY(epyq_rlin_load_expert(m, &ly->m.sh_gate, &ly->m.sh_up, &ly->m.sh_down, &mw->sh_gate, &mw->sh_up,
                                  &mw->sh_down, err));
    }
    TRY(epyq_rlin_load(m, &ly->m.sh_expert_gate, &mw->sh_expert_gate, true, err));
    const epyq_rlin *g = &ly->m.sh_gate, *u = &ly->m.sh_up, *d = &ly->m.sh_down;
    if (g->q4 != u->q4 || g->q4 != d->q4)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "%s: shared expert mixes int4 and 16-bit",
                            mw->sh_gate.module);
    return EPYQ_OK;
}

static void layer_free(const epyq_model *m, epyq_layer_rw *ly) {
    free(ly->in_norm), free(ly->post_norm);
    epyq_rlin_free(m, &ly->at.q), epyq_rlin_free(m, &ly->at.k), epyq_rlin_free(m, &ly->at.v);
    epyq_rlin_free(m, &ly->at.o);
    free(ly->at.q_norm), free(ly->at.k_norm);
    epyq_rlin_free(m, &ly->g.qkv), epyq_rlin_free(m, &ly->g.z), epyq_rlin_free(m, &ly->g.b);
    epyq_rlin_free(m, &ly->g.a), epyq_rlin_free(m, &ly->g.out);
    free(ly->g.conv), free(ly->g.neg_exp_A), free(ly->g.dt_bias), free(ly->g.norm);
    epyq_rlin_free(m, &ly->m.router);
    for (int32_t e = 0; e < m->d.E; e++) {
        if (ly->m.gate) epyq_rlin_free(m, &ly->m.gate[e]);
        if (ly->m.up) epyq_rlin_free(m, &ly->m.up[e]);
        if (ly->m.down) epyq_rlin_free(m, &ly->m.down[e]);
    }
    free(ly->m.gate), free(ly->m.up), free(ly->m.down);
    epyq_rlin_free(m, &ly->m.sh_gate), epyq_rlin_free(m, &ly->m.sh_up),
        epyq_rlin_free(m, &ly->m.sh_down);
    epyq_rlin_free(m, &ly->m.sh_expert_gate);
}

void epyq_model_free(epyq_model *m) {
    if (!m) return;
    epyq_model_numa_free(m);
    if (m->layers)
        for (int32_t l = 0; l < m->d.L; l++) layer_free(m, &m->layers[l]);
    layer_free(m, &m->mtp);
    free(m->layers);
    free(m->final_norm), free(m->inv_freq);
    free(m->perm_x), free(m->perm_act), free(m->prof), free(m->prof_held);
    epyq_rlin_free(m, &m->lm_head), epyq_rlin_free(m, &m->mtp_fc),
        epyq_rlin_free(m, &m->draft_head);
    free(m->mtp_norm_e), free(m->mtp_norm_h), free(m->mtp_norm);
    if (m->pool) epyq_pool_free(m->pool);
    epyq_wmem_free(m->wmem);
    epyq_weights_free(m->w);
    free(m->embed_mem);
    free(m);
#ifdef __GLIBC__
    /* Hand the freed weights back at once: packed linears under glibc's grown mmap threshold
     * sit in the heap, where free() keeps pages. Without this, `epyq bench -t 1,2` on the full
     * 35b model (two loads in one process) was OOM-killed on this 24 GiB VM at 24.3 GB anon
     * RSS during the second load; with it both loads run (4-layer model, four loads: peak RSS
     * 5.77 -> 5.52 GB, the same as one load). */
    malloc_trim(0);
#endif
}

static epyq_status check_dims(const epyq_model *m, epyq_err *err) {
    if (m->d.Hv % m->d.Hk || m->d.nq % m->d.nkv || m->d.rd % 2 || m->d.rd > m->d.hd ||
        m->d.topk > m->d.E || m->d.topk > EPYQ_MAX_TOPK || m->d.Kc < 1 ||
        m->d.Kc > EPYQ_MAX_CONV_TAPS)
        return epyq_err_set(
            err, EPYQ_E_SHAPE,
            "model: unsupported shape (value heads %d / key heads %d, q heads %d / kv"
            " heads %d, rotary %d of %d, top-%d of %d experts, conv %d)",
            m->d.Hv, m->d.Hk, m->d.nq, m->d.nkv, m->d.rd, m->d.hd, m->d.topk, m->d.E, m->d.Kc);
    return EPYQ_OK;
}

static epyq_status model_build(epyq_model *m, const epyq_model_opts *o, epyq_err *err) {
    const epyq_config *c = m->c;
    const epyq_weights *w = m->w;
    m->d = epyq_config_dims(c);
    m->eps = (float)c->rms_norm_eps;
    TRY(check_dims(m, err));
    if (o->requant_lm_head != EPYQ_REQUANT_NONE || o->requant_dense != EPYQ_REQUANT_NONE) {
        m->rq_lm_head = o->requant_lm_head, m->rq_dense = o->requant_dense;
        m->rq_gs = epyq_requant_group(w);
        if (m->rq_gs <= 0)
            return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                                "--requant: no group size of 128, 64 or 32 "
                                "divides every input width of this model (hidden %d)",
                                m->d.H);
        /* requantised dense linears read the activation prepared for the int4 linears */
        if (m->rq_dense != EPYQ_REQUANT_NONE && !m->gs) m->gs = m->rq_gs;
    }

    m->inv_freq = epyq_model_alloc((size_t)m->d.rd / 2 + 1, sizeof(double));
    m->layers = calloc((size_t)m->d.L, sizeof(epyq_layer_rw));
    if (!m->inv_freq || !m->layers) return epyq_err_set(err, EPYQ_E_NOMEM, "model: out of memory");
    /* angles are formed in double at run time; only the frequencies are stored */
    epyq_config_rope_freq(c, m->inv_freq, &m->rope_attn);
    for (int32_t l = 0; l < m->d.L; l++) {
        epyq_layer_rw *ly = &m->layers[l];
        ly->slot = w->layers[l].full_attn ? m->n_attn++ : m->n_gdn++;
        TRY(load_layer(m, ly, &w->layers[l], err));
        if (o->progress) o->progress(o->progress_ctx, l + 1, m->d.L + 1);
    }
    TRY(load_vec(&m->final_norm, w->final_norm, (size_t)m->d.H, err));
    if (m->rq_lm_head != EPYQ_REQUANT_NONE && w->lm_head.kind != EPYQ_LIN_Q4)
        TRY(epyq_rlin_requant(m, &m->lm_head, &w->lm_head, m->rq_lm_head, m->rq_gs, err));
    else
        TRY(epyq_rlin_load(m, &m->lm_head, &w->lm_head, true, err));
    if (m->has_mtp && o->draft_head == EPYQ_REQUANT_NONE && o->draft_vocab > 0)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "draft vocabulary %d: expected a draft head (int4 or int8) to cut, "
                            "found drafts reading the exact lm_head",
                            (int)o->draft_vocab);
    if (m->has_mtp && o->draft_head != EPYQ_REQUANT_NONE) {
        /* drafts need only the argmax: a cheap copy of the head, the exact one verifies */
        if (!m->rq_gs) m->rq_gs = epyq_requant_group(w);
        epyq_linear head = w->lm_head;
        if (o->draft_vocab < 0 || o->draft_vocab > head.n_out)
            return epyq_err_set(err, EPYQ_E_ARG,
                                "draft vocabulary: expected 1..%lld token ids, got %d",
                                (long long)head.n_out, (int)o->draft_vocab);
        if (o->draft_vocab > 0 && o->draft_vocab < head.n_out && head.kind == EPYQ_LIN_Q4)
            return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                                "%s: a draft vocabulary cut needs a 16-bit lm_head, found int4",
                                head.module);
        const int64_t cut = ((int64_t)o->draft_vocab + 15) / 16 * 16; /* whole 16-row tiles */
        if (o->draft_vocab > 0 && cut < head.n_out)
            head.n_out = cut; /* its first rows: ids [0, cut) */
        if (head.kind == EPYQ_LIN_Q4) TRY(epyq_rlin_load(m, &m->draft_head, &head, false, err));
        else if (m->rq_gs > 0)
            TRY(epyq_rlin_requant(m, &m->draft_head, &head, o->draft_head, m->rq_gs, err));
    }
    /* Drafting through a draft head: the MTP layer is only ever used for drafts then, so its
     * 16-bit linears (the original releases keep it BF16: 1.6 GB, ~130 MB read per draft row)
     * become int4 too; verification stays exact. Not with NUMA-placed experts (numa_moe.c
     * packs routed experts from the checkpoint as they are). */
    bool mtp_rq = m->has_mtp && m->draft_head.n && m->rq_gs > 0 && !m->numa_experts;
    epyq_requant trunk_dense = m->rq_dense;
    if (mtp_rq) {
        m->rq_dense = m->rq_experts = EPYQ_REQUANT_INT4;
        if (!m->gs) m->gs = m->rq_gs;
    }
    if (m->has_mtp) {
        if (mtp_rq && w->mtp.fc.kind != EPYQ_LIN_Q4)
            TRY(epyq_rlin_requant(m, &m->mtp_fc, &w->mtp.fc, EPYQ_REQUANT_INT4, m->rq_gs, err));
        else
            TRY(epyq_rlin_load(m, &m->mtp_fc, &w->mtp.fc, false, err));
        TRY(load_vec(&m->mtp_norm_e, w->mtp.pre_fc_norm_embedding, (size_t)m->d.H, err));
        TRY(load_vec(&m->mtp_norm_h, w->mtp.pre_fc_norm_hidden, (size_t)m->d.H, err));
        TRY(load_vec(&m->mtp_norm, w->mtp.norm, (size_t)m->d.H, err));
        if (!w->mtp.layer.full_attn)
            return epyq_err_set(err, EPYQ_E_SHAPE, "mtp.layers.0: expected a full-attention layer");
        epyq_status st = load_layer(m, &m->mtp, &w->mtp.layer, err);
        m->rq_dense = trunk_dense, m->rq_experts = EPYQ_REQUANT_NONE;
        TRY(st);
        m->mtp.slot = m->n_attn;
    }
    if (o->progress) o->progress(o->progress_ctx, m->d.L + 1, m->d.L + 1);
    return EPYQ_OK;
}

/* A load that cannot fit is refused before anything is packed, with the numbers: the runtime
 * keeps the int4 linears repacked and the 16-bit tensors copied (the mapping itself is page
 * cache, which MemAvailable already counts as reclaimable). */
static epyq_status check_fits(const epyq_weights *w, const char *dir, epyq_err *err) {
    uint64_t avail;
    char src[64];
    if (!epyq_mem_available(&avail, src, sizeof src)) return EPYQ_OK;
    epyq_weights_stats s;
    epyq_weights_stats_get(w, &s);
    if (s.resident_bytes <= avail) return EPYQ_OK;
    uint64_t q4 = 0, dense = 0;
    for (int k = 0; k < EPYQ_MK_COUNT; k++) q4 += s.kind[k].q4_bytes, dense += s.kind[k].dense_bytes;
    char b[5][32];
    return epyq_err_set(err, EPYQ_E_NOMEM,
                        "%s: the model needs %s of memory (weights as the runtime holds them; on disk %s int4, "
                        "%s 16-bit linears, %s other tensors) but %s is available (%s); nothing was loaded",
                        dir, epyq_numa_size(s.resident_bytes, b[0], 32), epyq_numa_size(q4, b[1], 32),
                        epyq_numa_size(dense, b[2], 32), epyq_numa_size(s.other_bytes, b[3], 32),
                        epyq_numa_size(avail, b[4], 32), src);
}

/* One piece of the embedding table's copy (embed_hold). */
typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    size_t n, piece;
} embed_copy_job;

static void embed_copy_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const embed_copy_job *j = ctx;
    const size_t o = (size_t)task * j->piece, n = j->n - o < j->piece ? j->n - o : j->piece;
    memcpy(j->dst + o, j->src + o, n);
}

/* Memory an in-memory copy of the embedding table must leave free after the load. */
#define EPYQ_EMBED_HEADROOM (2ull << 30)

/* The embedding rows a forward reads come from a copy in memory when it fits: read from the
 * mapping, each new token's row is a page the kernel may have reclaimed (these VMs do so
 * proactively), i.e. a disk read in the middle of a decode step — 3.0 ms of a 29 ms token on
 * the 8-layer model, 2.7 ms on 40 layers, against microseconds from memory; the peers hold
 * theirs in memory too (llama.cpp -mmp 0, ik_llama.cpp -rtr). EPYQ_EMBED=mapped keeps the
 * mapping (1 GB less resident on the full model), =resident copies whatever the headroom. */
static epyq_status embed_hold(epyq_model *m, epyq_err *err) {
    if (m->w->embed) m->embed = *m->w->embed;
    const char *e = getenv("EPYQ_EMBED");
    const bool force = e && !strcmp(e, "resident"), never = e && !strcmp(e, "mapped");
    if (e && *e && !force && !never)
        return epyq_err_set(err, EPYQ_E_ARG, "EPYQ_EMBED: expected mapped or resident, got '%s'",
                            e);
    if (never || !m->w->embed || !m->w->embed->data) return EPYQ_OK;
    const size_t nb = m->w->embed->nbytes;
    uint64_t avail = 0;
    char src[64];
    if (!force && epyq_mem_available(&avail, src, sizeof src) && avail < nb + EPYQ_EMBED_HEADROOM) {
        char b[3][32];
        epyq_log_info(
            "embedding table (%s) read from the mapping: %s available (%s), the copy needs "
            "%s more to spare",
            epyq_numa_size(nb, b[0], 32), epyq_numa_size(avail, b[1], 32), src,
            epyq_numa_size(EPYQ_EMBED_HEADROOM, b[2], 32));
        return EPYQ_OK;
    }
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, nb ? nb : 1) != 0) {
        if (force)
            return epyq_err_set(err, EPYQ_E_NOMEM, "EPYQ_EMBED=resident: %zu bytes: out of memory",
                                nb);
        return EPYQ_OK;
    }
    madvise(p, nb, MADV_HUGEPAGE); /* a hint: 1 GB of random rows, one TLB entry per 2 MiB */
    /* 8 MiB pieces over the pool: the rows come through page faults on the mapping, and two
     * faulting threads read the 1 GB of the full model in 1.6-2.0 s where one took 2.4-2.9 */
    embed_copy_job j = {p, m->w->embed->data, nb, 8u << 20};
    epyq_pool_run(m->pool, embed_copy_task, &j, (int32_t)((nb + j.piece - 1) / j.piece));
    m->embed.data = m->embed_mem = p;
    return EPYQ_OK;
}

/* The token count from which a sequence's DeltaNet runs chunked when the caller left
 * gdn_chunk_min at 0: EPYQ_GDN_CHUNK (a whole number, <= 0 = never) for tuning runs, else
 * EPYQ_GDN_CHUNK_DEFAULT. */
static epyq_status gdn_chunk_default(int32_t *out, epyq_err *err) {
    const char *e = getenv("EPYQ_GDN_CHUNK");
    *out = EPYQ_GDN_CHUNK_DEFAULT;
    if (!e || !*e) return EPYQ_OK;
    char *end = NULL;
    errno = 0;
    const long v = strtol(e, &end, 10);
    if (errno || *end || v < INT32_MIN || v > INT32_MAX)
        return epyq_err_set(
            err, EPYQ_E_ARG,
            "EPYQ_GDN_CHUNK: expected a whole number of tokens (<= 0 = never), got '%s'", e);
    *out = v > 0 ? (int32_t)v : -1;
    return EPYQ_OK;
}

epyq_status epyq_model_load(epyq_model **out, const char *dir, const epyq_model_opts *opts,
                            epyq_err *err) {
    *out = NULL;
    epyq_model_opts o = opts ? *opts : (epyq_model_opts){0};
    if (!o.gdn_chunk_min) {
        const epyq_status cst = gdn_chunk_default(&o.gdn_chunk_min, err);
        if (cst != EPYQ_OK) return cst;
    }
    epyq_model *m = calloc(1, sizeof *m);
    if (!m) return epyq_err_set(err, EPYQ_E_NOMEM, "model: out of memory");
    if (o.path != EPYQ_PATH_A16 && o.path != EPYQ_PATH_A8 && o.path != EPYQ_PATH_A8_ALL) {
        free(m);
        return epyq_err_set(err, EPYQ_E_ARG, "model: numeric path %d: expected a16, a8 or a8all",
                            (int)o.path);
    }
    m->path = o.path;
    m->f32_act = o.f32_act;
    m->gdn_chunk_min = o.gdn_chunk_min;
    m->moe_split = true;
    m->ep = o.ep && o.ep->size > 1 ? o.ep : NULL;
    m->kt = o.kernels ? o.kernels : epyq_kern();
    epyq_bind_opts bo = {.skip_mtp = o.skip_mtp};
    epyq_status st = epyq_weights_bind(&m->w, dir, &bo, err);
    if (st == EPYQ_OK) st = check_fits(m->w, dir, err);
    if (st == EPYQ_OK) {
        m->c = &m->w->cfg;
        m->has_mtp = m->w->has_mtp && !o.skip_mtp;
        epyq_pool_opts po = {.n_threads = o.n_threads, .cpus = NULL, .node = -1};
        st = epyq_pool_create(&m->pool, &po, err);
    }
    if (st == EPYQ_OK) {
        m->n_threads = epyq_pool_size(m->pool);
        m->numa_experts = o.numa && o.numa->mode != EPYQ_NUMA_OFF;
        /* NUMA mode moves every packed linear into its node's buffers and frees the heap copy */
        if (!m->numa_experts) st = epyq_wmem_create(&m->wmem, err);
    }
    if (st == EPYQ_OK) {
        st =
            m->ep && m->numa_experts
                ? epyq_err_set(
                      err, EPYQ_E_ARG,
                      "expert parallelism over ranks: expected --numa off, got NUMA-placed experts")
                : model_build(m, &o, err);
    }
    if (st == EPYQ_OK && m->numa_experts) st = epyq_model_numa_load(m, o.numa, o.moe_slice, err);
    if (st == EPYQ_OK) st = embed_hold(m, err);
    if (st != EPYQ_OK) {
        epyq_model_free(m);
        return st;
    }
    epyq_log_debug("model: %d layers (%d attention), %s int4 group %d, %d threads", m->d.L,
                   m->n_attn, epyq_qformat_name(m->c->qformat), m->gs, m->n_threads);
    *out = m;
    return EPYQ_OK;
}

const epyq_config *epyq_model_config(const epyq_model *m) { return m->c; }
bool epyq_model_has_mtp(const epyq_model *m) { return m->has_mtp; }
bool epyq_model_embed_resident(const epyq_model *m) { return m->embed_mem != NULL; }
int32_t epyq_model_threads(const epyq_model *m) { return m->n_threads; }
void epyq_model_set_path(epyq_model *m, epyq_numpath path) { m->path = path; }
void epyq_model_set_gdn_chunk_min(epyq_model *m, int32_t min_tokens) {
    m->gdn_chunk_min = min_tokens;
}
void epyq_model_set_moe_split(epyq_model *m, bool on) { m->moe_split = on; }
epyq_requant epyq_model_draft_head(const epyq_model *m) {
    return m->draft_head.n ? m->draft_head.requant : EPYQ_REQUANT_NONE;
}
int32_t epyq_model_draft_vocab(const epyq_model *m) {
    return m->draft_head.n ? m->draft_head.n : m->d.V;
}

int epyq_model_path_parse(const char *s) {
    if (!strcmp(s, "a8all")) return EPYQ_PATH_A8_ALL;
    return epyq_numpath_parse(s);
}

const char *epyq_model_path_name(epyq_numpath path) {
    return path == EPYQ_PATH_A8_ALL ? "a8all" : path == EPYQ_PATH_A8 ? "a8" : "a16";
}
void epyq_model_requant(const epyq_model *m, epyq_requant *lm_head, epyq_requant *dense) {
    *lm_head = m->lm_head.requant, *dense = m->rq_dense;
}

/* Every weight a forward call reads whatever the routing: projections, routers, shared
 * experts (not the routed experts, not the lm_head). */
static uint64_t fixed_bytes(const epyq_model *m) {
    uint64_t b = 0;
    for (int32_t l = 0; l < m->d.L; l++) {
        const epyq_layer_rw *ly = &m->layers[l];
        if (ly->full)
            b += epyq_rlin_bytes(&ly->at.q) + epyq_rlin_bytes(&ly->at.k) + epyq_rlin_bytes(&ly->at.v) +
                 epyq_rlin_bytes(&ly->at.o);
        else
            b += epyq_rlin_bytes(&ly->g.qkv) + epyq_rlin_bytes(&ly->g.z) + epyq_rlin_bytes(&ly->g.b) +
                 epyq_rlin_bytes(&ly->g.a) + epyq_rlin_bytes(&ly->g.out);
        const epyq_moe_rw *mw = &ly->m;
        b += epyq_rlin_bytes(&mw->router) + epyq_rlin_bytes(&mw->sh_gate) + epyq_rlin_bytes(&mw->sh_up) +
             epyq_rlin_bytes(&mw->sh_down) + epyq_rlin_bytes(&mw->sh_expert_gate);
    }
    return b;
}

uint64_t epyq_model_active_bytes(const epyq_model *m) {
    uint64_t b = epyq_rlin_bytes(&m->lm_head) + fixed_bytes(m);
    for (int32_t l = 0; l < m->d.L; l++) {
        const epyq_moe_rw *mw = &m->layers[l].m;
        /* top-k of E experts, taking expert 0 as the typical size */
        b += (uint64_t)m->d.topk * (epyq_rlin_bytes(&mw->gate[0]) + epyq_rlin_bytes(&mw->up[0]) +
                                    epyq_rlin_bytes(&mw->down[0]));
    }
    return b;
}

uint64_t epyq_model_last_bytes(const epyq_model *m) { return fixed_bytes(m) + m->fwd_bytes; }
