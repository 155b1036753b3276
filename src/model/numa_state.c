/* src/model/numa_state.c — the per-head work of attention and DeltaNet, and a sequence's
 * per-head buffers, on the nodes that own the heads.
 *
 * Why: besides the weights, a decoded token reads and writes every DeltaNet value head's
 * Dk x Dv state (64 KiB a head for the real model, 2 MiB a layer), every key head's conv
 * history, and every attention kv head's K and V rows up to its position (512 bytes a row and
 * head at bf16: 16 MiB per layer and head at 32k tokens). In NUMA mode each of these heads
 * belongs to one plan group: value heads are shared out in proportion to threads (like the
 * dense rows), a key head goes with its first value head, a kv head with the group whose share
 * of the threads its index falls in. The head's blocks of every layer are bound to that group's
 * node before anything touches them (seq.c lays them out in whole pages), and the head's tasks
 * run on that group's pool: the delta rule and the gated norm (value heads); the causal conv,
 * the q/k L2 norms and the gates (key heads); the q/k norms, RoPE, the cache store, the scores,
 * softmax, weighted V and output gate of the kv head's query heads (kv heads). The tasks are
 * the single-pool path's tasks, so the bits are too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/numa_impl.h"
#include "model/numa_moe.h"

epyq_status epyq_numa_heads_init(epyq_model *m, epyq_err *err) {
    epyq_model_numa *n = m->numa;
    const epyq_numa_plan *plan = n->setup->plan;
    n->head_group = calloc((size_t)m->d.Hv + 1, sizeof *n->head_group);
    n->key_group = calloc((size_t)m->d.Hk + 1, sizeof *n->key_group);
    n->kv_group = calloc((size_t)m->d.nkv + 1, sizeof *n->kv_group);
    n->head_jobs = calloc((size_t)n->n_groups, sizeof *n->head_jobs);
    n->sreads = calloc((size_t)n->n_groups, sizeof *n->sreads);
    if (!n->head_group || !n->key_group || !n->kv_group || !n->head_jobs || !n->sreads)
        return epyq_err_set(err, EPYQ_E_NOMEM, "NUMA heads: out of memory");
    int64_t cum = 0, tot = plan->n_threads > 0 ? plan->n_threads : 1;
    int32_t h = 0;
    for (int32_t g = 0; g < n->n_groups; g++) {
        cum += plan->groups[g].n_threads;
        int32_t end = g == n->n_groups - 1 ? m->d.Hv : (int32_t)((int64_t)m->d.Hv * cum / tot);
        for (; h < end; h++) n->head_group[h] = g;
    }
    /* a key head's conv channels (its q, k and its value heads' v) go with its first value
     * head: with even shares a key head's value heads are all on one group anyway */
    for (int32_t kh = 0; kh < m->d.Hk; kh++)
        n->key_group[kh] = n->head_group[kh * (m->d.Hv / m->d.Hk)];
    /* kv heads are few (2 in the real model): head i goes to the group holding thread
     * i * threads / nkv, so that with more groups than heads they spread (0 and 2 of 4) */
    for (int32_t i = 0; i < m->d.nkv; i++) {
        int64_t at = (int64_t)i * tot / m->d.nkv, c = 0;
        int32_t g = 0;
        while (g < n->n_groups - 1 && at >= c + plan->groups[g].n_threads)
            c += plan->groups[g++].n_threads;
        n->kv_group[i] = g;
    }
    /* a worker index unique over all pools: each group's workers after the previous ones' */
    n->head_workers = 0;
    for (int32_t g = 0; g < n->n_groups; g++) {
        n->head_jobs[g].worker0 = n->head_workers;
        n->head_workers += epyq_pool_size(n->setup->rt->pools[g]);
    }
    return EPYQ_OK;
}

void epyq_numa_heads_free(epyq_model *m) {
    epyq_model_numa *n = m->numa;
    free(n->head_group), free(n->key_group), free(n->kv_group), free(n->head_jobs), free(n->sreads);
    n->head_group = n->key_group = n->kv_group = NULL;
    n->head_jobs = NULL, n->sreads = NULL;
}

int32_t epyq_numa_workers(const epyq_model *m) {
    const epyq_model_numa *n = m->numa;
    return n && n->head_jobs && n->head_workers > m->n_threads ? n->head_workers : m->n_threads;
}

