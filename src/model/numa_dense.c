/* src/model/numa_dense.c — the dense linears on the plan's nodes (see numa_moe.h).
 *
 * Why: per decoded token the dense weights (projections, router, shared experts, lm_head) are
 * most of the bytes read. Interleaved over N nodes, (N-1)/N of them would be remote; instead
 * every dense linear is cut by output rows, in whole 16-row tiles, into one slice per plan
 * group (shares proportional to the group's threads), each slice in memory bound to its
 * group's node and written there by the group's pinned workers, and computed by that group's
 * pool. The groups write disjoint output columns of the same y, so nothing is reduced and each
 * row is the one-pool path's bits (the kernels compute a row alone, whatever tile range holds
 * it). With replicate-dense every group holds a whole copy and computes the same rows from it.
 *
 * A shared expert is split the same way: gate and up by intermediate rows, down by output
 * rows. epyq_numa_expert_run runs it in the fused kernel's two phases (kern.h w4_expert_gu,
 * then w4_expert_down), each on every group at once, so each node computes its share of the
 * shared expert from its own memory; the phases give the fused kernel's bits. (Kept whole on
 * one node, it was computed by that node's pool while every other node waited: on 8 nodes a
 * shared expert of 2.7% of a token's bytes cost ~19% of the token's time.) */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/numa_impl.h"

/* One group's share of a run (its parts of each output, and their pool tasks). */
enum { MAX_RUN_OUTS = 8, MAX_RUN_PIECES = 256 };

typedef struct {
    const epyq_model *m;
    epyq_rlin_out outs[MAX_RUN_OUTS];
    const epyq_act *acts[MAX_RUN_OUTS];
    epyq_gemm_piece pc[MAX_RUN_PIECES];
    int32_t n_outs, n_pieces;
} group_job;

/* Every dense linear of every layer (MTP layer included), lm_head and the MTP fc. */
static int32_t dense_list(epyq_model *m, epyq_rlin **out) {
    int32_t n = 0;
    for (int32_t l = 0; l <= m->d.L; l++) {
        if (l == m->d.L && !m->has_mtp) break;
        epyq_layer_rw *ly = l < m->d.L ? &m->layers[l] : &m->mtp;
        epyq_rlin *lin[] = {&ly->at.q,      &ly->at.k,
                            &ly->at.v,      &ly->at.o,
                            &ly->g.qkv,     &ly->g.z,
                            &ly->g.b,       &ly->g.a,
                            &ly->g.out,     &ly->m.router,
                            &ly->m.sh_gate, &ly->m.sh_up,
                            &ly->m.sh_down, &ly->m.sh_expert_gate};
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
            if (lin[i]->n <= 0) continue; /* the other mixer's linears are all zero */
            if (out) out[n] = lin[i];
            n++;
        }
    }
    epyq_rlin *tail[] = {&m->lm_head, &m->mtp_fc};
    for (size_t i = 0; i < 2; i++)
        if (tail[i]->n > 0) {
            if (out) out[n] = tail[i];
            n++;
        }
    return n;
}

int32_t epyq_numa_layer_index(const epyq_model *m, const epyq_moe_rw *mw) {
    if (m->has_mtp && mw == &m->mtp.m) return m->d.L;
    for (int32_t l = 0; l < m->d.L; l++)
        if (mw == &m->layers[l].m) return l;
    return -1;
}

/* Rows [0, n) cut in whole tiles, group g's share of the tiles proportional to its threads. */
static void row_bounds(const epyq_numa_plan *p, int32_t n, int32_t *row0) {
    int64_t tiles = (n + 15) / 16, cum = 0, tot = p->n_threads > 0 ? p->n_threads : 1;
    row0[0] = 0;
    for (int32_t g = 0; g < p->n_groups; g++) {
        cum += p->groups[g].n_threads;
        int64_t r = tiles * cum / tot * 16;
        row0[g + 1] = g == p->n_groups - 1 || r > n ? n : (int32_t)r;
    }
}

/* One run of bytes copied into a group's buffer. */
typedef struct {
    const uint8_t *src;
    size_t len, off;
} seg;

typedef struct {
    const seg *s;
    int32_t n;
} seg_list;

/* The planes of rows [a, b) of l: (pointer, bytes) of the packed/bf16 rows, and the int8
 * requant's low plane; returns how many (0 for no rows). */
