/* src/model/moe.c — the MoE block over a batch (docs/architecture.md §4.6).
 *
 * The batch's tokens are grouped per expert (the shared expert is one more "expert" that every
 * token visits), each expert runs once over its tokens in chunks of at most MOE_CHUNK rows, and
 * every (token, top-k slot) result lands in its own row; a token's outputs are then summed in
 * its top-k order, shared expert last. So a token's result does not depend on which other
 * tokens share its batch, how they were chunked, or the thread count.
 *
 * A small batch has too few whole-expert tasks to share out evenly: one token's 8 routed
 * experts and the shared one are 9 equal tasks, 5 for one thread and 4 for the other with 2
 * threads. Then every expert runs in two pool runs of p pieces each (split_pieces): gate/up
 * by intermediate rows, then down by output rows. The kernels promise that the two phases
 * give w4_expert's bits (kern.h), so the results are those of the whole-expert tasks. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

#define MOE_CHUNK 32

typedef struct {
    int32_t e;      /* expert, or E for the shared expert */
    int32_t off, n; /* rows [off, off + n) of the expert's entry list */
} moe_task_t;

typedef struct {
    const epyq_model *m;
    const epyq_moe_rw *mw;
    const float *x;          /* [T][H] normed input */
    const epyq_act *xr;      /* x prepared for the routed experts' path, or NULL */
    const epyq_act *xd;      /* x prepared for the dense path (the router's input), or NULL */
    const int32_t *ent_tok;  /* [entries] token of each (expert, token) entry, grouped by expert */
    const int32_t *ent_row;  /* [entries] output row: t * (topk + 1) + slot */
    const float *ent_w;      /* [entries] routing weight (shared: sigmoid gate) */
    const int32_t *e_off;    /* [E + 2] entry offsets per expert (E = shared) */
    const moe_task_t *tasks;
    float *ys;               /* [T][topk + 1][H] */
    atomic_int failed;
    /* split mode only (pieces > 1) */
    int32_t pieces;          /* pieces per expert phase */
    int32_t ld_h;            /* floats per entry of h: the widest expert's intermediate size */
    float *h;                /* [entries][ld_h] silu(gate x) * up x, in entry order */
    float *ye;               /* [entries][H] expert outputs, in entry order */
} moe_job;

static void expert_lins(const moe_job *j, int32_t e, const epyq_rlin **gate, const epyq_rlin **up,
                        const epyq_rlin **down) {
    bool shared = e == j->m->d.E;
    *gate = shared ? &j->mw->sh_gate : &j->mw->gate[e];
    *up = shared ? &j->mw->sh_up : &j->mw->up[e];
    *down = shared ? &j->mw->sh_down : &j->mw->down[e];
}

/* int8 activations in the routed experts, in the shared one only with a8all (epyq_model_opts.path)
 */
static epyq_numpath expert_path(const moe_job *j, int32_t e) {
    return e == j->m->d.E ? epyq_path_dense(j->m) : epyq_path_experts(j->m);
}

/* Rows [r0, r1) of piece `piece` of n rows in p pieces, whole 16-row tiles. */
static void piece_rows(int32_t n, int32_t piece, int32_t p, int32_t *r0, int32_t *r1) {
    int32_t tiles = (n + 15) / 16;
    *r0 = tiles * piece / p * 16;
    *r1 = tiles * (piece + 1) / p * 16;
    if (*r1 > n) *r1 = n;
}

/* The input rows of a task's entries [base, base + n): xg [n][H], in the act-order column
 * order of the expert's gate/up when they have one (perm, see epyq_rlin_load_expert). */
static void gather_rows(const moe_job *j, int32_t base, int32_t n, const int32_t *perm, float *xg) {
    int32_t H = j->m->d.H;
    for (int32_t r = 0; r < n; r++) {
        const float *x = j->x + (size_t)j->ent_tok[base + r] * H;
        if (perm)
            for (int32_t c = 0; c < H; c++) xg[(size_t)r * H + c] = x[perm[c]];
        else
            memcpy(xg + (size_t)r * H, x, (size_t)H * sizeof(float));
    }
}

