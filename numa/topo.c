/* numa/topo.c — topology discovery (hwloc) into plain data, restriction and split (see topo.h). */
#include "numa/topo.h"

#include <ctype.h>
#include <errno.h>
#include <hwloc.h>
#include <hwloc/distances.h>
#include <numa.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

/* libnuma prints from inside the library unless the program defines these; we report through
 * epyq_err instead. */
void numa_error(char *where) { (void)where; }
void numa_warn(int num, char *fmt, ...) {
    (void)num;
    (void)fmt;
}

/* ---- lists --------------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int32_t epyq_topo_parse_list(const char *s, int32_t limit, int32_t *out, int32_t max, const char *what,
                             epyq_err *err) {
    if (!s || !*s) {
        epyq_err_set(err, EPYQ_E_ARG, "%s: empty list (expected e.g. \"0-31,64-95\")", what);
        return -1;
    }
    int32_t n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long lo = strtol(p, &end, 10);
        if (end == p || errno || lo < 0 || !isdigit((unsigned char)*p)) goto bad;
        long hi = lo;
        if (*end == '-') {
            p = end + 1;
            hi = strtol(p, &end, 10);
            if (end == p || errno || !isdigit((unsigned char)*p) || hi < lo) goto bad;
        }
        if (hi >= limit) {
            epyq_err_set(err, EPYQ_E_ARG, "%s \"%s\": %ld is out of range (limit %d)", what, s, hi, (int)limit);
            return -1;
        }
        for (long v = lo; v <= hi; v++) {
            if (n >= max) {
                epyq_err_set(err, EPYQ_E_ARG, "%s \"%s\": more than %d entries", what, s, (int)max);
                return -1;
            }
            out[n++] = (int32_t)v;
        }
        if (*end == '\0') break;
        if (*end != ',') goto bad;
        p = end + 1;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_i32);
    int32_t u = 0;
    for (int32_t i = 0; i < n; i++)
        if (u == 0 || out[u - 1] != out[i]) out[u++] = out[i];
    return u;
bad:
    epyq_err_set(err, EPYQ_E_ARG, "%s \"%s\": not a list like \"0-31,64-95\"", what, s);
    return -1;
}

void epyq_topo_format_list(const int32_t *v, int32_t n, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    if (n == 0) {
        snprintf(buf, size, "-");
        return;
    }
    for (int32_t i = 0; i < n;) {
        int32_t j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
        int w = j > i ? snprintf(buf + used, size - used, "%s%d-%d", i ? "," : "", (int)v[i], (int)v[j])
                      : snprintf(buf + used, size - used, "%s%d", i ? "," : "", (int)v[i]);
        if (w < 0 || (size_t)w >= size - used) {
            /* Truncate visibly rather than silently. */
            if (size >= 4) snprintf(buf + size - 4, 4, "...");
            return;
        }
        used += (size_t)w;
        i = j + 1;
    }
}

/* ---- construction helpers ------------------------------------------------------------ */

static epyq_topo *topo_alloc(int32_t n_nodes) {
    epyq_topo *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->nodes = calloc((size_t)(n_nodes > 0 ? n_nodes : 1), sizeof *t->nodes);
    if (!t->nodes) {
        free(t);
        return NULL;
    }
    t->n_nodes = n_nodes;
    return t;
}

static bool node_set_pus(epyq_topo_node *n, const int32_t *pus, const int32_t *cores, int32_t count) {
    free(n->pus);
    free(n->pu_core);
    n->n_pus = count;
    n->pus = malloc(sizeof *n->pus * (size_t)(count > 0 ? count : 1));
    n->pu_core = malloc(sizeof *n->pu_core * (size_t)(count > 0 ? count : 1));
    if (!n->pus || !n->pu_core) return false;
    if (count) {
        memcpy(n->pus, pus, sizeof *pus * (size_t)count);
        memcpy(n->pu_core, cores, sizeof *cores * (size_t)count);
    }
    return true;
}

void epyq_topo_free(epyq_topo *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_nodes; i++) {
        free(t->nodes[i].pus);
        free(t->nodes[i].pu_core);
    }
    free(t->nodes);
    free(t->distance);
    free(t);
}

