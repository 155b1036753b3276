/* numa/opts.c — NUMA options from flags and EPYQ_* variables, and the model presets (plan.h). */
#include <stdlib.h>
#include <string.h>

#include "numa/plan.h"

/* ---- model presets --------------------------------------------------------------------- */

void epyq_numa_model_35b_a3b(epyq_numa_model *m, bool int4) {
    /* docs/architecture.md §7.1: experts are 3 x hidden 2048 x moe_intermediate 512 params.
     * Everything else (mixers, shared experts, router, norms, embedding, lm_head) is "dense". */
    const uint64_t expert_params = 3ull * 2048 * 512;
    const uint64_t text_params = 34660610688ull;
    const uint64_t expert_total = expert_params * 256 * 40;
    /* Of the dense params these are quantized at int4 (GDN + attention projections, shared
     * experts); the rest (embedding, lm_head, router, gates, conv, norms) stay BF16. */
    const uint64_t dense_quant = 1006632960ull + 272629760ull + 125829120ull;
    const uint64_t dense_bf16 = text_params - expert_total - dense_quant;
    *m = (epyq_numa_model){.name = int4 ? "35b-a3b int4 g128" : "35b-a3b bf16", .n_layers = 40,
                           .n_experts = 256, .top_k = 8};
    if (int4) {
        /* W4A16 g128 symmetric: 64 bytes of nibbles + one BF16 scale per 128 params. */
        m->expert_bytes = expert_params / 128 * 66;
        m->dense_bytes = dense_quant / 128 * 66 + dense_bf16 * 2;
    } else {
        m->expert_bytes = expert_params * 2;
        m->dense_bytes = (text_params - expert_total) * 2;
    }
    /* A token reads every dense weight except the embedding table, of which it reads one row. */
    const uint64_t embed_params = 248320ull * 2048;
    m->dense_token_bytes = m->dense_bytes - embed_params * 2 + 2048 * 2;
}

/* ---- options ---------------------------------------------------------------------------- */

void epyq_numa_opts_init(epyq_numa_opts *o) {
    *o = (epyq_numa_opts){.mode = EPYQ_NUMA_AUTO, .reserve_bytes = 1ull << 30, .home_cpu = -1};
}

static const char *const mode_names[] = {"auto", "off", "distribute", "isolate", "numactl", "replicate-dense"};

const char *epyq_numa_mode_name(epyq_numa_mode m) {
    return (unsigned)m < sizeof mode_names / sizeof mode_names[0] ? mode_names[m] : "?";
}

const char epyq_numa_opts_help[] =
    "  --numa MODE         auto|off|distribute|isolate|numactl|replicate-dense (EPYQ_NUMA; default auto)\n"
    "  --numa-split N      treat this machine's cores and memory as N logical NUMA nodes (EPYQ_NUMA_SPLIT)\n"
    "  --numa-fallback     move experts off nodes that lack memory instead of failing\n"
    "  -t, --threads N     total threads, default one per physical core of the nodes used (EPYQ_THREADS)\n"
    "  --nodes LIST        use only these NUMA nodes, e.g. 0,2 (EPYQ_NODES)\n"
    "  -C, --cpu-range L   use only these CPUs, e.g. 0-31,64-95 (EPYQ_CPU_RANGE)\n";

static epyq_status parse_mode(const char *s, epyq_numa_mode *out, epyq_err *err) {
    for (size_t i = 0; i < sizeof mode_names / sizeof mode_names[0]; i++)
        if (strcmp(s, mode_names[i]) == 0) {
            *out = (epyq_numa_mode)i;
            return EPYQ_OK;
        }
    return epyq_err_set(err, EPYQ_E_ARG,
                        "--numa \"%s\": expected auto, off, distribute, isolate, numactl or replicate-dense", s);
}

static epyq_status parse_count(const char *what, const char *s, int32_t lo, int32_t hi, int32_t *out,
                               epyq_err *err) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return epyq_err_set(err, EPYQ_E_ARG, "%s \"%s\": expected an integer in %d..%d", what, s, (int)lo, (int)hi);
    *out = (int32_t)v;
    return EPYQ_OK;
}

epyq_status epyq_numa_opts_from_env(epyq_numa_opts *o, epyq_err *err) {
    const char *v;
    epyq_status st;
    if ((v = getenv("EPYQ_NUMA")) && *v && (st = parse_mode(v, &o->mode, err)) != EPYQ_OK)
        return epyq_err_prefix(err, "EPYQ_NUMA: ");
    if ((v = getenv("EPYQ_THREADS")) && *v && (st = parse_count("EPYQ_THREADS", v, 0, 1 << 16, &o->n_threads, err)))
        return st;
    if ((v = getenv("EPYQ_NUMA_SPLIT")) && *v &&
        (st = parse_count("EPYQ_NUMA_SPLIT", v, 0, 256, &o->split, err)) != EPYQ_OK)
        return st;
    if ((v = getenv("EPYQ_NODES")) && *v) o->nodes = v;
    if ((v = getenv("EPYQ_CPU_RANGE")) && *v) o->cpu_range = v;
    return EPYQ_OK;
}

epyq_status epyq_numa_opts_set(epyq_numa_opts *o, const char *flag, const char *value, epyq_err *err) {
    if (strcmp(flag, "--numa-fallback") == 0) {
        if (value) return epyq_err_set(err, EPYQ_E_ARG, "--numa-fallback takes no value");
        o->fallback = true;
        return EPYQ_OK;
    }
    if (!value) return epyq_err_set(err, EPYQ_E_ARG, "%s needs a value", flag);
    if (strcmp(flag, "--numa") == 0) return parse_mode(value, &o->mode, err);
    if (strcmp(flag, "--numa-split") == 0) return parse_count("--numa-split", value, 0, 256, &o->split, err);
    if (strcmp(flag, "--threads") == 0 || strcmp(flag, "-t") == 0)
        return parse_count("--threads", value, 0, 1 << 16, &o->n_threads, err);
    if (strcmp(flag, "--nodes") == 0) {
        o->nodes = value;
        return EPYQ_OK;
    }
    if (strcmp(flag, "--cpu-range") == 0 || strcmp(flag, "-C") == 0) {
        o->cpu_range = value;
        return EPYQ_OK;
    }
    return epyq_err_set(err, EPYQ_E_ARG, "%s is not a NUMA option", flag);
}

int epyq_numa_opts_parse_arg(epyq_numa_opts *o, int argc, char **argv, int *i, epyq_err *err) {
    static const struct {
        const char *flag, *alias;
        bool has_value;
    } flags[] = {{"--numa", NULL, true},  {"--numa-split", NULL, true}, {"--threads", "-t", true},
                 {"--nodes", NULL, true}, {"--cpu-range", "-C", true},  {"--numa-fallback", NULL, false}};
    const char *arg = argv[*i];
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        const char *name = flags[f].flag;
        size_t len = strlen(name);
        const char *val = NULL;
        if (strncmp(arg, name, len) == 0 && arg[len] == '=') {
            val = arg + len + 1;
        } else if (strcmp(arg, name) != 0 && !(flags[f].alias && strcmp(arg, flags[f].alias) == 0)) {
            continue;
        } else if (flags[f].has_value) {
            if (*i + 1 >= argc) {
                epyq_err_set(err, EPYQ_E_ARG, "%s needs a value", arg);
                return -1;
            }
            val = argv[++*i];
        }
        return epyq_numa_opts_set(o, name, val, err) == EPYQ_OK ? 1 : -1;
    }
    return 0;
}