/* Prepared input rows of a task (abuf owned): its tokens' rows of the batch's prepared x when
 * there is one for the path (the same bytes: a row's preparation depends on that row alone),
 * else the f32 rows gathered into *xg [n][H] (in act order by perm; allocated here when NULL,
 * the caller frees it) and prepared. */
static bool task_input(const moe_job *j, int32_t base, int32_t n, epyq_numpath path,
                       const int32_t *perm, float **xg, epyq_act *xa, void **abuf) {
    const epyq_model *m = j->m;
    int32_t H = m->d.H;
    const epyq_act *src = perm                           ? NULL
                          : j->xr && j->xr->path == path ? j->xr
                          : j->xd && j->xd->path == path ? j->xd
                                                         : NULL;
    *abuf = epyq_model_alloc(epyq_act_bytes(n, H, m->gs, path), 1);
    if (!*abuf) return false;
    if (src) {
        epyq_act_gather(src, j->ent_tok + base, n, *abuf, xa);
        return true;
    }
    if (!*xg && !(*xg = malloc((size_t)n * H * sizeof(float)))) return false;
    gather_rows(j, base, n, perm, *xg);
    m->kt->act_prep(xa, *xg, n, H, m->gs, path, *abuf);
    return true;
}

/* All rows of l: on the calling thread inside a pool task, or (driver set: a shared expert split
 * over the NUMA nodes) on every node's pool at once, each row the same bits. */
static void expert_rows(const epyq_model *m, epyq_model *driver, const epyq_rlin *l,
                        const epyq_act *a, float *y, int32_t ldy) {
    if (driver) epyq_numa_dense_run(driver, &(epyq_rlin_out){l, y, ldy}, 1, &a);
    else
        epyq_rlin_rows(m, l, 0, l->n, a, y, ldy);
}

/* down(silu(gate x) * up x) * rw over n gathered rows: bf16 weights, or the two int4 planes
 * of an int8-requantised shared expert (xa then prepared for A16) */
static bool dense_expert(const epyq_model *m, epyq_model *driver, const epyq_rlin *gate,
                         const epyq_rlin *up, const epyq_rlin *down, const epyq_act *xa,
                         const float *rw, int32_t n, float *y) {
    int32_t I = gate->n;
    float *g = malloc((size_t)n * I * sizeof(float)), *u = malloc((size_t)n * I * sizeof(float));
    if (!g || !u) {
        free(g), free(u);
        return false;
    }
    expert_rows(m, driver, gate, xa, g, I);
    expert_rows(m, driver, up, xa, u, I);
    for (size_t i = 0; i < (size_t)n * I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    epyq_act ha = {.m = n, .k = I, .gs = m->gs, .path = epyq_path_dense(m), .f32 = g, .buf = NULL};
    void *hbuf = NULL;
    if (down->q4) { /* an int8-requantised shared expert (two int4 planes, requant.c) */
        hbuf = epyq_model_alloc(epyq_act_bytes(n, I, m->gs, epyq_path_dense(m)), 1);
        if (!hbuf) {
            free(g), free(u);
            return false;
        }
        m->kt->act_prep(&ha, g, n, I, m->gs, ha.path, hbuf);
    }
    expert_rows(m, driver, down, &ha, y, down->n);
    free(hbuf);
    for (int32_t r = 0; r < n; r++)
        for (int32_t i = 0; i < down->n; i++) y[(size_t)r * down->n + i] *= rw[r];
    free(g), free(u);
    return true;
}

static void moe_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    moe_job *j = ctx;
    const epyq_model *m = j->m;
    const moe_task_t *tk = &j->tasks[task];
    const epyq_rlin *gate, *up, *down;
    expert_lins(j, tk->e, &gate, &up, &down);
    int32_t n = tk->n, H = m->d.H, base = j->e_off[tk->e] + tk->off;
    float *xg = NULL, *y = malloc((size_t)n * H * sizeof(float));
    const float *rw = j->ent_w + base; /* routing weights of the task's entries, in order */
    void *abuf = NULL, *scratch = NULL;
    bool ok = y != NULL;
    epyq_act xa;
    if (ok && gate->q4 && gate->requant != EPYQ_REQUANT_INT8) {
        ok = task_input(j, base, n, expert_path(j, tk->e), gate->perm, &xg, &xa, &abuf);
        scratch = ok ? epyq_model_alloc(m->kt->w4_expert_scratch_bytes(n, gate->n, H), 1) : NULL;
        ok = ok && scratch;
        if (ok) m->kt->w4_expert(&gate->w4, &up->w4, &down->w4, 0, gate->n, &xa, rw, y, H, scratch);
    } else if (ok) {
        if (gate->q4) ok = task_input(j, base, n, epyq_path_dense(m), gate->perm, &xg, &xa, &abuf);
        else if ((ok = (xg = malloc((size_t)n * H * sizeof(float))) != NULL))
            gather_rows(j, base, n, NULL, xg);
        if (ok && !gate->q4)
            xa = (epyq_act){.m = n, .k = H, .gs = m->gs, .path = EPYQ_PATH_A16, .f32 = xg, .buf = NULL};
        ok = ok && dense_expert(m, NULL, gate, up, down, &xa, rw, n, y);
    }
    for (int32_t r = 0; ok && r < n; r++)
        memcpy(j->ys + (size_t)j->ent_row[base + r] * H, y + (size_t)r * H, (size_t)H * sizeof(float));
    if (!ok) atomic_store(&j->failed, 1);
    free(xg), free(y), free(abuf), free(scratch);
}