static int32_t planes(const epyq_rlin *l, int32_t a, int32_t b, const uint8_t **p, size_t *len) {
    if (b <= a) return 0;
    if (!l->q4) {
        p[0] = (const uint8_t *)(l->bf16 + (size_t)a * (size_t)l->k);
        len[0] = (size_t)(b - a) * (size_t)l->k * sizeof(uint16_t);
        return 1;
    }
    const epyq_w4 *w[2] = {&l->w4, &l->w4lo};
    int32_t np = l->requant == EPYQ_REQUANT_INT8 ? 2 : 1;
    for (int32_t i = 0; i < np; i++) {
        epyq_w4 v;
        if (!epyq_w4_view(w[i], a, b, &v)) return -1;
        p[i] = v.mem, len[i] = v.bytes;
    }
    return np;
}

static epyq_status seg_fill(void *ctx, uint8_t *dst, size_t offset, size_t len, epyq_err *err) {
    (void)err;
    const seg_list *sl = ctx;
    memset(dst, 0, len);
    for (int32_t i = 0; i < sl->n; i++) {
        const seg *s = &sl->s[i];
        size_t a = s->off, b = a + s->len;
        size_t lo = a > offset ? a : offset, hi = b < offset + len ? b : offset + len;
        if (lo < hi) memcpy(dst + (lo - offset), s->src + (lo - a), hi - lo);
    }
    return EPYQ_OK;
}

/* Where source byte p went in group g's buffer (p lies in one of its segments). */
static void *moved(const epyq_model_numa *n, const seg_list *sl, int32_t g, const void *p) {
    for (int32_t i = 0; i < sl[g].n; i++) {
        const seg *s = &sl[g].s[i];
        if ((const uint8_t *)p >= s->src && (const uint8_t *)p < s->src + s->len)
            return n->dbufs[g].ptr + s->off + ((const uint8_t *)p - s->src);
    }
    return NULL;
}

/* The rows of linear i group g holds (split: its slice; replicate: all). */
static void rows_of(const epyq_model_numa *n, int32_t i, int32_t g, bool replicate, int32_t *a,
                    int32_t *b) {
    const int32_t *r0 = n->row0 + (size_t)i * (size_t)(n->n_groups + 1);
    if (replicate) *a = 0, *b = n->dense[i]->n;
    else
        *a = r0[g], *b = r0[g + 1];
}

static epyq_status build_segments(epyq_model_numa *n, bool replicate, seg **segs, seg_list *sl,
                                  epyq_err *err) {
    const int32_t G = n->n_groups;
    for (int32_t g = 0; g < G; g++) {
        segs[g] = malloc((size_t)n->n_dense * 2 * sizeof(seg) + 1);
        if (!segs[g]) return epyq_err_set(err, EPYQ_E_NOMEM, "NUMA dense weights: out of memory");
        size_t used = 0;
        int32_t ns = 0;
        for (int32_t i = 0; i < n->n_dense; i++) {
            int32_t a, b;
            rows_of(n, i, g, replicate, &a, &b);
            const uint8_t *p[2];
            size_t len[2];
            int32_t np = planes(n->dense[i], a, b, p, len);
            if (np < 0)
                return epyq_err_set(err, EPYQ_E_INTERNAL,
                                    "NUMA dense weights: rows [%d, %d) of a [%d][%d] int4 "
                                    "linear are not on a 16-row tile",
                                    (int)a, (int)b, (int)n->dense[i]->n, (int)n->dense[i]->k);
            for (int32_t q = 0; q < np; q++) {
                segs[g][ns++] = (seg){p[q], len[q], used};
                if (!epyq_add_size(used, (len[q] + 63) & ~(size_t)63, &used))
                    return epyq_err_set(err, EPYQ_E_NOMEM, "NUMA dense weights: size overflows");
            }
        }
        sl[g] = (seg_list){segs[g], ns};
        n->dused[g] = used;
    }
    return EPYQ_OK;
}

/* After the copies: each linear's parts point into the groups' buffers; the heap memory is
 * freed. */