epyq_status epyq_topo_clone(const epyq_topo *src, epyq_topo **out, epyq_err *err) {
    epyq_topo *t = topo_alloc(src->n_nodes);
    if (!t) goto oom;
    t->n_packages = src->n_packages;
    t->this_system = src->this_system;
    t->split = src->split;
    t->shared_cores = src->shared_cores;
    t->mem_placeholder = src->mem_placeholder;
    memcpy(t->source, src->source, sizeof t->source);
    for (int32_t i = 0; i < src->n_nodes; i++) {
        const epyq_topo_node *s = &src->nodes[i];
        epyq_topo_node *d = &t->nodes[i];
        *d = (epyq_topo_node){s->os_index, s->package, s->mem_bytes, s->mem_allowed, 0, NULL, NULL};
        if (!node_set_pus(d, s->pus, s->pu_core, s->n_pus)) goto oom;
    }
    if (src->distance) {
        size_t nn = (size_t)src->n_nodes * (size_t)src->n_nodes;
        t->distance = malloc(nn * sizeof *t->distance);
        if (!t->distance) goto oom;
        memcpy(t->distance, src->distance, nn * sizeof *t->distance);
    }
    *out = t;
    return EPYQ_OK;
oom:
    epyq_topo_free(t);
    return epyq_err_set(err, EPYQ_E_NOMEM, "topology: out of memory copying %d nodes", (int)src->n_nodes);
}

int32_t epyq_topo_find_os(const epyq_topo *t, int32_t os) {
    for (int32_t i = 0; i < t->n_nodes; i++)
        if (t->nodes[i].os_index == os) return i;
    return -1;
}

int32_t epyq_topo_node_cores(const epyq_topo_node *n, int32_t *out, int32_t max) {
    int32_t k = 0;
    for (int32_t i = 0; i < n->n_pus && k < max; i++) {
        bool seen = false;
        for (int32_t j = 0; j < i && !seen; j++) seen = n->pu_core[j] == n->pu_core[i];
        if (!seen) out[k++] = n->pus[i];
    }
    return k;
}

/* ---- hwloc discovery ----------------------------------------------------------------- */

/* The node a PU belongs to is the NUMA node with the smallest cpuset that contains it: a
 * CPU-less memory node (CXL) reports the whole machine as its locality and must not take
 * CPUs away from the DDR node next to them. Ties go to the lower OS index. */
static int32_t owner_node(hwloc_topology_t h, hwloc_obj_t pu) {
    int n = hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_NUMANODE);
    int32_t best = -1;
    int best_w = 0;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(h, HWLOC_OBJ_NUMANODE, i);
        if (!o->cpuset || !hwloc_bitmap_isset(o->cpuset, pu->os_index)) continue;
        int w = hwloc_bitmap_weight(o->cpuset);
        if (best < 0 || w < best_w) {
            best = i;
            best_w = w;
        }
    }
    return best;
}

static void read_distances(hwloc_topology_t h, epyq_topo *t, hwloc_obj_t *objs) {
    unsigned nr = 1;
    struct hwloc_distances_s *d = NULL;
    if (hwloc_distances_get_by_type(h, HWLOC_OBJ_NUMANODE, &nr, &d, HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) != 0 ||
        nr == 0)
        return;
    size_t nn = (size_t)t->n_nodes * (size_t)t->n_nodes;
    t->distance = calloc(nn, sizeof *t->distance);
    if (t->distance) {
        for (int32_t i = 0; i < t->n_nodes; i++)
            for (int32_t j = 0; j < t->n_nodes; j++) {
                hwloc_uint64_t v = 0, back = 0; /* hwloc writes both directions */
                if (hwloc_distances_obj_pair_values(d, objs[i], objs[j], &v, &back) != 0) {
                    free(t->distance);
                    t->distance = NULL;
                    goto out;
                }
                t->distance[(size_t)i * (size_t)t->n_nodes + (size_t)j] = (uint32_t)v;
            }
    }
out:
    hwloc_distances_release(h, d);
}

