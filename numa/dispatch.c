/* numa/dispatch.c — per-node MoE work lists and the fixed-order reduction (see dispatch.h).
 *
 * Layout: the (token, slot) entries of a batch are counting-sorted by expert (stable, so each
 * expert's tokens stay ascending). Entry j of the sorted order owns output row
 * s * (max_tokens * top_k) + j of the scratch for slice s, so a unit (expert, slice, chunk)
 * writes one contiguous block of rows and no two units share a row. */
#include "numa/dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

#define REDUCE_COLS 128 /* columns per reduction task: 512 B rows, 16 tasks per 2048-wide token */

typedef struct {
    int32_t expert;
    int32_t slice;
    int32_t start;    /* first sorted entry */
    int32_t n;        /* entries (tokens) */
} unit;

typedef struct {
    epyq_moe_dispatch *d;
    int32_t group;
    int32_t reduce_first;    /* this group's share of the reduction tasks */
} group_ctx;

struct epyq_moe_dispatch {
    const epyq_numa_rt *rt;
    epyq_moe_dims dims;
    int32_t n_groups;
    int32_t n_experts;       /* per layer, from the plan */
    int32_t n_layers;
    size_t slots;            /* max_tokens * top_k */

    int32_t *count;          /* [n_experts + 1] entries per expert, then prefix sums */
    int32_t *sorted_token;   /* [slots] token of each sorted entry */
    float *sorted_weight;    /* [slots] routing weight of each sorted entry */
    int32_t *pos;            /* [slots] sorted index of slot t * top_k + k */
    unit *units;             /* [slots * n_slices] */
    int32_t *group_units;    /* [n_groups][slots * n_slices] unit indices per group */
    int32_t *n_units;        /* [n_groups] */
    group_ctx *gctx;         /* [n_groups] */
    float *scratch;          /* [n_slices][slots][width] unit output rows */

    /* The current run. */
    int32_t layer;
    int32_t n_tokens;
    epyq_moe_fn fn;
    void *ctx;
    float *y;
    int32_t ldy;
    bool accumulate;
};

void epyq_moe_dispatch_free(epyq_moe_dispatch *d) {
    if (!d) return;
    free(d->count);
    free(d->sorted_token);
    free(d->sorted_weight);
    free(d->pos);
    free(d->units);
    free(d->group_units);
    free(d->n_units);
    free(d->gctx);
    free(d->scratch);
    free(d);
}

epyq_status epyq_moe_dispatch_create(epyq_moe_dispatch **out, const epyq_numa_rt *rt, const epyq_moe_dims *dims,
                                     epyq_err *err) {
    *out = NULL;
    const epyq_numa_plan *plan = rt->plan;
    if (dims->max_tokens < 1 || dims->top_k < 1 || dims->top_k > plan->n_experts || dims->n_slices < 1 ||
        dims->width < 1 || dims->max_unit_tokens < 0)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "moe dispatch: max_tokens %d, top_k %d (experts %d), n_slices %d, width %d, "
                            "max_unit_tokens %d; expected all >= 1 (chunk >= 0) and top_k <= experts",
                            (int)dims->max_tokens, (int)dims->top_k, (int)plan->n_experts, (int)dims->n_slices,
                            (int)dims->width, (int)dims->max_unit_tokens);
    size_t slots, n_unit, group_idx, scratch;
    if (!epyq_mul_size((size_t)dims->max_tokens, (size_t)dims->top_k, &slots) ||
        !epyq_mul_size(slots, (size_t)dims->n_slices, &n_unit) || n_unit > INT32_MAX ||
        !epyq_mul_size(n_unit, (size_t)rt->n_groups, &group_idx) ||
        !epyq_mul_size(n_unit, (size_t)dims->width, &scratch) || !epyq_mul_size(scratch, sizeof(float), &scratch))
        return epyq_err_set(err, EPYQ_E_ARG, "moe dispatch: %d tokens x top-%d x %d slices x %d floats overflows",
                            (int)dims->max_tokens, (int)dims->top_k, (int)dims->n_slices, (int)dims->width);
    if (plan->n_slices > 1 && plan->n_slices != dims->n_slices)
        return epyq_err_set(
            err, EPYQ_E_ARG,
            "moe dispatch: the plan places %d slices per expert, the dispatch runs %d; expected "
            "the same",
            (int)plan->n_slices, (int)dims->n_slices);
    epyq_moe_dispatch *d = calloc(1, sizeof *d);
    if (!d) return epyq_err_set(err, EPYQ_E_NOMEM, "moe dispatch: out of memory");
    d->rt = rt;
    d->dims = *dims;
    d->n_groups = rt->n_groups;
    d->n_experts = plan->n_experts;
    d->n_layers = plan->n_layers;
    d->slots = slots;
    d->count = calloc((size_t)plan->n_experts + 1, sizeof *d->count);
    d->sorted_token = malloc(slots * sizeof *d->sorted_token);
    d->sorted_weight = malloc(slots * sizeof *d->sorted_weight);
    d->pos = malloc(slots * sizeof *d->pos);
    d->units = malloc(n_unit * sizeof *d->units);
    d->group_units = malloc(group_idx * sizeof *d->group_units);
    d->n_units = calloc((size_t)rt->n_groups, sizeof *d->n_units);
    d->gctx = calloc((size_t)rt->n_groups, sizeof *d->gctx);
    d->scratch = aligned_alloc(64, (scratch + 63) / 64 * 64);
    if (!d->count || !d->sorted_token || !d->sorted_weight || !d->pos || !d->units || !d->group_units ||
        !d->n_units || !d->gctx || !d->scratch) {
        epyq_moe_dispatch_free(d);
        return epyq_err_set(err, EPYQ_E_NOMEM, "moe dispatch: out of memory for %zu bytes of scratch", scratch);
    }
    for (int32_t g = 0; g < rt->n_groups; g++) d->gctx[g] = (group_ctx){d, g, 0};
    *out = d;
    return EPYQ_OK;
}

