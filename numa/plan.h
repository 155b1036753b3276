/* numa/plan.h — where every routed expert, the dense weights and the threads go.
 *
 * Promise: epyq_numa_plan_make() is a pure function of (topology, model description, options):
 * same inputs, same plan, on any machine. It decides
 *   - the node groups: one per NUMA node used (a memoryless node's CPUs join the nearest node
 *     with memory; a CPU-less memory node is left out, it cannot run its experts locally);
 *   - which PUs each group's pool gets (one per physical core, SMT siblings only when -t asks
 *     for more threads than cores);
 *   - which group holds each routed expert, or each slice of one (epyq_numa_model.n_slices):
 *     each once, every group's share of expert bytes proportional to its threads (equal on
 *     symmetric machines) to within one expert (slice) over the whole model, and, within each
 *     layer, spread so expected traffic is even. Slices of one expert go round the groups, so
 *     every node computes a share of every expert a token chooses;
 *   - dense weights cut by output rows, each group's share (proportional to its threads) on its
 *     node, or one whole copy per node (replicate-dense); either way a group reads only its own
 *     rows, so the table gives both options' bytes per node and the dense bytes per token;
 *   - and checks every node's memory: a node that cannot hold its share is an error naming
 *     the node and the bytes, unless a fallback was asked for (--numa-fallback or --numa auto),
 *     in which case experts move to nodes with room and the plan says so.
 * Nothing here allocates model memory or binds threads: see place.h and dispatch.h. */
#ifndef EPYQ_NUMA_PLAN_H
#define EPYQ_NUMA_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "numa/topo.h"

/* What the plan needs to know about a model, filled from the loaded model (or a preset). */
typedef struct {
    const char *name;          /* for the table header */
    int32_t n_layers;          /* MoE layers */
    int32_t n_experts;         /* routed experts per layer */
    int32_t top_k;             /* experts per token */
    uint64_t expert_bytes;     /* bytes of one routed expert, packed as it will sit in memory
                                  (n_slices > 1: n_slices times the bytes of one slice) */
    int32_t n_slices;          /* 0 or 1: whole experts are placed; k > 1: each expert is cut
                                  into k slices of its intermediate rows (gate/up rows, the
                                  matching down columns), each slice placed on its own */
    uint64_t dense_bytes;      /* all other weights: mixers, shared experts, router, norms, embedding, lm_head */
    uint64_t dense_token_bytes; /* dense bytes read per decoded token (one embedding row), 0 = unknown */
    const float *expert_freq;  /* [n_layers * n_experts] expected share of tokens routed to each
                                  expert (sums to top_k per layer), or NULL = uniform */
} epyq_numa_model;

/* Qwen3.6-35B-A3B text model (docs/architecture.md §7): 40 layers x 256 experts of 3 x 2048 x 512
 * params. int4 = W4A16 g128 symmetric with BF16 scales and BF16 embedding/lm_head/router; else
 * BF16. */
void epyq_numa_model_35b_a3b(epyq_numa_model *m, bool int4);

/* Memory a node of node_mem bytes keeps free: reserve_bytes, but never more than 1/16 of the
 * node, so the 1 GiB default leaves every node of 16 GiB or more as before and a small node
 * (a 1 GiB synthetic or split one) keeps 64 MiB instead of nothing. */
uint64_t epyq_numa_node_reserve(uint64_t reserve_bytes, uint64_t node_mem);

/* "1.50 GiB" at or above 1 GiB, "12.3 MiB" below (a tiny model is not "0.00 GiB"). */
const char *epyq_numa_size(uint64_t bytes, char *buf, size_t n);

typedef enum {
    EPYQ_NUMA_AUTO = 0,        /* distribute over the inherited nodes, falling back if one is short */
    EPYQ_NUMA_OFF,             /* one pool over all allowed CPUs, no memory binding */
    EPYQ_NUMA_DISTRIBUTE,      /* experts spread over nodes, dense interleaved, one pool per node */
    EPYQ_NUMA_ISOLATE,         /* only one node (the first of --nodes, else the caller's node) */
    EPYQ_NUMA_NUMACTL,         /* obey the inherited numactl/taskset policy exactly: no mbind */
    EPYQ_NUMA_REPLICATE_DENSE, /* distribute, with a copy of the dense weights on every node */
} epyq_numa_mode;

typedef struct {
    epyq_numa_mode mode;
    int32_t n_threads;         /* -t: total threads, 0 = one per physical core of the nodes used */
    const char *nodes;         /* --nodes "0,2": node numbers as the plan prints them, NULL = all */
    const char *cpu_range;     /* -C "0-31,64-95": only these CPUs, NULL = all allowed */
    int32_t split;             /* --numa-split N: N logical nodes cut from the real ones, 0 = off */
    bool fallback;             /* --numa-fallback: move experts off nodes that lack memory */
    uint64_t reserve_bytes;    /* per node memory kept free (KV cache, activations, OS), at most:
                                * see epyq_numa_node_reserve */
    int32_t home_cpu;          /* isolate: the node holding this CPU; -1 = the first node used */
} epyq_numa_opts;