static epyq_status from_hwloc(hwloc_topology_t h, epyq_topo **out, epyq_err *err) {
    int n_nodes = hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_NUMANODE);
    int n_pu = hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_PU);
    if (n_nodes <= 0 || n_pu <= 0)
        return epyq_err_set(err, EPYQ_E_NUMA, "topology: %d NUMA nodes and %d PUs; need at least one of each",
                            n_nodes, n_pu);
    epyq_topo *t = topo_alloc(n_nodes);
    hwloc_obj_t *objs = calloc((size_t)n_nodes, sizeof *objs);
    int32_t *pus = malloc(sizeof *pus * (size_t)n_pu), *cores = malloc(sizeof *cores * (size_t)n_pu);
    int32_t *owner = malloc(sizeof *owner * (size_t)n_pu);
    epyq_status st = EPYQ_OK;
    if (!t || !objs || !pus || !cores || !owner) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "topology: out of memory for %d nodes", n_nodes);
        goto done;
    }
    t->n_packages = hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_PACKAGE);
    for (int i = 0; i < n_pu; i++) owner[i] = owner_node(h, hwloc_get_obj_by_type(h, HWLOC_OBJ_PU, i));
    for (int i = 0; i < n_nodes; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(h, HWLOC_OBJ_NUMANODE, i);
        hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(h, HWLOC_OBJ_PACKAGE, o);
        objs[i] = o;
        epyq_topo_node *nd = &t->nodes[i];
        nd->os_index = (int32_t)o->os_index;
        nd->package = pkg ? (int32_t)pkg->logical_index : -1;
        nd->mem_bytes = o->attr ? o->attr->numanode.local_memory : 0;
        nd->mem_allowed = true;
        int32_t k = 0;
        for (int p = 0; p < n_pu; p++) {
            if (owner[p] != i) continue;
            hwloc_obj_t pu = hwloc_get_obj_by_type(h, HWLOC_OBJ_PU, p);
            hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(h, HWLOC_OBJ_CORE, pu);
            pus[k] = (int32_t)pu->os_index;
            /* Without a Core level each PU is its own core. */
            cores[k] = core ? (int32_t)core->logical_index : n_pu + (int32_t)pu->logical_index;
            k++;
        }
        /* Sort PUs by OS id, carrying their core numbers along. */
        for (int32_t a = 1; a < k; a++)
            for (int32_t b = a; b > 0 && pus[b - 1] > pus[b]; b--) {
                int32_t tp = pus[b], tc = cores[b];
                pus[b] = pus[b - 1];
                cores[b] = cores[b - 1];
                pus[b - 1] = tp;
                cores[b - 1] = tc;
            }
        if (!node_set_pus(nd, pus, cores, k)) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "topology: out of memory for node %u", o->os_index);
            goto done;
        }
    }
    /* hwloc lists nodes in logical order; we promise ascending OS index. */
    for (int32_t a = 1; a < t->n_nodes; a++)
        for (int32_t b = a; b > 0 && t->nodes[b - 1].os_index > t->nodes[b].os_index; b--) {
            epyq_topo_node tn = t->nodes[b];
            hwloc_obj_t to = objs[b];
            t->nodes[b] = t->nodes[b - 1];
            objs[b] = objs[b - 1];
            t->nodes[b - 1] = tn;
            objs[b - 1] = to;
        }
    read_distances(h, t, objs);
done:
    free(objs);
    free(pus);
    free(cores);
    free(owner);
    if (st != EPYQ_OK) {
        epyq_topo_free(t);
        return st;
    }
    *out = t;
    return EPYQ_OK;
}

/* What this process inherited: the CPU affinity (taskset, cgroup cpuset) and the nodes its
 * memory policy allows (numactl --membind/--cpunodebind, cgroup mems). */
static epyq_status restrict_to_process(epyq_topo *t, epyq_err *err) {
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0)
        return epyq_err_set(err, EPYQ_E_NUMA, "topology: sched_getaffinity failed: %s", strerror(errno));
    int32_t cpus[CPU_SETSIZE], n_cpu = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mask)) cpus[n_cpu++] = c;
    int32_t mems[1024], n_mem = 0;
    bool have_mems = false;
    if (numa_available() >= 0) {
        struct bitmask *bm = numa_get_membind();
        if (bm) {
            have_mems = true;
            for (int32_t i = 0; i < t->n_nodes && n_mem < 1024; i++)
                if (numa_bitmask_isbitset(bm, (unsigned)t->nodes[i].os_index)) mems[n_mem++] = t->nodes[i].os_index;
            numa_bitmask_free(bm);
        }
    }
    return epyq_topo_restrict(t, cpus, n_cpu, have_mems ? mems : NULL, n_mem, err);
}