/* Split mode: what task `task` of a phase works on — its expert's linears, tokens and entry
 * offset, and the piece's rows [r0, r1) of `rows_of_down ? down : gate` rows. */
typedef struct {
    const moe_task_t *tk;
    const epyq_rlin *gate, *up, *down;
    int32_t n, base, r0, r1;
    void *scratch; /* w4_expert_scratch_bytes(n, gate->n, H); NULL when out of memory */
} piece_t;

static piece_t piece_of(const moe_job *j, int32_t task, bool rows_of_down) {
    piece_t pc = {.tk = &j->tasks[task / j->pieces]};
    expert_lins(j, pc.tk->e, &pc.gate, &pc.up, &pc.down);
    pc.n = pc.tk->n, pc.base = j->e_off[pc.tk->e] + pc.tk->off;
    piece_rows(rows_of_down ? pc.down->n : pc.gate->n, task % j->pieces, j->pieces, &pc.r0, &pc.r1);
    pc.scratch =
        epyq_model_alloc(j->m->kt->w4_expert_scratch_bytes(pc.n, pc.gate->n, j->m->d.H), 1);
    return pc;
}

/* Split mode, phase 1: rows of one piece of an expert's h. */
static void moe_gu_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    moe_job *j = ctx;
    const epyq_model *m = j->m;
    piece_t pc = piece_of(j, task, false);
    float *xg = NULL;
    void *abuf = NULL;
    epyq_act xa;
    bool ok = pc.scratch && task_input(j, pc.base, pc.n, expert_path(j, pc.tk->e), pc.gate->perm,
                                       &xg, &xa, &abuf);
    if (ok && pc.r1 > pc.r0)
        m->kt->w4_expert_gu(&pc.gate->w4, &pc.up->w4, pc.r0, pc.r1, &xa,
                            j->h + (size_t)pc.base * j->ld_h + pc.r0, pc.gate->n, pc.scratch);
    if (!ok) atomic_store(&j->failed, 1);
    free(xg), free(abuf), free(pc.scratch);
}

/* Split mode, phase 2: output rows of one piece of an expert's down projection. */
static void moe_down_task(void *ctx, int32_t task, int32_t worker) {
    (void)worker;
    moe_job *j = ctx;
    const epyq_model *m = j->m;
    piece_t pc = piece_of(j, task, true);
    if (pc.scratch)
        m->kt->w4_expert_down(&pc.down->w4, pc.r0, pc.r1, 0, pc.gate->n,
                              j->h + (size_t)pc.base * j->ld_h, pc.n, expert_path(j, pc.tk->e),
                              j->ent_w + pc.base, j->ye + (size_t)pc.base * m->d.H, m->d.H,
                              pc.scratch);
    else
        atomic_store(&j->failed, 1);
    free(pc.scratch);
}

/* Pieces per expert phase for n_tasks equal whole-expert tasks on P threads: the p in 1..8
 * with the shortest makespan, ceil(n p / P) / p whole-expert times (fewest pieces on a tie),
 * if it saves at least 5% (the split costs a second hand-off); 1 for more than 8 P tasks,
 * which even out by themselves. 9 tasks on 2 threads: 2 pieces, 4.5 instead of 5. */
