/* src/model/numa_moe.h — the runtime model on a NUMA plan: routed experts packed on the node
 * that runs them, and the MoE of a batch dispatched to those nodes.
 *
 * Promise: when epyq_model_opts.numa asks for a NUMA mode other than off, epyq_model_load()
 * makes the plan and the per-node pools (epyq_numa_setup_create, which prints the placement
 * table on stderr), cuts every routed int4 expert of the trunk and the MTP layer into slices of
 * moe_slice intermediate rows (gate/up rows, the matching down columns), packs each slice into
 * memory bound to its plan group's node (the slices of one expert go round the groups), on
 * pinned workers, and checks with move_pages where the pages landed. The routed experts of
 * every batch then run through epyq_moe_dispatch_run in units of (expert, slice, <= 32 tokens),
 * each on the group holding that slice. The slice width is a model option, never derived from
 * threads or nodes, so the logits are bit-identical for any --numa-split and thread count. With
 * moe_slice equal to moe_intermediate_size (one slice) they are also bit-identical to --numa off:
 * the units are then the single-pool path's (expert, 32-token chunk) tasks, summed in the same
 * order. Every dense linear (projections, router, shared-expert gate, lm_head, MTP fc) is cut by
 * output rows into whole 16-row tiles, one slice per group in proportion to its threads, on
 * that group's node and computed by its pool; --numa replicate-dense gives every group a whole
 * copy and each computes the same rows from its own. Outputs are concatenated, never summed,
 * so the logits keep the one-pool bits. A shared expert is split too (gate/up by intermediate
 * rows, down by output rows) and runs in the fused kernel's two phases on every group at once
 * (numa_dense.c epyq_numa_expert_run), with the fused kernel's bits. */
#ifndef EPYQ_MODEL_NUMA_MOE_H
#define EPYQ_MODEL_NUMA_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct epyq_model epyq_model;

/* Where the placed experts' pages are, asked of the kernel now (move_pages). pages: pages
 * checked over all groups; elsewhere: pages on a node other than their group's. Returns
 * EPYQ_E_NUMA naming the first group with a misplaced page, EPYQ_E_ARG for a model loaded
 * without a NUMA mode. A plan that binds no memory (--numa numactl) checks nothing. */
epyq_status epyq_model_numa_verify(const epyq_model *m, size_t *pages, size_t *elsewhere, epyq_err *err);

/* Weight bytes read since the last reset by group `group`'s pool from memory found (move_pages,
 * at load) on its own node (local) or not (remote: elsewhere, or not verified, as with
 * --numa numactl); group -1: bytes the model's own unpinned pool read (remote = all of them).
 * EPYQ_E_ARG for a model without a NUMA mode or a group out of range. */
epyq_status epyq_model_numa_reads(const epyq_model *m, int32_t group, uint64_t *local,
                                  uint64_t *remote, epyq_err *err);
void epyq_model_numa_reads_reset(epyq_model *m);

/* Where a sequence's per-head buffers are (move_pages): each (layer, value head) DeltaNet
 * state, each (layer, kv head) plane of the K and V caches, each (layer, key head) conv block
 * and each speculative snapshot of those on the node of the group owning the head, whose pool
 * works on it. pages: pages checked over all kinds (never-touched ones included); elsewhere:
 * pages on another node. EPYQ_E_ARG without a NUMA mode, or when the state blocks are not whole
 * pages (then they were not bound). */
typedef struct epyq_seq epyq_seq;
epyq_status epyq_seq_numa_verify(const epyq_seq *s, size_t *pages, size_t *elsewhere,
                                 epyq_err *err);

/* The same per kind of buffer. */
typedef enum {
    EPYQ_SEQ_NUMA_STATE, /* DeltaNet recurrent states [n_gdn][Hv] blocks */
    EPYQ_SEQ_NUMA_KV,    /* K and V planes [n_kv_layers][nkv] */
    EPYQ_SEQ_NUMA_CONV,  /* conv histories [n_gdn][Hk] blocks */
    EPYQ_SEQ_NUMA_SPEC,  /* speculative snapshots of states and conv histories */
    EPYQ_SEQ_NUMA_KINDS
} epyq_seq_numa_kind;

typedef struct {
    bool bound;       /* the blocks were bound to their owners (whole pages, a binding plan) */
    size_t pages;     /* pages checked */
    size_t on_node;   /* on the owner's node */
    size_t absent;    /* never touched yet (KV rows past the position, unused snapshots) */
    size_t elsewhere; /* on another node */
} epyq_seq_numa_pages;

/* out[kind] for every kind; the first misplaced block's error (EPYQ_E_NUMA names it) after
 * all were counted. EPYQ_E_ARG without a NUMA mode. */
epyq_status epyq_seq_numa_verify_kinds(const epyq_seq *s,
                                       epyq_seq_numa_pages out[EPYQ_SEQ_NUMA_KINDS], epyq_err *err);

/* Bytes each group's pool read of sequence buffers (KV rows, conv blocks, DeltaNet states)
 * since the last reset: part of what epyq_model_numa_reads counts. Local: the buffer kind was
 * bound (MPOL_BIND, before its first touch) to the group's node. EPYQ_E_ARG as there. */
epyq_status epyq_model_numa_seq_reads(const epyq_model *m, int32_t group, uint64_t *local,
                                      uint64_t *remote, epyq_err *err);

/* Plan groups (logical nodes) the model runs on; 0 when loaded without a NUMA mode. */
int32_t epyq_model_numa_groups(const epyq_model *m);

/* Routed-expert units each group ran in the last MoE layer (tests); -1 for a bad group. */
int32_t epyq_model_numa_units(const epyq_model *m, int32_t group);

#endif
