/* src/model/prof.h — where a forward call's time goes, by block (issue 12 deliverable 1).
 *
 * Promise: with profiling on (epyq_model_prof_enable), every epyq_model_forward adds the wall
 * time of each block below to the model's counters, as seen by the driver thread: a block's
 * time includes the pool runs it starts, so the phases add up to the forward's wall time
 * (less the untimed bookkeeping between them). Off (the default), each mark is one branch.
 * The pool's driver wait (time the driver spent at a run's end waiting for other workers) is
 * read from the pool and reported beside the phases: it is part of them, not extra. */
#ifndef EPYQ_PROF_H
#define EPYQ_PROF_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    EPYQ_PROF_EMBED,     /* embedding rows (and image features) into the residual */
    EPYQ_PROF_NORM,      /* the layers' RMS norms and residual adds */
    EPYQ_PROF_GDN_PROJ,  /* DeltaNet: activation prep + qkv/z/b/a projections */
    EPYQ_PROF_GDN_CORE,  /* DeltaNet: conv, gates, delta rule (recurrent or chunked), gated norm */
    EPYQ_PROF_GDN_OUT,   /* DeltaNet: activation prep + out projection */
    EPYQ_PROF_ATTN_PROJ, /* attention: activation prep + q/k/v projections */
    EPYQ_PROF_ATTN_CORE, /* attention: norms, rotary, KV store, softmax(QK)V, gate */
    EPYQ_PROF_ATTN_OUT,  /* attention: activation prep + o projection */
    EPYQ_PROF_ROUTER,    /* MoE: activation prep, router and shared-gate GEMV, top-k, grouping */
    EPYQ_PROF_EXPERTS,   /* MoE: routed and shared experts (gather, act prep, kernels, scatter) */
    EPYQ_PROF_MOE_SUM,   /* MoE: the per-token sum of the expert rows */
    EPYQ_PROF_HEAD,      /* final norm, row packing, lm_head */
    EPYQ_PROF_N
} epyq_prof_phase;

typedef struct {
    uint64_t ns[EPYQ_PROF_N]; /* wall ns per phase since the last reset */
    uint64_t forwards;        /* forward calls counted */
    uint64_t pool_runs;       /* pool runs the driver waited on */
    uint64_t pool_wait_ns;    /* of which spent waiting for the other workers */
} epyq_prof;

/* A short name per phase ("gdn_proj", ...), for tables. */
const char *epyq_prof_phase_name(epyq_prof_phase ph);

#endif
