/* src/model/numa_moe.c — routed experts on their plan groups' nodes, and the MoE dispatch
 * that runs them there (see numa_moe.h).
 *
 * Every expert is cut into slices of its intermediate rows (n->slice, 128 by default: 4 per
 * 35b expert), and the plan places each slice on one group, going round the groups, so every
 * node computes its share of every expert a token chooses: with whole experts per node, one
 * token's 8 experts fell 5 to 3 on two nodes as often as not, and the busier node set the pace.
 * A slice is the rows [i0, i1) of gate and up and the same columns of down; its result is what
 * the fused kernel gives over [i0, i1) of the whole expert (kern.h epyq_w4_cols), and the
 * dispatch sums the slices in a fixed order, so the output does not depend on the placement.
 *
 * Loading: model.c packs only expert 0 of each layer (it fixes the int4 group size and shows
 * the experts' kind) when a NUMA mode is on. Here every group gets one node-bound buffer for
 * all of its slices, sized before anything is touched; the workers of the group holding an
 * expert's first slice then pack it (epyq_rlin_load_expert, the same conversion as the
 * single-pool path) and copy each slice into its slot, so each page is first written after its
 * buffer was bound (MPOL_BIND: it cannot land on another node, whichever node's worker writes
 * it). The dense linears (projections, router, shared expert, lm_head, MTP fc) are then split
 * by rows over the groups' nodes, or copied to each (numa_dense.c). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "model/numa_impl.h"
#include "model/numa_moe.h"

#define UNIT_TOKENS 32   /* tokens per dispatch unit: moe.c's MOE_CHUNK, for equal numerics */
#define BATCH_TOKENS 256 /* tokens per dispatch run: bounds its scratch [slices][256 * top_k][H] */

/* The MoE weights of plan layer l: trunk layers, then the MTP layer. */
static epyq_moe_rw *layer_rw(epyq_model *m, int32_t l) {
    return l < m->d.L ? &m->layers[l].m : &m->mtp.m;
}
static const epyq_moe_w *layer_w(const epyq_model *m, int32_t l) {
    return l < m->d.L ? &m->w->layers[l].moe : &m->w->mtp.layer.moe;
}

/* Bytes of one slot of an n x k int4 matrix of src's scheme, the most its packing can take
 * (asymmetric only when the scheme has zero points), rounded to the kernels' 64-byte alignment. */
static size_t slot_bytes(const epyq_linear *src, int32_t n, int32_t k) {
    size_t b = epyq_w4_pack_bytes(n, k, src->scheme.group_size, src->scheme.sym ? 0 : 1);
    return (b + 63) & ~(size_t)63;
}

/* Intermediate rows [i0, i1) of slice s. */
static void slice_rows(const epyq_model_numa *n, int32_t I, int32_t s, int32_t *i0, int32_t *i1) {
    *i0 = s * n->slice;
    *i1 = *i0 + n->slice < I ? *i0 + n->slice : I;
}

/* Bytes of slice s of expert e in its group's buffer: gate and up rows, down columns. */
static size_t slice_slot_bytes(const epyq_model_numa *n, const epyq_moe_w *mw, int32_t e,
                               int32_t s) {
    int32_t i0, i1;
    slice_rows(n, (int32_t)mw->gate[e].n_out, s, &i0, &i1);
    const int32_t H = (int32_t)mw->gate[e].n_in;
    return slot_bytes(&mw->gate[e], i1 - i0, H) + slot_bytes(&mw->up[e], i1 - i0, H) +
           slot_bytes(&mw->down[e], (int32_t)mw->down[e].n_out, i1 - i0);
}

/* The placed matrices of slice s of plan layer l's expert e: gate rows, up rows, down columns. */
static const epyq_w4 *slice_w(const epyq_model_numa *n, int32_t E, int32_t l, int32_t e,
                              int32_t s) {
    return n->eslices + (((size_t)l * (size_t)E + (size_t)e) * (size_t)n->n_slices + (size_t)s) * 3;
}

int32_t epyq_model_numa_groups(const epyq_model *m) { return m->numa ? m->numa->n_groups : 0; }

int32_t epyq_model_numa_units(const epyq_model *m, int32_t group) {
    return m->numa ? epyq_moe_dispatch_units(m->numa->disp, group) : -1;
}