static void repoint(epyq_model *m, const seg_list *sl) {
    epyq_model_numa *n = m->numa;
    const int32_t G = n->n_groups;
    for (int32_t i = 0; i < n->n_dense; i++) {
        epyq_rlin *l = n->dense[i];
        void *heap[3] = {l->q4 ? l->w4.mem : NULL, l->q4 ? l->w4lo.mem : NULL, l->bf16};
        {
            const int32_t *r0 = n->row0 + (size_t)i * (size_t)(G + 1);
            epyq_rlin *parts = n->parts + (size_t)i * (size_t)G;
            for (int32_t g = 0; g < G; g++) {
                epyq_rlin *pt = &parts[g];
                *pt = *l;
                pt->split = NULL;
                pt->n = r0[g + 1] - r0[g];
                if (pt->n <= 0) {
                    memset(pt, 0, sizeof *pt);
                    continue;
                }
                if (l->q4) {
                    epyq_w4_view(&l->w4, r0[g], r0[g + 1], &pt->w4);
                    pt->w4.mem = moved(n, sl, g, pt->w4.mem);
                    if (l->requant == EPYQ_REQUANT_INT8) {
                        epyq_w4_view(&l->w4lo, r0[g], r0[g + 1], &pt->w4lo);
                        pt->w4lo.mem = moved(n, sl, g, pt->w4lo.mem);
                    }
                } else {
                    pt->bf16 = moved(n, sl, g, l->bf16 + (size_t)r0[g] * (size_t)l->k);
                }
            }
            n->splits[i] = (epyq_rlin_split){G, r0, parts};
            if (l->q4) l->w4.mem = l->w4lo.mem = NULL;
            l->bf16 = NULL;
            l->split = &n->splits[i];
        }
        for (int32_t q = 0; q < 3; q++) free(heap[q]);
    }
}

epyq_status epyq_numa_dense_place(epyq_model *m, epyq_err *err) {
    epyq_model_numa *n = m->numa;
    const epyq_numa_plan *plan = n->setup->plan;
    const int32_t G = n->n_groups;
    int32_t cnt = dense_list(m, NULL);
    n->n_dense = cnt;
    n->dense = malloc(((size_t)cnt + 1) * sizeof *n->dense);
    n->row0 = malloc(((size_t)cnt * (size_t)(G + 1) + 1) * sizeof *n->row0);
    n->parts = calloc((size_t)cnt * (size_t)G + 1, sizeof *n->parts);
    n->splits = calloc((size_t)cnt + 1, sizeof *n->splits);
    n->dbufs = calloc((size_t)G, sizeof *n->dbufs);
    n->dused = calloc((size_t)G, sizeof *n->dused);
    n->dbufs_local = calloc((size_t)G, sizeof *n->dbufs_local);
    n->jobs = calloc((size_t)G, sizeof(group_job));
    seg **segs = calloc((size_t)G, sizeof *segs);
    seg_list *sl = calloc((size_t)G, sizeof *sl);
    epyq_status st = n->dense && n->row0 && n->parts && n->splits && n->dbufs && n->dused &&
                             n->dbufs_local && n->jobs && segs && sl
                         ? EPYQ_OK
                         : epyq_err_set(err, EPYQ_E_NOMEM, "NUMA dense weights: out of memory");
    if (st == EPYQ_OK) {
        dense_list(m, n->dense);
        for (int32_t i = 0; i < cnt; i++)
            row_bounds(plan, n->dense[i]->n, n->row0 + (size_t)i * (size_t)(G + 1));
        st = build_segments(n, plan->replicate_dense, segs, sl, err);
    }
    for (int32_t g = 0; st == EPYQ_OK && g < G; g++) {
        const epyq_numa_group *gr = &plan->groups[g];
        st = epyq_numa_buf_alloc(&n->dbufs[g], n->dused[g] ? n->dused[g] : 1,
                                 plan->bind_memory ? gr->os_index : -1, err);
        if (st != EPYQ_OK)
            epyq_err_prefix(err, "dense weights of node %d (%.2f GiB): ", (int)gr->node,
                            (double)n->dused[g] / (1 << 30));
    }
    /* each group's workers write its buffer, so its pages are first touched on its node */
    for (int32_t g = 0; st == EPYQ_OK && g < G; g++)
        st = epyq_numa_buf_fill(&n->dbufs[g], n->setup->rt->pools[g], 0, seg_fill, &sl[g], err);
    if (st == EPYQ_OK) repoint(m, sl);
    else
        n->n_dense = 0; /* nothing moved: the linears still own their heap memory */
    for (int32_t g = 0; segs && g < G; g++) free(segs[g]);
    free(segs), free(sl);
    return st;
}