/* Defaults: auto, all threads/nodes/CPUs, no split, 1 GiB reserve per node (at most). */
void epyq_numa_opts_init(epyq_numa_opts *o);

/* Apply EPYQ_NUMA, EPYQ_THREADS, EPYQ_NODES, EPYQ_CPU_RANGE, EPYQ_NUMA_SPLIT (flags parsed
 * later override them). The strings point into the environment. */
epyq_status epyq_numa_opts_from_env(epyq_numa_opts *o, epyq_err *err);

/* If argv[*i] is one of --numa MODE, --numa-split N, --numa-fallback, -t/--threads N,
 * --nodes LIST, -C/--cpu-range LIST (also --flag=value), consume it (and its value, advancing
 * *i) and return 1; return 0 if it is not ours; -1 with err set on a bad value. */
int epyq_numa_opts_parse_arg(epyq_numa_opts *o, int argc, char **argv, int *i, epyq_err *err);

/* Set one option by its long flag name ("--numa", "--numa-split", "--threads", "--nodes",
 * "--cpu-range", "--numa-fallback"; also "-t", "-C"), for tools that parse with getopt_long.
 * value is NULL for --numa-fallback; strings are kept by pointer. */
epyq_status epyq_numa_opts_set(epyq_numa_opts *o, const char *flag, const char *value, epyq_err *err);

/* One line per flag, for --help texts. */
extern const char epyq_numa_opts_help[];

const char *epyq_numa_mode_name(epyq_numa_mode m);

typedef struct {
    int32_t node;              /* node number as printed (OS index; logical index in split mode) */
    int32_t os_index;          /* OS node memory is bound to, -1 when the plan binds nothing */
    int32_t n_threads;
    int32_t *cpus;             /* [n_threads] OS cpu of each worker (worker 0 first) */
    int32_t n_experts;         /* routed experts held, all layers (whole ones: slices / n_slices) */
    int64_t n_parts;           /* slices held (n_slices 1: experts) */
    uint64_t expert_bytes;     /* their bytes */
    uint64_t
        dense_bytes; /* dense bytes on this node in the plan's mode (dense_split or dense_copy) */
    uint64_t
        dense_split; /* its row slices of the dense weights: their bytes times its thread share */
    uint64_t dense_copy;       /* a whole copy (replicate-dense) */
    double dense_traffic;      /* dense bytes it reads per decoded token (its rows; the same in both
                                  modes) */
    uint64_t capacity;         /* node memory minus the reserve (UINT64_MAX: memory not given) */
    uint64_t reserve;          /* what this node keeps free (epyq_numa_node_reserve) */
    double traffic;            /* expected expert bytes read from this node per token */
    char note[128];            /* e.g. "+ CPUs of memoryless node 1" */
} epyq_numa_group;

typedef struct {
    epyq_numa_mode mode;       /* resolved: never AUTO */
    epyq_numa_mode asked;      /* as requested */
    int32_t n_groups;
    epyq_numa_group *groups;   /* [n_groups] */
    int32_t n_layers;
    int32_t n_experts;
    int32_t n_slices;          /* slices per expert (1: whole experts) */
    int16_t *expert_group;     /* [n_layers][n_experts][n_slices] group holding each slice of
                                  each routed expert (n_slices 1: each whole expert) */
    int32_t n_threads;         /* sum over groups */
    bool bind_memory;          /* place.h binds each group's memory to its node */
    bool replicate_dense;
    bool split;                /* groups are logical nodes of a --numa-split topology */
    bool shared_cores;         /* split finer than the cores: groups share CPUs */
    bool fallback_used;        /* experts were moved because a node lacked memory */
    bool mem_unchecked;        /* the topology gave no memory sizes (see epyq_topo.mem_placeholder) */
    uint64_t model_bytes;      /* expert + dense bytes of one copy of the model */
    char topo_source[256];
    char model_name[64];
    char notes[512];           /* what auto decided, fallbacks taken; "" if nothing */
} epyq_numa_plan;

epyq_status epyq_numa_plan_make(const epyq_topo *topo, const epyq_numa_model *model, const epyq_numa_opts *opts,
                                epyq_numa_plan **out, epyq_err *err);
void epyq_numa_plan_free(epyq_numa_plan *p);

/* The placement table: node -> GiB experts, GiB dense (this mode), total, capacity, the dense
 * GiB of both options (split, replicate), MiB per token of experts and of dense weights,
 * threads, PUs; then notes. */
void epyq_numa_plan_print(FILE *f, const epyq_numa_plan *p);

/* For `epyq inspect --numa`: load the topology (NULL = this machine, else synthetic string or
 * XML path), make the plan for model and opts, print topology and table. */
epyq_status epyq_numa_plan_inspect(FILE *f, const char *topology, const epyq_numa_model *model,
                                   const epyq_numa_opts *opts, epyq_err *err);

#endif