static int32_t split_pieces(int32_t n_tasks, int32_t P) {
    if (P <= 1 || n_tasks <= 0 || n_tasks > 8 * P) return 1;
    int32_t best = 1;
    for (int32_t p = 2; p <= 8; p++) {
        int64_t rp = ((int64_t)n_tasks * p + P - 1) / P, rb = ((int64_t)n_tasks * best + P - 1) / P;
        if (rp * best < rb * p) best = p; /* rp / p < rb / best */
    }
    int64_t whole = ((int64_t)n_tasks + P - 1) / P, split = ((int64_t)n_tasks * best + P - 1) / P;
    return split * 100 <= whole * best * 95 ? best : 1;
}

/* softmax over E, top-k by probability (ties to the lower id), renormalised */
static void route_all(const float *logit, int32_t E, int32_t k, int32_t *sel, float *w) {
    double mx = -INFINITY, tot = 0.0;
    double p[EPYQ_MAX_EXPERTS];
    for (int32_t e = 0; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
    /* the softmax normaliser cancels in the renormalisation, so it is never formed */
    for (int32_t e = 0; e < E; e++) p[e] = exp(logit[e] - mx);
    uint64_t taken[EPYQ_MAX_EXPERTS / 64] = {0};
    for (int32_t i = 0; i < k; i++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++)
            if (!(taken[e >> 6] >> (e & 63) & 1) && (best < 0 || p[e] > p[best])) best = e;
        taken[best >> 6] |= 1ull << (best & 63);
        sel[i] = best;
        tot += p[best];
    }
    for (int32_t i = 0; i < k; i++) w[i] = (float)(p[sel[i]] / tot);
}

/* route_all's result with k exps instead of E: exp is increasing, so the k most probable
 * experts are the k largest logits (ties to the lower id, as there), picked in one pass by
 * insertion into a sorted list. The weights are then route_all's operations on the same
 * values. A NaN logit, or a chosen probability that underflows to 0 (where route_all's ties
 * among zeros follow the id, not the logit), takes route_all itself. */
static void route(const float *logit, int32_t E, int32_t k, int32_t *sel, float *w) {
    if (k < 1 || k > E) return; /* the config check keeps 1 <= topk <= E */
    int32_t n = 0;
    for (int32_t e = 0; e < E; e++) {
        const float v = logit[e];
        if (v != v) {
            route_all(logit, E, k, sel, w);
            return;
        }
        if (n == k && !(v > logit[sel[k - 1]])) continue;
        int32_t j = n < k ? n++ : k - 1;
        for (; j > 0 && v > logit[sel[j - 1]]; j--) sel[j] = sel[j - 1];
        sel[j] = e;
    }
    const double mx = logit[sel[0]];
    double p[EPYQ_MAX_TOPK], tot = 0.0;
    for (int32_t i = 0; i < k; i++) tot += (p[i] = exp(logit[sel[i]] - mx));
    if (!(p[k - 1] > 0.0) || !isfinite(tot)) {
        route_all(logit, E, k, sel, w);
        return;
    }
    for (int32_t i = 0; i < k; i++) w[i] = (float)(p[i] / tot);
}

/* One MoE call's routing and buffers, what the steps below hand each other. An entry is one
 * (token, slot) pair: slots 0..K-1 are the token's routed experts in top-k order, slot K the
 * shared expert. */
typedef struct {
    int32_t T, E, K, S; /* tokens, routed experts, top-k, slots per token (K + 1) */
    float *logit;       /* [T][E] router logits */
    float *sg;          /* [T] shared-expert gate, after the sigmoid */
    int32_t *sel;       /* [T][K] chosen experts, in top-k order */
    float *wt;          /* [T][K] their renormalised weights */
    int32_t *e_off;     /* [E + 2] entries of expert e: [e_off[e], e_off[e + 1]); E = shared */
    int32_t *ent_tok;   /* [T * S] token of each entry, grouped by expert */
    int32_t *ent_row;   /* [T * S] its output row t * S + slot */
    float *ent_w;       /* [T * S] its weight (shared: the gate) */
    moe_task_t *tasks;  /* chunks of at most MOE_CHUNK entries of one expert */
    int32_t nt;         /* tasks in use */
    int32_t numa_layer; /* >= 0: the routed experts run on their nodes (numa_moe.c) */
    float *ys;          /* [T][S][H] one output row per entry */
} moe_plan;

