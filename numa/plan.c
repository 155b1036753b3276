/* numa/plan.c — the placement plan: groups, threads, experts, dense weights, memory checks. */
#include "numa/plan.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MAX_LIST 16384

/* ---- plan construction ------------------------------------------------------------------ */

typedef struct {
    int32_t topo_index;    /* node whose memory the group uses */
    int32_t n_pus;
    int32_t *pus;          /* [n_pus] candidate CPUs, cores first then SMT siblings */
    int32_t n_cores;
    char note[128];
} group_build;

static void plan_free_groups(epyq_numa_plan *p) {
    if (!p->groups) return;
    for (int32_t g = 0; g < p->n_groups; g++) free(p->groups[g].cpus);
    free(p->groups);
    p->groups = NULL;
}

void epyq_numa_plan_free(epyq_numa_plan *p) {
    if (!p) return;
    plan_free_groups(p);
    free(p->expert_group);
    free(p);
}

static void add_note(epyq_numa_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(epyq_numa_plan *p, const char *fmt, ...) {
    size_t used = strlen(p->notes);
    if (used + 2 >= sizeof p->notes) return;
    if (used) p->notes[used++] = ';', p->notes[used++] = ' ', p->notes[used] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->notes + used, sizeof p->notes - used, fmt, ap);
    va_end(ap);
}

/* Node number as the user sees it: OS index, or the logical index in split mode. */
static int32_t node_number(const epyq_topo *t, int32_t i) { return t->split ? i : t->nodes[i].os_index; }

static bool node_has_memory(const epyq_topo_node *n) { return n->mem_allowed && n->mem_bytes > 0; }