/* ---- placement */

/* One kind of per-head block of a sequence: n blocks of `bytes` from base, block b belonging
 * to head b % heads. */
typedef struct {
    const char *what;
    epyq_seq_numa_kind kind;
    uint8_t *base;
    size_t bytes;
    size_t n;
    int32_t heads;
    const int32_t *owner; /* [heads] plan group of each head */
} blockset;

enum { MAX_SETS = 6 };

/* Appends a block set unless its buffer is not mapped (no such layers, no snapshots yet). */
static void add_set(blockset *out, int32_t *c, const char *what, epyq_seq_numa_kind kind,
                    void *base, size_t bytes, size_t n, int32_t heads, const int32_t *owner) {
    if (base) out[(*c)++] = (blockset){what, kind, base, bytes, n, heads, owner};
}

/* The sequence's block sets; spec: the speculative snapshots only, else the others. */
static int32_t blocksets(const epyq_model *m, const epyq_seq *s, bool spec, blockset *out) {
    const epyq_model_numa *n = m->numa;
    const size_t state = (size_t)m->d.Dk * m->d.Dv * sizeof(float);
    const size_t conv = epyq_seq_conv_blk(m) * sizeof(float);
    const size_t gdn_v = (size_t)m->n_gdn * m->d.Hv, gdn_k = (size_t)m->n_gdn * m->d.Hk;
    const size_t planes = (size_t)s->n_kv_layers * m->d.nkv;
    int32_t c = 0;
    if (spec) {
        add_set(out, &c, "speculative DeltaNet state", EPYQ_SEQ_NUMA_SPEC, s->spec_S, state,
                (size_t)s->spec_cap * gdn_v, m->d.Hv, n->head_group);
        add_set(out, &c, "speculative conv history", EPYQ_SEQ_NUMA_SPEC, s->spec_conv, conv,
                (size_t)s->spec_cap * gdn_k, m->d.Hk, n->key_group);
        return c;
    }
    add_set(out, &c, "DeltaNet state", EPYQ_SEQ_NUMA_STATE, s->S, state, gdn_v, m->d.Hv,
            n->head_group);
    add_set(out, &c, "conv history", EPYQ_SEQ_NUMA_CONV, s->conv, conv, gdn_k, m->d.Hk,
            n->key_group);
    add_set(out, &c, "K cache", EPYQ_SEQ_NUMA_KV, s->k, s->kv_plane, planes, m->d.nkv, n->kv_group);
    add_set(out, &c, "V cache", EPYQ_SEQ_NUMA_KV, s->v, s->kv_plane, planes, m->d.nkv, n->kv_group);
    return c;
}

/* Blocks of whole pages only: binding part of a page would move a neighbour's block with it. */
static bool paged(const blockset *b) {
    return b->bytes && b->bytes % 4096 == 0 && (uintptr_t)b->base % 4096 == 0;
}

/* Block i's owner node (plan group and OS node) and the run of blocks from i on that share it:
 * returns the run's end. */
static size_t run_of(const blockset *b, size_t i, int32_t *group) {
    *group = b->owner[i % (size_t)b->heads];
    size_t e = i + 1;
    while (e < b->n && b->owner[e % (size_t)b->heads] == *group) e++;
    return e;
}

/* Every run of blocks of b that share an owner, in order: fn(ctx, b, run start, run bytes, OS
 * node, label naming the blocks and node). Stops at the first status fn returns that is not OK. */
typedef epyq_status (*run_fn)(void *ctx, const blockset *b, uint8_t *at, size_t bytes,
                              int32_t os_index, const char *what, epyq_err *err);

static epyq_status walk_runs(const epyq_model *m, const blockset *b, run_fn fn, void *ctx,
                             epyq_err *err) {
    for (size_t i = 0; i < b->n;) {
        int32_t g;
        size_t e = run_of(b, i, &g);
        const epyq_numa_group *gr = &m->numa->setup->plan->groups[g];
        char what[96];
        snprintf(what, sizeof what, "%s blocks %zu-%zu (node %d)", b->what, i, e - 1,
                 (int)gr->node);
        TRY(fn(ctx, b, b->base + i * b->bytes, (e - i) * b->bytes, gr->os_index, what, err));
        i = e;
    }
    return EPYQ_OK;
}