int32_t epyq_moe_numa_layer(const epyq_model *m, const epyq_moe_rw *mw) {
    if (!m->numa) return -1;
    for (int32_t l = 0; l < m->numa->n_layers; l++)
        if (layer_rw((epyq_model *)m, l) == mw) return l;
    return -1;
}

void epyq_model_numa_free(epyq_model *m) {
    epyq_model_numa *n = m->numa;
    if (!n) return;
    /* the slices' memory belongs to the buffers; the experts' rlins keep only their shapes and
     * act-order permutations (after a failed load some may still own heap memory), which
     * layer_free releases */
    epyq_numa_dense_free(m);
    epyq_numa_heads_free(m);
    for (int32_t g = 0; n->bufs && g < n->n_groups; g++) epyq_numa_buf_free(&n->bufs[g]);
    free(n->bufs), free(n->used), free(n->bufs_local), free(n->reads), free(n->eslices);
    epyq_moe_dispatch_free(n->disp);
    epyq_numa_setup_free(n->setup);
    free(n);
    m->numa = NULL;
}

/* ---- loading */

typedef struct {
    epyq_model *m;
    const int32_t *list; /* [n] plan index l * E + e of each expert the group packs */
    const size_t
        *off; /* [n_layers * E * n_slices] byte offset of each slice in its group's buffer */
    uint8_t *const *base;    /* [n_groups] each group's buffer */
    epyq_err *errs;          /* [n_layers * E] */
} pack_job;

/* Copy the slices of one packed expert into their slots, then release the heap copy. */
static void place_slices(epyq_model *m, const pack_job *j, int32_t id, epyq_rlin *lin[3]) {
    epyq_model_numa *n = m->numa;
    const int32_t S = n->n_slices, l = id / m->d.E, e = id % m->d.E;
    for (int32_t s = 0; s < S; s++) {
        const size_t part = (size_t)id * (size_t)S + (size_t)s;
        uint8_t *slot = j->base[n->setup->plan->expert_group[part]] + j->off[part];
        epyq_w4 *w = (epyq_w4 *)slice_w(n, m->d.E, l, e, s);
        int32_t i0, i1;
        slice_rows(n, lin[0]->n, s, &i0, &i1);
        for (int32_t i = 0; i < 2; i++) { /* gate and up: whole 16-row tiles, one run each */
            epyq_w4 v;
            epyq_w4_view(&lin[i]->w4, i0, i1, &v);
            memcpy(slot, v.mem, v.bytes);
            w[i] = v;
            w[i].mem = slot;
            slot += (v.bytes + 63) & ~(size_t)63;
        }
        epyq_w4_cols(&lin[2]->w4, i0 / lin[2]->w4.gs, i1 / lin[2]->w4.gs, slot, &w[2]);
    }
    for (int32_t i = 0; i < 3; i++) {
        epyq_wmem_release(m->wmem, lin[i]->w4.mem);
        lin[i]->w4.mem = NULL; /* shape, bytes and permutation stay */
    }
}

static void pack_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    pack_job *j = ctx;
    epyq_model *m = j->m;
    int32_t id = j->list[task], l = id / m->d.E, e = id % m->d.E;
    epyq_moe_rw *mr = layer_rw(m, l);
    const epyq_moe_w *mw = layer_w(m, l);
    epyq_err *err = &j->errs[id];
    /* expert 0 was packed by model.c (it fixed the group size); the rest are packed here */
    if (e > 0) {
        if (epyq_rlin_load_expert(m, &mr->gate[e], &mr->up[e], &mr->down[e], &mw->gate[e], &mw->up[e], &mw->down[e],
                                  err) != EPYQ_OK)
            return;
    }
    epyq_rlin *lin[3] = {&mr->gate[e], &mr->up[e], &mr->down[e]};
    if (!lin[0]->q4 || !lin[1]->q4 || !lin[2]->q4 || lin[1]->n != lin[0]->n ||
        lin[2]->k != lin[0]->n || lin[0]->n != m->d.I || lin[2]->w4.gs != lin[0]->w4.gs) {
        epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                     "%s: NUMA placement needs int4 gate/up/down of one group size and the model's "
                     "intermediate size %d, got %d",
                     mw->gate[e].module, (int)m->d.I, (int)lin[0]->n);
        return;
    }
    place_slices(m, j, id, lin);
}