static epyq_status check_model(const epyq_numa_model *m, epyq_err *err) {
    if (m->n_layers < 1 || m->n_experts < 1 || m->n_experts > 32767 || m->top_k < 1 || m->top_k > m->n_experts)
        return epyq_err_set(err, EPYQ_E_ARG,
                            "numa plan: model %s has %d layers x %d experts, top-%d; expected >= 1 layer, "
                            "1..32767 experts and 1 <= top_k <= experts",
                            m->name ? m->name : "?", (int)m->n_layers, (int)m->n_experts, (int)m->top_k);
    if (m->n_slices < 0 || m->n_slices > 64 ||
        (m->n_slices > 1 && m->expert_bytes % (uint64_t)m->n_slices))
        return epyq_err_set(
            err, EPYQ_E_ARG,
            "numa plan: model %s: %d slices per expert of %llu bytes; expected 0..64 slices "
            "that divide the expert's bytes",
            m->name ? m->name : "?", (int)m->n_slices, (unsigned long long)m->expert_bytes);
    size_t n, bytes;
    if (!epyq_mul_size((size_t)m->n_layers, (size_t)m->n_experts, &n) ||
        !epyq_mul_size(n, (size_t)m->expert_bytes, &bytes) || !epyq_add_size(bytes, (size_t)m->dense_bytes, &bytes))
        return epyq_err_set(err, EPYQ_E_ARG, "numa plan: model %s: total bytes overflow", m->name ? m->name : "?");
    return EPYQ_OK;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* -C: every listed CPU must be one this process may use; then keep only those. */
static epyq_status apply_cpu_range(epyq_topo *t, const char *range, epyq_err *err) {
    int32_t *list = malloc(sizeof *list * MAX_LIST);
    if (!list) return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
    int32_t n = epyq_topo_parse_list(range, MAX_LIST, list, MAX_LIST, "-C/--cpu-range", err);
    epyq_status st = n < 0 ? err->code : EPYQ_OK;
    for (int32_t k = 0; st == EPYQ_OK && k < n; k++) {
        bool found = false;
        for (int32_t i = 0; i < t->n_nodes && !found; i++)
            for (int32_t p = 0; p < t->nodes[i].n_pus && !found; p++) found = t->nodes[i].pus[p] == list[k];
        if (!found) {
            int32_t missing = list[k];
            /* Name the CPUs that are available, so the fix is obvious. */
            int32_t n_have = 0;
            for (int32_t i = 0; i < t->n_nodes; i++)
                for (int32_t p = 0; p < t->nodes[i].n_pus && n_have < MAX_LIST; p++) list[n_have++] = t->nodes[i].pus[p];
            qsort(list, (size_t)n_have, sizeof *list, cmp_i32);
            char have[256];
            epyq_topo_format_list(list, n_have, have, sizeof have);
            st = epyq_err_set(err, EPYQ_E_NUMA,
                              "-C %s: cpu %d is not available to this process (%s; usable CPUs: %s)", range,
                              (int)missing, t->this_system ? "taskset/cgroup/offline" : "not in the topology", have);
        }
    }
    if (st == EPYQ_OK) st = epyq_topo_restrict(t, list, n, NULL, 0, err);
    free(list);
    return st;
}

/* --nodes: which nodes (by printed number) the plan may use. */
static epyq_status select_nodes(const epyq_topo *t, const char *nodes, bool *sel, int32_t *first, epyq_err *err) {
    *first = -1;
    if (!nodes) {
        for (int32_t i = 0; i < t->n_nodes; i++) sel[i] = true;
        return EPYQ_OK;
    }
    int32_t list[1024];
    int32_t n = epyq_topo_parse_list(nodes, 1 << 20, list, 1024, "--nodes", err);
    if (n < 0) return err->code;
    for (int32_t i = 0; i < t->n_nodes; i++) sel[i] = false;
    for (int32_t k = 0; k < n; k++) {
        int32_t found = -1;
        for (int32_t i = 0; i < t->n_nodes; i++)
            if (node_number(t, i) == list[k]) found = i;
        if (found < 0) {
            int32_t have[1024];
            for (int32_t i = 0; i < t->n_nodes && i < 1024; i++) have[i] = node_number(t, i);
            char hs[256];
            epyq_topo_format_list(have, t->n_nodes < 1024 ? t->n_nodes : 1024, hs, sizeof hs);
            return epyq_err_set(err, EPYQ_E_NUMA, "--nodes %s: node %d does not exist or is not usable here (nodes: %s)",
                                nodes, (int)list[k], hs);
        }
        sel[found] = true;
    }
    /* The first node the user named (isolate uses it), not the lowest. */
    const char *p = nodes;
    long v = strtol(p, NULL, 10);
    for (int32_t i = 0; i < t->n_nodes; i++)
        if (node_number(t, i) == v) *first = i;
    return EPYQ_OK;
}

static uint32_t distance(const epyq_topo *t, int32_t a, int32_t b) {
    if (t->distance) return t->distance[(size_t)a * (size_t)t->n_nodes + (size_t)b];
    if (a == b) return 10;
    /* Without a distance table: same package is near, anything else far. */
    return t->nodes[a].package == t->nodes[b].package ? 12 : 20;
}

/* Append node src's PUs to g: first PU of each core, then the SMT siblings at the end. */
static bool group_add_pus(group_build *g, const epyq_topo_node *src) {
    int32_t *grow = realloc(g->pus, sizeof *grow * (size_t)(g->n_pus + src->n_pus + 1));
    if (!grow) return false;
    g->pus = grow;
    /* Keep cores (first PUs) ahead of siblings across merged nodes: insert new cores at n_cores. */
    int32_t *cores = malloc(sizeof *cores * (size_t)(src->n_pus + 1));
    int32_t *sibs = malloc(sizeof *sibs * (size_t)(src->n_pus + 1));
    if (!cores || !sibs) {
        free(cores);
        free(sibs);
        return false;
    }
    int32_t nc = 0, ns = 0;
    for (int32_t p = 0; p < src->n_pus; p++) {
        bool first = true;
        for (int32_t q = 0; q < p && first; q++) first = src->pu_core[q] != src->pu_core[p];
        if (first)
            cores[nc++] = src->pus[p];
        else
            sibs[ns++] = src->pus[p];
    }
    int32_t old_sibs = g->n_pus - g->n_cores;
    memmove(g->pus + g->n_cores + nc, g->pus + g->n_cores, sizeof *g->pus * (size_t)old_sibs);
    memcpy(g->pus + g->n_cores, cores, sizeof *cores * (size_t)nc);
    memcpy(g->pus + g->n_cores + nc + old_sibs, sibs, sizeof *sibs * (size_t)ns);
    g->n_cores += nc;
    g->n_pus += src->n_pus;
    free(cores);
    free(sibs);
    return true;
}

/* Build the node groups for a multi-group mode. */
static epyq_status build_groups(epyq_numa_plan *p, const epyq_topo *t, const bool *sel, bool merge_memoryless,
                                group_build *gb, int32_t *n_out, epyq_err *err) {
    int32_t n = 0;
    int32_t *group_of = malloc(sizeof *group_of * (size_t)t->n_nodes);
    if (!group_of) return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
    for (int32_t i = 0; i < t->n_nodes; i++) {
        group_of[i] = -1;
        if (!sel[i]) continue;
        const epyq_topo_node *nd = &t->nodes[i];
        bool has_mem = node_has_memory(nd) || !merge_memoryless;
        if (nd->n_pus > 0 && has_mem) {
            gb[n].topo_index = i;
            if (!group_add_pus(&gb[n], nd)) goto oom;
            group_of[i] = n++;
        } else if (nd->n_pus == 0) {
            add_note(p, "node %d has no usable CPU: left out (its memory is not used)", (int)node_number(t, i));
        }
    }
    if (n == 0) {
        free(group_of);
        return epyq_err_set(err, EPYQ_E_NUMA,
                            "numa plan: topology %s: none of the selected nodes has both usable CPUs and memory",
                            t->source);
    }
    /* Memoryless nodes lend their CPUs to the nearest group (distance, then lower index). */
    for (int32_t i = 0; i < t->n_nodes; i++) {
        if (!sel[i] || group_of[i] >= 0 || t->nodes[i].n_pus == 0) continue;
        int32_t best = 0;
        for (int32_t g = 1; g < n; g++)
            if (distance(t, i, gb[g].topo_index) < distance(t, i, gb[best].topo_index)) best = g;
        if (!group_add_pus(&gb[best], &t->nodes[i])) goto oom;
        size_t used = strlen(gb[best].note);
        snprintf(gb[best].note + used, sizeof gb[best].note - used, "%s+ CPUs of memoryless node %d",
                 used ? ", " : "", (int)node_number(t, i));
    }
    free(group_of);
    *n_out = n;
    return EPYQ_OK;
oom:
    free(group_of);
    return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
}

/* Threads per group: default one per core; -t N spread in proportion to cores (largest
 * remainder, ties to the lower group), then capped by each group's PUs. */
static epyq_status assign_threads(epyq_numa_plan *p, group_build *gb, int32_t n, int32_t want, epyq_err *err) {
    int32_t total_pus = 0;
    for (int32_t g = 0; g < n; g++) total_pus += gb[g].n_pus;
    int32_t *count = calloc((size_t)n, sizeof *count);
    if (!count) return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
    if (want == 0) {
        for (int32_t g = 0; g < n; g++) count[g] = gb[g].n_cores;
    } else {
        if (want > total_pus) {
            free(count);
            return epyq_err_set(err, EPYQ_E_NUMA, "-t %d: only %d CPUs are usable on the %d node%s selected", (int)want,
                                (int)total_pus, (int)n, n == 1 ? "" : "s");
        }
        if (want < n) {
            free(count);
            return epyq_err_set(err, EPYQ_E_NUMA,
                                "-t %d is fewer than the %d NUMA nodes the plan uses; each node needs a thread "
                                "(use --nodes, --numa isolate or --numa off)", (int)want, (int)n);
        }
        /* Proportional to PUs, so SMT siblings are used evenly once cores run out. */
        int32_t given = 0;
        for (int32_t g = 0; g < n; g++) {
            count[g] = (int32_t)((int64_t)want * gb[g].n_pus / total_pus);
            if (count[g] < 1) count[g] = 1;
            given += count[g];
        }
        while (given > want) {
            int32_t big = 0;
            for (int32_t g = 1; g < n; g++)
                if (count[g] > count[big]) big = g;
            count[big]--;
            given--;
        }
        while (given < want) {
            int32_t best = -1;
            for (int32_t g = 0; g < n; g++) {
                if (count[g] >= gb[g].n_pus) continue;
                /* Most room relative to size: count/pus smallest. */
                if (best < 0 || (int64_t)count[g] * gb[best].n_pus < (int64_t)count[best] * gb[g].n_pus) best = g;
            }
            count[best]++;
            given++;
        }
    }
    p->n_threads = 0;
    for (int32_t g = 0; g < n; g++) {
        epyq_numa_group *out = &p->groups[g];
        out->n_threads = count[g];
        out->cpus = malloc(sizeof *out->cpus * (size_t)(count[g] > 0 ? count[g] : 1));
        if (!out->cpus) {
            free(count);
            return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
        }
        memcpy(out->cpus, gb[g].pus, sizeof *out->cpus * (size_t)count[g]);
        p->n_threads += count[g];
    }
    free(count);
    return EPYQ_OK;
}

static double expert_freq(const epyq_numa_model *m, int32_t layer, int32_t e) {
    if (m->expert_freq) return m->expert_freq[(size_t)layer * (size_t)m->n_experts + (size_t)e];
    return (double)m->top_k / (double)m->n_experts;
}

/* Slices per expert (1: whole experts) and the bytes of one. */
static int32_t slices_of(const epyq_numa_model *m) { return m->n_slices > 1 ? m->n_slices : 1; }
static uint64_t part_bytes(const epyq_numa_model *m) {
    return m->expert_bytes / (uint64_t)slices_of(m);
}

/* Experts, heaviest first within each layer, and each expert's slices in order, each to the
 * group furthest behind its share of slice count (integer math: share = threads_g /
 * threads_total); ties go to the group with the least traffic in this layer per thread, then
 * the lower index. With uniform traffic and equal groups this is a round robin that carries
 * on across experts and layers, so totals differ by at most one slice, every layer is spread
 * evenly, and with as many slices as groups (or a multiple) every expert is cut evenly. */
static epyq_status assign_experts(epyq_numa_plan *p, const epyq_numa_model *m, epyq_err *err) {
    int32_t n = p->n_groups, ne = m->n_experts, S = slices_of(m);
    int64_t *count = calloc((size_t)n, sizeof *count);
    double *layer_traffic = calloc((size_t)n, sizeof *layer_traffic);
    int32_t *order = malloc(sizeof *order * (size_t)ne);
    if (!count || !layer_traffic || !order) {
        free(count);
        free(layer_traffic);
        free(order);
        return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
    }
    int64_t total = 0;
    for (int32_t l = 0; l < m->n_layers; l++) {
        for (int32_t e = 0; e < ne; e++) order[e] = e;
        if (m->expert_freq) {
            /* Stable insertion sort by descending frequency (n_experts is small). */
            for (int32_t a = 1; a < ne; a++)
                for (int32_t b = a; b > 0 && expert_freq(m, l, order[b]) > expert_freq(m, l, order[b - 1]); b--) {
                    int32_t tmp = order[b];
                    order[b] = order[b - 1];
                    order[b - 1] = tmp;
                }
        }
        for (int32_t g = 0; g < n; g++) layer_traffic[g] = 0.0;
        for (int32_t k = 0; k < ne * S; k++) {
            int32_t e = order[k / S], s = k % S;
            int32_t best = -1;
            int64_t best_def = 0;
            for (int32_t g = 0; g < n; g++) {
                int64_t def = (int64_t)p->groups[g].n_threads * (total + 1) - count[g] * p->n_threads;
                bool better = best < 0 || def > best_def;
                if (!better && def == best_def)
                    better = layer_traffic[g] * p->groups[best].n_threads <
                             layer_traffic[best] * p->groups[g].n_threads;
                if (better) {
                    best = g;
                    best_def = def;
                }
            }
            p->expert_group[((size_t)l * (size_t)ne + (size_t)e) * (size_t)S + (size_t)s] =
                (int16_t)best;
            count[best]++;
            total++;
            layer_traffic[best] += expert_freq(m, l, e) / S;
        }
    }
    free(count);
    free(layer_traffic);
    free(order);
    return EPYQ_OK;
}

static void tally(epyq_numa_plan *p, const epyq_numa_model *m) {
    const int32_t S = slices_of(m);
    for (int32_t g = 0; g < p->n_groups; g++) {
        p->groups[g].n_parts = 0;
        p->groups[g].expert_bytes = 0;
        p->groups[g].traffic = 0.0;
    }
    for (int32_t l = 0; l < m->n_layers; l++)
        for (int32_t e = 0; e < m->n_experts; e++)
            for (int32_t s = 0; s < S; s++) {
                epyq_numa_group *g =
                    &p->groups[p->expert_group[((size_t)l * (size_t)m->n_experts + (size_t)e) *
                                                   (size_t)S +
                                               (size_t)s]];
                g->n_parts++;
                g->expert_bytes += part_bytes(m);
                g->traffic += expert_freq(m, l, e) * (double)part_bytes(m);
            }
    for (int32_t g = 0; g < p->n_groups; g++)
        p->groups[g].n_experts = (int32_t)(p->groups[g].n_parts / S);
}

static uint64_t need_of(const epyq_numa_group *g) { return g->expert_bytes + g->dense_bytes; }

/* Every node must hold its share. With a fallback, experts move (last layer first) from
 * nodes over capacity to the node with the most room. */
uint64_t epyq_numa_node_reserve(uint64_t reserve_bytes, uint64_t node_mem) {
    return reserve_bytes < node_mem / 16 ? reserve_bytes : node_mem / 16;
}

const char *epyq_numa_size(uint64_t bytes, char *buf, size_t n) {
    if (bytes >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", (double)bytes / GIB);
    else snprintf(buf, n, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

static epyq_status check_memory(epyq_numa_plan *p, const epyq_numa_model *m, bool fallback, epyq_err *err) {
    for (int32_t g = 0; g < p->n_groups; g++) {
        epyq_numa_group *gr = &p->groups[g];
        if (need_of(gr) <= gr->capacity) continue;
        if (!fallback || gr->dense_bytes > gr->capacity) {
            char b[5][32];
            return epyq_err_set(err, EPYQ_E_NOMEM,
                                "numa plan: node %d needs %s (experts %s + dense %s) but has %s after the %s "
                                "reserve%s",
                                (int)gr->node, epyq_numa_size(need_of(gr), b[0], 32),
                                epyq_numa_size(gr->expert_bytes, b[1], 32), epyq_numa_size(gr->dense_bytes, b[2], 32),
                                epyq_numa_size(gr->capacity, b[3], 32), epyq_numa_size(gr->reserve, b[4], 32),
                                fallback ? " (dense weights alone do not fit)"
                                         : "; use --numa-fallback, more nodes, or less -t/--nodes restriction");
        }
        int64_t moved = 0;
        const int64_t parts = (int64_t)m->n_layers * m->n_experts * slices_of(m);
        const uint64_t pb = part_bytes(m);
        for (int64_t i = parts - 1; i >= 0 && need_of(gr) > gr->capacity; i--) {
            /* the last layer's slices first */
            int16_t *slot = &p->expert_group[i];
            if (*slot != g) continue;
            int32_t dest = -1;
            uint64_t room = 0;
            for (int32_t h = 0; h < p->n_groups; h++) {
                uint64_t need = need_of(&p->groups[h]);
                uint64_t free_h = p->groups[h].capacity > need ? p->groups[h].capacity - need : 0;
                if (h != g && free_h >= pb && free_h > room) {
                    dest = h;
                    room = free_h;
                }
            }
            if (dest < 0) {
                uint64_t total_need = 0, total_cap = 0;
                for (int32_t h = 0; h < p->n_groups; h++) {
                    total_need += need_of(&p->groups[h]);
                    total_cap += p->groups[h].capacity;
                }
                char b[3][32];
                return epyq_err_set(
                    err, EPYQ_E_NOMEM,
                    "numa plan: the model needs %s but the %d node%s used have %s after reserves; "
                    "node %d is still %s short",
                    epyq_numa_size(total_need, b[0], 32), (int)p->n_groups,
                    p->n_groups == 1 ? "" : "s", epyq_numa_size(total_cap, b[1], 32), (int)gr->node,
                    epyq_numa_size(need_of(gr) - gr->capacity, b[2], 32));
            }
            *slot = (int16_t)dest;
            gr->expert_bytes -= pb;
            gr->n_parts--;
            p->groups[dest].expert_bytes += pb;
            p->groups[dest].n_parts++;
            moved++;
        }
        p->fallback_used = true;
        add_note(p, "fallback: node %d lacked memory; experts moved to nodes with room", (int)gr->node);
        (void)moved;
    }
    tally(p, m);
    return EPYQ_OK;
}

epyq_status epyq_numa_plan_make(const epyq_topo *topo, const epyq_numa_model *model, const epyq_numa_opts *opts,
                                epyq_numa_plan **out, epyq_err *err) {
    *out = NULL;
    epyq_status st = check_model(model, err);
    if (st != EPYQ_OK) return st;
    epyq_numa_plan *p = calloc(1, sizeof *p);
    epyq_topo *t = NULL;
    bool *sel = NULL;
    group_build *gb = NULL;
    int32_t n_gb = 0;
    if (!p) return epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
    p->asked = opts->mode;
    p->n_layers = model->n_layers;
    p->n_experts = model->n_experts;
    p->n_slices = slices_of(model);
    p->model_bytes = model->expert_bytes * (uint64_t)model->n_layers * (uint64_t)model->n_experts + model->dense_bytes;
    snprintf(p->model_name, sizeof p->model_name, "%s", model->name ? model->name : "model");

    if ((st = epyq_topo_clone(topo, &t, err)) != EPYQ_OK) goto fail;
    if (opts->cpu_range && (st = apply_cpu_range(t, opts->cpu_range, err)) != EPYQ_OK) goto fail;
    if (opts->split > 0) {
        epyq_topo *s = NULL;
        if ((st = epyq_topo_split(t, opts->split, &s, err)) != EPYQ_OK) goto fail;
        epyq_topo_free(t);
        t = s;
        p->split = true;
        p->shared_cores = t->shared_cores;
        if (t->shared_cores)
            add_note(p, "split into %d logical nodes on fewer cores: nodes share cores", (int)opts->split);
    }
    snprintf(p->topo_source, sizeof p->topo_source, "%s", t->source);
    sel = calloc((size_t)t->n_nodes, sizeof *sel);
    gb = calloc((size_t)t->n_nodes, sizeof *gb);
    if (!sel || !gb) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
        goto fail;
    }
    int32_t first_named = -1;
    if ((st = select_nodes(t, opts->nodes, sel, &first_named, err)) != EPYQ_OK) goto fail;

    /* Resolve the mode. */
    epyq_numa_mode mode = opts->mode;
    bool fallback = opts->fallback;
    if (mode == EPYQ_NUMA_AUTO) {
        mode = EPYQ_NUMA_DISTRIBUTE;
        fallback = true;
    }
    if (mode == EPYQ_NUMA_ISOLATE) {
        int32_t home = first_named;
        for (int32_t i = 0; home < 0 && opts->home_cpu >= 0 && i < t->n_nodes; i++)
            for (int32_t k = 0; k < t->nodes[i].n_pus; k++)
                if (t->nodes[i].pus[k] == opts->home_cpu && sel[i]) home = i;
        for (int32_t i = 0; home < 0 && i < t->n_nodes; i++)
            if (sel[i] && t->nodes[i].n_pus > 0 && node_has_memory(&t->nodes[i])) home = i;
        for (int32_t i = 0; i < t->n_nodes; i++) sel[i] = i == home;
        if (home < 0) {
            st = epyq_err_set(err, EPYQ_E_NUMA, "--numa isolate: no selected node has both CPUs and memory");
            goto fail;
        }
    }
    p->mode = mode;
    p->bind_memory = mode != EPYQ_NUMA_OFF && mode != EPYQ_NUMA_NUMACTL;
    p->replicate_dense = mode == EPYQ_NUMA_REPLICATE_DENSE;

    if (mode == EPYQ_NUMA_OFF) {
        /* One group with every selected CPU; memory is wherever the kernel puts it. */
        n_gb = 1;
        gb[0].topo_index = -1;
        for (int32_t i = 0; i < t->n_nodes; i++)
            if (sel[i] && !group_add_pus(&gb[0], &t->nodes[i])) {
                st = epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
                goto fail;
            }
        if (gb[0].n_pus == 0) {
            st = epyq_err_set(err, EPYQ_E_NUMA, "--numa off: no usable CPU in topology %s", t->source);
            goto fail;
        }
    } else {
        st = build_groups(p, t, sel, mode != EPYQ_NUMA_NUMACTL, gb, &n_gb, err);
        if (st != EPYQ_OK) goto fail;
    }

    p->n_groups = n_gb;
    p->groups = calloc((size_t)n_gb, sizeof *p->groups);
    p->expert_group = malloc(sizeof *p->expert_group * (size_t)model->n_layers *
                             (size_t)model->n_experts * (size_t)p->n_slices);
    if (!p->groups || !p->expert_group) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "numa plan: out of memory");
        goto fail;
    }
    uint64_t total_mem = 0;
    for (int32_t i = 0; i < t->n_nodes; i++)
        if (sel[i] && node_has_memory(&t->nodes[i])) total_mem += t->nodes[i].mem_bytes;
    for (int32_t g = 0; g < n_gb; g++) {
        epyq_numa_group *gr = &p->groups[g];
        int32_t ti = gb[g].topo_index;
        gr->node = ti >= 0 ? node_number(t, ti) : -1;
        gr->os_index = ti >= 0 && p->bind_memory ? t->nodes[ti].os_index : -1;
        /* Unbound modes (off, numactl) are checked against all memory the policy allows. */
        uint64_t mem = ti >= 0 && p->bind_memory ? (node_has_memory(&t->nodes[ti]) ? t->nodes[ti].mem_bytes : 0)
                                                 : total_mem / (uint64_t)n_gb;
        if (t->mem_placeholder) {
            /* no memory was given: plan the placement, check nothing */
            gr->capacity = UINT64_MAX;
        } else {
            gr->reserve = epyq_numa_node_reserve(opts->reserve_bytes, mem);
            gr->capacity = mem - gr->reserve;
        }
        snprintf(gr->note, sizeof gr->note, "%s", gb[g].note);
    }
    if ((st = assign_threads(p, gb, n_gb, opts->n_threads, err)) != EPYQ_OK) goto fail;
    if ((st = assign_experts(p, model, err)) != EPYQ_OK) goto fail;
    tally(p, model);
    /* Dense weights are cut by rows in proportion to threads (src/model/numa_dense.c); the last
     * node takes the rounding, so the shares add up to one copy. Per token a node reads its
     * rows, split or replicated alike. */
    uint64_t given = 0;
    int64_t cum = 0;
    for (int32_t g = 0; g < n_gb; g++) {
        epyq_numa_group *gr = &p->groups[g];
        cum += gr->n_threads;
        uint64_t upto =
            g == n_gb - 1
                ? model->dense_bytes
                : (uint64_t)((double)model->dense_bytes * (double)cum / (double)p->n_threads);
        gr->dense_split = upto - given;
        given = upto;
        gr->dense_copy = model->dense_bytes;
        gr->dense_bytes = p->replicate_dense ? gr->dense_copy : gr->dense_split;
        gr->dense_traffic =
            (double)model->dense_token_bytes * (double)gr->n_threads / (double)p->n_threads;
    }
    if ((st = check_memory(p, model, fallback, err)) != EPYQ_OK) goto fail;
    p->mem_unchecked = t->mem_placeholder;
    if (t->mem_placeholder)
        add_note(p, "memory not checked: the synthetic topology gives none (add e.g. numa:4(memory=192GiB))");
    if (opts->mode == EPYQ_NUMA_AUTO)
        add_note(p, "auto: distribute over %d node%s", (int)n_gb, n_gb == 1 ? "" : "s");
    if (n_gb > 1 && p->bind_memory && model->dense_token_bytes) {
        /* Per token the dense weights usually outweigh the 8 experts: say that they are local,
         * and what the other option costs. */
        double expert_tok = 0.0;
        for (int32_t g = 0; g < n_gb; g++) expert_tok += p->groups[g].traffic;
        double dense_share = (double)model->dense_token_bytes / ((double)model->dense_token_bytes + expert_tok);
        char more[32];
        uint64_t extra = model->dense_bytes - p->groups[0].dense_split;
        if (p->replicate_dense)
            add_note(
                p,
                "dense weights are %.0f%% of the bytes read per token, all local; replicate-dense holds %s more "
                "per node than the row split, which reads the same bytes",
                100.0 * dense_share, epyq_numa_size(extra, more, sizeof more));
        else
            add_note(
                p,
                "dense weights are %.0f%% of the bytes read per token, split by rows so each node reads only "
                "its own (local); --numa replicate-dense would hold %s more per node for the same reads",
                100.0 * dense_share, epyq_numa_size(extra, more, sizeof more));
    }

    for (int32_t g = 0; g < t->n_nodes; g++) free(gb[g].pus);
    free(gb);
    free(sel);
    epyq_topo_free(t);
    *out = p;
    return EPYQ_OK;
fail:
    if (gb)
        for (int32_t g = 0; g < (t ? t->n_nodes : 0); g++) free(gb[g].pus);
    free(gb);
    free(sel);
    epyq_topo_free(t);
    epyq_numa_plan_free(p);
    return st;
}

/* ---- printing ----------------------------------------------------------------------------- */

void epyq_numa_plan_print(FILE *f, const epyq_numa_plan *p) {
    /* GiB for real models; MiB keeps small (test, synthetic) models readable. */
    bool gib = p->model_bytes >= (1ull << 30);
    double unit = gib ? GIB : 1024.0 * 1024.0;
    const char *u = gib ? "GiB" : "MiB";
    fprintf(f, "NUMA plan: mode %s", epyq_numa_mode_name(p->mode));
    if (p->asked != p->mode) fprintf(f, " (asked %s)", epyq_numa_mode_name(p->asked));
    fprintf(f, ", model %s (%.2f %s), topology %s\n", p->model_name, (double)p->model_bytes / unit, u, p->topo_source);
    char h_exp[16], h_den[16], h_tot[16], h_cap[16], h_spl[16], h_cpy[16];
    snprintf(h_exp, sizeof h_exp, "%s experts", u);
    snprintf(h_den, sizeof h_den, "%s dense", u);
    snprintf(h_tot, sizeof h_tot, "%s total", u);
    snprintf(h_cap, sizeof h_cap, "%s capacity", u);
    snprintf(h_spl, sizeof h_spl, "%s split", u);
    snprintf(h_cpy, sizeof h_cpy, "%s replica", u);
    /* "dense" is what this mode places; "split" and "replica" are the two options side by side */
    fprintf(f, "%5s %4s %8s %12s %10s %10s %13s %10s %12s %11s %11s %8s  %s\n", "node", "os",
            "experts", h_exp, h_den, h_tot, h_cap, h_spl, h_cpy, "MiB/token", "dense MiB/t",
            "threads", "PUs");
    uint64_t te = 0, td = 0, ts = 0, tc = 0;
    int64_t tn = 0; /* slices held */
    /* experts held, as a fraction where a node holds part of one (sliced placement) */
    const int32_t S = p->n_slices > 1 ? p->n_slices : 1;
    double tt = 0.0, tdt = 0.0;
    for (int32_t g = 0; g < p->n_groups; g++) {
        const epyq_numa_group *gr = &p->groups[g];
        char pus[256], node[16], os[16];
        /* Workers are listed in pinning order; print them sorted as a CPU list. */
        int32_t sorted[4096];
        int32_t n = gr->n_threads < 4096 ? gr->n_threads : 4096;
        memcpy(sorted, gr->cpus, sizeof *sorted * (size_t)n);
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_i32);
        epyq_topo_format_list(sorted, n, pus, sizeof pus);
        snprintf(node, sizeof node, gr->node >= 0 ? "%d" : "all", (int)gr->node);
        snprintf(os, sizeof os, gr->os_index >= 0 ? "%d" : "-", (int)gr->os_index);
        char cap[32];
        if (gr->capacity == UINT64_MAX) snprintf(cap, sizeof cap, "not given");
        else snprintf(cap, sizeof cap, "%.2f", (double)gr->capacity / unit);
        fprintf(f,
                "%5s %4s %8.*f %12.2f %10.2f %10.2f %13s %10.2f %12.2f %11.1f %11.1f %8d  %s%s%s\n",
                node, os, gr->n_parts % S ? 2 : 0, (double)gr->n_parts / S,
                (double)gr->expert_bytes / unit, (double)gr->dense_bytes / unit,
                (double)(gr->expert_bytes + gr->dense_bytes) / unit, cap,
                (double)gr->dense_split / unit, (double)gr->dense_copy / unit,
                gr->traffic / (1024.0 * 1024.0), gr->dense_traffic / (1024.0 * 1024.0),
                (int)gr->n_threads, pus, gr->note[0] ? "  " : "", gr->note);
        te += gr->expert_bytes;
        td += gr->dense_bytes;
        ts += gr->dense_split;
        tc += gr->dense_copy;
        tn += gr->n_parts;
        tt += gr->traffic;
        tdt += gr->dense_traffic;
    }
    fprintf(f, "%5s %4s %8.*f %12.2f %10.2f %10.2f %13s %10.2f %12.2f %11.1f %11.1f %8d\n", "total",
            "", tn % S ? 2 : 0, (double)tn / S, (double)te / unit, (double)td / unit,
            (double)(te + td) / unit, "", (double)ts / unit, (double)tc / unit,
            tt / (1024.0 * 1024.0), tdt / (1024.0 * 1024.0), (int)p->n_threads);
    fprintf(f, "dense weights: %s; memory %s\n",
            p->replicate_dense ? "one copy per node, each node computing its rows from its own"
            : p->n_groups > 1  ? "split by output rows, each node holding and computing its own"
                               : "on the node",
            p->bind_memory ? "bound to each node before first touch"
                           : "not bound by epyq (kernel/inherited policy)");
    if (S > 1 && p->n_groups > 1)
        fprintf(
            f,
            "routed experts: each cut into %d slices of its intermediate rows, the slices spread over the "
            "nodes, so every node computes its share of every expert a token chooses\n",
            (int)S);
    if (p->notes[0]) fprintf(f, "notes: %s\n", p->notes);
}

epyq_status epyq_numa_plan_inspect(FILE *f, const char *topology, const epyq_numa_model *model,
                                   const epyq_numa_opts *opts, epyq_err *err) {
    epyq_topo *t = NULL;
    epyq_status st = epyq_topo_load(&t, topology, err);
    if (st != EPYQ_OK) return st;
    epyq_topo_print(f, t);
    epyq_numa_plan *p = NULL;
    st = epyq_numa_plan_make(t, model, opts, &p, err);
    if (st == EPYQ_OK) epyq_numa_plan_print(f, p);
    epyq_numa_plan_free(p);
    epyq_topo_free(t);
    return st;
}