static epyq_status bind_run(void *ctx, const blockset *b, uint8_t *at, size_t bytes,
                            int32_t os_index, const char *what, epyq_err *err) {
    (void)ctx, (void)b;
    return epyq_numa_bind_range(at, bytes, os_index, what, err);
}

static epyq_status place_sets(const epyq_model *m, epyq_seq *s, bool spec, epyq_err *err) {
    const epyq_model_numa *n = m->numa;
    if (!n || !n->head_jobs || !n->setup->plan->bind_memory) return EPYQ_OK;
    blockset sets[MAX_SETS];
    int32_t c = blocksets(m, s, spec, sets);
    uint32_t bound = 0, unbound = 0;
    for (int32_t k = 0; k < c; k++) {
        const blockset *b = &sets[k];
        if (!paged(b)) {
            unbound |= 1u << b->kind;
            continue;
        }
        TRY(walk_runs(m, b, bind_run, NULL, err));
        bound |= 1u << b->kind;
    }
    s->numa_bound = (s->numa_bound | bound) & ~unbound;
    return EPYQ_OK;
}

epyq_status epyq_numa_seq_place(const epyq_model *m, epyq_seq *s, epyq_err *err) {
    return place_sets(m, s, false, err);
}

epyq_status epyq_numa_spec_place(const epyq_model *m, epyq_seq *s, epyq_err *err) {
    return place_sets(m, s, true, err);
}

/* verify_kinds' tally: pages per kind, and the first failure (the walk goes on past it). */
typedef struct {
    epyq_seq_numa_pages *out; /* [EPYQ_SEQ_NUMA_KINDS] */
    epyq_status first;
    epyq_err *err;
} verify_tally;

static epyq_status verify_run(void *ctx, const blockset *b, uint8_t *at, size_t bytes,
                              int32_t os_index, const char *what, epyq_err *err) {
    (void)err;
    verify_tally *v = ctx;
    epyq_seq_numa_pages *o = &v->out[b->kind];
    epyq_numa_verify_report rep;
    epyq_err e1 = {0};
    epyq_status st = epyq_numa_verify(at, bytes, &os_index, 1, what, &rep, &e1);
    o->pages += rep.pages, o->on_node += rep.on_node, o->absent += rep.absent;
    o->elsewhere += rep.elsewhere;
    if (st != EPYQ_OK && v->first == EPYQ_OK) v->first = st, *v->err = e1;
    return EPYQ_OK;
}

epyq_status epyq_seq_numa_verify_kinds(const epyq_seq *s,
                                       epyq_seq_numa_pages out[EPYQ_SEQ_NUMA_KINDS],
                                       epyq_err *err) {
    const epyq_model *m = s->m;
    const epyq_model_numa *n = m->numa;
    memset(out, 0, EPYQ_SEQ_NUMA_KINDS * sizeof *out);
    if (!n || !n->head_jobs)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "NUMA verify: the model was loaded without a NUMA mode");
    for (int32_t k = 0; k < EPYQ_SEQ_NUMA_KINDS; k++) out[k].bound = s->numa_bound >> k & 1u;
    if (!n->setup->plan->bind_memory) return EPYQ_OK;
    verify_tally v = {out, EPYQ_OK, err};
    for (int spec = 0; spec < 2; spec++) {
        blockset sets[MAX_SETS];
        int32_t c = blocksets(m, s, spec, sets);
        for (int32_t k = 0; k < c; k++)
            if (paged(&sets[k])) (void)walk_runs(m, &sets[k], verify_run, &v, err);
    }
    return v.first;
}

epyq_status epyq_seq_numa_verify(const epyq_seq *s, size_t *pages, size_t *elsewhere,
                                 epyq_err *err) {
    const epyq_model *m = s->m;
    *pages = *elsewhere = 0;
    epyq_seq_numa_pages k[EPYQ_SEQ_NUMA_KINDS];
    epyq_status st = epyq_seq_numa_verify_kinds(s, k, err);
    if (st == EPYQ_E_ARG) return st;
    for (int32_t i = 0; i < EPYQ_SEQ_NUMA_KINDS; i++)
        *pages += k[i].pages, *elsewhere += k[i].elsewhere;
    if (st == EPYQ_OK && m->numa->setup->plan->bind_memory && s->S && !k[EPYQ_SEQ_NUMA_STATE].bound)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "NUMA verify: DeltaNet state blocks of %zu bytes are not whole pages",
                            (size_t)m->d.Dk * m->d.Dv * sizeof(float));
    return st;
}