static void pack_start(epyq_pool *p, bool driver, pack_job *j, int32_t n) {
    if (!n) return;
    if (driver) epyq_pool_run(p, pack_task, j, n);
    else epyq_pool_start(p, pack_task, j, n);
}

/* Size, allocate (bound) and fill every group's slice buffer. */
static epyq_status place_experts(epyq_model *m, epyq_err *err) {
    epyq_model_numa *n = m->numa;
    const epyq_numa_plan *plan = n->setup->plan;
    const int32_t G = n->n_groups, E = m->d.E, S = n->n_slices;
    const size_t ids = (size_t)n->n_layers * (size_t)E, parts = ids * (size_t)S;
    size_t *off = malloc(parts * sizeof *off);
    int32_t *list = malloc(ids * sizeof *list), *count = calloc((size_t)G + 1, sizeof *count);
    epyq_err *errs = calloc(ids, sizeof *errs);
    pack_job *jobs = calloc((size_t)G, sizeof *jobs);
    uint8_t **base = calloc((size_t)G, sizeof *base);
    n->bufs = calloc((size_t)G, sizeof *n->bufs);
    n->used = calloc((size_t)G, sizeof *n->used);
    n->eslices = calloc(parts * 3, sizeof *n->eslices);
    epyq_status st =
        off && list && count && errs && jobs && base && n->bufs && n->used && n->eslices
            ? EPYQ_OK
            : epyq_err_set(err, EPYQ_E_NOMEM, "NUMA experts: out of memory");
    if (st != EPYQ_OK) goto done;
    /* offsets inside each group's buffer */
    for (size_t part = 0; part < parts; part++) {
        int32_t g = plan->expert_group[part];
        off[part] = n->used[g];
        size_t id = part / (size_t)S;
        size_t b = slice_slot_bytes(n, layer_w(m, (int32_t)(id / (size_t)E)),
                                    (int32_t)(id % (size_t)E), (int32_t)(part % (size_t)S));
        if (!epyq_add_size(n->used[g], b, &n->used[g])) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "NUMA experts of node %d: size overflows", (int)g);
            goto done;
        }
    }
    /* the group holding an expert's first slice packs it: each group's experts as one list
     * (counting sort) */
    for (size_t id = 0; id < ids; id++) count[plan->expert_group[id * (size_t)S] + 1]++;
    for (int32_t g = 0; g < G; g++) count[g + 1] += count[g];
    for (size_t id = 0; id < ids; id++)
        list[count[plan->expert_group[id * (size_t)S]]++] =
            (int32_t)id; /* count[g] becomes the end of g */
    for (int32_t g = 0; g < G; g++) {
        const epyq_numa_group *gr = &plan->groups[g];
        st = epyq_numa_buf_alloc(&n->bufs[g], n->used[g] ? n->used[g] : 1, plan->bind_memory ? gr->os_index : -1,
                                 err);
        if (st != EPYQ_OK) {
            epyq_err_prefix(err, "routed experts of node %d (%.2f GiB): ", (int)gr->node,
                            (double)n->used[g] / (1 << 30));
            goto done;
        }
        base[g] = n->bufs[g].ptr;
    }
    for (int32_t g = 0; g < G; g++) {
        int32_t first = g ? count[g - 1] : 0;
        jobs[g] = (pack_job){m, list + first, off, base, errs};
    }
    /* every group packs its experts on its own workers, all groups at once */
    epyq_pool **pools = n->setup->rt->pools;
    for (int32_t g = 1; g < G; g++) pack_start(pools[g], false, &jobs[g], count[g] - count[g - 1]);
    pack_start(pools[0], true, &jobs[0], count[0]);
    for (int32_t g = 1; g < G; g++)
        if (count[g] > count[g - 1]) epyq_pool_wait(pools[g]);
    for (size_t id = 0; id < ids; id++)
        if (errs[id].code != EPYQ_OK) { /* the lowest failing expert, whatever the timing */
            *err = errs[id];
            st = err->code;
            break;
        }