/* Some VMs hot-add memory that the per-node counters do not show; on a one-node machine the
 * whole-machine total is the node's memory. */
static void fix_single_node_memory(epyq_topo *t) {
    if (t->n_nodes != 1) return;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0) return;
    uint64_t total = (uint64_t)pages * (uint64_t)size;
    if (total > t->nodes[0].mem_bytes) t->nodes[0].mem_bytes = total;
}

epyq_status epyq_topo_load(epyq_topo **out, const char *spec, epyq_err *err) {
    *out = NULL;
    hwloc_topology_t h;
    if (hwloc_topology_init(&h) != 0) return epyq_err_set(err, EPYQ_E_NOMEM, "topology: hwloc init failed");
    epyq_status st = EPYQ_OK;
    bool real = !spec || !*spec;
    char source[256];
    if (real) {
        snprintf(source, sizeof source, "this machine");
    } else {
        struct stat sb;
        size_t len = strlen(spec);
        bool xml = stat(spec, &sb) == 0 || (len > 4 && strcmp(spec + len - 4, ".xml") == 0);
        if (xml) {
            snprintf(source, sizeof source, "xml %.240s", spec);
            if (hwloc_topology_set_xml(h, spec) != 0) {
                st = epyq_err_set(err, EPYQ_E_NUMA, "topology %s: cannot read hwloc XML: %s", spec, strerror(errno));
                goto done;
            }
        } else {
            snprintf(source, sizeof source, "synthetic %.240s", spec);
            if (hwloc_topology_set_synthetic(h, spec) != 0) {
                st = epyq_err_set(err, EPYQ_E_NUMA,
                                  "topology \"%s\": not an XML file and not a hwloc synthetic description "
                                  "(e.g. \"pack:2 numa:4(memory=192GiB) core:8 pu:2\")", spec);
                goto done;
            }
        }
    }
    if (hwloc_topology_load(h) != 0) {
        st = epyq_err_set(err, EPYQ_E_NUMA, "topology %s: hwloc could not load it: %s", real ? "of this machine" : spec,
                          strerror(errno));
        goto done;
    }
    epyq_topo *t = NULL;
    st = from_hwloc(h, &t, err);
    if (st != EPYQ_OK) goto done;
    snprintf(t->source, sizeof t->source, "%s", source);
    t->this_system = real;
    /* hwloc gives every NUMA node of a synthetic string 1 GiB unless memory= says otherwise:
     * that is a placeholder, not a machine, and no model would fit it. */
    t->mem_placeholder = !real && strncmp(source, "xml ", 4) != 0 && !strstr(spec, "memory=");
    if (real) {
        fix_single_node_memory(t);
        st = restrict_to_process(t, err);
        if (st != EPYQ_OK) {
            epyq_topo_free(t);
            goto done;
        }
    }
    *out = t;
done:
    hwloc_topology_destroy(h);
    return st;
}

/* ---- restriction and split ----------------------------------------------------------- */

static bool in_sorted(const int32_t *v, int32_t n, int32_t x) {
    return n > 0 && bsearch(&x, v, (size_t)n, sizeof x, cmp_i32) != NULL;
}

