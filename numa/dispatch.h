/* numa/dispatch.h — routed-expert (MoE) dispatch to the nodes that hold the experts.
 *
 * Promise: epyq_moe_dispatch_run() takes the router's top-k choice for a batch of tokens
 * (expert ids and weights, [n_tokens][top_k]), groups the tokens of each expert, gives every
 * (expert, intermediate slice, token chunk) "unit" to the pool of the plan group that holds
 * the expert (or that slice of it, when the plan places slices: its n_slices must then be the
 * dispatch's), runs all groups at once (the calling thread drives group 0 and starts the
 * others), and then sums the units' output rows into y in a fixed order: for each token,
 * its top-k slots in router order, and within a slot the slices in ascending order. Each unit
 * writes its own rows, so y is bit-identical whatever the number of nodes, groups and
 * threads, provided the callback computes each token row independently of the others in its
 * unit. n_slices is therefore part of the numerics and must not be derived from thread
 * counts; choose it from the model (e.g. intermediate 512 / 128 = 4 slices for decode).
 *
 * The callback is generic so the forward pass plugs in the fused expert kernel
 * (kern.h w4_expert, whose rw argument takes unit->weights and whose [i0, i1) is the slice). */
#ifndef EPYQ_NUMA_DISPATCH_H
#define EPYQ_NUMA_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "numa/place.h"
#include "numa/plan.h"

typedef struct {
    int32_t layer;
    int32_t expert;
    int32_t slice;           /* this unit covers intermediate slice `slice` of n_slices */
    int32_t n_slices;
    int32_t n_tokens;
    const int32_t *tokens;   /* [n_tokens] batch row of each token, ascending */
    const float *weights;    /* [n_tokens] routing weight of this expert for each token */
} epyq_moe_unit;

/* Write (do not accumulate) out[i][0..width) for every token i of the unit; out row stride ldo.
 * group: the plan group running it; worker: index in that group's pool (for scratch). */
typedef void (*epyq_moe_fn)(void *ctx, const epyq_moe_unit *u, float *out, int32_t ldo, int32_t group,
                            int32_t worker);

typedef struct {
    int32_t max_tokens;      /* largest batch run() accepts */
    int32_t top_k;           /* router slots per token */
    int32_t n_slices;        /* intermediate slices per expert (>= 1), fixed for bit-identity */
    int32_t width;           /* floats per output row (hidden size) */
    int32_t max_unit_tokens; /* split an expert's tokens into chunks of at most this; 0 = no split */
} epyq_moe_dims;

typedef struct epyq_moe_dispatch epyq_moe_dispatch;

/* rt's pools run the work; rt->plan says which group holds each (layer, expert[, slice]). */
epyq_status epyq_moe_dispatch_create(epyq_moe_dispatch **out, const epyq_numa_rt *rt, const epyq_moe_dims *dims,
                                     epyq_err *err);
void epyq_moe_dispatch_free(epyq_moe_dispatch *d);

/* y [n_tokens][ldy]: overwritten with the routed sum, or added to when accumulate (e.g. on
 * top of the shared expert's output). experts/weights: [n_tokens][top_k] router output. */
epyq_status epyq_moe_dispatch_run(epyq_moe_dispatch *d, int32_t layer, int32_t n_tokens, const int32_t *experts,
                                  const float *weights, epyq_moe_fn fn, void *ctx, float *y, int32_t ldy,
                                  bool accumulate, epyq_err *err);

/* Units each group ran in the last run() (for tests and the benchmark); -1 for a bad group. */
int32_t epyq_moe_dispatch_units(const epyq_moe_dispatch *d, int32_t group);

#endif