epyq_status epyq_model_numa_seq_reads(const epyq_model *m, int32_t group, uint64_t *local,
                                      uint64_t *remote, epyq_err *err) {
    const epyq_model_numa *n = m->numa;
    if (!n || !n->sreads || group < 0 || group >= n->n_groups)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "NUMA sequence reads: expected a group in [0, %d), got %d",
                            n ? (int)n->n_groups : 0, (int)group);
    *local = n->sreads[group].local, *remote = n->sreads[group].remote;
    return EPYQ_OK;
}

/* ---- running */

static void head_task(void *ctx, int32_t task, int32_t worker) {
    const epyq_numa_head_job *j = ctx;
    j->fn(j->ctx, j->tasks[task], j->worker0 + worker);
}

bool epyq_numa_run_heads(epyq_model *m, epyq_numa_head kind, epyq_task_fn fn, void *ctx,
                         int32_t n_outer, epyq_numa_bytes_fn bytes) {
    epyq_model_numa *n = m->numa;
    if (!n || !n->head_jobs) return false;
    const int32_t H = kind == EPYQ_NUMA_HEAD_KV    ? m->d.nkv
                      : kind == EPYQ_NUMA_HEAD_KEY ? m->d.Hk
                                                   : m->d.Hv;
    const int32_t *owner = kind == EPYQ_NUMA_HEAD_KV    ? n->kv_group
                           : kind == EPYQ_NUMA_HEAD_KEY ? n->key_group
                                                        : n->head_group;
    const epyq_seq_numa_kind bk = kind == EPYQ_NUMA_HEAD_KV    ? EPYQ_SEQ_NUMA_KV
                                  : kind == EPYQ_NUMA_HEAD_KEY ? EPYQ_SEQ_NUMA_CONV
                                                               : EPYQ_SEQ_NUMA_STATE;
    if (H < 1 || (int64_t)n_outer * H > INT32_MAX) return false;
    const int32_t G = n->n_groups;
    /* task ids grouped by owner: group g's are the (outer, head) pairs of its heads */
    int32_t *tasks = malloc((size_t)n_outer * (size_t)H * sizeof *tasks + 1);
    if (!tasks) return false; /* the caller runs them on its own pool: the same bits */
    int32_t at = 0;
    for (int32_t g = 0; g < G; g++) {
        epyq_numa_head_job *j = &n->head_jobs[g];
        j->fn = fn, j->ctx = ctx, j->tasks = tasks + at;
        int32_t c = 0;
        for (int32_t q = 0; q < n_outer; q++)
            for (int32_t h = 0; h < H; h++)
                if (owner[h] == g) {
                    int32_t t = q * H + h;
                    tasks[at + c++] = t;
                    if (!bytes) continue;
                    /* local when the kind's blocks were bound to this group's node */
                    const epyq_seq *s = NULL;
                    uint64_t b = bytes(ctx, t, &s);
                    bool local = s && (s->numa_bound >> bk & 1u);
                    epyq_numa_reads *r[2] = {&n->reads[g], &n->sreads[g]};
                    for (int32_t i = 0; i < 2; i++) *(local ? &r[i]->local : &r[i]->remote) += b;
                }
        j->n = c;
        at += c;
    }
    epyq_pool **pools = n->setup->rt->pools;
    for (int32_t g = 1; g < G; g++)
        if (n->head_jobs[g].n)
            epyq_pool_start(pools[g], head_task, &n->head_jobs[g], n->head_jobs[g].n);
    if (n->head_jobs[0].n) epyq_pool_run(pools[0], head_task, &n->head_jobs[0], n->head_jobs[0].n);
    for (int32_t g = 1; g < G; g++)
        if (n->head_jobs[g].n) epyq_pool_wait(pools[g]);
    free(tasks);
    return true;
}