epyq_status epyq_topo_restrict(epyq_topo *t, const int32_t *cpus, int32_t n_cpus, const int32_t *mem_nodes,
                               int32_t n_mem_nodes, epyq_err *err) {
    int32_t *sc = NULL, *sm = NULL;
    if (cpus) {
        sc = malloc(sizeof *sc * (size_t)(n_cpus > 0 ? n_cpus : 1));
        if (!sc) return epyq_err_set(err, EPYQ_E_NOMEM, "topology: out of memory");
        memcpy(sc, cpus, sizeof *sc * (size_t)n_cpus);
        qsort(sc, (size_t)n_cpus, sizeof *sc, cmp_i32);
    }
    if (mem_nodes) {
        sm = malloc(sizeof *sm * (size_t)(n_mem_nodes > 0 ? n_mem_nodes : 1));
        if (!sm) {
            free(sc);
            return epyq_err_set(err, EPYQ_E_NOMEM, "topology: out of memory");
        }
        memcpy(sm, mem_nodes, sizeof *sm * (size_t)n_mem_nodes);
        qsort(sm, (size_t)n_mem_nodes, sizeof *sm, cmp_i32);
    }
    int32_t kept = 0;
    int32_t *keep_idx = malloc(sizeof *keep_idx * (size_t)t->n_nodes);
    if (!keep_idx) {
        free(sc);
        free(sm);
        return epyq_err_set(err, EPYQ_E_NOMEM, "topology: out of memory");
    }
    for (int32_t i = 0; i < t->n_nodes; i++) {
        epyq_topo_node *n = &t->nodes[i];
        if (sc) {
            int32_t k = 0;
            for (int32_t p = 0; p < n->n_pus; p++)
                if (in_sorted(sc, n_cpus, n->pus[p])) {
                    n->pus[k] = n->pus[p];
                    n->pu_core[k] = n->pu_core[p];
                    k++;
                }
            n->n_pus = k;
        }
        if (sm && !in_sorted(sm, n_mem_nodes, n->os_index)) n->mem_allowed = false;
        if (n->n_pus > 0 || (n->mem_allowed && n->mem_bytes > 0)) {
            keep_idx[kept] = i;
            t->nodes[kept++] = *n;
        } else {
            free(n->pus);
            free(n->pu_core);
        }
    }
    free(sc);
    free(sm);
    if (kept < t->n_nodes && t->distance) {
        /* Distances of the kept nodes, in the kept order (keep_idx is ascending). */
        for (int32_t a = 0; a < kept; a++)
            for (int32_t b = 0; b < kept; b++)
                t->distance[(size_t)a * (size_t)kept + (size_t)b] =
                    t->distance[(size_t)keep_idx[a] * (size_t)t->n_nodes + (size_t)keep_idx[b]];
    }
    free(keep_idx);
    t->n_nodes = kept;
    if (kept == 0)
        return epyq_err_set(err, EPYQ_E_NUMA, "topology %s: no NUMA node is left with a usable CPU or memory",
                            t->source);
    return EPYQ_OK;
}

