/* src/model/numa_state.c — a sequence's DeltaNet states on the nodes that update them.
 *
 * Why: the delta rule reads and writes every value head's Dk x Dv state once per token and
 * layer (64 KiB a head for the real model, 1.9 MiB a layer), all of it on the critical path of
 * decode. In NUMA mode value head vh belongs to one plan group (heads shared out in proportion
 * to threads, like the dense rows); its state block of every layer is bound to that group's
 * node and its delta-rule task runs on that group's pool, so the state never crosses a node.
 * The tasks are the same (sequence, head) tasks as the single-pool path, so the bits are too.
 * KV caches, conv histories and the speculative snapshots keep the default policy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/numa_impl.h"
#include "model/numa_moe.h"

epyq_status epyq_numa_heads_init(epyq_model *m, epyq_err *err) {
    epyq_model_numa *n = m->numa;
    const epyq_numa_plan *plan = n->setup->plan;
    n->head_group = calloc((size_t)m->d.Hv + 1, sizeof *n->head_group);
    n->head_jobs = calloc((size_t)n->n_groups, sizeof *n->head_jobs);
    if (!n->head_group || !n->head_jobs)
        return epyq_err_set(err, EPYQ_E_NOMEM, "NUMA DeltaNet heads: out of memory");
    int64_t cum = 0, tot = plan->n_threads > 0 ? plan->n_threads : 1;
    int32_t h = 0;
    for (int32_t g = 0; g < n->n_groups; g++) {
        cum += plan->groups[g].n_threads;
        int32_t end = g == n->n_groups - 1 ? m->d.Hv : (int32_t)((int64_t)m->d.Hv * cum / tot);
        for (; h < end; h++) n->head_group[h] = g;
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
    free(n->head_group), free(n->head_jobs);
    n->head_group = NULL, n->head_jobs = NULL;
}

int32_t epyq_numa_workers(const epyq_model *m) {
    const epyq_model_numa *n = m->numa;
    return n && n->head_group && n->head_workers > m->n_threads ? n->head_workers : m->n_threads;
}

/* Bytes of one (layer, head) state block, and whether blocks are whole pages (else binding
 * would move a neighbour's state with them: those are left to the default policy). */
static size_t block_bytes(const epyq_model *m) {
    return (size_t)m->d.Dk * (size_t)m->d.Dv * sizeof(float);
}

static bool blocks_paged(const epyq_model *m, const float *S) {
    return block_bytes(m) % 4096 == 0 && (uintptr_t)S % 4096 == 0;
}

epyq_status epyq_numa_state_place(const epyq_model *m, float *S, epyq_err *err) {
    const epyq_model_numa *n = m->numa;
    if (!n || !n->head_group || !S || !n->setup->plan->bind_memory || !blocks_paged(m, S))
        return EPYQ_OK;
    const size_t bb = block_bytes(m);
    for (int32_t l = 0; l < m->n_gdn; l++)
        for (int32_t vh = 0; vh < m->d.Hv; vh++) {
            const epyq_numa_group *gr = &n->setup->plan->groups[n->head_group[vh]];
            char what[96];
            snprintf(what, sizeof what, "DeltaNet state of layer %d head %d (node %d)", (int)l,
                     (int)vh, (int)gr->node);
            epyq_status st = epyq_numa_bind_range((uint8_t *)S + ((size_t)l * m->d.Hv + vh) * bb,
                                                  bb, gr->os_index, what, err);
            if (st != EPYQ_OK) return st;
        }
    return EPYQ_OK;
}

epyq_status epyq_seq_numa_verify(const epyq_seq *s, size_t *pages, size_t *elsewhere,
                                 epyq_err *err) {
    const epyq_model *m = s->m;
    const epyq_model_numa *n = m->numa;
    *pages = *elsewhere = 0;
    if (!n)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "NUMA verify: the model was loaded without a NUMA mode");
    if (!n->setup->plan->bind_memory || !s->S) return EPYQ_OK;
    if (!blocks_paged(m, s->S))
        return epyq_err_set(err, EPYQ_E_ARG,
                            "NUMA verify: DeltaNet state blocks of %zu bytes are not whole pages",
                            block_bytes(m));
    const size_t bb = block_bytes(m);
    epyq_status first = EPYQ_OK;
    for (int32_t l = 0; l < m->n_gdn; l++)
        for (int32_t vh = 0; vh < m->d.Hv; vh++) {
            const epyq_numa_group *gr = &n->setup->plan->groups[n->head_group[vh]];
            char what[96];
            snprintf(what, sizeof what, "DeltaNet state of layer %d head %d (node %d)", (int)l,
                     (int)vh, (int)gr->node);
            epyq_numa_verify_report rep;
            epyq_err e = {0};
            int32_t os = gr->os_index;
            epyq_status st =
                epyq_numa_verify((const uint8_t *)s->S + ((size_t)l * m->d.Hv + vh) * bb, bb, &os,
                                 1, what, &rep, &e);
            *pages += rep.pages, *elsewhere += rep.elsewhere;
            if (st != EPYQ_OK && first == EPYQ_OK) first = st, *err = e;
        }
    return first;
}

static void head_task(void *ctx, int32_t task, int32_t worker) {
    const epyq_numa_head_job *j = ctx;
    j->fn(j->ctx, j->tasks[task], j->worker0 + worker);
}

bool epyq_numa_run_heads(epyq_model *m, epyq_task_fn fn, void *ctx, int32_t n_seq, int32_t Hv) {
    epyq_model_numa *n = m->numa;
    if (!n || !n->head_group || Hv != m->d.Hv || (int64_t)n_seq * Hv > INT32_MAX) return false;
    const int32_t G = n->n_groups;
    /* task ids grouped by owner: group g's are the (sequence, head) pairs of its heads */
    int32_t *tasks = malloc((size_t)n_seq * (size_t)Hv * sizeof *tasks + 1);
    if (!tasks) return false; /* the caller runs them on its own pool: the same bits */
    int32_t at = 0;
    for (int32_t g = 0; g < G; g++) {
        epyq_numa_head_job *j = &n->head_jobs[g];
        j->fn = fn, j->ctx = ctx, j->tasks = tasks + at;
        int32_t c = 0;
        for (int32_t q = 0; q < n_seq; q++)
            for (int32_t vh = 0; vh < Hv; vh++)
                if (n->head_group[vh] == g) tasks[at + c++] = q * Hv + vh;
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