void epyq_numa_dense_free(epyq_model *m) {
    epyq_model_numa *n = m->numa;
    for (int32_t i = 0; i < n->n_dense; i++) {
        epyq_rlin *l = n->dense[i];
        /* the memory is the buffers'; the shape, perm and requant kind stay for layer_free */
        if (l->q4) l->w4.mem = l->w4lo.mem = NULL;
        l->bf16 = NULL;
        l->split = NULL;
    }
    for (int32_t g = 0; n->dbufs && g < n->n_groups; g++) epyq_numa_buf_free(&n->dbufs[g]);
    free(n->dense), free(n->row0), free(n->parts), free(n->splits);
    free(n->dbufs), free(n->dused), free(n->dbufs_local), free(n->jobs);
    n->n_dense = 0;
}

/* ---- running */

static void group_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const group_job *j = ctx;
    const epyq_gemm_piece *q = &j->pc[task];
    const epyq_rlin_out *o = &j->outs[q->out];
    epyq_rlin_rows(j->m, o->l, q->n0, q->n1, j->acts[q->out], o->y, o->ldy);
}

static void count(epyq_model_numa *n, int32_t g, bool local, uint64_t bytes) {
    if (local) n->reads[g].local += bytes;
    else
        n->reads[g].remote += bytes;
}

void epyq_numa_dense_run(epyq_model *m, const epyq_rlin_out *outs, int32_t n,
                         const epyq_act *const *acts) {
    epyq_model_numa *nm = m->numa;
    const int32_t G = nm->n_groups;
    epyq_pool **pools = nm->setup->rt->pools;
    for (int32_t i0 = 0; i0 < n; i0 += MAX_RUN_OUTS) {
        int32_t c = n - i0 < MAX_RUN_OUTS ? n - i0 : MAX_RUN_OUTS;
        group_job *jobs = nm->jobs;
        for (int32_t g = 0; g < G; g++) {
            group_job *j = &jobs[g];
            j->m = m, j->n_outs = 0;
            for (int32_t i = i0; i < i0 + c; i++) {
                const epyq_rlin *l = outs[i].l;
                const epyq_rlin *pt = l->split ? &l->split->part[g] : g == 0 ? l : NULL;
                if (!pt || pt->n <= 0) continue;
                int32_t col = l->split ? l->split->row0[g] : 0;
                j->outs[j->n_outs] = (epyq_rlin_out){pt, outs[i].y + col, outs[i].ldy};
                j->acts[j->n_outs++] = acts[i];
                /* a linear without a split is on the heap: where its pages are is not known */
                count(nm, g, l->split ? nm->dbufs_local[g] : false, epyq_rlin_bytes(pt));
            }
            j->n_pieces = j->n_outs ? epyq_rlin_pieces(epyq_pool_size(pools[g]), j->outs, j->n_outs,
                                                       acts[i0]->m, j->pc, MAX_RUN_PIECES)
                                    : 0;
        }
        /* every group at once: the driver starts groups 1.., runs group 0 itself, waits */
        for (int32_t g = 1; g < G; g++)
            if (jobs[g].n_pieces > 0)
                epyq_pool_start(pools[g], group_task, &jobs[g], jobs[g].n_pieces);
        if (jobs[0].n_pieces > 0) epyq_pool_run(pools[0], group_task, &jobs[0], jobs[0].n_pieces);
        for (int32_t g = 1; g < G; g++)
            if (jobs[g].n_pieces > 0) epyq_pool_wait(pools[g]);
    }
}

/* A fused expert over split linears: group g's tasks of one phase. */
typedef struct {
    const epyq_model *m;
    const epyq_rlin *gate, *up, *down; /* this group's parts */
    int32_t row0, drow0;               /* where its gate/up rows and its down rows start */
    const epyq_act *x;
    int32_t n, I, pieces;
    epyq_numpath path;
    const float *rw;
    float *h, *y; /* h [n][I]: phase 1 writes its rows, phase 2 reads all */
    int32_t ldy;
    bool down_phase;
    atomic_int *failed;
} expert_job;