done:
    free(off), free(list), free(count), free(errs), free(jobs), free(base);
    return st;
}

/* One buffer's pages against its group's node: adds to the counts, keeps the first error. */
static void verify_buf(const epyq_numa_buf *b, size_t len, int32_t os_node, const char *what,
                       bool *local, size_t *pages, size_t *elsewhere, epyq_status *first,
                       epyq_err *err) {
    epyq_numa_verify_report rep;
    epyq_err e = {0};
    epyq_status st = epyq_numa_verify(b->ptr, len, &os_node, 1, what, &rep, &e);
    *pages += rep.pages, *elsewhere += rep.elsewhere;
    if (local) *local = st == EPYQ_OK && rep.on_node == rep.pages;
    if (st != EPYQ_OK && *first == EPYQ_OK) {
        *first = st;
        *err = e;
    }
}

/* Every group's expert and dense buffers; bufs_local / dbufs_local (when given) record which
 * were found wholly on their node, for the read counters. */
static epyq_status verify_all(const epyq_model_numa *n, bool *bufs_local, bool *dbufs_local,
                              size_t *pages, size_t *elsewhere, epyq_err *err) {
    const epyq_numa_plan *plan = n->setup->plan;
    epyq_status first = EPYQ_OK;
    for (int32_t g = 0; plan->bind_memory && g < n->n_groups; g++) {
        char what[64];
        const int32_t os = plan->groups[g].os_index, node = plan->groups[g].node;
        snprintf(what, sizeof what, "routed experts of node %d", (int)node);
        verify_buf(&n->bufs[g], n->used[g], os, what, bufs_local ? &bufs_local[g] : NULL, pages,
                   elsewhere, &first, err);
        if (!n->n_dense) continue;
        snprintf(what, sizeof what, "dense weights of node %d", (int)node);
        verify_buf(&n->dbufs[g], n->dused[g], os, what, dbufs_local ? &dbufs_local[g] : NULL, pages,
                   elsewhere, &first, err);
    }
    return first;
}

static void log_verify(epyq_model *m) {
    size_t pages = 0, elsewhere = 0;
    epyq_err verr = {0};
    epyq_model_numa *n = m->numa;
    const epyq_numa_plan *plan = n->setup->plan;
    if (!plan->bind_memory) return;
    if (verify_all(n, n->bufs_local, n->dbufs_local, &pages, &elsewhere, &verr) != EPYQ_OK)
        fprintf(stderr, "warning: %s\n", verr.msg);
    else
        fprintf(
            stderr,
            "numa: routed experts and dense weights (%s) verified with move_pages: %zu pages, all on their "
            "nodes\n",
            plan->replicate_dense ? "a copy per node" : "row slices per node", pages);
}

epyq_status epyq_model_numa_verify(const epyq_model *m, size_t *pages, size_t *elsewhere, epyq_err *err) {
    *pages = *elsewhere = 0;
    if (!m->numa) return epyq_err_set(err, EPYQ_E_ARG, "NUMA verify: the model was loaded without a NUMA mode");
    return verify_all(m->numa, NULL, NULL, pages, elsewhere, err);
}

epyq_status epyq_model_numa_reads(const epyq_model *m, int32_t group, uint64_t *local,
                                  uint64_t *remote, epyq_err *err) {
    if (!m->numa || group < -1 || group >= m->numa->n_groups)
        return epyq_err_set(err, EPYQ_E_ARG, "NUMA reads: expected a group in [-1, %d), got %d",
                            (int)(m->numa ? m->numa->n_groups : 0), (int)group);
    if (group < 0) {
        *local = 0, *remote = m->numa->unpinned;
    } else {
        *local = m->numa->reads[group].local, *remote = m->numa->reads[group].remote;
    }
    return EPYQ_OK;
}

void epyq_model_numa_reads_reset(epyq_model *m) {
    if (!m->numa) return;
    memset(m->numa->reads, 0, (size_t)m->numa->n_groups * sizeof *m->numa->reads);
    if (m->numa->sreads)
        memset(m->numa->sreads, 0, (size_t)m->numa->n_groups * sizeof *m->numa->sreads);
    m->numa->unpinned = 0;
}