static void moe_plan_free(moe_plan *p) {
    free(p->logit), free(p->sg), free(p->sel), free(p->wt), free(p->e_off);
    free(p->ent_tok), free(p->ent_row), free(p->ent_w), free(p->tasks), free(p->ys);
}

static epyq_status moe_plan_alloc(moe_plan *p, const epyq_model *m, int32_t T, epyq_err *err) {
    const int32_t E = m->d.E, K = m->d.topk, S = K + 1;
    const size_t n_ent = (size_t)T * S;
    *p = (moe_plan){.T = T, .E = E, .K = K, .S = S};
    p->logit = epyq_model_alloc((size_t)T * E, sizeof(float));
    p->sg = epyq_model_alloc((size_t)T, sizeof(float));
    p->sel = malloc((size_t)T * K * sizeof(int32_t));
    p->wt = malloc((size_t)T * K * sizeof(float));
    p->e_off = calloc((size_t)E + 2, sizeof(int32_t));
    p->ent_tok = malloc(n_ent * sizeof(int32_t));
    p->ent_row = malloc(n_ent * sizeof(int32_t));
    p->ent_w = malloc(n_ent * sizeof(float));
    /* at most one partial chunk per expert beyond the full ones */
    p->tasks = malloc((n_ent / MOE_CHUNK + (size_t)E + 2) * sizeof(moe_task_t));
    p->ys = epyq_model_alloc_raw(n_ent * m->d.H, sizeof(float)); /* zeroed in moe_run if need be */
    if (p->logit && p->sg && p->sel && p->wt && p->e_off && p->ent_tok && p->ent_row && p->ent_w &&
        p->tasks && p->ys)
        return EPYQ_OK;
    return epyq_err_set(err, EPYQ_E_NOMEM, "MoE over %d tokens: out of memory", T);
}

/* Tokens [t0, t1) of a plan: softmax top-k and the shared gate's sigmoid. */
static void route_rows(void *ctx, int32_t t0, int32_t t1) {
    moe_plan *p = ctx;
    for (int32_t t = t0; t < t1; t++) {
        route(p->logit + (size_t)t * p->E, p->E, p->K, p->sel + (size_t)t * p->K,
              p->wt + (size_t)t * p->K);
        p->sg[t] = 1.0f / (1.0f + expf(-p->sg[t]));
    }
}

/* Route: the router and the shared-expert gate over the prepared activation, then per token
 * softmax top-k and the gate's sigmoid (on the pool for a prompt's many tokens). */
static void moe_route(epyq_model *m, const epyq_moe_rw *mw, const epyq_act *act, moe_plan *p) {
    const epyq_rlin_out gates[] = {{&mw->router, p->logit, p->E}, {&mw->sh_expert_gate, p->sg, 1}};
    epyq_rlin_run_many(m, gates, 2, act);
    epyq_model_rows_run(m, p->T, EPYQ_ROWS_POOL_MIN, route_rows, p);
}

/* The pool tasks: each expert's entries in chunks of MOE_CHUNK, the longest first. The pool
 * hands tasks out in array order, so a long task late in the list kept one thread busy while
 * the other had nothing left: at 32 sequences the shared expert (32 rows, on the dense path)
 * came after some 200 one- or two-row routed tasks. The shared expert's chunks go first (its
 * rows cost more than a routed expert's: A16 on the exact path), then the routed chunks by
 * row count, longest first (a stable counting sort: equal counts keep expert order). Which
 * task runs when never changes a bit of the result (see the top of this file). */
