/* numa/topo.h — the NUMA topology epyq plans for, as plain data.
 *
 * Promise: epyq_topo_load() describes the running machine (hwloc discovery, cut down to the
 * CPUs and memory nodes this process inherited from taskset/numactl/cgroups), a hwloc
 * synthetic string ("pack:2 numa:4(memory=192GiB) core:8 pu:1") or a hwloc XML file. The
 * result holds no hwloc handle: plans are pure functions of it, and tests can build or edit
 * one by hand. Every CPU belongs to exactly one node (the most local one); a CPU-less memory
 * node (CXL, HBM without cores) has n_pus == 0, a memoryless node has mem_bytes == 0.
 *
 * Split mode (epyq_topo_split, --numa-split N) cuts the nodes' cores and memory into N logical
 * nodes, so the multi-node paths (plans, per-node pools, dispatch, reduction) run on a
 * one-node machine. Logical nodes keep the OS node of the memory they came from. */
#ifndef EPYQ_TOPO_H
#define EPYQ_TOPO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef struct {
    int32_t os_index;   /* OS node number memory is bound to (mbind, numactl -m) */
    int32_t package;    /* package (socket) number, -1 if unknown */
    uint64_t mem_bytes; /* local memory (split: this logical node's share); 0 = memoryless */
    bool mem_allowed;   /* the inherited memory policy (numactl -m, cgroup mems) allows it */
    int32_t n_pus;
    int32_t *pus;       /* [n_pus] OS cpu ids, ascending, only CPUs this process may use */
    int32_t *pu_core;   /* [n_pus] machine-wide core number of each PU (SMT siblings share it) */
} epyq_topo_node;

typedef struct {
    int32_t n_nodes;
    epyq_topo_node *nodes; /* [n_nodes], ascending OS index (split: in cut order) */
    uint32_t *distance;    /* [n_nodes * n_nodes] relative latency, 10 = local; NULL if unknown */
    int32_t n_packages;
    bool this_system;      /* describes the running machine: binding and move_pages apply */
    int32_t split;         /* N for a --numa-split N topology, else 0 */
    bool shared_cores;     /* split into more nodes than cores: some logical nodes share cores */
    bool mem_placeholder;  /* a synthetic string without memory=: hwloc's 1 GiB per node stands
                            * for "not given", so plans do not check memory against it */
    char source[256];      /* "this machine", "synthetic <string>", "xml <path>", "split N of ..." */
} epyq_topo;

/* spec NULL or "": this machine. A path to an existing file (or ending in ".xml"): hwloc XML.
 * Anything else: a hwloc synthetic description. */
epyq_status epyq_topo_load(epyq_topo **out, const char *spec, epyq_err *err);

/* Keep only the given CPUs (NULL = keep all) and memory nodes (NULL = keep all; OS indices),
 * as an inherited taskset/numactl would. Nodes left with no CPU and no memory are dropped. */
epyq_status epyq_topo_restrict(epyq_topo *t, const int32_t *cpus, int32_t n_cpus, const int32_t *mem_nodes,
                               int32_t n_mem_nodes, epyq_err *err);

/* Cut src's cores and memory into n logical nodes (see the header comment). */
epyq_status epyq_topo_split(const epyq_topo *src, int32_t n, epyq_topo **out, epyq_err *err);

epyq_status epyq_topo_clone(const epyq_topo *src, epyq_topo **out, epyq_err *err);
void epyq_topo_free(epyq_topo *t);

/* One PU per physical core of node i (its lowest allowed sibling), ascending; returns the
 * count written (at most max). */
int32_t epyq_topo_node_cores(const epyq_topo_node *n, int32_t *out, int32_t max);

/* Index (into t->nodes) of the node with OS index os, or -1. */
int32_t epyq_topo_find_os(const epyq_topo *t, int32_t os);

/* Parse a Linux list "0-31,64-95" (also "7", "1,3,5-6") into ascending unique ints below
 * limit; returns the count, or -1 with err set (naming what) on a malformed list. */
int32_t epyq_topo_parse_list(const char *s, int32_t limit, int32_t *out, int32_t max, const char *what,
                             epyq_err *err);

/* Format ascending ints as a compact list ("0-31,64-95") into buf. */
void epyq_topo_format_list(const int32_t *v, int32_t n, char *buf, size_t size);

/* Human summary, one line per node (os index, package, memory, CPUs). */
void epyq_topo_print(FILE *f, const epyq_topo *t);

#endif