/* What the plan needs to know of this model: sizes as they will sit in memory. */
static void numa_model_desc(const epyq_model *m, epyq_numa_model *d) {
    const epyq_moe_w *mw = layer_w(m, 0);
    epyq_model_numa *n = m->numa;
    memset(d, 0, sizeof *d);
    snprintf(n->name, sizeof n->name, "%d layers x %d experts, %s int4 g%d", (int)m->d.L,
             (int)m->d.E, epyq_qformat_name(m->c->qformat), (int)m->gs);
    d->name = n->name;
    d->n_layers = n->n_layers;
    d->n_experts = m->d.E;
    d->top_k = m->d.topk;
    d->n_slices = n->n_slices;
    d->expert_bytes = 0; /* S times the largest slice's slot: the plan counts equal slices */
    for (int32_t s = 0; s < n->n_slices; s++) {
        size_t b = slice_slot_bytes(n, mw, 0, s);
        d->expert_bytes = b > d->expert_bytes ? b : d->expert_bytes;
    }
    d->expert_bytes *= (uint64_t)n->n_slices;
    /* everything else a token reads, plus one embedding copy (bf16) */
    uint64_t routed = (uint64_t)m->d.L * (uint64_t)m->d.topk * d->expert_bytes;
    uint64_t active = epyq_model_active_bytes(m);
    d->dense_token_bytes = active > routed ? active - routed : 0;
    d->dense_bytes = d->dense_token_bytes + (uint64_t)m->d.V * (uint64_t)m->d.H * 2u;
}

epyq_status epyq_model_numa_load(epyq_model *m, const epyq_numa_opts *o, int32_t slice, epyq_err *err) {
    if (!m->layers[0].m.gate[0].q4)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED,
                            "%s: --numa places int4 routed experts; this checkpoint's experts are 16-bit "
                            "(use --numa off)", layer_w(m, 0)->gate[0].module);
    slice = slice > 0 ? slice : 128;
    if (slice % m->gs || m->d.I % m->gs)
        return epyq_err_set(err, EPYQ_E_ARG, "MoE slice of %d rows: expected a multiple of the int4 group size %d",
                            (int)slice, (int)m->gs);
    if (slice > m->d.I) slice = m->d.I;
    epyq_model_numa *n = calloc(1, sizeof *n);
    if (!n) return epyq_err_set(err, EPYQ_E_NOMEM, "NUMA setup: out of memory");
    m->numa = n;
    /* the MTP layer's experts are placed too when int4 (some checkpoints keep them 16-bit:
     * those stay on the single-pool path) */
    n->n_layers = m->d.L + (m->has_mtp && m->mtp.m.gate[0].q4 ? 1 : 0);
    n->slice = slice;
    n->n_slices = (m->d.I + slice - 1) / slice;
    epyq_numa_model desc;
    numa_model_desc(m, &desc);
    /* nothing here owns what it allocates: n hangs on m, which the caller frees on failure */
    TRY(epyq_numa_setup_create(&n->setup, &desc, o, stderr, err));
    n->n_groups = n->setup->plan->n_groups;
    n->reads = calloc((size_t)n->n_groups, sizeof *n->reads);
    n->bufs_local = calloc((size_t)n->n_groups, sizeof *n->bufs_local);
    if (!n->reads || !n->bufs_local)
        return epyq_err_set(err, EPYQ_E_NOMEM, "NUMA setup: out of memory");
    TRY(place_experts(m, err));
    TRY(epyq_numa_dense_place(m, err));
    TRY(epyq_numa_heads_init(m, err));
    epyq_moe_dims dims = {.max_tokens = BATCH_TOKENS,
                          .top_k = m->d.topk,
                          .n_slices = n->n_slices,
                          .width = m->d.H,
                          .max_unit_tokens = UNIT_TOKENS};
    TRY(epyq_moe_dispatch_create(&n->disp, n->setup->rt, &dims, err));
    log_verify(m);
    return EPYQ_OK;
}

/* ---- running */

typedef struct {
    const epyq_model *m;
    const epyq_moe_rw *mw;
    const float *x;          /* [tokens of this run][H] normed input */
    atomic_int failed;
} unit_job;

/* One unit: its tokens' rows through one intermediate slice of the fused expert kernel, from
 * the slice's own copy on this group's node (same gather, activations and path as moe.c). */