int32_t epyq_moe_dispatch_units(const epyq_moe_dispatch *d, int32_t group) {
    return group >= 0 && group < d->n_groups ? d->n_units[group] : -1;
}

static float *unit_rows(epyq_moe_dispatch *d, const unit *u) {
    size_t row = (size_t)u->slice * d->slots + (size_t)u->start;
    return d->scratch + row * (size_t)d->dims.width;
}

static void group_task(void *vctx, int32_t task, int32_t worker) {
    group_ctx *gc = vctx;
    epyq_moe_dispatch *d = gc->d;
    const unit *u = &d->units[d->group_units[(size_t)gc->group * d->slots * (size_t)d->dims.n_slices + (size_t)task]];
    epyq_moe_unit pub = {.layer = d->layer,
                         .expert = u->expert,
                         .slice = u->slice,
                         .n_slices = d->dims.n_slices,
                         .n_tokens = u->n,
                         .tokens = d->sorted_token + u->start,
                         .weights = d->sorted_weight + u->start};
    d->fn(d->ctx, &pub, unit_rows(d, u), d->dims.width, gc->group, worker);
}

/* acc[0..n) += r[0..n). A full block has a constant trip count, which lets gcc -O2 (cheap
 * vectorizer cost model) use SIMD; the ragged last block of a row takes the general loop. */
static inline void add_row(float *restrict acc, const float *restrict r, int32_t n) {
    if (n == REDUCE_COLS) {
        for (int32_t c = 0; c < REDUCE_COLS; c++) acc[c] += r[c];
    } else {
        for (int32_t c = 0; c < n; c++) acc[c] += r[c];
    }
}

/* One task per (token, column block): fixed summation order, slot-major then slice. */
static void reduce_task(void *vctx, int32_t task_in_group, int32_t worker) {
    (void)worker;
    const group_ctx *gc = vctx;
    epyq_moe_dispatch *d = gc->d;
    int32_t task = gc->reduce_first + task_in_group;
    int32_t blocks = (d->dims.width + REDUCE_COLS - 1) / REDUCE_COLS;
    int32_t t = task / blocks;
    int32_t c0 = (task % blocks) * REDUCE_COLS;
    int32_t n = d->dims.width - c0 < REDUCE_COLS ? d->dims.width - c0 : REDUCE_COLS;
    float acc[REDUCE_COLS];
    float *yr = d->y + (size_t)t * (size_t)d->ldy + (size_t)c0;
    for (int32_t c = 0; c < n; c++) acc[c] = d->accumulate ? yr[c] : 0.0f;
    for (int32_t k = 0; k < d->dims.top_k; k++) {
        size_t j = (size_t)d->pos[(size_t)t * (size_t)d->dims.top_k + (size_t)k];
        for (int32_t s = 0; s < d->dims.n_slices; s++)
            add_row(acc, d->scratch + ((size_t)s * d->slots + j) * (size_t)d->dims.width + (size_t)c0, n);
    }
    memcpy(yr, acc, sizeof *acc * (size_t)n);
}

/* Units of a group, largest first (stable), so the pool's dynamic hand-out finishes evenly. */
static void sort_units(epyq_moe_dispatch *d, int32_t *list, int32_t n) {
    for (int32_t a = 1; a < n; a++)
        for (int32_t b = a; b > 0 && d->units[list[b]].n > d->units[list[b - 1]].n; b--) {
            int32_t tmp = list[b];
            list[b] = list[b - 1];
            list[b - 1] = tmp;
        }
}

