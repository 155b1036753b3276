/* src/model/prof.c — the forward's time by block (prof.h). */
#include <stdlib.h>

#include "core/util.h"
#include "model/model_impl.h"
#include "numa/pool.h"

static const char *const names[EPYQ_PROF_N] = {
    [EPYQ_PROF_EMBED] = "embed",         [EPYQ_PROF_NORM] = "norm+residual",
    [EPYQ_PROF_GDN_PROJ] = "gdn_proj",   [EPYQ_PROF_GDN_CORE] = "gdn_core",
    [EPYQ_PROF_GDN_OUT] = "gdn_out",     [EPYQ_PROF_ATTN_PROJ] = "attn_proj",
    [EPYQ_PROF_ATTN_CORE] = "attn_core", [EPYQ_PROF_ATTN_OUT] = "attn_out",
    [EPYQ_PROF_ROUTER] = "moe_router",   [EPYQ_PROF_EXPERTS] = "moe_experts",
    [EPYQ_PROF_MOE_SUM] = "moe_sum",     [EPYQ_PROF_HEAD] = "lm_head",
};

const char *epyq_prof_phase_name(epyq_prof_phase ph) {
    return ph >= 0 && ph < EPYQ_PROF_N ? names[ph] : "?";
}

/* The pool counters at the last reset, so that a read gives what the profile saw. */
typedef struct {
    epyq_prof p;
    uint64_t runs0, wait0;
    uint64_t pruns, pwait; /* the pool counters when paused */
} prof_state;

bool epyq_model_prof_enable(epyq_model *m, bool on) {
    free(m->prof_held);
    m->prof_held = NULL;
    if (!on) {
        free(m->prof);
        m->prof = NULL;
        return true;
    }
    if (!m->prof && !(m->prof = calloc(1, sizeof(prof_state)))) return false;
    prof_state *s = m->prof;
    *s = (prof_state){0};
    if (m->pool) epyq_pool_stats(m->pool, &s->runs0, &s->wait0);
    return true;
}

void epyq_model_prof_pause(epyq_model *m, bool pause) {
    prof_state *s = pause ? m->prof : m->prof_held;
    if (!s) return;
    uint64_t runs = 0, wait = 0;
    if (m->pool) epyq_pool_stats(m->pool, &runs, &wait);
    if (pause) {
        s->pruns = runs, s->pwait = wait;
        m->prof_held = s, m->prof = NULL;
    } else { /* what the pool did meanwhile is not the profile's */
        s->runs0 += runs - s->pruns, s->wait0 += wait - s->pwait;
        m->prof = s, m->prof_held = NULL;
    }
}

bool epyq_model_prof_read(const epyq_model *m, epyq_prof *out) {
    const prof_state *s = m->prof;
    if (!s) return false;
    *out = s->p;
    if (m->pool) {
        uint64_t runs, wait;
        epyq_pool_stats(m->pool, &runs, &wait);
        out->pool_runs = runs - s->runs0, out->pool_wait_ns = wait - s->wait0;
    }
    return true;
}

uint64_t epyq_prof_mark(const epyq_model *m) { return m->prof ? (uint64_t)epyq_now_ns() : 0; }

void epyq_prof_add(epyq_model *m, epyq_prof_phase ph, uint64_t *t0) {
    if (!m->prof) return;
    uint64_t t = (uint64_t)epyq_now_ns();
    ((prof_state *)m->prof)->p.ns[ph] += t - *t0;
    *t0 = t;
}

void epyq_prof_forward_done(epyq_model *m) {
    if (m->prof) ((prof_state *)m->prof)->p.forwards++;
}