static void moe_tasks(const epyq_model *m, const epyq_moe_rw *mw, moe_plan *p) {
    const int32_t E = p->E, *e_off = p->e_off;
    /* at[r]: chunks of rank r (the shared expert MOE_CHUNK + 1, a routed chunk its row count),
     * counted in pass 0, then where the next of them goes in pass 1 */
    int32_t at[MOE_CHUNK + 2] = {0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (int32_t r = MOE_CHUNK + 1, next = 0; r >= 1; r--) {
                const int32_t c = at[r];
                at[r] = next, next += c, p->nt = next;
            }
        for (int32_t e = 0; e <= E; e++) {
            /* NUMA mode runs the routed experts on their nodes and splits a shared expert over
             * them (shared_split); expert parallelism: this rank's routed experts, the shared
             * one on rank 0 */
            const bool pooled = e == E ? !mw->sh_gate.split : p->numa_layer < 0;
            if (!pooled || !epyq_model_ep_owns(m, e)) continue;
            for (int32_t off = 0; off < e_off[e + 1] - e_off[e]; off += MOE_CHUNK) {
                const int32_t left = e_off[e + 1] - e_off[e] - off;
                const int32_t n = left < MOE_CHUNK ? left : MOE_CHUNK,
                              r = e == E ? MOE_CHUNK + 1 : n;
                if (pass == 0) at[r]++;
                else
                    p->tasks[at[r]++] = (moe_task_t){e, off, n};
            }
        }
    }
}

/* Group: a counting sort of the entries by expert (the shared expert is expert E), then the
 * tasks, each expert's entries in chunks of MOE_CHUNK. Also counts the routed-expert weight
 * bytes this call streams into m->fwd_bytes. */
static epyq_status moe_group(epyq_model *m, const epyq_moe_rw *mw, moe_plan *p, epyq_err *err) {
    const int32_t T = p->T, E = p->E, K = p->K, S = p->S;
    int32_t *e_off = p->e_off;
    for (int32_t t = 0; t < T; t++) {
        for (int32_t i = 0; i < K; i++) e_off[p->sel[(size_t)t * K + i] + 1]++;
        e_off[E + 1]++;
    }
    for (int32_t e = 0; e <= E; e++) e_off[e + 1] += e_off[e];
    /* every routed expert a token chose, once (expert 0's size stands for all: NUMA mode packs
     * the others on their nodes) */
    uint64_t touched = 0;
    for (int32_t e = 0; e < E; e++) touched += e_off[e + 1] > e_off[e] && epyq_model_ep_owns(m, e);
    m->fwd_bytes += touched * (epyq_rlin_bytes(&mw->gate[0]) + epyq_rlin_bytes(&mw->up[0]) +
                               epyq_rlin_bytes(&mw->down[0]));
    int32_t *fill = malloc(((size_t)E + 1) * sizeof(int32_t));
    if (!fill) return epyq_err_set(err, EPYQ_E_NOMEM, "MoE: out of memory");
    memcpy(fill, e_off, ((size_t)E + 1) * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) {
        for (int32_t i = 0; i < K; i++) {
            int32_t e = p->sel[(size_t)t * K + i], at = fill[e]++;
            p->ent_tok[at] = t, p->ent_row[at] = t * S + i, p->ent_w[at] = p->wt[(size_t)t * K + i];
        }
        int32_t at = fill[E]++;
        p->ent_tok[at] = t, p->ent_row[at] = t * S + K, p->ent_w[at] = p->sg[t];
    }
    free(fill);
    /* NUMA mode: the routed experts run on their nodes (numa_moe.c), the shared one split over
     * them (shared_split); what is left is pool tasks */
    p->numa_layer = epyq_moe_numa_layer(m, mw);
    moe_tasks(m, mw, p);
    return EPYQ_OK;
}

/* NUMA mode: the shared expert's linears are split by rows over the nodes (numa_dense.c). It
 * runs from the driver, MOE_CHUNK tokens at a time like its pool tasks, each phase on every
 * node's pool at once, and writes the same rows of ys with the same bits. */