static void expert_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    const expert_job *j = ctx;
    const epyq_model *m = j->m;
    const epyq_rlin *l = j->down_phase ? j->down : j->gate;
    /* the part's rows in pieces of whole 16-row tiles (the two phases' contract) */
    int32_t tiles = (l->n + 15) / 16;
    int32_t a = (int32_t)((int64_t)tiles * task / j->pieces * 16);
    int32_t b =
        task == j->pieces - 1 ? l->n : (int32_t)((int64_t)tiles * (task + 1) / j->pieces * 16);
    if (b > l->n) b = l->n;
    if (a >= b) return;
    void *scratch = epyq_model_alloc(m->kt->w4_expert_scratch_bytes(j->n, j->I, m->d.H), 1);
    if (!scratch) {
        atomic_store(j->failed, 1);
        return;
    }
    if (j->down_phase)
        m->kt->w4_expert_down(&l->w4, a, b, 0, j->I, j->h, j->n, j->path, j->rw, j->y + j->drow0,
                              j->ldy, scratch);
    else
        m->kt->w4_expert_gu(&j->gate->w4, &j->up->w4, a, b, j->x, j->h + j->row0 + a, j->I,
                            scratch);
    free(scratch);
}

/* Every group's tasks at once: groups 1.. started, group 0 run by the driver, then waited. */
static void run_groups(epyq_model_numa *nm, epyq_task_fn fn, expert_job *jobs,
                       const int32_t *n_tasks) {
    epyq_pool **pools = nm->setup->rt->pools;
    for (int32_t g = 1; g < nm->n_groups; g++)
        if (n_tasks[g] > 0) epyq_pool_start(pools[g], fn, &jobs[g], n_tasks[g]);
    if (n_tasks[0] > 0) epyq_pool_run(pools[0], fn, &jobs[0], n_tasks[0]);
    for (int32_t g = 1; g < nm->n_groups; g++)
        if (n_tasks[g] > 0) epyq_pool_wait(pools[g]);
}

epyq_status epyq_numa_expert_run(epyq_model *m, const epyq_rlin *gate, const epyq_rlin *up,
                                 const epyq_rlin *down, const epyq_act *x, epyq_numpath path,
                                 const float *rw, float *y, int32_t ldy, epyq_err *err) {
    epyq_model_numa *nm = m->numa;
    const int32_t G = nm->n_groups, n = x->m, I = gate->n;
    expert_job *jobs = calloc((size_t)G, sizeof *jobs);
    int32_t *n_tasks = calloc((size_t)G, sizeof *n_tasks);
    float *h = epyq_model_alloc_raw((size_t)n * (size_t)I, sizeof(float)); /* every row written */
    atomic_int failed = 0;
    if (!jobs || !n_tasks || !h) {
        free(jobs), free(n_tasks), free(h);
        return epyq_err_set(err, EPYQ_E_NOMEM, "shared expert on the NUMA nodes: out of memory");
    }
    for (int32_t g = 0; g < G; g++) {
        const epyq_rlin *pg = &gate->split->part[g], *pu = &up->split->part[g];
        jobs[g] = (expert_job){.m = m,
                               .gate = pg,
                               .up = pu,
                               .down = &down->split->part[g],
                               .row0 = gate->split->row0[g],
                               .drow0 = down->split->row0[g],
                               .x = x,
                               .n = n,
                               .I = I,
                               .pieces = epyq_pool_size(nm->setup->rt->pools[g]),
                               .path = path,
                               .rw = rw,
                               .h = h,
                               .y = y,
                               .ldy = ldy,
                               .failed = &failed};
        n_tasks[g] = pg->n > 0 ? jobs[g].pieces : 0;
        if (pg->n > 0) count(nm, g, nm->dbufs_local[g], epyq_rlin_bytes(pg) + epyq_rlin_bytes(pu));
    }
    run_groups(nm, expert_task, jobs, n_tasks);
    for (int32_t g = 0; g < G; g++) {
        jobs[g].down_phase = true;
        n_tasks[g] = jobs[g].down->n > 0 ? jobs[g].pieces : 0;
        if (jobs[g].down->n > 0) count(nm, g, nm->dbufs_local[g], epyq_rlin_bytes(jobs[g].down));
    }
    if (!atomic_load(&failed)) run_groups(nm, expert_task, jobs, n_tasks);
    free(jobs), free(n_tasks), free(h);
    if (atomic_load(&failed))
        return epyq_err_set(err, EPYQ_E_NOMEM, "shared expert on the NUMA nodes: out of memory");
    return EPYQ_OK;
}