epyq_status epyq_topo_split(const epyq_topo *src, int32_t n, epyq_topo **out, epyq_err *err) {
    *out = NULL;
    if (n < 1 || n > 256)
        return epyq_err_set(err, EPYQ_E_ARG, "--numa-split %d: expected 1..256 logical nodes", (int)n);
    /* Every core of every node, in node order: (node index, first PU, all PUs via core id). */
    int32_t total_pus = 0;
    for (int32_t i = 0; i < src->n_nodes; i++) total_pus += src->nodes[i].n_pus;
    int32_t *core_node = malloc(sizeof(int32_t) * (size_t)(total_pus + 1));
    int32_t *core_id = malloc(sizeof(int32_t) * (size_t)(total_pus + 1));
    int32_t *pus = malloc(sizeof(int32_t) * (size_t)(total_pus + 1));
    int32_t *pcs = malloc(sizeof(int32_t) * (size_t)(total_pus + 1));
    epyq_topo *t = topo_alloc(n);
    epyq_status st = EPYQ_OK;
    if (!core_node || !core_id || !pus || !pcs || !t) {
        st = epyq_err_set(err, EPYQ_E_NOMEM, "--numa-split %d: out of memory", (int)n);
        goto done;
    }
    int32_t n_cores = 0;
    for (int32_t i = 0; i < src->n_nodes; i++) {
        const epyq_topo_node *s = &src->nodes[i];
        for (int32_t p = 0; p < s->n_pus; p++) {
            bool seen = false;
            for (int32_t q = 0; q < p && !seen; q++) seen = s->pu_core[q] == s->pu_core[p];
            if (seen) continue;
            core_node[n_cores] = i;
            core_id[n_cores] = s->pu_core[p];
            n_cores++;
        }
    }
    if (n_cores == 0) {
        st = epyq_err_set(err, EPYQ_E_NUMA, "--numa-split %d: topology %s has no usable CPU", (int)n, src->source);
        goto done;
    }
    t->split = n;
    t->shared_cores = n > n_cores;
    t->n_packages = 1;
    snprintf(t->source, sizeof t->source, "split %d of %.200s", (int)n, src->source);
    t->this_system = src->this_system;
    t->mem_placeholder = src->mem_placeholder;
    for (int32_t k = 0; k < n; k++) {
        /* Contiguous core ranges; with fewer cores than nodes, node k shares core k % cores. */
        int32_t lo = n <= n_cores ? (int32_t)((int64_t)k * n_cores / n) : k % n_cores;
        int32_t hi = n <= n_cores ? (int32_t)((int64_t)(k + 1) * n_cores / n) : lo + 1;
        const epyq_topo_node *home = &src->nodes[core_node[lo]];
        int32_t m = 0;
        for (int32_t c = lo; c < hi; c++) {
            const epyq_topo_node *s = &src->nodes[core_node[c]];
            for (int32_t p = 0; p < s->n_pus; p++)
                if (s->pu_core[p] == core_id[c]) {
                    pus[m] = s->pus[p];
                    pcs[m] = s->pu_core[p];
                    m++;
                }
        }
        epyq_topo_node *d = &t->nodes[k];
        d->os_index = home->os_index;
        d->package = home->package;
        d->mem_allowed = home->mem_allowed;
        if (!node_set_pus(d, pus, pcs, m)) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "--numa-split %d: out of memory", (int)n);
            goto done;
        }
    }
    /* Memory: each real node's bytes go in equal parts to the logical nodes cut from it. */
    for (int32_t k = 0; k < n; k++) {
        int32_t sharers = 0;
        for (int32_t j = 0; j < n; j++) sharers += t->nodes[j].os_index == t->nodes[k].os_index;
        int32_t si = epyq_topo_find_os(src, t->nodes[k].os_index);
        t->nodes[k].mem_bytes = src->nodes[si].mem_bytes / (uint64_t)sharers;
    }
    if (src->distance) {
        t->distance = malloc(sizeof *t->distance * (size_t)n * (size_t)n);
        if (!t->distance) {
            st = epyq_err_set(err, EPYQ_E_NOMEM, "--numa-split %d: out of memory", (int)n);
            goto done;
        }
        for (int32_t a = 0; a < n; a++)
            for (int32_t b = 0; b < n; b++) {
                int32_t sa = epyq_topo_find_os(src, t->nodes[a].os_index);
                int32_t sb = epyq_topo_find_os(src, t->nodes[b].os_index);
                t->distance[(size_t)a * (size_t)n + (size_t)b] =
                    src->distance[(size_t)sa * (size_t)src->n_nodes + (size_t)sb];
            }
    }
done:
    free(core_node);
    free(core_id);
    free(pus);
    free(pcs);
    if (st != EPYQ_OK) {
        epyq_topo_free(t);
        return st;
    }
    *out = t;
    return EPYQ_OK;
}

void epyq_topo_print(FILE *f, const epyq_topo *t) {
    fprintf(f, "topology: %s, %d node%s, %d package%s\n", t->source, (int)t->n_nodes, t->n_nodes == 1 ? "" : "s",
            (int)t->n_packages, t->n_packages == 1 ? "" : "s");
    for (int32_t i = 0; i < t->n_nodes; i++) {
        const epyq_topo_node *n = &t->nodes[i];
        char list[512];
        epyq_topo_format_list(n->pus, n->n_pus, list, sizeof list);
        int32_t cores[4096];
        int32_t nc = epyq_topo_node_cores(n, cores, 4096);
        char mem[48];
        if (t->mem_placeholder) snprintf(mem, sizeof mem, "memory not given");
        else if (n->mem_bytes < (1ull << 30)) snprintf(mem, sizeof mem, "%.1f MiB", (double)n->mem_bytes / (1 << 20));
        else snprintf(mem, sizeof mem, "%.1f GiB", (double)n->mem_bytes / (double)(1ull << 30));
        fprintf(f, "  node %d (os %d, package %d): %s%s, %d cores / %d PUs: %s\n", (int)i, (int)n->os_index,
                (int)n->package, mem, n->mem_allowed ? "" : " (not in membind)", (int)nc, (int)n->n_pus, list);
    }
}