static epyq_status shared_split(epyq_model *m, moe_job *j, const moe_plan *p, epyq_err *err) {
    const int32_t E = m->d.E, H = m->d.H;
    const epyq_rlin *gate = &j->mw->sh_gate, *up = &j->mw->sh_up, *down = &j->mw->sh_down;
    const int32_t total = p->e_off[E + 1] - p->e_off[E];
    float *xg = malloc((size_t)MOE_CHUNK * H * sizeof(float)),
          *y = malloc((size_t)MOE_CHUNK * H * sizeof(float));
    epyq_status st =
        xg && y ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "shared expert: out of memory");
    for (int32_t off = 0; st == EPYQ_OK && off < total; off += MOE_CHUNK) {
        const int32_t n = total - off < MOE_CHUNK ? total - off : MOE_CHUNK,
                      base = p->e_off[E] + off;
        const float *rw = j->ent_w + base;
        void *abuf = NULL;
        epyq_act xa;
        if (gate->q4 && gate->requant != EPYQ_REQUANT_INT8) {
            st =
                task_input(j, base, n, expert_path(j, E), gate->perm, &xg, &xa, &abuf)
                    ? epyq_numa_expert_run(m, gate, up, down, &xa, expert_path(j, E), rw, y, H, err)
                    : epyq_err_set(err, EPYQ_E_NOMEM, "shared expert: out of memory");
        } else {
            bool ok = true;
            if (gate->q4)
                ok = task_input(j, base, n, epyq_path_dense(m), gate->perm, &xg, &xa, &abuf);
            else {
                gather_rows(j, base, n, NULL, xg);
                xa = (epyq_act){
                    .m = n, .k = H, .gs = m->gs, .path = EPYQ_PATH_A16, .f32 = xg, .buf = NULL};
            }
            if (!ok || !dense_expert(m, m, gate, up, down, &xa, rw, n, y))
                st = epyq_err_set(err, EPYQ_E_NOMEM, "shared expert: out of memory");
        }
        for (int32_t r = 0; st == EPYQ_OK && r < n; r++)
            memcpy(j->ys + (size_t)j->ent_row[base + r] * H, y + (size_t)r * H,
                   (size_t)H * sizeof(float));
        free(abuf);
    }
    free(xg), free(y);
    return st;
}

/* Run: every task on the pool, as whole-expert tasks or (small batches, int4 experts) in the
 * two split phases; then, in NUMA mode, the routed experts on their nodes. Fills p->ys. */
static epyq_status moe_run(epyq_model *m, const epyq_moe_rw *mw, const float *x, const epyq_act *xd,
                           moe_plan *p, epyq_err *err) {
    const int32_t H = m->d.H, nt = p->nt;
    const size_t n_ent = (size_t)p->T * p->S;
    moe_job j = {.m = m,
                 .mw = mw,
                 .x = x,
                 .xd = xd->buf && xd->gs == m->gs ? xd : NULL,
                 .ent_tok = p->ent_tok,
                 .ent_row = p->ent_row,
                 .ent_w = p->ent_w,
                 .e_off = p->e_off,
                 .tasks = p->tasks,
                 .ys = p->ys,
                 .pieces = 1};
    /* Each task writes its entries' rows of ys. In NUMA mode the routed entries are summed
     * into slot 0 by their nodes, and with expert parallelism other ranks' rows come in later:
     * then the rows no task writes must read as zero. */
    if (p->numa_layer >= 0 || m->ep) memset(p->ys, 0, n_ent * (size_t)H * sizeof(float));
    /* the tasks' experts: the routed ones unless placed, the shared one unless split */
    bool q4 = (mw->sh_gate.split || (mw->sh_gate.q4 && mw->sh_gate.requant != EPYQ_REQUANT_INT8)) &&
              (p->numa_layer >= 0 || mw->gate[0].q4);
    epyq_pool *pool = m->pool;
    /* x prepared once for the routed experts' tasks, instead of once per (token, expert) */
    const epyq_numpath rp = epyq_path_experts(m);
    epyq_act xr;
    void *xr_buf = NULL;
    if (j.xd && j.xd->path == rp) j.xr = j.xd;
    else if (p->numa_layer < 0 && mw->gate[0].q4 && mw->gate[0].requant != EPYQ_REQUANT_INT8 &&
             !mw->gate[0].perm &&
             (xr_buf = epyq_model_alloc(epyq_act_bytes(p->T, H, m->gs, rp), 1))) {
        m->kt->act_prep(&xr, x, p->T, H, m->gs, rp, xr_buf);
        j.xr = &xr;
    }
    j.pieces = q4 && m->moe_split ? split_pieces(nt, m->n_threads) : 1;
    if (j.pieces > 1) {
        j.ld_h = m->d.I > m->d.Is ? m->d.I : m->d.Is;
        j.h = epyq_model_alloc_raw(n_ent * (size_t)j.ld_h, sizeof(float));
        j.ye = epyq_model_alloc_raw(n_ent * (size_t)H, sizeof(float));
        if (!j.h || !j.ye) j.pieces = 1; /* the whole-expert tasks need no shared buffers */
    }
    if (j.pieces > 1) {
        epyq_pool_run(pool, moe_gu_task, &j, nt * j.pieces);
        if (!atomic_load(&j.failed)) epyq_pool_run(pool, moe_down_task, &j, nt * j.pieces);
        for (int32_t t = 0; t < nt && !atomic_load(&j.failed); t++)
            for (int32_t r = 0, base = p->e_off[p->tasks[t].e] + p->tasks[t].off; r < p->tasks[t].n;
                 r++)
                memcpy(p->ys + (size_t)p->ent_row[base + r] * H, j.ye + (size_t)(base + r) * H,
                       (size_t)H * sizeof(float));
    } else {
        epyq_pool_run(pool, moe_task, &j, nt);
    }
    free(j.h), free(j.ye), free(xr_buf);
    if (j.xr == &xr) j.xr = NULL; /* its bytes are gone; shared_split prepares its own */
    if (atomic_load(&j.failed))
        return epyq_err_set(err, EPYQ_E_NOMEM, "MoE experts: out of memory");
    if (mw->sh_gate.split && epyq_model_ep_owns(m, m->d.E)) TRY(shared_split(m, &j, p, err));
    /* their sum lands in slot 0; slots 1..K-1 stay zero, so the sum below is unchanged */
    if (p->numa_layer >= 0)
        TRY(epyq_moe_numa_run(m, p->numa_layer, mw, p->T, x, p->sel, p->wt, p->ys, p->S * H, err));
    return EPYQ_OK;
}