epyq_status epyq_moe_dispatch_run(epyq_moe_dispatch *d, int32_t layer, int32_t n_tokens, const int32_t *experts,
                                  const float *weights, epyq_moe_fn fn, void *ctx, float *y, int32_t ldy,
                                  bool accumulate, epyq_err *err) {
    const epyq_numa_plan *plan = d->rt->plan;
    const int32_t K = d->dims.top_k, E = d->n_experts, S = d->dims.n_slices;
    if (n_tokens < 0 || n_tokens > d->dims.max_tokens)
        return epyq_err_set(err, EPYQ_E_ARG, "moe dispatch: %d tokens, expected 0..%d", (int)n_tokens,
                            (int)d->dims.max_tokens);
    if (layer < 0 || layer >= d->n_layers)
        return epyq_err_set(err, EPYQ_E_ARG, "moe dispatch: layer %d, the plan has %d", (int)layer, (int)d->n_layers);
    if (ldy < d->dims.width)
        return epyq_err_set(err, EPYQ_E_ARG, "moe dispatch: ldy %d < width %d", (int)ldy, (int)d->dims.width);
    if (n_tokens == 0) return EPYQ_OK;
    const size_t TK = (size_t)n_tokens * (size_t)K;

    /* Counting sort of the (token, slot) entries by expert. */
    memset(d->count, 0, sizeof *d->count * ((size_t)E + 1));
    for (size_t i = 0; i < TK; i++) {
        int32_t e = experts[i];
        if (e < 0 || e >= E)
            return epyq_err_set(err, EPYQ_E_ARG, "moe dispatch: layer %d token %zu slot %zu routes to expert %d of %d",
                                (int)layer, i / (size_t)K, i % (size_t)K, (int)e, (int)E);
        d->count[e + 1]++;
    }
    for (int32_t e = 0; e < E; e++) d->count[e + 1] += d->count[e];
    for (size_t i = 0; i < TK; i++) {
        int32_t j = d->count[experts[i]]++;
        d->sorted_token[j] = (int32_t)(i / (size_t)K);
        d->sorted_weight[j] = weights[i];
        d->pos[i] = j;
    }
    /* count[e] now holds the end of expert e; its start is count[e - 1] (0 for e = 0). */

    /* the group of each (expert, slice): the plan places whole experts or the same slices */
    const int32_t PS = plan->n_slices > 1 ? plan->n_slices : 1;
    const int16_t *owner = plan->expert_group + (size_t)layer * (size_t)E * (size_t)PS;
    const size_t per_group = d->slots * (size_t)S;
    int32_t chunk = d->dims.max_unit_tokens > 0 ? d->dims.max_unit_tokens : INT32_MAX;
    int32_t n_unit = 0;
    memset(d->n_units, 0, sizeof *d->n_units * (size_t)d->n_groups);
    for (int32_t e = 0; e < E; e++) {
        int32_t start = e ? d->count[e - 1] : 0, end = d->count[e];
        for (int32_t c = start, n; c < end; c += n) {
            n = end - c < chunk ? end - c : chunk;
            for (int32_t s = 0; s < S; s++) {
                int32_t g = owner[(size_t)e * (size_t)PS + (size_t)(PS > 1 ? s : 0)];
                d->units[n_unit] = (unit){e, s, c, n};
                d->group_units[(size_t)g * per_group + (size_t)d->n_units[g]++] = n_unit++;
            }
        }
    }
    for (int32_t g = 0; g < d->n_groups; g++) sort_units(d, d->group_units + (size_t)g * per_group, d->n_units[g]);

    d->layer = layer;
    d->n_tokens = n_tokens;
    d->fn = fn;
    d->ctx = ctx;
    d->y = y;
    d->ldy = ldy;
    d->accumulate = accumulate;
    epyq_pool **pools = d->rt->pools;
    for (int32_t g = 1; g < d->n_groups; g++)
        if (d->n_units[g]) epyq_pool_start(pools[g], group_task, &d->gctx[g], d->n_units[g]);
    epyq_pool_run(pools[0], group_task, &d->gctx[0], d->n_units[0]);
    for (int32_t g = 1; g < d->n_groups; g++)
        if (d->n_units[g]) epyq_pool_wait(pools[g]);

    /* The reduction is spread over every group in contiguous task ranges: which thread sums a
     * (token, block) does not change the order of the sum inside it. */
    int32_t blocks = (d->dims.width + REDUCE_COLS - 1) / REDUCE_COLS;
    int32_t total = n_tokens * blocks, G = d->n_groups;
    for (int32_t g = 0; g < G; g++) d->gctx[g].reduce_first = (int32_t)((int64_t)total * g / G);
    for (int32_t g = 1; g < G; g++) {
        int32_t n = (int32_t)((int64_t)total * (g + 1) / G) - d->gctx[g].reduce_first;
        if (n) epyq_pool_start(pools[g], reduce_task, &d->gctx[g], n);
    }
    epyq_pool_run(pools[0], reduce_task, &d->gctx[0], (int32_t)((int64_t)total / G));
    for (int32_t g = 1; g < G; g++)
        if ((int32_t)((int64_t)total * (g + 1) / G) > d->gctx[g].reduce_first) epyq_pool_wait(pools[g]);
    return EPYQ_OK;
}