static void unit_run(void *ctx, const epyq_moe_unit *u, float *out, int32_t ldo, int32_t group, int32_t worker) {
    (void)group, (void)worker;
    unit_job *j = ctx;
    const epyq_model *m = j->m;
    const epyq_model_numa *nm = m->numa;
    const int32_t H = m->d.H, n = u->n_tokens;
    const epyq_rlin *gate = &j->mw->gate[u->expert];
    const epyq_w4 *w = slice_w(nm, m->d.E, u->layer, u->expert, u->slice);
    const int32_t ni = w[0].n;
    float *xg = malloc((size_t)n * H * sizeof(float));
    void *abuf = epyq_model_alloc(epyq_act_bytes(n, H, m->gs, epyq_path_experts(m)), 1);
    void *scratch = epyq_model_alloc(m->kt->w4_expert_scratch_bytes(n, ni, H), 1);
    if (xg && abuf && scratch) {
        for (int32_t r = 0; r < n; r++) /* act-order gate/up: their column order (linear.c) */
            if (gate->perm)
                for (int32_t c = 0; c < H; c++) xg[(size_t)r * H + c] = j->x[(size_t)u->tokens[r] * H + gate->perm[c]];
            else
                memcpy(xg + (size_t)r * H, j->x + (size_t)u->tokens[r] * H, (size_t)H * sizeof(float));
        epyq_act xa = {
            .m = n, .k = H, .gs = m->gs, .path = epyq_path_experts(m), .f32 = xg, .buf = NULL};
        m->kt->act_prep(&xa, xg, n, H, m->gs, xa.path, abuf);
        m->kt->w4_expert(&w[0], &w[1], &w[2], 0, ni, &xa, u->weights, out, ldo, scratch);
    } else {
        atomic_store(&j->failed, 1);
    }
    free(xg), free(abuf), free(scratch);
}

/* The read counters: each slice of each expert the batch chose is streamed once by the group
 * holding it. */
static void count_experts(epyq_model *m, int32_t layer, int32_t n, const int32_t *sel) {
    epyq_model_numa *nm = m->numa;
    const int32_t S = nm->n_slices;
    uint64_t seen[16] = {0}; /* moe.c takes at most 1024 experts */
    for (int32_t i = 0; i < n * m->d.topk; i++) {
        int32_t e = sel[i];
        if (e < 0 || e >= 1024 || seen[e >> 6] >> (e & 63) & 1) continue;
        seen[e >> 6] |= 1ull << (e & 63);
        for (int32_t s = 0; s < S; s++) {
            const size_t part =
                ((size_t)layer * (size_t)m->d.E + (size_t)e) * (size_t)S + (size_t)s;
            int32_t g = nm->setup->plan->expert_group[part];
            const epyq_w4 *w = slice_w(nm, m->d.E, layer, e, s);
            uint64_t b = w[0].bytes + w[1].bytes + w[2].bytes;
            if (nm->bufs_local[g]) nm->reads[g].local += b;
            else
                nm->reads[g].remote += b;
        }
    }
}

epyq_status epyq_moe_numa_run(epyq_model *m, int32_t layer, const epyq_moe_rw *mw, int32_t T, const float *x,
                              const int32_t *sel, const float *wt, float *y, int32_t ldy, epyq_err *err) {
    const int32_t K = m->d.topk, H = m->d.H;
    for (int32_t t0 = 0; t0 < T; t0 += BATCH_TOKENS) {
        int32_t n = T - t0 < BATCH_TOKENS ? T - t0 : BATCH_TOKENS;
        count_experts(m, layer, n, sel + (size_t)t0 * K);
        unit_job j = {m, mw, x + (size_t)t0 * H, 0};
        epyq_status st = epyq_moe_dispatch_run(m->numa->disp, layer, n, sel + (size_t)t0 * K, wt + (size_t)t0 * K,
                                               unit_run, &j, y + (size_t)t0 * ldy, ldy, false, err);
        if (st != EPYQ_OK) return st;
        if (atomic_load(&j.failed))
            return epyq_err_set(err, EPYQ_E_NOMEM, "MoE layer %d on the NUMA nodes: out of memory", (int)layer);
    }
    return EPYQ_OK;
}