/* Sum: each token's output rows in slot order (its top-k order, the shared expert last). */
void epyq_moe_sum(const float *ys, int32_t t0, int32_t t1, int32_t S, int32_t H, float *out) {
    for (int32_t t = t0; t < t1; t++) {
        float *o = out + (size_t)t * H;
        const float *y = ys + (size_t)t * S * H;
        memcpy(o, y, (size_t)H * sizeof(float));
        for (int32_t s = 1; s < S; s++)
            for (int32_t i = 0; i < H; i++) o[i] += y[(size_t)s * H + i];
    }
}

typedef struct {
    const float *ys;
    int32_t S, H;
    float *out;
} sum_job;

static void sum_rows(void *ctx, int32_t t0, int32_t t1) {
    const sum_job *j = ctx;
    epyq_moe_sum(j->ys, t0, t1, j->S, j->H, j->out);
}

epyq_status epyq_moe_block(epyq_model *m, const epyq_moe_rw *mw, int32_t T, const float *x,
                           float *out, epyq_err *err) {
    if (m->d.E > EPYQ_MAX_EXPERTS)
        return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "MoE: %d experts (at most %d)", m->d.E,
                            EPYQ_MAX_EXPERTS);
    moe_plan p;
    epyq_act act = {0};
    void *abuf = NULL;
    epyq_status st = moe_plan_alloc(&p, m, T, err);
    if (st != EPYQ_OK) goto done;
    uint64_t t0 = epyq_prof_mark(m);
    if ((st = epyq_rlin_act(m, x, T, m->d.H, &act, &abuf, err)) != EPYQ_OK) goto done;
    moe_route(m, mw, &act, &p);
    if ((st = moe_group(m, mw, &p, err)) != EPYQ_OK) goto done;
    epyq_prof_add(m, EPYQ_PROF_ROUTER, &t0);
    if ((st = moe_run(m, mw, x, &act, &p, err)) != EPYQ_OK) goto done;
    epyq_prof_add(m, EPYQ_PROF_EXPERTS, &t0);
    /* expert parallelism: the rows of other ranks' experts come in, the sums go out */
    if (m->ep) st = epyq_moe_ep_combine(m, T, p.sel, p.ys, out, err);
    else
        epyq_model_rows_run(m, T, EPYQ_ROWS_POOL_MIN, sum_rows, &(sum_job){p.ys, p.S, m->d.H, out});
    epyq_prof_add(m, EPYQ_PROF_MOE_SUM, &t0);
done:
    moe_plan_free(&p);
    free(abuf);
    return st;
}
