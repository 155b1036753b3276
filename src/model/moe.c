/* src/model/moe.c — the MoE block over a batch (model.md §5.7).
 *
 * The batch's tokens are grouped per expert (the shared expert is one more "expert" that every
 * token visits), each expert runs once over its tokens in chunks of at most MOE_CHUNK rows, and
 * every (token, top-k slot) result lands in its own row; a token's outputs are then summed in
 * its top-k order, shared expert last. So a token's result does not depend on which other
 * tokens share its batch, how they were chunked, or the thread count. */
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
    const int32_t *ent_tok;  /* [entries] token of each (expert, token) entry, grouped by expert */
    const int32_t *ent_row;  /* [entries] output row: t * (topk + 1) + slot */
    const float *ent_w;      /* [entries] routing weight (shared: sigmoid gate) */
    const int32_t *e_off;    /* [E + 2] entry offsets per expert (E = shared) */
    const moe_task_t *tasks;
    float *ys;               /* [T][topk + 1][H] */
    atomic_int failed;
} moe_job;

/* down(silu(gate x) * up x) * rw over n gathered rows, dense bf16 weights */
static bool dense_expert(const epyq_model *m, const epyq_rlin *gate, const epyq_rlin *up,
                         const epyq_rlin *down, const epyq_act *xa, const float *rw, int32_t n,
                         float *y) {
    int32_t I = gate->n;
    float *g = malloc((size_t)n * I * sizeof(float)), *u = malloc((size_t)n * I * sizeof(float));
    if (!g || !u) {
        free(g), free(u);
        return false;
    }
    epyq_rlin_rows(m, gate, 0, I, xa, g, I);
    epyq_rlin_rows(m, up, 0, I, xa, u, I);
    for (size_t i = 0; i < (size_t)n * I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    epyq_act ha = {.m = n, .k = I, .gs = m->gs, .path = EPYQ_PATH_A16, .f32 = g, .buf = NULL};
    epyq_rlin_rows(m, down, 0, down->n, &ha, y, down->n);
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
    const epyq_moe_rw *mw = j->mw;
    bool shared = tk->e == m->E;
    const epyq_rlin *gate = shared ? &mw->sh_gate : &mw->gate[tk->e];
    const epyq_rlin *up = shared ? &mw->sh_up : &mw->up[tk->e];
    const epyq_rlin *down = shared ? &mw->sh_down : &mw->down[tk->e];
    int32_t n = tk->n, H = m->H, base = j->e_off[tk->e] + tk->off;
    float *xg = malloc((size_t)n * H * sizeof(float)), *y = malloc((size_t)n * H * sizeof(float));
    float rw[MOE_CHUNK];
    void *abuf = NULL, *scratch = NULL;
    bool ok = xg && y;
    for (int32_t r = 0; ok && r < n; r++) {
        memcpy(xg + (size_t)r * H, j->x + (size_t)j->ent_tok[base + r] * H, (size_t)H * sizeof(float));
        rw[r] = j->ent_w[base + r];
    }
    /* int8 activations only in the routed experts (see epyq_model_opts.path) */
    epyq_numpath path = shared ? EPYQ_PATH_A16 : m->path;
    epyq_act xa = {.m = n, .k = H, .gs = m->gs, .path = path, .f32 = xg, .buf = NULL};
    if (ok && gate->q4) {
        abuf = epyq_model_alloc(epyq_act_bytes(n, H, m->gs, path), 1);
        scratch = epyq_model_alloc(m->kt->w4_expert_scratch_bytes(n, gate->n, H), 1);
        ok = abuf && scratch;
        if (ok) {
            m->kt->act_prep(&xa, xg, n, H, m->gs, path, abuf);
            m->kt->w4_expert(&gate->w4, &up->w4, &down->w4, 0, gate->n, &xa, rw, y, H, scratch);
        }
    } else if (ok) {
        ok = dense_expert(m, gate, up, down, &xa, rw, n, y);
    }
    for (int32_t r = 0; ok && r < n; r++)
        memcpy(j->ys + (size_t)j->ent_row[base + r] * H, y + (size_t)r * H, (size_t)H * sizeof(float));
    if (!ok) atomic_store(&j->failed, 1);
    free(xg), free(y), free(abuf), free(scratch);
}

/* softmax over E, top-k by probability (ties to the lower id), renormalised */
static void route(const float *logit, int32_t E, int32_t k, int32_t *sel, float *w) {
    double mx = -INFINITY, tot = 0.0;
    double p[1024];
    for (int32_t e = 0; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
    /* the softmax normaliser cancels in the renormalisation, so it is never formed */
    for (int32_t e = 0; e < E; e++) p[e] = exp(logit[e] - mx);
    uint64_t taken[16] = {0};
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

epyq_status epyq_moe_block(epyq_model *m, const epyq_moe_rw *mw, int32_t T, const float *x,
                           float *out, epyq_err *err) {
    int32_t E = m->E, K = m->topk, H = m->H, S = K + 1;
    if (E > 1024) return epyq_err_set(err, EPYQ_E_UNSUPPORTED, "MoE: %d experts (at most 1024)", E);
    size_t n_ent = (size_t)T * S;
    float *logit = epyq_model_alloc((size_t)T * E, sizeof(float));
    float *sg = epyq_model_alloc((size_t)T, sizeof(float));
    int32_t *sel = malloc((size_t)T * K * sizeof(int32_t));
    float *wt = malloc((size_t)T * K * sizeof(float));
    int32_t *e_off = calloc((size_t)E + 2, sizeof(int32_t));
    int32_t *ent_tok = malloc(n_ent * sizeof(int32_t)), *ent_row = malloc(n_ent * sizeof(int32_t));
    float *ent_w = malloc(n_ent * sizeof(float));
    /* at most one partial chunk per expert beyond the full ones */
    moe_task_t *tasks = malloc((n_ent / MOE_CHUNK + (size_t)E + 2) * sizeof(moe_task_t));
    float *ys = epyq_model_alloc(n_ent * H, sizeof(float));
    epyq_act act = {0};
    void *abuf = NULL;
    epyq_status st = logit && sg && sel && wt && e_off && ent_tok && ent_row && ent_w && tasks && ys
                         ? EPYQ_OK : epyq_err_set(err, EPYQ_E_NOMEM, "MoE over %d tokens: out of memory", T);
    if (st == EPYQ_OK) st = epyq_rlin_act(m, x, T, H, &act, &abuf, err);
    if (st == EPYQ_OK) {
        epyq_rlin_run(m, &mw->router, &act, logit, E);
        epyq_rlin_run(m, &mw->sh_expert_gate, &act, sg, 1);
        for (int32_t t = 0; t < T; t++) {
            route(logit + (size_t)t * E, E, K, sel + (size_t)t * K, wt + (size_t)t * K);
            sg[t] = 1.0f / (1.0f + expf(-sg[t]));
        }
        /* counting sort of (token, slot) entries by expert; the shared expert is entry E */
        for (int32_t t = 0; t < T; t++) {
            for (int32_t i = 0; i < K; i++) e_off[sel[(size_t)t * K + i] + 1]++;
            e_off[E + 1]++;
        }
        for (int32_t e = 0; e <= E; e++) e_off[e + 1] += e_off[e];
        int32_t *fill = malloc(((size_t)E + 1) * sizeof(int32_t));
        if (!fill) st = epyq_err_set(err, EPYQ_E_NOMEM, "MoE: out of memory");
        if (st == EPYQ_OK) {
            memcpy(fill, e_off, ((size_t)E + 1) * sizeof(int32_t));
            for (int32_t t = 0; t < T; t++) {
                for (int32_t i = 0; i < K; i++) {
                    int32_t e = sel[(size_t)t * K + i], at = fill[e]++;
                    ent_tok[at] = t, ent_row[at] = t * S + i, ent_w[at] = wt[(size_t)t * K + i];
                }
                int32_t at = fill[E]++;
                ent_tok[at] = t, ent_row[at] = t * S + K, ent_w[at] = sg[t];
            }
            int32_t nt = 0;
            /* NUMA mode: the routed experts run on their nodes (numa_moe.c); only the shared one here */
            int32_t numa_layer = epyq_moe_numa_layer(m, mw);
            for (int32_t e = numa_layer >= 0 ? E : 0; e <= E; e++)
                for (int32_t off = 0; off < e_off[e + 1] - e_off[e]; off += MOE_CHUNK) {
                    int32_t n = e_off[e + 1] - e_off[e] - off;
                    tasks[nt++] = (moe_task_t){e, off, n < MOE_CHUNK ? n : MOE_CHUNK};
                }
            moe_job j = {m, mw, x, ent_tok, ent_row, ent_w, e_off, tasks, ys, 0};
            epyq_pool_run(m->pool, moe_task, &j, nt);
            if (atomic_load(&j.failed)) st = epyq_err_set(err, EPYQ_E_NOMEM, "MoE experts: out of memory");
            /* their sum lands in slot 0; slots 1..K-1 stay zero, so the sum below is unchanged */
            if (st == EPYQ_OK && numa_layer >= 0)
                st = epyq_moe_numa_run(m, numa_layer, mw, T, x, sel, wt, ys, S * H, err);
        }
        free(fill);
    }
    if (st == EPYQ_OK)
        for (int32_t t = 0; t < T; t++) {
            float *o = out + (size_t)t * H;
            const float *y = ys + (size_t)t * S * H;
            memcpy(o, y, (size_t)H * sizeof(float));
            for (int32_t s = 1; s < S; s++)
                for (int32_t i = 0; i < H; i++) o[i] += y[(size_t)s * H + i];
        }
    free(logit), free(sg), free(sel), free(wt), free(e_off), free(ent_tok), free(ent_row), free(ent_w);
    free(tasks), free(ys), free(abuf);
    return st;
}
